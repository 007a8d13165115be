//! Ollama `/api/chat` ↔ IR; streams are NDJSON, one object a line.
//!
//! A message holds one text, one thinking text, base64 images without a media type (sniffed
//! from the data) and whole tool calls with object arguments. Calls without an `id` are named
//! `ocall_<n>` and results are matched to calls by `tool_name`, as Ollama does; synthesized ids
//! stay off the wire.
//!
//! Losses: images by URL are refused (Ollama takes inline data only), several text or thinking
//! blocks of one message are joined, thinking signatures and cache token counts have no field,
//! `is_error` of tool results is dropped. `stream` defaults to true, as in Ollama.
//!
//! Request fields: `think` maps to [`Reasoning`] (`false` off, `true` the model's choice, a
//! level name a level) and is sent as a boolean to Ollama upstreams from other formats (only
//! some models take levels); `format` maps to [`OutputFormat`] (`"json"` or a schema);
//! `options.top_k`, `seed` and the penalties map. The other `options` ([`OPTIONS_PASSTHROUGH`]:
//! context size, mirostat, GPU placement, …) and the [`PASSTHROUGH`] fields reach Ollama
//! upstreams only. Ignored: `keep_alive` (how long the server keeps the model loaded is the
//! operator's choice).

use serde_json::{json, Map, Value};

use super::stream::{BlockKind, Delta, Event};
use super::wire::{self, array, count, object, opt_str, req_str, Calls, Drift};
use super::{
    decode_call_id, encode_call_id, Block, Decoded, Image, Message, Request, Response, Role, StopReason, Tool,
};
use super::{Effort, OutputFormat, Reasoning, ToolCall, ToolResult, Usage};
use crate::json::write_str;

const SYNTH_PREFIX: &str = "ocall_";

pub(crate) const MAPPED: &[&str] = &["model", "messages", "tools", "options", "stream", "format", "think"];

/// Fields the IR does not model, carried verbatim to an upstream of this format.
pub(crate) const PASSTHROUGH: &[&str] = &["logprobs", "top_logprobs"];

/// Mapped fields with more in them than the IR holds: the same format gets the caller's value.
const KEPT: &[&str] = &["format", "think"];

/// Known and not carried: how long the Ollama server keeps the model loaded.
pub(crate) const IGNORED: &[&str] = &["keep_alive"];

pub(crate) const OPTIONS_MAPPED: &[&str] = &[
    "temperature",
    "top_p",
    "num_predict",
    "stop",
    "top_k",
    "seed",
    "presence_penalty",
    "frequency_penalty",
];

/// `options` carried verbatim to an upstream of this format: the runner's own knobs.
pub(crate) const OPTIONS_PASSTHROUGH: &[&str] = &[
    "numa",
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "embedding_only",
    "num_thread",
    "num_keep",
    "tfs_z",
    "typical_p",
    "min_p",
    "repeat_last_n",
    "repeat_penalty",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "penalize_newline",
];

/// `think`: a switch or a level name.
fn decode_think(think: &Value) -> Option<Reasoning> {
    match think {
        Value::Bool(false) => Some(Reasoning::Off),
        Value::Bool(true) => Some(Reasoning::Auto),
        Value::String(level) => Effort::parse(level).map(Reasoning::Effort),
        _ => None,
    }
}

/// `format`: `"json"` or a JSON Schema.
fn decode_format(format: &Value) -> Option<OutputFormat> {
    match format {
        Value::String(s) if s == "json" => Some(OutputFormat::Json),
        Value::Object(_) => Some(OutputFormat::JsonSchema {
            name: String::new(),
            schema: format.clone(),
            strict: None,
        }),
        _ => None,
    }
}

