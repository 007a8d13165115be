"""The admin side of spend rules (issue 14, items 2, 3, 6 and 7): `/admin/rules` with ETag and
If-Match, validation that lists every problem (unordered caps across rules included), the audit
log, the enforcement switch, model restrictions, rules and restrictions in a registry file, the
dry-run, and bad input that is a 400, never a 500. Real `meshfast serve` workers, real PostgreSQL.

Thresholds are answered as decimal strings, normalised: `250`, `250.0` and `"250.00"` all read
back as `"250"`, `0.10` as `"0.1"`."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import msgspec
import pytest
from conftest import EmulatedProviders, Gateway

from meshfast import rules, snapshot
from meshfast._core import Core
from meshfast.secrets import load_or_create

Json = dict[str, Any]


def _tag() -> str:
    return secrets.token_hex(4)


def _user(gateway: Gateway, **extra: Any) -> Json:
    email = f"rules-{_tag()}@example.com"
    response = gateway.admin("POST", "/admin/users", {"email": email, "display_name": email.split("@")[0], **extra})
    assert response.status_code == 201, response.text
    return response.json()


def _model(gateway: Gateway, **extra: Any) -> Json:
    provider = gateway.create_provider(f"rules-p-{_tag()}")
    return gateway.create_model(provider["id"], f"rules-m-{_tag()}", **extra)


def _rule(rule_id: str | None = None, **entry: Any) -> Json:
    body: Json = {"scope": {"tag": f"t-{_tag()}"}, "window": "monthly", "threshold_usd": "250",
                  "actions": [{"type": "block"}], **entry}
    return {"id": rule_id or f"r-{_tag()}", "weight": 10, "entries": [body]}


def _put(gateway: Gateway, path: str, body: Any, etag: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {gateway.admin_token}"}
    if etag is not None:
        headers["if-match"] = etag
    return gateway.client.put(path, json=body, headers=headers)


def _audit(gateway: Gateway, action: str) -> list[Json]:
    response = gateway.admin("GET", f"/admin/audit?action={action}&page_size=200")
    assert response.status_code == 200, response.text
    return response.json()["entries"]


async def _config(gateway: Gateway) -> snapshot.Config:
    master_key = load_or_create(gateway.data_dir / "secrets.json").master_key
    conn = await asyncpg.connect(gateway.database_url)
    try:
        return await snapshot.load_config(conn, master_key)
    finally:
        await conn.close()


def _rule_count(gateway: Gateway) -> int:
    response = gateway.admin("GET", "/admin/rules")
    assert response.status_code == 200, response.text
    return len(response.json())


# --- CRUD, ETag, audit ------------------------------------------------------------------------------


def test_a_rule_round_trips_with_its_etag_and_put_needs_if_match(gateway: Gateway) -> None:
    """POST answers 201 with the stored rule (defaults filled in, people and thresholds
    normalised) and an ETag; GET and the list show it; PUT without If-Match is 428, with a stale
    one 409, with the current one 200 and a new ETag; DELETE removes it; each write is audited."""
    leader = _user(gateway)
    model = _model(gateway, aliases=[f"alias-{_tag()}"])
    rule_id = f"crud-{_tag()}"
    body = {"id": rule_id, "weight": 60, "entries": [
        {"population": {"tiers": ["normal"], "leaders": [leader["id"].upper()]},
         "scope": {"model": model["aliases"][0]}, "window": "monthly", "threshold_usd": 250.0,
         "actions": [{"type": "notify", "channels": ["email", "webhook"]}, {"type": "block"}]},
        {"scope": {"tag": "opus"}, "calls_per_minute": 30}]}
    created = gateway.admin("POST", "/admin/rules", body)
    assert created.status_code == 201, created.text
    rule = created.json()
    assert created.headers["etag"] == f'"{rule["version"]}"'
    assert {k: rule[k] for k in ("id", "weight", "mode", "entries")} == {
        "id": rule_id, "weight": 60, "mode": "inherit", "entries": [
            {"population": {"tiers": ["normal"], "leaders": [leader["id"]], "business_units": [], "exempt_users": []},
             "scope": {"model": model["name"]}, "window": "monthly", "threshold_usd": "250",
             "calls_per_minute": None, "tokens_per_minute": None,
             "actions": [{"type": "notify", "channels": ["webhook", "email"]}, {"type": "block"}]},
            {"population": {"tiers": [], "leaders": [], "business_units": [], "exempt_users": []},
             "scope": {"tag": "opus"}, "window": None, "threshold_usd": None, "calls_per_minute": 30,
             "tokens_per_minute": None, "actions": []}]}, "an alias is stored as its model's name"
    assert rule["created_at"].endswith("Z") and rule["updated_at"].endswith("Z")
    msgspec.convert({k: rule[k] for k in ("id", "weight", "mode", "entries")}, rules.RuleBody)  # the documented shape

    again = gateway.admin("POST", "/admin/rules", body)
    assert (again.status_code, again.json()["error"]) == (409, "rule_already_exists")
    got = gateway.admin("GET", f"/admin/rules/{rule_id}")
    assert got.status_code == 200 and got.json() == rule and got.headers["etag"] == created.headers["etag"]
    assert rule in gateway.admin("GET", "/admin/rules").json()

    changed = {**rule, "mode": "shadow"}  # what GET answered, version and timestamps included
    missing = _put(gateway, f"/admin/rules/{rule_id}", changed, None)
    assert (missing.status_code, missing.json()["error"]) == (428, "if_match_required")
    updated = _put(gateway, f"/admin/rules/{rule_id}", changed, created.headers["etag"])
    assert updated.status_code == 200, updated.text
    assert updated.json()["mode"] == "shadow" and updated.json()["version"] == rule["version"] + 1
    assert updated.headers["etag"] != created.headers["etag"]
    stale = _put(gateway, f"/admin/rules/{rule_id}", changed, created.headers["etag"])
    assert (stale.status_code, stale.json()["error"]) == (409, "version_conflict")
    renamed = _put(gateway, f"/admin/rules/{rule_id}", {**changed, "id": "another"}, updated.headers["etag"])
    assert (renamed.status_code, renamed.json()["error"]) == (400, "invalid_rule")
    without_id = {k: v for k, v in changed.items() if k != "id"}
    assert _put(gateway, f"/admin/rules/{rule_id}", without_id, updated.headers["etag"]).status_code == 200

    config = asyncio.run(_config(gateway))
    loaded = next(r for r in config.rules if r.id == rule_id)
    index = {p.id: i for i, p in enumerate(config.principals)}
    assert loaded.mode == "shadow" and loaded.entries[0].leaders == [index[leader["id"]]]
    assert loaded.entries[0].threshold_nano == 250 * 10**9

    deleted = gateway.admin("DELETE", f"/admin/rules/{rule_id}")
    assert deleted.status_code == 200, deleted.text
    assert gateway.admin("GET", f"/admin/rules/{rule_id}").status_code == 404
    assert gateway.admin("DELETE", f"/admin/rules/{rule_id}").json()["error"] == "rule_not_found"
    assert _put(gateway, f"/admin/rules/{rule_id}", changed, '"1"').status_code == 404
    for action, count in (("create_rule", 1), ("update_rule", 2), ("delete_rule", 1)):
        assert len([e for e in _audit(gateway, action) if e["target"] == rule_id]) == count, action


def test_a_rule_write_bumps_the_config_sequence_and_the_core_loads_the_rule(gateway: Gateway) -> None:
    """The write bumps the config sequence (the NOTIFY every worker reloads on) and the config
    the workers build from it carries the rule in a form the core accepts."""
    before = asyncio.run(_config(gateway)).seq
    rule = _rule()
    assert gateway.admin("POST", "/admin/rules", rule).status_code == 201
    config = asyncio.run(_config(gateway))
    assert config.seq > before and rule["id"] in {r.id for r in config.rules}
    Core(b"pepper").load(snapshot.encode(config))


# --- validation ---------------------------------------------------------------------------------------


def test_an_invalid_rule_is_refused_listing_every_problem(gateway: Gateway) -> None:
    """One 400 invalid_rule whose errors name each problem with its place, and nothing is stored."""
    body = {"id": "Not A Slug", "weight": 2_000_000, "mode": "loud", "colour": "red", "entries": [
        {"population": {"tiers": ["x"], "leaders": ["00000000-0000-4000-8000-000000000000"], "bosses": []},
         "scope": {"model": f"nope-{_tag()}"}, "window": "hourly", "threshold_usd": "-5",
         "actions": [{"type": "pause", "hours": 0}, {"type": "warn", "text": ""},
                     {"type": "notify", "channels": ["sms"]}, {"type": "block"}, {"type": "block"}, {"type": "x"}]},
        {"scope": {"tag": "a", "model": "b"}, "calls_per_minute": 0, "actions": [{"type": "warn", "text": "hi"}]},
        {"scope": {"tag": "a"}, "window": "daily"},
    ]}
    count = _rule_count(gateway)
    response = gateway.admin("POST", "/admin/rules", body)
    assert response.status_code == 400, response.text
    answer = response.json()
    assert answer["error"] == "invalid_rule"
    expected = [
        "rule: unknown field 'colour'", "id: must be 1 to 64", "weight: must be between", "mode: must be one of",
        "entries[0].population: unknown field 'bosses'", "entries[0].population.leaders[0]: unknown user",
        "entries[0].scope: unknown model 'nope-", "entries[0].window: must be one of",
        "entries[0].threshold_usd: must be greater than 0", "entries[0].actions[0].hours: must be between 1 and 720",
        "entries[0].actions[1].text: may not be empty", "entries[0].actions[2].channels: 'sms' not one of",
        "entries[0].actions[4]: a second block action", "entries[0].actions[5].type: must be one of",
        "entries[1].scope: needs exactly one of tag and model", "entries[1].calls_per_minute: must be between",
        "entries[1].actions[0]: warn needs the entry's threshold_usd",
        "entries[2]: needs threshold_usd, calls_per_minute or tokens_per_minute",
    ]
    for problem in expected:
        assert any(e.startswith(problem) for e in answer["errors"]), (problem, answer["errors"])
    assert len(answer["errors"]) == len(expected), answer["errors"]
    assert _rule_count(gateway) == count


@pytest.mark.parametrize(("entry", "problem"), [
    ({"threshold_usd": "1e10"}, "at most 1,000,000,000"),
    ({"threshold_usd": "0.0000000001"}, "at most 9 decimals"),
    ({"threshold_usd": "12abc"}, "must be a decimal number"),
    ({"threshold_usd": True}, "must be a decimal number"),
    ({"threshold_usd": 10**40}, "at most 1,000,000,000"),
    ({"threshold_usd": None, "tokens_per_minute": 10**10}, "between 1 and 1,000,000,000"),
    ({"threshold_usd": None, "calls_per_minute": 5, "actions": [{"type": "pause", "hours": 2}]}, "needs the entry's"),
    ({"window": None}, "window: is required with threshold_usd"),
    ({"actions": [{"type": "pause"}]}, "hours: is required"),
    ({"actions": [{"type": "pause", "hours": 1.5}]}, "must be an integer"),
    ({"actions": [{"type": "warn", "text": "x" * 501}]}, "longer than 500"),
    ({"actions": [{"type": "warn", "text": "over\r\nX-Evil: 1"}]}, "printable ASCII"),
    ({"actions": [{"type": "notify", "channels": []}]}, "at least one"),
    ({"actions": [{"type": "notify", "channels": ["email", "email"]}]}, "twice"),
    ({"actions": [{"type": "notify", "channels": ["email"], "template": "x" * 4001}]}, "longer than 4000"),
    ({"actions": [{"type": "block", "hours": 3}]}, "unknown field 'hours'"),
    ({"actions": "block"}, "must be a list"),
    ({"population": {"tiers": ["a"] * 1001}}, "at most 1,000"),
    ({"population": {"exempt_users": ["not-a-uuid"]}}, "is not a user id"),
    ({"population": {"business_units": [" "]}}, "may not be empty"),
    ({"population": {"tiers": "gold"}}, "must be a list"),
    ({"scope": {"tag": ""}}, "may not be empty"),
    ({"scope": {}}, "exactly one of tag and model"),
    ({"scope": "opus"}, "must be {"),
])
def test_entry_fields_are_checked(gateway: Gateway, entry: Json, problem: str) -> None:
    """Each entry field's limits and types: a 400 invalid_rule naming the field."""
    response = gateway.admin("POST", "/admin/rules", _rule(**entry))
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_rule"
    assert any(problem in e for e in response.json()["errors"]), response.json()["errors"]


