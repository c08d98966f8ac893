//! The release blockers a hostile client or a misbehaving provider could use, through a real
//! Envoy: header bytes that are not UTF-8 (HTTP/1.1 and HTTP/2, both stages), a provider that
//! sends the stages' own signals, a provider that echoes its key (unary, SSE, error events,
//! the Anthropic stream), a key's model scope and a shared alias, and the headers that may
//! cross the gateway in either direction.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{
    chat_body, http_client, openai_error_problem, poll, script, status_of, Gateway, Reply,
};
use serde_json::{json, Value};

/// [`ai_router_e2e::raw_http1`], failing the test on a transport error.
async fn raw_http1(addr: std::net::SocketAddr, request: &[u8]) -> String {
    ai_router_e2e::raw_http1(addr, request).await.unwrap()
}

/// An HTTP/2 client without TLS (prior knowledge), as `curl --http2-prior-knowledge` is.
fn h2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn reply_of(resp: reqwest::Response) -> Reply {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    Reply {
        status,
        headers,
        json: serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    }
}

fn assert_error(reply: &Reply, status: u16, code: &str, what: &str) {
    if let Some(problem) = openai_error_problem(reply, status, code) {
        panic!("{what}: {problem}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_bytes_that_are_not_utf8_never_break_either_stage() {
    let gw = Gateway::start("non_utf8_headers").await.expect("fixture");
    // The provider answers with a Latin-1 byte in a header of its own, as some servers do.
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": "caf\u{e9} served",
            "headers": { "x-served-by": "caf\u{e9}", "x-ratelimit-remaining-requests": "9\u{e9}" }
        })])]))
        .await
        .unwrap();
    let addr = gw.envoy.listen_addr();
    let body = chat_body("chat", false).to_string();
    for round in 0..4 {
        // HTTP/1.1, no key: /health and a chat with a byte >= 0x80 in a header value.
        let mut health =
            b"GET /health HTTP/1.1\r\nhost: gw\r\nconnection: close\r\nx-foo: caf".to_vec();
        health.extend_from_slice(b"\xe9\r\n\r\n");
        let answer = raw_http1(addr, &health).await;
        assert_eq!(status_of(&answer), 200, "round {round}: /health: {answer}");
        assert!(answer.contains("\"status\""), "round {round}: {answer}");

        let mut chat = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nconnection: close\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-note: na",
            gw.virtual_key,
            body.len()
        )
        .into_bytes();
        chat.extend_from_slice(b"\xefve\xff\r\n\r\n");
        chat.extend_from_slice(body.as_bytes());
        let answer = raw_http1(addr, &chat).await;
        assert_eq!(status_of(&answer), 200, "round {round}: chat: {answer}");
        assert!(answer.contains("served"), "round {round}: {answer}");

        // An Authorization header that is not text is refused, in the OpenAI shape.
        let mut bad_auth = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\nauthorization: Bearer sk-",
            body.len()
        )
        .into_bytes();
        bad_auth.extend_from_slice(b"\xe9\xe9\r\n\r\n");
        bad_auth.extend_from_slice(body.as_bytes());
        let answer = raw_http1(addr, &bad_auth).await;
        assert_eq!(status_of(&answer), 400, "round {round}: bad auth: {answer}");
        assert!(
            answer.contains("\"code\":\"invalid_request\""),
            "round {round}: {answer}"
        );

        // HTTP/2 (prior knowledge), the same bytes.
        let h2 = h2_client();
        let value = reqwest::header::HeaderValue::from_bytes(b"caf\xe9").unwrap();
        let resp = h2
            .get(format!("{}/health", gw.envoy.base_url()))
            .header("x-foo", value.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.version(), reqwest::Version::HTTP_2);
        assert_eq!(resp.status().as_u16(), 200, "round {round}: h2 /health");
        let resp = h2
            .post(format!("{}/v1/chat/completions", gw.envoy.base_url()))
            .bearer_auth(&gw.virtual_key)
            .header("content-type", "application/json")
            .header("x-foo", value)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let reply = reply_of(resp).await;
        assert_eq!(reply.status, 200, "round {round}: h2 chat: {reply}");
        assert_eq!(reply.content(), Some("caf\u{e9} served"), "{reply}");
        assert!(
            reply.header("x-served-by").is_none(),
            "a provider header outside the allowlist reached the client: {reply}"
        );
    }
    // And the gateway still serves an ordinary client afterwards.
    let reply = gw.chat("chat").await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert!(
        !gw.envoy.logs().contains("panicked"),
        "the filter panicked:\n{}",
        gw.envoy.tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_cannot_send_the_stages_signals() {
    let gw = Gateway::start("provider_impersonation")
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": "fine",
            "headers": {
                "x-ai-router-final-status": "299",
                "x-ai-router-retry": "1",
                "x-ai-router-attempt": "7",
                "x-ai-router-lane-model": "spoofed",
                "x-envoy-overloaded": "true"
            }
        })])]))
        .await
        .unwrap();
    let reply = gw.chat("chat").await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.content(), Some("fine"), "{reply}");
    assert_eq!(reply.header("x-ai-router-attempts").as_deref(), Some("1"));
    assert_eq!(reply.header("x-ai-router-model").as_deref(), Some("m1"));
    assert_eq!(
        gw.keys_called().await.unwrap().len(),
        1,
        "a spoofed retry signal made the gateway call the provider again"
    );
    // A stream too.
    gw.clear_calls().await.unwrap();
    let streamed = gw.stream("chat").await.unwrap();
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert_eq!(gw.keys_called().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_key_never_reaches_the_client() {
    let gw = Gateway::start("key_echo").await.expect("fixture");
    let key = gw.key_a.clone();
    // An echo of the key in a server-side failure (not a refusal: the key stays in use).
    let echo = format!("The server had an error processing the request sent with {key}.");
    // Key b is not used: keep every call on key a.
    gw.mock1
        .script(json!([
            script::rule(
                json!({"key": gw.key_b}),
                vec![json!({"status": 401, "body": {"error": {"message": "no", "type": "invalid_request_error", "code": "invalid_api_key"}}})]
            ),
            script::always(vec![
                // Unary: the key echoed in the answer and in an allowlisted header.
                json!({"text": format!("your key is {key}"), "headers": {"cache-control": format!("no-store {key}")}}),
                // SSE: a chunk echoes it, then an error event after the first token does.
                json!({"stream": {
                    "chunks": ["Hello ", format!("{key} "), "world"],
                    "failAfter": 2,
                    "failWith": "error-event",
                    "errorMessage": echo,
                }}),
                // A non-retryable error echoing it.
                json!({"status": 400, "body": {"error": {"message": format!("Invalid 'messages[0]' (sent with {key})"), "type": "invalid_request_error", "code": null}}}),
            ]),
        ]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("p2")])]))
        .await
        .unwrap();

    let reply = gw.chat("m1").await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    let mut seen = vec![reply.to_string()];
    assert!(reply.text.contains("[redacted]"), "{reply}");

    let streamed = gw.stream("m1").await.unwrap();
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert!(
        streamed.body.contains("Hello "),
        "the answer started: {}",
        streamed.body
    );
    assert!(
        streamed.body.contains("[redacted]"),
        "the echo is redacted: {}",
        streamed.body
    );
    seen.push(streamed.body.clone());
    seen.push(format!("{:?}", streamed.headers));

    let refused = gw.chat("m1").await.unwrap();
    assert_eq!(refused.status, 400, "{refused}");
    assert!(refused.text.contains("[redacted]"), "{refused}");
    seen.push(refused.to_string());

    for (name, secret) in gw.secrets() {
        for text in &seen {
            assert!(!text.contains(secret), "{name} reached the client:\n{text}");
        }
    }
    gw.check_no_secrets_in_logs().unwrap();
}

