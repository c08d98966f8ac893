//! `GET /metrics`: Prometheus text (checked by `promtool check metrics`). Counters and
//! histograms of what the data plane reported (requests, attempts by lane, outcome and class,
//! latency, tokens, estimated cost, refusals by quota, outcomes the filters' outboxes dropped)
//! and gauges of the pushed state (version, breakers that are not closed, keys out of rotation)
//! and of the sync streams (connections and the age of each Envoy's state). Lanes are named by
//! provider id, key alias and model, never by secret.
//!
//! The report fields that are strings today and may become enums are read only by the small
//! `*_label` functions below.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, Weak};

use ai_router_proto::v1 as pb;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::api::error::ErrorCode;
use crate::engine::{Engine, ReportObserver};
use crate::store::durable::{entry_by_names, lane_names, lane_of};

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Upper bounds (seconds) of the overhead histogram's buckets: fine between 50 µs and 1 ms,
/// where the gateway's own time lies (and the benchmark's added latency it is compared with),
/// then coarse up to the second of a call that waited between attempts.
const OVERHEAD_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00015, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0025, 0.01, 0.05,
    0.25, 1.0,
];

/// The label of an attempt's outcome: `success` or `error`.
fn attempt_outcome_label(a: &pb::AttemptOutcome) -> &'static str {
    a.outcome().text()
}

/// The label of a failed attempt's class (empty for a success).
fn attempt_class_label(a: &pb::AttemptOutcome) -> &'static str {
    a.error_class().text()
}

/// The label of a call's outcome: `success`, `error:<class>` or `rejected:<code>`.
fn request_outcome_label(r: &pb::RequestOutcome) -> String {
    r.outcome_text()
}

/// The label of a breaker's scope: `key` or `provider`.
fn breaker_scope_label(b: &pb::BreakerState) -> &'static str {
    b.scope().text()
}

/// Whether a breaker is open (else half-open).
fn breaker_is_open(b: &pb::BreakerState) -> bool {
    b.state() == pb::BreakerPhase::Open
}

/// The label of why a key is out of rotation.
fn key_out_reason_label(h: &pb::KeyHealth) -> &'static str {
    h.reason().text()
}

/// The quota code a refused call was answered with, when it was refused by a quota.
fn quota_refusal(outcome: &str) -> Option<&str> {
    let code = outcome.strip_prefix("rejected:")?;
    matches!(
        ErrorCode::parse(code)?,
        ErrorCode::RequestsPerMinuteExceeded
            | ErrorCode::TokensPerDayExceeded
            | ErrorCode::CostPerDayExceeded
            | ErrorCode::CostPerMonthExceeded
    )
    .then_some(code)
}

/// A histogram of seconds over its bounds ([`BUCKETS`] unless made with others).
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64; 14],
    /// Per bucket, the observations at or under its bound (not cumulative).
    buckets: [u64; 14],
    sum: f64,
    count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::over(&BUCKETS)
    }
}

