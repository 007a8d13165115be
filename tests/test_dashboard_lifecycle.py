"""The dashboard's governed-lifecycle pages in a real browser: a business unit administrator's
scoped view and its relaxing change waiting for approval, the approval queue (diff, a rejection
without a comment refused, approval, live and scheduled revisions), pilots, a model's onboarding
(staged, limited to a roster, graduated), the 409 of a referenced model's delete, business units,
and the single sign-on link. Playwright on Debian's chromium, as tests/test_dashboard.py, whose
fixtures these share; every new page is checked with axe-core.

Each test needs the admin routes it drives; one that is not in the admin API's OpenAPI document
(not built yet) makes the test skip with the missing route named.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import re
import secrets
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import SESSION_ENV, Gateway, running_gateway, until

# NOTE: the browser, the admin who logs in and the refusal-tolerant tab are the dashboard tests' own.
from test_dashboard import Tab, admin, browser, focus_by_tab  # noqa: F401
from test_dashboard_rules import RefusalTab

Json = dict[str, Any]
PASSWORD = "lifecycle-pass-" + secrets.token_hex(4)


def _tag() -> str:
    return secrets.token_hex(3)


def needs(gateway: Gateway, *routes: str) -> None:
    """Skip unless the gateway serves every ``"METHOD /path"``: a route it does not have answers
    404 ``not_found`` (or 405 for another method of a path it has), while one it has answers its
    own code (an id that names nothing is ``<thing>_not_found``, an empty body a 400). The probes
    name random ids and send empty bodies, so they change nothing."""
    missing = []
    for route in routes:
        method, path = route.split(" ", 1)
        concrete = re.sub(r"\{\w+\}", lambda _: str(uuid.uuid4()), path)
        body: Json | None = None if method in ("GET", "DELETE") else {}
        answer = gateway.client.request(method, concrete, json=body, follow_redirects=False,
                                        headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": "*"})
        if answer.status_code == 405 or (answer.status_code == 404 and answer.json().get("error") == "not_found"):
            missing.append(route)
    if missing:
        pytest.skip(f"the gateway has no route {', '.join(missing)} yet")


def documented(*routes: str) -> None:
    """Skip unless every ``"METHOD /path"`` is in the admin API's OpenAPI document (for routes a
    probe cannot tell apart: OIDC login answers 404 not_found when no issuer is configured)."""
    from meshfast.admin.openapi import OPERATIONS

    known = {(method, path) for method, path, *_ in OPERATIONS}
    missing = [r for r in routes if tuple(r.split(" ", 1)) not in known]
    if missing:
        pytest.skip(f"not in the admin API yet: {', '.join(missing)}")


def _ok(response: httpx.Response, *statuses: int) -> Json:
    assert response.status_code in (statuses or (200, 201)), response.text
    return response.json() if response.content else {}


@pytest.fixture
def tab(browser: Any, gateway: Gateway) -> Iterator[RefusalTab]:  # noqa: F811
    t = RefusalTab(browser, gateway)
    try:
        yield t
        assert t.errors == [], f"console errors (CSP violations show here too): {t.errors}"
    finally:
        t.close()


def login(tab: Tab, who: Json, heading: str) -> None:
    """The login form, as anyone (``heading``: the page it lands on)."""
    page = tab.page
    page.goto("/dashboard")
    page.get_by_label("Email", exact=True).fill(who["email"])
    page.get_by_label("Password", exact=True).fill(who["password"])
    page.get_by_role("button", name="Log in").click()
    tab.heading(heading)


def clear_toast(tab: Tab) -> None:
    """Empties the live region, so the next message looked for is the next one shown (a toast
    stays 8 s and two of the same form would match)."""
    tab.page.evaluate("() => { document.getElementById('toast').textContent = ''; }")


class Session:
    """An admin's session over HTTP (cookie and CSRF header), as the dashboard holds one."""

    def __init__(self, gateway: Gateway, who: Json) -> None:
        self.client = httpx.Client(base_url=gateway.base_url, timeout=10)
        answer = self.client.post("/admin/login", json={"email": who["email"], "password": who["password"]})
        assert answer.status_code == 200, answer.text
        self.csrf = answer.json()["csrf_token"]

    def request(self, method: str, path: str, body: Any = None, **headers: str) -> httpx.Response:
        return self.client.request(method, path, json=body, headers={"x-csrf-token": self.csrf, **headers})


