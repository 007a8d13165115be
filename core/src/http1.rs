//! The upstream HTTP/1.1 wire: request encoding and an incremental response parser.
//!
//! meshfast's upstream client is an asyncio protocol whose `data_received` hands every chunk
//! straight to [`ResponseParser::feed`], which returns the decoded body bytes: the head is
//! parsed with `httparse`, chunked transfer coding is undone by a byte-level state machine,
//! and gzip/deflate content coding (only if a server sends it unasked) is inflated. Python
//! never sees framing, so a streamed answer costs one call per socket read.

use std::io::Write;

use flate2::write::{GzDecoder, ZlibDecoder};

/// The largest response head accepted (status line and headers).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
/// Chunk-size lines and trailer lines longer than this are refused.
const MAX_LINE_BYTES: usize = 8 * 1024;

/// A response that does not follow HTTP/1.1; the connection is unusable afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed upstream response: {}", self.0)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(msg.into()))
}

/// Encodes one request. Header names and values with CR, LF or NUL are refused: a rendered
/// template must never be able to split a request.
pub fn encode_request(
    method: &str,
    target: &str,
    host: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<Vec<u8>, String> {
    fn clean(field: &str, what: &str) -> Result<(), String> {
        if field.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(format!("{what} contains a control character"));
        }
        Ok(())
    }
    clean(method, "method")?;
    clean(target, "request target")?;
    clean(host, "host")?;
    if method.is_empty() || method.contains(' ') || target.contains(' ') {
        return Err("method and request target may not contain spaces".into());
    }
    let mut out = Vec::with_capacity(128 + headers.len() * 48 + body.len());
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(if target.is_empty() { b"/" } else { target.as_bytes() });
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    let (mut has_accept, mut has_encoding) = (false, false);
    for (name, value) in headers {
        if name.is_empty() || name.bytes().any(|b| !b.is_ascii_graphic() || b == b':') {
            return Err(format!("invalid header name {name:?}"));
        }
        clean(value, "header value")?;
        // NOTE: framing and the connection are this client's business, not a template's.
        if ["host", "content-length", "transfer-encoding", "connection"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n))
        {
            continue;
        }
        has_accept |= name.eq_ignore_ascii_case("accept");
        has_encoding |= name.eq_ignore_ascii_case("accept-encoding");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !has_accept {
        out.extend_from_slice(b"accept: */*\r\n");
    }
    if !has_encoding {
        // NOTE: compression costs CPU on both ends of a fast link and delays stream deltas.
        out.extend_from_slice(b"accept-encoding: identity\r\n");
    }
    if !body.is_empty() || !(method.eq_ignore_ascii_case("GET") || method.eq_ignore_ascii_case("HEAD")) {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunked {
    /// Reading hex digits of a chunk size.
    Size {
        size: u64,
        digits: u8,
    },
    /// After the digits: extensions up to the line end.
    Extension {
        size: u64,
        len: usize,
    },
    Data {
        left: u64,
    },
    /// The CRLF after a chunk's data; `cr` once the CR was seen.
    DataEnd {
        cr: bool,
    },
    /// Trailer lines after the last chunk; `len` of the current line.
    Trailer {
        len: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Length { left: u64 },
    Chunked(Chunked),
    UntilClose,
    Done,
}

/// HTTP's `deflate` is the zlib format (RFC 9110 §8.4.1.2).
enum Inflate {
    Gzip(GzDecoder<Vec<u8>>),
    Zlib(ZlibDecoder<Vec<u8>>),
}

/// An incremental HTTP/1.1 response parser for one exchange.
pub struct ResponseParser {
    state: State,
    head: Vec<u8>,
    no_body: bool,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Whether the connection may carry another exchange once this one is complete.
    pub keep_alive: bool,
    inflate: Option<Inflate>,
    /// Bytes received after the end of the response (a server bug); the connection is dropped.
    pub trailing_garbage: bool,
}

impl ResponseParser {
    /// `no_body` for answers to HEAD, which have a head only.
    pub fn new(no_body: bool) -> Self {
        Self {
            state: State::Head,
            head: Vec::new(),
            no_body,
            status: 0,
            headers: Vec::new(),
            keep_alive: false,
            inflate: None,
            trailing_garbage: false,
        }
    }

    pub fn head_done(&self) -> bool {
        self.state != State::Head
    }

    pub fn complete(&self) -> bool {
        self.state == State::Done
    }

    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Consumes `data`, appending decoded body bytes to `out`.
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        if self.state == State::Head {
            let start = self.head.len();
            self.head.extend_from_slice(data);
            match self.parse_head()? {
                None => {
                    if self.head.len() > MAX_HEAD_BYTES {
                        return err("response head too large");
                    }
                    return Ok(());
                }
                Some(head_len) => {
                    // The rest of this read is body; the head buffer is no longer needed.
                    let used = head_len - start;
                    data = &data[used..];
                    self.head = Vec::new();
                }
            }
        }
        if self.inflate.is_some() {
            let mut compressed = Vec::new();
            let result = self.body(data, &mut compressed);
            self.inflate_into(&compressed, out)?;
            result
        } else {
            self.body(data, out)
        }
    }

    /// The connection closed. Ends a body delimited by the close; anything else cut short is
    /// an error.
    pub fn eof(&mut self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        match self.state {
            State::Done => Ok(()),
            State::UntilClose => {
                self.state = State::Done;
                self.finish_inflate(out)
            }
            State::Head => err("connection closed before the response head"),
            _ => err("connection closed mid-body"),
        }
    }

    /// Parses the head once it is complete; returns the head bytes used, interim (1xx) responses
    /// included, which are skipped.
    fn parse_head(&mut self) -> Result<Option<usize>, ProtocolError> {
        let mut skipped = 0;
        loop {
            let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut slots);
            let len = match response.parse(&self.head) {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(e) => return err(e.to_string()),
            };
            let status = response.code.unwrap_or(0);
            if (100..200).contains(&status) && status != 101 {
                self.head.drain(..len);
                skipped += len;
                continue;
            }
            let version = response.version.unwrap_or(1);
            self.status = status;
            self.headers = response
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).trim().to_owned(),
                    )
                })
                .collect();
            self.start_body(version)?;
            return Ok(Some(skipped + len));
        }
    }

    fn start_body(&mut self, version: u8) -> Result<(), ProtocolError> {
        let connection = self.header("connection").map(str::to_ascii_lowercase);
        self.keep_alive = match &connection {
            Some(c) if c.split(',').any(|t| t.trim() == "close") => false,
            Some(c) if c.split(',').any(|t| t.trim() == "keep-alive") => true,
            _ => version == 1,
        };
        let chunked = self.header("transfer-encoding").map(|te| {
            te.rsplit(',')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("chunked")
        });
        let length = self.header("content-length");
        self.state = if self.status == 101 {
            // NOTE: never asked for (no request carries Upgrade): whatever follows is another
            // protocol, so the exchange ends here and the connection is not reused.
            self.keep_alive = false;
            State::Done
        } else if self.no_body || self.status == 204 || self.status == 304 {
            State::Done
        } else if let Some(is_chunked) = chunked {
            if !is_chunked {
                // A transfer coding other than chunked last: the body runs to the close.
                self.keep_alive = false;
                State::UntilClose
            } else {
                State::Chunked(Chunked::Size { size: 0, digits: 0 })
            }
        } else if let Some(length) = length {
            // NOTE: duplicate Content-Length values that differ are a smuggling signal.
            let mut parsed: Option<u64> = None;
            for part in length.split(',') {
                let n: u64 = match part.trim().parse() {
                    Ok(n) => n,
                    Err(_) => return err(format!("invalid content-length {length:?}")),
                };
                if parsed.is_some_and(|p| p != n) {
                    return err("conflicting content-length values");
                }
                parsed = Some(n);
            }
            let values = self
                .headers
                .iter()
                .filter(|(n, _)| n == "content-length")
                .map(|(_, v)| v.trim())
                .collect::<Vec<_>>();
            if values.windows(2).any(|w| w[0] != w[1]) {
                return err("conflicting content-length headers");
            }
            match parsed {
                Some(0) => State::Done,
                Some(n) => State::Length { left: n },
                None => return err("empty content-length"),
            }
        } else {
            self.keep_alive = false;
            State::UntilClose
        };
        self.inflate = match self
            .header("content-encoding")
            .map(|e| e.trim().to_ascii_lowercase())
            .as_deref()
        {
            None | Some("") | Some("identity") => None,
            Some("gzip") | Some("x-gzip") => Some(Inflate::Gzip(GzDecoder::new(Vec::new()))),
            Some("deflate") => Some(Inflate::Zlib(ZlibDecoder::new(Vec::new()))),
            Some(other) => return err(format!("unsupported content-encoding {other:?}")),
        };
        if self.state == State::Done {
            // No body: nothing to inflate.
            self.inflate = None;
        }
        Ok(())
    }

    fn body(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        while !data.is_empty() {
            match self.state {
                State::Head => unreachable!("body() runs after the head"),
                State::Done => {
                    self.trailing_garbage = true;
                    self.keep_alive = false;
                    return Ok(());
                }
                State::UntilClose => {
                    out.extend_from_slice(data);
                    return Ok(());
                }
                State::Length { left } => {
                    let take = (left.min(data.len() as u64)) as usize;
                    out.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    let left = left - take as u64;
                    self.state = if left == 0 { State::Done } else { State::Length { left } };
                }
                State::Chunked(c) => {
                    let (next, used) = chunk_step(c, data, out)?;
                    data = &data[used..];
                    self.state = next;
                }
            }
        }
        Ok(())
    }

    fn inflate_into(&mut self, compressed: &[u8], out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        let Some(inflate) = self.inflate.as_mut() else {
            return Ok(());
        };
        let result = match inflate {
            Inflate::Gzip(d) => d
                .write_all(compressed)
                .and_then(|_| d.flush())
                .map(|_| std::mem::take(d.get_mut())),
            Inflate::Zlib(d) => d
                .write_all(compressed)
                .and_then(|_| d.flush())
                .map(|_| std::mem::take(d.get_mut())),
        };
        match result {
            Ok(decoded) => out.extend_from_slice(&decoded),
            Err(e) => return err(format!("content decoding failed: {e}")),
        }
        if self.state == State::Done {
            self.finish_inflate(out)?;
        }
        Ok(())
    }

    fn finish_inflate(&mut self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        let done = match self.inflate.take() {
            None => return Ok(()),
            Some(Inflate::Gzip(d)) => d.finish(),
            Some(Inflate::Zlib(d)) => d.finish(),
        };
        match done {
            Ok(rest) => {
                out.extend_from_slice(&rest);
                Ok(())
            }
            Err(e) => err(format!("content decoding failed: {e}")),
        }
    }
}

