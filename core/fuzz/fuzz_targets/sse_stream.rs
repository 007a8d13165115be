//! `/v1/proxy`'s exchange (the SSE-to-NDJSON reader of every family preset, as production runs
//! it) under arbitrary upstream bytes: never a panic, and every line it writes is JSON.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use meshfast_core::provider::{Family, Plan};
use meshfast_core::entry::EntryStream;
use meshfast_core::exchange::Exchange;
use meshfast_core::websearch::Search;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let families = [Family::Anthropic, Family::OpenAi, Family::OpenAiResponses, Family::Gemini, Family::Ollama];
    let family = families[usize::from(selector) % families.len()];
    let plan = Plan::preset(family, "http://fuzz", true).expect("a preset").finish();
    let paths = Arc::clone(&plan.chat.as_ref().expect("a chat plan").stream);
    let search = (selector & 0x80 != 0).then(|| Search::new(family));
    let mut exchange = Exchange::new(EntryStream::mesh(paths, search, "req_fuzz", 64), None);
    let mut out = Vec::new();
    for chunk in rest.chunks(usize::from(selector % 17) + 1) {
        exchange.feed(chunk, &mut out).expect("body bytes are never refused");
    }
    exchange.finish(selector & 0x40 != 0, selector & 0x20 != 0, || String::from_utf8_lossy(rest).into_owned(), &mut out);
    for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        assert!(serde_json::from_slice::<serde_json::Value>(line).is_ok(), "not JSON: {line:?}");
    }
});
