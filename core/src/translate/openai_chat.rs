//! OpenAI Chat Completions (`/v1/chat/completions`) ↔ IR.
//!
//! Losses: `is_error` of tool results, thinking signatures (Chat has no field; DeepSeek-style
//! `reasoning_content` carries the text), cache-write token counts, `StopSequence` (sent as
//! `stop`). A system message in the middle of the conversation joins the system prompt.
//!
//! Request fields: `reasoning_effort` maps to [`Reasoning`] (a thinking budget from another
//! format becomes the nearest level; reasoning turned off or left to the model is not sent, as
//! non-reasoning models refuse the field), `response_format` to [`OutputFormat`]; `top_k` from
//! another format is lost (Chat has none). [`PASSTHROUGH`] fields reach OpenAI-format upstreams
//! only. Ignored: caller identity, OpenAI-side storage, `service_tier`, `n` (the reservation
//! covers one choice), audio output (`modalities`, `audio`: neither metered nor translated),
//! `web_search_options` (web search is the proxy route's governed flag) and the deprecated
//! `functions`/`function_call`.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::stream::{BlockKind, Delta, Event};
use super::wire::{self, array, count, object, opt_f64, opt_str, opt_u64, req_str, Drift};
use super::{decode_call_id, encode_call_id, Block, Decoded, Message, Request, Response, Role, StopReason};
use super::{Effort, OutputFormat, Reasoning, ToolCall, ToolChoice, ToolResult, Usage};
use crate::json::write_str;
use crate::websearch::{self as ws, Search};

/// Top-level request fields this codec maps into the IR.
pub(crate) const MAPPED: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "stream",
    "stream_options",
    "reasoning_effort",
    "response_format",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "parallel_tool_calls",
];

/// Fields the IR does not model, carried verbatim to an upstream of this format.
pub(crate) const PASSTHROUGH: &[&str] = &[
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "prediction",
    "verbosity",
    "prompt_cache_retention",
    "prompt_cache_options",
    "moderation",
];

/// Mapped fields whose mapping is approximate: the same format gets the caller's value.
const KEPT: &[&str] = &["reasoning_effort", "response_format"];

/// Fields known and deliberately not carried (see the module docs; API.md: meshfast sends no
/// caller identity upstream).
pub(crate) const IGNORED: &[&str] = &[
    "user",
    "metadata",
    "safety_identifier",
    "store",
    "service_tier",
    "prompt_cache_key",
    "n",
    "modalities",
    "audio",
    "web_search_options",
    "functions",
    "function_call",
];

pub(crate) fn decode_request(value: &Value) -> Result<Decoded<Request>, String> {
    let body = object(value, "body")?;
    let mut drift = Drift::default();
    drift.check("", body, &[MAPPED, PASSTHROUGH, IGNORED].concat());
    let mut request = Request {
        model: opt_str(body, "model")?.unwrap_or_default().to_owned(),
        max_tokens: opt_u64(body, "max_completion_tokens")?.or(opt_u64(body, "max_tokens")?),
        temperature: opt_f64(body, "temperature")?,
        top_p: opt_f64(body, "top_p")?,
        stop: wire::stop_list(body.get("stop"))?,
        stream: wire::flag(body, "stream")?,
        seed: wire::opt_i64(body, "seed")?,
        presence_penalty: opt_f64(body, "presence_penalty")?,
        frequency_penalty: opt_f64(body, "frequency_penalty")?,
        parallel_tool_calls: wire::opt_bool(body, "parallel_tool_calls")?,
        reasoning: opt_str(body, "reasoning_effort")?.and_then(decode_effort),
        output_format: body.get("response_format").and_then(decode_response_format),
        ..Request::default()
    };
    wire::keep(body, &[PASSTHROUGH, KEPT].concat(), &mut request.passthrough);
    if let Some(options) = body.get("stream_options").filter(|v| !v.is_null()) {
        let options = object(options, "stream_options")?;
        drift.check("stream_options", options, &["include_usage", "include_obfuscation"]);
        request.include_usage = wire::flag(options, "include_usage")?;
    }
    for message in array(body.get("messages").unwrap_or(&Value::Null), "messages")? {
        decode_message(message, &mut request, &mut drift)?;
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        for tool in array(tools, "tools")? {
            request.tools.push(wire::function_tool(tool, &mut drift, "tools[]")?);
        }
    }
    request.tool_choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(choice) => Some(decode_tool_choice(choice)?),
    };
    Ok(Decoded {
        value: request,
        unknown: drift.unknown,
    })
}

/// `reasoning_effort`; a level the IR does not know is kept for the same format only.
fn decode_effort(effort: &str) -> Option<Reasoning> {
    match effort {
        "none" => Some(Reasoning::Off),
        other => Effort::parse(other).map(Reasoning::Effort),
    }
}

/// `response_format`; `text` (the default) and unknown types are no constraint.
fn decode_response_format(format: &Value) -> Option<OutputFormat> {
    match format.get("type")?.as_str()? {
        "json_object" => Some(OutputFormat::Json),
        "json_schema" => {
            let spec = format.get("json_schema")?;
            Some(OutputFormat::JsonSchema {
                name: spec.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                schema: spec.get("schema").cloned().unwrap_or_else(wire::empty_schema),
                strict: spec.get("strict").and_then(Value::as_bool),
            })
        }
        _ => None,
    }
}

fn encode_response_format(format: &OutputFormat) -> Value {
    match format {
        OutputFormat::Json => json!({"type": "json_object"}),
        OutputFormat::JsonSchema { name, schema, strict } => {
            let mut spec = json!({"name": wire::schema_name(name), "schema": schema});
            if let Some(strict) = strict {
                spec["strict"] = json!(strict);
            }
            json!({"type": "json_schema", "json_schema": spec})
        }
    }
}

