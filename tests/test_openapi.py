"""The admin API's OpenAPI document: it lists exactly the router's operations, and schemathesis,
generating requests from it against a live gateway, finds no server error."""

from __future__ import annotations

import re

import pytest
import schemathesis
from conftest import Gateway
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from meshfast.admin import openapi


def test_the_document_lists_every_admin_route(gateway: Gateway) -> None:
    served = gateway.client.get("/admin/openapi.json")
    assert served.status_code == 200
    doc = served.json()
    assert doc["openapi"].startswith("3.1") and doc == openapi.document()
    router = gateway_router_operations()
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert router <= documented, f"undocumented: {sorted(router - documented)}"
    extra = documented - router - {("GET", "/admin/metrics"), ("GET", "/admin/openapi.json")}
    assert not extra, f"documented but not routed: {sorted(extra)}"


def gateway_router_operations() -> set[tuple[str, str]]:
    """The router's table, read from its source (method, path with {name} parameters)."""
    from pathlib import Path

    import meshfast.admin.plane as plane
    import meshfast.admin.routes as routes

    out = {("POST", "/admin/login")}
    for module in (routes, plane):
        source = Path(module.__file__).read_text().replace('admin_id + "', 'r"/admin/admins/(?P<id>[^/]+)')
        for method, pattern in re.findall(r'add\("([A-Z]+)", r"([^"]+)"', source):
            out.add((method, re.sub(r"\(\?P<(\w+)>\[\^/\]\+\)", r"{\1}", pattern)))
    return out


@pytest.fixture(scope="module")
def schema(gateway: Gateway) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{gateway.base_url}/admin/openapi.json")


def test_schemathesis_finds_no_server_error(gateway: Gateway, schema: schemathesis.BaseSchema) -> None:
    """Every operation, examples generated from its schema (valid and invalid bodies, odd path
    parameters), with a valid admin token: never a 5xx, never a response that breaks the schema."""
    failures: list[str] = []
    calls: list[int] = []
    headers = {"authorization": f"Bearer {gateway.admin_token}"}
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path in ("/admin/kill-switch", "/admin/login", "/admin/change-password") or \
                operation.path.startswith(("/admin/admins/", "/admin/tokens/")):
            # The kill switch would pause every other test's gateway; logins would trip the per-IP
            # throttle; random ids cannot reach an admin or token anyway.
            continue
        strategy = operation.as_strategy()

        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=strategy)
        def run(case: schemathesis.Case) -> None:
            response = case.call(base_url=gateway.base_url, headers=headers)
            calls.append(response.status_code)
            try:
                case.validate_response(response, checks=[checks.not_a_server_error])
            except Exception as exc:  # noqa: BLE001 - collected and reported together
                failures.append(f"{case.method} {case.path}: {exc}"[:400])

        run()
    assert not failures, "\n".join(failures[:10])
    assert len(calls) > 100 and any(200 <= c < 300 for c in calls) and any(400 <= c < 500 for c in calls)
