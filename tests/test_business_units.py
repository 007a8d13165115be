"""Business units and their administrators: units as entities (platform administrators create and
change them; a bad time zone, an unknown or platform admin is refused), and a unit administrator,
logged in or through a scoped admin token, seeing and changing only its units' people, policies
(within the platform's lock), logs, summaries, exports, audit records, rules, model closures and
tokens, refused everything platform-wide; a platform administrator still sees everything. Real
`meshfast serve` workers, real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import datetime as dt
import io
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from conftest import Gateway
from test_chargeback import _ingest, _now_ms, _row
from test_openapi import gateway_router_operations

from meshfast import errors
from meshfast.admin import scope
from meshfast.admin.routes import Actor

Json = dict[str, Any]
PASSWORD = "correct horse battery"


def _tag() -> str:
    return secrets.token_hex(4)


class Caller:
    """One way into the admin API: a bearer token, or a session with its CSRF token."""

    def __init__(self, gateway: Gateway, *, token: str | None = None, client: httpx.Client | None = None,
                 csrf: str | None = None) -> None:
        self.gateway, self.token, self.client, self.csrf = gateway, token, client, csrf

    def __call__(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                 params: dict[str, str] | None = None) -> httpx.Response:
        sent = dict(headers or {})
        if self.token is not None:
            sent["authorization"] = f"Bearer {self.token}"
            return self.gateway.client.request(method, path, json=body, headers=sent, params=params)
        assert self.client is not None and self.csrf is not None
        sent["x-csrf-token"] = self.csrf
        return self.client.request(method, path, json=body, headers=sent, params=params)


def _new_admin(gateway: Gateway, is_super: bool = False) -> Json:
    email = f"bu-admin-{_tag()}@example.com"
    r = gateway.admin("POST", "/admin/admins", {"email": email, "password": PASSWORD, "is_super": is_super})
    assert r.status_code == 201, r.text
    return r.json()


def _login(gateway: Gateway, email: str) -> Caller:
    client = httpx.Client(base_url=gateway.base_url, timeout=10)
    for _ in range(8):
        r = client.post("/admin/login", json={"email": email, "password": PASSWORD})
        if r.status_code != 429:
            break
        time.sleep(1.1)  # the per-IP login throttle
    assert r.status_code == 200, r.text
    return Caller(gateway, client=client, csrf=r.json()["csrf_token"])


def _unit(gateway: Gateway, admins: list[str], lock: str | None = None, timezone: str = "Europe/Paris") -> Json:
    body: Json = {"name": f"unit-{_tag()}", "timezone": timezone, "admins": admins}
    if lock is not None:
        body["daily_cap_lock_usd"] = lock
    r = gateway.admin("POST", "/admin/business-units", body)
    assert r.status_code == 201, r.text
    return r.json()


def _user(gateway: Gateway, unit: str | None) -> Json:
    email = f"bu-user-{_tag()}@example.com"
    body: Json = {"email": email, "display_name": "U"}
    if unit is not None:
        body["business_unit"] = unit
    r = gateway.admin("POST", "/admin/users", body)
    assert r.status_code == 201, r.text
    return r.json()


def _rule(units: list[str] | None, rule_id: str | None = None) -> Json:
    entry: Json = {"scope": {"tag": f"t-{_tag()}"}, "window": "monthly", "threshold_usd": "250",
                   "actions": [{"type": "block"}]}
    if units is not None:
        entry["population"] = {"business_units": units}
    return {"id": rule_id or f"bu-{_tag()}", "weight": 10, "entries": [entry]}


def _approved(gateway: Gateway, pending: httpx.Response) -> Json:
    """A unit administrator's relaxing write waits for a platform administrator (API.md
    "Governed lifecycle"): 202 with its change, then approved."""
    assert pending.status_code == 202 and pending.json()["status"] == "pending", pending.text
    decided = gateway.admin("POST", f"/admin/changes/{pending.json()['change_id']}/approve")
    assert decided.status_code == 200, decided.text
    return decided.json()


def _window() -> dict[str, str]:
    now = dt.datetime.now(dt.UTC)
    return {"from": (now - dt.timedelta(hours=2)).isoformat(), "to": (now + dt.timedelta(hours=2)).isoformat()}


@pytest.fixture(scope="module")
def org(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Json]:
    """Two units, each with its administrator; people in each and one in none; a model; rows of
    calls by people of both units; the first unit's administrator logged in, and a token scoped
    to the first unit minted by a platform administrator."""
    admin_x, admin_y = _new_admin(gateway), _new_admin(gateway)
    unit_x = _unit(gateway, [admin_x["id"]], lock="50")
    unit_y = _unit(gateway, [admin_y["id"]])
    x, y = unit_x["name"], unit_y["name"]
    people = {"x1": _user(gateway, x), "x2": _user(gateway, x), "y1": _user(gateway, y), "none": _user(gateway, None)}
    provider = gateway.create_provider(f"bu-prov-{_tag()}")
    model = gateway.create_model(provider["id"], f"bu-model-{_tag()}")
    now = _now_ms()
    rows = [_row(model["id"], people["x1"]["id"], now - 1000 + i, 1_000 + i, business_unit=x) for i in range(7)]
    rows += [_row(model["id"], people["y1"]["id"], now - 500 + i, 2_000 + i, business_unit=y) for i in range(5)]
    spool = tmp_path_factory.mktemp("spool")
    _ingest(gateway, spool / "s", rows)
    session = _login(gateway, admin_x["email"])
    token = gateway.admin("POST", "/admin/tokens", {"name": f"bu-tok-{_tag()}", "business_units": [x]})
    assert token.status_code == 201, token.text
    assert token.json()["business_units"] == [x]
    try:
        yield {"x": x, "y": y, "unit_x": unit_x, "unit_y": unit_y, "admin_x": admin_x, "admin_y": admin_y,
               "people": people, "model": model, "rows_x": 7, "rows_y": 5, "session": session,
               "token": Caller(gateway, token=token.json()["token"])}
    finally:
        assert session.client is not None
        session.client.close()


@pytest.fixture(params=["session", "token"])
def bu(request: pytest.FixtureRequest, org: Json) -> Caller:
    """The first unit's administrator, logged in or through its scoped token."""
    caller: Caller = org[request.param]
    return caller


# --- units as entities ---------------------------------------------------------------------------


