//! Every way the data plane refuses or fails a call, in one table: the Mesh code, the HTTP
//! status, the sentence SDKs show, whether the answer carries `Retry-After` or
//! `x-should-retry: false`, and whether the code is a row's `deny_reason`.
//!
//! The code is spelled here and nowhere else: `prepare` denies with an [`Outcome`], the entry
//! routes render it in their API's own shape ([`crate::entry::error_body`]), and the bindings
//! export the table as `meshfast._core.OUTCOMES`, from which `meshfast/errors.py` builds the
//! data plane's exceptions and `meshfast/metrics.py` its deny-reason series. Admin-only codes
//! (`version_conflict`, `if_match_required`, ...) live in `meshfast/errors.py` alone.

/// A data-plane denial or error (API.md "Errors on these routes" and "Semantics the SDKs depend on").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    InvalidOrRevokedKey,
    /// A platform token that is malformed, badly signed or uses an algorithm not allowed.
    InvalidToken,
    TokenExpired,
    UnknownIssuer,
    /// No key of the issuer has the token's `kid` (or its key set is too old to trust).
    UnknownKey,
    WrongAudience,
    /// A valid token for a person meshfast does not know (or no longer serves).
    UnknownPrincipal,
    /// Not granted for the route's kind; on the Mesh-native routes unknown names too.
    ModelNotPermitted,
    /// A name no model has (the standard routes' rows tell it apart from [`Outcome::ModelNotPermitted`]).
    UnknownModel,
    ModelBlocked,
    /// The call names a registered workflow its principal may not charge.
    WorkflowNotPermitted,
    OutsideAllowedHours,
    ProviderHourlyLimitReached,
    UserModelHourlyLimitReached,
    BudgetExceeded,
    PausedByAdmin,
    /// A model's restrictions refuse the caller's (or their leaders') organisation; answered as an
    /// unknown or not-permitted model ([`Outcome::answers_as`]), the row keeps which layer.
    RestrictedByLeader,
    /// A model is closed to the caller's business unit (answered like [`Outcome::RestrictedByLeader`]).
    RestrictedByBusinessUnit,
    /// A staged model (not served yet): answered exactly like an unknown model, the row keeps why.
    ModelStaged,
    /// A limited model and a caller off its roster: answered like an unknown model.
    ModelLimited,
    /// A spend rule's `pause` holds the caller until `resume_at`.
    Paused,
    /// A spend rule's per-minute cap of calls or tokens.
    RateLimited,
    /// Process-wide pressure only.
    ServerBusy,
    /// A wait for the provider's rate, concurrency or admission share ran out.
    ProviderBusy,
    InvalidRequest,
    /// `X-Meshfast-Tags` names a key not allowed or a value out of shape.
    InvalidTags,
    /// A data protection policy blocks what the call carries (the detector is named, never the value).
    SensitiveContentBlocked,
    ContentTypeNotSupportedByModel,
    WebSearchNotSupportedByModel,
    EmbeddingsNotSupportedByProvider,
    GenerationNotSupportedByProvider,
    PayloadTooLarge,
    /// The body did not arrive within the body timeouts (idle or total).
    RequestTimeout,
    /// The caller left before its body was whole (nginx's 499; nobody reads the answer).
    ClientDisconnected,
    InternalError,
    /// The standard routes' answer to [`Outcome::UnknownModel`] and [`Outcome::ModelNotPermitted`].
    ModelNotFound,
    MethodNotAllowed,
    /// The upstream's final answer was a 429 (standard routes).
    UpstreamRateLimited,
    /// The upstream's final answer was a 5xx, a timeout or a transport error.
    UpstreamUnavailable,
    /// A stream that broke after it started (the format's own error event).
    UpstreamIncomplete,
}

/// One row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// The Mesh code: the error's `error` / `code` / `type` field and a denied row's `deny_reason`.
    pub code: &'static str,
    /// The HTTP status on the Mesh-native routes (the standard routes: [`Outcome::on_entry_route`]).
    pub status: u16,
    /// The sentence the standard routes put in the error's `message`.
    pub message: &'static str,
    /// The answer carries `Retry-After` (when the end is known).
    pub retry_after: bool,
    /// `false`: the answer carries `x-should-retry: false` (a denial that cannot clear by retrying).
    pub retryable: bool,
    /// A refusal written as `outcome=denied` with this code as `deny_reason`; `false` for wire-only
    /// codes and upstream failures (`outcome=upstream_error`).
    pub denial: bool,
}

