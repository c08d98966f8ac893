//! Protocols through a real Envoy: the Anthropic adapter (unary, SSE, tools, errors), embeddings
//! (capability at load, identity kept across failover, declared dimensions), and the stream
//! contract (usage, failover before the first token, chunk latency, first-token, gap and
//! deadline timeouts, a client disconnect freeing the key's concurrency slot).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::{
    ai_router_bin, http_client, openai_error_problem, script, Gateway, Process, StreamReply,
    TestDir, START_TIMEOUT,
};
use futures::StreamExt;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Pools

/// The gateway and control-plane sections every pool of this file shares.
fn pool_yaml(body: &str) -> String {
    format!(
        r#"gateway:
  host: 127.0.0.1
  port: 0
  adminToken: {{ env: AI_ROUTER_ADMIN_TOKEN }}
  keyStore: {{ type: memory }}
controlPlane:
  host: 127.0.0.1
  httpPort: 0
  grpcPort: 0
{body}"#
    )
}

/// Provider `claude` (kind anthropic, mock 1, keys `a` and `b`) serving `claude-m` (alias
/// `claude`); provider `p2` (openai-compatible, mock 2, key `c`) serving `m2`, the fallback.
fn anthropic_pool(p1: &str, p2: &str) -> String {
    pool_yaml(&format!(
        r#"providers:
  - id: claude
    kind: anthropic
    baseUrl: {p1}
    keys:
      - {{ alias: a, env: P1_KEY_A }}
      - {{ alias: b, env: P1_KEY_B }}
    models:
      - {{ id: claude-m, aliases: [claude] }}
  - id: p2
    kind: openai-compatible
    baseUrl: {p2}
    keys:
      - {{ alias: c, env: P2_KEY_C }}
    models:
      - {{ id: m2, aliases: [backup] }}
defaults:
  fallbacks: [m2]
  deadlineMs: 30000
resilience:
  backoff: {{ baseMs: 10, factor: 2, maxMs: 50 }}
"#
    ))
}

/// One anthropic provider per error case (each its own key and breaker), all on mock 1, no
/// fallbacks, a 5 s deadline (shorter than a 429's retry-after of 12 s, so a rate-limited pool
/// fails at once instead of waiting).
fn anthropic_errors_pool(p1: &str, _p2: &str) -> String {
    let mut providers = String::new();
    for case in ["rate", "auth", "perm", "billing", "credit", "bad"] {
        providers.push_str(&format!(
            "  - id: anth-{case}\n    kind: anthropic\n    baseUrl: {p1}\n    keys: [{{ alias: k, env: P1_KEY_A }}]\n    models: [{{ id: claude-{case} }}]\n"
        ));
    }
    providers.push_str(&format!(
        "  - id: anth-overloaded\n    kind: anthropic\n    baseUrl: {p1}\n    keys: [{{ alias: a, env: P1_KEY_A }}, {{ alias: b, env: P1_KEY_B }}]\n    models: [{{ id: claude-overloaded }}]\n"
    ));
    pool_yaml(&format!(
        "providers:\n{providers}defaults:\n  deadlineMs: 5000\nresilience:\n  backoff: {{ baseMs: 10, factor: 2, maxMs: 50 }}\n"
    ))
}

/// The standard two providers with a policy `timeoutMs` and `deadlineMs`.
fn timed_pool(timeout_ms: u64, deadline_ms: u64) -> impl Fn(&str, &str) -> String {
    move |p1: &str, p2: &str| {
        pool_yaml(&format!(
            r#"providers:
  - id: p1
    kind: openai-compatible
    baseUrl: {p1}
    keys:
      - {{ alias: a, env: P1_KEY_A }}
      - {{ alias: b, env: P1_KEY_B }}
    models:
      - {{ id: m1, aliases: [chat] }}
  - id: p2
    kind: openai-compatible
    baseUrl: {p2}
    keys:
      - {{ alias: c, env: P2_KEY_C }}
    models:
      - {{ id: m2, aliases: [backup] }}
defaults:
  fallbacks: [m2]
  timeoutMs: {timeout_ms}
  deadlineMs: {deadline_ms}
resilience:
  backoff: {{ baseMs: 10, factor: 2, maxMs: 50 }}
"#
        ))
    }
}

/// One key (`a`) capped at one request in flight, no fallback, breakers that open on the first
/// failure: a call that waited for the slot, or a lane counted as failed, would show.
fn single_slot_pool(p1: &str, _p2: &str) -> String {
    pool_yaml(&format!(
        r#"providers:
  - id: p1
    kind: openai-compatible
    baseUrl: {p1}
    keys:
      - {{ alias: a, env: P1_KEY_A, maxConcurrency: 1 }}
    models:
      - {{ id: m1, aliases: [chat] }}
defaults:
  deadlineMs: 30000
resilience:
  backoff: {{ baseMs: 10, factor: 2, maxMs: 50 }}
  keyBreaker: {{ failureThreshold: 1, cooldownMs: 30000, maxCooldownMs: 60000 }}
  providerBreaker: {{ failureThreshold: 1, cooldownMs: 30000, maxCooldownMs: 60000 }}
"#
    ))
}

/// Embeddings of one identity (`te3`, 8 dimensions) at two providers under the shared alias
/// `embed`: `e1` (mock 1, key `a`, id `te3`) and `e2` (mock 2, key `c`, id `openai/te3`); and
/// another model, `other-embed` (mock 1, key `b`), as the pool's fallback.
fn embeddings_pool(p1: &str, p2: &str) -> String {
    pool_yaml(&format!(
        r#"providers:
  - id: e1
    kind: openai-compatible
    baseUrl: {p1}
    keys:
      - {{ alias: a, env: P1_KEY_A }}
    models:
      - {{ id: te3, aliases: [embed], capabilities: [embeddings], dimensions: 8 }}
  - id: e2
    kind: openai-compatible
    baseUrl: {p2}
    keys:
      - {{ alias: c, env: P2_KEY_C }}
    models:
      - {{ id: openai/te3, identity: te3, aliases: [embed], capabilities: [embeddings], dimensions: 8 }}
  - id: e3
    kind: openai-compatible
    baseUrl: {p1}
    keys:
      - {{ alias: b, env: P1_KEY_B }}
    models:
      - {{ id: other-embed, capabilities: [embeddings], dimensions: 8 }}
defaults:
  fallbacks: [other-embed]
  deadlineMs: 30000
resilience:
  backoff: {{ baseMs: 10, factor: 2, maxMs: 50 }}
"#
    ))
}

// ---------------------------------------------------------------------------------------------
// Client helpers

/// An SSE event and when its last byte reached the client, from the request's start.
#[derive(Debug, Clone)]
struct TimedEvent {
    at: Duration,
    data: String,
}

impl TimedEvent {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }

    fn content(&self) -> Option<String> {
        self.json()
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }
}

#[derive(Debug)]
struct TimedStream {
    status: u16,
    events: Vec<TimedEvent>,
    /// When the body ended (cleanly or not), from the request's start.
    ended_at: Duration,
    transport_error: Option<String>,
    body: String,
}

