//! `ai-router serve` drains on SIGTERM: it stops taking connections, ends the Watch streams
//! (Envoy keeps serving from the state it holds), finishes the work in flight, writes what it
//! acknowledged, and exits 0. Nothing a client or the usage accounting sees is lost.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::{poll, script, Gateway};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_serve_drains_and_exits_zero_while_envoy_keeps_serving() {
    let mut gw = sqlite_gateway("serve_drain").await;
    // A stream of eight chunks, 150 ms apart: in flight across the drain.
    let chunks: Vec<String> = (0..8).map(|i| format!("w{i} ")).collect();
    gw.mock1
        .always(json!({ "text": chunks.concat(), "stream": { "chunks": chunks, "delayMs": 150 } }))
        .await
        .unwrap();
    let (id, secret) = sqlite_gateway_key(&gw, "drain_app").await;
    let mut served = 1u64;
    for _ in 0..5 {
        assert_eq!(
            gw.client.chat("chat", Some(&secret)).await.unwrap().status,
            200
        );
        served += 1;
    }

    // SIGTERM while a stream is under way (the provider has it).
    let stream = {
        let (c, secret) = (gw.client.clone(), secret.clone());
        tokio::spawn(async move { c.stream("chat", Some(&secret)).await })
    };
    poll(
        "the stream to reach the provider",
        Duration::from_secs(10),
        || async {
            Ok(gw
                .mock1
                .calls()
                .await?
                .iter()
                .any(|c| c.stream)
                .then_some(()))
        },
    )
    .await
    .unwrap();
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
    assert_usage_counts(&gw, &usage, served, Duration::from_secs(30)).await;
    gw.check_no_secrets_in_logs().unwrap();
}

/// An Envoy stopped after `ai-router drain` loses no usage: the drain stops its listener, waits
/// for the calls in flight, then for the filter's outcome reports to be acknowledged by a
/// control plane (here one that was away while the calls were served), and only then says
/// Envoy may stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_stopped_after_a_drain_loses_no_outcome_report() {
    let mut gw = sqlite_gateway("envoy_drain").await;
    gw.mock1.always(script::text("counted")).await.unwrap();
    let (id, secret) = sqlite_gateway_key(&gw, "drained_app").await;
    let usage = format!("/admin/keys/{id}/usage");
    poll(
        "the first call counted",
        Duration::from_secs(10),
        || async {
            let n = gw.admin().get_json(&usage).await?["total"]["requests"]
                .as_u64()
                .unwrap_or(0);
            Ok((n == 1).then_some(()))
        },
    )
    .await
    .unwrap();

    // The control plane goes away; Envoy serves on and its outcomes wait in its VMs.
    gw.cp.stop();
    let mut served = 1u64;
    for _ in 0..6 {
        let r = gw.client.chat("chat", Some(&secret)).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        served += 1;
    }
    let pending = poll(
        "the outcomes counted as pending in Envoy",
        Duration::from_secs(5),
        || async {
            let n = gw
                .envoy
                .stat("wasmcustom.ai_router.reports_pending")
                .await?;
            Ok((n >= 6).then_some(n))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.envoy.tail()));

    // The drain, as an operator's pre-stop hook runs it: with no control plane to take the
    // outcomes, it never says Envoy may stop; its grace ends and it fails, naming them.
    let admin = gw.envoy.admin_addr().to_string();
    let drain = |grace: &'static str| {
        let admin = admin.clone();
        async move {
            ai_router_e2e::run_cli(&["drain", "--envoy-admin", &admin, "--grace-s", grace], &[])
                .await
                .unwrap()
        }
    };
    let (ok, answer, output) = drain("2").await;
    assert!(!ok, "{output}");
    assert_eq!(answer["drained"], false, "{answer}");
    assert_eq!(answer["inFlight"], 0, "{answer}");
    assert!(
        answer["reportsPending"].as_u64().unwrap_or(0) >= pending.min(6),
        "{answer}"
    );
    assert!(output.contains("unreported"), "{output}");
    let public = gw.envoy.listen_addr();
    assert!(
        tokio::net::TcpStream::connect(public).await.is_err(),
        "the drained listener takes no new connection"
    );

    // A control plane comes back: the outcomes reach it, then the drain says Envoy may stop.
    gw.cp.restart(&[]).await.unwrap();
    let (ok, answer, output) = drain("30").await;
    assert!(ok, "{output}");
    assert_eq!(answer["drained"], true, "{answer}");
    assert_eq!(answer["reportsPending"], 0, "{answer}");
    assert_eq!(answer["inFlight"], 0, "{answer}");

    // Envoy stops at once; nothing it served is missing from the key's usage.
    let pid = gw.envoy.process().pid().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    assert_usage_counts(&gw, &usage, served, Duration::from_secs(5)).await;
    gw.check_no_secrets_in_logs().unwrap();
}

/// A gateway whose control plane keeps keys and usage in SQLite (they outlive a restart).
async fn sqlite_gateway(name: &str) -> Gateway {
    Gateway::start_with(name, |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2).replace(
            "keyStore: { type: memory }",
            "keyStore: { type: sqlite, path: keys.sqlite }",
        )
    })
    .await
    .expect("fixture")
}

/// A virtual key created through the admin API, once Envoy accepts it (one call made with it):
/// its id and secret.
async fn sqlite_gateway_key(gw: &Gateway, label: &str) -> (String, String) {
    let created = gw
        .admin()
        .post("/admin/keys", &json!({"label": label, "models": ["*"]}))
        .await
        .unwrap()
        .json;
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
    (id, secret)
}

/// Waits (at most `wait`) until the key's usage at `usage` counts `served` calls, and checks it
/// never counts more.
async fn assert_usage_counts(gw: &Gateway, usage: &str, served: u64, wait: Duration) {
    let counted = poll("every call in the usage", wait, || async {
        let n = gw.admin().get_json(usage).await?["total"]["requests"]
            .as_u64()
            .unwrap_or(0);
        Ok((n >= served).then_some(n))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.tails()));
    assert_eq!(counted, served, "no call lost or counted twice");
}
