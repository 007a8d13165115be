"""Open-loop latency client for streamed HTTP/1.1 answers: time to first byte and to last byte.

One blocking keep-alive socket per target and a fixed arrival schedule (wrk2's model, without wrk2):
request i is due at `t0 + i / rate`. At tens of requests/s a request (~1-2 ms) normally finishes long
before the next is due, so one connection per target suffices; when one does not (a stall), the next
request starts late and the lateness it inherited from its predecessor is added to its latency, so a
stall is charged to every request it delayed (no coordinated omission). Timer oversleep is not
charged: it is the client's, not the server's.

The client is deliberately plain (socket, `perf_counter_ns`, a small chunked-body parser) so that what
it adds is small and the same for every target; `added = target - direct` cancels it. Every sample is
kept: percentiles are exact (nearest rank), and each report also carries HDR histograms of the same
samples (1 us to 60 s, 3 significant digits, in us; HdrHistogram's compressed base64 encoding, which
other HDR tools decode) with their percentiles. The histograms are built from the samples when the
report is made, so the timed loop does no histogram work. `bench/ceiling_bench.py` measures how fast
this client can go on the machine (requests/s, client CPU per request, up to which rate it keeps
the schedule).

    python bench/loadgen.py --url http://127.0.0.1:9000/anthropic/v1/messages \
        --header 'x-api-key: testserve-key' --header 'anthropic-version: 2023-06-01' \
        --body '{"model":"dummy-chat","max_tokens":64,"stream":true,"messages":[...]}' --rate 20 --duration 10
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

try:
    from hdrh.histogram import HdrHistogram
except ImportError as exc:  # pragma: no cover - a setup problem, said plainly
    raise ImportError("bench/loadgen.py needs the hdrhistogram package: pip install -r requirements-lock.txt "
                      "(or pip install '.[bench]')") from exc

RECV_BYTES = 256 * 1024
DEFAULT_TIMEOUT_S = 10.0
# Percentiles reported everywhere; raw samples are kept too, so others can be computed later.
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
# Check the tail of the decoded body for the stream's end marker; a huge stream is ~100 KB.
EXPECT_TAIL_BYTES = 8192
# HDR histograms: values in microseconds, 1 us to 60 s, 3 significant digits (0.1% resolution).
HDR_LOWEST_US = 1
HDR_HIGHEST_US = 60_000_000
HDR_SIGNIFICANT_DIGITS = 3
HDR_CONFIG = {
    "unit": "us", "lowest": HDR_LOWEST_US, "highest": HDR_HIGHEST_US, "significant_digits": HDR_SIGNIFICANT_DIGITS,
    "encoding": "HdrHistogram V2 compressed, base64 (hdrh encode(); HdrHistogram.decode() and other HDR tools read it)",
    "note": "built from the exact samples after the run; values outside [lowest, highest] are clamped to it",
}


class LoadgenError(RuntimeError):
    """A request that did not complete as a 2xx with the expected end of stream."""


@dataclass(frozen=True)
class Target:
    """One endpoint and the exact request bytes sent to it (built once)."""

    name: str
    host: str
    port: int
    request: bytes
    # A byte string the end of the decoded body must contain (the stream's terminator).
    expect: bytes | None = None

    @classmethod
    def post(cls, name: str, url: str, headers: dict[str, str], body: bytes,
             expect: bytes | None = None) -> Target:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {path} HTTP/1.1", f"host: {host}:{port}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
        lines.append(f"content-length: {len(body)}")
        return cls(name, host, port, ("\r\n".join(lines) + "\r\n\r\n").encode() + body, expect)


@dataclass
class Sample:
    status: int
    # Nanoseconds after the request's first byte was sent.
    head_ns: int  # first response byte (status line)
    first_body_ns: int  # first byte of body data (first delta)
    last_ns: int  # end of the body (terminating chunk)
    body_bytes: int


class Conn:
    """One keep-alive connection; exchange() sends one request and reads the whole answer."""

    def __init__(self, host: str, port: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.sock: socket.socket | None = None
        self.reconnects = 0

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        return sock

    def exchange(self, target: Target) -> tuple[int, Sample, bytes]:
        """Returns (send time in perf_counter ns, sample, tail of decoded body)."""
        if self.sock is None:
            self._connect()
        try:
            return self._exchange(target)
        except _StaleConnection:
            # The server closed an idle keep-alive connection before answering: retry once, fresh.
            self.close()
            self.reconnects += 1
            self._connect()
            return self._exchange(target)

    def _exchange(self, target: Target) -> tuple[int, Sample, bytes]:
        sock = self.sock
        assert sock is not None
        clock = time.perf_counter_ns
        t_send = clock()
        try:
            sock.sendall(target.request)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _StaleConnection from exc
        buf = bytearray()
        t_head = 0
        while True:
            try:
                data = sock.recv(RECV_BYTES)
            except ConnectionResetError as exc:
                if not buf:
                    raise _StaleConnection from exc
                raise
            now = clock()
            if not data:
                if not buf:
                    raise _StaleConnection
                self.close()
                raise LoadgenError(f"{target.name}: connection closed inside the response head")
            if not t_head:
                t_head = now
            buf += data
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
        head = bytes(buf[:end]).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        hdrs = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        reader = _BodyReader(sock, buf, end + 4, now, clock)
        if "chunked" in hdrs.get("transfer-encoding", "").lower():
            body, t_first, t_last = reader.chunked()
        else:
            length = int(hdrs.get("content-length", "0"))
            body, t_first, t_last = reader.sized(length)
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        sample = Sample(status, t_head - t_send, (t_first or t_last) - t_send, t_last - t_send,
                        reader.body_bytes)
        return t_send, sample, body


class _StaleConnection(Exception):
    pass


class _BodyReader:
    """Decodes a sized or chunked body from a socket, timing the first data byte and the end."""

    def __init__(self, sock: socket.socket, buf: bytearray, pos: int, last_recv_ns: int, clock) -> None:
        self.sock, self.buf, self.pos, self.last_recv_ns, self.clock = sock, buf, pos, last_recv_ns, clock
        self.tail = bytearray()
        self.body_bytes = 0

    def _more(self) -> None:
        data = self.sock.recv(RECV_BYTES)
        if not data:
            raise LoadgenError("connection closed mid-body")
        self.last_recv_ns = self.clock()
        # Drop what was consumed so a long stream does not grow the buffer.
        del self.buf[:self.pos]
        self.pos = 0
        self.buf += data

    def _take(self, data: bytes | bytearray) -> None:
        self.body_bytes += len(data)
        self.tail += data
        if len(self.tail) > 2 * EXPECT_TAIL_BYTES:
            del self.tail[:-EXPECT_TAIL_BYTES]

    def sized(self, length: int) -> tuple[bytes, int, int]:
        t_first = self.last_recv_ns if len(self.buf) > self.pos and length else 0
        while len(self.buf) - self.pos < length:
            self._more()
            t_first = t_first or self.last_recv_ns
        self._take(self.buf[self.pos:self.pos + length])
        self.pos += length
        return bytes(self.tail), t_first, self.last_recv_ns

    def chunked(self) -> tuple[bytes, int, int]:
        t_first = 0
        while True:
            line_end = self.buf.find(b"\r\n", self.pos)
            while line_end < 0:
                self._more()
                line_end = self.buf.find(b"\r\n", self.pos)
            size = int(bytes(self.buf[self.pos:line_end]).split(b";", 1)[0], 16)
            self.pos = line_end + 2
            if size == 0:
                while self.buf.find(b"\r\n", self.pos) < 0:  # no trailers expected: the final CRLF
                    self._more()
                return bytes(self.tail), t_first, self.last_recv_ns
            if len(self.buf) == self.pos:
                self._more()
            t_first = t_first or self.last_recv_ns
            while len(self.buf) - self.pos < size + 2:
                self._more()
            self._take(self.buf[self.pos:self.pos + size])
            self.pos += size + 2


# ------------------------------------------------------------------------------------ percentiles


def percentile(sorted_values: list[int], p: float) -> int | None:
    """Nearest-rank percentile of exact samples (no histogram buckets, so no bucket error)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize_us(values_ns: list[int]) -> dict:
    """Percentiles, mean, min and max in microseconds (rounded to 0.1 us)."""
    s = sorted(values_ns)
    out: dict = {"n": len(s)}
    if not s:
        return out
    for p in PERCENTILES:
        out[f"p{p:g}".replace(".", "_")] = round(percentile(s, p) / 1000, 1)
    out["min"] = round(s[0] / 1000, 1)
    out["max"] = round(s[-1] / 1000, 1)
    out["mean"] = round(sum(s) / len(s) / 1000, 1)
    return out


