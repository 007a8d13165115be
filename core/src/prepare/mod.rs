//! The decision for the data-plane POST routes: the Mesh-native ones (`/v1/proxy`,
//! `/v1/embeddings`, `/v1/generate`) and the standard chat entry routes (OpenAI, Anthropic,
//! Gemini, Ollama): authentication, grant, policy and body validation in Mesh's exact order
//! (mesh-behaviour §2.4, §2.7, §2.8, §5.2), then the rendered (or translated) upstream request.
//! A pure function of the snapshot, the counters and the request bytes; Python only moves bytes.
//!
//! In layers, each using only those below it: `decide` (authentication, grant, policy,
//! admission, the denials: [`prepare`]), `render` (the upstream call of an admitted request, and
//! its failover's), `extract` (results read from upstream responses); `failover` switches an
//! admitted call to its fallback once. This module holds the types they share.

use std::borrow::Cow;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::govern::{Holds, LeaseWant, ProviderLimits};
use crate::json::write_str;
use crate::outcome::Outcome;
use crate::pricing::Rates;
use crate::provider::Plan;
use crate::shm::Segment;
use crate::snapshot::{ModelKind, Secret};
use crate::translate::Format;

mod decide;
mod extract;
mod failover;
mod render;

pub use decide::{prepare, KILL_SWITCH_RETRY_S, MAX_EMBEDDING_INPUTS};
pub use extract::{extract_embedding, extract_generation, ExtractError, Generation};
pub use render::{
    input_token_bound, BYTES_PER_TOKEN_BOUND, EMPTY_INPUT, EMPTY_PROMPT, MAX_INLINE_IMAGE_BYTES, MEDIA_BLOCK_TOKENS,
};

/// A data-plane POST route: Mesh-native, or a standard chat entry route in its wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Proxy,
    Embeddings,
    Generate,
    Entry(Format),
    /// OpenAI's `POST /v1/embeddings` (model and input in the body).
    OpenAiEmbeddings,
}

impl Route {
    /// Parses `"proxy"`, `"embeddings"`, `"generate"` or an entry format's name
    /// (`"openai_chat"`, `"openai_responses"`, `"anthropic"`, `"gemini"`, `"ollama"`).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "proxy" => Self::Proxy,
            "embeddings" => Self::Embeddings,
            "generate" => Self::Generate,
            "openai_embeddings" => Self::OpenAiEmbeddings,
            other => Self::Entry(Format::parse(other)?),
        })
    }

    fn admits(self, kind: ModelKind) -> bool {
        match self {
            Self::Proxy | Self::Entry(_) => kind == ModelKind::Chat,
            Self::Embeddings | Self::OpenAiEmbeddings => kind == ModelKind::Embedding,
            Self::Generate => matches!(kind, ModelKind::ImageGeneration | ModelKind::VideoGeneration),
        }
    }
}

/// The request as it arrived: raw header values, raw query string, body bytes.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub route: Route,
    /// The model named outside the body (Gemini's path); entry routes otherwise read the body's.
    pub model: Option<&'a str>,
    /// Whether the caller wants a stream, when the route says it rather than the body (Gemini's
    /// `:streamGenerateContent`).
    pub stream: Option<bool>,
    pub authorization: Option<&'a str>,
    pub x_api_key: Option<&'a str>,
    pub x_goog_api_key: Option<&'a str>,
    pub query_string: Option<&'a str>,
    pub body: &'a [u8],
    pub now_ms: i64,
    /// The caller turned prompt-cache shaping off for this call (`X-Meshfast-Cache: off`).
    pub cache_off: bool,
    /// The call's `workflow` tag (X-Meshfast-Tags): a registered workflow's budget governs it.
    pub workflow: Option<&'a str>,
    /// What the detection model found in the call's texts, (type, value); empty without one.
    pub dlp_found: &'a [(String, String)],
    /// The detection model was asked and did not answer (an error or its timeout): a call whose
    /// policies want its detectors is blocked.
    pub dlp_model_failed: bool,
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
    /// The input-token bound the budget reservation prices (see [`input_token_bound`]).
    pub input_tokens_bound: i64,
    /// The output tokens the reservation prices: `max_tokens` (proxy), the model's
    /// `max_output_tokens` (generate), 0 (embeddings).
    pub output_tokens_bound: i64,
    pub plan: Arc<Plan>,
    /// Kept for rendering async status and content URLs (generate only).
    pub api_key: Secret,
    pub output_media_type: Option<String>,
    /// Set on the standard entry routes: how the response is translated back.
    pub entry: Option<EntryPlan>,
    /// OpenAI embeddings: the upstream body of every input, one call each (`body` is the first).
    pub embedding_bodies: Vec<Vec<u8>>,
}

