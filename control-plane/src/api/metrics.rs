//! `GET /metrics`: Prometheus text counters of what the data plane reported (requests by
//! outcome, attempts by lane and class, attempt latency) and gauges of the pushed state
//! (version, breakers that are not closed, keys out of rotation). Lanes are named by provider
//! id, key alias and model, never by secret.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use ai_router_proto::v1 as pb;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::engine::{Engine, ReportObserver};

type AttemptLabels = (String, String, String, String, String);

#[derive(Debug, Default)]
struct Counters {
    requests: BTreeMap<(String, String), u64>,
    attempts: BTreeMap<AttemptLabels, u64>,
    attempt_latency_ms: BTreeMap<(String, String, String), (u64, u64)>,
}

/// The counters, fed by every `Sync.Report` batch.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<Counters>,
}

impl ReportObserver for Metrics {
    fn observe(&self, batch: &pb::ReportBatch) {
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        for r in &batch.requests {
            *c.requests
                .entry((r.operation.clone(), r.outcome_text()))
                .or_default() += 1;
        }
        for a in &batch.attempts {
            let labels = (
                a.provider.clone(),
                a.key.clone(),
                a.model.clone(),
                a.outcome().text().to_owned(),
                a.error_class().text().to_owned(),
            );
            *c.attempts.entry(labels).or_default() += 1;
            let lat = c
                .attempt_latency_ms
                .entry((a.provider.clone(), a.key.clone(), a.model.clone()))
                .or_default();
            lat.0 += a.latency_ms;
            lat.1 += 1;
        }
    }
}

/// A label value in Prometheus text: backslash, quote and newline escaped.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// The exposition text for the counters and the current snapshot.
    pub fn render(&self, update: &pb::StateUpdate) -> String {
        let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP ai_router_requests_total Client requests by operation and outcome."
        );
        let _ = writeln!(out, "# TYPE ai_router_requests_total counter");
        for ((op, outcome), n) in &c.requests {
            let _ = writeln!(
                out,
                "ai_router_requests_total{{operation=\"{}\",outcome=\"{}\"}} {n}",
                esc(op),
                esc(outcome)
            );
        }
        let _ = writeln!(
            out,
            "# HELP ai_router_attempts_total Attempts by lane, outcome and failure class."
        );
        let _ = writeln!(out, "# TYPE ai_router_attempts_total counter");
        for ((p, k, m, outcome, class), n) in &c.attempts {
            let _ = writeln!(
                out,
                "ai_router_attempts_total{{provider=\"{}\",key=\"{}\",model=\"{}\",outcome=\"{}\",class=\"{}\"}} {n}",
                esc(p),
                esc(k),
                esc(m),
                esc(outcome),
                esc(class)
            );
        }
        let _ = writeln!(out, "# HELP ai_router_attempt_latency_ms Attempt latency (to the first byte for streams) by lane.");
        let _ = writeln!(out, "# TYPE ai_router_attempt_latency_ms summary");
        for ((p, k, m), (sum, count)) in &c.attempt_latency_ms {
            let labels = format!(
                "provider=\"{}\",key=\"{}\",model=\"{}\"",
                esc(p),
                esc(k),
                esc(m)
            );
            let _ = writeln!(out, "ai_router_attempt_latency_ms_sum{{{labels}}} {sum}");
            let _ = writeln!(
                out,
                "ai_router_attempt_latency_ms_count{{{labels}}} {count}"
            );
        }
        let snapshot = update.snapshot.clone().unwrap_or_default();
        let _ = writeln!(
            out,
            "# HELP ai_router_state_version The version of the state pushed to Envoy."
        );
        let _ = writeln!(out, "# TYPE ai_router_state_version gauge");
        let _ = writeln!(out, "ai_router_state_version {}", update.version);
        let _ = writeln!(
            out,
            "# HELP ai_router_breaker_open Breakers that are not closed (1 open, 0.5 half-open)."
        );
        let _ = writeln!(out, "# TYPE ai_router_breaker_open gauge");
        for b in &snapshot.breakers {
            let v = if b.state() == pb::BreakerPhase::Open {
                "1"
            } else {
                "0.5"
            };
            let _ = writeln!(
                out,
                "ai_router_breaker_open{{scope=\"{}\",provider=\"{}\",key=\"{}\"}} {v}",
                esc(b.scope().text()),
                esc(&b.provider),
                esc(&b.key)
            );
        }
        let _ = writeln!(
            out,
            "# HELP ai_router_key_out Provider keys out of rotation, by reason."
        );
        let _ = writeln!(out, "# TYPE ai_router_key_out gauge");
        for h in &snapshot.key_health {
            let _ = writeln!(
                out,
                "ai_router_key_out{{provider=\"{}\",key=\"{}\",reason=\"{}\"}} 1",
                esc(&h.provider),
                esc(&h.key),
                esc(h.reason().text())
            );
        }
        let t = &crate::api::sync::TRAFFIC;
        let load = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
        for (name, help, counts) in [
            (
                "ai_router_sync_messages_total",
                "State messages sent to Envoy, by kind (a snapshot per connect, then deltas).",
                [&t.snapshots, &t.deltas],
            ),
            (
                "ai_router_sync_bytes_total",
                "Bytes of state messages sent to Envoy, by kind.",
                [&t.snapshot_bytes, &t.delta_bytes],
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (kind, n) in ["snapshot", "delta"].into_iter().zip(counts) {
                let _ = writeln!(out, "{name}{{kind=\"{kind}\"}} {}", load(n));
            }
        }
        out
    }
}

