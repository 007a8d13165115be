//! Translation between the LLM wire formats through one intermediate representation (Cosmos §7):
//! N codecs, not N(N−1) converters. Each codec (the private modules `openai_chat`,
//! `openai_responses`, `anthropic`, `gemini` and `ollama`, whose docs list what each format
//! loses) maps one wire format to and from the IR defined here and knows nothing of the others;
//! [`translate_request`] and [`translate_response`] compose two of them, and
//! [`stream::Translator`] does the same event by event for streamed responses.
//!
//! Schema drift is a signal: every request decoder returns, next to the IR, the fields it could
//! not classify ([`Decoded::unknown`]), so the caller can count them instead of losing them
//! silently. Fields a codec knows but deliberately does not carry (caller identity, `store`, …)
//! are classified and not reported.
//!
//! # Gemini thought signatures in tool-call ids
//!
//! Gemini returns a `thoughtSignature` with each function call and requires it back on the next
//! turn. Formats without a field for it carry it inside the tool-call id, which every client
//! echoes verbatim to correlate tool results (see [`encode_call_id`]):
//!
//! `mfts_<n>_<base64url(signature)><original id>`
//!
//! where `<n>` is the decimal length of the base64url text (no padding). The alphabet keeps the
//! id valid for Anthropic (`^[a-zA-Z0-9_-]+$`), the length prefix makes the split unambiguous
//! whatever the original id contains, and the scheme is stateless. The OpenAI Chat codec also
//! writes the signature in Gemini's `extra_content.google.thought_signature` extension.

mod anthropic;
mod gemini;
mod ollama;
mod openai_chat;
mod openai_responses;
pub mod stream;

mod wire;

use serde_json::Value;

use crate::{Error, Result};

/// A wire format the gateway speaks on either side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    OpenAiChat,
    /// OpenAI Responses (`/v1/responses`).
    OpenAiResponses,
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// Gemini `generateContent` / `streamGenerateContent?alt=sse`.
    Gemini,
    /// Ollama `/api/chat` (NDJSON when streaming).
    Ollama,
}

impl Format {
    /// Every format, for tests and tables.
    pub const ALL: [Format; 5] = [Self::OpenAiChat, Self::OpenAiResponses, Self::Anthropic, Self::Gemini, Self::Ollama];

    /// Parses the name the registry and the Python side use.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "openai_chat" => Self::OpenAiChat,
            "openai_responses" => Self::OpenAiResponses,
            "anthropic" => Self::Anthropic,
            "gemini" => Self::Gemini,
            "ollama" => Self::Ollama,
            _ => return None,
        })
    }

    /// The name [`Format::parse`] accepts.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAiChat => "openai_chat",
            Self::OpenAiResponses => "openai_responses",
            Self::Anthropic => "anthropic",
            Self::Gemini => "gemini",
            Self::Ollama => "ollama",
        }
    }
}

/// A chat request in no particular wire format.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request {
    /// The model as the body names it (empty for Gemini, whose model is in the path).
    pub model: String,
    /// System prompt parts, in order. Every format has one system prompt ahead of the turns.
    pub system: Vec<String>,
    /// The turns, oldest first.
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    /// The output cap (`max_completion_tokens`, `max_output_tokens`, `maxOutputTokens`, …).
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// The caller wants a streamed response (for Gemini: decided by the path, not the body).
    pub stream: bool,
    /// The caller asked for usage in the stream (OpenAI `stream_options.include_usage`).
    pub include_usage: bool,
}

/// Who wrote a message. Tool results are [`Block::ToolResult`]s in a user message, as in
/// Anthropic and Gemini; the OpenAI and Ollama codecs map them to their `tool` role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
}

/// One turn of the conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Block>,
}

/// A content block of a message or a response.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    Text(String),
    Image(Image),
    /// Reasoning the model showed; `signature` is the opaque token some vendors need echoed
    /// (Anthropic `signature`, Gemini `thoughtSignature`, OpenAI `encrypted_content`).
    Thinking {
        text: String,
        signature: Option<String>,
    },
    /// Anthropic `redacted_thinking`: encrypted reasoning carried through unread.
    RedactedThinking(String),
    ToolCall(ToolCall),
    ToolResult(ToolResult),
}

