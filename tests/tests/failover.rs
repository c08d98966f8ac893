//! Resilience through a real Envoy: a rate-limited key cools down for its retry-after, a key
//! whose secret is refused gets no more traffic, a provider failing on every key falls over to
//! the next provider, and a provider's 400 is returned once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::{openai_error_problem, script, Gateway, Reply};
use serde_json::json;

/// Makes calls until one is answered after first trying key `a` (equal keys alternate, so that
/// takes at most a few calls); returns the reply, the keys that call tried and when it started.
async fn call_until_key_a_is_tried(gw: &Gateway) -> (Reply, Vec<String>, Instant) {
    let mut seen = Vec::new();
    for _ in 0..6 {
        gw.clear_calls().await.unwrap();
        let started = Instant::now();
        let r = gw.chat("chat").await.unwrap();
        let keys = gw.keys_called().await.unwrap();
        if keys.first().map(String::as_str) == Some("a") {
            return (r, keys, started);
        }
        assert_eq!(
            keys,
            ["b"],
            "a call that does not start on a is served by b:\n{r}"
        );
        assert_eq!(r.status, 200, "{r}");
        seen.push(keys);
    }
    panic!("six calls never tried key a (keys per call: {seen:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_key_is_avoided_until_its_retry_after_passes() {
    let gw = Gateway::start("rate_limited_key").await.expect("fixture");
    gw.mock1
        .script(json!([
            script::for_key(
                &gw.key_a,
                vec![
                    script::status(429, json!({ "retry-after": "2" }), Some(json!({
                        "error": { "message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded" }
                    }))),
                    script::text("from a"),
                ],
            ),
            script::for_key(&gw.key_b, vec![script::text("from b")]),
        ]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("from c")])]))
        .await
        .unwrap();

    // The 429 is retried at once on key b.
    let (r, keys, limited_at) = call_until_key_a_is_tried(&gw).await;
    assert_eq!(keys, ["a", "b"], "after a's 429 the call goes to b:\n{r}");
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("from b"), "{r}");
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("2"),
        "{r}"
    );
    assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m1"), "{r}");

    // While the retry-after holds, no call touches a.
    let mut avoided = 0;
    while limited_at.elapsed() < Duration::from_millis(1500) {
        gw.clear_calls().await.unwrap();
        let r = gw.chat("chat").await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        let keys = gw.keys_called().await.unwrap();
        assert_eq!(
            keys,
            ["b"],
            "{:?} after the 429, a call must avoid a:\n{r}",
            limited_at.elapsed()
        );
        assert_eq!(
            r.header("x-ai-router-attempts").as_deref(),
            Some("1"),
            "{r}"
        );
        avoided += 1;
    }
    assert!(avoided >= 3, "only {avoided} calls in 1.5 s");

    // Once it has passed, a serves again.
    gw.clear_calls().await.unwrap();
    let back = ai_router_e2e::poll("key a to serve again", Duration::from_secs(15), || {
        let gw = &gw;
        async move {
            let r = gw.chat("chat").await?;
            anyhow::ensure!(r.status == 200, "{r}");
            Ok((r.content() == Some("from a")).then(|| limited_at.elapsed()))
        }
    })
    .await
    .unwrap();
    assert!(
        back >= Duration::from_millis(1900),
        "key a served again {back:?} after its 429 with retry-after: 2"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_secret_is_refused_gets_no_more_traffic() {
    let gw = Gateway::start("refused_key").await.expect("fixture");
    gw.mock1
        .script(json!([
            script::for_key(
                &gw.key_a,
                vec![script::status(401, json!({}), Some(json!({
                    "error": { "message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, "code": "invalid_api_key" }
                })))],
            ),
            script::for_key(&gw.key_b, vec![script::text("from b")]),
        ]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("from c")])]))
        .await
        .unwrap();

    let (r, keys, _) = call_until_key_a_is_tried(&gw).await;
    assert_eq!(keys, ["a", "b"], "after a's 401 the call goes to b:\n{r}");
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("from b"), "{r}");
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("2"),
        "{r}"
    );

    gw.clear_calls().await.unwrap();
    for i in 0..10 {
        let r = gw.chat("chat").await.unwrap();
        assert_eq!(r.status, 200, "call {i}: {r}");
        assert_eq!(r.content(), Some("from b"), "call {i}: {r}");
        assert_eq!(
            r.header("x-ai-router-attempts").as_deref(),
            Some("1"),
            "call {i}: {r}"
        );
    }
    // A new client (a new connection, possibly another Envoy worker) avoids a too: the
    // blacklist comes from the control plane's push, not only from one VM's local view.
    let other = ai_router_e2e::Client::new(&gw.envoy.base_url()).unwrap();
    for i in 0..6 {
        let r = other.chat("chat", Some(&gw.virtual_key)).await.unwrap();
        assert_eq!(r.status, 200, "new client, call {i}: {r}");
    }
    let keys = gw.keys_called().await.unwrap();
    assert!(
        keys.iter().all(|k| k == "b"),
        "a blacklisted key got traffic again: {keys:?}"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_failing_on_every_key_falls_over_to_the_next_provider() {
    let gw = Gateway::start("provider_down").await.expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::status(
            503,
            json!({}),
            Some(json!({ "error": { "message": "The server is overloaded", "type": "server_error", "param": null, "code": null } })),
        )])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("from p2")])]))
        .await
        .unwrap();

    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("from p2"), "{r}");
    assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m2"), "{r}");
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("3"),
        "a, b, then c:\n{r}"
    );
    assert!(
        !r.header("x-request-id").unwrap_or_default().is_empty(),
        "{r}"
    );

    let p1 = gw.mock1.calls().await.unwrap();
    let mut p1_keys: Vec<String> = p1.iter().map(|c| gw.alias_of(c.key.as_deref())).collect();
    p1_keys.sort();
    assert_eq!(p1_keys, ["a", "b"], "each of p1's keys is tried once");
    assert!(
        p1.iter().all(|c| c.model.as_deref() == Some("m1")),
        "{p1:?}"
    );
    let p2 = gw.mock2.calls().await.unwrap();
    assert_eq!(p2.len(), 1, "{p2:?}");
    assert_eq!(gw.alias_of(p2[0].key.as_deref()), "c");
    assert_eq!(
        p2[0].model.as_deref(),
        Some("m2"),
        "the fallback's own model id: {:?}",
        p2[0].raw
    );

    // Every attempt of one call carries the same request id to the providers.
    let ids: Vec<Option<String>> = p1
        .iter()
        .chain(p2.iter())
        .map(|c| c.header("x-request-id"))
        .collect();
    if ids.iter().all(Option::is_some) {
        assert!(
            ids.windows(2).all(|w| w[0] == w[1]),
            "request ids differ between attempts: {ids:?}"
        );
    }
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_400_is_returned_once_and_not_retried() {
    let gw = Gateway::start("provider_400").await.expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::status(
            400,
            json!({}),
            Some(json!({ "error": {
                "message": "This model's maximum context length is 8 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded"
            } })),
        )])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("from p2")])]))
        .await
        .unwrap();

    let r = gw.chat("chat").await.unwrap();
    if let Some(problem) = openai_error_problem(&r, 400, "upstream_invalid_request") {
        panic!("a provider's 400: {problem}");
    }
    let message = r.json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("maximum context length"),
        "the provider's message is passed on: {r}"
    );
    assert_eq!(
        r.json["error"]["param"], "messages",
        "and the field it refused: {r}"
    );
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("1"),
        "{r}"
    );
    assert!(
        !r.header("x-request-id").unwrap_or_default().is_empty(),
        "{r}"
    );
    assert_eq!(
        gw.mock1.calls().await.unwrap().len(),
        1,
        "exactly one attempt"
    );
    assert!(
        gw.mock2.calls().await.unwrap().is_empty(),
        "no fallback after a 400"
    );

    // It is not a lane failure: the next call goes through p1 again.
    gw.mock1
        .script(json!([script::always(vec![script::text("from p1")])]))
        .await
        .unwrap();
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("from p1"), "{r}");
}

