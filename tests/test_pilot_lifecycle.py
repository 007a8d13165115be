"""Pilots under the governed lifecycle (API.md "Governed lifecycle"): the classification of a
pilot's change as a pure function; end to end on a real two-worker `meshfast serve`, a business-unit
administrator's pilot that widens access waiting for approval (and the data plane serving nobody
new until then), a tightening applied at once, activate_at, saved vs enforced revisions, an
activation that no longer validates, and the scope of a unit's administrator over pilots."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway, running_gateway, until
from test_approvals import _as, _audit_rows, _sql, _token, _unit, _user
from test_onboarding import CALL_USD, model, proxy, rfc3339
from test_registry import _apply

from meshfast.admin import controls
from meshfast.admin.controls import RELAX, TIGHTEN
from meshfast.admin.pilots import classify_pilot, leaves_cohort

Json = dict[str, Any]
PROPAGATION_S = 1.5
ENV = {**SESSION_ENV, "MESHFAST_CALENDAR_TZ": "UTC"}

# --- classification (pure) ------------------------------------------------------------------------

A, B, C = "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b", \
    "00000000-0000-4000-8000-00000000000c"
SOON, LATER = "2030-01-01T00:00:00Z", "2030-06-01T00:00:00Z"


def _tier(amount: str = "10", window: str = "monthly", exceptions: list[str] | None = None, name: str = "t") -> Json:
    return {"name": name, "amount_usd": amount, "window": window, "exceptions": exceptions or []}


def _p(**fields: Any) -> Json:
    """An authoritative pilot of A and B on m1 with one $10 monthly tier, enforcing, until LATER."""
    return {"name": "p", "members": [A, B], "models": ["m1"], "authoritative": True, "mode": "enforce",
            "expires_at": LATER, "tiers": [_tier()], **fields}


def _open(**fields: Any) -> Json:
    """The same pilot without tiers: access only."""
    return _p(tiers=[], **fields)


def _caps(**fields: Any) -> Json:
    """The same pilot, not authoritative: caps only."""
    return _p(authoritative=False, **fields)


@pytest.mark.parametrize(("old", "new", "expected"), [
    (_p(), _p(), TIGHTEN),  # unchanged
    (_p(), _p(name="renamed"), TIGHTEN),
    (None, None, TIGHTEN),
    (_p(), None, RELAX),  # a deletion
    (None, _p(), RELAX),  # a new authoritative pilot serves its members
    (None, _p(members=[]), TIGHTEN),  # serving nobody
    (None, _caps(), TIGHTEN),  # a new pilot that only caps
    # access (authoritative)
    (_p(), _p(members=[A, B, C]), RELAX),  # a member added
    (_p(), _p(models=["m1", "m2"]), RELAX),  # a model added
    (_caps(), _p(), RELAX),  # made authoritative
    (_p(), _caps(), TIGHTEN),  # no longer authoritative (the caps stay)
    (_open(), _open(members=[A]), TIGHTEN),  # a member removed from a pilot without tiers
    (_open(models=["m1", "m2"]), _open(), TIGHTEN),  # a model removed from a pilot without tiers
    (_open(), _open(expires_at=SOON), TIGHTEN),  # an earlier expiry of a pilot without tiers
    (_open(expires_at=None), _open(expires_at=SOON), TIGHTEN),
    (_open(), _open(expires_at=None), RELAX),  # a later expiry (never)
    (_p(expires_at=SOON), _p(), RELAX),  # a later expiry
    # caps (tiers)
    (_p(), _p(tiers=[_tier("5")]), TIGHTEN),  # a lower amount
    (_p(), _p(tiers=[_tier("10.00")]), TIGHTEN),
    (_p(), _p(tiers=[_tier("20")]), RELAX),  # a higher amount
    (_open(), _p(), TIGHTEN),  # a tier added
    (_p(), _p(tiers=[_tier(), _tier("50", name="u")]), TIGHTEN),  # a higher tier added: the lowest governs
    (_p(tiers=[_tier(), _tier("50", name="u")]), _p(), TIGHTEN),  # a tier nobody was governed by, removed
    (_p(), _open(), RELAX),  # the ladder removed
    (_p(tiers=[_tier("5"), _tier("50", name="u")]), _p(tiers=[_tier("50", name="u")]), RELAX),  # a tier removed
    (_p(tiers=[_tier("5"), _tier("50", name="u")]),
     _p(tiers=[_tier("5", exceptions=[A]), _tier("50", name="u")]), RELAX),  # an exception promotes A
    (_p(), _p(tiers=[_tier(exceptions=[A])]), RELAX),  # excepted from the only tier: uncapped
    (_p(tiers=[_tier(exceptions=[A])]), _p(), TIGHTEN),  # an exception removed
    (_p(), _p(mode="shadow"), RELAX),
    (_p(), _p(mode="inherit"), RELAX),
    (_p(mode="inherit"), _p(mode="shadow"), RELAX),
    (_p(mode="shadow"), _p(), TIGHTEN),
    (_p(), _p(tiers=[_tier(window="daily")]), RELAX),  # the same amount over a shorter window
    (_p(tiers=[_tier(window="daily")]), _p(), TIGHTEN),
    (_caps(), _caps(members=[A, B, C]), TIGHTEN),  # a pilot that only caps: a member added is capped
    (_caps(), _caps(models=["m1", "m2"]), TIGHTEN),  # its ladder covers another model
    # fewer members is not simply tighter: leaving a ladder frees one of its cap
    (_p(), _p(members=[A]), RELAX),
    (_caps(), _caps(members=[A]), RELAX),
    (_p(models=["m1", "m2"]), _p(), RELAX),  # a model leaves the ladder
    (_p(), _p(expires_at=SOON), RELAX),  # the ladder ends sooner
    (_caps(), _caps(expires_at=LATER.replace("06", "09")), TIGHTEN),  # a pilot that only caps, for longer
    # mixed
    (_p(), _p(members=[A, B, C], tiers=[_tier("1")]), RELAX),
    (_p(), _p(tiers=[_tier("1")], mode="shadow"), RELAX),
    (_p(), _caps(tiers=[_tier("20")]), RELAX),
])
def test_a_pilot_change_is_classified_as_tightening_or_relaxing(old: Json | None, new: Json | None,
                                                                 expected: str) -> None:
    """classify_pilot: tightening only when access is not wider and no member's cap is looser."""
    assert classify_pilot(old, new) == expected


