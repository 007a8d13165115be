"""``/admin/notifications``: the channels spend rules notify through, and the deliveries.

One webhook (its URL held to a provider ``base_url``'s rules, SSRF refused unless
``webhook_local``; its HMAC secret sealed) and one SMTP relay (its password sealed). Neither
secret is ever answered, logged or audited: the answers say ``webhook_secret_set`` and
``password_set``. A write is one transaction with its audit row. The delivery loop that reads
these is :mod:`meshfast.notify`.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Annotated, Any
from urllib.parse import parse_qs

import asyncpg
import msgspec
from msgspec import UNSET, Meta, UnsetType

from meshfast import errors, validate
from meshfast.sealing import open_sealed, seal
from meshfast.store import notifications as notifications_sql
from meshfast.store import sql
from meshfast.validate import ApiKey, Email, Label, Name, Url

# The associated data of each sealed secret: a sealed value copied into the other column does not open.
WEBHOOK_SECRET_AD = "notifications:webhook_secret"
SMTP_PASSWORD_AD = "notifications:smtp_password"
MAX_PAGE_SIZE = 500
CHANNELS = ("webhook", "email")
STATUSES = ("pending", "delivered", "failed", "skipped")
ACTIONS = ("notify", "digest")


class SmtpBody(msgspec.Struct, forbid_unknown_fields=True):
    """The SMTP relay. ``password`` left out keeps the stored one, ``null`` clears it."""

    host: Name
    port: Annotated[int, Meta(ge=1, le=65535)]
    sender: Email = msgspec.field(name="from")
    username: Label | None = None
    password: ApiKey | None | UnsetType = UNSET
    # STARTTLS after connecting (port 465 always speaks TLS from the start).
    starttls: bool = False


class NotificationsBody(msgspec.Struct, forbid_unknown_fields=True):
    """``PUT /admin/notifications``: a field left out is kept, ``null`` clears it."""

    webhook_url: Url | None | UnsetType = UNSET
    # The HMAC-SHA256 key of X-Meshfast-Signature.
    webhook_secret: ApiKey | None | UnsetType = UNSET
    webhook_local: bool | UnsetType = UNSET
    smtp: SmtpBody | None | UnsetType = UNSET


_DELIVERY_QUERY = frozenset({"page", "page_size", "status", "channel", "rule_id", "user_id", "action"})


def _iso(moment: dt.datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _usd(nano: int) -> float:
    return round(nano / 1e9, 9)


def settings_json(row: asyncpg.Record | None) -> dict[str, Any]:
    """The channels as the API shows them: whether each secret is set, never the secret."""
    if row is None:
        return {"webhook_url": None, "webhook_local": False, "webhook_secret_set": False, "smtp": None,
                "version": 0, "updated_at": None}
    smtp = None
    if row["smtp_host"] is not None:
        smtp = {"host": row["smtp_host"], "port": row["smtp_port"], "from": row["smtp_from"],
                "username": row["smtp_username"], "starttls": row["smtp_starttls"],
                "password_set": row["smtp_password_sealed"] is not None}
    return {"webhook_url": row["webhook_url"], "webhook_local": row["webhook_local"],
            "webhook_secret_set": row["webhook_secret_sealed"] is not None, "smtp": smtp,
            "version": row["version"], "updated_at": _iso(row["updated_at"])}


def _printable(value: str, field: str, problems: list[str]) -> str:
    value = value.strip()
    if not value:
        problems.append(f"{field} is required")
    elif not value.isprintable() or any(c.isspace() for c in value):
        problems.append(f"{field} may not contain spaces, control characters or line breaks")
    return value


def _address(value: str, field: str, problems: list[str]) -> str:
    value = _printable(value, field, problems)
    if value and "@" not in value:
        problems.append(f"{field} is not a valid address")
    return value


def _parse(query_string: str | None) -> dict[str, str]:
    """A query string's parameters (the last of a repeated one), as /admin/audit reads them."""
    try:
        return {k: v[-1] for k, v in parse_qs(query_string or "").items()}
    except ValueError:
        raise errors.InvalidRequest("malformed query string") from None


def _int(value: str | None, name: str, low: int, high: int, default: int) -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise errors.InvalidRequest(f"{name} must be an integer") from None
    if not low <= number <= high:
        raise errors.InvalidRequest(f"{name} must be between {low} and {high}")
    return number


def open_secret(master_key: bytes, ad: str, sealed: bytes | None, nonce: bytes | None) -> str | None:
    if sealed is None or nonce is None:
        return None
    return open_sealed(master_key, ad, sealed, nonce)


