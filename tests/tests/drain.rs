//! `ai-router serve` drains on SIGTERM: it stops taking connections, ends the Watch streams
//! (Envoy keeps serving from the state it holds), finishes the work in flight, writes what it
//! acknowledged, and exits 0. Nothing a client or the usage accounting sees is lost.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::{poll, script, Gateway};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_serve_drains_and_exits_zero_while_envoy_keeps_serving() {
    let mut gw = Gateway::start_with("serve_drain", |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2).replace(
            "keyStore: { type: memory }",
            "keyStore: { type: sqlite, path: keys.sqlite }",
        )
    })
    .await
    .expect("fixture");
    // A stream of eight chunks, 150 ms apart: in flight across the drain.
    let chunks: Vec<String> = (0..8).map(|i| format!("w{i} ")).collect();
    gw.mock1
        .always(json!({ "text": chunks.concat(), "stream": { "chunks": chunks, "delayMs": 150 } }))
        .await
        .unwrap();
    let created = ai_router_e2e::http_client()
        .unwrap()
        .post(format!("http://{}/admin/keys", gw.cp.http_addr()))
        .bearer_auth(&gw.admin_token)
        .json(&json!({"label": "drain_app", "models": ["*"]}))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let id = created["key"]["id"].as_str().unwrap().to_string();
    let secret = created["secret"].as_str().unwrap().to_string();
    poll(
        "the new key to reach Envoy",
        Duration::from_secs(10),
        || {
            let (c, secret) = (gw.client.clone(), secret.clone());
            async move { Ok((c.chat("chat", Some(&secret)).await?.status == 200).then_some(())) }
        },
    )
    .await
    .unwrap();
    let mut served = 1u64;
    for _ in 0..5 {
        assert_eq!(
            gw.client.chat("chat", Some(&secret)).await.unwrap().status,
            200
        );
        served += 1;
    }

    // SIGTERM while a stream is under way.
    let stream = {
        let (c, secret) = (gw.client.clone(), secret.clone());
        tokio::spawn(async move { c.stream("chat", Some(&secret)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let admin = gw.cp.http_addr();
    let began = Instant::now();
    let status = gw.cp.terminate(Duration::from_secs(15)).await.unwrap();
    let took = began.elapsed();
    assert!(
        status.success(),
        "serve exited with {status}\n{}",
        gw.cp.tail()
    );
    let logs = gw.cp.logs();
    assert!(logs.contains("draining"), "{}", gw.cp.tail());
    assert!(
        logs.contains("\"drained\"") || logs.contains(" drained"),
        "{}",
        gw.cp.tail()
    );
    assert!(
        took < Duration::from_secs(6),
        "the drain is bounded: {took:?}"
    );
    // Its listeners are closed...
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "the admin port still takes connections"
    );
    // ...while the stream in flight ends whole and Envoy keeps serving from its last state.
    let r = stream.await.unwrap().unwrap();
    assert!(
        r.is_whole(),
        "{} {:?}: {}",
        r.status,
        r.transport_error,
        r.body
    );
    served += 1;
    gw.mock1.always(script::text("after")).await.unwrap();
    for _ in 0..3 {
        let r = gw.client.chat("chat", Some(&secret)).await.unwrap();
        assert_eq!(
            r.status, 200,
            "Envoy serves with the control plane gone: {r}"
        );
        served += 1;
    }

    // Back on the same gRPC port: every call is in the key's usage, once the reports that
    // waited in Envoy arrive; what the drained process acknowledged it had written.
    gw.cp.restart(&[]).await.unwrap();
    let usage = format!("/admin/keys/{id}/usage");
    let counted = poll(
        "every call in the usage",
        Duration::from_secs(30),
        || async {
            let n = gw.admin_get(&usage).await?["total"]["requests"]
                .as_u64()
                .unwrap_or(0);
            Ok((n >= served).then_some(n))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.tails()));
    assert_eq!(counted, served, "no call lost or counted twice");
    gw.check_no_secrets_in_logs().unwrap();
}
