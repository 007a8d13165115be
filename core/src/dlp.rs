//! Data protection: detectors of sensitive values in what callers send, and what a policy does
//! with each match (block the call, redact the value, or leave it).
//!
//! A [`Scanner`] holds the built-in detectors (`card`, `iban`, `email`, `phone`, `ssn`, `ip`,
//! `secret`) and an operator's named patterns, compiled once per snapshot. [`Scanner::scan`] finds
//! the matches of the detectors asked for in one text: candidates come from regular expressions,
//! then each detector's check confirms them (Luhn for cards, the ISO 13616 checksum for IBANs,
//! the SSA's rules for SSNs, a parse for IPv6), so near misses pass untouched. Overlapping matches
//! resolve to the earliest, then the longest.

use regex::Regex;
use std::fmt::Write as _;

/// The built-in detectors, in API order.
pub const BUILT_IN: [&str; 7] = ["card", "iban", "email", "phone", "ssn", "ip", "secret"];

/// The detectors a local detection model finds (names, postal addresses): the model runs beside
/// the pattern rules when one is configured (`MESHFAST_DLP_MODEL_URL`), and the values it found
/// come into [`Protected::model_values`]; without one they find nothing, and a policy that wants
/// them blocks the call rather than let them leave unchecked ([`Dlp::model_detectors`]).
pub const MODEL_DETECTORS: [&str; 2] = ["person", "address"];

/// What a policy does with a detector's matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    Off,
    Redact,
    Pseudonymize,
    Block,
}

impl Action {
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "off" => Self::Off,
            "redact" => Self::Redact,
            "pseudonymize" => Self::Pseudonymize,
            "block" => Self::Block,
            _ => return None,
        })
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Redact => "redact",
            Self::Pseudonymize => "pseudonymize",
            Self::Block => "block",
        }
    }
}

/// One match: the detector (its index in [`Scanner::names`]) and the byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub detector: usize,
    pub start: usize,
    pub end: usize,
}

struct Piece {
    pattern: Regex,
    anchor: Anchor,
    /// The longest match in bytes (from the pattern; unbounded ones only run as `Anywhere`).
    max_len: usize,
    /// For a text with a digit outside ASCII: the pattern with Unicode `\d` and `\b`, over the
    /// whole text (a `١` among a card's digits must not hide it).
    unicode: Option<Box<Piece>>,
}

struct Detector {
    name: String,
    pieces: Vec<Piece>,
    check: fn(&str) -> bool,
}

/// The detectors of one snapshot.
pub struct Scanner {
    detectors: Vec<Detector>,
}

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.detectors.iter().map(|d| &d.name)).finish()
    }
}

fn any(_: &str) -> bool {
    true
}

fn digits(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.chars().filter_map(|c| c.to_digit(10))
}

