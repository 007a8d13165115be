"""Tail latency at one connection: how often, and how long, meshfast's event loop stalls.

Starts testserve and `meshfast serve --workers N` (default 1) on 127.0.0.1 as `proxy_bench.py` does,
then, per route (a non-streamed `/v1/chat/completions` and `/v1/proxy`), sends calls back to back on
one keep-alive connection for `--duration` seconds and reports:

- p50/p90/p99/p99.9/max of time to last byte (us) and req/s;
- stalls: calls slower than `--stall-ms`, how many, and the median gap between them (in calls and
  seconds), i.e. whether they recur on a period;
- the worker's own view: the `meshfast_loop_lag_seconds` histogram (scraped from `/admin/metrics`
  before and after each route), how late its loop-lag probe woke up.

    python bench/tail_probe.py [--workers 1] [--duration 15] [--routes chat,proxy] [--rounds 2]
    python bench/tail_probe.py --env MESHFAST_LOOP_LAG_PROBE_MS=1   # finer lag sampling

The JSON goes to `bench/results/tail-<timestamp>.json` (provenance, per-route summaries, the lag
histograms, the slowest calls with their offsets in the run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, loadgen
from bench import proxy_bench as pb

RESULTS_DIR = ROOT / "bench" / "results"
ROUTES = {
    # A non-streamed chat completion, as the table measures it.
    "chat": ("/v1/chat/completions",
             b'{"model":"b-openai","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}', None),
    "proxy": ("/v1/proxy?model=b-anthropic", pb.PROXY_BODY, pb.NDJSON_END),
}
_LAG = re.compile(r'^meshfast_loop_lag_seconds_bucket\{le="([^"]+)"\} (\d+)$')


def lag_buckets(st: pb.Stack) -> dict[str, int]:
    """Cumulative loop-lag buckets (le -> count) from /admin/metrics; {} if the series is absent."""
    status, _, raw = harness.http_request("GET", st.meshfast_url + "/admin/metrics",
                                          {"authorization": f"Bearer {st.admin_token}"}, timeout_s=10.0)
    if status != 200:
        return {}
    out = {}
    for line in raw.decode().splitlines():
        m = _LAG.match(line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def lag_delta(before: dict[str, int], after: dict[str, int]) -> dict:
    if not after:
        return {}
    delta = {le: after[le] - before.get(le, 0) for le in after}
    total = delta.get("+Inf", 0)
    # Wake-ups later than each bound (the tail the probe saw).
    later = {le: total - n for le, n in delta.items() if le != "+Inf"}
    return {"wakeups": total, "later_than": {le: n for le, n in later.items() if float(le) >= 0.0005}}


def run_route(target: loadgen.Target, duration_s: float, stall_ns: int) -> dict:
    conn = loadgen.Conn(target.host, target.port)
    series = loadgen.Series(target.name)
    starts: list[int] = []
    try:
        for _ in range(50):
            loadgen._one(conn, target, loadgen.Series(target.name), None, 0)
        t0 = time.perf_counter_ns()
        stop = t0 + int(duration_s * 1e9)
        while (now := time.perf_counter_ns()) < stop:
            starts.append(now - t0)
            loadgen._one(conn, target, series, None, 0)
    finally:
        conn.close()
    wall_s = (time.perf_counter_ns() - t0) / 1e9
    totals = series.total_ns
    stalls = [i for i, v in enumerate(totals) if v >= stall_ns]
    gaps_calls = [b - a for a, b in zip(stalls, stalls[1:], strict=False)]
    gaps_s = [(starts[b] - starts[a]) / 1e9 for a, b in zip(stalls, stalls[1:], strict=False)]
    slowest = sorted(range(len(totals)), key=lambda i: -totals[i])[:20]
    return {
        "requests": len(totals),
        "errors": series.errors[:5],
        "error_count": len(series.errors),
        "req_per_s": round(len(totals) / wall_s, 1),
        "total_us": loadgen.summarize_us(totals),
        "p999_us": round(loadgen.percentile(sorted(totals), 99.9) / 1000, 1) if totals else None,
        "stalls": {
            "threshold_ms": stall_ns / 1e6,
            "count": len(stalls),
            "share_pct": round(100 * len(stalls) / max(1, len(totals)), 3),
            "median_gap_calls": sorted(gaps_calls)[len(gaps_calls) // 2] if gaps_calls else None,
            "median_gap_s": round(sorted(gaps_s)[len(gaps_s) // 2], 3) if gaps_s else None,
        },
        "slowest": [{"at_s": round(starts[i] / 1e9, 3), "call": i, "ms": round(totals[i] / 1e6, 2)}
                    for i in slowest],
    }


def start_spy(st: pb.Stack, args: argparse.Namespace, label: str) -> subprocess.Popen:
    """py-spy on the worker that answers (1 worker: the only one), sampling from 2 s into the route."""
    _, _, raw = harness.http_request("GET", st.meshfast_url + "/healthz", timeout_s=5.0)
    pid = json.loads(raw)["pid"]
    out = (args.out or RESULTS_DIR / "tail").with_suffix(f".{label}.spy.txt")
    seconds = min(args.spy, max(1.0, args.duration - 3))
    cmd = (f"sleep 2; exec {os.environ.get('PY_SPY', 'py-spy')} record -p {pid} -r 1000 -d {seconds:g} "
           f"--format raw -o {out}")
    print(f"py-spy on worker {pid} -> {out}", flush=True)
    return subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--duration", type=float, default=15.0, help="seconds per route and round")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--routes", default="chat,proxy")
    p.add_argument("--stall-ms", type=float, default=5.0, help="a call at least this slow counts as a stall")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for meshfast serve (repeatable)")
    p.add_argument("--meshfast-cmd", default=f"{sys.executable} -m meshfast.cli")
    p.add_argument("--pause", action="store_true", help="print the pids and wait for Enter before the runs")
    p.add_argument("--spy", type=float, default=0.0,
                   help="py-spy record (raw stacks, 1 kHz) the answering worker this many seconds into each route "
                        "($PY_SPY or py-spy on PATH; files beside the JSON)")
    p.add_argument("--keep-logs", action="store_true", help="keep the servers' logs (their directory is printed)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    args.only = "meshfast"
    started = dt.datetime.now(dt.UTC)
    for item in args.env:
        key, _, value = item.partition("=")
        os.environ[key] = value
    work_dir = Path(tempfile.mkdtemp(prefix="tail-probe-"))
    doc: dict = {"bench": "tail_probe", **harness.run_header(argv, started, harness.provenance(args)),
                 "config": vars(args) | {"out": str(args.out)}, "rounds": []}
    st = pb.start_stack(args, work_dir, forwarder=False)
    try:
        auth = {"authorization": f"Bearer {st.user_key}", "content-type": "application/json"}
        targets = {name: loadgen.Target.post(name, st.meshfast_url + path, auth, body, end)
                   for name, (path, body, end) in ROUTES.items() if name in args.routes.split(",")}
        if args.pause:
            print(f"meshfast pid {st.meshfast.proc.pid}; press Enter", flush=True)
            input()
        for round_no in range(args.rounds):
            for name, target in targets.items():
                before = lag_buckets(st)
                spy = start_spy(st, args, f"{name}-r{round_no}") if args.spy else None
                result = run_route(target, args.duration, int(args.stall_ms * 1e6))
                if spy is not None:
                    spy.wait(30)
                result["loop_lag"] = lag_delta(before, lag_buckets(st))
                result.update(route=name, round=round_no)
                doc["rounds"].append(result)
                t = result["total_us"]
                print(f"{name:6s} r{round_no} n={result['requests']:6d} {result['req_per_s']:7.1f}/s "
                      f"p50={t['p50']:7.1f} p99={t['p99']:8.1f} p99.9={result['p999_us']:8.1f} "
                      f"max={t['max']:8.1f} us  stalls>={args.stall_ms:g}ms: {result['stalls']['count']} "
                      f"every {result['stalls']['median_gap_calls']} calls / {result['stalls']['median_gap_s']} s  "
                      f"lag {result['loop_lag'].get('later_than', {})}", flush=True)
    finally:
        st.stop_into(doc)
        if args.keep_logs:
            print(f"logs in {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    out = args.out or RESULTS_DIR / f"tail-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