@pytest.mark.parametrize(("old", "new", "expected"), [
    (None, _p(), False),
    (_p(), None, True),
    (_p(), _p(), False),
    (_p(), _p(members=[A, B, C]), False),
    (_p(), _p(members=[A]), True),
    (_p(), _p(expires_at=SOON), True),
    (_p(), _p(expires_at=None), False),
    (_p(members=[]), _p(members=[], expires_at=SOON), False),
])
def test_a_member_leaves_the_cohort_when_removed_or_when_the_pilot_ends_sooner(
        old: Json | None, new: Json | None, expected: bool) -> None:
    """leaves_cohort: what takes someone out of the rules that name the pilot."""
    assert leaves_cohort(old, new) is expected


def test_pilots_are_a_registered_control_kind() -> None:
    """The kind ``pilot`` is registered (with the registry lock: pilots name models)."""
    assert controls.KINDS["pilot"].classify is classify_pilot and controls.KINDS["pilot"].registry


# --- end to end ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_gateway(2, env=ENV) as gateway:
        yield gateway


def _chat_statuses(gw: Gateway, person: Json, m: Json, n: int = 6) -> set[int]:
    """The statuses of ``n`` calls, each on a new connection (the kernel spreads them over the workers)."""
    statuses = set()
    for _ in range(n):
        with httpx.Client(base_url=gw.base_url, timeout=10) as client:
            statuses.add(client.post("/v1/chat/completions", headers={"authorization": f"Bearer {person['key']}"},
                                     json={"model": m["name"], "max_tokens": 3,
                                           "messages": [{"role": "user", "content": "hello"}]}).status_code)
    return statuses


