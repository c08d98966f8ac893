//! The response cache (`cache:` of the pool) through a real Envoy: a second identical call is
//! answered by the gateway without any provider call (unary, and replayed as SSE to a
//! streaming client), costs 0 and its saving reaches the key's usage; `Cache-Control:
//! no-cache` reaches the provider; another temperature or model misses; a failed answer is
//! not stored, a cleanly ended stream is; an entry past its TTL misses; a profile or a key
//! with `cache: false` never hits.
//! Every answer the tests capture is scanned for the fixture's secrets (the harness does).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::{poll, script, standard_pool, Gateway, Reply};
use serde_json::{json, Value};

const CACHE: &str = "x-ai-router-cache";
const TTL_MS: u64 = 3_000;

fn pool(p1: &str, p2: &str) -> String {
    let base = standard_pool(p1, p2).replace(
        "{ id: m1, aliases: [chat] }",
        "{ id: m1, aliases: [chat], cost: { input: 2, output: 10 } }",
    );
    format!(
        "{base}cache: {{ ttlMs: {TTL_MS}, maxEntries: 64, maxBytes: 1048576 }}\n\
         profiles:\n  fresh: {{ model: m1, fallbacks: [], cache: false }}\n"
    )
}

/// A chat body only this test sends.
fn body(model: &str, words: &str, temperature: f64) -> Value {
    json!({
        "model": model,
        "temperature": temperature,
        "messages": [{ "role": "user", "content": words }],
    })
}

/// Both mocks answer every call with `text` (and usage).
async fn answer_with(gw: &Gateway, text: &str) {
    let reply = json!({ "text": text, "usage": { "prompt_tokens": 100, "completion_tokens": 20 } });
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![reply.clone()])]))
            .await
            .unwrap();
    }
}

async fn provider_calls(gw: &Gateway) -> usize {
    gw.provider_calls().await.unwrap().len()
}

async fn chat(gw: &Gateway, body: &Value, headers: &[(&str, &str)]) -> Reply {
    gw.client
        .chat_with_headers(body, Some(&gw.virtual_key), headers)
        .await
        .unwrap()
}

/// Sends `body` until an answer satisfies `done`.
async fn chat_until(gw: &Gateway, what: &str, body: &Value, done: fn(&Reply) -> bool) -> Reply {
    chat_as(gw, &gw.virtual_key, what, body, done).await
}

/// Sends `body` with the virtual key `secret` until an answer satisfies `done`.
async fn chat_as(
    gw: &Gateway,
    secret: &str,
    what: &str,
    body: &Value,
    done: fn(&Reply) -> bool,
) -> Reply {
    poll(what, Duration::from_secs(15), || {
        let c = gw.client.clone();
        let (secret, body) = (secret.to_string(), body.clone());
        async move {
            let r = c.chat_with(&body, Some(&secret)).await?;
            Ok(done(&r).then_some(r))
        }
    })
    .await
    .unwrap()
}

/// An admin API call with the admin token; the answer's JSON.
async fn admin(gw: &Gateway, method: reqwest::Method, path: &str, body: Value) -> Value {
    gw.admin()
        .call_json(method, path, Some(&body))
        .await
        .unwrap()
}

/// The fixture key's usage report once its `saved` reached `at_least`.
async fn usage_saving(gw: &Gateway, at_least: f64) -> Value {
    let keys = gw.admin().get_json("/admin/keys").await.unwrap();
    let id = keys["keys"][0]["id"].as_str().unwrap().to_string();
    poll(
        "the hits' saving in the usage row",
        Duration::from_secs(10),
        || {
            let path = format!("/admin/keys/{id}/usage");
            async move {
                let usage = gw.admin().get_json(&path).await?;
                Ok((usage["total"]["saved"].as_f64().unwrap_or(0.0) >= at_least).then_some(usage))
            }
        },
    )
    .await
    .unwrap()
}

/// The first answer of a fresh gateway (the state may take a moment to arrive).
async fn first_answer(gw: &Gateway, body: &Value) -> Reply {
    chat_until(gw, "the gateway to answer", body, |r| r.status == 200).await
}

