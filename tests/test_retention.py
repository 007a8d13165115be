"""Retention: whole daily partitions older than LOG_RETENTION_DAYS are dropped, with their
rollup rows; recent data stays; expired admin sessions are swept."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import asyncpg
from conftest import Gateway

from meshfast.leader import apply_retention


def test_old_partitions_rollups_and_sessions_go_recent_data_stays(gateway: Gateway) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            old_day = (dt.datetime.now(dt.UTC) - dt.timedelta(days=45)).date()
            part = f"request_logs_{old_day.strftime('%Y%m%d')}"
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {part} PARTITION OF request_logs FOR VALUES FROM "
                f"('{old_day} 00:00+00') TO ('{old_day + dt.timedelta(days=1)} 00:00+00')")
            old_at = dt.datetime.combine(old_day, dt.time(12), dt.UTC)
            await conn.execute(
                "INSERT INTO request_logs_ingest (id, request_id, created_at, route, outcome, status_code) "
                "VALUES ($1, 'req_old_retention', $2, 'proxy', 'success', 200)", uuid.uuid4(), old_at)
            await conn.execute(
                "INSERT INTO request_logs_ingest (id, request_id, created_at, route, outcome, status_code) "
                "VALUES ($1, 'req_new_retention', now(), 'proxy', 'success', 200)", uuid.uuid4())
            assert await conn.fetchval("SELECT count(*) FROM request_rollup_hourly_all WHERE hour < $1",
                                       old_at + dt.timedelta(hours=1)) >= 1
            admin = await conn.fetchval("INSERT INTO admins (email, password_hash, created_by) "
                                        "VALUES ($1, 'x', 'test') RETURNING id", f"r-{uuid.uuid4()}@example.com")
            await conn.execute("INSERT INTO admin_sessions (admin_id, token_hash, csrf_hash, expires_at) "
                               "VALUES ($1, $2, 'c', now() - interval '1 hour')", admin, uuid.uuid4().hex)
            await apply_retention(conn, 30)
            assert await conn.fetchval("SELECT to_regclass($1)", part) is None
            assert await conn.fetchval("SELECT count(*) FROM request_logs WHERE request_id = 'req_old_retention'") == 0
            assert await conn.fetchval("SELECT count(*) FROM request_logs WHERE request_id = 'req_new_retention'") == 1
            for table, column in (("request_rollup_hourly", "hour"), ("request_rollup_hourly_all", "hour")):
                assert await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {column} < now() - interval '31 days'") == 0
            assert await conn.fetchval("SELECT count(*) FROM admin_sessions WHERE admin_id = $1", admin) == 0
            gateway_role = await conn.fetchval("SELECT has_function_privilege('meshfast_gateway', "
                                               "'meshfast_retention(integer)', 'EXECUTE')")
            assert gateway_role is True
        finally:
            await conn.close()
    asyncio.run(run())