/// An image input.
#[derive(Clone, Debug, PartialEq)]
pub enum Image {
    Url(String),
    Base64 { media_type: String, data: String },
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

/// How the model must use the tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    /// Some tool must be called (OpenAI `required`, Anthropic `any`, Gemini `ANY`).
    Required,
    /// This tool must be called.
    Tool(String),
}

/// A call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (OpenAI's form; object formats parse and re-serialize it).
    pub arguments: String,
    /// Gemini's `thoughtSignature` for this call (see the module docs for how it travels).
    pub signature: Option<String>,
}

/// The caller's answer to a [`ToolCall`].
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    /// The [`ToolCall::id`] answered.
    pub id: String,
    /// The called tool's name; formats that do not carry it get it from the matching call
    /// earlier in the conversation (Gemini and Ollama need it).
    pub name: String,
    pub content: String,
    pub is_error: bool,
}

/// Why generation stopped, and how each format says it (decoding maps the other way; a
/// format without the reason decodes to the nearest one):
///
/// | IR | OpenAI Chat | Responses | Anthropic | Gemini | Ollama |
/// |---|---|---|---|---|---|
/// | `EndTurn` | `stop` | `completed` | `end_turn` | `STOP` | `stop` |
/// | `MaxTokens` | `length` | `incomplete`, `max_output_tokens` | `max_tokens` | `MAX_TOKENS` | `length` |
/// | `StopSequence` | `stop` | `completed` | `stop_sequence` | `STOP` | `stop` |
/// | `ToolUse` | `tool_calls` | `completed` with calls | `tool_use` | `STOP` with calls | `stop` with calls |
/// | `ContentFilter` | `content_filter` | `incomplete`, `content_filter` | `refusal` | `SAFETY` (and `RECITATION`, …) | `stop` |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
    ContentFilter,
}

/// Token counts. `input_tokens` excludes cache reads and writes (Anthropic's convention), so
/// the four classes are disjoint and each has its own price.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Folds a later report into this one: a field a later report sets (non-zero) wins, as
    /// streams report running totals and some report each class only once.
    pub fn merge(&mut self, later: &Usage) {
        for (mine, theirs) in [
            (&mut self.input_tokens, later.input_tokens),
            (&mut self.output_tokens, later.output_tokens),
            (&mut self.cache_read_tokens, later.cache_read_tokens),
            (&mut self.cache_write_tokens, later.cache_write_tokens),
        ] {
            if theirs != 0 {
                *mine = theirs;
            }
        }
    }

    /// All prompt tokens, cached or not (OpenAI's `prompt_tokens`, Gemini's `promptTokenCount`).
    #[must_use]
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
    }
}

/// A complete (non-streamed) response.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Response {
    pub id: String,
    pub model: String,
    pub content: Vec<Block>,
    pub stop_reason: Option<StopReason>,
    pub usage: Usage,
}

/// A decoded request and the fields the decoder could not classify.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded<T> {
    /// What the body says, in the IR.
    pub value: T,
    /// Paths of unclassified fields, deduplicated, in first-seen order: `"foo"` at the top
    /// level, `"messages[].foo"`, `"tools[].function.foo"` below it.
    pub unknown: Vec<String>,
}

/// What a request translation changes besides the format.
#[derive(Clone, Debug, Default)]
pub struct RequestOptions {
    /// The upstream model name written into the body; empty keeps the caller's (formats with
    /// the model in the path ignore it).
    pub model: String,
    /// Overrides the decoded stream flag (Gemini's comes from the path).
    pub stream: Option<bool>,
    /// `max_tokens` when the caller gave none and the target requires one (Anthropic).
    pub default_max_tokens: u64,
    /// Ask the upstream for usage in the stream whatever the caller asked (API.md: meshfast
    /// always meters).
    pub force_usage: bool,
}

/// The result of [`translate_request`].
#[derive(Clone, Debug)]
pub struct TranslatedRequest {
    /// The upstream body.
    pub body: Vec<u8>,
    /// As [`Decoded::unknown`].
    pub unknown: Vec<String>,
    /// Whether the caller asked for a stream.
    pub stream: bool,
    /// Whether the caller asked for usage in the stream.
    pub include_usage: bool,
}

