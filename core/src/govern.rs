//! What an admitted call holds in the shared segment while it runs (ARCHITECTURE "The request
//! path" steps 3-5): its budget reservation, its provider's concurrency slot and its share of the
//! process-wide admission weight. Each is a lease (see [`crate::shm`]), so a killed worker's holds
//! are reclaimed by the supervisor; a live one's are released by [`Holds::settle`],
//! [`Holds::release_provider`] or, failing both, on drop.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::Result;
use crate::shm::{self, sum, Lease, Segment};

/// How long a call refused a concurrency slot waits before trying again (no release time is
/// known; a release in the same process wakes it earlier, in Python).
pub const SLOT_POLL_NS: i64 = 5_000_000;

/// A lease to ask for: the counter at `key` of `kind` (a daily spend in nano-USD, period the UTC
/// day; an hourly call count, period the UTC hour), at least `need`, under the cap `cap`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseWant {
    /// [`shm::SPEND_DAY`], [`shm::CALLS_HOUR`], [`shm::PROVIDER_CALLS_HOUR`], [`shm::RULE_OWN`],
    /// [`shm::RULE_MINUTE_CALLS`] or [`shm::RULE_MINUTE_TOKENS`].
    pub kind: u8,
    pub key: u128,
    pub period: u32,
    pub need: i64,
    pub cap: i64,
    /// A rule entry's committed spend in scope and window (a new allowance starts there).
    pub base: i64,
    /// When the window ended (unix ms): the allowance is dropped after.
    pub expires_ms: i64,
    /// A rule threshold's models in scope the principal holds grants to (ids) and the window's
    /// days; for a workflow's budget ([`crate::shm::WORKFLOW_SPEND`]), the workflow's uid alone
    /// (the database's first count of it is its checkpointed spend).
    /// first and last local days (days since 1970-01-01): the database's spend there is the base.
    pub models: Vec<String>,
    pub from_day: i32,
    pub to_day: i32,
}

impl LeaseWant {
    /// A slice of a cap without a base of its own (the database's counter is the base, or none).
    #[must_use]
    pub fn count(kind: u8, key: u128, period: u32, need: i64, cap: i64, expires_ms: i64) -> Self {
        Self {
            kind,
            key,
            period,
            need,
            cap,
            base: 0,
            expires_ms,
            models: Vec::new(),
            from_day: 0,
            to_day: 0,
        }
    }
}

/// What a rule did to a person (a row's event; the `rule_events` outbox's natural key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub rule_id: String,
    pub entry: u32,
    /// `notify` or `pause`.
    pub action: &'static str,
    /// `webhook` or `email` for `notify`; empty for `pause`.
    pub channel: &'static str,
    pub window: &'static str,
    pub window_start_ms: i64,
    pub threshold_nano: i64,
    pub spend_nano: i64,
    /// JSON object text.
    pub detail: String,
}

/// A notify entry to check once the call settled: fires when the spend in scope is at or over
/// the threshold and nobody fired it in this window instance yet.
///
/// The flag is one slot per person and entry (whatever the window), holding `window start + 1`
/// of the last instance it fired in: the table does not grow a key per window instance.
#[derive(Clone, Debug)]
pub struct Watch {
    pub(crate) keys: Vec<u128>,
    pub(crate) flag: u128,
    pub(crate) window_start: i64,
    pub(crate) threshold: i64,
    /// The events to emit, spend filled in when fired.
    pub(crate) events: Vec<Event>,
}

impl Watch {
    /// The events, once, when the spend in scope reached the threshold.
    #[must_use]
    pub fn check(&self, segment: &Segment) -> Vec<Event> {
        let spend = sum(segment, &self.keys);
        self.fire(segment, spend)
    }

    pub(crate) fn fire(&self, segment: &Segment, spend: i64) -> Vec<Event> {
        let mark = self.window_start.saturating_add(1);
        let before = segment.get(self.flag);
        if spend < self.threshold
            || before >= mark
            || !matches!(segment.replace(self.flag, before, mark), Ok(b) if b == before)
        {
            return Vec::new();
        }
        self.events
            .iter()
            .map(|e| Event {
                spend_nano: spend,
                ..e.clone()
            })
            .collect()
    }
}

/// A provider's shared-memory limits, resolved from the snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProviderLimits {
    /// [`shm::PROVIDER_INFLIGHT`] key and cap (`max_concurrent_upstream`), when set.
    pub slots: Option<(u128, i64)>,
    /// [`shm::PROVIDER_RATE`] key, emission interval (ns) and burst (`max_outbound_rps`), when set.
    pub rate: Option<(u128, i64, i64)>,
    /// Key of the provider's held admission weight (a [`shm::PROVIDER_INFLIGHT`] key, period 1)
    /// and its share of the process-wide capacity in percent, when set.
    pub share: Option<(u128, i64)>,
}

