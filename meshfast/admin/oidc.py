"""Admin login through an OIDC issuer: the authorization code flow with PKCE (API.md "Governed
lifecycle"; configured by MESHFAST_OIDC_*, see :class:`meshfast.settings.OidcSettings`).

``GET /admin/oidc/login`` begins an attempt: a random ``state`` and ``nonce``, stored server side
(``admin_oidc_attempts``, keyed by the state's SHA-256, 10 minutes) so any worker of any instance
can finish it, and bound to the browser by a short-lived HttpOnly cookie holding the state. The
PKCE ``code_verifier`` is not stored: it is the state keyed-hashed with the instance's pepper
(instances share it), so the table holds nothing that completes a login. The answer is a 302 to
the issuer's authorization endpoint. The route needs no credentials, so it is throttled per
address with password login's bucket, and the pending attempts are capped.

``GET /admin/oidc/callback`` finishes it: the state must be the cookie's and name a live attempt,
which one DELETE consumes (a replay finds nothing); the code is exchanged at the token endpoint
(client_secret_basic, the verifier, the same redirect URI); the ID token is verified here, offline,
against the issuer's key set (RS256, ES256 or EdDSA; never ``none`` nor an HMAC): ``iss``,
``aud`` (and ``azp`` with several audiences), ``exp``/``iat``/``nbf`` within a minute's skew and
the attempt's ``nonce``. The role claim makes a platform administrator (``admins.is_super``) or a
business-unit administrator of the named units that exist; the issuer is authoritative, so each
login sets both. The admin is found by email or created with a password hash that verifies no
password. The session is password login's: same cookies, same lifetime.

The issuer's discovery document and key set are cached per worker (an hour); an ID token whose
``kid`` is unknown refetches the set, at most once per MESHFAST_JWKS_MIN_INTERVAL_S. The issuer is
the operator's own choice, so its addresses are not held to the providers' public-address rule;
its endpoints must be https unless the issuer itself is on a loopback address.

Secrets (the client secret, codes, tokens, the state) are never logged, audited or answered.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote_plus, urlencode, urlsplit

import asyncpg
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from meshfast import errors, validate
from meshfast.admin import auth, issuers
from meshfast.admin.routes import Reply
from meshfast.settings import OidcSettings
from meshfast.store import oidc as oidc_sql
from meshfast.store import sql

log = logging.getLogger("meshfast.admin.oidc")

STATE_COOKIE = "mesh_oidc_state"
STATE_COOKIE_PATH = "/admin/oidc"
ATTEMPT_TTL = dt.timedelta(minutes=10)
# Logins begun and not finished, across the cluster: past this, new ones wait (429) for old ones
# to finish or expire. The per-address throttle keeps one source far below it.
MAX_PENDING_ATTEMPTS = 10_000
SCOPE = "openid email profile"
DISCOVERY_TTL_S = 3600.0
JWKS_TTL_S = 3600.0
CLOCK_SKEW_S = 60
FETCH_TIMEOUT_S = 10.0
MAX_DOCUMENT_BYTES = 64 * 1024
MAX_TOKEN_RESPONSE_BYTES = 64 * 1024
MAX_ID_TOKEN_BYTES = 16 * 1024
MAX_QUERY_BYTES = 8 * 1024
MAX_ROLE_VALUES = 256
MAX_UNIT_NAME = 128
ALGORITHMS = issuers.ALGORITHMS
# The password hash of an admin the issuer created: no password verifies against it (argon2 reads
# it as an invalid hash), and password login refuses it as an unknown password (auth.login).
NO_PASSWORD = auth.NO_PASSWORD
AUDIT_LOGIN = "admin.oidc_login"
AUDIT_FAILED = "admin.oidc_login_failed"

_B64URL = re.compile(r"[A-Za-z0-9_-]*\Z")
# A Host header: a name or IPv4 address, or a bracketed IPv6 address, and an optional port.
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])(?::\d{1,5})?\Z")


class IdTokenError(ValueError):
    """Why an ID token does not verify (for the log; the caller answers ``invalid_id_token``)."""


@dataclass(frozen=True, slots=True)
class Metadata:
    """The parts of the issuer's discovery document the flow uses."""

    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


