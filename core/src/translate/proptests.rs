//! Property tests across the codecs: IR → wire → IR is the identity for what each format can
//! carry, and a streamed translation under any chunking amounts to the non-streamed one.

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::Value;

use super::stream::{encode_stream, Accumulator, Decoder, Translator};
use super::wire::sniff_media_type;
use super::*;

fn text() -> impl Strategy<Value = String> {
    // NOTE: multi-byte characters so chunk cuts land inside them; no leading `{`, so no text
    // reads as a JSON object (Gemini sends such tool results as objects).
    "[a-z é漢😀\"\\\\\n]{0,8}"
}

fn id() -> impl Strategy<Value = String> {
    "call_[a-zA-Z0-9]{1,6}"
}

fn signature() -> impl Strategy<Value = Option<String>> {
    proptest::option::of("[A-Za-z0-9+/=]{1,12}")
}

fn arguments() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        any::<i32>().prop_map(Value::from),
        "[a-z é]{0,5}".prop_map(Value::from),
        Just(Value::Null)
    ];
    // NOTE: serde_json's map is ordered, so this is the canonical text every codec writes.
    btree_map("[a-z]{1,4}", leaf, 0..4).prop_map(|m| Value::Object(m.into_iter().collect()).to_string())
}

fn image() -> impl Strategy<Value = Image> {
    prop_oneof![
        "[a-z]{1,6}".prop_map(|p| Image::Url(format!("https://example.com/{p}.png"))),
        (
            "iVBOR[A-Za-z0-9+/]{0,8}",
            prop_oneof![Just("image/png"), Just("image/jpeg")]
        )
            .prop_map(|(data, media_type)| Image::Base64 {
                media_type: media_type.to_owned(),
                data
            }),
    ]
}

fn call() -> impl Strategy<Value = ToolCall> {
    (id(), "[a-z_]{1,8}", arguments(), signature()).prop_map(|(id, name, arguments, signature)| ToolCall {
        id,
        name,
        arguments,
        signature,
    })
}

/// Assistant content in the order every format can hold: reasoning, text, calls.
fn assistant_content() -> impl Strategy<Value = Vec<Block>> {
    let thinking = prop_oneof![
        (text(), signature()).prop_map(|(text, signature)| Block::Thinking { text, signature }),
        "[A-Za-z0-9]{1,8}".prop_map(Block::RedactedThinking),
    ];
    (proptest::option::of(thinking), vec(text(), 0..3), vec(call(), 0..3)).prop_map(|(thinking, texts, calls)| {
        let mut content: Vec<Block> = thinking.into_iter().collect();
        content.extend(texts.into_iter().map(Block::Text));
        // Ids unique within the turn, as every API requires.
        content.extend(calls.into_iter().enumerate().map(|(i, c)| {
            Block::ToolCall(ToolCall {
                id: format!("{}{i}", c.id),
                ..c
            })
        }));
        content
    })
}

fn user_content() -> impl Strategy<Value = Vec<Block>> {
    vec(
        prop_oneof![3 => text().prop_map(Block::Text), 1 => image().prop_map(Block::Image)],
        1..4,
    )
}

/// Turns: a user message, the assistant's answer, and results for each call it made.
fn messages() -> impl Strategy<Value = Vec<Message>> {
    vec((user_content(), assistant_content(), text(), any::<bool>()), 1..4).prop_map(|turns| {
        let mut messages = Vec::new();
        for (user, assistant, output, is_error) in turns {
            let results: Vec<Block> = assistant
                .iter()
                .filter_map(|b| match b {
                    Block::ToolCall(c) => Some(Block::ToolResult(ToolResult {
                        id: c.id.clone(),
                        name: c.name.clone(),
                        content: output.clone(),
                        is_error,
                    })),
                    _ => None,
                })
                .collect();
            messages.push(Message {
                role: Role::User,
                content: user,
            });
            messages.push(Message {
                role: Role::Assistant,
                content: assistant,
            });
            if !results.is_empty() {
                messages.push(Message {
                    role: Role::User,
                    content: results,
                });
            }
        }
        messages
    })
}

