"""Row ingest under concurrency: batches from several workers at once, their rollup keys
overlapping in opposite orders, all land; none is rolled back as a deadlock victim."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
from conftest import Gateway

from meshfast._core import request_id
from meshfast.telemetry import COLUMNS, Row, to_record

WRITERS = 4
ROUNDS = 15
USERS = 40


def test_concurrent_ingest_batches_all_land(gateway: Gateway) -> None:
    users = [str(uuid.uuid4()) for _ in range(USERS)]
    now_ms = time.time_ns() // 1_000_000

    async def writer(n: int) -> int:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            for r in range(ROUNDS):
                order = users if (n + r) % 2 else users[::-1]
                records = [to_record(Row(request_id=request_id(), created_ms=now_ms, route="proxy", outcome="denied",
                                         status_code=403, user_id=u, model_name=f"ingest-{i % 3}",
                                         deny_reason="model_not_permitted"))
                           for i, u in enumerate(order)]
                await conn.copy_records_to_table("request_logs_ingest", records=records, columns=COLUMNS)
            return ROUNDS * USERS
        finally:
            await conn.close()

    async def run() -> tuple[list[int], int, int]:
        written = await asyncio.gather(*(writer(n) for n in range(WRITERS)))
        conn = await asyncpg.connect(gateway.database_url)
        try:
            ids = [uuid.UUID(u) for u in users]
            logged = await conn.fetchval("SELECT count(*) FROM request_logs WHERE user_id = ANY($1)", ids)
            rolled = await conn.fetchval(
                "SELECT coalesce(sum(calls), 0) FROM request_rollup_daily_user WHERE user_id = ANY($1)", ids)
            return written, logged, rolled
        finally:
            await conn.close()

    written, logged, rolled = asyncio.run(run())
    assert sum(written) == logged == rolled == WRITERS * ROUNDS * USERS
