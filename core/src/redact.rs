//! Provider credentials out of upstream text.
//!
//! A provider that refuses a key may quote it back: OpenAI answers 401 with "Incorrect API key
//! provided: sk-proj-****…****Ab3d", others echo it whole or cut short. Whatever upstream text
//! meshfast passes on (a `provider_message`, an error's `message`, an error event inside a
//! stream) first goes through [`Credentials::redact`], built from the request that was sent:
//! the `Authorization`-like headers and the credential-like query parameters of its URL.
//!
//! What is replaced by [`REDACTED`]:
//! - every occurrence of a credential, verbatim or percent-encoded;
//! - a masked echo: a word made of a prefix of the credential (possibly empty), a mask (`*`,
//!   `•`, `…` or two or more dots) and a suffix of the credential (possibly empty), with at
//!   least 6 characters of prefix or 4 of suffix (`sk-proj-****Ab3d`, `****Ab3d`, `sk-pro…`);
//! - a word that is a prefix of the credential, at least 8 characters long, cut in the middle of
//!   an alphanumeric run of the credential (`sk-proj-Abc1`, but not `sk-proj`, a part every key
//!   of that provider shares, nor `testserve` out of `testserve-key`).
//!
//! The partial rules apply to credentials of at least [`MIN_PARTIAL_LEN`] characters: a shorter
//! one is not a secret worth reconstructing from pieces, and its prefixes are ordinary words.

use std::borrow::Cow;

/// What a credential is replaced with.
pub const REDACTED: &str = "[redacted]";
/// Credentials shorter than this are only redacted whole.
pub const MIN_PARTIAL_LEN: usize = 12;
const MIN_LEN: usize = 4;
const MIN_MASKED_PREFIX: usize = 6;
const MIN_MASKED_SUFFIX: usize = 4;
const MIN_BARE_PREFIX: usize = 8;

/// Header names (lower case) that carry a credential whatever their value looks like.
const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "x-goog-api-key",
    "api-key",
];
/// A header or query parameter whose (lower-case) name contains one of these carries a credential.
const CREDENTIAL_NAME_PARTS: &[&str] = &[
    "key",
    "token",
    "secret",
    "auth",
    "password",
    "signature",
    "sig",
    "credential",
];

/// The credentials one upstream request carried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials(Vec<String>);

impl Credentials {
    /// The credentials in `headers` and in `url` (its query parameters and user info).
    #[must_use]
    pub fn from_request(headers: &[(String, String)], url: &str) -> Self {
        let mut found = Vec::new();
        for (name, value) in headers {
            let name = name.to_ascii_lowercase();
            if CREDENTIAL_HEADERS.contains(&name.as_str()) || is_credential_name(&name) {
                let value = value.trim();
                found.push(value.to_owned());
                // `Bearer <token>`, `Basic <b64>`, `Token <t>`: the token alone, too.
                if let Some((_, token)) = value.split_once(char::is_whitespace) {
                    found.push(token.trim().to_owned());
                }
            }
        }
        let rest = url.split('#').next().unwrap_or(url);
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        if let Some((_, after_scheme)) = before_query.split_once("://") {
            let authority = after_scheme.split('/').next().unwrap_or("");
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                let password = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
                found.push(password.to_owned());
                found.push(percent_decode(password));
            }
        }
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if is_credential_name(&percent_decode(name).to_ascii_lowercase()) {
                found.push(value.to_owned());
                found.push(percent_decode(value));
            }
        }
        Self::new(found)
    }

    /// These values, as credentials (too short ones are dropped).
    #[must_use]
    pub fn new(values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = values.into_iter().filter(|v| v.chars().count() >= MIN_LEN).collect();
        // Longest first, so a token is replaced whole before a header value that contains it.
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        Self(values)
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every credential, and every recognisable piece of one, replaced by [`REDACTED`].
    #[must_use]
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.0.is_empty() || text.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = Cow::Borrowed(text);
        for secret in &self.0 {
            for form in [Cow::Borrowed(secret.as_str()), percent_encode(secret)] {
                if out.contains(form.as_ref()) {
                    out = Cow::Owned(out.replace(form.as_ref(), REDACTED));
                }
            }
        }
        let partial: Vec<&str> = self
            .0
            .iter()
            .map(String::as_str)
            .filter(|s| s.chars().count() >= MIN_PARTIAL_LEN)
            .collect();
        if partial.is_empty() {
            return out;
        }
        let mut result = String::with_capacity(out.len());
        let mut changed = false;
        let mut rest = out.as_ref();
        while let Some(start) = rest.find(is_word_char) {
            let end = rest[start..]
                .find(|c: char| !is_word_char(c))
                .map_or(rest.len(), |n| start + n);
            let word = &rest[start..end];
            // A sentence's full stop is not part of the word (a mask of dots at the end is).
            let trimmed = if word.ends_with('.') && !word.ends_with("..") {
                &word[..word.len() - 1]
            } else {
                word
            };
            result.push_str(&rest[..start]);
            if partial.iter().any(|secret| echoes(trimmed, secret)) {
                result.push_str(REDACTED);
                result.push_str(&word[trimmed.len()..]);
                changed = true;
            } else {
                result.push_str(word);
            }
            rest = &rest[end..];
        }
        result.push_str(rest);
        if changed {
            Cow::Owned(result)
        } else {
            out
        }
    }
}

