//! What the console's live figures come from: the data plane's reports as they arrive (the last
//! minutes' calls and attempts: rates, latency, the forecasts' rates), and the forecast of when
//! what a window has left runs out. The admin API holds one [`Pulse`]; the console's routes
//! ([`crate::api::console`]) read it. Usage and spend by day are not kept here: they are the key
//! store's usage rows (per key, day, provider, model and protocol), which outlive a restart and which
//! control planes sharing the store agree on.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use ai_router_proto::v1 as pb;
use serde_json::{json, Value};

use crate::clock::Clock;
use crate::engine::Engine;
use crate::engine::ReportObserver;
use crate::keys::store::protocol_name;

/// The calls the overview's rates and percentiles are taken over.
pub const PULSE_WINDOW_MS: i64 = 60_000;
/// The attempts a forecast's rate is taken over.
pub const FORECAST_WINDOW_MS: i64 = 300_000;
/// The most calls or attempts remembered (a very busy gateway's last minutes are sampled).
pub const MAX_MARKS: usize = 100_000;

// ---------------------------------------------------------------------------------------------
// The pulse: recent calls and attempts
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct CallMark {
    at_ms: i64,
    ok: bool,
    latency_ms: u64,
    provider: String,
    protocol: String,
}

#[derive(Debug, Clone)]
struct AttemptMark {
    at_ms: i64,
    provider: String,
    key: String,
    tokens: u64,
}

/// A node's attempts in flight per provider key, as its last batch that said so counted them.
#[derive(Debug, Clone)]
struct NodeLoad {
    /// When this control plane received them (they are forgotten
    /// [`ai_router_contract::IN_FLIGHT_FORGET_MS`] later).
    received_ms: i64,
    /// When the node counted them (a batch sent again late does not undo a newer count).
    counted_ms: i64,
    keys: Vec<pb::KeyLoad>,
}

#[derive(Debug, Default)]
struct PulseInner {
    calls: VecDeque<CallMark>,
    attempts: VecDeque<AttemptMark>,
    /// By node.
    loads: BTreeMap<String, NodeLoad>,
}

/// Observes the data plane's reports: the last minutes' calls and attempts.
pub struct Pulse {
    clock: Arc<dyn Clock>,
    started_ms: i64,
    inner: Mutex<PulseInner>,
}

impl std::fmt::Debug for Pulse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pulse").finish_non_exhaustive()
    }
}

impl Pulse {
    /// A pulse observing `engine`'s reports from now on.
    pub fn attach(engine: &Arc<Engine>, clock: Arc<dyn Clock>) -> Arc<Self> {
        let pulse = Arc::new(Self::new(clock));
        engine.add_report_observer(pulse.clone());
        pulse
    }

    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            started_ms: clock.now_ms(),
            clock,
            inner: Mutex::new(PulseInner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PulseInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a batch at `now_ms`.
    pub(crate) fn record(&self, batch: &pb::ReportBatch, now_ms: i64) {
        let mut inner = self.lock();
        if batch.in_flight_at_ms > 0 {
            let newer = inner
                .loads
                .get(&batch.node)
                .is_none_or(|l| l.counted_ms <= batch.in_flight_at_ms);
            if newer {
                inner.loads.insert(
                    batch.node.clone(),
                    NodeLoad {
                        received_ms: now_ms,
                        counted_ms: batch.in_flight_at_ms,
                        keys: batch.in_flight.clone(),
                    },
                );
            }
        }
        for r in &batch.requests {
            inner.calls.push_back(CallMark {
                at_ms: now_ms,
                ok: r.outcome() == pb::RequestResult::Success,
                latency_ms: r.latency_ms,
                provider: r.provider.clone(),
                protocol: protocol_name(&r.protocol).to_owned(),
            });
        }
        for a in &batch.attempts {
            let tokens = a
                .usage
                .map_or(0, |u| u.prompt_tokens.saturating_add(u.completion_tokens));
            inner.attempts.push_back(AttemptMark {
                at_ms: now_ms,
                provider: a.provider.clone(),
                key: a.key.clone(),
                tokens,
            });
        }
        Self::trim(&mut inner, now_ms);
    }

    fn trim(inner: &mut PulseInner, now_ms: i64) {
        let keep = PULSE_WINDOW_MS.max(FORECAST_WINDOW_MS);
        while inner
            .calls
            .front()
            .is_some_and(|c| c.at_ms < now_ms - keep || inner.calls.len() > MAX_MARKS)
        {
            inner.calls.pop_front();
        }
        while inner
            .attempts
            .front()
            .is_some_and(|a| a.at_ms < now_ms - keep || inner.attempts.len() > MAX_MARKS)
        {
            inner.attempts.pop_front();
        }
    }

    pub(crate) fn clock_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The last minute's calls: in all, per provider and per protocol.
    pub fn rates(&self) -> Value {
        let now = self.clock.now_ms();
        let inner = self.lock();
        let since = now - PULSE_WINDOW_MS;
        let recent: Vec<&CallMark> = inner.calls.iter().filter(|c| c.at_ms >= since).collect();
        // A process up for less than the window divides by the time it has been up.
        let span_ms = PULSE_WINDOW_MS.min((now - self.started_ms).max(1_000));
        let group = |key: fn(&CallMark) -> &str| {
            let mut by: BTreeMap<&str, Vec<&CallMark>> = BTreeMap::new();
            for c in &recent {
                by.entry(key(c)).or_default().push(c);
            }
            by.into_iter()
                .map(|(name, calls)| {
                    let mut v = call_figures(&calls, span_ms);
                    v["name"] = json!((!name.is_empty()).then_some(name));
                    v
                })
                .collect::<Vec<_>>()
        };
        let mut all = call_figures(&recent, span_ms);
        all["windowMs"] = json!(span_ms);
        all["providers"] = json!(group(|c| c.provider.as_str()));
        all["protocols"] = json!(group(|c| c.protocol.as_str()));
        all
    }

    /// The attempts in flight per provider key now, added up over the nodes whose counts are
    /// fresh (a node silent for [`ai_router_contract::IN_FLIGHT_FORGET_MS`] counts nothing):
    /// `[{ provider, key, attempts }]`, keys with none left out.
    pub(crate) fn in_flight(&self) -> Value {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        inner
            .loads
            .retain(|_, l| now - l.received_ms < ai_router_contract::IN_FLIGHT_FORGET_MS);
        let mut sum: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for l in inner.loads.values().flat_map(|n| &n.keys) {
            *sum.entry((&l.provider, &l.key)).or_default() += u64::from(l.attempts);
        }
        let out: Vec<Value> = sum
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|((provider, key), attempts)| {
                json!({ "provider": provider, "key": key, "attempts": attempts })
            })
            .collect();
        json!(out)
    }

