"""meshfast against other gateways, side by side: LiteLLM proxy (1 and 2 workers) and Portkey gateway.

Every gateway gets the same OpenAI Chat Completions request (`POST /v1/chat/completions`, streamed,
`max_tokens` 64) and forwards it to the same testserve (1 worker) OpenAI route; "direct" is that
request sent to testserve itself. One run starts, on 127.0.0.1, testserve, `meshfast serve --workers
N` (provisioned as `proxy_bench.py` does; model `b-openai`), LiteLLM (`litellm --config`, no
database: its database mode cannot start here, Prisma downloads engine binaries at start) and
Portkey (`node build/start-server.js --headless`, `x-portkey-custom-host` pointing at testserve),
each installed by `bench/baselines/install.py` into bench/baselines/ (never the main environment).
A baseline that is not installed is skipped and the JSON says why. Then:

1. latency at `--rate` req/s, open loop (`bench/loadgen.py`), targets in alternating 1 s slices:
   p50/p95/p99 of time to last byte and `added_us` = target - direct;
2. max requests/s with wrk (`--connections`, `--threads`, `--wrk-duration`), each target in turn.

Each phase records the CPU split (every server by session, meshfast's PostgreSQL, the client).
Writes bench/results/baselines-<timestamp>.json.

    python bench/baseline_bench.py [--workers 2] [--duration 20] [--rate 20] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, loadgen  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402
from bench.baselines import install  # noqa: E402
from bench.harness import BenchError, Server  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
LITELLM_MASTER_KEY = "sk-bench-litellm-0000"
CHAT_END = b"[DONE]"
READY_TIMEOUT_S = 90.0


def chat_body(model: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 64,
                       "stream": True}, separators=(",", ":")).encode()


def litellm_config(work_dir: Path, testserve_url: str) -> Path:
    path = work_dir / "litellm.yaml"
    path.write_text(
        "model_list:\n"
        "  - model_name: b-openai\n"
        "    litellm_params:\n"
        "      model: openai/dummy-chat\n"
        f"      api_base: {testserve_url}/openai/v1\n"
        f"      api_key: {pb.TESTSERVE_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_MASTER_KEY}\n")
    return path


def start_baselines(args, st: pb.Stack, work_dir: Path) -> tuple[list[Server], dict[str, loadgen.Target], dict]:
    servers: list[Server] = []
    targets: dict[str, loadgen.Target] = {}
    info: dict = {}
    wanted = set(args.baselines)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "VIRTUAL_ENV", "PYTHONPATH")}
    litellm = install.litellm_bin()
    for workers in args.litellm_workers:
        name = f"litellm-{workers}w"
        if "litellm" not in wanted:
            continue
        if litellm is None:
            info[name] = {"skipped": install.why_missing("litellm")}
            continue
        port = harness.free_port()
        cfg = litellm_config(work_dir, st.testserve_url)
        s = Server(name, [str(litellm), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
                          "--num_workers", str(workers)],
                   dict(env, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False",
                        DISABLE_SCHEMA_UPDATE="True"), work_dir / f"{name}.log")
        servers.append(s)
        url = f"http://127.0.0.1:{port}"
        targets[name] = loadgen.Target.post(
            name, f"{url}/v1/chat/completions",
            {"authorization": f"Bearer {LITELLM_MASTER_KEY}", "content-type": "application/json"},
            chat_body("b-openai"), CHAT_END)
        info[name] = {"version": install.litellm_version(), "workers": workers, "url": url,
                      "ready": lambda u=url: harness.http_request("GET", u + "/health/liveliness", timeout_s=2.0)[0] == 200}
    if "portkey" in wanted:
        node_entry = install.portkey_entry()
        if node_entry is None:
            info["portkey"] = {"skipped": install.why_missing("portkey")}
        else:
            port = harness.free_port()
            s = Server("portkey", ["node", str(node_entry), f"--port={port}", "--headless"],
                       dict(env, NODE_ENV="production"), work_dir / "portkey.log")
            servers.append(s)
            url = f"http://127.0.0.1:{port}"
            targets["portkey"] = loadgen.Target.post(
                "portkey", f"{url}/v1/chat/completions",
                {"authorization": f"Bearer {pb.TESTSERVE_KEY}", "content-type": "application/json",
                 "x-portkey-provider": "openai", "x-portkey-custom-host": f"{st.testserve_url}/openai/v1"},
                chat_body("dummy-chat"), CHAT_END)
            info["portkey"] = {"versions": install.portkey_versions(), "workers": 1, "url": url,
                               "ready": lambda u=url: harness.http_request("GET", u + "/", timeout_s=2.0)[0] < 500}
    for s in servers:
        s.start()
        st.groups.sessions[s.name] = s.proc.pid
    for s in servers:
        ready = info[s.name].pop("ready")
        try:
            info[s.name]["ready_s"] = harness.wait_until(ready, READY_TIMEOUT_S, s, "ready")
            pb._exchange_once(targets[s.name])
        except BenchError as exc:
            info[s.name]["failed"] = str(exc)[:2000]
            targets.pop(s.name, None)
    return servers, targets, info


def phase_latency(args, st: pb.Stack, targets: dict[str, loadgen.Target]) -> dict:
    chosen = list(targets.values())
    meter = pb.CpuMeter(st.groups)
    series = loadgen.open_loop(chosen, args.rate, args.duration, slice_s=1.0,
                               deadline_s=2 * len(chosen) * args.duration + 60)
    cpu = meter.stop()
    reports = {s.target: s.report() for s in series}
    direct = reports["direct-openai-chat"]
    for name, rep in reports.items():
        if name != "direct-openai-chat":
            rep["added_us"] = {p: round(rep["total_us"][p] - direct["total_us"][p], 1)
                               for p in ("p50", "p90", "p95", "p99")
                               if p in rep["total_us"] and p in direct["total_us"]}
    return {"rate_rps": args.rate, "duration_s_per_target": args.duration, "slice_s": 1.0,
            "order": [t.name for t in chosen], "cpu": cpu, "targets": reports}


def phase_throughput(args, st: pb.Stack, targets: dict[str, loadgen.Target], work_dir: Path) -> dict:
    runs = {}
    for name, target in targets.items():
        print(f"[baselines] wrk: {name} ...", flush=True)
        try:
            runs[name] = pb.run_wrk_target(args, work_dir, name, target, st)
        except BenchError as exc:
            runs[name] = {"target": name, "failure": str(exc)[:2000]}
    mf = runs.get("meshfast-openai-chat", {}).get("requests_per_s")
    ratios = {f"meshfast_over_{n}": round(mf / r["requests_per_s"], 4)
              for n, r in runs.items() if mf and r.get("requests_per_s") and n != "meshfast-openai-chat"}
    return {"connections": args.connections, "threads": args.threads, "duration_s": args.wrk_duration,
            "warmup_s": args.wrk_warmup, "runs": runs, "ratios_rps": ratios}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers for meshfast")
    p.add_argument("--litellm-workers", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 2))
    p.add_argument("--baselines", type=lambda s: tuple(s.split(",")), default=("litellm", "portkey"))
    p.add_argument("--duration", type=float, default=20.0, help="latency seconds per target")
    p.add_argument("--rate", type=float, default=20.0, help="latency requests/s per target")
    p.add_argument("--connections", type=int, default=32, help="wrk connections")
    p.add_argument("--threads", type=int, default=1, help="wrk threads")
    p.add_argument("--wrk-duration", type=int, default=10, help="measured wrk seconds per target")
    p.add_argument("--wrk-warmup", type=int, default=2, help="wrk seconds before each, kept apart (0: none)")
    p.add_argument("--quick", action="store_true", help="smoke check (3 s per target, 3 s wrk, LiteLLM 1 worker)")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd())
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/baselines-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.wrk_duration, args.wrk_warmup = 3.0, 3, 1
        args.litellm_workers = args.litellm_workers[:1]
    args.only, args.meshfast_client = None, "native"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"baselines-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    doc: dict = {
        "benchmark": "baselines",
        "description": ("POST /v1/chat/completions (streamed) through meshfast, LiteLLM proxy and Portkey "
                        "gateway vs direct to testserve: added latency at a fixed rate, max requests/s"),
        **harness.run_header(argv, started, pb.provenance(args)),
        "config": {"workers": args.workers, "litellm_workers": list(args.litellm_workers),
                   "baselines": list(args.baselines), "rate_rps": args.rate, "duration_s_per_target": args.duration,
                   "wrk": {"connections": args.connections, "threads": args.threads,
                           "duration_s": args.wrk_duration, "warmup_s": args.wrk_warmup},
                   "quick": args.quick, "request_body": chat_body("<model>").decode()},
        "note": pb.NOTE.format(slice_s=1.0),
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
    }
    failures: list[str] = []
    stack: pb.Stack | None = None
    extra: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="meshfast-baselines-") as work:
        work_dir = Path(work)
        try:
            print("[baselines] starting testserve, meshfast ...", flush=True)
            stack = pb.start_stack(args, work_dir, forwarder=False)
            auth = {"authorization": f"Bearer {stack.user_key}", "content-type": "application/json"}
            targets = {
                "direct-openai-chat": loadgen.Target.post(
                    "direct-openai-chat", f"{stack.testserve_url}/openai/v1/chat/completions",
                    {"authorization": f"Bearer {pb.TESTSERVE_KEY}", "content-type": "application/json"},
                    chat_body("dummy-chat"), CHAT_END),
                "meshfast-openai-chat": loadgen.Target.post(
                    "meshfast-openai-chat", f"{stack.meshfast_url}/v1/chat/completions", auth,
                    chat_body("b-openai"), CHAT_END),
            }
            for t in targets.values():
                pb._exchange_once(t)
            print("[baselines] starting the baselines ...", flush=True)
            extra, more, doc["baselines"] = start_baselines(args, stack, work_dir)
            targets.update(more)
            for name, b in doc["baselines"].items():
                if "skipped" in b or "failed" in b:
                    print(f"[baselines] {name}: {b.get('skipped') or b.get('failed')[:300]}", flush=True)
            doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, stack.secrets()))
                              for s in [*stack.servers(), *extra]}
            doc["setup"] = stack.setup
            print(f"[baselines] latency: {len(targets)} targets x {args.duration:g} s at {args.rate:g} req/s ...",
                  flush=True)
            doc["latency"] = phase_latency(args, stack, targets)
            doc["throughput"] = phase_throughput(args, stack, targets, work_dir)
        except BenchError as exc:
            failures.append(str(exc))
            print(f"[baselines] FAILED: {exc}", file=sys.stderr)
        except KeyboardInterrupt:
            failures.append("interrupted")
        finally:
            stops = {}
            for s in extra:
                doc.setdefault("server_log_tails", {})[s.name] = s.log_tail(3000)
                stops[s.name] = s.stop()
            if stack is not None:
                stops.update(stack.stop())
            doc["stop"] = stops
    for name, rep in (doc.get("latency") or {}).get("targets", {}).items():
        if rep["error_count"]:
            failures.append(f"latency {name}: {rep['error_count']} errors, e.g. {rep['errors'][:2]}")
    doc["failures"] = failures
    doc["ok"] = not failures
    doc["total_s"] = round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    lat = doc.get("latency") or {}
    tp = (doc.get("throughput") or {}).get("runs", {})
    print(f"\n{'target':<24}{'p50 us':>9}{'p99 us':>9}{'+p50':>8}{'+p99':>8}{'req/s':>9}")
    for name, r in lat.get("targets", {}).items():
        a = r.get("added_us", {})
        print(f"{name:<24}{r['total_us'].get('p50', 0):>9.0f}{r['total_us'].get('p99', 0):>9.0f}"
              f"{a.get('p50', 0):>8.0f}{a.get('p99', 0):>8.0f}{tp.get(name, {}).get('requests_per_s', 0):>9.0f}")
    if failures:
        print("\n[baselines] failures:\n  " + "\n  ".join(f[:500] for f in failures), file=sys.stderr)
    print(f"\n[baselines] wrote {out_path} in {doc['total_s']:.0f} s" + ("" if doc["ok"] else " (FAILED run)"))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
