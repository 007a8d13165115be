//! The translation layer under arbitrary input: request decoding for every entry format and
//! re-encoding for every upstream format, response decoding, and the exchange production runs
//! (an entry stream, streamed to the caller or aggregated into one response, fed body bytes or
//! socket bytes through the adopted framing) on arbitrary upstream bytes between every pair.
//! Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshfast_core::entry::EntryStream;
use meshfast_core::exchange::Exchange;
use meshfast_core::http1::ResponseParser;
use meshfast_core::translate::{self, Format};

const FORMATS: [Format; 5] = [Format::OpenAiChat, Format::OpenAiResponses, Format::Anthropic, Format::Gemini, Format::Ollama];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let from = FORMATS[usize::from(selector) % 5];
    let to = FORMATS[usize::from(selector / 5) % 5];
    if let Ok(decoded) = translate::decode_request(from, rest) {
        let _ = translate::encode_request(to, &decoded.value);
    }
    let _ = translate::translate_response(from, to, rest);
    let client_stream = selector & 0x80 != 0;
    let es = EntryStream::new(from, to, client_stream, selector & 0x40 != 0, "m".to_owned());
    let mut exchange = Exchange::new(es, None);
    let framed = selector & 0x20 != 0;
    if framed {
        // Arbitrary socket bytes: the head and framing are fuzzed too.
        exchange.adopt(ResponseParser::new(false));
    }
    let mut out = Vec::new();
    for chunk in rest.chunks(usize::from(selector % 13) + 1) {
        if exchange.feed(chunk, &mut out).is_err() {
            break;
        }
    }
    let _ = exchange.eof(&mut out);
    let _ = exchange.ended();
    exchange.finish(framed, false, || String::from_utf8_lossy(rest).into_owned(), &mut out);
});
