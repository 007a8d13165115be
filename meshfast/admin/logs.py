"""Log analytics for the admin plane: the request log explorer and its summaries.

Summaries read the rollups the ingest keeps (migration 0007), so 30 days of traffic is a few
thousand rows whatever the request count: ``request_rollup_hourly_all`` (no user dimension) for
the instance's view, ``request_rollup_hourly`` for one user, ``request_rollup_daily_user`` for
spend by person (whole UTC days, the partial days at the edges from the hourly rollup). Listing
reads ``request_logs`` by index range (``created_at``, or ``user_id, created_at``); its total
counts whole hours from a rollup and only the partial hours at the window's edges from the rows.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import AsyncGenerator
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qs
from zoneinfo import ZoneInfo

import asyncpg
import msgspec

from meshfast import errors, settings, validate
from meshfast.admin import scope as scope_module
from meshfast.store import logs as logs_sql

STATUS_OUTCOME = {"success": "success", "error": "upstream_error", "denied": "denied"}
SORTS = tuple(logs_sql.SORT_KEYS)
MAX_PAGE_SIZE = 500
DEFAULT_WINDOW = dt.timedelta(days=1)
SUMMARY_WINDOW = dt.timedelta(days=30)
MAX_SUMMARY_WINDOW = dt.timedelta(days=400)
HOUR = dt.timedelta(hours=1)
NANOS = Decimal(1_000_000_000)
# The listing's columns (bench/logs_bench.py reads them here).
LIST_COLUMNS = logs_sql.LIST_COLUMNS
# A tool definition's prompt cost is estimated from its JSON size at this many bytes per token.
BYTES_PER_TOKEN = 4
# group_by= of the summary: the row's own value at call time, as kept in request_rollup_hourly;
# every attribution tag key (MESHFAST_TAG_KEYS, none of them a built-in key's name) groups by the
# value callers sent under it.
GROUP_BY = (*logs_sql.GROUP_KEYS, *settings.tag_keys_env())


class Query:
    """The filters of ``GET /admin/logs`` and ``/admin/logs/summary``, validated."""

    def __init__(self, query_string: str | None, *, summary: bool = False,
                 scope: frozenset[str] | None = None) -> None:
        """``scope``: the caller's business units (None: not scoped), whose rows alone it reads
        (:func:`meshfast.admin.scope.units_filter`)."""
        raw = validate.query(_parse(query_string), _KNOWN)
        now = dt.datetime.now(dt.UTC)
        self.to = validate.moment(raw.get("to"), "to") or now
        window = SUMMARY_WINDOW if summary else DEFAULT_WINDOW
        self.since = validate.moment(raw.get("from"), "from") or (self.to - window)
        if self.since >= self.to:
            raise errors.InvalidRequest("from must be before to")
        if summary and self.to - self.since > MAX_SUMMARY_WINDOW:
            raise errors.InvalidRequest("a summary covers at most 400 days")
        self.user_id = _uuid(raw.get("user_id"), "user_id")
        self.model_id = _uuid(raw.get("model_id"), "model_id")
        status = raw.get("status")
        if status is not None and status not in STATUS_OUTCOME:
            raise errors.InvalidRequest("status must be success, error or denied")
        self.outcome = STATUS_OUTCOME.get(status) if status else None
        self.page = _int(raw.get("page"), "page", 1, 1_000_000, 1)
        self.page_size = _int(raw.get("page_size"), "page_size", 1, MAX_PAGE_SIZE, 50)
        sort = raw.get("sort", "created_at")
        if sort not in SORTS:
            raise errors.InvalidRequest(f"sort must be one of {', '.join(SORTS)}")
        self.sort = sort
        order = raw.get("order", "desc")
        if order not in ("asc", "desc"):
            raise errors.InvalidRequest("order must be asc or desc")
        self.order = order
        self.q = (raw.get("q") or "").strip() or None
        self.request_id = (raw.get("request_id") or "").strip() or None
        self.tz_name = validate.timezone(raw.get("tz") or "UTC", "tz")
        self.tz = ZoneInfo(self.tz_name)
        bucket = raw.get("bucket") or ("day" if self.to - self.since > dt.timedelta(days=2) else "hour")
        if bucket not in ("hour", "day"):
            raise errors.InvalidRequest("bucket must be hour or day")
        self.bucket = bucket
        group_by = raw.get("group_by")
        if group_by is not None and group_by not in GROUP_BY:
            raise errors.InvalidRequest(f"group_by must be one of {', '.join(GROUP_BY)}")
        self.group_by = group_by
        # The business units whose rows are read (the rows' own, from call time); None: every row.
        self.units = scope_module.units_filter(scope, raw.get("business_unit"))

    def filters(self) -> tuple[bool, bool, bool, bool]:
        """Which of the shared filters (user, model, outcome, business units) apply: the store's
        statements take them as ``$3``-``$6`` (None when one does not apply), after the window."""
        return self.user_id is not None, self.model_id is not None, self.outcome is not None, self.units is not None

    def filter_args(self) -> list[Any]:
        return [self.user_id, self.model_id, self.outcome, self.units]

    def row_filters(self) -> tuple[bool, bool, bool, bool, bool, bool]:
        """Which filters over request_logs rows apply: the shared ones, then the search and the
        request id (``$7``, ``$8``)."""
        return (*self.filters(), self.q is not None, self.request_id is not None)

    def row_args(self) -> list[Any]:
        """The window, the filters and the search, as the store's row statements take them."""
        return [self.since, self.to, *self.filter_args(), self.q, self.request_id]