/// `GET /metrics` on the engine and the counters.
pub fn routes(engine: Arc<Engine>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(render))
        .with_state((engine, metrics))
}

async fn render(State((engine, metrics)): State<(Arc<Engine>, Arc<Metrics>)>) -> impl IntoResponse {
    let text = metrics.render(&engine.current());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reports_and_renders_prometheus_text() {
        let m = Metrics::default();
        m.observe(&pb::ReportBatch {
            requests: vec![pb::RequestOutcome {
                operation: "chat".into(),
                outcome: pb::RequestResult::Success.into(),
                ..Default::default()
            }],
            attempts: vec![
                pb::AttemptOutcome {
                    provider: "p".into(),
                    key: "a".into(),
                    model: "m".into(),
                    outcome: pb::AttemptResult::Error.into(),
                    error_class: pb::ErrorClass::RateLimit.into(),
                    latency_ms: 40,
                    ..Default::default()
                },
                pb::AttemptOutcome {
                    provider: "p".into(),
                    key: "b".into(),
                    model: "m".into(),
                    outcome: pb::AttemptResult::Success.into(),
                    latency_ms: 60,
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let update = pb::StateUpdate {
            version: 7,
            snapshot: Some(pb::Snapshot {
                breakers: vec![pb::BreakerState {
                    scope: pb::BreakerScope::Key.into(),
                    provider: "p".into(),
                    key: "a\"x".into(),
                    state: pb::BreakerPhase::Open.into(),
                    open_until_ms: 1,
                }],
                ..Default::default()
            }),
            delta: None,
        };
        let text = m.render(&update);
        assert!(
            text.contains("ai_router_requests_total{operation=\"chat\",outcome=\"success\"} 1"),
            "{text}"
        );
        assert!(text.contains("class=\"rate_limit\"} 1"), "{text}");
        assert!(
            text.contains(
                "ai_router_attempt_latency_ms_sum{provider=\"p\",key=\"b\",model=\"m\"} 60"
            ),
            "{text}"
        );
        assert!(text.contains("ai_router_state_version 7"), "{text}");
        assert!(text.contains("key=\"a\\\"x\"} 1"), "{text}");
    }
}
