"""Several instances on one PostgreSQL: registration, heartbeats, leases and provider shares.

An instance is ``lone`` while no other instance is registered and nobody else holds anything:
it then holds every cap whole, exactly as a single host always did (its calls never touch the
database, also while the database is away). Once another instance registers, every instance
switches to ``cluster`` mode, where what must never be exceeded is leased:

- **Budgets** (the per-user daily cap). ``allowances`` keeps, per cap and day, what was spent
  before leasing began plus every lease's amount; a grant (``meshfast_lease_grant``, one round
  trip, on the first call of a person and model on an instance or when its slice runs out) never
  takes that past the cap. Locally the lease is a *ceiling* in shared memory: the counter's value
  when the lease began plus the slice, raised with what other hosts' spend adds to the counter at
  each checkpoint. The core reserves against ``min(cap, ceiling)``, so the instance's own spend
  plus its open reservations never pass its slices, and the sum over instances never passes the
  cap. Slices are half of what remains shared by the live instances, so they shrink near the cap.
- **Provider limits** (concurrency slots, rate). ``provider_shares`` splits each limit; an
  instance grows its share (under a lock, from what nobody holds) when calls waited for want of
  it and gives back what it does not use, so an idle instance's share goes to the busy ones.

The instance leader (one worker per instance, under an advisory lock of its own) beats once a
second, reports and returns leases, rebalances shares, checkpoints the counters and reclaims
dead instances' holdings. A growing lease or share is written to the database before it is used;
a shrinking one is taken out of shared memory before the database hears of it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from meshfast._core import (
    CLUSTER,
    CLUSTER_FENCED,
    CLUSTER_LEASED,
    PROVIDER_CALLS_HOUR,
    PROVIDER_INFLIGHT,
    PROVIDER_RATE,
    RULE_MINUTE_CALLS,
    RULE_MINUTE_TOKENS,
    RULE_OWN,
    WORKFLOW_SPEND,
    ceiling_key,
    cluster_key,
    counter_key,
    demand_key,
)
from meshfast.secrets import Secrets
from meshfast.store.cluster import (
    APPLIED_MIGRATIONS,
    BEAT,
    DECLARE,
    DELETE_INSTANCE,
    DELETE_OWN_LEASES,
    DELETE_OWN_SHARES,
    FOREIGN_HOLDINGS,
    GRANT,
    INSERT_FINGERPRINT,
    INSERT_INSTANCE,
    LIST_INSTANCES,
    LOCK_ALLOWANCE,
    LOCK_CLUSTER,
    LOCK_ORPHANED,
    MIGRATIONS_TABLE_EXISTS,
    OTHER_SHARES,
    OTHERS,
    OWN_LEASES,
    REAP_DEAD,
    REAP_EXPIRED,
    REAP_ORPHANED,
    REAP_SHARES,
    RETURN_LEASE,
    SELECT_FINGERPRINT,
    SET_MODE,
    SHARE_LOCK,
    UPSERT_SHARE,
)

log = logging.getLogger("meshfast.cluster")

ENV_INSTANCE_ID = "MESHFAST_INSTANCE_ID"
# NOTE: the same key as in migration 0017's meshfast_lease_grant (shared there, exclusive here).
CLUSTER_LOCK = 7164774026633454957
HEARTBEAT_S = 1.0
LONE_REAP_S = 120.0
# An instance whose heartbeat is this old is listed dead; its holdings are reclaimed at REAP_S.
DEAD_S = 10.0
REAP_S = 20.0
# An instance that could not beat for this long stops using what it holds (others reclaim it at
# REAP_S after its last beat; the margin covers a beat that was sent but not answered).
FENCE_S = 8.0
ZERO_ID = "00000000-0000-0000-0000-000000000000"
SLOTS, RATE = 0, 1
EPOCH_DATE = dt.date(1970, 1, 1)


class SecretsMismatch(SystemExit):
    pass


class SchemaUnknown(SystemExit):
    pass


def fingerprint(secrets: Secrets) -> bytes:
    """A keyed digest of the cluster's secrets: equal secrets give equal fingerprints, and the
    fingerprint reveals neither."""
    return hmac.new(secrets.master_key, b"meshfast cluster secrets\x00" + secrets.key_pepper, hashlib.sha256).digest()


def heartbeat_key() -> bytes:
    """Where the instance leader writes the time (unix ms) its last successful beat began."""
    return counter_key(CLUSTER, ZERO_ID, ZERO_ID, 1)


def _epoch_key() -> bytes:
    """The last cluster epoch this segment used (see :func:`set_mode`)."""
    return counter_key(CLUSTER, ZERO_ID, ZERO_ID, 2)


def mode_of(segment: Any) -> int:
    """The instance's cluster mode as the core reads it: ``epoch << 8 | state``; 0 alone."""
    return int(segment.get(cluster_key()))


