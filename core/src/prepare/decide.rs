//! The decision: authentication, the grant, the model's restrictions, data protection, policy,
//! the reservations and the counts, in Mesh's order; every denial's answer.

use std::borrow::Cow;
use std::sync::Arc;

use super::render::{embeddings, entry, generate, openai_embeddings, proxy, render_fallback, shaping, ProxyBody};
use super::{Governing, Prepared, Request, Route};
use crate::govern::{Holds, LeaseWant, ProviderLimits};
use crate::json::{write_int, write_str, write_time, write_usd};
use crate::jwt::TokenError;
use crate::keyindex::extract_token;
use crate::outcome::Outcome;
use crate::policy::{self, next_utc_hour, next_utc_midnight, Counters, Denial};
use crate::rules;
use crate::ruleset::local_date;
use crate::shm::{self, id_bytes, utc_day, utc_hour, Segment};
use crate::snapshot::{Caller, Grant, Provider, Refused, Restricted, Snapshot};
use crate::translate::{self, Format};

/// Seconds a client is told to wait while the kill switch is tripped (it has no known end).
pub const KILL_SWITCH_RETRY_S: u32 = 30;

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
                match (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) {
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

fn retry_after(resume_at_ms: i64, now_ms: i64) -> u32 {
    let ms = (resume_at_ms - now_ms).max(0);
    u32::try_from(ms.div_euclid(1000) + i64::from(ms % 1000 != 0))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// The limit with the highest utilization among those that apply (ties: the first listed).
fn governing(grant: &Grant, provider: &Provider, c: &Counters, now_ms: i64) -> Option<Governing> {
    let percent = |used: i64, limit: i64| (used as f64 * 100.0 / limit as f64 * 100.0).round() / 100.0;
    let candidates = [
        (grant.daily_cap_nano_usd > 0).then(|| {
            (
                "policy.daily_usd",
                percent(c.spent_today_nano, grant.daily_cap_nano_usd),
                next_utc_midnight(now_ms),
            )
        }),
        grant.max_calls_per_hour.filter(|&max| max > 0).map(|max| {
            (
                "policy.hourly_calls",
                percent(c.calls_this_hour, max),
                next_utc_hour(now_ms),
            )
        }),
        provider.max_calls_per_hour.filter(|&max| max > 0).map(|max| {
            (
                "provider.hourly_calls",
                percent(c.provider_calls_this_hour, max),
                next_utc_hour(now_ms),
            )
        }),
    ];
    candidates.into_iter().flatten().fold(
        None,
        |best: Option<Governing>, (id, utilization, reset_at_ms)| match best {
            Some(best) if best.utilization >= utilization => Some(best),
            _ => Some(Governing {
                id: Cow::Borrowed(id),
                utilization,
                reset_at_ms,
            }),
        },
    )
}

impl Prepared {
    fn deny_budget(&mut self, cap_nano: i64, now_ms: i64) {
        let resume_at = next_utc_midnight(now_ms);
        self.deny(Outcome::BudgetExceeded, None, |out| {
            out.extend_from_slice(b",\"cap\":");
            write_usd(out, cap_nano);
            out.extend_from_slice(b",\"resume_at\":");
            write_time(out, resume_at);
        });
        self.retry_after_s = Some(retry_after(resume_at, now_ms));
    }

    fn deny_rule(&mut self, refusal: &rules::Refusal, now_ms: i64) {
        let (outcome, rule, at) = match refusal {
            rules::Refusal::Block { rule, reset_at_ms, .. } => (Outcome::BudgetExceeded, rule, *reset_at_ms),
            rules::Refusal::Pause { rule, resume_at_ms } => (Outcome::Paused, rule, *resume_at_ms),
            rules::Refusal::Rate { rule, retry_at_ms } => (Outcome::RateLimited, rule, *retry_at_ms),
        };
        self.deny(outcome, None, |out| {
            out.extend_from_slice(b",\"rule\":");
            write_str(out, rule);
            if let rules::Refusal::Block { threshold_nano, .. } = refusal {
                out.extend_from_slice(b",\"cap\":");
                write_usd(out, *threshold_nano);
            }
            out.extend_from_slice(b",\"resume_at\":");
            write_time(out, at);
        });
        self.retry_after_s = Some(retry_after(at, now_ms));
        // The holds (the policy's reservation, provider counts) go with the denial.
        self.holds = None;
    }

    fn deny_busy(&mut self) {
        self.deny(Outcome::ServerBusy, None, |_| {});
        self.retry_after_s = Some(1);
        self.holds = None;
    }
}

/// Decides one request. Reads counters from `segment` and, when the call goes upstream, reserves
/// its worst-case cost against the grant's daily cap (held in [`Prepared::holds`]) and counts it
/// (provider and principal×model hourly calls, Mesh step 14).
///
/// On the entry routes, unknown and not-permitted models are the same 404 `model_not_found`
/// (their rows tell them apart) and every denial is in the entry API's own error shape.
#[must_use]
pub fn prepare(snapshot: &Snapshot, segment: Option<&Arc<Segment>>, req: &Request<'_>) -> Prepared {
    let mut p = Prepared {
        request_id: crate::ids::request_id(),
        log_requests: true,
        error_shape: match req.route {
            Route::Entry(format) => Some(format),
            Route::OpenAiEmbeddings => Some(Format::OpenAiChat),
            _ => None,
        },
        ..Prepared::default()
    };
    if let Some(model) = req.model {
        model.clone_into(&mut p.requested_model);
    } else if !matches!(req.route, Route::Entry(_) | Route::OpenAiEmbeddings) {
        p.requested_model = req
            .query_string
            .and_then(|q| query_param(q, "model"))
            .map(Cow::into_owned)
            .unwrap_or_default();
    }

    // 1-2. Authentication: an issued key or a platform token, and the principal's status.
    let token = extract_token(req.authorization, req.x_api_key, req.x_goog_api_key, req.query_string);
    let caller = match token.map(|t| snapshot.identify(t, req.now_ms)) {
        Some(Ok(caller)) => caller,
        Some(Err(Some(refused))) => {
            if let TokenError::UnknownKey(issuer) = refused {
                p.token_issuer = Some(snapshot.issuers[issuer as usize].issuer.clone());
            }
            p.deny(refused.outcome(), None, |_| {});
            return p;
        }
        None | Some(Err(None)) => {
            p.deny(Outcome::InvalidOrRevokedKey, None, |_| {});
            return p;
        }
    };
    let principal = caller.principal(snapshot);
    let allowed = caller.models(snapshot);
    let person = &snapshot.principals[principal as usize];
    match &caller {
        Caller::Key(k) => p.key_id = Some(snapshot.keys[*k as usize].id.clone()),
        Caller::Token(identity) => {
            p.token_issuer = Some(snapshot.issuers[identity.issuer as usize].issuer.clone());
            p.token_subject = Some(identity.subject.to_string());
        }
    }
    p.principal_id = Some(person.id.clone());
    p.principal_kind = Some(if person.application { "application" } else { "user" });
    p.business_unit.clone_from(&person.business_unit);
    p.tier.clone_from(&person.tier);
    p.manager_id = person.manager.map(|m| snapshot.principals[m as usize].id.clone());

    // An entry route's body names the model (except Gemini's, named in the path).
    let mut decoded = None;
    if let Route::Entry(format) = req.route {
        match translate::decode_request(format, req.body) {
            Ok(mut d) => {
                if let Some(stream) = req.stream {
                    d.value.stream = stream;
                }
                if req.model.is_none() {
                    p.requested_model.clone_from(&d.value.model);
                }
                decoded = Some(d);
            }
            Err(e) => {
                p.invalid(Some(&e.to_string()));
                return p;
            }
        }
    }

    // A Mesh-native chat body, parsed once: data protection rewrites its texts in place and the
    // render (and a failover's) reads it; a body that does not parse is 400 where Mesh says so.
    let mut proxy_body: Option<ProxyBody<'_>> = None;
    if req.route == Route::Proxy {
        proxy_body = serde_json::from_slice::<ProxyBody<'_>>(req.body).ok();
    }

    let mut embedding_inputs = Vec::new();
    if req.route == Route::OpenAiEmbeddings {
        match openai_embedding_request(req.body) {
            Ok((model, inputs)) => {
                if req.model.is_none() {
                    p.requested_model = model;
                }
                embedding_inputs = inputs;
            }
            Err(detail) => {
                p.invalid(Some(detail));
                return p;
            }
        }
    }

    // 3. The grant for this route's kind; unknown names are the same 403 (404 on entry routes).
    let grant_index = snapshot.grant_index_by_name(principal, &p.requested_model);
    let Some((grant_index, grant, model)) = grant_index
        .map(|i| (i, &snapshot.grants[i as usize]))
        .map(|(i, g)| (i, g, &snapshot.models[g.model as usize]))
        .filter(|(_, g, m)| req.route.admits(m.kind) && crate::snapshot::within(allowed, g.model))
    else {
        if let Route::Entry(_) | Route::OpenAiEmbeddings = req.route {
            let known = snapshot.model_named(&p.requested_model);
            let outcome = match known {
                Some(m) => not_granted(snapshot, m, principal),
                None => Outcome::UnknownModel,
            };
            p.deny(outcome, None, |_| {});
        } else {
            let outcome = snapshot
                .model_named(&p.requested_model)
                .map_or(Outcome::ModelNotPermitted, |m| not_granted(snapshot, m, principal));
            p.deny(outcome, None, |_| {});
        }
        return p;
    };
    let provider = &snapshot.providers[model.provider as usize];
    p.model_id = Some(model.id.clone());
    p.model_name = Some(model.name.clone());
    p.model_tags.clone_from(&model.tags);
    p.provider_id = Some(provider.id.clone());
    p.log_requests = provider.log_requests;
    p.local = provider.local;

    // 4. Blocked or retired; then the model's restrictions (answered like a model not granted).
    if model.blocked || model.retired {
        p.deny(Outcome::ModelBlocked, None, |_| {});
        return p;
    }
    if let Some(refused) = model.refuses(snapshot, principal) {
        p.deny(refused_outcome(refused), None, |_| {});
        return p;
    }

    // A registered workflow the call names: only its principals may charge it (an unregistered
    // id is attribution only).
    let workflow = req.workflow.and_then(|id| snapshot.workflow(id));
    if let Some(wf) = workflow.filter(|wf| !wf.permits(snapshot, principal)) {
        p.deny(Outcome::WorkflowNotPermitted, None, |out| {
            out.extend_from_slice(b",\"workflow\":");
            write_str(out, &wf.id);
        });
        return p;
    }

    // Data protection, before anything is reserved or rendered: a match a policy blocks refuses
    // the call; redaction and pseudonymization rewrite what goes upstream.
    let mut protected_body: Option<Vec<u8>> = None;
    if let Some(dlp) = snapshot.dlp.as_ref().as_ref() {
        let person = &snapshot.principals[principal as usize];
        let for_provider = |provider: u32| {
            dlp.actions_for(
                principal,
                person.business_unit.as_deref(),
                person.tier.as_deref(),
                grant.model,
                provider,
                |leader| snapshot.in_organisation_of(principal, leader),
            )
        };
        // NOTE: the next deployment's provider too: a failover renders from what is protected
        // here, so it must satisfy both providers' policies.
        let acts = match (
            for_provider(model.provider),
            model.deployments.first().map(|d| for_provider(d.provider)),
        ) {
            (Some(a), Some(Some(b))) => Some(a.iter().zip(&b).map(|(x, y)| (*x).max(*y)).collect::<Vec<_>>()),
            (Some(a), _) => Some(a),
            (None, Some(b)) => b,
            (None, None) => None,
        };
        if let Some(acts) = acts {
            p.dlp_applies = true;
            let values = dlp.model_values(req.dlp_found);
            let body = |fields: &[&str], content: bool, protected_body: &mut Option<Vec<u8>>| {
                dlp.protect_body(req.body, &acts, fields, content, &values)
                    .map(|(found, body)| {
                        *protected_body = body;
                        found
                    })
            };
            let unanswered = if req.dlp_model_failed {
                dlp.model_detectors(&acts)
            } else {
                Vec::new()
            };
            p.dlp_needs_model = !unanswered.is_empty();
            let protected = match (req.route, decoded.as_mut()) {
                // Fail closed: what the model would have looked for is not known to be absent.
                _ if !unanswered.is_empty() => Some(Some(crate::dlp::Protected {
                    action: Some(crate::dlp::Action::Block),
                    blocked: unanswered,
                    ..crate::dlp::Protected::default()
                })),
                (Route::Entry(_), Some(d)) => Some(Some(dlp.protect_request(&mut d.value, &acts, &values))),
                (Route::Proxy, _) => proxy_body.as_mut().and_then(|b| {
                    let query = b.query.as_mut();
                    let blocks = b.content.as_deref_mut().unwrap_or_default();
                    dlp.protect_mesh(query, blocks, &acts, &values).map(Some)
                }),
                (Route::Embeddings, _) => body(&["input"], false, &mut protected_body).map(Some),
                (Route::Generate, _) => body(&["prompt"], false, &mut protected_body).map(Some),
                (Route::OpenAiEmbeddings, _) => {
                    let mut found = crate::dlp::Protected {
                        model_values: crate::dlp::ModelValues::new(&values),
                        ..crate::dlp::Protected::default()
                    };
                    let mut names = crate::dlp::Pseudonyms::default();
                    for input in &mut embedding_inputs {
                        dlp.protect(input, &acts, &mut found, &mut names);
                    }
                    Some(Some(found))
                }
                _ => Some(None),
            };
            let Some(protected) = protected else {
                p.invalid(Some("data protection cannot read this body, so it does not leave"));
                return p;
            };
            if let Some(found) = protected {
                p.dlp_action = found.action.map(crate::dlp::Action::as_str);
                p.dlp = found.counts;
                p.dlp_restore = found.restore;
                if !found.blocked.is_empty() {
                    let detail = format!("(detectors: {})", found.blocked.join(", "));
                    p.deny(Outcome::SensitiveContentBlocked, Some(&detail), |out| {
                        out.extend_from_slice(b",\"detectors\":[");
                        for (i, detector) in found.blocked.iter().enumerate() {
                            if i > 0 {
                                out.push(b',');
                            }
                            write_str(out, detector);
                        }
                        out.push(b']');
                    });
                    if let Some(format) = p.error_shape {
                        let wire = Outcome::SensitiveContentBlocked.on_entry_route();
                        p.body = crate::entry::error_body_naming(
                            format,
                            p.status,
                            wire.code(),
                            Some(&detail),
                            &found.blocked,
                        );
                    }
                    return p;
                }
            }
        }
    }
    let protected_req;
    let req = match &protected_body {
        Some(body) => {
            protected_req = Request { body, ..*req };
            &protected_req
        }
        None => req,
    };

    // 5. Provider capability (embeddings, generate).
    let plan = &provider.plan;
    match req.route {
        Route::Proxy | Route::Entry(_) if plan.chat.is_none() => {
            // A provider without a chat endpoint cannot serve a chat model; Mesh would 500.
            p.deny(Outcome::InternalError, None, |_| {});
            return p;
        }
        Route::Embeddings | Route::OpenAiEmbeddings if plan.embedding.is_none() => {
            p.deny(Outcome::EmbeddingsNotSupportedByProvider, None, |_| {});
            return p;
        }
        Route::Generate if !plan.generation.as_ref().is_some_and(|g| g.is_complete()) => {
            p.deny(Outcome::GenerationNotSupportedByProvider, None, |_| {});
            return p;
        }
        _ => {}
    }

    // 6. Policy, kill switch last.
    let mut counters = policy::counters(grant, provider, &segment.map(|s| SegmentRef(s)), req.now_ms);
    p.limit = governing(grant, provider, &counters, req.now_ms);
    if let Some((denial, resume_at)) = policy::denial(grant, provider, &counters, req.now_ms) {
        deny_policy(&mut p, denial, resume_at, req.now_ms);
        return p;
    }
    if snapshot.kill_switch {
        let resume_at = req.now_ms + i64::from(KILL_SWITCH_RETRY_S) * 1000;
        p.deny(Outcome::PausedByAdmin, None, |out| {
            out.extend_from_slice(b",\"resume_at\":");
            write_time(out, resume_at);
        });
        p.retry_after_s = Some(KILL_SWITCH_RETRY_S);
        return p;
    }

    // 7. Body, rendering; the next deployment's call too, so a failover needs no second decision.
    let fallback = model.deployments.first().and_then(|d| {
        render_fallback(
            snapshot,
            segment,
            req,
            model,
            d,
            decoded.as_ref(),
            proxy_body.as_ref(),
            p.principal_id.as_deref(),
        )
    });
    let upstream = match req.route {
        Route::Proxy => match proxy_body.as_ref() {
            Some(body) => proxy(&mut p, body, model, provider),
            None => {
                p.invalid(None);
                None
            }
        },
        Route::Embeddings => embeddings(&mut p, req.body, model, provider),
        Route::Generate => generate(&mut p, req.body, model, provider),
        Route::OpenAiEmbeddings => openai_embeddings(&embedding_inputs, model, provider),
        Route::Entry(format) => match decoded {
            Some(decoded) => {
                let principal_id = p.principal_id.clone();
                let cache = shaping(snapshot, req, principal_id.as_deref());
                entry(&mut p, format, decoded, model, provider, cache)
            }
            None => None,
        },
    };
    let Some(upstream) = upstream else {
        return p;
    };

    // Reserve the worst case against the daily cap: spend + open reservations + worst <= cap.
    let spend_key = grant.spend_key.at(utc_day(req.now_ms));
    let limits = ProviderLimits::new(
        &id_bytes(&provider.id),
        provider.max_concurrent_upstream,
        provider.max_outbound_rps,
        provider.admission_share_pct,
    );
    let holds = Holds::new(segment.cloned(), spend_key, limits, upstream.weight);
    // The instance's place in a cluster, read once for the call (0 alone: every cap held whole).
    let mode = segment.map_or(0, |segment| shm::cluster_mode(segment));
    let rates = model.rates(provider);
    let worst = rates.worst_case(
        upstream.input_tokens_bound,
        upstream.output_tokens_bound,
        i64::from(upstream.web_search),
    );
    if let Some(segment) = segment.filter(|_| grant.daily_cap_nano_usd > 0) {
        // In a cluster the instance spends only what it declared of its slices (ARCHITECTURE
        // "several hosts"); cut off from the database too, as that is already counted as spent.
        let cap = grant.daily_cap_nano_usd;
        let leased = (mode != 0).then(|| segment.get(shm::ceiling_key(spend_key, mode)));
        match segment.reserve(spend_key, worst, leased.map_or(cap, |ceiling| ceiling.min(cap))) {
            Ok(Some(lease)) => {
                holds.hold_budget(lease);
                counters.spent_today_nano = segment.get(spend_key);
            }
            Ok(None) => {
                counters.spent_today_nano = segment.get(spend_key);
                if leased.is_some() && counters.spent_today_nano.saturating_add(worst) <= cap {
                    p.lease_wanted = Some(LeaseWant::count(
                        shm::SPEND_DAY,
                        spend_key,
                        utc_day(req.now_ms),
                        worst.max(1),
                        cap,
                        next_utc_midnight(req.now_ms),
                    ));
                }
                p.limit = governing(grant, provider, &counters, req.now_ms);
                p.deny_budget(grant.daily_cap_nano_usd, req.now_ms);
                return p;
            }
            Err(_) => {
                p.deny_busy();
                return p;
            }
        }
    }
    // The workflow's budget, reserved like the daily cap (its window in the rules' calendar).
    let mut workflow_limit = None;
    if let (Some(wf), Some(segment)) = (workflow, segment) {
        let tz = snapshot.rules.tz;
        let period = wf.window.period_of(local_date(tz, req.now_ms));
        let key = wf.key.at(period);
        let (_, reset_at_ms) = wf.window.bounds(tz, period);
        let leased = (mode != 0).then(|| segment.get(shm::ceiling_key(key, mode)));
        let percent = |used: i64| (used as f64 * 100.0 / wf.limit_nano as f64 * 100.0).round() / 100.0;
        match segment.reserve(key, worst, leased.map_or(wf.limit_nano, |c| c.min(wf.limit_nano))) {
            Ok(Some(lease)) => {
                holds.hold_workflow(lease);
                workflow_limit = Some(Governing {
                    id: Cow::Owned(format!("workflow:{}", wf.id)),
                    utilization: percent(segment.get(key)),
                    reset_at_ms,
                });
            }
            Ok(None) => {
                let spent = segment.get(key);
                if leased.is_some() && spent.saturating_add(worst) <= wf.limit_nano {
                    let mut want = LeaseWant::count(
                        shm::WORKFLOW_SPEND,
                        key,
                        period,
                        worst.max(1),
                        wf.limit_nano,
                        reset_at_ms,
                    );
                    want.base = spent;
                    want.models = vec![wf.uid.clone()];
                    p.lease_wanted = Some(want);
                }
                p.limit = Some(Governing {
                    id: Cow::Owned(format!("workflow:{}", wf.id)),
                    utilization: percent(spent.saturating_add(worst)),
                    reset_at_ms,
                });
                let detail = format!("the workflow {} is over its budget", wf.id);
                p.deny(Outcome::BudgetExceeded, Some(&detail), |out| {
                    out.extend_from_slice(b",\"workflow\":");
                    write_str(out, &wf.id);
                    out.extend_from_slice(b",\"cap\":");
                    write_usd(out, wf.limit_nano);
                    out.extend_from_slice(b",\"resume_at\":");
                    write_time(out, reset_at_ms);
                });
                p.retry_after_s = Some(retry_after(reset_at_ms, req.now_ms));
                return p;
            }
            Err(_) => {
                p.deny_busy();
                return p;
            }
        }
    }
    // Spend rules, after the per-user policy (the first block wins).
    let mut rule_limit = None;
    if let Some(segment) = segment {
        let decision = rules::decide(snapshot, segment, principal, grant_index, worst, req.now_ms, mode);
        if decision.unavailable {
            // NOTE: a counter that cannot be read or written denies (fail closed).
            p.deny_busy();
            return p;
        }
        p.would_deny = decision.would_deny;
        p.warning = decision.warning;
        p.events = decision.events;
        p.lease_wanted = decision.lease_wanted;
        if let Some(refusal) = decision.refusal {
            if let Some(limit) = decision.limit {
                p.limit = Some(Governing {
                    id: Cow::Owned(format!("rule:{}", limit.rule)),
                    utilization: limit.utilization,
                    reset_at_ms: limit.reset_at_ms,
                });
            }
            p.deny_rule(&refusal, req.now_ms);
            return p;
        }
        rule_limit = decision.limit;
        holds.hold_minute_tokens(decision.minute_tokens);
        holds.hold_rules(
            decision.leases,
            decision.own_leases,
            decision.charges,
            decision.token_keys,
            decision.watches,
        );
    }
    p.holds = Some(holds);

    // 14. Count the attempt.
    if let Some(segment) = segment {
        let hour = utc_hour(req.now_ms);
        let (provider_key, calls_key) = (provider.calls_key.at(hour), grant.calls_key.at(hour));
        match segment
            .add(provider_key, 1)
            .and_then(|n| Ok((n, segment.add(calls_key, 1)?)))
        {
            Ok((provider_calls, calls)) => {
                counters.provider_calls_this_hour = provider_calls;
                counters.calls_this_hour = calls;
                // In a cluster an hourly cap is leased like a budget: a count past what this
                // instance declared is taken back and a slice asked for.
                if mode != 0 {
                    let over = |key: u128, count: i64, max: Option<i64>| {
                        max.filter(|&max| max > 0)
                            .is_some_and(|_| count > segment.get(shm::ceiling_key(key, mode)))
                    };
                    let wanted = if over(provider_key, provider_calls, provider.max_calls_per_hour) {
                        Some((shm::PROVIDER_CALLS_HOUR, provider_key, provider.max_calls_per_hour))
                    } else if over(calls_key, calls, grant.max_calls_per_hour) {
                        Some((shm::CALLS_HOUR, calls_key, grant.max_calls_per_hour))
                    } else {
                        None
                    };
                    if let Some((kind, key, max)) = wanted {
                        let max = max.unwrap_or(0);
                        let _ = segment.add(provider_key, -1);
                        let _ = segment.add(calls_key, -1);
                        p.holds = None;
                        p.lease_wanted = Some(LeaseWant::count(kind, key, hour, 1, max, next_utc_hour(req.now_ms)));
                        let denial = if kind == shm::PROVIDER_CALLS_HOUR {
                            Denial::ProviderHourly
                        } else {
                            Denial::UserHourly { limit: max }
                        };
                        deny_policy(&mut p, denial, Some(next_utc_hour(req.now_ms)), req.now_ms);
                        return p;
                    }
                }
            }
            Err(_) => {
                // The counter table is full: fail closed rather than run uncounted (the drop of
                // the holds releases the reservation).
                p.deny_busy();
                return p;
            }
        }
        p.limit = governing(grant, provider, &counters, req.now_ms);

        if let Some(limit) = rule_limit {
            if p.limit.as_ref().is_none_or(|l| limit.utilization > l.utilization) {
                p.limit = Some(Governing {
                    id: Cow::Owned(format!("rule:{}", limit.rule)),
                    utilization: limit.utilization,
                    reset_at_ms: limit.reset_at_ms,
                });
            }
        }
        if let Some(limit) = workflow_limit {
            if p.limit.as_ref().is_none_or(|l| limit.utilization > l.utilization) {
                p.limit = Some(limit);
            }
        }
    }
    p.upstream = Some(upstream);
    p.rates = Some(rates);
    p.fallback = fallback;
    p
}

/// The denial of a model's access layers (the row's reason; answered like an unknown model).
fn refused_outcome(refused: Refused) -> Outcome {
    match refused {
        Refused::Staged => Outcome::ModelStaged,
        Refused::Limited => Outcome::ModelLimited,
        Refused::Restricted(Restricted::Leader) => Outcome::RestrictedByLeader,
        Refused::Restricted(Restricted::BusinessUnit) => Outcome::RestrictedByBusinessUnit,
    }
}

/// Why a caller without a grant (for the route) is refused a known model: a staged model, or a
/// limited one they are off the roster of, says so in the row (the answer is the same).
fn not_granted(snapshot: &Snapshot, model: u32, principal: u32) -> Outcome {
    match snapshot.models[model as usize].refuses(snapshot, principal) {
        Some(refused @ (Refused::Staged | Refused::Limited)) => refused_outcome(refused),
        _ => Outcome::ModelNotPermitted,
    }
}

/// Answers a policy denial: its code, the cap or limit, when it lifts.
fn deny_policy(p: &mut Prepared, denial: Denial, resume_at: Option<i64>, now_ms: i64) {
    p.deny(denial.outcome(), None, |out| {
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
    if denial.outcome().spec().retry_after {
        p.retry_after_s = resume_at.map(|at| retry_after(at, now_ms));
    }
}

/// [`crate::shm::CounterRead`] over a borrowed segment.
struct SegmentRef<'a>(&'a Segment);

impl crate::shm::CounterRead for SegmentRef<'_> {
    fn counter(&self, key: u128) -> i64 {
        self.0.get(key)
    }
}

/// `(model, inputs)` of an OpenAI embeddings body; `input` is a string or a list of strings
/// (token-id arrays are refused: meshfast does not know the provider's tokenizer).
fn openai_embedding_request(body: &[u8]) -> Result<(String, Vec<String>), &'static str> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| "the body is not a JSON object")?;
    let model = value
        .get("model")
        .and_then(|m| m.as_str())
        .filter(|m| !m.is_empty())
        .ok_or("model must be a non-empty string")?;
    let inputs = match value.get("input") {
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(items)) if !items.is_empty() && items.len() <= MAX_EMBEDDING_INPUTS => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or("input must be a string or a list of strings (token arrays are not supported)")?,
        Some(serde_json::Value::Array(items)) if items.len() > MAX_EMBEDDING_INPUTS => {
            return Err("at most 2048 inputs per request")
        }
        _ => return Err("input must be a non-empty string or list of strings"),
    };
    if inputs.iter().any(String::is_empty) {
        return Err("input must not contain empty strings");
    }
    if let Some(format) = value.get("encoding_format") {
        if !matches!(format.as_str(), Some("float" | "base64")) {
            return Err("encoding_format must be float or base64");
        }
    }
    Ok((model.to_owned(), inputs))
}

