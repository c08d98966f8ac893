//! A Gemini caller on a `kind: gemini` lane: Google's own API end to end (the mock speaking
//! Gemini natively), the caller's body whole, the provider key as `x-goog-api-key`, the answer
//! Google's; and failover from that native lane to a translated one before the first token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ai_router_e2e::{gemini_pool, script, Gateway};
use serde_json::{json, Value};

const REQUEST: &str = r#"{"contents":[{"role":"user","parts":[{"text":"Say hi"}]}],
  "safetySettings":[{"category":"HARM_CATEGORY_HARASSMENT","threshold":"BLOCK_NONE"}],
  "aFieldFromTheFuture":{"x":1}}"#;

async fn post(gw: &Gateway, method: &str) -> reqwest::Response {
    let body: Value = serde_json::from_str(REQUEST).unwrap();
    post_to(gw, &format!("chat:{method}"), &body).await
}

/// `POST /v1beta/models/{call}` (`model:method`) with `body`, the virtual key as Google's.
async fn post_to(gw: &Gateway, call: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1beta/models/{call}", gw.envoy.base_url()))
        .header("x-goog-api-key", &gw.virtual_key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// The fixture key's usage report once `ready` holds of its total.
async fn usage_when(gw: &Gateway, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let keys = gw.admin().get_json("/admin/keys").await.unwrap();
    let path = format!(
        "/admin/keys/{}/usage",
        keys["keys"][0]["id"].as_str().unwrap()
    );
    ai_router_e2e::poll(what, std::time::Duration::from_secs(10), || {
        let (path, ready) = (&path, &ready);
        async move {
            let usage = gw.admin().get_json(path).await?;
            Ok(ready(&usage["total"]).then_some(usage["total"].clone()))
        }
    })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_calls_usage_from_its_usage_metadata_reaches_the_keys_usage() {
    let gw = Gateway::start_with("gemini_native_usage", gemini_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![
            json!({ "thinking": "Let me think about it.", "text": "Hi there" })
        ])]))
        .await
        .unwrap();
    let response = post(&gw, "generateContent").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let meta = &body["usageMetadata"];
    let field = |name: &str| meta[name].as_u64().unwrap_or(0);
    assert!(field("thoughtsTokenCount") > 0, "{body}");
    // Thoughts are billed as output: the key's usage counts them with the candidates.
    let output = field("candidatesTokenCount") + field("thoughtsTokenCount");
    let total = usage_when(&gw, "the call in the key's usage", |t| t["requests"] == 1).await;
    assert_eq!(
        (
            total["promptTokens"].as_u64(),
            total["completionTokens"].as_u64()
        ),
        (Some(field("promptTokenCount")), Some(output)),
        "{total}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_go_back_to_the_native_lane_once_its_429_delay_has_passed() {
    let gw = Gateway::start_with("gemini_native_failback", gemini_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![
            // One for each of p1's keys.
            json!({ "status": 429, "headers": { "retry-after": 1 } }),
            json!({ "status": 429, "headers": { "retry-after": 1 } }),
            json!({ "thinking": "Hmm.", "text": "Native again" }),
        ])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("From p2")])]))
        .await
        .unwrap();
    let response = post(&gw, "generateContent").await;
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["candidates"][0]["content"]["parts"][0]["text"], "From p2",
        "{body}"
    );
    // Served by p2 while p1 cools for its RetryInfo second; then by p1 again, natively (its
    // thought part is Google's own).
    let native = ai_router_e2e::poll(
        "a call served by the native lane again",
        std::time::Duration::from_secs(10),
        || {
            let gw = &gw;
            async move {
                let body: Value = post(gw, "generateContent").await.json().await?;
                let parts = &body["candidates"][0]["content"]["parts"];
                Ok((parts[1]["text"] == "Native again").then(|| parts.clone()))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(native[0]["thought"], true, "{native}");
    let p1 = gw.mock1.calls().await.unwrap();
    assert!(p1
        .iter()
        .all(|c| c.path.ends_with("/models/gem-m:generateContent")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_content_goes_natively_to_a_gemini_lane_and_translated_to_others() {
    let gw = Gateway::start_with("gemini_native_embed", gemini_pool)
        .await
        .expect("fixture");
    let one =
        json!({ "content": { "parts": [{ "text": "hello" }] }, "taskType": "RETRIEVAL_QUERY" });

    // Natively: the caller's body whole to the lane's model, Google's answer as it came.
    let response = post_to(&gw, "gembed:embedContent", &one).await;
    assert_eq!(response.status(), 200);
    let native: Value = response.json().await.unwrap();
    assert_eq!(
        native["embedding"]["values"].as_array().map(Vec::len),
        Some(8),
        "{native}"
    );
    let call = gw.mock1.calls().await.unwrap().pop().unwrap();
    assert!(
        call.path.ends_with("/models/gem-e:embedContent"),
        "{}",
        call.path
    );
    assert_eq!(call.body, one);
    assert_eq!(
        call.headers["x-goog-api-key"],
        json!(call.key.clone().unwrap())
    );

    // Translated: /v1/embeddings on the OpenAI-compatible lane, answered in Google's shape
    // (the mocks embed a text the same way, so the vectors are the native ones).
    let response = post_to(&gw, "oembed:embedContent", &one).await;
    assert_eq!(response.status(), 200);
    let translated: Value = response.json().await.unwrap();
    assert_eq!(translated, json!({ "embedding": native["embedding"] }));
    let call = gw.mock2.calls().await.unwrap().pop().unwrap();
    assert!(call.path.ends_with("/v1/embeddings"), "{}", call.path);
    assert_eq!(call.body["input"], json!(["hello"]));
    assert_eq!(call.body["model"], "te3");

    // A batch, both ways: one vector per request, in order.
    let batch = json!({ "requests": [
        { "model": "models/oembed", "content": { "parts": [{ "text": "hello" }] } },
        { "model": "models/oembed", "content": { "parts": [{ "text": "world" }] } }] });
    let response = post_to(&gw, "oembed:batchEmbedContents", &batch).await;
    assert_eq!(response.status(), 200);
    let translated: Value = response.json().await.unwrap();
    assert_eq!(
        translated["embeddings"][0], native["embedding"],
        "{translated}"
    );
    assert_eq!(translated["embeddings"].as_array().map(Vec::len), Some(2));
    let response = post_to(&gw, "gembed:batchEmbedContents", &batch).await;
    assert_eq!(response.status(), 200);
    let natively: Value = response.json().await.unwrap();
    assert_eq!(natively, translated);
    let call = gw.mock1.calls().await.unwrap().pop().unwrap();
    assert!(call.path.ends_with("/models/gem-e:batchEmbedContents"));
    // Google requires each request to name the path's model: the lane's.
    assert_eq!(call.body["requests"][1]["model"], "models/gem-e");

    // The usage of the translated calls is the provider's; all four are counted.
    let total = usage_when(&gw, "the four calls in the key's usage", |t| {
        t["requests"] == 4
    })
    .await;
    assert!(total["promptTokens"].as_u64() > Some(0), "{total}");

    // A batch body on :embedContent is the caller's mistake, in Google's shape.
    let response = post_to(&gw, "oembed:embedContent", &batch).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["status"], "INVALID_ARGUMENT", "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_is_a_gemini_lanes_own_and_the_estimate_elsewhere() {
    let gw = Gateway::start_with("gemini_native_count", gemini_pool)
        .await
        .expect("fixture");
    let body: Value = serde_json::from_str(REQUEST).unwrap();
    let response = post_to(&gw, "chat:countTokens", &body).await;
    assert_eq!(response.status(), 200);
    let counted: Value = response.json().await.unwrap();
    // Google's answer, its per-modality details included (the estimate has none).
    assert!(counted["promptTokensDetails"].is_array(), "{counted}");
    let call = gw.mock1.calls().await.unwrap().pop().unwrap();
    assert!(
        call.path.ends_with("/models/gem-m:countTokens"),
        "{}",
        call.path
    );
    assert_eq!(call.body, body);

    // The other form: the request it counts names the lane's model.
    let whole = json!({ "generateContentRequest": {
        "model": "models/chat", "contents": body["contents"] } });
    let response = post_to(&gw, "chat:countTokens", &whole).await;
    assert_eq!(response.status(), 200);
    let call = gw.mock1.calls().await.unwrap().pop().unwrap();
    assert_eq!(call.body["generateContentRequest"]["model"], "models/gem-m");

    // A model with no gemini lane: the gateway's estimate, no provider called.
    let before = gw.mock2.calls().await.unwrap().len();
    let response = post_to(&gw, "backup:countTokens", &body).await;
    assert_eq!(response.status(), 200);
    let estimate: Value = response.json().await.unwrap();
    assert!(estimate["totalTokens"].as_u64() > Some(0), "{estimate}");
    assert!(estimate.get("promptTokensDetails").is_none(), "{estimate}");
    assert_eq!(gw.mock2.calls().await.unwrap().len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_only_google_runs_goes_to_the_native_lane_and_is_refused_elsewhere() {
    let gw = Gateway::start_with("gemini_native_only", gemini_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::text("Searched")])]))
        .await
        .unwrap();
    let body = json!({ "contents": [{ "role": "user", "parts": [{ "text": "News?" }] }],
                       "tools": [{ "googleSearch": {} }] });
    // `chat` has a gemini lane (p1) and a translated fallback (m2 on p2): only p1 can take it.
    let response = post_to(&gw, "chat:generateContent", &body).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["candidates"][0]["content"]["parts"][0]["text"], "Searched",
        "{answer}"
    );
    let call = gw.mock1.calls().await.unwrap().pop().unwrap();
    assert_eq!(call.body, body);
    // `backup` has no gemini lane: refused in Google's shape, naming the tool, no call made.
    let response = post_to(&gw, "backup:generateContent", &body).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["status"], "INVALID_ARGUMENT", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("googleSearch")),
        "{error}"
    );
    assert_eq!(
        error["error"]["trail"]["skipped"][0]["reason"], "adapter",
        "{error}"
    );
    assert!(gw.mock2.calls().await.unwrap().is_empty());
}
