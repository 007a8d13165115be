"""The load generators' own ceiling: how fast they go against a server that does nothing.

The clients share the machine's cores with what they measure, so this bench drives a trivial server
(`bench/hello_app.py` on Granian RSGI, `--workers` N; every `POST` gets one fixed ~1 KB chunked SSE
stream shaped like testserve's short Anthropic answer, ending in `message_stop`) with each client
the paper uses, in one run, and records the CPU split (the client, the trivial server, everything
else) of every phase:

1. wrk (`-t1 -c32`, the same generated Lua script as `proxy_bench.py`): max requests/s, wrk's ceiling;
2. `bench/loadgen.py`, closed loop with one user (one connection, back to back): requests/s and the
   client's CPU time per request (`time.process_time()` around the loop);
3. `bench/loadgen.py`, open loop at fixed rates (20 req/s as in the latency runs, up to 1,000): one
   schedule for the whole level (never restarted, stricter than the 1 s slices of the paper runs),
   how late each request left the client, how many inherited backlog, the achieved rate; the
   schedule is "kept" at a rate when the achieved send rate is >= 99% of it, a request's p99
   lateness stays under one interval and at most 1% of requests were backlogged;
4. `governance_bench.py`'s closed loop (one thread and connection per user) at the largest user
   count the paper uses: its max requests/s.

The JSON (`bench/results/ceiling-<timestamp>.json`, or `--out`) is the record: provenance, config,
each phase's results with `cpu` (from /proc, as in the other benches) and `cpu_split`, and `ok`.
Latency distributions are kept as HDR histograms (`hdr`), not as raw samples.

    python bench/ceiling_bench.py [--workers 2] [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import governance_bench as gb
from bench import harness, hello_app, loadgen
from bench import models_bench as mb
from bench import proxy_bench as pb
from bench.harness import BenchError

RESULTS_DIR = ROOT / "bench" / "results"
SERVER = "trivial_server"
PATH = "/v1/proxy?model=ceiling"
REQUEST_BODY = pb.PROXY_BODY

OPEN_RATES = (20, 50, 120, 200, 500, 1000)
OPEN_RATES_QUICK = (20, 200, 1000)
# The paper's largest closed-loop user count (governance_bench), plus two smaller ones in full mode.
GOV_USERS = (1, 25, max(gb.CLOSED_USERS))
GOV_USERS_QUICK = (max(gb.CLOSED_USERS),)
SETTLE_S = 0.5

# "The schedule is kept" at a rate when all three hold.
KEEP_MIN_ACHIEVED_RATIO = 0.99
KEEP_MAX_LATE_P99_INTERVALS = 1.0
KEEP_MAX_BACKLOGGED_SHARE = 0.01

NOTE = (
    "The trivial server, the client under test and everything else on the machine share its CPUs "
    "unpinned (cpu and cpu_split in each phase say who used what). The numbers bound what each client "
    "can measure here: a rate or a latency near them says more about the client than the server. "
    "Open loop: one schedule per level (no 1 s slices), lateness = send time - due time (timer "
    "oversleep, backlog from a slow predecessor and the client's own work)."
)


# ------------------------------------------------------------------------------------------ helpers


def cpu_split(cpu: dict) -> dict:
    """Generator / trivial server / rest of the machine / idle, in CPU seconds and % of the CPUs."""
    capacity = cpu["wall_s"] * cpu["cpus"]
    gen = cpu["cpu_s"].get("bench_client", 0.0)
    srv = cpu["cpu_s"].get(SERVER, 0.0)
    other = cpu["other_cpu_s"]
    idle = max(0.0, capacity - gen - srv - other)

    def pct(x: float) -> float | None:
        return round(100 * x / capacity, 1) if capacity > 0 else None

    return {"generator_cpu_s": gen, "server_cpu_s": srv, "other_cpu_s": other, "idle_cpu_s": round(idle, 2),
            "generator_pct": pct(gen), "server_pct": pct(srv), "other_pct": pct(other), "idle_pct": pct(idle)}


class Meter:
    """pb.CpuMeter plus this process's own CPU time (the loadgen phases' client)."""

    def __init__(self, groups: pb.Groups) -> None:
        self.cpu = pb.CpuMeter(groups)
        self.proc0 = time.process_time()
        self.wall0 = time.perf_counter()

    def stop(self) -> tuple[dict, float, float]:
        proc = time.process_time() - self.proc0
        wall = time.perf_counter() - self.wall0
        cpu = self.cpu.stop()
        return cpu, proc, wall


def check_stream(target: loadgen.Target) -> dict:
    """One POST on a fresh connection: exactly 200 and the stream's end marker."""
    conn = loadgen.Conn(target.host, target.port)
    try:
        _, sample, tail = conn.exchange(target)
    except (OSError, loadgen.LoadgenError, ValueError) as exc:
        raise BenchError(f"POST {PATH} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    if sample.status != 200 or (target.expect is not None and target.expect not in tail):
        raise BenchError(f"POST {PATH} answered {sample.status}: ...{tail[-300:]!r}")
    return {"status": sample.status, "body_bytes": sample.body_bytes}


def series_problems(label: str, s: loadgen.Series) -> list[str]:
    out = []
    if s.errors:
        out.append(f"{label}: {len(s.errors)} errors, e.g. {s.errors[:3]}")
    if not s.total_ns:
        out.append(f"{label}: no completed requests")
    return out


# ------------------------------------------------------------------------------------------- phases


def phase_wrk(args, st: pb.Stack, target: loadgen.Target, work_dir: Path) -> dict:
    run = pb.run_wrk_target(args, work_dir, "trivial", target, st)
    run["cpu_split"] = cpu_split(run["cpu"])
    gen = run["cpu"]["cpu_s"].get("bench_client", 0.0)
    run["generator_cpu_us_per_request"] = round(1e6 * gen / run["wrk"]["requests"], 1) if run["wrk"]["requests"] else None
    return run


def phase_closed(args, st: pb.Stack, target: loadgen.Target) -> tuple[dict, list[str]]:
    meter = Meter(st.groups)
    series = loadgen.back_to_back(target, args.closed_duration)
    cpu, proc_s, wall_s = meter.stop()
    n = len(series.total_ns)
    measured_s = sum(series.service_ns) / 1e9  # time inside requests; the rest is the loop's own
    out = {
        "duration_s": args.closed_duration,
        "requests": n,
        "requests_per_s": round(n / args.closed_duration, 1),
        "client_cpu_s": round(proc_s, 3),
        "client_cpu_us_per_request": round(1e6 * proc_s / n, 1) if n else None,
        "client_cpu_share_of_one_core": round(proc_s / wall_s, 3) if wall_s > 0 else None,
        "time_in_requests_share": round(measured_s / args.closed_duration, 3),
        "report": series.report(raw=False),
        "cpu": cpu,
        "cpu_split": cpu_split(cpu),
    }
    return out, series_problems("loadgen closed loop", series)


def schedule_stats(series: loadgen.Series, rate: float) -> dict:
    """Achieved send and completion rates of one uninterrupted schedule, lateness, and the verdict."""
    n = len(series.due_ns)
    interval_ns = 1e9 / rate
    if not n:
        return {"kept": False}
    first_due = series.due_ns[0]
    last_send = series.sent_ns[-1]
    last_end = max(s + d for s, d in zip(series.sent_ns, series.service_ns, strict=True))
    achieved = n / ((last_send - first_due + interval_ns) / 1e9)
    completed = n / ((last_end - first_due) / 1e9) if last_end > first_due else None
    late = sorted(s - d for s, d in zip(series.sent_ns, series.due_ns, strict=True))
    late_p99 = loadgen.percentile(late, 99)
    backlogged = sum(1 for b in series.backlog_ns if b > 0)
    kept = (achieved >= KEEP_MIN_ACHIEVED_RATIO * rate
            and late_p99 <= KEEP_MAX_LATE_P99_INTERVALS * interval_ns
            and backlogged <= KEEP_MAX_BACKLOGGED_SHARE * n)
    return {
        "scheduled": n,
        "achieved_send_rps": round(achieved, 2),
        "achieved_ratio": round(achieved / rate, 4),
        "completed_rps": round(completed, 2) if completed else None,
        "interval_us": round(interval_ns / 1000, 1),
        "late_us": loadgen.summarize_us(late),
        "late_p99_intervals": round(late_p99 / interval_ns, 3),
        "backlogged_requests": backlogged,
        "backlogged_share": round(backlogged / n, 4),
        "backlog_us": loadgen.summarize_us([b for b in series.backlog_ns if b > 0]),
        "kept": kept,
    }


def phase_open(args, st: pb.Stack, target: loadgen.Target) -> tuple[dict, list[str]]:
    runs, problems = [], []
    for rate in args.rates:
        print(f"[bench] loadgen open loop: {rate:g} req/s x {args.open_duration:g} s ...", flush=True)
        meter = Meter(st.groups)
        (series,) = loadgen.open_loop([target], rate, args.open_duration, slice_s=args.open_duration,
                                      deadline_s=2 * args.open_duration + 30)
        cpu, proc_s, wall_s = meter.stop()
        n = len(series.total_ns)
        run = {"rate_rps": rate, "duration_s": args.open_duration, **schedule_stats(series, rate),
               "client_cpu_s": round(proc_s, 3),
               "client_cpu_us_per_request": round(1e6 * proc_s / n, 1) if n else None,
               "report": series.report(raw=False), "cpu": cpu, "cpu_split": cpu_split(cpu)}
        runs.append(run)
        problems += series_problems(f"loadgen open loop {rate:g}", series)
        st.check_alive()
        time.sleep(SETTLE_S)
    kept_up_to = None
    for run in runs:  # the highest rate up to which every level kept its schedule
        if not run["kept"]:
            break
        kept_up_to = run["rate_rps"]
    first_missed = next((r["rate_rps"] for r in runs if not r["kept"]), None)
    return ({"duration_s": args.open_duration, "rates_rps": list(args.rates), "runs": runs,
             "kept_up_to_rps": kept_up_to, "first_missed_rps": first_missed,
             "keep_rule": {"min_achieved_ratio": KEEP_MIN_ACHIEVED_RATIO,
                           "max_late_p99_intervals": KEEP_MAX_LATE_P99_INTERVALS,
                           "max_backlogged_share": KEEP_MAX_BACKLOGGED_SHARE}}, problems)


def phase_governance(args, st: pb.Stack, target: loadgen.Target) -> tuple[dict, list[str]]:
    runs, problems = [], []
    for users in args.users:
        print(f"[bench] governance closed loop: {users} users, {args.gov_warmup:g} + {args.gov_duration:g} s ...",
              flush=True)
        meter = Meter(st.groups)
        run = gb.closed_loop(target, users, args.gov_warmup, args.gov_duration)
        cpu, proc_s, _ = meter.stop()
        run.pop("expected_latency_s", None)  # no limiter here
        total = sum(r["requests"] for r in run["per_second"])
        run["client_cpu_s"] = round(proc_s, 3)
        run["client_cpu_us_per_request"] = round(1e6 * proc_s / total, 1) if total else None
        run["cpu"], run["cpu_split"] = cpu, cpu_split(cpu)
        runs.append(run)
        if run["error_count"]:
            problems.append(f"governance closed loop {users}: {run['error_count']} errors, e.g. {run['errors'][:3]}")
        if run["other"]:
            problems.append(f"governance closed loop {users}: {run['other']} answers that were not 200")
        if not run["ok"]:
            problems.append(f"governance closed loop {users}: no completed requests")
        st.check_alive()
        time.sleep(SETTLE_S)
    best = max(runs, key=lambda r: r["served_rps"] or 0) if runs else None
    return ({"duration_s": args.gov_duration, "warmup_s": args.gov_warmup, "users": list(args.users),
             "paper_max_users": max(gb.CLOSED_USERS), "runs": runs,
             "max_rps": best["served_rps"] if best else None, "max_rps_users": best["users"] if best else None},
            problems)


# -------------------------------------------------------------------------------------------- table


def summary_of(doc: dict) -> dict:
    wrk = doc.get("wrk") or {}
    cl = doc.get("loadgen_closed") or {}
    ol = doc.get("loadgen_open") or {}
    gv = doc.get("governance_closed") or {}
    return {
        "wrk_rps": wrk.get("requests_per_s"),
        "wrk_generator_pct": (wrk.get("cpu_split") or {}).get("generator_pct"),
        "loadgen_closed_rps": cl.get("requests_per_s"),
        "loadgen_client_cpu_us_per_request": cl.get("client_cpu_us_per_request"),
        "loadgen_closed_p50_us": ((cl.get("report") or {}).get("total_us") or {}).get("p50"),
        "loadgen_open_kept_up_to_rps": ol.get("kept_up_to_rps"),
        "loadgen_open_first_missed_rps": ol.get("first_missed_rps"),
        "governance_closed_max_rps": gv.get("max_rps"),
        "governance_closed_max_rps_users": gv.get("max_rps_users"),
        # At the paper's largest user count (governance_bench's CLOSED_USERS), when it ran.
        "governance_closed_paper_users": gv.get("paper_max_users"),
        "governance_closed_paper_users_rps": next((r["served_rps"] for r in gv.get("runs", [])
                                                   if r["users"] == gv.get("paper_max_users")), None),
    }


_f = harness.format_number


def print_tables(doc: dict) -> None:
    def split(c: dict) -> str:
        return (f"gen {_f(c['generator_pct'])}% srv {_f(c['server_pct'])}% other {_f(c['other_pct'])}% "
                f"idle {_f(c['idle_pct'])}%")

    wrk = doc.get("wrk")
    if wrk:
        print(f"\nwrk -t{doc['config']['wrk']['threads']} -c{doc['config']['wrk']['connections']}: "
              f"{_f(wrk['requests_per_s'])} req/s, p50 {wrk['latency_p50_ms']:.2f} ms, p99 {wrk['latency_p99_ms']:.2f} ms"
              f"; {split(wrk['cpu_split'])}")
    cl = doc.get("loadgen_closed")
    if cl:
        t = cl["report"]["total_us"]
        print(f"loadgen closed loop, 1 user: {_f(cl['requests_per_s'])} req/s, p50 {_f(t.get('p50'))} us, "
              f"client {_f(cl['client_cpu_us_per_request'])} us CPU/request "
              f"({100 * (cl['client_cpu_share_of_one_core'] or 0):.0f}% of a core); {split(cl['cpu_split'])}")
    ol = doc.get("loadgen_open")
    if ol:
        print(f"\nloadgen open loop, {ol['duration_s']:g} s per rate, one schedule")
        print(f"{'rate':>6}{'sent/s':>9}{'late p50':>10}{'late p99':>10}{'backlog':>9}{'p50 us':>8}{'p99 us':>8}"
              f"{'cpu us/req':>11}  kept  cpu split")
        for r in ol["runs"]:
            t = r["report"]["total_us"]
            print(f"{r['rate_rps']:>6g}{r['achieved_send_rps']:>9.1f}{_f(r['late_us'].get('p50')):>10}"
                  f"{_f(r['late_us'].get('p99')):>10}{r['backlogged_requests']:>9}{_f(t.get('p50')):>8}"
                  f"{_f(t.get('p99')):>8}{_f(r['client_cpu_us_per_request']):>11}  {'yes' if r['kept'] else 'NO ':<4}"
                  f"  {split(r['cpu_split'])}")
        print(f"schedule kept up to {ol['kept_up_to_rps']} req/s (first missed: {ol['first_missed_rps']})")
    gv = doc.get("governance_closed")
    if gv:
        print(f"\ngovernance_bench closed loop, {gv['duration_s']:g} s after {gv['warmup_s']:g} s")
        for r in gv["runs"]:
            lat = r["latency_ok_ms"]
            print(f"{r['users']:>6} users: {_f(r['served_rps'])} req/s, p50 {lat.get('p50')} ms, "
                  f"p99 {lat.get('p99')} ms, client {_f(r['client_cpu_us_per_request'])} us CPU/request; "
                  f"{split(r['cpu_split'])}")


# --------------------------------------------------------------------------------------------- main


def provenance(args) -> dict:
    return harness.provenance(args, ("hdrhistogram",))  # args.only == "hello": no meshfast probe (not involved)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers for the trivial server")
    p.add_argument("--connections", type=int, default=32, help="wrk connections")
    p.add_argument("--threads", type=int, default=1, help="wrk threads")
    p.add_argument("--wrk-duration", type=int, default=10, help="measured wrk seconds")
    p.add_argument("--wrk-warmup", type=int, default=2, help="wrk seconds before, kept apart (0: none)")
    p.add_argument("--closed-duration", type=float, default=10.0, help="loadgen closed-loop seconds")
    p.add_argument("--open-duration", type=float, default=8.0, help="loadgen open-loop seconds per rate")
    p.add_argument("--rates", type=lambda s: tuple(float(x) for x in s.split(",")), default=None,
                   help=f"open-loop rates (default {','.join(map(str, OPEN_RATES))})")
    p.add_argument("--users", type=lambda s: tuple(int(x) for x in s.split(",")), default=None,
                   help=f"governance closed-loop user counts (default {','.join(map(str, GOV_USERS))})")
    p.add_argument("--gov-duration", type=float, default=8.0, help="governance closed-loop seconds per level")
    p.add_argument("--gov-warmup", type=float, default=1.0, help="governance closed-loop warm-up seconds")
    p.add_argument("--skip", action="append", default=[], choices=("wrk", "closed", "open", "governance"),
                   help="leave a phase out (repeatable)")
    p.add_argument("--quick", action="store_true", help="smoke check in < 60 s (3 s phases, 3 rates, 300 users)")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/ceiling-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.wrk_duration, args.wrk_warmup = 3, 1
        args.closed_duration = args.open_duration = args.gov_duration = 3.0
        args.gov_warmup = 0.5
        args.rates = args.rates or OPEN_RATES_QUICK
        args.users = args.users or GOV_USERS_QUICK
    args.rates = tuple(sorted(args.rates or OPEN_RATES))
    args.users = args.users or GOV_USERS
    args.only, args.meshfast_cmd = "hello", "meshfast"  # models_bench helpers read them
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"ceiling-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    doc: dict = {
        "benchmark": "ceiling",
        "description": ("the load generators against a trivial Granian server (fixed ~1 KB SSE stream): wrk's "
                        "max req/s, loadgen's closed-loop req/s and CPU per request, loadgen's open loop at "
                        "fixed rates (schedule kept?), governance_bench's closed loop at the paper's user count"),
        **harness.run_header(argv, started, provenance(args)),
        "config": {
            "workers": args.workers, "server": "bench.hello_app:app (Granian RSGI), POST -> fixed SSE stream",
            "stream_body_bytes": len(hello_app.STREAM_BODY), "request_body": REQUEST_BODY.decode(),
            "wrk": {"connections": args.connections, "threads": args.threads, "duration_s": args.wrk_duration,
                    "warmup_s": args.wrk_warmup, "timeout": harness.WRK_TIMEOUT},
            "closed_duration_s": args.closed_duration, "open_duration_s": args.open_duration,
            "open_rates_rps": list(args.rates), "governance_users": list(args.users),
            "governance_duration_s": args.gov_duration, "governance_warmup_s": args.gov_warmup,
            "skip": args.skip, "quick": args.quick, "hdr": loadgen.HDR_CONFIG,
        },
        "note": NOTE,
        "error_policy": ("The trivial server not answering a POST with exactly 200 and the stream's end, any "
                         "non-2xx, socket error or incomplete stream in a phase (loadgen, wrk, governance "
                         "client), or the server dying fails the run (ok=false, exit 1; the JSON is still "
                         "written). Whether a rate's schedule was kept is a result, not a failure."),
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
    }
    failures: list[str] = []
    live = None
    with tempfile.TemporaryDirectory(prefix="meshfast-ceiling-bench-") as work:
        work_dir = Path(work)
        try:
            print(f"[bench] starting the trivial server ({args.workers} workers) ...", flush=True)
            live = mb.start_hello(args, work_dir)
            st = pb.Stack()
            st.groups.sessions[SERVER] = live.server.proc.pid  # start_new_session: the leader's pid is the sid
            base = live.url.rsplit("/v1/", 1)[0]
            target = loadgen.Target.post("trivial", base + PATH, {"content-type": "application/json"},
                                         REQUEST_BODY, hello_app.STREAM_END)
            doc["server"] = {"command": shlex.join(live.server.argv), "setup": live.setup,
                             "preflight": check_stream(target)}
            if "wrk" not in args.skip:
                print(f"[bench] wrk -t{args.threads} -c{args.connections} {args.wrk_duration} s ...", flush=True)
                doc["wrk"] = phase_wrk(args, st, target, work_dir)
                time.sleep(SETTLE_S)
            if "closed" not in args.skip:
                print(f"[bench] loadgen closed loop, 1 user, {args.closed_duration:g} s ...", flush=True)
                doc["loadgen_closed"], probs = phase_closed(args, st, target)
                failures += probs
                time.sleep(SETTLE_S)
            if "open" not in args.skip:
                doc["loadgen_open"], probs = phase_open(args, st, target)
                failures += probs
            if "governance" not in args.skip:
                doc["governance_closed"], probs = phase_governance(args, st, target)
                failures += probs
            doc["server"]["postflight"] = check_stream(target)
            live.server.check_alive()
        except BenchError as exc:
            failures.append(str(exc))
            print(f"[bench] FAILED: {exc}", file=sys.stderr)
        except KeyboardInterrupt:
            failures.append("interrupted")
        finally:
            if live is not None:
                doc.setdefault("server", {})["log_tail"] = live.server.log_tail(2000)
                doc["server"]["stop"] = live.server.stop()
    wrk = doc.get("wrk")
    if wrk:
        errs = {k: v for k, v in wrk["wrk"]["errors"].items() if v}
        if errs:
            failures.append(f"wrk: errors {errs}")
        if not wrk["wrk"]["requests"]:
            failures.append("wrk: no requests")
    doc["summary"] = summary_of(doc)
    return harness.finish(doc, failures, started, out_path, "bench", print_tables, indent=2)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the server on SIGTERM too
    sys.exit(main())
