//! One chat call's upstream exchange after the decision: the response's HTTP/1.1 framing, its
//! translation into the bytes the caller gets, and its accounting (usage as reported or
//! estimated, and its price at the rates the call was admitted at).
//!
//! The data plane feeds it socket reads and writes what comes back; at the end, [`Exchange::finish`]
//! hands over the last bytes and everything the row and the settlement need, in one step. Both
//! chat routes go through it and through one stream stack ([`EntryStream`]): an entry route (the
//! caller's own API format) and Mesh-native `/v1/proxy` (NDJSON).

use crate::entry::EntryStream;
use crate::http1::{ProtocolError, ResponseParser};
use crate::pricing::{self, Rates, Tokens};

/// What a finished exchange amounts to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Token counts by price class (`input` excludes cached tokens; `cache_write` the 5-minute
    /// writes only, `cache_write_1h` the one-hour ones).
    pub tokens: Tokens,
    pub input_nano: i64,
    pub output_nano: i64,
    /// The upstream reported no usage: the counts are the tokenizer's estimate.
    pub estimated: bool,
    pub web_searches: i64,
    pub tools_invoked: Vec<String>,
    /// An entry stream that broke (the caller of a whole answer gets an error instead).
    pub error: Option<String>,
}

pub struct Exchange {
    stream: Box<EntryStream>,
    /// The response's framing once adopted from the client (`None`: fed body bytes).
    framing: Option<ResponseParser>,
    rates: Option<Rates>,
    body: Vec<u8>,
    finished: bool,
}

impl Exchange {
    #[must_use]
    pub fn new(stream: EntryStream, rates: Option<Rates>) -> Self {
        Self {
            stream: Box::new(stream),
            framing: None,
            rates,
            body: Vec::new(),
            finished: false,
        }
    }

    /// Takes over the response's framing: from now on [`feed`](Self::feed) takes socket bytes.
    pub fn adopt(&mut self, framing: ResponseParser) {
        self.framing = Some(framing);
    }

    #[must_use]
    pub fn framing(&self) -> Option<&ResponseParser> {
        self.framing.as_ref()
    }

    /// Consumes `data` (socket bytes once the framing is adopted, body bytes before), appending
    /// what the caller gets to `out`. Bytes after [`finish`](Self::finish) (the rest of a body
    /// drained for the pool) are framed and dropped.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        match self.framing.as_mut() {
            Some(framing) => {
                let mut body = std::mem::take(&mut self.body);
                body.clear();
                let framed = framing.feed(data, &mut body);
                // NOTE: a read whose framing broke gives the caller nothing of it (the call is cut
                // short there), so nothing of it is translated or counted either.
                if framed.is_ok() && !self.finished {
                    self.translate(&body, out);
                }
                self.body = body;
                framed
            }
            None => {
                if !self.finished {
                    self.translate(data, out);
                }
                Ok(())
            }
        }
    }

    /// The connection closed: the rest of a close-delimited body, translated.
    pub fn eof(&mut self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        let Some(framing) = self.framing.as_mut() else {
            return Ok(());
        };
        let mut body = Vec::new();
        framing.eof(&mut body)?;
        if !self.finished {
            self.translate(&body, out);
        }
        Ok(())
    }

    /// Translates body bytes the client framed before the framing was adopted.
    pub fn feed_body(&mut self, body: &[u8], out: &mut Vec<u8>) {
        if !self.finished {
            self.translate(body, out);
        }
    }

    fn translate(&mut self, body: &[u8], out: &mut Vec<u8>) {
        if !body.is_empty() {
            self.stream.feed(body, out);
        }
    }

    /// The upstream's stream reached its end signal (the rest of its body carries nothing), or
    /// the adopted response's body ended.
    #[must_use]
    pub fn ended(&self) -> bool {
        self.stream.ended() || self.framing.as_ref().is_some_and(ResponseParser::complete)
    }

    /// Bytes of answer text so far (what an estimate would tokenize).
    #[must_use]
    pub fn text_len(&self) -> usize {
        self.stream.output_text().len()
    }

    /// How many deltas reached the caller (or, for a whole answer, were folded into it).
    #[must_use]
    pub fn deltas(&self) -> u64 {
        self.stream.deltas()
    }

    /// Ends the exchange: appends the caller's last bytes to `out` and returns the call's usage
    /// and price. `incomplete`: the upstream body broke off (or the call was cut at shutdown);
    /// `client_gone`: the caller left. Either charges a call that reported its usage at least
    /// what it carried. Without reported usage, the prompt (`prompt()`, asked only then) and the
    /// answer are estimated with the tokenizer.
    pub fn finish(
        &mut self,
        incomplete: bool,
        client_gone: bool,
        prompt: impl FnOnce() -> String,
        out: &mut Vec<u8>,
    ) -> Settlement {
        self.finished = true;
        let cut_short = incomplete || client_gone;
        let mut settlement = Settlement::default();
        let es = &mut self.stream;
        // NOTE: the rest of the body (an unterminated last line) is read before anything is
        // counted, so the row, the price and the caller's last line agree.
        es.end_input(out);
        let u = es.usage();
        let (mut input, mut output) = (u.input_tokens, u.output_tokens);
        if !es.usage_reported() {
            input = pricing::estimate_tokens(&prompt()) as u64;
            output = pricing::estimate_tokens(es.output_text()) as u64;
            es.set_usage(input, output);
            settlement.estimated = true;
        } else if cut_short && es.deltas() > 0 {
            output = output.max(pricing::estimate_tokens(es.output_text()) as u64);
            es.set_usage(input, output);
        }
        settlement.tools_invoked = es.tools_invoked().to_vec();
        es.close(incomplete, out);
        settlement.error = es.error().map(str::to_owned);
        settlement.web_searches = es.web_searches();
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        settlement.tokens = Tokens {
            input: count(input),
            output: count(output),
            cache_read: count(u.cache_read_tokens),
            // Five-minute and one-hour cache writes cost different prices.
            cache_write: count(u.cache_write_tokens.saturating_sub(u.cache_write_1h_tokens)),
            cache_write_1h: count(u.cache_write_1h_tokens),
        };
        if let Some(rates) = &self.rates {
            (settlement.input_nano, settlement.output_nano) =
                rates.price(&settlement.tokens, 0.0, settlement.web_searches);
        }
        settlement
    }
}

