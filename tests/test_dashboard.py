"""The web dashboard in a real browser: Playwright (Python) driving Debian's chromium headless.

The flow an operator follows: log in, add a provider (testserve, local), a model and a user, copy
the user's key, call the gateway with it, find the call in the logs explorer and in the charts.
Every page is checked with axe-core (from npm, tests/node) and saved as a screenshot under
``tests/artifacts/dashboard/`` (or ``$MESHFAST_TEST_ARTIFACTS/dashboard``). The browser tests skip
only when no chromium binary is installed (``apt-get install chromium``; CI sets
``MESHFAST_REQUIRE_CHROMIUM=1`` so they fail instead); no browser is downloaded.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EmulatedProviders, Gateway, until

ROOT = Path(__file__).resolve().parent
ARTIFACTS = Path(os.environ.get("MESHFAST_TEST_ARTIFACTS") or ROOT / "artifacts") / "dashboard"
AXE_JS = ROOT / "node" / "node_modules" / "axe-core" / "axe.min.js"
PASSWORD = "dashboard-pass-" + secrets.token_hex(4)
PAGES = ["overview", "logs", "users", "applications", "providers", "models", "access", "dlp", "rules", "notifications",
         "gateway", "audit", "admins"]
TIMEOUT_MS = 15_000


def chromium_path() -> str | None:
    """Debian's chromium: the real binary when present, else the wrapper script on PATH."""
    explicit = os.environ.get("MESHFAST_CHROMIUM")
    candidates = [explicit] if explicit else ["/usr/lib/chromium/chromium", "chromium", "chromium-browser"]
    for candidate in candidates:
        found = shutil.which(candidate) if candidate else None
        if found:
            return found
    return None


# --- serving: no browser needed ------------------------------------------------------------------


