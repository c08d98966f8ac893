//! What the console's live figures come from: the data plane's reports as they arrive (the last
//! minutes' calls and attempts: rates, latency, the forecasts' rates), and the forecast of when
//! what a window has left runs out. The admin API holds one [`Pulse`]; the console's routes
//! ([`crate::api::console`]) read it. Usage and spend by day are not kept here: they are the key
//! store's usage rows (per key, day, provider, model and protocol), which outlive a restart and which
//! control planes sharing the store agree on.

use std::collections::{BTreeMap, HashMap, VecDeque};
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
/// The most calls or attempts remembered (past it, a very busy gateway keeps its latest ones).
/// A mark is 24 bytes (its names are held once, in one table): both queues full hold about
/// 6 MB, where marks carrying their own strings held about 23 MB.
pub const MAX_MARKS: usize = 100_000;
/// The most distinct names held; past it they are collected again from the marks left.
const MAX_NAMES: usize = 65_536;

// ---------------------------------------------------------------------------------------------
// The pulse: recent calls and attempts
// ---------------------------------------------------------------------------------------------

/// A call: when it was reported, its latency, provider and protocol (ids in [`Names`]), and
/// whether it succeeded.
#[derive(Debug, Clone, Copy)]
struct CallMark {
    at_ms: i64,
    latency_ms: u32,
    provider: u32,
    protocol: u32,
    ok: bool,
}

/// An attempt: when it was reported, its provider and key (ids in [`Names`]) and its tokens.
#[derive(Debug, Clone, Copy)]
struct AttemptMark {
    at_ms: i64,
    tokens: u64,
    provider: u32,
    key: u32,
}

/// The provider, key and protocol names the marks refer to, each held once.
#[derive(Debug, Default)]
struct Names {
    list: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, u32>,
    /// How many the marks held when the table was last collected: it is collected again only
    /// once it has doubled since (a collection reads every mark).
    kept: usize,
}

