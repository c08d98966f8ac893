//! The filter's per-request cost, measured without a clock: typical calls driven end to end
//! through both stages on the fake host (`testing::FakeHost`), with the host calls each stage
//! makes counted by the fake host and the instructions each stage runs counted by callgrind.
//!
//! ```sh
//! cargo run -p ai-router-filter-core --features testing --example hot_path --release -- 2000
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \
//!     target/release/examples/hot_path 2000
//! callgrind_annotate --inclusive=yes /tmp/cg.out | grep 'hot_path::stage_'
//! ```
//! or every pool and call in its own run: `filter-core/examples/hot_path.sh N`.
//! ```sh
//! target/release/examples/hot_path 2000 small stream   # one pool, one kind of call
//! ```
//! (`--release` with `CARGO_PROFILE_RELEASE_STRIP=false CARGO_PROFILE_RELEASE_DEBUG=1` so the
//! stages keep their names.) Each stage callback runs inside a `stage_*` function that is never
//! inlined: its inclusive cost divided by the calls the driver made is the stage's
//! instructions per request. `docs/benchmarks.md` has the figures.
//!
//! Five calls, each `N` times: an OpenAI chat request answered whole by an openai-compatible
//! lane (pass-through), the same streamed, one answered by an anthropic lane (translated
//! both ways), `long`: the first with a coding agent's body (about 64 KB of turns), and
//! `messages`: that body on the Messages API to the anthropic lane (Claude Code's shape); on a
//! pool of 3 providers × 10 keys and 10 virtual keys, then on one of 3
//! providers × 334 keys and 10,000 virtual keys, with rate-limit headers that change on every
//! answer.

use std::collections::BTreeMap;

/// The allocator the filter has in Envoy (wasi-libc's malloc is dlmalloc): allocation is a
/// quarter to a third of the filter's instructions, and glibc's malloc costs less and moves
/// with the order of frees, so the counts here follow the wasm build's.
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;
use std::hint::black_box;

use ai_router_filter_core::attempt::Attempt;
use ai_router_filter_core::front::Front;
use ai_router_filter_core::host::Side;
use ai_router_filter_core::state::State;
use ai_router_filter_core::testing::{self, FakeHost};
use ai_router_proto::v1::{Policy, Provider, ProviderKind, Snapshot, VirtualKey};

const STAGES: [&str; 6] = [
    "front.request",
    "attempt.request",
    "attempt.response",
    "front.response",
    "attempt.log",
    "front.log",
];

fn provider(id: &str, kind: ProviderKind, keys: usize, model: &str) -> Provider {
    let aliases: Vec<String> = (0..keys).map(|k| format!("k{k}")).collect();
    let aliases: Vec<&str> = aliases.iter().map(String::as_str).collect();
    let mut provider = testing::provider_of_kind(id, kind, &aliases, model);
    for m in &mut provider.models {
        m.context_window = 128_000;
    }
    provider
}

fn client_key(i: usize) -> String {
    format!("sk-starci-bench-{i:08}")
}

/// Two openai-compatible providers serving `gpt-4o-mini`, one anthropic serving `claude`.
fn pool(keys: usize, virtual_keys: usize) -> State {
    let mut snap = Snapshot::default();
    for id in ["openai-a", "openai-b"] {
        snap.providers.push(provider(
            id,
            ProviderKind::OpenaiCompatible,
            keys,
            "gpt-4o-mini",
        ));
    }
    snap.providers.push(provider(
        "anthropic",
        ProviderKind::Anthropic,
        keys,
        "claude",
    ));
    snap.virtual_keys = (0..virtual_keys)
        .map(|i| VirtualKey {
            id: format!("key_{i}"),
            sha256: ai_router_contract::sha256_hex(client_key(i).as_bytes()),
            profiles: vec!["*".into()],
            models: vec!["*".into()],
            allow_fallback: true,
            enabled: true,
            requests_per_minute: 1_000_000,
            ..Default::default()
        })
        .collect();
    snap.defaults = Some(Policy {
        max_attempts: Some(3),
        ..Default::default()
    });
    State::new(1, snap)
}

#[derive(Clone, Copy)]
enum Kind {
    Unary,
    Stream,
    Anthropic,
    Long,
    /// A coding agent on the Messages API (Claude Code's shape): the long body as Messages, to
    /// the anthropic lane (native).
    Messages,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Unary => "unary",
            Kind::Stream => "stream",
            Kind::Anthropic => "anthropic",
            Kind::Long => "long",
            Kind::Messages => "messages",
        }
    }
}

fn request_body(kind: Kind) -> String {
    match kind {
        Kind::Long => return long_body(),
        Kind::Messages => return messages_body(),
        _ => {}
    }
    let model = match kind {
        Kind::Anthropic => "claude",
        _ => "gpt-4o-mini",
    };
    let stream = match kind {
        Kind::Stream => r#","stream":true"#,
        _ => "",
    };
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"system","content":"You are a helpful assistant. Answer briefly and precisely."}},{{"role":"user","content":"What is the capital of France? Give one sentence with a short reason."}}],"temperature":0.2,"max_tokens":64{stream}}}"#
    )
}

