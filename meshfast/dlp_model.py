"""A local detection model beside data protection's pattern rules (issue "DLP", item 5).

When ``MESHFAST_DLP_MODEL_URL`` is set, a call that a policy with ``person`` or ``address`` covers
(known only once the core has found it authenticated, granted and within its caps, before
anything is reserved) has its texts sent to the model (:func:`texts_of`: every string and key of
its body at any depth, JSON inside strings, text inside base64), then the core decides again::

    POST <url>   {"texts": ["...", ...]}
    200          {"entities": [{"index": 0, "start": 5, "end": 17, "type": "person"}, ...]}

``start`` and ``end`` count characters (code points) in ``texts[index]``, as Presidio and most
NER servers do; ``type`` ``person`` (also ``per``, ``name``) or ``address`` (also ``location``,
``loc``), any case; other types are ignored. The values found go to the core
(``Core.prepare(dlp_found=...)``), which treats every occurrence of each as a match of its
detector in every text of the call, so block, redact and pseudonymize (with restore) work as for
the pattern rules. An error, a non-200, a malformed answer, a body with more text than
``MESHFAST_DLP_MODEL_MAX_KB`` or no answer within ``MESHFAST_DLP_MODEL_TIMEOUT_MS`` is a failure:
the core then blocks a call whose policies want those detectors (fail closed), and lets the others
through. Without a URL nothing here runs.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
import time
from typing import Any

import aiohttp
import msgspec

log = logging.getLogger("meshfast.dlp_model")

_TYPES = {"person": "person", "per": "person", "name": "person",
          "address": "address", "location": "address", "loc": "address"}
_BASE64 = re.compile(r"[A-Za-z0-9+/]{8,}={0,2}")
# The most values one answer may carry (the core takes at most as many): more is a failure.
MAX_VALUES = 10_000
# The largest answer read (10,000 entities fit several times over).
MAX_ANSWER_BYTES = 8 * 1024 * 1024


class _Entity(msgspec.Struct):
    index: int
    start: int
    end: int
    type: str


class _Answer(msgspec.Struct):
    entities: list[_Entity]


def texts_of(body: bytes) -> list[str] | None:
    """Every text of a JSON body the core may scan, distinct, in order: each string and each
    object key at any depth, what a string holds when it is JSON itself (a tool call's arguments,
    decoded), and the text inside base64 (a document, a ``data:`` URL) that decodes to UTF-8.
    None when the body is not JSON this reads."""
    try:
        value = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    out: dict[str, None] = {}
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            _add(v, out, stack)
        elif isinstance(v, dict):
            for key in v:
                _add(key, out, stack)
            stack.extend(reversed(v.values()))
        elif isinstance(v, list):
            stack.extend(reversed(v))
    return list(out)


def _add(text: str, out: dict[str, None], stack: list[Any]) -> None:
    if len(text.strip()) < 2 or text in out:
        return
    out[text] = None
    inner = text.strip()
    if inner[:1] in ("{", "["):
        with contextlib.suppress(msgspec.DecodeError, RecursionError):
            stack.append(msgspec.json.decode(inner))
        return
    payload = inner.partition(",")[2] if inner.startswith("data:") and ";base64," in inner[:200] else inner
    if _BASE64.fullmatch(payload) and len(payload) % 4 == 0:
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            decoded = base64.b64decode(payload, validate=True).decode()
            if decoded.isprintable() or all(c.isprintable() or c.isspace() for c in decoded):
                _add(decoded, out, stack)


class DetectionModel:
    """The model's client in one worker: a pooled session, a timeout per call."""

    def __init__(self, url: str, timeout_s: float, max_bytes: int) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None
        self._last_warning = 0.0

    async def find(self, body: bytes) -> tuple[list[tuple[str, str]], bool]:
        """(type, value) pairs the model found in ``body``'s texts, and whether it failed."""
        if len(body) > self.max_bytes:
            # NOTE: before decoding it: a large body is not read on the serving loop for nothing.
            self._warn("a call's body exceeds MESHFAST_DLP_MODEL_MAX_KB: not sent to the detection model")
            return [], True
        texts = texts_of(body)
        if texts is None:
            # NOTE: fail closed: what this cannot read, the core may (a deeper body).
            self._warn("a call's body is not JSON the detection model's client reads")
            return [], True
        if not texts:
            return [], False
        if sum(len(t.encode()) for t in texts) > self.max_bytes:
            self._warn("a call's texts exceed MESHFAST_DLP_MODEL_MAX_KB: not sent to the detection model")
            return [], True
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
            async with self._session.post(self.url, data=msgspec.json.encode({"texts": texts}),
                                          headers={"content-type": "application/json"}) as response:
                if response.status != 200:
                    self._warn(f"the detection model answered {response.status}")
                    return [], True
                raw = bytearray()
                async for chunk in response.content.iter_chunked(65536):
                    raw += chunk
                    if len(raw) > MAX_ANSWER_BYTES:
                        self._warn(f"the detection model answered more than {MAX_ANSWER_BYTES} bytes")
                        return [], True
            answer = msgspec.json.decode(bytes(raw), type=_Answer)
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError, msgspec.ValidationError, OSError) as exc:
            self._warn(f"the detection model did not answer: {type(exc).__name__}")
            return [], True
        if len(answer.entities) > MAX_VALUES:
            self._warn(f"the detection model answered more than {MAX_VALUES} entities")
            return [], True
        found: dict[tuple[str, str], None] = {}
        for e in answer.entities:
            kind = _TYPES.get(e.type.lower())
            if kind is None:
                continue
            if not (0 <= e.index < len(texts) and 0 <= e.start < e.end <= len(texts[e.index])):
                self._warn("the detection model answered a span outside its text")
                return [], True
            value = texts[e.index][e.start:e.end].strip()
            if len(value) > 1:
                found[(kind, value)] = None
        return list(found), False

    def _warn(self, message: str) -> None:
        # NOTE: at most one line every 10 s: a model that is down must not flood the log.
        now = time.monotonic()
        if now - self._last_warning >= 10.0:
            self._last_warning = now
            log.warning("%s (calls its policies apply to are blocked)", message)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
