"""Builds the core's config bytes from PostgreSQL.

The worker reads configuration through the gateway role in one REPEATABLE READ transaction,
encodes it with msgspec (MessagePack) and hands the bytes to ``Core.load``, which validates
them, builds the immutable snapshot and swaps it in atomically.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import struct
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import asyncpg
import msgspec
from cryptography.exceptions import InvalidTag

from meshfast import onboarding, rules, tokens
from meshfast._core import Core, SnapshotError
from meshfast.sealing import open_sealed
from meshfast.store import sql

log = logging.getLogger("meshfast.snapshot")

NANOS_PER_USD = 1_000_000_000


class Principal(msgspec.Struct):
    id: str
    email: str
    display_name: str
    status: str
    expires_at_ms: int | None
    # The manager's index in ``principals``; the chain upwards never loops (the core checks).
    manager: int | None = None
    business_unit: str | None = None
    tier: str | None = None
    # An application (kind 'application'): its name is display_name, its email is empty.
    application: bool = False


class Key(msgspec.Struct):
    id: str
    principal: int
    digest: bytes
    status: str
    expires_at_ms: int | None
    # The model indexes this key may call (sorted); None: every model its principal is granted.
    models: list[int] | None = None


class GenericTemplates(msgspec.Struct, omit_defaults=True):
    """Mesh's provider-as-data fields; body templates travel as JSON text."""

    endpoint_url: str | None = None
    http_method: str = "POST"
    header_template: dict[str, str] | None = None
    request_body_template: str | None = None
    response_delta_path: str | None = None
    response_done_signal: str | None = None
    usage_input_tokens_path: str | None = None
    usage_output_tokens_path: str | None = None
    web_search_request_body_template: str | None = None
    embedding_endpoint_url: str | None = None
    embedding_request_body_template: str | None = None
    embedding_response_vector_path: str | None = None
    embedding_usage_tokens_path: str | None = None
    generation_endpoint_url: str | None = None
    generation_request_body_template: str | None = None
    generation_response_media_path: str | None = None
    generation_mode: str = "sync"
    generation_job_id_path: str | None = None
    generation_status_url_template: str | None = None
    generation_status_path: str | None = None
    generation_content_url_template: str | None = None
    generation_status_success_values: list[str] | None = None
    generation_status_failure_values: list[str] | None = None
    generation_poll_interval_ms: int | None = None
    generation_max_wait_seconds: int | None = None
    generation_duration_seconds_path: str | None = None
    generation_usage_input_tokens_path: str | None = None
    generation_usage_output_tokens_path: str | None = None


TEMPLATE_FIELDS = ("request_body_template", "web_search_request_body_template",
                    "embedding_request_body_template", "generation_request_body_template")


class Provider(msgspec.Struct):
    id: str
    name: str
    family: str
    max_calls_per_hour: int | None
    supports_web_search: bool
    base_url: str = ""
    # Opened from its AES-GCM seal only here, while building the snapshot.
    api_key: str = ""
    local: bool = False
    max_outbound_rps: int | None = None
    max_concurrent_upstream: int | None = None
    admission_share_pct: int | None = None
    retry_enabled: bool = True
    max_retries: int = 2
    retry_backoff_ms: int = 200
    log_requests: bool = True
    web_search_price_nano: int = 0
    generic: GenericTemplates | None = None

    def __repr__(self) -> str:  # never print the key
        return f"Provider(id={self.id!r}, name={self.name!r}, family={self.family!r})"


class Deployment(msgspec.Struct):
    """Another place the model is served: a provider (index) and its name for the model."""

    id: str
    provider: int
    resolved_model: str
    region: str | None = None
    priority: int = 100