def test_unordered_caps_are_refused_within_a_rule_and_across_rules(gateway: Gateway) -> None:
    """A daily block above the weekly or monthly one of the same population and scope is refused,
    naming both entries (the other rule by id); another population, a warn-only entry or a
    lower daily cap is fine; deleting the other rule lets the refused one in."""
    tag = f"caps-{_tag()}"
    population = {"tiers": ["normal"], "business_units": ["payments"]}
    monthly = {"id": f"caps-m-{_tag()}", "entries": [{"population": population, "scope": {"tag": tag},
                                                      "window": "monthly", "threshold_usd": "100",
                                                      "actions": [{"type": "block"}]}]}
    assert gateway.admin("POST", "/admin/rules", monthly).status_code == 201

    daily = {"id": f"caps-d-{_tag()}", "entries": [
        {"population": {"business_units": ["payments"], "tiers": ["normal"]}, "scope": {"tag": tag},
         "window": "daily", "threshold_usd": "300", "actions": [{"type": "block"}]}]}
    refused = gateway.admin("POST", "/admin/rules", daily)
    assert refused.status_code == 400, refused.text
    [problem] = refused.json()["errors"]
    assert "daily" in problem and "monthly" in problem and monthly["id"] in problem and "300" in problem, problem

    for fine in ({"population": {"tiers": ["gold"]}}, {"actions": [{"type": "warn", "text": "slow down"}]},
                 {"threshold_usd": "50"}):
        body = {"id": f"caps-ok-{_tag()}", "entries": [{**daily["entries"][0], **fine}]}
        assert gateway.admin("POST", "/admin/rules", body).status_code == 201, fine

    within = {"id": f"caps-w-{_tag()}", "entries": [
        {"scope": {"model": "x-not-checked-first"}, "window": "weekly", "threshold_usd": 10, "actions": [{"type": "block"}]}]}
    model = _model(gateway)
    within["entries"] = [
        {"scope": {"model": model["name"]}, "window": "weekly", "threshold_usd": 10, "actions": [{"type": "block"}]},
        {"scope": {"model": model["name"]}, "window": "daily", "threshold_usd": 20, "actions": [{"type": "block"}]},
        {"scope": {"model": model["name"]}, "window": "monthly", "threshold_usd": 5, "actions": [{"type": "block"}]}]
    refused = gateway.admin("POST", "/admin/rules", within)
    assert refused.status_code == 400
    errors = refused.json()["errors"]
    assert len(errors) == 3 and all("entries[" in e for e in errors), errors

    assert gateway.admin("DELETE", f"/admin/rules/{monthly['id']}").status_code == 200
    assert gateway.admin("POST", "/admin/rules", daily).status_code == 201
    # And the update of a stored rule is checked the same way.
    got = gateway.admin("GET", f"/admin/rules/{daily['id']}")
    lowered = {**daily, "entries": [{**daily["entries"][0], "window": "weekly"}]}
    assert _put(gateway, f"/admin/rules/{daily['id']}", lowered, got.headers["etag"]).status_code == 200
    conflicting = {"id": f"caps-m2-{_tag()}", "entries": [{**monthly["entries"][0], "threshold_usd": "299.99"}]}
    refused = gateway.admin("POST", "/admin/rules", conflicting)
    assert refused.status_code == 400 and daily["id"] in refused.json()["errors"][0]


