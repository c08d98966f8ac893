//! The 400 rule and its exception, and the routing trail, through a real Envoy: a
//! context-length answer (a 400 that says the prompt is too long, a 413) moves the call on to a
//! lane whose model is larger and never to one no larger, every other 400 stops the call at
//! once; a per-request cap (GitHub Models' 8K in) rules a lane out before sending; and every
//! final error carries `error.trail` (the lanes ruled out, with their reasons, and every
//! attempt), a success too when the client sends `x-ai-router-trail: 1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ai_router_e2e::{
    chat_body, openai_error_problem, pool_yaml_header, script, Pool, PoolSetup, Reply,
};
use serde_json::{json, Value};

async fn chat_with_trail(pool: &Pool, body: &Value) -> Reply {
    pool.client
        .request_with_headers(
            reqwest::Method::POST,
            "/v1/chat/completions",
            Some(&pool.virtual_key),
            Some(body.to_string()),
            &[("x-ai-router-trail", "1")],
        )
        .await
        .unwrap()
}

/// `(provider, key, model, reason)` of each ruled-out lane; the key is "" for a whole candidate.
fn skipped(trail: &Value) -> Vec<(String, String, String, String)> {
    let text = |v: &Value, f: &str| v.get(f).and_then(Value::as_str).unwrap_or("").to_string();
    trail["skipped"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                text(s, "provider"),
                text(s, "key"),
                text(s, "model"),
                text(s, "reason"),
            )
        })
        .collect()
}

