//! Platform tokens (JWT, RFC 7519, signed per RFC 7515) verified offline: no database and no
//! network call per request. An issuer's keys come with the snapshot (an inline JWK Set, or the
//! set the background fetch last stored); a verified token is remembered until it expires, so a
//! token seen before costs one hash lookup.
//!
//! Only asymmetric algorithms exist here (`RS256`, `ES256`, `EdDSA`): an `HS256` token (the
//! algorithm-confusion attack, a public key used as an HMAC secret) and `alg: none` are simply
//! invalid, and a key is only ever used with the one algorithm its type allows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_lc_rs::signature::{self, ParsedPublicKey};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Deserialize;

use crate::outcome::Outcome;

/// The longest token verified (an identity provider's tokens are a few kB at most).
pub const MAX_TOKEN_BYTES: usize = 8192;
/// The longest subject a row keeps; a longer `sub` is refused as malformed.
pub const MAX_SUBJECT_CHARS: usize = 255;
/// RSA keys shorter than this are not used.
const MIN_RSA_BITS: usize = 2048;
/// Verified (and refused) tokens remembered per worker.
pub const CACHE_ENTRIES: usize = 8192;
/// How long a refusal is remembered (a token refused now may not be later: its person provisioned).
const REFUSAL_TTL_MS: i64 = 60_000;

/// A signature algorithm meshfast verifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alg {
    Rs256,
    Es256,
    EdDsa,
}

impl Alg {
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "RS256" => Some(Alg::Rs256),
            "ES256" => Some(Alg::Es256),
            "EdDSA" => Some(Alg::EdDsa),
            _ => None,
        }
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Alg::Rs256 => "RS256",
            Alg::Es256 => "ES256",
            Alg::EdDsa => "EdDSA",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Alg::Rs256 => 1,
            Alg::Es256 => 2,
            Alg::EdDsa => 4,
        }
    }

    fn verifier(self) -> &'static dyn signature::VerificationAlgorithm {
        match self {
            Alg::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
            Alg::Es256 => &signature::ECDSA_P256_SHA256_FIXED,
            Alg::EdDsa => &signature::ED25519,
        }
    }
}

/// One public key of an issuer, parsed once per snapshot.
pub struct Jwk {
    pub kid: Option<String>,
    pub alg: Alg,
    key: ParsedPublicKey,
}

impl std::fmt::Debug for Jwk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Jwk({:?}, {})", self.kid, self.alg.as_str())
    }
}

/// Which claim holds each attribute (issuer config `claims`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimMap {
    pub email: String,
    #[serde(default)]
    pub display_name: Option<String>,
    #[serde(default)]
    pub business_unit: Option<String>,
    #[serde(default)]
    pub manager_email: Option<String>,
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub application: Option<String>,
}

/// An issuer as the snapshot's config carries it.
#[derive(Deserialize)]
pub struct RawIssuer {
    pub id: String,
    pub issuer: String,
    pub audiences: Vec<String>,
    pub algorithms: Vec<String>,
    #[serde(default)]
    pub clock_skew_s: i64,
    pub claims: ClaimMap,
    #[serde(default)]
    pub jit_provisioning: bool,
    /// The JWK Set as JSON text (inline, or the last good fetch).
    #[serde(default)]
    pub jwks: String,
    /// A fetched set is trusted until then; after, the issuer's tokens fail closed.
    #[serde(default)]
    pub good_until_ms: Option<i64>,
}

/// A configured issuer with its keys.
#[derive(Debug)]
pub struct Issuer {
    pub id: String,
    pub issuer: String,
    pub audiences: Vec<String>,
    algorithms: u8,
    pub skew_ms: i64,
    pub claims: ClaimMap,
    pub jit_provisioning: bool,
    pub keys: Vec<Jwk>,
    pub good_until_ms: Option<i64>,
}

impl Issuer {
    /// Builds `raw`, pushing each problem onto `errors` (`what` names it).
    pub fn build(errors: &mut Vec<String>, what: &str, raw: RawIssuer) -> Self {
        let mut algorithms = 0;
        for name in &raw.algorithms {
            match Alg::parse(name) {
                Some(alg) => algorithms |= alg.bit(),
                None => errors.push(format!("{what}: algorithm {name:?} is not RS256, ES256 or EdDSA")),
            }
        }
        if algorithms == 0 {
            errors.push(format!("{what}: no algorithm"));
        }
        if raw.audiences.is_empty() {
            errors.push(format!("{what}: no audience"));
        }
        if !(0..=3600).contains(&raw.clock_skew_s) {
            errors.push(format!("{what}: clock_skew_s must be 0..3600"));
        }
        let keys = if raw.jwks.is_empty() {
            Vec::new()
        } else {
            match parse_jwks(&raw.jwks) {
                Ok((keys, _)) => keys,
                Err(e) => {
                    errors.push(format!("{what}: jwks: {e}"));
                    Vec::new()
                }
            }
        };
        Issuer {
            id: raw.id,
            issuer: raw.issuer,
            audiences: raw.audiences,
            algorithms,
            skew_ms: raw.clock_skew_s * 1000,
            claims: raw.claims,
            jit_provisioning: raw.jit_provisioning,
            keys,
            good_until_ms: raw.good_until_ms,
        }
    }