class Model(msgspec.Struct):
    id: str
    name: str
    provider: int
    resolved_model: str
    max_output_tokens: int
    price_per_second_nano: int
    kind: str
    created_ms: int
    blocked: bool
    status: str
    supports_image_in: bool
    supports_document_in: bool
    supports_audio_in: bool
    supports_video_in: bool
    supports_web_search: bool
    output_media_type: str | None
    input_price_nano_per_1k: int
    output_price_nano_per_1k: int
    # None: the class costs what input does (1 h writes: what 5 min writes do).
    cache_read_price_nano_per_1k: int | None = None
    cache_write_price_nano_per_1k: int | None = None
    cache_write_1h_price_nano_per_1k: int | None = None
    long_context_threshold_tokens: int | None = None
    # Class (LONG_CONTEXT_CLASSES' values) to price; the core refuses any other key.
    long_context_prices: dict[str, int] | None = None
    aliases: list[str] = []
    tags: list[str] = []
    deployments: list[Deployment] = []
    restrictions: Restrictions | None = None
    # A ``limited`` model's roster (principal indexes): the only callers it serves.
    roster: list[int] = []
    # Members of live authoritative pilots listing the model (principal indexes): served whatever
    # the status, roster or restrictions say (meshfast.onboarding).
    pilot_access: list[int] = []
    # Prompt-cache shaping (meshfast._core: breakpoints for Anthropic, a cache key for OpenAI).
    cache_shaping: bool = True
    cache_ttl: str = "5m"


# The admin API's long-context price keys (the model's own price field names) and the classes
# the core prices.
LONG_CONTEXT_CLASSES = {
    "input_price_per_1k_tokens": "input",
    "output_price_per_1k_tokens": "output",
    "cache_read_price_per_1k_tokens": "cache_read",
    "cache_write_price_per_1k_tokens": "cache_write",
    "cache_write_1h_price_per_1k_tokens": "cache_write_1h",
}


class Restrictions(msgspec.Struct, omit_defaults=True):
    """Who may see a model (API.md "PUT /admin/models"): people by principal index, business units
    by name. ``None`` for an allow list means no allow list."""

    leader_deny: list[int] = []
    leader_allow: list[int] | None = None
    exempt: list[int] = []
    business_units_closed: list[str] = []
    business_units_open: list[str] | None = None


class RuleAction(msgspec.Struct, omit_defaults=True):
    """``type``: block, pause (``hours``), warn (``text``) or notify (``channels``, ``template``)."""

    type: str
    hours: int = 0
    text: str = ""
    channels: list[str] = []
    template: str | None = None


class RuleEntry(msgspec.Struct, omit_defaults=True):
    """One entry of a rule, with people as principal indexes and a model as its index.

    ``window`` is daily, weekly or monthly (in ``Config.calendar_tz``) for ``threshold_nano``;
    ``calls_per_minute`` and ``tokens_per_minute`` cap a person's calls and tokens in the scope
    per minute (block only)."""

    window: str
    actions: list[RuleAction] = []
    tiers: list[str] = []
    leaders: list[int] = []
    business_units: list[str] = []
    exempt: list[int] = []
    # Applications (principal indexes) the entry holds to; empty: no restriction.
    applications: list[int] = []
    # Principals (indexes) the entry holds to, e.g. pilots' members; empty: no restriction.
    principals: list[int] = []
    tag: str | None = None
    model: int | None = None
    # Several models as one scope (a pilot's models): spend on any of them counts.
    models: list[int] = []
    threshold_nano: int | None = None
    calls_per_minute: int | None = None
    tokens_per_minute: int | None = None


class Rule(msgspec.Struct):
    id: str
    weight: int
    # enforce, shadow or inherit (follows Config.enforce_rules).
    mode: str
    entries: list[RuleEntry]
    # Each entry's position in the rule as authored (rows, events and dry-run name entries by it).
    entry_numbers: list[int] = []


class Grant(msgspec.Struct):
    principal: int
    model: int
    daily_cap_nano_usd: int
    max_calls_per_hour: int | None
    allowed_from_min: int | None
    allowed_to_min: int | None
    timezone: str
    active_days: list[int]
    always_open: bool


class GrantTerms(msgspec.Struct, array_like=True):
    """A grant's limits (``Grant``'s, without who and what), shared by every grant of the table
    that has them; an array on the wire."""

    daily_cap_nano_usd: int
    max_calls_per_hour: int | None
    allowed_from_min: int | None
    allowed_to_min: int | None
    timezone: str
    active_days: list[int]
    always_open: bool


