"""Typed stub of ``meshfast._core``, the Rust core of meshfast (built by maturin from ``core/``).

Build once, call many times: a worker builds a :class:`Core` at start-up, ``load``s each new
config (msgspec-encoded msgpack) and, per request, makes one call with the raw header values.
Counters, reservations and the process table live in one shared-memory :class:`Segment` per
instance, mapped by every worker process.
"""

from typing import Final, Literal, final

__all__ = [
    "CoreError",
    "SnapshotError",
    "ShmError",
    "UpstreamBodyError",
    "SPEND_DAY",
    "WINDOW_DAY",
    "WINDOW_WEEK",
    "WINDOW_MONTH",
    "RULE_POOL",
    "RULE_PAUSE",
    "RULE_NOTIFIED",
    "RULE_OWN",
    "RULE_MINUTE_CALLS",
    "RULE_MINUTE_TOKENS",
    "WORKFLOW_SPEND",
    "CALLS_HOUR",
    "PROVIDER_CALLS_HOUR",
    "PROVIDER_RATE",
    "PROVIDER_INFLIGHT",
    "GLOBAL_INFLIGHT",
    "CLUSTER",
    "CLUSTER_LEASED",
    "CLUSTER_FENCED",
    "cluster_key",
    "ceiling_key",
    "demand_key",
    "OUTCOMES",
    "Outcome",
    "Segment",
    "ResponseParser",
    "Exchange",
    "entry_error",
    "entry_stream_content_type",
    "known_request_fields",
    "encode_request",
    "dlp_pattern_problem",
    "dlp_scan",
    "redact_credentials",
    "forbidden_address",
    "check_jwks",
    "Lease",
    "Principal",
    "Core",
    "Prepared",
    "config_schema",
    "counter_key",
    "request_id",
]

SPEND_DAY: Final[int]
# The spend rules' counters: committed spend per principal and model in a calendar day, week and
# month (MESHFAST_CALENDAR_TZ); a rule entry's in-flight pool, pause start and notified flag per
# principal (``b`` = "<rule id>#<entry>") and window instance.
WINDOW_DAY: Final[int]
WINDOW_WEEK: Final[int]
WINDOW_MONTH: Final[int]
RULE_POOL: Final[int]
RULE_PAUSE: Final[int]
RULE_NOTIFIED: Final[int]
RULE_OWN: Final[int]
"""In a cluster: nano-USD this instance spent and holds in flight under one rule entry for one
principal in one window instance (capped by its slices of the entry's threshold)."""
RULE_MINUTE_CALLS: Final[int]
"""In a cluster: calls this instance counted under a rule entry's per-minute cap for one principal
in one UTC minute (capped by its slices of the cap)."""
RULE_MINUTE_TOKENS: Final[int]
# nano-USD spent and reserved under a registered workflow's budget in one window instance (a zero,
# b the workflow's uid, period the window's).
WORKFLOW_SPEND: Final[int]
"""In a cluster: tokens this instance counted under a rule entry's per-minute cap for one principal
in one UTC minute."""
"""Counter kind: nano-USD spent by a principal on a model in one UTC day (period = unix_ms // 86_400_000)."""
CALLS_HOUR: Final[int]
"""Counter kind: calls by a principal to a model in one UTC hour (period = unix_ms // 3_600_000)."""
PROVIDER_CALLS_HOUR: Final[int]
"""Counter kind: calls to a provider in one UTC hour; ``a`` is the zero UUID, ``b`` the provider id."""
PROVIDER_RATE: Final[int]
"""Slot kind: a provider's token bucket (GCRA theoretical arrival time, ns).

``a`` zero, ``b`` the provider id, period 0."""
PROVIDER_INFLIGHT: Final[int]
"""Counter kind: a provider's calls in flight (concurrency-slot leases); ``a`` zero, ``b`` the provider id, period 0."""
GLOBAL_INFLIGHT: Final[int]
"""Counter kind: the process-wide admission weight in flight; both ids zero, period 0."""
OUTCOMES: Final[dict[str, Outcome]]
"""Every data-plane denial and error by its Mesh code (the core's one table, ``core/src/outcome.rs``):
denials first, then wire-only codes (``model_not_found``, ``method_not_allowed``) and upstream
failures (``upstream_rate_limited``, ``upstream_unavailable``, ``upstream_incomplete``).
``meshfast.errors`` builds the data plane's exceptions from it, ``meshfast.metrics`` its deny reasons."""

@final
class Outcome:
    """One row of :data:`OUTCOMES`."""

    @property
    def code(self) -> str:
        """The Mesh code: the error's ``error`` / ``code`` / ``type`` field and a denied row's ``deny_reason``."""
    @property
    def status(self) -> int:
        """The HTTP status on the Mesh-native routes (the standard routes answer unknown and
        not-permitted models with 404 ``model_not_found``)."""
    @property
    def message(self) -> str:
        """The sentence the standard routes put in the error's ``message``."""
    @property
    def retry_after(self) -> bool:
        """The answer carries ``Retry-After`` (when the end is known)."""
    @property
    def retryable(self) -> bool:
        """False: the answer carries ``x-should-retry: false`` (retrying cannot clear it)."""
    @property
    def denial(self) -> bool:
        """Written as ``outcome=denied`` with the code as ``deny_reason``; False for wire-only codes
        and upstream failures (``outcome=upstream_error``)."""

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

