//! The load generator: HTTP/1.1 keep-alive requests from one tokio runtime, closed loop (N
//! workers, each sending its next request when the last one ended), open loop (requests sent
//! on a fixed schedule, latency counted from the scheduled moment so a slow server cannot hide
//! its queue) and streams (time to the first body byte and to the last).
//!
//! Every answer is checked: a unary one must be 200 and carry the fake upstream's completion
//! text, a stream must be 200, carry it and end with `data: [DONE]`. Anything else counts as
//! failed (transport error, timeout, another status) or invalid (200 without the completion).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::upstream::{COMPLETION_TEXT, STREAM_MARKER};

/// The bound on one request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an open-loop run waits for its last requests after the schedule ends.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What to send: one URL, headers and the unary and streamed bodies.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: hyper::Uri,
    pub headers: Vec<(String, String)>,
    pub unary_body: Bytes,
    pub stream_body: Bytes,
    /// The headers of streamed requests (they replace `headers`).
    pub stream_headers: Vec<(String, String)>,
}

impl Target {
    /// The headers of a unary or a streamed request.
    pub fn headers_for(&self, stream: bool) -> &[(String, String)] {
        if stream {
            &self.stream_headers
        } else {
            &self.headers
        }
    }

    /// The body of a unary or a streamed request.
    pub fn body_for(&self, stream: bool) -> Bytes {
        if stream {
            self.stream_body.clone()
        } else {
            self.unary_body.clone()
        }
    }
}

/// `--prompt-kb`: the KB of earlier turns every request carries (0: none).
static PROMPT_KB: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sets `--prompt-kb` for every body made after.
pub fn set_prompt_kb(kb: usize) {
    PROMPT_KB.store(kb, std::sync::atomic::Ordering::Relaxed);
}

/// The KB of earlier turns every request carries.
pub fn prompt_kb() -> usize {
    PROMPT_KB.load(std::sync::atomic::Ordering::Relaxed)
}

/// Turns of a coding agent's conversation, about `kb` KB: a request for a change and the
/// answer, each with twenty lines of code.
fn earlier_turns(kb: usize) -> Vec<serde_json::Value> {
    let code =
        "    let total = items.iter().map(|item| item.price * item.quantity).sum::<u64>();\n"
            .repeat(20);
    let mut turns = Vec::new();
    let mut size = 0;
    while size < kb * 1024 {
        let (role, text) = match turns.len() % 2 {
            0 => (
                "user",
                format!(
                    "Step {}: fix the bug in this function.\n{code}",
                    turns.len() / 2
                ),
            ),
            _ => ("assistant", format!("The fix:\n{code}")),
        };
        size += text.len() + 32;
        turns.push(serde_json::json!({ "role": role, "content": text }));
    }
    turns
}

/// The body every system gets for `model` (OpenAI chat completion), with `--prompt-kb` of
/// earlier turns.
pub fn chat_body(model: &str, stream: bool) -> Bytes {
    let mut messages = earlier_turns(prompt_kb());
    messages.push(serde_json::json!({ "role": "user", "content": "Say hello to the benchmark." }));
    let mut body = serde_json::json!({
        "model": model,
        "messages": messages,
        "max_tokens": 16,
    });
    if stream {
        body["stream"] = serde_json::Value::Bool(true);
    }
    Bytes::from(body.to_string())
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A pooled keep-alive HTTP/1.1 client.
pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .pool_idle_timeout(Duration::from_secs(60))
        .build(connector)
}

/// How one request ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Ok,
    /// 200 without the completion (or without `[DONE]` for a stream).
    Invalid(String),
    Status(u16),
    Error(String),
}

/// One request's timings (µs from the moment it was due).
#[derive(Debug, Clone)]
pub struct Sample {
    pub outcome: Outcome,
    pub latency_us: u64,
    pub first_byte_us: u64,
    /// The gateway's own figure for this call (`x-ai-router-overhead-ms`), when it sent one.
    pub overhead_us: Option<u64>,
}

/// Sends one request and reads the whole answer.
pub async fn one(client: &HttpClient, target: &Target, stream: bool, due: Instant) -> Sample {
    match tokio::time::timeout(REQUEST_TIMEOUT, exchange(client, target, stream, due)).await {
        Ok(Ok(sample)) => sample,
        Ok(Err(e)) => Sample {
            outcome: Outcome::Error(short_error(&e)),
            latency_us: micros(due.elapsed()),
            first_byte_us: 0,
            overhead_us: None,
        },
        Err(_) => Sample {
            outcome: Outcome::Error("timeout".into()),
            latency_us: micros(due.elapsed()),
            first_byte_us: 0,
            overhead_us: None,
        },
    }
}

