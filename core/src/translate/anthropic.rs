//! Anthropic Messages (`/v1/messages`) ↔ IR.
//!
//! Anthropic's content blocks are the IR's, so little is lost: `cache_control` breakpoints on
//! tools, system parts and content blocks are kept as [`Request::cache_marks`] and written back
//! for an Anthropic upstream (those inside a tool result's blocks are lost, as are tool results
//! made of blocks other than text); Gemini tool-call signatures travel in the tool-use id.
//!
//! Request fields: `thinking` and `output_config.effort` map to [`Reasoning`]; another
//! format's reasoning is sent as `thinking` with a budget under `max_tokens` (none when
//! `max_tokens` leaves less than Anthropic's 1024-token floor). `output_config.format` maps to
//! [`OutputFormat::JsonSchema`]; schemaless JSON from another format is lost (Anthropic needs
//! a schema), as are `seed` and the penalties (Anthropic has none). [`PASSTHROUGH`] fields
//! reach Anthropic upstreams only. Ignored: caller identity (`metadata`, `user_profile_id`),
//! account selection (`workspace_id`), and `service_tier`, `speed` and `inference_geo`, which
//! are priced apart from the registry's prices.

use serde_json::{json, Map, Value};

use super::stream::{write_sse, BlockKind, Delta, Event};
use super::wire::{self, array, count, object, opt_f64, opt_str, opt_u64, req_str, Drift};
use super::{decode_call_id, encode_call_id, Block, Decoded, Image, Message, Request, Response, Role, StopReason};
use super::{CacheMark, CachePoint};
use super::{Effort, OutputFormat, Reasoning, Tool, ToolCall, ToolChoice, ToolResult, Usage};
use crate::json::write_str;
use crate::websearch::{self as ws, Search};

pub(crate) const MAPPED: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "temperature",
    "top_p",
    "stop_sequences",
    "stream",
    "tools",
    "tool_choice",
    "top_k",
    "thinking",
    "output_config",
];

/// Fields the IR does not model, carried verbatim to an upstream of this format.
pub(crate) const PASSTHROUGH: &[&str] = &["cache_control", "container", "diagnostics"];

/// Mapped fields with more in them than the IR holds: the same format gets the caller's value.
const KEPT: &[&str] = &["thinking", "output_config"];

/// Known and not carried (see the module docs).
pub(crate) const IGNORED: &[&str] = &[
    "metadata",
    "service_tier",
    "user_profile_id",
    "workspace_id",
    "speed",
    "inference_geo",
];

/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: u64 = 1024;

/// Block fields every block may carry and the IR drops (see the module docs).
const BLOCK_COMMON: &[&str] = &["type", "cache_control"];

