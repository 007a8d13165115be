//! Finding the issued key behind a request: token extraction from the request's headers or
//! query, and a digest-keyed index that needs no allocation per lookup.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use sha2::{Digest as _, Sha256};

/// Every issued key starts with this.
pub const KEY_PREFIX: &str = "mesh_live_";
/// Characters after the prefix: 32 random bytes in unpadded base64url.
pub const KEY_BODY_LEN: usize = 43;

/// A SHA-256 digest of `pepper || token`, the only form in which keys are stored.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Digest(pub [u8; 32]);

impl Hash for Digest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // NOTE: the digest is already uniform, so its first 8 bytes are a perfect hash.
        let mut head = [0u8; 8];
        head.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_le_bytes(head));
    }
}

/// A hasher that passes through the one `u64` a [`Digest`] writes.
#[derive(Default)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached if a non-Digest key is hashed; fold it in rather than ignore it.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// Digest -> key index (into the snapshot's key list).
pub struct KeyIndex {
    seeded: Sha256,
    map: HashMap<Digest, u32, BuildHasherDefault<PassThroughHasher>>,
}

impl KeyIndex {
    /// An index over `digests` (position = key index), hashing tokens with `pepper`.
    #[must_use]
    pub fn new(pepper: &[u8], digests: impl IntoIterator<Item = Digest>) -> Self {
        let mut seeded = Sha256::new();
        seeded.update(pepper);
        let mut map = HashMap::default();
        for (i, digest) in digests.into_iter().enumerate() {
            map.insert(digest, i as u32);
        }
        Self { seeded, map }
    }

    /// `SHA-256(pepper || token)`: the pepper is absorbed once; each call clones that state.
    #[must_use]
    pub fn digest(&self, token: &[u8]) -> Digest {
        let mut hasher = self.seeded.clone();
        hasher.update(token);
        Digest(hasher.finalize().into())
    }

    /// The key index for a well-formed token, if it was issued.
    #[must_use]
    pub fn lookup(&self, token: &str) -> Option<u32> {
        if !is_well_formed(token) {
            return None;
        }
        self.map.get(&self.digest(token.as_bytes())).copied()
    }
}

/// `mesh_live_` followed by exactly 43 base64url characters.
#[must_use]
pub fn is_well_formed(token: &str) -> bool {
    token.len() == KEY_PREFIX.len() + KEY_BODY_LEN
        && token.starts_with(KEY_PREFIX)
        && token.as_bytes()[KEY_PREFIX.len()..]
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The token a client sent: `Authorization` (with or without `Bearer `), `x-api-key`,
/// `x-goog-api-key`, then the `key=` query parameter (Gemini). The first non-empty wins.
#[must_use]
pub fn extract_token<'a>(
    authorization: Option<&'a str>,
    x_api_key: Option<&'a str>,
    x_goog_api_key: Option<&'a str>,
    query: Option<&'a str>,
) -> Option<&'a str> {
    let bearer = authorization.map(|value| {
        let value = value.trim();
        match value.get(..7) {
            Some(prefix) if prefix.eq_ignore_ascii_case("bearer ") => value[7..].trim(),
            // `Bearer ` with nothing after it, trimmed above.
            _ if value.eq_ignore_ascii_case("bearer") => "",
            _ => value,
        }
    });
    let query_key = query.and_then(|q| {
        q.trim_start_matches('?')
            .split('&')
            .find_map(|pair| pair.strip_prefix("key="))
    });
    [
        bearer,
        x_api_key.map(str::trim),
        x_goog_api_key.map(str::trim),
        query_key,
    ]
    .into_iter()
    .flatten()
    .find(|candidate| !candidate.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TOKEN: &str = "mesh_live_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

    fn reference_digest(pepper: &[u8], token: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update([pepper, token].concat());
        h.finalize().into()
    }

    #[test]
    fn test_bearer_prefix_is_case_insensitive_and_optional() {
        assert_eq!(extract_token(Some("Bearer abc"), None, None, None), Some("abc"));
        assert_eq!(extract_token(Some("bEaReR  abc "), None, None, None), Some("abc"));
        assert_eq!(extract_token(Some("abc"), None, None, None), Some("abc"));
    }

    #[test]
    fn test_first_non_empty_source_wins_in_order() {
        assert_eq!(extract_token(Some(""), Some("x"), Some("g"), Some("key=q")), Some("x"));
        assert_eq!(extract_token(None, Some(" "), Some("g"), Some("key=q")), Some("g"));
        assert_eq!(
            extract_token(Some("Bearer "), None, None, Some("alt=sse&key=q")),
            Some("q")
        );
        assert_eq!(extract_token(None, None, None, Some("?key=q")), Some("q"));
        assert_eq!(extract_token(None, None, None, Some("nokey=q")), None);
    }

    #[test]
    fn test_lookup_finds_issued_key_and_refuses_malformed() {
        let index = KeyIndex::new(b"pepper", [Digest(reference_digest(b"pepper", TOKEN.as_bytes()))]);
        assert_eq!(index.lookup(TOKEN), Some(0));
        assert_eq!(index.lookup(&TOKEN[..52]), None);
        assert_eq!(index.lookup(&TOKEN.replace("mesh_live_", "mesh_test_")), None);
        assert_eq!(
            index.lookup("mesh_live_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAé"),
            None
        );
    }

    proptest! {
        #[test]
        fn prop_seeded_digest_matches_one_shot_sha256(pepper: Vec<u8>, token: Vec<u8>) {
            let index = KeyIndex::new(&pepper, []);
            prop_assert_eq!(index.digest(&token).0, reference_digest(&pepper, &token));
        }

        #[test]
        fn prop_extract_and_lookup_never_panic(a: Option<String>, b: Option<String>, q: Option<String>) {
            let index = KeyIndex::new(b"p", []);
            if let Some(t) = extract_token(a.as_deref(), b.as_deref(), None, q.as_deref()) {
                prop_assert_eq!(index.lookup(t), None);
            }
        }
    }
}
