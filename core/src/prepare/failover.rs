//! One failover: an admitted call switched to the model's next deployment (rendered at the
//! decision, see `render`), within that provider's hourly quota and under its limits.

use super::Fallback;
use crate::shm;

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
