"""Notification delivery for spend rules (issue 14, item 5): the channels through
`/admin/notifications` (secrets sealed, never answered, logged or audited; SSRF refused), and the
leader's delivery of the `rule_events` outbox: a signed webhook with its delivery id, retries with
backoff, at least once across a restart, email through SMTP from the rule's template, and one
leadership digest per leader. Real `meshfast serve` workers and PostgreSQL, a real HTTP receiver
and a real SMTP server (aiosmtpd); outbox rows are inserted as the telemetry ingest inserts them."""

from __future__ import annotations

import asyncio
import datetime as dt
import email
import email.policy
import hashlib
import hmac
import json
import secrets
import threading
import time
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from conftest import SESSION_ENV, Gateway, free_port, running_gateway, until
from conftest import tag as _tag
from hypothesis import given
from hypothesis import strategies as st

from meshfast import notify

# Fast loops: the outbox polled five times a second, retries from 0.3 s, digests checked twice a second.
NOTIFY_ENV = {
    **SESSION_ENV,
    "MESHFAST_NOTIFY_POLL_S": "0.2",
    "MESHFAST_NOTIFY_BACKOFF_S": "0.3",
    "MESHFAST_NOTIFY_DIGEST_S": "0.5",
    "MESHFAST_NOTIFY_TIMEOUT_S": "3",
}
SMTP_USER, SMTP_PASSWORD = "mailer", "smtp-pass-" + secrets.token_hex(8)
# The sink takes AUTH on a plain connection (a test on loopback); aiosmtpd warns about it.
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")




# --- the receivers --------------------------------------------------------------------------


