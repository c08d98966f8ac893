//! The happy paths and the gateway's own answers, through a real Envoy: a unary and a streamed
//! chat completion with the virtual key, what the provider saw, the response headers, the
//! client errors (no/wrong/revoked key, bad JSON, missing or unknown model, unknown route) and
//! that no secret reaches a log or a client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ai_router_e2e::{openai_error_problem, script, standard_pool, Gateway, Reply};
use serde_json::{json, Value};

/// Response headers a client may see from the router; every other `x-ai-router-*` and every
/// `x-envoy-*` is internal.
const PUBLIC_ROUTER_HEADERS: &[&str] = &[
    "x-ai-router-model",
    "x-ai-router-attempts",
    "x-ai-router-cost",
    "x-ai-router-cost-estimate",
    "x-ai-router-route",
];

fn assert_no_internal_headers(headers: &reqwest::header::HeaderMap, what: &str) {
    for name in headers.keys() {
        let n = name.as_str();
        assert!(
            !n.starts_with("x-envoy-"),
            "{what}: Envoy-internal header {n} reached the client"
        );
        assert!(
            !n.starts_with("x-ai-router-") || PUBLIC_ROUTER_HEADERS.contains(&n),
            "{what}: internal header {n} reached the client"
        );
    }
}

fn assert_error(reply: &Reply, status: u16, code: &str, what: &str) {
    if let Some(problem) = openai_error_problem(reply, status, code) {
        panic!("{what}: {problem}");
    }
}