fn decode_tool_choice(choice: &Value) -> Result<ToolChoice, String> {
    Ok(match choice {
        Value::String(s) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => return Err(format!("unknown tool_choice {other:?}")),
        },
        Value::Object(map) => {
            let function = object(map.get("function").unwrap_or(&Value::Null), "tool_choice.function")?;
            ToolChoice::Tool(req_str(function, "name")?.to_owned())
        }
        _ => return Err("tool_choice is not a string or an object".to_owned()),
    })
}

fn decode_message(value: &Value, request: &mut Request, drift: &mut Drift) -> Result<(), String> {
    let message = object(value, "message")?;
    drift.check(
        "messages[]",
        message,
        &[
            "role",
            "content",
            "name",
            "tool_calls",
            "tool_call_id",
            "reasoning_content",
            "refusal",
        ],
    );
    let content = message.get("content").unwrap_or(&Value::Null);
    match req_str(message, "role")? {
        "system" | "developer" => request.system.extend(text_parts(content, drift)?),
        "user" => {
            let blocks = user_parts(content, drift)?;
            request.messages.push(Message {
                role: Role::User,
                content: blocks,
            });
        }
        "assistant" => {
            let mut blocks = Vec::new();
            if let Some(reasoning) = opt_str(message, "reasoning_content")?.filter(|s| !s.is_empty()) {
                blocks.push(Block::Thinking {
                    text: reasoning.to_owned(),
                    signature: None,
                });
            }
            blocks.extend(text_parts(content, drift)?.into_iter().map(Block::Text));
            if let Some(calls) = message.get("tool_calls").filter(|v| !v.is_null()) {
                for call in array(calls, "tool_calls")? {
                    blocks.push(Block::ToolCall(decode_tool_call(call, drift)?));
                }
            }
            request.messages.push(Message {
                role: Role::Assistant,
                content: blocks,
            });
        }
        "tool" => {
            let result = ToolResult {
                id: req_str(message, "tool_call_id")?.to_owned(),
                name: String::new(),
                content: text_parts(content, drift)?.concat(),
                is_error: false,
            };
            let (id, _) = decode_call_id(&result.id);
            let result = ToolResult { id, ..result };
            // NOTE: consecutive tool messages answer one assistant turn; they become one user
            // message, as the other formats carry them.
            match request.messages.last_mut() {
                Some(last)
                    if last.role == Role::User && last.content.iter().all(|b| matches!(b, Block::ToolResult(_))) =>
                {
                    last.content.push(Block::ToolResult(result));
                }
                _ => request.messages.push(Message {
                    role: Role::User,
                    content: vec![Block::ToolResult(result)],
                }),
            }
        }
        other => return Err(format!("unknown message role {other:?}")),
    }
    Ok(())
}

fn decode_tool_call(value: &Value, drift: &mut Drift) -> Result<ToolCall, String> {
    let call = object(value, "tool call")?;
    drift.check(
        "messages[].tool_calls[]",
        call,
        &["id", "type", "function", "extra_content"],
    );
    let function = object(call.get("function").unwrap_or(&Value::Null), "tool call function")?;
    let (id, mut signature) = decode_call_id(req_str(call, "id")?);
    if let Some(extra) = extra_signature(call) {
        signature = Some(extra);
    }
    Ok(ToolCall {
        id,
        name: req_str(function, "name")?.to_owned(),
        arguments: opt_str(function, "arguments")?.unwrap_or_default().to_owned(),
        signature,
    })
}

/// Gemini's signature in its OpenAI-compatible extension field.
fn extra_signature(call: &Map<String, Value>) -> Option<String> {
    call.get("extra_content")?
        .get("google")?
        .get("thought_signature")?
        .as_str()
        .map(str::to_owned)
}

/// Text of a `content` that is a string or a list of text parts.
fn text_parts(content: &Value, drift: &mut Drift) -> Result<Vec<String>, String> {
    Ok(match content {
        Value::Null => Vec::new(),
        Value::String(s) => vec![s.clone()],
        Value::Array(parts) => {
            let mut texts = Vec::new();
            for part in parts {
                let part = object(part, "content part")?;
                match req_str(part, "type")? {
                    "text" => texts.push(req_str(part, "text")?.to_owned()),
                    "refusal" => texts.push(req_str(part, "refusal")?.to_owned()),
                    other => drift.note(format!("messages[].content[].type={other}")),
                }
            }
            texts
        }
        _ => return Err("content is not a string or a list".to_owned()),
    })
}

fn user_parts(content: &Value, drift: &mut Drift) -> Result<Vec<Block>, String> {
    let Value::Array(parts) = content else {
        return Ok(text_parts(content, drift)?.into_iter().map(Block::Text).collect());
    };
    let mut blocks = Vec::new();
    for part in parts {
        let map = object(part, "content part")?;
        match req_str(map, "type")? {
            "text" => blocks.push(Block::Text(req_str(map, "text")?.to_owned())),
            "image_url" => {
                let image = object(map.get("image_url").unwrap_or(&Value::Null), "image_url")?;
                drift.check("messages[].content[].image_url", image, &["url", "detail"]);
                blocks.push(Block::Image(wire::image_from_url(req_str(image, "url")?)));
            }
            other => {
                drift.note(format!("messages[].content[].type={other}"));
            }
        }
    }
    Ok(blocks)
}

