//! Fixed workloads of the core's hot functions, for instruction counting under callgrind
//! (`bench/instructions.py`): the inputs are constants, so the count of a build is deterministic
//! and a regression gate can be tight.
//!
//!     cargo run --release --example instructions -- <workload>

use std::sync::Arc;

use meshfast_core::entry::EntryStream;
use meshfast_core::exchange::Exchange;
use meshfast_core::http1::ResponseParser;
use meshfast_core::keyindex::KeyIndex;
use meshfast_core::provider::{Family, Plan};
use meshfast_core::rules;
use meshfast_core::shm::Segment;
use meshfast_core::snapshot::Snapshot;
use meshfast_core::translate::{self, Format};

const DELTAS: usize = 200;

fn openai_sse() -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..DELTAS {
        out.extend_from_slice(
            format!("data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"word{i} \"}}}}]}}\n\n")
                .as_bytes(),
        );
    }
    out.extend_from_slice(
        b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    );
    out.extend_from_slice(
        b"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":200}}\n\n",
    );
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

fn chunked(body: &[u8]) -> Vec<u8> {
    let mut wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for part in body.chunks(97) {
        wire.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        wire.extend_from_slice(part);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    wire
}

const TIERS: [&str; 3] = ["normal", "senior", "exec"];
const WINDOWS: [&str; 3] = ["daily", "weekly", "monthly"];

/// The `rule_decision` workload's snapshot (see there).
fn rule_snapshot() -> Snapshot {
    use serde_json::json;
    let people = 2_000usize;
    let principals: Vec<_> = (0..people)
        .map(|i| {
            json!({"id": format!("{i:08x}-0000-4000-8000-000000000000"), "email": format!("u{i}@x"),
                   "display_name": "u", "status": "active", "expires_at_ms": null,
                   "manager": if i < 10 { None } else { Some((i * 31) % i) },
                   "business_unit": format!("bu{}", i % 50), "tier": TIERS[i % 3]})
        })
        .collect();
    let models: Vec<_> = (0..200)
        .map(|m| {
            json!({"id": format!("{m:08x}-1111-4000-8000-000000000000"), "name": format!("m{m}"), "provider": 0,
                   "kind": "chat", "created_ms": 0, "status": "active", "output_media_type": null,
                   "input_price_nano_per_1k": 1_000_000, "output_price_nano_per_1k": 2_000_000,
                   "tags": [format!("fam{}", m % 20), "all"]})
        })
        .collect();
    let grants: Vec<_> = (0..people)
        .flat_map(|p| {
            (0..10).map(move |k| {
                json!({"principal": p, "model": (p * 13 + k * 17) % 200, "daily_cap_nano_usd": 0,
                       "max_calls_per_hour": null, "allowed_from_min": null, "allowed_to_min": null,
                       "timezone": "UTC", "active_days": [], "always_open": true})
            })
        })
        .collect();
    let rules: Vec<_> = (0..100)
        .map(|r| {
            let entries: Vec<_> = (0..2)
                .map(|e| {
                    let mut entry = json!({"window": WINDOWS[(r + e) % 3],
                        "actions": [{"type": "block"}, {"type": "warn", "text": "near"}],
                        "threshold_nano": (r as i64 + 1) * 1_000_000_000,
                        "tag": if r % 10 == 0 { "all".to_string() } else { format!("fam{}", r % 20) }});
                    if r % 2 == 1 {
                        entry["tiers"] = json!([TIERS[r % 3]]);
                    }
                    if r % 4 == 0 {
                        entry["leaders"] = json!([(r * 7) % 1000]);
                    }
                    if r % 5 == 0 {
                        entry["business_units"] = json!([format!("bu{}", r % 50)]);
                    }
                    entry
                })
                .collect();
            json!({"id": format!("rule-{r}"), "weight": r, "mode": if r % 7 == 0 { "shadow" } else { "enforce" },
                   "entries": entries})
        })
        .collect();
    let config = json!({"seq": 1, "principals": principals, "keys": [], "models": models, "grants": grants,
        "providers": [{"id": "33333333-3333-4333-8333-333333333333", "name": "p", "family": "openai",
                       "max_calls_per_hour": null, "base_url": "http://127.0.0.1:9", "api_key": "k"}],
        "rules": rules});
    let bytes = rmp_serde::to_vec_named(&config).expect("encodes");
    Snapshot::from_msgpack(&bytes, b"pepper").expect("a valid config")
}

fn main() {
    let workload = std::env::args().nth(1).unwrap_or_default();
    let sse = openai_sse();
    let mut sink = 0usize;
    match workload.as_str() {
        "http1_parse" => {
            let wire = chunked(&sse);
            for _ in 0..100 {
                let mut parser = ResponseParser::new(false);
                let mut out = Vec::new();
                for piece in wire.chunks(4096) {
                    parser.feed(piece, &mut out).expect("valid response");
                }
                sink += out.len();
            }
        }
        "sse_to_ndjson" => {
            let plan = Plan::preset(Family::OpenAi, "http://upstream", true)
                .expect("preset")
                .finish();
            // The production path: `/v1/proxy`'s exchange, fed body bytes (as the client frames them).
            for _ in 0..100 {
                let paths = Arc::clone(&plan.chat.as_ref().expect("a chat plan").stream);
                let stream = EntryStream::mesh(paths, None, "req_01J00000000000000000000000", 256);
                let mut exchange = Exchange::new(stream, None);
                let mut out = Vec::new();
                for piece in sse.chunks(4096) {
                    exchange.feed(piece, &mut out).expect("body bytes");
                }
                exchange.finish(false, false, String::new, &mut out);
                sink += out.len();
            }
        }
        "translate_request" => {
            let body = br#"{"model":"m","max_tokens":256,"system":"be brief","messages":[{"role":"user","content":"hello there"},{"role":"assistant","content":[{"type":"text","text":"hi"},{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"}]}],"tools":[{"name":"get_weather","description":"weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]}"#;
            for _ in 0..1000 {
                let decoded = translate::decode_request(Format::Anthropic, body).expect("valid request");
                sink += translate::encode_request(Format::OpenAiChat, &decoded.value)
                    .expect("encodable")
                    .len();
            }
        }
        "translate_stream" => {
            // The production path: an Anthropic caller's streamed exchange on an OpenAI upstream.
            for _ in 0..100 {
                let es = EntryStream::new(Format::OpenAiChat, Format::Anthropic, true, true, "m".to_owned());
                let mut exchange = Exchange::new(es, None);
                let mut out = Vec::new();
                for piece in sse.chunks(4096) {
                    exchange.feed(piece, &mut out).expect("body bytes");
                }
                exchange.finish(false, false, String::new, &mut out);
                sink += out.len();
            }
        }
        "key_lookup" => {
            let tokens: Vec<String> = (0..1000).map(|i| format!("mesh_live_{i:0>43}")).collect();
            let index = KeyIndex::new(
                b"pepper-pepper-pepper-pepper-pep!",
                tokens
                    .iter()
                    .map(|t| KeyIndex::new(b"pepper-pepper-pepper-pepper-pep!", []).digest(t.as_bytes())),
            );
            for round in 0..10 {
                for token in &tokens {
                    sink += index.lookup(token).map_or(round, |i| i as usize);
                }
            }
        }
        "rule_decision" => {
            // 100 rules of 2 entries over 200 models (20 tags), 2,000 people in a reporting tree
            // with 10 grants each; 10,000 decisions (each reserving in every covering block
            // entry's pool, then giving it back).
            let snapshot = rule_snapshot();
            let path = std::env::temp_dir().join(format!("meshfast-instructions-{}.seg", std::process::id()));
            let segment = Segment::create(&path, 1 << 16, 4096, 8).expect("segment");
            for i in 0..10_000u32 {
                let grant = (i * 7919) % snapshot.grants.len() as u32;
                let principal = snapshot.grants[grant as usize].principal;
                let d = rules::decide(&snapshot, &segment, principal, grant, 50_000, 1_764_000_000_000, 0);
                sink += d.leases.len() + usize::from(d.refusal.is_some());
                for lease in &d.leases {
                    segment.release(lease);
                }
            }
            let _ = std::fs::remove_file(path);
        }
        "dlp_scan" => {
            // bench/dlp-corpus.txt (64 KiB of prose, code, logs and tables with 48 sensitive
            // values and as many near misses) scanned by every built-in detector, 20 times.
            let corpus = include_str!("../../bench/dlp-corpus.txt");
            let scanner = meshfast_core::dlp::Scanner::new(&[]).expect("the built-in detectors");
            for _ in 0..20 {
                sink += scanner.scan(corpus, |_| true).len();
            }
        }
        other => {
            eprintln!("unknown workload {other:?}: http1_parse, sse_to_ndjson, translate_request, translate_stream, key_lookup, rule_decision, dlp_scan");
            std::process::exit(2);
        }
    }
    // Keeps the work observable so the optimizer cannot drop it.
    std::hint::black_box(sink);
}