/// What every provider call must look like: the provider's own key in its auth header, the
/// pool model id, nothing of the client's credentials or of the router's internal headers.
fn assert_clean_provider_call(gw: &Gateway, call: &ai_router_e2e::MockCall, alias: &str) {
    let expected_secret = match alias {
        "a" => &gw.key_a,
        "b" => &gw.key_b,
        "c" => &gw.key_c,
        other => panic!("call with an unknown key {other}: {:?}", call.raw),
    };
    assert_eq!(
        call.header("authorization").as_deref(),
        Some(format!("Bearer {expected_secret}").as_str()),
        "the provider must see its own key as a bearer token: {:?}",
        call.raw
    );
    for (name, value) in call.header_pairs() {
        assert!(
            !value.contains(&gw.virtual_key),
            "the client's virtual key reached the provider in header {name}: {:?}",
            call.raw
        );
        assert!(
            !name.starts_with("x-ai-router-"),
            "internal header {name} reached the provider: {:?}",
            call.raw
        );
    }
    assert!(
        !call.body.to_string().contains(&gw.virtual_key),
        "the virtual key reached the provider in the body: {:?}",
        call.raw
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_chat_through_envoy_reaches_the_pool_model_with_the_providers_key() {
    // Latency decides between equal keys only past the slack: a slow answer from a loaded
    // machine must not take a key out of the alternation this test checks.
    let gw = Gateway::start_with("unary_chat", |p1, p2| {
        format!(
            "{}selection:\n  latencySlackMs: 60000\n",
            standard_pool(p1, p2)
        )
    })
    .await
    .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::text("Hello from p1")])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("Hello from p2")])]))
        .await
        .unwrap();

    // By alias, then by the pool model id.
    for model in ["chat", "m1"] {
        gw.clear_calls().await.unwrap();
        let r = gw.chat(model).await.unwrap();
        assert_eq!(r.status, 200, "chat {model}:\n{r}");
        assert_eq!(r.content(), Some("Hello from p1"), "chat {model}:\n{r}");
        assert_eq!(r.json["object"], "chat.completion", "chat {model}:\n{r}");
        assert!(
            r.header("content-type")
                .unwrap_or_default()
                .starts_with("application/json"),
            "{r}"
        );
        let request_id = r.header("x-request-id").unwrap_or_default();
        assert!(!request_id.is_empty(), "x-request-id missing:\n{r}");
        assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m1"), "{r}");
        assert_eq!(
            r.header("x-ai-router-attempts").as_deref(),
            Some("1"),
            "{r}"
        );
        assert_no_internal_headers(&r.headers, &format!("chat {model}"));
        assert!(
            !r.text.contains(&gw.key_a) && !r.text.contains(&gw.key_b),
            "{r}"
        );

        let calls = gw.provider_calls().await.unwrap();
        assert_eq!(calls.len(), 1, "one provider call expected: {calls:?}");
        let (alias, call) = &calls[0];
        assert!(
            alias == "a" || alias == "b",
            "p1's keys serve m1, got {alias}"
        );
        assert_eq!(call.path, "/v1/chat/completions", "{:?}", call.raw);
        assert_eq!(
            call.model.as_deref(),
            Some("m1"),
            "the pool model id: {:?}",
            call.raw
        );
        assert_eq!(call.body["model"], "m1", "{:?}", call.raw);
        assert!(!call.stream, "{:?}", call.raw);
        assert_eq!(
            call.body["messages"],
            json!([{ "role": "user", "content": "Say hello." }]),
            "the messages are forwarded untouched: {:?}",
            call.raw
        );
        assert_clean_provider_call(&gw, call, alias);
    }

    // Two calls for the same model use both keys of p1 in turn (equal weights alternate).
    // Each Envoy worker keeps its own turn, as Envoy's load balancers do: the calls go on one
    // HTTP/2 connection, so one worker takes them all (HTTP/1.1 calls may each open a
    // connection that another worker accepts, and two workers' turns interleave).
    gw.clear_calls().await.unwrap();
    let one_connection = ai_router_e2e::Client::new_h2(&gw.envoy.base_url()).unwrap();
    for _ in 0..4 {
        let r = one_connection
            .chat("chat", Some(&gw.virtual_key))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{r}");
    }
    let mut keys = gw.keys_called().await.unwrap();
    assert!(
        keys.len() == 4 && keys[0] != keys[1] && keys[0] == keys[2] && keys[1] == keys[3],
        "equal keys alternate: {keys:?}"
    );
    keys.sort();
    assert_eq!(keys, ["a", "a", "b", "b"], "equal keys alternate");

    // Every answer carries its own request id.
    let r1 = gw.chat("chat").await.unwrap();
    let r2 = gw.chat("chat").await.unwrap();
    assert_ne!(r1.header("x-request-id"), r2.header("x-request-id"));

    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chat_through_envoy_is_one_clean_sse_stream() {
    let gw = Gateway::start("stream_chat").await.expect("fixture");
    let chunks = ["Hel", "lo", " from", " p1"];
    gw.mock1
        .script(json!([script::always(vec![script::stream(&chunks)])]))
        .await
        .unwrap();

    let s = gw.stream("chat").await.unwrap();
    assert_eq!(s.status, 200, "{s}");
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
    assert_no_internal_headers(&s.headers, "stream");
    assert!(s.transport_error.is_none(), "{s}");
    assert_eq!(s.role_chunks(), 1, "exactly one role chunk:\n{s}");
    assert_eq!(s.contents(), chunks, "content in order:\n{s}");
    assert_eq!(s.events.last().map(String::as_str), Some("[DONE]"), "{s}");
    assert_eq!(s.events.iter().filter(|e| *e == "[DONE]").count(), 1, "{s}");
    for e in s.json_events() {
        assert!(e.get("error").is_none(), "no error event expected:\n{s}");
        assert_eq!(e["object"], "chat.completion.chunk", "{s}");
        // The client did not ask for usage, so the usage chunk the gateway asked for is not
        // forwarded.
        assert!(
            e.get("usage").is_none_or(Value::is_null),
            "usage chunk forwarded without stream_options.include_usage:\n{s}"
        );
    }

    let calls = gw.provider_calls().await.unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (alias, call) = &calls[0];
    assert!(call.stream, "{:?}", call.raw);
    assert_eq!(call.model.as_deref(), Some("m1"), "{:?}", call.raw);
    assert_eq!(
        call.body.pointer("/stream_options/include_usage"),
        Some(&json!(true)),
        "the gateway always asks the provider for usage: {:?}",
        call.raw
    );
    assert_clean_provider_call(&gw, call, alias);
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_are_openai_error_objects_and_reach_no_provider() {
    let gw = Gateway::start("client_errors").await.expect("fixture");
    let c = &gw.client;
    let key = Some(gw.virtual_key.as_str());
    let post = reqwest::Method::POST;
    let chat_path = "/v1/chat/completions";

    let r = c.chat("chat", None).await.unwrap();
    assert_error(&r, 401, "missing_api_key", "no key");
    let message = r.json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("Authorization: Bearer") && message.contains("x-api-key"),
        "a missing key names both headers it may come in: {r}"
    );
    // A known route with another method: 405, in the documented code set.
    let r = c
        .request(reqwest::Method::GET, chat_path, key, None)
        .await
        .unwrap();
    assert_error(&r, 405, "method_not_allowed", "GET on the chat route");
    // An Anthropic client without a key gets the Anthropic shape, naming its own header too.
    let r = c
        .request(
            post.clone(),
            "/v1/messages",
            None,
            Some(json!({ "model": "chat", "max_tokens": 5, "messages": [{ "role": "user", "content": "hi" }] }).to_string()),
        )
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.json["type"].as_str()),
        (401, Some("error")),
        "{r}"
    );
    let message = r.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("x-api-key"), "{r}");

    let wrong = ai_router_e2e::new_virtual_key();
    let r = c.chat("chat", Some(&wrong)).await.unwrap();
    assert_error(&r, 401, "invalid_api_key", "a well-formed unknown key");
    assert!(!r.text.contains(&wrong), "the key is not echoed: {r}");

    let r = c.chat("chat", Some("not-a-key")).await.unwrap();
    assert_error(&r, 401, "invalid_api_key", "a malformed key");

    let r = c
        .request(
            post.clone(),
            chat_path,
            key,
            Some("{\"model\": \"chat\", \"messages\": [".into()),
        )
        .await
        .unwrap();
    assert_error(&r, 400, "invalid_json", "a truncated JSON body");

    let r = c
        .request(post.clone(), chat_path, key, Some("not json at all".into()))
        .await
        .unwrap();
    assert_error(&r, 400, "invalid_json", "a non-JSON body");

    let body = json!({ "messages": [{ "role": "user", "content": "hi" }] });
    let r = c.chat_with(&body, key).await.unwrap();
    assert_error(&r, 400, "missing_model", "no model");

    let r = c.chat("no-such-model", key).await.unwrap();
    assert_error(
        &r,
        404,
        "model_not_found",
        "a model the pool does not serve",
    );

    let r = c
        .request(reqwest::Method::GET, "/v1/no-such-route", key, None)
        .await
        .unwrap();
    assert_error(&r, 404, "not_found", "GET an unknown route");
    let r = c
        .request(post.clone(), "/v2/chat/completions", key, Some("{}".into()))
        .await
        .unwrap();
    assert_error(&r, 404, "not_found", "POST an unknown route");

    let calls = gw.provider_calls().await.unwrap();
    assert!(
        calls.is_empty(),
        "refused requests reach no provider: {calls:?}"
    );
    // The key as `x-api-key` on the chat route is the key.
    let r = c
        .chat_with_headers(
            &ai_router_e2e::chat_body("chat", false),
            None,
            &[("x-api-key", &gw.virtual_key)],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "a key sent as x-api-key is accepted: {r}");

    // /v1/models answers locally with what the key may call.
    let r = c
        .request(reqwest::Method::GET, "/v1/models", key, None)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let ids: Vec<&str> = r.json["data"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    for id in ["m1", "m2"] {
        assert!(ids.contains(&id), "/v1/models lists {id}: {r}");
    }
    let r = c
        .request(reqwest::Method::GET, "/v1/models", None, None)
        .await
        .unwrap();
    assert_error(&r, 401, "missing_api_key", "/v1/models without a key");

    gw.check_no_secrets_in_logs().unwrap();
    let logs = format!("{}\n{}", gw.cp.logs(), gw.envoy.logs());
    assert!(!logs.contains(&wrong), "a refused key appears in the logs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_virtual_key_gets_401() {
    let gw = Gateway::start("revoked_key").await.expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::text("ok")])]))
        .await
        .unwrap();
    let resp = gw
        .admin()
        .post(
            "/admin/keys",
            &json!({ "label": "revoked_app", "models": ["*"] }),
        )
        .await
        .unwrap();
    let (status, created) = (resp.status, resp.json);
    assert_eq!(status, 201, "POST /admin/keys: {created}");
    let id = created["key"]["id"].as_str().expect("key.id").to_string();
    let secret = created["secret"].as_str().expect("secret").to_string();
    assert!(secret.starts_with("sk-starci-revoked_app-"), "{created}");

    // The new key reaches the filter by the sync push.
    ai_router_e2e::poll(
        "the created key to be accepted",
        std::time::Duration::from_secs(20),
        || {
            let c = gw.client.clone();
            let secret = secret.clone();
            async move {
                let r = c.chat("chat", Some(&secret)).await?;
                Ok((r.status == 200).then_some(()))
            }
        },
    )
    .await
    .unwrap();

    let resp = gw
        .admin()
        .call(
            reqwest::Method::POST,
            &format!("/admin/keys/{id}/revoke"),
            None,
        )
        .await
        .unwrap();
    assert!((200..300).contains(&resp.status), "revoke: {}", resp.status);

    let r = ai_router_e2e::poll(
        "the revoked key to be refused",
        std::time::Duration::from_secs(20),
        || {
            let c = gw.client.clone();
            let secret = secret.clone();
            async move {
                let r = c.chat("chat", Some(&secret)).await?;
                Ok((r.status != 200).then_some(r))
            }
        },
    )
    .await
    .unwrap();
    assert_error(&r, 401, "invalid_api_key", "a revoked key");

    // The mounted key is untouched.
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let logs = format!("{}\n{}", gw.cp.logs(), gw.envoy.logs());
    assert!(
        !logs.contains(&secret),
        "a created key's secret appears in the logs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_or_a_client() {
    let gw = Gateway::start("no_secrets").await.expect("fixture");
    // p1 refuses the request with an error that echoes the key it was sent (as OpenAI's
    // "Incorrect API key provided: sk-..." does); p2 answers.
    let bad_request = |key: &str| {
        script::status(
            400,
            json!({}),
            Some(json!({ "error": {
                "message": format!("Invalid request for key {key}: maximum context length exceeded"),
                "type": "invalid_request_error",
                "param": null,
                "code": "context_length_exceeded"
            } })),
        )
    };
    gw.mock1
        .script(json!([
            script::for_key(&gw.key_a, vec![bad_request(&gw.key_a)]),
            script::for_key(&gw.key_b, vec![bad_request(&gw.key_b)]),
        ]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::text("from p2")])]))
        .await
        .unwrap();

    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 400, "{r}");
    assert!(
        r.text.contains("Invalid request for key [redacted]"),
        "the echoed key is replaced by [redacted]:\n{r}"
    );
    for (name, secret) in gw.secrets() {
        assert!(!r.text.contains(secret), "{name} reached the client:\n{r}");
    }
    let s = gw.stream("chat").await.unwrap();
    for (name, secret) in gw.secrets() {
        assert!(!s.body.contains(secret), "{name} reached the client:\n{s}");
    }
    // A direct call to p2's model, so that a success is in the logs too.
    let r = gw.chat("m2").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let r = gw.client.chat("chat", None).await.unwrap();
    assert_eq!(r.status, 401, "{r}");

    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_health_is_ok_until_no_provider_has_a_usable_key() {
    let gw = Gateway::start("gateway_health").await.expect("fixture");
    let health = || async {
        gw.client
            .request(reqwest::Method::GET, "/health", None, None)
            .await
            .unwrap()
    };
    let r = health().await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json["status"], "ok", "{r}");
    // Every key of every provider is refused: once blacklisted, the pool is degraded.
    let refused = script::status(
        401,
        json!({}),
        Some(
            json!({"error": {"message": "bad key", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}),
        ),
    );
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![refused.clone()])]))
            .await
            .unwrap();
    }
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 503, "{r}");
    let started = std::time::Instant::now();
    loop {
        let r = health().await;
        assert_eq!(r.status, 200, "{r}");
        if r.json["status"] == "degraded" {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "still {r} with every key refused"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_exposes_what_envoy_reported_as_prometheus_metrics_without_secrets() {
    let gw = Gateway::start("metrics").await.expect("fixture");
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let url = format!("http://{}/metrics", gw.cp.http_addr());
    // Reports reach the control plane a moment after the answer: poll.
    let started = std::time::Instant::now();
    let text = loop {
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        if text.contains(
            "ai_router_requests_total{operation=\"chat\",protocol=\"chat\",provider=\"p1\",model=\"m1\",outcome=\"success\"} 1",
        )
            && text.contains("outcome=\"success\",class=\"\"} 1")
        {
            break text;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "the call is not counted:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(text.contains("ai_router_state_version "), "{text}");
    for secret in [
        &gw.key_a,
        &gw.key_b,
        &gw.key_c,
        &gw.virtual_key,
        &gw.sync_token,
    ] {
        assert!(
            !text.contains(secret.as_str()),
            "a secret in /metrics:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_with_the_admin_token_shows_breakers_and_keys_and_model_ids_are_percent_decoded() {
    let gw = Gateway::start_with("health_admin_and_model_ids", |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2)
            .replace(
                "{ id: m2, aliases: [backup] }",
                "{ id: org/m2, aliases: [backup] }",
            )
            .replace("fallbacks: [m2]", "fallbacks: [org/m2]")
    })
    .await
    .expect("fixture");
    // Key a is refused: out until its secret changes.
    gw.mock1
        .script(json!([
            script::for_key(
                &gw.key_a,
                vec![json!({"status": 401, "body": {"error": {
                "message": "Incorrect API key provided.", "type": "invalid_request_error",
                "param": null, "code": "invalid_api_key"}}})]
            ),
            script::always(vec![script::text("ok")])
        ]))
        .await
        .unwrap();
    let health = |token: Option<String>| {
        let gw = &gw;
        async move {
            gw.client
                .request(reqwest::Method::GET, "/health", token.as_deref(), None)
                .await
                .unwrap()
        }
    };
    let out = ai_router_e2e::poll(
        "key a to show as out",
        std::time::Duration::from_secs(15),
        || {
            let gw = &gw;
            let health = &health;
            async move {
                let _ = gw.chat("chat").await?;
                let r = health(Some(gw.admin_token.clone())).await;
                let keys = r.json["keys"].as_array().cloned().unwrap_or_default();
                Ok(keys
                    .iter()
                    .any(|k| k["key"] == "a" && k["reason"] == "auth")
                    .then_some(r))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(out.status, 200, "{out}");
    assert!(out.json["breakers"].is_array(), "{out}");
    // Named as the admin API names it: out until its secret changes is `untilMs: null`.
    let key_a = out.json["keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["key"] == "a"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        key_a.get("untilMs"),
        Some(&serde_json::Value::Null),
        "{out}"
    );
    for (name, secret) in gw.secrets() {
        assert!(!out.text.contains(secret), "{name} in /health: {out}");
    }
    // Without the token, or with another, only the status.
    for token in [
        None,
        Some("not-the-admin-token".to_string()),
        Some(gw.virtual_key.clone()),
    ] {
        let r = health(token).await;
        assert_eq!(r.status, 200, "{r}");
        assert!(
            r.json.get("keys").is_none() && r.json.get("breakers").is_none(),
            "{r}"
        );
        assert!(r.json["status"].is_string(), "{r}");
    }

    // The OpenAI SDK percent-encodes `/` in a model id.
    let r = gw
        .client
        .request(
            reqwest::Method::GET,
            "/v1/models/org%2Fm2",
            Some(&gw.virtual_key),
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json["id"], "org/m2", "{r}");
}