fn short_error(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    text.chars().take(160).collect()
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

async fn exchange(
    client: &HttpClient,
    target: &Target,
    stream: bool,
    due: Instant,
) -> Result<Sample> {
    let mut req = Request::post(target.url.clone()).header("content-type", "application/json");
    for (k, v) in target.headers_for(stream) {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Full::new(target.body_for(stream)))
        .context("building the request")?;
    let resp = client.request(req).await.context("sending")?;
    let status = resp.status().as_u16();
    let overhead_us = resp
        .headers()
        .get(ai_router_contract::headers::OVERHEAD_MS)
        .and_then(|v| v.to_str().ok())
        .and_then(overhead_us_of);
    let mut body = resp.into_body();
    let mut first_byte_us = 0;
    let mut bytes = Vec::with_capacity(1024);
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading the body")?;
        if let Ok(data) = frame.into_data() {
            if first_byte_us == 0 && !data.is_empty() {
                first_byte_us = micros(due.elapsed());
            }
            bytes.extend_from_slice(&data);
        }
    }
    let latency_us = micros(due.elapsed());
    let outcome = if status != 200 {
        Outcome::Status(status)
    } else {
        check_body(&bytes, stream)
    };
    Ok(Sample {
        outcome,
        latency_us,
        first_byte_us,
        overhead_us,
    })
}

/// `x-ai-router-overhead-ms` (milliseconds with three decimals) in µs.
fn overhead_us_of(ms: &str) -> Option<u64> {
    let ms: f64 = ms.trim().parse().ok()?;
    (ms.is_finite() && ms >= 0.0).then(|| (ms * 1000.0).round() as u64)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn check_body(bytes: &[u8], stream: bool) -> Outcome {
    if stream {
        // Peers re-chunk the text: look for one piece of it, and the end of the stream.
        if !contains(bytes, STREAM_MARKER.as_bytes()) {
            return Outcome::Invalid("stream without the completion text".into());
        }
        if !contains(bytes, b"[DONE]") {
            return Outcome::Invalid("stream without data: [DONE]".into());
        }
        Outcome::Ok
    } else if contains(bytes, COMPLETION_TEXT.as_bytes()) {
        Outcome::Ok
    } else {
        Outcome::Invalid("200 without the completion text".into())
    }
}

/// Percentiles of a set of durations, in ms.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Percentiles {
    pub fn of(values_us: &mut [u64]) -> Self {
        if values_us.is_empty() {
            return Self::default();
        }
        values_us.sort_unstable();
        let at = |q: f64| {
            let idx = ((values_us.len() as f64 - 1.0) * q).round() as usize;
            values_us[idx.min(values_us.len() - 1)] as f64 / 1000.0
        };
        let sum: u128 = values_us.iter().map(|&v| u128::from(v)).sum();
        Self {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: at(1.0),
            mean: sum as f64 / values_us.len() as f64 / 1000.0,
        }
    }
}

/// What a load phase measured.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadResult {
    pub requests: u64,
    pub ok: u64,
    pub failed: u64,
    pub invalid: u64,
    /// Failures by kind (`status 503`, `timeout`, ...), the first few kinds.
    pub failures: BTreeMap<String, u64>,
    pub elapsed_s: f64,
    /// Successful requests per second.
    pub throughput_rps: f64,
    /// Latency of the successful requests (for a stream: to its last byte).
    pub latency_ms: Percentiles,
    /// Streams only: time to the first body byte.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_byte_ms: Option<Percentiles>,
    /// ai-router only: its own overhead as each successful answer stated it
    /// (`x-ai-router-overhead-ms`; a stream's is to its first byte).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead_ms: Option<Percentiles>,
}

