"""Models and their deployments: bodies, validation, live verification and the operations."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal

import asyncpg
import msgspec
from msgspec import UNSET, Meta, UnsetType

from meshfast import errors, rules, snapshot, validate
from meshfast.admin import controls
from meshfast.admin import rules as rule_admin
from meshfast.admin.changes import Outcome
from meshfast.admin.service.common import Price, ServiceBase, _body_uuid, _invalid, _price, decode, parse_uuid, row_json
from meshfast.store import onboarding as onboarding_sql
from meshfast.store import sql
from meshfast.validate import Id, Int32, Label, Name, Names, Positive, Word
from meshfast.verify import wants_verify

if TYPE_CHECKING:  # the routes import this package
    from meshfast.admin.routes import Actor

MODEL_KINDS = ("chat", "embedding", "image_generation", "video_generation")


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
    # Onboarding (API.md "Governed lifecycle"): staged (not served) or limited (served to the
    # roster only, under ``limited``'s cap until its expiry); see ModelUpdate. Left out: active.
    status: Word | None = None
    roster: Annotated[list[Id], Meta(max_length=rules.MAX_LIST)] | UnsetType = UNSET
    limited: LimitedBody | None | UnsetType = UNSET


MODEL_STATUSES = ("active", "blocked", "retired", "staged", "limited")
# The stored status of each API status but blocked (Mesh's flag beside an active status).
_STORED_STATUS = {"active": "active", "blocked": "active", "retired": "retired", "staged": "staged",
                  "limited": "limited"}
ONBOARDING_FIELDS = ("status", "roster", "limited")


class ModelUpdate(ModelCreate, forbid_unknown_fields=True):
    """``PUT /admin/models/{id}``: the create fields (``verify`` is ignored) and, optionally, the
    status; a body that is only ``{"status": ...}`` changes the status alone.

    ``status``: active, blocked, retired, staged or limited; a blocked or retired model answers as
    an unknown one (404) on the standard routes and 403 model_blocked on the Mesh-native ones; a
    staged one, and a limited one to anyone off its ``roster``, as an unknown model on every
    route. Left out: kept. A status other than limited clears the roster and the limited cap."""

    # Who may see the model (leaders denied or allowed, exemptions, business units closed or
    # open); a refused caller gets the unknown model's 404. Left out: kept; null: cleared.
    restrictions: rules.RestrictionsBody | None | UnsetType = UNSET
    # When the restrictions go live (RFC 3339 with its offset, or "local-midnight"); absent: now.
    activate_at: Word | None = None


class ModelStatusBody(msgspec.Struct, forbid_unknown_fields=True):
    """A model PUT that changes only the status, the roster, the limited cap or the restrictions."""

    status: Word | None = None
    restrictions: rules.RestrictionsBody | None | UnsetType = UNSET
    activate_at: Word | None = None
    roster: Annotated[list[Id], Meta(max_length=rules.MAX_LIST)] | UnsetType = UNSET
    limited: LimitedBody | None | UnsetType = UNSET


def decode_model_update(body: bytes) -> ModelUpdate | ModelStatusBody:
    """A model PUT's body: the status, roster, limited cap or restrictions alone, or the whole
    model (see :class:`ModelUpdate`)."""
    try:
        fields = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        fields = None  # the strict decode below answers the 400
    if isinstance(fields, dict) and fields and set(fields) <= {"restrictions", "activate_at", *ONBOARDING_FIELDS}:
        return decode(body, ModelStatusBody)
    return decode(body, ModelUpdate)


def _status_columns(status: str) -> tuple[str, bool]:
    """The API's status as the stored ``(status, blocked)`` pair (Mesh keeps them apart)."""
    if status not in MODEL_STATUSES:
        raise errors.InvalidRequest(f"status must be one of {', '.join(MODEL_STATUSES)}")
    return _STORED_STATUS[status], status == "blocked"


