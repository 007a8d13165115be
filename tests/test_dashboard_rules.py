"""The dashboard's governance pages (issue 14, items 2, 5, 6 and 7) in a real browser: spend rules
(author with the form or the JSON, the 400's problems listed, dry-run, per-rule mode, utilization,
delete), the global enforcement switch, model restrictions and the notification channels and
deliveries. Playwright on Debian's chromium, as tests/test_dashboard.py, whose fixtures these
share; every page is checked with axe-core too."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import json
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from conftest import EmulatedProviders, Gateway

# NOTE: the browser, the admin who logs in and the checked tab are the dashboard tests' own fixtures.
from test_dashboard import Tab, admin, browser  # noqa: F401

from meshfast.dashboard import assets

Json = dict[str, Any]


def _tag() -> str:
    return secrets.token_hex(3)


def _put(gateway: Gateway, path: str, body: Any, etag: str) -> httpx.Response:
    return gateway.client.put(path, json=body, headers={"authorization": f"Bearer {gateway.admin_token}",
                                                        "if-match": etag})


# --- the assets: no browser needed ---------------------------------------------------------------


def _operations() -> list[tuple[str, re.Pattern[str]]]:
    from meshfast.admin.openapi import OPERATIONS

    return [(method, re.compile(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path)) + r"\Z"))
            for method, path, *_ in OPERATIONS]


def test_the_dashboard_reaches_the_governance_routes_and_every_route_it_calls_is_documented(gateway: Gateway) -> None:
    """The page links the rules and notifications pages; the script calls the rules, dry-run,
    enforcement, notifications and deliveries routes and sends model restrictions; every admin
    path it names is in the OpenAPI document; no HTML is built from strings."""
    page = gateway.client.get("/dashboard").text
    for route in ("#/rules", "#/notifications"):
        assert f'href="{route}"' in page
    script = assets()["app.js"].body.decode()
    for needle in ('"/admin/rules"', '"/admin/rules/dry-run"', '"/admin/enforcement"', '"/admin/notifications"',
                   "/admin/notifications/deliveries?", "`/admin/rules/${", "{ restrictions }", '"if-match"'):
        assert needle in script, needle
    code = re.sub(r"^\s*//.*$", "", script, flags=re.M)  # the header comment names what is not used
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in code, sink
    operations = _operations()
    named = set(re.findall(r"[\"`](/admin/[^\"`?]*)", script))
    assert len(named) > 20
    for path in named:
        concrete = re.sub(r"\$\{[^}]+\}", "x", path).rstrip("/")
        assert any(pattern.match(concrete) for _, pattern in operations), path


# --- helpers -------------------------------------------------------------------------------------


class RefusalTab(Tab):
    """A dashboard tab for tests that provoke refusals on purpose: the browser logs each 4xx answer
    as a console error; those of the statuses in ``expected`` are not counted as the page's errors."""

    def __init__(self, browser: Any, gateway: Gateway) -> None:  # noqa: F811
        super().__init__(browser, gateway)
        self.expected: set[int] = set()

    def _console(self, message: Any) -> None:
        if message.type == "error" and any(f"status of {status} " in message.text for status in self.expected):
            return
        super()._console(message)


@pytest.fixture
def tab(browser: Any, gateway: Gateway) -> Iterator[RefusalTab]:  # noqa: F811
    t = RefusalTab(browser, gateway)
    try:
        yield t
        assert t.errors == [], f"console errors (CSP violations show here too): {t.errors}"
    finally:
        t.close()