impl std::fmt::Display for TimedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "HTTP {} (body ended at {:?})",
            self.status, self.ended_at
        )?;
        for e in &self.events {
            writeln!(f, "[{:>6} ms] {}", e.at.as_millis(), e.data)?;
        }
        if let Some(e) = &self.transport_error {
            writeln!(f, "<transport error: {e}>")?;
        }
        write!(f, "--- raw body ---\n{}", self.body)
    }
}

impl TimedStream {
    fn contents(&self) -> Vec<(Duration, String)> {
        self.events
            .iter()
            .filter_map(|e| e.content().map(|c| (e.at, c)))
            .collect()
    }

    fn has_done(&self) -> bool {
        self.events.iter().any(|e| e.data == "[DONE]")
    }
}

/// Pulls complete events (`data:` lines joined) off the front of `buf`.
fn drain_events(buf: &mut String, at: Duration, out: &mut Vec<TimedEvent>) {
    loop {
        let normalized = buf.replace("\r\n", "\n");
        *buf = normalized;
        let Some(end) = buf.find("\n\n") else { return };
        let raw: String = buf.drain(..end + 2).collect();
        let data: Vec<&str> = raw
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if !data.is_empty() {
            out.push(TimedEvent {
                at,
                data: data.join("\n"),
            });
        }
    }
}

/// Streams `body` from the gateway, timing every event as it arrives.
async fn timed_stream(gw: &Gateway, body: &Value) -> TimedStream {
    let started = Instant::now();
    let resp = http_client()
        .unwrap()
        .post(format!("{}/v1/chat/completions", gw.envoy.base_url()))
        .bearer_auth(&gw.virtual_key)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let mut events = Vec::new();
    let mut buf = String::new();
    let mut all = String::new();
    let mut transport_error = None;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(b) => {
                let text = String::from_utf8_lossy(&b);
                all.push_str(&text);
                buf.push_str(&text);
                drain_events(&mut buf, started.elapsed(), &mut events);
            }
            Err(e) => {
                transport_error = Some(format!("{e:#}"));
                break;
            }
        }
    }
    buf.push_str("\n\n");
    drain_events(&mut buf, started.elapsed(), &mut events);
    TimedStream {
        status,
        events,
        ended_at: started.elapsed(),
        transport_error,
        body: all,
    }
}

/// `POST /v1/embeddings` with the virtual key.
async fn embeddings(gw: &Gateway, body: &Value) -> ai_router_e2e::Reply {
    gw.client
        .request(
            reqwest::Method::POST,
            "/v1/embeddings",
            Some(&gw.virtual_key),
            Some(body.to_string()),
        )
        .await
        .unwrap()
}

fn usage_chunks(s: &StreamReply) -> Vec<Value> {
    s.json_events()
        .into_iter()
        .filter(|e| e.get("usage").is_some_and(|u| !u.is_null()))
        .collect()
}

fn finish_reasons(s: &StreamReply) -> Vec<String> {
    s.json_events()
        .iter()
        .filter_map(|e| {
            e.pointer("/choices/0/finish_reason")
                .and_then(Value::as_str)
        })
        .map(str::to_string)
        .collect()
}

/// One clean stream: one role chunk, no error event, `[DONE]` once and last.
fn assert_clean(s: &StreamReply) {
    assert_eq!(s.status, 200, "{s}");
    assert!(
        s.header("content-type")
            .unwrap_or_default()
            .starts_with("text/event-stream"),
        "{s}"
    );
    assert!(s.transport_error.is_none(), "{s}");
    assert_eq!(s.role_chunks(), 1, "exactly one role chunk:\n{s}");
    for e in s.json_events() {
        assert!(e.get("error").is_none(), "no error event expected:\n{s}");
        assert_eq!(
            e["object"], "chat.completion.chunk",
            "every event is an OpenAI chunk:\n{s}"
        );
    }
    assert_eq!(s.events.last().map(String::as_str), Some("[DONE]"), "{s}");
    assert_eq!(s.events.iter().filter(|e| *e == "[DONE]").count(), 1, "{s}");
}

