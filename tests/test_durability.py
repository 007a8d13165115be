"""Nothing lost: database outages, killed workers, failing background loops and SIGTERM, with
real `meshfast serve` processes, a real embedded PostgreSQL (stopped and restarted under
load) and testserve upstreams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway, WorkerConnections

from meshfast import telemetry
from meshfast._core import Segment
from meshfast.settings import Settings
from meshfast.store import database
from meshfast.telemetry import Row, Spool, Telemetry, merge_denials

BAD_KEY = "mesh_live_" + "x" * 43


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _caller(gw: Gateway, ts: EmulatedProviders, name: str = "dur") -> tuple[str, str]:
    """A user granted one testserve-backed chat model; returns (key, model name)."""
    provider = gw.create_provider(f"{name}-p", family="anthropic", base_url=f"{ts.base_url}/anthropic",
                                  api_key="testserve-key")
    model = gw.create_model(provider["id"], f"{name}-model", resolved_model="dummy-chat")
    user = gw.create_user()
    gw.grant(user["id"], model["id"])
    return user["key"], model["name"]


def _query(url: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(url)
        try:
            return [dict(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


def _wait_for(check: Any, timeout_s: float, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def _segment(gw: Gateway) -> Segment:
    import dataclasses

    settings = dataclasses.replace(Settings.from_env(), data_dir=gw.data_dir.resolve())
    return Segment.open(str(settings.shm_path))


# --- the embedded PostgreSQL, stopped and started behind the gateway's back ------------------


def _pg_ctl(args: list[str], pgdata: Path) -> None:
    from pgserver._commands import pg_ctl

    # NOTE: pgserver runs PostgreSQL as its own OS user when started by root.
    user = "pgserver" if os.geteuid() == 0 else None
    pg_ctl(args, pgdata=pgdata, user=user, timeout=60)


def _stop_postgres(pgdata: Path) -> None:
    _pg_ctl(["-w", "-m", "fast", "stop"], pgdata)


def _start_postgres(pgdata: Path) -> None:
    # The same options pgserver starts it with: no TCP, the socket in the data dir.
    _pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {pgdata}", "-l", str(pgdata / "log"), "start"], pgdata)


# --- the spool and merging, in process -------------------------------------------------------


def _row(n: int, outcome: str = "success", **extra: Any) -> Row:
    from meshfast._core import request_id

    return Row(request_id=request_id(), created_ms=1_700_000_000_000 + n, route="proxy", outcome=outcome,
               status_code=200 if outcome == "success" else 401, **extra)


def test_identical_denials_merge_and_everything_else_stays() -> None:
    """merge_denials folds same key/reason/second denials into one count, keeps order and the rest."""
    denial = dict(outcome="denied", deny_reason="invalid_or_revoked_key")
    rows = [_row(0), _row(1, **denial), _row(2, **denial), _row(3), _row(1500, **denial), _row(4, **denial),
            _row(5, outcome="denied", deny_reason="budget_exceeded")]
    encoded = [telemetry._encoder.encode(r) for r in rows]
    merged, folded = merge_denials(encoded)
    decoded = [telemetry._decoder.decode(m) for m in merged]
    assert folded == 2
    assert [r.request_id for r in decoded] == [rows[i].request_id for i in (0, 1, 3, 4, 6)]
    assert [r.count for r in decoded] == [1, 3, 1, 1, 1]
    assert sum(r.count for r in decoded) == len(rows)
    assert merge_denials(encoded[:1]) == (encoded[:1], 0)


def test_spool_reader_stops_at_a_torn_tail(tmp_path: Path) -> None:
    """A write cut short leaves a torn frame at the end: the rows before it are read, the rest skipped."""
    rows = [b"one", b"two", b"three"]
    data = telemetry.frame(rows)
    assert telemetry.read_frames(data) == (rows, 0)
    assert telemetry.read_frames(data[:-2]) == (rows[:2], len(telemetry.frame(rows[2:])) - 2)
    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF
    assert telemetry.read_frames(bytes(corrupt))[0] == rows[:2]


def _exit_at_once() -> None:
    pass


def test_spool_replay_writes_each_row_once(fresh_dir: Path) -> None:
    """Rows already written, spooled again, and a dead worker's torn file: each request id lands once, in order."""
    pg = database.EmbeddedPostgres(fresh_dir / "pg")
    url = pg.start()
    segment = Segment.create(str(fresh_dir / "test.seg"), ring_records=64)
    spool_dir = fresh_dir / "spool"
    rows = [_row(n) for n in range(12)]
    encoded = [telemetry._encoder.encode(r) for r in rows]
    # A worker that died with an open spool file, its last write torn.
    dead = mp.get_context("fork").Process(target=_exit_at_once)
    dead.start()
    dead.join()
    spool_dir.mkdir()
    (spool_dir / f"{time.time_ns():020d}-{dead.pid}.open").write_bytes(
        telemetry.frame(encoded[10:12]) + telemetry.frame([b"torn row"])[:-3])

    async def run() -> None:
        await database.migrate(url)
        pool = await database.create_pool(url, role=database.GATEWAY_ROLE, min_size=0, max_size=2)
        try:
            writer = Telemetry(segment, pool, spool_dir)
            for row in rows[:5]:
                writer.record(row)
            await writer.flush()
            # The first five again (a COPY that committed while its client saw an error), then more.
            writer.spool.append(encoded[:10])
            await writer.flush()
            assert writer.metrics()["replayed"] == 12
        finally:
            await pool.close()

    try:
        asyncio.run(run())
        stored = _query(url, "SELECT request_id, xmin::text::bigint AS tx FROM request_logs")
        assert sorted(r["request_id"] for r in stored) == sorted(r.request_id for r in rows)
        # Oldest first: the orphan's spool before the ring, then the later spool file. Each COPY
        # is one transaction, so xmin orders the writes.
        tx = {r["request_id"]: r["tx"] for r in stored}
        orphan, first, later = ([tx[r.request_id] for r in part] for part in (rows[10:], rows[:5], rows[5:10]))
        assert max(orphan) < min(first) and max(first) < min(later)
        assert not [p.name for p in spool_dir.iterdir()]
    finally:
        pg.stop()


