//! `telemetry.includeContent` through a real Envoy: with it on, a subscriber to `/admin/events`
//! (and to the gRPC `Events` stream) sees the request and the provider's answer in each attempt event (unary and streamed,
//! bounded, the key's secret never), and so does the event log line; with it off (the
//! default) no event carries content and no prompt is on the operator side (the whole-run scan
//! checks the control plane's and Envoy's logs and the event stream for it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{pool_yaml_header, scan, script, Pool, PoolSetup};
use ai_router_proto::v1 as pb;
use ai_router_proto::v1::admin_client::AdminClient;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tonic::transport::Channel;

const PROMPT: &str = "Describe the lighthouse at Quillwick Point.";
const ANSWER: &str = "It is a tall striped tower of Quillwick granite.";

async fn pool(test: &str, telemetry: &str, admin_token: &str) -> Pool {
    let token = admin_token.to_owned();
    let telemetry = telemetry.to_owned();
    Pool::start(test, 1, move |m, _dir| {
        let mut setup = PoolSetup::default();
        setup.secret_env("P1_KEY", "p1-a");
        setup.env.push(("AI_ROUTER_ADMIN_TOKEN".into(), token));
        // Every attempt event on the log too.
        setup
            .env
            .push(("RUST_LOG".into(), "info,ai_router::events=debug".into()));
        setup.yaml = format!(
            "{}{telemetry}providers:\n  - id: p1\n    kind: openai-compatible\n    baseUrl: {}/v1\n    keys: [{{ alias: a, env: P1_KEY }}]\n    models: [{{ id: m1 }}]\n\
             defaults: {{ maxAttempts: 1, deadlineMs: 10000 }}\n",
            pool_yaml_header().replace(
                "keyStore: { type: memory }",
                "keyStore: { type: memory }, adminToken: { env: AI_ROUTER_ADMIN_TOKEN }"
            ),
            m[0]
        );
        Ok(setup)
    })
    .await
    .expect("fixture")
}