# A grant in ``GrantTable.packed``: principal index, model index, terms index (big-endian int4s).
GRANT_RECORD = struct.Struct(">III")


class GrantTable(msgspec.Struct):
    """Grants as the core reads a million of them: ``GRANT_RECORD`` after ``GRANT_RECORD`` in
    ``packed``, over their distinct ``terms`` (usually a handful: most grants have the defaults)."""

    packed: bytes
    terms: list[GrantTerms]

    def __len__(self) -> int:
        return len(self.packed) // GRANT_RECORD.size

    def records(self) -> Iterator[tuple[int, int, int]]:
        """(principal, model, terms) of each grant."""
        return GRANT_RECORD.iter_unpack(self.packed)


class Issuer(msgspec.Struct):
    """A platform token issuer (the core's ``jwt::RawIssuer``)."""

    id: str
    issuer: str
    audiences: list[str]
    algorithms: list[str]
    clock_skew_s: int
    # Which claim holds each attribute: email, and optionally display_name, business_unit,
    # manager_email, tier, application.
    claims: dict[str, str]
    jit_provisioning: bool
    # The JWK Set as JSON text (inline, or the last good fetch); "" when none yet.
    jwks: str
    # A fetched set is trusted until then (ms); None: inline, or not fetched yet.
    good_until_ms: int | None = None


class Workflow(msgspec.Struct):
    """A registered workflow's budget (the core's ``RawWorkflow``)."""

    id: str
    uid: str
    limit_nano: int
    window: str
    # None: anyone may charge it; else these principal indexes and business units.
    principals: list[int] | None = None
    business_units: list[str] = []


class Config(msgspec.Struct):
    seq: int
    kill_switch: bool
    principals: list[Principal]
    keys: list[Key]
    providers: list[Provider]
    models: list[Model]
    grants: list[Grant]
    # More grants, packed (a worker's rebuild: the table, and no list).
    grant_table: GrantTable | None = None
    rules: list[Rule] = []
    # The global switch for rules in mode "inherit".
    enforce_rules: bool = True
    # The IANA zone of the rules' daily, weekly and monthly windows (MESHFAST_CALENDAR_TZ).
    calendar_tz: str = "UTC"
    # Platform token issuers, meshfast's own first.
    issuers: list[Issuer] = []
    workflows: list[Workflow] = []
    # Data protection: {"custom": [(name, pattern)], "policies": [...]} (meshfast.admin.dlp.to_config).
    dlp: dict[str, Any] = {}

    def grant_pairs(self) -> Iterator[tuple[int, int]]:
        """(principal, model) indexes of every grant, the list's and the table's."""
        for grant in self.grants:
            yield grant.principal, grant.model
        if self.grant_table is not None:
            for principal, model, _ in self.grant_table.records():
                yield principal, model


class RulesPart(msgspec.Struct):
    """What ``Core.patch_rules`` takes: the rules, the switch and the calendar."""

    rules: list[Rule]
    enforce_rules: bool
    calendar_tz: str


_encoder = msgspec.msgpack.Encoder()


def encode_part(part: Principal | RulesPart) -> bytes:
    """A patch's bytes (``Core.patch_principal``, ``Core.patch_rules``)."""
    return _encoder.encode(part)


def principal_from_row(row: Any, manager: int | None) -> Principal:
    """A ``users`` row (SNAPSHOT_PRINCIPALS' columns) as the core's principal, its manager given
    as an index."""
    return Principal(
        id=str(row["id"]),
        email=row["email"] or "",
        display_name=row["display_name"],
        status=row["status"],
        expires_at_ms=_ms(row["expires_at"]),
        manager=manager,
        business_unit=row["business_unit"],
        tier=row["tier"],
        application=row.get("kind") == "application",
    )


def usd_to_nanos(value: Decimal | int | float | str) -> int:
    """Decimal USD to integer nano-USD, rounded half up."""
    nanos = (Decimal(value) * NANOS_PER_USD).quantize(Decimal(1), rounding="ROUND_HALF_UP")
    return max(0, int(nanos))


def _ms(ts: dt.datetime | None) -> int | None:
    return None if ts is None else int(ts.timestamp() * 1000)


