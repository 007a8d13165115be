//! Streamed responses, translated event by event (Cosmos §7, "Streaming"). A [`Decoder`] turns
//! wire bytes, split anywhere, into IR [`Event`]s; an [`Encoder`] turns events into another
//! format's stream; [`crate::entry::EntryStream`] chains the two for a call (a `Translator`, in
//! the tests, plainly). The only bytes held between calls are one
//! incomplete line and the lines of one incomplete SSE event, so time to first byte is the
//! upstream's.

use std::collections::HashMap;

use super::{anthropic, gemini, generic, mesh, ollama, openai_chat, openai_responses};
use super::{Block, Format, Response, StopReason, ToolCall, Usage};

/// A line longer than this is dropped (and counted malformed) rather than buffered further.
const MAX_LINE_BYTES: usize = 16 << 20;

/// One step of a streamed response. Blocks are numbered from 0 in order of appearance and at
/// most one is open at a time: a [`Event::BlockStart`] follows the previous block's
/// [`Event::BlockStop`].
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The response began; the first event of every stream.
    Start {
        id: String,
        model: String,
    },
    BlockStart {
        index: usize,
        block: BlockKind,
    },
    Delta {
        index: usize,
        delta: Delta,
    },
    BlockStop {
        index: usize,
    },
    /// Token counts so far; later reports override the classes they set ([`Usage::merge`]).
    Usage(Usage),
    /// Pages a web search found, new since the last such event (a generic stream's search
    /// events, [`crate::websearch::Search`]).
    Sources(Vec<crate::websearch::Citation>),
    Finish(StopReason),
    /// The upstream broke off or reported an error mid-stream; encoders write their format's
    /// error signal instead of a clean end (API.md).
    Error(String),
    /// The stream ended cleanly.
    End,
}

/// What kind of block a [`Event::BlockStart`] opens.
#[derive(Clone, Debug, PartialEq)]
pub enum BlockKind {
    Text,
    Thinking,
    RedactedThinking(String),
    ToolCall {
        id: String,
        name: String,
        signature: Option<String>,
    },
}

/// An increment of the open block.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    Text(String),
    Thinking(String),
    /// The thinking block's signature (sent whole, once).
    Signature(String),
    /// A piece of the tool call's JSON arguments.
    Arguments(String),
}

/// Builds the [`Response`] a stream amounts to; used by encoders that must repeat the whole
/// response at the end (Responses' `response.completed`) and by tests.
#[derive(Debug, Default)]
pub struct Accumulator {
    response: Response,
    /// Wire block index → position in `response.content`.
    positions: HashMap<usize, usize>,
}

impl Accumulator {
    /// Folds one event in.
    pub fn push(&mut self, event: &Event) {
        let response = &mut self.response;
        match event {
            Event::Start { id, model } => {
                response.id.clone_from(id);
                response.model.clone_from(model);
            }
            Event::BlockStart { index, block } => {
                self.positions.insert(*index, response.content.len());
                response.content.push(match block {
                    BlockKind::Text => Block::Text(String::new()),
                    BlockKind::Thinking => Block::Thinking {
                        text: String::new(),
                        signature: None,
                    },
                    BlockKind::RedactedThinking(data) => Block::RedactedThinking(data.clone()),
                    BlockKind::ToolCall { id, name, signature } => Block::ToolCall(ToolCall {
                        id: id.clone(),
                        name: name.clone(),
                        arguments: String::new(),
                        signature: signature.clone(),
                    }),
                });
            }
            Event::Delta { index, delta } => {
                let Some(block) = self.positions.get(index).and_then(|&p| response.content.get_mut(p)) else {
                    return;
                };
                match (block, delta) {
                    (Block::Text(text), Delta::Text(more)) | (Block::Thinking { text, .. }, Delta::Thinking(more)) => {
                        text.push_str(more);
                    }
                    (Block::Thinking { signature, .. }, Delta::Signature(more)) => {
                        signature.get_or_insert_with(String::new).push_str(more);
                    }
                    (Block::ToolCall(call), Delta::Arguments(more)) => call.arguments.push_str(more),
                    _ => {}
                }
            }
            Event::Usage(usage) => response.usage.merge(usage),
            Event::Finish(reason) => response.stop_reason = Some(*reason),
            Event::BlockStop { .. } | Event::Sources(_) | Event::Error(_) | Event::End => {}
        }
    }

    /// The response so far.
    #[must_use]
    pub fn response(&self) -> &Response {
        &self.response
    }
}

