//! This process's counters since it started, from the data plane's reports: calls by operation
//! and outcome, and per lane (provider, key alias, model) attempts, failures by class, tokens,
//! estimated cost and a latency average. What `GET /admin/stats` shows, and the latency
//! `GET /admin/health` adds to each lane.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ai_router_contract::latency::ewma_step;
use ai_router_proto::v1 as pb;
use serde::Serialize;

use crate::store::durable::{entry_by_names, lane_names, lane_of};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneStats {
    pub provider: String,
    pub key: String,
    pub model: String,
    pub attempts: u64,
    pub successes: u64,
    /// Failed attempts by class.
    pub failures: BTreeMap<String, u64>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost: f64,
    /// What answers on this lane saved against their calls' configured first choice (a
    /// cheaper lane under `autoSort`, or a fallback that costs less).
    pub saved: f64,
    /// Exponentially weighted average of the attempts' latency (to the first byte for streams),
    /// by the filter's rule (`contract::latency`) with the pool's `selection.ewmaAlpha`.
    pub latency_ewma_ms: f64,
}

/// One client protocol's calls and attempts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolStats {
    /// outcome (`success`, `error:<class>`, `rejected:<code>`) -> calls
    pub requests: BTreeMap<String, u64>,
    pub attempts: u64,
    /// Failed attempts by class.
    pub attempt_failures: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatsView {
    pub since_ms: i64,
    /// operation -> outcome (`success`, `error:<class>`, `rejected:<code>`) -> calls
    pub requests: BTreeMap<String, BTreeMap<String, u64>>,
    /// The client's protocol (`chat`, `responses`, `messages`, `embeddings`) -> its calls and
    /// attempts.
    pub protocols: BTreeMap<String, ProtocolStats>,
    pub lanes: Vec<LaneStats>,
    /// The response cache's calls, and what its hits saved.
    pub cache: CacheStats,
}

/// The calls the response cache was on for, by result, and what the hits saved: each hit's
/// stored answer at its model's price.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub bypassed: u64,
    pub saved: f64,
}

/// A report's protocol as counted: `unknown` from a data plane too old to say.
fn protocol_of(protocol: &str) -> String {
    if protocol.is_empty() {
        "unknown".to_owned()
    } else {
        protocol.to_owned()
    }
}

#[derive(Debug, Default)]
pub struct Stats {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    since_ms: i64,
    requests: BTreeMap<String, BTreeMap<String, u64>>,
    protocols: BTreeMap<String, ProtocolStats>,
    lanes: BTreeMap<(String, String, String), LaneStats>,
    cache: CacheStats,
}

impl Stats {
    pub fn new(since_ms: i64) -> Self {
        Self {
            inner: Mutex::new(Inner {
                since_ms,
                ..Inner::default()
            }),
        }
    }

    /// Counts a report batch; `ewma_alpha` weighs an attempt's latency in its lane's average,
    /// `cost` prices an attempt's usage.
    pub fn observe(
        &self,
        batch: &pb::ReportBatch,
        ewma_alpha: f64,
        cost: impl Fn(&pb::AttemptOutcome) -> f64,
        saved: impl Fn(&pb::AttemptOutcome) -> f64,
    ) {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for r in &batch.requests {
            *s.requests
                .entry(r.operation.clone())
                .or_default()
                .entry(r.outcome_text())
                .or_default() += 1;
            *s.protocols
                .entry(protocol_of(&r.protocol))
                .or_default()
                .requests
                .entry(r.outcome_text())
                .or_default() += 1;
        }
        for a in &batch.attempts {
            let protocol = s.protocols.entry(protocol_of(&a.protocol)).or_default();
            protocol.attempts += 1;
            if a.outcome() != pb::AttemptResult::Success {
                *protocol
                    .attempt_failures
                    .entry(failure_class(a).to_owned())
                    .or_default() += 1;
            }
            let first = || {
                let stats = LaneStats {
                    provider: a.provider.clone(),
                    key: a.key.clone(),
                    model: a.model.clone(),
                    latency_ewma_ms: a.latency_ms as f64,
                    ..LaneStats::default()
                };
                (lane_of(a), stats)
            };
            let Some(lane) = entry_by_names(&mut s.lanes, &lane_names(a), first) else {
                continue;
            };
            lane.attempts += 1;
            if a.outcome() == pb::AttemptResult::Success {
                lane.successes += 1;
            } else {
                *lane
                    .failures
                    .entry(failure_class(a).to_owned())
                    .or_default() += 1;
            }
            if let Some(u) = a.usage {
                lane.prompt_tokens = lane.prompt_tokens.saturating_add(u.prompt_tokens);
                lane.completion_tokens = lane.completion_tokens.saturating_add(u.completion_tokens);
            }
            let c = cost(a);
            if c.is_finite() && c > 0.0 {
                lane.cost += c;
            }
            let s = saved(a);
            if s.is_finite() && s > 0.0 {
                lane.saved += s;
            }
            lane.latency_ewma_ms = ewma_step(lane.latency_ewma_ms, a.latency_ms as f64, ewma_alpha);
        }
    }

