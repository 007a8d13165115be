"""Governance under load (the Mesh write-up's Figure 2 for meshfast) and its in-process cost.

One run starts, on 127.0.0.1, testserve (the emulated providers, 1 worker) and `meshfast serve
--workers N`, provisions one anthropic provider with `max_outbound_rps` (default 50) and one model
(`dummy-chat`), one user with an always-open policy and a 1,000,000 USD daily cap, and measures:

1. closed loop: N users (threads, one keep-alive connection each) send back-to-back
   `POST /v1/proxy` calls for `--duration` s after a warm-up of N/rps + 0.5 s (capped at the wait
   ceiling + 0.5 s): admitted requests/s, p50/p95/p99 of the 200s, the 503 share. Once the limiter
   binds, latency should follow N/rps until the 4 s wait ceiling, after which calls are shed (503
   `provider_busy`) and admitted latency stays near the ceiling;
2. open loop at fixed arrival rates: a dispatcher releases request i at `t0 + i / rate` to a pool of
   threads that grows whenever none is idle, so a slow answer never delays the next arrival (no
   coordinated omission); latency counts from the due time. Admitted p50/p99, 503 share, admitted
   requests/s, also over the last half of the window (the token bucket's burst of `rps` tokens
   absorbs the start of an over-limit run);
3. the in-process cost of governance with `meshfast._core` directly: `Core.prepare` +
   `admit_provider` + `admit_global` + `release_provider` + `settle` per call, with every policy on
   (daily cap, hourly call caps for the user and the provider, an allowed-hours window in a non-UTC
   timezone that is open now, provider rate and concurrency limits) against the same with none.

The JSON in `bench/results/governance-<timestamp>.json` is the record (provenance, CPU use per level
split into the bench's processes and everything else, per-second series); the table is a convenience.

    python bench/governance_bench.py [--workers 2] [--duration 10] [--rps-limit 50] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import queue
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
import zoneinfo
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, loadgen
from bench import proxy_bench as pb
from bench.harness import BenchError
from bench.proxy_bench import Stack

RESULTS_DIR = ROOT / "bench" / "results"

MODEL_NAME = "g-anthropic"
# NOTE: meshfast.admission.ADMIT_WAIT_S; a caller waits at most this long for a provider token.
WAIT_CEILING_S = 4.0
# 300: past the ceiling (200 users x 20 ms = 4 s), where shedding starts.
CLOSED_USERS = (1, 5, 25, 100, 200, 300)
CLOSED_USERS_QUICK = (1, 25, 200)
OPEN_RATES = (10, 25, 40, 50, 60, 80, 120)
OPEN_RATES_QUICK = (25, 50, 100)
# Between levels: in-flight calls end, then the bucket's booked-ahead tokens and its burst refill.
SETTLE_S = 1.5
# The open-loop pool never needs more threads than rate x (ceiling + slack).
MAX_OPEN_THREADS = 1000
CLIENT_TIMEOUT_S = 15.0
GOAL_IN_PROCESS_NS = 10_000
TIMEZONE = "Europe/Paris"

NOTE = (
    "testserve, meshfast (+ its embedded PostgreSQL) and the client share this machine's CPUs "
    "unpinned with whatever else runs on it (each level's cpu says how much that was). Closed loop: "
    "each user resends as soon as an answer (200 or 503) arrives; statistics cover requests sent in "
    "the measured window after the warm-up and are followed to completion. Open loop: latency is due "
    "time to last byte; a run above the limit starts with the bucket's burst of rps tokens, then the "
    "queue grows until waits reach the ceiling, so 'last half' shows the state closer to steady. "
    "In-process: one thread, a fresh Prepared per call, the median over repeats of a timed loop."
)


# ---------------------------------------------------------------------------------------- servers


def start_stack(args, work_dir: Path) -> Stack:
    """testserve and meshfast (started together), then the provider with its rate limit, a user."""
    return pb.start_stack(args, work_dir, forwarder=False, provision=lambda st: provision(st, args.rps_limit))


def provision(st: Stack, rps_limit: int) -> None:
    t0 = time.monotonic()
    provider = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/providers", {
        "name": "g-anthropic", "family": "anthropic", "base_url": f"{st.testserve_url}/anthropic",
        "api_key": pb.TESTSERVE_KEY, "local": True, "verify": False, "max_outbound_rps": rps_limit,
        "models": [{"name": MODEL_NAME, "resolved_model": "dummy-chat", "kind": "chat",
                    "input_price_per_1k_tokens": "0.001", "output_price_per_1k_tokens": "0.002",
                    "verify": False}],
    })
    st.setup["provider_settings"] = pb.provider_settings(provider)
    if provider.get("max_outbound_rps") != rps_limit:
        raise BenchError(f"provider max_outbound_rps is {provider.get('max_outbound_rps')}, wanted {rps_limit}")
    pb.grant_user(st, [provider["models"][0]["id"]])
    st.setup["provision_s"] = round(time.monotonic() - t0, 3)
    pb.wait_for_models(st, 1, "the model with the bench budget on every worker")


def proxy_target(st: Stack) -> loadgen.Target:
    auth = {"authorization": f"Bearer {st.user_key}", "content-type": "application/json"}
    return loadgen.Target.post("meshfast-anthropic", f"{st.meshfast_url}/v1/proxy?model={MODEL_NAME}", auth,
                               pb.PROXY_BODY, pb.NDJSON_END)


# ---------------------------------------------------------------------------------------- samples


@dataclass
class Record:
    """One request: times in perf_counter ns; `start_ns` is the due time (open) or the send (closed)."""

    start_ns: int
    end_ns: int
    status: int  # 0: socket error or a 200 without the stream's end


def _call(conn: loadgen.Conn, target: loadgen.Target) -> tuple[int, int, int, str | None]:
    """(send ns, end ns, status, error text) of one exchange; reconnects on the next call after an error."""
    try:
        t_send, sample, tail = conn.exchange(target)
    except (OSError, loadgen.LoadgenError, ValueError, IndexError) as exc:
        conn.close()
        now = time.perf_counter_ns()
        return now, now, 0, f"{type(exc).__name__}: {exc}"
    end = t_send + sample.last_ns
    if sample.status == 200 and target.expect is not None and target.expect not in tail:
        return t_send, end, 0, f"200 without {target.expect!r}: ...{tail[-200:]!r}"
    if sample.status not in (200, 503):
        return t_send, end, sample.status, f"status {sample.status}: {tail[:200]!r}"
    if sample.status == 503 and b"provider_busy" not in tail:
        return t_send, end, sample.status, f"503 that is not provider_busy: {tail[:200]!r}"
    return t_send, end, sample.status, None


def summarize(records: list[Record], t_from: int, t_to: int) -> dict:
    """Requests that started in [t_from, t_to), latency of their 200s; `served_rps`: 200s that ended in it.

    `admitted_rps` counts the window's arrivals that were eventually admitted, some served after it
    ends (up to the wait ceiling later); `served_rps` is the provider-side rate the limiter allows.
    """
    chosen = [r for r in records if t_from <= r.start_ns < t_to]
    window_s = (t_to - t_from) / 1e9
    ok = [r.end_ns - r.start_ns for r in chosen if r.status == 200]
    shed = sum(1 for r in chosen if r.status == 503)
    other = len(chosen) - len(ok) - shed
    shed_ns = [r.end_ns - r.start_ns for r in chosen if r.status == 503]
    lat = loadgen.summarize_us(ok)
    shed_lat = loadgen.summarize_us(shed_ns)
    return {
        "window_s": round(window_s, 3),
        "requests": len(chosen),
        "ok": len(ok),
        "shed_503": shed,
        "other": other,
        "shed_share": round(shed / len(chosen), 4) if chosen else None,
        "offered_rps": round(len(chosen) / window_s, 2) if window_s > 0 else None,
        "admitted_rps": round(len(ok) / window_s, 2) if window_s > 0 else None,
        "served_rps": round(sum(1 for r in records if r.status == 200 and t_from <= r.end_ns < t_to) / window_s, 2)
        if window_s > 0 else None,
        "latency_ok_ms": {k: (round(v / 1000, 2) if k != "n" else v) for k, v in lat.items()},
        "latency_503_ms": {k: (round(v / 1000, 2) if k != "n" else v) for k, v in shed_lat.items()},
        # The same latencies as HDR histograms (us, base64) and the percentiles read from them.
        **loadgen.hdr_report({"latency_ok_us": ok, "latency_503_us": shed_ns}),
    }


def per_second(records: list[Record], t0: int, seconds: int) -> list[dict]:
    """By second of start: requests, 200s, 503s, p50 and max of the 200s (ms)."""
    out = []
    for i in range(seconds):
        lo, hi = t0 + i * 1_000_000_000, t0 + (i + 1) * 1_000_000_000
        sec = [r for r in records if lo <= r.start_ns < hi]
        ok = sorted(r.end_ns - r.start_ns for r in sec if r.status == 200)
        out.append({"s": i, "requests": len(sec), "ok": len(ok), "shed_503": sum(r.status == 503 for r in sec),
                     "ok_p50_ms": round(loadgen.percentile(ok, 50) / 1e6, 1) if ok else None,
                     "ok_max_ms": round(ok[-1] / 1e6, 1) if ok else None})
    return out


# ----------------------------------------------------------------------------------- closed loop


def closed_loop(target: loadgen.Target, users: int, warmup_s: float, duration_s: float) -> dict:
    """`users` threads, back to back; returns records of every request and the run's error texts."""
    records: list[Record] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = [0]  # perf_counter ns after which no user sends again (set once all have started)
    barrier = threading.Barrier(users + 1)

    def user() -> None:
        conn = loadgen.Conn(target.host, target.port, timeout_s=CLIENT_TIMEOUT_S)
        mine: list[Record] = []
        bad: list[str] = []
        try:
            barrier.wait()
            while time.perf_counter_ns() < stop_at[0]:
                t_send, t_end, status, err = _call(conn, target)
                mine.append(Record(t_send, t_end, status))
                if err:
                    bad.append(err)
                    time.sleep(0.01)  # a broken socket must not spin
        finally:
            conn.close()
            with lock:
                records.extend(mine)
                errors.extend(bad)

    threads = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for t in threads:
        t.start()
    t0 = time.perf_counter_ns()
    stop_at[0] = t0 + int((warmup_s + duration_s) * 1e9)
    barrier.wait()
    for t in threads:
        t.join(timeout=warmup_s + duration_s + CLIENT_TIMEOUT_S + 10)
    if any(t.is_alive() for t in threads):
        errors.append("a user thread did not finish")
    m_from = t0 + int(warmup_s * 1e9)
    m_to = stop_at[0]
    out = {"users": users, "warmup_s": round(warmup_s, 2), "duration_s": duration_s,
           "expected_latency_s": None}
    out.update(summarize(records, m_from, m_to))
    out["warmup"] = summarize(records, t0, m_from)
    out["per_second"] = per_second(records, t0, int(warmup_s + duration_s + 0.999))
    out["errors"] = errors[:20]
    out["error_count"] = len(errors)
    return out