def test_dashboard_assets_are_served_with_types_cache_headers_and_csp(gateway: Gateway) -> None:
    """/dashboard and its assets come from the package with their content types, cache headers and
    a strict CSP; an unknown asset is a 404, a write is a 405, and the data stays behind a session."""
    page = gateway.client.get("/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["cache-control"] == "no-cache"
    csp = page.headers["content-security-policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"):
        assert directive in csp
    assert "unsafe-inline" not in csp and "http" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    # Nothing from another origin, no inline script or style.
    assert not re.search(r"(src|href)=\"(https?:)?//", page.text)
    assert "<style" not in page.text and re.search(r"<script>", page.text) is None
    script, style = re.search(r'src="(/dashboard/app\.js\?v=\w+)"', page.text), re.search(
        r'href="(/dashboard/app\.css\?v=\w+)"', page.text)
    assert script and style
    assert gateway.client.get("/dashboard/").text == page.text
    for path, content_type in ((script.group(1), "text/javascript; charset=utf-8"),
                               (style.group(1), "text/css; charset=utf-8")):
        asset = gateway.client.get(path)
        assert asset.status_code == 200, path
        assert asset.headers["content-type"] == content_type
        assert asset.headers["cache-control"] == "public, max-age=3600"
        assert "content-security-policy" in asset.headers
        again = gateway.client.get(path, headers={"if-none-match": asset.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
    assert gateway.client.head("/dashboard").status_code == 200
    for missing in ("/dashboard/nope.js", "/dashboard/app.js/x", "/dashboard/__init__.py", "/dashboard/../app.py"):
        assert gateway.client.get(missing).status_code == 404, missing
    assert gateway.client.post("/dashboard").status_code == 405
    assert gateway.client.get("/dashboards").status_code == 404
    assert gateway.client.get("/admin/users").status_code == 401


# --- browser fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    if executable is None:
        if os.environ.get("MESHFAST_REQUIRE_CHROMIUM"):
            pytest.fail("MESHFAST_REQUIRE_CHROMIUM is set but no chromium is installed")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    assert AXE_JS.exists(), "axe-core missing: run `npm ci` in tests/node"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def admin(gateway: Gateway) -> dict[str, str]:
    """A super admin who logs in to the dashboard."""
    email = f"dash-{secrets.token_hex(4)}@example.com"
    response = gateway.admin("POST", "/admin/admins", {"email": email, "password": PASSWORD, "is_super": True})
    assert response.status_code == 201, response.text
    return {"email": email, "password": PASSWORD}


class Tab:
    """One browser page on the dashboard, with the checks every test makes."""

    def __init__(self, browser: Any, gateway: Gateway) -> None:
        self.gateway = gateway
        self.context = browser.new_context(base_url=gateway.base_url, viewport={"width": 1400, "height": 1000})
        self.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=gateway.base_url)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        # Destructive buttons ask first; the operator says yes.
        self.page.on("dialog", lambda d: d.accept())

    def _console(self, message: Any) -> None:
        # The page asks /admin/me to learn whether a session exists; a 401 there is the answer. The
        # login form asks /admin/oidc/login whether single sign-on is configured; a 404 is "no".
        if message.type != "error" or "status of 401" in message.text:
            return
        if "status of 404" in message.text and (message.location or {}).get("url", "").endswith("/admin/oidc/login"):
            return
        self.errors.append(message.text)

    def login(self, admin: dict[str, str]) -> None:
        page = self.page
        page.goto("/dashboard")
        page.get_by_label("Email", exact=True).fill(admin["email"])
        page.get_by_label("Password", exact=True).fill(admin["password"])
        page.get_by_role("button", name="Log in").click()
        self.heading("Overview")

    def heading(self, text: str) -> None:
        from playwright.sync_api import expect

        expect(self.page.locator("h1")).to_have_text(text)

    def go(self, route: str, heading: str) -> None:
        self.page.locator(f"nav a[href='#/{route}']").click()
        self.heading(heading)

    def screenshot(self, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
        return path

    def axe(self) -> list[dict[str, Any]]:
        """axe-core's serious and critical findings on the page as it stands (the lesser ones are
        printed)."""
        if not self.page.evaluate("() => typeof window.axe === 'object'"):
            # NOTE: through the DevTools protocol, so the page's CSP (script-src 'self') stays on.
            self.page.evaluate(AXE_JS.read_text() + "\n;void 0")
        found = self.page.evaluate("""async () => {
            const r = await axe.run(document, {resultTypes: ['violations']});
            return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                           nodes: v.nodes.slice(0, 5).map(n => n.target.join(' '))}));
        }""")
        lesser = [f"{v['id']} ({v['impact']})" for v in found if v["impact"] not in ("serious", "critical")]
        if lesser:
            print(f"axe minor/moderate on {self.page.url}: {lesser}")
        return [v for v in found if v["impact"] in ("serious", "critical")]

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Any, gateway: Gateway) -> Iterator[Tab]:
    t = Tab(browser, gateway)
    try:
        yield t
        assert t.errors == [], f"console errors (CSP violations show here too): {t.errors}"
    finally:
        t.close()


def call(gateway: Gateway, key: str, model: str) -> tuple[str, dict[str, Any]]:
    """One chat call with a user's key; its request id and its log row."""
    response = httpx.post(f"{gateway.base_url}/v1/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {key}"},
                          json={"model": model, "messages": [{"role": "user", "content": "hello dashboard"}],
                                "max_tokens": 32})
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    # NOTE: in a thread: fetch_row uses asyncio.run, and Playwright's sync API runs a loop here.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return request_id, pool.submit(gateway.fetch_row, request_id, 10).result()


def wait_for_row(tab: Tab, selector: str, refresh: str, attempts: int = 20) -> Any:
    """Telemetry writes rows in batches: refresh the page until ``selector`` shows."""
    page = tab.page
    for _ in range(attempts):
        if page.locator(selector).count():
            return page.locator(selector).first
        page.locator(refresh).click()
        page.wait_for_timeout(500)
    raise AssertionError(f"{selector} never appeared")


# --- the operator's flow -----------------------------------------------------------------------------


def test_operator_creates_provider_model_user_and_sees_the_call_in_logs_and_charts(
        tab: Tab, gateway: Gateway, testserve: EmulatedProviders, admin: dict[str, str]) -> None:
    """Log in, add a testserve provider, a model and a user from the UI, copy the key, call with
    it, and find the call (cost, tokens) in the logs explorer and in every spend chart."""
    from playwright.sync_api import expect

    page = tab.page
    tag = secrets.token_hex(3)
    provider, model, email = f"dash-ts-{tag}", f"dash-chat-{tag}", f"dash-user-{tag}@example.com"

    page.goto("/dashboard")
    expect(page.get_by_role("heading", name="Log in to meshfast")).to_be_visible()
    tab.screenshot("01-login")
    tab.login(admin)

    # Provider, from the Ollama/local preset then pointed at testserve's OpenAI emulation.
    tab.go("providers", "Providers")
    page.get_by_label("Preset").select_option("ollama")
    expect(page.get_by_label("Local (allow loopback and private addresses)")).to_be_checked()
    page.get_by_label("Name", exact=True).fill(provider)
    page.get_by_label("Family").select_option("openai")
    page.get_by_label("Base URL").fill(f"{testserve.base_url}/openai")
    page.get_by_label("API key").fill("testserve-key")
    page.get_by_label("Verify with a live call per model").uncheck()
    page.get_by_role("button", name="Create provider").click()
    expect(page.locator(f"#providers-table tr[data-name='{provider}']")).to_be_visible()
    tab.screenshot("02-providers")

    # Model.
    tab.go("models", "Models")
    # NOTE: scoped to the create form: with models present the page also has deployment forms.
    create = page.locator("form:has(#model-resolved)")
    page.locator("#model-provider").select_option(label=provider)
    create.get_by_label("Name", exact=True).fill(model)
    create.get_by_label("Resolved model").fill("dummy-chat")
    # NOTE: priced high, so this person ranks among the overview's top spenders whatever other
    # tests on the shared gateway spent before.
    create.get_by_label("Input price per 1k tokens (USD)").fill("50")
    create.get_by_label("Output price per 1k tokens (USD)").fill("125")
    create.get_by_label("Image input").check()
    create.get_by_label("Verify with a live call").uncheck()
    create.get_by_role("button", name="Create model").click()
    row = page.locator(f"#models-table tr[data-name='{model}']")
    expect(row).to_be_visible()
    expect(row.locator("td[data-col='caps']")).to_have_text("Image input")
    tab.screenshot("03-models")

    # User: the key is shown once, with a copy button.
    tab.go("users", "Users & keys")
    page.get_by_label("Email", exact=True).fill(email)
    page.get_by_label("Display name").fill("Dashboard User")
    page.get_by_role("button", name="Create user and key").click()
    secret = page.locator("#new-secret")
    expect(secret).to_be_visible()
    key = secret.inner_text().strip()
    assert re.fullmatch(r"mesh_live_[A-Za-z0-9_-]{43}", key), key
    page.get_by_role("button", name="Copy to clipboard").click()
    expect(page.locator("#copy-status")).to_have_text("Copied.")
    assert page.evaluate("() => navigator.clipboard.readText()") == key
    expect(page.locator(f"#users-table tr[data-email='{email}'] td[data-col='key_prefix']")).to_have_text(key[:16] + "...")
    tab.screenshot("04-users-new-key")

    # Access and a policy.
    tab.go("access", "Access & policies")
    page.get_by_label("User", exact=True).select_option(label=email)
    page.locator("#grant-model").select_option(label=model)
    page.get_by_role("button", name="Grant access").click()
    grant = page.locator(f"#policies-table tr[data-name='{model}']")
    expect(grant).to_be_visible()
    grant.get_by_role("button", name=f"Edit policy for {model}").click()
    page.get_by_label("Daily cap (USD)").fill("7.5")
    page.get_by_label("Max calls per hour").fill("100")
    page.get_by_label("Sat").uncheck()
    page.get_by_label("Always open (ignore days and hours)").check()
    page.get_by_role("button", name="Save policy").click()
    expect(grant.locator("td[data-col='daily_cap_usd']")).to_have_text(re.compile(r"^7\.50*$"))
    expect(grant.locator("td[data-col='max_calls_per_hour']")).to_have_text("100")
    expect(grant.locator("td[data-col='window']")).to_have_text("Always open")
    tab.screenshot("05-access")

    # The call, with the key read from the page.
    request_id, logged = call(gateway, key, model)
    cost = float(logged["input_cost"] + logged["output_cost"])
    assert cost > 0 and logged["tokens_in"] > 0

    # Logs explorer: search by request id.
    tab.go("logs", "Logs")
    page.get_by_label("Search").fill(request_id)
    page.get_by_role("button", name="Apply filters").click()
    log_row = wait_for_row(tab, f"#logs-table tr[data-request-id='{request_id}']", "#logs-apply")
    assert float(log_row.get_attribute("data-cost")) == pytest.approx(cost, abs=1e-9)
    assert int(log_row.get_attribute("data-tokens-in")) == logged["tokens_in"]
    assert int(log_row.get_attribute("data-tokens-out")) == logged["tokens_out"]
    expect(log_row.locator("td[data-col='user_id']")).to_have_text(email)
    expect(log_row.locator("td[data-col='model_name']")).to_have_text(model)
    expect(page.locator("#logs-total")).to_have_attribute("data-total", "1")
    # The model filter finds it too, and sorting by cost keeps it.
    page.get_by_label("Search").fill("")
    page.get_by_label("Model", exact=True).select_option(label=model)
    page.get_by_role("button", name="Apply filters").click()
    expect(page.locator(f"#logs-table tr[data-request-id='{request_id}']")).to_be_visible()
    page.get_by_role("button", name="Cost").click()
    expect(page.locator("th[aria-sort='descending']")).to_have_text(re.compile("Cost"))
    tab.screenshot("06-logs")

    # Overview: the call in every spend chart, as numbers in the page.
    tab.go("overview", "Overview")
    by_model = wait_for_row(tab, f"#spend-by-model-table tr[data-label='{model}']", "#overview-refresh")
    assert float(by_model.get_attribute("data-value")) == pytest.approx(cost, abs=1e-9)
    assert by_model.get_attribute("data-calls") == "1"
    for chart, label in (("spend-by-person", email), ("spend-by-provider", provider)):
        entry = page.locator(f"#{chart}-table tr[data-label='{label}']")
        assert float(entry.get_attribute("data-value")) == pytest.approx(cost, abs=1e-9), chart
        bar = page.locator(f"svg[data-chart='{chart}'] rect[data-label='{label}']")
        assert float(bar.get_attribute("data-value")) == pytest.approx(cost, abs=1e-9), chart
    for chart, series in (("spend-over-time-person", email), ("spend-over-time-model", model),
                          ("spend-over-time-provider", provider)):
        points = page.locator(f"#{chart}-table tr[data-series='{series}']")
        values = [float(points.nth(i).get_attribute("data-value")) for i in range(points.count())]
        assert sum(values) == pytest.approx(cost, abs=1e-9), chart
        dots = page.locator(f"svg[data-chart='{chart}'] g[data-series='{series}'] circle")
        assert sum(float(dots.nth(i).get_attribute("data-value")) for i in range(dots.count())) == pytest.approx(cost, abs=1e-9)
    total_calls = int(page.locator("#totals [data-total='calls']").get_attribute("data-value"))
    assert total_calls >= 1
    # A call declaring a tool the model does not call: the tools table counts it.
    tool = f"dash_tool_{tag}"
    declared = httpx.post(f"{gateway.base_url}/v1/chat/completions", timeout=30, headers={"authorization": f"Bearer {key}"},
                          json={"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16,
                                "tools": [{"type": "function", "function": {"name": tool, "parameters": {"type": "object"}}}]})
    assert declared.status_code == 200, declared.text
    tools_row = wait_for_row(tab, f"#by-tool tr[data-label='{tool}']", "#overview-refresh")
    assert (tools_row.get_attribute("data-value"), tools_row.get_attribute("data-invoked")) == ("1", "0")
    tab.screenshot("07-overview")

    # The audit log shows what the UI did.
    tab.go("audit", "Audit log")
    page.get_by_label("Actor").fill(admin["email"])
    page.get_by_role("button", name="Apply filters").click()
    for action in ("create_provider", "create_model", "create_user", "grant_access", "update_policy"):
        expect(page.locator(f"#audit-table tr[data-action='{action}']").first).to_be_visible()
    tab.screenshot("08-audit")

    # Kill switch: pause, see the gateway refuse, resume.
    tab.go("gateway", "Gateway")
    expect(page.locator("#kill-state")).to_have_attribute("data-tripped", "false")
    # The instances of the cluster: this gateway alone, alive, holding every cap whole.
    expect(page.locator("#instances-table tr[data-alive='true']")).to_have_count(1)
    expect(page.locator("#instances-table tr[data-alive='true'] td[data-col='mode']")).to_have_text("lone")
    page.get_by_role("button", name="Pause the gateway (kill switch)").click()
    expect(page.locator("#kill-state")).to_have_attribute("data-tripped", "true")
    tab.screenshot("09-gateway-paused")
    page.get_by_role("button", name="Resume the gateway").click()
    expect(page.locator("#kill-state")).to_have_attribute("data-tripped", "false")

    # Rotate, then revoke: the copied key stops working.
    tab.go("users", "Users & keys")
    page.get_by_role("button", name=f"Rotate key of {email}").click()
    rotated = page.locator("#new-secret").inner_text().strip()
    assert rotated != key and rotated.startswith("mesh_live_")
    bad = httpx.post(f"{gateway.base_url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                     json={"model": model, "messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert bad.status_code == 401
    page.get_by_role("button", name=f"Revoke {email}").click()
    expect(page.locator(f"#users-table tr[data-email='{email}'] td[data-col='status']")).to_have_text("revoked")

    # Log out: back to the login form, and the data is gone with the session.
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in to meshfast")).to_be_visible()
    assert page.evaluate("async () => (await fetch('/admin/users')).status") == 401


# --- axe-core on every page --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded(gateway: Gateway, testserve: EmulatedProviders) -> Iterator[dict[str, Any]]:
    """A provider, model, user, grant, application (granted the model), admin token, data protection
    policy (disabled: it changes no call) and one call, so every page has content."""
    tag = secrets.token_hex(3)
    provider = gateway.create_provider(f"axe-ts-{tag}", base_url=f"{testserve.base_url}/openai")
    model = gateway.create_model(provider["id"], f"axe-chat-{tag}", resolved_model="dummy-chat")
    user = gateway.create_user(f"axe-user-{tag}@example.com")
    gateway.grant(user["id"], model["id"])
    application = gateway.admin("POST", "/admin/applications", {"name": f"axe app {tag}", "owner_id": user["id"]})
    assert application.status_code == 201, application.text
    granted = gateway.admin("POST", "/admin/access", {"application_id": application.json()["id"], "model_id": model["id"]})
    assert granted.status_code == 200, granted.text
    assert gateway.admin("POST", "/admin/tokens", {"name": f"axe-{tag}"}).status_code == 201
    policy = f"axe-{tag}"
    made = gateway.admin("PUT", f"/admin/dlp/policies/{policy}", {
        "enabled": False, "detectors": {"card": "block", "email": "redact"},
        "custom": [{"name": f"axe_{tag}", "pattern": r"AXE-\d{6}", "action": "pseudonymize"}],
        "applies_to": {"models": [model["name"]], "business_units": ["axe"], "users": [user["id"]]}})
    assert made.status_code == 200, made.text
    request_id, row = call(gateway, user["key"], model["name"])
    yield {"model": model, "user": user, "application": application.json(), "request_id": request_id, "row": row,
           "policy": policy}
    gateway.admin("DELETE", f"/admin/dlp/policies/{policy}")


def test_every_page_has_no_serious_or_critical_axe_findings(tab: Tab, admin: dict[str, str],
                                                             seeded: dict[str, Any]) -> None:
    """axe-core, injected into each page (login, every section, and the forms opened for editing),
    reports no serious or critical violation; each page is saved as a screenshot."""
    from playwright.sync_api import expect

    page = tab.page
    page.goto("/dashboard")
    tab.heading("Log in to meshfast")
    findings = {"login": tab.axe()}
    tab.login(admin)
    headings = {"overview": "Overview", "logs": "Logs", "users": "Users & keys", "applications": "Applications",
                "providers": "Providers",
                "models": "Models", "access": "Access & policies", "dlp": "Data protection", "rules": "Spend rules",
                "notifications": "Notifications", "gateway": "Gateway", "audit": "Audit log",
                "admins": "Admins & tokens"}
    for route in PAGES:
        tab.go(route, headings[route])
        if route == "overview":
            wait_for_row(tab, f"#spend-by-model-table tr[data-label='{seeded['model']['name']}']", "#overview-refresh")
        if route == "logs":
            wait_for_row(tab, f"#logs-table tr[data-request-id='{seeded['request_id']}']", "#logs-apply")
        findings[route] = tab.axe()
        tab.screenshot(f"axe-{route}")
    # The edit forms and a shown-once secret.
    tab.go("access", "Access & policies")
    page.get_by_label("User", exact=True).select_option(label=seeded["user"]["email"])
    page.get_by_role("button", name=f"Edit policy for {seeded['model']['name']}").click()
    findings["access-policy-form"] = tab.axe()
    tab.go("applications", "Applications")
    page.get_by_role("button", name=f"Grants & keys of {seeded['application']['name']}").click()
    page.get_by_role("button", name=f"Edit policy for {seeded['model']['name']}").click()
    tab.page.locator("#policy-form").wait_for()
    findings["application-detail"] = tab.axe()
    tab.screenshot("axe-application-detail")
    tab.go("dlp", "Data protection")
    page.get_by_role("button", name=f"Edit policy {seeded['policy']}").click()
    expect(page.locator("#dlp-form-title")).to_have_text(f"Edit policy {seeded['policy']}")
    findings["dlp-edit-form"] = tab.axe()
    tab.screenshot("axe-dlp-edit-form")
    tab.go("admins", "Admins & tokens")
    page.get_by_label("Token name").fill("axe-shown-once")
    page.get_by_role("button", name="Create token").click()
    tab.page.locator("#new-secret").wait_for()
    findings["admins-new-token"] = tab.axe()
    tab.screenshot("axe-admins-new-token")
    # The check itself sees problems: a button without a name is a critical finding.
    page.evaluate("() => document.querySelector('main').append(document.createElement('button'))")
    assert "button-name" in {v["id"] for v in tab.axe()}
    bad = {name: found for name, found in findings.items() if found}
    print("axe serious/critical findings per page:", {name: len(found) for name, found in findings.items()})
    assert bad == {}, bad


# --- keyboard only -----------------------------------------------------------------------------------


def focus_by_tab(tab: Tab, selector: str, backwards: bool = False, limit: int = 150) -> None:
    """Press Tab (Shift+Tab when ``backwards``) until ``selector`` has the focus."""
    page = tab.page
    for _ in range(limit):
        if page.evaluate("s => !!document.activeElement && document.activeElement.matches(s)", selector):
            return
        page.keyboard.press("Shift+Tab" if backwards else "Tab")
    raise AssertionError(f"Tab never reached {selector}")


def test_main_flow_works_with_the_keyboard_alone(tab: Tab, gateway: Gateway, testserve: EmulatedProviders,
                                                 admin: dict[str, str]) -> None:
    """Log in, create a user, copy the key, grant a model and find the key's call in the logs using
    only Tab, Shift+Tab, Enter and Space (and typing into fields)."""
    from playwright.sync_api import expect

    page = tab.page
    tag = secrets.token_hex(3)
    # The model is made beforehand, so it heads the grant list (newest first).
    provider = gateway.create_provider(f"kb-ts-{tag}", base_url=f"{testserve.base_url}/openai")
    model = gateway.create_model(provider["id"], f"kb-chat-{tag}", resolved_model="dummy-chat")
    email = f"kb-user-{tag}@example.com"

    page.goto("/dashboard")
    focus_by_tab(tab, "#login-email")
    page.keyboard.type(admin["email"])
    page.keyboard.press("Tab")
    page.keyboard.type(admin["password"])
    page.keyboard.press("Enter")
    tab.heading("Overview")

    focus_by_tab(tab, "nav a[href='#/users']")
    page.keyboard.press("Enter")
    tab.heading("Users & keys")
    focus_by_tab(tab, "#user-email")
    page.keyboard.type(email)
    page.keyboard.press("Tab")
    page.keyboard.type("Keyboard User")
    focus_by_tab(tab, "#user-create-submit")
    page.keyboard.press("Enter")
    expect(page.locator("#new-secret")).to_be_visible()
    # The copy button has the focus once the key shows.
    assert page.evaluate("() => document.activeElement.id") == "copy-secret"
    page.keyboard.press("Space")
    expect(page.locator("#copy-status")).to_have_text("Copied.")
    key = page.evaluate("() => navigator.clipboard.readText()")
    assert key == page.locator("#new-secret").inner_text().strip()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")  # "I have saved it"
    expect(page.locator("#new-secret")).to_have_count(0)

    focus_by_tab(tab, "nav a[href='#/access']", backwards=True)
    page.keyboard.press("Enter")
    tab.heading("Access & policies")
    # The newest user and the newest model come first in their lists.
    assert page.locator("#access-user option:checked").inner_text() == email
    assert page.locator("#grant-model option:checked").inner_text() == model["name"]
    focus_by_tab(tab, "#grant-submit")
    page.keyboard.press("Space")
    expect(page.locator(f"#policies-table tr[data-name='{model['name']}']")).to_be_visible()

    request_id, _ = call(gateway, key, model["name"])
    focus_by_tab(tab, "nav a[href='#/logs']", backwards=True)
    page.keyboard.press("Enter")
    tab.heading("Logs")
    focus_by_tab(tab, "#logs-search")
    page.keyboard.type(request_id)
    page.keyboard.press("Enter")
    row = page.locator(f"#logs-table tr[data-request-id='{request_id}']")
    for _ in range(20):
        if row.count():
            break
        page.wait_for_timeout(500)
        focus_by_tab(tab, "#logs-apply")
        page.keyboard.press("Enter")
    expect(row).to_be_visible()
    tab.screenshot("keyboard-logs")


def test_named_keys_are_issued_rotated_and_revoked_from_the_ui(tab: Tab, gateway: Gateway,
                                                               testserve: EmulatedProviders,
                                                               admin: dict[str, str]) -> None:
    """A user's keys: a named key limited to one model is issued (shown once) and works for that
    model only, then rotated without overlap and revoked, all from the Users page."""
    from playwright.sync_api import expect

    page = tab.page
    tag = secrets.token_hex(3)
    provider = gateway.create_provider(f"ui-keys-{tag}", base_url=f"{testserve.base_url}/openai")
    allowed = gateway.create_model(provider["id"], f"ui-keys-a-{tag}", resolved_model="dummy-chat")
    other = gateway.create_model(provider["id"], f"ui-keys-b-{tag}", resolved_model="dummy-chat")
    user = gateway.create_user(f"ui-keys-{tag}@example.com")
    for model in (allowed, other):
        gateway.grant(user["id"], model["id"])
    tab.login(admin)
    tab.go("users", "Users & keys")
    page.get_by_role("button", name=f"Keys of {user['email']}").click()
    form = page.locator("#key-create")
    expect(page.get_by_label("Key name")).to_be_focused()
    form.get_by_label("Key name").fill("ci")
    form.get_by_label("Limit to models").select_option(label=allowed["name"])
    form.get_by_role("button", name="Issue key").click()
    key = page.locator("#new-secret").inner_text().strip()
    assert key.startswith("mesh_live_")
    page.get_by_role("button", name="I have saved it").click()
    row = page.locator("#keys-table tr[data-name='ci']")
    expect(row.locator("td[data-col='models']")).to_have_text(allowed["name"])

    def chat(model: str) -> int:
        return gateway.client.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                                   json={"model": model, "messages": [{"role": "user", "content": "hi"}]}).status_code

    until(lambda: chat(allowed["name"]) == 200, 2.0, "the new key")
    assert chat(other["name"]) == 404
    assert tab.axe() == []
    tab.screenshot("11-keys")
    page.get_by_role("button", name="Rotate key ci").click()
    rotated = page.locator("#new-secret").inner_text().strip()
    assert rotated.startswith("mesh_live_") and rotated != key
    page.get_by_role("button", name="I have saved it").click()
    until(lambda: chat(allowed["name"]) == 401, 2.0, "the old key refused")
    current = page.locator("#keys-table tr[data-name='ci']").filter(has=page.get_by_role("button", name="Revoke key ci"))
    expect(current).to_have_count(1)
    page.get_by_role("button", name="Revoke key ci").click()
    expect(page.get_by_role("button", name="Revoke key ci")).to_have_count(0)
    keys = gateway.admin("GET", f"/admin/users/{user['id']}/keys").json()
    assert sorted(k["status"] for k in keys if k["name"] == "ci") == ["revoked", "revoked"]


def test_token_issuers_and_a_session_token_from_the_ui(tab: Tab, gateway: Gateway, testserve: EmulatedProviders,
                                                       admin: dict[str, str]) -> None:
    """Identity providers: an issuer is trusted from the form (an inline JWK Set) and its tokens
    call the data plane; the admin gets a short-lived token for their own user; the issuer is
    removed and its tokens are refused."""
    import json

    from jwtkit import Issuer, jwks, new_key
    from playwright.sync_api import expect

    page = tab.page
    tag = secrets.token_hex(3)
    provider = gateway.create_provider(f"ui-idp-{tag}", base_url=f"{testserve.base_url}/openai")
    model = gateway.create_model(provider["id"], f"ui-idp-{tag}", resolved_model="dummy-chat")
    me = gateway.create_user(admin["email"])
    gateway.grant(me["id"], model["id"])
    iss = Issuer(f"https://ui-idp-{tag}.example.com", keys={"k": new_key("ES256", "k")})

    def chat(token: str) -> int:
        return gateway.client.post("/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                                   json={"model": model["name"], "messages": [{"role": "user", "content": "hi"}]}
                                   ).status_code

    tab.login(admin)
    tab.go("identity", "Identity providers")
    form = page.locator("#issuer-create")
    form.get_by_label("Issuer (iss)").fill(iss.name)
    form.get_by_label("Audiences (aud)").fill(iss.audience)
    form.get_by_label("Algorithms").fill("ES256")
    form.get_by_label("JWK Set (JSON)").fill(json.dumps(jwks(*iss.keys.values())))
    form.get_by_role("button", name="Trust issuer").click()
    row = page.locator(f"#issuers-table tr[data-issuer='{iss.name}']")
    expect(row.locator("td[data-col='keys']")).to_have_text("k ES256")
    until(lambda: chat(iss.token(admin["email"])) == 200, 2.0, "the issuer's token")
    page.get_by_role("button", name="Get a data-plane token").click()
    token = page.locator("#new-secret").inner_text().strip()
    assert token.count(".") == 2
    until(lambda: chat(token) == 200, 2.0, "the session token")
    assert tab.axe() == []
    tab.screenshot("12-identity")
    page.get_by_role("button", name="I have saved it").click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name=f"Remove issuer {iss.name}").click()
    expect(page.locator(f"#issuers-table tr[data-issuer='{iss.name}']")).to_have_count(0)
    until(lambda: chat(iss.token(admin["email"])) == 401, 2.0, "the removed issuer's token refused")