/// A coding agent's chat request: a long system prompt and 40 turns of code and tool output,
/// about 64 KB.
fn long_body() -> String {
    let line =
        "    let total = items.iter().map(|item| item.price * item.quantity).sum::<u64>();\\n";
    let code: String = line.repeat(18);
    let mut messages = vec![format!(
        r#"{{"role":"system","content":"You are a coding agent. Follow the repository's style.\\n{}"}}"#,
        "Keep changes small; explain each one. ".repeat(60)
    )];
    for turn in 0..20 {
        messages.push(format!(
            r#"{{"role":"user","content":"Step {turn}: review this function and fix its bug.\\n{code}"}}"#
        ));
        messages.push(format!(
            r#"{{"role":"assistant","content":"Here is the fix for step {turn}:\\n{code}"}}"#
        ));
    }
    format!(
        r#"{{"model":"gpt-4o-mini","messages":[{}],"temperature":0.2,"max_tokens":1024}}"#,
        messages.join(",")
    )
}

/// [`long_body`] as Claude Code sends it: the system prompt apart, to the anthropic lane.
fn messages_body() -> String {
    let chat: serde_json::Value = serde_json::from_str(&long_body()).unwrap_or_default();
    let turns = chat["messages"].as_array().cloned().unwrap_or_default();
    let system = turns.first().map(|m| m["content"].clone());
    let rest: Vec<_> = turns.into_iter().skip(1).collect();
    serde_json::json!({
        "model": "claude",
        "max_tokens": 1024,
        "system": [{ "type": "text", "text": system, "cache_control": { "type": "ephemeral" } }],
        "messages": rest,
    })
    .to_string()
}

const OPENAI_ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the bench upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":31,"completion_tokens":7,"total_tokens":38}}"#;

const ANTHROPIC_ANSWER: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Hello from the bench upstream."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":31,"output_tokens":7}}"#;