/// Decodes a request body of `format` into the IR.
///
/// # Errors
/// [`Error::InvalidArgument`] when the body is not JSON or lacks what the format requires.
pub fn decode_request(format: Format, body: &[u8]) -> Result<Decoded<Request>> {
    let value: Value = serde_json::from_slice(body).map_err(|e| bad_request(format, &e.to_string()))?;
    let mut decoded = match format {
        Format::OpenAiChat => openai_chat::decode_request(&value),
        Format::OpenAiResponses => openai_responses::decode_request(&value),
        Format::Anthropic => anthropic::decode_request(&value),
        Format::Gemini => gemini::decode_request(&value),
        Format::Ollama => ollama::decode_request(&value),
    }
    .map_err(|msg: String| bad_request(format, &msg))?;
    fill_tool_result_names(&mut decoded.value.messages);
    Ok(decoded)
}

/// Encodes an IR request as `format`'s body.
///
/// # Errors
/// [`Error::InvalidArgument`] when the request holds something the format cannot express at
/// all (an image by URL for Ollama); lesser losses are documented per codec.
pub fn encode_request(format: Format, request: &Request) -> Result<Vec<u8>> {
    let value = match format {
        Format::OpenAiChat => openai_chat::encode_request(request),
        Format::OpenAiResponses => openai_responses::encode_request(request),
        Format::Anthropic => anthropic::encode_request(request),
        Format::Gemini => gemini::encode_request(request),
        Format::Ollama => ollama::encode_request(request),
    }
    .map_err(|msg: String| bad_request(format, &msg))?;
    Ok(wire::to_vec(&value))
}

/// Decodes a non-streamed response body of `format`.
///
/// # Errors
/// [`Error::UpstreamBody`] when the body is not a response of that format.
pub fn decode_response(format: Format, body: &[u8]) -> Result<Response> {
    let value: Value = serde_json::from_slice(body).map_err(|e| bad_response(format, &e.to_string()))?;
    match format {
        Format::OpenAiChat => openai_chat::decode_response(&value),
        Format::OpenAiResponses => openai_responses::decode_response(&value),
        Format::Anthropic => anthropic::decode_response(&value),
        Format::Gemini => gemini::decode_response(&value),
        Format::Ollama => ollama::decode_response(&value),
    }
    .map_err(|msg: String| bad_response(format, &msg))
}

/// Encodes an IR response as `format`'s non-streamed body.
#[must_use]
pub fn encode_response(format: Format, response: &Response) -> Vec<u8> {
    let value = match format {
        Format::OpenAiChat => openai_chat::encode_response(response),
        Format::OpenAiResponses => openai_responses::encode_response(response),
        Format::Anthropic => anthropic::encode_response(response),
        Format::Gemini => gemini::encode_response(response),
        Format::Ollama => ollama::encode_response(response),
    };
    wire::to_vec(&value)
}

/// Translates a request body from the entry format to the upstream format: decode, apply
/// `options`, encode. The unknown fields are returned for the drift metric.
///
/// # Errors
/// As [`decode_request`] and [`encode_request`].
pub fn translate_request(from: Format, to: Format, body: &[u8], options: &RequestOptions) -> Result<TranslatedRequest> {
    let Decoded { value: mut request, unknown } = decode_request(from, body)?;
    if let Some(stream) = options.stream {
        request.stream = stream;
    }
    let (stream, include_usage) = (request.stream, request.include_usage);
    if !options.model.is_empty() {
        request.model.clone_from(&options.model);
    }
    if request.max_tokens.is_none() && to == Format::Anthropic {
        request.max_tokens = Some(options.default_max_tokens);
    }
    request.include_usage |= options.force_usage;
    Ok(TranslatedRequest { body: encode_request(to, &request)?, unknown, stream, include_usage })
}

/// Translates a non-streamed response body from the upstream format to the entry format.
///
/// # Errors
/// As [`decode_response`].
pub fn translate_response(from: Format, to: Format, body: &[u8]) -> Result<Vec<u8>> {
    Ok(encode_response(to, &decode_response(from, body)?))
}

