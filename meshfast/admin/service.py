"""Admin-plane operations: every write is one transaction that bumps the config sequence,
sends NOTIFY (delivered on commit) and appends to the audit log."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import tomllib
import uuid
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

import asyncpg
import msgspec
from msgspec import UNSET, Meta, UnsetType

from meshfast import errors, rules, snapshot, validate
from meshfast.admin import dlp as dlp_admin
from meshfast.admin import issuers as issuer_admin
from meshfast.admin import rules as rule_admin
from meshfast.admin import workflows as workflow_admin
from meshfast.sealing import open_sealed, seal
from meshfast.secrets import Secrets, new_mesh_key
from meshfast.store import applications as applications_sql
from meshfast.store import sql
from meshfast.validate import (
    ApiKey,
    BackoffMs,
    DisplayName,
    Email,
    Id,
    Int32,
    Label,
    Name,
    Names,
    Path,
    Percent,
    Positive,
    Retries,
    Url,
    Weekdays,
    Word,
    Words,
)
from meshfast.verify import wants_verify

FAMILIES = ("openai", "openai_responses", "anthropic", "gemini", "ollama", "generic")
MODEL_KINDS = ("chat", "embedding", "image_generation", "video_generation")


# --- request bodies ------------------------------------------------------------------------


# A moment in a body: RFC 3339 with its offset (a time without one would mean a different
# instant on every host), between validate.EARLIEST and validate.LATEST (checked by _moment).
Timestamp = Annotated[dt.datetime, Meta(tz=True)]


class UserCreate(msgspec.Struct, forbid_unknown_fields=True):
    email: Email
    display_name: DisplayName
    # An existing user's email; the user stores the manager's id.
    manager_email: Email | None = None
    business_unit: Label | None = None
    tier: Label | None = None


class UserUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """``PUT /admin/users/{id}``: a field left out is kept, ``null`` clears it (``display_name``
    cannot be cleared). The manager is named by ``manager_id`` or ``manager_email``, not both."""

    display_name: DisplayName | UnsetType = UNSET
    manager_id: Id | None | UnsetType = UNSET
    manager_email: Email | None | UnsetType = UNSET
    business_unit: Label | None | UnsetType = UNSET
    tier: Label | None | UnsetType = UNSET
    # After this moment the user's keys are refused (401) on every worker.
    expires_at: Timestamp | None | UnsetType = UNSET


KeyName = Annotated[str, Meta(min_length=1, max_length=64)]
# The longest overlap a rotation may give the key it replaces: 30 days.
MAX_OVERLAP_S = 30 * 86_400


class KeyCreate(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /admin/users/{id}/keys``: a named key, with an optional expiry and model subset."""

    name: KeyName
    expires_at: Timestamp | None = None
    # Model ids; absent or null: every model the person is granted.
    models: Annotated[list[Id], Meta(max_length=1024)] | None = None


