//! `gateway.onePass` through a real Envoy: a call's first attempt leaves from the public
//! listener (the attempt listener sees none of it), and every failure of that attempt, with an
//! answer or without one, fails over through the attempt listener as in two passes — with the
//! client's request put back, so no provider sees another lane's key or the stages' headers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ai_router_e2e::{script, standard_pool, Gateway, MockCall};
use serde_json::json;

/// The standard pool with one pass on, `extra` added under `defaults`.
fn one_pass_pool(extra: &'static str) -> impl Fn(&str, &str) -> String {
    move |p1, p2| {
        standard_pool(p1, p2)
            .replace(
                "keyStore: { type: memory }",
                "keyStore: { type: memory }\n  onePass: true",
            )
            .replace(
                "  deadlineMs: 30000\n",
                &format!("  deadlineMs: 30000\n{extra}"),
            )
    }
}

/// Requests the attempt listener has taken (the first attempts in one pass are not among them).
async fn through_attempt_listener(gw: &Gateway) -> u64 {
    gw.envoy
        .stat("http.ai_router_attempt.downstream_rq_total")
        .await
        .unwrap_or(0)
}

/// What no provider may see: the virtual key, the plan, any of the stages' headers, Envoy's.
fn assert_clean(gw: &Gateway, call: &MockCall, key: &str) {
    for (name, value) in call.header_pairs() {
        assert!(
            !name.starts_with("x-ai-router-") && !name.starts_with("x-envoy-"),
            "the provider got {name}: {value}"
        );
        assert!(
            !value.contains(&gw.virtual_key),
            "the provider got the virtual key in {name}"
        );
        for other in [&gw.key_a, &gw.key_b, &gw.key_c] {
            if *other != key {
                assert!(
                    !value.contains(other.as_str()),
                    "the provider of key {key} got another lane's key in {name}"
                );
            }
        }
    }
    assert_eq!(call.key.as_deref(), Some(key), "{:?}", call.raw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_goes_in_one_pass_and_a_failed_one_fails_over_through_the_attempt_listener()
{
    let gw = Gateway::start_with("one_pass_failover", one_pass_pool(""))
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::text("from p1")])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("from p2")])]))
        .await
        .unwrap();

    // Successes: never through the attempt listener; the provider gets its own key alone.
    let before = through_attempt_listener(&gw).await;
    for _ in 0..4 {
        gw.clear_calls().await.unwrap();
        let r = gw.chat("chat").await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(r.content(), Some("from p1"), "{r}");
        assert_eq!(
            r.header("x-ai-router-attempts").as_deref(),
            Some("1"),
            "{r}"
        );
        let calls = gw.provider_calls().await.unwrap();
        assert_eq!(calls.len(), 1, "{calls:?}");
        let key = if calls[0].0 == "a" {
            &gw.key_a
        } else {
            &gw.key_b
        };
        assert_clean(&gw, &calls[0].1, key);
        assert_eq!(calls[0].1.model.as_deref(), Some("m1"));
    }
    let s = gw.stream("chat").await.unwrap();
    assert_eq!(s.status, 200, "{}", s.body);
    assert!(
        s.body.contains("from p1") || s.events.len() > 2,
        "{}",
        s.body
    );
    assert_eq!(
        through_attempt_listener(&gw).await,
        before,
        "a success took the attempt listener"
    );

    // Key a answers 429, key b 503, and the stream's first event is an error: each call fails
    // over (p1's other key, then p2) through the attempt listener, with the client's request.
    gw.mock1
        .script(json!([
            script::for_key(
                &gw.key_a,
                vec![script::status(429, json!({ "retry-after": "1" }), Some(json!({
                    "error": { "message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded" }
                })))],
            ),
            script::for_key(&gw.key_b, vec![script::down()]),
        ]))
        .await
        .unwrap();
    gw.clear_calls().await.unwrap();
    let before = through_attempt_listener(&gw).await;
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("from p2"), "{r}");
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("3"),
        "{r}"
    );
    let calls = gw.provider_calls().await.unwrap();
    let keys: Vec<&str> = calls.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert_eq!(keys[2], "c", "{keys:?}");
    for (alias, call) in &calls {
        let key = match alias.as_str() {
            "a" => &gw.key_a,
            "b" => &gw.key_b,
            _ => &gw.key_c,
        };
        assert_clean(&gw, call, key);
        // Every lane got the client's body, its own model in it.
        assert_eq!(call.body["messages"][0]["role"], "user", "{:?}", call.body);
    }
    assert_eq!(calls[2].1.model.as_deref(), Some("m2"));
    assert_eq!(
        through_attempt_listener(&gw).await,
        before + 2,
        "the two retries go through the attempt listener"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_without_an_answer_fails_over_in_one_pass() {
    let gw = Gateway::start_with("one_pass_no_answer", one_pass_pool("  timeoutMs: 600\n"))
        .await
        .expect("fixture");
    gw.mock2
        .script(json!([script::always(vec![script::text("from p2")])]))
        .await
        .unwrap();

    // A provider that says nothing within timeoutMs: the router's per-try timeout retries it.
    gw.mock1
        .script(json!([script::always(vec![
            json!({ "text": "late", "latencyMs": 3000 })
        ])]))
        .await
        .unwrap();
    gw.clear_calls().await.unwrap();
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("from p2"), "{r}");
    let keys = gw.keys_called().await.unwrap();
    assert_eq!(keys.last().map(String::as_str), Some("c"), "{keys:?}");

    // A stream broken before its first token: failed over, the client sees one stream.
    gw.mock1
        .script(json!([script::always(vec![script::stream_failing(
            &["x"],
            0,
            "error-event"
        )])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(&[
            "from ", "p2"
        ])])]))
        .await
        .unwrap();
    let s = gw.stream("chat").await.unwrap();
    assert_eq!(s.status, 200, "{}", s.body);
    assert!(
        s.body.contains("from ") && s.body.contains("p2"),
        "{}",
        s.body
    );
    assert!(!s.body.contains("error"), "{}", s.body);
    gw.check_no_secrets_in_logs().unwrap();
}