pub(crate) fn encode_request(request: &Request) -> Result<Value, String> {
    let mut messages: Vec<Value> = request
        .system
        .iter()
        .map(|text| json!({"role": "system", "content": text}))
        .collect();
    for message in &request.messages {
        encode_message(message, &mut messages, false);
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools = request.tools.iter().map(|tool| {
            let mut function = json!({"name": tool.name, "parameters": tool.parameters});
            if let Some(description) = &tool.description {
                function["description"] = json!(description);
            }
            json!({"type": "function", "function": function})
        });
        body.insert("tools".into(), Value::Array(tools.collect()));
    }
    if let Some(choice) = &request.tool_choice {
        body.insert(
            "tool_choice".into(),
            match choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
            },
        );
    }
    if let Some(max) = request.max_tokens {
        body.insert("max_completion_tokens".into(), json!(max));
    }
    insert_sampling(&mut body, request);
    if !request.stop.is_empty() {
        body.insert("stop".into(), json!(request.stop));
    }
    if let Some(seed) = request.seed {
        body.insert("seed".into(), json!(seed));
    }
    if let Some(penalty) = request.presence_penalty {
        body.insert("presence_penalty".into(), json!(penalty));
    }
    if let Some(penalty) = request.frequency_penalty {
        body.insert("frequency_penalty".into(), json!(penalty));
    }
    if let (Some(parallel), false) = (request.parallel_tool_calls, request.tools.is_empty()) {
        body.insert("parallel_tool_calls".into(), json!(parallel));
    }
    if let Some(effort) = request.reasoning.and_then(Reasoning::effort) {
        body.insert("reasoning_effort".into(), json!(effort.as_str()));
    }
    if let Some(format) = &request.output_format {
        body.insert("response_format".into(), encode_response_format(format));
    }
    if request.stream {
        body.insert("stream".into(), json!(true));
        if request.include_usage {
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    Ok(Value::Object(body))
}

fn insert_sampling(body: &mut Map<String, Value>, request: &Request) {
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        body.insert("top_p".into(), json!(p));
    }
}

/// Appends `message` as Chat messages: tool results become `tool` messages ahead of the rest.
/// `response` (a response to a client) writes Gemini signatures into the ids too, where
/// requests to an upstream carry them only in `extra_content`, and joins the text.
fn encode_message(message: &Message, out: &mut Vec<Value>, response: bool) {
    let mut parts = Vec::new();
    let mut texts = Vec::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for block in &message.content {
        match block {
            Block::Text(text) => {
                texts.push(text.clone());
                parts.push(json!({"type": "text", "text": text}));
            }
            Block::Image(image) => {
                parts.push(json!({"type": "image_url", "image_url": {"url": wire::image_to_url(image)}}))
            }
            Block::Thinking { text, .. } => reasoning.push_str(text),
            Block::RedactedThinking(_) => {}
            Block::ToolCall(call) => calls.push(encode_tool_call(call, response)),
            Block::ToolResult(result) => {
                out.push(json!({"role": "tool", "tool_call_id": result.id, "content": result.content}));
            }
        }
    }
    match message.role {
        Role::User => {
            let has_image = parts.len() != texts.len();
            if has_image || texts.len() > 1 {
                out.push(json!({"role": "user", "content": parts}));
            } else if let Some(text) = texts.pop() {
                out.push(json!({"role": "user", "content": text}));
            }
        }
        Role::Assistant => {
            let mut assistant = Map::new();
            assistant.insert("role".into(), json!("assistant"));
            // NOTE: a response's content is one string (the SDKs type it so); a request may
            // carry parts.
            let content = match texts.len() {
                0 => Value::Null,
                1 => json!(texts[0]),
                _ if response => json!(texts.concat()),
                _ => Value::Array(parts),
            };
            assistant.insert("content".into(), content);
            if !reasoning.is_empty() {
                assistant.insert("reasoning_content".into(), json!(reasoning));
            }
            if !calls.is_empty() {
                assistant.insert("tool_calls".into(), Value::Array(calls));
            }
            out.push(Value::Object(assistant));
        }
    }
}

fn encode_tool_call(call: &ToolCall, signed_id: bool) -> Value {
    let id = if signed_id {
        encode_call_id(&call.id, call.signature.as_deref())
    } else {
        call.id.clone()
    };
    let mut value = json!({"id": id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}});
    if let Some(signature) = &call.signature {
        value["extra_content"] = json!({"google": {"thought_signature": signature}});
    }
    value
}

pub(crate) fn decode_response(value: &Value) -> Result<Response, String> {
    let body = object(value, "body")?;
    let choices = array(body.get("choices").unwrap_or(&Value::Null), "choices")?;
    let choice = object(choices.first().ok_or("no choices")?, "choice")?;
    let message = object(choice.get("message").unwrap_or(&Value::Null), "message")?;
    let mut content = Vec::new();
    if let Some(reasoning) = opt_str(message, "reasoning_content")?.filter(|s| !s.is_empty()) {
        content.push(Block::Thinking {
            text: reasoning.to_owned(),
            signature: None,
        });
    }
    let mut ignored = Drift::default();
    let texts = text_parts(message.get("content").unwrap_or(&Value::Null), &mut ignored)?;
    content.extend(texts.into_iter().filter(|t| !t.is_empty()).map(Block::Text));
    if let Some(refusal) = opt_str(message, "refusal")? {
        content.push(Block::Text(refusal.to_owned()));
    }
    if let Some(calls) = message.get("tool_calls").filter(|v| !v.is_null()) {
        for call in array(calls, "tool_calls")? {
            content.push(Block::ToolCall(decode_tool_call(call, &mut ignored)?));
        }
    }
    Ok(Response {
        id: opt_str(body, "id")?.unwrap_or_default().to_owned(),
        model: opt_str(body, "model")?.unwrap_or_default().to_owned(),
        content,
        stop_reason: opt_str(choice, "finish_reason")?.map(decode_stop),
        usage: body
            .get("usage")
            .and_then(Value::as_object)
            .map(decode_usage)
            .unwrap_or_default(),
    })
}

fn decode_usage(usage: &Map<String, Value>) -> Usage {
    let details = usage.get("prompt_tokens_details").and_then(Value::as_object);
    let cached = count(details, "cached_tokens");
    Usage {
        input_tokens: count(Some(usage), "prompt_tokens").saturating_sub(cached),
        output_tokens: count(Some(usage), "completion_tokens"),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
        cache_write_1h_tokens: 0,
    }
}

fn encode_usage(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens(),
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.prompt_tokens() + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
    })
}