# --- a database outage under load ------------------------------------------------------------


def test_database_outage_fails_no_request_and_loses_no_row(fresh_dir: Path, testserve: EmulatedProviders) -> None:
    """PostgreSQL stopped for 6 s under load and restarted: 0 failed requests, every row once after replay.

    The ring is shrunk to 64 rows, so a burst of bad keys during the outage overflows it: those
    denials are merged per second (count > 1) and every one of them is still counted.
    """
    env = {**SESSION_ENV, "MESHFAST_TELEMETRY_RING_ROWS": "64"}
    gw = Gateway(fresh_dir / "data", workers=2, env=env).start()
    pgdata = gw.data_dir / "pg"
    results: list[tuple[bool, int, str]] = []
    stop = threading.Event()
    try:
        key, model = _caller(gw, testserve)

        def call(client: httpx.Client, good: bool) -> None:
            response = client.post("/v1/proxy", params={"model": model}, json={"query": "hi"},
                                   headers=_bearer(key if good else BAD_KEY))
            results.append((good, response.status_code, response.headers["x-request-id"]))

        def light_load() -> None:
            with httpx.Client(base_url=gw.base_url, timeout=30) as client:
                n = 0
                while not stop.is_set():
                    call(client, n % 3 != 2)
                    n += 1
                    time.sleep(0.03)

        def burst(count: int) -> None:
            with httpx.Client(base_url=gw.base_url, timeout=30) as client:
                for _ in range(count):
                    call(client, False)

        loader = threading.Thread(target=light_load)
        loader.start()
        time.sleep(1.0)
        _stop_postgres(pgdata)
        assert gw.client.get("/readyz").status_code == 503
        time.sleep(1.0)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(burst, [75] * 4))
        time.sleep(4.0)
        _start_postgres(pgdata)
        time.sleep(1.5)
        stop.set()
        loader.join(60)

        failed = [r for r in results if r[1] != (200 if r[0] else 401)]
        assert not failed, failed[:5]
        good = {rid for ok, _, rid in results if ok}
        bad = {rid for ok, _, rid in results if not ok}
        assert len(good) > 50 and len(bad) > 300

        def stored() -> list[dict[str, Any]]:
            return _query(gw.database_url, "SELECT request_id, outcome, count FROM request_logs")

        def complete() -> list[dict[str, Any]] | None:
            rows = stored()
            written = {r["request_id"] for r in rows}
            denials = sum(r["count"] for r in rows if r["outcome"] == "denied")
            return rows if good <= written and denials == len(bad) else None

        # The contract is a replay within 30 s of the database's return.
        rows = _wait_for(complete, 30, 0.5)
        assert rows, (len(good), len(bad), len(stored()), gw.log())
        ids = [r["request_id"] for r in rows]
        assert len(ids) == len(set(ids)), "a request id was written twice"
        assert set(ids) <= good | bad
        assert {r["request_id"] for r in rows if r["outcome"] == "success"} == good
        assert max(r["count"] for r in rows) > 1
        totals = telemetry.metrics(_segment(gw))
        assert totals["spooled"] > 0 and totals["replayed"] > 0 and totals["merged"] > 0, totals
        assert totals["outages"] > 0
        assert not [p for p in (gw.data_dir / "spool").glob("*.spool")]
    finally:
        stop.set()
        gw.stop()
        with contextlib.suppress(Exception):
            if (pgdata / "postmaster.pid").exists():
                _stop_postgres(pgdata)


