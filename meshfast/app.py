"""The meshfast application that runs in every Granian worker (RSGI).

Start-up (``__rsgi_init__``) opens the pools, maps the shared-memory segment, builds the first
snapshot and starts the config listener. Nothing here runs at import: Granian imports this
module in every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import asyncpg
import msgspec

from meshfast import background, cluster, counters, dashboard, errors, onboarding, realtime, rules, tokens, verify
from meshfast._core import Core, Segment, SnapshotError, entry_error, request_id
from meshfast.admin import auth, openapi
from meshfast.admin.issuers import KeySets
from meshfast.admin.notifications import NotificationsAdmin
from meshfast.admin.plane import AdminPlane
from meshfast.admin.routes import AdminRouter, Stream
from meshfast.admin.rules import dry_run_hook
from meshfast.admin.service import AdminService
from meshfast.admission import Admission
from meshfast.body import BodyReader, Saturation, raise_open_file_limit
from meshfast.dataplane import (
    ENTRY_ROUTES,
    DataPlane,
    Route,
    client_ip,
    gemini_call,
    mesh_key_shaped,
    ollama_tags,
)
from meshfast.dispatch import Dispatcher, Timeouts
from meshfast.leader import Leader, apply_retention, ensure_log_partitions
from meshfast.looplag import LoopLagProbe
from meshfast.metrics import Metrics
from meshfast.notify import Notifier
from meshfast.otel import Tracing
from meshfast.secrets import Secrets, load_or_create
from meshfast.settings import Settings
from meshfast.snapshot import (
    Config,
    RulesPart,
    build_release,
    encode,
    encode_part,
    fetch_config,
    json_value,
    principal_from_row,
)
from meshfast.startclock import StartClock
from meshfast.store import database, sql
from meshfast.telemetry import Telemetry

log = logging.getLogger("meshfast.worker")


# A worker that starts this long after the supervisor handed over its clock was respawned.
RESPAWN_AFTER_S = 30.0
# The phases the supervisor hands its workers (meshfast/supervisor.py), before theirs.
_SUPERVISOR_PHASES = frozenset({"interpreter and imports", "settings and secrets", "database start", "migrations",
                                "segment", "register"})


def _warm_up() -> None:
    """What a worker makes once it is ready, in a thread: not needed to serve, too slow to make
    at start (an Argon2 hash, aiohttp's import) or on a serving loop when first needed."""
    auth.dummy_hash()
    import aiohttp  # noqa: F401

    import meshfast.aiohttp_client  # noqa: F401

# Set by the supervisor before it starts the workers.
ENV_DATABASE_URL = "MESHFAST_RUNTIME_DATABASE_URL"
ENV_GATEWAY_DATABASE_URL = "MESHFAST_RUNTIME_GATEWAY_DATABASE_URL"
ENV_SHM_PATH = "MESHFAST_RUNTIME_SHM_PATH"
# Requests one worker serves at once (MESHFAST_MAX_CONNECTIONS split over the workers).
ENV_WORKER_LIMIT = "MESHFAST_RUNTIME_WORKER_LIMIT"

JSON = "application/json"
_SECURITY_HEADERS = [
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
]
_DRAINING = b'{"status":"draining"}\n'
_json = msgspec.json.Encoder()
COUNTER_CHECKPOINT_S = 5.0
# How often the leader looks for key sets due a fetch (a cheap query; MESHFAST_JWKS_REFRESH_S
# sets each set's period, a worker's request for an early one waits at most this long).
JWKS_POLL_S = 2.0
# How often the leader activates due scheduled revisions of controls and expires stale changes.
CHANGES_POLL_S = 0.5
COUNTER_PURGE_S = 600.0
SATURATION_PUBLISH_S = 1.0


class ConfigFeed:
    """Keeps this worker's snapshot current: LISTEN for NOTIFY, coalesce bursts, reconcile.

    Every admin write bumps a sequence and sends NOTIFY; each notification marks the snapshot
    dirty and one rebuild covers every notification that arrived before it started. An
    unconditional rebuild every ``reconcile_s`` bounds staleness if a notification is lost.

    Small changes skip the rebuild: a notification ``<seq>:user:<id>`` (one user's organisation,
    status or expiry) or ``<seq>:rules`` (the rules or the switch) whose seq is the next one this
    worker expects is applied by reading just that from the database and patching the core's
    snapshot (everything else shared), so a manager change or a rule reaches every worker in
    milliseconds even with a million grants loaded. Anything else, a gap in the sequence or a
    patch that does not fit, falls back to the full rebuild.
    """

    def __init__(self, core: Core, pool: asyncpg.Pool, listen_url: str, reconcile_s: int,
                 master_key: bytes, segment: Segment | None = None) -> None:
        self._core = core
        # This instance's highest known config seq, shared by its workers (counters.config_seq_key).
        self._segment = segment
        self._seq_key = counters.config_seq_key()
        # Set (and replaced) each time this worker's snapshot moves to a later seq.
        self._advanced = asyncio.Event()
        # The highest seq a refusal waited for in vain (a snapshot the core rejected, a rebuild
        # that keeps failing): no later refusal waits for it again.
        self._gave_up = 0
        self._master_key = master_key
        self._pool = pool
        self._listen_url = listen_url
        self._reconcile_s = reconcile_s
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self.rebuilds = 0
        self.patches = 0
        # The last full rebuild's (database read, build, core load) seconds.
        self.last_rebuild = (0.0, 0.0, 0.0)
        self.config: Config | None = None
        # Changes announced but not applied yet, by seq; the highest seq announced.
        self._changes: dict[int, str] = {}
        self._announced = 0
        self._principal_index: dict[str, int] | None = None
        # Set when notifications may have been missed (the listener reconnected): rebuild.
        self._force = False
        # What onboarding added to the loaded snapshot: pilots' members, the next expiry.
        self.release = onboarding.Release(rules=[], pilot_members={}, next_change_ms=None)

    async def rebuild(self) -> int:
        async with self._lock:
            started = time.perf_counter()
            async with self._pool.acquire() as conn:
                rows = await fetch_config(conn)
            read = time.perf_counter()

            def build() -> tuple[Config, onboarding.Release, bytes]:
                config, release = build_release(rows, self._master_key)
                return config, release, encode(config)

            # NOTE: off the serving loop: with a million grants, building and loading take seconds
            # (the core's load releases the GIL; building the structs shares it in slices).
            config, release, data = await asyncio.to_thread(build)
            built = time.perf_counter()
            try:
                seq = await asyncio.to_thread(self._core.load, data)
                self.last_rebuild = (read - started, built - read, time.perf_counter() - built)
                self.config = config
                self.release = release
                self._principal_index = None
                self._changes = {k: v for k, v in self._changes.items() if k > seq}
            except SnapshotError as exc:
                # NOTE: the last good snapshot stays in force.
                log.error("snapshot rejected, keeping seq %s: %s", self._core.seq, exc)
                raise
            self.rebuilds += 1
            self._moved()
            log.debug("snapshot seq %d loaded in %.1f ms", seq, (time.perf_counter() - started) * 1000)
            return seq

    async def ensure(self, seq: int, change: str = "") -> None:
        """Return once this worker's snapshot covers config sequence ``seq`` (the worker that
        made a write, which knows what it changed)."""
        if self._segment is not None and seq > 0:
            # NOTE: the instance's other workers learn of the write at once, not when their own
            # NOTIFY arrives (see behind()). Only a write this worker committed raises it: a
            # NOTIFY's payload is anyone's to send.
            with contextlib.suppress(Exception):
                self._segment.raise_to(self._seq_key, seq)
        self.announce(seq, change)
        await self.catch_up()

    def announce(self, seq: int, change: str = "") -> None:
        """Note a write (from its NOTIFY or from this worker) and wake the rebuild loop."""
        self._announced = max(self._announced, seq)
        if change:
            self._changes[seq] = change
        self._dirty.set()

    def _notified(self, payload: str) -> None:
        """A NOTIFY: a change this worker may patch, or anything else (a bare seq, or a payload
        it cannot read), which rebuilds as every notification did before patches existed."""
        seq_text, _, change = payload.partition(":")
        try:
            seq = int(seq_text)
        except ValueError:
            seq, change = 0, ""
        if not change:
            self._force = True
        self.announce(seq, change)

    async def catch_up(self) -> None:
        """Apply the announced changes in sequence by patching; rebuild when that cannot cover
        everything announced."""
        async with self._lock:
            while self._core.seq < self._announced:
                change = self._changes.pop(self._core.seq + 1, None)
                if change is None or self.config is None:
                    break
                try:
                    await self._patch(self._core.seq + 1, change)
                except Exception as exc:  # noqa: BLE001 - any failure falls back to the rebuild
                    log.info("config change %s (seq %d) not patched (%s); rebuilding", change,
                             self._core.seq + 1, exc)
                    break
            covered = self._core.seq >= self._announced
        if not covered:
            await self.rebuild()

    async def _patch(self, seq: int, change: str) -> None:
        """One change without a rebuild (see the class docs); raises when it cannot be."""
        config = self.config
        assert config is not None
        kind, _, target = change.partition(":")
        started = time.perf_counter()
        if kind == "user":
            if self._principal_index is None:
                self._principal_index = {p.id: i for i, p in enumerate(config.principals)}
            index = self._principal_index[str(uuid.UUID(target))]
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(sql.SNAPSHOT_PRINCIPAL, uuid.UUID(target))
            if row is None:
                raise LookupError("the user is gone")
            manager = None if row["manager_id"] is None else self._principal_index[str(row["manager_id"])]
            principal = principal_from_row(row, manager)
            self._core.patch_principal(seq, index, encode_part(principal))
            config.principals[index] = principal
        elif kind == "rules":
            if self.release.rules or self.release.pilot_members:
                # NOTE: synthetic rules and pilots' cohorts come from more than the rules table.
                raise LookupError("onboarding rules and pilots are rebuilt, not patched")
            async with self._pool.acquire() as conn:
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    enforce = bool(await conn.fetchval(sql.SNAPSHOT_ENFORCE_RULES))
                    rule_rows = await conn.fetch(sql.SNAPSHOT_RULES)
            principal_index = {p.id: i for i, p in enumerate(config.principals)}
            model_index = {m.name: i for i, m in enumerate(config.models)}
            loaded = [rules.to_config(json_value(row["body"]), principal_index, model_index) for row in rule_rows]
            part = RulesPart(rules=loaded, enforce_rules=enforce, calendar_tz=config.calendar_tz)
            self._core.patch_rules(seq, encode_part(part))
            config.rules, config.enforce_rules = loaded, enforce
        else:
            raise ValueError(f"unknown change {kind!r}")
        self.patches += 1
        self._moved()
        log.info("config seq %d patched (%s) in %.1f ms", seq, kind, (time.perf_counter() - started) * 1000)

    def _moved(self) -> None:
        self._advanced.set()
        self._advanced = asyncio.Event()

    def behind(self) -> int:
        """The config seq this instance knows was written when this worker has not loaded it yet,
        else 0. One read of shared memory: the data plane asks before it refuses a caller for
        something the configuration decides (a key, a model, a grant)."""
        if self._segment is None:
            return 0
        # NOTE: this worker's own notifications count too (a write from the CLI or another
        # instance reaches the instance only through them).
        known = max(self._segment.get(self._seq_key), self._announced)
        return known if known > self._core.seq and known > self._gave_up else 0

    async def reach(self, seq: int, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) until this worker's snapshot covers ``seq``. The rebuild
        loop does the work: its NOTIFY normally arrives within milliseconds; past a quarter of
        the wait without it (a notification lost), the loop is woken to rebuild. True when the
        snapshot got there; a seq waited for in vain is never waited for again."""
        started = time.monotonic()
        deadline, nudge = started + timeout_s, started + timeout_s / 4
        while self._core.seq < seq:
            now = time.monotonic()
            if now >= deadline:
                self._gave_up = max(self._gave_up, seq)
                return False
            if nudge and now >= nudge:
                nudge = 0.0
                self.announce(seq)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._advanced.wait(), (nudge or deadline) - now)
        return True

    def start(self) -> None:
        self._tasks = [background.start("config_rebuild", self._rebuild_loop),
                       background.start("config_listen", self._listen_loop)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _wait_s(self) -> float:
        """Until the next reconcile, or sooner when a pilot or a limited release expires (the
        snapshot then changes with no write to announce it)."""
        wait = float(self._reconcile_s)
        if self.release.next_change_ms is not None:
            wait = min(wait, max(0.05, self.release.next_change_ms / 1000 - time.time() + 0.01))
        return wait

    async def _rebuild_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout=self._wait_s())
            background.fault_point("config_rebuild")
            reconcile = self._force or not self._dirty.is_set()
            self._force = False
            self._dirty.clear()
            try:
                await (self.rebuild() if reconcile else self.catch_up())
            except Exception:
                log.exception("snapshot rebuild failed; retrying")
                await asyncio.sleep(1.0)
                self._dirty.set()

    async def _listen_loop(self) -> None:
        while True:
            background.fault_point("config_listen")
            lost = asyncio.Event()
            try:
                conn = await database.connect(self._listen_url, role=database.GATEWAY_ROLE)
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener(sql.CONFIG_CHANNEL, lambda *args: self._notified(str(args[-1])))
                # Anything written while we were not listening is picked up now.
                self._force = True
                self._dirty.set()
                try:
                    await lost.wait()
                finally:
                    with contextlib.suppress(Exception):
                        await conn.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("config listener disconnected (%s); reconnecting", exc)
            await asyncio.sleep(0.5)


class App:
    def __init__(self) -> None:
        self.settings: Settings | None = None
        self.core: Core | None = None
        self.segment: Segment | None = None
        self.secrets: Secrets | None = None
        self.gateway_pool: asyncpg.Pool | None = None
        self.admin_pool: asyncpg.Pool | None = None
        self.feed: ConfigFeed | None = None
        self.admin: AdminRouter | None = None
        self.leader: Leader | None = None
        self.key_sets: KeySets | None = None
        self.instance_leader: Leader | None = None
        self.agent: cluster.Agent | None = None
        self.leases: cluster.Leases | None = None
        self.instance_id = ""
        self.notifier: Notifier | None = None
        self.dispatcher: Dispatcher | None = None
        self.metrics: Metrics | None = None
        self.plane: AdminPlane | None = None
        self._admission: Admission | None = None
        self.telemetry: Telemetry | None = None
        self.data: DataPlane | None = None
        self._draining = False
        self._in_flight: set[asyncio.Task[Any]] = set()
        # Open realtime sessions (meshfast.realtime): drained on their own, longer, bound.
        self._sessions: set[realtime.Session] = set()
        self._stop_pending = False
        self._limit: int | None = None
        self._body = BodyReader(idle_s=10.0, total_s=120.0)
        self._saturation: Saturation | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._lag_probe: LoopLagProbe | None = None
        self._warm: asyncio.Future[None] | None = None
        self._seeded_at: float | None = None
        self.tracing: Tracing | None = None
        self._openapi = openapi.encoded()
        # Answered before start-up completes too; carries the pid so tests can pin workers.
        self._health = b'{"status":"ok"}\n'

    # --- lifecycle ------------------------------------------------------------------------

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self.startup())
        self._watch_stop_signals(loop)

    def _watch_stop_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bound the drain: Granian, told to stop, waits for in-flight requests with no limit.

        Granian's stop is held back while realtime sessions are open: it does not wait for upgraded
        connections (its runtime stops under them), so the worker goes on serving, not ready, until
        its sessions end or are told to reconnect (``MESHFAST_REALTIME_DRAIN_S``), then passes the
        stop on. This takes the handler Granian registered on the event loop (asyncio's
        ``_signal_handlers``); on a loop without them, sessions end with the worker.

        NOTE: on such a loop, a Python-level handler is chained in front of the one the loop installed
        (which only wakes the loop through its wakeup fd, so the loop still sees the signal).
        """
        registered = getattr(loop, "_signal_handlers", None)
        for signum in (signal.SIGTERM, signal.SIGINT):
            granian = registered.get(signum) if isinstance(registered, dict) else None
            if granian is not None:
                loop.add_signal_handler(signum, self._stop_requested, loop, granian)
                continue
            previous = signal.getsignal(signum)

            def handler(num: int, frame: Any, previous: Any = previous) -> None:
                loop.call_soon_threadsafe(self._begin_drain, loop)
                if callable(previous):
                    previous(num, frame)

            signal.signal(signum, handler)

    def _stop_requested(self, loop: asyncio.AbstractEventLoop, granian: asyncio.Handle) -> None:
        """SIGTERM or SIGINT: Granian's stop, once the realtime sessions are done."""
        if self._stop_pending or self.settings is None:
            return
        self._stop_pending = True
        self._begin_drain(loop, stopping=not self._sessions)
        if not self._sessions:
            granian._run()
            return

        async def after_sessions() -> None:
            assert self.settings is not None
            # The sessions are told to reconnect at the bound; a second more for their rows.
            deadline = time.monotonic() + self.settings.realtime_drain_s + 2
            while self._sessions and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            self._schedule_cut(loop)
            granian._run()

        loop.create_task(after_sessions())

    def _begin_drain(self, loop: asyncio.AbstractEventLoop, stopping: bool = True) -> None:
        """Not ready any more (readiness 503, no new realtime session); open sessions get their
        bound. ``stopping``: Granian stops now, so in-flight calls get theirs."""
        if self._draining or self.settings is None:
            return
        self._draining = True
        if stopping:
            self._schedule_cut(loop)
        if self._sessions:
            log.info("worker %d draining: %d realtime sessions have %.0f s", os.getpid(), len(self._sessions),
                     self.settings.realtime_drain_s)
        realtime.drain_later(self._sessions, self.settings.realtime_drain_s, loop, loop.create_task)

    def _schedule_cut(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.settings is not None
        timeout_s = self.settings.drain_timeout_s
        log.info("worker %d draining: in-flight calls have %.0f s to finish", os.getpid(), timeout_s)
        loop.call_later(timeout_s, lambda: loop.create_task(self._cut_in_flight()))

    async def _cut_in_flight(self) -> None:
        """Past the drain bound: close the upstream client, then cancel the calls still running.

        Closing the client ends its streams as an upstream failure does (terminal event marked
        incomplete, row written, spend settled) where the client aborts in-flight exchanges;
        whatever still runs a second later is cancelled, which records its row as it stands.
        """
        log.warning("worker %d: drain timeout; cutting %d calls still in flight", os.getpid(), len(self._in_flight))
        if self.dispatcher is not None:
            with contextlib.suppress(Exception):
                await self.dispatcher.close()
        await asyncio.sleep(1.0)
        for task in list(self._in_flight):
            task.cancel()

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self.shutdown())

    async def startup(self) -> None:
        clock = StartClock.from_env()
        spawned_after = time.time() - clock.began - sum(s for _, s, _ in clock.phases)
        if spawned_after > RESPAWN_AFTER_S:
            clock = StartClock()  # a worker respawned long after the start: its own clock
        else:
            clock.add("worker process start", spawned_after)
        settings = Settings.from_env()
        logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # Every held connection is a descriptor: thousands of them (a slow-body attack among them)
        # must not starve the worker of sockets for its real callers, its pools and its spool.
        raise_open_file_limit()
        self._body = BodyReader(idle_s=settings.body_idle_timeout_s, total_s=settings.body_timeout_s)
        database_url = os.environ[ENV_DATABASE_URL]
        gateway_url = os.environ.get(ENV_GATEWAY_DATABASE_URL) or database_url
        self.settings = settings
        if "workflow" not in settings.tag_keys:
            log.warning("MESHFAST_TAG_KEYS has no workflow key: calls cannot name a workflow, so registered workflow "
                        "budgets are never charged")
        self.secrets = load_or_create(settings.secrets_path)
        self.segment = Segment.open(os.environ[ENV_SHM_PATH])
        # NOTE: read here, in the worker: the module (and this object) is imported by the
        # supervisor before it sets the variable.
        self._limit = int(os.environ.get(ENV_WORKER_LIMIT) or 0) or None
        self.segment.register()
        self.core = Core(self.secrets.key_pepper, self.segment)
        with clock.phase("pools", database=True):
            self.gateway_pool = await database.create_pool(gateway_url, role=database.GATEWAY_ROLE, min_size=1,
                                                           max_size=8)
            self.admin_pool = await database.create_pool(database_url, role=database.ADMIN_ROLE, min_size=0,
                                                         max_size=4)
        self.feed = ConfigFeed(self.core, self.gateway_pool, gateway_url, settings.reconcile_s,
                               self.secrets.master_key, self.segment)
        await self.feed.rebuild()
        read_s, build_s, load_s = self.feed.last_rebuild
        clock.add("snapshot: read", read_s, database=True)
        clock.add("snapshot: build", build_s)
        clock.add("snapshot: load", load_s)
        # The supervisor seeds the counters while the workers start: nothing that reads or pushes
        # them (calls, the checkpoint, leases) begins before the seed is in.
        await self._await_seed(clock)
        self.feed.start()
        self.notifier = Notifier(self.gateway_pool, self.secrets.master_key)
        self.key_sets = KeySets(self.admin_pool)
        # Cluster-wide chores on one worker of one instance; this instance's own (its counters,
        # its leases and shares) on one of its workers.
        self.leader = Leader(gateway_url, [
            ("log_partitions", 3600.0, ensure_log_partitions),
            ("retention", 3600.0, lambda conn: apply_retention(conn, max(1, settings.log_retention_days))),
            ("notify", self.notifier.settings.poll_s, self.notifier.tick),
            ("jwks", JWKS_POLL_S, self.key_sets.tick),
            # Scheduled revisions of controls go live within a second; stale pending changes expire.
            ("changes", CHANGES_POLL_S, self._changes_tick),
        ])
        self.leader.start()
        self.instance_id = os.environ.get(cluster.ENV_INSTANCE_ID) or cluster.new_instance_id()
        self.agent = cluster.Agent(self.segment, self.instance_id,
                                   config=lambda: self.feed.config if self.feed else None, checkpoint=self._checkpoint)
        self.instance_leader = Leader(gateway_url, [
            ("cluster", cluster.HEARTBEAT_S, self.agent.tick),
            ("checkpoint", COUNTER_CHECKPOINT_S, self._checkpoint),
            ("purge", COUNTER_PURGE_S, self._purge),
        ], retry_s=1.0, lock=int.from_bytes(bytes.fromhex(self.instance_id.replace("-", ""))[:8], "big", signed=True),
            name="instance leader")
        self.instance_leader.start()
        self.leases = cluster.Leases(self.segment, self.gateway_pool, self.instance_id)
        self.metrics = Metrics(self.segment)
        self.dispatcher = Dispatcher(Timeouts(
            connect_s=settings.upstream_connect_timeout_s, idle_s=settings.stream_idle_timeout_s,
            total_deadline_s=settings.upstream_deadline_s), client=settings.upstream_client, metrics=self.metrics)
        await self.dispatcher.start()
        self.telemetry = Telemetry(self.segment, self.gateway_pool, settings.spool_dir)
        self.telemetry.start()
        admission = Admission(settings.admission_capacity, settings.inflight_ceiling, settings.memory_ceiling_bytes)
        self.tracing = Tracing.from_env()
        self.data = DataPlane(self.core, self.dispatcher, self.telemetry, settings, admission, self.metrics,
                              leases=self.leases, tracing=self.tracing, family=self._provider_family,
                              config=self.feed, identities=self.key_sets)
        feed = self.feed
        service = AdminService(self.admin_pool, self.secrets, self.feed.ensure, verifier=self._verify,
                               dry_run=dry_run_hook(self.core, lambda: feed.config,
                                                                    lambda: feed.release.pilot_members))
        self.admin = AdminRouter(self.admin_pool, self.secrets, service)
        self.plane = AdminPlane(self.admin_pool, self.admin, self.secrets.hash_admin_token, self._status,
                                cookie_secure=settings.cookie_secure, segment=self.segment,
                                max_body_bytes=settings.max_admin_body_bytes,
                                notifier=NotificationsAdmin(self.admin_pool, self.secrets.master_key),
                                oidc_settings=settings.oidc)
        self._saturation = Saturation(self.segment)
        self._publish_load()
        self._load_task = background.start("saturation", self._publish_load_loop)
        self._admission = admission
        self._health = msgspec.json.encode({"status": "ok", "pid": os.getpid()}) + b"\n"
        self._jwks = msgspec.json.encode(tokens.jwks(self.secrets.master_key))
        # NOTE: what start-up built (modules, pools, the first snapshot) lives as long as the worker:
        # out of the collector's sight, a full collection walks only what requests left, and no
        # longer stops the loop for tens of milliseconds.
        gc.freeze()
        self._lag_probe = LoopLagProbe(self.metrics.loop_lag)
        self._lag_probe.start()
        log.info("worker %d ready (config seq %d)", os.getpid(), self.core.seq)
        if self._seeded_at is not None:
            clock.add("worker: after the seed", time.monotonic() - self._seeded_at)
        log.info("%s", clock.line(f"worker {os.getpid()} ready"))
        # Made once and off the start's path: the login's stand-in hash and the webhook client.
        self._warm = asyncio.get_running_loop().run_in_executor(None, _warm_up)

    async def _changes_tick(self, conn: asyncpg.Connection) -> None:
        """The lifecycle's chore (on the admin pool: it writes controls as the admin role)."""
        if self.admin is not None:
            await self.admin.service.lifecycle.tick()

    def _provider_family(self, provider_id: str) -> str | None:
        config = self.feed.config if self.feed is not None else None
        if config is None:
            return None
        return next((p.family for p in config.providers if p.id == provider_id), None)

    async def _await_seed(self, clock: StartClock) -> None:
        assert self.segment is not None
        waited = time.monotonic()
        while (state := self.segment.get(counters.seed_state_key())) == counters.SEED_RUNNING:
            await asyncio.sleep(0.005)
        if state == counters.SEED_FAILED:
            raise RuntimeError("the supervisor could not seed the counters from the database")
        waited_s = time.monotonic() - waited
        if waited_s > 0.001:
            # The seed was the longer path: the start's critical path ran through it, so its
            # database read and its apply replace this worker's own phases in the clock.
            clock.phases = [p for p in clock.phases if p[0] in _SUPERVISOR_PHASES]
            clock.add("counter seed: read", self.segment.get(counters.seed_read_ms_key()) / 1000, database=True)
            clock.add("counter seed: apply", self.segment.get(counters.seed_apply_ms_key()) / 1000)
            self._seeded_at = time.monotonic()

    def _publish_load(self) -> None:
        if self._saturation is not None:
            self._saturation.publish(len(self._in_flight), self._body.reading, self._limit or 0)

    async def _publish_load_loop(self) -> None:
        while True:
            await asyncio.sleep(SATURATION_PUBLISH_S)
            self._publish_load()
            if self.segment is not None:
                cluster.fence_if_stale(self.segment)

    async def _verify(self, provider: Any, models: list[Any]) -> list[Any]:
        assert self.dispatcher is not None
        return await verify.verify(self.dispatcher, provider, models)

    async def _checkpoint(self, conn: asyncpg.Connection) -> None:
        if self.feed is not None and self.feed.config is not None:
            await counters.checkpoint(self.segment, conn, self.feed.config, time.time_ns() // 1_000_000, self.core)

    async def _purge(self, conn: asyncpg.Connection) -> None:
        # NOTE: after a checkpoint, so a period's last increments reach the database first.
        await self._checkpoint(conn)
        if self.feed is not None and self.feed.config is not None and self.core is not None:
            removed = await counters.purge_with_core(self.core, self.segment, self.feed.config,
                                                     time.time_ns() // 1_000_000)
            if removed:
                log.info("purged %d counters of past periods", removed)

    async def shutdown(self) -> None:
        if self._sessions and self.settings is not None:
            # NOTE: Granian does not wait for upgraded connections: realtime sessions drain here,
            # until they end or their bound tells them to reconnect (meshfast.realtime).
            deadline = time.monotonic() + self.settings.realtime_drain_s + 5
            while self._sessions and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        was_leader = self.instance_leader is not None and self.instance_leader.is_leader
        if self._load_task is not None:
            self._load_task.cancel()
        if self._lag_probe is not None:
            self._lag_probe.stop()
        if self._saturation is not None:
            self._saturation.publish(0, 0, 0)
        for part in (self.leader, self.instance_leader, self.notifier, self.feed, self.telemetry):
            if part is not None:
                await part.stop()
        if was_leader and self.gateway_pool is not None:
            # The last leader out pushes what the counters gained since the last checkpoint.
            with contextlib.suppress(Exception):
                async with self.gateway_pool.acquire() as conn:
                    await self._checkpoint(conn)
        if self.dispatcher is not None:
            await self.dispatcher.close()
        if self.data is not None and self.data.dlp_model is not None:
            with contextlib.suppress(Exception):
                await self.data.dlp_model.close()
        if self.tracing is not None:
            # The spans still batched go out (bounded by the exporter's own timeout).
            await asyncio.to_thread(self.tracing.shutdown)
        for pool in (self.gateway_pool, self.admin_pool):
            if pool is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pool.close(), timeout=5)

    # --- requests -------------------------------------------------------------------------

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto == "ws":
            await self._websocket(scope, proto)
            return
        if scope.proto != "http":
            return
        path = scope.path
        method = scope.method
        task = asyncio.current_task()
        if task is not None:
            self._in_flight.add(task)
        try:
            # The route table (below the class): an exact row, else the first pattern that matches.
            methods = _EXACT.get(path)
            endpoint = None if methods is None else methods.get(method) or methods.get(ANY)
            model = stream = None
            if endpoint is None:
                for pattern_method, match, candidate in _PATTERNS:
                    if pattern_method == method or pattern_method == ANY:
                        found = match(path)
                        if found is not None:
                            endpoint = candidate
                            model, stream = found
                            break
            if endpoint is not None and endpoint.kind == "data":
                # NOTE: data-plane POSTs check the request limit themselves, after the key (a bad
                # key is always a 401 and costs no slot).
                route = endpoint.route
                if endpoint.query_route is not None and endpoint.query_route[0] in (scope.query_string or ""):
                    route = endpoint.query_route[1]
                await self.data.handle(scope, proto, route, self._body, model, stream,  # type: ignore[union-attr]
                                       busy=self._busy)
            elif (endpoint is None or endpoint.kind != "probe") and self._busy():
                error = errors.ServerBusy(retry_after_s=1)
                proto.response_bytes(error.status, [("content-type", JSON), ("retry-after", "1")], error.body())
            elif endpoint is None:
                self._error(proto, errors.NotFound())
            else:
                await endpoint.handler(self, scope, proto, path, method)
        except asyncio.CancelledError:
            if not self._draining:
                raise
            # Cut at the drain bound (see _cut_in_flight): the row is recorded, the caller's
            # connection closes.
        except Exception:
            log.exception("unhandled error on %s %s", method, path)
            with contextlib.suppress(Exception):
                self._error(proto, errors.MeshfastError())
        finally:
            self._in_flight.discard(task)

    async def _websocket(self, scope: Any, proto: Any) -> None:
        """A WebSocket upgrade: the route table's websocket rows (below the class); a path with
        none is a 404."""
        methods = _WEBSOCKET.get(scope.path)
        endpoint = None if methods is None else methods.get(scope.method) or methods.get(ANY)
        if endpoint is None or self.data is None:
            proto.close(404)
            return
        if self._draining or self._busy():
            # NOTE: a new session goes to another worker or instance.
            proto.close(503)
            return
        await endpoint.handler(self, scope, proto, scope.path, scope.method)

    async def _realtime(self, scope: Any, proto: Any, path: str, method: str) -> None:
        """``GET /v1/realtime`` (meshfast.realtime)."""
        try:
            await realtime.serve(self.data, scope, proto, self._sessions)
        except Exception:
            log.exception("unhandled error in a realtime session")
            with contextlib.suppress(Exception):
                proto.close(500)

    def _busy(self) -> bool:
        """Past the worker's request limit, so the next request gets a quick 503 ``server_busy``
        instead of a wait in the listen backlog. Requests still receiving their bodies do not
        count: a body read is bounded by the body timeouts, and only authenticated callers get one."""
        # NOTE: an open realtime session holds a connection as a call in flight does.
        return (self._limit is not None
                and len(self._in_flight) + len(self._sessions) - self._body.reading > self._limit)

    async def _view(self, view: Any, scope: Any) -> tuple[int, bytes]:
        """A read-only view for the caller's key (``core.models_json``, ``core.usage_json``); a
        401 for a key this worker has not loaded yet waits for it, as the data plane does."""
        h = scope.headers
        sources = (h.get("authorization"), h.get("x-api-key"), h.get("x-goog-api-key"), scope.query_string)
        status, body = view(*sources, time.time_ns() // 1_000_000)
        if status == 401 and mesh_key_shaped(*sources) and await self.data.caught_up():  # type: ignore[union-attr]
            status, body = view(*sources, time.time_ns() // 1_000_000)
        return status, body

    async def _ollama_tags(self, scope: Any, proto: Any, path: str, method: str) -> None:
        rid = request_id()
        if method != "GET":
            error = errors.MethodNotAllowed
            proto.response_bytes(error.status, [("content-type", JSON), ("x-request-id", rid)],
                                 entry_error("ollama", error.status, error.code))
            return
        status, body = await self._view(self.core.models_json, scope)  # type: ignore[union-attr]
        if status == 200:
            body = ollama_tags(body)
        else:
            body = entry_error("ollama", status, errors.InvalidKey.code)
        proto.response_bytes(status, [("content-type", JSON), ("x-request-id", rid)], body)

    async def _data_view(self, scope: Any, proto: Any, path: str, method: str) -> None:
        rid = request_id()
        if method != "GET":
            body = errors.MethodNotAllowed().body()
            proto.response_bytes(405, [("content-type", JSON), ("x-request-id", rid)], body)
            return
        view = self.core.models_json if path == "/v1/models" else self.core.usage_json  # type: ignore[union-attr]
        status, body = await self._view(view, scope)
        proto.response_bytes(status, [("content-type", JSON), ("x-request-id", rid)], body)

    async def _metrics(self, scope: Any, proto: Any, path: str, method: str) -> None:
        """``GET /admin/metrics``: the instance's counters in Prometheus text (admin auth)."""
        assert self.admin is not None and self.metrics is not None
        try:
            if method != "GET":
                raise errors.MethodNotAllowed()
            actor, _ = await self.plane.actor(scope.headers, method)  # type: ignore[union-attr]
            # The instance's counters are platform-wide: the route table refuses a unit's administrator.
            await self.plane.router.scope.check(actor, method, path, {}, b"")  # type: ignore[union-attr]
        except errors.MeshfastError as exc:
            self._error(proto, exc)
            return
        except (TimeoutError, asyncpg.PostgresConnectionError, OSError):
            self._error(proto, errors.DatabaseUnavailable())
            return
        self._publish_load()
        load = self._saturation.instance() if self._saturation is not None else {}
        gauges = {"requests_in_flight": load.get("in_flight", 0), "body_reads_in_flight": load.get("body_reads", 0),
                  "request_limit": load.get("limit", 0), "saturated": int(bool(load.get("saturated")))}
        if self.segment is not None:
            # A full counter table refuses calls (fail closed): MESHFAST_SHM_SLOTS sizes it.
            # NOTE: the occupancy is a scan of every slot (32 MiB by default): off the serving loop.
            stats = await asyncio.to_thread(self.segment.stats)
            gauges |= {"shm_slots": stats["slots"], "shm_slots_used": stats["slots_used"],
                       "shm_leases": stats["leases"], "shm_leases_held": stats["leases_held"]}
        config = self.feed.config if self.feed is not None else None
        models, providers = [], []
        if config is not None:
            models = [(m.id, m.name, config.providers[m.provider].name) for m in config.models]
            providers = [(p.id, p.name) for p in config.providers]
        proto.response_bytes(200, [("content-type", "text/plain; version=0.0.4"), ("cache-control", "no-store")],
                             self.metrics.prometheus(gauges, models, providers))

    async def _admin(self, scope: Any, proto: Any, path: str, method: str) -> None:
        assert self.admin is not None and self.settings is not None
        try:
            # NOTE: the plane authenticates from the headers before it reads the body.
            reply = await self.plane.handle(method, path, scope.query_string, scope.headers,  # type: ignore[union-attr]
                                            client_ip(scope) or "unknown",
                                            lambda limit: self._body(scope, proto, limit),
                                            scheme=getattr(scope, "scheme", "http"))
        except errors.ClientDisconnected:
            return
        except errors.MeshfastError as exc:
            self._error(proto, exc)
            return
        except (TimeoutError, asyncpg.PostgresConnectionError, OSError):
            log.exception("database unavailable for %s %s", method, path)
            self._error(proto, errors.DatabaseUnavailable())
            return
        if isinstance(reply.body, Stream):
            await self._admin_stream(proto, reply.status, reply.body, reply.headers)
            return
        if reply.status == 204:  # no content: no body, no content type
            proto.response_bytes(204, [("cache-control", "no-store"), *_SECURITY_HEADERS, *reply.headers], b"")
            return
        headers = [("content-type", JSON), ("cache-control", "no-store"), *_SECURITY_HEADERS, *reply.headers]
        proto.response_bytes(reply.status, headers, self.admin.encode(reply) + b"\n")

    @staticmethod
    async def _admin_stream(proto: Any, status: int, stream: Stream, extra: tuple[tuple[str, str], ...]) -> None:
        """An admin reply sent as it is made (the CSV export): one chunk in memory at a time."""
        transport = proto.response_stream(status, [("content-type", stream.content_type), ("cache-control", "no-store"),
                                                   *_SECURITY_HEADERS, *extra])
        try:
            async for chunk in stream.chunks:
                await transport.send_bytes(chunk)
        except Exception:
            # The caller left, or the database went away mid-export: the body ends short.
            log.warning("admin stream cut short", exc_info=True)
        finally:
            await stream.chunks.aclose()

    async def _dashboard(self, scope: Any, proto: Any, path: str, method: str) -> None:
        """The dashboard's page and assets (public; its data comes from ``/admin/*``)."""
        try:
            dashboard.serve(proto, path, method, scope.headers)
        except errors.MeshfastError as exc:
            self._error(proto, exc)

    async def _status(self) -> dict[str, Any]:
        """``GET /admin/status``: this worker's view of the instance."""
        assert self.core is not None and self.metrics is not None
        admission = self._admission

        instances: list[dict[str, Any]] | None = None
        if self.gateway_pool is not None:
            try:
                async with asyncio.timeout(2), self.gateway_pool.acquire() as conn:
                    instances = await cluster.list_instances(conn)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                instances = None

        def pool(p: asyncpg.Pool | None) -> dict[str, int] | None:
            if p is None:
                return None
            return {"size": p.get_size(), "idle": p.get_idle_size(), "max": p.get_max_size()}

        return {
            "pid": os.getpid(), "config_seq": self.core.seq, "kill_switch": self.core.kill_switch,
            "draining": self._draining, "in_flight": len(self._in_flight), "request_limit": self._limit,
            "body_reads": self._body.reading,
            "admission": {"capacity": admission.capacity, "in_flight": admission.inflight,
                          "load_factor": round(admission.load_factor(), 3)} if admission is not None else None,
            "metrics": self.metrics.snapshot(),
            "gateway_pool": pool(self.gateway_pool), "admin_pool": pool(self.admin_pool),
            "instance": {"id": self.instance_id, "mode": self.agent.mode if self.agent is not None else None,
                         "lease_grants": self.leases.grants if self.leases is not None else 0},
            "instances": instances,
        }

    async def _openapi_document(self, scope: Any, proto: Any, path: str, method: str) -> None:
        proto.response_bytes(200, [("content-type", JSON), ("cache-control", "no-cache")], self._openapi)

    async def _healthz(self, scope: Any, proto: Any, path: str, method: str) -> None:
        proto.response_bytes(200, [("content-type", JSON)], self._health)

    async def _jwks_document(self, scope: Any, proto: Any, path: str, method: str) -> None:
        """meshfast's own token keys (public; the same on every instance sharing the secrets)."""
        proto.response_bytes(200, [("content-type", JSON), ("cache-control", "public, max-age=300")], self._jwks)

    async def _readyz(self, scope: Any, proto: Any, path: str, method: str) -> None:
        assert self.gateway_pool is not None
        if self._draining:
            # A load balancer stops sending work here while in-flight calls finish.
            proto.response_bytes(503, [("content-type", JSON)], _DRAINING)
            return
        self._publish_load()
        load = self._saturation.instance() if self._saturation is not None else {}
        try:
            async with asyncio.timeout(2):
                async with self.gateway_pool.acquire() as conn:
                    await conn.fetchval(sql.PING)
        except Exception:
            body = {"status": "degraded", "reason": "database_unreachable", "load": load}
            proto.response_bytes(503, [("content-type", JSON)], _json.encode(body) + b"\n")
            return
        # NOTE: saturation is reported, not failed: every worker still answers (a quick 503
        # server_busy past its limit), and a balancer may weigh the numbers.
        body = {"status": "saturated" if load.get("saturated") else "ok", "load": load}
        proto.response_bytes(200, [("content-type", JSON)], _json.encode(body) + b"\n")

    @staticmethod
    def _error(proto: Any, exc: errors.MeshfastError) -> None:
        headers = [("content-type", JSON), *_SECURITY_HEADERS]
        if exc.retry_after_s:
            headers.append(("retry-after", str(exc.retry_after_s)))
        proto.response_bytes(exc.status, headers, exc.body())


# --- the route table --------------------------------------------------------------------------
#
# Every route of the edge, one row each: (method, path) for an exact path, (method, matcher) for a
# path pattern. ANY answers every method (the handler answers 405 itself where it has to). Exact
# rows are looked up first (one dict lookup), then the patterns in order; an exact row for one
# method does not hide a pattern for another (``POST /admin/openapi.json`` is the admin plane's).
# Nothing matched is a 404.
#
# A route's kind decides what happens before its handler, in this order:
#   "data"       a data-plane POST (DataPlane.handle, in the row's wire format): it authenticates
#                and checks the worker's request limit itself, after the key, so a bad key is
#                always a 401 and costs no slot;
#   "edge"       everything else over HTTP, and a path matched by no row: a quick 503 server_busy
#                past the request limit, else the handler;
#   "probe"      answered even past the limit (health checks);
#   "websocket"  a WebSocket upgrade (an exact row; its method is the handshake's GET), reached
#                only over the WebSocket protocol, as an HTTP request is only over HTTP: closed
#                with 503 while the worker drains or past the request limit (a new session goes
#                elsewhere), else the handler. An upgrade matched by no row is closed with 404.

ANY = "*"
RouteKind: TypeAlias = Literal["data", "edge", "probe", "websocket"]
Handler: TypeAlias = Callable[[App, Any, Any, str, str], Awaitable[None]]
# What a path pattern reads from the path, for a data route: (model, stream), as Gemini's path
# names them (DataPlane.handle's arguments); _NO_ARGS elsewhere.
PathArgs: TypeAlias = "tuple[str | None, bool | None]"
_NO_ARGS: PathArgs = (None, None)
# A path pattern: what it reads from a path that matches, else None.
Matcher: TypeAlias = Callable[[str], "PathArgs | None"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one row of the table leads."""

    kind: RouteKind
    # An App method, (app, scope, proto, path, method); unused by a data route.
    handler: Handler
    # A data route's wire format; query_route: (text, format) when a query string holding text
    # switches it (``?model=`` makes /v1/embeddings Mesh's, the model in the body OpenAI's).
    route: Route = "proxy"
    query_route: tuple[str, Route] | None = None


async def _no_handler(app: App, scope: Any, proto: Any, path: str, method: str) -> None:
    raise AssertionError("a data route is answered by the data plane")


def _data(route: Route, query_route: tuple[str, Route] | None = None) -> Endpoint:
    return Endpoint("data", _no_handler, route, query_route)


def _edge(handler: Handler) -> Endpoint:
    return Endpoint("edge", handler)


def _admin_path(path: str) -> PathArgs | None:
    return _NO_ARGS if path.startswith("/admin/") else None


def _dashboard_path(path: str) -> PathArgs | None:
    return _NO_ARGS if path == dashboard.PREFIX or path.startswith(dashboard.PREFIX + "/") else None


_ROUTES: dict[tuple[str, str], Endpoint] = {
    # The data plane: Mesh's routes and the standard entry routes (ENTRY_ROUTES: path -> format).
    ("POST", "/v1/proxy"): _data("proxy"),
    ("POST", "/v1/embeddings"): _data("openai_embeddings", query_route=("model=", "embeddings")),
    ("POST", "/v1/generate"): _data("generate"),
    **{("POST", path): _data(fmt) for path, fmt in ENTRY_ROUTES.items()},
    # Read-only views for a key.
    (ANY, "/api/tags"): _edge(App._ollama_tags),
    (ANY, "/v1/models"): _edge(App._data_view),
    (ANY, "/v1/usage"): _edge(App._data_view),
    # The admin plane's own documents and metrics (the rest of /admin/ is a pattern below).
    (ANY, "/admin/metrics"): _edge(App._metrics),
    ("GET", "/admin/openapi.json"): _edge(App._openapi_document),
    ("GET", "/.well-known/jwks.json"): _edge(App._jwks_document),
    (ANY, "/healthz"): Endpoint("probe", App._healthz),
    (ANY, "/readyz"): Endpoint("probe", App._readyz),
    # Realtime sessions (meshfast.realtime).
    ("GET", "/v1/realtime"): Endpoint("websocket", App._realtime),
}
_PATTERNS: tuple[tuple[str, Matcher, Endpoint], ...] = (
    # models/{model}:generateContent (or :streamGenerateContent) under /v1beta or /v1.
    ("POST", gemini_call, _data("gemini")),
    (ANY, _admin_path, _edge(App._admin)),
    (ANY, _dashboard_path, _edge(App._dashboard)),
)


def _by_path(routes: dict[tuple[str, str], Endpoint], websocket: bool) -> dict[str, dict[str, Endpoint]]:
    """The dispatcher's form of one protocol's exact rows (the WebSocket rows, or the others):
    path -> method -> endpoint."""
    by_path: dict[str, dict[str, Endpoint]] = {}
    for (method, path), endpoint in routes.items():
        if (endpoint.kind == "websocket") == websocket:
            by_path.setdefault(path, {})[method] = endpoint
    return by_path


_EXACT = _by_path(_ROUTES, websocket=False)
_WEBSOCKET = _by_path(_ROUTES, websocket=True)

app = App()
