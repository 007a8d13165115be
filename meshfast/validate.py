"""What the admin plane takes: one table of limits, and one check that every string on its way to
PostgreSQL is one PostgreSQL can store.

PostgreSQL's ``text`` holds neither NUL nor a lone UTF-16 surrogate (asyncpg cannot even encode
one), a 10 MiB display name makes every listing 10 MB, and ``integer`` columns end at 2^31 - 1.
So each admin body is decoded with the limits below (msgspec ``Meta`` on the body structs: they
also appear in the OpenAPI document), and then :func:`check` walks the decoded value once:
strings, keys and nesting anywhere in it, including the free-form parts (templates, header maps)
and the structs this module does not annotate. Query parameters go through :func:`query`. Every
refusal is a 400 ``invalid_request`` that names the field.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import math
import zoneinfo
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from meshfast import errors
from meshfast._core import forbidden_address
from meshfast.store import sql

# --- the table ---------------------------------------------------------------------------------

INT32_MAX = 2**31 - 1
# Any string, list or object the types below do not limit more tightly (templates, passwords).
MAX_TEXT = 65_536
MAX_ITEMS = 1_000
# How deep JSON values nest (a provider's body templates): a few levels in practice.
MAX_DEPTH = 32
# A query parameter's value.
MAX_QUERY_TEXT = 1_024
# Filters take times in this range (datetime arithmetic overflows near years 1 and 9999).
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(3000, 1, 1, tzinfo=dt.UTC)

Email = Annotated[str, Meta(max_length=320)]
Name = Annotated[str, Meta(max_length=254)]  # providers, models, resolved models, aliases, tags, regions
DisplayName = Annotated[str, Meta(max_length=200)]
Label = Annotated[str, Meta(max_length=200)]  # business unit, tier, media type
Url = Annotated[str, Meta(max_length=2048)]
ApiKey = Annotated[str, Meta(max_length=4096)]
Id = Annotated[str, Meta(max_length=64)]  # a UUID in a body
Word = Annotated[str, Meta(max_length=64)]  # family, kind, HH:MM, time zone, HTTP method, mode
Path = Annotated[str, Meta(max_length=1024)]  # a dot path into a provider's answer
Names = Annotated[list[Name], Meta(max_length=256)]  # aliases, tags
Words = Annotated[list[Word], Meta(max_length=64)]
Positive = Annotated[int, Meta(ge=1, le=INT32_MAX)]
Int32 = Annotated[int, Meta(ge=-INT32_MAX - 1, le=INT32_MAX)]
Retries = Annotated[int, Meta(ge=0, le=100)]
BackoffMs = Annotated[int, Meta(ge=0, le=600_000)]
Percent = Annotated[int, Meta(ge=1, le=100)]
Weekday = Annotated[int, Meta(ge=0, le=6)]
Weekdays = Annotated[list[Weekday], Meta(max_length=7 * 4)]


# --- the walk ----------------------------------------------------------------------------------


def _field(where: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{where}[{name}]"
    return f"{where}.{name}" if where else name


def text_problem(value: str, max_length: int = MAX_TEXT) -> str | None:
    """Why PostgreSQL would not take ``value`` as text (or it is too long); None when it would."""
    if "\x00" in value:
        return "may not contain NUL (\\u0000)"
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            return "is not valid Unicode (a lone surrogate)"
    if len(value) > max_length:
        return f"is longer than {max_length} characters"
    return None


def check(value: Any, where: str = "", *, max_items: int = MAX_ITEMS) -> None:
    """400 naming the first field of ``value`` (a decoded body) that PostgreSQL could not store
    or that exceeds the generic limits; walks structs, lists and objects."""
    problem = _walk(value, where, 0, max_items)
    if problem is not None:
        raise errors.InvalidRequest(problem, errors=[problem])


def _walk(value: Any, where: str, depth: int, max_items: int) -> str | None:
    if isinstance(value, str):
        why = text_problem(value)
        return None if why is None else f"{where or 'value'} {why}"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where or 'value'} must be a finite number"
    if isinstance(value, (bool, int)) or value is None:
        return None
    if depth >= MAX_DEPTH:
        return f"{where or 'value'} nests deeper than {MAX_DEPTH} levels"
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            problem = _walk(getattr(value, name), _field(where, name), depth + 1, max_items)
            if problem is not None:
                return problem
        return None
    if isinstance(value, Mapping):
        if len(value) > max_items:
            return f"{where or 'value'} has more than {max_items} entries"
        for key, item in value.items():
            if isinstance(key, str):
                why = text_problem(key, MAX_QUERY_TEXT)
                if why is not None:
                    return f"a key of {where or 'the object'} {why}"
            problem = _walk(item, _field(where, str(key)), depth + 1, max_items)
            if problem is not None:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        if len(value) > max_items:
            return f"{where or 'value'} has more than {max_items} items"
        for i, item in enumerate(value):
            problem = _walk(item, _field(where, i), depth + 1, max_items)
            if problem is not None:
                return problem
    return None


def decode(body: bytes, kind: type[Any]) -> Any:
    """Strict JSON decoding of an admin body, then :func:`check`: unknown fields, wrong types,
    values out of range and strings PostgreSQL cannot store are 400s naming the field."""
    if not body.strip():
        raise errors.InvalidRequest("request body is empty")
    try:
        value = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise errors.InvalidRequest(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise errors.InvalidRequest(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise errors.InvalidRequest(f"the body nests deeper than {MAX_DEPTH} levels") from None
    check(value)
    return value


def convert(fields: Mapping[str, Any], kind: type[Any]) -> Any:
    """:func:`decode` for a body that did not come as JSON (the CLI's arguments): the same
    limits and checks (a struct built by calling it would skip them)."""
    try:
        value = msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise errors.InvalidRequest(str(exc)) from None
    check(value)
    return value


def control_problem(value: str) -> str | None:
    """Why ``value`` cannot go into an HTTP header or request line as is (control characters,
    line breaks, other non-printing characters); None when it can."""
    if not value.isprintable():
        return "may not contain control characters or line breaks"
    return None


# --- query parameters --------------------------------------------------------------------------


def query(raw: Mapping[str, str], known: set[str] | frozenset[str]) -> dict[str, str]:
    """A parsed query string's parameters, each one checked like a body string (at most
    :data:`MAX_QUERY_TEXT` characters); unknown parameters are a 400."""
    unknown = sorted(set(raw) - set(known))
    if unknown:
        shown = ", ".join(name if text_problem(name, 100) is None else repr(name[:100]) for name in unknown)
        raise errors.InvalidRequest(f"unknown query parameters: {shown}")
    for name, value in raw.items():
        why = text_problem(value, MAX_QUERY_TEXT)
        if why is not None:
            raise errors.InvalidRequest(f"{name} {why}", errors=[f"{name} {why}"])
    return dict(raw)


def moment(value: str | None, name: str) -> dt.datetime | None:
    """An ISO 8601 time filter (UTC when it names no offset), between :data:`EARLIEST` and
    :data:`LATEST`."""
    if value is None:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
        in_range = EARLIEST <= parsed <= LATEST
    except (ValueError, OverflowError):
        raise errors.InvalidRequest(f"{name} must be an ISO 8601 time") from None
    if not in_range:
        raise errors.InvalidRequest(f"{name} must be between {EARLIEST.date()} and {LATEST.date()}")
    return parsed


# --- time zones --------------------------------------------------------------------------------

# Names both Python (zoneinfo, which the log summaries use) and PostgreSQL (pg_timezone_names)
# know; chrono-tz in the core knows every IANA name. Filled once per process by
# :func:`load_timezones`; until then only zoneinfo's list is consulted.
_timezones: frozenset[str] | None = None


def _python_timezones() -> frozenset[str]:
    # NOTE: available_timezones() skips posix/ and right/ but lists whatever else the system
    # directory holds (localtime, posixrules); PostgreSQL's list drops those.
    return frozenset(name for name in zoneinfo.available_timezones()
                     if not name.startswith(("posix/", "right/")) and name not in ("localtime", "posixrules"))


async def load_timezones(conn: Any) -> frozenset[str]:
    """The zones both zoneinfo and PostgreSQL know (cached for the life of the process)."""
    global _timezones
    if _timezones is None:
        known = {row[0] for row in await conn.fetch(sql.TIMEZONE_NAMES)}
        _timezones = _python_timezones() & known
    return _timezones


def timezone(name: str, field: str, zones: frozenset[str] | None = None) -> str:
    """``name`` if it is a zone both Python and PostgreSQL know, else a 400 naming ``field``."""
    known = zones if zones is not None else (_timezones or _python_timezones())
    if name not in known:
        shown = name[:64] if text_problem(name) is None else "(not valid text)"
        raise errors.InvalidRequest(f"{field} must be an IANA time zone name known to PostgreSQL, "
                                    f"not {shown!r}", errors=[f"{field} is not a known time zone"])
    return name


# --- provider addresses (SSRF at create time) ---------------------------------------------------

# Names every resolver maps to the loopback interface (RFC 6761, /etc/hosts on common systems).
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "localhost6", "localhost6.localdomain6",
                             "ip6-localhost", "ip6-loopback"})
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._")


class BadHost(ValueError):
    """A host that no resolver reads the same way (an out-of-range number, odd characters)."""


def _ipv4_part(part: str) -> int:
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16
        if not digits:
            return 0
    elif len(part) > 1 and part[0] == "0":
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if not (digits.isascii() and digits.isalnum()):
        raise BadHost(part)
    try:
        return int(digits, base)
    except ValueError:
        raise BadHost(part) from None


def _ends_in_number(labels: list[str]) -> bool:
    last = labels[-1]
    return last.isascii() and (last.isdigit() or (last[:2] in ("0x", "0X") and all(
        c in "0123456789abcdefABCDEF" for c in last[2:])))


def host_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` (a URL's host, brackets removed) names by itself, read as a browser
    and ``inet_aton`` read it (``127.1``, ``0x7f000001``, ``2130706433``, ``0177.0.0.1``, a
    trailing dot); None for a name that must be resolved. Raises :class:`BadHost` for a host that
    looks numeric but is not a valid address."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise BadHost(host) from None
    labels = host.split(".")
    if len(labels) > 1 and labels[-1] == "":
        labels.pop()
    if not labels or not all(labels) or not _ends_in_number(labels):
        return None
    if len(labels) > 4:
        raise BadHost(host)
    numbers = [_ipv4_part(label) for label in labels]
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise BadHost(host)
    value = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def non_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Loopback, private, link-local, shared (100.64.0.0/10), multicast, unspecified, reserved
    or otherwise special-purpose, also when carried inside an IPv6 address: the core's list, the
    one the upstream clients check every resolved address against at connect time."""
    return forbidden_address(str(ip))


def url_problem(url: str, field: str, *, local: bool) -> str | None:
    """Why a provider URL is refused (None when it is taken): not an absolute http(s) URL, odd
    characters a parser could read two ways (control characters, whitespace, a backslash,
    user info), or, unless ``local``, a host that is a loopback, private, link-local, shared,
    multicast or unspecified address in any spelling, or a name for the loopback interface."""
    if not url.isascii() or not url.isprintable() or any(c in url for c in " \\"):
        return (f"{field} may hold only printable ASCII without spaces or backslashes "
                "(give an internationalised host in its xn-- form)")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError:
        return f"{field} is not a valid URL (its host or port)"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{field} must be an absolute http(s) URL"
    if "@" in parts.netloc:
        return f"{field} may not carry user info (user:password@)"
    host = parts.hostname
    try:
        ip = host_address(host)
    except BadHost:
        return f"{field} has an invalid host {host!r}"
    if ip is None and not set(host) <= _HOST_CHARS:
        return f"{field} has an invalid host {host!r}"
    if local:
        return None
    name = host.rstrip(".")
    if (ip is not None and non_public(ip)) or name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return (f"{field} points at a loopback, link-local, private, shared, multicast or unspecified address; "
                "set local: true to allow it")
    return None
