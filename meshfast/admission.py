"""Admission: the provider's limits first, then process-wide back pressure.

Both are shared-memory primitives in the core (a GCRA token bucket and concurrency slots per
provider; one weighted semaphore for the whole gateway), exact across workers. A call that must
wait polls with backoff and is woken early by a release in its own process; it never blocks the
event loop, and while it waits for its provider it holds no process-wide weight, so a saturated
provider cannot starve calls to another.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import time
from typing import Any

from meshfast import errors

# How long a call may wait for admission before it is refused (Mesh: QUEUE_ADMIT_TIMEOUT_MS).
ADMIT_WAIT_S = 4.0
# Longest single sleep between polls; a release in this process wakes waiters sooner.
POLL_S = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _resume_at(delay_s: float) -> str:
    moment = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=delay_s)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class Admission:
    def __init__(self, capacity: int, inflight_ceiling: int, memory_ceiling_bytes: int) -> None:
        self.capacity = capacity
        self.inflight_ceiling = inflight_ceiling
        self.memory_ceiling_bytes = memory_ceiling_bytes
        self.inflight = 0
        self._released = asyncio.Event()
        self._rss = _rss_bytes()
        self._rss_at = time.monotonic()

    def pressure(self) -> float:
        now = time.monotonic()
        if now - self._rss_at > 1.0:
            self._rss, self._rss_at = _rss_bytes(), now
        return max(self.inflight / self.inflight_ceiling, self._rss / self.memory_ceiling_bytes)

    def load_factor(self) -> int:
        pressure = self.pressure()
        return 4 if pressure >= 0.9 else 2 if pressure >= 0.7 else 1

    async def _pause(self, timeout_s: float) -> None:
        released = self._released
        try:
            await asyncio.wait_for(released.wait(), timeout=max(timeout_s, 0.0005))
        except TimeoutError:
            pass

    async def admit(self, prepared: Any) -> None:
        """Wait (bounded) for the provider, then for process-wide weight; raise when refused."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ADMIT_WAIT_S
        await self._admit_provider(prepared, deadline)
        while not prepared.admit_global(self.capacity, self.load_factor()):
            remaining = deadline - loop.time()
            if remaining <= 0:
                prepared.release_provider()
                raise errors.ServerBusy(retry_after_s=1, resume_at=_resume_at(1.0))
            await self._pause(min(remaining, POLL_S))
        self.inflight += 1

    async def readmit(self, prepared: Any) -> None:
        """After a failover: the call, still holding its process-wide weight, waits (bounded) for
        its new provider's slot and token like any call to that provider; raise when refused."""
        await self._admit_provider(prepared, asyncio.get_running_loop().time() + ADMIT_WAIT_S)

    async def _admit_provider(self, prepared: Any, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # A token within the remaining wait is taken now, in line; then we sleep until its time.
            allowed_ns = max(0, int((deadline - loop.time()) * 1e9))
            admitted, wait_ns = prepared.admit_provider(time.monotonic_ns(), allowed_ns, self.capacity)
            if admitted:
                if wait_ns:
                    await asyncio.sleep(wait_ns / 1e9)
                break
            remaining = deadline - loop.time()
            if remaining <= 0 or wait_ns / 1e9 > remaining + POLL_S:
                delay = max(1.0, wait_ns / 1e9)
                raise errors.ProviderBusy(retry_after_s=math.ceil(delay), resume_at=_resume_at(delay))
            await self._pause(min(wait_ns / 1e9, remaining, POLL_S))

    def release(self, prepared: Any) -> None:
        """The upstream call is over: free its provider slot and weight, wake local waiters."""
        prepared.release_provider()
        self.inflight -= 1
        released, self._released = self._released, asyncio.Event()
        released.set()
