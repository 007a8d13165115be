//! Translation between the LLM wire formats through one intermediate representation (Cosmos §7):
//! N codecs, not N(N−1) converters. Each codec (the private modules `openai_chat`,
//! `openai_responses`, `anthropic`, `gemini` and `ollama`, whose docs list what each format
//! loses) maps one wire format to and from the IR defined here and knows nothing of the others;
//! [`translate_request`] and [`translate_response`] compose two of them, and
//! [`crate::entry::EntryStream`] does the same event by event for streamed responses.
//!
//! Schema drift is a signal: every request decoder returns, next to the IR, the fields it could
//! not classify ([`Decoded::unknown`]), so the caller can count them instead of losing them
//! silently. Every field a codec knows is in one of three classes ([`known_fields`]):
//!
//! - **mapped**: the IR models it, so it survives a change of format (`temperature`, `top_k`,
//!   reasoning effort ↔ thinking budget, JSON output, …);
//! - **passthrough**: the IR does not model it but the format does (`logit_bias`,
//!   `safetySettings`, Ollama's `options.num_ctx`, …): the decoder keeps the caller's value in
//!   [`Request::passthrough`] and the encoder of the same format writes it back verbatim (the
//!   identity and envelope plans); another format loses it, as each codec's docs list. Mapped
//!   fields whose mapping is approximate (reasoning, output format) are kept there too, so the
//!   same format gets the caller's exact value;
//! - **ignored**: known and deliberately not carried: caller identity (API.md: none is sent
//!   upstream), provider-side storage and account selection, and options that the registry's
//!   prices or the gateway's reservation do not cover (`n`, `service_tier`, audio output).
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
pub mod cache;
mod gemini;
pub mod generic;
mod mesh;
mod ollama;
mod openai_chat;
mod openai_responses;
pub mod stream;

mod wire;

use serde_json::{Map, Value};

use crate::family::Family;
use crate::websearch::Search;
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
    pub const ALL: [Format; 5] = [
        Self::OpenAiChat,
        Self::OpenAiResponses,
        Self::Anthropic,
        Self::Gemini,
        Self::Ollama,
    ];

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
    /// Sample from the `k` likeliest tokens (Anthropic, Gemini, Ollama; OpenAI has none).
    pub top_k: Option<u64>,
    /// Sampling seed (OpenAI Chat, Gemini, Ollama).
    pub seed: Option<i64>,
    /// OpenAI Chat, Gemini and Ollama penalties.
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// Whether the model may call several tools in one turn (OpenAI `parallel_tool_calls`,
    /// Anthropic `tool_choice.disable_parallel_tool_use` negated).
    pub parallel_tool_calls: Option<bool>,
    /// How much the model should reason, when the caller said.
    pub reasoning: Option<Reasoning>,
    /// The answer must be JSON.
    pub output_format: Option<OutputFormat>,
    /// Fields only the caller's own format understands (see the module docs).
    pub passthrough: Passthrough,
    /// Prompt-cache breakpoints the caller set (Anthropic `cache_control` on a tool, a system
    /// part or a content block), written back for an Anthropic upstream.
    pub cache_marks: Vec<CacheMark>,
    /// The prompt-cache shaping the gateway applies to this call ([`cache`]).
    pub cache_shaping: Option<CacheShaping>,
}

/// Where a prompt-cache breakpoint sits, by IR index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CachePoint {
    Tool(usize),
    System(usize),
    Block { message: usize, block: usize },
}

/// A caller's breakpoint: its place and its `cache_control` object as sent.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheMark {
    pub at: CachePoint,
    pub control: Value,
}

/// Prompt-cache shaping (Cosmos §7, API.md "Prompt-cache shaping"), chosen per call by the
/// gateway: breakpoints for an Anthropic upstream (when the caller set none), a cache key for
/// an OpenAI one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheShaping {
    /// Breakpoints on the last tool, the system prompt and the last stable message block, with
    /// the one-hour TTL or Anthropic's default five minutes.
    Breakpoints { one_hour: bool },
    /// `prompt_cache_key`: an opaque keyed hash of the principal.
    Key(String),
}