/// A payment card number: 13 to 19 digits, together or grouped as cards print them (4-4-4-4,
/// 4-4-4-4-3, 4-6-5, 4-6-4, with spaces or hyphens), a known leading digit (2 to 6) and a valid
/// Luhn check digit.
#[must_use]
pub fn card_ok(text: &str) -> bool {
    let groups: Vec<usize> = text.split([' ', '-']).map(str::len).collect();
    if groups.len() > 1
        && !matches!(
            groups.as_slice(),
            [4, 4, 4, 4] | [4, 4, 4, 4, 3] | [4, 6, 5] | [4, 6, 4]
        )
    {
        return false;
    }
    let ds: Vec<u32> = digits(text).collect();
    if !(13..=19).contains(&ds.len()) || !(2..=6).contains(&ds[0]) {
        return false;
    }
    let sum: u32 = ds
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            if i % 2 == 1 {
                if d * 2 > 9 {
                    d * 2 - 9
                } else {
                    d * 2
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// An IBAN: the country and check digits, then the account (spaces allowed), whose ISO 13616
/// remainder (mod 97) is 1.
#[must_use]
pub fn iban_ok(text: &str) -> bool {
    let compact: Vec<u8> = text.bytes().filter(|b| *b != b' ').collect();
    if !(15..=34).contains(&compact.len()) {
        return false;
    }
    let mut remainder: u32 = 0;
    for &b in compact[4..].iter().chain(&compact[..4]) {
        let value = match b {
            b'0'..=b'9' => u32::from(b - b'0'),
            b'A'..=b'Z' => u32::from(b - b'A') + 10,
            _ => return false,
        };
        remainder = if value >= 10 {
            (remainder * 100 + value) % 97
        } else {
            (remainder * 10 + value) % 97
        };
    }
    remainder == 1
}

/// A US Social Security number as the SSA issues them: area not 000, 666 or 9xx, group not 00,
/// serial not 0000.
#[must_use]
pub fn ssn_ok(text: &str) -> bool {
    let ds: Vec<u32> = digits(text).collect();
    if ds.len() != 9 {
        return false;
    }
    let area = ds[0] * 100 + ds[1] * 10 + ds[2];
    let group = ds[3] * 10 + ds[4];
    let serial = ds[5..].iter().fold(0, |n, d| n * 10 + d);
    area != 0 && area != 666 && area < 900 && group != 0 && serial != 0
}

fn ipv6_ok(text: &str) -> bool {
    // NOTE: at least three groups with digits in them, so `std::vec::Vec` or `a::b` in code is
    // not an address (the loopback `::1` is let go).
    text.split(':').filter(|g| !g.is_empty()).count() >= 3
        && text.bytes().any(|b| b.is_ascii_digit())
        && text.parse::<std::net::Ipv6Addr>().is_ok()
}

fn phone_ok(text: &str) -> bool {
    let n = digits(text).count();
    if text.starts_with('0') {
        // A national number with its trunk prefix: 10 or 11 digits (as 020 7946 0958).
        return (10..=11).contains(&n);
    }
    (8..=15).contains(&n)
}

/// Where a piece of a built-in detector's pattern can start a match, so [`Scanner::scan`] runs it
/// only on the windows of the text around such places (most prose holds few digits).
#[derive(Clone, Copy, Debug)]
enum Anchor {
    /// Anywhere: the piece runs over the whole text (its regular expression has a literal the
    /// search skips ahead to, `@`, `:` or a key's prefix, or it is an operator's pattern).
    Anywhere,
    /// At most `before` bytes ahead of a digit at a word boundary (ASCII: the byte before it is
    /// not a letter, digit or `_`), as a card, phone, SSN or IPv4 candidate starts; a candidate
    /// holds at least `digits` digits, so a window with fewer is not searched.
    BoundaryDigit { before: usize, digits: u32 },
    /// At two capital letters at a word boundary then two digits, as an IBAN candidate starts.
    Iban,
}

/// A built-in detector: its name, its candidate patterns with where each can start (each finds
/// candidates on its own; [`Scanner::scan`] resolves overlaps), and its confirming check.
type BuiltIn = (&'static str, &'static [(&'static str, Anchor)], fn(&str) -> bool);

// NOTE: ASCII word boundaries and digits (`(?-u:\b)`, `[0-9]`): the checks count ASCII digits
// only, and a Unicode `\b` keeps the regex crate off its fast DFA for text with non-ASCII bytes.
const BUILT_IN_PATTERNS: [BuiltIn; 7] = [
    (
        "card",
        &[(
            r"(?-u:\b)[2-6][0-9]{3}(?:[ -]?[0-9]){9,15}(?-u:\b)",
            Anchor::BoundaryDigit { before: 0, digits: 13 },
        )],
        card_ok,
    ),
    (
        "iban",
        &[(r"(?-u:\b)[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}(?-u:\b)", Anchor::Iban)],
        iban_ok,
    ),
    (
        "email",
        &[(
            r"(?-u:\b)[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,24}(?-u:\b)",
            Anchor::Anywhere,
        )],
        any,
    ),
    (
        "phone",
        &[(
            concat!(
                r"\+[1-9](?:[ .-]?[0-9]){7,14}(?-u:\b)",
                r"|(?:\([0-9]{3}\) ?|(?-u:\b)[0-9]{3}[ .-])[0-9]{3}[ .-][0-9]{4}(?-u:\b)",
                r"|(?-u:\b)0[0-9]{1,4}[ -][0-9]{3,4}[ -][0-9]{3,4}(?-u:\b)",
            ),
            Anchor::BoundaryDigit { before: 1, digits: 7 },
        )],
        phone_ok,
    ),
    (
        "ssn",
        &[(
            r"(?-u:\b)[0-9]{3}-[0-9]{2}-[0-9]{4}(?-u:\b)|(?-u:\b)[0-9]{3} [0-9]{2} [0-9]{4}(?-u:\b)",
            Anchor::BoundaryDigit { before: 0, digits: 9 },
        )],
        ssn_ok,
    ),
    (
        "ip",
        &[
            (
                r"(?-u:\b)(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?-u:\b)",
                Anchor::BoundaryDigit { before: 0, digits: 4 },
            ),
            (r"[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}", Anchor::Anywhere),
        ],
        ip_ok,
    ),
    (
        "secret",
        &[(
            concat!(
                r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z]+ )*PRIVATE KEY-----",
                r"|(?-u:\b)(?:AKIA|ASIA)[0-9A-Z]{16}(?-u:\b)",
                r"|(?-u:\b)gh[pousr]_[A-Za-z0-9]{36,255}(?-u:\b)|(?-u:\b)github_pat_[A-Za-z0-9_]{22,255}(?-u:\b)",
                r"|(?-u:\b)glpat-[A-Za-z0-9_-]{20,}",
                r"|(?-u:\b)sk-ant-[A-Za-z0-9_-]{20,}|(?-u:\b)sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}",
                r"|(?-u:\b)(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|(?-u:\b)hf_[A-Za-z0-9]{30,}|(?-u:\b)gsk_[A-Za-z0-9]{40,}",
                r"|(?-u:\b)npm_[A-Za-z0-9]{36}(?-u:\b)|(?-u:\b)xapp-[A-Za-z0-9-]{10,}|(?-u:\b)glrt-[A-Za-z0-9_-]{20,}",
                r"|https://hooks\.slack\.com/services/[A-Za-z0-9/]{20,}|AccountKey=[A-Za-z0-9+/=]{40,}",
                r"|-----BEGIN PGP PRIVATE KEY BLOCK-----[\s\S]*?(?:-----END PGP PRIVATE KEY BLOCK-----|\z)",
                r"|(?-u:\b)xox[abposr]-[A-Za-z0-9-]{10,}",
                r"|(?-u:\b)AIza[0-9A-Za-z_-]{35}",
                r"|(?-u:\b)mesh_live_[A-Za-z0-9_-]{20,}",
                r"|(?-u:\b)eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{10,}",
            ),
            Anchor::Anywhere,
        )],
        secret_ok,
    ),
];

fn secret_ok(text: &str) -> bool {
    // An `sk-` word without a digit is prose (`sk-learn-compatible`), not a key.
    !text.starts_with("sk-") || text.bytes().any(|b| b.is_ascii_digit())
}

fn ip_ok(text: &str) -> bool {
    if text.contains(':') {
        ipv6_ok(text)
    } else {
        text.parse::<std::net::Ipv4Addr>().is_ok()
    }
}

/// The longest custom pattern accepted, and the most per snapshot.
pub const MAX_PATTERN_BYTES: usize = 1000;
pub const MAX_CUSTOM: usize = 100;

/// Why an operator's pattern cannot be a detector.
pub fn pattern_problem(pattern: &str) -> Option<String> {
    if pattern.is_empty() || pattern.len() > MAX_PATTERN_BYTES {
        return Some(format!("must be 1 to {MAX_PATTERN_BYTES} bytes"));
    }
    match regex::RegexBuilder::new(pattern).size_limit(1 << 20).build() {
        Ok(re) if re.is_match("") => Some("matches the empty text".to_owned()),
        Ok(_) => match regex_syntax::parse(pattern) {
            // NOTE: `\bq?` never matches "" alone, yet matches nothing at every word boundary.
            Ok(hir) if hir.properties().minimum_len().unwrap_or(0) == 0 => Some("can match an empty span".to_owned()),
            Ok(_) => None,
            Err(e) => Some(e.to_string().lines().last().unwrap_or("does not compile").to_owned()),
        },
        Err(e) => Some(e.to_string().lines().last().unwrap_or("does not compile").to_owned()),
    }
}

impl Scanner {
    /// The built-in detectors and `custom` (name, pattern) ones; Err lists the patterns that do
    /// not compile.
    pub fn new(custom: &[(String, String)]) -> Result<Self, Vec<String>> {
        let mut detectors: Vec<Detector> = BUILT_IN_PATTERNS
            .iter()
            .map(|(name, pieces, check)| Detector {
                name: (*name).to_owned(),
                pieces: pieces
                    .iter()
                    .map(|&(pattern, anchor)| {
                        let max_len = regex_syntax::parse(pattern)
                            .ok()
                            .and_then(|hir| hir.properties().maximum_len());
                        let unicode = pattern.replace("(?-u:\\b)", "\\b").replace("[0-9]", "\\d");
                        Piece {
                            pattern: Regex::new(pattern).expect("a built-in detector compiles"),
                            // An unbounded piece cannot be windowed (none is today).
                            anchor: if max_len.is_some() { anchor } else { Anchor::Anywhere },
                            max_len: max_len.unwrap_or(usize::MAX),
                            unicode: (!matches!(anchor, Anchor::Anywhere)).then(|| {
                                Box::new(Piece {
                                    pattern: Regex::new(&unicode).expect("a built-in detector compiles"),
                                    anchor: Anchor::Anywhere,
                                    max_len: usize::MAX,
                                    unicode: None,
                                })
                            }),
                        }
                    })
                    .collect(),
                check: *check,
            })
            .collect();
        detectors.extend(MODEL_DETECTORS.iter().map(|name| Detector {
            name: (*name).to_owned(),
            pieces: Vec::new(),
            check: any,
        }));
        let mut problems = Vec::new();
        for (name, pattern) in custom.iter().take(MAX_CUSTOM) {
            match pattern_problem(pattern) {
                Some(problem) => problems.push(format!("custom detector {name:?}: {problem}")),
                None => detectors.push(Detector {
                    name: name.clone(),
                    pieces: vec![Piece {
                        pattern: regex::RegexBuilder::new(pattern)
                            .size_limit(1 << 20)
                            .build()
                            .expect("checked above"),
                        anchor: Anchor::Anywhere,
                        max_len: usize::MAX,
                        unicode: None,
                    }],
                    check: any,
                }),
            }
        }
        if problems.is_empty() {
            Ok(Self { detectors })
        } else {
            Err(problems)
        }
    }

    /// The detectors' names, by index.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.detectors.iter().map(|d| d.name.as_str())
    }

    #[must_use]
    pub fn index(&self, name: &str) -> Option<usize> {
        self.detectors.iter().position(|d| d.name == name)
    }

    #[must_use]
    pub fn name(&self, index: usize) -> &str {
        &self.detectors[index].name
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.detectors.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.detectors.is_empty()
    }

    /// The confirmed matches in `text` of the detectors `wanted` says yes to, in order, without
    /// overlaps (the earliest wins, then the longest).
    ///
    /// A windowed piece (card, IBAN, phone, SSN, IPv4) searches only the windows around the
    /// places its matches can start, each from its first such place to its last plus the
    /// piece's longest match and a character of look-ahead: no match can start outside them or
    /// reach a window's end, so the matches are the ones a search of the whole text finds
    /// ([`Scanner::scan_whole`], which the tests compare it with).
    pub fn scan(&self, text: &str, wanted: impl Fn(usize) -> bool) -> Vec<Found> {
        let mut found: Vec<Found> = Vec::new();
        let mut starts: Option<Starts> = None;
        let unicode_digits = has_unicode_digits(text);
        for (i, d) in self.detectors.iter().enumerate() {
            if !wanted(i) {
                continue;
            }
            for piece in &d.pieces {
                let piece = match &piece.unicode {
                    Some(unicode) if unicode_digits => unicode,
                    _ => piece,
                };
                if matches!(piece.anchor, Anchor::Anywhere) {
                    find_in(text, text.len(), 0, d, i, piece, &mut found);
                    continue;
                }
                let starts = &*starts.get_or_insert_with(|| Starts::of(text));
                let places: &[usize] = match piece.anchor {
                    Anchor::Iban => &starts.iban,
                    _ => &starts.digits,
                };
                let (before, least) = match piece.anchor {
                    Anchor::BoundaryDigit { before, digits } => (before, digits),
                    _ => (0, 0),
                };
                let reach = piece.max_len.saturating_add(LOOK_AHEAD);
                let mut k = 0;
                while k < places.len() {
                    let from = places[k].saturating_sub(before);
                    let mut to = places[k].saturating_add(reach);
                    k += 1;
                    while k < places.len() && places[k].saturating_sub(before) <= to {
                        to = places[k].saturating_add(reach);
                        k += 1;
                    }
                    let mut to = to.min(text.len());
                    while !text.is_char_boundary(to) {
                        to += 1;
                    }
                    if starts.digits_in(from, to) >= least {
                        find_in(text, to, from, d, i, piece, &mut found);
                    }
                }
            }
        }
        resolve(found)
    }

    /// [`Scanner::scan`] with every piece searching the whole text: the reference the windowed
    /// search must agree with.
    #[must_use]
    pub fn scan_whole(&self, text: &str, wanted: impl Fn(usize) -> bool) -> Vec<Found> {
        let mut found: Vec<Found> = Vec::new();
        let unicode_digits = has_unicode_digits(text);
        for (i, d) in self.detectors.iter().enumerate() {
            if wanted(i) {
                for piece in &d.pieces {
                    let piece = match &piece.unicode {
                        Some(unicode) if unicode_digits => unicode,
                        _ => piece,
                    };
                    find_in(text, text.len(), 0, d, i, piece, &mut found);
                }
            }
        }
        resolve(found)
    }
}

/// Whether `text` holds a digit outside ASCII (Arabic-Indic, fullwidth, ...): then the windowed
/// pieces search with Unicode digits over the whole text, as the patterns did before windows.
fn has_unicode_digits(text: &str) -> bool {
    !text.is_ascii() && text.chars().any(|c| !c.is_ascii() && c.is_numeric())
}

/// Bytes past a windowed piece's longest match that its window keeps, so the word boundary
/// after a match sees the character there (at most 4 bytes in UTF-8).
const LOOK_AHEAD: usize = 4;

/// Where windowed pieces' matches can start in one text, found in one pass over its bytes.
struct Starts {
    /// Digits at a word boundary.
    digits: Vec<usize>,
    /// Two capital letters at a word boundary, then two digits.
    iban: Vec<usize>,
    /// Which bytes are digits, 64 to a word.
    masks: Vec<u64>,
}

impl Starts {
    fn of(text: &str) -> Self {
        let bytes = text.as_bytes();
        let word = |at: usize| bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_';
        let mut out = Self {
            digits: Vec::new(),
            iban: Vec::new(),
            masks: Vec::with_capacity(bytes.len().div_ceil(64)),
        };
        // NOTE: 64 bytes at a time into a bit mask (the loop vectorizes); prose has few digits.
        let mut tail = [0u8; 64];
        let whole = bytes.len() / 64 * 64;
        tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
        let chunks = bytes.chunks_exact(64).chain(std::iter::once(&tail[..]));
        for (c, chunk) in chunks.enumerate() {
            let mut mask = digit_mask(chunk.try_into().expect("64 bytes"));
            out.masks.push(mask);
            while mask != 0 {
                let at = c * 64 + mask.trailing_zeros() as usize;
                mask &= mask - 1;
                if at == 0 || !word(at - 1) {
                    out.digits.push(at);
                } else if at >= 2
                    && bytes[at - 1].is_ascii_uppercase()
                    && bytes[at - 2].is_ascii_uppercase()
                    && bytes.get(at + 1).is_some_and(u8::is_ascii_digit)
                    && (at == 2 || !word(at - 3))
                {
                    out.iban.push(at - 2);
                }
            }
        }
        out
    }

    /// How many digits `text[from..to]` holds.
    fn digits_in(&self, from: usize, to: usize) -> u32 {
        let bits = |word: usize, lo: usize, hi: usize| {
            let keep = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            (self.masks[word] & keep).count_ones()
        };
        if from >= to {
            return 0;
        }
        let (first, last) = (from / 64, (to - 1) / 64);
        if first == last {
            return bits(first, from % 64, (to - 1) % 64 + 1);
        }
        bits(first, from % 64, 64)
            + self.masks[first + 1..last].iter().map(|m| m.count_ones()).sum::<u32>()
            + bits(last, 0, (to - 1) % 64 + 1)
    }
}

/// Bit `j` set where `chunk[j]` is an ASCII digit.
#[cfg(target_arch = "x86_64")]
fn digit_mask(chunk: &[u8; 64]) -> u64 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_set1_epi8, _mm_sub_epi8,
    };
    let mut mask = 0u64;
    for (k, sixteen) in chunk.chunks_exact(16).enumerate() {
        // SAFETY: SSE2 is part of x86_64; the load reads the 16 bytes of `sixteen`, unaligned.
        let bits = unsafe {
            let v = _mm_sub_epi8(
                _mm_loadu_si128(sixteen.as_ptr().cast::<__m128i>()),
                _mm_set1_epi8(b'0' as i8),
            );
            // (byte - '0') as unsigned < 10  <=>  min(it, 9) == it
            _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(9)), v))
        };
        mask |= u64::from(bits as u16) << (16 * k);
    }
    mask
}

