//! A Gemini caller on a `kind: gemini` lane: Google's own API end to end (the mock speaking
//! Gemini natively), the caller's body whole, the provider key as `x-goog-api-key`, the answer
//! Google's; and failover from that native lane to a translated one before the first token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ai_router_e2e::{script, Gateway};
use serde_json::{json, Value};

/// `p1` (kind gemini, mock 1) serving `gem-m` (alias `chat`); `p2` (openai-compatible, mock 2)
/// serving `m2`, the fallback.
fn gemini_pool(p1: &str, p2: &str) -> String {
    ai_router_e2e::standard_pool(p1, p2)
        .replace(
            "kind: openai-compatible\n    baseUrl: ",
            "kind: KIND\n    baseUrl: ",
        )
        .replacen("kind: KIND", "kind: gemini", 1)
        .replace("kind: KIND", "kind: openai-compatible")
        .replace(
            "{ id: m1, aliases: [chat] }",
            "{ id: gem-m, aliases: [chat] }",
        )
}

const REQUEST: &str = r#"{"contents":[{"role":"user","parts":[{"text":"Say hi"}]}],
  "safetySettings":[{"category":"HARM_CATEGORY_HARASSMENT","threshold":"BLOCK_NONE"}],
  "aFieldFromTheFuture":{"x":1}}"#;

async fn post(gw: &Gateway, method: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!(
            "{}/v1beta/models/chat:{method}",
            gw.envoy.base_url()
        ))
        .header("x-goog-api-key", &gw.virtual_key)
        .header("content-type", "application/json")
        .body(REQUEST)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_caller_reaches_a_gemini_lane_over_googles_own_api() {
    let gw = Gateway::start_with("gemini_native", gemini_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![
            json!({ "thinking": "Hmm.", "text": "Hi there" })
        ])]))
        .await
        .unwrap();
    let response = post(&gw, "generateContent").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let parts = &body["candidates"][0]["content"]["parts"];
    assert_eq!(
        parts[0],
        json!({ "text": "Hmm.", "thought": true }),
        "{body}"
    );
    assert_eq!(parts[1]["text"], "Hi there");
    assert!(body["usageMetadata"]["promptTokenCount"].as_u64().unwrap() > 0);

    let calls = gw.mock1.calls().await.unwrap();
    let call = calls.last().expect("a call to p1");
    assert!(
        call.path.ends_with("/models/gem-m:generateContent"),
        "{}",
        call.path
    );
    // The caller's body whole (no model: the path names it), the provider key as Google's.
    let sent: Value = serde_json::from_str(REQUEST).unwrap();
    assert_eq!(call.body, sent);
    assert!(call.key.is_some());
    assert_eq!(
        call.headers["x-goog-api-key"],
        json!(call.key.clone().unwrap())
    );
    assert!(
        call.headers.get("authorization").is_none(),
        "{}",
        call.headers
    );
    assert!(!call.raw.to_string().contains(&gw.virtual_key));

    // Streamed: Google's SSE chunks as they came, the thought first.
    let response = reqwest::Client::new()
        .post(format!(
            "{}/v1beta/models/chat:streamGenerateContent?alt=sse",
            gw.envoy.base_url()
        ))
        .header("x-goog-api-key", &gw.virtual_key)
        .body(REQUEST)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let events: Vec<Value> = text
        .split("\r\n\r\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(
        events[0]["candidates"][0]["content"]["parts"][0]["thought"], true,
        "{text}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    let call = gw.mock1.calls().await.unwrap().pop().unwrap();
    assert!(
        call.path.ends_with("/models/gem-m:streamGenerateContent"),
        "{}",
        call.path
    );
    assert!(call.stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_on_the_native_lane_fails_over_to_a_translated_one_before_the_first_token() {
    let gw = Gateway::start_with("gemini_native_failover", gemini_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![
            json!({ "providerError": "gemini.rate_limited" })
        ])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(&[
            "From", " p2"
        ])])]))
        .await
        .unwrap();
    let response = post(&gw, "generateContent").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["candidates"][0]["content"]["parts"][0]["text"], "From p2",
        "{body}"
    );
    // p1 was tried natively, p2 got the translation.
    let p1 = gw.mock1.calls().await.unwrap();
    assert!(p1.iter().any(|c| c.path.ends_with(":generateContent")));
    let p2 = gw.mock2.calls().await.unwrap();
    let translated = p2.last().expect("a call to p2");
    assert!(
        translated.path.ends_with("/chat/completions"),
        "{}",
        translated.path
    );
    assert_eq!(translated.body["messages"][0]["content"], "Say hi");
    assert_eq!(translated.body["model"], "m2");

    // The 429 cooled p1 with its RetryInfo delay: the next call goes to p2 at once.
    let before = gw.mock1.calls().await.unwrap().len();
    let response = post(&gw, "generateContent").await;
    assert_eq!(response.status(), 200);
    assert_eq!(gw.mock1.calls().await.unwrap().len(), before);
}
