//! Spend rules at request time (API.md "Organisation and spend rules"): the rules the snapshot
//! holds ([`crate::ruleset`]) decided on for a call, against the snapshot's people and models and
//! the shared counters.
//!
//! A rule's entries select people (tiers, leaders, business units, applications, an explicit list of
//! principals such as pilots' members, minus the exempt) and a scope (a tag, one model, or several
//! models counted together such as a pilot's); a call is governed by every entry whose scope covers
//! the requested model and whose population holds the caller, in precedence order (weight, then id).
//! Onboarding's controls arrive as rules too (`limited:<model>`, `pilot:<id>`; meshfast.onboarding).
//!
//! **Spend in scope** is the sum, over the models of the scope the person holds grants to, of the
//! person's committed spend in the window instance ([`shm::WINDOW_DAY`], `_WEEK`, `_MONTH`
//! counters, which every settled call feeds whether or not a rule exists: rules are retroactive).
//!
//! **No overshoot.** Every enforcing `block` entry covering a call reserves the call's worst case
//! in the entry's pool ([`shm::RULE_POOL`], a lease) *before* reading the committed counters, and
//! refuses when `committed + pool > threshold`. A settling call adds its cost to the committed
//! counters *before* giving its pool reservation back. So at the instant of any reader's pool
//! add, every other call is counted at least once: in the pool (still reserved) or in the
//! committed counters read after (settled) — never in neither. The last call admitted thus saw
//! every call admitted before it, and recorded spend cannot pass the threshold as long as a call
//! costs at most its worst case (the same bound the per-user daily cap relies on).

use crate::govern::{Event, LeaseWant, Watch};
use crate::json::{rfc3339, write_str, write_usd};
use crate::ruleset::{local_date, CalendarWindow, Entry, RawRule, Rule, Rules, Scope, EPOCH};
use crate::shm::{self, sum, CounterRead, KeyTemplate, Lease, Segment};
use crate::snapshot::{Model, Snapshot};

/// An entry's reading of the snapshot's people and models at request time.
impl Entry {
    /// Whether the population holds `principal`: AND across kinds, OR within a list, an empty
    /// list means everyone; the exempt never match; `leaders` holds each leader's organisation.
    #[must_use]
    pub fn matches(&self, snapshot: &Snapshot, principal: u32) -> bool {
        if self.exempt.contains(&principal) {
            return false;
        }
        let person = &snapshot.principals[principal as usize];
        let listed = |list: &[String], value: &Option<String>| {
            list.is_empty() || value.as_ref().is_some_and(|v| list.iter().any(|x| x == v))
        };
        (self.applications.is_empty() || self.applications.contains(&principal))
            && (self.principals.is_empty() || self.principals.contains(&principal))
            && listed(&self.tiers, &person.tier)
            && listed(&self.business_units, &person.business_unit)
            && (self.leaders.is_empty() || self.leaders.iter().any(|&l| snapshot.in_organisation_of(principal, l)))
    }

    fn scope_json(&self, out: &mut Vec<u8>, models: &[Model]) {
        match &self.scope {
            Scope::Tag(tag) => {
                out.extend_from_slice(b"{\"tag\":");
                write_str(out, tag);
            }
            Scope::Model(m) => {
                out.extend_from_slice(b"{\"model\":");
                write_str(out, models.get(*m as usize).map_or("", |m| m.name.as_str()));
            }
            Scope::Models(list) => {
                out.extend_from_slice(b"{\"models\":[");
                for (i, m) in list.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_str(out, models.get(*m as usize).map_or("", |m| m.name.as_str()));
                }
                out.push(b']');
            }
        }
        out.push(b'}');
    }
}

/// Counter keys of a principal's committed spend in a window, one per model of the scope they
/// hold a grant to.
fn scope_keys(snapshot: &Snapshot, principal: u32, entry: &Entry, period: u32) -> Vec<u128> {
    snapshot
        .grants_of(principal)
        .filter(|g| entry.covers(g.model))
        .map(|g| snapshot.pair_key(g, entry.window.kind(), period))
        .collect()
}

/// A principal's committed spend in the scope of `entry` in a window instance, without
/// collecting the keys (the dry-run and the usage view read it for many people).
fn scope_spend(counters: &impl CounterRead, snapshot: &Snapshot, principal: u32, entry: &Entry, period: u32) -> i64 {
    snapshot
        .grants_of(principal)
        .filter(|g| entry.covers(g.model))
        .map(|g| counters.counter(snapshot.pair_key(g, entry.window.kind(), period)))
        .sum()
}

/// Whether the scope of `entry` covers a model the principal holds a grant to and may see.
fn in_reach(snapshot: &Snapshot, principal: u32, entry: &Entry) -> bool {
    snapshot
        .visible_grants(principal)
        .any(|(g, _, _)| entry.covers(g.model))
}

/// Why the rules refuse a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// A `block` entry: spend at or over the threshold, or the worst case would cross it.
    Block {
        rule: String,
        threshold_nano: i64,
        reset_at_ms: i64,
    },
    /// A `pause`, lifting at `resume_at_ms`.
    Pause { rule: String, resume_at_ms: i64 },
    /// A per-minute cap of calls or tokens.
    Rate { rule: String, retry_at_ms: i64 },
}

