//! Chaos under load, through a real Envoy on the example conformance pool: calls (half of them
//! streams) at concurrency 16 while 30% of the attempts at the faulted lane fail before their
//! first token in the ways of the conformance catalogue, a healthy lane behind it, and the
//! control plane SIGKILLed and restarted in the middle. At least 99.9% succeed, no cut stream
//! passes for a success, every failure is an OpenAI error object, and no call fails while the
//! control plane is down (Envoy serves from its last state). `AI_ROUTER_CHAOS_CALLS` sets the
//! number of calls (default 1,000; docs/reliability.md has a 10,000-call run).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ai_router_e2e::{start_conformance_pool, StreamReply};
use futures::StreamExt;
use serde_json::{json, Value};

const CONCURRENCY: usize = 16;

/// 20 replies that go round: 14 successes and 6 faults before the first token (30%).
fn chaos_script() -> Value {
    let ok = json!({});
    let faults = [
        json!({"error": "network"}),
        json!({"status": 500}),
        json!({"status": 529}),
        json!({"error": "reset-after-headers"}),
        json!({"stream": {"chunks": ["faulted-lane"], "failAfter": 0, "failWith": "error-event"}, "status": 503}),
        json!({"stream": {"chunks": ["faulted-lane"], "failAfter": 0, "failWith": "malformed"}, "status": 502}),
    ];
    let mut replies = Vec::new();
    for fault in faults {
        replies.push(fault);
        replies.push(ok.clone());
        replies.push(ok.clone());
    }
    replies.extend([ok.clone(), ok]);
    json!([{"cycle": true, "replies": replies}])
}

#[derive(Debug)]
enum Outcome {
    Ok,
    /// A final error object (status, code).
    Error(u16, String),
    /// Anything else: what was wrong.
    Wrong(String),
}

fn judge_stream(s: &StreamReply) -> Outcome {
    if s.status != 200 {
        return Outcome::Wrong(format!("stream status {}: {}", s.status, s.body));
    }
    let done = s.events.iter().filter(|e| *e == "[DONE]").count();
    let errors = s
        .json_events()
        .iter()
        .filter(|e| e.get("error").is_some())
        .count();
    let text = s.contents().concat();
    if s.transport_error.is_some()
        || done != 1
        || errors > 0
        || text.is_empty()
        || text.contains("faulted-lane")
    {
        return Outcome::Wrong(format!("a stream that is not one clean answer: {s}"));
    }
    Outcome::Ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_under_load_with_a_control_plane_kill_keeps_every_call_right() {
    let calls: usize = std::env::var("AI_ROUTER_CHAOS_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let mut pool = start_conformance_pool("chaos").await.unwrap();
    pool.mocks[0].script(chaos_script()).await.unwrap();

    let done = Arc::new(AtomicUsize::new(0));
    let cp_down = Arc::new(AtomicBool::new(false));
    let client = pool.client.clone();
    let key = pool.virtual_key.clone();
    let started = Instant::now();
    let runner = {
        let (done, cp_down) = (done.clone(), cp_down.clone());
        async move {
            futures::stream::iter(0..calls)
                .map(|i| {
                    let (client, key, done, cp_down) =
                        (client.clone(), key.clone(), done.clone(), cp_down.clone());
                    async move {
                        let down_at_start = cp_down.load(Ordering::SeqCst);
                        let t = Instant::now();
                        let outcome = if i % 2 == 0 {
                            match client.stream("conformance-openai", Some(&key)).await {
                                Ok(s) => judge_stream(&s),
                                Err(e) => Outcome::Wrong(format!("{e:#}")),
                            }
                        } else {
                            match client.chat("conformance-openai", Some(&key)).await {
                                Ok(r) if r.status == 200 => match r.content() {
                                    Some(text)
                                        if !text.is_empty() && !text.contains("faulted-lane") =>
                                    {
                                        Outcome::Ok
                                    }
                                    _ => Outcome::Wrong(format!(
                                        "a 200 that is not a clean answer: {r}"
                                    )),
                                },
                                Ok(r) => match r.error_code() {
                                    Some(code) if r.json["error"]["message"].is_string() => {
                                        Outcome::Error(r.status, code.to_string())
                                    }
                                    _ => Outcome::Wrong(format!(
                                        "a failure that is not an error object: {r}"
                                    )),
                                },
                                Err(e) => Outcome::Wrong(format!("{e:#}")),
                            }
                        };
                        let down = down_at_start || cp_down.load(Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                        (outcome, t.elapsed(), down)
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .collect::<Vec<_>>()
                .await
        }
    };
    // SIGKILL the control plane a third of the way in, start it again at two thirds.
    let chaos = async {
        while done.load(Ordering::SeqCst) < calls / 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cp_down.store(true, Ordering::SeqCst);
        pool.cp.stop();
        while done.load(Ordering::SeqCst) < 2 * calls / 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let env = pool.control_plane_env().to_vec();
        pool.cp.restart(&env).await.unwrap();
        cp_down.store(false, Ordering::SeqCst);
    };
    let (results, ()) = tokio::join!(runner, chaos);
    let took = started.elapsed();

    let mut latencies: Vec<Duration> = results.iter().map(|(_, t, _)| *t).collect();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    let ok = results
        .iter()
        .filter(|(o, _, _)| matches!(o, Outcome::Ok))
        .count();
    let errors: Vec<String> = results
        .iter()
        .filter_map(|(o, _, _)| match o {
            Outcome::Error(status, code) => Some(format!("{status} {code}")),
            _ => None,
        })
        .collect();
    let wrong: Vec<&String> = results
        .iter()
        .filter_map(|(o, _, _)| match o {
            Outcome::Wrong(what) => Some(what),
            _ => None,
        })
        .collect();
    let while_down = results.iter().filter(|(_, _, down)| *down).count();
    let failed_while_down = results
        .iter()
        .filter(|(o, _, down)| *down && !matches!(o, Outcome::Ok))
        .count();
    let fault_calls = pool.mocks[0].calls().await.unwrap().len();
    let healthy_calls = pool.mocks[1].calls().await.unwrap().len();
    eprintln!(
        "chaos: {calls} calls (half streams) at c{CONCURRENCY} in {took:?}: {ok} ok, {} error objects, {} wrong; \
         p50 {:?}, p99 {:?}, max {:?}; {while_down} during the control plane's outage ({failed_while_down} failed); \
         attempts: {fault_calls} at the faulted lane (30% faulted), {healthy_calls} at the healthy one",
        errors.len(),
        wrong.len(),
        pct(0.5),
        pct(0.99),
        latencies.last().copied().unwrap_or_default(),
    );
    assert!(
        wrong.is_empty(),
        "{} call(s) handled wrongly, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
    assert!(
        ok * 1000 >= calls * 999,
        "{ok} of {calls} succeeded; errors: {errors:?}"
    );
    assert!(
        while_down > 0,
        "no call ran while the control plane was down"
    );
    assert_eq!(
        failed_while_down, 0,
        "calls failed while the control plane was down"
    );
    assert!(
        fault_calls * 10 >= calls * 9,
        "the faulted lane saw {fault_calls} attempts"
    );
    assert!(healthy_calls > 0);
    // Envoy took the new control plane's state again (the restarted one serves the pool).
    let health = ai_router_e2e::get_text(&format!("http://{}/health", pool.cp.http_addr()))
        .await
        .unwrap();
    assert!(health.contains("\"status\""), "{health}");
}
