//! What an operator does to a running gateway, through a real Envoy: `POST /admin/reset` (and
//! `ai-router reset`) brings a blacklisted key back at once, Envoy's own holds included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::{poll, script, Gateway};
use serde_json::{json, Value};

/// `ai-router <args> --url <admin API>` with the fixture's admin token.
async fn run_cli(gw: &Gateway, args: &[&str]) -> (bool, Value, String) {
    let url = format!("http://{}", gw.cp.http_addr());
    let args = [args, &["--url", &url]].concat();
    ai_router_e2e::run_cli(&args, &[("AI_ROUTER_ADMIN_TOKEN", &gw.admin_token)])
        .await
        .unwrap()
}

async fn post_reset(gw: &Gateway, body: Value) -> (u16, Value) {
    let resp = ai_router_e2e::http_client()
        .unwrap()
        .post(format!("http://{}/admin/reset", gw.cp.http_addr()))
        .bearer_auth(&gw.admin_token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_brings_a_refused_key_back_at_once() {
    let gw = Gateway::start("operator_reset").await.expect("fixture");
    // p2's only key is refused: it is blacklisted until its secret changes, by the control
    // plane and by Envoy's own hold.
    gw.mock2
        .script(json!([script::always(vec![script::status(
            401,
            json!({}),
            Some(json!({
                "error": { "message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, "code": "invalid_api_key" }
            }))
        )])]))
        .await
        .unwrap();
    let r = gw
        .client
        .chat("backup", Some(&gw.virtual_key))
        .await
        .unwrap();
    assert!(r.status >= 400, "the refused key fails the call: {r}");
    gw.mock2
        .script(json!([script::always(vec![script::text("from c")])]))
        .await
        .unwrap();
    gw.mock2.clear_calls().await.unwrap();
    let r = gw
        .client
        .chat("backup", Some(&gw.virtual_key))
        .await
        .unwrap();
    assert!(r.status >= 400, "the key stays out: {r}");
    assert!(
        gw.mock2.calls().await.unwrap().is_empty(),
        "no call reaches a blacklisted key"
    );

    // Refused: a key without its provider, an unknown provider or key.
    let (status, body) = post_reset(&gw, json!({ "key": "c" })).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let (status, body) = post_reset(&gw, json!({ "provider": "nope" })).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, body) = post_reset(&gw, json!({ "provider": "p2", "key": "zz" })).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );

    // The reset lifts it everywhere at once: well within the 5 s in which Envoy's own hold
    // would otherwise still speak for the control plane.
    let started = Instant::now();
    let (status, body) = post_reset(&gw, json!({ "provider": "p2", "key": "c" })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reset"]["blacklists"], 1, "{body}");
    let r = poll("the reset key to serve", Duration::from_secs(1), || {
        let c = gw.client.clone();
        let key = gw.virtual_key.clone();
        async move {
            let r = c.chat("backup", Some(&key)).await?;
            Ok((r.status == 200).then_some(r))
        }
    })
    .await
    .unwrap();
    assert_eq!(r.content(), Some("from c"), "{r}");
    assert!(started.elapsed() < Duration::from_secs(1));

    // The CLI: a reset of everything (nothing left to clear), and a refusal as an error object.
    let (ok, out, text) = run_cli(&gw, &["reset"]).await;
    assert!(ok, "{text}");
    assert_eq!(
        out["reset"],
        json!({ "blacklists": 0, "cooldowns": 0, "breakers": 0, "headroom": 0 }),
        "{text}"
    );
    let (ok, out, text) = run_cli(&gw, &["reset", "--provider", "nope"]).await;
    assert!(!ok, "{text}");
    assert_eq!(out["error"]["code"], "not_found", "{text}");
    gw.check_no_secrets_in_logs().unwrap();
}
