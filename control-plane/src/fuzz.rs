//! Property runs over the pool config loader: YAML and JSON documents (JSON is YAML too) read,
//! typed, validated and resolved as `serve` and a reload do, then rendered into Envoy's
//! bootstrap when they are valid. Inputs are the example pools (and their JSON forms) mutated
//! at random, line by line and token by token; the properties are no panic, a bounded time per
//! input, and that a refusal says what is wrong. The control plane's counterpart of
//! `filter-core/src/fuzz.rs`, driven by the same variables: `AI_ROUTER_FUZZ_CASES` (default
//! 300 here) and `AI_ROUTER_FUZZ_SEED` (a failure prints its seed and input).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::parse;
use crate::config::secrets::MapEnv;

const EXAMPLES: [&str; 3] = [
    include_str!("../../examples/pool.yaml"),
    include_str!("../../examples/conformance.yaml"),
    include_str!("../../examples/pool-cluster.yaml"),
];

/// Values worth putting where a scalar was.
const VALUES: &[&str] = &[
    "-1",
    "0",
    "1e400",
    "18446744073709551616",
    "0.0000001",
    "~",
    "null",
    "[]",
    "{}",
    "\"\"",
    "true",
    "'sk-literal-secret'",
    "{ env: NOPE }",
    "{ file: /nonexistent/secret }",
    "{ env: K, file: f }",
    "&anchor x",
    "*anchor",
    "!!binary aGk=",
    "\"\\u0000\"",
    "\u{1F600}",
    "[a, [b, [c, [d]]]]",
    "|\n  multi\n  line",
];

/// Pieces worth splicing in anywhere.
const TOKENS: &[&str] = &[
    ": ", "- ", "{", "}", "[", "]", ",", "\n", "  ", "#", "'", "\"", "?", "&a", "*a", "<<: *a",
    "---\n", "...\n", "\t",
];