// ---------------------------------------------------------------------------------------------
// Anthropic

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_unary_chat_is_translated_to_messages_and_back() {
    let gw = Gateway::start_with("anthropic_unary", anthropic_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": "Bonjour.",
            "usage": { "prompt_tokens": 11, "completion_tokens": 7 }
        })])]))
        .await
        .unwrap();

    let image_b64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    let request = json!({
        "model": "claude",
        "messages": [
            { "role": "system", "content": "You are terse." },
            { "role": "user", "content": "Hi." },
            { "role": "assistant", "content": "Hello. What do you need?" },
            { "role": "user", "content": [
                { "type": "text", "text": "What is in these pictures?" },
                { "type": "image_url", "image_url": { "url": format!("data:image/png;base64,{image_b64}") } },
                { "type": "image_url", "image_url": { "url": "https://example.com/cat.png" } }
            ] }
        ],
        "temperature": 1.5,
        "top_p": 0.9,
        "stop": ["END", "STOP"]
    });
    let r = gw
        .client
        .chat_with(&request, Some(&gw.virtual_key))
        .await
        .unwrap();
    let calls = gw.mock1.calls().await.unwrap();
    assert_eq!(r.status, 200, "{r}\n--- calls ---\n{calls:#?}");
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let call = &calls[0];

    // What the provider received: the Messages API, with Anthropic's auth.
    assert!(call.path.ends_with("/v1/messages"), "path {}", call.path);
    let alias = gw.alias_of(call.key.as_deref());
    assert!(alias == "a" || alias == "b", "key {alias}");
    assert_eq!(
        call.header("x-api-key").as_deref(),
        call.key.as_deref(),
        "the key goes in x-api-key: {:?}",
        call.headers
    );
    assert!(
        call.header("authorization").is_none(),
        "no bearer auth to Anthropic: {:?}",
        call.headers
    );
    assert_eq!(
        call.header("anthropic-version").as_deref(),
        Some("2023-06-01"),
        "{:?}",
        call.headers
    );
    let body = &call.body;
    assert_eq!(body["model"], "claude-m", "{body:#}");
    assert_eq!(
        body["max_tokens"], 4096,
        "defaultMaxTokens when none: {body:#}"
    );
    assert_eq!(body["system"], "You are terse.", "{body:#}");
    assert_eq!(body["stop_sequences"], json!(["END", "STOP"]), "{body:#}");
    assert_eq!(
        body["temperature"].as_f64(),
        Some(1.0),
        "clamped to Anthropic's range: {body:#}"
    );
    assert_eq!(body["top_p"].as_f64(), Some(0.9), "{body:#}");
    assert!(
        body.get("stop").is_none() && body.get("stream_options").is_none(),
        "{body:#}"
    );
    let messages = body["messages"].as_array().expect("messages");
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"], "{body:#}");
    assert_eq!(
        messages[0]["content"][0],
        json!({"type": "text", "text": "Hi."}),
        "{body:#}"
    );
    assert_eq!(
        messages[1]["content"][0],
        json!({"type": "text", "text": "Hello. What do you need?"}),
        "{body:#}"
    );
    let last = messages[2]["content"].as_array().expect("blocks");
    assert_eq!(
        last[0],
        json!({"type": "text", "text": "What is in these pictures?"}),
        "{body:#}"
    );
    assert_eq!(
        last[1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image_b64}}),
        "{body:#}"
    );
    assert_eq!(
        last[2],
        json!({"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}),
        "{body:#}"
    );

    // What the client got: an OpenAI chat.completion.
    assert_eq!(r.json["object"], "chat.completion", "{r}");
    assert_eq!(r.content(), Some("Bonjour."), "{r}");
    assert_eq!(r.json["choices"][0]["message"]["role"], "assistant", "{r}");
    assert_eq!(r.json["choices"][0]["finish_reason"], "stop", "{r}");
    assert_eq!(r.json["usage"]["prompt_tokens"], 11, "{r}");
    assert_eq!(r.json["usage"]["completion_tokens"], 7, "{r}");
    assert_eq!(r.json["usage"]["total_tokens"], 18, "{r}");
    assert_eq!(
        r.header("x-ai-router-model").as_deref(),
        Some("claude-m"),
        "{r}"
    );
    assert!(
        r.header("x-request-id").is_some_and(|v| !v.is_empty()),
        "{r}"
    );
    assert!(
        r.json["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-")),
        "{r}"
    );

    // A request's own max_tokens (or max_completion_tokens) is passed through.
    gw.mock1.clear_calls().await.unwrap();
    let mut with_max = request.clone();
    with_max["max_tokens"] = json!(77);
    with_max["stop"] = json!("FIN");
    let r = gw
        .client
        .chat_with(&with_max, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let calls = gw.mock1.calls().await.unwrap();
    assert_eq!(calls[0].body["max_tokens"], 77, "{:#}", calls[0].body);
    assert_eq!(
        calls[0].body["stop_sequences"],
        json!(["FIN"]),
        "{:#}",
        calls[0].body
    );
    gw.check_no_secrets_in_logs().unwrap();
}

fn weather_tool() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": { "city": { "type": "string" } },
                "required": ["city"]
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_tools_tool_results_and_json_mode_are_translated() {
    let gw = Gateway::start_with("anthropic_tools", anthropic_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![json!({
            "toolCalls": [{ "id": "toolu_01", "name": "get_weather", "arguments": { "city": "Paris" } }],
            "usage": { "prompt_tokens": 30, "completion_tokens": 12 }
        })])]))
        .await
        .unwrap();

    // A tool call.
    let request = json!({
        "model": "claude",
        "messages": [{ "role": "user", "content": "Weather in Paris?" }],
        "tools": [weather_tool()],
        "tool_choice": { "type": "function", "function": { "name": "get_weather" } }
    });
    let r = gw
        .client
        .chat_with(&request, Some(&gw.virtual_key))
        .await
        .unwrap();
    let calls = gw.mock1.calls().await.unwrap();
    assert_eq!(r.status, 200, "{r}\n{calls:#?}");
    let body = &calls[0].body;
    assert_eq!(
        body["tools"],
        json!([{
            "name": "get_weather",
            "description": "The weather in a city.",
            "input_schema": {
                "type": "object",
                "properties": { "city": { "type": "string" } },
                "required": ["city"]
            }
        }]),
        "{body:#}"
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "get_weather"}),
        "{body:#}"
    );
    let message = &r.json["choices"][0]["message"];
    assert_eq!(r.json["choices"][0]["finish_reason"], "tool_calls", "{r}");
    let call = &message["tool_calls"][0];
    assert_eq!(call["id"], "toolu_01", "{r}");
    assert_eq!(call["type"], "function", "{r}");
    assert_eq!(call["function"]["name"], "get_weather", "{r}");
    let args: Value = serde_json::from_str(
        call["function"]["arguments"]
            .as_str()
            .expect("arguments string"),
    )
    .expect("arguments are JSON");
    assert_eq!(args, json!({"city": "Paris"}), "{r}");

    // The tool's result goes back as a tool_result block of a user turn; JSON mode becomes an
    // instruction in the system prompt; "required" becomes Anthropic's "any".
    gw.mock1
        .script(json!([script::always(vec![script::text(
            "{\"temp_c\": 21}"
        )])]))
        .await
        .unwrap();
    gw.mock1.clear_calls().await.unwrap();
    let follow_up = json!({
        "model": "claude",
        "messages": [
            { "role": "system", "content": "Answer in JSON." },
            { "role": "user", "content": "Weather in Paris?" },
            { "role": "assistant", "content": null, "tool_calls": [{
                "id": "toolu_01", "type": "function",
                "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" }
            }] },
            { "role": "tool", "tool_call_id": "toolu_01", "content": "21 degrees, sunny" }
        ],
        "tools": [weather_tool()],
        "tool_choice": "required",
        "response_format": { "type": "json_object" }
    });
    let r = gw
        .client
        .chat_with(&follow_up, Some(&gw.virtual_key))
        .await
        .unwrap();
    let calls = gw.mock1.calls().await.unwrap();
    assert_eq!(r.status, 200, "{r}\n{calls:#?}");
    let body = &calls[0].body;
    let messages = body["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 3, "{body:#}");
    assert_eq!(messages[1]["role"], "assistant", "{body:#}");
    assert_eq!(
        messages[1]["content"][0],
        json!({"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}),
        "{body:#}"
    );
    assert_eq!(messages[2]["role"], "user", "{body:#}");
    assert_eq!(
        messages[2]["content"][0],
        json!({"type": "tool_result", "tool_use_id": "toolu_01", "content": "21 degrees, sunny"}),
        "{body:#}"
    );
    assert_eq!(body["tool_choice"], json!({"type": "any"}), "{body:#}");
    let system = body["system"].as_str().unwrap_or_default();
    assert!(
        system.starts_with("Answer in JSON.") && system.contains("JSON object"),
        "JSON mode is asked for in the system prompt: {body:#}"
    );
    assert_eq!(r.content(), Some("{\"temp_c\": 21}"), "{r}");
    assert_eq!(r.json["choices"][0]["finish_reason"], "stop", "{r}");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_stream_becomes_openai_chunks_with_usage_only_when_asked() {
    let gw = Gateway::start_with("anthropic_stream", anthropic_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": "Hello streamed world",
            "usage": { "prompt_tokens": 9, "completion_tokens": 3 },
            "stream": { "chunks": ["Hello", " streamed", " world"] }
        })])]))
        .await
        .unwrap();

    let s = gw.stream("claude").await.unwrap();
    let calls = gw.mock1.calls().await.unwrap();
    assert_clean(&s);
    assert_eq!(s.contents(), ["Hello", " streamed", " world"], "{s}");
    assert_eq!(finish_reasons(&s), ["stop"], "{s}");
    assert!(
        usage_chunks(&s).is_empty(),
        "no usage chunk unless the client asked:\n{s}"
    );
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert!(calls[0].path.ends_with("/messages"), "{}", calls[0].path);
    assert_eq!(calls[0].body["stream"], true, "{:#}", calls[0].body);
    assert!(
        calls[0].body.get("stream_options").is_none(),
        "{:#}",
        calls[0].body
    );

    let mut body = ai_router_e2e::chat_body("claude", true);
    body["stream_options"] = json!({ "include_usage": true });
    let s = gw
        .client
        .stream_with(&body, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_clean(&s);
    assert_eq!(s.text(), "Hello streamed world", "{s}");
    let usage = usage_chunks(&s);
    assert_eq!(usage.len(), 1, "one usage chunk when asked:\n{s}");
    assert_eq!(usage[0]["choices"], json!([]), "{s}");
    assert_eq!(usage[0]["usage"]["prompt_tokens"], 9, "{s}");
    assert_eq!(usage[0]["usage"]["completion_tokens"], 3, "{s}");
    assert_eq!(usage[0]["usage"]["total_tokens"], 12, "{s}");
    let events = s.json_events();
    assert!(
        events
            .last()
            .is_some_and(|e| e.get("usage").is_some_and(|u| !u.is_null())),
        "the usage chunk comes last, before [DONE]:\n{s}"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_streamed_tool_calls_become_openai_tool_call_deltas() {
    let gw = Gateway::start_with("anthropic_stream_tools", anthropic_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![json!({
            "toolCalls": [{
                "id": "toolu_02", "name": "get_weather",
                "argumentChunks": ["{\"ci", "ty\": \"Pa", "ris\"}"]
            }]
        })])]))
        .await
        .unwrap();
    let body = json!({
        "model": "claude",
        "stream": true,
        "messages": [{ "role": "user", "content": "Weather in Paris?" }],
        "tools": [weather_tool()],
        "tool_choice": "auto"
    });
    let s = gw
        .client
        .stream_with(&body, Some(&gw.virtual_key))
        .await
        .unwrap();
    let calls = gw.mock1.calls().await.unwrap();
    assert_clean(&s);
    assert_eq!(
        calls[0].body["tool_choice"],
        json!({"type": "auto"}),
        "{:#}",
        calls[0].body
    );

    let deltas: Vec<Value> = s
        .json_events()
        .iter()
        .filter_map(|e| e.pointer("/choices/0/delta/tool_calls/0").cloned())
        .collect();
    assert!(deltas.len() >= 2, "the call and its argument deltas:\n{s}");
    assert_eq!(deltas[0]["index"], 0, "{s}");
    assert_eq!(deltas[0]["id"], "toolu_02", "{s}");
    assert_eq!(deltas[0]["type"], "function", "{s}");
    assert_eq!(deltas[0]["function"]["name"], "get_weather", "{s}");
    let arguments: String = deltas
        .iter()
        .filter_map(|d| d.pointer("/function/arguments").and_then(Value::as_str))
        .collect();
    assert_eq!(
        arguments, "{\"city\": \"Paris\"}",
        "input_json_delta pieces in order:\n{s}"
    );
    assert!(
        deltas
            .iter()
            .filter(|d| d
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .is_some_and(|a| !a.is_empty()))
            .count()
            >= 3,
        "each input_json_delta is its own chunk:\n{s}"
    );
    assert_eq!(finish_reasons(&s), ["tool_calls"], "{s}");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_streamed_error_before_the_first_token_fails_over_invisibly() {
    let gw = Gateway::start_with("anthropic_stream_errors", anthropic_pool)
        .await
        .expect("fixture");
    // Before the first token: Anthropic's `event: error` (overloaded_error) on the first
    // attempt; the next attempt streams cleanly.
    gw.mock1
        .script(json!([script::rule(
            json!({ "model": "claude-m" }),
            vec![
                script::stream_failing(&["never", " seen"], 0, "error-event"),
                script::stream(&["Hel", "lo"]),
            ]
        )]))
        .await
        .unwrap();
    let s = gw.stream("claude").await.unwrap();
    let calls = gw.mock1.calls().await.unwrap();
    assert_clean(&s);
    assert_eq!(s.contents(), ["Hel", "lo"], "{s}");
    assert!(!s.body.contains("never"), "{s}");
    assert_eq!(
        calls.len(),
        2,
        "failed over on the anthropic provider: {calls:#?}"
    );
    assert!(gw.mock2.calls().await.unwrap().is_empty());

    gw.check_no_secrets_in_logs().unwrap();
}

