//! The SSE-to-NDJSON reader of every family preset under arbitrary upstream bytes: never a
//! panic, and every line it writes is JSON.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use meshfast_core::provider::{Family, Plan};
use meshfast_core::stream::Stream;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let families = [Family::Anthropic, Family::OpenAi, Family::OpenAiResponses, Family::Gemini, Family::Ollama];
    let family = families[usize::from(selector) % families.len()];
    let plan = Arc::new(Plan::preset(family, "http://fuzz", true).expect("a preset").finish());
    let mut stream = Stream::new(plan, "req_fuzz", 64, selector & 0x80 != 0);
    let mut out = Vec::new();
    for chunk in rest.chunks(usize::from(selector % 17) + 1) {
        stream.feed(chunk, &mut out);
    }
    stream.finish(selector & 0x40 != 0, &mut out);
    for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        assert!(serde_json::from_slice::<serde_json::Value>(line).is_ok(), "not JSON: {line:?}");
    }
});
