//! In-process tests over a real socket.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

async fn mock() -> MockHandle {
    start(MockOptions::default()).await.unwrap()
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(
    mock: &MockHandle,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response<Incoming> {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("{}{path}", mock.url()));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    client().request(request).await.unwrap()
}

async fn json_of(response: Response<Incoming>) -> Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

async fn put_script(mock: &MockHandle, script: Value) {
    let response = send(mock, "PUT", "/_mock/script", &[], &script.to_string()).await;
    assert_eq!(response.status(), 200);
}

/// Every SSE `data:` payload of a finished stream body.
fn data_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn default_chat_completion_and_recorded_call() {
    let mock = mock().await;
    let body = json!({"model": "gpt-mock", "messages": [{"role": "user", "content": "hi there"}]});
    let response = send(
        &mock,
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-test-1"), ("X-Trace", "abc")],
        &body.to_string(),
    )
    .await;
    assert_eq!(response.status(), 200);
    let reply = json_of(response).await;
    assert_eq!(reply["id"], "chatcmpl-mock-1");
    assert_eq!(reply["model"], "gpt-mock");
    assert_eq!(
        reply["choices"][0]["message"]["content"],
        "Hello from the ai-router mock."
    );
    assert_eq!(reply["usage"]["prompt_tokens"], 2);

    let calls = json_of(send(&mock, "GET", "/_mock/calls", &[], "").await).await;
    let call = &calls["calls"][0];
    assert_eq!(call["seq"], 1);
    assert_eq!(call["path"], "/v1/chat/completions");
    assert_eq!(call["key"], "sk-test-1");
    assert_eq!(call["model"], "gpt-mock");
    assert_eq!(call["stream"], false);
    assert_eq!(call["headers"]["x-trace"], "abc");
    assert_eq!(call["body"], body);
    assert_eq!(mock.calls().len(), 1);

    let cleared = json_of(send(&mock, "DELETE", "/_mock/calls", &[], "").await).await;
    assert_eq!(cleared["cleared"], 1);
    assert!(mock.calls().is_empty());
}

#[tokio::test]
async fn scripted_sequence_per_key_then_reset() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({"rules": [
            {"match": {"key": "sk-test-1"}, "replies": [
                {"status": 429, "headers": {"retry-after": "30"}},
                {"providerError": "openai.quota_exhausted"},
            ]},
        ]}),
    )
    .await;
    let call = |key: &'static str| {
        let mock = &mock;
        async move {
            send(
                mock,
                "POST",
                "/v1/chat/completions",
                &[("authorization", &format!("Bearer {key}"))],
                r#"{"model":"m","messages":[]}"#,
            )
            .await
        }
    };
    let first = call("sk-test-1").await;
    assert_eq!(first.status(), 429);
    assert_eq!(first.headers()["retry-after"], "30");
    assert_eq!(json_of(first).await["error"]["type"], "rate_limit_error");
    assert_eq!(call("sk-test-2").await.status(), 200);
    for _ in 0..2 {
        let quota = call("sk-test-1").await;
        assert_eq!(quota.status(), 429);
        assert_eq!(json_of(quota).await["error"]["code"], "insufficient_quota");
    }

    let reset = send(&mock, "POST", "/_mock/reset", &[], "").await;
    assert_eq!(reset.status(), 200);
    assert!(mock.calls().is_empty());
    let after = call("sk-test-1").await;
    assert_eq!(after.status(), 200);
    assert_eq!(json_of(after).await["id"], "chatcmpl-mock-1");
}

#[tokio::test]
async fn bad_scripts_and_rules_are_refused() {
    let mock = mock().await;
    let response = send(
        &mock,
        "PUT",
        "/_mock/script",
        &[],
        r#"{"rules":[{"replies":[{"providerError":"openai.nope"}]}]}"#,
    )
    .await;
    assert_eq!(response.status(), 400);
    let message = json_of(response).await["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("bad script: rule 0: reply 0: unknown providerError"),
        "{message}"
    );

    let response = send(&mock, "POST", "/_mock/rules", &[], "{not json").await;
    assert_eq!(response.status(), 400);

    let response = send(
        &mock,
        "POST",
        "/_mock/rules",
        &[],
        r#"{"match":{"path":"/embeddings"},"replies":[{"dimensions":3}]}"#,
    )
    .await;
    assert_eq!(json_of(response).await["rules"], 1);
    let embeddings = json_of(
        send(
            &mock,
            "POST",
            "/v1/embeddings",
            &[],
            r#"{"model":"e","input":["a","b"]}"#,
        )
        .await,
    )
    .await;
    assert_eq!(embeddings["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        embeddings["data"][0]["embedding"].as_array().unwrap().len(),
        3
    );

    let health = json_of(send(&mock, "GET", "/_mock/health", &[], "").await).await;
    assert_eq!(health, json!({"status": "ok"}));
    assert_eq!(
        send(&mock, "GET", "/v1/nothing", &[], "").await.status(),
        404
    );
}

#[tokio::test]
async fn network_error_closes_the_connection_without_a_response() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({"rules": [{"replies": [{"error": "network"}]}]}),
    )
    .await;
    let mut stream = TcpStream::connect(mock.addr()).await.unwrap();
    let body = r#"{"model":"m","messages":[]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut received))
        .await
        .unwrap();
    // Either a clean close or a reset, but never a byte of response.
    if let Err(error) = read {
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    }
    assert!(
        received.is_empty(),
        "{}",
        String::from_utf8_lossy(&received)
    );
    assert_eq!(mock.calls().len(), 1);
}

