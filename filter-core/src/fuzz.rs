//! Property runs over every parser that sees untrusted bytes: the front stage on any request
//! body, the SSE parser and the stream gate on any provider stream, the Anthropic adapters,
//! the error classifier on any provider answer, and the sync tables on any update. Inputs are
//! seed corpora (the provider error table, well-formed requests and streams) mutated at
//! random; the properties are "no panic", a bounded time per input, and what each parser
//! promises (an SSE stream parses the same however it is split; a refused request is an error
//! object; a decoded update applies).
//!
//! `cargo test -p ai-router-filter-core fuzz` runs a bounded number of cases per target (a few
//! seconds). The long run: `AI_ROUTER_FUZZ_CASES=1000000 cargo test --release -p
//! ai-router-filter-core fuzz`; `AI_ROUTER_FUZZ_SEED=<n>` replays a run (a failure prints its
//! seed and input).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use ai_router_contract::sha256_hex;
use ai_router_proto::tables::Tables;
use ai_router_proto::v1::{
    Delta, Model, Policy, Provider, ProviderKey, ProviderKind, Snapshot, StateUpdate, VirtualKey,
};
use prost::Message as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::host::{Flow, Side};
use crate::state::{LaneHealth, State};
use crate::testing::FakeHost;
use crate::wire::sse::Parser;
use crate::{attempt::stream::Gate, classify, front::Front, protocols::anthropic};

/// Cases per target in the suite's bounded run.
const DEFAULT_CASES: usize = 400;
/// The bound on one input: far above what any input takes (milliseconds), so that it catches a
/// hang or a blow-up, not a loaded machine (a debug build among parallel test runs).
const PER_INPUT: Duration = Duration::from_secs(10);
/// Inputs stay below this size (the front stage's body limit is the pool's, 4 MiB by default).
const MAX_INPUT: usize = 32 * 1024;

const KEY: &str = "sk-starci-fuzz-0123456789abcdef0123456789abcdef0123456789abcdef";

fn cases() -> usize {
    std::env::var("AI_ROUTER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn seed() -> u64 {
    std::env::var("AI_ROUTER_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x0a1_2023_fa17)
}

/// Runs `check` on `cases()` inputs made by `make`; a panic or a slow input fails with the seed,
/// the case number and the input.
pub(crate) fn run(
    target: &str,
    mut make: impl FnMut(&mut StdRng) -> Vec<u8>,
    check: impl Fn(&[u8]),
) {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed ^ hash(target));
    let mut slowest = Duration::ZERO;
    for case in 0..cases() {
        let input = make(&mut rng);
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| check(&input)));
        let took = started.elapsed();
        slowest = slowest.max(took);
        let shown = || String::from_utf8_lossy(&input[..input.len().min(600)]).into_owned();
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            panic!(
                "{target}: case {case} (AI_ROUTER_FUZZ_SEED={seed}) panicked: {message}\ninput ({} bytes): {:?}",
                input.len(),
                shown()
            );
        }
        assert!(
            took < PER_INPUT,
            "{target}: case {case} (AI_ROUTER_FUZZ_SEED={seed}) took {took:?}: {:?}",
            shown()
        );
    }
    eprintln!("{target}: {} cases, slowest {slowest:?}", cases());
}

fn hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Tokens worth splicing into any input.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "\\",
    "\\u0000",
    "\\ud800",
    "null",
    "true",
    "-1",
    "0",
    "1e309",
    "-0.0",
    "18446744073709551616",
    "\n",
    "\r\n",
    "\n\n",
    "\r",
    "data: ",
    "data:",
    "event: error\n",
    "event: message_start\n",
    ": ping\n\n",
    "[DONE]",
    "\"error\"",
    "\"type\"",
    "\"choices\"",
    "\"delta\"",
    "\"content\"",
    "\"messages\"",
    "\"model\"",
    "\"stream\"",
    "\"tool_calls\"",
    "\"retry-after\"",
    "\u{feff}",
    "\u{1F600}",
    "\u{0}",
];

