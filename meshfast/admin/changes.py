"""The governed lifecycle of controls (API.md "Governed lifecycle"): approvals, scheduled
activation, and saved vs enforced revisions.

A write of a control (a kind of :mod:`meshfast.admin.controls`) goes through :meth:`Lifecycle.decide`
in the write's transaction:

- a business-unit administrator's (a scoped caller's) write that relaxes the control is queued:
  a ``changes`` row holding the exact proposed control, the fingerprint of the control it was
  written against and the digest of what is proposed (202 ``{change_id, status: "pending"}``);
  the same requester's next write of the same control edits that row (a new digest);
- otherwise it is accepted as a new revision of the control: enforced at once (the live table
  written in the same transaction, the config sequence bumped) or, with ``activate_at``,
  ``scheduled``.

A platform administrator approves a pending change (the exact body reviewed, if the control has
not changed since: :meth:`Lifecycle.approve`) or rejects it with a comment. The leader's chore
(:meth:`Lifecycle.tick`, every half second) expires pending changes past their TTL and applies the
scheduled revisions that are due, each re-checked against the database as it is then: a revision
that no longer passes is ``failed`` with its error, and the enforced one stays. Every step is
audited in its own transaction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import uuid
import zoneinfo
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec

from meshfast import errors, validate
from meshfast.admin import controls
from meshfast.admin.controls import ControlKind
from meshfast.store import changes as changes_sql
from meshfast.store import sql

if TYPE_CHECKING:  # routes import the admin service, which imports this module
    from meshfast.admin.routes import Actor

log = logging.getLogger("meshfast.changes")

ENV_CHANGE_TTL = "MESHFAST_CHANGE_TTL_S"
DEFAULT_CHANGE_TTL_S = 7 * 24 * 3600
ENV_CALENDAR_TZ = "MESHFAST_CALENDAR_TZ"
LOCAL_MIDNIGHT = "local-midnight"
STATUSES = ("pending", "approved", "rejected", "expired", "applied", "failed", "superseded")
MAX_COMMENT = 2000
MAX_PAGE_SIZE = 200



# --- pure helpers -------------------------------------------------------------------------------


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def fingerprint(state: Any) -> str:
    """The version of a control a change is written against: its stored state's hash ("absent"
    when there is none), so any write of the control since makes the change stale."""
    return "absent" if state is None else hashlib.sha256(canonical(state).encode()).hexdigest()


def _moment(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def change_digest(kind: str, target: str, action: str, body: Any, activate_at: dt.datetime | None) -> str:
    """What an approver reviews: sha256 of the canonical kind, target, action, body and activate_at."""
    return hashlib.sha256(canonical([kind, target, action, body, _moment(activate_at)]).encode()).hexdigest()


class RejectBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /admin/changes/{id}/reject``: why (required; 400 ``comment_required`` without)."""

    comment: str | None = None


def _zone(name: str | None) -> dt.tzinfo:
    try:
        return zoneinfo.ZoneInfo(name) if name else dt.UTC
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return dt.UTC


def resolve_activate_at(value: Any, zone: str | None, now: dt.datetime) -> dt.datetime | None:
    """``activate_at`` as an instant: an RFC 3339 time with its offset, or ``"local-midnight"``
    (the next midnight in ``zone``, an IANA name; UTC when None). None when not given; 400 when
    malformed, without an offset, or not in the future."""
    if value is None:
        return None
    if value == LOCAL_MIDNIGHT:
        tz = _zone(zone)
        local = now.astimezone(tz)
        day = local.date() + dt.timedelta(days=1)
        # NOTE: a zone whose midnight a DST change skips opens at the first instant after it.
        midnight = dt.datetime.combine(day, dt.time(0, 0), tzinfo=tz)
        return midnight.astimezone(dt.UTC)
    if not isinstance(value, str):
        raise errors.InvalidRequest('activate_at must be an RFC 3339 time or "local-midnight"')
    try:
        moment = dt.datetime.fromisoformat(value.strip().replace("z", "Z"))
    except ValueError:
        raise errors.InvalidRequest('activate_at must be an RFC 3339 time or "local-midnight"') from None
    if moment.tzinfo is None or "T" not in value.upper():
        raise errors.InvalidRequest("activate_at needs a date, a time and an offset (RFC 3339)")
    if moment <= now:
        raise errors.InvalidRequest("activate_at is in the past")
    if moment > validate.LATEST:
        raise errors.InvalidRequest(f"activate_at must be before {validate.LATEST.date()}")
    return moment.astimezone(dt.UTC)


