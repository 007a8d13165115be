"""Platform token issuers (API.md "Identities"): their admin routes, the background fetch of
their key sets, and just-in-time provisioning of a person a valid token names.

Verification itself is the core's (``core/src/jwt.rs``): offline, per request, against the keys
the snapshot carries. This module only keeps those keys current:

- an issuer with ``jwks_url`` has its set fetched by the cluster's leader every
  MESHFAST_JWKS_REFRESH_S (default 300 s), and sooner when a worker meets a token whose ``kid``
  it does not know (at most once per MESHFAST_JWKS_MIN_INTERVAL_S per issuer);
- a set that changed is published (a config change every worker loads); an unchanged set is
  republished once half of MESHFAST_JWKS_MAX_AGE_S has passed, so workers keep trusting it;
- a fetch that fails keeps the last good set, which workers trust until MESHFAST_JWKS_MAX_AGE_S
  after it was last published: then the issuer's tokens fail closed (``unknown_key``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import asyncpg
import msgspec
from msgspec import Meta

from meshfast import errors, snapshot, tokens, validate
from meshfast._core import check_jwks
from meshfast.store import issuers as issuers_sql
from meshfast.store import sql

log = logging.getLogger("meshfast.issuers")

ALGORITHMS = ("RS256", "ES256", "EdDSA")
CLAIM_FIELDS = ("email", "display_name", "business_unit", "manager_email", "tier", "application")
MAX_JWKS_BYTES = 256 * 1024
MAX_ISSUERS = 64
# Just-in-time provisioning per issuer and worker: a burst, then a steady rate (people a second).
JIT_BURST = 20
JIT_PER_S = 2.0
_CLAIM_NAME = re.compile(r"[A-Za-z0-9_.:/\-]{1,128}\Z")

IssuerExists = errors.IssuerExists
IssuerNotFound = errors.IssuerNotFound


def _env_s(name: str, default: float, low: float = 1.0) -> float:
    try:
        return max(low, float(os.environ.get(name) or default))
    except ValueError:
        return default


def refresh_s() -> float:
    return _env_s("MESHFAST_JWKS_REFRESH_S", 300.0)


def min_interval_s() -> float:
    return _env_s("MESHFAST_JWKS_MIN_INTERVAL_S", 10.0, low=0.5)


class Claims(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    email: str
    display_name: str | None = None
    business_unit: str | None = None
    manager_email: str | None = None
    tier: str | None = None
    application: str | None = None


class IssuerCreate(msgspec.Struct, forbid_unknown_fields=True):
    issuer: Annotated[str, Meta(max_length=512)]
    audiences: Annotated[list[Annotated[str, Meta(max_length=512)]], Meta(max_length=32)]
    algorithms: Annotated[list[str], Meta(max_length=3)]
    claims: Claims
    jwks_url: Annotated[str, Meta(max_length=2048)] | None = None
    jwks: dict[str, Any] | None = None
    clock_skew_s: Annotated[int, Meta(ge=0, le=3600)] = 60
    jit_provisioning: bool = False
    local: bool = False


def _text(value: str, field: str, problems: list[str]) -> str:
    value = value.strip()
    problem = validate.text_problem(value) if value else "is empty"
    if problem is not None:
        problems.append(f"{field} {problem}")
    return value


def check(body: IssuerCreate) -> tuple[str, list[str], list[str], dict[str, str], str | None, str | None]:
    """The issuer as stored: (issuer, audiences, algorithms, claims, jwks_url, jwks as JSON text);
    400 ``invalid_request`` listing every problem."""
    problems: list[str] = []
    issuer = _text(body.issuer, "issuer", problems)
    if issuer == tokens.issuer_name():
        problems.append(f"issuer {issuer!r} is meshfast's own")
    audiences = [_text(a, "audiences[]", problems) for a in body.audiences]
    if not audiences:
        problems.append("audiences must name at least one audience")
    algorithms = list(dict.fromkeys(body.algorithms))
    for alg in algorithms:
        if alg not in ALGORITHMS:
            problems.append(f"algorithm {alg[:32]!r} is not one of RS256, ES256, EdDSA")
    if not algorithms:
        problems.append("algorithms must name at least one of RS256, ES256, EdDSA")
    claims = {k: v for k, v in msgspec.structs.asdict(body.claims).items() if v is not None}
    for field, name in claims.items():
        if not _CLAIM_NAME.match(name):
            problems.append(f"claims.{field} must be a claim name (1-128 of A-Z a-z 0-9 _ . : / -)")
    if claims.get("application") is not None and claims.get("application") == claims.get("email"):
        # NOTE: a token with an email is a person's; the application claim names the application
        # of a token without one (a service's own), so the two must differ.
        problems.append("claims.application must name another claim than claims.email")
    if (body.jwks_url is None) == (body.jwks is None):
        problems.append("give exactly one of jwks_url and jwks")
    url = None
    if body.jwks_url is not None:
        url = body.jwks_url.strip()
        problem = validate.url_problem(url, "jwks_url", local=body.local)
        if problem is not None:
            problems.append(problem)
    jwks_text = None
    if body.jwks is not None:
        jwks_text = json.dumps(body.jwks, separators=(",", ":"))
        if len(jwks_text) > MAX_JWKS_BYTES:
            problems.append(f"jwks is larger than {MAX_JWKS_BYTES} bytes")
        else:
            problems.extend(jwks_problems(jwks_text, algorithms))
    if problems:
        raise errors.InvalidRequest("; ".join(problems), errors=problems)
    return issuer, audiences, algorithms, claims, url, jwks_text


def jwks_problems(text: str, algorithms: list[str]) -> list[str]:
    """Why a key set cannot serve (empty when one of its keys verifies an allowed algorithm)."""
    try:
        keys, skipped = check_jwks(text)
    except ValueError as exc:
        return [f"jwks: {exc}"]
    if not any(alg in algorithms for _, alg in keys):
        detail = f" ({'; '.join(skipped[:5])})" if skipped else ""
        return [f"jwks holds no usable key for {', '.join(algorithms) or 'the algorithms'}{detail}"]
    return []


def issuer_json(row: asyncpg.Record) -> dict[str, Any]:
    keys: list[dict[str, Any]] = []
    text = row["jwks"] or row["fetched_jwks"]
    if text:
        with contextlib.suppress(ValueError):
            keys = [{"kid": kid, "alg": alg} for kid, alg in check_jwks(text)[0]]

    def iso(v: dt.datetime | None) -> str | None:
        return None if v is None else v.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")

    return {
        "id": str(row["id"]), "issuer": row["issuer"], "audiences": list(row["audiences"]),
        "algorithms": list(row["algorithms"]), "clock_skew_s": row["clock_skew_s"],
        "claims": json.loads(row["claims"]), "jit_provisioning": row["jit_provisioning"], "local": row["local"],
        "jwks_url": row["jwks_url"], "jwks": None if row["jwks"] is None else json.loads(row["jwks"]),
        "keys": keys, "fetched_at": iso(row["fetched_at"]), "fetch_error": row["fetch_error"],
        "created_at": iso(row["created_at"]),
    }


async def apply_file_issuer(conn: asyncpg.Connection, body: IssuerCreate, summary: dict[str, list[str]]) -> None:
    """One issuer of a registry file, by its ``issuer``: created, updated or unchanged. A changed
    ``jwks_url`` forgets the keys fetched from the old one."""
    issuer, audiences, algorithms, claims, url, jwks_text = check(body)
    row = await conn.fetchrow(issuers_sql.STORED_ISSUER, issuer)
    values = (audiences, algorithms, claims, url, None if jwks_text is None else json.loads(jwks_text),
              body.clock_skew_s, body.jit_provisioning, body.local)
    if row is None:
        if await conn.fetchval(issuers_sql.COUNT_ISSUERS) >= MAX_ISSUERS:
            raise errors.InvalidRequest(f"at most {MAX_ISSUERS} issuers")
        await conn.fetchrow(issuers_sql.INSERT_ISSUER, issuer, audiences, algorithms, json.dumps(claims), url,
                            jwks_text, body.clock_skew_s, body.jit_provisioning, body.local)
        summary["created"].append(f"issuer {issuer}")
    elif (list(row["audiences"]), list(row["algorithms"]), json.loads(row["claims"]), row["jwks_url"],
          None if row["jwks"] is None else json.loads(row["jwks"]), row["clock_skew_s"], row["jit_provisioning"],
          row["local"]) == values:
        summary["unchanged"].append(f"issuer {issuer}")
    else:
        await conn.execute(issuers_sql.UPDATE_ISSUER, issuer, audiences, algorithms, json.dumps(claims), url, jwks_text,
                           body.clock_skew_s, body.jit_provisioning, body.local)
        summary["updated"].append(f"issuer {issuer}")
    if url is not None:
        # The first fetch, soon: the leader picks the request up at its next tick.
        await conn.execute(issuers_sql.REQUEST_FETCH, issuer, 0.0)


class IssuerService:
    """The admin routes' work: ``write`` is AdminService._write (the transaction, the config
    bump, NOTIFY and the audit row)."""

    def __init__(self, pool: asyncpg.Pool, write: Callable[..., Awaitable[Any]]) -> None:
        self._pool = pool
        self._write = write

    async def create(self, actor: str, body: IssuerCreate) -> dict[str, Any]:
        issuer, audiences, algorithms, claims, url, jwks_text = check(body)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            if await conn.fetchval(issuers_sql.COUNT_ISSUERS) >= MAX_ISSUERS:
                raise errors.InvalidRequest(f"at most {MAX_ISSUERS} issuers")
            try:
                return await conn.fetchrow(issuers_sql.INSERT_ISSUER, issuer, audiences, algorithms,
                                           json.dumps(claims), url, jwks_text, body.clock_skew_s,
                                           body.jit_provisioning, body.local)
            except asyncpg.UniqueViolationError:
                raise IssuerExists() from None

        row = await self._write(actor, "create_issuer", issuer, {"jwks_url": url}, work)
        if url is not None:
            # The first fetch, soon: the leader picks the request up at its next tick.
            async with self._pool.acquire() as conn:
                await conn.execute(issuers_sql.REQUEST_FETCH, issuer, 0.0)
        return issuer_json(row)

    async def list(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            return [issuer_json(r) for r in await conn.fetch(issuers_sql.LIST_ISSUERS)]

    async def get(self, issuer_id: str) -> dict[str, Any]:
        iid = _uuid(issuer_id)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(issuers_sql.GET_ISSUER, iid)
        if row is None:
            raise IssuerNotFound()
        return issuer_json(row)

    async def delete(self, actor: str, issuer_id: str) -> dict[str, Any]:
        iid = _uuid(issuer_id)

        async def work(conn: asyncpg.Connection) -> str:
            name = await conn.fetchval(issuers_sql.DELETE_ISSUER, iid)
            if name is None:
                raise IssuerNotFound()
            return str(name)

        await self._write(actor, "delete_issuer", str(iid), {}, work)
        return {"status": "deleted"}


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise IssuerNotFound() from None


class KeySets:
    """The background fetch of issuers' key sets (a leader job) and the workers' requests for
    an early one."""

    def __init__(self, admin_pool: asyncpg.Pool) -> None:
        self._pool = admin_pool
        self._asked: dict[str, float] = {}
        self._jit: dict[str, tuple[float, float]] = {}

    def ask(self, issuer: str) -> None:
        """A worker met a token whose key it does not know: ask the leader to fetch the issuer's
        set early (fire and forget; at most once per minimum interval per issuer and worker)."""
        now = time.monotonic()
        if now - self._asked.get(issuer, -1e9) < min_interval_s():
            return
        if len(self._asked) > 1024:
            self._asked.clear()
        self._asked[issuer] = now
        task = asyncio.ensure_future(self._ask(issuer))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _ask(self, issuer: str) -> None:
        try:
            async with self._pool.acquire() as conn:
                await conn.execute(issuers_sql.REQUEST_FETCH, issuer, min_interval_s())
        except Exception as exc:  # noqa: BLE001 - a lost request only delays the fetch to its period
            log.warning("could not ask for a key set fetch of %r: %s", issuer, type(exc).__name__)

    async def provision(self, claims: dict[str, Any]) -> int | None:
        """Just-in-time provisioning (see :func:`provision`), at most JIT_BURST people per issuer
        and worker at once, then JIT_PER_S a second: each one is a config change every worker of
        every instance loads."""
        issuer = str(claims.get("issuer_id"))
        now = time.monotonic()
        tokens, last = self._jit.get(issuer, (JIT_BURST, now))
        tokens = min(JIT_BURST, tokens + (now - last) * JIT_PER_S)
        if tokens < 1:
            log.warning("just-in-time provisioning from issuer %s is over its rate; refused for now", issuer)
            return None
        if len(self._jit) > 1024:
            self._jit.clear()
        self._jit[issuer] = (tokens - 1, now)
        return await provision(self._pool, claims)

    async def tick(self, _conn: asyncpg.Connection | None = None) -> None:
        """Fetches every due set (the leader's job; runs as the admin role, which may publish)."""
        async with self._pool.acquire() as conn:
            due = await conn.fetch(issuers_sql.DUE_ISSUERS, refresh_s(), min_interval_s())
        for row in due:
            await self._refresh(row)

    async def _refresh(self, row: asyncpg.Record) -> None:
        async with self._pool.acquire() as conn:
            await conn.execute(issuers_sql.MARK_ATTEMPT, row["id"])
        try:
            text = await fetch_jwks(row["jwks_url"], local=row["local"], algorithms=list(row["algorithms"]))
        except Exception as exc:  # noqa: BLE001 - every failure keeps the last good set
            why = str(exc)[:300] or type(exc).__name__
            log.warning("key set of issuer %r not fetched: %s", row["issuer"], why)
            async with self._pool.acquire() as conn:
                await conn.execute(issuers_sql.STORE_FAILURE, row["id"], why)
            return
        old = row["fetched_jwks"]
        changed = old is None or json.loads(old) != json.loads(text)
        published = row["published_at"]
        stale = published is None or (dt.datetime.now(dt.UTC) - published).total_seconds() > \
            snapshot.jwks_max_age_s() / 2
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                await conn.execute(issuers_sql.STORE_FETCH, row["id"], text, changed or stale)
                if changed or stale:
                    seq = await conn.fetchval(sql.NEXT_CONFIG_SEQ)
                    await conn.execute(sql.NOTIFY_CONFIG, str(seq))
        if changed:
            log.info("key set of issuer %r changed: published", row["issuer"])


async def fetch_jwks(url: str, *, local: bool, algorithms: list[str], timeout_s: float = 10.0) -> str:
    """The set at ``url`` as compact JSON text, checked (a key for one of ``algorithms``); raises
    with the reason otherwise. Not local: the address must be public, also once resolved (the
    providers' guarded resolver)."""
    import aiohttp

    from meshfast.aiohttp_client import GuardedResolver
    from meshfast.http1 import ForbiddenAddress, forbidden_address

    problem = validate.url_problem(url, "jwks_url", local=local)
    if problem is not None:
        raise ValueError(problem)
    if not local:
        from urllib.parse import urlsplit

        host = (urlsplit(url).hostname or "").strip("[]")
        with contextlib.suppress(ValueError):
            if forbidden_address(host):
                raise ForbiddenAddress("the key set's address is not public (set local)")
    connector = aiohttp.TCPConnector(resolver=None if local else GuardedResolver(), force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url, allow_redirects=False, headers={"accept": "application/json"}) as response:
            if response.status != 200:
                raise ValueError(f"the key set's URL answered HTTP {response.status}")
            chunks, size = [], 0
            async for chunk in response.content.iter_chunked(64 * 1024):
                size += len(chunk)
                if size > MAX_JWKS_BYTES:
                    raise ValueError(f"the key set is larger than {MAX_JWKS_BYTES} bytes")
                chunks.append(chunk)
            body = b"".join(chunks)
    try:
        parsed = json.loads(body)
    except ValueError:
        raise ValueError("the key set is not JSON") from None
    text = json.dumps(parsed, separators=(",", ":"))
    problems = jwks_problems(text, algorithms)
    if problems:
        # NOTE: the last good set serves on (a set without a key for the issuer's algorithms
        # would refuse every token).
        raise ValueError("; ".join(problems))
    return text


# --- just-in-time provisioning ------------------------------------------------------------------


async def provision(pool: asyncpg.Pool, claims: dict[str, Any]) -> int | None:
    """Creates the person a valid token names (its issuer provisions just in time) from what the
    claims say; returns the config seq that has them (None when someone else just did). Claims
    only seed the person: later changes are meshfast's own records."""
    # NOTE: the core's form (ASCII, lowercased, no whitespace): the person it will look up.
    email = str(claims["email"])
    if (len(email) > 320 or email != email.strip().lower() or email.count("@") != 1 or not email.isascii()
            or any(c.isspace() for c in email) or validate.text_problem(email) is not None):
        return None

    def label(value: Any) -> str | None:
        if not isinstance(value, str):
            return None
        value = value.strip()[:200]
        return value if value and validate.text_problem(value) is None else None

    display_name = label(claims.get("display_name")) or email
    manager = label(claims.get("manager_email"))
    async with pool.acquire() as conn:
        async with conn.transaction():
            created = await conn.fetchval(issuers_sql.INSERT_JIT_USER, email, display_name,
                                          label(claims.get("business_unit")), label(claims.get("tier")),
                                          manager.lower() if manager else None)
            if created is None:
                return None
            seq = await conn.fetchval(sql.NEXT_CONFIG_SEQ)
            await conn.execute(sql.NOTIFY_CONFIG, str(seq))
            await conn.execute(sql.INSERT_AUDIT, f"issuer:{claims.get('issuer_id')}", "jit_provision_user", email,
                               json.dumps({"issuer_id": claims.get("issuer_id")}))
    log.info("provisioned %s just in time from a platform token", email)
    return int(seq)
