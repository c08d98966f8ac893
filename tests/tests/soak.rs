//! Soak: many calls through a real Envoy (unary, streams, and streams the client abandons
//! mid-answer, with one key's 500 failed over to the other now and then) while Envoy's and the control
//! plane's resident memory are sampled from `/proc`, with the filter's bookkeeping gauges
//! (`ai_router.calls_in_progress`, `attempts_in_progress`, `lane_attempts_in_flight`,
//! `vm_memory_bytes`, docs/operations.md).
//!
//! What it asserts: every call right (an answer, a clean stream, or a stream abandoned after
//! its first bytes); memory flat after warm-up (the samples after the first fifth of the calls
//! cut in quarters: the last quarter's largest RSS at most [`RSS_SLACK`] above the first
//! quarter's, for Envoy and for the control plane, and the VMs' linear memory no larger at the
//! end than at the end of the first quarter plus [`VM_SLACK`]); the bookkeeping never more than
//! the calls in progress can hold while it runs, and back to 0 once the calls ended, the
//! abandoned ones included.
//!
//! `AI_ROUTER_SOAK_CALLS` sets the number of calls (default 4,000, the suite's run); the full
//! soak is `AI_ROUTER_SOAK_CALLS=100000 cargo nextest run -p ai-router-e2e --test soak
//! --no-capture` (docs/reliability.md). Each run writes its figures and samples to
//! `target/soak/` (`soak-<calls>.json`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ai_router_e2e::{pool_yaml_header, rss_bytes, Envoy, Pool, PoolSetup};
use futures::StreamExt;
use serde_json::{json, Value};

const CONCURRENCY: usize = 16;
/// How far the last quarter's RSS may rise above the first quarter's (allocator noise, the
/// stats Envoy keeps per connection and the control plane's day of usage rows).
const RSS_SLACK: u64 = 8 * 1024 * 1024;
/// How far the wasm VMs' linear memory may grow after the first quarter: a few pages.
const VM_SLACK: u64 = 1024 * 1024;
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The bookkeeping gauges, read in one `/stats` request.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct Gauges {
    calls: u64,
    attempts: u64,
    lane_in_flight: u64,
    vm_memory: u64,
}

async fn gauges(envoy: &Envoy) -> anyhow::Result<Gauges> {
    let url = format!("http://{}/stats?filter=ai_router\\.", envoy.admin_addr());
    let text = ai_router_e2e::get_text(&url).await?;
    let value = |name: &str| -> anyhow::Result<u64> {
        text.lines()
            .find_map(|l| {
                let (stat, v) = l.split_once(": ")?;
                stat.ends_with(name).then(|| v.trim().parse().ok())?
            })
            .ok_or_else(|| anyhow::anyhow!("no gauge {name} in {text:?}"))
    };
    Ok(Gauges {
        calls: value("ai_router.calls_in_progress")?,
        attempts: value("ai_router.attempts_in_progress")?,
        lane_in_flight: value("ai_router.lane_attempts_in_flight")?,
        vm_memory: value("ai_router.vm_memory_bytes")?,
    })
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Sample {
    at_ms: u64,
    calls_done: usize,
    envoy_rss: u64,
    control_plane_rss: u64,
    gauges: Gauges,
}

#[derive(Debug)]
enum Kind {
    Unary,
    Stream,
    Abandoned,
}

fn kind_of(i: usize) -> Kind {
    match i % 8 {
        0..=3 => Kind::Unary,
        4..=6 => Kind::Stream,
        _ => Kind::Abandoned,
    }
}

async fn pool() -> Pool {
    Pool::start("soak", 1, |m, _dir| {
        let mut setup = PoolSetup::default();
        setup.secret_env("P1_KEY_1", "p1-a");
        setup.secret_env("P1_KEY_2", "p1-b");
        setup.yaml = format!(
            "{}providers:\n  - id: p1\n    kind: openai-compatible\n    baseUrl: {}/v1\n    \
             keys: [{{ alias: a, env: P1_KEY_1 }}, {{ alias: b, env: P1_KEY_2 }}]\n    \
             models: [{{ id: m1 }}, {{ id: slow }}]\n\
             defaults: {{ maxAttempts: 2, deadlineMs: 20000 }}\n",
            pool_yaml_header(),
            m[0]
        );
        Ok(setup)
    })
    .await
    .expect("fixture")
}

/// `m1`: answers, key `a` one in 25 times with a 500 (failed over to key `b`, which always
/// answers); `slow`: a stream of ten chunks 30 ms apart, which the client abandons after its
/// first bytes.
fn soak_script(key_a: &str) -> Value {
    let mut faulty = vec![json!({}); 24];
    faulty.push(json!({"status": 500}));
    let chunks: Vec<String> = (0..10).map(|i| format!("piece {i} ")).collect();
    json!([
        {"match": {"model": "slow"}, "replies": [{"stream": {"chunks": chunks, "delayMs": 30}}]},
        {"match": {"model": "m1", "key": key_a}, "cycle": true, "replies": faulty},
        {"match": {"model": "m1"}, "replies": [{}]},
    ])
}

fn chat(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "How long is a soak?"}],
        "stream": stream,
    })
}

