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
