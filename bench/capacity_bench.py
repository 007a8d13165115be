"""Raw capacity of meshfast (the Mesh write-up's Figure 3 and 4a) and the bad-key flood's accounting.

One run starts `meshfast serve --workers N` (embedded PostgreSQL, fresh data dir, provisioned as
`models_bench.py` does: one provider, five models, one user with five grants) and measures with wrk,
one target after the other, each after a warm-up kept apart:

1. `GET /healthz` (no auth, the middleware floor), `--connections` (default 100);
2. `GET /v1/models` with the user's key (hash, lookup, JSON for five models);
3. `GET /v1/models` with an invalid `mesh_live_` key: every answer a 401 (wrk counts them as
   `errors.status`; here that count must equal the requests and no other error may occur);
4. held connections: `GET /healthz` and `GET /v1/models` with `--held` connections (default 5000 and
   10000), wrk `-t2`; the worker RSS and the established sockets on meshfast's port are sampled every
   0.5 s during each run (peak and idle recorded: memory per open socket, Figure 4a);
5. a probe at 20 req/s, one request at a time: /healthz, /v1/models and the invalid-key 401, each on a
   kept-alive connection and on a new connection per request (rejection latency, cost of a connection);
6. a bad-key flood of exactly `--flood-requests` requests (`bench/flood.py`: pipelined, every answer
   read and counted), then the denials in `request_logs` (merged rows carry `count`) until they add
   up to what was sent or 60 s pass: telemetry rows written and denials lost.

`ulimit -n` is raised to the hard limit for this process and what it starts. Every phase records the
CPU split (meshfast, its PostgreSQL, the client) like the other benches. Writes
bench/results/capacity-<timestamp>.json.

    python bench/capacity_bench.py [--workers 2] [--duration 10] [--held 5000,10000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
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

from bench import harness  # noqa: E402
from bench import models_bench as mb  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402
from bench.flood import flood, request_bytes  # noqa: E402
from bench.harness import BenchError  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
BAD_KEY = "mesh_live_" + "x" * 43
SAMPLE_EVERY_S = 0.5
ROWS_TIMEOUT_S = 60.0

NOTE = (
    "wrk, meshfast (+ its embedded PostgreSQL) share this machine's CPUs unpinned with whatever else runs "
    "on it (each phase's cpu says how much that was): every req/s is a lower bound for a server with "
    "dedicated cores. Held-connection runs open all connections at once; RSS is the sum over meshfast's "
    "Granian workers and its main process (PostgreSQL excluded); sockets are ESTABLISHED TCP connections "
    "with meshfast's port as local port, from /proc/net/tcp{,6}."
)


SOMAXCONN = Path("/proc/sys/net/core/somaxconn")
# meshfast's own default (MESHFAST_BACKLOG); the kernel caps any listen backlog at somaxconn.
DEFAULT_BACKLOG = 16384


def raise_somaxconn(wanted: int) -> dict:
    """Lift net.core.somaxconn to `wanted` for the run when it is lower and writable (root), so the
    listen backlog meshfast asks for is the one it gets; `restore_somaxconn` puts it back."""
    try:
        before = int(SOMAXCONN.read_text())
    except (OSError, ValueError):
        return {"before": None, "after": None, "raised": False}
    raised = False
    if before < wanted:
        try:
            SOMAXCONN.write_text(str(wanted))
            raised = True
        except OSError:
            pass
    after = int(SOMAXCONN.read_text())
    backlog = int(os.environ.get("MESHFAST_BACKLOG") or DEFAULT_BACKLOG)
    return {"before": before, "after": after, "raised": raised, "meshfast_backlog": backlog,
            "effective_backlog": min(backlog, after)}


def restore_somaxconn(state: dict) -> None:
    if state.get("raised"):
        try:
            SOMAXCONN.write_text(str(state["before"]))
        except OSError:
            pass


def meshfast_pids(server: harness.Server) -> list[int]:
    import psutil

    root = psutil.Process(server.proc.pid)
    out = [root.pid]
    for p in root.children(recursive=True):
        try:
            if "postgres" not in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def rss_mb(pids: list[int]) -> float:
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            pass
    return round(total / (1 << 20), 2)


def established_on(port: int) -> int:
    """ESTABLISHED sockets whose local port is `port` (server side of each client connection)."""
    hexport = f":{port:04X}"
    n = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split(None, 4)
                    if parts[1].endswith(hexport) and parts[3] == "01":
                        n += 1
        except OSError:
            pass
    return n


class Sampler:
    """RSS and open sockets every SAMPLE_EVERY_S in a thread; peak values and the series."""

    def __init__(self, pids: list[int], port: int) -> None:
        self.pids, self.port = pids, port
        self.series: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.series.append((round(time.monotonic() - self.t0, 2), rss_mb(self.pids), established_on(self.port)))
            self._stop.wait(SAMPLE_EVERY_S)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def report(self) -> dict:
        return {"peak_rss_mb": max((s[1] for s in self.series), default=None),
                "peak_sockets": max((s[2] for s in self.series), default=None),
                "series": self.series}


def wrk(args, live: mb.Live, groups: pb.Groups, path: str, headers: dict[str, str], connections: int,
        threads: int, pids: list[int], port: int) -> dict:
    base = live.url.rsplit("/v1/models", 1)[0]
    url = base + path

    def argv(duration_s: int) -> list[str]:
        a = ["wrk", "--threads", str(threads), "--connections", str(connections), "--duration", f"{duration_s}s",
             "--timeout", harness.WRK_TIMEOUT, "--script", str(harness.WRK_LUA)]
        for k, v in headers.items():
            a += ["--header", f"{k}: {v}"]
        return a + [url]

    run: dict = {"path": path, "connections": connections, "threads": threads}
    if args.warmup > 0:
        warm = harness.run_wrk(argv(args.warmup), args.warmup)
        warm.pop("stdout", None)
        run["warmup"] = warm
    run["idle_rss_mb"] = rss_mb(pids)
    meter = pb.CpuMeter(groups)
    with Sampler(pids, port) as sampler:
        result = harness.run_wrk(argv(args.duration), args.duration)
    run["cpu"] = meter.stop()
    run["resources"] = sampler.report()
    run["wrk_command"] = shlex.join(harness.redact(argv(args.duration), live.secrets))
    run["wrk_stdout"] = result.pop("stdout")
    run["wrk"] = result
    seconds = result["duration_us"] / 1e6
    run["requests_per_s"] = round(result["requests"] / seconds, 1) if seconds > 0 else 0.0
    run["latency_p50_ms"] = result["latency_us"]["p50"] / 1000
    run["latency_p99_ms"] = result["latency_us"]["p99"] / 1000
    run["socket_errors"] = {k: v for k, v in result["errors"].items() if k != "status"}
    run["status_errors"] = result["errors"]["status"]
    live.server.check_alive()
    return run


async def _denials(data_dir: str, expected: int) -> dict:
    import asyncpg

    conn = await asyncpg.connect(f"postgresql://postgres:@/postgres?host={data_dir}/pg")
    try:
        t0 = time.monotonic()
        while True:
            row = await conn.fetchrow(
                "SELECT coalesce(sum(count), 0) AS total, count(*) AS rows FROM request_logs "
                "WHERE deny_reason = 'invalid_or_revoked_key'")
            total = int(row["total"])
            if total >= expected or time.monotonic() - t0 > ROWS_TIMEOUT_S:
                return {"expected": expected, "denials_logged": total, "rows": int(row["rows"]),
                        "lost": expected - total, "wait_s": round(time.monotonic() - t0, 2), "ok": total == expected}
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


def phase_probe(args, live: mb.Live) -> dict:
    """Unloaded latency, one request at a time: keep-alive vs a new connection per request (Figure 5b, c).

    /healthz, authenticated /v1/models and the invalid-key 401, `--probe-count` each, alternating, with
    a pause between requests so that each meets an idle server (the Mesh write-up's 20 req/s).
    """
    from bench import loadgen

    base = live.url.rsplit("/v1/models", 1)[0]
    host, port = "127.0.0.1", int(base.rsplit(":", 1)[1])
    reqs = {
        "healthz": request_bytes("GET", base + "/healthz", [], b""),
        "models": request_bytes("GET", base + "/v1/models", list(live.headers.items()), b""),
        "invalid_key": request_bytes("GET", base + "/v1/models", [("authorization", f"Bearer {BAD_KEY}")], b""),
    }
    want = {"healthz": 200, "models": 200, "invalid_key": 401}
    samples: dict[str, list[int]] = {f"{n}_{c}": [] for n in reqs for c in ("keepalive", "new_connection")}
    statuses: dict[str, dict[str, int]] = {k: {} for k in samples}
    kept = {n: loadgen.Conn(host, port) for n in reqs}
    try:
        for _ in range(args.probe_count):
            for name, raw in reqs.items():
                target = loadgen.Target(name, host, port, raw)
                for mode in ("keepalive", "new_connection"):
                    key = f"{name}_{mode}"
                    if mode == "keepalive":
                        _, sample, _ = kept[name].exchange(target)
                        total = sample.last_ns
                    else:
                        # NOTE: timed from before connect(): the handshake and Granian's accept are the point.
                        t0 = time.perf_counter_ns()
                        conn = loadgen.Conn(host, port)
                        try:
                            t_send, sample, _ = conn.exchange(target)
                        finally:
                            conn.close()
                        total = t_send - t0 + sample.last_ns
                    samples[key].append(total)
                    st = str(sample.status)
                    statuses[key][st] = statuses[key].get(st, 0) + 1
                    time.sleep(1 / 20)
    finally:
        for c in kept.values():
            c.close()
    out = {"count": args.probe_count, "pace_rps": 20, "runs": {}}
    for name in reqs:
        for mode in ("keepalive", "new_connection"):
            key = f"{name}_{mode}"
            out["runs"][key] = {"path": name, "connection": mode, "statuses": statuses[key],
                                "expected_status": want[name], "total_us": loadgen.summarize_us(samples[key])}
    return out


def phase_flood(args, live: mb.Live, groups: pb.Groups) -> dict:
    base = live.url.rsplit("/v1/models", 1)[0]
    url = f"{base}/v1/proxy?model=anything"
    mix = [request_bytes("POST", url, [("authorization", f"Bearer {BAD_KEY}")], b'{"query":"hi"}')]
    meter = pb.CpuMeter(groups)
    result = asyncio.run(flood(url, mix, args.flood_requests, 32, 16, deadline_s=600))
    cpu = meter.stop()
    out = {"requests": args.flood_requests, "connections": 32, "pipeline": 16, "sent": result.sent,
           "statuses": {str(k): v for k, v in result.statuses.items()}, "socket_errors": result.errors,
           "seconds": round(result.seconds, 2),
           "requests_per_s": round(result.sent / result.seconds, 1) if result.seconds else None, "cpu": cpu}
    out["healthz_after"] = harness.http_request("GET", base + "/healthz", timeout_s=5.0)[0]
    out["telemetry"] = asyncio.run(_denials(live.temp_dir, args.flood_requests))
    out["telemetry_counters"] = pb.settled_telemetry(base, live.secrets[0])
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers for meshfast")
    p.add_argument("--duration", type=int, default=10, help="measured wrk seconds per target")
    p.add_argument("--warmup", type=int, default=2, help="wrk seconds before each, kept apart (0: none)")
    p.add_argument("--connections", type=int, default=100, help="wrk connections for the throughput runs")
    p.add_argument("--threads", type=int, default=1, help="wrk threads for the throughput runs")
    p.add_argument("--held", type=lambda s: tuple(int(x) for x in s.split(",") if x), default=(5000, 10000),
                   help="held-connection counts (comma-separated; empty: none)")
    p.add_argument("--flood-requests", type=int, default=200_000, help="bad-key requests in the flood (0: none)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="MESHFAST_MAX_CONNECTIONS for the server (default: meshfast's own, 1024); Granian then "
                        "admits twice that per instance before the listen backlog")
    p.add_argument("--probe-count", type=int, default=200, help="sequential requests per probe (0: none)")
    p.add_argument("--quick", action="store_true", help="smoke check (3 s runs, 1,000 held, 20,000 flood)")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd())
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/capacity-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.held, args.flood_requests = 3, 1, (1000,), 20_000
        args.probe_count = min(args.probe_count, 40)
    args.only = None  # models_bench.provenance() reads it
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"capacity-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    nofile = harness.raise_nofile()
    somaxconn = raise_somaxconn(DEFAULT_BACKLOG)
    if args.max_connections:
        # NOTE: read by `meshfast serve` (mb.start_meshfast copies this environment).
        os.environ["MESHFAST_MAX_CONNECTIONS"] = str(args.max_connections)
    doc: dict = {
        "benchmark": "capacity",
        "description": ("Raw capacity of meshfast: /healthz, authenticated /v1/models, invalid-key 401s, "
                        "held connections with RSS and sockets, and a bad-key flood's denial accounting"),
        **harness.run_header(argv, started, harness.provenance(args)),
        "config": {"workers": args.workers, "duration_s": args.duration, "warmup_s": args.warmup,
                   "connections": args.connections, "threads": args.threads, "held": list(args.held),
                   "flood_requests": args.flood_requests, "quick": args.quick, "nofile": nofile,
                   "somaxconn": somaxconn,
                   "meshfast_max_connections": os.environ.get("MESHFAST_MAX_CONNECTIONS", "default (1024)")},
        "note": NOTE,
        "error_policy": ("A socket error in a throughput run, a non-2xx answer where 200 is expected, anything but "
                         "401 on the invalid-key run, or a flood answer that is not 401 fails the run (ok=false, "
                         "exit 1; the JSON is still written). Held-connection runs record their socket errors "
                         "without failing (they find the limits)."),
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
        "runs": {},
    }
    failures: list[str] = []
    live: mb.Live | None = None
    with tempfile.TemporaryDirectory(prefix="meshfast-capacity-") as work:
        try:
            print("[capacity] starting meshfast ...", flush=True)
            live = mb.start_meshfast(args, Path(work))
            groups = pb.Groups(sessions={"meshfast": live.server.proc.pid},
                               data_dirs={"meshfast_postgres": live.temp_dir})
            port = int(live.url.split(":")[2].split("/")[0])
            pids = meshfast_pids(live.server)
            doc["server"] = shlex.join(harness.redact(live.server.argv, live.secrets))
            doc["setup"] = live.setup
            doc["idle"] = {"rss_mb": rss_mb(pids), "processes": len(pids)}
            bad = {"Authorization": f"Bearer {BAD_KEY}"}
            plan = [("healthz", "/healthz", {}, args.connections, args.threads),
                    ("models", "/v1/models", live.headers, args.connections, args.threads),
                    ("invalid_key", "/v1/models", bad, args.connections, args.threads)]
            for n in args.held:
                plan += [(f"held_healthz_{n}", "/healthz", {}, n, 2),
                         (f"held_models_{n}", "/v1/models", live.headers, n, 2)]
            for name, path, headers, conns, threads in plan:
                print(f"[capacity] {name}: wrk -t{threads} -c{conns} -d{args.duration}s {path} ...", flush=True)
                run = wrk(args, live, groups, path, headers, conns, threads, pids, port)
                doc["runs"][name] = run
                errs = run["socket_errors"]
                if name == "invalid_key":
                    if run["status_errors"] != run["wrk"]["requests"]:
                        failures.append(f"invalid_key: {run['status_errors']} 4xx of {run['wrk']['requests']}")
                elif run["status_errors"]:
                    failures.append(f"{name}: {run['status_errors']} non-2xx answers")
                if any(errs.values()) and not name.startswith("held_"):
                    failures.append(f"{name}: socket errors {errs}")
                # Let the closed connections leave ESTABLISHED, so the next run's socket count is its own.
                deadline = time.monotonic() + 15
                while established_on(port) > 0 and time.monotonic() < deadline:
                    time.sleep(0.2)
            if args.probe_count:
                print(f"[capacity] probe: {args.probe_count} x 6 sequential requests at 20 req/s ...", flush=True)
                doc["probe"] = phase_probe(args, live)
                for key, r in doc["probe"]["runs"].items():
                    if set(r["statuses"]) != {str(r["expected_status"])}:
                        failures.append(f"probe {key}: statuses {r['statuses']}")
            if args.flood_requests:
                print(f"[capacity] flood: {args.flood_requests} bad-key requests ...", flush=True)
                doc["flood"] = fl = phase_flood(args, live, groups)
                if fl["statuses"] != {"401": args.flood_requests} or fl["socket_errors"]:
                    failures.append(f"flood: statuses {fl['statuses']}, socket errors {fl['socket_errors']}")
                if not fl["telemetry"]["ok"]:
                    failures.append(f"flood: {fl['telemetry']['lost']} denials not in request_logs")
            doc["after"] = {"rss_mb": rss_mb(pids)}
        except (BenchError, OSError, RuntimeError) as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            print(f"[capacity] FAILED: {exc}", file=sys.stderr)
        except KeyboardInterrupt:
            failures.append("interrupted")
        finally:
            if live is not None:
                doc["server_log_tail"] = harness.redact([live.server.log_tail(3000)], live.secrets)[0]
                doc["stop"] = mb.cleanup_meshfast(live)
            restore_somaxconn(somaxconn)
    doc["failures"] = failures
    doc["ok"] = not failures
    doc["total_s"] = round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\n{'run':<22}{'conns':>7}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'peak RSS':>10}{'sockets':>9}  errors")
    for name, r in doc["runs"].items():
        res = r["resources"]
        print(f"{name:<22}{r['connections']:>7}{r['requests_per_s']:>10,.0f}{r['latency_p50_ms']:>9.2f}"
              f"{r['latency_p99_ms']:>9.2f}{res['peak_rss_mb'] or 0:>10.1f}{res['peak_sockets'] or 0:>9}  "
              f"{ {k: v for k, v in r['socket_errors'].items() if v} }")
    if "flood" in doc:
        fl = doc["flood"]
        print(f"flood: {fl['sent']} sent in {fl['seconds']} s ({fl['requests_per_s']} req/s), {fl['statuses']}, "
              f"telemetry {fl['telemetry']}")
    if failures:
        print("\n[capacity] failures:\n  " + "\n  ".join(f[:500] for f in failures), file=sys.stderr)
    print(f"\n[capacity] wrote {out_path} in {doc['total_s']:.0f} s" + ("" if doc["ok"] else " (FAILED run)"))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the server on SIGTERM too
    sys.exit(main())