/// How an entry-route call's response reaches the caller.
#[derive(Clone, Debug)]
pub struct EntryPlan {
    /// The upstream's wire format (always streamed).
    pub upstream: Format,
    /// The caller's.
    pub entry: Format,
    /// Whether the caller asked for a stream.
    pub client_stream: bool,
    /// OpenAI's `stream_options.include_usage` as the caller set it.
    pub include_usage: bool,
    /// Request fields the entry codec could not classify (schema drift).
    pub unknown: Vec<String>,
    /// The tools the caller declared (context signals): each distinct name once, in order, with
    /// the size in bytes of its definition as JSON (name, description, parameter schema); at
    /// most [`MAX_TOOLS_RECORDED`].
    pub tools: Vec<(String, u32)>,
}

pub use crate::signals::{
    record_tool_name, recorded_tool_name, DECLARED_NAME_BUDGET, INVOKED_NAME_BUDGET, MAX_TOOLS_RECORDED,
};

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
    /// `Some(false)` when retrying cannot help (budget denials): `x-should-retry: false`.
    pub should_retry: Option<bool>,
    /// The governing limit (highest utilization among those that apply), when known.
    pub limit: Option<Governing>,
    /// What an admitted call holds in the segment; released on drop.
    pub holds: Option<Holds>,
    /// The model's prices as the call was decided, set with [`Self::upstream`]: the reservation
    /// is priced with them, and so is the call (a config change mid-call moves neither).
    pub rates: Option<Rates>,
    /// The call on the model's next deployment, for one failover.
    pub fallback: Option<Fallback>,
    /// Set once by [`Self::failover`]: from then on the call is the fallback's.
    failed_over: AtomicBool,
    /// The entry API whose error shape a denial takes; `None`: Mesh's `{"error": code, ...}`.
    error_shape: Option<Format>,
    /// The first enforcing rule's warning whose threshold is reached (`X-Meshfast-Warning`).
    pub warning: Option<String>,
    /// A shadow rule that would have refused the call (its id).
    pub would_deny: Option<String>,
    /// What rules did at the decision (a pause that began, a block's notification).
    pub events: Vec<crate::govern::Event>,
    /// The caller's organisation at call time (the row keeps it).
    pub business_unit: Option<String>,
    pub manager_id: Option<String>,
    pub tier: Option<String>,
    /// The model's tags at call time (the row keeps them).
    pub model_tags: Vec<String>,
    /// In a cluster, the budget lease the call was refused for want of (the caller asks the
    /// database for one and decides again).
    pub lease_wanted: Option<LeaseWant>,
    /// A platform token's issuer (`iss`) and subject (`sub`), when one authenticated the call.
    pub token_issuer: Option<String>,
    pub token_subject: Option<String>,
    /// `user` or `application`, once the caller is known.
    pub principal_kind: Option<&'static str>,
    /// What data protection found (matches by detector) and did (the strongest action).
    pub dlp: Vec<(String, u32)>,
    pub dlp_action: Option<&'static str>,
    /// Surrogate → original of what was pseudonymized: the answer's stream puts them back.
    pub dlp_restore: Vec<(String, String)>,
    /// A data protection policy with a detector on applies to this caller, model and provider
    /// (whether or not anything was found).
    pub dlp_applies: bool,
    /// Refused only because the detection model's answer was missing and this call's policies
    /// want its detectors: the edge asks the model, then decides again.
    pub dlp_needs_model: bool,
}

