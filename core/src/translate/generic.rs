//! The generic family: a stream read through a provider's configured dot paths (providers as
//! data, mesh-behaviour §4.4). This is how `/v1/proxy` reads every upstream, presets included,
//! since a Mesh provider is its templates and paths; the entry routes read a named family through
//! its own adapter instead.
//!
//! Each `data:` line is one event (no SSE assembly: a generic upstream need not separate events
//! with blank lines). `[DONE]` or the configured done signal ends the stream; an unparseable
//! payload is skipped and counted. From each event: a non-empty string at the delta path is a
//! text delta, the usage paths' numbers are the running totals (the last one seen wins), and with
//! web search on, the family's search events are extracted ([`Search`]).

use std::sync::Arc;

use serde_json::Value;

use super::stream::{BlockKind, Delta, Event};
use super::Usage;
use crate::template::DotPath;
use crate::websearch::Search;

/// Where a stream's text, end and usage are, compiled once with the provider's plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamPaths {
    pub delta: DotPath,
    /// A `data:` payload that ends the stream, besides `[DONE]`.
    pub done_signal: Option<String>,
    pub usage_in: Option<DotPath>,
    pub usage_out: Option<DotPath>,
}

/// One stream's state.
#[derive(Debug)]
pub struct StreamDecoder {
    paths: Arc<StreamPaths>,
    text_open: bool,
    input_tokens: u64,
    output_tokens: u64,
    /// Web search results so far; `None` (and no work per event) without web search.
    search: Option<Box<Search>>,
}

fn count(n: i64) -> u64 {
    // NOTE: a negative count from an upstream would price the call below zero: it counts as 0.
    u64::try_from(n).unwrap_or(0)
}

impl StreamDecoder {
    #[must_use]
    pub fn new(paths: Arc<StreamPaths>, search: Option<Search>) -> Self {
        Self {
            paths,
            text_open: false,
            input_tokens: 0,
            output_tokens: 0,
            search: search.map(Box::new),
        }
    }

    /// The web search results so far (`None` without web search).
    #[must_use]
    pub fn search(&self) -> Option<&Search> {
        self.search.as_deref()
    }

    /// Reads one line (without its line ending). `Err` for a payload that is not JSON.
    pub(crate) fn line(&mut self, line: &[u8], out: &mut Vec<Event>) -> Result<(), String> {
        let Some(payload) = line.trim_ascii().strip_prefix(b"data:") else {
            return Ok(());
        };
        let payload = payload.trim_ascii();
        if payload.is_empty() {
            return Ok(());
        }
        if payload == b"[DONE]" || self.paths.done_signal.as_deref().map(str::as_bytes) == Some(payload) {
            self.finish(out);
            return Ok(());
        }
        // NOTE: checking the UTF-8 whole, then parsing text, costs less than the parser's own check.
        let payload = std::str::from_utf8(payload).map_err(|e| e.to_string())?;
        let mut event: Value = serde_json::from_str(payload).map_err(|e| e.to_string())?;
        let input = self.paths.usage_in.as_ref().and_then(|p| p.get_int(&event));
        let output = self.paths.usage_out.as_ref().and_then(|p| p.get_int(&event));
        // NOTE: the pages go after the text on the wire (Mesh's order), but are read first, so
        // the delta's text can then be moved out of the event rather than copied.
        let sources = self.search.as_deref_mut().and_then(|search| {
            let known = search.sources.len();
            super::observe_search(search, &event);
            (search.sources.len() > known).then(|| search.sources[known..].to_vec())
        });
        if let Some(Value::String(delta)) = self.paths.delta.get_mut(&mut event) {
            if !delta.is_empty() {
                if !self.text_open {
                    self.text_open = true;
                    out.push(Event::BlockStart {
                        index: 0,
                        block: BlockKind::Text,
                    });
                }
                out.push(Event::Delta {
                    index: 0,
                    delta: Delta::Text(std::mem::take(delta)),
                });
            }
        }
        if input.is_some() || output.is_some() {
            self.input_tokens = input.map_or(self.input_tokens, count);
            self.output_tokens = output.map_or(self.output_tokens, count);
            out.push(Event::Usage(Usage {
                input_tokens: self.input_tokens,
                output_tokens: self.output_tokens,
                ..Usage::default()
            }));
        }
        if let Some(sources) = sources {
            out.push(Event::Sources(sources));
        }
        Ok(())
    }

