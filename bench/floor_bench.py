"""The floor and the ceiling side by side (issue 19, "Speed"): what each layer adds over one fast upstream.

One run starts, on 127.0.0.1 and against the same upstream (nginx answering every `POST /sse/...` with one
fixed OpenAI chat stream, 1.7 KB, content-length framed, built once at config time: what meshfast asks an
OpenAI-family provider for on both routes, a non-streamed chat included, which it aggregates), these
targets, each with `--workers` workers:

- `direct`: the upstream itself, the request meshfast sends (no gateway; the added-latency baseline);
- `compiled`: the compiled forwarder (`bench/forwarder-rs`, hyper 1.x, pooled keep-alive client,
  `--workers` Tokio threads), path and body streamed through;
- `py-aiohttp`: the bare Python forwarder (`bench/forwarder_app.py`: Granian RSGI + aiohttp);
- `py-native`: the same forwarder on meshfast's own upstream client (`meshfast.http1`);
- `py-offloop`: the same forwarder with the upstream exchange off the event loop (a thread per
  exchange, blocking keep-alive sockets, one hand-off back to the loop per answer): what moving the
  upstream I/O into a runtime of its own buys a Python-served request, measured rather than assumed;
- `rs-offloop`: the same, compiled (`bench/offloop-rs`: hyper on a Tokio runtime of its own, finished
  answers handed back through one descriptor the loop watches, no GIL taken off the loop): the shape
  of the upstream exchange in the core's own runtime, one hand-off per response;
  (the three forwarders stream the upstream's bytes back unparsed);
- `hello`: Granian hello world (`bench/hello_app.py`, no upstream call);
- `meshfast-chat`: meshfast `POST /v1/chat/completions`, not streamed (the upstream stream aggregated
  into one chat completion);
- `meshfast-proxy`: meshfast `POST /v1/proxy`, the upstream stream answered as NDJSON.

meshfast runs governed as it ships: embedded PostgreSQL, one user with a daily budget and an hourly call
cap on its model (`POLICY`), every call priced, settled and written as a row (the row pipeline's
counters are read at the end: `telemetry`).

Phases, each target in turn:

1. one connection, back to back (`loadgen.back_to_back`, `--b2b-rounds` rounds of `--b2b-duration` s
   per target, targets alternating): p50/p99 of time to last byte, added = target - direct;
2. open loop at `--rate` req/s (`loadgen.open_loop`, 1 s slices alternating): the same;
3. wrk `-c --connections` (`proxy_bench.run_wrk_target`): req/s, and the worker processes' CPU time
   per call (psutil, over the measured run only; Granian's workers, the compiled forwarder's process,
   nginx's workers for the direct calls).

The Granian runtime (`--loop`, `--task-impl`, `--runtime-mode`, `--workers`) applies to every Granian
server of the run alike: the Python forwarders and hello world on the command line, meshfast through
MESHFAST_LOOP / MESHFAST_TASK_IMPL / MESHFAST_RUNTIME_MODE. Without `--loop`, every Granian server
runs uvloop (a dependency: meshfast's default, and what Granian's `auto` takes when rloop is absent);
the workers' mapped loop libraries are checked and reported (`loops_mapped`). rloop is not a
dependency: `make bench-loops` installs it into target/bench-loops, put on the servers' PYTHONPATH
only for `--loop rloop` (Granian's `auto` would otherwise take it).

    .venv/bin/python bench/floor_bench.py [--quick] [--loop uvloop] [--task-impl rust] [--workers 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, loadgen
from bench import proxy_bench as pb
from bench.harness import BenchError, Server

RESULTS_DIR = ROOT / "bench" / "results"
FORWARDER_RS = ROOT / "target" / "bench-forwarder" / "release" / "forwarder-rs"
LOOPS_DIR = ROOT / "target" / "bench-loops"
OFFLOOP_DIR = ROOT / "target" / "bench-offloop" / "py"  # `make bench-offloop`
READY_TIMEOUT_S = 30.0

UPSTREAM_KEY = "floor-key"
MODEL = "f-chat"
RESOLVED = "floor-chat"
POLICY = {**pb.BUDGET_POLICY, "max_calls_per_hour": 1_000_000_000}
CHAT_REQUEST = b'{"model":"%s","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}'
STREAM_REQUEST = (b'{"model":"%s","messages":[{"role":"user","content":"hello"}],"max_tokens":64,'
                  b'"stream":true,"stream_options":{"include_usage":true}}')

# The upstream's answer (the shape of testserve's openai family stream for a short call, fixed).
_CHUNK = (b'data: {"id":"chatcmpl-floor","object":"chat.completion.chunk","created":1700000000,'
          b'"model":"floor-chat","system_fingerprint":"fp_floor","choices":[{"index":0,"delta":%s,'
          b'"logprobs":null,"finish_reason":%s}],"usage":null}\n\n')
SSE_STREAM = b"".join([
    _CHUNK % (b'{"role":"assistant","content":"","refusal":null}', b"null"),
    *(_CHUNK % (b'{"content":"%s"}' % w, b"null") for w in (b"Hello", b" from", b" the", b" floor.")),
    _CHUNK % (b"{}", b'"stop"'),
    b'data: {"id":"chatcmpl-floor","object":"chat.completion.chunk","created":1700000000,"model":"floor-chat",'
    b'"system_fingerprint":"fp_floor","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4,'
    b'"total_tokens":12}}\n\n',
    b"data: [DONE]\n\n",
])
JSON_END = b'"finish_reason":"stop"'  # meshfast's aggregated chat completion
SSE_END = b"[DONE]"

# The goals, on meshfast's chat route and /v1/proxy.
GOAL_ADDED_P50_US = 150.0
GOAL_ADDED_P99_US = 1000.0
GOAL_RPS_OVER_PY = 1.5
GOAL_RPS_OVER_COMPILED = 0.5
GOAL_CPU_US = 70.0

TARGETS = ("direct", "compiled", "py-aiohttp", "py-native", "py-offloop", "rs-offloop", "hello", "meshfast-chat",
           "meshfast-proxy")
MESHFAST_TARGETS = ("meshfast-chat", "meshfast-proxy")

NOTE = (
    "Everything (nginx, the gateways, meshfast's embedded PostgreSQL, the load generator, wrk) shares "
    "this machine's CPUs unpinned with whatever else runs on it (phases' cpu.other_busy_pct). Added "
    "latency is a difference of percentiles (target pN - direct pN), not a percentile of differences. Worker CPU per call is the user+system time of the serving "
    "processes (Granian's workers; the compiled forwarder's process; nginx's workers for direct) over "
    "the measured wrk run, divided by the requests wrk completed in it. The upstream's answer is "
    "content-length framed (nginx `return`), not chunked."
)


# --------------------------------------------------------------------------------------- upstream


def _nginx_string(data: bytes) -> str:
    """A single-quoted nginx string: backslash and quote escaped, newlines as \\n."""
    text = data.decode()
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def nginx_conf(work_dir: Path, port: int, workers: int) -> str:
    return f"""worker_processes {workers};