fn tool() -> impl Strategy<Value = Tool> {
    ("[a-z_]{1,8}", proptest::option::of(text()), "[a-z]{1,4}").prop_map(|(name, description, property)| Tool {
        name,
        description,
        parameters: serde_json::json!({"type": "object", "properties": {property: {"type": "string"}}}),
    })
}

fn tool_choice() -> impl Strategy<Value = Option<ToolChoice>> {
    proptest::option::of(prop_oneof![
        Just(ToolChoice::Auto),
        Just(ToolChoice::None),
        Just(ToolChoice::Required),
        "[a-z_]{1,8}".prop_map(ToolChoice::Tool),
    ])
}

/// Dyadic fractions, which JSON carries exactly.
fn sampling() -> impl Strategy<Value = Option<f64>> {
    proptest::option::of((0u8..8).prop_map(|n| f64::from(n) / 4.0))
}

fn request() -> impl Strategy<Value = Request> {
    (
        (
            "[a-z0-9.-]{1,10}",
            vec(text(), 0..3),
            messages(),
            vec(tool(), 0..3),
            tool_choice(),
        ),
        (
            proptest::option::of(1u64..100_000),
            sampling(),
            sampling(),
            vec("[A-Z#]{1,4}", 0..3),
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (model, system, messages, tools, tool_choice),
                (max_tokens, temperature, top_p, stop, stream, include_usage),
            )| {
                Request {
                    model,
                    system,
                    messages,
                    tools,
                    tool_choice,
                    max_tokens,
                    temperature,
                    top_p,
                    stop,
                    stream,
                    include_usage,
                    ..Request::default()
                }
            },
        )
}

fn stop_reason() -> impl Strategy<Value = StopReason> {
    prop_oneof![
        Just(StopReason::EndTurn),
        Just(StopReason::MaxTokens),
        Just(StopReason::StopSequence),
        Just(StopReason::ToolUse),
        Just(StopReason::ContentFilter),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    (
        "[a-z0-9_]{1,10}",
        "[a-z0-9.-]{1,10}",
        assistant_content(),
        stop_reason(),
        [0u64..5000, 0..5000, 0..5000, 0..5000],
        0u64..5000,
    )
        .prop_map(
            |(id, model, content, stop, [input, output, read, write], one_hour)| Response {
                id,
                model,
                content,
                stop_reason: Some(stop),
                usage: Usage {
                    input_tokens: input,
                    output_tokens: output,
                    cache_read_tokens: read,
                    cache_write_tokens: write,
                    cache_write_1h_tokens: one_hour.min(write),
                },
            },
        )
}

/// Keeps the blocks `keep` accepts.
fn retain_blocks(messages: &mut [Message], keep: impl Fn(&mut Block) -> bool) {
    for message in messages {
        message.content.retain_mut(&keep);
    }
}

/// Gemini's join of consecutive answer text, and of thoughts up to a signed one.
fn gemini_merge(blocks: Vec<Block>) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    for block in blocks {
        match (out.last_mut(), block) {
            (_, Block::Text(t)) if t.is_empty() => {}
            (_, Block::RedactedThinking(_)) => {}
            (Some(Block::Text(last)), Block::Text(t)) => last.push_str(&t),
            (
                Some(Block::Thinking {
                    text: last,
                    signature: slot @ None,
                }),
                Block::Thinking { text, signature },
            ) => {
                last.push_str(&text);
                *slot = signature;
            }
            (_, block) => out.push(block),
        }
    }
    out
}

