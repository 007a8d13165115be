//! The response side of a chat call, and the entry routes' error bodies (API.md "Standard
//! routes"; each API's adapter in `translate/` writes its own shape): the upstream stream decoded into IR events (by the family's adapter, or through the
//! provider's dot paths for `/v1/proxy`) and re-encoded in the caller's format (an entry route's,
//! or Mesh NDJSON), either as a stream or, for a caller that did not ask for one, as one response
//! at the end.
//!
//! meshfast always streams from the upstream; a non-streaming caller's answer is accumulated
//! from the events, so there is one response path and every call reports usage.

use std::borrow::Cow;

use crate::outcome::{Outcome, UNKNOWN_MESSAGE};
use crate::redact::Credentials;
use crate::translate::stream::{Accumulator, Decoder, Encoder, Event};
use crate::translate::{encode_response, Format, StopReason, Usage};

/// A sentence for a Mesh code, for the `message` field SDKs show ([`Outcome`]'s table).
#[must_use]
pub fn message_for(code: &str) -> &'static str {
    Outcome::from_code(code).map_or(UNKNOWN_MESSAGE, |o| o.spec().message)
}

/// An error body in `format`'s own shape, so the official SDKs raise their usual exception for
/// `status`. The Mesh `code` is in the error's `code` (OpenAI, Ollama), `type` (Anthropic) or
/// `details[0].reason` (Gemini); `detail`, when given, is appended to the message.
#[must_use]
pub fn error_body(format: Format, status: u16, code: &str, detail: Option<&str>) -> Vec<u8> {
    error_body_naming(format, status, code, detail, &[])
}

/// [`error_body`] that also names data protection's blocking `detectors` (never the values):
/// `detectors: [..]` in the error object (OpenAI, Anthropic), at the top (Ollama), or in the
/// `ErrorInfo`'s string metadata, comma-separated (Gemini).
#[must_use]
pub fn error_body_naming(
    format: Format,
    status: u16,
    code: &str,
    detail: Option<&str>,
    detectors: &[String],
) -> Vec<u8> {
    let base = message_for(code);
    let message = match detail {
        Some(d) if !d.is_empty() => format!("{base} {d}"),
        _ => base.to_owned(),
    };
    let mut out = Vec::with_capacity(160 + message.len());
    crate::translate::write_error(format, &mut out, status, code, &message, detectors);
    out.push(b'\n');
    out
}

/// The content type of `format`'s stream.
#[must_use]
pub fn stream_content_type(format: Format) -> &'static str {
    match format {
        Format::Ollama => "application/x-ndjson",
        _ => "text/event-stream",
    }
}

/// One call's response side: the upstream stream decoded into IR events (by its family's
/// adapter, or through the provider's dot paths for `/v1/proxy`), data protection's surrogates
/// put back, usage and tools tapped, and the events encoded in the caller's format (an entry
/// route's, or Mesh NDJSON).
#[derive(Debug)]
pub struct EntryStream {
    decoder: Decoder,
    encoder: Option<Encoder>,
    /// A caller who asked for one response: the events folded, encoded in its format at the end.
    accumulator: Option<(Accumulator, Format)>,
    /// The model name the caller sees (the registry name it asked for; Mesh NDJSON shows none).
    model: String,
    events: Vec<Event>,
    usage: Usage,
    usage_reported: bool,
    stop_reason: Option<StopReason>,
    /// Text and argument bytes received, for a tokenizer estimate when no usage comes.
    output_text: String,
    error: Option<String>,
    ended: bool,
    deltas: u64,
    /// Redacted from the upstream's error events before the caller sees them.
    credentials: Credentials,
    /// The tools the model called, each distinct name once, in order (context signals).
    tools_invoked: Vec<String>,
    /// Data protection's surrogates put back (inactive without pseudonymization), and the block
    /// whose text it may hold back.
    restorer: Option<Box<crate::dlp::Restorer>>,
    /// The same for tool call arguments (JSON text): the originals JSON-escaped.
    restorer_json: Option<Box<crate::dlp::Restorer>>,
    open: Option<(usize, u8)>,
}

