"""``meshfast serve``: the supervisor process.

It owns start-up and shutdown: first-run secrets, the embedded PostgreSQL (unless
``DATABASE_URL`` is set), migrations, the bootstrap admin token and the shared-memory segment;
then it runs Granian with N worker processes (respawned when they fail) and, beside it, the
loop that reclaims leases held by dead workers. On exit it stops what it started.

SIGTERM drains: Granian stops accepting and waits for in-flight requests (each worker cuts the
upstream calls still open after ``MESHFAST_DRAIN_TIMEOUT_S``, and Granian kills a worker that
is still there a margin later); then the supervisor writes what the workers left behind (ring
rows, spool files) and checkpoints the counters before it stops the database, so one instance
after another can be rolled without losing a row or a nano-dollar.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from meshfast import app as app_module
from meshfast import cluster, loops, startclock, telemetry
from meshfast._core import CLUSTER_LEASED, Segment
from meshfast.secrets import Secrets, ensure_data_dir, load_or_create, new_admin_token, restrict_data_dir
from meshfast.settings import Settings
from meshfast.startclock import StartClock
from meshfast.store import cluster as cluster_sql
from meshfast.store import database, sql

log = logging.getLogger("meshfast.supervisor")

_RECLAIM_INTERVAL_S = 0.25
# After the drain bound: a worker's own shutdown (last COPY, pools) before Granian kills it.
_WORKER_STOP_MARGIN_S = 15.0
# What the supervisor spends writing the workers' leftovers before it stops the database.
_FINAL_FLUSH_S = 20.0


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str
    port: int
    workers: int
    demo: bool = False
    demo_port: int = 9100
    # Join a cluster: apply no migrations; the database's schema must be this build's.
    join: bool = False


class Database:
    """The database URL to use: ``DATABASE_URL``, or an embedded PostgreSQL in the data dir."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._embedded: database.EmbeddedPostgres | None = None
        self.url = ""

    def __enter__(self) -> Database:
        if self._settings.database_url:
            self.url = self._settings.database_url
        else:
            self._embedded = database.EmbeddedPostgres(self._settings.pgdata)
            self.url = self._embedded.start()
            # NOTE: run as root, pgserver opens every directory above the database to everyone
            # (g+rx,o+rx) so its own user can reach it; the data dir is narrowed back.
            ensure_data_dir(self._settings.data_dir, self._settings.pgdata)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._embedded is not None:
            self._embedded.stop()


async def ensure_admin_token(url: str, secrets: Secrets, configured: str | None) -> str | None:
    """Install the bootstrap admin token; returns a generated one (to print once) or None."""
    async with database.admin_connection(url) as conn:
        async with conn.transaction():
            current = await conn.fetchval(sql.BOOTSTRAP_TOKEN_HASH)
            if configured:
                wanted = secrets.hash_admin_token(configured)
                if current != wanted:
                    await conn.execute(sql.REVOKE_BOOTSTRAP_TOKEN)
                    await conn.execute(sql.INSERT_BOOTSTRAP_TOKEN, wanted, "MESHFAST_ADMIN_TOKEN")
                return None
            if current is not None:
                return None
            token = new_admin_token()
            await conn.execute(sql.INSERT_BOOTSTRAP_TOKEN, secrets.hash_admin_token(token), "generated")
            return token


async def prepare_database(url: str, settings: Settings, secrets: Secrets, join: bool = False) -> str | None:
    known = {m.version for m in database.shipped_migrations()}
    conn = await database.connect(url)
    try:
        await cluster.check_schema(conn, known, join)
    finally:
        await conn.close()
    if not join:
        await database.migrate(url)
    return await ensure_admin_token(url, secrets, settings.admin_token)


class Reclaimer(threading.Thread):
    """Frees the shared-memory leases of workers that died (SIGKILL, OOM, crash)."""

    def __init__(self, segment: Segment) -> None:
        super().__init__(name="meshfast-reclaim", daemon=True)
        self._segment = segment
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(_RECLAIM_INTERVAL_S):
            try:
                reclaimed = self._segment.reclaim_dead()
            except Exception:
                log.exception("lease reclaim failed")
                continue
            if reclaimed:
                log.warning("reclaimed %d leases of dead workers", reclaimed)

    def stop(self) -> None:
        self._halt.set()


