//! An immutable, validated view of one config, built from the msgpack bytes that Python's
//! msgspec encodes. Built once per config change; read lock-free by every request.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use chrono_tz::Tz;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::jwt::{Identity, Issuer, TokenCache, TokenError};
use crate::keyindex::{Digest, KeyIndex};
use crate::pricing::{LongContext, Prices, Rates};
use crate::provider::{Family, GenericTemplates, Plan};
use crate::ruleset::people;
use crate::shm::{id_bytes, KeyTemplate, CALLS_HOUR, PROVIDER_CALLS_HOUR, SPEND_DAY};

#[derive(Deserialize)]
struct RawConfig {
    seq: i64,
    #[serde(default)]
    kill_switch: bool,
    #[serde(default)]
    principals: Vec<RawPrincipal>,
    #[serde(default)]
    keys: Vec<RawKey>,
    #[serde(default)]
    providers: Vec<RawProvider>,
    #[serde(default)]
    models: Vec<RawModel>,
    #[serde(default)]
    grants: Vec<RawGrant>,
    /// More grants, packed (what a worker's rebuild sends); after `grants`.
    #[serde(default)]
    grant_table: Option<RawGrantTable>,
    #[serde(default)]
    rules: Vec<crate::ruleset::RawRule>,
    #[serde(default = "yes")]
    enforce_rules: bool,
    #[serde(default)]
    calendar_tz: Option<String>,
    /// Platform token issuers, meshfast's own among them.
    #[serde(default)]
    issuers: Vec<crate::jwt::RawIssuer>,
    /// Registered workflows (budgets of calls tagged `workflow=<id>`).
    #[serde(default)]
    workflows: Vec<RawWorkflow>,
    /// Data protection: the enabled policies and the detectors they use.
    #[serde(default)]
    dlp: crate::dlp::RawDlp,
}

#[derive(Deserialize)]
struct RawWorkflow {
    id: String,
    /// The row's UUID: the counters' id bytes (a workflow re-registered under the same id starts
    /// from nothing).
    uid: String,
    limit_nano: i64,
    window: String,
    /// `None`: anyone may charge it; else these principals (indexes) and business units.
    #[serde(default)]
    principals: Option<Vec<i64>>,
    #[serde(default)]
    business_units: Vec<String>,
}

/// A registered workflow's budget: calls tagged `workflow=<id>` reserve against it.
#[derive(Debug)]
pub struct Workflow {
    pub id: String,
    /// The row's UUID (the counters' and the database's name for it).
    pub uid: String,
    pub limit_nano: i64,
    pub window: crate::ruleset::CalendarWindow,
    /// Who may charge it (`None`: anyone): principal indexes (sorted) and business units.
    pub principals: Option<(Vec<u32>, Vec<String>)>,
    pub key: KeyTemplate,
}

impl Workflow {
    /// Whether `principal` may charge this workflow.
    #[must_use]
    pub fn permits(&self, snapshot: &Snapshot, principal: u32) -> bool {
        let Some((people, units)) = &self.principals else {
            return true;
        };
        people.binary_search(&principal).is_ok()
            || snapshot.principals[principal as usize]
                .business_unit
                .as_ref()
                .is_some_and(|bu| units.iter().any(|u| u == bu))
    }
}

#[derive(Deserialize)]
struct RawPrincipal {
    id: String,
    email: String,
    display_name: String,
    status: String,
    expires_at_ms: Option<i64>,
    /// The manager's index in `principals`.
    #[serde(default)]
    manager: Option<i64>,
    #[serde(default)]
    business_unit: Option<String>,
    #[serde(default)]
    tier: Option<String>,
    /// An application rather than a person (no email, manager or tier).
    #[serde(default)]
    application: bool,
}

#[derive(Deserialize)]
struct RawKey {
    id: String,
    principal: i64,
    digest: serde_bytes::ByteBuf,
    status: String,
    expires_at_ms: Option<i64>,
    #[serde(default)]
    models: Option<Vec<i64>>,
}

fn yes() -> bool {
    true
}

fn two() -> i64 {
    2
}

fn two_hundred() -> i64 {
    200
}

fn default_max_output_tokens() -> i64 {
    4096
}

fn default_priority() -> i64 {
    100
}

#[derive(Deserialize)]
struct RawProvider {
    id: String,
    name: String,
    family: String,
    max_calls_per_hour: Option<i64>,
    #[serde(default)]
    supports_web_search: bool,
    #[serde(default)]
    base_url: String,
    #[serde(default)]
    api_key: String,
    #[serde(default)]
    local: bool,
    #[serde(default)]
    max_outbound_rps: Option<i64>,
    #[serde(default)]
    max_concurrent_upstream: Option<i64>,
    #[serde(default)]
    admission_share_pct: Option<i64>,
    #[serde(default = "yes")]
    retry_enabled: bool,
    #[serde(default = "two")]
    max_retries: i64,
    #[serde(default = "two_hundred")]
    retry_backoff_ms: i64,
    #[serde(default = "yes")]
    log_requests: bool,
    #[serde(default)]
    web_search_price_nano: i64,
    #[serde(default)]
    generic: Option<GenericTemplates>,
}

#[derive(Deserialize)]
struct RawModel {
    id: String,
    name: String,
    provider: i64,
    kind: String,
    created_ms: i64,
    #[serde(default)]
    blocked: bool,
    status: String,
    #[serde(default)]
    supports_image_in: bool,
    #[serde(default)]
    supports_document_in: bool,
    #[serde(default)]
    supports_audio_in: bool,
    #[serde(default)]
    supports_video_in: bool,
    #[serde(default)]
    supports_web_search: bool,
    /// Prompt-cache shaping (on unless the registry turns it off) and its Anthropic TTL.
    #[serde(default = "yes")]
    cache_shaping: bool,
    #[serde(default)]
    cache_ttl: Option<String>,
    output_media_type: Option<String>,
    input_price_nano_per_1k: i64,
    output_price_nano_per_1k: i64,
    #[serde(default)]
    resolved_model: Option<String>,
    #[serde(default = "default_max_output_tokens")]
    max_output_tokens: i64,
    #[serde(default)]
    price_per_second_nano: i64,
    #[serde(default)]
    cache_read_price_nano_per_1k: Option<i64>,
    #[serde(default)]
    cache_write_price_nano_per_1k: Option<i64>,
    #[serde(default)]
    cache_write_1h_price_nano_per_1k: Option<i64>,
    #[serde(default)]
    long_context_threshold_tokens: Option<i64>,
    /// Class name (`input`, `output`, `cache_read`, `cache_write`, `cache_write_1h`) to price;
    /// a class left out keeps the base tier's price.
    #[serde(default)]
    long_context_prices: Option<BTreeMap<String, i64>>,
    #[serde(default)]
    aliases: Vec<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    deployments: Vec<RawDeployment>,
    #[serde(default)]
    restrictions: Option<RawRestrictions>,
    /// A `limited` model's roster (principal indexes): the only callers it serves.
    #[serde(default)]
    roster: Vec<i64>,
    /// The members of live authoritative pilots listing the model (principal indexes): served
    /// whatever its release, roster or restrictions say.
    #[serde(default)]
    pilot_access: Vec<i64>,
}

#[derive(Deserialize, Default)]
pub(crate) struct RawRestrictions {
    #[serde(default)]
    leader_deny: Vec<i64>,
    #[serde(default)]
    leader_allow: Option<Vec<i64>>,
    #[serde(default)]
    exempt: Vec<i64>,
    #[serde(default)]
    business_units_closed: Vec<String>,
    #[serde(default)]
    business_units_open: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct RawDeployment {
    id: String,
    provider: i64,
    resolved_model: String,
    #[serde(default)]
    region: Option<String>,
    #[serde(default = "default_priority")]
    priority: i64,
}

/// A grant as one map: its principal, its model and its [`RawTerms`] fields side by side. (Not
/// `#[serde(flatten)]`: that buffers every map into generic content first, three times slower
/// for a million grants.)
#[derive(Deserialize)]
struct RawGrant {
    principal: i64,
    model: i64,
    daily_cap_nano_usd: i64,
    max_calls_per_hour: Option<i64>,
    allowed_from_min: Option<i64>,
    allowed_to_min: Option<i64>,
    #[serde(default)]
    timezone: String,
    #[serde(default)]
    active_days: Vec<i64>,
    #[serde(default)]
    always_open: bool,
}

impl RawGrant {
    fn terms(self) -> RawTerms {
        RawTerms {
            daily_cap_nano_usd: self.daily_cap_nano_usd,
            max_calls_per_hour: self.max_calls_per_hour,
            allowed_from_min: self.allowed_from_min,
            allowed_to_min: self.allowed_to_min,
            timezone: self.timezone,
            active_days: self.active_days,
            always_open: self.always_open,
        }
    }
}

/// Grants as fixed-size records over a table of their distinct terms: a million grants decode
/// as one byte string instead of a million maps, and each distinct set of terms (usually a
/// handful: most grants have the defaults) is validated once.
#[derive(Deserialize)]
struct RawGrantTable {
    /// [`GRANT_RECORD`] bytes a grant: its principal's index, its model's index and its terms'
    /// index in `terms`, each a big-endian `u32` (as PostgreSQL's `int4send` writes them).
    packed: serde_bytes::ByteBuf,
    terms: Vec<RawTerms>,
}

/// The bytes of one grant in [`RawGrantTable::packed`].
const GRANT_RECORD: usize = 12;

/// A grant's limits, as [`RawGrant`] carries them (beside its principal and model) and the grant
/// table lists them (a map or, from msgspec's `array_like` structs, an array in this order).
#[derive(Deserialize)]
struct RawTerms {
    daily_cap_nano_usd: i64,
    max_calls_per_hour: Option<i64>,
    allowed_from_min: Option<i64>,
    allowed_to_min: Option<i64>,
    #[serde(default)]
    timezone: String,
    #[serde(default)]
    active_days: Vec<i64>,
    #[serde(default)]
    always_open: bool,
}

/// A grant's validated limits: the part of a [`Grant`] that does not depend on who and what.
#[derive(Clone, Copy)]
struct Terms {
    daily_cap_nano_usd: i64,
    max_calls_per_hour: Option<i64>,
    window: Option<Window>,
    timezone: Tz,
    active_days: u8,
    always_open: bool,
}

impl Terms {
    /// Validates `raw`; `what` names it in an error (formatted only then: a million grants).
    fn build(errors: &mut Vec<String>, what: impl Fn() -> String, raw: &RawTerms) -> Self {
        let mut minutes = |v: Option<i64>, name: &str| match v {
            None => None,
            Some(m) if (0..=1440).contains(&m) => Some(m as u16),
            other => minute(errors, &format!("{}.{name}", what()), other),
        };
        let from = minutes(raw.allowed_from_min, "allowed_from_min");
        let to = minutes(raw.allowed_to_min, "allowed_to_min");
        let mut active_days = 0u8;
        for &day in &raw.active_days {
            match u8::try_from(day) {
                Ok(day @ 0..=6) => active_days |= 1 << day,
                _ => errors.push(format!("{}.active_days: {day} is not 0 (Sunday) ..= 6", what())),
            }
        }
        Self {
            daily_cap_nano_usd: raw.daily_cap_nano_usd,
            max_calls_per_hour: raw.max_calls_per_hour,
            window: from.zip(to).map(|(from_min, to_min)| Window { from_min, to_min }),
            timezone: if raw.timezone == "UTC" {
                Tz::UTC
            } else {
                raw.timezone.parse().unwrap_or(Tz::UTC)
            },
            active_days: if raw.active_days.is_empty() { 0x7F } else { active_days },
            always_open: raw.always_open,
        }
    }
}

/// A person or service that holds keys, with their place in the organisation.
#[derive(Clone, Debug)]
pub struct Principal {
    pub id: String,
    pub email: String,
    pub display_name: String,
    pub active: bool,
    pub expires_at_ms: Option<i64>,
    /// The manager's index in [`Snapshot::principals`]; following it upwards never loops (a
    /// config whose chain loops is refused), so [`Snapshot::leaders`] ends.
    pub manager: Option<u32>,
    pub business_unit: Option<String>,
    pub tier: Option<String>,
    /// An application (a registered service with its own keys) rather than a person; its
    /// `display_name` is its name and its `email` is empty.
    pub application: bool,
    /// The id as counter keys use it ([`id_bytes`]).
    pub key_bytes: [u8; 16],
}

/// Who a call's credential names.
#[derive(Clone, Debug)]
pub enum Caller {
    /// An issued key (its index in [`Snapshot::keys`]).
    Key(u32),
    /// A verified platform token.
    Token(Identity),
}

impl Caller {
    /// The principal's index in [`Snapshot::principals`].
    #[must_use]
    pub fn principal(&self, snapshot: &Snapshot) -> u32 {
        match self {
            Caller::Key(k) => snapshot.keys[*k as usize].principal,
            Caller::Token(identity) => identity.principal,
        }
    }

