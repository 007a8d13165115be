"""The admin API's OpenAPI document: a valid OpenAPI 3.1 document that lists exactly the router's
operations, and schemathesis, generating requests from it against a live gateway, finds no server
error. ``MESHFAST_FUZZ_EXAMPLES`` (examples per operation, default 15) and ``MESHFAST_FUZZ_SEED``
make a longer or a repeatable run: ``make fuzz-admin``."""

from __future__ import annotations

import os
import random
import re

import pytest
import schemathesis
from conftest import Gateway
from hypothesis import HealthCheck, given, seed, settings
from openapi_spec_validator import validate as validate_spec
from schemathesis import GenerationMode, checks

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


def test_the_document_is_valid_openapi() -> None:
    """The document passes the OpenAPI 3.1 specification's own schema (defaults of their type)."""
    validate_spec(openapi.document())


def test_the_document_states_the_limits_the_routes_enforce() -> None:
    """Strings, lists and integers in request bodies carry maxLength, maxItems and bounds, so
    generated requests (and clients) stay inside what the admin plane takes."""
    schemas = openapi.document()["components"]["schemas"]
    assert schemas["UserCreate"]["properties"]["display_name"]["maxLength"] == 200
    provider = schemas["ProviderCreate"]["properties"]
    assert provider["max_outbound_rps"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}
    assert provider["base_url"]["maxLength"] == 2048
    assert schemas["LoginBody"]["properties"]["password"]["maxLength"] > 0

    def unbounded(schema: object, where: str) -> list[str]:
        if isinstance(schema, list):
            return [p for i, s in enumerate(schema) for p in unbounded(s, f"{where}[{i}]")]
        if not isinstance(schema, dict):
            return []
        kind = schema.get("type")
        missing = ((kind == "string" and "maxLength" not in schema and "enum" not in schema)
                   or (kind == "array" and "maxItems" not in schema)
                   or (kind == "integer" and "maximum" not in schema))
        return ([where] if missing else []) + [p for k, s in schema.items() for p in unbounded(s, f"{where}.{k}")]

    assert not unbounded(schemas, "components"), unbounded(schemas, "components")


def gateway_router_operations() -> set[tuple[str, str]]:
    """The router's table, read from its source (method, path with {name} parameters)."""
    from pathlib import Path

    import meshfast.admin.plane as plane
    import meshfast.admin.routes as routes

    out = {("POST", "/admin/login")}
    for module in (routes, plane):
        source = Path(module.__file__).read_text().replace('admin_id + "', 'r"/admin/admins/(?P<id>[^/]+)')
        for method, pattern in re.findall(r'add\("([A-Z]+)", r"([^"]+)"', source):
            out.add((method, re.sub(r"\(\?P<(\w+)>\[\^/\]\+\)", r"{\1}", pattern).replace("\\.", ".")))
    return out


# In CI a short run; `make fuzz-admin` runs many more examples (a seed from the environment
# repeats a run; without one, every run draws a new seed).
FUZZ_EXAMPLES = int(os.environ.get("MESHFAST_FUZZ_EXAMPLES", "15"))
FUZZ_SEED = int(os.environ.get("MESHFAST_FUZZ_SEED") or random.randrange(2**32))


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
        if operation.path in ("/admin/kill-switch", "/admin/enforcement", "/admin/login", "/admin/change-password") or \
                operation.path.startswith(("/admin/admins/", "/admin/tokens/")):
            # The kill switch would pause every other test's gateway, the enforcement switch turn
            # every other test's rules to shadow; logins would trip the per-IP throttle; random
            # ids cannot reach an admin or token anyway.
            continue
        # Valid requests, and requests that break the schema (over-long strings, numbers out of
        # range, wrong types): both must be answered, never with a 5xx.
        strategy = operation.as_strategy() | operation.as_strategy(GenerationMode.NEGATIVE)

        @seed(FUZZ_SEED)
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=strategy)
        def run(case: schemathesis.Case) -> None:
            response = case.call(base_url=gateway.base_url, headers=headers)
            calls.append(response.status_code)
            try:
                case.validate_response(response, checks=[checks.not_a_server_error])
            except Exception as exc:  # noqa: BLE001 - collected and reported together
                failures.append(f"{case.method} {case.path}: {exc}"[:400])

        run()
    assert not failures, f"MESHFAST_FUZZ_SEED={FUZZ_SEED} repeats this run:\n" + "\n".join(failures[:10])
    assert len(calls) > 100 and any(200 <= c < 300 for c in calls) and any(400 <= c < 500 for c in calls)
