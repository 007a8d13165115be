"""Chargeback (issue 14, item 8): rows keep the caller's organisation (business unit, manager, tier)
and the model's tags as they were at call time; /admin/logs/summary?group_by= totals equal the
rows' costs exactly (nano-USD); /admin/logs/export.csv lists what /admin/logs lists; rule events
carried by rows land in the rule_events outbox exactly once, across batches and spool replays.

Ingest is driven in process (a Telemetry object on the session gateway's database, as the
supervisor's drainer runs it), so these hold whatever the data plane puts in a row; the test
through real calls checks that the data plane fills the organisation fields."""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import json
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import msgspec
import pytest
from conftest import EmulatedProviders, Gateway

from meshfast import telemetry
from meshfast._core import Segment, request_id
from meshfast.admin import logs
from meshfast.store import database
from meshfast.telemetry import Row, RuleEvent, Telemetry

NANO = Decimal(1_000_000_000)


# --- helpers ---------------------------------------------------------------------------------


def _run(gateway: Gateway, fn: Callable[[asyncpg.Connection], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            return await fn(conn)
        finally:
            await conn.close()
    return asyncio.run(go())


def _ingest(gateway: Gateway, spool_dir: Path, rows: list[Row], *, spooled: tuple[list[Row], ...] = (),
            ring_records: int = 64) -> dict[str, int]:
    """Rows through a Telemetry object as the drainer runs it: ``rows`` through the ring (past
    its capacity they overflow into the spool), then each of ``spooled`` as a spool file that is
    replayed. Returns the writer's totals."""
    segment = Segment.create(str(spool_dir.parent / f"seg-{secrets.token_hex(4)}"), ring_records=ring_records)

    async def run() -> dict[str, int]:
        pool = await database.create_pool(gateway.database_url, role=database.GATEWAY_ROLE, min_size=0, max_size=2)
        writer = Telemetry(segment, pool, spool_dir)
        try:
            for row in rows:
                writer.record(row)
            await writer.flush()
            for batch in spooled:
                writer.spool.append([telemetry._encoder.encode(r) for r in batch])
                await writer.flush()
            return writer.metrics()
        finally:
            writer.spool.close()
            await pool.close()

    return asyncio.run(run())


def _row(model_id: str, user_id: str | None, created_ms: int, cost_nano: int, **extra: Any) -> Row:
    return Row(request_id=request_id(), created_ms=created_ms, route="proxy", outcome=extra.pop("outcome", "success"),
               status_code=extra.pop("status_code", 200), user_id=user_id, model_id=model_id, model_name="cb-model",
               tokens_in=10, tokens_out=5, input_cost_nano=cost_nano // 3, output_cost_nano=cost_nano - cost_nano // 3,
               **extra)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _window(hours: int = 2) -> dict[str, str]:
    now = dt.datetime.now(dt.UTC)
    return {"from": (now - dt.timedelta(hours=hours)).isoformat(), "to": (now + dt.timedelta(hours=hours)).isoformat()}


def _admin_get(gateway: Gateway, path: str, params: dict[str, str]) -> httpx.Response:
    return gateway.client.get(path, params=params, headers={"authorization": f"Bearer {gateway.admin_token}"})


# --- the organisation a row keeps -------------------------------------------------------------


@pytest.fixture(scope="module")
def organisation(gateway: Gateway) -> dict[str, Any]:
    """Two managers, and rows of two users on one model that exists only in these rows: one user
    moved from one business unit, manager and tier to another half way, the other without an
    organisation; the model's tags changed too. Costs are odd nano amounts (floats would drift)."""
    model_id = str(uuid.uuid4())
    managers = [gateway.create_user() for _ in range(2)]
    mover, loner = str(uuid.uuid4()), str(uuid.uuid4())
    now = _now_ms()
    rows: list[Row] = []
    for i in range(120):
        before = i < 60
        rows.append(_row(model_id, mover, now - 1000 + i, 123_456_789 + 7 * i,
                         business_unit="payments" if before else "search",
                         manager_id=managers[0]["id"] if before else managers[1]["id"],
                         tier="normal" if before else "premium",
                         tags=["opus", "frontier"] if before else ["opus"],
                         would_deny="frontier-monthly" if i % 10 == 0 else None))
    for i in range(30):
        rows.append(_row(model_id, loner, now - 500 + i, 1_000_000_001 + i,
                         outcome="denied" if i % 3 == 0 else "success", status_code=429 if i % 3 == 0 else 200,
                         deny_reason="budget_exceeded" if i % 3 == 0 else None))
    rows.append(_row(model_id, loner, now, 5, outcome="upstream_error", status_code=502, tags=["opus"]))
    return {"model_id": model_id, "managers": managers, "mover": mover, "loner": loner, "rows": rows}


@pytest.fixture(scope="module")
def ingested(gateway: Gateway, organisation: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    _ingest(gateway, tmp_path_factory.mktemp("cb") / "spool", organisation["rows"])


def test_ingested_rows_keep_the_organisation_tags_and_would_deny_they_carried(
        gateway: Gateway, organisation: dict[str, Any], ingested: None) -> None:
    """Each row stores its own business unit, manager, tier, tags and would_deny, not the user's current ones."""
    stored = _run(gateway, lambda c: c.fetch(
        "SELECT request_id, business_unit, manager_id::text, tier, tags, would_deny FROM request_logs "
        "WHERE model_id = $1", uuid.UUID(organisation["model_id"])))
    by_id = {r["request_id"]: r for r in stored}
    assert len(by_id) == len(organisation["rows"])
    for row in organisation["rows"]:
        got = by_id[row.request_id]
        assert (got["business_unit"], got["manager_id"], got["tier"], got["would_deny"]) == \
            (row.business_unit, row.manager_id, row.tier, row.would_deny)
        assert got["tags"] == (row.tags or None)


@pytest.mark.parametrize("group_by", ["business_unit", "manager", "tier", "tag"])
def test_summary_groups_total_the_rows_costs_exactly(gateway: Gateway, organisation: dict[str, Any], ingested: None,
                                                     group_by: str) -> None:
    """Each group's calls, denials, errors, tokens and cost equal plain SQL over the rows (costs to the nano-USD),
    and the groups of a grouping by person add up to the exact total."""
    model_id = organisation["model_id"]
    response = _admin_get(gateway, "/admin/logs/summary", {**_window(), "model_id": model_id, "group_by": group_by})
    assert response.status_code == 200, response.text
    body = json.loads(response.text, parse_float=Decimal)
    assert body["group_by"] == group_by
    column = {"business_unit": "business_unit", "manager": "manager_id::text", "tier": "tier", "tag": "tag"}[group_by]
    source = "request_logs CROSS JOIN LATERAL unnest(tags) AS t (tag)" if group_by == "tag" else "request_logs"
    expected = _run(gateway, lambda c: c.fetch(
        f"SELECT {column} AS key, sum(count) AS calls, sum(count) FILTER (WHERE outcome = 'denied') AS denied, "
        f"sum(count) FILTER (WHERE status_code >= 400) AS errors, sum(tokens_in) AS t_in, sum(tokens_out) AS t_out, "
        f"sum(input_cost + output_cost) AS cost FROM {source} WHERE model_id = $1 GROUP BY 1",
        uuid.UUID(model_id)))
    groups = {g["key"]: g for g in body["groups"]}
    assert set(groups) == {r["key"] for r in expected}
    for r in expected:
        g = groups[r["key"]]
        assert (g["calls"], g["denied_calls"], g["error_calls"], g["tokens_in"], g["tokens_out"]) == \
            (r["calls"], r["denied"] or 0, r["errors"] or 0, r["t_in"], r["t_out"])
        assert g["cost_usd"] == r["cost"] and g["cost_nano_usd"] == int(r["cost"] * NANO)
        assert g["input_cost_usd"] + g["output_cost_usd"] == g["cost_usd"]
    total_nano = sum(row.input_cost_nano + row.output_cost_nano for row in organisation["rows"])
    assert body["total_cost_nano_usd"] == total_nano
    if group_by != "tag":
        assert sum(g["cost_nano_usd"] for g in body["groups"]) == total_nano
        assert sum(g["calls"] for g in body["groups"]) == body["total_calls"] == len(organisation["rows"])
    if group_by == "manager":
        emails = {m["id"]: m["email"] for m in organisation["managers"]}
        assert {g["key"]: g["manager_email"] for g in body["groups"]} == {**emails, None: None}


def test_summary_refuses_an_unknown_group_by(gateway: Gateway) -> None:
    """group_by takes business_unit, manager, tier or tag; anything else is 400 invalid_request."""
    for value in ("user", "BUSINESS_UNIT", "tags"):
        response = _admin_get(gateway, "/admin/logs/summary", {"group_by": value})
        assert response.status_code == 400 and response.json()["error"] == "invalid_request", (value, response.text)


def test_listing_shows_the_organisation_at_call_time(gateway: Gateway, organisation: dict[str, Any],
                                                     ingested: None) -> None:
    """/admin/logs rows carry business_unit, manager_id, tier, would_deny and the model's tags (model_tags;
    ``tags`` is the caller's attribution object)."""
    response = _admin_get(gateway, "/admin/logs", {**_window(), "user_id": organisation["mover"], "page_size": "500"})
    assert response.status_code == 200, response.text
    listed = {r["request_id"]: r for r in response.json()["logs"]}
    for row in organisation["rows"][:120]:
        got = listed[row.request_id]
        assert (got["business_unit"], got["manager_id"], got["tier"], got["would_deny"], got["model_tags"]) == \
            (row.business_unit, row.manager_id, row.tier, row.would_deny, row.tags)


# --- the CSV export --------------------------------------------------------------------------


def _export(gateway: Gateway, params: dict[str, str]) -> list[dict[str, str]]:
    response = _admin_get(gateway, "/admin/logs/export.csv", params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    reader = csv.reader(io.StringIO(response.text, newline=""))
    header = next(reader)
    assert tuple(header) == logs.EXPORT_HEADER
    lines = list(reader)
    assert all(len(line) == len(header) for line in lines)
    return [dict(zip(header, line, strict=True)) for line in lines]


def test_export_csv_matches_the_listing(gateway: Gateway, organisation: dict[str, Any], ingested: None) -> None:
    """The export lists the rows /admin/logs lists for the same filters, in its order, costs as exact decimals."""
    params = {**_window(), "model_id": organisation["model_id"]}
    exported = _export(gateway, params)
    listed = _admin_get(gateway, "/admin/logs", {**params, "page_size": "500"}).json()["logs"]
    assert [e["request_id"] for e in exported] == [r["request_id"] for r in listed]
    rows = {r.request_id: r for r in organisation["rows"]}
    for e, r in zip(exported, listed, strict=True):
        row = rows[e["request_id"]]
        assert Decimal(e["input_cost"]) * NANO == row.input_cost_nano
        assert Decimal(e["cost"]) * NANO == row.input_cost_nano + row.output_cost_nano
        assert (e["business_unit"] or None, e["manager_id"] or None, e["tier"] or None, e["would_deny"] or None) == \
            (r["business_unit"], r["manager_id"], r["tier"], r["would_deny"])
        assert e["model_tags"] == ";".join(row.tags) and e["outcome"] == r["outcome"]
        assert int(e["status_code"]) == r["status_code"] and e["user_id"] == (r["user_id"] or "")
    assert {e["user_email"] for e in exported} == {""}  # these users exist only in the rows
    oldest_first = _export(gateway, {**params, "order": "asc"})
    assert [e["request_id"] for e in oldest_first] == [e["request_id"] for e in reversed(exported)]
    filtered = _export(gateway, {**params, "status": "denied"})
    assert len(filtered) == 10 and {e["outcome"] for e in filtered} == {"denied"}


def test_export_pages_through_many_rows_sharing_one_instant(gateway: Gateway,
                                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    """2,500 rows, most with the same created_at, export each once (the keyset pages break ties by request id),
    and the filters, a CSV-injection-safe cell and the listing's total agree."""
    model_id = str(uuid.uuid4())
    user = gateway.create_user()
    now = _now_ms()
    rows = [_row(model_id, user["id"], now if i % 5 else now - i, 1 + i, user_agent="=HYPERLINK(\"http://x\")",
                 business_unit="+ops", tier="@gold", tags=["-opus", "fine"])
            for i in range(2500)]
    _ingest(gateway, tmp_path_factory.mktemp("cb-many") / "spool", rows, ring_records=1024)
    params = {**_window(), "model_id": model_id}
    exported = _export(gateway, params)
    assert sorted(e["request_id"] for e in exported) == sorted(r.request_id for r in rows)
    assert len({e["request_id"] for e in exported}) == len(rows)
    assert _admin_get(gateway, "/admin/logs", params).json()["total"] == len(rows)
    first = exported[0]
    assert first["user_agent"] == "'=HYPERLINK(\"http://x\")" and first["business_unit"] == "'+ops"
    assert first["tier"] == "'@gold" and first["model_tags"] == "'-opus;fine" and first["user_email"] == user["email"]
    assert sum(Decimal(e["cost"]) for e in exported) * NANO == sum(1 + i for i in range(2500))


def test_export_refuses_bad_filters(gateway: Gateway) -> None:
    """The export takes /admin/logs's filters: a bad one, or a sort other than time, is 400."""
    for params in ({"status": "weird"}, {"sort": "latency_ms"}, {"user_id": "12"}, {"nope": "1"}):
        response = _admin_get(gateway, "/admin/logs/export.csv", params)
        assert response.status_code == 400 and response.json()["error"] == "invalid_request", params
    assert gateway.client.get("/admin/logs/export.csv").status_code == 401


@pytest.mark.parametrize(("value", "cell"), [("=1+2", "'=1+2"), ("+1", "'+1"), ("-1", "'-1"), ("@x", "'@x"),
                                             ("\tx", "'\tx"), ("a=b", "a=b"), (None, ""),
                                             (Decimal("0.000000100"), "0.000000100"), (["a", "=b"], "a;=b")])
def test_csv_cells_cannot_start_a_formula(value: Any, cell: str) -> None:
    """A cell a spreadsheet would run as a formula is prefixed with a quote; other values stay as they are."""
    assert logs._csv_cell(value) == cell


# --- rule events -----------------------------------------------------------------------------


def _event(rule_id: str, **extra: Any) -> RuleEvent:
    fields: dict[str, Any] = {"rule_id": rule_id, "entry": 0, "action": "notify", "channel": "webhook",
                              "window": "monthly", "window_start_ms": 1_767_225_600_000, "threshold_nano": 225_000_000_000,
                              "spend_nano": 226_000_000_000, "detail": '{"template": null, "model": "opus-4"}'}
    fields.update(extra)
    return RuleEvent(**fields)


def _events(gateway: Gateway, rule_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in _run(gateway, lambda c: c.fetch(
        "SELECT rule_id, entry, user_id::text, action, channel, \"window\", window_start, threshold_nano, spend_nano, "
        "detail, status FROM rule_events WHERE rule_id = $1 ORDER BY channel, threshold_nano", rule_id))]


def test_200_rows_carrying_one_event_give_one_outbox_row(gateway: Gateway, tmp_path: Path) -> None:
    """200 rows crossing the same threshold (many COPY batches, some overflowing into the spool) leave one
    rule_events row per natural key; an event without a caller, or one the outbox cannot take, is dropped
    while its row lands."""
    rule_id = f"cb-{secrets.token_hex(4)}"
    user_id, model_id = str(uuid.uuid4()), str(uuid.uuid4())
    now = _now_ms()
    rows = [_row(model_id, user_id, now, 100, events=[_event(rule_id, spend_nano=226_000_000_000 + i)])
            for i in range(200)]
    rows[7].events.append(_event(rule_id, channel="email"))
    rows[9].events.append(_event(rule_id, action="pause", channel="", detail='{"resume_at_ms": 1767232800000}'))
    rows.append(_row(model_id, None, now, 0, outcome="denied", status_code=401, events=[_event(rule_id, entry=5)]))
    rows.append(_row(model_id, user_id, now, 0, events=[_event(rule_id, action="explode")]))
    rows.append(_row(model_id, user_id, now, 0, events=[_event(rule_id, entry=6, detail="not json")]))
    totals = _ingest(gateway, tmp_path / "spool", rows, ring_records=64)
    assert totals["spooled"] > 0 and totals["rejected"] == 0, totals
    stored = _run(gateway, lambda c: c.fetchval("SELECT count(*) FROM request_logs WHERE model_id = $1",
                                                uuid.UUID(model_id)))
    assert stored == len(rows)
    events = _events(gateway, rule_id)
    assert [(e["action"], e["channel"]) for e in events] == [("pause", ""), ("notify", "email"), ("notify", "webhook")]
    webhook = events[-1]
    assert webhook["user_id"] == user_id and webhook["window"] == "monthly" and webhook["status"] == "pending"
    assert webhook["window_start"] == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    # The spend of whichever of the 200 landed first (rows that overflowed the ring replay before it).
    assert webhook["threshold_nano"] == 225_000_000_000 and 226_000_000_000 <= webhook["spend_nano"] < 226_000_000_200
    assert json.loads(webhook["detail"]) == {"template": None, "model": "opus-4"}


def test_rule_events_of_replayed_spool_rows_land_once(gateway: Gateway, tmp_path: Path) -> None:
    """Rows replayed from the spool bring their events with them, and replaying them again (a COPY that
    committed while its client saw an error) adds neither a row nor an event."""
    rule_id = f"cb-{secrets.token_hex(4)}"
    user_id, model_id = str(uuid.uuid4()), str(uuid.uuid4())
    now = _now_ms()
    first = [_row(model_id, user_id, now, 10, events=[_event(rule_id, threshold_nano=t)])
             for t in (90_000_000, 100_000_000)]
    later = [_row(model_id, user_id, now, 10, events=[_event(rule_id, threshold_nano=100_000_000)]),
             _row(model_id, user_id, now, 10, events=[_event(rule_id, threshold_nano=110_000_000)])]
    totals = _ingest(gateway, tmp_path / "spool", [], spooled=(first, first + later, later))
    assert totals["replayed"] == 8, totals
    stored = _run(gateway, lambda c: c.fetchval("SELECT count(*) FROM request_logs WHERE model_id = $1",
                                                uuid.UUID(model_id)))
    assert stored == 4
    assert [e["threshold_nano"] for e in _events(gateway, rule_id)] == [90_000_000, 100_000_000, 110_000_000]


def test_old_spooled_rows_decode_with_the_new_fields_at_their_defaults() -> None:
    """A row spooled before the organisation fields existed (a shorter array) still decodes and builds."""
    old = Row(request_id=request_id(), created_ms=_now_ms(), route="proxy", outcome="success", status_code=200,
              user_id=str(uuid.uuid4()), count=1)
    fields = Row.__struct_fields__
    legacy = msgspec.msgpack.encode([getattr(old, f) for f in fields[:fields.index("count") + 1]])
    decoded = telemetry._decoder.decode(legacy)
    assert (decoded.business_unit, decoded.manager_id, decoded.events, decoded.tags) == (None, None, [], [])
    record = telemetry.to_record(decoded)
    assert len(record) == len(telemetry.COLUMNS)
    columns = dict(zip(telemetry.COLUMNS, record, strict=True))
    later = ("business_unit", "manager_id", "tier", "would_deny", "tags", "trace_id", "tools_declared",
             "tools_declared_bytes", "tools_invoked")
    assert {c: columns[c] for c in later} == dict.fromkeys(later)
    assert columns["cache_write_1h_tokens"] == 0
    assert telemetry.event_records(decoded) == []


# --- through real calls ----------------------------------------------------------------------


def test_calls_keep_the_callers_organisation_after_a_reorg(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """A call's row keeps the business unit, manager and tier the caller had then; after the caller moves,
    new rows carry the new ones and the old rows stay as they were."""
    provider = gateway.create_provider("cb-p", family="openai", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key", max_retries=0)
    model = gateway.create_model(provider["id"], "cb-ok", resolved_model="dummy-ok")
    manager_a, manager_b, caller = (gateway.create_user() for _ in range(3))
    gateway.grant(caller["id"], model["id"])

    def move(body: dict[str, Any]) -> None:
        got = gateway.admin("GET", f"/admin/users/{caller['id']}")
        response = gateway.client.put(f"/admin/users/{caller['id']}", json=body, headers={
            "authorization": f"Bearer {gateway.admin_token}", "if-match": got.headers["etag"]})
        assert response.status_code == 200, response.text

    def call() -> str:
        r = gateway.client.post("/v1/proxy", params={"model": "cb-ok"}, json={"query": "hi"},
                                headers={"authorization": f"Bearer {caller['key']}"}, timeout=30)
        assert r.status_code == 200, r.text
        return r.headers["x-request-id"]

    move({"business_unit": "payments", "manager_id": manager_a["id"], "tier": "normal"})
    time.sleep(1.5)
    before = call()
    move({"business_unit": "search", "manager_id": manager_b["id"], "tier": "premium"})
    time.sleep(1.5)
    after = call()
    rows = {r["request_id"]: r for r in gateway.fetch_rows("request_id", [before, after], at_least=2)}
    assert (rows[before]["business_unit"], str(rows[before]["manager_id"]), rows[before]["tier"]) == \
        ("payments", manager_a["id"], "normal")
    assert (rows[after]["business_unit"], str(rows[after]["manager_id"]), rows[after]["tier"]) == \
        ("search", manager_b["id"], "premium")
    summary = _admin_get(gateway, "/admin/logs/summary", {**_window(), "model_id": model["id"],
                                                          "group_by": "business_unit"}).json()
    assert {g["key"]: g["calls"] for g in summary["groups"]} == {"payments": 1, "search": 1}


def test_calls_count_once_per_tag_their_model_had(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """A call on a model tagged opus and frontier counts once in each tag's group; a tag added later does
    not reach the rows already written."""
    provider = gateway.create_provider("cb-tag-p", family="openai", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key", max_retries=0)
    model = gateway.create_model(provider["id"], "cb-tagged", resolved_model="dummy-ok", tags=["opus", "frontier"])
    caller = gateway.create_user()
    gateway.grant(caller["id"], model["id"])
    time.sleep(1.5)
    r = gateway.client.post("/v1/proxy", params={"model": "cb-tagged"}, json={"query": "hi"},
                            headers={"authorization": f"Bearer {caller['key']}"}, timeout=30)
    assert r.status_code == 200, r.text
    gateway.fetch_row(r.headers["x-request-id"])
    tagged = _admin_get(gateway, "/admin/logs/summary", {**_window(), "model_id": model["id"],
                                                         "group_by": "tag"}).json()
    assert {g["key"]: g["calls"] for g in tagged["groups"]} == {"opus": 1, "frontier": 1}
