"""Registry files: parsed and validated on their own, then applied in one registry write."""

from __future__ import annotations

import dataclasses
import json
import tomllib
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Annotated, Any

import asyncpg
import msgspec
from msgspec import UNSET, Meta, UnsetType

from meshfast import errors, validate
from meshfast.admin import dlp as dlp_admin
from meshfast.admin import issuers as issuer_admin
from meshfast.admin import rules as rule_admin
from meshfast.admin import workflows as workflow_admin
from meshfast.admin.service.common import ServiceBase, _email, _invalid, _label
from meshfast.admin.service.models import DeploymentCreate, ModelCreate, _deployment_args, _model_args
from meshfast.admin.service.providers import ProviderCreate, _provider_fields
from meshfast.sealing import open_sealed, seal
from meshfast.store import applications as applications_sql
from meshfast.store import sql
from meshfast.validate import Email, Int32, Label, Name


class RegistryDeployment(msgspec.Struct, forbid_unknown_fields=True):
    provider: Name
    resolved_model: Name
    region: Name | None = None
    priority: Int32 = 100


class RegistryUser(msgspec.Struct, forbid_unknown_fields=True):
    """A registered user's place in the organisation, by email: a field left out is kept,
    ``null`` clears it. Users (and their keys) are created through the API, not by a file."""

    email: Email
    manager_email: Email | None | UnsetType = UNSET
    business_unit: Label | None | UnsetType = UNSET
    tier: Label | None | UnsetType = UNSET


class RegistryApplication(msgspec.Struct, forbid_unknown_fields=True):
    """An application, by name (any case): created when missing, with no key (issue one through
    the API or the CLI, or call with a platform token that names it), its owner (by email) and
    business unit set (left out: kept; ``null`` clears it); the ``models`` it lists (names) are
    granted, and grants it does not list are left alone."""

    name: Annotated[str, Meta(max_length=64)]
    owner_email: Email
    business_unit: Label | None | UnsetType = UNSET
    models: Annotated[list[Annotated[str, Meta(max_length=200)]], Meta(max_length=10_000)] = []


class _RegistryFile(msgspec.Struct, forbid_unknown_fields=True):
    providers: list[dict[str, Any]] = []
    models: list[dict[str, Any]] = []
    users: list[dict[str, Any]] = []
    applications: list[dict[str, Any]] = []
    # Platform token issuers and workflow budgets, as their admin routes take them.
    issuers: list[dict[str, Any]] = []
    workflows: list[dict[str, Any]] = []
    # Data protection policies as PUT /admin/dlp/policies/{name} takes them, with their name;
    # people may be named by email and applications by name.
    dlp_policies: list[dict[str, Any]] = []
    # Spend rules as the API takes them (meshfast.rules), and the global enforcement switch.
    rules: list[Any] = []
    enforce_rules: bool | None = None


@dataclasses.dataclass(slots=True)
class _ProviderEntry:
    body: ProviderCreate
    # None: the file names no key, and an existing provider keeps its own.
    api_key: str | None
    base_url: str
    settings: dict[str, Any]


@dataclasses.dataclass(slots=True)
class _ModelEntry:
    name: str
    provider: str
    args: tuple[Any, ...]
    # (provider name, resolved_model, region, priority); None: the file leaves deployments alone.
    deployments: list[tuple[str, str, str | None, int]] | None
    # As the API takes them, people by id or email; UNSET: the file leaves them alone.
    restrictions: Any = UNSET


@dataclasses.dataclass(slots=True)
class Registry:
    """A registry file, validated on its own (references to registered providers are checked
    when it is applied)."""

    providers: list[_ProviderEntry] = dataclasses.field(default_factory=list)
    models: list[_ModelEntry] = dataclasses.field(default_factory=list)
    # Emails and labels normalised as stored.
    users: list[RegistryUser] = dataclasses.field(default_factory=list)
    applications: list[RegistryApplication] = dataclasses.field(default_factory=list)
    issuers: list[Any] = dataclasses.field(default_factory=list)
    workflows: list[Any] = dataclasses.field(default_factory=list)
    # (name, policy as stored before its people's and applications' names become ids)
    dlp_policies: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    # Spend rules as authored (checked against people and models when applied); None: the
    # switch is left alone.
    rules: list[Any] = dataclasses.field(default_factory=list)
    enforce_rules: bool | None = None