def _spend(gateway: Gateway, testserve: EmulatedProviders, calls: dict[str, int], tag: str) -> tuple[Json, dict[str, Json]]:
    """A tagged model and people who spent on it: ``calls`` maps a business unit-less label to how
    many calls that person makes. Returns the model and each person with ``spent_usd``."""
    provider = gateway.create_provider(f"dr-p-{_tag()}", base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
    model = gateway.create_model(provider["id"], f"dr-m-{_tag()}", resolved_model="dummy-chat", tags=[tag],
                                 input_price_per_1k_tokens="10", output_price_per_1k_tokens="10")
    people: dict[str, Json] = {}
    for label, count in calls.items():
        email = f"dr-{label}-{_tag()}@example.com"
        response = gateway.admin("POST", "/admin/users", {"email": email, "display_name": label, "business_unit": tag})
        assert response.status_code == 201, response.text
        person = response.json()
        gateway.grant(person["id"], model["id"])
        for _ in range(count):
            answer = gateway.client.post("/v1/chat/completions", headers={"authorization": f"Bearer {person['key']}"},
                                         json={"model": model["name"], "max_tokens": 16,
                                               "messages": [{"role": "user", "content": "hello there"}]})
            assert answer.status_code == 200, answer.text
        people[label] = person
    time.sleep(0.5)
    for person in people.values():
        usage = gateway.client.get("/v1/usage", headers={"authorization": f"Bearer {person['key']}"}).json()
        person["spent_usd"] = next(u["spent_usd"] for u in usage["usage"] if u["model"] == model["name"])
    return model, people


@pytest.fixture
def enforcement_restored(gateway: Gateway) -> Iterator[None]:
    """The global switch as it was, whatever the test did to it (the gateway is shared)."""
    before = gateway.admin("GET", "/admin/enforcement").json()["enforce"]
    yield
    assert gateway.admin("PUT", "/admin/enforcement", {"enforce": before}).status_code == 200


# --- rules ---------------------------------------------------------------------------------------


def test_an_operator_authors_dry_runs_switches_and_deletes_a_rule(
        tab: RefusalTab, gateway: Gateway, testserve: EmulatedProviders, admin: dict[str, str],  # noqa: F811
        enforcement_restored: None) -> None:
    """From the Rules page: a draft with mistakes lists every problem from the 400; the fixed draft
    dry-runs to exactly the person over its threshold (with utilization); created in shadow mode it
    shows that person in its utilization; its mode switches to enforce against its ETag; an edit
    saves version 2 and a stale edit is refused; the global switch turns shadow and back; delete."""
    from playwright.sync_api import expect

    page = tab.page
    tag = f"dash-{_tag()}"
    model, people = _spend(gateway, testserve, {"big": 4, "small": 1}, tag)
    big, small = people["big"], people["small"]
    assert big["spent_usd"] > small["spent_usd"] > 0
    between = f"{(big['spent_usd'] + small['spent_usd']) / 2:.9f}"
    rule_id = f"dash-{_tag()}"
    tab.expected = {400, 409}  # the bad draft and the stale edit
    tab.login(admin)
    tab.go("rules", "Spend rules")

    # The structured form writes the JSON; a bad draft is refused with every problem listed.
    page.get_by_label("Rule id").fill(rule_id)
    page.get_by_label("Business units").fill(tag)
    page.get_by_label("Tag or model name").fill(tag)
    page.get_by_label("Window").select_option("daily")
    page.get_by_label("Threshold (USD)").fill("-1")
    page.get_by_label("Warn", exact=True).check()
    page.get_by_label("Leaders (their whole organisation)").fill("nobody-at-all@example.com")
    page.get_by_label("Weight").fill("40")
    rule = json.loads(page.locator("#rule-json").input_value())
    assert rule["id"] == rule_id and rule["mode"] == "shadow" and rule["weight"] == 40
    assert rule["entries"][0]["scope"] == {"tag": tag}
    assert rule["entries"][0]["actions"] == [{"type": "block"}, {"type": "warn", "text": ""}]
    page.get_by_role("button", name="Create rule").click()
    problems = page.locator("#rule-problems li")
    expect(problems.first).to_be_visible()
    listed = problems.all_inner_texts()
    assert any("threshold_usd" in p for p in listed) and any("leaders" in p for p in listed), listed
    assert any("text" in p for p in listed), listed
    assert gateway.admin("GET", f"/admin/rules/{rule_id}").status_code == 404

    # Fixed, then dry-run: only the big spender, blocked, at or over 100 %.
    page.get_by_label("Threshold (USD)").fill(between)
    page.get_by_label("Warn", exact=True).uncheck()
    page.get_by_label("Leaders (their whole organisation)").fill("")
    page.get_by_label("Weight").press("Tab")
    page.get_by_role("button", name="Dry-run", exact=True).click()
    rows = page.locator("#dry-run-table tbody tr[data-user-id]")
    expect(rows).to_have_count(1)
    assert rows.first.get_attribute("data-user-id") == big["id"]
    assert rows.first.get_attribute("data-action") == "block"
    assert float(rows.first.get_attribute("data-utilization")) >= 1.0
    expect(rows.first.locator("td[data-col='user_id']")).to_have_text(big["email"])
    assert gateway.admin("GET", f"/admin/rules/{rule_id}").status_code == 404, "a dry-run stores nothing"
    findings = {"rules-dry-run": tab.axe()}
    tab.screenshot("rules-dry-run")

    page.get_by_role("button", name="Create rule").click()
    row = page.locator(f"#rules-table tr[data-rule-id='{rule_id}']")
    expect(row).to_have_attribute("data-mode", "shadow")
    expect(row.locator("td[data-col='utilization'] [data-affected]")).to_have_attribute("data-affected", "1")
    stored = gateway.admin("GET", f"/admin/rules/{rule_id}")
    assert stored.status_code == 200 and stored.headers["etag"] == '"1"'
    assert stored.json()["entries"][0]["population"]["business_units"] == [tag]
    assert stored.json()["entries"][0]["threshold_usd"] == between.rstrip("0").rstrip(".")
    tab.screenshot("rules-created")

    # Per-rule mode, against the ETag read just before.
    page.get_by_role("button", name=f"Set rule {rule_id} to enforce").click()
    expect(row).to_have_attribute("data-mode", "enforce")
    expect(row).to_have_attribute("data-version", "2")
    assert gateway.admin("GET", f"/admin/rules/{rule_id}").json()["mode"] == "enforce"
    denied = gateway.client.post("/v1/chat/completions", headers={"authorization": f"Bearer {big['key']}"},
                                 json={"model": model["name"], "max_tokens": 16,
                                       "messages": [{"role": "user", "content": "hello"}]})
    assert denied.status_code == 429, denied.text

    # Edit: the JSON and the form are loaded from the stored rule; the save is a PUT with If-Match.
    page.get_by_role("button", name=f"Edit rule {rule_id}").click()
    expect(page.locator("#rule-editor h2")).to_have_text(f"Edit rule {rule_id}")
    assert page.get_by_label("Threshold (USD)").input_value() == stored.json()["entries"][0]["threshold_usd"]
    expect(page.get_by_label("Rule id")).to_have_attribute("readonly", "")
    page.get_by_label("Weight").fill("45")
    page.get_by_label("Weight").press("Tab")
    page.get_by_role("button", name="Save rule").click()
    expect(row).to_have_attribute("data-version", "3")
    assert gateway.admin("GET", f"/admin/rules/{rule_id}").json()["weight"] == 45

    # A stale edit: someone else saves in between; the page says so and nothing is overwritten.
    page.get_by_role("button", name=f"Edit rule {rule_id}").click()
    expect(page.locator("#rule-editor h2")).to_have_text(f"Edit rule {rule_id}")
    current = gateway.admin("GET", f"/admin/rules/{rule_id}")
    assert _put(gateway, f"/admin/rules/{rule_id}", {**current.json(), "weight": 50},
                current.headers["etag"]).status_code == 200
    page.get_by_label("Weight").fill("46")
    page.get_by_label("Weight").press("Tab")
    page.get_by_role("button", name="Save rule").click()
    expect(page.locator("#rule-problems")).to_contain_text("version_conflict")
    assert gateway.admin("GET", f"/admin/rules/{rule_id}").json()["weight"] == 50
    page.get_by_role("button", name="Cancel").click()

    # The JSON editor alone: a second entry, loaded into the form (which shows the first).
    edited = {"id": f"{rule_id}-json", "weight": 1, "mode": "inherit", "entries": [
        {"scope": {"model": model["name"]}, "window": "monthly", "threshold_usd": "1000", "actions": [{"type": "block"}]},
        {"population": {"tiers": ["<b>gold</b>"]}, "scope": {"tag": tag}, "window": "weekly", "threshold_usd": "2000",
         "actions": [{"type": "notify", "channels": ["webhook"]}]}]}
    page.locator("#rule-json").fill(json.dumps(edited))
    page.get_by_role("button", name="Load the JSON into the form").click()
    expect(page.locator("#rule-entries-note")).to_contain_text("2 entries")
    assert page.get_by_label("Tag or model name").input_value() == model["name"]
    assert page.get_by_label("Scope").input_value() == "model"
    page.get_by_role("button", name="Create rule").click()
    second = page.locator(f"#rules-table tr[data-rule-id='{rule_id}-json']")
    expect(second).to_have_attribute("data-mode", "inherit")
    # Text stays text: the tier's markup is shown, never parsed.
    expect(second.locator("td[data-col='entries'] li").nth(1)).to_contain_text("<b>gold</b>")
    assert second.locator("td[data-col='entries'] b").count() == 0
    assert len(gateway.admin("GET", f"/admin/rules/{rule_id}-json").json()["entries"]) == 2

    # The global switch: inherit follows it, the rule in enforce keeps its own mode.
    expect(page.locator("#enforcement-state")).to_have_attribute("data-enforce", "true")
    expect(second).to_have_attribute("data-effective-mode", "enforce")
    page.get_by_role("button", name="Switch rules to shadow mode").click()
    expect(page.locator("#enforcement-state")).to_have_attribute("data-enforce", "false")
    expect(second).to_have_attribute("data-effective-mode", "shadow")
    expect(row).to_have_attribute("data-effective-mode", "enforce")
    assert gateway.admin("GET", "/admin/enforcement").json() == {"enforce": False}
    findings["rules"] = tab.axe()
    tab.screenshot("rules-shadow")
    page.get_by_role("button", name="Enforce rules").click()
    expect(page.locator("#enforcement-state")).to_have_attribute("data-enforce", "true")

    for name in (rule_id, f"{rule_id}-json"):
        page.get_by_role("button", name=f"Delete rule {name}", exact=True).click()
        expect(page.locator(f"#rules-table tr[data-rule-id='{name}']")).to_have_count(0)
        assert gateway.admin("GET", f"/admin/rules/{name}").status_code == 404
    actions = {e["action"] for e in gateway.admin("GET", f"/admin/audit?actor={admin['email']}&page_size=200")
               .json()["entries"]}
    assert {"create_rule", "update_rule", "delete_rule", "update_enforcement"} <= actions
    assert {k: v for k, v in findings.items() if v} == {}


# --- restrictions ----------------------------------------------------------------------------------


def test_model_restrictions_are_edited_from_the_models_page(tab: RefusalTab, gateway: Gateway, admin: dict[str, str]) -> None:  # noqa: F811
    """The Models page edits a model's restrictions by email (sent as user ids, against the
    model's ETag), lists an unknown person as the API's problem, shows the result in the table,
    and removes them all."""
    from playwright.sync_api import expect

    page = tab.page
    tag = _tag()
    provider = gateway.create_provider(f"rs-p-{tag}")
    model = gateway.create_model(provider["id"], f"rs-m-{tag}")
    leader, exempt = gateway.create_user(f"rs-lead-{tag}@example.com"), gateway.create_user(f"rs-ex-{tag}@example.com")
    tab.expected = {400}  # the unknown person
    tab.login(admin)
    tab.go("models", "Models")
    page.get_by_role("button", name=f"Edit restrictions of model {model['name']}").click()
    form = page.locator("#restrictions-form")
    form.get_by_label("Leaders denied (with their organisations)").fill(f"{leader['email']}\nghost-{tag}@example.com")
    form.get_by_label("Exempt people (always allowed)").fill(exempt["email"])
    form.get_by_label("Business units closed").fill("sales, legal")
    form.get_by_label("Only these business units").check()
    form.get_by_label("Business units open").fill("payments")
    form.get_by_role("button", name="Save restrictions").click()
    expect(page.locator("#restrictions-problems li").first).to_contain_text(f"ghost-{tag}@example.com")
    assert gateway.admin("GET", f"/admin/models/{model['id']}").json()["restrictions"] is None
    findings = tab.axe()
    tab.screenshot("models-restrictions")

    form.get_by_label("Leaders denied (with their organisations)").fill(leader["email"])
    form.get_by_role("button", name="Save restrictions").click()
    row = page.locator(f"#models-table tr[data-name='{model['name']}']")
    expect(row.locator("td[data-col='restrictions']")).to_contain_text(f"denied to the organisations of {leader['email']}")
    expect(page.locator("#restrictions-form")).to_have_count(0)
    stored = gateway.admin("GET", f"/admin/models/{model['id']}").json()["restrictions"]
    assert stored == {"leader_deny": [leader["id"]], "leader_allow": None, "exempt": [exempt["id"]],
                      "business_units_closed": ["sales", "legal"], "business_units_open": ["payments"]}

    # Reopened, the form shows people by email; removing them all clears the restrictions.
    page.get_by_role("button", name=f"Edit restrictions of model {model['name']}").click()
    assert form.get_by_label("Exempt people (always allowed)").input_value() == exempt["email"]
    expect(form.get_by_label("Only these business units")).to_be_checked()
    expect(form.get_by_label("Only the organisations of these leaders")).not_to_be_checked()
    form.get_by_role("button", name="Remove all restrictions").click()
    expect(row.locator("td[data-col='restrictions']")).to_have_text("None")
    assert gateway.admin("GET", f"/admin/models/{model['id']}").json()["restrictions"] is None
    assert findings == []


# --- notifications -----------------------------------------------------------------------------------


_INSERT_EVENT = """
INSERT INTO rule_events (delivery_id, rule_id, entry, user_id, action, channel, "window", window_start,
                         threshold_nano, spend_nano, detail)
VALUES ($1, $2, 0, $3, 'notify', 'email', 'daily', $4, 90000000000, 91500000000, '{}'::jsonb)"""


def _delivery(gateway: Gateway, rule_id: str, user_id: str) -> str:
    """A notify event in the outbox, as the telemetry ingest writes it with the row that crossed."""
    delivery_id = uuid.uuid4()
    today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)

    async def run() -> None:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            await conn.execute(_INSERT_EVENT, delivery_id, rule_id, uuid.UUID(user_id), today)
        finally:
            await conn.close()

    # NOTE: in a thread: Playwright's sync API runs an event loop in this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run()).result()
    return str(delivery_id)


