//! Gemini `generateContent` / `streamGenerateContent?alt=sse` ↔ IR.
//!
//! The model and the stream flag live in the URL path, not the body: the decoder leaves them
//! unset and the caller fills them in. Keys are read in camelCase or snake_case (protobuf JSON
//! accepts both) and written in camelCase, as google-genai sends them.
//!
//! Function calls need not carry an `id`; the decoder then names them
//! `gcall_<n>[_<responseId>]` (unique across turns when the response has an id) and the
//! encoder leaves such synthesized ids out again, matching results by name as Gemini does.
//! A `thoughtSignature` on a function-call part becomes [`ToolCall::signature`]; on a thought
//! part, the [`Block::Thinking`] signature; on a plain text part, an empty signed
//! [`Block::Thinking`] right after the text, which the encoder folds back into that part.
//!
//! Losses: images by URL are sent as `fileData` with a media type guessed from the extension,
//! `is_error` of tool results becomes an `error` key, cache-write counts (Gemini has none).
//!
//! Request fields: `generationConfig.thinkingConfig` maps to [`Reasoning`] (budget 0 is off,
//! -1 is the model's choice, `thinkingLevel` a level); another format's reasoning is sent as a
//! `thinkingBudget` of at most 24576 (Flash's ceiling) with `includeThoughts`, so the thinking
//! reaches clients that show it, and reasoning turned off as budget 0, which models that
//! always think refuse in Gemini's own error. `responseMimeType: application/json` with
//! `responseJsonSchema` maps to [`OutputFormat`]; a `responseSchema` (OpenAPI, not JSON
//! Schema) reaches other formats as schemaless JSON. `topK`, `seed` and the penalties map;
//! Gemini has no parallel-call switch. [`PASSTHROUGH`] and [`GENERATION_PASSTHROUGH`] fields
//! reach Gemini upstreams only. Ignored: `labels` (caller metadata), `serviceTier` and `store`
//! (as for OpenAI), `candidateCount` (the reservation covers one candidate) and output media
//! (`responseModalities`, `speechConfig`, `imageConfig`, `audioTranscriptionConfig`: the chat
//! route neither meters nor translates them).

use std::borrow::Cow;

use serde_json::{json, Map, Value};

use super::stream::{write_sse, BlockKind, Delta, Event};
use super::wire::{self, array, count, object, Calls, Drift};
use super::{Block, Decoded, Image, Message, Request, Response, Role, StopReason, Tool, ToolCall, ToolChoice};
use super::{Effort, OutputFormat, Reasoning, ToolResult, Usage};
use crate::json::write_str;
use crate::websearch::{self as ws, Search};

const SYNTH_PREFIX: &str = "gcall_";

/// A field by its camelCase name, or its snake_case spelling.
fn field<'a>(map: &'a Map<String, Value>, camel: &str) -> Option<&'a Value> {
    map.get(camel)
        .or_else(|| map.get(&*snake(camel)))
        .filter(|v| !v.is_null())
}

fn snake(camel: &str) -> Cow<'_, str> {
    if !camel.bytes().any(|b| b.is_ascii_uppercase()) {
        return Cow::Borrowed(camel);
    }
    let mut out = String::with_capacity(camel.len() + 4);
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn camel(key: &str) -> Cow<'_, str> {
    if !key.contains('_') {
        return Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`Drift::check`] comparing keys in camelCase.
fn check(drift: &mut Drift, prefix: &str, map: &Map<String, Value>, known: &[&str]) {
    for key in map.keys() {
        if !known.contains(&&*camel(key)) {
            drift.note(if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            });
        }
    }
}

fn str_field<'a>(map: &'a Map<String, Value>, camel: &str) -> Result<Option<&'a str>, String> {
    match field(map, camel) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("{camel} is not a string")),
    }
}

fn req_field<'a>(map: &'a Map<String, Value>, camel: &str) -> Result<&'a str, String> {
    str_field(map, camel)?.ok_or_else(|| format!("{camel} is missing"))
}

pub(crate) const MAPPED: &[&str] = &[
    "model",
    "contents",
    "systemInstruction",
    "tools",
    "toolConfig",
    "generationConfig",
];

/// Fields the IR does not model, carried verbatim to an upstream of this format.
pub(crate) const PASSTHROUGH: &[&str] = &["safetySettings", "cachedContent", "continuationToken"];

/// Known and not carried (see the module docs).
pub(crate) const IGNORED: &[&str] = &["labels", "serviceTier", "store"];

pub(crate) const GENERATION_MAPPED: &[&str] = &[
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "stopSequences",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
    "responseMimeType",
    "responseJsonSchema",
    "responseSchema",
    "thinkingConfig",
];

/// `generationConfig` fields carried verbatim to an upstream of this format.
pub(crate) const GENERATION_PASSTHROUGH: &[&str] = &[
    "responseLogprobs",
    "logprobs",
    "mediaResolution",
    "enableEnhancedCivicAnswers",
];

/// Mapped `generationConfig` fields with more in them than the IR holds.
const GENERATION_KEPT: &[&str] = &["responseMimeType", "responseSchema", "thinkingConfig"];