@pytest.fixture
def unit(gateway: Gateway) -> Json:
    """A business unit with an administrator (who logs in), two of its people, one person of
    another unit, a model and a rule on the unit's people at $10 a day."""
    needs(gateway, "POST /admin/business-units", "GET /admin/business-units", "GET /admin/changes")
    tag = _tag()
    name = f"bu-{tag}"
    email = f"bu-admin-{tag}@example.com"
    made = _ok(gateway.admin("POST", "/admin/admins", {"email": email, "password": PASSWORD}), 201)
    unit = _ok(gateway.admin("POST", "/admin/business-units", {
        "name": name, "timezone": "Europe/Paris", "admins": [made["id"]], "daily_cap_lock_usd": "100"}), 201)
    people = []
    for label, bu in (("in-a", name), ("in-b", name), ("out", f"other-{tag}")):
        people.append(_ok(gateway.admin("POST", "/admin/users", {
            "email": f"bu-{label}-{tag}@example.com", "display_name": label, "business_unit": bu}), 201))
    provider = gateway.create_provider(f"bu-p-{tag}")
    model = gateway.create_model(provider["id"], f"bu-m-{tag}", tags=[f"bu-{tag}"])
    rule = {"id": f"bu-rule-{tag}", "weight": 10, "mode": "enforce", "entries": [{
        "population": {"business_units": [name]}, "scope": {"model": model["name"]}, "window": "daily",
        "threshold_usd": "10", "actions": [{"type": "block"}]}]}
    _ok(gateway.admin("POST", "/admin/rules", rule), 201)
    gateway.grant(people[0]["id"], model["id"])
    return {"unit": unit, "name": name, "admin": {"email": email, "password": PASSWORD, "id": made["id"]},
            "inside": people[:2], "outside": people[2], "model": model, "rule": rule}


def relax_rule(gateway: Gateway, unit: Json, threshold: str, activate_at: str | None = None) -> str:
    """The unit's administrator raises its rule's threshold over HTTP: a pending change's id."""
    session = Session(gateway, unit["admin"])
    rule_id = unit["rule"]["id"]
    current = session.request("GET", f"/admin/rules/{rule_id}")
    assert current.status_code == 200, current.text
    body = {**unit["rule"], "entries": [{**unit["rule"]["entries"][0], "threshold_usd": threshold}]}
    if activate_at:
        body["activate_at"] = activate_at
    answer = session.request("PUT", f"/admin/rules/{rule_id}", body, **{"if-match": current.headers["etag"]})
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "pending"
    return str(answer.json()["change_id"])


# --- a business unit's administrator ---------------------------------------------------------------


def test_a_unit_administrator_sees_only_its_scope_and_its_relaxing_change_waits(
        tab: RefusalTab, gateway: Gateway, unit: Json) -> None:
    """A business unit's administrator logs in: the navigation offers only its people (with
    their grants and policies), logs, rules, approvals, audit and units; every page names its scope; the users page lists its own
    people only. Raising its rule's threshold from the rules page answers 202: the page says the
    change was submitted for approval, and the approvals page shows it pending, read-only; so
    does raising one of its people's daily cap on the access page."""
    from playwright.sync_api import expect

    # NOTE: what lies outside its scope answers 403 (the browser logs each); the pages go on without it.
    tab.expected = {403}
    page = tab.page
    login(tab, unit["admin"], "Users & keys")
    expect(page.locator("#who")).to_contain_text("business unit administrator")
    expect(page.locator("#who")).to_contain_text(unit["name"])
    visible = [a.get_attribute("href") for a in page.locator("nav a:visible").all()]
    assert sorted(visible) == sorted(f"#/{r}" for r in ("users", "access", "logs", "rules", "approvals", "business-units", "audit")), visible
    expect(page.locator("#scope-note")).to_contain_text(unit["name"])
    for person in unit["inside"]:
        expect(page.locator(f"#users-table tr[data-email='{person['email']}']")).to_be_visible()
    expect(page.locator(f"#users-table tr[data-email='{unit['outside']['email']}']")).to_have_count(0)
    assert tab.axe() == []
    tab.screenshot("lifecycle-unit-users")
    # A page outside its scope is not offered, even by its address.
    page.goto("/dashboard#/providers")
    tab.heading("Users & keys")

    # Raising a person's daily cap (below the unit's lock) waits for approval too.
    tab.go("access", "Access & policies")
    page.get_by_label("User", exact=True).select_option(label=unit["inside"][0]["email"])
    page.get_by_role("button", name=f"Edit policy for {unit['model']['name']}").click()
    page.get_by_label("Daily cap (USD)").fill("50")
    clear_toast(tab)
    page.get_by_role("button", name="Save policy").click()
    expect(page.locator("#toast")).to_have_text(re.compile(r"^Submitted for approval \(change [0-9a-f-]{36}\)\.$"))
    assert tab.axe() == []

    tab.go("business-units", "Business units")
    expect(page.locator(f"#units-table tr[data-name='{unit['name']}']")).to_be_visible()
    expect(page.locator("#unit-form")).to_have_count(0)
    assert tab.axe() == []

    tab.go("rules", "Spend rules")
    rule_id = unit["rule"]["id"]
    page.get_by_role("button", name=f"Edit rule {rule_id}").click()
    expect(page.locator("#rule-form-title")).to_have_text(f"Edit rule {rule_id}")
    page.locator("#rule-threshold").fill("40")
    clear_toast(tab)
    page.get_by_role("button", name="Save rule").click()
    expect(page.locator("#toast")).to_have_text(re.compile(r"^Submitted for approval \(change [0-9a-f-]{36}\)\.$"))
    change_id = re.search(r"change ([0-9a-f-]{36})", page.locator("#toast").inner_text())[1]  # type: ignore[index]
    # Nothing changed yet: the stored rule keeps its threshold.
    stored = gateway.admin("GET", f"/admin/rules/{rule_id}").json()
    assert stored["entries"][0]["threshold_usd"] in ("10", 10, "10.000000000")
    assert tab.axe() == []

    tab.go("approvals", "Approvals")
    row = page.locator(f"#changes-table tr[data-change-id='{change_id}']")
    expect(row).to_have_attribute("data-status", "pending")
    row.get_by_role("button", name=f"View change {change_id}").click()
    expect(page.locator("#change-read-only")).to_be_visible()
    expect(page.locator("#change-approve")).to_have_count(0)
    expect(page.locator("#change-diff tr[data-changed='true']").first).to_be_visible()
    assert tab.axe() == []
    tab.screenshot("lifecycle-unit-approvals")