# How long a lone instance that others joined waits for the calls it admitted under the whole
# caps to settle before it lets the others lease (a longer stream counts as if leased).
JOIN_WAIT_S = 30.0
# A lease that did not move for this many beats gives back what it does not use.
IDLE_BEATS = 4


async def check_schema(conn: asyncpg.Connection, known: set[int], join: bool) -> None:
    """Refuse a database whose schema this build does not know: newer migrations always; with
    ``join`` (no migrations of its own), also an older one."""
    applied = {int(v) for v in await conn.fetchval(APPLIED_MIGRATIONS)} \
        if await conn.fetchval(MIGRATIONS_TABLE_EXISTS) else set()
    unknown = sorted(applied - known)
    if unknown:
        raise SchemaUnknown(
            f"meshfast: the database schema is at version {max(applied)}, newer than this build knows "
            f"({max(known)}; unknown migrations {unknown}); run a meshfast that knows it")
    if join and applied != known:
        have = max(applied) if applied else 0
        raise SchemaUnknown(
            f"meshfast: --join needs the database schema at version {max(known)} (this build), it is at "
            f"version {have}; migrate it first (meshfast migrate, or a serve without --join)")


async def register(conn: asyncpg.Connection, secrets: Secrets, instance_id: str, port: int, workers: int) -> str:
    """Check the secrets against the cluster's and register this instance; returns its mode."""
    mine = fingerprint(secrets)
    async with conn.transaction():
        await conn.execute(LOCK_CLUSTER, CLUSTER_LOCK)
        await conn.execute(INSERT_FINGERPRINT, mine)
        theirs = await conn.fetchval(SELECT_FINGERPRINT)
        if bytes(theirs) != mine:
            raise SecretsMismatch(
                "meshfast: this data dir's secrets.json does not match the cluster's (another instance on this "
                "database was started with other secrets); copy secrets.json from a running instance's data dir "
                "into this one's before starting it")
        await reap(conn)
        others = await conn.fetchval(OTHERS, instance_id)
        foreign = await conn.fetchval(FOREIGN_HOLDINGS, instance_id)
        # Alone only on a database no cluster used in a window still open: an allowance left by
        # one counts what its members declared (spent or not), which no counter here knows.
        mode = "lone" if not others and not foreign else "cluster"
        await conn.execute(INSERT_INSTANCE, instance_id, socket.gethostname(), port, os.getpid(), workers, mode)
    return mode


async def unregister(conn: asyncpg.Connection, segment: Any, instance_id: str) -> None:
    """On a clean stop, after the last checkpoint: give back every unspent slice and share."""
    mode = mode_of(segment)
    async with conn.transaction():
        for row in await conn.fetch(OWN_LEASES, instance_id):
            key = bytes(row["resource"])
            room = max(0, segment.get(ceiling_key(key, mode)) - segment.get(key)) if mode else 0
            await conn.execute(LOCK_ALLOWANCE, key)
            await conn.execute(RETURN_LEASE, key, instance_id, min(room, row["declared"]))
        await conn.execute(DELETE_OWN_LEASES, instance_id)
        await conn.execute(DELETE_OWN_SHARES, instance_id)
        await conn.execute(DELETE_INSTANCE, instance_id)


async def reap(conn: asyncpg.Connection) -> None:
    """Reclaim what instances that stopped beating held (inside the caller's transaction, under
    the exclusive cluster lock)."""
    await conn.execute(REAP_DEAD, REAP_S, LONE_REAP_S)
    await conn.execute(LOCK_ORPHANED)
    await conn.execute(REAP_ORPHANED)
    await conn.execute(REAP_SHARES)


