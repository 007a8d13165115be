"""Request rows: recorded before a response ends, written to PostgreSQL in batches with COPY.

A row enters the shared-memory ring before the last byte of its response (or, when the ring is
full, this worker's spool file: a write(2) into the page cache, which a SIGKILL cannot undo).
The death of the worker that served a request therefore loses no completed row.

The ring is drained by :class:`Drainer`, a thread of the supervisor with its own event loop and
connection pool, every ``DRAIN_POLL_S``: decoding rows, building records and encoding the COPY
take 30-50 us a row, and done on a worker's loop (as before) they stopped it for 15-25 ms every
500 rows, the tail of every call behind it. A worker records and returns; it drains on its own
loop only as a fallback, while the drainer's heartbeat in the segment is stale (the supervisor is
gone or stuck), while its rows overflow the ring (the drainer is behind: every worker helps), or
while its own last drain found the database away.

When the database is away or slow, drained rows go to the spool instead: append-only files in
the data dir, fsynced once per drain (batched), replayed oldest first once the database answers
again (probed at most every few seconds). Replays may repeat rows that did reach the table (a
COPY that committed as its connection died); the ingest trigger skips a row whose request id is
already stored (migration 0005), so each request keeps exactly one row.

When a drain finds the ring more than half full, identical denials (same key, deny reason and
second, and the same route, status and model) are merged into one row whose ``count`` says how
many requests it stands for: a flood of bad keys costs the database one row per second instead
of one per request, and no denial goes uncounted.

Totals of rows written, spooled, replayed and merged live in the shared-memory segment (see
:func:`metrics`), so any worker, and a future ``/metrics``, reads the instance's numbers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import functools
import ipaddress
import json
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from meshfast import background, useragent
from meshfast._core import GLOBAL_INFLIGHT, counter_key
from meshfast.store import database, sql
from meshfast.store.telemetry import INGEST_COLUMNS, INGEST_TABLE, INSERT_RULE_EVENTS

log = logging.getLogger("meshfast.telemetry")

BATCH_ROWS = 500
# Rows per COPY when a spool file is replayed.
REPLAY_BATCH_ROWS = 2000
# Pops (each up to half the ring) per drain pass.
FLUSH_ROUNDS = 16
FLUSH_INTERVAL_S = 1.0
# How often the drainer pops the ring (and writes what it found with one COPY).
DRAIN_POLL_S = 0.1
# A drainer heartbeat older than this makes the workers drain on their own loops; above the COPY
# timeout, so one slow COPY does not pull every worker into the drain.
DRAINER_STALE_S = 15.0
# While the database is away, it is probed with backoff up to this interval, so a replay starts
# within seconds of its return (the contract is 30 s).
MAX_PROBE_INTERVAL_S = 5.0
# A COPY that takes longer counts as a database outage: its rows go to the spool.
COPY_TIMEOUT_S = 10.0
# A COPY the database rolled back as a deadlock or serialization victim is retried this often
# before it counts as an outage.
ROLLBACK_RETRIES = 3
# What a stopping worker spends on writing its last rows before it spools them.
STOP_FLUSH_S = 5.0
NANOS = Decimal(1_000_000_000)
METRIC_NAMES = ("written", "spooled", "replayed", "merged", "rejected", "outages")

_CROCKFORD_DIGITS = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_CROCKFORD_CHARS = frozenset(_CROCKFORD_DIGITS)
_CROCKFORD_TO_BASE32 = str.maketrans(_CROCKFORD_DIGITS, "0123456789abcdefghijklmnopqrstuv")


class RuleEvent(msgspec.Struct, array_like=True, omit_defaults=True):
    """What a rule did to the caller in a window instance (the ``rule_events`` outbox's natural key
    and payload): ``action`` notify (``channel`` webhook or email) or pause (``channel`` "")."""

    rule_id: str
    entry: int
    action: str
    channel: str
    window: str
    window_start_ms: int
    threshold_nano: int
    spend_nano: int
    # JSON object text: pause {"resume_at_ms"}; notify {"template", "model", "resume_at_ms"?}.
    detail: str = "{}"


class Row(msgspec.Struct, array_like=True, omit_defaults=True):
    """One request row as it travels through the ring (compact: an array, not a map)."""

    request_id: str
    created_ms: int
    route: str
    outcome: str
    status_code: int
    latency_ms: int = 0
    ttfb_ms: int | None = None
    mesh_key_id: str | None = None
    user_id: str | None = None
    provider_id: str | None = None
    model_id: str | None = None
    model_name: str | None = None
    requested_model: str | None = None
    deny_reason: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    usage_estimated: bool = False
    input_cost_nano: int = 0
    output_cost_nano: int = 0
    web_searches: int = 0
    generated_seconds: float | None = None
    source_ip: str | None = None
    user_agent: str | None = None
    count: int = 1
    # The caller's organisation at call time (chargeback).
    business_unit: str | None = None
    manager_id: str | None = None
    tier: str | None = None
    # A shadow rule that would have refused the call (its id).
    would_deny: str | None = None
    events: list[RuleEvent] = []
    # The tags the model had at call time (a grouping by tag counts the row once per tag).
    tags: list[str] = []
    # The request's trace (32 hex digits) when tracing is on (meshfast.otel).
    trace_id: str | None = None
    # Context signals: the tools the caller declared (each once, with its definition's size in
    # bytes, in the same order) and the tools the model called.
    tools_declared: list[str] = []
    tools_declared_bytes: list[int] = []
    tools_invoked: list[str] = []
    # Of cache_write_tokens, the one-hour writes (priced apart from five-minute ones).
    cache_write_1h_tokens: int = 0
    # Who called: "user" or "application"; a platform token's issuer and subject.
    principal_kind: str | None = None
    token_issuer: str | None = None
    token_subject: str | None = None
    # The caller's attribution tags (X-Meshfast-Tags), validated at the edge.
    call_tags: dict[str, str] | None = None
    # Data protection: matches by detector (never the values) and the strongest action taken.
    dlp: dict[str, int] | None = None
    dlp_action: str | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Row)

# The order of to_record's fields: request_logs_ingest's columns as the COPY names them.
COLUMNS = INGEST_COLUMNS
# The values rule_events' CHECK constraints take; an event outside them is dropped (logged), so it
# never costs its row.
EVENT_ACTIONS = frozenset({"notify", "pause"})
EVENT_CHANNELS = frozenset({"", "webhook", "email"})
EVENT_WINDOWS = frozenset({"daily", "weekly", "monthly"})
_INT4_MAX = 2**31 - 1
_INT8_MAX = 2**63 - 1


def row_uuid(request_id: str) -> uuid.UUID:
    """The row id: the request's ULID read as a (time-ordered) UUID."""
    ulid = request_id[4:]
    if not _CROCKFORD_CHARS.issuperset(ulid):
        raise KeyError(f"not a ULID: {ulid!r}")
    # NOTE: int() in base 32 reads the same digits once they are spelled 0-9a-v (one C call).
    value = int(ulid.translate(_CROCKFORD_TO_BASE32), 32) if ulid else 0
    return uuid.UUID(int=value & ((1 << 128) - 1))