/// One call, judged: `None` when right, else what was wrong.
async fn one_call(client: &ai_router_e2e::Client, key: &str, i: usize) -> Option<String> {
    match kind_of(i) {
        Kind::Unary => match client.chat_with(&chat("m1", false), Some(key)).await {
            Ok(r) if r.status == 200 && r.content().is_some_and(|t| !t.is_empty()) => None,
            Ok(r) => Some(format!("unary: {r}")),
            Err(e) => Some(format!("unary: {e:#}")),
        },
        Kind::Stream => match client.stream_with(&chat("m1", true), Some(key)).await {
            Ok(s) if s.status == 200 && s.is_whole() && !s.text().is_empty() => None,
            Ok(s) => Some(format!("stream: {s}")),
            Err(e) => Some(format!("stream: {e:#}")),
        },
        Kind::Abandoned => match client
            .stream_abandoned(&chat("slow", true), Some(key), 1)
            .await
        {
            Ok((200, bytes)) if String::from_utf8_lossy(&bytes).contains("data:") => None,
            Ok((status, bytes)) => Some(format!(
                "abandoned stream: {status} {}",
                String::from_utf8_lossy(&bytes)
            )),
            Err(e) => Some(format!("abandoned stream: {e:#}")),
        },
    }
}

fn max_of(samples: &[Sample], f: impl Fn(&Sample) -> u64) -> u64 {
    samples.iter().map(f).max().unwrap_or(0)
}

