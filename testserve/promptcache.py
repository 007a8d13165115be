"""A prompt-cache emulation for the `promptcache` scenario, so the effect of meshfast's cache
shaping can be measured: what a request reads from and writes to the provider's cache depends on
what earlier requests left there, as with the real APIs.

- **Anthropic** caches a prefix only up to a `cache_control` breakpoint (tools, then system, then
  the messages' blocks, in prompt order). A request reads the longest cached prefix ending at a
  block boundary up to its last breakpoint (Anthropic looks back from each breakpoint), and
  writes every breakpoint prefix of at least 1,024 tokens with the breakpoint's TTL (5 minutes,
  or one hour with `"ttl": "1h"`); a read refreshes the entry.
- **OpenAI** (Chat and Responses) caches automatically, prefixes of at least 1,024 tokens in
  128-token steps, but a prefix is found only on the machine that served it: requests with the
  same `prompt_cache_key` go to the same one of four machines, others are spread round robin.

Tokens are estimated as JSON bytes / 4. The state is per testserve process and per model.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from typing import Any

MIN_CACHED_TOKENS = 1024
OPENAI_STEP = 128
MACHINES = 4
TTL_S = {"5m": 300.0, "1h": 3600.0}

_lock = threading.Lock()
# (scope, prefix hash) -> expiry (monotonic seconds)
_entries: dict[tuple[str, bytes], float] = {}
_round_robin = itertools.count()


class Usage:
    """What a request's prompt cost: ``total`` prompt tokens, of which ``read`` came from the cache and
    ``write_5m`` / ``write_1h`` were written to it."""

    __slots__ = ("total", "read", "write_5m", "write_1h")

    def __init__(self, total: int, read: int = 0, write_5m: int = 0, write_1h: int = 0) -> None:
        self.total, self.read, self.write_5m, self.write_1h = total, read, write_5m, write_1h

    @property
    def uncached(self) -> int:
        return max(0, self.total - self.read - self.write_5m - self.write_1h)


def _tokens(item: Any) -> int:
    return max(1, len(json.dumps(item, separators=(",", ":"), sort_keys=True)) // 4)


def _prefixes(items: list[Any]) -> tuple[list[int], list[bytes]]:
    """Cumulative tokens and a chained hash at each item boundary."""
    tokens, hashes, total, h = [], [], 0, hashlib.sha256()
    for item in items:
        payload = dict(item) if isinstance(item, dict) else item
        if isinstance(payload, dict):
            payload.pop("cache_control", None)  # a breakpoint does not change the prefix
        h.update(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        total += _tokens(payload)
        tokens.append(total)
        hashes.append(h.copy().digest())
    return tokens, hashes


def anthropic(model: str, body: dict[str, Any]) -> Usage:
    items: list[Any] = []
    marks: list[tuple[int, str]] = []  # (item index, ttl)

    def add(item: Any) -> None:
        items.append(item)
        control = item.get("cache_control") if isinstance(item, dict) else None
        if isinstance(control, dict):
            marks.append((len(items) - 1, control.get("ttl") or "5m"))

    for tool in body.get("tools") or []:
        add(tool)
    system = body.get("system")
    if isinstance(system, str):
        add({"type": "text", "text": system})
    elif isinstance(system, list):
        for part in system:
            add(part)
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            add({"role": message.get("role"), "type": "text", "text": content})
        elif isinstance(content, list):
            for block in content:
                add({"role": message.get("role"), **block} if isinstance(block, dict) else block)
    tokens, hashes = _prefixes(items)
    total = tokens[-1] if tokens else 1
    if not marks:
        return Usage(total)
    now = time.monotonic()
    scope = f"anthropic:{model}"
    last = marks[-1][0]
    read = 0
    written = {"5m": 0, "1h": 0}
    with _lock:
        for i in range(last, -1, -1):
            key = (scope, hashes[i])
            expiry = _entries.get(key)
            if expiry is not None and expiry > now:
                read = tokens[i]
                break
        for index, ttl in marks:
            if tokens[index] < MIN_CACHED_TOKENS:
                continue
            key = (scope, hashes[index])
            fresh = _entries.get(key, 0.0) <= now
            _entries[key] = now + TTL_S.get(ttl, TTL_S["5m"])
            if fresh and tokens[index] > read:
                # Each new entry is billed for the tokens beyond what was read or written before it.
                already = read + written["5m"] + written["1h"]
                written["1h" if ttl == "1h" else "5m"] += max(0, tokens[index] - already)
    return Usage(total, read, written["5m"], written["1h"])


def openai(model: str, body: dict[str, Any], items_key: str = "messages") -> Usage:
    items: list[Any] = list(body.get("tools") or [])
    if items_key == "input" and body.get("instructions"):
        items.append({"instructions": body["instructions"]})
    raw = body.get(items_key)
    if isinstance(raw, str):
        items.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        items.extend(raw)
    tokens, hashes = _prefixes(items)
    total = tokens[-1] if tokens else 1
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        machine = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % MACHINES
    else:
        machine = next(_round_robin) % MACHINES
    scope = f"openai:{model}:{machine}"
    now = time.monotonic()
    read = 0
    with _lock:
        for i in range(len(items) - 1, -1, -1):
            expiry = _entries.get((scope, hashes[i]))
            if expiry is not None and expiry > now:
                read = tokens[i]
                break
        for i, count in enumerate(tokens):
            if count >= MIN_CACHED_TOKENS:
                _entries[(scope, hashes[i])] = now + TTL_S["5m"]
    if read < MIN_CACHED_TOKENS:
        read = 0
    return Usage(total, read - read % OPENAI_STEP if read else 0)


def reset() -> None:
    """Forget every cached prefix (tests and benches start cold)."""
    with _lock:
        _entries.clear()