# Placeholders that let a registry entry pass the API body's validation before its real value
# (a provider's key from the environment, a model's provider id) is known.
_NO_KEY = "registry-file-no-key"
_NO_PROVIDER = str(uuid.UUID(int=0))


def parse_registry(data: bytes, fmt: str, environ: Mapping[str, str]) -> Registry:
    """A registry file (``fmt`` ``json`` or ``toml``): ``{"providers": [provider bodies], "models":
    [model bodies]}`` as the admin API takes them, except that a provider's key may come from the
    environment (``api_key_env``) and a model names its provider (``provider``) and lists its
    ``deployments`` (``{provider, resolved_model, region?, priority?}``). An optional ``users``
    list sets registered users' place in the organisation by email (:class:`RegistryUser`).
    Raises one 400 listing every problem found."""
    try:
        raw = tomllib.loads(data.decode()) if fmt == "toml" else msgspec.json.decode(data)
        registry = msgspec.convert(raw, _RegistryFile)
    except (msgspec.MsgspecError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _invalid([f"the file does not parse as a registry: {exc}"]) from None
    except RecursionError:
        raise _invalid([f"the file nests deeper than {validate.MAX_DEPTH} levels"]) from None
    # NOTE: a registry may list more entries than one API body; each entry has the API's limits.
    validate.check(raw, max_items=1_000_000)
    problems: list[str] = []
    out = Registry()
    names: set[str] = set()
    for i, entry in enumerate(registry.providers):
        label = f"providers[{i}] ({entry.get('name')!r})"
        try:
            out.providers.append(_provider_entry(entry, environ))
        except errors.MeshfastError as exc:
            problems.extend(f"{label}: {p}" for p in exc.extra.get("errors", [exc.detail]))
            continue
        if entry["name"].strip() in names:
            problems.append(f"{label}: a provider of that name is listed twice")
        names.add(entry["name"].strip())
    names = set()
    for i, entry in enumerate(registry.models):
        label = f"models[{i}] ({entry.get('name')!r})"
        try:
            model = _model_entry(entry)
        except errors.MeshfastError as exc:
            problems.extend(f"{label}: {p}" for p in exc.extra.get("errors", [exc.detail]))
            continue
        if model.name in names:
            problems.append(f"{label}: a model of that name is listed twice")
        names.add(model.name)
        out.models.append(model)
    names = set()
    for i, entry in enumerate(registry.users):
        label = f"users[{i}] ({entry.get('email')!r})"
        try:
            user = _user_entry(entry)
        except errors.MeshfastError as exc:
            problems.extend(f"{label}: {p}" for p in exc.extra.get("errors", [exc.detail]))
            continue
        if user.email in names:
            problems.append(f"{label}: a user of that email is listed twice")
        names.add(user.email)
        out.users.append(user)
    names = set()
    for i, entry in enumerate(registry.applications):
        label = f"applications[{i}] ({entry.get('name')!r})"
        try:
            app = _application_entry(entry)
        except errors.MeshfastError as exc:
            problems.extend(f"{label}: {p}" for p in exc.extra.get("errors", [exc.detail]))
            continue
        if app.name.lower() in names:
            problems.append(f"{label}: an application of that name is listed twice")
        names.add(app.name.lower())
        out.applications.append(app)
    sections: tuple[tuple[str, type[msgspec.Struct], Callable[[Any], Any], str], ...] = (
        ("issuers", issuer_admin.IssuerCreate, issuer_admin.check, "issuer"),
        ("workflows", workflow_admin.WorkflowCreate, workflow_admin.check, "id"))
    for section, struct, check, key in sections:
        names = set()
        for i, entry in enumerate(getattr(registry, section)):
            label = f"{section}[{i}] ({entry.get(key)!r})"
            try:
                body = msgspec.convert(entry, struct)
                check(body)
            except msgspec.ValidationError as exc:
                problems.append(f"{label}: {exc}")
                continue
            except errors.MeshfastError as exc:
                problems.extend(f"{label}: {p}" for p in exc.extra.get("errors", [exc.detail]))
                continue
            name = getattr(body, key).strip()
            if name in names:
                problems.append(f"{label}: listed twice")
            names.add(name)
            getattr(out, section).append(body)
    names = set()
    for i, entry in enumerate(registry.dlp_policies):
        name = entry.get("name")
        label = f"dlp_policies[{i}] ({name!r})"
        stored, found = dlp_admin.check(name if isinstance(name, str) else "", entry, by_name=True)
        problems.extend(f"{label}: {p}" for p in found)
        if name in names:
            problems.append(f"{label}: listed twice")
        if not found:
            names.add(name)
            out.dlp_policies.append((name, stored))
    problems.extend(rule_admin.parse_file_rules(registry.rules))
    out.rules, out.enforce_rules = registry.rules, registry.enforce_rules
    if problems:
        raise _invalid(problems)
    return out


def _application_entry(entry: dict[str, Any]) -> RegistryApplication:
    from meshfast.admin.applications import application_name

    try:
        app = msgspec.convert(entry, RegistryApplication)
    except msgspec.ValidationError as exc:
        raise errors.InvalidRequest(str(exc)) from None
    problems: list[str] = []
    for field, normalise in (("name", lambda v, f: application_name(v)), ("owner_email", _email),
                             ("business_unit", _label)):
        value = getattr(app, field)
        if value is UNSET or value is None:
            continue
        try:
            setattr(app, field, normalise(value, field))
        except errors.InvalidRequest as exc:
            problems.append(str(exc.detail))
    app.models = sorted({m.strip() for m in app.models})
    if problems:
        raise _invalid(problems)
    return app


async def _apply_applications(conn: asyncpg.Connection, entries: list[RegistryApplication],
                              summary: dict[str, list[str]]) -> list[str]:
    """A registry file's applications (see :class:`RegistryApplication`); the problems found
    (an owner or a model nobody registered), in which case nothing was changed."""
    owners = {r["email"]: r["id"] for r in await conn.fetch(
        sql.USER_IDS_BY_EMAIL, [a.owner_email for a in entries])}
    wanted_models = sorted({m for a in entries for m in a.models})
    models = {r["name"]: r["id"] for r in await conn.fetch(
        sql.MODEL_IDS_BY_NAME, wanted_models)}
    problems = [f"application {a.name!r}: owner {a.owner_email!r} is not a registered user" for a in entries
                if a.owner_email not in owners]
    problems += [f"application {a.name!r}: model {m!r} is neither in the file nor registered" for a in entries
                 for m in a.models if m not in models]
    if problems:
        return problems
    stored = {r["key"]: r for r in await conn.fetch(
        applications_sql.APPLICATIONS_BY_NAME, [a.name.lower() for a in entries])}
    for a in entries:
        row = stored.get(a.name.lower())
        owner = owners[a.owner_email]
        if row is None:
            unit = None if a.business_unit is UNSET else a.business_unit
            try:
                app_id = await conn.fetchval(applications_sql.INSERT_APPLICATION, a.name, owner, unit)
            except asyncpg.UniqueViolationError:
                return [f"application {a.name!r} was created meanwhile: apply the file again"]
            summary["created"].append(f"application {a.name}")
        else:
            app_id = row["id"]
            unit = row["business_unit"] if a.business_unit is UNSET else a.business_unit
            if (row["owner_id"], row["business_unit"]) != (owner, unit):
                await conn.execute(applications_sql.UPDATE_APPLICATION_OWNER, app_id, owner, unit)
                summary["updated"].append(f"application {a.name}")
            else:
                summary["unchanged"].append(f"application {a.name}")
        for m in a.models:
            if await conn.fetchval(sql.GRANT_ACCESS_IF_NEW, app_id, models[m]):
                summary["created"].append(f"grant {a.name} -> {m}")
    return []


def _user_entry(entry: dict[str, Any]) -> RegistryUser:
    try:
        user = msgspec.convert(entry, RegistryUser)
    except msgspec.ValidationError as exc:
        raise errors.InvalidRequest(str(exc)) from None
    problems: list[str] = []
    out = RegistryUser(email=user.email)
    for field, normalise in (("email", _email), ("manager_email", _email), ("business_unit", _label),
                             ("tier", _label)):
        value = getattr(user, field)
        if value is UNSET:
            continue
        try:
            setattr(out, field, None if value is None else normalise(value, field))
        except errors.InvalidRequest as exc:
            problems.append(str(exc.detail))
    if not problems and out.manager_email == out.email:
        problems.append("a user cannot be their own manager")
    if problems:
        raise _invalid(problems)
    return out


def _provider_entry(entry: dict[str, Any], environ: Mapping[str, str]) -> _ProviderEntry:
    entry = dict(entry)
    for refused in ("models", "verify"):
        if refused in entry:
            raise errors.InvalidRequest(f"{refused} is not taken in a registry file")
    api_key: str | None = entry.pop("api_key", None)
    variable = entry.pop("api_key_env", None)
    if variable is not None:
        if api_key is not None:
            raise errors.InvalidRequest("give api_key or api_key_env, not both")
        api_key = environ.get(str(variable))
        if not api_key:
            raise errors.InvalidRequest(f"environment variable {variable} (api_key_env) is not set")
    try:
        body = msgspec.convert({**entry, "api_key": api_key or _NO_KEY, "verify": False}, ProviderCreate)
    except msgspec.ValidationError as exc:
        raise errors.InvalidRequest(str(exc)) from None
    _, _, base_url, settings = _provider_fields(body)
    return _ProviderEntry(body, api_key, base_url, settings)


def _model_entry(entry: dict[str, Any]) -> _ModelEntry:
    entry = dict(entry)
    onboarding = "a model's onboarding goes through PUT /admin/models/{id}"
    for refused, why in (("provider_id", "name the provider with provider"), ("verify", "files make no live calls"),
                         ("status", onboarding), ("roster", onboarding), ("limited", onboarding)):
        if refused in entry:
            raise errors.InvalidRequest(f"{refused} is not taken in a registry file ({why})")
    provider = entry.pop("provider", None)
    deployments = entry.pop("deployments", None)
    restrictions = entry.pop("restrictions", UNSET)
    problems: list[str] = [] if restrictions is UNSET else rule_admin.parse_file_restrictions(restrictions)
    if not isinstance(provider, str) or not provider.strip():
        problems.append("provider (a provider's name) is required")
    try:
        body = msgspec.convert({**entry, "provider_id": _NO_PROVIDER}, ModelCreate)
        args = _model_args(body)
    except msgspec.ValidationError as exc:
        raise _invalid([*problems, str(exc)]) from None
    except errors.MeshfastError as exc:
        problems.extend(exc.extra.get("errors", [exc.detail]))
        args = ()
    planned: list[tuple[str, str, str | None, int]] | None = None
    if deployments is not None:
        planned = []
        try:
            parsed = msgspec.convert(deployments, list[RegistryDeployment])
        except msgspec.ValidationError as exc:
            parsed = []
            problems.append(f"deployments: {exc}")
        for j, d in enumerate(parsed):
            try:
                resolved, region, priority = _deployment_args(
                    DeploymentCreate(provider_id=_NO_PROVIDER, resolved_model=d.resolved_model, region=d.region,
                                     priority=d.priority))
            except errors.MeshfastError as exc:
                problems.extend(f"deployments[{j}]: {p}" for p in exc.extra.get("errors", [exc.detail]))
                continue
            planned.append((d.provider.strip(), resolved, region, priority))
    if problems:
        raise _invalid(problems)
    return _ModelEntry(args[0], str(provider).strip(), args, planned, restrictions)


async def _apply_users(conn: asyncpg.Connection, entries: list[RegistryUser], users: dict[str, asyncpg.Record],
                       summary: dict[str, list[str]]) -> None:
    """A registry file's organisation changes (every email already checked to be registered),
    under LOCK_ORGANISATION; a file whose changes together close a manager loop is refused whole."""
    changed: list[tuple[str, uuid.UUID, uuid.UUID]] = []
    for u in entries:
        row = users[u.email]
        stored = (row["manager_id"], row["business_unit"], row["tier"])
        manager_id = stored[0] if u.manager_email is UNSET else (
            None if u.manager_email is None else users[u.manager_email]["id"])
        wanted = (manager_id, stored[1] if u.business_unit is UNSET else u.business_unit,
                  stored[2] if u.tier is UNSET else u.tier)
        if wanted == stored:
            summary["unchanged"].append(f"user {u.email}")
            continue
        await conn.execute(sql.UPDATE_USER_ORGANISATION, row["id"], *wanted)
        summary["updated"].append(f"user {u.email}")
        if manager_id is not None and manager_id != stored[0]:
            changed.append((u.email, row["id"], manager_id))
    # NOTE: the stored chains had no loop, so any loop now runs through a changed manager.
    problems = [f"user {email!r}: the manager chain would loop" for email, uid, manager_id in changed
                if await conn.fetchval(sql.MANAGER_WOULD_LOOP, uid, manager_id)]
    if problems:
        raise _invalid(problems)


class _Unchanged(Exception):
    """An apply that would change nothing: its transaction rolls back (no config bump, no audit)."""


def _usd(value: Any) -> Decimal | None:
    """A price as stored (numeric(16, 9)), for comparing a file's prices with the table's."""
    return None if value is None else Decimal(str(value)).quantize(Decimal("1e-9"))


def _stored_model(row: asyncpg.Record) -> tuple[Any, ...]:
    """A model row in ``(provider_id, *_model_args)`` form, prices as stored."""
    long_context = row["long_context_prices"]
    if isinstance(long_context, str):
        long_context = json.loads(long_context)
    return (
        row["provider_id"], row["name"], row["resolved_model"], row["kind"],
        *(_usd(row[f]) for f in ("input_price_per_1k_tokens", "output_price_per_1k_tokens",
                                 "cache_read_price_per_1k_tokens", "cache_write_price_per_1k_tokens",
                                 "cache_write_1h_price_per_1k_tokens")),
        row["long_context_threshold_tokens"],
        None if long_context is None else {k: _usd(v) for k, v in long_context.items()},
        _usd(row["price_per_second"]), row["max_output_tokens"], list(row["aliases"]), list(row["tags"]),
        row["supports_image_in"], row["supports_document_in"], row["supports_audio_in"], row["supports_video_in"],
        row["supports_web_search"], row["output_media_type"], row["cache_shaping"], row["cache_ttl"],
    )


def _wanted_model(provider_id: uuid.UUID, args: tuple[Any, ...]) -> tuple[Any, ...]:
    long_context = None if args[9] is None else {k: _usd(v) for k, v in json.loads(args[9]).items()}
    return (provider_id, *args[:3], *(_usd(v) for v in args[3:8]), args[8], long_context, _usd(args[10]), *args[11:])


class RegistryOperations(ServiceBase):
    """Registry files (mixed into :class:`AdminService`)."""

    async def apply_registry(self, actor: str, registry: Registry, source: str) -> dict[str, Any]:
        """Create or update every provider, model and deployment of ``registry`` (matched by
        name) in one registry write: all of it, or with any problem nothing and a 400 listing
        every problem. Entities the file does not name are left alone; a model that lists
        ``deployments`` gets exactly those. Applying the same file again changes nothing."""
        summary: dict[str, list[str]] = {"created": [], "updated": [], "deleted": [], "unchanged": []}
        detail: dict[str, Any] = {}

        async def work(conn: asyncpg.Connection) -> None:
            providers = {row["name"]: row for row in await conn.fetch(sql.SNAPSHOT_PROVIDERS)}
            models = {row["name"]: row for row in await conn.fetch(sql.LIST_MODELS)}
            deployments: dict[uuid.UUID, list[asyncpg.Record]] = {}
            for row in await conn.fetch(sql.LIST_ALL_DEPLOYMENTS):
                deployments.setdefault(row["model_id"], []).append(row)
            known = set(providers) | {p.body.name.strip() for p in registry.providers}
            problems = [f"provider {p.body.name.strip()!r}: api_key or api_key_env is required for a new provider"
                        for p in registry.providers if p.api_key is None and p.body.name.strip() not in providers]
            for m in registry.models:
                for name in [m.provider, *(d[0] for d in m.deployments or ())]:
                    if name not in known:
                        problems.append(f"model {m.name!r}: provider {name!r} is neither in the file nor registered")
            users: dict[str, asyncpg.Record] = {}
            if registry.users:
                await conn.execute(sql.LOCK_ORGANISATION)
                users = {row["email"]: row for row in await conn.fetch(sql.ORGANISATION)}
                for u in registry.users:
                    for email in (u.email, u.manager_email):
                        if isinstance(email, str) and email not in users:
                            problems.append(f"user {email!r} is not registered (users are created through the API)")
            plan = None
            restrictions = {m.name: m.restrictions for m in registry.models if m.restrictions is not UNSET}
            if registry.rules or restrictions:
                file_models = {alias: m.name for m in registry.models for alias in (m.name, *m.args[12])}
                plan, found = await rule_admin.plan_registry(conn, registry.rules, restrictions, file_models)
                problems.extend(found)
            if problems:
                raise _invalid(problems)
            ids = {name: row["id"] for name, row in providers.items()}
            for entry in registry.providers:
                name = entry.body.name.strip()
                ids[name] = await self._apply_provider(conn, entry, providers.get(name), summary)
            for m in registry.models:
                await self._apply_model(conn, m, ids, models.get(m.name), deployments, summary)
            if registry.users:
                await _apply_users(conn, registry.users, users, summary)
            if registry.applications:
                # NOTE: after the models: an application may be granted a model this file creates.
                found = await _apply_applications(conn, registry.applications, summary)
                if found:
                    raise _invalid(found)
            for issuer in registry.issuers:
                await issuer_admin.apply_file_issuer(conn, issuer, summary)
            for workflow in registry.workflows:
                await workflow_admin.apply_file_workflow(conn, workflow, summary)
            if registry.dlp_policies:
                # NOTE: after the models and applications: a policy may name ones this file creates.
                created = frozenset(m.name for m in registry.models)
                found = []
                for name, stored in registry.dlp_policies:
                    found += await dlp_admin.apply_file_policy(conn, name, stored, created, summary)
                if found:
                    raise _invalid(found)
            if plan is not None or registry.enforce_rules is not None:
                await rule_admin.apply_plan(conn, plan or rule_admin.RegistryPlan(), registry.enforce_rules, summary,
                                            actor)
            if not (summary["created"] or summary["updated"] or summary["deleted"]):
                raise _Unchanged()
            detail.update({key: len(value) for key, value in summary.items()})

        try:
            await self._write(actor, "apply_registry", source, detail, work, registry=True)
        except _Unchanged:
            pass
        return summary

    async def _apply_provider(self, conn: asyncpg.Connection, entry: _ProviderEntry, row: asyncpg.Record | None,
                              summary: dict[str, list[str]]) -> uuid.UUID:
        body = entry.body
        name = body.name.strip()
        wanted = (body.family, entry.base_url, body.local, body.max_outbound_rps, body.max_concurrent_upstream,
                  body.max_calls_per_hour, body.retry_enabled, body.max_retries, body.retry_backoff_ms,
                  body.log_requests, body.supports_web_search, entry.settings)
        if row is None:
            provider_id = uuid.uuid4()
            sealed, nonce = seal(self._secrets.master_key, str(provider_id), entry.api_key or "")
            await conn.execute(sql.INSERT_PROVIDER, provider_id, name, body.family, entry.base_url, sealed, nonce,
                               *wanted[2:11], json.dumps(entry.settings))
            summary["created"].append(f"provider {name}")
            return provider_id
        provider_id = row["id"]
        settings = row["settings"]
        stored = (row["family"], row["base_url"], row["local"], row["max_outbound_rps"],
                  row["max_concurrent_upstream"], row["max_calls_per_hour"], row["retry_enabled"],
                  row["max_retries"], row["retry_backoff_ms"], row["log_requests"], row["supports_web_search"],
                  json.loads(settings) if isinstance(settings, str) else settings)
        sealed, nonce = bytes(row["encrypted_api_key"]), bytes(row["key_nonce"])
        new_key = entry.api_key is not None and entry.api_key != open_sealed(
            self._secrets.master_key, str(provider_id), sealed, nonce)
        if stored == wanted and not new_key:
            summary["unchanged"].append(f"provider {name}")
            return provider_id
        if new_key:
            sealed, nonce = seal(self._secrets.master_key, str(provider_id), entry.api_key or "")
        await conn.execute(sql.UPDATE_PROVIDER, provider_id, body.family, entry.base_url, sealed, nonce,
                           *wanted[2:11], json.dumps(entry.settings))
        summary["updated"].append(f"provider {name}")
        return provider_id

    async def _apply_model(self, conn: asyncpg.Connection, entry: _ModelEntry, ids: dict[str, uuid.UUID],
                           row: asyncpg.Record | None, deployments: dict[uuid.UUID, list[asyncpg.Record]],
                           summary: dict[str, list[str]]) -> None:
        provider_id = ids[entry.provider]
        if row is None:
            try:
                model_id = await conn.fetchval(sql.INSERT_MODEL, provider_id, *entry.args)
            except asyncpg.UniqueViolationError:
                raise errors.ModelExists() from None
            summary["created"].append(f"model {entry.name}")
        else:
            model_id = row["id"]
            if _stored_model(row) == _wanted_model(provider_id, entry.args):
                summary["unchanged"].append(f"model {entry.name}")
            else:
                await conn.execute(sql.UPDATE_MODEL, model_id, provider_id, *entry.args[1:])
                summary["updated"].append(f"model {entry.name}")
        if entry.deployments is None:
            return
        current = {(d["provider_id"], d["resolved_model"]): d for d in deployments.get(model_id, [])}
        kept: list[uuid.UUID] = []
        for provider, resolved, region, priority in entry.deployments:
            label = f"deployment {entry.name} on {provider}/{resolved}"
            existing = current.get((ids[provider], resolved))
            if existing is not None and (existing["region"], existing["priority"]) == (region, priority):
                summary["unchanged"].append(label)
                kept.append(existing["id"])
                continue
            kept.append(await conn.fetchval(sql.UPSERT_DEPLOYMENT, model_id, ids[provider], resolved, region, priority))
            summary["created" if existing is None else "updated"].append(label)
        for (_, resolved), d in current.items():
            if d["id"] not in kept:
                summary["deleted"].append(f"deployment {entry.name} on {d['provider_name']}/{resolved}")
        await conn.execute(sql.DELETE_OTHER_DEPLOYMENTS, model_id, kept)
