"""POST /v1/embeddings?model= and /v1/generate?model= (sync and async_poll), Mesh shapes, real workers."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from conftest import EmulatedProviders, Gateway


@pytest.fixture(scope="module")
def world(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    openai = gateway.create_provider("eg-openai", family="openai", base_url=f"{testserve.base_url}/openai",
                                     api_key="testserve-key")
    gemini = gateway.create_provider("eg-gemini", family="gemini", base_url=f"{testserve.base_url}/gemini",
                                     api_key="testserve-key")
    video = gateway.create_provider(
        "eg-video-jobs", family="generic", base_url=testserve.base_url, api_key="testserve-key",
        endpoint_url=f"{testserve.base_url}/openai/v1/chat/completions",
        header_template={"authorization": "Bearer {{api_key}}"},
        request_body_template={"model": "{{model}}", "messages": [{"role": "user", "content": "{{query}}"}],
                               "stream": True},
        response_delta_path="choices.0.delta.content",
        generation_endpoint_url=f"{testserve.base_url}/video/v1/jobs",
        generation_request_body_template={"model": "{{model}}", "prompt": "{{prompt_json}}"},
        generation_mode="async_poll", generation_job_id_path="id",
        generation_status_url_template=f"{testserve.base_url}/video/v1/jobs/{{{{job_id}}}}",
        generation_status_path="status",
        generation_content_url_template=f"{testserve.base_url}/video/v1/jobs/{{{{job_id}}}}/content",
        generation_poll_interval_ms=100, generation_max_wait_seconds=20,
    )
    user = gateway.create_user()
    models = {
        "eg-embed": gateway.create_model(openai["id"], "eg-embed", resolved_model="dummy-embed", kind="embedding"),
        "eg-embed-gemini": gateway.create_model(gemini["id"], "eg-embed-gemini", resolved_model="dummy-embed",
                                                kind="embedding"),
        "eg-embed-badjson": gateway.create_model(openai["id"], "eg-embed-badjson", resolved_model="dummy-badjson",
                                                 kind="embedding"),
        "eg-image": gateway.create_model(openai["id"], "eg-image", resolved_model="dummy-image",
                                         kind="image_generation", output_media_type="image/png"),
        "eg-video": gateway.create_model(gemini["id"], "eg-video", resolved_model="dummy-video",
                                         kind="video_generation", output_media_type="video/mp4"),
        "eg-video-job": gateway.create_model(video["id"], "eg-video-job", resolved_model="dummy-video",
                                             kind="video_generation", output_media_type="video/mp4",
                                             price_per_second="0.01"),
        "eg-video-job-failed": gateway.create_model(video["id"], "eg-video-job-failed",
                                                    resolved_model="dummy-video-failed", kind="video_generation"),
        "eg-chat": gateway.create_model(openai["id"], "eg-chat", resolved_model="dummy-chat"),
    }
    for model in models.values():
        gateway.grant(user["id"], model["id"])
    return {"user": user, "models": models}


def _post(gateway: Gateway, key: str, route: str, model: str, body: Any) -> Any:
    return gateway.client.post(route, params={"model": model}, json=body,
                               headers={"authorization": f"Bearer {key}"}, timeout=30)


@pytest.mark.parametrize("model", ["eg-embed", "eg-embed-gemini"])
def test_embeddings_return_the_vector_and_write_a_priced_row(gateway: Gateway, world: dict[str, Any], model: str) -> None:
    """One text in, one vector out in Mesh's shape; the row carries the input tokens."""
    response = _post(gateway, world["user"]["key"], "/v1/embeddings", model, {"input": "The quick brown fox"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == response.headers["x-request-id"] and body["model"] == model
    assert len(body["embedding"]) == 16 and all(isinstance(v, float) for v in body["embedding"])
    row = gateway.fetch_row(body["id"])
    assert row["outcome"] == "success" and row["route"] == "embeddings"
    assert row["tokens_in"] == body["usage"]["input_tokens"]


def test_embedding_of_a_non_vector_is_502(gateway: Gateway, world: dict[str, Any]) -> None:
    """An upstream answer without a vector at the configured path is 502 upstream_unavailable."""
    response = _post(gateway, world["user"]["key"], "/v1/embeddings", "eg-embed-badjson", {"input": "x"})
    assert response.status_code == 502 and response.json()["error"] == "upstream_unavailable"
    assert gateway.fetch_row(response.headers["x-request-id"])["outcome"] == "upstream_error"


@pytest.mark.parametrize(("route", "model", "body"), [
    ("/v1/embeddings", "eg-embed", {"input": ""}),
    ("/v1/embeddings", "eg-embed", {"input": 3}),
    ("/v1/generate", "eg-image", {"prompt": ""}),
    ("/v1/generate", "eg-image", {}),
])
def test_empty_inputs_are_400(gateway: Gateway, world: dict[str, Any], route: str, model: str, body: Any) -> None:
    """Embeddings need a non-empty input string, generation a non-empty prompt."""
    response = _post(gateway, world["user"]["key"], route, model, body)
    assert response.status_code == 400 and response.json()["error"] == "invalid_request"


def test_routes_only_reach_models_of_their_kind(gateway: Gateway, world: dict[str, Any]) -> None:
    """A chat model is not an embedding model: 403 model_not_permitted, as Mesh."""
    response = _post(gateway, world["user"]["key"], "/v1/embeddings", "eg-chat", {"input": "x"})
    assert response.status_code == 403 and response.json()["error"] == "model_not_permitted"
    response = _post(gateway, world["user"]["key"], "/v1/generate", "eg-embed", {"prompt": "x"})
    assert response.status_code == 403


@pytest.mark.parametrize(("model", "media_type", "magic"), [
    ("eg-image", "image/png", b"\x89PNG"),
    ("eg-video", "video/mp4", b"ftyp"),
])
def test_sync_generation_returns_base64_media(gateway: Gateway, world: dict[str, Any], model: str,
                                              media_type: str, magic: bytes) -> None:
    """Sync generation: the media path's string becomes a base64 output with the model's media type."""
    response = _post(gateway, world["user"]["key"], "/v1/generate", model, {"prompt": "a lighthouse at dusk"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["media_type"] == media_type and body["output"] == body["outputs"][0]
    assert body["output"]["type"] == "base64"
    assert magic in base64.b64decode(body["output"]["data"])[:16]
    assert gateway.fetch_row(body["id"])["outcome"] == "success"


def test_async_poll_generation_submits_polls_and_fetches(gateway: Gateway, world: dict[str, Any],
                                                         testserve: EmulatedProviders) -> None:
    """async_poll: submit, poll the status URL until completed, fetch the content as base64."""
    response = _post(gateway, world["user"]["key"], "/v1/generate", "eg-video-job", {"prompt": "waves"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["media_type"] == "video/mp4"
    assert b"ftyp" in base64.b64decode(body["output"]["data"])[:16]
    polls = [e for e in testserve.requests(path="/video/v1/jobs/") if e["method"] == "GET"]
    assert len(polls) >= 2
    for entry in testserve.requests(path="/video/v1/jobs"):
        assert entry["key_leaked_in_body"] is False and entry["placeholders_left"] is False


def test_failed_generation_job_is_502(gateway: Gateway, world: dict[str, Any]) -> None:
    """A job that reports failure ends as 502 upstream_unavailable with a detail."""
    response = _post(gateway, world["user"]["key"], "/v1/generate", "eg-video-job-failed", {"prompt": "x"})
    assert response.status_code == 502, response.text
    assert response.json()["error"] == "upstream_unavailable"
    assert gateway.fetch_row(response.headers["x-request-id"])["outcome"] == "upstream_error"
