"""Request bodies under a size limit and two deadlines, and the worker's load as the instance sees it.

A client that sends a request head and then stalls (or trickles its body a byte at a time) must
not hold a worker's request slot for long: every body read has an idle deadline, moved forward by
each chunk that arrives, under a total deadline. Callers read a body only after authenticating
the request from its headers, so a stalled body without valid credentials costs nothing.
"""

from __future__ import annotations

import asyncio
import os
import resource
from typing import Any

from granian.rsgi import ProtocolClosed, ProtocolError

from meshfast import errors
from meshfast._core import GLOBAL_INFLIGHT, counter_key

# A declared body up to this size is taken in one read (the server holds it to the declared length).
ONE_READ_BYTES = 256 * 1024
# A refused request's body is drained only up to this size and for this long; anything else is
# left unread and the answer closes the connection.
DRAIN_BYTES = 64 * 1024
DRAIN_S = 1.0


class BodyReader:
    """Reads a request's body: 413 past ``limit``, 408 when the body pauses for ``idle_s`` or is
    not whole after ``total_s``, :class:`errors.ClientDisconnected` when the caller leaves.

    ``reading`` counts the reads in progress in this worker (they do not count against its
    request limit; the deadlines bound them)."""

    __slots__ = ("idle_s", "total_s", "reading")

    def __init__(self, idle_s: float, total_s: float) -> None:
        self.idle_s = idle_s
        self.total_s = total_s
        self.reading = 0

    async def __call__(self, scope: Any, proto: Any, limit: int) -> bytes:
        declared = scope.headers.get("content-length")
        length = None
        if declared is not None:
            if not declared.isdigit():
                raise errors.InvalidRequest("malformed content-length")
            length = int(declared)
            if length > limit:
                raise errors.PayloadTooLarge()
            if length == 0:
                return b""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.total_s
        self.reading += 1
        try:
            async with asyncio.timeout_at(min(started + self.idle_s, deadline)) as timer:
                if length is not None and length <= ONE_READ_BYTES:
                    body: bytes = await proto()
                else:
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in proto:
                        size += len(chunk)
                        if size > limit:
                            raise errors.PayloadTooLarge()
                        chunks.append(chunk)
                        timer.reschedule(min(loop.time() + self.idle_s, deadline))
                    body = b"".join(chunks)
        except TimeoutError:
            raise errors.RequestTimeout("the request body did not arrive in time") from None
        except (ProtocolClosed, ProtocolError, ConnectionError):
            raise errors.ClientDisconnected() from None
        finally:
            self.reading -= 1
        if length is not None and len(body) != length:
            # The connection closed before the declared length arrived.
            raise errors.ClientDisconnected()
        return body


    async def drain(self, scope: Any, proto: Any) -> bool:
        """Reads and discards a body declared at most ``DRAIN_BYTES`` that arrives within
        ``DRAIN_S`` (a refused request's, so its connection can serve the caller's next,
        possibly pipelined, request); False when the body was left unread (the answer should then
        close the connection). Counted as a body read, not against the request limit."""
        headers = scope.headers
        declared = headers.get("content-length")
        if declared is None:
            return headers.get("transfer-encoding") is None  # no body at all
        if not declared.isdigit() or int(declared) > DRAIN_BYTES:
            return False
        if declared == "0":
            return True
        self.reading += 1
        try:
            async with asyncio.timeout(DRAIN_S):
                body: bytes = await proto()
        except Exception:
            return False
        finally:
            self.reading -= 1
        return len(body) == int(declared)


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (thousands of held
    connections need a descriptor each); returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def _key(series: str, pid: int) -> bytes:
    return counter_key(GLOBAL_INFLIGHT, "meshfast.saturation", f"{series}:{pid}", 0)


_SERIES = ("in_flight", "body_reads", "limit")


class Saturation:
    """Each worker publishes its load (requests in flight, body reads in progress, its request
    limit) into the shared segment, under its pid, about once a second; any worker reads the
    instance's by summing over the live workers (its parent's children)."""

    def __init__(self, segment: Any) -> None:
        self._segment = segment
        self._pid = os.getpid()
        self._published = dict.fromkeys(_SERIES, 0)

    def publish(self, in_flight: int, body_reads: int, limit: int) -> None:
        # NOTE: only this worker writes its keys, so setting by difference is exact.
        for series, value in zip(_SERIES, (in_flight, body_reads, limit), strict=True):
            delta = value - self._published[series]
            if delta:
                self._segment.add(_key(series, self._pid), delta)
                self._published[series] = value

    def instance(self) -> dict[str, Any]:
        """``{in_flight, body_reads, limit, saturated, workers}`` summed over the instance's workers."""
        totals = dict.fromkeys(_SERIES, 0)
        pids = _sibling_pids() or [self._pid]
        for pid in pids:
            for series in _SERIES:
                totals[series] += self._segment.get(_key(series, pid))
        limit = totals["limit"]
        return {**totals, "saturated": bool(limit) and totals["in_flight"] - totals["body_reads"] >= limit,
                "workers": len(pids)}


def _sibling_pids() -> list[int]:
    """The pids of this worker's parent's children (the instance's workers), [] when unknown."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/task/{parent}/children", encoding="ascii") as f:
            return [int(pid) for pid in f.read().split()]
    except (OSError, ValueError):
        return []