@dataclass(frozen=True, slots=True)
class PublicKey:
    kid: str | None
    alg: str
    key: Any


# --- the ID token (JWS compact serialization, RFC 7515/7519) --------------------------------------


def _b64decode(part: str) -> bytes:
    if len(part) % 4 == 1 or not _B64URL.match(part):
        raise IdTokenError("not base64url")
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise IdTokenError("not base64url") from None


def _int(part: str) -> int:
    return int.from_bytes(_b64decode(part), "big")


def header(token: str) -> tuple[str, str | None]:
    """The (alg, kid) of a token's protected header; raises :class:`IdTokenError` for a token
    that is not a JWS with an allowed algorithm (``none`` and the HMACs never are)."""
    if len(token) > MAX_ID_TOKEN_BYTES or token.count(".") != 2:
        raise IdTokenError("not a compact JWS")
    try:
        head = json.loads(_b64decode(token.split(".", 1)[0]))
    except ValueError:
        raise IdTokenError("the header is not JSON") from None
    if not isinstance(head, dict):
        raise IdTokenError("the header is not an object")
    alg, kid = head.get("alg"), head.get("kid")
    if alg not in ALGORITHMS:
        raise IdTokenError(f"algorithm {str(alg)[:16]!r} is not one of {', '.join(ALGORITHMS)}")
    if "crit" in head:
        raise IdTokenError("critical header parameters are not understood")
    if kid is not None and not isinstance(kid, str):
        raise IdTokenError("kid is not a string")
    return alg, kid


def public_keys(jwks_text: str) -> list[PublicKey]:
    """The signing keys of a JWK Set usable for :data:`ALGORITHMS` (the core's rules: RSA of at
    least 2048 bits, EC on P-256, Ed25519; a key's ``alg``, when given, must be its type's)."""
    doc = json.loads(jwks_text)
    found: list[PublicKey] = []
    for jwk in doc.get("keys", []) if isinstance(doc, dict) else []:
        if not isinstance(jwk, dict) or jwk.get("use") not in (None, "sig"):
            continue
        kid = jwk.get("kid") if isinstance(jwk.get("kid"), str) else None
        try:
            kty, crv = jwk.get("kty"), jwk.get("crv")
            key: Any
            if kty == "RSA":
                alg = "RS256"
                key = rsa.RSAPublicNumbers(_int(jwk["e"]), _int(jwk["n"])).public_key()
                if key.key_size < 2048:
                    continue
            elif kty == "EC" and crv == "P-256":
                alg = "ES256"
                x, y = _b64decode(jwk["x"]), _b64decode(jwk["y"])
                if len(x) != 32 or len(y) != 32:
                    continue
                key = ec.EllipticCurvePublicNumbers(int.from_bytes(x, "big"), int.from_bytes(y, "big"),
                                                    ec.SECP256R1()).public_key()
            elif kty == "OKP" and crv == "Ed25519":
                alg = "EdDSA"
                key = ed25519.Ed25519PublicKey.from_public_bytes(_b64decode(jwk["x"]))
            else:
                continue
        except (KeyError, TypeError, ValueError):
            continue  # a malformed key (or a point off the curve) is left out, as the core does
        if jwk.get("alg") not in (None, alg):
            continue
        found.append(PublicKey(kid, alg, key))
    return found


def _signature_ok(key: PublicKey, signing_input: bytes, signature: bytes) -> bool:
    try:
        if key.alg == "RS256":
            key.key.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
        elif key.alg == "ES256":
            if len(signature) != 64:
                return False
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
            key.key.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
        else:
            key.key.verify(signature, signing_input)
    except InvalidSignature:
        return False
    return True