    /// The models the credential may call (`None`: every model granted).
    #[must_use]
    pub fn models<'a>(&self, snapshot: &'a Snapshot) -> Option<&'a [u32]> {
        match self {
            Caller::Key(k) => snapshot.keys[*k as usize].models.as_deref(),
            Caller::Token(_) => None,
        }
    }
}

/// An issued key, stored only as its digest.
#[derive(Clone, Debug)]
pub struct Key {
    pub id: String,
    pub principal: u32,
    pub digest: Digest,
    pub active: bool,
    pub expires_at_ms: Option<i64>,
    /// The models this key may call (sorted model indexes); `None`: every model its principal
    /// is granted.
    pub models: Option<Vec<u32>>,
}

impl Key {
    /// Whether this key may call `model` (a model index), grants aside.
    #[must_use]
    pub fn allows(&self, model: u32) -> bool {
        within(self.models.as_deref(), model)
    }
}

/// Whether `model` is in `only` (sorted model indexes; `None`: every model).
#[must_use]
pub fn within(only: Option<&[u32]>, model: u32) -> bool {
    only.is_none_or(|m| m.binary_search(&model).is_ok())
}

/// A provider credential: never printed, not even by `Debug`.
#[derive(Clone, Default)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "Secret(\"\")"
        } else {
            "Secret(***)"
        })
    }
}

/// An upstream provider.
#[derive(Clone, Debug)]
pub struct Provider {
    pub id: String,
    pub name: String,
    pub family: String,
    pub max_calls_per_hour: Option<i64>,
    pub supports_web_search: bool,
    /// [`PROVIDER_CALLS_HOUR`] key, period left open.
    pub calls_key: KeyTemplate,
    pub base_url: String,
    /// Decrypted by Python while building the config.
    pub api_key: Secret,
    /// May point at loopback or private addresses (the SSRF guard in Python reads this).
    pub local: bool,
    pub max_outbound_rps: Option<i64>,
    pub max_concurrent_upstream: Option<i64>,
    /// Largest share (percent) of the process-wide admission weight this provider's calls may
    /// hold at once; `None` = no share limit.
    pub admission_share_pct: Option<i64>,
    pub retry_enabled: bool,
    pub max_retries: i64,
    pub retry_backoff_ms: i64,
    /// False makes the provider "silent": none of its calls or denials are logged.
    pub log_requests: bool,
    pub web_search_price_nano: i64,
    /// Templates and paths, compiled.
    pub plan: Arc<Plan>,
}

/// What a model produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    Chat,
    Embedding,
    ImageGeneration,
    VideoGeneration,
}

impl ModelKind {
    fn parse(kind: &str) -> Option<Self> {
        Some(match kind {
            "chat" => Self::Chat,
            "embedding" => Self::Embedding,
            "image_generation" => Self::ImageGeneration,
            "video_generation" => Self::VideoGeneration,
            _ => return None,
        })
    }

    /// The config name (`chat`, `embedding`, `image_generation`, `video_generation`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Embedding => "embedding",
            Self::ImageGeneration => "image_generation",
            Self::VideoGeneration => "video_generation",
        }
    }
}

/// A model offered through a provider.
#[derive(Clone, Debug)]
pub struct Model {
    pub id: String,
    pub name: String,
    pub provider: u32,
    pub kind: ModelKind,
    pub created_ms: i64,
    pub blocked: bool,
    pub retired: bool,
    pub supports_image_in: bool,
    pub supports_document_in: bool,
    pub supports_audio_in: bool,
    pub supports_video_in: bool,
    pub supports_web_search: bool,
    pub output_media_type: Option<String>,
    /// The base tier's per-1k-token prices.
    pub prices: Prices,
    /// The tier above a prompt size, when the registry defines one.
    pub long_context: Option<LongContext>,
    /// The upstream's name for the model (`{{model}}`); the registry name when unset.
    pub resolved_model: String,
    /// The default `max_tokens` of a call that sets none.
    pub max_output_tokens: i64,
    pub price_per_second_nano: i64,
    /// Other names callers may use; unique together with every model name.
    pub aliases: Vec<String>,
    pub tags: Vec<String>,
    /// Deployments beyond the model's own (`provider`, `resolved_model`), by priority: a call
    /// fails over to the first once.
    pub deployments: Vec<Deployment>,
    /// Who may use the model beyond their grant.
    pub restrictions: Option<Restrictions>,
    /// Where the model stands in its onboarding (staged, limited to a roster, or released).
    pub release: Release,
    /// Members of live authoritative pilots listing the model (sorted principal indexes): for
    /// them the pilot decides access, over the release, the roster and the restrictions.
    pub pilot_access: Vec<u32>,
    /// Prompt-cache shaping for this model ([`crate::translate::cache`]); breakpoints with the
    /// one-hour TTL when `cache_ttl_1h`.
    pub cache_shaping: bool,
    pub cache_ttl_1h: bool,
    /// The id as counter keys use it ([`id_bytes`]).
    pub key_bytes: [u8; 16],
}

/// A model's onboarding stage (API.md "Governed lifecycle", model `status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// Served to everyone granted it (status `active`).
    General,
    /// Not served (status `staged`): it answers like an unknown model.
    Staged,
    /// Served to its roster only (sorted principal indexes; status `limited`).
    Limited(Vec<u32>),
}

/// Why a model's access layers refuse a caller granted it (see [`Model::refuses`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Staged,
    /// A limited model and a caller outside its roster.
    Limited,
    Restricted(Restricted),
}

/// Who may use a model beyond their grant (API.md `PUT /admin/models/{id}` `restrictions`).
#[derive(Clone, Debug, Default)]
pub struct Restrictions {
    pub leader_deny: Vec<u32>,
    pub leader_allow: Option<Vec<u32>>,
    pub exempt: Vec<u32>,
    pub business_units_closed: Vec<String>,
    pub business_units_open: Option<Vec<String>>,
}

/// Which layer of a model's restrictions refused a caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restricted {
    Leader,
    BusinessUnit,
}

impl Restrictions {
    pub(crate) fn build(errors: &mut Vec<String>, what: &str, raw: RawRestrictions, principals: usize) -> Self {
        Self {
            leader_deny: people(errors, &format!("{what}.leader_deny"), &raw.leader_deny, principals),
            leader_allow: raw
                .leader_allow
                .map(|l| people(errors, &format!("{what}.leader_allow"), &l, principals)),
            exempt: people(errors, &format!("{what}.exempt"), &raw.exempt, principals),
            business_units_closed: raw.business_units_closed,
            business_units_open: raw.business_units_open,
        }
    }

    /// Why `principal` may not use the model, or None. The exempt always may; then a closed
    /// business unit, one outside the open list, a denied leader's organisation, or being outside
    /// every allowed leader's organisation refuses.
    #[must_use]
    pub fn refuses(&self, snapshot: &Snapshot, principal: u32) -> Option<Restricted> {
        if self.exempt.contains(&principal) {
            return None;
        }
        let unit = snapshot.principals[principal as usize].business_unit.as_deref();
        if unit.is_some_and(|u| self.business_units_closed.iter().any(|c| c == u)) {
            return Some(Restricted::BusinessUnit);
        }
        if let Some(open) = &self.business_units_open {
            if !unit.is_some_and(|u| open.iter().any(|o| o == u)) {
                return Some(Restricted::BusinessUnit);
            }
        }
        if self
            .leader_deny
            .iter()
            .any(|&l| snapshot.in_organisation_of(principal, l))
        {
            return Some(Restricted::Leader);
        }
        if let Some(allow) = &self.leader_allow {
            if !allow.iter().any(|&l| snapshot.in_organisation_of(principal, l)) {
                return Some(Restricted::Leader);
            }
        }
        None
    }
}

impl Model {
    /// Why `principal` may not use the model (past the grant, blocked and retired checks), or
    /// None. A member of a live authoritative pilot listing it always may (the pilot decides
    /// access for its members); otherwise a staged model refuses everyone, a limited one everyone
    /// off its roster, then its restrictions apply. Each layer only narrows the one above.
    #[must_use]
    pub fn refuses(&self, snapshot: &Snapshot, principal: u32) -> Option<Refused> {
        if self.pilot_access.binary_search(&principal).is_ok() {
            return None;
        }
        match &self.release {
            Release::Staged => return Some(Refused::Staged),
            Release::Limited(roster) if roster.binary_search(&principal).is_err() => return Some(Refused::Limited),
            _ => {}
        }
        self.restrictions
            .as_ref()
            .and_then(|r| r.refuses(snapshot, principal))
            .map(Refused::Restricted)
    }

    /// What a call on this model through `provider` is priced at (see [`Rates`]).
    #[must_use]
    pub fn rates(&self, provider: &Provider) -> Rates {
        Rates {
            prices: self.prices,
            long_context: self.long_context,
            per_second_nano: self.price_per_second_nano,
            web_search_nano: provider.web_search_price_nano,
        }
    }
}

/// Another place a model is served: a provider and that provider's name for the model.
#[derive(Clone, Debug)]
pub struct Deployment {
    pub id: String,
    pub provider: u32,
    pub resolved_model: String,
    pub region: Option<String>,
    /// Lower first.
    pub priority: i64,
}

/// Allowed minutes after local midnight, `[from_min, to_min)`; overnight when `from_min > to_min`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub from_min: u16,
    pub to_min: u16,
}

