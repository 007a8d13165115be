"""Log analytics at scale: summaries and drill-down over millions of request_logs rows.

Starts an embedded PostgreSQL, applies meshfast's migrations, writes `--rows` request rows
spread over 30 days (1,000 users, 20 models, every outcome) through the same ingest the gateway
uses (so the hourly rollup is kept by the same trigger), then times, median of `--repeat` runs:
the 30-day summaries (totals, daily series in a time zone, by model, by user, by status, by deny
reason, latency buckets), the paged log list with its total, and one user's 7-day drill-down.
EXPLAIN (ANALYZE, BUFFERS) of each query goes into the JSON (bench/results/logs-<ts>.json), which
opens with the run header every bench writes (command, git sha, build profile, machine, versions)
plus the PostgreSQL server's version and settings that shape the plans.

    python bench/logs_bench.py [--rows 10000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import asyncpg  # noqa: E402

from bench import harness  # noqa: E402
from meshfast.admin import logs  # noqa: E402
from meshfast.store import database  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
CHUNK = 500_000
BUDGET_MS = 200

# One statement per chunk, through the ingest table and its trigger, like the telemetry writer.
GENERATE = """
INSERT INTO request_logs_ingest (id, request_id, created_at, user_id, model_id, model_name, provider_id, route,
                                 outcome, deny_reason, status_code, latency_ms, tokens_in, tokens_out, input_cost,
                                 output_cost, count)
SELECT gen_random_uuid(), 'req_bench_' || g, $1::timestamptz - (random() * interval '30 days'),
       ('00000000-0000-4000-8000-' || lpad((g % 1000)::text, 12, '0'))::uuid,
       ('00000000-0000-4000-9000-' || lpad((g % 20)::text, 12, '0'))::uuid, 'model-' || (g % 20),
       ('00000000-0000-4000-a000-' || lpad((g % 4)::text, 12, '0'))::uuid, 'proxy',
       CASE WHEN g % 50 = 0 THEN 'denied' WHEN g % 33 = 0 THEN 'upstream_error' ELSE 'success' END,
       CASE WHEN g % 50 = 0 THEN 'budget_exceeded' END,
       CASE WHEN g % 50 = 0 THEN 429 WHEN g % 33 = 0 THEN 502 ELSE 200 END,
       (random() * 3000)::int, (random() * 2000)::int, (random() * 800)::int,
       round((random() * 0.01)::numeric, 9), round((random() * 0.03)::numeric, 9), 1
