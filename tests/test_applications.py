"""Applications as principals (issue "identity", item 1): an application has an owner, a business
unit, its own keys, grants, per-model policies and spend rules, and its rows and summaries carry its
id; on a real two-worker gateway with testserve and the official SDK.

As in test_rules: input is free and each call asks `max_tokens: 3` for a prompt testserve answers
in exactly three output tokens at $1 per 1k, so every call costs $0.003."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest
from conftest import EmulatedProviders, Gateway, WorkerConnections, until
from jwtkit import Issuer, jwks, new_key

CALL_USD = Decimal("0.003")
PROMPT, MAX_TOKENS = "hello", 3


def _tag() -> str:
    return secrets.token_hex(3)


@pytest.fixture(scope="module")
def model(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    provider = gateway.create_provider(f"app-p-{_tag()}", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key")
    return gateway.create_model(provider["id"], f"app-m-{_tag()}", resolved_model="dummy-chat",
                                input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")


def _app(gateway: Gateway, owner: dict[str, Any] | None = None, **body: Any) -> dict[str, Any]:
    owner = owner or gateway.create_user()
    r = gateway.admin("POST", "/admin/applications",
                      {"name": f"app {_tag()}", "owner_id": owner["id"], **body})
    assert r.status_code == 201, r.text
    return r.json()


def _grant(gateway: Gateway, app: dict[str, Any], model: dict[str, Any]) -> None:
    r = gateway.admin("POST", "/admin/access", {"application_id": app["id"], "model_id": model["id"]})
    assert r.status_code == 200, r.text


def _call(gateway: Gateway, key: str, model: dict[str, Any], tags: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", **({"x-meshfast-tags": tags} if tags else {})}
    return gateway.client.post("/v1/proxy", params={"model": model["name"]},
                               json={"query": PROMPT, "max_tokens": MAX_TOKENS}, headers=headers)


def _everywhere(gateway: Gateway, key: str, status: int) -> bool:
    pinned = WorkerConnections(gateway)
    try:
        return all(s == status for s, _ in pinned.get_all("/v1/models", {"authorization": f"Bearer {key}"}).values())
    finally:
        pinned.close()


def test_an_application_calls_with_its_own_key_and_its_rows_carry_its_id(gateway: Gateway, model: dict) -> None:
    """Created with a key shown once; granted a model; the official SDK calls with its key; the row
    names it (principal_kind application, application_id, key id, its business unit) and the
    summary groups by it. It is not a user: /admin/users neither lists nor finds it."""
    owner = gateway.create_user()
    app = _app(gateway, owner, business_unit="payments")
    assert app["key"].startswith("mesh_live_") and app["key"].startswith(app["key_prefix"].rstrip("."))
    assert (app["owner_id"], app["business_unit"]) == (owner["id"], "payments")
    _grant(gateway, app, model)
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=app["key"], max_retries=0)
    raw = until(lambda: _sdk_call(client, model), 3.0, "the grant on the worker")
    assert raw.parse().choices[0].message.content
    row = gateway.fetch_row(raw.headers["x-request-id"])
    assert (row["outcome"], str(row["user_id"]), row["principal_kind"]) == ("success", app["id"], "application")
    assert row["business_unit"] == "payments" and row["mesh_key_id"] is not None

    logs = gateway.admin("GET", f"/admin/logs?user_id={app['id']}").json()["logs"]
    assert logs and all(entry["application_id"] == app["id"] and entry["principal_kind"] == "application"
                        for entry in logs)
    summary = until(lambda: _group(gateway, "application_id", app["id"]), 10.0, "the rollup")
    assert summary["calls"] >= 1
    # The CSV export carries it too.
    csv = gateway.admin("GET", f"/admin/logs/export.csv?user_id={app['id']}").text
    header, first = csv.splitlines()[:2]
    assert first.split(",")[header.split(",").index("application_id")] == app["id"]

    listed = {a["id"]: a for a in gateway.admin("GET", "/admin/applications").json()}
    assert listed[app["id"]]["owner_email"] == owner["email"] and listed[app["id"]]["key_prefix"] == app["key_prefix"]
    assert "key" not in listed[app["id"]]
    got = gateway.admin("GET", f"/admin/applications/{app['id']}")
    assert got.status_code == 200 and got.headers["etag"] == f'"{got.json()["version"]}"'
    assert app["id"] not in {u["id"] for u in gateway.admin("GET", "/admin/users").json()}
    assert gateway.admin("GET", f"/admin/users/{app['id']}").json()["error"] == "user_not_found"
    assert gateway.admin("POST", f"/admin/users/{app['id']}/keys", {"name": "x"}).status_code == 404
    assert gateway.admin("GET", f"/admin/applications/{owner['id']}").json()["error"] == \
        "application_not_found"
    assert gateway.admin("POST", f"/admin/applications/{owner['id']}/keys", {"name": "x"}).status_code == 404


def _sdk_call(client: openai.OpenAI, model: dict[str, Any]) -> Any:
    try:
        return client.chat.completions.with_raw_response.create(
            model=model["name"], messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS)
    except openai.APIStatusError:
        return None


def _group(gateway: Gateway, group_by: str, key: str) -> dict[str, Any] | None:
    body = gateway.admin("GET", f"/admin/logs/summary?group_by={group_by}").json()
    return next((g for g in body["groups"] if g["key"] == key), None)


def test_named_keys_rotation_status_and_deletion_of_an_application(gateway: Gateway, model: dict) -> None:
    """Named keys with a model subset; a rotation with an overlap; a revoked application is refused
    on every worker within a second and works again once active; a deleted one is gone."""
    app = _app(gateway)
    _grant(gateway, app, model)
    named = gateway.admin("POST", f"/admin/applications/{app['id']}/keys", {"name": "ci", "models": [model["id"]]})
    assert named.status_code == 201, named.text
    key = named.json()["key"]
    until(lambda: _call(gateway, key, model).status_code == 200, 3.0, "the named key")
    keys = gateway.admin("GET", f"/admin/applications/{app['id']}/keys").json()
    assert {k["name"] for k in keys} == {None, "ci"} and all("key" not in k for k in keys)
    rotated = gateway.admin("POST", f"/admin/keys/{named.json()['id']}/rotate", {"overlap_s": 60})
    assert rotated.status_code == 200, rotated.text
    until(lambda: _everywhere(gateway, rotated.json()["key"], 200), 1.5, "the successor everywhere")
    assert _everywhere(gateway, key, 200), "the old key works for its overlap"

    revoked = gateway.admin("PUT", f"/admin/applications/{app['id']}", {"status": "revoked"})
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked", revoked.text
    until(lambda: _everywhere(gateway, app["key"], 401), 1.0, "refused on every worker")
    etag = gateway.admin("GET", f"/admin/applications/{app['id']}").headers["etag"]
    stale = gateway.client.put(f"/admin/applications/{app['id']}", json={"status": "active"},
                               headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": '"1"'})
    assert stale.status_code == 409 and stale.json()["error"] == "version_conflict"
    active = gateway.client.put(f"/admin/applications/{app['id']}", json={"status": "active", "business_unit": "ops"},
                                headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": etag})
    assert active.status_code == 200 and active.json()["business_unit"] == "ops", active.text
    until(lambda: _everywhere(gateway, app["key"], 200), 1.0, "served again")
    response = _call(gateway, app["key"], model)
    assert gateway.fetch_row(response.headers["x-request-id"])["business_unit"] == "ops"

    assert gateway.admin("DELETE", f"/admin/applications/{app['id']}").json() == {"status": "deleted"}
    until(lambda: _everywhere(gateway, app["key"], 401), 1.0, "a deleted application's key")
    assert gateway.admin("GET", f"/admin/applications/{app['id']}").status_code == 404
    assert gateway.admin("DELETE", f"/admin/applications/{app['id']}").status_code == 404


def test_bad_applications_get_a_clear_400_and_owners_cannot_vanish(gateway: Gateway, model: dict) -> None:
    owner = gateway.create_user()
    base = {"name": f"ok {_tag()}", "owner_id": owner["id"]}
    for bad in ({"name": ""}, {"name": " "}, {"name": "a\u0000b"}, {"name": "x" * 65}, {"name": "-lead"},
                {"name": "caf\u00e9"}, {"name": "3f2a8c2e-5e0b-4c4a-9d1e-0f6f0f6f0f6f"}, {"name": 7},
                {"owner_id": "nope"}, {"owner_id": "3f2a8c2e-5e0b-4c4a-9d1e-0f6f0f6f0f6f"},
                {"business_unit": ""}, {"business_unit": "\ud800"}, {"extra": 1}):
        r = gateway.client.post("/admin/applications", content=json.dumps({**base, **bad}),
                                headers={"authorization": f"Bearer {gateway.admin_token}",
                                         "content-type": "application/json"})
        assert r.status_code == 400, (bad, r.status_code, r.text)
        assert r.json()["error"] in ("invalid_request", "validation_error"), r.text
    app = _app(gateway, owner, name=f"Billing {_tag()}")
    # An application owns nothing, and is never an owner.
    assert gateway.admin("POST", "/admin/applications", {"name": f"n {_tag()}", "owner_id": app["id"]}
                         ).status_code == 400
    dup = gateway.admin("POST", "/admin/applications", {"name": app["name"].upper(), "owner_id": owner["id"]})
    assert dup.status_code == 409 and dup.json()["error"] == "application_already_exists"
    # A grant names one principal; an application's id is not a user's, nor the reverse.
    both = gateway.admin("POST", "/admin/access", {"user_id": owner["id"], "application_id": app["id"],
                                                   "model_id": model["id"]})
    assert both.status_code == 400
    assert gateway.admin("POST", "/admin/access", {"user_id": app["id"], "model_id": model["id"]}).status_code == 404
    assert gateway.admin("POST", "/admin/access", {"application_id": owner["id"], "model_id": model["id"]}
                         ).json()["error"] == "application_not_found"
    # A revocation names the grant's principal by its kind too.
    gateway.grant(owner["id"], model["id"])
    _grant(gateway, app, model)
    assert gateway.admin("DELETE", "/admin/access", {"application_id": owner["id"], "model_id": model["id"]}
                         ).json()["error"] == "application_not_found"
    assert gateway.admin("DELETE", "/admin/access", {"user_id": app["id"], "model_id": model["id"]}
                         ).json()["error"] == "user_not_found"
    assert gateway.admin("DELETE", "/admin/access", {"application_id": app["id"], "model_id": model["id"]}
                         ).status_code == 200
    refused = gateway.admin("DELETE", f"/admin/users/{owner['id']}")
    assert refused.status_code == 409 and refused.json()["error"] == "user_owns_applications"
    other = gateway.create_user()
    moved = gateway.admin("PUT", f"/admin/applications/{app['id']}", {"owner_id": other["id"]})
    assert moved.status_code == 200 and moved.json()["owner_email"] == other["email"]
    assert gateway.admin("DELETE", f"/admin/users/{owner['id']}").status_code == 200


def test_an_applications_policy_caps_it_and_spend_rules_select_it(gateway: Gateway, model: dict) -> None:
    """A per-model policy's hourly call cap holds the application; a rule whose population lists
    the application blocks it past its threshold while a person on the same model goes on."""
    capped = _app(gateway)
    _grant(gateway, capped, model)
    policy = gateway.admin("PUT", f"/admin/applications/{capped['id']}/policies/{model['id']}",
                           {"daily_cap_usd": "5", "max_calls_per_hour": 2})
    assert policy.status_code == 200, policy.text
    assert gateway.admin("GET", f"/admin/applications/{capped['id']}/policies").json()[0]["max_calls_per_hour"] == 2
    until(lambda: _call(gateway, capped["key"], model).status_code == 200, 3.0, "the policy")
    statuses = [_call(gateway, capped["key"], model).status_code for _ in range(3)]
    assert statuses.count(200) <= 1 and 429 in statuses, statuses

    app, person = _app(gateway), gateway.create_user()
    _grant(gateway, app, model)
    gateway.grant(person["id"], model["id"])
    rule_id = f"apps-{_tag()}"
    entry = {"population": {"applications": [app["id"]]}, "scope": {"model": model["name"]}, "window": "daily",
             "threshold_usd": str(2 * CALL_USD), "actions": [{"type": "block"}]}
    created = gateway.admin("POST", "/admin/rules", {"id": rule_id, "mode": "enforce", "weight": 5,
                                                     "entries": [entry]})
    assert created.status_code == 201, created.text
    assert created.json()["entries"][0]["population"]["applications"] == [app["id"]]
    usage = lambda: gateway.client.get("/v1/usage", headers={"authorization": f"Bearer {app['key']}"}).json()  # noqa: E731
    until(lambda: rule_id in {r["id"] for r in usage().get("rules", [])}, 3.0, "the rule on the worker")
    statuses = [_call(gateway, app["key"], model).status_code for _ in range(4)]
    assert statuses == [200, 200, 429, 429], statuses
    assert all(_call(gateway, person["key"], model).status_code == 200 for _ in range(3))
    # A population's applications are applications; a leader is a person; an application may be
    # exempted as a person is.
    exempt = gateway.admin("POST", "/admin/rules", {"id": f"ex-{_tag()}", "mode": "shadow", "entries": [
        {**entry, "population": {"business_units": ["nobody"], "exempt_users": [app["id"], person["id"]]}}]})
    assert exempt.status_code == 201, exempt.text
    gateway.admin("DELETE", f"/admin/rules/{exempt.json()['id']}")
    for population in ({"applications": [person["id"]]}, {"leaders": [app["id"]]}, {"applications": ["x"]},
                       {"applications": {}}, {"applications": ""}, {"applications": 0}, {"applications": False}):
        bad = gateway.admin("POST", "/admin/rules", {"id": f"bad-{_tag()}", "entries": [{**entry,
                                                                                       "population": population}]})
        assert bad.status_code == 400, (population, bad.text)
    gateway.admin("DELETE", f"/admin/rules/{rule_id}")


def test_a_workflow_may_list_applications_as_its_principals(gateway: Gateway, model: dict) -> None:
    app, other = _app(gateway), _app(gateway)
    for a in (app, other):
        _grant(gateway, a, model)
    wf = gateway.admin("POST", "/admin/workflows", {"id": f"wf-{_tag()}", "limit_usd": "1", "window": "daily",
                                                    "principals": [{"application_id": app["id"]}]})
    assert wf.status_code == 201, wf.text
    tags = f"workflow={wf.json()['id']}"
    until(lambda: _call(gateway, app["key"], model, tags).status_code == 200, 3.0, "the workflow")
    refused = _call(gateway, other["key"], model, tags)
    assert refused.status_code == 403 and refused.json()["error"] == "workflow_not_permitted"
    person = gateway.create_user()
    bad = gateway.admin("POST", "/admin/workflows", {"id": f"wf-{_tag()}", "limit_usd": "1", "window": "daily",
                                                     "principals": [{"application_id": person["id"]}]})
    assert bad.status_code == 400, bad.text


@pytest.fixture(scope="module")
def app_issuer(gateway: Gateway) -> Iterator[Issuer]:
    iss = Issuer(f"https://apps-{_tag()}.example.com")
    iss.keys["ed-1"] = new_key("EdDSA", "ed-1")
    created = gateway.admin("POST", "/admin/issuers", {
        "issuer": iss.name, "audiences": [iss.audience], "algorithms": ["EdDSA"], "jwks": jwks(*iss.keys.values()),
        "claims": {"email": "email", "application": "client_app"}})
    assert created.status_code == 201, created.text
    yield iss
    gateway.admin("DELETE", f"/admin/issuers/{created.json()['id']}")


def test_a_platform_token_names_an_application_by_its_claim(gateway: Gateway, model: dict,
                                                            app_issuer: Issuer) -> None:
    """The issuer maps `client_app`: a token carrying it is the application's (by name, any case,
    or by id); an application nobody registered is 401 unknown_principal, never provisioned; a
    token without the claim is the person's, as before."""
    app = _app(gateway, name=f"Reports {_tag()}")
    _grant(gateway, app, model)
    for value in (app["name"].lower(), app["id"]):
        token = app_issuer.token("", None, None, email=None, client_app=value)
        response = until(lambda t=token: (r := _call(gateway, t, model)).status_code == 200 and r, 3.0, "the token")
        row = gateway.fetch_row(response.headers["x-request-id"])
        assert (str(row["user_id"]), row["principal_kind"], row["token_issuer"]) == (
            app["id"], "application", app_issuer.name)
    unknown = _call(gateway, app_issuer.token("", None, None, email=None, client_app="nobody"), model)
    assert unknown.status_code == 401 and unknown.json()["error"] == "unknown_principal"
    person = gateway.create_user()
    gateway.grant(person["id"], model["id"])
    response = until(lambda: (r := _call(gateway, app_issuer.token(person["email"]), model)).status_code == 200 and r,
                     3.0, "the person's token")
    assert gateway.fetch_row(response.headers["x-request-id"])["principal_kind"] == "user"
    # A person's token that also carries the claim (identity providers put the client's id in
    # people's tokens) stays the person's: they never spend as the application.
    both = _call(gateway, app_issuer.token(person["email"], None, None, client_app=app["name"]), model)
    row = gateway.fetch_row(both.headers["x-request-id"])
    assert (both.status_code, str(row["user_id"]), row["principal_kind"]) == (200, person["id"], "user")
    same = gateway.admin("POST", "/admin/issuers", {
        "issuer": f"https://same-{_tag()}.example.com", "audiences": ["a"], "algorithms": ["EdDSA"],
        "jwks": jwks(new_key("EdDSA", "k")), "claims": {"email": "sub", "application": "sub"}})
    assert same.status_code == 400 and "claims.application" in same.text, same.text