def _nanos(value: Decimal | None) -> int | None:
    return None if value is None else usd_to_nanos(value)


def _long_context_prices(stored: Any) -> dict[str, int] | None:
    """Stored prices (USD per 1k, by field name) as the core's classes in nano-USD. A key outside
    LONG_CONTEXT_CLASSES passes through unchanged, so the core lists it as an error."""
    if stored is None:
        return None
    if isinstance(stored, str):
        stored = json.loads(stored)
    return {LONG_CONTEXT_CLASSES.get(key, key): usd_to_nanos(value) for key, value in stored.items()}


def _minutes(t: dt.time | None) -> int | None:
    return None if t is None else t.hour * 60 + t.minute


def generic_templates(settings: Any) -> GenericTemplates | None:
    if isinstance(settings, str):
        settings = json.loads(settings)
    fields = {k: v for k, v in (settings or {}).items() if k in GenericTemplates.__struct_fields__}
    if not fields:
        return None
    for name in TEMPLATE_FIELDS:
        if fields.get(name) is not None and not isinstance(fields[name], str):
            fields[name] = json.dumps(fields[name], separators=(",", ":"))
    return msgspec.convert(fields, GenericTemplates)


def provider_from_row(row: asyncpg.Record, master_key: bytes) -> Provider | None:
    provider_id = str(row["id"])
    try:
        api_key = open_sealed(master_key, provider_id, bytes(row["encrypted_api_key"]), bytes(row["key_nonce"]))
    except InvalidTag:
        # NOTE: the provider (and its models) leave the snapshot rather than fail the rebuild.
        log.error("provider %s: sealed api key does not open under this master key; skipped", provider_id)
        return None
    settings = row["settings"]
    if isinstance(settings, str):
        settings = json.loads(settings)
    return Provider(
        id=provider_id,
        name=row["name"],
        family=row["family"],
        max_calls_per_hour=row["max_calls_per_hour"],
        supports_web_search=row["supports_web_search"],
        base_url=row["base_url"],
        api_key=api_key,
        local=row["local"],
        max_outbound_rps=row["max_outbound_rps"],
        max_concurrent_upstream=row["max_concurrent_upstream"],
        admission_share_pct=(settings or {}).get("admission_share_pct"),
        retry_enabled=row["retry_enabled"],
        max_retries=row["max_retries"],
        retry_backoff_ms=row["retry_backoff_ms"],
        log_requests=row["log_requests"],
        web_search_price_nano=usd_to_nanos((settings or {}).get("web_search_price_per_call") or 0),
        generic=generic_templates(settings),
    )


async def load_config(conn: asyncpg.Connection, master_key: bytes) -> Config:
    return build_config(await fetch_config(conn), master_key)


def _key_models(ids: list[str] | None, model_index: dict[Any, int]) -> list[int] | None:
    """A key's model subset as sorted model indexes; a model deleted since drops out (a key whose
    every model is gone may call none)."""
    if ids is None:
        return None
    return sorted({model_index[u] for u in map(uuid.UUID, ids) if u in model_index})


async def fetch_config(conn: asyncpg.Connection) -> dict[str, Any]:
    """Every row the snapshot is built from, read in one REPEATABLE READ transaction."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return {
            "seq": await conn.fetchval(sql.SNAPSHOT_SEQ),
            "kill_switch": bool(await conn.fetchval(sql.SNAPSHOT_KILL_SWITCH)),
            "users": await conn.fetch(sql.SNAPSHOT_PRINCIPALS),
            "keys": await conn.fetch(sql.SNAPSHOT_KEYS),
            "providers": await conn.fetch(sql.SNAPSHOT_PROVIDERS),
            "models": await conn.fetch(sql.SNAPSHOT_MODELS),
            "deployments": await conn.fetch(sql.SNAPSHOT_DEPLOYMENTS),
            "grants": await conn.fetchval(sql.SNAPSHOT_GRANT_TABLE) or b"",
            "grant_terms": await conn.fetch(sql.SNAPSHOT_GRANT_TERMS),
            "enforce_rules": bool(await conn.fetchval(sql.SNAPSHOT_ENFORCE_RULES)),
            "rules": await conn.fetch(sql.SNAPSHOT_RULES),
            "pilots": await conn.fetch(sql.SNAPSHOT_PILOTS),
            "now": await conn.fetchval(sql.SNAPSHOT_NOW),
            "issuers": await conn.fetch(sql.SNAPSHOT_ISSUERS),
            "workflows": await conn.fetch(sql.SNAPSHOT_WORKFLOWS),
            "dlp": await conn.fetch(sql.SNAPSHOT_DLP),
        }


def build_config(rows: dict[str, Any], master_key: bytes) -> Config:
    """The config from ``fetch_config``'s rows (CPU only: a worker runs it off its event loop)."""
    return build_release(rows, master_key)[0]


