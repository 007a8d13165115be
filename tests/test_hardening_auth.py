"""Admin authentication under attack (issue 13, items 3-6): the account lockout under concurrent
guesses, the instance-wide login throttle and its ``Retry-After``, revocation and logout taking effect
on the next request on every worker, and what a non-super admin may not do to a super admin.

Concurrent requests go over keep-alive connections pinned to each worker, each from its own
loopback source address (127.0.0.0/8 is all local) when the per-IP login throttle must not thin
the burst, or from one shared address when the throttle is what is tested.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from conftest import Gateway

PASSWORD = "correct horse battery"


def _address() -> str:
    """A loopback source address no other test uses (its own login-throttle bucket)."""
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


@contextlib.contextmanager
def _pinned(gateway: Gateway, per_worker: int, source: str | None = None) -> Iterator[list[httpx.Client]]:
    """``per_worker`` keep-alive clients on each worker, interleaved (worker A, B, A, B, ...); each
    from ``source``, or from its own fresh address when None."""
    by_pid: dict[int, list[httpx.Client]] = {}
    try:
        for _ in range(400):
            transport = httpx.HTTPTransport(local_address=source or _address(), limits=httpx.Limits(max_connections=1))
            client = httpx.Client(base_url=gateway.base_url, timeout=60, transport=transport)
            clients = by_pid.setdefault(client.get("/healthz").json()["pid"], [])
            if len(clients) < per_worker:
                clients.append(client)
            else:
                client.close()
            if len(by_pid) == gateway.workers and all(len(c) == per_worker for c in by_pid.values()):
                break
        else:
            raise RuntimeError(f"could not reach every worker {per_worker} times: {by_pid}")
        yield [client for row in zip(*by_pid.values(), strict=True) for client in row]
    finally:
        for clients in by_pid.values():
            for client in clients:
                client.close()


def _all_at_once(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Runs every call at the same moment (a barrier), one thread each."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], httpx.Response]) -> httpx.Response:
        barrier.wait()
        return call()

    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _db(gateway: Gateway, query: str, *args: Any) -> Any:
    async def run() -> Any:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            return await conn.fetchrow(query, *args)
        finally:
            await conn.close()
    return asyncio.run(run())


def _new_admin(gateway: Gateway, is_super: bool = False) -> tuple[str, str]:
    email = f"harden-{secrets.token_hex(4)}@example.com"
    r = gateway.admin("POST", "/admin/admins", {"email": email, "password": PASSWORD, "is_super": is_super})
    assert r.status_code == 201, r.text
    return email, r.json()["id"]


def _login(client: httpx.Client, email: str) -> str:
    r = client.post("/admin/login", json={"email": email, "password": PASSWORD})
    assert r.status_code == 200, r.text
    return r.json()["csrf_token"]


def _answer(r: httpx.Response) -> tuple[int, str | None]:
    return r.status_code, r.json().get("error")


# --- item 3: the lockout counter ---------------------------------------------------------------


def test_concurrent_wrong_passwords_lock_the_account_at_the_fifth(gateway: Gateway) -> None:
    """Ten wrong passwords at once on both workers: exactly five are checked, the account locks, and
    the right password is then refused."""
    email, admin_id = _new_admin(gateway)
    with _pinned(gateway, per_worker=5) as clients:
        burst = _all_at_once([lambda c=c, i=i: c.post("/admin/login", json={"email": email, "password": f"wrong-{i}"})
                              for i, c in enumerate(clients)])
        answers = [_answer(r) for r in burst]
        assert set(answers) <= {(401, "invalid_credentials"), (401, "account_locked")}, answers
        assert answers.count((401, "invalid_credentials")) == 5, answers
        row = _db(gateway, "SELECT failed_login_attempts, locked_until > now() AS locked FROM admins WHERE id = $1",
                  admin_id)
        assert (row["failed_login_attempts"], row["locked"]) == (5, True)
        for client in clients[:2]:  # both workers
            right = client.post("/admin/login", json={"email": email, "password": PASSWORD})
            assert _answer(right) == (401, "account_locked")


def test_the_right_password_racing_a_burst_of_wrong_ones_is_refused(gateway: Gateway) -> None:
    """Once five wrong attempts of a burst are counted, the right password is refused, even while
    those wrong passwords are still being checked."""
    email, admin_id = _new_admin(gateway)
    with _pinned(gateway, per_worker=5) as clients:
        wrong, right = clients[:8], clients[8]
        with concurrent.futures.ThreadPoolExecutor(len(wrong)) as pool:
            barrier = threading.Barrier(len(wrong))

            def guess(client: httpx.Client, i: int) -> httpx.Response:
                barrier.wait()
                return client.post("/admin/login", json={"email": email, "password": f"wrong-{i}"})

            pending = [pool.submit(guess, c, i) for i, c in enumerate(wrong)]
            deadline = time.monotonic() + 10
            while _db(gateway, "SELECT locked_until FROM admins WHERE id = $1", admin_id)["locked_until"] is None:
                assert time.monotonic() < deadline, "the burst never locked the account"
                time.sleep(0.005)
            racing = right.post("/admin/login", json={"email": email, "password": PASSWORD})
            answers = [_answer(f.result()) for f in pending]
        assert _answer(racing) == (401, "account_locked")
        assert answers.count((401, "invalid_credentials")) == 5, answers
        assert _answer(right.post("/admin/login", json={"email": email, "password": PASSWORD})) == \
            (401, "account_locked")


# --- item 4: the login throttle ----------------------------------------------------------------


def test_the_login_throttle_is_per_address_across_workers_and_says_when_to_retry(gateway: Gateway) -> None:
    """Ten logins at once from one address, five on each worker: the instance admits a burst of
    five (per worker it was ten), refuses the rest with 429 and a whole-second Retry-After, and
    admits the address again once that has passed."""
    source = _address()
    body = {"email": f"nobody-{secrets.token_hex(4)}@example.com", "password": "not-a-password"}
    with _pinned(gateway, per_worker=5, source=source) as clients:
        burst = _all_at_once([lambda c=c: c.post("/admin/login", json=body) for c in clients])
        admitted = [r for r in burst if r.status_code != 429]
        refused = [r for r in burst if r.status_code == 429]
        assert all(_answer(r) == (401, "invalid_credentials") for r in admitted), [r.text for r in admitted]
        # NOTE: one or two more only if the burst itself took seconds (a token comes back each second).
        assert 5 <= len(admitted) <= 7, [r.status_code for r in burst]
        for r in refused:
            assert r.json() == {"error": "too_many_attempts"}
            assert r.headers["retry-after"].isdigit() and 1 <= int(r.headers["retry-after"]) <= 2, r.headers
        retry_after_s = max(int(r.headers["retry-after"]) for r in refused)
        again = clients[-1].post("/admin/login", json=body)
        if again.status_code == 429:
            time.sleep(retry_after_s)
            again = clients[-1].post("/admin/login", json=body)
        assert _answer(again) == (401, "invalid_credentials")
    # Another address was never throttled by this one. NOTE: addresses share 4,096 buckets (keyed
    # by the instance's pepper, so unpredictable), so a fresh address may share a drained one with
    # odds 1/4096; of two fresh addresses, both colliding is a one-in-sixteen-million event.
    answers = []
    for _ in range(2):
        with _pinned(gateway, per_worker=1, source=_address()) as (other, _):
            answers.append(_answer(other.post("/admin/login", json=body)))
        if answers[-1] == (401, "invalid_credentials"):
            break
    assert answers[-1] == (401, "invalid_credentials"), answers


# --- item 5: stale credentials -----------------------------------------------------------------


def test_a_revoked_admin_token_is_refused_by_every_worker_on_the_next_request(gateway: Gateway) -> None:
    """A token each worker has just accepted is refused by each of them right after its revocation."""
    created = gateway.admin("POST", "/admin/tokens", {"name": f"stale-{secrets.token_hex(3)}"}).json()
    headers = {"authorization": f"Bearer {created['token']}"}
    with _pinned(gateway, per_worker=2) as clients:
        assert [c.get("/admin/me", headers=headers).status_code for c in clients] == [200] * len(clients)
        assert gateway.admin("DELETE", f"/admin/tokens/{created['id']}").json() == {"status": "revoked"}
        assert [c.get("/admin/me", headers=headers).status_code for c in clients] == [401] * len(clients)


def test_a_logged_out_session_is_refused_by_every_worker_on_the_next_request(gateway: Gateway) -> None:
    """A session each worker has just accepted is refused by each of them right after logout."""
    email, _ = _new_admin(gateway)
    with _pinned(gateway, per_worker=2, source=_address()) as clients:
        csrf = _login(clients[0], email)
        for client in clients[1:]:
            client.cookies = clients[0].cookies
        assert [c.get("/admin/me").status_code for c in clients] == [200] * len(clients)
        assert clients[0].post("/admin/logout", headers={"x-csrf-token": csrf}).status_code == 200
        for client in clients[1:]:
            assert client.get("/admin/me").status_code == 401
            assert client.post("/admin/users", json={"email": "x@example.com", "display_name": "x"},
                               headers={"x-csrf-token": csrf}).status_code == 401


def test_a_paused_admins_session_and_a_password_change_end_sessions_on_every_worker(gateway: Gateway) -> None:
    """Pausing an admin, or changing a password, ends the sessions it should on every worker at once."""
    email, admin_id = _new_admin(gateway)
    with _pinned(gateway, per_worker=2, source=_address()) as clients:
        first, second = clients[0], clients[1]  # two workers
        first_csrf = _login(first, email)
        _login(second, email)
        assert first.get("/admin/me").status_code == second.get("/admin/me").status_code == 200
        changed = first.post("/admin/change-password", json={"old_password": PASSWORD, "new_password": "n" * 12},
                             headers={"x-csrf-token": first_csrf})
        assert changed.status_code == 200
        assert second.get("/admin/me").status_code == 401
        assert first.get("/admin/me").status_code == 200
        clients[3].cookies = first.cookies  # the same session on the other worker
        assert clients[3].get("/admin/me").status_code == 200
        assert gateway.admin("POST", f"/admin/admins/{admin_id}/pause").status_code == 200
        assert first.get("/admin/me").status_code == clients[3].get("/admin/me").status_code == 401


def test_a_paused_admins_tokens_are_refused_until_resumed_and_end_with_the_admin(gateway: Gateway) -> None:
    """Tokens an admin made (from a session, and through one of those tokens) stop working on every
    worker while the admin is paused, work again on resume, and end when the admin is deleted."""
    email, admin_id = _new_admin(gateway)
    with _pinned(gateway, per_worker=1, source=_address()) as clients:
        csrf = _login(clients[0], email)
        made = clients[0].post("/admin/tokens", json={"name": "mine"}, headers={"x-csrf-token": csrf})
        assert made.status_code == 201, made.text
        first = made.json()["token"]
        second = gateway.admin("POST", "/admin/tokens", {"name": "mine-too"}, token=first).json()["token"]
        bootstrap_made = gateway.admin("POST", "/admin/tokens", {"name": "ops"}).json()["token"]

        def statuses() -> list[int]:
            return [c.get("/admin/me", headers={"authorization": f"Bearer {t}"}).status_code
                    for c in clients for t in (first, second)]

        assert statuses() == [200] * 4
        assert gateway.admin("POST", f"/admin/admins/{admin_id}/pause").status_code == 200
        assert statuses() == [401] * 4
        assert gateway.admin("GET", "/admin/me", token=bootstrap_made).status_code == 200, "not the admin's"
        assert gateway.admin("POST", f"/admin/admins/{admin_id}/resume").status_code == 200
        assert statuses() == [200] * 4
        assert gateway.admin("DELETE", f"/admin/admins/{admin_id}").status_code == 200
        assert statuses() == [401] * 4


# --- item 6: what a non-super admin may not do -------------------------------------------------


@pytest.fixture
def non_super(gateway: Gateway, request: pytest.FixtureRequest) -> Iterator[Callable[..., httpx.Response]]:
    """A non-super admin's request function: through an admin token, or a session with CSRF."""
    if request.param == "token":
        token = gateway.admin("POST", "/admin/tokens", {"name": f"plain-{secrets.token_hex(3)}"}).json()["token"]
        yield lambda method, path, body=None: gateway.admin(method, path, body, token=token)
        return
    email, _ = _new_admin(gateway)
    with _pinned(gateway, per_worker=1, source=_address()) as (client, _):
        csrf = _login(client, email)
        yield lambda method, path, body=None: client.request(method, path, json=body, headers={"x-csrf-token": csrf})


