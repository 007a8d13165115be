//! The upstream call of an admitted request: the provider's templates and headers rendered for
//! `/v1/proxy`, embeddings and generation, an entry route's request translated to the
//! provider's format, the call on the model's next deployment, and the token bounds the
//! reservation prices.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;

use super::{record_tool_name, EntryPlan, Fallback, Prepared, Request, Route, Upstream};
use super::{DECLARED_NAME_BUDGET, MAX_TOOLS_RECORDED};
use crate::content::{self, Block, BlockType, RawBlock};
use crate::govern::ProviderLimits;
use crate::json::write_str;
use crate::outcome::Outcome;
use crate::provider::Plan;
use crate::shm::{id_bytes, utc_hour, Segment};
use crate::snapshot::{Deployment, Model, Provider, Secret, Snapshot};
use crate::template::Vars;
use crate::translate::{self, Format};

/// Input tokens assumed from body bytes: cl100k averages about 4 bytes a token on prose, so
/// `ceil(bytes / 3)` over-estimates typical text cheaply (no tokenizer on the hot path). It is an
/// estimate, not a proof: `settle` charges the actual cost whatever it is.
pub const BYTES_PER_TOKEN_BOUND: i64 = 3;
/// Tokens assumed for an image or a media block given by URL (above the big providers' per-image
/// token counts at default detail).
pub const MEDIA_BLOCK_TOKENS: i64 = 1600;

/// The input-token bound of a call's blocks: `ceil(text bytes / 3)`; images and URL blocks
/// [`MEDIA_BLOCK_TOKENS`]; inline documents, audio and video `ceil(base64 bytes / 4)` (decoded
/// bytes / 3), at least [`MEDIA_BLOCK_TOKENS`].
#[must_use]
pub fn input_token_bound(blocks: &[Block<'_>]) -> i64 {
    let mut text_bytes = 0i64;
    let mut media = 0i64;
    for block in blocks {
        match block.kind {
            BlockType::Text => text_bytes += block.text.len() as i64,
            BlockType::Image => media += MEDIA_BLOCK_TOKENS,
            _ => media += ((block.data.len() as u64).div_ceil(4) as i64).max(MEDIA_BLOCK_TOKENS),
        }
    }
    (text_bytes as u64).div_ceil(BYTES_PER_TOKEN_BOUND as u64) as i64 + media
}

fn text_token_bound(text: &str) -> i64 {
    (text.len() as u64).div_ceil(BYTES_PER_TOKEN_BOUND as u64) as i64
}

#[derive(Deserialize)]
pub(super) struct ProxyBody<'a> {
    #[serde(borrow, default)]
    pub(super) query: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) content: Option<Vec<RawBlock<'a>>>,
    #[serde(default)]
    pub(super) max_tokens: Option<i64>,
    #[serde(default)]
    pub(super) web_search: Option<bool>,
}

#[derive(Deserialize)]
struct EmbeddingsBody<'a> {
    #[serde(borrow, default)]
    input: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct GenerateBody<'a> {
    #[serde(borrow, default)]
    prompt: Option<Cow<'a, str>>,
}

/// Mesh's `detail` for an embeddings body without a non-empty `input`.
pub const EMPTY_INPUT: &str = "input must be a non-empty string";
/// Mesh's `detail` for a generate body without a non-empty `prompt`.
pub const EMPTY_PROMPT: &str = "prompt must be a non-empty string";

fn headers(plan: &Plan, vars: &Vars<'_>) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(plan.headers.len() + 1);
    if !plan.has_content_type {
        out.push(("Content-Type".to_owned(), "application/json".to_owned()));
    }
    out.extend(
        plan.headers
            .iter()
            .map(|(name, value)| (name.clone(), value.render_string(vars))),
    );
    out
}

