//! One failover: an admitted call switched to the model's next deployment (rendered at the
//! decision, see `render`), within that provider's hourly quota and under its limits. After it,
//! the call is the fallback's: its upstream call, provider and locality.

use std::sync::atomic::Ordering;

use super::{Fallback, Prepared, Upstream};
use crate::shm;

impl Prepared {
    /// Switches the call to the model's next deployment, once: false when the call was denied,
    /// there is no fallback (none, or it cannot take this call), its provider's hourly quota is
    /// spent, or the call already failed over. True: the caller must admit the call again (its
    /// provider's limits changed; the holds now take the fallback provider's).
    pub fn failover(&self) -> bool {
        let Some(fallback) = &self.fallback else {
            return false;
        };
        if self.upstream.is_none() || self.failed_over.load(Ordering::Acquire) || !fallback.admit() {
            return false;
        }
        // The failover is admitted anew, by its own provider's limits (the caller awaits that).
        if let Some(holds) = &self.holds {
            holds.switch_provider(fallback.limits);
        }
        self.failed_over.store(true, Ordering::Release);
        true
    }

    /// The fallback once the call failed over to it.
    #[must_use]
    pub fn failed_over_to(&self) -> Option<&Fallback> {
        self.fallback
            .as_ref()
            .filter(|_| self.failed_over.load(Ordering::Acquire))
    }

    /// The upstream call in force: the first deployment's, or the fallback's after a failover;
    /// `None` for a denial.
    #[must_use]
    pub fn active(&self) -> Option<&Upstream> {
        self.failed_over_to()
            .map_or(self.upstream.as_ref(), |f| Some(&f.upstream))
    }

    /// The provider in force (the fallback's after a failover).
    #[must_use]
    pub fn active_provider_id(&self) -> Option<&str> {
        self.failed_over_to()
            .map_or(self.provider_id.as_deref(), |f| Some(&f.provider_id))
    }

    /// Whether the provider in force is local (the fallback's after a failover).
    #[must_use]
    pub fn active_local(&self) -> bool {
        self.failed_over_to().map_or(self.local, |f| f.local)
    }
}

