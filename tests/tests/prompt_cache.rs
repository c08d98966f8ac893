//! `promptCache` through a real Envoy: a profile with it sends its anthropic provider one
//! `cache_control` marker (on the last system block, and one on the last tool), none when the
//! client placed its own anywhere (even where the translation drops it), none without it, never a second one on a failed-over attempt; the cached prompt tokens the provider reports come back in the OpenAI
//! usage shape and reach the key's usage rows, priced at `cost.cachedInput`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{poll, script, standard_pool, Gateway};
use serde_json::{json, Value};

fn pool(p1: &str, p2: &str) -> String {
    let base = standard_pool(p1, p2)
        .replace(
            "  - id: p1\n    kind: openai-compatible",
            "  - id: p1\n    kind: anthropic",
        )
        .replace(
            "{ id: m1, aliases: [chat] }",
            "{ id: m1, aliases: [chat], cost: { input: 10, output: 10, cachedInput: 1 } }",
        );
    format!(
        "{base}profiles:\n  cached: {{ model: m1, fallbacks: [], promptCache: {{ ttl: 1h }} }}\n"
    )
}

/// How many times `cache_control` appears in a JSON body.
fn markers(body: &Value) -> usize {
    body.to_string().matches("\"cache_control\"").count()
}

/// The body of the last call the anthropic mock received.
async fn last_call(gw: &Gateway) -> Value {
    let calls = gw.mock1.calls().await.unwrap();
    calls
        .last()
        .expect("a call to the anthropic mock")
        .body
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_request_carries_one_marker_and_cached_tokens_reach_usage() {
    let gw = Gateway::start_with("prompt_cache", pool)
        .await
        .expect("fixture");
    let reply = json!({
        "text": "ok",
        "usage": { "prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 80 },
    });
    gw.mock1
        .script(json!([script::always(vec![reply])]))
        .await
        .unwrap();
    let messages = json!([
        { "role": "system", "content": "You answer in one word." },
        { "role": "user", "content": "Say hello." },
    ]);
    let first = poll("the gateway to answer", Duration::from_secs(15), || {
        let c = gw.client.clone();
        let key = gw.virtual_key.clone();
        let body = json!({ "model": "cached", "messages": messages });
        async move {
            let r = c.chat_with(&body, Some(&key)).await?;
            Ok((r.status == 200).then_some(r))
        }
    })
    .await
    .unwrap();
    let sent = last_call(&gw).await;
    assert_eq!(markers(&sent), 1, "one marker: {sent}");
    assert_eq!(
        sent["system"][0]["cache_control"],
        json!({ "type": "ephemeral", "ttl": "1h" }),
        "{sent}"
    );
    // The provider's cache reads, in the OpenAI usage shape.
    assert_eq!(first.json["usage"]["prompt_tokens"], 100, "{first}");
    assert_eq!(
        first.json["usage"]["prompt_tokens_details"]["cached_tokens"], 80,
        "{first}"
    );

    // The client's own marker: the gateway steps aside.
    let own = json!({ "model": "cached", "messages": [
        { "role": "system", "content": "You answer in one word." },
        { "role": "user", "content": [
            { "type": "text", "text": "Say hello.", "cache_control": { "type": "ephemeral" } }
        ] },
    ] });
    let r = gw
        .client
        .chat_with(&own, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let sent = last_call(&gw).await;
    assert_eq!(markers(&sent), 1, "only the client's marker: {sent}");
    assert!(sent["messages"][0]["content"][0]["cache_control"].is_object());
    // Without promptCache (a direct model call): no marker.
    let plain = json!({ "model": "m1", "messages": messages });
    let r = gw
        .client
        .chat_with(&plain, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(markers(&last_call(&gw).await), 0);

    // Three calls, 80 cached tokens each, in the key's usage rows; each call costs
    // 20 x 10 + 80 x 1 + 10 x 10 per million.
    let keys: Value = gw.admin().get("/admin/keys").await.unwrap().json;
    let id = keys["keys"]
        .as_array()
        .and_then(|ks| ks.iter().find(|k| k["mounted"] == true))
        .and_then(|k| k["id"].as_str())
        .unwrap_or_else(|| panic!("no mounted key in {keys}"))
        .to_string();
    let total = poll(
        "the usage rows to count 3 calls",
        Duration::from_secs(15),
        || {
            let (admin, path) = (gw.admin(), format!("/admin/keys/{id}/usage"));
            async move {
                let usage: Value = admin.get(&path).await?.json;
                let total = usage["total"].clone();
                Ok((total["cachedTokens"].as_u64() == Some(240)).then_some(total))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(total["promptTokens"], 300, "{total}");
    let cost = total["cost"].as_f64().unwrap_or(0.0);
    assert!((cost - 3.0 * 380e-6).abs() < 1e-9, "cost {cost}: {total}");

    // The client's markers where the translation does not keep them (a system part, a tool):
    // still the client's choice, the gateway adds none (its own is the 1h one).
    let tool_marked = json!({ "model": "cached",
        "messages": [
            { "role": "system", "content": [
                { "type": "text", "text": "You answer in one word.", "cache_control": { "type": "ephemeral" } }
            ] },
            { "role": "user", "content": "Say hello." },
        ],
        "tools": [{ "type": "function", "cache_control": { "type": "ephemeral" },
            "function": { "name": "t", "parameters": { "type": "object", "properties": {} } } }] });
    let r = gw
        .client
        .chat_with(&tool_marked, Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let sent = last_call(&gw).await;
    assert!(
        !sent.to_string().contains("\"ttl\":\"1h\""),
        "the gateway added its marker next to the client's: {sent}"
    );
    // With tools, and a failover between two anthropic keys: every attempt's body carries one
    // marker on the last system block and one on the last tool, never a second one added on
    // the retried body.
    gw.mock1
        .script(json!([
            script::for_key(&gw.key_a, vec![script::down()]),
            script::always(vec![script::text("ok")]),
        ]))
        .await
        .unwrap();
    gw.mock1.clear_calls().await.unwrap();
    let tool = |name: &str| {
        json!({ "type": "function", "function": {
            "name": name, "parameters": { "type": "object", "properties": {} } } })
    };
    let with_tools = json!({ "model": "cached", "messages": messages,
        "tools": [tool("first"), tool("last")] });
    let mut attempts = Vec::new();
    for _ in 0..4 {
        let r = gw
            .client
            .chat_with(&with_tools, Some(&gw.virtual_key))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{r}");
        attempts = gw.mock1.calls().await.unwrap();
        if attempts
            .iter()
            .any(|c| c.key.as_deref() == Some(gw.key_a.as_str()))
        {
            break;
        }
    }
    assert!(
        attempts.len() >= 2,
        "no call failed over from key a: {} attempts",
        attempts.len()
    );
    for call in &attempts {
        let sent = &call.body;
        assert_eq!(
            markers(sent),
            2,
            "one on the system block, one on the tools: {sent}"
        );
        assert!(sent["system"][0]["cache_control"].is_object(), "{sent}");
        let tools = sent["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 2, "{sent}");
        assert!(tools[0].get("cache_control").is_none(), "{sent}");
        assert!(tools[1]["cache_control"].is_object(), "{sent}");
    }
    gw.check_no_secrets_in_logs().unwrap();
}
