"""Event-loop lag: how late a worker's loop runs a timer, exported as ``meshfast_loop_lag_seconds``.

A request handler that holds the loop (a long computation, a blocking call, a full garbage
collection) delays every other request of its worker. The probe sees that from inside: a timer
asks to run every ``interval`` and records how late it ran. One timer handle per tick, no task
and no coroutine, and the counts go to shared memory once a second. Cost: on a busy loop a tick
is a few microseconds; an idle loop pays for the wake-up itself, measured at 50-100 us on a
loaded 2-core machine, so the default 20 ms (50 ticks a second) keeps an idle worker under 0.5 %
of a core. Over a minute that is 3,000 samples, enough for the p99.

A sampler, not a tracer: a stall of ``s`` seconds is seen when it covers a tick's due time (with
probability ``s / interval`` for stalls shorter than the interval) and is then recorded as the
part of it left at that moment. Stalls longer than the interval are always seen.

``MESHFAST_LOOP_LAG_PROBE_MS`` sets the interval (``0`` turns the probe off);
``MESHFAST_LOOP_LAG_LOG_MS`` logs every tick later than that many milliseconds, with the CPU time
the loop's thread used since the tick before (close to the wall time: the loop was busy; far
below it: the process waited for a CPU or in a system call) and the garbage collections that ran
meanwhile (a diagnostic: ``gc.callbacks`` timing is added only then).

Lateness is measured on ``time.monotonic()``, not the loop's clock: uvloop (the default loop)
reads its clock once per iteration, in milliseconds, and runs timers at millisecond resolution, so
on uvloop a tick on time can show up to about 1 ms of lag; the buckets under 1 ms are then coarse,
while the stalls the probe is for (milliseconds and up) are measured as before.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from bisect import bisect_left
from typing import Any

log = logging.getLogger("meshfast.looplag")

ENV_INTERVAL_MS = "MESHFAST_LOOP_LAG_PROBE_MS"
ENV_LOG_MS = "MESHFAST_LOOP_LAG_LOG_MS"
DEFAULT_INTERVAL_MS = 20.0
FLUSH_S = 1.0
# Upper bounds in microseconds; one more bucket, +Inf, holds the rest.
LAG_BUCKETS_US = (50, 100, 250, 500, 750, 1_000, 2_000, 3_000, 5_000, 10_000, 15_000, 20_000, 30_000,
                  50_000, 100_000, 250_000, 1_000_000)
_BOUNDS_S = tuple(us / 1e6 for us in LAG_BUCKETS_US)


def _env_ms(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        log.warning("ignoring %s=%r (not a number)", name, raw)
        return default


class LoopLagProbe:
    """Samples this worker's loop lag into ``sink(counts, sum_ns)`` (non-cumulative bucket counts)."""

    def __init__(self, sink: Any, interval_s: float | None = None, log_over_s: float | None = None) -> None:
        self._sink = sink
        self.interval_s = _env_ms(ENV_INTERVAL_MS, DEFAULT_INTERVAL_MS) / 1000 if interval_s is None else interval_s
        log_ms = _env_ms(ENV_LOG_MS, 0.0)
        self._log_over_s = log_over_s if log_over_s is not None else (log_ms / 1000 if log_ms > 0 else None)
        self._counts = [0] * (len(LAG_BUCKETS_US) + 1)
        self._sum_ns = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._flush_at = 0.0
        self._gc: list[tuple[int, float]] = []
        self._gc_started = 0.0
        self._last_tick = 0.0
        self._last_cpu = 0.0

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if not self.enabled or self._handle is not None:
            return
        self._loop = loop or asyncio.get_running_loop()
        if self._log_over_s is not None:
            gc.callbacks.append(self._on_gc)
        now = time.monotonic()
        self._flush_at = now + FLUSH_S
        self._last_tick, self._last_cpu = now, time.thread_time()
        self._schedule(now)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self.flush()

    def flush(self) -> None:
        if any(self._counts):
            counts, self._counts = self._counts, [0] * len(self._counts)
            sum_ns, self._sum_ns = self._sum_ns, 0
            self._sink(counts, sum_ns)

    def _schedule(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self.interval_s
        self._handle = self._loop.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = time.monotonic()
        # NOTE: asyncio runs timers up to its clock resolution early; that is no lag.
        lag_s = max(0.0, now - self._due)
        self._counts[bisect_left(_BOUNDS_S, lag_s)] += 1
        self._sum_ns += int(lag_s * 1e9)
        if self._log_over_s is not None:
            cpu = time.thread_time()
            if lag_s > self._log_over_s:
                pauses = ", ".join(f"gen{g} {ms:.1f} ms" for g, ms in self._gc) or "none"
                log.warning("event loop %.1f ms late (thread CPU %.1f of %.1f ms since the last tick; gc: %s)",
                            lag_s * 1000, (cpu - self._last_cpu) * 1000, (now - self._last_tick) * 1000, pauses)
            self._gc.clear()
            self._last_tick, self._last_cpu = now, cpu
        if now >= self._flush_at:
            self._flush_at = now + FLUSH_S
            self.flush()
        self._schedule(now)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc.append((info["generation"], (time.perf_counter() - self._gc_started) * 1000))