/// The call rendered for `deployment`, the model's next one; None when that deployment cannot
/// take this call (its provider lacks the operation or refuses the body). OpenAI's embeddings
/// route makes several upstream calls at once and does not fail over.
#[expect(
    clippy::too_many_arguments,
    reason = "the call as prepare parsed it: one body per route kind"
)]
pub(super) fn render_fallback(
    snapshot: &Snapshot,
    segment: Option<&Arc<Segment>>,
    req: &Request<'_>,
    model: &Model,
    deployment: &Deployment,
    decoded: Option<&translate::Decoded<translate::Request>>,
    proxy_body: Option<&ProxyBody<'_>>,
    principal_id: Option<&str>,
) -> Option<Fallback> {
    let provider = &snapshot.providers[deployment.provider as usize];
    let mut served = model.clone();
    served.provider = deployment.provider;
    served.resolved_model.clone_from(&deployment.resolved_model);
    // A denial while rendering only means there is no failover; the first call's stands.
    let mut scratch = Prepared::default();
    let plan = &provider.plan;
    let upstream = match req.route {
        Route::Proxy if plan.chat.is_some() => proxy(&mut scratch, proxy_body?, &served, provider),
        Route::Entry(format) if plan.chat.is_some() => {
            let cache = shaping(snapshot, req, principal_id);
            entry(&mut scratch, format, decoded?.clone(), &served, provider, cache)
        }
        Route::Embeddings => embeddings(&mut scratch, req.body, &served, provider),
        Route::Generate if plan.generation.as_ref().is_some_and(|g| g.is_complete()) => {
            generate(&mut scratch, req.body, &served, provider)
        }
        _ => None,
    }?;
    Some(Fallback {
        provider_id: provider.id.clone(),
        local: provider.local,
        upstream,
        limits: ProviderLimits::new(
            &id_bytes(&provider.id),
            provider.max_concurrent_upstream,
            provider.max_outbound_rps,
            provider.admission_share_pct,
        ),
        calls_key: provider.calls_key.at(utc_hour(req.now_ms)),
        max_calls_per_hour: provider.max_calls_per_hour,
        segment: segment.cloned(),
    })
}

fn base_upstream(
    provider: &Provider,
    model: &Model,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
) -> Upstream {
    Upstream {
        url,
        method: provider.plan.method.clone(),
        headers,
        body,
        attempts: 1,
        backoff_ms: 0,
        max_tokens: 0,
        web_search: false,
        weight: 1,
        input_tokens_bound: 0,
        output_tokens_bound: 0,
        plan: Arc::clone(&provider.plan),
        api_key: Secret::default(),
        output_media_type: model.output_media_type.clone(),
        entry: None,
        embedding_bodies: Vec::new(),
    }
}

fn retry_plan(upstream: &mut Upstream, provider: &Provider) {
    upstream.attempts = if provider.retry_enabled && provider.max_retries > 0 {
        u32::try_from(provider.max_retries).unwrap_or(u32::MAX - 1) + 1
    } else {
        1
    };
    upstream.backoff_ms = u32::try_from(provider.retry_backoff_ms)
        .ok()
        .filter(|&ms| ms > 0)
        .unwrap_or(100);
}

/// What prompt-cache shaping needs of a call: the snapshot (for the keyed hash) and the
/// principal's id; None when the caller turned shaping off.
type Shaping<'a> = Option<(&'a Snapshot, &'a str)>;

pub(super) fn shaping<'a>(snapshot: &'a Snapshot, req: &Request<'_>, principal_id: Option<&'a str>) -> Shaping<'a> {
    if req.cache_off {
        return None;
    }
    Some((snapshot, principal_id?))
}