/// An Anthropic stream that sends two tokens, then `event: error` (overloaded_error): the client
/// keeps the two tokens, its stream ends with an OpenAI error event, and nothing is retried.
async fn anthropic_error_after_the_first_token(test: &str, delay_ms: u64) {
    let gw = Gateway::start_with(test, anthropic_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![json!({
            "stream": {
                "chunks": ["one", " two", " three"],
                "failAfter": 2,
                "failWith": "error-event",
                "delayMs": delay_ms
            }
        })])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(&["from p2"])])]))
        .await
        .unwrap();
    let s = gw.stream("claude").await.unwrap();
    let p1 = gw.mock1.calls().await.unwrap();
    let p2 = gw.mock2.calls().await.unwrap();
    let calls = format!(
        "p1: {} call(s) (keys {:?}); p2: {} call(s)",
        p1.len(),
        p1.iter()
            .map(|c| gw.alias_of(c.key.as_deref()))
            .collect::<Vec<_>>(),
        p2.len()
    );
    assert_eq!(
        s.status, 200,
        "{s}
{calls}"
    );
    assert_eq!(
        s.role_chunks(),
        1,
        "{s}
{calls}"
    );
    assert_eq!(
        s.contents(),
        ["one", " two"],
        "the tokens sent before the error reach the client:\n{s}\n{calls}"
    );
    assert!(!s.events.iter().any(|e| e == "[DONE]"), "{s}");
    let last: Value = s
        .events
        .last()
        .and_then(|e| serde_json::from_str(e).ok())
        .unwrap_or(Value::Null);
    let error = last
        .get("error")
        .unwrap_or_else(|| panic!("the stream ends with an OpenAI error event:\n{s}"));
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{s}"
    );
    assert!(error["type"].is_string(), "{s}");
    assert!(s.transport_error.is_none(), "{s}");
    assert_eq!(p1.len(), 1, "not retried: {calls}");
    assert!(p2.is_empty(), "not retried: {calls}");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_stream_error_after_spaced_tokens_ends_the_stream_with_an_error_event() {
    // Each event its own read: the tokens have been forwarded when the error comes.
    anthropic_error_after_the_first_token("anthropic_error_after_spaced_tokens", 150).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_stream_error_in_the_same_read_as_the_tokens_ends_the_stream_with_an_error_event(
) {
    // The provider sends the tokens and the error back to back, so they may reach the filter
    // in one body callback: the tokens are still the first tokens, and the error comes after.
    anthropic_error_after_the_first_token("anthropic_error_after_burst_tokens", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_errors_are_classified_as_the_spec_says() {
    let gw = Gateway::start_with("anthropic_errors", anthropic_errors_pool)
        .await
        .expect("fixture");
    let key = gw.key_a.clone();
    let case = |model: &str, error: &str| {
        script::rule(
            json!({ "model": model }),
            vec![json!({ "providerError": error })],
        )
    };
    gw.mock1
        .script(json!([
            case("claude-rate", "anthropic.rate_limited"),
            case("claude-auth", "anthropic.invalid_key"),
            case("claude-perm", "anthropic.permission_denied"),
            case("claude-billing", "anthropic.billing_error"),
            case("claude-credit", "anthropic.quota_exhausted"),
            case("claude-bad", "anthropic.bad_request"),
            script::rule(
                json!({ "model": "claude-overloaded" }),
                vec![
                    json!({ "providerError": "anthropic.overloaded" }),
                    script::text("recovered")
                ],
            ),
        ]))
        .await
        .unwrap();

    let calls_for = |model: &'static str| {
        let gw = &gw;
        async move {
            gw.mock1
                .calls()
                .await
                .unwrap()
                .into_iter()
                .filter(|c| c.model.as_deref() == Some(model))
                .count()
        }
    };

    // overloaded (529): transient, retried on the other key.
    let r = gw.chat("claude-overloaded").await.unwrap();
    assert_eq!(r.status, 200, "a 529 is retried:\n{r}");
    assert_eq!(r.content(), Some("recovered"), "{r}");
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("2"),
        "{r}"
    );
    assert_eq!(calls_for("claude-overloaded").await, 2);

    // rate_limit_error (429, retry-after 12 s past the 5 s deadline): the pool is rate limited.
    let r = gw.chat("claude-rate").await.unwrap();
    if let Some(p) = openai_error_problem(&r, 503, "pool_rate_limited") {
        panic!("rate_limit_error: {p}");
    }
    let retry_after: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("Retry-After on pool_rate_limited:\n{r}"));
    // The lane is out at least for the provider's retry-after (12 s); the anthropic-ratelimit
    // headers (0 requests remaining) may keep it out longer.
    assert!(retry_after >= 10, "{r}");
    assert_eq!(calls_for("claude-rate").await, 1);

    // authentication_error (401) and permission_error (403): auth, the key is out.
    for (model, name) in [
        ("claude-auth", "authentication_error"),
        ("claude-perm", "permission_error"),
    ] {
        let r = gw.chat(model).await.unwrap();
        if let Some(p) = openai_error_problem(&r, 503, "pool_auth_failed") {
            panic!("{name}: {p}");
        }
    }
    assert_eq!(calls_for("claude-auth").await, 1);
    assert_eq!(calls_for("claude-perm").await, 1);

    // billing_error (402) and a 400 whose message says the credit is too low: quota.
    for (model, name) in [
        ("claude-billing", "billing_error"),
        ("claude-credit", "credit balance"),
    ] {
        let r = gw.chat(model).await.unwrap();
        if let Some(p) = openai_error_problem(&r, 503, "pool_quota_exhausted") {
            panic!("{name}: {p}");
        }
        assert!(
            r.header("retry-after").is_some(),
            "{name}: Retry-After:\n{r}"
        );
    }
    assert_eq!(calls_for("claude-billing").await, 1);
    assert_eq!(calls_for("claude-credit").await, 1);

    // A blacklisted key gets no more traffic.
    for (model, code) in [
        ("claude-auth", "pool_auth_failed"),
        ("claude-perm", "pool_auth_failed"),
        ("claude-billing", "pool_quota_exhausted"),
        ("claude-credit", "pool_quota_exhausted"),
    ] {
        let r = gw.chat(model).await.unwrap();
        if let Some(p) = openai_error_problem(&r, 503, code) {
            panic!("{model} again: {p}");
        }
    }
    for model in [
        "claude-auth",
        "claude-perm",
        "claude-billing",
        "claude-credit",
    ] {
        assert_eq!(
            calls_for(model).await,
            1,
            "{model}: the key was not called again"
        );
    }

    // invalid_request_error (400, prompt too long): returned once, not retried.
    let r = gw.chat("claude-bad").await.unwrap();
    if let Some(p) = openai_error_problem(&r, 400, "upstream_invalid_request") {
        panic!("invalid_request_error: {p}");
    }
    assert!(
        r.text.contains("prompt is too long"),
        "the provider's message:\n{r}"
    );
    assert_eq!(calls_for("claude-bad").await, 1);

    for c in gw.mock1.calls().await.unwrap() {
        let model = c.model.clone().unwrap_or_default();
        assert!(
            c.key.as_deref() == Some(key.as_str())
                || (model == "claude-overloaded" && gw.alias_of(c.key.as_deref()) == "b"),
            "{model}: {:?}",
            c.raw
        );
        assert!(
            c.header("x-api-key").is_some() && c.header("authorization").is_none(),
            "{:?}",
            c.headers
        );
    }
    gw.check_no_secrets_in_logs().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Streams (OpenAI-compatible providers)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_always_asks_for_usage_and_forwards_it_only_when_asked() {
    let gw = Gateway::start("stream_usage").await.expect("fixture");
    let reply = json!({
        "text": "Hi there",
        "usage": { "prompt_tokens": 5, "completion_tokens": 2 },
        "stream": { "chunks": ["Hi", " there"] }
    });
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![reply.clone()])]))
            .await
            .unwrap();
    }

    let s = gw.stream("chat").await.unwrap();
    let calls = gw.provider_calls().await.unwrap();
    assert_clean(&s);
    assert_eq!(s.contents(), ["Hi", " there"], "{s}");
    assert!(
        usage_chunks(&s).is_empty(),
        "the client did not ask for usage:\n{s}"
    );
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].1.body.pointer("/stream_options/include_usage"),
        Some(&json!(true)),
        "the gateway asks the provider for usage: {:#}",
        calls[0].1.body
    );

    gw.clear_calls().await.unwrap();
    let mut body = ai_router_e2e::chat_body("chat", true);
    body["stream_options"] = json!({ "include_usage": true });
    let s = gw
        .client
        .stream_with(&body, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_clean(&s);
    let usage = usage_chunks(&s);
    assert_eq!(usage.len(), 1, "{s}");
    assert_eq!(usage[0]["usage"]["prompt_tokens"], 5, "{s}");
    assert_eq!(usage[0]["usage"]["completion_tokens"], 2, "{s}");
    assert_eq!(usage[0]["choices"], json!([]), "{s}");

    // include_usage: false is overridden upstream, and still nothing reaches the client.
    gw.clear_calls().await.unwrap();
    body["stream_options"] = json!({ "include_usage": false });
    let s = gw
        .client
        .stream_with(&body, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_clean(&s);
    assert!(usage_chunks(&s).is_empty(), "{s}");
    let calls = gw.provider_calls().await.unwrap();
    assert_eq!(
        calls[0].1.body.pointer("/stream_options/include_usage"),
        Some(&json!(true)),
        "{:#}",
        calls[0].1.body
    );
    gw.check_no_secrets_in_logs().unwrap();
}

async fn stream_fails_over_before_the_first_token(test: &str, failing: Value) {
    let gw = Gateway::start(test).await.expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![failing])]))
        .await
        .unwrap();
    let good = ["Good", " answer"];
    gw.mock2
        .script(json!([script::always(vec![script::stream(&good)])]))
        .await
        .unwrap();
    let s = gw.stream("chat").await.unwrap();
    let p1 = gw.mock1.calls().await.unwrap();
    let p2 = gw.mock2.calls().await.unwrap();
    assert_clean(&s);
    assert_eq!(s.contents(), good, "{s}");
    assert!(
        !s.body.contains("never"),
        "nothing of the failed lane:\n{s}"
    );
    assert!(!p1.is_empty(), "p1 was tried first");
    assert_eq!(p2.len(), 1, "{p2:?}");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_answered_with_an_error_status_fails_over() {
    stream_fails_over_before_the_first_token(
        "stream_status_before_token",
        script::status(503, json!({}), None),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_malformed_data_before_the_first_token_fails_over() {
    let role = json!({
        "id": "chatcmpl-bad", "object": "chat.completion.chunk", "created": 1700000000, "model": "m1",
        "choices": [{ "index": 0, "delta": { "role": "assistant", "content": "" }, "finish_reason": null }]
    });
    stream_fails_over_before_the_first_token(
        "stream_malformed_before_token",
        json!({
            "status": 200,
            "headers": { "content-type": "text/event-stream" },
            "body": format!("data: {role}\n\ndata: {{\"never\": this is not json\n\n")
        }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_reach_the_client_as_the_provider_sends_them() {
    const GAP_MS: u64 = 300;
    const SLACK_MS: u64 = 120;
    let gw = Gateway::start("stream_chunk_latency")
        .await
        .expect("fixture");
    let chunks = ["c1", " c2", " c3", " c4", " c5", " c6"];
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": chunks.concat(),
            "stream": { "chunks": chunks, "delayMs": GAP_MS }
        })])]))
        .await
        .unwrap();
    // Warm the path (connections, the VM's view of the lanes) so the measured stream is not
    // the first through this Envoy.
    let warm = gw.chat("chat").await.unwrap();
    assert_eq!(warm.status, 200, "{warm}");

    let s = timed_stream(&gw, &ai_router_e2e::chat_body("chat", true)).await;
    assert_eq!(s.status, 200, "{s}");
    assert!(s.transport_error.is_none() && s.has_done(), "{s}");
    let contents = s.contents();
    let texts: Vec<&str> = contents.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(texts, chunks, "{s}");

    // The provider sends content chunk i at i * GAP after its role chunk (i from 1), the finish
    // chunk one GAP later. Relative to the first content chunk's arrival, chunk i must arrive
    // at (i - 1) * GAP, give or take the slack: nothing is held back or batched.
    let first = contents[0].0;
    for (i, (at, text)) in contents.iter().enumerate() {
        let expected = Duration::from_millis(GAP_MS * i as u64);
        let got = at.saturating_sub(first);
        let off = got.as_millis().abs_diff(expected.as_millis());
        assert!(
            off <= u128::from(SLACK_MS),
            "chunk {i} ({text:?}) arrived {got:?} after the first, expected {expected:?} (± {SLACK_MS} ms):\n{s}"
        );
    }
    // The first token is not held until the end of the reply.
    let total = s.ended_at.saturating_sub(first);
    assert!(
        total >= Duration::from_millis(GAP_MS * chunks.len() as u64 - SLACK_MS),
        "the first content arrived only {total:?} before the end:\n{s}"
    );
    assert!(
        first <= Duration::from_millis(GAP_MS + 400),
        "the first content chunk (sent at {GAP_MS} ms) arrived at {first:?}:\n{s}"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_silent_before_the_first_token_is_timed_out_and_the_call_moves_on() {
    let gw = Gateway::start_with("stream_first_token_timeout", timed_pool(1000, 30000))
        .await
        .expect("fixture");
    // p1 sends its role chunk, then nothing for 8 s.
    gw.mock1
        .script(json!([script::always(vec![json!({
            "stream": { "chunks": ["never", " seen"], "stallAfter": 0, "stallMs": 8000 }
        })])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(&[
            "from", " p2"
        ])])]))
        .await
        .unwrap();
    let started = Instant::now();
    let s = gw.stream("chat").await.unwrap();
    let elapsed = started.elapsed();
    let p1 = gw.mock1.calls().await.unwrap();
    let p2 = gw.mock2.calls().await.unwrap();
    assert_clean(&s);
    assert_eq!(s.contents(), ["from", " p2"], "{s}\np1: {p1:#?}");
    assert!(!s.body.contains("never"), "{s}");
    assert!(!p1.is_empty(), "p1 was tried first");
    assert_eq!(p2.len(), 1, "{p2:?}");
    // Each p1 attempt waited its timeoutMs (1 s) for a first token, no more.
    let waited = Duration::from_millis(1000 * p1.len() as u64);
    assert!(
        elapsed >= waited.saturating_sub(Duration::from_millis(100)),
        "answered in {elapsed:?} after {} timed-out attempt(s)",
        p1.len()
    );
    assert!(
        elapsed < waited + Duration::from_millis(2500),
        "answered in {elapsed:?}: the first-token timeout (1 s per attempt, {} attempt(s) on p1) did not move the call on",
        p1.len()
    );
    gw.check_no_secrets_in_logs().unwrap();
}

