//! The spec's Resilience table through a real Envoy, with scripted mock providers: every row
//! (rate limit, quota, auth, a missing secret, transient, network, attempt timeout, a stream
//! broken before its first token, invalid request, deadline), classification per provider kind
//! from the mock's provider error table, breakers (open, half-open with one probe under 20
//! concurrent calls, doubled cooldown, close), waits for a lane that returns before the deadline,
//! the final error mapping, durable and shared state in SQLite, and rotation of a file secret.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::{openai_error_problem, poll, pool_yaml_header, script, Pool, PoolSetup, Reply};
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

/// The free-tier kinds: each one's real error bodies, a context-length answer included (with
/// no larger lane it stops the call like any other 400), and Gemini's refused key type, which
/// puts the key out for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_free_tier_kinds_errors_are_classified_per_the_resilience_table() {
    use Expect::*;
    check_classification(
        "classify_free_tier_kinds",
        &[
            ("mistral", "rate_limited", RetryAtOnce),
            ("mistral", "quota_exhausted", KeyOut),
            ("mistral", "invalid_key", KeyOut),
            ("mistral", "overloaded", Transient),
            ("mistral", "bad_request", Invalid(400)),
            ("mistral", "context_length", Invalid(400)),
            ("cerebras", "rate_limited", RetryAtOnce),
            ("cerebras", "quota_exhausted", KeyOut),
            ("cerebras", "invalid_key", KeyOut),
            ("cerebras", "overloaded", Transient),
            ("cerebras", "bad_request", Invalid(400)),
            ("cerebras", "context_length", Invalid(400)),
            ("kimi", "rate_limited", RetryAtOnce),
            ("kimi", "quota_exhausted", KeyOut),
            ("kimi", "invalid_key", KeyOut),
            ("kimi", "overloaded", Transient),
            ("kimi", "bad_request", Invalid(400)),
            ("kimi", "context_length", Invalid(400)),
            ("github", "rate_limited", RetryAtOnce),
            ("github", "quota_exhausted", KeyOut),
            ("github", "invalid_key", KeyOut),
            ("github", "overloaded", Transient),
            ("github", "bad_request", Invalid(400)),
            ("github", "context_length", Invalid(413)),
            ("nvidia", "rate_limited", RetryAtOnce),
            ("nvidia", "quota_exhausted", KeyOut),
            ("nvidia", "invalid_key", KeyOut),
            ("nvidia", "overloaded", Transient),
            ("nvidia", "bad_request", Invalid(400)),
            ("nvidia", "context_length", Invalid(400)),
            ("sambanova", "rate_limited", RetryAtOnce),
            ("sambanova", "quota_exhausted", KeyOut),
            ("sambanova", "invalid_key", KeyOut),
            ("sambanova", "overloaded", Transient),
            ("sambanova", "bad_request", Invalid(400)),
            ("sambanova", "context_length", Invalid(400)),
            ("cloudflare", "rate_limited", RetryAtOnce),
            ("cloudflare", "quota_exhausted", KeyOut),
            ("cloudflare", "invalid_key", KeyOut),
            ("cloudflare", "overloaded", Transient),
            ("cloudflare", "bad_request", Invalid(400)),
            ("cloudflare", "context_length", Invalid(400)),
            ("cohere", "rate_limited", RetryAtOnce),
            ("cohere", "quota_exhausted", KeyOut),
            ("cohere", "invalid_key", KeyOut),
            ("cohere", "overloaded", Transient),
            ("cohere", "bad_request", Invalid(400)),
            ("cohere", "context_length", Invalid(400)),
            ("siliconflow", "rate_limited", RetryAtOnce),
            ("siliconflow", "quota_exhausted", KeyOut),
            ("siliconflow", "invalid_key", KeyOut),
            ("siliconflow", "overloaded", Transient),
            ("siliconflow", "bad_request", Invalid(400)),
            ("siliconflow", "context_length", Invalid(400)),
            ("zai", "rate_limited", RetryAtOnce),
            ("zai", "quota_exhausted", KeyOut),
            ("zai", "invalid_key", KeyOut),
            ("zai", "overloaded", Transient),
            ("zai", "bad_request", Invalid(400)),
            ("zai", "context_length", Invalid(400)),
            ("gemini", "unsupported_key_type", KeyOut),
            ("qwen", "free_daily", KeyOut),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Single rows, breakers, waits and the final error mapping

/// On one mock: provider `p1` (keys `a`, `b`, model `m1`) and `p2` (key `c`, model `m2`), then
/// `extra` (defaults, profiles, resilience...). Keys are named `a`, `b`, `c` at the mock.
fn two_providers(mock: &str, p1_keys: &str, extra: &str) -> PoolSetup {
    let mut setup = PoolSetup::default();
    setup.secret_env("RS_KEY_A", "a");
    setup.secret_env("RS_KEY_B", "b");
    setup.secret_env("RS_KEY_C", "c");
    setup.yaml = format!(
        "{}providers:\n  - id: p1\n    baseUrl: {mock}/p1/v1\n    keys: {p1_keys}\n    models: [{{ id: m1 }}]\n  - id: p2\n    baseUrl: {mock}/p2/v1\n    keys: [{{ alias: c, env: RS_KEY_C }}]\n    models: [{{ id: m2 }}]\n{extra}",
        pool_yaml_header()
    );
    setup
}

const AB: &str = "[{ alias: a, env: RS_KEY_A }, { alias: b, env: RS_KEY_B }]";

fn secret(pool: &Pool, var: &str) -> String {
    pool.control_plane_env()
        .iter()
        .find(|(k, _)| k == var)
        .map(|(_, v)| v.clone())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_breaker_opens_half_opens_with_one_probe_under_20_concurrent_calls_and_closes() {
    let pool = Pool::start("breaker", 1, |m, _| {
        Ok(two_providers(
            &m[0],
            "[{ alias: a, env: RS_KEY_A }]",
            "defaults: { fallbacks: [m2], deadlineMs: 20000 }\nresilience:\n  keyBreaker: { failureThreshold: 2, cooldownMs: 600, maxCooldownMs: 5000 }\n  providerBreaker: { failureThreshold: 100, cooldownMs: 600, maxCooldownMs: 5000 }\n  backoff: { baseMs: 10, factor: 1, maxMs: 10 }\n",
        ))
    })
    .await
    .expect("fixture");
    let a = secret(&pool, "RS_KEY_A");
    let fail = script::status(
        503,
        json!({}),
        Some(
            json!({"error": {"message": "down", "type": "server_error", "param": null, "code": null}}),
        ),
    );
    pool.mocks[0]
        .script(json!([
            script::for_key(&a, vec![fail.clone()]),
            script::always(vec![script::text("from c")]),
        ]))
        .await
        .unwrap();

    // Closed: m1 (key a) is preferred; each call fails on a and falls back to c. After two
    // consecutive failures the breaker opens and calls go straight to c.
    let mut a_failures = Vec::new();
    let opened_by = Instant::now() + Duration::from_secs(10);
    let opened = loop {
        let (r, keys) = call(&pool, "m1").await;
        assert_eq!(r.status, 200, "{r}");
        if keys.first().map(String::as_str) == Some("a") {
            assert_eq!(keys, ["a", "c"], "a failure of a falls back to c");
            a_failures.push(Instant::now());
        } else {
            assert_eq!(keys, ["c"]);
            break Instant::now();
        }
        assert!(
            Instant::now() < opened_by,
            "the breaker never opened: {} failures of a",
            a_failures.len()
        );
    };
    assert!(
        a_failures.len() >= 2,
        "the breaker opened after {} failure(s), failureThreshold is 2",
        a_failures.len()
    );
    let last_failure = *a_failures.last().unwrap();
    assert!(opened > last_failure);

    // Open, then half-open: sequential calls; each a-call is a probe, which fails and reopens
    // the breaker with the cooldown doubled (600, 1200, ...).
    let mut probes = Vec::new();
    let phase = Instant::now();
    while probes.len() < 2 && phase.elapsed() < Duration::from_secs(10) {
        let (r, keys) = call(&pool, "m1").await;
        assert_eq!(r.status, 200, "{r}");
        if keys.iter().any(|k| k == "a") {
            assert_eq!(keys, ["a", "c"], "a failed probe falls back to c");
            probes.push(Instant::now());
        } else {
            assert_eq!(keys, ["c"]);
        }
    }
    assert_eq!(probes.len(), 2, "two probes of key a within 10 s");
    let first_gap = probes[0] - last_failure;
    let second_gap = probes[1] - probes[0];
    assert!(
        first_gap >= Duration::from_millis(500),
        "the first probe came {first_gap:?} after the breaker opened (cooldownMs 600)"
    );
    assert!(
        second_gap >= Duration::from_millis(1100),
        "after a failed probe the cooldown doubles to 1200 ms; the next probe came after {second_gap:?}"
    );

    // Key a recovers (slowly, so the probe is in flight while the others arrive). Batches of
    // 20 concurrent calls until one reaches a: that batch sends exactly one request, the probe.
    pool.mocks[0]
        .script(json!([
            script::for_key(&a, vec![json!({ "text": "from a", "latencyMs": 600 })]),
            script::always(vec![script::text("from c")]),
        ]))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        pool.clear_calls().await.unwrap();
        let replies = futures::future::join_all((0..20).map(|_| {
            let client = pool.client.clone();
            let key = pool.virtual_key.clone();
            async move { client.chat("m1", Some(&key)).await.unwrap() }
        }))
        .await;
        for r in &replies {
            assert_eq!(r.status, 200, "{r}");
        }
        let keys = pool.keys_called().await.unwrap();
        let to_a = keys.iter().filter(|k| *k == "a").count();
        if to_a > 0 {
            assert_eq!(
                to_a, 1,
                "a half-open breaker lets exactly one probe through; 20 concurrent calls sent {to_a} requests to key a: {keys:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no probe reached key a within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The probe succeeded: closed, key a serves again.
    let r = poll("key a to serve again", Duration::from_secs(5), || {
        let pool = &pool;
        async move {
            let (r, keys) = call(pool, "m1").await;
            Ok((keys == ["a"]).then_some(r))
        }
    })
    .await
    .unwrap();
    assert_eq!(r.content(), Some("from a"), "{r}");
    for i in 0..4 {
        let (r, keys) = call(&pool, "m1").await;
        assert_eq!(
            (r.status, keys.as_slice()),
            (200, &["a".to_string()][..]),
            "call {i} after the breaker closed: {r}"
        );
        assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m1"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waits_for_a_retry_after_shorter_than_its_deadline_and_one_with_a_shorter_deadline_fails_at_once(
) {
    // One key, two models: the lane (key and model) of each cools down on its own.
    let pool = Pool::start("wait_or_fail", 1, |m, _| {
        let mut setup = PoolSetup::default();
        setup.secret_env("W_KEY", "k");
        setup.yaml = format!(
            "{}providers:\n  - id: p\n    baseUrl: {}/v1\n    keys: [{{ alias: k, env: W_KEY }}]\n    models: [{{ id: m-wait }}, {{ id: m-fail }}]\nprofiles:\n  patient: {{ model: m-wait, deadlineMs: 6000 }}\n  hasty: {{ model: m-fail, deadlineMs: 2000 }}\nresilience:\n  backoff: {{ baseMs: 10, factor: 1, maxMs: 10 }}\n",
            pool_yaml_header(),
            m[0]
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let limited = |s: &str| {
        script::status(
            429,
            json!({ "retry-after": s }),
            Some(
                json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
            ),
        )
    };
    pool.mocks[0]
        .script(json!([
            script::rule(
                json!({ "model": "m-wait" }),
                vec![limited("2"), script::text("waited")]
            ),
            script::rule(
                json!({ "model": "m-fail" }),
                vec![limited("5"), script::text("too late")]
            ),
        ]))
        .await
        .unwrap();

    let started = Instant::now();
    let (r, keys) = call(&pool, "patient").await;
    let took = started.elapsed();
    assert_eq!(
        r.status, 200,
        "a retry-after of 2 s within a 6 s deadline is waited for:\n{r}"
    );
    assert_eq!(r.content(), Some("waited"), "{r}");
    assert_eq!(keys, ["k", "k"], "the same lane, after its retry-after");
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("2"),
        "{r}"
    );
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_millis(5500),
        "the call waited {took:?} for a retry-after of 2 s"
    );

    let started = Instant::now();
    let (r, keys) = call(&pool, "hasty").await;
    let took = started.elapsed();
    if let Some(p) = openai_error_problem(&r, 503, "pool_rate_limited") {
        panic!("a retry-after of 5 s past a 2 s deadline: {p}");
    }
    assert!(
        took < Duration::from_millis(1000),
        "it fails at once, not at the deadline: took {took:?}"
    );
    let retry_after: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After in seconds:\n{r}"));
    assert!(
        (3..=5).contains(&retry_after),
        "Retry-After {retry_after}, expected about 5:\n{r}"
    );
    assert_eq!(keys, ["k"], "one attempt, no waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_key_fails_the_final_error_follows_the_class_of_the_failures() {
    // One provider per case, two keys each, so blacklists of one case do not touch another.
    let cases = ["r429", "a401", "q402", "q2", "t5xx", "slow"];
    let pool = Pool::start("final_errors", 1, move |m, _| {
        let mut setup = PoolSetup::default();
        let mut yaml = format!("{}providers:\n", pool_yaml_header());
        for c in cases {
            let up = c.to_uppercase();
            setup.secret_env(&format!("FE_{up}_1"), &format!("{c}-1"));
            setup.secret_env(&format!("FE_{up}_2"), &format!("{c}-2"));
            yaml.push_str(&format!(
                "  - id: {c}\n    baseUrl: {}/{c}/v1\n    keys: [{{ alias: k1, env: FE_{up}_1 }}, {{ alias: k2, env: FE_{up}_2 }}]\n    models: [{{ id: m-{c} }}]\n",
                m[0]
            ));
        }
        yaml.push_str("defaults: { deadlineMs: 4000 }\nprofiles:\n  slow: { model: m-slow, deadlineMs: 700 }\n  spent: { model: m-q2, maxAttempts: 2 }\nresilience:\n  backoff: { baseMs: 10, factor: 1, maxMs: 10 }\n  keyBreaker: { failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }\n  providerBreaker: { failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }\n");
        setup.yaml = yaml;
        Ok(setup)
    })
    .await
    .expect("fixture");
    pool.mocks[0]
        .script(json!([
            script::rule(
                json!({ "model": "m-r429" }),
                vec![script::status(429, json!({ "retry-after": "30" }), None)]
            ),
            script::rule(
                json!({ "model": "m-a401" }),
                vec![provider_error("openai.invalid_key")]
            ),
            script::rule(
                json!({ "model": "m-q402" }),
                vec![provider_error("openrouter.quota_exhausted")]
            ),
            script::rule(
                json!({ "model": "m-q2" }),
                vec![provider_error("openrouter.quota_exhausted")]
            ),
            script::rule(
                json!({ "model": "m-t5xx" }),
                vec![provider_error("openai.overloaded")]
            ),
            script::rule(
                json!({ "model": "m-slow" }),
                vec![json!({ "latencyMs": 3000, "text": "late" })]
            ),
        ]))
        .await
        .unwrap();

    // A spent key with no window named is out for quotaBlacklistMs (6 h): every answer says
    // so, the one whose last attempt met the quota as much as one that found no lane left.
    let six_hours = Some(21_500..=21_600);
    let mut problems = Vec::new();
    for (model, status, code, retry_after) in [
        ("m-r429", 503, "pool_rate_limited", Some(25..=30)),
        ("m-a401", 503, "pool_auth_failed", Some(1..=300)),
        ("m-q402", 503, "pool_quota_exhausted", six_hours.clone()),
        ("spent", 503, "pool_quota_exhausted", six_hours),
        ("m-t5xx", 502, "upstream_error", None),
        ("slow", 504, "pool_timeout", None),
    ] {
        let started = Instant::now();
        let (r, keys) = call(&pool, model).await;
        let took = started.elapsed();
        if let Some(p) = openai_error_problem(&r, status, code) {
            problems.push(format!("{model}: {p}\nkeys tried: {keys:?}"));
            continue;
        }
        if let Some(range) = retry_after {
            match r.header("retry-after").and_then(|v| v.parse::<u64>().ok()) {
                Some(s) if range.contains(&s) => {}
                other => problems.push(format!(
                    "{model}: Retry-After {other:?}, expected within {range:?}"
                )),
            }
        }
        if !r.json["error"]["trail"].is_object() {
            problems.push(format!(
                "{model}: a final error without its trail: {}",
                r.text
            ));
        }
        if model == "slow" {
            if took > Duration::from_millis(2500) {
                problems.push(format!("slow: a 700 ms deadline answered after {took:?}"));
            }
        } else {
            let mut distinct = keys.clone();
            distinct.sort();
            distinct.dedup();
            let c = if model == "spent" {
                "q2"
            } else {
                model.trim_start_matches("m-")
            };
            if distinct != [format!("{c}-1"), format!("{c}-2")] {
                problems.push(format!(
                    "{model}: both keys are tried before the final error; keys {keys:?}"
                ));
            }
            // A rate-limited, refused or spent key is never tried twice in one call.
            if model != "m-t5xx" && keys.len() != 2 {
                problems.push(format!("{model}: each key once; keys {keys:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// Calls `model` until a call tries key `name` first (equal keys alternate); returns it.
async fn call_until_first(pool: &Pool, model: &str, name: &str) -> (Reply, Vec<String>) {
    for _ in 0..8 {
        let (r, keys) = call(pool, model).await;
        if keys.first().map(String::as_str) == Some(name) {
            return (r, keys);
        }
    }
    panic!("eight calls never started on key {name}");
}

/// Makes `n` calls of `model` and returns every key they reached.
async fn keys_of_calls(pool: &Pool, model: &str, n: usize) -> Vec<String> {
    let mut all = Vec::new();
    for i in 0..n {
        let (r, keys) = call(pool, model).await;
        assert_eq!(r.status, 200, "call {i}: {r}");
        all.extend(keys);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_exhausted_key_stays_out_across_a_control_plane_restart_with_the_sqlite_store() {
    let mut pool = Pool::start("quota_restart", 1, |m, dir| {
        let state = dir.join("state.sqlite");
        Ok(two_providers(
            &m[0],
            AB,
            &format!(
                "stateStore: {{ type: sqlite, path: {} }}\nresilience:\n  quotaBlacklistMs: 3600000\n  backoff: {{ baseMs: 10, factor: 1, maxMs: 10 }}\n",
                state.display()
            ),
        ))
    })
    .await
    .expect("fixture");
    let a = secret(&pool, "RS_KEY_A");
    pool.mocks[0]
        .script(json!([script::for_key(
            &a,
            vec![provider_error("openai.quota_exhausted")]
        )]))
        .await
        .unwrap();
    let (r, keys) = call_until_first(&pool, "m1", "a").await;
    assert_eq!(
        (r.status, keys.as_slice()),
        (200, &["a".to_string(), "b".to_string()][..]),
        "{r}"
    );
    let keys = keys_of_calls(&pool, "m1", 4).await;
    assert!(
        keys.iter().all(|k| k == "b"),
        "the blacklisted key got traffic: {keys:?}"
    );

    // A new control plane process on the same state file, and a new Envoy that knows only what
    // the new control plane pushes.
    pool.cp.restart(&[]).await.unwrap();
    pool.restart_envoy().await.unwrap();
    let keys = keys_of_calls(&pool, "m1", 8).await;
    assert!(
        keys.iter().all(|k| k == "b"),
        "after the restart the quota-exhausted key got traffic again: {keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_blacklist_without_a_provider_window_ends_after_quota_blacklist_ms() {
    let pool = Pool::start("quota_window", 1, |m, _| {
        Ok(two_providers(&m[0], AB, "resilience:\n  quotaBlacklistMs: 1500\n  backoff: { baseMs: 10, factor: 1, maxMs: 10 }\n"))
    })
    .await
    .expect("fixture");
    let a = secret(&pool, "RS_KEY_A");
    pool.mocks[0]
        .script(json!([script::for_key(
            &a,
            vec![
                provider_error("openai.quota_exhausted"),
                script::text("from a")
            ]
        )]))
        .await
        .unwrap();
    let (r, keys) = call_until_first(&pool, "m1", "a").await;
    let out_at = Instant::now();
    assert_eq!(keys, ["a", "b"], "{r}");
    let keys = keys_of_calls(&pool, "m1", 4).await;
    assert!(keys.iter().all(|k| k == "b"), "{keys:?}");
    let back = poll("key a to serve again", Duration::from_secs(10), || {
        let pool = &pool;
        async move {
            let (_, keys) = call(pool, "m1").await;
            Ok(keys.contains(&"a".to_string()).then(|| out_at.elapsed()))
        }
    })
    .await
    .unwrap();
    assert!(
        back >= Duration::from_millis(1300),
        "key a came back after {back:?}, quotaBlacklistMs is 1500"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_file_brings_an_auth_blacklisted_key_back_without_a_restart() {
    let pool = Pool::start("rotated_file", 1, |m, dir| {
        let old = format!("sk-file-old-{}", ai_router_e2e::random_hex(24));
        let path = dir.write("key_a.txt", &format!("{old}\n"))?;
        let mut setup = two_providers(
            &m[0],
            &format!(
                "[{{ alias: a, file: {} }}, {{ alias: b, env: RS_KEY_B }}]",
                path.display()
            ),
            "resilience:\n  backoff: { baseMs: 10, factor: 1, maxMs: 10 }\n",
        );
        setup.name_secret(&old, "a-old");
        Ok(setup)
    })
    .await
    .expect("fixture");
    // Every request with an unknown key (the old file secret) is refused; the rest succeed.
    let b = secret(&pool, "RS_KEY_B");
    let c = secret(&pool, "RS_KEY_C");
    pool.mocks[0]
        .script(json!([
            script::for_key(&b, vec![script::text("from b")]),
            script::for_key(&c, vec![script::text("from c")]),
            script::always(vec![provider_error("openai.invalid_key")]),
        ]))
        .await
        .unwrap();
    let (r, keys) = call_until_first(&pool, "m1", "a-old").await;
    assert_eq!(keys, ["a-old", "b"], "{r}");
    let keys = keys_of_calls(&pool, "m1", 4).await;
    assert!(
        keys.iter().all(|k| k == "b"),
        "the refused key got traffic: {keys:?}"
    );

    // Re-seal the file: the control plane re-reads it (about every second) and lifts the
    // blacklist; the new secret reaches the mock.
    let new = format!("sk-file-new-{}", ai_router_e2e::random_hex(24));
    pool.dir.write("key_a.txt", &format!("{new}\n")).unwrap();
    pool.mocks[0]
        .script(json!([
            script::for_key(&new, vec![script::text("from new a")]),
            script::for_key(&b, vec![script::text("from b")]),
            script::always(vec![provider_error("openai.invalid_key")]),
        ]))
        .await
        .unwrap();
    let r = poll("the rotated key to serve", Duration::from_secs(10), || {
        let pool = &pool;
        async move {
            let (r, _) = call(pool, "m1").await;
            Ok((r.content() == Some("from new a")).then_some(r))
        }
    })
    .await
    .unwrap();
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("1"),
        "{r}"
    );
    let calls = pool.calls().await.unwrap();
    assert!(
        calls.iter().all(|c| c.key != "a-old"),
        "the old secret is not sent once the file changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_secret_variable_is_unset_gets_no_traffic() {
    let pool = Pool::start("missing_secret", 1, |m, _| {
        Ok(two_providers(
            &m[0],
            "[{ alias: a, env: RS_KEY_A }, { alias: unset, env: RS_KEY_NEVER_SET }]",
            "",
        ))
    })
    .await
    .expect("fixture");
    let keys = keys_of_calls(&pool, "m1", 8).await;
    assert_eq!(
        keys,
        vec!["a".to_string(); 8],
        "only the key with a secret is used"
    );
    let calls = pool.calls().await.unwrap();
    assert!(
        calls.iter().all(|c| c.call.key.is_some()),
        "a request went out without a key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_failures_attempt_timeouts_and_streams_broken_before_the_first_token_are_retried_after_backoff(
) {
    let pool = Pool::start("transient_rows", 1, |m, _| {
        Ok(two_providers(
            &m[0],
            AB,
            "defaults: { timeoutMs: 500 }\nresilience:\n  backoff: { baseMs: 400, factor: 1, maxMs: 400 }\n  keyBreaker: { failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }\n  providerBreaker: { failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }\n",
        ))
    })
    .await
    .expect("fixture");
    let a = secret(&pool, "RS_KEY_A");
    for (what, reply) in [
        ("a connection failure", json!({ "error": "network" })),
        (
            "an attempt timeout",
            json!({ "latencyMs": 3000, "text": "too late" }),
        ),
        (
            "a stream broken before the first token",
            script::stream_failing(&["x", "y"], 0, "network"),
        ),
    ] {
        pool.mocks[0]
            .script(json!([script::for_key(&a, vec![reply])]))
            .await
            .unwrap();
        let stream = what.contains("stream");
        let mut tried_a = None;
        for _ in 0..8 {
            pool.clear_calls().await.unwrap();
            let started = Instant::now();
            let (status, text) = if stream {
                let s = pool
                    .client
                    .stream("m1", Some(&pool.virtual_key))
                    .await
                    .unwrap();
                (s.status, s.text())
            } else {
                let r = pool.chat("m1").await.unwrap();
                (r.status, r.content().unwrap_or_default().to_string())
            };
            let took = started.elapsed();
            let keys = pool.keys_called().await.unwrap();
            if keys.first().map(String::as_str) == Some("a") {
                tried_a = Some((status, text, keys, took));
                break;
            }
        }
        let (status, text, keys, took) =
            tried_a.unwrap_or_else(|| panic!("{what}: no call started on a"));
        assert_eq!(status, 200, "{what}: {text}");
        assert_eq!(keys, ["a", "b"], "{what}: retried on the other key");
        assert!(
            text.starts_with("Hello"),
            "{what}: the answer is b's, not a's: {text:?}"
        );
        assert!(
            took >= Duration::from_millis(190),
            "{what}: retried after backoff (>= 200 ms), took {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_sharing_an_sqlite_state_store_share_a_blacklist() {
    let mut pool = Pool::start("shared_sqlite", 1, |m, dir| {
        let state = dir.join("state.sqlite");
        Ok(two_providers(
            &m[0],
            AB,
            &format!("stateStore: {{ type: sqlite, path: {} }}\nresilience:\n  backoff: {{ baseMs: 10, factor: 1, maxMs: 10 }}\n", state.display()),
        ))
    })
    .await
    .expect("fixture");
    let other = pool.start_other("cp2").await.unwrap();
    let other_client = ai_router_e2e::Client::new(&pool.others[other].1.base_url()).unwrap();
    // Before: the second Envoy uses both keys.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        pool.clear_calls().await.unwrap();
        let r = other_client
            .chat("m1", Some(&pool.virtual_key))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{r}");
        seen.extend(pool.keys_called().await.unwrap());
    }
    assert!(seen.contains("a") && seen.contains("b"), "{seen:?}");

    // Key a is refused through the first Envoy (its control plane writes the blacklist).
    let a = secret(&pool, "RS_KEY_A");
    pool.mocks[0]
        .script(json!([script::for_key(
            &a,
            vec![provider_error("openai.invalid_key")]
        )]))
        .await
        .unwrap();
    let (r, keys) = call_until_first(&pool, "m1", "a").await;
    assert_eq!(keys, ["a", "b"], "{r}");

    // The second Envoy, synced to the second control plane, stops using a.
    poll(
        "the second Envoy to avoid key a",
        Duration::from_secs(10),
        || {
            let pool = &pool;
            let c = other_client.clone();
            async move {
                let mut keys = Vec::new();
                for _ in 0..4 {
                    pool.clear_calls().await?;
                    let r = c.chat("m1", Some(&pool.virtual_key)).await?;
                    anyhow::ensure!(r.status == 200, "{r}");
                    keys.extend(pool.keys_called().await?);
                }
                Ok(keys.iter().all(|k| k == "b").then_some(()))
            }
        },
    )
    .await
    .unwrap();
    for i in 0..6 {
        pool.clear_calls().await.unwrap();
        let r = other_client
            .chat("m1", Some(&pool.virtual_key))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(
            pool.keys_called().await.unwrap(),
            ["b"],
            "call {i} through the second Envoy"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_past_its_daily_budget_is_out_until_the_next_utc_day() {
    let pool = Pool::start("provider_budget", 1, |m, _| {
        let mock = &m[0];
        let mut setup = PoolSetup::default();
        setup.secret_env("RS_KEY_A", "a");
        setup.secret_env("RS_KEY_C", "c");
        // One call costs far more than the day's budget: (prompt + 8 completion tokens) x 1000
        // per million tokens.
        setup.yaml = format!(
            "{}providers:\n  - id: p1\n    baseUrl: {mock}/p1/v1\n    budget: {{ costPerDay: 0.001 }}\n    keys: [{{ alias: a, env: RS_KEY_A }}]\n    models: [{{ id: m1, aliases: [chat], cost: {{ input: 1000, output: 1000 }} }}]\n  - id: p2\n    baseUrl: {mock}/p2/v1\n    keys: [{{ alias: c, env: RS_KEY_C }}]\n    models: [{{ id: m1, aliases: [chat] }}]\n",
            pool_yaml_header()
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    // Equal lanes alternate, so p1 serves one of the first calls and spends past its budget.
    let mut first = Vec::new();
    for _ in 0..2 {
        let (r, keys) = call(&pool, "chat").await;
        assert_eq!(r.status, 200, "{r}");
        first.extend(keys);
    }
    assert!(
        first.contains(&"a".to_string()),
        "p1 served before its budget was spent: {first:?}"
    );
    // Once the spend is reported and pushed, p1 is out: every call goes to p2.
    let mut streak = 0;
    let started = Instant::now();
    while streak < 6 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "p1 still serves past its budget"
        );
        let (r, keys) = call(&pool, "chat").await;
        assert_eq!(r.status, 200, "{r}");
        streak = if keys == ["c"] { streak + 1 } else { 0 };
    }
    for _ in 0..10 {
        let (r, keys) = call(&pool, "chat").await;
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(keys, ["c"], "a provider past its budget gets no traffic");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_single_lane_the_calls_behind_a_probe_go_as_soon_as_it_succeeds() {
    // One lane only (p1's m1 on key a, no fallback). Every good answer takes 1.8 s and
    // timeoutMs is 2 s: a call behind the probe waits about as long before it goes, and that
    // wait is not its attempt's (it would time out and use a second attempt).
    let pool = Pool::start("half_open_single_lane", 1, |m, _| {
        Ok(two_providers(
            &m[0],
            "[{ alias: a, env: RS_KEY_A }]",
            "defaults: { timeoutMs: 2000, deadlineMs: 20000 }\nprofiles:\n  once: { model: m1, maxAttempts: 1 }\nresilience:\n  keyBreaker: { failureThreshold: 1, cooldownMs: 300, maxCooldownMs: 300 }\n  providerBreaker: { failureThreshold: 100, cooldownMs: 300, maxCooldownMs: 300 }\n  backoff: { baseMs: 10, factor: 1, maxMs: 10 }\n",
        ))
    })
    .await
    .expect("fixture");
    let a = secret(&pool, "RS_KEY_A");
    let fail = script::status(
        503,
        json!({}),
        Some(
            json!({"error": {"message": "down", "type": "server_error", "param": null, "code": null}}),
        ),
    );
    // The first answer fails and opens the breaker; then every answer is good but slow, so the
    // probe is in flight while the other calls arrive.
    pool.mocks[0]
        .script(json!([script::for_key(
            &a,
            vec![fail, json!({"text": "ok", "latencyMs": 1800})]
        )]))
        .await
        .unwrap();
    let first = pool.chat("once").await.unwrap();
    assert!(first.status >= 500, "{first}");
    // The control plane turns the breaker half-open once its cooldown is over.
    let metrics = format!("http://{}/metrics", pool.cp.http_addr());
    poll(
        "the breaker to be half-open",
        Duration::from_secs(10),
        || {
            let url = metrics.clone();
            async move {
                let text = ai_router_e2e::http_client()?
                    .get(url)
                    .send()
                    .await?
                    .text()
                    .await?;
                Ok(text
                    .lines()
                    .any(|l| {
                        l.starts_with("ai_router_breaker_open{scope=\"key\"") && l.ends_with(" 0.5")
                    })
                    .then_some(()))
            }
        },
    )
    .await
    .unwrap();

    let client = |pool: &Pool| {
        let client = ai_router_e2e::Client::new(&pool.envoy.base_url()).unwrap();
        let key = pool.virtual_key.clone();
        tokio::spawn(async move { client.chat("m1", Some(&key)).await })
    };
    let probe = client(&pool);
    // The probe holds the lease once the mock has its request.
    poll(
        "the probe to reach the provider",
        Duration::from_secs(5),
        || {
            let pool = &pool;
            async move { Ok((!pool.calls().await?.is_empty()).then_some(())) }
        },
    )
    .await
    .unwrap();
    let started = Instant::now();
    let behind: Vec<_> = (0..6).map(|_| client(&pool)).collect();
    assert_eq!(probe.await.unwrap().unwrap().status, 200);
    for call in behind {
        let r = call.await.unwrap().unwrap();
        assert_eq!(r.status, 200, "a call behind the probe: {r}");
        assert_eq!(r.content(), Some("ok"), "{r}");
        assert_eq!(
            r.header("x-ai-router-attempts").as_deref(),
            Some("1"),
            "the wait behind the probe used no attempt: {r}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "the calls behind the probe waited {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// What timeoutMs bounds: one attempt at a provider, not the call's waits

/// One provider `p` with key `k` (and `k2` when `two_keys`), models `m-wait`, `m-back` and
/// `m-slow`, breakers that never open, and `policy` as the defaults.
fn timeout_pool(mock: &str, two_keys: bool, policy: &str, backoff_ms: u64) -> PoolSetup {
    let mut setup = PoolSetup::default();
    setup.secret_env("TO_KEY", "k");
    let mut keys = "{ alias: k, env: TO_KEY }".to_string();
    if two_keys {
        setup.secret_env("TO_KEY_2", "k2");
        keys.push_str(", { alias: k2, env: TO_KEY_2 }");
    }
    setup.yaml = format!(
        "{}providers:\n  - id: p\n    baseUrl: {mock}/v1\n    keys: [{keys}]\n    models: [{{ id: m-wait }}, {{ id: m-back }}, {{ id: m-slow }}]\ndefaults: {policy}\nresilience:\n  backoff: {{ baseMs: {backoff_ms}, factor: 1, maxMs: {backoff_ms} }}\n  keyBreaker: {{ failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }}\n  providerBreaker: {{ failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }}\n",
        pool_yaml_header()
    );
    setup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_inside_an_attempt_longer_than_its_timeout_are_not_counted_against_it() {
    // timeoutMs 1 s; the only lane first answers a 429 with a 3 s retry-after (the next
    // attempt waits for the lane) or a 500 (the next attempt waits a backoff of 1.5 to 3 s).
    let pool = Pool::start("timeout_excludes_waits", 1, |m, _| {
        Ok(timeout_pool(
            &m[0],
            false,
            "{ timeoutMs: 1000, deadlineMs: 15000 }",
            3000,
        ))
    })
    .await
    .expect("fixture");
    pool.mocks[0]
        .script(json!([
            script::rule(
                json!({ "model": "m-wait" }),
                vec![
                    script::status(429, json!({ "retry-after": "3" }), None),
                    script::text("after the wait")
                ]
            ),
            script::rule(
                json!({ "model": "m-back" }),
                vec![
                    provider_error("openai.overloaded"),
                    script::text("after the backoff")
                ]
            ),
        ]))
        .await
        .unwrap();
    for (model, text, at_least) in [
        ("m-wait", "after the wait", Duration::from_millis(2800)),
        ("m-back", "after the backoff", Duration::from_millis(1400)),
    ] {
        let started = Instant::now();
        let (r, keys) = call(&pool, model).await;
        let took = started.elapsed();
        assert_eq!(
            r.status, 200,
            "{model}: the wait is the call's, not the attempt's:\n{r}"
        );
        assert_eq!(r.content(), Some(text), "{model}: {r}");
        assert_eq!(keys, ["k", "k"], "{model}: two attempts at the provider");
        assert_eq!(
            r.header("x-ai-router-attempts").as_deref(),
            Some("2"),
            "{model}: no attempt burnt while waiting:\n{r}"
        );
        assert!(
            took >= at_least && took < Duration::from_secs(6),
            "{model}: answered after {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_attempts_all_time_out_is_an_upstream_error_long_before_its_deadline() {
    // Every attempt gets 600 ms, three attempts, a 20 s deadline; the provider takes 5 s.
    let pool = Pool::start("timeout_final_error", 1, |m, _| {
        Ok(timeout_pool(
            &m[0],
            true,
            "{ timeoutMs: 600, deadlineMs: 20000, maxAttempts: 3 }",
            10,
        ))
    })
    .await
    .expect("fixture");
    pool.mocks[0]
        .script(json!([script::always(vec![
            json!({ "latencyMs": 5000, "text": "too late" })
        ])]))
        .await
        .unwrap();
    let started = Instant::now();
    let (r, keys) = call(&pool, "m-slow").await;
    let took = started.elapsed();
    if let Some(p) = openai_error_problem(&r, 502, "upstream_error") {
        panic!("every attempt timed out, the deadline did not pass: {p}");
    }
    let message = r.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("timeout"), "names the last class: {r}");
    assert_eq!(keys.len(), 3, "three attempts at the provider: {keys:?}");
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("3"),
        "{r}"
    );
    assert!(
        took >= Duration::from_millis(1700) && took < Duration::from_millis(4500),
        "three attempts of 600 ms each, answered after {took:?}"
    );
    pool.cp
        .metric_line(&[
            "ai_router_attempts_total{",
            "model=\"m-slow\"",
            "class=\"timeout\"",
        ])
        .await
        .unwrap();
}

/// A client that gives up before its answer cancelled its call: the request counts as
/// `error:cancelled`, never as an upstream error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_cancels_its_call_and_is_no_upstream_error() {
    let gw = ai_router_e2e::Gateway::start("client_abort")
        .await
        .expect("fixture");
    for mock in [&gw.mock1, &gw.mock2] {
        mock.always(json!({ "latencyMs": 3000, "text": "late" }))
            .await
            .unwrap();
    }
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("{}/v1/chat/completions", gw.envoy.base_url()))
        .bearer_auth(&gw.virtual_key)
        .json(&ai_router_e2e::chat_body("m1", false))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    gw.cp
        .metric_line(&["ai_router_requests_total{", "outcome=\"error:cancelled\""])
        .await
        .unwrap();
    let metrics = ai_router_e2e::get_text(&format!("http://{}/metrics", gw.cp.http_addr()))
        .await
        .unwrap();
    assert!(
        !metrics.contains("outcome=\"error:upstream\""),
        "an abort counted as an upstream error:\n{metrics}"
    );
}