class UpstreamBodyError(CoreError):
    """An upstream response lacks what the provider's dot paths promise (e.g. the embedding
    vector path is not an array of numbers). Answer 502 ``upstream_unavailable``."""

def counter_key(kind: int, a: str, b: str, period: int) -> bytes:
    """The 16-byte key of a counter: xxh3-128 over ``kind ‖ id(a) ‖ id(b) ‖ period (u32 LE)``.

    ``a`` and ``b`` are UUID strings (with or without hyphens), read as their 16 bytes; any other
    string is folded to 16 bytes by xxh3-128, so every id gives a stable key. ``kind`` is one of
    :data:`SPEND_DAY`, :data:`CALLS_HOUR`, :data:`PROVIDER_CALLS_HOUR`, :data:`PROVIDER_RATE`,
    :data:`PROVIDER_INFLIGHT`, :data:`GLOBAL_INFLIGHT` (else ``ValueError``).
    """

CLUSTER: Final[int]
"""Counter kind of the instance's cluster slots (its mode, heartbeat and epoch)."""
CLUSTER_LEASED: Final[int]
"""The :func:`cluster_key` value of an instance in a cluster: caps and provider limits are leased."""
CLUSTER_FENCED: Final[int]
"""The :func:`cluster_key` value of an instance cut off from the database past the point where its
leases may be reclaimed: it holds nothing."""

def cluster_key() -> bytes:
    """The key of the instance's cluster mode: ``epoch << 8 | state``, 0 alone (every cap held
    whole), state :data:`CLUSTER_LEASED` or :data:`CLUSTER_FENCED`; the epoch moves on at each
    (re)join."""

def ceiling_key(key: bytes, mode: int) -> bytes:
    """In a cluster (``mode`` as read at :func:`cluster_key`, whose epoch it carries), the key of
    the ceiling held for the budget or count ``key`` (the counter's value this instance may reach)
    or of the share held of a provider limit (concurrency slots; rate in milli-requests per
    second)."""

def demand_key(key: bytes) -> bytes:
    """In a cluster, the key counting the calls refused (or queued) for want of the share or
    lease at ``key``."""

def config_schema() -> str:
    """The configuration's shape as ``Core.load`` reads it, as JSON: a struct is an object of its
    fields, a sequence a one-element array, anything else ``null``."""

def request_id() -> str:
    """A fresh request id: ``"req_"`` followed by a 26-character ULID (sorts by creation time)."""

