"""The snapshot's rows as PostgreSQL computes them (grants packed with their terms' index, people
as indexes) against the obvious per-row reading: the same grants with the same limits, managers
and keys, on a real database."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from meshfast import snapshot
from meshfast._core import Core
from meshfast.sealing import seal
from meshfast.store import database

MASTER_KEY = b"k" * 32

# The per-row reading the packed grant table replaced: a grant without a policy row has the defaults.
REFERENCE_GRANTS = """
SELECT a.user_id::text AS user_id, a.model_id::text AS model_id,
       COALESCE(p.daily_cap_usd, 20.00) AS daily_cap_usd,
       p.max_calls_per_hour,
       p.allowed_from, p.allowed_to,
       COALESCE(p.timezone, 'UTC') AS timezone,
       COALESCE(p.active_days, '{0,1,2,3,4,5,6}') AS active_days,
       COALESCE(p.always_open, false) AS always_open
FROM user_model_access a
LEFT JOIN user_model_policies p ON p.user_id = a.user_id AND p.model_id = a.model_id
"""

# (daily_cap_usd, max_calls_per_hour, allowed_from, allowed_to, timezone, active_days, always_open);
# repeated on purpose (grants share terms), with every nullable column both set and unset.
POLICIES: list[tuple[Any, ...]] = [
    ("5.5", None, None, None, "UTC", [0, 1, 2, 3, 4, 5, 6], False),
    ("5.5", 100, None, None, "UTC", [0, 1, 2, 3, 4, 5, 6], False),
    ("0", None, dt.time(8, 0), dt.time(18, 30), "Europe/Paris", [1, 2, 3, 4, 5], False),
    ("0.000000001", 1, dt.time(22, 0), dt.time(6, 0), "America/New_York", [], True),
    ("20.00", None, None, None, "UTC", [0, 1, 2, 3, 4, 5, 6], False),
]


async def _populate(conn: asyncpg.Connection) -> None:
    """Ten people in a chain (each the next one's manager), keys for most, two providers (one
    sealed under another master key: it and its models leave the snapshot), six models, grants
    with and without policy rows, and a policy row whose grant is gone."""
    users = [await conn.fetchval("INSERT INTO users (email, display_name) VALUES ($1, $2) RETURNING id",
                                 f"p{i}@example.com", f"P{i}") for i in range(10)]
    for boss, user in zip(users, users[1:], strict=False):
        await conn.execute("UPDATE users SET manager_id = $1 WHERE id = $2", boss, user)
    for i, user in enumerate(users[:8]):
        await conn.execute("INSERT INTO mesh_api_keys (user_id, key_hash, key_prefix) VALUES ($1, $2, 'mf_')",
                           user, hashlib.sha256(b"%d" % i).digest())
    providers = []
    for name, key in (("opens", MASTER_KEY), ("sealed-elsewhere", b"x" * 32)):
        provider_id = uuid.uuid4()
        sealed, nonce = seal(key, str(provider_id), "sk-test")
        await conn.execute("INSERT INTO providers (id, name, family, base_url, encrypted_api_key, key_nonce) "
                           "VALUES ($1, $2, 'openai', 'http://127.0.0.1:9/openai', $3, $4)",
                           provider_id, name, sealed, nonce)
        providers.append(provider_id)
    models = [await conn.fetchval("INSERT INTO models (provider_id, name, resolved_model) VALUES ($1, $2, 'm') "
                                  "RETURNING id", providers[i % 2], f"m{i}") for i in range(6)]
    n = 0
    for u, user in enumerate(users):
        for m, model in enumerate(models):
            if (u + m) % 3 == 0:
                continue
            await conn.execute("INSERT INTO user_model_access (user_id, model_id) VALUES ($1, $2)", user, model)
            n += 1
            if n % 4:
                cap, calls, start, end, zone, days, always = POLICIES[n % len(POLICIES)]
                await conn.execute(
                    "INSERT INTO user_model_policies (user_id, model_id, daily_cap_usd, max_calls_per_hour, "
                    "allowed_from, allowed_to, timezone, active_days, always_open) "
                    "VALUES ($1, $2, $3::numeric, $4, $5, $6, $7, $8, $9)",
                    user, model, cap, calls, start, end, zone, days, always)
    # A policy whose access was revoked grants nothing.
    await conn.execute("INSERT INTO user_model_policies (user_id, model_id, daily_cap_usd) VALUES ($1, $2, 1)",
                       users[0], models[0])
    await conn.execute("DELETE FROM user_model_access WHERE user_id = $1 AND model_id = $2", users[0], models[0])


def _minutes(t: dt.time | None) -> int | None:
    return None if t is None else t.hour * 60 + t.minute


def test_the_packed_grant_table_holds_each_grant_with_its_policy_or_the_defaults(fresh_dir: Path) -> None:
    """Every grant of a model in the snapshot, with its policy's limits or the defaults, and
    nothing else (not the models of a provider whose key does not open, not a revoked grant);
    managers and keys name the right people; the core loads it."""
    pg = database.EmbeddedPostgres(fresh_dir / "pg")
    url = pg.start()

    async def run() -> tuple[snapshot.Config, list[asyncpg.Record], list[asyncpg.Record], list[asyncpg.Record]]:
        await database.migrate(url)
        conn = await asyncpg.connect(url)
        try:
            await _populate(conn)
            config = await snapshot.load_config(conn, MASTER_KEY)
            users = await conn.fetch("SELECT id::text AS id, manager_id::text AS manager_id FROM users")
            keys = await conn.fetch("SELECT id::text AS id, user_id::text AS user_id FROM mesh_api_keys")
            return config, await conn.fetch(REFERENCE_GRANTS), users, keys
        finally:
            await conn.close()

    try:
        config, reference, users, keys = asyncio.run(run())
    finally:
        pg.stop()

    principal_ids = [p.id for p in config.principals]
    model_ids = [m.id for m in config.models]
    assert principal_ids == sorted(principal_ids) and model_ids == sorted(model_ids), "in id order"
    assert {m.name for m in config.models} == {"m0", "m2", "m4"}, "the sealed-elsewhere provider's models left"

    assert config.grant_table is not None and not config.grants
    table = config.grant_table
    got = sorted(
        (principal_ids[p], model_ids[m], _terms(table.terms[k])) for p, m, k in table.records())
    expected = sorted(
        (row["user_id"], row["model_id"], (snapshot.usd_to_nanos(row["daily_cap_usd"]), row["max_calls_per_hour"],
                                           _minutes(row["allowed_from"]), _minutes(row["allowed_to"]),
                                           row["timezone"], tuple(row["active_days"]), row["always_open"]))
        for row in reference if row["model_id"] in model_ids)
    assert got == expected
    assert len(table.terms) == 1 + len(POLICIES) + 1, "the defaults, then each distinct policy once"
    assert sorted(config.grant_pairs()) == sorted((p, m) for p, m, _ in table.records())

    managers = {row["id"]: row["manager_id"] for row in users}
    assert {p.id: None if p.manager is None else principal_ids[p.manager] for p in config.principals} == managers
    owners = {row["id"]: row["user_id"] for row in keys}
    assert {k.id: principal_ids[k.principal] for k in config.keys} == owners

    Core(b"pepper").load(snapshot.encode(config))


def _terms(terms: snapshot.GrantTerms) -> tuple[Any, ...]:
    return (terms.daily_cap_nano_usd, terms.max_calls_per_hour, terms.allowed_from_min, terms.allowed_to_min,
            terms.timezone, tuple(terms.active_days), terms.always_open)