def build_release(rows: dict[str, Any], master_key: bytes) -> tuple[Config, onboarding.Release]:
    """``build_config``, with what onboarding added (the live pilots' members for the rules'
    ``population.pilots`` and the next moment a pilot or a limited release expires)."""
    config = _config(int(rows["seq"]), rows["kill_switch"], rows["users"], rows["keys"], rows["providers"],
                     rows["models"], rows["deployments"], [], master_key)
    config.grant_table = _grant_table(rows["grants"], rows["grant_terms"], rows["models"], config.models)
    config.enforce_rules = rows["enforce_rules"]
    config.calendar_tz = calendar_tz()
    principal_index = {p.id: i for i, p in enumerate(config.principals)}
    model_index = {m.name: i for i, m in enumerate(config.models)}
    now = rows.get("now") or dt.datetime.now(dt.UTC)
    release = onboarding.apply(config, rows["models"], rows.get("pilots", ()), principal_index, now)
    config.rules = [rules.to_config(json_value(row["body"]), principal_index, model_index, release.pilot_members)
                    for row in rows["rules"]]
    config.rules.extend(release.rules)
    config.workflows = [workflow_from_row(row, principal_index) for row in rows.get("workflows", ())]
    if rows.get("dlp"):
        from meshfast.admin import dlp

        provider_index = {p.name: i for i, p in enumerate(config.providers)}
        config.dlp = dlp.to_config(list(rows["dlp"]), principal_index, model_index, provider_index)
    own = Issuer(**tokens.own_issuer(master_key))
    config.issuers = [own]
    for row in rows.get("issuers", ()):
        if row["issuer"] == own.issuer:
            # NOTE: MESHFAST_TOKEN_ISSUER changed to a configured issuer's name: meshfast's own wins.
            log.warning("issuer %r is meshfast's own token issuer's name: left out", row["issuer"])
            continue
        config.issuers.append(issuer_from_row(row))
    return config, release


def workflow_from_row(row: Any, principal_index: dict[str, int]) -> Workflow:
    """A workflow row (SNAPSHOT_WORKFLOWS) as the core takes it; a listed person or application
    deleted since drops out of its principals."""
    listed = json.loads(row["principals"]) if row["principals"] else None
    people: list[int] | None = None
    units: list[str] = []
    if listed is not None:
        ids = [p.get("user_id") or p.get("application_id") for p in listed]
        people = sorted({principal_index[i] for i in ids if i is not None and i in principal_index})
        units = [p["business_unit"] for p in listed if "business_unit" in p]
    return Workflow(id=row["id"], uid=row["uid"], limit_nano=int(row["limit_nano_usd"]), window=row["window"],
                    principals=people, business_units=units)


def jwks_max_age_s() -> float:
    """MESHFAST_JWKS_MAX_AGE_S (default a day): how long a fetched key set is trusted after the
    fetch that last confirmed it; past it, the issuer's tokens fail closed."""
    try:
        return max(1.0, float(os.environ.get("MESHFAST_JWKS_MAX_AGE_S") or 86400))
    except ValueError:
        return 86400.0


