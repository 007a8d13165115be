"""Notification delivery for spend rules: the ``rule_events`` outbox, delivered by the leader.

The protocol (the rows are the only state; a worker keeps none a restart could lose):

- **Insert.** A row enters the outbox once per natural key (rule, entry, person, window instance,
  threshold, action, channel): notify events with the request row that crossed the threshold
  (the telemetry ingest, ``ON CONFLICT DO NOTHING``), leadership digests here (``MAKE_DIGESTS``
  in meshfast/store/notifications.py, the same way). Its ``delivery_id`` is fixed at insert, so
  every attempt carries the same id and a receiver can drop a repeat.
- **Claim.** The leader's ``notify`` job takes due pending rows ``FOR UPDATE SKIP LOCKED`` and, in
  the same statement, counts the attempt and moves ``next_attempt_at`` a lease ahead
  (:attr:`NotifySettings.lease_s`, longer than any attempt). A second claimer (a new leader while
  the old one still finishes) skips them; a worker killed mid-attempt leaves rows that come due
  again when the lease ends. So a delivery is at least once, and repeated only after such a crash.
- **Result.** Delivered (any 2xx, or the SMTP relay accepted the message); or a retry at now +
  backoff (from ``MESHFAST_NOTIFY_BACKOFF_S``, doubling per attempt, at most 1 h apart), or
  ``failed`` once the row is older than ``MESHFAST_NOTIFY_GIVE_UP_S`` (24 h); or ``skipped`` when
  its channel is not configured (``last_error`` says why). A result is written only while the row
  is still pending, and a retry only by the attempt that claimed it.
- **Shutdown.** Attempts still running are cancelled and their rows released (due now, the
  attempt not counted), so the next leader takes them at once rather than after the lease.

Pause events live in the same table; they are not deliveries and are never claimed here.

Webhook: ``POST`` of JSON with ``X-Meshfast-Signature: sha256=<hex HMAC-SHA256 of the exact body
with the webhook secret>`` and ``X-Meshfast-Delivery: <delivery_id>``; a non-local URL is held to
public addresses when it is resolved too (the providers' guarded resolver). Email: SMTP (STARTTLS
and login optional), to the person, subject and body from the rule's template.

Leadership digest: once per leader and ended window instance (a minute after the boundary), one
message to each leader (anyone who manages someone) listing the people of their organisation
(reports, transitively) who crossed a notify threshold in that instance; a row per configured
channel with ``rule_id`` ``*``, ``entry`` -1 and the leader as ``user_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import email.message
import email.utils
import hashlib
import hmac
import json
import logging
import re
import smtplib
import ssl
import time
import zoneinfo
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import asyncpg
from cryptography.exceptions import InvalidTag

from meshfast import snapshot
from meshfast.admin.notifications import SMTP_PASSWORD_AD, WEBHOOK_SECRET_AD, open_secret
from meshfast.http1 import ForbiddenAddress, forbidden_address
from meshfast.settings import _float_env
from meshfast.store import notifications as notifications_sql

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("meshfast.notify")

MAX_BACKOFF_S = 3600.0
# Rows one claim takes, and attempts running at once.
BATCH_ROWS = 64
CONCURRENCY = 8
# Digests are made for window instances that ended this long ago at most (a gateway down for
# longer, or channels configured later, does not send old ones) and at least (the last
# crossings' rows reach the outbox within seconds of the call).
DIGEST_HORIZON_S = 7 * 86400.0
DIGEST_GRACE_S = 60.0
# How deep a manager chain is followed (chains never loop: refused on write).
MAX_CHAIN_DEPTH = 64
WEBHOOK_USER_AGENT = "meshfast-notify/1"
NOT_CONFIGURED = "{} is not configured (PUT /admin/notifications)"


@dataclass(frozen=True, slots=True)
class NotifySettings:
    """The delivery loop's timings (``meshfast --help`` lists the variables)."""

    poll_s: float = 1.0
    backoff_s: float = 10.0
    give_up_s: float = 86400.0
    timeout_s: float = 10.0
    digest_s: float = 60.0

    @classmethod
    def from_env(cls) -> NotifySettings:
        return cls(poll_s=_float_env("MESHFAST_NOTIFY_POLL_S", 1.0),
                   backoff_s=_float_env("MESHFAST_NOTIFY_BACKOFF_S", 10.0),
                   give_up_s=_float_env("MESHFAST_NOTIFY_GIVE_UP_S", 86400.0),
                   timeout_s=_float_env("MESHFAST_NOTIFY_TIMEOUT_S", 10.0),
                   digest_s=_float_env("MESHFAST_NOTIFY_DIGEST_S", 60.0))

    @property
    def lease_s(self) -> float:
        """How long a claimed row is left to its attempt: longer than an attempt can take."""
        return max(60.0, 4 * self.timeout_s)

    def retry_delay_s(self, attempts: int) -> float:
        return min(MAX_BACKOFF_S, self.backoff_s * 2 ** min(attempts - 1, 30))


