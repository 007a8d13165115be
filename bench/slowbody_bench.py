"""Valid callers' latency before, during and after a slow-body attack (issue 13, item 1).

One run starts, on 127.0.0.1, testserve (1 worker) and `meshfast serve --workers N` through
`proxy_bench`'s harness, provisions governance_bench's anthropic provider (`g-anthropic`, its rate
limit far above the load) and one user, and sends valid `POST /v1/proxy` calls open loop at `--rate`
(a dispatcher hands each due time to an idle thread; latency counts from the due time) for
`--duration` s in three phases:

1. baseline: no attack;
2. attack: `--connections` connections each send a POST head declaring `content-length: 100` and
   then nothing, split between no credentials, an invalid `mesh_live_` key and (`--valid-share`) the
   user's valid key, alternating `/v1/proxy` and `/v1/chat/completions`; a thread reads what each
   socket receives (401, 408, nothing, or a close). meshfast runs with MESHFAST_BODY_IDLE_TIMEOUT_S =
   `--body-idle-timeout` (default: the phase + 5 s, at least 10 s), so the attack outlasts the
   phase; afterwards the bench waits for the valid-key sockets' 408s (up to that timeout + 3 s);
3. after: the stalled sockets closed.

Per phase: p50/p90/p99/max latency of every answer and of the 200s, answers by status, CPU use, and
`/readyz`'s `load` and the `/admin/metrics` saturation gauges sampled every second. The run fails
(exit 1, `"ok": false`, the JSON is still written) when a valid call during the attack (or in the
baseline or after it) is not a 200 with a complete stream, or the attack's p99 exceeds
`--goal-p99-ms`. Writes bench/results/slowbody-<timestamp>.json.

    python bench/slowbody_bench.py [--workers 2] [--rate 50] [--duration 10] [--connections 2000] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import random
import selectors
import shlex
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import capacity_bench as cb  # noqa: E402
from bench import governance_bench as gb  # noqa: E402
from bench import harness, loadgen  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402
from bench.harness import BenchError  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
DECLARED_BYTES = 100
# The provider's own rate limit, far above the valid load: only the attack may slow a call down.
PROVIDER_RPS = 10_000
STALLED_PATHS = (f"/v1/proxy?model={gb.MODEL_NAME}", "/v1/chat/completions")
KINDS = ("anonymous", "bad_key", "valid_key")
CONNECT_TIMEOUT_S = 5.0
SAMPLE_EVERY_S = 1.0
SETTLE_S = 1.0
# After the attack phase, how long past the idle timeout the valid-key sockets may take to get their 408.
ANSWER_GRACE_S = 3.0
GAUGES = ("meshfast_requests_in_flight", "meshfast_body_reads_in_flight", "meshfast_request_limit",
          "meshfast_saturated")
LOAD_KEYS = ("in_flight", "body_reads", "limit", "workers")

NOTE = (
    "testserve, meshfast (+ its embedded PostgreSQL), the valid callers and the attacker share this "
    "machine's CPUs unpinned with whatever else runs on it (each phase's cpu says how much that was). "
    "Latency counts from each call's due time (open loop, a thread pool that grows when none is idle), "
    "so a stall is charged to every call it delays. The stalled connections are opened one after the "
    "other before the attack phase's clock starts; each sends only a request head. /readyz and "
    "/admin/metrics are sampled every second from a thread of this process (their answers are not in "
    "the latency figures)."
)


# ----------------------------------------------------------------------------------------- attack


@dataclass
class Stalled:
    kind: str
    sock: socket.socket
    opened: float  # time.monotonic()
    head: bytes = b""
    status: int | None = None
    answered_s: float | None = None  # after `opened`
    closed_s: float | None = None  # the server closed (or reset) the connection, after `opened`


class Attack:
    """Connections that each send a POST head declaring DECLARED_BYTES and then nothing.

    One thread opens them all (registering each with a selector as it goes), then reads whatever
    the server sends on them until `close()`: the status line of an answer, or the connection's end.
    """

    def __init__(self, st: pb.Stack, total: int, valid_share: float) -> None:
        valid = round(total * valid_share)
        anonymous = (total - valid + 1) // 2
        kinds = ["valid_key"] * valid + ["anonymous"] * anonymous + ["bad_key"] * (total - valid - anonymous)
        random.Random(13).shuffle(kinds)
        self.kinds = kinds
        auth = {"anonymous": {}, "bad_key": {"authorization": f"Bearer {cb.BAD_KEY}"},
                "valid_key": {"authorization": f"Bearer {st.user_key}"}}
        headers = {"content-type": "application/json"}
        # The head of a request declaring DECLARED_BYTES of body: Target.post's bytes without the body.
        self.heads = {(kind, path): loadgen.Target.post(kind, st.meshfast_url + path, {**headers, **auth[kind]},
                                                        b" " * DECLARED_BYTES).request[:-DECLARED_BYTES]
                      for kind in KINDS for path in STALLED_PATHS}
        url = urllib.parse.urlsplit(st.meshfast_url)
        self.address = (url.hostname or "127.0.0.1", url.port or 80)
        self.sockets: list[Stalled] = []
        self.connect_errors: collections.Counter[str] = collections.Counter()
        self.open_s: float | None = None
        self.opened = threading.Event()
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, name="attack", daemon=True)

    def start(self, timeout_s: float) -> None:
        self._thread.start()
        if not self.opened.wait(timeout_s):
            raise BenchError(f"opening {len(self.kinds)} stalled connections took over {timeout_s:g} s")

    def _run(self) -> None:
        t0 = time.monotonic()
        for i, kind in enumerate(self.kinds):
            try:
                sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT_S)
                sock.sendall(self.heads[kind, STALLED_PATHS[i % len(STALLED_PATHS)]])
            except OSError as exc:
                self.connect_errors[f"{type(exc).__name__}: {exc}"] += 1
                continue
            sock.setblocking(False)
            s = Stalled(kind, sock, time.monotonic())
            self.sockets.append(s)
            self._selector.register(sock, selectors.EVENT_READ, s)
            if i % 50 == 49:
                self._read(0)
        self.open_s = round(time.monotonic() - t0, 3)
        self.opened.set()
        while not self._stop.is_set():
            self._read(0.1)

    def _read(self, timeout_s: float) -> None:
        for key, _ in self._selector.select(timeout_s):
            s: Stalled = key.data
            now = time.monotonic() - s.opened
            try:
                data = s.sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if len(s.head) < 12:
                s.head += data[:12 - len(s.head)]
                if s.status is None and len(s.head) >= 12 and s.head.startswith(b"HTTP/1."):
                    s.status, s.answered_s = int(s.head[9:12]), round(now, 3)
            if not data:
                s.closed_s = round(now, 3)
                self._selector.unregister(s.sock)

    def outcomes(self) -> dict:
        """Per kind: how many connections got which answer (`none`: nothing yet), how many the server
        closed, and when the answers came (seconds after the connection's head was sent)."""
        out: dict = {}
        for kind in KINDS:
            mine = [s for s in self.sockets if s.kind == kind]
            got = collections.Counter(str(s.status) if s.status is not None else "none" for s in mine)
            times = sorted(s.answered_s for s in mine if s.answered_s is not None)
            out[kind] = {
                "connections": len(mine),
                "received": dict(sorted(got.items())),
                "closed_by_server": sum(s.closed_s is not None for s in mine),
                "closed_without_answer": sum(s.closed_s is not None and s.status is None for s in mine),
                "answer_s": {"p50": times[len(times) // 2], "max": times[-1]} if times else None,
            }
        return out

    def valid_settled(self) -> bool:
        return all(s.status is not None or s.closed_s is not None for s in self.sockets if s.kind == "valid_key")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for s in self.sockets:
            try:
                s.sock.close()
            except OSError:
                pass
        self._selector.close()


# ---------------------------------------------------------------------------------------- sampler


class LoadSampler(cb.Sampler):
    """capacity_bench's sampler thread, every SAMPLE_EVERY_S: the ESTABLISHED sockets on meshfast's
    port, its processes' RSS, /readyz (its `load`) and the saturation gauges of /admin/metrics."""

    def __init__(self, st: pb.Stack) -> None:
        super().__init__(meshfast_pids(st), int(st.meshfast_url.rsplit(":", 1)[1]))
        self.st = st
        self.samples: list[dict] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(SAMPLE_EVERY_S)

    def sample(self) -> dict:
        out: dict = {"t_s": round(time.monotonic() - self.t0, 2), "sockets": cb.established_on(self.port),
                     "rss_mb": cb.rss_mb(self.pids)}
        try:
            status, _, raw = harness.http_request("GET", self.st.meshfast_url + "/readyz", timeout_s=2.0)
            out["readyz_status"] = status
            body = json.loads(raw) if raw.startswith(b"{") else {}
            out["readyz"] = {"status": body.get("status"), "load": body.get("load")}
        except (OSError, ValueError) as exc:
            out["readyz_status"], out["readyz_error"] = None, f"{type(exc).__name__}: {exc}"
        try:
            metrics = pb.metrics_at(self.st.meshfast_url, self.st.admin_token)
            out["gauges"] = {g: metrics.get(g) for g in GAUGES}
        except (BenchError, OSError, ValueError) as exc:
            out["gauges_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return out

    def report(self) -> dict:
        loads = [s["readyz"]["load"] for s in self.samples if (s.get("readyz") or {}).get("load")]
        gauges = [s["gauges"] for s in self.samples if "gauges" in s]
        return {
            "samples": len(self.samples),
            "readyz_statuses": dict(collections.Counter(str(s.get("readyz_status")) for s in self.samples)),
            "readyz_load_peak": {k: max((ld.get(k) or 0 for ld in loads), default=None) for k in LOAD_KEYS}
            if loads else None,
            "readyz_saturated_samples": sum(bool(ld.get("saturated")) for ld in loads),
            "gauges_peak": {g: max((x[g] for x in gauges if x[g] is not None), default=None) for g in GAUGES}
            if gauges else None,
            "gauge_errors": sum("gauges_error" in s for s in self.samples),
            "sockets_peak": max((s["sockets"] for s in self.samples), default=None),
            "rss_mb_peak": max((s["rss_mb"] for s in self.samples), default=None),
            "series": self.samples,
        }


# ----------------------------------------------------------------------------------------- phases


def valid_calls(args, st: pb.Stack, target: loadgen.Target, name: str) -> dict:
    """`--rate` valid calls/s for `--duration` s, with the load sampled meanwhile."""
    print(f"[bench] {name}: {args.rate:g} req/s x {args.duration:g} s ...", flush=True)
    meter = pb.CpuMeter(st.groups)
    with LoadSampler(st) as sampler:
        run = gb.paced([target], args.rate, args.duration)
    out: dict = {"phase": name, "arrivals": run.count, "threads_used": run.threads_used, "cpu": meter.stop()}
    out.update(gb.summarize(run.records, run.t0, run.t_end))
    # Every answer (a quick 503 is a latency too), and the answers by status (0: socket error or a
    # 200 whose stream did not end).
    chosen = [r for r in run.records if run.t0 <= r.start_ns < run.t_end]
    out["latency_all_ms"] = {k: (v if k == "n" else round(v / 1000, 2))
                             for k, v in loadgen.summarize_us([r.end_ns - r.start_ns for r in chosen]).items()}
    out["statuses"] = {str(k): v for k, v in sorted(collections.Counter(r.status for r in chosen).items())}
    out["non_200"] = sum(v for k, v in out["statuses"].items() if k != "200")
    out["per_second"] = gb.per_second(run.records, run.t0, int(args.duration + 0.999))
    lag = sorted(run.lag_ns)
    out["dispatch_lag_ms_p99"] = round(loadgen.percentile(lag, 99) / 1e6, 2) if lag else None
    out["errors"] = run.errors[:20]
    out["error_count"] = len(run.errors)
    out["load"] = sampler.report()
    st.check_alive()
    return out


def phase_attack(args, st: pb.Stack, target: loadgen.Target) -> dict:
    attack = Attack(st, args.connections, args.valid_share)
    print(f"[bench] attack: opening {args.connections} stalled connections ...", flush=True)
    attack.start(timeout_s=CONNECT_TIMEOUT_S + args.connections * 0.05)
    try:
        time.sleep(SETTLE_S)
        out = valid_calls(args, st, target, "attack")
        out["stalled_received_during_phase"] = attack.outcomes()
        valid_opened = [s.opened for s in attack.sockets if s.kind == "valid_key"]
        deadline = max(valid_opened, default=0.0) + args.body_idle_timeout + ANSWER_GRACE_S
        print("[bench] attack: waiting for the valid-key sockets' answers ...", flush=True)
        while not attack.valid_settled() and time.monotonic() < deadline:
            time.sleep(0.2)
        out["stalled_received"] = attack.outcomes()
        out["stalled"] = {"requested": args.connections, "opened": len(attack.sockets), "open_s": attack.open_s,
                          "connect_errors": dict(attack.connect_errors.most_common(5)),
                          "connect_error_count": sum(attack.connect_errors.values()),
                          "kinds": {k: attack.kinds.count(k) for k in KINDS}, "paths": list(STALLED_PATHS),
                          "declared_body_bytes": DECLARED_BYTES}
    finally:
        attack.close()
    return out


def meshfast_pids(st: pb.Stack) -> list[int]:
    """meshfast's processes (its session: the main process and the Granian workers), PostgreSQL left out."""
    sid = st.meshfast.proc.pid if st.meshfast and st.meshfast.proc else None
    return [pid for pid, (_, psid, _, cmd) in pb._processes().items() if psid == sid and "postgres" not in cmd]


def soft_nofile(pid: int) -> int | None:
    try:
        line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max open files"))
        return int(line.split()[3])
    except (OSError, StopIteration, ValueError):
        return None


def run_phases(args, st: pb.Stack, doc: dict) -> None:
    target = gb.proxy_target(st)
    _, _, status, err = gb._call(loadgen.Conn(target.host, target.port), target)
    if status != 200 or err:
        raise BenchError(f"first proxy call answered {status}: {err}")
    warm = gb.paced([target], args.rate, args.warmup)
    doc["warmup"] = {"seconds": args.warmup, **dict(collections.Counter(str(r.status) for r in warm.records))}
    doc["phases"] = {}
    doc["phases"]["baseline"] = valid_calls(args, st, target, "baseline")
    doc["phases"]["attack"] = phase_attack(args, st, target)
    doc["server_nofile"] = {str(pid): soft_nofile(pid) for pid in meshfast_pids(st)}
    time.sleep(SETTLE_S)
    doc["phases"]["after"] = valid_calls(args, st, target, "after")


# --------------------------------------------------------------------------------------- verdicts


def problems_of(doc: dict, goal_p99_ms: float) -> list[str]:
    problems = []
    for name, ph in (doc.get("phases") or {}).items():
        if ph["non_200"]:
            problems.append(f"{name}: {ph['non_200']} of {ph['requests']} valid calls were not 200 "
                            f"({ph['statuses']}), e.g. {ph['errors'][:2]}")
    attack = (doc.get("phases") or {}).get("attack")
    if attack:
        p99 = attack["latency_all_ms"].get("p99")
        if p99 is None or p99 > goal_p99_ms:
            problems.append(f"attack: valid calls' p99 {p99} ms > goal {goal_p99_ms:g} ms")
    return problems


def criteria(doc: dict, goal_p99_ms: float) -> dict:
    """The issue's expectations, reported (only the first two are enforced)."""
    attack = (doc.get("phases") or {}).get("attack")
    if not attack:
        return {}
    got = attack.get("stalled_received") or {}
    refused = [got[k]["received"].get("401", 0) == got[k]["connections"] for k in ("anonymous", "bad_key") if k in got]
    return {
        "attack_all_200": attack["non_200"] == 0,
        "attack_p99_ms": attack["latency_all_ms"].get("p99"), "goal_p99_ms": goal_p99_ms,
        "attack_p99_within_goal": (attack["latency_all_ms"].get("p99") or 0) <= goal_p99_ms,
        "invalid_refused_401_from_headers": bool(refused) and all(refused),
        "valid_stalled_got_408": "valid_key" in got and got["valid_key"]["received"].get("408", 0)
        == got["valid_key"]["connections"],
        "saturation_visible": attack["load"]["readyz_load_peak"] is not None
        and attack["load"]["gauges_peak"] is not None
        and all(attack["load"]["gauges_peak"].get(g) is not None for g in GAUGES),
    }


# ------------------------------------------------------------------------------------------ table


def _cell(x) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def print_tables(doc: dict) -> None:
    phases = doc.get("phases") or {}
    cfg = doc["config"]
    attack = phases.get("attack") or {}
    kinds = (attack.get("stalled") or {}).get("kinds", {})
    print(f"\nSlow-body attack: {cfg['connections']} stalled connections ({', '.join(f'{v} {k}' for k, v in kinds.items())}), "
          f"valid POST /v1/proxy at {cfg['rate_rps']:g} req/s for {cfg['duration_s']:g} s per phase "
          f"(latency of every answer from its due time, ms)")
    print(f"{'phase':<10}{'calls':>7}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}  {'non-200 by status':<22}"
          f"{'busy%':>7}{'other%':>8}")
    for name, ph in phases.items():
        lat = ph["latency_all_ms"]
        bad = {k: v for k, v in ph["statuses"].items() if k != "200"} or "-"
        print(f"{name:<10}{ph['requests']:>7}{_cell(lat.get('p50')):>8}{_cell(lat.get('p90')):>8}"
              f"{_cell(lat.get('p99')):>8}{_cell(lat.get('max')):>8}  {str(bad):<22}"
              f"{_cell(ph['cpu']['machine_busy_pct']):>7}{_cell(ph['cpu']['other_busy_pct']):>8}")
    if attack:
        st = attack["stalled"]
        print(f"\nStalled connections: {st['opened']} opened in {st['open_s']} s "
              f"({st['connect_error_count']} failed); what they received (at the end of the phase -> after "
              f"waiting up to the idle timeout {cfg['body_idle_timeout_s']:g} s + {ANSWER_GRACE_S:g} s):")
        for kind, final in attack["stalled_received"].items():
            during = attack["stalled_received_during_phase"][kind]["received"]
            print(f"  {kind:<10}{final['connections']:>6}  {during} -> {final['received']}; closed by the server "
                  f"{final['closed_by_server']}; answer after {final['answer_s']} s")
        load = attack["load"]
        print(f"Load during the attack ({load['samples']} samples): /readyz {load['readyz_statuses']}, peak load "
              f"{load['readyz_load_peak']}, saturated in {load['readyz_saturated_samples']}; /admin/metrics peak "
              f"{load['gauges_peak']} ({load['gauge_errors']} failed scrapes); sockets on meshfast's port "
              f"peak {load['sockets_peak']}")
    crit = doc.get("criteria") or {}
    if crit:
        print(f"p99 during the attack {crit['attack_p99_ms']} ms (goal <= {crit['goal_p99_ms']:g}): "
              f"{'ok' if crit['attack_p99_within_goal'] else 'FAIL'}; all 200: "
              f"{'ok' if crit['attack_all_200'] else 'FAIL'}")


# ------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers for meshfast")
    p.add_argument("--rate", type=float, default=50.0, help="valid calls per second (open loop)")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per phase")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of valid calls before the baseline, kept apart")
    p.add_argument("--connections", type=int, default=2000, help="stalled connections during the attack")
    p.add_argument("--valid-share", type=float, default=0.10,
                   help="share of the stalled connections that carry the user's valid key (the rest: half "
                        "without credentials, half with an invalid key)")
    p.add_argument("--body-idle-timeout", type=float, default=None,
                   help="MESHFAST_BODY_IDLE_TIMEOUT_S for meshfast (default: max(10, duration + 5), so the "
                        "attack outlasts the phase)")
    p.add_argument("--goal-p99-ms", type=float, default=50.0, help="p99 of valid calls during the attack")
    p.add_argument("--quick", action="store_true", help="smoke check (3 s phases, 500 stalled connections)")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(),
                   help="command that takes `serve ...` (point it at an older build for a before/after)")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/slowbody-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = min(args.duration, 3.0), min(args.warmup, 1.0)
        args.connections = min(args.connections, 500)
    if args.body_idle_timeout is None:
        args.body_idle_timeout = max(10.0, args.duration + 5.0)
    if not 0 <= args.valid_share <= 1:
        p.error("--valid-share must be within [0, 1]")
    args.only = None  # models_bench.provenance() reads it
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"slowbody-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    doc: dict = {
        "benchmark": "slowbody",
        "description": ("valid POST /v1/proxy calls at a fixed rate before, during and after a slow-body attack "
                        "(connections that send a request head declaring a body, then nothing)"),
        **harness.run_header(argv, started, pb.provenance(args)),
        "config": {
            "workers": args.workers, "testserve_workers": 1, "rate_rps": args.rate, "duration_s": args.duration,
            "warmup_s": args.warmup, "connections": args.connections, "valid_share": args.valid_share,
            "body_idle_timeout_s": args.body_idle_timeout, "goal_p99_ms": args.goal_p99_ms, "quick": args.quick,
            "provider_rps_limit": PROVIDER_RPS, "proxy_body": pb.PROXY_BODY.decode(),
            "meshfast_env": {"MESHFAST_BODY_IDLE_TIMEOUT_S": str(args.body_idle_timeout)},
        },
        "note": NOTE,
        "error_policy": ("A valid call that is not a 200 with a complete stream (in any phase), or a p99 during "
                         "the attack above goal_p99_ms, fails the run (ok=false, exit 1; the JSON is still "
                         "written); the other criteria are reported."),
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
    }
    # The servers inherit it: meshfast reads it at start (a build without the body timeouts ignores it).
    os.environ["MESHFAST_BODY_IDLE_TIMEOUT_S"] = str(args.body_idle_timeout)
    failures: list[str] = []
    stack: pb.Stack | None = None
    with tempfile.TemporaryDirectory(prefix="meshfast-slowbody-bench-") as work:
        try:
            print("[bench] starting testserve, meshfast ...", flush=True)
            stack = pb.start_stack(args, Path(work), forwarder=False,
                                   provision=lambda st: gb.provision(st, PROVIDER_RPS))
            # The servers keep the limit they started with; the attacker needs a descriptor per socket.
            doc["nofile"] = harness.raise_nofile()
            doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, stack.secrets())) for s in stack.servers()}
            doc["setup"] = stack.setup
            run_phases(args, stack, doc)
        except BenchError as exc:
            failures.append(str(exc))
            print(f"[bench] FAILED: {exc}", file=sys.stderr)
        except KeyboardInterrupt:
            failures.append("interrupted")
        finally:
            if stack is not None:
                stack.stop_into(doc)
    failures += problems_of(doc, args.goal_p99_ms)
    doc["criteria"] = criteria(doc, args.goal_p99_ms)
    return harness.finish(doc, failures, started, out_path, "bench", print_tables, indent=2)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the servers on SIGTERM too
    sys.exit(main())
