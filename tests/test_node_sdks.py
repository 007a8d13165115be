"""The official Node SDKs (`openai`, `@anthropic-ai/sdk`, pinned in tests/node/package.json),
unmodified, base_url pointed at meshfast: OpenAI Chat, OpenAI Responses and Anthropic Messages
against every upstream family (testserve), non-streaming and streaming chat with exact text and
usage, and a tool call. Skipped only when `node` or `npm` is missing; `npm ci` installs the
locked packages into tests/node/node_modules the first time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import EmulatedProviders, Gateway

from testserve.content import TOOL_ARGUMENTS, Prompt, reply_text

NODE_DIR = Path(__file__).resolve().parent / "node"
FAMILIES = ("anthropic", "openai", "openai_responses", "gemini", "ollama")
PREFIX = {"anthropic": "anthropic", "openai": "openai", "openai_responses": "openai", "gemini": "gemini",
          "ollama": "ollama"}

pytestmark = pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                                reason="node and npm are needed to run the Node SDKs")


def _npm_ci() -> None:
    """Installs the locked packages once; a half-finished install is redone."""
    marker = NODE_DIR / "node_modules" / ".package-lock.json"
    if marker.exists():
        return
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=300,
                   capture_output=True)


@pytest.fixture(scope="module")
def node_results(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    """One run of tests/node/sdk_check.mjs over every family's chat and tools models."""
    _npm_ci()
    user = gateway.create_user()
    chat_models: list[str] = []
    tools_models: list[str] = []
    for family in FAMILIES:
        provider = gateway.create_provider(
            f"ts-node-{family}", family=family, base_url=f"{testserve.base_url}/{PREFIX[family]}",
            api_key="testserve-key", retry_backoff_ms=20, max_retries=0,
        )
        for scenario, names in (("ok", chat_models), ("tools", tools_models)):
            model = gateway.create_model(provider["id"], f"node-{family}-{scenario}", resolved_model=f"dummy-{scenario}")
            gateway.grant(user["id"], model["id"])
            names.append(model["name"])
    env = dict(os.environ, MESHFAST_BASE_URL=gateway.base_url, MESHFAST_KEY=user["key"],
               MESHFAST_CHAT_MODELS=",".join(chat_models), MESHFAST_TOOLS_MODELS=",".join(tools_models))
    done = subprocess.run(["node", "sdk_check.mjs"], cwd=NODE_DIR, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _hello(family: str) -> str:
    prompt = Prompt()
    prompt.add_text("hello")
    return reply_text(family, prompt)


@pytest.mark.parametrize("family", FAMILIES)
def test_node_openai_chat_reaches_every_family(node_results: dict[str, Any], family: str) -> None:
    """openai-node Chat Completions: exact text and usage streamed and not, then a tool call."""
    got = node_results[f"node-{family}-ok"]["openai_chat"]
    for mode in ("plain", "stream"):
        result = got[mode]
        assert "error" not in result, result
        assert (result["text"], result["finish"]) == (_hello(family), "stop"), mode
        assert result["usage"]["prompt_tokens"] > 0 and result["usage"]["completion_tokens"] > 0, mode
    for mode in ("tool", "tool_stream"):
        assert got[mode] == {"finish": "tool_calls", "name": "get_weather", "arguments": TOOL_ARGUMENTS}, mode


@pytest.mark.parametrize("family", FAMILIES)
def test_node_openai_responses_reaches_every_family(node_results: dict[str, Any], family: str) -> None:
    """openai-node Responses: exact text and usage streamed and not, then a function call."""
    got = node_results[f"node-{family}-ok"]["openai_responses"]
    for mode in ("plain", "stream"):
        result = got[mode]
        assert "error" not in result, result
        assert result["text"] == _hello(family), mode
        assert result["usage"]["input_tokens"] > 0 and result["usage"]["output_tokens"] > 0, mode
    assert got["tool"] == {"name": "get_weather", "arguments": TOOL_ARGUMENTS}


@pytest.mark.parametrize("family", FAMILIES)
def test_node_anthropic_reaches_every_family(node_results: dict[str, Any], family: str) -> None:
    """anthropic-sdk-typescript Messages: exact text and usage streamed and not, then tool_use."""
    got = node_results[f"node-{family}-ok"]["anthropic"]
    for mode in ("plain", "stream"):
        result = got[mode]
        assert "error" not in result, result
        assert (result["text"], result["stop"]) == (_hello(family), "end_turn"), mode
        assert result["usage"]["input_tokens"] > 0 and result["usage"]["output_tokens"] > 0, mode
    for mode in ("tool", "tool_stream"):
        assert got[mode] == {"stop": "tool_use", "name": "get_weather", "arguments": TOOL_ARGUMENTS}, mode
