//! JSON bodies for `GET /v1/models` and `GET /v1/usage`, written by hand into one buffer.

use crate::json::{write_fixed, write_int, write_str, write_time, write_usd};
use crate::policy::{self, counters, Counters, Status};
use crate::shm::CounterRead;
use crate::snapshot::{Grant, Model, ModelKind, Provider, Snapshot};

/// The 401 body for a missing, unknown, revoked or expired key.
pub const UNAUTHORIZED_BODY: &[u8] = b"{\"error\":\"invalid_or_revoked_key\"}\n";

/// Appends `used / limit` as a percentage with up to 2 decimals (rounded down); a limit of 0
/// or less reads as fully used.
fn write_percent(out: &mut Vec<u8>, used: i64, limit: i64) {
    let hundredths = if limit <= 0 {
        10_000
    } else {
        i128::from(used.max(0)) * 10_000 / i128::from(limit)
    };
    write_fixed(out, hundredths, 2);
}

fn write_hhmm(out: &mut Vec<u8>, minute: u16) {
    let (h, m) = (minute / 60, minute % 60);
    out.extend_from_slice(&[
        b'"',
        b'0' + (h / 10) as u8,
        b'0' + (h % 10) as u8,
        b':',
        b'0' + (m / 10) as u8,
        b'0' + (m % 10) as u8,
        b'"',
    ]);
}

fn write_opt_int(out: &mut Vec<u8>, value: Option<i64>) {
    match value {
        Some(v) => write_int(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_cap(out: &mut Vec<u8>, cap_nano: i64) {
    if cap_nano > 0 {
        write_usd(out, cap_nano);
    } else {
        out.extend_from_slice(b"null");
    }
}

fn kind_name(kind: ModelKind) -> &'static str {
    match kind {
        ModelKind::Chat => "chat",
        ModelKind::Embedding => "embedding",
        ModelKind::ImageGeneration | ModelKind::VideoGeneration => "generation",
    }
}

fn write_model_entry(out: &mut Vec<u8>, grant: &Grant, model: &Model, provider: &Provider, c: &Counters, now_ms: i64) {
    let (status, resume_at) = policy::status(grant, provider, c, now_ms);
    out.extend_from_slice(b"{\"model\":");
    write_str(out, &model.name);
    out.extend_from_slice(b",\"kind\":\"");
    out.extend_from_slice(kind_name(model.kind).as_bytes());
    out.extend_from_slice(b"\",\"formats_accepted\":[\"text\"");
    for (flag, name) in [
        (model.supports_image_in, ",\"image\""),
        (model.supports_document_in, ",\"document\""),
        (model.supports_audio_in, ",\"audio\""),
        (model.supports_video_in, ",\"video\""),
    ] {
        if flag {
            out.extend_from_slice(name.as_bytes());
        }
    }
    out.extend_from_slice(b"],\"web_search\":");
    out.extend_from_slice(if model.supports_web_search && provider.supports_web_search {
        b"true"
    } else {
        b"false"
    });
    if !model.tags.is_empty() {
        out.extend_from_slice(b",\"tags\":[");
        for (i, tag) in model.tags.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_str(out, tag);
        }
        out.push(b']');
    }
    out.extend_from_slice(b",\"status\":\"");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b"\",\"usage\":{\"calls_this_hour\":");
    write_int(out, c.calls_this_hour);
    out.extend_from_slice(b",\"calls_per_hour_limit\":");
    write_opt_int(out, grant.max_calls_per_hour);
    out.extend_from_slice(b",\"spent_today_usd\":");
    write_usd(out, c.spent_today_nano);
    out.extend_from_slice(b",\"daily_cap_usd\":");
    write_cap(out, grant.daily_cap_nano_usd);
    out.push(b'}');
    if let Some(media_type) = &model.output_media_type {
        out.extend_from_slice(b",\"output_media_type\":");
        write_str(out, media_type);
    }
    if let (Status::RateLimited | Status::OutsideHours | Status::BudgetExceeded, Some(at)) = (status, resume_at) {
        out.extend_from_slice(b",\"resume_at\":");
        write_time(out, at);
    }
    if let (false, Some(window)) = (grant.always_open, grant.window) {
        out.extend_from_slice(b",\"allowed_hours\":{\"from\":");
        write_hhmm(out, window.from_min);
        out.extend_from_slice(b",\"to\":");
        write_hhmm(out, window.to_min);
        out.extend_from_slice(b",\"timezone\":");
        write_str(out, grant.timezone.name());
        out.extend_from_slice(b",\"days\":[");
        let days = (0..7u8).filter(|d| grant.active_days & (1 << d) != 0);
        for (i, day) in days.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'0' + day);
        }
        out.extend_from_slice(b"]}");
    }
    out.push(b'}');
}