impl Names {
    /// `name`'s id, given it one when it is new.
    fn id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        // Never past `u32::MAX`: the table is collected again at `MAX_NAMES`.
        let id = u32::try_from(self.list.len()).unwrap_or(u32::MAX);
        let name: Arc<str> = Arc::from(name);
        self.list.push(name.clone());
        self.ids.insert(name, id);
        id
    }

    /// `name`'s id when a mark holds it.
    fn find(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    fn name(&self, id: u32) -> &str {
        self.list.get(id as usize).map_or("", |n| n)
    }
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
    names: Names,
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
        let inner = &mut *inner;
        for r in &batch.requests {
            inner.calls.push_back(CallMark {
                at_ms: now_ms,
                latency_ms: u32::try_from(r.latency_ms).unwrap_or(u32::MAX),
                provider: inner.names.id(&r.provider),
                protocol: inner.names.id(protocol_name(&r.protocol)),
                ok: r.outcome() == pb::RequestResult::Success,
            });
        }
        for a in &batch.attempts {
            let tokens = a.tokens();
            inner.attempts.push_back(AttemptMark {
                at_ms: now_ms,
                tokens,
                provider: inner.names.id(&a.provider),
                key: inner.names.id(&a.key),
            });
        }
        Self::trim(inner, now_ms);
    }

    /// Forgets calls past the rates' window and attempts past the forecasts' (and the oldest
    /// of either past [`MAX_MARKS`]), and the names no mark holds once there are too many.
    fn trim(inner: &mut PulseInner, now_ms: i64) {
        while inner
            .calls
            .front()
            .is_some_and(|c| c.at_ms < now_ms - PULSE_WINDOW_MS || inner.calls.len() > MAX_MARKS)
        {
            inner.calls.pop_front();
        }
        while inner.attempts.front().is_some_and(|a| {
            a.at_ms < now_ms - FORECAST_WINDOW_MS || inner.attempts.len() > MAX_MARKS
        }) {
            inner.attempts.pop_front();
        }
        if inner.names.list.len() >= MAX_NAMES.max(2 * inner.names.kept) {
            Self::collect_names(inner);
        }
    }

    /// Gives the marks ids in a new table holding only the names they use.
    fn collect_names(inner: &mut PulseInner) {
        let old = std::mem::take(&mut inner.names);
        let names = &mut inner.names;
        for c in &mut inner.calls {
            c.provider = names.id(old.name(c.provider));
            c.protocol = names.id(old.name(c.protocol));
        }
        for a in &mut inner.attempts {
            a.provider = names.id(old.name(a.provider));
            a.key = names.id(old.name(a.key));
        }
        names.kept = names.list.len();
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
        let names = &inner.names;
        let group = |key: fn(&CallMark) -> u32| {
            let mut by: BTreeMap<&str, Vec<&CallMark>> = BTreeMap::new();
            for c in &recent {
                by.entry(names.name(key(c))).or_default().push(c);
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
        all["providers"] = json!(group(|c| c.provider));
        all["protocols"] = json!(group(|c| c.protocol));
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
        let keys: Vec<u32> = keys.iter().filter_map(|k| inner.names.find(k)).collect();
        if let Some(provider) = inner.names.find(provider) {
            for a in inner.attempts.iter().filter(|a| a.at_ms >= since) {
                if a.provider == provider && keys.contains(&a.key) {
                    attempts += 1;
                    tokens = tokens.saturating_add(a.tokens);
                }
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
    let mut latencies: Vec<u64> = calls.iter().map(|c| u64::from(c.latency_ms)).collect();
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::atomic::AtomicI64;

    use super::*;
    use crate::clock::TestClock;

    const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    fn attempt(provider: &str, key: &str, tokens: u64) -> pb::AttemptOutcome {
        pb::AttemptOutcome {
            provider: provider.into(),
            key: key.into(),
            usage: Some(pb::Usage {
                prompt_tokens: tokens,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_mark_holds_ids_not_names() {
        // What bounds the pulse's memory: 100,000 marks of each kind in about 6 MB.
        assert!(std::mem::size_of::<CallMark>() <= 24);
        assert!(std::mem::size_of::<AttemptMark>() <= 24);
    }

    #[test]
    fn calls_last_the_rates_window_and_attempts_the_forecasts() {
        let p = Pulse::new(Arc::new(TestClock(AtomicI64::new(T0))));
        let batch = pb::ReportBatch {
            requests: vec![pb::RequestOutcome {
                provider: "p".into(),
                ..Default::default()
            }],
            attempts: vec![attempt("p", "k", 10)],
            ..Default::default()
        };
        p.record(&batch, T0);
        p.record(&pb::ReportBatch::default(), T0 + PULSE_WINDOW_MS + 1);
        let inner = p.lock();
        assert_eq!((inner.calls.len(), inner.attempts.len()), (0, 1));
    }

    #[test]
    fn names_no_mark_holds_are_forgotten_once_there_are_too_many() {
        let clock = Arc::new(TestClock(AtomicI64::new(T0)));
        let p = Pulse::new(clock.clone());
        let many = pb::ReportBatch {
            // With "p", one name short of the bound: not collected yet.
            attempts: (0..MAX_NAMES - 2)
                .map(|i| attempt("p", &format!("k{i}"), 1))
                .collect(),
            ..Default::default()
        };
        p.record(&many, T0);
        assert_eq!(p.lock().names.list.len(), MAX_NAMES - 1);
        let later = T0 + FORECAST_WINDOW_MS + 1;
        let batch = pb::ReportBatch {
            attempts: vec![attempt("p", "live", 7), attempt("p", "live", 5)],
            ..Default::default()
        };
        p.record(&batch, later);
        assert_eq!(p.lock().names.list.len(), 2, "only p and live are held");
        clock.0.store(later, std::sync::atomic::Ordering::SeqCst);
        let (attempts, tokens, _) = p.sent("p", &["live", "k1"]);
        assert_eq!((attempts, tokens), (2, 12));
    }
}