#[tokio::test]
async fn fail_after_with_network_breaks_the_body() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({"rules": [{"match": {"model": "m-stream"},
                           "replies": [{"stream": {"chunks": ["a", "b"], "failAfter": 1}}]}]}),
    )
    .await;
    let response = send(
        &mock,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"model":"m-stream","stream":true,"messages":[]}"#,
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut body = response.into_body();
    let mut received = String::new();
    let error = loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    received.push_str(&String::from_utf8_lossy(data));
                }
            }
            Some(Err(error)) => break error,
            None => panic!("the body ended cleanly: {received}"),
        }
    };
    // A reset or an early close: either way the client sees a broken body, not an end.
    let cause = std::error::Error::source(&error).map(ToString::to_string);
    assert!(
        error.is_incomplete_message() || cause.is_some(),
        "{error}: {cause:?}"
    );
    eprintln!("body error: {error}: {cause:?}");
    let events = data_lines(&received);
    assert_eq!(events.len(), 2, "{received}");
    let second: Value = serde_json::from_str(&events[1]).unwrap();
    assert_eq!(second["choices"][0]["delta"]["content"], "a");
    assert!(!received.contains("[DONE]"));
}

#[tokio::test]
async fn a_default_stream_with_usage_and_timed_chunks() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({"rules": [{"match": {"model": "slow"},
                           "replies": [{"stream": {"chunks": ["x", "y"], "delayMs": 150}}]}]}),
    )
    .await;
    let response = send(
        &mock,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"12345678"}]}"#,
    )
    .await;
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let events = data_lines(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 2);
    let finish: Value = serde_json::from_str(&events[events.len() - 3]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");

    // Each chunk is its own frame, delayed as scripted.
    let response = send(
        &mock,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"model":"slow","stream":true,"messages":[]}"#,
    )
    .await;
    let mut body = response.into_body();
    let mut arrivals = Vec::new();
    while let Some(frame) = body.frame().await {
        if frame.unwrap().data_ref().is_some() {
            arrivals.push(Instant::now());
        }
    }
    // role, x, y, finish, DONE
    assert!(arrivals.len() >= 4, "{}", arrivals.len());
    let first = arrivals[0];
    let last = arrivals[arrivals.len() - 1];
    assert!(
        last - first >= Duration::from_millis(400),
        "{:?}",
        last - first
    );
}

#[tokio::test]
async fn anthropic_messages_with_x_api_key() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({"rules": [{"match": {"key": "sk-ant-test-2"},
                           "replies": [{"providerError": "anthropic.overloaded", "latencyMs": 50}]}]}),
    )
    .await;
    let body =
        r#"{"model":"claude-mock","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    let ok = send(
        &mock,
        "POST",
        "/v1/messages",
        &[("x-api-key", "sk-ant-test-1")],
        body,
    )
    .await;
    assert_eq!(ok.status(), 200);
    let message = json_of(ok).await;
    assert_eq!(message["type"], "message");
    assert_eq!(
        message["content"][0]["text"],
        "Hello from the ai-router mock."
    );

    let started = Instant::now();
    let overloaded = send(
        &mock,
        "POST",
        "/v1/messages",
        &[("x-api-key", "sk-ant-test-2")],
        body,
    )
    .await;
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(overloaded.status(), 529);
    assert_eq!(
        json_of(overloaded).await["error"]["type"],
        "overloaded_error"
    );

    let stream_body = r#"{"model":"claude-mock","max_tokens":10,"stream":true,"messages":[]}"#;
    let streamed = send(
        &mock,
        "POST",
        "/v1/messages",
        &[("x-api-key", "sk-ant-test-1")],
        stream_body,
    )
    .await;
    let text = String::from_utf8(
        streamed
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(
        text.trim_end()
            .ends_with(r#"data: {"type":"message_stop"}"#),
        "{text}"
    );
    assert_eq!(mock.calls()[0].key.as_deref(), Some("sk-ant-test-1"));
}

#[tokio::test]
async fn error_event_and_truncate_end_the_body_cleanly() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({"rules": [
            {"match": {"model": "ev"}, "replies": [{"stream": {"failAfter": 1, "failWith": "error-event"}}]},
            {"match": {"model": "tr"}, "replies": [{"stream": {"failWith": "truncate"}}]},
        ]}),
    )
    .await;
    for (model, last_has) in [("ev", "\"error\""), ("tr", "\"content\":\"mock.\"")] {
        let response = send(
            &mock,
            "POST",
            "/v1/chat/completions",
            &[],
            &json!({"model": model, "stream": true, "messages": []}).to_string(),
        )
        .await;
        let text = String::from_utf8(
            response
                .into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap();
        let events = data_lines(&text);
        assert!(events.last().unwrap().contains(last_has), "{model}: {text}");
        assert!(!text.contains("[DONE]"));
        assert!(!text.contains("finish_reason\":\"stop"));
    }
}