/// OpenAI's limit on inputs in one embeddings request.
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::content;
    use crate::snapshot::test_support::*;
    use serde_json::json;

    #[test]
    fn test_entry_route_denials_are_404_for_unknown_and_unpermitted_models_in_the_apis_shape() {
        let s = snapshot();
        let p = prepare(
            &s,
            None,
            &req(
                Route::Entry(Format::OpenAiChat),
                "",
                br#"{"model":"nope","messages":[]}"#,
            ),
        );
        assert_eq!((p.status, p.deny_reason), (404, Some("unknown_model")));
        assert_eq!(body_json(&p)["error"]["code"], "model_not_found");
        let mut r = req(
            Route::Entry(Format::Gemini),
            "",
            br#"{"contents":[{"role":"user","parts":[{"text":"x"}]}]}"#,
        );
        r.model = Some("gpt-a-image");
        let p = prepare(&s, None, &r);
        assert_eq!((p.status, p.deny_reason), (404, Some("model_not_permitted")));
        assert_eq!(body_json(&p)["error"]["status"], "NOT_FOUND");
        let p = prepare(&s, None, &req(Route::Entry(Format::OpenAiChat), "", b"{nope"));
        assert_eq!((p.status, p.deny_reason), (400, Some("invalid_request")));
        assert_eq!(body_json(&p)["error"]["code"], "invalid_request");
    }

    #[test]
    fn test_openai_embeddings_body_is_validated_and_rendered_per_input() {
        assert_eq!(
            openai_embedding_request(br#"{"model":"m","input":"a"}"#),
            Ok(("m".into(), vec!["a".into()]))
        );
        assert_eq!(
            openai_embedding_request(br#"{"model":"m","input":["a","b"]}"#)
                .unwrap()
                .1
                .len(),
            2
        );
        for bad in [
            &br#"{"model":"m","input":[1,2]}"#[..],
            br#"{"model":"m","input":[]}"#,
            br#"{"input":"a"}"#,
            br#"{"model":"m","input":"a","encoding_format":"int8"}"#,
            br#"{"model":"m","input":[""]}"#,
            b"[]",
        ] {
            assert!(
                openai_embedding_request(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let s = snapshot();
        let p = prepare(
            &s,
            None,
            &req(Route::OpenAiEmbeddings, "", br#"{"model":"gpt-b","input":["x"]}"#),
        );
        assert_eq!(
            (p.status, p.deny_reason),
            (404, Some("model_not_permitted")),
            "a chat model is not an embedding model"
        );
        assert_eq!(body_json(&p)["error"]["code"], "model_not_found");
    }

    #[test]
    fn test_denials_follow_mesh_order_and_shape() {
        let s = snapshot();
        let mut r = req(Route::Proxy, "model=gpt-b", b"{}");
        r.authorization = None;
        assert_eq!(prepare(&s, None, &r).status, 401);
        let p = prepare(&s, None, &req(Route::Proxy, "model=nope", b"{}"));
        assert_eq!(
            (p.status, body_json(&p)),
            (403, json!({"error": "model_not_permitted"}))
        );
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-a-image", b"{}"));
        assert_eq!(p.deny_reason, Some("model_not_permitted"), "generation model via proxy");
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-old", b"{}"));
        assert_eq!(p.deny_reason, Some("model_blocked"));
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", b"{not json"));
        assert_eq!(body_json(&p), json!({"error": "invalid_request"}));
        let p = prepare(
            &s,
            None,
            &req(Route::Proxy, "model=gpt-b", br#"{"query":"a","max_tokens":0}"#),
        );
        assert_eq!(
            body_json(&p),
            json!({"error": "invalid_request", "detail": content::INVALID_MAX_TOKENS})
        );
        let doc = br#"{"content":[{"type":"document","media_type":"application/pdf","data":"AAAA"}]}"#;
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", doc));
        assert_eq!(
            body_json(&p),
            json!({"error": "content_type_not_supported_by_model", "content_type": "document"})
        );
        let mut r = req(Route::Proxy, "model=gpt-b", b"{}");
        r.now_ms = NOON_WED - 5 * 3_600_000; // 07:00Z = 08:00 Paris, before the window
        let p = prepare(&s, None, &r);
        assert_eq!(
            body_json(&p),
            json!({"error": "outside_allowed_hours", "resume_at": "2025-03-05T08:00:00Z"})
        );
        assert_eq!(p.retry_after_s, None);
    }

    #[test]
    fn test_kill_switch_is_checked_after_policy_and_carries_retry_after() {
        let mut config = config();
        config["kill_switch"] = json!(true);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        assert_eq!(
            (p.status, p.deny_reason, p.retry_after_s),
            (503, Some("paused_by_admin"), Some(KILL_SWITCH_RETRY_S))
        );
    }

    #[test]
    fn test_hourly_limit_counts_attempts_in_the_segment() {
        let path = std::env::temp_dir().join(format!("meshfast-test-{}-prepare", std::process::id()));
        let segment = Arc::new(Segment::create(&path, 64, 16, 4).unwrap());
        let s = snapshot();
        for _ in 0..100 {
            assert_eq!(
                prepare(
                    &s,
                    Some(&segment),
                    &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#)
                )
                .status,
                0
            );
        }
        let p = prepare(
            &s,
            Some(&segment),
            &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#),
        );
        assert_eq!(
            body_json(&p),
            json!({"error": "user_model_hourly_limit_reached", "resume_at": "2025-03-05T13:00:00Z", "limit": 100})
        );
        assert_eq!(p.retry_after_s, Some(3600));
        std::fs::remove_file(path).unwrap();
    }

    fn spend_key(s: &Snapshot) -> u128 {
        s.grants[0].spend_key.at(utc_day(NOON_WED))
    }

    /// `query` "a", default max_tokens 4096: 1 × 1000/1000 + 4096 × 2000/1000 nano.
    const WORST_A: i64 = 1 + 8192;
    const CAP: i64 = 2_500_000_000;

    #[test]
    fn test_budget_is_denied_when_the_worst_case_does_not_fit() {
        let (path, seg) = segment("budget");
        let s = snapshot();
        seg.add(spend_key(&s), CAP - WORST_A + 1).unwrap();
        let p = prepare(&s, Some(&seg), &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        assert_eq!(
            body_json(&p),
            json!({"error": "budget_exceeded", "cap": 2.5, "resume_at": "2025-03-06T00:00:00Z"})
        );
        assert_eq!(
            (p.status, p.retry_after_s, p.should_retry),
            (429, Some(12 * 3600), Some(false))
        );
        let limit = p.limit.unwrap();
        assert_eq!(
            (limit.id.as_ref(), limit.reset_at_ms),
            ("policy.daily_usd", next_utc_midnight(NOON_WED))
        );
        assert!(limit.utilization > 99.99 && limit.utilization <= 100.0, "{limit:?}");
        assert_eq!(
            seg.get(spend_key(&s)),
            CAP - WORST_A + 1,
            "nothing reserved, nothing counted"
        );
        // A smaller max_tokens fits: 1 + 4095 × 2 = 8191 <= 8192.
        let p = prepare(
            &s,
            Some(&seg),
            &req(Route::Proxy, "model=gpt-b", br#"{"query":"a","max_tokens":4095}"#),
        );
        assert_eq!((p.status, p.should_retry), (0, None));
        assert_eq!(p.holds.as_ref().unwrap().reserved_nano(), 8191);
        assert_eq!(seg.get(spend_key(&s)), CAP - 1);
        assert_eq!(p.limit.unwrap().utilization, 100.0, "rounded to two decimals");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_drop_releases_the_reservation_and_settle_is_idempotent() {
        let (path, seg) = segment("settle");
        let s = snapshot();
        let key = spend_key(&s);
        let p = prepare(&s, Some(&seg), &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        assert_eq!(seg.get(key), WORST_A);
        assert_eq!(seg.reserved(), std::collections::HashMap::from([(key, WORST_A)]));
        drop(p);
        assert_eq!((seg.get(key), seg.reserved().len()), (0, 0));
        let p = prepare(&s, Some(&seg), &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        let holds = p.holds.as_ref().unwrap();
        assert!(holds.settle(1234).unwrap());
        assert!(!holds.settle(99).unwrap());
        drop(p);
        assert_eq!(seg.get(key), 1234);
        // No cap: nothing reserved, settle charges the spend counter once.
        let p = prepare(
            &s,
            Some(&seg),
            &req(Route::Generate, "model=gpt-a-image", br#"{"prompt":"cat"}"#),
        );
        let holds = p.holds.as_ref().unwrap();
        assert_eq!(holds.reserved_nano(), 0);
        assert!(holds.settle(50).unwrap() && !holds.settle(50).unwrap());
        assert_eq!(seg.get(s.grants[1].spend_key.at(utc_day(NOON_WED))), 50);
        assert_eq!(seg.stats().leases_held, 0);
        std::fs::remove_file(path).unwrap();
    }

    /// Runs `work(child, segment)` in `children` forked processes on the segment at `path` and
    /// waits for them; fails if any child panicked.
    fn fork_children(path: &std::path::Path, children: u64, work: impl Fn(u64, Arc<Segment>)) {
        let mut pids = Vec::new();
        for child in 0..children {
            // SAFETY: the child only touches the mapping and exits without unwinding.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // NOTE: the harness captures a test thread's output, which a child never hands
                // back: its panic goes straight to stderr, so a failure says why.
                std::panic::set_hook(Box::new(|info| {
                    let text = format!("forked child: {info}\n");
                    // SAFETY: writing a buffer we own to fd 2.
                    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
                }));
                let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    work(child, Arc::new(Segment::open(path).unwrap()));
                }))
                .is_ok();
                // SAFETY: _exit skips the harness's atexit handlers in the child.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            pids.push(pid);
        }
        for pid in pids {
            let mut status = 0;
            // SAFETY: waiting on our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child failed: wait status {status:#x} (its panic, if any, is on stderr above)"
            );
        }
    }

    #[test]
    fn test_forked_processes_reserving_and_settling_never_exceed_the_cap() {
        let mut config = config();
        config["grants"][0]["daily_cap_nano_usd"] = json!(200_000);
        config["grants"][0]["max_calls_per_hour"] = json!(null);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let (path, seg) = segment("budgetfork");
        let key = spend_key(&s);
        let tally = crate::shm::counter_key(crate::shm::CALLS_HOUR, &[7; 16], &[7; 16], 0);
        fork_children(&path, 4, |child, mine| {
            let mut open = Vec::new();
            for i in 0..300u64 {
                let p = prepare(&s, Some(&mine), &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
                assert!(mine.get(key) <= 200_000);
                if p.status == 0 {
                    open.push(p);
                } else {
                    assert_eq!(p.deny_reason, Some("budget_exceeded"));
                }
                if open.len() > 3 || (i + child) % 5 == 0 {
                    if let Some(p) = (!open.is_empty()).then(|| open.remove(0)) {
                        // Actual cost at most the worst case (8,193 nano-USD here: 4,096 output
                        // tokens at 2,000 per 1k and one input token); some calls are dropped
                        // unsettled.
                        let actual = ((i * 37 + child) % 8000) as i64;
                        if i % 7 != 0 && p.holds.as_ref().unwrap().settle(actual).unwrap() {
                            mine.add(tally, actual).unwrap();
                        }
                    }
                }
            }
        });
        assert_eq!(seg.get(key), seg.get(tally), "the counter is exactly the settled costs");
        assert!(seg.get(key) <= 200_000);
        assert_eq!(seg.stats().leases_held, 0);
        std::fs::remove_file(path).unwrap();
    }

    /// Two models under one tag, a monthly block rule on the tag: forked processes calling both
    /// at once never commit more than the threshold, and the window counters are exactly the
    /// settled costs (the pool's reserve-then-read order, rules module docs).
    #[test]
    fn test_a_rule_over_a_tag_never_overshoots_across_models_and_processes() {
        let mut config = config();
        config["grants"][0]["daily_cap_nano_usd"] = json!(0);
        config["grants"][0]["max_calls_per_hour"] = json!(null);
        let mut twin = config["models"][0].clone();
        twin["id"] = json!("77777777-7777-7777-7777-777777777777");
        twin["name"] = json!("gpt-c");
        config["models"].as_array_mut().unwrap().push(twin);
        config["models"][0]["tags"] = json!(["fam"]);
        config["models"][3]["tags"] = json!(["fam"]);
        let mut grant = config["grants"][0].clone();
        grant["model"] = json!(3);
        config["grants"].as_array_mut().unwrap().push(grant);
        config["rules"] = json!([{"id": "fam-cap", "weight": 5, "mode": "enforce", "entries": [
            {"window": "monthly", "tag": "fam", "threshold_nano": 200_000, "actions": [{"type": "block"}]}]}]);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let (path, seg) = segment("rulefork");
        let month = crate::ruleset::CalendarWindow::Monthly.period(chrono_tz::UTC, NOON_WED);
        let committed = |seg: &Segment| -> i64 {
            [0, 3]
                .iter()
                .map(|&g| seg.get(s.pair_key(&s.grants[g], crate::shm::WINDOW_MONTH, month)))
                .sum()
        };
        let tally = crate::shm::counter_key(crate::shm::CALLS_HOUR, &[7; 16], &[7; 16], 0);
        fork_children(&path, 4, |child, mine| {
            let mut open = Vec::new();
            for i in 0..300u64 {
                let query = if (i + child) % 2 == 0 {
                    "model=gpt-b"
                } else {
                    "model=gpt-c"
                };
                let p = prepare(&s, Some(&mine), &req(Route::Proxy, query, br#"{"query":"a"}"#));
                assert!(committed(&mine) <= 200_000);
                if p.status == 0 {
                    open.push(p);
                } else {
                    assert_eq!(p.deny_reason, Some("budget_exceeded"));
                    assert!(p.body.starts_with(br#"{"error":"budget_exceeded","rule":"fam-cap""#));
                }
                if open.len() > 3 || (i + child) % 5 == 0 {
                    if let Some(p) = (!open.is_empty()).then(|| open.remove(0)) {
                        // At most the worst case, as in the test above.
                        let actual = ((i * 37 + child) % 8000) as i64;
                        if i % 7 != 0 && p.holds.as_ref().unwrap().settle(actual).unwrap() {
                            mine.add(tally, actual).unwrap();
                        }
                    }
                }
            }
        });
        assert_eq!(
            committed(&seg),
            seg.get(tally),
            "the window counters are exactly the settled costs"
        );
        assert!(committed(&seg) <= 200_000);
        assert!(
            committed(&seg) > 150_000,
            "the cap was reached, not refused early: {}",
            committed(&seg)
        );
        assert_eq!(seg.stats().leases_held, 0);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_restrictions_refuse_like_an_unknown_model_and_the_row_says_which_layer() {
        let mut config = config();
        config["principals"][1]["status"] = json!("active");
        config["principals"][0]["manager"] = json!(1);
        config["principals"][0]["business_unit"] = json!("payments");
        config["models"][0]["restrictions"] = json!({"leader_deny": [1]});
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        assert_eq!((p.status, p.deny_reason), (403, Some("model_restricted_by_leader")));
        assert_eq!(p.body, b"{\"error\":\"model_not_permitted\"}\n");
        let body = br#"{"model":"gpt-b","messages":[{"role":"user","content":"a"}]}"#;
        let p = prepare(&s, None, &req(Route::Entry(Format::OpenAiChat), "", body));
        assert_eq!((p.status, p.deny_reason), (404, Some("model_restricted_by_leader")));
        let listed: Vec<&str> = s.visible_grants(0).map(|(_, m, _)| m.name.as_str()).collect();
        assert!(
            !listed.contains(&"gpt-b"),
            "a refused caller does not see the model listed: {listed:?}"
        );

        config["models"][0]["restrictions"] = json!({"leader_deny": [1], "exempt": [0]});
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        assert_eq!(
            prepare(&s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#)).status,
            0
        );

        config["models"][0]["restrictions"] = json!({"business_units_open": ["search"]});
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        assert_eq!(p.deny_reason, Some("model_restricted_by_business_unit"));
        config["models"][0]["restrictions"] = json!({"business_units_closed": ["payments"]});
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let p = prepare(&s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        assert_eq!(p.deny_reason, Some("model_restricted_by_business_unit"));
        config["models"][0]["restrictions"] = json!({"leader_allow": [1]});
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        assert_eq!(
            prepare(&s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#)).status,
            0
        );
    }

    /// A staged model answers like an unknown one (the row says staged); a limited one serves its
    /// roster only; members of an authoritative pilot listing the model are served over the
    /// release, the roster and the restrictions.
    #[test]
    fn test_staged_and_limited_models_refuse_like_unknown_ones_and_a_pilot_decides_for_its_members() {
        let mut config = config();
        let proxy = |s: &Snapshot| prepare(s, None, &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        let body = br#"{"model":"gpt-b","messages":[{"role":"user","content":"a"}]}"#;
        let entry = |s: &Snapshot| prepare(s, None, &req(Route::Entry(Format::OpenAiChat), "", body));

        config["models"][0]["status"] = json!("staged");
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let p = proxy(&s);
        assert_eq!((p.status, p.deny_reason), (403, Some("model_staged")));
        assert_eq!(p.body, b"{\"error\":\"model_not_permitted\"}\n");
        assert_eq!((entry(&s).status, entry(&s).deny_reason), (404, Some("model_staged")));
        assert!(s.visible_grants(0).all(|(_, m, _)| m.name != "gpt-b"));

        config["models"][0]["status"] = json!("limited");
        config["models"][0]["roster"] = json!([1]);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        assert_eq!((entry(&s).status, entry(&s).deny_reason), (404, Some("model_limited")));
        config["models"][0]["roster"] = json!([1, 0]);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        assert_eq!(entry(&s).status, 0, "a roster member is served");

        // An authoritative pilot's member: served although staged, or restricted.
        config["models"][0]["status"] = json!("staged");
        config["models"][0]["roster"] = json!([]);
        config["models"][0]["pilot_access"] = json!([0]);
        config["models"][0]["restrictions"] = json!({"business_units_open": ["nowhere"]});
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        assert_eq!(proxy(&s).status, 0);
        assert!(s.visible_grants(0).any(|(_, m, _)| m.name == "gpt-b"));
        config["models"][0]["pilot_access"] = json!([1]);
        config["models"][0]["status"] = json!("active");
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        assert_eq!(proxy(&s).deny_reason, Some("model_restricted_by_business_unit"));

        // A roster on a model that is not limited, or a status outside the four, is refused.
        config["models"][0]["roster"] = json!([0]);
        assert!(Snapshot::from_msgpack(&encode(&config), PEPPER).is_err());
        config["models"][0]["roster"] = json!([]);
        config["models"][0]["status"] = json!("preview");
        assert!(Snapshot::from_msgpack(&encode(&config), PEPPER).is_err());
    }

    #[test]
    fn test_provider_share_caps_the_weight_its_calls_hold() {
        let mut config = config();
        config["providers"][0]["admission_share_pct"] = json!(10);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let (path, seg) = segment("share");
        let call = || {
            prepare(
                &s,
                Some(&seg),
                &req(Route::Generate, "model=gpt-a-image", br#"{"prompt":"cat"}"#),
            )
        };
        let (a, b) = (call(), call());
        let (ha, hb) = (a.holds.as_ref().unwrap(), b.holds.as_ref().unwrap());
        // Capacity 100, share 10 %: one generate call (weight 25, clamped to the share) fills it.
        assert_eq!(ha.admit_provider(1, 0, 100).unwrap(), (true, 0));
        assert_eq!(
            hb.admit_provider(1, 0, 100).unwrap(),
            (false, crate::govern::SLOT_POLL_NS)
        );
        ha.release_provider();
        assert_eq!(
            hb.admit_provider(1, 0, 100).unwrap(),
            (true, 0),
            "released share admits the next"
        );
        drop(b);
        assert_eq!(
            ha.admit_provider(1, 0, 100).unwrap(),
            (true, 0),
            "drop gives the share back"
        );
        drop(a);
        std::fs::remove_file(path).ok();
    }

    #[test]
    fn test_provider_admission_takes_a_slot_then_a_token_and_gives_the_slot_back_on_refusal() {
        let mut config = config();
        config["providers"][0]["max_concurrent_upstream"] = json!(1);
        config["providers"][0]["max_outbound_rps"] = json!(2);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let (path, seg) = segment("provider");
        let call = || {
            prepare(
                &s,
                Some(&seg),
                &req(Route::Generate, "model=gpt-a-image", br#"{"prompt":"cat"}"#),
            )
        };
        let (a, b) = (call(), call());
        let (ha, hb) = (a.holds.as_ref().unwrap(), b.holds.as_ref().unwrap());
        let t0 = 5_000_000_000;
        assert_eq!(ha.admit_provider(t0, 0, 0).unwrap(), (true, 0));
        assert_eq!(ha.admit_provider(t0, 0, 0).unwrap(), (true, 0), "idempotent");
        assert_eq!(
            hb.admit_provider(t0, 0, 0).unwrap(),
            (false, crate::govern::SLOT_POLL_NS),
            "the one slot is taken"
        );
        ha.release_provider();
        assert_eq!(
            hb.admit_provider(t0, 0, 0).unwrap(),
            (true, 0),
            "burst 2: a second token at once"
        );
        hb.release_provider();
        assert_eq!(
            ha.admit_provider(t0 + 100_000_000, 0, 0).unwrap(),
            (false, 400_000_000),
            "bucket empty: wait, slot released"
        );
        assert_eq!(
            hb.admit_provider(t0 + 100_000_000, 0, 0).unwrap(),
            (false, 400_000_000),
            "not the slot: the bucket"
        );
        assert_eq!(ha.admit_provider(t0 + 500_000_000, 0, 0).unwrap(), (true, 0));
        ha.release_provider();
        assert_eq!(
            hb.admit_provider(t0 + 500_000_000, 1_000_000_000, 0).unwrap(),
            (true, 500_000_000),
            "within the allowed wait: the next token is taken, in line"
        );
        hb.release_provider();
        assert_eq!(
            ha.admit_provider(t0 + 500_000_000, 600_000_000, 0).unwrap(),
            (false, 1_000_000_000),
            "the token after that is further away than allowed: nothing taken"
        );
        assert_eq!(
            ha.admit_provider(t0 + 500_000_000, 1_000_000_000, 0).unwrap(),
            (true, 1_000_000_000)
        );
        // Process-wide weight: generate weighs 25; × factor 2, clamped to the capacity.
        assert!(ha.admit_global(60, 2).unwrap());
        assert_eq!(seg.get(crate::shm::global_inflight_key()), 50);
        assert!(!hb.admit_global(60, 1).unwrap(), "25 more does not fit under 60");
        drop(a);
        assert_eq!(
            seg.get(crate::shm::global_inflight_key()),
            0,
            "drop releases slot and weight"
        );
        assert!(hb.admit_global(10, 4).unwrap(), "clamped to the capacity");
        assert_eq!(seg.get(crate::shm::global_inflight_key()), 10);
        assert!(hb.settle(0).unwrap());
        assert_eq!(seg.stats().leases_held, 0);
        // A reading of the clock slightly behind a full bucket waits rather than resetting it.
        assert_eq!(crate::shm::gcra_step(t0 + 10, t0 - 1, 5, 2), Err(6));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_generation_without_plan_is_refused_and_query_is_percent_decoded() {
        let s = snapshot();
        let p = prepare(
            &s,
            None,
            &req(Route::Generate, "x=1&model=gpt%2Da%2dimage", br#"{"prompt":"cat"}"#),
        );
        assert_eq!(p.requested_model, "gpt-a-image");
        assert_eq!(
            p.status,
            0,
            "the openai preset generates images: {}",
            String::from_utf8_lossy(&p.body)
        );
        assert_eq!(p.upstream.as_ref().unwrap().weight, 25);
        assert_eq!(query_param("model=a+b%zz", "model").as_deref(), Some("a b%zz"));
    }

    #[test]
    fn test_an_alias_reaches_its_model_on_every_route_and_is_denied_as_its_model() {
        let mut config = config();
        config["models"][0]["aliases"] = json!(["fast"]);
        config["models"][2]["aliases"] = json!(["old"]);
        config["grants"].as_array_mut().unwrap().pop();
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let p = prepare(&s, None, &req(Route::Proxy, "model=fast", br#"{"query":"a"}"#));
        assert_eq!(
            (p.status, p.model_name.as_deref(), p.requested_model.as_str()),
            (0, Some("gpt-b"), "fast")
        );
        let sent: serde_json::Value = serde_json::from_slice(&p.upstream.as_ref().unwrap().body).unwrap();
        assert_eq!(sent["model"], "gpt-b", "the upstream gets the resolved model");
        let chat = br#"{"model":"fast","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            prepare(&s, None, &req(Route::Entry(Format::OpenAiChat), "", chat)).status,
            0
        );
        let old = br#"{"model":"old","messages":[{"role":"user","content":"hi"}]}"#;
        let p = prepare(&s, None, &req(Route::Entry(Format::OpenAiChat), "", old));
        assert_eq!(
            (p.status, p.deny_reason),
            (404, Some("model_not_permitted")),
            "an alias of an ungranted model"
        );
        let p = prepare(
            &s,
            None,
            &req(
                Route::Entry(Format::Anthropic),
                "",
                br#"{"model":"nope","max_tokens":5,"messages":[]}"#,
            ),
        );
        assert_eq!(p.deny_reason, Some("unknown_model"));
    }
}
