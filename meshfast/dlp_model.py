"""A local detection model beside data protection's pattern rules (issue "DLP", item 5).

When ``MESHFAST_DLP_MODEL_URL`` is set and an enabled policy sets an action for ``person`` or
``address``, each authenticated call's texts (the string values of its JSON body, less ids,
roles, media and the like) are sent to the model before the core decides::

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

import logging
import time
from typing import Any

import aiohttp
import msgspec

log = logging.getLogger("meshfast.dlp_model")

# Fields whose strings are not what a person wrote: ids, roles, formats, media (base64 or URLs).
_SKIP = frozenset({
    "model", "role", "type", "id", "tool_call_id", "tool_use_id", "call_id", "media_type", "mime_type", "mimeType",
    "data", "url", "image_url", "file_data", "file_id", "signature", "thoughtSignature", "encrypted_content",
    "format", "encoding_format", "detail", "cache_control", "stop_reason", "finish_reason", "previous_response_id",
    "service_tier", "reasoning_effort", "effort", "tool_choice", "response_format", "keep_alive",
})
_TYPES = {"person": "person", "per": "person", "name": "person",
          "address": "address", "location": "address", "loc": "address"}
_MAX_DEPTH = 64


class _Entity(msgspec.Struct):
    index: int
    start: int
    end: int
    type: str


class _Answer(msgspec.Struct):
    entities: list[_Entity]


def texts_of(body: bytes) -> list[str] | None:
    """The distinct texts of a JSON body, in order; None when it is not JSON (the core refuses such
    a body under a policy anyway)."""
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    out: dict[str, None] = {}

    def walk(v: Any, depth: int) -> None:
        if depth > _MAX_DEPTH:
            return
        if isinstance(v, str):
            if len(v.strip()) > 1:
                out[v] = None
        elif isinstance(v, dict):
            for key, item in v.items():
                if key not in _SKIP:
                    walk(item, depth + 1)
        elif isinstance(v, list):
            for item in v:
                walk(item, depth + 1)

    walk(value, 0)
    return list(out)


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
        texts = texts_of(body)
        if not texts:
            return [], False
        if sum(len(t) for t in texts) > self.max_bytes:
            self._warn("a call's texts exceed MESHFAST_DLP_MODEL_MAX_KB: not sent to the detection model")
            return [], True
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
            async with self._session.post(self.url, data=msgspec.json.encode({"texts": texts}),
                                          headers={"content-type": "application/json"}) as response:
                raw = await response.read()
                if response.status != 200:
                    self._warn(f"the detection model answered {response.status}")
                    return [], True
            answer = msgspec.json.decode(raw, type=_Answer)
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError, msgspec.ValidationError, OSError) as exc:
            self._warn(f"the detection model did not answer: {type(exc).__name__}")
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
