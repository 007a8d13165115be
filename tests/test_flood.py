"""A bad-key flood: every denial is counted in the logs (merged rows carry `count`), the gateway
keeps answering, and nothing is dropped. CI floods FLOOD_REQUESTS; `make flood` sends a million."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
from conftest import SESSION_ENV, Gateway


def _load_flood() -> Any:
    """bench/flood.py by path: `bench` on sys.path may be tests/bench during a test run."""
    path = Path(__file__).resolve().parent.parent / "bench" / "flood.py"
    spec = importlib.util.spec_from_file_location("meshfast_bench_flood", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


_flood = _load_flood()
flood, request_bytes = _flood.flood, _flood.request_bytes

FLOOD_REQUESTS = int(os.environ.get("FLOOD_REQUESTS", "30000"))


async def _denials(database_url: str) -> tuple[int, int]:
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(
            "SELECT coalesce(sum(count), 0) AS total, count(*) AS rows FROM request_logs "
            "WHERE deny_reason = 'invalid_or_revoked_key'")
        return int(row["total"]), int(row["rows"])
    finally:
        await conn.close()


def test_every_denial_of_a_bad_key_flood_is_counted(fresh_dir: Path) -> None:
    gw = Gateway(fresh_dir / "data", workers=2, env=SESSION_ENV).start()
    try:
        url = f"{gw.base_url}/v1/proxy?model=anything"
        mix = [request_bytes("POST", url, [("authorization", "Bearer mesh_live_" + "x" * 43)], b'{"query":"hi"}')]
        result = asyncio.run(flood(url, mix, FLOOD_REQUESTS, connections=32, pipeline=16, deadline_s=600))
        assert result.errors == 0 and result.statuses == {401: FLOOD_REQUESTS}
        # Still serving: a valid call answers as usual.
        assert gw.client.get("/healthz").status_code == 200
        deadline = time.monotonic() + 60
        total, rows = asyncio.run(_denials(gw.database_url))
        while total < FLOOD_REQUESTS and time.monotonic() < deadline:
            time.sleep(0.5)
            total, rows = asyncio.run(_denials(gw.database_url))
        assert total == FLOOD_REQUESTS, f"{total} denials logged for {FLOOD_REQUESTS} sent"
        assert rows <= FLOOD_REQUESTS
        print(f"flood: {FLOOD_REQUESTS} requests in {result.seconds:.1f} s, {rows} rows "
              f"({FLOOD_REQUESTS - rows} merged)")
    finally:
        gw.stop()