/// The governing rule entry of a call, for the status headers.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleLimit {
    pub rule: String,
    /// Percent of the threshold, counting open reservations (this call's included).
    pub utilization: f64,
    pub reset_at_ms: i64,
}

/// The rules' decision on one call (see [`decide`]).
#[derive(Debug, Default)]
pub struct Decision {
    pub refusal: Option<Refusal>,
    /// The first shadow entry that would have refused the call (its rule id).
    pub would_deny: Option<String>,
    /// The first enforcing `warn` whose threshold is reached.
    pub warning: Option<String>,
    pub limit: Option<RuleLimit>,
    /// Pool reservations, given back when the call settles (after its cost is committed).
    pub leases: Vec<Lease>,
    /// The committed-spend counters (day, week, month) the call's cost goes to.
    pub charges: Vec<u128>,
    /// Per-minute token buckets the call's tokens go to: `(key, ns per token)`.
    pub token_keys: Vec<(u128, i64)>,
    pub watches: Vec<Watch>,
    /// Events already emitted (a pause that began, a block's notification).
    pub events: Vec<Event>,
    /// The shared memory could not be read or written: fail closed.
    pub unavailable: bool,
    /// In a cluster: this instance's reservations under each enforcing block entry's slices,
    /// settled with the call's cost.
    pub own_leases: Vec<Lease>,
    /// In a cluster: the slice of an entry's threshold the call was refused for want of.
    pub lease_wanted: Option<LeaseWant>,
    /// In a cluster: the per-minute call counts this call took (given back if it is refused).
    pub minute_calls: Vec<u128>,
    /// In a cluster: the per-minute token counters the call's tokens go to.
    pub minute_tokens: Vec<u128>,
}

fn notify_events(
    rule: &Rule,
    entry: &Entry,
    model: &Model,
    window_start_ms: i64,
    resume_at_ms: Option<i64>,
) -> Vec<Event> {
    let mut detail = Vec::with_capacity(96);
    detail.extend_from_slice(b"{\"model\":");
    write_str(&mut detail, &model.name);
    if let Some(template) = &entry.template {
        detail.extend_from_slice(b",\"template\":");
        write_str(&mut detail, template);
    }
    if let Some(at) = resume_at_ms {
        detail.extend_from_slice(b",\"resume_at_ms\":");
        detail.extend_from_slice(itoa::Buffer::new().format(at).as_bytes());
    }
    detail.push(b'}');
    let detail = String::from_utf8(detail).unwrap_or_default();
    entry
        .notify
        .iter()
        .map(|channel| Event {
            rule_id: rule.id.clone(),
            entry: entry.number,
            action: "notify",
            channel: channel.as_str(),
            window: entry.window.as_str(),
            window_start_ms,
            threshold_nano: entry.threshold_nano.unwrap_or(0),
            spend_nano: 0,
            detail: detail.clone(),
        })
        .collect()
}

/// One scope and window's state during a decision, shared by the entries over it.
struct ScopeState {
    id: [u8; 16],
    /// The person's committed-spend counters in the scope (this window instance).
    keys: Vec<u128>,
    /// Their sum: read when first needed, and again right after the pool reservation.
    committed: i64,
    pool_key: u128,
    /// The pool as read (after this call's reservation once `reserved`).
    pool: Option<i64>,
    /// This call holds a lease in the pool.
    reserved: bool,
}

