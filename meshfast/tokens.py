"""meshfast's own platform tokens: short-lived data-plane tokens for a logged-in dashboard user.

They are Ed25519-signed JWTs (``alg: EdDSA``) from meshfast's own issuer. The signing key is
derived from the master key (HMAC-SHA256 with a fixed label), so every instance sharing the
secrets file signs with, publishes (``GET /.well-known/jwks.json``) and verifies the same key,
and no key is stored anywhere else. The data plane verifies them like any configured issuer's
(the snapshot carries the issuer, see :func:`own_issuer`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import os
import secrets
import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ENV_TOKEN_ISSUER = "MESHFAST_TOKEN_ISSUER"
DEFAULT_ISSUER = "meshfast"
AUDIENCE = "meshfast"
# A session token's lifetime (POST /admin/session-token).
TOKEN_TTL_S = 900
_LABEL = b"meshfast platform token signing key v1"


def issuer_name() -> str:
    """The ``iss`` of meshfast's own tokens (MESHFAST_TOKEN_ISSUER, default ``meshfast``)."""
    return os.environ.get(ENV_TOKEN_ISSUER) or DEFAULT_ISSUER


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@functools.lru_cache(maxsize=4)
def _keys(master_key: bytes) -> tuple[Ed25519PrivateKey, bytes, str]:
    seed = hmac.new(master_key, _LABEL, hashlib.sha256).digest()
    private = Ed25519PrivateKey.from_private_bytes(seed)
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    kid = b64url(hashlib.sha256(public).digest()[:12])
    return private, public, kid


def jwks(master_key: bytes) -> dict[str, Any]:
    """The public JWK Set of meshfast's own tokens."""
    _, public, kid = _keys(master_key)
    return {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": b64url(public), "kid": kid, "alg": "EdDSA",
                      "use": "sig"}]}


def own_issuer(master_key: bytes) -> dict[str, Any]:
    """meshfast's own issuer as the snapshot's config carries it."""
    return {"id": "meshfast", "issuer": issuer_name(), "audiences": [AUDIENCE], "algorithms": ["EdDSA"],
            "clock_skew_s": 30, "claims": {"email": "email"}, "jit_provisioning": False,
            "jwks": json.dumps(jwks(master_key)), "good_until_ms": None}


def sign(private: Ed25519PrivateKey, kid: str | None, claims: dict[str, Any], alg: str = "EdDSA") -> str:
    header = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signing_input = (b64url(json.dumps(header, separators=(",", ":")).encode()) + "." +
                     b64url(json.dumps(claims, separators=(",", ":")).encode()))
    return signing_input + "." + b64url(private.sign(signing_input.encode()))


def mint(master_key: bytes, user_id: str, email: str, ttl_s: int = TOKEN_TTL_S) -> tuple[str, int]:
    """A data-plane token for the user (``sub`` their id, ``email`` their address): the token and
    its expiry (Unix seconds)."""
    private, _, kid = _keys(master_key)
    now = int(time.time())
    claims = {"iss": issuer_name(), "aud": AUDIENCE, "sub": user_id, "email": email, "iat": now,
              "exp": now + ttl_s, "jti": secrets.token_urlsafe(12)}
    return sign(private, kid, claims), now + ttl_s