def test_the_scope_table_names_only_routes_the_admin_plane_serves() -> None:
    """Every route a unit administrator may call (or only a platform administrator may) is a route."""
    routes = gateway_router_operations()
    assert set(scope.ROUTES) <= routes, set(scope.ROUTES) - routes
    assert scope.PLATFORM_ONLY <= routes


def test_a_platform_administrator_creates_reads_and_updates_a_unit(gateway: Gateway) -> None:
    """Create answers the unit with an ETag; GET and the list show it; PUT honours If-Match when
    sent (stale: 409) and bumps the version; both writes are audited with the unit."""
    admin = _new_admin(gateway)
    unit = _unit(gateway, [admin["id"]], lock="12.5", timezone="America/New_York")
    assert {k: unit[k] for k in ("timezone", "admins", "daily_cap_lock_usd", "version")} == {
        "timezone": "America/New_York", "admins": [admin["id"]], "daily_cap_lock_usd": 12.5, "version": 1}
    assert {"id", "name", "created_at", "updated_at"} <= set(unit)
    got = gateway.admin("GET", f"/admin/business-units/{unit['id']}")
    assert got.status_code == 200 and got.headers["etag"] == '"1"' and got.json() == unit
    assert any(u["id"] == unit["id"] for u in gateway.admin("GET", "/admin/business-units").json())

    renamed = f"unit-{_tag()}"
    body = {"name": renamed, "timezone": "UTC", "admins": [], "daily_cap_lock_usd": None}
    headers = {"authorization": f"Bearer {gateway.admin_token}"}
    stale = gateway.client.put(f"/admin/business-units/{unit['id']}", json=body, headers={**headers, "if-match": '"7"'})
    assert (stale.status_code, stale.json()["error"]) == (409, "version_conflict")
    changed = gateway.client.put(f"/admin/business-units/{unit['id']}", json=body, headers={**headers, "if-match": '"1"'})
    assert changed.status_code == 200, changed.text
    assert changed.headers["etag"] == '"2"'
    assert {k: changed.json()[k] for k in ("name", "timezone", "admins", "daily_cap_lock_usd")} == {
        "name": renamed, "timezone": "UTC", "admins": [], "daily_cap_lock_usd": None}
    no_if_match = gateway.admin("PUT", f"/admin/business-units/{unit['id']}", {**body, "timezone": "Asia/Tokyo"})
    assert no_if_match.status_code == 200 and no_if_match.json()["version"] == 3

    audit = gateway.admin("GET", "/admin/audit?page_size=500").json()["entries"]
    mine = [e for e in audit if e["action"].startswith("business_unit.") and e["business_unit"] in (unit["name"], renamed)]
    assert {e["action"] for e in mine} == {"business_unit.create", "business_unit.update"}


@pytest.mark.parametrize(("change", "problem"), [
    ({"timezone": "Mars/Olympus"}, "timezone"),
    ({"admins": [str(uuid.uuid4())]}, "names no admin"),
    ({"admins": ["not-a-uuid"]}, "not an admin id"),
    ({"name": "   "}, "name may not be empty"),
    ({"daily_cap_lock_usd": "-1"}, "daily_cap_lock_usd"),
])
def test_a_unit_body_is_validated(gateway: Gateway, change: Json, problem: str) -> None:
    body = {"name": f"unit-{_tag()}", "timezone": "UTC", "admins": [], **change}
    r = gateway.admin("POST", "/admin/business-units", body)
    assert r.status_code == 400 and r.json()["error"] == "invalid_request", r.text
    assert any(problem in e for e in r.json()["errors"]), r.json()


def test_a_platform_administrator_cannot_be_a_unit_administrator_and_names_are_unique(gateway: Gateway) -> None:
    platform = _new_admin(gateway, is_super=True)
    r = gateway.admin("POST", "/admin/business-units", {"name": f"u-{_tag()}", "timezone": "UTC",
                                                        "admins": [platform["id"]]})
    assert r.status_code == 400 and any("platform administrator" in e for e in r.json()["errors"])
    unit = _unit(gateway, [])
    again = gateway.admin("POST", "/admin/business-units", {"name": unit["name"], "timezone": "UTC", "admins": []})
    assert (again.status_code, again.json()["error"]) == (409, "business_unit_already_exists")


def test_only_platform_administrators_create_or_change_units(gateway: Gateway, org: Json) -> None:
    """A plain admin and a unit administrator are refused (403); a unit administrator reads its own
    units only (another unit answers 404)."""
    plain = _login(gateway, _new_admin(gateway)["email"])
    body = {"name": f"unit-{_tag()}", "timezone": "UTC", "admins": []}
    for caller in (plain, org["session"], org["token"]):
        assert caller("POST", "/admin/business-units", body).status_code == 403
        assert caller("PUT", f"/admin/business-units/{org['unit_x']['id']}", body).status_code == 403
    for caller in (org["session"], org["token"]):
        assert [u["name"] for u in caller("GET", "/admin/business-units").json()] == [org["x"]]
        assert caller("GET", f"/admin/business-units/{org['unit_x']['id']}").status_code == 200
        other = caller("GET", f"/admin/business-units/{org['unit_y']['id']}")
        assert (other.status_code, other.json()["error"]) == (404, "business_unit_not_found")
    assert plain.client is not None
    plain.client.close()


def test_me_names_the_callers_role_and_units(gateway: Gateway, org: Json) -> None:
    assert gateway.admin("GET", "/admin/me").json()["role"] == "platform"
    for caller in (org["session"], org["token"]):
        me = caller("GET", "/admin/me").json()
        assert (me["role"], me["business_units"], me["is_super_admin"]) == ("business_unit", [org["x"]], False)


# --- people, grants and policies -------------------------------------------------------------