def hdr_histogram(values_ns: list[int]) -> HdrHistogram:
    """An HDR histogram (us) of nanosecond samples; each value is clamped into the trackable range."""
    h = HdrHistogram(HDR_LOWEST_US, HDR_HIGHEST_US, HDR_SIGNIFICANT_DIGITS)
    record = h.record_value
    for v in values_ns:
        record(min(HDR_HIGHEST_US, max(HDR_LOWEST_US, round(v / 1000))))
    return h


def hdr_percentiles(h: HdrHistogram) -> dict:
    """The same percentiles as summarize_us, read from the histogram (us; within 0.1% of a bucket)."""
    n = h.get_total_count()
    out: dict = {"n": n}
    if not n:
        return out
    for p in PERCENTILES:
        out[f"p{p:g}".replace(".", "_")] = h.get_value_at_percentile(p)
    out["min"] = h.get_min_value()
    out["max"] = h.get_max_value()
    out["mean"] = round(h.get_mean_value(), 1)
    return out


def hdr_report(series_ns: dict[str, list[int]]) -> dict:
    """{"hdr": {name: base64}, "hdr_percentiles": {name: {...}}, "hdr_config": {...}} for named samples."""
    encoded, pcts = {}, {}
    for name, values in series_ns.items():
        h = hdr_histogram(values)
        encoded[name] = h.encode().decode("ascii")
        pcts[name] = hdr_percentiles(h)
    return {"hdr": encoded, "hdr_percentiles": pcts, "hdr_config": HDR_CONFIG}


