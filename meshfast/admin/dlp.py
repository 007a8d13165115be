"""Data protection policies (API.md "Data protection"): ``PUT /admin/dlp/policies/{name}``,
``GET /admin/dlp/policies``, ``DELETE /admin/dlp/policies/{name}``.

A policy sets an action per detector (``block``, ``pseudonymize``, ``redact`` or ``off``; a detector
it does not name is off), may add named patterns of its own, and applies to the calls its
``applies_to`` selects (models and providers by name, business units, tiers, applications and
users by id, leaders' organisations; AND across the lists, OR within one; empty: every call).
When several enabled policies apply to a call, each detector takes the strongest action among them.
The core scans what the call carries before anything is reserved or sent (meshfast._core,
``dlp.rs``): a blocking match refuses it with 400 ``sensitive_content_blocked`` naming the
detectors; redaction and pseudonymization rewrite what goes upstream.

Every problem of a body is listed at once: 400 ``invalid_policy`` with ``errors``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from meshfast import errors, validate
from meshfast._core import dlp_pattern_problem
from meshfast.store import dlp as dlp_sql

BUILT_IN = ("card", "iban", "email", "phone", "ssn", "ip", "secret")
# Found by a local detection model when one is configured (MESHFAST_DLP_MODEL_URL); a policy may
# name them either way, and without an answer from the model a call they apply to is blocked.
MODEL_DETECTORS = ("person", "address")
DETECTORS = BUILT_IN + MODEL_DETECTORS
ACTIONS = ("block", "pseudonymize", "redact", "off")
APPLIES_TO = ("models", "providers", "business_units", "tiers", "applications", "users", "leaders")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_DETECTOR = re.compile(r"[a-z0-9_-]{1,64}\Z")
MAX_CUSTOM = 100
MAX_LIST = 1000


def _invalid(problems: list[str]) -> errors.MeshfastError:
    return errors.InvalidPolicy("; ".join(problems[:5]), errors=problems[:100])


def _labels(value: Any, where: str, problems: list[str], *, ids: bool = False) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{where} must be a list")
        return []
    if len(value) > MAX_LIST:
        problems.append(f"{where} has {len(value)} items; at most {MAX_LIST}")
        return []
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip() or len(item) > 200:
            problems.append(f"{where}[{i}] must be a non-empty string of at most 200 characters")
            continue
        problem = validate.text_problem(item)
        if problem is not None:
            problems.append(f"{where}[{i}] {problem}")
            continue
        text = item.strip()
        if ids:
            try:
                text = str(uuid.UUID(text))
            except ValueError:
                problems.append(f"{where}[{i}] must be an id (a UUID)")
                continue
        if text not in out:
            out.append(text)
    return out


def check(name: str, body: Any, *, by_name: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The policy as stored, and every problem found on its own (references are checked in the
    database by :func:`store`). ``by_name`` (a registry file, written before ids are known):
    ``applies_to.users`` and ``leaders`` may name people by email and ``applications`` by name;
    :func:`resolve_names` turns them into ids when the file is applied."""
    problems: list[str] = []
    if not _NAME.match(name):
        problems.append("the name must be 1 to 64 of A-Z a-z 0-9 . _ -")
    if not isinstance(body, dict):
        return {}, [*problems, "the body must be a JSON object"]
    unknown = sorted(set(body) - {"enabled", "detectors", "custom", "applies_to", "name", "version", "created_at",
                                  "updated_at"})
    problems.extend(f"unknown field {k!r}" for k in unknown[:10])
    enabled = body.get("enabled", True)
    if not isinstance(enabled, bool):
        problems.append("enabled must be true or false")
    detectors: dict[str, str] = {}
    raw = body.get("detectors") or {}
    if not isinstance(raw, dict):
        problems.append("detectors must be an object of detector: action")
        raw = {}
    for detector, action in raw.items():
        if detector not in DETECTORS:
            problems.append(f"detectors.{str(detector)[:64]}: unknown detector (one of {', '.join(DETECTORS)})")
        elif action not in ACTIONS:
            problems.append(f"detectors.{detector}: the action must be one of {', '.join(ACTIONS)}")
        else:
            detectors[detector] = action
    custom: list[dict[str, str]] = []
    raw_custom = body.get("custom") or []
    if not isinstance(raw_custom, list) or len(raw_custom) > MAX_CUSTOM:
        problems.append(f"custom must be a list of at most {MAX_CUSTOM} {{name, pattern, action}}")
        raw_custom = []
    for i, entry in enumerate(raw_custom):
        where = f"custom[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"name", "pattern", "action"}:
            problems.append(f"{where} must be {{name, pattern, action}}")
            continue
        detector, pattern, action = entry.get("name"), entry.get("pattern"), entry.get("action")
        if not isinstance(detector, str) or not _DETECTOR.match(detector):
            problems.append(f"{where}.name must be 1 to 64 of a-z 0-9 _ -")
            continue
        if detector in DETECTORS or any(c["name"] == detector for c in custom):
            problems.append(f"{where}.name {detector!r} is taken")
            continue
        if not isinstance(pattern, str) or validate.text_problem(pattern) is not None:
            problems.append(f"{where}.pattern must be a regular expression")
            continue
        problem = dlp_pattern_problem(pattern)
        if problem is not None:
            problems.append(f"{where}.pattern {problem}")
            continue
        if action not in ACTIONS:
            problems.append(f"{where}.action must be one of {', '.join(ACTIONS)}")
            continue
        custom.append({"name": detector, "pattern": pattern, "action": action})
    applies = body.get("applies_to") or {}
    if not isinstance(applies, dict):
        problems.append("applies_to must be an object")
        applies = {}
    problems.extend(f"applies_to.{k}: unknown (one of {', '.join(APPLIES_TO)})" for k in sorted(set(applies) -
                                                                                             set(APPLIES_TO))[:10])
    applies_to = {k: _labels(applies.get(k), f"applies_to.{k}", problems,
                             ids=not by_name and k in ("applications", "users", "leaders"))
                  for k in APPLIES_TO}
    stored = {"enabled": enabled is not False, "detectors": detectors, "custom": custom,
              "applies_to": {k: v for k, v in applies_to.items() if v}}
    return stored, problems


