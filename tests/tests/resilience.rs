//! The spec's Resilience table through a real Envoy, with scripted mock providers: every row
//! (rate limit, quota, auth, a missing secret, transient, network, attempt timeout, a stream
//! broken before its first token, invalid request, deadline), classification per provider kind
//! from the mock's provider error table, breakers (open, half-open with one probe under 20
//! concurrent calls, doubled cooldown, close), waits for a lane that returns before the deadline,
//! the final error mapping, durable and shared state in SQLite, and rotation of a file secret.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::{openai_error_problem, pool_yaml_header, script, Pool, PoolSetup, Reply};
use serde_json::{json, Value};

fn provider_error(name: &str) -> Value {
    json!({ "providerError": name })
}

/// One call of `model`, returning the reply and the keys the mocks saw for it.
async fn call(pool: &Pool, model: &str) -> (Reply, Vec<String>) {
    pool.clear_calls().await.unwrap();
    let r = pool.chat(model).await.unwrap();
    let keys = pool.keys_called().await.unwrap();
    (r, keys)
}

// ---------------------------------------------------------------------------------------------
// Classification per provider kind

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// rate_limit: retried at once on another key; the lane cools down.
    RetryAtOnce,
    /// quota or auth: retried at once on another key, which is then out (no more traffic).
    KeyOut,
    /// transient: retried after backoff; the key is not blacklisted.
    Transient,
    /// invalid_request: returned once, with the provider's status.
    Invalid(u16),
}

/// The backoff of the classification pools: a transient failure's next attempt waits at least
/// half of it, a rate/quota/auth failure's not at all.
const CLASSIFY_BACKOFF_MS: u64 = 1000;

/// One provider per `<kind>.<case>`, each with a `bad` key (weight 100, so it is picked first)
/// answering that error and a `good` key answering the mock's default.
async fn classification_pool(test: &str, cases: &[(&str, &str, Expect)]) -> Pool {
    let cases: Vec<(String, String)> = cases
        .iter()
        .map(|(k, c, _)| (k.to_string(), c.to_string()))
        .collect();
    Pool::start(test, 1, move |mocks, _dir| {
        let mut setup = PoolSetup::default();
        let mut yaml = pool_yaml_header();
        yaml.push_str("providers:\n");
        for (i, (kind, case)) in cases.iter().enumerate() {
            setup.secret_env(&format!("CL_{i}_BAD"), &format!("{kind}.{case}/bad"));
            setup.secret_env(&format!("CL_{i}_GOOD"), &format!("{kind}.{case}/good"));
            yaml.push_str(&format!(
                "  - id: {kind}-{case}\n    kind: {kind}\n    baseUrl: {}/{kind}/v1\n    keys:\n      - {{ alias: bad, env: CL_{i}_BAD, weight: 100 }}\n      - {{ alias: good, env: CL_{i}_GOOD }}\n    models: [{{ id: m-{i} }}]\n",
                mocks[0]
            ));
        }
        yaml.push_str(&format!(
            "resilience:\n  rateLimitCooldownMs: 500\n  quotaBlacklistMs: 3600000\n  keyBreaker: {{ failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }}\n  providerBreaker: {{ failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }}\n  backoff: {{ baseMs: {CLASSIFY_BACKOFF_MS}, factor: 1, maxMs: {CLASSIFY_BACKOFF_MS} }}\n"
        ));
        setup.yaml = yaml;
        Ok(setup)
    })
    .await
    .expect("fixture")
}