# ------------------------------------------------------------------------------------- open loop


@dataclass
class Arrivals:
    """What a paced run saw: per target, a Record for every arrival (`start_ns` is its due time)."""

    t0: int
    t_end: int
    count: int
    by_target: dict[str, list[Record]]
    lag_ns: list[int]  # how late the dispatcher handed out each arrival (client side)
    errors: list[str]
    threads_used: int

    @property
    def records(self) -> list[Record]:
        return [r for rs in self.by_target.values() for r in rs]


def paced(targets: list[loadgen.Target], rate: float, duration_s: float,
          max_threads: int = MAX_OPEN_THREADS) -> Arrivals:
    """Arrivals at `t0 + i / rate`, arrival i to `targets[i % len(targets)]`, each on a thread of a pool
    that grows when none is idle (one keep-alive connection per target per thread)."""
    jobs: queue.Queue[tuple[int, int] | None] = queue.Queue()
    by_target: dict[str, list[Record]] = {t.name: [] for t in targets}
    errors: list[str] = []
    lock = threading.Lock()
    idle = [0]
    threads: list[threading.Thread] = []
    lag_ns: list[int] = []

    def worker() -> None:
        conns = {t.name: loadgen.Conn(t.host, t.port, timeout_s=CLIENT_TIMEOUT_S) for t in targets}
        mine: list[tuple[str, Record]] = []
        bad: list[str] = []
        try:
            while True:
                job = jobs.get()
                if job is None:
                    break
                due, i = job
                t = targets[i % len(targets)]
                _, t_end, status, err = _call(conns[t.name], t)
                mine.append((t.name, Record(due, t_end, status)))
                if err:
                    bad.append(f"{t.name}: {err}" if len(targets) > 1 else err)
                with lock:
                    idle[0] += 1
        finally:
            for c in conns.values():
                c.close()
            with lock:
                for name, r in mine:
                    by_target[name].append(r)
                errors.extend(bad)

    count = int(round(rate * duration_s))
    interval_ns = 1e9 / rate
    t0 = time.perf_counter_ns() + 50_000_000
    for i in range(count):
        due = t0 + int(i * interval_ns)
        wait = due - time.perf_counter_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        lag_ns.append(max(0, time.perf_counter_ns() - due))
        with lock:
            spawn = idle[0] == 0
            if not spawn:
                idle[0] -= 1
        if spawn:
            if len(threads) >= max_threads:
                errors.append("thread pool exhausted")
                break
            th = threading.Thread(target=worker, daemon=True)
            threads.append(th)
            th.start()
        jobs.put((due, i))
    for _ in threads:
        jobs.put(None)
    for th in threads:
        th.join(timeout=CLIENT_TIMEOUT_S + 10)
    return Arrivals(t0, t0 + int(count * interval_ns), count, by_target, lag_ns, errors, len(threads))