/// The standard two providers; the defaults allow 20 s of silence, profile `quick` (model m1)
/// 1 s.
fn quick_profile_pool(p1: &str, p2: &str) -> String {
    timed_pool(20_000, 30_000)(p1, p2).replace(
        "resilience:\n",
        "profiles:\n  quick: { model: m1, timeoutMs: 1000 }\nresilience:\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_after_the_first_token_longer_than_the_calls_timeout_cuts_the_stream_without_retry() {
    let gw = Gateway::start_with("stream_gap_per_call", quick_profile_pool)
        .await
        .expect("fixture");
    // One token, 4 s of silence, then the rest.
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": "one two three",
            "stream": { "chunks": ["one", " two", " three"], "stallAfter": 1, "stallMs": 4000 }
        })])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(&["from p2"])])]))
        .await
        .unwrap();

    // Profile `quick`: 1 s between chunks, whatever the other policies allow.
    let s = timed_stream(&gw, &ai_router_e2e::chat_body("quick", true)).await;
    assert_eq!(s.status, 200, "the stream had started:\n{s}");
    let contents = s.contents();
    let texts: Vec<&str> = contents.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(texts, ["one"], "{s}");
    assert!(!s.has_done(), "a cut stream does not end with [DONE]:\n{s}");
    let gap = s.ended_at.saturating_sub(contents[0].0);
    assert!(
        gap >= Duration::from_millis(900) && gap <= Duration::from_millis(1600),
        "the stream ended {gap:?} after its last chunk (the profile's timeoutMs is 1 s; the \
         bound is checked every 100 ms, and Envoy waits 100 ms for the client to close):\n{s}"
    );
    assert!(
        s.transport_error.is_some(),
        "Envoy can only reset a stream whose provider fell silent:\n{s}"
    );
    assert_eq!(gw.mock1.calls().await.unwrap().len(), 1, "one attempt");
    assert!(gw.mock2.calls().await.unwrap().is_empty(), "no retry");
    // The attempt failed as a timeout after its first token, and so did the call.
    gw.cp
        .metric_line(&[
            "ai_router_attempts_total{",
            "provider=\"p1\"",
            "class=\"timeout\"",
        ])
        .await
        .unwrap();
    gw.cp
        .metric_line(&["ai_router_requests_total{", "outcome=\"error:timeout\""])
        .await
        .unwrap();

    // The same silence under the defaults (20 s) is waited out: the stream completes.
    let s = timed_stream(&gw, &ai_router_e2e::chat_body("chat", true)).await;
    let texts: Vec<String> = s.contents().into_iter().map(|(_, c)| c).collect();
    assert_eq!(texts, ["one", " two", " three"], "{s}");
    assert!(s.has_done() && s.transport_error.is_none(), "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_bounds_the_whole_stream() {
    let gw = Gateway::start_with("stream_deadline", timed_pool(1000, 2000))
        .await
        .expect("fixture");
    // Twelve chunks 400 ms apart: every gap is within timeoutMs, the whole stream (5.2 s) is not
    // within deadlineMs.
    let chunks: Vec<String> = (1..=12).map(|i| format!("w{i} ")).collect();
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": chunks.concat(),
            "stream": { "chunks": chunks, "delayMs": 400 }
        })])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(&["from p2"])])]))
        .await
        .unwrap();
    let s = timed_stream(&gw, &ai_router_e2e::chat_body("chat", true)).await;
    assert_eq!(s.status, 200, "{s}");
    let n = s.contents().len();
    assert!(
        n >= 1 && n < chunks.len(),
        "{n} of {} chunks:\n{s}",
        chunks.len()
    );
    assert!(!s.has_done(), "{s}");
    assert!(
        s.transport_error.is_some(),
        "a stream past its deadline is reset (nothing can be written into it):\n{s}"
    );
    assert!(
        s.ended_at >= Duration::from_millis(1800) && s.ended_at <= Duration::from_millis(3500),
        "the stream ended at {:?} (deadline 2 s):\n{s}",
        s.ended_at
    );
    assert_eq!(gw.mock1.calls().await.unwrap().len(), 1, "one attempt");
    assert!(
        gw.mock2.calls().await.unwrap().is_empty(),
        "no retry after the first token"
    );
    gw.cp
        .metric_line(&["ai_router_requests_total{", "outcome=\"error:deadline\""])
        .await
        .unwrap();
}