impl ProviderLimits {
    /// The limits of the provider with id bytes `provider_id`; non-positive values mean none.
    #[must_use]
    pub fn new(
        provider_id: &[u8; 16],
        max_concurrent_upstream: Option<i64>,
        max_outbound_rps: Option<i64>,
        admission_share_pct: Option<i64>,
    ) -> Self {
        let key = |kind| shm::counter_key(kind, &[0; 16], provider_id, 0);
        Self {
            share: admission_share_pct
                .filter(|&pct| (1..100).contains(&pct))
                .map(|pct| (shm::counter_key(shm::PROVIDER_INFLIGHT, &[0; 16], provider_id, 1), pct)),
            slots: max_concurrent_upstream
                .filter(|&n| n > 0)
                .map(|n| (key(shm::PROVIDER_INFLIGHT), n)),
            rate: max_outbound_rps
                .filter(|&n| n > 0)
                .map(|n| (key(shm::PROVIDER_RATE), 1_000_000_000 / n.min(1_000_000_000), n)),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// The limits `admit_provider` takes: the first provider's, a failover's after `switch_provider`.
    provider: ProviderLimits,
    budget: Option<Lease>,
    /// The reservation against a registered workflow's budget, settled with the cost.
    workflow: Option<Lease>,
    provider_slot: Option<Lease>,
    provider_share: Option<Lease>,
    provider_admitted: bool,
    global: Option<Lease>,
    settled: bool,
    /// Spend-rule pool reservations, given back after the cost is committed.
    rule_leases: Vec<Lease>,
    /// In a cluster, reservations on this instance's own counters under rule entries' slices,
    /// settled with the cost.
    rule_own: Vec<Lease>,
    /// In a cluster, per-minute token counters of rule entries the call's tokens go to.
    minute_tokens: Vec<u128>,
    /// Committed-spend counters (the rules' calendar windows) the cost goes to.
    charges: Vec<u128>,
    /// Rules' per-minute token buckets the call's tokens go to: `(key, ns per token)`.
    token_keys: Vec<(u128, i64)>,
    watches: Vec<Watch>,
    /// Notifications that fired when the call settled.
    fired: Vec<Event>,
}

/// The holds of one call; every method is idempotent and safe from any thread.
pub struct Holds {
    segment: Option<Arc<Segment>>,
    /// The [`shm::SPEND_DAY`] counter the call's cost goes to.
    spend_key: u128,
    /// The call's admission weight before the load factor.
    weight: u32,
    state: Mutex<State>,
}

impl Holds {
    /// Holds nothing yet; costs go to `spend_key` in `segment` (nowhere without one).
    #[must_use]
    pub fn new(segment: Option<Arc<Segment>>, spend_key: u128, provider: ProviderLimits, weight: u32) -> Self {
        Self {
            segment,
            spend_key,
            weight,
            state: Mutex::new(State {
                provider,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // NOTE: no code panics while holding the lock; a poisoned one still has a valid state.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `lease` as the call's budget reservation.
    pub fn hold_budget(&self, lease: Lease) {
        self.state().budget = Some(lease);
    }

    /// Keeps `lease` as the call's reservation against its workflow's budget.
    pub fn hold_workflow(&self, lease: Lease) {
        self.state().workflow = Some(lease);
    }

    /// Keeps the spend rules' part of the call: pool reservations, the counters its cost and
    /// tokens go to, and the notifications to check once it settled.
    pub fn hold_rules(
        &self,
        leases: Vec<Lease>,
        own: Vec<Lease>,
        charges: Vec<u128>,
        token_keys: Vec<(u128, i64)>,
        watches: Vec<Watch>,
    ) {
        let mut state = self.state();
        state.rule_leases = leases;
        state.rule_own = own;
        state.charges = charges;
        state.token_keys = token_keys;
        state.watches = watches;
    }

    /// In a cluster, the per-minute token counters the call's tokens go to.
    pub fn hold_minute_tokens(&self, keys: Vec<u128>) {
        self.state().minute_tokens = keys;
    }

    /// Notifications that fired when the call settled (taken once).
    pub fn take_fired(&self) -> Vec<Event> {
        std::mem::take(&mut self.state().fired)
    }

    /// The budget reservation's amount, 0 when none.
    #[must_use]
    pub fn reserved_nano(&self) -> i64 {
        self.state().budget.map_or(0, |lease| lease.amount)
    }

    /// Provider admission at `now_ns`: a concurrency slot first, then the token bucket; 0 when
    /// admitted (or already), else the nanoseconds to wait, holding nothing. Table full: error.
    ///
    /// `capacity` is the process-wide admission capacity: a provider with a share may hold at
    /// most that percentage of it (its calls' base weights) at once.
    ///
    /// With `max_wait_ns > 0` a token that would come within that wait is taken at once, in line:
    /// the answer `(true, wait)` means admitted, start after `wait` ns. `(false, wait)` means not
    /// admitted (no slot free, or the token is further away), holding nothing.
    pub fn admit_provider(&self, now_ns: i64, max_wait_ns: i64, capacity: i64) -> Result<(bool, i64)> {
        let Some(segment) = self.segment.as_deref() else {
            return Ok((true, 0));
        };
        let mut state = self.state();
        if state.provider_admitted {
            return Ok((true, 0));
        }
        if state.settled {
            return Err(crate::error::Error::InvalidArgument(
                "the call is already settled".into(),
            ));
        }
        let limits = state.provider;
        // In a cluster the instance uses its share of each limit (ARCHITECTURE "several hosts").
        let mode = shm::cluster_mode(segment);
        let share = |key: u128| match shm::cluster_state(mode) {
            0 => None,
            shm::CLUSTER_LEASED => Some(segment.get(shm::ceiling_key(key, mode))),
            _ => Some(0),
        };
        if let Some((key, cap)) = limits.slots {
            if state.provider_slot.is_none() {
                let held = share(key);
                match segment.reserve(key, 1, held.map_or(cap, |held| held.min(cap)))? {
                    Some(lease) => state.provider_slot = Some(lease),
                    None => {
                        if held.is_some() {
                            segment.add(shm::demand_key(key), 1)?;
                        }
                        return Ok((false, SLOT_POLL_NS));
                    }
                }
            }
        }
        if let Some((key, pct)) = limits.share {
            if state.provider_share.is_none() && capacity > 0 {
                let cap = (capacity.saturating_mul(pct) / 100).max(1);
                let weight = i64::from(self.weight).clamp(1, cap);
                match segment.reserve(key, weight, cap)? {
                    Some(lease) => state.provider_share = Some(lease),
                    None => {
                        if let Some(lease) = state.provider_slot.take() {
                            segment.release(&lease);
                        }
                        return Ok((false, SLOT_POLL_NS));
                    }
                }
            }
        }
        let mut start_after = 0;
        if let Some((key, interval, burst)) = limits.rate {
            // A share is in milli-requests per second; none held yet: wait for one.
            let leased = share(key);
            let (interval, burst) = match leased {
                None => (interval, burst),
                Some(milli) if milli > 0 => ((1_000_000_000_000 / milli).max(1), (milli / 1000).clamp(1, burst)),
                Some(_) => (i64::MAX / 4, 1),
            };
            if interval >= i64::MAX / 4 {
                segment.add(shm::demand_key(key), 1)?;
                for lease in [state.provider_slot.take(), state.provider_share.take()]
                    .into_iter()
                    .flatten()
                {
                    segment.release(&lease);
                }
                return Ok((false, SLOT_POLL_NS));
            }
            let reserved = segment.rate_reserve(key, interval, burst, now_ns, max_wait_ns.max(0));
            if leased.is_some() && !matches!(reserved, Ok(Ok(0))) {
                // Queued or refused: the share is too small for this instance's traffic.
                segment.add(shm::demand_key(key), 1)?;
            }
            match reserved {
                Ok(Ok(wait)) => start_after = wait,
                refused => {
                    for lease in [state.provider_slot.take(), state.provider_share.take()]
                        .into_iter()
                        .flatten()
                    {
                        segment.release(&lease);
                    }
                    return refused.map(|r| (false, r.unwrap_or_else(|wait| wait)));
                }
            }
        }
        state.provider_admitted = true;
        Ok((true, start_after))
    }

    /// Takes `weight × factor` (clamped to `[1, capacity]`) of the process-wide admission weight
    /// if it fits under `capacity`; true when held (or already). Table full: error.
    pub fn admit_global(&self, capacity: i64, factor: i64) -> Result<bool> {
        let Some(segment) = self.segment.as_deref() else {
            return Ok(true);
        };
        let mut state = self.state();
        if state.global.is_some() {
            return Ok(true);
        }
        if state.settled || capacity <= 0 {
            return Ok(false);
        }
        let weight = i64::from(self.weight).saturating_mul(factor.max(1)).clamp(1, capacity);
        let lease = segment.reserve(shm::global_inflight_key(), weight, capacity)?;
        let held = lease.is_some();
        state.global = lease;
        Ok(held)
    }

    /// Moves the call to another provider (a failover): gives back the first provider's slot and
    /// share, keeps the process-wide weight and the budget, and makes `limits` the ones the next
    /// [`Holds::admit_provider`] takes, so the failover waits for its own provider's slot and
    /// token like any call to it.
    pub fn switch_provider(&self, limits: ProviderLimits) {
        let mut state = self.state();
        if let Some(segment) = self.segment.as_deref() {
            for lease in [state.provider_slot.take(), state.provider_share.take()]
                .into_iter()
                .flatten()
            {
                segment.release(&lease);
            }
        }
        state.provider_admitted = false;
        state.provider = limits;
    }

    /// Gives back the provider slot and the admission weight (the upstream call ended); the
    /// budget reservation stays until [`Holds::settle`]. A later `admit_provider` admits anew.
    pub fn release_provider(&self) {
        let mut state = self.state();
        Self::release_provider_locked(self.segment.as_deref(), &mut state);
    }

    fn release_provider_locked(segment: Option<&Segment>, state: &mut State) {
        let Some(segment) = segment else {
            return;
        };
        for lease in [
            state.provider_slot.take(),
            state.provider_share.take(),
            state.global.take(),
        ]
        .into_iter()
        .flatten()
        {
            segment.release(&lease);
        }
        state.provider_admitted = false;
    }

    /// Turns the reservation into the `actual` cost (negative counts as 0), or adds `actual` to
    /// the spend counter when nothing was reserved, and releases everything else. True the first
    /// time; later calls do nothing and return false. Table full (unreserved call): error, and
    /// the call stays unsettled.
    pub fn settle(&self, actual_nano: i64) -> Result<bool> {
        self.settle_with_tokens(actual_nano, 0)
    }

    /// [`Holds::settle`], also counting `tokens` against the rules' per-minute token caps. The
    /// cost reaches the rules' committed counters before their pool reservations are given back
    /// (the order [`crate::rules`] relies on for no overshoot).
    pub fn settle_with_tokens(&self, actual_nano: i64, tokens: i64) -> Result<bool> {
        let mut state = self.state();
        if state.settled {
            return Ok(false);
        }
        let segment = self.segment.as_deref();
        if let Some(segment) = segment {
            // NOTE: an add to a full counter table is dropped; the table being full already
            // refuses new calls (fail closed), so no call runs on the missing amount.
            if actual_nano > 0 {
                for &key in &state.charges {
                    let _ = segment.add(key, actual_nano);
                }
            }
            if tokens > 0 {
                let now_ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
                for &(key, per_token) in &state.token_keys {
                    let _ = segment.advance(key, now_ns, tokens.saturating_mul(per_token));
                }
                for &key in &state.minute_tokens {
                    let _ = segment.add(key, tokens);
                }
            }
            for lease in std::mem::take(&mut state.rule_own)
                .into_iter()
                .chain(state.workflow.take())
            {
                segment.settle(&lease, actual_nano.max(0));
            }
            for lease in std::mem::take(&mut state.rule_leases) {
                segment.release(&lease);
            }
            let fired: Vec<Event> = state.watches.iter().flat_map(|w| w.check(segment)).collect();
            state.fired = fired;
            match state.budget.take() {
                Some(lease) => segment.settle(&lease, actual_nano.max(0)),
                None if actual_nano > 0 => {
                    segment.add(self.spend_key, actual_nano)?;
                }
                None => {}
            }
        }
        Self::release_provider_locked(segment, &mut state);
        state.settled = true;
        Ok(true)
    }

    /// Releases every hold without charging (a denial after the reservation, or a drop).
    pub fn release_all(&self) {
        let mut state = self.state();
        if let Some(segment) = self.segment.as_deref() {
            for lease in state
                .budget
                .take()
                .into_iter()
                .chain(std::mem::take(&mut state.rule_leases))
                .chain(std::mem::take(&mut state.rule_own))
                .chain(state.workflow.take())
            {
                segment.release(&lease);
            }
        }
        Self::release_provider_locked(self.segment.as_deref(), &mut state);
    }
}

impl std::fmt::Debug for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holds")
            .field("weight", &self.weight)
            .field("state", &*self.state())
            .finish_non_exhaustive()
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        self.release_all();
    }
}
