"""Issued keys, config propagation and the read-only data-plane routes, against real workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from conftest import Gateway, WorkerConnections

REQUEST_ID = re.compile(r"^req_[0-9A-HJKMNP-TV-Z]{26}$")


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _wait_for(predicate, timeout_s: float, interval_s: float = 0.02) -> float:  # type: ignore[no-untyped-def]
    """Poll until ``predicate()`` holds; returns the seconds it took."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


@pytest.fixture(scope="module")
def setup(gateway: Gateway) -> dict[str, object]:
    provider = gateway.create_provider("prov-keys")
    models = [gateway.create_model(provider["id"], f"keys-model-{i}") for i in range(3)]
    user = gateway.create_user()
    for model in models[:2]:
        gateway.grant(user["id"], model["id"])
    return {"provider": provider, "models": models, "user": user}


def test_create_user_returns_key_once_with_display_prefix(gateway: Gateway, setup: dict) -> None:
    """The key is mesh_live_ + 43 base64url chars; listings show only its prefix."""
    user = setup["user"]
    assert re.fullmatch(r"mesh_live_[A-Za-z0-9_-]{43}", user["key"])
    assert user["key_prefix"] == user["key"][:16] + "..."
    listed = gateway.admin("GET", f"/admin/users/{user['id']}").json()
    assert listed["key_prefix"] == user["key_prefix"]
    assert user["key"] not in json.dumps(gateway.admin("GET", "/admin/users").json())


def test_models_lists_granted_models_in_both_shapes(gateway: Gateway, setup: dict) -> None:
    """GET /v1/models carries the OpenAI list and Mesh's entries for exactly the granted models."""
    key = setup["user"]["key"]
    response = gateway.client.get("/v1/models", headers=_bearer(key))
    assert response.status_code == 200
    assert REQUEST_ID.match(response.headers["x-request-id"])
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["keys-model-0", "keys-model-1"]
    assert all(m["object"] == "model" and m["owned_by"] == "prov-keys" for m in body["data"])
    entries = {m["model"]: m for m in body["models"]}
    assert set(entries) == {"keys-model-0", "keys-model-1"}
    entry = entries["keys-model-0"]
    assert entry["kind"] == "chat"
    assert entry["status"] == "available"
    assert entry["formats_accepted"] == ["text"]
    assert entry["usage"]["daily_cap_usd"] == 20
    assert entry["usage"]["spent_today_usd"] == 0


@pytest.mark.parametrize("style", ["bearer", "x-api-key", "x-goog-api-key", "query"])
def test_every_key_header_style_authenticates(gateway: Gateway, setup: dict, style: str) -> None:
    """Bearer, x-api-key, x-goog-api-key and ?key= all carry the caller key."""
    key = setup["user"]["key"]
    headers: dict[str, str] = {}
    params: dict[str, str] = {}
    if style == "bearer":
        headers = _bearer(key)
    elif style == "query":
        params = {"key": key}
    else:
        headers = {style: key}
    response = gateway.client.get("/v1/models", headers=headers, params=params)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": ""},
        {"authorization": "Bearer"},
        {"authorization": "Bearer mesh_live_short"},
        {"authorization": "Basic dXNlcjpwYXNz"},
        {"authorization": "Bearer mesh_live_" + "A" * 43},
        {"x-api-key": "sk-ant-something"},
        {"authorization": ("Bearer " + "\u00e9" * 50).encode()},
    ],
)
def test_bad_keys_are_401_in_the_route_shape(gateway: Gateway, headers: dict[str, str]) -> None:
    """Missing, malformed and unknown keys are 401 invalid_or_revoked_key with a request id."""
    response = gateway.client.get("/v1/models", headers=headers)
    assert response.status_code == 401
    assert response.json() == {"error": "invalid_or_revoked_key"}
    assert REQUEST_ID.match(response.headers["x-request-id"])


