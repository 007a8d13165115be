"""Added latency and max requests/s of meshfast's governed `POST /v1/proxy`, against a bare forwarder.

One run starts, on 127.0.0.1, testserve (the emulated providers, 1 worker), `bench/forwarder_app.py`
(Granian RSGI + one pooled aiohttp session per worker, no governance) and `meshfast serve`, with the
same Granian worker count for the two gateways, and measures in turn:

1. latency at `--rate` requests/s, open loop (`bench/loadgen.py`): a direct call to testserve with the
   exact request meshfast sends upstream (captured from testserve's `/_debug/last`), the forwarder, and
   meshfast per family (anthropic, openai, gemini); targets take turns in 1 s slices. Reports p50/p95/
   p99 of time to last byte and "added" = target - direct (same family) at each percentile;
2. time to first byte of a short and a `huge` (200x deltas) anthropic stream through meshfast, 50
   sequential requests each, alternating;
3. max requests/s with wrk (POST body via a generated Lua script, `--connections`, `--threads`,
   `--wrk-duration`): direct, forwarder, meshfast (anthropic).

The JSON in `bench/results/proxy-<timestamp>.json` is the record (provenance, CPU use per phase split
into the bench's own processes and everything else, raw samples); the table on stdout is a convenience.

    python bench/proxy_bench.py [--workers 2] [--duration 30] [--rate 20] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, loadgen
from bench.harness import BenchError, Server

RESULTS_DIR = ROOT / "bench" / "results"

FAMILIES = ("anthropic", "openai", "gemini")
# What each family's upstream stream ends with (direct targets), and meshfast's last NDJSON line.
SSE_END = {"anthropic": b"message_stop", "openai": b"[DONE]", "gemini": b"finishReason"}
NDJSON_END = b'"done":true'
PROXY_BODY = b'{"query":"hello","max_tokens":64}'
TESTSERVE_KEY = "testserve-key"
BUDGET_POLICY = {
    "daily_cap_usd": 1000000, "max_calls_per_hour": None, "allowed_from": None, "allowed_to": None,
    "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": True,
}
MODEL_COUNT = 2 * len(FAMILIES)
PROVIDER_SETTINGS = ("retry_enabled", "max_retries", "log_requests", "max_outbound_rps",
                     "max_concurrent_upstream", "max_calls_per_hour")

READY_TIMEOUT_S = 30.0
MESHFAST_READY_TIMEOUT_S = 60.0
CONFIG_PROPAGATION_TIMEOUT_S = 30.0
PROPAGATION_CONFIRMATIONS = 8
SLICE_S = 1.0
TTFB_COUNT = 50

# The criteria (ARCHITECTURE.md, "The request path", the budget paragraph).
FORWARDER_ADDED_P50_REFERENCE_US = 350.0
GOAL_ADDED_P50_US = 150.0
GOAL_ADDED_P99_US = 500.0
MUST_RPS_RATIO = 0.80
GOAL_RPS_RATIO = 1.00
GOAL_TTFB_DIFF_US = 1000.0

NOTE = (
    "All processes (testserve, forwarder, meshfast + its embedded PostgreSQL, the load generator, wrk) "
    "share this machine's CPUs unpinned, with whatever else runs on it (phases[*].cpu says how much "
    "that was). Latency: one keep-alive connection per target, open loop at the stated rate, targets "
    "alternating in {slice_s:g} s slices, each opened by one unrecorded request (a target that sat idle "
    "through the others' slices would otherwise count a cold first answer); only one target is loaded "
    "at a time. 'added' is the difference of percentiles (target pN - direct pN, same family), not a "
    "percentile of differences. "
    "Max requests/s: wrk and the servers share the cores, so compare ratios, not absolute numbers."
)


# ------------------------------------------------------------------------------------- CPU use


def _clk_tck() -> int:
    return os.sysconf("SC_CLK_TCK")


def _machine_jiffies() -> list[int]:
    """The first /proc/stat line: user nice system idle iowait irq softirq steal (guest is in user)."""
    return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]


def _processes() -> dict[int, tuple[int, int, int, str]]:
    """pid -> (ppid, session id, CPU jiffies, command line) for every readable process.

    CPU includes the reaped children's (cutime+cstime), so short-lived helpers that ended during a
    phase (PostgreSQL's autovacuum workers, say) still count for their parent's group.
    """
    procs = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()  # fields after "(comm)", starting at state
        cpu = sum(int(x) for x in rest[11:15])  # utime stime cutime cstime
        procs[int(entry.name)] = (int(rest[1]), int(rest[3]), cpu, cmd)
    return procs


@dataclass
class Groups:
    """Which processes are whose: servers by session (start_new_session), PostgreSQL by data dir."""

    sessions: dict[str, int] = field(default_factory=dict)  # group name -> session id
    data_dirs: dict[str, str] = field(default_factory=dict)  # group name -> path in the postmaster's argv

    def split(self, procs: dict[int, tuple[int, int, int, str]]) -> dict[str, int]:
        by_sid = {sid: name for name, sid in self.sessions.items()}
        owner: dict[int, str] = {}
        for pid, (_, sid, _, cmd) in procs.items():
            if sid in by_sid:
                owner[pid] = by_sid[sid]
            else:
                for name, path in self.data_dirs.items():
                    if path in cmd:
                        owner[pid] = name
        for pid, (ppid, _, _, _) in procs.items():  # postmaster children: "postgres: walwriter" ...
            if pid not in owner and ppid in owner:
                owner[pid] = owner[ppid]
        ticks: dict[str, int] = {name: 0 for name in [*self.sessions, *self.data_dirs]}
        for pid, name in owner.items():
            ticks[name] += procs[pid][2]
        return ticks


class CpuMeter:
    """CPU seconds per group over a phase, and what the rest of the machine used meanwhile."""

    def __init__(self, groups: Groups) -> None:
        self.groups = groups
        self.t0 = time.monotonic()
        self.machine0 = _machine_jiffies()
        self.groups0 = groups.split(_processes())
        self.self0 = os.times()
        self.load0 = os.getloadavg()

    def stop(self) -> dict:
        wall = time.monotonic() - self.t0
        delta = [b - a for a, b in zip(self.machine0, _machine_jiffies(), strict=True)]
        groups1 = self.groups.split(_processes())
        self1 = os.times()
        tck = _clk_tck()
        busy_s = (sum(delta) - delta[3] - delta[4]) / tck
        ncpu = len(os.sched_getaffinity(0))
        # A group's processes that ended during the phase drop out; their last ticks are lost (small).
        cpu = {name: round(max(0, groups1.get(name, 0) - self.groups0.get(name, 0)) / tck, 2)
               for name in groups1}
        # The harness itself plus the children it reaped in the phase (wrk).
        cpu["bench_client"] = round(
            (self1.user - self.self0.user) + (self1.system - self.self0.system)
            + (self1.children_user - self.self0.children_user)
            + (self1.children_system - self.self0.children_system), 2)
        ours = sum(cpu.values())
        other = max(0.0, busy_s - ours)
        return {
            "wall_s": round(wall, 2),
            "cpus": ncpu,
            "machine_busy_pct": round(100 * busy_s / (wall * ncpu), 1) if wall > 0 else None,
            "cpu_s": cpu,
            "other_cpu_s": round(other, 2),
            "other_busy_pct": round(100 * other / (wall * ncpu), 1) if wall > 0 else None,
            # Niced work is what the machine's other users run in the background (builds, tests);
            # irq/softirq is mostly the loopback traffic itself, charged to no process.
            "machine_cpu_s": {k: round(delta[i] / tck, 2) for i, k in enumerate(
                ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"))},
            "loadavg_start": [round(x, 2) for x in self.load0],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        }


# ---------------------------------------------------------------------------------------- servers


@dataclass
class Stack:
    testserve: Server | None = None
    forwarder: Server | None = None
    forwarder_native: Server | None = None
    meshfast: Server | None = None
    testserve_url: str = ""
    forwarder_url: str = ""
    forwarder_native_url: str = ""
    meshfast_url: str = ""
    data_dir: str | None = None
    admin_token: str = ""
    user_key: str = ""
    user_id: str = ""
    groups: Groups = field(default_factory=Groups)
    setup: dict = field(default_factory=dict)

    def servers(self) -> list[Server]:
        return [s for s in (self.testserve, self.forwarder, self.forwarder_native, self.meshfast) if s is not None]

    def secrets(self) -> list[str]:
        return [s for s in (self.admin_token, self.user_key) if s]

    def check_alive(self) -> None:
        for s in self.servers():
            s.check_alive()

    def stop_into(self, doc: dict) -> None:
        """Stop every server, keeping in `doc` each one's log tail (secrets redacted) and the stop report."""
        doc["server_log_tails"] = {s.name: harness.redact([s.log_tail(3000)], self.secrets())[0] for s in self.servers()}
        doc["stop"] = self.stop()

    def stop(self) -> dict:
        report = {}
        for s in (self.meshfast, self.forwarder, self.forwarder_native, self.testserve):
            if s is not None:
                report[s.name] = s.stop()
        if self.data_dir:
            leftovers = harness.stop_processes_mentioning(self.data_dir)
            if leftovers:
                report["leftover_pids_stopped"] = leftovers
            shutil.rmtree(self.data_dir, ignore_errors=True)
            report["data_dir_removed"] = not os.path.exists(self.data_dir)
        return report


def start_stack(args, work_dir: Path, *, forwarder: bool = True,
                provision: Callable[[Stack], None] | None = None) -> Stack:
    """Start the servers (in parallel), wait for each, provision meshfast.

    `forwarder=False` leaves the bare forwarder out; `provision` replaces this bench's providers, user
    and grants (governance_bench's rate-limited provider).
    """
    st = Stack()
    py = sys.executable
    ts_port, mf_port = harness.free_port(), harness.free_port()
    st.testserve_url = f"http://127.0.0.1:{ts_port}"
    st.meshfast_url = f"http://127.0.0.1:{mf_port}"
    env = dict(os.environ)
    st.testserve = Server(
        "testserve",
        [py, "-m", "testserve", "--host", "127.0.0.1", "--port", str(ts_port), "--workers", "1"],
        env, work_dir / "testserve.log",
    )
    if forwarder:
        fw_port = harness.free_port()
        st.forwarder_url = f"http://127.0.0.1:{fw_port}"
        fw_env = dict(env, FORWARDER_UPSTREAM=f"{st.testserve_url}/anthropic/v1/messages",
                      FORWARDER_API_KEY=TESTSERVE_KEY)
        st.forwarder = Server(
            "forwarder",
            [py, "-m", "granian", "--interface", "rsgi", "--workers", str(args.workers),
             "--host", "127.0.0.1", "--port", str(fw_port), "bench.forwarder_app:app"],
            fw_env, work_dir / "forwarder.log",
        )
        # The same forwarder on meshfast's own upstream client: the client's share, measured apart.
        fn_port = harness.free_port()
        st.forwarder_native_url = f"http://127.0.0.1:{fn_port}"
        st.forwarder_native = Server(
            "forwarder-native",
            [py, "-m", "granian", "--interface", "rsgi", "--workers", str(args.workers),
             "--host", "127.0.0.1", "--port", str(fn_port), "bench.forwarder_app:app"],
            dict(fw_env, FORWARDER_CLIENT="native"), work_dir / "forwarder-native.log",
        )
    st.data_dir = tempfile.mkdtemp(prefix="meshfast-bench-")
    st.admin_token = secrets.token_urlsafe(32)
    mf_env = dict(env, MESHFAST_DATA_DIR=st.data_dir, MESHFAST_ADMIN_TOKEN=st.admin_token,
                  MESHFAST_UPSTREAM_CLIENT=getattr(args, "meshfast_client", "native"))
    # NOTE: the bench measures the embedded-database setup a fresh install gets.
    mf_env.pop("DATABASE_URL", None)
    st.meshfast = Server(
        "meshfast",
        shlex.split(args.meshfast_cmd) + ["serve", "--workers", str(args.workers),
                                          "--host", "127.0.0.1", "--port", str(mf_port)],
        mf_env, work_dir / "meshfast.log",
    )
    try:
        for s in st.servers():
            s.start()
            st.groups.sessions[s.name] = s.proc.pid  # start_new_session: the leader's pid is the sid
        st.groups.data_dirs["meshfast_postgres"] = st.data_dir
        st.setup["testserve_ready_s"] = harness.wait_until(
            lambda: harness.http_request("GET", st.testserve_url + "/healthz", timeout_s=2.0)[0] == 200,
            READY_TIMEOUT_S, st.testserve, "GET /healthz == 200")
        if st.forwarder is not None:
            st.setup["forwarder_ready_s"] = harness.wait_until(
                lambda: _forwarder_answers(st.forwarder_url), READY_TIMEOUT_S, st.forwarder,
                "POST /v1/proxy == 200")
        if st.forwarder_native is not None:
            st.setup["forwarder_native_ready_s"] = harness.wait_until(
                lambda: _forwarder_answers(st.forwarder_native_url), READY_TIMEOUT_S, st.forwarder_native,
                "POST /v1/proxy == 200")
        st.setup["meshfast_ready_s"] = harness.wait_until(
            lambda: harness.http_request("GET", st.meshfast_url + "/readyz", timeout_s=2.0)[0] == 200,
            MESHFAST_READY_TIMEOUT_S, st.meshfast, "GET /readyz == 200")
        (provision or provision_families)(st)
    except BaseException:
        st.stop()
        raise
    return st


def _forwarder_answers(url: str) -> bool:
    req = urllib.request.Request(url + "/v1/proxy?model=b-anthropic", data=PROXY_BODY, method="POST")
    with urllib.request.urlopen(req, timeout=2.0) as resp:
        resp.read()
        return resp.status == 200


def provision_families(st: Stack) -> None:
    """Providers with their models (short + huge per family), one user, grants, a large budget."""
    t0 = time.monotonic()
    model_ids = []
    for family in FAMILIES:
        models = [
            {"name": name, "resolved_model": resolved, "kind": "chat",
             "input_price_per_1k_tokens": "0.001", "output_price_per_1k_tokens": "0.002", "verify": False}
            for name, resolved in ((f"b-{family}", "dummy-chat"), (f"b-{family}-huge", "dummy-huge"))
        ]
        provider = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/providers", {
            "name": f"b-{family}", "family": family, "base_url": f"{st.testserve_url}/{family}",
            "api_key": TESTSERVE_KEY, "local": True, "verify": False, "models": models,
        })
        model_ids += [m["id"] for m in provider["models"]]
        st.setup.setdefault("provider_settings", {})[family] = provider_settings(provider)
    grant_user(st, model_ids)
    st.setup["provision_s"] = round(time.monotonic() - t0, 3)
    wait_for_models(st, MODEL_COUNT, f"{MODEL_COUNT} models with the bench budget on every worker")


