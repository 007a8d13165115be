"""Bad input on the admin plane (issue 13, items 7-10, 14 and the data plane's rows): every string
that could reach PostgreSQL is checked at the edge, numbers, dates, time zones and lengths have
limits, provider keys and URLs are checked when written. Each refusal is a 400
``invalid_request`` naming the field, never a 500 or a 503."""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from conftest import Gateway
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfast import errors, telemetry, validate
from meshfast.admin import service as svc

NUL = "a\u0000b"


def _name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def assert_refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, (response.status_code, response.text[:500])
    body = response.json()
    assert body["error"] == "invalid_request", body
    assert field in body.get("detail", ""), (field, body)


@pytest.fixture(scope="module")
def registry(gateway: Gateway) -> dict[str, Any]:
    """A provider, a model of it and a user to hang models, deployments and policies on."""
    provider = gateway.create_provider(_name("hard"))
    model = gateway.create_model(provider["id"], _name("hard-model"))
    user = gateway.create_user()
    return {"provider": provider, "model": model, "user": user}


def _provider(**fields: Any) -> dict[str, Any]:
    return {"name": _name("p"), "family": "openai", "base_url": "http://127.0.0.1:9/openai", "api_key": "sk-test",
            "local": True, "verify": False, **fields}


def _generic(**fields: Any) -> dict[str, Any]:
    return _provider(**{"family": "generic", "endpoint_url": "http://127.0.0.1:9/chat", "header_template": {"x-key": "k"},
                        "request_body_template": {"q": "{{content_json}}"}, "response_delta_path": "text", **fields})


def _model(provider_id: str, **fields: Any) -> dict[str, Any]:
    return {"provider_id": provider_id, "name": _name("m"), "resolved_model": "gpt-test", "verify": False,
            **fields}


# (label, method, path, body, field): built from the module's registry.
Case = tuple[str, str, Callable[[dict[str, Any]], str], Callable[[dict[str, Any]], Any], str]


def _user_path(r: dict[str, Any]) -> str:
    return f"/admin/users/{r['user']['id']}/policies/{r['model']['id']}"


def _deployments(r: dict[str, Any]) -> str:
    return f"/admin/models/{r['model']['id']}/deployments"


def _nul_cases() -> list[Case]:
    p = "/admin/providers"
    m = "/admin/models"
    cases: list[Case] = [
        ("user email", "POST", lambda r: "/admin/users", lambda r: {"email": f"{NUL}@x.com", "display_name": "x"},
         "email"),
        ("user display_name", "POST", lambda r: "/admin/users",
         lambda r: {"email": f"{_name('u')}@x.com", "display_name": NUL}, "display_name"),
        *[(f"user {f}", "POST", lambda r: "/admin/users",
           lambda r, f=f: {"email": f"{_name('u')}@x.com", "display_name": "x", f: NUL}, f)
          for f in ("manager_email", "business_unit", "tier")],
        *[(f"provider {f}", "POST", lambda r: p, lambda r, f=f: _provider(**{f: NUL}), f)
          for f in ("name", "family", "base_url", "api_key")],
        *[(f"generic provider {f}", "POST", lambda r: p, lambda r, f=f: _generic(**{f: NUL}), f)
          for f in ("endpoint_url", "response_delta_path", "http_method", "response_done_signal",
                    "usage_input_tokens_path", "generation_mode")],
        ("generic header value", "POST", lambda r: p, lambda r: _generic(header_template={"x-key": NUL}),
         "header_template"),
        ("generic header name", "POST", lambda r: p, lambda r: _generic(header_template={NUL: "v"}),
         "header_template"),
        ("template value", "POST", lambda r: p, lambda r: _generic(request_body_template={"q": NUL}),
         "request_body_template.q"),
        ("template as JSON text", "POST", lambda r: p,
         lambda r: _generic(request_body_template=json.dumps({"q": NUL})), "request_body_template.q"),
        ("provider's model name", "POST", lambda r: p,
         lambda r: _provider(models=[{"name": NUL, "resolved_model": "x"}]), "models[0].name"),
        *[(f"model {f}", "POST", lambda r: m, lambda r, f=f: {**_model(r["provider"]["id"]), f: NUL}, f)
          for f in ("name", "resolved_model", "kind", "output_media_type", "provider_id")],
        ("model alias", "POST", lambda r: m, lambda r: _model(r["provider"]["id"], aliases=["ok", NUL]),
         "aliases[1]"),
        ("model tag", "POST", lambda r: m, lambda r: _model(r["provider"]["id"], tags=[NUL]), "tags[0]"),
        *[(f"deployment {f}", "POST", _deployments,
           lambda r, f=f: {"provider_id": r["provider"]["id"], "resolved_model": "x", **{f: NUL}}, f)
          for f in ("resolved_model", "region", "provider_id")],
        ("access user_id", "POST", lambda r: "/admin/access",
         lambda r: {"user_id": NUL, "model_id": r["model"]["id"]}, "user_id"),
        ("revoke access model_id", "DELETE", lambda r: "/admin/access",
         lambda r: {"user_id": r["user"]["id"], "model_id": NUL}, "model_id"),
        *[(f"policy {f}", "PUT", _user_path, lambda r, f=f: {f: NUL}, f)
          for f in ("timezone", "allowed_from", "allowed_to")],
        ("token name", "POST", lambda r: "/admin/tokens", lambda r: {"name": NUL}, "name"),
        ("admin email", "POST", lambda r: "/admin/admins", lambda r: {"email": f"{NUL}@x.com", "password": "p" * 12},
         "email"),
        ("admin password", "POST", lambda r: "/admin/admins",
         lambda r: {"email": f"{_name('a')}@x.com", "password": NUL * 6}, "password"),
    ]
    return cases


