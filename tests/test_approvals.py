"""Approvals, scheduled activation, and saved vs enforced revisions of controls (API.md
"Governed lifecycle"): a business-unit administrator's tightening applies at once, its relaxing
waits in `/admin/changes` for a platform administrator; any control takes `activate_at`; reads
show `saved_revision` and `enforced_revision`. End to end on a real two-worker `meshfast serve`
with real PostgreSQL; the classification and the `local-midnight` resolver as pure functions.

Prices as in test_rules.py: every call costs exactly $0.003, so a block at $0.003 refuses a person
who made one call, and one at $1 lets them through."""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import time
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway, running_gateway, until

from meshfast.admin import changes, controls
from meshfast.admin.controls import RELAX, TIGHTEN, classify_policy, classify_restrictions, classify_rule

Json = dict[str, Any]
PROPAGATION_S = 1.5
ENV = {**SESSION_ENV, "MESHFAST_CALENDAR_TZ": "UTC"}


def _tag() -> str:
    return secrets.token_hex(4)


# --- classification (pure) ------------------------------------------------------------------------


def _entry(**fields: Any) -> Json:
    entry: Json = {"population": {"tiers": [], "leaders": [], "business_units": ["u"], "exempt_users": []},
                   "scope": {"model": "m"}, "window": "monthly", "threshold_usd": "10", "calls_per_minute": None,
                   "tokens_per_minute": None, "actions": [{"type": "block"}]}
    population = fields.pop("population", None)
    if population is not None:
        entry["population"] = {**entry["population"], **population}
    return {**entry, **fields}


def _rule_body(*entries: Json, mode: str = "enforce", weight: int = 10) -> Json:
    return {"id": "r", "weight": weight, "mode": mode, "entries": list(entries) or [_entry()]}


@pytest.mark.parametrize(("old", "new", "expected"), [
    (None, _rule_body(), TIGHTEN),  # a new rule only adds refusals
    (None, _rule_body(_entry(actions=[{"type": "warn", "text": "x"}])), TIGHTEN),
    (_rule_body(), None, RELAX),  # deleting a rule
    (_rule_body(), _rule_body(), TIGHTEN),  # unchanged
    (_rule_body(), _rule_body(_entry(threshold_usd="5")), TIGHTEN),
    (_rule_body(), _rule_body(_entry(threshold_usd="10.0")), TIGHTEN),
    (_rule_body(), _rule_body(_entry(threshold_usd="20")), RELAX),
    (_rule_body(), _rule_body(_entry(threshold_usd=None, calls_per_minute=5)), RELAX),
    (_rule_body(mode="shadow"), _rule_body(mode="enforce"), TIGHTEN),
    (_rule_body(mode="shadow"), _rule_body(mode="inherit"), TIGHTEN),
    (_rule_body(mode="enforce"), _rule_body(mode="shadow"), RELAX),
    (_rule_body(mode="enforce"), _rule_body(mode="inherit"), RELAX),
    (_rule_body(mode="inherit"), _rule_body(mode="shadow"), RELAX),
    (_rule_body(), _rule_body(_entry(actions=[])), RELAX),  # removing the block action
    (_rule_body(), _rule_body(_entry(actions=[{"type": "block"}, {"type": "warn", "text": "w"}])), TIGHTEN),
    (_rule_body(_entry(actions=[{"type": "pause", "hours": 4}])),
     _rule_body(_entry(actions=[{"type": "pause", "hours": 2}])), RELAX),
    (_rule_body(_entry(actions=[{"type": "pause", "hours": 4}])),
     _rule_body(_entry(actions=[{"type": "pause", "hours": 8}])), TIGHTEN),
    (_rule_body(), _rule_body(_entry(), _entry(threshold_usd="1")), TIGHTEN),  # an added entry
    (_rule_body(_entry(), _entry(threshold_usd="1")), _rule_body(_entry()), RELAX),  # a removed entry
    (_rule_body(_entry(), _entry(threshold_usd="1")), _rule_body(_entry(threshold_usd="1"), _entry()), TIGHTEN),
    (_rule_body(), _rule_body(_entry(population={"business_units": ["u", "v"]})), TIGHTEN),  # more units
    (_rule_body(), _rule_body(_entry(population={"business_units": []})), TIGHTEN),  # everyone
    (_rule_body(_entry(population={"business_units": []})), _rule_body(), RELAX),  # narrowed to a unit
    (_rule_body(_entry(population={"business_units": ["u", "v"]})), _rule_body(), RELAX),
    (_rule_body(), _rule_body(_entry(population={"exempt_users": ["a"]})), RELAX),  # a new exemption
    (_rule_body(_entry(population={"exempt_users": ["a"]})), _rule_body(), TIGHTEN),
    (_rule_body(), _rule_body(_entry(scope={"model": "other"})), RELAX),  # moved elsewhere
    (_rule_body(), _rule_body(_entry(window="daily")), RELAX),  # the same cap over a shorter window
    (_rule_body(_entry(window="daily")), _rule_body(), TIGHTEN),
    (_rule_body(), _rule_body(_entry(threshold_usd="5", actions=[])), RELAX),  # mixed: counts as relaxing
    (_rule_body(), _rule_body(weight=99), TIGHTEN),  # weight only orders refusals
])
def test_a_rule_change_is_classified_as_tightening_or_relaxing(old: Json | None, new: Json | None,
                                                                 expected: str) -> None:
    """classify_rule: only a change refusing at least what the rule refused tightens."""
    assert classify_rule(old, new) == expected


