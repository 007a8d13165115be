"""Providers: their bodies (with the generic provider's templates), validation, and the
operations on them (created with their models in one transaction)."""

from __future__ import annotations

import json
import re
import uuid
from decimal import Decimal
from typing import Annotated, Any

import asyncpg
import msgspec
from msgspec import Meta

from meshfast import errors, snapshot, validate
from meshfast.admin.service.common import _nonempty, _price, parse_uuid, row_json
from meshfast.admin.service.models import ModelCreate, ModelOperations, _model_insert
from meshfast.sealing import seal
from meshfast.store import sql
from meshfast.validate import ApiKey, BackoffMs, Label, Name, Path, Percent, Positive, Retries, Url, Word, Words

FAMILIES = ("openai", "openai_responses", "anthropic", "gemini", "ollama", "generic")


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
    generation_usage_input_tokens_path: Path | None = None
    generation_usage_output_tokens_path: Path | None = None


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


class ProviderOperations(ModelOperations):
    """Providers (mixed into :class:`AdminService`); a provider may be created with its models."""

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