/// `generationConfig` fields known and not carried (see the module docs).
pub(crate) const GENERATION_IGNORED: &[&str] = &[
    "candidateCount",
    "responseModalities",
    "speechConfig",
    "imageConfig",
    "audioTranscriptionConfig",
];

/// The largest `thinkingBudget` every thinking model accepts (2.5 Flash's ceiling).
const MAX_THINKING_BUDGET: u64 = 24_576;

/// Keeps the fields of `map` whose camelCase names are in `keys`, under their camelCase name
/// so that they cannot duplicate what the encoder writes.
fn keep(map: &Map<String, Value>, keys: &[&str], container: &str, passthrough: &mut super::Passthrough) {
    for (key, value) in map {
        let name = camel(key);
        if keys.contains(&&*name) {
            passthrough.keep(container, &name, value);
        }
    }
}

/// `thinkingConfig`: a budget (0 off, negative the model's choice), else a level.
fn decode_thinking(config: &Map<String, Value>) -> Option<Reasoning> {
    match field(config, "thinkingBudget").and_then(wire::integer) {
        Some(0) => Some(Reasoning::Off),
        Some(n) if n < 0 => Some(Reasoning::Auto),
        Some(n) => u64::try_from(n).ok().map(Reasoning::Budget),
        None => match field(config, "thinkingLevel")
            .and_then(Value::as_str)
            .and_then(Effort::parse)
        {
            Some(effort) => Some(Reasoning::Effort(effort)),
            None => Some(Reasoning::Auto),
        },
    }
}

fn encode_thinking(reasoning: Reasoning) -> Value {
    match reasoning {
        Reasoning::Off => json!({"thinkingBudget": 0}),
        Reasoning::Auto => json!({"thinkingBudget": -1, "includeThoughts": true}),
        other => {
            let budget = other
                .budget_tokens()
                .unwrap_or(MAX_THINKING_BUDGET)
                .min(MAX_THINKING_BUDGET);
            json!({"thinkingBudget": budget, "includeThoughts": true})
        }
    }
}

/// `responseMimeType` with its schemas.
fn decode_output_format(config: &Map<String, Value>) -> Option<OutputFormat> {
    if field(config, "responseMimeType")?.as_str()? != "application/json" {
        return None;
    }
    Some(match field(config, "responseJsonSchema") {
        Some(schema) => OutputFormat::JsonSchema {
            name: String::new(),
            schema: schema.clone(),
            strict: None,
        },
        None => OutputFormat::Json,
    })
}

pub(crate) fn decode_request(value: &Value) -> Result<Decoded<Request>, String> {
    let body = object(value, "body")?;
    let mut drift = Drift::default();
    check(&mut drift, "", body, &[MAPPED, PASSTHROUGH, IGNORED].concat());
    let mut request = Request {
        model: str_field(body, "model")?.unwrap_or_default().to_owned(),
        ..Request::default()
    };
    keep(body, PASSTHROUGH, "", &mut request.passthrough);
    if let Some(config) = field(body, "generationConfig") {
        let config = object(config, "generationConfig")?;
        let known = [GENERATION_MAPPED, GENERATION_PASSTHROUGH, GENERATION_IGNORED].concat();
        check(&mut drift, "generationConfig", config, &known);
        keep(
            config,
            &[GENERATION_PASSTHROUGH, GENERATION_KEPT].concat(),
            "generationConfig",
            &mut request.passthrough,
        );
        let count = |key| {
            field(config, key)
                .and_then(wire::integer)
                .and_then(|n| u64::try_from(n).ok())
        };
        request.max_tokens = count("maxOutputTokens");
        request.top_k = count("topK");
        request.seed = field(config, "seed").and_then(wire::integer);
        request.temperature = field(config, "temperature").and_then(Value::as_f64);
        request.top_p = field(config, "topP").and_then(Value::as_f64);
        request.presence_penalty = field(config, "presencePenalty").and_then(Value::as_f64);
        request.frequency_penalty = field(config, "frequencyPenalty").and_then(Value::as_f64);
        request.stop = wire::stop_list(field(config, "stopSequences"))?;
        request.reasoning = field(config, "thinkingConfig")
            .and_then(Value::as_object)
            .and_then(decode_thinking);
        request.output_format = decode_output_format(config);
    }
    if let Some(system) = field(body, "systemInstruction") {
        let system = object(system, "systemInstruction")?;
        for part in array(
            field(system, "parts").unwrap_or(&Value::Null),
            "systemInstruction.parts",
        )? {
            request
                .system
                .push(req_field(object(part, "part")?, "text")?.to_owned());
        }
    }
    let mut calls = Calls::new(SYNTH_PREFIX);
    for content in array(field(body, "contents").unwrap_or(&Value::Null), "contents")? {
        let content = object(content, "content")?;
        check(&mut drift, "contents[]", content, &["role", "parts"]);
        let role = match str_field(content, "role")?.unwrap_or("user") {
            "model" => Role::Assistant,
            _ => Role::User,
        };
        let parts = array(field(content, "parts").unwrap_or(&Value::Null), "parts")?;
        let blocks = decode_parts(parts, &mut calls, &mut drift, false)?;
        request.messages.push(Message { role, content: blocks });
    }
    for tool in array(field(body, "tools").unwrap_or(&wire::EMPTY_ARRAY), "tools")? {
        let tool = object(tool, "tool")?;
        check(&mut drift, "tools[]", tool, &["functionDeclarations"]);
        for declaration in array(
            field(tool, "functionDeclarations").unwrap_or(&wire::EMPTY_ARRAY),
            "functionDeclarations",
        )? {
            let declaration = object(declaration, "function declaration")?;
            let known = ["name", "description", "parameters", "parametersJsonSchema"];
            check(&mut drift, "tools[].functionDeclarations[]", declaration, &known);
            request.tools.push(Tool {
                name: req_field(declaration, "name")?.to_owned(),
                description: str_field(declaration, "description")?.map(str::to_owned),
                parameters: field(declaration, "parametersJsonSchema")
                    .or_else(|| field(declaration, "parameters"))
                    .cloned()
                    .unwrap_or_else(wire::empty_schema),
            });
        }
    }
    if let Some(config) = field(body, "toolConfig") {
        let config = object(config, "toolConfig")?;
        check(&mut drift, "toolConfig", config, &["functionCallingConfig"]);
        if let Some(calling) = field(config, "functionCallingConfig") {
            let calling = object(calling, "functionCallingConfig")?;
            check(
                &mut drift,
                "toolConfig.functionCallingConfig",
                calling,
                &["mode", "allowedFunctionNames"],
            );
            let allowed = field(calling, "allowedFunctionNames").and_then(Value::as_array);
            request.tool_choice = match str_field(calling, "mode")?.unwrap_or("AUTO") {
                "NONE" => Some(ToolChoice::None),
                "ANY" => match allowed.map(Vec::as_slice) {
                    Some([only]) => Some(ToolChoice::Tool(only.as_str().unwrap_or_default().to_owned())),
                    _ => Some(ToolChoice::Required),
                },
                _ => Some(ToolChoice::Auto),
            };
        }
    }
    Ok(Decoded {
        value: request,
        unknown: drift.unknown,
    })
}