# --- channels ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Smtp:
    host: str
    port: int
    sender: str
    username: str | None
    password: str | None
    starttls: bool


@dataclass(frozen=True, slots=True)
class Channels:
    """The configured channels, secrets opened (held in memory for one batch, never logged)."""

    webhook_url: str | None = None
    webhook_local: bool = False
    webhook_secret: str | None = None
    smtp: Smtp | None = None
    # Why a configured channel cannot be used (a sealed secret that no longer opens).
    problem: str | None = None

    @property
    def names(self) -> list[str]:
        return ([] if self.webhook_url is None else ["webhook"]) + ([] if self.smtp is None else ["email"])


async def load_channels(conn: asyncpg.Connection, master_key: bytes) -> Channels:
    row = await conn.fetchrow(notifications_sql.SELECT_SETTINGS)
    if row is None:
        return Channels()
    try:
        secret = open_secret(master_key, WEBHOOK_SECRET_AD, row["webhook_secret_sealed"], row["webhook_secret_nonce"])
        password = open_secret(master_key, SMTP_PASSWORD_AD, row["smtp_password_sealed"], row["smtp_password_nonce"])
    except InvalidTag:
        return Channels(problem="a sealed notification secret does not open under this master key; set it again")
    smtp = None
    if row["smtp_host"] is not None:
        smtp = Smtp(host=row["smtp_host"], port=row["smtp_port"], sender=row["smtp_from"],
                    username=row["smtp_username"], password=password, starttls=row["smtp_starttls"])
    return Channels(webhook_url=row["webhook_url"], webhook_local=row["webhook_local"], webhook_secret=secret,
                    smtp=smtp)


# --- messages ------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
DEFAULT_TEMPLATE = """Subject: meshfast: {person} reached {utilization} of {threshold} ({rule}, {window})

Hello {person},

Your spend under the rule "{rule}" reached {spend} of {threshold} ({utilization}) in the {window}
window that started {window_start}. Last model: {model}.

The window resets at {resume_time}.

-- meshfast
"""


def render(template: str, values: dict[str, str]) -> str:
    """``template`` with each known ``{placeholder}`` filled; anything else is left as it is."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def subject_and_body(text: str, default_subject: str) -> tuple[str, str]:
    """A rendered template's subject (its first line, when that reads ``Subject: ...``) and body.
    The subject is one line whatever the template held (a header cannot carry a line break)."""
    first, _, rest = text.partition("\n")
    if first.lower().startswith("subject:"):
        subject, body = first[len("subject:"):].strip(), rest.lstrip("\n")
    else:
        subject, body = default_subject, text
    return " ".join(subject.split())[:500] or default_subject, body


def usd(nano: int) -> float:
    return float(Decimal(nano).scaleb(-9))


def usd_text(nano: int) -> str:
    value = Decimal(nano).scaleb(-9)
    return f"${value:,.2f}" if value >= Decimal("0.01") or value == 0 else f"${value:.6f}"


def utilization(spend_nano: int, threshold_nano: int) -> float | None:
    return None if threshold_nano <= 0 else round(spend_nano / threshold_nano, 4)


def iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def calendar_zone() -> dt.tzinfo:
    try:
        return zoneinfo.ZoneInfo(snapshot.calendar_tz())
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return dt.UTC


def window_end(window: str, start: dt.datetime, zone: dt.tzinfo) -> dt.datetime:
    """The end of the window instance that starts at ``start``, on the calendar of ``zone``."""
    local = start.astimezone(zone).replace(tzinfo=None)
    if window == "daily":
        end = local + dt.timedelta(days=1)
    elif window == "weekly":
        end = local + dt.timedelta(days=7)
    else:
        end = local.replace(year=local.year + local.month // 12, month=local.month % 12 + 1)
    return end.replace(tzinfo=zone)


def _local_text(moment: dt.datetime, zone: dt.tzinfo) -> str:
    local = moment.astimezone(zone)
    if local.time() == dt.time(0):
        return local.strftime("%Y-%m-%d")
    return local.strftime("%Y-%m-%d %H:%M %Z")


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery as each channel sends it."""

    payload: dict[str, Any]
    subject: str
    body: str
    # The recipient's address (the person; the leader for a digest), None when unknown.
    to: str | None