/// One step of the chunked decoder; returns the next state and the bytes used.
fn chunk_step(state: Chunked, data: &[u8], out: &mut Vec<u8>) -> Result<(State, usize), ProtocolError> {
    let b = data[0];
    let next = match state {
        Chunked::Size { size, digits } => match b {
            b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                if digits >= 15 {
                    return err("chunk size too large");
                }
                let v = (b as char).to_digit(16).unwrap_or(0) as u64;
                Chunked::Size {
                    size: size * 16 + v,
                    digits: digits + 1,
                }
            }
            _ if digits == 0 => return err("missing chunk size"),
            b'\n' => return Ok((after_size(size), 1)),
            b';' | b' ' | b'\t' | b'\r' => Chunked::Extension { size, len: 1 },
            _ => return err("invalid chunk size"),
        },
        Chunked::Extension { size, len } => {
            // Skip the extensions (and the CR) in one go, up to the line feed.
            return match memchr::memchr(b'\n', data) {
                Some(i) if len + i <= MAX_LINE_BYTES => Ok((after_size(size), i + 1)),
                None if len + data.len() <= MAX_LINE_BYTES => Ok((
                    State::Chunked(Chunked::Extension {
                        size,
                        len: len + data.len(),
                    }),
                    data.len(),
                )),
                _ => err("chunk extension too long"),
            };
        }
        Chunked::Data { left } => {
            let take = (left.min(data.len() as u64)) as usize;
            out.extend_from_slice(&data[..take]);
            let left = left - take as u64;
            let next = if left == 0 {
                Chunked::DataEnd { cr: false }
            } else {
                Chunked::Data { left }
            };
            return Ok((State::Chunked(next), take));
        }
        Chunked::DataEnd { cr } => match b {
            b'\r' if !cr => Chunked::DataEnd { cr: true },
            b'\n' => Chunked::Size { size: 0, digits: 0 },
            _ => return err("chunk data not followed by CRLF"),
        },
        Chunked::Trailer { len } => match b {
            b'\n' if len == 0 => return Ok((State::Done, 1)),
            b'\n' => Chunked::Trailer { len: 0 },
            // A CR on an otherwise empty line does not start a trailer field.
            b'\r' if len == 0 => Chunked::Trailer { len: 0 },
            _ if len >= MAX_LINE_BYTES => return err("trailer line too long"),
            _ => Chunked::Trailer { len: len + 1 },
        },
    };
    Ok((State::Chunked(next), 1))
}