/// The top-level request fields `format`'s decoder classifies: those it maps into the IR and
/// those it knows and deliberately drops (caller identity, provider-side storage). Any other
/// field is reported as unknown; the SDK coverage test compares the official SDKs' request
/// types with these lists. Gemini's are in camelCase (snake_case is accepted too).
#[must_use]
pub fn known_fields(format: Format) -> (&'static [&'static str], &'static [&'static str]) {
    match format {
        Format::OpenAiChat => (openai_chat::MAPPED, openai_chat::IGNORED),
        Format::OpenAiResponses => (openai_responses::MAPPED, openai_responses::IGNORED),
        Format::Anthropic => (anthropic::MAPPED, anthropic::IGNORED),
        Format::Gemini => (gemini::MAPPED, gemini::IGNORED),
        Format::Ollama => (ollama::MAPPED, ollama::IGNORED),
    }
}

/// Writes `signature` into a tool-call id as the module docs describe; `None` leaves the id.
#[must_use]
pub fn encode_call_id(id: &str, signature: Option<&str>) -> String {
    let Some(signature) = signature else { return id.to_owned() };
    let encoded = wire::base64url_encode(signature.as_bytes());
    format!("{SIGNATURE_PREFIX}{}_{encoded}{id}", encoded.len())
}

/// Splits an id made by [`encode_call_id`] into the original id and the signature; any other
/// id comes back unchanged with no signature.
#[must_use]
pub fn decode_call_id(id: &str) -> (String, Option<String>) {
    let split = || -> Option<(String, String)> {
        let rest = id.strip_prefix(SIGNATURE_PREFIX)?;
        let (len, rest) = rest.split_once('_')?;
        let len: usize = len.parse().ok()?;
        let encoded = rest.get(..len)?;
        let signature = String::from_utf8(wire::base64url_decode(encoded)?).ok()?;
        Some((rest[len..].to_owned(), signature))
    };
    match split() {
        Some((original, signature)) => (original, Some(signature)),
        None => (id.to_owned(), None),
    }
}

const SIGNATURE_PREFIX: &str = "mfts_";

/// Fills empty [`ToolResult::name`]s from the call with the same id earlier in the conversation.
fn fill_tool_result_names(messages: &mut [Message]) {
    let mut names: Vec<(String, String)> = Vec::new();
    for message in messages {
        for block in &mut message.content {
            match block {
                Block::ToolCall(call) => names.push((call.id.clone(), call.name.clone())),
                Block::ToolResult(result) if result.name.is_empty() => {
                    if let Some((_, name)) = names.iter().rev().find(|(id, _)| *id == result.id) {
                        result.name.clone_from(name);
                    }
                }
                _ => {}
            }
        }
    }
}

fn bad_request(format: Format, msg: &str) -> Error {
    Error::InvalidArgument(format!("invalid {} request: {msg}", format.as_str()))
}

