//! Calls and attempts counted by the client's protocol (`chat`, `responses`, `messages`,
//! `embeddings`): in `/admin/stats` and as the `protocol` label of the request metrics, which
//! `promtool check metrics` accepts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use ai_router_e2e::{poll, Gateway};
use serde_json::{json, Value};

fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/setup.sh installs Debian's prometheus package)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_attempts_are_counted_by_the_clients_protocol() {
    let gw = Gateway::start("protocol_reports").await.expect("fixture");
    let key = gw.virtual_key.clone();
    let post = |path: &'static str, body: Value| {
        let client = &gw.client;
        let key = key.clone();
        async move {
            client
                .request(
                    reqwest::Method::POST,
                    path,
                    Some(&key),
                    Some(body.to_string()),
                )
                .await
                .unwrap()
        }
    };
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let messages = json!({
        "model": "chat",
        "max_tokens": 32,
        "messages": [{ "role": "user", "content": "hi" }],
    });
    let r = post("/v1/messages", messages).await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json["type"], "message", "{r}");
    let r = post("/v1/responses", json!({ "model": "chat", "input": "hi" })).await;
    assert_eq!(r.status, 200, "{r}");
    // The pool's models do not embed: a refusal, counted under its protocol all the same.
    let r = post("/v1/embeddings", json!({ "model": "chat", "input": "hi" })).await;
    assert!(r.status >= 400, "{r}");

    let stats = poll(
        "the calls in /admin/stats",
        Duration::from_secs(10),
        || async {
            let stats: Value = gw.admin().get("/admin/stats").await?.json;
            let p = &stats["protocols"];
            let ready = ["chat", "messages", "responses"]
                .iter()
                .all(|name| p[name]["requests"]["success"] == 1 && p[name]["attempts"] == 1)
                && p["embeddings"]["requests"]
                    .as_object()
                    .is_some_and(|outcomes| outcomes.values().any(|n| n == 1));
            Ok(ready.then_some(stats))
        },
    )
    .await
    .unwrap();
    // The operation split stays as it was: three chat calls.
    assert_eq!(stats["requests"]["chat"]["success"], 3, "{stats}");

    let line = gw
        .cp
        .metric_line(&[
            "ai_router_requests_total{",
            "protocol=\"messages\"",
            "outcome=\"success\"",
        ])
        .await
        .unwrap();
    assert!(line.ends_with(" 1"), "{line}");
    let text = reqwest::get(format!("http://{}/metrics", gw.cp.http_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for protocol in ["chat", "responses", "embeddings"] {
        assert!(
            text.contains(&format!("protocol=\"{protocol}\"")),
            "no {protocol} series in\n{text}"
        );
    }
    assert!(text.contains(
        "ai_router_request_duration_seconds_bucket{operation=\"chat\",protocol=\"messages\""
    ));
    promtool_check(&text);
    gw.check_no_secrets_in_logs().unwrap();
}