/// `request` cut down to what `format` carries, so a round trip must give it back unchanged.
fn restrict_request(format: Format, mut r: Request) -> Request {
    match format {
        Format::OpenAiChat => {
            r.include_usage &= r.stream;
            retain_blocks(&mut r.messages, |b| match b {
                Block::RedactedThinking(_) => false,
                Block::Thinking { text, signature } => {
                    *signature = None;
                    !text.is_empty()
                }
                Block::ToolResult(result) => {
                    result.is_error = false;
                    true
                }
                _ => true,
            });
        }
        Format::Anthropic => {
            r.include_usage = false;
            r.max_tokens.get_or_insert(1);
        }
        Format::Gemini => {
            (r.model, r.stream, r.include_usage) = (String::new(), false, false);
            retain_blocks(&mut r.messages, |b| {
                !matches!(b, Block::RedactedThinking(_)) && *b != Block::Text(String::new())
            });
        }
        Format::OpenAiResponses => {
            (r.stop, r.include_usage) = (Vec::new(), false);
            if r.system.len() > 1 {
                r.system = vec![r.system.join("\n\n")];
            }
            retain_blocks(&mut r.messages, |b| match b {
                Block::Thinking { .. } | Block::RedactedThinking(_) => false,
                Block::ToolResult(result) => {
                    result.is_error = false;
                    true
                }
                _ => true,
            });
            for message in &mut r.messages {
                if message.content.is_empty() {
                    message.content.push(Block::Text("ok".to_owned()));
                }
            }
        }
        Format::Ollama => {
            (r.tool_choice, r.include_usage) = (None, false);
            for message in &mut r.messages {
                message.content = ollama_content(message.role, std::mem::take(&mut message.content));
            }
        }
    }
    r
}

/// Ollama's message shape: one thinking, one text, images and calls; results alone.
fn ollama_content(role: Role, blocks: Vec<Block>) -> Vec<Block> {
    let (mut thinking, mut text) = (String::new(), String::new());
    let (mut images, mut rest) = (Vec::new(), Vec::new());
    for block in blocks {
        match block {
            Block::Thinking { text: t, .. } => thinking.push_str(&t),
            Block::Text(t) => text.push_str(&t),
            Block::Image(Image::Base64 { data, .. }) => {
                images.push(Block::Image(Image::Base64 {
                    media_type: sniff_media_type(&data).to_owned(),
                    data,
                }));
            }
            Block::ToolCall(c) => rest.push(Block::ToolCall(c)),
            Block::ToolResult(r) => rest.push(Block::ToolResult(ToolResult { is_error: false, ..r })),
            Block::Image(Image::Url(_)) | Block::RedactedThinking(_) => {}
        }
    }
    let mut out = Vec::new();
    if !thinking.is_empty() && role == Role::Assistant {
        out.push(Block::Thinking {
            text: thinking,
            signature: None,
        });
    }
    if !text.is_empty() {
        out.push(Block::Text(text));
    }
    out.extend(images);
    out.extend(rest);
    if role == Role::User && out.is_empty() {
        out.push(Block::Text("hi".to_owned()));
    }
    out
}

/// `response` cut down to what `format` carries.
fn restrict_response(format: Format, mut r: Response) -> Response {
    let called = r.content.iter().any(|b| matches!(b, Block::ToolCall(_)));
    let derived = |reason: Option<StopReason>| match reason {
        Some(StopReason::MaxTokens) => StopReason::MaxTokens,
        Some(StopReason::ContentFilter) => StopReason::ContentFilter,
        _ if called => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    };
    if format != Format::Anthropic {
        r.usage.input_tokens += r.usage.cache_write_tokens;
        r.usage.cache_write_tokens = 0;
        r.usage.cache_write_1h_tokens = 0;
    }
    match format {
        Format::Anthropic => {}
        Format::OpenAiChat => {
            r.content = r
                .content
                .into_iter()
                .filter_map(|b| match b {
                    Block::Thinking { text, .. } if !text.is_empty() => Some(Block::Thinking { text, signature: None }),
                    Block::Thinking { .. } | Block::RedactedThinking(_) => None,
                    Block::Text(t) if t.is_empty() => None,
                    b => Some(b),
                })
                .collect();
            let text: String = r
                .content
                .iter()
                .filter_map(|b| if let Block::Text(t) = b { Some(t.as_str()) } else { None })
                .collect();
            if let Some(first) = r.content.iter().position(|b| matches!(b, Block::Text(_))) {
                r.content.retain(|b| !matches!(b, Block::Text(_)));
                r.content.insert(first, Block::Text(text));
            }
            if r.stop_reason == Some(StopReason::StopSequence) {
                r.stop_reason = Some(StopReason::EndTurn);
            }
        }
        Format::Gemini => {
            r.content = gemini_merge(r.content);
            r.stop_reason = Some(derived(r.stop_reason));
        }
        Format::OpenAiResponses => {
            r.content.retain(|b| !matches!(b, Block::RedactedThinking(_)));
            r.stop_reason = Some(derived(r.stop_reason));
        }
        Format::Ollama => {
            r.id = String::new();
            r.content = ollama_content(Role::Assistant, r.content);
            let length = r.stop_reason == Some(StopReason::MaxTokens);
            r.stop_reason = Some(derived(if length { r.stop_reason } else { None }));
            r.usage.input_tokens += r.usage.cache_read_tokens;
            r.usage.cache_read_tokens = 0;
        }
    }
    r
}

