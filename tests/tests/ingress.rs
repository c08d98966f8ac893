//! The Responses API served natively: every call to a lane of kind openai has its body and
//! answer passed through (`/v1/responses` at the provider), its stream held and cut by the
//! same rules as every other; a stateful call (`previous_response_id`, `store: true`) goes only
//! to such lanes, and a model with none answers 400. (The stateless Responses API and the Messages API, through the
//! official SDKs: tests/tests/conformance.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ai_router_e2e::{script, Gateway};
use reqwest::Method;
use serde_json::{json, Value};

/// p1 of kind openai (mock 1) serving `m1` (alias chat) and `m-cut`, falling back to p2's `m2`
/// (openai-compatible, mock 2, alias backup).
async fn gateway(test: &str) -> Gateway {
    Gateway::start_with(test, |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2)
            .replacen("kind: openai-compatible", "kind: openai", 1)
            .replace(
                "      - { id: m1, aliases: [chat] }\n",
                "      - { id: m1, aliases: [chat] }\n      - { id: m-cut }\n",
            )
    })
    .await
    .expect("fixture")
}

async fn responses(gw: &Gateway, body: Value) -> ai_router_e2e::Reply {
    gw.client
        .request(
            Method::POST,
            "/v1/responses",
            Some(&gw.virtual_key),
            Some(body.to_string()),
        )
        .await
        .unwrap()
}

/// The `event:` names of an SSE body, in order.
fn event_names(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_response_is_served_natively_by_an_openai_lane() {
    let gw = gateway("ingress_stateful").await;
    gw.mock1
        .script(json!([script::rule(
            json!({ "model": "m-cut" }),
            vec![script::stream_failing(&["one", " two"], 1, "error-event")]
        )]))
        .await
        .unwrap();

    // Unary: the provider's own response object, its id and all.
    let reply = responses(
        &gw,
        json!({ "model": "chat", "input": "Hi", "store": true, "previous_response_id": "resp_prev",
                "tools": [{ "type": "web_search" }] }),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(
        reply.json["id"].as_str().unwrap().starts_with("resp_mock_"),
        "{}",
        reply.text
    );
    assert_eq!(
        reply.json["output"][0]["content"][0]["text"],
        "Hello from the ai-router mock."
    );
    let calls = gw.mock1.calls().await.unwrap();
    let call = calls.last().unwrap();
    assert_eq!(call.path, "/v1/responses");
    assert_eq!(call.body["previous_response_id"], "resp_prev");
    assert_eq!(
        call.body["tools"][0]["type"], "web_search",
        "built-in tools pass through natively"
    );
    assert_eq!(call.model.as_deref(), Some("m1"));

    // The same model, stateless: natively too (an openai lane takes every Responses call as
    // it came).
    let reply = responses(&gw, json!({ "model": "chat", "input": "Hi" })).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json["object"], "response");
    let calls = gw.mock1.calls().await.unwrap();
    assert!(calls.last().unwrap().path.ends_with("/responses"));

    // Streamed natively: the provider's typed events as they came.
    let reply = responses(
        &gw,
        json!({ "model": "chat", "input": "Hi", "store": true, "stream": true }),
    )
    .await;
    assert_eq!(reply.status, 200);
    let names = event_names(&reply.text);
    assert_eq!(names.first(), Some(&"response.created"), "{}", reply.text);
    assert_eq!(names.last(), Some(&"response.completed"), "{}", reply.text);
    assert!(names.contains(&"response.output_text.delta"));

    // Cut after its first token: the gateway's error, then response.failed; never completed.
    let reply = responses(
        &gw,
        json!({ "model": "m-cut", "input": "Hi", "store": true, "stream": true }),
    )
    .await;
    let names = event_names(&reply.text);
    assert!(
        names.contains(&"response.output_text.delta"),
        "{}",
        reply.text
    );
    assert_eq!(
        names[names.len() - 2..],
        ["error", "response.failed"],
        "{}",
        reply.text
    );
    assert!(reply.text.contains("stream_interrupted"));
    assert!(!names.contains(&"response.completed"));

    // A model with no openai lane: refused, naming the field; nothing reaches a provider.
    let before = gw.mock2.calls().await.unwrap().len();
    let reply = responses(
        &gw,
        json!({ "model": "backup", "input": "Hi", "previous_response_id": "resp_prev" }),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert_eq!(reply.json["error"]["code"], "invalid_request");
    assert_eq!(reply.json["error"]["param"], "previous_response_id");
    assert_eq!(gw.mock2.calls().await.unwrap().len(), before);
    gw.check_no_secrets_in_logs().unwrap();
}