def _model_json(row: asyncpg.Record) -> dict[str, Any]:
    """A model as the API shows it: ``status`` is active, blocked, retired, staged or limited
    (``blocked`` stays, as Mesh's flag); ``roster`` and ``limited`` (null unless limited)."""
    out = row_json(row)
    if out.get("blocked") and out.get("status") == "active":
        out["status"] = "blocked"
    roster = out.get("roster")
    out["roster"] = json.loads(roster) if isinstance(roster, str) else (roster or [])
    window, amount, expires = (out.pop(k, None) for k in ("limited_window", "limited_amount_usd",
                                                          "limited_expires_at"))
    out["limited"] = None if window is None and amount is None and expires is None else {
        "window": window, "amount_usd": None if amount is None else rules.usd_text(Decimal(str(amount))),
        "expires_at": expires}
    return out


async def _onboarding(conn: asyncpg.Connection, mid: uuid.UUID, status: str | None,
                      roster: list[str] | UnsetType, limited: LimitedBody | None | UnsetType) -> dict[str, Any] | None:
    """Store a model's onboarding (status, roster, limited cap) when the body names any of them,
    validated as a whole (400 listing every problem: unknown roster users, a roster or a cap on a
    model that is not limited). A status other than limited clears the roster and the cap; left
    out, each keeps its stored value. The audit detail of what changed, or None."""
    if status is None and roster is UNSET and limited is UNSET:
        return None
    current = await conn.fetchrow(onboarding_sql.MODEL_ONBOARDING, mid)
    stored = current["status"] if status is None else _STORED_STATUS[status]
    problems: list[str] = []
    if stored != "limited":
        if roster is not UNSET and roster:
            problems.append("roster: only a limited model has a roster (status \"limited\")")
        if limited is not UNSET and limited is not None:
            problems.append("limited: only a limited model has a limited-access cap (status \"limited\")")
        if problems:
            raise _invalid(problems)
        if status is not None:
            await conn.execute(onboarding_sql.SET_ONBOARDING, mid, stored, "[]", None, None, None)
        return {"status": status} if status is not None else {}
    people = (json.loads(current["roster"]) if isinstance(current["roster"], str) else list(current["roster"] or [])
              ) if roster is UNSET else roster
    canonical: list[str] = []
    for i, user in enumerate(people):
        try:
            canonical.append(str(uuid.UUID(user)))
        except ValueError:
            problems.append(f"roster[{i}]: {rules.shown(user)} is not a user id")
    known = {row[0] for row in await conn.fetch(onboarding_sql.KNOWN_PEOPLE, canonical)} if canonical else set()
    problems.extend(f"roster: unknown user {rules.shown(u)}" for u in canonical if u not in known)
    window, amount, expires_at = current["limited_window"], current["limited_amount_usd"], current["limited_expires_at"]
    if limited is None:
        window = amount = expires_at = None
    elif limited is not UNSET:
        window, expires_at = limited.window, limited.expires_at
        amount = None
        if limited.amount_usd is not None:
            parsed = rules.threshold(str(limited.amount_usd))
            if isinstance(parsed, str):
                problems.append(f"limited.amount_usd: {parsed}")
            else:
                amount = parsed
        if (window is None) != (limited.amount_usd is None):
            problems.append("limited: window and amount_usd go together")
        if expires_at is not None and not validate.EARLIEST <= expires_at <= validate.LATEST:
            problems.append(f"limited.expires_at: must be between {validate.EARLIEST.date()} and "
                            f"{validate.LATEST.date()}")
    if problems:
        raise _invalid(problems)
    roster_ids = list(dict.fromkeys(canonical))
    await conn.execute(onboarding_sql.SET_ONBOARDING, mid, "limited", json.dumps(roster_ids), window, amount,
                       expires_at)
    return {"status": "limited", "roster": roster_ids,
            "limited": None if window is None and expires_at is None else {
                "window": window, "amount_usd": None if amount is None else str(amount),
                "expires_at": None if expires_at is None else expires_at.isoformat()}}