def _restrictions(**fields: Any) -> Json:
    return {"leader_deny": [], "leader_allow": None, "exempt": [], "business_units_closed": [],
            "business_units_open": None, **fields}


@pytest.mark.parametrize(("old", "new", "expected"), [
    (None, _restrictions(), TIGHTEN),
    (None, _restrictions(leader_deny=["a"]), TIGHTEN),
    (_restrictions(leader_deny=["a"]), _restrictions(leader_deny=["a", "b"]), TIGHTEN),
    (_restrictions(leader_deny=["a", "b"]), _restrictions(leader_deny=["a"]), RELAX),  # removing an entry
    (_restrictions(), _restrictions(leader_allow=["a"]), TIGHTEN),  # an allow list where there was none
    (_restrictions(leader_allow=["a"]), _restrictions(), RELAX),
    (_restrictions(leader_allow=["a", "b"]), _restrictions(leader_allow=["a"]), TIGHTEN),
    (_restrictions(leader_allow=["a"]), _restrictions(leader_allow=["a", "b"]), RELAX),
    (_restrictions(), _restrictions(exempt=["a"]), RELAX),
    (_restrictions(exempt=["a"]), _restrictions(), TIGHTEN),
    (_restrictions(), _restrictions(business_units_closed=["legal"]), TIGHTEN),  # closing a unit
    (_restrictions(business_units_closed=["legal"]), _restrictions(), RELAX),  # reopening it
    (_restrictions(business_units_closed=["legal"]), None, RELAX),  # clearing every restriction
    (_restrictions(business_units_open=["a", "b"]), _restrictions(business_units_open=["a"]), TIGHTEN),
    (_restrictions(business_units_open=["a"]), _restrictions(business_units_open=None), RELAX),
    (_restrictions(leader_deny=["a"]), _restrictions(business_units_closed=["x"]), RELAX),  # mixed
])
def test_a_restrictions_change_is_classified(old: Json | None, new: Json | None, expected: str) -> None:
    """classify_restrictions: more denied or closed, fewer allowed, open or exempt tightens."""
    assert classify_restrictions(old, new) == expected


def _policy(**fields: Any) -> Json:
    return {**controls.DEFAULT_POLICY, **fields}


@pytest.mark.parametrize(("old", "new", "expected"), [
    (None, _policy(daily_cap_usd="5"), TIGHTEN),  # a lower cap than the default 20
    (None, _policy(daily_cap_usd="50"), RELAX),
    (_policy(daily_cap_usd="5"), _policy(daily_cap_usd="4.99"), TIGHTEN),
    (_policy(daily_cap_usd="5"), _policy(daily_cap_usd="6"), RELAX),
    (_policy(), _policy(max_calls_per_hour=10), TIGHTEN),
    (_policy(max_calls_per_hour=10), _policy(), RELAX),
    (_policy(max_calls_per_hour=10), _policy(max_calls_per_hour=20), RELAX),
    (_policy(), _policy(active_days=[1, 2, 3, 4, 5]), TIGHTEN),  # fewer days
    (_policy(active_days=[1, 2, 3, 4, 5]), _policy(), RELAX),
    (_policy(), _policy(allowed_from="09:00", allowed_to="17:00"), TIGHTEN),  # fewer hours
    (_policy(allowed_from="09:00", allowed_to="17:00"), _policy(allowed_from="08:00", allowed_to="17:00"), RELAX),
    (_policy(allowed_from="09:00", allowed_to="17:00"), _policy(allowed_from="10:00", allowed_to="16:00"), TIGHTEN),
    (_policy(allowed_from="22:00", allowed_to="06:00"), _policy(allowed_from="23:00", allowed_to="05:00"), TIGHTEN),
    (_policy(allowed_from="22:00", allowed_to="06:00"), _policy(allowed_from="05:00", allowed_to="07:00"), RELAX),
    (_policy(allowed_from="09:00", allowed_to="17:00"),
     _policy(allowed_from="09:00", allowed_to="17:00", timezone="Asia/Tokyo"), RELAX),  # other instants
    (_policy(), _policy(timezone="Asia/Tokyo"), TIGHTEN),  # all day, every day, anywhere
    (_policy(allowed_from="09:00", allowed_to="17:00"), _policy(always_open=True), RELAX),
    (_policy(always_open=True), _policy(allowed_from="09:00", allowed_to="17:00"), TIGHTEN),
    (_policy(daily_cap_usd="5"), _policy(daily_cap_usd="4", allowed_from="01:00", allowed_to="02:00"), TIGHTEN),
    (_policy(daily_cap_usd="5"), _policy(daily_cap_usd="4", max_calls_per_hour=None, always_open=True), RELAX),
])
def test_a_policy_change_is_classified(old: Json | None, new: Json | None, expected: str) -> None:
    """classify_policy: a lower cap, fewer hours or days tighten; a higher cap, wider hours relax."""
    assert classify_policy(old, new) == expected


# --- activate_at (pure, fixed clock) ---------------------------------------------------------------

NOW = dt.datetime(2026, 3, 7, 20, 30, tzinfo=dt.UTC)  # a Saturday, the eve of a US DST change


