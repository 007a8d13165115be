//! Writing JSON by hand into one buffer: string literals with Mesh's minimal escaper, integers,
//! exact decimal USD and RFC 3339 times. The crate's one JSON writer: views, templates, content
//! blocks, NDJSON lines, denial bodies and the rules' answers all use it; it depends on nothing
//! else in the crate.

use chrono::{DateTime, SecondsFormat};

/// Appends `s` as a JSON string literal: quotes, backslashes and control characters escaped.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    write_escaped(out, s);
    out.push(b'"');
}

/// Appends the inside of a JSON string literal for `s`, without the quotes: Mesh's minimal
/// escaper (`"`, `\`, `\n`, `\r`, `\t` escaped, other bytes below 0x20 as `\u00XX`, all other
/// UTF-8 unchanged). The one escaper of the crate: views, templates and NDJSON lines use it.
pub fn write_escaped(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1F => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Appends `value` as a JSON integer.
pub fn write_int(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// Appends `units / 10^scale` as an exact JSON number with trailing zeros trimmed
/// (`2500000000, 9` -> `2.5`), so no float noise reaches a client.
pub(crate) fn write_fixed(out: &mut Vec<u8>, units: i128, scale: u32) {
    if units < 0 {
        out.push(b'-');
    }
    let magnitude = units.unsigned_abs();
    let divisor = 10u128.pow(scale);
    out.extend_from_slice(itoa::Buffer::new().format(magnitude / divisor).as_bytes());
    let mut fraction = magnitude % divisor;
    if fraction != 0 {
        let mut digits = scale as usize;
        while fraction.is_multiple_of(10) {
            fraction /= 10;
            digits -= 1;
        }
        out.push(b'.');
        let text = itoa::Buffer::new().format(fraction).to_owned();
        out.extend(std::iter::repeat_n(b'0', digits - text.len()));
        out.extend_from_slice(text.as_bytes());
    }
}

/// Appends nano-USD as a USD JSON number with up to 9 decimals.
pub fn write_usd(out: &mut Vec<u8>, nano_usd: i64) {
    write_fixed(out, i128::from(nano_usd), 9);
}

/// `unix_ms` as RFC 3339 UTC to the second (`2025-03-05T13:00:00Z`).
#[must_use]
pub fn rfc3339(unix_ms: i64) -> String {
    DateTime::from_timestamp_millis(unix_ms).map_or_else(String::new, |t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
}

/// Appends `unix_ms` as an RFC 3339 JSON string ([`rfc3339`]).
pub fn write_time(out: &mut Vec<u8>, unix_ms: i64) {
    write_str(out, &rfc3339(unix_ms));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn usd(nano: i64) -> String {
        let mut out = Vec::new();
        write_usd(&mut out, nano);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn test_usd_is_exact_decimal_text() {
        assert_eq!(usd(0), "0");
        assert_eq!(usd(2_500_000_000), "2.5");
        assert_eq!(usd(1), "0.000000001");
        assert_eq!(usd(-1_050_000_000), "-1.05");
        assert_eq!(usd(i64::MIN), "-9223372036.854775808");
    }

    proptest! {
        #[test]
        fn prop_escaped_string_round_trips_through_serde_json(s: String) {
            let mut out = Vec::new();
            write_str(&mut out, &s);
            prop_assert_eq!(serde_json::from_slice::<String>(&out).unwrap(), s);
        }

        #[test]
        fn prop_usd_text_equals_exact_division(nano: i64) {
            let expected = {
                let sign = if nano < 0 { "-" } else { "" };
                let m = i128::from(nano).unsigned_abs();
                let text = format!("{sign}{}.{:09}", m / 1_000_000_000, m % 1_000_000_000);
                text.trim_end_matches('0').trim_end_matches('.').to_string()
            };
            let expected = if expected.is_empty() || expected == "-" { "0".to_string() } else { expected };
            prop_assert_eq!(usd(nano), expected);
        }
    }
}
