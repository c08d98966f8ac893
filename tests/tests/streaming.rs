//! Streams through a real Envoy: a failure before the first token fails over invisibly (the
//! client sees one clean stream from another lane); a failure after it ends the client's stream
//! with an OpenAI error event and is not retried.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ai_router_e2e::{script, Gateway, StreamReply};
use serde_json::{json, Value};

/// One clean stream of `chunks`: one role chunk, the content in order, no error, `[DONE]` last.
fn assert_clean_stream(s: &StreamReply, chunks: &[&str], calls: &str) {
    assert_eq!(s.status, 200, "{s}\n--- provider calls ---\n{calls}");
    assert!(
        s.header("content-type")
            .unwrap_or_default()
            .starts_with("text/event-stream"),
        "{s}"
    );
    assert!(
        !s.header("x-request-id").unwrap_or_default().is_empty(),
        "{s}"
    );
    assert!(s.transport_error.is_none(), "{s}");
    assert_eq!(s.role_chunks(), 1, "exactly one role chunk:\n{s}");
    assert_eq!(
        s.contents(),
        chunks,
        "the content in order, nothing of the failed lane:\n{s}"
    );
    for e in s.json_events() {
        assert!(e.get("error").is_none(), "no error event expected:\n{s}");
    }
    assert_eq!(s.events.last().map(String::as_str), Some("[DONE]"), "{s}");
    assert_eq!(s.events.iter().filter(|e| *e == "[DONE]").count(), 1, "{s}");
}

async fn fails_over_before_the_first_token(test: &str, fail_with: &str) {
    let gw = Gateway::start(test).await.expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::stream_failing(
            &["never", "seen"],
            0,
            fail_with
        )])]))
        .await
        .unwrap();
    let good = ["Hello", " from", " p2"];
    gw.mock2
        .script(json!([script::always(vec![script::stream(&good)])]))
        .await
        .unwrap();

    let s = gw.stream("chat").await.unwrap();
    let p1 = gw.mock1.calls().await.unwrap();
    let p2 = gw.mock2.calls().await.unwrap();
    let calls = format!(
        "p1 (keys {:?}): {} call(s); p2: {} call(s)",
        p1.iter()
            .map(|c| gw.alias_of(c.key.as_deref()))
            .collect::<Vec<_>>(),
        p1.len(),
        p2.len()
    );
    assert_clean_stream(&s, &good, &calls);
    assert!(!s.body.contains("never"), "{s}");

    assert!(
        !p1.is_empty(),
        "p1 was tried first: the stream failed there"
    );
    assert!(
        p1.iter()
            .all(|c| c.stream && c.model.as_deref() == Some("m1")),
        "{p1:?}"
    );
    let p2 = gw.mock2.calls().await.unwrap();
    assert_eq!(p2.len(), 1, "{p2:?}");
    assert!(p2[0].stream, "{:?}", p2[0].raw);
    assert_eq!(p2[0].model.as_deref(), Some("m2"), "{:?}", p2[0].raw);
    assert_eq!(gw.alias_of(p2[0].key.as_deref()), "c");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_first_event_is_an_error_fails_over_invisibly() {
    fails_over_before_the_first_token("stream_error_event_first", "error-event").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_before_the_first_token_fails_over_invisibly() {
    fails_over_before_the_first_token("stream_drop_before_token", "network").await;
}

/// A provider stream that fails after the first token: the client keeps what it got, the call
/// is not retried, and the stream never ends with `[DONE]`.
async fn fails_after_the_first_token(
    test: &str,
    fail_with: &str,
) -> (Gateway, ai_router_e2e::StreamReply) {
    let gw = Gateway::start(test).await.expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::stream_failing(
            &["one", " two", " three"],
            2,
            fail_with
        )])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(&["from p2"])])]))
        .await
        .unwrap();

    let s = gw.stream("chat").await.unwrap();
    assert_eq!(s.status, 200, "the stream had started:\n{s}");
    assert_eq!(s.role_chunks(), 1, "{s}");
    assert_eq!(
        s.contents(),
        ["one", " two"],
        "what was sent before the failure:\n{s}"
    );
    assert!(
        !s.events.iter().any(|e| e == "[DONE]"),
        "a failed stream does not end with [DONE]:\n{s}"
    );
    assert_eq!(gw.mock1.calls().await.unwrap().len(), 1, "one attempt");
    assert!(
        gw.mock2.calls().await.unwrap().is_empty(),
        "no retry after the first token"
    );
    gw.check_no_secrets_in_logs().unwrap();
    (gw, s)
}

