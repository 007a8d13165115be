"""Realtime sessions (issue "ecosystem", item 2): `GET /v1/realtime?model=NAME` relayed to
testserve's realtime endpoint through real Granian workers, with the official `openai` SDK's
realtime client. Every response is governed and priced as a call; the session leaves a row of its own.

testserve answers a response with `max_output_tokens` N with N words, one token each, and 10 + 2k
input tokens for the k-th response of a session; at $1 per 1k output tokens and free input, a
response of 3 tokens costs $0.003."""

from __future__ import annotations

import json
import secrets
import signal
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway, until
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

CALL_USD = 0.003


def _tag() -> str:
    return secrets.token_hex(3)


@pytest.fixture(scope="module")
def model(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    provider = gateway.create_provider(f"rt-p-{_tag()}", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key")
    return gateway.create_model(provider["id"], f"rt-m-{_tag()}", resolved_model="gpt-realtime-test",
                                input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")


def _person(gateway: Gateway, model: dict[str, Any], **policy: Any) -> dict[str, Any]:
    user = gateway.create_user()
    gateway.grant(user["id"], model["id"])
    if policy:
        r = gateway.admin("PUT", f"/admin/users/{user['id']}/policies/{model['id']}", policy)
        assert r.status_code == 200, r.text
    return user


def _respond(connection: Any, text: str, max_output_tokens: int = 3) -> tuple[str, Any]:
    """One user turn and its response through the SDK: the text streamed and the done event."""
    connection.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": text}]})
    connection.response.create(response={"max_output_tokens": max_output_tokens})
    deltas = []
    for event in connection:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.done":
            return "".join(deltas), event
        elif event.type == "error":
            return "".join(deltas), event


def _rows(gateway: Gateway, user_id: str, at_least: int) -> list[dict[str, Any]]:
    return gateway.fetch_rows("user_id", [user_id], at_least=at_least, timeout_s=10)


def test_a_session_through_the_official_sdk_is_relayed_priced_and_recorded(
        gateway: Gateway, model: dict, testserve: EmulatedProviders) -> None:
    user = _person(gateway, model)
    testserve.client.delete("/_debug/requests")
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=user["key"], max_retries=0)
    started = time.monotonic()
    with client.realtime.connect(model=model["name"]) as connection:
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        first = connection.recv()
        assert first.type == "session.created", first
        text, done = _respond(connection, "hello")
        assert done.type == "response.done" and text == "Hello from the"
        assert done.response.usage.output_tokens == 3 and done.response.usage.input_tokens == 10
        text, done = _respond(connection, "and again", max_output_tokens=5)
        assert text == "Hello from the realtime emulator," and done.response.usage.input_tokens == 12
    duration_s = time.monotonic() - started

    rows = _rows(gateway, user["id"], at_least=3)
    responses = sorted((r for r in rows if r["route"] == "realtime"), key=lambda r: r["created_at"])
    sessions = [r for r in rows if r["route"] == "realtime_session"]
    assert len(sessions) == 1, gateway.log()
    assert [(r["route"], r["outcome"], r["tokens_in"], r["tokens_out"]) for r in responses] == [
        ("realtime", "success", 10, 3), ("realtime", "success", 12, 5)]
    assert [float(r["output_cost"]) for r in responses] == [0.003, 0.005]
    assert all(r["model_name"] == model["name"] and r["principal_kind"] == "user" for r in responses)
    [session] = sessions
    assert (session["count"], session["outcome"], float(session["output_cost"])) == (1, "success", 0)
    assert 0 < session["latency_ms"] <= duration_s * 1000 + 500
    usage = gateway.client.get("/v1/usage", headers={"authorization": f"Bearer {user['key']}"}).json()["usage"]
    assert round(sum(u["spent_usd"] for u in usage), 9) == 0.008

    # The provider saw its own key and the resolved model, never the caller's key.
    seen = testserve.client.get("/_debug/requests", params={"path": "/openai/v1/realtime", "limit": 50}).json()
    kinds = [e["body"].get("type") for e in reversed(seen["entries"])]
    assert kinds == ["session.update", "conversation.item.create", "response.create",
                     "conversation.item.create", "response.create"]
    assert all(e["key_presented"] == "testserve-key" and e["model"] == "gpt-realtime-test" for e in seen["entries"])
    assert all(user["key"] not in json.dumps(e) for e in seen["entries"])


def test_a_session_is_cut_when_its_budget_is_spent(gateway: Gateway, model: dict) -> None:
    """A daily cap of $0.010 and responses of 3 tokens ($0.003, reserved before each is sent): three
    go through, the fourth is refused before it reaches the provider with an `error` event naming
    budget_exceeded (and when it resets), and the session closes. The spend never passes the cap."""
    user = _person(gateway, model, daily_cap_usd="0.010")
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=user["key"], max_retries=0)
    with client.realtime.connect(model=model["name"]) as connection:
        for _ in range(3):
            text, done = _respond(connection, "go")
            assert done.type == "response.done", done
        _, refused = _respond(connection, "one more")
        assert refused.type == "error" and refused.error.code == "budget_exceeded", refused
        with pytest.raises(Exception):  # noqa: B017 - the SDK surfaces the closed socket as its own error
            for _ in range(10):
                connection.recv()
    rows = _rows(gateway, user["id"], at_least=5)
    denied = [r for r in rows if r["outcome"] == "denied"]
    assert [(r["status_code"], r["deny_reason"]) for r in denied] == [(429, "budget_exceeded")]
    spent = sum(float(r["input_cost"]) + float(r["output_cost"]) for r in rows)
    assert round(spent, 9) == 0.009
    [session] = [r for r in rows if r["route"] == "realtime_session"]
    assert session["deny_reason"] == "refused"


def test_refused_upgrades_get_their_status_and_a_row(gateway: Gateway, model: dict) -> None:
    url = gateway.base_url.replace("http://", "ws://") + "/v1/realtime"
    user = _person(gateway, model)
    stranger = gateway.create_user()
    cases = [
        ({}, f"?model={model['name']}", 401),
        ({"authorization": "Bearer mesh_live_nope"}, f"?model={model['name']}", 401),
        ({"authorization": f"Bearer {user['key']}"}, "?model=no-such-model", 404),
        ({"authorization": f"Bearer {user['key']}"}, "", 400),
        ({"authorization": f"Bearer {stranger['key']}"}, f"?model={model['name']}", 403),
        ({"authorization": f"Bearer {user['key']}", "x-meshfast-tags": "nope=1"}, f"?model={model['name']}", 400),
    ]
    for headers, query, status in cases:
        with pytest.raises(InvalidStatus) as refused:
            connect(url + query, additional_headers=headers, open_timeout=10)
        assert refused.value.response.status_code in ((status, 404) if status == 403 else (status,)), (
            headers, query, refused.value.response.status_code)
    other = gateway.base_url.replace("http://", "ws://") + "/v1/elsewhere"
    with pytest.raises(InvalidStatus) as refused:
        connect(other, additional_headers={"authorization": f"Bearer {user['key']}"}, open_timeout=10)
    assert refused.value.response.status_code == 404
    rows = _rows(gateway, user["id"], at_least=2)
    assert {(r["route"], r["status_code"]) for r in rows} >= {("realtime_session", 404), ("realtime_session", 400)}


@pytest.fixture()
def draining(fresh_dir: Any, testserve: EmulatedProviders) -> Iterator[Gateway]:
    gw = Gateway(fresh_dir / "data", workers=1, env={**SESSION_ENV, "MESHFAST_REALTIME_DRAIN_S": "3",
                                                      "MESHFAST_DRAIN_TIMEOUT_S": "1"}).start()
    try:
        yield gw
    finally:
        gw.stop()


def test_sigterm_lets_open_sessions_drain_then_tells_them_to_reconnect(
        draining: Gateway, testserve: EmulatedProviders) -> None:
    gw = draining
    provider = gw.create_provider("rt-drain", base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
    model = gw.create_model(provider["id"], "rt-drain-m", resolved_model="gpt-realtime-test",
                            input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")
    user = _person(gw, model)
    client = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=user["key"], max_retries=0)
    with client.realtime.connect(model=model["name"]) as connection:
        assert _respond(connection, "before")[1].type == "response.done"
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        # Past the calls' drain bound the session still serves.
        time.sleep(1.0)
        assert _respond(connection, "during")[1].type == "response.done"
        told = None
        deadline = time.monotonic() + 10
        with pytest.raises(Exception):  # noqa: B017 - the socket closes after the notice
            while time.monotonic() < deadline:
                event = connection.recv()
                if event.type == "error":
                    told = event
        assert told is not None and told.error.code == "session_draining"
    assert gw.proc.wait(30) == 0
    # Every response and the session itself are in the database after the exit.
    import asyncio

    import asyncpg

    from meshfast.store import database

    pg = database.EmbeddedPostgres(gw.data_dir / "pg")
    url = pg.start()
    try:
        async def rows() -> list[Any]:
            conn = await asyncpg.connect(url)
            try:
                return await conn.fetch("SELECT route, outcome, tokens_out FROM request_logs WHERE user_id = $1",
                                        user["id"])
            finally:
                await conn.close()

        found = sorted((r["route"], r["outcome"], r["tokens_out"]) for r in asyncio.run(rows()))
    finally:
        pg.stop()
    assert found == [("realtime", "success", 3), ("realtime", "success", 3), ("realtime_session", "success", 0)]


def test_one_response_at_a_time_and_the_caller_leaving_mid_response_holds_nothing(
        gateway: Gateway, model: dict, testserve: EmulatedProviders) -> None:
    """A second response.create while one runs is refused by the gateway (the session goes on); a
    caller that leaves mid-response is charged what it carried and leaves no reservation behind:
    the day's spend is what its rows say, and a cap that fits exactly that plus one response still
    admits that one."""
    # Room for the three responses below: $0.003 + the one cut short ($0.001: one word) + $0.003.
    user = _person(gateway, model, daily_cap_usd="0.007")
    url = gateway.base_url.replace("http://", "ws://") + f"/v1/realtime?model={model['name']}"
    auth = {"authorization": f"Bearer {user['key']}"}
    create = json.dumps({"type": "response.create", "response": {"max_output_tokens": 3}})
    with connect(url, additional_headers=auth, open_timeout=10) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(create)
        ws.send(create)
        kinds = []
        while "response.done" not in kinds:
            event = json.loads(ws.recv(timeout=10))
            kinds.append(event["type"] if event["type"] != "error" else event["error"]["code"])
        assert kinds.count("conversation_already_has_active_response") == 1 and kinds.count("response.done") == 1
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 200})
    try:
        with connect(url, additional_headers=auth, open_timeout=10) as ws:
            assert json.loads(ws.recv())["type"] == "session.created"
            ws.send(create)
            while json.loads(ws.recv(timeout=10))["type"] != "response.output_text.delta":
                pass
        # Gone mid-response: its reservation ($0.003) must come back.
        time.sleep(1.0)
    finally:
        testserve.client.post("/_debug/config", json={"delta_delay_ms": 0})
    with connect(url, additional_headers=auth, open_timeout=10) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(create)
        while (event := json.loads(ws.recv(timeout=10)))["type"] not in ("response.done", "error"):
            pass
        assert event["type"] == "response.done", event
    rows = _rows(gateway, user["id"], at_least=6)
    responses = [r for r in rows if r["route"] == "realtime"]
    # The response its caller left is charged what it carried (one word relayed: one token).
    assert sorted((r["outcome"], r["usage_estimated"], r["tokens_out"]) for r in responses) == [
        ("success", False, 3), ("success", False, 3), ("success", True, 1)]
    spent = sum(float(r["output_cost"]) for r in responses)
    assert spent == pytest.approx(0.007)
    usage = gateway.client.get("/v1/usage", headers=auth).json()["usage"]
    assert round(sum(u["spent_usd"] for u in usage), 9) == pytest.approx(spent)