# --- supervision -----------------------------------------------------------------------------

def _everywhere(pinned: WorkerConnections, key: str) -> bool:
    """Whether every worker accepts ``key``."""
    return all(status == 200 for status, _ in pinned.get_all("/v1/models", _bearer(key)).values())


FAULTS = "telemetry:2,config_rebuild,config_listen,leader,leader_job:checkpoint"


def test_background_loops_restart_after_injected_faults(fresh_dir: Path, testserve: EmulatedProviders) -> None:
    """Every background loop fails on purpose and restarts; traffic, rows, config and checkpoints carry on."""
    env = {**SESSION_ENV, "MESHFAST_FAULT_INJECT": FAULTS}
    gw = Gateway(fresh_dir / "data", workers=2, env=env).start()
    try:
        key, model = _caller(gw, testserve)
        pinned = WorkerConnections(gw)
        # Writes reach every worker within 1 s (API.md), through feeds that were just restarted.
        assert _wait_for(lambda: _everywhere(pinned, key), 2, 0.1)
        rids = []
        with httpx.Client(base_url=gw.base_url, timeout=30) as client:
            for _ in range(6):
                response = client.post("/v1/proxy", params={"model": model}, json={"query": "hi"},
                                       headers=_bearer(key))
                assert response.status_code == 200
                rids.append(response.headers["x-request-id"])
        rows = [gw.fetch_row(rid, timeout_s=15) for rid in rids]
        spent_nano = sum(int((r["input_cost"] + r["output_cost"]) * 1_000_000_000) for r in rows)
        # A new user reaches every worker (the config feed runs), and the leader checkpoints spend.
        late = gw.create_user()
        gw.grant(late["id"], str(rows[0]["model_id"]))
        assert _wait_for(lambda: _everywhere(pinned, late["key"]), 1.0, 0.05)
        pinned.close()
        def db_spend() -> int:
            return _query(gw.database_url, "SELECT coalesce(sum(spend_nano_usd), 0) AS s FROM daily_spend")[0]["s"]

        assert _wait_for(lambda: db_spend() == spent_nano, 20), (db_spend(), spent_nano)
        log = gw.log_path.read_text()
        for name in ("telemetry", "config_rebuild", "config_listen", "leader"):
            assert f"background loop {name} failed; restarting" in log, name
        assert "leader job checkpoint failed" in log
        assert "Traceback" in log and "InjectedFault" in log
    finally:
        gw.stop()