def provider_settings(provider: dict) -> dict:
    return {k: provider.get(k) for k in PROVIDER_SETTINGS}


def grant_user(st: Stack, model_ids: list[str], policy: dict | None = None) -> None:
    """One user (its key in `st.user_key`) with access to each model and the bench budget (or `policy`) on it."""
    admin = {"authorization": f"Bearer {st.admin_token}"}
    user = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/users",
                                {"email": "bench@example.com", "display_name": "Bench"})
    st.user_key, st.user_id = user["key"], user["id"]
    for model_id in model_ids:
        for method, path, body in (
            ("POST", "/admin/access", {"user_id": user["id"], "model_id": model_id}),
            ("PUT", f"/admin/users/{user['id']}/policies/{model_id}", policy or BUDGET_POLICY),
        ):
            status, _, raw = harness.http_request(method, st.meshfast_url + path, admin, body, timeout_s=30.0)
            if status not in (200, 201, 204):
                raise BenchError(f"{method} {path} answered {status}: {raw[:500]!r}")


def wait_for_models(st: Stack, count: int, what: str) -> None:
    """Until every worker lists `count` models with the bench budget (`setup.propagation_s`)."""
    auth = {"authorization": f"Bearer {st.user_key}"}
    seen = 0

    def every_worker_has_it() -> bool:
        # Fresh connections land on either worker: several in a row must show all grants and the cap.
        nonlocal seen
        status, _, raw = harness.http_request("GET", st.meshfast_url + "/v1/models", auth, timeout_s=2.0)
        doc = json.loads(raw) if status == 200 else {}
        ready = [m for m in doc.get("models", [])
                 if (m.get("usage") or {}).get("daily_cap_usd") == BUDGET_POLICY["daily_cap_usd"]]
        seen = seen + 1 if len(ready) == count else 0
        return seen >= PROPAGATION_CONFIRMATIONS

    st.setup["propagation_s"] = harness.wait_until(every_worker_has_it, CONFIG_PROPAGATION_TIMEOUT_S, st.meshfast,
                                                   what)


