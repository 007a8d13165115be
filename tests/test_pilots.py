"""Pilots end to end (API.md "Governed lifecycle"): `/admin/pilots` CRUD with ETag and every
validation problem at once; an authoritative pilot deciding its members' access; a tier ladder
over the pilot's models together; the pilot's own shadow mode; expiry; and rules' population.pilots
(dry-run included). Calls cost $0.003 each (tests/test_onboarding.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway, running_gateway, until
from conftest import tag as _tag
from test_onboarding import (
    CALL_USD,
    PROPAGATION_S,
    Json,
    audit_actions,
    chat,
    model,
    proxy,
    put_model,
    rfc3339,
    settles,
    user,
)


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_gateway(2, env=SESSION_ENV) as gateway:
        yield gateway


def _pilot(gw: Gateway, **fields: Any) -> Json:
    body = {"name": f"pilot-{_tag()}", "members": [], "models": [], "authoritative": False, "mode": "enforce",
            "expires_at": rfc3339(3600), **fields}
    response = gw.admin("POST", "/admin/pilots", body)
    assert response.status_code == 201, response.text
    assert response.headers["etag"] == f'"{response.json()["version"]}"'
    pilot: Json = response.json()
    return pilot


def _would_deny(gw: Gateway, person: Json) -> list[str | None]:
    return [r["would_deny"] for r in gw.query(
        "SELECT would_deny FROM request_logs WHERE user_id = $1::uuid ORDER BY created_at", person["id"])]


# --- CRUD and validation -----------------------------------------------------------------------------


def test_pilots_are_created_read_updated_under_if_match_and_deleted_with_audit(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """201 with an ETag; GET one and the list; PUT needs If-Match (428 missing, 409 stale); DELETE;
    every write audited."""
    a, b = user(gw), user(gw)
    m = model(gw, testserve)
    pilot = _pilot(gw, members=[a["id"]], models=[m["name"]], tiers=[
        {"name": "base", "amount_usd": "5", "window": "monthly", "exceptions": []}])
    assert (pilot["members"], pilot["models"], pilot["live"]) == ([a["id"]], [m["name"]], True)
    assert pilot["tiers"][0]["amount_usd"] == "5"
    got = gw.admin("GET", f"/admin/pilots/{pilot['id']}")
    assert got.status_code == 200 and got.json()["id"] == pilot["id"]
    assert pilot["id"] in [p["id"] for p in gw.admin("GET", "/admin/pilots").json()]

    url = f"/admin/pilots/{pilot['id']}"
    changed = {**{k: pilot[k] for k in ("name", "models", "authoritative", "mode", "expires_at", "tiers")},
               "members": [a["id"], b["id"]]}
    headers = {"authorization": f"Bearer {gw.admin_token}"}
    assert gw.client.put(url, json=changed, headers=headers).status_code == 428
    assert gw.client.put(url, json=changed, headers={**headers, "if-match": '"99"'}).status_code == 409
    updated = gw.client.put(url, json=changed, headers={**headers, "if-match": got.headers["etag"]})
    assert updated.status_code == 200, updated.text
    assert updated.json()["members"] == [a["id"], b["id"]] and updated.json()["version"] == pilot["version"] + 1
    assert gw.admin("DELETE", url).status_code == 200
    assert gw.admin("GET", url).status_code == 404
    for action in ("pilot.create", "pilot.update", "pilot.delete"):
        assert audit_actions(gw, action), action


def test_an_invalid_pilot_is_refused_with_every_problem_listed(gw: Gateway, testserve: EmulatedProviders) -> None:
    """Empty name, unknown member, unknown model, a member already in another live pilot, two
    tiers with one amount: one 400 invalid_pilot naming each."""
    enrolled = user(gw)
    _pilot(gw, members=[enrolled["id"]])
    ghost = "00000000-0000-4000-8000-00000000abcd"
    response = gw.admin("POST", "/admin/pilots", {
        "name": " ", "members": [enrolled["id"], ghost], "models": ["no-such-model"], "mode": "enforce",
        "expires_at": rfc3339(60), "tiers": [{"name": "a", "amount_usd": "5", "window": "daily"},
                                             {"name": "b", "amount_usd": "5.0", "window": "daily"}]})
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] == "invalid_pilot"
    text = "\n".join(body["errors"])
    for needle in ("name", ghost, "no-such-model", "already enrolled", "tiers[1].amount_usd"):
        assert needle in text, (needle, body["errors"])
    assert len(body["errors"]) >= 5
    bad_time = gw.admin("POST", "/admin/pilots", {"name": "x", "expires_at": "2030-01-01T00:00:00"})
    assert bad_time.status_code == 400 and "timezone" in bad_time.text


# --- authoritative access ---------------------------------------------------------------------------


def test_an_authoritative_pilot_serves_staged_limited_and_restricted_models_to_its_members_only(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """Its members are served without a grant over a staged status, a roster that leaves them out
    and restrictions that refuse them; a granted outsider, and the member of a pilot that is not
    authoritative, get the unknown-model 404."""
    member, outsider, bystander = user(gw), user(gw), user(gw)
    staged = model(gw, testserve, status="staged")
    limited = model(gw, testserve, status="limited", roster=[outsider["id"]])
    restricted = model(gw, testserve)
    assert put_model(gw, restricted, {"restrictions": {"business_units_open": ["nowhere"]}}).status_code == 200
    names = [staged["name"], limited["name"], restricted["name"]]
    for m in (staged, restricted):
        gw.grant(outsider["id"], m["id"])
        gw.grant(bystander["id"], m["id"])
    _pilot(gw, members=[member["id"]], models=names, authoritative=True)
    _pilot(gw, members=[bystander["id"]], models=names, authoritative=False)
    for m in (staged, limited, restricted):
        settles(gw, lambda m=m: chat(gw, member, m), 200, f"the member served {m['status']}")
        assert proxy(gw, member, m).status_code == 200
    assert chat(gw, outsider, staged).status_code == 404
    assert chat(gw, outsider, restricted).status_code == 404
    assert chat(gw, outsider, limited).status_code == 200, "the roster still applies to its own"
    for m in (staged, limited, restricted):
        assert chat(gw, bystander, m).status_code == 404, m["name"]


def test_a_pilot_stops_applying_when_it_expires(gw: Gateway, testserve: EmulatedProviders) -> None:
    """An authoritative pilot serving a staged model: at expires_at every worker republishes and the
    member is refused (staged) with no write in between."""
    member = user(gw)
    staged = model(gw, testserve, status="staged")
    pilot = _pilot(gw, members=[member["id"]], models=[staged["name"]], authoritative=True, expires_at=rfc3339(5))
    settles(gw, lambda: chat(gw, member, staged), 200, "served while the pilot is live")
    until(lambda: chat(gw, member, staged).status_code == 404, 10.0, "refused once the pilot expired")
    assert gw.admin("GET", f"/admin/pilots/{pilot['id']}").json()["live"] is False


# --- tier ladders and modes ---------------------------------------------------------------------------


def test_a_tier_ladder_caps_spend_on_the_pilots_models_together_and_an_exception_promotes(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """Tiers of two and four calls' worth over two models: a member stops after two calls across
    both models (429 budget_exceeded naming pilot:<id>); a member excepted from the lower tier gets four."""
    plain, promoted = user(gw), user(gw)
    first, second = model(gw, testserve), model(gw, testserve)
    for person in (plain, promoted):
        for m in (first, second):
            gw.grant(person["id"], m["id"])
    pilot = _pilot(gw, members=[plain["id"], promoted["id"]], models=[first["name"], second["name"]], tiers=[
        {"name": "high", "amount_usd": str(4 * CALL_USD), "window": "daily", "exceptions": []},
        {"name": "low", "amount_usd": str(2 * CALL_USD), "window": "daily", "exceptions": [promoted["id"]]}])
    rule = f"pilot:{pilot['id']}"
    settles(gw, lambda: gw.client.get("/v1/models", headers={"authorization": f"Bearer {plain['key']}"}), 200, "up")
    time.sleep(PROPAGATION_S / 3)
    assert proxy(gw, plain, first).status_code == 200
    assert proxy(gw, plain, second).status_code == 200
    blocked = proxy(gw, plain, first)
    assert blocked.status_code == 429 and blocked.json()["rule"] == rule, blocked.text
    assert proxy(gw, plain, second).status_code == 429
    for i in range(4):
        response = proxy(gw, promoted, (first, second)[i % 2])
        assert response.status_code == 200, (i, response.text)
    blocked = proxy(gw, promoted, second)
    assert blocked.status_code == 429 and blocked.json()["rule"] == rule, blocked.text


def test_a_shadow_pilot_records_would_deny_and_serves_while_enforcement_is_on(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """mode shadow: past the tier the call is served and its row names the pilot's rule in would_deny,
    though the global switch enforces."""
    assert gw.admin("GET", "/admin/enforcement").json() == {"enforce": True}
    person = user(gw)
    m = model(gw, testserve)
    gw.grant(person["id"], m["id"])
    pilot = _pilot(gw, members=[person["id"]], models=[m["name"]], mode="shadow",
                   tiers=[{"name": "one", "amount_usd": str(CALL_USD), "window": "daily"}])
    settles(gw, lambda: gw.client.get("/v1/models", headers={"authorization": f"Bearer {person['key']}"}), 200, "up")
    time.sleep(PROPAGATION_S / 3)
    for _ in range(3):
        assert proxy(gw, person, m).status_code == 200
    def three_rows() -> list[str | None] | None:
        rows = _would_deny(gw, person)
        return rows if len(rows) >= 3 else None

    rows = until(three_rows, 5.0, "three rows")
    assert rows[1:] == [f"pilot:{pilot['id']}"] * 2, rows


# --- population.pilots ----------------------------------------------------------------------------------


def test_a_rules_population_of_pilots_holds_their_members_only(gw: Gateway, testserve: EmulatedProviders) -> None:
    """population.pilots blocks the live pilot's members only (and dry-run lists only them); a
    population naming only a pilot that is gone matches nobody, never everyone."""
    member, other = user(gw), user(gw)
    m = model(gw, testserve)
    for person in (member, other):
        gw.grant(person["id"], m["id"])
    pilot = _pilot(gw, members=[member["id"]])
    gone = _pilot(gw, members=[other["id"]])
    rule_id = f"cohort-{_tag()}"
    entry = {"population": {"pilots": [pilot["id"]]}, "scope": {"model": m["name"]}, "window": "daily",
             "threshold_usd": str(CALL_USD), "actions": [{"type": "block"}]}
    created = gw.admin("POST", "/admin/rules", {"id": rule_id, "mode": "enforce", "entries": [entry]})
    assert created.status_code == 201, created.text
    unknown = gw.admin("POST", "/admin/rules", {"id": f"x-{_tag()}", "entries": [
        {**entry, "population": {"pilots": ["00000000-0000-4000-8000-0000000000ff"]}}]})
    assert unknown.status_code == 400 and "unknown pilot" in unknown.text
    gone_rule = f"gone-{_tag()}"
    assert gw.admin("POST", "/admin/rules", {"id": gone_rule, "mode": "enforce", "entries": [
        {**entry, "population": {"pilots": [gone["id"]]}}]}).status_code == 201
    assert gw.admin("DELETE", f"/admin/pilots/{gone['id']}").status_code == 200

    settles(gw, lambda: gw.client.get("/v1/models", headers={"authorization": f"Bearer {member['key']}"}), 200, "up")
    time.sleep(PROPAGATION_S / 3)
    assert proxy(gw, member, m).status_code == 200
    blocked = proxy(gw, member, m)
    assert blocked.status_code == 429 and blocked.json()["rule"] == rule_id, blocked.text
    for _ in range(3):
        assert proxy(gw, other, m).status_code == 200, "not a member of a live pilot the rule names"

    dry = gw.admin("POST", "/admin/rules/dry-run", {"id": f"dry-{_tag()}", "mode": "enforce", "entries": [entry]})
    assert dry.status_code == 200, dry.text
    assert [a["user_id"] for a in dry.json()["affected"]] == [member["id"]]


def test_the_governing_tier_is_the_lowest_whose_exceptions_do_not_list_the_member() -> None:
    """An exception promotes a member up the ladder (whatever the order the tiers are listed in);
    excepted from every tier, nothing governs them."""
    from meshfast import onboarding

    a, b = "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"
    tiers = [{"name": "top", "amount_usd": "50", "exceptions": [b]},
             {"name": "base", "amount_usd": "5", "exceptions": [a, b]},
             {"name": "mid", "amount_usd": "20", "exceptions": [b]}]
    assert onboarding.governing_tier(tiers, "00000000-0000-4000-8000-00000000000c") == 1
    assert onboarding.governing_tier(tiers, a) == 2
    assert onboarding.governing_tier(tiers, b) is None


def test_a_renamed_model_stays_in_the_pilots_that_list_it(gw: Gateway, testserve: EmulatedProviders) -> None:
    """Pilots list models by name: a rename carries them along (as it does the rules)."""
    m = model(gw, testserve)
    pilot = _pilot(gw, models=[m["name"]])
    current = gw.admin("GET", f"/admin/models/{m['id']}").json()
    body = {k: current[k] for k in ("provider_id", "resolved_model", "kind", "input_price_per_1k_tokens",
                                    "output_price_per_1k_tokens")}
    renamed = f"{m['name']}-renamed"
    assert put_model(gw, m, {**body, "name": renamed}).status_code == 200
    after = gw.admin("GET", f"/admin/pilots/{pilot['id']}").json()
    assert after["models"] == [renamed]
    assert (after["saved_revision"], after["enforced_revision"]) == (2, 2), "the rename is a revision"


def test_a_population_of_gone_expired_or_empty_pilots_matches_nobody() -> None:
    """population.pilots compiles to the live pilots' members; naming only pilots that are gone or
    expired (absent from the live map) or empty drops the entry: it never widens to everyone."""
    from meshfast import rules

    listed = "00000000-0000-4000-8000-0000000000aa"
    entry = {"population": {"pilots": [listed]}, "scope": {"model": "m"}, "window": "daily",
             "threshold_usd": "1", "actions": [{"type": "block"}]}
    assert rules.entry_config(entry, {}, {"m": 0}, {}) is None
    assert rules.entry_config(entry, {}, {"m": 0}, None) is None
    assert rules.entry_config(entry, {}, {"m": 0}, {listed: []}) is None
    compiled = rules.entry_config(entry, {}, {"m": 0}, {listed: [3, 1], "other": [2]})
    assert compiled is not None and compiled.principals == [1, 3]
