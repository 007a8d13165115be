"""Workflow budgets (API.md "Identities"): ``POST /admin/workflows``, ``GET``, ``GET/DELETE
/admin/workflows/{id}``.

A registered workflow is a budget (``limit_usd`` per ``window``: daily, weekly or monthly, in
MESHFAST_CALENDAR_TZ) that calls tagged ``workflow=<id>`` reserve their worst case against, like
any cap (the core; no overshoot). When ``principals`` is given, only those may charge it: people
(``user_id``), applications (``application_id``) and business units (``business_unit``); anyone
else naming it is 403 ``workflow_not_permitted``. A workflow id nobody registered is attribution only.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

import asyncpg
import msgspec
from msgspec import Meta

from meshfast import counters, errors, validate
from meshfast.store import workflows as workflows_sql

WorkflowNotFound = errors.WorkflowNotFound
WorkflowExists = errors.WorkflowExists
_ID = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
WINDOWS = ("daily", "weekly", "monthly")
MAX_PRINCIPALS = 1000
MAX_LIMIT_USD = Decimal("10000000")
NANOS = Decimal(1_000_000_000)


class WorkflowCreate(msgspec.Struct, forbid_unknown_fields=True):
    id: Annotated[str, Meta(max_length=64)]
    limit_usd: Annotated[float, Meta(gt=0)] | Annotated[str, Meta(max_length=32)]
    window: str
    principals: Annotated[list[dict[str, str]], Meta(max_length=MAX_PRINCIPALS)] | None = None


def _limit_nano(value: float | str) -> int:
    try:
        limit = Decimal(str(value))
    except InvalidOperation:
        raise errors.InvalidRequest("limit_usd must be a decimal number") from None
    if not limit.is_finite() or limit <= 0 or limit >= MAX_LIMIT_USD:
        raise errors.InvalidRequest(f"limit_usd must be above 0 and below {MAX_LIMIT_USD}")
    nano = int(limit * NANOS)
    if nano <= 0:
        raise errors.InvalidRequest("limit_usd must be at least one nano-USD")
    return nano


def _principals(listed: list[dict[str, str]] | None, problems: list[str]) -> list[dict[str, str]] | None:
    if listed is None:
        return None
    out: list[dict[str, str]] = []
    for i, entry in enumerate(listed):
        if len(entry) != 1 or next(iter(entry)) not in ("user_id", "application_id", "business_unit"):
            problems.append(f"principals[{i}] must be one of {{user_id}}, {{application_id}}, {{business_unit}}")
            continue
        kind, value = next(iter(entry.items()))
        if kind in ("user_id", "application_id"):
            try:
                out.append({kind: str(uuid.UUID(value))})
            except ValueError:
                problems.append(f"principals[{i}].{kind} must be a UUID")
        else:
            unit = value.strip()
            problem = validate.text_problem(unit) if unit else "is empty"
            if problem is not None or len(unit) > 200:
                problems.append(f"principals[{i}].business_unit {problem or 'is longer than 200 characters'}")
            else:
                out.append({"business_unit": unit})
    return out


def check(body: WorkflowCreate) -> tuple[int, list[dict[str, str]] | None]:
    """The workflow's limit (nano-USD) and principals as stored; 400 listing every problem."""
    problems: list[str] = []
    if not _ID.match(body.id):
        problems.append("id must be 1 to 64 of A-Z a-z 0-9 . _ - (the workflow tag's value)")
    if body.window not in WINDOWS:
        problems.append("window must be daily, weekly or monthly")
    try:
        limit = _limit_nano(body.limit_usd)
    except errors.MeshfastError as exc:
        problems.append(str(exc.detail))
        limit = 0
    principals = _principals(body.principals, problems)
    if problems:
        raise errors.InvalidRequest("; ".join(problems), errors=problems)
    return limit, principals


