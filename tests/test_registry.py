"""The registry as validated data (Cosmos §6): prices per token class and a long-context tier,
aliases and tags, deployments with one failover, the serviceability invariant, a failed reload
that keeps the last good snapshot, and registry files (`meshfast apply`, `serve --registry`).
Real gateway processes, real PostgreSQL, testserve upstreams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from conftest import SESSION_ENV, EmulatedProviders, Gateway, free_port

from testserve.content import CACHE_READ_TOKENS, CACHE_WRITE_1H_TOKENS, CACHE_WRITE_TOKENS

NANO = Decimal("1e-9")


def _tag() -> str:
    return secrets.token_hex(4)


def _provider(gateway: Gateway, testserve: EmulatedProviders, family: str, prefix: str, **extra: Any) -> dict[str, Any]:
    return gateway.create_provider(f"reg-{family}-{_tag()}", family=family, base_url=f"{testserve.base_url}/{prefix}",
                                   **extra)


def _user_key(gateway: Gateway, *model_ids: str) -> str:
    user = gateway.create_user()
    for model_id in model_ids:
        gateway.grant(user["id"], model_id)
    return user["key"]


def _proxy(gateway: Gateway, key: str, model: str, query: str = "hello registry") -> httpx.Response:
    return gateway.client.post(f"/v1/proxy?model={model}", json={"query": query},
                               headers={"authorization": f"Bearer {key}"}, timeout=30)


def _chat(gateway: Gateway, key: str, model: str, text: str = "hello registry") -> httpx.Response:
    return gateway.client.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                               json={"model": model, "messages": [{"role": "user", "content": text}]})


def _cost(tokens_and_prices: list[tuple[int, str]]) -> Decimal:
    """Σ tokens × USD-per-1k price / 1000, in nano-USD rounded half up: the reference."""
    exact = sum((Decimal(n) * Decimal(p) / 1000 for n, p in tokens_and_prices), Decimal(0))
    return (exact / NANO).quantize(Decimal(1), rounding=ROUND_HALF_UP) * NANO


async def _sql(gateway: Gateway, statement: str, *args: Any) -> None:
    conn = await asyncpg.connect(gateway.database_url)
    try:
        await conn.execute(statement, *args)
    finally:
        await conn.close()


def _wait_for(check: Any, timeout_s: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


# --- prices per token class ----------------------------------------------------------------


def test_price_fields_are_stored_returned_and_checked(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """Every price field round-trips through the admin API; bad ones are one 400 listing each."""
    provider = _provider(gateway, testserve, "anthropic", "anthropic")
    model = gateway.create_model(
        provider["id"], f"priced-{_tag()}", cache_read_price_per_1k_tokens="0.0003",
        cache_write_price_per_1k_tokens=0.00375, cache_write_1h_price_per_1k_tokens="0.006",
        long_context_threshold_tokens=200000,
        long_context_prices={"input_price_per_1k_tokens": "0.002", "output_price_per_1k_tokens": "0.004"})
    got = gateway.admin("GET", f"/admin/models/{model['id']}").json()
    assert (got["cache_read_price_per_1k_tokens"], got["cache_write_price_per_1k_tokens"],
            got["cache_write_1h_price_per_1k_tokens"]) == (0.0003, 0.00375, 0.006)
    assert got["long_context_threshold_tokens"] == 200000
    assert got["long_context_prices"] == {"input_price_per_1k_tokens": "0.002", "output_price_per_1k_tokens": "0.004"}

    r = gateway.admin("POST", "/admin/models", {
        "provider_id": provider["id"], "name": f"bad-{_tag()}", "resolved_model": "x", "verify": False,
        "cache_read_price_per_1k_tokens": -1, "long_context_prices": {"input": 1, "output_price_per_1k_tokens": -2}})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"] == "invalid_request"
    assert body["errors"] == [
        "long_context_threshold_tokens and long_context_prices go together",
        "long_context_prices takes input_price_per_1k_tokens, output_price_per_1k_tokens, "
        "cache_read_price_per_1k_tokens, cache_write_price_per_1k_tokens, cache_write_1h_price_per_1k_tokens; "
        "unknown: input",
        "cache_read_price_per_1k_tokens must be a non-negative number",
        "long_context_prices.output_price_per_1k_tokens must be a non-negative number",
    ]


def test_cached_tokens_are_priced_per_class_in_the_row(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """Cache reads, five-minute and one-hour cache writes reported by the upstream cost their own
    prices, summed exactly and rounded once; above the long-context threshold every class takes
    the long tier's price (a class the tier leaves out keeps the base one)."""
    provider = _provider(gateway, testserve, "anthropic", "anthropic")
    prices = {"input_price_per_1k_tokens": "0.003", "output_price_per_1k_tokens": "0.015",
              "cache_read_price_per_1k_tokens": "0.0003", "cache_write_price_per_1k_tokens": "0.00375",
              "cache_write_1h_price_per_1k_tokens": "0.006"}
    five_minute = CACHE_WRITE_TOKENS - CACHE_WRITE_1H_TOKENS
    long_prices = {"input_price_per_1k_tokens": "0.006", "output_price_per_1k_tokens": "0.0225",
                   "cache_read_price_per_1k_tokens": "0.0006"}
    model = gateway.create_model(provider["id"], f"cached-{_tag()}", resolved_model="claude-cache", **prices,
                                 long_context_threshold_tokens=60, long_context_prices=long_prices)
    key = _user_key(gateway, model["id"])

    def call_and_row(text: str) -> dict[str, Any]:
        r = _chat(gateway, key, model["name"], text)
        assert r.status_code == 200, r.text
        row = gateway.fetch_row(r.headers["x-request-id"])
        assert (row["cache_read_tokens"], row["cache_write_tokens"]) == (CACHE_READ_TOKENS, CACHE_WRITE_TOKENS)
        return row

    short = call_and_row("hi")
    assert short["tokens_in"] + CACHE_READ_TOKENS + CACHE_WRITE_TOKENS <= 60
    assert short["input_cost"] == _cost([(short["tokens_in"], prices["input_price_per_1k_tokens"]),
                                        (CACHE_READ_TOKENS, prices["cache_read_price_per_1k_tokens"]),
                                        (five_minute, prices["cache_write_price_per_1k_tokens"]),
                                        (CACHE_WRITE_1H_TOKENS, prices["cache_write_1h_price_per_1k_tokens"])])
    assert short["output_cost"] == _cost([(short["tokens_out"], prices["output_price_per_1k_tokens"])])

    long = call_and_row("a long prompt " * 40)
    assert long["tokens_in"] + CACHE_READ_TOKENS + CACHE_WRITE_TOKENS > 60
    assert long["input_cost"] == _cost([(long["tokens_in"], long_prices["input_price_per_1k_tokens"]),
                                       (CACHE_READ_TOKENS, long_prices["cache_read_price_per_1k_tokens"]),
                                       (five_minute, prices["cache_write_price_per_1k_tokens"]),
                                       (CACHE_WRITE_1H_TOKENS, prices["cache_write_1h_price_per_1k_tokens"])])
    assert long["output_cost"] == _cost([(long["tokens_out"], long_prices["output_price_per_1k_tokens"])])