class KeyRotate(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /admin/keys/{id}/rotate``: the old key keeps working ``overlap_s`` seconds."""

    overlap_s: Annotated[int, Meta(ge=0, le=MAX_OVERLAP_S)] = 0


class ExpiryBody(msgspec.Struct, forbid_unknown_fields=True):
    """``PUT /admin/users/{id}/expiry`` (Mesh's) and ``PUT /admin/users/{id}/key/expiry``: an
    RFC 3339 moment with its offset, or ``null`` for none."""

    expires_at: Timestamp | None


class GenericSettings(snapshot.GenericTemplates, forbid_unknown_fields=True, omit_defaults=True):
    """Mesh's provider-as-data fields as the admin API takes them: templates with placeholders
    and dot paths (the snapshot's fields), with body templates as JSON values or JSON text.

    Required for family ``generic``; for the other families the built-in preset is used and
    these fields are stored only where the preset has no equivalent (a custom done signal,
    generation endpoints).
    """

    request_body_template: Any = None
    web_search_request_body_template: Any = None
    embedding_request_body_template: Any = None
    generation_request_body_template: Any = None
    # The snapshot's other fields, with the admin API's limits (validate.py's table).
    endpoint_url: Url | None = None
    http_method: Word = "POST"
    header_template: dict[Name, Annotated[str, Meta(max_length=8192)]] | None = None
    response_delta_path: Path | None = None
    response_done_signal: Label | None = None
    usage_input_tokens_path: Path | None = None
    usage_output_tokens_path: Path | None = None
    embedding_endpoint_url: Url | None = None
    embedding_response_vector_path: Path | None = None
    embedding_usage_tokens_path: Path | None = None
    generation_endpoint_url: Url | None = None
    generation_response_media_path: Path | None = None
    generation_mode: Word = "sync"
    generation_job_id_path: Path | None = None
    generation_status_url_template: Url | None = None
    generation_status_path: Path | None = None
    generation_content_url_template: Url | None = None
    generation_status_success_values: Words | None = None
    generation_status_failure_values: Words | None = None
    generation_poll_interval_ms: Annotated[int, Meta(ge=1, le=3_600_000)] | None = None
    generation_max_wait_seconds: Annotated[int, Meta(ge=1, le=86_400)] | None = None
    generation_duration_seconds_path: Path | None = None


_GENERIC_FIELDS = tuple(GenericSettings.__struct_fields__)


class ProviderCreate(GenericSettings, forbid_unknown_fields=True, kw_only=True):
    name: Name
    family: Word
    base_url: Url
    api_key: ApiKey
    local: bool = False
    verify: bool = True
    max_outbound_rps: Positive | None = None
    max_concurrent_upstream: Positive | None = None
    max_calls_per_hour: Positive | None = None
    retry_enabled: bool = True
    max_retries: Retries = 2
    retry_backoff_ms: BackoffMs = 200
    log_requests: bool = True
    supports_web_search: bool = False
    web_search_price_per_call: Decimal = Decimal(0)
    # Largest share (1-100 %) of the process-wide admission weight this provider's calls may hold.
    admission_share_pct: Percent | None = None
    # Models created with the provider, in the same transaction: ModelCreate bodies without provider_id.
    models: Annotated[list[dict[str, Any]], Meta(max_length=256)] | None = None


def provider_settings(body: ProviderCreate) -> dict[str, Any]:
    """Validate the template fields and return them as the stored ``settings`` object."""
    generic = GenericSettings(**{name: getattr(body, name) for name in _GENERIC_FIELDS})
    problems: list[str] = []
    if body.family == "generic":
        for required in ("endpoint_url", "header_template", "request_body_template", "response_delta_path"):
            if not getattr(generic, required):
                problems.append(f"{required} is required for family generic")
    for name in snapshot.TEMPLATE_FIELDS:
        template = getattr(generic, name)
        if template is None:
            continue
        if isinstance(template, str):
            # NOTE: msgspec, not json: json.loads takes NaN and lone surrogates, which jsonb refuses.
            try:
                template = msgspec.json.decode(template)
            except msgspec.DecodeError:
                problems.append(f"{name} is not valid JSON")
                continue
            except RecursionError:
                problems.append(f"{name} nests deeper than {validate.MAX_DEPTH} levels")
                continue
            try:
                validate.check(template, name)
            except errors.InvalidRequest as exc:
                problems.append(str(exc.detail))
                continue
            setattr(generic, name, template)
        if "{{api_key}}" in json.dumps(template):
            problems.append(f"{name} may not contain {{{{api_key}}}}: the key goes in headers or the URL only")
    for name in _TEMPLATE_URLS:
        url = getattr(generic, name)
        problem = None if url is None else _template_url_problem(url, name, local=body.local)
        if problem is not None:
            problems.append(problem)
    for header, value in (generic.header_template or {}).items():
        if not header or not all(c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in header):
            problems.append(f"header_template: {header[:64]!r} is not a valid header name")
        elif validate.control_problem(value) is not None:
            problems.append(f"header_template.{header} {validate.control_problem(value)}")
    if generic.generation_mode not in ("sync", "async_poll"):
        problems.append("generation_mode must be sync or async_poll")
    elif generic.generation_mode == "async_poll":
        for required in ("generation_job_id_path", "generation_status_url_template",
                         "generation_status_path", "generation_content_url_template"):
            if not getattr(generic, required):
                problems.append(f"{required} is required for generation_mode async_poll")
    web_search_price: Decimal | None = Decimal(0)
    try:
        web_search_price = _price(body.web_search_price_per_call, "web_search_price_per_call")
    except errors.InvalidRequest as exc:
        problems.append(str(exc.detail))
    if body.admission_share_pct is not None and not 1 <= body.admission_share_pct <= 100:
        problems.append("admission_share_pct must be between 1 and 100")
    if problems:
        raise errors.InvalidRequest("; ".join(problems))
    settings = msgspec.to_builtins(generic)
    settings["web_search_price_per_call"] = str(web_search_price)
    if body.admission_share_pct is not None:
        settings["admission_share_pct"] = body.admission_share_pct
    return settings


Price = Decimal


class ModelCreate(msgspec.Struct, forbid_unknown_fields=True):
    provider_id: Id
    name: Name
    resolved_model: Name
    kind: Word = "chat"
    input_price_per_1k_tokens: Price = Decimal(0)
    output_price_per_1k_tokens: Price = Decimal(0)
    # Unset cache prices: cache reads and writes cost the input price, 1 h writes the 5 min one.
    cache_read_price_per_1k_tokens: Price | None = None
    cache_write_price_per_1k_tokens: Price | None = None
    cache_write_1h_price_per_1k_tokens: Price | None = None
    # Above this many prompt tokens (input and cached), the long-context tier prices every class:
    # keyed by the price fields above (input, output and cache); a class it leaves out keeps its price.
    long_context_threshold_tokens: Positive | None = None
    long_context_prices: dict[Word, Price] | None = None
    price_per_second: Price = Decimal(0)
    max_output_tokens: Int32 = 4096
    aliases: Names = []
    tags: Names = []
    supports_image_in: bool = False
    supports_document_in: bool = False
    supports_audio_in: bool = False
    supports_video_in: bool = False
    supports_web_search: bool = False
    output_media_type: Label | None = None
    # Prompt-cache shaping (API.md): on by default; the TTL of the breakpoints it places for an
    # Anthropic upstream.
    cache_shaping: bool = True
    cache_ttl: Literal["5m", "1h"] = "5m"
    verify: bool | None = None


MODEL_STATUSES = ("active", "blocked", "retired")


class ModelUpdate(ModelCreate, forbid_unknown_fields=True):
    """``PUT /admin/models/{id}``: the create fields (``verify`` is ignored) and, optionally, the
    status; a body that is only ``{"status": ...}`` changes the status alone."""

    # active, blocked or retired; a blocked or retired model answers as an unknown one (404) on
    # the standard routes and 403 model_blocked on the Mesh-native ones. Left out: kept.
    status: Word | None = None
    # Who may see the model (leaders denied or allowed, exemptions, business units closed or
    # open); a refused caller gets the unknown model's 404. Left out: kept; null: cleared.
    restrictions: rules.RestrictionsBody | None | UnsetType = UNSET


class ModelStatusBody(msgspec.Struct, forbid_unknown_fields=True):
    """A model PUT that changes only the status or the restrictions (or both)."""

    status: Word | None = None
    restrictions: rules.RestrictionsBody | None | UnsetType = UNSET


def decode_model_update(body: bytes) -> ModelUpdate | ModelStatusBody:
    """A model PUT's body: the status or the restrictions alone, or the whole model (see
    :class:`ModelUpdate`)."""
    try:
        fields = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        fields = None  # the strict decode below answers the 400
    if isinstance(fields, dict) and fields and set(fields) <= {"status", "restrictions"}:
        return decode(body, ModelStatusBody)
    return decode(body, ModelUpdate)


def _status_columns(status: str) -> tuple[str, bool]:
    """The API's status as the stored ``(status, blocked)`` pair (Mesh keeps them apart)."""
    if status not in MODEL_STATUSES:
        raise errors.InvalidRequest(f"status must be one of {', '.join(MODEL_STATUSES)}")
    return ("retired" if status == "retired" else "active"), status == "blocked"


class AccessBody(msgspec.Struct, forbid_unknown_fields=True):
    """A grant: ``{user_id, model_id}`` or ``{application_id, model_id}``."""

    model_id: Id
    user_id: Id | None = None
    application_id: Id | None = None


def _access_principal(body: AccessBody) -> tuple[uuid.UUID, str]:
    """The grant's principal and its kind: exactly one of user_id and application_id."""
    if (body.user_id is None) == (body.application_id is None):
        raise errors.InvalidRequest("give user_id or application_id, not both")
    if body.user_id is not None:
        return _body_uuid(body.user_id, "user_id"), "user"
    assert body.application_id is not None
    return _body_uuid(body.application_id, "application_id"), "application"


def _missing(kind: str) -> type[errors.MeshfastError]:
    """The 404 of a principal of ``kind`` that does not exist."""
    return errors.ApplicationNotFound if kind == "application" else errors.UserNotFound


class PolicyBody(msgspec.Struct, forbid_unknown_fields=True):
    daily_cap_usd: Price = Decimal(20)
    max_calls_per_hour: Int32 | None = None
    allowed_from: Word | None = None
    allowed_to: Word | None = None
    timezone: Word = "UTC"
    active_days: Weekdays = msgspec.field(default_factory=lambda: [0, 1, 2, 3, 4, 5, 6])
    always_open: bool = False


class KillSwitchBody(msgspec.Struct, forbid_unknown_fields=True):
    tripped: bool


# Strict decoding of every admin body, with validate.py's limits and string check.
decode = validate.decode


# --- validation helpers --------------------------------------------------------------------


def parse_uuid(value: str, missing: type[errors.MeshfastError] = errors.NotFound) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise missing() from None


def _body_uuid(value: str, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise errors.InvalidRequest(f"{field} must be a UUID string") from None


def _price(value: Price | None, field: str) -> Decimal | None:
    if value is None:
        return None
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise errors.InvalidRequest(f"{field} must be a decimal number") from None
    if not price.is_finite() or price < 0:
        raise errors.InvalidRequest(f"{field} must be a non-negative number")
    if price >= Decimal("10000000"):
        raise errors.InvalidRequest(f"{field} is too large")
    return price


def _nonempty(value: str, field: str) -> str:
    value = value.strip()
    if not value:
        raise errors.InvalidRequest(f"{field} is required")
    return value


def _email(value: str, field: str = "email") -> str:
    value = value.strip().lower()
    if "@" not in value or len(value) > 320 or any(c.isspace() for c in value):
        raise errors.InvalidRequest(f"{field} is not a valid address")
    return value


def label(value: str | None, field: str) -> str | None:
    """A business unit or tier as stored (see ``_label``)."""
    return _label(value, field)


def _label(value: str | None, field: str) -> str | None:
    """A business unit or tier as stored: stripped; ``None`` clears it, an empty one is refused."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise errors.InvalidRequest(f"{field} may not be empty (null clears it)")
    return value


def _moment(value: dt.datetime | None, field: str) -> dt.datetime | None:
    if value is not None and not validate.EARLIEST <= value <= validate.LATEST:
        raise errors.InvalidRequest(f"{field} must be between {validate.EARLIEST.date()} and {validate.LATEST.date()}")
    return value


def check_base_url(base_url: str, *, local: bool) -> str:
    """The URL as stored; a 400 for one that is not an absolute http(s) URL, that parsers could
    read two ways, or (unless ``local``) that names a non-public address in any spelling (see
    :func:`validate.url_problem`; the connect-time guard checks what names resolve to)."""
    url = base_url.strip()
    problem = validate.url_problem(url, "base_url", local=local)
    if problem is not None:
        raise errors.InvalidRequest(problem, errors=[problem])
    return url.rstrip("/")


_PLACEHOLDER = re.compile(r"\{\{[^{}]*\}\}")
# A generic provider's own URLs (with {{placeholders}}): called as they are, so held to base_url's rules.
_TEMPLATE_URLS = ("endpoint_url", "embedding_endpoint_url", "generation_endpoint_url",
                  "generation_status_url_template", "generation_content_url_template")


def _template_url_problem(url: str, field: str, *, local: bool) -> str | None:
    """A URL template's problem: every placeholder read as a plain label; a template that does
    not start with a fixed http(s) origin (the URL comes from a provider's answer) is only
    checked for characters that would break the request line."""
    filled = _PLACEHOLDER.sub("x", url.strip())
    if filled.startswith(("http://", "https://")):
        return validate.url_problem(filled, field, local=local)
    problem = validate.control_problem(url)
    return None if problem is None else f"{field} {problem}"


def _hhmm(value: str | None, field: str) -> dt.time | None:
    if value is None:
        return None
    try:
        hours, minutes = value.split(":")
        if len(hours) != 2 or len(minutes) != 2:
            raise ValueError
        return dt.time(int(hours), int(minutes))
    except ValueError:
        raise errors.InvalidRequest(f"{field} must be HH:MM") from None


async def _manager_by_email(conn: asyncpg.Connection, email: str) -> uuid.UUID:
    manager_id = await conn.fetchval(sql.USER_ID_BY_EMAIL, email)
    if manager_id is None:
        raise errors.InvalidRequest("manager_email names no user")
    return manager_id


# --- JSON shapes ---------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.time):
        return value.strftime("%H:%M")
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def row_json(row: asyncpg.Record) -> dict[str, Any]:
    out = {key: _jsonable(value) for key, value in row.items()}
    for key in ("settings", "long_context_prices", "restrictions"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out


def _model_json(row: asyncpg.Record) -> dict[str, Any]:
    """A model as the API shows it: ``status`` is active, blocked or retired (``blocked`` stays,
    as Mesh's flag)."""
    out = row_json(row)
    if out.get("blocked") and out.get("status") == "active":
        out["status"] = "blocked"
    return out


def _invalid(problems: list[str]) -> errors.MeshfastError:
    """One 400 listing every problem: in ``detail`` as a sentence, in ``errors`` one by one."""
    return errors.InvalidRequest("; ".join(problems), errors=problems)


def _tags(values: list[str], problems: list[str]) -> list[str]:
    """Stripped, non-empty, each once (first-seen order)."""
    out: list[str] = []
    for value in values:
        value = value.strip()
        if not value:
            problems.append("tags may not hold an empty tag")
        elif value not in out:
            out.append(value)
    return out


def _model_args(body: ModelCreate) -> tuple[Any, ...]:
    """Validate a model body (every problem listed); the stored columns, in INSERT_MODEL order
    after provider_id. Clashes with other models' names and aliases are the registry check's."""
    problems: list[str] = []
    if body.kind not in MODEL_KINDS:
        problems.append(f"kind must be one of {', '.join(MODEL_KINDS)}")
    name, resolved = body.name.strip(), body.resolved_model.strip()
    if not name:
        problems.append("name is required")
    if not resolved:
        problems.append("resolved_model is required")
    if body.max_output_tokens <= 0:
        problems.append("max_output_tokens must be positive")
    if body.long_context_threshold_tokens is not None and body.long_context_threshold_tokens <= 0:
        problems.append("long_context_threshold_tokens must be positive")
    if (body.long_context_threshold_tokens is None) != (body.long_context_prices is None):
        problems.append("long_context_threshold_tokens and long_context_prices go together")
    long_context = None
    if body.long_context_prices is not None:
        unknown = sorted(set(body.long_context_prices) - set(snapshot.LONG_CONTEXT_CLASSES))
        if unknown:
            problems.append(f"long_context_prices takes {', '.join(snapshot.LONG_CONTEXT_CLASSES)}; "
                            f"unknown: {', '.join(unknown)}")
    # NOTE: alias problems (empty, repeated, clashing with any name or alias) are the registry
    # check's, which lists every one of them at once.
    aliases = [alias.strip() for alias in body.aliases]
    tags = _tags(body.tags, problems)
    prices: dict[str, Decimal | None] = {}
    for field in ("input_price_per_1k_tokens", "output_price_per_1k_tokens", "cache_read_price_per_1k_tokens",
                  "cache_write_price_per_1k_tokens", "cache_write_1h_price_per_1k_tokens", "price_per_second"):
        try:
            prices[field] = _price(getattr(body, field), field)
        except errors.InvalidRequest as exc:
            problems.append(str(exc.detail))
    if body.long_context_prices is not None:
        long_context = {}
        for key, value in body.long_context_prices.items():
            try:
                long_context[key] = str(_price(value, f"long_context_prices.{key}"))
            except errors.InvalidRequest as exc:
                problems.append(str(exc.detail))
    if problems:
        raise _invalid(problems)
    return (
        name, resolved, body.kind,
        prices["input_price_per_1k_tokens"], prices["output_price_per_1k_tokens"],
        prices["cache_read_price_per_1k_tokens"], prices["cache_write_price_per_1k_tokens"],
        prices["cache_write_1h_price_per_1k_tokens"],
        body.long_context_threshold_tokens, None if long_context is None else json.dumps(long_context),
        prices["price_per_second"], body.max_output_tokens, aliases, tags,
        body.supports_image_in, body.supports_document_in, body.supports_audio_in, body.supports_video_in,
        body.supports_web_search, body.output_media_type, body.cache_shaping, body.cache_ttl,
    )


def _model_insert(body: ModelCreate) -> Callable[[asyncpg.Connection, uuid.UUID], Awaitable[uuid.UUID]]:
    """Validate a model body now; return the insert to run inside the write transaction."""
    args = _model_args(body)

    async def insert(conn: asyncpg.Connection, provider_id: uuid.UUID) -> uuid.UUID:
        try:
            return await conn.fetchval(sql.INSERT_MODEL, provider_id, *args)
        except asyncpg.UniqueViolationError:
            raise errors.ModelExists() from None

    return insert


class DeploymentCreate(msgspec.Struct, forbid_unknown_fields=True):
    provider_id: Id
    resolved_model: Name
    region: Name | None = None
    # Lower first; the model's own provider comes before every deployment.
    priority: Int32 = 100


def _deployment_args(body: DeploymentCreate) -> tuple[str, str | None, int]:
    problems: list[str] = []
    resolved = body.resolved_model.strip()
    if not resolved:
        problems.append("resolved_model is required")
    region = None if body.region is None else body.region.strip()
    if region == "":
        problems.append("region may not be empty (leave it out)")
    if not -1_000_000 <= body.priority <= 1_000_000:
        problems.append("priority must be between -1000000 and 1000000")
    if problems:
        raise _invalid(problems)
    return resolved, region, body.priority


def _provider_fields(body: ProviderCreate) -> tuple[str, str, str, dict[str, Any]]:
    """Validate a provider body; ``(name, api_key, base_url, settings)`` as stored."""
    if body.family not in FAMILIES:
        raise errors.InvalidRequest(f"family must be one of {', '.join(FAMILIES)}")
    name = _nonempty(body.name, "name")
    api_key = _nonempty(body.api_key, "api_key")
    if validate.control_problem(api_key) is not None:
        # NOTE: the key goes into a header on every call; a line break there fails each one.
        raise errors.InvalidRequest(f"api_key {validate.control_problem(api_key)}")
    base_url = check_base_url(body.base_url, local=body.local)
    for field in ("max_outbound_rps", "max_concurrent_upstream", "max_calls_per_hour"):
        value = getattr(body, field)
        if value is not None and value <= 0:
            raise errors.InvalidRequest(f"{field} must be positive")
    if body.max_retries < 0 or body.retry_backoff_ms < 0:
        raise errors.InvalidRequest("max_retries and retry_backoff_ms must be non-negative")
    return name, api_key, base_url, provider_settings(body)


# --- registry files ------------------------------------------------------------------------


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
    for refused, why in (("provider_id", "name the provider with provider"), ("verify", "files make no live calls")):
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


# --- the service ---------------------------------------------------------------------------

# Called after a committed write with its config sequence and what changed ("" = anything; see
# ConfigFeed for the changes a worker applies without a rebuild).
Rebuild = Callable[[int, str], Awaitable[None]]
Verifier = Callable[[snapshot.Provider, list[snapshot.Model]], Awaitable[list[Any]]]


def _snapshot_model(body: ModelCreate) -> snapshot.Model:
    """The model as the core sees it, for a verification call before it is saved."""
    return snapshot.Model(
        id=str(uuid.uuid4()), name=body.name, provider=0, resolved_model=body.resolved_model,
        max_output_tokens=body.max_output_tokens,
        price_per_second_nano=snapshot.usd_to_nanos(body.price_per_second or 0), kind=body.kind, created_ms=0,
        blocked=False, status="active", supports_image_in=body.supports_image_in,
        supports_document_in=body.supports_document_in, supports_audio_in=body.supports_audio_in,
        supports_video_in=body.supports_video_in, supports_web_search=body.supports_web_search,
        output_media_type=body.output_media_type, cache_shaping=body.cache_shaping, cache_ttl=body.cache_ttl,
        input_price_nano_per_1k=snapshot.usd_to_nanos(body.input_price_per_1k_tokens or 0),
        output_price_nano_per_1k=snapshot.usd_to_nanos(body.output_price_per_1k_tokens or 0),
    )


class AdminService:
    def __init__(self, pool: asyncpg.Pool, secrets: Secrets, after_write: Rebuild,
                 verifier: Verifier | None = None, dry_run: rule_admin.DryRun | None = None) -> None:
        self._pool = pool
        self._secrets = secrets
        self._after_write = after_write
        self._verifier = verifier
        # A draft rule against the serving worker's core (POST /admin/rules/dry-run).
        self.dry_run = dry_run

    async def _verify(self, provider: snapshot.Provider, models: list[ModelCreate]) -> None:
        """One live call per model that wants it; 422 with every failure, nothing written."""
        wanted = [_snapshot_model(m) for m in models if wants_verify(m.kind, m.verify)]
        if self._verifier is None or not wanted:
            return
        failures = await self._verifier(provider, wanted)
        if failures:
            raise errors.VerificationFailed(failures=[msgspec.to_builtins(f) for f in failures])

    async def _write(self, actor: str, action: str, target: str | None, detail: dict[str, Any],
                     work: Callable[[asyncpg.Connection], Awaitable[Any]], *, registry: bool = False,
                     change: str = "") -> Any:
        """Run ``work`` in a transaction with the config bump, NOTIFY and audit row.

        ``change`` names what the write changed when a worker can apply it without a rebuild
        (``user:<id>``: one user's organisation, status or expiry; ``rules``: the rules or the
        switch); it travels in the NOTIFY payload as ``<seq>:<change>``.

        A ``registry`` write (providers, models, deployments) holds the registry lock and commits
        only if the registry it leaves passes the core's validation (see :meth:`_check_registry`).
        """
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                if registry:
                    await conn.execute(sql.LOCK_REGISTRY)
                result = await work(conn)
                if registry:
                    await self._check_registry(conn)
                seq = await conn.fetchval(sql.NEXT_CONFIG_SEQ)
                await conn.execute(sql.NOTIFY_CONFIG, f"{seq}:{change}" if change else str(seq))
                await conn.execute(sql.INSERT_AUDIT, actor, action, target, json.dumps(detail))
        await self._after_write(int(seq), change)
        return result

    async def _check_registry(self, conn: asyncpg.Connection) -> None:
        """400 listing every problem of the registry as this transaction would commit it, by the
        same validation the workers' snapshot build runs: names and aliases unique together,
        prices, the long-context tier, and every deployment serving what its model advertises.
        So the stored registry stays one the workers accept."""
        problems = snapshot.registry_errors(await snapshot.load_registry(conn, self._secrets.master_key))
        if problems:
            raise _invalid(problems)

    # users and keys

    async def create_user(self, actor: str, body: UserCreate) -> dict[str, Any]:
        email = _email(body.email)
        display_name = _nonempty(body.display_name, "display_name")
        manager_email = None if body.manager_email is None else _email(body.manager_email, "manager_email")
        business_unit, tier = _label(body.business_unit, "business_unit"), _label(body.tier, "tier")
        key, prefix = new_mesh_key()
        digest = self._secrets.hash_key(key)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            # NOTE: a new user has no reports, so naming a manager cannot close a loop.
            manager_id = None if manager_email is None else await _manager_by_email(conn, manager_email)
            try:
                row = await conn.fetchrow(sql.INSERT_USER, email, display_name, manager_id, business_unit, tier)
            except asyncpg.UniqueViolationError:
                raise errors.EmailExists() from None
            await conn.execute(sql.INSERT_KEY, row["id"], digest, prefix)
            return row

        row = await self._write(actor, "create_user", email, {}, work)
        return {"id": str(row["id"]), "email": row["email"], "display_name": row["display_name"],
                "key": key, "key_prefix": prefix}

    async def rotate_key(self, actor: str, user_id: str) -> dict[str, Any]:
        uid = parse_uuid(user_id, errors.UserNotFound)
        key, prefix = new_mesh_key()
        digest = self._secrets.hash_key(key)

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.LOCK_USER, uid) is None or await conn.fetchval(sql.ACTIVATE_USER, uid) is None:
                raise errors.UserNotFound()
            # NOTE: the primary key only; the person's named keys stay as they are.
            await conn.execute(sql.REVOKE_PRIMARY_KEYS, uid)
            await conn.execute(sql.INSERT_KEY, uid, digest, prefix)

        await self._write(actor, "rotate_user_key", str(uid), {}, work)
        return {"key": key, "key_prefix": prefix}

    # named keys

    @staticmethod
    def _key_json(row: asyncpg.Record) -> dict[str, Any]:
        """A key as listed: never the key itself (only its prefix)."""
        out = row_json(row)
        out["primary"] = row["name"] is None
        expired = row["expires_at"] is not None and row["expires_at"] <= dt.datetime.now(dt.UTC)
        out["current"] = row["status"] == "active" and row["replaced_by"] is None and not expired
        return out

    async def create_key(self, actor: str, user_id: str, body: KeyCreate, kind: str = "user") -> dict[str, Any]:
        """``POST /admin/users/{id}/keys`` (``kind`` user) or ``/admin/applications/{id}/keys``."""
        missing = _missing(kind)
        uid = parse_uuid(user_id, missing)
        name = body.name.strip()
        if not name:
            raise errors.InvalidRequest("name is required")
        moment = _moment(body.expires_at, "expires_at")
        if moment is not None and moment <= dt.datetime.now(dt.UTC):
            raise errors.InvalidRequest("expires_at must be in the future")
        models = None
        if body.models is not None:
            if not body.models:
                raise errors.InvalidRequest("models lists at least one model id (leave it out for every model)")
            try:
                models = sorted({uuid.UUID(m) for m in body.models})
            except ValueError:
                raise errors.InvalidRequest("models lists model ids (UUIDs)") from None
        key, prefix = new_mesh_key()
        digest = self._secrets.hash_key(key)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            # NOTE: the person's row locked, as every key change does: changes to one person's
            # keys take turns (the unique indexes then never see two at once).
            if await conn.fetchval(sql.LOCK_PRINCIPAL, uid, kind) is None:
                raise missing()
            if models:
                found = {r["id"] for r in await conn.fetch(sql.MODELS_EXISTING, models)}
                unknown = [str(m) for m in models if m not in found]
                if unknown:
                    raise errors.InvalidRequest(f"models: no model has the id {', '.join(unknown)}")
            try:
                return await conn.fetchrow(sql.INSERT_NAMED_KEY, uid, digest, prefix, name, moment, models)
            except asyncpg.UniqueViolationError:
                raise errors.KeyNameExists() from None

        row = await self._write(actor, "create_key", str(uid), {"name": name}, work)
        return {**self._key_json(row), "key": key}

    async def list_keys(self, user_id: str, kind: str = "user") -> list[dict[str, Any]]:
        missing = _missing(kind)
        uid = parse_uuid(user_id, missing)
        async with self._pool.acquire() as conn:
            if await conn.fetchval(sql.PRINCIPAL_EXISTS, uid, kind) is None:
                raise missing()
            return [self._key_json(r) for r in await conn.fetch(sql.LIST_USER_KEYS, uid)]

    async def rotate_key_by_id(self, actor: str, key_id: str, body: KeyRotate) -> dict[str, Any]:
        """A new key with the old one's name, models and expiry; the old one works ``overlap_s``
        more seconds (never past its own expiry), or stops at once without an overlap."""
        kid = parse_uuid(key_id, errors.KeyNotFound)
        key, prefix = new_mesh_key()
        digest = self._secrets.hash_key(key)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            owner = await conn.fetchval(sql.KEY_OWNER, kid)
            if owner is None:
                raise errors.KeyNotFound()
            await conn.fetchval(sql.LOCK_USER, owner)
            old = await conn.fetchrow(sql.KEY_FOR_UPDATE, kid)
            if old is None:
                raise errors.KeyNotFound()
            expired = old["expires_at"] is not None and old["expires_at"] <= await conn.fetchval(sql.NOW)
            if old["status"] != "active" or old["replaced_by"] is not None or expired:
                raise errors.KeyNotCurrent()
            until = None
            if body.overlap_s:
                until = await conn.fetchval(sql.NOW_PLUS_SECONDS, body.overlap_s)
            # NOTE: the old key leaves the unique indexes (replaced, by itself for a moment)
            # before its successor takes its place.
            await conn.execute(sql.RETIRE_KEY, kid, kid, until)
            new = await conn.fetchrow(sql.INSERT_NAMED_KEY, old["user_id"], digest, prefix, old["name"],
                                      old["expires_at"], old["models"])
            await conn.execute(sql.SET_REPLACED_BY, kid, new["id"])
            return new

        row = await self._write(actor, "rotate_key", str(kid), {"overlap_s": body.overlap_s}, work)
        return {**self._key_json(row), "key": key}

    async def revoke_key(self, actor: str, key_id: str) -> dict[str, Any]:
        kid = parse_uuid(key_id, errors.KeyNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            owner = await conn.fetchval(sql.KEY_OWNER, kid)
            if owner is None:
                raise errors.KeyNotFound()
            await conn.fetchval(sql.LOCK_USER, owner)
            if await conn.fetchval(sql.KEY_FOR_UPDATE, kid) is None:
                raise errors.KeyNotFound()
            await conn.execute(sql.REVOKE_KEY, kid)

        await self._write(actor, "revoke_key", str(kid), {}, work)
        return {"id": str(kid), "status": "revoked"}

    async def revoke_user(self, actor: str, user_id: str) -> dict[str, Any]:
        uid = parse_uuid(user_id, errors.UserNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.REVOKE_USER, uid) is None:
                raise errors.UserNotFound()
            await conn.execute(sql.REVOKE_ACTIVE_KEYS, uid)

        await self._write(actor, "revoke_user", str(uid), {}, work)
        return {"status": "revoked"}

    async def delete_user(self, actor: str, user_id: str) -> dict[str, Any]:
        uid = parse_uuid(user_id, errors.UserNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            try:
                deleted = await conn.fetchval(sql.DELETE_USER, uid)
            except asyncpg.ForeignKeyViolationError:
                raise errors.OwnsApplications("the user owns applications: delete them or give them another owner "
                                              "first") from None
            if deleted is None:
                raise errors.UserNotFound()

        await self._write(actor, "delete_user", str(uid), {}, work)
        return {"status": "deleted"}

    async def update_user(self, actor: str, user_id: str, body: UserUpdate, if_match: str | None) -> dict[str, Any]:
        """``PUT /admin/users/{id}``: the given fields, only against the version in ``If-Match``
        (missing 428, stale 409); 409 ``manager_cycle`` when the new manager is the user or
        reports to them. A manager change holds LOCK_ORGANISATION to commit, so two concurrent
        changes cannot each pass the loop check and close a loop together."""
        uid = parse_uuid(user_id, errors.UserNotFound)
        if not if_match:
            raise errors.PreconditionRequired()
        if body.manager_id is not UNSET and body.manager_email is not UNSET:
            raise errors.InvalidRequest("give manager_id or manager_email, not both")
        changes: dict[str, Any] = {}
        if body.display_name is not UNSET:
            changes["display_name"] = _nonempty(body.display_name, "display_name")
        for field in ("business_unit", "tier"):
            if getattr(body, field) is not UNSET:
                changes[field] = _label(getattr(body, field), field)
        if body.expires_at is not UNSET:
            changes["expires_at"] = _moment(body.expires_at, "expires_at")
        manager: tuple[str, Any] | None = None
        if body.manager_id is not UNSET:
            manager = ("id", None if body.manager_id is None else _body_uuid(body.manager_id, "manager_id"))
        elif body.manager_email is not UNSET:
            manager = ("email", None if body.manager_email is None else _email(body.manager_email, "manager_email"))

        async def work(conn: asyncpg.Connection) -> None:
            if manager is not None:
                await conn.execute(sql.LOCK_ORGANISATION)
            row = await conn.fetchrow(sql.USER_FOR_UPDATE, uid)
            if row is None:
                raise errors.UserNotFound()
            if if_match.strip() not in (f'"{row["version"]}"', str(row["version"]), "*"):
                raise errors.VersionConflict()
            wanted = {**dict(row), **changes}
            if manager is not None:
                kind, value = manager
                if value is None:
                    wanted["manager_id"] = None
                elif kind == "email":
                    wanted["manager_id"] = await _manager_by_email(conn, value)
                elif await conn.fetchval(sql.USER_EXISTS, value) is None:
                    raise errors.InvalidRequest("manager_id names no user")
                else:
                    wanted["manager_id"] = value
                if wanted["manager_id"] is not None and await conn.fetchval(
                        sql.MANAGER_WOULD_LOOP, uid, wanted["manager_id"]):
                    raise errors.ManagerCycle("the new manager is the user or reports to them")
            await conn.execute(sql.UPDATE_USER, uid, wanted["display_name"], wanted["manager_id"],
                               wanted["business_unit"], wanted["tier"], wanted["expires_at"])

        fields = sorted([*changes, *(["manager_id"] if manager is not None else [])])
        action = "update_user_expiry" if fields == ["expires_at"] else "update_user"
        await self._write(actor, action, str(uid), {"fields": fields}, work, change=f"user:{uid}")
        return await self.get_user(user_id)

    async def set_user_expiry(self, actor: str, user_id: str, body: ExpiryBody) -> dict[str, Any]:
        """Mesh's route: after ``expires_at`` every key of the user is refused, on every worker
        within a second of the write."""
        uid = parse_uuid(user_id, errors.UserNotFound)
        moment = _moment(body.expires_at, "expires_at")

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.SET_USER_EXPIRY, uid, moment) is None:
                raise errors.UserNotFound()

        await self._write(actor, "update_user_expiry", str(uid), {"expires_at": _jsonable(moment)}, work,
                          change=f"user:{uid}")
        return {"status": "ok"}

    async def set_key_expiry(self, actor: str, user_id: str, body: ExpiryBody) -> dict[str, Any]:
        """The user's active key stops working after ``expires_at`` (the user stays active, and a
        rotated key starts without an expiry)."""
        uid = parse_uuid(user_id, errors.UserNotFound)
        moment = _moment(body.expires_at, "expires_at")

        async def work(conn: asyncpg.Connection) -> str:
            if await conn.fetchval(sql.LOCK_PRINCIPAL, uid, "user") is None:
                raise errors.UserNotFound()
            key_id = await conn.fetchval(sql.SET_KEY_EXPIRY, uid, moment)
            if key_id is None:
                raise errors.InvalidRequest("the user has no active key")
            return str(key_id)

        key_id = await self._write(actor, "update_key_expiry", str(uid), {"expires_at": _jsonable(moment)}, work)
        return {"status": "ok", "key_id": key_id, "expires_at": _jsonable(moment)}

    async def list_users(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            return [row_json(r) for r in await conn.fetch(sql.LIST_USERS)]

    async def get_user(self, user_id: str) -> dict[str, Any]:
        uid = parse_uuid(user_id, errors.UserNotFound)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(sql.GET_USER, uid)
        if row is None:
            raise errors.UserNotFound()
        return row_json(row)

    # providers

    async def create_provider(self, actor: str, body: ProviderCreate) -> dict[str, Any]:
        name, api_key, base_url, settings = _provider_fields(body)
        provider_id = uuid.uuid4()
        sealed, nonce = seal(self._secrets.master_key, str(provider_id), api_key)
        model_inserts = []
        model_bodies: list[ModelCreate] = []
        for i, model in enumerate(body.models or ()):
            if not isinstance(model, dict) or "provider_id" in model:
                raise errors.InvalidRequest(f"models[{i}] must be a model body without provider_id")
            try:
                model_body = msgspec.convert({**model, "provider_id": str(provider_id)}, ModelCreate)
            except msgspec.ValidationError as exc:
                raise errors.InvalidRequest(f"models[{i}]: {exc}") from None
            model_inserts.append(_model_insert(model_body))
            model_bodies.append(model_body)
        if body.verify:
            await self._verify(snapshot.Provider(
                id=str(provider_id), name=name, family=body.family, max_calls_per_hour=None,
                supports_web_search=body.supports_web_search, base_url=base_url, api_key=api_key,
                local=body.local, retry_enabled=False, max_retries=0, retry_backoff_ms=body.retry_backoff_ms,
                generic=snapshot.generic_templates(settings)), model_bodies)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            try:
                row = await conn.fetchrow(
                    sql.INSERT_PROVIDER, provider_id, name, body.family, base_url, sealed, nonce,
                    body.local, body.max_outbound_rps, body.max_concurrent_upstream,
                    body.max_calls_per_hour, body.retry_enabled, body.max_retries,
                    body.retry_backoff_ms, body.log_requests, body.supports_web_search,
                    json.dumps(settings),
                )
            except asyncpg.UniqueViolationError:
                raise errors.ProviderExists() from None
            for insert in model_inserts:
                await insert(conn, provider_id)
            return row

        row = await self._write(actor, "create_provider", name, {"family": body.family}, work, registry=True)
        created = row_json(row)
        if model_inserts:
            created["models"] = [m for m in await self.list_models() if m["provider_id"] == created["id"]]
        return created

    async def update_provider(self, actor: str, provider_id: str, body: ProviderCreate,
                              if_match: str | None) -> dict[str, Any]:
        """``PUT /admin/providers/{id}``: the create fields (an empty ``api_key`` keeps the sealed
        one), only against the version in ``If-Match`` (missing 428, stale 409)."""
        pid = parse_uuid(provider_id, errors.ProviderNotFound)
        if not if_match:
            raise errors.PreconditionRequired()
        keep_key = not body.api_key.strip()
        checked = msgspec.structs.replace(body, api_key="kept") if keep_key else body
        name, api_key, base_url, settings = _provider_fields(checked)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            row = await conn.fetchrow(sql.PROVIDER_FOR_UPDATE, pid)
            if row is None:
                raise errors.ProviderNotFound()
            if if_match.strip() not in (f'"{row["version"]}"', str(row["version"]), "*"):
                raise errors.VersionConflict()
            if keep_key:
                sealed, nonce = bytes(row["encrypted_api_key"]), bytes(row["key_nonce"])
            else:
                sealed, nonce = seal(self._secrets.master_key, str(pid), api_key)
            try:
                await conn.execute(sql.RENAME_PROVIDER, pid, name)
            except asyncpg.UniqueViolationError:
                raise errors.ProviderExists() from None
            return await conn.fetchrow(
                sql.UPDATE_PROVIDER, pid, body.family, base_url, sealed, nonce, body.local, body.max_outbound_rps,
                body.max_concurrent_upstream, body.max_calls_per_hour, body.retry_enabled, body.max_retries,
                body.retry_backoff_ms, body.log_requests, body.supports_web_search, json.dumps(settings))

        row = await self._write(actor, "update_provider", name, {"family": body.family}, work, registry=True)
        return row_json(row)

    async def list_providers(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            return [row_json(r) for r in await conn.fetch(sql.LIST_PROVIDERS)]

    async def get_provider(self, provider_id: str) -> dict[str, Any]:
        pid = parse_uuid(provider_id, errors.ProviderNotFound)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(sql.GET_PROVIDER, pid)
        if row is None:
            raise errors.ProviderNotFound()
        return row_json(row)

    async def delete_provider(self, actor: str, provider_id: str) -> dict[str, Any]:
        pid = parse_uuid(provider_id, errors.ProviderNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.DELETE_PROVIDER, pid) is None:
                raise errors.ProviderNotFound()

        await self._write(actor, "delete_provider", str(pid), {}, work, registry=True)
        return {"status": "deleted"}

    # models

    async def create_model(self, actor: str, body: ModelCreate) -> dict[str, Any]:
        provider_id = _body_uuid(body.provider_id, "provider_id")
        insert = _model_insert(body)
        if wants_verify(body.kind, body.verify) and self._verifier is not None:
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(sql.PROVIDER_FOR_SNAPSHOT, provider_id)
            provider = None if row is None else snapshot.provider_from_row(row, self._secrets.master_key)
            if provider is None:
                raise errors.InvalidRequest("provider_not_found")
            await self._verify(provider, [body])

        async def work(conn: asyncpg.Connection) -> uuid.UUID:
            if await conn.fetchval(sql.PROVIDER_EXISTS, provider_id) is None:
                raise errors.InvalidRequest("provider_not_found")
            return await insert(conn, provider_id)

        model_id = await self._write(actor, "create_model", body.name, {"kind": body.kind}, work, registry=True)
        return await self.get_model(str(model_id))

    async def update_model(self, actor: str, model_id: str, body: ModelCreate | ModelStatusBody,
                           if_match: str | None) -> dict[str, Any]:
        """``PUT /admin/models/{id}``: the create fields and the status, or the status alone
        (:func:`decode_model_update`), only against the version in ``If-Match`` (missing 428,
        stale 409); no live verification (create verifies)."""
        mid = parse_uuid(model_id, errors.ModelNotFound)
        if not if_match:
            raise errors.PreconditionRequired()
        status = getattr(body, "status", None)
        columns = None if status is None else _status_columns(status)
        restrictions = getattr(body, "restrictions", UNSET)
        args: tuple[Any, ...] = ()
        if isinstance(body, ModelStatusBody):
            provider_id = None
        else:
            provider_id = _body_uuid(body.provider_id, "provider_id")
            args = _model_args(body)

        async def work(conn: asyncpg.Connection) -> None:
            row = await conn.fetchrow(sql.MODEL_FOR_UPDATE, mid)
            if row is None:
                raise errors.ModelNotFound()
            if if_match.strip() not in (f'"{row["version"]}"', str(row["version"]), "*"):
                raise errors.VersionConflict()
            if provider_id is not None:
                if await conn.fetchval(sql.PROVIDER_EXISTS, provider_id) is None:
                    raise errors.InvalidRequest("provider_not_found")
                try:
                    await conn.execute(sql.RENAME_MODEL, mid, args[0])
                except asyncpg.UniqueViolationError:
                    raise errors.ModelExists() from None
                await conn.execute(sql.UPDATE_MODEL, mid, provider_id, *args[1:])
                if row["name"] != args[0]:
                    # The audit row (written after this work, in its transaction) names the rules that followed.
                    detail["rules_renamed"] = await rule_admin.rename_model(conn, row["name"], args[0])
            if columns is not None:
                await conn.execute(sql.SET_MODEL_STATUS, mid, *columns)
            if restrictions is not UNSET:
                await rule_admin.set_restrictions(conn, mid, restrictions)

        detail: dict[str, Any] = {} if isinstance(body, ModelStatusBody) else {"kind": body.kind}
        if status is not None:
            detail["status"] = status
        if restrictions is not UNSET:
            detail["restrictions"] = restrictions is not None
        target = str(mid) if isinstance(body, ModelStatusBody) else body.name
        await self._write(actor, "update_model", target, detail, work, registry=True)
        return await self.get_model(model_id)

    async def list_models(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(sql.LIST_MODELS)
            deployments: dict[str, list[dict[str, Any]]] = {}
            for row in await conn.fetch(sql.LIST_ALL_DEPLOYMENTS):
                deployments.setdefault(str(row["model_id"]), []).append(row_json(row))
        return [{**_model_json(r), "deployments": deployments.get(str(r["id"]), [])} for r in rows]

    async def get_model(self, model_id: str) -> dict[str, Any]:
        mid = parse_uuid(model_id, errors.ModelNotFound)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(sql.GET_MODEL, mid)
            if row is None:
                raise errors.ModelNotFound()
            deployments = await conn.fetch(sql.LIST_DEPLOYMENTS, mid)
        return {**_model_json(row), "deployments": [row_json(d) for d in deployments]}

    async def delete_model(self, actor: str, model_id: str) -> dict[str, Any]:
        mid = parse_uuid(model_id, errors.ModelNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.DELETE_MODEL, mid) is None:
                raise errors.ModelNotFound()

        await self._write(actor, "delete_model", str(mid), {}, work, registry=True)
        return {"status": "deleted"}

    # deployments

    async def create_deployment(self, actor: str, model_id: str, body: DeploymentCreate) -> dict[str, Any]:
        mid = parse_uuid(model_id, errors.ModelNotFound)
        provider_id = _body_uuid(body.provider_id, "provider_id")
        resolved, region, priority = _deployment_args(body)

        async def work(conn: asyncpg.Connection) -> uuid.UUID:
            if await conn.fetchval(sql.MODEL_EXISTS, mid) is None:
                raise errors.ModelNotFound()
            if await conn.fetchval(sql.PROVIDER_EXISTS, provider_id) is None:
                raise errors.InvalidRequest("provider_not_found")
            try:
                return await conn.fetchval(sql.INSERT_DEPLOYMENT, mid, provider_id, resolved, region, priority)
            except asyncpg.UniqueViolationError:
                raise errors.DeploymentExists() from None

        deployment_id = await self._write(actor, "create_deployment", str(mid),
                                          {"provider_id": str(provider_id), "resolved_model": resolved}, work,
                                          registry=True)
        async with self._pool.acquire() as conn:
            return row_json(await conn.fetchrow(sql.GET_DEPLOYMENT, deployment_id))

    async def list_deployments(self, model_id: str) -> list[dict[str, Any]]:
        mid = parse_uuid(model_id, errors.ModelNotFound)
        async with self._pool.acquire() as conn:
            if await conn.fetchval(sql.MODEL_EXISTS, mid) is None:
                raise errors.ModelNotFound()
            return [row_json(r) for r in await conn.fetch(sql.LIST_DEPLOYMENTS, mid)]

    async def delete_deployment(self, actor: str, model_id: str, deployment_id: str) -> dict[str, Any]:
        mid = parse_uuid(model_id, errors.ModelNotFound)
        did = parse_uuid(deployment_id, errors.DeploymentNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.DELETE_DEPLOYMENT, did, mid) is None:
                raise errors.DeploymentNotFound()

        await self._write(actor, "delete_deployment", str(mid), {"deployment_id": str(did)}, work, registry=True)
        return {"status": "deleted"}

    # registry files

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
                await rule_admin.apply_plan(conn, plan or rule_admin.RegistryPlan(), registry.enforce_rules, summary)
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

    # access and policies

    async def _check_pair(self, conn: asyncpg.Connection, user_id: uuid.UUID, model_id: uuid.UUID,
                          kind: str = "user") -> None:
        if await conn.fetchval(sql.PRINCIPAL_EXISTS, user_id, kind) is None:
            raise _missing(kind)()
        if await conn.fetchval(sql.MODEL_EXISTS, model_id) is None:
            raise errors.ModelNotFound()

    async def grant(self, actor: str, body: AccessBody) -> dict[str, Any]:
        """``POST /admin/access`` with ``{user_id, model_id}`` or ``{application_id, model_id}``."""
        uid, kind = _access_principal(body)
        mid = _body_uuid(body.model_id, "model_id")

        async def work(conn: asyncpg.Connection) -> None:
            await self._check_pair(conn, uid, mid, kind)
            await conn.execute(sql.GRANT_ACCESS, uid, mid)

        await self._write(actor, "grant_access", f"{uid}:{mid}", {}, work)
        return {"status": "ok"}

    async def revoke_grant(self, actor: str, body: AccessBody) -> dict[str, Any]:
        uid, kind = _access_principal(body)
        mid = _body_uuid(body.model_id, "model_id")

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.PRINCIPAL_EXISTS, uid, kind) is None:
                raise _missing(kind)()
            await conn.execute(sql.REVOKE_ACCESS, uid, mid)

        await self._write(actor, "revoke_access", f"{uid}:{mid}", {}, work)
        return {"status": "ok"}

    async def list_access(self, user_id: str) -> list[dict[str, Any]]:
        uid = _body_uuid(user_id, "user_id")
        async with self._pool.acquire() as conn:
            return [row_json(r) for r in await conn.fetch(sql.LIST_ACCESS, uid)]

    async def put_policy(self, actor: str, user_id: str, model_id: str, body: PolicyBody,
                         kind: str = "user") -> dict[str, Any]:
        uid = parse_uuid(user_id, _missing(kind))
        mid = parse_uuid(model_id, errors.ModelNotFound)
        cap = _price(body.daily_cap_usd, "daily_cap_usd")
        if body.max_calls_per_hour is not None and body.max_calls_per_hour < 1:
            raise errors.InvalidRequest("max_calls_per_hour must be at least 1 or null")
        if any(not 0 <= d <= 6 for d in body.active_days):
            raise errors.InvalidRequest("active_days holds integers 0-6 (0 = Sunday)")
        allowed_from = _hhmm(body.allowed_from, "allowed_from")
        allowed_to = _hhmm(body.allowed_to, "allowed_to")
        async with self._pool.acquire() as conn:
            # NOTE: a name only one side knows would put the window somewhere else (the core
            # reads an unknown zone as UTC), so both must know it.
            timezone = validate.timezone(body.timezone, "timezone", await validate.load_timezones(conn))

        async def work(conn: asyncpg.Connection) -> None:
            await self._check_pair(conn, uid, mid, kind)
            await conn.execute(sql.UPSERT_POLICY, uid, mid, cap, body.max_calls_per_hour, allowed_from,
                               allowed_to, timezone, sorted(set(body.active_days)), body.always_open)

        await self._write(actor, "update_policy", f"{uid}:{mid}", {}, work)
        return {"status": "ok"}

    async def list_policies(self, user_id: str, kind: str = "user") -> list[dict[str, Any]]:
        missing = _missing(kind)
        uid = parse_uuid(user_id, missing)
        async with self._pool.acquire() as conn:
            if await conn.fetchval(sql.PRINCIPAL_EXISTS, uid, kind) is None:
                raise missing()
            return [row_json(r) for r in await conn.fetch(sql.LIST_POLICIES, uid)]

    async def set_kill_switch(self, actor: str, body: KillSwitchBody) -> dict[str, Any]:
        async def work(conn: asyncpg.Connection) -> bool:
            return bool(await conn.fetchval(sql.SET_KILL_SWITCH, body.tripped))

        action = "pause_gateway" if body.tripped else "resume_gateway"
        state = await self._write(actor, action, "gateway", {}, work)
        return {"kill_switch": state}