class LimitedBody(msgspec.Struct, forbid_unknown_fields=True):
    """A limited model's own spend control for its roster: a block at ``amount_usd`` per
    ``window`` on the model, and ``expires_at`` (RFC 3339 with its offset), after which the
    roster's access ends and the model answers as staged. Each is optional."""

    window: Literal["daily", "weekly", "monthly"] | None = None
    amount_usd: Annotated[Decimal, Meta(description="USD, > 0")] | None = None
    expires_at: Annotated[dt.datetime, Meta(tz=True)] | None = None


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


async def controls_naming(conn: asyncpg.Connection, model_id: uuid.UUID, name: str) -> list[dict[str, str]]:
    """The live controls that reference a model: rules scoping it by name, live pilots listing
    it, live named keys held to it (workflows name no model)."""
    return ([{"kind": "rule", "id": r[0]} for r in await conn.fetch(onboarding_sql.RULES_NAMING_MODEL, name)]
            + [{"kind": "pilot", "id": r[0]} for r in await conn.fetch(onboarding_sql.LIVE_PILOTS_LISTING_MODEL, name)]
            + [{"kind": "key", "id": r[0]} for r in await conn.fetch(onboarding_sql.LIVE_KEYS_HOLDING_MODEL, model_id)])


class ModelOperations(ServiceBase):
    """Models and deployments (mixed into :class:`AdminService`)."""

    async def _verify(self, provider: snapshot.Provider, models: list[ModelCreate]) -> None:
        """One live call per model that wants it; 422 with every failure, nothing written."""
        wanted = [_snapshot_model(m) for m in models if wants_verify(m.kind, m.verify)]
        if self._verifier is None or not wanted:
            return
        failures = await self._verifier(provider, wanted)
        if failures:
            raise errors.VerificationFailed(failures=[msgspec.to_builtins(f) for f in failures])

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

        if body.status is not None:
            _status_columns(body.status)
        detail: dict[str, Any] = {"kind": body.kind}

        async def work(conn: asyncpg.Connection) -> uuid.UUID:
            if await conn.fetchval(sql.PROVIDER_EXISTS, provider_id) is None:
                raise errors.InvalidRequest("provider_not_found")
            model_id = await insert(conn, provider_id)
            if body.status == "blocked":
                await conn.execute(sql.SET_MODEL_STATUS, model_id, "active", True)
            elif body.status not in (None, "active"):
                await conn.execute(sql.SET_MODEL_STATUS, model_id, _STORED_STATUS[body.status], False)
            detail.update(await _onboarding(conn, model_id, body.status, body.roster, body.limited) or {})
            return model_id

        model_id = await self._write(actor, "create_model", body.name, detail, work, registry=True)
        return await self.get_model(str(model_id))

    async def update_model(self, actor: Actor, model_id: str, body: ModelCreate | ModelStatusBody,
                           if_match: str | None) -> dict[str, Any]:
        """``PUT /admin/models/{id}``: the create fields and the status, or the status alone
        (:func:`decode_model_update`), only against the version in ``If-Match`` (missing 428,
        stale 409); no live verification (create verifies). The restrictions go through the
        lifecycle: scheduled by ``activate_at``, and a business-unit administrator's relaxing
        of them waits for approval (the answer then carries ``change_id`` and ``status: pending``;
        the other fields are written at once)."""
        mid = parse_uuid(model_id, errors.ModelNotFound)
        if not if_match:
            raise errors.PreconditionRequired()
        activate_at = getattr(body, "activate_at", None)
        if activate_at is not None and getattr(body, "restrictions", UNSET) is UNSET:
            raise errors.InvalidRequest("activate_at applies to restrictions: the body has none")
        outcome: list[Outcome] = []
        status = getattr(body, "status", None)
        columns = None if status is None else _status_columns(status)
        restrictions = getattr(body, "restrictions", UNSET)
        roster, limited = body.roster, body.limited
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
                    renamed = await conn.fetch(onboarding_sql.RENAME_MODEL_IN_PILOTS, row["name"], args[0])
                    detail["pilots_renamed"] = [r[0] for r in renamed]
            if columns is not None:
                await conn.execute(sql.SET_MODEL_STATUS, mid, *columns)
            if restrictions is not UNSET:
                kind = controls.RESTRICTIONS
                raw = None if restrictions is None else msgspec.to_builtins(restrictions)
                stored = await kind.check(conn, str(mid), "update", raw)
                when = await self.lifecycle.when(conn, actor, kind, str(mid), stored, activate_at)
                outcome.append(await self.lifecycle.decide(conn, actor, kind, str(mid), "update", stored, when))
                detail.update(restrictions_outcome=outcome[0].status, revision=outcome[0].revision)
            detail.update(await _onboarding(conn, mid, status, roster, limited) or {})

        detail: dict[str, Any] = {} if isinstance(body, ModelStatusBody) else {"kind": body.kind}
        if status is not None:
            detail["status"] = status
        if restrictions is not UNSET:
            detail["restrictions"] = restrictions is not None
        target = str(mid) if isinstance(body, ModelStatusBody) else body.name
        await self._write(actor.name, "update_model", target, detail, work, registry=True)
        model = await self.get_model(model_id)
        if outcome and outcome[0].pending:
            return {**outcome[0].reply(), "model": model}
        return model

    async def list_models(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(sql.LIST_MODELS)
            deployments: dict[str, list[dict[str, Any]]] = {}
            for row in await conn.fetch(sql.LIST_ALL_DEPLOYMENTS):
                deployments.setdefault(str(row["model_id"]), []).append(row_json(row))
            states = await self.lifecycle.revisions("restrictions", [str(r["id"]) for r in rows], conn)
        return [{**_model_json(r), "deployments": deployments.get(str(r["id"]), []),
                 "restrictions_revisions": states[str(r["id"])]} for r in rows]

    async def get_model(self, model_id: str) -> dict[str, Any]:
        mid = parse_uuid(model_id, errors.ModelNotFound)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(sql.GET_MODEL, mid)
            if row is None:
                raise errors.ModelNotFound()
            deployments = await conn.fetch(sql.LIST_DEPLOYMENTS, mid)
            states = await self.lifecycle.revisions("restrictions", [str(mid)], conn)
        # The restrictions' revisions (saved and enforced; see Lifecycle.revisions).
        return {**_model_json(row), "deployments": [row_json(d) for d in deployments],
                "restrictions_revisions": states[str(mid)]}

    async def delete_model(self, actor: str, model_id: str) -> dict[str, Any]:
        mid = parse_uuid(model_id, errors.ModelNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            name = await conn.fetchval(onboarding_sql.MODEL_NAME, mid)
            if name is None:
                raise errors.ModelNotFound()
            controls = await controls_naming(conn, mid, name)
            if controls:
                raise errors.ModelInUse(f"live controls reference the model {name!r}", controls=controls)
            if await conn.fetchval(sql.DELETE_MODEL, mid) is None:
                raise errors.ModelNotFound()

        await self._write(actor, "delete_model", str(mid), {}, work, registry=True)
        return {"status": "deleted"}

    async def graduate_model(self, actor: str, model_id: str) -> dict[str, Any]:
        """``POST /admin/models/{id}/graduate``: the model becomes generally available (active),
        its roster and limited-access cap cleared."""
        mid = parse_uuid(model_id, errors.ModelNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            row = await conn.fetchrow(onboarding_sql.MODEL_ONBOARDING, mid)
            if row is None:
                raise errors.ModelNotFound()
            detail["from"] = row["status"]
            await conn.execute(onboarding_sql.SET_ONBOARDING, mid, "active", "[]", None, None, None)

        detail: dict[str, Any] = {}
        await self._write(actor, "model.graduate", str(mid), detail, work, registry=True)
        return await self.get_model(model_id)

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