# --- bad input and authentication -----------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    b'{"id": "a\\u0000b", "entries": []}',
    b'{"id": "nul", "entries": [{"scope": {"tag": "a\\u0000"}, "window": "daily", "threshold_usd": 1}]}',
    b'{"id": "nul", "entries": [{"population": {"tiers": ["\\u0000"]}, "scope": {"tag": "a"}, "calls_per_minute": 1}]}',
    b'{"id": "sur", "entries": [{"scope": {"tag": "\\ud800"}, "calls_per_minute": 1}]}',
    b'{"id": "sur\xed\xa0\x80", "entries": []}',
    b'{"id": "big", "weight": 1e400, "entries": []}',
    b'{"id": "big", "weight": 100000000000000000000000000000000000000, "entries": []}',
    b'{"id": "big", "entries": [{"scope": {"tag": "a"}, "window": "daily", "threshold_usd": 1e308}]}',
    b'{"id": "big", "entries": [{"scope": {"tag": "a"}, "window": "daily", "threshold_usd": "' + b"9" * 5000 + b'"}]}',
    b'{"id": 5, "entries": {}}',
    b'{"\\u0000": 1}',
    b'[]',
    b'"rule"',
    b'null',
    b'',
    b'{"id": "x"',
    b'[' * 5000 + b']' * 5000,
    b'{"id": "deep", "entries": [' + b'[' * 200 + b']' * 200 + b']}',
])
def test_bad_input_is_a_400_never_a_500(gateway: Gateway, raw: bytes) -> None:
    """NUL bytes, lone surrogates, numbers out of range, wrong types and malformed or deep JSON are
    400s on create, replace and dry-run, and nothing is stored."""
    count = _rule_count(gateway)
    stored = gateway.admin("POST", "/admin/rules", _rule())
    assert stored.status_code == 201
    headers = {"authorization": f"Bearer {gateway.admin_token}", "content-type": "application/json"}
    for method, path, extra in (("POST", "/admin/rules", {}), ("POST", "/admin/rules/dry-run", {}),
                                ("PUT", f"/admin/rules/{stored.json()['id']}", {"if-match": stored.headers["etag"]})):
        response = gateway.client.request(method, path, content=raw, headers={**headers, **extra})
        assert response.status_code == 400, (method, path, response.status_code, response.text)
        assert response.json()["error"] in ("invalid_rule", "invalid_request")
    assert _rule_count(gateway) == count + 1