/// `upstream_rq_active` of the providers' plain-HTTP cluster, from Envoy's admin API.
async fn upstream_requests_active(gw: &Gateway) -> anyhow::Result<u64> {
    gw.envoy
        .stat("cluster.providers_plain.upstream_rq_active")
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_cancels_the_upstream_and_frees_the_keys_slot() {
    let gw = Gateway::start_with("stream_disconnect", single_slot_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![
            json!({ "stream": { "chunks": ["first", " second"], "stallAfter": 1, "stallMs": 25000 } }),
            script::text("next call"),
        ])]))
        .await
        .unwrap();

    // Read the first token, then hang up while the provider is still streaming.
    {
        let resp = http_client()
            .unwrap()
            .post(format!("{}/v1/chat/completions", gw.envoy.base_url()))
            .bearer_auth(&gw.virtual_key)
            .header("content-type", "application/json")
            .body(ai_router_e2e::chat_body("chat", true).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let mut stream = resp.bytes_stream();
        let mut seen = String::new();
        let read_first = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(chunk) = stream.next().await {
                seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
                if seen.contains("first") {
                    return;
                }
            }
        })
        .await;
        assert!(read_first.is_ok(), "no first token within 10 s: {seen}");
        assert_eq!(upstream_requests_active(&gw).await.unwrap(), 1);
    }

    // The upstream request is cancelled...
    ai_router_e2e::poll(
        "the provider request to be cancelled",
        Duration::from_secs(3),
        || {
            let gw = &gw;
            async move { Ok((upstream_requests_active(gw).await? == 0).then_some(())) }
        },
    )
    .await
    .unwrap();

    // ...and the key's only slot is free at once: the next call is served by the same key
    // without waiting (the stalled stream would hold it for 25 s), and the lane was not counted
    // as failed (its breaker opens on the first failure).
    let started = Instant::now();
    let r = gw.chat("chat").await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("next call"), "{r}");
    assert!(
        elapsed < Duration::from_secs(2),
        "the next call took {elapsed:?}: the slot was not freed"
    );
    let calls = gw.mock1.calls().await.unwrap();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert!(calls.iter().all(|c| gw.alias_of(c.key.as_deref()) == "a"));
    gw.check_no_secrets_in_logs().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Embeddings

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_models_are_refused_at_load_on_kinds_with_no_embeddings_api() {
    let bin = ai_router_bin().unwrap();
    for kind in ["anthropic", "deepseek", "groq"] {
        let dir = TestDir::new(&format!("embeddings_refused_{kind}")).unwrap();
        let yaml = pool_yaml(&format!(
            "providers:\n  - id: p\n    kind: {kind}\n    baseUrl: http://127.0.0.1:9/v1\n    keys: [{{ alias: k, env: P1_KEY_A }}]\n    models: [{{ id: emb, capabilities: [embeddings], dimensions: 8 }}]\n"
        ));
        let config = dir.write("pool.yaml", &yaml).unwrap();
        let args: Vec<String> = [
            "serve",
            "--config",
            &config.display().to_string(),
            "--http-listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let env = vec![("P1_KEY_A".to_string(), "sk-test-embeddings".to_string())];
        let mut p = Process::spawn(&dir, "control-plane", &bin, &args, &env).unwrap();
        let status = p.wait_exit(START_TIMEOUT).await.unwrap();
        let logs = p.logs();
        assert!(
            !status.success(),
            "{kind}: a pool with an embeddings model loaded:\n{logs}"
        );
        assert!(
            logs.contains("has no embeddings API") && logs.contains(kind),
            "{kind}: the refusal names the problem:\n{logs}"
        );
        assert!(
            !logs.contains("\"grpc\""),
            "{kind}: nothing was served:\n{logs}"
        );
    }
}

fn vectors(r: &ai_router_e2e::Reply) -> Vec<Vec<f64>> {
    r.json["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .map(|item| {
                    item["embedding"]
                        .as_array()
                        .map(|v| v.iter().filter_map(Value::as_f64).collect())
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_fail_over_within_one_identity_and_never_to_another_model() {
    let gw = Gateway::start_with("embeddings_identity", embeddings_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([
            script::rule(
                json!({ "model": "te3" }),
                vec![script::status(503, json!({}), None)]
            ),
            script::always(vec![json!({ "dimensions": 8 })]),
        ]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![json!({ "dimensions": 8 })])]))
        .await
        .unwrap();

    // e1 fails every time: each call ends on e2 (the same identity), never on other-embed.
    let body = json!({ "model": "embed", "input": ["alpha", "beta"] });
    let mut e1_tried = 0;
    for _ in 0..4 {
        gw.clear_calls().await.unwrap();
        let r = embeddings(&gw, &body).await;
        let p1 = gw.mock1.calls().await.unwrap();
        let p2 = gw.mock2.calls().await.unwrap();
        assert_eq!(r.status, 200, "{r}\np1: {p1:#?}\np2: {p2:#?}");
        assert_eq!(r.json["object"], "list", "{r}");
        let v = vectors(&r);
        assert_eq!(v.len(), 2, "{r}");
        assert!(v.iter().all(|e| e.len() == 8), "{r}");
        assert_eq!(p2.len(), 1, "{p2:#?}");
        assert_eq!(p2[0].model.as_deref(), Some("openai/te3"));
        assert!(p2[0].path.ends_with("/v1/embeddings"), "{}", p2[0].path);
        assert!(
            p1.iter().all(|c| c.model.as_deref() == Some("te3")),
            "never another model: {p1:#?}"
        );
        e1_tried += p1.len();
    }
    assert!(e1_tried >= 1, "e1 was never tried first in four calls");

    // Both lanes of the identity fail: the call fails rather than moving to other-embed.
    gw.mock2
        .script(json!([script::always(vec![script::status(
            503,
            json!({}),
            None
        )])]))
        .await
        .unwrap();
    gw.clear_calls().await.unwrap();
    let r = embeddings(&gw, &body).await;
    let p1 = gw.mock1.calls().await.unwrap();
    assert!(r.status >= 500, "{r}\n{p1:#?}");
    assert!(r.json.pointer("/error/code").is_some(), "{r}");
    assert!(
        p1.iter().all(|c| c.model.as_deref() != Some("other-embed")),
        "an embeddings call moved to another model: {p1:#?}"
    );
    // other-embed itself works, so only the identity rule kept the call off it.
    gw.clear_calls().await.unwrap();
    let r = embeddings(&gw, &json!({ "model": "other-embed", "input": "x" })).await;
    assert_eq!(r.status, 200, "{r}");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_of_the_wrong_dimensions_fail_the_attempt() {
    let gw = Gateway::start_with("embeddings_dimensions", embeddings_pool)
        .await
        .expect("fixture");
    // e1 answers 4-long vectors though te3 declares 8; e2 answers 8.
    gw.mock1
        .script(json!([script::always(vec![json!({ "dimensions": 4 })])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![json!({ "dimensions": 8 })])]))
        .await
        .unwrap();
    let body = json!({ "model": "embed", "input": "alpha" });
    let mut e1_tried = 0;
    for _ in 0..4 {
        gw.clear_calls().await.unwrap();
        let r = embeddings(&gw, &body).await;
        let p1 = gw.mock1.calls().await.unwrap();
        assert_eq!(r.status, 200, "{r}\n{p1:#?}");
        let v = vectors(&r);
        assert_eq!(v.len(), 1, "{r}");
        assert_eq!(
            v[0].len(),
            8,
            "a vector of the wrong length reached the client:\n{r}"
        );
        assert_eq!(gw.mock2.calls().await.unwrap().len(), 1);
        if !p1.is_empty() {
            e1_tried += 1;
            assert_eq!(
                r.header("x-ai-router-attempts").as_deref(),
                Some("2"),
                "e1's answer failed its attempt:\n{r}"
            );
        }
    }
    assert!(e1_tried >= 1, "e1 was never tried in four calls");

    // Every lane of the identity answers the wrong length: an error, not a wrong vector.
    gw.mock2
        .script(json!([script::always(vec![json!({ "dimensions": 4 })])]))
        .await
        .unwrap();
    let r = embeddings(&gw, &body).await;
    assert!(r.status >= 500, "{r}");
    assert!(vectors(&r).is_empty(), "{r}");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_anthropic_adapter_cannot_express_goes_to_a_lane_that_can() {
    let gw = Gateway::start_with("anthropic_refusal_is_no_candidate", anthropic_pool)
        .await
        .expect("fixture");
    gw.mock2
        .script(json!([script::always(vec![script::text("two from p2")])]))
        .await
        .unwrap();
    // `n: 2` has no Messages equivalent: the Anthropic lane is no candidate, the fallback is.
    let body = json!({"model": "claude", "n": 2, "messages": [{"role": "user", "content": "hi"}]});
    let r = gw
        .client
        .chat_with(&body, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m2"), "{r}");
    assert!(
        gw.mock1.calls().await.unwrap().is_empty(),
        "claude was never tried"
    );
    assert_eq!(r.header("x-ai-router-attempts").as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requested_dimensions_are_what_embeddings_are_checked_against_and_a_mismatch_opens_no_breaker(
) {
    let gw = Gateway::start_with("embeddings_requested_dimensions", |p1, p2| {
        embeddings_pool(p1, p2).replace(
            "resilience:\n",
            "resilience:\n  keyBreaker: { failureThreshold: 2, cooldownMs: 60000, maxCooldownMs: 60000 }\n",
        )
    })
    .await
    .expect("fixture");
    // Both lanes of `embed` answer the 4 dimensions the caller asks for (the model declares 8).
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![json!({ "dimensions": 4 })])]))
            .await
            .unwrap();
    }
    let asked = json!({ "model": "embed", "input": "alpha", "dimensions": 4 });
    for i in 0..3 {
        let r = embeddings(&gw, &asked).await;
        assert_eq!(r.status, 200, "call {i}: {r}");
        assert_eq!(vectors(&r)[0].len(), 4, "{r}");
        assert_eq!(
            r.header("x-ai-router-attempts").as_deref(),
            Some("1"),
            "{r}"
        );
    }
    // Without `dimensions` those answers are the wrong length: the call fails over and fails,
    // but the keys are not failing, so their breakers stay closed.
    let plain = json!({ "model": "embed", "input": "alpha" });
    for _ in 0..4 {
        let r = embeddings(&gw, &plain).await;
        assert!(r.status >= 500, "{r}");
    }
    let metrics = ai_router_e2e::http_client()
        .unwrap()
        .get(format!("http://{}/metrics", gw.cp.http_addr()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !metrics.contains("ai_router_breaker_open{"),
        "a dimension mismatch opened a breaker:\n{metrics}"
    );
    let r = embeddings(&gw, &asked).await;
    assert_eq!(r.status, 200, "{r}");
}
