"""The admin plane with sessions: login, CSRF, lockout, throttling, super-admin rights, admin API
tokens, and the read routes (logs, summary, audit, status) — every authorization failure."""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import Any

import httpx
import pytest
from conftest import Gateway


def _admin(gateway: Gateway, is_super: bool = False) -> tuple[str, str]:
    email = f"admin-{secrets.token_hex(4)}@example.com"
    password = "correct horse battery"
    r = gateway.admin("POST", "/admin/admins", {"email": email, "password": password, "is_super": is_super})
    assert r.status_code == 201, r.text
    assert "password" not in r.text and r.json()["email"] == email
    return email, password


def _login(gateway: Gateway, email: str, password: str) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=gateway.base_url, timeout=10)
    for _ in range(6):
        r = client.post("/admin/login", json={"email": email, "password": password})
        if r.status_code != 429:
            break
        time.sleep(1.1)  # the per-IP login throttle (another test's burst): wait for a token
    assert r.status_code == 200, r.text
    csrf = r.json()["csrf_token"]
    assert client.cookies.get("mesh_session") and client.cookies.get("mesh_csrf") == csrf
    assert "HttpOnly" in r.headers.get_list("set-cookie")[0]
    return client, csrf


def test_a_session_reads_freely_and_writes_only_with_its_csrf_token(gateway: Gateway) -> None:
    email, password = _admin(gateway)
    client, csrf = _login(gateway, email, password)
    with contextlib.closing(client):
        me = client.get("/admin/me").json()
        assert me == {"email": email, "is_super_admin": False, "session": True}
        assert client.get("/admin/users").status_code == 200
        body = {"email": f"u-{secrets.token_hex(3)}@example.com", "display_name": "U"}
        assert client.post("/admin/users", json=body).status_code == 403, "no CSRF header"
        assert client.post("/admin/users", json=body, headers={"x-csrf-token": "wrong"}).status_code == 403
        created = client.post("/admin/users", json=body, headers={"x-csrf-token": csrf})
        assert created.status_code == 201 and created.json()["key"].startswith("mesh_live_")
        # Not a super admin: the kill switch and admin management are refused.
        assert client.post("/admin/kill-switch", json={"tripped": True},
                           headers={"x-csrf-token": csrf}).status_code == 403
        other, _ = _admin(gateway)
        other_id = next(a["id"] for a in gateway.admin("GET", "/admin/admins").json() if a["email"] == other)
        assert client.post(f"/admin/admins/{other_id}/pause", headers={"x-csrf-token": csrf}).status_code == 403
        assert client.post("/admin/logout", headers={"x-csrf-token": csrf}).status_code == 200
        assert client.get("/admin/me").status_code == 401
    assert httpx.get(f"{gateway.base_url}/admin/users").status_code == 401, "no session, no token"


def test_wrong_passwords_lock_the_account_and_logins_are_throttled(gateway: Gateway) -> None:
    email, password = _admin(gateway)
    with httpx.Client(base_url=gateway.base_url, timeout=10) as client:
        assert client.post("/admin/login", json={"email": "nobody@example.com", "password": "x" * 9}).json() == \
            {"error": "invalid_credentials"}
        statuses = []
        for i in range(5):
            time.sleep(1.1)  # stay under the per-IP throttle (1/s after a burst of 5)
            r = client.post("/admin/login", json={"email": email, "password": f"wrong-{i}-password"})
            statuses.append((r.status_code, r.json()["error"]))
        assert statuses == [(401, "invalid_credentials")] * 5
        time.sleep(1.1)
        locked = client.post("/admin/login", json={"email": email, "password": password})
        assert (locked.status_code, locked.json()["error"]) == (401, "account_locked")
        # A burst from one address is cut to 1/s.
        burst = [client.post("/admin/login", json={"email": email, "password": "x" * 9}).status_code
                 for _ in range(12)]
        assert 429 in burst
        time.sleep(5.5)  # let the bucket refill for the tests after this one
    actions = gateway.admin("GET", "/admin/audit", None).json()
    reasons = [e["detail"].get("reason") for e in actions["entries"] if e["action"] == "login_failed"
               and e["target"] == email]
    assert "bad_password_now_locked" in reasons and "account_locked" in reasons


def test_super_admins_manage_admins_and_changing_a_password_ends_other_sessions(gateway: Gateway) -> None:
    boss_email, boss_password = _admin(gateway, is_super=True)
    email, password = _admin(gateway)
    boss, boss_csrf = _login(gateway, boss_email, boss_password)
    first, first_csrf = _login(gateway, email, password)
    time.sleep(1.1)
    second, second_csrf = _login(gateway, email, password)
    with contextlib.closing(boss), contextlib.closing(first), contextlib.closing(second):
        assert first.post("/admin/change-password", json={"old_password": "nope-nope", "new_password": "n" * 12},
                          headers={"x-csrf-token": first_csrf}).status_code == 401
        assert first.post("/admin/change-password", json={"old_password": password, "new_password": "short"},
                          headers={"x-csrf-token": first_csrf}).json() == {"error": "weak_password"}
        changed = first.post("/admin/change-password", json={"old_password": password, "new_password": "n" * 12},
                             headers={"x-csrf-token": first_csrf})
        assert changed.status_code == 200
        assert first.get("/admin/me").status_code == 200
        assert second.get("/admin/me").status_code == 401, "the other session ended at once"
        target = next(a["id"] for a in boss.get("/admin/admins").json() if a["email"] == email)
        assert boss.post(f"/admin/admins/{target}/pause", headers={"x-csrf-token": boss_csrf}).status_code == 200
        assert first.get("/admin/me").status_code == 401, "a paused admin's sessions end at once"
        own = next(a["id"] for a in boss.get("/admin/admins").json() if a["email"] == boss_email)
        assert boss.delete(f"/admin/admins/{own}", headers={"x-csrf-token": boss_csrf}).json() == \
            {"error": "cannot_modify_own_account"}
        assert boss.delete(f"/admin/admins/{target}", headers={"x-csrf-token": boss_csrf}).status_code == 200