/// `body` asked as a stream; its answer must be valid SSE ending in `[DONE]`.
async fn stream(gw: &Gateway, body: &Value) -> ai_router_e2e::StreamReply {
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let sse = gw
        .client
        .stream_with(&streamed, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert!(sse.is_whole(), "valid SSE ending in [DONE]: {sse}");
    sse
}

/// A gateway for `pool` whose providers answer `text`.
async fn start(test: &str, pool: impl Fn(&str, &str) -> String, text: &str) -> Gateway {
    let gw = Gateway::start_with(test, pool).await.expect("fixture");
    answer_with(&gw, text).await;
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_identical_call_is_answered_from_the_cache_without_a_provider() {
    let gw = start("cache_hit", pool, "first answer").await;
    let request = body("chat", "What is the capital of France?", 0.0);
    let miss = first_answer(&gw, &request).await;
    assert_eq!(miss.header(CACHE).as_deref(), Some("miss"), "{miss}");
    assert_eq!(miss.content(), Some("first answer"));

    // The providers would answer otherwise now: what comes back is the stored answer.
    answer_with(&gw, "second answer").await;
    gw.clear_calls().await.unwrap();
    let hit = chat(&gw, &request, &[]).await;
    assert_eq!(hit.status, 200, "{hit}");
    assert_eq!(hit.header(CACHE).as_deref(), Some("hit"), "{hit}");
    assert_eq!(hit.content(), Some("first answer"), "{hit}");
    assert_eq!(hit.json["id"], miss.json["id"], "the same answer: {hit}");
    assert_eq!(hit.header("x-ai-router-cost").as_deref(), Some("0"));
    assert_eq!(hit.header("x-ai-router-model").as_deref(), Some("m1"));
    assert!(hit.header("x-request-id").is_some());
    assert_eq!(provider_calls(&gw).await, 0, "a hit calls no provider");

    // A streaming client gets the same answer as SSE; `stream` does not split the key.
    let sse = stream(&gw, &request).await;
    assert_eq!(sse.header(CACHE).as_deref(), Some("hit"), "{sse}");
    assert!(
        sse.header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream")),
        "{sse}"
    );
    assert_eq!(sse.text(), "first answer");
    assert_eq!(sse.role_chunks(), 1);
    assert!(
        sse.json_events()
            .iter()
            .all(|e| e["object"] == "chat.completion.chunk"),
        "{sse}"
    );
    assert_eq!(
        provider_calls(&gw).await,
        0,
        "a streamed hit calls no provider"
    );

    // Cache-Control: no-cache goes to the provider, and says so.
    let fresh = chat(&gw, &request, &[("cache-control", "no-cache")]).await;
    assert_eq!(fresh.header(CACHE).as_deref(), Some("bypass"), "{fresh}");
    assert_eq!(fresh.content(), Some("second answer"));
    assert_eq!(provider_calls(&gw).await, 1);
    // ... and did not replace the stored answer.
    let again = chat(&gw, &request, &[]).await;
    assert_eq!(again.content(), Some("first answer"), "{again}");

    // Another temperature, another model: misses.
    for other in [
        body("chat", "What is the capital of France?", 0.7),
        body("backup", "What is the capital of France?", 0.0),
    ] {
        let r = chat(&gw, &other, &[]).await;
        assert_eq!(r.header(CACHE).as_deref(), Some("miss"), "{other}: {r}");
        assert_eq!(r.content(), Some("second answer"));
    }
    assert_eq!(provider_calls(&gw).await, 3);

    // The hits' saving (100 x 2 + 20 x 10 per million, each) reaches the key's usage row.
    let usage = usage_saving(&gw, 3.0 * 0.000_4 - 1e-9).await;
    assert!(
        (usage["total"]["saved"].as_f64().unwrap() - 3.0 * 0.000_4).abs() < 1e-9,
        "three hits of 0.0004 each: {usage}"
    );
    // ... and the stats' cache counters (each worker's reports arrive on their own).
    let stats = poll(
        "the stats to count the three misses",
        Duration::from_secs(5),
        || {
            let gw = &gw;
            async move {
                let stats = gw.admin().get_json("/admin/stats").await?;
                Ok((stats["cache"]["misses"].as_u64() >= Some(3)).then_some(stats))
            }
        },
    )
    .await
    .unwrap();
    let cache = &stats["cache"];
    assert_eq!(
        (cache["hits"].as_u64(), cache["bypassed"].as_u64()),
        (Some(3), Some(1)),
        "{stats}"
    );
    assert!(cache["misses"].as_u64() >= Some(3), "{stats}");
    assert!(
        (cache["saved"].as_f64().unwrap_or(0.0) - 3.0 * 0.000_4).abs() < 1e-9,
        "{stats}"
    );
    gw.cp
        .metric_line(&["ai_router_cache_lookups_total{result=\"hit\"} 3"])
        .await
        .unwrap();
    gw.cp
        .metric_line(&["ai_router_cache_stores_total", "outcome=\"stored\""])
        .await
        .unwrap();
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_answers_are_not_stored_a_clean_stream_is_and_an_entry_expires_with_its_ttl() {
    let gw = start("cache_expiry", pool, "warm up").await;
    first_answer(&gw, &body("chat", "warm up", 0.0)).await;

    // A stream that ends cleanly is stored as the completion it assembles to: a unary client
    // of the same request then hits it, without a provider.
    answer_with(&gw, "streamed and stored").await;
    let asked = body("chat", "Stream this, please.", 0.0);
    let sse = stream(&gw, &asked).await;
    assert_eq!(sse.header(CACHE).as_deref(), Some("miss"), "{sse}");
    gw.clear_calls().await.unwrap();
    let hit = chat(&gw, &asked, &[]).await;
    assert_eq!(hit.header(CACHE).as_deref(), Some("hit"), "{hit}");
    assert_eq!(hit.content(), Some(sse.text().as_str()), "{hit}");
    assert_eq!(hit.json["object"], "chat.completion");
    assert_eq!(provider_calls(&gw).await, 0);

    // Every provider down: the error answer is a miss and is not stored.
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![script::down()])]))
            .await
            .unwrap();
    }
    let request = body("chat", "Name a prime number.", 0.0);
    let failed = chat(&gw, &request, &[]).await;
    assert!(failed.status >= 500, "{failed}");
    assert_eq!(failed.header(CACHE).as_deref(), Some("miss"), "{failed}");
    answer_with(&gw, "seven").await;
    gw.clear_calls().await.unwrap();
    let answered = chat(&gw, &request, &[]).await;
    assert_eq!(
        (answered.status, answered.header(CACHE).as_deref()),
        (200, Some("miss")),
        "the failure was not stored: {answered}"
    );
    let stored_at = Instant::now();
    assert_eq!(provider_calls(&gw).await, 1);
    let hit = chat(&gw, &request, &[]).await;
    assert_eq!(hit.header(CACHE).as_deref(), Some("hit"), "{hit}");

    // Past its TTL the entry misses and the provider is called again.
    let expired = chat_until(&gw, "the entry to expire", &request, |r| {
        r.header(CACHE).as_deref() == Some("miss")
    })
    .await;
    assert!(
        stored_at.elapsed() >= Duration::from_millis(TTL_MS - 200),
        "a miss only past the TTL: {:?}",
        stored_at.elapsed()
    );
    assert_eq!(expired.content(), Some("seven"));
    assert_eq!(
        provider_calls(&gw).await,
        2,
        "the expired entry called the provider"
    );
    gw.cp
        .metric_line(&["ai_router_cache_stores_total", "outcome=\"unstorable\""])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_or_a_key_with_cache_false_never_hits() {
    let gw = start("cache_opt_out", pool, "uncached").await;
    let request = body("fresh", "Count to three.", 0.0);
    let first = first_answer(&gw, &request).await;
    assert_eq!(
        first.header(CACHE),
        None,
        "the cache is off for the profile: {first}"
    );
    gw.clear_calls().await.unwrap();
    for _ in 0..2 {
        let r = chat(&gw, &request, &[]).await;
        assert_eq!((r.status, r.header(CACHE)), (200, None), "{r}");
    }
    assert_eq!(
        provider_calls(&gw).await,
        2,
        "every call reaches the provider"
    );

    // A stored key created with `cache: false` never hits; `cache: null` leaves it to the
    // policy again (on).
    let created = admin(
        &gw,
        reqwest::Method::POST,
        "/admin/keys",
        json!({ "label": "nocache", "models": ["*"], "cache": false }),
    )
    .await;
    assert_eq!(created["key"]["cache"], json!(false), "{created}");
    let secret = created["secret"].as_str().unwrap().to_string();
    ai_router_e2e::scan::register("a stored virtual key", &secret);
    let id = created["key"]["id"].as_str().unwrap().to_string();
    let request = body("chat", "Count to five.", 0.0);
    gw.clear_calls().await.unwrap();
    for _ in 0..2 {
        let r = chat_as(&gw, &secret, "the new key", &request, |r| r.status == 200).await;
        assert_eq!(r.header(CACHE), None, "{r}");
    }
    assert_eq!(
        provider_calls(&gw).await,
        2,
        "the key's calls skip the cache"
    );
    let patched = admin(
        &gw,
        reqwest::Method::PATCH,
        &format!("/admin/keys/{id}"),
        json!({ "cache": null }),
    )
    .await;
    assert_eq!(patched.get("cache"), None, "{patched}");
    let hit = chat_as(&gw, &secret, "the key's change", &request, |r| {
        r.header(CACHE).as_deref() == Some("hit")
    })
    .await;
    assert_eq!(hit.content(), Some("uncached"));
    drop(gw);

    // The key's own `cache: false` wins over the pool's cache.
    let opted_out = |p1: &str, p2: &str| {
        format!(
            "{}mountedKeys:\n  - {{ label: e2e, env: STARCI_AI_KEY, profiles: ['*'], models: ['*'], cache: false }}\n",
            pool(p1, p2)
        )
    };
    let gw = start("cache_key_opt_out", opted_out, "uncached").await;
    let request = body("chat", "Count to four.", 0.0);
    first_answer(&gw, &request).await;
    gw.clear_calls().await.unwrap();
    for _ in 0..2 {
        let r = chat(&gw, &request, &[]).await;
        assert_eq!((r.status, r.header(CACHE)), (200, None), "{r}");
    }
    assert_eq!(provider_calls(&gw).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_stored_without_its_usage_chunk_saves_its_real_usage_on_a_hit() {
    let gw = start("cache_stream_saving", pool, "streamed once").await;
    first_answer(&gw, &body("chat", "warm up", 0.0)).await;
    // The client asks for no usage chunk: the attempt asked the provider for it all the same,
    // and the stored answer keeps it.
    let asked = body("chat", "Stream this without usage.", 0.0);
    let missed = stream(&gw, &asked).await;
    assert_eq!(missed.header(CACHE).as_deref(), Some("miss"), "{missed}");
    assert!(
        missed
            .json_events()
            .iter()
            .all(|e| e.get("usage").is_none_or(Value::is_null)),
        "no usage chunk unasked: {missed}"
    );
    gw.clear_calls().await.unwrap();
    let hit = stream(&gw, &asked).await;
    assert_eq!(hit.header(CACHE).as_deref(), Some("hit"), "{hit}");
    assert!(
        hit.json_events()
            .iter()
            .all(|e| e.get("usage").is_none_or(Value::is_null)),
        "the hit's replay has no usage chunk unasked either: {hit}"
    );
    assert_eq!(provider_calls(&gw).await, 0);

    // One hit saved 100 x 2 + 20 x 10 per million at m1's price.
    let usage = usage_saving(&gw, 1e-12).await;
    assert!(
        (usage["total"]["saved"].as_f64().unwrap() - 0.000_4).abs() < 1e-9,
        "one hit of 0.0004: {usage}"
    );
}