/// Provider `claude` (kind anthropic, mock 1, key `a`) and `p2` (openai-compatible, mock 2).
fn anthropic_pool(p1: &str, p2: &str) -> String {
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
providers:
  - id: claude
    kind: anthropic
    baseUrl: {p1}
    keys:
      - {{ alias: a, env: P1_KEY_A }}
    models:
      - {{ id: claude-m, aliases: [claude] }}
  - id: p2
    kind: openai-compatible
    baseUrl: {p2}
    keys:
      - {{ alias: c, env: P2_KEY_C }}
    models:
      - {{ id: m2 }}
defaults:
  deadlineMs: 20000
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_stream_never_carries_the_key_to_the_client() {
    let gw = Gateway::start_with("anthropic_key_echo", anthropic_pool)
        .await
        .expect("fixture");
    let key = gw.key_a.clone();
    gw.mock1
        .script(json!([script::always(vec![json!({"stream": {
            "chunks": ["Hi ", format!("{key} "), "there"],
            "failAfter": 2,
            "failWith": "error-event",
            "errorMessage": format!("invalid x-api-key {key}"),
        }})])]))
        .await
        .unwrap();
    let streamed = gw.stream("claude").await.unwrap();
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert!(streamed.body.contains("Hi "), "{}", streamed.body);
    assert!(
        !streamed.body.contains(&key),
        "the key reached the client: {}",
        streamed.body
    );
    assert!(streamed.body.contains("[redacted]"), "{}", streamed.body);
}

/// `p1` serves `m1` (aliases `chat`, `fast`), `p2` serves `m2` (alias `fast`): one alias, two
/// providers' models.
fn shared_alias_pool(p1: &str, p2: &str) -> String {
    ai_router_e2e::standard_pool(p1, p2)
        .replace(
            "{ id: m1, aliases: [chat] }",
            "{ id: m1, aliases: [chat, fast] }",
        )
        .replace(
            "{ id: m2, aliases: [backup] }",
            "{ id: m2, aliases: [fast] }",
        )
        .replace("fallbacks: [m2]", "fallbacks: [fast]")
        .replace("deadlineMs: 30000", "deadlineMs: 4000")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_calls_only_the_model_names_it_lists() {
    let gw = Gateway::start_with("scope_alias", shared_alias_pool)
        .await
        .expect("fixture");
    // p1 fails every call: a key scoped to m1 must not be answered by p2's m2, whatever name
    // it calls m1 by.
    gw.mock1
        .script(json!([script::always(vec![json!({"status": 500})])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("from m2")])]))
        .await
        .unwrap();
    let created: Value = gw
        .admin()
        .post(
            "/admin/keys",
            &json!({"label": "narrow", "models": ["m1"], "profiles": []}),
        )
        .await
        .unwrap()
        .json;
    let narrow = created["secret"].as_str().expect("secret").to_string();
    // The key reaches Envoy within a push.
    poll("the new key is pushed", Duration::from_secs(10), || {
        let c = gw.client.clone();
        let narrow = narrow.clone();
        async move {
            let r = c.chat("m2", Some(&narrow)).await?;
            Ok((r.status != 401).then_some(()))
        }
    })
    .await
    .unwrap();
    let direct = gw.client.chat("m2", Some(&narrow)).await.unwrap();
    assert_error(
        &direct,
        403,
        "model_not_allowed",
        "m2 is outside the key's scope",
    );

    // An alias of the model the key lists is another name: refused, never remapped.
    for name in ["fast", "chat"] {
        gw.clear_calls().await.unwrap();
        let reply = gw.client.chat(name, Some(&narrow)).await.unwrap();
        assert_error(
            &reply,
            403,
            "model_not_allowed",
            &format!("{name} is not a name the key lists"),
        );
        assert!(
            gw.provider_calls().await.unwrap().is_empty(),
            "{name}: a refused name reached a provider"
        );
    }
    gw.clear_calls().await.unwrap();
    let reply = gw.client.chat("m1", Some(&narrow)).await.unwrap();
    assert_ne!(reply.status, 200, "m1: answered outside the scope: {reply}");
    assert!(
        gw.mock2.calls().await.unwrap().is_empty(),
        "p2's m2 was called for a key scoped to m1"
    );
    // The mounted key (every model) still falls back to p2 through the alias.
    let reply = gw.chat("fast").await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.content(), Some("from m2"));
    // /v1/models lists what the key may call, nothing more.
    let models = gw
        .client
        .request(reqwest::Method::GET, "/v1/models", Some(&narrow), None)
        .await
        .unwrap();
    let ids: Vec<&str> = models.json["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["m1"], "only the names the key lists");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowlisted_headers_cross_the_gateway() {
    let gw = Gateway::start("header_allowlist").await.expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": "ok",
            "headers": {
                "set-cookie": "session=provider",
                "openai-organization": "org-provider",
                "openai-project": "proj-provider",
                "x-ratelimit-remaining-requests": "99",
                "server": "provider-server",
                "x-provider-debug": "internal"
            }
        })])]))
        .await
        .unwrap();
    let resp = http_client()
        .unwrap()
        .post(format!("{}/v1/chat/completions", gw.envoy.base_url()))
        .bearer_auth(&gw.virtual_key)
        .header("content-type", "application/json")
        .header("user-agent", "sdk/1.0")
        .header("api-key", "client-api-key")
        .header("x-api-key", "client-x-api-key")
        .header("proxy-authorization", "Basic Y2xpZW50")
        .header("cookie", "client=1")
        .header("openai-organization", "org-client")
        .header("openai-project", "proj-client")
        .header("x-goog-api-key", "client-goog")
        .header("x-custom", "anything")
        .header("accept-encoding", "gzip")
        .body(chat_body("chat", false).to_string())
        .send()
        .await
        .unwrap();
    let reply = reply_of(resp).await;
    assert_eq!(reply.status, 200, "{reply}");
    for name in [
        "set-cookie",
        "openai-organization",
        "openai-project",
        "x-ratelimit-remaining-requests",
        "x-provider-debug",
    ] {
        assert!(
            reply.header(name).is_none(),
            "the provider's {name} reached the client: {reply}"
        );
    }
    assert_ne!(reply.header("server").as_deref(), Some("provider-server"));
    let calls = gw.mock1.calls().await.unwrap();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    for name in [
        "api-key",
        "x-api-key",
        "proxy-authorization",
        "cookie",
        "openai-organization",
        "openai-project",
        "x-goog-api-key",
        "x-custom",
        "accept-encoding",
        "x-forwarded-for",
        "x-envoy-attempt-count",
        "x-envoy-expected-rq-timeout-ms",
    ] {
        assert!(
            call.header(name).is_none(),
            "the client's {name} reached the provider: {:?}",
            call.header_pairs()
        );
    }
    assert_eq!(call.header("user-agent").as_deref(), Some("sdk/1.0"));
    let auth = call.header("authorization").unwrap_or_default();
    assert!(
        auth == format!("Bearer {}", gw.key_a) || auth == format!("Bearer {}", gw.key_b),
        "the provider sees its own key only: {auth}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_answer_without_a_body_never_breaks_the_attempt_stage() {
    let gw = Gateway::start("headers_only_answers")
        .await
        .expect("fixture");
    // Every p1 key answers a bare 503 (no body at all): the call fails over to p2.
    gw.mock1
        .script(json!([script::always(vec![
            json!({"status": 503, "body": ""})
        ])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::rule(
            json!({"model": "m2"}),
            vec![
                script::text("from p2"),
                // Then a bare 400: the client gets an error object, not an empty body.
                json!({"status": 400, "body": ""}),
            ]
        ),]))
        .await
        .unwrap();
    for round in 0..3 {
        let reply = gw.chat("chat").await.unwrap();
        if round == 0 {
            assert_eq!(reply.status, 200, "{reply}");
            assert_eq!(reply.content(), Some("from p2"), "{reply}");
        } else {
            assert_eq!(reply.status, 400, "round {round}: {reply}");
            assert!(
                reply.json.pointer("/error/message").is_some(),
                "round {round}: an error object: {reply}"
            );
        }
    }
    assert!(
        !gw.envoy.logs().contains("panicked"),
        "the filter panicked:\n{}",
        gw.envoy.tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_headers_reach_the_client_only_when_the_operator_opts_in() {
    let gw = Gateway::start_with("rate_limit_headers_opt_in", |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2).replace(
            "  keyStore: { type: memory }\n",
            "  keyStore: { type: memory }\n  forwardRateLimitHeaders: true\n",
        )
    })
    .await
    .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": "ok",
            "headers": {
                "x-ratelimit-remaining-requests": "99",
                "x-ratelimit-limit-requests": "100",
                "set-cookie": "session=provider",
                "x-ai-router-retry": "1"
            }
        })])]))
        .await
        .unwrap();
    let reply = gw.chat("chat").await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(
        reply.header("x-ratelimit-remaining-requests").as_deref(),
        Some("99"),
        "{reply}"
    );
    assert_eq!(
        reply.header("x-ratelimit-limit-requests").as_deref(),
        Some("100")
    );
    assert!(reply.header("set-cookie").is_none(), "{reply}");
    assert!(reply.header("x-ai-router-retry").is_none(), "{reply}");
}