pub(crate) fn decode_request(value: &Value) -> Result<Decoded<Request>, String> {
    let body = object(value, "body")?;
    let mut drift = Drift::default();
    drift.check("", body, &[MAPPED, PASSTHROUGH, IGNORED].concat());
    let mut request = Request {
        model: opt_str(body, "model")?.unwrap_or_default().to_owned(),
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(true),
        reasoning: body.get("think").and_then(decode_think),
        output_format: body.get("format").and_then(decode_format),
        ..Request::default()
    };
    wire::keep(body, &[PASSTHROUGH, KEPT].concat(), &mut request.passthrough);
    if let Some(options) = body.get("options").filter(|v| !v.is_null()) {
        let options = object(options, "options")?;
        drift.check("options", options, &[OPTIONS_MAPPED, OPTIONS_PASSTHROUGH].concat());
        for key in OPTIONS_PASSTHROUGH {
            if let Some(value) = options.get(*key) {
                request.passthrough.keep("options", key, value);
            }
        }
        request.temperature = wire::opt_f64(options, "temperature")?;
        request.top_p = wire::opt_f64(options, "top_p")?;
        request.top_k = options
            .get("top_k")
            .and_then(wire::integer)
            .and_then(|n| u64::try_from(n).ok());
        request.seed = wire::opt_i64(options, "seed")?;
        request.presence_penalty = wire::opt_f64(options, "presence_penalty")?;
        request.frequency_penalty = wire::opt_f64(options, "frequency_penalty")?;
        // NOTE: Ollama's -1 (unbounded) and -2 (fill the context) mean no caller limit.
        request.max_tokens = options.get("num_predict").and_then(Value::as_u64);
        request.stop = wire::stop_list(options.get("stop"))?;
    }
    let mut calls = Calls::new(SYNTH_PREFIX);
    for message in array(body.get("messages").unwrap_or(&Value::Null), "messages")? {
        let message = object(message, "message")?;
        drift.check(
            "messages[]",
            message,
            &[
                "role",
                "content",
                "images",
                "tool_calls",
                "thinking",
                "tool_name",
                "tool_call_id",
            ],
        );
        let content = opt_str(message, "content")?.unwrap_or_default();
        match req_str(message, "role")? {
            "system" => request.system.push(content.to_owned()),
            "user" => {
                let mut blocks = Vec::new();
                if !content.is_empty() {
                    blocks.push(Block::Text(content.to_owned()));
                }
                for image in wire::list(message, "images")? {
                    let data = image.as_str().ok_or("images must be base64 strings")?;
                    let media_type = wire::sniff_media_type(data).to_owned();
                    blocks.push(Block::Image(Image::Base64 {
                        media_type,
                        data: data.to_owned(),
                    }));
                }
                request.messages.push(Message {
                    role: Role::User,
                    content: blocks,
                });
            }
            "assistant" => {
                let mut blocks = Vec::new();
                if let Some(thinking) = opt_str(message, "thinking")?.filter(|t| !t.is_empty()) {
                    blocks.push(Block::Thinking {
                        text: thinking.to_owned(),
                        signature: None,
                    });
                }
                if !content.is_empty() {
                    blocks.push(Block::Text(content.to_owned()));
                }
                for call in wire::list(message, "tool_calls")? {
                    blocks.push(Block::ToolCall(decode_call(call, &mut calls, &mut drift)?));
                }
                request.messages.push(Message {
                    role: Role::Assistant,
                    content: blocks,
                });
            }
            "tool" => {
                let name = opt_str(message, "tool_name")?.unwrap_or_default();
                let id = calls.result_id(
                    opt_str(message, "tool_call_id")?
                        .map(|id| decode_call_id(id).0)
                        .as_deref(),
                    name,
                );
                let result = Block::ToolResult(ToolResult {
                    id,
                    name: name.to_owned(),
                    content: content.to_owned(),
                    is_error: false,
                });
                match request.messages.last_mut() {
                    Some(last)
                        if last.role == Role::User
                            && last.content.iter().all(|b| matches!(b, Block::ToolResult(_))) =>
                    {
                        last.content.push(result);
                    }
                    _ => request.messages.push(Message {
                        role: Role::User,
                        content: vec![result],
                    }),
                }
            }
            other => return Err(format!("unknown message role {other:?}")),
        }
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        for tool in array(tools, "tools")? {
            request.tools.push(wire::function_tool(tool, &mut drift, "tools[]")?);
        }
    }
    Ok(Decoded {
        value: request,
        unknown: drift.unknown,
    })
}