impl Fallback {
    /// Counts the failover call against its provider's hourly quota. False, with nothing
    /// counted, when that quota is spent or the counter table is full.
    #[must_use]
    pub fn admit(&self) -> bool {
        let Some(segment) = &self.segment else { return true };
        // In a cluster, within what this instance declared of the quota (no lease is asked for:
        // the failover is skipped instead).
        let mode = shm::cluster_mode(segment);
        let ceiling = match self.max_calls_per_hour.filter(|&max| max > 0) {
            Some(max) if mode != 0 => max.min(segment.get(shm::ceiling_key(self.calls_key, mode))),
            Some(max) => max,
            None => i64::MAX,
        };
        match segment.add(self.calls_key, 1) {
            Ok(calls) if calls <= ceiling => true,
            Ok(_) => {
                // NOTE: an add of -1 to a counter that exists cannot fail for want of a slot.
                let _ = segment.add(self.calls_key, -1);
                false
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{prepare, Route};
    use crate::snapshot::test_support::*;
    use crate::snapshot::Snapshot;
    use crate::translate::Format;
    use serde_json::json;

    #[test]
    fn test_the_next_deployment_is_rendered_for_one_failover_within_its_provider_quota() {
        let mut config = config();
        config["providers"].as_array_mut().unwrap().push(json!(
            {"id": "77777777-7777-7777-7777-777777777777", "name": "claude", "family": "anthropic",
             "max_calls_per_hour": 1, "base_url": "http://claude", "api_key": "sk-claude", "local": true}));
        config["models"][0]["deployments"] =
            json!([{"id": "d1", "provider": 1, "resolved_model": "claude-x", "priority": 5}]);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let (path, seg) = segment("fallback");
        let p = prepare(&s, Some(&seg), &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        let fallback = p.fallback.as_ref().unwrap();
        assert_eq!(
            (fallback.provider_id.as_str(), fallback.local),
            ("77777777-7777-7777-7777-777777777777", true)
        );
        assert_eq!(fallback.upstream.url, "http://claude/v1/messages");
        let sent: serde_json::Value = serde_json::from_slice(&fallback.upstream.body).unwrap();
        assert_eq!(sent["model"], "claude-x");
        assert!(fallback.admit(), "the first failover this hour fits the quota of 1");
        assert!(!fallback.admit(), "the second does not, and is not counted");
        let chat = br#"{"model":"gpt-b","messages":[{"role":"user","content":"hi"}]}"#;
        let p = prepare(&s, None, &req(Route::Entry(Format::OpenAiChat), "", chat));
        let plan = p.fallback.as_ref().unwrap().upstream.entry.as_ref().unwrap();
        assert_eq!(
            (plan.entry, plan.upstream),
            (Format::OpenAiChat, Format::Anthropic),
            "translated for the deployment"
        );
        let p = prepare(
            &s,
            None,
            &req(Route::Generate, "model=gpt-a-image", br#"{"prompt":"cat"}"#),
        );
        assert!(p.fallback.is_none(), "no deployments, no fallback");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_failover_switches_the_call_once_within_the_quota_and_under_the_fallbacks_limits() {
        let mut config = config();
        config["providers"][0]["max_concurrent_upstream"] = json!(1);
        config["providers"].as_array_mut().unwrap().push(json!(
            {"id": "77777777-7777-7777-7777-777777777777", "name": "claude", "family": "anthropic",
             "max_calls_per_hour": 1, "max_concurrent_upstream": 1, "base_url": "http://claude",
             "api_key": "sk-claude", "local": true}));
        config["models"][0]["deployments"] =
            json!([{"id": "d1", "provider": 1, "resolved_model": "claude-x", "priority": 5}]);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let (path, seg) = segment("failover");
        let call = || prepare(&s, Some(&seg), &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        let (a, b) = (call(), call());
        let first = "33333333-3333-3333-3333-333333333333";
        let second = "77777777-7777-7777-7777-777777777777";
        assert_eq!(
            (
                a.active().unwrap().url.as_str(),
                a.active_provider_id(),
                a.active_local()
            ),
            ("/v1/chat/completions", Some(first), false),
            "before a failover the call is the first deployment's"
        );
        assert!(a.failed_over_to().is_none());
        let holds = a.holds.as_ref().unwrap();
        assert_eq!(holds.admit_provider(1, 0, 0).unwrap(), (true, 0));

        assert!(a.failover(), "the fallback takes the call");
        assert_eq!(
            (
                a.active().unwrap().url.as_str(),
                a.active_provider_id(),
                a.active_local()
            ),
            ("http://claude/v1/messages", Some(second), true),
            "after it the call is the fallback's"
        );
        assert_eq!(a.failed_over_to().unwrap().provider_id, second);
        assert_eq!(
            (a.upstream.as_ref().unwrap().url.as_str(), a.provider_id.as_deref()),
            ("/v1/chat/completions", Some(first)),
            "the decision itself is kept"
        );
        assert!(!a.failover(), "once only");
        // The first provider's slot went back (b takes it); a is admitted anew by the fallback's.
        assert_eq!(b.holds.as_ref().unwrap().admit_provider(1, 0, 0).unwrap(), (true, 0));
        assert_eq!(holds.admit_provider(1, 0, 0).unwrap(), (true, 0));

        assert!(!b.failover(), "the fallback's hourly quota of 1 is spent");
        assert_eq!(b.active_provider_id(), Some(first), "b stays on its first deployment");
        let calls_key = s.providers[1].calls_key.at(crate::shm::utc_hour(NOON_WED));
        assert_eq!(seg.get(calls_key), 1, "the refused failover is not counted");

        let mut r = req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#);
        r.authorization = None;
        let denied = prepare(&s, Some(&seg), &r);
        assert!(
            !denied.failover() && denied.active().is_none(),
            "a denial has no call to switch"
        );
        let p = prepare(
            &s,
            None,
            &req(Route::Generate, "model=gpt-a-image", br#"{"prompt":"cat"}"#),
        );
        assert!(!p.failover(), "no deployments, no failover");
        assert_eq!(p.active().unwrap().url, p.upstream.as_ref().unwrap().url);
        drop((a, b));
        assert_eq!(seg.stats().leases_held, 0, "every slot is back");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_a_failover_gives_back_its_first_providers_slot_and_waits_for_its_own() {
        let mut config = config();
        config["providers"][0]["max_concurrent_upstream"] = json!(1);
        config["providers"].as_array_mut().unwrap().push(json!(
            {"id": "77777777-7777-7777-7777-777777777777", "name": "claude", "family": "anthropic",
             "max_concurrent_upstream": 1, "base_url": "http://claude", "api_key": "sk-claude", "local": true}));
        config["models"][0]["deployments"] =
            json!([{"id": "d1", "provider": 1, "resolved_model": "claude-x", "priority": 5}]);
        let s = Snapshot::from_msgpack(&encode(&config), PEPPER).unwrap();
        let (path, seg) = segment("failover-slots");
        let call = || prepare(&s, Some(&seg), &req(Route::Proxy, "model=gpt-b", br#"{"query":"a"}"#));
        let (a, b, c) = (call(), call(), call());
        let (ha, hb, hc) = (
            a.holds.as_ref().unwrap(),
            b.holds.as_ref().unwrap(),
            c.holds.as_ref().unwrap(),
        );
        let slot = crate::govern::SLOT_POLL_NS;
        assert_eq!(ha.admit_provider(1, 0, 0).unwrap(), (true, 0));
        assert_eq!(
            hb.admit_provider(1, 0, 0).unwrap(),
            (false, slot),
            "the first provider's one slot is a's"
        );
        // b fails over first and takes the second provider's one slot.
        hb.switch_provider(b.fallback.as_ref().unwrap().limits);
        assert_eq!(hb.admit_provider(1, 0, 0).unwrap(), (true, 0));
        // a fails over: its first slot goes back at once (c gets it), and it waits for b's.
        ha.switch_provider(a.fallback.as_ref().unwrap().limits);
        assert_eq!(
            hc.admit_provider(1, 0, 0).unwrap(),
            (true, 0),
            "a gave the first provider's slot back"
        );
        assert_eq!(
            ha.admit_provider(1, 0, 0).unwrap(),
            (false, slot),
            "the failover waits for its own provider"
        );
        hb.release_provider();
        assert_eq!(ha.admit_provider(1, 0, 0).unwrap(), (true, 0));
        drop((a, b, c));
        assert_eq!(seg.stats().leases_held, 0, "every slot is back");
        std::fs::remove_file(path).unwrap();
    }
}