def change_unit(actor_units: frozenset[str] | None, control_units: set[str]) -> str | None:
    """The business unit a change concerns: the actor's when it has exactly one, else a unit the
    control names (one of the actor's first), else none (platform-wide)."""
    if actor_units is not None and len(actor_units) == 1:
        return next(iter(actor_units))
    mine = sorted(control_units & set(actor_units or ()))
    if mine:
        return mine[0]
    return min(control_units) if control_units else None


def change_json(row: asyncpg.Record) -> dict[str, Any]:
    body = row["body"]
    return {"id": str(row["id"]), "kind": row["kind"], "target": row["target"], "action": row["action"],
            "body": json.loads(body) if isinstance(body, str) else body, "base_version": row["base_version"],
            "digest": row["digest"], "status": row["status"], "requested_by": row["requested_by"],
            "requested_by_admin_id": None if row["requested_by_admin_id"] is None
            else str(row["requested_by_admin_id"]),
            "business_unit": row["business_unit"], "activate_at": _moment(row["activate_at"]),
            "comment": row["comment"], "decided_by": row["decided_by"], "created_at": _moment(row["created_at"]),
            "decided_at": _moment(row["decided_at"]), "expires_at": _moment(row["expires_at"])}


@dataclasses.dataclass(slots=True)
class Outcome:
    """What became of a write: ``enforced`` (live now), ``scheduled`` (a revision waiting for
    ``activate_at``) or ``pending`` (queued for approval as ``change``)."""

    status: str
    revision: int | None = None
    activate_at: dt.datetime | None = None
    change: dict[str, Any] | None = None
    unit: str | None = None
    # The control as written (stored form; None for a delete).
    body: Any = None
    # The requester's pending changes of the control this write superseded.
    superseded: list[str] = dataclasses.field(default_factory=list)

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    def reply(self) -> dict[str, Any]:
        """A pending write's 202 body."""
        assert self.change is not None
        return {"change_id": self.change["id"], "status": "pending", "digest": self.change["digest"]}

    def detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {"revision": self.revision}
        if self.superseded:
            out["superseded_changes"] = self.superseded
        if self.status == "scheduled":
            out.update(scheduled=True, activate_at=_moment(self.activate_at))
        return out


async def audit(conn: asyncpg.Connection, actor: str, action: str, target: str | None, detail: dict[str, Any],
                unit: str | None) -> None:
    await conn.execute(changes_sql.INSERT_AUDIT_UNIT, actor, action, target, json.dumps(detail), unit)


def _admin_id(actor: Actor) -> uuid.UUID | None:
    owner = actor.owner_admin_id
    try:
        return None if owner is None else uuid.UUID(owner)
    except ValueError:
        return None


def is_platform(actor: Actor) -> bool:
    return actor.is_super and not actor.scoped


async def record_enforced(conn: asyncpg.Connection, kind: str, target: str, action: str, body: Any, by: str) -> int:
    """A revision for a control another path wrote to its live table in this transaction (a
    registry file): enforced at once, the previous one superseded."""
    revision = int(await conn.fetchval(changes_sql.NEXT_REVISION, kind, target))
    await conn.execute(changes_sql.SUPERSEDE_ENFORCED, kind, target)
    await conn.execute(changes_sql.INSERT_REVISION, kind, target, revision, action,
                       None if body is None else json.dumps(body), "enforced", None, None, by)
    return revision