pub(crate) fn decode_request(value: &Value) -> Result<Decoded<Request>, String> {
    let body = object(value, "body")?;
    let mut drift = Drift::default();
    drift.check("", body, &[MAPPED, PASSTHROUGH, IGNORED].concat());
    let mut request = Request {
        model: opt_str(body, "model")?.unwrap_or_default().to_owned(),
        max_tokens: opt_u64(body, "max_tokens")?,
        temperature: opt_f64(body, "temperature")?,
        top_p: opt_f64(body, "top_p")?,
        top_k: opt_u64(body, "top_k")?,
        stop: wire::stop_list(body.get("stop_sequences"))?,
        stream: wire::flag(body, "stream")?,
        reasoning: decode_reasoning(body),
        output_format: body
            .get("output_config")
            .and_then(|c| c.get("format"))
            .and_then(|format| {
                (format.get("type")?.as_str()? == "json_schema").then(|| OutputFormat::JsonSchema {
                    name: String::new(),
                    schema: format.get("schema").cloned().unwrap_or_else(wire::empty_schema),
                    strict: None,
                })
            }),
        ..Request::default()
    };
    wire::keep(body, &[PASSTHROUGH, KEPT].concat(), &mut request.passthrough);
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => request.system.push(s.clone()),
        Some(blocks) => {
            for block in array(blocks, "system")? {
                let block = object(block, "system block")?;
                drift.check("system[]", block, &[BLOCK_COMMON, &["text", "citations"]].concat());
                let at = CachePoint::System(request.system.len());
                keep_mark(&mut request, block, at);
                request.system.push(req_str(block, "text")?.to_owned());
            }
        }
    }
    for message in array(body.get("messages").unwrap_or(&Value::Null), "messages")? {
        let message = object(message, "message")?;
        drift.check("messages[]", message, &["role", "content"]);
        let role = match req_str(message, "role")? {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            other => return Err(format!("unknown message role {other:?}")),
        };
        let mut marks = Vec::new();
        let content = match message.get("content").unwrap_or(&Value::Null) {
            Value::String(s) => vec![Block::Text(s.clone())],
            blocks => decode_blocks(array(blocks, "content")?, &mut drift, &mut marks)?,
        };
        let index = request.messages.len();
        request
            .cache_marks
            .extend(marks.into_iter().map(|(block, control)| CacheMark {
                at: CachePoint::Block { message: index, block },
                control,
            }));
        request.messages.push(Message { role, content });
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        for tool in array(tools, "tools")? {
            let tool = object(tool, "tool")?;
            drift.check(
                "tools[]",
                tool,
                &["type", "name", "description", "input_schema", "cache_control"],
            );
            if opt_str(tool, "type")?.is_some_and(|t| t != "custom") {
                // NOTE: server tools (web search, code execution, ...) have no IR form.
                drift.note(format!("tools[].type={}", req_str(tool, "type")?));
                continue;
            }
            let at = CachePoint::Tool(request.tools.len());
            keep_mark(&mut request, tool, at);
            request.tools.push(Tool {
                name: req_str(tool, "name")?.to_owned(),
                description: opt_str(tool, "description")?.map(str::to_owned),
                parameters: tool.get("input_schema").cloned().unwrap_or_else(wire::empty_schema),
            });
        }
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        let choice = object(choice, "tool_choice")?;
        drift.check("tool_choice", choice, &["type", "name", "disable_parallel_tool_use"]);
        request.parallel_tool_calls = wire::opt_bool(choice, "disable_parallel_tool_use")?.map(|disable| !disable);
        request.tool_choice = Some(match req_str(choice, "type")? {
            "auto" => ToolChoice::Auto,
            "any" => ToolChoice::Required,
            "none" => ToolChoice::None,
            "tool" => ToolChoice::Tool(req_str(choice, "name")?.to_owned()),
            other => return Err(format!("unknown tool_choice type {other:?}")),
        });
    }
    Ok(Decoded {
        value: request,
        unknown: drift.unknown,
    })
}

/// `thinking` with `output_config.effort`: a budget or a switch, else the effort level.
fn decode_reasoning(body: &Map<String, Value>) -> Option<Reasoning> {
    let effort = body
        .get("output_config")
        .and_then(|c| c.get("effort")?.as_str())
        .and_then(Effort::parse);
    let by_effort = effort.map(Reasoning::Effort);
    let Some(thinking) = body.get("thinking").filter(|t| !t.is_null()) else {
        return by_effort;
    };
    match thinking.get("type").and_then(Value::as_str) {
        Some("enabled") => thinking
            .get("budget_tokens")
            .and_then(Value::as_u64)
            .map(Reasoning::Budget),
        Some("disabled") => Some(Reasoning::Off),
        _ => by_effort.or(Some(Reasoning::Auto)),
    }
}

/// `thinking` for another format's reasoning: a budget under `max_tokens`, or `None` when
/// there is no room for Anthropic's minimum.
fn encode_thinking(reasoning: Reasoning, max_tokens: u64) -> Option<Value> {
    let Some(budget) = reasoning.budget_tokens() else {
        return Some(json!({"type": "disabled"}));
    };
    let budget = budget.max(MIN_THINKING_BUDGET).min(max_tokens.saturating_sub(1));
    (budget >= MIN_THINKING_BUDGET).then(|| json!({"type": "enabled", "budget_tokens": budget}))
}

