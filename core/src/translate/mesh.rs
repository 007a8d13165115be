//! Mesh-native NDJSON, the stream `/v1/proxy` answers with (mesh-behaviour §2.6): one more
//! encoder over the same [`Event`]s as the entry formats.
//!
//! A text delta is `{"id":"req_…","delta":"…"}`, new web search citations are
//! `{"id":…,"sources":[…]}`, and [`StreamEncoder::close`] writes the final line once the
//! upstream answered 2xx: usage, then `truncated` when the output reached `max_tokens`,
//! `incomplete` when the upstream body broke off, and the search's final fields when web search
//! was used at all.

use super::stream::{Delta, Event};
use super::Usage;
use crate::json::{write_int, write_str};
use crate::websearch::{write_citations, Search};

/// One call's NDJSON writer.
#[derive(Debug)]
pub struct StreamEncoder {
    /// `{"id":"req_…"` — every line starts with it.
    id_prefix: Vec<u8>,
    max_tokens: i64,
}

impl StreamEncoder {
    /// A writer for request `request_id`; `max_tokens` as the caller asked (0: no truncation
    /// flag).
    #[must_use]
    pub fn new(request_id: &str, max_tokens: i64) -> Self {
        let mut id_prefix = Vec::with_capacity(40);
        id_prefix.extend_from_slice(b"{\"id\":");
        write_str(&mut id_prefix, request_id);
        Self { id_prefix, max_tokens }
    }

    pub(crate) fn encode(&mut self, event: &Event, out: &mut Vec<u8>) {
        match event {
            Event::Delta {
                delta: Delta::Text(text),
                ..
            } if !text.is_empty() => {
                out.extend_from_slice(&self.id_prefix);
                out.extend_from_slice(b",\"delta\":");
                write_str(out, text);
                out.extend_from_slice(b"}\n");
            }
            Event::Sources(citations) if !citations.is_empty() => {
                out.extend_from_slice(&self.id_prefix);
                out.extend_from_slice(b",\"sources\":");
                write_citations(out, citations);
                out.extend_from_slice(b"}\n");
            }
            // NOTE: thinking, tool calls and the stop reason have no place in Mesh's stream; the
            // end is the final line, written by `close` with the usage as settled.
            _ => {}
        }
    }

    /// Writes the final line.
    pub(crate) fn close(&self, usage: &Usage, search: Option<&Search>, incomplete: bool, out: &mut Vec<u8>) {
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        out.extend_from_slice(&self.id_prefix);
        out.extend_from_slice(b",\"done\":true,\"usage\":{\"input_tokens\":");
        write_int(out, count(usage.input_tokens));
        out.extend_from_slice(b",\"output_tokens\":");
        write_int(out, count(usage.output_tokens));
        let search = search.filter(|s| s.used());
        if let Some(search) = search {
            search.write_usage_field(out);
        }
        out.push(b'}');
        if let Some(search) = search {
            search.write_final_fields(out);
        }
        if self.max_tokens > 0 && count(usage.output_tokens) >= self.max_tokens {
            out.extend_from_slice(b",\"truncated\":true");
        }
        if incomplete {
            out.extend_from_slice(b",\"incomplete\":true");
        }
        out.extend_from_slice(b"}\n");
    }
}