def test_a_unit_administrator_sees_and_changes_only_its_people(gateway: Gateway, org: Json, bu: Caller) -> None:
    """The list holds its units' people only; another unit's person answers 404 to a read and 403
    to a write; a person is created only in its units and never moved out of them."""
    people, x, y = org["people"], org["x"], org["y"]
    listed = {u["id"] for u in bu("GET", "/admin/users").json()}
    assert {people["x1"]["id"], people["x2"]["id"]} <= listed
    assert not listed & {people["y1"]["id"], people["none"]["id"]}
    assert all(u["business_unit"] == x for u in bu("GET", "/admin/users").json())

    mine = bu("GET", f"/admin/users/{people['x1']['id']}")
    assert mine.status_code == 200
    theirs = bu("GET", f"/admin/users/{people['y1']['id']}")
    assert (theirs.status_code, theirs.json()["error"]) == (404, "user_not_found")
    assert bu("GET", f"/admin/users/{people['none']['id']}").status_code == 404
    assert bu("GET", f"/admin/users/{people['y1']['id']}/policies").status_code == 404
    for method, path in (("POST", "/rotate-key"), ("POST", "/revoke"), ("DELETE", "")):
        r = bu(method, f"/admin/users/{people['y1']['id']}{path}")
        assert (r.status_code, r.json()["error"]) == (403, "forbidden"), (method, path)
    put_theirs = bu("PUT", f"/admin/users/{people['y1']['id']}", {"display_name": "Mine now"}, {"if-match": "*"})
    assert put_theirs.status_code == 403

    for unit in (y, None):
        body: Json = {"email": f"bu-new-{_tag()}@example.com", "display_name": "N"}
        if unit is not None:
            body["business_unit"] = unit
        assert bu("POST", "/admin/users", body).status_code == 403, unit
    created = bu("POST", "/admin/users", {"email": f"bu-new-{_tag()}@example.com", "display_name": "N",
                                         "business_unit": x})
    assert created.status_code == 201, created.text
    new_id = created.json()["id"]
    for unit in (y, None):
        moved = bu("PUT", f"/admin/users/{new_id}", {"business_unit": unit}, {"if-match": "*"})
        assert moved.status_code == 403, unit
    renamed = bu("PUT", f"/admin/users/{new_id}", {"display_name": "Renamed", "tier": "gold"}, {"if-match": "*"})
    assert renamed.status_code == 200 and renamed.json()["business_unit"] == x
    assert bu("POST", f"/admin/users/{new_id}/rotate-key").status_code == 200

    # Named keys: its people's only.
    key = bu("POST", f"/admin/users/{new_id}/keys", {"name": f"k-{_tag()}"})
    assert key.status_code == 201, key.text
    assert bu("POST", f"/admin/keys/{key.json()['id']}/rotate", {}).status_code == 200
    assert bu("POST", f"/admin/users/{people['y1']['id']}/keys", {"name": f"k-{_tag()}"}).status_code == 403
    their_key = gateway.admin("POST", f"/admin/users/{people['y1']['id']}/keys", {"name": f"k-{_tag()}"}).json()
    for method, path in (("POST", f"/admin/keys/{their_key['id']}/rotate"), ("DELETE", f"/admin/keys/{their_key['id']}")):
        r = bu(method, path, {} if method == "POST" else None)
        assert (r.status_code, r.json()["error"]) == (403, "forbidden"), path
    assert bu("POST", f"/admin/keys/{uuid.uuid4()}/rotate", {}).json()["error"] == "key_not_found"
    assert bu("POST", f"/admin/users/{new_id}/revoke").status_code == 200

    audit = bu("GET", "/admin/audit", params={"page_size": "500"}).json()["entries"]
    assert {e["target"] for e in audit if e["action"] in ("update_user", "revoke_user")} >= {new_id}
    assert all(e["business_unit"] == x for e in audit)


def test_grants_and_policy_caps_stay_within_the_platform_lock(gateway: Gateway, org: Json, bu: Caller) -> None:
    """Grants only to its people; a cap at the unit's lock passes, above it is 403
    above_platform_lock. Without a lock a unit administrator may not raise a cap above the one in
    force (the $20 default, or what the platform set)."""
    people, model = org["people"], org["model"]
    x1, y1 = people["x1"]["id"], people["y1"]["id"]
    assert bu("POST", "/admin/access", {"user_id": x1, "model_id": model["id"]}).status_code == 200
    theirs = bu("POST", "/admin/access", {"user_id": y1, "model_id": model["id"]})
    assert (theirs.status_code, theirs.json()["error"]) == (403, "forbidden")
    assert bu("DELETE", "/admin/access", {"user_id": y1, "model_id": model["id"]}).status_code == 403

    policy = {"daily_cap_usd": 50, "timezone": "UTC"}
    in_force = {p["model_id"]: p["daily_cap_usd"] for p in gateway.admin("GET", f"/admin/users/{x1}/policies").json()}
    written = bu("PUT", f"/admin/users/{x1}/policies/{model['id']}", policy)
    if in_force.get(model["id"], 20) < 50:
        # Within the lock, but above the cap in force: a raise, so it waits for approval.
        _approved(gateway, written)
    else:
        assert written.status_code == 200, written.text
    above = bu("PUT", f"/admin/users/{x1}/policies/{model['id']}", {**policy, "daily_cap_usd": "50.01"})
    assert (above.status_code, above.json()["error"]) == (403, "above_platform_lock"), above.text
    assert bu("PUT", f"/admin/users/{y1}/policies/{model['id']}", policy).status_code == 403
    caps = {p["model_id"]: p["daily_cap_usd"] for p in gateway.admin("GET", f"/admin/users/{x1}/policies").json()}
    assert caps[model["id"]] == 50

    # The other unit has no lock: its administrator may set up to what is in force.
    token_y = gateway.admin("POST", "/admin/tokens", {"name": f"bu-y-{_tag()}", "business_units": [org["y"]]})
    y_admin = Caller(gateway, token=token_y.json()["token"])
    assert y_admin("PUT", f"/admin/users/{y1}/policies/{model['id']}", {**policy, "daily_cap_usd": 20}).status_code == 200
    raised = y_admin("PUT", f"/admin/users/{y1}/policies/{model['id']}", {**policy, "daily_cap_usd": 21})
    assert raised.json()["error"] == "above_platform_lock"
    assert gateway.admin("PUT", f"/admin/users/{y1}/policies/{model['id']}", {**policy, "daily_cap_usd": 30}
                         ).status_code == 200
    assert y_admin("PUT", f"/admin/users/{y1}/policies/{model['id']}", {**policy, "daily_cap_usd": 30}).status_code in (
        200, 202)
    assert y_admin("PUT", f"/admin/users/{y1}/policies/{model['id']}", {**policy, "daily_cap_usd": 31}
                   ).status_code == 403
    # A platform administrator is bound by no lock.
    assert gateway.admin("PUT", f"/admin/users/{x1}/policies/{model['id']}", {**policy, "daily_cap_usd": 500}
                         ).status_code == 200


