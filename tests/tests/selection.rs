//! Choosing among lanes through a real Envoy: `selection.strategy: headroom` spreading calls in
//! proportion to the remaining requests providers report, session affinity holding a
//! conversation on one key and moving it when that key is refused, and the pool's filters
//! (production, region, prompt logging) removing exactly their providers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use ai_router_e2e::{
    admin_pool_yaml_header, chat_body, poll, pool_yaml_header, pushed_headroom, script, Pool,
    PoolSetup, Reply,
};
use futures::StreamExt;
use serde_json::{json, Value};

async fn call(pool: &Pool, body: &Value, headers: &[(&str, &str)]) -> (Reply, Vec<String>) {
    pool.clear_calls().await.unwrap();
    let r = pool
        .client
        .chat_with_headers(body, Some(&pool.virtual_key), headers)
        .await
        .unwrap();
    let keys = pool.keys_called().await.unwrap();
    (r, keys)
}

/// One provider with keys a, b and c serving m1, and `selection` as given.
fn three_keys(mock: &str, selection: &str) -> PoolSetup {
    let mut setup = PoolSetup::default();
    for k in ["a", "b", "c"] {
        setup.secret_env(&format!("SEL_KEY_{}", k.to_uppercase()), k);
    }
    setup.admin_token();
    setup.yaml = format!(
        "{}providers:\n  - id: p1\n    baseUrl: {mock}/p1/v1\n    keys: [{{ alias: a, env: SEL_KEY_A }}, {{ alias: b, env: SEL_KEY_B }}, {{ alias: c, env: SEL_KEY_C }}]\n    models: [{{ id: m1 }}]\nresilience:\n  backoff: {{ baseMs: 10, factor: 1, maxMs: 10 }}\nselection:\n{selection}",
        admin_pool_yaml_header()
    );
    setup
}

/// Providers `(id, extra yaml, models)` on the mock, each with one key `k` (secret named by the
/// provider's id) serving `m` and its models (ids separated by spaces); `kind:
/// openai-compatible` unless `extra` says.
fn one_key_each(mock: &str, providers: &[(&str, &str, &str)]) -> (PoolSetup, String) {
    let mut setup = PoolSetup::default();
    let mut yaml = String::new();
    for (id, extra, models) in providers {
        let var = format!("SEL_{}", id.to_uppercase());
        setup.secret_env(&var, id);
        let kind = if extra.contains("kind:") {
            ""
        } else {
            "    kind: openai-compatible\n"
        };
        let models: String = models
            .split_whitespace()
            .map(|m| format!(", {{ id: {m} }}"))
            .collect();
        yaml.push_str(&format!(
            "  - id: {id}\n{kind}{extra}    baseUrl: {mock}/{id}/v1\n    keys: [{{ alias: k, env: {var} }}]\n    models: [{{ id: m }}{models}]\n"
        ));
    }
    (setup, yaml)
}

/// Calls until each of the three keys has answered once (so each has reported its headroom),
/// then waits until the control plane publishes the three keys' headroom (coalesced every
/// 200 ms) and Envoy reads it.
async fn every_key_reports(pool: &Pool, body: &Value) {
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    poll(
        "every key to report its headroom",
        Duration::from_secs(20),
        || {
            let seen = &seen;
            async move {
                let (r, keys) = call(pool, body, &[]).await;
                anyhow::ensure!(r.status == 200, "{r}");
                let mut seen = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                seen.extend(keys);
                Ok((seen.len() == 3).then_some(()))
            }
        },
    )
    .await
    .unwrap();
    let admin = pool.admin("AI_ROUTER_ADMIN_TOKEN").unwrap();
    pool.until_pushed(&admin, "the headroom of keys a, b and c", |health| {
        ["a", "b", "c"]
            .iter()
            .all(|k| !pushed_headroom(health, "p1", k).is_empty())
    })
    .await
    .unwrap();
}