def _person(user: asyncpg.Record | None) -> dict[str, Any]:
    if user is None:
        return {"email": None, "person": None, "business_unit": None}
    return {"email": user["email"], "person": user["display_name"], "business_unit": user["business_unit"]}


def _detail(row: asyncpg.Record) -> dict[str, Any]:
    try:
        detail = json.loads(row["detail"] or "{}")
    except ValueError:
        return {}
    return detail if isinstance(detail, dict) else {}


def notify_message(row: asyncpg.Record, user: asyncpg.Record | None, zone: dt.tzinfo) -> Message:
    detail = _detail(row)
    who = _person(user)
    share = utilization(row["spend_nano"], row["threshold_nano"])
    end = window_end(row["window"], row["window_start"], zone)
    resume_ms = detail.get("resume_at_ms")
    resume = dt.datetime.fromtimestamp(resume_ms / 1000, dt.UTC) if isinstance(resume_ms, int) else end
    model = detail.get("model") if isinstance(detail.get("model"), str) else None
    values = {
        "person": who["person"] or who["email"] or str(row["user_id"]),
        "email": who["email"] or "",
        "business_unit": who["business_unit"] or "",
        "utilization": "" if share is None else f"{share * 100:.0f}%",
        "threshold": usd_text(row["threshold_nano"]),
        "spend": usd_text(row["spend_nano"]),
        "window": row["window"],
        "window_start": _local_text(row["window_start"], zone),
        "model": model or "",
        "resume_time": _local_text(resume, zone),
        "rule": row["rule_id"],
    }
    template = detail.get("template")
    text = render(template if isinstance(template, str) and template.strip() else DEFAULT_TEMPLATE, values)
    subject, body = subject_and_body(
        text, render("meshfast: {person} reached {utilization} of {threshold} ({rule})", values))
    payload = {
        "delivery_id": str(row["delivery_id"]), "rule_id": row["rule_id"], "entry": row["entry"],
        "user_id": str(row["user_id"]), "email": who["email"], "business_unit": who["business_unit"],
        "threshold_usd": usd(row["threshold_nano"]), "spend_usd": usd(row["spend_nano"]), "utilization": share,
        "window": row["window"], "window_start": iso(row["window_start"]), "action": row["action"],
        "model": model, "resume_at": iso(resume), "subject": subject, "message": body,
    }
    return Message(payload, subject, body, who["email"])


def digest_message(row: asyncpg.Record, leader: asyncpg.Record | None, zone: dt.tzinfo) -> Message:
    who = _person(leader)
    end = window_end(row["window"], row["window_start"], zone)
    people = []
    lines = []
    for item in _detail(row).get("people") or []:
        if not isinstance(item, dict):
            continue
        threshold, spend = int(item.get("threshold_nano") or 0), int(item.get("spend_nano") or 0)
        share = utilization(spend, threshold)
        people.append({"user_id": item.get("user_id"), "email": item.get("email"), "person": item.get("person"),
                       "business_unit": item.get("business_unit"), "rule_id": item.get("rule_id"),
                       "entry": item.get("entry"), "threshold_usd": usd(threshold), "spend_usd": usd(spend),
                       "utilization": share})
        name = item.get("person") or item.get("email") or item.get("user_id")
        unit = f", {item['business_unit']}" if item.get("business_unit") else ""
        shown = "" if share is None else f" ({share * 100:.0f}%)"
        lines.append(f"- {name} <{item.get('email') or ''}>{unit}: {usd_text(spend)} of {usd_text(threshold)}"
                     f"{shown} under rule {item.get('rule_id')}")
    window = f"{row['window']} window {_local_text(row['window_start'], zone)} to {_local_text(end, zone)}"
    count = len({p["user_id"] for p in people})
    subject = f"meshfast digest: {count} {'person' if count == 1 else 'people'} in your organisation " \
              f"crossed a spend threshold ({window})"
    leader_name = who["person"] or who["email"] or str(row["user_id"])
    body = f"Hello {leader_name},\n\nIn the {window}, these people in your organisation crossed a " \
           "notification threshold:\n\n" + "\n".join(lines) + "\n\n-- meshfast\n"
    payload = {
        "delivery_id": str(row["delivery_id"]), "rule_id": row["rule_id"], "entry": row["entry"],
        "user_id": str(row["user_id"]), "email": who["email"], "business_unit": who["business_unit"],
        "threshold_usd": None, "spend_usd": None, "utilization": None,
        "window": row["window"], "window_start": iso(row["window_start"]), "window_end": iso(end),
        "action": "digest", "people": people, "subject": subject, "message": body,
    }
    return Message(payload, subject, body, who["email"])