/// A tenant cannot take the pool's shared keys out with words a provider repeats: OpenAI
/// answers an unknown value with `Invalid value: '<value>'`, Anthropic an unknown tag with
/// `Input tag '<tag>'` ([`anthropic_pool`]: one key per provider, nothing to fail over to). Each echoed 400 is the client's own 400; the keys stay in use for
/// every tenant, in this Envoy and in the control plane's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_echo_of_the_clients_words_never_takes_a_key_out() {
    let gw = Gateway::start_with("echoed_400", anthropic_pool)
        .await
        .expect("fixture");
    let words = [
        "incorrect api key",
        "usage limit per month",
        "Your credit balance is too low",
        "exceeded your current quota",
        "API key not valid",
    ];
    let mut sent = 0;
    for word in words {
        let mut body = chat_body("m2", false);
        body["reasoning_effort"] = json!(word);
        let r = gw
            .client
            .chat_with(&body, Some(&gw.virtual_key))
            .await
            .unwrap();
        assert_error(&r, 400, "upstream_invalid_request", word);
        assert!(
            r.text.contains(word),
            "the provider's words reach the client: {r}"
        );
        let messages = json!({
            "model": "claude-m", "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            "tool_choice": {"type": word},
            "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        });
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
        assert_eq!(r.status, 400, "{word}: {r}");
        assert_eq!(r.json["type"], "error", "the Anthropic shape: {r}");
        sent += 2;
    }
    // An unknown role is refused by the gateway itself: no provider repeats it.
    let calls_before = gw.provider_calls().await.unwrap().len();
    let body =
        json!({"model": "gpt-m", "messages": [{"role": "incorrect api key", "content": "hi"}]});
    let r = gw
        .client
        .chat_with(&body, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_error(&r, 400, "invalid_request", "an unknown role");
    assert_eq!(r.json["error"]["param"], "messages", "{r}");
    assert_eq!(gw.provider_calls().await.unwrap().len(), calls_before);

    // Every echoed 400 reached the control plane as what it is, the request's fault.
    poll(
        "the control plane to count every attempt",
        Duration::from_secs(15),
        || async {
            let stats = gw.admin().get_json("/admin/stats").await?;
            let attempts: u64 = stats["lanes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| l["attempts"].as_u64())
                .sum();
            Ok((attempts >= sent).then_some(()))
        },
    )
    .await
    .unwrap();
    let health = gw.admin().get_json("/admin/health").await.unwrap();
    let keys: Vec<&Value> = health["providers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["keys"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(keys.len(), 2, "{health}");
    assert!(
        keys.iter().all(|k| k["state"] == "ok"),
        "a key was taken out: {health}"
    );
    assert_eq!(
        health["cooldowns"],
        json!([]),
        "no lane cools down: {health}"
    );
    let public = gw
        .client
        .request_with_headers(
            reqwest::Method::GET,
            "/health",
            Some(&gw.admin_token),
            None,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(public.json["keys"], json!([]), "no key is out: {public}");
    // Both keys still serve every tenant.
    let r = gw.chat("m2").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let r = gw.chat("claude-m").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
}

/// Provider `oa` (kind openai, mock 1, one key) serving two models.
fn two_model_pool(p1: &str, _p2: &str) -> String {
    format!(
        "{}providers:\n  - id: oa\n    kind: openai\n    baseUrl: {p1}\n    keys: [{{ alias: a, env: P1_KEY_A }}]\n    models: [{{ id: gpt-day }}, {{ id: gpt-other }}]\n",
        ai_router_e2e::admin_pool_yaml_header()
    )
}

/// OpenAI's tokens-per-day limit is the model's on that key: the lane (key and model) cools
/// down for the wait the message names (3h12m36s), and the key's other model goes on serving;
/// the key is never blacklisted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_daily_limit_holds_its_lane_not_the_key() {
    let gw = Gateway::start_with("daily_limit_lane", two_model_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([
            script::rule(
                json!({"model": "gpt-day"}),
                vec![script::provider_error("openai.tokens_per_day")]
            ),
            script::always(vec![script::text("other")]),
        ]))
        .await
        .unwrap();
    let r = gw.chat("gpt-day").await.unwrap();
    assert_ne!(r.status, 200, "{r}");
    let called = gw.provider_calls().await.unwrap().len();
    // The lane is out in this Envoy at once; the other model on the same key serves.
    let r = gw.chat("gpt-day").await.unwrap();
    assert_ne!(r.status, 200, "{r}");
    assert_eq!(
        gw.provider_calls().await.unwrap().len(),
        called,
        "gpt-day was tried again"
    );
    let r = gw.chat("gpt-other").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    // The control plane holds the lane for the window, not the key.
    let sent = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let health = poll("the lane's cooldown", Duration::from_secs(15), || async {
        let h = gw.admin().get_json("/admin/health").await?;
        Ok((h["cooldowns"].as_array().is_some_and(|c| !c.is_empty())).then_some(h))
    })
    .await
    .unwrap();
    let cooldown = &health["cooldowns"][0];
    assert_eq!(
        (&cooldown["key"], &cooldown["model"]),
        (&json!("a"), &json!("gpt-day")),
        "{health}"
    );
    let until = cooldown["untilMs"].as_i64().unwrap_or(0);
    let window = 11_556_000;
    assert!(
        (until - sent - window).abs() < 60_000,
        "the window the message names: {until} vs {sent} + {window}: {health}"
    );
    assert_eq!(health["providers"][0]["keys"][0]["state"], "ok", "{health}");
}

/// The text a client's SDK joins from a stream's deltas, in the caller's protocol.
fn joined_deltas(path: &str, body: &str) -> String {
    let mut text = String::new();
    for data in ai_router_e2e::parse_sse(body) {
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            continue;
        };
        let piece = match path {
            "/v1/chat/completions" => v.pointer("/choices/0/delta/content"),
            "/v1/messages" => v.pointer("/delta/text"),
            _ => (v.get("type").and_then(Value::as_str) == Some("response.output_text.delta"))
                .then(|| v.get("delta"))
                .flatten(),
        };
        text.push_str(piece.and_then(Value::as_str).unwrap_or(""));
    }
    text
}

/// A key split across two deltas (every SDK joins them), and a key echoed truncated
/// (`sk-…abcd`: its start, a mask, its last four characters), reach no caller protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_split_across_two_deltas_or_truncated_never_reaches_the_client() {
    let gw = Gateway::start("key_split").await.expect("fixture");
    let key = gw.key_a.clone();
    let tail = &key[key.len() - 4..];
    let cut = key.len() / 2;
    gw.mock1
        .script(json!([
            script::rule(json!({"key": gw.key_b}), vec![json!({"status": 503})]),
            script::always(vec![json!({"stream": {
                "chunks": ["Your key is ", format!("x{}", &key[..cut]), format!("{} and sk-…{tail} end", &key[cut..])],
            }})]),
        ]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![json!({"status": 503})])]))
        .await
        .unwrap();
    let messages = json!({"model": "m1", "max_tokens": 64, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let responses = json!({"model": "m1", "stream": true, "input": "hi"});
    for (path, body) in [
        ("/v1/chat/completions", chat_body("m1", true)),
        ("/v1/messages", messages),
        ("/v1/responses", responses),
    ] {
        let reply = gw
            .client
            .request_with_headers(
                reqwest::Method::POST,
                path,
                Some(&gw.virtual_key),
                Some(body.to_string()),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(reply.status, 200, "{path}: {reply}");
        let joined = joined_deltas(path, &reply.text);
        assert_eq!(
            joined, "Your key is x[redacted] and [redacted] end",
            "{path}: {}",
            reply.text
        );
    }
    gw.check_no_secrets_in_logs().unwrap();
}
