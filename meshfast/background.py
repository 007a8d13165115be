"""Background loops that restart after a failure, and the test-only fault injector.

A worker runs a few loops beside the request path: the telemetry drain, the config feed (LISTEN
and rebuild), the leader's maintenance jobs. None of them is on the request path, but a loop that
dies silently would stop rows reaching the database or config reaching the snapshot, so every
loop runs under :func:`supervise`: an exception is logged and the loop starts again after a
backoff.

``MESHFAST_FAULT_INJECT`` (tests only; unset in production) names loops that raise an
:class:`InjectedFault` on their next iterations, e.g. ``telemetry:2,config_rebuild``: the loop
named ``telemetry`` fails twice, ``config_rebuild`` once, in every worker. Names: ``telemetry``,
``config_rebuild``, ``config_listen``, ``leader`` and ``leader_job:<job>`` (``checkpoint``,
``purge``, ``log_partitions``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("meshfast.background")

ENV_FAULT_INJECT = "MESHFAST_FAULT_INJECT"
# A loop that ran this long before failing starts again from the shortest backoff.
_HEALTHY_RUN_S = 60.0
_FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 10.0


class InjectedFault(RuntimeError):
    """Raised by :func:`fault_point` where ``MESHFAST_FAULT_INJECT`` asks for it."""


def _parse_faults(raw: str) -> dict[str, int]:
    faults: dict[str, int] = {}
    for part in raw.split(","):
        name, _, count = part.strip().rpartition(":")
        if not count.isdigit():
            name, count = part.strip(), "1"
        if name:
            faults[name] = int(count)
    return faults


# NOTE: read once at import, per process: the injector is for tests and must cost nothing
# (one dict lookup per loop iteration) when it is off.
_pending_faults = _parse_faults(os.environ.get(ENV_FAULT_INJECT, ""))


def fault_point(name: str) -> None:
    """Raise :class:`InjectedFault` if the fault injector still owes loop ``name`` a failure."""
    if _pending_faults and _pending_faults.get(name, 0) > 0:
        _pending_faults[name] -= 1
        raise InjectedFault(f"injected fault in {name}")


async def supervise(name: str, body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` (a loop that should never return) forever, restarting it after exceptions."""
    failures = 0
    while True:
        started = time.monotonic()
        try:
            await body()
            log.error("background loop %s returned; restarting it", name)
        except asyncio.CancelledError:
            raise
        except Exception:
            if time.monotonic() - started > _HEALTHY_RUN_S:
                failures = 0
            backoff_s = min(MAX_BACKOFF_S, _FIRST_BACKOFF_S * 2**failures)
            failures += 1
            log.exception("background loop %s failed; restarting in %.1f s", name, backoff_s)
            await asyncio.sleep(backoff_s)
            continue
        await asyncio.sleep(_FIRST_BACKOFF_S)


def start(name: str, body: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    """Start ``body`` under :func:`supervise` as a task named ``name``."""
    return asyncio.create_task(supervise(name, body), name=f"meshfast:{name}")
