//! Prompt-cache shaping (Cosmos §7): what the gateway adds to an upstream body so providers
//! serve repeated prefixes from their prompt cache.
//!
//! - **Anthropic** caches up to a `cache_control` breakpoint. A caller's own breakpoints
//!   ([`Request::cache_marks`], decoded from an Anthropic body) are written back where they
//!   were; a caller that set none (nor the top-level `cache_control`) gets three when shaping is
//!   on: the last tool (tools come first in the prompt), the last system part, and the last
//!   block of the conversation that can carry one (not thinking, not empty text): the next turn
//!   repeats everything up to it, so it is read from the cache then. Anthropic allows four.
//! - **OpenAI** (Chat and Responses) routes requests with the same `prompt_cache_key` to the
//!   same cache: the gateway sends an opaque keyed hash of the principal, so one person's or
//!   application's calls share a cache and no identity leaves.
//! - Other formats cache without hints and are left alone.

use serde_json::{json, Value};

use super::{Block, CachePoint, CacheShaping, Format, Request};

/// Writes the call's breakpoints or cache key into `body`, the encoded request of `format`.
pub(crate) fn apply(format: Format, body: &mut Value, request: &Request) {
    match format {
        Format::Anthropic => {
            if !request.cache_marks.is_empty() {
                for mark in &request.cache_marks {
                    place(body, &mark.at, mark.control.clone());
                }
                return;
            }
            let caller_set = request.passthrough.format == Some(Format::Anthropic)
                && request.passthrough.fields.contains_key("cache_control");
            if let (Some(CacheShaping::Breakpoints { one_hour }), false) = (&request.cache_shaping, caller_set) {
                let control = if *one_hour {
                    json!({"type": "ephemeral", "ttl": "1h"})
                } else {
                    json!({"type": "ephemeral"})
                };
                for at in breakpoints(request) {
                    place(body, &at, control.clone());
                }
            }
        }
        Format::OpenAiChat | Format::OpenAiResponses => {
            if let (Some(CacheShaping::Key(key)), Value::Object(map)) = (&request.cache_shaping, body) {
                map.insert("prompt_cache_key".into(), json!(key));
            }
        }
        Format::Gemini | Format::Ollama => {}
    }
}

/// Where shaping puts Anthropic breakpoints: the last tool, the last non-empty system part and
/// the last block of the conversation that may carry one.
#[must_use]
pub fn breakpoints(request: &Request) -> Vec<CachePoint> {
    let mut points = Vec::with_capacity(3);
    if !request.tools.is_empty() {
        points.push(CachePoint::Tool(request.tools.len() - 1));
    }
    if let Some(part) = request.system.iter().rposition(|s| !s.is_empty()) {
        points.push(CachePoint::System(part));
    }
    let last = request.messages.iter().enumerate().rev().find_map(|(m, message)| {
        let b = message.content.iter().rposition(|block| match block {
            Block::Text(text) => !text.is_empty(),
            Block::Thinking { .. } | Block::RedactedThinking(_) => false,
            Block::Image(_) | Block::ToolCall(_) | Block::ToolResult(_) => true,
        })?;
        Some(CachePoint::Block { message: m, block: b })
    });
    points.extend(last);
    points
}