# --- a platform administrator's approvals ----------------------------------------------------------


def test_a_platform_administrator_reviews_the_diff_refuses_an_empty_rejection_and_approves(
        tab: RefusalTab, gateway: Gateway, unit: Json, admin: dict[str, str]) -> None:  # noqa: F811
    """The approval queue shows the unit's change pending first; its detail shows the proposed
    rule against the current one field by field and as a JSON line diff, with when it takes
    effect; a rejection without a comment is refused on the page, and the server's refusal of a
    blank one is shown too; approving applies it and the rule reads live; a change approved with
    a later activation reads as scheduled."""
    from playwright.sync_api import expect

    needs(gateway, "POST /admin/changes/{id}/approve", "POST /admin/changes/{id}/reject", "GET /admin/changes/{id}")
    tab.expected = {400}
    page = tab.page
    change_id = relax_rule(gateway, unit, "40")
    login(tab, admin, "Overview")
    tab.go("approvals", "Approvals")
    row = page.locator(f"#changes-table tr[data-change-id='{change_id}']")
    expect(row).to_have_attribute("data-status", "pending")
    assert page.locator("#changes-table tbody tr").first.get_attribute("data-status") == "pending"
    row.get_by_role("button", name=f"Review change {change_id}").click()
    detail = page.locator("#change-detail")
    expect(detail).to_have_attribute("data-status", "pending")
    changed = page.locator("#change-diff tr[data-field='entries.0.threshold_usd']")
    expect(changed).to_have_attribute("data-changed", "true")
    expect(changed.locator("td[data-col='proposed']")).to_contain_text("40")
    expect(changed.locator("td[data-col='current']")).to_contain_text("10")
    expect(page.locator("#change-line-diff span[data-op='+']").first).to_contain_text("40")
    expect(page.locator("#change-facts div[data-fact='Takes effect'] dd")).to_have_text("On approval")
    assert tab.axe() == []
    tab.screenshot("lifecycle-approval-detail")

    # An empty comment: the page refuses it and sends nothing.
    page.get_by_role("button", name="Reject change").click()
    expect(page.locator("#change-problems")).to_contain_text("Write a comment before rejecting")
    expect(page.locator("#reject-comment")).to_have_attribute("aria-invalid", "true")
    assert gateway.admin("GET", f"/admin/changes/{change_id}").json()["status"] == "pending"
    # A blank one reaches the server, whose refusal is shown as it answered.
    page.locator("#reject-comment").fill("   ")
    page.get_by_role("button", name="Reject change").click()
    expect(page.locator("#change-problems")).to_contain_text("comment_required")
    assert gateway.admin("GET", f"/admin/changes/{change_id}").json()["status"] == "pending"

    page.get_by_role("button", name="Approve change").click()
    expect(page.locator("#toast")).to_have_text(f"Change {change_id} approved.")
    expect(page.locator("#change-detail")).not_to_have_attribute("data-status", "pending")
    tab.go("rules", "Spend rules")
    rule_row = page.locator(f"#rules-table tr[data-rule-id='{unit['rule']['id']}']")
    expect(rule_row.locator("td[data-col='revision'] [data-revision-state]")).to_have_attribute("data-revision-state", "live")
    expect(rule_row.locator("td[data-col='revision']")).to_contain_text("live")
    assert str(gateway.admin("GET", f"/admin/rules/{unit['rule']['id']}").json()["entries"][0]["threshold_usd"]).startswith("40")

    # Approved with a later activation: scheduled, then shown as such.
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    scheduled_id = relax_rule(gateway, unit, "60", activate_at=later)
    tab.go("approvals", "Approvals")
    page.get_by_role("button", name=f"Review change {scheduled_id}").click()
    expect(page.locator("#change-facts div[data-fact='Takes effect'] dd")).not_to_have_text("On approval")
    page.get_by_role("button", name="Approve change").click()
    expect(page.locator("#toast")).to_have_text(f"Change {scheduled_id} approved.")
    tab.go("rules", "Spend rules")
    expect(rule_row.locator("td[data-col='revision'] [data-revision-state]")).to_have_attribute("data-revision-state", "scheduled")
    expect(rule_row.locator("td[data-col='revision']")).to_contain_text("scheduled for")
    tab.screenshot("lifecycle-rules-scheduled")