def test_the_cli_adds_grants_lists_and_removes_applications(gateway: Gateway, model: dict) -> None:
    owner = gateway.create_user()
    name = f"cli {_tag()}"

    def cli(*args: str, ok: bool = True) -> Any:
        result = subprocess.run([sys.executable, "-m", "meshfast.cli", "applications", *args, "--json"],
                                env=gateway.env(), capture_output=True, text=True, timeout=60)
        assert (result.returncode == 0) == ok, result.stderr
        return json.loads(result.stdout) if ok else result.stderr

    made = cli("add", name, "--owner", owner["email"].upper(), "--business-unit", "data")
    assert (made["name"], made["owner_id"], made["business_unit"]) == (name, owner["id"], "data")
    assert made["key"].startswith("mesh_live_")
    assert cli("grant", name.upper(), model["id"]) == {"status": "ok"}
    until(lambda: _call(gateway, made["key"], model).status_code == 200, 3.0, "the grant")
    listed = {a["name"]: a for a in cli("list")}
    assert listed[name]["owner_email"] == owner["email"] and "key" not in listed[name]
    assert cli("remove", made["id"]) == {"status": "deleted"}
    assert "no application" in cli("remove", name, ok=False)
    assert "no user" in cli("add", "other", "--owner", "nobody@example.com", ok=False)