class Receiver:
    """A webhook receiver: records every POST; answers 500 to a delivery id as often as told."""

    def __init__(self, port: int | None = None) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.received_at: dict[str, list[float]] = {}
        self.fail: dict[str, int] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                delivery = headers.get("x-meshfast-delivery", "")
                with receiver._lock:
                    receiver.received.append((headers, body))
                    receiver.received_at.setdefault(delivery, []).append(time.monotonic())
                    failing = receiver.fail.get(delivery, 0) > 0
                    if failing:
                        receiver.fail[delivery] -= 1
                self.send_response(500 if failing else 204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port or 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/meshfast"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def deliveries(self, delivery_id: str) -> list[tuple[dict[str, str], bytes]]:
        with self._lock:
            return [(h, b) for h, b in self.received if h.get("x-meshfast-delivery") == delivery_id]

    def payloads(self, predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(b) for _, b in self.received if predicate(json.loads(b))]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MailSink:
    """An SMTP server that takes mail after AUTH with the test's login, and keeps it."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []
        self.logins: list[tuple[bytes, bytes]] = []
        sink = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
                message = email.message_from_bytes(envelope.content, policy=email.policy.default)
                sink.messages.append(message)  # type: ignore[arg-type]
                return "250 OK"

        def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
            ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
                SMTP_USER.encode(), SMTP_PASSWORD.encode())
            if isinstance(data, LoginPassword):
                sink.logins.append((data.login, data.password))
            return AuthResult(success=ok)

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, authenticator=authenticate,
                                     auth_required=True, auth_require_tls=False)
        self.controller.start()

    def to(self, address: str) -> list[email.message.EmailMessage]:
        return [m for m in self.messages if m["To"] == address]

    def close(self) -> None:
        self.controller.stop()


def _until(check: Any, timeout_s: float = 15.0, what: str = "condition") -> Any:
    """Deliveries take a poll or two of the leader: a longer default wait."""
    return until(check, timeout_s, what)


# --- fixtures and helpers -------------------------------------------------------------------




@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_gateway(2, env=NOTIFY_ENV) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture(scope="module")
def sink() -> Iterator[MailSink]:
    server = MailSink()
    yield server
    server.close()


WEBHOOK_SECRET = "whsec-" + secrets.token_hex(16)


def _configure(gw: Gateway, receiver: Receiver | None, sink: MailSink | None) -> dict[str, Any]:
    body: dict[str, Any] = {"webhook_url": None, "webhook_secret": None, "smtp": None}
    if receiver is not None:
        body.update(webhook_url=receiver.url, webhook_secret=WEBHOOK_SECRET, webhook_local=True)
    if sink is not None:
        body["smtp"] = {"host": "127.0.0.1", "port": sink.port, "from": "meshfast@example.com",
                        "username": SMTP_USER, "password": SMTP_PASSWORD}
    response = gw.admin("PUT", "/admin/notifications", body)
    assert response.status_code == 200, response.text
    return response.json()


def _db(gw: Gateway, query: str, *args: Any) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(gw.database_url)
        try:
            return [dict(r) for r in await conn.fetch(query, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


def _today() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


_INSERT_EVENT = """
INSERT INTO rule_events (delivery_id, rule_id, entry, user_id, action, channel, "window", window_start,
                         threshold_nano, spend_nano, detail)
VALUES ($1, $2, 0, $3, 'notify', $4, $5, $6, $7, $8, $9::jsonb)
ON CONFLICT DO NOTHING RETURNING *"""


def _spec(user_id: str, channel: str, *, rule_id: str | None = None, window: str = "daily",
          window_start: dt.datetime | None = None, threshold_usd: float = 100.0, spend_usd: float = 91.5,
          detail: dict[str, Any] | None = None, delivery_id: uuid.UUID | None = None) -> tuple[Any, ...]:
    return (delivery_id or uuid.uuid4(), rule_id or f"rule-{_tag()}", user_id, channel, window,
            window_start or _today(), int(threshold_usd * 1e9), int(spend_usd * 1e9),
            json.dumps(detail or {"model": "gpt-test"}))


def _events(gw: Gateway, specs: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Notify events in the outbox, in one transaction, as the telemetry ingest writes them with the
    request rows that crossed their thresholds."""
    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(gw.database_url)
        try:
            async with conn.transaction():
                return [dict(await conn.fetchrow(_INSERT_EVENT, *spec)) for spec in specs]
        finally:
            await conn.close()

    return asyncio.run(run())


def _event(gw: Gateway, user_id: str, channel: str, **fields: Any) -> dict[str, Any]:
    return _events(gw, [_spec(user_id, channel, **fields)])[0]


def _outbox(gw: Gateway, event_id: int) -> dict[str, Any]:
    return _db(gw, "SELECT * FROM rule_events WHERE id = $1", event_id)[0]


def _settled(gw: Gateway, event: dict[str, Any], timeout_s: float = 15.0) -> dict[str, Any]:
    return _until(lambda: (row := _outbox(gw, event["id"]))["status"] != "pending" and row, timeout_s,
                  f"event {event['id']} to settle")


def _user(gw: Gateway, **extra: Any) -> dict[str, Any]:
    address = f"n-{_tag()}@example.com"
    response = gw.admin("POST", "/admin/users", {"email": address, "display_name": f"Person {address[2:6]}", **extra})
    assert response.status_code == 201, response.text
    return response.json()


def _verify(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    expected = "sha256=" + hmac.new(WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["x-meshfast-signature"], expected), "the HMAC of the exact body"
    assert headers["content-type"] == "application/json"
    return json.loads(body)


# --- the channels ---------------------------------------------------------------------------


def test_channels_are_stored_with_secrets_sealed_and_never_answered_or_audited(gw: Gateway, receiver: Receiver,
                                                                               sink: MailSink) -> None:
    """PUT stores both channels; GET says a secret is set but never shows it; the database holds
    only sealed bytes; the audit row says which secrets changed, not what they are; a field left
    out is kept and null clears."""
    answer = _configure(gw, receiver, sink)
    got = gw.admin("GET", "/admin/notifications")
    assert got.status_code == 200
    for shown in (answer, got.json()):
        assert shown["webhook_url"] == receiver.url and shown["webhook_local"] is True
        assert shown["webhook_secret_set"] is True and shown["smtp"]["password_set"] is True
        assert shown["smtp"]["host"] == "127.0.0.1" and shown["smtp"]["from"] == "meshfast@example.com"
        text = json.dumps(shown)
        assert WEBHOOK_SECRET not in text and SMTP_PASSWORD not in text
    stored = _db(gw, "SELECT * FROM notification_settings")[0]
    assert WEBHOOK_SECRET.encode() not in stored["webhook_secret_sealed"]
    assert SMTP_PASSWORD.encode() not in stored["smtp_password_sealed"]
    audit = gw.admin("GET", "/admin/audit?action=update_notifications").json()["entries"]
    assert audit and audit[0]["detail"]["webhook_secret_changed"] is True
    assert WEBHOOK_SECRET not in json.dumps(audit) and SMTP_PASSWORD not in json.dumps(audit)

    # Left out: kept (the secret too); an SMTP body without password keeps the password.
    kept = gw.admin("PUT", "/admin/notifications", {"smtp": {"host": "127.0.0.1", "port": sink.port,
                                                             "from": "other@example.com", "username": SMTP_USER}})
    assert kept.status_code == 200, kept.text
    assert kept.json()["webhook_secret_set"] and kept.json()["smtp"]["password_set"]
    assert kept.json()["smtp"]["from"] == "other@example.com"
    cleared = gw.admin("PUT", "/admin/notifications", {"smtp": None})
    assert cleared.json()["smtp"] is None and cleared.json()["webhook_url"] == receiver.url
    _configure(gw, receiver, sink)


@pytest.mark.parametrize(("body", "problem"), [
    ({"webhook_url": "http://127.0.0.1:9/hook", "webhook_secret": "s", "webhook_local": False}, "local"),
    ({"webhook_url": "http://169.254.169.254/latest", "webhook_secret": "s", "webhook_local": False}, "local"),
    ({"webhook_url": "http://10.1.2.3/hook", "webhook_secret": "s", "webhook_local": False}, "local"),
    ({"webhook_url": "http://localhost/hook", "webhook_secret": "s", "webhook_local": False}, "local"),
    ({"webhook_url": "http://[::1]/hook", "webhook_secret": "s", "webhook_local": False}, "local"),
    ({"webhook_url": "ftp://example.com/hook", "webhook_secret": "s"}, "http"),
    ({"webhook_url": "https://user:pw@example.com/hook", "webhook_secret": "s"}, "user info"),
    ({"webhook_url": "https://example.com/hook", "webhook_secret": None}, "webhook_secret is required"),
    ({"webhook_url": "https://example.com/\u0000", "webhook_secret": "s"}, "NUL"),
    ({"webhook_secret": ""}, "empty"),
    ({"smtp": {"host": "mail example", "port": 25, "from": "a@example.com"}}, "smtp.host"),
    ({"smtp": {"host": "mail.example.com", "port": 25, "from": "a@example.com\r\nBcc: x@evil.test"}}, "smtp.from"),
    ({"smtp": {"host": "mail.example.com", "port": 70000, "from": "a@example.com"}}, "port"),
    ({"smtp": {"host": "mail.example.com", "port": 25}}, "from"),
    ({"webhook_urls": "https://example.com"}, "unknown field"),
])
def test_bad_channels_are_refused_and_ssrf_needs_webhook_local(gw: Gateway, body: dict[str, Any],
                                                                problem: str) -> None:
    """A webhook URL naming a loopback, private, link-local or shared address is refused unless
    webhook_local; malformed URLs, a webhook without a secret and header-breaking SMTP fields too."""
    before = gw.admin("GET", "/admin/notifications").json()
    response = gw.admin("PUT", "/admin/notifications", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request" and problem in response.text
    assert gw.admin("GET", "/admin/notifications").json() == before, "nothing written"


def test_a_public_webhook_is_taken_without_webhook_local(gw: Gateway, receiver: Receiver, sink: MailSink) -> None:
    """The same URL rules as a provider's base_url: a public https URL needs no webhook_local."""
    response = gw.admin("PUT", "/admin/notifications", {"webhook_url": "https://hooks.example.com/meshfast",
                                                        "webhook_secret": "s3cret", "webhook_local": False})
    assert response.status_code == 200, response.text
    assert response.json()["webhook_local"] is False
    _configure(gw, receiver, sink)


# --- delivery -------------------------------------------------------------------------------


def test_a_webhook_delivery_is_signed_and_carries_its_delivery_id(gw: Gateway, receiver: Receiver,
                                                                  sink: MailSink) -> None:
    """One POST per outbox row: the JSON the API documents, X-Meshfast-Signature the HMAC-SHA256
    of the exact body with the secret, X-Meshfast-Delivery the row's delivery id; the row ends
    delivered after one attempt and the deliveries list shows it."""
    _configure(gw, receiver, sink)
    person = _user(gw, business_unit="payments")
    event = _event(gw, person["id"], "webhook", threshold_usd=250, spend_usd=227.5)
    delivery_id = str(event["delivery_id"])
    row = _settled(gw, event)
    assert (row["status"], row["attempts"], row["last_error"]) == ("delivered", 1, None)
    [(headers, body)] = receiver.deliveries(delivery_id)
    payload = _verify(headers, body)
    assert payload["delivery_id"] == delivery_id
    assert {k: payload[k] for k in ("rule_id", "entry", "user_id", "email", "business_unit", "threshold_usd",
                                    "spend_usd", "utilization", "window", "window_start", "action")} == {
        "rule_id": event["rule_id"], "entry": 0, "user_id": person["id"], "email": person["email"],
        "business_unit": "payments", "threshold_usd": 250.0, "spend_usd": 227.5, "utilization": 0.91,
        "window": "daily", "window_start": _today().isoformat().replace("+00:00", "Z"), "action": "notify"}
    assert payload["model"] == "gpt-test"

    listed = gw.admin("GET", f"/admin/notifications/deliveries?user_id={person['id']}")
    assert listed.status_code == 200, listed.text
    [entry] = listed.json()["deliveries"]
    assert {k: entry[k] for k in ("delivery_id", "rule_id", "user_id", "threshold_usd", "channel", "status",
                                  "attempts", "last_error")} == {
        "delivery_id": delivery_id, "rule_id": event["rule_id"], "user_id": person["id"], "threshold_usd": 250.0,
        "channel": "webhook", "status": "delivered", "attempts": 1, "last_error": None}
    assert entry["window_start"] and entry["created_at"] and entry["delivered_at"]
    time.sleep(1.0)
    assert len(receiver.deliveries(delivery_id)) == 1, "no repeat in normal operation"


def test_a_receiver_error_is_retried_with_the_same_delivery_id(gw: Gateway, receiver: Receiver,
                                                               sink: MailSink) -> None:
    """The receiver answers 500 once: the row is retried after the backoff and ends delivered,
    with two attempts and one delivered row; both attempts carry the same delivery id."""
    _configure(gw, receiver, sink)
    person = _user(gw)
    delivery_id = uuid.uuid4()
    receiver.fail[str(delivery_id)] = 1
    event = _event(gw, person["id"], "webhook", delivery_id=delivery_id)
    delivery_id = str(delivery_id)
    row = _settled(gw, event)
    assert (row["status"], row["attempts"]) == ("delivered", 2), row
    attempts = receiver.deliveries(delivery_id)
    assert len(attempts) == 2
    assert [_verify(h, b)["delivery_id"] for h, b in attempts] == [delivery_id, delivery_id]
    rows = _db(gw, "SELECT status FROM rule_events WHERE rule_id = $1", event["rule_id"])
    assert rows == [{"status": "delivered"}]


def test_failures_back_off_and_record_the_error(gw: Gateway, receiver: Receiver, sink: MailSink) -> None:
    """While the receiver keeps failing, attempts grow further apart (doubling) and last_error
    says why; the row stays pending until it succeeds."""
    _configure(gw, receiver, sink)
    person = _user(gw)
    delivery_id = uuid.uuid4()
    receiver.fail[str(delivery_id)] = 4
    event = _event(gw, person["id"], "webhook", delivery_id=delivery_id)
    pending = _until(lambda: (row := _outbox(gw, event["id"]))["attempts"] >= 2 and row, 15, "a retry")
    assert pending["status"] == "pending" and pending["last_error"] == "the receiver answered HTTP 500"
    row = _settled(gw, event, timeout_s=30)
    assert (row["status"], row["attempts"], row["last_error"]) == ("delivered", 5, None)
    at = receiver.received_at[str(delivery_id)]
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert len(gaps) == 4 and gaps[-1] > 2 * gaps[0], f"backoff doubles: {gaps}"
    listed = gw.admin("GET", f"/admin/notifications/deliveries?rule_id={event['rule_id']}").json()["deliveries"]
    assert listed[0]["attempts"] == 5


def test_an_email_goes_to_the_person_with_the_template_filled(gw: Gateway, receiver: Receiver,
                                                              sink: MailSink) -> None:
    """SMTP with login: to the person's address, the subject and body from the rule's template
    with every placeholder filled; unknown placeholders and stray braces stay as written."""
    _configure(gw, receiver, sink)
    person = _user(gw, business_unit="research")
    template = ("Subject: {person}: {utilization} of your {window} budget\n\n"
                "Hi {person} <{email}> ({business_unit}): {spend} of {threshold} on {model} under {rule}, "
                "window from {window_start}, resets {resume_time}. {unknown} {not closed")
    window_start = dt.datetime(2030, 3, 1, tzinfo=dt.UTC)
    event = _event(gw, person["id"], "email", window="monthly", window_start=window_start, threshold_usd=200,
                   spend_usd=180, detail={"model": "claude-opus", "template": template})
    row = _settled(gw, event)
    assert (row["status"], row["attempts"]) == ("delivered", 1), row
    [message] = sink.to(person["email"])
    name = person["display_name"]
    assert message["Subject"] == f"{name}: 90% of your monthly budget"
    assert message["From"] == "meshfast@example.com"
    assert message["X-Meshfast-Delivery"] == str(event["delivery_id"])
    body = message.get_content()
    assert (f"Hi {name} <{person['email']}> (research): $180.00 of $200.00 on claude-opus under {event['rule_id']}, "
            "window from 2030-03-01, resets 2030-04-01. {unknown} {not closed") in body
    assert (SMTP_USER.encode(), SMTP_PASSWORD.encode()) in sink.logins


def test_an_email_without_a_template_uses_the_default(gw: Gateway, receiver: Receiver, sink: MailSink) -> None:
    """No template: a default subject and body naming the rule, spend, threshold and window."""
    _configure(gw, receiver, sink)
    person = _user(gw)
    event = _event(gw, person["id"], "email", threshold_usd=50, spend_usd=50)
    assert _settled(gw, event)["status"] == "delivered"
    [message] = sink.to(person["email"])
    assert event["rule_id"] in message["Subject"] and "100%" in message["Subject"]
    assert "$50.00 of $50.00" in message.get_content()


def test_a_channel_not_configured_is_skipped_with_the_reason(gw: Gateway, receiver: Receiver,
                                                             sink: MailSink) -> None:
    """A notify row for a channel with no configuration ends skipped, last_error saying why, and
    is not retried."""
    _configure(gw, None, None)
    person = _user(gw)
    hook, mail = _event(gw, person["id"], "webhook"), _event(gw, person["id"], "email")
    for event, channel in ((hook, "webhook"), (mail, "SMTP")):
        row = _settled(gw, event)
        assert row["status"] == "skipped" and channel in row["last_error"] and "not configured" in row["last_error"]
    assert not receiver.deliveries(str(hook["delivery_id"])) and not sink.to(person["email"])
    skipped = gw.admin("GET", f"/admin/notifications/deliveries?user_id={person['id']}&status=skipped").json()
    assert skipped["total"] == 2
    _configure(gw, receiver, sink)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_non_local_webhook_is_held_to_public_addresses_when_it_is_called(gw: Gateway, receiver: Receiver,
                                                                          sink: MailSink, host: str) -> None:
    """The connect-time guard: a stored non-local webhook whose address (an IP literal, or a name
    as resolved) is not public is not called; the attempt fails and says why."""
    _configure(gw, receiver, sink)
    _db(gw, "UPDATE notification_settings SET webhook_url = $1, webhook_local = false",
        f"http://{host}:{receiver.port}/hooks/meshfast")
    try:
        person = _user(gw)
        event = _event(gw, person["id"], "webhook")
        row = _until(lambda: (r := _outbox(gw, event["id"]))["last_error"] and r, 15, "the refused attempt")
        assert row["status"] == "pending" and "ForbiddenAddress" in row["last_error"], row
        assert not receiver.deliveries(str(event["delivery_id"]))
    finally:
        _configure(gw, receiver, sink)
    assert _settled(gw, event)["status"] == "delivered", "delivered once the webhook may be called"


def test_pause_events_are_not_delivered(gw: Gateway, receiver: Receiver, sink: MailSink) -> None:
    """Pauses share the outbox but are not notifications: never claimed, never listed."""
    _configure(gw, receiver, sink)
    person = _user(gw)
    rule_id = f"rule-{_tag()}"
    _db(gw, """INSERT INTO rule_events (rule_id, entry, user_id, action, channel, "window", window_start,
                                        threshold_nano, spend_nano) VALUES ($1, 0, $2, 'pause', '', 'daily', $3, 1, 1)""",
        rule_id, person["id"], _today())
    time.sleep(1.0)
    [row] = _db(gw, "SELECT status, attempts FROM rule_events WHERE rule_id = $1", rule_id)
    assert row == {"status": "pending", "attempts": 0}
    assert gw.admin("GET", f"/admin/notifications/deliveries?rule_id={rule_id}").json()["total"] == 0


def test_a_leadership_digest_goes_once_to_each_leader(gw: Gateway, receiver: Receiver, sink: MailSink) -> None:
    """After a window instance ends, every leader above someone who crossed a notify threshold in
    it gets one digest per channel listing those people (reports at any depth); a leader whose
    organisation crossed nothing gets none, and digests are not made twice."""
    _configure(gw, receiver, sink)
    top = _user(gw)
    middle = _user(gw, manager_email=top["email"])
    first = _user(gw, manager_email=middle["email"], business_unit="payments")
    second = _user(gw, manager_email=middle["email"])
    calm_leader = _user(gw)
    _user(gw, manager_email=calm_leader["email"])
    # Two days ago: an instance ended more than the digest's grace minute ago whenever this runs.
    ended_day = _today() - dt.timedelta(days=2)
    rule_id = f"rule-{_tag()}"
    events = _events(gw, [_spec(first["id"], "webhook", rule_id=rule_id, window_start=ended_day, spend_usd=95),
                          _spec(second["id"], "webhook", rule_id=rule_id, window_start=ended_day, spend_usd=120),
                          _spec(second["id"], "email", rule_id=rule_id, window_start=ended_day, spend_usd=120)])
    for event in events:
        _settled(gw, event)

    def digests() -> list[dict[str, Any]]:
        return _db(gw, """SELECT user_id::text AS user_id, channel, status, attempts FROM rule_events
                          WHERE action = 'digest' AND window_start = $1 AND user_id = ANY($2::uuid[])
                          ORDER BY user_id, channel""",
                   ended_day, [top["id"], middle["id"], first["id"], second["id"], calm_leader["id"]])

    _until(lambda: len(digests()) == 4 and all(d["status"] == "delivered" for d in digests()), 20, "digests")
    time.sleep(1.5)  # several more digest passes
    assert digests() == sorted(
        [{"user_id": leader["id"], "channel": channel, "status": "delivered", "attempts": 1}
         for leader in (top, middle) for channel in ("email", "webhook")], key=lambda d: (d["user_id"], d["channel"]))

    for leader in (top, middle):
        [payload] = receiver.payloads(lambda p, leader=leader: p["action"] == "digest" and p["user_id"] == leader["id"])
        assert payload["rule_id"] == "*" and payload["email"] == leader["email"]
        assert payload["window"] == "daily" and payload["window_start"] == ended_day.isoformat().replace("+00:00", "Z")
        people = {(p["user_id"], p["spend_usd"]) for p in payload["people"]}
        assert people == {(first["id"], 95.0), (second["id"], 120.0)}, "each crossing once, however many channels"
        assert all(p["rule_id"] == rule_id for p in payload["people"])
        [mail] = sink.to(leader["email"])
        assert "2 people" in mail["Subject"]
        assert first["email"] in mail.get_content() and second["email"] in mail.get_content()
    assert not receiver.payloads(lambda p: p["action"] == "digest" and p["user_id"] == calm_leader["id"])


def test_the_current_window_gets_no_digest_yet(gw: Gateway, receiver: Receiver, sink: MailSink) -> None:
    """A crossing in a window instance that has not ended makes no digest."""
    _configure(gw, receiver, sink)
    leader = _user(gw)
    person = _user(gw, manager_email=leader["email"])
    _settled(gw, _event(gw, person["id"], "webhook"))
    time.sleep(1.5)
    assert not _db(gw, "SELECT 1 FROM rule_events WHERE action = 'digest' AND user_id = $1", leader["id"])


def test_no_secret_reaches_the_logs(gw: Gateway, receiver: Receiver, sink: MailSink) -> None:
    """After configuring, delivering and failing, neither secret appears in the gateway's log."""
    _configure(gw, receiver, sink)
    person = _user(gw)
    event = _event(gw, person["id"], "email")
    assert _settled(gw, event)["status"] == "delivered"
    log_text = gw.log_path.read_text(errors="replace")
    assert "notification" in log_text and "recording the attempt failed" not in log_text
    assert WEBHOOK_SECRET not in log_text and SMTP_PASSWORD not in log_text


# --- restart --------------------------------------------------------------------------------


def test_a_delivery_survives_a_receiver_outage_across_a_restart(tmp_path: Path) -> None:
    """The receiver is down: attempts fail and are rescheduled; the gateway restarts; the receiver
    comes back; the row is delivered exactly once, with the delivery id it had from the start."""
    port = free_port()
    with running_gateway(1, env=NOTIFY_ENV) as gateway:
        response = gateway.admin("PUT", "/admin/notifications", {
            "webhook_url": f"http://127.0.0.1:{port}/hook", "webhook_secret": WEBHOOK_SECRET, "webhook_local": True})
        assert response.status_code == 200, response.text
        person = _user(gateway)
        event = _event(gateway, person["id"], "webhook")
        failed = _until(lambda: (row := _outbox(gateway, event["id"]))["attempts"] >= 2 and row, 15, "failed attempts")
        assert failed["status"] == "pending" and failed["last_error"]
        gateway.stop()
        receiver = Receiver(port)
        try:
            gateway.start()
            row = _settled(gateway, event, timeout_s=30)
            assert row["status"] == "delivered" and row["attempts"] > failed["attempts"]
            [(headers, body)] = receiver.deliveries(str(event["delivery_id"]))
            assert _verify(headers, body)["delivery_id"] == str(event["delivery_id"])
            time.sleep(1.0)
            assert len(receiver.deliveries(str(event["delivery_id"]))) == 1
        finally:
            receiver.close()


# --- templates and windows (no gateway) -----------------------------------------------------


@given(st.text(max_size=300))
def test_any_template_renders_without_error(template: str) -> None:
    """Whatever a template holds (stray braces, unknown names, format specs), rendering fills the
    known placeholders, keeps the rest as written, and the subject stays one line."""
    values = {"person": "Ada", "rule": "r"}
    text = notify.render(template, values)
    assert text == template.replace("{person}", "Ada").replace("{rule}", "r")
    subject, _ = notify.subject_and_body(text, "default")
    assert "\n" not in subject and "\r" not in subject and subject


@pytest.mark.parametrize(("window", "start", "zone", "end"), [
    ("daily", "2030-03-09T00:00:00-08:00", "America/Los_Angeles", "2030-03-10T00:00:00-08:00"),
    ("daily", "2030-03-10T00:00:00-08:00", "America/Los_Angeles", "2030-03-11T00:00:00-07:00"),
    ("weekly", "2030-10-21T00:00:00+02:00", "Europe/Berlin", "2030-10-28T00:00:00+01:00"),
    ("monthly", "2030-12-01T00:00:00+00:00", "UTC", "2031-01-01T00:00:00+00:00"),
    ("monthly", "2032-02-01T00:00:00+00:00", "UTC", "2032-03-01T00:00:00+00:00"),
])
def test_a_window_ends_on_the_calendar_boundary(window: str, start: str, zone: str, end: str) -> None:
    """The digest's and the template's window end: a day, a week or a month on the calendar's
    clock, across DST changes and the year's end."""
    got = notify.window_end(window, dt.datetime.fromisoformat(start), zoneinfo.ZoneInfo(zone))
    assert got == dt.datetime.fromisoformat(end) and got.utcoffset() == dt.datetime.fromisoformat(end).utcoffset()
