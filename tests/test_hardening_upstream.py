"""Hardening of the upstream side (issue 13, items 12-15 and 18), end to end: real `meshfast
serve`, real testserve. A provider that redirects or answers an odd status fails the call; a
provider that quotes the key it refused shows it to nobody; the connect-time guard refuses every
non-public address; what meshfast writes on disk is its user's alone; every bench result carries
its provenance."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash
from conftest import SESSION_ENV, EmulatedProviders, Gateway

from testserve.app import REDIRECTED_MARK, mask_key

ROOT = Path(__file__).resolve().parent.parent

# Every data-plane route, with the body and shape it speaks. Mesh routes name the model in the
# query; the standard routes in the body or the path.
ROUTES = ("proxy", "embeddings", "generate", "openai_chat", "openai_chat_stream", "openai_responses", "anthropic",
          "gemini", "ollama", "openai_embeddings")
MESH_ROUTES = ("proxy", "embeddings", "generate")
KIND = {"embeddings": "embedding", "openai_embeddings": "embedding", "generate": "image_generation"}


def _post(gateway: Gateway, key: str, route: str, model: str, timeout: float = 30) -> httpx.Response:
    """One call of ``route`` for ``model``; the whole answer is read (a stream too)."""
    auth = {"authorization": f"Bearer {key}"}
    messages = [{"role": "user", "content": "hello"}]
    call: tuple[str, dict[str, Any], dict[str, Any]] = {
        "proxy": ("/v1/proxy", {"model": model}, {"query": "hello", "max_tokens": 32}),
        "embeddings": ("/v1/embeddings", {"model": model}, {"input": "hello"}),
        "generate": ("/v1/generate", {"model": model}, {"prompt": "a lighthouse"}),
        "openai_chat": ("/v1/chat/completions", {}, {"model": model, "messages": messages, "max_tokens": 32}),
        "openai_chat_stream": ("/v1/chat/completions", {}, {"model": model, "messages": messages, "max_tokens": 32,
                                                           "stream": True}),
        "openai_responses": ("/v1/responses", {}, {"model": model, "input": "hello", "max_output_tokens": 32}),
        "anthropic": ("/v1/messages", {}, {"model": model, "messages": messages, "max_tokens": 32}),
        "gemini": (f"/v1beta/models/{model}:generateContent", {}, {"contents": [{"role": "user",
                                                                              "parts": [{"text": "hello"}]}]}),
        "ollama": ("/api/chat", {}, {"model": model, "messages": messages, "stream": False}),
        "openai_embeddings": ("/v1/embeddings", {}, {"model": model, "input": "hello"}),
    }[route]
    path, params, body = call
    with gateway.client.stream("POST", path, params=params, json=body, headers=auth, timeout=timeout) as response:
        response.read()
    return response


def _error_code(route: str, response: httpx.Response) -> str:
    """The Mesh code of an error answer, wherever the route's shape puts it."""
    body = response.json()
    if route in MESH_ROUTES:
        return body["error"]
    if route == "anthropic":
        return body["error"]["type"]
    if route == "gemini":
        return body["error"]["details"][0]["reason"]
    if route == "ollama":
        return body["code"]
    return body["error"]["code"]