_KNOWN = frozenset({"user_id", "model_id", "status", "from", "to", "page", "page_size", "sort", "order", "q",
                    "request_id", "tz", "bucket", "group_by", "business_unit"})
_AUDIT_KNOWN = frozenset({"actor", "action", "from", "to", "page", "page_size", "business_unit"})


def _parse(query_string: str | None) -> dict[str, str]:
    """A query string's parameters (the last of a repeated one), each checked by the shared
    validator (no NUL, nothing PostgreSQL cannot store, bounded length)."""
    try:
        return {k: v[-1] for k, v in parse_qs(query_string or "", strict_parsing=False).items()}
    except ValueError:
        raise errors.InvalidRequest("malformed query string") from None


def _uuid(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    import uuid

    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise errors.InvalidRequest(f"{name} must be a UUID") from None


def _int(value: str | None, name: str, low: int, high: int, default: int) -> int:
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise errors.InvalidRequest(f"{name} must be an integer") from None
    if not low <= n <= high:
        raise errors.InvalidRequest(f"{name} must be between {low} and {high}")
    return n


def _ceil_hour(t: dt.datetime) -> dt.datetime:
    floor = t.replace(minute=0, second=0, microsecond=0)
    return floor if floor == t else floor + HOUR


def _floor_hour(t: dt.datetime) -> dt.datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def _usd(value: Decimal | None) -> float:
    return float(value or 0)


async def list_logs(conn: asyncpg.Connection, q: Query) -> dict[str, Any]:
    offset = (q.page - 1) * q.page_size
    rows = await conn.fetch(logs_sql.list_rows(*q.row_filters(), q.sort, q.order), *q.row_args(), q.page_size,
                            offset)
    if q.q or q.request_id:
        total = await conn.fetchval(logs_sql.count_rows(*q.row_filters()), *q.row_args())
    else:
        total = await _count_rows(conn, q)
    return {"logs": [_log(r) for r in rows], "total": int(total), "page": q.page, "page_size": q.page_size}


async def _count_rows(conn: asyncpg.Connection, q: Query) -> int:
    """Whole hours from the rollup, the partial hours at either edge from the rows."""
    inner_from, inner_to = _ceil_hour(q.since), _floor_hour(q.to)
    if inner_from >= inner_to:
        return int(await conn.fetchval(logs_sql.count_window_rows(*q.filters()), q.since, q.to, *q.filter_args()))
    whole = await conn.fetchval(logs_sql.count_rollup_rows(*q.filters()), inner_from, inner_to, *q.filter_args())
    return int(whole) + await _edge_count(conn, q, inner_from, inner_to)


async def _edge_count(conn: asyncpg.Connection, q: Query, inner_from: dt.datetime, inner_to: dt.datetime) -> int:
    total = 0
    for start, end in ((q.since, inner_from), (inner_to, q.to)):
        if start < end:
            total += int(await conn.fetchval(logs_sql.count_window_rows(*q.filters()), start, end,
                                             *q.filter_args()))
    return total


def _log(r: asyncpg.Record) -> dict[str, Any]:
    out = dict(r)
    for key in ("tags", "dlp"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    for key in ("id", "user_id", "mesh_key_id", "provider_id", "model_id", "manager_id", "application_id"):
        if out.get(key) is not None:
            out[key] = str(out[key])
    out["created_at"] = out["created_at"].isoformat()
    out["input_cost"] = _usd(out["input_cost"])
    out["output_cost"] = _usd(out["output_cost"])
    if out.get("source_ip") is not None:
        out["source_ip"] = str(out["source_ip"])
    return out


# The summary's grouping sets (one scan of the rollup answers every breakdown), in the order
# GROUPING() reports them.
_GROUPS = logs_sql.SUMMARY_GROUPS
# The latency columns' upper edges (ms; None: slower than the last) and Mesh's labels for them.
_LATENCY = ((100, "lat_100", "<100ms"), (500, "lat_500", "<500ms"), (1000, "lat_1000", "<1s"),
            (5000, "lat_5000", "<5s"), (30000, "lat_30000", "<30s"), (None, "lat_slower", ">30s"))


async def summary(conn: asyncpg.Connection, q: Query) -> dict[str, Any]:
    """Totals, a time series in ``tz``, and breakdowns by model, provider, user, status, deny
    reason and latency, over whole hours (``from`` rounded down, ``to`` up)."""
    since, until = _floor_hour(q.since), _ceil_hour(q.to)
    validate.timezone(q.tz_name, "tz", await validate.load_timezones(conn))
    rows = await conn.fetch(logs_sql.summary(*q.filters()), since, until, *q.filter_args(), q.tz_name, q.bucket)
    # GROUPING() sets the bit of each column left out: the set grouped by column i has every bit
    # but bit (len - 1 - i) set; the empty set has them all.
    everything = (1 << len(_GROUPS)) - 1
    by_set: dict[str, list[asyncpg.Record]] = {g: [] for g in _GROUPS}
    totals = None
    for r in rows:
        if r["grouping"] == everything:
            totals = r
            continue
        for i, g in enumerate(_GROUPS):
            if r["grouping"] == everything & ~(1 << (len(_GROUPS) - 1 - i)):
                by_set[g].append(r)
    assert totals is not None

    def ranked(group: str, label: str, with_name: bool = False, cache: bool = False) -> list[dict[str, Any]]:
        ordered = sorted(by_set[group], key=lambda r: -int(r["calls"]))[:100]
        return [_measures(r, {label: None if r[group] is None else str(r[group]),
                              # Mesh's by_model: errors (status >= 400) and latency too.
                              **({"model_name": r["model_name"], "errors": int(r["failed"]),
                                  "avg_latency_ms": _average(r)} if with_name else {})}, cache) for r in ordered]

    calls = int(totals["calls"])
    series = sorted(by_set["bucket"], key=lambda r: r["bucket"])
    by_user = await _by_user(conn, q, since, until)
    emails = await _emails(conn, [u["user_id"] for u in by_user])
    by_deny_reason = [{**r, "reason": r["deny_reason"]} for r in ranked("deny_reason", "deny_reason")
                      if r["deny_reason"] is not None]
    return {
        "from": since.isoformat(), "to": until.isoformat(), "tz": q.tz_name, "bucket": q.bucket,
        # mesh-behaviour §3.5's names, beside meshfast's own (`totals`, `series`), which the
        # dashboard reads.
        "total_calls": calls, "error_calls": int(totals["failed"]), "denied_calls": int(totals["denials"]),
        "avg_latency_ms": _average(totals), "total_tokens_in": int(totals["tokens_in"]),
        "total_tokens_out": int(totals["tokens_out"]), "total_input_cost": _usd(totals["input_cost"]),
        "total_output_cost": _usd(totals["output_cost"]),
        "time_series": [{"bucket": r["bucket"].isoformat(), "calls": int(r["calls"]), "errors": int(r["failed"]),
                         "avg_latency_ms": _average(r)} for r in series],
        "totals": {**_measures(totals, {}, cache=True), "errors": int(totals["errors"]),
                   "denials": int(totals["denials"]),
                   "avg_latency_ms": round(int(totals["latency_ms"]) / calls, 1) if calls else None},
        "series": [_measures(r, {"bucket": r["bucket"].isoformat()}) for r in series],
        "by_model": ranked("model_id", "model_id", with_name=True, cache=True),
        "by_provider": ranked("provider_id", "provider_id", cache=True),
        "by_user": [{**u, "user_email": emails.get(u["user_id"], "Unknown")} for u in by_user],
        "by_status": ranked("outcome", "status"),
        "by_status_code": [{"status_code": int(r["status_code"]), "calls": int(r["calls"])}
                           for r in sorted(by_set["status_code"], key=lambda r: int(r["status_code"]))],
        "by_deny_reason": by_deny_reason,
        "latency_buckets": [{"le_ms": le, "upper_ms": le or 0, "label": label, "calls": int(totals[col])}
                            for le, col, label in _LATENCY],
        # Exact: the sum of the rows' costs in the window, in nano-USD.
        "total_cost_nano_usd": _nano(totals["cost"]),
        **({"group_by": q.group_by, "groups": await _groups(conn, q, since, until)} if q.group_by else {}),
        "by_tool": await _by_tool(conn, q, since, until),
    }


def _tool_filters(q: Query) -> tuple[bool, bool]:
    """The user and model filters over tool_rollup_hourly (``$3``, ``$4``, after the window). The
    rollup counts successful calls only, so the status filter does not apply."""
    return q.user_id is not None, q.model_id is not None


def _tokens(definition_bytes: int, declared_calls: int) -> int:
    """Estimated prompt tokens of one declaration of a tool (its average definition size)."""
    if declared_calls <= 0:
        return 0
    return -(-definition_bytes // (declared_calls * BYTES_PER_TOKEN))


async def _by_tool(conn: asyncpg.Connection, q: Query, since: dt.datetime, until: dt.datetime,
                   limit: int = 100) -> list[dict[str, Any]]:
    """Context signals: per tool, how many calls declared it and how many the model called it
    in, with the estimated tokens one declaration costs; the most declared first."""
    rows = await conn.fetch(logs_sql.tools(*_tool_filters(q), q.units is not None), since, until, q.user_id,
                            q.model_id, limit, q.units)
    return [{"tool": r["tool"], "declared_calls": int(r["declared"]), "invoked_calls": int(r["invoked"]),
             "invocation_rate": round(int(r["invoked"]) / int(r["declared"]), 4) if r["declared"] else None,
             "estimated_tokens_per_declaration": _tokens(int(r["bytes"]), int(r["declared"]))} for r in rows]


async def unused_tools(conn: asyncpg.Connection, q: Query) -> dict[str, Any]:
    """Per person, the tools declared in the window (default: the last 24 hours) that the model
    never called, with the prompt tokens per request that removing them would save (estimated
    from their definitions' size); the people who would save the most first."""
    since, until = _floor_hour(q.since), _ceil_hour(q.to)
    rows = await conn.fetch(logs_sql.unused_tools(*_tool_filters(q)), since, until, q.user_id, q.model_id)
    people: dict[str | None, list[dict[str, Any]]] = {}
    for r in rows:
        key = None if r["user_id"] is None else str(r["user_id"])
        people.setdefault(key, []).append({
            "tool": r["tool"], "declared_calls": int(r["declared"]),
            "estimated_tokens_per_request": _tokens(int(r["bytes"]), int(r["declared"]))})
    users = []
    for user_id, tools in people.items():
        tools.sort(key=lambda t: (-t["estimated_tokens_per_request"] * t["declared_calls"], t["tool"]))
        users.append({"user_id": user_id, "tools": tools[:50],
                      "estimated_tokens_in_window": sum(t["estimated_tokens_per_request"] * t["declared_calls"]
                                                        for t in tools)})
    users.sort(key=lambda u: (-u["estimated_tokens_in_window"], u["user_id"] or ""))
    users = users[:100]
    emails = await _emails(conn, [u["user_id"] for u in users])
    for u in users:
        u["user_email"] = emails.get(u["user_id"], "Unknown")
    return {"from": since.isoformat(), "to": until.isoformat(), "bytes_per_token": BYTES_PER_TOKEN, "users": users}


NINE_PLACES = Decimal("0.000000001")


async def _groups(conn: asyncpg.Connection, q: Query, since: dt.datetime, until: dt.datetime) -> list[dict[str, Any]]:
    """The summary's window grouped by the value each row kept at call time (``q.group_by``),
    from the per-user hourly rollup. Rows without the value form the group whose key is null;
    grouped by tag, a row counts once per tag of its model (and not at all without tags), so the
    groups' sum is the total only for the other groupings."""
    assert q.group_by is not None
    # An attribution tag's key is the statement's $7 (the built-in keys are columns).
    tag = [] if q.group_by in logs_sql.GROUP_KEYS else [q.group_by]
    rows = await conn.fetch(logs_sql.groups(q.group_by, *q.filters()), since, until, *q.filter_args(), *tag)
    emails = await _emails(conn, [r["key"] for r in rows]) if q.group_by == "manager" else {}
    groups = []
    for r in rows:
        cost = r["input_cost"] + r["output_cost"]
        groups.append({
            "key": r["key"], **({"manager_email": emails.get(r["key"])} if q.group_by == "manager" else {}),
            "calls": int(r["calls"]), "denied_calls": int(r["denied_calls"]), "error_calls": int(r["error_calls"]),
            "tokens_in": int(r["tokens_in"]), "tokens_out": int(r["tokens_out"]),
            "input_cost_usd": exact_usd(r["input_cost"]), "output_cost_usd": exact_usd(r["output_cost"]),
            "cost_usd": exact_usd(cost), "cost_nano_usd": _nano(cost),
        })
    groups.sort(key=lambda g: (-g["cost_nano_usd"], -g["calls"], g["key"] is None, g["key"] or ""))
    return groups


def exact_usd(value: Decimal) -> msgspec.Raw:
    """A decimal USD amount as a JSON number with its nine decimals, not rounded through a float."""
    return msgspec.Raw(format(Decimal(value).quantize(NINE_PLACES), "f").encode())


def _nano(value: Decimal | None) -> int:
    return int(Decimal(value or 0) * NANOS)


def _average(r: asyncpg.Record) -> float | None:
    calls = int(r["calls"])
    return round(int(r["latency_ms"]) / calls, 1) if calls else None


async def _emails(conn: asyncpg.Connection, user_ids: list[str | None]) -> dict[str | None, str]:
    ids = [uid for uid in user_ids if uid is not None]
    if not ids:
        return {}
    rows = await conn.fetch(logs_sql.EMAILS, ids)
    return {r["id"]: r["email"] for r in rows}


async def _by_user(conn: asyncpg.Connection, q: Query, since: dt.datetime, until: dt.datetime,
                   limit: int = 100) -> list[dict[str, Any]]:
    """Spend by person: whole UTC days from the daily rollup, the hours of partial days at the
    edges from the hourly one (exact either way); one model's view comes from the hourly one."""
    args = q.filter_args()
    hourly = logs_sql.spend_by_user_hourly(*q.filters())
    first_day = (since + dt.timedelta(days=1)).date() if since.time() != dt.time(0) else since.date()
    last_day = until.date()  # exclusive
    parts: list[tuple[str, list[Any]]] = []
    # NOTE: the daily rollup keeps no business unit: a unit's view reads the hourly one.
    if q.user_id or q.model_id or q.units is not None or first_day >= last_day:
        parts.append((hourly, [since, until, *args]))
    else:
        parts.append((logs_sql.SPEND_BY_USER_DAILY[q.outcome is not None], [first_day, last_day, q.outcome]))
        day_start = dt.datetime.combine(first_day, dt.time(0), dt.UTC)
        day_end = dt.datetime.combine(last_day, dt.time(0), dt.UTC)
        for start, end in ((since, day_start), (day_end, until)):
            if start < end:
                parts.append((hourly, [start, end, *args]))
    merged: dict[str | None, dict[str, Any]] = {}
    for sql, params in parts:
        for r in await conn.fetch(sql, *params):
            key = None if r["user_id"] is None else str(r["user_id"])
            entry = merged.setdefault(key, {"user_id": key, "calls": 0, "tokens_in": 0, "tokens_out": 0,
                                            "cost_usd": 0.0})
            entry["calls"] += int(r["calls"] or 0)
            entry["tokens_in"] += int(r["tokens_in"] or 0)
            entry["tokens_out"] += int(r["tokens_out"] or 0)
            entry["cost_usd"] = round(entry["cost_usd"] + _usd(r["cost"]), 9)
    return sorted(merged.values(), key=lambda e: (-e["cost_usd"], -e["calls"]))[:limit]


def _measures(r: asyncpg.Record, head: dict[str, Any], cache: bool = False) -> dict[str, Any]:
    out = {**head, "calls": int(r["calls"]), "tokens_in": int(r["tokens_in"]), "tokens_out": int(r["tokens_out"]),
           "cost_usd": _usd(r["cost"])}
    if cache:
        read, write = int(r["cache_read_tokens"]), int(r["cache_write_tokens"])
        prompt = int(r["tokens_in"]) + read + write
        out.update(cache_read_tokens=read, cache_write_tokens=write,
                   cache_write_1h_tokens=int(r["cache_write_1h_tokens"]),
                   # Prompt tokens read from the provider's cache, of all prompt tokens (tokens_in counts
                   # neither cache class).
                   cache_hit_rate=round(read / prompt, 4) if prompt else None)
    return out


async def audit(conn: asyncpg.Connection, query_string: str | None,
                scope: frozenset[str] | None = None) -> dict[str, Any]:
    """``GET /admin/audit``: the audit log, newest first, filtered by actor, action, time and
    business unit; a business-unit administrator (``scope``) reads its units' records only."""
    raw = validate.query(_parse(query_string), _AUDIT_KNOWN)
    # The filters as the store's statements take them ($1 actor, $2 action, $3-$4 the window,
    # $5 the business units).
    args: list[Any] = [raw.get("actor") or None, raw.get("action") or None,
                       validate.moment(raw.get("from"), "from"), validate.moment(raw.get("to"), "to"),
                       scope_module.units_filter(scope, raw.get("business_unit"))]
    page = _int(raw.get("page"), "page", 1, 1_000_000, 1)
    page_size = _int(raw.get("page_size"), "page_size", 1, MAX_PAGE_SIZE, 50)
    applied = tuple(arg is not None for arg in args)
    rows = await conn.fetch(logs_sql.audit(*applied), *args, page_size, (page - 1) * page_size)
    total = await conn.fetchval(logs_sql.count_audit(*applied), *args)
    entries = [{"id": r["id"], "actor": r["actor"], "action": r["action"], "target": r["target"],
                "detail": _detail(r["detail"]), "business_unit": r["business_unit"],
                "created_at": r["created_at"].isoformat()} for r in rows]
    return {"entries": entries, "total": int(total), "page": page, "page_size": page_size}


def _detail(value: Any) -> Any:
    if isinstance(value, str):
        import json

        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


# --- CSV export ------------------------------------------------------------------------------

# Rows per query: the export holds one page in memory, however many rows the window has.
EXPORT_PAGE_ROWS = 1000
EXPORT_HEADER = (
    "id", "request_id", "created_at", "user_id", "user_email", "business_unit", "manager_id", "tier", "model_id",
    "model_name", "requested_model", "provider_id", "route", "outcome", "deny_reason", "would_deny", "status_code",
    "latency_ms", "tokens_in", "tokens_out", "cache_read_tokens", "cache_write_tokens", "count", "input_cost",
    "output_cost", "cost", "model_tags", "source_ip", "user_agent", "cache_write_1h_tokens", "tools_declared",
    "tools_invoked", "tags", "principal_kind", "key_id", "token_issuer", "token_subject", "application_id",
    "dlp", "dlp_action",
)
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection). Some read
# a cell with its leading whitespace trimmed (LibreOffice's "trim spaces" import), and the
# full-width forms as the ASCII ones.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, list):
        value = ";".join(str(v) for v in value)

    text = str(value)
    return "'" + text if text.startswith(_FORMULA_START) or text.lstrip().startswith(_FORMULA_START) else text


def _tag_pairs(value: str | None) -> str | None:
    """An attribution object (jsonb text) as the header spells it: ``k=v;k=v``."""
    return None if not value else ";".join(f"{k}={v}" for k, v in sorted(json.loads(value).items()))


def _csv_lines(rows: list[asyncpg.Record], emails: dict[str | None, str]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    for r in rows:
        user_id = None if r["user_id"] is None else str(r["user_id"])
        writer.writerow([_csv_cell(emails.get(user_id)) if c == "user_email"
                         else _csv_cell(_tag_pairs(r[c])) if c == "tags" else _csv_cell(r[c])
                         for c in EXPORT_HEADER])
    return out.getvalue().encode()


async def export_csv(pool: asyncpg.Pool, q: Query) -> AsyncGenerator[bytes, None]:
    """``GET /admin/logs/export.csv``: the rows ``/admin/logs`` would list for the same filters, all
    of them, as CSV (a header line, then one line per row, newest first unless ``order=asc``).

    Read a page at a time by keyset (``created_at``, ``request_id``), each page on a connection
    taken for it alone. The first page is read before this returns, so a database that is away is
    a 503 rather than an empty 200. Costs are exact decimals (nine places); ``user_email`` is the
    user's email now, the organisation columns are the row's own, from call time.
    """
    if q.sort != "created_at":
        raise errors.InvalidRequest("the export is ordered by created_at")
    params = [*q.row_args(), EXPORT_PAGE_ROWS]
    first_sql = logs_sql.export_page(*q.row_filters(), q.order, first=True)
    next_sql = logs_sql.export_page(*q.row_filters(), q.order, first=False)

    async def page(after: tuple[dt.datetime, str] | None) -> tuple[list[asyncpg.Record], bytes]:
        async with pool.acquire() as conn:
            rows = await (conn.fetch(first_sql, *params) if after is None else conn.fetch(next_sql, *params, *after))
            emails = await _emails(conn, [None if r["user_id"] is None else str(r["user_id"]) for r in rows])
        return rows, _csv_lines(rows, emails)

    rows, first = await page(None)

    async def chunks() -> AsyncGenerator[bytes, None]:
        nonlocal rows
        header = io.StringIO()
        csv.writer(header, lineterminator="\r\n").writerow(EXPORT_HEADER)
        yield header.getvalue().encode() + first
        while len(rows) == EXPORT_PAGE_ROWS:
            rows, lines = await page((rows[-1]["created_at"], rows[-1]["request_id"]))
            if lines:
                yield lines

    return chunks()
