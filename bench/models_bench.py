"""Throughput and latency of meshfast's `GET /v1/models` against a Granian hello-world ceiling.

Both targets run under Granian's RSGI interface with the same worker count and are driven by the same
wrk command, alternating (hello, meshfast) for `--rounds`. The result is one raw JSON file with the
provenance STYLE.md asks for; the table on stdout is a convenience, the JSON is the record.

    python bench/models_bench.py [--workers 2] [--duration 10] [--connections 32] [--threads 1]
                                 [--rounds 1] [--only hello|meshfast] [--out PATH]

Run it from anywhere; servers are started from the repository root so `bench.hello_app` imports.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import secrets
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    BUSY_WARN_PCT,
    WRK_TIMEOUT,
    BenchError,
    Server,
    admin_create,
    cpu_busy_pct,
    free_port,
    http_request,
    provenance,
    redact,
    run_header,
    run_wrk,
    stop_processes_mentioning,
    wait_until,
    wrk_argv,
)

RESULTS_DIR = ROOT / "bench" / "results"

MODEL_COUNT = 5
RATIO_TARGET = 0.80
HELLO_READY_TIMEOUT_S = 30.0
# NOTE: the first start initialises an embedded PostgreSQL cluster in the fresh data dir.
MESHFAST_READY_TIMEOUT_S = 60.0
# API.md promises admin writes reach every worker within 1 s; the margin absorbs a loaded 2-core box.
CONFIG_PROPAGATION_TIMEOUT_S = 30.0

NOTE = (
    "wrk and the server under test share the same CPUs (no pinning): every request/s figure is for "
    "server + load generator together on this machine, so absolute numbers understate a server with "
    "dedicated cores; the meshfast/hello ratio is the comparable figure. wrk runs with --threads {threads}."
)


# ---------------------------------------------------------------------------------------- targets


@dataclass
class Live:
    """A started target: where to send requests, and what to clean up."""

    server: Server
    url: str
    headers: dict[str, str]
    secrets: list[str]
    setup: dict = field(default_factory=dict)
    temp_dir: str | None = None


def start_hello(args, work_dir: Path) -> Live:
    port = free_port()
    argv = [
        sys.executable, "-m", "granian",
        "--interface", "rsgi",
        "--workers", str(args.workers),
        "--host", "127.0.0.1",
        "--port", str(port),
        "bench.hello_app:app",
    ]
    server = Server("hello", argv, dict(os.environ), work_dir / f"hello-{port}.log")
    server.start()
    url = f"http://127.0.0.1:{port}/v1/models"
    live = Live(server, url, {}, [])

    def ready() -> bool:
        status, _, _ = http_request("GET", url, timeout_s=2.0)
        return status == 200

    live.setup["ready_s"] = wait_until(ready, HELLO_READY_TIMEOUT_S, server, "GET / == 200")
    return live


def start_meshfast(args, work_dir: Path) -> Live:
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="meshfast-bench-")
    admin_token = secrets.token_urlsafe(32)
    env = dict(os.environ)
    env["MESHFAST_DATA_DIR"] = data_dir
    env["MESHFAST_ADMIN_TOKEN"] = admin_token
    # NOTE: the bench measures the embedded-database setup a fresh install gets.
    env.pop("DATABASE_URL", None)
    argv = shlex.split(args.meshfast_cmd) + [
        "serve",
        "--workers", str(args.workers),
        "--host", "127.0.0.1",
        "--port", str(port),
    ]
    server = Server("meshfast", argv, env, work_dir / f"meshfast-{port}.log")
    base = f"http://127.0.0.1:{port}"
    live = Live(server, base + "/v1/models", {}, [admin_token], temp_dir=data_dir)
    server.start()
    try:
        live.setup["ready_s"] = wait_until(
            lambda: http_request("GET", base + "/readyz", timeout_s=2.0)[0] == 200,
            MESHFAST_READY_TIMEOUT_S, server, "GET /readyz == 200",
        )
        t0 = time.monotonic()
        provider = admin_create(base, admin_token, "/admin/providers", {
            "name": "bench-openai",
            "family": "openai",
            "base_url": "http://127.0.0.1:9/openai",
            "api_key": "sk-bench",
            "local": True,
            "verify": False,
        })
        model_ids = []
        for i in range(MODEL_COUNT):
            model = admin_create(base, admin_token, "/admin/models", {
                "provider_id": provider["id"],
                "name": f"bench-model-{i}",
                "resolved_model": "gpt-x",
                "kind": "chat",
                "input_price_per_1k_tokens": "0.001",
                "output_price_per_1k_tokens": "0.002",
                "verify": False,
            })
            model_ids.append(model["id"])
        user = admin_create(base, admin_token, "/admin/users", {
            "email": "bench@example.com", "display_name": "Bench",
        })
        for model_id in model_ids:
            status, _, raw = http_request(
                "POST", base + "/admin/access", {"authorization": f"Bearer {admin_token}"},
                {"user_id": user["id"], "model_id": model_id}, timeout_s=30.0,
            )
            if status not in (200, 201, 204):
                raise BenchError(f"POST /admin/access answered {status}: {raw[:500]!r}")
        live.setup["provision_s"] = round(time.monotonic() - t0, 3)
        key = user["key"]
        live.headers = {"Authorization": f"Bearer {key}"}
        live.secrets.append(key)

        # Each check is a new connection, which any worker may accept: the change has reached
        # every worker once many checks in a row see it (one could come from a worker ahead).
        def lists_all_models() -> bool:
            for _ in range(8 * args.workers):
                status, _, raw = http_request("GET", live.url, live.headers, timeout_s=2.0)
                if status != 200 or _model_count(raw) != MODEL_COUNT:
                    return False
            return True

        live.setup["propagation_s"] = wait_until(
            lists_all_models, CONFIG_PROPAGATION_TIMEOUT_S, server,
            f"GET /v1/models listing {MODEL_COUNT} models",
        )
    except BaseException:
        cleanup_meshfast(live)
        raise
    return live


def _model_count(raw: bytes) -> int:
    doc = json.loads(raw)
    data = doc.get("data") if isinstance(doc, dict) else doc
    return len(data) if isinstance(data, list) else -1


def cleanup_meshfast(live: Live) -> dict:
    report = live.server.stop()
    if live.temp_dir:
        leftovers = stop_processes_mentioning(live.temp_dir)
        if leftovers:
            report["leftover_pids_stopped"] = leftovers
        shutil.rmtree(live.temp_dir, ignore_errors=True)
        report["data_dir_removed"] = not os.path.exists(live.temp_dir)
    return report


# --------------------------------------------------------------------------------------- one run


def check_exact_200(live: Live) -> dict:
    """One request outside wrk: wrk only counts >399 as errors, so check the answer is exactly 200."""
    status, headers, body = http_request("GET", live.url, live.headers, timeout_s=5.0)
    if status != 200:
        raise BenchError(f"{live.server.name}: GET {live.url} answered {status}: {body[:300]!r}")
    return {
        "status": status,
        "body_bytes": len(body),
        "content_type": headers.get("content-type") or headers.get("Content-Type"),
        "model_count": _model_count(body),
    }


def bench_once(args, target: str, round_no: int, work_dir: Path) -> dict:
    """Start, check, load, check again, stop. Never raises BenchError: the run records its failure."""
    # NOTE: sampled before the server starts; anything busy here competes with wrk and the server.
    run: dict = {"target": target, "round": round_no, "background_cpu_busy_pct": cpu_busy_pct()}
    t_start = time.monotonic()
    try:
        live = start_hello(args, work_dir) if target == "hello" else start_meshfast(args, work_dir)
    except BenchError as exc:
        run["failure"] = str(exc)
        return run
    try:
        run["server_command"] = shlex.join(redact(live.server.argv, live.secrets))
        run["url"] = live.url
        run["setup"] = live.setup
        run["preflight"] = check_exact_200(live)
        if args.warmup > 0:
            warm = run_wrk(wrk_argv(args, live.url, live.headers, args.warmup), args.warmup)
            warm.pop("stdout", None)
            run["warmup"] = warm
        argv = wrk_argv(args, live.url, live.headers, args.duration)
        run["wrk_command"] = shlex.join(redact(argv, live.secrets))
        result = run_wrk(argv, args.duration)
        run["wrk_stdout"] = result.pop("stdout")
        run["wrk"] = result
        run["postflight"] = check_exact_200(live)
    except BenchError as exc:
        run["failure"] = str(exc)
    finally:
        run["stop"] = cleanup_meshfast(live) if target == "meshfast" else live.server.stop()
        run["server_log_tail"] = live.server.log_tail(2000)
    wrk = run.get("wrk")
    if wrk is None:
        return run
    seconds = wrk["duration_us"] / 1e6
    run["requests_per_s"] = round(wrk["requests"] / seconds, 1) if seconds > 0 else 0.0
    run["latency_p50_ms"] = wrk["latency_us"]["p50"] / 1000
    run["latency_p99_ms"] = wrk["latency_us"]["p99"] / 1000
    run["errors_total"] = sum(wrk["errors"].values())
    run["wall_s"] = round(time.monotonic() - t_start, 3)
    return run


def validate(run: dict) -> list[str]:
    """Non-2xx fails the run (as do an empty run and a wrong model count); socket errors are reported."""
    problems = [run["failure"]] if run.get("failure") else []
    wrk = run.get("wrk")
    if wrk is None:
        return problems or [f"{run['target']} round {run['round']}: no wrk result"]
    if not wrk.get("requests"):
        problems.append(f"{run['target']} round {run['round']}: wrk completed no requests")
    if wrk.get("errors", {}).get("status"):
        problems.append(
            f"{run['target']} round {run['round']}: {wrk['errors']['status']} non-2xx responses"
        )
    if run["target"] == "meshfast":
        for phase in ("preflight", "postflight"):
            count = run[phase]["model_count"] if phase in run else MODEL_COUNT  # missing: in failure
            if count != MODEL_COUNT:
                problems.append(f"meshfast {phase}: /v1/models listed {count} models, not {MODEL_COUNT}")
    return problems


# ------------------------------------------------------------------------------------------- main


def summarize(runs: list[dict]) -> dict:
    summary = {}
    for target in ("hello", "meshfast"):
        mine = [r for r in runs if r["target"] == target and "requests_per_s" in r]
        if not mine:
            continue
        rps = [r["requests_per_s"] for r in mine]
        summary[target] = {
            "rounds": len(mine),
            "requests_per_s_mean": round(statistics.fmean(rps), 1),
            "requests_per_s_per_round": rps,
            "latency_p50_ms_median": statistics.median(r["latency_p50_ms"] for r in mine),
            "latency_p99_ms_median": statistics.median(r["latency_p99_ms"] for r in mine),
            "errors_total": sum(r["errors_total"] for r in mine),
            "response_body_bytes": mine[0]["preflight"]["body_bytes"],
        }
    return summary


def print_table(runs: list[dict], summary: dict, ratio: float | None) -> None:
    print(
        f"\n{'target':<10}{'round':>6}{'req/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}{'body B':>8}"
        f"{'bg cpu%':>9}"
    )
    busy = []
    for r in runs:
        if "requests_per_s" not in r:
            continue
        bg = r.get("background_cpu_busy_pct")
        busy.append(bg or 0.0)
        print(
            f"{r['target']:<10}{r['round']:>6}{r['requests_per_s']:>12.1f}{r['latency_p50_ms']:>10.3f}"
            f"{r['latency_p99_ms']:>10.3f}{r['errors_total']:>8}{r['preflight']['body_bytes']:>8}"
            f"{'-' if bg is None else f'{bg:.0f}':>9}"
        )
    if busy and max(busy) > BUSY_WARN_PCT:
        print(f"WARNING: other load used up to {max(busy):.0f}% of the CPUs before a run; numbers are noisy")
    if ratio is not None:
        verdict = "meets" if ratio >= RATIO_TARGET else "below"
        print(f"\nmeshfast/hello req/s ratio: {ratio:.3f} ({verdict} target >= {RATIO_TARGET:.2f})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers for both targets")
    # NOTE: whole seconds; wrk parses its duration as an integer with a unit.
    p.add_argument("--duration", type=int, default=10, help="measured wrk seconds per run")
    p.add_argument("--connections", type=int, default=32, help="wrk connections")
    p.add_argument("--threads", type=int, default=1, help="wrk threads")
    p.add_argument("--rounds", type=int, default=1, help="alternating (hello, meshfast) rounds")
    p.add_argument("--warmup", type=int, default=2, help="wrk seconds before each run, kept apart (0: none)")
    p.add_argument("--only", choices=("hello", "meshfast"), help="bench one target only")
    p.add_argument("--meshfast-cmd", default="meshfast", help="command that takes `serve ...`")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/models-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.connections < args.threads:
        p.error("--connections must be >= --threads (wrk gives each thread at least one connection)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out_path = args.out or RESULTS_DIR / f"models-{stamp}.json"
    targets = [args.only] if args.only else ["hello", "meshfast"]

    doc: dict = {
        "benchmark": "models",
        "description": (
            "GET /v1/models (5 granted models) on meshfast vs a fixed-body Granian RSGI hello-world"
        ),
        **run_header(argv, started, provenance(args)),
        "config": {
            "workers": args.workers,
            "connections": args.connections,
            "threads": args.threads,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "rounds": args.rounds,
            "targets": targets,
            "wrk_timeout": WRK_TIMEOUT,
            "model_count": MODEL_COUNT,
        },
        "note": NOTE.format(threads=args.threads),
        "error_policy": (
            "wrk counts status > 399 as errors.status; any such response, a run with zero requests, or a "
            "pre/post-flight GET that is not exactly 200 fails the run. Socket errors (connect, read, "
            "write, timeout) are reported in each run's wrk.errors."
        ),
        "runs": [],
    }
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="meshfast-bench-logs-") as work:
        try:
            for round_no in range(1, args.rounds + 1):
                for target in targets:
                    print(f"[bench] round {round_no}: {target} ...", flush=True)
                    run = bench_once(args, target, round_no, Path(work))
                    doc["runs"].append(run)
                    problems = validate(run)
                    failures += problems
                    if problems:
                        raise BenchError("; ".join(problems))
        except BenchError as exc:
            print(f"[bench] FAILED: {exc}", file=sys.stderr)
        except KeyboardInterrupt:
            failures.append("interrupted")

    summary = summarize(doc["runs"])
    ratio = None
    if "hello" in summary and "meshfast" in summary and summary["hello"]["requests_per_s_mean"] > 0:
        ratio = round(summary["meshfast"]["requests_per_s_mean"] / summary["hello"]["requests_per_s_mean"], 4)
    doc["summary"] = summary
    doc["ratio_meshfast_over_hello_rps"] = ratio
    doc["ratio_target"] = RATIO_TARGET
    doc["ratio_meets_target"] = None if ratio is None else ratio >= RATIO_TARGET
    doc["failures"] = failures
    doc["ok"] = not failures

    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    print_table(doc["runs"], summary, ratio)
    print(f"\n[bench] wrote {out_path}" + ("" if doc["ok"] else " (FAILED run)"))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