/// The events that stream `response`: how a non-streamed upstream answer is served to a
/// caller who asked for a stream.
#[must_use]
pub fn events_of(response: &Response) -> Vec<Event> {
    let mut events = vec![Event::Start {
        id: response.id.clone(),
        model: response.model.clone(),
    }];
    let mut index = 0;
    for block in &response.content {
        let (kind, deltas) = match block {
            Block::Text(text) => (BlockKind::Text, vec![Delta::Text(text.clone())]),
            Block::Thinking { text, signature } => {
                let mut deltas = vec![Delta::Thinking(text.clone())];
                deltas.extend(signature.clone().map(Delta::Signature));
                (BlockKind::Thinking, deltas)
            }
            Block::RedactedThinking(data) => (BlockKind::RedactedThinking(data.clone()), Vec::new()),
            Block::ToolCall(call) => (
                BlockKind::ToolCall {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    signature: call.signature.clone(),
                },
                vec![Delta::Arguments(call.arguments.clone())],
            ),
            Block::Image(_) | Block::ToolResult(_) => continue,
        };
        events.push(Event::BlockStart { index, block: kind });
        events.extend(deltas.into_iter().map(|delta| Event::Delta { index, delta }));
        events.push(Event::BlockStop { index });
        index += 1;
    }
    events.push(Event::Usage(response.usage));
    if let Some(reason) = response.stop_reason {
        events.push(Event::Finish(reason));
    }
    events.push(Event::End);
    events
}

/// `response` as `format`'s whole stream: for a caller who asked for a stream when the
/// upstream answered in one piece. `include_usage` as in [`Encoder::new`].
#[must_use]
pub fn encode_stream(format: Format, response: &Response, include_usage: bool) -> Vec<u8> {
    let mut encoder = Encoder::new(format, include_usage);
    let mut out = Vec::new();
    for event in events_of(response) {
        encoder.encode(&event, &mut out);
    }
    out
}

/// Splits bytes into complete lines, keeping the incomplete tail.
#[derive(Debug, Default)]
struct Lines {
    partial: Vec<u8>,
    /// Lines dropped for being too long.
    malformed: u64,
}

impl Lines {
    /// Calls `line` for every complete line of `partial + chunk`, without its line ending.
    fn feed(&mut self, chunk: &[u8], mut line: impl FnMut(&[u8])) {
        let mut rest = chunk;
        while let Some(newline) = memchr::memchr(b'\n', rest) {
            let (head, tail) = rest.split_at(newline);
            rest = &tail[1..];
            if self.partial.is_empty() {
                self.emit(head, &mut line);
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(head);
                self.emit(&whole, &mut line);
            }
        }
        if self.partial.len() + rest.len() > MAX_LINE_BYTES {
            self.partial.clear();
            self.malformed += 1;
        } else {
            self.partial.extend_from_slice(rest);
        }
    }

    /// Hands over an unterminated last line at the end of the stream.
    fn finish(&mut self, mut line: impl FnMut(&[u8])) {
        let tail = std::mem::take(&mut self.partial);
        if !tail.is_empty() {
            self.emit(&tail, &mut line);
        }
    }

    fn emit(&mut self, raw: &[u8], line: &mut impl FnMut(&[u8])) {
        line(raw.strip_suffix(b"\r").unwrap_or(raw));
    }
}

/// Assembles SSE events (`event:` and `data:` lines up to a blank line) from lines.
#[derive(Debug, Default)]
struct Sse {
    event: String,
    data: String,
    has_data: bool,
}