/// The id suffix that keeps synthesized ids unique across turns: the response id's safe part.
fn id_suffix(response_id: &str) -> String {
    let safe: String = response_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    if safe.is_empty() {
        safe
    } else {
        format!("_{safe}")
    }
}

/// Decodes parts; `merge` joins consecutive unsigned text of one kind (a response's parts are
/// a stream's pieces, and the stream decoder joins them the same way).
fn decode_parts(parts: &[Value], calls: &mut Calls, drift: &mut Drift, merge: bool) -> Result<Vec<Block>, String> {
    let mut blocks: Vec<Block> = Vec::with_capacity(parts.len());
    for part in parts {
        let part = object(part, "part")?;
        check(
            drift,
            "contents[].parts[]",
            part,
            &[
                "text",
                "thought",
                "thoughtSignature",
                "inlineData",
                "fileData",
                "functionCall",
                "functionResponse",
            ],
        );
        let signature = str_field(part, "thoughtSignature")?.map(str::to_owned);
        if let Some(call) = field(part, "functionCall") {
            let call = object(call, "functionCall")?;
            let name = req_field(call, "name")?;
            let id = calls.call_id(str_field(call, "id")?, name);
            let arguments = wire::args_text(field(call, "args"));
            blocks.push(Block::ToolCall(ToolCall {
                id,
                name: name.to_owned(),
                arguments,
                signature,
            }));
        } else if let Some(response) = field(part, "functionResponse") {
            let response = object(response, "functionResponse")?;
            let name = req_field(response, "name")?;
            let id = calls.result_id(str_field(response, "id")?, name);
            let (content, is_error) = decode_result(field(response, "response"));
            blocks.push(Block::ToolResult(ToolResult {
                id,
                name: name.to_owned(),
                content,
                is_error,
            }));
        } else if let Some(data) = field(part, "inlineData") {
            let data = object(data, "inlineData")?;
            let media_type = req_field(data, "mimeType")?.to_owned();
            blocks.push(Block::Image(Image::Base64 {
                media_type,
                data: standard_base64(req_field(data, "data")?),
            }));
        } else if let Some(file) = field(part, "fileData") {
            blocks.push(Block::Image(Image::Url(
                req_field(object(file, "fileData")?, "fileUri")?.to_owned(),
            )));
        } else if let Some(text) = str_field(part, "text")? {
            let thought = field(part, "thought").and_then(Value::as_bool).unwrap_or(false);
            let joined = match (merge, blocks.last_mut()) {
                (true, Some(Block::Text(last))) if !thought => Some(last),
                (
                    true,
                    Some(Block::Thinking {
                        text: last,
                        signature: None,
                    }),
                ) if thought => Some(last),
                _ => None,
            };
            match joined {
                Some(last) => last.push_str(text),
                None if thought => blocks.push(Block::Thinking {
                    text: text.to_owned(),
                    signature: None,
                }),
                // NOTE: empty answer text carries nothing (Gemini ends streams with one that holds
                // only a signature); the stream decoder opens no block for it either.
                None if text.is_empty() => {}
                None => blocks.push(Block::Text(text.to_owned())),
            }
            if let Some(signature) = signature {
                match blocks.last_mut() {
                    Some(Block::Thinking { signature: slot, .. }) if thought => *slot = Some(signature),
                    _ => blocks.push(Block::Thinking {
                        text: String::new(),
                        signature: Some(signature),
                    }),
                }
            }
        }
    }
    Ok(blocks)
}