def signature(secret: str, body: bytes) -> str:
    """``X-Meshfast-Signature``'s value: the HMAC-SHA256 of the exact body bytes."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _send_mail(smtp: Smtp, to: str, message: Message, delivery_id: str, timeout_s: float) -> None:
    """One message through the relay (blocking: run in a thread)."""
    mail = email.message.EmailMessage()
    mail["From"] = smtp.sender
    mail["To"] = to
    mail["Subject"] = message.subject
    mail["Date"] = email.utils.formatdate(localtime=False)
    mail["Message-ID"] = email.utils.make_msgid(domain="meshfast")
    mail["X-Meshfast-Delivery"] = delivery_id
    mail.set_content(message.body)
    context = ssl.create_default_context()
    client = (smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=timeout_s, context=context) if smtp.port == 465
              else smtplib.SMTP(smtp.host, smtp.port, timeout=timeout_s))
    with client:
        if smtp.starttls and smtp.port != 465:
            client.starttls(context=context)
        if smtp.username:
            client.login(smtp.username, smtp.password or "")
        client.send_message(mail)


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:1000]


# --- the loop ------------------------------------------------------------------------------


class Notifier:
    """The outbox's deliverer; :meth:`tick` is the leader's ``notify`` job (every ``poll_s``)."""

    def __init__(self, pool: asyncpg.Pool, master_key: bytes, settings: NotifySettings | None = None) -> None:
        self._pool = pool
        self._master_key = master_key
        self.settings = settings or NotifySettings.from_env()
        self._batch: asyncio.Task[None] | None = None
        # Claimed rows whose attempt has not finished (released on stop).
        self._unfinished: set[int] = set()
        self._next_digest = 0.0
        # Window instances this process already made digests for (pruned past the horizon).
        self._digested: dict[tuple[str, dt.datetime], float] = {}

    async def tick(self, conn: asyncpg.Connection) -> None:
        """Make the digests that are due, then, unless the last batch is still running, claim
        due rows and start delivering them (the leader's loop does not wait for receivers)."""
        if time.monotonic() >= self._next_digest:
            self._next_digest = time.monotonic() + self.settings.digest_s
            try:
                await self.make_digests(conn)
            except asyncpg.PostgresError:
                # NOTE: deliveries go on; the digests are tried again at the next interval.
                log.exception("making leadership digests failed; next try in %.0f s", self.settings.digest_s)
        if self._batch is not None and not self._batch.done():
            return
        rows = await conn.fetch(notifications_sql.CLAIM_DUE, BATCH_ROWS, self.settings.lease_s)
        if not rows:
            return
        self._unfinished.update(r["id"] for r in rows)
        channels = await load_channels(conn, self._master_key)
        users = {u["id"]: u for u in await conn.fetch(notifications_sql.RECIPIENTS, list({r["user_id"] for r in rows}))}
        self._batch = asyncio.create_task(self._deliver(rows, channels, users), name="meshfast:notify")

    async def make_digests(self, conn: asyncpg.Connection) -> None:
        channels = (await load_channels(conn, self._master_key)).names
        if not channels:
            return
        zone = snapshot.calendar_tz()
        now = time.time()
        self._digested = {k: t for k, t in self._digested.items() if now - t < 2 * DIGEST_HORIZON_S}
        for instance in await conn.fetch(notifications_sql.ENDED_INSTANCES, zone, DIGEST_HORIZON_S, DIGEST_GRACE_S):
            key = (instance["window"], instance["window_start"])
            if key in self._digested:
                continue
            status = await conn.execute(notifications_sql.MAKE_DIGESTS, instance["window"], instance["window_start"],
                                        channels, MAX_CHAIN_DEPTH)
            self._digested[key] = now
            made = int(status.split()[-1])
            if made:
                log.info("leadership digests for the %s window from %s: %d", key[0], iso(key[1]), made)

    async def stop(self) -> None:
        """Cancel the running batch and release its unfinished rows (due again at once)."""
        if self._batch is not None and not self._batch.done():
            self._batch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._batch
        if self._unfinished:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    async with self._pool.acquire() as conn:
                        await conn.execute(notifications_sql.RELEASE, list(self._unfinished))
            self._unfinished.clear()

    async def _deliver(self, rows: list[asyncpg.Record], channels: Channels,
                       users: dict[Any, asyncpg.Record]) -> None:
        # NOTE: imported here, not at the top: aiohttp's import takes ~0.2 s of every start and
        # only deliveries need it (a worker warms it off the loop once it is ready).
        import aiohttp

        from meshfast.aiohttp_client import GuardedResolver

        zone = calendar_zone()
        limit = asyncio.Semaphore(CONCURRENCY)
        resolver = None if channels.webhook_local else GuardedResolver()
        connector = aiohttp.TCPConnector(limit=CONCURRENCY, resolver=resolver, force_close=True)
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def one(row: asyncpg.Record) -> None:
                async with limit:
                    try:
                        await self._attempt(row, channels, users.get(row["user_id"]), zone, session)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        # The row stays claimed: due again when its lease ends.
                        log.exception("notification %s: recording the attempt failed", row["delivery_id"])
                    self._unfinished.discard(row["id"])

            await asyncio.gather(*(one(r) for r in rows))

    async def _attempt(self, row: asyncpg.Record, channels: Channels, user: asyncpg.Record | None,
                       zone: dt.tzinfo, session: aiohttp.ClientSession) -> None:
        delivery_id = str(row["delivery_id"])
        try:
            message = (digest_message if row["action"] == "digest" else notify_message)(row, user, zone)
        except Exception as exc:  # a row this code cannot read: say so rather than retry for a day
            await self._finish(row, "skipped", f"cannot build the message: {_error_text(exc)}")
            return
        if channels.problem is not None:
            error: str | None = channels.problem
        elif row["channel"] == "webhook":
            if channels.webhook_url is None or channels.webhook_secret is None:
                await self._finish(row, "skipped", NOT_CONFIGURED.format("the webhook"))
                return
            error = await self._post(session, channels, message, delivery_id)
        elif row["channel"] == "email":
            if channels.smtp is None:
                await self._finish(row, "skipped", NOT_CONFIGURED.format("the SMTP relay"))
                return
            if not message.to:
                await self._finish(row, "skipped", "the recipient has no email address (user deleted?)")
                return
            error = await self._mail(channels.smtp, message, delivery_id)
        else:
            await self._finish(row, "skipped", f"unknown channel {row['channel']!r}")
            return
        if error is None:
            await self._finish(row, "delivered", None)
            log.info("notification %s delivered (%s %s, rule %s, attempt %d)", delivery_id, row["action"],
                     row["channel"], row["rule_id"], row["attempts"])
            return
        delay_s = self.settings.retry_delay_s(row["attempts"])
        async with self._pool.acquire() as conn:
            status = await conn.fetchval(notifications_sql.MARK_FAILURE, row["id"], row["attempts"], delay_s,
                                         self.settings.give_up_s, error)
        if status == "failed":
            log.warning("notification %s failed for good after %d attempts: %s", delivery_id, row["attempts"], error)
        else:
            log.warning("notification %s attempt %d failed (%s); next in %.0f s", delivery_id, row["attempts"],
                        error, delay_s)

    async def _finish(self, row: asyncpg.Record, status: str, why: str | None) -> None:
        async with self._pool.acquire() as conn:
            if status == "delivered":
                await conn.execute(notifications_sql.MARK_DELIVERED, row["id"])
            else:
                await conn.execute(notifications_sql.MARK_SKIPPED, row["id"], why)
                log.info("notification %s skipped: %s", row["delivery_id"], why)

    async def _post(self, session: aiohttp.ClientSession, channels: Channels, message: Message,
                    delivery_id: str) -> str | None:
        """One webhook attempt: None when the receiver answered 2xx, else why not."""
        assert channels.webhook_url is not None and channels.webhook_secret is not None
        body = json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False).encode()
        headers = {"content-type": "application/json", "user-agent": WEBHOOK_USER_AGENT,
                   "x-meshfast-delivery": delivery_id,
                   "x-meshfast-signature": signature(channels.webhook_secret, body)}
        try:
            if not channels.webhook_local:
                host = urlsplit(channels.webhook_url).hostname or ""
                with contextlib.suppress(ValueError):  # a name: the guarded resolver checks it
                    if forbidden_address(host.strip("[]")):
                        raise ForbiddenAddress("the webhook's address is not public (set webhook_local)")
            async with session.post(channels.webhook_url, data=body, headers=headers,
                                    allow_redirects=False) as response:
                if 200 <= response.status < 300:
                    return None
                return f"the receiver answered HTTP {response.status}"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, ForbiddenAddress) else exc
            return _error_text(cause)

    async def _mail(self, smtp: Smtp, message: Message, delivery_id: str) -> str | None:
        assert message.to is not None
        try:
            await asyncio.to_thread(_send_mail, smtp, message.to, message, delivery_id, self.settings.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _error_text(exc)
        return None
