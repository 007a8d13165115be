"""The web dashboard: static assets shipped in the wheel, served at ``/dashboard``.

The page and its assets are public (it opens on the login form); every piece of data it shows
comes from ``/admin/*`` with the session cookie and CSRF header. Assets are read once, on the
first request a worker sees, never at import.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from meshfast import errors

PREFIX = "/dashboard"
# NOTE: no inline script or style anywhere, so the policy can forbid both; charts are SVG built
# through the DOM, which 'self' scripts may do.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}
_ASSETS = ("app.js", "app.css")
_VERSION_MARK = "{{version}}"


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str
    cache_control: str


@cache
def assets() -> dict[str, Asset]:
    """Asset name (``""`` for the page) to its bytes and headers."""
    root = resources.files(__package__)
    out: dict[str, Asset] = {}
    digest = hashlib.sha256()
    for name in _ASSETS:
        body = root.joinpath(name).read_bytes()
        digest.update(body)
        # Revalidated after an hour; the page names them with ?v=<hash>, so an upgrade is seen at once.
        out[name] = Asset(body, _TYPES[name.rsplit(".", 1)[1]], _etag(body), "public, max-age=3600")
    version = digest.hexdigest()[:12]
    page = root.joinpath("index.html").read_text().replace(_VERSION_MARK, version).encode()
    out[""] = Asset(page, _TYPES["html"], _etag(page), "no-cache")
    return out


def _etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:16] + '"'


def serve(proto: Any, path: str, method: str, headers: Any) -> None:
    """``GET``/``HEAD /dashboard`` and ``/dashboard/<asset>``; anything else under it is a 404."""
    if method not in ("GET", "HEAD"):
        raise errors.MethodNotAllowed()
    name = path[len(PREFIX):].lstrip("/")
    if name == "index.html":
        name = ""
    asset = assets().get(name)
    if asset is None:
        raise errors.NotFound()
    response_headers = [
        ("content-type", asset.content_type),
        ("cache-control", asset.cache_control),
        ("etag", asset.etag),
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("cross-origin-opener-policy", "same-origin"),
    ]
    if headers is not None and headers.get("if-none-match") == asset.etag:
        proto.response_empty(304, response_headers)
        return
    proto.response_bytes(200, response_headers, b"" if method == "HEAD" else asset.body)