/// Envoy's default circuit breakers allow 3 retries in flight per cluster: under concurrency
/// most calls then failed with "retry overflow" instead of failing over. Every call of two
/// waves of 64 concurrent ones tries p1 (always 503) and must still be answered by p2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_holds_at_64_concurrent_calls_with_one_provider_always_failing() {
    const CONCURRENT: usize = 64;
    // Breakers that never open keep p1 in every call's path, so every call retries.
    let never_open = "{ failureThreshold: 1000000, cooldownMs: 1000, maxCooldownMs: 1000 }";
    let gw = Gateway::start_with("failover_concurrent", |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2).replace(
            "resilience:\n",
            &format!("resilience:\n  keyBreaker: {never_open}\n  providerBreaker: {never_open}\n"),
        )
    })
    .await
    .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::status(
            503,
            json!({}),
            Some(json!({ "error": { "message": "The server is overloaded", "type": "server_error", "param": null, "code": null } })),
        )])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("from p2")])]))
        .await
        .unwrap();

    for wave in 0..2 {
        gw.clear_calls().await.unwrap();
        let calls = (0..CONCURRENT).map(|_| gw.chat("chat"));
        let replies = futures::future::join_all(calls).await;
        let failed: Vec<String> = replies
            .iter()
            .filter_map(|r| match r {
                Ok(r) if r.status == 200 && r.content() == Some("from p2") => None,
                Ok(r) => Some(format!("{} {}", r.status, r.text)),
                Err(e) => Some(format!("{e:#}")),
            })
            .collect();
        assert!(
            failed.is_empty(),
            "wave {wave}: {} of {CONCURRENT} concurrent calls failed, e.g. {:?}\n{}",
            failed.len(),
            failed.first(),
            gw.tails()
        );
        // Each call did fail over: p1 saw at least one attempt per call.
        let p1 = gw.mock1.calls().await.unwrap().len();
        assert!(p1 >= CONCURRENT, "wave {wave}: p1 saw only {p1} attempts");
        let p2 = gw.mock2.calls().await.unwrap().len();
        assert_eq!(p2, CONCURRENT, "wave {wave}");
    }
    let overflows = gw.envoy.overflows().await.unwrap();
    assert!(
        overflows.is_empty(),
        "Envoy counted overflows: {overflows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_answer_that_is_not_what_it_claims_fails_over() {
    let gw = Gateway::start("not_what_it_claims").await.expect("fixture");
    // p1 answers 200 with a proxy's HTML page, whatever was asked.
    gw.mock1
        .script(json!([script::always(vec![json!({
            "status": 200,
            "headers": {"content-type": "text/html"},
            "body": "<html><body>Service Unavailable</body></html>"
        })])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(&[
            "from", " p2"
        ])])]))
        .await
        .unwrap();
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("from p2"), "{r}");
    assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m2"), "{r}");
    let s = gw.stream("chat").await.unwrap();
    assert_eq!(s.status, 200, "{s}");
    assert_eq!(s.contents().concat(), "from p2", "{s}");
    assert!(!s.body.contains("<html>"), "{s}");
}