impl LoadResult {
    /// The figures of `samples` taken over `elapsed` (for phases measured in rounds: every
    /// round's samples, over the rounds' summed time).
    pub fn from_samples(samples: Vec<Sample>, elapsed: Duration, stream: bool) -> Self {
        let mut r = LoadResult {
            requests: samples.len() as u64,
            elapsed_s: elapsed.as_secs_f64(),
            ..Default::default()
        };
        let mut lat = Vec::with_capacity(samples.len());
        let mut first = Vec::with_capacity(samples.len());
        let mut overhead = Vec::new();
        for s in samples {
            let kind = match s.outcome {
                Outcome::Ok => {
                    r.ok += 1;
                    lat.push(s.latency_us);
                    first.push(s.first_byte_us);
                    overhead.extend(s.overhead_us);
                    continue;
                }
                Outcome::Invalid(why) => {
                    r.invalid += 1;
                    why
                }
                Outcome::Status(code) => {
                    r.failed += 1;
                    format!("status {code}")
                }
                Outcome::Error(e) => {
                    r.failed += 1;
                    e
                }
            };
            if r.failures.len() < 8 || r.failures.contains_key(&kind) {
                *r.failures.entry(kind).or_default() += 1;
            }
        }
        if r.elapsed_s > 0.0 {
            r.throughput_rps = r.ok as f64 / r.elapsed_s;
        }
        r.latency_ms = Percentiles::of(&mut lat);
        if stream {
            r.first_byte_ms = Some(Percentiles::of(&mut first));
        }
        if !overhead.is_empty() {
            r.overhead_ms = Some(Percentiles::of(&mut overhead));
        }
        r
    }
}

/// `concurrency` workers send requests back to back for `duration`.
pub async fn closed_loop(
    target: &Target,
    concurrency: usize,
    duration: Duration,
    stream: bool,
) -> Result<LoadResult> {
    let (samples, elapsed) = closed_loop_samples(target, concurrency, duration, stream).await?;
    Ok(LoadResult::from_samples(samples, elapsed, stream))
}

/// [`closed_loop`]'s samples and the time they took, unsummarised.
pub async fn closed_loop_samples(
    target: &Target,
    concurrency: usize,
    duration: Duration,
    stream: bool,
) -> Result<(Vec<Sample>, Duration)> {
    let client = client();
    let target = Arc::new(target.clone());
    let start = Instant::now();
    let deadline = start + duration;
    let mut set = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let client = client.clone();
        let target = target.clone();
        set.spawn(async move {
            let mut samples = Vec::new();
            while Instant::now() < deadline {
                samples.push(one(&client, &target, stream, Instant::now()).await);
            }
            samples
        });
    }
    let mut samples = Vec::new();
    while let Some(done) = set.join_next().await {
        samples.extend(done.map_err(|e| anyhow!("a load worker failed: {e}"))?);
    }
    Ok((samples, start.elapsed()))
}

/// Requests due at `rate` per second for `duration`, at most `max_in_flight` at once; a request
/// that had to wait for a free slot counts its wait.
pub async fn open_loop(
    target: &Target,
    rate: f64,
    duration: Duration,
    max_in_flight: usize,
) -> Result<LoadResult> {
    let client = client();
    let target = Arc::new(target.clone());
    let slots = Arc::new(Semaphore::new(max_in_flight.max(1)));
    let total = (rate * duration.as_secs_f64()).round().max(1.0) as u64;
    let start = Instant::now() + Duration::from_millis(5);
    let mut set = JoinSet::new();
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| anyhow!("open loop: {e}"))?;
        let client = client.clone();
        let target = target.clone();
        set.spawn(async move {
            let sample = one(&client, &target, false, due).await;
            drop(permit);
            sample
        });
    }
    let mut samples = Vec::new();
    let drain_until = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let left = drain_until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, set.join_next()).await {
            Ok(Some(done)) => {
                samples.push(done.map_err(|e| anyhow!("a request task failed: {e}"))?)
            }
            Ok(None) => break,
            Err(_) => {
                let stuck = set.len();
                set.abort_all();
                for _ in 0..stuck {
                    samples.push(Sample {
                        outcome: Outcome::Error("timeout".into()),
                        latency_us: micros(DRAIN_TIMEOUT),
                        first_byte_us: 0,
                        overhead_us: None,
                    });
                }
                break;
            }
        }
    }
    Ok(LoadResult::from_samples(samples, start.elapsed(), false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_turns_come_to_about_the_size_asked() {
        assert!(earlier_turns(0).is_empty());
        for kb in [1, 16, 64] {
            let bytes = serde_json::to_vec(&earlier_turns(kb)).map_or(0, |b| b.len());
            assert!(
                bytes >= kb * 1024 && bytes < kb * 1024 + 4096,
                "{kb} KB asked: {bytes} bytes"
            );
        }
    }

    #[test]
    fn the_overhead_header_is_read_in_microseconds_and_nonsense_is_none() {
        assert_eq!(overhead_us_of("0.412"), Some(412));
        assert_eq!(overhead_us_of(" 12.000 "), Some(12_000));
        assert_eq!(overhead_us_of("-1"), None);
        assert_eq!(overhead_us_of("NaN"), None);
        assert_eq!(overhead_us_of("soon"), None);
    }
}