fn decode_stop(reason: &str) -> StopReason {
    match reason {
        "length" => StopReason::MaxTokens,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "content_filter" => StopReason::ContentFilter,
        _ => StopReason::EndTurn,
    }
}

fn encode_stop(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn | StopReason::StopSequence => "stop",
        StopReason::MaxTokens => "length",
        StopReason::ToolUse => "tool_calls",
        StopReason::ContentFilter => "content_filter",
    }
}

pub(crate) fn encode_response(response: &Response) -> Value {
    let mut messages = Vec::new();
    encode_message(
        &Message {
            role: Role::Assistant,
            content: response.content.clone(),
        },
        &mut messages,
        true,
    );
    let mut message = messages
        .pop()
        .unwrap_or_else(|| json!({"role": "assistant", "content": null}));
    message["refusal"] = Value::Null;
    json!({
        "id": response.id,
        "object": "chat.completion",
        "created": wire::now_unix(),
        "model": response.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": encode_stop(response.stop_reason.unwrap_or(StopReason::EndTurn)),
        }],
        "usage": encode_usage(&response.usage),
    })
}

/// Chat chunk decoding state.
#[derive(Debug, Default)]
pub(crate) struct StreamDecoder {
    started: bool,
    /// The open block: its IR index and whether it is text (else thinking or a tool call).
    open: Option<(usize, OpenKind)>,
    next_index: usize,
    /// Wire `tool_calls[].index` → IR block index.
    calls: Vec<(u64, usize)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpenKind {
    Text,
    Thinking,
    Call,
}

/// A chunk of the shape nearly every chunk of a chat stream has: text deltas and a finish reason,
/// with no usage, tool call or error. [`StreamDecoder::event`] reads it without building a
/// `Value` tree. A chunk that does not fit goes to [`StreamDecoder::event_value`], the
/// reference, which gives the same answer for every chunk this one reads (a property test holds
/// them together). Not fitting means a field of another type, a duplicate key, any of the three,
/// or what [`fast_candidate`] turns away.
#[derive(serde::Deserialize)]
struct FastChunk<'a> {
    #[serde(borrow, default)]
    id: Option<Text<'a>>,
    #[serde(borrow, default)]
    model: Option<Text<'a>>,
    #[serde(borrow, default)]
    choices: Option<Vec<Obj<FastChoice<'a>>>>,
    #[serde(default)]
    usage: Option<IgnoredAny>,
    // NOTE: an `error` key is an error event even when null, which an `Option` cannot tell
    // from its absence.
    #[serde(default, deserialize_with = "present")]
    error: bool,
}

#[derive(serde::Deserialize)]
struct FastChoice<'a> {
    #[serde(borrow, default)]
    delta: Option<Obj<FastDelta<'a>>>,
    #[serde(borrow, default)]
    finish_reason: Option<Text<'a>>,
}

#[derive(serde::Deserialize)]
struct FastDelta<'a> {
    #[serde(borrow, default)]
    reasoning_content: Option<Text<'a>>,
    #[serde(borrow, default)]
    content: Option<Text<'a>>,
    #[serde(borrow, default)]
    refusal: Option<Text<'a>>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
}

/// A string field, borrowed from the chunk when it holds no escape.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Cow<'de, str>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v))
            }
        }
        deserializer.deserialize_str(Visit).map(Text)
    }
}

/// A struct read only from a JSON object: a derived struct also takes an array (its fields in
/// order), which the reference refuses.
struct Obj<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Obj<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData)).map(Obj)
    }
}

fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(deserializer).map(|_| true)
}

/// Whether a chunk may take the fast path. The fields it does not read are skipped unchecked
/// (serde's `IgnoredAny`), where the reference parses them whole and refuses the chunk for what
/// skipping lets through: an escape that is not a character (a lone surrogate), a number out of
/// range, nesting past its limit. A chunk with any `\u` escape, an exponent or a run of 300
/// digits, or more than 100 brackets, takes the reference.
fn fast_candidate(data: &str) -> bool {
    let bytes = data.as_bytes();
    let exponent = |i: usize| i > 0 && (bytes[i - 1].is_ascii_digit() || bytes[i - 1] == b'.');
    memchr::memmem::find(bytes, b"\\u").is_none()
        && !memchr::memchr2_iter(b'e', b'E', bytes).any(exponent)
        && (bytes.len() <= 100 || memchr::memchr2_iter(b'{', b'[', bytes).nth(100).is_none())
        && (bytes.len() < 300 || !bytes.split(|b| !b.is_ascii_digit()).any(|run| run.len() >= 300))
}

/// The chunk as a [`FastChunk`], when it is one the fast path reads (else the reference does).
fn fast_parse(data: &str) -> Option<FastChunk<'_>> {
    if !fast_candidate(data) {
        return None;
    }
    let Obj(chunk) = serde_json::from_str::<Obj<FastChunk<'_>>>(data).ok()?;
    let plain = !chunk.error
        && chunk.usage.is_none()
        && chunk
            .choices
            .iter()
            .flatten()
            .all(|c| c.0.delta.as_ref().is_none_or(|d| d.0.tool_calls.is_none()));
    plain.then_some(chunk)
}

impl StreamDecoder {
    pub(crate) fn event(&mut self, data: &str, out: &mut Vec<Event>) -> Result<(), String> {
        if data.trim() == "[DONE]" {
            self.close(out);
            out.push(Event::End);
            return Ok(());
        }
        if let Some(chunk) = fast_parse(data) {
            self.fast(chunk, out);
            return Ok(());
        }
        self.event_value(data, out)
    }

