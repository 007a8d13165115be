"""Data protection's detection model (issue "DLP", item 5): a local model beside the pattern rules
finds names and addresses; the gateway treats what it found like the rules' matches (block,
redact, pseudonymize with restore) and fails closed when it does not answer. The model here is a
small local server (the real one would be an NER service such as Presidio) that finds a fixed
set of names and addresses and can be switched to failing or slow."""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import EmulatedProviders, Gateway, until

PEOPLE = ("Ada Lovelace", "Charles Babbage")
PLACES = ("221B Baker Street",)


class Model:
    """The detection model's stand-in: ``mode`` ok, down (500) or slow (past the timeout)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.asked: list[list[str]] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                texts = json.loads(self.rfile.read(int(self.headers["content-length"])))["texts"]
                model.asked.append(texts)
                if model.mode == "slow":
                    time.sleep(1.5)
                if model.mode == "down":
                    self.send_response(500)
                    self.end_headers()
                    return
                entities = [{"index": i, "start": m.start(), "end": m.end(), "type": kind}
                            for i, text in enumerate(texts)
                            for kind, names in (("PERSON", PEOPLE), ("LOCATION", PLACES))
                            for m in re.finditer("|".join(map(re.escape, names)), text)]
                body = json.dumps({"entities": entities}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/detect"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def modelled(tmp_path_factory: pytest.TempPathFactory, testserve: EmulatedProviders) -> Iterator[dict[str, Any]]:
    model = Model()
    gw = Gateway(Path(tmp_path_factory.mktemp("dlp-model")) / "data", workers=2, env={
        "MESHFAST_DLP_MODEL_URL": model.url, "MESHFAST_DLP_MODEL_TIMEOUT_MS": "300"}).start()
    try:
        provider = gw.create_provider(f"dm-{secrets.token_hex(3)}", base_url=f"{testserve.base_url}/openai",
                                      api_key="testserve-key")
        chat = gw.create_model(provider["id"], f"dm-chat-{secrets.token_hex(3)}", resolved_model="dummy-model-dlp")
        guarded, other = gw.create_user(), gw.create_user()
        for u in (guarded, other):
            gw.grant(u["id"], chat["id"])
        yield {"gw": gw, "model": model, "chat": chat, "guarded": guarded, "other": other}
    finally:
        gw.stop()
        model.close()


def _policy(gw: Gateway, name: str, body: dict[str, Any]) -> None:
    r = gw.client.put(f"/admin/dlp/policies/{name}", json=body, headers={"authorization": f"Bearer {gw.admin_token}"})
    assert r.status_code == 200, r.text


def _seen(testserve: EmulatedProviders) -> str:
    entries = testserve.client.get("/_debug/requests", params={"model": "dummy-model-dlp", "limit": 20}).json()
    return json.dumps([e["body"] for e in entries["entries"]])


def _proxy(gw: Gateway, chat: dict, user: dict, query: str) -> Any:
    return gw.client.post("/v1/proxy", params={"model": chat["name"]}, json={"query": query},
                          headers={"authorization": f"Bearer {user['key']}"})


def test_names_and_addresses_the_model_finds_are_pseudonymized_redacted_or_blocked(
        modelled: dict[str, Any], testserve: EmulatedProviders) -> None:
    gw, model, chat, guarded = modelled["gw"], modelled["model"], modelled["chat"], modelled["guarded"]
    name = f"names-{secrets.token_hex(3)}"
    _policy(gw, name, {"detectors": {"person": "pseudonymize", "address": "block", "card": "redact"},
                       "applies_to": {"users": [guarded["id"]]}})
    try:
        until(lambda: _proxy(gw, chat, guarded, f"meet at {PLACES[0]}").status_code == 400, 3.0, "the policy")
        blocked = _proxy(gw, chat, guarded, f"meet at {PLACES[0]}")
        assert blocked.json()["error"] == "sensitive_content_blocked" and blocked.json()["detectors"] == ["address"]
        assert PLACES[0] not in blocked.text

        testserve.client.delete("/_debug/requests")
        oa = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=guarded["key"], max_retries=0)
        prompt = f"{PEOPLE[0]} wrote to {PEOPLE[1]}; {PEOPLE[0]} pays with 4111 1111 1111 1111"
        whole = oa.chat.completions.with_raw_response.create(
            model=chat["name"], messages=[{"role": "system", "content": f"You help {PEOPLE[1]}."},
                                          {"role": "user", "content": prompt}])
        text = whole.parse().choices[0].message.content
        seen = _seen(testserve)
        assert all(person not in seen for person in PEOPLE) and "4111" not in seen, seen
        assert "[person-1]" in seen and "[person-2]" in seen and "[REDACTED:card]" in seen, seen
        # testserve echoes the prompt: the caller reads the names back, the card stays redacted.
        assert text.count(PEOPLE[0]) == 2 and PEOPLE[1] in text and "[person-" not in text, text
        streamed = "".join(c.choices[0].delta.content or "" for c in oa.chat.completions.create(
            model=chat["name"], messages=[{"role": "user", "content": prompt}], stream=True) if c.choices)
        assert streamed.count(PEOPLE[0]) == 2 and "[person-" not in streamed, streamed

        row = gw.fetch_row(whole.headers["x-request-id"])
        dlp = json.loads(row["dlp"]) if isinstance(row["dlp"], str) else row["dlp"]
        assert (dlp, row["dlp_action"]) == ({"person": 4, "card": 1}, "pseudonymize"), row
        # The model saw every text of the call: the prompt and the system prompt.
        assert any(prompt in texts and f"You help {PEOPLE[1]}." in texts for texts in model.asked)
    finally:
        gw.admin("DELETE", f"/admin/dlp/policies/{name}")


@pytest.mark.parametrize("mode", ["down", "slow"])
def test_a_model_that_does_not_answer_blocks_only_the_calls_that_need_it(
        modelled: dict[str, Any], mode: str) -> None:
    gw, model, chat = modelled["gw"], modelled["model"], modelled["chat"]
    guarded, other = modelled["guarded"], modelled["other"]
    name = f"closed-{secrets.token_hex(3)}"
    _policy(gw, name, {"detectors": {"person": "redact"}, "applies_to": {"users": [guarded["id"]]}})
    try:
        until(lambda: PEOPLE[0] not in _proxy(gw, chat, guarded, f"hi {PEOPLE[0]}").text, 3.0, "the policy")
        model.mode = mode
        started = time.monotonic()
        refused = _proxy(gw, chat, guarded, f"hi {PEOPLE[0]}")
        assert time.monotonic() - started < 1.2, "the model's timeout bounds the wait"
        assert refused.status_code == 400 and refused.json()["detectors"] == ["person"], refused.text
        row = gw.fetch_row(refused.headers["x-request-id"])
        assert (row["outcome"], row["deny_reason"], row["dlp_action"]) == (
            "denied", "sensitive_content_blocked", "block")
        # No policy wants the model's detectors for this person: the call goes on, unasked.
        asked = len(model.asked)
        assert _proxy(gw, chat, other, f"hi {PEOPLE[0]}").status_code == 200
        assert len(model.asked) == asked
    finally:
        model.mode = "ok"
        gw.admin("DELETE", f"/admin/dlp/policies/{name}")


def test_the_clients_texts_and_limits_fail_closed() -> None:
    """What the model is sent (keys, JSON inside strings, text inside base64), and the limits that
    fail closed before anything is sent: a body over the cap, one that is not JSON."""
    import asyncio
    import base64

    from meshfast.dlp_model import DetectionModel, texts_of

    doc = base64.b64encode(b"Letter to Ada Lovelace").decode()
    body = json.dumps({"messages": [{"content": "hi", "Ada Lovelace": 1,
                                     "arguments": json.dumps({"who": "Charles Babbage"})}], "data": doc}).encode()
    texts = texts_of(body)
    assert texts is not None
    assert {"Ada Lovelace", "Charles Babbage", "Letter to Ada Lovelace", "hi"} <= set(texts)
    assert texts_of(b"not json") is None
    model = DetectionModel("http://127.0.0.1:9/never", 0.2, 64)
    assert asyncio.run(model.find(b'{"q": "' + b"x" * 100 + b'"}')) == ([], True)
    assert asyncio.run(model.find(b"not json")) == ([], True)
    assert asyncio.run(model.find(b'{"q": 1}')) == ([], False)
