"""Settings read from the environment, once per process.

Every variable is documented here and in ``meshfast --help``.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import xxhash

ENV_DOC: tuple[tuple[str, str], ...] = (
    ("MESHFAST_DATA_DIR", "secrets, embedded database, spool (default ~/.meshfast)"),
    ("DATABASE_URL", "external PostgreSQL (a superuser, or a member of the meshfast roles); embedded when unset"),
    ("MESHFAST_GATEWAY_DATABASE_URL", "optional separate login for the gateway role (default: DATABASE_URL)"),
    ("MESHFAST_ADMIN_TOKEN", "the bootstrap admin token; honoured on every start (stored hashed)"),
    ("MESHFAST_MAX_BODY_MB", "largest accepted request body in MiB (default 300)"),
    ("MESHFAST_RECONCILE_S", "seconds between unconditional snapshot rebuilds (default 45)"),
    ("MESHFAST_STREAM_IDLE_TIMEOUT_S", "seconds a stream may sit idle before it is cut (default 300)"),
    ("MESHFAST_UPSTREAM_CONNECT_TIMEOUT_S", "seconds to connect to a provider (default 5)"),
    ("MESHFAST_UPSTREAM_CLIENT", "upstream HTTP client: native (default, meshfast's own) or aiohttp"),
    ("MESHFAST_UPSTREAM_DEADLINE_S", "total seconds for an upstream call including retries (default 600)"),
    ("MESHFAST_ADMISSION_CAPACITY", "process-wide admission weight (text 1, image 5, ... video 25; default 200)"),
    ("MESHFAST_INFLIGHT_CEILING", "in-flight calls per worker at which pressure is 1.0 (default 5000)"),
    ("MESHFAST_MEMORY_CEILING_MB", "worker RSS in MiB at which pressure is 1.0 (default 1024)"),
    ("MESHFAST_SHM_DIR", "where the shared-memory segment lives (default /dev/shm)"),
    ("MESHFAST_TELEMETRY_RING_ROWS", "request rows the shared-memory ring holds before the spool (default 8192)"),
    ("MESHFAST_DRAIN_TIMEOUT_S", "seconds SIGTERM lets in-flight calls finish before cutting them (default 30)"),
    ("MESHFAST_REALTIME_DRAIN_S", "seconds SIGTERM lets open realtime sessions go on before telling them to "
     "reconnect (default 300, at most 1800)"),
    ("MESHFAST_HEADER_TIMEOUT_S", "seconds a client has to send its request headers (default 30)"),
    ("MESHFAST_BODY_IDLE_TIMEOUT_S", "seconds a request body may pause between reads before a 408 (default 10)"),
    ("MESHFAST_BODY_TIMEOUT_S", "seconds a client has to send its whole request body before a 408 (default 120)"),
    ("MESHFAST_MAX_ADMIN_BODY_KB", "largest admin request body in KiB (default 1024)"),
    ("MESHFAST_BACKLOG", "listen backlog of the server socket (default 16384; capped by net.core.somaxconn)"),
    ("MESHFAST_MAX_CONNECTIONS", "requests served at once per instance; more wait in the backlog (default 1024)"),
    ("MESHFAST_FAULT_INJECT", "tests only: background loops that fail on purpose, e.g. telemetry:2,leader"),
    ("MESHFAST_COOKIE_SECURE", "1 marks the dashboard's session cookies Secure (behind HTTPS; default 0)"),
    ("MESHFAST_LOG_LEVEL", "debug, info, warning or error (default info)"),
    ("MESHFAST_LOOP", "event loop: uvloop (default where installed, else asyncio), asyncio, auto (rloop, else uvloop, "
                      "else asyncio), rloop"),
    ("MESHFAST_LOOP_LAG_PROBE_MS", "ms between event-loop lag probes (meshfast_loop_lag_seconds; default 20, 0 = off)"),
    ("MESHFAST_LOOP_LAG_LOG_MS", "diagnostics: log every lag-probe tick later than this many ms (default off)"),
    ("MESHFAST_TASK_IMPL", "Granian's task implementation: asyncio (default) or rust (Python < 3.12)"),
    ("MESHFAST_RUNTIME_MODE", "Granian's Rust runtime per worker: auto (default), st or mt"),
    ("LOG_RETENTION_DAYS", "days of request logs kept (default 30)"),
    ("MESHFAST_SHM_SLOTS", "counter slots of the shared-memory table, 32 bytes each, from 4096 to 134217728 (default "
                           "1048576: 32 MiB, about 150,000 person x model pairs active in a day; size it at about 7 "
                           "slots per active pair, e.g. 7200000 for a million: 220 MiB; a full table refuses calls)"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTLP collector (http/protobuf) for a span per request; unset: no tracing "
                                    "(the other OTEL_* variables apply as the OpenTelemetry SDK reads them)"),
    ("MESHFAST_CALENDAR_TZ", "IANA zone of the spend rules' daily, weekly (Monday first) and monthly windows "
                             "(default UTC)"),
    ("MESHFAST_NOTIFY_POLL_S", "seconds between the leader's polls of the notification outbox (default 1)"),
    ("MESHFAST_NOTIFY_BACKOFF_S", "first retry delay of a notification, doubled per attempt up to 1 h (default 10)"),
    ("MESHFAST_NOTIFY_GIVE_UP_S", "seconds after which an undelivered notification is marked failed (default 86400)"),
    ("MESHFAST_NOTIFY_TIMEOUT_S", "seconds one webhook or SMTP delivery attempt may take (default 10)"),
    ("MESHFAST_NOTIFY_DIGEST_S", "seconds between the leader's checks for leadership digests due (default 60)"),
    ("MESHFAST_TAG_KEYS", "the keys callers may send in X-Meshfast-Tags, comma separated (default "
                          "platform,workflow,harness; each 1-32 of a-z 0-9 _ -)"),
    ("MESHFAST_JWKS_REFRESH_S", "seconds between fetches of a platform token issuer's jwks_url (default 300)"),
    ("MESHFAST_JWKS_MIN_INTERVAL_S", "least seconds between two fetches of one issuer's key set (default 10)"),
    ("MESHFAST_JWKS_MAX_AGE_S", "seconds a fetched key set is trusted after it was last confirmed; then its tokens "
                                "fail closed (default 86400)"),
    ("MESHFAST_TOKEN_ISSUER", "the iss of meshfast's own short-lived tokens (default meshfast)"),
    ("MESHFAST_OIDC_ISSUER", "admin login through this OIDC issuer (https; http only on a loopback address); "
                             "unset: no OIDC login"),
    ("MESHFAST_OIDC_CLIENT_ID", "meshfast's client id at the OIDC issuer (required with MESHFAST_OIDC_ISSUER)"),
    ("MESHFAST_OIDC_CLIENT_SECRET", "meshfast's client secret at the OIDC issuer (client_secret_basic; required)"),
    ("MESHFAST_OIDC_ROLE_CLAIM", "the ID token claim holding the admin's roles, a list or one string "
                                 "(default groups)"),
    ("MESHFAST_OIDC_REDIRECT_URL", "the callback URL as the browser sees it (default: from the request's Host "
                                   "and scheme + /admin/oidc/callback); set it behind a proxy"),
    ("MESHFAST_OIDC_PLATFORM_ROLE", "the role claim value of a platform administrator (default "
                                    "meshfast-platform-admin)"),
    ("MESHFAST_OIDC_BU_ROLE_PREFIX", "the prefix of a business-unit administrator's role claim value, followed by "
                                     "the unit's name (default meshfast-bu-admin:)"),
)

# X-Meshfast-Tags: the keys callers may send unless MESHFAST_TAG_KEYS says otherwise.
DEFAULT_TAG_KEYS = ("platform", "workflow", "harness")
_TAG_KEY = re.compile(r"[a-z0-9_-]{1,32}\Z")
# The summaries' own group_by names: a tag key may not shadow one.
# Realtime sessions drain for at most 30 minutes (the longest voice call served).
MAX_REALTIME_DRAIN_S = 1800.0
RESERVED_TAG_KEYS = frozenset({"business_unit", "manager", "tier", "tag", "principal_kind", "token_issuer",
                               "application_id"})


def tag_keys_env() -> tuple[str, ...]:
    """MESHFAST_TAG_KEYS as a tuple of keys (each once, in order); exits naming a bad one."""
    raw = os.environ.get("MESHFAST_TAG_KEYS", "").strip()
    if not raw:
        return DEFAULT_TAG_KEYS
    keys = tuple(dict.fromkeys(k.strip() for k in raw.split(",") if k.strip()))
    reserved = [k for k in keys if k in RESERVED_TAG_KEYS]
    if reserved:
        raise SystemExit(f"meshfast: MESHFAST_TAG_KEYS may not use {', '.join(reserved)}: the summaries group by "
                         "the row's own field of that name")
    bad = [k for k in keys if not _TAG_KEY.match(k)]
    if bad or not keys or len(keys) > 16:
        raise SystemExit(f"meshfast: MESHFAST_TAG_KEYS must list 1 to 16 keys of 1-32 of a-z 0-9 _ -, got {raw!r}")
    return keys


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"meshfast: {name} must be an integer, got {raw!r}") from None


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"meshfast: {name} must be a number, got {raw!r}") from None
    if value <= 0:
        raise SystemExit(f"meshfast: {name} must be positive")
    return value


# Granian's runtime options (granian.constants: Loops, TaskImpl, RuntimeModes); the defaults are Granian's.
GRANIAN_CHOICES: dict[str, tuple[str, ...]] = {
    # NOTE: uvloop unless told otherwise, chosen by measurement (bench-runtimes: less worker CPU per
    # call, more calls per second); not Granian's "auto", which takes rloop when it is installed,
    # and rloop cannot run meshfast (no create_unix_connection, which asyncpg needs for the
    # embedded database's socket). Where uvloop is not installed, asyncio.
    "MESHFAST_LOOP": ("uvloop", "asyncio", "auto", "rloop"),
    "MESHFAST_TASK_IMPL": ("asyncio", "rust"),
    "MESHFAST_RUNTIME_MODE": ("auto", "st", "mt"),
}


def _bounded_int_env(name: str, default: int, low: int, high: int) -> int:
    value = _int_env(name, default)
    if not low <= value <= high:
        raise SystemExit(f"meshfast: {name} must be a whole number from {low} to {high}, got {value}")
    return value


def _zone_env(name: str) -> str:
    """An IANA zone name both Python and the core know (refused at start, not at the first call)."""
    import zoneinfo

    from meshfast._core import Core, SnapshotError

    raw = (os.environ.get(name) or "UTC").strip()
    try:
        zoneinfo.ZoneInfo(raw)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        raise SystemExit(f"meshfast: {name} must be an IANA time zone, got {raw!r}") from None
    try:
        Core(b"zone-check").load(msgspec.msgpack.encode({"seq": 0, "calendar_tz": raw}))
    except SnapshotError:
        raise SystemExit(f"meshfast: {name} {raw!r} is not a zone the core knows") from None
    return raw


def _url_env(name: str) -> str | None:
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return None
    if not raw.startswith(("http://", "https://")) or any(c.isspace() or ord(c) < 32 for c in raw):
        raise SystemExit(f"meshfast: {name} must be an http:// or https:// URL, got {raw!r}")
    return raw


@dataclass(frozen=True, slots=True)
class OidcSettings:
    """Admin login through an OIDC issuer (meshfast.admin.oidc)."""

    issuer: str
    client_id: str
    # NOTE: kept out of repr: a logged settings object must not carry it.
    client_secret: str = field(repr=False)
    role_claim: str = "groups"
    redirect_url: str | None = None
    platform_role: str = "meshfast-platform-admin"
    bu_role_prefix: str = "meshfast-bu-admin:"

    @property
    def local(self) -> bool:
        """The issuer is on a loopback address (a test's or a developer's): plain http allowed."""
        return loopback_url(self.issuer)


def loopback_url(url: str) -> bool:
    host = (urlsplit(url).hostname or "").rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _oidc_url_problem(url: str, name: str, *, allow_http: bool) -> str | None:
    if not url.isascii() or not url.isprintable() or any(c in url for c in " \\"):
        return f"{name} may hold only printable ASCII without spaces or backslashes"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError:
        return f"{name} is not a valid URL"
    if not parts.hostname or "@" in parts.netloc or parts.fragment:
        return f"{name} must be an absolute URL without user info or fragment"
    if parts.scheme != "https" and not (parts.scheme == "http" and (allow_http or loopback_url(url))):
        return f"{name} must be an https:// URL (http:// only on a loopback address)"
    return None


def _oidc_env() -> OidcSettings | None:
    """MESHFAST_OIDC_*: None without an issuer; exits naming what is wrong with a configured one."""
    def env(name: str) -> str:
        return (os.environ.get(name) or "").strip()

    issuer, client_id, secret = env("MESHFAST_OIDC_ISSUER"), env("MESHFAST_OIDC_CLIENT_ID"), \
        os.environ.get("MESHFAST_OIDC_CLIENT_SECRET") or ""
    if not issuer:
        if client_id or secret:
            raise SystemExit("meshfast: MESHFAST_OIDC_CLIENT_ID and _CLIENT_SECRET need MESHFAST_OIDC_ISSUER")
        return None
    problem = _oidc_url_problem(issuer, "MESHFAST_OIDC_ISSUER", allow_http=False)
    if problem is None and urlsplit(issuer).query:
        problem = "MESHFAST_OIDC_ISSUER may not carry a query"
    if problem is not None:
        raise SystemExit(f"meshfast: {problem}, got {issuer!r}")
    if not client_id or not secret:
        raise SystemExit("meshfast: MESHFAST_OIDC_ISSUER needs MESHFAST_OIDC_CLIENT_ID and MESHFAST_OIDC_CLIENT_SECRET")
    redirect = env("MESHFAST_OIDC_REDIRECT_URL") or None
    if redirect is not None:
        # NOTE: http is the operator's choice here (a loopback or a plain-http test deployment);
        # the issuer refuses a redirect URI it does not have registered anyway.
        problem = _oidc_url_problem(redirect, "MESHFAST_OIDC_REDIRECT_URL", allow_http=True)
        if problem is not None:
            raise SystemExit(f"meshfast: {problem}, got {redirect!r}")
    role_claim = env("MESHFAST_OIDC_ROLE_CLAIM") or "groups"
    platform_role = env("MESHFAST_OIDC_PLATFORM_ROLE") or "meshfast-platform-admin"
    prefix = env("MESHFAST_OIDC_BU_ROLE_PREFIX") or "meshfast-bu-admin:"
    if platform_role.startswith(prefix):
        raise SystemExit("meshfast: MESHFAST_OIDC_PLATFORM_ROLE may not start with MESHFAST_OIDC_BU_ROLE_PREFIX")
    return OidcSettings(issuer=issuer, client_id=client_id, client_secret=secret, role_claim=role_claim,
                        redirect_url=redirect, platform_role=platform_role, bu_role_prefix=prefix)


def _default_loop() -> str:
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def _choice_env(name: str) -> str:
    choices = GRANIAN_CHOICES[name]
    default = _default_loop() if name == "MESHFAST_LOOP" else choices[0]
    raw = (os.environ.get(name) or default).strip().lower()
    if raw not in choices:
        raise SystemExit(f"meshfast: {name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


@dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path
    database_url: str | None
    gateway_database_url: str | None
    admin_token: str | None
    max_body_bytes: int
    reconcile_s: int
    shm_dir: Path
    log_level: str
    log_retention_days: int
    stream_idle_timeout_s: float
    upstream_connect_timeout_s: float
    upstream_client: str
    upstream_deadline_s: float
    admission_capacity: int
    inflight_ceiling: int
    memory_ceiling_bytes: int
    telemetry_ring_rows: int
    drain_timeout_s: float
    header_timeout_s: float
    # How long open realtime sessions go on after SIGTERM (then they are told to reconnect).
    realtime_drain_s: float
    body_idle_timeout_s: float
    body_timeout_s: float
    max_admin_body_bytes: int
    max_connections: int
    cookie_secure: bool
    backlog: int
    granian_loop: str = "asyncio"
    granian_task_impl: str = "asyncio"
    granian_runtime_mode: str = "auto"
    calendar_tz: str = "UTC"
    shm_slots: int = 1 << 20
    tag_keys: tuple[str, ...] = DEFAULT_TAG_KEYS
    # A local detection model for data protection's `person` and `address` (meshfast.dlp_model).
    dlp_model_url: str | None = None
    dlp_model_timeout_s: float = 0.5
    dlp_model_max_bytes: int = 1024 * 1024
    # Admin login through an OIDC issuer; None: not configured (its routes answer 404).
    oidc: OidcSettings | None = None

    @classmethod
    def from_env(cls) -> Settings:
        data_dir = Path(os.environ.get("MESHFAST_DATA_DIR") or Path.home() / ".meshfast").expanduser()
        return cls(
            data_dir=data_dir.resolve(),
            database_url=os.environ.get("DATABASE_URL") or None,
            gateway_database_url=os.environ.get("MESHFAST_GATEWAY_DATABASE_URL") or None,
            admin_token=os.environ.get("MESHFAST_ADMIN_TOKEN") or None,
            max_body_bytes=_int_env("MESHFAST_MAX_BODY_MB", 300) * 1024 * 1024,
            reconcile_s=max(1, _int_env("MESHFAST_RECONCILE_S", 45)),
            shm_dir=Path(os.environ.get("MESHFAST_SHM_DIR") or "/dev/shm"),
            log_level=(os.environ.get("MESHFAST_LOG_LEVEL") or "info").lower(),
            log_retention_days=_int_env("LOG_RETENTION_DAYS", 30),
            stream_idle_timeout_s=_float_env("MESHFAST_STREAM_IDLE_TIMEOUT_S", 300.0),
            upstream_connect_timeout_s=_float_env("MESHFAST_UPSTREAM_CONNECT_TIMEOUT_S", 5.0),
            upstream_client=(os.environ.get("MESHFAST_UPSTREAM_CLIENT") or "native").lower(),
            upstream_deadline_s=_float_env("MESHFAST_UPSTREAM_DEADLINE_S", 600.0),
            admission_capacity=max(1, _int_env("MESHFAST_ADMISSION_CAPACITY", 200)),
            inflight_ceiling=max(1, _int_env("MESHFAST_INFLIGHT_CEILING", 5000)),
            memory_ceiling_bytes=max(1, _int_env("MESHFAST_MEMORY_CEILING_MB", 1024)) * 1024 * 1024,
            # NOTE: the core takes 1..2^24 records and rounds up to a power of two.
            telemetry_ring_rows=min(1 << 24, max(16, _int_env("MESHFAST_TELEMETRY_RING_ROWS", 8192))),
            drain_timeout_s=_float_env("MESHFAST_DRAIN_TIMEOUT_S", 30.0),
            realtime_drain_s=min(MAX_REALTIME_DRAIN_S, max(0.0, _float_env("MESHFAST_REALTIME_DRAIN_S", 300.0))),
            # NOTE: Granian takes 1 ms to 60 s.
            header_timeout_s=min(60.0, _float_env("MESHFAST_HEADER_TIMEOUT_S", 30.0)),
            body_idle_timeout_s=_float_env("MESHFAST_BODY_IDLE_TIMEOUT_S", 10.0),
            body_timeout_s=_float_env("MESHFAST_BODY_TIMEOUT_S", 120.0),
            max_admin_body_bytes=max(1, _int_env("MESHFAST_MAX_ADMIN_BODY_KB", 1024)) * 1024,
            max_connections=max(1, _int_env("MESHFAST_MAX_CONNECTIONS", 1024)),
            cookie_secure=_int_env("MESHFAST_COOKIE_SECURE", 0) == 1,
            backlog=max(128, _int_env("MESHFAST_BACKLOG", 16384)),
            granian_loop=_choice_env("MESHFAST_LOOP"),
            granian_task_impl=_choice_env("MESHFAST_TASK_IMPL"),
            granian_runtime_mode=_choice_env("MESHFAST_RUNTIME_MODE"),
            calendar_tz=_zone_env("MESHFAST_CALENDAR_TZ"),
            shm_slots=_bounded_int_env("MESHFAST_SHM_SLOTS", 1 << 20, 1 << 12, 1 << 27),
            tag_keys=tag_keys_env(),
            dlp_model_url=_url_env("MESHFAST_DLP_MODEL_URL"),
            dlp_model_timeout_s=_bounded_int_env("MESHFAST_DLP_MODEL_TIMEOUT_MS", 500, 10, 10_000) / 1000,
            dlp_model_max_bytes=_bounded_int_env("MESHFAST_DLP_MODEL_MAX_KB", 1024, 1, 65_536) * 1024,
            oidc=_oidc_env(),
        )

    @property
    def secrets_path(self) -> Path:
        return self.data_dir / "secrets.json"

    @property
    def spool_dir(self) -> Path:
        return self.data_dir / "spool"

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pg"

    @property
    def shm_path(self) -> Path:
        # NOTE: named from the data dir so instances on one host never share a segment.
        digest = xxhash.xxh64_hexdigest(str(self.data_dir).encode())
        return self.shm_dir / f"meshfast-{digest}.seg"