fn is_credential_name(name: &str) -> bool {
    CREDENTIAL_NAME_PARTS.iter().any(|part| name.contains(part))
}

/// Characters of a word that may be (a piece of) a credential, masks included.
fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '+' | '/' | '*' | '•' | '…' | '·')
}

fn is_mask_char(c: char) -> bool {
    matches!(c, '*' | '•' | '…' | '·')
}

/// Whether `word` is a masked or cut-short echo of `secret` (see the module docs).
fn echoes(word: &str, secret: &str) -> bool {
    if word.is_empty() || word == secret {
        return false; // whole occurrences were replaced already
    }
    if let Some((from, to)) = first_mask(word) {
        let (prefix, suffix) = (&word[..from], &word[to..]);
        let suffix = suffix.trim_end_matches(|c: char| is_mask_char(c) || c == '.');
        return (prefix.len() >= MIN_MASKED_PREFIX || suffix.len() >= MIN_MASKED_SUFFIX)
            && prefix.len() + suffix.len() < secret.len()
            && secret.starts_with(prefix)
            && secret.ends_with(suffix);
    }
    // A bare prefix, cut inside an alphanumeric run of the credential.
    word.len() >= MIN_BARE_PREFIX
        && word.len() < secret.len()
        && secret.starts_with(word)
        && word.ends_with(|c: char| c.is_ascii_alphanumeric())
        && secret[word.len()..].starts_with(|c: char| c.is_ascii_alphanumeric())
}