def test_a_rule_saved_for_the_units_local_midnight_reads_as_scheduled(
        tab: RefusalTab, gateway: Gateway, unit: Json, admin: dict[str, str]) -> None:  # noqa: F811
    """The rule editor's activation choice travels with the save: a platform administrator's edit
    set for the business unit's next local midnight is saved, not enforced, and the rule reads
    "scheduled for" that time until then."""
    from playwright.sync_api import expect

    page = tab.page
    rule_id = unit["rule"]["id"]
    login(tab, admin, "Overview")
    tab.go("rules", "Spend rules")
    row = page.locator(f"#rules-table tr[data-rule-id='{rule_id}']")
    expect(row.locator("td[data-col='revision'] [data-revision-state]")).to_have_attribute("data-revision-state", "live")
    row.get_by_role("button", name=f"Edit rule {rule_id}").click()
    expect(page.locator("#rule-form-title")).to_have_text(f"Edit rule {rule_id}")
    page.locator("#rule-threshold").fill("5")
    page.get_by_label("Takes effect", exact=True).select_option("local-midnight")
    page.get_by_role("button", name="Save rule").click()
    expect(page.locator("#toast")).to_have_text(f"Rule {rule_id} saved.")
    cell = row.locator("td[data-col='revision']")
    expect(cell.locator("[data-revision-state]")).to_have_attribute("data-revision-state", "scheduled")
    expect(cell).to_contain_text("scheduled for")
    stored = gateway.admin("GET", f"/admin/rules/{rule_id}").json()
    assert stored["saved_revision"] != stored["enforced_revision"]
    assert str(stored["entries"][0]["threshold_usd"]).startswith("10")


def test_a_scheduled_rule_that_fails_to_activate_says_why(
        tab: RefusalTab, gateway: Gateway, unit: Json, admin: dict[str, str]) -> None:  # noqa: F811
    """A rule revision scheduled onto a model that is deleted before it activates fails: the rules
    page says "activation failed" with the server's reason, beside the revision still enforced."""
    from playwright.sync_api import expect

    page = tab.page
    tag = _tag()
    provider = gateway.create_provider(f"doomed-p-{tag}")
    doomed = gateway.create_model(provider["id"], f"doomed-m-{tag}")
    rule_id = unit["rule"]["id"]
    current = gateway.admin("GET", f"/admin/rules/{rule_id}")
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)).isoformat()
    moved = {**unit["rule"], "entries": [{**unit["rule"]["entries"][0], "scope": {"model": doomed["name"]}}],
             "activate_at": at}
    scheduled = gateway.client.put(f"/admin/rules/{rule_id}", json=moved, headers={
        "authorization": f"Bearer {gateway.admin_token}", "if-match": current.headers["etag"]})
    assert scheduled.status_code == 200, scheduled.text
    assert gateway.admin("DELETE", f"/admin/models/{doomed['id']}").status_code == 200
    until(lambda: "activation_error" in gateway.admin("GET", f"/admin/rules/{rule_id}").json(), 20, "the failure")

    login(tab, admin, "Overview")
    tab.go("rules", "Spend rules")
    cell = page.locator(f"#rules-table tr[data-rule-id='{rule_id}'] td[data-col='revision']")
    expect(cell.locator("[data-revision-state]")).to_have_attribute("data-revision-state", "failed")
    expect(cell).to_contain_text("activation failed:")
    expect(cell).to_contain_text(doomed["name"])
    tab.screenshot("lifecycle-rules-activation-failed")