impl Histogram {
    fn over(bounds: &'static [f64; 14]) -> Self {
        Self {
            bounds,
            buckets: [0; 14],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        if let Some(i) = self.bounds.iter().position(|b| seconds <= *b) {
            self.buckets[i] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// Provider, key alias, model.
type Lane = (String, String, String);

/// A client call's labels: operation, the client's protocol, final provider and model.
type Call = (String, String, String, String);

fn call_labels((op, protocol, p, m): &Call) -> String {
    format!(
        "operation=\"{}\",protocol=\"{}\",provider=\"{}\",model=\"{}\"",
        esc(op),
        esc(protocol),
        esc(p),
        esc(m)
    )
}

/// What the reports said of one kind of call (operation, protocol, final provider and model).
#[derive(Debug, Default)]
struct CallSeries {
    /// By outcome.
    outcomes: BTreeMap<String, u64>,
    /// The calls' whole duration.
    duration: Histogram,
}

/// What the reports said of one lane.
#[derive(Debug, Default)]
struct LaneSeries {
    /// Attempts by outcome and failure class.
    attempts: BTreeMap<(&'static str, &'static str), u64>,
    /// Successful streams' time to first token (none yet: no series).
    first_token: Option<Histogram>,
    /// Every other attempt's duration.
    attempt_duration: Option<Histogram>,
    /// Prompt, completion and cached tokens, once an attempt reported usage.
    tokens: Option<[u64; 3]>,
    /// Estimated cost, once an attempt had one.
    cost: Option<f64>,
}

#[derive(Debug, Default)]
struct Counters {
    /// By operation, protocol, provider and model: the calls by outcome and their duration.
    calls: BTreeMap<Call, CallSeries>,
    /// Every lane's series: one lookup an attempt, by the report's names (no copy of them
    /// once the lane is known).
    lanes: BTreeMap<Lane, LaneSeries>,
    /// By client protocol and outcome: what the gateway added to calls a provider took part in.
    overhead: BTreeMap<(String, String), Histogram>,
    /// By code.
    quota_refusals: BTreeMap<String, u64>,
    /// By budget and level: answers that carried a budget warning.
    budget_warnings: BTreeMap<(String, String), u64>,
    /// By node: the outcomes its outbox dropped, as it last said.
    dropped: BTreeMap<String, u64>,
    /// The response cache: lookups by result (hit, miss, bypass), stores by outcome.
    cache_lookups: BTreeMap<&'static str, u64>,
    cache_stores: BTreeMap<&'static str, u64>,
}

/// The counters, fed by every `Sync.Report` batch.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<Counters>,
    /// Prices attempts (the engine holds this observer, hence weak).
    engine: Weak<Engine>,
}

impl Metrics {
    /// Counters pricing attempts by `engine`'s models.
    pub fn new(engine: &Arc<Engine>) -> Self {
        Self {
            counters: Mutex::default(),
            engine: Arc::downgrade(engine),
        }
    }
}

impl ReportObserver for Metrics {
    fn observe(&self, batch: &pb::ReportBatch) {
        let engine = self.engine.upgrade();
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        for r in &batch.requests {
            let outcome = request_outcome_label(r);
            let names = (
                r.operation.as_str(),
                r.protocol.as_str(),
                r.provider.as_str(),
                r.model.as_str(),
            );
            let call = || {
                let owned = (
                    r.operation.clone(),
                    r.protocol.clone(),
                    r.provider.clone(),
                    r.model.clone(),
                );
                (owned, CallSeries::default())
            };
            if let Some(series) = entry_by_names(&mut c.calls, &names, call) {
                match series.outcomes.get_mut(outcome.as_str()) {
                    Some(n) => *n += 1,
                    None => {
                        series.outcomes.insert(outcome.clone(), 1);
                    }
                }
                series.duration.observe(r.latency_ms as f64 / 1000.0);
            }
            if let Some(us) = r.overhead_us {
                let names = (r.protocol.as_str(), outcome.as_str());
                let labels = || {
                    let owned = (r.protocol.clone(), outcome.clone());
                    (owned, Histogram::over(&OVERHEAD_BUCKETS))
                };
                if let Some(h) = entry_by_names(&mut c.overhead, &names, labels) {
                    h.observe(us as f64 / 1e6);
                }
            }
            if let Some(code) = quota_refusal(&outcome) {
                *c.quota_refusals.entry(code.into()).or_default() += 1;
            }
            if r.cache_lookup() != pb::CacheLookup::Unspecified {
                *c.cache_lookups.entry(r.cache_lookup().text()).or_default() += 1;
            }
            if r.cache_store() != pb::CacheStore::Unspecified {
                *c.cache_stores.entry(r.cache_store().text()).or_default() += 1;
            }
            for warning in &r.budget_warnings {
                let (budget, level) = warning.rsplit_once('=').unwrap_or((warning, ""));
                *c.budget_warnings
                    .entry((budget.to_owned(), level.to_owned()))
                    .or_default() += 1;
            }
        }
        for a in &batch.attempts {
            let names = lane_names(a);
            let lane = || (lane_of(a), LaneSeries::default());
            let Some(series) = entry_by_names(&mut c.lanes, &names, lane) else {
                continue;
            };
            let outcome = attempt_outcome_label(a);
            *series
                .attempts
                .entry((outcome, attempt_class_label(a)))
                .or_default() += 1;
            let seconds = a.latency_ms as f64 / 1000.0;
            let duration = if a.stream && outcome == "success" {
                &mut series.first_token
            } else {
                &mut series.attempt_duration
            };
            duration
                .get_or_insert_with(Histogram::default)
                .observe(seconds);
            if let Some(u) = a.usage {
                let [prompt, completion, cached] = series.tokens.get_or_insert_default();
                *prompt = prompt.saturating_add(u.prompt_tokens);
                *completion = completion.saturating_add(u.completion_tokens);
                *cached = cached.saturating_add(u.cached_tokens);
            }
            if let Some(cost) = engine.as_ref().and_then(|e| e.attempt_cost(a)) {
                *series.cost.get_or_insert_default() += cost;
            }
        }
        if !batch.node.is_empty() {
            // The filter's count since it started; batches may arrive out of order.
            let seen = c.dropped.entry(batch.node.clone()).or_default();
            *seen = (*seen).max(batch.dropped);
        }
    }
}

/// A label value in Prometheus text: backslash, quote and newline escaped.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn lane_labels((p, k, m): &Lane) -> String {
    format!(
        "provider=\"{}\",key=\"{}\",model=\"{}\"",
        esc(p),
        esc(k),
        esc(m)
    )
}

/// A sample value: integers as such, the rest in Prometheus' float syntax.
fn num(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a metric family.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn histograms<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (String, &'a Histogram)>,
) {
    family(out, name, "histogram", help);
    for (labels, h) in series {
        let mut below = 0;
        for (bound, n) in h.bounds.iter().zip(h.buckets) {
            below += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{}\"}} {below}",
                num(*bound)
            );
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", num(h.sum));
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
    }
}

/// A counter family by lane, of the lanes `value` has a figure for.
fn lane_counters<T: std::fmt::Display>(
    out: &mut String,
    name: &str,
    help: &str,
    lanes: &BTreeMap<Lane, LaneSeries>,
    value: impl Fn(&LaneSeries) -> Option<T>,
) {
    family(out, name, "counter", help);
    for (lane, series) in lanes {
        if let Some(v) = value(series) {
            let _ = writeln!(out, "{name}{{{}}} {v}", lane_labels(lane));
        }
    }
}

/// A family whose series differ by one label.
fn by_one_label<'a, T: std::fmt::Display + 'a>(
    out: &mut String,
    (name, kind): (&str, &str),
    help: &str,
    label: &str,
    series: impl Iterator<Item = (&'a str, T)>,
) {
    family(out, name, kind, help);
    for (value, v) in series {
        let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {v}", esc(value));
    }
}

impl Metrics {
    /// The exposition text for the counters, the current snapshot and the open sync streams.
    pub fn render(&self, update: &pb::StateUpdate) -> String {
        self.render_with(update, &crate::api::sync::watching())
    }

    fn render_with(
        &self,
        update: &pb::StateUpdate,
        watching: &[crate::api::sync::Watching],
    ) -> String {
        let mut out = String::new();
        {
            let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
            calls_and_attempts(&mut out, &c);
            latencies(&mut out, &c);
            usage(&mut out, &c);
            refusals_caches_and_drops(&mut out, &c);
        }
        pushed_state(&mut out, update);
        sync_streams(&mut out, update, watching);
        crate::store::health::render(&mut out, family);
        crate::store::minute_calls::render(&mut out, family);
        crate::api::shares::render(&mut out, family);
        out
    }
}

/// Client calls and attempts counted from the reports.
fn calls_and_attempts(out: &mut String, c: &Counters) {
    family(
        out,
        "ai_router_requests_total",
        "counter",
        "Client calls by operation, client protocol (chat, responses, messages, embeddings), final provider and model, and outcome (success, error:<class> or rejected:<code>).",
    );
    let calls = c.calls.iter().flat_map(|(call, s)| {
        s.outcomes
            .iter()
            .map(move |(outcome, n)| (call, outcome, n))
    });
    for (call, outcome, n) in calls {
        let _ = writeln!(
            out,
            "ai_router_requests_total{{{},outcome=\"{}\"}} {n}",
            call_labels(call),
            esc(outcome)
        );
    }
    family(
        out,
        "ai_router_attempts_total",
        "counter",
        "Attempts by lane (provider, key alias, model), outcome and failure class.",
    );
    let attempts = c
        .lanes
        .iter()
        .flat_map(|(lane, s)| s.attempts.iter().map(move |(labels, n)| (lane, labels, n)));
    for (lane, (outcome, class), n) in attempts {
        let _ = writeln!(
            out,
            "ai_router_attempts_total{{{},outcome=\"{}\",class=\"{}\"}} {n}",
            lane_labels(lane),
            esc(outcome),
            esc(class)
        );
    }
}

/// The latency histograms: time to first token, attempt and call durations, the overhead.
fn latencies(out: &mut String, c: &Counters) {
    histograms(
        out,
        "ai_router_time_to_first_token_seconds",
        "Time from sending a successful stream attempt to its first token, by lane.",
        c.lanes
            .iter()
            .filter_map(|(l, s)| Some((lane_labels(l), s.first_token.as_ref()?))),
    );
    histograms(
        out,
        "ai_router_attempt_duration_seconds",
        "Time from sending an attempt to its answer or failure (every attempt but successful streams), by lane.",
        c.lanes
            .iter()
            .filter_map(|(l, s)| Some((lane_labels(l), s.attempt_duration.as_ref()?))),
    );
    histograms(
        out,
        "ai_router_request_duration_seconds",
        "Whole duration of client calls, by operation, client protocol, final provider and model.",
        c.calls
            .iter()
            .map(|(call, s)| (call_labels(call), &s.duration)),
    );
    histograms(
        out,
        "ai_router_overhead_seconds",
        "What the gateway added to calls a provider took part in: the time to the answer's first byte less the time the providers held the attempts, by client protocol and outcome.",
        c.overhead.iter().map(|((protocol, outcome), h)| {
            (
                format!(
                    "protocol=\"{}\",outcome=\"{}\"",
                    esc(protocol),
                    esc(outcome)
                ),
                h,
            )
        }),
    );
}

/// Tokens and estimated cost, by lane.
fn usage(out: &mut String, c: &Counters) {
    lane_counters(
        out,
        "ai_router_prompt_tokens_total",
        "Prompt tokens the providers reported, by lane.",
        &c.lanes,
        |s| Some(s.tokens?[0]),
    );
    lane_counters(
        out,
        "ai_router_completion_tokens_total",
        "Completion tokens the providers reported, by lane.",
        &c.lanes,
        |s| Some(s.tokens?[1]),
    );
    lane_counters(
        out,
        "ai_router_cached_tokens_total",
        "Of the prompt tokens, those the providers served from their cache, by lane.",
        &c.lanes,
        |s| Some(s.tokens?[2]),
    );
    lane_counters(
        out,
        "ai_router_estimated_cost_total",
        "Estimated cost of the reported usage at the models' configured prices, by lane.",
        &c.lanes,
        |s| s.cost,
    );
}

/// Quota refusals, budget warnings, the response cache and what the outboxes dropped.
fn refusals_caches_and_drops(out: &mut String, c: &Counters) {
    by_one_label(
        out,
        ("ai_router_quota_refusals_total", "counter"),
        "Calls refused by a virtual key's quota, by error code.",
        "code",
        c.quota_refusals.iter().map(|(k, n)| (k.as_str(), n)),
    );
    family(
        out,
        "ai_router_budget_warnings_total",
        "counter",
        "Answers that carried x-ai-router-budget-warning, by budget and level (warn: past its warnAt, over: past a soft limit).",
    );
    for ((budget, level), n) in &c.budget_warnings {
        let _ = writeln!(
            out,
            "ai_router_budget_warnings_total{{budget=\"{}\",level=\"{}\"}} {n}",
            esc(budget),
            esc(level)
        );
    }
    by_one_label(
        out,
        ("ai_router_cache_lookups_total", "counter"),
        "Calls the response cache was on for, by result (hit: answered from the cache, miss, bypass: the client's Cache-Control).",
        "result",
        c.cache_lookups.iter().map(|(k, n)| (*k, n)),
    );
    by_one_label(
        out,
        ("ai_router_cache_stores_total", "counter"),
        "What became of the answers of cache misses, by outcome (stored, unstorable: failed, empty, truncated or a stream that broke off, too_large).",
        "outcome",
        c.cache_stores.iter().map(|(k, n)| (*k, n)),
    );
    by_one_label(
        out,
        ("ai_router_report_dropped_total", "counter"),
        "Outcomes an Envoy's report outbox dropped (full), the most it reported, by node.",
        "node",
        c.dropped.iter().map(|(k, n)| (k.as_str(), n)),
    );
}

/// Gauges of the pushed state: its version, breakers not closed, budgets past warnAt, keys out.
fn pushed_state(out: &mut String, update: &pb::StateUpdate) {
    let snapshot = update.snapshot.clone().unwrap_or_default();
    family(
        out,
        "ai_router_state_version",
        "gauge",
        "The version of the state pushed to Envoy.",
    );
    let _ = writeln!(out, "ai_router_state_version {}", update.version);
    family(
        out,
        "ai_router_breaker_open",
        "gauge",
        "Breakers that are not closed (1 open, 0.5 half-open), by scope, provider and key alias.",
    );
    for b in &snapshot.breakers {
        let v = if breaker_is_open(b) { "1" } else { "0.5" };
        let _ = writeln!(
            out,
            "ai_router_breaker_open{{scope=\"{}\",provider=\"{}\",key=\"{}\"}} {v}",
            esc(breaker_scope_label(b)),
            esc(&b.provider),
            esc(&b.key)
        );
    }
    family(
        out,
        "ai_router_budget_state",
        "gauge",
        "Budgets past their warnAt (1) or their limit (2) in the current window, by budget and subject (key id, profile, provider; empty for the pool).",
    );
    for b in snapshot.budgets.iter().flat_map(|b| b.states.iter()) {
        let v = if b.level() == pb::BudgetLevel::Over {
            2
        } else {
            1
        };
        let _ = writeln!(
            out,
            "ai_router_budget_state{{budget=\"{}\",subject=\"{}\"}} {v}",
            esc(&b.name),
            esc(&b.subject)
        );
    }
    family(
        out,
        "ai_router_key_out",
        "gauge",
        "Provider keys out of rotation (1 each), by provider, key alias and reason.",
    );
    for h in &snapshot.key_health {
        let _ = writeln!(
            out,
            "ai_router_key_out{{provider=\"{}\",key=\"{}\",reason=\"{}\"}} 1",
            esc(&h.provider),
            esc(&h.key),
            esc(key_out_reason_label(h))
        );
    }
}

/// The sync streams: connections and state age per node, messages and bytes sent.
fn sync_streams(
    out: &mut String,
    update: &pb::StateUpdate,
    watching: &[crate::api::sync::Watching],
) {
    // Per node: open streams, and how stale the oldest is (0 while it holds the current
    // version; else the seconds since it last did).
    let mut nodes: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    for w in watching {
        let age = if w.version >= update.version {
            0.0
        } else {
            w.at.elapsed().as_secs_f64()
        };
        let n = nodes.entry(&w.node).or_default();
        n.0 += 1;
        n.1 = n.1.max(age);
    }
    by_one_label(
        out,
        ("ai_router_sync_connections", "gauge"),
        "Open sync (Watch) streams, by Envoy node.",
        "node",
        nodes.iter().map(|(node, (n, _))| (*node, n)),
    );
    by_one_label(
        out,
        ("ai_router_sync_state_age_seconds", "gauge"),
        "How stale an Envoy's state is: 0 while it holds the current version, else the seconds since it last did.",
        "node",
        nodes.iter().map(|(node, (_, age))| (*node, age)),
    );
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
        family(out, name, "counter", help);
        for (kind, n) in ["snapshot", "delta"].into_iter().zip(counts) {
            let _ = writeln!(out, "{name}{{kind=\"{kind}\"}} {}", load(n));
        }
    }
}

/// `GET /metrics` on the engine and the counters.
pub fn routes(engine: Arc<Engine>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(render))
        .with_state((engine, metrics))
}

async fn render(State((engine, metrics)): State<(Arc<Engine>, Arc<Metrics>)>) -> impl IntoResponse {
    let text = metrics.render(&engine.current_without_keys());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> String {
        let m = Metrics::default();
        m.observe(&pb::ReportBatch {
            node: "envoy-1".into(),
            dropped: 3,
            batch_id: String::new(),
            requests: vec![
                pb::RequestOutcome {
                    operation: "chat".into(),
                    protocol: "messages".into(),
                    provider: "p".into(),
                    model: "m".into(),
                    outcome: pb::RequestResult::Success.into(),
                    latency_ms: 120,
                    overhead_us: Some(300),
                    cache_lookup: pb::CacheLookup::Miss.into(),
                    cache_store: pb::CacheStore::Stored.into(),
                    ..Default::default()
                },
                pb::RequestOutcome {
                    operation: "chat".into(),
                    outcome: pb::RequestResult::Rejected.into(),
                    rejected_code: "tokens_per_day_exceeded".into(),
                    ..Default::default()
                },
                pb::RequestOutcome {
                    operation: "chat".into(),
                    outcome: pb::RequestResult::Rejected.into(),
                    rejected_code: "invalid_api_key".into(),
                    ..Default::default()
                },
            ],
            attempts: vec![
                // Reported before lane a's error and before lanes that sort first: the series
                // follow the lanes' and the labels' order, not the reports'.
                pb::AttemptOutcome {
                    provider: "p".into(),
                    key: "a".into(),
                    model: "m".into(),
                    outcome: pb::AttemptResult::Success.into(),
                    latency_ms: 30,
                    stream: true,
                    ..Default::default()
                },
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
                    stream: true,
                    usage: Some(pb::Usage {
                        prompt_tokens: 10,
                        completion_tokens: 4,
                        cached_tokens: 2,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                pb::AttemptOutcome {
                    provider: "p".into(),
                    key: "0".into(),
                    model: "m".into(),
                    outcome: pb::AttemptResult::Error.into(),
                    error_class: pb::ErrorClass::Timeout.into(),
                    latency_ms: 900,
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        // An older batch of the same node does not lower its count.
        m.observe(&pb::ReportBatch {
            node: "envoy-1".into(),
            dropped: 1,
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
        let watching = [
            crate::api::sync::Watching {
                node: "envoy-1".into(),
                version: 7,
                at: std::time::Instant::now(),
            },
            crate::api::sync::Watching {
                node: "envoy-2".into(),
                version: 6,
                at: std::time::Instant::now() - std::time::Duration::from_secs(5),
            },
        ];
        m.render_with(&update, &watching)
    }

    /// A lane's families list it only once it has a figure there: the failed attempt's lane
    /// has a duration but no first token and no tokens, the stream's the other way round;
    /// the series follow the lanes' order.
    #[test]
    fn a_lane_appears_in_the_families_it_has_figures_for_in_lane_order() {
        let text = sample();
        let series = |family: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with(family) && !l.contains("_bucket"))
                .map(|l| {
                    let key = l.split("key=\"").nth(1).unwrap_or("");
                    key.split('"').next().unwrap_or("").to_string()
                })
                .collect()
        };
        assert_eq!(
            series("ai_router_attempts_total{"),
            ["0", "a", "a", "b"],
            "{text}"
        );
        // Within a lane, by outcome then class.
        let lane_a: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("ai_router_attempts_total{") && l.contains("key=\"a\""))
            .collect();
        assert_eq!(
            lane_a,
            [
                "ai_router_attempts_total{provider=\"p\",key=\"a\",model=\"m\",outcome=\"error\",class=\"rate_limit\"} 1",
                "ai_router_attempts_total{provider=\"p\",key=\"a\",model=\"m\",outcome=\"success\",class=\"\"} 1",
            ],
            "{text}"
        );
        assert_eq!(
            series("ai_router_attempt_duration_seconds_count{"),
            ["0", "a"]
        );
        assert_eq!(
            series("ai_router_time_to_first_token_seconds_count{"),
            ["a", "b"]
        );
        for family in [
            "ai_router_prompt_tokens_total{",
            "ai_router_completion_tokens_total{",
            "ai_router_cached_tokens_total{",
        ] {
            assert_eq!(series(family), ["b"], "{family}");
        }
        // No engine, no prices: no cost series.
        assert!(series("ai_router_estimated_cost_total{").is_empty());
    }

    #[test]
    fn counts_reports_and_renders_prometheus_text() {
        let text = sample();
        for line in [
            "ai_router_requests_total{operation=\"chat\",protocol=\"messages\",provider=\"p\",model=\"m\",outcome=\"success\"} 1",
            "ai_router_attempts_total{provider=\"p\",key=\"a\",model=\"m\",outcome=\"error\",class=\"rate_limit\"} 1",
            // A successful stream attempt's latency is its time to the first token.
            "ai_router_time_to_first_token_seconds_bucket{provider=\"p\",key=\"b\",model=\"m\",le=\"0.05\"} 0",
            "ai_router_time_to_first_token_seconds_bucket{provider=\"p\",key=\"b\",model=\"m\",le=\"0.1\"} 1",
            "ai_router_time_to_first_token_seconds_sum{provider=\"p\",key=\"b\",model=\"m\"} 0.06",
            "ai_router_attempt_duration_seconds_count{provider=\"p\",key=\"a\",model=\"m\"} 1",
            "ai_router_request_duration_seconds_bucket{operation=\"chat\",protocol=\"messages\",provider=\"p\",model=\"m\",le=\"+Inf\"} 1",
            // 300 µs of overhead, over 200 µs and under 400; the refusals had none.
            "ai_router_overhead_seconds_bucket{protocol=\"messages\",outcome=\"success\",le=\"0.0002\"} 0",
            "ai_router_overhead_seconds_bucket{protocol=\"messages\",outcome=\"success\",le=\"0.0004\"} 1",
            "ai_router_overhead_seconds_sum{protocol=\"messages\",outcome=\"success\"} 0.0003",
            "ai_router_overhead_seconds_count{protocol=\"messages\",outcome=\"success\"} 1",
            "ai_router_prompt_tokens_total{provider=\"p\",key=\"b\",model=\"m\"} 10",
            "ai_router_completion_tokens_total{provider=\"p\",key=\"b\",model=\"m\"} 4",
            "ai_router_cached_tokens_total{provider=\"p\",key=\"b\",model=\"m\"} 2",
            "ai_router_quota_refusals_total{code=\"tokens_per_day_exceeded\"} 1",
            "ai_router_report_dropped_total{node=\"envoy-1\"} 3",
            "ai_router_cache_lookups_total{result=\"miss\"} 1",
            "ai_router_cache_stores_total{outcome=\"stored\"} 1",
            "ai_router_state_version 7",
            "ai_router_breaker_open{scope=\"key\",provider=\"p\",key=\"a\\\"x\"} 1",
            "ai_router_sync_connections{node=\"envoy-2\"} 1",
            "ai_router_sync_state_age_seconds{node=\"envoy-1\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
        }
        assert!(
            !text.contains("ai_router_quota_refusals_total{code=\"invalid_api_key\"}"),
            "not a quota:\n{text}"
        );
        assert!(
            !text.contains("ai_router_overhead_seconds_count{protocol=\"\""),
            "a refused call has no overhead:\n{text}"
        );
        let age: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("ai_router_sync_state_age_seconds{node=\"envoy-2\"} "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no age of envoy-2 in\n{text}"));
        assert!((5.0..60.0).contains(&age), "{age}");
    }

    /// Debian's `prometheus` package (scripts/setup.sh) provides `promtool`.
    #[test]
    fn promtool_accepts_the_text() {
        use std::io::Write as _;
        let mut child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool (Debian's prometheus package, scripts/setup.sh) is needed");
        let text = sample();
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write to promtool");
        let out = child.wait_with_output().expect("promtool runs");
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "promtool check metrics: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