@final
class Segment:
    """A shared-memory segment mapped ``MAP_SHARED``: counters, reservations, process table.

    Every operation is lock-free (atomics and compare-and-swap), so a worker killed at any point
    leaves nothing locked.
    """

    @staticmethod
    def create(
        path: str,
        slots: int = 65536,
        leases: int = 16384,
        procs: int = 256,
        ring_records: int = 8192,
        record_bytes: int = 2048,
    ) -> Segment:
        """Create or re-initialise the segment file at ``path`` (the supervisor does this once).

        The file is built beside ``path`` and renamed over it, so processes still mapping an old
        segment keep a consistent one. ``slots`` is taken as given (any count: about 7 per active
        person × model pair); ``ring_records`` is rounded up to a power of two; ``record_bytes``
        (a multiple of 8, ≥ 64) includes a 32-byte record header, so a row holds at most
        ``record_bytes - 32`` bytes. Raises :class:`ShmError` on I/O errors, ``ValueError`` for
        capacities out of range.
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

    def add_many(self, pairs: list[tuple[bytes, int]]) -> None:
        """:meth:`add` each ``(key, delta)`` in one call; every pair is tried, and the first
        failure (:class:`ShmError` for a full table, ValueError for a key not of 16 bytes) is raised
        after the rest were added."""
    def set_if_zero(self, key: bytes, value: int) -> int:
        """Set the counter at ``key`` to ``value`` if it is 0 (one CAS); the value before (0:
        this call set it)."""

    def raise_to(self, key: bytes, value: int) -> int:
        """Raise the counter at ``key`` to ``value`` if it holds less (one atomic max); the value
        after."""

    def get(self, key: bytes) -> int:
        """The counter at ``key``, 0 when absent."""

    def seed_packed(self, kind: int, packed: bytes, shadow: bool) -> int:
        """Add packed records, each ``a (16 B) ‖ b (16 B) ‖ period (u32 BE) ‖ value (i64 BE)``
        (PostgreSQL's ``uuid_send ‖ int4send ‖ int8send``), to the counters of ``kind`` keyed as
        :func:`counter_key` keys those ids, and to their shadows with ``shadow``; how many records.
        Without the GIL. ``ValueError`` for a partial record or an unknown kind; :class:`ShmError`
        when the table is full."""

    def shadow(self, key: bytes) -> int:
        """The shadow of the counter at ``key`` (what the database already holds of it: the
        checkpoint pushes value − open reservations − shadow), kept in the counter's own slot; 0
        when absent."""

    def add_shadow(self, key: bytes, delta: int) -> int:
        """Add ``delta`` to the shadow of the counter at ``key`` (claiming its slot if new); the
        new shadow. Raises :class:`ShmError` when the slot table is full."""

    def remove(self, key: bytes) -> bool:
        """Turn ``key``'s slot into a tombstone (cleanup of past periods); True if it existed.

        Only remove keys nobody writes any more: an add racing with the removal may be lost.
        Tombstoned slots come back through :meth:`sweep`.
        """

    def sweep(self) -> int:
        """Turn tombstones that end a probe chain back into empty slots; returns how many.

        Safe while workers add and read (a short fence makes claimers wait, see ``shm.rs``); run
        by one process at a time (the supervisor), after removing past periods' keys. Tombstones
        in the middle of a chain stay until the keys after them are removed too. Releases the GIL.
        """

    def push_row(self, row: bytes) -> bool:
        """Append a telemetry row to the ring. False when the ring is full, the row is longer
        than ``record_bytes - 32``, or the record was reclaimed as stalled mid-write: the caller
        then spools the row to disk. Never blocks."""

    def pop_rows(self, max: int, abandoned: bool = False) -> list[bytes]:
        """Take up to ``max`` rows, oldest first (several drainers may pop concurrently; each row
        is delivered once). A record whose writer died mid-write is skipped after 5 s (at once
        when its pid is gone). ``abandoned``: the segment's run is over (every process that used
        it is dead), so a record claimed and never published is skipped at once. Releases the GIL."""

    def reserve(self, key: bytes, amount: int, cap: int) -> Lease | None:
        """Reserve ``amount`` on the counter at ``key`` if ``counter + amount <= cap``, else None.

        The counter then holds committed plus reserved amounts. The lease is tagged with this
        process's registration (done on demand), so :meth:`reclaim_dead` can release it if the
        process dies. Raises :class:`ShmError` when a table is full, ``ValueError`` for a
        negative amount.
        """

    def reserved(self) -> dict[bytes, int]:
        """Open (held) reservations summed per 16-byte counter key: the checkpoint pushes
        ``committed = get(key) - reserved()[key]``. A scan of the lease table (releases the GIL);
        reservations taken or settled during the scan may be missed."""

    def rate_acquire(self, key: bytes, rate_per_s: float, burst: int, now_ns: int) -> int:
        """GCRA token bucket on the slot at ``key``, exact across processes (one CAS): 0 when a
        request at ``now_ns`` is admitted (and counted), else the nanoseconds to wait before it
        would be. ``burst`` requests back to back, then one per ``round(1e9 / rate_per_s)`` ns.
        ``now_ns`` must come from a clock every process shares (``time.monotonic_ns()``);
        a state over 60 s ahead of it is taken as a clock that went backwards and restarts.
        ``ValueError`` for a rate or burst that is not positive; :class:`ShmError` when full."""

    def lease_marks(self) -> list[tuple[int, int]]:
        """The reservations held now (budgets, slots, weights), as opaque marks for
        :meth:`leases_outstanding`."""
    def leases_outstanding(self, marks: list[tuple[int, int]]) -> int:
        """How many of ``marks`` are still held by the same reservation (not settled or released)."""
    def inflight_weight(self) -> int:
        """The process-wide admission weight in flight (:meth:`Prepared.admit_global`)."""

    def reclaim_dead(self) -> int:
        """Release the leases and free the entries of registered processes that have exited.

        A process counts as gone when ``kill(pid, 0)`` fails with ``ESRCH`` or its pid now
        belongs to a process with another start time. Returns how many were reclaimed; the
        supervisor calls this periodically. Releases the GIL.
        """

    def stats(self) -> dict[str, int]:
        """Occupancy: ``slots``, ``slots_used``, ``tombstones``, ``leases``, ``leases_held``,
        ``procs``, ``procs_registered``, ``generation``, ``ring_records``, ``record_bytes``,
        ``ring_len`` (rows waiting)."""

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
    def kind(self) -> str:
        """``user`` or ``application``."""
    @property
    def email(self) -> str:
        """Empty for an application."""
    @property
    def display_name(self) -> str:
        """A person's name, or an application's name."""
    @property
    def key_id(self) -> str | None:
        """The id of the key that authenticated (None for a platform token)."""
    @property
    def token_issuer(self) -> str | None:
        """The platform token's issuer (``iss``), when one authenticated."""
    @property
    def token_subject(self) -> str | None:
        """The platform token's subject (``sub``), when one authenticated."""

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
    def dlp_wants_model(self) -> bool:
        """Whether an enabled data protection policy sets an action for a model detector
        (``person``, ``address``): only then does the edge ask the detection model."""

    @property
    def kill_switch(self) -> bool:
        """The published config's ``kill_switch``; False before the first load."""

    def hash_token(self, token: str) -> bytes:
        """``SHA-256(pepper || token)``, the 32-byte digest stored for an issued key."""

    def verify_token(self, token: str, now_ms: int, cached: bool = True) -> tuple[str | None, str | None]:
        """A platform token against the current snapshot: ``(principal_id, None)`` when it verifies,
        ``(None, code)`` when refused; ``cached=False`` verifies from scratch."""

    def token_refusal(
        self,
        authorization: str | None,
        x_api_key: str | None,
        x_goog_api_key: str | None,
        query: str | None,
        now_ms: int,
    ) -> tuple[str, str | None, dict[str, str | None] | None] | None:
        """Why the request's platform token is refused: None when the credential is not a token
        or authenticates; else ``(code, issuer, provision)``: ``issuer`` for ``unknown_key``,
        ``provision`` (``issuer_id, email, display_name, business_unit, manager_email, tier``)
        for ``unknown_principal`` from an issuer that provisions just in time."""

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

    def prepare(
        self,
        route: Literal["proxy", "embeddings", "generate", "openai_chat", "openai_responses", "anthropic", "gemini",
                       "ollama", "openai_embeddings"],
        authorization: str | None,
        x_api_key: str | None,
        x_goog_api_key: str | None,
        query_string: str | None,
        body: bytes,
        content_length: int | None,
        now_ms: int,
        model: str | None = None,
        stream: bool | None = None,
        cache_shaping: bool = True,
        workflow: str | None = None,
        dlp_found: list[tuple[str, str]] | None = None,
        dlp_model_failed: bool = False,
    ) -> Prepared:
        """The decision for a data-plane POST route, in Mesh's order.

        ``workflow`` (the call's ``workflow`` tag) names a registered workflow: a principal it does
        not list is 403 ``workflow_not_permitted``; otherwise the worst case is reserved against
        its budget in its calendar window (429 ``budget_exceeded`` naming it when it does not
        fit). An unregistered id changes nothing.

        ``dlp_found`` is what the detection model found in the call's texts, ``(type, value)``
        (types ``person`` and ``address`` count; each value's occurrences are matches of that
        detector in every text); ``dlp_model_failed`` says the model was asked and did not answer,
        so a call whose data protection policies want its detectors is 400
        ``sensitive_content_blocked`` naming them (fail closed).

        ``cache_shaping`` False (the caller's ``X-Meshfast-Cache: off``) leaves the upstream body
        without the model's prompt-cache shaping: no Anthropic breakpoints beyond the caller's own,
        no OpenAI ``prompt_cache_key``.

        Mesh-native routes (``proxy``, ``embeddings``, ``generate``) name the model in ``?model=``.
        Entry routes (a wire format's name) read it from the body, or from ``model`` (Gemini's
        path; ``stream`` likewise overrides the body's stream flag). Their body is decoded into
        the IR right after authentication (400 ``invalid_request`` with the decoder's message).
        Unknown and not-permitted models are 404 ``model_not_found`` (``deny_reason``
        ``unknown_model`` / ``model_not_permitted``); every denial body is in the entry API's own
        shape (:func:`entry_error`). An admitted entry call goes upstream in its provider's format
        for the resolved model, always streamed, always asking for usage, ``max_tokens``
        defaulting to the model's ``max_output_tokens``; generic (template) providers are 400.
        ``openai_embeddings`` (OpenAI's body: ``model``, ``input`` a string or up to 2048 strings,
        ``encoding_format`` float or base64) renders one upstream body per input
        (:attr:`Prepared.embedding_bodies`), reserving for all of them, errors in OpenAI's shape.

        401 ``invalid_or_revoked_key``; 403 ``model_not_permitted`` (not granted for the route's
        kind: chat / embedding / image or video generation; unknown names too); 403
        ``model_blocked``; 400 ``embeddings_not_supported_by_provider`` /
        ``generation_not_supported_by_provider``; policy: 429 ``provider_hourly_limit_reached``,
        429 ``user_model_hourly_limit_reached``, 403 ``outside_allowed_hours``, 429
        ``budget_exceeded``, 503 ``paused_by_admin``; then the body: 400 ``invalid_request``
        (with Mesh's ``detail``), 400 ``content_type_not_supported_by_model``, 400
        ``web_search_not_supported_by_model``; then the budget reservation: the worst-case cost
        (input bound × input price + ``max_tokens`` (proxy; the model's ``max_output_tokens``
        without it, and for generate) × output price, one web search if asked, nothing for
        seconds) is reserved on today's (UTC) :data:`SPEND_DAY` counter when the grant has a daily
        cap, admitted only if spend + open reservations + worst case ≤ cap, else 429
        ``budget_exceeded`` (``cap``, ``resume_at`` = next UTC midnight, ``retry_after_s``,
        ``should_retry`` False). The input bound is ``ceil(text bytes / 3)`` (no tokenizer), 1600
        per image or URL block, ``ceil(base64 bytes / 4)`` (≥ 1600) per inline document, audio or
        video. When the call goes upstream (``status == 0``) the provider and principal×model
        hourly counters in the segment are incremented. A counter table that is full gives 503
        ``server_busy`` (fail closed). The reservation and every later hold live in the returned
        :class:`Prepared`: settle it with :meth:`Prepared.settle` (instead of :meth:`charge`);
        dropping it unsettled releases them.
        ``content_length`` is accepted for symmetry and unused (413 is checked by the caller).
        Raises :class:`CoreError` before the first :meth:`load`, ``ValueError`` for an unknown route.
        """

    def charge(self, principal_id: str, model_id: str, nano: int, now_ms: int) -> int:
        """Add ``nano`` (negative counts as 0) to today's (UTC) :data:`SPEND_DAY` counter of
        principal × model; returns the new total. :class:`ShmError` without a segment or when full.
        Calls from :meth:`prepare` settle through :meth:`Prepared.settle` instead."""

    def estimate_tokens(self, text: str) -> int:
        """Tokens in ``text`` by ``cl100k_base`` (embedded; the first call builds the encoder)."""

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
        model, same models and order as :meth:`models_json`; ``rules``: every rule entry with a
        threshold whose population holds the caller, with spend, utilization and status) or the
        same 401 as there."""

    def counter_deltas(self, pair_periods: list[tuple[int, int]],
                       provider_periods: list[tuple[int, int]]) -> list[tuple[int, str, str, int, int]]:
        """Every counter that moved since the last checkpoint, in one pass over the snapshot's
        grants (``pair_periods``: ``(kind, period)`` of principal × model counters) and providers
        (``provider_periods``, principal part the zero id): ``(kind, a id, b id, period, delta)``
        with ``delta`` = value − open reservations − its shadow (:meth:`Segment.shadow`).
        Runs without the GIL."""

    def remove_counters(self, pair_periods: list[tuple[int, int]], provider_periods: list[tuple[int, int]]) -> int:
        """Remove those counters and their shadows; how many counters existed. Without the GIL."""

    def patch_principal(self, seq: int, index: int, principal: bytes) -> int:
        """Replace principal ``index`` (msgpack of ``meshfast.snapshot.Principal``, the same id)
        in the current snapshot and publish it as ``seq``, everything else shared (no rebuild).
        :class:`SnapshotError` when it does not fit (index, status, a looping manager chain)."""

    def patch_rules(self, seq: int, rules: bytes) -> int:
        """Replace the rules, the global switch and the calendar (msgpack ``{rules,
        enforce_rules, calendar_tz}``) in the current snapshot and publish it as ``seq``."""

    def dry_run(self, rule: bytes, now_ms: int) -> bytes:
        """``POST /admin/rules/dry-run``'s JSON body for a draft rule (msgpack of
        ``meshfast.snapshot.Rule``): ``{"affected": [{user_id, entry, action, spend_usd,
        threshold_usd, utilization}]}``, everyone at or over an entry's threshold now, from the
        counters only. :class:`SnapshotError` listing the problems when the rule does not build."""

@final
class Prepared:
    """The decision for one request, from :meth:`Core.prepare`.

    ``status == 0``: go upstream with ``method``, ``url``, ``headers``, ``upstream_body``.
    Otherwise answer ``status`` with ``body`` (``{"error": code, ...}`` and a newline) and, when
    ``retry_after_s`` is set, a ``Retry-After`` header. Upstream fields read as empty/0/None on a
    denial.
    """

    @property
    def request_id(self) -> str:
        """``"req_"`` + ULID, made by ``prepare``."""
    @property
    def status(self) -> int: ...
    @property
    def body(self) -> bytes:
        """The error body of a denial; ``b""`` otherwise."""
    @property
    def retry_after_s(self) -> int | None:
        """Whole seconds (≥ 1) until the denial may lift: 429s and 503s."""
    @property
    def deny_reason(self) -> str | None:
        """The Mesh error code of a denial."""
    @property
    def key_id(self) -> str | None: ...
    @property
    def token_issuer(self) -> str | None: ...
    @property
    def token_subject(self) -> str | None: ...
    @property
    def principal_id(self) -> str | None: ...
    @property
    def principal_kind(self) -> str | None:
        """``user`` or ``application``, once the caller is known."""
    @property
    def dlp(self) -> list[tuple[str, int]]:
        """Data protection's matches in the call, by detector (empty when no policy applied)."""
    @property
    def dlp_action(self) -> str | None:
        """The strongest data protection action taken (``block``, ``pseudonymize``, ``redact``)."""
    @property
    def dlp_needs_model(self) -> bool:
        """Refused only because ``dlp_model_failed`` was given and this call's policies want the
        detection model's detectors: ask the model, then decide again with what it found."""
    @property
    def dlp_applies(self) -> bool:
        """A data protection policy with a detector on applies to this caller, model and provider
        (whether or not anything was found)."""
    @property
    def model_id(self) -> str | None:
        """Set once the model is found among the principal's grants."""
    @property
    def provider_id(self) -> str | None:
        """The provider of the deployment in force (the fallback's after :meth:`failover`)."""
    @property
    def model_name(self) -> str | None:
        """The registry name (also when the caller used an alias)."""
    @property
    def requested_model(self) -> str:
        """The model as the caller named it (``model`` query parameter percent-decoded, or the
        body's), alias or name."""
    @property
    def log_requests(self) -> bool:
        """False for a "silent" provider: neither its calls nor its denials are logged."""
    @property
    def local(self) -> bool:
        """The provider may point at loopback/private addresses (for the SSRF guard)."""
    def failover(self) -> bool:
        """Switch this call to the model's next deployment (by priority), rendered by
        :meth:`Core.prepare` beside the first: every upstream field, ``provider_id`` and
        ``local`` then read the fallback's. Once per call; counts the call in that provider's
        hourly quota. False, with nothing changed, when there is no next deployment, it cannot
        take this call, its hourly quota is spent, or the call already failed over. The call
        keeps its budget reservation and process-wide weight but gives back the first
        provider's slot and share: the caller admits it again (``admit_provider``) by the
        fallback provider's limits before sending."""
    @property
    def url(self) -> str | None: ...
    @property
    def method(self) -> str | None: ...
    @property
    def headers(self) -> list[tuple[str, str]]:
        """Rendered; ``Content-Type: application/json`` first unless the template sets it."""
    @property
    def upstream_body(self) -> bytes: ...
    @property
    def attempts(self) -> int:
        """``max_retries + 1`` when retries are enabled (proxy), else 1; 0 on a denial."""
    @property
    def backoff_ms(self) -> int:
        """First retry backoff; doubles per attempt."""
    @property
    def max_tokens(self) -> int:
        """The request's ``max_tokens`` or the model's default (proxy); 0 elsewhere."""
    @property
    def web_search(self) -> bool: ...
    @property
    def weight(self) -> int:
        """Admission weight: blocks summed (text 1, image 5, document 8, audio 10, video 25),
        at least 1; embeddings 1; generate 25."""
    @property
    def should_retry(self) -> bool | None:
        """False when retrying cannot help (``budget_exceeded``): send ``x-should-retry: false``."""
    @property
    def limit_id(self) -> str | None:
        """The governing limit for ``X-Meshfast-Limit``: of ``policy.daily_usd`` (spend incl. open
        reservations / cap), ``policy.hourly_calls``, ``provider.hourly_calls`` and the rule
        entries covering the call (``rule:<id>``), those that apply, the one with the highest
        utilization (ties: that order). None when none applies or the decision ended before
        policy (401, 403, 400 capability)."""
    @property
    def utilization(self) -> float | None:
        """The governing limit's utilization in percent, rounded to 2 decimals, counting this
        call when admitted (``X-Meshfast-Utilization``)."""
    @property
    def reset_at(self) -> str | None:
        """When the governing limit's window resets, RFC 3339 UTC (``2025-03-06T00:00:00Z``)."""
    @property
    def reserved_nano(self) -> int:
        """The budget reservation held (nano-USD); 0 when none or once settled."""
    def settle(self, actual_nano: int, tokens: int = 0) -> bool:
        """Turn the reservation into the actual cost (negative counts as 0), or add it to today's
        spend counter when nothing was reserved (no cap), and release the provider slot and the
        admission weight. The cost also reaches the rules' calendar counters (before their pool
        reservations are given back), ``tokens`` the rules' per-minute token counters, and rule
        notifications due fire (see :meth:`events`). True the first time, False afterwards
        (idempotent). :class:`CoreError` on a denial; :class:`ShmError` when an unreserved charge
        finds the table full (the call stays unsettled)."""
    @property
    def warning(self) -> str | None:
        """The first enforcing rule warning whose threshold is reached (``X-Meshfast-Warning``)."""
    @property
    def would_deny(self) -> str | None:
        """The id of a shadow rule that would have refused the call (the row's ``would_deny``)."""
    @property
    def lease_wanted(self) -> tuple[bytes, int, int, int, int, int, int] | None:
        """In a cluster, the lease the call was refused for want of: ``(counter key, kind,
        period, need, cap, base, expires_ms)``: a daily spend (:data:`SPEND_DAY`, nano-USD,
        period the UTC day), an hourly call count (:data:`CALLS_HOUR`,
        :data:`PROVIDER_CALLS_HOUR`, period the UTC hour) or a rule entry's threshold
        (:data:`RULE_OWN`, nano-USD, period the window's; ``base`` the spend in scope and window
        it starts from) or a rule entry's per-minute cap (:data:`RULE_MINUTE_CALLS`,
        :data:`RULE_MINUTE_TOKENS`, period the UTC minute); ask for one and decide again.
        ``expires_ms``: when the window ends."""
    @property
    def business_unit(self) -> str | None:
        """The caller's business unit at call time."""
    @property
    def manager_id(self) -> str | None:
        """The caller's manager's id at call time."""
    @property
    def tier(self) -> str | None:
        """The caller's tier at call time."""
    @property
    def model_tags(self) -> list[str]:
        """The model's tags at call time."""
    def events(self) -> list[tuple[str, int, str, str, str, int, int, int, str]]:
        """What the rules did to the caller, as ``meshfast.telemetry.RuleEvent`` fields: the
        decision's (a pause that began, a block's notification), then those that fired when the
        call settled (taken once)."""
    def admit_provider(self, now_ns: int, max_wait_ns: int = 0, capacity: int = 0) -> tuple[bool, int]:
        """Provider admission, shared by all workers: a concurrency slot (``max_concurrent_upstream``)
        then a token (GCRA, rate = burst = ``max_outbound_rps``).

        ``(True, wait_ns)``: admitted; start the upstream call after ``wait_ns`` (0 = now). A token
        that comes within ``max_wait_ns`` is taken at once, at its place in line, so waiters are
        served in arrival order. A provider with an admission share may hold at most that
        percentage of ``capacity`` (the process-wide admission weight).
        ``(False, wait_ns)``: not admitted, holding nothing; try again
        after ``wait_ns`` (5 ms for a slot, the exact wait for a token). ``now_ns`` as for
        :meth:`Segment.rate_acquire`. :class:`CoreError` on a denial or a settled call,
        :class:`ShmError` when a table is full."""
    def admit_global(self, capacity: int, factor: int) -> bool:
        """Process-wide admission: take ``weight × factor`` clamped to ``[1, capacity]`` of the
        segment's admission weight if the total stays ≤ ``capacity``; True when held (or already).
        Released with the provider slot. :class:`CoreError` on a denial, :class:`ShmError` when full."""
    def release_provider(self) -> None:
        """Give back the provider slot and the admission weight (the upstream call, or the stream,
        ended); the budget reservation stays until :meth:`settle`. Idempotent."""
    @property
    def output_media_type(self) -> str | None:
        """The model's output media type (generate)."""
    @property
    def generation_mode(self) -> Literal["sync", "async_poll"] | None: ...
    @property
    def poll_interval_ms(self) -> int | None: ...
    @property
    def max_wait_s(self) -> int | None: ...
    @property
    def success_values(self) -> list[str]:
        """Async job statuses meaning success (compare ASCII case-insensitively)."""
    @property
    def failure_values(self) -> list[str]: ...
    def render_status_url(self, job_id: str) -> str:
        """The async status URL for ``job_id`` (``{{model}}`` renders as ``""``, as Mesh)."""
    def render_content_url(self, job_id: str) -> str:
        """The async content URL for ``job_id``."""
    @property
    def embedding_bodies(self) -> list[bytes]:
        """OpenAI embeddings: the upstream body of each input, in order."""
    @property
    def client_stream(self) -> bool:
        """The entry-route caller asked for a stream (False on Mesh routes)."""
    @property
    def tools_declared(self) -> list[tuple[str, int]]:
        """The tools an entry-route caller declared (context signals): ``(name, bytes)`` with
        the size of the tool's definition as compact JSON, each name once, in order, at most
        128; empty on other routes."""
    @property
    def unknown_fields(self) -> list[str]:
        """Request fields the entry codec could not classify (schema drift), e.g. ``seed``."""
    @property
    def row_head(
        self,
    ) -> tuple[str, int, str | None, str | None, str | None, str | None, str | None, str | None, str | None,
               str | None, str | None, str | None, str | None, list[str], str | None, str | None, str | None,
               dict[str, int] | None, str | None]:
        """What the decision puts in the call's row, in one call: ``(request_id, status, key_id,
        principal_id, provider_id, model_id, model_name, requested_model or None, deny_reason,
        business_unit, manager_id, tier, would_deny, model_tags, principal_kind, token_issuer,
        token_subject, dlp as a dict or None, dlp_action)``."""
    @property
    def upstream_call(self) -> tuple[str, str, list[tuple[str, str]], bytes, bool, int, int, str | None]:
        """The upstream call in force (the fallback's after :meth:`failover`), in one call:
        ``(method, url, headers, upstream_body, local, attempts, backoff_ms, provider_id)``.
        :class:`CoreError` for a denied call."""
    def exchange(self) -> Exchange:
        """The upstream exchange of this chat call (an entry route's or ``/v1/proxy``'s) on the
        deployment in force (the fallback's after :meth:`failover`). :class:`CoreError` unless
        it is one."""
    def price(
        self,
        input_tokens: int,
        output_tokens: int,
        seconds: float = 0.0,
        web_searches: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
    ) -> tuple[int, int]:
        """``(input_cost_nano, output_cost_nano)`` at the model's prices as the call was decided
        (a config change mid-call moves neither its reservation nor its price): each token class
        × its per-1k price, the prompt classes (input, cache read, 5 min and 1 h cache writes;
        disjoint, so ``input_tokens`` excludes cached ones) summed exactly and rounded half up
        once. Above the model's ``long_context_threshold_tokens`` of prompt, the long-context
        tier's prices apply to every class. Unset cache prices are the input price (1 h writes:
        the 5 min price). Web searches × the provider's per-search price are added to input;
        ``seconds`` (at microsecond precision) × the per-second price to output. Negative parts
        are 0. :class:`CoreError` for a denied call."""
    def extract_embedding(self, body: bytes) -> tuple[bytes, int]:
        """``(vector as compact JSON array text, input_tokens)`` from an embeddings response.

        Raises :class:`UpstreamBodyError` when the body is not JSON or the vector path is not an
        array of numbers; a missing usage path gives 0.
        """
    def extract_generation(self, body: bytes) -> tuple[list[str], float, str | None, str | None, int, int]:
        """``(outputs, seconds, job_id, status, input_tokens, output_tokens)`` read through every
        configured generation path (sync result, async submit, or poll answer): outputs are the
        non-empty strings at the media path; the caller classifies ``http(s)://`` as URLs.
        :class:`UpstreamBodyError` when the body is not JSON."""