# NOTE: cached: a row's key, user, provider and model ids (and the caller's address) repeat from
# row to row, and parsing them is most of what building a record costs. Both types are immutable.
@functools.lru_cache(maxsize=16384)
def _uuid_of(value: str) -> uuid.UUID:
    return uuid.UUID(value)


def _uuid(value: str | None) -> uuid.UUID | None:
    return None if value is None else _uuid_of(value)


@functools.lru_cache(maxsize=4096)
def _ip(value: str | None) -> Any:
    if not value:
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


# The longest text a row keeps per column. model_name, route and deny_reason are keys of the
# rollups' unique indexes, whose entries PostgreSQL caps near 2.7 kB: a longer name would fail
# the whole COPY (three keys of 200 four-byte characters stay under it).
MAX_KEY_TEXT = 200
MAX_ROW_TEXT = 2048


def safe_text(value: str | None, limit: int = MAX_ROW_TEXT) -> str | None:
    """``value`` as PostgreSQL text can hold it: NUL and lone surrogates become U+FFFD, and it is
    cut to ``limit`` characters. Whatever a caller sends (a model name, a user agent) is
    recorded, never the reason a row is refused."""
    if value is None:
        return None
    if len(value) > limit:
        value = value[:limit]
    if value.isascii():
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    value = value.replace("\x00", "\ufffd")
    try:
        value.encode()
    except UnicodeEncodeError:
        value = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
    return value