def _model(gateway: Gateway, testserve: EmulatedProviders, resolved: str) -> dict[str, Any]:
    provider = gateway.create_provider(f"rt-p-{_tag()}", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key")
    return gateway.create_model(provider["id"], f"rt-m-{_tag()}", resolved_model=resolved,
                                input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")


def _events(ws: Any, until_type: str) -> list[dict[str, Any]]:
    out = []
    while True:
        event = json.loads(ws.recv(timeout=10))
        out.append(event)
        if event["type"] == until_type or event["type"] == "error":
            return out


def test_the_provider_key_never_reaches_the_client_and_a_refused_response_holds_nothing(
        gateway: Gateway, testserve: EmulatedProviders) -> None:
    """Any provider event may quote the provider's key (a failed response's details, a rate-limit
    note): the client sees it redacted. A response the provider refuses (an `error`, nothing
    started) settles at nothing and frees the session for the next one."""
    leaky = _model(gateway, testserve, "gpt-realtime-echo-key")
    user = _person(gateway, leaky)
    url = gateway.base_url.replace("http://", "ws://") + "/v1/realtime?model="
    auth = {"authorization": f"Bearer {user['key']}"}
    create = json.dumps({"type": "response.create", "response": {"max_output_tokens": 3}})
    with connect(url + leaky["name"], additional_headers=auth, open_timeout=10) as ws:
        seen = _events(ws, "session.created")
        ws.send(create)
        seen += _events(ws, "response.done")
        ws.send(b"binary frames are refused")
        seen += _events(ws, "error")
    text = json.dumps(seen)
    assert "testserve-key" not in text and "[redacted]" in text
    assert seen[-1]["error"]["code"] == "invalid_request"

    refusing = _model(gateway, testserve, "gpt-realtime-refuse")
    user = _person(gateway, refusing, daily_cap_usd="5")
    auth = {"authorization": f"Bearer {user['key']}"}
    with connect(url + refusing["name"], additional_headers=auth, open_timeout=10) as ws:
        _events(ws, "session.created")
        for _ in range(3):
            ws.send(create)
            [error] = _events(ws, "error")
            assert error["error"]["code"] == "refused_by_provider", error
    usage = gateway.client.get("/v1/usage", headers=auth).json()["usage"]
    assert sum(u["spent_usd"] for u in usage) == 0
    rows = _rows(gateway, user["id"], at_least=4)
    assert sorted((r["route"], r["outcome"]) for r in rows) == [
        ("realtime", "upstream_error")] * 3 + [("realtime_session", "success")]


def test_a_sessions_instructions_and_the_providers_limits_are_reserved(gateway: Gateway, model: dict) -> None:
    """The reservation of a response counts the session's instructions (they go with every
    response) and takes the output limit the provider confirmed, not the one a client asked for:
    a large `instructions` against a small cap is refused before it reaches the provider."""
    priced = gateway.create_model(model["provider_id"], f"rt-in-{_tag()}", resolved_model="gpt-realtime-test",
                                  input_price_per_1k_tokens="1", output_price_per_1k_tokens="1")
    user = _person(gateway, priced, daily_cap_usd="0.05")
    url = gateway.base_url.replace("http://", "ws://") + f"/v1/realtime?model={priced['name']}"
    with connect(url, additional_headers={"authorization": f"Bearer {user['key']}"}, open_timeout=10) as ws:
        _events(ws, "session.created")
        ws.send(json.dumps({"type": "session.update", "session": {"instructions": "be brief " * 40_000,
                                                                  "max_output_tokens": 3}}))
        _events(ws, "session.updated")
        ws.send(json.dumps({"type": "response.create"}))
        refused = _events(ws, "response.done")[-1]
    assert refused["type"] == "error" and refused["error"]["code"] == "budget_exceeded", refused


def test_a_session_a_data_protection_policy_covers_is_refused(gateway: Gateway, model: dict) -> None:
    """Audio cannot be scanned: a session that a policy with a detector on would cover is refused at
    its upgrade (400, a row saying why), and one the policy does not cover opens."""
    url = gateway.base_url.replace("http://", "ws://") + f"/v1/realtime?model={model['name']}"
    covered, free = _person(gateway, model), _person(gateway, model)
    name = f"rt-dlp-{_tag()}"
    put = gateway.client.put(f"/admin/dlp/policies/{name}", json={
        "detectors": {"card": "redact"}, "applies_to": {"users": [covered["id"]]}},
        headers={"authorization": f"Bearer {gateway.admin_token}"})
    assert put.status_code == 200, put.text
    try:
        def refused() -> bool:
            try:
                connect(url, additional_headers={"authorization": f"Bearer {covered['key']}"}, open_timeout=10).close()
            except InvalidStatus as exc:
                return exc.response.status_code == 400
            return False

        until(refused, 3.0, "the policy on every worker")
        with connect(url, additional_headers={"authorization": f"Bearer {free['key']}"}, open_timeout=10) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        rows = _rows(gateway, covered["id"], at_least=1)
        assert any((r["route"], r["status_code"], r["deny_reason"]) == (
            "realtime_session", 400, "sensitive_content_blocked") for r in rows), rows
    finally:
        gateway.admin("DELETE", f"/admin/dlp/policies/{name}")