/// The rules' decision for `principal` calling `model` with worst-case cost `worst_nano` at
/// `now_ms`: reserves in every enforcing block entry's pool (held in the decision's leases until
/// settle), starts pauses, counts per-minute calls. On a refusal nothing stays reserved. `mode`
/// is the instance's cluster mode as [`shm::cluster_mode`] read it for this call (0 alone).
#[must_use]
pub fn decide(
    snapshot: &Snapshot,
    segment: &Segment,
    principal: u32,
    grant_index: u32,
    worst_nano: i64,
    now_ms: i64,
    mode: i64,
) -> Decision {
    let rules = &snapshot.rules;
    let grant = &snapshot.grants[grant_index as usize];
    let model_index = grant.model;
    let model = &snapshot.models[model_index as usize];
    let tz = rules.tz;
    let date = local_date(tz, now_ms);
    let mut d = Decision {
        charges: [CalendarWindow::Daily, CalendarWindow::Weekly, CalendarWindow::Monthly]
            .iter()
            .map(|w| snapshot.pair_key(grant, w.kind(), w.period_of(date)))
            .collect(),
        ..Decision::default()
    };
    let principal_bytes = snapshot.principals[principal as usize].key_bytes;
    // Each window's instance and bounds, computed once per call when first needed.
    let mut windows: [Option<(u32, i64, i64)>; 3] = [None; 3];
    let now_ns = now_ms.saturating_mul(1_000_000);
    let mut best: Option<RuleLimit> = None;
    let mut scopes: Vec<ScopeState> = Vec::new();
    let own = |state: &ScopeState| if state.reserved { 0 } else { worst_nano.max(0) };

    for (rule, entry) in rules.covering(model_index) {
        if !entry.matches(snapshot, principal) {
            continue;
        }
        let enforcing = rules.enforcing(rule);
        let key = |kind: u8, period: u32| KeyTemplate::new(kind, &principal_bytes, &entry.key_id).at(period);
        let refuse = |d: &mut Decision, refusal: Refusal| {
            if enforcing {
                d.refusal = Some(refusal);
                true
            } else {
                d.would_deny.get_or_insert_with(|| rule.id.clone());
                false
            }
        };
        // Per-minute caps are token buckets (GCRA) of a minute's worth: `cap` back to back, then
        // one per `60 s / cap`; one slot per person and entry, whatever the minute.
        let cluster = enforcing && mode != 0;
        // NOTE: only read in a cluster (the UTC minute its per-minute counts are kept for).
        let minute = (now_ms.max(0) / 60_000) as u32;
        let next_minute_ms = || (i64::from(minute) + 1) * 60_000;
        if let (Some(cap), true) = (entry.calls_per_minute, cluster) {
            // In a cluster a per-minute cap counts calls per UTC minute, within this instance's
            // slices of it (a call past them is taken back and a slice asked for).
            let own_key = key(shm::RULE_MINUTE_CALLS, minute);
            match segment.add(own_key, 1) {
                Ok(n) if n <= segment.get(shm::ceiling_key(own_key, mode)).min(cap) => d.minute_calls.push(own_key),
                Ok(n) => {
                    let _ = segment.add(own_key, -1);
                    if n <= cap {
                        d.lease_wanted = Some(LeaseWant::count(
                            shm::RULE_MINUTE_CALLS,
                            own_key,
                            minute,
                            1,
                            cap,
                            next_minute_ms(),
                        ));
                    }
                    d.refusal = Some(Refusal::Rate {
                        rule: rule.id.clone(),
                        retry_at_ms: next_minute_ms(),
                    });
                    break;
                }
                Err(_) => {
                    d.unavailable = true;
                    break;
                }
            }
        } else if let Some(cap) = entry.calls_per_minute {
            let calls_key = key(shm::RULE_CALLS_MINUTE, 0);
            let interval = MINUTE_NS / cap;
            let wait = if enforcing {
                match segment.rate_acquire(calls_key, interval.max(1), cap, now_ns) {
                    Ok(wait) => wait,
                    Err(_) => {
                        d.unavailable = true;
                        break;
                    }
                }
            } else {
                shm::gcra_step(segment.get(calls_key), now_ns, interval.max(1), cap)
                    .err()
                    .unwrap_or(0)
            };
            if wait > 0 {
                let rate = Refusal::Rate {
                    rule: rule.id.clone(),
                    retry_at_ms: now_ms + (wait + 999_999) / 1_000_000,
                };
                if refuse(&mut d, rate) {
                    break;
                }
            }
        }
        if let (Some(cap), true) = (entry.tokens_per_minute, cluster) {
            // Tokens counted per UTC minute when the call settles; a call is admitted while this
            // instance's count is under its slices of the cap.
            let own_key = key(shm::RULE_MINUTE_TOKENS, minute);
            let counted = segment.get(own_key);
            if counted >= segment.get(shm::ceiling_key(own_key, mode)).min(cap) {
                if counted < cap {
                    d.lease_wanted = Some(LeaseWant::count(
                        shm::RULE_MINUTE_TOKENS,
                        own_key,
                        minute,
                        (cap / 20).max(1),
                        cap,
                        next_minute_ms(),
                    ));
                }
                d.refusal = Some(Refusal::Rate {
                    rule: rule.id.clone(),
                    retry_at_ms: next_minute_ms(),
                });
                break;
            }
            d.minute_tokens.push(own_key);
        } else if let Some(cap) = entry.tokens_per_minute {
            let tokens_key = key(shm::RULE_TOKENS_MINUTE, 0);
            // The bucket's theoretical arrival time: more than a minute ahead = over the cap.
            let ahead = segment.get(tokens_key).saturating_sub(now_ns);
            if ahead > MINUTE_NS {
                let rate = Refusal::Rate {
                    rule: rule.id.clone(),
                    retry_at_ms: now_ms + (ahead - MINUTE_NS + 999_999) / 1_000_000,
                };
                if refuse(&mut d, rate) {
                    break;
                }
            }
            if enforcing {
                d.token_keys.push((tokens_key, (MINUTE_NS / cap).max(1)));
            }
        }
        let Some(threshold) = entry.threshold_nano else {
            continue;
        };
        let (period, window_start, window_end) = *windows[entry.window as usize].get_or_insert_with(|| {
            let period = entry.window.period_of(date);
            let (start, end) = entry.window.bounds(tz, period);
            (period, start, end)
        });
        // The scope's committed spend and pool, read once per call for every entry sharing them.
        let at = match scopes.iter().position(|sc| sc.id == entry.pool_id) {
            Some(at) => at,
            None => {
                let keys = scope_keys(snapshot, principal, entry, period);
                let committed = sum(segment, &keys);
                // NOTE: one pool per person, scope and window whatever the window instance
                // (in-flight amounts only; a call that began in the last instance counts in the
                // new one until it settles, which only errs on the safe side), so the table
                // does not grow a key per instance.
                let pool_key = KeyTemplate::new(shm::RULE_POOL, &principal_bytes, &entry.pool_id).at(0);
                scopes.push(ScopeState {
                    id: entry.pool_id,
                    keys,
                    committed,
                    pool_key,
                    pool: None,
                    reserved: false,
                });
                scopes.len() - 1
            }
        };
        let mut committed = scopes[at].committed;
        let pool_key = scopes[at].pool_key;

        if let (true, Some(hours)) = (enforcing, entry.pause_hours) {
            // One slot per person and entry holding the start of the last pause; one that began
            // before this window instance does not count in it.
            let pause_key = key(shm::RULE_PAUSE, 0);
            let length = hours * 3_600_000;
            let stored = segment.get(pause_key);
            let mut start = if stored >= window_start { stored } else { 0 };
            if start == 0 && committed >= threshold {
                match segment.replace(pause_key, stored, now_ms) {
                    Ok(before) if before == stored => {
                        start = now_ms;
                        d.events.push(Event {
                            rule_id: rule.id.clone(),
                            entry: entry.number,
                            action: "pause",
                            channel: "",
                            window: entry.window.as_str(),
                            window_start_ms: window_start,
                            threshold_nano: threshold,
                            spend_nano: committed,
                            detail: format!("{{\"resume_at_ms\":{},\"started_at_ms\":{now_ms}}}", now_ms + length),
                        });
                    }
                    Ok(before) => start = if before >= window_start { before } else { 0 },
                    Err(_) => {
                        d.unavailable = true;
                        break;
                    }
                }
            }
            if start > 0 && now_ms < start + length {
                d.refusal = Some(Refusal::Pause {
                    rule: rule.id.clone(),
                    resume_at_ms: start + length,
                });
                break;
            }
        }

        let mut pool = *scopes[at].pool.get_or_insert_with(|| segment.get(pool_key));
        if entry.block && enforcing {
            if !scopes[at].reserved {
                match segment.reserve(pool_key, worst_nano.max(0), i64::MAX) {
                    Ok(Some(lease)) => d.leases.push(lease),
                    _ => {
                        d.unavailable = true;
                        break;
                    }
                }
                // NOTE: the committed counters are read after the pool add (see the module docs).
                let state = &mut scopes[at];
                state.reserved = true;
                state.pool = Some(segment.get(pool_key));
                state.committed = sum(segment, &state.keys);
            }
            (pool, committed) = (scopes[at].pool.unwrap_or(0), scopes[at].committed);
            let keys = &scopes[at].keys;
            let mut over = committed.saturating_add(pool) > threshold;
            // Refused for want of a slice only: no crossing to notify (the call is decided again
            // once the slice is there).
            let mut lease_miss = false;
            if !over && mode != 0 {
                // In a cluster this instance spends only what it declared of its slices of the
                // threshold (a counter of its own spend and reservations under the entry).
                let own_key = key(shm::RULE_OWN, period);
                let ceiling = segment.get(shm::ceiling_key(own_key, mode));
                match segment.reserve(own_key, worst_nano.max(0), ceiling) {
                    Ok(Some(lease)) => d.own_leases.push(lease),
                    Ok(None) => {
                        let day = |ms: i64| (local_date(tz, ms) - EPOCH).num_days() as i32;
                        d.lease_wanted = Some(LeaseWant {
                            kind: shm::RULE_OWN,
                            key: own_key,
                            period,
                            need: worst_nano.max(1),
                            cap: threshold,
                            base: committed,
                            expires_ms: window_end,
                            models: snapshot
                                .grants_of(principal)
                                .filter(|g| entry.covers(g.model))
                                .map(|g| snapshot.models[g.model as usize].id.clone())
                                .collect(),
                            from_day: day(window_start),
                            to_day: day(window_end - 1),
                        });
                        over = true;
                        lease_miss = true;
                    }
                    Err(_) => {
                        d.unavailable = true;
                        break;
                    }
                }
            }
            if over {
                let mut watch_events = Vec::new();
                if !entry.notify.is_empty() && !lease_miss {
                    let watch = Watch {
                        keys: keys.clone(),
                        flag: key(shm::RULE_NOTIFIED, 0),
                        window_start,
                        threshold,
                        events: notify_events(rule, entry, model, window_start, None),
                    };
                    // A block is a crossing even when spend itself stays below the threshold.
                    watch_events = watch.fire(segment, committed.max(threshold));
                    for e in &mut watch_events {
                        e.spend_nano = committed;
                    }
                }
                d.events.extend(watch_events);
                d.limit = Some(RuleLimit {
                    rule: rule.id.clone(),
                    utilization: utilization_pct(committed.saturating_add(pool) - worst_nano.max(0), threshold),
                    reset_at_ms: window_end,
                });
                d.refusal = Some(Refusal::Block {
                    rule: rule.id.clone(),
                    threshold_nano: threshold,
                    reset_at_ms: window_end,
                });
                break;
            }
        } else if entry.block && committed.saturating_add(pool).saturating_add(own(&scopes[at])) > threshold {
            d.would_deny.get_or_insert_with(|| rule.id.clone());
        }
        // This call's worst case, unless it already sits in the pool (an enforcing block entry
        // over the same scope and window reserved it).
        let in_use = committed.saturating_add(pool).saturating_add(own(&scopes[at]));
        let utilization = utilization_pct(in_use, threshold);
        if best.as_ref().is_none_or(|b| utilization > b.utilization) {
            best = Some(RuleLimit {
                rule: rule.id.clone(),
                utilization,
                reset_at_ms: window_end,
            });
        }
        if enforcing {
            if let Some(text) = &entry.warn {
                if committed >= threshold && d.warning.is_none() {
                    d.warning = Some(text.clone());
                }
            }
            if !entry.notify.is_empty() {
                d.watches.push(Watch {
                    keys: scopes[at].keys.clone(),
                    flag: key(shm::RULE_NOTIFIED, 0),
                    window_start,
                    threshold,
                    events: notify_events(rule, entry, model, window_start, None),
                });
            }
        }
    }
    if d.refusal.is_some() || d.unavailable {
        for lease in d.leases.drain(..).chain(d.own_leases.drain(..)) {
            segment.release(&lease);
        }
        for key in d.minute_calls.drain(..) {
            let _ = segment.add(key, -1);
        }
        d.minute_tokens.clear();
        d.watches.clear();
    }
    if d.limit.is_none() {
        d.limit = best;
    }
    d
}