@pytest.mark.parametrize("path", ["/admin/rules/a%00b", "/admin/rules/%ED%A0%80", "/admin/rules/" + "a" * 300,
                                  "/admin/rules/UPPER"])
def test_odd_rule_ids_in_the_path_are_not_found(gateway: Gateway, path: str) -> None:
    """An id in the path that cannot be a rule's is a 404, whatever the method."""
    assert gateway.admin("GET", path).status_code == 404
    assert gateway.admin("DELETE", path).status_code == 404
    assert _put(gateway, path, _rule(), '"1"').status_code == 404


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/admin/rules"), ("POST", "/admin/rules"), ("GET", "/admin/rules/x"), ("PUT", "/admin/rules/x"),
    ("DELETE", "/admin/rules/x"), ("POST", "/admin/rules/dry-run"), ("GET", "/admin/enforcement"),
    ("PUT", "/admin/enforcement"),
])
def test_rule_routes_need_an_admin(gateway: Gateway, method: str, path: str) -> None:
    """Without credentials, or with a caller's key, every rule route is a 401."""
    assert gateway.client.request(method, path, json={}).status_code == 401
    user = _user(gateway)
    response = gateway.client.request(method, path, json={}, headers={"authorization": f"Bearer {user['key']}"})
    assert response.status_code == 401