async def problems_in_database(conn: asyncpg.Connection, name: str, stored: dict[str, Any],
                               file_models: frozenset[str] = frozenset()) -> list[str]:
    """What ``stored`` names that does not exist (models a registry file creates count), and
    custom detectors at odds with the other policies. Takes the policies' lock: policy writes
    take turns until the transaction ends."""
    found: list[str] = []
    applies = stored["applies_to"]
    for field, sql in (("models", dlp_sql.KNOWN_MODELS), ("providers", dlp_sql.KNOWN_PROVIDERS)):
        if applies.get(field):
            known = {r[0] for r in await conn.fetch(sql, applies[field])} | file_models
            found += [f"applies_to.{field}: no {field[:-1]} is named {n!r}" for n in applies[field] if n not in known]
    for field, kind in (("applications", "application"), ("users", "user"), ("leaders", "user")):
        if applies.get(field):
            known = {r[0] for r in await conn.fetch(dlp_sql.KNOWN_PRINCIPALS, applies[field], kind)}
            found += [f"applies_to.{field}: no {kind} has the id {i}" for i in applies[field] if i not in known]
    # One name, one pattern: a custom detector another policy defines must match it; and the
    # core takes at most MAX_CUSTOM of them in all.
    await conn.execute(dlp_sql.LOCK_POLICIES)
    names = {c["name"] for c in stored["custom"]}
    for other in await conn.fetch(dlp_sql.OTHER_POLICIES, name):
        theirs = {c["name"]: c["pattern"] for c in json.loads(other["body"]).get("custom", [])}
        names |= set(theirs)
        found += [f"custom detector {c['name']!r} is defined with another pattern by policy {other['name']!r}"
                  for c in stored["custom"] if theirs.get(c["name"], c["pattern"]) != c["pattern"]]
    if len(names) > MAX_CUSTOM:
        found.append(f"the policies would define {len(names)} custom detectors; at most {MAX_CUSTOM} in all")
    return found