impl Spec {
    const fn denial(code: &'static str, status: u16, message: &'static str) -> Self {
        Spec {
            code,
            status,
            message,
            retry_after: false,
            retryable: true,
            denial: true,
        }
    }

    const fn wire(code: &'static str, status: u16, message: &'static str) -> Self {
        Spec {
            denial: false,
            ..Spec::denial(code, status, message)
        }
    }

    const fn retry_after(self) -> Self {
        Spec {
            retry_after: true,
            ..self
        }
    }

    const fn not_retryable(self) -> Self {
        Spec {
            retryable: false,
            ..self
        }
    }
}

/// The sentence for a code outside the table.
pub const UNKNOWN_MESSAGE: &str = "The request could not be served.";

impl Outcome {
    /// Every outcome, denials first in the order the metrics list them.
    pub const ALL: [Outcome; 40] = [
        Outcome::InvalidOrRevokedKey,
        Outcome::InvalidToken,
        Outcome::TokenExpired,
        Outcome::UnknownIssuer,
        Outcome::UnknownKey,
        Outcome::WrongAudience,
        Outcome::UnknownPrincipal,
        Outcome::ModelNotPermitted,
        Outcome::UnknownModel,
        Outcome::ModelBlocked,
        Outcome::WorkflowNotPermitted,
        Outcome::OutsideAllowedHours,
        Outcome::ProviderHourlyLimitReached,
        Outcome::UserModelHourlyLimitReached,
        Outcome::BudgetExceeded,
        Outcome::PausedByAdmin,
        Outcome::RestrictedByLeader,
        Outcome::RestrictedByBusinessUnit,
        Outcome::ModelStaged,
        Outcome::ModelLimited,
        Outcome::Paused,
        Outcome::RateLimited,
        Outcome::ServerBusy,
        Outcome::ProviderBusy,
        Outcome::InvalidRequest,
        Outcome::InvalidTags,
        Outcome::SensitiveContentBlocked,
        Outcome::ContentTypeNotSupportedByModel,
        Outcome::WebSearchNotSupportedByModel,
        Outcome::EmbeddingsNotSupportedByProvider,
        Outcome::GenerationNotSupportedByProvider,
        Outcome::PayloadTooLarge,
        Outcome::RequestTimeout,
        Outcome::ClientDisconnected,
        Outcome::InternalError,
        Outcome::ModelNotFound,
        Outcome::MethodNotAllowed,
        Outcome::UpstreamRateLimited,
        Outcome::UpstreamUnavailable,
        Outcome::UpstreamIncomplete,
    ];

