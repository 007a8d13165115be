"""An exact-count HTTP/1.1 flood: N requests, every answer read and counted by status.

wrk counts what it finished before its clock stopped, so the server may have handled a few more
requests than wrk reports; this counts exactly (each connection pipelines a batch, then reads a
response for every request it sent), so "every denial is in the logs" can be checked to the row.
Requests cycle through a mix of raw request templates; optionally the RSS of given processes is
sampled every second (the soak).

    python bench/flood.py --url http://127.0.0.1:8080/v1/proxy?model=x --requests 1000000 \\
        --header 'authorization: Bearer mesh_live_bad' --body '{"query":"hi"}'
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


def request_bytes(method: str, url: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"host: {parts.netloc}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if body or method not in ("GET", "HEAD"):
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class Result:
    sent: int = 0
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    errors: int = 0
    rss_mb: list[tuple[float, float]] = field(default_factory=list)
    seconds: float = 0.0


async def _responses(reader: asyncio.StreamReader, count: int, statuses: collections.Counter[int]) -> None:
    """Reads `count` responses (content-length or chunked bodies) and counts their statuses."""
    for _ in range(count):
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        statuses[status] += 1
        length, chunked = 0, False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await reader.readexactly(size + 2)
                if size == 0:
                    break
        elif length:
            await reader.readexactly(length)


async def _connection(host: str, port: int, mix: list[bytes], quota: list[int], pipeline: int,
                      result: Result, offset: int) -> None:
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
    i = offset
    try:
        while quota[0] > 0:
            batch = min(pipeline, quota[0])
            quota[0] -= batch
            writer.write(b"".join(mix[(i + k) % len(mix)] for k in range(batch)))
            i += batch
            result.sent += batch
            await writer.drain()
            await _responses(reader, batch, result.statuses)
    except (OSError, asyncio.IncompleteReadError):
        result.errors += 1
    finally:
        writer.close()


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total / (1 << 20)


async def flood(url: str, mix: list[bytes], requests: int, connections: int, pipeline: int,
                rss_pids: list[int] | None = None, deadline_s: float = 3600) -> Result:
    parts = urlsplit(url)
    result = Result()
    quota = [requests]
    started = time.monotonic()

    async def sample() -> None:
        while True:
            result.rss_mb.append((round(time.monotonic() - started, 2), round(_rss_mb(rss_pids or []), 2)))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample()) if rss_pids else None
    try:
        async with asyncio.timeout(deadline_s):
            await asyncio.gather(*(_connection(parts.hostname or "127.0.0.1", parts.port or 80, mix, quota,
                                               pipeline, result, n) for n in range(connections)))
    finally:
        if sampler is not None:
            sampler.cancel()
    result.seconds = time.monotonic() - started
    return result


def leak_rate_mb_per_min(samples: list[tuple[float, float]], skip_s: float = 10.0) -> float | None:
    """Least-squares slope of RSS over time after a warm-up, in MiB per minute."""
    points = [(t, m) for t, m in samples if t >= skip_s]
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mm = sum(m for _, m in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return None
    slope = sum((t - mt) * (m - mm) for t, m in points) / var
    return round(slope * 60, 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--method", default="POST")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--body", default="")
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--pipeline", type=int, default=16)
    p.add_argument("--rss-pid", type=int, action="append", default=[])
    args = p.parse_args(argv)
    headers = [tuple(h.split(":", 1)) for h in args.header]
    mix = [request_bytes(args.method, args.url, [(k.strip(), v.strip()) for k, v in headers], args.body.encode())]
    result = asyncio.run(flood(args.url, mix, args.requests, args.connections, args.pipeline, args.rss_pid))
    out = {"requests": args.requests, "sent": result.sent, "statuses": dict(result.statuses),
           "errors": result.errors, "seconds": round(result.seconds, 2),
           "requests_per_s": round(result.sent / result.seconds, 1) if result.seconds else None,
           "leak_mb_per_min": leak_rate_mb_per_min(result.rss_mb)}
    json.dump(out, sys.stdout)
    print()
    return 0 if result.errors == 0 and sum(result.statuses.values()) == args.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