@pytest.fixture(scope="module")
def world(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    """Providers of each family on testserve (keys long enough to be worth masking), one user
    granted every model made by :func:`_model`."""
    user = gateway.create_user()
    providers = {}
    for family, prefix in (("openai", "openai"), ("anthropic", "anthropic"), ("gemini", "gemini")):
        api_key = f"sk-{family[:4]}-" + secrets.token_hex(20) + "Wxyz"
        providers[family] = {"api_key": api_key, **gateway.create_provider(
            f"hu-{family}", family=family, base_url=f"{testserve.base_url}/{prefix}", api_key=api_key,
            retry_backoff_ms=20, max_retries=1)}
    # The key in the URL's query, as `?key=` (no header carries it).
    api_key = "AIzaQuery-" + secrets.token_hex(20) + "Wxyz"
    providers["query"] = {"api_key": api_key, **gateway.create_provider(
        "hu-query-key", family="generic", base_url=testserve.base_url, api_key=api_key, retry_backoff_ms=20,
        max_retries=1, endpoint_url=f"{testserve.base_url}/openai/v1/chat/completions?key={{{{api_key}}}}",
        header_template={"accept": "application/json"},
        request_body_template={"model": "{{model}}", "messages": [{"role": "user", "content": "{{query}}"}],
                               "stream": True},
        response_delta_path="choices.0.delta.content")}
    return {"user": user, "providers": providers, "models": {}}


def _model(gateway: Gateway, world: dict[str, Any], family: str, route: str, scenario: str) -> str:
    """A granted model of ``family``'s provider for ``route``'s kind, answering ``scenario``."""
    kind = KIND.get(route, "chat")
    name = f"hu-{family}-{kind}-{scenario}"
    if name not in world["models"]:
        extra: dict[str, Any] = {"kind": kind}
        if kind == "image_generation":
            extra["output_media_type"] = "image/png"
        model = gateway.create_model(world["providers"][family]["id"], name, resolved_model=f"dummy-{scenario}",
                                     **extra)
        gateway.grant(world["user"]["id"], model["id"])
        world["models"][name] = model
    return name


def _upstream_calls(testserve: EmulatedProviders, scenario: str) -> list[dict[str, Any]]:
    return [e for e in testserve.requests() if e["model"] == f"dummy-{scenario}"
            or f"dummy-{scenario}:" in e["path"]]


# --- item 12: a 3xx (or another status that is no answer) is an upstream error --------------------


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("status", [302, 307])
def test_a_provider_redirect_is_a_502_upstream_error_on_every_route(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any], route: str, status: int) -> None:
    """A 3xx is never followed: 502 upstream_unavailable in the route's shape, row upstream_error."""
    model = _model(gateway, world, "openai", route, f"status-{status}")
    testserve.client.delete("/_debug/requests")
    response = _post(gateway, world["user"]["key"], route, model)
    assert response.status_code == 502, response.text
    assert _error_code(route, response) == "upstream_unavailable"
    if route in MESH_ROUTES:
        assert response.json()["provider_status"] == status
    calls = _upstream_calls(testserve, f"status-{status}")
    assert len(calls) == 1, "a redirect is final: neither retried nor followed"
    assert not any(REDIRECTED_MARK in e["query"] for e in testserve.requests())
    row = gateway.fetch_row(response.headers["x-request-id"])
    assert row["outcome"] == "upstream_error"


@pytest.mark.parametrize("status", [204, 300, 301, 303, 304, 305, 308, 400, 401, 403, 404, 405, 409, 410, 413, 422,
                                    451, 501, 505])
def test_a_status_that_is_no_answer_fails_the_call_at_once(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any], status: int) -> None:
    """Any 3xx, 204 and every 4xx/5xx that cannot clear is one attempt, then a 502 with provider_status."""
    model = _model(gateway, world, "openai", "proxy", f"status-{status}")
    testserve.client.delete("/_debug/requests")
    response = _post(gateway, world["user"]["key"], "proxy", model)
    assert response.status_code == 502, response.text
    body = response.json()
    assert body["error"] == "upstream_unavailable" and body["provider_status"] == status
    assert body["provider_message"]
    assert len(_upstream_calls(testserve, f"status-{status}")) == 1
    assert gateway.fetch_row(response.headers["x-request-id"])["outcome"] == "upstream_error"


@pytest.mark.parametrize("status", [408, 529])
def test_transient_statuses_are_retried(gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any],
                                        status: int) -> None:
    """408 (the server gave up waiting) and 529 (Anthropic overloaded) are retried like 503."""
    model = _model(gateway, world, "openai", "proxy", f"status-{status}")
    testserve.client.delete("/_debug/requests")
    response = _post(gateway, world["user"]["key"], "proxy", model)
    assert response.status_code == 502 and response.json()["provider_status"] == status
    assert len(_upstream_calls(testserve, f"status-{status}")) == 2, "max_retries 1: two attempts"


def test_a_2xx_stream_still_succeeds(gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any]) -> None:
    """The classification lets real answers through: 200 on the Mesh stream, row success."""
    response = _post(gateway, world["user"]["key"], "proxy", _model(gateway, world, "openai", "proxy", "ok"))
    assert response.status_code == 200
    lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    assert lines[-1]["done"] is True and "incomplete" not in lines[-1]
    assert gateway.fetch_row(response.headers["x-request-id"])["outcome"] == "success"


# --- item 13: a provider's key never reaches a caller ----------------------------------------------


def _assert_no_key(api_key: str, *texts: str) -> None:
    for text in texts:
        assert api_key not in text
        assert mask_key(api_key) not in text
        assert api_key[:12] not in text, "a prefix of the key"
        assert api_key[-4:] not in text, "the key's last four characters"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("scenario", ["error-401-echo", "error-401-masked"])
