//! The decision for the Mesh-native POST routes (`/v1/proxy`, `/v1/embeddings`,
//! `/v1/generate`): authentication, grant, policy and body validation in Mesh's exact order
//! (mesh-behaviour §2.4, §2.7, §2.8, §5.2), then the rendered upstream request. A pure function
//! of the snapshot, the counters and the request bytes; Python only moves bytes.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;

use crate::content::{self, BlockType, RawBlock};
use crate::keyindex::extract_token;
use crate::policy::{self, Denial};
use crate::provider::Plan;
use crate::shm::{utc_hour, Segment};
use crate::snapshot::{Model, ModelKind, Provider, Secret, Snapshot};
use crate::template::Vars;
use crate::views::{self, write_int, write_str, write_time, write_usd};

/// Seconds a client is told to wait while the kill switch is tripped (it has no known end).
pub const KILL_SWITCH_RETRY_S: u32 = 30;

/// A Mesh-native POST route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Proxy,
    Embeddings,
    Generate,
}

impl Route {
    /// Parses `"proxy"`, `"embeddings"` or `"generate"`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "proxy" => Self::Proxy,
            "embeddings" => Self::Embeddings,
            "generate" => Self::Generate,
            _ => return None,
        })
    }

    fn admits(self, kind: ModelKind) -> bool {
        match self {
            Self::Proxy => kind == ModelKind::Chat,
            Self::Embeddings => kind == ModelKind::Embedding,
            Self::Generate => matches!(kind, ModelKind::ImageGeneration | ModelKind::VideoGeneration),
        }
    }
}

/// The request as it arrived: raw header values, raw query string, body bytes.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub route: Route,
    pub authorization: Option<&'a str>,
    pub x_api_key: Option<&'a str>,
    pub x_goog_api_key: Option<&'a str>,
    pub query_string: Option<&'a str>,
    pub body: &'a [u8],
    pub now_ms: i64,
}

/// The rendered upstream call of an admitted request.
#[derive(Debug)]
pub struct Upstream {
    pub url: String,
    pub method: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub attempts: u32,
    pub backoff_ms: u32,
    pub max_tokens: i64,
    pub web_search: bool,
    /// Admission weight (text 1, image 5, document 8, audio 10, video 25; embeddings 1; generate 25).
    pub weight: u32,
    pub plan: Arc<Plan>,
    /// Kept for rendering async status and content URLs (generate only).
    pub api_key: Secret,
    pub output_media_type: Option<String>,
}

/// The decision: either a denial (status and body to answer) or an upstream call (status 0).
#[derive(Debug, Default)]
pub struct Prepared {
    pub request_id: String,
    /// 0: go upstream; otherwise the HTTP status to answer with `body`.
    pub status: u16,
    pub body: Vec<u8>,
    pub retry_after_s: Option<u32>,
    pub deny_reason: Option<&'static str>,
    pub key_id: Option<String>,
    pub principal_id: Option<String>,
    pub model_id: Option<String>,
    pub provider_id: Option<String>,
    pub model_name: Option<String>,
    /// The `model` query parameter as sent (percent-decoded).
    pub requested_model: String,
    pub log_requests: bool,
    pub local: bool,
    pub upstream: Option<Upstream>,
}

impl Prepared {
    fn deny(&mut self, status: u16, code: &'static str, extras: impl FnOnce(&mut Vec<u8>)) {
        self.status = status;
        self.deny_reason = Some(code);
        self.body.clear();
        self.body.extend_from_slice(b"{\"error\":\"");
        self.body.extend_from_slice(code.as_bytes());
        self.body.push(b'"');
        extras(&mut self.body);
        self.body.extend_from_slice(b"}\n");
    }

    fn invalid(&mut self, detail: Option<&str>) {
        self.deny(400, "invalid_request", |out| {
            if let Some(detail) = detail {
                out.extend_from_slice(b",\"detail\":");
                write_str(out, detail);
            }
        });
    }
}