/// Each key's share of the calls.
fn shares(served: &[String]) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for k in served {
        *out.entry(k.clone()).or_default() += 1.0 / served.len() as f64;
    }
    out
}

/// A reply reporting `requests` (and `tokens`) left for the next two minutes.
fn reporting(requests: u32, tokens: Option<u32>) -> Value {
    let mut headers = json!({
        "x-ratelimit-remaining-requests": requests.to_string(),
        "x-ratelimit-reset-requests": "120s"
    });
    if let Some(t) = tokens {
        headers["x-ratelimit-remaining-tokens"] = json!(t.to_string());
        headers["x-ratelimit-reset-tokens"] = json!("120s");
    }
    json!({ "text": "ok", "headers": headers })
}

/// [`three_keys`] started, with the secrets of a, b and c.
async fn start_three_keys(test: &str, selection: &str) -> (Pool, [String; 3]) {
    let pool = Pool::start(test, 1, |m, _| Ok(three_keys(&m[0], selection)))
        .await
        .expect("fixture");
    let secrets = ["A", "B", "C"].map(|k| pool.env_value(&format!("SEL_KEY_{k}")));
    (pool, secrets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headroom_spreads_a_thousand_calls_in_proportion_to_the_remaining_requests() {
    let (pool, [a, b, c]) = start_three_keys("headroom_spread", "  strategy: headroom\n").await;
    pool.mocks[0]
        .script(json!([
            script::for_key(&a, vec![reporting(600, None)]),
            script::for_key(&b, vec![reporting(300, None)]),
            script::for_key(&c, vec![reporting(100, None)]),
        ]))
        .await
        .unwrap();
    // Until every key has reported once, unreported lanes weigh the default (10).
    let body = chat_body("m1", false);
    every_key_reports(&pool, &body).await;
    let n = 1000;
    let mut served: Vec<String> = Vec::with_capacity(n);
    for i in 0..n {
        let (r, keys) = call(&pool, &body, &[]).await;
        assert!(r.status == 200 && keys.len() == 1, "call {i}: {keys:?} {r}");
        served.extend(keys);
    }
    // 600 : 300 : 100 left. Tolerance: 5 points of the total (3 sigma of a binomial at n = 1,000
    // is under 4.7 points); smooth round-robin (tiers) would give a third each.
    let spread = shares(&served);
    eprintln!("headroom spread over {n} calls: {spread:?}");
    for (k, want) in [("a", 0.6), ("b", 0.3), ("c", 0.1)] {
        let got = spread.get(k).copied().unwrap_or(0.0);
        assert!(
            (got - want).abs() <= 0.05,
            "key {k}: {got:.3}, expected {want}: {spread:?}"
        );
    }
    let logs = format!("{}{}", pool.cp.logs(), pool.envoy.logs());
    for secret in [&a, &b, &c, &pool.virtual_key] {
        assert!(!logs.contains(secret.as_str()), "a secret is in the logs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_on_one_key_and_moves_when_that_key_is_refused() {
    let pool = Pool::start("session_affinity", 1, |m, _| {
        Ok(three_keys(&m[0], "  affinity: { idleMs: 60000 }\n"))
    })
    .await
    .expect("fixture");
    let body = chat_body("m1", false);
    // Without a session, equal keys share calls by round-robin.
    let mut unpinned = Vec::new();
    for _ in 0..6 {
        let (r, keys) = call(&pool, &body, &[]).await;
        assert_eq!(r.status, 200, "{r}");
        unpinned.extend(keys);
    }
    unpinned.sort();
    unpinned.dedup();
    assert!(unpinned.len() >= 2, "round-robin spreads: {unpinned:?}");

    let session = [("x-ai-router-session", "conversation-123")];
    let mut pinned = Vec::new();
    for i in 0..20 {
        let (r, keys) = call(&pool, &body, &session).await;
        assert_eq!(r.status, 200, "call {i}: {r}");
        pinned.extend(keys);
    }
    let first = pinned[0].clone();
    assert!(
        pinned.iter().all(|k| *k == first),
        "20 calls of one session on one key: {pinned:?}"
    );

    // The pinned key is refused (401): the call fails over, and the session re-pins.
    let refused = pool.env_value(&format!("SEL_KEY_{}", first.to_uppercase()));
    pool.mocks[0]
        .script(json!([
            script::for_key(&refused, vec![script::status(401, json!({}), Some(json!({
                "error": { "message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, "code": "invalid_api_key" }
            })))]),
            script::always(vec![script::text("ok")]),
        ]))
        .await
        .unwrap();
    let (r, keys) = call(&pool, &body, &session).await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(keys.len(), 2, "the pinned key, then another: {keys:?}");
    assert_eq!(keys[0], first, "{keys:?}");
    let second = keys[1].clone();
    for i in 0..10 {
        let (r, keys) = call(&pool, &body, &session).await;
        assert_eq!(r.status, 200, "call {i}: {r}");
        assert_eq!(
            keys,
            std::slice::from_ref(&second),
            "call {i} after the move"
        );
    }

    // The body's `user` is a session too, and another session is pinned on its own.
    let mut by_user = body.clone();
    by_user["user"] = json!("user-42");
    let mut users = Vec::new();
    for _ in 0..8 {
        let (r, keys) = call(&pool, &by_user, &[]).await;
        assert_eq!(r.status, 200, "{r}");
        users.extend(keys);
    }
    assert!(users.iter().all(|k| *k == users[0]), "{users:?}");
    assert_ne!(users[0], first, "the refused key serves no one: {users:?}");

    let logs = format!("{}{}", pool.cp.logs(), pool.envoy.logs());
    assert!(
        !logs.contains("conversation-123"),
        "the session id is in the logs"
    );
    assert!(!logs.contains(&refused), "a secret is in the logs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_filters_remove_exactly_their_providers() {
    // Five providers serve m: dev-only terms, Gemini (blocked in the EU by the kind table),
    // one that may train on prompts, one blocked elsewhere only, and one with no caveat.
    let pool = Pool::start("terms_filters", 1, |m, _| {
        let (mut setup, providers) = one_key_each(
            &m[0],
            &[
                (
                    "devonly",
                    "    terms: { productionAllowed: false }\n",
                    "m-devonly m-dropped",
                ),
                ("gem", "    kind: gemini\n", "m-gem"),
                (
                    "trains",
                    "    terms: { trainsOnPrompts: true }\n",
                    "m-trains m-dropped",
                ),
                ("usblocked", "    terms: { blockedRegions: [US] }\n", "m-usblocked"),
                ("plain", "", "m-plain"),
            ],
        );
        setup.yaml = format!(
            "{}providers:\n{providers}selection:\n  mode: production\n  region: DE\n  allowPromptLogging: false\n",
            pool_yaml_header()
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let body = chat_body("m", false);
    let mut served: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..20 {
        let (r, keys) = call(&pool, &body, &[]).await;
        assert_eq!(r.status, 200, "call {i}: {r}");
        for k in keys {
            *served.entry(k).or_default() += 1;
        }
    }
    let names: Vec<&str> = served.keys().map(String::as_str).collect();
    assert_eq!(names, ["plain", "usblocked"], "{served:?}");
    // The trail names the filter that ruled out each dropped provider, and nothing else.
    let (r, _) = call(&pool, &body, &[("x-ai-router-trail", "1")]).await;
    assert_eq!(r.status, 200, "{r}");
    let trail: Value = r
        .header("x-ai-router-trail")
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("no trail: {r}"));
    let mut skipped: Vec<(String, String)> = trail["skipped"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let text = |f: &str| s[f].as_str().unwrap_or_default().to_owned();
            (text("provider"), text("reason"))
        })
        .collect();
    skipped.sort();
    skipped.dedup();
    let want = [
        ("devonly", "production_forbidden"),
        ("gem", "region_blocked"),
        ("trains", "prompt_logging"),
    ]
    .map(|(p, r)| (p.to_owned(), r.to_owned()));
    assert_eq!(skipped, want, "{trail}");
    // A model only dropped providers serve: the refusal names the filter in its message, and
    // its trail names each provider with the filter that removed it.
    for (model, removed) in [
        ("m-devonly", &[("devonly", "production_forbidden")][..]),
        ("m-gem", &[("gem", "region_blocked")]),
        ("m-trains", &[("trains", "prompt_logging")]),
        (
            "m-dropped",
            &[
                ("devonly", "production_forbidden"),
                ("trains", "prompt_logging"),
            ],
        ),
    ] {
        let (r, keys) = call(&pool, &chat_body(model, false), &[]).await;
        assert!(keys.is_empty(), "{model}: {keys:?}");
        if let Some(problem) = ai_router_e2e::openai_error_problem(&r, 400, "model_not_supported") {
            panic!("{model}: {problem}");
        }
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(removed[0].1), "{model}: {message}");
        let trail = &r.json["error"]["trail"];
        let mut skipped: Vec<Value> = trail["skipped"].as_array().cloned().unwrap_or_default();
        skipped.sort_by_key(|s| s["provider"].to_string());
        let want: Vec<Value> = removed
            .iter()
            .map(|(p, reason)| json!({ "provider": p, "model": model, "reason": reason }))
            .collect();
        assert_eq!(skipped, want, "{model}: {trail}");
        assert_eq!(trail["attempts"], json!([]), "{model}: {trail}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_keeps_the_family_on_another_provider_before_a_better_ranked_family() {
    // gpt-oss-120b under Groq's and Cloudflare's ids (one family by the bundled table), and
    // kimi-k2 (ranked better) as the defaults' fallback.
    let pool = Pool::start("family_fallback", 1, |m, _| {
        let (mut setup, providers) = one_key_each(
            &m[0],
            &[
                ("groq", "", "openai/gpt-oss-120b"),
                ("cf", "", "\"@cf/openai/gpt-oss-120b\""),
                ("or", "", "moonshotai/kimi-k2"),
            ],
        );
        setup.yaml = format!(
            "{}providers:\n{providers}defaults: {{ fallbacks: [moonshotai/kimi-k2] }}\nresilience:\n  backoff: {{ baseMs: 10, factor: 1, maxMs: 10 }}\n",
            pool_yaml_header()
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let groq = pool.env_value("SEL_GROQ");
    pool.mocks[0]
        .script(json!([
            script::for_key(&groq, vec![script::status(503, json!({}), None)]),
            script::always(vec![script::text("ok")]),
        ]))
        .await
        .unwrap();
    let (r, keys) = call(&pool, &chat_body("openai/gpt-oss-120b", false), &[]).await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(keys, ["groq", "cf"], "the same family before kimi-k2: {r}");
    assert_eq!(
        r.header("x-ai-router-model").as_deref(),
        Some("@cf/openai/gpt-oss-120b"),
        "{r}"
    );
    // A request naming the family reaches its members on both providers, not kimi-k2.
    let mut served = Vec::new();
    for _ in 0..6 {
        let (r, keys) = call(&pool, &chat_body("family:gpt-oss-120b", false), &[]).await;
        assert_eq!(r.status, 200, "{r}");
        served.extend(keys);
    }
    assert!(
        served.iter().all(|k| k == "groq" || k == "cf"),
        "{served:?}"
    );
    assert!(served.iter().any(|k| k == "cf"), "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_takes_the_best_weight_first_and_cascades_to_the_next() {
    let (pool, secrets) = start_three_keys("score_order", "  strategy: score\n").await;
    // W = 0.3·R/Rmax + 0.4·T/Tmax + 0.3: a 1.0, b 0.85 (half the requests), c 0.68 (a fifth
    // of the tokens).
    let with_a = |a_reply: Value| {
        [
            a_reply,
            reporting(50, Some(10_000)),
            reporting(100, Some(2_000)),
        ]
    };
    script_keys(&pool, &secrets, with_a(reporting(100, Some(10_000)))).await;
    let body = chat_body("m1", false);
    every_key_reports(&pool, &body).await;
    for i in 0..10 {
        let (r, keys) = call(&pool, &body, &[]).await;
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(keys, ["a"], "call {i}: the highest W first");
    }
    // a fails: the call cascades to b (0.85), never to c (0.68) while b serves.
    script_keys(
        &pool,
        &secrets,
        with_a(script::status(503, json!({}), None)),
    )
    .await;
    let (r, keys) = call(&pool, &body, &[]).await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(keys, ["a", "b"], "{r}");
}

/// Scripts a, b and c of [`start_three_keys`] to answer with `replies` (in that order), each
/// key's first.
async fn script_keys(pool: &Pool, secrets: &[String; 3], replies: [Value; 3]) {
    let rules: Vec<Value> = secrets
        .iter()
        .zip(replies)
        .map(|(secret, reply)| script::for_key(secret, vec![reply]))
        .collect();
    pool.mocks[0].script(Value::Array(rules)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_weights_from_the_config_reverse_the_order_the_defaults_give() {
    // The same figures under two weightings: a 100 requests and 2,000 tokens left, b 70 and
    // 6,000, c 40 and 10,000. W = α·R/Rmax + β·T/Tmax + γ:
    // - the defaults (0.3, 0.4, 0.3): a 0.68, b 0.75, c 0.82, so c first;
    // - α 0.8, β 0.1, γ 0.1: a 0.92, b 0.72, c 0.52, so a first.
    let figures = [
        reporting(100, Some(2_000)),
        reporting(70, Some(6_000)),
        reporting(40, Some(10_000)),
    ];
    for (name, selection, order) in [
        ("score_defaults", "  strategy: score\n", ["c", "b", "a"]),
        (
            "score_weights",
            "  strategy: score\n  score: { alpha: 0.8, beta: 0.1, gamma: 0.1 }\n",
            ["a", "b", "c"],
        ),
    ] {
        let (pool, secrets) = start_three_keys(name, selection).await;
        script_keys(&pool, &secrets, figures.clone()).await;
        let body = chat_body("m1", false);
        every_key_reports(&pool, &body).await;
        for i in 0..5 {
            let (r, keys) = call(&pool, &body, &[]).await;
            assert_eq!(r.status, 200, "{name}: {r}");
            assert_eq!(keys, order[..1], "{name}, call {i}: the highest W first");
        }
        // The best fails, then the two best: each call cascades down the order.
        let key_index = |k: &str| ["a", "b", "c"].iter().position(|x| *x == k).unwrap();
        for failing in 1..=2 {
            let mut replies = figures.clone();
            for k in &order[..failing] {
                replies[key_index(k)] = script::status(503, json!({}), None);
            }
            script_keys(&pool, &secrets, replies).await;
            let (r, keys) = call(&pool, &body, &[]).await;
            assert_eq!(r.status, 200, "{name}: {r}");
            assert_eq!(keys, order[..=failing], "{name}: {r}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_never_tries_a_lane_weighing_zero_even_when_the_others_fail() {
    let (pool, secrets) = start_three_keys("score_zero", "  strategy: score\n").await;
    // c has no request left: H = 0, so W = 0 however full its token window.
    let figures = [
        reporting(100, Some(10_000)),
        reporting(50, Some(10_000)),
        reporting(0, Some(10_000)),
    ];
    script_keys(&pool, &secrets, figures.clone()).await;
    let body = chat_body("m1", false);
    every_key_reports(&pool, &body).await;
    for i in 0..5 {
        let (r, keys) = call(&pool, &body, &[]).await;
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(keys, ["a"], "call {i}");
    }
    // a and b fail: the call fails with their upstream error, and c is not sent to.
    let down = script::status(503, json!({}), None);
    script_keys(&pool, &secrets, [down.clone(), down, figures[2].clone()]).await;
    let (r, keys) = call(&pool, &body, &[]).await;
    if let Some(problem) = ai_router_e2e::openai_error_problem(&r, 502, "upstream_error") {
        panic!("every lane with a weight failed: {problem}");
    }
    assert!(
        !keys.iter().any(|k| k == "c"),
        "the lane of W = 0 was tried: {keys:?}"
    );
    assert_eq!(keys[..2], ["a", "b"], "{keys:?}");
    let trail = &r.json["error"]["trail"];
    let c_out = trail["skipped"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["key"] == "c" && s["reason"] == "headroom");
    assert!(c_out, "the trail names c's spent headroom: {trail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_provider_serves_only_with_keyless_fallback_and_gets_no_credentials() {
    for fallback in [false, true] {
        let pool = Pool::start(&format!("keyless_{fallback}"), 1, |m, _| {
            let (mut setup, providers) = one_key_each(&m[0], &[("paid", "", "m-paid")]);
            setup.yaml = format!(
                "{}providers:\n{providers}  - id: free\n    kind: openai-compatible\n    baseUrl: {}/free/v1\n    terms: {{ keyless: true }}\n    models: [{{ id: m-free }}]\nselection:\n  keylessFallback: {fallback}\n",
                pool_yaml_header(),
                m[0]
            );
            Ok(setup)
        })
        .await
        .expect("fixture");
        pool.clear_calls().await.unwrap();
        let r = pool.chat("m-free").await.unwrap();
        let calls = pool.calls().await.unwrap();
        if !fallback {
            assert_eq!(r.status, 400, "{r}");
            let message = r.json["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("keyless"), "{message}");
            assert!(calls.is_empty(), "{calls:?}");
            continue;
        }
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].key, "<no key>");
        assert_eq!(calls[0].call.header("authorization"), None);
        assert_eq!(calls[0].call.header("x-api-key"), None);
        // The keyed provider still gets its key.
        pool.clear_calls().await.unwrap();
        let r = pool.chat("m-paid").await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(pool.keys_called().await.unwrap(), ["paid"]);
    }
}

/// With more keys than one lane-health record holds (`filter-core/src/vm/lane_records.rs`: over 8,
/// spread over buckets of about 4), what the control plane pushes about one key reaches the
/// picker through that key's bucket: a key refused with a 401 stays out once Envoy's own hold
/// gives way to the pushed blacklist (5 s after the push), and a key that reported no requests
/// left is out as soon as its figure is pushed. The picker looks at 16 of the 40 keys per call,
/// moving on each time, so every key is looked at many times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_forty_keys_a_refused_key_and_a_spent_key_stay_out_through_their_buckets() {
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let pool = Pool::start("forty_keys", 1, |m, _| {
        let mut setup = PoolSetup::default();
        let mut list = Vec::new();
        for k in &keys {
            let var = format!("SEL_FORTY_{}", k.to_uppercase());
            setup.secret_env(&var, k);
            list.push(format!("{{ alias: {k}, env: {var} }}"));
        }
        setup.yaml = format!(
            "{}providers:\n  - id: p1\n    baseUrl: {}/p1/v1\n    keys: [{}]\n    models: [{{ id: m1 }}]\nresilience:\n  backoff: {{ baseMs: 10, factor: 1, maxMs: 10 }}\n",
            pool_yaml_header(),
            m[0],
            list.join(", ")
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let refused = pool.env_value("SEL_FORTY_K7");
    let spent = pool.env_value("SEL_FORTY_K20");
    let unauthorized = script::status(
        401,
        json!({}),
        Some(json!({ "error": { "message": "bad key", "code": "invalid_api_key" } })),
    );
    pool.mocks[0]
        .script(json!([
            script::for_key(&refused, vec![unauthorized]),
            script::for_key(&spent, vec![reporting(0, None)]),
            script::always(vec![script::text("ok")]),
        ]))
        .await
        .unwrap();
    let body = chat_body("m1", false);
    // Until both keys were tried once.
    let mut seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !(seen.contains("k7") && seen.contains("k20")) {
        assert!(
            std::time::Instant::now() < deadline,
            "k7 and k20 not tried within 30 s: {seen:?}"
        );
        let (r, called) = call(&pool, &body, &[]).await;
        assert_eq!(r.status, 200, "{r}");
        seen.extend(called);
    }
    // Calls for 9 s: past the 5 s after which Envoy's own hold on k7 gives way to the pushed
    // blacklist. k20's figure may take a push to arrive (200 ms; 3 s allowed on a loaded
    // machine).
    let started = std::time::Instant::now();
    let mut calls = 0;
    let mut late_spent = 0;
    while started.elapsed() < Duration::from_secs(9) {
        let (r, called) = call(&pool, &body, &[]).await;
        assert_eq!(r.status, 200, "{r}");
        assert!(
            !called.iter().any(|k| k == "k7"),
            "the refused key k7 was called again after {:?}: {called:?}",
            started.elapsed()
        );
        if started.elapsed() > Duration::from_secs(3) && called.iter().any(|k| k == "k20") {
            late_spent += 1;
        }
        calls += 1;
    }
    eprintln!("{calls} calls over 9 s with k7 refused and k20 spent");
    assert!(calls >= 40, "too few calls to look at every key: {calls}");
    assert_eq!(
        late_spent, 0,
        "the spent key k20 was called {late_spent} times"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidate_weights_hold_at_concurrency_one_eight_and_thirty_two() {
    // The tier [[{w1, weight 3}, {w2, weight 1}]], w1 with one key and w2 with two: w1 answers
    // 75% of the calls whether they come one at a time or 8 or 32 at once (calls in flight
    // only choose among a candidate's own keys). Each key answers its provider's name after
    // 10 ms, so the calls of a batch are in flight together.
    let pool = Pool::start("weights_concurrency", 1, |m, _| {
        let mut setup = PoolSetup::default();
        for (var, name) in [("WC_A", "a"), ("WC_B", "b"), ("WC_C", "c")] {
            setup.secret_env(var, name);
        }
        let mock = &m[0];
        setup.yaml = format!(
            "{}providers:\n  - id: w1\n    kind: openai-compatible\n    baseUrl: {mock}/w1/v1\n    keys: [{{ alias: a, env: WC_A }}]\n    models: [{{ id: m }}]\n  - id: w2\n    kind: openai-compatible\n    baseUrl: {mock}/w2/v1\n    keys: [{{ alias: b, env: WC_B }}, {{ alias: c, env: WC_C }}]\n    models: [{{ id: m }}]\nprofiles:\n  weighted: {{ candidates: [[{{ provider: w1, model: m, weight: 3 }}, {{ provider: w2, model: m, weight: 1 }}]] }}\n",
            pool_yaml_header()
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let replies: Vec<Value> = ["WC_A", "WC_B", "WC_C"]
        .iter()
        .zip(["w1", "w2", "w2"])
        .map(|(var, provider)| {
            script::for_key(
                &pool.env_value(var),
                vec![json!({ "text": provider, "latencyMs": 10 })],
            )
        })
        .collect();
    pool.mocks[0].script(json!(replies)).await.unwrap();
    let n = 400;
    for concurrency in [1, 8, 32] {
        let answered: Vec<String> = futures::stream::iter(0..n)
            .map(|_| async {
                let r = pool.chat("weighted").await.unwrap();
                assert_eq!(r.status, 200, "{r}");
                r.json["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let spread = shares(&answered);
        eprintln!("concurrency {concurrency}: {spread:?}");
        for (provider, want) in [("w1", 0.75), ("w2", 0.25)] {
            let got = spread.get(provider).copied().unwrap_or(0.0);
            assert!(
                (got - want).abs() <= 0.05,
                "concurrency {concurrency}: {provider} answered {got:.3}, expected {want}: {spread:?}"
            );
        }
    }
}