#[tokio::test]
async fn a_script_file_loads_at_start_and_h2c_works() {
    let path = std::env::temp_dir().join(format!("ai-router-mock-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "rules:\n  - match: { model: m }\n    replies:\n      - { text: from the file }\n",
    )
    .unwrap();
    let mock = start(MockOptions {
        script: Some(path.clone()),
        ..MockOptions::default()
    })
    .await
    .unwrap();
    std::fs::remove_file(&path).unwrap();

    let h2: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let request = Request::post(format!("{}/v1/chat/completions", mock.url()))
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","messages":[]}"#,
        )))
        .unwrap();
    let response = h2.request(request).await.unwrap();
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    assert_eq!(
        json_of(response).await["choices"][0]["message"]["content"],
        "from the file"
    );

    let missing = start(MockOptions {
        script: Some("/nonexistent/mock.yaml".into()),
        ..MockOptions::default()
    })
    .await;
    assert!(missing
        .unwrap_err()
        .to_string()
        .contains("cannot read script"));
}

#[tokio::test]
async fn dropping_the_handle_stops_the_server() {
    let mock = mock().await;
    let addr = mock.addr();
    drop(mock);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn the_responses_api_unary_and_streamed() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({ "rules": [{ "match": { "model": "tools" },
            "replies": [{ "toolCalls": [{ "name": "f", "argumentChunks": ["{\"a\"", ":1}"] }] }] }] }),
    )
    .await;
    let response = send(
        &mock,
        "POST",
        "/v1/responses",
        &[("authorization", "Bearer sk-test-1")],
        r#"{"model":"m","input":"Say hi","store":true}"#,
    )
    .await;
    assert_eq!(response.status(), 200);
    let body = json_of(response).await;
    assert_eq!(body["object"], "response");
    assert_eq!(
        body["output"][0]["content"][0]["text"],
        "Hello from the ai-router mock."
    );
    assert!(body["usage"]["input_tokens"].as_u64().unwrap() > 0);

    let response = send(
        &mock,
        "POST",
        "/v1/responses",
        &[],
        r#"{"model":"tools","input":"x","stream":true}"#,
    )
    .await;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let events: Vec<Value> = data_lines(&String::from_utf8_lossy(&bytes))
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(events[4]["item"]["arguments"], "{\"a\":1}");
    let calls = mock.calls();
    assert_eq!(calls[0].path, "/v1/responses");
}

#[tokio::test]
async fn reset_after_headers_sends_the_status_then_breaks_the_body() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({"rules": [{"replies": [{"error": "reset-after-headers"}]}]}),
    )
    .await;
    for stream in [false, true] {
        let body = json!({"model": "m", "stream": stream, "messages": []}).to_string();
        let response = send(&mock, "POST", "/v1/chat/completions", &[], &body).await;
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let mut received = Vec::new();
        let broken = loop {
            match body.frame().await {
                Some(Ok(frame)) => received.extend_from_slice(frame.data_ref().unwrap()),
                Some(Err(_)) => break true,
                None => break false,
            }
        };
        assert!(broken, "stream {stream}: the body ended cleanly");
        assert!(received.is_empty(), "stream {stream}: {received:?}");
    }
}

#[tokio::test]
async fn a_trickled_unary_body_arrives_whole_in_timed_pieces() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({"rules": [{"replies": [{"trickleMs": 40, "text": "slow but whole"}]}]}),
    )
    .await;
    let started = Instant::now();
    let response = send(
        &mock,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"model":"m","messages":[]}"#,
    )
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut frames = 0;
    let mut received = Vec::new();
    while let Some(frame) = body.frame().await {
        received.extend_from_slice(frame.unwrap().data_ref().unwrap());
        frames += 1;
    }
    assert_eq!(frames, 8);
    assert!(started.elapsed() >= Duration::from_millis(7 * 40));
    let reply: Value = serde_json::from_slice(&received).unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "slow but whole");
}