const MINUTE_NS: i64 = 60_000_000_000;

/// Percent of `threshold` that `spend` is, to two decimals.
fn utilization_pct(spend: i64, threshold: i64) -> f64 {
    if threshold <= 0 {
        return 0.0;
    }
    (spend.max(0) as f64 * 10_000.0 / threshold as f64).round() / 100.0
}

fn write_fraction(out: &mut Vec<u8>, spend: i64, threshold: i64) {
    let value = if threshold > 0 {
        spend.max(0) as f64 / threshold as f64
    } else {
        0.0
    };
    let rounded = (value * 1e6).round() / 1e6;
    out.extend_from_slice(format!("{rounded}").as_bytes());
}

/// `GET /v1/usage`'s `rules`: every entry with a threshold whose population holds the caller.
pub fn usage_rules_json(
    out: &mut Vec<u8>,
    snapshot: &Snapshot,
    principal: u32,
    segment: &impl CounterRead,
    now_ms: i64,
) {
    let rules = &snapshot.rules;
    let date = local_date(rules.tz, now_ms);
    let principal_bytes = snapshot.principals[principal as usize].key_bytes;
    out.extend_from_slice(b"\"rules\":[");
    let mut first = true;
    for rule in &rules.rules {
        for entry in &rule.entries {
            let Some(threshold) = entry.threshold_nano else {
                continue;
            };
            // NOTE: only rules on models the caller can use: a rule's scope (a tag) must not
            // tell callers about models they cannot see.
            if !entry.matches(snapshot, principal) || !in_reach(snapshot, principal, entry) {
                continue;
            }
            let period = entry.window.period_of(date);
            let (start, reset) = entry.window.bounds(rules.tz, period);
            let key = |kind: u8| KeyTemplate::new(kind, &principal_bytes, &entry.key_id).at(0);
            let spend = scope_spend(segment, snapshot, principal, entry, period);
            let paused_at = Some(segment.counter(key(shm::RULE_PAUSE)))
                .filter(|&at| at >= start)
                .unwrap_or(0);
            let enforcing = rules.enforcing(rule);
            let paused_until = entry
                .pause_hours
                .map(|h| paused_at + h * 3_600_000)
                .filter(|&until| paused_at > 0 && now_ms < until);
            let status = match () {
                _ if !enforcing && spend >= threshold && entry.block => "would_block",
                _ if !enforcing => "shadow",
                _ if paused_until.is_some() => "paused",
                _ if entry.block && spend >= threshold => "blocked",
                _ if spend >= threshold && (entry.warn.is_some() || !entry.notify.is_empty()) => "warning",
                _ if spend >= threshold => "over",
                _ => "ok",
            };
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(b"{\"id\":");
            write_str(out, &rule.id);
            out.extend_from_slice(b",\"entry\":");
            out.extend_from_slice(itoa::Buffer::new().format(entry.number).as_bytes());
            out.extend_from_slice(b",\"scope\":");
            entry.scope_json(out, &snapshot.models);
            out.extend_from_slice(b",\"window\":\"");
            out.extend_from_slice(entry.window.as_str().as_bytes());
            out.extend_from_slice(b"\",\"mode\":\"");
            out.extend_from_slice(if enforcing { b"enforce" as &[u8] } else { b"shadow" });
            out.extend_from_slice(b"\",\"spend_usd\":");
            write_usd(out, spend);
            out.extend_from_slice(b",\"threshold_usd\":");
            write_usd(out, threshold);
            out.extend_from_slice(b",\"utilization\":");
            write_fraction(out, spend, threshold);
            out.extend_from_slice(b",\"status\":\"");
            out.extend_from_slice(status.as_bytes());
            out.extend_from_slice(b"\",\"reset_at\":");
            write_str(out, &rfc3339(reset));
            if let Some(until) = paused_until {
                out.extend_from_slice(b",\"resume_at\":");
                write_str(out, &rfc3339(until));
            }
            out.push(b'}');
        }
    }
    out.push(b']');
}