/// A `functionResponse.response` as IR text: `{"output": s}` and `{"error": s}` unwrap, any
/// other object travels as JSON text.
fn decode_result(response: Option<&Value>) -> (String, bool) {
    let Some(Value::Object(map)) = response else {
        return (String::new(), false);
    };
    if map.len() == 1 {
        if let Some(Value::String(s)) = map.get("output") {
            return (s.clone(), false);
        }
        if let Some(Value::String(s)) = map.get("error") {
            return (s.clone(), true);
        }
    }
    (Value::Object(map.clone()).to_string(), false)
}

fn encode_result(result: &ToolResult) -> Value {
    if !result.is_error {
        if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&result.content) {
            return Value::Object(map);
        }
    }
    let key = if result.is_error { "error" } else { "output" };
    json!({ key: result.content })
}

fn encode_parts(blocks: &[Block]) -> Vec<Value> {
    let mut parts: Vec<Value> = Vec::with_capacity(blocks.len());
    for block in blocks {
        let part = match block {
            Block::Text(text) => json!({"text": text}),
            Block::Image(Image::Base64 { media_type, data }) => {
                json!({"inlineData": {"mimeType": media_type, "data": data}})
            }
            Block::Image(Image::Url(url)) => {
                json!({"fileData": {"mimeType": wire::guess_media_type(url), "fileUri": url}})
            }
            Block::Thinking { text, signature } => {
                if let (true, Some(signature), Some(last)) = (text.is_empty(), signature, parts.last_mut()) {
                    let plain_text = last.get("text").is_some() && last.get("thought").is_none();
                    if plain_text && last.get("thoughtSignature").is_none() {
                        last["thoughtSignature"] = json!(signature);
                        continue;
                    }
                }
                let mut part = json!({"text": text, "thought": true});
                if let Some(signature) = signature {
                    part["thoughtSignature"] = json!(signature);
                }
                part
            }
            // NOTE: Anthropic's redacted reasoning has no Gemini form and means nothing there.
            Block::RedactedThinking(_) => continue,
            Block::ToolCall(call) => encode_call(call),
            Block::ToolResult(result) => {
                let mut response = json!({"name": result.name, "response": encode_result(result)});
                if !result.id.starts_with(SYNTH_PREFIX) {
                    response["id"] = json!(result.id);
                }
                json!({"functionResponse": response})
            }
        };
        parts.push(part);
    }
    parts
}

fn encode_call(call: &ToolCall) -> Value {
    let mut function = json!({"name": call.name, "args": wire::args_value(&call.arguments)});
    if !call.id.starts_with(SYNTH_PREFIX) {
        function["id"] = json!(call.id);
    }
    let mut part = json!({"functionCall": function});
    if let Some(signature) = &call.signature {
        part["thoughtSignature"] = json!(signature);
    }
    part
}

