"""Spend rules end to end (issue 14, "Tests"): real calls through a two-worker `meshfast serve`
to testserve, rules written through `/admin/rules` and enforced by the workers' core.

Prices are chosen so a call's worst case is its actual cost: input is free and each call asks
`max_tokens: 3` for a prompt (`hello`) that testserve answers in exactly three output tokens at
$1 per 1k, so every call costs and reserves $0.003. A threshold of k × $0.003 then admits
exactly k calls, and "spend in scope" is a count of calls."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import socket
import time
import zoneinfo
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import asyncpg
import httpx
import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway, WorkerConnections, running_gateway, until
from conftest import tag as _tag
from test_notifications import Receiver

Json = dict[str, Any]

# Rule windows on a calendar half an hour off UTC's, so a window end computed in UTC (or in whole
# hours) shows. The outbox polled five times a second, so a delivery lands within a second of its row.
CALENDAR_TZ = "Asia/Kolkata"
RULES_ENV = {**SESSION_ENV, "MESHFAST_CALENDAR_TZ": CALENDAR_TZ, "MESHFAST_NOTIFY_POLL_S": "0.2",
             "MESHFAST_NOTIFY_BACKOFF_S": "0.3", "MESHFAST_NOTIFY_TIMEOUT_S": "3"}
PROPAGATION_S = 1.0
CALL_USD = Decimal("0.003")
PROMPT = "hello"
MAX_TOKENS = 3
# Shadow mode's "0 denials over 10,000 calls": CI runs a tenth; RULES_SHADOW_CALLS=10000 runs the whole.
SHADOW_CALLS = int(os.environ.get("RULES_SHADOW_CALLS", "1000"))




# --- the gateway, people, models and calls ------------------------------------------------------




@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_gateway(2, env=RULES_ENV) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def _user(gw: Gateway, **extra: Any) -> Json:
    email = f"rl-{_tag()}@example.com"
    response = gw.admin("POST", "/admin/users", {"email": email, "display_name": email.split("@")[0], **extra})
    assert response.status_code == 201, response.text
    return response.json()


def _model(gw: Gateway, testserve: EmulatedProviders, tags: list[str] | None = None) -> Json:
    """A chat model on testserve whose calls cost exactly CALL_USD (input free, $1 per 1k output)."""
    provider = gw.create_provider(f"rl-p-{_tag()}", base_url=f"{testserve.base_url}/openai",
                                  api_key="testserve-key")
    return gw.create_model(provider["id"], f"rl-m-{_tag()}", resolved_model="dummy-chat", tags=tags or [],
                           input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")


def _grant(gw: Gateway, people: list[Json], models: list[Json]) -> None:
    for person in people:
        for model in models:
            gw.grant(person["id"], model["id"])


def _auth(person: Json) -> dict[str, str]:
    return {"authorization": f"Bearer {person['key']}"}


def _proxy(gw: Gateway, person: Json, model: Json) -> httpx.Response:
    return gw.client.post("/v1/proxy", params={"model": model["name"]}, headers=_auth(person),
                          json={"query": PROMPT, "max_tokens": MAX_TOKENS})


def _chat(gw: Gateway, person: Json, model: Json) -> httpx.Response:
    return gw.client.post("/v1/chat/completions", headers=_auth(person), json={
        "model": model["name"], "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": PROMPT}]})


def _spend(gw: Gateway, person: Json, model: Json, calls: int) -> None:
    for _ in range(calls):
        response = _proxy(gw, person, model)
        assert response.status_code == 200, response.text


def _usage_rules(gw: Gateway, person: Json) -> dict[str, Json]:
    response = gw.client.get("/v1/usage", headers=_auth(person))
    assert response.status_code == 200, response.text
    return {r["id"]: r for r in response.json()["rules"]}


def _entry(scope: Json, threshold_usd: Decimal | str | None, actions: list[Json], window: str = "monthly",
           **population: list[str]) -> Json:
    entry: Json = {"population": population, "scope": scope, "window": window, "actions": actions}
    if threshold_usd is not None:
        entry["threshold_usd"] = str(threshold_usd)
    return entry


def _rule(gw: Gateway, *entries: Json, mode: str = "enforce", weight: int = 10, prefix: str = "r") -> str:
    rule_id = f"{prefix}-{_tag()}"
    response = gw.admin("POST", "/admin/rules", {"id": rule_id, "weight": weight, "mode": mode,
                                                 "entries": list(entries)})
    assert response.status_code == 201, response.text
    return rule_id


class Workers(WorkerConnections):
    """A keep-alive connection pinned to each worker, for data-plane POSTs as well as GETs."""

    def post_all(self, path: str, headers: dict[str, str], body: Json) -> dict[int, tuple[int, dict[str, str], bytes]]:
        payload = json.dumps(body).encode()
        answers = {}
        for pid, sock in self.by_pid.items():
            lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
                     f"Content-Length: {len(payload)}"] + [f"{k}: {v}" for k, v in headers.items()]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
            answers[pid] = _read_response(sock)
        return answers

    def proxy_all(self, person: Json, model: Json) -> dict[int, tuple[int, dict[str, str], bytes]]:
        return self.post_all(f"/v1/proxy?model={model['name']}", _auth(person),
                             {"query": PROMPT, "max_tokens": MAX_TOKENS})


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while not rest.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            rest += chunk
        body, data = b"", rest
        while True:
            size_line, data = data.split(b"\r\n", 1)
            size = int(size_line, 16)
            if size == 0:
                break
            body, data = body + data[:size], data[size + 2:]
        return int(status_line.split()[1]), headers, body
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed")
        rest += chunk
    return int(status_line.split()[1]), headers, rest[:length]


@contextlib.contextmanager
def _workers(gw: Gateway) -> Iterator[Workers]:
    workers = Workers(gw)
    try:
        yield workers
    finally:
        workers.close()


def _on_every_worker(workers: Workers, probe: Callable[[], dict[int, Any]], check: Callable[[Any], bool],
                     timeout_s: float = PROPAGATION_S) -> float:
    """Seconds until ``check`` holds for every worker's answer to ``probe``; fails after ``timeout_s``."""
    start = time.monotonic()
    while True:
        answers = probe()
        if all(check(a) for a in answers.values()):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not on every worker within {timeout_s} s: {answers}")
        time.sleep(0.02)