def test_a_rejected_change_keeps_the_rule_and_shows_the_comment(
        tab: RefusalTab, gateway: Gateway, unit: Json, admin: dict[str, str]) -> None:  # noqa: F811
    """Rejecting with a comment closes the change as rejected with the comment shown, and the
    rule stays as it was."""
    from playwright.sync_api import expect

    needs(gateway, "POST /admin/changes/{id}/reject", "GET /admin/changes/{id}")
    page = tab.page
    change_id = relax_rule(gateway, unit, "99")
    login(tab, admin, "Overview")
    page.goto(f"/dashboard#/approvals?change={change_id}")
    expect(page.locator("#change-detail")).to_have_attribute("data-status", "pending")
    page.locator("#reject-comment").fill("Too generous for this quarter.")
    page.get_by_role("button", name="Reject change").click()
    expect(page.locator("#toast")).to_have_text(f"Change {change_id} rejected.")
    expect(page.locator("#change-detail")).to_have_attribute("data-status", "rejected")
    expect(page.locator("#change-facts div[data-fact='Comment'] dd")).to_have_text("Too generous for this quarter.")
    assert str(gateway.admin("GET", f"/admin/rules/{unit['rule']['id']}").json()["entries"][0]["threshold_usd"]).startswith("10")


def test_approving_ones_own_change_is_refused_and_the_page_says_why(
        tab: RefusalTab, gateway: Gateway, unit: Json, admin: dict[str, str]) -> None:  # noqa: F811
    """A platform administrator's token scoped to the unit relaxes the rule (pending); the same
    administrator cannot approve it: the page shows the self-approval refusal, and the change
    stays pending."""
    from playwright.sync_api import expect

    needs(gateway, "POST /admin/changes/{id}/approve", "GET /admin/changes/{id}")
    tab.expected = {403}
    page = tab.page
    session = Session(gateway, admin)
    minted = session.request("POST", "/admin/tokens", {"name": f"scoped-{_tag()}", "business_units": [unit["name"]]})
    assert minted.status_code == 201, minted.text
    token = minted.json()["token"]
    rule_id = unit["rule"]["id"]
    current = gateway.admin("GET", f"/admin/rules/{rule_id}", token=token)
    assert current.status_code == 200, current.text
    body = {**unit["rule"], "entries": [{**unit["rule"]["entries"][0], "threshold_usd": "45"}]}
    relaxed = gateway.client.put(f"/admin/rules/{rule_id}", json=body,
                                 headers={"authorization": f"Bearer {token}", "if-match": current.headers["etag"]})
    assert relaxed.status_code == 202, relaxed.text
    change_id = relaxed.json()["change_id"]

    login(tab, admin, "Overview")
    page.goto(f"/dashboard#/approvals?change={change_id}")
    expect(page.locator("#change-detail")).to_have_attribute("data-status", "pending")
    page.get_by_role("button", name="Approve change").click()
    problems = page.locator("#change-problems")
    expect(problems).to_be_focused()
    expect(problems).to_contain_text("self_approval")
    expect(problems).to_contain_text("another platform administrator must review it")
    assert tab.axe() == []
    tab.screenshot("lifecycle-self-approval")
    assert gateway.admin("GET", f"/admin/changes/{change_id}").json()["status"] == "pending"


def test_a_change_is_reviewed_and_rejected_with_the_keyboard_alone(
        tab: RefusalTab, gateway: Gateway, unit: Json, admin: dict[str, str]) -> None:  # noqa: F811
    """From the navigation to the rejection, with Tab, Shift+Tab, Enter and typing only: the
    review opens with the focus on the change, and the rejection's comment and button follow."""
    from playwright.sync_api import expect

    needs(gateway, "POST /admin/changes/{id}/reject", "GET /admin/changes/{id}")
    page = tab.page
    change_id = relax_rule(gateway, unit, "70")
    login(tab, admin, "Overview")
    focus_by_tab(tab, "nav a[href='#/approvals']")
    page.keyboard.press("Enter")
    tab.heading("Approvals")
    focus_by_tab(tab, f"button[aria-label='Review change {change_id}']")
    page.keyboard.press("Enter")
    expect(page.locator("#change-title")).to_be_focused()
    focus_by_tab(tab, "#reject-comment")
    page.keyboard.type("Not this month.")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.locator("#change-detail")).to_have_attribute("data-status", "rejected")
    assert gateway.admin("GET", f"/admin/changes/{change_id}").json()["comment"] == "Not this month."


# --- business units ---------------------------------------------------------------------------------