# --- logs, summaries, exports, audit -------------------------------------------------------------


def test_logs_summaries_exports_and_audit_stay_within_the_units(gateway: Gateway, org: Json, bu: Caller) -> None:
    """Rows and records kept with another unit are not read; a business_unit filter outside the
    scope is 403; a platform administrator reads both units."""
    window, x, y = _window(), org["x"], org["y"]
    listed = bu("GET", "/admin/logs", params={**window, "page_size": "500"}).json()
    assert listed["total"] == org["rows_x"] and {r["business_unit"] for r in listed["logs"]} == {x}
    assert bu("GET", "/admin/logs", params={**window, "business_unit": x}).json()["total"] == org["rows_x"]
    outside = bu("GET", "/admin/logs", params={**window, "business_unit": y})
    assert (outside.status_code, outside.json()["error"]) == (403, "forbidden")

    summary = bu("GET", "/admin/logs/summary", params={**window, "group_by": "business_unit"}).json()
    assert summary["total_calls"] == org["rows_x"]
    assert [g["key"] for g in summary["groups"]] == [x]
    assert {u["user_id"] for u in summary["by_user"]} == {org["people"]["x1"]["id"]}
    assert bu("GET", "/admin/logs/summary", params={**window, "business_unit": y}).status_code == 403

    export = bu("GET", "/admin/logs/export.csv", params=window)
    assert export.status_code == 200
    lines = list(csv.DictReader(io.StringIO(export.text)))
    assert len(lines) == org["rows_x"] and {line["business_unit"] for line in lines} == {x}
    assert bu("GET", "/admin/logs/export.csv", params={**window, "business_unit": y}).status_code == 403

    audit = bu("GET", "/admin/audit", params={"page_size": "500"}).json()
    assert audit["total"] >= 1 and {e["business_unit"] for e in audit["entries"]} == {x}
    assert bu("GET", "/admin/audit", params={"business_unit": y}).status_code == 403

    platform = Caller(gateway, token=gateway.admin_token)
    summary = platform("GET", "/admin/logs/summary", params={**window, "group_by": "business_unit"}).json()
    keys = {g["key"]: g["calls"] for g in summary["groups"]}
    assert (keys[x], keys[y]) == (org["rows_x"], org["rows_y"])
    assert platform("GET", "/admin/logs", params={**window, "business_unit": y}).json()["total"] == org["rows_y"]
    units = {e["business_unit"] for e in gateway.admin("GET", "/admin/audit?page_size=500").json()["entries"]}
    assert {x, y} <= units and None in units, "a platform administrator reads every record"


# --- platform routes ---------------------------------------------------------------------------


def test_a_unit_administrator_is_refused_what_is_platform_wide(gateway: Gateway, org: Json, bu: Caller) -> None:
    model = org["model"]
    refused = [
        ("GET", "/admin/providers", None), ("POST", "/admin/providers", {"name": "p"}),
        ("POST", "/admin/models", {"name": "m"}), ("DELETE", f"/admin/models/{model['id']}", None),
        ("GET", "/admin/admins", None), ("POST", "/admin/admins", {"email": "a@example.com", "password": PASSWORD}),
        ("POST", "/admin/kill-switch", {"tripped": True}), ("PUT", "/admin/enforcement", {"enforce": False}),
        ("GET", "/admin/issuers", None), ("GET", "/admin/applications", None), ("GET", "/admin/workflows", None),
        ("GET", "/admin/dlp/policies", None), ("PUT", "/admin/notifications", {}),
        ("GET", "/admin/logs/unused-tools", None), ("GET", "/admin/metrics", None),
        ("GET", "/admin/applications", None),
    ]
    for method, path, body in refused:
        r = bu(method, path, body)
        assert (r.status_code, r.json()["error"]) == (403, "forbidden"), (method, path, r.text)
    assert gateway.admin("GET", "/admin/metrics").status_code == 200
    assert gateway.admin("GET", "/admin/enforcement").json()["enforce"] is True
    assert bu("GET", "/admin/models").status_code == 200, "the catalogue is readable"
    assert bu("GET", f"/admin/models/{model['id']}").status_code == 200
    assert bu("GET", "/admin/enforcement").status_code == 200


def test_a_unit_administrator_closes_a_model_only_for_its_units(gateway: Gateway, org: Json, bu: Caller) -> None:
    model, x, y = org["model"], org["x"], org["y"]

    def put(body: Json) -> httpx.Response:
        return bu("PUT", f"/admin/models/{model['id']}", body, {"if-match": "*"})

    current = gateway.admin("GET", f"/admin/models/{model['id']}").json()["restrictions"] or {}
    closed = {**current, "business_units_closed": [x]}
    r = put({"restrictions": closed})
    assert r.status_code == 200, r.text
    assert r.json()["restrictions"]["business_units_closed"] == [x]
    assert put({"restrictions": {**closed, "business_units_closed": [x, y]}}).status_code == 403
    assert put({"restrictions": {**closed, "exempt": [org["people"]["x1"]["id"]]}}).status_code == 403
    assert put({"status": "blocked"}).status_code == 403
    assert put({"restrictions": {**closed, "leader_deny": 5}}).status_code == 403
    # Reopening relaxes: it waits for a platform administrator.
    _approved(gateway, put({"restrictions": {**closed, "business_units_closed": []}}))
    assert gateway.admin("GET", f"/admin/models/{model['id']}").json()["restrictions"]["business_units_closed"] == []


# --- rules ---------------------------------------------------------------------------------------