/// The `/v1/models` body for `principal`: OpenAI's `data` list and Mesh's `models` list.
#[must_use]
pub fn models_json(snapshot: &Snapshot, principal: u32, segment: &impl CounterRead, now_ms: i64) -> Vec<u8> {
    models_json_of(snapshot, principal, None, segment, now_ms)
}

/// [`models_json`] for a key limited to `only` (sorted model indexes; `None`: no limit).
#[must_use]
pub fn models_json_of(
    snapshot: &Snapshot,
    principal: u32,
    only: Option<&[u32]>,
    segment: &impl CounterRead,
    now_ms: i64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
    let visible = || snapshot.visible_grants_within(principal, only);
    for (i, (_, model, provider)) in visible().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":");
        write_str(&mut out, &model.name);
        out.extend_from_slice(b",\"object\":\"model\",\"created\":");
        write_int(&mut out, model.created_ms.div_euclid(1000));
        out.extend_from_slice(b",\"owned_by\":");
        write_str(&mut out, &provider.name);
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"models\":[");
    for (i, (grant, model, provider)) in visible().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let c = counters(grant, provider, segment, now_ms);
        write_model_entry(&mut out, grant, model, provider, &c, now_ms);
    }
    out.extend_from_slice(b"]}");
    out
}

fn write_limit(out: &mut Vec<u8>, id: &str, used: i64, limit: i64, reset_ms: i64) {
    out.extend_from_slice(b",{\"id\":\"");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\",\"utilization\":");
    write_percent(out, used, limit);
    out.extend_from_slice(b",\"reset\":");
    write_time(out, reset_ms);
    out.push(b'}');
}

/// The `/v1/usage` body for `principal`: spend, cap and limit utilisation per visible model.
#[must_use]
pub fn usage_json(snapshot: &Snapshot, principal: u32, segment: &impl CounterRead, now_ms: i64) -> Vec<u8> {
    usage_json_of(snapshot, principal, None, segment, now_ms)
}