fn format() -> impl Strategy<Value = Format> {
    proptest::sample::select(Format::ALL.to_vec())
}

/// Cuts `bytes` at the given fractions of its length.
fn chunks(bytes: &[u8], cuts: &[u16]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| bytes.len() * usize::from(c) / usize::from(u16::MAX))
        .collect();
    at.sort_unstable();
    let mut out = Vec::new();
    let mut start = 0;
    for cut in at.into_iter().chain([bytes.len()]) {
        out.push(bytes[start..cut].to_vec());
        start = cut;
    }
    out
}

/// What a stream amounts to, as the format's non-streamed body would show it.
fn stream_as_body(format: Format, bytes: &[u8]) -> Response {
    let mut decoder = Decoder::new(format);
    let mut events = Vec::new();
    decoder.feed(bytes, &mut events);
    decoder.finish(&mut events);
    assert_eq!(decoder.malformed(), 0);
    assert_eq!(
        events.last(),
        Some(&stream::Event::End),
        "{}",
        String::from_utf8_lossy(bytes)
    );
    let mut acc = Accumulator::default();
    events.iter().for_each(|e| acc.push(e));
    decode_response(format, &encode_response(format, acc.response())).unwrap()
}

fn reasoning() -> impl Strategy<Value = Reasoning> {
    let effort = proptest::sample::select(vec![
        Effort::Minimal,
        Effort::Low,
        Effort::Medium,
        Effort::High,
        Effort::XHigh,
        Effort::Max,
    ]);
    prop_oneof![
        Just(Reasoning::Off),
        Just(Reasoning::Auto),
        effort.prop_map(Reasoning::Effort),
        (0u64..70_000).prop_map(Reasoning::Budget),
    ]
}

fn output_format() -> impl Strategy<Value = OutputFormat> {
    let schema = btree_map("[a-z]{1,4}", Just(serde_json::json!({"type": "string"})), 0..3)
        .prop_map(|props| serde_json::json!({"type": "object", "properties": props}));
    prop_oneof![
        Just(OutputFormat::Json),
        ("[a-z_ ]{0,6}", schema, proptest::option::of(any::<bool>()))
            .prop_map(|(name, schema, strict)| OutputFormat::JsonSchema { name, schema, strict }),
    ]
}

/// A one-turn request with the generation options set at random, with a tool or not.
fn options_request() -> impl Strategy<Value = Request> {
    (
        (
            proptest::option::of(0u64..500),
            proptest::option::of(any::<i32>()),
            sampling(),
            sampling(),
        ),
        (proptest::option::of(any::<bool>()), proptest::option::of(reasoning())),
        (proptest::option::of(output_format()), any::<bool>(), 1u64..40_000),
    )
        .prop_map(
            |((top_k, seed, presence, frequency), (parallel, reasoning), (output, tool, max_tokens))| Request {
                model: "m".into(),
                messages: vec![Message {
                    role: Role::User,
                    content: vec![Block::Text("hi".into())],
                }],
                tools: if tool {
                    vec![Tool {
                        name: "f".into(),
                        description: None,
                        parameters: wire::empty_schema(),
                    }]
                } else {
                    Vec::new()
                },
                max_tokens: Some(max_tokens),
                top_k,
                seed: seed.map(i64::from),
                presence_penalty: presence,
                frequency_penalty: frequency,
                parallel_tool_calls: parallel,
                reasoning,
                output_format: output,
                ..Request::default()
            },
        )
}