def test_admin_api_tokens_are_shown_once_listed_and_revoked(gateway: Gateway) -> None:
    created = gateway.admin("POST", "/admin/tokens", {"name": "ci-bot"})
    assert created.status_code == 201
    token = created.json()["token"]
    listed = gateway.admin("GET", "/admin/tokens").json()
    entry = next(t for t in listed if t["id"] == created.json()["id"])
    assert "token" not in entry and entry["revoked_at"] is None
    assert gateway.admin("GET", "/admin/users", token=token).status_code == 200
    assert gateway.admin("POST", "/admin/kill-switch", {"tripped": True}, token=token).status_code == 403
    assert gateway.admin("DELETE", f"/admin/tokens/{entry['id']}").json() == {"status": "revoked"}
    # Refused from the next request on (API.md: no cache delay).
    assert gateway.admin("GET", "/admin/users", token=token).status_code == 401
    assert gateway.admin("DELETE", "/admin/tokens/not-a-uuid").status_code == 404


@pytest.mark.parametrize("path", ["/admin/logs", "/admin/logs/summary", "/admin/audit", "/admin/status",
                                  "/admin/admins", "/admin/tokens", "/admin/metrics"])
def test_read_routes_need_an_admin_and_answer_one(gateway: Gateway, path: str) -> None:
    assert httpx.get(f"{gateway.base_url}{path}").status_code == 401
    r = gateway.admin("GET", path)
    assert r.status_code == 200, r.text
    if path == "/admin/logs/summary":
        body: Any = r.json()
        assert {"totals", "series", "by_model", "by_user", "by_status", "by_deny_reason", "latency_buckets"} <= set(body)
    if path == "/admin/logs":
        assert gateway.admin("GET", "/admin/logs?page_size=9999").status_code == 400


def test_updates_need_the_current_etag(gateway: Gateway, testserve: Any) -> None:
    provider = gateway.create_provider("etag-p", family="openai", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key")
    got = gateway.admin("GET", f"/admin/providers/{provider['id']}")
    etag = got.headers["etag"]
    body = {"name": "etag-p2", "family": "openai", "base_url": f"{testserve.base_url}/openai", "api_key": "",
            "local": True}
    r = gateway.client.put(f"/admin/providers/{provider['id']}", json=body,
                           headers={"authorization": f"Bearer {gateway.admin_token}"})
    assert (r.status_code, r.json()["error"]) == (428, "if_match_required")
    r = gateway.client.put(f"/admin/providers/{provider['id']}", json=body,
                           headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": '"999"'})
    assert (r.status_code, r.json()["error"]) == (409, "version_conflict")
    r = gateway.client.put(f"/admin/providers/{provider['id']}", json=body,
                           headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": etag})
    assert r.status_code == 200 and r.json()["name"] == "etag-p2" and r.headers["etag"] != etag
    # The sealed key was kept: the provider still reaches testserve.
    model = gateway.create_model(provider["id"], "etag-model", resolved_model="dummy-ok")
    m = gateway.admin("GET", f"/admin/models/{model['id']}")
    update = {"provider_id": provider["id"], "name": "etag-model", "resolved_model": "dummy-ok", "kind": "chat",
              "input_price_per_1k_tokens": "0.5", "output_price_per_1k_tokens": "1"}
    r = gateway.client.put(f"/admin/models/{model['id']}", json=update,
                           headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": m.headers["etag"]})
    assert r.status_code == 200 and float(r.json()["input_price_per_1k_tokens"]) == 0.5
    user = gateway.create_user()
    gateway.grant(user["id"], model["id"])
    call = gateway.client.post("/v1/proxy", params={"model": "etag-model"}, json={"query": "hi"},
                               headers={"authorization": f"Bearer {user['key']}"}, timeout=30)
    assert call.status_code == 200


def test_creates_with_an_idempotency_key_happen_once(gateway: Gateway) -> None:
    key = secrets.token_hex(8)
    body = {"email": f"idem-{key}@example.com", "display_name": "Idem"}
    headers = {"authorization": f"Bearer {gateway.admin_token}", "idempotency-key": key}
    first = gateway.client.post("/admin/users", json=body, headers=headers)
    again = gateway.client.post("/admin/users", json=body, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and "key" in first.json() and "key" not in again.json()
    users = [u for u in gateway.admin("GET", "/admin/users").json() if u["email"] == body["email"]]
    assert len(users) == 1
    other = gateway.client.post("/admin/users", json={**body, "display_name": "Other"}, headers=headers)
    assert (other.status_code, other.json()["error"]) == (422, "idempotency_key_reused")
