"""Organisation data and the Mesh parity gaps (issue 14, items 1 and 9): a user's manager, business
unit, tier and expiry through `PUT /admin/users/{id}` (ETag, loops refused, also under concurrent
writes), in the registry file and in the workers' snapshot; blocking and retiring a model; a
user's expiry; the summary's Mesh field names. Real `meshfast serve` workers, real PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import test_dashboard
from conftest import Gateway, WorkerConnections

from meshfast import snapshot
from meshfast._core import Core
from meshfast.secrets import load_or_create

PROPAGATION_S = 1.0

# The dashboard's browser fixtures (chromium through Playwright; skipped when it is not installed).
browser, admin, tab = test_dashboard.browser, test_dashboard.admin, test_dashboard.tab


def _tag() -> str:
    return secrets.token_hex(4)


def _user(gateway: Gateway, **extra: Any) -> dict[str, Any]:
    email = f"org-{_tag()}@example.com"
    response = gateway.admin("POST", "/admin/users", {"email": email, "display_name": email.split("@")[0], **extra})
    assert response.status_code == 201, response.text
    return response.json()


def _get(gateway: Gateway, user_id: str) -> tuple[dict[str, Any], str]:
    response = gateway.admin("GET", f"/admin/users/{user_id}")
    assert response.status_code == 200, response.text
    return response.json(), response.headers["etag"]


def _put(gateway: Gateway, user_id: str, body: dict[str, Any], etag: str | None = None,
         client: httpx.Client | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {gateway.admin_token}"}
    if etag is None:
        etag = _get(gateway, user_id)[1]
    if etag:
        headers["if-match"] = etag
    return (client or gateway.client).put(f"/admin/users/{user_id}", json=body, headers=headers)


def _set_manager(gateway: Gateway, user_id: str, manager_id: str | None) -> httpx.Response:
    return _put(gateway, user_id, {"manager_id": manager_id})


def _until_every_worker(workers: WorkerConnections, path: str, headers: dict[str, str],
                        check: Callable[[int, bytes], bool], timeout_s: float = PROPAGATION_S) -> float:
    """Seconds until ``check(status, body)`` holds on every worker; fails after ``timeout_s``."""
    start = time.monotonic()
    while True:
        answers = workers.get_all(path, headers)
        if all(check(status, body) for status, body in answers.values()):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not on every worker within {timeout_s} s: {answers}")
        time.sleep(0.02)


def _rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


# --- users: GET and PUT with ETag -----------------------------------------------------------------


def test_a_user_answers_with_its_organisation_and_an_etag_and_put_needs_if_match(gateway: Gateway) -> None:
    """GET carries the organisation fields and an ETag; PUT without If-Match is 428, with a stale
    one 409, with the current one 200 and a new ETag; a left-out field is kept, null clears."""
    boss = _user(gateway)
    user = _user(gateway, manager_email=boss["email"].upper(), business_unit=" payments ", tier="normal")
    got, etag = _get(gateway, user["id"])
    assert {k: got[k] for k in ("id", "email", "manager_id", "manager_email", "business_unit", "tier",
                                "expires_at", "status", "key_prefix")} == {
        "id": user["id"], "email": user["email"], "manager_id": boss["id"], "manager_email": boss["email"],
        "business_unit": "payments", "tier": "normal", "expires_at": None, "status": "active",
        "key_prefix": user["key_prefix"]}
    assert etag == f'"{got["version"]}"'

    missing = _put(gateway, user["id"], {"tier": "gold"}, etag="")
    assert (missing.status_code, missing.json()["error"]) == (428, "if_match_required")
    changed = _put(gateway, user["id"], {"tier": "gold", "display_name": "Renamed"}, etag=etag)
    assert changed.status_code == 200, changed.text
    assert changed.headers["etag"] != etag
    body = changed.json()
    assert (body["tier"], body["display_name"], body["business_unit"], body["manager_id"]) == (
        "gold", "Renamed", "payments", boss["id"]), "fields left out are kept"
    stale = _put(gateway, user["id"], {"tier": "silver"}, etag=etag)
    assert (stale.status_code, stale.json()["error"]) == (409, "version_conflict")

    expires = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    cleared = _put(gateway, user["id"], {"business_unit": None, "manager_id": None, "expires_at": expires.isoformat()},
                   etag=changed.headers["etag"])
    assert cleared.status_code == 200, cleared.text
    assert (cleared.json()["business_unit"], cleared.json()["manager_id"], cleared.json()["expires_at"]) == (
        None, None, "2031-05-06T05:08:09Z")
    by_email = _put(gateway, user["id"], {"manager_email": boss["email"]})
    assert by_email.status_code == 200 and by_email.json()["manager_id"] == boss["id"]
    listed = next(u for u in gateway.admin("GET", "/admin/users").json() if u["id"] == user["id"])
    assert (listed["manager_email"], listed["tier"], listed["expires_at"]) == (boss["email"], "gold",
                                                                               "2031-05-06T05:08:09Z")
    audit = gateway.admin("GET", "/admin/audit?action=update_user").json()["entries"]
    assert any(e["target"] == user["id"] and "manager_id" in e["detail"]["fields"] for e in audit)


@pytest.mark.parametrize(("body", "problem"), [
    ({"expires_at": "2031-01-01T00:00:00"}, "timezone"),
    ({"expires_at": "3001-01-01T00:00:00Z"}, "between"),
    ({"expires_at": "tomorrow"}, "expires_at"),
    ({"tier": "x" * 201}, "tier"),
    ({"business_unit": "a\u0000b"}, "NUL"),
    ({"business_unit": "  "}, "empty"),
    ({"display_name": None}, "display_name"),
    ({"manager_id": "not-a-uuid"}, "manager_id"),
    ({"manager_id": "00000000-0000-4000-8000-000000000000"}, "names no user"),
    ({"manager_email": "nobody-here@example.com"}, "names no user"),
    ({"manager_email": None, "manager_id": None}, "not both"),
    ({"key": "x"}, "unknown field"),
])
def test_organisation_fields_are_validated_at_the_edge(gateway: Gateway, body: dict[str, Any], problem: str) -> None:
    """Timestamps are RFC 3339 with an offset and in range, labels are bounded text PostgreSQL
    can store, a manager must exist; every refusal is a 400 naming the problem."""
    user = _user(gateway)
    response = _put(gateway, user["id"], body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request"
    assert problem in response.text, response.text


def test_an_unknown_user_is_404_and_creating_with_an_unknown_manager_is_400(gateway: Gateway) -> None:
    """PUT and GET of a user that does not exist answer 404; a create naming no user as manager is a 400."""
    missing = "00000000-0000-4000-8000-000000000001"
    assert gateway.admin("GET", f"/admin/users/{missing}").status_code == 404
    assert _put(gateway, missing, {"tier": "x"}, etag='"1"').status_code == 404
    response = gateway.admin("POST", "/admin/users", {"email": f"org-{_tag()}@example.com", "display_name": "x",
                                                      "manager_email": "ghost@example.com"})
    assert response.status_code == 400 and "names no user" in response.text


# --- manager loops --------------------------------------------------------------------------------


def test_manager_loops_are_refused_directly_and_through_longer_chains(gateway: Gateway) -> None:
    """Managing oneself, a pair managing each other and a longer chain closing on itself are 409
    manager_cycle, and nothing of the refused write is kept."""
    a, b, c, d = (_user(gateway) for _ in range(4))
    refused = _set_manager(gateway, a["id"], a["id"])
    assert (refused.status_code, refused.json()["error"]) == (409, "manager_cycle")
    assert _set_manager(gateway, b["id"], a["id"]).status_code == 200  # a <- b
    refused = _set_manager(gateway, a["id"], b["id"])
    assert (refused.status_code, refused.json()["error"]) == (409, "manager_cycle")
    assert _set_manager(gateway, c["id"], b["id"]).status_code == 200  # a <- b <- c
    assert _set_manager(gateway, d["id"], c["id"]).status_code == 200  # a <- b <- c <- d
    for email_or_id in ({"manager_id": d["id"]}, {"manager_email": c["email"]}):
        refused = _put(gateway, a["id"], email_or_id)
        assert (refused.status_code, refused.json()["error"]) == (409, "manager_cycle"), email_or_id
    assert _get(gateway, a["id"])[0]["manager_id"] is None
    # Moving a sub-tree elsewhere is fine: d leaves c's line for a directly.
    assert _set_manager(gateway, d["id"], a["id"]).status_code == 200


def test_two_concurrent_writes_cannot_close_a_loop_together(gateway: Gateway) -> None:
    """Each round sends "a reports to b" and "b reports to a" at the same moment, each against a
    fresh ETag: one of them commits and the other is 409 manager_cycle, never both."""
    rounds = 12
    with ThreadPoolExecutor(max_workers=2) as pool, httpx.Client(base_url=gateway.base_url, timeout=10) as one, \
            httpx.Client(base_url=gateway.base_url, timeout=10) as two:
        for _ in range(rounds):
            a, b = _user(gateway), _user(gateway)
            etag_a, etag_b = _get(gateway, a["id"])[1], _get(gateway, b["id"])[1]
            first = pool.submit(_put, gateway, a["id"], {"manager_id": b["id"]}, etag_a, one)
            second = pool.submit(_put, gateway, b["id"], {"manager_id": a["id"]}, etag_b, two)
            statuses = sorted([first.result().status_code, second.result().status_code])
            assert statuses == [200, 409], statuses
            chain = {a["id"]: _get(gateway, a["id"])[0]["manager_id"], b["id"]: _get(gateway, b["id"])[0]["manager_id"]}
            assert list(chain.values()).count(None) == 1, chain


# --- the workers' snapshot ------------------------------------------------------------------------


async def _config(gateway: Gateway) -> snapshot.Config:
    master_key = load_or_create(gateway.data_dir / "secrets.json").master_key
    conn = await asyncpg.connect(gateway.database_url)
    try:
        return await snapshot.load_config(conn, master_key)
    finally:
        await conn.close()


def test_the_snapshot_carries_each_principals_manager_business_unit_and_tier(gateway: Gateway) -> None:
    """The config the workers build from names each principal's manager by index, with business
    unit and tier; the core accepts it, and a manager change is in the next build."""
    boss = _user(gateway, business_unit="platform", tier="leader")
    user = _user(gateway, manager_email=boss["email"], business_unit="payments", tier="normal")
    config = asyncio.run(_config(gateway))
    index = {p.id: i for i, p in enumerate(config.principals)}
    mine = config.principals[index[user["id"]]]
    assert (mine.manager, mine.business_unit, mine.tier) == (index[boss["id"]], "payments", "normal")
    assert config.principals[index[boss["id"]]].manager is None
    Core(b"pepper").load(snapshot.encode(config))
    assert _set_manager(gateway, user["id"], None).status_code == 200
    config = asyncio.run(_config(gateway))
    assert next(p for p in config.principals if p.id == user["id"]).manager is None


# --- expiry and model status on every worker ------------------------------------------------------


def _models_visible(status: int, body: bytes, name: str) -> bool:
    return status == 200 and name in {m["id"] for m in json.loads(body)["data"]}


def test_a_users_expiry_refuses_their_key_on_every_worker_within_a_second(gateway: Gateway) -> None:
    """A past expires_at makes the user's key 401 on every worker within 1 s; clearing it lets the
    key in again; a future one lets it in until that moment."""
    provider = gateway.create_provider(f"org-exp-{_tag()}")
    model = gateway.create_model(provider["id"], f"org-exp-{_tag()}")
    user = _user(gateway)
    gateway.grant(user["id"], model["id"])
    auth = {"Authorization": f"Bearer {user['key']}"}
    workers = WorkerConnections(gateway)
    try:
        _until_every_worker(workers, "/v1/models", auth, lambda s, b: _models_visible(s, b, model["name"]))
        past = _rfc3339(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
        assert _put(gateway, user["id"], {"expires_at": past}).status_code == 200
        _until_every_worker(workers, "/v1/models", auth, lambda s, b: s == 401)
        denied = gateway.client.post("/v1/chat/completions", headers=auth,
                                     json={"model": model["name"], "messages": [{"role": "user", "content": "x"}]})
        assert denied.status_code == 401
        assert gateway.fetch_row(denied.headers["x-request-id"])["deny_reason"] == "invalid_or_revoked_key"

        assert _put(gateway, user["id"], {"expires_at": None}).status_code == 200
        _until_every_worker(workers, "/v1/models", auth, lambda s, b: s == 200)

        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2.5)
        assert _put(gateway, user["id"], {"expires_at": _rfc3339(soon)}).status_code == 200
        assert all(s == 200 for s, _ in workers.get_all("/v1/models", auth).values())
        time.sleep(max(0.0, (soon - dt.datetime.now(dt.UTC)).total_seconds()) + 0.1)
        assert all(s == 401 for s, _ in workers.get_all("/v1/models", auth).values())
    finally:
        workers.close()


def test_the_expiry_routes_set_a_users_and_its_keys_expiry_on_every_worker_within_a_second(
        gateway: Gateway) -> None:
    """Mesh's PUT /admin/users/{id}/expiry, and PUT /admin/users/{id}/key/expiry for the active key
    alone: a past moment is 401 on every worker within 1 s (audited); null lets the key in again; a
    rotated key starts without the old key's expiry; bad bodies are 400."""
    provider = gateway.create_provider(f"org-kexp-{_tag()}")
    model = gateway.create_model(provider["id"], f"org-kexp-{_tag()}")
    user = _user(gateway)
    gateway.grant(user["id"], model["id"])
    auth = {"Authorization": f"Bearer {user['key']}"}
    past = _rfc3339(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
    workers = WorkerConnections(gateway)
    try:
        _until_every_worker(workers, "/v1/models", auth, lambda s, b: _models_visible(s, b, model["name"]))
        for path in ("expiry", "key/expiry"):
            put = gateway.admin("PUT", f"/admin/users/{user['id']}/{path}", {"expires_at": past})
            assert put.status_code == 200 and put.json()["status"] == "ok", put.text
            _until_every_worker(workers, "/v1/models", auth, lambda s, b: s == 401)
            assert gateway.admin("PUT", f"/admin/users/{user['id']}/{path}", {"expires_at": None}).status_code == 200
            _until_every_worker(workers, "/v1/models", auth, lambda s, b: s == 200)
        shown, _ = _get(gateway, user["id"])
        assert shown["expires_at"] is None and shown["key_expires_at"] is None
        assert gateway.admin("PUT", f"/admin/users/{user['id']}/key/expiry", {"expires_at": past}).status_code == 200
        _until_every_worker(workers, "/v1/models", auth, lambda s, b: s == 401)
        rotated = gateway.admin("POST", f"/admin/users/{user['id']}/rotate-key").json()
        fresh = {"Authorization": f"Bearer {rotated['key']}"}
        _until_every_worker(workers, "/v1/models", fresh, lambda s, b: s == 200)
    finally:
        workers.close()
    actions = [e["action"] for e in gateway.admin("GET", "/admin/audit?page_size=200").json()["entries"]
               if e["target"] == user["id"]]
    assert actions.count("update_user_expiry") == 2 and actions.count("update_key_expiry") == 3, actions
    for body in ({}, {"expires_at": "2026-01-01T00:00:00"}, {"expires_at": 5}, {"expires_at": None, "x": 1}):
        refused = gateway.admin("PUT", f"/admin/users/{user['id']}/key/expiry", body)
        assert refused.status_code == 400, (body, refused.text)
    assert gateway.admin("PUT", f"/admin/users/{'0' * 8}-0000-4000-8000-{'0' * 12}/expiry",
                         {"expires_at": None}).status_code == 404


def _model_status(gateway: Gateway, model_id: str, status: str) -> httpx.Response:
    etag = gateway.admin("GET", f"/admin/models/{model_id}").headers["etag"]
    return gateway.client.put(f"/admin/models/{model_id}", json={"status": status},
                              headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": etag})


@pytest.mark.parametrize("status", ["blocked", "retired"])
def test_a_blocked_or_retired_model_answers_as_unknown_on_every_worker_and_its_rows_say_why(
        gateway: Gateway, status: str) -> None:
    """Within 1 s every worker leaves the model out of /v1/models; the standard routes answer the
    unknown model's 404 model_not_found and the Mesh routes 403 model_blocked, and both rows are
    denied with deny_reason model_blocked; reactivating brings the model back."""
    provider = gateway.create_provider(f"org-blk-{_tag()}")
    model = gateway.create_model(provider["id"], f"org-blk-{_tag()}")
    user = _user(gateway)
    gateway.grant(user["id"], model["id"])
    auth = {"Authorization": f"Bearer {user['key']}"}
    workers = WorkerConnections(gateway)
    try:
        _until_every_worker(workers, "/v1/models", auth, lambda s, b: _models_visible(s, b, model["name"]))
        missing = _model_status(gateway, model["id"], status)
        missing_etag = gateway.client.put(f"/admin/models/{model['id']}", json={"status": "active"},
                                          headers={"authorization": f"Bearer {gateway.admin_token}"})
        assert missing_etag.status_code == 428
        assert missing.status_code == 200, missing.text
        assert (missing.json()["status"], missing.json()["name"]) == (status, model["name"])
        took = _until_every_worker(workers, "/v1/models", auth,
                                   lambda s, b: s == 200 and not _models_visible(s, b, model["name"]))
        assert took <= PROPAGATION_S

        chat = gateway.client.post("/v1/chat/completions", headers=auth,
                                   json={"model": model["name"], "messages": [{"role": "user", "content": "x"}]})
        unknown = gateway.client.post("/v1/chat/completions", headers=auth,
                                      json={"model": f"nope-{_tag()}", "messages": [{"role": "user", "content": "x"}]})
        assert chat.status_code == unknown.status_code == 404
        assert chat.json()["error"]["code"] == unknown.json()["error"]["code"] == "model_not_found"
        messages = gateway.client.post("/v1/messages", headers=auth, json={
            "model": model["name"], "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
        assert messages.status_code == 404 and messages.json()["error"]["category"] == "not_found_error"
        proxy = gateway.client.post(f"/v1/proxy?model={model['name']}", headers=auth, json={"query": "x"})
        assert (proxy.status_code, proxy.json()) == (403, {"error": "model_blocked"})
        for response in (chat, messages, proxy):
            row = gateway.fetch_row(response.headers["x-request-id"])
            assert (row["outcome"], row["deny_reason"], row["status_code"]) == (
                "denied", "model_blocked", response.status_code)

        back = _model_status(gateway, model["id"], "active")
        assert back.status_code == 200 and back.json()["status"] == "active"
        _until_every_worker(workers, "/v1/models", auth, lambda s, b: _models_visible(s, b, model["name"]))
    finally:
        workers.close()


def test_a_model_put_keeps_or_sets_the_status_and_refuses_an_unknown_one(gateway: Gateway) -> None:
    """A full model PUT keeps the status it does not name and sets the one it names; an unknown
    status is a 400; the audit log records the change."""
    provider = gateway.create_provider(f"org-st-{_tag()}")
    model = gateway.create_model(provider["id"], f"org-st-{_tag()}")
    assert _model_status(gateway, model["id"], "paused").status_code == 400
    assert _model_status(gateway, model["id"], "blocked").status_code == 200
    current = gateway.admin("GET", f"/admin/models/{model['id']}")
    body = {k: current.json()[k] for k in ("provider_id", "name", "resolved_model", "kind")}
    headers = {"authorization": f"Bearer {gateway.admin_token}", "if-match": current.headers["etag"]}
    kept = gateway.client.put(f"/admin/models/{model['id']}", json={**body, "output_price_per_1k_tokens": "0.5"},
                              headers=headers)
    assert kept.status_code == 200, kept.text
    assert (kept.json()["status"], kept.json()["output_price_per_1k_tokens"]) == ("blocked", 0.5)
    headers["if-match"] = kept.headers["etag"]
    retired = gateway.client.put(f"/admin/models/{model['id']}", json={**body, "status": "retired"}, headers=headers)
    assert retired.status_code == 200 and retired.json()["status"] == "retired"
    audit = gateway.admin("GET", "/admin/audit?action=update_model").json()["entries"]
    assert any(e["detail"].get("status") == "retired" and e["target"] == model["name"] for e in audit)


# --- the summary's Mesh names ---------------------------------------------------------------------


def test_the_summary_answers_with_mesh_field_names_and_keeps_its_own(gateway: Gateway) -> None:
    """/admin/logs/summary has mesh-behaviour §3.5's totals, time_series, by_deny_reason
    [{reason, calls}] and latency buckets with labels, beside the names the dashboard reads."""
    provider = gateway.create_provider(f"org-sum-{_tag()}")
    model = gateway.create_model(provider["id"], f"org-sum-{_tag()}")
    user = _user(gateway)
    gateway.grant(user["id"], model["id"])
    assert _model_status(gateway, model["id"], "blocked").status_code == 200
    auth = {"Authorization": f"Bearer {user['key']}"}
    time.sleep(PROPAGATION_S)
    denied = gateway.client.post(f"/v1/proxy?model={model['name']}", headers=auth, json={"query": "x"})
    assert denied.status_code == 403
    gateway.fetch_row(denied.headers["x-request-id"])
    summary = gateway.admin("GET", f"/admin/logs/summary?user_id={user['id']}").json()
    for name in ("total_calls", "error_calls", "denied_calls", "avg_latency_ms", "total_tokens_in",
                 "total_tokens_out", "total_input_cost", "total_output_cost", "time_series", "by_model",
                 "by_user", "by_deny_reason", "by_status_code", "latency_buckets", "totals", "series", "by_status"):
        assert name in summary, name
    assert (summary["total_calls"], summary["denied_calls"], summary["error_calls"]) == (1, 1, 1)
    assert summary["by_deny_reason"] == [{"reason": "model_blocked", "deny_reason": "model_blocked", "calls": 1,
                                          "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}]
    assert summary["by_status_code"] == [{"status_code": 403, "calls": 1}]
    assert summary["by_user"][0]["user_email"] == user["email"]
    assert sum(p["calls"] for p in summary["time_series"]) == 1
    assert {"bucket", "calls", "errors", "avg_latency_ms"} <= set(summary["time_series"][0])
    assert [b["label"] for b in summary["latency_buckets"]][-1] == ">30s"
    assert summary["latency_buckets"][-1]["upper_ms"] == 0
    assert summary["totals"]["denials"] == 1, "meshfast's own names stay"


# --- the registry file ----------------------------------------------------------------------------


def _apply(gateway: Gateway, path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(gateway.env(), DATABASE_URL=gateway.database_url)
    return subprocess.run([sys.executable, "-m", "meshfast.cli", "apply", str(path), "--json"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_registry_file_sets_registered_users_organisation_by_email(gateway: Gateway, fresh_dir: Path) -> None:
    """`users: [{email, manager_email?, business_unit?, tier?}]` updates registered users (left
    out: kept; null: cleared); applying it again changes nothing; a file naming an unknown user or
    closing a manager loop is refused whole with every problem listed."""
    boss, lead, member = _user(gateway), _user(gateway), _user(gateway, tier="gold")
    path = fresh_dir / "org.json"
    path.write_text(json.dumps({"users": [
        {"email": lead["email"], "manager_email": boss["email"], "business_unit": "payments"},
        {"email": member["email"].upper(), "manager_email": lead["email"], "tier": None},
    ]}))
    done = _apply(gateway, path)
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(done.stdout)["updated"]) == sorted([f"user {lead['email']}", f"user {member['email']}"])
    got = _get(gateway, member["id"])[0]
    assert (got["manager_id"], got["tier"]) == (lead["id"], None)
    assert _get(gateway, lead["id"])[0]["business_unit"] == "payments"
    again = _apply(gateway, path)
    assert again.returncode == 0 and json.loads(again.stdout)["updated"] == []

    path.write_text(json.dumps({"users": [{"email": boss["email"], "manager_email": member["email"]},
                                          {"email": "ghost@example.com", "tier": "x"}]}))
    refused = _apply(gateway, path)
    assert refused.returncode == 1 and "ghost@example.com" in refused.stderr, refused.stderr
    path.write_text(json.dumps({"users": [{"email": boss["email"], "manager_email": member["email"]}]}))
    refused = _apply(gateway, path)
    assert refused.returncode == 1 and "would loop" in refused.stderr, refused.stderr
    assert _get(gateway, boss["id"])[0]["manager_id"] is None, "nothing of a refused file is written"
    path.write_text(json.dumps({"users": [{"email": boss["email"], "manager_email": boss["email"]},
                                          {"email": lead["email"], "tier": ""}]}))
    refused = _apply(gateway, path)
    assert refused.returncode == 1 and "own manager" in refused.stderr and "tier may not be empty" in refused.stderr


# --- the dashboard ----------------------------------------------------------------------------------


def test_the_dashboard_edits_a_users_organisation_and_expiry_and_blocks_a_model(
        tab: test_dashboard.Tab, gateway: Gateway, admin: dict[str, str]) -> None:
    """From the UI: a user's manager, business unit, tier and expiry are saved (with the ETag the
    edit form was read with) and shown in the list; a model is blocked and reactivated."""
    from playwright.sync_api import expect

    page = tab.page
    boss, user = _user(gateway), _user(gateway)
    provider = gateway.create_provider(f"org-ui-{_tag()}")
    model = gateway.create_model(provider["id"], f"org-ui-{_tag()}")
    tab.login(admin)

    tab.go("users", "Users & keys")
    page.get_by_role("button", name=f"Edit {user['email']}").click()
    form = page.locator("#user-edit")
    form.get_by_label("Manager").select_option(label=boss["email"])
    form.get_by_label("Business unit").fill("payments")
    form.get_by_label("Tier").fill("gold")
    form.get_by_label("Expires at").fill("2031-02-03T04:05")
    assert tab.axe() == []
    form.get_by_role("button", name="Save user").click()
    row = page.locator(f"#users-table tr[data-email='{user['email']}']")
    expect(row.locator("td[data-col='manager_email']")).to_have_text(boss["email"])
    expect(row.locator("td[data-col='tier']")).to_have_text("gold")
    saved = _get(gateway, user["id"])[0]
    assert (saved["manager_id"], saved["business_unit"], saved["tier"]) == (boss["id"], "payments", "gold")
    expected = page.evaluate("() => new Date('2031-02-03T04:05').toISOString()")
    assert dt.datetime.fromisoformat(saved["expires_at"]) == dt.datetime.fromisoformat(expected)

    # Clearing: empty fields are sent as null.
    page.get_by_role("button", name=f"Edit {user['email']}").click()
    form.get_by_label("Manager").select_option(label="— none —")
    form.get_by_label("Expires at").fill("")
    form.get_by_role("button", name="Save user").click()
    expect(row.locator("td[data-col='manager_email']")).to_have_text("—")
    assert _get(gateway, user["id"])[0]["expires_at"] is None

    tab.go("models", "Models")
    page.get_by_role("button", name=f"Block model {model['name']}").click()
    status = page.locator(f"#models-table tr[data-name='{model['name']}'] td[data-col='status']")
    expect(status).to_have_text("blocked")
    assert gateway.admin("GET", f"/admin/models/{model['id']}").json()["status"] == "blocked"
    page.get_by_role("button", name=f"Reactivate model {model['name']}").click()
    expect(status).to_have_text("active")