/// What `format` gives back of `r`'s options, written out case by case from the codecs' docs.
fn expected_options(format: Format, mut r: Request) -> Request {
    let openai = matches!(format, Format::OpenAiChat | Format::OpenAiResponses);
    if openai || format == Format::Anthropic {
        // NOTE: OpenAI formats take no top_k; Responses and Anthropic take no seed or penalties.
        if openai {
            r.top_k = None;
        }
        if format != Format::OpenAiChat {
            (r.seed, r.presence_penalty, r.frequency_penalty) = (None, None, None);
        }
    }
    if r.tools.is_empty() || !matches!(format, Format::OpenAiChat | Format::OpenAiResponses | Format::Anthropic) {
        r.parallel_tool_calls = None;
    }
    r.reasoning = r.reasoning.and_then(|reasoning| match format {
        Format::OpenAiChat | Format::OpenAiResponses => reasoning.effort().map(Reasoning::Effort),
        Format::Anthropic => match reasoning.budget_tokens() {
            None => Some(Reasoning::Off),
            Some(budget) => {
                let budget = budget.max(1024).min(r.max_tokens.unwrap_or(0).saturating_sub(1));
                (budget >= 1024).then_some(Reasoning::Budget(budget))
            }
        },
        Format::Gemini => Some(match reasoning {
            Reasoning::Off | Reasoning::Budget(0) => Reasoning::Off,
            Reasoning::Auto => Reasoning::Auto,
            other => Reasoning::Budget(other.budget_tokens().unwrap_or(0).min(24_576)),
        }),
        Format::Ollama => Some(if reasoning == Reasoning::Off {
            Reasoning::Off
        } else {
            Reasoning::Auto
        }),
    });
    r.output_format = r.output_format.and_then(|output| match (format, output) {
        (Format::Anthropic, OutputFormat::Json) => None,
        (Format::OpenAiChat | Format::OpenAiResponses, OutputFormat::JsonSchema { name, schema, strict }) => {
            Some(OutputFormat::JsonSchema {
                name: wire::schema_name(&name),
                schema,
                strict,
            })
        }
        (_, OutputFormat::JsonSchema { schema, .. }) => Some(OutputFormat::JsonSchema {
            name: String::new(),
            schema,
            strict: None,
        }),
        (_, output) => Some(output),
    });
    if format == Format::Gemini {
        r.model = String::new();
    }
    if format == Format::Anthropic && r.parallel_tool_calls == Some(false) {
        // NOTE: Anthropic says it in tool_choice, which it then has.
        r.tool_choice = Some(ToolChoice::Auto);
    }
    if format == Format::Anthropic && r.parallel_tool_calls == Some(true) {
        r.parallel_tool_calls = None;
    }
    r
}