def _body(pilot: Json, **fields: Any) -> Json:
    return {**{k: pilot[k] for k in ("name", "members", "models", "authoritative", "mode", "expires_at", "tiers")},
            **fields}


def _put(gw: Gateway, token: str, pilot: Json, **fields: Any) -> httpx.Response:
    current = gw.admin("GET", f"/admin/pilots/{pilot['id']}")
    assert current.status_code == 200, current.text
    return _as(gw, token, "PUT", f"/admin/pilots/{pilot['id']}", _body(current.json(), **fields),
               {"if-match": current.headers["etag"]})


def _create(gw: Gateway, token: str, **fields: Any) -> httpx.Response:
    body = {"name": f"plc-{time.time_ns()}", "members": [], "models": [], "authoritative": True, "mode": "enforce",
            "expires_at": rfc3339(3600), "tiers": [], **fields}
    return _as(gw, token, "POST", "/admin/pilots", body)


def _read(gw: Gateway, pilot: Json) -> Json:
    response = gw.admin("GET", f"/admin/pilots/{pilot['id']}")
    assert response.status_code == 200, response.text
    read: Json = response.json()
    return read


def test_a_unit_admins_pilot_that_adds_a_member_waits_for_approval_then_serves_every_worker(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """An authoritative pilot on a staged model: the unit administrator adding a member is 202
    pending (the pilot, its revisions and the data plane unchanged: the new member gets the
    unknown-model 404); approved, the member is served by every worker; audited with the unit."""
    unit = _unit(gw)
    admin = _token(gw, [unit])
    first, added = _user(gw, unit), _user(gw, unit)
    staged = model(gw, testserve, status="staged")
    created = _create(gw, gw.admin_token, members=[first["id"]], models=[staged["name"]])
    assert created.status_code == 201, created.text
    pilot = created.json()
    assert (pilot["saved_revision"], pilot["enforced_revision"]) == (1, 1)

    pending = _put(gw, admin, pilot, members=[first["id"], added["id"]])
    assert pending.status_code == 202, pending.text
    assert pending.json()["status"] == "pending"
    read = _read(gw, pilot)
    assert read["members"] == [first["id"]] and (read["saved_revision"], read["enforced_revision"]) == (1, 1)
    time.sleep(PROPAGATION_S)
    assert _chat_statuses(gw, added, staged) == {404}, "a pending change serves nobody new"
    assert _chat_statuses(gw, first, staged, 2) == {200}

    change = gw.admin("GET", f"/admin/changes/{pending.json()['change_id']}").json()
    assert (change["kind"], change["action"], change["business_unit"]) == ("pilot", "update", unit)
    approved = gw.admin("POST", f"/admin/changes/{change['id']}/approve")
    assert approved.status_code == 200 and approved.json()["status"] == "applied", approved.text
    read = _read(gw, pilot)
    assert read["members"] == [first["id"], added["id"]] and (read["saved_revision"], read["enforced_revision"]) == (2, 2)
    time.sleep(PROPAGATION_S)
    assert _chat_statuses(gw, added, staged, 8) == {200}, "every worker serves the approved member"
    for action in ("change.submit", "change.approve", "control.activate"):
        rows = _audit_rows(gw, action, pilot["id"])
        assert len(rows) == 1 and rows[0]["business_unit"] == unit, action


def test_a_unit_admins_tightening_of_a_pilot_applies_at_once(gw: Gateway, testserve: EmulatedProviders) -> None:
    """A lower tier is 200 and enforced at once (the member's next call is 429 naming the pilot);
    an earlier expiry of a pilot without tiers is 200 and the member loses the staged model then."""
    unit = _unit(gw)
    admin = _token(gw, [unit])
    person = _user(gw, unit)
    m = model(gw, testserve)
    gw.grant(person["id"], m["id"])
    capped = _create(gw, admin, members=[person["id"]], models=[m["name"]], authoritative=False,
                     tiers=[{"name": "wide", "amount_usd": "1", "window": "daily"}])
    assert capped.status_code == 201, capped.text  # a pilot that only caps: tightening
    pilot = capped.json()
    time.sleep(PROPAGATION_S)
    assert proxy(gw, person, m).status_code == 200
    lowered = _put(gw, admin, pilot, tiers=[{"name": "narrow", "amount_usd": str(CALL_USD), "window": "daily"}])
    assert lowered.status_code == 200, lowered.text
    assert (lowered.json()["saved_revision"], lowered.json()["enforced_revision"]) == (2, 2)
    time.sleep(PROPAGATION_S)
    blocked = proxy(gw, person, m)
    assert blocked.status_code == 429 and blocked.json()["rule"] == f"pilot:{pilot['id']}", blocked.text

    member = _user(gw, unit)
    staged = model(gw, testserve, status="staged")
    served = _create(gw, gw.admin_token, members=[member["id"]], models=[staged["name"]])
    assert served.status_code == 201, served.text
    time.sleep(PROPAGATION_S)
    assert _chat_statuses(gw, member, staged, 2) == {200}
    sooner = _put(gw, admin, served.json(), expires_at=rfc3339(2))
    assert sooner.status_code == 200, sooner.text
    until(lambda: _chat_statuses(gw, member, staged, 4) == {404}, 10, "refused once the pilot ends")


def test_a_scheduled_pilot_change_goes_live_at_activate_at_and_reads_show_it(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A platform administrator's member added with activate_at a few seconds ahead: 200 with
    saved 2, enforced 1 and `scheduled`; the new member is refused until then, served after; a
    scheduled create answers version 0 and is absent until it goes live."""
    first, added = _user(gw, None), _user(gw, None)
    staged = model(gw, testserve, status="staged")
    pilot = _create(gw, gw.admin_token, members=[first["id"]], models=[staged["name"]]).json()
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)
    scheduled = _put(gw, gw.admin_token, pilot, members=[first["id"], added["id"]], activate_at=at.isoformat())
    assert scheduled.status_code == 200, scheduled.text
    read = scheduled.json()
    assert (read["saved_revision"], read["enforced_revision"]) == (2, 1) and read["scheduled"]["revision"] == 2
    assert read["members"] == [first["id"]]
    time.sleep(PROPAGATION_S)
    assert dt.datetime.now(dt.UTC) < at - dt.timedelta(seconds=1), "the machine was too slow for this check"
    assert _chat_statuses(gw, added, staged, 4) == {404}, "not before activate_at"
    until(lambda: _read(gw, pilot)["enforced_revision"] == 2, 15, "activation")
    assert dt.datetime.now(dt.UTC) >= at
    read = _read(gw, pilot)
    assert "scheduled" not in read and read["members"] == [first["id"], added["id"]]
    time.sleep(PROPAGATION_S)
    assert _chat_statuses(gw, added, staged) == {200}

    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    future = _create(gw, gw.admin_token, members=[], activate_at=later)
    assert future.status_code == 201, future.text
    assert future.json()["version"] == 0 and future.json()["enforced_revision"] is None
    assert future.json()["scheduled"]["revision"] == 1
    assert gw.admin("GET", f"/admin/pilots/{future.json()['id']}").status_code == 404, "not live before activate_at"
    deleting = gw.admin("DELETE", f"/admin/pilots/{pilot['id']}?activate_at={later.replace('+00:00', 'Z')}")
    assert deleting.status_code == 200 and deleting.json()["status"] == "scheduled", deleting.text
    assert gw.admin("DELETE", f"/admin/pilots/{pilot['id']}?activate_at=soon").status_code == 400
    assert _read(gw, pilot)["scheduled"]["revision"] == 3


def test_a_scheduled_pilot_revision_that_no_longer_validates_fails_and_the_last_good_one_stays(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A member scheduled into a pilot, then enrolled in another live pilot before activate_at:
    the activation fails (activation_error naming the other pilot, audited), the pilot keeps its
    enforced revision and members."""
    first, contested = _user(gw, None), _user(gw, None)
    pilot = _create(gw, gw.admin_token, members=[first["id"]]).json()
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)).isoformat()
    assert _put(gw, gw.admin_token, pilot, members=[first["id"], contested["id"]], activate_at=at).status_code == 200
    other = _create(gw, gw.admin_token, members=[contested["id"]])
    assert other.status_code == 201, other.text

    until(lambda: "activation_error" in _read(gw, pilot), 15, "the failure")
    read = _read(gw, pilot)
    assert read["enforced_revision"] == 1 and read["activation_error"]["revision"] == 2
    assert "already enrolled" in read["activation_error"]["error"] and other.json()["id"] in \
        read["activation_error"]["error"]
    assert read["members"] == [first["id"]] and "scheduled" not in read
    assert len(_audit_rows(gw, "control.activation_failed", pilot["id"])) == 1


