"""Typed stub of ``meshfast._core``, the Rust core of meshfast (built by maturin from ``core/``).

Build once, call many times: a worker builds a :class:`Core` at start-up, ``load``s each new
config (msgspec-encoded msgpack) and, per request, makes one call with the raw header values.
Counters, reservations and the process table live in one shared-memory :class:`Segment` per
instance, mapped by every worker process.
"""

from typing import Final, final

__all__ = [
    "CoreError",
    "SnapshotError",
    "ShmError",
    "SPEND_DAY",
    "CALLS_HOUR",
    "PROVIDER_CALLS_HOUR",
    "Segment",
    "Lease",
    "Principal",
    "Core",
    "counter_key",
    "request_id",
]

SPEND_DAY: Final[int]
"""Counter kind: nano-USD spent by a principal on a model in one UTC day (period = unix_ms // 86_400_000)."""
CALLS_HOUR: Final[int]
"""Counter kind: calls by a principal to a model in one UTC hour (period = unix_ms // 3_600_000)."""
PROVIDER_CALLS_HOUR: Final[int]
"""Counter kind: calls to a provider in one UTC hour; ``a`` is the zero UUID, ``b`` the provider id."""

class CoreError(Exception):
    """Base class of every error raised by this module (``ValueError`` aside)."""

class SnapshotError(CoreError):
    """A config failed validation; the previous snapshot stays in force."""

    errors: list[str]
    """Every problem found, e.g. ``'keys[3]: digest is 31 bytes, expected 32'``."""

class ShmError(CoreError):
    """A segment file is missing, foreign or of another layout version, or a table is full.

    Callers fail closed on a full table.
    """

def counter_key(kind: int, a: str, b: str, period: int) -> bytes:
    """The 16-byte key of a counter: xxh3-128 over ``kind ‖ id(a) ‖ id(b) ‖ period (u32 LE)``.

    ``a`` and ``b`` are UUID strings (with or without hyphens), read as their 16 bytes; any other
    string is folded to 16 bytes by xxh3-128, so every id gives a stable key. ``kind`` is one of
    :data:`SPEND_DAY`, :data:`CALLS_HOUR`, :data:`PROVIDER_CALLS_HOUR` (else ``ValueError``).
    """

def request_id() -> str:
    """A fresh request id: ``"req_"`` followed by a 26-character ULID (sorts by creation time)."""

@final
class Segment:
    """A shared-memory segment mapped ``MAP_SHARED``: counters, reservations, process table.

    Every operation is lock-free (atomics and compare-and-swap), so a worker killed at any point
    leaves nothing locked.
    """

    @staticmethod
    def create(path: str, slots: int = 65536, leases: int = 16384, procs: int = 256) -> Segment:
        """Create or re-initialise the segment file at ``path`` (the supervisor does this once).

        The file is built beside ``path`` and renamed over it, so processes still mapping an old
        segment keep a consistent one. ``slots`` is rounded up to a power of two. Raises
        :class:`ShmError` on I/O errors, ``ValueError`` for capacities out of range.
        """

    @staticmethod
    def open(path: str) -> Segment:
        """Map an existing segment; raises :class:`ShmError` unless its magic, layout version and size match."""

    def register(self) -> int:
        """Register this process (pid and start time) in the process table; returns its generation.

        Idempotent per process; a forked child registers itself on first use. Raises
        :class:`ShmError` when the process table is full.
        """

    def add(self, key: bytes, delta: int) -> int:
        """Add ``delta`` to the counter at ``key`` (16 bytes); returns the new value.

        Raises :class:`ShmError` when the slot table is full.
        """

    def get(self, key: bytes) -> int:
        """The counter at ``key``, 0 when absent."""

    def remove(self, key: bytes) -> bool:
        """Turn ``key``'s slot into a tombstone (cleanup of past periods); True if it existed.

        Only remove keys nobody writes any more: an add racing with the removal may be lost.
        Tombstoned slots are not reused until the segment is re-created.
        """

    def reserve(self, key: bytes, amount: int, cap: int) -> Lease | None:
        """Reserve ``amount`` on the counter at ``key`` if ``counter + amount <= cap``, else None.

        The counter then holds committed plus reserved amounts. The lease is tagged with this
        process's registration (done on demand), so :meth:`reclaim_dead` can release it if the
        process dies. Raises :class:`ShmError` when a table is full, ``ValueError`` for a
        negative amount.
        """

    def reclaim_dead(self) -> int:
        """Release the leases and free the entries of registered processes that have exited.

        A process counts as gone when ``kill(pid, 0)`` fails with ``ESRCH`` or its pid now
        belongs to a process with another start time. Returns how many were reclaimed; the
        supervisor calls this periodically. Releases the GIL.
        """

    def stats(self) -> dict[str, int]:
        """Occupancy: ``slots``, ``slots_used``, ``tombstones``, ``leases``, ``leases_held``,
        ``procs``, ``procs_registered``, ``generation``."""