def _rule_loaded(gw: Gateway, member: Json, rule_id: str) -> None:
    """Waits until every worker's /v1/usage for ``member`` (whom the rule covers) lists the rule."""
    with _workers(gw) as workers:
        _on_every_worker(workers, lambda: workers.get_all("/v1/usage", _auth(member)),
                         lambda a: a[0] == 200 and rule_id in {r["id"] for r in json.loads(a[1])["rules"]},
                         timeout_s=5.0)


def _put_with_etag(gw: Gateway, path: str, body: Json) -> httpx.Response:
    etag = gw.admin("GET", path).headers["etag"]
    return gw.client.put(path, json=body, headers={"authorization": f"Bearer {gw.admin_token}", "if-match": etag})


def _db(gw: Gateway, query: str, *args: Any) -> list[Json]:
    async def run() -> list[Json]:
        conn = await asyncpg.connect(gw.database_url)
        try:
            return [dict(r) for r in await conn.fetch(query, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


def _rows_of(gw: Gateway, person: Json, at_least: int, timeout_s: float = 10.0) -> list[Json]:
    """The person's request_logs rows (folded denials counted by ``count``), once ``at_least`` calls are in."""
    def rows() -> list[Json] | None:
        found = _db(gw, "SELECT * FROM request_logs WHERE user_id = $1::uuid", person["id"])
        return found if sum(r["count"] for r in found) >= at_least else None

    return until(rows, timeout_s, f"{at_least} rows of {person['email']}")


def _cost(row: Json) -> Decimal:
    return Decimal(row["input_cost"]) + Decimal(row["output_cost"])


def _window_end(window: str) -> str:
    """The end of the current window instance on CALENDAR_TZ's calendar, as the API writes instants."""
    zone = zoneinfo.ZoneInfo(CALENDAR_TZ)
    today = dt.datetime.now(zone).date()
    if window == "daily":
        end = today + dt.timedelta(days=1)
    elif window == "weekly":
        end = today + dt.timedelta(days=7 - today.weekday())
    else:
        end = dt.date(today.year + (today.month == 12), today.month % 12 + 1, 1)
    moment = dt.datetime.combine(end, dt.time(), zone).astimezone(dt.UTC)
    return moment.isoformat().replace("+00:00", "Z")


def _month_end() -> str:
    return _window_end("monthly")


async def _burst(gw: Gateway, calls: list[tuple[Json, Json]], concurrency: int) -> list[httpx.Response]:
    """``calls`` ((person, model) pairs) on /v1/proxy, ``concurrency`` at a time over fresh connections
    (the kernel spreads them over both workers)."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60, limits=limits) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(person: Json, model: Json) -> httpx.Response:
            async with gate:
                return await client.post("/v1/proxy", params={"model": model["name"]}, headers=_auth(person),
                                         json={"query": PROMPT, "max_tokens": MAX_TOKENS})

        return await asyncio.gather(*(one(p, m) for p, m in calls))


# --- the calibration the tests lean on --------------------------------------------------------------


def test_a_call_costs_its_worst_case_so_thresholds_count_calls(gw: Gateway, testserve: EmulatedProviders) -> None:
    """The module's premise: on both routes, streamed or not, a call's recorded cost is exactly
    CALL_USD, the worst case the gateway reserves for it."""
    model = _model(gw, testserve)
    person = _user(gw)
    _grant(gw, [person], [model])
    proxied, chatted = _proxy(gw, person, model), _chat(gw, person, model)
    streamed = gw.client.post("/v1/chat/completions", headers=_auth(person), json={
        "model": model["name"], "max_tokens": MAX_TOKENS, "stream": True,
        "messages": [{"role": "user", "content": PROMPT}]})
    assert proxied.status_code == chatted.status_code == streamed.status_code == 200, (proxied.text, chatted.text)
    for response in (proxied, chatted, streamed):
        row = gw.fetch_row(response.headers["x-request-id"])
        assert (row["tokens_out"], _cost(row)) == (MAX_TOKENS, CALL_USD), row


# --- 1. a monthly opus rule for one leader's organisation, created after the spend -----------------


def test_a_rule_created_after_the_spend_blocks_the_organisations_next_call(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """Four calls each ($0.012) by two people in a leader's organisation (one a report's report) and
    by an outsider; then a monthly $0.01 block on tag `opus` for that organisation: both members'
    next opus call, on either opus model, is 429 budget_exceeded naming the rule (OpenAI's shape on
    /v1/chat/completions); an untagged model, the outsider and the leader (below the cap) get 200."""
    opus, opus_too, other = (_model(gw, testserve, ["opus"]), _model(gw, testserve, ["opus", "frontier"]),
                             _model(gw, testserve, ["sonnet"]))
    leader = _user(gw)
    member = _user(gw, manager_email=leader["email"])
    deeper = _user(gw, manager_email=member["email"])
    outsider = _user(gw)
    _grant(gw, [leader, member, deeper, outsider], [opus, opus_too, other])
    for person in (member, deeper, outsider):
        _spend(gw, person, opus, 4)
    _spend(gw, leader, other, 5)  # outside the scope: it must not count

    rule_id = _rule(gw, _entry({"tag": "opus"}, "0.01", [{"type": "block"}], leaders=[leader["id"]]),
                    prefix="opus-monthly")
    _rule_loaded(gw, member, rule_id)

    for person in (member, deeper):
        for model in (opus, opus_too):
            refused = _proxy(gw, person, model)
            assert refused.status_code == 429, refused.text
            body = refused.json()
            assert (body["error"], body["rule"], body["cap"], body["resume_at"]) == (
                "budget_exceeded", rule_id, 0.01, _month_end()), body
            assert refused.headers["x-should-retry"] == "false"
            assert int(refused.headers["retry-after"]) >= 1
            assert refused.headers["x-meshfast-limit"] == f"rule:{rule_id}"
        chat = _chat(gw, person, opus)
        assert chat.status_code == 429 and chat.json()["error"]["code"] == "budget_exceeded", chat.text
        assert chat.headers["x-should-retry"] == "false"
        messages = gw.client.post("/v1/messages", headers=_auth(person), json={
            "model": opus["name"], "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": PROMPT}]})
        assert messages.status_code == 429, messages.text
        assert (messages.json()["type"], messages.json()["error"]["type"]) == ("error", "budget_exceeded")
        assert _proxy(gw, person, other).status_code == 200, "an untagged model is not in the rule's scope"
    row = gw.fetch_row(refused.headers["x-request-id"])
    assert (row["outcome"], row["deny_reason"], row["status_code"]) == ("denied", "budget_exceeded", 429)

    assert _proxy(gw, outsider, opus).status_code == 200, "outside the organisation"
    assert rule_id not in _usage_rules(gw, outsider)
    allowed = _proxy(gw, leader, opus)
    assert allowed.status_code == 200, "the leader is in the organisation but below the cap"
    # The leader's call: 0 committed + its own $0.003 reservation of $0.01.
    assert (allowed.headers["x-meshfast-limit"], allowed.headers["x-meshfast-utilization"]) == (
        f"rule:{rule_id}", "30")
    shown = _usage_rules(gw, member)[rule_id]
    assert (shown["scope"], shown["window"], shown["status"], shown["utilization"]) == (
        {"tag": "opus"}, "monthly", "blocked", 1.2), shown
    assert Decimal(str(shown["spend_usd"])) == 4 * CALL_USD and shown["reset_at"] == _month_end()


def test_windows_end_at_midnights_of_the_calendar_zone(gw: Gateway, testserve: EmulatedProviders) -> None:
    """Daily, weekly and monthly entries report reset_at at the next local midnight, Monday and
    first of the month in MESHFAST_CALENDAR_TZ (UTC+05:30 here), and a block's resume_at is its
    window's end."""
    tag = f"tz-{_tag()}"
    model = _model(gw, testserve, [tag])
    person = _user(gw)
    _grant(gw, [person], [model])
    _spend(gw, person, model, 2)
    rule_id = _rule(gw, *(_entry({"tag": tag}, "1", [{"type": "warn", "text": window}], window=window)
                          for window in ("daily", "weekly", "monthly")), prefix="tz")
    daily_block = _rule(gw, _entry({"tag": tag}, CALL_USD, [{"type": "block"}], window="daily"), prefix="tz-day")
    _rule_loaded(gw, person, daily_block)
    shown = [r for r in gw.client.get("/v1/usage", headers=_auth(person)).json()["rules"] if r["id"] == rule_id]
    assert [(r["window"], r["reset_at"]) for r in shown] == [
        (window, _window_end(window)) for window in ("daily", "weekly", "monthly")], shown
    refused = _proxy(gw, person, model)
    assert (refused.status_code, refused.json()["resume_at"]) == (429, _window_end("daily")), refused.text


# --- 2. a reorg moves people in and out within a second ---------------------------------------------


def test_a_reorg_moves_a_person_into_and_out_of_a_rule_on_every_worker_within_a_second(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A person over a leader-scoped cap answers 200 while reporting elsewhere; made a report of
    the leader's report, every worker refuses them within 1 s; when their manager leaves the
    leader's organisation, every worker lets them through again within 1 s."""
    tag = f"reorg-{_tag()}"
    model = _model(gw, testserve, [tag])
    leader, middle, person = _user(gw), _user(gw), _user(gw)
    assert _put_with_etag(gw, f"/admin/users/{middle['id']}", {"manager_id": leader["id"]}).status_code == 200
    _grant(gw, [leader, person], [model])
    _spend(gw, person, model, 2)
    rule_id = _rule(gw, _entry({"tag": tag}, "0.003", [{"type": "block"}], leaders=[leader["id"]]), prefix="reorg")
    _rule_loaded(gw, leader, rule_id)
    assert _proxy(gw, person, model).status_code == 200, "not in the organisation yet"

    with _workers(gw) as workers:
        def refused(answer: tuple[int, dict[str, str], bytes]) -> bool:
            return answer[0] == 429 and json.loads(answer[2]).get("rule") == rule_id

        moved = _put_with_etag(gw, f"/admin/users/{person['id']}", {"manager_id": middle["id"]})
        assert moved.status_code == 200, moved.text
        took = _on_every_worker(workers, lambda: workers.proxy_all(person, model), refused)
        assert took <= PROPAGATION_S

        # The middle manager leaves: their whole line (the person included) is outside the rule.
        left = _put_with_etag(gw, f"/admin/users/{middle['id']}", {"manager_id": None})
        assert left.status_code == 200, left.text
        took = _on_every_worker(workers, lambda: workers.proxy_all(person, model), lambda a: a[0] == 200)
        assert took <= PROPAGATION_S


def test_tier_and_business_unit_changes_move_a_person_by_and_across_kinds_and_or_within_a_list(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A rule for tier gold AND business unit u1 or u2, one gold person of u1 exempt: a person of u1
    at tier normal is outside it; made gold, every worker refuses them within 1 s; moved to another
    unit they are outside again, moved to u2 inside; the exempt person is never refused."""
    tag, u1, u2 = f"pop-{_tag()}", f"u1-{_tag()}", f"u2-{_tag()}"
    model = _model(gw, testserve, [tag])
    person = _user(gw, business_unit=u1, tier="normal")
    exempt = _user(gw, business_unit=u1, tier="gold")
    _grant(gw, [person, exempt], [model])
    _spend(gw, person, model, 2)
    _spend(gw, exempt, model, 2)
    rule_id = _rule(gw, _entry({"tag": tag}, CALL_USD, [{"type": "block"}], tiers=["gold"], business_units=[u1, u2],
                               exempt_users=[exempt["id"]]), prefix="pop")
    time.sleep(PROPAGATION_S)  # nobody the rule covers yet to watch it load through
    path = f"/admin/users/{person['id']}"

    def refused(answer: tuple[int, dict[str, str], bytes]) -> bool:
        return answer[0] == 429 and json.loads(answer[2]).get("rule") == rule_id

    with _workers(gw) as workers:
        assert all(a[0] == 200 for a in workers.proxy_all(person, model).values()), "tier normal: not covered"
        for change, inside in (({"tier": "gold"}, True), ({"business_unit": f"u3-{_tag()}"}, False),
                               ({"business_unit": u2}, True)):
            assert _put_with_etag(gw, path, change).status_code == 200
            took = _on_every_worker(workers, lambda: workers.proxy_all(person, model),
                                    refused if inside else (lambda a: a[0] == 200))
            assert took <= PROPAGATION_S, change
        assert all(a[0] == 200 for a in workers.proxy_all(exempt, model).values()), "the exempt are never matched"
    assert rule_id not in _usage_rules(gw, exempt)


# --- 3. no overshoot under 4x oversubscription -------------------------------------------------------


def test_four_times_oversubscription_never_overshoots_across_models_and_workers(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A block entry whose threshold fits 10 calls' worst cases; 40 concurrent calls over two
    workers, split between two models of the scope: recorded spend in scope stays at or under the
    threshold and the rest are refused naming the rule; topping up one call at a time then fills
    the cap to within one call and never past it. The rows, /v1/usage and the refusals agree, and
    the entry's notify fires once however many calls were refused."""
    tag = f"over-{_tag()}"
    first, second = _model(gw, testserve, [tag]), _model(gw, testserve, [tag])
    person = _user(gw)
    _grant(gw, [person], [first, second])
    threshold = 10 * CALL_USD
    rule_id = _rule(gw, _entry({"tag": tag}, threshold, [{"type": "notify", "channels": ["webhook"]}, {"type": "block"}],
                               window="daily"), prefix="over")
    _rule_loaded(gw, person, rule_id)

    # Each answer streams for ~60 ms, so the admitted calls overlap and hold their reservations together.
    testserve.client.delete("/_debug/requests")
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 20})
    try:
        responses = asyncio.run(_burst(gw, [(person, first if i % 2 else second) for i in range(40)],
                                       concurrency=40))
    finally:
        testserve.client.post("/_debug/config", json={"delta_delay_ms": 0})
    assert testserve.client.get("/_debug/stats").json()["peak_in_flight"] >= 2, "the calls ran concurrently"
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert 1 <= len(ok) <= 10 and len(ok) + len(refused) == 40, [r.status_code for r in responses]
    for response in refused:
        assert (response.status_code, response.json()["error"], response.json()["rule"]) == (
            429, "budget_exceeded", rule_id), response.text

    topped_up = 0
    while (response := _proxy(gw, person, first if topped_up % 2 else second)).status_code == 200:
        topped_up += 1
        assert topped_up <= 10
    assert response.status_code == 429 and response.json()["rule"] == rule_id
    admitted = len(ok) + topped_up
    assert admitted == 10, f"{len(ok)} in the burst + {topped_up} after: the cap fits exactly 10"

    rows = _rows_of(gw, person, at_least=40 + topped_up + 1)
    spent = sum((_cost(r) for r in rows if r["status_code"] == 200), Decimal(0))
    assert sum(1 for r in rows if r["status_code"] == 200) == admitted
    assert threshold - CALL_USD < spent <= threshold, spent
    shown = _usage_rules(gw, person)[rule_id]
    assert Decimal(str(shown["spend_usd"])) == spent and shown["status"] == "blocked", shown
    # Refusals at the cap are the crossing: one notify event for the person and window, not one per refusal.
    events = _db(gw, "SELECT action, channel FROM rule_events WHERE rule_id = $1", rule_id)
    assert events == [{"action": "notify", "channel": "webhook"}], events


# --- precedence and composition -----------------------------------------------------------------------


def _policy(gw: Gateway, person: Json, model: Json, daily_cap_usd: str) -> None:
    policy = {"daily_cap_usd": daily_cap_usd, "max_calls_per_hour": None, "allowed_from": None, "allowed_to": None,
              "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": True}
    response = gw.admin("PUT", f"/admin/users/{person['id']}/policies/{model['id']}", policy)
    assert response.status_code == 200, response.text


def test_the_heaviest_blocking_rule_names_the_refusal_and_a_users_policy_comes_first(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """Two block rules over their caps (weights 30 on the model and 20 on its tag): the refusal
    names the heavier; deleted, the other one refuses. A per-user daily cap that the call does not
    fit refuses first, as the policy's budget_exceeded without a rule."""
    tag = f"prec-{_tag()}"
    model = _model(gw, testserve, [tag])
    person = _user(gw)
    _grant(gw, [person], [model])
    _spend(gw, person, model, 3)
    light = _rule(gw, _entry({"tag": tag}, 2 * CALL_USD, [{"type": "block"}]), weight=20, prefix="light")
    heavy = _rule(gw, _entry({"model": model["name"]}, CALL_USD, [{"type": "block"}]), weight=30, prefix="heavy")
    _rule_loaded(gw, person, heavy)
    refused = _proxy(gw, person, model)
    assert (refused.status_code, refused.json()["rule"], refused.json()["cap"]) == (429, heavy, float(CALL_USD))

    assert gw.admin("DELETE", f"/admin/rules/{heavy}").status_code == 200
    with _workers(gw) as workers:
        _on_every_worker(workers, lambda: workers.proxy_all(person, model),
                         lambda a: a[0] == 429 and json.loads(a[2])["rule"] == light)

    _policy(gw, person, model, str(3 * CALL_USD))
    with _workers(gw) as workers:
        _on_every_worker(workers, lambda: workers.proxy_all(person, model),
                         lambda a: a[0] == 429 and "rule" not in json.loads(a[2]))
    policy = _proxy(gw, person, model).json()
    assert (policy["error"], policy["cap"]) == ("budget_exceeded", float(3 * CALL_USD)), policy


# --- 4. shadow mode ---------------------------------------------------------------------------------


def _count_would_deny(gw: Gateway, person: Json, rule_id: str) -> int:
    [row] = _db(gw, "SELECT count(*) FILTER (WHERE would_deny = $2) AS marked, count(*) AS rows "
                    "FROM request_logs WHERE user_id = $1::uuid", person["id"], rule_id)
    return row["marked"]


def test_a_shadow_rule_denies_nothing_yet_reports_utilization_and_marks_rows(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """SHADOW_CALLS calls (10,000 with RULES_SHADOW_CALLS=10000) against a shadow block capped at
    ten calls' worth: every call answers 200; /v1/usage shows the rule as shadow, would_block, with
    utilization far over 1; every row past the cap names the rule in would_deny (seen through
    /admin/logs too); the status headers name the rule as the governing limit."""
    tag = f"shadow-{_tag()}"
    model = _model(gw, testserve, [tag])
    person = _user(gw)
    _grant(gw, [person], [model])
    _policy(gw, person, model, "1000")  # the grant's default $20 a day would stop 10,000 calls at 6,666
    rule_id = _rule(gw, _entry({"tag": tag}, 10 * CALL_USD, [{"type": "block"}], window="daily"),
                    mode="shadow", prefix="shadow")
    _rule_loaded(gw, person, rule_id)

    started = time.monotonic()
    responses = asyncio.run(_burst(gw, [(person, model)] * SHADOW_CALLS, concurrency=32))
    took = time.monotonic() - started
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == SHADOW_CALLS, ({s: statuses.count(s) for s in set(statuses)},
                                                 [r.text for r in responses if r.status_code != 200][:3])
    print(f"{SHADOW_CALLS} shadow calls in {took:.1f} s")

    shown = _usage_rules(gw, person)[rule_id]
    assert (shown["mode"], shown["status"]) == ("shadow", "would_block"), shown
    assert shown["utilization"] == pytest.approx(SHADOW_CALLS / 10), shown
    assert Decimal(str(shown["spend_usd"])) == SHADOW_CALLS * CALL_USD

    last = _proxy(gw, person, model)
    assert last.status_code == 200
    assert last.headers["x-meshfast-limit"] == f"rule:{rule_id}"
    assert float(last.headers["x-meshfast-utilization"]) > 100

    rows = _rows_of(gw, person, at_least=SHADOW_CALLS + 1, timeout_s=30)
    assert all(r["outcome"] != "denied" for r in rows)
    marked = _count_would_deny(gw, person, rule_id)
    # A shadow entry reserves nothing, so it judges by committed spend: the first ten fit, and up
    # to 31 more may pass unmarked while the calls before them (32 at a time) are still in flight.
    assert SHADOW_CALLS + 1 - 10 - 31 <= marked <= SHADOW_CALLS + 1 - 10, marked
    logged = gw.admin("GET", f"/admin/logs?user_id={person['id']}&page_size=5")
    assert logged.status_code == 200, logged.text
    assert [e["would_deny"] for e in logged.json()["logs"]] == [rule_id] * 5, logged.json()["logs"]


def test_the_global_switch_turns_inherit_rules_into_shadow_and_back(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """With enforcement off, an inherit rule over its cap lets calls through and marks the rows;
    an enforce rule still blocks; switched on again, the inherit rule blocks."""
    tag = f"switch-{_tag()}"
    model, strict = _model(gw, testserve, [tag]), _model(gw, testserve)
    person = _user(gw)
    _grant(gw, [person], [model, strict])
    _spend(gw, person, model, 2)
    _spend(gw, person, strict, 2)
    rule_id = _rule(gw, _entry({"tag": tag}, CALL_USD, [{"type": "block"}]), mode="inherit", prefix="inherit")
    strict_id = _rule(gw, _entry({"model": strict["name"]}, CALL_USD, [{"type": "block"}]), prefix="strict")
    _rule_loaded(gw, person, strict_id)
    try:
        assert gw.admin("PUT", "/admin/enforcement", {"enforce": False}).json() == {"enforce": False}
        with _workers(gw) as workers:
            _on_every_worker(workers, lambda: workers.get_all("/v1/usage", _auth(person)),
                             lambda a: {r["id"]: r["mode"] for r in json.loads(a[1])["rules"]}[rule_id] == "shadow")
        passed = _proxy(gw, person, model)
        assert passed.status_code == 200, passed.text
        assert gw.fetch_row(passed.headers["x-request-id"])["would_deny"] == rule_id
        still = _proxy(gw, person, strict)
        assert (still.status_code, still.json()["rule"]) == (429, strict_id), "an enforce rule ignores the switch"
    finally:
        assert gw.admin("PUT", "/admin/enforcement", {"enforce": True}).json() == {"enforce": True}
    with _workers(gw) as workers:
        _on_every_worker(workers, lambda: workers.proxy_all(person, model),
                         lambda a: a[0] == 429 and json.loads(a[2])["rule"] == rule_id)


# --- 5. dry-run lists exactly the people enforcing then blocks ---------------------------------------


def test_a_dry_run_lists_exactly_the_people_that_enforcing_then_blocks(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """Six people in one business unit: three well over a draft's daily threshold, three well
    under (and one over it but outside the unit). The dry-run lists exactly the three, with spend,
    threshold and utilization; stored and enforcing, the rule refuses exactly those three and lets
    the others call."""
    unit = f"bu-{_tag()}"
    tag = f"dry-{_tag()}"
    model = _model(gw, testserve, [tag])
    over = [_user(gw, business_unit=unit) for _ in range(3)]
    under = [_user(gw, business_unit=unit) for _ in range(3)]
    elsewhere = _user(gw, business_unit=f"other-{unit}")
    everyone = [*over, *under, elsewhere]
    _grant(gw, everyone, [model])
    for person in (*over, elsewhere):
        _spend(gw, person, model, 5)
    for person in under:
        _spend(gw, person, model, 1)

    draft = {"id": f"dry-{_tag()}", "weight": 10, "mode": "enforce", "entries": [
        _entry({"tag": tag}, 3 * CALL_USD, [{"type": "warn", "text": "near"}, {"type": "block"}], window="daily",
               business_units=[unit])]}
    answer = gw.admin("POST", "/admin/rules/dry-run", draft)
    assert answer.status_code == 200, answer.text
    affected = answer.json()["affected"]
    assert sorted(a["user_id"] for a in affected) == sorted(p["id"] for p in over), affected
    for item in affected:
        assert (item["entry"], item["action"], item["spend_usd"], item["threshold_usd"]) == (
            0, "block", float(5 * CALL_USD), float(3 * CALL_USD)), item
        assert item["utilization"] == pytest.approx(5 / 3, abs=1e-6)
    assert gw.admin("GET", f"/admin/rules/{draft['id']}").status_code == 404, "a dry-run stores nothing"

    created = gw.admin("POST", "/admin/rules", draft)
    assert created.status_code == 201, created.text
    _rule_loaded(gw, over[0], draft["id"])
    blocked = {p["id"] for p in everyone if (r := _proxy(gw, p, model)).status_code == 429
               and r.json()["rule"] == draft["id"]}
    assert blocked == {a["user_id"] for a in affected}
    assert all(_proxy(gw, p, model).status_code == 200 for p in (*under, elsewhere))


# --- 6. one notification per crossing ----------------------------------------------------------------


def _configure_webhook(gw: Gateway, receiver: Receiver) -> None:
    response = gw.admin("PUT", "/admin/notifications", {"webhook_url": receiver.url, "webhook_local": True,
                                                        "webhook_secret": "whsec-" + _tag()})
    assert response.status_code == 200, response.text


def _notified(gw: Gateway, receiver: Receiver, rule_id: str, person: Json) -> tuple[list[Json], list[Json]]:
    """What the receiver got for (rule, person), and the outbox's notify rows for them."""
    payloads = receiver.payloads(lambda p: p.get("rule_id") == rule_id and p.get("user_id") == person["id"])
    outbox = _db(gw, "SELECT status, delivery_id::text AS delivery_id, threshold_nano FROM rule_events "
                     "WHERE rule_id = $1 AND user_id = $2::uuid AND action = 'notify'", rule_id, person["id"])
    return payloads, outbox


def test_two_hundred_concurrent_calls_crossing_a_threshold_notify_once_even_across_a_restart(
        gw: Gateway, testserve: EmulatedProviders, receiver: Receiver) -> None:
    """200 concurrent calls, the 100th of which crosses a notify threshold: the webhook receives
    exactly one delivery for the rule, person and window, naming them; after a gateway restart the
    spend in scope is still there, and 20 more calls over the threshold deliver nothing new."""
    _configure_webhook(gw, receiver)
    tag = f"notify-{_tag()}"
    model = _model(gw, testserve, [tag])
    person = _user(gw, business_unit="research")
    _grant(gw, [person], [model])
    threshold = 100 * CALL_USD
    rule_id = _rule(gw, _entry({"tag": tag}, threshold, [{"type": "notify", "channels": ["webhook"]}]),
                    prefix="notify")
    _rule_loaded(gw, person, rule_id)

    responses = asyncio.run(_burst(gw, [(person, model)] * 200, concurrency=200))
    assert [r.status_code for r in responses] == [200] * 200
    until(lambda: (got := _notified(gw, receiver, rule_id, person))[0] and got[1][0]["status"] == "delivered",
           15, "the delivery")
    time.sleep(1.5)  # several more outbox polls
    payloads, outbox = _notified(gw, receiver, rule_id, person)
    assert len(payloads) == 1 and len(outbox) == 1, (payloads, outbox)
    [payload] = payloads
    assert (payload["rule_id"], payload["user_id"], payload["email"], payload["business_unit"], payload["window"],
            payload["action"], payload["delivery_id"]) == (
        rule_id, person["id"], person["email"], "research", "monthly", "notify", outbox[0]["delivery_id"]), payload
    assert Decimal(str(payload["threshold_usd"])) == threshold
    assert Decimal(str(payload["spend_usd"])) >= threshold and payload["utilization"] >= 1.0
    listed = gw.admin("GET", f"/admin/notifications/deliveries?rule_id={rule_id}").json()["deliveries"]
    assert [(d["user_id"], d["channel"], d["status"]) for d in listed] == [(person["id"], "webhook", "delivered")]

    gw.stop()
    gw.start()
    shown = _usage_rules(gw, person)[rule_id]
    assert Decimal(str(shown["spend_usd"])) == 200 * CALL_USD, "committed spend survives the restart"
    assert shown["status"] == "warning", shown
    responses = asyncio.run(_burst(gw, [(person, model)] * 20, concurrency=20))
    assert [r.status_code for r in responses] == [200] * 20
    time.sleep(2.0)  # the calls' rows are written and the outbox polled many times
    payloads, outbox = _notified(gw, receiver, rule_id, person)
    assert len(payloads) == 1 and len(outbox) == 1, (payloads, outbox)


def test_blocks_and_pauses_survive_a_restart_right_after_the_spend(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A person blocked by a rule and another paused by one, the gateway stopped at once after their
    last calls and started again: the first is still refused at the cap, the second still paused
    until the same moment, and /v1/usage shows the spend recorded before the stop."""
    tag = f"keep-{_tag()}"
    model = _model(gw, testserve, [tag])
    blocked, paused = _user(gw), _user(gw)
    _grant(gw, [blocked, paused], [model])
    block_id = _rule(gw, _entry({"tag": tag}, 2 * CALL_USD, [{"type": "block"}], exempt_users=[paused["id"]]),
                     prefix="keep-block")
    pause_id = _rule(gw, _entry({"tag": tag}, 2 * CALL_USD, [{"type": "pause", "hours": 2}],
                                exempt_users=[blocked["id"]]), prefix="keep-pause")
    _rule_loaded(gw, blocked, block_id)
    _spend(gw, blocked, model, 2)
    _spend(gw, paused, model, 2)
    first = _proxy(gw, blocked, model)
    assert (first.status_code, first.json()["rule"]) == (429, block_id), first.text
    pause = _proxy(gw, paused, model)
    assert (pause.status_code, pause.json()["rule"]) == (429, pause_id), pause.text

    gw.stop()
    gw.start()
    for person, rule_id in ((blocked, block_id), (paused, pause_id)):
        shown = _usage_rules(gw, person)[rule_id]
        assert Decimal(str(shown["spend_usd"])) == 2 * CALL_USD, (person["email"], shown)
    again = _proxy(gw, blocked, model)
    assert (again.status_code, again.json().get("rule")) == (429, block_id), again.text
    still = _proxy(gw, paused, model)
    assert (still.status_code, still.json().get("error"), still.json().get("resume_at")) == (
        429, "paused", pause.json()["resume_at"]), still.text
    assert _usage_rules(gw, paused)[pause_id]["status"] == "paused"


# --- 7. warn, pause and per-minute caps ---------------------------------------------------------------


def test_a_warn_action_adds_the_warning_header_once_the_threshold_is_reached(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """Below the threshold no X-Meshfast-Warning; from the call that finds spend at the threshold
    on, every answer carries the rule's text, and /v1/usage says "warning"."""
    tag = f"warn-{_tag()}"
    model = _model(gw, testserve, [tag])
    person = _user(gw)
    _grant(gw, [person], [model])
    text = "You have used your monthly frontier allowance"
    rule_id = _rule(gw, _entry({"tag": tag}, 2 * CALL_USD, [{"type": "warn", "text": text}]), prefix="warn")
    _rule_loaded(gw, person, rule_id)
    first = _proxy(gw, person, model)
    assert _usage_rules(gw, person)[rule_id]["status"] == "ok"
    second = _proxy(gw, person, model)  # decided at $0.003 of $0.006: the spend reaches the threshold after
    assert first.status_code == second.status_code == 200
    assert "x-meshfast-warning" not in first.headers and "x-meshfast-warning" not in second.headers
    assert _usage_rules(gw, person)[rule_id]["status"] == "warning"
    for route in (_proxy, _chat, _proxy):
        warned = route(gw, person, model)
        assert warned.status_code == 200, warned.text
        assert warned.headers["x-meshfast-warning"] == text
        assert warned.headers["x-meshfast-limit"] == f"rule:{rule_id}"
    assert _usage_rules(gw, person)[rule_id]["status"] == "warning"


def test_a_pause_refuses_calls_until_its_hours_are_over(gw: Gateway, testserve: EmulatedProviders) -> None:
    """A 1-hour pause at two calls' spend: the third call finds the threshold reached and is 429
    paused with resume_at an hour on (Retry-After to match); the next call is paused until the same
    moment; /v1/usage says "paused" with that resume_at; the outbox records one pause."""
    tag = f"pause-{_tag()}"
    model = _model(gw, testserve, [tag])
    person = _user(gw)
    _grant(gw, [person], [model])
    rule_id = _rule(gw, _entry({"tag": tag}, 2 * CALL_USD, [{"type": "pause", "hours": 1}]), prefix="pause")
    _rule_loaded(gw, person, rule_id)
    _spend(gw, person, model, 2)

    before = dt.datetime.now(dt.UTC)
    paused = _proxy(gw, person, model)
    after = dt.datetime.now(dt.UTC)
    assert paused.status_code == 429, paused.text
    body = paused.json()
    assert (body["error"], body["rule"]) == ("paused", rule_id), body
    resume_at = dt.datetime.fromisoformat(body["resume_at"].replace("Z", "+00:00"))
    hour = dt.timedelta(hours=1)
    assert before + hour - dt.timedelta(seconds=1) <= resume_at <= after + hour + dt.timedelta(seconds=1), body
    assert 3590 <= int(paused.headers["retry-after"]) <= 3601

    with _workers(gw) as workers:
        for status, _, raw in workers.proxy_all(person, model).values():
            again = json.loads(raw)
            assert (status, again["error"], again["resume_at"]) == (429, "paused", body["resume_at"]), again
    chat = _chat(gw, person, model)
    assert chat.status_code == 429 and chat.json()["error"]["code"] == "paused", chat.text
    shown = _usage_rules(gw, person)[rule_id]
    assert (shown["status"], shown["resume_at"]) == ("paused", body["resume_at"]), shown
    assert Decimal(str(shown["spend_usd"])) == 2 * CALL_USD, "paused calls cost nothing"
    pauses = until(lambda: _db(gw, "SELECT spend_nano, threshold_nano FROM rule_events WHERE rule_id = $1 "
                                    "AND user_id = $2::uuid AND action = 'pause'", rule_id, person["id"]),
                    10, "the pause in the outbox")
    assert pauses == [{"spend_nano": 2 * 3_000_000, "threshold_nano": 2 * 3_000_000}]


def test_a_calls_per_minute_cap_refuses_the_fourth_call_in_a_minute_on_any_worker(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """calls_per_minute 3 on a model: three calls over both workers answer 200, the fourth is 429
    rate_limited naming the rule with a Retry-After; another person is not limited by it."""
    model = _model(gw, testserve)
    person, other = _user(gw), _user(gw)
    _grant(gw, [person, other], [model])
    rule_id = _rule(gw, {"scope": {"model": model["name"]}, "calls_per_minute": 3}, prefix="rate")
    time.sleep(PROPAGATION_S)  # no threshold: /v1/usage does not list a calls-only entry
    with _workers(gw) as workers:
        answers = [a for _ in range(2) for a in workers.proxy_all(person, model).values()]
    assert [status for status, _, _ in answers] == [200, 200, 200, 429], "three calls over both workers, then 429"
    status, headers, raw = answers[3]
    assert (json.loads(raw)["error"], json.loads(raw)["rule"]) == ("rate_limited", rule_id), raw
    assert 1 <= int(headers["retry-after"]) <= 60 and json.loads(raw)["resume_at"]
    chat = _chat(gw, person, model)
    assert chat.status_code == 429 and chat.json()["error"]["code"] == "rate_limited", chat.text
    assert [_proxy(gw, other, model).status_code for _ in range(3)] == [200, 200, 200]


# --- 8. model restrictions ---------------------------------------------------------------------------


def test_restrictions_refuse_like_an_ungranted_model_on_both_route_shapes_and_rows_say_why(
        gw: Gateway, testserve: EmulatedProviders) -> None:
    """A model denied to a leader's organisation (one report exempt) and closed to a business unit:
    the refused get 403 model_not_permitted on /v1/proxy and 404 model_not_found on
    /v1/chat/completions (the same answers as a model never granted), rows saying
    model_restricted_by_leader or _by_business_unit; the exempt and outsiders get 200."""
    model = _model(gw, testserve)
    ungranted = _model(gw, testserve)
    leader = _user(gw)
    report = _user(gw, manager_email=leader["email"])
    exempt = _user(gw, manager_email=leader["email"])
    legal = _user(gw, business_unit="legal")
    outsider = _user(gw, business_unit="payments")
    _grant(gw, [leader, report, exempt, legal, outsider], [model])
    restricted = _put_with_etag(gw, f"/admin/models/{model['id']}", {"restrictions": {
        "leader_deny": [leader["id"]], "exempt": [exempt["id"]], "business_units_closed": ["legal"]}})
    assert restricted.status_code == 200, restricted.text

    with _workers(gw) as workers:
        _on_every_worker(workers, lambda: workers.proxy_all(report, model), lambda a: a[0] == 403)
    for person, reason in ((leader, "model_restricted_by_leader"), (report, "model_restricted_by_leader"),
                           (legal, "model_restricted_by_business_unit")):
        proxied = _proxy(gw, person, model)
        never = _proxy(gw, person, ungranted)
        assert (proxied.status_code, proxied.json()) == (never.status_code, never.json()) == (
            403, {"error": "model_not_permitted"})
        chatted = _chat(gw, person, model)
        unknown = _chat(gw, person, ungranted)
        assert chatted.status_code == unknown.status_code == 404
        assert chatted.json() == unknown.json() and chatted.json()["error"]["code"] == "model_not_found"
        for response in (proxied, chatted):
            row = gw.fetch_row(response.headers["x-request-id"])
            assert (row["outcome"], row["deny_reason"], row["status_code"]) == (
                "denied", reason, response.status_code), row
        # Listed like a model never granted: not at all.
        listed = gw.client.get("/v1/models", headers=_auth(person)).json()
        assert model["name"] not in [m["id"] for m in listed["data"]], listed
        usage = gw.client.get("/v1/usage", headers=_auth(person)).json()
        assert model["name"] not in [u["model"] for u in usage["usage"]], usage
    for person in (exempt, outsider):
        assert _proxy(gw, person, model).status_code == 200
        assert _chat(gw, person, model).status_code == 200
        listed = gw.client.get("/v1/models", headers=_auth(person)).json()
        assert model["name"] in [m["id"] for m in listed["data"]], listed

    cleared = _put_with_etag(gw, f"/admin/models/{model['id']}", {"restrictions": None})
    assert cleared.status_code == 200, cleared.text
    with _workers(gw) as workers:
        _on_every_worker(workers, lambda: workers.proxy_all(report, model), lambda a: a[0] == 200)