fn bad_response(format: Format, msg: &str) -> Error {
    Error::UpstreamBody(format!("invalid {} response: {msg}", format.as_str()))
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn test_call_id_carries_signature_and_restores_original() {
        let id = encode_call_id("call_1_x", Some("Cq+/AB=="));
        assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{id}");
        assert_eq!(decode_call_id(&id), ("call_1_x".to_owned(), Some("Cq+/AB==".to_owned())));
        assert_eq!(decode_call_id("toolu_01"), ("toolu_01".to_owned(), None));
        assert_eq!(decode_call_id("mfts_99_ab"), ("mfts_99_ab".to_owned(), None));
        assert_eq!(encode_call_id("x", None), "x");
    }

    #[test]
    fn test_usage_merge_keeps_classes_reported_once() {
        let mut usage = Usage { input_tokens: 10, cache_read_tokens: 4, ..Usage::default() };
        usage.merge(&Usage { output_tokens: 7, ..Usage::default() });
        assert_eq!(usage, Usage { input_tokens: 10, output_tokens: 7, cache_read_tokens: 4, cache_write_tokens: 0 });
        assert_eq!(usage.prompt_tokens(), 14);
    }

    /// A Gemini answer with a signed call (no id), served to a client of `client`'s format, and
    /// the client's next turn echoing the call as that client's SDK does.
    fn next_turn_to_gemini(client: Format) -> Value {
        let gemini = json!({"candidates": [{"content": {"role": "model", "parts": [
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "Cs4BAR+/x=="}]},
            "finishReason": "STOP", "index": 0}], "modelVersion": "gemini-3-pro", "responseId": "r-1"});
        let served: Value =
            serde_json::from_slice(&translate_response(Format::Gemini, client, gemini.to_string().as_bytes()).unwrap())
                .unwrap();
        let user = json!({"role": "user", "content": "Weather in Paris?"});
        let body = match client {
            Format::OpenAiChat => {
                let mut message = served["choices"][0]["message"].clone();
                // NOTE: agent clients drop fields they do not know; only the id survives.
                message["tool_calls"][0].as_object_mut().unwrap().remove("extra_content");
                let id = message["tool_calls"][0]["id"].clone();
                json!({"model": "m", "messages": [user, message, {"role": "tool", "tool_call_id": id, "content": "18C"}]})
            }
            Format::Anthropic => {
                let id = served["content"][0]["id"].clone();
                json!({"model": "m", "max_tokens": 100, "messages": [user,
                    {"role": "assistant", "content": served["content"]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "18C"}]}]})
            }
            _ => {
                let call = served["output"][0].clone();
                let output = json!({"type": "function_call_output", "call_id": call["call_id"], "output": "18C"});
                json!({"model": "m", "input": [user, call, output]})
            }
        };
        let options = RequestOptions { model: "gemini-3-pro".into(), ..RequestOptions::default() };
        let translated = translate_request(client, Format::Gemini, body.to_string().as_bytes(), &options).unwrap();
        assert!(translated.unknown.is_empty(), "{client:?}: {:?}", translated.unknown);
        serde_json::from_slice(&translated.body).unwrap()
    }

    #[test]
    fn test_gemini_thought_signature_survives_a_turn_through_every_client_format() {
        for client in [Format::OpenAiChat, Format::Anthropic, Format::OpenAiResponses] {
            let upstream = next_turn_to_gemini(client);
            assert_eq!(
                upstream["contents"][1]["parts"][0],
                json!({"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "Cs4BAR+/x=="}),
                "{client:?}"
            );
            assert_eq!(
                upstream["contents"][2]["parts"][0],
                json!({"functionResponse": {"name": "get_weather", "response": {"output": "18C"}}}),
                "{client:?}"
            );
        }
    }

    #[test]
    fn test_translate_request_fills_what_the_upstream_requires() {
        let body = br#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": true}"#;
        let options = RequestOptions {
            model: "claude-x".into(),
            default_max_tokens: 4096,
            force_usage: true,
            ..RequestOptions::default()
        };
        let translated = translate_request(Format::OpenAiChat, Format::Anthropic, body, &options).unwrap();
        assert!(translated.stream && !translated.include_usage);
        let upstream: Value = serde_json::from_slice(&translated.body).unwrap();
        assert_eq!((upstream["model"].as_str(), upstream["max_tokens"].as_u64()), (Some("claude-x"), Some(4096)));
        let translated = translate_request(Format::OpenAiChat, Format::OpenAiChat, body, &options).unwrap();
        let upstream: Value = serde_json::from_slice(&translated.body).unwrap();
        assert_eq!(upstream["stream_options"], json!({"include_usage": true}));
        assert!(matches!(decode_request(Format::Anthropic, b"[1]"), Err(Error::InvalidArgument(_))));
        assert!(matches!(decode_response(Format::Gemini, b"{"), Err(Error::UpstreamBody(_))));
    }

    #[test]
    fn test_known_fields_are_not_reported_and_others_are() {
        let bodies = [
            (Format::OpenAiChat, json!({"messages": []})),
            (Format::OpenAiResponses, json!({"input": "hi"})),
            (Format::Anthropic, json!({"messages": []})),
            (Format::Gemini, json!({"contents": []})),
            (Format::Ollama, json!({"messages": []})),
        ];
        for (format, mut body) in bodies {
            let (mapped, ignored) = known_fields(format);
            for field in mapped.iter().chain(ignored) {
                body.as_object_mut().unwrap().entry(*field).or_insert(Value::Null);
            }
            body["surely_new_field"] = json!(1);
            let decoded = decode_request(format, body.to_string().as_bytes()).unwrap();
            assert_eq!(decoded.unknown, ["surely_new_field"], "{format:?}");
        }
    }

    #[test]
    fn test_format_names_round_trip() {
        for format in Format::ALL {
            assert_eq!(Format::parse(format.as_str()), Some(format));
        }
        assert_eq!(Format::parse("mesh"), None);
    }
}