/// An entry route's upstream call: the caller's request, decoded to the IR, encoded in the
/// provider's format for the resolved model, always streamed and always asking for usage, with
/// the model's prompt-cache shaping unless the caller turned it off.
pub(super) fn entry(
    p: &mut Prepared,
    format: Format,
    decoded: translate::Decoded<translate::Request>,
    model: &Model,
    provider: &Provider,
    cache: Shaping<'_>,
) -> Option<Upstream> {
    let translate::Decoded {
        value: mut request,
        unknown,
    } = decoded;
    let Some(upstream_format) = crate::provider::upstream_format(provider.plan.family) else {
        p.invalid(Some(
            "the model's provider has custom templates; call it through /v1/proxy",
        ));
        return None;
    };
    let images = request
        .messages
        .iter()
        .flat_map(|m| &m.content)
        .filter(|b| matches!(b, translate::Block::Image(_)))
        .count();
    if images > 0 && !model.supports_image_in {
        p.deny(Outcome::ContentTypeNotSupportedByModel, None, |out| {
            out.extend_from_slice(b",\"content_type\":\"image\"")
        });
        return None;
    }
    // The same per-block limit as /v1/proxy: an inline image decodes to at most 20 MiB.
    let oversized = request.messages.iter().flat_map(|m| &m.content).any(|b| {
        matches!(b, translate::Block::Image(translate::Image::Base64 { data, .. }) if data.len() / 4 * 3 > MAX_INLINE_IMAGE_BYTES)
    });
    if oversized {
        p.invalid(Some(content::BLOCK_TOO_LARGE));
        return None;
    }
    let max_tokens = match request.max_tokens {
        Some(0) => {
            p.invalid(Some(content::INVALID_MAX_TOKENS));
            return None;
        }
        Some(n) => i64::try_from(n).unwrap_or(i64::MAX),
        None => model.max_output_tokens,
    };
    let (client_stream, include_usage) = (request.stream, request.include_usage);
    let tools = declared_tools(&request.tools);
    // Text bytes / 3, images as media blocks: the same bound /v1/proxy reserves.
    let text_bytes: usize = request.system.iter().map(String::len).sum::<usize>()
        + request
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .map(block_text_len)
            .sum::<usize>();
    request.model.clone_from(&model.resolved_model);
    request.max_tokens = Some(u64::try_from(max_tokens).unwrap_or(u64::MAX));
    request.stream = true;
    request.include_usage = true;
    if let (Some((snapshot, principal_id)), true) = (cache, model.cache_shaping) {
        // NOTE: by family, not format: Ollama's OpenAI-compatible route has no prompt cache key.
        request.cache_shaping = match provider.plan.family {
            crate::provider::Family::Anthropic => Some(translate::CacheShaping::Breakpoints {
                one_hour: model.cache_ttl_1h,
            }),
            crate::provider::Family::OpenAi | crate::provider::Family::OpenAiResponses => Some(
                translate::CacheShaping::Key(snapshot.cache_key(principal_id, &provider.id)),
            ),
            crate::provider::Family::Gemini | crate::provider::Family::Ollama | crate::provider::Family::Generic => {
                None
            }
        };
    }
    let body = match translate::encode_request(upstream_format, &request) {
        Ok(body) => body,
        Err(e) => {
            p.invalid(Some(&e.to_string()));
            return None;
        }
    };
    let chat = provider.plan.chat.as_ref()?;
    let vars = Vars {
        api_key: Some(&provider.api_key.0),
        model: Some(&model.resolved_model),
        ..Vars::default()
    };
    let mut upstream = base_upstream(
        provider,
        model,
        chat.url.render_string(&vars),
        headers(&provider.plan, &vars),
        body,
    );
    retry_plan(&mut upstream, provider);
    upstream.max_tokens = max_tokens;
    upstream.weight = u32::try_from(1 + 5 * images).unwrap_or(u32::MAX);
    upstream.input_tokens_bound =
        text_token_bound_len(text_bytes) + i64::try_from(images).unwrap_or(0) * MEDIA_BLOCK_TOKENS;
    upstream.output_tokens_bound = max_tokens;
    upstream.entry = Some(EntryPlan {
        upstream: upstream_format,
        entry: format,
        client_stream,
        include_usage,
        unknown,
        tools,
    });
    Some(upstream)
}

fn text_token_bound_len(bytes: usize) -> i64 {
    (i64::try_from(bytes).unwrap_or(i64::MAX - 2) + BYTES_PER_TOKEN_BOUND - 1) / BYTES_PER_TOKEN_BOUND
}

/// Largest decoded inline image on the entry routes (as for `/v1/proxy` image blocks).
pub const MAX_INLINE_IMAGE_BYTES: usize = 20 << 20;

fn block_text_len(block: &translate::Block) -> usize {
    match block {
        translate::Block::Text(t) => t.len(),
        translate::Block::ToolCall(call) => call.arguments.len() + call.name.len(),
        translate::Block::ToolResult(result) => result.content.len(),
        translate::Block::Thinking { text, .. } => text.len(),
        _ => 0,
    }
}