    /// The upstream's body ended: EOF ends a generic stream normally (mesh-behaviour §4.4).
    pub(crate) fn finish(&mut self, out: &mut Vec<Event>) {
        if std::mem::take(&mut self.text_open) {
            out.push(Event::BlockStop { index: 0 });
        }
        out.push(Event::End);
    }
}

#[cfg(test)]
mod tests {
    //! Through [`EntryStream::mesh`], the stack `/v1/proxy` runs: this decoder, data
    //! protection's restorer, and the Mesh NDJSON encoder.
    use super::*;
    use crate::entry::EntryStream;
    use crate::family::Family;
    use crate::provider::Plan;
    use proptest::prelude::*;
    use serde_json::json;

    fn paths(family: Family) -> Arc<StreamPaths> {
        Arc::clone(&Plan::preset(family, "http://h", true).unwrap().chat.unwrap().stream)
    }

    fn mesh(family: Family, max_tokens: i64, web_search: bool) -> EntryStream {
        EntryStream::mesh(
            paths(family),
            web_search.then(|| Search::new(family)),
            "req_1",
            max_tokens,
        )
    }

    fn feed_all(chunks: &[&[u8]]) -> (Vec<u8>, EntryStream) {
        let mut s = mesh(Family::OpenAi, 3, false);
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
        assert!(s.ended() && s.usage_reported());
        assert_eq!((s.malformed(), s.deltas(), s.output_text().len()), (1, 2, 7));
    }

    #[test]
    fn test_custom_done_signal_ends_the_stream() {
        let mut paths = paths(Family::OpenAi);
        Arc::make_mut(&mut paths).done_signal = Some("END".into());
        let mut s = EntryStream::mesh(paths, None, "r", 10);
        let mut out = Vec::new();
        s.feed(
            b"data: END\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n",
            &mut out,
        );
        assert!(s.ended() && out.is_empty());
    }

    const RECORDED: [(Family, &[u8]); 4] = [
        (Family::OpenAi, include_bytes!("../testdata/websearch_openai.sse")),
        (Family::Anthropic, include_bytes!("../testdata/websearch_anthropic.sse")),
        (
            Family::OpenAiResponses,
            include_bytes!("../testdata/websearch_openai_responses.sse"),
        ),
        (Family::Gemini, include_bytes!("../testdata/websearch_gemini.sse")),
    ];

    /// Feeds testserve's recorded web-search stream of `family` in `chunks` (`None`: whole).
    fn feed_recorded(family: Family, web_search: bool, cuts: Option<&[usize]>) -> (Vec<u8>, EntryStream) {
        let sse = RECORDED.iter().find(|(f, _)| *f == family).unwrap().1;
        let mut s = mesh(family, 100, web_search);
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
            assert_eq!(s.web_searches(), 0);
        }
    }

    #[test]
    fn test_more_than_100_urls_are_truncated_and_repeats_are_not_resent() {
        let mut s = EntryStream::mesh(paths(Family::OpenAi), Some(Search::new(Family::OpenAi)), "r", 0);
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

    #[test]
    fn test_a_sources_line_does_not_cut_a_surrogate_held_across_deltas() {
        let mut s = mesh(Family::OpenAi, 0, true).with_restore(vec![("PERSON_1".into(), "Alice".into())]);
        let mut out = Vec::new();
        let first = json!({"choices": [{"delta": {"content": "Hi PER",
            "annotations": [{"type": "url_citation", "url": "https://u/1"}]}}]});
        let second = json!({"choices": [{"delta": {"content": "SON_1, hello"}}]});
        s.feed(format!("data: {first}\n\ndata: {second}\n\n").as_bytes(), &mut out);
        s.finish(false, &mut out);
        let got = lines(&out);
        let text: String = got.iter().filter_map(|l| l["delta"].as_str()).collect();
        assert_eq!(text, "Hi Alice, hello");
        assert!(got
            .iter()
            .any(|l| l.get("sources").is_some() && l.get("done").is_none()));
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
            prop_assert_eq!((w.usage(), w.malformed(), w.deltas()), (p.usage(), p.malformed(), p.deltas()));
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
