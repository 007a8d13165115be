//! The upstream SSE stream of a `/v1/proxy` call, re-encoded as Mesh's NDJSON (mesh-behaviour
//! §2.6, §4.4). Incremental: [`Stream::feed`] takes chunks split anywhere and keeps at most one
//! incomplete line between calls. With web search on, a [`Search`] also reads every event.

use std::sync::Arc;

use serde_json::Value;

use crate::provider::Plan;
use crate::views::{write_int, write_str};
use crate::websearch::{write_citations, Search};

/// A line longer than this is dropped (and counted malformed) rather than buffered further.
const MAX_LINE_BYTES: usize = 16 << 20;

/// One call's stream state.
#[derive(Debug)]
pub struct Stream {
    plan: Arc<Plan>,
    /// `{"id":"req_…"` — every NDJSON line starts with it.
    id_prefix: Vec<u8>,
    max_tokens: i64,
    partial: Vec<u8>,
    /// The stream ended with `[DONE]` or the done signal; later bytes are ignored.
    pub done: bool,
    pub malformed: u64,
    pub deltas: u64,
    pub text_bytes: u64,
    /// The deltas' text as written (restored), for a token estimate when no usage is reported.
    pub text: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// Some usage path matched at least once.
    pub usage_reported: bool,
    /// Web search results so far; `None` (and no extra work per event) without web search.
    pub search: Option<Box<Search>>,
    /// Data protection's surrogates put back; `None` (and no work per delta) without pseudonymization.
    restorer: Option<Box<crate::dlp::Restorer>>,
}

impl Stream {
    /// A stream for request `request_id` over `plan`'s chat paths. `plan` must have a chat plan.
    /// With `web_search`, the family's search events are extracted too (mesh-behaviour §4.5).
    #[must_use]
    pub fn new(plan: Arc<Plan>, request_id: &str, max_tokens: i64, web_search: bool) -> Self {
        let mut id_prefix = Vec::with_capacity(40);
        id_prefix.extend_from_slice(b"{\"id\":");
        write_str(&mut id_prefix, request_id);
        Self {
            id_prefix,
            max_tokens,
            partial: Vec::new(),
            done: false,
            malformed: 0,
            deltas: 0,
            text_bytes: 0,
            text: String::new(),
            input_tokens: 0,
            output_tokens: 0,
            usage_reported: false,
            search: web_search.then(|| Box::new(Search::new(plan.family))),
            plan,
            restorer: None,
        }
    }

    /// Surrogate → original pairs (data protection's pseudonyms): the caller sees the originals.
    #[must_use]
    pub fn with_restore(mut self, pairs: Vec<(String, String)>) -> Self {
        if !pairs.is_empty() {
            self.restorer = Some(Box::new(crate::dlp::Restorer::new(pairs)));
        }
        self
    }

    #[inline]
    fn write_delta(id_prefix: &[u8], delta: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(id_prefix);
        out.extend_from_slice(b",\"delta\":");
        write_str(out, delta);
        out.extend_from_slice(b"}\n");
    }

    /// Billable web searches so far (0 without web search), for pricing.
    #[must_use]
    pub fn web_searches(&self) -> i64 {
        self.search.as_ref().map_or(0, |s| s.billable())
    }