# ---------------------------------------------------------------------------------------- targets


def _exchange_once(target: loadgen.Target) -> tuple[loadgen.Sample, bytes]:
    conn = loadgen.Conn(target.host, target.port)
    try:
        _, sample, tail = conn.exchange(target)
    finally:
        conn.close()
    if sample.status != 200:
        raise BenchError(f"{target.name}: answered {sample.status}: {tail[:300]!r}")
    if target.expect is not None and target.expect not in tail:
        raise BenchError(f"{target.name}: stream did not end with {target.expect!r}: ...{tail[-300:]!r}")
    return sample, tail


def _last_upstream_call(st: Stack) -> dict:
    status, _, raw = harness.http_request("GET", st.testserve_url + "/_debug/last", timeout_s=5.0)
    if status != 200:
        raise BenchError(f"testserve /_debug/last answered {status}")
    return json.loads(raw)


def _direct_from_capture(name: str, st: Stack, cap: dict, expect: bytes) -> tuple[loadgen.Target, dict]:
    """The request meshfast sent upstream, replayed byte for byte where testserve lets us see it."""
    body = json.dumps(cap["body"], separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) != cap["body_bytes"]:
        raise BenchError(
            f"{name}: re-encoded upstream body is {len(body)} B, meshfast sent {cap['body_bytes']} B")
    headers = {k: v for k, v in cap["headers"].items() if k not in ("host", "content-length")}
    url = st.testserve_url + cap["path"] + (f"?{cap['query']}" if cap["query"] else "")
    shape = {"url": url, "headers": sorted(headers), "body": body.decode(), "body_bytes": len(body)}
    return loadgen.Target.post(name, url, headers, body, expect), shape