# ------------------------------------------------------------------------------------------- runs


@dataclass
class Series:
    """All samples of one target, in nanoseconds; `total` includes inherited backlog."""

    target: str
    total_ns: list[int] = field(default_factory=list)
    service_ns: list[int] = field(default_factory=list)
    head_ns: list[int] = field(default_factory=list)
    first_body_ns: list[int] = field(default_factory=list)
    backlog_ns: list[int] = field(default_factory=list)
    # Scheduled requests only (open loop): when each was due and when it was sent (perf_counter ns).
    due_ns: list[int] = field(default_factory=list)
    sent_ns: list[int] = field(default_factory=list)
    body_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0

    def report(self, raw: bool = True) -> dict:
        out = {
            "target": self.target,
            "requests": len(self.total_ns),
            "statuses": self.statuses,
            "errors": self.errors[:20],
            "error_count": len(self.errors),
            "body_bytes": self.body_bytes,
            "total_us": summarize_us(self.total_ns),
            "service_us": summarize_us(self.service_ns),
            "ttfb_head_us": summarize_us(self.head_ns),
            "ttfb_body_us": summarize_us(self.first_body_ns),
            "backlogged_requests": sum(1 for b in self.backlog_ns if b > 0),
            "reconnects": self.reconnects,
        }
        if self.due_ns:
            # How late each scheduled request left the client (timer oversleep + backlog + client work).
            out["send_late_us"] = summarize_us([s - d for s, d in zip(self.sent_ns, self.due_ns, strict=True)])
        out.update(hdr_report({"total_us": self.total_ns, "service_us": self.service_ns,
                               "ttfb_head_us": self.head_ns, "ttfb_body_us": self.first_body_ns}))
        if raw:
            out["raw_total_us"] = [round(v / 1000, 1) for v in self.total_ns]
            out["raw_ttfb_body_us"] = [round(v / 1000, 1) for v in self.first_body_ns]
        return out


def _one(conn: Conn, target: Target, series: Series, due_ns: int | None, prev_end_ns: int) -> int:
    """One request into `series`; returns its end time (perf_counter ns)."""
    try:
        t_send, sample, tail = conn.exchange(target)
    except (OSError, LoadgenError, ValueError, IndexError) as exc:
        conn.close()
        series.errors.append(f"{type(exc).__name__}: {exc}")
        return time.perf_counter_ns()
    key = str(sample.status)
    series.statuses[key] = series.statuses.get(key, 0) + 1
    if not 200 <= sample.status < 300:
        series.errors.append(f"status {sample.status}: {tail[:200]!r}")
    elif target.expect is not None and target.expect not in tail:
        series.errors.append(f"stream did not end with {target.expect!r}: ...{tail[-200:]!r}")
    # Backlog: how late the previous request made this one (never the timer's own oversleep).
    backlog = max(0, prev_end_ns - due_ns) if due_ns is not None else 0
    series.backlog_ns.append(backlog)
    series.service_ns.append(sample.last_ns)
    series.total_ns.append(sample.last_ns + backlog)
    series.head_ns.append(sample.head_ns)
    series.first_body_ns.append(sample.first_body_ns)
    if due_ns is not None:
        series.due_ns.append(due_ns)
        series.sent_ns.append(t_send)
    series.body_bytes = sample.body_bytes
    return t_send + sample.last_ns


