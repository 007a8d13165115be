"""Attribution tags (API.md "Identities"): ``X-Meshfast-Tags: platform=web;workflow=checkout;harness=ci``.

Tags are attribution, never authority: they land in the row, the summaries (``group_by=<key>``)
and the chargeback export. The keys callers may send are MESHFAST_TAG_KEYS (default
``platform,workflow,harness``); a value is 1 to 64 of ``[A-Za-z0-9._-]``. Anything else (an
unknown key, a key twice, a value out of shape, a header longer than the allowed pairs could be)
is 400 ``invalid_tags`` in the route's own error shape.
"""

from __future__ import annotations

import re

from meshfast import errors

MAX_VALUE = 64
_VALUE = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")


def parse(header: str, allowed: tuple[str, ...]) -> dict[str, str]:
    """The tags of one header value (empty pairs are skipped, whitespace around keys and values
    ignored); raises :class:`errors.InvalidTags` saying what is wrong."""
    # NOTE: bounded before any split: every allowed pair at its longest, with room for spaces.
    if len(header) > len(allowed) * (32 + MAX_VALUE + 8):
        raise errors.InvalidTags("X-Meshfast-Tags is too long")
    tags: dict[str, str] = {}
    for pair in header.split(";"):
        if not pair.strip():
            continue
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            raise errors.InvalidTags(f"X-Meshfast-Tags: {_shown(pair)} is not key=value")
        if key not in allowed:
            raise errors.InvalidTags(f"X-Meshfast-Tags: the key {_shown(key)} is not one of {', '.join(allowed)}")
        if key in tags:
            raise errors.InvalidTags(f"X-Meshfast-Tags: the key {key} is given twice")
        if not _VALUE.match(value):
            raise errors.InvalidTags(f"X-Meshfast-Tags: the value of {key} must be 1 to {MAX_VALUE} of "
                                     "A-Z a-z 0-9 . _ -")
        tags[key] = value
    return tags


def _shown(text: str) -> str:
    text = text.strip()[:32]
    return repr(text) if text.isascii() and text.isprintable() else "(not printable)"