FROM generate_series($2::bigint, $3::bigint) AS g
"""


async def _time(fn, repeat: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    samples, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = await fn()
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 1), result


async def _explain(conn: asyncpg.Connection, sql: str, *args: object) -> str:
    rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *args)
    return "\n".join(r[0] for r in rows)


async def run(args: argparse.Namespace, url: str) -> dict:
    await database.migrate(url)
    conn = await asyncpg.connect(url)
    out: dict = {"rows": args.rows}
    try:
        out["postgres"] = {name: await conn.fetchval(f"SHOW {name}") for name in
                           ("server_version", "shared_buffers", "work_mem", "jit", "max_parallel_workers_per_gather")}
        now = dt.datetime.now(dt.UTC)
        await conn.execute("SELECT meshfast_ensure_log_partitions(1)")
        # Daily partitions for the past 31 days, as the leader would have made them.
        for day in range(31, -1, -1):
            d = (now - dt.timedelta(days=day)).date()
            part = f"request_logs_{d.strftime('%Y%m%d')}"
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {part} PARTITION OF request_logs FOR VALUES FROM "
                f"('{d.isoformat()} 00:00+00') TO ('{(d + dt.timedelta(days=1)).isoformat()} 00:00+00')")
        started = time.perf_counter()
        for low in range(0, args.rows, CHUNK):
            await conn.execute(GENERATE, now, low, min(low + CHUNK, args.rows) - 1)
            print(f"[logs] {min(low + CHUNK, args.rows):,} rows", flush=True)
        out["load_s"] = round(time.perf_counter() - started, 1)
        await conn.execute("VACUUM ANALYZE request_logs")
        await conn.execute("VACUUM ANALYZE request_rollup_hourly")
        out["rollup_rows"] = await conn.fetchval("SELECT count(*) FROM request_rollup_hourly")
        assert await conn.fetchval("SELECT sum(calls) FROM request_rollup_hourly") == args.rows
        user = "00000000-0000-4000-8000-000000000007"
        month = urlencode({"from": (now - dt.timedelta(days=30)).isoformat(), "to": now.isoformat()})
        week = urlencode({"from": (now - dt.timedelta(days=7)).isoformat(), "to": now.isoformat()})
        cases = {
            "summary_30d_all": lambda: logs.summary(conn, logs.Query(f"{month}&tz=Europe/Paris", summary=True)),
            "summary_30d_one_user": lambda: logs.summary(conn, logs.Query(f"{month}&user_id={user}", summary=True)),
            "list_1d_page1": lambda: logs.list_logs(conn, logs.Query(None)),
            "drilldown_user_7d_page1": lambda: logs.list_logs(conn, logs.Query(f"{week}&user_id={user}")),
            "drilldown_user_7d_page5": lambda: logs.list_logs(conn, logs.Query(f"{week}&user_id={user}&page=5")),
        }
        timings = {}
        for name, fn in cases.items():
            median_ms, result = await _time(fn, args.repeat)
            timings[name] = {"median_ms": median_ms, "under_budget": median_ms < BUDGET_MS}
            if name.startswith(("list", "drill")):
                timings[name]["total"] = result["total"]  # type: ignore[index]
            print(f"[logs] {name}: {median_ms} ms", flush=True)
        out["timings_ms"] = timings
        since = now - dt.timedelta(days=7)
        out["explain"] = {
            "summary_by_model": await _explain(
                conn, "SELECT model_id, sum(calls), sum(input_cost + output_cost) FROM request_rollup_hourly "
                      "WHERE hour >= $1 AND hour < $2 GROUP BY 1", now - dt.timedelta(days=30), now),
            "drilldown_page": await _explain(
                conn, f"SELECT {logs.LIST_COLUMNS} FROM request_logs WHERE created_at >= $1 AND created_at < $2 "
                      "AND user_id = $3 ORDER BY created_at DESC, request_id DESC LIMIT 50 OFFSET 200",
                since, now, user),
            "drilldown_total_edges": await _explain(
                conn, "SELECT count(*) FROM request_logs WHERE created_at >= $1 AND created_at < $2 AND user_id = $3",
                since, since.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1), user),
        }
    finally:
        await conn.close()
    return out


def provenance() -> dict:
    """The run header's provenance (git sha, build profile, CPU, host, versions) for an
    in-process bench: meshfast is imported from this tree, PostgreSQL is pgserver's."""
    prov = harness.provenance(argparse.Namespace(meshfast_cmd=harness.default_meshfast_cmd(), only=None),
                              ("asyncpg", "pgserver"))
    prov["meshfast_import"] = "working tree (ROOT on sys.path)"
    return prov


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    doc: dict = {"benchmark": "logs", **harness.run_header(argv, started, provenance()),
                 "config": {"rows": args.rows, "repeat": args.repeat, "chunk": CHUNK, "cpu_count": os.cpu_count()},
                 "budget_ms": BUDGET_MS}
    with tempfile.TemporaryDirectory(prefix="meshfast-logs-bench-") as work:
        pg = database.EmbeddedPostgres(Path(work) / "pg")
        url = pg.start()
        try:
            doc.update(asyncio.run(run(args, url)))
        finally:
            pg.stop()
    doc["total_s"] = round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1)
    out = args.out or RESULTS_DIR / f"logs-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"[logs] wrote {out}")
    return 0 if all(t["under_budget"] for t in doc["timings_ms"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