@pytest.mark.parametrize("non_super", ["token", "session"], indirect=True)
def test_a_non_super_admin_cannot_revoke_a_super_admins_token(gateway: Gateway,
                                                             non_super: Callable[..., httpx.Response]) -> None:
    """Revoking a super admin's token (the bootstrap one included) is 403 for a non-super admin, and
    the token keeps working; a non-super token it may revoke."""
    super_token = gateway.admin("POST", "/admin/tokens", {"name": "root-ci", "is_super": True}).json()
    bootstrap = next(t for t in gateway.admin("GET", "/admin/tokens").json()
                     if t["name"] == "bootstrap" and t["revoked_at"] is None)
    for target in (super_token["id"], bootstrap["id"]):
        refused = non_super("DELETE", f"/admin/tokens/{target}")
        assert (refused.status_code, refused.json()) == (403, {"error": "forbidden"})
    assert gateway.admin("GET", "/admin/me", token=super_token["token"]).json()["is_super_admin"] is True
    assert gateway.admin("GET", "/admin/me").status_code == 200
    plain = gateway.admin("POST", "/admin/tokens", {"name": "plain-ci"}).json()
    assert non_super("DELETE", f"/admin/tokens/{plain['id']}").json() == {"status": "revoked"}
    assert gateway.admin("GET", "/admin/me", token=plain["token"]).status_code == 401
    assert gateway.admin("DELETE", f"/admin/tokens/{super_token['id']}").json() == {"status": "revoked"}