fn after_size(size: u64) -> State {
    if size == 0 {
        State::Chunked(Chunked::Trailer { len: 0 })
    } else {
        State::Chunked(Chunked::Data { left: size })
    }
}

/// SSRF guard: whether a provider not marked `local` may not connect to `ip`.
///
/// Everything in the IANA IPv4 and IPv6 special-purpose registries that is not globally
/// reachable is refused: "this network", private, shared (CGN, where some clouds keep their
/// metadata service), loopback, link-local, the documentation and benchmarking ranges,
/// multicast, reserved and broadcast; for IPv6 also unique-local, site-local, discard-only,
/// Teredo and ORCHID. IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64 and 6to4)
/// are judged by the address they embed.
#[must_use]
pub fn forbidden_address(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => forbidden_v4(v4),
        std::net::IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: std::net::Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    matches!(
        (a, b, c),
        (0 | 10 | 127, _, _)                  // this network, private, loopback
            | (100, 64..=127, _)              // shared address space (RFC 6598)
            | (169, 254, _)                   // link-local (cloud metadata)
            | (172, 16..=31, _)               // private
            | (192, 0, 0 | 2)                 // IETF protocol assignments; TEST-NET-1
            | (192, 88, 99)                   // 6to4 relay anycast (deprecated)
            | (192, 168, _)                   // private
            | (198, 18..=19, _)               // benchmarking
            | (198, 51, 100)                  // TEST-NET-2
            | (203, 0, 113)                   // TEST-NET-3
            | (224..=255, _, _) // multicast, reserved, broadcast
    )
}