async def check_principals(conn: asyncpg.Connection, principals: list[dict[str, str]] | None) -> None:
    """400 when a listed person or application does not exist."""
    for field, kind in (("user_id", "user"), ("application_id", "application")):
        listed = [uuid.UUID(p[field]) for p in principals or () if field in p]
        if not listed:
            continue
        known = {r["id"] for r in await conn.fetch(workflows_sql.KNOWN_PRINCIPALS, listed, kind)}
        missing = [str(p) for p in listed if p not in known]
        if missing:
            raise errors.InvalidRequest(f"principals name {kind}s that do not exist: {', '.join(missing[:5])}",
                                        errors=[f"no {kind} {m}" for m in missing])


async def apply_file_workflow(conn: asyncpg.Connection, body: WorkflowCreate, summary: dict[str, list[str]]) -> None:
    """One workflow of a registry file (already ``check``-ed): created, updated or unchanged."""
    limit, principals = check(body)
    await check_principals(conn, principals)
    wanted = None if principals is None else json.dumps(principals)
    row = await conn.fetchrow(workflows_sql.STORED_WORKFLOW, body.id)
    if row is None:
        await conn.fetchrow(workflows_sql.INSERT_WORKFLOW, body.id, limit, body.window, wanted)
        summary["created"].append(f"workflow {body.id}")
    elif (int(row["limit_nano_usd"]), row["window"],
          None if row["principals"] is None else json.loads(row["principals"])) == (limit, body.window, principals):
        summary["unchanged"].append(f"workflow {body.id}")
    else:
        await conn.execute(workflows_sql.UPDATE_WORKFLOW, body.id, limit, body.window, wanted)
        summary["updated"].append(f"workflow {body.id}")


def _path_id(workflow_id: str) -> None:
    """A path's workflow id: one no workflow could have is simply not found."""
    if not _ID.match(workflow_id):
        raise WorkflowNotFound()


class WorkflowService:
    """The admin routes' work; ``write`` is AdminService._write (the transaction, the config bump,
    NOTIFY and the audit row)."""

    def __init__(self, pool: asyncpg.Pool, write: Callable[..., Awaitable[Any]]) -> None:
        self._pool = pool
        self._write = write

    async def create(self, actor: str, body: WorkflowCreate) -> dict[str, Any]:
        limit, principals = check(body)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            await check_principals(conn, principals)
            try:
                return await conn.fetchrow(workflows_sql.INSERT_WORKFLOW, body.id, limit, body.window,
                                           None if principals is None else json.dumps(principals))
            except asyncpg.UniqueViolationError:
                raise WorkflowExists() from None

        row = await self._write(actor, "create_workflow", body.id, {"limit_nano_usd": limit, "window": body.window},
                                work)
        return await self._json(row)

    async def list(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(workflows_sql.LIST_WORKFLOWS)
            return [await self._json(r, conn) for r in rows]

    async def get(self, workflow_id: str) -> dict[str, Any]:
        _path_id(workflow_id)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(workflows_sql.GET_WORKFLOW, workflow_id)
            if row is None:
                raise WorkflowNotFound()
            return await self._json(row, conn)

    async def delete(self, actor: str, workflow_id: str) -> dict[str, Any]:
        _path_id(workflow_id)

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(workflows_sql.DELETE_WORKFLOW, workflow_id) is None:
                raise WorkflowNotFound()

        await self._write(actor, "delete_workflow", workflow_id, {}, work)
        return {"status": "deleted"}

    async def _json(self, row: asyncpg.Record, conn: asyncpg.Connection | None = None) -> dict[str, Any]:
        """The workflow with its spend in the current window (as last checkpointed, a few seconds
        behind the shared-memory counter the calls reserve against)."""
        today = counters.local_date(int(dt.datetime.now(dt.UTC).timestamp() * 1000))
        period = counters.workflow_period(row["window"], today)
        if conn is None:
            async with self._pool.acquire() as c:
                spent = await c.fetchval(workflows_sql.SPENT, row["uid"], period)
        else:
            spent = await conn.fetchval(workflows_sql.SPENT, row["uid"], period)
        limit = int(row["limit_nano_usd"])
        return {
            "id": row["id"], "limit_usd": float(Decimal(limit) / NANOS), "window": row["window"],
            "principals": None if row["principals"] is None else json.loads(row["principals"]),
            "spent_usd": float(Decimal(spent or 0) / NANOS),
            "created_at": row["created_at"].astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        }