impl Sse {
    /// Takes one line; returns `(event name, data)` when it completes an event.
    fn line(&mut self, line: &str) -> Option<(String, String)> {
        if line.is_empty() {
            return self.dispatch();
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<(String, String)> {
        let event = std::mem::take(&mut self.event);
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        Some((event, std::mem::take(&mut self.data)))
    }
}

/// Per-format decoding state.
#[derive(Debug)]
enum FormatDecoder {
    OpenAiChat(openai_chat::StreamDecoder),
    OpenAiResponses(openai_responses::StreamDecoder),
    Anthropic(anthropic::StreamDecoder),
    Gemini(gemini::StreamDecoder),
    Ollama(ollama::StreamDecoder),
    Generic(generic::StreamDecoder),
}

/// Turns one format's streamed bytes into [`Event`]s.
#[derive(Debug)]
pub struct Decoder {
    format: FormatDecoder,
    lines: Lines,
    sse: Sse,
    /// Events that were not JSON or not of the expected shape; they are skipped.
    malformed: u64,
    ended: bool,
}

impl Decoder {
    /// A decoder for a stream of `format` (SSE, or NDJSON for Ollama).
    #[must_use]
    pub fn new(format: Format) -> Self {
        let format = match format {
            Format::OpenAiChat => FormatDecoder::OpenAiChat(openai_chat::StreamDecoder::default()),
            Format::OpenAiResponses => FormatDecoder::OpenAiResponses(openai_responses::StreamDecoder::default()),
            Format::Anthropic => FormatDecoder::Anthropic(anthropic::StreamDecoder),
            Format::Gemini => FormatDecoder::Gemini(gemini::StreamDecoder::default()),
            Format::Ollama => FormatDecoder::Ollama(ollama::StreamDecoder::default()),
        };
        Self {
            format,
            lines: Lines::default(),
            sse: Sse::default(),
            malformed: 0,
            ended: false,
        }
    }

    /// A decoder for a stream read through a provider's dot paths (the generic family, and
    /// every `/v1/proxy` call); `search` extracts the family's web search events too.
    #[must_use]
    pub fn generic(paths: std::sync::Arc<generic::StreamPaths>, search: Option<crate::websearch::Search>) -> Self {
        Self {
            format: FormatDecoder::Generic(generic::StreamDecoder::new(paths, search)),
            lines: Lines::default(),
            sse: Sse::default(),
            malformed: 0,
            ended: false,
        }
    }

    /// A generic stream's web search results so far (`None` without web search).
    #[must_use]
    pub fn search(&self) -> Option<&crate::websearch::Search> {
        match &self.format {
            FormatDecoder::Generic(state) => state.search(),
            _ => None,
        }
    }

    /// Decodes `chunk`, appending the events its complete wire events produce to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Event>) {
        let mut lines = std::mem::take(&mut self.lines);
        lines.feed(chunk, |line| self.line(line, out));
        self.lines = lines;
    }

    /// Ends the stream: decodes what is left and closes it, with an [`Event::Error`] when the
    /// wire stream stopped before its end marker.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        let mut lines = std::mem::take(&mut self.lines);
        lines.finish(|line| self.line(line, out));
        self.lines = lines;
        if let Some((name, data)) = self.sse.dispatch() {
            self.event(&name, &data, out);
        }
        if self.ended {
            return;
        }
        self.ended = true;
        let clean = match &mut self.format {
            FormatDecoder::Gemini(state) => state.finish(out),
            FormatDecoder::Generic(state) => {
                state.finish(out);
                return;
            }
            _ => false,
        };
        out.push(if clean {
            Event::End
        } else {
            Event::Error("upstream stream ended early".to_owned())
        });
    }

    /// Wire events that could not be decoded (and were skipped) so far.
    #[must_use]
    pub fn malformed(&self) -> u64 {
        self.malformed + self.lines.malformed
    }

    fn line(&mut self, raw: &[u8], out: &mut Vec<Event>) {
        if let FormatDecoder::Generic(state) = &mut self.format {
            // NOTE: every `data:` line is an event of its own, as Mesh reads a provider's stream
            // (and a line that is no `data:` line is skipped unread).
            if self.ended {
                return;
            }
            let start = out.len();
            if state.line(raw, out).is_err() {
                self.malformed += 1;
            }
            if out[start..].iter().any(|e| matches!(e, Event::End | Event::Error(_))) {
                self.ended = true;
            }
            return;
        }
        let Ok(line) = std::str::from_utf8(raw) else {
            self.malformed += 1;
            return;
        };
        match self.format {
            FormatDecoder::Ollama(_) => {
                if !line.trim().is_empty() {
                    self.event("", line, out);
                }
            }
            _ => {
                if let Some((name, data)) = self.sse.line(line) {
                    self.event(&name, &data, out);
                }
            }
        }
    }

    fn event(&mut self, name: &str, data: &str, out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        let start = out.len();
        let result = match &mut self.format {
            FormatDecoder::OpenAiChat(state) => state.event(data, out),
            FormatDecoder::OpenAiResponses(state) => state.event(data, out),
            FormatDecoder::Anthropic(state) => state.event(name, data, out),
            FormatDecoder::Gemini(state) => state.event(data, out),
            FormatDecoder::Ollama(state) => state.event(data, out),
            FormatDecoder::Generic(_) => unreachable!("a generic stream is read by lines"),
        };
        if result.is_err() {
            self.malformed += 1;
        }
        if out[start..].iter().any(|e| matches!(e, Event::End | Event::Error(_))) {
            self.ended = true;
        }
    }
}