/// The `idempotency-key` every provider call of `calls` carried; fails when one carried none.
fn idempotency_keys(calls: &[(String, ai_router_e2e::MockCall)]) -> Vec<String> {
    calls
        .iter()
        .map(|(alias, c)| {
            c.header("idempotency-key")
                .unwrap_or_else(|| panic!("no idempotency-key on the call to {alias}: {c:?}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_idempotency_key_reaches_providers_only_as_a_per_tenant_digest() {
    let gw = Gateway::start("idempotency_key").await.expect("fixture");
    let other = gw
        .admin()
        .create_key(&json!({ "label": "other_tenant", "models": ["*"] }))
        .await
        .unwrap()
        .1;
    let body = ai_router_e2e::chat_body("chat", false);
    let send = |key: String| {
        let (c, body) = (gw.client.clone(), body.clone());
        async move {
            c.chat_with_headers(&body, Some(&key), &[("idempotency-key", "order-42")])
                .await
        }
    };
    // The other tenant's key answers once the control plane has pushed it.
    ai_router_e2e::poll(
        "the new key to reach Envoy",
        Duration::from_secs(10),
        || {
            let send = send(other.clone());
            async move { Ok((send.await?.status == 200).then_some(())) }
        },
    )
    .await
    .unwrap();

    // The first call fails on both of p1's keys, so it makes three attempts (a, b, then c).
    let overloaded = json!([script::always(vec![script::status(
        503,
        json!({}),
        Some(json!({ "error": { "message": "overloaded", "type": "server_error" } })),
    )])]);
    gw.mock1.script(overloaded).await.unwrap();
    let mut per_call = Vec::new();
    for (i, key) in [&gw.virtual_key, &gw.virtual_key, &other]
        .into_iter()
        .enumerate()
    {
        gw.clear_calls().await.unwrap();
        let r = send(key.clone()).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        let calls = gw.provider_calls().await.unwrap();
        if i == 0 {
            assert_eq!(calls.len(), 3, "a, b, then c: {calls:?}");
            gw.mock1.reset().await.unwrap();
        }
        let keys = idempotency_keys(&calls);
        assert!(
            keys.windows(2).all(|w| w[0] == w[1]),
            "every attempt of one call carries the same key: {keys:?}"
        );
        assert!(
            !keys[0].contains("order-42"),
            "the client's value went upstream as is: {keys:?}"
        );
        per_call.push(keys[0].clone());
    }
    assert_eq!(
        per_call[0], per_call[1],
        "a retry of the same client value by the same tenant is the same key upstream"
    );
    assert_ne!(
        per_call[0], per_call[2],
        "two tenants sending the same Idempotency-Key must differ upstream"
    );

    // Without an Idempotency-Key, the request id stands in: per call, never as the client sent it.
    gw.clear_calls().await.unwrap();
    let r = gw
        .client
        .chat_with_headers(&body, Some(&gw.virtual_key), &[("x-request-id", "rid-7")])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let calls = gw.provider_calls().await.unwrap();
    let keys = idempotency_keys(&calls);
    assert!(
        keys.iter().all(|k| k != "rid-7" && *k == keys[0]),
        "{keys:?}"
    );
    assert_ne!(keys[0], per_call[0]);
    assert!(
        calls
            .iter()
            .all(|(_, c)| c.header("x-request-id").as_deref() == Some("rid-7")),
        "the client's request id still goes upstream as x-request-id: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_breaker_open_a_call_sends_nothing_and_says_so() {
    let gw = Gateway::start_with("breakers_open_unsent", |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2).replace(
            "resilience:\n",
            "resilience:\n  keyBreaker: { failureThreshold: 1, cooldownMs: 600000, maxCooldownMs: 600000 }\n",
        )
    })
    .await
    .expect("fixture");
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![script::status(
            500,
            json!({}),
            Some(json!({ "error": { "message": "boom", "type": "server_error" } })),
        )])]))
        .await
        .unwrap();
    }
    let r = gw.chat("chat").await.unwrap();
    if let Some(p) = openai_error_problem(&r, 502, "upstream_error") {
        panic!("every lane failed upstream: {p}");
    }
    // Once the control plane has pushed the open breakers, a call finds no lane to send to.
    let gw = &gw;
    let r = ai_router_e2e::poll(
        "a call that sends nothing",
        Duration::from_secs(10),
        move || async move {
            gw.clear_calls().await?;
            let r = gw.chat("chat").await?;
            Ok(gw.provider_calls().await?.is_empty().then_some(r))
        },
    )
    .await
    .unwrap();
    if let Some(p) = openai_error_problem(&r, 503, "pool_unavailable") {
        panic!("no lane can serve it, and none failed upstream: {p}");
    }
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("0"),
        "{r}"
    );
    let retry_after: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {r}"));
    assert!(
        (500..=600).contains(&retry_after),
        "Retry-After {retry_after}: until the breakers let a probe through"
    );
}