/// The reasoning a caller asked for, in whichever terms its format uses; each encoder converts
/// to its own with [`Reasoning::effort`] and [`Reasoning::budget_tokens`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reasoning {
    /// No reasoning (OpenAI `none`, Anthropic `disabled`, Gemini budget 0, Ollama `think: false`).
    Off,
    /// The model decides (Anthropic `adaptive`, Gemini budget -1, Ollama `think: true`).
    Auto,
    /// A level (OpenAI `reasoning_effort`, Anthropic `output_config.effort`, Gemini `thinkingLevel`).
    Effort(Effort),
    /// A token budget (Anthropic `budget_tokens`, Gemini `thinkingBudget`).
    Budget(u64),
}

impl Reasoning {
    /// The level; a budget maps to the nearest one ([`Effort::from_budget`]).
    #[must_use]
    pub fn effort(self) -> Option<Effort> {
        match self {
            Self::Off | Self::Auto => None,
            Self::Effort(effort) => Some(effort),
            Self::Budget(tokens) => Some(Effort::from_budget(tokens)),
        }
    }

    /// The token budget; a level maps to [`Effort::budget_tokens`], [`Reasoning::Auto`] to the
    /// medium budget.
    #[must_use]
    pub fn budget_tokens(self) -> Option<u64> {
        match self {
            Self::Off => None,
            Self::Auto => Some(Effort::Medium.budget_tokens()),
            Self::Effort(effort) => Some(effort.budget_tokens()),
            Self::Budget(tokens) => Some(tokens),
        }
    }
}

/// A reasoning level, OpenAI's names (Anthropic's `output_config.effort` is a subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effort {
    Minimal,
    Low,
    Medium,
    High,
    XHigh,
    Max,
}

impl Effort {
    /// Parses a level name, in any case (Gemini writes them upper case).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "minimal" => Self::Minimal,
            "low" => Self::Low,
            "medium" => Self::Medium,
            "high" => Self::High,
            "xhigh" => Self::XHigh,
            "max" => Self::Max,
            _ => return None,
        })
    }

    /// The name [`Effort::parse`] accepts, lower case.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Minimal => "minimal",
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::XHigh => "xhigh",
            Self::Max => "max",
        }
    }

    /// The thinking budget a level stands for. Anthropic's floor is 1024 tokens; each level
    /// doubles or quadruples the one below, as the vendors' own presets do.
    #[must_use]
    pub fn budget_tokens(self) -> u64 {
        match self {
            Self::Minimal => 1024,
            Self::Low => 2048,
            Self::Medium => 8192,
            Self::High => 24_576,
            Self::XHigh => 32_768,
            Self::Max => 65_536,
        }
    }

    /// The level whose budget is nearest above `tokens`, between `low` and `high`: the levels
    /// every reasoning model accepts (`minimal` and `xhigh` are some models' only).
    #[must_use]
    pub fn from_budget(tokens: u64) -> Self {
        match tokens {
            0..=2048 => Self::Low,
            2049..=8192 => Self::Medium,
            _ => Self::High,
        }
    }
}

/// The answer must be JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputFormat {
    /// Any JSON (OpenAI `json_object`, Gemini `application/json`, Ollama `"json"`).
    Json,
    /// JSON that matches `schema` (OpenAI `json_schema`, Anthropic `output_config.format`,
    /// Gemini `responseJsonSchema`, Ollama's schema `format`).
    JsonSchema {
        name: String,
        schema: Value,
        strict: Option<bool>,
    },
}

/// The caller's fields for the same format only: top-level keys as the body had them, and the
/// nested ones under their container (`generationConfig`, `options`). [`encode_request`] of
/// [`Passthrough::format`] writes them over what it encoded; any other format ignores them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Passthrough {
    /// The format the fields came from; `None` while there are none.
    pub format: Option<Format>,
    pub fields: Map<String, Value>,
}

impl Passthrough {
    /// Keeps `value` at `key`, or at `container.key` when `container` is not empty.
    pub(crate) fn keep(&mut self, container: &str, key: &str, value: &Value) {
        if value.is_null() {
            return;
        }
        let map = if container.is_empty() {
            &mut self.fields
        } else {
            let slot = self
                .fields
                .entry(container)
                .or_insert_with(|| Value::Object(Map::new()));
            match slot {
                Value::Object(map) => map,
                _ => return,
            }
        };
        map.insert(key.to_owned(), value.clone());
    }