    #[must_use]
    pub fn allows(&self, alg: Alg) -> bool {
        self.algorithms & alg.bit() != 0
    }
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<serde_json::Value>,
}

/// The usable keys of a JWK Set (JSON text) and, for each key left out, why: a set may mix
/// encryption keys and algorithms meshfast does not verify, which are skipped, never guessed at.
/// Err when the text is not a JWK Set at all.
pub fn parse_jwks(text: &str) -> Result<(Vec<Jwk>, Vec<String>), String> {
    let raw: RawJwks = serde_json::from_str(text).map_err(|e| format!("not a JWK Set: {e}"))?;
    let mut keys = Vec::new();
    let mut skipped = Vec::new();
    for (i, value) in raw.keys.into_iter().enumerate() {
        match serde_json::from_value::<RawJwk>(value)
            .map_err(|e| e.to_string())
            .and_then(jwk)
        {
            Ok(key) => keys.push(key),
            Err(why) => skipped.push(format!("keys[{i}]: {why}")),
        }
    }
    Ok((keys, skipped))
}

fn b64(field: &str, value: Option<&String>) -> Result<Vec<u8>, String> {
    let value = value.ok_or_else(|| format!("no {field}"))?;
    URL_SAFE_NO_PAD
        .decode(value.trim_end_matches('='))
        .map_err(|_| format!("{field} is not base64url"))
}

fn jwk(raw: RawJwk) -> Result<Jwk, String> {
    if raw.use_.as_deref().is_some_and(|u| u != "sig") {
        return Err("not a signing key".into());
    }
    let alg = match (raw.kty.as_str(), raw.crv.as_deref()) {
        ("RSA", _) => Alg::Rs256,
        ("EC", Some("P-256")) => Alg::Es256,
        ("OKP", Some("Ed25519")) => Alg::EdDsa,
        (kty, crv) => return Err(format!("key type {kty:?} (curve {crv:?}) is not verified here")),
    };
    if let Some(named) = raw.alg.as_deref() {
        if Alg::parse(named) != Some(alg) {
            return Err(format!("algorithm {named:?} is not {}", alg.as_str()));
        }
    }
    let der = match alg {
        Alg::Rs256 => {
            let n = b64("n", raw.n.as_ref())?;
            let e = b64("e", raw.e.as_ref())?;
            let bits = n.iter().position(|&b| b != 0).map_or(0, |i| (n.len() - i) * 8);
            if bits < MIN_RSA_BITS {
                return Err(format!("RSA modulus of {bits} bits is shorter than {MIN_RSA_BITS}"));
            }
            rsa_public_key_der(&n, &e)
        }
        Alg::Es256 => {
            let (x, y) = (b64("x", raw.x.as_ref())?, b64("y", raw.y.as_ref())?);
            if x.len() != 32 || y.len() != 32 {
                return Err("P-256 coordinates are not 32 bytes".into());
            }
            [&[4u8][..], &x, &y].concat()
        }
        Alg::EdDsa => {
            let x = b64("x", raw.x.as_ref())?;
            if x.len() != 32 {
                return Err("Ed25519 key is not 32 bytes".into());
            }
            x
        }
    };
    let key = ParsedPublicKey::new(alg.verifier(), der).map_err(|e| format!("key rejected: {e}"))?;
    Ok(Jwk { kid: raw.kid, alg, key })
}

/// DER `RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }` (RFC 8017).
fn rsa_public_key_der(n: &[u8], e: &[u8]) -> Vec<u8> {
    fn length(out: &mut Vec<u8>, len: usize) {
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes = len.to_be_bytes();
            let skip = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len() - 1);
            out.push(0x80 | (bytes.len() - skip) as u8);
            out.extend_from_slice(&bytes[skip..]);
        }
    }
    fn integer(out: &mut Vec<u8>, value: &[u8]) {
        let start = value
            .iter()
            .position(|&b| b != 0)
            .unwrap_or(value.len().saturating_sub(1));
        let value = &value[start.min(value.len())..];
        let pad = value.first().is_none_or(|&b| b & 0x80 != 0);
        out.push(0x02);
        length(out, value.len() + usize::from(pad));
        if pad {
            out.push(0);
        }
        out.extend_from_slice(value);
    }
    let mut body = Vec::with_capacity(n.len() + e.len() + 16);
    integer(&mut body, n);
    integer(&mut body, e);
    let mut out = Vec::with_capacity(body.len() + 4);
    out.push(0x30);
    length(&mut out, body.len());
    out.extend_from_slice(&body);
    out
}