/// Per-format encoding state.
#[derive(Debug)]
enum FormatEncoder {
    OpenAiChat(openai_chat::StreamEncoder),
    OpenAiResponses(openai_responses::StreamEncoder),
    Anthropic(anthropic::StreamEncoder),
    Gemini(gemini::StreamEncoder),
    Ollama(ollama::StreamEncoder),
    Mesh(mesh::StreamEncoder),
}

/// Writes [`Event`]s as one format's stream.
#[derive(Debug)]
pub struct Encoder {
    format: FormatEncoder,
}

impl Encoder {
    /// An encoder for `format`. `include_usage` is the caller's OpenAI
    /// `stream_options.include_usage`; other formats always carry usage.
    #[must_use]
    pub fn new(format: Format, include_usage: bool) -> Self {
        let format = match format {
            Format::OpenAiChat => FormatEncoder::OpenAiChat(openai_chat::StreamEncoder::new(include_usage)),
            Format::OpenAiResponses => FormatEncoder::OpenAiResponses(openai_responses::StreamEncoder::default()),
            Format::Anthropic => FormatEncoder::Anthropic(anthropic::StreamEncoder::default()),
            Format::Gemini => FormatEncoder::Gemini(gemini::StreamEncoder::default()),
            Format::Ollama => FormatEncoder::Ollama(ollama::StreamEncoder::default()),
        };
        Self { format }
    }

    /// An encoder of Mesh-native NDJSON (`/v1/proxy`) for request `request_id`.
    #[must_use]
    pub fn mesh(request_id: &str, max_tokens: i64) -> Self {
        Self {
            format: FormatEncoder::Mesh(mesh::StreamEncoder::new(request_id, max_tokens)),
        }
    }

    /// Appends the wire bytes for `event` to `out` (possibly none: some formats hold usage and
    /// the stop reason for their last event).
    pub fn encode(&mut self, event: &Event, out: &mut Vec<u8>) {
        match &mut self.format {
            FormatEncoder::OpenAiChat(state) => state.encode(event, out),
            FormatEncoder::OpenAiResponses(state) => state.encode(event, out),
            FormatEncoder::Anthropic(state) => state.encode(event, out),
            FormatEncoder::Gemini(state) => state.encode(event, out),
            FormatEncoder::Ollama(state) => state.encode(event, out),
            FormatEncoder::Mesh(state) => state.encode(event, out),
        }
    }

    /// Writes what a format writes only once the call is settled, after the stream's last
    /// event: Mesh's final line (the usage as charged, the web search's totals, `incomplete`
    /// when the upstream body broke off). Other formats end with their stream's events.
    pub fn close(
        &mut self,
        usage: &Usage,
        search: Option<&crate::websearch::Search>,
        incomplete: bool,
        out: &mut Vec<u8>,
    ) {
        if let FormatEncoder::Mesh(state) = &self.format {
            state.close(usage, search, incomplete, out);
        }
    }

    /// Writes what the encoder holds back for a following event that has not come: called at
    /// the end of each upstream chunk, so the caller's first byte is not delayed.
    pub fn flush(&mut self, out: &mut Vec<u8>) {
        if let FormatEncoder::Anthropic(state) = &mut self.format {
            state.flush(out);
        }
    }
}

/// Translates a streamed response from the upstream format to the entry format, and taps the
/// usage on the way: the plain chain the properties check. Production translates through
/// [`crate::entry::EntryStream`] inside an [`crate::exchange::Exchange`].
#[cfg(test)]
#[derive(Debug)]
pub struct Translator {
    decoder: Decoder,
    encoder: Encoder,
    events: Vec<Event>,
    usage: Usage,
    stop_reason: Option<StopReason>,
}

#[cfg(test)]
impl Translator {
    /// A translator from `from`'s stream to `to`'s; `include_usage` as in [`Encoder::new`].
    #[must_use]
    pub fn new(from: Format, to: Format, include_usage: bool) -> Self {
        Self {
            decoder: Decoder::new(from),
            encoder: Encoder::new(to, include_usage),
            events: Vec::new(),
            usage: Usage::default(),
            stop_reason: None,
        }
    }

