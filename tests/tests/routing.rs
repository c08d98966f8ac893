//! Selection and policies through a real Envoy: every selection tier (untried lane, model
//! order, untried key then provider, headroom), latency, weighted round-robin shares, concurrency
//! caps, needs that cut candidates (tools, context window, budget), the defaults -> profile merge
//! (maxAttempts), allowFallback, pinned profiles, and keysFromEnv expansion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use ai_router_e2e::script::down;
use ai_router_e2e::{
    admin_pool_yaml_header, openai_error_problem, poll, pool_yaml_header, pushed_headroom, script,
    Pool, PoolSetup, Reply,
};
use serde_json::json;

async fn call(pool: &Pool, model: &str) -> (Reply, Vec<String>) {
    pool.clear_calls().await.unwrap();
    let r = pool.chat(model).await.unwrap();
    let keys = pool.keys_called().await.unwrap();
    (r, keys)
}

fn var(pool: &Pool, name: &str) -> String {
    pool.control_plane_var(name).unwrap().to_string()
}

/// On one mock: `p1` (keys a, b; model m1, alias chat), `p2` (key c; models m2 and, under the
/// same alias, m1), then `extra`.
fn pool_setup(mock: &str, p1: &str, p2: &str, extra: &str) -> PoolSetup {
    let mut setup = PoolSetup::default();
    setup.secret_env("RT_KEY_A", "a");
    setup.secret_env("RT_KEY_B", "b");
    setup.secret_env("RT_KEY_C", "c");
    setup.admin_token();
    setup.yaml = format!(
        "{}providers:\n  - id: p1\n    baseUrl: {mock}/p1/v1\n{p1}  - id: p2\n    baseUrl: {mock}/p2/v1\n{p2}{extra}",
        admin_pool_yaml_header()
    );
    setup
}