/// Why a token is refused: each is a 401 with its own code (API.md "Identities").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenError {
    /// Malformed, a bad signature, an algorithm not allowed (`none`, `HS256` included).
    Invalid,
    Expired,
    UnknownIssuer,
    /// No key of issuer (its index) with the token's `kid`, or its set is too old to trust.
    UnknownKey(u32),
    WrongAudience,
    /// A valid token for a person meshfast does not know; `Some` when the issuer provisions
    /// people just in time (what the claims say about them).
    UnknownPrincipal(Option<Arc<Provision>>),
}

impl TokenError {
    #[must_use]
    pub fn outcome(&self) -> Outcome {
        match self {
            TokenError::Invalid => Outcome::InvalidToken,
            TokenError::Expired => Outcome::TokenExpired,
            TokenError::UnknownIssuer => Outcome::UnknownIssuer,
            TokenError::UnknownKey(_) => Outcome::UnknownKey,
            TokenError::WrongAudience => Outcome::WrongAudience,
            TokenError::UnknownPrincipal(_) => Outcome::UnknownPrincipal,
        }
    }
}

/// What a just-in-time provisioning creates a person from: the claims the issuer maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Provision {
    pub issuer_id: String,
    pub email: String,
    pub display_name: Option<String>,
    pub business_unit: Option<String>,
    pub manager_email: Option<String>,
    pub tier: Option<String>,
}

/// A verified token: who it names and until when it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub principal: u32,
    pub issuer: u32,
    pub subject: Arc<str>,
    /// `exp` plus the issuer's clock skew, in ms.
    pub until_ms: i64,
}

/// Whether `token` has a JWT's shape (three dot-separated parts); an issued key never has a dot.
#[must_use]
pub fn is_jwt_shaped(token: &str) -> bool {
    token.starts_with("ey") && token.bytes().filter(|&b| b == b'.').count() == 2
}

#[derive(Deserialize)]
struct Header<'a> {
    alg: &'a str,
    #[serde(default, borrow)]
    kid: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    crit: Option<serde::de::IgnoredAny>,
}

fn decode_part(part: &str) -> Result<Vec<u8>, TokenError> {
    URL_SAFE_NO_PAD.decode(part).map_err(|_| TokenError::Invalid)
}

/// A claim as a string (`None` when absent, empty or not a string).
fn claim_str<'a>(claims: &'a serde_json::Map<String, serde_json::Value>, name: &str) -> Option<&'a str> {
    claims
        .get(name)
        .and_then(serde_json::Value::as_str)
        .filter(|s| !s.is_empty())
}

/// A NumericDate claim in ms: Err when present but not a number.
fn claim_time_ms(claims: &serde_json::Map<String, serde_json::Value>, name: &str) -> Result<Option<i64>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|s| s.is_finite() && s.abs() < 1e13)
            .map(|s| Some((s * 1000.0) as i64))
            .ok_or(TokenError::Invalid),
    }
}