    /// Translates `chunk`, appending the entry-format bytes to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.decoder.feed(chunk, &mut self.events);
        self.flush(out);
    }

    /// Ends the stream (the upstream closed), appending the last bytes to `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.decoder.finish(&mut self.events);
        self.flush(out);
    }

    /// The usage reported so far.
    #[must_use]
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The stop reason, once the upstream gave it.
    #[must_use]
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop_reason
    }

    /// Upstream events skipped as malformed.
    #[must_use]
    pub fn malformed(&self) -> u64 {
        self.decoder.malformed()
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        for event in self.events.drain(..) {
            match &event {
                Event::Usage(usage) => self.usage.merge(usage),
                Event::Finish(reason) => self.stop_reason = Some(*reason),
                _ => {}
            }
            self.encoder.encode(&event, out);
        }
        self.encoder.flush(out);
    }
}

/// Writes one SSE event; `name` empty writes a data-only event.
pub(crate) fn write_sse(out: &mut Vec<u8>, name: &str, data: &serde_json::Value) {
    if !name.is_empty() {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&super::wire::to_vec(data));
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC_HEAD: &str = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n",
    );

    fn translate(from: Format, to: Format, chunks: &[&str]) -> String {
        let mut translator = Translator::new(from, to, true);
        let mut out = Vec::new();
        for chunk in chunks {
            translator.feed(chunk.as_bytes(), &mut out);
        }
        translator.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn test_upstream_cut_mid_stream_ends_with_the_entry_formats_error_signal() {
        let cases = [
            (Format::OpenAiChat, "\"code\":\"upstream_incomplete\"", "[DONE]"),
            (Format::OpenAiResponses, "event: error", "response.completed"),
            (Format::Anthropic, "event: error", "message_stop"),
            (Format::Gemini, "{\"error\":{\"code\":502", "finishReason"),
            (Format::Ollama, "{\"error\":", "\"done\":true"),
        ];
        for (to, error, clean_end) in cases {
            let out = translate(Format::Anthropic, to, &[ANTHROPIC_HEAD]);
            assert!(out.contains("Hel"), "{to:?}: {out}");
            assert!(out.contains(error) && !out.contains(clean_end), "{to:?}: {out}");
        }
    }

    #[test]
    fn test_gemini_stream_without_finish_reason_is_incomplete() {
        let chunk = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hi\"}],\"role\":\"model\"},\"index\":0}]}\r\n\r\n";
        let out = translate(Format::Gemini, Format::OpenAiChat, &[chunk]);
        assert!(out.contains("upstream_incomplete") && !out.contains("[DONE]"), "{out}");
    }

    #[test]
    fn test_first_upstream_chunk_is_answered_at_once() {
        let mut translator = Translator::new(Format::OpenAiChat, Format::Anthropic, false);
        let mut out = Vec::new();
        let first = "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
        translator.feed(first.as_bytes(), &mut out);
        assert!(
            String::from_utf8_lossy(&out).starts_with("event: message_start\n"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }

    #[test]
    fn test_partial_event_is_held_and_nothing_more() {
        let mut translator = Translator::new(Format::Anthropic, Format::OpenAiChat, false);
        let mut out = Vec::new();
        let (head, tail) = ANTHROPIC_HEAD.split_at(ANTHROPIC_HEAD.len() - 20);
        translator.feed(head.as_bytes(), &mut out);
        let before = out.len();
        assert!(!String::from_utf8_lossy(&out).contains("Hel"));
        translator.feed(tail.as_bytes(), &mut out);
        assert!(String::from_utf8_lossy(&out[before..]).contains("\"content\":\"Hel\""));
        assert_eq!(translator.decoder.lines.partial.len(), 0);
    }

    #[test]
    fn test_upstream_error_event_becomes_the_entry_formats_error() {
        let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let out = translate(Format::Anthropic, Format::OpenAiChat, &[ANTHROPIC_HEAD, error]);
        assert!(
            out.contains("Overloaded") && out.contains("upstream_incomplete") && !out.contains("[DONE]"),
            "{out}"
        );
    }

    #[test]
    fn test_malformed_events_are_counted_and_skipped() {
        let mut translator = Translator::new(Format::OpenAiChat, Format::Anthropic, false);
        let mut out = Vec::new();
        translator.feed(b"data: {not json\n\ndata: [DONE]\n\n", &mut out);
        assert_eq!(translator.malformed(), 1);
        assert!(String::from_utf8_lossy(&out).contains("message_stop"));
    }
}