    /// Attempts and tokens sent on `provider`'s `keys` over the forecast window, and the span
    /// (ms) they were counted over.
    pub(crate) fn sent(&self, provider: &str, keys: &[&str]) -> (u64, u64, i64) {
        let now = self.clock.now_ms();
        let since = now - FORECAST_WINDOW_MS;
        let inner = self.lock();
        let (mut attempts, mut tokens) = (0u64, 0u64);
        for a in inner.attempts.iter().filter(|a| a.at_ms >= since) {
            if a.provider == provider && keys.contains(&a.key.as_str()) {
                attempts += 1;
                tokens = tokens.saturating_add(a.tokens);
            }
        }
        let span = FORECAST_WINDOW_MS.min((now - self.started_ms).max(1_000));
        (attempts, tokens, span)
    }
}

impl ReportObserver for Pulse {
    fn observe(&self, batch: &pb::ReportBatch) {
        self.record(batch, self.clock.now_ms());
    }
}

/// Calls, calls per second, success rate and p50/p99 latency of `calls` over `span_ms`
/// (`null` figures without calls).
fn call_figures(calls: &[&CallMark], span_ms: i64) -> Value {
    let mut latencies: Vec<u64> = calls.iter().map(|c| c.latency_ms).collect();
    latencies.sort_unstable();
    let ok = calls.iter().filter(|c| c.ok).count();
    let n = calls.len();
    json!({
        "requests": n,
        "requestsPerSecond": round2(n as f64 * 1000.0 / span_ms.max(1) as f64),
        "successRate": (n > 0).then(|| round2(ok as f64 / n as f64)),
        "p50Ms": percentile(&latencies, 0.50),
        "p99Ms": percentile(&latencies, 0.99),
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The nearest-rank percentile of sorted `values`; `None` when empty.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

// ---------------------------------------------------------------------------------------------
// Forecast
// ---------------------------------------------------------------------------------------------

/// When a window's `remaining` runs out if `spent` keeps being used every `span_ms`:
/// `{ ratePerMinute, exhaustsAtMs, verdict }`, the verdict one of `out` (nothing left),
/// `runs_out` (before the window resets, or no reset is known), `lasts` (the window resets
/// first), `idle` (nothing was used), `unknown` (no figure of what is left).
pub fn forecast(
    remaining: Option<u64>,
    resets_at_ms: Option<i64>,
    spent: u64,
    span_ms: i64,
    now_ms: i64,
) -> Value {
    let per_ms = spent as f64 / span_ms.max(1) as f64;
    let rate = round2(per_ms * 60_000.0);
    let Some(remaining) = remaining else {
        return json!({ "ratePerMinute": rate, "exhaustsAtMs": null, "verdict": "unknown" });
    };
    if remaining == 0 {
        return json!({ "ratePerMinute": rate, "exhaustsAtMs": now_ms, "verdict": "out" });
    }
    if spent == 0 {
        return json!({ "ratePerMinute": rate, "exhaustsAtMs": null, "verdict": "idle" });
    }
    let at = now_ms.saturating_add((remaining as f64 / per_ms).ceil() as i64);
    match resets_at_ms {
        Some(reset) if reset > now_ms && reset <= at => {
            json!({ "ratePerMinute": rate, "exhaustsAtMs": null, "verdict": "lasts" })
        }
        _ => json!({ "ratePerMinute": rate, "exhaustsAtMs": at, "verdict": "runs_out" }),
    }
}