/// [`usage_json`] for a key limited to `only` (sorted model indexes; `None`: no limit): the
/// models outside it are not shown to it.
#[must_use]
pub fn usage_json_of(
    snapshot: &Snapshot,
    principal: u32,
    only: Option<&[u32]>,
    segment: &impl CounterRead,
    now_ms: i64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(b"{\"usage\":[");
    for (i, (grant, model, provider)) in snapshot.visible_grants_within(principal, only).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let c = counters(grant, provider, segment, now_ms);
        let cap = grant.daily_cap_nano_usd;
        out.extend_from_slice(b"{\"model\":");
        write_str(&mut out, &model.name);
        out.extend_from_slice(b",\"kind\":\"");
        out.extend_from_slice(kind_name(model.kind).as_bytes());
        out.extend_from_slice(b"\",\"spent_usd\":");
        write_usd(&mut out, c.spent_today_nano);
        out.extend_from_slice(b",\"daily_cap_usd\":");
        write_cap(&mut out, cap);
        out.extend_from_slice(b",\"remaining_usd\":");
        if cap > 0 {
            write_usd(&mut out, (cap - c.spent_today_nano).max(0));
        } else {
            out.extend_from_slice(b"null");
        }
        out.extend_from_slice(b",\"limits\":[");
        let start = out.len();
        if cap > 0 {
            write_limit(
                &mut out,
                "policy.daily_usd",
                c.spent_today_nano,
                cap,
                policy::next_utc_midnight(now_ms),
            );
        }
        if let Some(limit) = grant.max_calls_per_hour {
            write_limit(
                &mut out,
                "policy.hourly_calls",
                c.calls_this_hour,
                limit,
                policy::next_utc_hour(now_ms),
            );
        }
        if let Some(limit) = provider.max_calls_per_hour {
            write_limit(
                &mut out,
                "provider.hourly_calls",
                c.provider_calls_this_hour,
                limit,
                policy::next_utc_hour(now_ms),
            );
        }
        if out.len() > start {
            out.remove(start); // the first limit's leading comma
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b"],");
    crate::rules::usage_rules_json(&mut out, snapshot, principal, segment, now_ms);
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::{utc_day, utc_hour, Segment};
    use crate::snapshot::test_support::snapshot;
    use serde_json::{json, Value};

    const NOON_WEDNESDAY: i64 = 1_741_176_000_000; // 2025-03-05T12:00:00Z

    #[test]
    fn test_models_json_lists_both_shapes_sorted_with_status() {
        let snapshot = snapshot();
        let body: Value = serde_json::from_slice(&models_json(&snapshot, 0, &(), NOON_WEDNESDAY)).unwrap();
        assert_eq!(body["object"], "list");
        assert_eq!(
            body["data"][0],
            json!({"id": "gpt-a-image", "object": "model", "created": 1_700_000_001, "owned_by": "openai"})
        );
        assert_eq!(body["data"].as_array().unwrap().len(), 2);
        let image = &body["models"][0];
        assert_eq!(image["kind"], "generation");
        assert_eq!(image["output_media_type"], "image/png");
        assert!(image.get("allowed_hours").is_none() && image.get("resume_at").is_none());
        let chat = &body["models"][1];
        assert_eq!(chat["formats_accepted"], json!(["text", "image"]));
        assert_eq!(chat["web_search"], true);
        assert_eq!(chat["status"], "available");
        assert_eq!(
            chat["usage"],
            json!({"calls_this_hour": 0, "calls_per_hour_limit": 100, "spent_today_usd": 0, "daily_cap_usd": 2.5})
        );
        assert_eq!(
            chat["allowed_hours"],
            json!({"from": "09:00", "to": "17:00", "timezone": "Europe/Paris", "days": [1, 2, 3, 4, 5]})
        );
    }

    #[test]
    fn test_counters_from_segment_drive_status_and_usage() {
        let path = std::env::temp_dir().join(format!("meshfast-views-{}", std::process::id()));
        let segment = Segment::create(&path, 64, 4, 4).unwrap();
        let snapshot = snapshot();
        let grant = &snapshot.grants[0];
        segment
            .add(grant.spend_key.at(utc_day(NOON_WEDNESDAY)), 2_500_000_000)
            .unwrap();
        segment.add(grant.calls_key.at(utc_hour(NOON_WEDNESDAY)), 42).unwrap();
        let body: Value = serde_json::from_slice(&models_json(&snapshot, 0, &segment, NOON_WEDNESDAY)).unwrap();
        assert_eq!(body["models"][1]["status"], "budget_exceeded");
        assert_eq!(body["models"][1]["resume_at"], "2025-03-06T00:00:00Z");
        let usage: Value = serde_json::from_slice(&usage_json(&snapshot, 0, &segment, NOON_WEDNESDAY)).unwrap();
        assert_eq!(
            usage["usage"][0]["limits"],
            json!([{"id": "provider.hourly_calls", "utilization": 0, "reset": "2025-03-05T13:00:00Z"}])
        );
        assert_eq!(usage["usage"][1]["spent_usd"], 2.5);
        assert_eq!(usage["usage"][1]["remaining_usd"], 0);
        assert_eq!(usage["usage"][1]["limits"][0]["utilization"], 100);
        assert_eq!(
            usage["usage"][1]["limits"][1],
            json!({"id": "policy.hourly_calls", "utilization": 42, "reset": "2025-03-05T13:00:00Z"})
        );
        std::fs::remove_file(path).unwrap();
    }
}