@final
class Lease:
    """A reservation from :meth:`Segment.reserve`. Release or settle it once; later calls do nothing."""

    @property
    def amount(self) -> int:
        """The amount reserved."""

    def release(self) -> None:
        """Give the reserved amount back to the counter."""

    def settle(self, actual: int) -> None:
        """Replace the reservation with the amount actually used (``counter += actual - amount``)."""

@final
class Principal:
    """The principal behind an authenticated key. One object per key per snapshot, shared."""

    @property
    def id(self) -> str: ...
    @property
    def email(self) -> str: ...
    @property
    def display_name(self) -> str: ...
    @property
    def key_id(self) -> str:
        """The id of the key that authenticated."""

@final
class Core:
    """The worker's view of the config: the current snapshot, swapped atomically by :meth:`load`.

    Header arguments are the raw values of ``Authorization``, ``x-api-key``, ``x-goog-api-key``
    and the raw query string (its ``key=`` parameter, for Gemini clients), or None. The first
    non-empty one is the token; ``Bearer `` is stripped case-insensitively. ``now_ms`` is Unix
    time in milliseconds.
    """

    def __new__(cls, pepper: bytes, segment: Segment | None = None) -> Core:
        """``pepper`` is prepended to tokens before hashing; ``segment`` supplies the counters
        shown by the views (without one, every counter reads 0)."""

    def load(self, config: bytes) -> int:
        """Validate and publish a msgpack-encoded config; returns its ``seq``.

        Raises :class:`SnapshotError` listing every problem; the previous snapshot stays in
        force. Releases the GIL while building.
        """

    @property
    def seq(self) -> int:
        """The published config's ``seq``; -1 before the first successful load."""

    @property
    def kill_switch(self) -> bool:
        """The published config's ``kill_switch``; False before the first load."""

    def hash_token(self, token: str) -> bytes:
        """``SHA-256(pepper || token)``, the 32-byte digest stored for an issued key."""

    def authenticate(
        self,
        authorization: str | None,
        x_api_key: str | None,
        x_goog_api_key: str | None,
        query: str | None,
        now_ms: int,
    ) -> Principal | None:
        """The principal for a request's key, or None (401) when the key is missing, malformed,
        unknown, revoked or expired, or its principal is revoked or expired."""

    def models_json(
        self,
        authorization: str | None,
        x_api_key: str | None,
        x_goog_api_key: str | None,
        query: str | None,
        now_ms: int,
    ) -> tuple[int, bytes]:
        """``(200, body)`` for ``GET /v1/models`` or ``(401, b'{"error":"invalid_or_revoked_key"}\\n')``.

        The body carries OpenAI's ``{"object":"list","data":[...]}`` and Mesh's ``"models"``
        list (kind, formats, web search, status, usage, ``resume_at``, ``allowed_hours``) for
        every granted model that is neither blocked nor retired, sorted by name.
        """

    def usage_json(
        self,
        authorization: str | None,
        x_api_key: str | None,
        x_goog_api_key: str | None,
        query: str | None,
        now_ms: int,
    ) -> tuple[int, bytes]:
        """``(200, body)`` for ``GET /v1/usage`` (spend, cap, remaining and limit utilisation per
        model, same models and order as :meth:`models_json`) or the same 401 as there."""