impl EntryStream {
    /// `model` replaces the upstream's model name in what the caller sees (the registry name
    /// it asked for). With `client_stream` false, nothing is written until [`finish`](Self::finish).
    #[must_use]
    pub fn new(upstream: Format, entry: Format, client_stream: bool, include_usage: bool, model: String) -> Self {
        Self::with_codecs(
            Decoder::new(upstream),
            client_stream.then(|| Encoder::new(entry, include_usage)),
            (!client_stream).then(|| (Accumulator::default(), entry)),
            model,
        )
    }

    /// `/v1/proxy`'s response side: the upstream's stream read through the provider's dot
    /// paths (with the family's web search events when `search` is given), written as Mesh
    /// NDJSON for request `request_id`.
    #[must_use]
    pub fn mesh(
        paths: std::sync::Arc<crate::translate::generic::StreamPaths>,
        search: Option<crate::websearch::Search>,
        request_id: &str,
        max_tokens: i64,
    ) -> Self {
        Self::with_codecs(
            Decoder::generic(paths, search),
            Some(Encoder::mesh(request_id, max_tokens)),
            None,
            String::new(),
        )
    }

    fn with_codecs(
        decoder: Decoder,
        encoder: Option<Encoder>,
        accumulator: Option<(Accumulator, Format)>,
        model: String,
    ) -> Self {
        Self {
            decoder,
            encoder,
            accumulator,
            model,
            events: Vec::new(),
            usage: Usage::default(),
            usage_reported: false,
            stop_reason: None,
            output_text: String::new(),
            error: None,
            ended: false,
            deltas: 0,
            credentials: Credentials::default(),
            tools_invoked: Vec::new(),
            restorer: None,
            restorer_json: None,
            open: None,
        }
    }

    /// Surrogate → original pairs (data protection's pseudonyms): the caller sees the originals.
    #[must_use]
    pub fn with_restore(mut self, pairs: Vec<(String, String)>) -> Self {
        if !pairs.is_empty() {
            let escaped = pairs
                .iter()
                .map(|(surrogate, original)| {
                    let quoted = serde_json::to_string(original).unwrap_or_default();
                    (
                        surrogate.clone(),
                        quoted[1..quoted.len().saturating_sub(1).max(1)].to_owned(),
                    )
                })
                .collect();
            self.restorer_json = Some(Box::new(crate::dlp::Restorer::new(escaped)));
            self.restorer = Some(Box::new(crate::dlp::Restorer::new(pairs)));
        }
        self
    }

    /// The events with surrogates put back; text that may begin one waits for the next delta or
    /// the end of its block.
    fn restore(&mut self, events: Vec<Event>) -> Vec<Event> {
        use crate::translate::stream::Delta;
        let make = |kind: u8, text: String| match kind {
            0 => Delta::Text(text),
            1 => Delta::Thinking(text),
            _ => Delta::Arguments(text),
        };
        let mut out = Vec::with_capacity(events.len() + 1);
        for event in events {
            match event {
                Event::Delta { index, delta } => {
                    let (kind, text) = match delta {
                        Delta::Text(t) => (0, t),
                        Delta::Thinking(t) => (1, t),
                        Delta::Arguments(t) => (2, t),
                        other => {
                            out.push(Event::Delta { index, delta: other });
                            continue;
                        }
                    };
                    self.open = Some((index, kind));
                    let restorer = if kind == 2 {
                        self.restorer_json.as_deref_mut()
                    } else {
                        self.restorer.as_deref_mut()
                    };
                    let Some(restorer) = restorer else {
                        out.push(Event::Delta {
                            index,
                            delta: make(kind, text),
                        });
                        continue;
                    };
                    let text = restorer.push(&text);
                    if !text.is_empty() {
                        out.push(Event::Delta {
                            index,
                            delta: make(kind, text),
                        });
                    }
                }
                // NOTE: usage and a web search's pages say nothing about the text: text held back
                // for a surrogate that may continue in the next delta stays held across them.
                Event::Usage(_) | Event::Sources(_) => out.push(event),
                other => {
                    if let Some((index, kind)) = self.open.take() {
                        let restorer = if kind == 2 {
                            self.restorer_json.as_deref_mut()
                        } else {
                            self.restorer.as_deref_mut()
                        };
                        let rest = restorer.map(crate::dlp::Restorer::flush).unwrap_or_default();
                        if !rest.is_empty() {
                            out.push(Event::Delta {
                                index,
                                delta: make(kind, rest),
                            });
                        }
                    }
                    out.push(other);
                }
            }
        }
        out
    }