/// `(provider, key, model, class, status)` of each attempt.
fn attempts(trail: &Value) -> Vec<(String, String, String, String, u64)> {
    let text = |v: &Value, f: &str| v.get(f).and_then(Value::as_str).unwrap_or("").to_string();
    trail["attempts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                text(a, "provider"),
                text(a, "key"),
                text(a, "model"),
                text(a, "class"),
                a["status"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn lane(p: &str, k: &str, m: &str, why: &str) -> (String, String, String, String) {
    (p.into(), k.into(), m.into(), why.into())
}

fn tried(
    p: &str,
    k: &str,
    m: &str,
    class: &str,
    status: u64,
) -> (String, String, String, String, u64) {
    (p.into(), k.into(), m.into(), class.into(), status)
}

/// Three lanes of growing size on one mock: `small` (kind mistral, an 8K window), `same`
/// (another 8K window), `github` (kind github: the 8K per-request cap over a 128K window) and
/// `large` (128K). Profiles try them small first, or large first.
fn sized_lanes(mock: &str) -> PoolSetup {
    let mut setup = PoolSetup::default();
    for (var, name) in [
        ("CX_SMALL", "small"),
        ("CX_SAME", "same"),
        ("CX_GITHUB", "github"),
        ("CX_LARGE", "large"),
    ] {
        setup.secret_env(var, name);
    }
    setup.yaml = format!(
        "{}providers:\n\
         \x20 - {{ id: small, kind: mistral, baseUrl: {mock}/small/v1, keys: [{{ alias: s1, env: CX_SMALL }}], models: [{{ id: m-small, contextWindow: 8000 }}] }}\n\
         \x20 - {{ id: same, baseUrl: {mock}/same/v1, keys: [{{ alias: e1, env: CX_SAME }}], models: [{{ id: m-same, contextWindow: 8000 }}] }}\n\
         \x20 - {{ id: gh, kind: github, baseUrl: {mock}/gh/v1, keys: [{{ alias: g1, env: CX_GITHUB }}], models: [{{ id: m-gh, contextWindow: 128000 }}] }}\n\
         \x20 - {{ id: large, baseUrl: {mock}/large/v1, keys: [{{ alias: l1, env: CX_LARGE }}], models: [{{ id: m-large, contextWindow: 128000 }}] }}\n\
         profiles:\n\
         \x20 upward: {{ model: m-small, fallbacks: [m-same, m-large] }}\n\
         \x20 capped: {{ model: m-gh, fallbacks: [m-same, m-large] }}\n\
         \x20 downward: {{ model: m-large, fallbacks: [m-small, m-same] }}\n",
        pool_yaml_header()
    );
    setup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_length_error_moves_on_to_a_larger_lane_never_to_one_no_larger() {
    let pool = Pool::start("context_cascade", 1, |m, _| Ok(sized_lanes(&m[0])))
        .await
        .expect("fixture");
    let small = pool.secret_in("CX_SMALL");
    let large = pool.secret_in("CX_LARGE");
    pool.mocks[0]
        .script(json!([
            script::for_key(
                &small,
                vec![script::provider_error("mistral.context_length")]
            ),
            script::for_key(&large, vec![script::text("a long answer")]),
        ]))
        .await
        .unwrap();

    // Upward: small says the prompt is too long; same (no larger) is never tried; large answers.
    pool.clear_calls().await.unwrap();
    let r = chat_with_trail(&pool, &chat_body("upward", false)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.content(), Some("a long answer"));
    assert_eq!(pool.keys_called().await.unwrap(), ["small", "large"]);
    let trail: Value = serde_json::from_str(&r.header("x-ai-router-trail").unwrap()).unwrap();
    assert_eq!(
        attempts(&trail),
        [
            tried("small", "s1", "m-small", "context_length", 400),
            tried("large", "l1", "m-large", "success", 200),
        ]
    );
    // Ruled out for the second attempt: small itself and same, no larger than small.
    assert_eq!(
        skipped(&trail),
        [
            lane("small", "s1", "m-small", "context_window"),
            lane("same", "e1", "m-same", "context_window"),
        ]
    );

    // Downward: large says the prompt is too long; nothing in the plan is larger, so the call
    // stops there with the provider's 400, and its trail.
    let large_too_long = script::for_key(
        &large,
        vec![script::provider_error("mistral.context_length")],
    );
    pool.mocks[0].script(json!([large_too_long])).await.unwrap();
    pool.clear_calls().await.unwrap();
    let r = pool.chat_with(&chat_body("downward", false)).await.unwrap();
    if let Some(p) = openai_error_problem(&r, 400, "upstream_invalid_request") {
        panic!("{p}: {}", r.text);
    }
    assert_eq!(pool.keys_called().await.unwrap(), ["large"]);
    assert_eq!(r.header("x-ai-router-attempts").as_deref(), Some("1"));
    assert_eq!(
        attempts(&r.json["error"]["trail"]),
        [tried("large", "l1", "m-large", "context_length", 400)]
    );

    // Every other 400 stops the call at once, larger lanes or not.
    pool.mocks[0]
        .script(json!([script::for_key(
            &small,
            vec![script::provider_error("mistral.bad_request")]
        )]))
        .await
        .unwrap();
    pool.clear_calls().await.unwrap();
    let r = pool.chat_with(&chat_body("upward", false)).await.unwrap();
    if let Some(p) = openai_error_problem(&r, 400, "upstream_invalid_request") {
        panic!("{p}: {}", r.text);
    }
    assert_eq!(pool.keys_called().await.unwrap(), ["small"]);
    assert_eq!(
        attempts(&r.json["error"]["trail"]),
        [tried("small", "s1", "m-small", "invalid_request", 400)]
    );
    for (_, s) in pool.control_plane_env() {
        assert!(!r.text.contains(s.as_str()), "a secret in the error body");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_models_per_request_cap_rules_a_lane_out_before_sending_and_a_413_moves_on() {
    let pool = Pool::start("request_cap", 1, |m, _| Ok(sized_lanes(&m[0])))
        .await
        .expect("fixture");
    let github = pool.secret_in("CX_GITHUB");
    pool.mocks[0]
        .script(json!([script::for_key(
            &github,
            vec![script::provider_error("github.context_length")]
        )]))
        .await
        .unwrap();

    // About 10K tokens: past GitHub's 8K cap (its model's 128K window does not matter) and
    // past same's window, so large answers without either being sent anything.
    let mut big = chat_body("capped", false);
    big["messages"] = json!([{ "role": "user", "content": "word ".repeat(8_000) }]);
    pool.clear_calls().await.unwrap();
    let r = chat_with_trail(&pool, &big).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(pool.keys_called().await.unwrap(), ["large"]);
    let trail: Value = serde_json::from_str(&r.header("x-ai-router-trail").unwrap()).unwrap();
    assert_eq!(
        skipped(&trail),
        [
            lane("gh", "", "m-gh", "request_cap"),
            lane("same", "", "m-same", "context_window"),
        ]
    );

    // A small prompt goes to GitHub; its 413 (tokens_limit_reached) is a context-length
    // answer: same (8K, no larger than the 8K cap) is passed over, large answers.
    pool.clear_calls().await.unwrap();
    let r = pool.chat_with(&chat_body("capped", false)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(pool.keys_called().await.unwrap(), ["github", "large"]);
    // No trail header unless the client asks for it.
    assert_eq!(r.header("x-ai-router-trail"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_calls_trail_names_every_skipped_lane_and_every_attempt() {
    let pool = Pool::start("trail", 1, |m, _| {
        let mock = &m[0];
        let mut setup = PoolSetup::default();
        for (var, name) in [("TR_A", "a"), ("TR_B", "b"), ("TR_C", "c"), ("TR_D", "d")] {
            setup.secret_env(var, name);
        }
        setup.yaml = format!(
            "{}providers:\n\
             \x20 - {{ id: p1, kind: openai, baseUrl: {mock}/p1/v1, keys: [{{ alias: a, env: TR_A, weight: 100 }}, {{ alias: b, env: TR_B }}], models: [{{ id: m1 }}] }}\n\
             \x20 - {{ id: p2, baseUrl: {mock}/p2/v1, keys: [{{ alias: c, env: TR_C }}], models: [{{ id: m2, capabilities: [chat] }}] }}\n\
             \x20 - {{ id: p3, kind: openai, baseUrl: {mock}/p3/v1, keys: [{{ alias: d, env: TR_D }}], models: [{{ id: m3 }}] }}\n\
             profiles:\n\
             \x20 all: {{ model: m1, fallbacks: [m2, m3], maxAttempts: 5 }}\n\
             resilience:\n\
             \x20 rateLimitCooldownMs: 60000\n",
            pool_yaml_header()
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let (a, b, d) = (
        pool.secret_in("TR_A"),
        pool.secret_in("TR_B"),
        pool.secret_in("TR_D"),
    );
    pool.mocks[0]
        .script(json!([
            // A rate limit that outlasts the call's deadline: the call does not wait for it.
            script::for_key(
                &a,
                vec![script::status(
                    429,
                    json!({ "retry-after": "600" }),
                    Some(json!({ "error": { "message": "Rate limit reached for requests", "type": "requests", "param": null, "code": "rate_limit_exceeded" } })),
                )],
            ),
            script::for_key(&b, vec![script::provider_error("openai.quota_exhausted")]),
            script::for_key(&d, vec![script::provider_error("openai.invalid_key")]),
        ]))
        .await
        .unwrap();
    let mut body = chat_body("all", false);
    body["tools"] = json!([{ "type": "function", "function": { "name": "f", "parameters": { "type": "object" } } }]);

    let r = pool.chat_with(&body).await.unwrap();
    assert!(r.status >= 400, "{}", r.text);
    assert_eq!(pool.keys_called().await.unwrap(), ["a", "b", "d"]);
    let trail = &r.json["error"]["trail"];
    assert_eq!(
        attempts(trail),
        [
            tried("p1", "a", "m1", "rate_limit", 429),
            tried("p1", "b", "m1", "quota", 429),
            tried("p3", "d", "m3", "auth", 401),
        ],
        "{}",
        r.text
    );
    let ruled_out = skipped(trail);
    for want in [
        lane("p2", "", "m2", "no_capability:tools"),
        lane("p1", "a", "m1", "cooldown"),
        lane("p1", "b", "m1", "blacklisted:quota"),
        lane("p3", "d", "m3", "blacklisted:auth"),
    ] {
        assert!(ruled_out.contains(&want), "{want:?} not in {ruled_out:?}");
    }

    // The next call has nothing to try: its trail is every lane ruled out, and no attempt.
    pool.clear_calls().await.unwrap();
    let r = pool.chat_with(&body).await.unwrap();
    assert!(r.status >= 400, "{}", r.text);
    assert!(pool.keys_called().await.unwrap().is_empty());
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("0"),
        "no attempt was sent: {r}"
    );
    let trail = &r.json["error"]["trail"];
    assert_eq!(attempts(trail), []);
    assert_eq!(skipped(trail).len(), 4, "{}", r.text);
    for (_, s) in pool.control_plane_env() {
        assert!(!r.text.contains(s.as_str()), "a secret in the trail");
    }
}