@pytest.mark.parametrize(("zone", "expected"), [
    ("UTC", dt.datetime(2026, 3, 8, 0, 0, tzinfo=dt.UTC)),
    (None, dt.datetime(2026, 3, 8, 0, 0, tzinfo=dt.UTC)),
    # 02:00 local on the 8th in Kolkata: past midnight already, so the next one is the 9th's.
    ("Asia/Kolkata", dt.datetime(2026, 3, 8, 18, 30, tzinfo=dt.UTC)),
    # 15:30 EST: midnight tonight is 05:00 UTC (the DST change is at 02:00, after it).
    ("America/New_York", dt.datetime(2026, 3, 8, 5, 0, tzinfo=dt.UTC)),
    ("Pacific/Auckland", dt.datetime(2026, 3, 8, 11, 0, tzinfo=dt.UTC)),
    ("Not/AZone", dt.datetime(2026, 3, 8, 0, 0, tzinfo=dt.UTC)),  # an unknown zone reads as UTC
])
def test_local_midnight_is_the_next_midnight_in_the_units_timezone(zone: str | None, expected: dt.datetime) -> None:
    """resolve_activate_at("local-midnight") with a fixed clock: the next local midnight, as UTC."""
    assert changes.resolve_activate_at("local-midnight", zone, NOW) == expected


def test_activate_at_takes_a_future_rfc3339_time_with_an_offset() -> None:
    """An offset is required, the moment must be ahead; anything else is a 400."""
    assert changes.resolve_activate_at(None, "UTC", NOW) is None
    assert changes.resolve_activate_at("2026-03-08T01:00:00+01:00", "UTC", NOW) == \
        dt.datetime(2026, 3, 8, 0, 0, tzinfo=dt.UTC)
    assert changes.resolve_activate_at("2026-03-07T21:00:00Z", "UTC", NOW) == \
        dt.datetime(2026, 3, 7, 21, 0, tzinfo=dt.UTC)
    for bad in ("2026-03-07T20:00:00Z", "2026-03-08T01:00:00", "2026-03-08", "tomorrow", 5, "", "9999-01-01T00:00Z"):
        with pytest.raises(Exception) as raised:
            changes.resolve_activate_at(bad, "UTC", NOW)
        assert getattr(raised.value, "code", None) == "invalid_request", bad


def test_the_change_unit_and_digest_are_stable() -> None:
    """The unit a change concerns (the actor's single unit first) and its digest (order-free JSON)."""
    assert changes.change_unit(frozenset({"a"}), {"b"}) == "a"
    assert changes.change_unit(frozenset({"a", "b"}), {"b", "c"}) == "b"
    assert changes.change_unit(None, {"c", "b"}) == "b"
    assert changes.change_unit(None, set()) is None
    one = changes.change_digest("rule", "r", "update", {"a": 1, "b": [1, 2]}, None)
    assert one == changes.change_digest("rule", "r", "update", {"b": [1, 2], "a": 1}, None)
    assert one != changes.change_digest("rule", "r", "update", {"a": 1, "b": [1, 2]}, NOW)
    assert changes.fingerprint(None) == "absent" and changes.fingerprint({"a": 1}) != "absent"


def test_every_control_kind_registers_once() -> None:
    """The registry holds the three built-in kinds; registering another under a taken name fails."""
    assert {"rule", "restrictions", "policy"} <= set(controls.KINDS)
    clone = controls.ControlKind("rule", controls.RULE.load, controls.RULE.check, controls.RULE.apply,
                                 controls.RULE.classify, controls.RULE.units)
    with pytest.raises(ValueError):
        controls.register(clone)


# --- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_gateway(2, env=ENV) as gateway:
        yield gateway


def _sql(gw: Gateway, statement: str, *args: Any) -> list[Json]:
    return gw.query(statement, *args)


def _unit(gw: Gateway, timezone: str = "UTC", lock_usd: str = "100") -> str:
    """A unit whose administrators may set caps up to ``lock_usd`` (the platform's lock)."""
    name = f"bu-{_tag()}"
    _sql(gw, "INSERT INTO business_units (name, timezone, daily_cap_lock_usd) VALUES ($1, $2, $3::numeric)",
         name, timezone, lock_usd)
    return name


def _token(gw: Gateway, units: list[str] | None, is_super: bool = False, owner: str | None = None) -> str:
    """An admin token; with ``units`` scoped to them (a business-unit administrator's)."""
    made = gw.admin("POST", "/admin/tokens", {"name": f"tok-{_tag()}", "is_super": is_super})
    assert made.status_code == 201, made.text
    _sql(gw, "UPDATE admin_tokens SET business_units = $2, owner_admin_id = $3::uuid WHERE id = $1::uuid",
         made.json()["id"], units, owner)
    return str(made.json()["token"])


def _user(gw: Gateway, unit: str | None = None) -> Json:
    email = f"ap-{_tag()}@example.com"
    body: Json = {"email": email, "display_name": email.split("@")[0]}
    if unit is not None:
        body["business_unit"] = unit
    response = gw.admin("POST", "/admin/users", body)
    assert response.status_code == 201, response.text
    return response.json()