def test_rules_reach_only_the_units(gateway: Gateway, org: Json, bu: Caller) -> None:
    """A unit administrator reads and writes only rules whose every entry names its units; a
    platform rule is invisible to it (404) and refused to its writes (403)."""
    x, y = org["x"], org["y"]
    own = bu("POST", "/admin/rules", _rule([x]))
    assert own.status_code == 201, own.text
    rule_id = own.json()["id"]
    for units in ([y], [x, y], None):
        r = bu("POST", "/admin/rules", _rule(units))
        assert (r.status_code, r.json()["error"]) == (403, "forbidden"), units
    assert bu("POST", "/admin/rules/dry-run", _rule([y])).status_code == 403
    platform = gateway.admin("POST", "/admin/rules", _rule(None))
    assert platform.status_code == 201
    platform_id = platform.json()["id"]

    listed = {r["id"] for r in bu("GET", "/admin/rules").json()}
    assert rule_id in listed and platform_id not in listed
    assert bu("GET", f"/admin/rules/{platform_id}").status_code == 404
    assert bu("PUT", f"/admin/rules/{platform_id}", _rule([x], platform_id), {"if-match": "*"}).status_code == 403
    assert bu("DELETE", f"/admin/rules/{platform_id}").status_code == 403
    assert bu("PUT", f"/admin/rules/{rule_id}", _rule([y], rule_id), {"if-match": "*"}).status_code == 403
    # A new scope for the entry leaves the old one uncapped: a relaxing change, approved.
    _approved(gateway, bu("PUT", f"/admin/rules/{rule_id}", _rule([x], rule_id), {"if-match": "*"}))
    assert platform_id in {r["id"] for r in gateway.admin("GET", "/admin/rules").json()}
    for action in ("change.submit", "change.approve", "control.activate"):
        audit = bu("GET", "/admin/audit", params={"action": action}).json()["entries"]
        assert any(e["target"] == rule_id and e["business_unit"] == x for e in audit), action
    _approved(gateway, bu("DELETE", f"/admin/rules/{rule_id}"))
    assert bu("GET", f"/admin/rules/{rule_id}").status_code == 404
    assert gateway.admin("DELETE", f"/admin/rules/{platform_id}").status_code == 200


# --- admin tokens --------------------------------------------------------------------------------


def test_tokens_are_scoped_within_the_units(gateway: Gateway, org: Json) -> None:
    """A unit administrator's tokens are scoped to its units (all of them by default, never
    another); it lists and revokes only its own; unknown units, or units beside is_super, are 400."""
    session, x, y = org["session"], org["x"], org["y"]
    made = session("POST", "/admin/tokens", {"name": f"bu-{_tag()}"})
    assert made.status_code == 201 and made.json()["business_units"] == [x]
    records = session("GET", "/admin/audit", params={"action": "create_admin_token"}).json()["entries"]
    assert any(e["target"] == made.json()["name"] for e in records), "its units' records include its tokens"
    assert session("POST", "/admin/tokens", {"name": f"bu-{_tag()}", "business_units": [y]}).status_code == 403
    assert session("POST", "/admin/tokens", {"name": f"bu-{_tag()}", "is_super": True}).status_code == 403
    scoped = Caller(gateway, token=made.json()["token"])
    assert scoped("GET", "/admin/me").json()["business_units"] == [x]
    assert all(u["business_unit"] == x for u in scoped("GET", "/admin/users").json())

    listed = {t["id"] for t in session("GET", "/admin/tokens").json()}
    assert made.json()["id"] in listed
    assert all(t["owner_admin_id"] == org["admin_x"]["id"] for t in session("GET", "/admin/tokens").json())
    others = gateway.admin("POST", "/admin/tokens", {"name": f"plain-{_tag()}"}).json()
    assert others["id"] not in listed
    assert session("DELETE", f"/admin/tokens/{others['id']}").status_code == 403
    assert session("DELETE", f"/admin/tokens/{made.json()['id']}").status_code == 200
    assert scoped("GET", "/admin/me").status_code == 401

    unknown = gateway.admin("POST", "/admin/tokens", {"name": f"t-{_tag()}", "business_units": ["no-such-unit"]})
    assert unknown.status_code == 400 and unknown.json()["error"] == "invalid_request"
    both = gateway.admin("POST", "/admin/tokens", {"name": f"t-{_tag()}", "business_units": [x], "is_super": True})
    assert both.status_code == 400


def test_a_plain_admin_keeps_its_rights_and_a_platform_admin_sees_everything(gateway: Gateway, org: Json) -> None:
    plain = _login(gateway, _new_admin(gateway)["email"])
    with contextlib.closing(plain.client):  # type: ignore[arg-type]
        me = plain("GET", "/admin/me").json()
        assert "role" not in me and me["is_super_admin"] is False
        ids = {u["id"] for u in plain("GET", "/admin/users").json()}
        assert {p["id"] for p in org["people"].values()} <= ids
        assert plain("GET", "/admin/providers").status_code == 200
    ids = {u["id"] for u in gateway.admin("GET", "/admin/users").json()}
    assert {p["id"] for p in org["people"].values()} <= ids


def test_an_admin_becomes_a_unit_administrator_from_its_next_request(gateway: Gateway) -> None:
    """Scope is read with the session on every request: added to a unit, an admin is scoped at
    once; removed from its last unit, it stays a unit administrator scoped to none (never a plain
    admin with an admin's full rights)."""
    admin = _new_admin(gateway)
    caller = _login(gateway, admin["email"])
    with contextlib.closing(caller.client):  # type: ignore[arg-type]
        assert caller("GET", "/admin/providers").status_code == 200
        unit = _unit(gateway, [admin["id"]])
        assert caller("GET", "/admin/me").json()["business_units"] == [unit["name"]]
        assert caller("GET", "/admin/providers").status_code == 403
        r = gateway.admin("PUT", f"/admin/business-units/{unit['id']}",
                          {"name": unit["name"], "timezone": "UTC", "admins": []})
        assert r.status_code == 200
        assert caller("GET", "/admin/providers").status_code == 403


def test_a_unit_administrator_without_units_is_scoped_to_none(gateway: Gateway) -> None:
    """Losing its last unit leaves a unit administrator, logged in or through its token, scoped to
    nothing: refused everywhere but its own session's routes, its users list empty."""
    admin = _new_admin(gateway)
    unit = _unit(gateway, [admin["id"]])
    caller = _login(gateway, admin["email"])
    with contextlib.closing(caller.client):  # type: ignore[arg-type]
        made = caller("POST", "/admin/tokens", {"name": f"bu-{_tag()}"})
        assert made.status_code == 201, made.text
        token = Caller(gateway, token=made.json()["token"])
        r = gateway.admin("PUT", f"/admin/business-units/{unit['id']}",
                          {"name": unit["name"], "timezone": "UTC", "admins": []})
        assert r.status_code == 200 and r.json()["admins"] == []
        for who in (caller, token):
            me = who("GET", "/admin/me")
            assert me.status_code == 200 and me.json()["business_units"] == [], me.text
            assert who("GET", "/admin/providers").status_code == 403
            for method, path in (("GET", "/admin/users"), ("GET", "/admin/models"), ("GET", "/admin/tokens"),
                                 ("POST", "/admin/session-token"), ("GET", "/admin/status")):
                r = who(method, path)
                assert (r.status_code, r.json()["error"]) == (403, "forbidden"), (method, path)
            assert who("POST", "/admin/users", {"email": f"u-{_tag()}@example.com"}).status_code == 403
        assert caller("POST", "/admin/logout").status_code == 200


