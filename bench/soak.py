"""Soak: a million mixed requests against `meshfast serve`, worker RSS sampled every second.

Starts testserve and meshfast (as the proxy bench does), then sends, in a fixed rotation, Mesh
`/v1/proxy` streams on three families, OpenAI Chat and Anthropic Messages callers on other
families, bad keys and unknown models, counting every answer by status. Reports requests/s, the
statuses, the RSS series and its least-squares slope after warm-up (the leak rate), and checks
that every request left exactly its row. Writes bench/results/soak-<timestamp>.json.

    python bench/soak.py [--requests 1000000] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402
from bench.flood import flood, leak_rate_mb_per_min, request_bytes  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"


def _mix(base: str, key: str) -> list[bytes]:
    auth = [("authorization", f"Bearer {key}"), ("content-type", "application/json")]
    proxy = b'{"query":"hello","max_tokens":32}'
    mix = [request_bytes("POST", f"{base}/v1/proxy?model=b-{family}", auth, proxy)
           for family in ("anthropic", "openai", "gemini")]
    mix.append(request_bytes("POST", f"{base}/v1/chat/completions", auth,
                             b'{"model":"b-anthropic","messages":[{"role":"user","content":"hello"}],"stream":true}'))
    mix.append(request_bytes("POST", f"{base}/v1/messages", [("x-api-key", key), ("content-type", "application/json")],
                             b'{"model":"b-openai","max_tokens":32,"messages":[{"role":"user","content":"hello"}]}'))
    mix.append(request_bytes("POST", f"{base}/v1/proxy?model=b-openai",
                             [("authorization", "Bearer mesh_live_" + "x" * 43)], proxy))
    mix.append(request_bytes("POST", f"{base}/v1/proxy?model=no-such-model", auth, proxy))
    return mix


async def _rows_logged(data_dir: str | None, expected: int, timeout_s: float = 120) -> dict:
    """Waits for the drain, then sums `count` over the rows: every request must have left one."""
    import asyncpg

    conn = await asyncpg.connect(f"postgresql://postgres:@/postgres?host={data_dir}/pg")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            row = await conn.fetchrow("SELECT coalesce(sum(count), 0) AS total, count(*) AS n FROM request_logs")
            if row["total"] >= expected or time.monotonic() > deadline:
                return {"expected": expected, "logged": int(row["total"]), "rows": int(row["n"]),
                        "ok": int(row["total"]) == expected}
            await asyncio.sleep(1.0)
    finally:
        await conn.close()


def _warnings(stack: pb.Stack, limit: int = 40) -> list[str]:
    """meshfast's warning and error lines (the telemetry pipeline says there when it spools)."""
    try:
        text = stack.meshfast.log_path.read_text(errors="replace") if stack.meshfast else ""
    except OSError:
        return []
    lines = [line for line in text.splitlines() if "WARNING" in line.upper() or "ERROR" in line.upper()]
    return harness.redact(lines[:limit], stack.secrets())


def _worker_pids(server: harness.Server) -> list[int]:
    import psutil

    root = psutil.Process(server.proc.pid)
    return [p.pid for p in root.children(recursive=True)
            if "postgres" not in " ".join(p.cmdline()) and "meshfast" in " ".join(p.cmdline())]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--pipeline", type=int, default=4)
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(fallback=False))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    args.only, args.meshfast_client = None, "native"
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"soak-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    doc: dict = {"benchmark": "soak", **harness.run_header(argv, started, harness.provenance(args)),
                 "config": {"requests": args.requests, "workers": args.workers, "connections": args.connections,
                            "pipeline": args.pipeline}}
    with tempfile.TemporaryDirectory(prefix="meshfast-soak-") as work:
        stack = pb.start_stack(args, Path(work), forwarder=False)
        try:
            pids = _worker_pids(stack.meshfast)
            mix = _mix(stack.meshfast_url, stack.user_key)
            print(f"[soak] {args.requests} requests over {len(mix)} kinds, workers {pids} ...", flush=True)
            result = asyncio.run(flood(stack.meshfast_url, mix, args.requests, args.connections, args.pipeline,
                                       rss_pids=pids, deadline_s=3600))
            doc["result"] = {
                "sent": result.sent, "statuses": dict(result.statuses), "errors": result.errors,
                "seconds": round(result.seconds, 1),
                "requests_per_s": round(result.sent / result.seconds, 1) if result.seconds else None,
                "rss_mb_start": result.rss_mb[0][1] if result.rss_mb else None,
                "rss_mb_end": result.rss_mb[-1][1] if result.rss_mb else None,
                "leak_mb_per_min": leak_rate_mb_per_min(result.rss_mb),
                "rss_mb_series": result.rss_mb,
            }
            doc["rows"] = asyncio.run(_rows_logged(stack.data_dir, args.requests))
            doc["telemetry"] = pb.settled_telemetry(stack.meshfast_url, stack.admin_token)
        finally:
            doc["server_warnings"] = _warnings(stack)
            stack.stop_into(doc)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    r = doc["result"]
    print(f"[soak] {r['sent']} requests in {r['seconds']} s ({r['requests_per_s']} req/s), statuses {r['statuses']}, "
          f"RSS {r['rss_mb_start']} -> {r['rss_mb_end']} MiB, leak {r['leak_mb_per_min']} MiB/min, "
          f"rows {doc['rows']}, telemetry {doc.get('telemetry')}; wrote {out_path}")
    return 0 if r["errors"] == 0 and doc["rows"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