fn cases() -> usize {
    std::env::var("AI_ROUTER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn seed() -> u64 {
    std::env::var("AI_ROUTER_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x0c0f_1a77)
}

fn corpus() -> Vec<String> {
    let mut out: Vec<String> = EXAMPLES.iter().map(|s| (*s).to_owned()).collect();
    for text in EXAMPLES {
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).unwrap();
        out.push(serde_json::to_string_pretty(&value).unwrap());
    }
    out
}

/// A char boundary of `text` at random.
fn boundary(rng: &mut StdRng, text: &str) -> usize {
    let mut at = rng.random_range(0..=text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn mutate(rng: &mut StdRng, base: &str, corpus: &[String]) -> String {
    let mut lines: Vec<String> = base.lines().map(str::to_owned).collect();
    for _ in 0..rng.random_range(1..=6) {
        let n = lines.len();
        let i = if n == 0 { 0 } else { rng.random_range(0..n) };
        match rng.random_range(0..8) {
            0 if n > 0 => {
                lines.remove(i);
            }
            1 if n > 0 => {
                let line = lines[i].clone();
                lines.insert(i, line);
            }
            2 if n > 1 => {
                let j = rng.random_range(0..n);
                lines.swap(i, j);
            }
            3 if n > 0 => {
                // A scalar replaced: after the key of a `key: value` line.
                if let Some(colon) = lines[i].find(": ") {
                    let value = VALUES[rng.random_range(0..VALUES.len())];
                    lines[i] = format!("{}: {value}", &lines[i][..colon]);
                }
            }
            4 if n > 0 => {
                if rng.random_bool(0.5) {
                    lines[i].insert_str(0, "  ");
                } else if let Some(rest) = lines[i].strip_prefix("  ") {
                    lines[i] = rest.to_owned();
                }
            }
            5 => {
                let other = &corpus[rng.random_range(0..corpus.len())];
                if let Some(line) = other
                    .lines()
                    .nth(rng.random_range(0..other.lines().count().max(1)))
                {
                    lines.insert(i.min(n), line.to_owned());
                }
            }
            6 => {
                let depth = rng.random_range(1..=300);
                lines.insert(i.min(n), format!("x: {}", "[".repeat(depth)));
            }
            _ if n > 0 => {
                let at = boundary(rng, &lines[i]);
                let token = TOKENS[rng.random_range(0..TOKENS.len())];
                lines[i].insert_str(at, token);
            }
            _ => {}
        }
    }
    let mut text = lines.join("\n");
    if rng.random_bool(0.05) {
        let at = boundary(rng, &text);
        text.truncate(at);
    }
    text
}

/// What `serve` does with a file at start and on a reload, and `render-envoy` after.
fn load_and_render(text: &str) {
    let env = MapEnv::new([
        ("OPENAI_API_KEY", "sk-fuzz-openai"),
        ("OPENROUTER_API_KEYS", "sk-fuzz-or-1,sk-fuzz-or-2"),
        ("CONFORMANCE_KEY", "sk-fuzz-conformance"),
        ("HEALTHY_KEY", "sk-fuzz-healthy"),
        ("AI_ROUTER_REDIS_URL", "redis://127.0.0.1:1"),
    ]);
    let resolved = parse(text).and_then(|file| file.resolve(&env, Path::new("/nonexistent")));
    match resolved {
        Ok(config) => {
            let options = crate::up::render_options(&config, Default::default());
            let yaml = crate::render::render_envoy(&options);
            assert!(
                yaml.contains("static_resources"),
                "a bootstrap without resources"
            );
        }
        Err(err) => assert!(
            !err.to_string().trim().is_empty(),
            "a refusal that says nothing"
        ),
    }
}

#[test]
fn fuzz_the_pool_config_loader() {
    let corpus = corpus();
    // The seeds themselves load.
    for text in &corpus[..2] {
        load_and_render(text);
    }
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut slowest = Duration::ZERO;
    for case in 0..cases() {
        let base = &corpus[rng.random_range(0..corpus.len())];
        let text = mutate(&mut rng, base, &corpus);
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(|| load_and_render(&text));
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert!(
            outcome.is_ok(),
            "config case {case} (AI_ROUTER_FUZZ_SEED={seed}) panicked on:\n{text}"
        );
        assert!(
            took < Duration::from_secs(10),
            "config case {case} (AI_ROUTER_FUZZ_SEED={seed}) took {took:?} on:\n{text}"
        );
    }
    eprintln!("config: {} cases, slowest {slowest:?}", cases());
}

/// Strings a report may carry: the pool's own names, and what no filter of ours would send.
const NAMES: &[&str] = &[
    "",
    "openai",
    "openrouter",
    "gpt-4o-mini",
    "no-such-provider",
    "openai-1",
    "é\u{0}\u{202e}",
    "a/b:c|d",
    "chat",
    "embeddings",
    "messages",
    "responses",
    "vk_fuzz",
];

/// Numbers a report may carry, at the edges of their types.
const NUMBERS: &[i64] = &[
    0,
    1,
    -1,
    429,
    60_000,
    1_700_000_000_000,
    i64::MAX,
    i64::MIN,
    i64::MAX / 2,
];

fn pick_name(rng: &mut StdRng, pool: &[String]) -> String {
    if !pool.is_empty() && rng.random_bool(0.6) {
        return pool[rng.random_range(0..pool.len())].clone();
    }
    NAMES[rng.random_range(0..NAMES.len())].to_owned()
}

fn pick_number(rng: &mut StdRng) -> i64 {
    if rng.random_bool(0.3) {
        return rng.random();
    }
    NUMBERS[rng.random_range(0..NUMBERS.len())]
}

fn usage(rng: &mut StdRng) -> Option<ai_router_proto::v1::Usage> {
    rng.random_bool(0.6).then(|| ai_router_proto::v1::Usage {
        prompt_tokens: pick_number(rng) as u64,
        completion_tokens: pick_number(rng) as u64,
        cached_tokens: pick_number(rng) as u64,
        ..Default::default()
    })
}

/// A batch of outcomes as a filter, or anything holding the sync token, could send.
fn report_batch(rng: &mut StdRng, names: &[String]) -> ai_router_proto::v1::ReportBatch {
    use ai_router_proto::v1 as pb;
    let attempts = (0..rng.random_range(0..6))
        .map(|_| pb::AttemptOutcome {
            request_id: pick_name(rng, names),
            attempt: pick_number(rng) as u32,
            provider: pick_name(rng, names),
            key: pick_name(rng, names),
            model: pick_name(rng, names),
            outcome: rng.random_range(-1..5),
            error_class: rng.random_range(-1..16),
            status: pick_number(rng) as u32,
            latency_ms: pick_number(rng) as u64,
            retry_at_ms: pick_number(rng),
            fingerprint: rng.random(),
            provider_code: pick_name(rng, names),
            usage: usage(rng),
            virtual_key_id: pick_name(rng, names),
            at_ms: pick_number(rng),
            after_first_token: rng.random(),
            operation: pick_name(rng, names),
            remaining_requests: pick_number(rng),
            remaining_tokens: pick_number(rng),
            ratelimit_reset_at_ms: pick_number(rng),
            probe: rng.random(),
            stream: rng.random(),
            profile: pick_name(rng, names),
            first_choice_provider: pick_name(rng, names),
            first_choice_model: pick_name(rng, names),
            protocol: pick_name(rng, names),
            content: rng.random_bool(0.2).then(|| pb::AttemptContent {
                request: pick_name(rng, names),
                request_truncated: rng.random(),
                response: pick_name(rng, names),
                ..Default::default()
            }),
        })
        .collect();
    let requests = (0..rng.random_range(0..4))
        .map(|_| pb::RequestOutcome {
            request_id: pick_name(rng, names),
            virtual_key_id: pick_name(rng, names),
            operation: pick_name(rng, names),
            outcome: rng.random_range(-1..6),
            error_class: rng.random_range(-1..16),
            rejected_code: pick_name(rng, names),
            status: pick_number(rng) as u32,
            attempts: pick_number(rng) as u32,
            latency_ms: pick_number(rng) as u64,
            provider: pick_name(rng, names),
            model: pick_name(rng, names),
            usage: usage(rng),
            at_ms: pick_number(rng),
            budget_warnings: vec![pick_name(rng, names)],
            cache_hit: rng.random(),
            requested_model: pick_name(rng, names),
            cache_lookup: rng.random_range(-1..4),
            cache_store: rng.random_range(-1..4),
            ..Default::default()
        })
        .collect();
    pb::ReportBatch {
        node: pick_name(rng, names),
        attempts,
        requests,
        dropped: pick_number(rng) as u64,
        batch_id: pick_name(rng, names),
        in_flight: (0..rng.random_range(0..3))
            .map(|_| pb::KeyLoad {
                provider: pick_name(rng, names),
                key: pick_name(rng, names),
                attempts: pick_number(rng) as u32,
            })
            .collect(),
        in_flight_at_ms: pick_number(rng),
    }
}

/// Flips, drops or inserts a few bytes of an encoded batch (a decoding failure is refused by
/// tonic before the engine sees it; what decodes is applied).
fn mutate_bytes(rng: &mut StdRng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..6) {
        if bytes.is_empty() {
            bytes.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..bytes.len());
        match rng.random_range(0..3) {
            0 => bytes[at] ^= 1 << rng.random_range(0..8),
            1 => {
                bytes.remove(at);
            }
            _ => bytes.insert(at, rng.random()),
        }
    }
}

/// The control plane's side of the sync channel: any `Sync.Report` batch is applied to the
/// engine (breakers, holds, headroom, spend, events) and turned into usage rows, with no panic
/// and in bounded time, and the engine still answers a snapshot after it.
#[test]
fn fuzz_the_report_batches_a_control_plane_applies() {
    use prost::Message as _;
    use std::sync::Arc;

    let env = MapEnv::new([
        ("OPENAI_API_KEY", "sk-fuzz-openai"),
        ("OPENROUTER_API_KEYS", "sk-fuzz-or-1,sk-fuzz-or-2"),
    ]);
    let config = parse(EXAMPLES[0])
        .and_then(|file| file.resolve(&env, Path::new("/nonexistent")))
        .unwrap();
    let config = Arc::new(config);
    let clock = Arc::new(crate::clock::TestClock(std::sync::atomic::AtomicI64::new(
        1_700_000_000_000,
    )));
    let engine = crate::engine::Engine::new(
        config.clone(),
        Arc::new(env),
        clock.clone(),
        Vec::new(),
        crate::store::durable::DurableState::default(),
    );
    let snapshot = engine.current().snapshot.unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for p in &snapshot.providers {
        names.push(p.id.clone());
        names.extend(p.keys.iter().map(|k| k.alias.clone()));
        names.extend(p.models.iter().map(|m| m.id.clone()));
    }
    assert!(!names.is_empty(), "the example pool has providers");

    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut slowest = Duration::ZERO;
    let mut decoded = 0usize;
    for case in 0..cases() {
        let mut batch = report_batch(&mut rng, &names);
        if rng.random_bool(0.5) {
            let mut bytes = batch.encode_to_vec();
            mutate_bytes(&mut rng, &mut bytes);
            match ai_router_proto::v1::ReportBatch::decode(bytes.as_slice()) {
                Ok(b) => batch = b,
                Err(_) => continue,
            }
        }
        decoded += 1;
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.apply_report(&batch);
            let now = clock.0.load(std::sync::atomic::Ordering::SeqCst);
            crate::keys::usage::usage_rows(&config, &batch, now);
            // Time moves on, so holds and leases expire as they would.
            clock.0.fetch_add(
                rng.random_range(0..120_000),
                std::sync::atomic::Ordering::SeqCst,
            );
            assert!(engine.current().snapshot.is_some() || engine.version() > 0);
        }));
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert!(
            outcome.is_ok(),
            "report case {case} (AI_ROUTER_FUZZ_SEED={seed}) panicked on:\n{batch:?}"
        );
        assert!(
            took < Duration::from_secs(10),
            "report case {case} (AI_ROUTER_FUZZ_SEED={seed}) took {took:?} on:\n{batch:?}"
        );
    }
    eprintln!(
        "reports: {} cases ({decoded} applied), slowest {slowest:?}",
        cases()
    );
}