pub(crate) fn encode_request(request: &Request) -> Result<Value, String> {
    let mut body = Map::new();
    let contents = request.messages.iter().map(|m| {
        let role = if m.role == Role::User { "user" } else { "model" };
        json!({"role": role, "parts": encode_parts(&m.content)})
    });
    body.insert("contents".into(), contents.collect());
    if !request.system.is_empty() {
        let parts: Vec<Value> = request.system.iter().map(|t| json!({"text": t})).collect();
        body.insert("systemInstruction".into(), json!({"parts": parts}));
    }
    if !request.tools.is_empty() {
        let declarations = request.tools.iter().map(|tool| {
            let mut value = json!({"name": tool.name, "parametersJsonSchema": tool.parameters});
            if let Some(description) = &tool.description {
                value["description"] = json!(description);
            }
            value
        });
        body.insert(
            "tools".into(),
            json!([{"functionDeclarations": declarations.collect::<Vec<_>>()}]),
        );
    }
    if let Some(choice) = &request.tool_choice {
        let calling = match choice {
            ToolChoice::Auto => json!({"mode": "AUTO"}),
            ToolChoice::None => json!({"mode": "NONE"}),
            ToolChoice::Required => json!({"mode": "ANY"}),
            ToolChoice::Tool(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
        };
        body.insert("toolConfig".into(), json!({"functionCallingConfig": calling}));
    }
    let mut config = Map::new();
    if let Some(max) = request.max_tokens {
        config.insert("maxOutputTokens".into(), json!(max));
    }
    if let Some(t) = request.temperature {
        config.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        config.insert("topP".into(), json!(p));
    }
    if let Some(k) = request.top_k {
        config.insert("topK".into(), json!(k));
    }
    if !request.stop.is_empty() {
        config.insert("stopSequences".into(), json!(request.stop));
    }
    if let Some(seed) = request.seed {
        config.insert("seed".into(), json!(seed));
    }
    if let Some(penalty) = request.presence_penalty {
        config.insert("presencePenalty".into(), json!(penalty));
    }
    if let Some(penalty) = request.frequency_penalty {
        config.insert("frequencyPenalty".into(), json!(penalty));
    }
    if let Some(reasoning) = request.reasoning {
        config.insert("thinkingConfig".into(), encode_thinking(reasoning));
    }
    if let Some(format) = &request.output_format {
        config.insert("responseMimeType".into(), json!("application/json"));
        if let OutputFormat::JsonSchema { schema, .. } = format {
            config.insert("responseJsonSchema".into(), schema.clone());
        }
    }
    if !config.is_empty() {
        body.insert("generationConfig".into(), Value::Object(config));
    }
    Ok(Value::Object(body))
}

fn decode_stop(reason: &str, called: bool) -> StopReason {
    match reason {
        "MAX_TOKENS" => StopReason::MaxTokens,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            StopReason::ContentFilter
        }
        // NOTE: Gemini says STOP after function calls; the IR (and every other format) says why.
        _ if called => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}

fn encode_stop(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn | StopReason::StopSequence | StopReason::ToolUse => "STOP",
        StopReason::MaxTokens => "MAX_TOKENS",
        StopReason::ContentFilter => "SAFETY",
    }
}

fn decode_usage(usage: &Map<String, Value>) -> Usage {
    let usage = Some(usage);
    let cached = count(usage, "cachedContentTokenCount");
    Usage {
        input_tokens: count(usage, "promptTokenCount").saturating_sub(cached),
        output_tokens: count(usage, "candidatesTokenCount") + count(usage, "thoughtsTokenCount"),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
        cache_write_1h_tokens: 0,
    }
}

fn encode_usage(usage: &Usage) -> Value {
    let mut value = json!({
        "promptTokenCount": usage.prompt_tokens(),
        "candidatesTokenCount": usage.output_tokens,
        "totalTokenCount": usage.prompt_tokens() + usage.output_tokens,
    });
    if usage.cache_read_tokens > 0 {
        value["cachedContentTokenCount"] = json!(usage.cache_read_tokens);
    }
    value
}

pub(crate) fn decode_response(value: &Value) -> Result<Response, String> {
    let body = object(value, "body")?;
    let id = str_field(body, "responseId")?.unwrap_or_default().to_owned();
    let mut calls = Calls::new(SYNTH_PREFIX);
    calls.suffix = id_suffix(&id);
    let mut response = Response {
        model: str_field(body, "modelVersion")?.unwrap_or_default().to_owned(),
        usage: field(body, "usageMetadata")
            .and_then(Value::as_object)
            .map(decode_usage)
            .unwrap_or_default(),
        ..Response::default()
    };
    let candidates = field(body, "candidates").and_then(Value::as_array);
    if let Some(candidate) = candidates.and_then(|c| c.first()) {
        let candidate = object(candidate, "candidate")?;
        if let Some(content) = field(candidate, "content").and_then(Value::as_object) {
            let parts = array(field(content, "parts").unwrap_or(&wire::EMPTY_ARRAY), "parts")?;
            response.content = decode_parts(parts, &mut calls, &mut Drift::default(), true)?;
        }
        response.stop_reason = str_field(candidate, "finishReason")?.map(|r| decode_stop(r, calls.made > 0));
    }
    response.id = id;
    Ok(response)
}

pub(crate) fn encode_response(response: &Response) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": encode_parts(&response.content)}, "index": 0});
    if let Some(reason) = response.stop_reason {
        candidate["finishReason"] = json!(encode_stop(reason));
    }
    json!({
        "candidates": [candidate],
        "usageMetadata": encode_usage(&response.usage),
        "modelVersion": response.model,
        "responseId": response.id,
    })
}

/// `alt=sse` decoding state: Gemini streams whole parts, so blocks are opened and closed here.
#[derive(Debug)]
pub(crate) struct StreamDecoder {
    started: bool,
    calls: Calls,
    /// The open text block: IR index and whether it holds thoughts.
    open: Option<(usize, bool)>,
    next_index: usize,
    finish: Option<String>,
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self {
            started: false,
            calls: Calls::new(SYNTH_PREFIX),
            open: None,
            next_index: 0,
            finish: None,
        }
    }
}