const MIB: f64 = 1024.0 * 1024.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_keeps_memory_flat_and_frees_every_calls_bookkeeping() {
    let calls: usize = std::env::var("AI_ROUTER_SOAK_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000);
    let pool = pool().await;
    pool.mocks[0]
        .script(soak_script(&pool.env_value("P1_KEY_1")))
        .await
        .unwrap();
    let envoy_pid = pool.envoy.process().pid().expect("Envoy's pid");
    let cp_pid = pool.cp.pid().expect("the control plane's pid");
    let before = gauges(&pool.envoy).await.unwrap();

    let done = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let started = Instant::now();
    let sampler = {
        let (done, samples) = (done.clone(), samples.clone());
        let envoy = &pool.envoy;
        async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            while done.load(Ordering::SeqCst) < calls {
                tick.tick().await;
                let (Some(envoy_rss), Some(control_plane_rss)) =
                    (rss_bytes(envoy_pid), rss_bytes(cp_pid))
                else {
                    panic!("Envoy or the control plane is gone");
                };
                let gauges = gauges(envoy).await.unwrap();
                samples.lock().unwrap().push(Sample {
                    at_ms: started.elapsed().as_millis() as u64,
                    calls_done: done.load(Ordering::SeqCst),
                    envoy_rss,
                    control_plane_rss,
                    gauges,
                });
            }
        }
    };
    let runner = {
        let (client, key, done) = (pool.client.clone(), pool.virtual_key.clone(), done.clone());
        async move {
            futures::stream::iter(0..calls)
                .map(|i| {
                    let (client, key, done) = (client.clone(), key.clone(), done.clone());
                    async move {
                        let wrong = one_call(&client, &key, i).await;
                        done.fetch_add(1, Ordering::SeqCst);
                        wrong
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .filter_map(|w| async move { w })
                .collect::<Vec<String>>()
                .await
        }
    };
    let (wrong, ()) = tokio::join!(runner, sampler);
    let took = started.elapsed();

    // Every call ended at the client; the gateway's bookkeeping of them must go to 0 (an
    // abandoned stream's ends when Envoy has reset its upstream and logged the call).
    let deadline = Instant::now() + Duration::from_secs(15);
    let after = loop {
        let g = gauges(&pool.envoy).await.unwrap();
        if (g.calls, g.attempts, g.lane_in_flight) == (0, 0, 0) || Instant::now() > deadline {
            break g;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let samples = samples.lock().unwrap().clone();
    let warm: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.calls_done * 5 >= calls)
        .collect();
    assert!(
        warm.len() >= 8,
        "too few samples after warm-up ({}) to judge",
        warm.len()
    );
    let quarter = warm.len() / 4;
    let (first, last) = (&warm[..quarter], &warm[warm.len() - quarter..]);
    let envoy_first = max_of(first, |s| s.envoy_rss);
    let envoy_last = max_of(last, |s| s.envoy_rss);
    let cp_first = max_of(first, |s| s.control_plane_rss);
    let cp_last = max_of(last, |s| s.control_plane_rss);
    let vm_first = max_of(first, |s| s.gauges.vm_memory);
    let vm_last = after.vm_memory;
    let most_calls = max_of(&samples, |s| s.gauges.calls);
    let most_attempts = max_of(&samples, |s| s.gauges.attempts);
    let most_in_flight = max_of(&samples, |s| s.gauges.lane_in_flight);
    let abandoned = (0..calls)
        .filter(|i| matches!(kind_of(*i), Kind::Abandoned))
        .count();
    let mock_calls = pool.mocks[0].calls().await.unwrap().len();
    let summary = json!({
        "calls": calls,
        "abandoned": abandoned,
        "concurrency": CONCURRENCY,
        "seconds": took.as_secs_f64(),
        "wrong": wrong.len(),
        "provider_attempts": mock_calls,
        "envoy_rss_mib": {"start": samples.first().map(|s| s.envoy_rss as f64 / MIB),
            "first_quarter_max": envoy_first as f64 / MIB, "last_quarter_max": envoy_last as f64 / MIB},
        "control_plane_rss_mib": {"start": samples.first().map(|s| s.control_plane_rss as f64 / MIB),
            "first_quarter_max": cp_first as f64 / MIB, "last_quarter_max": cp_last as f64 / MIB},
        "vm_memory_mib": {"before": before.vm_memory as f64 / MIB,
            "first_quarter_max": vm_first as f64 / MIB, "end": vm_last as f64 / MIB},
        "bookkeeping_max_during": {"calls": most_calls, "attempts": most_attempts, "lane_in_flight": most_in_flight},
        "bookkeeping_after": after,
        "samples": samples,
    });
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/soak");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join(format!("soak-{calls}.json")),
        serde_json::to_string_pretty(&summary).unwrap(),
    )
    .unwrap();
    eprintln!(
        "soak: {calls} calls ({abandoned} abandoned mid-stream) at c{CONCURRENCY} in {took:?}, \
         {} wrong, {mock_calls} provider attempts; Envoy RSS {:.1} MiB at the start, \
         {:.1} -> {:.1} MiB (max of the first -> last quarter after warm-up); control plane \
         {:.1} -> {:.1} MiB; wasm VMs {:.2} -> {:.2} MiB; bookkeeping at most {most_calls} calls, \
         {most_attempts} attempts, {most_in_flight} in flight; after: {after:?}",
        wrong.len(),
        samples.first().map_or(0.0, |s| s.envoy_rss as f64 / MIB),
        envoy_first as f64 / MIB,
        envoy_last as f64 / MIB,
        cp_first as f64 / MIB,
        cp_last as f64 / MIB,
        vm_first as f64 / MIB,
        vm_last as f64 / MIB,
    );

    assert!(
        wrong.is_empty(),
        "{} call(s) wrong, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
    assert!(
        mock_calls > calls,
        "the 500s were failed over: {mock_calls} attempts for {calls} calls"
    );
    assert_eq!(
        (after.calls, after.attempts, after.lane_in_flight),
        (0, 0, 0),
        "the bookkeeping of ended calls is not freed: {after:?}"
    );
    // While it ran, the bookkeeping held no more than the calls in flight could.
    let bound = 4 * CONCURRENCY as u64;
    assert!(
        most_calls <= bound && most_attempts <= bound && most_in_flight <= bound,
        "bookkeeping grew past {bound}: {most_calls} calls, {most_attempts} attempts, {most_in_flight} in flight"
    );
    assert!(
        envoy_last <= envoy_first + RSS_SLACK,
        "Envoy's RSS grew: {:.1} -> {:.1} MiB",
        envoy_first as f64 / MIB,
        envoy_last as f64 / MIB
    );
    assert!(
        cp_last <= cp_first + RSS_SLACK,
        "the control plane's RSS grew: {:.1} -> {:.1} MiB",
        cp_first as f64 / MIB,
        cp_last as f64 / MIB
    );
    assert!(vm_first > 0, "no wasm VM memory reported");
    assert!(
        vm_last <= vm_first + VM_SLACK,
        "the wasm VMs' memory grew: {:.2} -> {:.2} MiB",
        vm_first as f64 / MIB,
        vm_last as f64 / MIB
    );
}