def _owner_only_files(settings: Settings) -> None:
    """What this process and its children create is theirs alone (umask 077), and what an
    earlier run left wider is narrowed: the data dir and spool 0700, secrets and spool files 0600."""
    os.umask(0o077)
    restrict_data_dir(settings.data_dir, settings.spool_dir, settings.pgdata)


def serve(options: ServeOptions) -> int:
    clock = StartClock()
    clock.add("interpreter and imports", time.time() - clock.began)
    with clock.phase("settings and secrets"):
        settings = Settings.from_env()
        logging.basicConfig(level=settings.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        _owner_only_files(settings)
        secrets = load_or_create(settings.secrets_path)

    database_start = time.monotonic()
    with Database(settings) as db:
        clock.add("database start", time.monotonic() - database_start, database=True)
        with clock.phase("migrations", database=True):
            generated = asyncio.run(prepare_database(db.url, settings, secrets, options.join))
        if generated:
            # Printed once: only its hash is stored.
            print(f"meshfast: admin token (shown once, store it now): {generated}", flush=True)

        demo: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if options.demo:
            from meshfast import demo as demo_module

            demo = demo_module.Testserve(options.demo_port)
        with demo:
            if options.demo:
                key = asyncio.run(demo_module.seed(db.url, secrets, settings.data_dir, options.demo_port))
                print(
                    f"meshfast: demo providers on testserve :{options.demo_port}; demo key: {key}\n"
                    f"  curl -N 'http://{options.host}:{options.port}/v1/proxy?model=ts-anthropic' "
                    f"-H 'authorization: Bearer {key}' -d '{{\"query\":\"hello\"}}'",
                    flush=True,
                )
            return _run_workers(options, settings, db.url, secrets, clock)
    return 0


async def _check_zone(url: str) -> None:
    from meshfast import snapshot

    conn = await database.connect(url, role=database.GATEWAY_ROLE)
    try:
        # The rules' calendar zone must be one PostgreSQL knows too (digests and summaries use it).
        zone = snapshot.calendar_tz()
        if await conn.fetchval(sql.ZONE_KNOWN, zone) is None:
            raise SystemExit(f"meshfast: MESHFAST_CALENDAR_TZ {zone!r} is not a zone the database knows")
    finally:
        await conn.close()


# The seed's queries may take this long (a million pairs take seconds); a stuck one stops the start.
SEED_STATEMENT_TIMEOUT_MS = 300_000


async def _seed_counters(url: str, segment: Segment, instance_id: str) -> None:
    from meshfast import counters

    started = time.monotonic()
    applied: dict[str, float] = {}
    conn = await database.connect(url, role=database.GATEWAY_ROLE)
    beats = asyncio.create_task(_beat_while_seeding(url, segment, instance_id))
    try:
        await conn.execute(sql.SET_STATEMENT_TIMEOUT, str(SEED_STATEMENT_TIMEOUT_MS))
        loaded = await counters.seed(segment, conn, time.time_ns() // 1_000_000, timing=applied)
    finally:
        beats.cancel()
        await asyncio.gather(beats, return_exceptions=True)
        await conn.close()
    apply_s = applied.get("apply_s", 0.0)
    segment.add(counters.seed_read_ms_key(), round((time.monotonic() - started - apply_s) * 1000))
    segment.add(counters.seed_apply_ms_key(), round(apply_s * 1000))
    if loaded:
        log.info("seeded %d counters from the database", loaded)


async def _beat_while_seeding(url: str, segment: Segment, instance_id: str) -> None:
    """The instance is registered before the seed; until its leader runs (after the seed) this
    beats for it, so a long seed neither fences it nor lets its peers reap it."""
    conn = await database.connect(url, role=database.GATEWAY_ROLE)
    try:
        while True:
            await asyncio.sleep(cluster.HEARTBEAT_S)
            await conn.fetchval(cluster_sql.BEAT, instance_id)
            hb = cluster.heartbeat_key()
            segment.add(hb, time.time_ns() // 1_000_000 - segment.get(hb))
    finally:
        await conn.close()


def _claim_seed_keys(segment: Segment) -> None:
    """The seed's state and timings get their slots before the seed can fill the table, so even
    a seed that fails for want of slots can say so (the workers wait on the state)."""
    from meshfast import counters

    for key in (counters.seed_state_key(), counters.seed_read_ms_key(), counters.seed_apply_ms_key()):
        segment.add(key, 0)


class Seeder(threading.Thread):
    """Seeds the counters while the workers start (they load their snapshots meanwhile and serve
    nothing before the seed is in). Started by Granian's start-up hook, after it handles signals:
    a failure stops the whole server with SIGTERM."""

    def __init__(self, url: str, segment: Segment, instance_id: str) -> None:
        super().__init__(name="meshfast-seed", daemon=True)
        self._url, self._segment, self._instance_id = url, segment, instance_id
        self.error: BaseException | None = None

    def run(self) -> None:
        from meshfast import counters

        state = counters.SEED_FAILED
        try:
            asyncio.run(_seed_counters(self._url, self._segment, self._instance_id))
            state = counters.SEED_DONE
        except BaseException as exc:
            self.error = exc
            log.error("seeding the counters from the database failed, stopping: %s", exc)
        finally:
            self._segment.add(counters.seed_state_key(), state)
            if state != counters.SEED_DONE:
                os.kill(os.getpid(), signal.SIGTERM)

    @property
    def done(self) -> bool:
        from meshfast import counters

        return not self.is_alive() and self._segment.get(counters.seed_state_key()) == counters.SEED_DONE


async def _register(url: str, segment: Segment, secrets: Secrets, instance_id: str, options: ServeOptions) -> str:
    conn = await database.connect(url, role=database.GATEWAY_ROLE)
    try:
        mode = await cluster.register(conn, secrets, instance_id, options.port, options.workers)
    finally:
        await conn.close()
    cluster.set_mode(segment, 0 if mode == "lone" else CLUSTER_LEASED)
    # The first beat is now: workers fence a leased instance whose leader stops beating.
    segment.add(cluster.heartbeat_key(), time.time_ns() // 1_000_000)
    return mode


async def _unregister(url: str, segment: Segment, instance_id: str) -> None:
    conn = await database.connect(url, role=database.GATEWAY_ROLE)
    try:
        await cluster.unregister(conn, segment, instance_id)
    finally:
        await conn.close()


async def _final_flush(url: str, segment: Segment, settings: Settings, secrets: Secrets,
                       checkpoint: bool = True) -> None:
    """Write the stopped workers' leftovers: ring rows and spool files, then the counters (only
    after a whole seed: beside one, or after a failed one, what a counter's value and shadow say
    is not what the database lacks)."""
    from meshfast import counters
    from meshfast.snapshot import load_config

    pool = await database.create_pool(url, role=database.GATEWAY_ROLE, min_size=0, max_size=1)
    try:
        totals = await telemetry.final_flush(segment, pool, settings.spool_dir)
        log.info("request rows: %s", " ".join(f"{name}={value}" for name, value in totals.items()))
        if not checkpoint:
            log.warning("the counters were not seeded whole: not checkpointed on the way out")
            return
        async with pool.acquire() as conn:
            config = await load_config(conn, secrets.master_key)
            moved = await counters.checkpoint(segment, conn, config, time.time_ns() // 1_000_000)
        if moved:
            log.info("checkpointed %d counters on the way out", moved)
    finally:
        await pool.close()


def _rescue_ring(settings: Settings) -> None:
    """Rows a killed run of this data dir left in its segment's ring go to the spool (and from
    there to the database) before a new segment replaces it."""
    try:
        old = Segment.open(str(settings.shm_path))
    except Exception:
        return
    spool = telemetry.Spool(settings.spool_dir)
    rescued = 0
    # NOTE: abandoned: every process of that run is gone, so a record claimed and never
    # published (a writer killed mid-claim) is skipped at once instead of ending the rescue.
    while rows := old.pop_rows(1024, abandoned=True):
        spool.append(rows)
        rescued += len(rows)
    spool.seal()
    if rescued:
        log.warning("a previous run left %d request rows in shared memory; they are queued for the database", rescued)


def _run_workers(options: ServeOptions, settings: Settings, database_url: str, secrets: Secrets,
                 clock: StartClock) -> int:
    from granian import Granian
    from granian.constants import Interfaces, Loops, RuntimeModes, TaskImpl
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    with clock.phase("segment"):
        _rescue_ring(settings)
        segment = Segment.create(str(settings.shm_path), slots=settings.shm_slots,
                                 ring_records=settings.telemetry_ring_rows)
        _claim_seed_keys(segment)
        # No worker runs yet: whatever a previous run left in the spool is queued for replay.
        telemetry.Spool(settings.spool_dir).adopt_orphans(everyone=True)
    reclaimer = Reclaimer(segment)
    gateway_url = settings.gateway_database_url or database_url
    instance_id = cluster.new_instance_id()
    try:
        with clock.phase("register", database=True):
            asyncio.run(_check_zone(database_url))
            mode = asyncio.run(_register(gateway_url, segment, secrets, instance_id, options))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            settings.shm_path.unlink()
        raise
    seeder = Seeder(database_url, segment, instance_id)
    os.environ[cluster.ENV_INSTANCE_ID] = instance_id
    log.info("instance %s registered (%s)", instance_id, mode)
    # Request rows go from the ring to PostgreSQL here, on no worker's event loop.
    drainer = telemetry.Drainer(gateway_url, segment, settings.spool_dir)
    os.environ[app_module.ENV_DATABASE_URL] = database_url
    if settings.gateway_database_url:
        os.environ[app_module.ENV_GATEWAY_DATABASE_URL] = settings.gateway_database_url
    os.environ[app_module.ENV_SHM_PATH] = str(settings.shm_path)
    worker_limit = max(1, math.ceil(settings.max_connections / options.workers))
    os.environ[app_module.ENV_WORKER_LIMIT] = str(worker_limit)
    os.environ[startclock.ENV] = clock.to_env()
    # The workers' uvloop keeps its signal handlers readable (realtime sessions' drain needs Granian's).
    loops.install()
    log.info("%s", clock.line("workers starting"))
    try:
        reclaimer.start()
        drainer.start()
        server = Granian(
            "meshfast.app:app",
            address=options.host,
            port=options.port,
            interface=Interfaces.RSGI,
            workers=options.workers,
            respawn_failed_workers=True,
            respawn_interval=1.0,
            log_level=LogLevels(settings.log_level),
            # NOTE: with realtime sessions open, a worker stops only once they are done (up to
            # MESHFAST_REALTIME_DRAIN_S and a few seconds for their rows); the calls it took
            # meanwhile then get their own drain.
            workers_kill_timeout=math.ceil(settings.realtime_drain_s + 3 + settings.drain_timeout_s
                                           + _WORKER_STOP_MARGIN_S),
            http1_settings=HTTP1Settings(header_read_timeout=max(1, int(settings.header_timeout_s * 1000))),
            # NOTE: Granian admits up to twice the limit, so the excess reaches the worker and gets a
            # quick 503 server_busy instead of waiting unanswered in the listen backlog.
            backpressure=2 * worker_limit,
            # NOTE: the kernel caps this at net.core.somaxconn; 10,000 held connections need both.
            backlog=settings.backlog,
            # MESHFAST_LOOP, MESHFAST_TASK_IMPL, MESHFAST_RUNTIME_MODE; unset: Granian's own defaults.
            loop=Loops(settings.granian_loop),
            task_impl=TaskImpl(settings.granian_task_impl),
            runtime_mode=RuntimeModes(settings.granian_runtime_mode),
        )
        print(
            f"meshfast: serving on http://{options.host}:{options.port} with {options.workers} workers",
            flush=True,
        )
        # NOTE: started once Granian handles signals (its start-up hooks run after that), so the
        # seeder's SIGTERM on failure stops the server rather than killing the process outright.
        server.on_startup(seeder.start)
        server.serve()
        if seeder.error is not None:
            raise SystemExit(f"meshfast: seeding the counters from the database failed: {seeder.error}")
    finally:
        # The final checkpoint reads the counters: after the seed, never beside it.
        if seeder.is_alive():
            seeder.join(timeout=_FINAL_FLUSH_S)
        reclaimer.stop()
        drainer.stop()
        try:
            asyncio.run(asyncio.wait_for(_final_flush(gateway_url, segment, settings, secrets,
                                                      checkpoint=seeder.done), _FINAL_FLUSH_S))
        except Exception:
            log.exception("final flush incomplete; the spool keeps what was not written")
        try:
            asyncio.run(asyncio.wait_for(_unregister(gateway_url, segment, instance_id), 10))
        except Exception:
            log.exception("could not give back this instance's leases; they return when its heartbeat expires")
        with contextlib.suppress(FileNotFoundError):
            settings.shm_path.unlink()
    return 0


def migrate_only() -> int:
    settings = Settings.from_env()
    _owner_only_files(settings)
    secrets = load_or_create(settings.secrets_path)
    with Database(settings) as db:
        applied = asyncio.run(database.migrate(db.url))
        del secrets
    for migration in applied:
        print(f"applied {migration.version:04d}_{migration.name}")
    if not applied:
        print("database is up to date")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(serve(ServeOptions("127.0.0.1", 8080, 1)))
