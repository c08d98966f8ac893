//! Envoy restarted under load: while clients drive calls (half of them streams) at concurrency
//! 8 (a caller whose connection failed tries again 50 ms later), Envoy is SIGKILLed and a new one started on the same port from the same config. Clients
//! see connection errors only (a refused connection, a reset, a stream cut in transfer): never
//! an answer that is wrong, never an HTTP error from a gateway that is still starting. The
//! control plane sees the new Envoy's sync stream within a second of its listener being up.
//! The figures go to docs/reliability.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ai_router_e2e::{pool_yaml_header, script, Client, Pool, PoolSetup};
use serde_json::json;

const CONCURRENCY: usize = 8;
const ANSWER: &str = "steady answer";

#[derive(Debug, Clone)]
enum Outcome {
    Ok,
    /// The connection failed or the transfer broke off.
    Connection(String),
    /// Anything else: what was wrong.
    Wrong(String),
}

async fn one_call(client: &Client, key: &str, stream: bool) -> Outcome {
    if stream {
        return match client.stream("m1", Some(key)).await {
            Err(e) => Outcome::Connection(format!("{e:#}")),
            Ok(s) if s.status != 200 => {
                Outcome::Wrong(format!("stream status {}: {}", s.status, s.body))
            }
            Ok(s) => {
                let text = s.contents().concat();
                let done = s.events.iter().any(|e| e == "[DONE]");
                match (&s.transport_error, done) {
                    (None, true) if text == ANSWER => Outcome::Ok,
                    // Cut in transfer by the kill: what came so far is the answer's start.
                    (Some(e), false) if ANSWER.starts_with(&text) => {
                        Outcome::Connection(format!("stream cut: {e}"))
                    }
                    _ => Outcome::Wrong(format!("a stream that is not the answer: {s}")),
                }
            }
        };
    }
    match client.chat("m1", Some(key)).await {
        Err(e) => Outcome::Connection(format!("{e:#}")),
        Ok(r) if r.status == 200 && r.content() == Some(ANSWER) => Outcome::Ok,
        Ok(r) => Outcome::Wrong(format!("{r}")),
    }
}