pid {work_dir}/nginx.pid;
error_log {work_dir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    client_body_temp_path {work_dir}/nginx-body;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location /sse/ {{ default_type text/event-stream; return 200 {_nginx_string(SSE_STREAM)}; }}
        location = /healthz {{ return 200 'ok'; }}
    }}
}}
"""


# ---------------------------------------------------------------------------------------- servers


@dataclass
class FloorStack(pb.Stack):
    """proxy_bench's stack (meshfast, its data dir and secrets) plus this bench's other servers."""

    extra: dict[str, Server] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)

    def servers(self) -> list[Server]:
        return [*self.extra.values(), *super().servers()]

    def stop(self) -> dict:
        report = super().stop()
        for s in reversed(self.extra.values()):
            report[s.name] = s.stop()
        return report


def granian_flags(args) -> list[str]:
    out = []
    for flag, value in (("--loop", args.loop), ("--task-impl", args.task_impl),
                        ("--runtime-mode", args.runtime_mode)):
        if value:
            out += [flag, value]
    return out


def server_env(args) -> dict[str, str]:
    """Servers import meshfast and bench/ from the working tree; the extra loops only when asked for."""
    env = dict(os.environ)
    path = [str(ROOT)]
    if args.loop == "rloop":
        path.append(str(LOOPS_DIR))
    env["PYTHONPATH"] = os.pathsep.join(path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONSAFEPATH"] = "1"
    return env


def start_stack(args, work_dir: Path) -> FloorStack:
    st = FloorStack()
    env = server_env(args)
    py = sys.executable
    ports = {name: harness.free_port() for name in ("upstream", "compiled", "py-aiohttp", "py-native", "py-offloop",
                                                    "rs-offloop", "hello", "meshfast")}
    st.urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    upstream = st.urls["upstream"]
    conf = work_dir / "nginx.conf"
    conf.write_text(nginx_conf(work_dir, ports["upstream"], args.upstream_workers))
    st.extra["upstream"] = harness.nginx_server(work_dir, conf, env)
    st.extra["compiled"] = Server("compiled", [str(args.forwarder_rs), "--listen", f"127.0.0.1:{ports['compiled']}",
                                               "--upstream", upstream, "--workers", str(args.workers)],
                                  env, work_dir / "compiled.log")
    granian = [py, "-m", "granian", "--interface", "rsgi", "--workers", str(args.workers), "--host", "127.0.0.1",
               *granian_flags(args)]
    fw_env = dict(env, FORWARDER_UPSTREAM=f"{upstream}/sse/v1/chat/completions", FORWARDER_API_KEY=UPSTREAM_KEY)
    for name, client in (("py-aiohttp", "aiohttp"), ("py-native", "native"), ("py-offloop", "thread"),
                         ("rs-offloop", "rs")):
        client_env = dict(fw_env, FORWARDER_CLIENT=client)
        if client == "rs":
            client_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(OFFLOOP_DIR), env.get("PYTHONPATH")) if p)
        st.extra[name] = Server(name, [*granian, "--port", str(ports[name]), "bench.forwarder_app:app"],
                                client_env, work_dir / f"{name}.log")
    st.extra["hello"] = Server("hello", [*granian, "--port", str(ports["hello"]), "bench.hello_app:app"], env,
                               work_dir / "hello.log")
    if not args.no_meshfast:
        st.meshfast_url = st.urls["meshfast"]
        st.data_dir = tempfile.mkdtemp(prefix="meshfast-floor-")
        st.admin_token = secrets.token_urlsafe(32)
        mf_env = dict(env, MESHFAST_DATA_DIR=st.data_dir, MESHFAST_ADMIN_TOKEN=st.admin_token)
        for var, value in (("MESHFAST_LOOP", args.loop), ("MESHFAST_TASK_IMPL", args.task_impl),
                           ("MESHFAST_RUNTIME_MODE", args.runtime_mode)):
            if value:
                mf_env[var] = value
        mf_env.pop("DATABASE_URL", None)  # the embedded database a fresh install gets
        st.meshfast = Server("meshfast", shlex.split(args.meshfast_cmd) + [
            "serve", "--workers", str(args.workers), "--host", "127.0.0.1", "--port", str(ports["meshfast"])],
            mf_env, work_dir / "meshfast.log")
    try:
        for s in st.servers():
            s.start()
            st.groups.sessions[s.name] = s.proc.pid
        if st.data_dir:
            st.groups.data_dirs["meshfast_postgres"] = st.data_dir
        for name, s in st.extra.items():
            url = st.urls[name] + ("/healthz" if name in ("upstream", "compiled") else "/")
            st.setup[f"{name}_ready_s"] = harness.wait_until(lambda u=url: _answers(u), READY_TIMEOUT_S, s, "an answer")
        if st.meshfast is not None:
            st.setup["meshfast_ready_s"] = harness.wait_until(
                lambda: harness.http_request("GET", st.meshfast_url + "/readyz", timeout_s=2.0)[0] == 200,
                pb.MESHFAST_READY_TIMEOUT_S, st.meshfast, "GET /readyz == 200")
            provision(st)
    except BaseException:
        st.stop()
        raise
    return st


def _answers(url: str) -> bool:
    """Any HTTP answer at all (the forwarders answer a GET with 404): the server is listening."""
    return harness.http_request("GET", url, timeout_s=2.0)[0] > 0


def provision(st: FloorStack) -> None:
    """One openai-family provider on the upstream with one priced model, and one governed user."""
    t0 = time.monotonic()
    provider = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/providers", {
        "name": "f-openai", "family": "openai", "base_url": f"{st.urls['upstream']}/sse",
        "api_key": UPSTREAM_KEY, "local": True, "verify": False,
        "models": [{"name": MODEL, "resolved_model": RESOLVED, "kind": "chat",
                    "input_price_per_1k_tokens": "0.001", "output_price_per_1k_tokens": "0.002", "verify": False}],
    })
    model_ids = [m["id"] for m in provider["models"]]
    st.setup["provider_settings"] = pb.provider_settings(provider)
    pb.grant_user(st, model_ids, POLICY)
    st.setup["provision_s"] = round(time.monotonic() - t0, 3)
    pb.wait_for_models(st, len(model_ids), "the model with the bench budget on every worker")


def worker_pids(server: Server) -> list[int]:
    """The processes that serve: Granian's workers are forks of its main process (same command line;
    meshfast's PostgreSQL is not); the compiled forwarder serves from its own process; nginx from its
    workers."""
    main = psutil.Process(server.proc.pid)
    if server.name == "compiled":
        return [main.pid]
    children = main.children()
    if server.name == "upstream":
        return [c.pid for c in children]
    cmd = main.cmdline()
    return [c.pid for c in children if c.cmdline() == cmd]


def loops_mapped(pids: list[int]) -> dict[str, list[str]]:
    """Which alternative event loop each serving process has loaded (its extension in /proc/PID/maps):
    proof that `--loop` took effect, since Granian does not log its loop."""
    out = {}
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        out[str(pid)] = [name for name, so in (("uvloop", "/uvloop/loop."), ("rloop", "/rloop/_rloop."))
                         if so in maps]
    return out


def cpu_meter(pids: list[int]) -> Callable[[], Callable[[], dict]]:
    """A start function for run_wrk_target: user+system seconds of `pids` between start and stop."""

    def times() -> dict[int, float]:
        out = {}
        for pid in pids:
            try:
                t = psutil.Process(pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            out[pid] = t.user + t.system
        return out

    def start() -> Callable[[], dict]:
        t0, w0 = times(), time.monotonic()

        def stop() -> dict:
            t1, wall = times(), time.monotonic() - w0
            per = {pid: round(t1[pid] - t0[pid], 3) for pid in t0 if pid in t1}
            return {"pids": pids, "cpu_s": per, "total_cpu_s": round(sum(per.values()), 3), "wall_s": round(wall, 2)}

        return stop

    return start


# ---------------------------------------------------------------------------------------- targets


def build_targets(st: FloorStack) -> dict[str, loadgen.Target]:
    auth = {"authorization": f"Bearer {st.user_key}", "content-type": "application/json"}
    up_auth = {"authorization": f"Bearer {UPSTREAM_KEY}", "content-type": "application/json"}
    json_ct = {"content-type": "application/json"}
    up, post = st.urls["upstream"], loadgen.Target.post
    stream = STREAM_REQUEST % RESOLVED.encode()
    targets = {
        "direct": post("direct", f"{up}/sse/v1/chat/completions", up_auth, stream, SSE_END),
        "compiled": post("compiled", f"{st.urls['compiled']}/sse/v1/chat/completions", up_auth, stream, SSE_END),
        "py-aiohttp": post("py-aiohttp", f"{st.urls['py-aiohttp']}/v1/proxy?model=b-anthropic", json_ct,
                           pb.PROXY_BODY, SSE_END),
        "py-native": post("py-native", f"{st.urls['py-native']}/v1/proxy?model=b-anthropic", json_ct,
                          pb.PROXY_BODY, SSE_END),
        "py-offloop": post("py-offloop", f"{st.urls['py-offloop']}/v1/proxy?model=b-anthropic", json_ct,
                           pb.PROXY_BODY, SSE_END),
        "rs-offloop": post("rs-offloop", f"{st.urls['rs-offloop']}/v1/proxy?model=b-anthropic", json_ct,
                           pb.PROXY_BODY, SSE_END),
        "hello": post("hello", f"{st.urls['hello']}/v1/proxy?model=hello", json_ct, pb.PROXY_BODY,
                      b"message_stop"),
        "meshfast-chat": post("meshfast-chat", f"{st.meshfast_url}/v1/chat/completions", auth,
                              CHAT_REQUEST % MODEL.encode(), JSON_END),
        "meshfast-proxy": post("meshfast-proxy", f"{st.meshfast_url}/v1/proxy?model={MODEL}", auth,
                               pb.PROXY_BODY, pb.NDJSON_END),
    }
    if st.meshfast is None:
        targets = {k: v for k, v in targets.items() if k not in MESHFAST_TARGETS}
    for t in targets.values():
        pb._exchange_once(t)
    return targets


def _added(reports: dict[str, dict], key: str = "total_us") -> None:
    for name, rep in reports.items():
        base = reports.get("direct")
        if base is None or name == "direct":
            continue
        rep["added_us"] = {p: round(rep[key][p] - base[key][p], 1) for p in ("p50", "p90", "p99", "p99_9")
                           if p in rep[key] and p in base[key]}


def _merge(parts: list[loadgen.Series]) -> loadgen.Series:
    out = loadgen.Series(parts[0].target)
    for s in parts:
        for f in ("total_ns", "service_ns", "head_ns", "first_body_ns", "backlog_ns", "errors"):
            getattr(out, f).extend(getattr(s, f))
        for k, v in s.statuses.items():
            out.statuses[k] = out.statuses.get(k, 0) + v
        out.body_bytes, out.reconnects = s.body_bytes, out.reconnects + s.reconnects
    return out


def phase_back_to_back(args, st: FloorStack, targets: dict[str, loadgen.Target]) -> dict:
    names = tuple(targets)
    parts: dict[str, list[loadgen.Series]] = {n: [] for n in names}
    meter = pb.CpuMeter(st.groups)
    for r in range(args.b2b_rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            parts[name].append(loadgen.back_to_back(targets[name], args.b2b_duration))
    cpu = meter.stop()
    st.check_alive()
    reports = {n: _merge(p).report(raw=False) for n, p in parts.items()}
    for rep in reports.values():
        rep["requests_per_s"] = round(rep["requests"] / (args.b2b_rounds * args.b2b_duration), 1)
    _added(reports)
    return {"rounds": args.b2b_rounds, "duration_s_per_round": args.b2b_duration, "cpu": cpu, "targets": reports}


def phase_open(args, st: FloorStack, targets: dict[str, loadgen.Target]) -> dict:
    chosen = list(targets.values())
    meter = pb.CpuMeter(st.groups)
    series = loadgen.open_loop(chosen, args.rate, args.duration, slice_s=pb.SLICE_S,
                               deadline_s=2 * len(chosen) * args.duration + 60)
    cpu = meter.stop()
    st.check_alive()
    reports = {s.target: s.report(raw=False) for s in series}
    _added(reports)
    return {"rate_rps": args.rate, "duration_s_per_target": args.duration, "cpu": cpu, "targets": reports}


def _server_of(name: str) -> str:
    return "upstream" if name.startswith("direct") else "meshfast" if name.startswith("meshfast") else name


def phase_wrk(args, st: FloorStack, targets: dict[str, loadgen.Target], work_dir: Path) -> dict:
    servers = {s.name: s for s in st.servers()}
    runs = {}
    for name in targets:
        print(f"[floor] wrk -c{args.connections}: {name} ...", flush=True)
        # A target named after its server (rules_bench's two gateways) is measured on that server.
        server = servers.get(name) or servers[_server_of(name)]
        run = pb.run_wrk_target(args, work_dir, name, targets[name], st,
                                measure=cpu_meter(worker_pids(server)))
        cpu = run["worker_cpu"]
        run["worker_cpu_us_per_call"] = (round(cpu["total_cpu_s"] * 1e6 / run["wrk"]["requests"], 1)
                                         if run["wrk"]["requests"] else None)
        runs[name] = run
        st.check_alive()
    return {"connections": args.connections, "threads": args.threads, "duration_s": args.wrk_duration,
            "warmup_s": args.wrk_warmup, "runs": runs}


# ------------------------------------------------------------------------------------- verdicts


def summary(doc: dict) -> dict:
    """One row per target: the numbers of the table."""
    rows: dict[str, dict] = {}
    b2b = (doc.get("back_to_back") or {}).get("targets", {})
    opn = (doc.get("open_loop") or {}).get("targets", {})
    wrk = (doc.get("throughput") or {}).get("runs", {})
    for name in TARGETS:
        row: dict = {}
        for label, reps in (("b2b", b2b), ("open", opn)):
            rep = reps.get(name)
            if rep:
                row[f"{label}_p50_us"], row[f"{label}_p99_us"] = rep["total_us"].get("p50"), rep["total_us"].get("p99")
                row[f"{label}_added_p50_us"] = rep.get("added_us", {}).get("p50")
                row[f"{label}_added_p99_us"] = rep.get("added_us", {}).get("p99")
        if name in wrk:
            row["rps"] = wrk[name]["requests_per_s"]
            row["worker_cpu_us_per_call"] = wrk[name]["worker_cpu_us_per_call"]
        rows[name] = row
    return rows


def goals(rows: dict[str, dict]) -> dict:
    """The issue's goals for meshfast's two routes: met or not, and how far."""
    out: dict = {}
    py, comp = rows.get("py-aiohttp", {}).get("rps"), rows.get("compiled", {}).get("rps")
    for name in MESHFAST_TARGETS:
        r = rows.get(name, {})
        g: dict = {}
        if r.get("b2b_added_p50_us") is not None:
            g["added_p50_us"] = {"value": r["b2b_added_p50_us"], "goal": GOAL_ADDED_P50_US,
                                 "met": r["b2b_added_p50_us"] <= GOAL_ADDED_P50_US,
                                 "over_by_us": round(r["b2b_added_p50_us"] - GOAL_ADDED_P50_US, 1)}
            g["added_p99_us"] = {"value": r["b2b_added_p99_us"], "goal": GOAL_ADDED_P99_US,
                                 "met": r["b2b_added_p99_us"] <= GOAL_ADDED_P99_US,
                                 "over_by_us": round(r["b2b_added_p99_us"] - GOAL_ADDED_P99_US, 1),
                                 "p99_us": r["b2b_p99_us"]}
        if r.get("rps") and py and comp:
            g["rps_over_py_aiohttp"] = {"value": round(r["rps"] / py, 3), "goal": GOAL_RPS_OVER_PY,
                                        "met": r["rps"] / py >= GOAL_RPS_OVER_PY}
            g["rps_over_compiled"] = {"value": round(r["rps"] / comp, 3), "goal": GOAL_RPS_OVER_COMPILED,
                                      "met": r["rps"] / comp >= GOAL_RPS_OVER_COMPILED}
        cpu = r.get("worker_cpu_us_per_call")
        if cpu is not None:
            g["worker_cpu_us_per_call"] = {"value": cpu, "goal": GOAL_CPU_US, "met": cpu <= GOAL_CPU_US,
                                           "ratio": round(cpu / GOAL_CPU_US, 2)}
        out[name] = g
    return out


def problems_of(doc: dict) -> list[str]:
    problems = pb.problems_of(doc, ("back_to_back", "open_loop"))
    tel = doc.get("telemetry")
    if tel is not None and not tel.get("written"):
        problems.append(f"meshfast wrote no request rows: {tel}")
    return problems


# ------------------------------------------------------------------------------------------ table


_f = harness.format_number


def print_tables(doc: dict) -> None:
    rows = doc.get("summary") or {}
    if not rows:
        return
    rt = doc["config"]["runtime"]
    print(f"\nSide by side, {doc['config']['workers']} workers each, runtime {rt}; latency in us "
          f"(1 conn = back to back on one connection; {doc['config']['rate_rps']:g}/s = open loop); "
          f"added = target - direct")
    print(f"{'target':<16}{'1c p50':>8}{'+p50':>7}{'1c p99':>8}{'+p99':>8}  {'20/s p50':>9}{'+p50':>7}"
          f"{'20/s p99':>9}{'+p99':>8}  {'req/s':>8}{'cpu us':>8}")
    for name, r in rows.items():
        print(f"{name:<16}{_f(r.get('b2b_p50_us')):>8}{_f(r.get('b2b_added_p50_us')):>7}"
              f"{_f(r.get('b2b_p99_us')):>8}{_f(r.get('b2b_added_p99_us')):>8}  "
              f"{_f(r.get('open_p50_us')):>9}{_f(r.get('open_added_p50_us')):>7}{_f(r.get('open_p99_us')):>9}"
              f"{_f(r.get('open_added_p99_us')):>8}  {_f(r.get('rps')):>8}{_f(r.get('worker_cpu_us_per_call')):>8}")
    print("\nGoals (meshfast; reported, not enforced):")
    for name, g in (doc.get("goals") or {}).items():
        print(f"  {name}: " + "; ".join(f"{k} {v['value']} (goal {v['goal']:g}: {'met' if v['met'] else 'NOT met'})"
                                        for k, v in g.items()))
    tel = doc.get("telemetry")
    if tel:
        print(f"meshfast rows: {tel}")
    for label in ("back_to_back", "open_loop"):
        cpu = (doc.get(label) or {}).get("cpu")
        if cpu:
            pb._print_cpu(label, cpu)
    others = [c["other_busy_pct"] or 0 for c in [*(r["cpu"] for r in (doc.get("throughput") or {}).get(
        "runs", {}).values())]]
    if doc.get("background_cpu_busy_pct") is not None:
        print(f"background cpu before the run: {doc['background_cpu_busy_pct']}%"
              + (f"; other processes during wrk: up to {max(others):.0f}%" if others else ""))


def runtime_label(doc: dict) -> str:
    rt, cfg = doc["config"]["runtime"], doc["config"]
    parts = [rt["loop"].split()[0], rt["task_impl"].split()[0], rt["runtime_mode"].split()[0]]
    return "/".join(parts) + f" w{cfg['workers']}"


def print_compare(paths: list[Path]) -> None:
    """One line per run (`make bench-runtimes`): meshfast and the baselines under each runtime."""
    cols = ("py-aiohttp", "py-native", "py-offloop", "rs-offloop", "hello", "meshfast-chat",
           "meshfast-proxy")
    print("added p50 / p99 at one connection (us), req/s at wrk -c64, worker CPU per call (us); "
          "other% = busiest wrk phase's CPU share used outside the bench")
    print(f"{'runtime':<24}{'other%':>7}  " + "".join(f"{c:>26}" for c in cols) + f"{'compiled':>22}")
    for path in paths:
        doc = json.loads(path.read_text())
        rows = doc.get("summary") or {}
        others = [r["cpu"]["other_busy_pct"] or 0 for r in (doc.get("throughput") or {}).get("runs", {}).values()]
        cells = []
        for c in (*cols, "compiled"):
            r = rows.get(c, {})
            cells.append(f"{_f(r.get('b2b_added_p50_us'))}/{_f(r.get('b2b_added_p99_us'))} "
                         f"{_f(r.get('rps'))} {_f(r.get('worker_cpu_us_per_call'))}")
        print(f"{runtime_label(doc):<24}{_f(max(others) if others else None):>7}  "
              + "".join(f"{c:>26}" for c in cells[:-1]) + f"{cells[-1]:>22}" + ("" if doc.get("ok") else "  FAILED"))
        loop = doc["config"]["runtime"]["loop"]
        mapped = [m for pids in (doc.get("loops_mapped") or {}).values() for m in pids.values()]
        check = ("" if loop not in ("uvloop", "rloop") else
                 f"  {loop} loaded in all {len(mapped)} Python workers" if mapped and all(loop in m for m in mapped)
                 else f"  {loop} NOT loaded in every Python worker")
        print(f"{'':<24}{'':>7}  {path.name}{check}")


# ------------------------------------------------------------------------------------------- main


def provenance(args) -> dict:
    prov = pb.provenance(args)
    _, nginx = harness.cmd_output(["nginx", "-v"])
    prov["versions"]["nginx"] = nginx.strip() or None
    for dist in ("uvloop", "rloop"):
        prov["versions"][dist] = _loop_version(dist) if args.loop in (dist, None) else None
    rc, sha = harness.cmd_output(["sha256sum", str(args.forwarder_rs)])
    prov["forwarder_rs"] = {"path": str(args.forwarder_rs), "sha256": sha.split()[0] if rc == 0 else None}
    return prov


def _loop_version(dist: str) -> str | None:
    if dist == "uvloop":
        import importlib.metadata

        try:
            return importlib.metadata.version("uvloop")
        except importlib.metadata.PackageNotFoundError:
            return None
    found = sorted(LOOPS_DIR.glob(f"{dist}-*.dist-info"))
    return found[-1].name.removeprefix(f"{dist}-").removesuffix(".dist-info") if found else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="workers of every gateway (compiled: Tokio threads)")
    p.add_argument("--upstream-workers", type=int, default=1, help="nginx worker processes")
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop", "rloop"),
                   help="Granian event loop for every Granian server (default: Granian's, auto)")
    p.add_argument("--task-impl", choices=("asyncio", "rust"), help="Granian task implementation (default asyncio)")
    p.add_argument("--runtime-mode", choices=("auto", "st", "mt"), help="Granian runtime mode (default auto)")
    p.add_argument("--b2b-duration", type=float, default=3.0, help="back-to-back seconds per target per round")
    p.add_argument("--b2b-rounds", type=int, default=3, help="back-to-back rounds (targets alternate)")
    p.add_argument("--duration", type=float, default=15.0, help="open-loop seconds per target")
    p.add_argument("--rate", type=float, default=20.0, help="open-loop requests/s")
    p.add_argument("--connections", type=int, default=64, help="wrk connections")
    p.add_argument("--threads", type=int, default=1, help="wrk threads")
    p.add_argument("--wrk-duration", type=int, default=10, help="measured wrk seconds per target")
    p.add_argument("--wrk-warmup", type=int, default=2, help="wrk seconds before each, kept apart")
    p.add_argument("--quick", action="store_true", help="smoke check (~1.5 min): 1 x 1.5 s, 3 s, wrk 1 + 3 s")
    p.add_argument("--no-meshfast", action="store_true",
                   help="the baselines only (a runtime meshfast cannot start on, e.g. --loop rloop)")
    p.add_argument("--forwarder-rs", type=Path, default=FORWARDER_RS, help="the compiled forwarder's binary")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(fallback=False),
                   help="command that takes `serve ...` (meshfast is imported from the working tree)")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/floor-<timestamp>.json)")
    p.add_argument("--compare", type=Path, nargs="+", metavar="JSON",
                   help="run nothing: print these results side by side, one line per runtime")
    args = p.parse_args(argv)
    if args.quick:
        args.b2b_rounds, args.b2b_duration, args.duration, args.wrk_duration, args.wrk_warmup = 1, 1.5, 3.0, 3, 1
    args.only = None  # models_bench.provenance() reads it
    return args


def check_tools(args) -> list[str]:
    missing = [f"{tool} missing: apt-get install -y {tool}" for tool in ("wrk", "nginx") if not shutil.which(tool)]
    if not args.forwarder_rs.exists():
        missing.append(f"{args.forwarder_rs} missing: make bench-forwarder")
    if not (OFFLOOP_DIR / "offloop_rs.abi3.so").exists():
        missing.append(f"{OFFLOOP_DIR / 'offloop_rs.abi3.so'} missing: make bench-offloop")
    if args.loop in ("uvloop", "rloop") and not _loop_version(args.loop):
        missing.append(f"{args.loop} missing in {LOOPS_DIR}: make bench-loops")
    return missing


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compare:
        print_compare(args.compare)
        return 0
    missing = check_tools(args)
    if missing:
        print("[floor] " + "\n[floor] ".join(missing), file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.UTC)
    rt = {"loop": args.loop or "default (uvloop; Granian auto)", "task_impl": args.task_impl or "asyncio (default)",
          "runtime_mode": args.runtime_mode or "auto (default)"}
    tag = "-".join(v for v in (args.loop, args.task_impl, args.runtime_mode) if v)
    out_path = args.out or RESULTS_DIR / f"floor-{started.strftime('%Y%m%dT%H%M%SZ')}{'-' + tag if tag else ''}.json"
    doc: dict = {
        "benchmark": "floor",
        "description": ("direct upstream vs compiled forwarder vs Python forwarders vs Granian hello world vs "
                        "governed meshfast (chat, non-streamed; /v1/proxy SSE -> NDJSON), one upstream (nginx)"),
        **harness.run_header(argv, started, provenance(args)),
        "config": {
            "workers": args.workers, "upstream_workers": args.upstream_workers, "runtime": rt,
            "b2b": {"rounds": args.b2b_rounds, "duration_s": args.b2b_duration},
            "rate_rps": args.rate, "duration_s_per_target": args.duration,
            "wrk": {"connections": args.connections, "threads": args.threads, "duration_s": args.wrk_duration,
                    "warmup_s": args.wrk_warmup, "timeout": harness.WRK_TIMEOUT},
            "quick": args.quick, "no_meshfast": args.no_meshfast, "policy": POLICY,
            "goals": {"added_p50_us": GOAL_ADDED_P50_US, "added_p99_us": GOAL_ADDED_P99_US,
                      "rps_over_py_aiohttp": GOAL_RPS_OVER_PY, "rps_over_compiled": GOAL_RPS_OVER_COMPILED,
                      "worker_cpu_us_per_call": GOAL_CPU_US},
            "upstream_body": SSE_STREAM.decode(),
        },
        "note": NOTE,
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
    }
    failures: list[str] = []
    stack: FloorStack | None = None
    with tempfile.TemporaryDirectory(prefix="meshfast-floor-bench-") as work:
        work_dir = Path(work)
        try:
            print(f"[floor] starting nginx, the forwarders, hello, meshfast (runtime {rt}) ...", flush=True)
            stack = start_stack(args, work_dir)
            doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, stack.secrets())) for s in stack.servers()}
            doc["worker_pids"] = {s.name: worker_pids(s) for s in stack.servers()}
            doc["setup"] = stack.setup
            targets = build_targets(stack)
            print(f"[floor] one connection, back to back: {args.b2b_rounds} x {args.b2b_duration:g} s x "
                  f"{len(targets)} ...", flush=True)
            doc["back_to_back"] = phase_back_to_back(args, stack, targets)
            print(f"[floor] open loop: {len(targets)} x {args.duration:g} s at {args.rate:g} req/s ...", flush=True)
            doc["open_loop"] = phase_open(args, stack, targets)
            doc["throughput"] = phase_wrk(args, stack, targets, work_dir)
            doc["loops_mapped"] = {name: loops_mapped(pids) for name, pids in doc["worker_pids"].items()
                                   if name not in ("upstream", "compiled")}
            if stack.meshfast is not None:
                doc["telemetry"] = pb.settled_telemetry(stack.meshfast_url, stack.admin_token)
        except BenchError as exc:
            failures.append(str(exc))
            print(f"[floor] FAILED: {exc}", file=sys.stderr)
        except (KeyboardInterrupt, subprocess.TimeoutExpired) as exc:
            failures.append(f"interrupted: {exc!r}")
        finally:
            if stack is not None:
                stack.stop_into(doc)
    failures += problems_of(doc)
    doc["summary"] = summary(doc)
    doc["goals"] = goals(doc["summary"])
    return harness.finish(doc, failures, started, out_path, "floor", print_tables)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
