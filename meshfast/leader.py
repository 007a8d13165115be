"""The leader: one worker across the cluster runs the maintenance loops.

Leadership is a PostgreSQL advisory lock held on a dedicated connection, so it moves to
another worker (on any host) as soon as the leader's process or connection dies. The loop runs
under :func:`meshfast.background.supervise`: whatever escapes it (a lost connection, a bug) ends
this term, releases the lock and starts a new attempt after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import asyncpg

from meshfast import background
from meshfast.store import database, sql

log = logging.getLogger("meshfast.leader")

# NOTE: distinct from the migration lock key in store.database.
_LEADER_LOCK = 0x6D657368_6C656164

_CONNECTION_ERRORS = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError, TimeoutError)

Job = Callable[[asyncpg.Connection], Awaitable[None]]


async def ensure_log_partitions(conn: asyncpg.Connection) -> None:
    created = await conn.fetchval(sql.ENSURE_LOG_PARTITIONS, 7)
    if created:
        log.info("created %d request_logs partitions ahead", created)


async def apply_retention(conn: asyncpg.Connection, days: int) -> None:
    """Drops daily request_logs partitions (and rollup rows) older than ``days``, sweeps expired
    admin sessions."""
    import json

    result = json.loads(await conn.fetchval(sql.RETENTION, days))
    if any(result.values()):
        log.info("retention (%d days): %s", days, result)


class Leader:
    """Runs ``jobs`` (name, interval in seconds, job) while this worker holds the leader lock.

    A failing job is logged and runs again at its next interval; the fault injector names jobs
    ``leader_job:<name>`` and the loop itself ``leader``.
    """

    def __init__(self, url: str, jobs: list[tuple[str, float, Job]], retry_s: float = 5.0,
                 lock: int = _LEADER_LOCK, name: str = "leader") -> None:
        self._url = url
        self._lock = lock
        self._name = name
        self._jobs = jobs
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None
        self.is_leader = False

    def start(self) -> None:
        self._task = background.start("leader", self._run)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        while True:
            background.fault_point("leader")
            try:
                conn = await database.connect(self._url, role=database.GATEWAY_ROLE)
            except _CONNECTION_ERRORS as exc:
                log.warning("leader loop cannot reach the database: %s", exc)
                await asyncio.sleep(self._retry_s)
                continue
            try:
                if await conn.fetchval(sql.TRY_LEADER_LOCK, self._lock):
                    self.is_leader = True
                    log.info("this worker is the %s", self._name)
                    await self._lead(conn)
            except _CONNECTION_ERRORS as exc:
                log.warning("leader connection lost: %s", exc)
            finally:
                self.is_leader = False
                with contextlib.suppress(Exception):
                    await conn.close()
            await asyncio.sleep(self._retry_s)

    async def _lead(self, conn: asyncpg.Connection) -> None:
        loop = asyncio.get_running_loop()
        due = [loop.time()] * len(self._jobs)
        while True:
            now = loop.time()
            for i, (name, interval_s, job) in enumerate(self._jobs):
                if now >= due[i]:
                    try:
                        background.fault_point(f"leader_job:{name}")
                        started = time.perf_counter()
                        await job(conn)
                        log.debug("leader job %s took %.1f ms", name, (time.perf_counter() - started) * 1000)
                    except _CONNECTION_ERRORS:
                        raise
                    except Exception:
                        log.exception("leader job %s failed; next run in %.0f s", name, interval_s)
                    due[i] = now + interval_s
                    # NOTE: the loop serves requests between jobs: a new term runs every job at once.
                    await asyncio.sleep(0)
            if conn.is_closed():
                raise ConnectionError("leader connection closed")
            await asyncio.sleep(max(0.05, min(due) - loop.time()))