/// Keeps a caller's `cache_control` at `at` (an object; anything else is not a breakpoint).
fn keep_mark(request: &mut Request, item: &Map<String, Value>, at: CachePoint) {
    if let Some(control @ Value::Object(_)) = item.get("cache_control") {
        request.cache_marks.push(CacheMark {
            at,
            control: control.clone(),
        });
    }
}

/// The blocks of a content array; `marks` gets `(IR block index, cache_control)` of each block
/// carrying a breakpoint.
fn decode_blocks(blocks: &[Value], drift: &mut Drift, marks: &mut Vec<(usize, Value)>) -> Result<Vec<Block>, String> {
    let mut out = Vec::with_capacity(blocks.len());
    for block in blocks {
        let block = object(block, "content block")?;
        let kind = req_str(block, "type")?;
        let known: &[&str] = match kind {
            "text" => &["text", "citations"],
            "image" => &["source"],
            "thinking" => &["thinking", "signature"],
            "redacted_thinking" => &["data"],
            "tool_use" => &["id", "name", "input"],
            "tool_result" => &["tool_use_id", "content", "is_error"],
            _ => {
                drift.note(format!("messages[].content[].type={kind}"));
                continue;
            }
        };
        drift.check(
            &format!("messages[].content[{kind}]"),
            block,
            &[BLOCK_COMMON, known].concat(),
        );
        if let Some(control @ Value::Object(_)) = block.get("cache_control") {
            marks.push((out.len(), control.clone()));
        }
        out.push(decode_block(kind, block)?);
    }
    Ok(out)
}

fn decode_block(kind: &str, block: &Map<String, Value>) -> Result<Block, String> {
    Ok(match kind {
        "text" => Block::Text(req_str(block, "text")?.to_owned()),
        "image" => {
            let source = object(block.get("source").unwrap_or(&Value::Null), "image source")?;
            Block::Image(match req_str(source, "type")? {
                "base64" => Image::Base64 {
                    media_type: req_str(source, "media_type")?.to_owned(),
                    data: req_str(source, "data")?.to_owned(),
                },
                "url" => Image::Url(req_str(source, "url")?.to_owned()),
                other => return Err(format!("unsupported image source {other:?}")),
            })
        }
        "thinking" => Block::Thinking {
            text: req_str(block, "thinking")?.to_owned(),
            signature: opt_str(block, "signature")?
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        },
        "redacted_thinking" => Block::RedactedThinking(req_str(block, "data")?.to_owned()),
        "tool_use" => {
            let (id, signature) = decode_call_id(req_str(block, "id")?);
            Block::ToolCall(ToolCall {
                id,
                name: req_str(block, "name")?.to_owned(),
                arguments: wire::args_text(block.get("input")),
                signature,
            })
        }
        _ => {
            let content = match block.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(parts) => {
                    // NOTE: only the text of a block-list result has an IR form.
                    array(parts, "tool_result content")?
                        .iter()
                        .filter_map(|p| p.get("text")?.as_str())
                        .collect()
                }
            };
            Block::ToolResult(ToolResult {
                id: decode_call_id(req_str(block, "tool_use_id")?).0,
                name: String::new(),
                content,
                is_error: wire::flag(block, "is_error")?,
            })
        }
    })
}

fn encode_block(block: &Block) -> Value {
    match block {
        Block::Text(text) => json!({"type": "text", "text": text}),
        Block::Image(Image::Base64 { media_type, data }) => {
            json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
        }
        Block::Image(Image::Url(url)) => json!({"type": "image", "source": {"type": "url", "url": url}}),
        Block::Thinking { text, signature } => {
            json!({"type": "thinking", "thinking": text, "signature": signature.as_deref().unwrap_or_default()})
        }
        Block::RedactedThinking(data) => json!({"type": "redacted_thinking", "data": data}),
        Block::ToolCall(call) => json!({
            "type": "tool_use",
            "id": encode_call_id(&call.id, call.signature.as_deref()),
            "name": call.name,
            "input": wire::args_value(&call.arguments),
        }),
        Block::ToolResult(result) => {
            let mut value = json!({"type": "tool_result", "tool_use_id": result.id, "content": result.content});
            if result.is_error {
                value["is_error"] = json!(true);
            }
            value
        }
    }
}