def test_a_registry_file_registers_applications_and_their_grants(gateway: Gateway, model: dict,
                                                                 fresh_dir: Any) -> None:
    """`meshfast apply` with `applications`: created without a key (one is issued through the API),
    granted the models listed, updated by name in any case, idempotent; an unknown owner or model
    refuses the whole file."""
    owner, other = gateway.create_user(), gateway.create_user()
    name = f"File App {_tag()}"
    path = fresh_dir / "apps.json"

    def apply(entries: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
        path.write_text(json.dumps({"applications": entries}))
        return subprocess.run([sys.executable, "-m", "meshfast.cli", "apply", str(path), "--json"],
                              env=dict(gateway.env(), DATABASE_URL=gateway.database_url), capture_output=True,
                              text=True, timeout=120)

    done = apply([{"name": name, "owner_email": owner["email"], "business_unit": "risk", "models": [model["name"]]}])
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(done.stdout)["created"]) == sorted([f"application {name}",
                                                                 f"grant {name} -> {model['name']}"])
    app = next(a for a in gateway.admin("GET", "/admin/applications").json() if a["name"] == name)
    assert (app["owner_id"], app["business_unit"], app["key_prefix"]) == (owner["id"], "risk", None)
    key = gateway.admin("POST", f"/admin/applications/{app['id']}/keys", {"name": "svc"}).json()["key"]
    until(lambda: _call(gateway, key, model).status_code == 200, 3.0, "the file's grant")

    again = apply([{"name": name.upper(), "owner_email": owner["email"], "models": [model["name"]]}])
    assert json.loads(again.stdout)["created"] == [] and json.loads(again.stdout)["updated"] == []
    moved = apply([{"name": name.lower(), "owner_email": other["email"], "business_unit": None}])
    assert json.loads(moved.stdout)["updated"] == [f"application {name.lower()}"]
    got = gateway.admin("GET", f"/admin/applications/{app['id']}").json()
    assert (got["name"], got["owner_id"], got["business_unit"]) == (name, other["id"], None)

    refused = apply([{"name": f"x {_tag()}", "owner_email": "nobody@example.com", "models": ["no-such-model"]},
                     {"name": "bad\u0000name", "owner_email": owner["email"]}])
    assert refused.returncode == 1 and "nothing applied" in refused.stderr
    assert "applications[1]" in refused.stderr, refused.stderr
    refused = apply([{"name": f"x {_tag()}", "owner_email": "nobody@example.com", "models": ["no-such-model"]}])
    assert refused.returncode == 1
    assert "is not a registered user" in refused.stderr and "no-such-model" in refused.stderr, refused.stderr