def verify_id_token(token: str, keys: Sequence[PublicKey], *, issuer: str, client_id: str, nonce: str,
                    now_s: float, skew_s: int = CLOCK_SKEW_S) -> dict[str, Any]:
    """The claims of an ID token that verifies (OIDC Core 3.1.3.7); raises :class:`IdTokenError`
    naming the first check it fails. ``keys``: the issuer's keys that may have signed it."""
    alg, kid = header(token)
    head_part, claims_part, signature_part = token.split(".")
    candidates = [k for k in keys if k.alg == alg and (kid is None or k.kid == kid)]
    if not candidates:
        raise IdTokenError("no key of the issuer's set has this kid and algorithm")
    signing_input = f"{head_part}.{claims_part}".encode("ascii")
    signature = _b64decode(signature_part)
    if not any(_signature_ok(k, signing_input, signature) for k in candidates):
        raise IdTokenError("the signature does not verify")
    try:
        claims = json.loads(_b64decode(claims_part))
    except ValueError:
        raise IdTokenError("the claims are not JSON") from None
    if not isinstance(claims, dict):
        raise IdTokenError("the claims are not an object")
    if claims.get("iss") != issuer:
        raise IdTokenError("iss is not the issuer")
    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
    if client_id not in audiences:
        raise IdTokenError("aud does not name this client")
    azp = claims.get("azp")
    if (len(audiences) > 1 or azp is not None) and azp != client_id:
        raise IdTokenError("azp is not this client")

    def number(name: str, required: bool) -> float | None:
        value = claims.get(name)
        if value is None and not required:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise IdTokenError(f"{name} is not a number")
        return float(value)

    exp, iat, nbf = number("exp", True), number("iat", True), number("nbf", False)
    assert exp is not None and iat is not None
    if exp + skew_s <= now_s:
        raise IdTokenError("the token has expired")
    if iat - skew_s > now_s or (nbf is not None and nbf - skew_s > now_s):
        raise IdTokenError("the token is not valid yet")
    got = claims.get("nonce")
    if not isinstance(got, str) or not hmac.compare_digest(got.encode(), nonce.encode()):
        raise IdTokenError("nonce is not the login's")
    return claims


# --- what the claims say ---------------------------------------------------------------------------


def role_values(claims: dict[str, Any], claim: str) -> list[str]:
    """The role claim's values: a list of strings or one string, at a top-level name or, when
    there is none, a dotted path (``realm_access.roles``)."""
    value: Any = claims.get(claim)
    if value is None and "." in claim:
        value = claims
        for part in claim.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value[:MAX_ROLE_VALUES] if isinstance(v, str)]
    return []


def roles(claims: dict[str, Any], settings: OidcSettings) -> tuple[bool, list[str]]:
    """(platform administrator, names of the business units the claims make an administrator of)."""
    values = role_values(claims, settings.role_claim)
    prefix = settings.bu_role_prefix
    units = sorted({v[len(prefix):] for v in values
                    if v.startswith(prefix) and 0 < len(v) - len(prefix) <= MAX_UNIT_NAME})
    return settings.platform_role in values, units


def verified_email(claims: dict[str, Any]) -> str:
    """The ``email`` claim as admins are keyed (trimmed, lowercased); refused when missing, not an
    address, or said to be unverified (``email_verified`` false)."""
    email = claims.get("email")
    verified = claims.get("email_verified")
    if verified is False or (isinstance(verified, str) and verified.lower() == "false"):
        raise IdTokenError("the email is not verified")
    if not isinstance(email, str):
        raise IdTokenError("no email claim")
    email = email.strip().lower()
    if (len(email) > 320 or email.count("@") != 1 or email.startswith("@") or email.endswith("@")
            or any(c.isspace() for c in email) or validate.text_problem(email) is not None):
        raise IdTokenError("the email claim is not an address")
    return email


# --- the issuer over HTTP --------------------------------------------------------------------------