/// The prompt of a Mesh-native body, for an estimate: its `query`, else its text blocks joined
/// by blank lines; empty for a body of another shape.
#[must_use]
pub fn mesh_prompt_text(body: &[u8]) -> String {
    use serde_json::Value;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
        return String::new();
    };
    let query = match body.get("query") {
        None | Some(Value::Null) => None,
        Some(Value::String(q)) => Some(q.as_str()),
        Some(_) => return String::new(),
    };
    let blocks = match body.get("content") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(blocks)) if blocks.iter().all(Value::is_object) => blocks.as_slice(),
        Some(_) => return String::new(),
    };
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        return query.to_owned();
    }
    let texts: Vec<&str> = blocks
        .iter()
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    texts.join("\n\n")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::pricing::Prices;
    use crate::provider::{Family, Plan};
    use crate::translate::Format;

    const SSE: &[u8] =
        b"data: {\"id\":\"c\",\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";

    fn rates() -> Rates {
        Rates {
            prices: Prices::resolve(1_000_000, 2_000_000, None, None, None),
            long_context: None,
            per_second_nano: 0,
            web_search_nano: 0,
        }
    }

    fn entry(client_stream: bool) -> Exchange {
        let es = EntryStream::new(
            Format::OpenAiChat,
            Format::Anthropic,
            client_stream,
            true,
            "m".to_owned(),
        );
        Exchange::new(es, Some(rates()))
    }

    fn proxy() -> Exchange {
        let plan = Plan::preset(Family::OpenAi, "http://h", true).unwrap().finish();
        let paths = Arc::clone(&plan.chat.as_ref().unwrap().stream);
        Exchange::new(EntryStream::mesh(paths, None, "req_1", 64), Some(rates()))
    }

    fn estimate(text: &str) -> i64 {
        i64::try_from(pricing::estimate_tokens(text)).unwrap_or(i64::MAX)
    }

    fn chunked(body: &[u8], piece: usize) -> Vec<u8> {
        let mut wire =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for part in body.chunks(piece) {
            wire.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            wire.extend_from_slice(part);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        wire
    }

    /// Socket bytes through the adopted framing, cut anywhere, give the caller what body bytes
    /// give (the slow, obvious reference: frame everything first, then translate it whole).
    #[test]
    fn framed_socket_reads_translate_as_the_whole_body_does() {
        for client_stream in [true, false] {
            let mut reference = entry(client_stream);
            let mut want = Vec::new();
            reference.feed(SSE, &mut want).unwrap();
            let want_settled = reference.finish(false, false, String::new, &mut want);
            for cut in [1, 2, 7, 64, 4096] {
                let mut ex = entry(client_stream);
                ex.adopt(ResponseParser::new(false));
                let mut got = Vec::new();
                for piece in chunked(SSE, 13).chunks(cut) {
                    ex.feed(piece, &mut got).unwrap();
                }
                assert!(ex.ended() && ex.framing().unwrap().complete());
                let settled = ex.finish(false, false, String::new, &mut got);
                assert_eq!(got, want, "client_stream {client_stream}, cut {cut}");
                assert_eq!(settled, want_settled);
            }
        }
    }

    #[test]
    fn reported_usage_is_priced_at_the_calls_rates() {
        let mut ex = entry(false);
        let mut out = Vec::new();
        ex.feed(SSE, &mut out).unwrap();
        assert!(out.is_empty(), "a whole answer comes at the end");
        let s = ex.finish(
            false,
            false,
            || unreachable!("no estimate when usage is reported"),
            &mut out,
        );
        assert_eq!((s.tokens.input, s.tokens.output, s.estimated), (7, 2, false));
        assert_eq!((s.input_nano, s.output_nano), (7_000, 4_000));
        let response: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(response["usage"]["input_tokens"], 7);
        assert_eq!(response["content"][0]["text"], "Hello world");
    }

    #[test]
    fn without_usage_both_sides_are_estimated_and_the_done_line_carries_them() {
        let sse = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hello world\"}}]}\n\ndata: [DONE]\n\n";
        let mut ex = proxy();
        let mut out = Vec::new();
        ex.feed(sse, &mut out).unwrap();
        assert!(ex.ended());
        let body = br#"{"query":"how are you today","max_tokens":64}"#;
        let s = ex.finish(false, false, || mesh_prompt_text(body), &mut out);
        let (input, output) = (estimate("how are you today"), estimate("Hello world"));
        assert_eq!((s.tokens.input, s.tokens.output, s.estimated), (input, output, true));
        let last: serde_json::Value = serde_json::from_slice(out.split(|&b| b == b'\n').nth(1).unwrap()).unwrap();
        assert_eq!(last["usage"]["input_tokens"], input);
        assert_eq!(last["usage"]["output_tokens"], output);
    }

    #[test]
    fn a_call_cut_short_is_charged_at_least_what_it_carried() {
        // Usage reported early (1 output token), then more text, then the upstream broke off.
        let sse = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"one two three four five six\"}}]}\n\n";
        for (incomplete, client_gone) in [(true, false), (false, true)] {
            let mut ex = proxy();
            let mut out = Vec::new();
            ex.feed(sse, &mut out).unwrap();
            let s = ex.finish(incomplete, client_gone, String::new, &mut out);
            assert_eq!(s.tokens.input, 3);
            assert_eq!(s.tokens.output, estimate("one two three four five six"));
            assert!(!s.estimated);
        }
        let mut ex = proxy();
        let mut out = Vec::new();
        ex.feed(sse, &mut out).unwrap();
        assert_eq!(
            ex.finish(false, false, String::new, &mut out).tokens.output,
            1,
            "a whole stream: as reported"
        );
    }

    #[test]
    fn an_unterminated_last_line_is_counted_before_the_call_is_settled() {
        // A generic upstream that ends its body without a newline, its usage on that last line.
        let sse = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}";
        let mut ex = proxy();
        let mut out = Vec::new();
        ex.feed(sse, &mut out).unwrap();
        let s = ex.finish(false, false, || unreachable!("usage was reported"), &mut out);
        assert_eq!((s.tokens.input, s.tokens.output, s.estimated), (5, 2, false));
        assert_eq!((s.input_nano, s.output_nano), (5_000, 4_000));
        let last: serde_json::Value = serde_json::from_slice(out.split(|&b| b == b'\n').nth(1).unwrap()).unwrap();
        assert_eq!(
            last["usage"],
            serde_json::json!({"input_tokens": 5, "output_tokens": 2})
        );
    }

    #[test]
    fn a_read_whose_framing_breaks_gives_and_counts_nothing_of_it() {
        let mut wire = chunked(SSE, 4096);
        let end = wire.len() - 5; // before the last chunk: "0\r\n\r\n"
        wire.truncate(end);
        wire.extend_from_slice(b"zz\r\n");
        let mut ex = proxy();
        ex.adopt(ResponseParser::new(false));
        let mut out = Vec::new();
        assert!(ex.feed(&wire, &mut out).is_err());
        assert!(out.is_empty());
        assert_eq!((ex.deltas(), ex.text_len(), ex.ended()), (0, 0, false));
    }

    #[test]
    fn bytes_after_the_finish_are_framed_and_dropped() {
        let wire = chunked(SSE, 40);
        let (head, tail) = wire.split_at(wire.len() / 2);
        let mut ex = proxy();
        ex.adopt(ResponseParser::new(false));
        let mut out = Vec::new();
        ex.feed(head, &mut out).unwrap();
        ex.finish(true, false, String::new, &mut out);
        let mut later = Vec::new();
        ex.feed(tail, &mut later).unwrap();
        assert!(later.is_empty());
        assert!(
            ex.framing().unwrap().complete(),
            "the rest was framed: the connection can be pooled"
        );
    }

    #[test]
    fn the_mesh_prompt_is_the_query_or_the_text_blocks() {
        assert_eq!(mesh_prompt_text(br#"{"query":"q","content":[{"text":"t"}]}"#), "q");
        assert_eq!(
            mesh_prompt_text(br#"{"query":"","content":[{"text":"a"},{"type":"image"},{"text":"b"},{"text":1}]}"#),
            "a\n\nb"
        );
        assert_eq!(mesh_prompt_text(br#"{"content":[{"text":"a"}, 3]}"#), "");
        assert_eq!(mesh_prompt_text(br#"{"query":5,"content":[{"text":"a"}]}"#), "");
        assert_eq!(mesh_prompt_text(br#"{"content":{"text":"a"}}"#), "");
        assert_eq!(mesh_prompt_text(b"[1]"), "");
        assert_eq!(mesh_prompt_text(b"not json"), "");
        assert_eq!(mesh_prompt_text(br#"{"model":"m"}"#), "");
    }
}