def test_a_unit_put_without_admins_keeps_them(gateway: Gateway) -> None:
    """A PUT of a unit that leaves ``admins`` out keeps its administrators (a rename or a new time
    zone does not clear them)."""
    admin = _new_admin(gateway)
    unit = _unit(gateway, [admin["id"]])
    r = gateway.admin("PUT", f"/admin/business-units/{unit['id']}", {"name": unit["name"], "timezone": "UTC"})
    assert r.status_code == 200, r.text
    assert r.json()["admins"] == [admin["id"]] and r.json()["timezone"] == "UTC"


def test_a_demoted_admins_platform_token_loses_platform_rights(gateway: Gateway) -> None:
    """A token's platform rights are its own and its admin's: once the admin is not a platform
    administrator, its platform token is not either."""
    admin = _new_admin(gateway, is_super=True)
    caller = _login(gateway, admin["email"])
    with contextlib.closing(caller.client):  # type: ignore[arg-type]
        made = caller("POST", "/admin/tokens", {"name": f"su-{_tag()}", "is_super": True})
        assert made.status_code == 201 and made.json()["is_super"], made.text
    token = Caller(gateway, token=made.json()["token"])
    assert token("GET", "/admin/me").json()["is_super_admin"] is True

    gateway.query("UPDATE admins SET is_super = false WHERE id = $1::uuid", admin["id"])
    assert token("GET", "/admin/me").json()["is_super_admin"] is False
    assert token("POST", "/admin/business-units", {"name": f"u-{_tag()}", "timezone": "UTC"}).status_code == 403


def test_a_scoped_write_rechecks_its_person_in_the_write_transaction(gateway: Gateway, org: Json) -> None:
    """The scope check runs again in the write's transaction, under a row lock: a person moved out
    of the actor's units between the check and the write refuses the write (403, rolled back)."""
    actor = Actor(name="t", is_super=False, id="t", business_units=frozenset({org["x"]}))

    async def go() -> None:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            scope._hold(actor, uuid.UUID(org["people"]["y1"]["id"]))
            with pytest.raises(errors.Forbidden):
                async with conn.transaction():
                    await scope.recheck(conn)
            scope._hold(actor, uuid.UUID(org["people"]["x1"]["id"]))
            async with conn.transaction():
                await scope.recheck(conn)
        finally:
            await conn.close()

    asyncio.run(go())


def test_a_registry_file_creates_and_sets_units_with_admins_by_email(gateway: Gateway, tmp_path: Any) -> None:
    """`meshfast apply` takes `business_units` by name, their administrators by email: created,
    then unchanged on a second apply, then set to exactly the edited file; an unknown timezone or
    admin, or a platform administrator, refuses the whole file with every problem listed."""
    import json
    import subprocess
    import sys

    def apply(doc: Json) -> subprocess.CompletedProcess[str]:
        path = tmp_path / f"units-{_tag()}.json"
        path.write_text(json.dumps(doc))
        env = dict(gateway.env(), DATABASE_URL=gateway.database_url)
        return subprocess.run([sys.executable, "-m", "meshfast.cli", "apply", str(path), "--json"], env=env,
                              capture_output=True, text=True, timeout=120)

    first, second = _new_admin(gateway), _new_admin(gateway)
    name = f"unit-{_tag()}"
    doc: Json = {"business_units": [{"name": name, "timezone": "Europe/Paris", "admins": [first["email"]],
                                     "daily_cap_lock_usd": "30"}]}
    done = apply(doc)
    assert done.returncode == 0, done.stderr
    assert f"business_unit:{name}" in json.loads(done.stdout)["created"]
    unit = next(u for u in gateway.admin("GET", "/admin/business-units").json() if u["name"] == name)
    assert (unit["timezone"], unit["admins"], unit["daily_cap_lock_usd"]) == ("Europe/Paris", [first["id"]], 30.0)

    again = apply(doc)
    assert again.returncode == 0 and f"business_unit:{name}" in json.loads(again.stdout)["unchanged"]

    doc["business_units"][0].update({"admins": [second["email"]], "timezone": "Asia/Tokyo", "daily_cap_lock_usd": None})
    edited = apply(doc)
    assert edited.returncode == 0 and f"business_unit:{name}" in json.loads(edited.stdout)["updated"]
    unit = gateway.admin("GET", f"/admin/business-units/{unit['id']}").json()
    assert (unit["timezone"], unit["admins"], unit["daily_cap_lock_usd"], unit["version"]) == (
        "Asia/Tokyo", [second["id"]], None, 2)

    platform = _new_admin(gateway, is_super=True)
    bad = apply({"business_units": [
        {"name": f"unit-{_tag()}", "timezone": "Mars/Olympus", "admins": ["nobody@example.com", platform["email"]]}]})
    assert bad.returncode != 0
    for problem in ("Mars/Olympus", "nobody@example.com", "platform administrator"):
        assert problem in bad.stderr + bad.stdout, (problem, bad.stderr)
    assert gateway.admin("GET", f"/admin/business-units/{unit['id']}").json()["version"] == 2


# --- what a unit administrator may not undo or reach -------------------------------------------


def test_a_unit_administrator_neither_reactivates_nor_extends(gateway: Gateway, org: Json, bu: Caller) -> None:
    """A new key would reactivate a revoked person: refused (403); an expiry, the person's or its
    key's, may only come sooner: later or cleared is 403 forbidden."""
    person = _user(gateway, org["x"])
    pid = person["id"]
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(days=10)).isoformat()
    sooner = (dt.datetime.now(dt.UTC) + dt.timedelta(days=5)).isoformat()
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=20)).isoformat()
    for path in ("expiry", "key/expiry"):
        assert gateway.admin("PUT", f"/admin/users/{pid}/{path}", {"expires_at": soon}).status_code == 200
        for refused in (later, None):
            r = bu("PUT", f"/admin/users/{pid}/{path}", {"expires_at": refused})
            assert (r.status_code, r.json()["error"]) == (403, "forbidden"), (path, refused, r.text)
        assert bu("PUT", f"/admin/users/{pid}/{path}", {"expires_at": sooner}).status_code == 200, path
    assert gateway.admin("POST", f"/admin/users/{pid}/revoke").status_code == 200
    r = bu("POST", f"/admin/users/{pid}/rotate-key")
    assert (r.status_code, r.json()["error"]) == (403, "forbidden")
    assert gateway.admin("GET", f"/admin/users/{pid}").json()["status"] == "revoked"