def build_targets(st: Stack) -> tuple[dict[str, loadgen.Target], dict]:
    """Mesh targets per family, the forwarder, and direct targets from meshfast's own upstream calls."""
    auth = {"authorization": f"Bearer {st.user_key}", "content-type": "application/json"}
    targets: dict[str, loadgen.Target] = {}
    wire: dict = {}
    for family in FAMILIES:
        for suffix, label in (("", ""), ("-huge", "-huge")):
            mesh = loadgen.Target.post(f"meshfast-{family}{label}",
                                       f"{st.meshfast_url}/v1/proxy?model=b-{family}{suffix}", auth,
                                       PROXY_BODY, NDJSON_END)
            _exchange_once(mesh)
            cap = _last_upstream_call(st)
            direct, shape = _direct_from_capture(f"direct-{family}{label}", st, cap, SSE_END[family])
            _exchange_once(direct)
            targets[mesh.name], targets[direct.name] = mesh, direct
            wire[direct.name] = shape
    for (prefix, base), suffix in itertools.product(
            (("forwarder", st.forwarder_url), ("forwarder-native", st.forwarder_native_url)), ("", "-huge")):
        fw = loadgen.Target.post(f"{prefix}-anthropic{suffix}",
                                 f"{base}/v1/proxy?model=b-anthropic{suffix}",
                                 {"content-type": "application/json"}, PROXY_BODY, SSE_END["anthropic"])
        _exchange_once(fw)
        cap = _last_upstream_call(st)
        body = json.dumps(cap["body"], separators=(",", ":"), ensure_ascii=False)
        wire[fw.name + " (upstream)"] = {"body": body, "body_bytes": cap["body_bytes"]}
        if body != wire[f"direct-anthropic{suffix}"]["body"]:
            raise BenchError(f"forwarder sends a different upstream body than meshfast: {body}")
        targets[fw.name] = fw
    return targets, wire


# -------------------------------------------------------------------------------------------- wrk


def _lua_string(data: bytes) -> str:
    """A double-quoted Lua string; quotes, backslashes, non-printable bytes as 3-digit decimal escapes."""
    out = []
    for b in data:
        c = chr(b)
        out.append(f"\\{b:03d}" if c in '"\\' or not 32 <= b < 127 else c)
    return '"' + "".join(out) + '"'


def write_wrk_script(work_dir: Path, name: str, target: loadgen.Target) -> Path:
    """wrk.method/body/headers from the exact request bytes, then wrk_report.lua's done() hook."""
    head, _, body = target.request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")[1:]
    script = ['wrk.method = "POST"', f"wrk.body = {_lua_string(body)}"]
    for line in lines:
        k, _, v = line.partition(":")
        if k.lower() in ("host", "content-length"):
            continue
        script.append(f"wrk.headers[{_lua_string(k.strip().encode())}] = {_lua_string(v.strip().encode())}")
    script.append(f"dofile({_lua_string(str(harness.WRK_LUA).encode())})")
    path = work_dir / f"wrk-{name}.lua"
    path.write_text("\n".join(script) + "\n")
    return path


def run_wrk_target(args, work_dir: Path, name: str, target: loadgen.Target, st: Stack,
                   measure: Callable[[], Callable[[], dict]] | None = None) -> dict:
    """wrk on `target` (warm-up kept apart); `measure()` is called as the measured run starts and what it
    returns as it ends, its result kept as `worker_cpu` (floor_bench's CPU time of the serving processes)."""
    path_q = target.request.split(b" ", 2)[1].decode()
    url = f"http://{target.host}:{target.port}{path_q}"
    script = write_wrk_script(work_dir, name, target)

    def argv(duration_s: int) -> list[str]:
        return ["wrk", "--threads", str(args.threads), "--connections", str(args.connections),
                "--duration", f"{duration_s}s", "--timeout", harness.WRK_TIMEOUT, "--script", str(script), url]

    run: dict = {"target": name, "url": url}
    if args.wrk_warmup > 0:
        warm = harness.run_wrk(argv(args.wrk_warmup), args.wrk_warmup)
        warm.pop("stdout", None)
        run["warmup"] = warm
    meter = CpuMeter(st.groups)
    stop_measure = measure() if measure is not None else None
    result = harness.run_wrk(argv(args.wrk_duration), args.wrk_duration)
    if stop_measure is not None:
        run["worker_cpu"] = stop_measure()
    run["cpu"] = meter.stop()
    run["wrk_command"] = shlex.join(argv(args.wrk_duration))
    run["wrk_script"] = harness.redact([script.read_text()], st.secrets())[0]
    run["wrk_stdout"] = result.pop("stdout")
    run["wrk"] = result
    seconds = result["duration_us"] / 1e6
    run["requests_per_s"] = round(result["requests"] / seconds, 1) if seconds > 0 else 0.0
    run["latency_p50_ms"] = result["latency_us"]["p50"] / 1000
    run["latency_p99_ms"] = result["latency_us"]["p99"] / 1000
    run["errors_total"] = sum(result["errors"].values())
    # wrk counts only status > 399; one exact request afterwards checks the target still answers 200.
    sample, _ = _exchange_once(target)
    run["postflight"] = {"status": sample.status, "body_bytes": sample.body_bytes}
    return run


# ---------------------------------------------------------------------------------------- phases


def scrape_metrics(st: Stack) -> dict[str, float]:
    return metrics_at(st.meshfast_url, st.admin_token)