def test_a_session_needs_its_csrf_token_to_write_a_rule(gateway: Gateway) -> None:
    """Logged in with a session cookie, a rule write without the CSRF token is refused; with it, it is taken."""
    email, password = f"rules-admin-{_tag()}@example.com", "correct horse battery"
    assert gateway.admin("POST", "/admin/admins", {"email": email, "password": password}).status_code == 201
    with httpx.Client(base_url=gateway.base_url, timeout=10) as browser:
        login = browser.post("/admin/login", json={"email": email, "password": password})
        assert login.status_code == 200, login.text
        assert browser.get("/admin/rules").status_code == 200
        assert browser.post("/admin/rules", json=_rule()).status_code == 403
        created = browser.post("/admin/rules", json=_rule(), headers={"x-csrf-token": login.json()["csrf_token"]})
        assert created.status_code == 201, created.text
        assert any(e["actor"] == email for e in _audit(gateway, "create_rule"))


# --- the enforcement switch -----------------------------------------------------------------------


def test_the_enforcement_switch_round_trips_and_reaches_the_snapshot(gateway: Gateway) -> None:
    """GET answers the global switch (on by default); PUT sets it, audited, and the workers'
    config carries it; a body that is not {enforce: bool} is a 400."""
    assert gateway.admin("GET", "/admin/enforcement").json() == {"enforce": True}
    try:
        off = _put(gateway, "/admin/enforcement", {"enforce": False}, None)
        assert (off.status_code, off.json()) == (200, {"enforce": False})
        assert gateway.admin("GET", "/admin/enforcement").json() == {"enforce": False}
        assert asyncio.run(_config(gateway)).enforce_rules is False
        for bad in ({"enforce": "no"}, {}, {"enforce": True, "global": True}, [True]):
            response = _put(gateway, "/admin/enforcement", bad, None)
            assert (response.status_code, response.json()["error"]) == (400, "invalid_request"), bad
    finally:
        assert _put(gateway, "/admin/enforcement", {"enforce": True}, None).json() == {"enforce": True}
    assert asyncio.run(_config(gateway)).enforce_rules is True
    details = [e["detail"] for e in _audit(gateway, "update_enforcement")]
    assert {"enforce": False} in details and {"enforce": True} in details