def open_loop(targets: list[Target], rate: float, duration_s: float, slice_s: float = 1.0,
              warmup_requests: int = 10, deadline_s: float | None = None) -> list[Series]:
    """Each target at `rate` requests/s for `duration_s`, in alternating slices of `slice_s`.

    Targets take turns (A for one slice, then B, ...; the order rotates every round), so slow drift in
    background load spreads over all of them. Only one target is loaded at a time: the machine sees
    `rate` requests/s. Each slice starts with one unrecorded request. Stops early (recording it) past
    `deadline_s`.
    """
    conns = {t.name: Conn(t.host, t.port) for t in targets}
    series = {t.name: Series(t.name) for t in targets}
    interval_ns = int(1e9 / rate)
    per_slice = max(1, round(rate * slice_s))
    rounds = max(1, round(duration_s / slice_s))
    hard_stop = time.perf_counter_ns() + int(deadline_s * 1e9) if deadline_s else None
    try:
        for t in targets:  # warm-up: connect, fill pools and caches; kept out of the samples
            scratch = Series(t.name)
            for _ in range(warmup_requests):
                _one(conns[t.name], t, scratch, None, 0)
            if scratch.errors:
                series[t.name].errors += [f"warm-up: {e}" for e in scratch.errors]
        for r in range(rounds):
            order = targets[r % len(targets):] + targets[:r % len(targets)]
            for t in order:
                conn, s = conns[t.name], series[t.name]
                # NOTE: one unrecorded request first: the target sat idle while the others had their
                # slices, which a steady `rate` never allows; its first answer would be a cold outlier.
                primer = Series(t.name)
                _one(conn, t, primer, None, 0)
                s.errors += [f"slice primer: {e}" for e in primer.errors]
                start = time.perf_counter_ns() + interval_ns
                prev_end = 0
                for i in range(per_slice):
                    due = start + i * interval_ns
                    wait = due - time.perf_counter_ns()
                    if wait > 0:
                        time.sleep(wait / 1e9)
                    prev_end = _one(conn, t, s, due, prev_end)
                if hard_stop and time.perf_counter_ns() > hard_stop:
                    for x in series.values():
                        x.errors.append("deadline reached before the schedule finished")
                    return list(series.values())
    finally:
        for c in conns.values():
            c.close()
    for t in targets:
        series[t.name].reconnects = conns[t.name].reconnects
    return list(series.values())


def sequential(targets: list[Target], count: int, warmup_requests: int = 5,
               pause_s: float = 0.02) -> list[Series]:
    """`count` requests per target, one at a time, alternating targets (for time to first byte)."""
    conns = {t.name: Conn(t.host, t.port) for t in targets}
    series = {t.name: Series(t.name) for t in targets}
    try:
        for t in targets:
            scratch = Series(t.name)
            for _ in range(warmup_requests):
                _one(conns[t.name], t, scratch, None, 0)
            series[t.name].errors += [f"warm-up: {e}" for e in scratch.errors]
        for _ in range(count):
            for t in targets:
                _one(conns[t.name], t, series[t.name], None, 0)
                time.sleep(pause_s)
    finally:
        for c in conns.values():
            c.close()
    return list(series.values())


def back_to_back(target: Target, duration_s: float, warmup_requests: int = 10) -> Series:
    """Closed loop with one user: one connection, the next request as soon as the last one ended."""
    conn = Conn(target.host, target.port)
    series = Series(target.name)
    try:
        scratch = Series(target.name)
        for _ in range(warmup_requests):
            _one(conn, target, scratch, None, 0)
        series.errors += [f"warm-up: {e}" for e in scratch.errors]
        stop = time.perf_counter_ns() + int(duration_s * 1e9)
        while time.perf_counter_ns() < stop:
            _one(conn, target, series, None, 0)
    finally:
        conn.close()
    series.reconnects = conn.reconnects
    return series


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--header", action="append", default=[], help="'Name: value' (repeatable)")
    p.add_argument("--body", required=True, help="request body (sent as is)")
    p.add_argument("--expect", help="bytes the end of the body must contain")
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--duration", type=float, default=10.0)
    args = p.parse_args(argv)
    headers = dict(h.split(":", 1) for h in args.header)
    headers = {k.strip(): v.strip() for k, v in headers.items()}
    headers.setdefault("content-type", "application/json")
    target = Target.post("target", args.url, headers, args.body.encode(),
                         args.expect.encode() if args.expect else None)
    (s,) = open_loop([target], args.rate, args.duration, slice_s=args.duration)
    print(json.dumps(s.report(raw=False), indent=2))
    return 1 if s.errors else 0


if __name__ == "__main__":
    sys.exit(main())