@final
class Exchange:
    """One chat call's upstream exchange after the decision (:meth:`Prepared.exchange`): the
    response's framing, its translation into the caller's bytes and its accounting, so the data
    plane makes one call into the core per upstream read and one at the end.

    An entry route's caller gets its own API format (a stream, or one response at the end); a
    ``/v1/proxy`` caller gets Mesh NDJSON: each non-empty delta as ``{"id":…,"delta":…}``; with
    web search, an event citing URLs not seen before is followed by ``{"id":…,"sources":[…]}``
    with only those (at most 100 in all); the last line is ``{"id":…,"done":true,"usage":{…}}``
    plus ``"truncated":true`` when output reached ``max_tokens`` and ``"incomplete":true`` when
    the upstream broke off (with web search, ``usage`` has ``web_searches`` and the line
    ``sources``, ``queries``, ``search_suggestions_html``, ``sources_truncated`` as present).
    Only ``data:`` lines count; ``[DONE]`` or the provider's done signal ends the stream;
    unparseable events are skipped. Used by one task."""

    def adopt(self, parser: ResponseParser) -> None:
        """Take over ``parser``'s framing (``parser`` is left empty): :meth:`feed` then takes
        socket bytes, and the exchange answers as the parser did (:attr:`status`,
        :meth:`header`, :attr:`complete`, :attr:`reusable`, …)."""
    def feed(self, data: bytes) -> bytes:
        """Consume socket bytes (body bytes when no framing was adopted), split anywhere; return
        what the caller gets now (``b""`` if nothing). ConnectionError on a response that does
        not follow HTTP/1.1. After :meth:`finish`, bytes are framed and dropped."""
    def feed_body(self, body: bytes) -> bytes:
        """Body bytes the client framed before :meth:`adopt`: translated like :meth:`feed`'s."""
    def eof(self) -> bytes:
        """The connection closed: what the rest of a close-delimited body gives the caller, or
        ConnectionError when the response was cut short."""
    def finish(
        self, incomplete: bool, client_gone: bool, request_body: bytes
    ) -> tuple[bytes, int, int, int, int, int, int, int, bool, int, list[str], str | None]:
        """End the exchange: ``(last bytes, tokens_in, tokens_out, cache_read, cache_write_5m,
        cache_write_1h, input_cost_nano, output_cost_nano, estimated, web_searches,
        tools_invoked, error)``.

        The last bytes are a stream's end (its format's error signal when it broke; Mesh's done
        line) or, for a caller that asked for no stream, the whole response (nothing when
        ``error`` is set: the stream broke). Token classes are disjoint (``tokens_in`` excludes
        cached tokens; ``cache_write_5m`` excludes the one-hour writes). Without reported usage,
        the prompt (an entry route's whole body; ``/v1/proxy``'s ``query`` or text blocks) and
        the answer's text are estimated with the tokenizer (``estimated``); a call that reported
        its usage but was cut short (``incomplete``) or left (``client_gone``) is charged at
        least the tokens of what it carried. Prices are the call's (:meth:`Prepared.price`)."""
    @property
    def ended(self) -> bool:
        """The upstream's stream reached its end signal, or the adopted response's body ended."""
    @property
    def deltas(self) -> int:
        """Text deltas received so far."""
    @property
    def status(self) -> int:
        """The adopted response's status (:class:`CoreError` before :meth:`adopt`)."""
    def header(self, name: str) -> str | None: ...
    @property
    def headers(self) -> list[tuple[str, str]]: ...
    @property
    def head_done(self) -> bool: ...
    @property
    def complete(self) -> bool:
        """The adopted response's body was read to its end."""
    @property
    def reusable(self) -> bool: ...

