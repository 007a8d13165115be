"""Request rows: recorded before a response ends, written to PostgreSQL in batches with COPY.

A row enters the shared-memory ring (or, if the ring is full, this worker's spool) before the
last byte of its response; every live worker drains the ring, so the death of the worker that
served a request loses no completed row. A drain writes up to 500 rows with one COPY, at least
every second. When the database is away, rows wait in memory and then in spool files in the
data dir, which are replayed when it is back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import ipaddress
import logging
import os
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from meshfast import useragent

log = logging.getLogger("meshfast.telemetry")

BATCH_ROWS = 500
FLUSH_INTERVAL_S = 1.0
# Rows held in memory while the database is away, before they go to a spool file.
MEMORY_LIMIT_ROWS = 20_000
NANOS = Decimal(1_000_000_000)

_CROCKFORD = {c: i for i, c in enumerate("0123456789ABCDEFGHJKMNPQRSTVWXYZ")}


class Row(msgspec.Struct, array_like=True, omit_defaults=True):
    """One request row as it travels through the ring (compact: an array, not a map)."""

    request_id: str
    created_ms: int
    route: str
    outcome: str
    status_code: int
    latency_ms: int = 0
    ttfb_ms: int | None = None
    mesh_key_id: str | None = None
    user_id: str | None = None
    provider_id: str | None = None
    model_id: str | None = None
    model_name: str | None = None
    requested_model: str | None = None
    deny_reason: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    usage_estimated: bool = False
    input_cost_nano: int = 0
    output_cost_nano: int = 0
    web_searches: int = 0
    generated_seconds: float | None = None
    source_ip: str | None = None
    user_agent: str | None = None
    count: int = 1


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Row)

COLUMNS = (
    "id", "request_id", "created_at", "mesh_key_id", "user_id", "provider_id", "model_id", "model_name",
    "requested_model", "route", "outcome", "deny_reason", "status_code", "latency_ms", "ttfb_ms",
    "tokens_in", "tokens_out", "cache_read_tokens", "cache_write_tokens", "usage_estimated",
    "input_cost", "output_cost", "web_searches", "generated_seconds", "source_ip", "user_agent",
    "browser", "browser_version", "os", "os_version", "device_type", "count",
)


def row_uuid(request_id: str) -> uuid.UUID:
    """The row id: the request's ULID read as a (time-ordered) UUID."""
    value = 0
    for char in request_id[4:]:
        value = value * 32 + _CROCKFORD[char]
    return uuid.UUID(int=value & ((1 << 128) - 1))


def _uuid(value: str | None) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(value)


def _ip(value: str | None) -> Any:
    if not value:
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def to_record(row: Row) -> tuple[Any, ...]:
    device = useragent.parse(row.user_agent)
    return (
        row_uuid(row.request_id), row.request_id, dt.datetime.fromtimestamp(row.created_ms / 1000, dt.UTC),
        _uuid(row.mesh_key_id), _uuid(row.user_id), _uuid(row.provider_id), _uuid(row.model_id),
        row.model_name, row.requested_model, row.route, row.outcome, row.deny_reason, row.status_code,
        row.latency_ms, row.ttfb_ms, row.tokens_in, row.tokens_out, row.cache_read_tokens,
        row.cache_write_tokens, row.usage_estimated, Decimal(row.input_cost_nano) / NANOS,
        Decimal(row.output_cost_nano) / NANOS, row.web_searches,
        None if row.generated_seconds is None else Decimal(str(round(row.generated_seconds, 2))),
        _ip(row.source_ip), row.user_agent, device.browser, device.browser_version, device.os,
        device.os_version, device.device_type, row.count,
    )


class Telemetry:
    """Per-worker side of the row pipeline: record() on the request path, drain() in a task."""

    def __init__(self, segment: Any, pool: asyncpg.Pool, spool_dir: Path) -> None:
        self._segment = segment
        self._ring = hasattr(segment, "push_row")
        self._pool = pool
        self._spool_dir = spool_dir
        self._local: collections.deque[bytes] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.written_total = 0
        self.spooled_total = 0
        self.copy_failures_total = 0

    def record(self, row: Row) -> None:
        """Hand one row over; never blocks and never waits on the database."""
        data = _encoder.encode(row)
        if not (self._ring and self._segment.push_row(data)):
            self._local.append(data)
        if len(self._local) >= BATCH_ROWS:
            self._wake.set()

    def start(self) -> None:
        self._spool_dir.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._drain_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        # Final flush: what the database does not take now goes to the spool.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), timeout=5)
        self._spool(list(self._local))
        self._local.clear()

    def _take(self, limit: int) -> list[bytes]:
        taken: list[bytes] = []
        while self._local and len(taken) < limit:
            taken.append(self._local.popleft())
        if self._ring and len(taken) < limit:
            taken.extend(self._segment.pop_rows(limit - len(taken)))
        return taken

    async def flush(self) -> int:
        """Write everything pending (ring, local queue); returns rows written."""
        written = 0
        while True:
            batch = self._take(BATCH_ROWS)
            if not batch:
                return written
            try:
                await self._copy(batch)
            except Exception:
                # NOTE: back to the front of the local queue, in order; the ring stays drainable
                # by the other workers meanwhile.
                self._local.extendleft(reversed(batch))
                raise
            written += len(batch)

    async def _copy(self, batch: list[bytes]) -> None:
        records = [to_record(_decoder.decode(data)) for data in batch]
        async with self._pool.acquire() as conn:
            await conn.copy_records_to_table("request_logs_ingest", records=records, columns=COLUMNS)
        self.written_total += len(records)

    async def _drain_loop(self) -> None:
        backoff_s = FLUSH_INTERVAL_S
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=backoff_s)
            self._wake.clear()
            try:
                await self.flush()
                await self._replay_spool()
                backoff_s = FLUSH_INTERVAL_S
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.copy_failures_total += 1
                log.warning("request rows not written yet (%s); %d waiting", exc, len(self._local))
                if len(self._local) > MEMORY_LIMIT_ROWS:
                    self._spool([self._local.popleft() for _ in range(len(self._local))])
                backoff_s = min(backoff_s * 2, 30.0)

    def _spool(self, rows: list[bytes]) -> None:
        if not rows:
            return
        self._spool_dir.mkdir(parents=True, exist_ok=True)
        path = self._spool_dir / f"{time.time_ns()}-{os.getpid()}.rows"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(_encoder.encode(rows))
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(path)
        self.spooled_total += len(rows)
        log.warning("spooled %d request rows to %s", len(rows), path)

    async def _replay_spool(self) -> None:
        for path in sorted(self._spool_dir.glob("*.rows")):
            claimed = path.with_suffix(f".replaying-{os.getpid()}")
            try:
                path.rename(claimed)  # one worker replays each file
            except FileNotFoundError:
                continue
            rows = msgspec.msgpack.decode(claimed.read_bytes(), type=list[bytes])
            for start in range(0, len(rows), BATCH_ROWS):
                try:
                    await self._copy(rows[start:start + BATCH_ROWS])
                except Exception:
                    # Keep only what was not written, so a replay never duplicates a row.
                    self._spool(rows[start:])
                    claimed.unlink()
                    raise
            claimed.unlink()
