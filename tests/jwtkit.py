"""A test issuer: key pairs of every algorithm meshfast verifies, JWK Sets of them, tokens
signed by them (and forged ones), and a local JWKS server whose set can be swapped or broken."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int_bytes(n: int) -> bytes:
    return n.to_bytes((n.bit_length() + 7) // 8, "big")


@dataclass
class SigningKey:
    alg: str
    kid: str
    private: Any

    def jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        if self.alg == "RS256":
            numbers = public.public_numbers()
            return {"kty": "RSA", "kid": self.kid, "alg": "RS256", "use": "sig",
                    "n": b64(_int_bytes(numbers.n)), "e": b64(_int_bytes(numbers.e))}
        if self.alg == "ES256":
            numbers = public.public_numbers()
            return {"kty": "EC", "crv": "P-256", "kid": self.kid, "alg": "ES256",
                    "x": b64(numbers.x.to_bytes(32, "big")), "y": b64(numbers.y.to_bytes(32, "big"))}
        raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
        return {"kty": "OKP", "crv": "Ed25519", "kid": self.kid, "alg": "EdDSA", "x": b64(raw)}

    def sign(self, data: bytes) -> bytes:
        if self.alg == "RS256":
            return self.private.sign(data, padding.PKCS1v15(), hashes.SHA256())
        if self.alg == "ES256":
            r, s = decode_dss_signature(self.private.sign(data, ec.ECDSA(hashes.SHA256())))
            return r.to_bytes(32, "big") + s.to_bytes(32, "big")
        return self.private.sign(data)


def new_key(alg: str, kid: str) -> SigningKey:
    if alg == "RS256":
        return SigningKey(alg, kid, rsa.generate_private_key(public_exponent=65537, key_size=2048))
    if alg == "ES256":
        return SigningKey(alg, kid, ec.generate_private_key(ec.SECP256R1()))
    return SigningKey(alg, kid, ed25519.Ed25519PrivateKey.generate())


def jwks(*keys: SigningKey) -> dict[str, Any]:
    return {"keys": [k.jwk() for k in keys]}


def encode(header: dict[str, Any], claims: dict[str, Any], sign: Any) -> str:
    signing_input = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())
    return signing_input + "." + b64(sign(signing_input.encode()))


@dataclass
class Issuer:
    name: str
    audience: str = "meshfast-tests"
    keys: dict[str, SigningKey] = field(default_factory=dict)

    def claims(self, email: str, /, **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        out = {"iss": self.name, "aud": self.audience, "sub": f"sub-{email}", "email": email, "iat": now,
               "exp": now + 600}
        out.update(extra)
        return {k: v for k, v in out.items() if v is not None}

    def token(self, email: str, key: SigningKey | None = None, header: dict[str, Any] | None = None, /,
              **claims: Any) -> str:
        key = key or next(iter(self.keys.values()))
        head = {"alg": key.alg, "typ": "JWT", "kid": key.kid}
        head.update(header or {})
        return encode({k: v for k, v in head.items() if v is not None}, self.claims(email, **claims), key.sign)


def hs256_with_public_key(issuer: Issuer, key: SigningKey, email: str) -> str:
    """The algorithm-confusion forgery: HS256 keyed with the issuer's public key."""
    secret = json.dumps(key.jwk()).encode()
    return encode({"alg": "HS256", "typ": "JWT", "kid": key.kid}, issuer.claims(email),
                  lambda data: hmac.new(secret, data, hashlib.sha256).digest())


def unsigned(issuer: Issuer, email: str, kid: str) -> str:
    return encode({"alg": "none", "typ": "JWT", "kid": kid}, issuer.claims(email), lambda data: b"")


class JwksServer:
    """Serves ``document`` at /jwks.json (``failing``: HTTP 500 instead); counts fetches."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = {"keys": []}
        self.failing = False
        self.fetches = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.fetches += 1
                if outer.failing or self.path != "/jwks.json":
                    self.send_response(500 if outer.failing else 404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                body = json.dumps(outer.document).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/jwks.json"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