# --- aliases and tags ----------------------------------------------------------------------


def test_an_alias_reaches_its_model_on_every_route(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """The grant is on the model; the caller may name it by an alias on the Mesh and standard
    routes; rows keep the registry name; tags show in the admin list and in /v1/models."""
    provider = _provider(gateway, testserve, "openai", "openai")
    name, alias = f"aliased-{_tag()}", f"alias-{_tag()}"
    model = gateway.create_model(provider["id"], name, aliases=[alias], tags=["team:search", "tier:gold"])
    key = _user_key(gateway, model["id"])
    r = _proxy(gateway, key, alias)
    assert r.status_code == 200, r.text
    row = gateway.fetch_row(r.headers["x-request-id"])
    assert (row["model_name"], row["requested_model"], row["outcome"]) == (name, alias, "success")
    assert _chat(gateway, key, alias).status_code == 200
    sent = testserve.requests(limit=5)
    assert any(e["model"] == "gpt-test" for e in sent), "the upstream gets the resolved model"

    listed = next(m for m in gateway.admin("GET", "/admin/models").json() if m["id"] == model["id"])
    assert (listed["aliases"], listed["tags"]) == ([alias], ["team:search", "tier:gold"])
    mesh = gateway.client.get("/v1/models", headers={"authorization": f"Bearer {key}"}).json()["models"]
    assert next(m for m in mesh if m["model"] == name)["tags"] == ["team:search", "tier:gold"]

    other = gateway.create_model(provider["id"], f"other-{_tag()}", aliases=[f"other-alias-{_tag()}"])
    r = _chat(gateway, key, other["aliases"][0])
    assert r.status_code == 404
    assert gateway.fetch_row(r.headers["x-request-id"])["deny_reason"] == "model_not_permitted"


def test_names_and_aliases_are_unique_together_and_every_clash_is_listed(gateway: Gateway,
                                                                          testserve: EmulatedProviders) -> None:
    """One 400 names each clash: with a name, with another alias, within the model, its own name."""
    provider = _provider(gateway, testserve, "openai", "openai")
    first = gateway.create_model(provider["id"], f"first-{_tag()}", aliases=[f"shared-{_tag()}"])
    name = f"second-{_tag()}"
    shared = first["aliases"][0]
    r = gateway.admin("POST", "/admin/models", {
        "provider_id": provider["id"], "name": name, "resolved_model": "x", "verify": False,
        "aliases": [first["name"], shared, "dup", "dup", name]})
    assert r.status_code == 400, r.text
    problems = r.json()["errors"]
    assert len(problems) == 4, problems
    # NOTE: which of two clashing aliases is reported depends on the models' order (by id).
    for clash in (f'alias "{first["name"]}" is the name of', f'alias "{shared}" is also an alias of',
                  'alias "dup" is listed twice', f'alias "{name}" is the model\'s own name'):
        assert sum(clash in p for p in problems) == 1, (clash, problems)
    assert name not in {m["name"] for m in gateway.admin("GET", "/admin/models").json()}, "nothing written"


# --- deployments and failover --------------------------------------------------------------


def test_deployment_routes_create_list_and_delete(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """Deployments are listed by priority, refused when they cannot serve the model, removable."""
    openai_provider = _provider(gateway, testserve, "openai", "openai")
    claude = _provider(gateway, testserve, "anthropic", "anthropic")
    model = gateway.create_model(openai_provider["id"], f"deployed-{_tag()}")
    path = f"/admin/models/{model['id']}/deployments"
    low = gateway.admin("POST", path, {"provider_id": claude["id"], "resolved_model": "claude-b", "priority": 20})
    assert low.status_code == 201, low.text
    high = gateway.admin("POST", path, {"provider_id": openai_provider["id"], "resolved_model": "gpt-b",
                                        "region": "eu-west", "priority": 10})
    assert high.status_code == 201, high.text
    assert high.json()["provider_name"] == openai_provider["name"]
    listed = gateway.admin("GET", path).json()
    assert [(d["resolved_model"], d["region"], d["priority"]) for d in listed] == [
        ("gpt-b", "eu-west", 10), ("claude-b", None, 20)]
    assert [d["id"] for d in gateway.admin("GET", f"/admin/models/{model['id']}").json()["deployments"]] == [
        d["id"] for d in listed]

    again = gateway.admin("POST", path, {"provider_id": claude["id"], "resolved_model": "claude-b"})
    assert (again.status_code, again.json()["error"]) == (409, "deployment_already_exists")
    own = gateway.admin("POST", path, {"provider_id": openai_provider["id"], "resolved_model": "gpt-test"})
    assert own.status_code == 400 and "already a deployment of the model" in own.json()["detail"], own.text
    embedder = gateway.create_model(openai_provider["id"], f"embed-{_tag()}", kind="embedding")
    r = gateway.admin("POST", f"/admin/models/{embedder['id']}/deployments",
                      {"provider_id": claude["id"], "resolved_model": "e"})
    assert r.status_code == 400 and r.json()["errors"][0].endswith("(anthropic) has no embedding operation"), r.text
    assert gateway.admin("POST", path, {"provider_id": "nope", "resolved_model": "x"}).status_code == 400
    assert gateway.admin("POST", path, {"provider_id": claude["id"], "resolved_model": " "}).status_code == 400
    assert gateway.admin("GET", "/admin/models/00000000-0000-0000-0000-000000000000/deployments").status_code == 404

    assert gateway.admin("DELETE", f"{path}/{low.json()['id']}").status_code == 200
    assert gateway.admin("DELETE", f"{path}/{low.json()['id']}").status_code == 404
    assert [d["resolved_model"] for d in gateway.admin("GET", path).json()] == ["gpt-b"]


def test_a_503_or_a_connection_failure_fails_over_once_to_the_next_deployment(
        gateway: Gateway, testserve: EmulatedProviders) -> None:
    """The first deployment answers 503 (or no connection): the call goes to the next deployment
    by priority, the row names the provider that served; a 500 does not fail over, and a call
    fails over at most once."""
    flaky = _provider(gateway, testserve, "openai", "openai", max_retries=0)
    claude = _provider(gateway, testserve, "anthropic", "anthropic", max_retries=0)
    spare = _provider(gateway, testserve, "openai", "openai", max_retries=0)
    dead = gateway.create_provider(f"reg-dead-{_tag()}", base_url="http://127.0.0.1:9/openai", max_retries=0)
    tag = _tag()
    model = gateway.create_model(flaky["id"], f"failover-{tag}", resolved_model=f"fo-{tag}-flaky")
    for provider, resolved, priority in ((spare, f"never-{tag}", 50), (claude, f"claude-{tag}", 5)):
        r = gateway.admin("POST", f"/admin/models/{model['id']}/deployments",
                          {"provider_id": provider["id"], "resolved_model": resolved, "priority": priority})
        assert r.status_code == 201, r.text
    erroring = gateway.create_model(flaky["id"], f"erroring-{tag}", resolved_model=f"er-{tag}-error-500")
    gateway.admin("POST", f"/admin/models/{erroring['id']}/deployments",
                  {"provider_id": claude["id"], "resolved_model": f"claude-er-{tag}"})
    unreachable = gateway.create_model(dead["id"], f"unreachable-{tag}")
    gateway.admin("POST", f"/admin/models/{unreachable['id']}/deployments",
                  {"provider_id": flaky["id"], "resolved_model": f"un-{tag}-flaky"})
    gateway.admin("POST", f"/admin/models/{unreachable['id']}/deployments",
                  {"provider_id": spare["id"], "resolved_model": f"never-{tag}", "priority": 200})
    key = _user_key(gateway, model["id"], erroring["id"], unreachable["id"])
    time.sleep(0.3)

    r = _proxy(gateway, key, model["name"])  # flaky's first 503
    assert r.status_code == 200, r.text
    assert "testserve[anthropic]" in r.text
    assert gateway.fetch_row(r.headers["x-request-id"])["provider_id"] == _uuid(claude["id"])
    r = _chat(gateway, key, model["name"])  # flaky's second 503, on a standard route
    assert r.status_code == 200, r.text
    assert gateway.fetch_row(r.headers["x-request-id"])["provider_id"] == _uuid(claude["id"])
    r = _proxy(gateway, key, model["name"])  # flaky recovered: the first deployment serves
    assert r.status_code == 200 and "testserve[openai]" in r.text, r.text
    assert gateway.fetch_row(r.headers["x-request-id"])["provider_id"] == _uuid(flaky["id"])

    r = _chat(gateway, key, erroring["name"])
    assert r.status_code == 502, r.text
    row = gateway.fetch_row(r.headers["x-request-id"])
    assert (row["provider_id"], row["status_code"]) == (_uuid(flaky["id"]), 500), "a 500 does not fail over"

    r = _proxy(gateway, key, unreachable["name"])  # no connection, then the next one's 503
    assert r.status_code == 502, r.text
    row = gateway.fetch_row(r.headers["x-request-id"])
    assert (row["provider_id"], row["status_code"]) == (_uuid(flaky["id"]), 503)
    models_sent = [e["model"] for e in testserve.requests(limit=500)]
    assert f"claude-er-{tag}" not in models_sent and f"never-{tag}" not in models_sent, "one failover at most"


def test_a_failover_waits_for_its_own_providers_slot(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """Calls that fail over are admitted anew by the next provider's limits: with one slot there,
    three concurrent failovers reach it one at a time, and every one is served."""
    slow_s = 0.3
    dead = gateway.create_provider(f"reg-dead-{_tag()}", base_url="http://127.0.0.1:9/openai", max_retries=0)
    narrow = _provider(gateway, testserve, "anthropic", "anthropic", max_retries=0, max_concurrent_upstream=1)
    tag = _tag()
    model = gateway.create_model(dead["id"], f"narrow-{tag}")
    r = gateway.admin("POST", f"/admin/models/{model['id']}/deployments",
                      {"provider_id": narrow["id"], "resolved_model": f"nw-{tag}-slow"})
    assert r.status_code == 201, r.text
    key = _user_key(gateway, model["id"])
    time.sleep(0.3)

    async def three() -> list[tuple[httpx.Response, float]]:
        async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:
            async def one() -> tuple[httpx.Response, float]:
                t0 = time.monotonic()
                response = await client.post(f"/v1/proxy?model={model['name']}", json={"query": "hi"},
                                             headers={"authorization": f"Bearer {key}"})
                return response, time.monotonic() - t0

            return await asyncio.gather(one(), one(), one())

    slow_before = testserve.client.get("/_debug/config").json()["slow_delay_ms"]
    testserve.client.post("/_debug/config", json={"slow_delay_ms": slow_s * 1000}).raise_for_status()
    try:
        results = asyncio.run(three())
    finally:
        testserve.client.post("/_debug/config", json={"slow_delay_ms": slow_before}).raise_for_status()
    assert [r.status_code for r, _ in results] == [200] * 3, [r.text for r, _ in results]
    for r, _ in results:
        assert gateway.fetch_row(r.headers["x-request-id"])["provider_id"] == _uuid(narrow["id"])
    # One at a time through the one slot: the last waited for the two before it.
    assert max(elapsed for _, elapsed in results) >= 2.5 * slow_s


def _uuid(value: str) -> Any:
    import uuid

    return uuid.UUID(value)


# --- the serviceability invariant and reloads ----------------------------------------------


def test_a_failed_reload_keeps_the_last_good_snapshot(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """A registry made invalid behind the admin API's back (an alias that is another model's
    name) is refused by every worker, which keep serving their last good snapshot; registry
    writes are refused listing the problem until it is fixed, and then everything applies."""
    provider = _provider(gateway, testserve, "openai", "openai")
    kept = gateway.create_model(provider["id"], f"kept-{_tag()}")
    other = gateway.create_model(provider["id"], f"other-{_tag()}")
    user = gateway.create_user()
    gateway.grant(user["id"], kept["id"])
    key = user["key"]
    assert _proxy(gateway, key, kept["name"]).status_code == 200

    # One transaction: the clash, and a revoked grant that would show if the snapshot loaded.
    asyncio.run(_sql(gateway, f"""
        BEGIN;
        UPDATE models SET aliases = ARRAY['{kept['name']}'] WHERE id = '{other['id']}';
        DELETE FROM user_model_access WHERE user_id = '{user['id']}';
        UPDATE gateway_state SET config_seq = nextval('meshfast_config_seq');
        SELECT pg_notify('meshfast_config', '0');
        COMMIT;"""))
    try:
        assert _wait_for(lambda: "snapshot rejected" in gateway.log()), gateway.log()
        time.sleep(0.5)
        for _ in range(4):  # every worker kept the grant
            assert _proxy(gateway, key, kept["name"]).status_code == 200
        r = gateway.admin("POST", "/admin/models", {"provider_id": provider["id"], "name": f"new-{_tag()}",
                                                    "resolved_model": "x", "verify": False})
        assert r.status_code == 400, r.text
        [problem] = r.json()["errors"]
        assert re.fullmatch(rf'models\[\d+\] \("{other["name"]}"\): alias "{kept["name"]}" is the name of '
                            rf'models\[\d+\] \("{kept["name"]}"\)', problem), problem
    finally:
        # NOTE: the shared gateway must get a valid registry back whatever happened above.
        asyncio.run(_sql(gateway, f"""
            BEGIN;
            UPDATE models SET aliases = '{{}}' WHERE id = '{other['id']}';
            UPDATE gateway_state SET config_seq = nextval('meshfast_config_seq');
            SELECT pg_notify('meshfast_config', '0');
            COMMIT;"""))
    assert _wait_for(lambda: all(_proxy(gateway, key, kept["name"]).status_code == 403 for _ in range(4)))


# --- registry files ------------------------------------------------------------------------


def _registry(testserve: EmulatedProviders, tag: str) -> dict[str, Any]:
    return {
        "providers": [
            {"name": f"file-openai-{tag}", "family": "openai", "base_url": f"{testserve.base_url}/openai",
             "api_key_env": "REGISTRY_TEST_KEY", "local": True, "max_retries": 0},
            {"name": f"file-claude-{tag}", "family": "anthropic", "base_url": f"{testserve.base_url}/anthropic",
             "api_key": "sk-file", "local": True},
        ],
        "models": [
            {"name": f"file-chat-{tag}", "provider": f"file-openai-{tag}", "resolved_model": "gpt-file",
             "input_price_per_1k_tokens": "0.001", "output_price_per_1k_tokens": 0.002,
             "cache_read_price_per_1k_tokens": "0.0001", "aliases": [f"file-alias-{tag}"], "tags": ["file"],
             "deployments": [{"provider": f"file-claude-{tag}", "resolved_model": "claude-file", "region": "eu"}]},
            {"name": f"file-embed-{tag}", "provider": f"file-openai-{tag}", "resolved_model": "text-embedding-3",
             "kind": "embedding"},
        ],
    }


def _apply(gateway: Gateway, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(gateway.env(), DATABASE_URL=gateway.database_url, REGISTRY_TEST_KEY="sk-from-env")
    return subprocess.run([sys.executable, "-m", "meshfast.cli", "apply", str(path), *extra], env=env,
                          capture_output=True, text=True, timeout=120)


def test_apply_creates_updates_idempotently_and_refuses_an_invalid_file_whole(
        gateway: Gateway, testserve: EmulatedProviders, fresh_dir: Path) -> None:
    """`meshfast apply` writes through the admin service: the running gateway serves the file's
    models within a second; a second apply changes nothing; an edit updates; an invalid file
    lists every problem and writes nothing."""
    tag = _tag()
    registry = _registry(testserve, tag)
    path = fresh_dir / "registry.json"
    path.write_text(json.dumps(registry))
    done = _apply(gateway, path, "--json")
    assert done.returncode == 0, done.stderr
    applied = json.loads(done.stdout)
    assert sorted(applied["created"]) == sorted([
        f"provider file-openai-{tag}", f"provider file-claude-{tag}", f"model file-chat-{tag}",
        f"model file-embed-{tag}", f"deployment file-chat-{tag} on file-claude-{tag}/claude-file"])
    models = {m["name"]: m for m in gateway.admin("GET", "/admin/models").json()}
    chat = models[f"file-chat-{tag}"]
    assert (chat["aliases"], chat["tags"], chat["cache_read_price_per_1k_tokens"]) == ([f"file-alias-{tag}"],
                                                                                      ["file"], 0.0001)
    assert [(d["provider_name"], d["region"]) for d in chat["deployments"]] == [(f"file-claude-{tag}", "eu")]
    key = _user_key(gateway, chat["id"])
    assert _wait_for(lambda: _proxy(gateway, key, f"file-alias-{tag}").status_code == 200)

    audit_before = gateway.admin("GET", "/admin/audit").json().get("total") if _has_audit(gateway) else None
    again = _apply(gateway, path, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) | {"unchanged": []} == {"created": [], "updated": [], "deleted": [],
                                                            "unchanged": []}
    if audit_before is not None:
        assert gateway.admin("GET", "/admin/audit").json()["total"] == audit_before, "nothing written"

    registry["models"][0]["output_price_per_1k_tokens"] = "0.004"
    registry["models"][0]["deployments"] = []
    path.write_text(json.dumps(registry))
    edited = json.loads(_apply(gateway, path, "--json").stdout)
    assert edited["updated"] == [f"model file-chat-{tag}"]
    assert edited["deleted"] == [f"deployment file-chat-{tag} on file-claude-{tag}/claude-file"]

    bad = _registry(testserve, tag)
    bad["providers"][1]["family"] = "nope"
    bad["models"][0]["input_price_per_1k_tokens"] = -1
    bad["models"][1]["provider"] = "missing"
    bad["models"].append({"name": f"file-third-{tag}", "provider": f"file-openai-{tag}", "resolved_model": "x",
                          "aliases": [f"file-chat-{tag}"]})
    path.write_text(json.dumps(bad))
    refused = _apply(gateway, path)
    assert refused.returncode == 1
    assert "invalid registry, nothing applied" in refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.startswith("  - ")]
    assert len(lines) == 2, refused.stderr  # the file's own problems, found before the database is read
    assert "family must be one of" in lines[0] and "input_price_per_1k_tokens" in lines[1]

    bad["providers"][1]["family"] = "anthropic"
    bad["models"][0]["input_price_per_1k_tokens"] = 0
    path.write_text(json.dumps(bad))
    refused = _apply(gateway, path)
    assert refused.returncode == 1
    assert "provider 'missing' is neither in the file nor registered" in refused.stderr, refused.stderr
    del bad["models"][1]
    path.write_text(json.dumps(bad))
    refused = _apply(gateway, path)
    assert refused.returncode == 1
    assert f'alias "file-chat-{tag}" is the name of' in refused.stderr, refused.stderr
    assert f"file-third-{tag}" not in {m["name"] for m in gateway.admin("GET", "/admin/models").json()}
    price = next(m for m in gateway.admin("GET", "/admin/models").json() if m["name"] == f"file-chat-{tag}")
    assert price["input_price_per_1k_tokens"] == 0.001, "nothing of a refused file is written"


def _has_audit(gateway: Gateway) -> bool:
    return gateway.admin("GET", "/admin/audit").status_code == 200


def test_toml_registry_files_are_read_too(gateway: Gateway, testserve: EmulatedProviders, fresh_dir: Path) -> None:
    """A .toml file is the same registry."""
    tag = _tag()
    path = fresh_dir / "registry.toml"
    path.write_text(f"""
[[providers]]
name = "toml-{tag}"
family = "openai"
base_url = "{testserve.base_url}/openai"
api_key = "sk-toml"
local = true

[[models]]
name = "toml-chat-{tag}"
provider = "toml-{tag}"
resolved_model = "gpt-toml"
aliases = ["toml-alias-{tag}"]
input_price_per_1k_tokens = "0.001"
""")
    done = _apply(gateway, path)
    assert done.returncode == 0, done.stderr
    assert f"toml-chat-{tag}" in {m["name"] for m in gateway.admin("GET", "/admin/models").json()}


def _serve(data_dir: Path, registry: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(MESHFAST_DATA_DIR=str(data_dir), MESHFAST_ADMIN_TOKEN="registry-admin", REGISTRY_TEST_KEY="sk-env",
               **SESSION_ENV)
    proc = subprocess.Popen([sys.executable, "-m", "meshfast.cli", "serve", "--workers", "1", "--port", str(port),
                             "--registry", str(registry)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, port


def test_serve_with_a_registry_applies_it_and_refuses_to_start_when_invalid(
        testserve: EmulatedProviders, fresh_dir: Path) -> None:
    """`serve --registry FILE`: an invalid file stops the start with every problem listed; a valid
    one is in force when the gateway answers."""
    tag = _tag()
    bad = _registry(testserve, tag)
    bad["models"][0]["deployments"][0]["provider"] = "missing"
    bad["models"][1]["max_output_tokens"] = 0
    path = fresh_dir / "registry.json"
    path.write_text(json.dumps(bad))
    proc, _ = _serve(fresh_dir / "data", path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert b"invalid registry, nothing applied" in out and b"max_output_tokens must be positive" in out, out
    assert b"serving on" not in out

    path.write_text(json.dumps(_registry(testserve, tag)))
    proc, port = _serve(fresh_dir / "data", path)
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10,
                              headers={"authorization": "Bearer registry-admin"})

        def ready() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return client.get("/readyz").status_code == 200
            return False

        assert _wait_for(ready, timeout_s=90), "gateway did not start"
        names = {m["name"] for m in client.get("/admin/models").json()}
        assert {f"file-chat-{tag}", f"file-embed-{tag}"} <= names
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        proc.communicate(timeout=60)