def test_non_utf8_header_bytes_get_401_and_worker_keeps_serving(gateway: Gateway, setup: dict) -> None:
    """Raw non-UTF-8 bytes in the auth header are a 401, never a 500 or a dead worker."""
    import socket

    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xc3(\r\n\r\n")
        head = sock.recv(65536)
    status = int(head.split(b" ", 2)[1])
    assert status in (400, 401)
    assert gateway.client.get("/v1/models", headers=_bearer(setup["user"]["key"])).status_code == 200


def test_usage_reports_real_counter_values(gateway: Gateway, setup: dict) -> None:
    """GET /v1/usage reads the shared counters: zero spend, the default $20 cap, its utilization."""
    response = gateway.client.get("/v1/usage", headers=_bearer(setup["user"]["key"]))
    assert response.status_code == 200
    usage = {u["model"]: u for u in response.json()["usage"]}
    assert set(usage) == {"keys-model-0", "keys-model-1"}
    row = usage["keys-model-0"]
    assert row["spent_usd"] == 0 and row["daily_cap_usd"] == 20 and row["remaining_usd"] == 20
    daily = [limit for limit in row["limits"] if limit["id"] == "policy.daily_usd"]
    assert daily and daily[0]["utilization"] == 0


def test_key_works_on_every_worker_and_revocation_reaches_all_within_1s(gateway: Gateway, setup: dict) -> None:
    """A new key is accepted by every worker; after revoke every worker refuses it within 1 s."""
    user = gateway.create_user()
    gateway.grant(user["id"], setup["models"][0]["id"])
    pinned = WorkerConnections(gateway)
    try:
        assert len(pinned.by_pid) == gateway.workers
        _wait_for(lambda: all(s == 200 for s, _ in pinned.get_all("/v1/models", _bearer(user["key"])).values()), 1.0)
        assert gateway.admin("POST", f"/admin/users/{user['id']}/revoke").json() == {"status": "revoked"}
        took = _wait_for(
            lambda: all(s == 401 for s, _ in pinned.get_all("/v1/models", _bearer(user["key"])).values()), 1.0
        )
        assert took < 1.0
    finally:
        pinned.close()


def test_rotate_key_stops_the_old_key_at_once(gateway: Gateway, setup: dict) -> None:
    """After rotate-key the old key is refused and the new one works, on every worker."""
    user = gateway.create_user()
    gateway.grant(user["id"], setup["models"][0]["id"])
    rotated = gateway.admin("POST", f"/admin/users/{user['id']}/rotate-key").json()
    assert rotated["key"] != user["key"] and rotated["key_prefix"] == rotated["key"][:16] + "..."
    pinned = WorkerConnections(gateway)
    try:
        _wait_for(lambda: all(s == 401 for s, _ in pinned.get_all("/v1/models", _bearer(user["key"])).values()), 1.0)
        _wait_for(lambda: all(s == 200 for s, _ in pinned.get_all("/v1/models", _bearer(rotated["key"])).values()), 1.0)
    finally:
        pinned.close()


def test_admin_routes_need_the_admin_token(gateway: Gateway) -> None:
    """No token or a wrong token is 401; a caller key is not an admin token."""
    assert gateway.client.get("/admin/users").status_code == 401
    assert gateway.admin("GET", "/admin/users", token="wrong").status_code == 401
    caller = gateway.create_user()
    assert gateway.admin("GET", "/admin/users", token=caller["key"]).status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        b'{"email":"x@example.com","display_name":"X","admin":true}',
        b'{"email":"x@example.com"}',
        b'{"email":1,"display_name":"X"}',
        b"not json",
        b"\xff\xfe\x00garbage",
        b"",
        b"[]",
    ],
)
def test_bad_admin_bodies_are_400_invalid_request(gateway: Gateway, body: bytes) -> None:
    """Unknown fields, missing fields, wrong types and non-JSON bytes are 400 invalid_request."""
    response = gateway.client.post(
        "/admin/users", content=body, headers={"authorization": f"Bearer {gateway.admin_token}"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request"


def test_duplicate_email_is_409(gateway: Gateway) -> None:
    """Emails are unique (case-insensitively)."""
    user = gateway.create_user("Dup@Example.com")
    assert user["email"] == "dup@example.com"
    again = gateway.admin("POST", "/admin/users", {"email": "dup@example.COM", "display_name": "D"})
    assert again.status_code == 409 and again.json() == {"error": "email_already_exists"}


def test_unknown_ids_are_404_not_500(gateway: Gateway) -> None:
    """Malformed and unknown ids answer 404 in the admin shape."""
    assert gateway.admin("POST", "/admin/users/not-a-uuid/revoke").status_code == 404
    missing = gateway.admin("POST", "/admin/users/00000000-0000-0000-0000-000000000000/rotate-key")
    assert missing.status_code == 404 and missing.json() == {"error": "user_not_found"}


def test_provider_key_is_never_returned(gateway: Gateway) -> None:
    """The provider's api_key is sealed and never appears in an answer."""
    created = gateway.admin("POST", "/admin/providers", {
        "name": "secretive", "family": "anthropic", "base_url": "http://127.0.0.1:9/anthropic",
        "api_key": "sk-very-secret-value", "local": True, "verify": False})
    assert created.status_code == 201
    for response in (created, gateway.admin("GET", "/admin/providers"),
                     gateway.admin("GET", f"/admin/providers/{created.json()['id']}")):
        assert "sk-very-secret-value" not in response.text
    assert gateway.admin("GET", f"/admin/providers/{created.json()['id']}").headers["etag"] == '"1"'


def test_private_base_url_needs_local_flag(gateway: Gateway) -> None:
    """A provider pointing at loopback or private ranges is refused unless marked local."""
    response = gateway.admin("POST", "/admin/providers", {
        "name": "ssrf", "family": "openai", "base_url": "http://169.254.169.254/openai",
        "api_key": "k", "verify": False})
    assert response.status_code == 400 and response.json()["error"] == "invalid_request"


def test_health_and_readiness(gateway: Gateway) -> None:
    """/healthz answers while the process listens; /readyz pings the database and reports the load."""
    assert gateway.client.get("/healthz").json()["status"] == "ok"
    ready = gateway.client.get("/readyz").json()
    assert ready["status"] == "ok"
    assert ready["load"]["saturated"] is False and ready["load"]["limit"] > 0


def test_cli_creates_users_against_the_running_gateway(gateway: Gateway, setup: dict) -> None:
    """`meshfast users create --json` prints a key that the running workers accept."""
    result = subprocess.run(
        [sys.executable, "-m", "meshfast.cli", "users", "create", "--email", "cli@example.com",
         "--display-name", "CLI", "--json"],
        env=gateway.env(), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    created = json.loads(result.stdout)
    assert created["email"] == "cli@example.com" and created["key"].startswith("mesh_live_")
    _wait_for(lambda: gateway.client.get("/v1/models", headers=_bearer(created["key"])).status_code == 200, 1.0)


def test_killed_worker_is_replaced(gateway: Gateway, setup: dict) -> None:
    """SIGKILL a worker: Granian respawns it and the gateway keeps serving."""
    before = gateway.worker_pids()
    victim = before[0]
    os.kill(victim, signal.SIGKILL)
    _wait_for(lambda: victim not in gateway.worker_pids() and len(gateway.worker_pids()) == len(before), 15, 0.1)
    _wait_for(lambda: gateway.client.get("/readyz").status_code == 200, 15, 0.1)
    key = setup["user"]["key"]
    pinned = WorkerConnections(gateway)
    try:
        assert all(status == 200 for status, _ in pinned.get_all("/v1/models", _bearer(key)).values())
    finally:
        pinned.close()


def test_http_errors_do_not_escape_as_500(gateway: Gateway) -> None:
    """Unknown routes are 404 and wrong methods 405, both JSON."""
    assert gateway.client.get("/nope").status_code == 404
    assert gateway.client.post("/v1/models").status_code == 405
    assert gateway.admin("PATCH", "/admin/users").status_code == 405


def test_oversized_headers_are_refused_by_the_server_layer(gateway: Gateway) -> None:
    """A huge header gets a 4xx from the server layer, and the worker keeps serving."""
    try:
        response = gateway.client.get("/v1/models", headers={"authorization": "Bearer " + "a" * 200_000})
        assert 400 <= response.status_code < 500
    except httpx.HTTPError:
        pass
    assert gateway.client.get("/healthz").status_code == 200


def test_first_write_on_a_fresh_instance_is_visible_when_it_returns(fresh_dir) -> None:  # type: ignore[no-untyped-def]
    """The writer's own worker covers its write before answering, even for the very first write."""
    from conftest import Gateway as FreshGateway

    gw = FreshGateway(fresh_dir / "data", workers=1).start()
    try:
        user = gw.create_user()
        assert gw.client.get("/v1/models", headers=_bearer(user["key"])).status_code == 200
    finally:
        gw.stop()