def test_a_registry_file_registers_issuers_and_workflows(gateway: Gateway, model: dict, fresh_dir: Any) -> None:
    """`issuers` and `workflows` in a registry file: created, updated in place by their issuer or
    id, unchanged on a second apply; a bad entry refuses the whole file with its problems."""
    app = _app(gateway)
    _grant(gateway, app, model)
    iss = Issuer(f"https://file-{_tag()}.example.com")
    iss.keys["ed-1"] = new_key("EdDSA", "ed-1")
    workflow = f"file-wf-{_tag()}"
    path = fresh_dir / "identity.json"
    issuer_entry = {"issuer": iss.name, "audiences": [iss.audience], "algorithms": ["EdDSA"],
                    "jwks": jwks(*iss.keys.values()), "claims": {"email": "email", "application": "client_app"}}
    workflow_entry = {"id": workflow, "limit_usd": "0.006", "window": "daily",
                      "principals": [{"application_id": app["id"]}]}

    def apply(body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        path.write_text(json.dumps(body))
        return subprocess.run([sys.executable, "-m", "meshfast.cli", "apply", str(path), "--json"],
                              env=dict(gateway.env(), DATABASE_URL=gateway.database_url), capture_output=True,
                              text=True, timeout=120)

    done = apply({"issuers": [issuer_entry], "workflows": [workflow_entry]})
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(done.stdout)["created"]) == [f"issuer {iss.name}", f"workflow {workflow}"]
    token = iss.token("", None, None, email=None, client_app=app["name"])
    tags = f"workflow={workflow}"
    until(lambda: _call(gateway, token, model, tags).status_code == 200, 3.0, "the file's issuer")
    assert _call(gateway, token, model, tags).status_code == 200
    over = _call(gateway, token, model, tags)
    assert over.status_code == 429 and over.json()["workflow"] == workflow, over.text

    again = apply({"issuers": [issuer_entry], "workflows": [workflow_entry]})
    assert json.loads(again.stdout)["unchanged"] == [f"issuer {iss.name}", f"workflow {workflow}"]
    raised = apply({"workflows": [{**workflow_entry, "limit_usd": "1"}]})
    assert json.loads(raised.stdout)["updated"] == [f"workflow {workflow}"]
    until(lambda: _call(gateway, token, model, tags).status_code == 200, 3.0, "the raised limit")
    listed = {w["id"]: w for w in gateway.admin("GET", "/admin/workflows").json()}
    assert listed[workflow]["limit_usd"] == 1.0

    refused = apply({"issuers": [{**issuer_entry, "algorithms": ["HS256"]}],
                     "workflows": [{**workflow_entry, "window": "hourly"}, {"id": "x", "limit_usd": "1"}]})
    assert refused.returncode == 1 and "nothing applied" in refused.stderr
    for needle in ("issuers[0]", "HS256", "workflows[0]", "window", "workflows[1]"):
        assert needle in refused.stderr, (needle, refused.stderr)
