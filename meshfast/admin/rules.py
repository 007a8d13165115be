"""The admin side of spend rules: ``/admin/rules`` (CRUD with ETag and If-Match), the global
enforcement switch, the dry-run, and a registry file's ``rules``. Every write is one
:meth:`AdminService._write` transaction (config bump, NOTIFY, audit), so every worker has it
within a second; rule writes hold the registry lock, so two of them (or a rule and a model
rename) cannot each pass the checks and together leave unordered caps or a dangling name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec

from meshfast import errors, rules, snapshot
from meshfast.admin.changes import Outcome, record_enforced
from meshfast.store import onboarding as onboarding_sql
from meshfast.store import rules as rules_sql

if TYPE_CHECKING:  # the admin service imports this module
    from meshfast.admin.routes import Actor
    from meshfast.admin.service import AdminService


# A draft rule (stored form) -> the core's dry-run answer, from the worker serving the request.
DryRun = Callable[[dict[str, Any]], bytes]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _moment(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def stored_body(value: Any) -> Any:
    """A stored rule's body (jsonb, as text or decoded)."""
    return _json(value)


def rule_json(row: asyncpg.Record) -> dict[str, Any]:
    """A stored rule as the API answers it: the authored shape plus version and timestamps."""
    return {**_json(row["body"]), "version": row["version"], "created_at": _moment(row["created_at"]),
            "updated_at": _moment(row["updated_at"])}