def test_business_units_are_created_and_edited_from_the_page(tab: RefusalTab, gateway: Gateway,
                                                             admin: dict[str, str]) -> None:  # noqa: F811
    """A platform administrator creates a unit (time zone, an administrator, a cap lock) and edits
    it; a refused body shows the server's error."""
    from playwright.sync_api import expect

    needs(gateway, "POST /admin/business-units", "GET /admin/business-units", "GET /admin/business-units/{id}",
          "PUT /admin/business-units/{id}")
    tab.expected = {400}
    page = tab.page
    tag = _tag()
    helper = _ok(gateway.admin("POST", "/admin/admins", {"email": f"bu-helper-{tag}@example.com", "password": PASSWORD}), 201)
    login(tab, admin, "Overview")
    tab.go("business-units", "Business units")
    page.get_by_label("Unit name").fill(f"unit-{tag}")
    page.get_by_label("Time zone").fill("Not/AZone")
    page.get_by_role("button", name="Create business unit").click()
    expect(page.locator("#unit-problems")).to_be_visible()
    page.get_by_label("Time zone").fill("America/New_York")
    page.locator("#unit-admins").select_option(helper["id"])
    page.get_by_label("Daily cap lock (USD)").fill("75")
    page.get_by_role("button", name="Create business unit").click()
    row = page.locator(f"#units-table tr[data-name='unit-{tag}']")
    expect(row.locator("td[data-col='timezone']")).to_have_text("America/New_York")
    expect(row.locator("td[data-col='admins']")).to_have_text(helper["email"])
    expect(row.locator("td[data-col='daily_cap_lock_usd']")).to_contain_text("75")
    assert tab.axe() == []
    row.get_by_role("button", name=f"Edit business unit unit-{tag}").click()
    expect(page.locator("#unit-form-title")).to_have_text(f"Edit business unit unit-{tag}")
    page.get_by_label("Time zone").fill("Asia/Tokyo")
    page.get_by_role("button", name="Save business unit").click()
    expect(row.locator("td[data-col='timezone']")).to_have_text("Asia/Tokyo")
    tab.screenshot("lifecycle-business-units")


# --- pilots -------------------------------------------------------------------------------------------