# --- model restrictions ---------------------------------------------------------------------------


def test_model_restrictions_are_validated_stored_shown_and_loaded(gateway: Gateway) -> None:
    """PUT /admin/models/{id} takes restrictions alone or with the model; unknown people and
    contradictions are refused listing every problem; GET shows them; a full PUT without them
    keeps them and null clears them; the workers' config carries them by principal index."""
    model = _model(gateway)
    leader, other, exempt = _user(gateway), _user(gateway), _user(gateway)
    path = f"/admin/models/{model['id']}"

    def etag() -> str:
        return gateway.admin("GET", path).headers["etag"]

    restrictions = {"leader_deny": [leader["id"]], "leader_allow": None, "exempt": [exempt["id"].upper()],
                    "business_units_closed": [" legal "], "business_units_open": None}
    missing = _put(gateway, path, {"restrictions": restrictions}, None)
    assert missing.status_code == 428
    done = _put(gateway, path, {"restrictions": restrictions}, etag())
    assert done.status_code == 200, done.text
    stored = {"leader_deny": [leader["id"]], "leader_allow": None, "exempt": [exempt["id"]],
              "business_units_closed": ["legal"], "business_units_open": None}
    assert done.json()["restrictions"] == stored
    assert gateway.admin("GET", path).json()["restrictions"] == stored
    assert next(m for m in gateway.admin("GET", "/admin/models").json() if m["id"] == model["id"])[
        "restrictions"] == stored

    config = asyncio.run(_config(gateway))
    index = {p.id: i for i, p in enumerate(config.principals)}
    loaded = next(m for m in config.models if m.id == model["id"]).restrictions
    assert loaded is not None and loaded.leader_deny == [index[leader["id"]]] and loaded.exempt == [index[exempt["id"]]]
    assert loaded.business_units_closed == ["legal"] and loaded.leader_allow is None

    ghost = "00000000-0000-4000-8000-00000000dead"
    bad = _put(gateway, path, {"restrictions": {"leader_deny": [ghost, other["id"]], "leader_allow": [other["id"]],
                                                "exempt": [ghost], "business_units_open": ["a", ""],
                                                "business_units_closed": ["a"]}}, etag())
    assert bad.status_code == 400, bad.text
    problems = bad.json()["errors"]
    assert len(problems) == 5, problems
    assert sum("unknown user" in p for p in problems) == 2
    assert any("both in leader_deny and leader_allow" in p for p in problems)
    assert any("both closed and open" in p for p in problems)
    assert any("business_units_open[1]: may not be empty" in p for p in problems)
    for body in ({"restrictions": {"leader_deny": "x"}}, {"restrictions": {"allow": []}},
                 {"restrictions": {"exempt": ["a\u0000"]}}, {"restrictions": {"leader_deny": ["x"] * 1001}},
                 {"restrictions": []}):
        assert _put(gateway, path, body, etag()).status_code == 400, body

    full = {k: model[k] for k in ("provider_id", "name", "resolved_model", "kind")}
    kept = _put(gateway, path, {**full, "output_price_per_1k_tokens": "0.5"}, etag())
    assert kept.status_code == 200 and kept.json()["restrictions"] == stored
    cleared = _put(gateway, path, {**full, "restrictions": None}, etag())
    assert cleared.status_code == 200 and cleared.json()["restrictions"] is None
    assert any(e["detail"].get("restrictions") is True for e in _audit(gateway, "update_model")
               if e["target"] == model["id"])


# --- registry files ---------------------------------------------------------------------------------