async def list_instances(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [
        {"id": r["id"], "host": r["host"], "port": r["port"], "started_at": r["started_at"].isoformat(),
         "last_seen": r["last_seen"].isoformat(), "workers": r["workers"], "alive": r["alive"], "mode": r["mode"]}
        for r in await conn.fetch(LIST_INSTANCES, DEAD_S)
    ]


def new_instance_id() -> str:
    return str(uuid.uuid4())


def fence_if_stale(segment: Any, now_ms: int | None = None) -> bool:
    """Called by every worker once a second: a leased instance whose leader has not beaten for
    FENCE_S uses no provider share from now on (its shares may be reclaimed at REAP_S; its budget
    slices stay usable: what it may spend of them is declared already)."""
    mode_key = cluster_key()
    if segment.get(mode_key) & 0xFF != CLUSTER_LEASED:
        return False
    beat = segment.get(heartbeat_key())
    now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    if beat and now_ms - beat > FENCE_S * 1000:
        segment.add(mode_key, CLUSTER_FENCED - CLUSTER_LEASED)
        log.error("no heartbeat for %.0f s: this instance stops spending what it leased until it reaches the "
                  "database again", (now_ms - beat) / 1000)
        return True
    return False


def set_mode(segment: Any, state: int) -> None:
    """Alone (0) or leased in a new epoch: ceilings of an earlier membership (the instance was
    alone in between, or its holdings were reclaimed while it was cut off) are never read again."""
    key = cluster_key()
    value = 0
    if state:
        epoch = segment.add(_epoch_key(), 1)
        value = (epoch << 8) | state
    segment.add(key, value - segment.get(key))


class Leases:
    """The workers' side: ask the database for a budget slice when the core asks for one."""

    def __init__(self, segment: Any, pool: asyncpg.Pool, instance_id: str) -> None:
        self.segment = segment
        self.pool = pool
        self.instance_id = instance_id
        self.grants = 0

    async def acquire(self, wanted: tuple[bytes, int, int, int, int, int, int, list[str], int, int], user_id: str,
                      model_id: str, provider_id: str | None, deadline_s: float = 3.0) -> bool | None:
        """True when room was declared (decide again), False when the cap has no room for the
        call in the whole cluster, None when the database cannot be asked (fail closed)."""
        key, kind, period, need, cap, base, expires_ms, models, from_day, to_day = wanted
        first, last = EPOCH_DATE + dt.timedelta(days=from_day), EPOCH_DATE + dt.timedelta(days=to_day)
        a, b = (ZERO_ID, provider_id or ZERO_ID) if kind == PROVIDER_CALLS_HOUR else (user_id, model_id)
        if kind == WORKFLOW_SPEND:
            # The workflow's uid rides in ``models``: the allowance starts from its checkpointed spend.
            a, b, models = ZERO_ID, models[0], []
        # Kept past the window's end (a day; two minutes for a minute's): a late call's settle
        # still finds its slice.
        keep_s = 120 if kind in (RULE_MINUTE_CALLS, RULE_MINUTE_TOKENS) else 86_400
        expires = dt.datetime.fromtimestamp(expires_ms / 1000 + keep_s, dt.UTC)
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        mode = mode_of(self.segment)
        while True:
            try:
                async with asyncio.timeout(max(0.1, end - loop.time())):
                    async with self.pool.acquire() as conn:
                        granted = await conn.fetchval(GRANT, key, self.instance_id, kind, a, b, period,
                                                      cap, need, base, expires, models, first, last)
            except Exception as exc:
                # NOTE: whatever went wrong (the database away or restarting, a connection in a
                # bad state), the call is refused: fail closed.
                log.warning("cannot lease a slice of a cap: %s: %s", type(exc).__name__, exc)
                return None
            if granted and granted > 0:
                self.grants += 1
                if mode_of(self.segment) != mode:
                    # The instance went alone or started a new membership meanwhile: the slice
                    # belongs to the old one (counted in the database as declared, never used here).
                    return True
                ceiling = ceiling_key(key, mode)
                # A first slice starts from the counter as it is; a later one adds to the ceiling.
                if self.segment.set_if_zero(ceiling, self.segment.get(key) + granted) != 0:
                    self.segment.add(ceiling, granted)
                return True
            if granted == 0:
                return False
            # -1: an instance still holds the caps whole; it switches within a beat.
            if loop.time() + 0.2 > end:
                return None
            await asyncio.sleep(0.2)


@dataclass
class _Lease:
    used: int = 0
    idle: int = 0
    kind: int = 0


@dataclass
class _Share:
    last_demand: int = 0
    quiet: int = 0
    last_calls: int = 0


@dataclass
class Agent:
    """The instance leader's cluster duties, one ``tick`` a second (a job of the instance's
    leader loop): beat, switch modes, reclaim the dead, report and return leases, rebalance
    provider shares."""

    segment: Any
    instance_id: str
    config: Any = None  # callable returning the current snapshot Config
    checkpoint: Any = None  # async callable(conn): push the counters
    mode: str = "cluster"
    _used: dict[bytes, _Lease] = field(default_factory=dict)
    _join_marks: list[tuple[int, int]] | None = None
    _join_until: float = 0.0
    _shares: dict[tuple[str, int], _Share] = field(default_factory=dict)

    async def tick(self, conn: asyncpg.Connection) -> None:
        started_ms = time.time_ns() // 1_000_000
        mode = await conn.fetchval(BEAT, self.instance_id)
        if mode is None:
            # Reclaimed while cut off: what this instance held is gone; it starts afresh as a
            # member (a new epoch: no earlier ceiling is read again).
            await conn.execute(INSERT_INSTANCE, self.instance_id, socket.gethostname(), 0, os.getpid(), 0, "cluster")
            set_mode(self.segment, CLUSTER_LEASED)
            self._used.clear()
            self._shares.clear()
            mode = "cluster"
            log.warning("this instance's holdings were reclaimed while it was cut off; registered again")
        hb = heartbeat_key()
        self.segment.add(hb, started_ms - self.segment.get(hb))
        if mode_of(self.segment) & 0xFF == CLUSTER_FENCED and mode == "cluster":
            # Back in touch, not reclaimed: the same epoch, shares usable again.
            self.segment.add(cluster_key(), CLUSTER_LEASED - CLUSTER_FENCED)
        self.mode = mode
        if mode == "lone":
            if self._join_marks is not None or await conn.fetchval(OTHERS, self.instance_id):
                await self._join(conn)
            return
        await self._reap(conn)
        await self._leases(conn)
        await self._provider_shares(conn)

    async def _join(self, conn: asyncpg.Connection) -> None:
        """Another instance registered: lease from now on (for good: an instance goes back to
        holding the caps whole only when it restarts alone). The calls this instance admitted
        under the whole caps settle first (at most JOIN_WAIT_S), and their spend reaches the
        database, before anyone may lease: until this instance says ``cluster``, every grant
        waits. The wait spans beats (the heartbeat goes on)."""
        loop = asyncio.get_running_loop()
        if self._join_marks is None:
            set_mode(self.segment, CLUSTER_LEASED)
            # NOTE: a call that read the mode just before it changed reserves within microseconds.
            await asyncio.sleep(0.05)
            self._join_marks = self.segment.lease_marks()
            self._join_until = loop.time() + JOIN_WAIT_S
            log.info("another instance joined: caps and provider limits are leased once this instance's calls "
                     "in flight settle")
        if self.segment.leases_outstanding(self._join_marks) and loop.time() < self._join_until:
            return
        if self.checkpoint is not None:
            await self.checkpoint(conn)
        await conn.execute(SET_MODE, self.instance_id, "cluster")
        self._join_marks = None
        self.mode = "cluster"
        log.info("this instance leases caps and provider limits from now on")

    async def _reap(self, conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            await conn.execute(LOCK_CLUSTER, CLUSTER_LOCK)
            await reap(conn)
            await conn.execute(REAP_EXPIRED)

    async def _leases(self, conn: asyncpg.Connection) -> None:
        """Declare ahead what each busy slice will use in the next beats (so calls far from a cap
        never wait for the database); give back the room and the undeclared part of a slice that
        did not move for IDLE_BEATS beats."""
        rows = await conn.fetch(OWN_LEASES, self.instance_id)
        mode = mode_of(self.segment)
        if not mode:
            return
        seen: dict[bytes, _Lease] = {}
        raise_keys: list[bytes] = []
        raise_by: list[int] = []
        for row in rows:
            key = bytes(row["resource"])
            amount, declared, need = int(row["amount"]), int(row["declared"]), int(row["need"])
            ceiling = ceiling_key(key, mode)
            room = max(0, self.segment.get(ceiling) - self.segment.get(key))
            used = max(0, declared - room)
            state = self._used.get(key) or _Lease(used=used, kind=int(row["kind"]))
            moved = used - state.used
            state.idle = 0 if moved else state.idle + 1
            state.used = used
            seen[key] = state
            if state.idle >= IDLE_BEATS and amount > used:
                taken = 0
                if room > 0:
                    # Out of shared memory first (a reservation of the room, the ceiling lowered
                    # under it, the reservation released), so no call can use it meanwhile.
                    lease = self.segment.reserve(key, room, self.segment.get(ceiling))
                    if lease is None:
                        continue
                    self.segment.add(ceiling, -room)
                    lease.release()
                    taken = room
                async with conn.transaction():
                    # NOTE: the allowance row before the lease row, as meshfast_lease_grant.
                    await conn.execute(LOCK_ALLOWANCE, key)
                    await conn.execute(RETURN_LEASE, key, self.instance_id, taken)
            elif moved > 0:
                target = min(amount, used + max(2 * moved, 2 * need))
                if target > declared:
                    raise_keys.append(key)
                    raise_by.append(target - declared)
        for key, state in self._used.items():
            if key not in seen:
                # The window ended and its allowance was dropped: its ceiling goes, and the
                # instance's own counter under a rule entry (no other copy anywhere) too.
                self.segment.remove(ceiling_key(key, mode))
                if state.kind in (RULE_OWN, RULE_MINUTE_CALLS, RULE_MINUTE_TOKENS):
                    self.segment.remove(key)
        self._used = seen
        if raise_keys:
            more = dict(zip(raise_keys, raise_by, strict=True))
            for row in await conn.fetch(DECLARE, self.instance_id, raise_keys, raise_by):
                key = bytes(row["resource"])
                self.segment.add(ceiling_key(key, mode), more[key])

    async def _provider_shares(self, conn: asyncpg.Connection) -> None:
        config = self.config() if self.config is not None else None
        if config is None:
            return
        hour = int(time.time() // 3600)
        for provider in config.providers:
            limits = []
            if provider.max_concurrent_upstream and provider.max_concurrent_upstream > 0:
                limits.append((SLOTS, counter_key(PROVIDER_INFLIGHT, ZERO_ID, provider.id, 0),
                               int(provider.max_concurrent_upstream)))
            if provider.max_outbound_rps and provider.max_outbound_rps > 0:
                limits.append((RATE, counter_key(PROVIDER_RATE, ZERO_ID, provider.id, 0),
                               int(provider.max_outbound_rps) * 1000))
            calls = self.segment.get(counter_key(PROVIDER_CALLS_HOUR, ZERO_ID, provider.id, hour))
            for kind, key, limit in limits:
                await self._rebalance(conn, provider.id, kind, key, limit, calls)

    async def _rebalance(self, conn: asyncpg.Connection, provider_id: str, kind: int, key: bytes, limit: int,
                         calls: int) -> None:
        """One provider limit's share: grown (the database first) from what nobody holds while
        calls waited for want of it, shrunk (shared memory first) towards an equal split of the
        instances that want it, given back when unused, never past what the others hold."""
        state = self._shares.setdefault((provider_id, kind), _Share())
        mode = mode_of(self.segment)
        ceiling = ceiling_key(key, mode)
        held = self.segment.get(ceiling)
        demand = self.segment.get(demand_key(key))
        wanting = demand > state.last_demand
        state.last_demand = demand
        called = calls - state.last_calls if calls >= state.last_calls else calls
        state.last_calls = calls
        # In use: slots in flight; for a rate, what the last beat's calls took (half again).
        if kind == SLOTS:
            in_use = max(0, self.segment.get(key))
        else:
            in_use = int(called * 1000 * 1.5 / HEARTBEAT_S)
        state.quiet = 0 if wanting or called else state.quiet + 1
        async with conn.transaction():
            await conn.execute(SHARE_LOCK, f"{provider_id}:{kind}")
            other = await conn.fetchrow(OTHER_SHARES, provider_id, kind, self.instance_id)
            others, others_wanting = int(other["held"]), int(other["wanting"])
            room = max(0, limit - others)
            fair = -(-limit // (others_wanting + 1))
            if wanting:
                target = room if not others_wanting else max(min(held, fair), min(room, fair))
            elif state.quiet >= 2:
                target = in_use if kind == SLOTS else 0
            else:
                target = held
            if others_wanting and target > fair:
                # Others wait: an equal split of the limit (slots in flight drain into it).
                target = fair
            target = min(target, room)
            if target > held:
                # Grows: the database first.
                await conn.execute(UPSERT_SHARE, provider_id, kind, self.instance_id, target, wanting)
                self.segment.add(ceiling, target - held)
            else:
                if target < held:
                    # Shrinks: shared memory first; slots in flight above it drain by themselves.
                    self.segment.add(ceiling, target - held)
                await conn.execute(UPSERT_SHARE, provider_id, kind, self.instance_id,
                                   max(target, in_use) if kind == SLOTS else target, wanting)
