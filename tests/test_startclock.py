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