impl StreamDecoder {
    pub(crate) fn event(&mut self, data: &str, out: &mut Vec<Event>) -> Result<(), String> {
        let value: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
        let chunk = object(&value, "chunk")?;
        if let Some(error) = chunk.get("error") {
            out.push(Event::Error(error.to_string()));
            return Ok(());
        }
        if !self.started {
            self.started = true;
            let id = str_field(chunk, "responseId")?.unwrap_or_default();
            self.calls.suffix = id_suffix(id);
            let model = str_field(chunk, "modelVersion")?.unwrap_or_default().to_owned();
            out.push(Event::Start {
                id: id.to_owned(),
                model,
            });
        }
        let candidate = field(chunk, "candidates")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
            .and_then(Value::as_object);
        if let Some(candidate) = candidate {
            let parts = field(candidate, "content")
                .and_then(Value::as_object)
                .and_then(|c| field(c, "parts"));
            for part in parts.and_then(Value::as_array).map_or(&[][..], Vec::as_slice) {
                self.part(object(part, "part")?, out)?;
            }
            if let Some(reason) = str_field(candidate, "finishReason")? {
                self.close(out);
                self.finish = Some(reason.to_owned());
            }
        }
        if let Some(usage) = field(chunk, "usageMetadata").and_then(Value::as_object) {
            out.push(Event::Usage(decode_usage(usage)));
        }
        Ok(())
    }

    fn part(&mut self, part: &Map<String, Value>, out: &mut Vec<Event>) -> Result<(), String> {
        let signature = str_field(part, "thoughtSignature")?.map(str::to_owned);
        if let Some(call) = field(part, "functionCall") {
            let call = object(call, "functionCall")?;
            let name = req_field(call, "name")?;
            let id = self.calls.call_id(str_field(call, "id")?, name);
            self.close(out);
            let index = self.next();
            out.push(Event::BlockStart {
                index,
                block: BlockKind::ToolCall {
                    id,
                    name: name.to_owned(),
                    signature,
                },
            });
            out.push(Event::Delta {
                index,
                delta: Delta::Arguments(wire::args_text(field(call, "args"))),
            });
            out.push(Event::BlockStop { index });
            return Ok(());
        }
        let Some(text) = str_field(part, "text")? else {
            return Ok(());
        };
        let thought = field(part, "thought").and_then(Value::as_bool).unwrap_or(false);
        if !text.is_empty() || (thought && signature.is_none()) {
            let index = self.ensure(thought, out);
            let delta = if thought {
                Delta::Thinking(text.to_owned())
            } else {
                Delta::Text(text.to_owned())
            };
            out.push(Event::Delta { index, delta });
        }
        if let Some(signature) = signature {
            let index = if thought {
                self.ensure(true, out)
            } else {
                self.open_new(true, out)
            };
            out.push(Event::Delta {
                index,
                delta: Delta::Signature(signature),
            });
            // NOTE: a signature ends its part's block; later text starts a new one, as the
            // non-streamed decoder splits parts there too.
            self.close(out);
        }
        Ok(())
    }

    fn next(&mut self) -> usize {
        self.next_index += 1;
        self.next_index - 1
    }

    fn ensure(&mut self, thought: bool, out: &mut Vec<Event>) -> usize {
        match self.open {
            Some((index, open)) if open == thought => index,
            _ => self.open_new(thought, out),
        }
    }

    fn open_new(&mut self, thought: bool, out: &mut Vec<Event>) -> usize {
        self.close(out);
        let index = self.next();
        self.open = Some((index, thought));
        out.push(Event::BlockStart {
            index,
            block: if thought { BlockKind::Thinking } else { BlockKind::Text },
        });
        index
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        if let Some((index, _)) = self.open.take() {
            out.push(Event::BlockStop { index });
        }
    }

    /// The upstream closed: Gemini has no end marker, so the stream is complete if it gave a
    /// finish reason.
    pub(crate) fn finish(&mut self, out: &mut Vec<Event>) -> bool {
        self.close(out);
        let Some(reason) = self.finish.take() else { return false };
        out.push(Event::Finish(decode_stop(&reason, self.calls.made > 0)));
        true
    }
}

/// `alt=sse` encoding state. Gemini has no argument deltas: a call's arguments are gathered
/// and sent whole when its block stops.
#[derive(Debug, Default)]
pub(crate) struct StreamEncoder {
    id: String,
    model: String,
    /// The open tool call and its arguments so far.
    call: Option<(usize, ToolCall)>,
    /// The open text block is a thought.
    thought: bool,
    usage: Usage,
    stop_reason: Option<StopReason>,
}

impl StreamEncoder {
    fn chunk(&self, out: &mut Vec<u8>, parts: Vec<Value>) {
        let data = json!({
            "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
            "modelVersion": self.model,
            "responseId": self.id,
        });
        write_sse(out, "", &data);
    }