def metrics_at(base_url: str, admin_token: str) -> dict[str, float]:
    """meshfast's /admin/metrics (instance-wide: every worker adds to the same shared counters)."""
    status, _, raw = harness.http_request("GET", base_url + "/admin/metrics",
                                          {"authorization": f"Bearer {admin_token}"}, timeout_s=10.0)
    if status != 200:
        raise BenchError(f"GET /admin/metrics answered {status}")
    out: dict[str, float] = {}
    for line in raw.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def telemetry_counters(metrics: dict[str, float]) -> dict[str, int]:
    """The row pipeline's totals: written (COPYed), merged (denials folded into a count), spooled and
    replayed (database away), rejected (refused by the database: insert failures), outages."""
    prefix, suffix = "meshfast_telemetry_rows_", "_total"
    return {k[len(prefix):-len(suffix)]: int(v) for k, v in metrics.items()
            if k.startswith(prefix) and k.endswith(suffix)}


def settled_telemetry(base_url: str, admin_token: str, timeout_s: float = 30.0) -> dict[str, int]:
    """The telemetry totals once the ring has drained (two reads a second apart agree)."""
    deadline = time.monotonic() + timeout_s
    last = telemetry_counters(metrics_at(base_url, admin_token))
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = telemetry_counters(metrics_at(base_url, admin_token))
        if now == last:
            break
        last = now
    return last


_PHASE_BUCKET = re.compile(r'^meshfast_request_phase_seconds_bucket\{phase="(\w+)",le="([^"]+)"\}$')


def _bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of a cumulative histogram [(upper bound, count)], linear inside its bucket
    (Prometheus' histogram_quantile); the +Inf bucket answers its lower bound."""
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(upper):
                return lower
            inside = cumulative - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, cumulative
    return lower


def phase_split(before: dict[str, float], after: dict[str, float]) -> dict:
    """Where meshfast's admitted requests between two scrapes spent their time, per phase (receive:
    the body from the HTTP server; gateway: auth, policy, render, admission and its waits; upstream:
    the send to the last byte out): count, exact mean, and p50/p90/p99 interpolated in the
    histogram's buckets, in microseconds."""
    out: dict[str, dict] = {}
    for name in ("receive", "gateway", "upstream"):
        buckets = []
        for series, value in after.items():
            m = _PHASE_BUCKET.match(series)
            if m and m.group(1) == name:
                le = math.inf if m.group(2) == "+Inf" else float(m.group(2))
                buckets.append((le, value - before.get(series, 0.0)))
        buckets.sort()
        key = f'{{phase="{name}"}}'
        count = after.get(f"meshfast_request_phase_seconds_count{key}", 0) - before.get(
            f"meshfast_request_phase_seconds_count{key}", 0)
        total_s = after.get(f"meshfast_request_phase_seconds_sum{key}", 0) - before.get(
            f"meshfast_request_phase_seconds_sum{key}", 0)
        quantiles = {f"p{q:g}": _bucket_quantile(buckets, q / 100) for q in (50, 90, 99)}
        out[name] = {
            "count": int(count),
            "mean_us": round(total_s / count * 1e6, 1) if count else None,
            **{k: (round(v * 1e6, 1) if v is not None else None) for k, v in quantiles.items()},
        }
    return out


def phase_latency(args, st: Stack, targets: dict[str, loadgen.Target]) -> dict:
    names = ["direct-anthropic", "forwarder-anthropic", "forwarder-native-anthropic", "meshfast-anthropic",
             "direct-openai", "meshfast-openai", "direct-gemini", "meshfast-gemini"]
    chosen = [targets[n] for n in names]
    deadline = 2 * len(chosen) * args.duration + 60
    meter = CpuMeter(st.groups)
    before = scrape_metrics(st)
    series = loadgen.open_loop(chosen, args.rate, args.duration, slice_s=SLICE_S, deadline_s=deadline)
    split = phase_split(before, scrape_metrics(st))
    cpu = meter.stop()
    st.check_alive()
    reports = {s.target: s.report() for s in series}
    for name, rep in reports.items():
        direct = reports["direct-" + name.rsplit("-", 1)[1]]
        if name.startswith("direct-"):
            continue
        rep["added_us"] = {
            p: round(rep["total_us"][p] - direct["total_us"][p], 1)
            for p in ("p50", "p90", "p95", "p99") if p in rep["total_us"] and p in direct["total_us"]
        }
        rep["added_ttfb_body_us"] = {
            p: round(rep["ttfb_body_us"][p] - direct["ttfb_body_us"][p], 1)
            for p in ("p50", "p95", "p99") if p in rep["ttfb_body_us"] and p in direct["ttfb_body_us"]
        }
    return {"rate_rps": args.rate, "duration_s_per_target": args.duration, "slice_s": SLICE_S,
            "order": names, "cpu": cpu, "targets": reports,
            # Every meshfast request of this phase (all three families, warm-ups and slice primers).
            "phase_split": split}


EMBED_MODEL = "b-embed"
# The other data-plane endpoints (Figure 1 per endpoint): (name, method, path, body, stream end);
# the standard routes carry the model in the body, as the official SDKs send it.
ENDPOINTS = (
    ("embeddings", "POST", f"/v1/embeddings?model={EMBED_MODEL}", b'{"input":"hello"}', None),
    ("chat-completions", "POST", "/v1/chat/completions",
     b'{"model":"b-openai","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hello"}]}',
     b"[DONE]"),
    ("messages", "POST", "/v1/messages",
     b'{"model":"b-anthropic","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hello"}]}',
     b"message_stop"),
    ("models", "GET", "/v1/models", None, None),
    ("usage", "GET", "/v1/usage", None, None),
)


def _get_target(name: str, url: str, headers: dict[str, str]) -> loadgen.Target:
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    lines = [f"GET {parts.path} HTTP/1.1", f"host: {host}:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    return loadgen.Target(name, host, port, ("\r\n".join(lines) + "\r\n\r\n").encode())


def provision_embeddings(st: Stack) -> None:
    """One more provider with an embedding model, granted to the bench user."""
    provider = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/providers", {
        "name": EMBED_MODEL, "family": "openai", "base_url": f"{st.testserve_url}/openai",
        "api_key": TESTSERVE_KEY, "local": True, "verify": False,
        "models": [{"name": EMBED_MODEL, "resolved_model": "dummy-embed", "kind": "embedding",
                    "input_price_per_1k_tokens": "0.0001", "output_price_per_1k_tokens": "0",
                    "verify": False}],
    })
    admin = {"authorization": f"Bearer {st.admin_token}"}
    model_id = provider["models"][0]["id"]
    for method, path, body in (
        ("POST", "/admin/access", {"user_id": st.user_id, "model_id": model_id}),
        ("PUT", f"/admin/users/{st.user_id}/policies/{model_id}", BUDGET_POLICY),
    ):
        status, _, raw = harness.http_request(method, st.meshfast_url + path, admin, body, timeout_s=30.0)
        if status not in (200, 201, 204):
            raise BenchError(f"{method} {path} answered {status}: {raw[:500]!r}")
    wait_for_models(st, MODEL_COUNT + 1, "the embedding model on every worker")