def issuer_from_row(row: Any) -> Issuer:
    """An issuer row (SNAPSHOT_ISSUERS) as the core takes it."""
    good_until_ms = None
    if row["fetched"]:
        published = row["published_at"]
        # NOTE: never fetched: no keys, and a deadline already past (nothing to trust).
        good_until_ms = 0 if published is None else int((published.timestamp() + jwks_max_age_s()) * 1000)
    claims = json.loads(row["claims"]) if isinstance(row["claims"], str) else dict(row["claims"])
    return Issuer(id=row["id"], issuer=row["issuer"], audiences=list(row["audiences"]),
                  algorithms=list(row["algorithms"]), clock_skew_s=row["clock_skew_s"],
                  claims={k: v for k, v in claims.items() if v is not None},
                  jit_provisioning=row["jit_provisioning"], jwks=row["jwks"] or "", good_until_ms=good_until_ms)


def _grant_table(packed: bytes, term_rows: list[asyncpg.Record], model_rows: list[asyncpg.Record],
                 models: list[Model]) -> GrantTable:
    """SNAPSHOT_GRANT_TABLE's bytes over SNAPSHOT_GRANT_TERMS' rows. Its model indexes count every
    model row: when a provider (and so its models) was left out, the grants of those models go
    and the others' indexes are renumbered (slow, but only then)."""
    terms = []
    for k, row in enumerate(term_rows):
        assert row["k"] == k, "grant terms out of order"
        terms.append(GrantTerms(
            daily_cap_nano_usd=usd_to_nanos(row["daily_cap_usd"]),
            max_calls_per_hour=row["max_calls_per_hour"],
            allowed_from_min=_minutes(row["allowed_from"]),
            allowed_to_min=_minutes(row["allowed_to"]),
            timezone=row["timezone"],
            active_days=list(row["active_days"]),
            always_open=row["always_open"],
        ))
    if len(models) < len(model_rows):
        kept = {m.id: i for i, m in enumerate(models)}
        slot = [kept.get(str(row["id"]), -1) for row in model_rows]
        packed = b"".join(GRANT_RECORD.pack(p, slot[m], k) for p, m, k in GRANT_RECORD.iter_unpack(packed)
                          if slot[m] >= 0)
    return GrantTable(packed=packed, terms=terms)


def calendar_tz() -> str:
    """MESHFAST_CALENDAR_TZ (default UTC): the zone of the rules' calendar windows."""
    return os.environ.get("MESHFAST_CALENDAR_TZ") or "UTC"


def json_value(value: Any) -> Any:
    """A jsonb column's value (asyncpg gives text unless a codec is set)."""
    return json.loads(value) if isinstance(value, str) else value


def _restrictions(stored: Any, principal_index: dict[str, int]) -> Restrictions | None:
    """Stored restrictions (user ids) as the core's (indexes; ``principal_index`` by id as text).
    A gone user leaves a list; an allow list whose people are all gone allows nobody but the
    exempt (never everyone)."""
    stored = json_value(stored)
    if not stored:
        return None

    def people(key: str) -> list[int]:
        ids = (str(uuid.UUID(str(i))) for i in stored.get(key) or [] if _is_uuid(i))
        return [principal_index[i] for i in ids if i in principal_index]

    allow = stored.get("leader_allow")
    return Restrictions(
        leader_deny=people("leader_deny"),
        leader_allow=None if allow is None else people("leader_allow"),
        exempt=people("exempt"),
        business_units_closed=list(stored.get("business_units_closed") or []),
        business_units_open=None if stored.get("business_units_open") is None
        else list(stored["business_units_open"]),
    )


def _is_uuid(value: Any) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


async def load_registry(conn: asyncpg.Connection, master_key: bytes) -> Config:
    """Providers, models and deployments only, read in the caller's transaction: what a registry
    write validates before it commits."""
    provider_rows = await conn.fetch(sql.SNAPSHOT_PROVIDERS)
    model_rows = await conn.fetch(sql.SNAPSHOT_MODELS)
    deployment_rows = await conn.fetch(sql.SNAPSHOT_DEPLOYMENTS)
    return _config(0, False, [], [], provider_rows, model_rows, deployment_rows, [], master_key)


