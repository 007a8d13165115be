"""Model onboarding end to end (API.md "Governed lifecycle"): staged and limited models through a
two-worker `meshfast serve` to testserve, graduation, a model in use that cannot be deleted, and a
newly tagged model under an existing tag rule.

Prices as tests/test_rules.py: input free, $1 per 1k output, `max_tokens: 3` for a prompt testserve
answers in three tokens, so every call costs and reserves exactly $0.003."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway, running_gateway, until
from conftest import tag as _tag

Json = dict[str, Any]
CALL_USD = Decimal("0.003")
PROMPT = "hello"
MAX_TOKENS = 3
PROPAGATION_S = 3.0


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_gateway(2, env=SESSION_ENV) as gateway:
        yield gateway


# --- helpers (tests/test_pilots.py uses them too) ------------------------------------------------


def user(gw: Gateway, **extra: Any) -> Json:
    email = f"onb-{_tag()}@example.com"
    response = gw.admin("POST", "/admin/users", {"email": email, "display_name": email.split("@")[0], **extra})
    assert response.status_code == 201, response.text
    return response.json()


def model(gw: Gateway, testserve: EmulatedProviders, **extra: Any) -> Json:
    """A chat model on testserve whose calls cost exactly CALL_USD."""
    provider = gw.create_provider(f"onb-p-{_tag()}", base_url=f"{testserve.base_url}/openai",
                                  api_key="testserve-key")
    return gw.create_model(provider["id"], f"onb-m-{_tag()}", resolved_model="dummy-chat",
                           input_price_per_1k_tokens="0", output_price_per_1k_tokens="1", **extra)


def auth(person: Json) -> dict[str, str]:
    return {"authorization": f"Bearer {person['key']}"}


def proxy(gw: Gateway, person: Json, m: Json) -> httpx.Response:
    return gw.client.post("/v1/proxy", params={"model": m["name"]}, headers=auth(person),
                          json={"query": PROMPT, "max_tokens": MAX_TOKENS})


def chat(gw: Gateway, person: Json, m: Json | str) -> httpx.Response:
    name = m if isinstance(m, str) else m["name"]
    return gw.client.post("/v1/chat/completions", headers=auth(person), json={
        "model": name, "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": PROMPT}]})


def settles(gw: Gateway, call: Any, status: int, what: str) -> httpx.Response:
    """The answer once ``call()`` answers ``status`` twice in a row (both workers have the change),
    within PROPAGATION_S."""
    def probe() -> httpx.Response | None:
        first = call()
        if first.status_code != status:
            return None
        second = call()
        return second if second.status_code == status else None

    answer: httpx.Response = until(probe, PROPAGATION_S, what)
    return answer


def deny_reason(gw: Gateway, response: httpx.Response) -> str | None:
    reason: str | None = gw.fetch_row(response.headers["x-request-id"])["deny_reason"]
    return reason


def put_model(gw: Gateway, m: Json, body: Json) -> httpx.Response:
    current = gw.admin("GET", f"/admin/models/{m['id']}")
    assert current.status_code == 200, current.text
    return gw.client.put(f"/admin/models/{m['id']}", json=body, headers={
        "authorization": f"Bearer {gw.admin_token}", "if-match": current.headers["etag"]})


def rfc3339(seconds_from_now: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds_from_now)).isoformat()


def audit_actions(gw: Gateway, action: str) -> list[Json]:
    response = gw.admin("GET", f"/admin/audit?action={action}&page_size=200")
    assert response.status_code == 200, response.text
    entries: list[Json] = response.json()["entries"]
    return entries


# --- staged ----------------------------------------------------------------------------------------


def test_a_staged_model_answers_every_caller_like_an_unknown_model(gw: Gateway, testserve: EmulatedProviders) -> None:
    """Staged: 404 model_not_found on the standard routes, the Mesh route's unknown-model answer
    (403 model_not_permitted, the same body as a name nobody has), the row's reason model_staged."""
    person = user(gw)
    m = model(gw, testserve, status="staged")
    assert m["status"] == "staged"
    gw.grant(person["id"], m["id"])
    refused = settles(gw, lambda: chat(gw, person, m), 404, "the staged model refused")
    assert refused.json()["error"]["code"] == "model_not_found"
    unknown = chat(gw, person, f"no-such-{_tag()}")
    assert (unknown.status_code, unknown.json()) == (404, refused.json())
    assert deny_reason(gw, refused) == "model_staged"

    mesh = proxy(gw, person, m)
    nobody = gw.client.post("/v1/proxy", params={"model": f"no-such-{_tag()}"}, headers=auth(person),
                            json={"query": PROMPT, "max_tokens": MAX_TOKENS})
    assert (mesh.status_code, mesh.json()) == (nobody.status_code, nobody.json()) == (
        403, {"error": "model_not_permitted"})
    assert deny_reason(gw, mesh) == "model_staged"
    listed = gw.client.get("/v1/models", headers=auth(person)).json()
    assert m["name"] not in [d["id"] for d in listed["data"]]

    # Someone without a grant is refused alike; the row still says staged.
    stranger = user(gw)
    assert deny_reason(gw, chat(gw, stranger, m)) == "model_staged"