def encode_request(method: str, target: str, host: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """One HTTP/1.1 request: request line, ``host``, the headers (framing and connection headers
    dropped; ``accept`` and ``accept-encoding: identity`` added unless given), ``content-length``
    and the body. Raises ValueError on a name or value that could split the request."""

def dlp_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a data protection detector (it does not compile, is too long, or
    matches the empty text); None when it can."""

def dlp_scan(text: str) -> list[tuple[str, int, int]]:
    """The built-in data protection detectors' matches in ``text``: ``(detector, start, end)``
    in character offsets, in order, without overlaps."""

def redact_credentials(text: str, headers: list[tuple[str, str]], url: str) -> str:
    """``text`` without the provider credentials the upstream request carried (the values of
    ``authorization``-like headers and credential-like query parameters of ``url``): whole,
    percent-encoded, masked (``sk-proj-****Ab3d``) or cut short, each becomes ``[redacted]``."""

def check_jwks(text: str) -> tuple[list[tuple[str | None, str]], list[str]]:
    """The usable keys of a JWK Set (JSON text) as ``[(kid, alg)]`` and why each other key was
    left out. Raises ValueError when the text is not a JWK Set."""

def forbidden_address(address: str) -> bool:
    """Whether a provider not marked local may not connect to ``address``: every IANA
    special-purpose range that is not globally reachable (private, shared 100.64/10, loopback,
    link-local, documentation, benchmarking, multicast, reserved; IPv6 forms embedding an IPv4
    address are judged by it). Raises ValueError when ``address`` is not an IP address."""

@final
class ResponseParser:
    """One upstream exchange's HTTP/1.1 response parser (httparse head, chunked and
    content-length framing, gzip/deflate inflated, 1xx interim answers skipped)."""

    def __new__(cls, no_body: bool = False) -> ResponseParser: ...
    def feed(self, data: bytes) -> bytes:
        """Consume a socket read; return the decoded body bytes it completed (``b""`` if none).
        Raises ConnectionError on a response that does not follow HTTP/1.1."""
    def eof(self) -> bytes:
        """The connection closed: the rest of a close-delimited body, or ConnectionError when
        the response was cut short."""
    def header(self, name: str) -> str | None:
        """The first header named ``name`` (case-insensitive)."""
    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> list[tuple[str, str]]:
        """Every header, names lower-cased, in order."""
    @property
    def head_done(self) -> bool: ...
    @property
    def complete(self) -> bool: ...
    @property
    def ended(self) -> bool:
        """As :attr:`complete` (an :class:`Exchange` that adopted the framing also ends at its
        stream's end signal)."""
    @property
    def reusable(self) -> bool:
        """The connection may carry another exchange once this one is complete."""

def entry_error(format: str, status: int, code: str, detail: str | None = None) -> bytes:
    """An error body in an entry format's own shape (``openai_chat``, ``openai_responses``,
    ``anthropic``, ``gemini``, ``ollama``), so the official SDKs raise their usual exception
    for ``status``; the Mesh ``code`` goes in ``error.code`` (OpenAI, Ollama), ``error.type``
    (Anthropic) or ``error.details[0].reason`` (Gemini, whose ``error.code`` is the status)."""

def entry_stream_content_type(format: str) -> str:
    """``text/event-stream``, or ``application/x-ndjson`` for Ollama."""

def known_request_fields(format: str) -> tuple[list[str], list[str], list[str]]:
    """The request fields ``format``'s codec classifies, as ``(mapped, passthrough, ignored)``.

    Mapped fields travel in the translation IR, so across formats; passthrough fields reach an
    upstream of the same format verbatim; ignored fields are known and never sent (caller
    identity, provider-side storage, options the prices do not cover). Nested fields are written
    ``container.field`` (``generationConfig.topK``, ``options.num_ctx``). Any other field is
    counted as unclassified. Raises ``ValueError`` for an unknown format."""