pub(crate) fn encode_request(request: &Request) -> Result<Value, String> {
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    // NOTE: Anthropic requires max_tokens; translate_request fills the registry default first.
    let max_tokens = request.max_tokens.ok_or("max_tokens is required")?;
    body.insert("max_tokens".into(), json!(max_tokens));
    match request.system.as_slice() {
        [] => {}
        [one] => {
            body.insert("system".into(), json!(one));
        }
        parts => {
            body.insert(
                "system".into(),
                parts.iter().map(|t| json!({"type": "text", "text": t})).collect(),
            );
        }
    }
    let messages = request.messages.iter().map(|m| {
        let role = if m.role == Role::User { "user" } else { "assistant" };
        json!({"role": role, "content": m.content.iter().map(encode_block).collect::<Vec<_>>()})
    });
    body.insert("messages".into(), messages.collect());
    if !request.tools.is_empty() {
        let tools = request.tools.iter().map(|tool| {
            let mut value = json!({"name": tool.name, "input_schema": tool.parameters});
            if let Some(description) = &tool.description {
                value["description"] = json!(description);
            }
            value
        });
        body.insert("tools".into(), tools.collect());
    }
    if let Some(choice) = &request.tool_choice {
        let value = match choice {
            ToolChoice::Auto => json!({"type": "auto"}),
            ToolChoice::None => json!({"type": "none"}),
            ToolChoice::Required => json!({"type": "any"}),
            ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
        };
        body.insert("tool_choice".into(), value);
    }
    if let (Some(false), false) = (request.parallel_tool_calls, request.tools.is_empty()) {
        let choice = body.entry("tool_choice").or_insert_with(|| json!({"type": "auto"}));
        if choice["type"] != "none" {
            choice["disable_parallel_tool_use"] = json!(true);
        }
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(k) = request.top_k {
        body.insert("top_k".into(), json!(k));
    }
    if !request.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(request.stop));
    }
    if let Some(thinking) = request.reasoning.and_then(|r| encode_thinking(r, max_tokens)) {
        body.insert("thinking".into(), thinking);
    }
    if let Some(OutputFormat::JsonSchema { schema, .. }) = &request.output_format {
        body.insert(
            "output_config".into(),
            json!({"format": {"type": "json_schema", "schema": schema}}),
        );
    }
    if request.stream {
        body.insert("stream".into(), json!(true));
    }
    Ok(Value::Object(body))
}

fn decode_stop(reason: &str) -> StopReason {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        "stop_sequence" => StopReason::StopSequence,
        "tool_use" => StopReason::ToolUse,
        "refusal" => StopReason::ContentFilter,
        _ => StopReason::EndTurn,
    }
}

fn encode_stop(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn => "end_turn",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopSequence => "stop_sequence",
        StopReason::ToolUse => "tool_use",
        StopReason::ContentFilter => "refusal",
    }
}

fn decode_usage(usage: &Map<String, Value>) -> Usage {
    let cache_write_tokens = count(Some(usage), "cache_creation_input_tokens");
    // The split by lifetime, where the API reports it; the 1 h part never exceeds the total.
    let by_ttl = usage.get("cache_creation").and_then(Value::as_object);
    Usage {
        input_tokens: count(Some(usage), "input_tokens"),
        output_tokens: count(Some(usage), "output_tokens"),
        cache_read_tokens: count(Some(usage), "cache_read_input_tokens"),
        cache_write_tokens,
        cache_write_1h_tokens: count(by_ttl, "ephemeral_1h_input_tokens").min(cache_write_tokens),
    }
}

fn encode_usage(usage: &Usage) -> Value {
    let mut out = json!({
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
    });
    if usage.cache_write_1h_tokens > 0 {
        let one_hour = usage.cache_write_1h_tokens.min(usage.cache_write_tokens);
        out["cache_creation"] = json!({
            "ephemeral_5m_input_tokens": usage.cache_write_tokens - one_hour,
            "ephemeral_1h_input_tokens": one_hour,
        });
    }
    out
}