#[cfg(not(target_arch = "x86_64"))]
fn digit_mask(chunk: &[u8; 64]) -> u64 {
    chunk
        .iter()
        .enumerate()
        .fold(0, |mask, (j, b)| mask | u64::from(b.wrapping_sub(b'0') < 10) << j)
}

/// The candidates of `piece` in `text[..end]` from `from` on, confirmed by `d`'s check (or, for
/// grouped detectors, the best run of groups in a candidate that fails it), added to `found`.
fn find_in(text: &str, end: usize, from: usize, d: &Detector, i: usize, piece: &Piece, found: &mut Vec<Found>) {
    let hay = &text[..end];
    let mut at = from;
    while at <= hay.len() {
        let Some(m) = piece.pattern.find_at(hay, at) else { break };
        if (d.check)(m.as_str()) {
            found.push(Found {
                detector: i,
                start: m.start(),
                end: m.end(),
            });
            at = m.end().max(m.start() + 1);
        } else if let Some((start, end)) = grouped(&d.name).then(|| best_groups(m.as_str(), d.check)).flatten() {
            // The pattern took too much (an expiry after a card, a year before it): the
            // longest run of whole groups that passes the check.
            found.push(Found {
                detector: i,
                start: m.start() + start,
                end: m.start() + end,
            });
            at = m.start() + end;
        } else {
            // Nothing in it: try again from its second group (a year before a card).
            at = if grouped(&d.name) {
                m.as_str().find([' ', '-']).map_or(m.end(), |sep| m.start() + sep + 1)
            } else {
                m.end()
            }
            .max(m.start() + 1);
        }
        while at < hay.len() && !hay.is_char_boundary(at) {
            at += 1;
        }
    }
}

/// `found` in order without overlaps: the earliest wins, then the longest.
fn resolve(mut found: Vec<Found>) -> Vec<Found> {
    found.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    let mut out: Vec<Found> = Vec::with_capacity(found.len());
    for f in found {
        if out.last().is_none_or(|last| f.start >= last.end) {
            out.push(f);
        }
    }
    out
}

/// The detectors whose values print in groups of digits: a candidate that fails its check may
/// hold a valid value among its groups.
fn grouped(name: &str) -> bool {
    matches!(name, "card" | "iban" | "phone" | "ssn")
}

/// Within a candidate that failed its check, the longest run of whole groups (split at spaces and
/// hyphens) that passes it, as byte offsets; at most 12 groups are tried.
fn best_groups(candidate: &str, check: fn(&str) -> bool) -> Option<(usize, usize)> {
    let mut bounds = vec![0];
    for (i, c) in candidate.char_indices() {
        if c == ' ' || c == '-' {
            bounds.push(i);
            bounds.push(i + 1);
        }
    }
    bounds.push(candidate.len());
    let groups: Vec<(usize, usize)> = bounds
        .chunks(2)
        .filter(|p| p.len() == 2)
        .map(|p| (p[0], p[1]))
        .collect();
    if groups.len() < 2 || groups.len() > 12 {
        return None;
    }
    for len in (1..groups.len()).rev() {
        for first in 0..=groups.len() - len {
            let (start, end) = (groups[first].0, groups[first + len - 1].1);
            if check(&candidate[start..end]) {
                return Some((start, end));
            }
        }
    }
    None
}

/// `text` with each match replaced: `[REDACTED:<detector>]` for redaction, `pseudonym(match)`
/// for pseudonymization (detectors whose action is neither keep their text).
pub fn rewrite(
    text: &str,
    found: &[Found],
    scanner: &Scanner,
    action: impl Fn(usize) -> Action,
    mut pseudonym: impl FnMut(usize, &str) -> String,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for f in found {
        out.push_str(&text[at..f.start]);
        match action(f.detector) {
            Action::Redact | Action::Block => {
                let _ = write!(out, "[REDACTED:{}]", scanner.name(f.detector));
            }
            Action::Pseudonymize => out.push_str(&pseudonym(f.detector, &text[f.start..f.end])),
            Action::Off => out.push_str(&text[f.start..f.end]),
        }
        at = f.end;
    }
    out.push_str(&text[at..]);
    out
}

/// A data protection policy as the snapshot's config carries it (meshfast.snapshot): its action
/// per detector name, and whom it applies to (model, provider and principal indexes, business
/// units, tiers; every list empty: every call; AND across lists, OR within one; people and
/// applications share `principals`).
#[derive(Debug, Default, serde::Deserialize)]
pub struct RawPolicy {
    pub name: String,
    #[serde(default)]
    pub actions: Vec<(String, String)>,
    #[serde(default)]
    pub models: Vec<i64>,
    #[serde(default)]
    pub providers: Vec<i64>,
    #[serde(default)]
    pub business_units: Vec<String>,
    #[serde(default)]
    pub tiers: Vec<String>,
    #[serde(default)]
    pub principals: Vec<i64>,
    /// Leaders (principal indexes): the policy covers their organisations.
    #[serde(default)]
    pub leaders: Vec<i64>,
}

/// The enabled policies of a snapshot and the detectors they use.
#[derive(Debug, Default, serde::Deserialize)]
pub struct RawDlp {
    /// The operators' named patterns (every policy's, one name one pattern).
    #[serde(default)]
    pub custom: Vec<(String, String)>,
    #[serde(default)]
    pub policies: Vec<RawPolicy>,
}

/// One compiled policy.
#[derive(Debug)]
pub struct Policy {
    pub name: String,
    /// By detector index ([`Scanner`]).
    pub actions: Vec<Action>,
    pub models: Vec<u32>,
    pub providers: Vec<u32>,
    pub business_units: Vec<String>,
    pub tiers: Vec<String>,
    pub principals: Vec<u32>,
    pub leaders: Vec<u32>,
}

/// The snapshot's data protection: one scanner, the policies.
#[derive(Debug)]
pub struct Dlp {
    pub scanner: Scanner,
    pub policies: Vec<Policy>,
}

/// What protection did to one call.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Protected {
    /// Matches by detector name, in detector order.
    pub counts: Vec<(String, u32)>,
    /// The strongest action taken.
    pub action: Option<Action>,
    /// The detectors whose matches block the call.
    pub blocked: Vec<String>,
    /// Surrogate → original of every value pseudonymized: what [`Restorer`] puts back.
    pub restore: Vec<(String, String)>,
    /// Values the detection model found in this call's texts, by detector index: each of their
    /// occurrences is a match of that detector, in every text of the call.
    pub model_values: ModelValues,
}

impl Protected {
    /// Matches so far, every detector together: a text whose scan raised it was rewritten (or blocks).
    #[must_use]
    pub fn found(&self) -> u32 {
        self.counts.iter().map(|(_, c)| *c).sum()
    }
}

/// The most values of the detection model one call takes (more: the model's answer is refused).
pub const MAX_MODEL_VALUES: usize = 10_000;

/// The detection model's values for one call, searched in one pass over a text (Aho-Corasick,
/// leftmost-longest), each occurrence only where it stands as a word of its own.
#[derive(Debug, Default, Clone)]
pub struct ModelValues {
    values: Vec<(usize, String)>,
    matcher: Option<aho_corasick::AhoCorasick>,
}

impl PartialEq for ModelValues {
    fn eq(&self, other: &Self) -> bool {
        self.values == other.values
    }
}

impl Eq for ModelValues {}

impl ModelValues {
    #[must_use]
    pub fn new(values: &[(usize, String)]) -> Self {
        let values: Vec<(usize, String)> = values.iter().take(MAX_MODEL_VALUES).cloned().collect();
        let matcher = (!values.is_empty())
            .then(|| {
                aho_corasick::AhoCorasick::builder()
                    .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                    .build(values.iter().map(|(_, v)| v.as_str()))
                    .ok()
            })
            .flatten();
        Self { values, matcher }
    }

    fn find(&self, text: &str, wanted: impl Fn(usize) -> bool, found: &mut Vec<Found>) {
        let Some(matcher) = &self.matcher else { return };
        let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
        for m in matcher.find_iter(text) {
            let (detector, value) = &self.values[m.pattern().as_usize()];
            if !wanted(*detector) {
                continue;
            }
            // NOTE: "Al" is not a match inside "Also": a value that begins or ends with a letter
            // or digit matches only where the text does not go on with one.
            let before = text[..m.start()].chars().next_back();
            let after = text[m.end()..].chars().next();
            if (word(value.chars().next()) && word(before)) || (word(value.chars().next_back()) && word(after)) {
                continue;
            }
            found.push(Found {
                detector: *detector,
                start: m.start(),
                end: m.end(),
            });
        }
    }
}