pub(super) fn proxy(p: &mut Prepared, request: &ProxyBody<'_>, model: &Model, provider: &Provider) -> Option<Upstream> {
    let content = request.content.as_deref().unwrap_or(&[]);
    let blocks = match content::resolve(request.query.as_deref().unwrap_or(""), content) {
        Ok(blocks) => blocks,
        Err(detail) => {
            p.invalid(Some(detail));
            return None;
        }
    };
    let max_tokens = request.max_tokens.unwrap_or(model.max_output_tokens);
    if max_tokens <= 0 {
        p.invalid(Some(content::INVALID_MAX_TOKENS));
        return None;
    }
    let allowed = |kind: BlockType| match kind {
        BlockType::Text => true,
        BlockType::Image => model.supports_image_in,
        BlockType::Document => model.supports_document_in,
        BlockType::Audio => model.supports_audio_in,
        BlockType::Video => model.supports_video_in,
    };
    let unsupported = |p: &mut Prepared, kind: BlockType| {
        p.deny(Outcome::ContentTypeNotSupportedByModel, None, |out| {
            out.extend_from_slice(b",\"content_type\":\"");
            out.extend_from_slice(kind.as_str().as_bytes());
            out.push(b'"');
        });
    };
    if let Some(block) = blocks.iter().find(|b| !allowed(b.kind)) {
        unsupported(p, block.kind);
        return None;
    }
    let chat = provider.plan.chat.as_ref()?;
    let web_search = request.web_search.unwrap_or(false);
    let body_template = if web_search {
        match chat
            .web_search_body
            .as_ref()
            .filter(|_| model.supports_web_search && provider.supports_web_search)
        {
            Some(template) => template,
            None => {
                p.deny(Outcome::WebSearchNotSupportedByModel, None, |_| {});
                return None;
            }
        }
    } else {
        &chat.body
    };
    let content_json = match content::content_json(provider.plan.family, &blocks) {
        Ok(json) => json,
        Err(kind) => {
            unsupported(p, kind);
            return None;
        }
    };
    let texts: Vec<&str> = blocks
        .iter()
        .filter(|b| b.kind == BlockType::Text)
        .map(|b| b.text)
        .collect();
    let mut max_tokens_json = itoa::Buffer::new();
    let vars = Vars {
        api_key: Some(&provider.api_key.0),
        model: Some(&model.resolved_model),
        query: Some(&texts),
        content_json: Some(&content_json),
        max_tokens_json: Some(max_tokens_json.format(max_tokens).as_bytes()),
        ..Vars::default()
    };
    let mut upstream_body = Vec::with_capacity(content_json.len() + 256);
    let body_vars = Vars { api_key: None, ..vars };
    body_template.render_into(&body_vars, &mut upstream_body);
    let mut upstream = base_upstream(
        provider,
        model,
        chat.url.render_string(&vars),
        headers(&provider.plan, &vars),
        upstream_body,
    );
    retry_plan(&mut upstream, provider);
    upstream.max_tokens = max_tokens;
    upstream.web_search = web_search;
    upstream.weight = blocks.iter().map(|b| b.kind.weight()).sum::<u32>().max(1);
    upstream.input_tokens_bound = input_token_bound(&blocks);
    upstream.output_tokens_bound = max_tokens;
    Some(upstream)
}

fn json_string(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 2);
    write_str(&mut out, text);
    out
}

pub(super) fn openai_embeddings(inputs: &[String], model: &Model, provider: &Provider) -> Option<Upstream> {
    let mut upstream = render_embedding(provider, model, inputs.first()?)?;
    upstream.embedding_bodies = inputs
        .iter()
        .filter_map(|i| render_embedding(provider, model, i).map(|u| u.body))
        .collect();
    upstream.input_tokens_bound = inputs.iter().map(|i| text_token_bound(i)).sum();
    upstream.weight = u32::try_from(inputs.len()).unwrap_or(u32::MAX);
    Some(upstream)
}