    /// The table.
    #[must_use]
    pub const fn spec(self) -> Spec {
        use Outcome as O;
        match self {
            O::InvalidOrRevokedKey => Spec::denial(
                "invalid_or_revoked_key",
                401,
                "The API key is missing, unknown, revoked or expired.",
            ),
            O::InvalidToken => Spec::denial(
                "invalid_token",
                401,
                "The token is malformed, its signature does not verify, or its algorithm is not allowed.",
            ),
            O::TokenExpired => Spec::denial("token_expired", 401, "The token has expired."),
            O::UnknownIssuer => Spec::denial("unknown_issuer", 401, "The token's issuer is not configured."),
            O::UnknownKey => Spec::denial("unknown_key", 401, "The token's signing key is not known."),
            O::WrongAudience => Spec::denial("wrong_audience", 401, "The token is not meant for this gateway."),
            O::UnknownPrincipal => Spec::denial(
                "unknown_principal",
                401,
                "The token names a person who is not known here.",
            ),
            O::ModelNotPermitted => Spec::denial("model_not_permitted", 403, "The model is not granted to you."),
            O::UnknownModel => Spec::denial("unknown_model", 404, "No model has this name."),
            O::ModelBlocked => Spec::denial("model_blocked", 403, "The model is blocked by an administrator."),
            O::WorkflowNotPermitted => Spec::denial(
                "workflow_not_permitted",
                403,
                "You may not charge calls to this workflow.",
            ),
            O::OutsideAllowedHours => Spec::denial(
                "outside_allowed_hours",
                403,
                "Calls to this model are not allowed at this time.",
            ),
            O::ProviderHourlyLimitReached => Spec::denial(
                "provider_hourly_limit_reached",
                429,
                "The provider's hourly call quota is used up.",
            )
            .retry_after(),
            O::UserModelHourlyLimitReached => Spec::denial(
                "user_model_hourly_limit_reached",
                429,
                "Your hourly call limit for this model is used up.",
            )
            .retry_after(),
            O::BudgetExceeded => Spec::denial("budget_exceeded", 429, "Your spending cap for this model is reached.")
                .retry_after()
                .not_retryable(),
            O::PausedByAdmin => {
                Spec::denial("paused_by_admin", 503, "The gateway is paused by an administrator.").retry_after()
            }
            O::RestrictedByLeader => {
                Spec::denial("model_restricted_by_leader", 403, "The model is not granted to you.")
            }
            O::RestrictedByBusinessUnit => Spec::denial(
                "model_restricted_by_business_unit",
                403,
                "The model is not granted to you.",
            ),
            O::ModelStaged => Spec::denial("model_staged", 403, "The model is not granted to you."),
            O::ModelLimited => Spec::denial("model_limited", 403, "The model is not granted to you."),
            O::Paused => Spec::denial("paused", 429, "A spending rule pauses your calls for a while.").retry_after(),
            O::RateLimited => Spec::denial(
                "rate_limited",
                429,
                "A rule's per-minute limit is reached; retry shortly.",
            )
            .retry_after(),
            O::ServerBusy => {
                Spec::denial("server_busy", 503, "The gateway is at capacity; retry shortly.").retry_after()
            }
            O::ProviderBusy => {
                Spec::denial("provider_busy", 503, "The provider is at capacity; retry shortly.").retry_after()
            }
            O::InvalidRequest => Spec::denial("invalid_request", 400, "The request is not valid."),
            O::InvalidTags => Spec::denial(
                "invalid_tags",
                400,
                "X-Meshfast-Tags must be key=value pairs separated by ';' with allowed keys and values of at most 64 of A-Z a-z 0-9 . _ -.",
            ),
            O::SensitiveContentBlocked => Spec::denial(
                "sensitive_content_blocked",
                400,
                "A data protection policy blocks sensitive content in this request.",
            ),
            O::ContentTypeNotSupportedByModel => Spec::denial(
                "content_type_not_supported_by_model",
                400,
                "The model does not accept this kind of content.",
            ),
            O::WebSearchNotSupportedByModel => Spec::denial(
                "web_search_not_supported_by_model",
                400,
                "The model does not offer web search.",
            ),
            O::EmbeddingsNotSupportedByProvider => Spec::denial(
                "embeddings_not_supported_by_provider",
                400,
                "The model's provider has no embeddings endpoint.",
            ),
            O::GenerationNotSupportedByProvider => Spec::denial(
                "generation_not_supported_by_provider",
                400,
                "The model's provider has no generation endpoint.",
            ),
            O::PayloadTooLarge => Spec::denial("payload_too_large", 413, "The request body is too large."),
            O::RequestTimeout => Spec::denial("request_timeout", 408, "The request body arrived too slowly."),
            O::ClientDisconnected => Spec::denial("client_disconnected", 499, "The caller left."),
            O::InternalError => Spec::denial("internal_error", 500, UNKNOWN_MESSAGE),
            O::ModelNotFound => Spec::wire(
                "model_not_found",
                404,
                "The model does not exist or you do not have access to it.",
            ),
            O::MethodNotAllowed => Spec::wire("method_not_allowed", 405, "The route does not take this method."),
            O::UpstreamRateLimited => {
                Spec::wire("upstream_rate_limited", 429, "The provider is rate limiting requests.").retry_after()
            }
            O::UpstreamUnavailable => Spec::wire("upstream_unavailable", 502, "The provider failed to answer."),
            O::UpstreamIncomplete => Spec::wire(
                "upstream_incomplete",
                502,
                "The provider's answer broke off before its end.",
            ),
        }
    }

