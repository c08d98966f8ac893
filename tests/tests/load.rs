//! The gateway under many concurrent calls, through a real Envoy: more streams at once than
//! Envoy's default circuit breakers allow (1,024 connections, pending and active requests per
//! cluster) are all served, since the breakers are sized by `gateway.maxConcurrentRequests`, and
//! a gateway that is full answers the calls past its bound with an OpenAI error object.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ai_router_e2e::{openai_error_problem, script, Gateway};
use serde_json::json;

/// Past Envoy's default of 1,024 per cluster, as the 1,300 streams of the fault-injection run.
const STREAMS: usize = 1_300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_concurrent_streams_than_envoys_default_circuit_breakers_are_all_served() {
    let gw = Gateway::start("load_streams").await.expect("fixture");
    // Every stream lasts at least 4 s (2 s before each chunk after the first): they are all in
    // flight at once.
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": "one two three",
            "stream": { "chunks": ["one", " two", " three"], "delayMs": 2000 }
        })])]))
        .await
        .unwrap();

    // The most calls Envoy had in flight to the attempt stage, sampled while they run.
    let peak = Arc::new(AtomicU64::new(0));
    let running = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, running) = (peak.clone(), running.clone());
        let envoy = &gw.envoy;
        async move {
            while running.load(Ordering::Relaxed) {
                if let Ok(n) = envoy
                    .stat("cluster.ai_router_attempts.upstream_rq_active")
                    .await
                {
                    peak.fetch_max(n, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let started = Instant::now();
    let calls = async {
        let replies = futures::future::join_all((0..STREAMS).map(|_| gw.stream("chat"))).await;
        running.store(false, Ordering::Relaxed);
        replies
    };
    let (replies, ()) = tokio::join!(calls, sampler);
    let took = started.elapsed();

    let failed: Vec<String> = replies
        .iter()
        .filter_map(|r| match r {
            Ok(s)
                if s.status == 200
                    && s.contents() == ["one", " two", " three"]
                    && s.events.last().is_some_and(|e| e == "[DONE]")
                    && s.transport_error.is_none() =>
            {
                None
            }
            Ok(s) => Some(s.to_string()),
            Err(e) => Some(format!("{e:#}")),
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {STREAMS} concurrent streams failed, e.g.\n{}\n{}",
        failed.len(),
        failed.first().map(String::as_str).unwrap_or_default(),
        gw.tails()
    );
    let peak = peak.load(Ordering::Relaxed);
    assert!(
        peak > 1_024,
        "only {peak} calls were in flight at once: the test did not pass Envoy's defaults"
    );
    let overflows = gw.envoy.overflows().await.unwrap();
    assert!(
        overflows.is_empty(),
        "Envoy counted overflows: {overflows:?}"
    );
    assert_eq!(gw.mock1.calls().await.unwrap().len(), STREAMS);
    let timers = gw
        .envoy
        .stat("cluster.ai_router_timer.upstream_rq_total")
        .await
        .unwrap();
    eprintln!("{STREAMS} streams in {took:?}, at most {peak} in flight at once, {timers} timers");
    // No timer is left behind on the timer cluster (attempts are bounded on a tick, not by a
    // timer each, and none of these calls waited).
    ai_router_e2e::poll(
        "the attempts' timers to end",
        Duration::from_secs(10),
        || {
            let envoy = &gw.envoy;
            async move {
                let n = envoy
                    .stat("cluster.ai_router_timer.upstream_rq_active")
                    .await?;
                Ok((n == 0).then_some(()))
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_gateways_concurrency_bound_gets_an_openai_error() {
    // Two calls in flight and two waiting at most (the breakers of every cluster): the router's
    // own 503 for the calls past that is an OpenAI error object.
    let gw = Gateway::start_with("load_full", |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2).replace(
            "  keyStore: { type: memory }\n",
            "  keyStore: { type: memory }\n  maxConcurrentRequests: 2\n",
        )
    })
    .await
    .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![
            json!({ "latencyMs": 1500, "text": "slow" })
        ])]))
        .await
        .unwrap();
    let replies = futures::future::join_all((0..8).map(|_| gw.chat("chat"))).await;
    let replies: Vec<_> = replies.into_iter().map(Result::unwrap).collect();
    let (served, refused): (Vec<_>, Vec<_>) = replies.iter().partition(|r| r.status == 200);
    assert!(
        served.len() >= 2 && !refused.is_empty(),
        "two calls fit at once, eight do not: {replies:#?}"
    );
    assert!(served.iter().all(|r| r.content() == Some("slow")));
    for r in &refused {
        if let Some(p) = openai_error_problem(r, 503, "pool_unavailable") {
            panic!("a call past the bound: {p}");
        }
        assert_eq!(r.header("retry-after").as_deref(), Some("1"), "{r}");
        assert!(r.header("x-envoy-overloaded").is_none(), "{r}");
    }
    assert!(!gw.envoy.overflows().await.unwrap().is_empty());
}