def _apply(gateway: Gateway, path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(gateway.env(), DATABASE_URL=gateway.database_url)
    return subprocess.run([sys.executable, "-m", "meshfast.cli", "apply", str(path), "--json"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_registry_file_applies_rules_restrictions_and_the_switch_in_one_transaction(
        gateway: Gateway, fresh_dir: Path) -> None:
    """A file's rules (authored shape) and a model's restrictions (people by email or id) are
    created, applied again unchanged, updated; a file with problems lists every one of them and
    changes nothing, not even the parts that were fine."""
    leader, exempt = _user(gateway), _user(gateway)
    provider = f"rules-file-p-{_tag()}"
    model = f"rules-file-m-{_tag()}"
    rule_id = f"file-{_tag()}"
    registry: Json = {
        "providers": [{"name": provider, "family": "openai", "base_url": "http://127.0.0.1:9/openai",
                       "api_key": "sk-x", "local": True}],
        "models": [{"name": model, "provider": provider, "resolved_model": "gpt-test", "aliases": [f"{model}-a"],
                    "restrictions": {"leader_deny": [leader["email"].upper()], "exempt": [exempt["id"]]}}],
        "rules": [{"id": rule_id, "entries": [{"population": {"leaders": [leader["id"]]},
                                               "scope": {"model": f"{model}-a"}, "window": "weekly",
                                               "threshold_usd": 12.5, "actions": [{"type": "block"}]}]}],
        "enforce_rules": True,
    }
    path = fresh_dir / "rules.json"
    path.write_text(json.dumps(registry))
    done = _apply(gateway, path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert f"rule {rule_id}" in summary["created"] and f"model {model}" in summary["created"], summary
    assert "enforcement" in summary["unchanged"]
    rule = gateway.admin("GET", f"/admin/rules/{rule_id}").json()
    assert rule["entries"][0]["scope"] == {"model": model} and rule["entries"][0]["threshold_usd"] == "12.5"
    stored_model = next(m for m in gateway.admin("GET", "/admin/models").json() if m["name"] == model)
    assert stored_model["restrictions"]["leader_deny"] == [leader["id"]]
    assert stored_model["restrictions"]["exempt"] == [exempt["id"]]

    again = _apply(gateway, path)
    assert again.returncode == 0 and json.loads(again.stdout)["updated"] == [], again.stdout

    registry["rules"][0]["mode"] = "shadow"
    registry["models"][0]["restrictions"] = None
    path.write_text(json.dumps(registry))
    changed = json.loads(_apply(gateway, path).stdout)
    assert sorted(changed["updated"]) == sorted([f"rule {rule_id}", f"model {model}"]), changed
    assert gateway.admin("GET", f"/admin/rules/{rule_id}").json()["mode"] == "shadow"

    before = (gateway.admin("GET", "/admin/rules").json(), gateway.admin("GET", "/admin/enforcement").json())
    bad = {
        "models": [{"name": model, "provider": provider, "resolved_model": "gpt-test",
                    "restrictions": {"leader_deny": ["ghost@example.com"], "exempt": ["not-an-id"]}}],
        "rules": [{"id": rule_id, "entries": [{"scope": {"model": "no-such-model"}, "window": "weekly",
                                               "threshold_usd": "1", "actions": [{"type": "block"}]}]},
                  {"id": f"new-{_tag()}", "entries": [{"population": {"leaders": ["00000000-0000-4000-8000-000000000000"]},
                                                       "scope": {"tag": "x"}, "calls_per_minute": 3}]}],
        "enforce_rules": False,
    }
    path.write_text(json.dumps(bad))
    refused = _apply(gateway, path)
    assert refused.returncode == 1 and "'not-an-id' is not a user id" in refused.stderr, refused.stderr
    bad["models"][0]["restrictions"] = {"leader_deny": ["ghost@example.com"]}
    path.write_text(json.dumps(bad))
    refused = _apply(gateway, path)
    assert refused.returncode == 1
    for problem in ("unknown user 'ghost@example.com'", "unknown model 'no-such-model'",
                    "unknown user '00000000-0000-4000-8000-000000000000'"):
        assert problem in refused.stderr, refused.stderr
    after = (gateway.admin("GET", "/admin/rules").json(), gateway.admin("GET", "/admin/enforcement").json())
    assert after == before, "nothing of a refused file is written"

    # Shape problems are found before the database, every one of them, duplicates included.
    path.write_text(json.dumps({"rules": [{"id": "Bad Id", "entries": []}, {"id": "dup", "entries": "x"},
                                          {"id": "dup", "weight": "heavy", "entries": [{"scope": {"tag": "t"}}]}],
                                "models": [{"name": "m", "provider": "p", "restrictions": {"deny": []}}]}))
    refused = _apply(gateway, path)
    assert refused.returncode == 1
    for problem in ("rules[0]: id: must be", "rules[0]: entries: needs at least one", "rules[1] ('dup'): entries: must be a list",
                    "rules[2] ('dup'): a rule of that id is listed twice", "rules[2] ('dup'): weight: must be an integer",
                    "entries[0]: needs threshold_usd", "unknown field 'deny'"):
        assert problem in refused.stderr, (problem, refused.stderr)


# --- dry-run --------------------------------------------------------------------------------------


def test_a_dry_run_refuses_an_invalid_draft_and_writes_nothing(gateway: Gateway) -> None:
    """The draft is validated as a write is (400 invalid_rule listing every problem); nothing is
    stored, valid or not."""
    count = _rule_count(gateway)
    bad = gateway.admin("POST", "/admin/rules/dry-run", {"id": "x", "entries": [{"scope": {"model": "nope"}}]})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_rule"
    assert len(bad.json()["errors"]) == 2, bad.json()
    gateway.admin("POST", "/admin/rules/dry-run", _rule())
    assert _rule_count(gateway) == count


needs_dry_run = pytest.mark.skipif(not hasattr(Core, "dry_run"), reason="this build's core has no dry_run yet")


@needs_dry_run
def test_a_dry_run_lists_the_people_at_or_over_a_threshold_from_current_counters(
        gateway: Gateway, testserve: EmulatedProviders) -> None:
    """Two people spend on a tagged model; a draft with a threshold between their spends lists
    the bigger spender as block with utilization >= 1 and the other not at all (or below
    threshold for warn), a draft with a lower warn threshold lists both; nothing is stored."""
    tag = f"dry-{_tag()}"
    provider = gateway.create_provider(f"dry-p-{_tag()}", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key")
    model = gateway.create_model(provider["id"], f"dry-m-{_tag()}", resolved_model="dummy-chat", tags=[tag],
                                 input_price_per_1k_tokens="10", output_price_per_1k_tokens="10")
    big, small = _user(gateway, business_unit="dry"), _user(gateway, business_unit="dry")
    for user, calls in ((big, 4), (small, 1)):
        gateway.grant(user["id"], model["id"])
        for _ in range(calls):
            response = gateway.client.post("/v1/chat/completions", headers={"authorization": f"Bearer {user['key']}"},
                                           json={"model": model["name"], "max_tokens": 16,
                                                 "messages": [{"role": "user", "content": "hello there"}]})
            assert response.status_code == 200, response.text
    time.sleep(0.5)
    spent = {}
    for user in (big, small):
        usage = gateway.client.get("/v1/usage", headers={"authorization": f"Bearer {user['key']}"}).json()
        spent[user["id"]] = next(u["spent_usd"] for u in usage["usage"] if u["model"] == model["name"])
    assert spent[big["id"]] > spent[small["id"]] > 0, spent
    between = (spent[big["id"]] + spent[small["id"]]) / 2

    count = _rule_count(gateway)
    draft = {"id": f"dry-{_tag()}", "entries": [{"population": {"business_units": ["dry"]}, "scope": {"tag": tag},
                                                 "window": "daily", "threshold_usd": f"{between:.9f}",
                                                 "actions": [{"type": "block"}]}]}
    answer = gateway.admin("POST", "/admin/rules/dry-run", draft)
    assert answer.status_code == 200, answer.text
    affected = answer.json()["affected"]
    assert [a["user_id"] for a in affected] == [big["id"]], affected
    assert affected[0]["action"] == "block" and affected[0]["entry"] == 0 and affected[0]["utilization"] >= 1.0

    draft["entries"][0].update(threshold_usd=f"{spent[small['id']] / 2:.9f}", actions=[{"type": "warn", "text": "hi"}])
    answer = gateway.admin("POST", "/admin/rules/dry-run", draft)
    assert answer.status_code == 200, answer.text
    assert {a["user_id"] for a in answer.json()["affected"]} == {big["id"], small["id"]}
    assert _rule_count(gateway) == count
