"""Latency against request payload size (the Mesh write-up's Figure 4c) for meshfast's `POST /v1/proxy`.

One run starts testserve (1 worker) and `meshfast serve --workers N` (provisioned as `proxy_bench.py`
does) and, for each size in `--sizes` (default 1 KB, 10 KB, 100 KB, 1 MB, 5 MB of text in `query`),
sends `--count` sequential requests at `--rate` req/s, alternating meshfast (`b-anthropic`) and a
direct call to testserve's Anthropic route with the body meshfast renders for that query (the
bare forwarder's renderer, which `proxy_bench.py` checks byte for byte against meshfast's). Reports
p50/p99 of time to first body byte and to last byte per size and target, and the added latency.

Writes bench/results/payload-<timestamp>.json.

    python bench/payload_bench.py [--sizes 1000,10000,100000,1000000,5000000] [--count 20] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
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
from bench.forwarder_app import render  # noqa: E402
from bench.harness import BenchError  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "


def query_of(size: int) -> str:
    return (WORDS * (size // len(WORDS) + 1))[:size]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers for meshfast")
    p.add_argument("--sizes", type=lambda s: tuple(int(x) for x in s.split(",")),
                   default=(1_000, 10_000, 100_000, 1_000_000, 5_000_000), help="query sizes in bytes")
    p.add_argument("--count", type=int, default=20, help="requests per size and target")
    p.add_argument("--rate", type=float, default=5.0, help="requests/s (sequential)")
    p.add_argument("--quick", action="store_true", help="5 requests per size")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd())
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/payload-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.count = min(args.count, 5)
    args.only, args.meshfast_client = None, "native"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"payload-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    doc: dict = {
        "benchmark": "payload",
        "description": "POST /v1/proxy latency against the size of the query, meshfast vs direct to testserve",
        **harness.run_header(argv, started, pb.provenance(args)),
        "config": {"workers": args.workers, "sizes_bytes": list(args.sizes), "count": args.count,
                   "rate_rps": args.rate, "quick": args.quick},
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
        "sizes": [],
    }
    failures: list[str] = []
    stack: pb.Stack | None = None
    with tempfile.TemporaryDirectory(prefix="meshfast-payload-") as work:
        try:
            print("[payload] starting testserve, meshfast ...", flush=True)
            stack = pb.start_stack(args, Path(work), forwarder=False)
            doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, stack.secrets())) for s in stack.servers()}
            auth = {"authorization": f"Bearer {stack.user_key}", "content-type": "application/json"}
            direct_headers = {"content-type": "application/json", "x-api-key": pb.TESTSERVE_KEY,
                              "anthropic-version": "2023-06-01"}
            for size in args.sizes:
                q = query_of(size)
                body = json.dumps({"query": q, "max_tokens": 64}, separators=(",", ":")).encode()
                mesh = loadgen.Target.post("meshfast", f"{stack.meshfast_url}/v1/proxy?model=b-anthropic", auth,
                                           body, pb.NDJSON_END)
                direct = loadgen.Target.post("direct", f"{stack.testserve_url}/anthropic/v1/messages",
                                             direct_headers, render(b"dummy-chat", q, 64), pb.SSE_END["anthropic"])
                print(f"[payload] {size:,} B x {args.count} ...", flush=True)
                meter = pb.CpuMeter(stack.groups)
                series = loadgen.sequential([direct, mesh], args.count, warmup_requests=2,
                                            pause_s=1 / args.rate / 2)
                cpu = meter.stop()
                stack.check_alive()
                reps = {s.target: s.report(raw=False) for s in series}
                for name, r in reps.items():
                    if r["error_count"]:
                        failures.append(f"{size} B {name}: {r['error_count']} errors, e.g. {r['errors'][:2]}")
                added = {p: round(reps["meshfast"]["total_us"][p] - reps["direct"]["total_us"][p], 1)
                         for p in ("p50", "p99") if p in reps["meshfast"]["total_us"] and p in reps["direct"]["total_us"]}
                doc["sizes"].append({"query_bytes": size, "request_bytes": len(body), "cpu": cpu, "targets": reps,
                                     "added_us": added})
        except BenchError as exc:
            failures.append(str(exc))
            print(f"[payload] FAILED: {exc}", file=sys.stderr)
        except KeyboardInterrupt:
            failures.append("interrupted")
        finally:
            if stack is not None:
                stack.stop_into(doc)
    return harness.finish(doc, failures, started, out_path, "payload", print_sizes)


def print_sizes(doc: dict) -> None:
    for s in doc["sizes"]:
        t = s["targets"]
        print(f"[payload] {s['query_bytes']:>9,} B: direct p50 {t['direct']['total_us'].get('p50', 0) / 1000:.2f} ms, "
              f"meshfast p50 {t['meshfast']['total_us'].get('p50', 0) / 1000:.2f} ms "
              f"(+{s['added_us'].get('p50', 0) / 1000:.2f} ms)")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
