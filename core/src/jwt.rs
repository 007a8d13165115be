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
/// Verified tokens (and refusals of validly signed ones) remembered per worker: at most this many
/// of at most [`MAX_TOKEN_BYTES`] each, and only tokens a configured issuer signed.
pub const CACHE_ENTRIES: usize = 4096;
/// How long a refusal of a signed token is remembered (a person provisioned since may pass).
const REFUSAL_TTL_MS: i64 = 60_000;
/// The longest email claim taken (as the admin API's).
const MAX_EMAIL_CHARS: usize = 320;

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
    /// A verdict reached after the signature held (the token is an issuer's own): until when it
    /// may be remembered.
    Signed(Box<TokenError>, i64),
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
    /// The reason itself, without the [`TokenError::Signed`] mark.
    #[must_use]
    pub fn plain(self) -> TokenError {
        match self {
            TokenError::Signed(inner, _) => inner.plain(),
            other => other,
        }
    }

    #[must_use]
    pub fn outcome(&self) -> Outcome {
        match self {
            TokenError::Signed(inner, _) => inner.outcome(),
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

/// Whom a verified token's claims name: a person by email (as [`normal_email`] gives it), or an
/// application by its id or name (the issuer's `application` claim, when it maps one and the
/// token carries it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who<'a> {
    Email(&'a str),
    Application(&'a str),
}

/// Verifies `token` against `issuers` at `now_ms`; `lookup` finds the principal its claims name
/// ([`Who`]). The order matters: the signature is checked before any claim but
/// `iss` (which picks the keys) is trusted. A refusal reached after the signature held comes
/// marked [`TokenError::Signed`] (what [`TokenCache`] may remember); [`TokenError::plain`] drops it.
pub fn verify(
    issuers: &[Issuer],
    by_issuer: &HashMap<String, u32>,
    token: &str,
    now_ms: i64,
    lookup: impl Fn(Who<'_>) -> Option<u32>,
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

    // The signature holds: now the claims. A refusal from here on may be remembered a while
    // (never past the token's own expiry).
    let exp = claim_time_ms(&claims, "exp")?.ok_or(TokenError::Invalid)?;
    let until_ms = exp.saturating_add(issuer.skew_ms);
    let remember = |e: TokenError| TokenError::Signed(Box::new(e), until_ms.min(now_ms.saturating_add(REFUSAL_TTL_MS)));
    if now_ms >= until_ms {
        let refused = TokenError::Expired;
        return Err(TokenError::Signed(
            Box::new(refused),
            now_ms.saturating_add(REFUSAL_TTL_MS),
        ));
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
        return Err(remember(TokenError::WrongAudience));
    }
    let subject = match claims.get("sub") {
        None => "",
        Some(serde_json::Value::String(s)) if s.chars().count() <= MAX_SUBJECT_CHARS => s.as_str(),
        Some(_) => return Err(TokenError::Invalid),
    };
    // A token with an email is a person's, whatever else it carries (identity providers put the
    // client's id in people's tokens too). One without names an application (a service calling
    // on its own behalf) by the issuer's application claim; applications are registered, never
    // provisioned from claims.
    let Some(email_claim) = claim_str(&claims, &issuer.claims.email) else {
        let application = issuer.claims.application.as_deref().and_then(|c| claim_str(&claims, c));
        return match application.and_then(|a| lookup(Who::Application(a))) {
            Some(principal) => Ok(Identity {
                principal,
                issuer: index,
                subject: Arc::from(subject),
                until_ms,
            }),
            None => Err(remember(TokenError::UnknownPrincipal(None))),
        };
    };
    let Some(email) = normal_email(email_claim) else {
        return Err(remember(TokenError::UnknownPrincipal(None)));
    };
    match lookup(Who::Email(&email)) {
        Some(principal) => Ok(Identity {
            principal,
            issuer: index,
            subject: Arc::from(subject),
            until_ms,
        }),
        None => {
            let seed = |name: &Option<String>| name.as_deref().and_then(|n| claim_str(&claims, n)).map(str::to_owned);
            Err(remember(TokenError::UnknownPrincipal(issuer.jit_provisioning.then(
                || {
                    Arc::new(Provision {
                        issuer_id: issuer.id.clone(),
                        email,
                        display_name: seed(&issuer.claims.display_name),
                        business_unit: seed(&issuer.claims.business_unit),
                        manager_email: seed(&issuer.claims.manager_email),
                        tier: seed(&issuer.claims.tier),
                    })
                },
            ))))
        }
    }
}

/// An email claim as people's emails are stored and looked up: ASCII only (a Unicode lowercasing
/// would map look-alike letters, the Kelvin sign onto `k`, onto someone else), lowercased, one
/// `@`, no whitespace or control characters, at most 320 characters. None: no person can match.
#[must_use]
pub fn normal_email(claim: &str) -> Option<String> {
    let ok = claim.len() <= MAX_EMAIL_CHARS
        && claim.bytes().all(|b| b.is_ascii_graphic())
        && claim.bytes().filter(|&b| b == b'@').count() == 1
        && !claim.starts_with('@')
        && !claim.ends_with('@');
    ok.then(|| claim.to_ascii_lowercase())
}

struct Cached {
    token: Box<str>,
    outcome: Result<Identity, TokenError>,
    /// Remembered until then: a verified token's expiry, a signed token's refusal a short while.
    until_ms: i64,
}

/// The worker's verified tokens (and refusals of signed ones), bounded; one per snapshot, so a
/// changed key set or person never meets an old verdict. A token no issuer signed is never
/// stored here (unauthenticated work must not cost memory); the last one refused is remembered
/// alone, so the steps of one request (authenticate, then the decision) verify it once.
#[derive(Default)]
pub struct TokenCache {
    entries: Mutex<HashMap<u128, Cached>>,
    last_refused: Mutex<Option<(Box<str>, TokenError, i64)>>,
}

/// How long the last refused token's verdict is remembered: the steps of one request.
const LAST_REFUSED_MS: i64 = 2_000;

impl TokenCache {
    /// `verify`'s verdict for `token`, remembered.
    pub fn get_or_verify(
        &self,
        token: &str,
        now_ms: i64,
        verify: impl FnOnce() -> Result<Identity, TokenError>,
    ) -> Result<Identity, TokenError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::Invalid);
        }
        let hash = xxhash_rust::xxh3::xxh3_128(token.as_bytes());
        {
            let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(hit) = entries.get(&hash).filter(|hit| &*hit.token == token) {
                if now_ms < hit.until_ms {
                    return hit.outcome.clone();
                }
                if hit.outcome.is_ok() {
                    return Err(TokenError::Expired);
                }
            }
        }
        {
            let last = self
                .last_refused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((_, why, _)) = last.as_ref().filter(|(t, _, until)| &**t == token && now_ms < *until) {
                return Err(why.clone());
            }
        }
        let outcome = match verify() {
            Err(TokenError::Signed(why, until_ms)) => Err((*why, Some(until_ms))),
            Err(why) => Err((why, None)),
            Ok(identity) => Ok(identity),
        };
        let (outcome, until_ms) = match outcome {
            Ok(identity) => {
                let until = identity.until_ms;
                (Ok(identity), until)
            }
            Err((why, Some(until))) => (Err(why), until),
            Err((why, None)) => {
                *self
                    .last_refused
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((token.into(), why.clone(), now_ms.saturating_add(LAST_REFUSED_MS)));
                return Err(why);
            }
        };
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= CACHE_ENTRIES {
            entries.retain(|_, c| now_ms < c.until_ms);
            if entries.len() >= CACHE_ENTRIES {
                // NOTE: bounded above all (only signed tokens get here): the flood costs verifications.
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

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    use proptest::prelude::*;
    use serde_json::json;

    const NOW_MS: i64 = 1_764_000_000_000;
    const NOW_S: i64 = NOW_MS / 1000;

    fn b64(data: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(data)
    }

    struct Signer {
        ed: Ed25519KeyPair,
        ec: EcdsaKeyPair,
    }

    impl Signer {
        fn new() -> Self {
            let rng = SystemRandom::new();
            let ed = Ed25519KeyPair::from_pkcs8(Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref()).unwrap();
            let ec = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).unwrap();
            Signer { ed, ec }
        }

        fn jwks(&self) -> String {
            let point = self.ec.public_key().as_ref();
            json!({"keys": [
                {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": b64(self.ed.public_key().as_ref())},
                {"kty": "EC", "crv": "P-256", "kid": "ec", "x": b64(&point[1..33]), "y": b64(&point[33..65])},
                {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            ]})
            .to_string()
        }

        fn token(&self, header: &serde_json::Value, claims: &serde_json::Value) -> String {
            let input = format!(
                "{}.{}",
                b64(header.to_string().as_bytes()),
                b64(claims.to_string().as_bytes())
            );
            let sig = match header["alg"].as_str() {
                Some("ES256") => self
                    .ec
                    .sign(&SystemRandom::new(), input.as_bytes())
                    .unwrap()
                    .as_ref()
                    .to_vec(),
                _ => self.ed.sign(input.as_bytes()).as_ref().to_vec(),
            };
            format!("{input}.{}", b64(&sig))
        }
    }

    fn issuer(
        signer: &Signer,
        claims: ClaimMap,
        jit: bool,
        algorithms: &[&str],
    ) -> (Vec<Issuer>, HashMap<String, u32>) {
        let mut errors = Vec::new();
        let built = Issuer::build(
            &mut errors,
            "test",
            RawIssuer {
                id: "iss-id".into(),
                issuer: "https://idp.test".into(),
                audiences: vec!["aud-1".into(), "aud-2".into()],
                algorithms: algorithms.iter().map(|a| (*a).to_owned()).collect(),
                clock_skew_s: 30,
                claims,
                jit_provisioning: jit,
                jwks: signer.jwks(),
                good_until_ms: None,
            },
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(built.keys.len(), 2, "the HMAC key is never usable");
        (vec![built], HashMap::from([("https://idp.test".to_owned(), 0)]))
    }

    fn claims() -> serde_json::Value {
        json!({"iss": "https://idp.test", "aud": "aud-1", "sub": "s-1", "email": "Known@Example.com",
               "exp": NOW_S + 600})
    }

    fn known(who: Who<'_>) -> Option<u32> {
        match who {
            Who::Email(email) => (email == "known@example.com").then_some(7),
            Who::Application(app) => (app == "billing-bot").then_some(9),
        }
    }

    fn check(signer: &Signer, token: &str) -> Result<Identity, TokenError> {
        let (issuers, by) = issuer(
            signer,
            ClaimMap {
                email: "email".into(),
                ..ClaimMap::default()
            },
            false,
            &["EdDSA", "ES256"],
        );
        verify(&issuers, &by, token, NOW_MS, known).map_err(TokenError::plain)
    }

    #[test]
    fn tokens_verify_and_every_forgery_is_refused_with_its_reason() {
        let s = Signer::new();
        let ed = json!({"alg": "EdDSA", "kid": "ed"});
        let ok = check(&s, &s.token(&ed, &claims())).unwrap();
        assert_eq!(
            (ok.principal, &*ok.subject, ok.until_ms),
            (7, "s-1", (NOW_S + 630) * 1000)
        );
        assert!(check(&s, &s.token(&json!({"alg": "ES256", "kid": "ec"}), &claims())).is_ok());
        // No kid: the one key of the algorithm.
        assert!(check(&s, &s.token(&json!({"alg": "EdDSA"}), &claims())).is_ok());
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut c = claims();
            f(&mut c);
            check(&s, &s.token(&ed, &c))
        };
        assert_eq!(with(&|c| c["exp"] = json!(NOW_S - 31)), Err(TokenError::Expired));
        assert!(with(&|c| c["exp"] = json!(NOW_S - 29)).is_ok(), "within the skew");
        assert_eq!(with(&|c| c["exp"] = json!("soon")), Err(TokenError::Invalid));
        assert_eq!(with(&|c| c["exp"] = json!(1e300)), Err(TokenError::Invalid));
        assert_eq!(
            with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            }),
            Err(TokenError::Invalid)
        );
        assert_eq!(with(&|c| c["nbf"] = json!(NOW_S + 60)), Err(TokenError::Invalid));
        assert_eq!(with(&|c| c["aud"] = json!("aud-3")), Err(TokenError::WrongAudience));
        assert!(with(&|c| c["aud"] = json!(["x", "aud-2"])).is_ok());
        assert_eq!(
            with(&|c| {
                c.as_object_mut().unwrap().remove("aud");
            }),
            Err(TokenError::WrongAudience)
        );
        assert_eq!(
            with(&|c| c["iss"] = json!("https://other")),
            Err(TokenError::UnknownIssuer)
        );
        assert_eq!(
            with(&|c| c["email"] = json!("nobody@example.com")),
            Err(TokenError::UnknownPrincipal(None))
        );
        assert_eq!(with(&|c| c["sub"] = json!("x".repeat(256))), Err(TokenError::Invalid));
        // Key selection and algorithms.
        assert_eq!(
            check(&s, &s.token(&json!({"alg": "EdDSA", "kid": "nope"}), &claims())),
            Err(TokenError::UnknownKey(0))
        );
        assert_eq!(
            check(&s, &s.token(&json!({"alg": "ES256", "kid": "ed"}), &claims())),
            Err(TokenError::Invalid)
        );
        assert_eq!(
            check(&s, &s.token(&json!({"alg": "HS256", "kid": "hmac"}), &claims())),
            Err(TokenError::Invalid)
        );
        assert_eq!(
            check(&s, &s.token(&json!({"alg": "none", "kid": "ed"}), &claims())),
            Err(TokenError::Invalid)
        );
        assert_eq!(
            check(
                &s,
                &s.token(&json!({"alg": "EdDSA", "kid": "ed", "crit": ["exp"]}), &claims())
            ),
            Err(TokenError::Invalid)
        );
        // Tampering: another payload under the signature, a signature cut short, junk.
        let good = s.token(&ed, &claims());
        let other = s.token(
            &ed,
            &json!({"iss": "https://idp.test", "aud": "aud-1", "email": "known@example.com", "exp": NOW_S + 9999}),
        );
        let parts: Vec<&str> = good.split('.').collect();
        let forged = format!("{}.{}.{}", parts[0], other.split('.').nth(1).unwrap(), parts[2]);
        assert_eq!(check(&s, &forged), Err(TokenError::Invalid));
        assert_eq!(check(&s, &good[..good.len() - 4]), Err(TokenError::Invalid));
        assert_eq!(check(&s, "eyJ.e30.x"), Err(TokenError::Invalid));
        assert_eq!(check(&s, &format!("{good}=")), Err(TokenError::Invalid));
        let (issuers, by) = issuer(
            &s,
            ClaimMap {
                email: "email".into(),
                ..ClaimMap::default()
            },
            false,
            &["ES256"],
        );
        assert_eq!(
            verify(&issuers, &by, &good, NOW_MS, known),
            Err(TokenError::Invalid),
            "EdDSA not allowed"
        );
    }

    #[test]
    fn emails_are_compared_in_ascii_only() {
        assert_eq!(normal_email("Kate@Corp.COM").as_deref(), Some("kate@corp.com"));
        for bad in [
            "\u{212A}ate@corp.com",
            "kate @corp.com",
            "kate@corp.com ",
            "kate",
            "@corp.com",
            "a@b@c",
            "a\0@b",
        ] {
            assert_eq!(normal_email(bad), None, "{bad:?}");
        }
        assert_eq!(normal_email(&format!("{}@x.io", "a".repeat(330))), None);
    }

    #[test]
    fn rsa_keys_are_read_from_their_components_and_short_ones_refused() {
        let der = rsa_public_key_der(&[0x80, 1, 2], &[1, 0, 1]);
        assert_eq!(
            der,
            [0x30, 0x0b, 0x02, 0x04, 0x00, 0x80, 0x01, 0x02, 0x02, 0x03, 0x01, 0x00, 0x01]
        );
        let n = b64(&[0xC5; 128]);
        let short = json!({"keys": [{"kty": "RSA", "n": n, "e": "AQAB"}]}).to_string();
        let (keys, skipped) = parse_jwks(&short).unwrap();
        assert!(keys.is_empty() && skipped[0].contains("shorter"), "{skipped:?}");
        assert!(parse_jwks("[]").is_err() && parse_jwks("{\"keys\": 3}").is_err());
    }

    #[test]
    fn the_cache_answers_as_verification_does_until_expiry() {
        let cache = TokenCache::default();
        let identity = Identity {
            principal: 1,
            issuer: 0,
            subject: Arc::from("s"),
            until_ms: NOW_MS + 10,
        };
        let mut calls = 0;
        let mut get = |now: i64, token: &str| {
            cache.get_or_verify(token, now, || {
                calls += 1;
                Ok(identity.clone())
            })
        };
        assert!(get(NOW_MS, "a").is_ok());
        assert!(get(NOW_MS + 9, "a").is_ok());
        assert_eq!(get(NOW_MS + 10, "a"), Err(TokenError::Expired));
        assert!(get(NOW_MS, "b").is_ok());
        assert_eq!(calls, 2);
        // Tokens no issuer signed are never stored (a flood of them costs no memory); the last
        // one refused is remembered alone, briefly.
        for i in 0..CACHE_ENTRIES * 2 {
            let big = format!("t{i}{}", "x".repeat(4000));
            cache
                .get_or_verify(&big, NOW_MS, || Err(TokenError::Invalid))
                .unwrap_err();
        }
        assert_eq!(cache.len(), 2);
        let mut verified = 0;
        for _ in 0..2 {
            let refused = cache.get_or_verify("forged", NOW_MS, || {
                verified += 1;
                Err(TokenError::Invalid)
            });
            assert_eq!(refused, Err(TokenError::Invalid));
        }
        assert_eq!(verified, 1, "one verification for the steps of one request");
        let oversized = "e".repeat(MAX_TOKEN_BYTES + 1);
        assert_eq!(
            cache.get_or_verify(&oversized, NOW_MS, || unreachable!()),
            Err(TokenError::Invalid)
        );
        // Signed refusals are remembered, never past their own deadline.
        let signed = || Err(TokenError::Signed(Box::new(TokenError::WrongAudience), NOW_MS + 5));
        assert_eq!(cache.get_or_verify("s", NOW_MS, signed), Err(TokenError::WrongAudience));
        assert_eq!(
            cache.get_or_verify("s", NOW_MS + 4, || unreachable!()),
            Err(TokenError::WrongAudience)
        );
        assert_eq!(cache.len(), 3);
        assert!(cache.len() <= CACHE_ENTRIES);
    }

    fn claim_name() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "email", "upn", "mail", "bu", "dept", "tier", "level", "mgr", "name", "x",
        ])
        .prop_map(str::to_owned)
    }

    fn claim_value() -> impl Strategy<Value = Option<serde_json::Value>> {
        prop_oneof![
            Just(None),
            Just(Some(json!(""))),
            Just(Some(json!(42))),
            Just(Some(json!(null))),
            "[a-zA-Z0-9@. -]{1,12}".prop_map(|s| Some(json!(s))),
            Just(Some(json!("Known@example.COM"))),
            Just(Some(json!("billing-bot"))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Claim mapping against the obvious reading: each attribute is its mapped claim when that
        /// is a non-empty string; the person is found by the email claim, whatever its case.
        #[test]
        fn prop_claim_mapping_follows_the_issuers_map(
            email in claim_name(), bu in proptest::option::of(claim_name()), tier in proptest::option::of(claim_name()),
            manager in proptest::option::of(claim_name()), name in proptest::option::of(claim_name()),
            app in proptest::option::of(claim_name()),
            values in proptest::collection::vec((claim_name(), claim_value()), 0..8), jit: bool,
        ) {
            let signer = Signer::new();
            let map = ClaimMap { email: email.clone(), display_name: name.clone(), business_unit: bu.clone(),
                                 manager_email: manager.clone(), tier: tier.clone(), application: app.clone() };
            let (issuers, by) = issuer(&signer, map, jit, &["EdDSA"]);
            let mut claims = json!({"iss": "https://idp.test", "aud": "aud-2", "exp": NOW_S + 60});
            for (k, v) in &values {
                match v {
                    Some(v) => { claims[k.as_str()] = v.clone(); }
                    None => { claims.as_object_mut().unwrap().remove(k); }
                }
            }
            let token = signer.token(&json!({"alg": "EdDSA", "kid": "ed"}), &claims);
            let got = verify(&issuers, &by, &token, NOW_MS, known).map_err(TokenError::plain);
            let read = |n: &Option<String>| n.as_deref().and_then(|n| claims.get(n)).and_then(|v| v.as_str())
                .filter(|s| !s.is_empty()).map(str::to_owned);
            // An email as people's are stored: printable ASCII, one @ inside, lowercased.
            let stored = |e: String| {
                let at = e.find('@');
                (e.len() <= 320 && e.chars().all(|c| c.is_ascii_graphic()) && e.matches('@').count() == 1
                    && at != Some(0) && at != Some(e.len() - 1)).then(|| e.to_ascii_lowercase())
            };
            // A token with an email claim is the person's (by email); one without names an
            // application (when the issuer maps the claim), found by name or refused, never provisioned.
            let expected = match (read(&Some(email)), read(&app)) {
                (None, Some(a)) if a == "billing-bot" =>
                    Ok(Identity { principal: 9, issuer: 0, subject: Arc::from(""), until_ms: (NOW_S + 90) * 1000 }),
                (None, _) => Err(TokenError::UnknownPrincipal(None)),
                (Some(raw), _) => match stored(raw) {
                None => Err(TokenError::UnknownPrincipal(None)),
                Some(e) if e == "known@example.com" =>
                    Ok(Identity { principal: 7, issuer: 0, subject: Arc::from(""), until_ms: (NOW_S + 90) * 1000 }),
                Some(e) => Err(TokenError::UnknownPrincipal(jit.then(|| Arc::new(Provision {
                    issuer_id: "iss-id".into(), email: e, display_name: read(&name), business_unit: read(&bu),
                    manager_email: read(&manager), tier: read(&tier),
                })))),
                },
            };
            prop_assert_eq!(got, expected);
        }
    }
}