    pub(crate) fn encode(&mut self, event: &Event, out: &mut Vec<u8>) {
        match event {
            Event::Start { id, model } => {
                self.id.clone_from(id);
                self.model.clone_from(model);
            }
            Event::BlockStart { index, block } => match block {
                BlockKind::ToolCall { id, name, signature } => {
                    let call = ToolCall {
                        id: id.clone(),
                        name: name.clone(),
                        arguments: String::new(),
                        signature: signature.clone(),
                    };
                    self.call = Some((*index, call));
                }
                BlockKind::Thinking => self.thought = true,
                BlockKind::Text | BlockKind::RedactedThinking(_) => self.thought = false,
            },
            Event::Delta { index, delta } => match delta {
                Delta::Text(text) => self.chunk(out, vec![json!({"text": text})]),
                Delta::Thinking(text) => self.chunk(out, vec![json!({"text": text, "thought": true})]),
                Delta::Signature(signature) => {
                    self.chunk(
                        out,
                        vec![json!({"text": "", "thought": true, "thoughtSignature": signature})],
                    );
                }
                Delta::Arguments(more) => {
                    if let Some((open, call)) = &mut self.call {
                        if open == index {
                            call.arguments.push_str(more);
                        }
                    }
                }
            },
            Event::BlockStop { index } => {
                if let Some((open, call)) = self.call.take() {
                    if open == *index {
                        self.chunk(out, vec![encode_call(&call)]);
                    } else {
                        self.call = Some((open, call));
                    }
                }
            }
            Event::Usage(usage) => self.usage.merge(usage),
            Event::Finish(reason) => self.stop_reason = Some(*reason),
            // NOTE: a web search's pages have no event in this format (only Mesh NDJSON streams them).
            Event::Sources(_) => {}
            Event::End => {
                let mut candidate = json!({"content": {"role": "model", "parts": []}, "index": 0});
                candidate["finishReason"] = json!(encode_stop(self.stop_reason.unwrap_or(StopReason::EndTurn)));
                let data = json!({
                    "candidates": [candidate],
                    "usageMetadata": encode_usage(&self.usage),
                    "modelVersion": self.model,
                    "responseId": self.id,
                });
                write_sse(out, "", &data);
            }
            Event::Error(message) => {
                let data = json!({"error": {"code": 502, "message": message, "status": "UNAVAILABLE"}});
                write_sse(out, "", &data);
            }
        }
    }
}

/// Gemini accepts image data in either base64 alphabet (google-genai sends the URL-safe one);
/// the IR, like every other API, carries the standard alphabet. URL-safe text is converted and
/// padded; standard text is kept as it came.
fn standard_base64(data: &str) -> String {
    if !data.contains(['-', '_']) {
        return data.to_owned();
    }
    let mut out: String = data
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !out.len().is_multiple_of(4) {
        out.push('=');
    }
    out
}

// --- web search (mesh-behaviour §4.5) ---------------------------------------------------------

/// Reads one upstream event's web search (mesh-behaviour §4.5): grounding chunks, search
/// queries and the search entry point's HTML.
pub(crate) fn observe_search(search: &mut Search, event: &Value) {
    for candidate in ws::array(Some(event), "candidates") {
        let Some(meta) = candidate.get("groundingMetadata").filter(|m| m.is_object()) else {
            continue;
        };
        for chunk in ws::array(Some(meta), "groundingChunks") {
            if let Some(web) = chunk.get("web").filter(|w| w.is_object()) {
                search.cite(ws::text(web, "uri"), ws::text(web, "title"), "", "");
            }
        }
        for query in ws::array(Some(meta), "webSearchQueries") {
            search.query(query.as_str().unwrap_or(""));
        }
        let rendered = meta
            .get("searchEntryPoint")
            .map_or("", |e| ws::text(e, "renderedContent"));
        if !rendered.is_empty() {
            search.suggestions_html = Some(rendered.to_owned());
        }
    }
}

// --- errors in this API's shape (API.md "Standard routes") ------------------------------------

/// The `google.rpc` status name for `status`.
fn rpc_status(status: u16) -> &'static str {
    match status {
        400 | 413 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        502 | 504 => "UNAVAILABLE",
        _ => "INTERNAL",
    }
}