async fn check_classification(test: &str, cases: &[(&str, &str, Expect)]) {
    let pool = classification_pool(test, cases).await;
    let rules: Vec<Value> = cases
        .iter()
        .enumerate()
        .map(|(i, (kind, case, _))| {
            let secret = pool
                .control_plane_env()
                .iter()
                .find(|(k, _)| *k == format!("CL_{i}_BAD"))
                .map(|(_, v)| v.clone())
                .unwrap();
            script::for_key(&secret, vec![provider_error(&format!("{kind}.{case}"))])
        })
        .collect();
    pool.mocks[0].script(json!(rules)).await.unwrap();

    let mut problems: Vec<String> = Vec::new();
    let mut out_cases = Vec::new();
    for (i, (kind, case, expect)) in cases.iter().enumerate() {
        let name = format!("{kind}.{case}");
        let bad = format!("{name}/bad");
        let good = format!("{name}/good");
        let model = format!("m-{i}");
        let started = Instant::now();
        let (r, keys) = call(&pool, &model).await;
        let took = started.elapsed();
        let attempts = r.header("x-ai-router-attempts");
        match expect {
            Expect::RetryAtOnce | Expect::KeyOut | Expect::Transient => {
                if r.status != 200 || keys != [bad.clone(), good.clone()] {
                    problems.push(format!(
                        "{name} ({expect:?}): the first call should fail on bad and be retried on good; keys {keys:?}, reply {} {}",
                        r.status, r.text
                    ));
                    continue;
                }
                if attempts.as_deref() != Some("2") {
                    problems.push(format!(
                        "{name}: x-ai-router-attempts {attempts:?}, expected 2"
                    ));
                }
                let at_once = took < Duration::from_millis(CLASSIFY_BACKOFF_MS * 2 / 5);
                match expect {
                    Expect::Transient if took < Duration::from_millis(CLASSIFY_BACKOFF_MS / 2 - 20) => problems.push(format!(
                        "{name}: a transient failure is retried after backoff (>= {} ms), the call took {took:?}",
                        CLASSIFY_BACKOFF_MS / 2
                    )),
                    Expect::RetryAtOnce | Expect::KeyOut if !at_once => problems.push(format!(
                        "{name}: rate/quota/auth failures go to the next key without waiting, the call took {took:?} (backoff {CLASSIFY_BACKOFF_MS} ms)"
                    )),
                    _ => {}
                }
                let (r2, keys2) = call(&pool, &model).await;
                let want: Vec<String> = if *expect == Expect::Transient {
                    vec![bad.clone(), good.clone()]
                } else {
                    vec![good.clone()]
                };
                if r2.status != 200 || keys2 != want {
                    problems.push(format!(
                        "{name} ({expect:?}): the next call should go to {want:?}, went to {keys2:?} ({} {})",
                        r2.status, r2.text
                    ));
                }
                if *expect == Expect::KeyOut {
                    out_cases.push((name, model, bad));
                }
            }
            Expect::Invalid(status) => {
                if let Some(p) = openai_error_problem(&r, *status, "upstream_invalid_request") {
                    problems.push(format!("{name}: {p}"));
                }
                if keys != [bad.clone()] || attempts.as_deref() != Some("1") {
                    problems.push(format!(
                        "{name}: an invalid request is returned once, not retried; keys {keys:?}, attempts {attempts:?}"
                    ));
                }
                let (r2, keys2) = call(&pool, &model).await;
                if keys2 != [bad.clone()] {
                    problems.push(format!(
                        "{name}: an invalid request is no lane failure; the next call should try bad again, went to {keys2:?} ({})",
                        r2.status
                    ));
                }
            }
        }
    }
    // Past rateLimitCooldownMs (500 ms): a rate-limited key would be back, a blacklisted one is
    // still out.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for (name, model, bad) in &out_cases {
        for _ in 0..3 {
            let (r, keys) = call(&pool, model).await;
            if r.status != 200 || keys.contains(bad) {
                problems.push(format!(
                    "{name}: a blacklisted key (quota/auth) got traffic again after 700 ms: keys {keys:?}, reply {}",
                    r.status
                ));
                break;
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} classification problems:\n- {}",
        problems.len(),
        problems.join("\n- ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_and_openrouter_errors_are_classified_per_the_resilience_table() {
    use Expect::*;
    check_classification(
        "classify_anthropic_openrouter",
        &[
            ("anthropic", "rate_limited", RetryAtOnce),
            ("anthropic", "quota_exhausted", KeyOut),
            ("anthropic", "spend_cap", KeyOut),
            ("anthropic", "billing_error", KeyOut),
            ("anthropic", "invalid_key", KeyOut),
            ("anthropic", "permission_denied", KeyOut),
            ("anthropic", "overloaded", Transient),
            ("anthropic", "api_error", Transient),
            ("anthropic", "bad_request", Invalid(400)),
            ("openrouter", "rate_limited", RetryAtOnce),
            ("openrouter", "free_daily", KeyOut),
            ("openrouter", "quota_exhausted", KeyOut),
            ("openrouter", "key_limit", KeyOut),
            ("openrouter", "invalid_key", KeyOut),
            ("openrouter", "overloaded", Transient),
            ("openrouter", "bad_request", Invalid(400)),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_kinds_errors_are_classified_per_the_resilience_table() {
    use Expect::*;
    check_classification(
        "classify_other_kinds",
        &[
            ("openai", "rate_limited", RetryAtOnce),
            ("openai", "tokens_rate_limited", RetryAtOnce),
            ("openai", "quota_exhausted", KeyOut),
            ("openai", "billing_hard_limit", KeyOut),
            ("openai", "invalid_key", KeyOut),
            ("openai", "overloaded", Transient),
            ("openai", "bad_request", Invalid(400)),
            ("qwen", "rate_limited", RetryAtOnce),
            ("qwen", "quota_exhausted", KeyOut),
            ("qwen", "free_tier_exhausted", KeyOut),
            ("qwen", "invalid_key", KeyOut),
            ("qwen", "overloaded", Transient),
            ("qwen", "bad_request", Invalid(400)),
            ("deepseek", "rate_limited", RetryAtOnce),
            ("deepseek", "quota_exhausted", KeyOut),
            ("deepseek", "invalid_key", KeyOut),
            ("deepseek", "overloaded", Transient),
            ("deepseek", "bad_request", Invalid(400)),
            ("gemini", "rate_limited", RetryAtOnce),
            ("gemini", "quota_exhausted", KeyOut),
            ("gemini", "free_daily", KeyOut),
            ("gemini", "invalid_key", KeyOut),
            ("gemini", "overloaded", Transient),
            ("gemini", "bad_request", Invalid(400)),
            ("groq", "rate_limited", RetryAtOnce),
            ("groq", "quota_exhausted", KeyOut),
            ("groq", "invalid_key", KeyOut),
            ("groq", "overloaded", Transient),
            ("groq", "flex_capacity", Transient),
            ("groq", "bad_request", Invalid(400)),
            ("openai-compatible", "rate_limited", RetryAtOnce),
            ("openai-compatible", "quota_exhausted", KeyOut),
            ("openai-compatible", "invalid_key", KeyOut),
            ("openai-compatible", "overloaded", Transient),
            ("openai-compatible", "bad_request", Invalid(400)),
        ],
    )
    .await;
}