def test_a_member_leaving_a_pilot_that_a_rule_names_waits_for_approval(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """Removing a member from a pilot without tiers tightens (200) while no rule names it; once a
    rule selects the pilot's members (population.pilots), a member leaving escapes that rule:
    relaxing (202), and the member stays until approved."""
    unit = _unit(gw)
    admin = _token(gw, [unit])
    a, b, c = _user(gw, unit), _user(gw, unit), _user(gw, unit)
    m = model(gw, testserve)
    pilot = _create(gw, gw.admin_token, members=[a["id"], b["id"], c["id"]], models=[m["name"]]).json()
    assert _put(gw, admin, pilot, members=[a["id"], b["id"]]).status_code == 200
    rule = {"id": f"plc-{time.time_ns()}", "mode": "enforce", "entries": [
        {"population": {"pilots": [pilot["id"]], "business_units": [unit]}, "scope": {"model": m["name"]},
         "window": "daily", "threshold_usd": "1", "actions": [{"type": "block"}]}]}
    assert gw.admin("POST", "/admin/rules", rule).status_code == 201
    leaving = _put(gw, admin, pilot, members=[a["id"]])
    assert leaving.status_code == 202, leaving.text
    assert _read(gw, pilot)["members"] == [a["id"], b["id"]]
    sooner = _put(gw, admin, pilot, expires_at=rfc3339(600))
    assert sooner.status_code == 202, "an earlier end takes every member out of the rule sooner"


def test_an_approval_checks_the_pilot_again(gw: Gateway, testserve: EmulatedProviders) -> None:
    """A pending member enrolled meanwhile in another live pilot: approving is 400 invalid_pilot
    naming it, the change stays pending and the pilot unchanged."""
    unit = _unit(gw)
    admin = _token(gw, [unit])
    first, contested = _user(gw, unit), _user(gw, unit)
    staged = model(gw, testserve, status="staged")
    pilot = _create(gw, gw.admin_token, members=[first["id"]], models=[staged["name"]]).json()
    pending = _put(gw, admin, pilot, members=[first["id"], contested["id"]])
    assert pending.status_code == 202, pending.text
    assert _create(gw, gw.admin_token, members=[contested["id"]], authoritative=False).status_code == 201
    answer = gw.admin("POST", f"/admin/changes/{pending.json()['change_id']}/approve")
    assert (answer.status_code, answer.json()["error"]) == (400, "invalid_pilot"), answer.text
    assert "already enrolled" in answer.text
    assert gw.admin("GET", f"/admin/changes/{pending.json()['change_id']}").json()["status"] == "pending"
    assert _read(gw, pilot)["members"] == [first["id"]]


def test_a_unit_admin_reads_and_writes_only_pilots_of_its_units_members(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """Another unit's pilot (or one with a member outside the units) is absent from the list and
    404 to read, 403 to change or delete; a pilot naming someone outside the units is 403; the
    model's graduation, status, roster and limited cap are the platform's (403)."""
    unit, elsewhere = _unit(gw), _unit(gw)
    admin = _token(gw, [unit])
    mine, theirs = _user(gw, unit), _user(gw, elsewhere)
    own = _create(gw, admin, members=[mine["id"]], authoritative=False)
    assert own.status_code == 201, own.text
    foreign = _create(gw, gw.admin_token, members=[theirs["id"]], authoritative=False).json()
    mixed = _create(gw, gw.admin_token, members=[_user(gw, unit)["id"], _user(gw, elsewhere)["id"]],
                    authoritative=False).json()
    listed = {p["id"] for p in _as(gw, admin, "GET", "/admin/pilots").json()}
    assert own.json()["id"] in listed and not {foreign["id"], mixed["id"]} & listed
    for pilot in (foreign, mixed):
        url = f"/admin/pilots/{pilot['id']}"
        assert _as(gw, admin, "GET", url).status_code == 404
        put = _as(gw, admin, "PUT", url, _body(pilot, members=[mine["id"]]), {"if-match": f'"{pilot["version"]}"'})
        assert (put.status_code, put.json()["error"]) == (403, "forbidden"), put.text
        assert _as(gw, admin, "DELETE", url).status_code == 403
    assert _as(gw, admin, "GET", f"/admin/pilots/{own.json()['id']}").status_code == 200
    deleting = _as(gw, admin, "DELETE", f"/admin/pilots/{own.json()['id']}")
    assert (deleting.status_code, deleting.json()["status"]) == (202, "pending"), "a deletion relaxes"
    outside = _create(gw, admin, members=[mine["id"], theirs["id"]], authoritative=False)
    assert (outside.status_code, outside.json()["error"]) == (403, "forbidden"), outside.text
    grown = _put(gw, admin, own.json(), members=[mine["id"], theirs["id"]])
    assert grown.status_code == 403, grown.text

    m = model(gw, testserve, status="limited", roster=[mine["id"]])
    assert _as(gw, admin, "POST", f"/admin/models/{m['id']}/graduate").status_code == 403
    etag = gw.admin("GET", f"/admin/models/{m['id']}").headers["etag"]
    for body in ({"status": "active"}, {"roster": [mine["id"], theirs["id"]]},
                 {"limited": {"amount_usd": "100", "window": "daily"}}):
        answer = _as(gw, admin, "PUT", f"/admin/models/{m['id']}", body, {"if-match": etag})
        assert answer.status_code == 403, (body, answer.text)
    assert gw.admin("GET", f"/admin/models/{m['id']}").json()["status"] == "limited"


def test_a_pilot_change_concerns_the_callers_unit_else_the_members_shared_one(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """The audit record of a platform administrator's pilot write names the unit its members
    share (none when they span units); local-midnight is midnight in that unit's zone."""
    unit = _unit(gw, "Pacific/Auckland")
    other = _unit(gw)
    a, b = _user(gw, unit), _user(gw, unit)
    shared = _create(gw, gw.admin_token, members=[a["id"], b["id"]], authoritative=False).json()
    assert [r["business_unit"] for r in _audit_rows(gw, "pilot.create", shared["id"])] == [unit]
    spread = _create(gw, gw.admin_token, members=[_user(gw, unit)["id"], _user(gw, other)["id"]],
                     authoritative=False).json()
    assert [r["business_unit"] for r in _audit_rows(gw, "pilot.create", spread["id"])] == [None]

    from meshfast.admin import changes

    scheduled = _put(gw, gw.admin_token, shared, members=[a["id"]], activate_at="local-midnight")
    assert scheduled.status_code == 200, scheduled.text
    expected = changes.resolve_activate_at("local-midnight", "Pacific/Auckland", dt.datetime.now(dt.UTC))
    assert scheduled.json()["scheduled"]["activate_at"] == changes._moment(expected)
    assert _sql(gw, "SELECT count(*) AS n FROM admin_audit_log WHERE action = 'pilot.update' AND target = $1 "
                    "AND business_unit = $2", shared["id"], unit)[0]["n"] == 1


# --- registry files ------------------------------------------------------------------------------


def test_a_registry_file_sets_pilots_by_name_and_a_models_onboarding(
        gw: Gateway, testserve: EmulatedProviders, tmp_path: Path) -> None:
    """`meshfast apply` with pilots (people by email) and a model's status, roster and limited cap:
    created, then unchanged on a second apply, then set to exactly the file (an enforced revision
    each); an invalid file lists every problem, first its own, then the database's, and writes nothing."""
    tag = str(time.time_ns())
    a, b = _user(gw, None), _user(gw, None)
    provider = gw.create_provider(f"plc-p-{tag}", base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
    name = f"plc-file-{tag}"
    registry: Json = {
        "models": [{"name": name, "provider": provider["name"], "resolved_model": "dummy-chat",
                    "input_price_per_1k_tokens": "0", "output_price_per_1k_tokens": "1", "status": "limited",
                    "roster": [a["email"].upper()], "limited": {"amount_usd": "1", "window": "daily"}}],
        "pilots": [{"name": f"file-pilot-{tag}", "members": [a["email"], b["email"]], "models": [name],
                    "authoritative": True, "mode": "enforce", "expires_at": rfc3339(3600),
                    "tiers": [{"name": "base", "amount_usd": "5", "window": "monthly", "exceptions": [b["email"]]}]}],
    }
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(registry))
    done = _apply(gw, path, "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(done.stdout)["created"]) == sorted([f"model {name}", f"pilot file-pilot-{tag}"])
    pilot = next(p for p in gw.admin("GET", "/admin/pilots").json() if p["name"] == f"file-pilot-{tag}")
    assert pilot["members"] == [a["id"], b["id"]] and pilot["tiers"][0]["exceptions"] == [b["id"]]
    assert (pilot["saved_revision"], pilot["enforced_revision"]) == (1, 1)
    stored = next(m for m in gw.admin("GET", "/admin/models").json() if m["name"] == name)
    assert (stored["status"], stored["roster"], stored["limited"]["amount_usd"]) == ("limited", [a["id"]], "1")

    again = json.loads(_apply(gw, path, "--json").stdout)
    assert (again["created"], again["updated"]) == ([], []), again

    registry["pilots"][0].update(members=[a["email"]], mode="shadow", tiers=[])
    registry["models"][0]["roster"] = [a["email"], b["email"]]
    path.write_text(json.dumps(registry))
    edited = json.loads(_apply(gw, path, "--json").stdout)
    assert sorted(edited["updated"]) == sorted([f"model {name}", f"pilot file-pilot-{tag}"]), edited
    pilot = _read(gw, pilot)
    assert (pilot["members"], pilot["mode"], pilot["tiers"]) == ([a["id"]], "shadow", [])
    assert (pilot["saved_revision"], pilot["enforced_revision"]) == (2, 2)
    assert next(m for m in gw.admin("GET", "/admin/models").json() if m["name"] == name)["roster"] == \
        [a["id"], b["id"]]

    bad = json.loads(json.dumps(registry))
    bad["pilots"].append({**bad["pilots"][0], "members": ["not-an-email"]})
    bad["models"][0]["status"] = "blocked"
    path.write_text(json.dumps(bad))
    refused = _apply(gw, path)
    assert refused.returncode == 1, refused.stderr
    for needle in ("listed twice", "not-an-email", "status: must be one of"):
        assert needle in refused.stderr, (needle, refused.stderr)

    other = _create(gw, gw.admin_token, members=[b["id"]], authoritative=False)
    assert other.status_code == 201, other.text
    bad = json.loads(json.dumps(registry))
    bad["pilots"][0].update(members=[a["email"], b["email"], "nobody-" + tag + "@example.com"],
                            models=[name, "no-such-model-" + tag])
    bad["models"][0]["roster"] = ["ghost-" + tag + "@example.com"]
    path.write_text(json.dumps(bad))
    refused = _apply(gw, path)
    assert refused.returncode == 1, refused.stderr
    for needle in ("nobody-", "no-such-model-", "already enrolled", "ghost-"):
        assert needle in refused.stderr, (needle, refused.stderr)
    assert _read(gw, pilot)["members"] == [a["id"]], "nothing of a refused file is written"