/// Passthrough fields of `format` (nested ones as `container.field`) with scalar values.
fn passthrough_fields(format: Format) -> impl Strategy<Value = Vec<(String, Value)>> {
    let names = known_fields(format).passthrough;
    let value = prop_oneof![
        any::<i32>().prop_map(Value::from),
        "[a-z]{0,5}".prop_map(Value::from),
        any::<bool>().prop_map(Value::from)
    ];
    vec((proptest::sample::select(names), value), 1..5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Decoding an encoded request gives it back, for what the format carries, with no drift.
    #[test]
    fn prop_request_round_trips(format in format(), request in request()) {
        let request = restrict_request(format, request);
        let body = encode_request(format, &request).unwrap();
        let decoded = decode_request(format, &body).unwrap();
        prop_assert!(decoded.unknown.is_empty(), "{:?}", decoded.unknown);
        prop_assert_eq!(decoded.value, request, "{}", String::from_utf8_lossy(&body));
    }

    /// Decoding a request encoded with generation options gives back what the reference says
    /// the format carries of them, with no drift.
    #[test]
    fn prop_request_options_round_trip(format in format(), request in options_request()) {
        let body = encode_request(format, &request).unwrap();
        let decoded = decode_request(format, &body).unwrap();
        prop_assert!(decoded.unknown.is_empty(), "{:?}", decoded.unknown);
        let mut got = decoded.value;
        got.passthrough = Passthrough::default();
        prop_assert_eq!(got, expected_options(format, request), "{}", String::from_utf8_lossy(&body));
    }

    /// Passthrough fields reach an upstream of the caller's format verbatim and no other.
    #[test]
    fn prop_passthrough_reaches_the_same_format_only(
        (format, fields) in format().prop_flat_map(|f| (Just(f), passthrough_fields(f))),
    ) {
        let mut body = match format {
            Format::OpenAiResponses => serde_json::json!({"model": "m", "input": "hi"}),
            Format::Gemini => serde_json::json!({"contents": []}),
            Format::Anthropic => serde_json::json!({"model": "m", "max_tokens": 10, "messages": []}),
            _ => serde_json::json!({"model": "m", "messages": []}),
        };
        for (path, value) in &fields {
            match path.split_once('.') {
                None => body[path.as_str()] = value.clone(),
                Some((container, key)) => body[container][key] = value.clone(),
            }
        }
        let options = RequestOptions { default_max_tokens: 100, ..RequestOptions::default() };
        for to in Format::ALL {
            let translated = translate_request(format, to, body.to_string().as_bytes(), &options).unwrap();
            prop_assert!(translated.unknown.is_empty(), "{:?}", translated.unknown);
            let sent: Value = serde_json::from_slice(&translated.body).unwrap();
            for (path, _) in &fields {
                let (container, key) = path.split_once('.').unwrap_or(("", path));
                let at = if container.is_empty() { Some(&sent) } else { sent.get(container) };
                let got = at.and_then(|m| m.get(key));
                let wanted = if container.is_empty() { body.get(key) } else { body[container].get(key) };
                if to == format {
                    prop_assert_eq!(got, wanted, "{:?} {}", format, path);
                } else {
                    prop_assert!(got.is_none(), "{:?} -> {:?} carried {}", format, to, path);
                }
            }
        }
    }

    /// Decoding an encoded response gives it back, for what the format carries.
    #[test]
    fn prop_response_round_trips(format in format(), response in response()) {
        let response = restrict_response(format, response);
        let body = encode_response(format, &response);
        prop_assert_eq!(decode_response(format, &body).unwrap(), response, "{}", String::from_utf8_lossy(&body));
    }

    /// A format's stream of a response, decoded, is the response.
    #[test]
    fn prop_stream_round_trips(format in format(), response in response()) {
        let response = restrict_response(format, response);
        let bytes = encode_stream(format, &response, true);
        prop_assert_eq!(stream_as_body(format, &bytes), response);
    }

    /// Translating a stream cut anywhere amounts to translating the whole response.
    #[test]
    fn prop_streamed_translation_equals_whole(
        from in format(), to in format(), response in response(), cuts in vec(any::<u16>(), 0..12),
    ) {
        let response = restrict_response(from, response);
        let mut translator = Translator::new(from, to, true);
        let mut streamed = Vec::new();
        for chunk in chunks(&encode_stream(from, &response, true), &cuts) {
            translator.feed(&chunk, &mut streamed);
        }
        translator.finish(&mut streamed);
        let whole = translate_response(from, to, &encode_response(from, &response)).unwrap();
        let whole = decode_response(to, &whole).unwrap();
        prop_assert_eq!(translator.usage(), response.usage);
        prop_assert_eq!(stream_as_body(to, &streamed), whole);
    }
}