/// The first mask in `word`: a run of mask characters, or of two or more dots (byte range).
fn first_mask(word: &str) -> Option<(usize, usize)> {
    let maskish = |c: char| is_mask_char(c) || c == '.';
    let mut chars = word.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if !maskish(c) {
            continue;
        }
        let (mut end, mut masked, mut count) = (start + c.len_utf8(), is_mask_char(c), 1);
        while let Some(&(at, d)) = chars.peek() {
            if !maskish(d) {
                break;
            }
            masked |= is_mask_char(d);
            count += 1;
            end = at + d.len_utf8();
            chars.next();
        }
        if masked || count >= 2 {
            return Some((start, end));
        }
    }
    None
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn percent_encode(text: &str) -> Cow<'_, str> {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~');
    if text.bytes().all(unreserved) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if unreserved(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &str = "sk-proj-Abc123def456GHI789jkl012MNO345pqrXyZ9";

    fn bearer(key: &str) -> Credentials {
        Credentials::from_request(
            &[
                ("Authorization".into(), format!("Bearer {key}")),
                ("content-type".into(), "application/json".into()),
            ],
            "https://api.example.com/v1/chat",
        )
    }

    #[test]
    fn a_whole_key_is_redacted_wherever_it_stands() {
        let c = bearer(KEY);
        let text = format!("Incorrect API key provided: {KEY}. You can find your API key at https://x/keys.");
        assert_eq!(
            c.redact(&text),
            "Incorrect API key provided: [redacted]. You can find your API key at https://x/keys."
        );
        assert_eq!(c.redact(&format!("\"Bearer {KEY}\"")), "\"[redacted]\"");
        assert_eq!(c.redact(&format!("x{KEY}y")), "x[redacted]y");
    }

    #[test]
    fn openai_style_masked_echoes_are_redacted() {
        let c = bearer(KEY);
        for echo in [
            "sk-proj-********************************************012MNO345pqrXyZ9",
            "sk-proj-****XyZ9",
            "sk-pro****XyZ9",
            "****XyZ9",
            "sk-proj-Abc1****",
            "sk-proj-Abc…",
            "sk-proj-Abc...",
            "sk-p...XyZ9",
            "sk-••••XyZ9",
        ] {
            // A full stop after a mask of dots reads as part of the mask: the sentence keeps its own.
            let stop = if echo.ends_with('.') { "" } else { "." };
            let text = format!("Incorrect API key provided: {echo}{stop} You can find your API key at https://x.");
            let redacted = c.redact(&text);
            assert_eq!(
                redacted,
                format!("Incorrect API key provided: [redacted]{stop} You can find your API key at https://x."),
                "{echo}"
            );
        }
    }

    #[test]
    fn a_cut_short_key_is_redacted_from_eight_characters() {
        let c = bearer(KEY);
        assert_eq!(c.redact("key sk-proj-Abc1 refused"), "key [redacted] refused");
        assert_eq!(c.redact("key sk-proj-A, refused"), "key [redacted], refused");
        // A part every such key shares, ended where the key has a separator: not the key.
        assert_eq!(c.redact("sk-proj keys only"), "sk-proj keys only");
    }

    #[test]
    fn ordinary_words_that_begin_a_key_stay() {
        let c = bearer("testserve-key-0123456789");
        assert_eq!(
            c.redact("testserve: scenario error-500"),
            "testserve: scenario error-500"
        );
        let short = bearer("testserve-key");
        assert_eq!(
            short.redact("testserve: invalid API key testserve-key"),
            "testserve: invalid API key [redacted]"
        );
    }

    #[test]
    fn masks_of_other_keys_stay() {
        let c = bearer(KEY);
        assert_eq!(c.redact("sk-proj-****ZZZZ"), "sk-proj-****ZZZZ");
        assert_eq!(c.redact("sk-other-****XyZ"), "sk-other-****XyZ");
        assert_eq!(c.redact("rate limited... try again"), "rate limited... try again");
    }

    #[test]
    fn credentials_come_from_key_headers_and_the_query() {
        let headers = vec![
            ("x-api-key".into(), "anthropic-secret-1".into()),
            ("x-goog-api-key".into(), "AIzaSyGoogleSecret".into()),
            ("X-Custom-Token".into(), "custom-token-value".into()),
            ("accept".into(), "application/json".into()),
        ];
        let c = Credentials::from_request(
            &headers,
            "https://user:p%40ss-word@h.example/v1/m:generate?alt=sse&key=AIza%2BQuery&api-version=2024-02-01",
        );
        let text = "anthropic-secret-1 AIzaSyGoogleSecret custom-token-value AIza+Query AIza%2BQuery p@ss-word alt=sse application/json 2024-02-01";
        assert_eq!(
            c.redact(text),
            "[redacted] [redacted] [redacted] [redacted] [redacted] [redacted] alt=sse application/json 2024-02-01"
        );
    }

    #[test]
    fn nothing_to_redact_borrows() {
        let c = bearer(KEY);
        assert!(matches!(c.redact("all fine"), Cow::Borrowed(_)));
        assert!(Credentials::from_request(&[], "http://h/").is_empty());
    }

    proptest! {
        /// However the key is quoted (whole, inside any text), it never survives.
        #[test]
        fn a_key_never_survives(before in ".{0,40}", after in ".{0,40}", key in "[A-Za-z_-]{0,30}[0-9][A-Za-z0-9_-]{3,30}") {
            let c = bearer(&key);
            let text = format!("{before}{key}{after}");
            prop_assert!(!c.redact(&text).contains(key.as_str()));
        }

        /// Text without a credential is left alone, and redaction never panics.
        #[test]
        fn other_text_is_left_alone(text in "[^k]{0,80}", key in "k[A-Za-z0-9]{15,40}") {
            let c = bearer(&key);
            let redacted = c.redact(&text);
            prop_assert_eq!(redacted.as_ref(), text.as_str());
        }
    }
}
