//! Fixed workloads of the core's hot functions, for instruction counting under callgrind
//! (`bench/instructions.py`): the inputs are constants, so the count of a build is deterministic
//! and a regression gate can be tight.
//!
//!     cargo run --release --example instructions -- <workload>

use std::sync::Arc;

use meshfast_core::http1::ResponseParser;
use meshfast_core::keyindex::KeyIndex;
use meshfast_core::provider::{Family, Plan};
use meshfast_core::stream::Stream;
use meshfast_core::translate::stream::Translator;
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
            let plan = Arc::new(
                Plan::preset(Family::OpenAi, "http://upstream", true)
                    .expect("preset")
                    .finish(),
            );
            for _ in 0..100 {
                let mut stream = Stream::new(Arc::clone(&plan), "req_01J00000000000000000000000", 256, false);
                let mut out = Vec::new();
                for piece in sse.chunks(4096) {
                    stream.feed(piece, &mut out);
                }
                stream.finish(false, &mut out);
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
            for _ in 0..100 {
                let mut translator = Translator::new(Format::OpenAiChat, Format::Anthropic, true);
                let mut out = Vec::new();
                for piece in sse.chunks(4096) {
                    translator.feed(piece, &mut out);
                }
                translator.finish(&mut out);
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
        other => {
            eprintln!("unknown workload {other:?}: http1_parse, sse_to_ndjson, translate_request, translate_stream, key_lookup");
            std::process::exit(2);
        }
    }
    // Keeps the work observable so the optimizer cannot drop it.
    std::hint::black_box(sink);
}