def open_loop(target: loadgen.Target, rate: float, duration_s: float) -> dict:
    """One target at `rate` arrivals/s for `duration_s` (see `paced`)."""
    run = paced([target], rate, duration_s)
    t0, t_end, records = run.t0, run.t_end, run.records
    half = t0 + int(run.count // 2 * 1e9 / rate)
    out = {"rate_rps": rate, "duration_s": duration_s, "arrivals": run.count, "threads_used": run.threads_used}
    out.update(summarize(records, t0, t_end))
    out["last_half"] = summarize(records, half, t_end)
    lag = sorted(run.lag_ns)
    out["dispatch_lag_ms"] = {"p50": round(loadgen.percentile(lag, 50) / 1e6, 2),
                              "p99": round(loadgen.percentile(lag, 99) / 1e6, 2),
                              "max": round(lag[-1] / 1e6, 2)} if lag else {}
    out["per_second"] = per_second(records, t0, int(duration_s + 0.999))
    out["errors"] = run.errors[:20]
    out["error_count"] = len(run.errors)
    return out


# -------------------------------------------------------------------------------------- phases


def _drain(st: Stack) -> None:
    time.sleep(SETTLE_S)
    st.check_alive()


def phase_closed(args, st: Stack, target: loadgen.Target) -> dict:
    runs = []
    for n in args.users:
        warmup = min(n / args.rps_limit, WAIT_CEILING_S) + 0.5
        print(f"[bench] closed loop: {n} users, {warmup:.1f} + {args.duration:g} s ...", flush=True)
        meter = pb.CpuMeter(st.groups)
        before = pb.scrape_metrics(st)
        run = closed_loop(target, n, warmup, args.duration)
        # Where the admitted calls waited (warm-up included): the limiter's wait is in the gateway phase.
        run["phase_split"] = pb.phase_split(before, pb.scrape_metrics(st))
        run["cpu"] = meter.stop()
        # NOTE: one user alone outruns the limit (a call takes ~2 ms), so the bucket binds at every N.
        run["expected_latency_s"] = round(min(n / args.rps_limit, WAIT_CEILING_S), 3)
        runs.append(run)
        _drain(st)
    return {"duration_s": args.duration, "rps_limit": args.rps_limit, "wait_ceiling_s": WAIT_CEILING_S,
            "runs": runs}


def phase_open(args, st: Stack, target: loadgen.Target) -> dict:
    runs = []
    for rate in args.rates:
        print(f"[bench] open loop: {rate:g} req/s x {args.duration:g} s ...", flush=True)
        meter = pb.CpuMeter(st.groups)
        run = open_loop(target, rate, args.duration)
        run["cpu"] = meter.stop()
        runs.append(run)
        _drain(st)
    return {"duration_s": args.duration, "rps_limit": args.rps_limit, "wait_ceiling_s": WAIT_CEILING_S,
            "runs": runs}


# ----------------------------------------------------------------------------------- in-process


def _core_config(policies: bool, core_hash, now: dt.datetime) -> tuple[object, str, dict]:
    """One user, one key, one anthropic provider and model, one grant: every policy on, or none."""
    from meshfast.secrets import new_mesh_key
    from meshfast.snapshot import Config, Grant, Key, Model, Principal, Provider

    token, _ = new_mesh_key()
    local_min = now.astimezone(zoneinfo.ZoneInfo(TIMEZONE))
    minute = local_min.hour * 60 + local_min.minute
    if policies:
        # NOTE: limits far above what the timed loop reaches, so every check runs and none denies.
        provider_limits = {"max_calls_per_hour": 10**12, "max_outbound_rps": 1_000_000,
                           "max_concurrent_upstream": 64}
        grant = {"daily_cap_nano_usd": 10**15, "max_calls_per_hour": 10**12,
                 "allowed_from_min": (minute - 120) % 1440, "allowed_to_min": (minute + 120) % 1440,
                 "timezone": TIMEZONE, "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": False}
    else:
        provider_limits = {"max_calls_per_hour": None, "max_outbound_rps": None, "max_concurrent_upstream": None}
        grant = {"daily_cap_nano_usd": 0, "max_calls_per_hour": None, "allowed_from_min": None,
                 "allowed_to_min": None, "timezone": "UTC", "active_days": [], "always_open": True}
    provider = Provider(id=str(uuid.uuid4()), name="bench", family="anthropic", supports_web_search=False,
                        base_url="http://127.0.0.1:9/anthropic", api_key="sk-bench", local=True,
                        **provider_limits)
    model = Model(id=str(uuid.uuid4()), name="bench-model", provider=0, resolved_model="dummy-chat",
                  max_output_tokens=4096, price_per_second_nano=0, kind="chat", created_ms=0, blocked=False,
                  status="active", supports_image_in=False, supports_document_in=False, supports_audio_in=False,
                  supports_video_in=False, supports_web_search=False, output_media_type=None,
                  input_price_nano_per_1k=1_000_000, output_price_nano_per_1k=2_000_000)
    config = Config(seq=1, kill_switch=False,
                    principals=[Principal(id=str(uuid.uuid4()), email="u@example.com", display_name="U",
                                          status="active", expires_at_ms=None)],
                    keys=[Key(id=str(uuid.uuid4()), principal=0, digest=core_hash(token), status="active",
                              expires_at_ms=None)],
                    providers=[provider], models=[model], grants=[Grant(principal=0, model=0, **grant)])
    return config, token, {"provider": provider_limits, "grant": grant}


def phase_in_process(args) -> dict:
    from meshfast._core import Core, Segment
    from meshfast.snapshot import encode

    body = pb.PROXY_BODY
    query = "model=bench-model"
    settle_nano = 1000
    with tempfile.TemporaryDirectory(prefix="meshfast-gov-seg-") as seg_dir:
        segment = Segment.create(str(Path(seg_dir) / "bench.seg"))
        segment.register()
        now = dt.datetime.now(dt.UTC)
        variants = {}
        for name, on in (("policies_on", True), ("policies_off", False)):
            core = Core(b"p" * 32, segment)
            config, token, shape = _core_config(on, core.hash_token, now)
            core.load(encode(config))
            variants[name] = (core, f"Bearer {token}", shape)

        def loop(core, header: str, n: int) -> tuple[int, int]:
            """n calls; returns (elapsed ns, calls not admitted)."""
            monotonic_ns, time_ns = time.monotonic_ns, time.time_ns
            refused = 0
            t0 = time.perf_counter_ns()
            for _ in range(n):
                p = core.prepare("proxy", header, None, None, query, body, len(body), time_ns() // 1_000_000)
                if p.status != 0:
                    refused += 1
                    continue
                admitted, _ = p.admit_provider(monotonic_ns(), 0)
                if not admitted or not p.admit_global(200, 1):
                    refused += 1
                p.release_provider()
                p.settle(settle_nano)
            return time.perf_counter_ns() - t0, refused

        checks = {}
        for name, (core, header, _) in variants.items():
            p = core.prepare("proxy", header, None, None, query, body, len(body), time.time_ns() // 1_000_000)
            if p.status != 0:
                raise BenchError(f"in-process {name}: prepare answered {p.status} {p.body!r}")
            checks[name] = {"limit_id": p.limit_id, "reserved_nano": p.reserved_nano, "attempts": p.attempts}
            p.settle(0)
            loop(core, header, args.inproc_iters // 4)  # warm caches and the counter slots
        samples: dict[str, list[float]] = {name: [] for name in variants}
        refused: dict[str, int] = {name: 0 for name in variants}
        meter_t0 = time.monotonic()
        cpu0 = time.process_time()
        for r in range(args.inproc_repeats):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                core, header, _ = variants[name]
                elapsed, bad = loop(core, header, args.inproc_iters)
                samples[name].append(elapsed / args.inproc_iters)
                refused[name] += bad
        wall = time.monotonic() - meter_t0
        cpu = time.process_time() - cpu0
    out: dict = {
        "iterations_per_repeat": args.inproc_iters, "repeats": args.inproc_repeats,
        "per_call": ("core.prepare('proxy', ...) with time.time_ns()//1e6, admit_provider(time.monotonic_ns(), 0), "
                     f"admit_global(200, 1), release_provider(), settle({settle_nano})"),
        "timezone": TIMEZONE, "checks": checks,
        "process_cpu_share": round(cpu / wall, 3) if wall > 0 else None,
        "goal_ns": GOAL_IN_PROCESS_NS,
    }
    for name, values in samples.items():
        out[name] = {
            "median_ns": round(statistics.median(values), 1),
            "min_ns": round(min(values), 1),
            "max_ns": round(max(values), 1),
            "refused": refused[name],
            "limits": variants[name][2],
            "raw_ns": [round(v, 1) for v in values],
        }
    out["governance_cost_ns"] = round(out["policies_on"]["median_ns"] - out["policies_off"]["median_ns"], 1)
    out["meets_goal"] = out["policies_on"]["median_ns"] <= GOAL_IN_PROCESS_NS
    return out


# ------------------------------------------------------------------------------------- verdicts


def problems_of(doc: dict) -> list[str]:
    problems = []
    for phase in ("closed_loop", "open_loop"):
        for run in (doc.get(phase) or {}).get("runs", []):
            label = f"{phase} {run.get('users', run.get('rate_rps'))}"
            if run["error_count"]:
                problems.append(f"{label}: {run['error_count']} errors, e.g. {run['errors'][:3]}")
            if not run["ok"]:
                problems.append(f"{label}: no admitted requests")
    ip = doc.get("in_process") or {}
    for name in ("policies_on", "policies_off"):
        if ip.get(name, {}).get("refused"):
            problems.append(f"in_process {name}: {ip[name]['refused']} calls refused")
    return problems


# ------------------------------------------------------------------------------------------ table


def _ms(x) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def print_tables(doc: dict) -> None:
    cl = doc.get("closed_loop")
    if cl:
        print(f"\nClosed loop, provider limit {cl['rps_limit']} req/s, wait ceiling {cl['wait_ceiling_s']:g} s, "
              f"{cl['duration_s']:g} s measured after a warm-up (latency of 200s, ms; srv rps: 200s completed "
              "per s in the window; 503 %: of requests sent, shed callers resend at once)")
        print(f"{'users':>6}{'srv rps':>9}{'p50':>8}{'p95':>8}{'p99':>8}{'503 %':>7}{'expect':>8}"
              f"{'busy%':>7}{'other%':>8}")
        for r in cl["runs"]:
            lat = r["latency_ok_ms"]
            exp = r["expected_latency_s"]
            print(f"{r['users']:>6}{r['served_rps']:>9.1f}{_ms(lat.get('p50')):>8}{_ms(lat.get('p95')):>8}"
                  f"{_ms(lat.get('p99')):>8}{100 * (r['shed_share'] or 0):>7.1f}"
                  f"{('-' if exp is None else f'{exp * 1000:,.0f}'):>8}"
                  f"{_ms(r['cpu']['machine_busy_pct']):>7}{_ms(r['cpu']['other_busy_pct']):>8}")
    ol = doc.get("open_loop")
    if ol:
        print(f"\nOpen loop, {ol['duration_s']:g} s per rate (latency from the due time, ms; srv rps: 200s "
              "completed per s in the window; '2nd half' = the last half of the window)")
        print(f"{'rate':>6}{'srv rps':>9}{'p50':>8}{'p99':>8}{'503 %':>7}   {'2nd half:':<9}{'srv rps':>8}"
              f"{'p50':>8}{'p99':>8}{'503 %':>7}{'busy%':>7}{'other%':>8}")
        for r in ol["runs"]:
            lat, h = r["latency_ok_ms"], r["last_half"]
            hl = h["latency_ok_ms"]
            print(f"{r['rate_rps']:>6g}{r['served_rps']:>9.1f}{_ms(lat.get('p50')):>8}{_ms(lat.get('p99')):>8}"
                  f"{100 * (r['shed_share'] or 0):>7.1f}   {'':<9}{h['served_rps']:>8.1f}"
                  f"{_ms(hl.get('p50')):>8}{_ms(hl.get('p99')):>8}{100 * (h['shed_share'] or 0):>7.1f}"
                  f"{_ms(r['cpu']['machine_busy_pct']):>7}{_ms(r['cpu']['other_busy_pct']):>8}")
    ip = doc.get("in_process")
    if ip:
        on, off = ip["policies_on"], ip["policies_off"]
        print(f"\nIn-process governance ({ip['repeats']} x {ip['iterations_per_repeat']:,} calls; "
              "prepare + admit_provider + admit_global + release_provider + settle)")
        print(f"  policies on : median {on['median_ns']:,.0f} ns/call (min {on['min_ns']:,.0f}, max {on['max_ns']:,.0f})")
        print(f"  policies off: median {off['median_ns']:,.0f} ns/call (min {off['min_ns']:,.0f}, max {off['max_ns']:,.0f})")
        print(f"  cost of the policies: {ip['governance_cost_ns']:,.0f} ns/call; all on <= "
              f"{ip['goal_ns'] / 1000:g} us: {'yes' if ip['meets_goal'] else 'NO'}")
    others = [r["cpu"]["other_busy_pct"] or 0 for p in ("closed_loop", "open_loop")
              for r in (doc.get(p) or {}).get("runs", [])]
    if others and max(others) > harness.BUSY_WARN_PCT:
        print(f"WARNING: processes outside the bench used up to {max(others):.0f}% of the CPUs in a level; "
              "numbers are noisy")


# ------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers for meshfast")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per level")
    p.add_argument("--rps-limit", type=int, default=50, help="the provider's max_outbound_rps")
    p.add_argument("--users", type=lambda s: tuple(int(x) for x in s.split(",")), default=None,
                   help=f"closed-loop user counts (default {','.join(map(str, CLOSED_USERS))})")
    p.add_argument("--rates", type=lambda s: tuple(float(x) for x in s.split(",")), default=None,
                   help=f"open-loop arrival rates (default {','.join(map(str, OPEN_RATES))})")
    p.add_argument("--inproc-iters", type=int, default=20_000, help="calls per timed in-process loop")
    p.add_argument("--inproc-repeats", type=int, default=15, help="timed loops per variant")
    p.add_argument("--skip", action="append", default=[], choices=("closed", "open", "inproc"),
                   help="leave a phase out (repeatable)")
    p.add_argument("--quick", action="store_true", help="smoke check in < 60 s (3 levels each, 4 s)")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(),
                   help="command that takes `serve ...`")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/governance-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.duration = min(args.duration, 4.0)
        args.users = args.users or CLOSED_USERS_QUICK
        args.rates = args.rates or OPEN_RATES_QUICK
        args.inproc_iters, args.inproc_repeats = 5_000, 5
    args.users = args.users or CLOSED_USERS
    args.rates = args.rates or OPEN_RATES
    args.only = None  # models_bench.provenance() reads it
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"governance-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    doc: dict = {
        "benchmark": "governance",
        "description": ("POST /v1/proxy through one provider limited to rps_limit req/s: closed loop with N users, "
                        "open loop at fixed arrival rates (knee, shedding past the wait ceiling), and the "
                        "in-process cost of governance in meshfast._core"),
        **harness.run_header(argv, started, pb.provenance(args)),
        "config": {
            "workers": args.workers, "testserve_workers": 1, "rps_limit": args.rps_limit,
            "wait_ceiling_s": WAIT_CEILING_S, "duration_s": args.duration, "users": list(args.users),
            "rates_rps": list(args.rates), "settle_between_levels_s": SETTLE_S, "quick": args.quick,
            "proxy_body": pb.PROXY_BODY.decode(), "budget_policy": pb.BUDGET_POLICY,
            "inproc": {"iterations": args.inproc_iters, "repeats": args.inproc_repeats},
        },
        "note": NOTE,
        "error_policy": ("Any answer but 200 with a complete stream or 503 provider_busy, a socket error, or a "
                         "server that dies fails the run (ok=false, exit 1; the JSON is still written)."),
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
    }
    failures: list[str] = []
    if "inproc" not in args.skip:
        print("[bench] in-process governance cost ...", flush=True)
        try:
            doc["in_process"] = phase_in_process(args)
        except BenchError as exc:
            failures.append(str(exc))
    stack: Stack | None = None
    if not {"closed", "open"} <= set(args.skip):
        with tempfile.TemporaryDirectory(prefix="meshfast-governance-bench-") as work:
            try:
                print("[bench] starting testserve, meshfast ...", flush=True)
                stack = start_stack(args, Path(work))
                doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, stack.secrets())) for s in stack.servers()}
                doc["setup"] = stack.setup
                target = proxy_target(stack)
                t_send, t_end, status, err = _call(loadgen.Conn(target.host, target.port), target)
                if status != 200 or err:
                    raise BenchError(f"first proxy call answered {status}: {err}")
                time.sleep(SETTLE_S)
                if "closed" not in args.skip:
                    doc["closed_loop"] = phase_closed(args, stack, target)
                if "open" not in args.skip:
                    doc["open_loop"] = phase_open(args, stack, target)
            except BenchError as exc:
                failures.append(str(exc))
                print(f"[bench] FAILED: {exc}", file=sys.stderr)
            except KeyboardInterrupt:
                failures.append("interrupted")
            finally:
                if stack is not None:
                    stack.stop_into(doc)
    failures += problems_of(doc)
    return harness.finish(doc, failures, started, out_path, "bench", print_tables, indent=2)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the servers on SIGTERM too
    sys.exit(main())