/// Verifies `token` against `issuers` at `now_ms`; `lookup` finds a person by (lowercased) email.
/// The order matters: the signature is checked before any claim but `iss` (which picks the
/// keys) is trusted.
pub fn verify(
    issuers: &[Issuer],
    by_issuer: &HashMap<String, u32>,
    token: &str,
    now_ms: i64,
    lookup: impl Fn(&str) -> Option<u32>,
) -> Result<Identity, TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::Invalid);
    }
    let mut parts = token.splitn(3, '.');
    let (Some(head), Some(body), Some(sig)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(TokenError::Invalid);
    };
    let header_bytes = decode_part(head)?;
    let header: Header<'_> = serde_json::from_slice(&header_bytes).map_err(|_| TokenError::Invalid)?;
    if header.crit.is_some() {
        // NOTE: an extension the token says must be understood; none is.
        return Err(TokenError::Invalid);
    }
    let alg = Alg::parse(header.alg).ok_or(TokenError::Invalid)?;
    let payload = decode_part(body)?;
    let claims: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&payload).map_err(|_| TokenError::Invalid)?;
    let iss = claim_str(&claims, "iss").ok_or(TokenError::Invalid)?;
    let &index = by_issuer.get(iss).ok_or(TokenError::UnknownIssuer)?;
    let issuer = &issuers[index as usize];
    if !issuer.allows(alg) {
        return Err(TokenError::Invalid);
    }
    if issuer.good_until_ms.is_some_and(|until| now_ms >= until) {
        // NOTE: the fetched set is older than it may be trusted (its fetches kept failing).
        return Err(TokenError::UnknownKey(index));
    }
    let key = match header.kid.as_deref() {
        Some(kid) => issuer.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
        // Without a kid, only a set with one key of the algorithm says which.
        None => {
            let mut of_alg = issuer.keys.iter().filter(|k| k.alg == alg);
            match (of_alg.next(), of_alg.next()) {
                (Some(only), None) => Some(only),
                _ => None,
            }
        }
    }
    .ok_or(TokenError::UnknownKey(index))?;
    if key.alg != alg {
        // The algorithm a key's type allows, never the one the token asks for.
        return Err(TokenError::Invalid);
    }
    let signature = decode_part(sig)?;
    let signed = &token[..head.len() + 1 + body.len()];
    key.key
        .verify_sig(signed.as_bytes(), &signature)
        .map_err(|_| TokenError::Invalid)?;

    // The signature holds: now the claims.
    let exp = claim_time_ms(&claims, "exp")?.ok_or(TokenError::Invalid)?;
    if now_ms >= exp.saturating_add(issuer.skew_ms) {
        return Err(TokenError::Expired);
    }
    if claim_time_ms(&claims, "nbf")?.is_some_and(|nbf| now_ms < nbf.saturating_sub(issuer.skew_ms)) {
        return Err(TokenError::Invalid);
    }
    let audience_ok = match claims.get("aud") {
        Some(serde_json::Value::String(aud)) => issuer.audiences.iter().any(|a| a == aud),
        Some(serde_json::Value::Array(auds)) => auds
            .iter()
            .filter_map(serde_json::Value::as_str)
            .any(|aud| issuer.audiences.iter().any(|a| a == aud)),
        _ => false,
    };
    if !audience_ok {
        return Err(TokenError::WrongAudience);
    }
    let subject = match claims.get("sub") {
        None => "",
        Some(serde_json::Value::String(s)) if s.chars().count() <= MAX_SUBJECT_CHARS => s.as_str(),
        Some(_) => return Err(TokenError::Invalid),
    };
    let email = claim_str(&claims, &issuer.claims.email).ok_or(TokenError::UnknownPrincipal(None))?;
    let until_ms = exp.saturating_add(issuer.skew_ms);
    match lookup(&email.to_lowercase()) {
        Some(principal) => Ok(Identity {
            principal,
            issuer: index,
            subject: Arc::from(subject),
            until_ms,
        }),
        None => {
            let seed = |name: &Option<String>| name.as_deref().and_then(|n| claim_str(&claims, n)).map(str::to_owned);
            Err(TokenError::UnknownPrincipal(issuer.jit_provisioning.then(|| {
                Arc::new(Provision {
                    issuer_id: issuer.id.clone(),
                    email: email.to_owned(),
                    display_name: seed(&issuer.claims.display_name),
                    business_unit: seed(&issuer.claims.business_unit),
                    manager_email: seed(&issuer.claims.manager_email),
                    tier: seed(&issuer.claims.tier),
                })
            })))
        }
    }
}

struct Cached {
    token: Box<str>,
    outcome: Result<Identity, TokenError>,
    /// Remembered until then: a verified token's expiry, a refusal's short while.
    until_ms: i64,
}

/// The worker's verified tokens (and recent refusals), bounded; one per snapshot, so a changed
/// key set or person never meets an old verdict.
#[derive(Default)]
pub struct TokenCache {
    entries: Mutex<HashMap<u128, Cached>>,
}

impl TokenCache {
    /// `verify`'s verdict for `token`, remembered.
    pub fn get_or_verify(
        &self,
        token: &str,
        now_ms: i64,
        verify: impl FnOnce() -> Result<Identity, TokenError>,
    ) -> Result<Identity, TokenError> {
        let hash = xxhash_rust::xxh3::xxh3_128(token.as_bytes());
        {
            let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(hit) = entries.get(&hash) {
                if &*hit.token == token && now_ms < hit.until_ms {
                    return hit.outcome.clone();
                }
                if &*hit.token == token && hit.outcome.is_ok() {
                    return Err(TokenError::Expired);
                }
            }
        }
        let outcome = verify();
        let until_ms = match &outcome {
            Ok(identity) => identity.until_ms,
            Err(_) => now_ms.saturating_add(REFUSAL_TTL_MS),
        };
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= CACHE_ENTRIES {
            entries.retain(|_, c| now_ms < c.until_ms);
            if entries.len() >= CACHE_ENTRIES {
                // NOTE: bounded above all: a flood of distinct tokens costs verifications, never memory.
                entries.clear();
            }
        }
        entries.insert(
            hash,
            Cached {
                token: token.into(),
                outcome: outcome.clone(),
                until_ms,
            },
        );
        outcome
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