def test_workflow_budgets_from_the_ui(tab: Tab, gateway: Gateway, testserve: EmulatedProviders,
                                     admin: dict[str, str]) -> None:
    """A workflow budget registered from the form, limited to one person, governs that person's
    tagged calls and refuses another's; it is listed with its spend and unregistered."""
    from playwright.sync_api import expect

    page = tab.page
    tag = secrets.token_hex(3)
    provider = gateway.create_provider(f"ui-wf-{tag}", base_url=f"{testserve.base_url}/openai")
    model = gateway.create_model(provider["id"], f"ui-wf-{tag}", resolved_model="dummy-chat")
    member, other = gateway.create_user(f"ui-wf-a-{tag}@example.com"), gateway.create_user(f"ui-wf-b-{tag}@example.com")
    for person in (member, other):
        gateway.grant(person["id"], model["id"])
    workflow = f"ui-{tag}"
    tab.login(admin)
    tab.go("workflows", "Workflows")
    form = page.locator("#workflow-create")
    form.get_by_label("Workflow id").fill(workflow)
    form.get_by_label("Limit (USD)").fill("5")
    form.get_by_label("Window").select_option("weekly")
    form.get_by_label("People who may charge it").fill(member["email"])
    form.get_by_role("button", name="Register workflow").click()
    row = page.locator(f"#workflows-table tr[data-workflow='{workflow}']")
    expect(row.locator("td[data-col='who']")).to_have_text(member["email"])

    def call(person: dict[str, Any]) -> int:
        return gateway.client.post("/v1/proxy", params={"model": model["name"]}, json={"query": "hi"},
                                   headers={"authorization": f"Bearer {person['key']}",
                                            "x-meshfast-tags": f"workflow={workflow}"}).status_code

    until(lambda: call(member) == 200, 2.0, "the member charges the workflow")
    assert call(other) == 403
    assert tab.axe() == []
    tab.screenshot("13-workflows")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name=f"Unregister workflow {workflow}").click()
    expect(page.locator(f"#workflows-table tr[data-workflow='{workflow}']")).to_have_count(0)
    until(lambda: call(other) == 200, 2.0, "unregistered: attribution only")