def test_a_unit_administrator_leaves_application_keys_alone(gateway: Gateway, org: Json, bu: Caller) -> None:
    """An application's keys are rotated and revoked by other admins only, even in the unit."""
    app = gateway.admin("POST", "/admin/applications", {"name": f"app {_tag()}", "owner_id": org["people"]["x1"]["id"],
                                                        "business_unit": org["x"]})
    assert app.status_code == 201, app.text
    key = gateway.admin("POST", f"/admin/applications/{app.json()['id']}/keys", {"name": f"k-{_tag()}"})
    assert key.status_code == 201, key.text
    kid = key.json()["id"]
    for method, body in (("POST", {}), ("DELETE", None)):
        path = f"/admin/keys/{kid}/rotate" if method == "POST" else f"/admin/keys/{kid}"
        r = bu(method, path, body)
        assert (r.status_code, r.json()["error"]) == (403, "forbidden"), path
    assert gateway.admin("DELETE", f"/admin/keys/{kid}").status_code == 200


def test_platform_status_is_refused_to_a_unit_administrator(gateway: Gateway, bu: Caller) -> None:
    """The instance's status is platform-wide, as /admin/metrics is (the dashboard reads it only
    on its Gateway page)."""
    r = bu("GET", "/admin/status")
    assert (r.status_code, r.json()["error"]) == (403, "forbidden")
    assert gateway.admin("GET", "/admin/status").status_code == 200


def test_managers_stay_within_the_units(gateway: Gateway, org: Json, bu: Caller) -> None:
    """A scoped caller names only its units' people as managers (another unit's or nobody: the
    same 403); it reads a person's out-of-unit manager by id, without the email, and so does
    the manager summary."""
    people, x = org["people"], org["x"]
    person = _user(gateway, x)
    for field, value in (("manager_id", people["y1"]["id"]), ("manager_id", str(uuid.uuid4())),
                         ("manager_email", people["y1"]["email"]), ("manager_email", "nobody@example.com")):
        r = bu("PUT", f"/admin/users/{person['id']}", {field: value}, {"if-match": "*"})
        assert (r.status_code, r.json()["error"]) == (403, "forbidden"), (field, value)
        created = bu("POST", "/admin/users", {"email": f"bu-new-{_tag()}@example.com", "business_unit": x,
                                             field: value})
        assert (created.status_code, created.json()["error"]) == (403, "forbidden"), (field, value)
    ok = bu("PUT", f"/admin/users/{person['id']}", {"manager_id": people["x2"]["id"]}, {"if-match": "*"})
    assert ok.status_code == 200 and ok.json()["manager_email"] == people["x2"]["email"], ok.text

    platform = Caller(gateway, token=gateway.admin_token)
    assert platform("PUT", f"/admin/users/{person['id']}", {"manager_id": people["y1"]["id"]},
                    {"if-match": "*"}).status_code == 200
    seen = bu("GET", f"/admin/users/{person['id']}").json()
    assert seen["manager_id"] == people["y1"]["id"] and seen["manager_email"] is None
    listed = next(u for u in bu("GET", "/admin/users").json() if u["id"] == person["id"])
    assert listed["manager_email"] is None
    assert gateway.admin("GET", f"/admin/users/{person['id']}").json()["manager_email"] == people["y1"]["email"]


def test_the_manager_summary_hides_other_units_managers(gateway: Gateway, org: Json, tmp_path: Any) -> None:
    """Grouped by manager, a scoped caller sees an out-of-unit manager's id, not its email."""
    people, x, model = org["people"], org["x"], org["model"]
    person = _user(gateway, x)
    row = _row(model["id"], person["id"], _now_ms(), 9_000, business_unit=x, manager_id=people["y1"]["id"])
    _ingest(gateway, tmp_path / "s", [row])
    summary = org["token"]("GET", "/admin/logs/summary", params={**_window(), "group_by": "manager"}).json()
    groups = {g["key"]: g for g in summary["groups"]}
    assert people["y1"]["id"] in groups and groups[people["y1"]["id"]]["manager_email"] is None
    platform = Caller(gateway, token=gateway.admin_token)
    summary = platform("GET", "/admin/logs/summary", params={**_window(), "group_by": "manager"}).json()
    assert {g["key"]: g["manager_email"] for g in summary["groups"]}[people["y1"]["id"]] == people["y1"]["email"]


def test_a_move_between_own_units_keeps_caps_within_the_lock(gateway: Gateway, org: Json) -> None:
    """A person whose cap is above the destination's lock (without a lock: the $20 default) is
    not moved there by a scoped caller (403 above_platform_lock); a platform administrator is."""
    admin = _new_admin(gateway)
    high = _unit(gateway, [admin["id"]], lock="100")
    low = _unit(gateway, [admin["id"]], lock="30")
    bare = _unit(gateway, [admin["id"]])
    token = gateway.admin("POST", "/admin/tokens", {"name": f"mv-{_tag()}", "business_units": [high["name"],
                                                                                               low["name"],
                                                                                               bare["name"]]})
    caller = Caller(gateway, token=token.json()["token"])
    person = _user(gateway, high["name"])
    assert gateway.admin("PUT", f"/admin/users/{person['id']}/policies/{org['model']['id']}",
                         {"daily_cap_usd": "80", "timezone": "UTC"}).status_code == 200
    for unit in (low, bare):
        r = caller("PUT", f"/admin/users/{person['id']}", {"business_unit": unit["name"]}, {"if-match": "*"})
        assert (r.status_code, r.json()["error"]) == (403, "above_platform_lock"), r.text
    assert gateway.admin("PUT", f"/admin/users/{person['id']}/policies/{org['model']['id']}",
                         {"daily_cap_usd": "25", "timezone": "UTC"}).status_code == 200
    assert caller("PUT", f"/admin/users/{person['id']}", {"business_unit": bare["name"]},
                  {"if-match": "*"}).status_code == 403
    moved = caller("PUT", f"/admin/users/{person['id']}", {"business_unit": low["name"]}, {"if-match": "*"})
    assert moved.status_code == 200, moved.text