async def direction(conn: asyncpg.Connection, kind: ControlKind, target: str, old: Any,
                    new: Any) -> controls.Direction:
    """The kind's classification, made ``RELAX`` when the change loosens a control that depends
    on this one (:attr:`ControlKind.loosens_others`)."""
    found = kind.classify(old, new)
    if found == controls.TIGHTEN and kind.loosens_others is not None and \
            await kind.loosens_others(conn, target, old, new):
        return controls.RELAX
    return found


# --- the lifecycle ------------------------------------------------------------------------------

Rebuild = Callable[[int, str], Awaitable[None]]


class Lifecycle:
    """Queue, revisions and activation of every registered control kind (one per worker)."""

    def __init__(self, pool: asyncpg.Pool, after_write: Rebuild, ttl_s: float | None = None,
                 calendar_tz: str | None = None) -> None:
        self._pool = pool
        self._after_write = after_write
        self.ttl_s = ttl_s if ttl_s is not None else float(os.environ.get(ENV_CHANGE_TTL) or DEFAULT_CHANGE_TTL_S)
        self.calendar_tz = calendar_tz if calendar_tz is not None else (os.environ.get(ENV_CALENDAR_TZ) or "UTC")

    # --- a write ------------------------------------------------------------------------------

    async def write(self, actor: Actor, kind_name: str, target: str, action: str, proposed: Any,
                    activate_at: Any, *, audit_action: str,
                    precheck: Callable[[asyncpg.Connection], Awaitable[None]] | None = None) -> Outcome:
        """A control's write by ``actor`` in one transaction: ``precheck`` (the route's own
        conditions: If-Match, existence), the kind's check, then :meth:`decide`. Audited as
        ``audit_action`` when accepted (``change.submit`` when queued)."""
        kind = controls.kind_of(kind_name)
        seq = None
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                if kind.registry:
                    await conn.execute(sql.LOCK_REGISTRY)
                if precheck is not None:
                    await precheck(conn)
                body = await kind.check(conn, target, action, proposed)
                when = await self.when(conn, actor, kind, target, body, activate_at)
                outcome = await self.decide(conn, actor, kind, target, action, body, when)
                if not outcome.pending:
                    seq = await self._bump(conn, kind.change)
                    await audit(conn, actor.name, audit_action, target, outcome.detail(), outcome.unit)
        if seq is not None:
            await self._after_write(seq, kind.change)
        return outcome

    async def when(self, conn: asyncpg.Connection, actor: Actor, kind: ControlKind, target: str, body: Any,
                   activate_at: Any) -> dt.datetime | None:
        """``activate_at`` resolved; ``local-midnight`` in the zone of the control's unit (the
        actor's when it has one, else the unit the control names, else the calendar's)."""
        if activate_at is None:
            return None
        zone = self.calendar_tz
        if activate_at == LOCAL_MIDNIGHT:
            units = await kind.units(conn, target, body)
            unit = change_unit(actor.business_units, units)
            if unit is not None:
                zones = {r["name"]: r["timezone"] for r in await conn.fetch(changes_sql.UNIT_TIMEZONES, [unit])}
                zone = zones.get(unit, zone)
        return resolve_activate_at(activate_at, zone, dt.datetime.now(dt.UTC))

    async def decide(self, conn: asyncpg.Connection, actor: Actor, kind: ControlKind, target: str, action: str,
                     body: Any, when: dt.datetime | None) -> Outcome:
        """In the caller's transaction (after the kind's check): queue a scoped caller's relaxing
        write, else accept it as a revision (enforced now, or scheduled for ``when``)."""
        old = await kind.load(conn, target)
        units = await kind.units(conn, target, old) | await kind.units(conn, target, body)
        unit = change_unit(actor.business_units, units)
        if actor.scoped and await direction(conn, kind, target, old, body) == controls.RELAX:
            change = await self._queue(conn, actor, kind.name, target, action, body, fingerprint(old), when, unit)
            return Outcome("pending", activate_at=when, change=change, unit=unit, body=body)
        revision = await self._accept(conn, kind, target, action, body, when, None, actor.name)
        outcome = Outcome("enforced" if when is None else "scheduled", revision, when, unit=unit, body=body)
        # The requester's own pending change of this control is overtaken by this write.
        outcome.superseded = [str(r[0]) for r in await conn.fetch(changes_sql.SUPERSEDE_PENDING, kind.name, target,
                                                                  actor.id)]
        return outcome

    async def _accept(self, conn: asyncpg.Connection, kind: ControlKind, target: str, action: str, body: Any,
                      when: dt.datetime | None, change_id: uuid.UUID | None, by: str) -> int:
        """Stores a revision, enforced now or scheduled for ``when``; a revision still waiting is
        superseded by it (the newest saved revision is the one that goes live)."""
        await conn.execute(changes_sql.SUPERSEDE_SCHEDULED, kind.name, target)
        if when is None:
            await kind.apply(conn, target, action, body)
            await conn.execute(changes_sql.SUPERSEDE_ENFORCED, kind.name, target)
        revision = int(await conn.fetchval(changes_sql.NEXT_REVISION, kind.name, target))
        await conn.execute(changes_sql.INSERT_REVISION, kind.name, target, revision, action,
                           None if body is None else json.dumps(body), "enforced" if when is None else "scheduled",
                           when, change_id, by)
        return revision

    async def _queue(self, conn: asyncpg.Connection, actor: Actor, kind: str, target: str, action: str, body: Any,
                     base: str, when: dt.datetime | None, unit: str | None) -> dict[str, Any]:
        digest = change_digest(kind, target, action, body, when)
        encoded = None if body is None else json.dumps(body)
        pending = await conn.fetchval(changes_sql.PENDING_CHANGE_OF, kind, target, actor.id)
        if pending is not None:
            row = await conn.fetchrow(changes_sql.REVISE_CHANGE, pending, action, encoded, base, digest, when, unit,
                                      self.ttl_s)
        else:
            row = await conn.fetchrow(changes_sql.INSERT_CHANGE, kind, target, action, encoded, base, digest,
                                      actor.name, actor.id, _admin_id(actor), unit, when, self.ttl_s)
        change = change_json(row)
        await audit(conn, actor.name, "change.submit", target,
                    {"change_id": change["id"], "kind": kind, "action": action, "digest": digest,
                     "revised": pending is not None, "activate_at": _moment(when)}, unit)
        return change

    @staticmethod
    async def _bump(conn: asyncpg.Connection, change: str) -> int:
        seq = await conn.fetchval(sql.NEXT_CONFIG_SEQ)
        await conn.execute(sql.NOTIFY_CONFIG, f"{seq}:{change}" if change else str(seq))
        return int(seq)

    # --- reads --------------------------------------------------------------------------------

    async def revisions(self, kind: str, targets: list[str],
                        conn: asyncpg.Connection | None = None) -> dict[str, dict[str, Any]]:
        """Per target: ``saved_revision`` (the newest accepted, scheduled included),
        ``enforced_revision`` (the live one), and ``scheduled: {revision, activate_at}`` when one
        waits, ``activation_error: {revision, error}`` when the newest activation failed. A
        control written before revisions were kept has neither (null)."""
        if conn is None:
            async with self._pool.acquire() as own:
                return await self.revisions(kind, targets, own)
        out: dict[str, dict[str, Any]] = {t: {"saved_revision": None, "enforced_revision": None} for t in targets}
        for row in await conn.fetch(changes_sql.REVISION_STATES, kind, targets):
            state = out[row["target"]]
            state["saved_revision"] = row["saved_revision"]
            state["enforced_revision"] = row["enforced_revision"]
            if row["scheduled_revision"] is not None:
                state["scheduled"] = {"revision": row["scheduled_revision"],
                                      "activate_at": _moment(row["scheduled_at"])}
            if row["failed_revision"] is not None and row["failed_revision"] > (row["enforced_revision"] or 0):
                state["activation_error"] = {"revision": row["failed_revision"], "error": row["failed_error"]}
        return out

    async def list_changes(self, actor: Actor, status: str | None, page: int, page_size: int) -> dict[str, Any]:
        if status is not None and status not in STATUSES:
            raise errors.InvalidRequest(f"status must be one of {', '.join(STATUSES)}")
        units = None if actor.business_units is None else sorted(actor.business_units)
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(changes_sql.LIST_CHANGES, status, units, page_size, (page - 1) * page_size)
            total = await conn.fetchval(changes_sql.COUNT_CHANGES, status, units)
        return {"changes": [change_json(r) for r in rows], "total": int(total), "page": page,
                "page_size": page_size}

    async def get_change(self, actor: Actor, change_id: str) -> dict[str, Any]:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(changes_sql.GET_CHANGE, _change_id(change_id))
        if row is None or (actor.business_units is not None and row["business_unit"] not in actor.business_units):
            raise errors.ChangeNotFound()
        return change_json(row)

    # --- decisions ----------------------------------------------------------------------------

    async def approve(self, actor: Actor, change_id: str, if_match: str | None) -> dict[str, Any]:
        """Applies the exact change reviewed (at its ``activate_at`` when that is still ahead):
        platform administrators only, never the requester; 409 when it was edited since
        (``If-Match``: its digest), is stale (the control changed) or expired."""
        cid = _change_id(change_id)
        seq = None
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                # NOTE: the registry lock before the change's row, in the order a write takes them
                # (a requester editing its change while it is approved must not deadlock).
                await conn.execute(sql.LOCK_REGISTRY)
                row = await self._decidable(conn, actor, cid, if_match)
                kind = controls.kind_of(row["kind"])
                target, action = row["target"], row["action"]
                body = json.loads(row["body"]) if isinstance(row["body"], str) else row["body"]
                if fingerprint(await kind.load(conn, target)) != row["base_version"]:
                    raise errors.VersionConflict("the control changed since this change was proposed")
                await kind.check(conn, target, action, body)  # still valid against the database as it is
                when = row["activate_at"]
                if when is not None and when <= dt.datetime.now(dt.UTC):
                    when = None
                revision = await self._accept(conn, kind, target, action, body, when, cid, actor.name)
                decided = await conn.fetchrow(changes_sql.DECIDE_CHANGE, cid,
                                              "applied" if when is None else "approved", actor.name, None)
                unit = row["business_unit"]
                await audit(conn, actor.name, "change.approve", target,
                            {"change_id": str(cid), "kind": kind.name, "digest": row["digest"],
                             "revision": revision, "activate_at": _moment(when)}, unit)
                if when is None:
                    await audit(conn, actor.name, "control.activate", target,
                                {"kind": kind.name, "revision": revision, "change_id": str(cid)}, unit)
                    seq = await self._bump(conn, kind.change)
        if seq is not None:
            await self._after_write(seq, kind.change)
        return {**change_json(decided), "revision": revision}

    async def reject(self, actor: Actor, change_id: str, comment: Any) -> dict[str, Any]:
        """Rejects a pending change, saying why (400 ``comment_required`` without): platform
        administrators only, never the requester."""
        cid = _change_id(change_id)
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                row = await self._decidable(conn, actor, cid, None, expiry=False)
                if not isinstance(comment, str) or not comment.strip():
                    raise errors.CommentRequired('a rejection says why: {"comment": "..."}')
                if len(comment) > MAX_COMMENT:
                    raise errors.InvalidRequest(f"comment is at most {MAX_COMMENT} characters")
                decided = await conn.fetchrow(changes_sql.DECIDE_CHANGE, cid, "rejected", actor.name,
                                              comment.strip())
                await audit(conn, actor.name, "change.reject", row["target"],
                            {"change_id": str(cid), "kind": row["kind"], "comment": comment.strip()},
                            row["business_unit"])
        return change_json(decided)

    async def _decidable(self, conn: asyncpg.Connection, actor: Actor, cid: uuid.UUID, if_match: str | None,
                         expiry: bool = True) -> asyncpg.Record:
        row = await conn.fetchrow(changes_sql.CHANGE_FOR_UPDATE, cid)
        if row is None or (actor.business_units is not None and row["business_unit"] not in actor.business_units):
            raise errors.ChangeNotFound()
        if row["requested_by_id"] == actor.id or (
                row["requested_by_admin_id"] is not None and str(row["requested_by_admin_id"]) == actor.owner_admin_id):
            raise errors.SelfApproval("the requester of a change cannot decide it")
        if not is_platform(actor):
            raise errors.Forbidden("only a platform administrator decides changes")
        if if_match is not None and if_match.strip() not in ("*", row["digest"], f'"{row["digest"]}"'):
            raise errors.ChangeModified("the change was edited since you reviewed it")
        if row["status"] == "expired" or (row["status"] == "pending" and row["expired"] and expiry):
            raise errors.ChangeExpired()
        if row["status"] != "pending":
            raise errors.ChangeNotPending(f"the change is {row['status']}")
        return row

    # --- the leader's chore -------------------------------------------------------------------

    async def tick(self) -> None:
        """Expires pending changes past their TTL and activates due scheduled revisions."""
        await self.expire()
        await self.activate_due()

    async def expire(self) -> int:
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                rows = await conn.fetch(changes_sql.EXPIRE_CHANGES)
                for row in rows:
                    await audit(conn, "meshfast", "change.expire", row["target"],
                                {"change_id": str(row["id"]), "kind": row["kind"]}, row["business_unit"])
        return len(rows)

    async def activate_due(self) -> int:
        """Each due revision in its own transaction: applied and enforced, or failed with its
        error (the enforced revision stays); both audited with it."""
        done = 0
        changed: set[str] = set()
        seq = None
        while True:
            async with self._pool.acquire() as conn:
                async with conn.transaction():
                    rows = await conn.fetch(changes_sql.DUE_REVISIONS)
                    if not rows:
                        break
                    row = rows[0]
                    kind = controls.KINDS.get(row["kind"])
                    if kind is not None and kind.registry:
                        await conn.execute(sql.LOCK_REGISTRY)
                    outcome = await self._activate(conn, kind, row)
                    if outcome:
                        assert kind is not None
                        seq = await self._bump(conn, kind.change)
                        changed.add(kind.change)
            done += 1
        if seq is not None:
            await self._after_write(seq, changed.pop() if len(changed) == 1 else "")
        return done

    async def _activate(self, conn: asyncpg.Connection, kind: ControlKind | None, row: asyncpg.Record) -> bool:
        target, revision = row["target"], row["revision"]
        body = json.loads(row["body"]) if isinstance(row["body"], str) else row["body"]
        detail = {"kind": row["kind"], "revision": revision,
                  "change_id": None if row["change_id"] is None else str(row["change_id"])}
        try:
            if kind is None:
                raise errors.InvalidRequest(f"no control kind {row['kind']!r} in this version")
            async with conn.transaction():  # a savepoint: a refused apply leaves nothing behind
                await kind.check(conn, target, row["action"], body)
                await kind.apply(conn, target, row["action"], body)
        except (errors.MeshfastError, asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as exc:
            # NOTE: a refusal of the database (a constraint) fails the revision too: retried, it
            # would hold the queue of due revisions forever.
            if isinstance(exc, errors.MeshfastError):
                error = "; ".join(exc.extra.get("errors") or []) or exc.detail or exc.code
            else:
                error = str(exc)
            await conn.execute(changes_sql.FAIL_REVISION, row["kind"], target, revision, error)
            if row["change_id"] is not None:
                await conn.execute(changes_sql.SETTLE_CHANGE, row["change_id"], "failed")
            units = await kind.units(conn, target, body) if kind is not None else set()
            await audit(conn, "meshfast", "control.activation_failed", target, {**detail, "error": error},
                        change_unit(None, units))
            log.warning("scheduled %s %s revision %d not activated: %s", row["kind"], target, revision, error)
            return False
        await conn.execute(changes_sql.SUPERSEDE_ENFORCED, row["kind"], target)
        await conn.execute(changes_sql.ENFORCE_REVISION, row["kind"], target, revision)
        if row["change_id"] is not None:
            await conn.execute(changes_sql.SETTLE_CHANGE, row["change_id"], "applied")
        await audit(conn, row["created_by"], "control.activate", target, detail,
                    change_unit(None, await kind.units(conn, target, body)))
        return True


def _change_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise errors.ChangeNotFound() from None