# --- limited ---------------------------------------------------------------------------------------


def test_a_limited_model_serves_its_roster_under_its_own_cap_until_it_expires(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """Limited: a roster member is served (without a grant: the default terms), anyone else gets
    the unknown-model 404 (row: model_limited); the roster's spend stops at the limited amount
    (429 budget_exceeded naming limited:<name>); at expires_at the roster's access ends (staged)."""
    member, outsider = user(gw), user(gw)
    m = model(gw, testserve)
    gw.grant(outsider["id"], m["id"])
    expires = rfc3339(8)
    response = put_model(gw, m, {"status": "limited", "roster": [member["id"]],
                                 "limited": {"window": "daily", "amount_usd": str(3 * CALL_USD),
                                             "expires_at": expires}})
    assert response.status_code == 200, response.text
    shown = response.json()
    assert shown["status"] == "limited" and shown["roster"] == [member["id"]]
    assert shown["limited"]["window"] == "daily" and Decimal(shown["limited"]["amount_usd"]) == 3 * CALL_USD

    refused = settles(gw, lambda: chat(gw, outsider, m), 404, "the outsider refused")
    assert refused.json()["error"]["code"] == "model_not_found"
    assert deny_reason(gw, refused) == "model_limited"
    settles(gw, lambda: gw.client.get("/v1/models", headers=auth(member)), 200, "listing")
    until(lambda: proxy(gw, member, m).status_code == 200, PROPAGATION_S, "the member served")
    # One served call already; two more fit under three calls' worth, the next does not.
    for _ in range(2):
        assert proxy(gw, member, m).status_code == 200
    blocked = proxy(gw, member, m)
    assert blocked.status_code == 429, blocked.text
    assert blocked.json()["error"] == "budget_exceeded"
    assert blocked.json()["rule"] == f"limited:{m['name']}"
    assert chat(gw, member, m).headers.get("x-should-retry") == "false"

    # The expiry: republished by every worker at that moment, with no write.
    wait = (dt.datetime.fromisoformat(expires) - dt.datetime.now(dt.UTC)).total_seconds()
    time.sleep(max(0.0, wait))
    ended = settles(gw, lambda: chat(gw, member, m), 404, "the roster's access ended")
    assert deny_reason(gw, ended) == "model_staged"


def test_limited_access_is_validated_as_a_whole(gw: Gateway, testserve: EmulatedProviders) -> None:
    """Unknown roster users, a roster on a model that is not limited, a zero amount, an expiry
    without a timezone: 400."""
    m = model(gw, testserve)
    ghost = "00000000-0000-4000-8000-000000000001"
    response = put_model(gw, m, {"status": "limited", "roster": [ghost]})
    assert response.status_code == 400 and ghost in response.text, response.text
    response = put_model(gw, m, {"roster": [user(gw)["id"]]})
    assert response.status_code == 400 and "limited" in response.text, response.text
    response = put_model(gw, m, {"status": "limited", "limited": {"window": "daily", "amount_usd": "0"}})
    assert response.status_code == 400, response.text
    response = put_model(gw, m, {"status": "limited", "limited": {"expires_at": "2030-01-01T00:00:00"}})
    assert response.status_code == 400, response.text


def test_graduation_serves_everyone_granted_and_clears_the_roster(gw: Gateway, testserve: EmulatedProviders) -> None:
    """POST /admin/models/{id}/graduate: active, roster and cap cleared, audited model.graduate."""
    member, granted = user(gw), user(gw)
    m = model(gw, testserve, status="limited", roster=[member["id"]],
              limited={"window": "monthly", "amount_usd": "1"})
    gw.grant(granted["id"], m["id"])
    settles(gw, lambda: chat(gw, granted, m), 404, "the granted non-member refused")
    graduated = gw.admin("POST", f"/admin/models/{m['id']}/graduate")
    assert graduated.status_code == 200, graduated.text
    assert graduated.headers["etag"]
    body = graduated.json()
    assert (body["status"], body["roster"], body["limited"]) == ("active", [], None)
    settles(gw, lambda: chat(gw, granted, m), 200, "everyone granted served")
    assert any(e["target"] == m["id"] for e in audit_actions(gw, "model.graduate"))


# --- a model in use --------------------------------------------------------------------------------


def test_a_model_referenced_by_a_live_control_cannot_be_deleted(gw: Gateway, testserve: EmulatedProviders) -> None:
    """409 model_in_use naming the rule that scopes it and the live pilot that lists it; once
    both are gone the delete goes through."""
    m = model(gw, testserve)
    rule_id = f"in-use-{_tag()}"
    created = gw.admin("POST", "/admin/rules", {"id": rule_id, "mode": "enforce", "entries": [
        {"scope": {"model": m["name"]}, "window": "daily", "threshold_usd": "5", "actions": [{"type": "block"}]}]})
    assert created.status_code == 201, created.text
    pilot = gw.admin("POST", "/admin/pilots", {"name": "in use", "members": [], "models": [m["name"]],
                                               "mode": "enforce", "expires_at": rfc3339(3600)})
    assert pilot.status_code == 201, pilot.text
    refused = gw.admin("DELETE", f"/admin/models/{m['id']}")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "model_in_use"
    assert refused.json()["controls"] == [{"kind": "rule", "id": rule_id}, {"kind": "pilot", "id": pilot.json()["id"]}]
    assert gw.admin("DELETE", f"/admin/rules/{rule_id}").status_code == 200
    assert gw.admin("DELETE", f"/admin/pilots/{pilot.json()['id']}").status_code == 200
    deleted = gw.admin("DELETE", f"/admin/models/{m['id']}")
    assert deleted.status_code == 200, deleted.text


# --- tags ------------------------------------------------------------------------------------------


def test_a_newly_tagged_model_is_covered_by_an_existing_tag_rule_at_once(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A block over a tag, written before the model carries it: tagging the model puts it (and the
    spend already on it) under the rule with no rule edit."""
    person = user(gw)
    m = model(gw, testserve)
    gw.grant(person["id"], m["id"])
    label = f"fresh-{_tag()}"
    rule_id = f"tagged-{_tag()}"
    created = gw.admin("POST", "/admin/rules", {"id": rule_id, "mode": "enforce", "entries": [
        {"scope": {"tag": label}, "window": "monthly", "threshold_usd": str(2 * CALL_USD),
         "actions": [{"type": "block"}]}]})
    assert created.status_code == 201, created.text
    settles(gw, lambda: proxy(gw, person, m), 200, "served while untagged")
    assert proxy(gw, person, m).status_code == 200
    # Two calls spent: the tag brings the model under the rule, retroactively within the window.
    current = gw.admin("GET", f"/admin/models/{m['id']}").json()
    body = {k: current[k] for k in ("provider_id", "name", "resolved_model", "kind", "input_price_per_1k_tokens",
                                    "output_price_per_1k_tokens")}
    response = put_model(gw, m, {**body, "tags": [label]})
    assert response.status_code == 200, response.text
    blocked = settles(gw, lambda: proxy(gw, person, m), 429, "the tag rule covers the model")
    assert blocked.json()["rule"] == rule_id