    /// Counts the response cache's part of a batch's calls; `saved` prices a hit.
    pub fn observe_cache(
        &self,
        batch: &pb::ReportBatch,
        saved: impl Fn(&pb::RequestOutcome) -> f64,
    ) {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for r in &batch.requests {
            match r.cache_lookup() {
                pb::CacheLookup::Hit => {
                    s.cache.hits += 1;
                    let v = saved(r);
                    if v.is_finite() && v > 0.0 {
                        s.cache.saved += v;
                    }
                }
                pb::CacheLookup::Miss => s.cache.misses += 1,
                pb::CacheLookup::Bypass => s.cache.bypassed += 1,
                pb::CacheLookup::Unspecified => {}
            }
        }
    }

    pub fn view(&self) -> StatsView {
        let s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        StatsView {
            cache: s.cache,
            since_ms: s.since_ms,
            requests: s.requests.clone(),
            protocols: s.protocols.clone(),
            // A tenth of a millisecond is as fine as an average of latencies means anything.
            lanes: s
                .lanes
                .values()
                .map(|l| LaneStats {
                    latency_ewma_ms: (l.latency_ewma_ms * 10.0).round() / 10.0,
                    ..l.clone()
                })
                .collect(),
        }
    }
}

/// A failed attempt's class as counted (`unknown` when it has none).
fn failure_class(a: &pb::AttemptOutcome) -> &'static str {
    match a.error_class().text() {
        "" => "unknown",
        class => class,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_calls_and_lanes() {
        let stats = Stats::new(7);
        let attempt = |outcome: &str, class: &str, latency_ms: u64| pb::AttemptOutcome {
            provider: "p".into(),
            key: "a".into(),
            model: "m".into(),
            outcome: if outcome == "success" {
                pb::AttemptResult::Success.into()
            } else {
                pb::AttemptResult::Error.into()
            },
            error_class: ai_router_contract::failure::ErrorClass::parse(class)
                .map_or(pb::ErrorClass::Unspecified, pb::ErrorClass::from)
                .into(),
            latency_ms,
            usage: (outcome == "success").then_some(pb::Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                ..Default::default()
            }),
            ..Default::default()
        };
        stats.observe(
            &pb::ReportBatch {
                attempts: vec![
                    attempt("error", "rate_limit", 100),
                    attempt("success", "", 200),
                ],
                requests: vec![pb::RequestOutcome {
                    operation: "chat".into(),
                    protocol: "messages".into(),
                    outcome: pb::RequestResult::Success.into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            ai_router_contract::defaults::EWMA_ALPHA,
            |a| if a.usage.is_some() { 0.5 } else { 0.0 },
            |a| if a.usage.is_some() { 0.25 } else { 0.0 },
        );
        let v = stats.view();
        assert_eq!(v.since_ms, 7);
        assert_eq!(v.requests["chat"]["success"], 1);
        let messages = &v.protocols["messages"];
        assert_eq!(messages.requests["success"], 1);
        // These attempts came from a data plane that names no protocol.
        let unknown = &v.protocols["unknown"];
        assert_eq!(
            (unknown.attempts, unknown.attempt_failures["rate_limit"]),
            (2, 1)
        );
        let lane = &v.lanes[0];
        assert_eq!((lane.attempts, lane.successes), (2, 1));
        assert_eq!(lane.failures["rate_limit"], 1);
        assert_eq!((lane.prompt_tokens, lane.completion_tokens), (10, 5));
        assert!((lane.cost - 0.5).abs() < 1e-9);
        assert!((lane.saved - 0.25).abs() < 1e-9);
        assert!(
            (lane.latency_ewma_ms - 130.0).abs() < 1e-9,
            "{}",
            lane.latency_ewma_ms
        );
    }

    #[test]
    fn cache_hits_misses_and_what_the_hits_saved() {
        let stats = Stats::new(0);
        let call = |lookup: pb::CacheLookup| pb::RequestOutcome {
            cache_lookup: lookup.into(),
            cache_hit: lookup == pb::CacheLookup::Hit,
            ..Default::default()
        };
        let batch = pb::ReportBatch {
            requests: vec![
                call(pb::CacheLookup::Hit),
                call(pb::CacheLookup::Hit),
                call(pb::CacheLookup::Miss),
                call(pb::CacheLookup::Bypass),
                call(pb::CacheLookup::Unspecified),
            ],
            ..Default::default()
        };
        stats.observe_cache(&batch, |r| if r.cache_hit { 0.5 } else { 9.0 });
        let c = stats.view().cache;
        assert_eq!((c.hits, c.misses, c.bypassed), (2, 1, 1));
        assert!((c.saved - 1.0).abs() < 1e-9, "{}", c.saved);
    }
}