def test_traffic_needs_no_background_loop_and_shutdown_writes_what_waited(fresh_dir: Path,
                                                                           testserve: EmulatedProviders) -> None:
    """Every background loop failing for good: calls are still served, and SIGTERM writes their rows."""
    dead_loops = "telemetry:1000,config_rebuild:1000,config_listen:1000,leader:1000"
    gw = Gateway(fresh_dir / "data", workers=1, env={**SESSION_ENV, "MESHFAST_FAULT_INJECT": dead_loops}).start()
    try:
        key, model = _caller(gw, testserve)
        rids = []
        for _ in range(5):
            response = gw.client.post("/v1/proxy", params={"model": model}, json={"query": "hi"},
                                      headers=_bearer(key))
            assert response.status_code == 200
            rids.append(response.headers["x-request-id"])
        time.sleep(1.5)
        assert not _query(gw.database_url, "SELECT 1 FROM request_logs"), "the drain was supposed to be down"
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(60) == 0
        pg = database.EmbeddedPostgres(gw.data_dir / "pg")
        url = pg.start()
        try:
            stored = _query(url, "SELECT request_id, input_cost + output_cost AS cost FROM request_logs")
            spend = _query(url, "SELECT coalesce(sum(spend_nano_usd), 0) AS s FROM daily_spend")[0]["s"]
        finally:
            pg.stop()
        assert sorted(r["request_id"] for r in stored) == sorted(rids)
        # No leader ever ran: the supervisor's last checkpoint is what wrote the spend.
        assert spend == sum(int(r["cost"] * 1_000_000_000) for r in stored) > 0
    finally:
        gw.stop()


def _dead(pid: int) -> bool:
    """Gone for good: reaped by its parent.

    NOTE: a zombie is not enough. SIGKILL ends a multi-threaded process thread by thread, and its
    main thread can show as a zombie while another still holds the process's SO_REUSEPORT listener:
    a connection the kernel hands that listener meanwhile is reset when it closes. The parent can
    reap the process only once every thread is gone, so by then the listener is closed too.
    """
    return not os.path.exists(f"/proc/{pid}")


def test_killed_worker_loses_no_spend_and_the_other_keeps_serving(fresh_dir: Path,
                                                                   testserve: EmulatedProviders) -> None:
    """kill -9 of a worker: the other serves at once, it is replaced, every row and nano-dollar is kept."""
    gw = Gateway(fresh_dir / "data", workers=2, env=SESSION_ENV).start()
    try:
        key, model = _caller(gw, testserve)
        fresh = httpx.Limits(max_keepalive_connections=0)
        rids: list[str] = []

        def calls(n: int) -> None:
            with httpx.Client(base_url=gw.base_url, timeout=30, limits=fresh) as client:
                for _ in range(n):
                    response = client.post("/v1/proxy", params={"model": model}, json={"query": "hi"},
                                           headers=_bearer(key))
                    assert response.status_code == 200
                    rids.append(response.headers["x-request-id"])

        calls(6)
        before = gw.worker_pids()
        victim = before[0]
        os.kill(victim, signal.SIGKILL)
        # NOTE: SIGKILL lands asynchronously: a victim still alive for a moment may accept the next
        # connection and die with it. Calls begin once it is gone.
        assert _wait_for(lambda: _dead(victim), 5)
        calls(6)  # served by the survivor while the victim is being replaced
        assert _wait_for(lambda: victim not in gw.worker_pids() and len(gw.worker_pids()) == 2, 20)
        assert _wait_for(lambda: gw.client.get("/readyz").status_code == 200, 15)
        calls(4)
        rows = [gw.fetch_row(rid, timeout_s=15) for rid in rids]
        counts = _query(gw.database_url, "SELECT request_id, count(*) AS n FROM request_logs GROUP BY request_id")
        assert {r["request_id"]: r["n"] for r in counts} == {rid: 1 for rid in rids}
        spent_nano = sum(int((r["input_cost"] + r["output_cost"]) * 1_000_000_000) for r in rows)
        assert spent_nano > 0
        usage = gw.client.get("/v1/usage", headers=_bearer(key)).json()["usage"][0]
        assert round(usage["spent_usd"] * 1e9) == spent_nano
        assert _wait_for(lambda: _query(
            gw.database_url, "SELECT coalesce(sum(spend_nano_usd), 0) AS s FROM daily_spend")[0]["s"] == spent_nano, 20)
    finally:
        gw.stop()