    /// [`FastChunk`]'s events: what [`Self::event_value`] makes of the same chunk.
    fn fast(&mut self, chunk: FastChunk<'_>, out: &mut Vec<Event>) {
        if !self.started {
            self.started = true;
            out.push(Event::Start {
                id: chunk.id.map(|t| t.0.into_owned()).unwrap_or_default(),
                model: chunk.model.map(|t| t.0.into_owned()).unwrap_or_default(),
            });
        }
        let Some(Obj(choice)) = chunk.choices.and_then(|c| c.into_iter().next()) else {
            return;
        };
        if let Some(Obj(delta)) = choice.delta {
            if let Some(Text(text)) = delta.reasoning_content.filter(|s| !s.0.is_empty()) {
                let index = self.ensure(OpenKind::Thinking, out);
                out.push(Event::Delta {
                    index,
                    delta: Delta::Thinking(text.into_owned()),
                });
            }
            for Text(text) in [delta.content, delta.refusal].into_iter().flatten() {
                if !text.is_empty() {
                    let index = self.ensure(OpenKind::Text, out);
                    out.push(Event::Delta {
                        index,
                        delta: Delta::Text(text.into_owned()),
                    });
                }
            }
        }
        if let Some(Text(reason)) = choice.finish_reason {
            self.close(out);
            out.push(Event::Finish(decode_stop(&reason)));
        }
    }

    /// Any chunk, read as a `Value` tree: the reference for [`Self::fast`].
    pub(crate) fn event_value(&mut self, data: &str, out: &mut Vec<Event>) -> Result<(), String> {
        let chunk: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
        let chunk = object(&chunk, "chunk")?;
        if let Some(error) = chunk.get("error") {
            out.push(Event::Error(error.to_string()));
            return Ok(());
        }
        if !self.started {
            self.started = true;
            out.push(Event::Start {
                id: opt_str(chunk, "id")?.unwrap_or_default().to_owned(),
                model: opt_str(chunk, "model")?.unwrap_or_default().to_owned(),
            });
        }
        if let Some(choice) = chunk.get("choices").and_then(Value::as_array).and_then(|c| c.first()) {
            let choice = object(choice, "choice")?;
            if let Some(delta) = choice.get("delta").and_then(Value::as_object) {
                self.delta(delta, out)?;
            }
            if let Some(reason) = opt_str(choice, "finish_reason")? {
                self.close(out);
                out.push(Event::Finish(decode_stop(reason)));
            }
        }
        if let Some(usage) = chunk.get("usage").and_then(Value::as_object) {
            out.push(Event::Usage(decode_usage(usage)));
        }
        Ok(())
    }

    fn delta(&mut self, delta: &Map<String, Value>, out: &mut Vec<Event>) -> Result<(), String> {
        if let Some(text) = opt_str(delta, "reasoning_content")?.filter(|s| !s.is_empty()) {
            let index = self.ensure(OpenKind::Thinking, out);
            out.push(Event::Delta {
                index,
                delta: Delta::Thinking(text.to_owned()),
            });
        }
        // NOTE: a refusal is the answer's text, as the non-streamed decoder reads it.
        for key in ["content", "refusal"] {
            if let Some(text) = opt_str(delta, key)?.filter(|s| !s.is_empty()) {
                let index = self.ensure(OpenKind::Text, out);
                out.push(Event::Delta {
                    index,
                    delta: Delta::Text(text.to_owned()),
                });
            }
        }
        let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) else {
            return Ok(());
        };
        for call in calls {
            let call = object(call, "tool call delta")?;
            let wire_index = opt_u64(call, "index")?.unwrap_or(0);
            let function = call.get("function").and_then(Value::as_object);
            let known = self.calls.iter().find(|(w, _)| *w == wire_index).map(|&(_, i)| i);
            let index = match known {
                Some(index) => index,
                None => {
                    self.close(out);
                    let index = self.next_index;
                    self.next_index += 1;
                    self.calls.push((wire_index, index));
                    self.open = Some((index, OpenKind::Call));
                    let (id, mut signature) = decode_call_id(opt_str(call, "id")?.unwrap_or_default());
                    if let Some(extra) = extra_signature(call) {
                        signature = Some(extra);
                    }
                    let name = function
                        .map(|f| opt_str(f, "name"))
                        .transpose()?
                        .flatten()
                        .unwrap_or_default();
                    out.push(Event::BlockStart {
                        index,
                        block: BlockKind::ToolCall {
                            id,
                            name: name.to_owned(),
                            signature,
                        },
                    });
                    index
                }
            };
            // NOTE: a delta for an earlier call (providers that interleave parallel calls) keeps
            // its own index; the single-open-block rule holds for the usual sequential order.
            if let Some(arguments) = function
                .map(|f| opt_str(f, "arguments"))
                .transpose()?
                .flatten()
                .filter(|s| !s.is_empty())
            {
                out.push(Event::Delta {
                    index,
                    delta: Delta::Arguments(arguments.to_owned()),
                });
            }
        }
        Ok(())
    }

    fn ensure(&mut self, kind: OpenKind, out: &mut Vec<Event>) -> usize {
        if let Some((index, open)) = self.open {
            if open == kind {
                return index;
            }
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, kind));
        let block = if kind == OpenKind::Text {
            BlockKind::Text
        } else {
            BlockKind::Thinking
        };
        out.push(Event::BlockStart { index, block });
        index
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        if let Some((index, _)) = self.open.take() {
            out.push(Event::BlockStop { index });
        }
    }
}

/// Chat chunk encoding state.
#[derive(Debug)]
pub(crate) struct StreamEncoder {
    include_usage: bool,
    id: String,
    model: String,
    created: u64,
    /// IR block index → `tool_calls[].index` for tool-call blocks.
    calls: Vec<(usize, usize)>,
    usage: Option<Usage>,
}

impl StreamEncoder {
    pub(crate) fn new(include_usage: bool) -> Self {
        Self {
            include_usage,
            id: String::new(),
            model: String::new(),
            created: 0,
            calls: Vec::new(),
            usage: None,
        }
    }

    fn chunk(&self, out: &mut Vec<u8>, delta: Value, finish: Option<&str>) {
        let data = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        super::stream::write_sse(out, "", &data);
    }