    /// The credentials the upstream request carried: an error event that quotes one (a
    /// provider echoing the key it refused) reaches the caller without it.
    #[must_use]
    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    /// Reads an upstream chunk (split anywhere); appends what the caller gets now to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.decoder.feed(chunk, &mut self.events);
        self.drain(out);
        if let Some(encoder) = self.encoder.as_mut() {
            encoder.flush(out);
        }
    }

    /// The upstream ended (cleanly or not; `incomplete`: its body broke off): [`end_input`]
    /// then [`close`].
    ///
    /// [`end_input`]: Self::end_input
    /// [`close`]: Self::close
    pub fn finish(&mut self, incomplete: bool, out: &mut Vec<u8>) {
        self.end_input(out);
        self.close(incomplete, out);
    }

    /// The upstream's body ended: what is left of it (an unterminated last line) is decoded and
    /// its events passed on, so the usage, text and deltas are final when the call is settled.
    pub fn end_input(&mut self, out: &mut Vec<u8>) {
        self.decoder.finish(&mut self.events);
        self.drain(out);
    }

    /// Writes the caller's last bytes, with the usage as settled ([`set_usage`](Self::set_usage)
    /// before): a streaming caller gets its format's end (Mesh's final line); a non-streaming
    /// caller gets the whole response, unless the stream broke ([`error`](Self::error) is then
    /// set and the caller answers an error).
    pub fn close(&mut self, incomplete: bool, out: &mut Vec<u8>) {
        if let Some(encoder) = self.encoder.as_mut() {
            encoder.flush(out);
            encoder.close(&self.usage, self.decoder.search(), incomplete, out);
        }
        if let Some((acc, entry)) = self.accumulator.as_ref() {
            if self.error.is_none() {
                let mut response = acc.response().clone();
                response.model.clone_from(&self.model);
                response.usage = self.usage;
                out.extend_from_slice(&encode_response(*entry, &response));
            }
        }
    }

    /// Billable web searches so far (0 without web search), for pricing.
    #[must_use]
    pub fn web_searches(&self) -> i64 {
        self.decoder.search().map_or(0, crate::websearch::Search::billable)
    }

    /// Replaces the usage (a tokenizer estimate when the upstream reported none). Only what
    /// is written after this call carries it: set it before [`finish`](Self::finish).
    pub fn set_usage(&mut self, input: u64, output: u64) {
        self.usage.input_tokens = input;
        self.usage.output_tokens = output;
    }

    fn drain(&mut self, out: &mut Vec<u8>) {
        let mut events = std::mem::take(&mut self.events);
        if self.restorer.is_some() {
            events = self.restore(events);
        }
        for mut event in events {
            match &mut event {
                Event::Start { model, .. } => model.clone_from(&self.model),
                Event::Usage(usage) => {
                    self.usage.merge(usage);
                    self.usage_reported = true;
                }
                Event::Finish(reason) => self.stop_reason = Some(*reason),
                Event::BlockStart {
                    block: crate::translate::stream::BlockKind::ToolCall { name, .. },
                    ..
                } => {
                    crate::signals::record_tool_name(
                        &mut self.tools_invoked,
                        name,
                        crate::signals::INVOKED_NAME_BUDGET,
                        String::as_str,
                        |n| n,
                    );
                }
                Event::Delta { delta, .. } => {
                    self.deltas += 1;
                    use crate::translate::stream::Delta;
                    match delta {
                        Delta::Text(t) | Delta::Thinking(t) | Delta::Arguments(t) => self.output_text.push_str(t),
                        Delta::Signature(_) => {}
                    }
                }
                Event::Error(message) => {
                    if let Cow::Owned(clean) = self.credentials.redact(message) {
                        *message = clean;
                    }
                    self.error = Some(message.clone());
                    self.ended = true;
                }
                Event::End => self.ended = true,
                _ => {}
            }
            if let Some(encoder) = self.encoder.as_mut() {
                if let Event::Usage(_) = event {
                    // NOTE: encoders keep the latest counts; give them the merged view.
                    encoder.encode(&Event::Usage(self.usage), out);
                } else {
                    encoder.encode(&event, out);
                }
            } else if let Some((acc, _)) = self.accumulator.as_mut() {
                acc.push(&event);
            }
        }
    }

    #[must_use]
    pub fn usage(&self) -> Usage {
        self.usage
    }
    #[must_use]
    pub fn usage_reported(&self) -> bool {
        self.usage_reported
    }
    #[must_use]
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop_reason
    }
    /// Why the stream broke, when it did.
    #[must_use]
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
    /// The stream reached its end (clean or error); later upstream bytes are ignored.
    #[must_use]
    pub fn ended(&self) -> bool {
        self.ended
    }
    #[must_use]
    pub fn deltas(&self) -> u64 {
        self.deltas
    }
    #[must_use]
    pub fn malformed(&self) -> u64 {
        self.decoder.malformed()
    }
    /// The text (and tool-call arguments) received so far.
    #[must_use]
    pub fn output_text(&self) -> &str {
        &self.output_text
    }
    /// The tools the model called so far: each distinct name once, in order, within
    /// [`crate::signals::INVOKED_NAME_BUDGET`] bytes of names.
    #[must_use]
    pub fn tools_invoked(&self) -> &[String] {
        &self.tools_invoked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anthropic_stream(text: &[&str]) -> Vec<u8> {
        let mut s = String::from("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"upstream-name\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n");
        s.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
        for t in text {
            s.push_str(&format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}\n\n", serde_json::to_string(t).unwrap()));
        }
        s.push_str("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n");
        s.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n");
        s.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
        s.into_bytes()
    }

    #[test]
    fn non_streaming_caller_gets_one_response_with_the_registry_model_and_usage() {
        let mut es = EntryStream::new(Format::Anthropic, Format::OpenAiChat, false, false, "my-model".into());
        let mut out = Vec::new();
        let wire = anthropic_stream(&["Hel", "lo"]);
        for piece in wire.chunks(7) {
            es.feed(piece, &mut out);
        }
        assert!(out.is_empty(), "nothing before the end");
        es.finish(false, &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "Hello");
        assert_eq!(v["model"], "my-model");
        assert_eq!(v["usage"]["prompt_tokens"], 7);
        assert_eq!(v["usage"]["completion_tokens"], 5);
        assert_eq!(es.usage().output_tokens, 5);
        assert!(es.usage_reported() && es.error().is_none() && es.ended());
    }

    #[test]
    fn an_upstream_error_event_quoting_the_key_reaches_the_caller_redacted() {
        let key = "sk-ant-api03-Secret0123456789abcdefXYZ9";
        let credentials = Credentials::from_request(&[("x-api-key".into(), key.into())], "https://h/v1/messages");
        let mut wire = anthropic_stream(&["a"]);
        wire.truncate(wire.len() / 3);
        wire.extend_from_slice(format!("event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"authentication_error\",\"message\":\"invalid x-api-key {key} (sk-ant-api03-****XYZ9 / ****fXYZ9)\"}}}}\n\n").as_bytes());
        for client_stream in [true, false] {
            let mut es = EntryStream::new(Format::Anthropic, Format::OpenAiChat, client_stream, false, "m".into())
                .with_credentials(credentials.clone());
            let mut out = Vec::new();
            es.feed(&wire, &mut out);
            es.finish(false, &mut out);
            let text = String::from_utf8(out).unwrap() + es.error().unwrap_or("");
            assert!(es.error().is_some(), "the error event ends the stream");
            assert!(text.contains("invalid x-api-key [redacted]"), "{text}");
            assert!(!text.contains("Secret0123"), "{text}");
            assert!(!text.contains("XYZ9"), "{text}");
        }
    }

    #[test]
    fn streaming_caller_gets_its_format_and_a_cut_stream_ends_in_its_error_signal() {
        let mut es = EntryStream::new(Format::Anthropic, Format::OpenAiChat, true, true, "m".into());
        let mut out = Vec::new();
        let wire = anthropic_stream(&["a", "b"]);
        es.feed(&wire[..wire.len() / 2], &mut out);
        es.finish(false, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("chat.completion.chunk"), "{text}");
        assert!(text.contains("upstream_incomplete"), "{text}");
        assert!(!text.contains("[DONE]"));
        assert!(es.error().is_some());
    }

    #[test]
    fn error_bodies_follow_each_api() {
        let v: serde_json::Value =
            serde_json::from_slice(&error_body(Format::OpenAiChat, 404, "model_not_found", None)).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        let v: serde_json::Value =
            serde_json::from_slice(&error_body(Format::Anthropic, 429, "budget_exceeded", Some("x"))).unwrap();
        assert_eq!(
            (v["type"].as_str(), v["error"]["type"].as_str()),
            (Some("error"), Some("budget_exceeded"))
        );
        let v: serde_json::Value =
            serde_json::from_slice(&error_body(Format::Gemini, 401, "invalid_or_revoked_key", None)).unwrap();
        assert_eq!(v["error"]["code"], 401);
        assert_eq!(v["error"]["status"], "UNAUTHENTICATED");
        let v: serde_json::Value =
            serde_json::from_slice(&error_body(Format::Ollama, 503, "server_busy", None)).unwrap();
        assert!(v["error"].is_string());
    }
    #[test]
    fn a_blocking_detector_is_named_in_every_error_shape() {
        let names = vec!["card".to_owned(), "iban".to_owned()];
        for format in [
            Format::OpenAiChat,
            Format::OpenAiResponses,
            Format::Anthropic,
            Format::Ollama,
        ] {
            let body = error_body_naming(
                format,
                400,
                "sensitive_content_blocked",
                Some("(detectors: card, iban)"),
                &names,
            );
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let listed = v["error"].get("detectors").or_else(|| v.get("detectors")).cloned();
            assert_eq!(listed, Some(serde_json::json!(["card", "iban"])), "{format:?}");
        }
        let body = error_body_naming(Format::Gemini, 400, "sensitive_content_blocked", None, &names);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["details"][0]["metadata"]["detectors"], "card,iban");
        assert_eq!(v["error"]["details"][0]["reason"], "sensitive_content_blocked");
        assert_eq!(
            error_body(Format::Ollama, 400, "invalid_request", None),
            error_body_naming(Format::Ollama, 400, "invalid_request", None, &[])
        );
    }

    #[test]
    fn tools_the_model_called_are_listed_once_in_order() {
        let mut s = String::from("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n");
        for (index, name) in ["search", "fetch", "search"].iter().enumerate() {
            s.push_str(&format!("event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{{\"type\":\"tool_use\",\"id\":\"t{index}\",\"name\":\"{name}\",\"input\":{{}}}}}}\n\n"));
            s.push_str(&format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{{}}\"}}}}\n\n"));
            s.push_str(&format!(
                "event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":{index}}}\n\n"
            ));
        }
        s.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":5}}\n\n");
        s.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
        for entry in [Format::OpenAiChat, Format::Anthropic, Format::Gemini] {
            let mut es = EntryStream::new(Format::Anthropic, entry, true, false, "m".into());
            let mut out = Vec::new();
            for piece in s.as_bytes().chunks(11) {
                es.feed(piece, &mut out);
            }
            es.finish(false, &mut out);
            assert_eq!(es.tools_invoked(), ["search", "fetch"], "{entry:?}");
        }
    }
}