    /// Writes the fields over `body`: a container object merges key by key, anything else
    /// replaces the encoder's value.
    fn apply(&self, body: &mut Value) {
        let Value::Object(body) = body else { return };
        for (key, value) in &self.fields {
            match (body.get_mut(key), value) {
                (Some(Value::Object(into)), Value::Object(from)) => {
                    into.extend(from.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                _ => {
                    body.insert(key.clone(), value.clone());
                }
            }
        }
    }
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
    /// Of `cache_write_tokens`, those written with a one-hour lifetime (Anthropic's
    /// `cache_creation.ephemeral_1h_input_tokens`), which cost more than five-minute writes.
    pub cache_write_1h_tokens: u64,
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
            (&mut self.cache_write_1h_tokens, later.cache_write_1h_tokens),
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

/// Appends an error body in `format`'s own shape (each API's adapter writes its own), so the
/// official SDKs raise their usual exception for `status`.
pub fn write_error(format: Format, out: &mut Vec<u8>, status: u16, code: &str, message: &str, detectors: &[String]) {
    match format {
        Format::OpenAiChat => openai_chat::write_error(out, status, code, message, detectors),
        Format::OpenAiResponses => openai_responses::write_error(out, status, code, message, detectors),
        Format::Anthropic => anthropic::write_error(out, status, code, message, detectors),
        Format::Gemini => gemini::write_error(out, status, code, message, detectors),
        Format::Ollama => ollama::write_error(out, status, code, message, detectors),
    }
}

/// Reads one upstream event's web search into `search`, by the family's adapter (OpenAI-family
/// events that cite nothing through the chat rules are read through the Responses rules, as
/// Mesh does; a generic provider's extract nothing).
pub fn observe_search(search: &mut Search, event: &Value) {
    if !event.is_object() {
        return;
    }
    match search.family() {
        Family::Anthropic => anthropic::observe_search(search, event),
        Family::OpenAi | Family::Ollama => {
            let cited = search.cited();
            openai_chat::observe_search(search, event);
            if search.cited() == cited {
                openai_responses::observe_search(search, event);
            }
        }
        Family::OpenAiResponses => openai_responses::observe_search(search, event),
        Family::Gemini => gemini::observe_search(search, event),
        Family::Generic => {}
    }
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
    if !decoded.value.passthrough.fields.is_empty() {
        decoded.value.passthrough.format = Some(format);
    }
    Ok(decoded)
}

/// Encodes an IR request as `format`'s body, with the [`Request::passthrough`] fields when
/// they came from `format`.
///
/// # Errors
/// [`Error::InvalidArgument`] when the request holds something the format cannot express at
/// all (an image by URL for Ollama); lesser losses are documented per codec.
pub fn encode_request(format: Format, request: &Request) -> Result<Vec<u8>> {
    let mut value = match format {
        Format::OpenAiChat => openai_chat::encode_request(request),
        Format::OpenAiResponses => openai_responses::encode_request(request),
        Format::Anthropic => anthropic::encode_request(request),
        Format::Gemini => gemini::encode_request(request),
        Format::Ollama => ollama::encode_request(request),
    }
    .map_err(|msg: String| bad_request(format, &msg))?;
    if request.passthrough.format == Some(format) {
        request.passthrough.apply(&mut value);
    }
    cache::apply(format, &mut value, request);
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
    let Decoded {
        value: mut request,
        unknown,
    } = decode_request(from, body)?;
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
    Ok(TranslatedRequest {
        body: encode_request(to, &request)?,
        unknown,
        stream,
        include_usage,
    })
}

/// Translates a non-streamed response body from the upstream format to the entry format.
///
/// # Errors
/// As [`decode_response`].
pub fn translate_response(from: Format, to: Format, body: &[u8]) -> Result<Vec<u8>> {
    Ok(encode_response(to, &decode_response(from, body)?))
}

/// The request fields `format`'s decoder classifies, by class (see the module docs).
/// Nested fields are written `container.field` (`generationConfig.topK`, `options.num_ctx`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownFields {
    /// Carried into the IR, so across formats.
    pub mapped: Vec<String>,
    /// Carried verbatim to an upstream of the same format only.
    pub passthrough: Vec<String>,
    /// Known and not carried.
    pub ignored: Vec<String>,
}

/// The fields `format`'s decoder classifies; any other is reported as unknown. The SDK
/// coverage test (`tests/test_schema_drift.py`) compares the official SDKs' request types with
/// these lists. Gemini's are in camelCase (snake_case is accepted too).
#[must_use]
pub fn known_fields(format: Format) -> KnownFields {
    let nested = |container: &str, fields: &[&str]| -> Vec<String> {
        fields.iter().map(|f| format!("{container}.{f}")).collect()
    };
    let own = |fields: &[&str]| -> Vec<String> { fields.iter().map(|f| (*f).to_owned()).collect() };
    let mut known = match format {
        Format::OpenAiChat => KnownFields {
            mapped: own(openai_chat::MAPPED),
            passthrough: own(openai_chat::PASSTHROUGH),
            ignored: own(openai_chat::IGNORED),
        },
        Format::OpenAiResponses => KnownFields {
            mapped: own(openai_responses::MAPPED),
            passthrough: own(openai_responses::PASSTHROUGH),
            ignored: own(openai_responses::IGNORED),
        },
        Format::Anthropic => KnownFields {
            mapped: own(anthropic::MAPPED),
            passthrough: own(anthropic::PASSTHROUGH),
            ignored: own(anthropic::IGNORED),
        },
        Format::Gemini => KnownFields {
            mapped: own(gemini::MAPPED),
            passthrough: own(gemini::PASSTHROUGH),
            ignored: own(gemini::IGNORED),
        },
        Format::Ollama => KnownFields {
            mapped: own(ollama::MAPPED),
            passthrough: own(ollama::PASSTHROUGH),
            ignored: own(ollama::IGNORED),
        },
    };
    match format {
        Format::Gemini => {
            known
                .mapped
                .extend(nested("generationConfig", gemini::GENERATION_MAPPED));
            known
                .passthrough
                .extend(nested("generationConfig", gemini::GENERATION_PASSTHROUGH));
            known
                .ignored
                .extend(nested("generationConfig", gemini::GENERATION_IGNORED));
        }
        Format::Ollama => {
            known.mapped.extend(nested("options", ollama::OPTIONS_MAPPED));
            known.passthrough.extend(nested("options", ollama::OPTIONS_PASSTHROUGH));
        }
        _ => {}
    }
    known
}

/// Writes `signature` into a tool-call id as the module docs describe; `None` leaves the id.
#[must_use]
pub fn encode_call_id(id: &str, signature: Option<&str>) -> String {
    let Some(signature) = signature else {
        return id.to_owned();
    };
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
        assert!(
            id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "{id}"
        );
        assert_eq!(
            decode_call_id(&id),
            ("call_1_x".to_owned(), Some("Cq+/AB==".to_owned()))
        );
        assert_eq!(decode_call_id("toolu_01"), ("toolu_01".to_owned(), None));
        assert_eq!(decode_call_id("mfts_99_ab"), ("mfts_99_ab".to_owned(), None));
        assert_eq!(encode_call_id("x", None), "x");
    }

    #[test]
    fn test_usage_merge_keeps_classes_reported_once() {
        let mut usage = Usage {
            input_tokens: 10,
            cache_read_tokens: 4,
            ..Usage::default()
        };
        usage.merge(&Usage {
            output_tokens: 7,
            ..Usage::default()
        });
        assert_eq!(
            usage,
            Usage {
                input_tokens: 10,
                output_tokens: 7,
                cache_read_tokens: 4,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0
            }
        );
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
                message["tool_calls"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("extra_content");
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
        let options = RequestOptions {
            model: "gemini-3-pro".into(),
            ..RequestOptions::default()
        };
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
        assert_eq!(
            (upstream["model"].as_str(), upstream["max_tokens"].as_u64()),
            (Some("claude-x"), Some(4096))
        );
        let translated = translate_request(Format::OpenAiChat, Format::OpenAiChat, body, &options).unwrap();
        let upstream: Value = serde_json::from_slice(&translated.body).unwrap();
        assert_eq!(upstream["stream_options"], json!({"include_usage": true}));
        assert!(matches!(
            decode_request(Format::Anthropic, b"[1]"),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            decode_response(Format::Gemini, b"{"),
            Err(Error::UpstreamBody(_))
        ));
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
            let known = known_fields(format);
            for path in known.mapped.iter().chain(&known.passthrough).chain(&known.ignored) {
                let object = body.as_object_mut().unwrap();
                match path.split_once('.') {
                    None => {
                        object.entry(path.as_str()).or_insert(Value::Null);
                    }
                    Some((container, field)) => {
                        let slot = object.entry(container).or_insert_with(|| json!({}));
                        if !slot.is_object() {
                            *slot = json!({});
                        }
                        slot[field] = Value::Null;
                    }
                }
            }
            body["surely_new_field"] = json!(1);
            let nested = match format {
                Format::Gemini => Some("generationConfig"),
                Format::Ollama => Some("options"),
                _ => None,
            };
            if let Some(container) = nested {
                body[container]["surely_new_option"] = json!(1);
            }
            let decoded = decode_request(format, body.to_string().as_bytes()).unwrap();
            let mut expected = vec!["surely_new_field".to_owned()];
            expected.extend(nested.map(|c| format!("{c}.surely_new_option")));
            let mut unknown = decoded.unknown.clone();
            unknown.sort();
            expected.sort();
            assert_eq!(unknown, expected, "{format:?}");
        }
    }

    #[test]
    fn test_field_classes_are_disjoint() {
        for format in Format::ALL {
            let known = known_fields(format);
            let mut all: Vec<&String> = known
                .mapped
                .iter()
                .chain(&known.passthrough)
                .chain(&known.ignored)
                .collect();
            let count = all.len();
            all.sort();
            all.dedup();
            assert_eq!(all.len(), count, "{format:?}: a field is in two classes");
        }
    }

    /// `body` of `from` translated for a `to` upstream, as JSON.
    fn upstream(from: Format, to: Format, body: &Value) -> Value {
        let options = RequestOptions {
            model: "m".into(),
            default_max_tokens: 64_000,
            ..RequestOptions::default()
        };
        let translated = translate_request(from, to, body.to_string().as_bytes(), &options).unwrap();
        assert!(translated.unknown.is_empty(), "{from:?}: {:?}", translated.unknown);
        serde_json::from_slice(&translated.body).unwrap()
    }

    #[test]
    fn test_passthrough_fields_reach_the_same_format_verbatim_and_no_other() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (
                Format::OpenAiChat,
                json!({"model": "x", "messages": user, "logit_bias": {"50256": -100}, "logprobs": true,
                    "top_logprobs": 3, "prediction": {"type": "content", "content": "hi"}, "verbosity": "low",
                    "user": "u-1"}),
                vec!["logit_bias", "logprobs", "top_logprobs", "prediction", "verbosity"],
            ),
            (
                Format::OpenAiResponses,
                json!({"model": "x", "input": "hi", "previous_response_id": "resp_1", "include": ["reasoning.encrypted_content"],
                    "truncation": "auto", "reasoning": {"effort": "low", "summary": "auto"}, "metadata": {"k": "v"}}),
                vec!["previous_response_id", "include", "truncation", "reasoning"],
            ),
            (
                Format::Anthropic,
                json!({"model": "x", "max_tokens": 4096, "messages": user, "cache_control": {"type": "ephemeral"},
                    "thinking": {"type": "enabled", "budget_tokens": 2048, "display": "omitted"},
                    "metadata": {"user_id": "u-1"}}),
                vec!["cache_control", "thinking"],
            ),
            (
                Format::Ollama,
                json!({"model": "x", "messages": user, "think": "high", "format": {"type": "object"},
                    "options": {"temperature": 0.5, "num_ctx": 8192, "mirostat": 2}, "keep_alive": "1h"}),
                vec!["think", "format", "options"],
            ),
        ];
        for (format, body, carried) in cases {
            let same = upstream(format, format, &body);
            for key in &carried {
                assert_eq!(same[key], body[key], "{format:?} {key}");
            }
            for key in ["user", "metadata", "keep_alive"] {
                assert!(same.get(key).is_none(), "{format:?} sent {key}");
            }
            for other in Format::ALL.into_iter().filter(|f| *f != format) {
                let translated = upstream(format, other, &body);
                for key in [
                    "logit_bias",
                    "prediction",
                    "previous_response_id",
                    "cache_control",
                    "num_ctx",
                ] {
                    assert!(
                        !translated.to_string().contains(key),
                        "{format:?} -> {other:?} carried {key}"
                    );
                }
            }
        }
    }

    #[test]
    fn test_gemini_passthrough_joins_the_encoded_generation_config_in_camel_case() {
        let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "safety_settings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}],
            "generation_config": {"max_output_tokens": 100, "top_k": 40.0, "response_logprobs": true,
                "thinking_config": {"thinking_budget": 512}, "candidate_count": 2},
            "labels": {"team": "a"}});
        let same = upstream(Format::Gemini, Format::Gemini, &body);
        assert_eq!(same["safetySettings"], body["safety_settings"]);
        assert_eq!(
            same["generationConfig"],
            json!({"maxOutputTokens": 100, "topK": 40, "responseLogprobs": true,
                "thinkingConfig": {"thinking_budget": 512}})
        );
        assert!(same.get("generation_config").is_none() && same.get("labels").is_none());
        let chat = upstream(Format::Gemini, Format::OpenAiChat, &body);
        assert!(chat.get("safetySettings").is_none() && chat.get("responseLogprobs").is_none());
        assert_eq!(chat["reasoning_effort"], "low");
    }

    #[test]
    fn test_reasoning_maps_between_effort_budget_and_switch() {
        let chat = json!({"model": "x", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high",
            "max_completion_tokens": 30_000});
        let claude = upstream(Format::OpenAiChat, Format::Anthropic, &chat);
        assert_eq!(claude["thinking"], json!({"type": "enabled", "budget_tokens": 24_576}));
        let gemini = upstream(Format::OpenAiChat, Format::Gemini, &chat);
        assert_eq!(
            gemini["generationConfig"]["thinkingConfig"],
            json!({"thinkingBudget": 24_576, "includeThoughts": true})
        );
        assert_eq!(
            upstream(Format::OpenAiChat, Format::OpenAiResponses, &chat)["reasoning"],
            json!({"effort": "high"})
        );
        assert_eq!(
            upstream(Format::OpenAiChat, Format::Ollama, &chat)["think"],
            json!(true)
        );

        let claude = json!({"model": "x", "max_tokens": 1500, "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": 2048}});
        assert_eq!(
            upstream(Format::Anthropic, Format::OpenAiChat, &claude)["reasoning_effort"],
            "low"
        );
        assert_eq!(
            upstream(Format::Anthropic, Format::Gemini, &claude)["generationConfig"]["thinkingConfig"]
                ["thinkingBudget"],
            2048
        );
        // A budget from another format stays under max_tokens, and is dropped below Anthropic's floor.
        let chat_small =
            json!({"model": "x", "messages": [], "reasoning_effort": "medium", "max_completion_tokens": 4000});
        assert_eq!(
            upstream(Format::OpenAiChat, Format::Anthropic, &chat_small)["thinking"]["budget_tokens"],
            3999
        );
        let chat_tiny =
            json!({"model": "x", "messages": [], "reasoning_effort": "medium", "max_completion_tokens": 1000});
        assert!(upstream(Format::OpenAiChat, Format::Anthropic, &chat_tiny)
            .get("thinking")
            .is_none());

        let off = json!({"contents": [], "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}});
        assert_eq!(
            upstream(Format::Gemini, Format::Anthropic, &off)["thinking"],
            json!({"type": "disabled"})
        );
        assert_eq!(upstream(Format::Gemini, Format::Ollama, &off)["think"], json!(false));
        assert!(upstream(Format::Gemini, Format::OpenAiChat, &off)
            .get("reasoning_effort")
            .is_none());
        let auto = json!({"model": "x", "messages": [], "think": true});
        assert_eq!(
            upstream(Format::Ollama, Format::Gemini, &auto)["generationConfig"]["thinkingConfig"]["thinkingBudget"],
            -1
        );
        let adaptive = json!({"model": "x", "max_tokens": 100, "messages": [], "thinking": {"type": "adaptive"},
            "output_config": {"effort": "low"}});
        assert_eq!(
            upstream(Format::Anthropic, Format::OpenAiResponses, &adaptive)["reasoning"],
            json!({"effort": "low"})
        );
    }

    #[test]
    fn test_json_output_maps_where_the_target_has_it() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let chat = json!({"model": "x", "messages": [], "response_format": {"type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": true}}});
        let gemini = upstream(Format::OpenAiChat, Format::Gemini, &chat);
        assert_eq!(gemini["generationConfig"]["responseMimeType"], "application/json");
        assert_eq!(gemini["generationConfig"]["responseJsonSchema"], schema);
        let claude = upstream(Format::OpenAiChat, Format::Anthropic, &chat);
        assert_eq!(
            claude["output_config"],
            json!({"format": {"type": "json_schema", "schema": schema}})
        );
        assert_eq!(upstream(Format::OpenAiChat, Format::Ollama, &chat)["format"], schema);
        assert_eq!(
            upstream(Format::OpenAiChat, Format::OpenAiResponses, &chat)["text"],
            json!({"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}})
        );
        let gemini = json!({"contents": [], "generationConfig": {"responseMimeType": "application/json",
            "responseJsonSchema": schema}});
        let back = upstream(Format::Gemini, Format::OpenAiChat, &gemini);
        assert_eq!(
            back["response_format"]["json_schema"],
            json!({"name": "response", "schema": schema})
        );

        let mode = json!({"model": "x", "messages": [], "format": "json"});
        assert_eq!(
            upstream(Format::Ollama, Format::OpenAiChat, &mode)["response_format"],
            json!({"type": "json_object"})
        );
        assert_eq!(
            upstream(Format::Ollama, Format::Gemini, &mode)["generationConfig"],
            json!({"responseMimeType": "application/json"})
        );
        // Anthropic needs a schema: schemaless JSON is a documented loss.
        assert!(upstream(Format::Ollama, Format::Anthropic, &mode)
            .get("output_config")
            .is_none());
    }

    #[test]
    fn test_sampling_fields_map_where_the_target_has_them() {
        let claude = json!({"model": "x", "max_tokens": 10, "messages": [], "top_k": 5,
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}});
        assert_eq!(
            upstream(Format::Anthropic, Format::Gemini, &claude)["generationConfig"]["topK"],
            5
        );
        assert_eq!(
            upstream(Format::Anthropic, Format::Ollama, &claude)["options"]["top_k"],
            5
        );
        let chat = upstream(Format::Anthropic, Format::OpenAiChat, &claude);
        assert!(chat.get("top_k").is_none());
        assert_eq!(chat["parallel_tool_calls"], false);
        let same = upstream(Format::Anthropic, Format::Anthropic, &claude);
        assert_eq!(
            (same["top_k"].clone(), same["tool_choice"].clone()),
            (json!(5), claude["tool_choice"].clone())
        );

        let chat = json!({"model": "x", "messages": [], "seed": 7, "presence_penalty": 0.5, "frequency_penalty": -0.25,
            "parallel_tool_calls": false, "tools": [{"type": "function", "function": {"name": "f"}}]});
        let ollama = upstream(Format::OpenAiChat, Format::Ollama, &chat);
        assert_eq!(
            ollama["options"],
            json!({"seed": 7, "presence_penalty": 0.5, "frequency_penalty": -0.25})
        );
        let gemini = upstream(Format::OpenAiChat, Format::Gemini, &chat);
        assert_eq!(
            gemini["generationConfig"],
            json!({"seed": 7, "presencePenalty": 0.5, "frequencyPenalty": -0.25})
        );
        let claude = upstream(Format::OpenAiChat, Format::Anthropic, &chat);
        assert_eq!(
            claude["tool_choice"],
            json!({"type": "auto", "disable_parallel_tool_use": true})
        );
    }

    #[test]
    fn test_effort_and_budget_convert_both_ways_within_the_common_levels() {
        for effort in [Effort::Low, Effort::Medium, Effort::High] {
            assert_eq!(Effort::from_budget(effort.budget_tokens()), effort);
            assert_eq!(Effort::parse(&effort.as_str().to_uppercase()), Some(effort));
        }
        assert_eq!(Effort::from_budget(100), Effort::Low);
        assert_eq!(Effort::from_budget(1_000_000), Effort::High);
        assert_eq!(Reasoning::Auto.budget_tokens(), Some(Effort::Medium.budget_tokens()));
        assert_eq!((Reasoning::Off.effort(), Reasoning::Off.budget_tokens()), (None, None));
    }

    #[test]
    fn test_governed_fields_are_not_passthrough() {
        for format in Format::ALL {
            let known = known_fields(format);
            for governed in [
                "model",
                "stream",
                "stream_options",
                "max_tokens",
                "max_completion_tokens",
                "max_output_tokens",
                "generationConfig.maxOutputTokens",
                "options.num_predict",
                "n",
                "service_tier",
                "user",
                "metadata",
                "safety_identifier",
            ] {
                assert!(
                    !known.passthrough.iter().any(|p| p == governed),
                    "{format:?}: {governed}"
                );
            }
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