/// `POST /admin/rules/dry-run`: for a draft rule (msgpack, the config form), every person whose
/// spend in an entry's scope is at or over its threshold now, with the strongest action the
/// entry would take. Reads counters only.
pub fn dry_run(snapshot: &Snapshot, segment: &impl CounterRead, rule: &[u8], now_ms: i64) -> crate::Result<Vec<u8>> {
    let raw: RawRule =
        rmp_serde::from_slice(rule).map_err(|e| crate::Error::Snapshot(vec![format!("rule does not decode: {e}")]))?;
    let mut errors = Vec::new();
    let tz = snapshot.rules.tz;
    let built = Rules::build(
        &mut errors,
        vec![raw],
        true,
        tz.name(),
        snapshot.principals.len(),
        &snapshot.models.iter().map(|m| m.tags.as_slice()).collect::<Vec<_>>(),
    );
    if !errors.is_empty() {
        return Err(crate::Error::Snapshot(errors));
    }
    let date = local_date(tz, now_ms);
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"affected\":[");
    let mut first = true;
    for rule in &built.rules {
        for entry in &rule.entries {
            let (Some(threshold), Some(action)) = (entry.threshold_nano, entry.strongest_action()) else {
                continue;
            };
            let period = entry.window.period_of(date);
            for (p, person) in snapshot.principals.iter().enumerate() {
                let p = p as u32;
                if !person.active || !entry.matches(snapshot, p) {
                    continue;
                }
                let spend = scope_spend(segment, snapshot, p, entry, period);
                if spend < threshold {
                    continue;
                }
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(b"{\"user_id\":");
                write_str(&mut out, &person.id);
                out.extend_from_slice(b",\"entry\":");
                out.extend_from_slice(itoa::Buffer::new().format(entry.number).as_bytes());
                out.extend_from_slice(b",\"action\":\"");
                out.extend_from_slice(action.as_bytes());
                out.extend_from_slice(b"\",\"spend_usd\":");
                write_usd(&mut out, spend);
                out.extend_from_slice(b",\"threshold_usd\":");
                write_usd(&mut out, threshold);
                out.extend_from_slice(b",\"utilization\":");
                write_fraction(&mut out, spend, threshold);
                out.push(b'}');
            }
        }
    }
    out.extend_from_slice(b"]}\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::test_support::{config, encode, PEPPER};
    use chrono_tz::Tz;
    use proptest::prelude::*;
    use serde_json::json;

    const NOW: i64 = 1_764_000_000_000;

    /// (tiers, leaders, units, exempt, scope: Ok(tag) / Err(model), threshold)
    type CaseEntry = (Vec<u8>, Vec<usize>, Vec<u8>, Vec<usize>, Result<u8, usize>, i64);
    /// (weight, shadow, entries)
    type CaseRule = (i64, bool, Vec<CaseEntry>);

    #[derive(Debug, Clone)]
    struct Case {
        managers: Vec<Option<usize>>,
        tiers: Vec<u8>,
        units: Vec<u8>,
        model_tags: Vec<Vec<u8>>,
        rules: Vec<CaseRule>,
        spend: Vec<Vec<i64>>,
        caller: usize,
        model: usize,
        worst: i64,
    }

    const PEOPLE: usize = 5;
    const MODELS: usize = 3;

    fn case() -> impl Strategy<Value = Case> {
        let managers = (0..PEOPLE)
            .map(|i| {
                if i == 0 {
                    Just(None).boxed()
                } else {
                    proptest::option::of(0..i).boxed()
                }
            })
            .collect::<Vec<_>>();
        let entry = (
            proptest::collection::vec(0u8..2, 0..2),
            proptest::collection::vec(0..PEOPLE, 0..2),
            proptest::collection::vec(0u8..2, 0..2),
            proptest::collection::vec(0..PEOPLE, 0..2),
            prop_oneof![(0u8..2).prop_map(Ok), (0..MODELS).prop_map(Err)],
            1i64..120,
        );
        let rule = (0i64..3, any::<bool>(), proptest::collection::vec(entry, 1..3));
        (
            managers,
            proptest::collection::vec(0u8..2, PEOPLE),
            proptest::collection::vec(0u8..2, PEOPLE),
            proptest::collection::vec(proptest::collection::vec(0u8..2, 0..3), MODELS),
            proptest::collection::vec(rule, 1..5),
            proptest::collection::vec(proptest::collection::vec(0i64..60, MODELS), PEOPLE),
            0..PEOPLE,
            0..MODELS,
            0i64..40,
        )
            .prop_map(
                |(managers, tiers, units, model_tags, rules, spend, caller, model, worst)| Case {
                    managers,
                    tiers,
                    units,
                    model_tags,
                    rules,
                    spend,
                    caller,
                    model,
                    worst,
                },
            )
    }

    fn tag(t: u8) -> String {
        format!("t{t}")
    }

    fn build(c: &Case) -> Snapshot {
        let mut cfg = config();
        cfg["principals"] = json!((0..PEOPLE)
            .map(
                |i| json!({"id": format!("{i:08}-0000-0000-0000-000000000000"), "email": format!("p{i}@x"),
                "display_name": "p", "status": "active", "expires_at_ms": null, "manager": c.managers[i],
                "tier": format!("tier{}", c.tiers[i]), "business_unit": format!("bu{}", c.units[i])})
            )
            .collect::<Vec<_>>());
        cfg["keys"] = json!([]);
        let base = cfg["models"][0].clone();
        cfg["models"] = json!((0..MODELS)
            .map(|m| {
                let mut model = base.clone();
                model["id"] = json!(format!("{m:08}-1111-0000-0000-000000000000"));
                model["name"] = json!(format!("m{m}"));
                model["tags"] = json!(c.model_tags[m].iter().map(|&t| tag(t)).collect::<Vec<_>>());
                model
            })
            .collect::<Vec<_>>());
        cfg["grants"] = json!((0..PEOPLE)
            .flat_map(
                |p| (0..MODELS).map(move |m| json!({"principal": p, "model": m, "daily_cap_nano_usd": 0,
                "max_calls_per_hour": null, "allowed_from_min": null, "allowed_to_min": null, "timezone": "UTC",
                "active_days": [], "always_open": true}))
            )
            .collect::<Vec<_>>());
        cfg["rules"] = json!(c
            .rules
            .iter()
            .enumerate()
            .map(
                |(r, (weight, shadow, entries))| json!({"id": format!("r{r}"), "weight": weight,
                "mode": if *shadow { "shadow" } else { "enforce" },
                "entries": entries.iter().map(|(tiers, leaders, units, exempt, scope, threshold)| {
                    let mut e = json!({"window": "monthly", "threshold_nano": threshold, "actions": [{"type": "block"}],
                        "tiers": tiers.iter().map(|t| format!("tier{t}")).collect::<Vec<_>>(),
                        "leaders": leaders, "exempt": exempt,
                        "business_units": units.iter().map(|u| format!("bu{u}")).collect::<Vec<_>>()});
                    match scope {
                        Ok(t) => e["tag"] = json!(tag(*t)),
                        Err(m) => e["model"] = json!(m),
                    }
                    e
                }).collect::<Vec<_>>()})
            )
            .collect::<Vec<_>>());
        Snapshot::from_msgpack(&encode(&cfg), PEPPER).unwrap()
    }

    /// The slow, obvious reading of API.md: rules by weight (then id), entries in order; the first
    /// enforcing entry covering the model, holding the caller and whose spend plus the worst case
    /// passes the threshold refuses; shadow entries before it only record.
    fn reference(c: &Case) -> (Option<String>, Option<String>) {
        let in_org = |mut p: usize, leader: usize| loop {
            if p == leader {
                return true;
            }
            match c.managers[p] {
                Some(m) => p = m,
                None => return false,
            }
        };
        let covers = |scope: &Result<u8, usize>, m: usize| match scope {
            Ok(t) => c.model_tags[m].contains(t),
            Err(model) => *model == m,
        };
        let mut order: Vec<usize> = (0..c.rules.len()).collect();
        order.sort_by(|&a, &b| {
            c.rules[b]
                .0
                .cmp(&c.rules[a].0)
                .then(format!("r{a}").cmp(&format!("r{b}")))
        });
        let mut would = None;
        for r in order {
            let (_, shadow, entries) = &c.rules[r];
            for (tiers, leaders, units, exempt, scope, threshold) in entries {
                let p = c.caller;
                let holds = !exempt.contains(&p)
                    && (tiers.is_empty() || tiers.contains(&c.tiers[p]))
                    && (units.is_empty() || units.contains(&c.units[p]))
                    && (leaders.is_empty() || leaders.iter().any(|&l| in_org(p, l)));
                if !holds || !covers(scope, c.model) {
                    continue;
                }
                let spend: i64 = (0..MODELS).filter(|&m| covers(scope, m)).map(|m| c.spend[p][m]).sum();
                if spend + c.worst > *threshold {
                    if !shadow {
                        return (Some(format!("r{r}")), would);
                    }
                    would.get_or_insert(format!("r{r}"));
                }
            }
        }
        (None, would)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn decide_matches_the_reference_evaluator(c in case()) {
            let snapshot = build(&c);
            let path = std::env::temp_dir().join(format!("meshfast-rules-prop-{}.seg", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let segment = Segment::create(&path, 4096, 256, 8).unwrap();
            let month = CalendarWindow::Monthly.period(Tz::UTC, NOW);
            for g in snapshot.grants.iter() {
                let spend = c.spend[g.principal as usize][g.model as usize];
                segment.add(snapshot.pair_key(g, shm::WINDOW_MONTH, month), spend).unwrap();
            }
            let grant = snapshot
                .grants
                .iter()
                .position(|g| g.principal as usize == c.caller && g.model as usize == c.model)
                .unwrap() as u32;
            let d = decide(&snapshot, &segment, c.caller as u32, grant, c.worst, NOW, 0);
            let refused = match &d.refusal {
                Some(Refusal::Block { rule, .. }) => Some(rule.clone()),
                None => None,
                other => panic!("{other:?}"),
            };
            for lease in &d.leases {
                segment.release(lease);
            }
            let _ = std::fs::remove_file(&path);
            prop_assert_eq!((refused, d.would_deny), reference(&c));
        }
    }

    /// A scope of several models counts spend on all of them together, and a population of
    /// principals (a pilot's members) holds only them.
    #[test]
    fn a_models_scope_counts_every_listed_model_and_principals_hold_only_them() {
        let mut cfg = config();
        cfg["principals"][1]["status"] = json!("active");
        for g in 0..2 {
            cfg["grants"][g]["daily_cap_nano_usd"] = json!(0);
            cfg["grants"][g]["always_open"] = json!(true);
        }
        let mut other = cfg["grants"][0].clone();
        other["principal"] = json!(1);
        cfg["grants"].as_array_mut().unwrap().push(other);
        cfg["rules"] = json!([{"id": "pilot:p", "weight": 1, "mode": "enforce", "entries": [
            {"window": "monthly", "models": [1, 0], "principals": [0], "threshold_nano": 100,
             "actions": [{"type": "block"}]}]}]);
        let snapshot = Snapshot::from_msgpack(&encode(&cfg), PEPPER).unwrap();
        let entry = &snapshot.rules.rules[0].entries[0];
        assert_eq!(entry.scope, Scope::Models(vec![0, 1]));
        assert!(entry.covers(0) && entry.covers(1) && !entry.covers(2));
        assert!(entry.matches(&snapshot, 0) && !entry.matches(&snapshot, 1));
        let path = std::env::temp_dir().join(format!("meshfast-rules-models-{}.seg", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let segment = Segment::create(&path, 4096, 256, 8).unwrap();
        let month = CalendarWindow::Monthly.period(Tz::UTC, NOW);
        let grant = |p: u32, m: u32| {
            snapshot
                .grants
                .iter()
                .position(|g| g.principal == p && g.model == m)
                .unwrap() as u32
        };
        segment
            .add(
                snapshot.pair_key(&snapshot.grants[grant(0, 0) as usize], shm::WINDOW_MONTH, month),
                60,
            )
            .unwrap();
        let d = decide(&snapshot, &segment, 0, grant(0, 1), 30, NOW, 0);
        assert!(d.refusal.is_none(), "60 + 30 fits under 100");
        for lease in &d.leases {
            segment.release(lease);
        }
        segment
            .add(
                snapshot.pair_key(&snapshot.grants[grant(0, 1) as usize], shm::WINDOW_MONTH, month),
                40,
            )
            .unwrap();
        let d = decide(&snapshot, &segment, 0, grant(0, 1), 1, NOW, 0);
        assert!(
            matches!(&d.refusal, Some(Refusal::Block { rule, .. }) if rule == "pilot:p"),
            "spend on both models counts: {d:?}"
        );
        let d = decide(&snapshot, &segment, 1, grant(1, 0), 1_000, NOW, 0);
        assert!(d.refusal.is_none(), "not a listed principal");
        let _ = std::fs::remove_file(&path);

        cfg["rules"][0]["entries"][0]["model"] = json!(0);
        assert!(
            Snapshot::from_msgpack(&encode(&cfg), PEPPER).is_err(),
            "one scope kind per entry"
        );
    }

    /// A pause begins once per person and window instance and lifts itself; a notification fires
    /// once per instance; both start afresh in the next instance (one slot each per person and
    /// entry, whatever the instance).
    #[test]
    fn pauses_and_notifications_are_once_per_window_instance() {
        let mut cfg = config();
        cfg["grants"][0]["daily_cap_nano_usd"] = json!(0);
        cfg["grants"][0]["always_open"] = json!(true);
        cfg["rules"] = json!([{"id": "day-pause", "weight": 1, "mode": "enforce", "entries": [
            {"window": "daily", "model": 0, "threshold_nano": 100,
             "actions": [{"type": "pause", "hours": 1}, {"type": "notify", "channels": ["webhook"]}]}]}]);
        let snapshot = Snapshot::from_msgpack(&encode(&cfg), PEPPER).unwrap();
        let path = std::env::temp_dir().join(format!("meshfast-rules-once-{}.seg", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let segment = Segment::create(&path, 4096, 256, 8).unwrap();
        let day = |t: i64| CalendarWindow::Daily.period(Tz::UTC, t);
        let spend = |t: i64, v: i64| {
            segment
                .add(snapshot.pair_key(&snapshot.grants[0], shm::WINDOW_DAY, day(t)), v)
                .unwrap();
        };
        let hour = 3_600_000;
        let decide_at = |t: i64| decide(&snapshot, &segment, 0, 0, 0, t, 0);

        spend(NOW, 150);
        let first = decide_at(NOW);
        assert!(matches!(first.refusal, Some(Refusal::Pause { resume_at_ms, .. }) if resume_at_ms == NOW + hour));
        assert_eq!(first.events.iter().map(|e| e.action).collect::<Vec<_>>(), ["pause"]);
        let again = decide_at(NOW + hour / 2);
        assert!(matches!(again.refusal, Some(Refusal::Pause { .. })) && again.events.is_empty());
        let lifted = decide_at(NOW + 2 * hour);
        assert!(
            lifted.refusal.is_none() && lifted.events.is_empty(),
            "once per window: {lifted:?}"
        );
        let fired: Vec<_> = lifted.watches.iter().flat_map(|w| w.check(&segment)).collect();
        assert_eq!(fired.len(), 1);
        let later = decide_at(NOW + 3 * hour);
        assert!(
            later.watches.iter().all(|w| w.check(&segment).is_empty()),
            "notified once per window"
        );

        // The next day: under the threshold, nothing; over it, a new pause and a new notification.
        let tomorrow = NOW + 24 * hour;
        assert!(decide_at(tomorrow).refusal.is_none());
        spend(tomorrow, 100);
        let next = decide_at(tomorrow);
        assert!(matches!(next.refusal, Some(Refusal::Pause { .. })));
        assert_eq!(next.events.len(), 1);
        let next_window = CalendarWindow::Daily.bounds(Tz::UTC, day(tomorrow)).0;
        assert_eq!(next.events[0].window_start_ms, next_window);
        let watch_later = decide_at(tomorrow + 2 * hour);
        let fired: Vec<_> = watch_later.watches.iter().flat_map(|w| w.check(&segment)).collect();
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].window_start_ms, next_window);
        let _ = std::fs::remove_file(&path);
    }
}