pub(crate) fn decode_response(value: &Value) -> Result<Response, String> {
    let body = object(value, "body")?;
    let mut ignored = Drift::default();
    Ok(Response {
        id: opt_str(body, "id")?.unwrap_or_default().to_owned(),
        model: opt_str(body, "model")?.unwrap_or_default().to_owned(),
        content: decode_blocks(
            array(body.get("content").unwrap_or(&Value::Null), "content")?,
            &mut ignored,
            &mut Vec::new(),
        )?,
        stop_reason: opt_str(body, "stop_reason")?.map(decode_stop),
        usage: body
            .get("usage")
            .and_then(Value::as_object)
            .map(decode_usage)
            .unwrap_or_default(),
    })
}

pub(crate) fn encode_response(response: &Response) -> Value {
    json!({
        "id": response.id,
        "type": "message",
        "role": "assistant",
        "model": response.model,
        "content": response.content.iter().map(encode_block).collect::<Vec<_>>(),
        "stop_reason": response.stop_reason.map(encode_stop),
        "stop_sequence": null,
        "usage": encode_usage(&response.usage),
    })
}

/// Messages event-stream decoding state. Anthropic's block indices are the IR's.
#[derive(Debug, Default)]
pub(crate) struct StreamDecoder;

impl StreamDecoder {
    pub(crate) fn event(&mut self, name: &str, data: &str, out: &mut Vec<Event>) -> Result<(), String> {
        let value: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
        let event = object(&value, "event")?;
        let kind = opt_str(event, "type")?.unwrap_or(name);
        let index = || -> Result<usize, String> {
            let index = opt_u64(event, "index")?.ok_or("index is missing")?;
            usize::try_from(index).map_err(|e| e.to_string())
        };
        match kind {
            "message_start" => {
                let message = object(event.get("message").unwrap_or(&Value::Null), "message")?;
                out.push(Event::Start {
                    id: opt_str(message, "id")?.unwrap_or_default().to_owned(),
                    model: opt_str(message, "model")?.unwrap_or_default().to_owned(),
                });
                if let Some(usage) = message.get("usage").and_then(Value::as_object) {
                    out.push(Event::Usage(decode_usage(usage)));
                }
            }
            "content_block_start" => {
                let index = index()?;
                let block = object(event.get("content_block").unwrap_or(&Value::Null), "content_block")?;
                let (kind, first) = match req_str(block, "type")? {
                    "text" => (
                        BlockKind::Text,
                        opt_str(block, "text")?.map(|t| Delta::Text(t.to_owned())),
                    ),
                    "thinking" => (
                        BlockKind::Thinking,
                        opt_str(block, "thinking")?.map(|t| Delta::Thinking(t.to_owned())),
                    ),
                    "redacted_thinking" => (BlockKind::RedactedThinking(req_str(block, "data")?.to_owned()), None),
                    "tool_use" => {
                        let (id, signature) = decode_call_id(req_str(block, "id")?);
                        (
                            BlockKind::ToolCall {
                                id,
                                name: req_str(block, "name")?.to_owned(),
                                signature,
                            },
                            None,
                        )
                    }
                    other => return Err(format!("unsupported content block {other:?}")),
                };
                out.push(Event::BlockStart { index, block: kind });
                if let Some(delta) = first.filter(|d| !matches!(d, Delta::Text(t) | Delta::Thinking(t) if t.is_empty()))
                {
                    out.push(Event::Delta { index, delta });
                }
            }
            "content_block_delta" => {
                let index = index()?;
                let delta = object(event.get("delta").unwrap_or(&Value::Null), "delta")?;
                let delta = match req_str(delta, "type")? {
                    "text_delta" => Delta::Text(req_str(delta, "text")?.to_owned()),
                    "thinking_delta" => Delta::Thinking(req_str(delta, "thinking")?.to_owned()),
                    "signature_delta" => Delta::Signature(req_str(delta, "signature")?.to_owned()),
                    "input_json_delta" => Delta::Arguments(req_str(delta, "partial_json")?.to_owned()),
                    other => return Err(format!("unsupported delta {other:?}")),
                };
                out.push(Event::Delta { index, delta });
            }
            "content_block_stop" => out.push(Event::BlockStop { index: index()? }),
            "message_delta" => {
                if let Some(usage) = event.get("usage").and_then(Value::as_object) {
                    out.push(Event::Usage(decode_usage(usage)));
                }
                let delta = event.get("delta").and_then(Value::as_object);
                if let Some(reason) = delta.map(|d| opt_str(d, "stop_reason")).transpose()?.flatten() {
                    out.push(Event::Finish(decode_stop(reason)));
                }
            }
            "message_stop" => out.push(Event::End),
            "error" => out.push(Event::Error(
                event.get("error").map(Value::to_string).unwrap_or_default(),
            )),
            _ => {}
        }
        Ok(())
    }
}