def endpoint_targets(st: Stack) -> dict[str, loadgen.Target]:
    """meshfast per endpoint and, for those that call upstream, the direct call it made (replayed)."""
    auth = {"authorization": f"Bearer {st.user_key}"}
    out: dict[str, loadgen.Target] = {}
    for name, method, path, body, end in ENDPOINTS:
        if method == "GET":
            out[f"meshfast-{name}"] = _get_target(f"meshfast-{name}", st.meshfast_url + path, auth)
            _exchange_once(out[f"meshfast-{name}"])
            continue
        mesh = loadgen.Target.post(f"meshfast-{name}", st.meshfast_url + path,
                                   {**auth, "content-type": "application/json"}, body, end)
        _exchange_once(mesh)
        direct, _ = _direct_from_capture(f"direct-{name}", st, _last_upstream_call(st), end)
        _exchange_once(direct)
        out[mesh.name], out[direct.name] = mesh, direct
    return out


def phase_endpoints(args, st: Stack) -> dict:
    """Every other data-plane endpoint at the latency phase's rate, with its direct call where it
    has one; added = meshfast pN - direct pN of the same endpoint."""
    provision_embeddings(st)
    targets = endpoint_targets(st)
    names = list(targets)
    meter = CpuMeter(st.groups)
    before = scrape_metrics(st)
    series = loadgen.open_loop([targets[n] for n in names], args.rate, args.endpoint_duration, slice_s=SLICE_S,
                               deadline_s=2 * len(names) * args.endpoint_duration + 60)
    split = phase_split(before, scrape_metrics(st))
    cpu = meter.stop()
    st.check_alive()
    reports = {s.target: s.report() for s in series}
    for name, rep in reports.items():
        direct = reports.get("direct-" + name.removeprefix("meshfast-"))
        if name.startswith("meshfast-") and direct is not None:
            rep["added_us"] = {p: round(rep["total_us"][p] - direct["total_us"][p], 1)
                               for p in ("p50", "p90", "p95", "p99")
                               if p in rep["total_us"] and p in direct["total_us"]}
    return {"rate_rps": args.rate, "duration_s_per_target": args.endpoint_duration, "slice_s": SLICE_S,
            "order": names, "requests": {n: {"method": m, "path": p, "body": (b or b"").decode()}
                                         for n, m, p, b, _ in ENDPOINTS},
            "cpu": cpu, "targets": reports, "phase_split": split}


def phase_ttfb(args, st: Stack, targets: dict[str, loadgen.Target]) -> dict:
    names = ["meshfast-anthropic", "meshfast-anthropic-huge", "direct-anthropic", "direct-anthropic-huge"]
    meter = CpuMeter(st.groups)
    series = loadgen.sequential([targets[n] for n in names], args.ttfb_count)
    cpu = meter.stop()
    st.check_alive()
    reports = {s.target: s.report() for s in series}

    def diff(a: str, b: str) -> float | None:
        pa, pb = reports[a]["ttfb_body_us"].get("p50"), reports[b]["ttfb_body_us"].get("p50")
        return None if pa is None or pb is None else round(pa - pb, 1)

    return {
        "count_per_target": args.ttfb_count,
        "cpu": cpu,
        "targets": reports,
        "meshfast_huge_minus_short_ttfb_p50_us": diff("meshfast-anthropic-huge", "meshfast-anthropic"),
        "direct_huge_minus_short_ttfb_p50_us": diff("direct-anthropic-huge", "direct-anthropic"),
    }


def phase_throughput(args, st: Stack, targets: dict[str, loadgen.Target], work_dir: Path) -> dict:
    runs = {}
    for name in ("direct-anthropic", "forwarder-anthropic", "forwarder-native-anthropic", "meshfast-anthropic"):
        print(f"[bench] wrk: {name} ...", flush=True)
        before = scrape_metrics(st) if name.startswith("meshfast") else None
        runs[name] = run_wrk_target(args, work_dir, name, targets[name], st)
        if before is not None:
            # The warm-up's requests and the measured ones together.
            runs[name]["phase_split"] = phase_split(before, scrape_metrics(st))
        st.check_alive()
    fw, mf = runs["forwarder-anthropic"]["requests_per_s"], runs["meshfast-anthropic"]["requests_per_s"]
    fn = runs["forwarder-native-anthropic"]["requests_per_s"]
    return {
        "connections": args.connections, "threads": args.threads, "duration_s": args.wrk_duration,
        "warmup_s": args.wrk_warmup, "runs": runs,
        "ratio_meshfast_over_forwarder_rps": round(mf / fw, 4) if fw > 0 else None,
        "ratio_meshfast_over_forwarder_native_rps": round(mf / fn, 4) if fn > 0 else None,
    }


# ------------------------------------------------------------------------------------- verdicts


def problems_of(doc: dict, phases: tuple[str, ...] = ("latency", "ttfb", "endpoints")) -> list[str]:
    """Anything but 2xx with a complete stream, or any socket error, fails the run (loadgen `phases`, wrk)."""
    problems = []
    for phase in phases:
        for name, rep in (doc.get(phase) or {}).get("targets", {}).items():
            if rep["error_count"]:
                problems.append(f"{phase} {name}: {rep['error_count']} errors, e.g. {rep['errors'][:3]}")
            if not rep["requests"]:
                problems.append(f"{phase} {name}: no completed requests")
    for name, run in ((doc.get("throughput") or {}).get("runs") or {}).items():
        errs = {k: v for k, v in run["wrk"]["errors"].items() if v}
        if errs:
            problems.append(f"wrk {name}: errors {errs}")
        if not run["wrk"]["requests"]:
            problems.append(f"wrk {name}: no requests")
    return problems