def to_record(row: Row) -> tuple[Any, ...]:
    user_agent = safe_text(row.user_agent)
    device = useragent.parse(user_agent)
    return (
        row_uuid(row.request_id), row.request_id, dt.datetime.fromtimestamp(row.created_ms / 1000, dt.UTC),
        _uuid(row.mesh_key_id), _uuid(row.user_id), _uuid(row.provider_id), _uuid(row.model_id),
        safe_text(row.model_name, MAX_KEY_TEXT), safe_text(row.requested_model), safe_text(row.route, MAX_KEY_TEXT),
        row.outcome, safe_text(row.deny_reason, MAX_KEY_TEXT), row.status_code,
        row.latency_ms, row.ttfb_ms, row.tokens_in, row.tokens_out, row.cache_read_tokens,
        row.cache_write_tokens, row.usage_estimated, Decimal(row.input_cost_nano) / NANOS,
        Decimal(row.output_cost_nano) / NANOS, row.web_searches,
        None if row.generated_seconds is None else Decimal(str(round(row.generated_seconds, 2))),
        _ip(row.source_ip), user_agent, safe_text(device.browser), safe_text(device.browser_version),
        safe_text(device.os), safe_text(device.os_version), safe_text(device.device_type), row.count,
        safe_text(row.business_unit), _uuid(row.manager_id), safe_text(row.tier), safe_text(row.would_deny),
        _tags(row.tags) if row.tags else None, safe_text(row.trace_id, MAX_KEY_TEXT),
        *_tools(row), row.cache_write_1h_tokens,
        safe_text(row.principal_kind, MAX_KEY_TEXT), safe_text(row.token_issuer, 512),
        safe_text(row.token_subject, 512), _call_tags(row.call_tags), _dlp(row.dlp),
        safe_text(row.dlp_action, MAX_KEY_TEXT),
    )


def _dlp(value: dict[str, int] | None) -> str | None:
    """Matches by detector as jsonb text (names cut to shape, counts as integers)."""
    if not value:
        return None
    return json.dumps({safe_text(str(k), 64): int(v) for k, v in list(value.items())[:128]}, sort_keys=True,
                      separators=(",", ":"))


def _call_tags(value: dict[str, str] | None) -> str | None:
    """The tags as jsonb text: keys and values are safe already (the edge checked their shape),
    but a row that came any other way (a spool from an older build, a test) is kept, cut to shape."""
    if not value:
        return None
    return json.dumps({safe_text(str(k), 32): safe_text(str(v), 64) for k, v in list(value.items())[:16]},
                      sort_keys=True, separators=(",", ":"))


MAX_TOOLS = 128
_INT4_MAX = 2**31 - 1