async def _read(response: Any, max_bytes: int) -> bytes:
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(16 * 1024):
        size += len(chunk)
        if size > max_bytes:
            raise ValueError(f"the answer is larger than {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _http(method: str, url: str, *, max_bytes: int, data: dict[str, str] | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One request to the issuer: (status, the body as JSON, None when it is not JSON). No
    redirects followed, a total timeout, a bounded body."""
    import aiohttp

    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async with session.request(method, url, data=data, allow_redirects=False,
                                   headers={"accept": "application/json", **(headers or {})}) as response:
            body = await _read(response, max_bytes)
            status = response.status
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


class IssuerClient:
    """The issuer's discovery document and key set, fetched when first needed and cached."""

    def __init__(self, settings: OidcSettings) -> None:
        self._settings = settings
        self._metadata: Metadata | None = None
        self._metadata_at = -math.inf
        self._keys: list[PublicKey] = []
        self._keys_at = -math.inf
        self._lock = asyncio.Lock()

    def _endpoint(self, doc: dict[str, Any], name: str) -> str:
        url = doc.get(name)
        if not isinstance(url, str) or len(url) > 2048:
            raise ValueError(f"the discovery document has no {name}")
        problem = validate.url_problem(url, name, local=True)
        if problem is not None:
            raise ValueError(problem)
        if urlsplit(url).scheme != "https" and not self._settings.local:
            raise ValueError(f"{name} is not https")
        return url

    async def metadata(self) -> Metadata:
        """The discovery document (cached DISCOVERY_TTL_S); 502 ``oidc_unavailable`` when the
        issuer does not answer one naming itself."""
        if self._metadata is not None and time.monotonic() - self._metadata_at < DISCOVERY_TTL_S:
            return self._metadata
        async with self._lock:
            if self._metadata is not None and time.monotonic() - self._metadata_at < DISCOVERY_TTL_S:
                return self._metadata
            url = self._settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
            try:
                status, doc = await _http("GET", url, max_bytes=MAX_DOCUMENT_BYTES)
                if status != 200 or not isinstance(doc, dict):
                    raise ValueError(f"the discovery document answered HTTP {status}")
                if doc.get("issuer") != self._settings.issuer:
                    raise ValueError("the discovery document names another issuer")
                metadata = Metadata(self._endpoint(doc, "authorization_endpoint"),
                                    self._endpoint(doc, "token_endpoint"), self._endpoint(doc, "jwks_uri"))
            except Exception as exc:  # noqa: BLE001 - every failure is the same answer
                log.warning("OIDC discovery failed: %s", str(exc)[:300] or type(exc).__name__)
                raise errors.OidcUnavailable() from None
            if self._metadata is not None and metadata.jwks_uri != self._metadata.jwks_uri:
                self._keys, self._keys_at = [], -math.inf  # keys from the old URL are not this set's
            self._metadata, self._metadata_at = metadata, time.monotonic()
            return metadata

    async def keys(self, kid: str | None, alg: str) -> list[PublicKey]:
        """The cached key set, fetched again when stale, or when it has no key for ``kid`` and
        ``alg`` (at most once per MESHFAST_JWKS_MIN_INTERVAL_S: a rotated key is found at once,
        a forged kid cannot make the worker hammer the issuer)."""
        def has() -> bool:
            return any(k.alg == alg and (kid is None or k.kid == kid) for k in self._keys)

        now = time.monotonic()
        age = now - self._keys_at
        if age < JWKS_TTL_S and (has() or age < issuers.min_interval_s()):
            return self._keys
        metadata = await self.metadata()
        async with self._lock:
            age = time.monotonic() - self._keys_at
            if age < JWKS_TTL_S and (has() or age < issuers.min_interval_s()):
                return self._keys
            self._keys_at = time.monotonic()  # a failed fetch waits the interval too
            try:
                text = await issuers.fetch_jwks(metadata.jwks_uri, local=True, algorithms=list(ALGORITHMS),
                                                timeout_s=FETCH_TIMEOUT_S)
                self._keys = public_keys(text)
            except Exception as exc:  # noqa: BLE001 - the last good set serves on
                log.warning("OIDC key set not fetched: %s", str(exc)[:300] or type(exc).__name__)
            return self._keys

    async def exchange(self, code: str, redirect_uri: str, code_verifier: str) -> str:
        """The ID token the token endpoint gives for ``code``; 400 ``oidc_exchange_failed`` when
        it refuses (an expired or replayed code: ``invalid_grant``) or gives none."""
        metadata = await self.metadata()
        s = self._settings
        # RFC 6749 2.3.1: each part form-urlencoded before the Basic encoding.
        basic = base64.b64encode(f"{quote_plus(s.client_id)}:{quote_plus(s.client_secret)}".encode())
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                "code_verifier": code_verifier}
        try:
            status, doc = await _http("POST", metadata.token_endpoint, max_bytes=MAX_TOKEN_RESPONSE_BYTES, data=form,
                                      headers={"authorization": "Basic " + basic.decode()})
        except Exception as exc:  # noqa: BLE001 - the issuer did not answer
            log.warning("OIDC token endpoint unreachable: %s", type(exc).__name__)
            raise errors.OidcUnavailable() from None
        token = doc.get("id_token") if isinstance(doc, dict) else None
        if status != 200 or not isinstance(token, str):
            # NOTE: only the error code is logged (the answer may echo what was sent).
            code_name = doc.get("error") if isinstance(doc, dict) else None
            shown = code_name[:64] if isinstance(code_name, str) and code_name.isascii() and \
                code_name.replace("_", "").isalnum() else "-"
            log.info("OIDC code exchange refused: HTTP %s, error %s", status, shown)
            raise errors.OidcExchangeFailed()
        return token