fn decode_call(value: &Value, calls: &mut Calls, drift: &mut Drift) -> Result<ToolCall, String> {
    let call = object(value, "tool call")?;
    drift.check("messages[].tool_calls[]", call, &["id", "type", "function"]);
    let function = object(call.get("function").unwrap_or(&Value::Null), "tool call function")?;
    let name = req_str(function, "name")?;
    let (id, signature) = match opt_str(call, "id")? {
        Some(id) => decode_call_id(id),
        None => (String::new(), None),
    };
    let id = calls.call_id(Some(&id), name);
    Ok(ToolCall {
        id,
        name: name.to_owned(),
        arguments: wire::args_text(function.get("arguments")),
        signature,
    })
}

fn encode_call(call: &ToolCall) -> Value {
    let mut value = json!({"function": {"name": call.name, "arguments": wire::args_value(&call.arguments)}});
    if !call.id.starts_with(SYNTH_PREFIX) {
        value["id"] = json!(encode_call_id(&call.id, call.signature.as_deref()));
    }
    value
}

/// The assistant message of `content`: texts and thoughts joined, calls whole.
fn assistant_message(content: &[Block]) -> Value {
    let mut text = String::new();
    let mut thinking = String::new();
    let mut calls = Vec::new();
    for block in content {
        match block {
            Block::Text(t) => text.push_str(t),
            Block::Thinking { text: t, .. } => thinking.push_str(t),
            Block::ToolCall(call) => calls.push(encode_call(call)),
            Block::Image(_) | Block::RedactedThinking(_) | Block::ToolResult(_) => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": text});
    if !thinking.is_empty() {
        message["thinking"] = json!(thinking);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

pub(crate) fn encode_request(request: &Request) -> Result<Value, String> {
    let mut messages: Vec<Value> = request
        .system
        .iter()
        .map(|t| json!({"role": "system", "content": t}))
        .collect();
    for message in &request.messages {
        if message.role == Role::Assistant {
            messages.push(assistant_message(&message.content));
            continue;
        }
        let mut text = String::new();
        let mut images = Vec::new();
        for block in &message.content {
            match block {
                Block::Text(t) => text.push_str(t),
                Block::Image(Image::Base64 { data, .. }) => images.push(json!(data)),
                Block::Image(Image::Url(_)) => return Err("Ollama takes images inline only, not by URL".to_owned()),
                Block::ToolResult(result) => {
                    let mut tool = json!({"role": "tool", "content": result.content, "tool_name": result.name});
                    if !result.id.starts_with(SYNTH_PREFIX) {
                        tool["tool_call_id"] = json!(result.id);
                    }
                    messages.push(tool);
                }
                Block::Thinking { .. } | Block::RedactedThinking(_) | Block::ToolCall(_) => {}
            }
        }
        if !text.is_empty() || !images.is_empty() {
            let mut user = json!({"role": "user", "content": text});
            if !images.is_empty() {
                user["images"] = Value::Array(images);
            }
            messages.push(user);
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools = request.tools.iter().map(|tool: &Tool| {
            let mut function = json!({"name": tool.name, "parameters": tool.parameters});
            if let Some(description) = &tool.description {
                function["description"] = json!(description);
            }
            json!({"type": "function", "function": function})
        });
        body.insert("tools".into(), tools.collect());
    }
    let mut options = Map::new();
    if let Some(t) = request.temperature {
        options.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        options.insert("top_p".into(), json!(p));
    }
    if let Some(max) = request.max_tokens {
        options.insert("num_predict".into(), json!(max));
    }
    if !request.stop.is_empty() {
        options.insert("stop".into(), json!(request.stop));
    }
    if let Some(k) = request.top_k {
        options.insert("top_k".into(), json!(k));
    }
    if let Some(seed) = request.seed {
        options.insert("seed".into(), json!(seed));
    }
    if let Some(penalty) = request.presence_penalty {
        options.insert("presence_penalty".into(), json!(penalty));
    }
    if let Some(penalty) = request.frequency_penalty {
        options.insert("frequency_penalty".into(), json!(penalty));
    }
    if !options.is_empty() {
        body.insert("options".into(), Value::Object(options));
    }
    if let Some(reasoning) = request.reasoning {
        body.insert("think".into(), json!(reasoning != Reasoning::Off));
    }
    match &request.output_format {
        None => {}
        Some(OutputFormat::Json) => {
            body.insert("format".into(), json!("json"));
        }
        Some(OutputFormat::JsonSchema { schema, .. }) => {
            body.insert("format".into(), schema.clone());
        }
    }
    // NOTE: always explicit, since Ollama streams when the field is absent.
    body.insert("stream".into(), json!(request.stream));
    Ok(Value::Object(body))
}

fn decode_stop(reason: Option<&str>, called: bool) -> StopReason {
    match reason {
        Some("length") => StopReason::MaxTokens,
        _ if called => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}

fn usage_of(body: &Map<String, Value>) -> Usage {
    Usage {
        input_tokens: count(Some(body), "prompt_eval_count"),
        output_tokens: count(Some(body), "eval_count"),
        ..Usage::default()
    }
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The closing object of a response: the reason and the counts Ollama reports.
fn done_fields(value: &mut Value, stop_reason: Option<StopReason>, usage: &Usage) {
    value["done"] = json!(true);
    value["done_reason"] = json!(if stop_reason == Some(StopReason::MaxTokens) {
        "length"
    } else {
        "stop"
    });
    value["prompt_eval_count"] = json!(usage.prompt_tokens());
    value["eval_count"] = json!(usage.output_tokens);
}

pub(crate) fn decode_response(value: &Value) -> Result<Response, String> {
    let body = object(value, "body")?;
    let message = object(body.get("message").unwrap_or(&Value::Null), "message")?;
    let mut content = Vec::new();
    if let Some(thinking) = opt_str(message, "thinking")?.filter(|t| !t.is_empty()) {
        content.push(Block::Thinking {
            text: thinking.to_owned(),
            signature: None,
        });
    }
    if let Some(text) = opt_str(message, "content")?.filter(|t| !t.is_empty()) {
        content.push(Block::Text(text.to_owned()));
    }
    let mut calls = Calls::new(SYNTH_PREFIX);
    for call in wire::list(message, "tool_calls")? {
        content.push(Block::ToolCall(decode_call(call, &mut calls, &mut Drift::default())?));
    }
    Ok(Response {
        id: String::new(),
        model: opt_str(body, "model")?.unwrap_or_default().to_owned(),
        content,
        stop_reason: Some(decode_stop(opt_str(body, "done_reason")?, calls.made > 0)),
        usage: usage_of(body),
    })
}

pub(crate) fn encode_response(response: &Response) -> Value {
    let mut value = json!({
        "model": response.model,
        "created_at": now_rfc3339(),
        "message": assistant_message(&response.content),
    });
    done_fields(&mut value, response.stop_reason, &response.usage);
    value
}

/// NDJSON decoding state.
#[derive(Debug)]
pub(crate) struct StreamDecoder {
    started: bool,
    calls: Calls,
    /// The open block: IR index and whether it holds thinking.
    open: Option<(usize, bool)>,
    next_index: usize,
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self {
            started: false,
            calls: Calls::new(SYNTH_PREFIX),
            open: None,
            next_index: 0,
        }
    }
}

impl StreamDecoder {
    pub(crate) fn event(&mut self, line: &str, out: &mut Vec<Event>) -> Result<(), String> {
        let value: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let body = object(&value, "line")?;
        if let Some(error) = body.get("error") {
            out.push(Event::Error(
                error.as_str().map_or_else(|| error.to_string(), str::to_owned),
            ));
            return Ok(());
        }
        if !self.started {
            self.started = true;
            out.push(Event::Start {
                id: String::new(),
                model: opt_str(body, "model")?.unwrap_or_default().to_owned(),
            });
        }
        if let Some(message) = body.get("message").and_then(Value::as_object) {
            if let Some(thinking) = opt_str(message, "thinking")?.filter(|t| !t.is_empty()) {
                let index = self.ensure(true, out);
                out.push(Event::Delta {
                    index,
                    delta: Delta::Thinking(thinking.to_owned()),
                });
            }
            if let Some(text) = opt_str(message, "content")?.filter(|t| !t.is_empty()) {
                let index = self.ensure(false, out);
                out.push(Event::Delta {
                    index,
                    delta: Delta::Text(text.to_owned()),
                });
            }
            for call in wire::list(message, "tool_calls")? {
                let call = decode_call(call, &mut self.calls, &mut Drift::default())?;
                self.close(out);
                let index = self.next_index;
                self.next_index += 1;
                let block = BlockKind::ToolCall {
                    id: call.id,
                    name: call.name,
                    signature: call.signature,
                };
                out.push(Event::BlockStart { index, block });
                out.push(Event::Delta {
                    index,
                    delta: Delta::Arguments(call.arguments),
                });
                out.push(Event::BlockStop { index });
            }
        }
        if body.get("done").and_then(Value::as_bool) == Some(true) {
            self.close(out);
            out.push(Event::Usage(usage_of(body)));
            out.push(Event::Finish(decode_stop(
                opt_str(body, "done_reason")?,
                self.calls.made > 0,
            )));
            out.push(Event::End);
        }
        Ok(())
    }

    fn ensure(&mut self, thinking: bool, out: &mut Vec<Event>) -> usize {
        if let Some((index, open)) = self.open {
            if open == thinking {
                return index;
            }
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, thinking));
        out.push(Event::BlockStart {
            index,
            block: if thinking { BlockKind::Thinking } else { BlockKind::Text },
        });
        index
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        if let Some((index, _)) = self.open.take() {
            out.push(Event::BlockStop { index });
        }
    }
}

/// NDJSON encoding state; tool calls go out whole when their block stops.
#[derive(Debug, Default)]
pub(crate) struct StreamEncoder {
    model: String,
    call: Option<(usize, ToolCall)>,
    usage: Usage,
    stop_reason: Option<StopReason>,
}

impl StreamEncoder {
    fn line(&self, out: &mut Vec<u8>, message: Value) {
        let value = json!({"model": self.model, "created_at": now_rfc3339(), "message": message, "done": false});
        out.extend_from_slice(&wire::to_vec(&value));
        out.push(b'\n');
    }

    pub(crate) fn encode(&mut self, event: &Event, out: &mut Vec<u8>) {
        match event {
            Event::Start { model, .. } => self.model.clone_from(model),
            Event::BlockStart {
                index,
                block: BlockKind::ToolCall { id, name, signature },
            } => {
                let call = ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                    signature: signature.clone(),
                };
                self.call = Some((*index, call));
            }
            Event::Delta { index, delta } => match delta {
                Delta::Text(text) => self.line(out, json!({"role": "assistant", "content": text})),
                Delta::Thinking(text) => self.line(out, json!({"role": "assistant", "content": "", "thinking": text})),
                Delta::Arguments(more) => {
                    if let Some((open, call)) = &mut self.call {
                        if open == index {
                            call.arguments.push_str(more);
                        }
                    }
                }
                Delta::Signature(_) => {}
            },
            Event::BlockStop { index } => {
                if let Some((open, call)) = self.call.take() {
                    if open == *index {
                        self.line(
                            out,
                            json!({"role": "assistant", "content": "", "tool_calls": [encode_call(&call)]}),
                        );
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
                let mut value = json!({"model": self.model, "created_at": now_rfc3339(), "message": {"role": "assistant", "content": ""}});
                done_fields(&mut value, self.stop_reason, &self.usage);
                out.extend_from_slice(&wire::to_vec(&value));
                out.push(b'\n');
            }
            Event::Error(message) => {
                out.extend_from_slice(&wire::to_vec(&json!({"error": message})));
                out.push(b'\n');
            }
            Event::BlockStart { .. } => {}
        }
    }
}

// --- errors in this API's shape (API.md "Standard routes") ------------------------------------

/// `{"error": message, "code": code, "detectors"?}`.
pub(crate) fn write_error(out: &mut Vec<u8>, _status: u16, code: &str, message: &str, detectors: &[String]) {
    out.extend_from_slice(b"{\"error\":");
    write_str(out, message);
    out.extend_from_slice(b",\"code\":");
    write_str(out, code);
    wire::write_detectors(out, detectors);
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::super::stream::{Accumulator, Decoder};
    use super::super::{decode_request, decode_response, Format};
    use super::*;

    /// As ollama-python sends a tool round trip with an image.
    const SDK_REQUEST: &str = r#"{
        "model": "llama3.2",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is this?", "images": ["iVBORw0KGgoAAAANSUhEUg=="]},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "lookup", "arguments": {"q": "cat"}}}]},
            {"role": "tool", "content": "a cat", "tool_name": "lookup"}
        ],
        "tools": [{"type": "function", "function": {"name": "lookup", "description": "Search",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
        "options": {"temperature": 0.1, "num_predict": 64, "num_ctx": 8192},
        "keep_alive": "5m",
        "format": "json"
    }"#;

    #[test]
    fn test_sdk_request_defaults_to_streaming_and_matches_results_by_name() {
        let decoded = decode_request(Format::Ollama, SDK_REQUEST.as_bytes()).unwrap();
        assert!(decoded.unknown.is_empty(), "{:?}", decoded.unknown);
        let request = decoded.value;
        assert_eq!(request.output_format, Some(OutputFormat::Json));
        assert_eq!(request.passthrough.fields["options"], json!({"num_ctx": 8192}));
        assert!(request.stream);
        assert_eq!(request.max_tokens, Some(64));
        assert_eq!(
            request.messages[0].content[1],
            Block::Image(Image::Base64 {
                media_type: "image/png".into(),
                data: "iVBORw0KGgoAAAANSUhEUg==".into()
            })
        );
        let Block::ToolCall(call) = &request.messages[1].content[0] else {
            panic!("not a call")
        };
        assert_eq!(
            (call.id.as_str(), call.arguments.as_str()),
            ("ocall_0", r#"{"q":"cat"}"#)
        );
        assert!(matches!(&request.messages[2].content[0], Block::ToolResult(r) if r.id == "ocall_0"));
    }

    #[test]
    fn test_url_images_are_refused() {
        let request = Request {
            messages: vec![Message {
                role: Role::User,
                content: vec![Block::Image(Image::Url("https://x/y.png".into()))],
            }],
            ..Request::default()
        };
        assert!(super::super::encode_request(Format::Ollama, &request).is_err());
    }

    #[test]
    fn test_ndjson_stream_decodes_like_the_whole_response() {
        let stream = concat!(
            "{\"model\":\"llama3.2\",\"created_at\":\"2025-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"hmm\"},\"done\":false}\n",
            "{\"model\":\"llama3.2\",\"created_at\":\"2025-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n",
            "{\"model\":\"llama3.2\",\"created_at\":\"2025-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"!\"},\"done\":false}\n",
            "{\"model\":\"llama3.2\",\"created_at\":\"2025-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"prompt_eval_count\":12,\"eval_count\":3}\n",
        );
        let mut decoder = Decoder::new(Format::Ollama);
        let mut events = Vec::new();
        decoder.feed(stream.as_bytes(), &mut events);
        let mut acc = Accumulator::default();
        events.iter().for_each(|e| acc.push(e));
        let whole = json!({"model": "llama3.2", "created_at": "2025-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": "Hi!", "thinking": "hmm"},
            "done": true, "done_reason": "stop", "prompt_eval_count": 12, "eval_count": 3});
        assert_eq!(
            acc.response(),
            &decode_response(Format::Ollama, whole.to_string().as_bytes()).unwrap()
        );
    }
}