/// Percent-decodes a query component (`+` is a space, as in Go's `QueryUnescape`).
fn query_param<'a>(query: &'a str, name: &str) -> Option<Cow<'a, str>> {
    let raw = query.trim_start_matches('?').split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value)
    })?;
    if !raw.bytes().any(|b| b == b'%' || b == b'+') {
        return Some(Cow::Borrowed(raw));
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                match (bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(Cow::Owned(String::from_utf8_lossy(&out).into_owned()))
}

#[derive(Deserialize)]
struct ProxyBody<'a> {
    #[serde(borrow, default)]
    query: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<Vec<RawBlock<'a>>>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    web_search: Option<bool>,
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

fn retry_after(resume_at_ms: i64, now_ms: i64) -> u32 {
    let ms = (resume_at_ms - now_ms).max(0);
    u32::try_from(ms.div_euclid(1000) + i64::from(ms % 1000 != 0)).unwrap_or(u32::MAX).max(1)
}

fn headers(plan: &Plan, vars: &Vars<'_>) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(plan.headers.len() + 1);
    if !plan.has_content_type {
        out.push(("Content-Type".to_owned(), "application/json".to_owned()));
    }
    out.extend(plan.headers.iter().map(|(name, value)| (name.clone(), value.render_string(vars))));
    out
}

/// Decides one request. Reads counters from `segment` and, when the call goes upstream, counts
/// it (provider and principal×model hourly calls, Mesh step 14).
#[must_use]
pub fn prepare(snapshot: &Snapshot, segment: Option<&Segment>, req: &Request<'_>) -> Prepared {
    let mut p = Prepared { request_id: crate::ids::request_id(), log_requests: true, ..Prepared::default() };
    p.requested_model = req.query_string.and_then(|q| query_param(q, "model")).map(Cow::into_owned).unwrap_or_default();

    // 1-2. Authentication, key and principal status.
    let token = extract_token(req.authorization, req.x_api_key, req.x_goog_api_key, req.query_string);
    let Some(key) = token.and_then(|t| snapshot.authenticate(t, req.now_ms)) else {
        p.deny(401, "invalid_or_revoked_key", |_| {});
        return p;
    };
    let key = &snapshot.keys[key as usize];
    p.key_id = Some(key.id.clone());
    p.principal_id = Some(snapshot.principals[key.principal as usize].id.clone());

    // 3. The grant for this route's kind; unknown names are the same 403.
    let grant = snapshot.grant_by_name(key.principal, &p.requested_model);
    let Some((grant, model)) = grant.map(|g| (g, &snapshot.models[g.model as usize])).filter(|(_, m)| req.route.admits(m.kind)) else {
        p.deny(403, "model_not_permitted", |_| {});
        return p;
    };
    let provider = &snapshot.providers[model.provider as usize];
    p.model_id = Some(model.id.clone());
    p.model_name = Some(model.name.clone());
    p.provider_id = Some(provider.id.clone());
    p.log_requests = provider.log_requests;
    p.local = provider.local;

    // 4. Blocked or retired.
    if model.blocked || model.retired {
        p.deny(403, "model_blocked", |_| {});
        return p;
    }

    // 5. Provider capability (embeddings, generate).
    let plan = &provider.plan;
    match req.route {
        Route::Proxy if plan.chat.is_none() => {
            // A provider without a chat endpoint cannot serve a chat model; Mesh would 500.
            p.deny(500, "internal_error", |_| {});
            return p;
        }
        Route::Embeddings if plan.embedding.is_none() => {
            p.deny(400, "embeddings_not_supported_by_provider", |_| {});
            return p;
        }
        Route::Generate if !plan.generation.as_ref().is_some_and(|g| g.is_complete()) => {
            p.deny(400, "generation_not_supported_by_provider", |_| {});
            return p;
        }
        _ => {}
    }

    // 6. Policy, kill switch last.
    let counters = views::counters(grant, provider, &segment.map(SegmentRef), req.now_ms);
    if let Some((denial, resume_at)) = policy::denial(grant, provider, &counters, req.now_ms) {
        p.deny(denial.http_status(), denial.code(), |out| {
            if let Denial::Budget { cap_nano } = denial {
                out.extend_from_slice(b",\"cap\":");
                write_usd(out, cap_nano);
            }
            if let Some(at) = resume_at {
                out.extend_from_slice(b",\"resume_at\":");
                write_time(out, at);
            }
            if let Denial::UserHourly { limit } = denial {
                out.extend_from_slice(b",\"limit\":");
                write_int(out, limit);
            }
        });
        if denial.http_status() == 429 {
            p.retry_after_s = resume_at.map(|at| retry_after(at, req.now_ms));
        }
        return p;
    }
    if snapshot.kill_switch {
        let resume_at = req.now_ms + i64::from(KILL_SWITCH_RETRY_S) * 1000;
        p.deny(503, "paused_by_admin", |out| {
            out.extend_from_slice(b",\"resume_at\":");
            write_time(out, resume_at);
        });
        p.retry_after_s = Some(KILL_SWITCH_RETRY_S);
        return p;
    }

    // 7. Body, rendering.
    let upstream = match req.route {
        Route::Proxy => proxy(&mut p, req.body, model, provider),
        Route::Embeddings => embeddings(&mut p, req.body, model, provider),
        Route::Generate => generate(&mut p, req.body, model, provider),
    };
    let Some(upstream) = upstream else {
        return p;
    };

    // 14. Count the attempt.
    if let Some(segment) = segment {
        let hour = utc_hour(req.now_ms);
        if segment.add(provider.calls_key.at(hour), 1).and_then(|_| segment.add(grant.calls_key.at(hour), 1)).is_err() {
            // The counter table is full: fail closed rather than run uncounted.
            p.deny(503, "server_busy", |_| {});
            p.retry_after_s = Some(1);
            return p;
        }
    }
    p.upstream = Some(upstream);
    p
}

/// [`crate::shm::CounterRead`] over a borrowed segment.
struct SegmentRef<'a>(&'a Segment);