def test_applications_from_the_ui(tab: Tab, gateway: Gateway, testserve: EmulatedProviders,
                                  admin: dict[str, str]) -> None:
    """An application created from the form (its owner picked from the people) shows its key once;
    a duplicate name is refused in the page; granted a model from the page, its key calls the data
    plane; a named key is issued (shown once); revoked, its keys are refused within seconds and
    reactivated they work again; deleted after a confirmation, it is gone."""
    from playwright.sync_api import expect

    page = tab.page
    tag = secrets.token_hex(3)
    provider = gateway.create_provider(f"ui-app-{tag}", base_url=f"{testserve.base_url}/openai")
    model = gateway.create_model(provider["id"], f"ui-app-{tag}", resolved_model="dummy-chat")
    owner = gateway.create_user(f"ui-app-owner-{tag}@example.com")
    name = f"ui app {tag}"
    # The Tab accepts every dialog; this records what was asked.
    asked: list[str] = []
    page.on("dialog", lambda dialog: asked.append(dialog.message))

    def proxy(key: str) -> int:
        return gateway.client.post("/v1/proxy", params={"model": model["name"]},
                                   json={"query": "hello", "max_tokens": 3},
                                   headers={"authorization": f"Bearer {key}"}).status_code

    tab.login(admin)
    tab.go("applications", "Applications")
    form = page.locator("#application-create")
    form.get_by_label("Application name").fill(name)
    form.get_by_label("Owner").select_option(label=owner["email"])
    form.get_by_label("Business unit").fill("payments")
    form.get_by_role("button", name="Create application and key").click()
    secret = page.locator("#new-secret")
    expect(secret).to_be_visible()
    key = secret.inner_text().strip()
    assert re.fullmatch(r"mesh_live_[A-Za-z0-9_-]{43}", key), key
    expect(page.locator("#copy-secret")).to_be_focused()
    row = page.locator(f"#applications-table tr[data-name='{name}']")
    expect(row.locator("td[data-col='owner_email']")).to_have_text(owner["email"])
    expect(row.locator("td[data-col='business_unit']")).to_have_text("payments")
    expect(row.locator("td[data-col='status']")).to_have_text("active")
    expect(row.locator("td[data-col='key_prefix']")).to_have_text(key[:16] + "...")
    app_id = row.get_attribute("data-application-id")
    page.get_by_role("button", name="I have saved it").click()
    expect(secret).to_have_count(0)

    # The same name again: the API's 409 shows in the page.
    form.get_by_label("Application name").fill(name)
    form.get_by_label("Owner").select_option(label=owner["email"])
    form.get_by_role("button", name="Create application and key").click()
    expect(page.locator("#application-problems")).to_contain_text("application_already_exists")
    # Chromium logs the refused request itself as a console error: that one was expected.
    expected = [e for e in tab.errors if "status of 409" in e]
    assert len(expected) == 1, tab.errors
    tab.errors.remove(expected[0])

    # A model granted from the page: the shown key calls the data plane.
    page.get_by_role("button", name=f"Grants & keys of {name}").click()
    expect(page.locator("#application-detail-title")).to_be_focused()
    page.locator("#app-grant-form").get_by_label("Model").select_option(label=model["name"])
    page.get_by_role("button", name="Grant access").click()
    expect(page.locator(f"#app-policies-table tr[data-name='{model['name']}']")).to_be_visible()
    until(lambda: proxy(key) == 200, 2.0, "the application's key")

    # A named key, shown once.
    keys = page.locator("#key-create")
    keys.get_by_label("Key name").fill("ci")
    keys.get_by_role("button", name="Issue key").click()
    named = page.locator("#new-secret").inner_text().strip()
    assert named.startswith("mesh_live_") and named != key
    expect(page.locator("#keys-table tr[data-name='ci']")).to_be_visible()
    until(lambda: proxy(named) == 200, 2.0, "the named key")
    assert tab.axe() == []
    tab.screenshot("14-applications")
    page.get_by_role("button", name="I have saved it").click()

    # Revoked: every key refused; reactivated: served again.
    page.get_by_role("button", name=f"Revoke application {name}").click()
    expect(row.locator("td[data-col='status']")).to_have_text("revoked")
    until(lambda: proxy(key) == 401, 2.0, "the revoked application's key refused")
    assert proxy(named) == 401
    page.get_by_role("button", name=f"Reactivate application {name}").click()
    expect(row.locator("td[data-col='status']")).to_have_text("active")
    until(lambda: proxy(key) == 200, 2.0, "the reactivated application's key")

    page.get_by_role("button", name=f"Delete application {name}").click()
    expect(row).to_have_count(0)
    assert any(message.startswith(f"Delete {name}") for message in asked), asked
    assert app_id not in {a["id"] for a in gateway.admin("GET", "/admin/applications").json()}
    until(lambda: proxy(key) == 401, 2.0, "the deleted application's key refused")