def decode_body(body: bytes) -> Any:
    """A rule body as JSON (any shape: :func:`rules.check` names what is wrong with it)."""
    if not body.strip():
        raise errors.InvalidRequest("request body is empty")
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise errors.InvalidRequest(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise errors.InvalidRequest("the body nests too deeply") from None


def _without_read_only(body: Any) -> Any:
    """A rule as GET answered it may come back: version and timestamps are not the author's."""
    if isinstance(body, dict):
        return {k: v for k, v in body.items() if k not in rules.READ_ONLY}
    return body


def _activate_at(draft: Any) -> tuple[Any, Any]:
    """A rule body without its ``activate_at`` (when the write goes live; not part of the rule)."""
    if isinstance(draft, dict) and "activate_at" in draft:
        draft = dict(draft)
        return draft, draft.pop("activate_at")
    return draft, None


def invalid(problems: list[str]) -> errors.MeshfastError:
    return errors.InvalidRule("; ".join(problems), errors=problems)


async def known_models(conn: asyncpg.Connection) -> dict[str, str]:
    """Every model name and alias -> the model's name (rules name models by name)."""
    out: dict[str, str] = {}
    for row in await conn.fetch(rules_sql.MODEL_NAMES):
        out[row["name"]] = row["name"]
        for alias in row["aliases"] or ():
            out.setdefault(alias, row["name"])
    return out


async def known_users(conn: asyncpg.Connection, body: Any) -> set[str]:
    """Those of the user ids ``body`` names that exist, and its pilots that exist (marked
    ``rules.PILOT_MARK``)."""
    wanted = rules.referenced_users(body)
    known = {row[0] for row in await conn.fetch(rules_sql.KNOWN_USERS, wanted)} if wanted else set()
    pilots = rules.referenced_pilots(body)
    if pilots:
        known |= {rules.PILOT_MARK + row[0] for row in await conn.fetch(onboarding_sql.KNOWN_PILOTS, pilots)}
    return known


async def stored_rules(conn: asyncpg.Connection) -> dict[str, dict[str, Any]]:
    return {row["id"]: _json(row["body"]) for row in await conn.fetch(rules_sql.STORED_RULES)}


async def checked(conn: asyncpg.Connection, body: Any, others: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule as stored, or 400 invalid_rule listing every problem."""
    rule, problems = rules.check(body, await known_users(conn, body), await known_models(conn), others)
    if rule is None:
        raise invalid(problems)
    return rule


def _rule_id(rule_id: str) -> str:
    """A path's rule id; anything that is not a slug names no rule (and never reaches SQL)."""
    if not rules.SLUG.match(rule_id):
        raise errors.RuleNotFound()
    return rule_id


class RuleService:
    """``/admin/rules``, ``/admin/enforcement`` and ``/admin/rules/dry-run`` over the admin service."""

    def __init__(self, service: AdminService) -> None:
        self._service = service
        self._pool = service._pool
        # One dry-run at a time per worker (see dry_run).
        self._dry_runs = asyncio.Semaphore(1)

    async def _with_revisions(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rules as read, each with its ``saved_revision`` and ``enforced_revision`` (and
        ``scheduled`` / ``activation_error`` when there is one; see :meth:`Lifecycle.revisions`)."""
        states = await self._service.lifecycle.revisions("rule", [r["id"] for r in rows])
        return [{**r, **states[r["id"]]} for r in rows]

    async def list(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = [rule_json(row) for row in await conn.fetch(rules_sql.LIST_RULES)]
        return await self._with_revisions(rows)

    async def get(self, rule_id: str) -> dict[str, Any]:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(rules_sql.GET_RULE, _rule_id(rule_id))
        if row is None:
            raise errors.RuleNotFound()
        return (await self._with_revisions([rule_json(row)]))[0]

    async def _answer(self, outcome: Outcome, rule_id: str) -> dict[str, Any]:
        """A write's answer: the pending change (202), or the rule as read now (a rule whose
        creation is only scheduled: the rule as it will be, version 0)."""
        if outcome.pending:
            return outcome.reply()
        try:
            return await self.get(rule_id)
        except errors.RuleNotFound:
            states = await self._service.lifecycle.revisions("rule", [rule_id])
            return {**outcome.body, "version": 0, "created_at": None, "updated_at": None, **states[rule_id]}

    async def create(self, actor: Actor, body: bytes) -> dict[str, Any]:
        draft, activate_at = _activate_at(decode_body(body))
        rule_id = draft.get("id") if isinstance(draft, dict) else None
        target = rule_id if isinstance(rule_id, str) and rules.SLUG.match(rule_id) else ""

        async def absent(conn: asyncpg.Connection) -> None:
            if target and await conn.fetchval(rules_sql.RULE_FOR_UPDATE, target) is not None:
                raise errors.RuleExists()

        async def check_first(conn: asyncpg.Connection) -> None:
            # An invalid body answers 400 listing its problems whatever its id.
            if not target:
                await checked(conn, draft, list((await stored_rules(conn)).values()))
            await absent(conn)

        outcome = await self._service.lifecycle.write(actor, "rule", target, "create", draft, activate_at,
                                                      audit_action="create_rule", precheck=check_first)
        return await self._answer(outcome, target)

    async def update(self, actor: Actor, rule_id: str, body: bytes, if_match: str | None) -> dict[str, Any]:
        """A whole rule, only against the version in ``If-Match`` (missing 428, stale 409); the
        body's ``id``, if any, must be the path's."""
        rule_id = _rule_id(rule_id)
        if not if_match:
            raise errors.PreconditionRequired()
        draft, activate_at = _activate_at(_without_read_only(decode_body(body)))
        if isinstance(draft, dict):
            if draft.get("id", rule_id) != rule_id:
                raise invalid([f"id: the body names {rules.shown(draft.get('id'))}, the path {rule_id!r} "
                               "(a rule's id does not change)"])
            draft = {**draft, "id": rule_id}

        async def current(conn: asyncpg.Connection) -> None:
            row = await conn.fetchrow(rules_sql.RULE_FOR_UPDATE, rule_id)
            if row is None:
                raise errors.RuleNotFound()
            if if_match.strip() not in (f'"{row["version"]}"', str(row["version"]), "*"):
                raise errors.VersionConflict()

        outcome = await self._service.lifecycle.write(actor, "rule", rule_id, "update", draft, activate_at,
                                                      audit_action="update_rule", precheck=current)
        return await self._answer(outcome, rule_id)

    async def delete(self, actor: Actor, rule_id: str, activate_at: str | None = None) -> dict[str, Any]:
        rule_id = _rule_id(rule_id)

        async def exists(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(rules_sql.RULE_FOR_UPDATE, rule_id) is None:
                raise errors.RuleNotFound()

        outcome = await self._service.lifecycle.write(actor, "rule", rule_id, "delete", None, activate_at,
                                                      audit_action="delete_rule", precheck=exists)
        if outcome.pending:
            return outcome.reply()
        if outcome.status == "scheduled":
            return {"status": "scheduled", "revision": outcome.revision, "activate_at": outcome.detail()["activate_at"]}
        return {"status": "deleted"}

    async def enforcement(self) -> dict[str, Any]:
        async with self._pool.acquire() as conn:
            return {"enforce": bool(await conn.fetchval(rules_sql.GET_ENFORCEMENT))}

    async def set_enforcement(self, actor: str, body: rules.EnforcementBody) -> dict[str, Any]:
        async def work(conn: asyncpg.Connection) -> bool:
            return bool(await conn.fetchval(rules_sql.SET_ENFORCEMENT, body.enforce))

        state = await self._service._write(actor, "update_enforcement", "rules", {"enforce": body.enforce}, work,
                                           change="rules")
        return {"enforce": state}

    async def dry_run(self, body: bytes) -> msgspec.Raw:
        """What a draft rule would do now (validated as a write would be), answered by this
        worker's core from its snapshot and counters; nothing is written."""
        draft, _ = _activate_at(decode_body(body))  # a scheduled draft is tried as it stands
        async with self._pool.acquire() as conn:
            stored = await stored_rules(conn)
            rule_id = draft.get("id") if isinstance(draft, dict) else None
            rule = await checked(conn, draft, [r for i, r in stored.items() if i != rule_id])
        hook = self._service.dry_run
        if hook is None:
            raise errors.DryRunUnavailable("no core to ask in this process")
        # NOTE: the core visits every person for each entry: seconds with 50,000 people, 20 models
        # in scope and 10 entries. It releases the GIL, so in a thread the worker's loop goes on
        # serving (called on the loop, it answered nothing else, data plane included, until done);
        # one at a time, so dry-runs (the dashboard sends one per rule) never hold every thread of
        # the executor that config rebuilds use too.
        async with self._dry_runs:
            return msgspec.Raw(await asyncio.to_thread(hook, rule))


def dry_run_hook(core: Any, config: Callable[[], snapshot.Config | None],
                 pilots: Callable[[], Mapping[str, list[int]]] | None = None) -> DryRun:
    """The dry-run of a worker: its core, with the indexes of the snapshot that core has loaded
    (and that snapshot's live pilots' members, for ``population.pilots``)."""

    def run(rule: dict[str, Any]) -> bytes:
        loaded = config()
        if loaded is None:
            raise errors.DryRunUnavailable("no snapshot loaded yet")
        return rules.dry_run(core, loaded, rule, int(time.time() * 1000), None if pilots is None else pilots())

    return run


# --- model restrictions -------------------------------------------------------------------------


async def rename_model(conn: asyncpg.Connection, old: str, new: str) -> list[str]:
    """Rules name models by name: the stored rules whose scope names ``old`` now name ``new``
    (in the rename's transaction, under the registry lock), so a renamed model keeps its caps;
    left as they were, those entries would name no model and silently stop applying. The ids of
    the rules changed."""
    changed = []
    for rule_id, body in sorted((await stored_rules(conn)).items()):
        entries = body.get("entries") or []
        hits = [e for e in entries if isinstance(e.get("scope"), dict) and e["scope"].get("model") == old]
        for entry in hits:
            entry["scope"] = {**entry["scope"], "model": new}
        if hits:
            await conn.execute(rules_sql.UPDATE_RULE, rule_id, json.dumps(body))
            await record_enforced(conn, "rule", rule_id, "update", body, f"rename of model {old}")
            changed.append(rule_id)
    return changed


# --- registry files ------------------------------------------------------------------------------


def parse_file_rules(entries: list[Any]) -> list[str]:
    """A registry file's ``rules`` checked on their own (before the database: people and models
    are checked when the file is applied); every problem, each labelled with its rule."""
    problems: list[str] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        entry = _without_read_only(entry)
        label = f"rules[{i}]" + (f" ({entry.get('id')!r})" if isinstance(entry, dict) and
                                 isinstance(entry.get("id"), str) and rules.SLUG.match(entry["id"]) else "")
        problems.extend(f"{label}: {p}" for p in rules.validate(entry, None, None, set(), []))
        rule_id = entry.get("id") if isinstance(entry, dict) else None
        if isinstance(rule_id, str) and rule_id in seen:
            problems.append(f"{label}: a rule of that id is listed twice")
        if isinstance(rule_id, str):
            seen.add(rule_id)
    return problems


def parse_file_restrictions(value: Any) -> list[str]:
    """A registry model's ``restrictions`` checked for shape (people may be ids or emails)."""
    if value is None:
        return []
    _, problems = rules.check_restrictions(value, None, _AnyEmail())
    return problems


class _AnyEmail(Mapping[str, str]):
    """Every email, as some user id: a file's emails are looked up when it is applied."""

    def __getitem__(self, key: str) -> str:
        return str(uuid.UUID(int=0))

    def __contains__(self, key: object) -> bool:
        return True

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


@dataclasses.dataclass(slots=True)
class RegistryPlan:
    """What a registry file does to rules and model restrictions, checked against the database."""

    rules: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # model name -> restrictions as stored (None clears them)
    restrictions: dict[str, dict[str, Any] | None] = dataclasses.field(default_factory=dict)


async def plan_registry(conn: asyncpg.Connection, file_rules: list[Any], restrictions: Mapping[str, Any],
                        file_models: Mapping[str, str]) -> tuple[RegistryPlan, list[str]]:
    """The file's rules and restrictions in stored form, and every problem: people and models
    that do not exist (the file's own models count), unordered caps among the file's rules and
    against the stored rules it leaves alone."""
    plan = RegistryPlan()
    problems: list[str] = []
    models = {**await known_models(conn), **file_models}
    drafts = [_without_read_only(r) for r in file_rules]
    users = await known_users(conn, {"rules": drafts, "restrictions": list(restrictions.values())})
    for draft in drafts:
        rule, found = rules.check(draft, users, models, [])
        problems.extend(f"rule {draft.get('id')!r}: {p}" for p in found)
        if rule is not None:
            plan.rules.append(rule)
    if not problems:
        stored = await stored_rules(conn)
        named = {r["id"] for r in plan.rules}
        kept = [r for i, r in stored.items() if i not in named]
        for i, rule in enumerate(plan.rules):
            problems.extend(f"rule {rule['id']!r}: {p}" for p in rules.conflicts(rule, kept + plan.rules[i + 1:]))
    emails: dict[str, str] = {}
    if any(value is not None for value in restrictions.values()):
        emails = {row["email"]: row["id"] for row in await conn.fetch(rules_sql.USER_EMAILS)}
        users |= set(emails.values())
    for name, value in restrictions.items():
        if value is None:
            plan.restrictions[name] = None
            continue
        stored_form, found = rules.check_restrictions(value, users, emails)
        problems.extend(f"model {name!r}: {p}" for p in found)
        plan.restrictions[name] = stored_form
    return plan, problems


async def apply_plan(conn: asyncpg.Connection, plan: RegistryPlan, enforce_rules: bool | None,
                     summary: dict[str, list[str]], by: str = "registry") -> None:
    """Write a checked plan (after the file's models, in the same transaction); each rule and
    restrictions written is a new enforced revision (by ``by``)."""
    stored = await stored_rules(conn)
    for rule in plan.rules:
        label = f"rule {rule['id']}"
        if rule["id"] not in stored:
            await conn.execute(rules_sql.INSERT_RULE, rule["id"], json.dumps(rule))
            await record_enforced(conn, "rule", rule["id"], "create", rule, by)
            summary["created"].append(label)
        elif stored[rule["id"]] == rule:
            summary["unchanged"].append(label)
        else:
            await conn.execute(rules_sql.UPDATE_RULE, rule["id"], json.dumps(rule))
            await record_enforced(conn, "rule", rule["id"], "update", rule, by)
            summary["updated"].append(label)
    if plan.restrictions:
        for row in await conn.fetch(rules_sql.RESTRICTIONS_BY_NAME, list(plan.restrictions)):
            wanted = plan.restrictions[row["name"]]
            if _json(row["restrictions"]) == wanted:
                continue
            await conn.execute(rules_sql.SET_RESTRICTIONS, row["id"], None if wanted is None else json.dumps(wanted))
            await record_enforced(conn, "restrictions", str(row["id"]), "update", wanted, by)
            label = f"model {row['name']}"
            if label in summary["unchanged"]:
                summary["unchanged"].remove(label)
            if label not in summary["created"] and label not in summary["updated"]:
                summary["updated"].append(label)
    if enforce_rules is not None:
        if bool(await conn.fetchval(rules_sql.GET_ENFORCEMENT)) == enforce_rules:
            summary["unchanged"].append("enforcement")
        else:
            await conn.execute(rules_sql.SET_ENFORCEMENT, enforce_rules)
            summary["updated"].append("enforcement")