def _model(gw: Gateway, testserve: EmulatedProviders) -> Json:
    provider = gw.create_provider(f"ap-p-{_tag()}", base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
    return gw.create_model(provider["id"], f"ap-m-{_tag()}", resolved_model="dummy-chat",
                           input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")


def _call(gw: Gateway, person: Json, model: Json) -> int:
    response = gw.client.post("/v1/proxy", params={"model": model["name"]},
                              headers={"authorization": f"Bearer {person['key']}"},
                              json={"query": "hello", "max_tokens": 3})
    return response.status_code


def _calls(gw: Gateway, person: Json, model: Json, n: int = 6) -> set[int]:
    """The statuses of ``n`` calls (over both workers: the kernel spreads the connections)."""
    statuses = set()
    for _ in range(n):
        with httpx.Client(base_url=gw.base_url, timeout=10) as client:
            response = client.post("/v1/proxy", params={"model": model["name"]},
                                   headers={"authorization": f"Bearer {person['key']}"},
                                   json={"query": "hello", "max_tokens": 3})
            statuses.add(response.status_code)
    return statuses


def _as(gw: Gateway, token: str, method: str, path: str, body: Any = None,
        headers: dict[str, str] | None = None) -> httpx.Response:
    return gw.client.request(method, path, json=body, headers={"authorization": f"Bearer {token}", **(headers or {})})


def _block_rule(unit: str, model: Json, threshold: str = "0.003", **extra: Any) -> Json:
    return {"id": f"ap-{_tag()}", "weight": 10, "mode": "enforce", "entries": [
        {"population": {"business_units": [unit]}, "scope": {"model": model["name"]}, "window": "monthly",
         "threshold_usd": threshold, "actions": [{"type": "block"}]}], **extra}


def _put_rule(gw: Gateway, token: str, rule: Json, **extra: Any) -> httpx.Response:
    current = _as(gw, token, "GET", f"/admin/rules/{rule['id']}")
    assert current.status_code == 200, current.text
    return _as(gw, token, "PUT", f"/admin/rules/{rule['id']}", {**rule, **extra},
               {"if-match": current.headers["etag"]})


def _audit_rows(gw: Gateway, action: str, target: str) -> list[Json]:
    return _sql(gw, "SELECT actor, action, target, detail, business_unit FROM admin_audit_log "
                    "WHERE action = $1 AND target = $2 ORDER BY id", action, target)


def _spent_person(gw: Gateway, testserve: EmulatedProviders, unit: str) -> tuple[Json, Json]:
    """A person of ``unit`` with one call ($0.003) on a fresh model."""
    model = _model(gw, testserve)
    person = _user(gw, unit)
    gw.grant(person["id"], model["id"])
    assert _call(gw, person, model) == 200
    return person, model


def test_a_unit_admins_tightening_applies_at_once_and_its_relaxing_waits_for_approval(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A unit administrator's new block rule is 201 and enforced at once; raising its threshold is
    202 pending (the rule and the data plane unchanged, saved = enforced = 1), visible in the
    unit's queue only; a platform administrator's approval applies exactly it, and every worker
    lets the person through; each step is audited with the unit."""
    unit = _unit(gw)
    admin = _token(gw, [unit])
    other_unit = _token(gw, [_unit(gw)])
    person, model = _spent_person(gw, testserve, unit)
    rule = _block_rule(unit, model)

    created = _as(gw, admin, "POST", "/admin/rules", rule)
    assert created.status_code == 201, created.text
    assert (created.json()["saved_revision"], created.json()["enforced_revision"]) == (1, 1)
    time.sleep(PROPAGATION_S)
    assert _calls(gw, person, model) == {429}, "the tightening is enforced at once"

    relaxed = _put_rule(gw, admin, rule, entries=[{**rule["entries"][0], "threshold_usd": "1"}])
    assert relaxed.status_code == 202, relaxed.text
    assert relaxed.json()["status"] == "pending"
    change_id = relaxed.json()["change_id"]
    read = _as(gw, admin, "GET", f"/admin/rules/{rule['id']}").json()
    assert read["entries"][0]["threshold_usd"] == "0.003" and read["version"] == 1
    assert (read["saved_revision"], read["enforced_revision"]) == (1, 1)
    time.sleep(PROPAGATION_S)
    assert _calls(gw, person, model) == {429}, "a pending change is not enforced"

    mine = _as(gw, admin, "GET", "/admin/changes?status=pending").json()["changes"]
    assert [c["id"] for c in mine if c["target"] == rule["id"]] == [change_id]
    theirs = _as(gw, other_unit, "GET", "/admin/changes").json()["changes"]
    assert all(c["id"] != change_id for c in theirs), "another unit's administrator does not see it"
    assert _as(gw, other_unit, "GET", f"/admin/changes/{change_id}").status_code == 404
    shown = gw.admin("GET", f"/admin/changes/{change_id}")
    assert shown.status_code == 200 and shown.headers["etag"] == f'"{shown.json()["digest"]}"'
    change = shown.json()
    assert (change["kind"], change["action"], change["business_unit"]) == ("rule", "update", unit)
    assert change["body"]["entries"][0]["threshold_usd"] == "1"

    approved = gw.client.post(f"/admin/changes/{change_id}/approve",
                              headers={"authorization": f"Bearer {gw.admin_token}", "if-match": shown.headers["etag"]})
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "applied"
    after = gw.admin("GET", f"/admin/rules/{rule['id']}").json()
    assert after["entries"][0]["threshold_usd"] == "1" and (after["saved_revision"], after["enforced_revision"]) == (2, 2)
    time.sleep(PROPAGATION_S)
    assert _calls(gw, person, model, 8) == {200}, "every worker enforces the approved change"
    again = gw.client.post(f"/admin/changes/{change_id}/approve", headers={"authorization": f"Bearer {gw.admin_token}"})
    assert (again.status_code, again.json()["error"]) == (409, "change_not_pending")

    for action in ("change.submit", "change.approve", "control.activate"):
        rows = _audit_rows(gw, action, rule["id"])
        assert len(rows) == 1 and rows[0]["business_unit"] == unit, action
    assert [r["business_unit"] for r in _audit_rows(gw, "create_rule", rule["id"])] == [unit]


def test_only_another_platform_administrator_decides_and_a_rejection_says_why(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """The requester cannot approve or reject its own change (403 self_approval, by token or by the
    admin it answers to); a non-platform administrator gets 403 forbidden; a rejection without a
    comment is 400 comment_required, with one it rejects and the rule stays."""
    unit = _unit(gw)
    owner = _sql(gw, "INSERT INTO admins (email, password_hash, is_super, created_by) VALUES ($1, 'x', true, 'test') RETURNING id::text",
                 f"own-{_tag()}@example.com")[0]["id"]
    admin = _token(gw, [unit], owner=owner)
    same_owner = _token(gw, None, is_super=True, owner=owner)
    plain = _token(gw, None)
    _, model = _spent_person(gw, testserve, unit)
    rule = _block_rule(unit, model)
    assert gw.admin("POST", "/admin/rules", rule).status_code == 201
    pending = _as(gw, admin, "DELETE", f"/admin/rules/{rule['id']}")
    assert pending.status_code == 202, pending.text
    change_id = pending.json()["change_id"]

    for token in (admin, same_owner):
        for verb, body in (("approve", None), ("reject", {"comment": "no"})):
            answer = _as(gw, token, "POST", f"/admin/changes/{change_id}/{verb}", body)
            assert (answer.status_code, answer.json()["error"]) == (403, "self_approval"), (verb, answer.text)
    refused = _as(gw, plain, "POST", f"/admin/changes/{change_id}/approve")
    assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")
    for body in (None, {}, {"comment": "  "}):
        answer = gw.admin("POST", f"/admin/changes/{change_id}/reject", body)
        assert (answer.status_code, answer.json()["error"]) == (400, "comment_required"), body
    rejected = gw.admin("POST", f"/admin/changes/{change_id}/reject", {"comment": "keep the cap"})
    assert rejected.status_code == 200, rejected.text
    assert (rejected.json()["status"], rejected.json()["comment"]) == ("rejected", "keep the cap")
    assert gw.admin("GET", f"/admin/rules/{rule['id']}").status_code == 200, "a rejected delete deletes nothing"
    assert gw.admin("GET", "/admin/changes?status=rejected").json()["total"] >= 1
    assert _audit_rows(gw, "change.reject", rule["id"])[0]["business_unit"] == unit


def test_an_edited_pending_change_refuses_the_digest_reviewed_and_a_stale_one_conflicts(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """The requester's second relaxing write edits its pending change (same id, new digest):
    approving with the old digest is 409 change_modified. A change whose control was written since
    is 409 version_conflict; the requester's own write that applies at once supersedes it."""
    unit = _unit(gw)
    admin = _token(gw, [unit])
    _, model = _spent_person(gw, testserve, unit)
    rule = _block_rule(unit, model)
    assert _as(gw, admin, "POST", "/admin/rules", rule).status_code == 201
    first = _put_rule(gw, admin, rule, mode="shadow")
    assert first.status_code == 202, first.text
    reviewed = gw.admin("GET", f"/admin/changes/{first.json()['change_id']}").headers["etag"]
    second = _put_rule(gw, admin, rule, mode="inherit")
    assert second.status_code == 202 and second.json()["change_id"] == first.json()["change_id"]
    assert second.json()["digest"] != first.json()["digest"]
    approve = f"/admin/changes/{first.json()['change_id']}/approve"
    stale = gw.client.post(approve, headers={"authorization": f"Bearer {gw.admin_token}", "if-match": reviewed})
    assert (stale.status_code, stale.json()["error"]) == (409, "change_modified")

    assert _put_rule(gw, gw.admin_token, rule, weight=11).status_code == 200  # the control changes
    conflict = gw.client.post(approve, headers={"authorization": f"Bearer {gw.admin_token}",
                                                "if-match": f'"{second.json()["digest"]}"'})
    assert (conflict.status_code, conflict.json()["error"]) == (409, "version_conflict")
    assert gw.admin("GET", f"/admin/rules/{rule['id']}").json()["mode"] == "enforce"
    assert not _audit_rows(gw, "change.approve", rule["id"]), "a refused approval leaves no audit record"

    tightened = _put_rule(gw, admin, rule, weight=12)  # the requester's own write that applies at once
    assert tightened.status_code == 200, tightened.text
    assert gw.admin("GET", f"/admin/changes/{first.json()['change_id']}").json()["status"] == "superseded"


def test_an_approval_with_activate_at_goes_live_at_that_time_and_not_before(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A relaxing change with activate_at a few seconds ahead, approved at once: the rule reads
    saved 2, enforced 1 with `scheduled`, the data plane still refuses; at activate_at (within the
    leader's second) it is enforced on every worker."""
    unit = _unit(gw)
    admin = _token(gw, [unit])
    person, model = _spent_person(gw, testserve, unit)
    rule = _block_rule(unit, model)
    assert _as(gw, admin, "POST", "/admin/rules", rule).status_code == 201
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=6)
    pending = _put_rule(gw, admin, rule, entries=[{**rule["entries"][0], "threshold_usd": "1"}],
                        activate_at=at.isoformat())
    assert pending.status_code == 202, pending.text
    approved = gw.admin("POST", f"/admin/changes/{pending.json()['change_id']}/approve")
    assert approved.status_code == 200 and approved.json()["status"] == "approved", approved.text
    read = gw.admin("GET", f"/admin/rules/{rule['id']}").json()
    assert (read["saved_revision"], read["enforced_revision"]) == (2, 1)
    assert read["scheduled"]["revision"] == 2 and read["entries"][0]["threshold_usd"] == "0.003"
    time.sleep(PROPAGATION_S)
    assert dt.datetime.now(dt.UTC) < at - dt.timedelta(seconds=1), "the machine was too slow for this check"
    assert _calls(gw, person, model) == {429}, "not before activate_at"

    until(lambda: gw.admin("GET", f"/admin/rules/{rule['id']}").json()["enforced_revision"] == 2, 15, "activation")
    assert dt.datetime.now(dt.UTC) >= at
    read = gw.admin("GET", f"/admin/rules/{rule['id']}").json()
    assert "scheduled" not in read and read["entries"][0]["threshold_usd"] == "1"
    assert gw.admin("GET", f"/admin/changes/{pending.json()['change_id']}").json()["status"] == "applied"
    time.sleep(PROPAGATION_S)
    assert _calls(gw, person, model, 8) == {200}


def test_a_scheduled_revision_that_no_longer_validates_fails_and_the_last_good_one_stays(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A platform administrator schedules a rule moved to another model, then deletes that model:
    at activate_at the revision fails (activation_error, audit control.activation_failed), the
    enforced revision and the data plane's refusal stay."""
    unit = _unit(gw)
    person, model = _spent_person(gw, testserve, unit)
    doomed = _model(gw, testserve)
    rule = _block_rule(unit, model)
    assert gw.admin("POST", "/admin/rules", rule).status_code == 201
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)).isoformat()
    moved = {**rule["entries"][0], "scope": {"model": doomed["name"]}}
    scheduled = _put_rule(gw, gw.admin_token, rule, entries=[moved], activate_at=at)
    assert scheduled.status_code == 200, scheduled.text
    assert scheduled.json()["scheduled"]["revision"] == 2 and scheduled.json()["enforced_revision"] == 1
    assert gw.admin("DELETE", f"/admin/models/{doomed['id']}").status_code == 200

    until(lambda: "activation_error" in gw.admin("GET", f"/admin/rules/{rule['id']}").json(), 15, "the failure")
    read = gw.admin("GET", f"/admin/rules/{rule['id']}").json()
    assert read["enforced_revision"] == 1 and read["activation_error"]["revision"] == 2
    assert doomed["name"] in read["activation_error"]["error"]
    assert read["entries"][0]["scope"] == {"model": model["name"]} and "scheduled" not in read
    failed = _audit_rows(gw, "control.activation_failed", rule["id"])
    assert len(failed) == 1 and failed[0]["business_unit"] == unit
    assert not _audit_rows(gw, "control.activate", rule["id"])
    assert _calls(gw, person, model) == {429}, "the last good revision is enforced"


def test_restrictions_and_policies_follow_the_same_lifecycle(gw: Gateway, testserve: EmulatedProviders) -> None:
    """A unit administrator closes a model to its unit at once (the unit's person is refused);
    reopening it waits (still refused) until approved. Lowering a person's cap applies, raising
    it waits; both reads show saved and enforced revisions."""
    unit = _unit(gw)
    admin = _token(gw, [unit])
    person, model = _spent_person(gw, testserve, unit)

    def put_model(token: str, body: Json) -> httpx.Response:
        etag = gw.admin("GET", f"/admin/models/{model['id']}").headers["etag"]
        return _as(gw, token, "PUT", f"/admin/models/{model['id']}", body, {"if-match": etag})

    closed = put_model(admin, {"restrictions": {"business_units_closed": [unit]}})
    assert closed.status_code == 200, closed.text
    assert closed.json()["restrictions_revisions"] == {"saved_revision": 1, "enforced_revision": 1}
    time.sleep(PROPAGATION_S)
    assert _calls(gw, person, model) == {403}
    # A unit administrator may change only its units' closure: reopening is that list emptied.
    reopened = put_model(admin, {"restrictions": {"business_units_closed": []}})
    assert reopened.status_code == 202 and reopened.json()["status"] == "pending", reopened.text
    time.sleep(PROPAGATION_S)
    assert _calls(gw, person, model) == {403}, "still closed while pending"
    assert gw.admin("POST", f"/admin/changes/{reopened.json()['change_id']}/approve").status_code == 200
    read = gw.admin("GET", f"/admin/models/{model['id']}").json()
    assert read["restrictions"]["business_units_closed"] == [] and read["restrictions_revisions"]["enforced_revision"] == 2
    time.sleep(PROPAGATION_S)
    assert _calls(gw, person, model) == {200}

    path = f"/admin/users/{person['id']}/policies/{model['id']}"
    lower = _as(gw, admin, "PUT", path, {"daily_cap_usd": "5"})
    assert (lower.status_code, lower.json()) == (200, {"status": "ok"})
    higher = _as(gw, admin, "PUT", path, {"daily_cap_usd": "50"})
    assert higher.status_code == 202, higher.text
    listed = {p["model_id"]: p for p in gw.admin("GET", f"/admin/users/{person['id']}/policies").json()}
    assert listed[model["id"]]["daily_cap_usd"] == 5.0
    assert (listed[model["id"]]["saved_revision"], listed[model["id"]]["enforced_revision"]) == (1, 1)
    assert gw.admin("POST", f"/admin/changes/{higher.json()['change_id']}/approve").status_code == 200
    listed = {p["model_id"]: p for p in gw.admin("GET", f"/admin/users/{person['id']}/policies").json()}
    assert listed[model["id"]]["daily_cap_usd"] == 50.0 and listed[model["id"]]["enforced_revision"] == 2


def test_unscoped_writes_apply_at_once_and_activate_at_is_checked(gw: Gateway, testserve: EmulatedProviders) -> None:
    """A platform administrator's relaxing write is never 202; a past, zone-less or malformed
    activate_at is 400 (nothing written); a scheduled delete answers its revision; a scheduled
    create answers version 0 until it goes live; local-midnight resolves in the unit's zone."""
    unit = _unit(gw, "Pacific/Auckland")
    admin = _token(gw, [unit])
    _, model = _spent_person(gw, testserve, unit)
    rule = _block_rule(unit, model)
    assert gw.admin("POST", "/admin/rules", rule).status_code == 201
    relaxed = _put_rule(gw, gw.admin_token, rule, mode="shadow")
    assert relaxed.status_code == 200 and relaxed.json()["mode"] == "shadow"
    for bad in ("2020-01-01T00:00:00Z", "2030-01-01T00:00:00", "soon"):
        answer = _put_rule(gw, gw.admin_token, rule, mode="enforce", activate_at=bad)
        assert (answer.status_code, answer.json()["error"]) == (400, "invalid_request"), bad
        assert gw.admin("DELETE", f"/admin/rules/{rule['id']}?activate_at={bad}").status_code == 400
    assert gw.admin("GET", f"/admin/rules/{rule['id']}").json()["saved_revision"] == 2

    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    deleting = gw.admin("DELETE", f"/admin/rules/{rule['id']}?activate_at={later}")
    assert deleting.status_code == 200 and deleting.json()["status"] == "scheduled", deleting.text
    # A newer write supersedes a revision still waiting: the schedule never lands on top of it.
    assert gw.admin("GET", f"/admin/rules/{rule['id']}").json()["scheduled"] is not None
    now = _put_rule(gw, gw.admin_token, rule, mode="enforce")
    assert now.status_code == 200, now.text
    read = gw.admin("GET", f"/admin/rules/{rule['id']}").json()
    assert read.get("scheduled") is None and read["saved_revision"] == read["enforced_revision"] == 4
    statuses = {r["revision"]: r["status"] for r in _sql(
        gw, "SELECT revision, status FROM control_revisions WHERE kind = 'rule' AND target = $1", rule["id"])}
    assert statuses[3] == "superseded" and statuses[4] == "enforced", statuses

    future = _block_rule(unit, model)
    created = _as(gw, admin, "POST", "/admin/rules", {**future, "activate_at": "local-midnight"})
    assert created.status_code == 201, created.text
    assert created.json()["version"] == 0 and created.json()["enforced_revision"] is None
    expected = changes.resolve_activate_at("local-midnight", "Pacific/Auckland", dt.datetime.now(dt.UTC))
    assert created.json()["scheduled"]["activate_at"] == changes._moment(expected)
    assert gw.admin("GET", f"/admin/rules/{future['id']}").status_code == 404, "not live before activate_at"


def test_a_failing_write_or_approval_leaves_no_audit_record(gw: Gateway, testserve: EmulatedProviders) -> None:
    """An invalid rule from a unit administrator is 400 with no audit record; approving a change
    whose model was deleted since is 400 and leaves the change pending, unaudited."""
    unit = _unit(gw)
    admin = _token(gw, [unit])
    _, model = _spent_person(gw, testserve, unit)
    bad = {**_block_rule(unit, model), "mode": "sometimes"}
    assert _as(gw, admin, "POST", "/admin/rules", bad).status_code == 400
    assert not _audit_rows(gw, "create_rule", bad["id"]) and not _audit_rows(gw, "change.submit", bad["id"])

    doomed = _model(gw, testserve)
    rule = _block_rule(unit, doomed)
    assert _as(gw, admin, "POST", "/admin/rules", rule).status_code == 201
    pending = _put_rule(gw, admin, rule, mode="shadow")
    assert pending.status_code == 202
    # The API refuses to delete a model a rule names (409 model_in_use): the model goes by SQL,
    # as a database restored from an older backup would lose it.
    assert gw.admin("DELETE", f"/admin/models/{doomed['id']}").status_code == 409
    _sql(gw, "DELETE FROM models WHERE id = $1::uuid", doomed["id"])
    answer = gw.admin("POST", f"/admin/changes/{pending.json()['change_id']}/approve")
    assert (answer.status_code, answer.json()["error"]) == (400, "invalid_rule"), answer.text
    assert gw.admin("GET", f"/admin/changes/{pending.json()['change_id']}").json()["status"] == "pending"
    assert not _audit_rows(gw, "change.approve", rule["id"])


def test_a_pending_change_expires_after_its_ttl(testserve: EmulatedProviders) -> None:
    """With MESHFAST_CHANGE_TTL_S=2 the leader expires a pending change (audited change.expire);
    approving it then is 409 change_expired."""
    with running_gateway(1, env={**ENV, "MESHFAST_CHANGE_TTL_S": "2"}) as gw:
        unit = _unit(gw)
        admin = _token(gw, [unit])
        _, model = _spent_person(gw, testserve, unit)
        rule = _block_rule(unit, model)
        assert _as(gw, admin, "POST", "/admin/rules", rule).status_code == 201
        pending = _as(gw, admin, "DELETE", f"/admin/rules/{rule['id']}")
        assert pending.status_code == 202
        change = f"/admin/changes/{pending.json()['change_id']}"
        until(lambda: gw.admin("GET", change).json()["status"] == "expired", 15, "expiry")
        answer = gw.admin("POST", f"{change}/approve")
        assert (answer.status_code, answer.json()["error"]) == (409, "change_expired")
        rows = _audit_rows(gw, "change.expire", rule["id"])
        assert len(rows) == 1 and rows[0]["business_unit"] == unit
        assert gw.admin("GET", f"/admin/rules/{rule['id']}").status_code == 200


def test_a_logged_in_unit_administrator_is_scoped_by_its_units(gw: Gateway, testserve: EmulatedProviders) -> None:
    """A (non-super) admin listed for a unit, signed in with a session, is that unit's
    administrator: its relaxing write waits (the change names the admin), its tightening applies."""
    unit = _unit(gw)
    email, password = f"bu-{_tag()}@example.com", "a-long-password-" + _tag()
    made = gw.admin("POST", "/admin/admins", {"email": email, "password": password})
    assert made.status_code == 201, made.text
    _sql(gw, "INSERT INTO business_unit_admins (business_unit_id, admin_id) "
             "SELECT bu.id, a.id FROM business_units bu, admins a WHERE bu.name = $1 AND a.email = $2", unit, email)
    admin_id = _sql(gw, "SELECT id::text FROM admins WHERE email = $1", email)[0]["id"]
    _, model = _spent_person(gw, testserve, unit)
    rule = _block_rule(unit, model)
    with httpx.Client(base_url=gw.base_url, timeout=10) as client:
        for _ in range(6):
            login = client.post("/admin/login", json={"email": email, "password": password})
            if login.status_code != 429:
                break
            time.sleep(1.1)  # the per-IP login throttle
        assert login.status_code == 200, login.text
        csrf = {"x-csrf-token": login.json()["csrf_token"]}
        assert client.post("/admin/rules", json=rule, headers=csrf).status_code == 201
        pending = client.delete(f"/admin/rules/{rule['id']}", headers=csrf)
        assert pending.status_code == 202, pending.text
        change = gw.admin("GET", f"/admin/changes/{pending.json()['change_id']}").json()
        assert (change["requested_by"], change["requested_by_admin_id"], change["business_unit"]) == \
            (email, admin_id, unit)
        own = client.post(f"/admin/changes/{change['id']}/approve", headers=csrf)
        assert (own.status_code, own.json()["error"]) == (403, "self_approval")


def test_a_kind_registered_later_is_governed_by_its_registration_alone(gw: Gateway) -> None:
    """A new control kind (as pilots will be) registers load, check, apply, classify and units,
    and the lifecycle queues, approves and schedules it with no other code: here a kind whose
    live state is a dict, on the gateway's database."""
    from meshfast.admin.routes import Actor

    live: dict[str, Json] = {}

    async def load(conn: Any, target: str) -> Json | None:
        return live.get(target)

    async def check(conn: Any, target: str, action: str, proposed: Any) -> Any:
        if action != "delete" and not isinstance(proposed.get("members"), list):
            raise changes.errors.InvalidRequest("members must be a list")
        return None if action == "delete" else proposed

    async def apply(conn: Any, target: str, action: str, state: Any) -> None:
        if state is None:
            live.pop(target, None)
        else:
            live[target] = state

    def classify(old: Json | None, new: Json | None) -> controls.Direction:
        # Fewer members is tighter (a cohort's access); more is relaxing.
        return TIGHTEN if set((new or {}).get("members", ())) <= set((old or {}).get("members", ())) else RELAX

    async def units(conn: Any, target: str, state: Any) -> set[str]:
        return {"pilots-unit"}

    name = f"demo-{_tag()}"
    controls.register(controls.ControlKind(name, load, check, apply, classify, units))
    unit_admin = Actor(name="bu@example.com", is_super=False, id="token:bu", business_units=frozenset({"pilots-unit"}))
    platform = Actor(name="root", is_super=True, id="token:root")

    async def scenario() -> None:
        pool = await asyncpg.create_pool(gw.database_url, min_size=1, max_size=2)
        written: list[int] = []

        async def after_write(seq: int, change: str) -> None:
            written.append(seq)

        try:
            lifecycle = changes.Lifecycle(pool, after_write)
            live["p1"] = {"members": ["a"]}
            grown = await lifecycle.write(unit_admin, name, "p1", "update", {"members": ["a", "b"]}, None,
                                          audit_action="update_demo")
            assert grown.pending and live["p1"] == {"members": ["a"]}
            assert grown.change is not None and grown.change["business_unit"] == "pilots-unit"
            shrunk = await lifecycle.write(unit_admin, name, "p2", "create", {"members": []}, None,
                                           audit_action="create_demo")
            assert shrunk.status == "enforced" and live["p2"] == {"members": []}
            decided = await lifecycle.approve(platform, grown.change["id"], None)
            assert decided["status"] == "applied" and live["p1"] == {"members": ["a", "b"]}
            # (An hour ahead: the gateway's leader, which does not know this kind, leaves it alone.)
            later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
            scheduled = await lifecycle.write(platform, name, "p1", "update", {"members": ["a"]}, later,
                                              audit_action="update_demo")
            assert scheduled.status == "scheduled" and live["p1"] == {"members": ["a", "b"]}
            states = await lifecycle.revisions(name, ["p1"])
            assert states["p1"]["saved_revision"] == 2 and states["p1"]["enforced_revision"] == 1
            assert states["p1"]["scheduled"]["revision"] == 2
            assert written, "every accepted write bumped the configuration"
        finally:
            await pool.close()

    try:
        asyncio.run(scenario())
    finally:
        controls.KINDS.pop(name, None)