impl crate::shm::CounterRead for SegmentRef<'_> {
    fn counter(&self, key: u128) -> i64 {
        self.0.get(key)
    }
}

fn base_upstream(provider: &Provider, model: &Model, url: String, headers: Vec<(String, String)>, body: Vec<u8>) -> Upstream {
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
        plan: Arc::clone(&provider.plan),
        api_key: Secret::default(),
        output_media_type: model.output_media_type.clone(),
    }
}

fn proxy(p: &mut Prepared, body: &[u8], model: &Model, provider: &Provider) -> Option<Upstream> {
    let Ok(request) = serde_json::from_slice::<ProxyBody<'_>>(body) else {
        p.invalid(None);
        return None;
    };
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
        p.deny(400, "content_type_not_supported_by_model", |out| {
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
        match chat.web_search_body.as_ref().filter(|_| model.supports_web_search && provider.supports_web_search) {
            Some(template) => template,
            None => {
                p.deny(400, "web_search_not_supported_by_model", |_| {});
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
    let texts: Vec<&str> = blocks.iter().filter(|b| b.kind == BlockType::Text).map(|b| b.text).collect();
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
    let mut upstream = base_upstream(provider, model, chat.url.render_string(&vars), headers(&provider.plan, &vars), upstream_body);
    upstream.attempts = if provider.retry_enabled && provider.max_retries > 0 {
        u32::try_from(provider.max_retries).unwrap_or(u32::MAX - 1) + 1
    } else {
        1
    };
    upstream.backoff_ms = u32::try_from(provider.retry_backoff_ms).ok().filter(|&ms| ms > 0).unwrap_or(100);
    upstream.max_tokens = max_tokens;
    upstream.web_search = web_search;
    upstream.weight = blocks.iter().map(|b| b.kind.weight()).sum::<u32>().max(1);
    Some(upstream)
}

fn json_string(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 2);
    write_str(&mut out, text);
    out
}

fn embeddings(p: &mut Prepared, body: &[u8], model: &Model, provider: &Provider) -> Option<Upstream> {
    let Ok(request) = serde_json::from_slice::<EmbeddingsBody<'_>>(body) else {
        p.invalid(None);
        return None;
    };
    let Some(input) = request.input.filter(|i| !i.is_empty()) else {
        p.invalid(Some(EMPTY_INPUT));
        return None;
    };
    let plan = provider.plan.embedding.as_ref()?;
    let input_json = json_string(&input);
    let vars = Vars { api_key: Some(&provider.api_key.0), model: Some(&model.resolved_model), input_json: Some(&input_json), ..Vars::default() };
    let body = plan.body.render(&Vars { api_key: None, ..vars });
    Some(base_upstream(provider, model, plan.url.render_string(&vars), headers(&provider.plan, &vars), body))
}

fn generate(p: &mut Prepared, body: &[u8], model: &Model, provider: &Provider) -> Option<Upstream> {
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
    let vars = Vars { api_key: Some(&provider.api_key.0), model: Some(&model.resolved_model), prompt_json: Some(&prompt_json), ..Vars::default() };
    let body = plan.body.render(&Vars { api_key: None, ..vars });
    let mut upstream = base_upstream(provider, model, plan.url.render_string(&vars), headers(&provider.plan, &vars), body);
    upstream.weight = BlockType::Video.weight();
    upstream.api_key = provider.api_key.clone();
    Some(upstream)
}

impl Upstream {
    /// Renders an async job's status (or content) URL for `job_id`: `{{api_key}}`, `{{job_id}}`,
    /// and `{{model}}` as the empty string, as Mesh.
    #[must_use]
    pub fn render_job_url(&self, content: bool, job_id: &str) -> Option<String> {
        let generation = self.plan.generation.as_ref()?;
        let template = if content { generation.content_url.as_ref() } else { generation.status_url.as_ref() }?;
        Some(template.render_string(&Vars { api_key: Some(&self.api_key.0), model: Some(""), job_id: Some(job_id), ..Vars::default() }))
    }
}

/// Why an upstream body could not be read (the caller answers 502 `upstream_unavailable`).
pub type ExtractError = String;

/// The embedding vector (as compact JSON) and input tokens of an upstream response.
pub fn extract_embedding(plan: &Plan, body: &[u8]) -> Result<(Vec<u8>, i64), ExtractError> {
    let embedding = plan.embedding.as_ref().ok_or("provider has no embedding plan")?;
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("response is not JSON: {e}"))?;
    let vector = embedding.vector.get(&value).and_then(serde_json::Value::as_array).filter(|v| v.iter().all(serde_json::Value::is_number));
    let vector = vector.ok_or("vector path does not resolve to an array of numbers")?;
    let json = serde_json::to_vec(vector).map_err(|e| e.to_string())?;
    let tokens = embedding.usage.as_ref().and_then(|p| p.get_int(&value)).unwrap_or(0);
    Ok((json, tokens))
}