/// Sets `cache_control` at `at` in an Anthropic body; a system prompt written as one string
/// becomes a text block first. A place the body lacks is skipped.
fn place(body: &mut Value, at: &CachePoint, control: Value) {
    let target = match at {
        CachePoint::Tool(i) => body.get_mut("tools").and_then(|t| t.get_mut(*i)),
        CachePoint::System(i) => {
            if let Some(Value::String(text)) = body.get("system") {
                let blocks = json!([{"type": "text", "text": text}]);
                body["system"] = blocks;
            }
            body.get_mut("system").and_then(|s| s.get_mut(*i))
        }
        CachePoint::Block { message, block } => body
            .get_mut("messages")
            .and_then(|m| m.get_mut(*message))
            .and_then(|m| m.get_mut("content"))
            .and_then(|c| c.get_mut(*block)),
    };
    if let Some(Value::Object(map)) = target {
        map.insert("cache_control".into(), control);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_request, encode_request, CacheMark, Message, Role, Tool};
    use super::*;

    fn request() -> Request {
        Request {
            model: "m".into(),
            max_tokens: Some(64),
            system: vec!["Be brief.".into()],
            tools: vec![
                Tool {
                    name: "a".into(),
                    description: None,
                    parameters: json!({"type": "object"}),
                },
                Tool {
                    name: "b".into(),
                    description: None,
                    parameters: json!({"type": "object"}),
                },
            ],
            messages: vec![
                Message {
                    role: Role::User,
                    content: vec![Block::Text("first".into())],
                },
                Message {
                    role: Role::Assistant,
                    content: vec![
                        Block::Text("answer".into()),
                        Block::Thinking {
                            text: "hm".into(),
                            signature: Some("s".into()),
                        },
                    ],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::Text("second".into()), Block::Text(String::new())],
                },
            ],
            ..Request::default()
        }
    }

    fn encoded(format: Format, request: &Request) -> Value {
        serde_json::from_slice(&encode_request(format, request).unwrap()).unwrap()
    }

    #[test]
    fn anthropic_gets_breakpoints_on_tools_system_and_the_last_stable_block() {
        let mut r = request();
        r.cache_shaping = Some(CacheShaping::Breakpoints { one_hour: false });
        let body = encoded(Format::Anthropic, &r);
        let five = json!({"type": "ephemeral"});
        assert_eq!(body["tools"][1]["cache_control"], five);
        assert!(body["tools"][0].get("cache_control").is_none());
        assert_eq!(
            body["system"],
            json!([{"type": "text", "text": "Be brief.", "cache_control": five}])
        );
        assert_eq!(
            body["messages"][2]["content"][0]["cache_control"], five,
            "the empty text block is skipped"
        );
        assert!(body["messages"][2]["content"][1].get("cache_control").is_none());
        let marks = body.to_string().matches("cache_control").count();
        assert_eq!(marks, 3);
        r.cache_shaping = Some(CacheShaping::Breakpoints { one_hour: true });
        let body = encoded(Format::Anthropic, &r);
        assert_eq!(
            body["tools"][1]["cache_control"],
            json!({"type": "ephemeral", "ttl": "1h"})
        );
    }

    #[test]
    fn shaping_off_or_other_formats_leave_the_body_as_encoded() {
        let plain = request();
        for format in [
            Format::Anthropic,
            Format::OpenAiChat,
            Format::OpenAiResponses,
            Format::Gemini,
            Format::Ollama,
        ] {
            let mut shaped = request();
            shaped.cache_shaping = Some(CacheShaping::Breakpoints { one_hour: false });
            if format != Format::Anthropic {
                assert_eq!(encoded(format, &shaped), encoded(format, &plain), "{format:?}");
            }
            let mut keyed = request();
            keyed.cache_shaping = Some(CacheShaping::Key("k".into()));
            let body = encoded(format, &keyed);
            let expect_key = matches!(format, Format::OpenAiChat | Format::OpenAiResponses);
            assert_eq!(body.get("prompt_cache_key").is_some(), expect_key, "{format:?}");
            if !expect_key {
                assert_eq!(body, encoded(format, &plain), "{format:?}");
            }
        }
    }

    #[test]
    fn a_callers_own_breakpoints_are_kept_and_none_are_added() {
        let wire = json!({
            "model": "m", "max_tokens": 64,
            "system": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "tools": [{"name": "a", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
                      {"name": "b", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "x"},
                {"type": "future_block", "data": 1},
                {"type": "text", "text": "y", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "z"}]}]
        });
        let mut decoded = decode_request(Format::Anthropic, &serde_json::to_vec(&wire).unwrap())
            .unwrap()
            .value;
        assert_eq!(decoded.cache_marks.len(), 3);
        let points: Vec<_> = decoded.cache_marks.iter().map(|m| m.at.clone()).collect();
        assert_eq!(
            points,
            [
                CachePoint::System(1),
                CachePoint::Block { message: 0, block: 1 },
                CachePoint::Tool(0)
            ],
            "IR indexes: the unknown block is skipped"
        );
        decoded.cache_shaping = Some(CacheShaping::Breakpoints { one_hour: false });
        let body = encoded(Format::Anthropic, &decoded);
        assert_eq!(body["tools"][0]["cache_control"], json!({"type": "ephemeral"}));
        assert!(body["tools"][1].get("cache_control").is_none());
        assert_eq!(
            body["system"][1]["cache_control"],
            json!({"type": "ephemeral", "ttl": "1h"})
        );
        assert!(body["system"][0].get("cache_control").is_none());
        assert_eq!(body["messages"][0]["content"][1]["text"], "y");
        assert_eq!(
            body["messages"][0]["content"][1]["cache_control"],
            json!({"type": "ephemeral"})
        );
        assert!(body["messages"][0]["content"][2].get("cache_control").is_none());
        assert_eq!(body.to_string().matches("cache_control").count(), 3);
        // The top-level switch (automatic caching) counts as the caller's choice too.
        let mut auto = wire.clone();
        for tool in auto["tools"].as_array_mut().unwrap() {
            tool.as_object_mut().unwrap().remove("cache_control");
        }
        auto["system"] = json!("S");
        auto["messages"] = json!([{"role": "user", "content": "hi"}]);
        auto["cache_control"] = json!({"type": "ephemeral"});
        let mut decoded = decode_request(Format::Anthropic, &serde_json::to_vec(&auto).unwrap())
            .unwrap()
            .value;
        assert!(decoded.cache_marks.is_empty());
        decoded.cache_shaping = Some(CacheShaping::Breakpoints { one_hour: false });
        let body = encoded(Format::Anthropic, &decoded);
        assert_eq!(body.to_string().matches("cache_control").count(), 1);
        let _ = CacheMark {
            at: CachePoint::Tool(0),
            control: Value::Null,
        };
    }
}