/// `{"error": {code, message, status, details: [ErrorInfo]}}`; the Mesh `code` is the
/// `ErrorInfo`'s `reason`, and data protection's detectors its string metadata, comma-separated.
pub(crate) fn write_error(out: &mut Vec<u8>, status: u16, code: &str, message: &str, detectors: &[String]) {
    out.extend_from_slice(b"{\"error\":{\"code\":");
    out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    out.extend_from_slice(b",\"message\":");
    write_str(out, message);
    out.extend_from_slice(b",\"status\":");
    write_str(out, rpc_status(status));
    out.extend_from_slice(b",\"details\":[{\"@type\":\"type.googleapis.com/google.rpc.ErrorInfo\",\"reason\":");
    write_str(out, code);
    out.extend_from_slice(b",\"domain\":\"meshfast\"");
    if !detectors.is_empty() {
        out.extend_from_slice(b",\"metadata\":{\"detectors\":");
        write_str(out, &detectors.join(","));
        out.push(b'}');
    }
    out.extend_from_slice(b"}]}}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn test_url_safe_image_data_becomes_standard_base64() {
        assert_eq!(super::standard_base64("4__8_AwAI"), "4//8/AwAI===");
        assert_eq!(super::standard_base64("iVBORw0KGgo="), "iVBORw0KGgo=");
        assert_eq!(
            super::standard_base64("iVBORaAAaA/0+"),
            "iVBORaAAaA/0+",
            "standard text is kept"
        );
    }

    use super::super::stream::{Accumulator, Decoder};
    use super::super::{decode_request, decode_response, encode_request, Format};
    use super::*;

    /// A second turn as google-genai sends it (camelCase), with the signed function call echoed.
    const SDK_REQUEST: &str = r#"{
        "contents": [
            {"role": "user", "parts": [{"text": "Weather in Paris?"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}]},
            {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                "thoughtSignature": "CiQBVKhc7z"}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"output": "18C"}}}]}
        ],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": [{"functionDeclarations": [{"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}},
        "generationConfig": {"maxOutputTokens": 200, "temperature": 0.5, "topK": 40, "stopSequences": ["END"]},
        "safetySettings": []
    }"#;

    #[test]
    fn test_sdk_request_matches_results_to_calls_by_name() {
        let decoded = decode_request(Format::Gemini, SDK_REQUEST.as_bytes()).unwrap();
        assert!(decoded.unknown.is_empty(), "{:?}", decoded.unknown);
        let request = decoded.value;
        assert_eq!(request.top_k, Some(40));
        assert_eq!(request.tool_choice, Some(ToolChoice::Tool("get_weather".into())));
        assert_eq!(request.max_tokens, Some(200));
        let Block::ToolCall(call) = &request.messages[1].content[0] else {
            panic!("not a call")
        };
        assert_eq!(call.signature.as_deref(), Some("CiQBVKhc7z"));
        assert_eq!(call.arguments, r#"{"city":"Paris"}"#);
        let Block::ToolResult(result) = &request.messages[2].content[0] else {
            panic!("not a result")
        };
        assert_eq!((result.id.as_str(), result.content.as_str()), (call.id.as_str(), "18C"));
        // Synthesized ids stay out of the wire; the signature goes back on the call's part.
        let body: Value = serde_json::from_slice(&encode_request(Format::Gemini, &request).unwrap()).unwrap();
        assert_eq!(
            body["contents"][1]["parts"][0],
            json!({"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "CiQBVKhc7z"})
        );
        assert_eq!(
            body["contents"][2]["parts"][0],
            json!({"functionResponse": {"name": "get_weather", "response": {"output": "18C"}}})
        );
    }

    #[test]
    fn test_snake_case_request_is_read_too() {
        let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "system_instruction": {"parts": [{"text": "S"}]}, "generation_config": {"max_output_tokens": 9}});
        let decoded = decode_request(Format::Gemini, body.to_string().as_bytes()).unwrap();
        assert!(decoded.unknown.is_empty(), "{:?}", decoded.unknown);
        assert_eq!(
            (decoded.value.system, decoded.value.max_tokens),
            (vec!["S".to_owned()], Some(9))
        );
    }

    #[test]
    fn test_response_with_thoughts_and_signed_call_decodes() {
        let body = json!({"candidates": [{"content": {"role": "model", "parts": [
                {"text": "Let me check", "thought": true},
                {"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "sig1"}]},
            "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 30, "candidatesTokenCount": 5, "thoughtsTokenCount": 20,
                "cachedContentTokenCount": 10, "totalTokenCount": 55},
            "modelVersion": "gemini-2.5-pro", "responseId": "r1"});
        let response = decode_response(Format::Gemini, body.to_string().as_bytes()).unwrap();
        assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 20,
                output_tokens: 25,
                cache_read_tokens: 10,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0
            }
        );
        assert_eq!(
            response.content,
            [
                Block::Thinking {
                    text: "Let me check".into(),
                    signature: None
                },
                Block::ToolCall(ToolCall {
                    id: "gcall_0_r1".into(),
                    name: "f".into(),
                    arguments: "{}".into(),
                    signature: Some("sig1".into())
                }),
            ]
        );
    }

    #[test]
    fn test_sse_chunks_decode_like_the_whole_response() {
        let stream = concat!(
            "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel\"}],\"role\":\"model\"},\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":4},\"modelVersion\":\"g\",\"responseId\":\"r\"}\r\n\r\n",
            "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"lo\",\"thoughtSignature\":\"s\"}],\"role\":\"model\"},\"finishReason\":\"STOP\",\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":4,\"candidatesTokenCount\":2},\"modelVersion\":\"g\",\"responseId\":\"r\"}\r\n\r\n",
        );
        let mut decoder = Decoder::new(Format::Gemini);
        let mut events = Vec::new();
        decoder.feed(stream.as_bytes(), &mut events);
        decoder.finish(&mut events);
        let mut acc = Accumulator::default();
        events.iter().for_each(|e| acc.push(e));
        let whole = json!({"candidates": [{"content": {"parts": [{"text": "Hello", "thoughtSignature": "s"}], "role": "model"},
            "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2},
            "modelVersion": "g", "responseId": "r"});
        assert_eq!(
            acc.response(),
            &decode_response(Format::Gemini, whole.to_string().as_bytes()).unwrap()
        );
        assert_eq!(events.last(), Some(&Event::End));
    }
}
