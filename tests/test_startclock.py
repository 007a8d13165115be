"""The start clock: each worker logs how long the start took from the serve process's own start,
split into the database's part and meshfast's, and the counters seeded from the database are in
before a worker serves its first call (the supervisor seeds while the workers load)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from conftest import EmulatedProviders, Gateway

from meshfast.startclock import StartClock

START_LINE = re.compile(r"start: worker (\d+) ready ([\d.]+) s after serve began .*; json (\{.*\})$")


def test_the_process_start_is_the_kernels_record() -> None:
    """A fresh interpreter's first statement runs a little after its process began (the kernel's
    start time, to a clock tick; /proc/stat's whole-second boot time would be up to 1 s off)."""
    import subprocess
    import sys

    code = ("import time; first = time.time()\n"
            "from meshfast.startclock import process_began\n"
            "print(first - process_began())")
    for _ in range(3):
        lag = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   env={**__import__("os").environ, "PYTHONSAFEPATH": "1"}).stdout)
        assert -0.02 <= lag < 0.5, lag  # the clocks tick in hundredths


def test_a_clock_crosses_processes_and_splits_the_database_from_the_rest(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    clock = StartClock(began=time.time() - 2.0)
    clock.add("imports", 0.5)
    clock.add("database start", 1.0, database=True)
    monkeypatch.setenv("MESHFAST_START", clock.to_env())
    handed = StartClock.from_env()
    assert handed.began == clock.began and handed.phases == clock.phases
    report = handed.report("ready")
    assert report["database_s"] == 1.0
    assert abs(report["total_s"] - 2.0) < 0.1 and abs(report["own_s"] - 1.0) < 0.1
    monkeypatch.setenv("MESHFAST_START", "{not json")
    assert StartClock.from_env().phases == []


def _ready_lines(log: Path, since: int) -> list[dict]:
    text = log.read_bytes()[since:].decode(errors="replace")
    return [json.loads(m.group(3)) for line in text.splitlines() if (m := START_LINE.search(line))]


def test_every_worker_logs_its_start_and_the_seed_is_in_before_the_first_call(
        fresh_dir: Path, testserve: EmulatedProviders) -> None:
    gw = Gateway(fresh_dir / "data", workers=2).start()
    try:
        provider = gw.create_provider("start-clock", base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
        model = gw.create_model(provider["id"], "start-clock-m", resolved_model="dummy-chat",
                                input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")
        user = gw.create_user()
        gw.grant(user["id"], model["id"])
        auth = {"authorization": f"Bearer {user['key']}"}
        assert gw.client.post("/v1/proxy", params={"model": model["name"]}, json={"query": "hi"},
                              headers=auth).status_code == 200
        spent = gw.client.get("/v1/usage", headers=auth).json()["usage"][0]["spent_usd"]
        assert spent > 0
        time.sleep(6)  # the leader's checkpoint writes the spend to the database
        gw.stop()
        mark = gw.log_path.stat().st_size
        gw.start()
        # The first call after the restart already sees the spend seeded from the database.
        assert gw.client.get("/v1/usage", headers=auth).json()["usage"][0]["spent_usd"] == spent
        deadline = time.monotonic() + 10
        while len(lines := _ready_lines(gw.log_path, mark)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(lines) == 2, gw.log()
        for report in lines:
            names = [p["name"] for p in report["phases"]]
            assert names[0] == "interpreter and imports" and "migrations" in names
            assert "snapshot: load" in names or "counter seed: apply" in names
            assert 0 < report["total_s"] < 60
            assert abs(report["total_s"] - report["database_s"] - report["own_s"]) < 0.01
            assert report["database_s"] == round(sum(p["s"] for p in report["phases"] if p["database"]), 3) or \
                abs(report["database_s"] - sum(p["s"] for p in report["phases"] if p["database"])) < 0.01
    finally:
        gw.stop()


def test_a_seed_that_does_not_fit_stops_the_server_cleanly(fresh_dir: Path) -> None:
    """More stored counters than MESHFAST_SHM_SLOTS holds: the seed fails while the workers wait
    for it; serve says why, exits non-zero, never serves, and leaves no segment or registration."""
    import asyncio
    import os

    import asyncpg

    from meshfast.settings import Settings

    gw = Gateway(fresh_dir / "data", workers=1).start()
    try:
        provider = gw.create_provider("seed-full", base_url="http://127.0.0.1:9/openai", api_key="k")
        model = gw.create_model(provider["id"], "seed-full-m", resolved_model="x")

        async def fill() -> None:
            conn = await asyncpg.connect(gw.database_url)
            try:
                await conn.execute("""
                    INSERT INTO users (email, display_name) SELECT 'full' || g || '@example.com', 'F'
                    FROM generate_series(1, 5000) g""")
                await conn.execute("""
                    INSERT INTO daily_spend SELECT id, $1::uuid, current_date, 1000 FROM users
                    WHERE email LIKE 'full%'""", model["id"])
            finally:
                await conn.close()

        asyncio.run(fill())
    finally:
        gw.stop()
    small = Gateway(fresh_dir / "data", workers=1, admin_token=gw.admin_token, env={"MESHFAST_SHM_SLOTS": "4096"})
    mark = small.log_path.stat().st_size if small.log_path.exists() else 0
    try:
        small.start(timeout_s=60)
        raise AssertionError("serve started with a seed that cannot fit")
    except RuntimeError as exc:
        assert "exited" in str(exc), exc
    assert small.proc is not None and small.proc.returncode not in (0, None)
    log = small.log_path.read_bytes()[mark:].decode(errors="replace")
    assert "seeding the counters from the database failed" in log, log[-3000:]
    assert START_LINE.search(log) is None, "a worker became ready"
    old = os.environ.get("MESHFAST_DATA_DIR")
    os.environ["MESHFAST_DATA_DIR"] = str(fresh_dir / "data")
    try:
        assert not Settings.from_env().shm_path.exists(), "the segment was left behind"
    finally:
        if old is None:
            os.environ.pop("MESHFAST_DATA_DIR", None)
        else:
            os.environ["MESHFAST_DATA_DIR"] = old

    async def registered() -> int:
        conn = await asyncpg.connect(small.database_url)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM instances"))
        finally:
            await conn.close()

    # The embedded database stopped with serve: start it to look (a normal start, default slots).
    ok = Gateway(fresh_dir / "data", workers=1, admin_token=gw.admin_token).start()
    try:
        assert asyncio.run(registered()) == 1, "only the running instance is registered"
    finally:
        ok.stop()