    /// Reads `chunk`, appending the NDJSON lines its complete SSE lines produce to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let mut rest = chunk;
        if !self.partial.is_empty() {
            let Some(newline) = memchr(rest) else {
                if self.partial.len() + rest.len() > MAX_LINE_BYTES {
                    self.partial.clear();
                    self.malformed += 1;
                } else {
                    self.partial.extend_from_slice(rest);
                }
                return;
            };
            self.partial.extend_from_slice(&rest[..newline]);
            let line = std::mem::take(&mut self.partial);
            self.line(&line, out);
            self.partial = line;
            self.partial.clear();
            rest = &rest[newline + 1..];
        }
        while !self.done {
            match memchr(rest) {
                Some(newline) => {
                    self.line(&rest[..newline], out);
                    rest = &rest[newline + 1..];
                }
                None => {
                    if rest.len() <= MAX_LINE_BYTES {
                        self.partial.extend_from_slice(rest);
                    } else {
                        self.malformed += 1;
                    }
                    break;
                }
            }
        }
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let Some(payload) = line.trim_ascii().strip_prefix(b"data:") else {
            return;
        };
        let payload = payload.trim_ascii();
        let chat = self.plan.chat.as_ref().expect("a stream is only made for a chat plan");
        if payload.is_empty() {
            return;
        }
        if payload == b"[DONE]"
            || chat
                .done_signal
                .as_deref()
                .is_some_and(|signal| signal.as_bytes() == payload)
        {
            self.done = true;
            return;
        }
        let Ok(event) = serde_json::from_slice::<Value>(payload) else {
            self.malformed += 1;
            return;
        };
        if let Some(Value::String(delta)) = chat.delta.get(&event) {
            if !delta.is_empty() {
                self.deltas += 1;
                self.text_bytes += delta.len() as u64;
                if let Some(restorer) = self.restorer.as_deref_mut() {
                    let restored = restorer.push(delta);
                    if !restored.is_empty() {
                        Self::write_delta(&self.id_prefix, &restored, out);
                        self.text.push_str(&restored);
                    }
                } else {
                    Self::write_delta(&self.id_prefix, delta, out);
                    self.text.push_str(delta);
                }
            }
        }
        if let Some(n) = chat.usage_in.as_ref().and_then(|p| p.get_int(&event)) {
            self.input_tokens = n;
            self.usage_reported = true;
        }
        if let Some(n) = chat.usage_out.as_ref().and_then(|p| p.get_int(&event)) {
            self.output_tokens = n;
            self.usage_reported = true;
        }
        if let Some(search) = self.search.as_deref_mut() {
            let known = search.sources.len();
            search.observe(&event);
            if search.sources.len() > known {
                out.extend_from_slice(&self.id_prefix);
                out.extend_from_slice(b",\"sources\":");
                write_citations(out, &search.sources[known..]);
                out.extend_from_slice(b"}\n");
            }
        }
    }

    /// Appends the final line: usage, plus `truncated` when output reached `max_tokens` and
    /// `incomplete` when the upstream body broke off. When web search was used, `usage` also
    /// carries `web_searches`, followed by `sources`, `queries`, `search_suggestions_html` and
    /// `sources_truncated` as present.
    pub fn finish(&mut self, incomplete: bool, out: &mut Vec<u8>) {
        if let Some(restorer) = self.restorer.as_deref_mut() {
            let held = restorer.flush();
            if !held.is_empty() {
                Self::write_delta(&self.id_prefix, &held, out);
            }
        }
        out.extend_from_slice(&self.id_prefix);
        out.extend_from_slice(b",\"done\":true,\"usage\":{\"input_tokens\":");
        write_int(out, self.input_tokens);
        out.extend_from_slice(b",\"output_tokens\":");
        write_int(out, self.output_tokens);
        let search = self.search.as_deref().filter(|s| s.used());
        if let Some(search) = search {
            search.write_usage_field(out);
        }
        out.push(b'}');
        if let Some(search) = search {
            search.write_final_fields(out);
        }
        if self.max_tokens > 0 && self.output_tokens >= self.max_tokens {
            out.extend_from_slice(b",\"truncated\":true");
        }
        if incomplete {
            out.extend_from_slice(b",\"incomplete\":true");
        }
        out.extend_from_slice(b"}\n");
    }
}

