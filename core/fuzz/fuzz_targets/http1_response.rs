//! The upstream HTTP/1.1 response parser under arbitrary bytes, split at an arbitrary point:
//! never a panic, and a completed body never exceeds what was fed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshfast_core::http1::ResponseParser;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let cut = usize::from(split).min(rest.len());
    for prefix in [&b""[..], b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"] {
        let mut parser = ResponseParser::new(false);
        let mut out = Vec::new();
        let fed = parser.feed(prefix, &mut out).and_then(|()| parser.feed(&rest[..cut], &mut out)).and_then(|()| parser.feed(&rest[cut..], &mut out));
        if fed.is_ok() {
            let _ = parser.eof(&mut out);
        }
    }
});
