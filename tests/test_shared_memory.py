"""The shared-memory segment across real processes: exact counters, capped reservations,
leases of killed processes reclaimed."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Gateway
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfast._core import Segment, counter_key

CTX = mp.get_context("fork")
P1 = "11111111-1111-1111-1111-111111111111"
M1 = "22222222-2222-2222-2222-222222222222"


@pytest.fixture
def segment_path(tmp_path: Path) -> str:
    return str(tmp_path / "test.seg")


def _increment(path: str, key: bytes, times: int, start: mp.Event) -> None:
    segment = Segment.open(path)
    segment.register()
    start.wait()
    for _ in range(times):
        segment.add(key, 1)


def test_n_processes_times_m_increments_give_the_exact_total(segment_path: str) -> None:
    """4 processes x 20 000 increments on one counter sum to exactly 80 000."""
    segment = Segment.create(segment_path)
    key = counter_key(1, P1, M1, 20_000)
    start = CTX.Event()
    procs = [CTX.Process(target=_increment, args=(segment_path, key, 20_000, start)) for _ in range(4)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert segment.get(key) == 80_000


def _reserve_many(path: str, key: bytes, cap: int, attempts: int, start: mp.Event, out: mp.Queue) -> None:
    segment = Segment.open(path)
    segment.register()
    start.wait()
    held = []
    for i in range(attempts):
        lease = segment.reserve(key, 3 + i % 5, cap)
        if lease is not None:
            held.append(lease)
        if len(held) > 4:
            held.pop(0).settle(1)
    out.put(sum(lease.amount for lease in held))
    # The process exits holding leases; the counter keeps them until reclaimed.


def test_reservations_under_contention_never_exceed_the_cap(segment_path: str) -> None:
    """Four processes racing to reserve against one cap never push the counter past it."""
    segment = Segment.create(segment_path)
    key = counter_key(1, P1, M1, 7)
    cap = 500
    start = CTX.Event()
    out: mp.Queue = CTX.Queue()
    procs = [CTX.Process(target=_reserve_many, args=(segment_path, key, cap, 5_000, start, out)) for _ in range(4)]
    for proc in procs:
        proc.start()
    start.set()
    observed_max = 0
    while any(proc.is_alive() for proc in procs):
        observed_max = max(observed_max, segment.get(key))
        assert observed_max <= cap
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert segment.get(key) <= cap


def _hold_lease_then_sleep(path: str, key: bytes, ready: mp.Event) -> None:
    segment = Segment.open(path)
    segment.register()
    lease = segment.reserve(key, 40, 100)
    assert lease is not None
    ready.set()
    time.sleep(600)


def test_lease_of_a_sigkilled_process_is_reclaimed(segment_path: str) -> None:
    """A process killed with SIGKILL while holding a lease has it freed by reclaim_dead."""
    segment = Segment.create(segment_path)
    segment.register()
    key = counter_key(2, P1, M1, 1)
    mine = segment.reserve(key, 10, 100)
    assert mine is not None
    ready = CTX.Event()
    proc = CTX.Process(target=_hold_lease_then_sleep, args=(segment_path, key, ready))
    proc.start()
    assert ready.wait(30)
    assert segment.get(key) == 50
    assert segment.reclaim_dead() == 0  # the holder is alive: nothing to take back
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert segment.reclaim_dead() >= 1
    assert segment.get(key) == 10  # our own live lease is untouched
    mine.release()
    mine.release()  # idempotent
    assert segment.get(key) == 0


def test_settle_replaces_the_reservation_with_the_actual_amount(segment_path: str) -> None:
    """settle(actual) leaves exactly `actual` on the counter; release leaves nothing."""
    segment = Segment.create(segment_path)
    segment.register()
    key = counter_key(1, P1, M1, 3)
    lease = segment.reserve(key, 70, 100)
    assert lease is not None and segment.get(key) == 70
    assert segment.reserve(key, 31, 100) is None
    lease.settle(25)
    lease.settle(99)  # second settle is a no-op
    assert segment.get(key) == 25


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.booleans()), max_size=60), st.integers(1, 400))
def test_reserve_matches_a_sequential_reference(tmp_path_factory: pytest.TempPathFactory,
                                                ops: list[tuple[int, bool]], cap: int) -> None:
    """Single-process reserve/release agrees with an obvious model of a capped counter."""
    path = str(tmp_path_factory.mktemp("seg") / "p.seg")
    segment = Segment.create(path, slots=1024, leases=256, procs=8)
    segment.register()
    key = counter_key(1, P1, M1, 9)
    model = 0
    leases = []
    for amount, release_one in ops:
        lease = segment.reserve(key, amount, cap)
        assert (lease is not None) == (model + amount <= cap)
        if lease is not None:
            model += amount
            leases.append(lease)
        if release_one and leases:
            released = leases.pop(0)
            released.release()
            model -= released.amount
        assert segment.get(key) == model


def test_open_rejects_a_file_that_is_not_a_segment(tmp_path: Path) -> None:
    """Mapping a foreign file fails with a clear error rather than corrupting it."""
    from meshfast._core import CoreError

    path = tmp_path / "junk.seg"
    path.write_bytes(b"not a segment" * 100)
    with pytest.raises(CoreError):
        Segment.open(str(path))


def test_purge_frees_the_slots_of_past_periods(tmp_path: Path) -> None:
    """Counters of ended periods leave the slot table; today's and this hour's stay."""
    from meshfast import counters
    from meshfast._core import CALLS_HOUR, SPEND_DAY
    from meshfast.snapshot import Config, Grant, Model, Principal, Provider

    segment = Segment.create(str(tmp_path / "purge.seg"), slots=4096)
    config = Config(
        seq=1, kill_switch=False, keys=[],
        principals=[Principal(id=P1, email="a@b.c", display_name="A", status="active", expires_at_ms=None)],
        providers=[Provider(id="33333333-3333-3333-3333-333333333333", name="p", family="openai",
                            max_calls_per_hour=None, supports_web_search=False)],
        models=[Model(id=M1, name="m", provider=0, resolved_model="x", max_output_tokens=10, price_per_second_nano=0,
                      kind="chat", created_ms=0, blocked=False, status="active", supports_image_in=False,
                      supports_document_in=False, supports_audio_in=False, supports_video_in=False,
                      supports_web_search=False, output_media_type=None, input_price_nano_per_1k=0,
                      output_price_nano_per_1k=0)],
        grants=[Grant(principal=0, model=0, daily_cap_nano_usd=0, max_calls_per_hour=None, allowed_from_min=None,
                      allowed_to_min=None, timezone="UTC", active_days=[], always_open=True)],
    )
    now_ms = 1_764_000_000_000
    day, hour = now_ms // 86_400_000, now_ms // 3_600_000
    for back in range(30):
        segment.add(counter_key(CALLS_HOUR, P1, M1, hour - back), 1)
    for back in range(5):
        segment.add(counter_key(SPEND_DAY, P1, M1, day - back), 1)
    assert counters.purge(segment, config, now_ms) == (30 - 2) + (5 - 2)
    assert segment.get(counter_key(CALLS_HOUR, P1, M1, hour)) == 1
    assert segment.get(counter_key(CALLS_HOUR, P1, M1, hour - 1)) == 1
    assert segment.get(counter_key(CALLS_HOUR, P1, M1, hour - 2)) == 0
    assert segment.get(counter_key(SPEND_DAY, P1, M1, day - 1)) == 1
    assert segment.stats()["slots_used"] == 4


def test_the_counter_table_is_sized_by_its_setting_and_its_occupancy_is_a_metric(fresh_dir: Path) -> None:
    """MESHFAST_SHM_SLOTS sizes the shared counter table (a full one refuses calls); /admin/metrics
    shows its size and occupancy; any count in range (not only powers of two), and a value out of
    range is refused at start."""
    gw = Gateway(fresh_dir / "data", workers=1, env={"MESHFAST_SHM_SLOTS": "10000"}).start()
    try:
        text = gw.admin("GET", "/admin/metrics").text
        gauges = dict(line.split() for line in text.splitlines() if line.startswith("meshfast_shm_"))
        assert gauges["meshfast_shm_slots"] == "10000" and int(gauges["meshfast_shm_slots_used"]) >= 1, gauges
        assert int(gauges["meshfast_shm_leases"]) > 0 and "meshfast_shm_leases_held" in gauges
    finally:
        gw.stop()
    env = {**os.environ, "MESHFAST_DATA_DIR": str(fresh_dir / "bad"), "MESHFAST_SHM_SLOTS": "1000"}
    refused = subprocess.run([sys.executable, "-m", "meshfast.cli", "serve"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0 and "MESHFAST_SHM_SLOTS must be a whole number from 4096" in refused.stderr