/// One random mutation of `base`, with pieces of `corpus` spliced in now and then.
fn mutate(rng: &mut StdRng, base: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut out = base.to_vec();
    let rounds = rng.random_range(1..=8);
    for _ in 0..rounds {
        let len = out.len();
        let at = if len == 0 {
            0
        } else {
            rng.random_range(0..=len)
        };
        match rng.random_range(0..9) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                out[i] ^= 1 << rng.random_range(0..8);
            }
            1 => out.insert(at, rng.random()),
            2 if len > 0 => {
                let end = rng.random_range(at..=len.min(at + 64));
                out.drain(at..end);
            }
            3 => out.truncate(at),
            4 => {
                let token = TOKENS[rng.random_range(0..TOKENS.len())];
                out.splice(at..at, token.bytes());
            }
            5 if len > 0 => {
                // Repeat a slice: long runs, deep nesting.
                let start = rng.random_range(0..len);
                let end = rng.random_range(start..=len.min(start + 16));
                let piece = out[start..end].to_vec();
                let times = rng.random_range(1..=200);
                for _ in 0..times {
                    out.splice(at..at, piece.iter().copied());
                }
            }
            6 if !corpus.is_empty() => {
                let other = &corpus[rng.random_range(0..corpus.len())];
                if !other.is_empty() {
                    let start = rng.random_range(0..other.len());
                    let end = rng.random_range(start..=other.len());
                    out.splice(at..at, other[start..end].iter().copied());
                }
            }
            7 if len > 0 => {
                let i = rng.random_range(0..len);
                out[i] = rng.random();
            }
            _ => {
                let nest = rng.random_range(1..=2000);
                let open = if rng.random_bool(0.5) { b'[' } else { b'{' };
                out.splice(at..at, std::iter::repeat_n(open, nest));
            }
        }
        out.truncate(MAX_INPUT);
    }
    out
}

/// A seed, mutated most of the time, raw random bytes now and then.
pub(crate) fn input(rng: &mut StdRng, corpus: &[Vec<u8>]) -> Vec<u8> {
    if rng.random_bool(0.05) {
        let len = rng.random_range(0..512);
        return (0..len).map(|_| rng.random()).collect();
    }
    let base = &corpus[rng.random_range(0..corpus.len())];
    if rng.random_bool(0.1) {
        return base.clone();
    }
    mutate(rng, base, corpus)
}

// ---------------------------------------------------------------------------------------------
// Corpora
// ---------------------------------------------------------------------------------------------

const PROVIDER_ERRORS: [&str; 8] = [
    include_str!("../../testdata/provider-errors/openai.yaml"),
    include_str!("../../testdata/provider-errors/anthropic.yaml"),
    include_str!("../../testdata/provider-errors/openrouter.yaml"),
    include_str!("../../testdata/provider-errors/qwen.yaml"),
    include_str!("../../testdata/provider-errors/deepseek.yaml"),
    include_str!("../../testdata/provider-errors/gemini.yaml"),
    include_str!("../../testdata/provider-errors/groq.yaml"),
    include_str!("../../testdata/provider-errors/openai-compatible.yaml"),
];