async def resolve_names(conn: asyncpg.Connection, stored: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A registry file's policy with its people (by email) and applications (by name) as ids, and
    the names that match nobody."""
    applies = dict(stored["applies_to"])
    problems: list[str] = []
    for field, sql, what in (("users", dlp_sql.PEOPLE_BY_EMAIL, "user"), ("leaders", dlp_sql.PEOPLE_BY_EMAIL, "user"),
                             ("applications", dlp_sql.APPLICATIONS_BY_NAME, "application")):
        listed = applies.get(field) or []
        named = [v for v in listed if not _is_id(v)]
        ids = dict(await conn.fetch(sql, [v.lower() for v in named])) if named else {}
        out = []
        for value in listed:
            if _is_id(value):
                out.append(str(uuid.UUID(value)))
            elif value.lower() in ids:
                out.append(ids[value.lower()])
            else:
                problems.append(f"applies_to.{field}: no {what} is named {value!r}")
        if listed:
            applies[field] = list(dict.fromkeys(out))
    return {**stored, "applies_to": applies}, problems


def _is_id(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


async def apply_file_policy(conn: asyncpg.Connection, name: str, stored: dict[str, Any],
                            file_models: frozenset[str], summary: dict[str, list[str]]) -> list[str]:
    """One policy of a registry file, by name: created, updated or unchanged; the problems that
    keep the file from applying (nothing is written then)."""
    resolved, problems = await resolve_names(conn, stored)
    problems += await problems_in_database(conn, name, resolved, file_models)
    if problems:
        return [f"dlp policy {name!r}: {p}" for p in problems]
    before = await conn.fetchval(dlp_sql.STORED_BODY, name)
    if before is not None and json.loads(before) == resolved:
        summary["unchanged"].append(f"dlp policy {name}")
        return []
    await conn.fetchrow(dlp_sql.UPSERT_POLICY, name, json.dumps(resolved))
    summary["created" if before is None else "updated"].append(f"dlp policy {name}")
    return []


def _json(row: asyncpg.Record) -> dict[str, Any]:
    def moment(value: dt.datetime) -> str:
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")

    return {"name": row["name"], **json.loads(row["body"]), "version": row["version"],
            "created_at": moment(row["created_at"]), "updated_at": moment(row["updated_at"])}


class DlpService:
    """The admin routes' work; ``write`` is AdminService._write (the transaction, the config bump,
    NOTIFY and the audit row)."""

    def __init__(self, pool: asyncpg.Pool, write: Callable[..., Awaitable[Any]]) -> None:
        self._pool = pool
        self._write = write

    async def put(self, actor: str, name: str, body: Any) -> dict[str, Any]:
        validate.check(body)  # NUL bytes, lone surrogates, depth and size: a 400 before anything else
        stored, problems = check(name, body)
        if problems:
            raise _invalid(problems)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            found = await problems_in_database(conn, name, stored)
            if found:
                raise _invalid(found)
            return await conn.fetchrow(dlp_sql.UPSERT_POLICY, name, json.dumps(stored))

        row = await self._write(actor, "put_dlp_policy", name, {"enabled": stored["enabled"]}, work)
        return _json(row)

    async def list(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            return [_json(r) for r in await conn.fetch(dlp_sql.LIST_POLICIES)]

    async def delete(self, actor: str, name: str) -> dict[str, Any]:
        if not _NAME.match(name):
            raise errors.NotFound()

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(dlp_sql.DELETE_POLICY, name) is None:
                raise errors.NotFound("no data protection policy has this name")

        await self._write(actor, "delete_dlp_policy", name, {}, work)
        return {"status": "deleted"}


def to_config(rows: list[Any], principal_index: dict[str, int], model_index: dict[str, int],
              provider_index: dict[str, int]) -> dict[str, Any]:
    """The enabled policies as the core takes them (``Config.dlp``). A policy whose lists all
    name what no longer exists is left out (it can match nobody; it never widens to everyone)."""
    custom: dict[str, str] = {}
    policies = []
    for row in rows:
        body = json.loads(row["body"]) if isinstance(row["body"], str) else row["body"]
        if not body.get("enabled", True):
            continue
        applies = body.get("applies_to") or {}

        def indexes(field: str, index: dict[str, int], applies: dict[str, Any] = applies) -> list[int] | None:
            listed = applies.get(field) or []
            found = [index[v] for v in listed if v in index]
            return None if listed and not found else found

        lists = {"models": indexes("models", model_index), "providers": indexes("providers", provider_index),
                 "leaders": indexes("leaders", principal_index)}
        # People and applications are one list of principals (a call has one or the other).
        listed = [*(applies.get("users") or []), *(applies.get("applications") or [])]
        principals = sorted({principal_index[v] for v in listed if v in principal_index})
        if any(v is None for v in lists.values()) or (listed and not principals):
            continue
        actions = [(k, v) for k, v in (body.get("detectors") or {}).items() if v != "off"]
        for c in body.get("custom") or []:
            if custom.setdefault(c["name"], c["pattern"]) == c["pattern"] and c["action"] != "off":
                actions.append((c["name"], c["action"]))
        policies.append({"name": row["name"], "actions": actions, "models": lists["models"],
                         "providers": lists["providers"],
                         "principals": principals,
                         "leaders": lists["leaders"], "business_units": applies.get("business_units") or [],
                         "tiers": applies.get("tiers") or []})
    return {"custom": sorted(custom.items()), "policies": policies}