    pub(crate) fn encode(&mut self, event: &Event, out: &mut Vec<u8>) {
        match event {
            Event::Start { id, model } => {
                self.id.clone_from(id);
                self.model.clone_from(model);
                self.created = wire::now_unix();
                self.chunk(out, json!({"role": "assistant", "content": ""}), None);
            }
            Event::BlockStart {
                index,
                block: BlockKind::ToolCall { id, name, signature },
            } => {
                let wire_index = self.calls.len();
                self.calls.push((*index, wire_index));
                let call = ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                    signature: signature.clone(),
                };
                let mut value = encode_tool_call(&call, true);
                value["index"] = json!(wire_index);
                self.chunk(out, json!({"tool_calls": [value]}), None);
            }
            Event::Delta { index, delta } => match delta {
                Delta::Text(text) => self.chunk(out, json!({"content": text}), None),
                Delta::Thinking(text) => self.chunk(out, json!({"reasoning_content": text}), None),
                Delta::Arguments(arguments) => {
                    let Some(&(_, wire_index)) = self.calls.iter().find(|(i, _)| i == index) else {
                        return;
                    };
                    self.chunk(
                        out,
                        json!({"tool_calls": [{"index": wire_index, "function": {"arguments": arguments}}]}),
                        None,
                    );
                }
                Delta::Signature(_) => {}
            },
            Event::Usage(usage) => self.usage.get_or_insert_with(Usage::default).merge(usage),
            Event::Finish(reason) => self.chunk(out, json!({}), Some(encode_stop(*reason))),
            // NOTE: a web search's pages have no event in this format (only Mesh NDJSON streams them).
            Event::Sources(_) => {}
            Event::End => {
                if let (true, Some(usage)) = (self.include_usage, &self.usage) {
                    let data = json!({
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": encode_usage(usage),
                    });
                    super::stream::write_sse(out, "", &data);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            Event::Error(message) => {
                let error = json!({"error": {"message": message, "type": "server_error", "param": null, "code": crate::outcome::Outcome::UpstreamIncomplete.code()}});
                super::stream::write_sse(out, "", &error);
            }
            Event::BlockStart { .. } | Event::BlockStop { .. } => {}
        }
    }
}

// --- web search (mesh-behaviour §4.5) ---------------------------------------------------------

/// A `url_citation` annotation, its fields flat or nested under `url_citation`.
pub(crate) fn url_citation(search: &mut Search, annotation: &Value) {
    if !ws::is_type(annotation, "url_citation") {
        return;
    }
    let fields = annotation
        .get("url_citation")
        .filter(|n| n.is_object())
        .unwrap_or(annotation);
    search.cite(ws::text(fields, "url"), ws::text(fields, "title"), "", "");
}

/// Reads one upstream event's web search (mesh-behaviour §4.5): `url_citation` annotations of
/// a choice's delta, or else of its message.
pub(crate) fn observe_search(search: &mut Search, event: &Value) {
    for choice in ws::array(Some(event), "choices") {
        let annotations = |key: &str| {
            choice
                .get(key)
                .and_then(|m| m.get("annotations"))
                .and_then(Value::as_array)
        };
        for annotation in annotations("delta")
            .or_else(|| annotations("message"))
            .map_or(&[][..], Vec::as_slice)
        {
            url_citation(search, annotation);
        }
    }
}

// --- errors in this API's shape (API.md "Standard routes") ------------------------------------

/// The error `type` the OpenAI SDKs map `status` to.
fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500.. => "api_error",
        _ => "invalid_request_error",
    }
}

/// `{"error": {message, type, param, code, detectors?}}`: the OpenAI SDKs raise their usual
/// exception for `status`; the Mesh `code` is the error's `code`.
pub(crate) fn write_error(out: &mut Vec<u8>, status: u16, code: &str, message: &str, detectors: &[String]) {
    out.extend_from_slice(b"{\"error\":{\"message\":");
    write_str(out, message);
    out.extend_from_slice(b",\"type\":");
    write_str(out, error_type(status));
    out.extend_from_slice(b",\"param\":null,\"code\":");
    write_str(out, code);
    wire::write_detectors(out, detectors);
    out.extend_from_slice(b"}}");
}

#[cfg(test)]
mod tests {
    use super::super::{decode_request, decode_response, encode_request, Format, Image, Tool};
    use super::*;

    mod fast_chunks {
        use super::*;
        use proptest::prelude::*;