/// `ai_router_sync_connections{node="envoy"}` (0 when the series is absent).
async fn sync_connections(metrics: &str) -> Option<u64> {
    let text = ai_router_e2e::get_text(metrics).await.ok()?;
    Some(
        text.lines()
            .find_map(|l| l.strip_prefix("ai_router_sync_connections{node=\"envoy\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_restarted_under_load_shows_clients_connection_errors_only() {
    let mut pool = Pool::start("chaos_envoy", 1, |m, _| {
        let mut setup = PoolSetup::default();
        setup.secret_env("P1_KEY", "p1-a");
        setup.yaml = format!(
            "{}providers:\n  - id: p1\n    kind: openai-compatible\n    baseUrl: {}/v1\n    keys: [{{ alias: a, env: P1_KEY }}]\n    models: [{{ id: m1 }}]\n\
             defaults: {{ maxAttempts: 2, deadlineMs: 10000 }}\n",
            pool_yaml_header(),
            m[0]
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    pool.mocks[0]
        .script(json!([script::always(vec![json!({
            "text": ANSWER,
            "stream": { "chunks": ["steady ", "answer"], "delayMs": 20 }
        })])]))
        .await
        .unwrap();

    // The control plane's view of its Envoys, sampled every 20 ms.
    let metrics = format!("http://{}/metrics", pool.cp.http_addr());
    let samples: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (samples, stop, metrics) = (samples.clone(), stop.clone(), metrics.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(n) = sync_connections(&metrics).await {
                    samples.lock().unwrap().push((Instant::now(), n));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    assert_eq!(
        sync_connections(&metrics).await,
        Some(1),
        "one Envoy watches"
    );

    // The callers: each its own client (as separate apps are), round after round until told.
    let results: Arc<Mutex<Vec<(Instant, Duration, Outcome)>>> = Arc::default();
    let began = Instant::now();
    let mut callers = Vec::new();
    for i in 0..CONCURRENCY {
        let (results, stop, key) = (results.clone(), stop.clone(), pool.virtual_key.clone());
        let client = Client::new(&pool.envoy.base_url()).unwrap();
        callers.push(tokio::spawn(async move {
            let mut n = i;
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let outcome = one_call(&client, &key, n % 2 == 0).await;
                let refused = matches!(outcome, Outcome::Connection(_));
                results.lock().unwrap().push((t, t.elapsed(), outcome));
                if refused {
                    // As a client's retry would: not a busy loop on a closed port.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                n += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // SIGKILL and a new Envoy on the same port.
    let killed_at = Instant::now();
    let env = vec![("AI_ROUTER_SYNC_TOKEN".to_string(), pool.sync_token.clone())];
    let (dir, config, grpc) = (
        pool.dir.clone(),
        pool.cp.config_path().to_path_buf(),
        pool.cp.grpc_addr(),
    );
    let restarted = pool
        .envoy
        .restart_on_same_port(&dir, &config, &[grpc], &env, &pool.virtual_key)
        .await
        .unwrap();
    let listening_at = pool.envoy.listening_at();
    eprintln!(
        "envoy restart: {} failed start(s) before the new one ({})",
        restarted.failed_starts, restarted.last_error
    );
    let ready_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::SeqCst);
    for c in callers {
        c.await.unwrap();
    }
    sampler.await.unwrap();

    let results = results.lock().unwrap().clone();
    let samples = samples.lock().unwrap().clone();
    let lost = samples
        .iter()
        .find(|(t, n)| *t >= killed_at && *n == 0)
        .map(|(t, _)| *t);
    let seen_again = lost.and_then(|lost| {
        samples
            .iter()
            .find(|(t, n)| *t > lost && *n >= 1)
            .map(|(t, _)| *t)
    });
    let ok = |from: Instant, to: Instant| {
        results
            .iter()
            .filter(|(t, _, o)| *t >= from && *t < to && matches!(o, Outcome::Ok))
            .count()
    };
    let connection: Vec<&String> = results
        .iter()
        .filter_map(|(_, _, o)| match o {
            Outcome::Connection(e) => Some(e),
            _ => None,
        })
        .collect();
    let wrong: Vec<&String> = results
        .iter()
        .filter_map(|(_, _, o)| match o {
            Outcome::Wrong(e) => Some(e),
            _ => None,
        })
        .collect();
    // Calls that reached the new Envoy before its state and were held until it came.
    let held = results
        .iter()
        .filter(|(t, d, o)| {
            *t + *d > listening_at && *t < ready_at && matches!(o, Outcome::Ok) && *t > killed_at
        })
        .count();
    let first_ok_after = results
        .iter()
        .filter(|(t, d, o)| *t + *d > killed_at && matches!(o, Outcome::Ok) && *t >= killed_at)
        .map(|(t, d, _)| *t + *d)
        .min();
    let mut latencies: Vec<Duration> = results
        .iter()
        .filter(|(_, _, o)| matches!(o, Outcome::Ok))
        .map(|(_, d, _)| *d)
        .collect();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    let since = |a: Instant, b: Option<Instant>| b.map(|b| b.saturating_duration_since(a));
    eprintln!(
        "envoy restart: {} calls at c{CONCURRENCY} (half streams): {} ok, {} connection errors, {} wrong; \
         kill -> old process reaped {:?}, -> new listener {:?}, -> ready {:?}, -> first answer {:?}; \
         the control plane saw the old stream end {:?} after the kill and the new one {:?} after the new listener; \
         {held} answered calls began before the new Envoy served; ok p50 {:?} p99 {:?}",
        results.len(),
        latencies.len(),
        connection.len(),
        wrong.len(),
        restarted.reaped_at.saturating_duration_since(killed_at),
        listening_at.saturating_duration_since(killed_at),
        ready_at.saturating_duration_since(killed_at),
        since(killed_at, first_ok_after),
        since(killed_at, lost),
        seen_again.map(|s| s.saturating_duration_since(listening_at)),
        pct(0.5),
        pct(0.99),
    );
    assert!(
        wrong.is_empty(),
        "{} wrong answers, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
    assert!(ok(began, killed_at) > 0, "calls before the kill");
    assert!(ok(ready_at, Instant::now()) > 0, "calls after the restart");
    let lost = lost.expect("the control plane saw the old Envoy go");
    let seen_again = seen_again.expect("the control plane saw the new Envoy");
    assert!(
        seen_again.saturating_duration_since(listening_at) < Duration::from_secs(1),
        "the new Envoy's sync stream came {:?} after its listener",
        seen_again.saturating_duration_since(listening_at)
    );
    assert!(lost < seen_again);
}
