"""Translation cost end to end: an OpenAI Chat caller on an OpenAI-family model (same wire format
both ways) versus on Anthropic- and Gemini-family models (request and stream translated through
the IR), against the same testserve.

Measures, in one run: time to first body byte and to last byte (sequential, alternating targets),
and max requests/s with wrk, streaming. Writes bench/results/translate-<timestamp>.json.

    python bench/translate_bench.py [--workers 2] [--count 200] [--wrk-duration 10]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, loadgen  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
BODY = b'{"model":"%s","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hello"}]}'
UPSTREAMS = {"openai": "same format", "anthropic": "translated", "gemini": "translated"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--count", type=int, default=200, help="sequential requests per target")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--wrk-duration", type=int, default=10)
    p.add_argument("--wrk-warmup", type=int, default=2)
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(fallback=False))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.quick:
        args.count, args.wrk_duration, args.wrk_warmup = 30, 3, 1
    args.only, args.meshfast_client = None, "native"
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    doc: dict = {"benchmark": "translate", **harness.run_header(argv, started, harness.provenance(args)),
                 "config": {"workers": args.workers, "count": args.count, "wrk_duration_s": args.wrk_duration,
                            "connections": args.connections}}
    with tempfile.TemporaryDirectory(prefix="meshfast-translate-bench-") as work:
        stack = pb.start_stack(args, Path(work), forwarder=False)
        try:
            auth = {"authorization": f"Bearer {stack.user_key}", "content-type": "application/json"}
            targets = {f"openai_chat->{family}": loadgen.Target.post(
                f"openai_chat->{family}", f"{stack.meshfast_url}/v1/chat/completions", auth,
                BODY % f"b-{family}".encode(), b"[DONE]") for family in UPSTREAMS}
            series = loadgen.sequential(list(targets.values()), args.count)
            reports = {s.target: s.report(raw=False) for s in series}
            base = reports["openai_chat->openai"]
            for name, rep in reports.items():
                rep["plan"] = UPSTREAMS[name.split("->")[1]]
                rep["ttfb_p50_minus_same_format_us"] = round(
                    rep["ttfb_body_us"]["p50"] - base["ttfb_body_us"]["p50"], 1)
                rep["total_p50_minus_same_format_us"] = round(rep["total_us"]["p50"] - base["total_us"]["p50"], 1)
            doc["latency"] = reports
            runs = {}
            for name, target in targets.items():
                print(f"[translate] wrk {name} ...", flush=True)
                run = pb.run_wrk_target(args, Path(work), name.replace(">", ""), target, stack)
                runs[name] = {"requests_per_s": run["requests_per_s"], "latency_p50_ms": run["latency_p50_ms"],
                              "latency_p99_ms": run["latency_p99_ms"], "errors": run["errors_total"],
                              "cpu": run["cpu"]}
            same = runs["openai_chat->openai"]["requests_per_s"]
            for run in runs.values():
                run["ratio_to_same_format"] = round(run["requests_per_s"] / same, 3) if same else None
            doc["throughput"] = runs
        finally:
            doc["stop"] = stack.stop()
    out = args.out or RESULTS_DIR / f"translate-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'target':<28}{'ttfb p50 us':>12}{'+ttfb':>8}{'last p50 us':>12}{'req/s':>9}{'ratio':>7}")
    for name, rep in doc["latency"].items():
        run = doc["throughput"][name]
        print(f"{name:<28}{rep['ttfb_body_us']['p50']:>12,.0f}{rep['ttfb_p50_minus_same_format_us']:>8,.0f}"
              f"{rep['total_us']['p50']:>12,.0f}{run['requests_per_s']:>9,.0f}{run['ratio_to_same_format']:>7}")
    print(f"[translate] wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