# --- the two routes --------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def state_cookie(state: str, secure: bool, max_age_s: int) -> tuple[str, str]:
    # NOTE: SameSite=Lax: the issuer sends the browser back with a top-level GET, which carries it.
    flags = f"Path={STATE_COOKIE_PATH}; Max-Age={max_age_s}; SameSite=Lax" + ("; Secure" if secure else "")
    return "set-cookie", f"{STATE_COOKIE}={state}; HttpOnly; {flags}"


def _query(query: str | None) -> dict[str, str]:
    """The query's parameters (the first of each name); a query too long or malformed is empty."""
    if not query or len(query) > MAX_QUERY_BYTES:
        return {}
    out: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, max_num_fields=32)
    except ValueError:
        return {}
    for name, value in pairs:
        out.setdefault(name, value)
    return out


class OidcLogin:
    """``hash_token``: the instance's keyed hash (the PKCE verifier is derived from the state with
    it); ``admin_auth``: password login's throttle and sessions."""

    def __init__(self, pool: asyncpg.Pool, settings: OidcSettings, hash_token: Callable[[str], str],
                 admin_auth: auth.AdminAuth, cookie_secure: bool) -> None:
        self._pool = pool
        self._settings = settings
        self._hash_token = hash_token
        self._auth = admin_auth
        self._secure = cookie_secure
        self.issuer = IssuerClient(settings)

    def _verifier(self, state: str) -> str:
        # 64 hex characters: a valid RFC 7636 verifier (43-128 unreserved characters).
        return self._hash_token("oidc-pkce\0" + state)

    def redirect_uri(self, host: str | None, scheme: str) -> str:
        if self._settings.redirect_url is not None:
            return self._settings.redirect_url
        if not host or not _HOST.match(host):
            raise errors.InvalidRequest("the request's Host header is missing or malformed")
        return f"{'https' if scheme == 'https' else 'http'}://{host}/admin/oidc/callback"

    async def begin(self, ip: str, host: str | None, scheme: str) -> Reply:
        """``GET /admin/oidc/login``: a new attempt and the 302 to the issuer."""
        retry_after_s = self._auth.throttle(ip)
        if retry_after_s:
            return Reply(errors.TooManyAttempts.status, {"error": errors.TooManyAttempts.code},
                         (("retry-after", str(retry_after_s)),))
        redirect_uri = self.redirect_uri(host, scheme)
        metadata = await self.issuer.metadata()
        state, nonce = auth.new_token(), auth.new_token()
        async with self._pool.acquire() as conn:
            stored = await conn.fetchval(oidc_sql.INSERT_ATTEMPT, _sha256(state), nonce, redirect_uri, ATTEMPT_TTL,
                                         MAX_PENDING_ATTEMPTS)
        if not stored:
            log.warning("OIDC login refused: %d logins are pending", MAX_PENDING_ATTEMPTS)
            return Reply(errors.TooManyAttempts.status, {"error": errors.TooManyAttempts.code},
                         (("retry-after", "60"),))
        challenge = _b64(hashlib.sha256(self._verifier(state).encode()).digest())
        params = {"response_type": "code", "client_id": self._settings.client_id, "redirect_uri": redirect_uri,
                  "scope": SCOPE, "state": state, "nonce": nonce, "code_challenge": challenge,
                  "code_challenge_method": "S256"}
        endpoint = metadata.authorization_endpoint
        location = endpoint + ("&" if urlsplit(endpoint).query else "?") + urlencode(params)
        max_age_s = int(ATTEMPT_TTL.total_seconds())
        return Reply(302, {"status": "redirect", "location": location},
                     (("location", location), state_cookie(state, self._secure, max_age_s)))

    async def finish(self, ip: str, query: str | None, headers: Any) -> Reply:
        """``GET /admin/oidc/callback``: the session, or the error; either way the state cookie
        is cleared (an attempt is tried once)."""
        cleared = state_cookie("", self._secure, 0)
        try:
            token, csrf = await self._finish(ip, _query(query), auth.cookies(headers).get(STATE_COOKIE) or "")
        except errors.MeshfastError as exc:
            return Reply(exc.status, {"error": exc.code}, (cleared,))
        max_age_s = int(auth.SESSION_TTL.total_seconds())
        return Reply(302, {"status": "ok", "location": "/dashboard"},
                     (("location", "/dashboard"), cleared, *auth.set_cookies(token, csrf, self._secure, max_age_s)))

    async def _finish(self, ip: str, params: dict[str, str], cookie_state: str) -> tuple[str, str]:
        state = params.get("state", "")
        same = bool(state) and bool(cookie_state) and hmac.compare_digest(state.encode(), cookie_state.encode())
        attempt = None
        if same:
            async with self._pool.acquire() as conn:
                attempt = await conn.fetchrow(oidc_sql.CONSUME_ATTEMPT, _sha256(state))
        if "error" in params:
            # The issuer's refusal (the person cancelled, or may not use this client).
            raise errors.OidcDenied()
        if attempt is None or not attempt["live"]:
            raise errors.InvalidState()
        if "iss" in params and params["iss"] != self._settings.issuer:
            # RFC 9207: an answer from another issuer (a mix-up) is not this login's.
            raise errors.InvalidState()
        code = params.get("code", "")
        if not code or len(code) > 4096:
            raise errors.InvalidRequest()
        id_token = await self.issuer.exchange(code, attempt["redirect_uri"], self._verifier(state))
        try:
            alg, kid = header(id_token)
            keys = await self.issuer.keys(kid, alg)
            claims = verify_id_token(id_token, keys, issuer=self._settings.issuer, client_id=self._settings.client_id,
                                     nonce=attempt["nonce"], now_s=time.time())
            email = verified_email(claims)
        except IdTokenError as exc:
            log.info("OIDC login refused: the ID token does not verify (%s)", exc)
            async with self._pool.acquire() as conn:
                await _audit(conn, "oidc", AUDIT_FAILED, None, {"reason": "invalid_id_token", "why": str(exc),
                                                              "ip": ip})
            raise errors.InvalidIdToken() from None
        return await self._session(ip, email, *roles(claims, self._settings))

    async def _session(self, ip: str, email: str, platform: bool, unit_names: list[str]) -> tuple[str, str]:
        async with self._pool.acquire() as conn:
            units = [] if platform or not unit_names else await conn.fetch(oidc_sql.UNITS_NAMED, unit_names)
            if not platform and not units:
                # NOTE: named units that do not exist make no role either: an admin in no unit
                # and not a platform administrator would be unscoped.
                await _audit(conn, email, AUDIT_FAILED, email, {"reason": "no_role", "ip": ip})
                raise errors.NoRole()
            role = "platform" if platform else "business_unit"
            async with conn.transaction():
                row = await conn.fetchrow(oidc_sql.UPSERT_OIDC_ADMIN, email, NO_PASSWORD, platform, "oidc")
                if row is not None:
                    # The issuer is authoritative: the admin's units become exactly the named ones
                    # (none for a platform administrator, whom a unit would scope).
                    await conn.execute(oidc_sql.SET_ADMIN_UNITS, row["id"], [u["id"] for u in units])
                    token, csrf = await auth.open_session(conn, row["id"])
                    await _audit(conn, email, AUDIT_LOGIN, email, {
                        "ip": ip, "role": role, "business_units": [u["name"] for u in units],
                        "provisioned": row["created"]})
            if row is None:
                # Paused: refused as password login refuses it.
                await _audit(conn, email, AUDIT_FAILED, email, {"reason": "paused", "ip": ip})
                raise errors.InvalidCredentials()
        log.info("admin %s logged in through OIDC (%s)", email, role)
        return token, csrf


async def _audit(conn: asyncpg.Connection, actor: str, action: str, target: str | None,
                 detail: dict[str, Any]) -> None:
    await conn.execute(sql.INSERT_AUDIT, actor, action, target, json.dumps(detail))

