//! The control plane SIGKILLed and started again under load, with the SQLite key store: Envoy
//! serves every call from the state it holds meanwhile, and afterwards the usage rows account
//! for every call that succeeded. A report batch leaves the filter's outbox only once the
//! control plane acknowledged it, and the control plane acknowledges it only once its usage
//! rows are committed, so what was in flight at the kill is sent again to the new process.
//! With the control plane away, a key's `requestsPerMinute` is counted by the Envoy alone, up to
//! the limit. (The Postgres and Redis outages are in `distributed.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ai_router_e2e::{poll, script, sqlite_pool, Gateway};
use serde_json::{json, Value};

const TASKS: usize = 4;

async fn successes(gw: &Gateway, id: &str) -> u64 {
    let usage: Value = gw
        .admin()
        .get_json(&format!("/admin/keys/{id}/usage"))
        .await
        .unwrap();
    usage["total"]["successes"].as_u64().unwrap_or(0)
}

/// The gateway with the SQLite key store, provider p1 answering every call.
async fn gateway(test: &str) -> Gateway {
    let gw = Gateway::start_with(test, sqlite_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::text("hi")])]))
        .await
        .unwrap();
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_killed_under_load_loses_no_call_and_no_usage() {
    let mut gw = gateway("outage_sigkill").await;
    let (id, secret) = gw
        .admin()
        .create_key(&json!({"label": "kill_app", "models": ["*"]}))
        .await
        .unwrap();
    gw.envoy.wait_ready(&secret).await.unwrap();
    let first = gw.client.chat("chat", Some(&secret)).await.unwrap();
    assert_eq!(first.status, 200, "{first}");
    let before = poll("the first call's usage", Duration::from_secs(10), || {
        let (gw, id) = (&gw, id.clone());
        async move {
            let n = successes(gw, &id).await;
            Ok((n >= 1).then_some(n))
        }
    })
    .await
    .unwrap();

    // Load, the kill a moment in, the restart a moment later.
    let stop = Arc::new(AtomicBool::new(false));
    let down = Arc::new(AtomicBool::new(false));
    let during = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, secret) = (gw.client.clone(), secret.clone());
            let (stop, down, during) = (stop.clone(), down.clone(), during.clone());
            tokio::spawn(async move {
                let mut ok = 0u64;
                let mut failed = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let was_down = down.load(Ordering::SeqCst);
                    match client.chat("chat", Some(&secret)).await {
                        Ok(r) if r.status == 200 => {
                            ok += 1;
                            if was_down {
                                during.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        Ok(r) => failed.push(r.to_string()),
                        Err(e) => failed.push(format!("{e:#}")),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    down.store(true, Ordering::SeqCst);
    gw.cp.stop();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    gw.cp.restart(&[]).await.unwrap();
    down.store(false, Ordering::SeqCst);
    let restarted = Instant::now();
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::SeqCst);
    let mut served = 0;
    let mut failures = Vec::new();
    for task in tasks {
        let (ok, failed) = task.await.unwrap();
        served += ok;
        failures.extend(failed);
    }
    assert!(failures.is_empty(), "calls failed: {failures:?}");
    let during = during.load(Ordering::SeqCst);
    assert!(
        during > 0,
        "no call was made while the control plane was down"
    );

    // Every success is in the key store once the outbox drained into the new process.
    let counted = poll("the usage of every call", Duration::from_secs(20), || {
        let (gw, id) = (&gw, id.clone());
        async move {
            let n = successes(gw, &id).await - before;
            Ok((n >= served).then_some(n))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.cp.tail()));
    let reconciled = restarted.elapsed();
    // Settle: a batch written twice would show now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let settled = successes(&gw, &id).await - before;
    eprintln!(
        "SIGKILL under load: {served} calls succeeded, 0 failed, {during} while the control plane was down; usage counted {settled} successes, complete {reconciled:?} after the restart"
    );
    assert_eq!(counted, served);
    assert_eq!(settled, served, "usage counted calls twice");
    let logs = format!("{}{}", gw.cp.logs(), gw.envoy.logs());
    assert!(!logs.contains(&secret), "a virtual key is in a log");
    assert!(!logs.contains(&gw.key_a), "a provider key is in a log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_control_plane_away_an_envoy_counts_requests_per_minute_alone() {
    const LIMIT: u64 = 8;
    let mut gw = gateway("outage_rpm_alone").await;
    let (_, secret) = gw
        .admin().create_key(
            &json!({"label": "alone_app", "models": ["*"], "quota": { "requestsPerMinute": LIMIT }}),
        )
        .await
        .unwrap();
    gw.envoy.wait_ready(&secret).await.unwrap();
    // Early in a minute, so that every call below counts in one.
    let second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 60;
    if second > 45 {
        tokio::time::sleep(Duration::from_secs(60 - second)).await;
    }
    gw.cp.stop();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let r = gw.client.chat("chat", Some(&secret)).await.unwrap();
        if r.status == 429 {
            assert_eq!(r.error_code(), Some("requests_per_minute_exceeded"), "{r}");
        }
        statuses.push(r.status);
    }
    // No call failed: the limit passed, then 429s, as one Envoy alone counts.
    let admitted = statuses.iter().filter(|s| **s == 200).count() as u64;
    assert_eq!(admitted, LIMIT, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    assert!(
        gw.envoy
            .logs()
            .contains("the control plane does not grant minute budgets"),
        "{}",
        gw.envoy.tail()
    );
}