@pytest.mark.parametrize("non_super", ["token", "session"], indirect=True)
def test_a_non_super_admin_cannot_raise_or_touch_super_admins(gateway: Gateway,
                                                             non_super: Callable[..., httpx.Response]) -> None:
    """No super token, no super admin, no pausing, resuming or deleting an admin, no kill switch:
    each is 403 and changes nothing."""
    _, boss_id = _new_admin(gateway, is_super=True)
    attempts = [
        ("POST", "/admin/tokens", {"name": "escalate", "is_super": True}),
        ("POST", "/admin/admins", {"email": f"up-{secrets.token_hex(3)}@example.com", "password": PASSWORD,
                                   "is_super": True}),
        ("POST", f"/admin/admins/{boss_id}/pause", None),
        ("POST", f"/admin/admins/{boss_id}/resume", None),
        ("DELETE", f"/admin/admins/{boss_id}", None),
        ("POST", "/admin/kill-switch", {"tripped": True}),
    ]
    for method, path, body in attempts:
        r = non_super(method, path, body)
        assert (r.status_code, r.json()) == (403, {"error": "forbidden"}), (method, path, r.text)
    assert not any(t["name"] == "escalate" for t in gateway.admin("GET", "/admin/tokens").json())
    boss = next(a for a in gateway.admin("GET", "/admin/admins").json() if a["id"] == boss_id)
    assert (boss["status"], boss["is_super"]) == ("active", True)
    assert not any(a["email"].startswith("up-") for a in gateway.admin("GET", "/admin/admins").json())


def test_idempotency_keys_belong_to_one_token_even_when_two_share_a_name(gateway: Gateway) -> None:
    """Two admin tokens with the same name keep separate Idempotency-Keys: one never replays the
    other's stored answer nor is blocked by it."""
    tokens = [gateway.admin("POST", "/admin/tokens", {"name": "twin"}).json()["token"] for _ in range(2)]
    key = "idem-" + secrets.token_hex(8)
    answers = []
    for i, token in enumerate(tokens):
        answers.append(gateway.client.post(
            "/admin/users", json={"email": f"twin{i}-{key}@example.com", "display_name": "Twin"},
            headers={"authorization": f"Bearer {token}", "idempotency-key": key}))
    assert [a.status_code for a in answers] == [201, 201]
    assert "idempotent-replayed" not in answers[1].headers
    assert answers[0].json()["id"] != answers[1].json()["id"]
