"""Admin login through an OIDC issuer (authorization code with PKCE), against a small issuer of the
test's own on 127.0.0.1: the session is password login's; roles come from the role claim; every
broken step (state, the issuer's refusal, the code, the ID token) is refused with its own code;
no secret reaches the log or the audit."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import http.server
import json
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from conftest import SESSION_ENV, Gateway, free_port, running_gateway
from jwtkit import SigningKey, b64, encode, jwks, new_key

CLIENT_ID = "meshfast-admin"
PLATFORM = "meshfast-platform-admin"
BU = "meshfast-bu-admin:"


class LocalIssuer:
    """Discovery, an authorization endpoint that sends the browser straight back with a code for
    the person set by :meth:`next`, a token endpoint that checks the client secret, the PKCE S256
    verifier, the redirect URI and that a code is used once (invalid_grant on a replay), and the
    key set. Everything it hands out is kept in ``handed_out`` (the log check looks for it)."""

    def __init__(self) -> None:
        self.client_secret = "oidc-secret-" + secrets.token_urlsafe(16)
        self.signing = new_key("RS256", "rsa-1")
        self.published: list[SigningKey] = [self.signing, new_key("ES256", "ec-1")]
        self.codes: dict[str, dict[str, Any]] = {}
        self.handed_out: list[str] = [self.client_secret]
        self.token_calls = 0
        self.jwks_fetches = 0
        self._person: dict[str, Any] = {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                path, _, query = self.path.partition("?")
                if path == "/.well-known/openid-configuration":
                    self._json(200, outer.discovery())
                elif path == "/jwks":
                    outer.jwks_fetches += 1
                    self._json(200, jwks(*outer.published))
                elif path == "/authorize":
                    self._redirect(outer.authorize({k: v[0] for k, v in parse_qs(query).items()}))
                else:
                    self._json(404, {"error": "not_found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                if self.path != "/token":
                    self._json(404, {"error": "not_found"})
                    return
                self._json(*outer.token(self.headers.get("authorization") or "", form))

            def _json(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _redirect(self, location: str) -> None:
                self.send_response(302)
                self.send_header("location", location)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def discovery(self) -> dict[str, Any]:
        return {"issuer": self.url, "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token", "jwks_uri": f"{self.url}/jwks",
                "response_types_supported": ["code"], "code_challenge_methods_supported": ["S256"],
                "id_token_signing_alg_values_supported": ["RS256", "ES256"]}

    def next(self, email: str, roles: list[str] | str | None = None, *, deny: bool = False,
             sign: str = "good", claims: dict[str, Any] | None = None) -> None:
        """Who the next authorization is for: ``roles`` go in the ``groups`` claim; ``claims``
        replace the ID token's own (None removes one); ``sign`` says how it is signed."""
        self._person = {"email": email, "roles": roles, "deny": deny, "sign": sign, "claims": claims or {}}

    def authorize(self, params: dict[str, str]) -> str:
        redirect_uri, state = params["redirect_uri"], params.get("state", "")
        assert params["client_id"] == CLIENT_ID and params["response_type"] == "code"
        assert params["code_challenge_method"] == "S256" and "openid" in params["scope"].split()
        if self._person["deny"]:
            return f"{redirect_uri}?{urlencode({'error': 'access_denied', 'state': state})}"
        code = "code-" + secrets.token_urlsafe(24)
        self.handed_out.append(code)
        self.codes[code] = {"challenge": params["code_challenge"], "redirect_uri": redirect_uri,
                            "nonce": params["nonce"], "person": dict(self._person), "used": False}
        return f"{redirect_uri}?{urlencode({'code': code, 'state': state})}"

    def token(self, authorization: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        self.token_calls += 1
        expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{self.client_secret}".encode()).decode()
        if authorization != expected:
            return 401, {"error": "invalid_client"}
        grant = self.codes.get(form.get("code", ""))
        if form.get("grant_type") != "authorization_code" or grant is None or grant["used"]:
            return 400, {"error": "invalid_grant"}
        grant["used"] = True
        verifier = form.get("code_verifier", "")
        if b64(hashlib.sha256(verifier.encode()).digest()) != grant["challenge"] or \
                form.get("redirect_uri") != grant["redirect_uri"]:
            return 400, {"error": "invalid_grant"}
        id_token = self.id_token(grant["person"], grant["nonce"])
        access = "access-" + secrets.token_urlsafe(16)
        self.handed_out += [id_token, access]
        return 200, {"access_token": access, "token_type": "Bearer", "expires_in": 300, "id_token": id_token}

    def id_token(self, person: dict[str, Any], nonce: str) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {"iss": self.url, "aud": CLIENT_ID, "sub": "sub-" + person["email"],
                                  "email": person["email"], "email_verified": True, "iat": now, "exp": now + 300,
                                  "nonce": nonce}
        if person["roles"] is not None:
            claims["groups"] = person["roles"]
        claims.update(person["claims"])
        claims = {k: v for k, v in claims.items() if v is not None}
        key, sign = self.signing, person["sign"]
        if sign == "good":
            return encode({"alg": key.alg, "typ": "JWT", "kid": key.kid}, claims, key.sign)
        if sign == "es256":
            key = self.published[1]
            return encode({"alg": key.alg, "typ": "JWT", "kid": key.kid}, claims, key.sign)
        if sign == "bad_signature":  # another key, under the published key's kid
            other = new_key("RS256", key.kid)
            return encode({"alg": "RS256", "typ": "JWT", "kid": key.kid}, claims, other.sign)
        if sign == "unknown_kid":
            other = new_key("RS256", "not-published")
            return encode({"alg": "RS256", "typ": "JWT", "kid": other.kid}, claims, other.sign)
        if sign == "none":
            return encode({"alg": "none", "typ": "JWT", "kid": key.kid}, claims, lambda data: b"")
        if sign == "hs256":  # the algorithm-confusion forgery: HMAC keyed with the public key
            secret = json.dumps(key.jwk()).encode()
            return encode({"alg": "HS256", "typ": "JWT", "kid": key.kid}, claims,
                          lambda data: hmac.new(secret, data, hashlib.sha256).digest())
        raise AssertionError(sign)


@pytest.fixture(scope="module")
def issuer() -> Iterator[LocalIssuer]:
    server = LocalIssuer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def oidc_gateway(issuer: LocalIssuer) -> Iterator[Gateway]:
    env = {**SESSION_ENV, "MESHFAST_OIDC_ISSUER": issuer.url, "MESHFAST_OIDC_CLIENT_ID": CLIENT_ID,
           "MESHFAST_OIDC_CLIENT_SECRET": issuer.client_secret, "MESHFAST_JWKS_MIN_INTERVAL_S": "0.5"}
    with running_gateway(2, env=env) as gw:
        yield gw


def _email() -> str:
    return f"oidc-{secrets.token_hex(4)}@example.com"


def _query(gw: Gateway, statement: str, *args: Any) -> list[dict[str, Any]]:
    return gw.query(statement, *args)


def _begin(client: httpx.Client) -> httpx.Response:
    """GET /admin/oidc/login, waiting out the per-address throttle (burst 5, then 1/s)."""
    for _ in range(20):
        response = client.get("/admin/oidc/login")
        if response.status_code != 429:
            return response
        time.sleep(float(response.headers.get("retry-after", "1")) + 0.05)
    raise AssertionError("the login throttle never let a login through")


def _to_issuer_and_back(client: httpx.Client) -> str:
    """Begins a login and follows the issuer's authorization; returns the callback URL the
    issuer sends the browser to."""
    begun = _begin(client)
    assert begun.status_code == 302, begun.text
    answer = httpx.get(begun.headers["location"], follow_redirects=False)
    assert answer.status_code == 302
    return answer.headers["location"]


def _login(gw: Gateway, issuer: LocalIssuer, email: str, roles: Any = None, **how: Any) \
        -> tuple[httpx.Client, httpx.Response]:
    issuer.next(email, roles, **how)
    client = httpx.Client(base_url=gw.base_url, timeout=10)
    return client, client.get(_to_issuer_and_back(client))


def _refused(response: httpx.Response, status: int, code: str) -> None:
    assert (response.status_code, response.json()) == (status, {"error": code}), response.text
    assert "mesh_session" not in response.headers.get("set-cookie", "")


def _units(gw: Gateway, email: str) -> set[str]:
    rows = _query(gw, "SELECT u.name FROM business_unit_admins b JOIN business_units u ON u.id = b.business_unit_id "
                      "JOIN admins a ON a.id = b.admin_id WHERE a.email = $1", email)
    return {r["name"] for r in rows}


def test_a_platform_administrator_logs_in_with_password_logins_session(
        oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """The full flow: the 302 to the issuer carries PKCE S256, state and nonce; the callback sets
    password login's cookies and sends the browser to the dashboard; the session reads freely and
    writes only with its CSRF token; the provisioned admin has no password."""
    email = _email()
    issuer.next(email, [PLATFORM, "unrelated-group"])
    with httpx.Client(base_url=oidc_gateway.base_url, timeout=10) as client:
        begun = _begin(client)
        assert begun.status_code == 302
        location = urlsplit(begun.headers["location"])
        params = {k: v[0] for k, v in parse_qs(location.query).items()}
        assert f"{location.scheme}://{location.netloc}{location.path}" == f"{issuer.url}/authorize"
        assert params["response_type"] == "code" and params["client_id"] == CLIENT_ID
        assert params["redirect_uri"] == f"{oidc_gateway.base_url}/admin/oidc/callback"
        assert params["scope"] == "openid email profile" and params["code_challenge_method"] == "S256"
        assert len(params["nonce"]) >= 32 and len(params["code_challenge"]) == 43
        state_cookie = begun.headers["set-cookie"]
        assert f"mesh_oidc_state={params['state']};" in state_cookie and "HttpOnly" in state_cookie
        assert "Max-Age=600" in state_cookie

        callback = httpx.get(begun.headers["location"], follow_redirects=False).headers["location"]
        done = client.get(callback)
        assert done.status_code == 302 and done.headers["location"] == "/dashboard", done.text
        cookies = done.headers.get_list("set-cookie")
        assert any(c.startswith("mesh_oidc_state=;") and "Max-Age=0" in c for c in cookies)
        session_cookie = next(c for c in cookies if c.startswith("mesh_session="))
        assert "HttpOnly" in session_cookie and "Max-Age=86400" in session_cookie
        csrf = client.cookies.get("mesh_csrf")
        assert csrf and client.cookies.get("mesh_session")

        assert client.get("/admin/me").json() == {"email": email, "is_super_admin": True, "session": True,
                                                   "role": "platform", "business_units": None}
        assert client.get("/admin/users").status_code == 200
        assert client.post("/admin/logout").json() == {"error": "csrf_failed"}, "unsafe without its CSRF token"
        assert client.post("/admin/logout", headers={"x-csrf-token": csrf}).status_code == 200
        assert client.get("/admin/me").status_code == 401

    (admin,) = _query(oidc_gateway, "SELECT is_super, password_hash, created_by FROM admins WHERE email = $1", email)
    assert admin["is_super"] and admin["created_by"] == "oidc"
    # An admin the issuer created has no password: password login refuses it as a wrong one.
    for _ in range(10):
        refused = httpx.post(f"{oidc_gateway.base_url}/admin/login",
                             json={"email": email, "password": admin["password_hash"]})
        if refused.status_code != 429:
            break
        time.sleep(1.1)
    assert (refused.status_code, refused.json()) == (401, {"error": "invalid_credentials"})
    failed = oidc_gateway.admin("GET", "/admin/audit?action=login_failed").json()["entries"]
    assert any(e["target"] == email and e["detail"]["reason"] == "no_password" for e in failed)
    audit = oidc_gateway.admin("GET", "/admin/audit?action=admin.oidc_login").json()["entries"]
    entry = next(e for e in audit if e["target"] == email)
    assert entry["detail"]["role"] == "platform" and entry["detail"]["provisioned"] is True


def test_a_business_unit_administrator_administers_exactly_the_named_units_that_exist(
        oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """BU-prefixed role values set the admin's units to those named that exist (unknown names
    are ignored); the next login's claim replaces them; a platform role later clears them."""
    payments, risk = f"payments-{secrets.token_hex(3)}", f"risk-{secrets.token_hex(3)}"
    for name in (payments, risk):
        _query(oidc_gateway, "INSERT INTO business_units (name) VALUES ($1)", name)
    email = _email()
    client, done = _login(oidc_gateway, issuer, email, [BU + payments, BU + risk, BU + "no-such-unit"])
    with contextlib.closing(client):
        assert done.status_code == 302, done.text
        assert client.get("/admin/me").json() == {"email": email, "is_super_admin": False, "session": True,
                                                   "role": "business_unit",
                                                   "business_units": sorted([payments, risk])}
    assert _units(oidc_gateway, email) == {payments, risk}

    client, done = _login(oidc_gateway, issuer, email, BU + payments)  # one string, not a list
    client.close()
    assert done.status_code == 302 and _units(oidc_gateway, email) == {payments}

    client, done = _login(oidc_gateway, issuer, email, [PLATFORM, BU + risk])
    with contextlib.closing(client):
        assert client.get("/admin/me").json()["is_super_admin"] is True
    assert _units(oidc_gateway, email) == set(), "a platform administrator is scoped to no unit"

    client, done = _login(oidc_gateway, issuer, email, [BU + risk])
    with contextlib.closing(client):
        me = client.get("/admin/me").json()
        assert me["is_super_admin"] is False, "the issuer takes the platform role back"
        assert me["role"] == "business_unit" and me["business_units"] == [risk]
    assert _units(oidc_gateway, email) == {risk}


def test_a_person_without_a_role_is_refused(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """No role claim, unrelated values, or only units that do not exist: 403 no_role, no admin."""
    email = _email()
    for roles in (None, ["staff", "meshfast-platform-admin-not"], [BU + "no-such-unit"], [BU]):
        client, done = _login(oidc_gateway, issuer, email, roles)
        client.close()
        _refused(done, 403, "no_role")
    assert _query(oidc_gateway, "SELECT 1 FROM admins WHERE email = $1", email) == []


def test_a_paused_admin_is_refused_as_password_login_refuses_it(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    email = _email()
    created = oidc_gateway.admin("POST", "/admin/admins", {"email": email, "password": "correct horse battery"})
    assert created.status_code == 201
    assert oidc_gateway.admin("POST", f"/admin/admins/{created.json()['id']}/pause").status_code == 200
    client, done = _login(oidc_gateway, issuer, email, [PLATFORM])
    client.close()
    _refused(done, 401, "invalid_credentials")
    (admin,) = _query(oidc_gateway, "SELECT is_super, status FROM admins WHERE email = $1", email)
    assert admin == {"is_super": False, "status": "paused"}, "a paused admin's role is left as it is"


def test_a_bad_or_missing_state_is_refused(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """The state must be the browser's (its cookie) and name a stored attempt."""
    issuer.next(_email(), [PLATFORM])
    with httpx.Client(base_url=oidc_gateway.base_url, timeout=10) as client:
        callback = urlsplit(_to_issuer_and_back(client))
        params = {k: v[0] for k, v in parse_qs(callback.query).items()}
        path = callback.path
        _refused(client.get(path, params={"code": params["code"], "state": params["state"] + "x"}), 400,
                 "invalid_state")
        _refused(client.get(path, params={"code": params["code"]}), 400, "invalid_state")
        # Without the state cookie (another browser) the right state is refused too.
        _refused(httpx.get(f"{oidc_gateway.base_url}{path}", params=params), 400, "invalid_state")
        # A state the gateway never issued, with a matching cookie.
        forged = secrets.token_urlsafe(32)
        _refused(httpx.get(f"{oidc_gateway.base_url}{path}", params={"code": params["code"], "state": forged},
                           headers={"cookie": f"mesh_oidc_state={forged}"}), 400, "invalid_state")


def test_a_replayed_callback_is_refused(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """The same code and state twice (the state cookie sent again): the attempt was used."""
    issuer.next(_email(), [PLATFORM])
    with httpx.Client(base_url=oidc_gateway.base_url, timeout=10) as client:
        callback = _to_issuer_and_back(client)
        state_cookie = client.cookies.get("mesh_oidc_state")
        assert client.get(callback).status_code == 302
        calls = issuer.token_calls
        _refused(httpx.get(callback, headers={"cookie": f"mesh_oidc_state={state_cookie}"}), 400, "invalid_state")
        assert issuer.token_calls == calls, "a used state never reaches the token endpoint"


def test_a_replayed_code_with_a_fresh_state_is_refused_by_the_issuer(
        oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    issuer.next(_email(), [PLATFORM])
    with httpx.Client(base_url=oidc_gateway.base_url, timeout=10) as client:
        first = _to_issuer_and_back(client)
        assert client.get(first).status_code == 302
        code = parse_qs(urlsplit(first).query)["code"][0]
        begun = _begin(client)
        state = parse_qs(urlsplit(begun.headers["location"]).query)["state"][0]
        _refused(client.get("/admin/oidc/callback", params={"code": code, "state": state}), 400,
                 "oidc_exchange_failed")


def test_the_issuers_refusal_is_oidc_denied(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    client, done = _login(oidc_gateway, issuer, _email(), [PLATFORM], deny=True)
    client.close()
    _refused(done, 400, "oidc_denied")


@pytest.mark.parametrize(("how", "claims", "why"), [
    ("good", {"aud": "another-client"}, "aud does not name this client"),
    ("good", {"aud": [CLIENT_ID, "another-client"]}, "azp is not this client"),  # several audiences, no azp
    ("good", {"aud": [CLIENT_ID, "another-client"], "azp": "another-client"}, "azp is not this client"),
    ("good", {"iss": "https://issuer.example"}, "iss is not the issuer"),
    ("good", {"nonce": "not-the-logins-nonce"}, "nonce is not the login's"),
    ("good", {"nonce": None}, "nonce is not the login's"),
    ("good", {"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, "the token has expired"),
    ("good", {"iat": int(time.time()) + 3600, "exp": int(time.time()) + 7200}, "the token is not valid yet"),
    ("good", {"email_verified": False}, "the email is not verified"),
    ("good", {"email": None}, "no email claim"),
    ("bad_signature", {}, "the signature does not verify"),
    ("unknown_kid", {}, "no key of the issuer's set has this kid"),
    ("none", {}, "algorithm 'none' is not one of"),
    ("hs256", {}, "algorithm 'HS256' is not one of"),
], ids=["wrong-audience", "audiences-without-azp", "azp-of-another", "wrong-issuer", "wrong-nonce", "no-nonce",
        "expired", "issued-in-the-future", "email-not-verified", "no-email", "bad-signature", "unknown-kid",
        "alg-none", "hs256-with-the-public-key"])
def test_an_id_token_that_does_not_verify_is_refused(oidc_gateway: Gateway, issuer: LocalIssuer, how: str,
                                                     claims: dict[str, Any], why: str) -> None:
    """401 invalid_id_token, for the reason the audit record names; no admin is created."""
    email = _email()
    client, done = _login(oidc_gateway, issuer, email, [PLATFORM], sign=how, claims=claims)
    client.close()
    _refused(done, 401, "invalid_id_token")
    assert _query(oidc_gateway, "SELECT 1 FROM admins WHERE email = $1", email) == []
    (last,) = _query(oidc_gateway, "SELECT detail FROM admin_audit_log WHERE action = 'admin.oidc_login_failed' "
                                   "ORDER BY id DESC LIMIT 1")
    assert json.loads(last["detail"])["why"].startswith(why)


def test_several_audiences_with_this_client_as_azp_and_es256_verify(oidc_gateway: Gateway,
                                                                     issuer: LocalIssuer) -> None:
    client, done = _login(oidc_gateway, issuer, _email(), [PLATFORM], sign="es256",
                          claims={"aud": [CLIENT_ID, "another-client"], "azp": CLIENT_ID})
    client.close()
    assert done.status_code == 302, done.text


def test_a_rotated_key_is_fetched_when_its_kid_is_unknown(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """The issuer signs with a new key: the gateway fetches the set again and the login works."""
    rotated = new_key("RS256", "rsa-2")
    old = issuer.signing
    issuer.published.append(rotated)
    issuer.signing = rotated
    try:
        time.sleep(0.6)  # past MESHFAST_JWKS_MIN_INTERVAL_S since the last unknown-kid fetch
        client, done = _login(oidc_gateway, issuer, _email(), [PLATFORM])
        client.close()
        assert done.status_code == 302, done.text
    finally:
        issuer.signing = old


def test_pending_logins_are_capped_and_expired_ones_swept(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """An unauthenticated route cannot fill the database: past 100 pending logins from one address
    a new one from it is 429 too_many_attempts; past 10,000 in all the oldest go, so other sources
    filling the table lock nobody out; expired ones do not count and go at the next login."""
    fill = ("INSERT INTO admin_oidc_attempts (state_hash, nonce, redirect_uri, expires_at, source, created_at) "
            "SELECT $1 || i, 'n', 'r', now() + $2::text::interval, $3, now() - interval '1 minute' "
            "FROM generate_series(1, $4::int) AS i")
    mark = f"cap-{secrets.token_hex(4)}-"
    _query(oidc_gateway, fill, mark, "10 minutes", "127.0.0.1", 100)
    try:
        with httpx.Client(base_url=oidc_gateway.base_url, timeout=10) as client:
            for _ in range(20):
                full = client.get("/admin/oidc/login")
                if full.json() == {"error": "too_many_attempts"} and full.headers["retry-after"] == "60":
                    break
                time.sleep(1.1)  # the per-address throttle's 429 (Retry-After 1): wait, ask again
            assert full.status_code == 429 and full.headers["retry-after"] == "60"
    finally:
        _query(oidc_gateway, "DELETE FROM admin_oidc_attempts WHERE state_hash LIKE $1 || '%'", mark)
    # Another source (or many) at the global cap: this address still logs in; the oldest go.
    _query(oidc_gateway, fill, mark, "10 minutes", "203.0.113.7", 10_000)
    try:
        client, done = _login(oidc_gateway, issuer, _email(), [PLATFORM])
        client.close()
        assert done.status_code == 302, done.text
        left = _query(oidc_gateway, "SELECT count(*) AS n FROM admin_oidc_attempts")[0]["n"]
        assert left <= 10_000
    finally:
        _query(oidc_gateway, "DELETE FROM admin_oidc_attempts WHERE state_hash LIKE $1 || '%'", mark)
    _query(oidc_gateway, fill, mark, "-1 second", "127.0.0.1", 100)
    client, done = _login(oidc_gateway, issuer, _email(), [PLATFORM])
    client.close()
    assert done.status_code == 302, done.text
    assert _query(oidc_gateway, "SELECT 1 FROM admin_oidc_attempts WHERE state_hash LIKE $1 || '%'", mark) == []


def test_an_unverified_or_unstated_email_is_refused(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """By default an ID token names an admin only with ``email_verified`` true: missing or false
    is 401 invalid_id_token, and no admin is made."""
    email = _email()
    for verified in (None, False, "false"):
        client, done = _login(oidc_gateway, issuer, email, [PLATFORM], claims={"email_verified": verified})
        client.close()
        _refused(done, 401, "invalid_id_token")
    assert _query(oidc_gateway, "SELECT 1 FROM admins WHERE email = $1", email) == []


def test_an_admin_is_bound_to_its_first_subject(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """The first OIDC login binds the admin to the issuer's ``sub``: a later login for the same
    email with another subject is 401 invalid_id_token."""
    email = _email()
    client, done = _login(oidc_gateway, issuer, email, [PLATFORM])
    client.close()
    assert done.status_code == 302, done.text
    (admin,) = _query(oidc_gateway, "SELECT oidc_issuer, oidc_subject FROM admins WHERE email = $1", email)
    assert admin == {"oidc_issuer": issuer.url, "oidc_subject": "sub-" + email}
    client, done = _login(oidc_gateway, issuer, email, [PLATFORM], claims={"sub": "someone-else"})
    client.close()
    _refused(done, 401, "invalid_id_token")
    client, done = _login(oidc_gateway, issuer, email, [PLATFORM])
    client.close()
    assert done.status_code == 302


def test_a_demotion_ends_sessions_and_platform_tokens(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """A login that takes the platform role away ends the admin's sessions and revokes its platform
    tokens; one that finds no role for an admin the issuer made leaves it no rights at all."""
    payments = f"payments-{secrets.token_hex(3)}"
    _query(oidc_gateway, "INSERT INTO business_units (name) VALUES ($1)", payments)
    email = _email()
    old, done = _login(oidc_gateway, issuer, email, [PLATFORM])
    with contextlib.closing(old):
        csrf = old.cookies.get("mesh_csrf") or ""
        made = old.post("/admin/tokens", json={"name": f"su-{secrets.token_hex(3)}", "is_super": True},
                        headers={"x-csrf-token": csrf})
        assert made.status_code == 201, made.text
        token = {"authorization": f"Bearer {made.json()['token']}"}
        client, done = _login(oidc_gateway, issuer, email, [BU + payments])
        client.close()
        assert done.status_code == 302
        assert old.get("/admin/me").status_code == 401, "the platform session ended"
        assert httpx.get(f"{oidc_gateway.base_url}/admin/me", headers=token).status_code == 401

        kept, done = _login(oidc_gateway, issuer, email, [BU + payments])
        with contextlib.closing(kept):
            assert kept.get("/admin/me").json()["business_units"] == [payments]
            client, done = _login(oidc_gateway, issuer, email, ["staff"])
            client.close()
            _refused(done, 403, "no_role")
            assert kept.get("/admin/me").status_code == 401
    (admin,) = _query(oidc_gateway, "SELECT is_super, unit_admin FROM admins WHERE email = $1", email)
    assert admin == {"is_super": False, "unit_admin": True} and _units(oidc_gateway, email) == set()


def test_unconfigured_oidc_routes_answer_404(gateway: Gateway) -> None:
    for path in ("/admin/oidc/login", "/admin/oidc/callback?code=x&state=y"):
        response = gateway.client.get(path)
        assert (response.status_code, response.json()) == (404, {"error": "not_found"})
    assert gateway.client.head("/admin/oidc/login").status_code == 404


def test_asking_whether_single_sign_on_is_offered_stores_nothing_and_spends_no_attempt(
        oidc_gateway: Gateway) -> None:
    """HEAD /admin/oidc/login (the dashboard's login form asks it) answers 204 with no body, again
    and again past the login throttle's burst, and stores no attempt."""
    before = _query(oidc_gateway, "SELECT count(*) AS n FROM admin_oidc_attempts")[0]["n"]
    for _ in range(12):
        answer = oidc_gateway.client.head("/admin/oidc/login")
        assert answer.status_code == 204 and answer.content == b"" and "location" not in answer.headers
    assert _query(oidc_gateway, "SELECT count(*) AS n FROM admin_oidc_attempts")[0]["n"] == before
    assert oidc_gateway.client.get("/admin/oidc/login").status_code == 302, "the throttle was not spent"


def test_issuer_settings_are_checked_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """An issuer must be https (http on a loopback address only), with a client id and secret;
    the secret never shows in the settings' repr."""
    from meshfast.settings import _oidc_env

    monkeypatch.setenv("MESHFAST_OIDC_CLIENT_ID", "c")
    monkeypatch.setenv("MESHFAST_OIDC_CLIENT_SECRET", "very-secret")
    for bad in ("http://idp.example.com", "ftp://idp.example.com", "https://user@idp.example.com",
                "https://idp.example.com/?q=1"):
        monkeypatch.setenv("MESHFAST_OIDC_ISSUER", bad)
        with pytest.raises(SystemExit):
            _oidc_env()
    monkeypatch.setenv("MESHFAST_OIDC_ISSUER", "https://idp.example.com/realms/x")
    settings = _oidc_env()
    assert settings is not None and settings.role_claim == "groups" and not settings.local
    assert "very-secret" not in repr(settings)
    monkeypatch.setenv("MESHFAST_OIDC_ISSUER", "http://127.0.0.1:8080")
    local = _oidc_env()
    assert local is not None and local.local
    monkeypatch.delenv("MESHFAST_OIDC_CLIENT_SECRET")
    with pytest.raises(SystemExit):
        _oidc_env()


def test_a_redirect_url_is_required_off_the_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """An issuer off the loopback starts only with MESHFAST_OIDC_REDIRECT_URL; a loopback issuer
    without it derives the callback from a loopback Host only (no Host steers the code away)."""
    from meshfast import errors
    from meshfast.admin import oidc
    from meshfast.settings import _oidc_env, oidc_for_serving

    monkeypatch.setenv("MESHFAST_OIDC_CLIENT_ID", "c")
    monkeypatch.setenv("MESHFAST_OIDC_CLIENT_SECRET", "s")
    monkeypatch.setenv("MESHFAST_OIDC_ISSUER", "https://idp.example.com")
    with pytest.raises(SystemExit, match="MESHFAST_OIDC_REDIRECT_URL is required"):
        oidc_for_serving(_oidc_env())
    monkeypatch.setenv("MESHFAST_OIDC_REDIRECT_URL", "https://gw.example.com/admin/oidc/callback")
    assert oidc_for_serving(_oidc_env()) is not None
    monkeypatch.delenv("MESHFAST_OIDC_REDIRECT_URL")
    monkeypatch.setenv("MESHFAST_OIDC_ISSUER", "http://127.0.0.1:9999")
    local = oidc_for_serving(_oidc_env())
    assert local is not None and local.require_verified_email
    login = oidc.OidcLogin(None, local, lambda text: "h", None, False)  # type: ignore[arg-type]
    assert login.redirect_uri("127.0.0.1:8080", "http") == "http://127.0.0.1:8080/admin/oidc/callback"
    with pytest.raises(errors.InvalidRequest):
        login.redirect_uri("evil.example", "http")
    monkeypatch.setenv("MESHFAST_OIDC_REQUIRE_VERIFIED_EMAIL", "0")
    lax = _oidc_env()
    assert lax is not None and not lax.require_verified_email


def test_no_secret_reaches_the_log_or_the_audit(oidc_gateway: Gateway, issuer: LocalIssuer) -> None:
    """After every login above: the client secret, the codes and the tokens the issuer handed
    out appear neither in the gateway's log nor in its audit records."""
    client, done = _login(oidc_gateway, issuer, _email(), [PLATFORM])
    client.close()
    assert done.status_code == 302
    assert len(issuer.handed_out) > 20
    log = oidc_gateway.log_path.read_text(errors="replace")
    audit = json.dumps(_query(oidc_gateway, "SELECT actor, action, target, detail::text FROM admin_audit_log"))
    assert "logged in through OIDC" in log
    for secret in issuer.handed_out:
        assert secret not in log and secret not in audit


def test_id_token_verification_in_process() -> None:
    """EdDSA verifies; an RSA key under 2048 bits and a key whose alg is not its type's are left
    out of the set; a token without kid is tried against the keys of its algorithm."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    from meshfast.admin import oidc

    ed = new_key("EdDSA", "ed-1")
    small = SigningKey("RS256", "small", rsa.generate_private_key(public_exponent=65537, key_size=1024))
    mislabeled = {**new_key("ES256", "mislabeled").jwk(), "alg": "RS256"}
    keys = oidc.public_keys(json.dumps({"keys": [ed.jwk(), small.jwk(), mislabeled]}))
    assert [(k.kid, k.alg) for k in keys] == [("ed-1", "EdDSA")]
    now = int(time.time())
    claims = {"iss": "https://idp.example", "aud": CLIENT_ID, "iat": now, "exp": now + 60, "nonce": "n",
              "email": "A@Example.com"}
    token = encode({"alg": "EdDSA"}, claims, ed.sign)
    verified = oidc.verify_id_token(token, keys, issuer="https://idp.example", client_id=CLIENT_ID, nonce="n",
                                    now_s=now)
    assert oidc.verified_email(verified) == "a@example.com"
    with pytest.raises(oidc.IdTokenError):
        oidc.verify_id_token(encode({"alg": "RS256", "kid": "small"}, claims, small.sign), keys,
                             issuer="https://idp.example", client_id=CLIENT_ID, nonce="n", now_s=now)
    # Within the skew an expired token still passes; past it, not.
    oidc.verify_id_token(token, keys, issuer="https://idp.example", client_id=CLIENT_ID, nonce="n", now_s=now + 100)
    with pytest.raises(oidc.IdTokenError, match="expired"):
        oidc.verify_id_token(token, keys, issuer="https://idp.example", client_id=CLIENT_ID, nonce="n",
                             now_s=now + 121)


def test_roles_and_the_redirect_uri_in_process() -> None:
    """The role claim as a list, one string or a dotted path; the redirect URI from the setting,
    else from a well-formed Host header only."""
    from meshfast import errors
    from meshfast.admin import oidc
    from meshfast.settings import OidcSettings

    settings = OidcSettings(issuer="https://idp.example", client_id=CLIENT_ID, client_secret="s",
                            role_claim="realm_access.roles")
    claims = {"realm_access": {"roles": [BU + "b", BU + "a", BU, "x", 7]}}
    assert oidc.roles(claims, settings) == (False, ["a", "b"])
    assert oidc.roles({"realm_access.roles": PLATFORM}, settings) == (True, [])
    login = oidc.OidcLogin(None, settings, lambda text: "h", None, False)  # type: ignore[arg-type]
    assert login.redirect_uri("gw.example:8443", "https") == "https://gw.example:8443/admin/oidc/callback"
    for bad in (None, "", "evil.example/path", "a b", "x\r\ny"):
        with pytest.raises(errors.InvalidRequest):
            login.redirect_uri(bad, "http")
    fixed = oidc.OidcLogin(None, OidcSettings(issuer="https://idp.example", client_id=CLIENT_ID,  # type: ignore[arg-type]
                                              client_secret="s", redirect_url="https://admin.example/cb"),
                           lambda text: "h", None, False)  # type: ignore[arg-type]
    assert fixed.redirect_uri("anything", "http") == "https://admin.example/cb"


def test_the_issuer_client_in_process(issuer: LocalIssuer, monkeypatch: pytest.MonkeyPatch) -> None:
    """An issuer that does not answer, or whose discovery document names another issuer, is
    oidc_unavailable; the key set is cached, and an unknown kid refetches it at most once per
    MESHFAST_JWKS_MIN_INTERVAL_S."""
    from meshfast import errors
    from meshfast.admin import oidc
    from meshfast.settings import OidcSettings

    monkeypatch.setenv("MESHFAST_JWKS_MIN_INTERVAL_S", "30")

    def client(url: str) -> oidc.IssuerClient:
        return oidc.IssuerClient(OidcSettings(issuer=url, client_id=CLIENT_ID, client_secret="s"))

    async def run() -> None:
        for url in (f"http://127.0.0.1:{free_port()}", issuer.url + "/", issuer.url + "/elsewhere"):
            with pytest.raises(errors.OidcUnavailable):
                await client(url).metadata()
        keys = client(issuer.url)
        before = issuer.jwks_fetches
        assert {k.kid for k in await keys.keys("rsa-1", "RS256")} >= {"rsa-1", "ec-1"}
        await keys.keys("rsa-1", "RS256")
        await keys.keys("not-published", "RS256")
        assert issuer.jwks_fetches == before + 1, "the unknown kid waits out the interval"

    asyncio.run(run())