def criteria(doc: dict) -> dict:
    """The issue's must/goal checks; reported, they do not fail the run (the run's validity does)."""
    out: dict = {}
    lat = (doc.get("latency") or {}).get("targets") or {}
    fw = lat.get("forwarder-anthropic", {}).get("added_us")
    if fw:
        out["forwarder_added_us"] = fw
        for fam in FAMILIES:
            mf = lat.get(f"meshfast-{fam}", {}).get("added_us")
            if not mf:
                continue
            out[f"meshfast_{fam}_added_us"] = mf
            out[f"must_{fam}_added_p50_le_forwarder"] = mf["p50"] <= fw["p50"]
            out[f"goal_{fam}_added_p50_le_{GOAL_ADDED_P50_US:g}us"] = mf["p50"] <= GOAL_ADDED_P50_US
            out[f"goal_{fam}_added_p99_le_{GOAL_ADDED_P99_US:g}us"] = mf["p99"] <= GOAL_ADDED_P99_US
    ratio = (doc.get("throughput") or {}).get("ratio_meshfast_over_forwarder_rps")
    if ratio is not None:
        out["rps_ratio_meshfast_over_forwarder"] = ratio
        out[f"must_rps_ratio_ge_{MUST_RPS_RATIO:g}"] = ratio >= MUST_RPS_RATIO
        out[f"goal_rps_ratio_ge_{GOAL_RPS_RATIO:g}"] = ratio >= GOAL_RPS_RATIO
    d = (doc.get("ttfb") or {}).get("meshfast_huge_minus_short_ttfb_p50_us")
    if d is not None:
        out["ttfb_huge_minus_short_p50_us"] = d
        out[f"goal_ttfb_diff_le_{GOAL_TTFB_DIFF_US:g}us"] = abs(d) <= GOAL_TTFB_DIFF_US
    return out


# ------------------------------------------------------------------------------------------ table


_f = harness.format_number


def _print_split(split: dict | None) -> None:
    if split:
        print("meshfast phases (us): " + "; ".join(
            f"{name} n={v['count']} mean {_f(v['mean_us'])} p50 {_f(v['p50'])} p99 {_f(v['p99'])}"
            for name, v in split.items()))


def print_tables(doc: dict) -> None:
    lat = doc.get("latency")
    if lat:
        print(f"\nLatency at {lat['rate_rps']:g} req/s, {lat['duration_s_per_target']} s per target "
              f"(time to last byte, us; added = target - direct of the same family)")
        print(f"{'target':<22}{'n':>5}{'p50':>8}{'p95':>8}{'p99':>8}   {'+p50':>7}{'+p95':>7}{'+p99':>7}"
              f"{'ttfb p50':>10}")
        for name in lat["order"]:
            r = lat["targets"][name]
            t, a = r["total_us"], r.get("added_us", {})
            print(f"{name:<22}{r['requests']:>5}"
                  f"{_f(t.get('p50')):>8}{_f(t.get('p95')):>8}{_f(t.get('p99')):>8}"
                  f"   {_f(a.get('p50')):>7}{_f(a.get('p95')):>7}{_f(a.get('p99')):>7}"
                  f"{_f(r['ttfb_body_us'].get('p50')):>10}")
        _print_split(lat.get("phase_split"))
        _print_cpu("latency", lat["cpu"])
    tt = doc.get("ttfb")
    if tt:
        print(f"\nTime to first body byte, {tt['count_per_target']} sequential requests each (us)")
        print(f"{'target':<26}{'p50':>8}{'p95':>8}{'last byte p50':>15}{'body B':>9}")
        for name, r in tt["targets"].items():
            print(f"{name:<26}{_f(r['ttfb_body_us'].get('p50')):>8}{_f(r['ttfb_body_us'].get('p95')):>8}"
                  f"{_f(r['service_us'].get('p50')):>15}{r['body_bytes']:>9}")
        print(f"meshfast huge - short TTFB p50: {_f(tt['meshfast_huge_minus_short_ttfb_p50_us'])} us "
              f"(direct: {_f(tt['direct_huge_minus_short_ttfb_p50_us'])} us)")
        _print_cpu("ttfb", tt["cpu"])
    tp = doc.get("throughput")
    if tp:
        print(f"\nMax requests/s: wrk -t{tp['threads']} -c{tp['connections']} -d{tp['duration_s']}s")
        print(f"{'target':<22}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'busy%':>7}{'other%':>8}")
        for name, r in tp["runs"].items():
            cpu = r["cpu"]
            print(f"{name:<22}{r['requests_per_s']:>10,.0f}"
                  f"{r['latency_p50_ms']:>9.2f}{r['latency_p99_ms']:>9.2f}{r['errors_total']:>8}"
                  f"{_f(cpu['machine_busy_pct']):>7}{_f(cpu['other_busy_pct']):>8}")
        _print_split(tp["runs"].get("meshfast-anthropic", {}).get("phase_split"))
        print(f"meshfast/forwarder req/s: {tp['ratio_meshfast_over_forwarder_rps']} "
              f"(over the forwarder on meshfast's client: {tp.get('ratio_meshfast_over_forwarder_native_rps')})")
    ep = doc.get("endpoints")
    if ep:
        print(f"\nEndpoints at {ep['rate_rps']:g} req/s, {ep['duration_s_per_target']:g} s per target (us)")
        print(f"{'target':<26}{'n':>5}{'p50':>8}{'p95':>8}{'p99':>8}   {'+p50':>7}{'+p99':>7}")
        for name in ep["order"]:
            r = ep["targets"][name]
            t, a = r["total_us"], r.get("added_us", {})
            print(f"{name:<26}{r['requests']:>5}{_f(t.get('p50')):>8}{_f(t.get('p95')):>8}{_f(t.get('p99')):>8}"
                  f"   {_f(a.get('p50')):>7}{_f(a.get('p99')):>7}")
        _print_split(ep.get("phase_split"))
    crit = doc.get("criteria") or {}
    if crit:
        print("\nCriteria (reported, not enforced):")
        for k, v in crit.items():
            if isinstance(v, bool):
                print(f"  {k}: {'yes' if v else 'NO'}")
    others = [p["cpu"]["other_busy_pct"] for p in _phase_cpus(doc)]
    if others and max(o or 0 for o in others) > harness.BUSY_WARN_PCT:
        print(f"WARNING: processes outside the bench used up to {max(others):.0f}% of the CPUs in a phase; "
              "numbers are noisy")


