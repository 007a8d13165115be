"""Connections, roles and migrations.

meshfast talks to PostgreSQL as one of two roles: ``meshfast_admin`` (configuration) and
``meshfast_gateway`` (reads configuration, appends logs and counters). The login named by the
database URL must be a superuser (meshfast then creates the roles) or a member of both roles;
each pool assumes its role at connect time, so row-level security applies to every query.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import logging
import re
import warnings
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg

if TYPE_CHECKING:
    from pgserver import PostgresServer

log = logging.getLogger("meshfast.store")

ADMIN_ROLE = "meshfast_admin"
GATEWAY_ROLE = "meshfast_gateway"

# A fixed key for pg_advisory_lock so concurrent starts apply migrations once.
_MIGRATION_LOCK = 0x6D657368_66617374 & 0x7FFF_FFFF_FFFF_FFFF

_ENSURE_ROLES = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'meshfast_admin') THEN
        CREATE ROLE meshfast_admin NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'meshfast_gateway') THEN
        CREATE ROLE meshfast_gateway NOLOGIN;
    END IF;
END
$$;
"""
_IS_SUPERUSER = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
_GRANT_ROLES_TO_SELF = "GRANT meshfast_admin, meshfast_gateway TO CURRENT_USER"
_CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS meshfast_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""
_APPLIED_VERSIONS = "SELECT version FROM meshfast_migrations ORDER BY version"
_RECORD_MIGRATION = "INSERT INTO meshfast_migrations (version, name) VALUES ($1, $2)"
_LOCK_MIGRATIONS = "SELECT pg_advisory_lock($1)"
_UNLOCK_MIGRATIONS = "SELECT pg_advisory_unlock($1)"

_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def shipped_migrations() -> list[Migration]:
    """The forward-only migrations packaged in ``meshfast/migrations``, in order."""
    found: list[Migration] = []
    for entry in importlib.resources.files("meshfast").joinpath("migrations").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions: {versions}")
    return found


async def connect(url: str, *, role: str | None = None) -> asyncpg.Connection:
    settings = {"application_name": "meshfast"}
    if role:
        settings["role"] = role
    return await asyncpg.connect(url, server_settings=settings, timeout=10)


async def create_pool(url: str, *, role: str, min_size: int, max_size: int) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        url,
        min_size=min_size,
        max_size=max_size,
        max_inactive_connection_lifetime=30.0,
        server_settings={"application_name": f"meshfast:{role}", "role": role},
        timeout=10,
    )
    assert pool is not None
    return pool


async def migrate(url: str) -> list[Migration]:
    """Create the roles if needed and apply pending migrations; returns what was applied."""
    conn = await connect(url)
    try:
        await conn.execute(_LOCK_MIGRATIONS, _MIGRATION_LOCK)
        try:
            if await conn.fetchval(_IS_SUPERUSER):
                await conn.execute(_ENSURE_ROLES)
                await conn.execute(_GRANT_ROLES_TO_SELF)
            await conn.execute(_CREATE_MIGRATIONS)
            applied = {row["version"] for row in await conn.fetch(_APPLIED_VERSIONS)}
            done: list[Migration] = []
            for migration in shipped_migrations():
                if migration.version in applied:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(_RECORD_MIGRATION, migration.version, migration.name)
                log.info("applied migration %04d_%s", migration.version, migration.name)
                done.append(migration)
            return done
        finally:
            await conn.execute(_UNLOCK_MIGRATIONS, _MIGRATION_LOCK)
    finally:
        await conn.close()


class EmbeddedPostgres:
    """PostgreSQL from the ``pgserver`` package, in the data dir, trust auth over a Unix socket."""

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self._server: PostgresServer | None = None

    def start(self) -> str:
        self.pgdata.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

            # NOTE: pgserver logs initdb's whole output at INFO.
            logging.getLogger("pgserver").setLevel(logging.WARNING)
            server = self._server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        return server.get_uri()

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.cleanup()
            self._server = None


@contextlib.asynccontextmanager
async def admin_connection(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await connect(url, role=ADMIN_ROLE)
    try:
        yield conn
    finally:
        await conn.close()


_T = TypeVar("_T")


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run one coroutine to completion from synchronous code (CLI, supervisor)."""
    return asyncio.run(coro)
