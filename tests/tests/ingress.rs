//! The Responses API served natively: every call to a lane of kind openai has its body and
//! answer passed through (`/v1/responses` at the provider), its stream held and cut by the
//! same rules as every other; a stateful call (`previous_response_id`, `store: true`) goes only
//! to such lanes, and a model with none answers 400; a response the gateway saw stored is
//! followed up only through the key that stored it. (The stateless Responses API and the Messages API, through the
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

/// The id of a Responses answer: the unary object's `id`, or the stream's `response.created`.
fn response_id(reply: &ai_router_e2e::Reply) -> String {
    if let Some(id) = reply.json["id"].as_str() {
        return id.to_owned();
    }
    reply
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|e| e["type"] == "response.created")
        .and_then(|e| e["response"]["id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no response id in {}", reply.text))
}

/// Two openai-kind keys on one provider: a stored response is answered by one of them; every
/// follow-up naming it (and the chain of answers after it) reaches that key alone, streamed or
/// not; with that key out, the follow-up is refused naming `previous_response_id`, and the
/// other key never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_response_reaches_only_the_key_that_stored_it() {
    let gw = gateway("ingress_stored_key").await;
    for first_streamed in [false, true] {
        let reply = responses(
            &gw,
            json!({ "model": "chat", "input": "Hi", "stream": first_streamed }),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        let mut previous = response_id(&reply);
        let calls = gw.mock1.calls().await.unwrap();
        let stored_by = gw.alias_of(calls.last().unwrap().key.as_deref());
        assert!(stored_by == "a" || stored_by == "b", "{stored_by}");
        // Round robin alone would alternate the two keys: six follow-ups, each naming the
        // answer before it, all reach the key that stored the first.
        for turn in 0..6 {
            let stream = turn % 2 == 1;
            let reply = responses(
                &gw,
                json!({ "model": "chat", "input": "And?", "stream": stream,
                        "previous_response_id": previous }),
            )
            .await;
            assert_eq!(reply.status, 200, "turn {turn}: {}", reply.text);
            let calls = gw.mock1.calls().await.unwrap();
            let call = calls.last().unwrap();
            assert_eq!(call.body["previous_response_id"], previous.as_str());
            assert_eq!(
                gw.alias_of(call.key.as_deref()),
                stored_by,
                "turn {turn} (first answer streamed: {first_streamed})"
            );
            previous = response_id(&reply);
        }
    }

    // The key that stores the next response is refused by the provider from now on.
    let reply = responses(&gw, json!({ "model": "chat", "input": "Hi" })).await;
    let id = response_id(&reply);
    let calls = gw.mock1.calls().await.unwrap();
    let stored_by = gw.alias_of(calls.last().unwrap().key.as_deref());
    let secret = if stored_by == "a" {
        &gw.key_a
    } else {
        &gw.key_b
    };
    gw.mock1
        .script(json!([script::rule(
            json!({ "key": secret }),
            vec![json!({ "providerError": "openai.invalid_key" })]
        )]))
        .await
        .unwrap();
    gw.mock1.clear_calls().await.unwrap();
    let follow_up = json!({ "model": "chat", "input": "And?", "previous_response_id": id });
    // Its refusal ends the call: no other key can read the response.
    let reply = responses(&gw, follow_up.clone()).await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    assert_eq!(reply.json["error"]["param"], "previous_response_id");
    // Now blacklisted: refused before any provider is called, saying why.
    let reply = responses(&gw, follow_up).await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    assert_eq!(reply.json["error"]["code"], "pool_auth_failed");
    assert_eq!(reply.json["error"]["param"], "previous_response_id");
    let message = reply.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("previous_response_id") && message.contains("blacklisted"),
        "{message}"
    );
    let keys: Vec<String> = gw
        .mock1
        .calls()
        .await
        .unwrap()
        .iter()
        .map(|c| gw.alias_of(c.key.as_deref()))
        .collect();
    assert_eq!(keys, vec![stored_by], "only the refused key, once");
    gw.check_no_secrets_in_logs().unwrap();
}