fn assert_ends_with_error_event(s: &ai_router_e2e::StreamReply) {
    let last = s
        .events
        .last()
        .and_then(|e| serde_json::from_str::<Value>(e).ok())
        .unwrap_or(Value::Null);
    let error = last
        .get("error")
        .unwrap_or_else(|| panic!("the stream ends with an error event:\n{s}"));
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error.message:\n{s}"
    );
    assert!(error["type"].is_string(), "error.type:\n{s}");
    assert!(error.get("code").is_some(), "error.code:\n{s}");
    assert!(
        s.transport_error.is_none(),
        "the gateway ends the client's stream with an error event, not a broken connection:\n{s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_off_after_the_first_token_ends_with_an_error_event() {
    // The provider ends its body cleanly but without finishing the answer ([DONE]).
    let (_gw, s) = fails_after_the_first_token("stream_truncated_after_token", "truncate").await;
    assert_ends_with_error_event(&s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_error_after_the_first_token_ends_the_stream_with_it() {
    let (_gw, s) = fails_after_the_first_token("stream_error_after_token", "error-event").await;
    assert_ends_with_error_event(&s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_data_after_the_first_token_ends_the_stream_with_one_error_event() {
    // The provider sends a chunk that is not JSON, then goes on to `[DONE]`: the client gets
    // one OpenAI error event in its place and nothing after it, and the attempt is a failure.
    let (gw, s) = fails_after_the_first_token("stream_malformed_after_token", "malformed").await;
    assert_ends_with_error_event(&s);
    assert!(
        !s.body.contains("{\"delta\": \n"),
        "the malformed chunk was passed on:\n{s}"
    );
    assert_eq!(
        s.events.iter().filter(|e| e.contains("\"error\"")).count(),
        1,
        "{s}"
    );
    // The attempt failed, and so did the call: it is no success for the key's usage either.
    gw.cp
        .metric_line(&["ai_router_attempts_total{", "class=\"stream\""])
        .await
        .unwrap();
    gw.cp
        .metric_line(&["ai_router_requests_total{", "outcome=\"error:stream\""])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_after_the_first_token_breaks_the_clients_stream() {
    // Envoy cannot append to a response whose upstream connection was reset (no filter runs on a
    // reset; see docs/architecture.md, "A stream cut after its first token"), so the client's
    // body is cut off: over HTTP/1.1 without its final chunk, over HTTP/2 by a RST_STREAM with an
    // error code. Every HTTP client reports either as an error; the stream never looks complete.
    let (gw, s) = fails_after_the_first_token("stream_drop_after_token", "network").await;
    assert!(
        s.transport_error.is_some(),
        "the client must see the stream break off, not a clean end:\n{s}"
    );
    let h2 = ai_router_e2e::Client::new_h2(&gw.envoy.base_url()).unwrap();
    let s = h2.stream("chat", Some(&gw.virtual_key)).await.unwrap();
    assert_eq!(s.contents(), ["one", " two"], "{s}");
    assert!(
        s.transport_error.is_some() && !s.events.iter().any(|e| e == "[DONE]"),
        "an HTTP/2 client sees the stream reset with an error, not ended:\n{s}"
    );
    gw.cp
        .metric_line(&["ai_router_requests_total{", "outcome=\"error:stream\""])
        .await
        .unwrap();
}

/// A server that ignores `stream` and answers JSON: the client still gets the stream it asked
/// for, in its protocol's events, with the answer's usage, and the lane served it (no
/// failover, nothing against the breaker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_answer_to_a_stream_request_is_served_as_a_stream() {
    let gw = Gateway::start("json_to_stream").await.expect("fixture");
    let completion = json!({
        "id": "chatcmpl-json", "object": "chat.completion", "created": 1, "model": "m1",
        "choices": [{ "index": 0, "finish_reason": "stop",
            "message": { "role": "assistant", "content": "plain json" } }],
        "usage": { "prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10 },
    });
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![json!({ "body": completion })])]))
            .await
            .unwrap();
    }
    let mut body = ai_router_e2e::chat_body("m1", true);
    body["stream_options"] = json!({ "include_usage": true });
    let s = gw
        .client
        .stream_with(&body, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_clean_stream(&s, &["plain json"], "");
    let usage = s
        .json_events()
        .into_iter()
        .find_map(|e| e.get("usage").filter(|u| u.is_object()).cloned());
    assert_eq!(
        usage.map(|u| u["completion_tokens"].clone()),
        Some(json!(3)),
        "{s}"
    );
    let messages = json!({ "model": "m1", "max_tokens": 16, "stream": true,
        "messages": [{ "role": "user", "content": "hi" }] });
    let r = gw
        .client
        .request(
            reqwest::Method::POST,
            "/v1/messages",
            Some(&gw.virtual_key),
            Some(messages.to_string()),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert!(r.text.contains("event: message_stop"), "{r}");
    assert!(r.text.contains("\"text\":\"plain json\""), "{r}");
    // Every call went to the first lane once: none was taken for a failure.
    let calls = gw.provider_calls().await.unwrap();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls.iter().all(|(key, _)| key != "c"), "{calls:?}");
}

/// A stream sent as is by the mock (`body` with an SSE content type).
fn raw_stream(events: &str) -> Value {
    json!({ "body": events, "headers": { "content-type": "text/event-stream" } })
}

fn chunk(choice: Value) -> String {
    let c = json!({ "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m1",
        "choices": [choice] });
    format!("data: {c}\n\n")
}

/// An answer whose stream ends without `[DONE]` but whole (a finish reason, then the usage):
/// the client's stream ends cleanly, with no error event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_without_done_ends_cleanly() {
    let gw = Gateway::start("stream_no_done").await.expect("fixture");
    let usage = json!({ "id": "c1", "object": "chat.completion.chunk", "created": 1,
        "model": "m1", "choices": [],
        "usage": { "prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7 } });
    let events = format!(
        "{}{}{}data: {usage}\n\n",
        chunk(json!({ "index": 0, "delta": { "role": "assistant", "content": "" } })),
        chunk(json!({ "index": 0, "delta": { "content": "whole" } })),
        chunk(json!({ "index": 0, "delta": {}, "finish_reason": "stop" })),
    );
    gw.mock1.always(raw_stream(&events)).await.unwrap();
    let s = gw.stream("m1").await.unwrap();
    assert_clean_stream(&s, &["whole"], "");
}

/// One endless line from a provider after the first token: the stream ends with one error
/// event, nothing of the line reaches the client (what a VM holds for it is bounded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_line_after_the_first_token_ends_the_stream_with_an_error_event() {
    let gw = Gateway::start("stream_long_line").await.expect("fixture");
    let events = format!(
        "{}data: {}",
        chunk(json!({ "index": 0, "delta": { "role": "assistant", "content": "Hi" } })),
        "x".repeat(3 << 20)
    );
    gw.mock1.always(raw_stream(&events)).await.unwrap();
    let s = gw.stream("m1").await.unwrap();
    assert_eq!(
        s.status,
        200,
        "{}",
        s.transport_error.as_deref().unwrap_or("")
    );
    assert!(
        s.body.len() < 64 * 1024,
        "{} bytes reached the client",
        s.body.len()
    );
    assert_eq!(s.contents(), vec!["Hi"], "{s}");
    assert_ends_with_error_event(&s);
}
