"""The Mesh write-up's two soaks for meshfast: mixed traffic at a fixed rate, under and over capacity.

One run starts testserve (1 worker) and `meshfast serve --workers N`, provisions one provider per
family (anthropic, openai, gemini), each limited to `--rps-limit` (default 50) outbound req/s, with
one model each, and one user with an always-open policy and a 1,000,000 USD daily cap. Then, for each
`RATE:SECONDS` stage (default 140:180 then 200:120), arrivals at the fixed rate rotate over the
three models (`POST /v1/proxy`), open loop: a dispatcher releases request i at `t0 + i / rate` to a
pool of threads that grows when none is idle, and latency counts from the due time. At 140 req/s
each provider sees ~47 req/s (under its limit); at 200 req/s ~67 req/s, so about a quarter must be
shed as 503 `provider_busy` within the 4 s wait ceiling. The RSS of meshfast's processes is sampled
every second (start, peak, end, least-squares slope after 10 s).

Writes bench/results/soak-paced-<timestamp>.json.

    python bench/soak_paced.py [--workers 2] [--stages 140:180,200:120] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import governance_bench as gb  # noqa: E402
from bench import harness, loadgen  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402
from bench.capacity_bench import meshfast_pids, rss_mb  # noqa: E402
from bench.flood import leak_rate_mb_per_min  # noqa: E402
from bench.harness import BenchError  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
FAMILIES = ("anthropic", "openai", "gemini")
MAX_THREADS = 1500


def provision(st: pb.Stack, rps_limit: int) -> None:
    t0 = time.monotonic()
    model_ids = []
    for family in FAMILIES:
        provider = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/providers", {
            "name": f"s-{family}", "family": family, "base_url": f"{st.testserve_url}/{family}",
            "api_key": pb.TESTSERVE_KEY, "local": True, "verify": False, "max_outbound_rps": rps_limit,
            "models": [{"name": f"s-{family}", "resolved_model": "dummy-chat", "kind": "chat",
                        "input_price_per_1k_tokens": "0.001", "output_price_per_1k_tokens": "0.002",
                        "verify": False}],
        })
        if provider.get("max_outbound_rps") != rps_limit:
            raise BenchError(f"{family}: max_outbound_rps is {provider.get('max_outbound_rps')}, wanted {rps_limit}")
        st.setup.setdefault("provider_settings", {})[family] = pb.provider_settings(provider)
        model_ids.append(provider["models"][0]["id"])
    pb.grant_user(st, model_ids)
    st.setup["provision_s"] = round(time.monotonic() - t0, 3)
    pb.wait_for_models(st, len(FAMILIES), "the three models with the bench budget on every worker")


def stage(targets: list[loadgen.Target], rate: float, duration_s: float, pids: list[int]) -> dict:
    """Open loop at `rate` over `targets` in rotation; RSS every second."""
    rss: list[tuple[float, float]] = []
    stop_sampling = threading.Event()
    t_start = time.monotonic()

    def sample() -> None:
        while not stop_sampling.is_set():
            rss.append((round(time.monotonic() - t_start, 2), rss_mb(pids)))
            stop_sampling.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run = gb.paced(targets, rate, duration_s, max_threads=MAX_THREADS)
    finally:
        stop_sampling.set()
        sampler.join(timeout=5)
    t0, t_end, records, errors = run.t0, run.t_end, run.records, run.errors
    out = {"rate_rps": rate, "duration_s": duration_s, "arrivals": run.count, "threads_used": run.threads_used}
    out.update(gb.summarize(records, t0, t_end))
    out["success_share"] = round(out["ok"] / out["requests"], 4) if out["requests"] else None
    out["per_family"] = {n: gb.summarize(rs, t0, t_end) for n, rs in run.by_target.items()}
    out["per_second"] = gb.per_second(records, t0, int(duration_s + 0.999))
    sl = sorted(run.lag_ns)
    out["dispatch_lag_ms"] = {"p50": round(loadgen.percentile(sl, 50) / 1e6, 2),
                              "p99": round(loadgen.percentile(sl, 99) / 1e6, 2)} if sl else {}
    out["rss_mb_series"] = rss
    out["rss_mb_start"] = rss[0][1] if rss else None
    out["rss_mb_peak"] = max((r[1] for r in rss), default=None)
    out["rss_mb_end"] = rss[-1][1] if rss else None
    out["leak_mb_per_min"] = leak_rate_mb_per_min(rss)
    out["errors"] = errors[:20]
    out["error_count"] = len(errors)
    return out


def parse_stages(text: str) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in (part.split(":") for part in text.split(",") if part)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers for meshfast")
    p.add_argument("--rps-limit", type=int, default=50, help="each provider's max_outbound_rps")
    p.add_argument("--stages", type=parse_stages, default=parse_stages("140:180,200:120"),
                   help="RATE:SECONDS,... (default 140:180,200:120)")
    p.add_argument("--quick", action="store_true", help="stages 140:6,200:6")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd())
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/soak-paced-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.stages = parse_stages("140:6,200:6")
    args.only, args.meshfast_client = None, "native"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"soak-paced-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    doc: dict = {
        "benchmark": "soak-paced",
        "description": ("Mixed POST /v1/proxy over three providers limited to rps_limit each, open loop at fixed "
                        "rates: under capacity (all admitted) and over it (the excess shed as 503 provider_busy)"),
        **harness.run_header(argv, started, pb.provenance(args)),
        "config": {"workers": args.workers, "rps_limit": args.rps_limit, "families": list(FAMILIES),
                   "stages": [{"rate_rps": r, "duration_s": d} for r, d in args.stages], "quick": args.quick,
                   "proxy_body": pb.PROXY_BODY.decode(), "wait_ceiling_s": gb.WAIT_CEILING_S},
        "note": gb.NOTE,
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
        "stages": [],
    }
    failures: list[str] = []
    stack: pb.Stack | None = None
    with tempfile.TemporaryDirectory(prefix="meshfast-soak-paced-") as work:
        try:
            print("[soak-paced] starting testserve, meshfast ...", flush=True)
            stack = pb.start_stack(args, Path(work), forwarder=False,
                                   provision=lambda st: provision(st, args.rps_limit))
            doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, stack.secrets())) for s in stack.servers()}
            doc["setup"] = stack.setup
            auth = {"authorization": f"Bearer {stack.user_key}", "content-type": "application/json"}
            targets = [loadgen.Target.post(f"s-{f}", f"{stack.meshfast_url}/v1/proxy?model=s-{f}", auth,
                                           pb.PROXY_BODY, pb.NDJSON_END) for f in FAMILIES]
            for t in targets:
                pb._exchange_once(t)
            pids = meshfast_pids(stack.meshfast)
            doc["idle_rss_mb"] = rss_mb(pids)
            for rate, seconds in args.stages:
                time.sleep(gb.SETTLE_S)
                print(f"[soak-paced] {rate:g} req/s x {seconds:g} s ...", flush=True)
                meter = pb.CpuMeter(stack.groups)
                run = stage(targets, rate, seconds, pids)
                run["cpu"] = meter.stop()
                doc["stages"].append(run)
                stack.check_alive()
                if run["error_count"]:
                    failures.append(f"{rate:g} req/s: {run['error_count']} errors, e.g. {run['errors'][:3]}")
            doc["telemetry"] = pb.settled_telemetry(stack.meshfast_url, stack.admin_token)
        except BenchError as exc:
            failures.append(str(exc))
            print(f"[soak-paced] FAILED: {exc}", file=sys.stderr)
        except KeyboardInterrupt:
            failures.append("interrupted")
        finally:
            if stack is not None:
                stack.stop_into(doc)
    return harness.finish(doc, failures, started, out_path, "soak-paced", print_stages)


def print_stages(doc: dict) -> None:
    for r in doc["stages"]:
        lat = r["latency_ok_ms"]
        print(f"[soak-paced] {r['rate_rps']:g} req/s x {r['duration_s']:g} s: {r['requests']} requests, success "
              f"{100 * (r['success_share'] or 0):.1f}%, 503 {100 * (r['shed_share'] or 0):.1f}%, p50 "
              f"{lat.get('p50')} ms, p99 {lat.get('p99')} ms, max {lat.get('max')} ms; RSS {r['rss_mb_start']} -> "
              f"{r['rss_mb_peak']} -> {r['rss_mb_end']} MiB")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