const P1: &str = "    keys: [{ alias: a, env: RT_KEY_A }, { alias: b, env: RT_KEY_B }]\n    models: [{ id: m1 }]\n";
const P2: &str = "    keys: [{ alias: c, env: RT_KEY_C }]\n    models: [{ id: m2 }]\n";
const FAST_BACKOFF: &str = "resilience:\n  backoff: { baseMs: 10, factor: 1, maxMs: 10 }\n  keyBreaker: { failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }\n  providerBreaker: { failureThreshold: 50, cooldownMs: 1000, maxCooldownMs: 2000 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_tiers_share_load_in_proportion() {
    // Tier 1: p1's m1 (candidate weight 3; keys a weight 2, b weight 1) and p2's m2 (weight 1):
    // the candidates share the tier 3:1 whatever their key count (p1 0.75, p2 0.25), and p1's
    // share splits 2:1 between its keys: a 0.5, b 0.25, c 0.25.
    let pool = Pool::start("weighted", 1, |m, _| {
        Ok(pool_setup(
            &m[0],
            "    keys: [{ alias: a, env: RT_KEY_A, weight: 2 }, { alias: b, env: RT_KEY_B }]\n    models: [{ id: m1 }]\n",
            P2,
            "profiles:\n  work: { candidates: [[{ provider: p1, model: m1, weight: 3 }, { provider: p2, model: m2 }]] }\n  even: { model: m1 }\n",
        ))
    })
    .await
    .expect("fixture");
    let n = 300;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..n {
        let (r, keys) = call(&pool, "work").await;
        assert_eq!(r.status, 200, "call {i}: {r}");
        assert_eq!(keys.len(), 1, "call {i}: {keys:?}");
        *counts.entry(keys[0].clone()).or_default() += 1;
    }
    let share = |k: &str| *counts.get(k).unwrap_or(&0) as f64 / n as f64;
    for (k, want) in [("a", 0.5), ("b", 0.25), ("c", 0.25)] {
        assert!(
            (share(k) - want).abs() <= 0.06,
            "key {k} served {:.3} of {n} calls, expected {want} (counts {counts:?})",
            share(k)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_order_untried_keys_then_untried_providers_and_allow_fallback_false() {
    // m1 is served by p1 (a, b) and p2 (c); m2 by p2.
    let pool = Pool::start("tiers", 1, |m, _| {
        Ok(pool_setup(
            &m[0],
            P1,
            "    keys: [{ alias: c, env: RT_KEY_C }]\n    models: [{ id: m1 }, { id: m2 }]\n",
            &format!("defaults: {{ maxAttempts: 3 }}\nprofiles:\n  ordered: {{ model: m2, fallbacks: [m1] }}\n  strict: {{ candidates: [{{ provider: p1, model: m1 }}, {{ provider: p2, model: m2 }}], allowFallback: false }}\n  loose: {{ candidates: [{{ provider: p1, model: m1 }}, {{ provider: p2, model: m2 }}] }}\n{FAST_BACKOFF}"),
        ))
    })
    .await
    .expect("fixture");

    // Model order: the preferred model first while it has a usable lane.
    for i in 0..4 {
        let (r, keys) = call(&pool, "ordered").await;
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(keys, ["c"], "call {i}: m2 (only on p2) is preferred");
        assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m2"), "{r}");
    }

    // Every lane of m1 fails: after the first lane, an untried key of an untried provider comes
    // before the other key of the provider just tried.
    let c = var(&pool, "RT_KEY_C");
    pool.mocks[0]
        .script(json!([
            script::rule(json!({ "model": "m1" }), vec![down()]),
            script::for_key(&c, vec![script::text("m2 from c")])
        ]))
        .await
        .unwrap();
    for i in 0..3 {
        let (r, _) = call(&pool, "m1").await;
        let calls = pool.calls().await.unwrap();
        let lanes: Vec<(String, String)> = calls
            .iter()
            .map(|c| (c.key.clone(), c.call.model.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            r.status, 502,
            "call {i}: every m1 lane is down and a direct call has no fallback: {r}\n{lanes:?}"
        );
        assert_eq!(lanes.len(), 3, "call {i}: each lane once: {lanes:?}");
        let first = &lanes[0].0;
        let second = &lanes[1].0;
        let provider = |k: &str| if k == "c" { "p2" } else { "p1" };
        assert_ne!(
            provider(first),
            provider(second),
            "call {i}: after {first} fails an untried provider comes next: {lanes:?}"
        );
    }

    // allowFallback: false keeps the first tier; without it the call falls to the next one.
    pool.mocks[0]
        .script(json!([script::rule(
            json!({ "model": "m1" }),
            vec![down()]
        )]))
        .await
        .unwrap();
    let (r, keys) = call(&pool, "strict").await;
    if let Some(p) = openai_error_problem(&r, 502, "upstream_error") {
        panic!("strict (allowFallback: false) with its first tier down: {p}\nkeys {keys:?}");
    }
    let calls = pool.calls().await.unwrap();
    assert!(
        calls.iter().all(|c| c.call.model.as_deref() == Some("m1")),
        "strict never leaves m1: {keys:?}"
    );
    let (r, _) = call(&pool, "loose").await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m2"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_fallback_false_pins_even_when_the_request_cuts_the_preferred_model() {
    // p1 serves `small` (a 50-token context window), p2 serves `big`.
    let pool = Pool::start("pin_cut", 1, |m, _| {
        Ok(pool_setup(
            &m[0],
            "    keys: [{ alias: a, env: RT_KEY_A }]\n    models: [{ id: small, contextWindow: 50 }]\n",
            "    keys: [{ alias: c, env: RT_KEY_C }]\n    models: [{ id: big }]\n",
            "profiles:\n  strict: { model: small, fallbacks: [big], allowFallback: false }\n  loose: { model: small, fallbacks: [big] }\n",
        ))
    })
    .await
    .expect("fixture");
    let long = "word ".repeat(400);
    let body =
        |profile: &str| json!({"model": profile, "messages": [{"role": "user", "content": long}]});
    pool.clear_calls().await.unwrap();
    let r = pool.chat_with(&body("strict")).await.unwrap();
    if let Some(p) = openai_error_problem(&r, 400, "model_not_supported") {
        panic!("a pinned profile whose model the request cuts: {p}");
    }
    assert!(
        pool.calls().await.unwrap().is_empty(),
        "no provider is called"
    );
    let r = pool.chat_with(&body("loose")).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.header("x-ai-router-model").as_deref(), Some("big"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_merges_from_defaults_into_profiles() {
    let pool = Pool::start("max_attempts", 1, |m, _| {
        Ok(pool_setup(
            &m[0],
            P1,
            "    keys: [{ alias: c, env: RT_KEY_C }]\n    models: [{ id: m1 }, { id: m2 }]\n",
            &format!("defaults: {{ maxAttempts: 3, fallbacks: [m2] }}\nprofiles:\n  two: {{ model: m1, maxAttempts: 2 }}\n  inherit: {{ model: m1 }}\n{FAST_BACKOFF}"),
        ))
    })
    .await
    .expect("fixture");
    pool.mocks[0]
        .script(json!([script::always(vec![down()])]))
        .await
        .unwrap();
    for (model, n) in [("two", 2), ("inherit", 3), ("m1", 3)] {
        let (r, keys) = call(&pool, model).await;
        assert_eq!(r.status, 502, "{model}: {r}");
        assert_eq!(
            keys.len(),
            n,
            "{model}: {n} attempts, the mock saw {keys:?}"
        );
        assert_eq!(
            r.header("x-ai-router-attempts"),
            Some(n.to_string()),
            "{model}: {r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_cut_candidates_tools_context_window_and_budget_with_no_provider_call() {
    let pool = Pool::start("needs", 1, |m, _| {
        Ok(pool_setup(
            &m[0],
            "    keys: [{ alias: a, env: RT_KEY_A }, { alias: b, env: RT_KEY_B }]\n    models:\n      - { id: m1, capabilities: [chat, streaming], contextWindow: 100, cost: { input: 1000, output: 1000 } }\n",
            P2,
            "profiles:\n  cheap: { model: m1, budget: { maxCost: 0.05 } }\n",
        ))
    })
    .await
    .expect("fixture");
    let msg = |text: &str| json!([{ "role": "user", "content": text }]);
    let tools = json!([{ "type": "function", "function": { "name": "f", "parameters": { "type": "object" } } }]);
    for (what, body) in [
        (
            "tools on a model without the tools capability",
            json!({ "model": "m1", "messages": msg("hi"), "tools": tools }),
        ),
        (
            "a prompt past the context window",
            json!({ "model": "m1", "messages": msg(&"word ".repeat(200)) }),
        ),
        (
            "max_tokens past the context window",
            json!({ "model": "m1", "messages": msg("hi"), "max_tokens": 500 }),
        ),
        (
            "a worst case above budget.maxCost",
            json!({ "model": "cheap", "messages": msg("hi"), "max_tokens": 60 }),
        ),
    ] {
        pool.clear_calls().await.unwrap();
        let r = pool.chat_with(&body).await.unwrap();
        if let Some(p) = openai_error_problem(&r, 400, "model_not_supported") {
            panic!("{what}: {p}");
        }
        assert!(
            pool.calls().await.unwrap().is_empty(),
            "{what}: no provider call"
        );
    }
    // Within the limits the same model serves.
    let r = pool
        .chat_with(&json!({ "model": "cheap", "messages": msg("hi"), "max_tokens": 10 }))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_or_provider_at_its_concurrency_cap_sends_the_next_call_elsewhere() {
    let pool = Pool::start("concurrency", 1, |m, _| {
        Ok(pool_setup(
            &m[0],
            "    keys: [{ alias: a, env: RT_KEY_A, maxConcurrency: 1 }]\n    models: [{ id: m1 }]\n",
            "    keys: [{ alias: c, env: RT_KEY_C }]\n    models: [{ id: m2 }]\n",
            "defaults: { fallbacks: [m2] }\n",
        ))
    })
    .await
    .expect("fixture");
    pool.mocks[0]
        .script(json!([script::always(vec![
            json!({ "latencyMs": 800, "text": "slow" })
        ])]))
        .await
        .unwrap();
    // Without the cap, both would go to m1 (the preferred model): a serves one, c the other.
    let other = ai_router_e2e::Client::new(&pool.envoy.base_url()).unwrap();
    pool.clear_calls().await.unwrap();
    let (r1, r2) = tokio::join!(pool.chat("m1"), async {
        // The second call once the first is at the provider: a's one slot is taken.
        let first_sent = || async { Ok((!pool.mocks[0].calls().await?.is_empty()).then_some(())) };
        ai_router_e2e::poll(
            "the first call at the provider",
            Duration::from_secs(10),
            first_sent,
        )
        .await
        .unwrap();
        other.chat("m1", Some(&pool.virtual_key)).await
    });
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert_eq!((r1.status, r2.status), (200, 200), "{r1}\n{r2}");
    let mut keys = pool.keys_called().await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        ["a", "c"],
        "maxConcurrency 1 on a: the concurrent call goes to c"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_with_low_headroom_comes_last_and_a_slow_lane_falls_out_of_the_latency_tie() {
    let pool = Pool::start("headroom_latency", 1, |m, _| {
        Ok(pool_setup(&m[0], P1, P2, ""))
    })
    .await
    .expect("fixture");
    // Equal keys alternate deterministically (one connection stays on one Envoy worker).
    let mut seq = Vec::new();
    for _ in 0..6 {
        let (r, keys) = call(&pool, "m1").await;
        assert_eq!(r.status, 200, "{r}");
        seq.extend(keys);
    }
    assert!(
        seq.windows(2).all(|w| w[0] != w[1]),
        "a and b alternate: {seq:?}"
    );

    let a = var(&pool, "RT_KEY_A");
    let b = var(&pool, "RT_KEY_B");
    // a reports 1 remaining request (lowHeadroom is 1) for the next 2 s.
    pool.mocks[0]
        .script(json!([
            script::for_key(&a, vec![json!({ "text": "from a", "headers": { "x-ratelimit-remaining-requests": "1", "x-ratelimit-reset-requests": "2s" } })]),
            script::for_key(&b, vec![script::text("from b")]),
        ]))
        .await
        .unwrap();
    poll("a call on key a", Duration::from_secs(5), || {
        let pool = &pool;
        async move {
            Ok(call(pool, "m1")
                .await
                .1
                .contains(&"a".to_string())
                .then_some(()))
        }
    })
    .await
    .unwrap();
    // Headroom-only changes are published together every 200 ms (the control plane's
    // HEADROOM_COALESCE): wait until a's figure is published and Envoy reads it.
    let admin = pool.admin("AI_ROUTER_ADMIN_TOKEN").unwrap();
    pool.until_pushed(&admin, "key a's headroom of 1 request", |health| {
        pushed_headroom(health, "p1", "a")
            .iter()
            .any(|h| h["remainingRequests"] == 1)
    })
    .await
    .unwrap();
    for i in 0..6 {
        let (r, keys) = call(&pool, "m1").await;
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(keys, ["b"], "call {i}: a lane at lowHeadroom comes after b");
    }

    // Latency: b becomes slow (500 ms) while a is fast; once measured, a lane far above the best
    // EWMA (best * 1.5 + 50 ms) is out of the tie.
    pool.mocks[0]
        .script(json!([
            script::for_key(&a, vec![script::text("from a")]),
            script::for_key(&b, vec![json!({ "text": "from b", "latencyMs": 500 })]),
        ]))
        .await
        .unwrap();
    poll(
        "key a to serve again once its headroom resets",
        Duration::from_secs(6),
        || {
            let pool = &pool;
            async move {
                Ok(call(pool, "m1")
                    .await
                    .1
                    .contains(&"a".to_string())
                    .then_some(()))
            }
        },
    )
    .await
    .unwrap();
    let mut seq = Vec::new();
    for _ in 0..12 {
        let (r, keys) = call(&pool, "m1").await;
        assert_eq!(r.status, 200, "{r}");
        seq.extend(keys);
    }
    let tail = &seq[6..];
    assert!(
        tail.iter().all(|k| k == "a"),
        "after measuring, the slow key b is avoided: {seq:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_profile_stays_on_its_model_identity_and_a_mixed_one_is_refused() {
    let pool = Pool::start("pinned", 1, |m, _| {
        Ok(pool_setup(
            &m[0],
            "    keys: [{ alias: a, env: RT_KEY_A }, { alias: b, env: RT_KEY_B }]\n    models: [{ id: te3, capabilities: [embeddings], dimensions: 8 }, { id: te-large, capabilities: [embeddings], dimensions: 8 }]\n",
            "    keys: [{ alias: c, env: RT_KEY_C }]\n    models: [{ id: openai/te3, identity: te3, capabilities: [embeddings], dimensions: 8 }]\n",
            &format!("defaults: {{ fallbacks: [te-large] }}\nprofiles:\n  embed: {{ pinned: true, candidates: [[{{ provider: p1, model: te3 }}, {{ provider: p2, model: openai/te3 }}]] }}\n{FAST_BACKOFF}"),
        ))
    })
    .await
    .expect("fixture");
    let c = var(&pool, "RT_KEY_C");
    let body = json!({ "model": "embed", "input": ["hello"] }).to_string();
    // Keys and providers rotate, the model never changes.
    pool.clear_calls().await.unwrap();
    for _ in 0..6 {
        let r = pool
            .client
            .request(
                reqwest::Method::POST,
                "/v1/embeddings",
                Some(&pool.virtual_key),
                Some(body.clone()),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{r}");
    }
    let calls = pool.calls().await.unwrap();
    let models: Vec<String> = calls
        .iter()
        .map(|c| c.call.model.clone().unwrap_or_default())
        .collect();
    assert!(
        models.iter().all(|m| m == "te3" || m == "openai/te3"),
        "{models:?}"
    );
    // p2's key is down too: every te3 lane fails; the call must not go to te-large.
    pool.mocks[0]
        .script(json!([
            script::rule(json!({ "model": "te3" }), vec![down()]),
            script::for_key(&c, vec![down()])
        ]))
        .await
        .unwrap();
    pool.clear_calls().await.unwrap();
    let r = pool
        .client
        .request(
            reqwest::Method::POST,
            "/v1/embeddings",
            Some(&pool.virtual_key),
            Some(body.clone()),
        )
        .await
        .unwrap();
    assert_ne!(r.status, 200, "{r}");
    let calls = pool.calls().await.unwrap();
    assert!(
        calls
            .iter()
            .all(|c| c.call.model.as_deref() != Some("te-large")),
        "a pinned profile refused another model: {:?}",
        calls
            .iter()
            .map(|c| c.call.model.clone())
            .collect::<Vec<_>>()
    );

    // A pinned profile over two model identities is refused when the config loads.
    let dir = ai_router_e2e::TestDir::new("pinned_mixed").unwrap();
    let yaml = format!(
        "{}providers:\n  - id: p1\n    baseUrl: http://127.0.0.1:9/v1\n    keys: [{{ alias: a, env: RT_MIX }}]\n    models: [{{ id: te3, capabilities: [embeddings] }}, {{ id: te-large, capabilities: [embeddings] }}]\nprofiles:\n  embed: {{ pinned: true, candidates: [{{ model: te3 }}, {{ model: te-large }}] }}\n",
        pool_yaml_header()
    );
    let err =
        ai_router_e2e::ControlPlane::start(&dir, &yaml, &[("RT_MIX".into(), "sk-x".into())]).await;
    let text = format!(
        "{:#}",
        err.expect_err("a mixed pinned profile must be refused")
    );
    assert!(
        text.contains("pinned"),
        "the refusal names the problem: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_from_env_expands_numbered_file_and_list_variables_into_distinct_keys() {
    let pool = Pool::start("keys_from_env", 1, |m, dir| {
        let mut setup = PoolSetup::default();
        setup.secret_env("ACME_API_KEY", "acme-1");
        setup.secret_env("ACME_API_KEY_2", "acme-2");
        let file_secret = format!("sk-acme-file-{}", ai_router_e2e::random_hex(24));
        let path = dir.write("acme3.txt", &format!("{file_secret}\nsecond line ignored\n"))?;
        setup.env.push(("ACME_API_KEY_3_FILE".into(), path.display().to_string()));
        setup.name_secret(&file_secret, "acme-3");
        let l1 = format!("sk-acme-l1-{}", ai_router_e2e::random_hex(24));
        let l2 = format!("sk-acme-l2-{}", ai_router_e2e::random_hex(24));
        setup.env.push(("ACME_API_KEYS".into(), format!("{l1}, {l2}")));
        setup.name_secret(&l1, "acme-4");
        setup.name_secret(&l2, "acme-5");
        setup.yaml = format!(
            "{}providers:\n  - id: acme\n    baseUrl: {}/v1\n    keysFromEnv: ACME\n    models: [{{ id: m1 }}]\n",
            pool_yaml_header(),
            m[0]
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let (r, keys) = call(&pool, "m1").await;
        assert_eq!(r.status, 200, "{r}");
        for k in keys {
            assert!(
                !k.starts_with('<'),
                "a key the environment does not hold: {k}"
            );
            seen.insert(k);
        }
        if seen.len() == 5 {
            break;
        }
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["acme-1", "acme-2", "acme-3", "acme-4", "acme-5"],
        "five distinct keys at the mock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_clears_inherited_lists_with_an_empty_one() {
    // The defaults fall back to m2 and keep calls on p1; `alone` clears both lists.
    let pool = Pool::start("empty_lists", 1, |m, _| {
        Ok(pool_setup(
            &m[0],
            P1,
            "    keys: [{ alias: c, env: RT_KEY_C }]\n    models: [{ id: m2 }, { id: m1 }]\n",
            &format!("defaults: {{ fallbacks: [m2], providers: [p1] }}\nprofiles:\n  alone: {{ model: m1, fallbacks: [], providers: [] }}\n  inherit: {{ model: m1 }}\n{FAST_BACKOFF}"),
        ))
    })
    .await
    .expect("fixture");
    let c = var(&pool, "RT_KEY_C");
    // p1's m1 is down; p2 serves m1 and m2.
    pool.mocks[0]
        .script(json!([
            script::for_key(&c, vec![script::text("from c")]),
            script::always(vec![down()])
        ]))
        .await
        .unwrap();
    // `inherit`: providers [p1] keeps it off p2, so the fallback m2 (only on p2) is cut too.
    let (r, keys) = call(&pool, "inherit").await;
    assert!(r.status >= 500, "{r}");
    assert!(!keys.contains(&"c".to_string()), "{keys:?}");
    // `alone`: no provider restriction (p2's m1 may answer), and no fallback to m2.
    let (r, _) = call(&pool, "alone").await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m1"), "{r}");
    let models: Vec<String> = pool
        .calls()
        .await
        .unwrap()
        .iter()
        .filter_map(|c| c.call.model.clone())
        .collect();
    assert!(
        models.iter().all(|m| m == "m1"),
        "alone never falls back: {models:?}"
    );
}
