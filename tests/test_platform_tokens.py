"""Platform tokens (issue "identity", item 3): JWTs from configured issuers verified offline in the
core, on real workers, with the official SDKs; every refusal with its code; a key set fetched in
the background, rotated, and failing closed once it is too old; just-in-time provisioning;
meshfast's own short-lived tokens for a logged-in admin."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway, WorkerConnections, running_gateway, until
from jwtkit import Issuer, JwksServer, hs256_with_public_key, jwks, new_key, unsigned

MAX_AGE_S = 8.0
ENV = {**SESSION_ENV, "MESHFAST_JWKS_REFRESH_S": "1", "MESHFAST_JWKS_MIN_INTERVAL_S": "0.5",
       "MESHFAST_JWKS_MAX_AGE_S": str(MAX_AGE_S)}


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_gateway(2, env=ENV) as g:
        yield g


@pytest.fixture(scope="module")
def model(gw: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    provider = gw.create_provider("tokens-p", family="openai", base_url=f"{testserve.base_url}/openai",
                                  api_key="testserve-key")
    return gw.create_model(provider["id"], "tokens-chat", resolved_model="dummy-chat")


@pytest.fixture(scope="module")
def issuer(gw: Gateway) -> Issuer:
    iss = Issuer(f"https://idp-{secrets.token_hex(3)}.example.com")
    for alg, kid in (("RS256", "rsa-1"), ("ES256", "ec-1"), ("EdDSA", "ed-1")):
        iss.keys[kid] = new_key(alg, kid)
    created = gw.admin("POST", "/admin/issuers", {
        "issuer": iss.name, "audiences": [iss.audience, "other"], "algorithms": ["RS256", "ES256", "EdDSA"],
        "jwks": jwks(*iss.keys.values()), "claims": {"email": "email"}, "clock_skew_s": 5})
    assert created.status_code == 201, created.text
    body = created.json()
    assert {k["kid"] for k in body["keys"]} == {"rsa-1", "ec-1", "ed-1"}
    return iss


def _person(gw: Gateway, model: dict[str, Any]) -> dict[str, Any]:
    user = gw.create_user()
    gw.grant(user["id"], model["id"])
    return user


def _everywhere(pinned: WorkerConnections, token: str, status: int) -> bool:
    return all(s == status for s, _ in pinned.get_all("/v1/models", {"authorization": f"Bearer {token}"}).values())


def test_the_official_sdks_call_with_a_token_of_each_algorithm(gw: Gateway, model: dict, issuer: Issuer) -> None:
    user = _person(gw, model)
    for key in issuer.keys.values():
        token = issuer.token(user["email"], key)
        client = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=token, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=model["name"], messages=[{"role": "user", "content": "hi"}])
        assert raw.parse().choices[0].message.content, key.alg
        row = gw.fetch_row(raw.headers["x-request-id"])
        assert (row["outcome"], str(row["user_id"]), row["principal_kind"]) == ("success", user["id"], "user")
        assert (row["token_issuer"], row["token_subject"]) == (issuer.name, f"sub-{user['email']}")
        assert row["mesh_key_id"] is None
    # The Anthropic SDK sends it as x-api-key; /v1/models lists the person's models for it too.
    token = issuer.token(user["email"], issuer.keys["ed-1"])
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=gw.base_url, api_key=token, max_retries=0).messages.create(
            model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    listed = gw.client.get("/v1/models", headers={"authorization": f"Bearer {token}"})
    assert listed.status_code == 200 and [m["id"] for m in listed.json()["data"]] == [model["name"]]
    logs = gw.admin("GET", f"/admin/logs?user_id={user['id']}").json()["logs"]
    assert logs and all(r["token_issuer"] == issuer.name and r["key_id"] is None for r in logs)


def _refused(gw: Gateway, model: dict, token: str) -> tuple[str, str]:
    mesh = gw.client.post("/v1/proxy", params={"model": model["name"]}, json={"query": "hi"},
                          headers={"authorization": f"Bearer {token}"})
    entry = gw.client.post("/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                           json={"model": model["name"], "messages": [{"role": "user", "content": "hi"}]})
    assert mesh.status_code == entry.status_code == 401, (mesh.text, entry.text)
    assert entry.json()["error"]["code"] == mesh.json()["error"], (mesh.text, entry.text)
    row = gw.fetch_row(mesh.headers["x-request-id"])
    assert (row["outcome"], row["deny_reason"], row["user_id"]) == ("denied", mesh.json()["error"], None)
    assert token not in entry.text and token not in mesh.text
    return mesh.json()["error"], entry.json()["error"]["type"]


def test_every_refusal_is_a_401_with_its_code(gw: Gateway, model: dict, issuer: Issuer) -> None:
    user = _person(gw, model)
    email, rsa_key = user["email"], issuer.keys["rsa-1"]
    stranger = new_key("RS256", "rsa-1")  # the right kid, the wrong key
    good = issuer.token(email, rsa_key)
    head, body, sig = good.split(".")
    cases = {
        "bad signature": (issuer.token(email, stranger), "invalid_token"),
        "tampered claims": (f"{head}.{issuer.token(email + 'x', rsa_key).split('.')[1]}.{sig}", "invalid_token"),
        "alg none": (unsigned(issuer, email, "rsa-1"), "invalid_token"),
        "HS256 keyed with the public key": (hs256_with_public_key(issuer, rsa_key, email), "invalid_token"),
        "RS256 header on an EC key": (issuer.token(email, issuer.keys["ec-1"], {"alg": "RS256"}),
                                      "invalid_token"),
        "malformed": ("eyJhbGciOi.not-base64!.x", "invalid_token"),
        "unknown kid": (issuer.token(email, new_key("ES256", "ec-404")), "unknown_key"),
        "expired": (issuer.token(email, rsa_key, exp=int(time.time()) - 60), "token_expired"),
        "not yet valid": (issuer.token(email, rsa_key, nbf=int(time.time()) + 600), "invalid_token"),
        "no expiry": (issuer.token(email, rsa_key, exp=None), "invalid_token"),
        "wrong audience": (issuer.token(email, rsa_key, aud="someone-else"), "wrong_audience"),
        "unknown issuer": (Issuer("https://nobody.example.com", keys={"k": rsa_key}).token(email, rsa_key),
                           "unknown_issuer"),
        "unknown person": (issuer.token("nobody-" + email, rsa_key), "unknown_principal"),
    }
    for what, (token, code) in cases.items():
        got, kind = _refused(gw, model, token)
        assert got == code, what
        assert kind == "authentication_error", what
    # Within the clock skew (5 s) an expired token still passes; the audience may be a list.
    assert _chat(gw, model, issuer.token(email, rsa_key, exp=int(time.time()) - 2)) == 200
    assert _chat(gw, model, issuer.token(email, rsa_key, aud=["x", "other"])) == 200
    # A revoked person's valid token is refused at once, on every worker (a cached verdict too).
    token = issuer.token(email, rsa_key)
    assert _chat(gw, model, token) == 200
    assert gw.admin("POST", f"/admin/users/{user['id']}/revoke").status_code == 200
    pinned = WorkerConnections(gw)
    try:
        until(lambda: _everywhere(pinned, token, 401), 1.0, "the revoked person's token refused everywhere")
    finally:
        pinned.close()


def _chat(gw: Gateway, model: dict, token: str) -> int:
    return gw.client.post("/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                          json={"model": model["name"], "messages": [{"role": "user", "content": "hi"}]}).status_code


def test_issuers_are_validated_listed_and_deleted(gw: Gateway, model: dict) -> None:
    iss = Issuer(f"https://idp-{secrets.token_hex(3)}.example.com", keys={"k": new_key("ES256", "k")})
    base = {"issuer": iss.name, "audiences": [iss.audience], "algorithms": ["ES256"], "claims": {"email": "email"},
            "jwks": jwks(*iss.keys.values())}
    bad = [
        ({**base, "algorithms": ["HS256"]}, "HS256"),
        ({**base, "jwks_url": "https://idp.example.com/jwks"}, "exactly one of jwks_url and jwks"),
        ({**base, "jwks": None, "jwks_url": "http://127.0.0.1:9/jwks.json"}, "local"),
        ({**base, "jwks": {"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}}, "no usable key"),
        ({**base, "jwks": {"nope": 1}}, "jwks"),
        ({**base, "issuer": "meshfast"}, "meshfast's own"),
        ({**base, "claims": {"email": "a b"}}, "claim name"),
        ({**base, "issuer": "x\u0000y"}, "issuer"),
        ({**base, "clock_skew_s": 99999}, ""),
        ({**base, "surprise": 1}, ""),
    ]
    for body, needle in bad:
        r = gw.admin("POST", "/admin/issuers", {k: v for k, v in body.items() if v is not None})
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"] == "invalid_request" and needle in r.text, r.text
    created = gw.admin("POST", "/admin/issuers", base)
    assert created.status_code == 201, created.text
    assert gw.admin("POST", "/admin/issuers", base).status_code == 409
    issuer_id = created.json()["id"]
    assert gw.admin("GET", f"/admin/issuers/{issuer_id}").json()["issuer"] == iss.name
    assert iss.name in [i["issuer"] for i in gw.admin("GET", "/admin/issuers").json()]
    assert gw.admin("GET", "/admin/issuers/not-a-uuid").status_code == 404
    user = _person(gw, model)
    token = iss.token(user["email"])
    assert _chat(gw, model, token) == 200
    assert gw.admin("DELETE", f"/admin/issuers/{issuer_id}").status_code == 200
    assert gw.admin("DELETE", f"/admin/issuers/{issuer_id}").status_code == 404
    pinned = WorkerConnections(gw)
    try:
        until(lambda: _everywhere(pinned, token, 401), 1.0, "a deleted issuer's tokens refused everywhere")
    finally:
        pinned.close()
    assert _refused(gw, model, token)[0] == "unknown_issuer"
    # Only a platform administrator may trust an issuer.
    limited = gw.admin("POST", "/admin/tokens", {"name": "limited", "is_super": False}).json()["token"]
    assert gw.admin("POST", "/admin/issuers", base, token=limited).status_code == 403


def test_a_fetched_key_set_rotates_and_fails_closed_when_too_old(gw: Gateway, model: dict) -> None:
    server = JwksServer()
    try:
        iss = Issuer(f"https://idp-{secrets.token_hex(3)}.example.com")
        old, new = new_key("RS256", "2026-a"), new_key("RS256", "2026-b")
        server.document = jwks(old)
        created = gw.admin("POST", "/admin/issuers", {
            "issuer": iss.name, "audiences": [iss.audience], "algorithms": ["RS256"], "jwks_url": server.url,
            "local": True, "claims": {"email": "email"}})
        assert created.status_code == 201, created.text
        user = _person(gw, model)
        until(lambda: _chat(gw, model, iss.token(user["email"], old)) == 200, 10, "the first fetch")
        # Rotation: the provider publishes a new key and drops the old one; a token signed with
        # the new key is picked up (an unknown kid asks for an early fetch), the old one is refused.
        server.document = jwks(new)
        until(lambda: _chat(gw, model, iss.token(user["email"], new)) == 200, 10, "the rotated key")
        until(lambda: _chat(gw, model, iss.token(user["email"], old)) == 401, 10, "the old key dropped")
        assert _refused(gw, model, iss.token(user["email"], old))[0] == "unknown_key"
        # The set's URL fails: the last good set serves on, then fails closed after its max age.
        server.failing = True
        token = iss.token(user["email"], new)
        assert _chat(gw, model, token) == 200
        failing_since = time.monotonic()
        until(lambda: gw.admin("GET", f"/admin/issuers/{created.json()['id']}").json()["fetch_error"], 10,
              "the failure recorded")
        until(lambda: _chat(gw, model, token) == 401, MAX_AGE_S + 10, "failing closed")
        assert time.monotonic() - failing_since >= MAX_AGE_S / 2 - 1, "not before the set was too old"
        assert _refused(gw, model, token)[0] == "unknown_key"
        # The URL answers again: tokens pass again.
        server.failing = False
        until(lambda: _chat(gw, model, token) == 200, 10, "recovered")
    finally:
        server.close()


def test_a_person_is_provisioned_just_in_time_from_the_claims(gw: Gateway, model: dict) -> None:
    iss = Issuer(f"https://idp-{secrets.token_hex(3)}.example.com", keys={"e": new_key("EdDSA", "e")})
    assert gw.admin("POST", "/admin/issuers", {
        "issuer": iss.name, "audiences": [iss.audience], "algorithms": ["EdDSA"], "jwks": jwks(*iss.keys.values()),
        "jit_provisioning": True,
        "claims": {"email": "upn", "display_name": "name", "business_unit": "dept", "tier": "level"}}).status_code == 201
    email = f"jit-{secrets.token_hex(3)}@example.com"
    token = iss.token(email, upn=email.upper(), email=None, name="Jit Person", dept="Payments", level="gold")
    # Known now, with no grant: authenticated (403), not refused (401).
    r = gw.client.post("/v1/proxy", params={"model": model["name"]}, json={"query": "hi"},
                       headers={"authorization": f"Bearer {token}"})
    assert (r.status_code, r.json()["error"]) == (403, "model_not_permitted"), r.text
    person = next(u for u in gw.admin("GET", "/admin/users").json() if u["email"] == email)
    assert (person["display_name"], person["business_unit"], person["tier"]) == ("Jit Person", "Payments", "gold")
    gw.grant(person["id"], model["id"])
    assert _chat(gw, model, token) == 200
    audit = gw.admin("GET", "/admin/audit?action=jit_provision_user").json()["entries"]
    assert any(e["target"] == email for e in audit)
    # An email no person could be stored under (whitespace, a look-alike letter) provisions nobody.
    for odd in (f"odd {email}", f"\u212a{email}"):
        r = gw.client.post("/v1/proxy", params={"model": model["name"]}, json={"query": "hi"},
                           headers={"authorization": f"Bearer {iss.token(odd, None, None, upn=odd, email=None)}"})
        assert (r.status_code, r.json()["error"]) == (401, "unknown_principal"), r.text
    assert not [u for u in gw.admin("GET", "/admin/users").json() if "odd" in u["email"] or "\u212a" in u["email"]]
    # Claims only seed: meshfast's records decide afterwards.
    assert gw.admin("PUT", f"/admin/users/{person['id']}", {"business_unit": "Risk"},
                    ).status_code in (200, 428)


def test_meshfast_mints_short_lived_tokens_for_a_logged_in_admin(gw: Gateway, model: dict) -> None:
    email, password = f"dev-{secrets.token_hex(3)}@example.com", "correct horse battery staple 42"
    assert gw.admin("POST", "/admin/admins", {"email": email, "password": password}).status_code == 201
    client = httpx.Client(base_url=gw.base_url, timeout=10)
    login = client.post("/admin/login", json={"email": email, "password": password})
    assert login.status_code == 200, login.text
    csrf = login.json()["csrf_token"]
    # No user with the admin's email yet.
    assert client.post("/admin/session-token", headers={"x-csrf-token": csrf}).status_code == 404
    user = gw.create_user(email)
    gw.grant(user["id"], model["id"])
    minted = client.post("/admin/session-token", headers={"x-csrf-token": csrf})
    assert minted.status_code == 201, minted.text
    token = minted.json()["token"]
    assert minted.json()["expires_in"] <= 900 and minted.json()["user_id"] == user["id"]
    until(lambda: _chat(gw, model, token) == 200, 2.0, "the minted token works")
    published = gw.client.get("/.well-known/jwks.json").json()
    assert published["keys"][0]["kty"] == "OKP" and "d" not in published["keys"][0]
    # An admin token has no user of its own.
    assert gw.admin("POST", "/admin/session-token").status_code == 403
    client.close()


def test_the_cli_adds_lists_and_removes_issuers(gw: Gateway, model: dict, tmp_path: Any) -> None:
    import json
    import subprocess
    import sys

    def cli(*args: str, ok: bool = True) -> Any:
        result = subprocess.run([sys.executable, "-m", "meshfast.cli", "issuers", *args, "--json"],
                                env=gw.env(), capture_output=True, text=True, timeout=60)
        assert (result.returncode == 0) == ok, result.stderr
        return json.loads(result.stdout) if ok else result.stderr

    iss = Issuer(f"https://cli-{secrets.token_hex(3)}.example.com", keys={"k": new_key("ES256", "k")})
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks(*iss.keys.values())))
    made = cli("add", "--issuer", iss.name, "--audience", iss.audience, "--algorithm", "ES256", "--jwks-file",
               str(path), "--claim", "email=mail")
    assert made["claims"] == {"email": "mail"} and [k["kid"] for k in made["keys"]] == ["k"]
    user = _person(gw, model)
    token = iss.token(user["email"], None, None, mail=user["email"], email=None)
    until(lambda: _chat(gw, model, token) == 200, 2.0, "the CLI's issuer on the data plane")
    assert made["id"] in [i["id"] for i in cli("list")]
    assert "invalid_request" in cli("add", "--issuer", iss.name + "/2", "--audience", "a", "--algorithm", "ES256",
                                    "--jwks-url", "http://10.0.0.1/jwks", ok=False)
    assert cli("remove", made["id"]) == {"status": "deleted"}
    until(lambda: _chat(gw, model, token) == 401, 2.0, "removed")