/// One answer of the provider error table.
pub(crate) struct TableCase {
    kind: String,
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

pub(crate) fn table_cases() -> Vec<TableCase> {
    let mut out = Vec::new();
    for text in PROVIDER_ERRORS {
        let file: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).unwrap();
        let kind = file["kind"].as_str().unwrap().to_owned();
        for case in file["cases"].as_sequence().unwrap() {
            let headers = case["headers"]
                .as_mapping()
                .map(|map| {
                    map.iter()
                        .filter_map(|(k, v)| {
                            let value = match v {
                                serde_yaml_ng::Value::String(s) => s.clone(),
                                serde_yaml_ng::Value::Number(n) => n.to_string(),
                                _ => return None,
                            };
                            Some((k.as_str()?.to_owned(), value))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let body = match &case["body"] {
                serde_yaml_ng::Value::String(s) => s.clone().into_bytes(),
                other => serde_json::to_vec(other).unwrap_or_default(),
            };
            out.push(TableCase {
                kind: kind.clone(),
                status: u16::try_from(case["status"].as_u64().unwrap_or(500)).unwrap_or(500),
                headers,
                body,
            });
        }
    }
    assert!(out.len() > 40, "the provider error table has its cases");
    out
}

fn chat_bodies() -> Vec<Vec<u8>> {
    [
        json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "claude", "stream": true, "stream_options": {"include_usage": true},
               "messages": [{"role": "system", "content": "be brief"},
                            {"role": "user", "content": [{"type": "text", "text": "hi"},
                              {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
               "max_tokens": 100, "temperature": 0.5, "stop": ["x"]}),
        json!({"model": "chat", "messages": [{"role": "user", "content": "call f"},
               {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                 "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
               "tool_choice": "auto", "response_format": {"type": "json_object"}}),
        json!({"model": "embed", "input": ["a", "b"], "encoding_format": "base64"}),
        json!({"model": ["chat"], "messages": "hi", "stream": "yes", "max_tokens": -1}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect()
}

pub(crate) fn openai_stream() -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b": keep-alive\n\n");
    for chunk in [
        json!({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        json!({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}),
        json!({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": "{"}}]}}]}),
        json!({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json!({"id": "c", "model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
    ] {
        out.extend_from_slice(format!("data: {chunk}\n\n").as_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

pub(crate) fn anthropic_stream() -> Vec<u8> {
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"a\":"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
        (
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
    ];
    let mut out = Vec::new();
    for (name, data) in events {
        out.extend_from_slice(format!("event: {name}\ndata: {data}\n\n").as_bytes());
    }
    out
}

fn stream_corpus() -> Vec<Vec<u8>> {
    let mut corpus = vec![openai_stream(), anthropic_stream()];
    for case in table_cases() {
        let body = String::from_utf8_lossy(&case.body).replace('\n', " ");
        corpus.push(format!("data: {body}\n\n").into_bytes());
    }
    corpus
}

fn anthropic_responses() -> Vec<Vec<u8>> {
    let mut corpus: Vec<Vec<u8>> = [
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
               "content": [{"type": "text", "text": "Hi"},
                           {"type": "tool_use", "id": "t", "name": "f", "input": {"a": [1, 2]}},
                           {"type": "thinking", "thinking": "hm"}],
               "stop_reason": "end_turn", "usage": {"input_tokens": 3, "output_tokens": 4,
               "cache_read_input_tokens": 1}}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect();
    corpus.extend(table_cases().into_iter().map(|case| case.body));
    corpus
}

// ---------------------------------------------------------------------------------------------
// The state a request is checked against, and the sync updates
// ---------------------------------------------------------------------------------------------

pub(crate) fn snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    for (id, kind, model, alias) in [
        ("p1", ProviderKind::Openai, "m1", "chat"),
        ("p2", ProviderKind::Anthropic, "claude-x", "claude"),
        ("p3", ProviderKind::OpenaiCompatible, "e1", "embed"),
    ] {
        snap.providers.push(Provider {
            id: id.into(),
            kind: kind as i32,
            keys: vec![ProviderKey {
                alias: "a".into(),
                secret: format!("sk-fuzz-{id}"),
                ..Default::default()
            }],
            models: vec![Model {
                id: model.into(),
                aliases: vec![alias.into()],
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    snap.virtual_keys.push(VirtualKey {
        id: "key_fuzz".into(),
        sha256: sha256_hex(KEY.as_bytes()),
        profiles: vec!["*".into()],
        models: vec!["*".into()],
        allow_fallback: true,
        enabled: true,
        ..Default::default()
    });
    snap.defaults = Some(Policy {
        max_attempts: Some(3),
        fallbacks: vec!["claude".into()],
        ..Default::default()
    });
    snap
}

/// Runs the front stage's request phase over `body` on `path`; a refused request must be an
/// error object, an accepted one must carry a plan.
pub(crate) fn front_request(state: State, path: &str, body: &[u8]) {
    let mut host = FakeHost::with_state(state);
    host.add(Side::Request, ":method", b"POST");
    host.add(Side::Request, ":path", path.as_bytes());
    host.add(Side::Request, "x-request-id", b"rid-fuzz");
    host.add(
        Side::Request,
        "authorization",
        format!("Bearer {KEY}").as_bytes(),
    );
    let mut front = Front::default();
    if front.on_request_headers(&mut host, false) == Flow::Continue {
        assert!(
            host.answered.is_some(),
            "headers passed on without a body check"
        );
        return;
    }
    host.request_body = body.to_vec();
    match front.on_request_body(&mut host, body.len(), true) {
        Flow::Continue => {
            let plan = host.planned();
            assert!(plan.is_some(), "an accepted request without a plan");
        }
        Flow::Pause => {
            if let Some(answer) = &host.answered {
                assert!(
                    (400..600).contains(&answer.status),
                    "status {}",
                    answer.status
                );
                let error = answer.json();
                // A Messages caller's errors are Anthropic's shape; everyone else's OpenAI's.
                let shaped = if path == "/v1/messages" {
                    error["type"] == "error"
                        && error["error"]["type"].is_string()
                        && error["error"]["message"].is_string()
                } else {
                    error["error"]["code"].is_string() && error["error"]["message"].is_string()
                };
                assert!(shaped, "not an error object: {error}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The targets
// ---------------------------------------------------------------------------------------------

#[test]
fn fuzz_the_front_stage_on_any_request_body() {
    let corpus = chat_bodies();
    run(
        "front",
        |rng| input(rng, &corpus),
        |body| {
            front_request(State::new(1, snapshot()), "/v1/chat/completions", body);
            front_request(State::new(1, snapshot()), "/v1/embeddings", body);
        },
    );
}

/// A stream parses into the same events however it is split into chunks.
#[test]
fn fuzz_the_sse_parser_is_split_invariant() {
    let corpus = stream_corpus();
    run(
        "sse",
        |rng| input(rng, &corpus),
        |bytes| {
            let mut whole = Parser::new();
            let expected = whole.feed(bytes);
            let step = 1 + hash(&String::from_utf8_lossy(bytes)) as usize % 7;
            let mut split = Parser::new();
            let mut got = Vec::new();
            for piece in bytes.chunks(step) {
                got.extend(split.feed(piece));
            }
            assert_eq!(got, expected, "split every {step} bytes");
            assert_eq!(split.pending(), whole.pending());
        },
    );
}

#[test]
fn fuzz_the_stream_gate_on_any_provider_stream() {
    let corpus = stream_corpus();
    run(
        "gate",
        |rng| input(rng, &corpus),
        |bytes| {
            let kinds = [("openai", false), ("openai", true), ("anthropic", true)];
            for (kind, include_usage) in kinds {
                let mut gate = Gate::new(kind, include_usage);
                let step = 1 + bytes.len() % 13;
                for piece in bytes.chunks(step) {
                    let _ = gate.feed(piece, 1_700_000_000_000);
                }
                let _ = gate.finish();
                let _ = (gate.released(), gate.chunks(), gate.completed());
            }
        },
    );
}

#[test]
fn fuzz_the_anthropic_adapters() {
    let requests = chat_bodies();
    let responses = anthropic_responses();
    let streams = vec![anthropic_stream()];
    run(
        "anthropic-request",
        |rng| input(rng, &requests),
        |bytes| {
            if let Ok(body) = serde_json::from_slice::<Value>(bytes) {
                let _ = anthropic::request::to_messages_request(&body, "claude-x", 1024);
            }
        },
    );
    run(
        "anthropic-response",
        |rng| input(rng, &responses),
        |bytes| {
            if let Ok(body) = serde_json::from_slice::<Value>(bytes) {
                let _ = anthropic::response::from_messages_response(&body, 1_700_000_000);
            }
        },
    );
    run(
        "anthropic-stream",
        |rng| input(rng, &streams),
        |bytes| {
            let mut translator = anthropic::stream::StreamTranslator::new(1_700_000_000, None);
            for event in Parser::new().feed(bytes) {
                let _ = translator.feed(&event, 1_700_000_000_000);
            }
            let _ = translator.finished();
        },
    );
}

#[test]
fn fuzz_the_classifier_on_any_provider_answer() {
    let table = table_cases();
    let corpus: Vec<Vec<u8>> = table.iter().map(|case| case.body.clone()).collect();
    let values = [
        "1",
        "0",
        "-5",
        "30",
        "1.5",
        "Wed, 21 Oct 2015 07:28:00 GMT",
        "",
        "9999999999999999999",
        "6m0s",
        "1h2m3.5s",
        "abc",
    ];
    run(
        "classify",
        |rng| {
            let mut bytes = input(rng, &corpus);
            // Which case's kind, status and headers: the first two bytes pick them.
            let pick = rng.random_range(0..table.len()) as u16;
            let status = rng.random_range(0..1000u16);
            bytes.splice(
                0..0,
                pick.to_be_bytes().into_iter().chain(status.to_be_bytes()),
            );
            bytes
        },
        |bytes| {
            let pick = usize::from(u16::from_be_bytes([bytes[0], bytes[1]])) % table.len();
            let status = u16::from_be_bytes([bytes[2], bytes[3]]);
            let body = &bytes[4..];
            let case = &table[pick];
            let mut headers = case.headers.clone();
            let salt = body.len();
            for name in [
                "retry-after",
                "retry-after-ms",
                "x-ratelimit-reset-requests",
                "x-ratelimit-remaining-tokens",
                "anthropic-ratelimit-requests-reset",
            ] {
                headers.push((
                    name.to_owned(),
                    values[(salt + name.len()) % values.len()].to_owned(),
                ));
            }
            let now = 1_700_000_000_000;
            let _ = classify::classify(&case.kind, status, &headers, body, now);
            let _ = classify::classify(&case.kind, case.status, &case.headers, body, now);
            let _ = classify::when::retry_at(&headers, now);
            let _ = classify::headroom::headroom(&headers, now);
            if let Ok(event) = serde_json::from_slice::<Value>(body) {
                let _ = classify::classify_stream_error(&case.kind, None, &event, now);
            }
        },
    );
}

/// Any update bytes: decoded, applied to the tables, published as the records the workers
/// read, and a request checked against the state they give; a delta that does not fit is
/// refused, never a panic.
#[test]
fn fuzz_the_sync_updates_decode_apply_and_serve() {
    let base = Tables::from_snapshot(1, snapshot());
    let mut changed = base.clone();
    if let Some(provider) = changed.providers.first_mut() {
        provider.models.push(Model {
            id: "m2".into(),
            ..Default::default()
        });
    }
    let delta: Delta = base.diff(&changed).unwrap_or_default();
    let corpus = vec![
        StateUpdate {
            version: 1,
            snapshot: Some(snapshot()),
            delta: None,
        }
        .encode_to_vec(),
        StateUpdate {
            version: 2,
            snapshot: None,
            delta: Some(delta),
        }
        .encode_to_vec(),
    ];
    let request = chat_bodies().remove(0);
    run(
        "sync",
        |rng| input(rng, &corpus),
        |bytes| {
            let Ok(update) = StateUpdate::decode(bytes) else {
                return;
            };
            let tables = match (update.snapshot, update.delta) {
                (Some(snapshot), _) => Tables::from_snapshot(update.version, snapshot),
                (None, Some(delta)) => {
                    let mut tables = base.clone();
                    if tables.apply(update.version, &delta).is_err() {
                        return;
                    }
                    tables
                }
                (None, None) => return,
            };
            let pool = tables.pool_snapshot().encode_to_vec();
            let state = State::decode(tables.version, &pool).expect("a published pool decodes");
            for provider in &tables.providers {
                let lanes = tables.provider_lanes(&provider.id).encode_to_vec();
                assert!(LaneHealth::decode(&lanes).is_some());
            }
            front_request(state, "/v1/chat/completions", &request);
        },
    );
    // Worker records read back from shared data: any bytes decode or are refused.
    run(
        "records",
        |rng| input(rng, &[Vec::new(), vec![0; 12], b"p1\0a\0m1\0".to_vec()]),
        |bytes| {
            let _ = LaneHealth::decode(bytes);
            let _ = State::decode(1, bytes);
            let _ = crate::vm::local::ProviderHolds::decode(bytes);
            let _ = crate::vm::local::InFlight::decode(bytes);
            let _ = crate::vm::minute_lease::MinuteLease::decode(bytes);
            let _ = crate::plan::Written::cid_of(&String::from_utf8_lossy(bytes));
        },
    );
}

/// The plugin configuration Envoy hands each root (`render-envoy` writes one per role): any
/// bytes are a role or a refusal with its reason, never a panic, and a ctrl tick stays in range.
#[test]
fn fuzz_the_plugin_configuration() {
    let corpus: Vec<Vec<u8>> = [
        json!({"role": "front"}),
        json!({"role": "attempt"}),
        json!({"role": "ctrl", "grpc_cluster": "ai_router_control_plane", "node": "envoy", "tick_ms": 500}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect();
    run(
        "plugin",
        |rng| input(rng, &corpus),
        |bytes| match crate::vm::plugin::parse(Some(bytes)) {
            Ok(crate::vm::plugin::Role::Ctrl { tick_ms, .. }) => {
                assert!(
                    ai_router_contract::plugin::TICK_MS.contains(&tick_ms),
                    "tick {tick_ms}"
                );
            }
            Ok(_) => {}
            Err(message) => assert!(message.starts_with("ai-router: "), "{message}"),
        },
    );
}