def _config(seq: int, kill_switch: bool, user_rows: list[asyncpg.Record], key_rows: list[asyncpg.Record],
            provider_rows: list[asyncpg.Record], model_rows: list[asyncpg.Record],
            deployment_rows: list[asyncpg.Record], grant_rows: list[asyncpg.Record], master_key: bytes) -> Config:
    principal_index = {row["id"]: i for i, row in enumerate(user_rows)}
    providers = [p for p in (provider_from_row(row, master_key) for row in provider_rows) if p is not None]
    provider_index = {uuid.UUID(p.id): i for i, p in enumerate(providers)}
    models = [row for row in model_rows if row["provider_id"] in provider_index]
    model_index = {row["id"]: i for i, row in enumerate(models)}
    deployments: dict[uuid.UUID, list[Deployment]] = {}
    for row in deployment_rows:
        if row["provider_id"] in provider_index:
            deployments.setdefault(row["model_id"], []).append(Deployment(
                id=str(row["id"]), provider=provider_index[row["provider_id"]],
                resolved_model=row["resolved_model"], region=row["region"], priority=row["priority"]))

    return Config(
        seq=seq,
        kill_switch=kill_switch,
        principals=[principal_from_row(row, row["manager"]) for row in user_rows],
        keys=[
            Key(
                id=row["id"],
                principal=row["principal"],
                digest=row["key_hash"],
                status=row["status"],
                expires_at_ms=_ms(row["expires_at"]),
                models=_key_models(row.get("models"), model_index),
            )
            for row in key_rows
        ],
        providers=providers,
        models=[
            Model(
                id=str(row["id"]),
                name=row["name"],
                provider=provider_index[row["provider_id"]],
                resolved_model=row["resolved_model"],
                max_output_tokens=row["max_output_tokens"],
                price_per_second_nano=usd_to_nanos(row["price_per_second"]),
                kind=row["kind"],
                created_ms=_ms(row["created_at"]) or 0,
                blocked=row["blocked"],
                status=row["status"],
                supports_image_in=row["supports_image_in"],
                supports_document_in=row["supports_document_in"],
                supports_audio_in=row["supports_audio_in"],
                supports_video_in=row["supports_video_in"],
                supports_web_search=row["supports_web_search"],
                output_media_type=row["output_media_type"],
                input_price_nano_per_1k=usd_to_nanos(row["input_price_per_1k_tokens"]),
                output_price_nano_per_1k=usd_to_nanos(row["output_price_per_1k_tokens"]),
                cache_read_price_nano_per_1k=_nanos(row["cache_read_price_per_1k_tokens"]),
                cache_write_price_nano_per_1k=_nanos(row["cache_write_price_per_1k_tokens"]),
                cache_write_1h_price_nano_per_1k=_nanos(row["cache_write_1h_price_per_1k_tokens"]),
                long_context_threshold_tokens=row["long_context_threshold_tokens"],
                long_context_prices=_long_context_prices(row["long_context_prices"]),
                aliases=list(row["aliases"]),
                tags=list(row["tags"]),
                deployments=deployments.get(row["id"], []),
                restrictions=_restrictions(row.get("restrictions"), principal_index),
                cache_shaping=row.get("cache_shaping", True),
                cache_ttl=row.get("cache_ttl") or "5m",
            )
            for row in models
        ],
        grants=[
            Grant(
                principal=principal_index[row["user_id"]],
                model=model_index[row["model_id"]],
                daily_cap_nano_usd=usd_to_nanos(row["daily_cap_usd"]),
                max_calls_per_hour=row["max_calls_per_hour"],
                allowed_from_min=_minutes(row["allowed_from"]),
                allowed_to_min=_minutes(row["allowed_to"]),
                timezone=row["timezone"],
                active_days=list(row["active_days"]),
                always_open=row["always_open"],
            )
            for row in grant_rows
            if row["user_id"] in principal_index and row["model_id"] in model_index
        ],
    )


def encode(config: Config) -> bytes:
    return _encoder.encode(config)


def registry_errors(config: Config) -> list[str]:
    """Every problem the core finds building a snapshot of ``config``; empty when it would load."""
    try:
        Core(b"registry-check").load(encode(config))
    except SnapshotError as exc:
        return list(exc.errors)
    return []