/// Messages event-stream encoding state.
#[derive(Debug, Default)]
pub(crate) struct StreamEncoder {
    /// `message_start` waits for the usage that follows it in the same upstream chunk.
    pending_start: Option<(String, String)>,
    /// IR block index → Anthropic `index`.
    indices: Vec<(usize, usize)>,
    usage: Usage,
    stop_reason: Option<StopReason>,
}

impl StreamEncoder {
    pub(crate) fn encode(&mut self, event: &Event, out: &mut Vec<u8>) {
        if let Event::Usage(usage) = event {
            self.usage.merge(usage);
            return;
        }
        if let Event::Start { id, model } = event {
            self.pending_start = Some((id.clone(), model.clone()));
            return;
        }
        self.flush(out);
        match event {
            Event::BlockStart { index, block } => {
                let wire_index = self.indices.len();
                self.indices.push((*index, wire_index));
                let block = match block {
                    BlockKind::Text => json!({"type": "text", "text": ""}),
                    BlockKind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                    BlockKind::RedactedThinking(data) => json!({"type": "redacted_thinking", "data": data}),
                    BlockKind::ToolCall { id, name, signature } => {
                        json!({"type": "tool_use", "id": encode_call_id(id, signature.as_deref()), "name": name, "input": {}})
                    }
                };
                let data = json!({"type": "content_block_start", "index": wire_index, "content_block": block});
                write_sse(out, "content_block_start", &data);
            }
            Event::Delta { index, delta } => {
                let Some(wire_index) = self.wire_index(*index) else {
                    return;
                };
                let delta = match delta {
                    Delta::Text(text) => json!({"type": "text_delta", "text": text}),
                    Delta::Thinking(text) => json!({"type": "thinking_delta", "thinking": text}),
                    Delta::Signature(signature) => json!({"type": "signature_delta", "signature": signature}),
                    Delta::Arguments(json) => json!({"type": "input_json_delta", "partial_json": json}),
                };
                let data = json!({"type": "content_block_delta", "index": wire_index, "delta": delta});
                write_sse(out, "content_block_delta", &data);
            }
            Event::BlockStop { index } => {
                let Some(wire_index) = self.wire_index(*index) else {
                    return;
                };
                write_sse(
                    out,
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": wire_index}),
                );
            }
            Event::Finish(reason) => self.stop_reason = Some(*reason),
            // NOTE: a web search's pages have no event in this format (only Mesh NDJSON streams them).
            Event::Sources(_) => {}
            Event::End => {
                // NOTE: usage goes out whole at the end (input_tokens included, API.md), as
                // upstreams that report usage last cannot fill message_start.
                let delta = json!({"stop_reason": self.stop_reason.map(encode_stop), "stop_sequence": null});
                let data = json!({"type": "message_delta", "delta": delta, "usage": encode_usage(&self.usage)});
                write_sse(out, "message_delta", &data);
                write_sse(out, "message_stop", &json!({"type": "message_stop"}));
            }
            Event::Error(message) => {
                let data = json!({"type": "error", "error": {"type": "api_error", "message": message}});
                write_sse(out, "error", &data);
            }
            Event::Start { .. } | Event::Usage(_) => {}
        }
    }

