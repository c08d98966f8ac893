//! The response cache for the Messages (`/v1/messages`) and Responses (`/v1/responses`)
//! callers through a real Envoy: the same request again is answered by the gateway, in the
//! caller's protocol (unary JSON, or its own SSE events to a streaming caller), without a
//! provider call; a streamed miss is stored and answers a unary caller; each protocol keys its
//! own space (a chat caller of the same conversation misses); `Cache-Control: no-cache`
//! reaches the provider; and the official `anthropic` and `openai` Python SDKs read the
//! replayed answers, streams included (tests/conformance/cache_clients.py), with an
//! OpenAI-compatible provider and with a native Anthropic one.
//! Every answer the tests capture is scanned for the fixture's secrets (the harness does).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::time::Duration;

use ai_router_e2e::{poll, python_bin, script, standard_pool, workspace_root, Gateway, Reply};
use serde_json::{json, Value};

const CACHE: &str = "x-ai-router-cache";

fn pool(p1: &str, p2: &str) -> String {
    format!(
        "{}cache: {{ ttlMs: 60000, maxEntries: 64, maxBytes: 1048576 }}\n",
        standard_pool(p1, p2)
    )
}

/// Both mocks answer every call with `text` (streamed when asked).
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

/// `POST path` with `body` and extra headers (a streamed answer's SSE is its text).
async fn post(gw: &Gateway, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
    gw.client
        .request_with_headers(
            reqwest::Method::POST,
            path,
            Some(&gw.virtual_key),
            Some(body.to_string()),
            headers,
        )
        .await
        .unwrap()
}

/// The first answer of a fresh gateway (the state may take a moment to arrive).
async fn first_answer(gw: &Gateway, path: &str, body: &Value) -> Reply {
    poll("the gateway to answer", Duration::from_secs(15), || {
        let c = gw.client.clone();
        let (key, body, path) = (gw.virtual_key.clone(), body.to_string(), path.to_string());
        async move {
            let r = c
                .request(reqwest::Method::POST, &path, Some(&key), Some(body))
                .await?;
            Ok((r.status == 200).then_some(r))
        }
    })
    .await
    .unwrap()
}

/// The (type, data) of each event of an SSE body.
fn events(sse: &str) -> Vec<(String, Value)> {
    sse.split("\n\n")
        .filter_map(|e| {
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            let data: Value = serde_json::from_str(data).ok()?;
            Some((data["type"].as_str().unwrap_or("").to_string(), data))
        })
        .collect()
}

fn streamed(body: &Value) -> Value {
    let mut s = body.clone();
    s["stream"] = json!(true);
    s
}

/// The text of a Messages answer.
fn message_text(r: &Reply) -> Option<&str> {
    r.json.pointer("/content/0/text").and_then(Value::as_str)
}

