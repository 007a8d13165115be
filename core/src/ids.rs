//! Request ids: `req_` followed by a ULID (48-bit millisecond timestamp, 80 random bits,
//! Crockford base32, 26 characters), so ids sort by creation time.

use std::time::{SystemTime, UNIX_EPOCH};

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Encodes a 128-bit value as 26 Crockford base32 characters (the first carries 3 bits).
#[must_use]
pub fn encode_ulid(value: u128) -> [u8; 26] {
    let mut out = [0u8; 26];
    for (i, byte) in out.iter_mut().rev().enumerate() {
        *byte = CROCKFORD[((value >> (5 * i)) & 31) as usize];
    }
    out
}

/// A ULID for `unix_ms` with 80 bits from the OS random source.
#[must_use]
pub fn ulid_at(unix_ms: u64) -> u128 {
    let mut random = [0u8; 16];
    // NOTE: getrandom only fails when the OS has no entropy source at all; an id must still be
    // produced, and the timestamp half keeps it unique enough for logs.
    let _ = getrandom::fill(&mut random[6..]);
    (u128::from(unix_ms & 0xFFFF_FFFF_FFFF) << 80) | (u128::from_be_bytes(random) & ((1u128 << 80) - 1))
}

/// A fresh request id, `req_` + ULID.
#[must_use]
pub fn request_id() -> String {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut id = String::with_capacity(30);
    id.push_str("req_");
    // encode_ulid only emits ASCII.
    id.push_str(std::str::from_utf8(&encode_ulid(ulid_at(now_ms))).unwrap_or_default());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_request_id_is_req_prefix_and_26_crockford_chars() {
        let id = request_id();
        assert_eq!(id.len(), 30);
        assert!(id.starts_with("req_"));
        assert!(id[4..].bytes().all(|b| CROCKFORD.contains(&b)));
    }

    #[test]
    fn test_ulid_sorts_by_timestamp() {
        let a = encode_ulid(ulid_at(1_700_000_000_000));
        let b = encode_ulid(ulid_at(1_700_000_000_001));
        assert!(a < b);
    }

    #[test]
    fn test_encode_ulid_extremes() {
        assert_eq!(&encode_ulid(0), b"00000000000000000000000000");
        assert_eq!(&encode_ulid(u128::MAX), b"7ZZZZZZZZZZZZZZZZZZZZZZZZZ");
    }
}