    /// Writes a held `message_start`.
    pub(crate) fn flush(&mut self, out: &mut Vec<u8>) {
        if let Some((id, model)) = self.pending_start.take() {
            let message = json!({
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": encode_usage(&self.usage),
            });
            write_sse(
                out,
                "message_start",
                &json!({"type": "message_start", "message": message}),
            );
        }
    }

    fn wire_index(&self, index: usize) -> Option<usize> {
        self.indices.iter().find(|(i, _)| *i == index).map(|&(_, w)| w)
    }
}

// --- web search (mesh-behaviour §4.5) ---------------------------------------------------------

/// Reads one upstream event's web search (mesh-behaviour §4.5): `web_search_tool_result`
/// blocks, `citations_delta`s and the reported `web_search_requests`.
pub(crate) fn observe_search(search: &mut Search, event: &Value) {
    match event.get("type").and_then(Value::as_str) {
        Some("content_block_start") => {
            let block = event
                .get("content_block")
                .filter(|b| ws::is_type(b, "web_search_tool_result"));
            for result in ws::array(block, "content")
                .iter()
                .filter(|r| ws::is_type(r, "web_search_result"))
            {
                search.cite(
                    ws::text(result, "url"),
                    ws::text(result, "title"),
                    "",
                    ws::text(result, "page_age"),
                );
            }
        }
        Some("content_block_delta") => {
            let delta = event.get("delta").filter(|d| ws::is_type(d, "citations_delta"));
            if let Some(citation) = delta.and_then(|d| d.get("citation")).filter(|c| c.is_object()) {
                search.cite(
                    ws::text(citation, "url"),
                    ws::text(citation, "title"),
                    ws::text(citation, "cited_text"),
                    "",
                );
            }
        }
        _ => {}
    }
    let reported = search_requests(event.get("usage")).or_else(|| search_requests(event.get("message")?.get("usage")));
    if let Some(n) = reported {
        search.report(n);
    }
}

/// `usage.server_tool_use.web_search_requests` of `usage`, truncated to an int as Mesh does.
fn search_requests(usage: Option<&Value>) -> Option<i64> {
    let n = usage?.get("server_tool_use")?.get("web_search_requests")?;
    n.as_i64().or_else(|| {
        #[expect(clippy::cast_possible_truncation, reason = "Mesh truncates a JSON number to an int")]
        n.as_f64().map(|f| f as i64)
    })
}

// --- errors in this API's shape (API.md "Standard routes") ------------------------------------