SLOW_RECORD = """
import os
import time

if os.environ.get("MESHFAST_TEST_RECORD_DELAY_S"):
    import meshfast.telemetry as _telemetry

    _record = _telemetry.Telemetry.record
    _delay = float(os.environ["MESHFAST_TEST_RECORD_DELAY_S"])

    def _slow_record(self, row):
        time.sleep(_delay)
        _record(self, row)

    _telemetry.Telemetry.record = _slow_record
"""


def test_the_row_enters_the_ring_before_the_caller_has_the_whole_answer(fresh_dir: Path,
                                                                        testserve: EmulatedProviders) -> None:
    """Every answer (a stream, a whole answer, a denial) ends only after its row is in the ring: with
    the push slowed to 300 ms, each call takes that long, and a worker killed the moment its caller
    has the answer loses no row."""
    site = fresh_dir / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_RECORD)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    gw = Gateway(fresh_dir / "data", workers=1,
                 env={**SESSION_ENV, "PYTHONPATH": path, "MESHFAST_TEST_RECORD_DELAY_S": "0.3"}).start()
    try:
        key, model = _caller(gw, testserve)
        calls = {
            "stream": lambda c: c.post("/v1/proxy", params={"model": model}, json={"query": "hi"}, headers=_bearer(key)),
            "whole": lambda c: c.post("/v1/chat/completions", headers=_bearer(key),
                                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            "denied": lambda c: c.post("/v1/chat/completions", headers=_bearer(key),
                                       json={"model": "no-such-model", "messages": []}),
        }
        rids = []
        victim = gw.worker_pids()[0]
        with httpx.Client(base_url=gw.base_url, timeout=30) as client:
            for kind, call in calls.items():
                began = time.monotonic()
                response = call(client)
                took = time.monotonic() - began
                assert response.status_code in (200, 404), (kind, response.text)
                assert took >= 0.3, f"{kind}: the answer ended before its row was recorded ({took:.3f} s)"
                rids.append(response.headers["x-request-id"])
            # A stream's done line too arrives only after the row (a caller may stop reading there).
            began = time.monotonic()
            with client.stream("POST", "/v1/proxy", params={"model": model}, json={"query": "hi"},
                               headers=_bearer(key)) as streamed:
                for line in streamed.iter_lines():
                    if '"done":true' in line.replace(" ", ""):
                        break
                took = time.monotonic() - began
                rids.append(streamed.headers["x-request-id"])
            assert took >= 0.3, f"the done line came before the row was recorded ({took:.3f} s)"
        # The moment the last caller has its answer, the worker dies: no row may be missing.
        os.kill(victim, signal.SIGKILL)
        for rid in rids:
            gw.fetch_row(rid, timeout_s=15)
    finally:
        gw.stop()


# --- graceful drain --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_testserve() -> Iterator[EmulatedProviders]:
    """testserve pausing 300 ms between deltas, so a stream spans a SIGTERM."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="ts-slow-"))
    previous = os.environ.get("TESTSERVE_DELTA_DELAY_MS")
    os.environ["TESTSERVE_DELTA_DELAY_MS"] = "300"
    try:
        server = EmulatedProviders(root).start()
    finally:
        if previous is None:
            os.environ.pop("TESTSERVE_DELTA_DELAY_MS")
        else:
            os.environ["TESTSERVE_DELTA_DELAY_MS"] = previous
    try:
        yield server
    finally:
        server.stop()


def _stream_in_background(gw: Gateway, key: str, model: str, words: int) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {"lines": [], "first": threading.Event()}

    def run() -> None:
        query = " ".join(f"w{i}" for i in range(words))
        try:
            with httpx.stream("POST", f"{gw.base_url}/v1/proxy", params={"model": model}, json={"query": query},
                              headers=_bearer(key), timeout=60) as response:
                out["rid"] = response.headers["x-request-id"]
                for line in response.iter_lines():
                    if line.strip():
                        out["lines"].append(json.loads(line))
                        out["first"].set()
        except httpx.HTTPError as exc:
            out["error"] = repr(exc)
        out["first"].set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _stored_row(pgdata: Path, rid: str) -> dict[str, Any] | None:
    """The row of ``rid``, read after the gateway (and its database) stopped."""
    pg = database.EmbeddedPostgres(pgdata)
    url = pg.start()
    try:
        rows = _query(url, "SELECT * FROM request_logs WHERE request_id = $1", rid)
    finally:
        pg.stop()
    return rows[0] if rows else None


def test_sigterm_lets_a_stream_finish_then_exits_0_with_its_row(fresh_dir: Path,
                                                                 slow_testserve: EmulatedProviders) -> None:
    """SIGTERM mid-stream: the stream completes, `meshfast serve` exits 0 and the row is stored."""
    gw = Gateway(fresh_dir / "data", workers=2, env={**SESSION_ENV, "MESHFAST_DRAIN_TIMEOUT_S": "30"}).start()
    try:
        key, model = _caller(gw, slow_testserve)
        thread, out = _stream_in_background(gw, key, model, words=12)
        assert out["first"].wait(30)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(60) == 0
        thread.join(30)
        assert "error" not in out, out
        done = out["lines"][-1]
        assert done.get("done") is True and not done.get("incomplete")
        assert len([line for line in out["lines"] if "delta" in line]) >= 12
        row = _stored_row(gw.data_dir / "pg", out["rid"])
        assert row is not None and row["outcome"] == "success" and row["tokens_out"] > 0
    finally:
        gw.stop()


def test_drain_is_bounded(fresh_dir: Path, slow_testserve: EmulatedProviders) -> None:
    """A stream longer than MESHFAST_DRAIN_TIMEOUT_S is cut at the bound; the process still exits 0."""
    gw = Gateway(fresh_dir / "data", workers=1, env={**SESSION_ENV, "MESHFAST_DRAIN_TIMEOUT_S": "2"}).start()
    try:
        key, model = _caller(gw, slow_testserve)
        thread, out = _stream_in_background(gw, key, model, words=80)  # about 24 s
        assert out["first"].wait(30)
        assert gw.proc is not None
        started = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(40) == 0
        assert time.monotonic() - started < 15
        thread.join(30)
        delivered = len([line for line in out["lines"] if "delta" in line])
        assert 0 < delivered < 80
        row = _stored_row(gw.data_dir / "pg", out["rid"])
        assert row is not None
        # Cut at the bound: an interrupted stream, charged for what it carried.
        assert (row["outcome"], row["status_code"]) == ("upstream_error", 200)
        assert row["tokens_out"] >= delivered and row["output_cost"] > 0
    finally:
        gw.stop()


def test_spool_files_of_a_previous_run_are_adopted(tmp_path: Path) -> None:
    """Files left open or mid-replay by processes that are gone are queued for replay again."""
    spool = Spool(tmp_path)
    (tmp_path / f"{1:020d}-{os.getpid() + 10_000_000}.open").write_bytes(b"")
    (tmp_path / f"{2:020d}-1.replay-{os.getpid() + 10_000_001}").write_bytes(b"")
    spool.adopt_orphans()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{1:020d}-{os.getpid() + 10_000_000}.spool",
                                                          f"{2:020d}-1.spool"]


# --- limits on input -------------------------------------------------------------------------


def test_a_client_slow_to_send_its_headers_is_cut_and_the_worker_keeps_serving(fresh_dir: Path) -> None:
    """Headers not complete within MESHFAST_HEADER_TIMEOUT_S: the connection is closed, nothing else is hurt."""
    import socket

    gw = Gateway(fresh_dir / "data", workers=1, env={**SESSION_ENV, "MESHFAST_HEADER_TIMEOUT_S": "1"}).start()
    try:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            started = time.monotonic()
            answer = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(4096):
                    answer += chunk
            assert time.monotonic() - started < 5
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408")
        assert gw.client.get("/healthz").status_code == 200
    finally:
        gw.stop()