@pytest.mark.parametrize("label, method, path, body, field", _nul_cases(), ids=[c[0] for c in _nul_cases()])
def test_nul_in_any_admin_string_is_refused_naming_the_field(
        gateway: Gateway, registry: dict[str, Any], label: str, method: str, path: Callable[..., str],
        body: Callable[..., Any], field: str) -> None:
    """A NUL anywhere in an admin body (nested ones too) is a 400 that names the field, not a 500."""
    assert_refused(gateway.admin(method, path(registry), body(registry)), field)


@pytest.mark.parametrize("field", ["email", "password"])
def test_nul_in_a_login_is_refused_before_any_lookup(gateway: Gateway, field: str) -> None:
    """``/admin/login`` (no credentials needed) refuses a NUL with a 400 naming the field."""
    body = {"email": "nobody@example.com", "password": "whatever", field: NUL}
    assert_refused(gateway.client.post("/admin/login", json=body), field)


def test_a_provider_put_with_nul_is_refused(gateway: Gateway) -> None:
    """PUT takes the create fields and the same checks (here a NUL in a header template)."""
    created = gateway.create_provider(_name("put"))
    etag = gateway.admin("GET", f"/admin/providers/{created['id']}").headers["etag"]
    response = gateway.client.put(
        f"/admin/providers/{created['id']}", json=_generic(name=created["name"], header_template={"x": NUL}),
        headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": etag})
    assert_refused(response, "header_template")


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "\\ud800\\u0041"])
def test_a_lone_surrogate_in_a_body_is_a_400(gateway: Gateway, escape: str) -> None:
    """A JSON escape of a lone UTF-16 surrogate (no Unicode scalar, unencodable for PostgreSQL)
    is refused as malformed JSON, never passed on."""
    raw = ('{"email": "x@example.com", "display_name": "a' + escape + 'b"}').encode()
    response = gateway.client.post("/admin/users", content=raw, headers={
        "authorization": f"Bearer {gateway.admin_token}", "content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"] == "invalid_request", response.text


@pytest.mark.parametrize("path, param", [
    *[("/admin/logs", p) for p in ("q", "request_id", "user_id", "model_id", "status", "sort", "order", "tz",
                                   "bucket", "from", "to", "page")],
    *[("/admin/logs/summary", p) for p in ("q", "user_id", "tz", "from")],
    *[("/admin/audit", p) for p in ("actor", "action", "from", "to", "page_size")],
])
def test_nul_in_a_query_parameter_is_refused_naming_it(gateway: Gateway, path: str, param: str) -> None:
    """Every log and audit filter goes through the shared check: a NUL is a 400 naming it."""
    response = gateway.client.get(f"{path}?{param}=a%00b",
                                  headers={"authorization": f"Bearer {gateway.admin_token}"})
    assert_refused(response, param)


def test_an_overlong_query_parameter_is_refused(gateway: Gateway) -> None:
    """A log search of 5 kB is refused, not sent to PostgreSQL as a LIKE pattern."""
    response = gateway.client.get("/admin/logs", params={"q": "x" * 5000},
                                  headers={"authorization": f"Bearer {gateway.admin_token}"})
    assert_refused(response, "q")


# --- numbers out of range ----------------------------------------------------------------------

BIG = 2**31
DEEP = 3000


def _range_cases() -> list[Case]:
    p = "/admin/providers"
    m = "/admin/models"
    cases: list[Case] = [
        *[(f"provider {f}={v}", "POST", lambda r: p, lambda r, f=f, v=v: _provider(**{f: v}), f)
          for f in ("max_outbound_rps", "max_concurrent_upstream", "max_calls_per_hour", "max_retries",
                    "retry_backoff_ms", "admission_share_pct") for v in (BIG, -1)],
        *[(f"provider web_search_price_per_call={v}", "POST", lambda r: p,
           lambda r, v=v: _provider(web_search_price_per_call=v), "web_search_price_per_call")
          for v in ("1e30", "NaN", "Infinity", "-1", "sNaN")],
        ("generic poll interval", "POST", lambda r: p, lambda r: _generic(generation_poll_interval_ms=BIG),
         "generation_poll_interval_ms"),
        ("template nested 3000 deep", "POST", lambda r: p,
         lambda r: _generic(request_body_template="[" * DEEP + "]" * DEEP), "request_body_template"),
        ("template value nested 40 deep", "POST", lambda r: p,
         lambda r: _generic(request_body_template=json.loads("[" * 40 + "]" * 40)), "request_body_template"),
        ("template with NaN", "POST", lambda r: p, lambda r: _generic(request_body_template='{"a": NaN}'),
         "request_body_template"),
        *[(f"model {f}={v}", "POST", lambda r: m, lambda r, f=f, v=v: _model(r["provider"]["id"], **{f: v}), f)
          for f in ("max_output_tokens",) for v in (BIG, -1)],
        ("model long_context_threshold_tokens", "POST", lambda r: m,
         lambda r: _model(r["provider"]["id"], long_context_threshold_tokens=BIG,
                          long_context_prices={"input_price_per_1k_tokens": "1"}), "long_context_threshold_tokens"),
        *[(f"model {f}={v}", "POST", lambda r: m, lambda r, f=f, v=v: _model(r["provider"]["id"], **{f: v}), f)
          for f in ("input_price_per_1k_tokens", "output_price_per_1k_tokens", "cache_read_price_per_1k_tokens",
                    "price_per_second") for v in ("1e30", "NaN", "Infinity", "-1", 1e300)],
        ("deployment priority", "POST", _deployments,
         lambda r: {"provider_id": r["provider"]["id"], "resolved_model": "x", "priority": BIG}, "priority"),
        *[(f"policy {f}={v}", "PUT", _user_path, lambda r, f=f, v=v: {f: v}, f)
          for f, v in (("max_calls_per_hour", BIG), ("max_calls_per_hour", 0), ("daily_cap_usd", "1e30"),
                       ("daily_cap_usd", "NaN"), ("daily_cap_usd", "-Infinity"), ("active_days", [BIG]),
                       ("active_days", [0] * 1000))],
    ]
    return cases


@pytest.mark.parametrize("label, method, path, body, field", _range_cases(), ids=[c[0] for c in _range_cases()])
def test_a_number_out_of_range_is_refused_naming_the_field(
        gateway: Gateway, registry: dict[str, Any], label: str, method: str, path: Callable[..., str],
        body: Callable[..., Any], field: str) -> None:
    """Integers past PostgreSQL's ``integer`` or the field's sense, prices that are not finite,
    non-negative and storable, and templates nested past the limit are 400s naming the field."""
    assert_refused(gateway.admin(method, path(registry), body(registry)), field)


@pytest.mark.parametrize("path", ["/admin/logs", "/admin/logs/summary", "/admin/audit"])
@pytest.mark.parametrize("param, value", [("from", "0001-01-01"), ("to", "9999-12-31T23:30Z"),
                                          ("to", "0001-01-01T00:30:00Z"), ("from", "9999-12-31T23:59:59.999999")])
def test_a_date_filter_at_the_calendar_edges_is_refused(gateway: Gateway, path: str, param: str,
                                                        value: str) -> None:
    """Dates whose window arithmetic would overflow are 400s naming the filter, not 500s."""
    response = gateway.client.get(path, params={param: value},
                                  headers={"authorization": f"Bearer {gateway.admin_token}"})
    assert_refused(response, param)


BAD_ZONES = ["posix/Asia/Tokyo", "right/UTC", "localtime", "posixrules", "x" * 5000, "Asia/Tokyo\n", "../etc/passwd"]


@pytest.mark.parametrize("zone", BAD_ZONES, ids=lambda z: z[:20])
def test_a_time_zone_postgresql_or_python_does_not_know_is_refused(gateway: Gateway, registry: dict[str, Any],
                                                                   zone: str) -> None:
    """A policy's and a summary's time zone must be one both sides know (today posix/Asia/Tokyo
    would shift a window by 9 h, and a long name answered 503 database_unavailable)."""
    assert_refused(gateway.admin("PUT", _user_path(registry), {"timezone": zone}), "timezone")
    response = gateway.client.get("/admin/logs/summary", params={"tz": zone},
                                  headers={"authorization": f"Bearer {gateway.admin_token}"})
    assert_refused(response, "tz")


@pytest.mark.parametrize("zone", ["Asia/Tokyo", "UTC", "America/New_York", "Europe/Paris"])
def test_a_known_time_zone_is_taken(gateway: Gateway, registry: dict[str, Any], zone: str) -> None:
    """The check takes the IANA names a policy needs."""
    assert gateway.admin("PUT", _user_path(registry), {"timezone": zone}).status_code == 200
    response = gateway.client.get("/admin/logs/summary", params={"tz": zone},
                                  headers={"authorization": f"Bearer {gateway.admin_token}"})
    assert response.status_code == 200, response.text


# --- lengths -----------------------------------------------------------------------------------


def _length_cases() -> list[Case]:
    p = "/admin/providers"
    m = "/admin/models"
    long = "x" * 10_000
    return [
        ("display name of 100 kB", "POST", lambda r: "/admin/users",
         lambda r: {"email": f"{_name('u')}@x.com", "display_name": "x" * 100_000}, "display_name"),
        ("email", "POST", lambda r: "/admin/users", lambda r: {"email": "x" * 400 + "@x.com", "display_name": "x"},
         "email"),
        ("business unit", "POST", lambda r: "/admin/users",
         lambda r: {"email": f"{_name('u')}@x.com", "display_name": "x", "business_unit": long}, "business_unit"),
        ("provider name", "POST", lambda r: p, lambda r: _provider(name="p" * 300), "name"),
        ("base_url", "POST", lambda r: p, lambda r: _provider(base_url="http://127.0.0.1/" + long), "base_url"),
        ("api_key", "POST", lambda r: p, lambda r: _provider(api_key="k" * 100_000), "api_key"),
        ("provider models", "POST", lambda r: p, lambda r: _provider(models=[{}] * 2000), "models"),
        ("model name", "POST", lambda r: m, lambda r: _model(r["provider"]["id"], name=long), "name"),
        ("10,000 aliases", "POST", lambda r: m,
         lambda r: _model(r["provider"]["id"], aliases=[f"a{i}" for i in range(10_000)]), "aliases"),
        ("a tag", "POST", lambda r: m, lambda r: _model(r["provider"]["id"], tags=[long]), "tags[0]"),
        ("region", "POST", _deployments,
         lambda r: {"provider_id": r["provider"]["id"], "resolved_model": "x", "region": long}, "region"),
        ("token name", "POST", lambda r: "/admin/tokens", lambda r: {"name": long}, "name"),
        ("admin password", "POST", lambda r: "/admin/admins",
         lambda r: {"email": f"{_name('a')}@x.com", "password": "p" * 100_000}, "password"),
        ("header template of 5,000 headers", "POST", lambda r: p,
         lambda r: _generic(header_template={f"h{i}": "v" for i in range(5000)}), "header_template"),
    ]


@pytest.mark.parametrize("label, method, path, body, field", _length_cases(), ids=[c[0] for c in _length_cases()])
def test_an_overlong_string_or_list_is_refused_naming_the_field(
        gateway: Gateway, registry: dict[str, Any], label: str, method: str, path: Callable[..., str],
        body: Callable[..., Any], field: str) -> None:
    """Every admin string and list has a limit (validate.py's table): a 10 MiB display name no
    longer makes every user listing 10 MB."""
    assert_refused(gateway.admin(method, path(registry), body(registry)), field)


# --- provider keys -----------------------------------------------------------------------------

# (Leading and trailing whitespace is stripped, as from a pasted key; inside a key it is refused.)
BAD_KEYS = ["sk-\u0000x", "sk-x\r\nX-Injected: 1", "sk-\rx", "sk-\tx", "sk-\x7fx", "sk-\u2028x", "sk-\x85x"]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_a_provider_key_with_control_characters_is_refused_on_create_and_update(gateway: Gateway, key: str) -> None:
    """A key that cannot go into a header (NUL, CR/LF, other controls) is refused when written,
    on POST and on PUT, instead of failing every call later."""
    assert_refused(gateway.admin("POST", "/admin/providers", _provider(api_key=key)), "api_key")
    created = gateway.create_provider(_name("key"))
    etag = gateway.admin("GET", f"/admin/providers/{created['id']}").headers["etag"]
    response = gateway.client.put(f"/admin/providers/{created['id']}", json=_provider(name=created["name"], api_key=key),
                                  headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": etag})
    assert_refused(response, "api_key")


def _registry_file(provider: dict[str, Any], model: dict[str, Any] | None = None) -> bytes:
    base = {"name": "reg-p", "family": "openai", "base_url": "http://127.0.0.1:9/v1", "local": True}
    return json.dumps({"providers": [{**base, **provider}],
                       "models": [{"name": "reg-m", "provider": "reg-p", "resolved_model": "x", **(model or {})}]}
                      ).encode()


@pytest.mark.parametrize("provider, model, field", [
    ({"api_key": "sk\r\nx"}, None, "api_key"),
    ({"api_key_env": "HARDENING_KEY"}, None, "api_key"),
    ({"api_key": "k", "name": NUL}, None, "name"),
    ({"api_key": "k", "max_outbound_rps": BIG}, None, "max_outbound_rps"),
    ({"api_key": "k", "local": False, "base_url": "http://2130706433/"}, None, "base_url"),
    ({"api_key": "k"}, {"aliases": [NUL]}, "aliases"),
    ({"api_key": "k"}, {"input_price_per_1k_tokens": "NaN"}, "input_price_per_1k_tokens"),
])
def test_a_registry_file_gets_the_same_checks(provider: dict[str, Any], model: dict[str, Any] | None,
                                              field: str) -> None:
    """``meshfast apply`` and ``serve --registry`` parse files with the API's checks: a bad key
    (from the file or the environment), a NUL, a number out of range or a private URL is an
    error naming the field, with nothing applied."""
    environ = {"HARDENING_KEY": "sk-\udcff\n"}  # undecodable bytes from the environment, and a line break
    with pytest.raises(errors.InvalidRequest) as raised:
        svc.parse_registry(_registry_file(provider, model), "json", environ)
    assert field in " ".join(raised.value.extra.get("errors", [raised.value.detail])), raised.value.extra


def test_a_registry_toml_with_nul_is_refused() -> None:
    """TOML's ``\\u0000`` escape reaches the same check."""
    data = b'[[providers]]\nname = "a\\u0000b"\nfamily = "openai"\nbase_url = "https://api.example.com"\napi_key = "k"\n'
    with pytest.raises(errors.InvalidRequest) as raised:
        svc.parse_registry(data, "toml", {})
    assert "providers[0].name" in str(raised.value.detail)


# --- provider URLs (SSRF at create time) -------------------------------------------------------

NON_PUBLIC_URLS = [
    "http://localhost.", "http://LOCALHOST:8080/v1", "http://api.localhost", "http://127.0.0.1.", "http://127.1",
    "http://0x7f000001", "http://2130706433", "http://0177.0.0.1", "http://0x7f.1", "http://017700000001",
    "http://[::1]", "http://[::ffff:127.0.0.1]", "http://[::ffff:7f00:1]", "http://[fe80::1]",
    "http://[fe80::1%25eth0]", "http://[64:ff9b::a9fe:a9fe]", "http://224.0.0.1", "http://239.255.255.250",
    "http://[ff02::1]", "http://0.0.0.0", "http://0", "http://[::]", "http://100.64.0.1", "http://100.127.255.254",
    "http://169.254.169.254/latest", "http://10.1.2.3", "http://172.16.0.1", "http://192.168.0.1",
]
MALFORMED_URLS = [
    "http://evil.com\\@127.0.0.1/", "http://evil.com\\.127.0.0.1/", "http://user:pw@example.com",
    "http://example.com@127.0.0.1", "http://exa mple.com", "http://example.com/\r\nX: y", "http://ｌｏｃａｌｈｏｓｔ",
    "http://999.0.0.1", "http://1.2.3.4.5", "http://example.com:99999", "http://[::1", "ftp://example.com",
    "http://", "javascript:alert(1)",
]


@pytest.mark.parametrize("url", NON_PUBLIC_URLS)
def test_a_non_public_base_url_in_any_spelling_needs_local(gateway: Gateway, url: str) -> None:
    """Loopback, private, link-local, shared (100.64.0.0/10), multicast and unspecified
    addresses are refused unless ``local: true``, however the host is spelled."""
    assert_refused(gateway.admin("POST", "/admin/providers", _provider(base_url=url, local=False)), "base_url")
    assert gateway.admin("POST", "/admin/providers", _provider(base_url=url, local=True)).status_code == 201


@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_a_base_url_parsers_disagree_on_is_refused_even_when_local(gateway: Gateway, url: str) -> None:
    """A URL that parsers read two ways (a backslash, user info, spaces, control characters,
    non-ASCII, a numeric host out of range) is refused whatever ``local`` says."""
    for local in (False, True):
        assert_refused(gateway.admin("POST", "/admin/providers", _provider(base_url=url, local=local)), "base_url")


@pytest.mark.parametrize("field", ["endpoint_url", "generation_status_url_template"])
def test_a_generic_providers_own_urls_get_the_base_url_check(gateway: Gateway, field: str) -> None:
    """A generic provider calls its endpoint URLs as they are: they are held to base_url's rules."""
    fields = {"base_url": "https://api.example.com", "local": False, field: "http://169.254.169.254/{{model}}"}
    assert_refused(gateway.admin("POST", "/admin/providers", _generic(**fields)), field)


def test_a_public_base_url_is_taken(gateway: Gateway) -> None:
    """The check leaves ordinary provider URLs alone."""
    for url in ("https://api.openai.com", "https://api.example.com:8443/v1/", "http://8.8.8.8/x"):
        assert gateway.admin("POST", "/admin/providers", _provider(base_url=url, local=False)).status_code == 201


label = st.one_of(st.integers(0, 2**32).map(str), st.integers(0, 2**32).map(hex),
                  st.integers(0, 2**32).map(lambda n: "0" + oct(n)[2:]), st.text("0123456789abcdefxX", min_size=1,
                                                                                   max_size=6))


@settings(max_examples=3000, deadline=None)
@given(st.lists(label, min_size=1, max_size=5).map(".".join))
def test_numeric_hosts_are_read_as_inet_aton_reads_them(host: str) -> None:
    """Whatever address the C library's ``inet_aton`` reads a host as, the create-time check
    reads the same (so no numeric spelling slips past it)."""
    try:
        reference = ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return
    assert validate.host_address(host) == reference


# --- rows on the data plane --------------------------------------------------------------------


def test_a_nul_in_a_data_plane_model_name_keeps_its_row(gateway: Gateway) -> None:
    """The caller gets the same answer as before, and the row is written with the value made
    safe (NUL as U+FFFD) instead of being refused by COPY into the rejected spool."""
    user = gateway.create_user()
    response = gateway.client.post("/v1/chat/completions", json={"model": f"hard-{NUL}",
                                                                 "messages": [{"role": "user", "content": "hi"}]},
                                   headers={"authorization": f"Bearer {user['key']}"})
    assert response.status_code == 404, response.text
    row = gateway.fetch_row(response.headers["x-request-id"], timeout_s=10)
    assert row["requested_model"] == "hard-a\ufffdb"


def test_a_row_with_any_strings_is_stored_by_copy(gateway: Gateway) -> None:
    """A row whose strings hold NUL, lone surrogates or a model name past what the rollups'
    unique index takes (PostgreSQL refused it with "index row requires 9072 bytes") is written
    by the ingest's COPY, with those values made safe."""
    import asyncio
    import random
    import time

    import asyncpg

    crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    request_id = "req_" + "".join(random.choice(crockford) for _ in range(26))
    long_name = "".join(chr(random.randrange(0x4E00, 0x9FFF)) for _ in range(3000))
    row = telemetry.Row(request_id=request_id, created_ms=int(time.time() * 1000), route="openai_chat\x00",
                        outcome="denied", status_code=404, model_name=long_name, requested_model="m\ud800\x00",
                        deny_reason="model_not_found\x00", user_agent="agent/1.0 \udcff\x00")

    async def copy() -> dict[str, Any]:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            await conn.copy_records_to_table("request_logs_ingest", records=[telemetry.to_record(row)],
                                             columns=telemetry.COLUMNS)
            stored = await conn.fetchrow("SELECT * FROM request_logs WHERE request_id = $1", request_id)
            return dict(stored)
        finally:
            await conn.close()

    stored = asyncio.run(copy())
    assert stored["model_name"] == long_name[:telemetry.MAX_KEY_TEXT]
    assert stored["requested_model"] == "m\ufffd\ufffd"
    assert stored["user_agent"] == "agent/1.0 \ufffd\ufffd" and stored["route"] == "openai_chat\ufffd"


@given(st.text(max_size=300) | st.text(st.characters(exclude_categories=()), max_size=50))
def test_safe_text_is_always_storable_and_changes_only_what_it_must(value: str) -> None:
    """Any string becomes one PostgreSQL stores (no NUL, UTF-8 encodable, bounded), and a string
    that already was one comes back unchanged."""
    out = telemetry.safe_text(value, 100)
    assert out is not None and "\x00" not in out and len(out) <= 100
    out.encode()
    if "\x00" not in value and len(value) <= 100 and validate.text_problem(value) is None:
        assert out == value


@pytest.mark.parametrize("method, path", [("PUT", "/admin/providers/{id}"), ("PUT", "/admin/models/{id}"),
                                          ("POST", "/admin/users"), ("POST", "/admin/tokens"),
                                          ("PUT", "/admin/users/{user}/policies/{model}")])
def test_a_body_nested_thousands_deep_is_a_400(gateway: Gateway, registry: dict[str, Any], method: str,
                                               path: str) -> None:
    """A body nested past the decoder's recursion limit is refused as a 400, on every route that
    decodes one (the provider PUT decodes it twice)."""
    url = path.format(id=registry["provider"]["id"] if "providers" in path else registry["model"]["id"],
                      user=registry["user"]["id"], model=registry["model"]["id"])
    body = b'{"name": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    response = gateway.client.request(method, url, content=body, headers={
        "authorization": f"Bearer {gateway.admin_token}", "content-type": "application/json", "if-match": "*"})
    assert response.status_code == 400 and response.json()["error"] == "invalid_request", response.text