/// A principal's permission to use a model, with its limits.
#[derive(Clone, Debug)]
pub struct Grant {
    pub principal: u32,
    pub model: u32,
    /// 0 or less: no cap.
    pub daily_cap_nano_usd: i64,
    pub max_calls_per_hour: Option<i64>,
    /// Set only when both ends are configured.
    pub window: Option<Window>,
    /// Invalid or empty names fall back to UTC.
    pub timezone: Tz,
    /// Bit `d` set when weekday `d` (0 = Sunday) is allowed; an empty list allows all seven.
    pub active_days: u8,
    pub always_open: bool,
    /// [`SPEND_DAY`] key, period left open.
    pub spend_key: KeyTemplate,
    /// [`CALLS_HOUR`] key, period left open.
    pub calls_key: KeyTemplate,
}

/// One validated config with its indexes.
///
/// The large parts are shared (`Arc`), so a small change ([`Snapshot::with_principal`],
/// [`Snapshot::with_rules`]) makes a new snapshot without copying a million grants.
#[derive(Clone)]
pub struct Snapshot {
    pub seq: i64,
    pub kill_switch: bool,
    pub principals: Arc<Vec<Principal>>,
    pub keys: Arc<Vec<Key>>,
    pub providers: Arc<Vec<Provider>>,
    pub models: Arc<Vec<Model>>,
    pub grants: Arc<Vec<Grant>>,
    /// Spend rules, in precedence order.
    pub rules: Arc<crate::ruleset::Rules>,
    /// Per principal, its grant indexes sorted by model name.
    grants_by_principal: Arc<GrantIndex>,
    key_index: Arc<KeyIndex>,
    /// Platform token issuers, and their index by `iss`.
    pub issuers: Arc<Vec<Issuer>>,
    issuer_by_name: Arc<HashMap<String, u32>>,
    /// Why each issuer left out of [`Snapshot::issuers`] was (the worker logs them).
    pub issuer_problems: Arc<Vec<String>>,
    /// Principals by lowercased email, built on the first token (a config without token callers
    /// never pays for it).
    by_email: Arc<OnceLock<HashMap<String, u32>>>,
    /// Applications by id and by lowercased name, built on the first application token.
    by_application: Arc<OnceLock<HashMap<String, u32>>>,
    /// Verified tokens; a new one with every change of people or issuers.
    tokens: Arc<TokenCache>,
    /// Registered workflows, and their index by id.
    pub workflows: Arc<Vec<Workflow>>,
    /// Data protection (None: no policy is enabled).
    pub dlp: Arc<Option<crate::dlp::Dlp>>,
    workflow_by_id: Arc<HashMap<String, u32>>,
    model_by_id: Arc<HashMap<String, u32>>,
    /// Every model name and alias.
    model_by_name: Arc<HashMap<String, u32>>,
}

// NOTE: `what` is formatted only for an error (`format_args!`): 100,000 people and keys.
/// Per principal, its grant indexes sorted by model name, in one allocation (not one per person):
/// principal `p`'s are `grants[starts[p]..starts[p + 1]]`.
struct GrantIndex {
    starts: Vec<u32>,
    grants: Vec<u32>,
}

impl GrantIndex {
    /// Two counting sorts, no comparisons per grant: the grants in their model's name order,
    /// then dealt out to their principals in that order, so each principal's come out sorted
    /// (equal models, a duplicate grant, side by side).
    fn new(grants: &[Grant], principals: usize, models: &[Model]) -> Self {
        let mut by_name: Vec<usize> = (0..models.len()).collect();
        by_name.sort_unstable_by(|&a, &b| models[a].name.cmp(&models[b].name));
        let mut rank = vec![0usize; models.len()];
        for (r, &m) in by_name.iter().enumerate() {
            rank[m] = r;
        }
        let mut next_of_rank = vec![0u32; models.len() + 1];
        let mut starts = vec![0u32; principals + 1];
        for grant in grants {
            next_of_rank[rank[grant.model as usize] + 1] += 1;
            starts[grant.principal as usize + 1] += 1;
        }
        for i in 1..next_of_rank.len() {
            next_of_rank[i] += next_of_rank[i - 1];
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        let mut in_name_order = vec![0u32; grants.len()];
        for (i, grant) in grants.iter().enumerate() {
            let slot = &mut next_of_rank[rank[grant.model as usize]];
            in_name_order[*slot as usize] = i as u32;
            *slot += 1;
        }
        let mut next = starts.clone();
        let mut dealt = vec![0u32; grants.len()];
        for &i in &in_name_order {
            let slot = &mut next[grants[i as usize].principal as usize];
            dealt[*slot as usize] = i;
            *slot += 1;
        }
        Self { starts, grants: dealt }
    }

    /// Principal `principal`'s grants (none for an index out of range).
    fn of(&self, principal: u32) -> &[u32] {
        let p = principal as usize;
        match (self.starts.get(p), self.starts.get(p + 1)) {
            (Some(&from), Some(&to)) => &self.grants[from as usize..to as usize],
            _ => &[],
        }
    }
}

fn parse_status(errors: &mut Vec<String>, what: impl std::fmt::Display, status: &str, allowed: [&str; 2]) -> bool {
    if !allowed.contains(&status) {
        errors.push(format!("{what}: status {status:?} is not one of {allowed:?}"));
    }
    status == allowed[0]
}

fn index(errors: &mut Vec<String>, what: impl std::fmt::Display, value: i64, len: usize) -> u32 {
    if value < 0 || value as usize >= len {
        errors.push(format!("{what}: index {value} out of range (0..{len})"));
        return 0;
    }
    value as u32
}

fn minute(errors: &mut Vec<String>, what: &str, value: Option<i64>) -> Option<u16> {
    let value = value?;
    if !(0..=1440).contains(&value) {
        errors.push(format!("{what}: {value} is not a minute of the day (0..=1440)"));
        return None;
    }
    Some(value as u16)
}

/// The manager chains: every loop (a principal managing themselves included) is one error
/// naming its members. Each principal is walked once, so this is linear in their number.
fn chains(errors: &mut Vec<String>, principals: &[Principal]) {
    const UNSEEN: u8 = 0;
    const ON_WALK: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![UNSEEN; principals.len()];
    let mut walk = Vec::new();
    for start in 0..principals.len() as u32 {
        let mut at = Some(start);
        while let Some(i) = at {
            match state[i as usize] {
                DONE => break,
                ON_WALK => {
                    let from = walk.iter().position(|&w| w == i).unwrap_or(0);
                    let ids: Vec<&str> = walk[from..]
                        .iter()
                        .map(|&w| principals[w as usize].id.as_str())
                        .collect();
                    errors.push(format!("principals: the manager chain loops through {ids:?}"));
                    break;
                }
                _ => {
                    state[i as usize] = ON_WALK;
                    walk.push(i);
                    at = principals[i as usize].manager;
                }
            }
        }
        for w in walk.drain(..) {
            state[w as usize] = DONE;
        }
    }
}

/// Names and aliases, unique together: every clash is an error.
fn names(errors: &mut Vec<String>, models: &[Model]) -> HashMap<String, u32> {
    let mut by_name: HashMap<String, u32> = HashMap::with_capacity(models.len());
    let label = |i: u32| format!("models[{i}] ({:?})", models[i as usize].name);
    for (i, model) in models.iter().enumerate() {
        if let Some(&other) = by_name.get(&model.name) {
            errors.push(format!(
                "{}: name {:?} is also the name of {}",
                label(i as u32),
                model.name,
                label(other)
            ));
        }
        by_name.insert(model.name.clone(), i as u32);
    }
    for (i, model) in models.iter().enumerate() {
        for alias in &model.aliases {
            if alias.trim().is_empty() {
                errors.push(format!("{}: an alias is empty", label(i as u32)));
                continue;
            }
            match by_name.get(alias) {
                Some(&other) if other == i as u32 && *alias == model.name => {
                    errors.push(format!("{}: alias {alias:?} is the model's own name", label(i as u32)));
                }
                Some(&other) if other == i as u32 => {
                    errors.push(format!("{}: alias {alias:?} is listed twice", label(i as u32)))
                }
                Some(&other) if models[other as usize].name == *alias => {
                    errors.push(format!(
                        "{}: alias {alias:?} is the name of {}",
                        label(i as u32),
                        label(other)
                    ));
                }
                Some(&other) => errors.push(format!(
                    "{}: alias {alias:?} is also an alias of {}",
                    label(i as u32),
                    label(other)
                )),
                None => {
                    by_name.insert(alias.clone(), i as u32);
                }
            }
        }
    }
    by_name
}

/// The serviceability invariant (Cosmos §6): every deployment of a model serves every route the
/// model advertises, so a failover never lands where the call cannot be made. What a model
/// advertises is its own provider's: the route of its kind when that provider has the operation,
/// and the standard entry formats when it speaks a family the IR translates to. (A model whose own
/// provider lacks its kind's operation is answered per request, as Mesh:
/// `embeddings_not_supported_by_provider` and the like.) Deployments must also be distinct.
fn serviceable(errors: &mut Vec<String>, what: &str, model: &Model, providers: &[Provider]) {
    let Some(own) = providers.get(model.provider as usize) else {
        return;
    };
    let serves = |provider: &Provider| match model.kind {
        ModelKind::Chat => provider.plan.chat.is_some(),
        ModelKind::Embedding => provider.plan.embedding.is_some(),
        ModelKind::ImageGeneration | ModelKind::VideoGeneration => {
            provider.plan.generation.as_ref().is_some_and(|g| g.is_complete())
        }
    };
    let translates = |provider: &Provider| crate::provider::upstream_format(provider.plan.family).is_some();
    let mut seen = vec![(model.provider, model.resolved_model.as_str())];
    for (j, deployment) in model.deployments.iter().enumerate() {
        let at = format!("{what}.deployments[{j}]");
        let Some(provider) = providers.get(deployment.provider as usize) else {
            continue;
        };
        if seen.contains(&(deployment.provider, deployment.resolved_model.as_str())) {
            errors.push(format!(
                "{at}: provider {:?} with {:?} is already a deployment of the model",
                provider.name, deployment.resolved_model
            ));
        }
        seen.push((deployment.provider, deployment.resolved_model.as_str()));
        if !serves(provider) {
            errors.push(format!(
                "{at}: provider {:?} ({}) has no {} operation",
                provider.name,
                provider.family,
                model.kind.as_str()
            ));
        } else if model.kind == ModelKind::Chat && serves(own) && translates(own) && !translates(provider) {
            errors.push(format!(
                "{at}: provider {:?} has custom templates, so it cannot serve the standard entry formats the model advertises",
                provider.name
            ));
        }
    }
}

/// The configuration's shape as [`Snapshot::from_bytes`] decodes it, for checking the writer's
/// (Python's) field by field.
#[must_use]
pub fn config_shape() -> crate::schema::Shape {
    crate::schema::shape::<RawConfig>()
}

impl Snapshot {
    /// Decodes and validates `config` (msgpack), hashing tokens with `pepper`. On any problem
    /// returns [`Error::Snapshot`] listing all of them.
    pub fn from_msgpack(config: &[u8], pepper: &[u8]) -> Result<Self> {
        let raw: RawConfig =
            rmp_serde::from_slice(config).map_err(|e| Error::Snapshot(vec![format!("config does not decode: {e}")]))?;
        let mut errors = Vec::new();
        let e = &mut errors;

        let count = raw.principals.len();
        let principals: Vec<Principal> = raw
            .principals
            .into_iter()
            .enumerate()
            .map(|(i, p)| Principal {
                active: parse_status(e, format_args!("principals[{i}]"), &p.status, ["active", "revoked"]),
                manager: p
                    .manager
                    .map(|m| index(e, format_args!("principals[{i}].manager"), m, count)),
                key_bytes: id_bytes(&p.id),
                id: p.id,
                email: p.email,
                display_name: p.display_name,
                expires_at_ms: p.expires_at_ms,
                business_unit: p.business_unit,
                tier: p.tier,
                application: p.application,
            })
            .collect();
        chains(e, &principals);

        let mut digests = std::collections::HashSet::new();
        let model_count = raw.models.len();
        let keys: Vec<Key> = raw
            .keys
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                let digest = <[u8; 32]>::try_from(k.digest.as_slice()).unwrap_or_else(|_| {
                    e.push(format!("keys[{i}]: digest is {} bytes, expected 32", k.digest.len()));
                    [0; 32]
                });
                if !digests.insert(digest) {
                    e.push(format!("keys[{i}]: duplicate digest"));
                }
                Key {
                    principal: index(e, format_args!("keys[{i}].principal"), k.principal, principals.len()),
                    active: parse_status(e, format_args!("keys[{i}]"), &k.status, ["active", "revoked"]),
                    digest: Digest(digest),
                    id: k.id,
                    expires_at_ms: k.expires_at_ms,
                    models: k.models.map(|models| {
                        let mut models: Vec<u32> = models
                            .into_iter()
                            .enumerate()
                            .map(|(j, m)| index(e, format_args!("keys[{i}].models[{j}]"), m, model_count))
                            .collect();
                        models.sort_unstable();
                        models.dedup();
                        models
                    }),
                }
            })
            .collect();

