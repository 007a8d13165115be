//! The upstream SSE stream of a `/v1/proxy` call, re-encoded as Mesh's NDJSON (mesh-behaviour
//! §2.6, §4.4). Incremental: [`Stream::feed`] takes chunks split anywhere and keeps at most one
//! incomplete line between calls.

use std::sync::Arc;

use serde_json::Value;

use crate::provider::Plan;
use crate::views::{write_int, write_str};

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
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// Some usage path matched at least once.
    pub usage_reported: bool,
}

impl Stream {
    /// A stream for request `request_id` over `plan`'s chat paths. `plan` must have a chat plan.
    #[must_use]
    pub fn new(plan: Arc<Plan>, request_id: &str, max_tokens: i64) -> Self {
        let mut id_prefix = Vec::with_capacity(40);
        id_prefix.extend_from_slice(b"{\"id\":");
        write_str(&mut id_prefix, request_id);
        Self {
            plan,
            id_prefix,
            max_tokens,
            partial: Vec::new(),
            done: false,
            malformed: 0,
            deltas: 0,
            text_bytes: 0,
            input_tokens: 0,
            output_tokens: 0,
            usage_reported: false,
        }
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
        if payload == b"[DONE]" || chat.done_signal.as_deref().is_some_and(|signal| signal.as_bytes() == payload) {
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
                out.extend_from_slice(&self.id_prefix);
                out.extend_from_slice(b",\"delta\":");
                write_str(out, delta);
                out.extend_from_slice(b"}\n");
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
    }

    /// Appends the final line: usage, plus `truncated` when output reached `max_tokens` and
    /// `incomplete` when the upstream body broke off.
    pub fn finish(&mut self, incomplete: bool, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id_prefix);
        out.extend_from_slice(b",\"done\":true,\"usage\":{\"input_tokens\":");
        write_int(out, self.input_tokens);
        out.extend_from_slice(b",\"output_tokens\":");
        write_int(out, self.output_tokens);
        out.push(b'}');
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

    fn stream() -> Stream {
        Stream::new(Arc::new(Plan::preset(Family::OpenAi, "http://h", true).unwrap()), "req_1", 3)
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
        let mut s = Stream::new(Arc::new(plan), "r", 10);
        let mut out = Vec::new();
        s.feed(b"data: END\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n", &mut out);
        assert!(s.done && out.is_empty());
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