fn memchr(haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Family;
    use proptest::prelude::*;
    use serde_json::json;

    fn stream() -> Stream {
        Stream::new(
            Arc::new(Plan::preset(Family::OpenAi, "http://h", true).unwrap()),
            "req_1",
            3,
            false,
        )
    }

    fn feed_all(chunks: &[&[u8]]) -> (Vec<u8>, Stream) {
        let mut s = stream();
        let mut out = Vec::new();
        for chunk in chunks {
            s.feed(chunk, &mut out);
        }
        s.finish(false, &mut out);
        (out, s)
    }

    const SSE: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"He\\\"l\"}}]}\r\n\r\n: keep-alive\n\ndata:\n\ndata: {bad json\n\
data: {\"choices\":[{\"delta\":{\"content\":\"\"}}]}\n\
data: {\"choices\":[{\"delta\":{\"content\":\"lo\\u0001\"}}]}\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3.9}}\n\
data: [DONE]\n\
data: {\"choices\":[{\"delta\":{\"content\":\"after\"}}]}\n";

    #[test]
    fn test_sse_becomes_ndjson_with_usage_and_done() {
        let (out, s) = feed_all(&[SSE]);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"id\":\"req_1\",\"delta\":\"He\\\"l\"}\n{\"id\":\"req_1\",\"delta\":\"lo\\u0001\"}\n\
{\"id\":\"req_1\",\"done\":true,\"usage\":{\"input_tokens\":7,\"output_tokens\":3},\"truncated\":true}\n"
        );
        assert!(s.done && s.usage_reported);
        assert_eq!((s.malformed, s.deltas, s.text_bytes), (1, 2, 7));
    }

    #[test]
    fn test_custom_done_signal_ends_the_stream() {
        let mut plan = Plan::preset(Family::OpenAi, "http://h", true).unwrap();
        plan.chat.as_mut().unwrap().done_signal = Some("END".into());
        let mut s = Stream::new(Arc::new(plan), "r", 10, false);
        let mut out = Vec::new();
        s.feed(
            b"data: END\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n",
            &mut out,
        );
        assert!(s.done && out.is_empty());
    }

    const RECORDED: [(Family, &[u8]); 4] = [
        (Family::OpenAi, include_bytes!("testdata/websearch_openai.sse")),
        (Family::Anthropic, include_bytes!("testdata/websearch_anthropic.sse")),
        (
            Family::OpenAiResponses,
            include_bytes!("testdata/websearch_openai_responses.sse"),
        ),
        (Family::Gemini, include_bytes!("testdata/websearch_gemini.sse")),
    ];

    /// Feeds testserve's recorded web-search stream of `family` in `chunks` (`None`: whole).
    fn feed_recorded(family: Family, web_search: bool, cuts: Option<&[usize]>) -> (Vec<u8>, Stream) {
        let sse = RECORDED.iter().find(|(f, _)| *f == family).unwrap().1;
        let mut s = Stream::new(
            Arc::new(Plan::preset(family, "http://h", true).unwrap()),
            "req_1",
            100,
            web_search,
        );
        let mut out = Vec::new();
        for chunk in split(sse, cuts.unwrap_or(&[])) {
            s.feed(chunk, &mut out);
        }
        s.finish(false, &mut out);
        (out, s)
    }

    /// `data` cut at the (unsorted, possibly repeated) positions `cuts`.
    fn split<'a>(data: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
        let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(data.len())).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut start = 0;
        for cut in cuts {
            chunks.push(&data[start..cut]);
            start = cut;
        }
        chunks.push(&data[start..]);
        chunks
    }

    fn lines(out: &[u8]) -> Vec<serde_json::Value> {
        assert_eq!(out.last(), Some(&b'\n'));
        out.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    const R1: &str = "https://example.com/testserve/result-1";
    const R2: &str = "https://example.org/testserve/result-2";

    fn delta_lines() -> Vec<serde_json::Value> {
        ["Hello", " wor\"ld", "!"]
            .iter()
            .map(|d| json!({"id": "req_1", "delta": d}))
            .collect()
    }

    #[test]
    fn test_openai_url_citations_become_a_sources_line_and_final_fields() {
        let (out, s) = feed_recorded(Family::OpenAi, true, None);
        let both = json!([{"url": R1, "title": "testserve result one"}, {"url": R2, "title": "testserve result two"}]);
        let mut want = delta_lines();
        want.push(json!({"id": "req_1", "sources": both}));
        want.push(json!({"id": "req_1", "done": true, "usage": {"input_tokens": 7, "output_tokens": 3, "web_searches": 1}, "sources": both}));
        assert_eq!(lines(&out), want);
        assert_eq!(s.web_searches(), 1, "citations alone bill one search");
    }

    #[test]
    fn test_anthropic_results_come_first_and_citations_merge_by_url() {
        let (out, s) = feed_recorded(Family::Anthropic, true, None);
        let age = "April 1, 2025";
        let mut want = vec![json!({"id": "req_1", "sources": [
            {"url": R1, "title": "testserve result one", "page_age": age},
            {"url": R2, "title": "testserve result two", "page_age": age},
        ]})];
        want.extend(delta_lines());
        want.push(json!({"id": "req_1", "done": true, "usage": {"input_tokens": 7, "output_tokens": 3, "web_searches": 1}, "sources": [
            {"url": R1, "title": "testserve result one", "page_age": age, "cited_text": "Hello wor\"ld!"},
            {"url": R2, "title": "testserve result two", "page_age": age},
        ]}));
        assert_eq!(lines(&out), want);
        assert_eq!(s.web_searches(), 1, "server_tool_use.web_search_requests");
    }

    #[test]
    fn test_responses_annotations_stream_one_by_one_and_queries_are_kept() {
        let (out, s) = feed_recorded(Family::OpenAiResponses, true, None);
        let mut want = delta_lines();
        want.push(json!({"id": "req_1", "sources": [{"url": R1, "title": "testserve result one"}]}));
        want.push(json!({"id": "req_1", "sources": [{"url": R2, "title": "testserve result two"}]}));
        want.push(
            json!({"id": "req_1", "done": true, "usage": {"input_tokens": 7, "output_tokens": 3, "web_searches": 1},
            "sources": [{"url": R1, "title": "testserve result one"}, {"url": R2, "title": "testserve result two"}],
            "queries": ["rust sse"]}),
        );
        assert_eq!(lines(&out), want);
        assert_eq!(s.web_searches(), 1, "one distinct query");
    }

    #[test]
    fn test_gemini_grounding_follows_its_delta_with_queries_and_suggestions() {
        let (out, s) = feed_recorded(Family::Gemini, true, None);
        let both = json!([{"url": R1, "title": "testserve result one"}, {"url": R2, "title": "testserve result two"}]);
        let mut want = delta_lines();
        want.push(json!({"id": "req_1", "sources": both}));
        want.push(json!({"id": "req_1", "done": true, "usage": {"input_tokens": 7, "output_tokens": 3, "web_searches": 1},
            "sources": both, "queries": ["rust sse"], "search_suggestions_html": "<div class=\"testserve\">rust sse</div>"}));
        assert_eq!(lines(&out), want);
        assert_eq!(s.web_searches(), 1);
    }

    #[test]
    fn test_without_web_search_nothing_is_extracted() {
        for (family, _) in RECORDED {
            let (out, s) = feed_recorded(family, false, None);
            let got = lines(&out);
            assert_eq!(got[..3], delta_lines()[..], "{family:?}");
            assert_eq!(got.len(), 4, "{family:?}: no sources line");
            assert_eq!(
                got[3],
                json!({"id": "req_1", "done": true, "usage": {"input_tokens": 7, "output_tokens": 3}}),
                "{family:?}"
            );
            assert!(s.search.is_none() && s.web_searches() == 0);
        }
    }

    #[test]
    fn test_more_than_100_urls_are_truncated_and_repeats_are_not_resent() {
        let mut s = Stream::new(
            Arc::new(Plan::preset(Family::OpenAi, "http://h", true).unwrap()),
            "r",
            0,
            true,
        );
        let mut out = Vec::new();
        for batch in 0..11 {
            let notes: Vec<_> = (batch * 10..batch * 10 + 10)
                .chain([0])
                .map(|i| json!({"type": "url_citation", "url": format!("https://u/{i}")}))
                .collect();
            let event = json!({"choices": [{"delta": {"annotations": notes}}]});
            s.feed(format!("data: {event}\n").as_bytes(), &mut out);
        }
        s.finish(false, &mut out);
        let got = lines(&out);
        let streamed: Vec<&str> = got
            .iter()
            .filter_map(|l| l["sources"].as_array().filter(|_| l.get("done").is_none()))
            .flatten()
            .map(|c| c["url"].as_str().unwrap())
            .collect();
        let first_100: Vec<String> = (0..100).map(|i| format!("https://u/{i}")).collect();
        assert_eq!(streamed, first_100, "each URL streamed once, none past the cap");
        assert_eq!(got.len(), 11, "the last batch adds nothing new");
        let last = got.last().unwrap();
        assert_eq!(last["sources"].as_array().unwrap().len(), 100);
        assert_eq!(
            (last["sources_truncated"].clone(), last["usage"]["web_searches"].clone()),
            (json!(true), json!(1))
        );
    }

    proptest! {
        /// Any chunking gives the same output and usage as feeding the stream whole.
        #[test]
        fn prop_chunking_does_not_change_output(cuts in proptest::collection::vec(0usize..SSE.len(), 0..12)) {
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for cut in cuts {
                chunks.push(&SSE[start..cut]);
                start = cut;
            }
            chunks.push(&SSE[start..]);
            let (whole, w) = feed_all(&[SSE]);
            let (pieces, p) = feed_all(&chunks);
            prop_assert_eq!(whole, pieces);
            prop_assert_eq!((w.input_tokens, w.output_tokens, w.malformed, w.deltas), (p.input_tokens, p.output_tokens, p.malformed, p.deltas));
        }

        /// With web search, any chunking of a recorded stream gives the same lines (sources
        /// lines included, in the same places) and the same billable count.
        #[test]
        fn prop_chunking_does_not_change_web_search_output(which in 0usize..4, cuts in proptest::collection::vec(0usize..6000, 0..16)) {
            let family = RECORDED[which].0;
            let (whole, w) = feed_recorded(family, true, None);
            let (pieces, p) = feed_recorded(family, true, Some(&cuts));
            prop_assert_eq!(whole, pieces);
            prop_assert_eq!(w.web_searches(), p.web_searches());
        }

        /// Random deltas survive the round trip: each NDJSON line parses back to its delta.
        #[test]
        fn prop_random_deltas_round_trip(deltas in proptest::collection::vec("\\PC{1,12}", 1..8), split in 1usize..7) {
            let mut sse = Vec::new();
            for d in &deltas {
                let event = serde_json::json!({"choices": [{"delta": {"content": d}}]});
                sse.extend_from_slice(format!("data: {event}\n\n").as_bytes());
            }
            let chunks: Vec<&[u8]> = sse.chunks(split).collect();
            let (out, _) = feed_all(&chunks);
            let lines: Vec<serde_json::Value> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect();
            let got: Vec<&str> = lines.iter().filter_map(|l| l["delta"].as_str()).collect();
            let want: Vec<&str> = deltas.iter().map(|d| d.as_str()).filter(|d| !d.trim().is_empty() || !d.is_empty()).collect();
            prop_assert_eq!(got, want);
        }
    }
}