/// The upstream call embedding `input` with the provider's embedding plan.
fn render_embedding(provider: &Provider, model: &Model, input: &str) -> Option<Upstream> {
    let plan = provider.plan.embedding.as_ref()?;
    let input_json = json_string(input);
    let vars = Vars {
        api_key: Some(&provider.api_key.0),
        model: Some(&model.resolved_model),
        input_json: Some(&input_json),
        ..Vars::default()
    };
    let body = plan.body.render(&Vars { api_key: None, ..vars });
    let mut upstream = base_upstream(
        provider,
        model,
        plan.url.render_string(&vars),
        headers(&provider.plan, &vars),
        body,
    );
    upstream.input_tokens_bound = text_token_bound(input);
    Some(upstream)
}

pub(super) fn embeddings(p: &mut Prepared, body: &[u8], model: &Model, provider: &Provider) -> Option<Upstream> {
    let Ok(request) = serde_json::from_slice::<EmbeddingsBody<'_>>(body) else {
        p.invalid(None);
        return None;
    };
    let Some(input) = request.input.filter(|i| !i.is_empty()) else {
        p.invalid(Some(EMPTY_INPUT));
        return None;
    };
    render_embedding(provider, model, &input)
}

pub(super) fn generate(p: &mut Prepared, body: &[u8], model: &Model, provider: &Provider) -> Option<Upstream> {
    let Ok(request) = serde_json::from_slice::<GenerateBody<'_>>(body) else {
        p.invalid(None);
        return None;
    };
    let Some(prompt) = request.prompt.filter(|i| !i.is_empty()) else {
        p.invalid(Some(EMPTY_PROMPT));
        return None;
    };
    let plan = provider.plan.generation.as_ref()?;
    let prompt_json = json_string(&prompt);
    let vars = Vars {
        api_key: Some(&provider.api_key.0),
        model: Some(&model.resolved_model),
        prompt_json: Some(&prompt_json),
        ..Vars::default()
    };
    let body = plan.body.render(&Vars { api_key: None, ..vars });
    let mut upstream = base_upstream(
        provider,
        model,
        plan.url.render_string(&vars),
        headers(&provider.plan, &vars),
        body,
    );
    upstream.weight = BlockType::Video.weight();
    upstream.input_tokens_bound = text_token_bound(&prompt);
    upstream.output_tokens_bound = model.max_output_tokens;
    upstream.api_key = provider.api_key.clone();
    Some(upstream)
}

impl Upstream {
    /// Renders an async job's status (or content) URL for `job_id`: `{{api_key}}`, `{{job_id}}`,
    /// and `{{model}}` as the empty string, as Mesh.
    #[must_use]
    pub fn render_job_url(&self, content: bool, job_id: &str) -> Option<String> {
        let generation = self.plan.generation.as_ref()?;
        let template = if content {
            generation.content_url.as_ref()
        } else {
            generation.status_url.as_ref()
        }?;
        Some(template.render_string(&Vars {
            api_key: Some(&self.api_key.0),
            model: Some(""),
            job_id: Some(job_id),
            ..Vars::default()
        }))
    }
}

/// The request's tools for the row, as [`EntryPlan::tools`] describes.
fn declared_tools(tools: &[translate::Tool]) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = Vec::with_capacity(tools.len().min(MAX_TOOLS_RECORDED));
    for tool in tools {
        // NOTE: the size is walked only for a name recorded now (not for repeats of a name, nor
        // past the budget), so a body of many copies of one tool costs no schema walk each.
        let size = |name| {
            // {"name":"…","description":"…","parameters":…}: 25 bytes of keys and punctuation, 17
            // more with a description.
            let bytes = 25
                + tool.name.len()
                + tool.description.as_ref().map_or(0, |d| 17 + d.len())
                + json_len(&tool.parameters);
            (name, u32::try_from(bytes).unwrap_or(u32::MAX))
        };
        if !record_tool_name(&mut out, &tool.name, DECLARED_NAME_BUDGET, |t| t.0.as_str(), size) {
            break;
        }
    }
    out
}

