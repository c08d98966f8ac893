//! Reload through a real Envoy: the control plane takes a new pool from its config file (a
//! change of the file, SIGHUP) under steady load, adding and removing a provider, with no failed
//! call; an invalid file is refused with a log line naming the field and the old pool keeps
//! serving.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ai_router_e2e::{poll, script, Gateway};
use serde_json::json;

fn pool(p1: Option<&str>, p2: Option<&str>) -> String {
    let mut yaml = "gateway:\n  host: 127.0.0.1\n  port: 0\n  adminToken: { env: AI_ROUTER_ADMIN_TOKEN }\n  keyStore: { type: memory }\ncontrolPlane:\n  host: 127.0.0.1\n  httpPort: 0\n  grpcPort: 0\nproviders:\n".to_string();
    if let Some(base) = p1 {
        yaml.push_str(&format!(
            "  - id: p1\n    kind: openai-compatible\n    baseUrl: {base}\n    keys: [{{ alias: a, env: P1_KEY_A }}]\n    models: [{{ id: m1, aliases: [chat] }}]\n"
        ));
    }
    if let Some(base) = p2 {
        yaml.push_str(&format!(
            "  - id: p2\n    kind: openai-compatible\n    baseUrl: {base}\n    keys: [{{ alias: c, env: P2_KEY_C }}]\n    models: [{{ id: m1, aliases: [chat] }}]\n"
        ));
    }
    yaml.push_str(
        "defaults:\n  deadlineMs: 30000\nresilience:\n  backoff: { baseMs: 10, factor: 2, maxMs: 50 }\n",
    );
    yaml
}

/// Replaces the config file at once (write aside, rename), as an operator's tooling should.
fn write_pool(gw: &Gateway, yaml: &str) {
    let aside = gw.dir.write("pool.yaml.new", yaml).unwrap();
    std::fs::rename(aside, gw.cp.config_path()).unwrap();
}

/// How many log lines of the control plane contain every one of `parts`.
fn log_lines(gw: &Gateway, parts: &[&str]) -> usize {
    gw.cp
        .logs()
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .count()
}

async fn wait_log(gw: &Gateway, parts: &[&str], count: usize) {
    poll(
        &format!("{count} control-plane log lines with {parts:?}"),
        Duration::from_secs(15),
        || async { Ok((log_lines(gw, parts) >= count).then_some(())) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.tails()));
}

async fn calls_by(mock: &ai_router_e2e::Mock) -> usize {
    mock.calls().await.map(|c| c.len()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_adds_and_removes_a_provider_without_a_failed_call() {
    let gw = Gateway::start_with("reload_under_load", |p1, _| pool(Some(p1), None))
        .await
        .expect("fixture");
    // p1 answers slowly, so calls are in flight on it when it leaves the pool.
    gw.mock1
        .always(json!({ "latencyMs": 150, "text": "from p1" }))
        .await
        .unwrap();
    gw.mock2.always(script::text("from p2")).await.unwrap();

    // Steady load: three unary callers and one streaming caller until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut load = Vec::new();
    for caller in 0..4 {
        let (client, key) = (gw.client.clone(), gw.virtual_key.clone());
        let (stop, done, failures) = (stop.clone(), done.clone(), failures.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let failed = if caller == 3 {
                    match client.stream("chat", Some(&key)).await {
                        Ok(r) if r.is_whole() => None,
                        Ok(r) => Some(format!("stream {}: {}", r.status, r.body)),
                        Err(e) => Some(format!("stream: {e:#}")),
                    }
                } else {
                    match client.chat("chat", Some(&key)).await {
                        Ok(r) if r.status == 200 => None,
                        Ok(r) => Some(format!("chat {r}")),
                        Err(e) => Some(format!("chat: {e:#}")),
                    }
                };
                done.fetch_add(1, Ordering::Relaxed);
                if let Some(f) = failed {
                    failures.lock().unwrap().push(f);
                }
            }
        }));
    }
    poll("calls served by p1", Duration::from_secs(10), || async {
        Ok((calls_by(&gw.mock1).await >= 5).then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(calls_by(&gw.mock2).await, 0, "p2 is not in the pool yet");

    // 1. Add p2 (a change of the file).
    write_pool(&gw, &pool(Some(gw.mock1.url()), Some(gw.mock2.url())));
    wait_log(&gw, &["config reloaded", "file changed", "p2"], 1).await;
    poll(
        "the new provider p2 serving",
        Duration::from_secs(10),
        || async { Ok((calls_by(&gw.mock2).await >= 5).then_some(())) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.tails()));

    // 2. Remove p1 while calls are in flight on it.
    write_pool(&gw, &pool(None, Some(gw.mock2.url())));
    wait_log(&gw, &["config reloaded", "providers_removed", "p1"], 1).await;
    // Whatever was on its way to p1 has arrived by now; from here on nothing reaches it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p1_after_removal = calls_by(&gw.mock1).await;
    let before = done.load(Ordering::Relaxed);
    poll("twenty more calls", Duration::from_secs(20), || async {
        Ok((done.load(Ordering::Relaxed) >= before + 20).then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(
        calls_by(&gw.mock1).await,
        p1_after_removal,
        "no call reaches a provider that left the pool"
    );

    // 3. An invalid file is refused, naming the field; the pool before keeps serving.
    let mut invalid = pool(Some(gw.mock1.url()), Some(gw.mock2.url()));
    invalid = invalid.replace(
        "    kind: openai-compatible\n",
        "    kind: openai-compatible\n    wieght: 2\n",
    );
    write_pool(&gw, &invalid);
    wait_log(&gw, &["config reload refused", "wieght"], 1).await;
    let catalog = gw.admin().get_json("/admin/catalog").await.unwrap();
    assert!(
        !catalog.to_string().contains("\"p1\""),
        "the refused file did not bring p1 back: {catalog}"
    );
    // The quota ledger follows the pool: p2 in, p1 out.
    let ledger = gw.admin().get_json("/admin/ledger").await.unwrap();
    let providers: Vec<&str> = ledger["providers"]
        .as_array()
        .map(|ps| ps.iter().filter_map(|p| p["provider"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(providers, ["p2"], "{ledger}");
    let before = done.load(Ordering::Relaxed);
    poll("ten more calls", Duration::from_secs(20), || async {
        Ok((done.load(Ordering::Relaxed) >= before + 10).then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(calls_by(&gw.mock1).await, p1_after_removal);

    // 4. SIGHUP reloads the (valid again) file on demand.
    write_pool(&gw, &pool(None, Some(gw.mock2.url())));
    wait_log(&gw, &["config reloaded", "file changed"], 3).await;
    let pid = gw.cp.pid().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    wait_log(&gw, &["config reloaded", "SIGHUP"], 1).await;

    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    let total = done.load(Ordering::Relaxed);
    assert!(total >= 60, "the load ran: {total} calls");
    assert!(
        failures.is_empty(),
        "{} of {total} calls failed across the reloads: {failures:#?}\n{}",
        failures.len(),
        gw.tails()
    );
    gw.check_no_secrets_in_logs().unwrap();
}
