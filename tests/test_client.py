"""meshfast.client, the caller library, against a live gateway (real workers, testserve upstream):
whole answers and streams (sync and async) equal what the raw route sends, content blocks,
embeddings and generation, the models and usage views, status headers, and every refusal raised as
the right exception with its deny reason, resume_at and Retry-After."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from conftest import EmulatedProviders, Gateway, tag

from meshfast import client as mc
from testserve.content import Prompt, reply_text


@pytest.fixture(scope="module")
def world(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    suffix = tag()
    anthropic = gateway.create_provider(f"cl-anthropic-{suffix}", family="anthropic",
                                        base_url=f"{testserve.base_url}/anthropic", api_key="testserve-key",
                                        max_retries=0)
    openai = gateway.create_provider(f"cl-openai-{suffix}", family="openai", base_url=f"{testserve.base_url}/openai",
                                     api_key="testserve-key")
    user = gateway.create_user()
    models = {
        "ok": gateway.create_model(anthropic["id"], f"cl-ok-{suffix}", resolved_model="dummy-ok",
                                   supports_image_in=True),
        "reset": gateway.create_model(anthropic["id"], f"cl-reset-{suffix}", resolved_model="dummy-conn-reset"),
        "error": gateway.create_model(anthropic["id"], f"cl-error-{suffix}", resolved_model="dummy-error-400"),
        "embed": gateway.create_model(openai["id"], f"cl-embed-{suffix}", resolved_model="dummy-embed",
                                      kind="embedding"),
        "image": gateway.create_model(openai["id"], f"cl-image-{suffix}", resolved_model="dummy-image",
                                      kind="image_generation", output_media_type="image/png"),
        "capped": gateway.create_model(openai["id"], f"cl-capped-{suffix}", resolved_model="dummy-chat"),
    }
    for model in models.values():
        gateway.grant(user["id"], model["id"])
    return {"user": user, "key": user["key"], "names": {k: m["name"] for k, m in models.items()},
            "models": models}


def _hello() -> Prompt:
    prompt = Prompt()
    prompt.add_text("hello")
    return prompt


def _raw_lines(gateway: Gateway, key: str, model: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = gateway.client.post("/v1/proxy", params={"model": model}, json=body,
                                   headers={"authorization": f"Bearer {key}"}, timeout=30)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def test_a_whole_answer_and_a_stream_carry_what_the_route_sends(gateway: Gateway, world: dict[str, Any]) -> None:
    name = world["names"]["ok"]
    expected = reply_text("anthropic", _hello(), "ok")
    raw = _raw_lines(gateway, world["key"], name, {"query": "hello", "max_tokens": 64})
    with mc.Client(gateway.base_url, world["key"]) as mesh:
        answer = mesh.proxy(name, "hello", max_tokens=64)
        assert answer.text == expected == "".join(line["delta"] for line in raw if "delta" in line)
        assert answer.usage == mc.Usage(raw[-1]["usage"]["input_tokens"], raw[-1]["usage"]["output_tokens"])
        assert not answer.incomplete and not answer.truncated
        assert answer.id == answer.status.request_id and answer.id.startswith("req_")
        assert gateway.fetch_row(answer.id)["outcome"] == "success"

        with mesh.stream(name, "hello", max_tokens=64) as stream:
            deltas = [event.text for event in stream if isinstance(event, mc.Delta)]
            result = stream.result
        assert len(deltas) > 1 and "".join(deltas) == result.text == expected
        assert result.usage.output_tokens > 0
        # Leaving the loop early: the result holds what arrived, marked incomplete.
        with mesh.stream(name, "hello", max_tokens=64) as stream:
            first = next(e for e in stream if isinstance(e, mc.Delta))
            partial = stream.result
        assert partial.text.startswith(first.text) and expected.startswith(partial.text)
        assert partial.incomplete or partial.text == expected  # done only if its final line arrived

        blocks = mesh.proxy(name, content=[mc.text("hello"), mc.image(b"\x89PNG\r\n\x1a\n", "image/png")],
                            max_tokens=64)
        assert blocks.text and not blocks.incomplete
        with pytest.raises(ValueError):
            mesh.proxy(name, "hello", content=[mc.text("both")])
        with pytest.raises(ValueError):
            mc.image(b"x", "image/png", url="https://example.com/x.png")


def test_truncation_a_cut_stream_and_an_upstream_error(gateway: Gateway, world: dict[str, Any]) -> None:
    with mc.Client(gateway.base_url, world["key"]) as mesh:
        short = mesh.proxy(world["names"]["ok"], "hello", max_tokens=2)
        assert short.truncated and short.usage.output_tokens >= 2
        cut = mesh.proxy(world["names"]["reset"], "hello", max_tokens=64)
        assert cut.incomplete and cut.text
        with pytest.raises(mc.UpstreamError) as failed:
            mesh.proxy(world["names"]["error"], "hello")
        assert failed.value.status == 502 and failed.value.code == "upstream_unavailable"
        assert failed.value.body["provider_status"] == 400 and failed.value.request_id.startswith("req_")


def test_embeddings_generation_models_and_usage(gateway: Gateway, world: dict[str, Any]) -> None:
    names = world["names"]
    with mc.Client(gateway.base_url, world["key"]) as mesh:
        embedding = mesh.embeddings(names["embed"], "hello there")
        assert embedding.model == names["embed"] and len(embedding.embedding) > 0
        assert embedding.input_tokens > 0 and embedding.status.request_id == embedding.id
        generation = mesh.generate(names["image"], "a red square")
        assert generation.media_type == "image/png" and generation.output
        listed = {m.model: m for m in mesh.models()}
        assert set(names.values()) <= set(listed)
        assert listed[names["ok"]].kind == "chat" and "image" in listed[names["ok"]].formats_accepted
        assert listed[names["embed"]].kind == "embedding"
        usage = mesh.usage()
        assert {u["model"] for u in usage["usage"]} >= set(names.values())


def test_refusals_are_exceptions_with_their_reason_and_resume_time(gateway: Gateway,
                                                                  world: dict[str, Any]) -> None:
    with pytest.raises(mc.AuthenticationError) as bad_key:
        mc.Client(gateway.base_url, "mesh_live_" + "x" * 43).proxy(world["names"]["ok"], "hello")
    assert (bad_key.value.status, bad_key.value.deny_reason) == (401, "invalid_or_revoked_key")

    with mc.Client(gateway.base_url, world["key"]) as mesh:
        with pytest.raises(mc.PermissionDenied) as unknown:
            mesh.proxy(f"cl-missing-{tag()}", "hello")
        assert (unknown.value.status, unknown.value.code) == (403, "model_not_permitted")
        with pytest.raises(mc.BadRequest) as empty:
            mesh.proxy(world["names"]["ok"], "")
        assert empty.value.code == "invalid_request"

        # A budget already spent: 429 budget_exceeded with resume_at (next UTC midnight) and Retry-After.
        capped = world["models"]["capped"]
        policy = {"daily_cap_usd": "0.000001", "max_calls_per_hour": None, "allowed_from": None,
                  "allowed_to": None, "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": True}
        assert gateway.admin("PUT", f"/admin/users/{world['user']['id']}/policies/{capped['id']}",
                             policy).status_code == 200
        refused = None
        for _ in range(40):
            try:
                mesh.proxy(world["names"]["capped"], "hello", max_tokens=64)
            except mc.RateLimited as exc:
                refused = exc
                break
            asyncio.run(asyncio.sleep(0.05))
        assert refused is not None, "the cap never refused"
        assert (refused.status, refused.code) == (429, "budget_exceeded")
        tomorrow = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0,
                                                                           microsecond=0)
        assert refused.resume_at == tomorrow
        assert refused.retry_after is not None and 0 < refused.retry_after <= 86_400
        assert refused.request_id and gateway.fetch_row(refused.request_id)["deny_reason"] == "budget_exceeded"
        assert "budget_exceeded" in str(refused)


def test_the_async_client_gives_the_same_answers(gateway: Gateway, world: dict[str, Any]) -> None:
    name = world["names"]["ok"]
    expected = reply_text("anthropic", _hello(), "ok")

    async def run() -> tuple[mc.Result, list[str], mc.Result, list[mc.ModelInfo], mc.Embedding]:
        async with mc.AsyncClient(gateway.base_url, world["key"]) as mesh:
            whole = await mesh.proxy(name, "hello", max_tokens=64)
            async with mesh.stream(name, "hello", max_tokens=64) as stream:
                deltas = [e.text async for e in stream if isinstance(e, mc.Delta)]
                streamed = await stream.result()
            models = await mesh.models()
            embedding = await mesh.embeddings(world["names"]["embed"], "hi")
            with pytest.raises(mc.PermissionDenied):
                await mesh.proxy(f"cl-missing-{tag()}", "hello")
            return whole, deltas, streamed, models, embedding

    whole, deltas, streamed, models, embedding = asyncio.run(run())
    assert whole.text == streamed.text == "".join(deltas) == expected
    assert not whole.incomplete and whole.usage.output_tokens > 0
    assert name in {m.model for m in models} and embedding.embedding


def test_stream_lines_fold_like_the_mesh_sdks() -> None:
    """Deltas in order, sources merged by URL, a line that does not parse skipped, chunks split
    anywhere, and no final line means incomplete."""
    lines = [b'{"id":"req_1","delta":"Hel"}', b'not json', b'{"id":"req_1","sources":[{"url":"https://a"}]}',
             b'{"id":"req_1","delta":"lo"}',
             b'{"id":"req_1","done":true,"usage":{"input_tokens":3,"output_tokens":2,"web_searches":1},'
             b'"sources":[{"url":"https://a","title":"A"},{"url":"https://b"}],"queries":["q"]}']
    raw = b"\n".join(lines) + b"\n"
    for cut in (1, 7, 13, len(raw) // 2):
        assembler = mc._Assembler(mc.Status(request_id="req_1"))
        events = []
        for start in range(0, len(raw), cut):
            events += assembler.feed(raw[start:start + cut])
        result = assembler.result()
        assert [e.text for e in events if isinstance(e, mc.Delta)] == ["Hel", "lo"]
        assert [s.url for e in events if isinstance(e, mc.Sources) for s in e.sources] == ["https://a"]
        assert result.text == "Hello" and not result.incomplete
        assert result.usage == mc.Usage(3, 2, 1) and result.queries == ["q"]
        assert [(s.url, s.title) for s in result.sources] == [("https://a", "A"), ("https://b", None)]
    assembler = mc._Assembler(mc.Status(request_id=None))
    assembler.feed(b'{"id":"req_2","delta":"partial"}\n')
    assert assembler.result().incomplete