def _phase_cpus(doc: dict) -> list[dict]:
    out = [doc[p] for p in ("latency", "ttfb") if doc.get(p)]
    out += list(((doc.get("throughput") or {}).get("runs") or {}).values())
    return out


def _print_cpu(label: str, cpu: dict) -> None:
    split = ", ".join(f"{k} {v:.1f}" for k, v in cpu["cpu_s"].items())
    print(f"  [{label}] {cpu['wall_s']:.0f} s, machine busy {cpu['machine_busy_pct']}%, not the bench's "
          f"{cpu['other_busy_pct']}% (niced {cpu['machine_cpu_s']['nice']:.1f} cpu s); cpu s: {split}, "
          f"other {cpu['other_cpu_s']:.1f}; loadavg {cpu['loadavg_start'][0]} -> {cpu['loadavg_end'][0]}")


# ------------------------------------------------------------------------------------------- main


def provenance(args) -> dict:
    prov = harness.provenance(args, ("aiohttp",))
    prov["versions"]["testserve"] = "in-tree (git_sha)"
    return prov


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers for meshfast and the forwarder")
    p.add_argument("--duration", type=float, default=30.0, help="latency seconds per target")
    p.add_argument("--rate", type=float, default=20.0, help="latency requests/s per target")
    p.add_argument("--endpoint-duration", type=float, default=15.0,
                   help="latency seconds per target for the other endpoints (embeddings, standard routes, GETs)")
    p.add_argument("--ttfb-count", type=int, default=TTFB_COUNT, help="sequential requests per TTFB target")
    p.add_argument("--connections", type=int, default=32, help="wrk connections")
    p.add_argument("--threads", type=int, default=1, help="wrk threads")
    p.add_argument("--wrk-duration", type=int, default=10, help="measured wrk seconds per target")
    p.add_argument("--wrk-warmup", type=int, default=2, help="wrk seconds before each, kept apart (0: none)")
    p.add_argument("--meshfast-client", choices=("native", "aiohttp"), default="native",
                   help="meshfast's upstream client (MESHFAST_UPSTREAM_CLIENT)")
    p.add_argument("--quick", action="store_true",
                   help="smoke check in < 60 s (3 s per target, 10 TTFB requests, 3 s wrk)")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(),
                   help="command that takes `serve ...`")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/proxy-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.ttfb_count, args.wrk_duration, args.wrk_warmup = 3.0, 10, 3, 1
        args.endpoint_duration = 2.0
    args.only = None  # models_bench.provenance() reads it
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"proxy-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    doc: dict = {
        "benchmark": "proxy",
        "description": ("POST /v1/proxy on meshfast vs a bare Granian+aiohttp forwarder vs a direct call to "
                        "testserve with the same upstream request: added latency at a fixed rate, TTFB of "
                        "short vs huge streams, max requests/s"),
        **harness.run_header(argv, started, provenance(args)),
        "config": {
            "workers": args.workers, "testserve_workers": 1, "rate_rps": args.rate,
            "meshfast_upstream_client": args.meshfast_client,
            "duration_s_per_target": args.duration, "slice_s": SLICE_S, "ttfb_count": args.ttfb_count,
            "endpoint_duration_s_per_target": args.endpoint_duration,
            "wrk": {"connections": args.connections, "threads": args.threads, "duration_s": args.wrk_duration,
                    "warmup_s": args.wrk_warmup, "timeout": harness.WRK_TIMEOUT},
            "quick": args.quick, "proxy_body": PROXY_BODY.decode(), "budget_policy": BUDGET_POLICY,
        },
        "note": NOTE.format(slice_s=SLICE_S),
        "error_policy": ("Any non-2xx answer, a stream without its terminator, a socket error or timeout "
                         "(loadgen or wrk), or a server that dies fails the run: ok=false, exit 1; "
                         "the JSON is still written. The criteria are reported, not enforced."),
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
    }
    failures: list[str] = []
    stack: Stack | None = None
    with tempfile.TemporaryDirectory(prefix="meshfast-proxy-bench-") as work:
        work_dir = Path(work)
        try:
            print("[bench] starting testserve, forwarder, meshfast ...", flush=True)
            stack = start_stack(args, work_dir)
            doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, stack.secrets())) for s in stack.servers()}
            doc["setup"] = stack.setup
            targets, doc["wire_shapes"] = build_targets(stack)
            print(f"[bench] latency: 8 targets x {args.duration:g} s at {args.rate:g} req/s ...", flush=True)
            doc["latency"] = phase_latency(args, stack, targets)
            print(f"[bench] TTFB: {args.ttfb_count} x 4 sequential ...", flush=True)
            doc["ttfb"] = phase_ttfb(args, stack, targets)
            doc["throughput"] = phase_throughput(args, stack, targets, work_dir)
            print(f"[bench] endpoints: {len(ENDPOINTS)} x {args.endpoint_duration:g} s at {args.rate:g} req/s ...",
                  flush=True)
            doc["endpoints"] = phase_endpoints(args, stack)
        except BenchError as exc:
            failures.append(str(exc))
            print(f"[bench] FAILED: {exc}", file=sys.stderr)
        except KeyboardInterrupt:
            failures.append("interrupted")
        finally:
            if stack is not None:
                stack.stop_into(doc)
    failures += problems_of(doc)
    doc["criteria"] = criteria(doc)
    doc["failures"] = failures
    doc["ok"] = not failures
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    print_tables(doc)
    if failures:
        print("\n[bench] failures:\n  " + "\n  ".join(f[:500] for f in failures), file=sys.stderr)
    print(f"\n[bench] wrote {out_path}" + ("" if doc["ok"] else " (FAILED run)"))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the servers on SIGTERM too
    sys.exit(main())