fn openai_stream() -> String {
    let mut s = String::new();
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    s += &chunk(r#"{"role":"assistant","content":""}"#, "null");
    for word in ["Hello", " from the", " bench upstream."] {
        s += &chunk(&format!("{{\"content\":\"{word}\"}}"), "null");
    }
    s += &chunk("{}", "\"stop\"");
    s += "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":31,\"completion_tokens\":7,\"total_tokens\":38}}\n\n";
    s += "data: [DONE]\n\n";
    s
}

/// The host calls of each stage, summed over the requests.
#[derive(Default)]
struct Tally {
    calls: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
    view_reads: BTreeMap<&'static str, u64>,
}

impl Tally {
    fn add(&mut self, stage: &'static str, host: &mut FakeHost) {
        let entry = self.calls.entry(stage).or_default();
        for (method, n) in host.host_calls() {
            *entry.entry(method).or_default() += n;
        }
        *self.view_reads.entry(stage).or_default() += host.lanes.reads.get();
        host.reset_tallies();
    }
}

// One function per stage, never inlined: callgrind's inclusive cost of each is the stage's.
#[inline(never)]
fn stage_front_request(front: &mut Front, host: &mut FakeHost) {
    host.next_callback();
    front.on_request_headers(host, false);
    let size = host.request_body.len();
    host.next_callback();
    black_box(front.on_request_body(host, size, true));
}

#[inline(never)]
fn stage_attempt_request(attempt: &mut Attempt, host: &mut FakeHost) {
    host.next_callback();
    attempt.on_request_headers(host, false);
    let size = host.request_body.len();
    host.next_callback();
    black_box(attempt.on_request_body(host, size, true));
}

#[inline(never)]
fn stage_attempt_response(attempt: &mut Attempt, host: &mut FakeHost, stream: bool) {
    host.next_callback();
    attempt.on_response_headers(host, false);
    let size = host.response_body.len();
    host.next_callback();
    if stream {
        // The whole stream in one read (as the bench upstream writes it), then its end.
        black_box(attempt.on_response_body(host, size, false));
        host.next_callback();
        black_box(attempt.on_response_body(host, 0, true));
    } else {
        black_box(attempt.on_response_body(host, size, true));
    }
}

#[inline(never)]
fn stage_front_response(front: &mut Front, host: &mut FakeHost, stream: bool) {
    host.next_callback();
    front.on_response_headers(host, false);
    let size = host.response_body.len();
    host.next_callback();
    if stream {
        black_box(front.on_response_body(host, size, false));
        host.next_callback();
        black_box(front.on_response_body(host, 0, true));
    } else {
        black_box(front.on_response_body(host, size, true));
    }
}

#[inline(never)]
fn stage_attempt_log(attempt: &mut Attempt, host: &mut FakeHost) {
    host.next_callback();
    attempt.on_log(host);
}

#[inline(never)]
fn stage_front_log(front: &mut Front, host: &mut FakeHost) {
    host.next_callback();
    front.on_log(host);
}

/// One call through both stages, as Envoy passes it between them on one worker.
fn one_call(host: &mut FakeHost, kind: Kind, i: usize, virtual_keys: usize, tally: &mut Tally) {
    host.now += 3;
    host.request_headers.clear();
    host.response_headers.clear();
    host.response_body.clear();
    host.answered = None;
    let body = request_body(kind);
    let auth = format!("Bearer {}", client_key(i % virtual_keys.min(10)));
    let path = match kind {
        Kind::Messages => "/v1/messages",
        _ => "/v1/chat/completions",
    };
    if let Kind::Messages = kind {
        host.add(Side::Request, "anthropic-version", b"2023-06-01");
    }
    for (k, v) in [
        (":method", "POST"),
        (":path", path),
        (":authority", "gateway.local"),
        (":scheme", "http"),
        ("content-type", "application/json"),
        ("accept", "*/*"),
        ("user-agent", "OpenAI/Python 1.51.0"),
        ("authorization", auth.as_str()),
        ("x-request-id", &format!("rid-{i}")),
        ("content-length", &body.len().to_string()),
    ] {
        host.add(Side::Request, k, v.as_bytes());
    }
    host.request_body = body.into_bytes();

    let mut front = Front::default();
    stage_front_request(&mut front, host);
    tally.add("front.request", host);

    // The internal listener's router: the first try.
    host.add(Side::Request, "x-envoy-attempt-count", b"1");
    let mut attempt = Attempt::default();
    stage_attempt_request(&mut attempt, host);
    tally.add("attempt.request", host);

    let stream = matches!(kind, Kind::Stream);
    let (content_type, answer) = match kind {
        Kind::Unary | Kind::Long => ("application/json", OPENAI_ANSWER.to_string()),
        Kind::Stream => ("text/event-stream", openai_stream()),
        Kind::Anthropic | Kind::Messages => ("application/json", ANTHROPIC_ANSWER.to_string()),
    };
    let remaining = (10_000 - (i % 10_000)).to_string();
    for (k, v) in [
        (":status", "200"),
        ("content-type", content_type),
        ("x-ratelimit-limit-requests", "10000"),
        ("x-ratelimit-remaining-requests", remaining.as_str()),
        ("x-ratelimit-limit-tokens", "2000000"),
        ("x-ratelimit-remaining-tokens", "1999000"),
        ("x-ratelimit-reset-requests", "6ms"),
        ("x-ratelimit-reset-tokens", "30ms"),
    ] {
        host.add(Side::Response, k, v.as_bytes());
    }
    host.response_body = answer.into_bytes();
    stage_attempt_response(&mut attempt, host, stream);
    tally.add("attempt.response", host);

    stage_front_response(&mut front, host, stream);
    tally.add("front.response", host);

    stage_attempt_log(&mut attempt, host);
    tally.add("attempt.log", host);
    stage_front_log(&mut front, host);
    tally.add("front.log", host);
}

fn run(label: &str, keys: usize, virtual_keys: usize, n: usize, only: &str) {
    for kind in [
        Kind::Unary,
        Kind::Stream,
        Kind::Anthropic,
        Kind::Long,
        Kind::Messages,
    ] {
        if !only.is_empty() && only != kind.name() {
            continue;
        }
        let mut host = FakeHost::with_state(pool(keys, virtual_keys));
        let mut tally = Tally::default();
        for i in 0..n {
            one_call(&mut host, kind, i, virtual_keys, &mut tally);
        }
        let ok = host
            .reports
            .iter()
            .filter(|r| r.outcome == ai_router_proto::v1::RequestResult::Success as i32)
            .count();
        let answered = match kind {
            Kind::Anthropic => serde_json::from_slice::<serde_json::Value>(&host.response_body)
                .ok()
                .and_then(|v| v["choices"][0]["message"]["content"].as_str().map(str::len)),
            _ => Some(host.response_body.len()),
        };
        println!(
            "\n{label} {}: {n} calls, {ok} reported as successes, {} attempts reported, last answer {answered:?}",
            kind.name(),
            host.attempts.len(),
        );
        let mut total = 0;
        for stage in STAGES {
            let calls = tally.calls.get(stage).cloned().unwrap_or_default();
            let sum: u64 = calls.values().sum();
            total += sum;
            let each = calls
                .iter()
                .map(|(m, c)| format!("{m} {:.1}", *c as f64 / n as f64))
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "  {stage:<17} host calls/request {:>5.1}  view reads/request {:>5.1}  [{each}]",
                sum as f64 / n as f64,
                tally.view_reads.get(stage).copied().unwrap_or(0) as f64 / n as f64,
            );
        }
        println!("  total host calls/request {:.1}", total as f64 / n as f64);
    }
}

fn main() {
    let n = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000);
    // Which pools: `small`, `large` or both (the default); which call: `unary`, `stream`,
    // `anthropic`, `long`, `messages` or every one (the default).
    let which = std::env::args().nth(2).unwrap_or_default();
    let only = std::env::args().nth(3).unwrap_or_default();
    if which != "large" {
        run("3 providers x 10 keys, 10 virtual keys", 10, 10, n, &only);
    }
    if which != "small" {
        run(
            "3 providers x 334 keys, 10,000 virtual keys",
            334,
            10_000,
            n,
            &only,
        );
    }
}