        /// A JSON value for a field: absent (None), null, a string (with escapes and non-ASCII
        /// now and then), or something of another type.
        fn field() -> impl Strategy<Value = Option<String>> {
            prop_oneof![
                3 => Just(None),
                1 => Just(Some("null".to_owned())),
                4 => "[a-z \\\\\"é\u{1F600}]{0,6}".prop_map(|t| Some(serde_json::to_string(&t).unwrap())),
                1 => Just(Some(r#""\ud83d\ude00 a\nb""#.to_owned())),
                1 => Just(Some(r#""\ud800""#.to_owned())),
                1 => prop_oneof![Just("5"), Just("[]"), Just("{}"), Just("true"), Just("[{}]")].prop_map(|v| Some(v.to_owned())),
            ]
        }

        fn reason() -> impl Strategy<Value = Option<String>> {
            prop_oneof![
                3 => Just(None),
                1 => Just(Some("null".to_owned())),
                2 => prop_oneof![Just("stop"), Just("length"), Just("tool_calls"), Just("content_filter"), Just("x")]
                    .prop_map(|r| Some(format!("\"{r}\""))),
                1 => Just(Some("7".to_owned())),
            ]
        }

        /// An unknown field the decoder does not read: usually plain, now and then something the
        /// reference refuses (a lone surrogate, a number out of range, nesting past its limit)
        /// or accepts only just (an exponent, an escaped key naming a known field).
        fn unknown() -> impl Strategy<Value = String> {
            prop_oneof![
                8 => Just(r#""role":"assistant""#.to_owned()),
                2 => Just(r#""logprobs":null,"index":0,"created":1700000000"#.to_owned()),
                1 => Just(r#""x":"\ud800""#.to_owned()),
                1 => Just(r#""x":{"\udc00":1}"#.to_owned()),
                1 => Just(r#""x":1e400"#.to_owned()),
                1 => Just(r#""x":1.5E3"#.to_owned()),
                1 => Just(format!(r#""x":{}"#, "9".repeat(400))),
                1 => Just(format!(r#""x":{}{}"#, "[".repeat(130), "]".repeat(130))),
                1 => Just(format!(r#""x":{}{}"#, "[".repeat(60), "]".repeat(60))),
                1 => Just(r#""\u0065rror":{"message":"overloaded"}"#.to_owned()),
                1 => Just(r#""erro\u0072":null"#.to_owned()),
                1 => Just(r#""c\u006fntent":"hi""#.to_owned()),
                1 => Just(r#""x":"caf\u00e9""#.to_owned()),
            ]
        }

        fn object(fields: Vec<(&'static str, Option<String>)>, extra: Option<String>, duplicate: bool) -> String {
            let mut parts: Vec<String> = fields
                .iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| format!("\"{k}\":{v}")))
                .collect();
            if let Some(extra) = extra {
                parts.push(extra);
            }
            if duplicate {
                if let Some(first) = parts.first().cloned() {
                    parts.push(first);
                }
            }
            format!("{{{}}}", parts.join(","))
        }

        fn delta() -> impl Strategy<Value = Option<String>> {
            let tool_calls = prop_oneof![
                4 => Just(None),
                1 => Just(Some("null".to_owned())),
                1 => Just(Some(r#"[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{}"}}]"#.to_owned())),
            ];
            let body = (
                field(),
                field(),
                field(),
                tool_calls,
                prop::option::weighted(0.5, unknown()),
                prop::bool::weighted(0.05),
            )
                .prop_map(|(reasoning, content, refusal, tools, extra, duplicate)| {
                    object(
                        vec![
                            ("reasoning_content", reasoning),
                            ("content", content),
                            ("refusal", refusal),
                            ("tool_calls", tools),
                        ],
                        extra,
                        duplicate,
                    )
                });
            prop_oneof![
                1 => Just(None),
                1 => Just(Some("null".to_owned())),
                1 => Just(Some("\"x\"".to_owned())),
                1 => Just(Some(r#"[null,"hi"]"#.to_owned())),
                8 => body.prop_map(Some),
            ]
        }

        fn choice() -> impl Strategy<Value = String> {
            prop_oneof![
                8 => (delta(), reason(), prop::option::weighted(0.3, unknown()), prop::bool::weighted(0.05))
                    .prop_map(|(d, r, extra, dup)| object(vec![("delta", d), ("finish_reason", r)], extra, dup)),
                1 => Just("5".to_owned()),
                1 => Just(r#"[null,"stop"]"#.to_owned()),
                1 => Just("null".to_owned()),
            ]
        }

        fn chunk() -> impl Strategy<Value = String> {
            let choices = prop_oneof![
                1 => Just(None),
                1 => Just(Some("null".to_owned())),
                1 => Just(Some("{}".to_owned())),
                8 => proptest::collection::vec(choice(), 0..3).prop_map(|c| Some(format!("[{}]", c.join(",")))),
            ];
            let usage = prop_oneof![
                6 => Just(None),
                2 => Just(Some("null".to_owned())),
                2 => Just(Some(r#"{"prompt_tokens":8,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}"#.to_owned())),
                1 => Just(Some("3".to_owned())),
            ];
            let error = prop_oneof![8 => Just(None), 1 => Just(Some("null".to_owned())), 1 => Just(Some(r#"{"message":"boom"}"#.to_owned()))];
            let object_chunk = (
                field(),
                field(),
                choices,
                usage,
                error,
                prop::option::weighted(0.5, unknown()),
                prop::bool::weighted(0.05),
            )
                .prop_map(|(id, model, choices, usage, error, extra, dup)| {
                    object(
                        vec![
                            ("id", id),
                            ("model", model),
                            ("choices", choices),
                            ("usage", usage),
                            ("error", error),
                        ],
                        extra,
                        dup,
                    )
                });
            prop_oneof![
                20 => object_chunk,
                1 => Just("[]".to_owned()),
                1 => Just(r#"["c","m",[{"delta":{"content":"hi"}}]]"#.to_owned()),
                1 => Just("5".to_owned()),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            /// A stream of chunks decodes to the same events (and the same errors, at the same
            /// chunk) through the fast path as through the `Value` reference alone.
            #[test]
            fn prop_fast_chunks_match_the_value_reference(chunks in proptest::collection::vec(chunk(), 1..8), done in any::<bool>()) {
                let (mut fast, mut reference) = (StreamDecoder::default(), StreamDecoder::default());
                let (mut got, mut want) = (Vec::new(), Vec::new());
                for data in chunks.iter().map(String::as_str).chain(done.then_some("[DONE]")) {
                    let a = fast.event(data, &mut got);
                    let b = if data == "[DONE]" { reference.event(data, &mut want) } else { reference.event_value(data, &mut want) };
                    prop_assert_eq!(&a, &b, "chunk {}", data);
                    prop_assert_eq!(&got, &want, "chunk {}", data);
                }
            }
        }

        #[test]
        fn the_common_chunk_takes_the_fast_path_and_the_others_do_not() {
            let plain = r#"{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"delta":{"content":"Hi\n"},"logprobs":null,"finish_reason":null}],"usage":null}"#;
            let chunk = fast_parse(plain).expect("the common chunk takes the fast path");
            // Borrowed when it holds no escape.
            assert!(matches!(chunk.model, Some(Text(Cow::Borrowed("m")))));
            for other in [
                r#"{"id":"c","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4}}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#,
                r#"{"error":null}"#,
                r#"{"\u0065rror":{"message":"overloaded"}}"#,
                r#"{"choices":[{"delta":{"content":"hi"}}],"x":"\ud800"}"#,
                r#"{"x":1e400}"#,
                "[]",
                r#"{"choices":[[null,"stop"]]}"#,
                r#"{"choices":[{"delta":[null,"hi"]}]}"#,
                r#"{"id":"a","id":"b"}"#,
            ] {
                assert!(fast_parse(other).is_none(), "{other}");
            }
            let usage = r#"{"id":"c","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4}}"#;
            let (mut d, mut out) = (StreamDecoder::default(), Vec::new());
            d.event(plain, &mut out).unwrap();
            d.event(usage, &mut out).unwrap();
            d.event(r#"{"error":null}"#, &mut out).unwrap();
            assert!(matches!(out.last(), Some(Event::Error(e)) if e == "null"));
            assert!(out.iter().any(|e| matches!(e, Event::Usage(u) if u.output_tokens == 4)));
        }
    }

    /// A request as openai-python sends it for a tool-using, image-bearing conversation.
    const SDK_REQUEST: &str = r#"{
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "18C"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "tool_choice": "auto",
        "max_completion_tokens": 256,
        "temperature": 0.2,
        "stop": "END",
        "stream": true,
        "stream_options": {"include_usage": true},
        "user": "u-1",
        "seed": 7,
        "frequency_penalty": 0.5
    }"#;

    #[test]
    fn test_sdk_request_decodes_to_ir_and_classifies_every_field() {
        let decoded = decode_request(Format::OpenAiChat, SDK_REQUEST.as_bytes()).unwrap();
        assert!(decoded.unknown.is_empty(), "{:?}", decoded.unknown);
        let request = decoded.value;
        assert_eq!((request.seed, request.frequency_penalty), (Some(7), Some(0.5)));
        assert_eq!(request.system, ["You are terse."]);
        assert_eq!(request.max_tokens, Some(256));
        assert_eq!(request.stop, ["END"]);
        assert!(request.stream && request.include_usage);
        assert_eq!(request.tool_choice, Some(ToolChoice::Auto));
        assert_eq!(request.tools[0].name, "get_weather");
        assert_eq!(
            request.messages[0].content[1],
            Block::Image(Image::Base64 {
                media_type: "image/png".into(),
                data: "iVBORw0KGgo=".into()
            })
        );
        assert_eq!(
            request.messages[2].content,
            [Block::ToolResult(ToolResult {
                id: "call_abc".into(),
                name: "get_weather".into(),
                content: "18C".into(),
                is_error: false
            })]
        );
    }

    #[test]
    fn test_gemini_signature_rides_in_extra_content_upstream_and_in_the_id_downstream() {
        let call = ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: "{}".into(),
            signature: Some("sig/+=".into()),
        };
        let request = Request {
            messages: vec![Message {
                role: Role::Assistant,
                content: vec![Block::ToolCall(call.clone())],
            }],
            tools: vec![Tool {
                name: "f".into(),
                description: None,
                parameters: wire::empty_schema(),
            }],
            ..Request::default()
        };
        let body: Value = serde_json::from_slice(&encode_request(Format::OpenAiChat, &request).unwrap()).unwrap();
        let wire_call = &body["messages"][0]["tool_calls"][0];
        assert_eq!(wire_call["id"], "c1");
        assert_eq!(wire_call["extra_content"]["google"]["thought_signature"], "sig/+=");
        let response = Response {
            content: vec![Block::ToolCall(call.clone())],
            ..Response::default()
        };
        let body: Value =
            serde_json::from_slice(&super::super::encode_response(Format::OpenAiChat, &response)).unwrap();
        let id = body["choices"][0]["message"]["tool_calls"][0]["id"].as_str().unwrap();
        assert_eq!(decode_call_id(id), ("c1".to_owned(), Some("sig/+=".to_owned())));
        // A client that echoes only the id still gives the signature back.
        let echoed = json!({"model": "m", "messages": [
            {"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
        ]});
        let decoded = decode_request(Format::OpenAiChat, echoed.to_string().as_bytes()).unwrap();
        assert_eq!(decoded.value.messages[0].content, [Block::ToolCall(call)]);
    }

    #[test]
    fn test_response_with_cached_tokens_and_tool_calls_decodes() {
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 9, "total_tokens": 109, "prompt_tokens_details": {"cached_tokens": 60}}
        });
        let response = decode_response(Format::OpenAiChat, body.to_string().as_bytes()).unwrap();
        assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 40,
                output_tokens: 9,
                cache_read_tokens: 60,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0
            }
        );
        assert!(matches!(&response.content[0], Block::ToolCall(c) if c.arguments == "{\"a\":1}"));
    }

    #[test]
    fn test_stream_chunks_decode_to_events_with_tool_argument_deltas() {
        let stream = concat!(
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut decoder = super::super::stream::Decoder::new(Format::OpenAiChat);
        let mut events = Vec::new();
        decoder.feed(stream.as_bytes(), &mut events);
        let call = BlockKind::ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            signature: None,
        };
        assert_eq!(
            events,
            [
                Event::Start {
                    id: "c".into(),
                    model: "m".into()
                },
                Event::BlockStart {
                    index: 0,
                    block: BlockKind::Text
                },
                Event::Delta {
                    index: 0,
                    delta: Delta::Text("Hi".into())
                },
                Event::BlockStop { index: 0 },
                Event::BlockStart { index: 1, block: call },
                Event::Delta {
                    index: 1,
                    delta: Delta::Arguments("{}".into())
                },
                Event::BlockStop { index: 1 },
                Event::Finish(StopReason::ToolUse),
                Event::Usage(Usage {
                    input_tokens: 5,
                    output_tokens: 2,
                    ..Usage::default()
                }),
                Event::End,
            ]
        );
    }
}
