"""What every admin operation shares: the write transaction (config bump, NOTIFY, audit row),
the registry check, body types and validation helpers, and the JSON shapes of stored rows."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

import asyncpg
from msgspec import Meta

from meshfast import errors, snapshot, validate
from meshfast.admin import rules as rule_admin
from meshfast.admin import scope
from meshfast.admin.changes import Lifecycle
from meshfast.secrets import Secrets
from meshfast.store import sql

# --- request bodies ------------------------------------------------------------------------


# A moment in a body: RFC 3339 with its offset (a time without one would mean a different
# instant on every host), between validate.EARLIEST and validate.LATEST (checked by _moment).
Timestamp = Annotated[dt.datetime, Meta(tz=True)]


Price = Decimal


# Strict decoding of every admin body, with validate.py's limits and string check.
decode = validate.decode


# --- validation helpers --------------------------------------------------------------------


def parse_uuid(value: str, missing: type[errors.MeshfastError] = errors.NotFound) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise missing() from None


def _body_uuid(value: str, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise errors.InvalidRequest(f"{field} must be a UUID string") from None


def _price(value: Price | None, field: str) -> Decimal | None:
    if value is None:
        return None
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise errors.InvalidRequest(f"{field} must be a decimal number") from None
    if not price.is_finite() or price < 0:
        raise errors.InvalidRequest(f"{field} must be a non-negative number")
    if price >= Decimal("10000000"):
        raise errors.InvalidRequest(f"{field} is too large")
    return price


def _nonempty(value: str, field: str) -> str:
    value = value.strip()
    if not value:
        raise errors.InvalidRequest(f"{field} is required")
    return value


def _email(value: str, field: str = "email") -> str:
    value = value.strip().lower()
    if "@" not in value or len(value) > 320 or any(c.isspace() for c in value):
        raise errors.InvalidRequest(f"{field} is not a valid address")
    return value


def label(value: str | None, field: str) -> str | None:
    """A business unit or tier as stored (see ``_label``)."""
    return _label(value, field)


def _label(value: str | None, field: str) -> str | None:
    """A business unit or tier as stored: stripped; ``None`` clears it, an empty one is refused."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise errors.InvalidRequest(f"{field} may not be empty (null clears it)")
    return value


def _moment(value: dt.datetime | None, field: str) -> dt.datetime | None:
    if value is not None and not validate.EARLIEST <= value <= validate.LATEST:
        raise errors.InvalidRequest(f"{field} must be between {validate.EARLIEST.date()} and {validate.LATEST.date()}")
    return value


def _missing(kind: str) -> type[errors.MeshfastError]:
    """The 404 of a principal of ``kind`` that does not exist."""
    return errors.ApplicationNotFound if kind == "application" else errors.UserNotFound


def _invalid(problems: list[str]) -> errors.MeshfastError:
    """One 400 listing every problem: in ``detail`` as a sentence, in ``errors`` one by one."""
    return errors.InvalidRequest("; ".join(problems), errors=problems)


# --- JSON shapes ---------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.time):
        return value.strftime("%H:%M")
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def row_json(row: asyncpg.Record) -> dict[str, Any]:
    out = {key: _jsonable(value) for key, value in row.items()}
    for key in ("settings", "long_context_prices", "restrictions"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out


# --- the service ---------------------------------------------------------------------------


# Called after a committed write with its config sequence and what changed ("" = anything; see
# ConfigFeed for the changes a worker applies without a rebuild).
Rebuild = Callable[[int, str], Awaitable[None]]
Verifier = Callable[[snapshot.Provider, list[snapshot.Model]], Awaitable[list[Any]]]


class ServiceBase:
    def __init__(self, pool: asyncpg.Pool, secrets: Secrets, after_write: Rebuild,
                 verifier: Verifier | None = None, dry_run: rule_admin.DryRun | None = None) -> None:
        self._pool = pool
        self._secrets = secrets
        self._after_write = after_write
        self._verifier = verifier
        # A draft rule against the serving worker's core (POST /admin/rules/dry-run).
        self.dry_run = dry_run
        # Approvals, scheduled activation and revisions of controls (rules, restrictions, policies).
        self.lifecycle = Lifecycle(pool, after_write)

    async def _write(self, actor: str, action: str, target: str | None, detail: dict[str, Any],
                     work: Callable[[asyncpg.Connection], Awaitable[Any]], *, registry: bool = False,
                     change: str = "", business_unit: str | None = None) -> Any:
        """Run ``work`` in a transaction with the config bump, NOTIFY and audit row.

        ``change`` names what the write changed when a worker can apply it without a rebuild
        (``user:<id>``: one user's organisation, status or expiry; ``rules``: the rules or the
        switch); it travels in the NOTIFY payload as ``<seq>:<change>``.

        A ``registry`` write (providers, models, deployments) holds the registry lock and commits
        only if the registry it leaves passes the core's validation (see :meth:`_check_registry`).

        The audit row names the business unit the write concerns: ``business_unit``, else the
        one the request's scope check found (:func:`meshfast.admin.scope.concerns`).
        """
        unit = business_unit if business_unit is not None else scope.audit_unit()
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                if registry:
                    await conn.execute(sql.LOCK_REGISTRY)
                result = await work(conn)
                # NOTE: after the work, which takes its rows' locks in its own order first.
                await scope.recheck(conn)
                if registry:
                    await self._check_registry(conn)
                seq = await conn.fetchval(sql.NEXT_CONFIG_SEQ)
                await conn.execute(sql.NOTIFY_CONFIG, f"{seq}:{change}" if change else str(seq))
                await conn.execute(sql.INSERT_UNIT_AUDIT, actor, action, target, json.dumps(detail), unit)
        await self._after_write(int(seq), change)
        return result

    async def _check_registry(self, conn: asyncpg.Connection) -> None:
        """400 listing every problem of the registry as this transaction would commit it, by the
        same validation the workers' snapshot build runs: names and aliases unique together,
        prices, the long-context tier, and every deployment serving what its model advertises.
        So the stored registry stays one the workers accept."""
        problems = snapshot.registry_errors(await snapshot.load_registry(conn, self._secrets.master_key))
        if problems:
            raise _invalid(problems)