impl Dlp {
    /// Compiles `raw` against the snapshot's sizes; Err lists every problem.
    pub fn build(raw: RawDlp, principals: usize, models: usize, providers: usize) -> Result<Option<Self>, Vec<String>> {
        if raw.policies.is_empty() {
            return Ok(None);
        }
        let scanner = Scanner::new(&raw.custom)?;
        let mut problems = Vec::new();
        let index = |problems: &mut Vec<String>, what: String, i: i64, len: usize| -> u32 {
            if i < 0 || i as usize >= len {
                problems.push(format!("{what}: index {i} out of range"));
                0
            } else {
                i as u32
            }
        };
        let policies = raw
            .policies
            .into_iter()
            .map(|p| {
                let mut actions = vec![Action::Off; scanner.len()];
                for (name, action) in &p.actions {
                    match (scanner.index(name), Action::parse(action)) {
                        (Some(d), Some(a)) => actions[d] = a,
                        _ => problems.push(format!("dlp policy {:?}: {name:?} -> {action:?}", p.name)),
                    }
                }
                let what = format!("dlp policy {:?}", p.name);
                Policy {
                    models: p
                        .models
                        .iter()
                        .map(|&i| index(&mut problems, what.clone(), i, models))
                        .collect(),
                    providers: p
                        .providers
                        .iter()
                        .map(|&i| index(&mut problems, what.clone(), i, providers))
                        .collect(),
                    principals: p
                        .principals
                        .iter()
                        .map(|&i| index(&mut problems, what.clone(), i, principals))
                        .collect(),
                    leaders: p
                        .leaders
                        .iter()
                        .map(|&i| index(&mut problems, what.clone(), i, principals))
                        .collect(),
                    name: p.name,
                    actions,
                    business_units: p.business_units,
                    tiers: p.tiers,
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(Some(Self { scanner, policies }))
        } else {
            Err(problems)
        }
    }

    /// The scanner's matches in `text` and each occurrence of the model's `values`, without
    /// overlaps (the earliest wins, then the longest).
    fn scan(&self, text: &str, wanted: impl Fn(usize) -> bool, values: &ModelValues) -> Vec<Found> {
        let found = self.scanner.scan(text, &wanted);
        if values.matcher.is_none() {
            return found;
        }
        let mut all = found;
        values.find(text, &wanted, &mut all);
        resolve(all)
    }

    /// Whether any enabled policy sets an action for a model detector: only then does the edge
    /// ask the detection model.
    #[must_use]
    pub fn wants_model(&self) -> bool {
        let model: Vec<usize> = MODEL_DETECTORS.iter().filter_map(|n| self.scanner.index(n)).collect();
        self.policies.iter().any(|p| {
            model
                .iter()
                .any(|&d| p.actions.get(d).is_some_and(|a| *a != Action::Off))
        })
    }

    /// The model detectors `acts` turns on (their names): what a call must block when the model
    /// did not answer.
    #[must_use]
    pub fn model_detectors(&self, acts: &[Action]) -> Vec<String> {
        MODEL_DETECTORS
            .iter()
            .filter(|n| self.scanner.index(n).is_some_and(|d| acts[d] != Action::Off))
            .map(|n| (*n).to_owned())
            .collect()
    }

    /// The detection model's findings as [`Protected::model_values`]: (type, value) pairs whose
    /// type is a model detector; others and empty values are left out.
    #[must_use]
    pub fn model_values(&self, found: &[(String, String)]) -> Vec<(usize, String)> {
        let mut out: Vec<(usize, String)> = found
            .iter()
            .filter(|(_, value)| !value.trim().is_empty())
            .filter_map(|(kind, value)| {
                MODEL_DETECTORS
                    .contains(&kind.as_str())
                    .then(|| self.scanner.index(kind))
                    .flatten()
                    .map(|d| (d, value.clone()))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The strongest action of every policy that applies to a call, by detector; None when no
    /// detector is on for it.
    #[must_use]
    pub fn actions_for(
        &self,
        principal: u32,
        business_unit: Option<&str>,
        tier: Option<&str>,
        model: u32,
        provider: u32,
        in_organisation_of: impl Fn(u32) -> bool,
    ) -> Option<Vec<Action>> {
        let listed = |list: &[String], value: Option<&str>| {
            list.is_empty() || value.is_some_and(|v| list.iter().any(|x| x == v))
        };
        let mut out: Option<Vec<Action>> = None;
        for p in &self.policies {
            let applies = (p.models.is_empty() || p.models.contains(&model))
                && (p.providers.is_empty() || p.providers.contains(&provider))
                && (p.principals.is_empty() || p.principals.contains(&principal))
                && (p.leaders.is_empty() || p.leaders.iter().any(|&l| in_organisation_of(l)))
                && listed(&p.business_units, business_unit)
                && listed(&p.tiers, tier);
            if !applies {
                continue;
            }
            let acts = out.get_or_insert_with(|| vec![Action::Off; p.actions.len()]);
            for (a, b) in acts.iter_mut().zip(&p.actions) {
                *a = (*a).max(*b);
            }
        }
        out.filter(|acts| acts.iter().any(|a| *a != Action::Off))
    }

    /// Scans and rewrites one text in place; false when a match blocks the call (the text is
    /// then left as it was).
    pub fn protect(&self, text: &mut String, acts: &[Action], out: &mut Protected, names: &mut Pseudonyms) -> bool {
        if text.is_empty() {
            return true;
        }
        // NOTE: a blocking detector is looked for alone first: a longer match of another
        // detector around its value (a custom pattern over a card) must not hide it.
        if acts.contains(&Action::Block) {
            for f in self.scan(text, |d| acts[d] == Action::Block, &out.model_values) {
                let name = self.scanner.name(f.detector);
                match out.counts.iter_mut().find(|(n, _)| n == name) {
                    Some((_, c)) => *c += 1,
                    None => out.counts.push((name.to_owned(), 1)),
                }
                out.action = Some(Action::Block);
                if !out.blocked.iter().any(|b| b == name) {
                    out.blocked.push(name.to_owned());
                }
            }
            if !out.blocked.is_empty() {
                return false;
            }
        }
        let found = self.scan(text, |d| acts[d] != Action::Off, &out.model_values);
        if found.is_empty() {
            return true;
        }
        for f in &found {
            let name = self.scanner.name(f.detector);
            match out.counts.iter_mut().find(|(n, _)| n == name) {
                Some((_, c)) => *c += 1,
                None => out.counts.push((name.to_owned(), 1)),
            }
            let action = acts[f.detector];
            out.action = out.action.max(Some(action));
            if action == Action::Block && !out.blocked.iter().any(|b| b == name) {
                out.blocked.push(name.to_owned());
            }
        }
        if !out.blocked.is_empty() {
            return false;
        }
        *text = rewrite(
            text,
            &found,
            &self.scanner,
            |d| acts[d],
            |d, v| names.get(self.scanner.name(d), v),
        );
        true
    }

    /// Every string (and number) in a JSON value, protected in place: a number a detector
    /// matches becomes a string, so the value stays JSON of the same shape.
    pub fn protect_json(
        &self,
        value: &mut serde_json::Value,
        acts: &[Action],
        out: &mut Protected,
        names: &mut Pseudonyms,
    ) {
        use serde_json::Value;
        match value {
            Value::String(text) => {
                self.protect(text, acts, out, names);
            }
            Value::Number(n) => {
                let mut text = n.to_string();
                let before = text.clone();
                self.protect(&mut text, acts, out, names);
                if text != before {
                    *value = Value::String(text);
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.protect_json(item, acts, out, names);
                }
            }
            Value::Object(map) => {
                // NOTE: keys are text the caller sends too (a card as a key of tool arguments):
                // a key with a match is rewritten (keeping its value), or blocks the call.
                let keyed: Vec<String> = map
                    .keys()
                    .filter(|k| !self.scan(k, |d| acts[d] != Action::Off, &out.model_values).is_empty())
                    .cloned()
                    .collect();
                for key in keyed {
                    let mut rewritten = key.clone();
                    self.protect(&mut rewritten, acts, out, names);
                    if rewritten != key && !map.contains_key(&rewritten) {
                        if let Some(item) = map.remove(&key) {
                            map.insert(rewritten, item);
                        }
                    }
                }
                for item in map.values_mut() {
                    self.protect_json(item, acts, out, names);
                }
            }
            _ => {}
        }
    }

    /// A text that may be JSON (a tool call's arguments): protected leaf by leaf when it parses,
    /// so it stays JSON; as text otherwise.
    fn protect_json_text(&self, text: &mut String, acts: &[Action], out: &mut Protected, names: &mut Pseudonyms) {
        if let Ok(mut value) = serde_json::from_str::<serde_json::Value>(text) {
            let before = out.found();
            self.protect_json(&mut value, acts, out, names);
            if out.found() != before {
                if let Ok(rewritten) = serde_json::to_string(&value) {
                    *text = rewritten;
                }
            }
        } else {
            self.protect(text, acts, out, names);
        }
    }

    /// Every text a chat request carries (system, messages, tool calls and results, shown
    /// reasoning, tool descriptions, stop sequences, and the fields a same-format upstream gets
    /// as sent), protected in place.
    pub fn protect_request(
        &self,
        request: &mut crate::translate::Request,
        acts: &[Action],
        values: &[(usize, String)],
    ) -> Protected {
        use crate::translate::Block;
        let mut out = Protected {
            model_values: ModelValues::new(values),
            ..Protected::default()
        };
        let mut names = Pseudonyms::default();
        // NOTE: every text is scanned even once one blocks, so the refusal names every detector.
        for part in &mut request.system {
            self.protect(part, acts, &mut out, &mut names);
        }
        for message in &mut request.messages {
            for block in &mut message.content {
                match block {
                    Block::Text(text) | Block::Thinking { text, .. } => {
                        self.protect(text, acts, &mut out, &mut names);
                    }
                    Block::ToolCall(call) => self.protect_json_text(&mut call.arguments, acts, &mut out, &mut names),
                    Block::ToolResult(result) => {
                        self.protect(&mut result.content, acts, &mut out, &mut names);
                    }
                    Block::Image(image) => self.protect_inline(image, acts, &mut out, &mut names),
                    _ => {}
                }
            }
        }
        for tool in &mut request.tools {
            if let Some(description) = tool.description.as_mut() {
                self.protect(description, acts, &mut out, &mut names);
            }
            self.protect_json(&mut tool.parameters, acts, &mut out, &mut names);
        }
        for stop in &mut request.stop {
            self.protect(stop, acts, &mut out, &mut names);
        }
        for value in request.passthrough.fields.values_mut() {
            self.protect_json(value, acts, &mut out, &mut names);
        }
        self.order(&mut out);
        out.restore = names.originals();
        out
    }

    /// Inline media whose type is text (a Gemini `inlineData` document, a `data:text/...;base64`
    /// URL): its content is read and rewritten like any text; one that is not UTF-8 is blocked
    /// (what cannot be read does not leave). Other media pass as they are.
    fn protect_inline(
        &self,
        image: &mut crate::translate::Image,
        acts: &[Action],
        out: &mut Protected,
        names: &mut Pseudonyms,
    ) {
        use crate::translate::Image;
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::STANDARD;
        let (media_type, data, url_prefix) = match image {
            Image::Base64 { media_type, data } => (media_type.clone(), data, None),
            Image::Url(url) => {
                // NOTE: only a data: URL of a text type is taken apart (an image's is left as it is).
                let Some((head, data)) = url.strip_prefix("data:").and_then(|rest| rest.split_once(',')) else {
                    return;
                };
                let Some(media_type) = head.strip_suffix(";base64").filter(|m| textual_media_type(m)) else {
                    return;
                };
                let (media_type, prefix, data) = (media_type.to_owned(), format!("data:{head},"), data.to_owned());
                *url = data;
                (media_type, url, Some(prefix))
            }
        };
        if textual_media_type(&media_type) {
            match engine
                .decode(data.as_bytes())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
            {
                Some(mut text) => {
                    let before = out.found();
                    self.protect(&mut text, acts, out, names);
                    if out.found() != before && out.blocked.is_empty() {
                        *data = engine.encode(text.as_bytes());
                    }
                }
                None => {
                    out.action = Some(Action::Block);
                    if !out.blocked.iter().any(|b| b == "unreadable") {
                        out.blocked.push("unreadable".to_owned());
                    }
                }
            }
        }
        if let Some(prefix) = url_prefix {
            data.insert_str(0, &prefix);
        }
    }

    fn order(&self, out: &mut Protected) {
        out.counts.sort_by_key(|(name, _)| self.scanner.index(name));
    }

    /// A `/v1/proxy` body (`query` and the text blocks of `content`).
    pub fn protect_proxy(&self, body: &[u8], acts: &[Action]) -> Option<(Protected, Option<Vec<u8>>)> {
        self.protect_body(body, acts, &["query"], true, &[])
    }

    /// A Mesh-native chat body's texts, as the route parsed them: its `query` and its content
    /// blocks' `text`, and a text document's content (base64 in `data`), rewritten in place where
    /// a match is redacted or pseudonymized. None: a text document that is not UTF-8 base64 (what
    /// cannot be read does not leave).
    pub fn protect_mesh(
        &self,
        query: Option<&mut std::borrow::Cow<'_, str>>,
        blocks: &mut [crate::content::RawBlock<'_>],
        acts: &[Action],
        values: &[(usize, String)],
    ) -> Option<Protected> {
        use base64::Engine as _;
        use std::borrow::Cow;
        let mut out = Protected {
            model_values: ModelValues::new(values),
            ..Protected::default()
        };
        let mut names = Pseudonyms::default();
        // NOTE: in place: serde hands these texts over owned, so nothing is copied to scan them.
        let mut visit = |text: &mut Cow<'_, str>, out: &mut Protected| {
            self.protect(text.to_mut(), acts, out, &mut names);
        };
        if let Some(query) = query {
            visit(query, &mut out);
        }
        let engine = base64::engine::general_purpose::STANDARD;
        for block in blocks {
            if let Some(text) = block.text.as_mut() {
                visit(text, &mut out);
            }
            let textual = block.kind.as_deref() == Some("document")
                && block.media_type.as_deref().is_some_and(textual_media_type);
            if let (true, Some(data)) = (textual, block.data.as_mut()) {
                let original = engine
                    .decode(data.as_bytes())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())?;
                let before = out.found();
                let mut text: Cow<'_, str> = Cow::Owned(original);
                visit(&mut text, &mut out);
                if out.found() != before && out.blocked.is_empty() {
                    *data = Cow::Owned(engine.encode(text.as_bytes()));
                }
            }
        }
        self.order(&mut out);
        out.restore = names.originals();
        Some(out)
    }

    /// A Mesh-native body's text `fields` (and, with `content`, the text blocks of `content`):
    /// what protection did, and the body to send on when it rewrote something (None: as it
    /// came). None: the body is not JSON it can read (the call is refused: what it cannot read
    /// must not leave).
    pub fn protect_body(
        &self,
        body: &[u8],
        acts: &[Action],
        fields: &[&str],
        content: bool,
        values: &[(usize, String)],
    ) -> Option<(Protected, Option<Vec<u8>>)> {
        let mut out = Protected {
            model_values: ModelValues::new(values),
            ..Protected::default()
        };
        let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(body) else {
            return None;
        };
        let mut names = Pseudonyms::default();
        let mut changed = false;
        // Protects one text value; true when it rewrote it.
        let mut visit = |text: &mut serde_json::Value, out: &mut Protected| -> bool {
            if let serde_json::Value::String(s) = text {
                let before = out.found();
                self.protect(s, acts, out, &mut names);
                return out.found() != before && out.blocked.is_empty();
            }
            false
        };
        for field in fields {
            if let Some(text) = value.get_mut(*field) {
                changed |= visit(text, &mut out);
            }
        }
        if let (true, Some(serde_json::Value::Array(blocks))) = (content, value.get_mut("content")) {
            use base64::Engine as _;
            for block in blocks {
                if let Some(text) = block.get_mut("text") {
                    changed |= visit(text, &mut out);
                }
                // A text document's content (base64 in `data`) is text the caller sends too; one
                // that does not decode to UTF-8 cannot be read, so the call does not leave.
                let textual = block.get("type").and_then(serde_json::Value::as_str) == Some("document")
                    && block
                        .get("media_type")
                        .and_then(serde_json::Value::as_str)
                        .is_some_and(textual_media_type);
                if let (true, Some(serde_json::Value::String(data))) = (textual, block.get_mut("data")) {
                    let engine = base64::engine::general_purpose::STANDARD;
                    let text = engine
                        .decode(data.as_bytes())
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())?;
                    let mut text = serde_json::Value::String(text);
                    if visit(&mut text, &mut out) {
                        *data = engine.encode(text.as_str().unwrap_or_default());
                        changed = true;
                    }
                }
            }
        }
        self.order(&mut out);
        out.restore = names.originals();
        if !changed || !out.blocked.is_empty() {
            return Some((out, None));
        }
        Some((out, serde_json::to_vec(&value).ok()))
    }
}

/// A media type whose content is text (a Mesh-native `document` block data protection reads):
/// `text/*`, JSON, XML, YAML, CSV and NDJSON, with or without parameters.
fn textual_media_type(media_type: &str) -> bool {
    let essence = media_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence.starts_with("text/")
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
        || matches!(
            essence.as_str(),
            "application/json"
                | "application/xml"
                | "application/yaml"
                | "application/x-yaml"
                | "application/csv"
                | "application/x-ndjson"
        )
}

/// A call's surrogates: the same value gets the same one within the call, shaped like the value
/// (a Luhn-valid card number of its length and grouping, an IBAN of its country with valid check
/// digits, an address at `example.invalid`, a number in the reserved 555 range, an SSN in the
/// never-issued 9xx area, an address in the documentation ranges), never a real one.
#[derive(Debug, Default)]
pub struct Pseudonyms {
    by_value: std::collections::HashMap<String, String>,
}

impl Pseudonyms {
    pub fn get(&mut self, detector: &str, value: &str) -> String {
        if let Some(found) = self.by_value.get(value) {
            return found.clone();
        }
        let n = self.by_value.len() + 1;
        let made = surrogate(detector, value, n);
        self.by_value.insert(value.to_owned(), made.clone());
        made
    }

    /// Surrogate → original, for restoring an answer.
    #[must_use]
    pub fn originals(&self) -> Vec<(String, String)> {
        self.by_value.iter().map(|(v, s)| (s.clone(), v.clone())).collect()
    }
}

/// Puts original values back in place of their surrogates in a streamed answer, whatever the
/// chunking: text that ends in what could be the start of a surrogate is held back until the next
/// piece (or [`flush`](Self::flush)) shows whether it is one.
#[derive(Debug, Default, Clone)]
pub struct Restorer {
    pairs: Vec<(String, String)>,
    pending: String,
}

impl Restorer {
    #[must_use]
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        let mut pairs: Vec<(String, String)> = pairs.into_iter().filter(|(s, _)| !s.is_empty()).collect();
        // NOTE: longest first, so a surrogate that contains another is put back whole.
        pairs.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        Self {
            pairs,
            pending: String::new(),
        }
    }

    #[must_use]
    pub fn is_active(&self) -> bool {
        !self.pairs.is_empty()
    }

    /// The text to pass on now for `piece`.
    pub fn push(&mut self, piece: &str) -> String {
        let mut text = std::mem::take(&mut self.pending);
        text.push_str(piece);
        let mut text = self.replace(text);
        let mut hold = 0;
        for (surrogate, _) in &self.pairs {
            for k in (1..surrogate.len().min(text.len() + 1)).rev() {
                let at = text.len() - k;
                if text.is_char_boundary(at) && surrogate.as_bytes().starts_with(&text.as_bytes()[at..]) {
                    hold = hold.max(k);
                    break;
                }
            }
        }
        self.pending = text.split_off(text.len() - hold);
        text
    }

    /// What is held back, at the end of a block or of the answer.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// `text` with every whole surrogate replaced (one answer, not streamed).
    #[must_use]
    pub fn replace(&self, mut text: String) -> String {
        for (surrogate, original) in &self.pairs {
            if text.contains(surrogate.as_str()) {
                text = text.replace(surrogate.as_str(), original);
            }
        }
        text
    }
}

/// `value`'s digits replaced, in place, by `digits` (its other characters kept).
fn reshape(value: &str, digits: &[u32]) -> String {
    let mut it = digits.iter();
    value
        .chars()
        .map(|c| {
            if c.is_ascii_digit() {
                it.next().and_then(|d| char::from_digit(*d, 10)).unwrap_or('0')
            } else {
                c
            }
        })
        .collect()
}

fn numbered(len: usize, lead: &[u32], n: usize) -> Vec<u32> {
    let mut ds = lead.to_vec();
    let tail: Vec<u32> = format!("{n:0width$}", width = len.saturating_sub(lead.len()))
        .chars()
        .filter_map(|c| c.to_digit(10))
        .collect();
    ds.extend(tail.iter().rev().take(len.saturating_sub(lead.len())).rev());
    ds.truncate(len);
    while ds.len() < len {
        ds.push(0);
    }
    ds
}

fn surrogate(detector: &str, value: &str, n: usize) -> String {
    match detector {
        "card" => {
            let len = value.chars().filter(char::is_ascii_digit).count();
            let mut ds = numbered(len - 1, &[4, 0, 0, 0, 0, 0], n);
            ds.push(0);
            for check in 0..10 {
                ds[len - 1] = check;
                let text: String = ds.iter().filter_map(|d| char::from_digit(*d, 10)).collect();
                if card_ok(&text) {
                    break;
                }
            }
            reshape(value, &ds)
        }
        "iban" => {
            let compact: String = value.chars().filter(|c| *c != ' ').collect();
            let country = &compact[..2];
            let bban: String = format!("{n:0width$}", width = compact.len() - 4);
            let mut check = 0;
            for c in 2..=98u32 {
                if iban_ok(&format!("{country}{c:02}{bban}")) {
                    check = c;
                    break;
                }
            }
            let made = format!("{country}{check:02}{bban}");
            if value.contains(' ') {
                made.as_bytes()
                    .chunks(4)
                    .map(|c| String::from_utf8_lossy(c).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                made
            }
        }
        "email" => format!("person{n}@example.invalid"),
        "phone" => {
            let len = value.chars().filter(char::is_ascii_digit).count();
            reshape(value, &numbered(len, &[5, 5, 5, 0, 1], n))
        }
        "ssn" => reshape(value, &numbered(9, &[9, 0, 0], n)),
        "ip" if value.contains(':') => format!("2001:db8::{n:x}"),
        // NOTE: three-digit octets, so no surrogate is the start of another (192.0.2.1 would
        // begin 192.0.2.10).
        "ip" => format!("192.0.2.{}", 100 + (n - 1) % 155),
        other => format!("[{other}-{n}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scanner() -> Scanner {
        Scanner::new(&[("ticket".into(), r"\bTCK-\d{6}\b".into())]).unwrap()
    }

    fn names(text: &str) -> Vec<(String, String)> {
        let s = scanner();
        s.scan(text, |_| true)
            .iter()
            .map(|f| (s.name(f.detector).to_owned(), text[f.start..f.end].to_owned()))
            .collect()
    }

    #[test]
    fn valid_values_are_found_and_near_misses_pass() {
        for (text, detector) in [
            ("pay with 4111 1111 1111 1111 today", "card"),
            ("card 5500-0000-0000-0004", "card"),
            ("amex 378282246310005", "card"),
            ("iban DE89 3704 0044 0532 0130 00 please", "iban"),
            ("GB82WEST12345698765432", "iban"),
            ("write to ada.lovelace+news@example.co.uk", "email"),
            ("call +44 20 7946 0958", "phone"),
            ("call (415) 555-2671", "phone"),
            ("call 020 7946 0958", "phone"),
            ("ssn 123-45-6789", "ssn"),
            ("host 192.168.10.254", "ip"),
            ("v6 2001:db8::8a2e:370:7334", "ip"),
            ("key AKIAIOSFODNN7EXAMPLE", "secret"),
            ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "secret"),
            ("sk-proj-abc123defghijklmnopqrstu", "secret"),
            ("sk-ant-api03-abcdefghijklmnopqrstuv", "secret"),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----",
                "secret",
            ),
            ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abcdefghijklmnop", "secret"),
            ("ticket TCK-123456 is open", "ticket"),
        ] {
            let got = names(text);
            assert!(got.iter().any(|(n, _)| n == detector), "{text:?} -> {got:?}");
        }
        for near_miss in [
            "4111 1111 1111 1112",         // Luhn fails
            "1111 1111 1111 1117",         // no card starts with 1
            "DE89 3704 0044 0532 0130 01", // checksum fails
            "000-12-3456",                 // area 000
            "666-12-3456",
            "123-00-4567",
            "999.1.1.1",
            "version 1.2.3",
            "a:b:c",
            "not an email@",
            "TCK-12345",
        ] {
            let got = names(near_miss);
            assert!(
                got.iter().all(|(n, _)| !matches!(
                    n.as_str(),
                    "card" | "iban" | "ssn" | "ip" | "email" | "phone" | "ticket"
                )),
                "{near_miss:?} -> {got:?}"
            );
        }
    }

    #[test]
    fn the_bench_corpus_scans_the_same_windowed_and_whole() {
        let text = include_str!("../../bench/dlp-corpus.txt");
        let s = scanner();
        let windowed = s.scan(text, |_| true);
        assert!(windowed.len() > 50);
        assert_eq!(windowed, s.scan_whole(text, |_| true));
    }

    #[test]
    fn review_cases_are_caught_or_let_go() {
        let s = scanner();
        let kinds = |text: &str| -> Vec<String> { names(text).into_iter().map(|(n, _)| n).collect() };
        // Code is not an address; a real one still is.
        assert!(!kinds("std::vec::Vec::new() and a::b::c").contains(&"ip".to_owned()));
        assert!(kinds("at 2001:db8::8a2e:370:7334").contains(&"ip".to_owned()));
        // A card with its expiry, or after a year, is still a card.
        for text in [
            "4111 1111 1111 1111 12/25",
            "Invoice 2024 4111 1111 1111 1111",
            "4111 1111 1111 1111 123",
        ] {
            assert!(
                names(text)
                    .iter()
                    .any(|(n, v)| n == "card" && v == "4111 1111 1111 1111"),
                "{text}"
            );
        }
        assert!(!kinds("use sk-learn-compatible-preprocessing here").contains(&"secret".to_owned()));
        assert!(kinds("key sk_live_abcdefghijklmnop1234").contains(&"secret".to_owned()));
        assert!(kinds("ssn 123 45 6789").contains(&"ssn".to_owned()));
        assert!(pattern_problem(r"\bq?").is_some());
        assert!(pattern_problem(r"\bTCK-\d{6}\b").is_none());
        let _ = s;
    }

    #[test]
    fn a_blocking_value_is_not_hidden_by_a_longer_match_and_arguments_stay_json() {
        let d = Dlp::build(
            RawDlp {
                custom: vec![("order".into(), r"order [0-9 ]+".into())],
                policies: vec![policy("p", &[("card", "block"), ("order", "redact")])],
            },
            1,
            1,
            1,
        )
        .unwrap()
        .unwrap();
        let acts = d.actions_for(0, None, None, 0, 0, |_| false).unwrap();
        let mut out = Protected::default();
        let mut text = "order 4111 1111 1111 1111".to_owned();
        assert!(!d.protect(&mut text, &acts, &mut out, &mut Pseudonyms::default()));
        assert_eq!(out.blocked, vec!["card".to_owned()]);
        let d = dlp(vec![policy("p", &[("ticket", "redact")])]);
        let acts = d.actions_for(0, None, None, 0, 0, |_| false).unwrap();
        let mut args = r#"{"ref":"TCK-123456","n":4}"#.to_owned();
        d.protect_json_text(&mut args, &acts, &mut Protected::default(), &mut Pseudonyms::default());
        let value: serde_json::Value = serde_json::from_str(&args).unwrap();
        assert_eq!(value["ref"], "[REDACTED:ticket]");
    }

    #[test]
    fn overlaps_resolve_to_the_earliest_then_the_longest() {
        let s = scanner();
        let text = "mail ops@192.168.1.1.example.com";
        let found = s.scan(text, |_| true);
        for pair in found.windows(2) {
            assert!(pair[0].end <= pair[1].start);
        }
    }

    #[test]
    fn bad_custom_patterns_are_listed() {
        let err = Scanner::new(&[("a".into(), "(".into()), ("b".into(), ".*".into())]).unwrap_err();
        assert_eq!(err.len(), 2, "{err:?}");
        assert!(pattern_problem(&"a".repeat(MAX_PATTERN_BYTES + 1)).is_some());
    }

    #[test]
    fn rewrite_redacts_and_pseudonymizes() {
        let s = scanner();
        let text = "card 4111111111111111 and mail a@b.io";
        let found = s.scan(text, |_| true);
        let card = s.index("card").unwrap();
        let out = rewrite(
            text,
            &found,
            &s,
            |d| {
                if d == card {
                    Action::Redact
                } else {
                    Action::Pseudonymize
                }
            },
            |_, v| format!("<{}>", v.len()),
        );
        assert_eq!(out, "card [REDACTED:card] and mail <6>");
    }

    fn dlp(policies: Vec<RawPolicy>) -> Dlp {
        let raw = RawDlp {
            custom: vec![("ticket".into(), r"\bTCK-\d{6}\b".into())],
            policies,
        };
        Dlp::build(raw, 10, 3, 2).unwrap().unwrap()
    }

    fn policy(name: &str, actions: &[(&str, &str)]) -> RawPolicy {
        RawPolicy {
            name: name.into(),
            actions: actions.iter().map(|(d, a)| ((*d).into(), (*a).into())).collect(),
            ..RawPolicy::default()
        }
    }

    #[test]
    fn policies_merge_to_the_strongest_action_where_they_apply() {
        let mut only_model_1 = policy("narrow", &[("card", "block")]);
        only_model_1.models = vec![1];
        let d = dlp(vec![
            policy("wide", &[("card", "redact"), ("email", "pseudonymize")]),
            only_model_1,
        ]);
        let card = d.scanner.index("card").unwrap();
        let email = d.scanner.index("email").unwrap();
        let on_0 = d.actions_for(0, None, None, 0, 0, |_| false).unwrap();
        let on_1 = d.actions_for(0, None, None, 1, 0, |_| false).unwrap();
        assert_eq!((on_0[card], on_0[email]), (Action::Redact, Action::Pseudonymize));
        assert_eq!((on_1[card], on_1[email]), (Action::Block, Action::Pseudonymize));
        let mut for_unit = policy("unit", &[("ssn", "block")]);
        for_unit.business_units = vec!["risk".into()];
        let d = dlp(vec![for_unit]);
        assert!(d.actions_for(0, Some("ops"), None, 0, 0, |_| false).is_none());
        assert!(d.actions_for(0, Some("risk"), None, 0, 0, |_| false).is_some());
        assert!(Dlp::build(RawDlp::default(), 1, 1, 1).unwrap().is_none());
        let mut bad = policy("bad", &[("dna", "block")]);
        bad.models = vec![7];
        assert_eq!(
            Dlp::build(
                RawDlp {
                    custom: vec![],
                    policies: vec![bad]
                },
                1,
                1,
                1
            )
            .unwrap_err()
            .len(),
            2
        );
    }

    #[test]
    fn a_request_is_protected_in_every_text_it_carries() {
        use crate::translate::{Block, Message, Request, Role, ToolCall, ToolResult};
        let d = dlp(vec![policy(
            "p",
            &[("card", "redact"), ("email", "pseudonymize"), ("ticket", "redact")],
        )]);
        let acts = d.actions_for(0, None, None, 0, 0, |_| false).unwrap();
        let mut request = Request {
            system: vec!["mail ada@example.com".into()],
            messages: vec![
                Message {
                    role: Role::User,
                    content: vec![Block::Text("card 4111111111111111, TCK-123456".into())],
                },
                Message {
                    role: Role::Assistant,
                    content: vec![Block::ToolCall(ToolCall {
                        id: "1".into(),
                        name: "f".into(),
                        arguments: "{\"to\":\"ada@example.com\"}".into(),
                        signature: None,
                    })],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult(ToolResult {
                        id: "1".into(),
                        name: "f".into(),
                        content: "sent to bob@example.org".into(),
                        is_error: false,
                    })],
                },
            ],
            ..Request::default()
        };
        let found = d.protect_request(&mut request, &acts, &[]);
        assert_eq!(found.action, Some(Action::Pseudonymize));
        assert!(found.blocked.is_empty());
        let text = format!("{request:?}");
        assert!(!text.contains("4111111111111111") && !text.contains("ada@example.com") && !text.contains("bob@"));
        assert!(text.contains("[REDACTED:card]") && text.contains("[REDACTED:ticket]"));
        // The same value, the same surrogate within the call.
        assert_eq!(text.matches("person1@example.invalid").count(), 2, "{text}");
        assert!(text.contains("person2@example.invalid"));
        assert_eq!(
            found.counts,
            vec![("card".into(), 1), ("email".into(), 3), ("ticket".into(), 1)]
        );
    }

    #[test]
    fn blocking_names_every_detector_and_rewrites_nothing_in_a_proxy_body() {
        let d = dlp(vec![policy(
            "p",
            &[("card", "block"), ("ssn", "block"), ("iban", "redact")],
        )]);
        let acts = d.actions_for(0, None, None, 0, 0, |_| false).unwrap();
        let body = br#"{"query":"4111 1111 1111 1111","content":[{"type":"text","text":"ssn 123-45-6789"}]}"#;
        let (found, rewritten) = d.protect_proxy(body, &acts).unwrap();
        assert_eq!(found.blocked, vec!["card".to_owned(), "ssn".to_owned()]);
        assert!(rewritten.is_none());
        let (found, rewritten) = d
            .protect_proxy(br#"{"query":"iban GB82WEST12345698765432"}"#, &acts)
            .unwrap();
        assert_eq!(found.action, Some(Action::Redact));
        assert_eq!(rewritten.unwrap(), br#"{"query":"iban [REDACTED:iban]"}"#.to_vec());
        assert!(d.protect_proxy(b"not json", &acts).is_none());
    }

    #[test]
    fn the_models_values_are_matches_of_their_detector_in_every_text() {
        let d = dlp(vec![policy(
            "p",
            &[("person", "pseudonymize"), ("address", "block"), ("card", "redact")],
        )]);
        assert!(d.wants_model());
        assert!(!dlp(vec![policy("q", &[("card", "block"), ("person", "off")])]).wants_model());
        let acts = d.actions_for(0, None, None, 0, 0, |_| false).unwrap();
        assert_eq!(
            d.model_detectors(&acts),
            vec!["person".to_owned(), "address".to_owned()]
        );
        let found = vec![
            ("person".to_owned(), "Ada Lovelace".to_owned()),
            ("person".to_owned(), "Ada Lovelace".to_owned()),
            ("organisation".to_owned(), "Analytical Engines".to_owned()),
            ("person".to_owned(), " ".to_owned()),
        ];
        let values = d.model_values(&found);
        assert_eq!(values.len(), 1);
        let body = br#"{"query":"Ada Lovelace pays 4111 1111 1111 1111","content":[{"type":"text","text":"ask Ada Lovelace"}]}"#;
        let (out, rewritten) = d.protect_body(body, &acts, &["query"], true, &values).unwrap();
        let sent = String::from_utf8(rewritten.unwrap()).unwrap();
        assert!(
            !sent.contains("Ada Lovelace") && sent.matches("[person-1]").count() == 2,
            "{sent}"
        );
        assert!(sent.contains("[REDACTED:card]"), "{sent}");
        assert_eq!(out.restore, vec![("[person-1]".to_owned(), "Ada Lovelace".to_owned())]);
        assert_eq!(out.counts, vec![("card".to_owned(), 1), ("person".to_owned(), 2)]);
        let address = d.model_values(&[("address".to_owned(), "221B Baker Street".to_owned())]);
        let (out, _) = d
            .protect_body(
                br#"{"query":"meet at 221B Baker Street"}"#,
                &acts,
                &["query"],
                true,
                &address,
            )
            .unwrap();
        assert_eq!(out.blocked, vec!["address".to_owned()]);
        // Without values the model's detectors find nothing: the pattern rules alone.
        let (out, _) = d
            .protect_body(br#"{"query":"Ada Lovelace"}"#, &acts, &["query"], true, &[])
            .unwrap();
        assert!(out.counts.is_empty());
    }

    #[test]
    fn the_mesh_route_is_protected_in_place_as_its_body_would_be() {
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::STANDARD;
        let d = dlp(vec![policy(
            "p",
            &[("card", "pseudonymize"), ("iban", "redact"), ("ssn", "block")],
        )]);
        let acts = d.actions_for(0, None, None, 0, 0, |_| false).unwrap();
        let doc = engine.encode("iban GB82WEST12345698765432, card 4111 1111 1111 1111");
        let body = format!(
            r#"{{"query":"card 4111 1111 1111 1111","content":[{{"type":"text","text":"GB82WEST12345698765432"}},{{"type":"document","media_type":"text/plain","data":"{doc}"}}]}}"#
        );
        #[derive(serde::Deserialize)]
        struct Body<'a> {
            #[serde(borrow)]
            query: Option<std::borrow::Cow<'a, str>>,
            #[serde(borrow)]
            content: Option<Vec<crate::content::RawBlock<'a>>>,
        }
        let mut parsed: Body<'_> = serde_json::from_str(&body).unwrap();
        let blocks = parsed.content.as_deref_mut().unwrap_or_default();
        let found = d.protect_mesh(parsed.query.as_mut(), blocks, &acts, &[]).unwrap();
        let (reference, rewritten) = d.protect_proxy(body.as_bytes(), &acts).unwrap();
        assert_eq!(found, reference);
        let sent: serde_json::Value = serde_json::from_slice(&rewritten.unwrap()).unwrap();
        assert_eq!(parsed.query.as_deref(), sent["query"].as_str());
        let content = parsed.content.unwrap();
        assert_eq!(content[0].text.as_deref(), Some("[REDACTED:iban]"));
        assert_eq!(content[1].data.as_deref(), sent["content"][1]["data"].as_str());
        let decoded = String::from_utf8(engine.decode(content[1].data.as_deref().unwrap()).unwrap()).unwrap();
        assert!(decoded.starts_with("iban [REDACTED:iban], card ") && !decoded.contains("4111 1111 1111 1111"));
        // Nothing to rewrite: the text stays as it came.
        let mut quiet: Body<'_> = serde_json::from_str(r#"{"query":"nothing here"}"#).unwrap();
        let found = d.protect_mesh(quiet.query.as_mut(), &mut [], &acts, &[]).unwrap();
        assert!(found.counts.is_empty() && quiet.query.as_deref() == Some("nothing here"));
    }

    #[test]
    fn review_findings_keys_unicode_digits_inline_documents_and_many_values() {
        use base64::Engine as _;
        let s = scanner();
        // A digit outside ASCII among a card's or a phone's digits does not hide them.
        for text in [
            "4111\u{661}111111111111",
            "+1415\u{661}5552671",
            "pay 4111 1111 1111 1111 ١",
        ] {
            let found = s.scan(text, |_| true);
            assert!(!found.is_empty(), "{text:?}");
            assert_eq!(found, s.scan_whole(text, |_| true));
        }
        let d = dlp(vec![policy("p", &[("card", "block"), ("person", "redact")])]);
        let acts = d.actions_for(0, None, None, 0, 0, |_| false).unwrap();
        // A card as a key of tool call arguments.
        let mut value = serde_json::json!({"4111 1111 1111 1111": "visa", "ok": 1});
        let mut out = Protected::default();
        d.protect_json(&mut value, &acts, &mut out, &mut Pseudonyms::default());
        assert_eq!(out.blocked, vec!["card".to_owned()]);
        // A Gemini inline text document and a data: URL of text are read; a binary one passes.
        let engine = base64::engine::general_purpose::STANDARD;
        let card = engine.encode("paid with 4111 1111 1111 1111");
        for image in [
            crate::translate::Image::Base64 {
                media_type: "text/plain".into(),
                data: card.clone(),
            },
            crate::translate::Image::Url(format!("data:text/markdown;base64,{card}")),
        ] {
            let mut out = Protected::default();
            let mut image = image;
            d.protect_inline(&mut image, &acts, &mut out, &mut Pseudonyms::default());
            assert_eq!(out.blocked, vec!["card".to_owned()], "{image:?}");
        }
        let mut png = crate::translate::Image::Base64 {
            media_type: "image/png".into(),
            data: card.clone(),
        };
        let mut out = Protected::default();
        d.protect_inline(&mut png, &acts, &mut out, &mut Pseudonyms::default());
        assert!(out.blocked.is_empty() && out.counts.is_empty());
        // The model's values: whole words only, and many of them in one pass.
        let values = ModelValues::new(&[(7, "Al".to_owned())]);
        let mut found = Vec::new();
        values.find("Also Al, and Alan", |_| true, &mut found);
        assert_eq!(found.iter().map(|f| (f.start, f.end)).collect::<Vec<_>>(), vec![(5, 7)]);
        let many: Vec<(usize, String)> = (0..20_000).map(|i| (7, format!("Person{i:06} Surname"))).collect();
        let text = many.iter().map(|(_, v)| v.as_str()).collect::<Vec<_>>().join(", ");
        let started = std::time::Instant::now();
        let values = ModelValues::new(&many);
        let mut found = Vec::new();
        values.find(&text, |_| true, &mut found);
        assert_eq!(found.len(), MAX_MODEL_VALUES);
        assert!(started.elapsed().as_secs_f64() < 2.0, "{:?}", started.elapsed());
    }

    #[test]
    fn a_text_documents_content_is_read_and_rewritten_in_its_base64() {
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::STANDARD;
        let d = dlp(vec![policy("p", &[("card", "block"), ("iban", "redact")])]);
        let acts = d.actions_for(0, None, None, 0, 0, |_| false).unwrap();
        let doc = |media_type: &str, text: &str| {
            format!(
                r#"{{"content":[{{"type":"text","text":"see"}},{{"type":"document","media_type":"{media_type}","data":"{}"}}]}}"#,
                engine.encode(text)
            )
        };
        let (found, _) = d
            .protect_proxy(doc("text/plain", "card 4111 1111 1111 1111").as_bytes(), &acts)
            .unwrap();
        assert_eq!(found.blocked, vec!["card".to_owned()]);
        let (found, rewritten) = d
            .protect_proxy(
                doc("text/csv; charset=utf-8", "iban,GB82WEST12345698765432\n").as_bytes(),
                &acts,
            )
            .unwrap();
        assert_eq!(found.counts, vec![("iban".to_owned(), 1)]);
        let sent: serde_json::Value = serde_json::from_slice(&rewritten.unwrap()).unwrap();
        let data = engine.decode(sent["content"][1]["data"].as_str().unwrap()).unwrap();
        assert_eq!(String::from_utf8(data).unwrap(), "iban,[REDACTED:iban]\n");
        // Not text (left as it is), and text that is not base64 or not UTF-8 (not readable).
        let (found, rewritten) = d
            .protect_proxy(doc("application/pdf", "card 4111 1111 1111 1111").as_bytes(), &acts)
            .unwrap();
        assert!(found.blocked.is_empty() && rewritten.is_none());
        let bad = r#"{"content":[{"type":"document","media_type":"text/plain","data":"%%%"}]}"#;
        assert!(d.protect_proxy(bad.as_bytes(), &acts).is_none());
        let latin1 = format!(
            r#"{{"content":[{{"type":"document","media_type":"text/plain","data":"{}"}}]}}"#,
            engine.encode([0xe9u8, 0x41])
        );
        assert!(d.protect_proxy(latin1.as_bytes(), &acts).is_none());
    }

    #[test]
    fn surrogates_keep_the_shape_and_are_never_real() {
        let mut names = Pseudonyms::default();
        let card = names.get("card", "4111 1111 1111 1111");
        assert_eq!(card.len(), 19);
        assert!(card_ok(&card) && card != "4111 1111 1111 1111", "{card}");
        let iban = names.get("iban", "DE89 3704 0044 0532 0130 00");
        assert!(iban.starts_with("DE") && iban_ok(&iban), "{iban}");
        let ssn = names.get("ssn", "123-45-6789");
        assert!(ssn.starts_with('9') && !ssn_ok(&ssn), "{ssn}");
        assert_eq!(names.get("card", "4111 1111 1111 1111"), card);
        assert_eq!(names.originals().len(), 3);
    }

    proptest! {
        /// Restored answers equal what the caller would have seen without pseudonymization,
        /// under any chunking of the stream.
        #[test]
        fn prop_restore_is_the_same_under_any_chunking(
            words in proptest::collection::vec(prop::sample::select(vec![
                "the", "card", "4111 1111 1111 1111", "ada@example.com", "4", "person", "@", " ", "person1@exam",
            ]), 0..30),
            cuts in proptest::collection::vec(0usize..400, 0..12),
        ) {
            let original = words.concat();
            let mut names = Pseudonyms::default();
            let mut answer = original.replace("4111 1111 1111 1111", &names.get("card", "4111 1111 1111 1111"));
            answer = answer.replace("ada@example.com", &names.get("email", "ada@example.com"));
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c < answer.len() && answer.is_char_boundary(*c)).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut restorer = Restorer::new(names.originals());
            let mut out = String::new();
            let mut at = 0;
            for cut in cuts.into_iter().chain([answer.len()]) {
                out.push_str(&restorer.push(&answer[at..cut]));
                at = cut;
            }
            out.push_str(&restorer.flush());
            prop_assert_eq!(out, original);
        }
    }

    fn luhn_number(prefix: u32, body: &[u32]) -> String {
        let mut ds: Vec<u32> = vec![prefix];
        ds.extend_from_slice(body);
        for check in 0..10 {
            let mut all = ds.clone();
            all.push(check);
            let s: String = all.iter().map(|d| char::from_digit(*d, 10).unwrap()).collect();
            if card_ok(&s) {
                return s;
            }
        }
        unreachable!()
    }

    proptest! {
        /// Every Luhn-valid number of a card's length and leading digit is found, with or without
        /// separators, and changing one digit of it is never a card.
        #[test]
        fn prop_cards_are_found_by_their_checksum(prefix in 2u32..=6, body in proptest::collection::vec(0u32..10, 14),
                                                 sep in prop::sample::select(vec!["", " ", "-"]), flip in 1usize..15) {
            let number = luhn_number(prefix, &body);
            let shown: String = number.chars().collect::<Vec<_>>().chunks(4)
                .map(|c| c.iter().collect::<String>()).collect::<Vec<_>>().join(sep);
            let text = format!("x {shown} y");
            let s = scanner();
            let card = s.index("card").unwrap();
            prop_assert!(s.scan(&text, |d| d == card).len() == 1, "{}", text);
            let mut changed: Vec<char> = number.chars().collect();
            let d = changed[flip].to_digit(10).unwrap();
            changed[flip] = char::from_digit((d + 1) % 10, 10).unwrap();
            let changed: String = changed.into_iter().collect();
            prop_assert!(!card_ok(&changed));
        }

        /// The scanner never panics and its matches are in order, inside the text, on char
        /// boundaries, without overlaps.
        #[test]
        fn prop_windows_find_what_the_whole_text_search_finds(
            pieces in proptest::collection::vec(prop_oneof![
                "[0-9]{1,5}", "[ .()+:_-]", "[A-Z]{1,4}", "[a-z]{1,6}", " ", "é", "\\PC",
                "[2-6][0-9]{3}([ -]?[0-9]{4}){3}", "[A-Z]{2}[0-9]{2}( ?[0-9A-Z]{4}){3,5}",
                "\\+?[0-9]{1,3}[ .-]?\\(?[0-9]{3}\\)?[ .-]?[0-9]{3}[ .-][0-9]{4}",
                "[0-9]{3}[- ][0-9]{2}[- ][0-9]{4}", "[0-9]{1,3}(\\.[0-9]{1,3}){3}",
                "[0-9a-f]{0,4}(:[0-9a-f]{0,4}){2,7}",
            ], 0..80),
        ) {
            let text: String = pieces.concat();
            let s = scanner();
            prop_assert_eq!(s.scan(&text, |_| true), s.scan_whole(&text, |_| true));
            for one in 0..s.len() {
                prop_assert_eq!(s.scan(&text, |i| i == one), s.scan_whole(&text, |i| i == one));
            }
        }

        #[test]
        fn prop_scan_is_well_formed(text in "\\PC{0,200}") {
            let s = scanner();
            let found = s.scan(&text, |_| true);
            let mut at = 0;
            for f in &found {
                prop_assert!(f.start >= at && f.start < f.end && f.end <= text.len());
                prop_assert!(text.is_char_boundary(f.start) && text.is_char_boundary(f.end));
                at = f.end;
            }
        }
    }
}
