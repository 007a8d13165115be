"""Attribution (issue "identity", items 4 and 5): X-Meshfast-Tags on data-plane calls lands in the
row (`tags`, an object), the summaries (`group_by=<tag key>`, `principal_kind`, `token_issuer`) and
the chargeback export; anything out of shape is a 400 `invalid_tags` in the route's own shape."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import secrets
from typing import Any

import openai
import pytest
from conftest import EmulatedProviders, Gateway, until


@pytest.fixture(scope="module")
def caller(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    provider = gateway.create_provider(f"attr-{secrets.token_hex(3)}", family="openai",
                                       base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
    model = gateway.create_model(provider["id"], f"attr-{secrets.token_hex(3)}", resolved_model="dummy-chat")
    user = gateway.create_user()
    gateway.grant(user["id"], model["id"])
    return {"model": model, "user": user}


def _window() -> dict[str, str]:
    now = dt.datetime.now(dt.UTC)
    return {"from": (now - dt.timedelta(hours=2)).isoformat(), "to": (now + dt.timedelta(hours=1)).isoformat()}


def test_tags_reach_the_row_the_summary_and_the_export(gateway: Gateway, caller: dict) -> None:
    model, user = caller["model"], caller["user"]
    workflow = f"checkout-{secrets.token_hex(2)}"
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=user["key"], max_retries=0,
                           default_headers={"X-Meshfast-Tags": f"platform=web ; workflow={workflow};harness=ci;"})
    ids = []
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=model["name"], messages=[{"role": "user", "content": "hi"}])
        assert raw.parse().choices[0].message.content
        ids.append(raw.headers["x-request-id"])
    mesh = gateway.client.post("/v1/proxy", params={"model": model["name"]}, json={"query": "hi"},
                               headers={"authorization": f"Bearer {user['key']}", "x-meshfast-tags": "platform=batch"})
    assert mesh.status_code == 200
    row = gateway.fetch_row(ids[0])
    stored = row["call_tags"]
    assert (json.loads(stored) if isinstance(stored, str) else stored) == \
        {"platform": "web", "workflow": workflow, "harness": "ci"}
    assert row["principal_kind"] == "user"
    listed = gateway.admin("GET", "/admin/logs?" + "&".join(f"{k}={v}" for k, v in {
        "request_id": ids[0], **_window()}.items()).replace("+", "%2B")).json()["logs"]
    assert listed[0]["tags"] == {"platform": "web", "workflow": workflow, "harness": "ci"}
    assert listed[0]["model_tags"] is None and listed[0]["principal_kind"] == "user"
    assert listed[0]["key_id"] == listed[0]["mesh_key_id"] is not None

    def groups(by: str) -> dict[Any, int]:
        params = {**_window(), "group_by": by, "user_id": user["id"]}
        r = gateway.admin("GET", "/admin/logs/summary?" + "&".join(f"{k}={v}" for k, v in params.items())
                          .replace("+", "%2B"))
        assert r.status_code == 200, r.text
        return {g["key"]: g["calls"] for g in r.json()["groups"]}

    until(lambda: groups("workflow").get(workflow) == 3, 10, "the workflow's group")
    # The Mesh-native call's row may come from the other worker, whose batch flushes on its own.
    gateway.fetch_row(mesh.headers["x-request-id"])
    assert groups("platform") == {"web": 3, "batch": 1}
    assert groups("harness") == {"ci": 3, None: 1}
    assert groups("principal_kind") == {"user": 4}
    assert groups("token_issuer") == {None: 4}
    params = {**_window(), "user_id": user["id"]}
    export = gateway.admin("GET", "/admin/logs/export.csv?" + "&".join(f"{k}={v}" for k, v in params.items())
                           .replace("+", "%2B"))
    lines = list(csv.DictReader(io.StringIO(export.text, newline="")))
    assert sorted(line["tags"] for line in lines) == \
        ["harness=ci;platform=web;workflow=" + workflow] * 3 + ["platform=batch"]
    assert {line["principal_kind"] for line in lines} == {"user"}


@pytest.mark.parametrize("header", [
    "team=payments", "platform=web;platform=app", "platform=we b", "platform=" + "x" * 65, "platform",
    "platform=", "platform=caf\u00e9", "workflow=a/b", ";".join(f"platform{i}=x" for i in range(40)),
])
def test_tags_out_of_shape_are_refused_in_the_routes_own_shape(gateway: Gateway, caller: dict, header: str) -> None:
    model, user = caller["model"], caller["user"]
    auth = {"authorization": f"Bearer {user['key']}", "x-meshfast-tags": header.encode("utf-8")}
    mesh = gateway.client.post("/v1/proxy", params={"model": model["name"]}, json={"query": "hi"}, headers=auth)
    assert (mesh.status_code, mesh.json()["error"]) == (400, "invalid_tags"), mesh.text
    entry = gateway.client.post("/v1/chat/completions", headers=auth,
                                json={"model": model["name"], "messages": [{"role": "user", "content": "hi"}]})
    assert entry.status_code == 400 and entry.json()["error"]["code"] == "invalid_tags", entry.text
    assert "X-Meshfast-Tags" in entry.json()["error"]["message"] or "tags" in entry.text
    row = gateway.fetch_row(mesh.headers["x-request-id"])
    assert (row["outcome"], row["deny_reason"], str(row["user_id"])) == ("denied", "invalid_tags", user["id"])
    # Authentication first: a bad key with bad tags is a 401.
    bad = gateway.client.post("/v1/proxy", params={"model": model["name"]}, json={"query": "hi"},
                              headers={**auth, "authorization": "Bearer mesh_live_" + "A" * 43})
    assert bad.status_code == 401


def test_tag_keys_may_not_shadow_the_summaries_own_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshfast import settings

    for keys in ("platform,business_unit", "tier", "workflow,token_issuer"):
        monkeypatch.setenv("MESHFAST_TAG_KEYS", keys)
        with pytest.raises(SystemExit, match="may not use"):
            settings.tag_keys_env()
    for keys in ("Platform", "a b", ",".join(f"k{i}" for i in range(17))):
        monkeypatch.setenv("MESHFAST_TAG_KEYS", keys)
        with pytest.raises(SystemExit):
            settings.tag_keys_env()
    monkeypatch.setenv("MESHFAST_TAG_KEYS", "team, workflow ,team")
    assert settings.tag_keys_env() == ("team", "workflow")