def test_the_lock_is_compared_as_a_decimal(gateway: Gateway, org: Json, bu: Caller) -> None:
    """A cap a hair above the lock, past a float's precision, is above it (403), and the policy
    write reads the lock again in its transaction."""
    x1, model = org["people"]["x1"]["id"], org["model"]
    body = b'{"daily_cap_usd": 50.0000000000000001, "timezone": "UTC"}'
    sent = {"content-type": "application/json"}
    if bu.token is not None:
        sent["authorization"] = f"Bearer {bu.token}"
        r = gateway.client.request("PUT", f"/admin/users/{x1}/policies/{model['id']}", content=body, headers=sent)
    else:
        assert bu.client is not None and bu.csrf is not None
        sent["x-csrf-token"] = bu.csrf
        r = bu.client.request("PUT", f"/admin/users/{x1}/policies/{model['id']}", content=body, headers=sent)
    assert (r.status_code, r.json()["error"]) == (403, "above_platform_lock"), r.text

    async def go() -> None:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            scope.begin()
            scope._cap_held.set((org["x"], scope.Decimal("50.01")))
            with pytest.raises(errors.AbovePlatformLock):
                async with conn.transaction():
                    await scope.recheck(conn)
            scope._cap_held.set((org["x"], scope.Decimal("50")))
            async with conn.transaction():
                await scope.recheck(conn)
        finally:
            await conn.close()

    asyncio.run(go())


def test_a_scoped_if_match_star_is_the_version_checked(gateway: Gateway, org: Json) -> None:
    """A scoped caller's ``If-Match: *`` names the version its scope check read: a write whose
    row changed after that check is 409, not a write to a row nobody checked."""
    actor = Actor(name="t", is_super=False, id="t", business_units=frozenset({org["x"]}))
    scope.begin()
    scope._seen_version.set("3")
    assert scope.pinned_if_match(actor, "*") == "3"
    assert scope.pinned_if_match(actor, '"7"') == '"7"'
    platform = Actor(name="p", is_super=True, id="p", business_units=None)
    assert scope.pinned_if_match(platform, "*") == "*"
    scope.begin()
    assert scope.pinned_if_match(actor, "*") == '"0"'


def test_a_scoped_token_sees_no_broader_token_of_its_admin(gateway: Gateway) -> None:
    """A token scoped to one of its admin's units neither lists nor revokes the admin's tokens
    that reach further."""
    admin = _new_admin(gateway)
    one, two = _unit(gateway, [admin["id"]]), _unit(gateway, [admin["id"]])
    session = _login(gateway, admin["email"])
    with contextlib.closing(session.client):  # type: ignore[arg-type]
        broad = session("POST", "/admin/tokens", {"name": f"b-{_tag()}"}).json()
        narrow = session("POST", "/admin/tokens", {"name": f"n-{_tag()}", "business_units": [one["name"]]}).json()
        assert sorted(broad["business_units"]) == sorted([one["name"], two["name"]])
        scoped = Caller(gateway, token=narrow["token"])
        listed = {t["id"] for t in scoped("GET", "/admin/tokens").json()}
        assert narrow["id"] in listed and broad["id"] not in listed
        r = scoped("DELETE", f"/admin/tokens/{broad['id']}")
        assert (r.status_code, r.json()["error"]) == (403, "forbidden")
        assert {broad["id"], narrow["id"]} <= {t["id"] for t in session("GET", "/admin/tokens").json()}
        assert session("DELETE", f"/admin/tokens/{broad['id']}").status_code == 200


def test_a_renamed_unit_keeps_its_people_closures_and_rules(gateway: Gateway, org: Json) -> None:
    """A rename carries the unit's name to its people, the models closed for it and the rules
    that name it, in the rename's transaction."""
    admin = _new_admin(gateway)
    unit = _unit(gateway, [admin["id"]])
    person = _user(gateway, unit["name"])
    provider = gateway.create_provider(f"rn-prov-{_tag()}")
    model = gateway.create_model(provider["id"], f"rn-model-{_tag()}")
    r = gateway.client.put(f"/admin/models/{model['id']}", json={"restrictions": {"business_units_closed": [
        unit["name"], "elsewhere"]}}, headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": "*"})
    assert r.status_code == 200, r.text
    rule = gateway.admin("POST", "/admin/rules", _rule([unit["name"], "elsewhere"]))
    assert rule.status_code == 201, rule.text
    new = f"renamed-{_tag()}"
    r = gateway.admin("PUT", f"/admin/business-units/{unit['id']}", {"name": new, "timezone": "UTC"})
    assert r.status_code == 200 and r.json()["admins"] == [admin["id"]], r.text
    assert gateway.admin("GET", f"/admin/users/{person['id']}").json()["business_unit"] == new
    restrictions = gateway.admin("GET", f"/admin/models/{model['id']}").json()["restrictions"]
    assert restrictions["business_units_closed"] == [new, "elsewhere"]
    stored = gateway.admin("GET", f"/admin/rules/{rule.json()['id']}").json()
    assert stored["entries"][0]["population"]["business_units"] == [new, "elsewhere"]


def test_a_rotation_or_expiry_is_checked_again_in_the_write_transaction(gateway: Gateway, org: Json) -> None:
    """What the scope check let through is checked again before the write, under the person's row
    lock: revoked or given a sooner expiry in between, the write is refused (403)."""
    person = _user(gateway, org["x"])
    pid = uuid.UUID(person["id"])
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=3)

    async def go() -> None:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            scope.begin()
            scope._standing_held.set((scope.USER_ROTATE, pid, None))
            async with conn.transaction():
                await scope.precheck(conn)
            await conn.execute("UPDATE users SET status = 'revoked', expires_at = $2 WHERE id = $1", pid, soon)
            with pytest.raises(errors.Forbidden):
                async with conn.transaction():
                    await scope.precheck(conn)
            scope._standing_held.set((scope.USER_EXPIRY, pid, soon + dt.timedelta(days=1)))
            with pytest.raises(errors.Forbidden):
                async with conn.transaction():
                    await scope.precheck(conn)
            scope._standing_held.set((scope.USER_EXPIRY, pid, soon - dt.timedelta(days=1)))
            async with conn.transaction():
                await scope.precheck(conn)
        finally:
            await conn.close()

    asyncio.run(go())