/// What a generation response carries: media outputs, seconds, job id, job status, usage.
#[derive(Debug, Default, PartialEq)]
pub struct Generation {
    pub outputs: Vec<String>,
    pub seconds: f64,
    pub job_id: Option<String>,
    pub status: Option<String>,
    pub input_tokens: i64,
    pub output_tokens: i64,
}

/// Reads every configured generation path from an upstream response (submit, poll or result).
pub fn extract_generation(plan: &Plan, body: &[u8]) -> Result<Generation, ExtractError> {
    let generation = plan.generation.as_ref().ok_or("provider has no generation plan")?;
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("response is not JSON: {e}"))?;
    let outputs = match generation.media.as_ref().and_then(|p| p.get(&value)) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(serde_json::Value::Array(items)) => {
            items.iter().filter_map(|i| i.as_str().filter(|s| !s.is_empty()).map(str::to_owned)).collect()
        }
        _ => Vec::new(),
    };
    let seconds = match generation.duration.as_ref().and_then(|p| p.get(&value)) {
        Some(serde_json::Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        Some(serde_json::Value::String(s)) => s.trim().parse().unwrap_or(0.0),
        _ => 0.0,
    };
    Ok(Generation {
        outputs,
        seconds,
        job_id: generation.job_id.as_ref().and_then(|p| p.get_text(&value)),
        status: generation.status.as_ref().and_then(|p| p.get_text(&value)),
        input_tokens: generation.usage_in.as_ref().and_then(|p| p.get_int(&value)).unwrap_or(0),
        output_tokens: generation.usage_out.as_ref().and_then(|p| p.get_int(&value)).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::test_support::*;
    use serde_json::json;

    const NOON_WED: i64 = 1_741_176_000_000; // 2025-03-05T12:00:00Z, inside the Paris window

    fn req(route: Route, query: &str, body: &[u8]) -> Request<'static> {
        Request {
            route,
            authorization: Some(Box::leak(format!("Bearer {TOKEN}").into_boxed_str())),
            x_api_key: None,
            x_goog_api_key: None,
            query_string: Some(Box::leak(query.to_owned().into_boxed_str())),
            body: Box::leak(body.to_vec().into_boxed_slice()),
            now_ms: NOON_WED,
        }
    }

    fn body_json(p: &Prepared) -> serde_json::Value {
        assert_eq!(p.body.last(), Some(&b'\n'));
        serde_json::from_slice(&p.body).unwrap()
    }

    #[test]
    fn test_proxy_renders_openai_request() {
        let s = snapshot();
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"hi \"you\"","max_tokens":5,"id":"x","extra":1}"#));
        assert_eq!(p.status, 0, "{}", String::from_utf8_lossy(&p.body));
        let up = p.upstream.as_ref().unwrap();
        assert_eq!(up.url, "/v1/chat/completions");
        assert_eq!(up.headers[0], ("Content-Type".to_owned(), "application/json".to_owned()));
        let body: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(body["messages"][0]["content"], json!([{"type": "text", "text": "hi \"you\""}]));
        assert_eq!(body["max_tokens"], 5);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!((up.attempts, up.weight, up.max_tokens), (3, 1, 5));
        assert_eq!(up.headers.len(), 1, "no key configured: no Authorization header");
    }

    #[test]
    fn test_denials_follow_mesh_order_and_shape() {
        let s = snapshot();
        let mut r = req(Route::Proxy, "model=gpt-b", b"{}");
        r.authorization = None;
        assert_eq!(prepare(&s, None, &r).status, 401);
        let p = prepare(&s, None, &req(Route::Proxy, "model=nope", b"{}"));
        assert_eq!((p.status, body_json(&p)), (403, json!({"error": "model_not_permitted"})));
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-a-image", b"{}"));
        assert_eq!(p.deny_reason, Some("model_not_permitted"), "generation model via proxy");
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-old", b"{}"));
        assert_eq!(p.deny_reason, Some("model_blocked"));
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", b"{not json"));
        assert_eq!(body_json(&p), json!({"error": "invalid_request"}));
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"a","max_tokens":0}"#));
        assert_eq!(body_json(&p), json!({"error": "invalid_request", "detail": content::INVALID_MAX_TOKENS}));
        let doc = br#"{"content":[{"type":"document","media_type":"application/pdf","data":"AAAA"}]}"#;
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", doc));
        assert_eq!(body_json(&p), json!({"error": "content_type_not_supported_by_model", "content_type": "document"}));
        let mut r = req(Route::Proxy, "model=gpt-b", b"{}");
        r.now_ms = NOON_WED - 5 * 3_600_000; // 07:00Z = 08:00 Paris, before the window
        let p = prepare(&s, None, &r);
        assert_eq!(body_json(&p), json!({"error": "outside_allowed_hours", "resume_at": "2025-03-05T08:00:00Z"}));
        assert_eq!(p.retry_after_s, None);
    }

    #[test]
    fn test_kill_switch_is_checked_after_policy_and_carries_retry_after() {
        let mut config = config();
        config["kill_switch"] = json!(true);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        assert_eq!((p.status, p.deny_reason, p.retry_after_s), (503, Some("paused_by_admin"), Some(KILL_SWITCH_RETRY_S)));
    }

    #[test]
    fn test_hourly_limit_counts_attempts_in_the_segment() {
        let path = std::env::temp_dir().join(format!("meshfast-test-{}-prepare", std::process::id()));
        let segment = Segment::create(&path, 64, 4, 4).unwrap();
        let s = snapshot();
        for _ in 0..100 {
            assert_eq!(prepare(&s, Some(&segment), &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#)).status, 0);
        }
        let p = prepare(&s, Some(&segment), &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        assert_eq!(body_json(&p), json!({"error": "user_model_hourly_limit_reached", "resume_at": "2025-03-05T13:00:00Z", "limit": 100}));
        assert_eq!(p.retry_after_s, Some(3600));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_generation_without_plan_is_refused_and_query_is_percent_decoded() {
        let s = snapshot();
        let p = prepare(&s, None, &req(Route::Generate, "x=1&model=gpt%2Da%2dimage", br#"{"prompt":"cat"}"#));
        assert_eq!(p.requested_model, "gpt-a-image");
        assert_eq!(p.status, 0, "the openai preset generates images: {}", String::from_utf8_lossy(&p.body));
        assert_eq!(p.upstream.as_ref().unwrap().weight, 25);
        assert_eq!(query_param("model=a+b%zz", "model").as_deref(), Some("a b%zz"));
    }
}