def test_data_protection_from_the_ui(tab: Tab, gateway: Gateway, testserve: EmulatedProviders,
                                     admin: dict[str, str]) -> None:
    """A data protection policy created from the form blocks cards for one model; a bad custom
    pattern is refused with every problem listed in the form; edited to redact, the call goes
    through; the call shows in the logs and in the detections table; deleted after a confirmation,
    it is gone."""
    from playwright.sync_api import expect

    page = tab.page
    tag = secrets.token_hex(3)
    provider = gateway.create_provider(f"ui-dlp-{tag}", base_url=f"{testserve.base_url}/openai")
    model = gateway.create_model(provider["id"], f"ui-dlp-{tag}", resolved_model="dummy-chat")
    user = gateway.create_user(f"ui-dlp-{tag}@example.com")
    gateway.grant(user["id"], model["id"])
    name = f"ui-dlp-{tag}"
    # The Tab accepts every dialog; this records what was asked.
    asked: list[str] = []
    page.on("dialog", lambda dialog: asked.append(dialog.message))

    def proxy() -> httpx.Response:
        return gateway.client.post("/v1/proxy", params={"model": model["name"]},
                                   json={"query": "pay 4111 1111 1111 1111", "max_tokens": 3},
                                   headers={"authorization": f"Bearer {user['key']}"})

    until(lambda: proxy().status_code == 200, 3.0, "the grant (no policy yet: the card goes through)")
    tab.login(admin)
    tab.go("dlp", "Data protection")
    form = page.locator("#dlp-form")
    form.get_by_label("Policy name").fill(name)
    expect(form.get_by_label("Enabled")).to_be_checked()
    form.get_by_label("Payment card numbers (card)").select_option("block")
    form.get_by_label("Models").select_option(label=model["name"])
    form.get_by_role("button", name="Create policy").click()
    row = page.locator(f"#dlp-table tr[data-policy='{name}']")
    expect(row.locator("td[data-col='enabled']")).to_have_text("enabled")
    expect(row.locator("td[data-col='detectors']")).to_have_text("Block: card")
    expect(row.locator("td[data-col='applies_to']")).to_have_text(f"model {model['name']}")
    until(lambda: proxy().status_code == 400, 3.0, "the policy on every worker")
    blocked = proxy()
    assert blocked.status_code == 400 and blocked.json()["error"] == "sensitive_content_blocked", blocked.text

    # A custom pattern that does not compile: refused, every problem listed in the form.
    page.get_by_role("button", name=f"Edit policy {name}").click()
    expect(page.locator("#dlp-form-title")).to_have_text(f"Edit policy {name}")
    expect(form.get_by_label("Policy name")).to_have_js_property("readOnly", True)
    form.get_by_role("button", name="Add a custom pattern").click()
    custom = form.locator("#dlp-custom-0")
    expect(custom.get_by_label("Detector name")).to_be_focused()
    custom.get_by_label("Detector name").fill("ticket")
    custom.get_by_label("Pattern", exact=True).fill("(")
    form.get_by_role("button", name="Add a custom pattern").click()
    form.locator("#dlp-custom-1").get_by_label("Detector name").fill("card")
    form.locator("#dlp-custom-1").get_by_label("Pattern", exact=True).fill("x")
    form.get_by_role("button", name="Save policy").click()
    problems = page.locator("#dlp-problems")
    expect(problems).to_be_focused()
    expect(problems).to_contain_text("invalid_policy")
    expect(problems.locator("li")).to_have_count(2)
    expect(problems.locator("li").nth(0)).to_contain_text("custom[0].pattern")
    expect(problems.locator("li").nth(1)).to_contain_text("custom[1].name")
    assert tab.axe() == []
    tab.screenshot("15-dlp-problems")
    # Chromium logs the refused request itself as a console error: that one was expected.
    expected = [e for e in tab.errors if "status of 400" in e]
    assert len(expected) == 1, tab.errors
    tab.errors.remove(expected[0])
    assert proxy().status_code == 400  # nothing was saved

    # Redact instead (the bad rows removed): the call goes through.
    form.get_by_role("button", name="Remove custom pattern 2").click()
    form.get_by_role("button", name="Remove custom pattern 1").click()
    expect(form.locator("#dlp-custom fieldset")).to_have_count(0)
    form.get_by_label("Payment card numbers (card)").select_option("redact")
    form.get_by_role("button", name="Save policy").click()
    expect(row.locator("td[data-col='detectors']")).to_have_text("Redact: card")
    expect(row.locator("td[data-col='version']")).to_have_text("2")
    until(lambda: proxy().status_code == 200, 3.0, "the redacting policy on every worker")

    # The detections table counts the blocked call; the logs show what the call took.
    wait_for_row(tab, "#dlp-detections tr[data-detector='card']:not([data-block='0'])", "#dlp-refresh")
    assert int(page.locator("#dlp-detections tr[data-detector='card']").get_attribute("data-block")) >= 1
    tab.screenshot("16-dlp")
    tab.go("logs", "Logs")
    page.get_by_label("Search").fill(blocked.headers["x-request-id"])
    page.get_by_role("button", name="Apply filters").click()
    log_row = wait_for_row(tab, f"#logs-table tr[data-request-id='{blocked.headers['x-request-id']}']", "#logs-apply")
    assert log_row.get_attribute("data-dlp-action") == "block"
    expect(log_row.locator("td[data-col='dlp']")).to_have_text("block card ×1")

    tab.go("dlp", "Data protection")
    page.get_by_role("button", name=f"Delete policy {name}").click()
    expect(row).to_have_count(0)
    assert any(message.startswith(f"Delete the data protection policy {name}") for message in asked), asked
    assert name not in {p["name"] for p in gateway.admin("GET", "/admin/dlp/policies").json()}