/// An admitted call rendered for the model's next deployment (by priority): where it goes after
/// a connection failure or a 503 from the first. It runs under the first call's holds.
pub struct Fallback {
    pub provider_id: String,
    pub local: bool,
    pub upstream: Upstream,
    /// The deployment's provider's concurrency, rate and share limits, taken on failover.
    pub limits: ProviderLimits,
    /// The deployment's provider's [`crate::shm::PROVIDER_CALLS_HOUR`] counter this hour, and its limit.
    calls_key: u128,
    max_calls_per_hour: Option<i64>,
    segment: Option<Arc<Segment>>,
}

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // NOTE: not the upstream call: its headers carry the provider key.
        f.debug_struct("Fallback")
            .field("provider_id", &self.provider_id)
            .finish_non_exhaustive()
    }
}

/// The limit that governs a call, for `X-Meshfast-Limit` / `-Utilization` / `-Reset`.
#[derive(Clone, Debug, PartialEq)]
pub struct Governing {
    /// `policy.daily_usd`, `policy.hourly_calls`, `provider.hourly_calls` or `rule:<id>`.
    pub id: Cow<'static, str>,
    /// Percent of the limit used, counting this call (and, for spend, open reservations).
    pub utilization: f64,
    /// When the limit's window resets (unix ms).
    pub reset_at_ms: i64,
}

impl Prepared {
    /// Refuses the call: its status, the row's `deny_reason` and the answer in the route's shape,
    /// rendered once: Mesh's `{"error": code, "detail"?, ...extras}`, or the entry API's own
    /// (which carries the detail in its message and no extras).
    fn deny(&mut self, outcome: Outcome, detail: Option<&str>, extras: impl FnOnce(&mut Vec<u8>)) {
        self.deny_reason = Some(outcome.spec().code);
        let spec = outcome.answers_as().spec();
        if !spec.retryable {
            self.should_retry = Some(false);
        }
        if let Some(format) = self.error_shape {
            let wire = outcome.on_entry_route();
            self.status = wire.status();
            self.body = crate::entry::error_body(format, self.status, wire.code(), detail);
            return;
        }
        self.status = spec.status;
        self.body.clear();
        self.body.extend_from_slice(b"{\"error\":\"");
        self.body.extend_from_slice(spec.code.as_bytes());
        self.body.push(b'"');
        if let Some(detail) = detail {
            self.body.extend_from_slice(b",\"detail\":");
            write_str(&mut self.body, detail);
        }
        extras(&mut self.body);
        self.body.extend_from_slice(b"}\n");
    }

    fn invalid(&mut self, detail: Option<&str>) {
        self.deny(Outcome::InvalidRequest, detail, |_| {});
    }
}

#[cfg(test)]
mod test_support {
    use std::sync::Arc;

    use super::{Prepared, Request, Route};
    use crate::shm::Segment;
    use crate::snapshot::test_support::TOKEN;

    pub(super) const NOON_WED: i64 = 1_741_176_000_000; // 2025-03-05T12:00:00Z, inside the Paris window

    pub(super) fn req(route: Route, query: &str, body: &[u8]) -> Request<'static> {
        Request {
            route,
            model: None,
            stream: None,
            authorization: Some(Box::leak(format!("Bearer {TOKEN}").into_boxed_str())),
            x_api_key: None,
            x_goog_api_key: None,
            query_string: Some(Box::leak(query.to_owned().into_boxed_str())),
            body: Box::leak(body.to_vec().into_boxed_slice()),
            now_ms: NOON_WED,
            cache_off: false,
            workflow: None,
            dlp_found: &[],
            dlp_model_failed: false,
        }
    }

    pub(super) fn body_json(p: &Prepared) -> serde_json::Value {
        assert_eq!(p.body.last(), Some(&b'\n'));
        serde_json::from_slice(&p.body).unwrap()
    }

    pub(super) fn segment(name: &str) -> (std::path::PathBuf, Arc<Segment>) {
        let path = std::env::temp_dir().join(format!("meshfast-test-{}-{name}", std::process::id()));
        let segment = Arc::new(Segment::create(&path, 256, 256, 64).unwrap());
        (path, segment)
    }
}
