"""An attacker's pass over spend rules, notifications, chargeback and expiry: inputs the admin
API takes must not lose rows, hang a worker or quietly undo a control. Each test is the
regression test of one finding, through a real `meshfast serve` and real calls to testserve."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import asyncpg
import httpx
from conftest import EmulatedProviders, Gateway, until
from conftest import tag as _tag

Json = dict[str, Any]




def _db(gw: Gateway, query: str, *args: Any) -> list[Json]:
    async def run() -> list[Json]:
        conn = await asyncpg.connect(gw.database_url)
        try:
            return [dict(r) for r in await conn.fetch(query, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


def _user(gw: Gateway) -> Json:
    email = f"sec-{_tag()}@example.com"
    response = gw.admin("POST", "/admin/users", {"email": email, "display_name": email.split("@")[0]})
    assert response.status_code == 201, response.text
    return response.json()


def _model(gw: Gateway, testserve: EmulatedProviders, tags: list[str] | None = None) -> Json:
    """A chat model on testserve whose calls cost $0.003 (input free, 3 output tokens at $1 per 1k)."""
    provider = gw.create_provider(f"sec-p-{_tag()}", base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
    return gw.create_model(provider["id"], f"sec-m-{_tag()}", resolved_model="dummy-chat", tags=tags or [],
                           input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")


def _proxy(gw: Gateway, person: Json, model: Json) -> httpx.Response:
    return gw.client.post("/v1/proxy", params={"model": model["name"]},
                          headers={"authorization": f"Bearer {person['key']}"},
                          json={"query": "hello", "max_tokens": 3})


def _rule(gw: Gateway, body: Json) -> Json:
    response = gw.admin("POST", "/admin/rules", body)
    assert response.status_code == 201, response.text
    return response.json()


def _usage_rules(gw: Gateway, person: Json) -> set[str]:
    response = gw.client.get("/v1/usage", headers={"authorization": f"Bearer {person['key']}"})
    assert response.status_code == 200, response.text
    return {r["id"] for r in response.json()["rules"]}


# --- notifications ---------------------------------------------------------------------------------


def test_a_template_holding_backslash_u0000_text_still_reaches_the_outbox(gateway: Gateway,
                                                                          testserve: EmulatedProviders) -> None:
    """A notify template may hold the text `\\u0000` (a path, an escape shown in a message): the
    rule is taken, so the notification it fires must land in rule_events, not be dropped by the
    ingest as if it carried a NUL (the event's JSON holds `\\\\u0000`, which jsonb takes)."""
    tag = f"sec-{_tag()}"
    model = _model(gateway, testserve, tags=[tag])
    person = _user(gateway)
    gateway.grant(person["id"], model["id"])
    template = "Subject: spend under C:\\u0000\\reports\n\n{person} reached {spend}"
    rule = _rule(gateway, {"id": f"tpl-{_tag()}", "mode": "enforce", "entries": [{
        "scope": {"tag": tag}, "window": "daily", "threshold_usd": "0.001",
        "actions": [{"type": "notify", "channels": ["webhook"], "template": template}]}]})
    assert rule["entries"][0]["actions"][0]["template"] == template
    until(lambda: rule["id"] in _usage_rules(gateway, person), 5, "the rule on the worker")
    for _ in range(2):  # whichever worker serves it, the notify crossing fires on the first call
        assert _proxy(gateway, person, model).status_code == 200

    events = until(lambda: _db(gateway, "SELECT rule_id, action, channel, detail FROM rule_events "
                                         "WHERE user_id = $1::uuid", person["id"]), 10, "the outbox row")
    assert [(e["rule_id"], e["action"], e["channel"]) for e in events] == [(rule["id"], "notify", "webhook")]
    assert json.loads(events[0]["detail"])["template"] == template


# --- the dry-run ---------------------------------------------------------------------------------

DRY_RUN_PEOPLE = 20_000
DRY_RUN_MODELS = 10
DRY_RUN_ENTRIES = 50


def test_a_long_dry_run_does_not_stop_its_worker_answering(testserve: EmulatedProviders) -> None:
    """The core's dry-run visits every person for each entry: with 20,000 people holding 10 models
    of the scope and 50 entries it takes seconds. The only worker must go on answering meanwhile
    (it answered nothing, data plane included, until the dry-run was done)."""
    from conftest import running_gateway

    with running_gateway(1) as gw:
        models = [_model(gw, testserve, tags=["dry"]) for _ in range(DRY_RUN_MODELS)]

        async def load() -> None:
            conn = await asyncpg.connect(gw.database_url)
            try:
                await conn.execute(f"""
                    INSERT INTO users (email, display_name, tier)
                    SELECT 'dry' || g || '@example.com', 'Dry ' || g, 'normal'
                    FROM generate_series(1, {DRY_RUN_PEOPLE}) g""")
                await conn.execute("""
                    INSERT INTO user_model_access (user_id, model_id)
                    SELECT u.id, m FROM users u CROSS JOIN unnest($1::uuid[]) m WHERE u.email LIKE 'dry%'""",
                                   [m["id"] for m in models])
            finally:
                await conn.close()

        asyncio.run(load())
        person = _user(gw)  # a full rebuild: the worker has everyone loaded once this answers
        gw.grant(person["id"], models[0]["id"])
        assert _proxy(gw, person, models[0]).status_code == 200

        draft = {"id": f"dry-{_tag()}", "entries": [
            {"scope": {"tag": "dry"}, "window": "monthly", "threshold_usd": "0.001", "actions": [{"type": "block"}]}
            for _ in range(DRY_RUN_ENTRIES)]}
        answer: dict[str, Any] = {}

        def dry_run() -> None:
            started = time.monotonic()
            with httpx.Client(base_url=gw.base_url, timeout=120) as client:
                answer["response"] = client.post("/admin/rules/dry-run", json=draft,
                                                 headers={"authorization": f"Bearer {gw.admin_token}"})
            answer["took_s"] = time.monotonic() - started

        import threading

        runner = threading.Thread(target=dry_run)
        runner.start()
        time.sleep(0.2)
        slowest_s = 0.0
        with httpx.Client(base_url=gw.base_url, timeout=120) as probe:
            while runner.is_alive():
                started = time.monotonic()
                assert probe.get("/healthz").status_code == 200
                assert _proxy(gw, person, models[0]).status_code == 200
                slowest_s = max(slowest_s, time.monotonic() - started)
                time.sleep(0.05)
        runner.join()
        response = answer["response"]
        assert response.status_code == 200, response.text
        assert [a["user_id"] for a in response.json()["affected"]] == [person["id"]] * DRY_RUN_ENTRIES
        assert answer["took_s"] > 1.0, f"the dry-run took {answer['took_s']:.2f} s: too quick to show a stall"
        assert slowest_s < 0.5, f"the worker answered nothing for {slowest_s:.2f} s of a {answer['took_s']:.2f} s dry-run"


# --- models and rules ---------------------------------------------------------------------------


def test_renaming_a_model_keeps_the_rules_that_cap_it(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """Rules name models by name. Renaming a model must not leave a rule's scope naming no model
    (its cap then silently stopped applying, and the renamed model was served without it): the
    rule follows the model, with a new version, and calls stay refused on every worker."""
    model = _model(gateway, testserve)
    person = _user(gateway)
    gateway.grant(person["id"], model["id"])
    rule = _rule(gateway, {"id": f"ren-{_tag()}", "mode": "enforce", "entries": [{
        "scope": {"model": model["name"]}, "window": "daily", "threshold_usd": "0.001",
        "actions": [{"type": "block"}]}]})
    until(lambda: rule["id"] in _usage_rules(gateway, person), 5, "the rule on the worker")
    refused = _proxy(gateway, person, model)
    assert (refused.status_code, refused.json()["error"]) == (429, "budget_exceeded"), refused.text

    current = gateway.admin("GET", f"/admin/models/{model['id']}")
    renamed_name = f"{model['name']}-renamed"
    body = {k: current.json()[k] for k in ("provider_id", "resolved_model", "kind", "input_price_per_1k_tokens",
                                           "output_price_per_1k_tokens")}
    response = gateway.client.put(f"/admin/models/{model['id']}", json={**body, "name": renamed_name},
                                  headers={"authorization": f"Bearer {gateway.admin_token}",
                                           "if-match": current.headers["etag"]})
    assert response.status_code == 200, response.text

    stored = gateway.admin("GET", f"/admin/rules/{rule['id']}")
    assert stored.json()["entries"][0]["scope"] == {"model": renamed_name}
    assert stored.headers["etag"] != f'"{rule["version"]}"'
    renamed = {**model, "name": renamed_name}
    time.sleep(1.0)  # every worker has the rename (API.md: within 1 s)
    for _ in range(6):
        answer = _proxy(gateway, person, renamed)
        assert (answer.status_code, answer.json().get("error")) == (429, "budget_exceeded"), answer.text
    audit = gateway.admin("GET", "/admin/audit?action=update_model&page_size=50").json()["entries"]
    assert any(e["target"] == renamed_name and e["detail"].get("rules_renamed") == [rule["id"]] for e in audit)


# --- chargeback export ---------------------------------------------------------------------------


def test_export_cells_a_spreadsheet_could_read_as_a_formula_are_quoted(gateway: Gateway) -> None:
    """A caller chooses what a row's requested_model holds (any model name it asks for): a value
    that is a formula once its leading whitespace is trimmed (LibreOffice's "trim spaces" import),
    or that starts with a full-width `＝`, is exported with a leading quote like `=1+1` is."""
    import csv
    import io

    person = _user(gateway)
    names = [" =1+1", "\n=HYPERLINK(\"http://x\")", "\u00a0+1", "\u3000@SUM(1)", "\uff1d1+1", "\uff0d2", "plain"]
    for name in names:
        response = gateway.client.post("/v1/proxy", params={"model": name},
                                       headers={"authorization": f"Bearer {person['key']}"}, json={"query": "hi"})
        assert response.status_code == 403, response.text

    def exported() -> list[Json] | None:
        response = gateway.client.get("/admin/logs/export.csv", params={"user_id": person["id"]},
                                      headers={"authorization": f"Bearer {gateway.admin_token}"})
        assert response.status_code == 200, response.text
        rows = list(csv.DictReader(io.StringIO(response.text, newline="")))
        return rows if len(rows) >= len(names) else None

    cells = {row["requested_model"] for row in until(exported, 10, "the rows")}
    assert cells == {"'" + name for name in names[:-1]} | {"plain"}, cells