def test_notification_channels_are_set_and_deliveries_listed(tab: RefusalTab, gateway: Gateway, admin: dict[str, str]) -> None:  # noqa: F811
    """The Notifications page stores the webhook (with its secret and the local flag) and the
    SMTP relay, never shows a secret back, lists a refused URL's problem, and lists deliveries
    filtered by rule, with their text shown as text."""
    from playwright.sync_api import expect

    page = tab.page
    secret, password = "whsec-" + secrets.token_hex(12), "smtp-" + secrets.token_hex(12)
    person = gateway.create_user(f"nt-{_tag()}@example.com")
    rule_id = f"<img src=x id=xss-{_tag()}>"
    delivery_id = _delivery(gateway, rule_id, person["id"])
    try:
        tab.expected = {400}  # the loopback URL without the local flag
        tab.login(admin)
        tab.go("notifications", "Notifications")
        # A loopback URL without the local flag is SSRF: refused, with the problem listed.
        page.get_by_label("Webhook URL").fill("http://127.0.0.1:9/hook")
        page.get_by_label("Webhook secret").fill(secret)
        page.get_by_role("button", name="Save channels").click()
        expect(page.locator("#notifications-problems li").first).to_contain_text("webhook_url")
        assert gateway.admin("GET", "/admin/notifications").json()["webhook_url"] is None

        page.get_by_label("Local (allow loopback and private addresses)").check()
        page.get_by_label("SMTP host").fill("127.0.0.1")
        page.get_by_label("SMTP port").fill("2525")
        page.get_by_label("From address").fill("meshfast@example.com")
        page.get_by_label("SMTP username").fill("relay")
        page.get_by_label("SMTP password").fill(password)
        page.get_by_label("STARTTLS").check()
        page.get_by_role("button", name="Save channels").click()
        expect(page.get_by_label("Webhook secret")).to_have_value("")
        stored = gateway.admin("GET", "/admin/notifications").json()
        assert stored["webhook_url"] == "http://127.0.0.1:9/hook" and stored["webhook_local"] is True
        assert stored["webhook_secret_set"] is True
        assert stored["smtp"] == {"host": "127.0.0.1", "port": 2525, "from": "meshfast@example.com",
                                  "username": "relay", "starttls": True, "password_set": True}
        content = page.content()
        assert secret not in content and password not in content
        expect(page.locator("#webhook-secret-hint")).to_contain_text("A secret is set")

        # Saved again without typing the secrets: both are kept.
        page.get_by_role("button", name="Save channels").click()
        page.wait_for_timeout(300)
        again = gateway.admin("GET", "/admin/notifications").json()
        assert again["webhook_secret_set"] and again["smtp"]["password_set"] and again["version"] > stored["version"]

        page.get_by_label("Rule id").fill(rule_id)
        page.get_by_role("button", name="Apply filters").click()
        row = page.locator(f"#deliveries-table tr[data-delivery-id='{delivery_id}']")
        expect(row).to_be_visible()
        expect(page.locator("#deliveries-total")).to_have_attribute("data-total", "1")
        expect(row.locator("td[data-col='rule_id']")).to_have_text(rule_id)
        expect(row.locator("td[data-col='user_id']")).to_have_text(person["email"])
        assert page.locator("main img").count() == 0
        findings = tab.axe()
        tab.screenshot("notifications")

        # Emptied, the channels are removed.
        page.get_by_label("Webhook URL").fill("")
        page.get_by_label("SMTP host").fill("")
        page.get_by_role("button", name="Save channels").click()
        expect(page.locator("#webhook-secret-hint")).to_contain_text("required with a URL")
        cleared = gateway.admin("GET", "/admin/notifications").json()
        assert cleared["webhook_url"] is None and not cleared["webhook_secret_set"] and cleared["smtp"] is None
        assert findings == []
    finally:
        gateway.admin("PUT", "/admin/notifications", {"webhook_url": None, "webhook_secret": None, "smtp": None})
