"""Several keys per person (issue "identity", item 2): named keys with an expiry and a model
subset, listed by prefix, rotated with an overlap and revoked, on real workers."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from typing import Any

import asyncpg
import pytest
from conftest import EmulatedProviders, Gateway, WorkerConnections, until


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _everywhere(pinned: WorkerConnections, key: str, status: int) -> bool:
    return all(s == status for s, _ in pinned.get_all("/v1/models", _bearer(key)).values())


@pytest.fixture(scope="module")
def people(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    provider = gateway.create_provider("named-keys-p", family="anthropic", base_url=f"{testserve.base_url}/anthropic",
                                       api_key="testserve-key")
    models = [gateway.create_model(provider["id"], f"named-keys-{i}", resolved_model="dummy-chat") for i in range(3)]
    user = gateway.create_user()
    for model in models[:2]:
        gateway.grant(user["id"], model["id"])
    return {"models": models, "user": user}


def _chat(gateway: Gateway, key: str, model: str) -> Any:
    return gateway.client.post("/v1/chat/completions", headers=_bearer(key),
                               json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def test_a_named_key_calls_only_its_models_and_is_listed_without_the_key(gateway: Gateway, people: dict) -> None:
    user, models = people["user"], people["models"]
    created = gateway.admin("POST", f"/admin/users/{user['id']}/keys",
                            {"name": "ci-bot", "models": [models[0]["id"]], "expires_at": "2099-01-01T00:00:00Z"})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["name"] == "ci-bot" and body["key"].startswith("mesh_live_")
    assert body["key_prefix"] == body["key"][:16] + "..." and body["expires_at"] == "2099-01-01T00:00:00Z"
    assert body["models"] == [models[0]["id"]] and body["primary"] is False
    key = body["key"]
    assert _chat(gateway, key, models[0]["name"]).status_code == 200
    # Granted to the person, but not to this key: as if not granted (404 on a standard route,
    # 403 on the Mesh-native one).
    refused = _chat(gateway, key, models[1]["name"])
    assert refused.status_code == 404, refused.text
    mesh = gateway.client.post("/v1/proxy", params={"model": models[1]["name"]}, json={"query": "hi"},
                               headers=_bearer(key))
    assert (mesh.status_code, mesh.json()["error"]) == (403, "model_not_permitted")
    listed = gateway.client.get("/v1/models", headers=_bearer(key)).json()
    assert [m["id"] for m in listed["data"]] == [models[0]["name"]]
    usage = gateway.client.get("/v1/usage", headers=_bearer(key)).json()
    assert [u["model"] for u in usage["usage"]] == [models[0]["name"]]
    # The primary key still reaches both granted models.
    assert _chat(gateway, user["key"], models[1]["name"]).status_code == 200
    keys = gateway.admin("GET", f"/admin/users/{user['id']}/keys").json()
    assert {k["name"] for k in keys} >= {"ci-bot", None}
    text = json.dumps(keys)
    assert key not in text and user["key"] not in text and "key_hash" not in text
    row = gateway.fetch_row(refused.headers["x-request-id"])
    assert row["mesh_key_id"] is not None and str(row["mesh_key_id"]) == body["id"]
    assert row["deny_reason"] == "model_not_permitted"


def test_rotation_keeps_the_old_key_for_its_overlap_then_refuses_it(gateway: Gateway, people: dict) -> None:
    user = people["user"]
    first = gateway.admin("POST", f"/admin/users/{user['id']}/keys", {"name": "deploy"}).json()
    pinned = WorkerConnections(gateway)
    try:
        until(lambda: _everywhere(pinned, first["key"], 200), 1.0, "the new key on every worker")
        rotated = gateway.admin("POST", f"/admin/keys/{first['id']}/rotate", {"overlap_s": 2})
        assert rotated.status_code == 200, rotated.text
        second = rotated.json()
        assert second["name"] == "deploy" and second["key"] != first["key"] and second["id"] != first["id"]
        began = time.monotonic()
        assert _everywhere(pinned, second["key"], 200)
        assert _everywhere(pinned, first["key"], 200), "the old key works during the overlap"
        until(lambda: _everywhere(pinned, first["key"], 401), 4.0, "the old key refused after the overlap")
        assert time.monotonic() - began >= 1.5
        assert _everywhere(pinned, second["key"], 200)
        # A rotated key cannot be rotated again; its successor can, at once (no overlap).
        again = gateway.admin("POST", f"/admin/keys/{first['id']}/rotate", {})
        assert (again.status_code, again.json()["error"]) == (409, "key_not_current")
        third = gateway.admin("POST", f"/admin/keys/{second['id']}/rotate").json()
        until(lambda: _everywhere(pinned, second["key"], 401), 1.0, "no overlap: refused at once")
        assert _everywhere(pinned, third["key"], 200)
        listed = {k["id"]: k for k in gateway.admin("GET", f"/admin/users/{user['id']}/keys").json()}
        assert listed[first["id"]]["replaced_by"] == second["id"] and listed[second["id"]]["status"] == "revoked"
        assert listed[third["id"]]["current"] is True
        # DELETE revokes at once, on every worker.
        deleted = gateway.admin("DELETE", f"/admin/keys/{third['id']}")
        assert deleted.json() == {"id": third["id"], "status": "revoked"}
        until(lambda: _everywhere(pinned, third["key"], 401), 1.0, "a revoked key refused everywhere")
    finally:
        pinned.close()


def test_the_official_sdks_with_a_rotated_key_within_and_after_its_overlap(gateway: Gateway, people: dict) -> None:
    """openai and anthropic clients on a named key: both keys answer during the overlap; after
    it, the old one is an AuthenticationError (401 invalid_or_revoked_key) and the new one works."""
    import anthropic
    import openai

    user, model = people["user"], people["models"][0]["name"]
    first = gateway.admin("POST", f"/admin/users/{user['id']}/keys", {"name": "sdk"}).json()
    until(lambda: _chat(gateway, first["key"], model).status_code == 200, 1.0, "the new key")
    second = gateway.admin("POST", f"/admin/keys/{first['id']}/rotate", {"overlap_s": 2}).json()
    began = time.monotonic()

    def both(key: str) -> None:
        chat = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content
        message = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0).messages.create(
            model=model, max_tokens=32, messages=[{"role": "user", "content": "hi"}])
        assert message.content

    both(second["key"])
    both(first["key"])
    assert time.monotonic() - began < 2.0, "the overlap calls took too long to show anything"
    time.sleep(max(0.0, 2.5 - (time.monotonic() - began)))
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=first["key"], max_retries=0).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "invalid_or_revoked_key"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gateway.base_url, api_key=first["key"], max_retries=0).messages.create(
            model=model, max_tokens=32, messages=[{"role": "user", "content": "hi"}])
    both(second["key"])


def test_mesh_rotate_key_replaces_the_primary_key_only(gateway: Gateway, people: dict) -> None:
    user = gateway.create_user()
    gateway.grant(user["id"], people["models"][0]["id"])
    named = gateway.admin("POST", f"/admin/users/{user['id']}/keys", {"name": "laptop"}).json()
    rotated = gateway.admin("POST", f"/admin/users/{user['id']}/rotate-key").json()
    until(lambda: gateway.client.get("/v1/models", headers=_bearer(user["key"])).status_code == 401, 1.0, "old primary")
    assert gateway.client.get("/v1/models", headers=_bearer(rotated["key"])).status_code == 200
    assert gateway.client.get("/v1/models", headers=_bearer(named["key"])).status_code == 200
    # Revoking the person revokes every key.
    gateway.admin("POST", f"/admin/users/{user['id']}/revoke")
    until(lambda: gateway.client.get("/v1/models", headers=_bearer(named["key"])).status_code == 401, 1.0, "named")


def test_an_expired_key_is_refused(gateway: Gateway, people: dict) -> None:
    user = people["user"]
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)).isoformat()
    key = gateway.admin("POST", f"/admin/users/{user['id']}/keys", {"name": "short-lived", "expires_at": soon}).json()
    assert gateway.client.get("/v1/models", headers=_bearer(key["key"])).status_code == 200
    until(lambda: gateway.client.get("/v1/models", headers=_bearer(key["key"])).status_code == 401, 5.0, "expiry")
    # An expired key has no successor to give.
    rotated = gateway.admin("POST", f"/admin/keys/{key['id']}/rotate", {"overlap_s": 60})
    assert (rotated.status_code, rotated.json()["error"]) == (409, "key_not_current")


@pytest.mark.parametrize("body, status, code", [
    ({}, 400, "invalid_request"),
    ({"name": ""}, 400, "invalid_request"),
    ({"name": "   "}, 400, "invalid_request"),
    ({"name": "x" * 65}, 400, "invalid_request"),
    ({"name": "nul\u0000"}, 400, "invalid_request"),
    ({"name": "ok", "models": ["not-a-uuid"]}, 400, "invalid_request"),
    ({"name": "ok", "models": ["00000000-0000-0000-0000-000000000000"]}, 400, "invalid_request"),
    ({"name": "ok", "expires_at": "2020-01-01T00:00:00Z"}, 400, "invalid_request"),
    ({"name": "ok", "expires_at": "2099-01-01T00:00:00"}, 400, "invalid_request"),
    ({"name": "ok", "extra": 1}, 400, "invalid_request"),
    ({"name": "ok", "models": []}, 400, "invalid_request"),
])
def test_bad_key_bodies_are_400(gateway: Gateway, people: dict, body: dict, status: int, code: str) -> None:
    response = gateway.admin("POST", f"/admin/users/{people['user']['id']}/keys", body)
    assert (response.status_code, response.json()["error"]) == (status, code), response.text


def test_unknown_ids_names_taken_and_bad_overlaps(gateway: Gateway, people: dict) -> None:
    user = people["user"]
    missing = "00000000-0000-0000-0000-000000000000"
    for method, path, body in [("POST", f"/admin/users/{missing}/keys", {"name": "a"}),
                               ("GET", f"/admin/users/{missing}/keys", None),
                               ("GET", "/admin/users/not-a-uuid/keys", None)]:
        response = gateway.admin(method, path, body)
        assert (response.status_code, response.json()["error"]) == (404, "user_not_found"), (path, response.text)
    for method, path in [("POST", f"/admin/keys/{missing}/rotate"), ("DELETE", f"/admin/keys/{missing}"),
                         ("DELETE", "/admin/keys/nope")]:
        response = gateway.admin(method, path)
        assert (response.status_code, response.json()["error"]) == (404, "key_not_found"), (path, response.text)
    taken = gateway.admin("POST", f"/admin/users/{user['id']}/keys", {"name": "twice"})
    assert taken.status_code == 201
    again = gateway.admin("POST", f"/admin/users/{user['id']}/keys", {"name": "twice"})
    assert (again.status_code, again.json()["error"]) == (409, "key_name_exists")
    for overlap in (-1, 30 * 86_400 + 1, 2**63, "5", None):
        response = gateway.admin("POST", f"/admin/keys/{taken.json()['id']}/rotate", {"overlap_s": overlap})
        assert (response.status_code, response.json()["error"]) == (400, "invalid_request"), (overlap, response.text)


def test_a_deleted_model_leaves_a_key_limited_to_it_with_nothing(gateway: Gateway, people: dict,
                                                                testserve: EmulatedProviders) -> None:
    provider = gateway.create_provider("named-keys-gone", family="anthropic",
                                       base_url=f"{testserve.base_url}/anthropic", api_key="testserve-key")
    model = gateway.create_model(provider["id"], "named-keys-gone-model", resolved_model="dummy-chat")
    user = gateway.create_user()
    gateway.grant(user["id"], model["id"])
    gateway.grant(user["id"], people["models"][0]["id"])
    key = gateway.admin("POST", f"/admin/users/{user['id']}/keys", {"name": "one", "models": [model["id"]]}).json()
    assert _chat(gateway, key["key"], model["name"]).status_code == 200
    assert gateway.admin("DELETE", f"/admin/models/{model['id']}").status_code == 200

    def listed() -> list[str]:
        return [m["id"] for m in gateway.client.get("/v1/models", headers=_bearer(key["key"])).json()["data"]]

    until(lambda: listed() == [], 1.0, "the key's only model gone")
    assert _chat(gateway, key["key"], people["models"][0]["name"]).status_code == 404


def test_cli_issues_lists_rotates_and_revokes_keys(gateway: Gateway, people: dict) -> None:
    user = people["user"]

    def cli(*args: str) -> Any:
        result = subprocess.run([sys.executable, "-m", "meshfast.cli", "users", *args, "--json"],
                                env=gateway.env(), capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    made = cli("add-key", user["id"], "--name", "from-cli", "--model", people["models"][0]["id"])
    assert made["models"] == [people["models"][0]["id"]]
    until(lambda: gateway.client.get("/v1/models", headers=_bearer(made["key"])).status_code == 200, 1.0, "cli key")
    assert made["id"] in {k["id"] for k in cli("keys", user["id"])}
    rotated = cli("rotate", made["id"], "--overlap-s", "0")
    until(lambda: gateway.client.get("/v1/models", headers=_bearer(made["key"])).status_code == 401, 1.0, "rotated")
    assert cli("revoke-key", rotated["id"]) == {"id": rotated["id"], "status": "revoked"}
    bad = subprocess.run([sys.executable, "-m", "meshfast.cli", "users", "add-key", user["id"], "--name", "x",
                          "--expires-at", "tomorrow"], env=gateway.env(), capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "invalid_request" in bad.stderr


def test_the_key_table_keeps_one_current_key_per_name(gateway: Gateway, people: dict) -> None:
    """The database itself refuses a second current key of a name (two racing writes)."""
    import asyncio

    async def count() -> int:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            return int(await conn.fetchval(
                "SELECT count(*) FROM (SELECT user_id, name FROM mesh_api_keys WHERE status = 'active' "
                "AND replaced_by IS NULL GROUP BY user_id, name HAVING count(*) > 1) d"))
        finally:
            await conn.close()

    assert asyncio.run(count()) == 0