fn chat(prompt: &str, stream: bool) -> Value {
    let mut body = json!({ "model": "m1", "messages": [{ "role": "user", "content": prompt }] });
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// The next attempt event (panics after 10 s).
async fn next_attempt(rx: &mut UnboundedReceiver<(String, Value)>) -> Value {
    loop {
        let (kind, event) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an attempt event within 10 s")
            .expect("the event stream ended");
        if kind == "attempt" {
            return event;
        }
    }
}

/// A unary call with `prompt` answered by [`ANSWER`]; its reply and its attempt event.
async fn answered(
    pool: &Pool,
    rx: &mut UnboundedReceiver<(String, Value)>,
    prompt: &str,
) -> (ai_router_e2e::Reply, Value) {
    pool.mocks[0]
        .script(json!([script::always(vec![script::text(ANSWER)])]))
        .await
        .unwrap();
    let r = pool
        .client
        .chat_with(&chat(prompt, false), Some(&pool.virtual_key))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let event = next_attempt(rx).await;
    (r, event)
}

/// Waits (10 s at most) until the control plane's log holds `needle`.
async fn on_the_log(pool: &Pool, needle: &str, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !pool.cp.logs().contains(needle) {
        assert!(std::time::Instant::now() < deadline, "no {what} on the log");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_include_content_an_attempt_event_carries_the_request_and_the_answer() {
    scan::allow_content();
    let admin = format!("admin-{}", ai_router_e2e::random_hex(32));
    let pool = pool(
        "content_on",
        "telemetry: { includeContent: true }\n",
        &admin,
    )
    .await;
    let mut rx = pool.cp.events(&admin, "?types=attempt").await.unwrap();
    // The same events over gRPC (airouter.v1.Admin/Events).
    let mut grpc = AdminClient::<Channel>::connect(format!("http://{}", pool.cp.grpc_addr()))
        .await
        .unwrap();
    let mut request = tonic::Request::new(pb::EventsRequest {
        types: vec!["attempt".into()],
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {admin}").parse().unwrap());
    let mut grpc_events = grpc.events(request).await.unwrap().into_inner();

    // Unary: the caller's body and the provider's JSON answer.
    let (_, e) = answered(&pool, &mut rx, PROMPT).await;
    let over_grpc = tokio::time::timeout(Duration::from_secs(10), grpc_events.message())
        .await
        .expect("a gRPC event within 10 s")
        .unwrap()
        .expect("the gRPC stream ended");
    scan::observe_operator("the gRPC event stream", over_grpc.json.as_bytes());
    let g: Value = serde_json::from_str(&over_grpc.json).unwrap();
    assert_eq!(
        g["content"], e["content"],
        "the gRPC stream carries the same content"
    );
    let content = &e["content"];
    assert!(
        content["request"]
            .as_str()
            .is_some_and(|s| s.contains(PROMPT)),
        "{e}"
    );
    assert!(
        content["response"]
            .as_str()
            .is_some_and(|s| s.contains(ANSWER)),
        "{e}"
    );
    assert_eq!(content["requestTruncated"], false, "{e}");
    assert_eq!(content["responseTruncated"], false, "{e}");
    assert_eq!(
        (e["provider"].as_str(), e["key"].as_str()),
        (Some("p1"), Some("a"))
    );
    let secret = pool.env_value("P1_KEY");
    assert!(!e.to_string().contains(&secret), "no secret in content");

    // A stream: its events as the provider sent them.
    pool.mocks[0]
        .script(json!([script::always(vec![script::stream(&[
            "It is a tall ",
            "striped tower."
        ])])]))
        .await
        .unwrap();
    let s = pool
        .client
        .stream_with(&chat(PROMPT, true), Some(&pool.virtual_key))
        .await
        .unwrap();
    assert_eq!(s.status, 200);
    let e = next_attempt(&mut rx).await;
    let response = e["content"]["response"].as_str().unwrap_or_default();
    assert!(response.contains("data:"), "{e}");
    assert!(response.contains("striped tower."), "{e}");
    assert!(e["content"]["request"]
        .as_str()
        .is_some_and(|s| s.contains("\"stream\":true")));

    // A large prompt is cut to the bound on a character boundary, and says so.
    let large = format!("{PROMPT} {}", "é".repeat(20 * 1024));
    let (_, e) = answered(&pool, &mut rx, &large).await;
    let request = e["content"]["request"].as_str().unwrap_or_default();
    assert_eq!(e["content"]["requestTruncated"], true);
    assert!(
        request.len() <= 16 * 1024 && request.len() > 16 * 1024 - 4,
        "{}",
        request.len()
    );
    assert!(request.contains(PROMPT));
    assert_eq!(e["content"]["responseTruncated"], false);

    // The event's JSON line on the control plane's log carries it too.
    on_the_log(&pool, ANSWER, "attempt line with content").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_include_content_no_event_carries_the_request_or_the_answer() {
    // The scan fails the test if the prompt shows on the operator side.
    scan::register_prompt(PROMPT);
    let admin = format!("admin-{}", ai_router_e2e::random_hex(32));
    let pool = pool("content_off", "", &admin).await;
    let mut rx = pool.cp.events(&admin, "?types=attempt").await.unwrap();
    let (r, e) = answered(&pool, &mut rx, PROMPT).await;
    assert!(r.text.contains(ANSWER), "the client got its answer: {r}");
    assert!(e.get("content").is_none(), "{e}");
    let text = e.to_string();
    assert!(!text.contains(PROMPT) && !text.contains(ANSWER), "{e}");
    // The same call's event lines are on the log (debug), without content.
    let rid = r
        .headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(!rid.is_empty());
    on_the_log(&pool, &rid, "event line of the call").await;
    assert!(!pool.cp.logs().contains(ANSWER));
}

/// A report made while `telemetry.includeContent` was on, still queued in the filter's outbox
/// when the pool is reloaded with it off, reaches the control plane without its content: the
/// control plane goes away, a call is made (its attempt report, content included, waits in
/// Envoy), the control plane comes back on the pool without `includeContent`, and the event of
/// that attempt (on its log) carries neither the prompt nor the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_queued_before_include_content_is_turned_off_loses_its_content() {
    const QUEUED_PROMPT: &str = "Describe the ferry that crosses to Quillwick Point.";
    // The scan fails the test if the prompt shows on the operator side (the logs, the events).
    scan::register_prompt(QUEUED_PROMPT);
    let admin = format!("admin-{}", ai_router_e2e::random_hex(32));
    let on = "telemetry: { includeContent: true }\n";
    let mut pool = pool("content_turned_off", on, &admin).await;
    pool.mocks[0]
        .script(json!([script::always(vec![script::text(ANSWER)])]))
        .await
        .unwrap();

    pool.cp.stop();
    let r = pool.chat_with(&chat(QUEUED_PROMPT, false)).await.unwrap();
    assert_eq!(r.status, 200, "Envoy serves from its last state: {r}");
    assert!(r.text.contains(ANSWER), "{r}");
    let rid = r.header("x-request-id").unwrap_or_default();
    assert!(!rid.is_empty());

    let path = pool.cp.config_path().to_path_buf();
    let yaml = std::fs::read_to_string(&path).unwrap();
    assert!(yaml.contains(on), "{yaml}");
    std::fs::write(&path, yaml.replace(on, "")).unwrap();
    pool.cp.restart(&[]).await.unwrap();

    // The queued report arrives: its attempt's event line names the call.
    let attempt_line = |logs: &str| {
        logs.lines()
            .find(|l| l.contains(&rid) && l.contains(r#"\"type\":\"attempt\""#))
            .map(str::to_owned)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let line = loop {
        if let Some(line) = attempt_line(&pool.cp.logs()) {
            break line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the queued attempt report never reached the restarted control plane"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!line.contains("content"), "{line}");
    let logs = pool.cp.logs();
    assert!(
        !logs.contains(QUEUED_PROMPT) && !logs.contains(ANSWER),
        "the queued report's content reached the control plane's log"
    );
}