        let providers: Vec<Provider> = raw
            .providers
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let what = format!("providers[{i}]");
                let family = Family::parse(&p.family).unwrap_or_else(|| {
                    e.push(format!(
                        "{what}: family {:?} is not generic, anthropic, openai, openai_responses, gemini or ollama",
                        p.family
                    ));
                    Family::Generic
                });
                let preset = Plan::preset(family, &p.base_url, !p.api_key.is_empty());
                let plan = match &p.generic {
                    Some(g) => Plan::from_generic(family, g, preset, e, &what),
                    None if family == Family::Generic => {
                        e.push(format!("{what}: a generic provider needs its templates"));
                        Plan::from_generic(family, &GenericTemplates::default(), None, e, &what)
                    }
                    None => preset.expect("every non-generic family has a preset"),
                };
                if p.max_retries < 0 || p.retry_backoff_ms < 0 || p.web_search_price_nano < 0 {
                    e.push(format!(
                        "{what}: negative max_retries, retry_backoff_ms or web_search_price_nano"
                    ));
                }
                Provider {
                    calls_key: KeyTemplate::new(PROVIDER_CALLS_HOUR, &[0; 16], &id_bytes(&p.id)),
                    id: p.id,
                    name: p.name,
                    family: p.family,
                    max_calls_per_hour: p.max_calls_per_hour,
                    supports_web_search: p.supports_web_search,
                    base_url: p.base_url,
                    api_key: Secret(p.api_key),
                    local: p.local,
                    max_outbound_rps: p.max_outbound_rps,
                    max_concurrent_upstream: p.max_concurrent_upstream,
                    admission_share_pct: p.admission_share_pct,
                    retry_enabled: p.retry_enabled,
                    max_retries: p.max_retries,
                    retry_backoff_ms: p.retry_backoff_ms,
                    log_requests: p.log_requests,
                    web_search_price_nano: p.web_search_price_nano,
                    plan: Arc::new(plan.finish()),
                }
            })
            .collect();

        let models: Vec<Model> = raw
            .models
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                let what = format!("models[{i}] ({:?})", m.name);
                let restrictions = m
                    .restrictions
                    .map(|r| Restrictions::build(e, &format!("{what}.restrictions"), r, count));
                let listed = |e: &mut Vec<String>, field: &str, list: &[i64]| {
                    let mut out: Vec<u32> = list
                        .iter()
                        .filter_map(|&p| {
                            if p < 0 || p as usize >= count {
                                e.push(format!("{what}.{field}: index {p} out of range (0..{count})"));
                                None
                            } else {
                                Some(p as u32)
                            }
                        })
                        .collect();
                    out.sort_unstable();
                    out.dedup();
                    out
                };
                let (retired, release) = match m.status.as_str() {
                    "active" => (false, Release::General),
                    "retired" => (true, Release::General),
                    "staged" => (false, Release::Staged),
                    "limited" => (false, Release::Limited(listed(e, "roster", &m.roster))),
                    other => {
                        e.push(format!(
                            "{what}: status {other:?} is not one of [\"active\", \"retired\", \"staged\", \"limited\"]"
                        ));
                        (true, Release::General)
                    }
                };
                if !m.roster.is_empty() && !matches!(release, Release::Limited(_)) {
                    e.push(format!("{what}: a roster needs status \"limited\""));
                }
                let pilot_access = listed(e, "pilot_access", &m.pilot_access);
                let kind = ModelKind::parse(&m.kind).unwrap_or_else(|| {
                    e.push(format!(
                        "{what}: kind {:?} is not chat, embedding, image_generation or video_generation",
                        m.kind
                    ));
                    ModelKind::Chat
                });
                let prices = Prices::resolve(
                    m.input_price_nano_per_1k,
                    m.output_price_nano_per_1k,
                    m.cache_read_price_nano_per_1k,
                    m.cache_write_price_nano_per_1k,
                    m.cache_write_1h_price_nano_per_1k,
                );
                if prices.all().iter().any(|&p| p < 0) || m.price_per_second_nano < 0 {
                    e.push(format!("{what}: negative price"));
                }
                if m.max_output_tokens <= 0 {
                    e.push(format!("{what}: max_output_tokens must be positive"));
                }
                let base = [
                    Some(m.input_price_nano_per_1k),
                    Some(m.output_price_nano_per_1k),
                    m.cache_read_price_nano_per_1k,
                    m.cache_write_price_nano_per_1k,
                    m.cache_write_1h_price_nano_per_1k,
                ];
                let long_context = LongContext::from_config(
                    e,
                    &what,
                    base,
                    m.long_context_threshold_tokens,
                    m.long_context_prices.as_ref(),
                );

                let mut deployments: Vec<Deployment> = m
                    .deployments
                    .into_iter()
                    .enumerate()
                    .map(|(j, d)| {
                        let at = format!("{what}.deployments[{j}]");
                        if d.resolved_model.is_empty() {
                            e.push(format!("{at}: resolved_model is empty"));
                        }
                        Deployment {
                            provider: index(e, format_args!("{at}.provider"), d.provider, providers.len()),
                            id: d.id,
                            resolved_model: d.resolved_model,
                            region: d.region,
                            priority: d.priority,
                        }
                    })
                    .collect();
                // NOTE: stable, so equal priorities keep the config's (creation) order.
                deployments.sort_by_key(|d| d.priority);
                Model {
                    provider: index(e, format_args!("{what}.provider"), m.provider, providers.len()),
                    retired,
                    release,
                    pilot_access,
                    kind,
                    created_ms: m.created_ms,
                    blocked: m.blocked,
                    supports_image_in: m.supports_image_in,
                    supports_document_in: m.supports_document_in,
                    supports_audio_in: m.supports_audio_in,
                    supports_video_in: m.supports_video_in,
                    supports_web_search: m.supports_web_search,
                    cache_shaping: m.cache_shaping,
                    cache_ttl_1h: match m.cache_ttl.as_deref() {
                        None | Some("5m") => false,
                        Some("1h") => true,
                        Some(other) => {
                            e.push(format!("{what}: cache_ttl {other:?} is not \"5m\" or \"1h\""));
                            false
                        }
                    },
                    output_media_type: m.output_media_type,
                    prices,
                    long_context,
                    resolved_model: m
                        .resolved_model
                        .filter(|r| !r.is_empty())
                        .unwrap_or_else(|| m.name.clone()),
                    max_output_tokens: m.max_output_tokens,
                    price_per_second_nano: m.price_per_second_nano,
                    aliases: m.aliases,
                    tags: m.tags,
                    deployments,
                    restrictions,
                    key_bytes: id_bytes(&m.id),
                    id: m.id,
                    name: m.name,
                }
            })
            .collect();
        let model_by_name = names(e, &models);
        for (i, model) in models.iter().enumerate() {
            serviceable(e, &format!("models[{i}] ({:?})", model.name), model, &providers);
        }

        let grant_count = raw.grants.len() + raw.grant_table.as_ref().map_or(0, |t| t.packed.len() / GRANT_RECORD);
        let mut grants: Vec<Grant> = Vec::with_capacity(grant_count);
        let grant = |principal: u32, model: u32, terms: &Terms| {
            let (principal_id, model_id) = (
                principals.get(principal as usize).map_or([0; 16], |p| p.key_bytes),
                models.get(model as usize).map_or([0; 16], |m| m.key_bytes),
            );
            Grant {
                principal,
                model,
                daily_cap_nano_usd: terms.daily_cap_nano_usd,
                max_calls_per_hour: terms.max_calls_per_hour,
                window: terms.window,
                timezone: terms.timezone,
                active_days: terms.active_days,
                always_open: terms.always_open,
                spend_key: KeyTemplate::new(SPEND_DAY, &principal_id, &model_id),
                calls_key: KeyTemplate::new(CALLS_HOUR, &principal_id, &model_id),
            }
        };
        // NOTE: a million grants: error texts are only formatted for a grant that has one.
        let in_range = |v: i64, len: usize| v >= 0 && (v as usize) < len;
        for (i, g) in raw.grants.into_iter().enumerate() {
            let principal = if in_range(g.principal, principals.len()) {
                g.principal as u32
            } else {
                index(e, format_args!("grants[{i}].principal"), g.principal, principals.len())
            };
            let model = if in_range(g.model, models.len()) {
                g.model as u32
            } else {
                index(e, format_args!("grants[{i}].model"), g.model, models.len())
            };
            let terms = Terms::build(e, || format!("grants[{i}]"), &g.terms());
            grants.push(grant(principal, model, &terms));
        }
        if let Some(table) = raw.grant_table {
            let terms: Vec<Terms> = table
                .terms
                .iter()
                .enumerate()
                .map(|(k, t)| Terms::build(e, || format!("grant_table.terms[{k}]"), t))
                .collect();
            if table.packed.len() % GRANT_RECORD != 0 {
                e.push(format!(
                    "grant_table.packed: {} bytes is not a whole number of {GRANT_RECORD}-byte grants",
                    table.packed.len()
                ));
            }
            let field = |record: &[u8], at: usize| {
                u32::from_be_bytes([record[at], record[at + 1], record[at + 2], record[at + 3]])
            };
            for (j, record) in table.packed.chunks_exact(GRANT_RECORD).enumerate() {
                let (principal, model, k) = (field(record, 0), field(record, 4), field(record, 8));
                let mut check = |value: u32, len: usize, name: &str| {
                    if value as usize >= len {
                        e.push(format!(
                            "grant_table[{j}].{name}: index {value} out of range (0..{len})"
                        ));
                    }
                };
                check(principal, principals.len(), "principal");
                check(model, models.len(), "model");
                check(k, terms.len(), "terms");
                if let Some(t) = terms.get(k as usize) {
                    grants.push(grant(principal, model, t));
                }
            }
        }

        let rules = crate::ruleset::Rules::build(
            e,
            raw.rules,
            raw.enforce_rules,
            raw.calendar_tz.as_deref().unwrap_or("UTC"),
            principals.len(),
            &models.iter().map(|m| m.tags.as_slice()).collect::<Vec<_>>(),
        );

        let mut issuer_by_name = HashMap::new();
        let mut issuer_problems = Vec::new();
        let issuers: Vec<Issuer> = raw
            .issuers
            .into_iter()
            .enumerate()
            .filter_map(|(i, raw)| {
                // NOTE: an issuer that cannot serve is left out (its tokens: unknown_issuer), never
                // the reason the whole config is refused: a second one of a name (meshfast's own
                // comes first), no usable algorithm, a set that is not JSON.
                let mut problems = Vec::new();
                let issuer = Issuer::build(&mut problems, &format!("issuers[{i}] ({:?})", raw.issuer), raw);
                if issuer_by_name.contains_key(&issuer.issuer) {
                    problems.push(format!("issuers[{i}]: a second issuer named {:?}", issuer.issuer));
                }
                if !problems.is_empty() {
                    issuer_problems.extend(problems);
                    return None;
                }
                issuer_by_name.insert(issuer.issuer.clone(), issuer_by_name.len() as u32);
                Some(issuer)
            })
            .collect();

        let mut workflow_by_id = HashMap::new();
        let workflows: Vec<Workflow> = raw
            .workflows
            .into_iter()
            .enumerate()
            .map(|(i, w)| {
                let what = format!("workflows[{i}] ({:?})", w.id);
                if workflow_by_id.insert(w.id.clone(), i as u32).is_some() {
                    e.push(format!("{what}: a second workflow with this id"));
                }
                if w.limit_nano <= 0 {
                    e.push(format!("{what}: limit must be positive"));
                }
                let window = crate::ruleset::CalendarWindow::parse(&w.window).unwrap_or_else(|| {
                    e.push(format!("{what}: window {:?} is not daily, weekly or monthly", w.window));
                    crate::ruleset::CalendarWindow::Daily
                });
                let principals = w.principals.map(|people| {
                    let mut people: Vec<u32> = people
                        .into_iter()
                        .enumerate()
                        .map(|(j, p)| index(e, format_args!("{what}.principals[{j}]"), p, principals.len()))
                        .collect();
                    people.sort_unstable();
                    (people, w.business_units)
                });
                Workflow {
                    key: KeyTemplate::new(crate::shm::WORKFLOW_SPEND, &[0; 16], &id_bytes(&w.uid)),
                    uid: w.uid,
                    id: w.id,
                    limit_nano: w.limit_nano,
                    window,
                    principals,
                }
            })
            .collect();

        let dlp =
            crate::dlp::Dlp::build(raw.dlp, principals.len(), models.len(), providers.len()).unwrap_or_else(|found| {
                e.extend(found);
                None
            });

        if raw.seq < 0 {
            errors.push(format!("seq {} is negative", raw.seq));
        }
        if !errors.is_empty() {
            return Err(Error::Snapshot(errors));
        }

        let grants_by_principal = GrantIndex::new(&grants, principals.len(), &models);
        for principal in 0..principals.len() as u32 {
            for pair in grants_by_principal.of(principal).windows(2) {
                let (a, b) = (&grants[pair[0] as usize], &grants[pair[1] as usize]);
                if a.model == b.model {
                    errors.push(format!(
                        "grants[{}]: duplicate grant of model {} to principal {}",
                        pair[1], b.model, b.principal
                    ));
                }
            }
        }
        if !errors.is_empty() {
            return Err(Error::Snapshot(errors));
        }
        let key_index = KeyIndex::new(pepper, keys.iter().map(|k| k.digest));
        let model_by_id = models
            .iter()
            .enumerate()
            .map(|(i, m)| (m.id.clone(), i as u32))
            .collect();
        Ok(Self {
            model_by_id: Arc::new(model_by_id),
            model_by_name: Arc::new(model_by_name),
            seq: raw.seq,
            kill_switch: raw.kill_switch,
            principals: Arc::new(principals),
            keys: Arc::new(keys),
            providers: Arc::new(providers),
            models: Arc::new(models),
            grants: Arc::new(grants),
            rules: Arc::new(rules),
            grants_by_principal: Arc::new(grants_by_principal),
            key_index: Arc::new(key_index),
            issuers: Arc::new(issuers),
            issuer_by_name: Arc::new(issuer_by_name),
            issuer_problems: Arc::new(issuer_problems),
            by_email: Arc::default(),
            by_application: Arc::default(),
            tokens: Arc::default(),
            workflows: Arc::new(workflows),
            workflow_by_id: Arc::new(workflow_by_id),
            dlp: Arc::new(dlp),
        })
    }

    /// The registered workflow with this id.
    #[must_use]
    pub fn workflow(&self, id: &str) -> Option<&Workflow> {
        self.workflow_by_id.get(id).map(|&i| &self.workflows[i as usize])
    }

    /// This snapshot with principal `index` replaced by `principal` (msgpack, the config's
    /// principal: manager as an index) at `seq`: an organisation change (manager, business unit,
    /// tier, status, expiry, names) without a rebuild. Refused like a config: an index out of
    /// range, a bad status or a manager chain that loops.
    pub fn with_principal(&self, seq: i64, index: u32, principal: &[u8]) -> Result<Self> {
        let raw: RawPrincipal = rmp_serde::from_slice(principal)
            .map_err(|e| Error::Snapshot(vec![format!("principal does not decode: {e}")]))?;
        let mut errors = Vec::new();
        let count = self.principals.len();
        if index as usize >= count {
            return Err(Error::Snapshot(vec![format!(
                "principal index {index} out of range (0..{count})"
            )]));
        }
        let what = format!("principals[{index}]");
        let mut principals = (*self.principals).clone();
        if raw.id != principals[index as usize].id {
            errors.push(format!(
                "{what}: the id is {:?}, not {:?}",
                raw.id, principals[index as usize].id
            ));
        }
        principals[index as usize] = Principal {
            active: parse_status(&mut errors, &what, &raw.status, ["active", "revoked"]),
            manager: raw
                .manager
                .map(|m| self::index(&mut errors, format_args!("{what}.manager"), m, count)),
            key_bytes: id_bytes(&raw.id),
            id: raw.id,
            email: raw.email,
            display_name: raw.display_name,
            expires_at_ms: raw.expires_at_ms,
            business_unit: raw.business_unit,
            tier: raw.tier,
            application: raw.application,
        };
        chains(&mut errors, &principals);
        if !errors.is_empty() {
            return Err(Error::Snapshot(errors));
        }
        Ok(Self {
            seq,
            principals: Arc::new(principals),
            // NOTE: an email or status may have changed: no old verdict about a token survives.
            by_email: Arc::default(),
            by_application: Arc::default(),
            tokens: Arc::default(),
            ..self.clone()
        })
    }

    /// This snapshot with its rules, switch and calendar replaced (msgpack
    /// `{rules, enforce_rules, calendar_tz}`) at `seq`: a rule change without a rebuild.
    pub fn with_rules(&self, seq: i64, rules: &[u8]) -> Result<Self> {
        #[derive(Deserialize)]
        struct RawRules {
            #[serde(default)]
            rules: Vec<crate::ruleset::RawRule>,
            #[serde(default = "yes")]
            enforce_rules: bool,
            #[serde(default)]
            calendar_tz: Option<String>,
        }
        let raw: RawRules =
            rmp_serde::from_slice(rules).map_err(|e| Error::Snapshot(vec![format!("rules do not decode: {e}")]))?;
        let mut errors = Vec::new();
        let rules = crate::ruleset::Rules::build(
            &mut errors,
            raw.rules,
            raw.enforce_rules,
            raw.calendar_tz.as_deref().unwrap_or("UTC"),
            self.principals.len(),
            &self.models.iter().map(|m| m.tags.as_slice()).collect::<Vec<_>>(),
        );
        if !errors.is_empty() {
            return Err(Error::Snapshot(errors));
        }
        Ok(Self {
            seq,
            rules: Arc::new(rules),
            ..self.clone()
        })
    }

    /// `SHA-256(pepper || token)`.
    #[must_use]
    pub fn digest(&self, token: &[u8]) -> Digest {
        self.key_index.digest(token)
    }

    /// The principal's prompt-cache key at one OpenAI provider (`prompt_cache_key`): 32 hex
    /// digits of `SHA-256(pepper || "meshfast-prompt-cache" || 0 || provider || 0 || principal)`,
    /// opaque without the pepper (no identity leaves), the same on every worker and instance, and
    /// different at each provider (two providers cannot link a person by it).
    #[must_use]
    pub fn cache_key(&self, principal_id: &str, provider_id: &str) -> String {
        let mut input = Vec::with_capacity(23 + provider_id.len() + principal_id.len());
        input.extend_from_slice(b"meshfast-prompt-cache\0");
        input.extend_from_slice(provider_id.as_bytes());
        input.push(0);
        input.extend_from_slice(principal_id.as_bytes());
        let digest = self.key_index.digest(&input);
        let mut out = String::with_capacity(32);
        for byte in &digest.0[..16] {
            out.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(byte & 15)]));
        }
        out
    }

    /// The index of the key behind `token` if it is issued and usable at `now_ms`: the key and
    /// its principal are both active and neither has expired.
    #[must_use]
    pub fn authenticate(&self, token: &str, now_ms: i64) -> Option<u32> {
        let index = self.key_index.lookup(token)?;
        let key = &self.keys[index as usize];
        let principal = &self.principals[key.principal as usize];
        let live = |expires: Option<i64>| expires.is_none_or(|at| now_ms < at);
        (key.active && principal.active && live(key.expires_at_ms) && live(principal.expires_at_ms)).then_some(index)
    }

    /// Who `token` (an issued key or a platform token) names at `now_ms`: `Err(None)` for a key
    /// that does not authenticate, `Err(Some(why))` for a token refused.
    pub fn identify(&self, token: &str, now_ms: i64) -> std::result::Result<Caller, Option<TokenError>> {
        if crate::jwt::is_jwt_shaped(token) {
            return self.verify_token(token, now_ms).map(Caller::Token).map_err(Some);
        }
        self.authenticate(token, now_ms).map(Caller::Key).ok_or(None)
    }

    /// A platform token verified (or its verdict remembered), its person still active.
    pub fn verify_token(&self, token: &str, now_ms: i64) -> std::result::Result<Identity, TokenError> {
        let identity = self
            .tokens
            .get_or_verify(token, now_ms, || self.verify_signature_and_claims(token, now_ms))?;
        self.still_valid(identity, now_ms)
    }

    /// [`Snapshot::verify_token`] without the cache (a first sight, every time).
    pub fn verify_token_uncached(&self, token: &str, now_ms: i64) -> std::result::Result<Identity, TokenError> {
        let identity = self
            .verify_signature_and_claims(token, now_ms)
            .map_err(TokenError::plain)?;
        self.still_valid(identity, now_ms)
    }

    fn verify_signature_and_claims(&self, token: &str, now_ms: i64) -> std::result::Result<Identity, TokenError> {
        let by_email = self.by_email.get_or_init(|| {
            self.principals
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.application)
                .filter_map(|(i, p)| crate::jwt::normal_email(&p.email).map(|e| (e, i as u32)))
                .collect()
        });
        crate::jwt::verify(&self.issuers, &self.issuer_by_name, token, now_ms, |who| match who {
            crate::jwt::Who::Email(email) => by_email.get(email).copied(),
            crate::jwt::Who::Application(name) => {
                let by_application = self.by_application.get_or_init(|| {
                    let mut map = HashMap::new();
                    for (i, p) in self.principals.iter().enumerate().filter(|(_, p)| p.application) {
                        map.insert(p.id.clone(), i as u32);
                        map.insert(p.display_name.to_ascii_lowercase(), i as u32);
                    }
                    map
                });
                by_application
                    .get(name)
                    .or_else(|| by_application.get(&name.to_ascii_lowercase()))
                    .copied()
            }
        })
    }

    fn still_valid(&self, identity: Identity, now_ms: i64) -> std::result::Result<Identity, TokenError> {
        if self.issuers[identity.issuer as usize]
            .good_until_ms
            .is_some_and(|until| now_ms >= until)
        {
            return Err(TokenError::UnknownKey(identity.issuer));
        }
        let person = &self.principals[identity.principal as usize];
        if !person.active || person.expires_at_ms.is_some_and(|at| now_ms >= at) {
            return Err(TokenError::UnknownPrincipal(None));
        }
        Ok(identity)
    }

    /// The principal's leader chain: their manager, that manager's manager, and so on up to
    /// someone without one (the principal not included). Ends: chains never loop.
    pub fn leaders(&self, principal: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(self.principals[principal as usize].manager, move |&m| {
            self.principals[m as usize].manager
        })
    }

    /// Whether `principal` is `leader` or reports to them, directly or through others (a rule's
    /// `leaders` population).
    #[must_use]
    pub fn in_organisation_of(&self, principal: u32, leader: u32) -> bool {
        principal == leader || self.leaders(principal).any(|m| m == leader)
    }

    /// The counter key of `grant`'s principal × model for `kind` and `period` (kinds whose keys
    /// the snapshot does not precompute, e.g. the rules' calendar windows).
    #[must_use]
    pub fn pair_key(&self, grant: &Grant, kind: u8, period: u32) -> u128 {
        let principal = &self.principals[grant.principal as usize];
        let model = &self.models[grant.model as usize];
        KeyTemplate::new(kind, &principal.key_bytes, &model.key_bytes).at(period)
    }

    /// Every counter of the principal × model pairs and providers that moved since the last
    /// checkpoint, in the periods given: `(kind, a id, b id, period, delta)` where `delta` =
    /// value − open reservations − its shadow (what the database already has, in the counter's
    /// slot). One pass over the grants, no Python per pair.
    pub fn counter_deltas(
        &self,
        segment: &crate::shm::Segment,
        pair_periods: &[(u8, u32)],
        provider_periods: &[(u8, u32)],
    ) -> Vec<(u8, u32, u32, u32, i64)> {
        let reserved = segment.reserved();
        let mut out = Vec::new();
        let delta = |kind: u8, a: &[u8; 16], b: &[u8; 16], period: u32| {
            let key = KeyTemplate::new(kind, a, b).at(period);
            let value = segment.get(key);
            if value == 0 {
                return None;
            }
            let held = reserved.get(&crate::shm::stored_key(key)).copied().unwrap_or(0);
            let moved = value - held - segment.shadow(key);
            (moved != 0).then_some(moved)
        };
        for grant in self.grants.iter() {
            let (p, m) = (
                &self.principals[grant.principal as usize],
                &self.models[grant.model as usize],
            );
            for &(kind, period) in pair_periods {
                if let Some(moved) = delta(kind, &p.key_bytes, &m.key_bytes, period) {
                    out.push((kind, grant.principal, grant.model, period, moved));
                }
            }
        }
        for (i, provider) in self.providers.iter().enumerate() {
            let id = id_bytes(&provider.id);
            for &(kind, period) in provider_periods {
                if let Some(moved) = delta(kind, &[0; 16], &id, period) {
                    out.push((kind, u32::MAX, i as u32, period, moved));
                }
            }
        }
        out
    }

    /// Removes the counters (with their shadows) of every pair and provider in the periods
    /// given; returns how many existed.
    pub fn remove_counters(
        &self,
        segment: &crate::shm::Segment,
        pair_periods: &[(u8, u32)],
        provider_periods: &[(u8, u32)],
    ) -> usize {
        let mut removed = 0;
        let mut drop = |kind: u8, a: &[u8; 16], b: &[u8; 16], period: u32| {
            removed += usize::from(segment.remove(KeyTemplate::new(kind, a, b).at(period)));
        };
        for grant in self.grants.iter() {
            let (p, m) = (
                &self.principals[grant.principal as usize],
                &self.models[grant.model as usize],
            );
            for &(kind, period) in pair_periods {
                drop(kind, &p.key_bytes, &m.key_bytes, period);
            }
        }
        for provider in self.providers.iter() {
            let id = id_bytes(&provider.id);
            for &(kind, period) in provider_periods {
                drop(kind, &[0; 16], &id, period);
            }
        }
        removed
    }

    /// The principal's grants.
    pub fn grants_of(&self, principal: u32) -> impl Iterator<Item = &Grant> + '_ {
        self.grants_by_principal
            .of(principal)
            .iter()
            .map(move |&g| &self.grants[g as usize])
    }

    /// The index of the principal's grant of the model named or aliased `name`.
    #[must_use]
    pub fn grant_index_by_name(&self, principal: u32, name: &str) -> Option<u32> {
        let list = self.grants_by_principal.of(principal);
        let name_of = |g: u32| self.models[self.grants[g as usize].model as usize].name.as_str();
        let at = match list.binary_search_by(|&g| name_of(g).cmp(name)) {
            Ok(at) => at,
            Err(_) => {
                let canonical = &self.models[self.model_named(name)? as usize].name;
                list.binary_search_by(|&g| name_of(g).cmp(canonical)).ok()?
            }
        };
        Some(list[at])
    }

    /// The index of the model with id `id`.
    #[must_use]
    pub fn model_index(&self, id: &str) -> Option<u32> {
        self.model_by_id.get(id).copied()
    }

    /// The index of the model named or aliased `name`.
    #[must_use]
    pub fn model_named(&self, name: &str) -> Option<u32> {
        self.model_by_name.get(name).copied()
    }

    /// The principal's grant of the model named or aliased `name` (any kind, blocked and
    /// retired included). Grants are on the model, so an alias reaches what its model's grant allows.
    #[must_use]
    pub fn grant_by_name(&self, principal: u32, name: &str) -> Option<&Grant> {
        self.grant_index_by_name(principal, name)
            .map(|g| &self.grants[g as usize])
    }

    /// [`Snapshot::visible_grants`] of the models in `only` (a key's subset; `None`: all).
    pub fn visible_grants_within<'a>(
        &'a self,
        principal: u32,
        only: Option<&'a [u32]>,
    ) -> impl Iterator<Item = (&'a Grant, &'a Model, &'a Provider)> + 'a {
        self.visible_grants(principal)
            .filter(move |(g, _, _)| within(only, g.model))
    }

    /// The grants a principal can see listed, sorted by model name: blocked and retired models,
    /// and those whose access layers refuse the principal (staged, limited to a roster without
    /// them, restricted), are left out.
    pub fn visible_grants(&self, principal: u32) -> impl Iterator<Item = (&Grant, &Model, &Provider)> {
        self.grants_by_principal.of(principal).iter().filter_map(move |&g| {
            let grant = &self.grants[g as usize];
            let model = &self.models[grant.model as usize];
            let refused = model.refuses(self, principal).is_some();
            (!model.blocked && !model.retired && !refused)
                .then(|| (grant, model, &self.providers[model.provider as usize]))
        })
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Config builders shared by this crate's tests.
    use super::*;
    use sha2::{Digest as _, Sha256};

    pub const PEPPER: &[u8] = b"test-pepper";
    pub const TOKEN: &str = "mesh_live_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    pub const OTHER_TOKEN: &str = "mesh_live_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";

    pub fn grant() -> Grant {
        Grant {
            principal: 0,
            model: 0,
            daily_cap_nano_usd: 0,
            max_calls_per_hour: None,
            window: None,
            timezone: Tz::UTC,
            active_days: 0x7F,
            always_open: false,
            spend_key: KeyTemplate::new(SPEND_DAY, &[1; 16], &[2; 16]),
            calls_key: KeyTemplate::new(CALLS_HOUR, &[1; 16], &[2; 16]),
        }
    }

    pub fn provider() -> Provider {
        Provider {
            id: "p".into(),
            name: "openai".into(),
            family: "openai".into(),
            max_calls_per_hour: None,
            supports_web_search: true,
            calls_key: KeyTemplate::new(PROVIDER_CALLS_HOUR, &[0; 16], &[3; 16]),
            base_url: "http://up".into(),
            api_key: Secret("sk-test".into()),
            local: false,
            max_outbound_rps: None,
            max_concurrent_upstream: None,
            admission_share_pct: None,
            retry_enabled: true,
            max_retries: 2,
            retry_backoff_ms: 200,
            log_requests: true,
            web_search_price_nano: 0,
            plan: Arc::new(Plan::preset(Family::OpenAi, "http://up", true).unwrap().finish()),
        }
    }

    pub fn digest(token: &str) -> serde_bytes::ByteBuf {
        let mut h = Sha256::new();
        h.update(PEPPER);
        h.update(token.as_bytes());
        serde_bytes::ByteBuf::from(h.finalize().to_vec())
    }

    /// A config as msgspec would encode it: structs as maps, `None` as nil.
    pub fn config() -> serde_json::Value {
        serde_json::json!({
            "seq": 7,
            "kill_switch": false,
            "principals": [
                {"id": "11111111-1111-1111-1111-111111111111", "email": "ada@example.com",
                 "display_name": "Ada \"A\" L.", "status": "active", "expires_at_ms": null},
                {"id": "22222222-2222-2222-2222-222222222222", "email": "bob@example.com",
                 "display_name": "Bob", "status": "revoked", "expires_at_ms": null}
            ],
            "keys": [
                {"id": "k0", "principal": 0, "digest": "TOKEN", "status": "active", "expires_at_ms": null},
                {"id": "k1", "principal": 1, "digest": "OTHER", "status": "active", "expires_at_ms": null}
            ],
            "providers": [
                {"id": "33333333-3333-3333-3333-333333333333", "name": "openai", "family": "openai",
                 "max_calls_per_hour": 1000, "supports_web_search": true}
            ],
            "models": [
                {"id": "44444444-4444-4444-4444-444444444444", "name": "gpt-b", "provider": 0, "kind": "chat",
                 "created_ms": 1700000000000_i64, "blocked": false, "status": "active",
                 "supports_image_in": true, "supports_document_in": false, "supports_audio_in": false,
                 "supports_video_in": false, "supports_web_search": true, "output_media_type": null,
                 "input_price_nano_per_1k": 1000, "output_price_nano_per_1k": 2000},
                {"id": "55555555-5555-5555-5555-555555555555", "name": "gpt-a-image", "provider": 0,
                 "kind": "image_generation", "created_ms": 1700000001000_i64, "blocked": false, "status": "active",
                 "supports_image_in": false, "supports_document_in": false, "supports_audio_in": false,
                 "supports_video_in": false, "supports_web_search": false, "output_media_type": "image/png",
                 "input_price_nano_per_1k": 0, "output_price_nano_per_1k": 0},
                {"id": "66666666-6666-6666-6666-666666666666", "name": "gpt-old", "provider": 0, "kind": "chat",
                 "created_ms": 0, "blocked": false, "status": "retired",
                 "supports_image_in": false, "supports_document_in": false, "supports_audio_in": false,
                 "supports_video_in": false, "supports_web_search": false, "output_media_type": null,
                 "input_price_nano_per_1k": 0, "output_price_nano_per_1k": 0}
            ],
            "grants": [
                {"principal": 0, "model": 0, "daily_cap_nano_usd": 2_500_000_000_i64, "max_calls_per_hour": 100,
                 "allowed_from_min": 540, "allowed_to_min": 1020, "timezone": "Europe/Paris",
                 "active_days": [1, 2, 3, 4, 5], "always_open": false},
                {"principal": 0, "model": 1, "daily_cap_nano_usd": 0, "max_calls_per_hour": null,
                 "allowed_from_min": null, "allowed_to_min": null, "timezone": "Not/AZone",
                 "active_days": [], "always_open": true},
                {"principal": 0, "model": 2, "daily_cap_nano_usd": 0, "max_calls_per_hour": null,
                 "allowed_from_min": null, "allowed_to_min": null, "timezone": "UTC",
                 "active_days": [], "always_open": true}
            ]
        })
    }

    /// Encodes a JSON-shaped config to msgpack, with `"TOKEN"`/`"OTHER"` digests as bin.
    pub fn encode(value: &serde_json::Value) -> Vec<u8> {
        fn convert(v: &serde_json::Value) -> rmpv::Value {
            match v {
                serde_json::Value::Null => rmpv::Value::Nil,
                serde_json::Value::Bool(b) => rmpv::Value::Boolean(*b),
                serde_json::Value::Number(n) => rmpv::Value::from(n.as_i64().unwrap()),
                serde_json::Value::String(s) if s == "TOKEN" => rmpv::Value::Binary(digest(TOKEN).to_vec()),
                serde_json::Value::String(s) if s == "OTHER" => rmpv::Value::Binary(digest(OTHER_TOKEN).to_vec()),
                serde_json::Value::String(s) => rmpv::Value::from(s.as_str()),
                serde_json::Value::Array(a) => rmpv::Value::Array(a.iter().map(convert).collect()),
                serde_json::Value::Object(o) => rmpv::Value::Map(
                    o.iter()
                        .map(|(k, v)| (rmpv::Value::from(k.as_str()), convert(v)))
                        .collect(),
                ),
            }
        }
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &convert(value)).unwrap();
        out
    }

    pub fn snapshot() -> Snapshot {
        Snapshot::from_msgpack(&encode(&config()), PEPPER).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{self, *};
    use super::*;
    use crate::pricing::Prices;

    #[test]
    fn test_valid_config_builds_sorted_grants_and_index() {
        let snapshot = snapshot();
        assert_eq!(snapshot.seq, 7);
        assert_eq!(snapshot.authenticate(TOKEN, 0), Some(0));
        let names: Vec<&str> = snapshot.visible_grants(0).map(|(_, m, _)| m.name.as_str()).collect();
        assert_eq!(
            names,
            ["gpt-a-image", "gpt-b"],
            "sorted by name, retired model left out"
        );
        assert_eq!(
            snapshot.grants[1].timezone,
            Tz::UTC,
            "invalid timezone falls back to UTC"
        );
        assert_eq!(snapshot.grants[0].active_days, 0b0011_1110);
    }

    /// `config` with its grants moved into a grant table: `records` (principal, model, terms
    /// index) over `terms` (arrays, as msgspec's `array_like` structs encode).
    fn with_grant_table(config: &serde_json::Value, records: &[[u32; 3]], terms: serde_json::Value) -> Vec<u8> {
        let mut value = rmpv::decode::read_value(&mut encode(config).as_slice()).unwrap();
        let packed: Vec<u8> = records.iter().flatten().flat_map(|v| v.to_be_bytes()).collect();
        let terms = rmpv::decode::read_value(&mut encode(&terms).as_slice()).unwrap();
        let rmpv::Value::Map(fields) = &mut value else {
            panic!("a config is a map")
        };
        fields.push((
            "grant_table".into(),
            rmpv::Value::Map(vec![
                ("packed".into(), rmpv::Value::Binary(packed)),
                ("terms".into(), terms),
            ]),
        ));
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &value).unwrap();
        out
    }

    #[test]
    fn test_a_grant_table_builds_the_same_grants_as_the_list() {
        let mut config = config();
        config["grants"] = serde_json::json!([]);
        let terms = serde_json::json!([
            [
                2_500_000_000_i64,
                100,
                540,
                1020,
                "Europe/Paris",
                [1, 2, 3, 4, 5],
                false
            ],
            [0, null, null, null, "Not/AZone", [], true],
            [0, null, null, null, "UTC", [], true]
        ]);
        let table = with_grant_table(&config, &[[0, 0, 0], [0, 1, 1], [0, 2, 2]], terms);
        let from_table = Snapshot::from_msgpack(&table, PEPPER).unwrap();
        let from_list = snapshot();
        assert_eq!(format!("{:?}", from_table.grants), format!("{:?}", from_list.grants));
        let names: Vec<&str> = from_table.visible_grants(0).map(|(_, m, _)| m.name.as_str()).collect();
        assert_eq!(names, ["gpt-a-image", "gpt-b"]);

        // The list and the table together: the table's grants follow the list's.
        let mut both = test_support::config();
        both["grants"] = serde_json::json!([both["grants"][0].clone()]);
        let terms = serde_json::json!([[0, null, null, null, "UTC", [], true]]);
        let snapshot =
            Snapshot::from_msgpack(&with_grant_table(&both, &[[0, 1, 0], [1, 2, 0]], terms), PEPPER).unwrap();
        let pairs: Vec<(u32, u32)> = snapshot.grants.iter().map(|g| (g.principal, g.model)).collect();
        assert_eq!(pairs, [(0, 0), (0, 1), (1, 2)]);
        assert_eq!(
            snapshot.grants[0].window,
            Some(Window {
                from_min: 540,
                to_min: 1020
            })
        );
        assert!(snapshot.grants[2].always_open);
    }

    #[test]
    fn test_a_bad_grant_table_lists_every_problem() {
        let config = config();
        let terms = serde_json::json!([[0, null, 2000, null, "UTC", [7], false]]);
        let bad = with_grant_table(&config, &[[0, 0, 0], [5, 0, 0], [0, 9, 1], [1, 0, 0]], terms);
        let Err(Error::Snapshot(errors)) = Snapshot::from_msgpack(&bad, PEPPER) else {
            panic!("config should be refused");
        };
        assert_eq!(
            errors,
            [
                "grant_table.terms[0].allowed_from_min: 2000 is not a minute of the day (0..=1440)",
                "grant_table.terms[0].active_days: 7 is not 0 (Sunday) ..= 6",
                "grant_table[1].principal: index 5 out of range (0..2)",
                "grant_table[2].model: index 9 out of range (0..3)",
                "grant_table[2].terms: index 1 out of range (0..1)",
            ]
        );

        // A grant of the table that repeats one of the list is a duplicate like any other.
        let terms = serde_json::json!([[0, null, null, null, "UTC", [], false]]);
        let Err(Error::Snapshot(errors)) =
            Snapshot::from_msgpack(&with_grant_table(&config, &[[0, 1, 0]], terms), PEPPER)
        else {
            panic!("a duplicate grant should be refused");
        };
        assert_eq!(errors, ["grants[3]: duplicate grant of model 1 to principal 0"]);

        // A torn record.
        let mut torn = rmpv::decode::read_value(
            &mut with_grant_table(
                &config,
                &[[0, 0, 0]],
                serde_json::json!([[0, null, null, null, "UTC", [], false]]),
            )
            .as_slice(),
        )
        .unwrap();
        if let rmpv::Value::Map(fields) = &mut torn {
            if let Some((_, rmpv::Value::Map(table))) =
                fields.iter_mut().find(|(k, _)| k.as_str() == Some("grant_table"))
            {
                table[0].1 = rmpv::Value::Binary(vec![0; 13]);
            }
        }
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &torn).unwrap();
        let Err(Error::Snapshot(errors)) = Snapshot::from_msgpack(&out, PEPPER) else {
            panic!("a torn grant table should be refused");
        };
        assert!(
            errors.iter().any(|e| e.contains("13 bytes is not a whole number")),
            "{errors:?}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// The counting-sort index lists each principal's grants as sorting them by model name
        /// (then by position) would.
        #[test]
        fn test_the_grant_index_sorts_each_principals_grants_by_model_name(
            names in proptest::collection::vec("[a-c]{1,3}", 1..8),
            pairs in proptest::collection::vec((0u32..5, 0usize..8), 0..60),
        ) {
            let mut model = test_support::snapshot().models[0].clone();
            let models: Vec<Model> = names
                .iter()
                .map(|n| {
                    model.name = n.clone();
                    model.clone()
                })
                .collect();
            let grants: Vec<Grant> = pairs
                .iter()
                .map(|&(p, m)| Grant { principal: p, model: (m % models.len()) as u32, ..test_support::grant() })
                .collect();
            let index = GrantIndex::new(&grants, 5, &models);
            for p in 0..5u32 {
                let mut expected: Vec<u32> = (0..grants.len() as u32).filter(|&g| grants[g as usize].principal == p).collect();
                expected.sort_by(|&a, &b| {
                    let name = |g: u32| &models[grants[g as usize].model as usize].name;
                    name(a).cmp(name(b)).then(a.cmp(&b))
                });
                let by_name = |list: &[u32]| list.iter().map(|&g| models[grants[g as usize].model as usize].name.clone()).collect::<Vec<_>>();
                proptest::prop_assert_eq!(by_name(index.of(p)), by_name(&expected));
                let mut same = index.of(p).to_vec();
                same.sort_unstable();
                let mut wanted = expected.clone();
                wanted.sort_unstable();
                proptest::prop_assert_eq!(same, wanted);
            }
            proptest::prop_assert!(index.of(5).is_empty());
        }
    }

    #[test]
    fn test_a_key_limited_to_models_allows_only_those() {
        let mut config = config();
        config["keys"][0]["models"] = serde_json::json!([2, 0, 2]);
        let snapshot = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let key = &snapshot.keys[0];
        assert_eq!(key.models.as_deref(), Some(&[0, 2][..]));
        assert!(key.allows(0) && !key.allows(1) && key.allows(2));
        assert!(snapshot.keys[1].allows(1), "no subset: every model");
        let listed: serde_json::Value = serde_json::from_slice(&crate::views::models_json_of(
            &snapshot,
            0,
            key.models.as_deref(),
            &(),
            0,
        ))
        .unwrap();
        let names: Vec<&str> = listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["gpt-b"],
            "gpt-a-image is granted but not this key's; gpt-old is retired"
        );
        config["keys"][0]["models"] = serde_json::json!([9]);
        let err = Snapshot::from_msgpack(&encode(&config), PEPPER)
            .err()
            .expect("an out-of-range model index is refused")
            .to_string();
        assert!(err.contains("keys[0].models[0]: index 9 out of range"), "{err}");
    }

    #[test]
    fn test_revoked_principal_expired_key_and_unknown_token_are_refused() {
        let snapshot = snapshot();
        assert_eq!(snapshot.authenticate(OTHER_TOKEN, 0), None, "principal revoked");
        let mut config = config();
        config["keys"][0]["expires_at_ms"] = serde_json::json!(1000);
        let snapshot = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        assert_eq!(snapshot.authenticate(TOKEN, 999), Some(0));
        assert_eq!(snapshot.authenticate(TOKEN, 1000), None);
        assert_eq!(
            snapshot.authenticate("mesh_live_CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC", 0),
            None
        );
    }

    #[test]
    fn test_bad_config_lists_every_problem() {
        let mut config = config();
        config["keys"][0]["principal"] = serde_json::json!(9);
        config["keys"][1]["digest"] = serde_json::json!("short");
        config["models"][0]["kind"] = serde_json::json!("audio");
        config["grants"][0]["active_days"] = serde_json::json!([7]);
        config["grants"][1]["allowed_to_min"] = serde_json::json!(2000);
        let Err(Error::Snapshot(errors)) = Snapshot::from_msgpack(&encode(&config), PEPPER) else {
            panic!("config should be refused");
        };
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(Snapshot::from_msgpack(b"\xc1", PEPPER).is_err());
    }

    fn organisation(managers: &[Option<i64>]) -> serde_json::Value {
        let mut config = config();
        config["principals"] = managers
            .iter()
            .enumerate()
            .map(|(i, m)| {
                serde_json::json!({"id": format!("p{i}"), "email": format!("p{i}@example.com"),
                    "display_name": "P", "status": "active", "expires_at_ms": null, "manager": m,
                    "business_unit": if i % 2 == 0 { "payments" } else { "search" }, "tier": "normal"})
            })
            .collect();
        config["keys"] = serde_json::json!([]);
        config
    }

    #[test]
    fn test_the_leader_chain_runs_up_to_the_top_and_the_organisation_includes_the_leader() {
        // 0 leads 1 and 2; 1 leads 3; 4 stands alone.
        let config = organisation(&[None, Some(0), Some(0), Some(1), None]);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        assert_eq!(s.leaders(3).collect::<Vec<_>>(), [1, 0]);
        assert_eq!(s.leaders(0).count(), 0);
        assert!(s.in_organisation_of(3, 0) && s.in_organisation_of(3, 1) && s.in_organisation_of(3, 3));
        assert!(!s.in_organisation_of(2, 1) && !s.in_organisation_of(4, 0) && !s.in_organisation_of(0, 1));
        assert_eq!(s.principals[2].business_unit.as_deref(), Some("payments"));
        assert_eq!(s.principals[3].tier.as_deref(), Some("normal"));
        assert_eq!(s.principals[1].manager, Some(0));
    }

    #[test]
    fn test_a_manager_chain_that_loops_or_points_nowhere_is_refused() {
        for (managers, loops) in [
            (vec![Some(0)], 1),                            // self-management
            (vec![Some(1), Some(0)], 1),                   // two people
            (vec![None, Some(2), Some(3), Some(1)], 1),    // three, under a healthy root
            (vec![Some(1), Some(0), Some(3), Some(2)], 2), // two separate loops
        ] {
            let Err(Error::Snapshot(errors)) = Snapshot::from_msgpack(&encode(&organisation(&managers)), PEPPER) else {
                panic!("{managers:?} should be refused");
            };
            assert_eq!(errors.len(), loops, "{managers:?}: {errors:?}");
            assert!(errors.iter().all(|e| e.contains("loops")), "{errors:?}");
        }
        let Err(Error::Snapshot(errors)) = Snapshot::from_msgpack(&encode(&organisation(&[None, Some(9)])), PEPPER)
        else {
            panic!("an out-of-range manager should be refused");
        };
        assert!(errors[0].contains("principals[1].manager"), "{errors:?}");
    }

    #[test]
    fn test_a_long_chain_is_checked_in_linear_time() {
        // 20,000 people in one line: each is walked once.
        let managers: Vec<Option<i64>> = (0..20_000).map(|i| if i == 0 { None } else { Some(i - 1) }).collect();
        let s = Snapshot::from_msgpack(&encode(&organisation(&managers)), PEPPER).unwrap();
        assert_eq!(s.leaders(19_999).count(), 19_999);
        assert!(s.in_organisation_of(19_999, 0));
    }

    #[test]
    fn test_aliases_resolve_to_the_model_and_its_grant() {
        let mut config = config();
        config["models"][0]["aliases"] = serde_json::json!(["fast", "b-latest"]);
        config["models"][0]["tags"] = serde_json::json!(["team:search"]);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        assert_eq!(
            (s.model_named("fast"), s.model_named("gpt-b"), s.model_named("nope")),
            (Some(0), Some(0), None)
        );
        assert_eq!(s.grant_by_name(0, "b-latest").map(|g| g.model), Some(0));
        assert_eq!(
            s.grant_by_name(1, "fast").map(|g| g.model),
            None,
            "principal 1 holds no grant"
        );
        assert_eq!(s.models[0].tags, ["team:search"]);
    }

    #[test]
    fn test_every_name_and_alias_clash_is_listed() {
        let mut config = config();
        config["models"][0]["aliases"] = serde_json::json!(["gpt-a-image", "x", "x", "gpt-b", " "]);
        config["models"][2]["aliases"] = serde_json::json!(["x"]);
        config["models"][2]["name"] = serde_json::json!("gpt-b");
        let Err(Error::Snapshot(errors)) = Snapshot::from_msgpack(&encode(&config), PEPPER) else {
            panic!("clashes should be refused");
        };
        let expected = [
            r#"models[2] ("gpt-b"): name "gpt-b" is also the name of models[0] ("gpt-b")"#,
            r#"models[0] ("gpt-b"): alias "gpt-a-image" is the name of models[1] ("gpt-a-image")"#,
            r#"models[0] ("gpt-b"): alias "x" is listed twice"#,
            r#"models[0] ("gpt-b"): alias "gpt-b" is the name of models[2] ("gpt-b")"#,
            r#"models[0] ("gpt-b"): an alias is empty"#,
            r#"models[2] ("gpt-b"): alias "x" is also an alias of models[0] ("gpt-b")"#,
        ];
        assert_eq!(errors, expected);
    }

    #[test]
    fn test_prices_per_class_and_the_long_context_tier_are_resolved_and_checked() {
        let mut config = config();
        let model = &mut config["models"][0];
        model["cache_read_price_nano_per_1k"] = serde_json::json!(100);
        model["cache_write_1h_price_nano_per_1k"] = serde_json::json!(2500);
        model["long_context_threshold_tokens"] = serde_json::json!(200_000);
        model["long_context_prices"] = serde_json::json!({"input": 2000, "cache_write": 2600});
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let m = &s.models[0];
        assert_eq!(
            m.prices,
            Prices {
                input: 1000,
                output: 2000,
                cache_read: 100,
                cache_write: 1000,
                cache_write_1h: 2500
            }
        );
        let long = m.long_context.unwrap();
        assert_eq!(long.threshold_tokens, 200_000);
        assert_eq!(
            long.prices,
            Prices {
                input: 2000,
                output: 2000,
                cache_read: 100,
                cache_write: 2600,
                cache_write_1h: 2500
            }
        );

        let mut config = test_support::config();
        config["models"][0]["long_context_prices"] = serde_json::json!({"input": 1});
        config["models"][1]["long_context_threshold_tokens"] = serde_json::json!(0);
        config["models"][1]["long_context_prices"] = serde_json::json!({"inputs": 1, "output": -1});
        config["models"][2]["cache_write_price_nano_per_1k"] = serde_json::json!(-3);
        let Err(Error::Snapshot(errors)) = Snapshot::from_msgpack(&encode(&config), PEPPER) else {
            panic!("bad prices should be refused");
        };
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(
            errors[0].ends_with("long_context_threshold_tokens and long_context_prices go together"),
            "{errors:?}"
        );
        assert!(errors[2].contains(r#"unknown class "inputs""#), "{errors:?}");
    }

    fn with_providers(mut config: serde_json::Value) -> serde_json::Value {
        config["providers"] = serde_json::json!([
            config["providers"][0].clone(),
            {"id": "77777777-7777-7777-7777-777777777777", "name": "claude", "family": "anthropic",
             "max_calls_per_hour": null, "base_url": "http://claude"},
            {"id": "88888888-8888-8888-8888-888888888888", "name": "custom", "family": "generic", "max_calls_per_hour": null,
             "generic": {"endpoint_url": "http://custom/chat", "header_template": {}, "request_body_template": "{}",
                         "response_delta_path": "delta"}}
        ]);
        config
    }

    #[test]
    fn test_deployments_sort_by_priority_and_must_serve_what_the_model_advertises() {
        let mut config = with_providers(config());
        config["models"][0]["deployments"] = serde_json::json!([
            {"id": "d1", "provider": 1, "resolved_model": "claude-x", "region": "eu", "priority": 20},
            {"id": "d2", "provider": 0, "resolved_model": "gpt-b-2", "region": null, "priority": 10}
        ]);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let order: Vec<&str> = s.models[0].deployments.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(order, ["d2", "d1"]);

        let mut config = with_providers(test_support::config());
        config["models"][0]["deployments"] = serde_json::json!([
            {"id": "d1", "provider": 2, "resolved_model": "x", "priority": 1},
            {"id": "d2", "provider": 0, "resolved_model": "gpt-b", "priority": 2},
            {"id": "d3", "provider": 9, "resolved_model": "", "priority": 3}
        ]);
        config["models"][1]["kind"] = serde_json::json!("embedding");
        config["models"][1]["deployments"] =
            serde_json::json!([{"id": "d4", "provider": 1, "resolved_model": "e", "priority": 1}]);
        let Err(Error::Snapshot(errors)) = Snapshot::from_msgpack(&encode(&config), PEPPER) else {
            panic!("unservable deployments should be refused");
        };
        let expected = [
            r#"models[0] ("gpt-b").deployments[2]: resolved_model is empty"#,
            r#"models[0] ("gpt-b").deployments[2].provider: index 9 out of range (0..3)"#,
            r#"models[0] ("gpt-b").deployments[0]: provider "custom" has custom templates, so it cannot serve the standard entry formats the model advertises"#,
            r#"models[0] ("gpt-b").deployments[1]: provider "openai" with "gpt-b" is already a deployment of the model"#,
            r#"models[1] ("gpt-a-image").deployments[0]: provider "claude" (anthropic) has no embedding operation"#,
        ];
        assert_eq!(errors, expected);
    }
}