def test_a_refused_key_quoted_by_the_provider_reaches_no_caller(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any], route: str, scenario: str) -> None:
    """A 401 quoting the key (whole or masked, as OpenAI does) is passed on with the key redacted."""
    api_key = world["providers"]["openai"]["api_key"]
    model = _model(gateway, world, "openai", route, scenario)
    testserve.client.delete("/_debug/requests")
    response = _post(gateway, world["user"]["key"], route, model)
    calls = _upstream_calls(testserve, scenario)
    assert calls and calls[0]["key_presented"] == api_key, "testserve saw (and quoted) the real key"
    assert response.status_code == 502, response.text
    assert _error_code(route, response) == "upstream_unavailable"
    _assert_no_key(api_key, response.text, json.dumps(dict(response.headers)))
    assert "Incorrect API key provided: [redacted]" in response.text
    if route in MESH_ROUTES:
        body = response.json()
        assert body["provider_status"] == 401
        assert body["provider_message"].startswith("Incorrect API key provided: [redacted].")
    row = gateway.fetch_row(response.headers["x-request-id"])
    assert row["outcome"] == "upstream_error"
    _assert_no_key(api_key, json.dumps(row, default=str), gateway.log())


@pytest.mark.parametrize("family", ["anthropic", "gemini", "query"])
@pytest.mark.parametrize("scenario", ["error-401-echo", "error-401-masked"])
def test_a_key_sent_in_any_header_or_the_url_is_redacted(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any], family: str, scenario: str) -> None:
    """x-api-key, x-goog-api-key and a `key=` query parameter are credentials too."""
    api_key = world["providers"][family]["api_key"]
    model = _model(gateway, world, family, "proxy", scenario)
    testserve.client.delete("/_debug/requests")
    response = _post(gateway, world["user"]["key"], "proxy", model)
    assert _upstream_calls(testserve, scenario)[0]["key_presented"] == api_key
    assert response.status_code == 502 and response.json()["provider_status"] == 401
    _assert_no_key(api_key, response.text)
    assert "[redacted]" in response.json()["provider_message"]


@pytest.mark.parametrize(("family", "route"), [("openai", "openai_chat_stream"), ("anthropic", "openai_chat_stream"),
                                               ("openai", "anthropic"), ("gemini", "openai_chat")])
def test_an_error_event_quoting_the_key_inside_a_stream_is_redacted(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any], family: str, route: str) -> None:
    """A stream that breaks with an error event quoting the key passes the event on without it."""
    api_key = world["providers"][family]["api_key"]
    model = _model(gateway, world, family, route, "stream-error-echo")
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 32,
                            "stream": True}
    path = "/v1/messages" if route == "anthropic" else "/v1/chat/completions"
    if route == "openai_chat":
        body.pop("stream")
    response = gateway.client.post(path, json=body, headers={"authorization": f"Bearer {world['user']['key']}"},
                                   timeout=30)
    _assert_no_key(api_key, response.text)
    if route == "openai_chat":
        assert response.status_code == 502
    else:
        assert response.status_code == 200
        assert "[redacted]" in response.text, response.text
    assert gateway.fetch_row(response.headers["x-request-id"])["outcome"] == "upstream_error"


# --- item 14 (connect time): the guard refuses every non-public address --------------------------


@pytest.mark.parametrize("client", ["native", "aiohttp"])
@pytest.mark.parametrize("address", ["100.64.0.1", "100.100.100.200", "192.0.0.170", "198.18.0.1", "240.0.0.1",
                                     "[::ffff:100.64.0.1]", "[64:ff9b::a9fe:a9fe]", "[2002:a9fe:a9fe::1]",
                                     "[fd00::1]"])
def test_the_connect_time_guard_refuses_shared_and_special_addresses(client: str, address: str) -> None:
    """A provider not marked local never connects to shared (100.64/10) or other special addresses."""
    from meshfast.dispatch import Dispatcher, Timeouts, UpstreamError

    async def call() -> UpstreamError:
        dispatcher = Dispatcher(Timeouts(connect_s=1), client=client)
        await dispatcher.start()
        try:
            with pytest.raises(UpstreamError) as caught:
                await dispatcher.send("POST", f"http://{address}/v1/chat/completions", [], b"{}", local=False,
                                      attempts=3, backoff_ms=1)
            return caught.value
        finally:
            await dispatcher.close()

    error = asyncio.run(asyncio.wait_for(call(), 5))
    assert error.status is None and "not public" in error.message


def test_names_resolving_to_a_forbidden_address_are_refused() -> None:
    """A name is resolved and every answer checked: localhost reaches nothing for a non-local provider."""
    from meshfast.http1 import Client, ForbiddenAddress

    async def call() -> None:
        client = Client(1)
        try:
            with pytest.raises(ForbiddenAddress):
                await client.request("GET", "http://localhost:9/", [], b"", guard=True, idle_timeout_s=1)
        finally:
            await client.close()

    asyncio.run(call())


# --- item 15: what meshfast writes is readable by its own user only -------------------------------