/// The length of `value` written as compact JSON, strings counted unescaped (an estimate of
/// what a definition costs in the prompt, without writing it).
fn json_len(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::Null => 4,
        Value::Bool(b) => 4 + usize::from(!b),
        Value::Number(n) => n.to_string().len(),
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.len().saturating_sub(1) + items.iter().map(json_len).sum::<usize>(),
        Value::Object(map) => {
            2 + map.len().saturating_sub(1) + map.iter().map(|(k, v)| k.len() + 3 + json_len(v)).sum::<usize>()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::prepare;
    use super::super::test_support::*;
    use super::*;
    use crate::snapshot::test_support::*;
    use serde_json::json;

    proptest::proptest! {
        /// The definition size estimate is the compact JSON's length (strings without escapes).
        #[test]
        fn prop_json_len_is_the_compact_length(value in json_value()) {
            proptest::prop_assert_eq!(json_len(&value), serde_json::to_string(&value).unwrap().len());
        }
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e9f64..1e9).prop_map(|f| json!(f)),
            "[a-zA-Z0-9 _.-]{0,12}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                proptest::collection::btree_map("[a-z_]{1,8}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn declared_tools_are_named_once_with_their_definition_size() {
        let tool = |name: &str, description: Option<&str>| translate::Tool {
            name: name.into(),
            description: description.map(str::to_owned),
            parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        };
        let tools = declared_tools(&[tool("search", Some("Find")), tool("fetch", None), tool("search", None)]);
        let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        let with = json!({"name": "search", "description": "Find", "parameters": schema})
            .to_string()
            .len();
        let without = json!({"name": "fetch", "parameters": schema}).to_string().len();
        assert_eq!(
            tools,
            [("search".into(), with as u32), ("fetch".into(), without as u32)]
        );
        let many: Vec<_> = (0..300).map(|n| tool(&format!("t{n}"), None)).collect();
        assert_eq!(declared_tools(&many).len(), MAX_TOOLS_RECORDED);
        // Names are cut to the providers' 64 bytes (at a character boundary), and the row's
        // names stop at the byte budget.
        let long: Vec<_> = (0..40)
            .map(|n| tool(&format!("{n:02}{}", "é".repeat(40)), None))
            .collect();
        let recorded = declared_tools(&long);
        assert!(recorded.iter().all(|(name, _)| name.len() <= 64 && name.len() >= 63));
        assert_eq!(recorded.len(), DECLARED_NAME_BUDGET / 64);
        assert!(recorded.iter().map(|(name, _)| name.len()).sum::<usize>() <= DECLARED_NAME_BUDGET);
    }

    #[test]
    fn test_proxy_renders_openai_request() {
        let s = snapshot();
        let p = prepare(
            &s,
            None,
            &req(
                Route::Proxy,
                "model=gpt-b",
                br#"{"query":"hi \"you\"","max_tokens":5,"id":"x","extra":1}"#,
            ),
        );
        assert_eq!(p.status, 0, "{}", String::from_utf8_lossy(&p.body));
        let up = p.upstream.as_ref().unwrap();
        assert_eq!(up.url, "/v1/chat/completions");
        assert_eq!(
            up.headers[0],
            ("Content-Type".to_owned(), "application/json".to_owned())
        );
        let body: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(
            body["messages"][0]["content"],
            json!([{"type": "text", "text": "hi \"you\""}])
        );
        assert_eq!(body["max_tokens"], 5);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!((up.attempts, up.weight, up.max_tokens), (3, 1, 5));
        assert_eq!(up.headers.len(), 1, "no key configured: no Authorization header");
    }

    #[test]
    fn test_entry_route_translates_to_the_providers_format() {
        let s = snapshot();
        let body =
            br#"{"model":"gpt-b","max_tokens":9,"system":"be brief","messages":[{"role":"user","content":"hi"}]}"#;
        let p = prepare(&s, None, &req(Route::Entry(Format::Anthropic), "", body));
        assert_eq!(p.status, 0, "{}", String::from_utf8_lossy(&p.body));
        assert_eq!(p.requested_model, "gpt-b");
        let up = p.upstream.as_ref().unwrap();
        let sent: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(sent["messages"][0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(
            (sent["max_completion_tokens"].as_i64(), sent["stream"].as_bool()),
            (Some(9), Some(true))
        );
        assert_eq!(
            sent["stream_options"]["include_usage"], true,
            "usage is always asked for"
        );
        let plan = up.entry.as_ref().unwrap();
        assert_eq!(
            (plan.upstream, plan.entry, plan.client_stream),
            (Format::OpenAiChat, Format::Anthropic, false)
        );
        assert_eq!(up.output_tokens_bound, 9);
    }
}