    /// The Mesh code.
    #[must_use]
    pub const fn code(self) -> &'static str {
        self.spec().code
    }

    /// The HTTP status on the Mesh-native routes.
    #[must_use]
    pub const fn status(self) -> u16 {
        self.spec().status
    }

    /// What the standard routes answer instead: unknown, not-permitted, blocked and retired
    /// models are the same 404 [`Outcome::ModelNotFound`] (API.md; the row keeps the reason);
    /// every other outcome is itself.
    #[must_use]
    pub const fn on_entry_route(self) -> Outcome {
        match self {
            Outcome::ModelNotPermitted
            | Outcome::UnknownModel
            | Outcome::ModelBlocked
            | Outcome::RestrictedByLeader
            | Outcome::RestrictedByBusinessUnit
            | Outcome::ModelStaged
            | Outcome::ModelLimited => Outcome::ModelNotFound,
            other => other,
        }
    }

    /// What the Mesh-native routes answer for it: a restricted, staged or limited model is refused
    /// exactly like an unknown one or one not granted (the row keeps the reason); every other
    /// outcome is itself.
    #[must_use]
    pub const fn answers_as(self) -> Outcome {
        match self {
            Outcome::RestrictedByLeader
            | Outcome::RestrictedByBusinessUnit
            | Outcome::ModelStaged
            | Outcome::ModelLimited => Outcome::ModelNotPermitted,
            other => other,
        }
    }

    /// The outcome a code names.
    #[must_use]
    pub fn from_code(code: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.code() == code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// API.md's error lists: the Mesh-native routes' codes and statuses, and the standard routes'.
    const API_MD: &[(u16, &[&str])] = &[
        (
            401,
            &[
                "invalid_or_revoked_key",
                "invalid_token",
                "token_expired",
                "unknown_issuer",
                "unknown_key",
                "wrong_audience",
                "unknown_principal",
            ],
        ),
        (
            403,
            &[
                "model_not_permitted",
                "model_blocked",
                "outside_allowed_hours",
                "workflow_not_permitted",
            ],
        ),
        (
            429,
            &[
                "provider_hourly_limit_reached",
                "user_model_hourly_limit_reached",
                "budget_exceeded",
                "upstream_rate_limited",
            ],
        ),
        (503, &["paused_by_admin", "server_busy", "provider_busy"]),
        (
            400,
            &[
                "invalid_request",
                "content_type_not_supported_by_model",
                "invalid_tags",
                "sensitive_content_blocked",
            ],
        ),
        (413, &["payload_too_large"]),
        (502, &["upstream_unavailable"]),
        (404, &["model_not_found"]),
    ];

    #[test]
    fn api_md_codes_have_their_documented_status() {
        for &(status, codes) in API_MD {
            for &code in codes {
                let outcome = Outcome::from_code(code).unwrap_or_else(|| panic!("{code} is not in the table"));
                assert_eq!(outcome.status(), status, "{code}");
            }
        }
    }

    #[test]
    fn codes_are_unique_and_every_variant_is_listed() {
        let codes: HashSet<_> = Outcome::ALL.iter().map(|o| o.code()).collect();
        assert_eq!(codes.len(), Outcome::ALL.len());
        for outcome in Outcome::ALL {
            assert_eq!(Outcome::from_code(outcome.code()), Some(outcome));
            assert!(
                outcome.code().bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{outcome:?}"
            );
            assert!(!outcome.spec().message.is_empty());
        }
        assert_eq!(Outcome::from_code("no_such_code"), None);
    }

    #[test]
    fn denials_that_end_carry_retry_after_and_budget_says_do_not_retry() {
        for outcome in Outcome::ALL {
            let spec = outcome.spec();
            if spec.denial && matches!(spec.status, 429 | 503) {
                assert!(spec.retry_after, "{outcome:?}");
            }
            assert_eq!(spec.retryable, outcome != Outcome::BudgetExceeded, "{outcome:?}");
        }
    }

    #[test]
    fn standard_routes_answer_unknown_and_unpermitted_models_alike() {
        for outcome in [Outcome::UnknownModel, Outcome::ModelNotPermitted] {
            assert_eq!(outcome.on_entry_route(), Outcome::ModelNotFound);
            assert_eq!(outcome.on_entry_route().status(), 404);
        }
        assert_eq!(Outcome::BudgetExceeded.on_entry_route(), Outcome::BudgetExceeded);
    }

    #[test]
    fn staged_and_limited_models_answer_like_unknown_ones_on_every_route() {
        for outcome in [Outcome::ModelStaged, Outcome::ModelLimited] {
            assert_eq!(outcome.on_entry_route(), Outcome::UnknownModel.on_entry_route());
            assert_eq!(outcome.answers_as(), Outcome::ModelNotPermitted);
            assert!(outcome.spec().denial);
        }
        assert_eq!(Outcome::ModelStaged.code(), "model_staged");
        assert_eq!(Outcome::ModelLimited.code(), "model_limited");
    }

    #[test]
    fn wire_only_and_upstream_codes_are_not_deny_reasons() {
        let denials: Vec<_> = Outcome::ALL.iter().filter(|o| o.spec().denial).collect();
        // Denials come first, so the metrics' series keep their order.
        assert!(Outcome::ALL[..denials.len()].iter().all(|o| o.spec().denial));
        for outcome in [
            Outcome::ModelNotFound,
            Outcome::MethodNotAllowed,
            Outcome::UpstreamRateLimited,
            Outcome::UpstreamUnavailable,
            Outcome::UpstreamIncomplete,
        ] {
            assert!(!outcome.spec().denial, "{outcome:?}");
        }
    }
}