def test_data_dir_spool_secrets_and_segment_are_owner_only(fresh_dir: Path) -> None:
    """0700 data dir and spool, 0600 files (segment included), even over an earlier run's 0755/0644."""
    data = fresh_dir / "data"
    spool = data / "spool"
    spool.mkdir(parents=True)
    os.chmod(data, 0o755)
    os.chmod(spool, 0o755)
    leftover = spool / f"rejected-{os.getpid()}.rows"
    leftover.write_bytes(b"")
    os.chmod(leftover, 0o644)
    previous = os.umask(0o022)
    try:
        gateway = Gateway(data, workers=1, env=SESSION_ENV).start()
    finally:
        os.umask(previous)
    try:
        segment = Path("/dev/shm") / f"meshfast-{xxhash.xxh64_hexdigest(str(data.resolve()).encode())}.seg"
        modes = {path: stat.S_IMODE(path.stat().st_mode) for path in (data, spool, leftover, data / "secrets.json",
                                                                        segment)}
        # NOTE: run as root, pgserver runs PostgreSQL (and pg_ctl) as its own user without that
        # user's group, so it must pass through the data dir as "other": 0711, nobody may list it.
        pg = (data / "pg").stat()
        data_mode = 0o700 if pg.st_uid == os.getuid() else 0o711
        assert modes == {data: data_mode, spool: 0o700, leftover: 0o600, data / "secrets.json": 0o600, segment: 0o600}
        wide = []
        for root, dirs, files in os.walk(data):
            for name in dirs + files:
                path = Path(root) / name
                st = path.lstat()
                if stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode):
                    continue  # reached only through the 0700 dirs above them
                if st.st_mode & 0o077:
                    wide.append(f"{path.relative_to(data)} {stat.S_IMODE(st.st_mode):o}")
        assert not wide, wide
    finally:
        gateway.stop()


def test_rejected_spool_files_are_created_owner_only(tmp_path: Path) -> None:
    """Rows the database refuses land in a 0600 file, whatever the umask."""
    from meshfast import telemetry

    previous = os.umask(0)
    try:
        with open(tmp_path / "rejected-1.rows", "ab", opener=telemetry._owner_only) as f:
            f.write(b"x")
        existing = tmp_path / "rejected-2.rows"
        existing.write_bytes(b"")
        os.chmod(existing, 0o644)
        with open(existing, "ab", opener=telemetry._owner_only) as f:
            f.write(b"x")
    finally:
        os.umask(previous)
    assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {0o600}


# --- item 18: every bench result carries its provenance -------------------------------------------


def test_every_bench_script_that_writes_a_result_opens_it_with_the_run_header() -> None:
    """A script writing JSON into bench/results (or a baseline) builds it with run_header."""
    missing = []
    for script in sorted((ROOT / "bench").glob("*.py")):
        source = script.read_text()
        writes_result = "RESULTS_DIR" in source or "BASELINE.write_text" in source
        if not writes_result:
            continue
        calls = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                 for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)}
        if "run_header" not in calls:
            missing.append(script.name)
    assert not missing, f"bench scripts writing results without run_header: {missing}"


def test_the_logs_bench_result_carries_git_sha_build_profile_and_machine(tmp_path: Path) -> None:
    """bench/logs_bench.py (a small run) writes the command, git sha, build profile, CPU and versions."""
    out = tmp_path / "logs.json"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "logs_bench.py"), "--rows", "2000", "--repeat", "1",
                          "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.exists(), run.stdout[-2000:] + run.stderr[-4000:]
    doc = json.loads(out.read_text())
    prov = doc["provenance"]
    assert doc["command"] and doc["timestamp"] and doc["config"]["rows"] == 2000
    assert len(prov["git_sha"]) == 40 and prov["build_profile"]
    assert prov["cpu"]["count"] == os.cpu_count() and prov["host"]["machine"]
    assert prov["versions"]["python"] and doc["postgres"]["server_version"]
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_the_data_dir_stays_reachable_by_the_database_across_runs(fresh_dir: Path) -> None:
    """A second process on a running gateway's data dir (``meshfast migrate``) and a restart leave
    the data dir as narrow as the database allows (0700, or 0711 when the database runs as its own
    user) and never cut the running database off its own directory."""
    data = fresh_dir / "data"
    gateway = Gateway(data, workers=1, env=SESSION_ENV).start()
    try:
        migrate = subprocess.run([sys.executable, "-m", "meshfast.cli", "migrate"], env=gateway.env(),
                                 capture_output=True, text=True, timeout=120)
        assert migrate.returncode == 0, migrate.stderr
        mode = data.stat().st_mode & 0o777
        assert mode in (0o700, 0o711), oct(mode)
        assert gateway.client.get("/readyz").status_code == 200
        assert gateway.admin("GET", "/admin/users").status_code == 200
    finally:
        gateway.stop()
    again = Gateway(data, workers=1, env=SESSION_ENV).start()
    try:
        assert again.client.get("/readyz").status_code == 200
        assert data.stat().st_mode & 0o777 in (0o700, 0o711)
    finally:
        again.stop()
    assert "Permission denied" not in gateway.log() + again.log()