def _fit_tools(row: Row, limit: int) -> bytes:
    """``row`` encoded within ``limit`` bytes if dropping its last tool names can do it (the core
    already bounds them; a long user agent or model name can still push a row over): a row that
    fits a ring record never costs its worker a drain of its own."""
    while True:
        data = _encoder.encode(row)
        if len(data) <= limit or not (row.tools_declared or row.tools_invoked):
            return data
        if row.tools_invoked and len(row.tools_invoked) * 2 > len(row.tools_declared):
            row.tools_invoked = row.tools_invoked[: len(row.tools_invoked) // 2]
        else:
            keep = len(row.tools_declared) // 2
            row.tools_declared, row.tools_declared_bytes = row.tools_declared[:keep], row.tools_declared_bytes[:keep]


def _tools(row: Row) -> tuple[list[str] | None, list[int] | None, list[str] | None]:
    """The row's tool columns: distinct names as PostgreSQL text holds them (at most 128 each),
    the declared ones beside their definition sizes (0 where none was given)."""
    declared: dict[str, int] = {}
    for i, name in enumerate(row.tools_declared):
        clean = safe_text(name, MAX_KEY_TEXT)
        if clean and clean not in declared and len(declared) < MAX_TOOLS:
            size = row.tools_declared_bytes[i] if i < len(row.tools_declared_bytes) else 0
            declared[clean] = min(max(int(size), 0), _INT4_MAX)
    invoked = list(dict.fromkeys(t for name in row.tools_invoked if (t := safe_text(name, MAX_KEY_TEXT))))
    if not declared:
        return None, None, invoked[:MAX_TOOLS] or None
    return list(declared), list(declared.values()), invoked[:MAX_TOOLS] or None


def _tags(tags: list[str]) -> list[str]:
    """Each tag once (a grouping by tag counts a row once per tag), as PostgreSQL text holds it."""
    return list(dict.fromkeys(t for tag in tags if (t := safe_text(tag, MAX_KEY_TEXT))))


EventRecord = tuple[str, int, uuid.UUID, str, str, str, dt.datetime, int, int, str]


def event_records(row: Row) -> list[EventRecord]:
    """The outbox rows a request row carries: its ``events``, for the caller (``row.user_id``).

    Events without a caller, or with values the outbox refuses, are dropped (and logged): the
    request row itself must still land.
    """
    if not row.events:
        return []
    if row.user_id is None:
        return []
    user_id = _uuid_of(row.user_id)
    out: list[EventRecord] = []
    for event in row.events:
        if (event.action not in EVENT_ACTIONS or event.channel not in EVENT_CHANNELS
                or event.window not in EVENT_WINDOWS or not 0 <= event.entry <= _INT4_MAX
                or not -_INT8_MAX <= event.threshold_nano <= _INT8_MAX
                or not -_INT8_MAX <= event.spend_nano <= _INT8_MAX or not event.rule_id
                or not _json_object(event.detail)):
            log.error("rule event of request %s dropped: not what the outbox takes (%r)", row.request_id, event)
            continue
        try:
            window_start = dt.datetime.fromtimestamp(event.window_start_ms / 1000, dt.UTC)
        except (OverflowError, OSError, ValueError):
            log.error("rule event of request %s dropped: window_start_ms out of range (%r)", row.request_id, event)
            continue
        out.append((safe_text(event.rule_id, MAX_KEY_TEXT) or "", event.entry, user_id, event.action, event.channel,
                    event.window, window_start, event.threshold_nano, event.spend_nano,
                    event.detail))
    return out


def _event_columns(events: list[EventRecord]) -> list[list[Any]]:
    """The outbox rows as one array per column (one INSERT ... unnest), each natural key once."""
    unique = {(e[0], e[1], e[2], e[6], e[7], e[3], e[4]): e for e in reversed(events)}
    return [list(column) for column in zip(*unique.values(), strict=True)]


def _json_object(text: str) -> bool:
    """Whether ``text`` is a JSON object jsonb takes (it refuses a NUL, the \\u0000 escape JSON
    allows). The text ``\\u0000`` itself, with its backslash (a template may hold it: its JSON
    has ``\\\\u0000``), is fine: only the decoded value tells the two apart."""
    try:
        value = msgspec.json.decode(text.encode())
    except (msgspec.DecodeError, RecursionError, UnicodeEncodeError):
        return False
    return isinstance(value, dict) and not ("\\u0000" in text and _holds_nul(value))


def _holds_nul(value: Any) -> bool:
    """Whether a decoded JSON value holds a NUL in any string or key."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


# --- metrics ---------------------------------------------------------------------------------


def _metric_key(name: str) -> bytes:
    # NOTE: the core only takes its own counter kinds; GLOBAL_INFLIGHT is the process-wide one,
    # and the non-zero ids keep these keys apart from the in-flight weight's (all zeros).
    return counter_key(GLOBAL_INFLIGHT, "meshfast.telemetry", name, 0)


_METRIC_KEYS = {name: _metric_key(name) for name in METRIC_NAMES}


def metrics(segment: Any) -> dict[str, int]:
    """Instance-wide row totals since the segment was created: ``written`` (rows COPYed),
    ``spooled`` (rows put on disk), ``replayed`` (rows read back from the spool), ``merged``
    (denial rows folded into another row's ``count``), ``rejected`` (rows the database refused,
    kept in ``rejected-*.rows`` files), ``outages`` (drains that found the database away)."""
    return {name: segment.get(key) for name, key in _METRIC_KEYS.items()}


# The drainer's last sign of life, in Unix ms (one writer: the supervisor's drainer).
_BEAT_KEY = _metric_key("drainer_beat_ms")


def _beat(segment: Any) -> None:
    now_ms = time.time_ns() // 1_000_000
    segment.add(_BEAT_KEY, now_ms - segment.get(_BEAT_KEY))


def drainer_alive(segment: Any) -> bool:
    """Whether a drainer wrote its heartbeat within ``DRAINER_STALE_S``."""
    return time.time_ns() // 1_000_000 - segment.get(_BEAT_KEY) < DRAINER_STALE_S * 1000


# --- merging ---------------------------------------------------------------------------------


def merge_denials(rows: list[bytes]) -> tuple[list[bytes], int]:
    """Fold identical denials (same key, reason and second) into the first one's ``count``.

    Returns the rows in their original order (a merged row where its first member was) and how
    many rows were folded away. Everything but latency, client address and user agent must
    match, so a merged row says nothing its members did not.
    """
    out: list[bytes | Row] = []
    first: dict[tuple[Any, ...], int] = {}
    folded = 0
    for data in rows:
        try:
            row = _decoder.decode(data)
        except msgspec.DecodeError:
            out.append(data)
            continue
        # NOTE: a row carrying rule events stays whole: folding it would drop its events.
        if row.outcome != "denied" or row.events:
            out.append(data)
            continue
        key = (row.mesh_key_id, row.deny_reason, row.created_ms // 1000, row.route, row.status_code,
               row.user_id, row.model_id, row.model_name, row.requested_model, row.provider_id,
               row.business_unit, row.manager_id, row.tier, row.would_deny, tuple(row.tags))
        index = first.get(key)
        if index is None:
            first[key] = len(out)
            out.append(row)
            continue
        head = out[index]
        assert isinstance(head, Row)
        head.count += row.count
        folded += 1
    if not folded:
        return rows, 0
    return [item if isinstance(item, bytes) else _encoder.encode(item) for item in out], folded


# --- the spool -------------------------------------------------------------------------------

# Each row on disk: length and CRC-32 (little endian), then the row's msgpack bytes.
_FRAME = struct.Struct("<II")


def frame(rows: list[bytes]) -> bytes:
    return b"".join(_FRAME.pack(len(row), zlib.crc32(row)) + row for row in rows)


def read_frames(data: bytes) -> tuple[list[bytes], int]:
    """The rows of a spool file, and how many trailing bytes were torn (a write cut short)."""
    rows: list[bytes] = []
    pos = 0
    while pos + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if end > len(data) or zlib.crc32(data[pos + _FRAME.size:end]) != crc:
            break
        rows.append(data[pos + _FRAME.size:end])
        pos = end
    return rows, len(data) - pos


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(path: Path) -> int | None:
    """The pid that holds a spool file: the replayer of ``.replay-<pid>``, else the writer."""
    if path.suffix.startswith(".replay-"):
        pid = path.suffix[len(".replay-"):]
    else:
        pid = path.name.split(".", 1)[0].partition("-")[2]
    return int(pid) if pid.isdigit() else None


def _owner_only(path: str, flags: int) -> int:
    """An ``open`` opener: the file is created 0600, and one left wider is narrowed."""
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


class Spool:
    """Append-only spool files in one directory, shared by the workers of an instance.

    A worker appends to its own ``<ns>-<pid>.open``; sealing it (fsync, rename to ``.spool``)
    hands it to the replay. A replaying worker claims the oldest sealed file by renaming it to
    ``.replay-<pid>``, so each file has one reader, and deletes it once every row is written.
    Files of dead processes (``.open`` or ``.replay-*``) are adopted back into the queue. Names
    start with a zero-padded nanosecond timestamp, so sorting them is replay order.
    """

    MAX_FILE_BYTES = 8 * 1024 * 1024

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._unsynced = False
        # A file created since the last sync: its directory entry must reach the disk too.
        self._new_entry = False

    def append(self, rows: list[bytes]) -> None:
        """Append rows to this process's open file (no fsync: :meth:`sync` batches that)."""
        if not rows:
            return
        if self._fd is None:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._path = self.directory / f"{time.time_ns():020d}-{os.getpid()}.open"
            self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            self._size = 0
            self._new_entry = True
        view = memoryview(frame(rows))
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
            self._size += written
        self._unsynced = True
        if self._size >= self.MAX_FILE_BYTES:
            self.seal()

    @property
    def is_open(self) -> bool:
        """Whether this process holds an unsealed spool file (rows the replay cannot see yet)."""
        return self._fd is not None

    def sync(self) -> None:
        """fsync what was appended since the last call (the drain calls this once per pass)."""
        if self._unsynced and self._fd is not None:
            os.fsync(self._fd)
            self._unsynced = False
        if self._new_entry:
            self._sync_directory()

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._new_entry = False

    def seal(self) -> None:
        """Hand this process's open file (if any) over to the replay."""
        if self._fd is None or self._path is None:
            return
        fd, path = self._fd, self._path
        self._fd = self._path = None
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._unsynced = False
        path.rename(path.with_suffix(".spool"))
        self._sync_directory()

    def adopt_orphans(self, everyone: bool = False) -> None:
        """Queue the files of processes that died (or of every process but this one)."""
        if not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            if path.suffix == ".spool" or path == self._path:
                continue
            if path.suffix != ".open" and not path.suffix.startswith(".replay-"):
                continue
            owner = _owner(path)
            # NOTE: a file named with this pid that is not the open one was left by an earlier
            # process that had the same pid (claims never outlive a replay pass).
            if not everyone and owner is not None and owner != os.getpid() and _pid_alive(owner):
                continue
            with contextlib.suppress(FileNotFoundError):
                path.rename(path.with_suffix(".spool"))
                log.warning("adopted spool file %s of stopped process %s", path.name, owner)

    def claim_oldest(self) -> Path | None:
        if not self.directory.is_dir():
            return None
        for path in sorted(self.directory.glob("*.spool")):
            claimed = path.with_suffix(f".replay-{os.getpid()}")
            try:
                path.rename(claimed)
            except FileNotFoundError:
                continue  # another worker claimed it first
            return claimed
        return None

    @staticmethod
    def release(claimed: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            claimed.rename(claimed.with_suffix(".spool"))

    def close(self) -> None:
        self.seal()


# --- the writer ------------------------------------------------------------------------------


def _unavailable(exc: BaseException) -> bool:
    """Whether a failed COPY means the database is away (spool and retry) rather than a bad row."""
    return not isinstance(exc, asyncpg.DataError | asyncpg.IntegrityConstraintViolationError)


class Telemetry:
    """One process's side of the row pipeline: record() on the request path, and a loop in a task.

    In a worker (``start()``) the loop only watches: it drains here while the drainer is gone or
    behind (see the module's docstring). In the drainer (``start(drain=True)``) it drains the ring
    every ``DRAIN_POLL_S`` and replays the spool every ``FLUSH_INTERVAL_S``.
    """

    def __init__(self, segment: Any, pool: asyncpg.Pool, spool_dir: Path) -> None:
        self._segment = segment
        self._pool = pool
        self.spool = Spool(spool_dir)
        # Last resort when the spool cannot be written either (disk full): memory.
        self._local: collections.deque[bytes] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        stats = segment.stats()
        self._half_ring = stats["ring_records"] // 2
        # The longest row a ring record holds (its 32-byte header aside).
        self._row_bytes = stats["record_bytes"] - 32
        # NOTE: one pop takes more than half the ring, so "more than half was waiting" needs no
        # extra call into shared memory: it is what the pop returned.
        self._pop_max = self._half_ring + 1
        self._wake_every = max(1, min(BATCH_ROWS, self._half_ring // 2))
        self._pushed = 0
        self._db_down = False
        self._probe_s = FLUSH_INTERVAL_S
        self._next_probe = 0.0
        self._overflowed = False
        self._spool_failed = False
        self._next_replay = 0.0
        # The drainer's loop writes the heartbeat the workers watch.
        self._beats = False

    def _bump(self, name: str, n: int) -> None:
        if n:
            self._segment.add(_METRIC_KEYS[name], n)

    def metrics(self) -> dict[str, int]:
        return metrics(self._segment)

    def record(self, row: Row) -> None:
        """Hand one row over; never blocks and never waits on the database."""
        data = _encoder.encode(row)
        if len(data) > self._row_bytes and (row.tools_declared or row.tools_invoked):
            data = _fit_tools(row, self._row_bytes)
        if self._segment.push_row(data):
            self._pushed += 1
            # NOTE: while the database is away the drain keeps its interval: disk is not the
            # bottleneck, and a ring found past half full has its denials merged.
            if self._pushed >= self._wake_every and not self._db_down:
                self._pushed = 0
                self._wake.set()
            return
        # The ring is full (or the row does not fit a record): straight to this worker's spool.
        self._overflowed = True
        self._wake.set()
        try:
            self.spool.append([data])
        except OSError as exc:
            if not self._spool_failed:
                self._spool_failed = True
                log.error("cannot write the telemetry spool (%s); keeping rows in memory", exc)
            self._local.append(data)
            return
        self._bump("spooled", 1)

    def start(self, drain: bool = False) -> None:
        """Start this process's loop: the drainer's (``drain``) or a worker's."""
        self._beats = drain
        self._task = background.start("telemetry", self._drain_loop if drain else self._worker_loop)

    async def stop(self) -> None:
        """Write what is waiting (or spool it), then seal this process's spool file.

        A worker beside a live drainer leaves the ring to it and spools only what it kept in memory.
        """
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._beats or not drainer_alive(self._segment):
            if not self._db_down:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(STOP_FLUSH_S):
                        await self._flush_ring()
            self.spool_pending()
        elif self._local:
            with contextlib.suppress(OSError):
                self.spool.append(list(self._local))
                self._bump("spooled", len(self._local))
                self._local.clear()
        with contextlib.suppress(OSError):
            self.spool.seal()

    async def _drain_loop(self) -> None:
        while True:
            background.fault_point("telemetry")
            _beat(self._segment)
            await asyncio.sleep(DRAIN_POLL_S)
            await self.drain_once(replay=time.monotonic() >= self._next_replay)

    async def _worker_loop(self) -> None:
        while True:
            background.fault_point("telemetry")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=FLUSH_INTERVAL_S)
            self._wake.clear()
            # NOTE: rows that overflowed the ring (or wait in memory) are this worker's to hand
            # over: a drain here also seals its spool file for the replay (an open one may have
            # taken rows while the last drain ran).
            if (self._overflowed or self._local or self.spool.is_open or self._db_down
                    or not drainer_alive(self._segment)):
                await self.drain_once()

    async def drain_once(self, replay: bool = True) -> None:
        """One pass: replay the spool (``replay``) and write the ring, or spool the ring while the
        database is away."""
        try:
            if self._db_down:
                # The ring drains to disk every pass; the database is probed on its backoff.
                self.spool_pending()
                if time.monotonic() < self._next_probe:
                    return
                if not await self._database_answers():
                    self._probe_s = min(self._probe_s * 2, MAX_PROBE_INTERVAL_S)
                    self._next_probe = time.monotonic() + self._probe_s
                    return
                self._db_down = False
                self._probe_s = FLUSH_INTERVAL_S
                log.warning("database answers again; replaying the telemetry spool")
                replay = True
            try:
                if replay:
                    self._next_replay = time.monotonic() + FLUSH_INTERVAL_S
                    await self._replay_spool()
                await self._flush_ring()
            except Exception as exc:
                if not _unavailable(exc):
                    raise
                self._db_down = True
                self._next_probe = time.monotonic() + self._probe_s
                self._bump("outages", 1)
                log.warning("request rows go to the spool in %s: database unavailable (%s: %s)",
                            self.spool.directory, type(exc).__name__, exc)
                self.spool_pending()
        finally:
            self.spool.sync()

    async def _database_answers(self) -> bool:
        try:
            async with asyncio.timeout(2):
                async with self._pool.acquire() as conn:
                    await conn.fetchval(sql.PING)
        except Exception:
            return False
        return True

    def _take(self) -> tuple[list[bytes], bool]:
        """Rows to write next, and whether the ring was more than half full (or overflowed)."""
        taken: list[bytes] = []
        while self._local and len(taken) < self._pop_max:
            taken.append(self._local.popleft())
        popped = self._segment.pop_rows(self._pop_max - len(taken)) if len(taken) < self._pop_max else []
        taken.extend(popped)
        pressure = self._overflowed or len(popped) > self._half_ring
        self._overflowed = False
        return taken, pressure

    def _merge(self, rows: list[bytes], pressure: bool) -> list[bytes]:
        if not pressure:
            return rows
        merged, folded = merge_denials(rows)
        self._bump("merged", folded)
        return merged

    def spool_pending(self) -> None:
        """Move everything waiting (ring, memory) to the spool, merging denials under pressure."""
        while True:
            rows, pressure = self._take()
            if not rows:
                return
            rows = self._merge(rows, pressure)
            try:
                self.spool.append(rows)
            except OSError as exc:
                log.error("cannot write the telemetry spool (%s); keeping %d rows in memory", exc, len(rows))
                self._local.extendleft(reversed(rows))
                return
            self._bump("spooled", len(rows))

    async def _flush_ring(self) -> None:
        # NOTE: bounded, so a flood that refills the ring as fast as it drains still lets the
        # drain replay the spool and fsync between rounds.
        for _ in range(FLUSH_ROUNDS):
            rows, pressure = self._take()
            if not rows:
                return
            rows = self._merge(rows, pressure)
            try:
                await self._copy(rows)
            except BaseException:
                # NOTE: to disk before the failure is reported; rows the COPY did write are
                # skipped when the spool is replayed (same request id).
                try:
                    self.spool.append(rows)
                    self._bump("spooled", len(rows))
                except OSError:
                    self._local.extendleft(reversed(rows))
                raise

    async def flush(self) -> None:
        """Write everything waiting now (tests, shutdown); raises if the database is away."""
        await self._replay_spool()
        await self._flush_ring()

    async def _copy(self, rows: list[bytes]) -> None:
        items: list[tuple[bytes, tuple[Any, ...], list[EventRecord]]] = []
        for data in rows:
            try:
                row = _decoder.decode(data)
                items.append((data, to_record(row), event_records(row)))
            except (msgspec.DecodeError, ValueError, KeyError, TypeError) as exc:
                self._reject([data], exc)
        if not items:
            return
        try:
            await self._copy_records([record for _, record, _ in items],
                                     [event for *_, events in items for event in events])
        except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError):
            # One bad row must not hold back the others: write them one by one.
            for data, record, events in items:
                try:
                    await self._copy_records([record], events)
                except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as exc:
                    self._reject([data], exc)

    async def _copy_records(self, records: list[tuple[Any, ...]], events: list[EventRecord] | None = None) -> None:
        """COPY ``records`` and insert their rule ``events`` in one transaction: a row and its
        events land together (a replayed row's events, like the row, are skipped as repeats)."""
        columns = _event_columns(events) if events else None
        for attempt in range(ROLLBACK_RETRIES + 1):
            try:
                async with asyncio.timeout(COPY_TIMEOUT_S):
                    async with self._pool.acquire() as conn:
                        if columns is None:
                            await conn.copy_records_to_table(INGEST_TABLE, records=records, columns=COLUMNS)
                        else:
                            async with conn.transaction():
                                await conn.copy_records_to_table(INGEST_TABLE, records=records, columns=COLUMNS)
                                # NOTE: after the COPY, under the ingest's advisory lock (migration
                                # 0011), so concurrent batches carrying one event never wait on
                                # each other's uncommitted outbox row in opposite orders.
                                await conn.execute(INSERT_RULE_EVENTS, *columns)
                break
            except asyncpg.TransactionRollbackError:
                # A deadlock or serialization victim: the database is there, the batch goes again.
                if attempt == ROLLBACK_RETRIES:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
        self._bump("written", len(records))
        if self._beats:
            _beat(self._segment)

    def _reject(self, rows: list[bytes], exc: BaseException) -> None:
        """Keep rows the database refuses beside the spool (never replayed, never dropped)."""
        path = self.spool.directory / f"rejected-{os.getpid()}.rows"
        self.spool.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # NOTE: 0600 whatever the umask: rows carry user ids, source IPs and user agents.
        with open(path, "ab", opener=_owner_only) as f:
            f.write(frame(rows))
        self._bump("rejected", len(rows))
        log.error("%d request rows refused (%s: %s); kept in %s", len(rows), type(exc).__name__, exc, path)

    async def _replay_spool(self) -> None:
        # This worker's own rows join the queue first, so they replay in the order they came.
        self.spool.seal()
        self.spool.adopt_orphans()
        while (claimed := self.spool.claim_oldest()) is not None:
            rows, torn = read_frames(claimed.read_bytes())
            if torn:
                log.warning("spool file %s ends in %d torn bytes (a write cut short); skipped", claimed.name, torn)
            try:
                for start in range(0, len(rows), REPLAY_BATCH_ROWS):
                    await self._copy(rows[start:start + REPLAY_BATCH_ROWS])
            except BaseException:
                # Back in the queue; what was written is skipped on the next replay.
                self.spool.release(claimed)
                raise
            claimed.unlink()
            self._bump("replayed", len(rows))
            log.info("replayed %d request rows from %s (totals %s)", len(rows), claimed.name, self.metrics())


class Drainer:
    """The instance's drain: a thread (in the supervisor) with its own event loop and pool.

    Decoding, record building and COPY encoding hold the GIL, so they run in a process that
    serves no request; the workers only push rows into the ring. ``stop()`` writes what is
    waiting (bounded by ``STOP_FLUSH_S``) and seals the spool file, for :func:`final_flush`.
    """

    def __init__(self, url: str, segment: Any, spool_dir: Path) -> None:
        self._url = url
        self._segment = segment
        self._spool_dir = spool_dir
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._halt: asyncio.Event | None = None
        self._started = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="meshfast-drain", daemon=True)
        self._thread.start()
        self._started.wait(10)

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._halt is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._halt.set)
        self._thread.join(STOP_FLUSH_S + 10)
        if self._thread.is_alive():
            log.error("the telemetry drainer did not stop; the final flush writes what it left")
        self._thread = None

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._halt = asyncio.Event()
        self._started.set()
        # NOTE: min_size 0: a database that is away at start is the drain's outage to handle
        # (spool, probe, replay), not a reason to fail here.
        pool = await database.create_pool(self._url, role=database.GATEWAY_ROLE, min_size=0, max_size=2)
        try:
            writer = Telemetry(self._segment, pool, self._spool_dir)
            writer.start(drain=True)
            await self._halt.wait()
            await writer.stop()
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), timeout=5)


async def final_flush(segment: Any, pool: asyncpg.Pool, spool_dir: Path) -> dict[str, int]:
    """Write what the stopped workers left (ring rows, spool files); the supervisor's last step.

    What the database does not take stays in the spool for the next start.
    """
    telemetry = Telemetry(segment, pool, spool_dir)
    telemetry.spool.adopt_orphans(everyone=True)
    try:
        await telemetry.flush()
    except Exception as exc:
        log.warning("request rows left in the spool for the next start (%s)", exc)
        telemetry.spool_pending()
    finally:
        telemetry.spool.close()
    return telemetry.metrics()