fn forbidden_v6(ip: std::net::Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded = || std::net::Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // ::/96: unspecified, loopback and the deprecated IPv4-compatible form.
        [0, 0, 0, 0, 0, 0, _, _] => true,
        // ::ffff:0:0/96, IPv4-mapped.
        [0, 0, 0, 0, 0, 0xffff, _, _] => forbidden_v4(embedded()),
        // 64:ff9b::/96, NAT64 well-known prefix: the IPv4 address it reaches.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => forbidden_v4(embedded()),
        // 64:ff9b:1::/48, local-use NAT64.
        [0x64, 0xff9b, 1, ..] => true,
        // 100::/64, discard-only.
        [0x100, 0, 0, 0, ..] => true,
        // 2001::/32 Teredo, 2001:2::/48 benchmarking, 2001:10::/28 and 2001:20::/28 ORCHID,
        // 2001:db8::/32 documentation.
        [0x2001, 0 | 0xdb8, ..] | [0x2001, 2, 0, ..] | [0x2001, 0x10..=0x2f, ..] => true,
        // 2002::/16, 6to4: the IPv4 address in bits 16..48.
        [0x2002, hi, lo, ..] => forbidden_v4(std::net::Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        // 3fff::/20 documentation, 5f00::/16 SRv6 SIDs.
        [0x3fff, 0..=0x0fff, ..] | [0x5f00, ..] => true,
        // fc00::/7 unique-local, fe80::/10 link-local, fec0::/10 site-local, ff00::/8 multicast.
        [first, ..] => {
            (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                || (first & 0xff00) == 0xff00
        }
    }
}

/// [`forbidden_address`] for an address in text (an IPv6 zone, `%eth0`, is ignored); `None`
/// when `address` is not an IP address (a name, to be resolved and then checked).
#[must_use]
pub fn forbidden_address_str(address: &str) -> Option<bool> {
    let bare = address.split('%').next().unwrap_or(address);
    let bare = bare.strip_prefix('[').and_then(|b| b.strip_suffix(']')).unwrap_or(bare);
    bare.parse::<std::net::IpAddr>().ok().map(forbidden_address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_all(pieces: &[&[u8]]) -> (ResponseParser, Vec<u8>) {
        let mut p = ResponseParser::new(false);
        let mut out = Vec::new();
        for piece in pieces {
            p.feed(piece, &mut out).unwrap();
        }
        (p, out)
    }

    /// The obvious reference: chunked-encode `parts` in one buffer.
    fn chunked(parts: &[Vec<u8>], extension: bool, trailer: bool) -> Vec<u8> {
        let mut wire =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for part in parts.iter().filter(|p| !p.is_empty()) {
            wire.extend_from_slice(format!("{:X}", part.len()).as_bytes());
            if extension {
                wire.extend_from_slice(b";name=value");
            }
            wire.extend_from_slice(b"\r\n");
            wire.extend_from_slice(part);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n");
        if trailer {
            wire.extend_from_slice(b"x-trailer: 1\r\n");
        }
        wire.extend_from_slice(b"\r\n");
        wire
    }

    fn blocked(address: &str) -> bool {
        forbidden_address_str(address).unwrap_or_else(|| panic!("{address} is not an address"))
    }

    #[test]
    fn special_purpose_ipv4_ranges_are_refused() {
        for address in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.100.100.200",
            "100.127.255.255",
            "127.0.0.1",
            "127.1.2.3",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.1",
            "192.0.0.170",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(blocked(address), "{address} must be refused");
        }
    }

    #[test]
    fn public_ipv4_addresses_pass() {
        for address in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.1",
            "104.18.6.192",
            "172.15.255.255",
            "172.32.0.1",
            "192.0.1.1",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.1",
            "223.255.255.255",
        ] {
            assert!(!blocked(address), "{address} is public");
        }
    }

    #[test]
    fn special_purpose_ipv6_ranges_are_refused() {
        for address in [
            "::",
            "::1",
            "::127.0.0.1",
            "::ffff:127.0.0.1",
            "::ffff:100.64.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:2::1",
            "2001:10::1",
            "2001:20::1",
            "2001:db8::1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "2002:6440:1::1",
            "3fff::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fe80::1%eth0",
            "[fe80::1]",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "ff05::2",
        ] {
            assert!(blocked(address), "{address} must be refused");
        }
    }

    #[test]
    fn public_ipv6_addresses_pass() {
        for address in [
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2a00:1450:4001::200e",
        ] {
            assert!(!blocked(address), "{address} is public");
        }
    }

    #[test]
    fn names_are_not_addresses() {
        for name in [
            "localhost",
            "api.openai.com",
            "127.1",
            "0x7f000001",
            "2130706433",
            "0177.0.0.1",
            "",
        ] {
            assert_eq!(forbidden_address_str(name), None, "{name}");
        }
    }

    #[test]
    fn content_length_body_and_keep_alive() {
        let (p, out) = parse_all(&[b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhel", b"lo"]);
        assert_eq!(out, b"hello");
        assert!(p.complete() && p.keep_alive && !p.trailing_garbage);
        assert_eq!(p.status, 200);
        assert_eq!(p.header("x-a"), Some("b"));
    }

    #[test]
    fn interim_responses_are_skipped() {
        let (p, out) =
            parse_all(&[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok"]);
        assert_eq!((p.status, out.as_slice()), (201, &b"ok"[..]));
    }

    #[test]
    fn an_unrequested_protocol_switch_ends_the_exchange_and_the_connection() {
        let (p, out) = parse_all(&[b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n\x00\x00\x12"]);
        assert_eq!(p.status, 101);
        assert!(
            p.complete() && !p.keep_alive,
            "a 101 is complete and its connection is not pooled"
        );
        assert!(out.is_empty());
    }

    #[test]
    fn close_delimited_body_ends_at_eof() {
        let mut p = ResponseParser::new(false);
        let mut out = Vec::new();
        p.feed(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nabc", &mut out)
            .unwrap();
        assert!(!p.complete() && !p.keep_alive);
        p.eof(&mut out).unwrap();
        assert!(p.complete());
        assert_eq!(out, b"abc");
    }

    #[test]
    fn cut_short_bodies_are_errors() {
        let mut p = ResponseParser::new(false);
        let mut out = Vec::new();
        p.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", &mut out)
            .unwrap();
        assert!(p.eof(&mut out).is_err());
        let mut p = ResponseParser::new(false);
        assert!(p.eof(&mut out).is_err());
    }

    #[test]
    fn http10_and_no_body_statuses() {
        let (p, _) = parse_all(&[b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"]);
        assert!(p.complete() && !p.keep_alive);
        let (p, out) = parse_all(&[b"HTTP/1.1 204 No Content\r\n\r\n"]);
        assert!(p.complete() && p.keep_alive && out.is_empty());
    }

    #[test]
    fn malformed_framing_is_refused() {
        for wire in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nabc",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\n",
            b"NOT HTTP\r\n\r\n",
        ] {
            let mut p = ResponseParser::new(false);
            assert!(
                p.feed(wire, &mut Vec::new()).is_err(),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn gzip_bodies_are_inflated() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(b"data: {\"x\":1}\n\n").unwrap();
        let gz = enc.finish().unwrap();
        let mut wire = format!(
            "HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\n\r\n",
            gz.len()
        )
        .into_bytes();
        wire.extend_from_slice(&gz);
        let mut p = ResponseParser::new(false);
        let mut out = Vec::new();
        for b in &wire {
            p.feed(std::slice::from_ref(b), &mut out).unwrap();
        }
        assert!(p.complete());
        assert_eq!(out, b"data: {\"x\":1}\n\n");
    }

    #[test]
    fn requests_are_encoded_and_injection_refused() {
        let headers = vec![
            ("x-api-key".to_owned(), "k".to_owned()),
            ("Content-Length".to_owned(), "9".to_owned()),
        ];
        let wire = encode_request("POST", "/v1/messages", "api:443", &headers, b"{}").unwrap();
        assert_eq!(
            wire,
            b"POST /v1/messages HTTP/1.1\r\nhost: api:443\r\nx-api-key: k\r\naccept: */*\r\naccept-encoding: identity\r\ncontent-length: 2\r\n\r\n{}"
        );
        let bad = vec![("x".to_owned(), "a\r\nx-evil: 1".to_owned())];
        assert!(encode_request("POST", "/", "h", &bad, b"").is_err());
        assert!(encode_request("GET", "/a b", "h", &[], b"").is_err());
        let get = encode_request("GET", "/", "h", &[], b"").unwrap();
        assert!(!String::from_utf8(get).unwrap().contains("content-length"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any split of any chunked body (with or without extensions and trailers) decodes to
        /// the concatenated parts, and the exchange completes.
        #[test]
        fn chunked_any_split(
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..12),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..20),
            extension: bool,
            trailer: bool,
        ) {
            let wire = chunked(&parts, extension, trailer);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
            points.push(0);
            points.push(wire.len());
            points.sort_unstable();
            let pieces: Vec<&[u8]> = points.windows(2).map(|w| &wire[w[0]..w[1]]).collect();
            let (p, out) = parse_all(&pieces);
            prop_assert!(p.complete());
            prop_assert!(p.keep_alive);
            prop_assert!(!p.trailing_garbage);
            prop_assert_eq!(out, parts.concat());
        }

        /// Arbitrary bytes never panic the parser.
        #[test]
        fn arbitrary_input_never_panics(data in proptest::collection::vec(any::<u8>(), 0..512), split in 0usize..512) {
            let mut p = ResponseParser::new(false);
            let mut out = Vec::new();
            let split = split.min(data.len());
            let _ = p.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", &mut out)
                .and_then(|_| p.feed(&data[..split], &mut out))
                .and_then(|_| p.feed(&data[split..], &mut out));
            let mut q = ResponseParser::new(false);
            let _ = q.feed(&data, &mut out);
        }
    }
}
