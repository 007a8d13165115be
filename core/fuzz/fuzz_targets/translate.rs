//! The translation layer under arbitrary input: request decoding for every entry format and
//! re-encoding for every upstream format, response decoding, and streaming translation of
//! arbitrary upstream bytes between every pair. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshfast_core::translate::stream::Translator;
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
    let mut translator = Translator::new(from, to, selector & 0x80 != 0);
    let mut out = Vec::new();
    for chunk in rest.chunks(usize::from(selector % 13) + 1) {
        translator.feed(chunk, &mut out);
    }
    translator.finish(&mut out);
});