def test_the_other_admin_writes_are_reachable_from_the_ui(tab: Tab, gateway: Gateway, testserve: EmulatedProviders,
                                                          admin: dict[str, str]) -> None:
    """Deployments, revoking a grant, deleting a user, a model and a provider, admins (create,
    pause, resume, delete) and admin API tokens (create, shown once, revoke) all work from the UI."""
    from playwright.sync_api import expect

    page = tab.page
    tag = secrets.token_hex(3)
    provider = gateway.create_provider(f"ui-ts-{tag}", base_url=f"{testserve.base_url}/openai")
    spare = gateway.create_provider(f"ui-spare-{tag}", base_url=f"{testserve.base_url}/openai")
    model = gateway.create_model(provider["id"], f"ui-chat-{tag}", resolved_model="dummy-chat")
    user = gateway.create_user(f"ui-user-{tag}@example.com")
    gateway.grant(user["id"], model["id"])
    tab.login(admin)

    tab.go("models", "Models")
    form = page.locator("#deployment-form")
    form.get_by_label("Model", exact=True).select_option(label=model["name"])
    form.get_by_label("Provider").select_option(label=spare["name"])
    form.get_by_label("Resolved model").fill("dummy-chat")
    form.get_by_label("Region").fill("eu-west")
    form.get_by_role("button", name="Add deployment").click()
    removal = page.get_by_role("button", name=f"Remove deployment dummy-chat of {model['name']}")
    expect(removal).to_be_visible()
    assert len(gateway.admin("GET", f"/admin/models/{model['id']}/deployments").json()) == 1
    removal.click()
    expect(removal).to_have_count(0)

    tab.go("access", "Access & policies")
    page.get_by_label("User", exact=True).select_option(label=user["email"])
    page.get_by_role("button", name=f"Revoke access to {model['name']}").click()
    expect(page.locator(f"#policies-table tr[data-name='{model['name']}']")).to_have_count(0)

    tab.go("users", "Users & keys")
    page.get_by_role("button", name=f"Delete {user['email']}").click()
    expect(page.locator(f"#users-table tr[data-email='{user['email']}']")).to_have_count(0)
    tab.go("models", "Models")
    page.get_by_role("button", name=f"Delete model {model['name']}").click()
    expect(page.locator(f"#models-table tr[data-name='{model['name']}']")).to_have_count(0)
    tab.go("providers", "Providers")
    for name in (provider["name"], spare["name"]):
        page.get_by_role("button", name=f"Delete provider {name}").click()
        expect(page.locator(f"#providers-table tr[data-name='{name}']")).to_have_count(0)

    tab.go("admins", "Admins & tokens")
    other = f"ui-admin-{tag}@example.com"
    create = page.locator("#admin-create")
    create.get_by_label("Email", exact=True).fill(other)
    create.get_by_label("Password", exact=True).fill("another-pass-123")
    create.get_by_role("button", name="Create admin").click()
    row = page.locator(f"#admins-table tr[data-email='{other}']")
    expect(row.locator("td[data-col='status']")).to_have_text("active")
    page.get_by_role("button", name=f"Pause {other}").click()
    expect(row.locator("td[data-col='status']")).to_have_text("paused")
    page.get_by_role("button", name=f"Resume {other}").click()
    expect(row.locator("td[data-col='status']")).to_have_text("active")
    page.get_by_role("button", name=f"Delete admin {other}").click()
    expect(row).to_have_count(0)

    page.get_by_label("Token name").fill(f"ui-token-{tag}")
    page.get_by_role("button", name="Create token").click()
    token = page.locator("#new-secret").inner_text().strip()
    assert token.startswith("mesh_admin_")
    assert gateway.admin("GET", "/admin/me", token=token).status_code == 200
    page.get_by_role("button", name=f"Revoke token ui-token-{tag}").click()
    expect(page.locator(f"#tokens-table tr[data-name='ui-token-{tag}'] td[data-col='actions']")).to_have_text("Revoked")
    tab.screenshot("10-admins")