/// The error category the Anthropic SDK maps `status` to.
fn error_category(status: u16) -> &'static str {
    match status {
        400 | 413 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {type, message, category, detectors?}}`; the Mesh `code` is the
/// error's `type`.
pub(crate) fn write_error(out: &mut Vec<u8>, status: u16, code: &str, message: &str, detectors: &[String]) {
    out.extend_from_slice(b"{\"type\":\"error\",\"error\":{\"type\":");
    write_str(out, code);
    out.extend_from_slice(b",\"message\":");
    write_str(out, message);
    out.extend_from_slice(b",\"category\":");
    write_str(out, error_category(status));
    wire::write_detectors(out, detectors);
    out.extend_from_slice(b"}}");
}

#[cfg(test)]
mod tests {
    use super::super::stream::Decoder;
    use super::super::{decode_request, decode_response, Format};
    use super::*;

    /// As the anthropic SDK sends a second tool-use turn with extended thinking.
    const SDK_REQUEST: &str = r##"{
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
                {"type": "text", "text": "Weather where this was taken?"}
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Looks like Paris.", "signature": "EqQBCgIYAh"},
                {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "18C", "is_error": false}
            ]}
        ],
        "tools": [{"name": "get_weather", "description": "Weather now",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "any"},
        "thinking": {"type": "enabled", "budget_tokens": 512},
        "stop_sequences": ["--"],
        "metadata": {"user_id": "u-1"}
    }"##;

    #[test]
    fn test_sdk_request_keeps_thinking_signature_and_maps_thinking_config() {
        let decoded = decode_request(Format::Anthropic, SDK_REQUEST.as_bytes()).unwrap();
        assert!(decoded.unknown.is_empty(), "{:?}", decoded.unknown);
        let request = decoded.value;
        assert_eq!(request.reasoning, Some(Reasoning::Budget(512)));
        assert_eq!(request.system, ["Be brief."]);
        assert_eq!(request.tool_choice, Some(ToolChoice::Required));
        assert_eq!(
            request.messages[1].content[0],
            Block::Thinking {
                text: "Looks like Paris.".into(),
                signature: Some("EqQBCgIYAh".into())
            }
        );
        assert!(matches!(&request.messages[1].content[1], Block::ToolCall(c) if c.arguments == r#"{"city":"Paris"}"#));
        assert!(matches!(&request.messages[2].content[0], Block::ToolResult(r) if r.name == "get_weather"));
    }

    #[test]
    fn test_unknown_block_type_is_reported_not_fatal() {
        let body = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
            {"type": "text", "text": "hi", "citations": null, "extra": 1}]}]});
        let decoded = decode_request(Format::Anthropic, body.to_string().as_bytes()).unwrap();
        assert_eq!(
            decoded.unknown,
            ["messages[].content[].type=document", "messages[].content[text].extra"]
        );
        assert_eq!(decoded.value.messages[0].content, [Block::Text("hi".into())]);
    }

    #[test]
    fn test_response_usage_keeps_cache_classes() {
        let body = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "Hi"}], "stop_reason": "max_tokens", "stop_sequence": null,
            "usage": {"input_tokens": 3, "output_tokens": 2, "cache_creation_input_tokens": 10, "cache_read_input_tokens": 20}});
        let response = decode_response(Format::Anthropic, body.to_string().as_bytes()).unwrap();
        assert_eq!(response.stop_reason, Some(StopReason::MaxTokens));
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 3,
                output_tokens: 2,
                cache_read_tokens: 20,
                cache_write_tokens: 10,
                cache_write_1h_tokens: 0
            }
        );
    }

    #[test]
    fn test_one_hour_cache_writes_are_kept_apart_and_never_exceed_the_writes() {
        let usage = |creation: Value| {
            let mut u = json!({"input_tokens": 3, "output_tokens": 2, "cache_creation_input_tokens": 10,
                               "cache_read_input_tokens": 20});
            u["cache_creation"] = creation;
            decode_usage(u.as_object().unwrap())
        };
        let split = usage(json!({"ephemeral_5m_input_tokens": 6, "ephemeral_1h_input_tokens": 4}));
        assert_eq!((split.cache_write_tokens, split.cache_write_1h_tokens), (10, 4));
        let encoded = encode_usage(&split);
        assert_eq!(
            encoded["cache_creation"],
            json!({"ephemeral_5m_input_tokens": 6, "ephemeral_1h_input_tokens": 4})
        );
        assert_eq!(
            decode_usage(encoded.as_object().unwrap()),
            split,
            "the split survives a round trip"
        );
        assert_eq!(
            usage(json!({"ephemeral_1h_input_tokens": 99})).cache_write_1h_tokens,
            10,
            "clamped to the writes"
        );
        assert_eq!(usage(Value::Null).cache_write_1h_tokens, 0);
        assert!(
            encode_usage(&usage(Value::Null)).get("cache_creation").is_none(),
            "no split, no field"
        );
    }

    #[test]
    fn test_event_stream_with_thinking_and_tool_use_decodes() {
        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: ping\ndata: {\"type\": \"ping\"}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"1}\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let mut decoder = Decoder::new(Format::Anthropic);
        let mut events = Vec::new();
        decoder.feed(stream.as_bytes(), &mut events);
        let mut acc = super::super::stream::Accumulator::default();
        events.iter().for_each(|e| acc.push(e));
        let response = acc.response();
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 9,
                output_tokens: 15,
                ..Usage::default()
            }
        );
        assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(
            response.content,
            [
                Block::Thinking {
                    text: "hm".into(),
                    signature: Some("sig".into())
                },
                Block::ToolCall(ToolCall {
                    id: "toolu_1".into(),
                    name: "f".into(),
                    arguments: "{\"a\":1}".into(),
                    signature: None
                }),
            ]
        );
        assert_eq!(events.last(), Some(&Event::End));
    }
}