class NotificationsAdmin:
    """The admin plane's side of notifications (bodies decoded by the plane's handlers)."""

    def __init__(self, pool: asyncpg.Pool, master_key: bytes) -> None:
        self._pool = pool
        self._master_key = master_key

    async def get(self) -> dict[str, Any]:
        async with self._pool.acquire() as conn:
            return settings_json(await conn.fetchrow(notifications_sql.SELECT_SETTINGS))

    async def put(self, actor: str, body: NotificationsBody) -> dict[str, Any]:
        """Merge ``body`` into the stored channels, check the result as a whole (every problem
        listed), and store it with its audit row in one transaction."""
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                await conn.execute(notifications_sql.ENSURE_SETTINGS_ROW)
                current = await conn.fetchrow(notifications_sql.SETTINGS_FOR_UPDATE)
                args, detail = self._merge(current, body)
                row = await conn.fetchrow(notifications_sql.UPDATE_SETTINGS, *args)
                await conn.execute(sql.INSERT_AUDIT, actor, "update_notifications", "notifications",
                                   json.dumps(detail))
        return settings_json(row)

    def _merge(self, current: asyncpg.Record, body: NotificationsBody) -> tuple[tuple[Any, ...], dict[str, Any]]:
        problems: list[str] = []
        url = current["webhook_url"] if body.webhook_url is UNSET else body.webhook_url
        local = current["webhook_local"] if body.webhook_local is UNSET else body.webhook_local
        if url is not None:
            url = url.strip()
            problem = validate.url_problem(url, "webhook_url", local=local)
            if problem is not None:
                problems.append(problem)
        secret_sealed, secret_nonce = current["webhook_secret_sealed"], current["webhook_secret_nonce"]
        if body.webhook_secret is None:
            secret_sealed = secret_nonce = None
        elif body.webhook_secret is not UNSET:
            if not body.webhook_secret:
                problems.append("webhook_secret may not be empty (null clears it)")
            secret_sealed, secret_nonce = seal(self._master_key, WEBHOOK_SECRET_AD, body.webhook_secret)
        if url is not None and secret_sealed is None:
            problems.append("webhook_secret is required with webhook_url (deliveries are signed)")

        smtp = (current["smtp_host"], current["smtp_port"], current["smtp_from"], current["smtp_username"],
                current["smtp_password_sealed"], current["smtp_password_nonce"], current["smtp_starttls"])
        if body.smtp is None:
            smtp = (None, None, None, None, None, None, False)
        elif body.smtp is not UNSET:
            given = body.smtp
            host = _printable(given.host, "smtp.host", problems)
            sender = _address(given.sender, "smtp.from", problems)
            username = None if given.username is None else _printable(given.username, "smtp.username", problems)
            sealed, nonce = smtp[4], smtp[5]
            if given.password is None:
                sealed = nonce = None
            elif given.password is not UNSET:
                sealed, nonce = seal(self._master_key, SMTP_PASSWORD_AD, given.password)
            smtp = (host, given.port, sender, username, sealed, nonce, given.starttls)
        if problems:
            raise errors.InvalidRequest("; ".join(problems), errors=problems)
        # NOTE: what the audit keeps: which secrets changed, never their values.
        detail = {"webhook_url": url, "webhook_local": local,
                  "webhook_secret_changed": body.webhook_secret is not UNSET,
                  "smtp_host": smtp[0], "smtp_port": smtp[1], "smtp_from": smtp[2],
                  "smtp_password_changed": body.smtp is None or (
                      body.smtp is not UNSET and body.smtp.password is not UNSET)}
        return (url, local, secret_sealed, secret_nonce, *smtp), detail

    async def deliveries(self, query_string: str | None) -> dict[str, Any]:
        """``GET /admin/notifications/deliveries``: the outbox's notifications and digests, newest
        first, filtered by status, channel, rule, person and action, paged as the audit log."""
        raw = validate.query(_parse(query_string), _DELIVERY_QUERY)
        for name, allowed in (("status", STATUSES), ("channel", CHANNELS), ("action", ACTIONS)):
            if raw.get(name) is not None and raw[name] not in allowed:
                raise errors.InvalidRequest(f"{name} must be one of {', '.join(allowed)}")
        user_id = None
        if raw.get("user_id"):
            try:
                user_id = uuid.UUID(raw["user_id"])
            except ValueError:
                raise errors.InvalidRequest("user_id must be a UUID") from None
        page = _int(raw.get("page"), "page", 1, 1_000_000, 1)
        page_size = _int(raw.get("page_size"), "page_size", 1, MAX_PAGE_SIZE, 50)
        filters = (raw.get("status"), raw.get("channel"), raw.get("rule_id"), user_id, raw.get("action"))
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(notifications_sql.LIST_DELIVERIES, *filters, page_size, (page - 1) * page_size)
            total = await conn.fetchval(notifications_sql.COUNT_DELIVERIES, *filters)
        return {"deliveries": [_delivery_json(r) for r in rows], "total": int(total), "page": page,
                "page_size": page_size}


def _delivery_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "delivery_id": str(row["delivery_id"]), "rule_id": row["rule_id"], "entry": row["entry"],
        "user_id": str(row["user_id"]), "action": row["action"], "channel": row["channel"],
        "window": row["window"], "window_start": _iso(row["window_start"]),
        "threshold_usd": _usd(row["threshold_nano"]), "spend_usd": _usd(row["spend_nano"]),
        "status": row["status"], "attempts": row["attempts"], "last_error": row["last_error"],
        "next_attempt_at": _iso(row["next_attempt_at"]) if row["status"] == "pending" else None,
        "created_at": _iso(row["created_at"]), "delivered_at": _iso(row["delivered_at"]),
    }