def test_pilots_are_created_edited_and_deleted_with_the_servers_errors_listed(
        tab: RefusalTab, gateway: Gateway, admin: dict[str, str]) -> None:  # noqa: F811
    """A pilot from the page: a body the server refuses lists its errors (400 invalid_pilot);
    corrected, it is created with members, models, mode, expiry and a tier; edited (one more
    member, authoritative); deleted."""
    from playwright.sync_api import expect

    needs(gateway, "POST /admin/pilots", "GET /admin/pilots", "GET /admin/pilots/{id}", "PUT /admin/pilots/{id}",
          "DELETE /admin/pilots/{id}")
    tab.expected = {400}
    page = tab.page
    tag = _tag()
    provider = gateway.create_provider(f"pilot-p-{tag}")
    model = gateway.create_model(provider["id"], f"pilot-m-{tag}")
    alice, bob = gateway.create_user(f"pilot-a-{tag}@example.com"), gateway.create_user(f"pilot-b-{tag}@example.com")
    name = f"pilot-{tag}"
    login(tab, admin, "Overview")
    tab.go("pilots", "Pilots")
    assert tab.axe() == []
    page.get_by_label("Pilot name").fill(name)
    page.get_by_label("Members", exact=True).fill(alice["email"])
    page.locator("#pilot-models").select_option(model["name"])
    page.get_by_label("Mode", exact=True).select_option("enforce")
    page.get_by_label("Expires").fill((dt.datetime.now() + dt.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M"))
    page.get_by_role("button", name="Add a tier").click()
    page.locator("#pilot-tier-0-name").fill("explorers")
    page.locator("#pilot-tier-0-amount").fill("not-a-number")
    page.get_by_role("button", name="Create pilot").click()
    problems = page.locator("#pilot-problems")
    expect(problems).to_contain_text("invalid_pilot")
    assert problems.locator("li").count() >= 1
    assert tab.axe() == []
    tab.screenshot("lifecycle-pilot-errors")

    page.locator("#pilot-tier-0-amount").fill("25")
    page.get_by_role("button", name="Create pilot").click()
    row = page.locator(f"#pilots-table tr[data-name='{name}']")
    expect(row.locator("td[data-col='members']")).to_have_text(alice["email"])
    expect(row.locator("td[data-col='models']")).to_have_text(model["name"])
    expect(row).to_have_attribute("data-mode", "enforce")
    expect(row.locator("td[data-col='tiers']")).to_contain_text("explorers: $25")

    row.get_by_role("button", name=f"Edit pilot {name}").click()
    expect(page.locator("#pilot-form-title")).to_have_text(f"Edit pilot {name}")
    page.get_by_label("Members", exact=True).fill(f"{alice['email']}\n{bob['email']}")
    page.get_by_label("Authoritative (its tiers replace the members' other rules)").check()
    page.get_by_role("button", name="Save pilot").click()
    expect(row.locator("td[data-col='members']")).to_have_text(f"{alice['email']}, {bob['email']}")
    expect(row.locator("td[data-col='authoritative']")).to_have_text("yes")
    stored = next(p for p in _pilots(gateway) if p["name"] == name)
    assert sorted(stored["members"]) == sorted([alice["id"], bob["id"]])
    assert stored["authoritative"] is True
    tab.screenshot("lifecycle-pilots")

    # A pilot is a control like a rule: an edit saved for later reads as scheduled, not live.
    row.get_by_role("button", name=f"Edit pilot {name}").click()
    expect(page.locator("#pilot-form-title")).to_have_text(f"Edit pilot {name}")
    page.get_by_label("Members", exact=True).fill(alice["email"])
    page.locator("#pilot-activate-kind").select_option("local-midnight")
    page.get_by_role("button", name="Save pilot").click()
    cell = row.locator("td[data-col='revision']")
    expect(cell.locator("[data-revision-state]")).to_have_attribute("data-revision-state", "scheduled")
    stored = next(p for p in _pilots(gateway) if p["name"] == name)
    assert stored["saved_revision"] != stored["enforced_revision"] and len(stored["members"]) == 2

    row.get_by_role("button", name=f"Delete pilot {name}").click()
    expect(row).to_have_count(0)
    assert name not in {p["name"] for p in _pilots(gateway)}


def _pilots(gateway: Gateway) -> list[Json]:
    listed = gateway.admin("GET", "/admin/pilots").json()
    return listed if isinstance(listed, list) else listed.get("pilots") or listed.get("items") or []


# --- models: onboarding and a referenced model's delete --------------------------------------------------


def test_a_model_is_staged_limited_to_a_roster_and_graduated_from_the_models_page(
        tab: RefusalTab, gateway: Gateway, admin: dict[str, str]) -> None:  # noqa: F811
    """A staged model shows its badge; from its onboarding panel it becomes limited to a roster
    with terms, then graduates to active, its roster cleared."""
    from playwright.sync_api import expect

    needs(gateway, "POST /admin/models/{id}/graduate")
    page = tab.page
    tag = _tag()
    provider = gateway.create_provider(f"onb-p-{tag}")
    model = gateway.create_model(provider["id"], f"onb-m-{tag}")
    person = gateway.create_user(f"onb-u-{tag}@example.com")
    current = gateway.admin("GET", f"/admin/models/{model['id']}")
    staged = gateway.client.put(f"/admin/models/{model['id']}", json={"status": "staged"},
                                headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": current.headers["etag"]})
    assert staged.status_code == 200, staged.text
    login(tab, admin, "Overview")
    tab.go("models", "Models")
    row = page.locator(f"#models-table tr[data-name='{model['name']}']")
    expect(row).to_have_attribute("data-status", "staged")
    expect(row.locator("td[data-col='status']")).to_have_text("staged")

    row.get_by_role("button", name=f"Onboarding of model {model['name']}").click()
    expect(page.locator("#onboarding-title")).to_be_focused()
    page.get_by_label("Onboarding status").select_option("limited")
    page.get_by_label("Roster").fill(person["email"])
    page.get_by_label("Amount per person (USD)").fill("5")
    page.get_by_label("Spend window").select_option("weekly")
    assert tab.axe() == []
    tab.screenshot("lifecycle-onboarding")
    page.get_by_role("button", name="Save onboarding").click()
    expect(row).to_have_attribute("data-status", "limited")
    expect(row.locator("td[data-col='onboarding']")).to_contain_text(f"Limited to {person['email']}")
    stored = gateway.admin("GET", f"/admin/models/{model['id']}").json()
    assert stored["status"] == "limited" and stored["roster"] == [person["id"]]

    row.get_by_role("button", name=f"Graduate model {model['name']}").click()
    expect(row).to_have_attribute("data-status", "active")
    expect(page.locator("#toast")).to_have_text(f"Model {model['name']} graduated: it is active.")
    stored = gateway.admin("GET", f"/admin/models/{model['id']}").json()
    assert stored["status"] == "active" and not stored.get("roster")


def test_deleting_a_model_a_live_control_references_shows_the_controls(
        tab: RefusalTab, gateway: Gateway, admin: dict[str, str]) -> None:  # noqa: F811
    """A model's restrictions saved for a later activation read as scheduled on the models page.
    Deleting a model a live rule names is refused (409 model_in_use): the page says so and names
    the rule; the model stays."""
    from playwright.sync_api import expect

    needs(gateway, "POST /admin/models/{id}/graduate")  # model_in_use comes with the onboarding routes
    tab.expected = {409}
    page = tab.page
    tag = _tag()
    provider = gateway.create_provider(f"inuse-p-{tag}")
    model = gateway.create_model(provider["id"], f"inuse-m-{tag}")
    rule_id = f"inuse-{tag}"
    _ok(gateway.admin("POST", "/admin/rules", {"id": rule_id, "weight": 1, "mode": "enforce", "entries": [{
        "population": {}, "scope": {"model": model["name"]}, "window": "daily", "threshold_usd": "5",
        "actions": [{"type": "block"}]}]}), 201)
    # Its restrictions saved for later: the row says when they take effect.
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=3)).replace(microsecond=0).isoformat()
    current = gateway.admin("GET", f"/admin/models/{model['id']}")
    saved = gateway.client.put(f"/admin/models/{model['id']}", json={
        "restrictions": {"business_units_closed": [f"closed-{tag}"]}, "activate_at": later},
        headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": current.headers["etag"]})
    assert saved.status_code == 200, saved.text
    login(tab, admin, "Overview")
    tab.go("models", "Models")
    revision = page.locator(f"#models-table tr[data-name='{model['name']}'] td[data-col='restrictions_revisions']")
    expect(revision.locator("[data-revision-state]")).to_have_attribute("data-revision-state", "scheduled")
    expect(revision).to_contain_text("scheduled for")
    page.get_by_role("button", name=f"Delete model {model['name']}").click()
    problems = page.locator("#model-problems")
    expect(problems).to_be_focused()
    expect(problems).to_contain_text(f"Model {model['name']} is in use")
    expect(problems).to_contain_text(rule_id)
    expect(page.locator(f"#models-table tr[data-name='{model['name']}']")).to_be_visible()
    assert tab.axe() == []
    tab.screenshot("lifecycle-model-in-use")
    assert gateway.admin("GET", f"/admin/models/{model['id']}").status_code == 200


# --- single sign-on ---------------------------------------------------------------------------------------


def test_the_login_form_offers_single_sign_on_only_when_it_is_configured(tab: RefusalTab, gateway: Gateway) -> None:
    """Without an OIDC issuer (the shared gateway has none) the login form has no SSO link, and
    the probe behind it (a 404) is no page error."""
    from playwright.sync_api import expect

    documented("GET /admin/oidc/login")
    page = tab.page
    assert gateway.client.get("/admin/oidc/login", follow_redirects=False).status_code == 404
    page.goto("/dashboard")
    tab.heading("Log in to meshfast")
    page.wait_for_function("() => performance.getEntriesByName(location.origin + '/admin/oidc/login').length > 0")
    expect(page.locator("#sso")).to_be_hidden()
    expect(page.get_by_role("link", name="Sign in with SSO")).to_have_count(0)


class _Issuer(http.server.BaseHTTPRequestHandler):
    """An OIDC issuer's discovery document and an authorization page that only says where it is."""

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        base = f"http://{self.headers['host']}"
        if self.path == "/.well-known/openid-configuration":
            body = json.dumps({"issuer": base, "authorization_endpoint": f"{base}/authorize",
                               "token_endpoint": f"{base}/token", "jwks_uri": f"{base}/jwks"}).encode()
            kind = "application/json"
        else:
            body, kind = b"<!doctype html><title>Issuer</title><h1>Issuer sign-in</h1>", "text/html"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def oidc_gateway() -> Iterator[tuple[Gateway, str]]:
    """A gateway whose admins may sign in through an issuer (a local stand-in), and its URL."""
    documented("GET /admin/oidc/login", "GET /admin/oidc/callback")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Issuer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    issuer = f"http://127.0.0.1:{server.server_address[1]}"
    env = {**SESSION_ENV, "MESHFAST_OIDC_ISSUER": issuer, "MESHFAST_OIDC_CLIENT_ID": "meshfast-dashboard",
           "MESHFAST_OIDC_CLIENT_SECRET": "issuer-secret-" + secrets.token_hex(4)}
    try:
        with running_gateway(1, env=env) as gw:
            yield gw, issuer
    finally:
        server.shutdown()


def test_the_login_form_links_to_the_issuer_when_single_sign_on_is_configured(
        browser: Any, oidc_gateway: tuple[Gateway, str]) -> None:  # noqa: F811
    """With an OIDC issuer configured, the login form offers "Sign in with SSO"; following it
    lands on the issuer's authorization page with meshfast's client id and a PKCE challenge."""
    from playwright.sync_api import expect

    gateway, issuer = oidc_gateway
    tab = RefusalTab(browser, gateway)
    try:
        page = tab.page
        page.goto("/dashboard")
        tab.heading("Log in to meshfast")
        link = page.get_by_role("link", name="Sign in with SSO")
        expect(link).to_be_visible()
        assert tab.axe() == []
        tab.screenshot("lifecycle-login-sso")
        link.click()
        page.wait_for_url(re.compile("^" + re.escape(issuer) + "/authorize\\?"))
        expect(page.locator("h1")).to_have_text("Issuer sign-in")
        assert "client_id=meshfast-dashboard" in page.url and "code_challenge_method=S256" in page.url
        assert tab.errors == [], tab.errors
    finally:
        tab.close()