/// The text of a Responses answer.
fn response_text(r: &Reply) -> Option<&str> {
    r.json
        .pointer("/output/0/content/0/text")
        .and_then(Value::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_responses_hits_are_answered_in_their_protocol_without_a_provider() {
    let gw = Gateway::start_with("cache_protocols", pool)
        .await
        .expect("fixture");
    answer_with(&gw, "first answer").await;
    let messages = json!({ "model": "chat", "max_tokens": 64, "temperature": 0,
                           "messages": [{ "role": "user", "content": "Capital of France?" }] });
    let responses = json!({ "model": "chat", "temperature": 0, "input": "Capital of Spain?" });

    let m_miss = first_answer(&gw, "/v1/messages", &messages).await;
    assert_eq!(m_miss.header(CACHE).as_deref(), Some("miss"), "{m_miss}");
    assert_eq!(message_text(&m_miss), Some("first answer"), "{m_miss}");
    let r_miss = post(&gw, "/v1/responses", &responses, &[]).await;
    assert_eq!(r_miss.header(CACHE).as_deref(), Some("miss"), "{r_miss}");
    assert_eq!(response_text(&r_miss), Some("first answer"), "{r_miss}");

    // The providers would answer otherwise now: what comes back is the stored answer.
    answer_with(&gw, "second answer").await;
    gw.clear_calls().await.unwrap();

    // Messages: unary, then streamed as Messages events.
    let hit = post(&gw, "/v1/messages", &messages, &[]).await;
    assert_eq!(hit.status, 200, "{hit}");
    assert_eq!(hit.header(CACHE).as_deref(), Some("hit"), "{hit}");
    assert_eq!(hit.header("x-ai-router-cost").as_deref(), Some("0"));
    assert_eq!(hit.json, m_miss.json, "the same message: {hit}");
    let sse = post(&gw, "/v1/messages", &streamed(&messages), &[]).await;
    assert_eq!(sse.header(CACHE).as_deref(), Some("hit"), "{sse}");
    assert!(sse
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream")));
    let got = events(&sse.text);
    assert_eq!(
        got.first().map(|(k, _)| k.as_str()),
        Some("message_start"),
        "{sse}"
    );
    assert_eq!(
        got.last().map(|(k, _)| k.as_str()),
        Some("message_stop"),
        "{sse}"
    );
    let text: String = got
        .iter()
        .filter(|(k, _)| k == "content_block_delta")
        .filter_map(|(_, d)| d.pointer("/delta/text").and_then(Value::as_str))
        .collect();
    assert_eq!(text, "first answer", "{sse}");
    assert_eq!(
        provider_calls(&gw).await,
        0,
        "Messages hits call no provider"
    );

    // Responses: unary, then streamed as typed Responses events.
    let hit = post(&gw, "/v1/responses", &responses, &[]).await;
    assert_eq!(hit.header(CACHE).as_deref(), Some("hit"), "{hit}");
    assert_eq!(
        hit.json["id"], r_miss.json["id"],
        "the same response: {hit}"
    );
    assert_eq!(response_text(&hit), Some("first answer"), "{hit}");
    let sse = post(&gw, "/v1/responses", &streamed(&responses), &[]).await;
    assert_eq!(sse.header(CACHE).as_deref(), Some("hit"), "{sse}");
    let got = events(&sse.text);
    assert_eq!(
        got.first().map(|(k, _)| k.as_str()),
        Some("response.created")
    );
    assert_eq!(
        got.last().map(|(k, _)| k.as_str()),
        Some("response.completed"),
        "{sse}"
    );
    let text: String = got
        .iter()
        .filter(|(k, _)| k == "response.output_text.delta")
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    assert_eq!(text, "first answer", "{sse}");
    assert_eq!(
        provider_calls(&gw).await,
        0,
        "Responses hits call no provider"
    );

    // The chat caller of the same conversation is in another key space: a miss.
    let chat = json!({ "model": "chat", "max_tokens": 64, "temperature": 0,
                       "messages": [{ "role": "user", "content": "Capital of France?" }] });
    let r = gw
        .client
        .chat_with(&chat, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_eq!(r.header(CACHE).as_deref(), Some("miss"), "{r}");
    assert_eq!(provider_calls(&gw).await, 1);

    // no-cache goes to the provider for both, and says so.
    for (path, body) in [("/v1/messages", &messages), ("/v1/responses", &responses)] {
        let fresh = post(&gw, path, body, &[("cache-control", "no-cache")]).await;
        assert_eq!(fresh.header(CACHE).as_deref(), Some("bypass"), "{fresh}");
        assert!(fresh.text.contains("second answer"), "{path}: {fresh}");
    }
    assert_eq!(provider_calls(&gw).await, 3);

    // A streamed miss is stored as the answer it assembles to: the unary call is a hit.
    for (path, body, text_of) in [
        (
            "/v1/messages",
            json!({ "model": "chat", "max_tokens": 64,
                    "messages": [{ "role": "user", "content": "Streamed first." }] }),
            message_text as fn(&Reply) -> Option<&str>,
        ),
        (
            "/v1/responses",
            json!({ "model": "chat", "input": "Streamed first." }),
            response_text,
        ),
    ] {
        let miss = post(&gw, path, &streamed(&body), &[]).await;
        assert_eq!(miss.header(CACHE).as_deref(), Some("miss"), "{miss}");
        let calls = provider_calls(&gw).await;
        // The store ends with the stream's last bytes; poll, it may land a moment after.
        let hit = poll(
            "the streamed answer stored",
            Duration::from_secs(10),
            || {
                let (gw, body) = (&gw, body.clone());
                async move {
                    let r = post(gw, path, &body, &[]).await;
                    Ok((r.header(CACHE).as_deref() == Some("hit")).then_some(r))
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(text_of(&hit), Some("second answer"), "{path}: {hit}");
        assert_eq!(provider_calls(&gw).await, calls, "{path}: a hit");
    }
    gw.check_no_secrets_in_logs().unwrap();
}

/// Runs tests/conformance/cache_clients.py against a gateway whose first provider is of
/// `kind`: an anthropic one serves the Messages caller natively (its own answers and SSE are
/// what is stored), any other through chat completions.
async fn sdk_clients(test: &str, kind: &str) {
    let gw = Gateway::start_with(test, |p1, p2| {
        pool(p1, p2).replacen("kind: openai-compatible", &format!("kind: {kind}"), 1)
    })
    .await
    .expect("fixture");
    answer_with(&gw, "Hello from the cache").await;
    // The state may take a moment to arrive: the script's first calls must find it.
    first_answer(
        &gw,
        "/v1/chat/completions",
        &json!({ "model": "chat", "messages": [{ "role": "user", "content": "warm up" }] }),
    )
    .await;
    gw.clear_calls().await.unwrap();

    let script_path = workspace_root().join("tests/conformance/cache_clients.py");
    let out = tokio::process::Command::new(python_bin().unwrap())
        .arg(&script_path)
        .env("AI_ROUTER_BASE_URL", gw.openai_base_url())
        .env("AI_ROUTER_API_KEY", &gw.virtual_key)
        .env("AI_ROUTER_MODEL", "chat")
        .env("AI_ROUTER_EXPECT", "Hello from the cache")
        .env("NO_PROXY", "*")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), out)
        .await
        .expect("cache_clients.py finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    std::fs::write(gw.dir.join("cache_clients.stdout"), stdout.as_bytes()).unwrap();
    assert!(
        out.status.success(),
        "cache_clients.py exited {}\n{stdout}\n{stderr}",
        out.status
    );
    // Two misses per protocol (one unary, one streamed) reached a provider; every other call
    // was a hit.
    let calls = gw.provider_calls().await.unwrap();
    assert_eq!(calls.len(), 4, "{stdout}");
    if kind == "anthropic" {
        let native = calls
            .iter()
            .filter(|(_, c)| c.path.ends_with("/v1/messages"))
            .count();
        assert_eq!(native, 4, "every call reached the Messages API");
    }
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_and_openai_sdks_read_replayed_answers() {
    sdk_clients("cache_protocols_sdks", "openai-compatible").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_read_replayed_answers_of_a_native_anthropic_provider() {
    sdk_clients("cache_protocols_sdks_anthropic", "anthropic").await;
}