#[tokio::test]
async fn the_gemini_api_natively() {
    let mock = mock().await;
    put_script(
        &mock,
        json!({ "rules": [
            { "match": { "model": "gemini-tools" },
              "replies": [{ "thinking": "hmm", "toolCalls": [{ "name": "f", "arguments": {"a": 1} }] }] },
            { "match": { "key": "slow" }, "replies": [{ "status": 429, "headers": {"retry-after": 9} }] },
            { "match": { "key": "daily" }, "replies": [{ "providerError": "gemini.free_daily" }] },
        ] }),
    )
    .await;
    let request = r#"{"contents":[{"role":"user","parts":[{"text":"Say hi"}]}],"extra":1}"#;
    let goog = [("x-goog-api-key", "g-key")];
    let response = send(
        &mock,
        "POST",
        "/v1beta/models/gemini-mock:generateContent",
        &goog,
        request,
    )
    .await;
    assert_eq!(response.status(), 200);
    let body = json_of(response).await;
    assert_eq!(
        body["candidates"][0]["content"]["parts"][0]["text"],
        "Hello from the ai-router mock."
    );
    assert_eq!(body["modelVersion"], "gemini-mock");
    assert_eq!(body["usageMetadata"]["promptTokenCount"], 2);
    let call = mock.calls().pop().unwrap();
    assert_eq!(
        (call.key.as_deref(), call.model.as_deref(), call.stream),
        (Some("g-key"), Some("gemini-mock"), false)
    );

    // Streamed with ?alt=sse and ?key=: the thought, the function call whole, the last chunk.
    let response = send(
        &mock,
        "POST",
        "/v1beta/models/gemini-tools:streamGenerateContent?alt=sse&key=q-key",
        &[],
        request,
    )
    .await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let events: Vec<Value> = data_lines(&String::from_utf8_lossy(&bytes))
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let parts: Vec<&Value> = events
        .iter()
        .map(|e| &e["candidates"][0]["content"]["parts"][0])
        .collect();
    assert_eq!(parts[0]["thought"], true);
    assert_eq!(parts[1]["functionCall"]["args"], json!({"a": 1}));
    assert_eq!(events[2]["candidates"][0]["finishReason"], "STOP");
    assert_eq!(events[2]["usageMetadata"]["thoughtsTokenCount"], 1);
    assert_eq!(mock.calls().pop().unwrap().key.as_deref(), Some("q-key"));

    // Without alt=sse: one JSON array.
    let response = send(
        &mock,
        "POST",
        "/v1beta/models/m:streamGenerateContent",
        &goog,
        request,
    )
    .await;
    let array = json_of(response).await;
    assert!(array.as_array().unwrap().len() > 1, "{array}");

    let count = json_of(
        send(
            &mock,
            "POST",
            "/v1beta/models/m:countTokens",
            &goog,
            request,
        )
        .await,
    )
    .await;
    assert_eq!(count["totalTokens"], 2);
    let embed = json_of(
        send(
            &mock,
            "POST",
            "/v1beta/models/e:embedContent",
            &goog,
            r#"{"content":{"parts":[{"text":"a"}]},"outputDimensionality":3}"#,
        )
        .await,
    )
    .await;
    assert_eq!(embed["embedding"]["values"].as_array().unwrap().len(), 3);

    // Google's errors: no key, no contents, a scripted 429, a table answer.
    let no_key = send(
        &mock,
        "POST",
        "/v1beta/models/m:generateContent",
        &[],
        request,
    )
    .await;
    assert_eq!(no_key.status(), 403);
    assert_eq!(
        json_of(no_key).await["error"]["status"],
        "PERMISSION_DENIED"
    );
    let empty = send(
        &mock,
        "POST",
        "/v1beta/models/m:generateContent",
        &goog,
        "{}",
    )
    .await;
    assert_eq!(empty.status(), 400);
    assert_eq!(json_of(empty).await["error"]["status"], "INVALID_ARGUMENT");
    let slow = send(
        &mock,
        "POST",
        "/v1beta/models/m:generateContent",
        &[("x-goog-api-key", "slow")],
        request,
    )
    .await;
    assert_eq!(slow.status(), 429);
    let slow = json_of(slow).await;
    assert_eq!(slow["error"]["status"], "RESOURCE_EXHAUSTED");
    assert_eq!(slow["error"]["details"][0]["retryDelay"], "9s");
    let daily = send(
        &mock,
        "POST",
        "/v1beta/models/m:generateContent",
        &[("x-goog-api-key", "daily")],
        request,
    )
    .await;
    assert_eq!(daily.status(), 429);
    let daily = json_of(daily).await;
    assert_eq!(
        daily["error"]["code"], 429,
        "the object, not the list: {daily}"
    );
}
