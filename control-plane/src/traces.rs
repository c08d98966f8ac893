//! OpenTelemetry traces of the calls, after the GenAI semantic conventions, exported over
//! OTLP/gRPC to `telemetry.otlp.endpoint` (no traces without it).
//!
//! The spans are built here, in the control plane, from the outcomes Envoy already reports: one
//! span per call (kind server, `{operation} {requested model}`: `gen_ai.operation.name`,
//! `gen_ai.request.model`, `gen_ai.response.model`, `gen_ai.provider.name`,
//! `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `ai_router.outcome`, `error.type`
//! on a failure) with one child span per attempt (kind client: provider, key alias, model,
//! failure class, status, latency, usage). A client's W3C `traceparent` makes the call span its
//! child (same trace id, the client's span as parent); without one the trace id is derived from
//! the request id. Times are the reports': an outcome's `at_ms` is its end, minus its latency
//! its start.
//!
//! A call's request outcome and its attempts may come in different report batches: a call is
//! exported once its request outcome and as many attempts as it says arrived, or
//! [`HOLD_AFTER_REQUEST`] after its request outcome with what came. Attempts whose call never
//! reports are dropped after [`ORPHAN_AFTER`]. The observer never blocks the report path: past
//! [`QUEUE_BATCHES`] waiting batches, batches are dropped (counted in the log). An export that
//! fails is logged once per outage and its spans dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ai_router_proto::v1 as pb;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::engine::ReportObserver;

/// Report batches waiting for the exporter before new ones are dropped.
pub const QUEUE_BATCHES: usize = 4096;
/// How long a call whose request outcome came waits for the rest of its attempts.
pub const HOLD_AFTER_REQUEST: Duration = Duration::from_secs(5);
/// How long attempts wait for their call's request outcome.
pub const ORPHAN_AFTER: Duration = Duration::from_secs(60);
/// How often finished calls are exported.
pub const EXPORT_INTERVAL: Duration = Duration::from_millis(500);
/// `service.name` of the resource.
pub const SERVICE_NAME: &str = "ai-router";

/// Hands every report batch to the exporter task, never blocking.
pub struct TraceObserver {
    queue: mpsc::Sender<pb::ReportBatch>,
    dropped: AtomicU64,
}

impl ReportObserver for TraceObserver {
    fn observe(&self, batch: &pb::ReportBatch) {
        if self.queue.try_send(batch.clone()).is_err() {
            let before = self.dropped.fetch_add(1, Ordering::Relaxed);
            if before.is_power_of_two() || before == 0 {
                tracing::warn!(
                    dropped = before + 1,
                    "traces: the exporter is behind, report batches dropped"
                );
            }
        }
    }
}

/// The observer to attach to the engine, and the exporter task (until `shutdown` flips; it
/// exports what is finished then).
pub fn start(
    endpoint: &str,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<(Arc<TraceObserver>, tokio::task::JoinHandle<()>)> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| anyhow::anyhow!("telemetry.otlp.endpoint {endpoint:?}: {e}"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    let (queue, rx) = mpsc::channel(QUEUE_BATCHES);
    let observer = Arc::new(TraceObserver {
        queue,
        dropped: AtomicU64::new(0),
    });
    let client = TraceServiceClient::new(channel);
    let task = tokio::spawn(run_exporter(rx, client, endpoint.to_owned(), shutdown));
    tracing::info!(endpoint, "traces: exporting over OTLP/gRPC");
    Ok((observer, task))
}

async fn run_exporter(
    mut rx: mpsc::Receiver<pb::ReportBatch>,
    mut client: TraceServiceClient<tonic::transport::Channel>,
    endpoint: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut calls = Assembler::default();
    let mut tick = tokio::time::interval(EXPORT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        let last = tokio::select! {
            batch = rx.recv() => match batch {
                Some(batch) => { calls.add(&batch, Instant::now()); continue; }
                None => true,
            },
            _ = tick.tick() => false,
            _ = shutdown.changed() => true,
        };
        while let Ok(batch) = rx.try_recv() {
            calls.add(&batch, Instant::now());
        }
        let spans = calls.ready(Instant::now(), last);
        if !spans.is_empty() {
            match client.export(export_request(spans)).await {
                Ok(_) if failing => {
                    tracing::info!(%endpoint, "traces: the collector takes spans again");
                    failing = false;
                }
                Ok(_) => {}
                Err(status) if !failing => {
                    tracing::warn!(%endpoint, code = ?status.code(), "traces: the collector refused spans, dropped: {}", status.message());
                    failing = true;
                }
                Err(_) => {}
            }
        }
        if last || *shutdown.borrow() {
            break;
        }
    }
}

/// One export: the spans under the gateway's resource and scope.
pub fn export_request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![text("service.name", SERVICE_NAME)],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "ai-router".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

#[derive(Debug)]
struct Pending {
    attempts: Vec<pb::AttemptOutcome>,
    request: Option<pb::RequestOutcome>,
    since: Instant,
}

/// The calls whose outcomes are still coming in, by request id.
#[derive(Debug, Default)]
pub struct Assembler {
    calls: HashMap<String, Pending>,
}

impl Assembler {
    pub fn add(&mut self, batch: &pb::ReportBatch, now: Instant) {
        for attempt in batch.attempts.iter().filter(|a| !a.request_id.is_empty()) {
            self.entry(&attempt.request_id, now)
                .attempts
                .push(attempt.clone());
        }
        for request in batch.requests.iter().filter(|r| !r.request_id.is_empty()) {
            let call = self.entry(&request.request_id, now);
            call.request = Some(request.clone());
            call.since = now;
        }
    }

    fn entry(&mut self, id: &str, now: Instant) -> &mut Pending {
        self.calls.entry(id.to_owned()).or_insert_with(|| Pending {
            attempts: Vec::new(),
            request: None,
            since: now,
        })
    }

    /// The spans of every finished call (see the module docs); with `all`, of every call that
    /// has its request outcome.
    pub fn ready(&mut self, now: Instant, all: bool) -> Vec<Span> {
        let mut spans = Vec::new();
        self.calls.retain(|_, call| {
            let waited = now.saturating_duration_since(call.since);
            let Some(request) = &call.request else {
                return waited < ORPHAN_AFTER && !all;
            };
            let complete = call.attempts.len() as u64 >= u64::from(request.attempts);
            if complete || all || waited >= HOLD_AFTER_REQUEST {
                call.attempts.sort_by_key(|a| a.attempt);
                spans.extend(call_spans(request, &call.attempts));
                return false;
            }
            true
        });
        spans
    }
}

/// The call's span and one child per attempt.
pub fn call_spans(request: &pb::RequestOutcome, attempts: &[pb::AttemptOutcome]) -> Vec<Span> {
    let rid = &request.request_id;
    let (trace_id, parent) = match parse_traceparent(&request.traceparent) {
        Some((trace, parent)) => (trace.to_vec(), parent.to_vec()),
        None => (digest(&format!("trace:{rid}"), 16), Vec::new()),
    };
    // The client's vendor entries go with its trace (the front stage passes a tracestate only
    // with a valid traceparent); the gateway adds none.
    let trace_state = if parent.is_empty() {
        String::new()
    } else {
        request.tracestate.clone()
    };
    let call_id = digest(&format!("call:{rid}"), 8);
    let op = request.operation.as_str();
    let (input, output) = attempts
        .iter()
        .filter_map(|a| a.usage.as_ref())
        .fold((0, 0), |(i, o), u| {
            (i + u.prompt_tokens, o + u.completion_tokens)
        });
    let outcome = request.outcome_text();
    let failed = request.outcome() != pb::RequestResult::Success;
    let mut attributes = vec![
        text("gen_ai.operation.name", op),
        text("gen_ai.request.model", &request.requested_model),
        int("gen_ai.usage.input_tokens", input),
        int("gen_ai.usage.output_tokens", output),
        text("ai_router.outcome", &outcome),
        text("ai_router.request_id", rid),
        int("ai_router.attempts", u64::from(request.attempts)),
        int("http.response.status_code", u64::from(request.status)),
    ];
    if !request.model.is_empty() {
        attributes.push(text("gen_ai.response.model", &request.model));
    }
    if !request.provider.is_empty() {
        attributes.push(text("gen_ai.provider.name", &request.provider));
    }
    if let (true, (_, Some(detail))) = (failed, request.result_parts()) {
        attributes.push(text("error.type", detail));
    }
    let mut spans = vec![Span {
        trace_id: trace_id.clone(),
        span_id: call_id.clone(),
        parent_span_id: parent,
        trace_state: trace_state.clone(),
        name: span_name(op, &request.requested_model),
        kind: SpanKind::Server as i32,
        start_time_unix_nano: start_ns(request.at_ms, request.latency_ms),
        end_time_unix_nano: ms_to_ns(request.at_ms),
        attributes,
        status: Some(status(failed, &outcome)),
        ..Default::default()
    }];
    for a in attempts {
        let failed = a.outcome() != pb::AttemptResult::Success;
        let class = a.error_class().text();
        let mut attributes = vec![
            text("gen_ai.operation.name", op),
            text("gen_ai.provider.name", &a.provider),
            text("gen_ai.request.model", &a.model),
            text("ai_router.key", &a.key),
            int("ai_router.attempt", u64::from(a.attempt)),
            text("ai_router.outcome", a.outcome().text()),
            int("http.response.status_code", u64::from(a.status)),
            int("ai_router.latency_ms", a.latency_ms),
        ];
        if failed {
            attributes.push(text("error.type", class));
            attributes.push(text("ai_router.error_class", class));
        } else {
            attributes.push(text("gen_ai.response.model", &a.model));
        }
        if let Some(u) = &a.usage {
            attributes.push(int("gen_ai.usage.input_tokens", u.prompt_tokens));
            attributes.push(int("gen_ai.usage.output_tokens", u.completion_tokens));
        }
        spans.push(Span {
            trace_id: trace_id.clone(),
            span_id: digest(&format!("attempt:{rid}#{}", a.attempt), 8),
            parent_span_id: call_id.clone(),
            trace_state: trace_state.clone(),
            name: span_name(op, &a.model),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: start_ns(a.at_ms, a.latency_ms),
            end_time_unix_nano: ms_to_ns(a.at_ms),
            attributes,
            status: Some(status(failed, class)),
            ..Default::default()
        });
    }
    spans
}

/// The trace id and parent span id of a `traceparent` the filter passed on (it checked the
/// shape; this checks again, as the header came from a client).
pub fn parse_traceparent(value: &str) -> Option<([u8; 16], [u8; 8])> {
    let mut parts = value.trim().split('-');
    let (_version, trace, parent) = (parts.next()?, parts.next()?, parts.next()?);
    let trace: [u8; 16] = hex::decode(trace).ok()?.try_into().ok()?;
    let parent: [u8; 8] = hex::decode(parent).ok()?.try_into().ok()?;
    (trace != [0; 16] && parent != [0; 8]).then_some((trace, parent))
}

fn span_name(op: &str, model: &str) -> String {
    if model.is_empty() {
        op.to_owned()
    } else {
        format!("{op} {model}")
    }
}

fn status(failed: bool, message: &str) -> Status {
    Status {
        message: if failed {
            message.to_owned()
        } else {
            String::new()
        },
        code: if failed {
            StatusCode::Error as i32
        } else {
            StatusCode::Unset as i32
        },
    }
}

fn digest(seed: &str, len: usize) -> Vec<u8> {
    Sha256::digest(seed.as_bytes())[..len].to_vec()
}

fn ms_to_ns(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

fn start_ns(end_ms: i64, latency_ms: u64) -> u64 {
    ms_to_ns(end_ms).saturating_sub(latency_ms.saturating_mul(1_000_000))
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

fn int(key: &str, value: u64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(
                i64::try_from(value).unwrap_or(i64::MAX),
            )),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    fn s(v: &str) -> Option<any_value::Value> {
        Some(any_value::Value::StringValue(v.to_owned()))
    }

    fn outcomes() -> (pb::RequestOutcome, Vec<pb::AttemptOutcome>) {
        let request = pb::RequestOutcome {
            request_id: "r1".into(),
            operation: "chat".into(),
            outcome: pb::RequestResult::Success.into(),
            status: 200,
            attempts: 2,
            latency_ms: 300,
            provider: "p2".into(),
            model: "m2".into(),
            at_ms: 10_000,
            requested_model: "chat".into(),
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".into(),
            ..Default::default()
        };
        let failed = pb::AttemptOutcome {
            request_id: "r1".into(),
            attempt: 1,
            provider: "p1".into(),
            key: "a".into(),
            model: "m1".into(),
            outcome: pb::AttemptResult::Error.into(),
            error_class: pb::ErrorClass::RateLimit.into(),
            status: 429,
            latency_ms: 20,
            at_ms: 9_750,
            ..Default::default()
        };
        let answered = pb::AttemptOutcome {
            attempt: 2,
            provider: "p2".into(),
            key: "c".into(),
            model: "m2".into(),
            outcome: pb::AttemptResult::Success.into(),
            error_class: pb::ErrorClass::Unspecified.into(),
            status: 200,
            latency_ms: 200,
            at_ms: 9_990,
            usage: Some(pb::Usage {
                prompt_tokens: 11,
                completion_tokens: 7,
                cached_tokens: 0,
                ..Default::default()
            }),
            ..failed.clone()
        };
        (request, vec![failed, answered])
    }

    #[test]
    fn a_call_span_with_a_child_per_attempt_under_the_clients_trace() {
        let (request, attempts) = outcomes();
        let spans = call_spans(&request, &attempts);
        assert_eq!(spans.len(), 3);
        let call = &spans[0];
        assert_eq!(
            hex::encode(&call.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(hex::encode(&call.parent_span_id), "00f067aa0ba902b7");
        assert_eq!(call.name, "chat chat");
        assert_eq!(call.kind, SpanKind::Server as i32);
        assert_eq!(
            (call.start_time_unix_nano, call.end_time_unix_nano),
            (9_700_000_000, 10_000_000_000)
        );
        assert_eq!(attr(call, "gen_ai.operation.name").cloned(), s("chat"));
        assert_eq!(attr(call, "gen_ai.request.model").cloned(), s("chat"));
        assert_eq!(attr(call, "gen_ai.response.model").cloned(), s("m2"));
        assert_eq!(attr(call, "gen_ai.provider.name").cloned(), s("p2"));
        assert_eq!(
            attr(call, "gen_ai.usage.input_tokens"),
            Some(&any_value::Value::IntValue(11))
        );
        assert_eq!(
            attr(call, "gen_ai.usage.output_tokens"),
            Some(&any_value::Value::IntValue(7))
        );
        assert_eq!(attr(call, "ai_router.outcome").cloned(), s("success"));
        assert!(attr(call, "error.type").is_none());
        assert_eq!(call.trace_state, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
        for child in &spans[1..] {
            assert_eq!(
                child.trace_state, call.trace_state,
                "the client's tracestate"
            );
            assert_eq!(child.trace_id, call.trace_id);
            assert_eq!(child.parent_span_id, call.span_id);
            assert_eq!(child.kind, SpanKind::Client as i32);
        }
        let refused = &spans[1];
        assert_eq!(attr(refused, "ai_router.key").cloned(), s("a"));
        assert_eq!(attr(refused, "error.type").cloned(), s("rate_limit"));
        assert_eq!(
            refused.status.as_ref().map(|s| s.code),
            Some(StatusCode::Error as i32)
        );
        assert_ne!(spans[1].span_id, spans[2].span_id);
    }

    #[test]
    fn without_a_traceparent_the_trace_comes_from_the_request_id() {
        let (mut request, attempts) = outcomes();
        request.traceparent = "garbage".into();
        request.outcome = pb::RequestResult::Error.into();
        request.error_class = pb::ErrorClass::Transient.into();
        let spans = call_spans(&request, &attempts);
        assert!(spans[0].parent_span_id.is_empty());
        assert!(
            spans.iter().all(|s| s.trace_state.is_empty()),
            "no tracestate without the client's trace"
        );
        assert_eq!(spans[0].trace_id, call_spans(&request, &[])[0].trace_id);
        assert_eq!(attr(&spans[0], "error.type").cloned(), s("transient"));
        assert_eq!(
            attr(&spans[0], "ai_router.outcome").cloned(),
            s("error:transient")
        );
    }

    #[test]
    fn a_call_waits_for_its_attempts_across_batches() {
        let (request, attempts) = outcomes();
        let t0 = Instant::now();
        let mut calls = Assembler::default();
        calls.add(
            &pb::ReportBatch {
                attempts: attempts[..1].to_vec(),
                requests: vec![request.clone()],
                ..Default::default()
            },
            t0,
        );
        assert!(
            calls.ready(t0, false).is_empty(),
            "one attempt still to come"
        );
        calls.add(
            &pb::ReportBatch {
                attempts: attempts[1..].to_vec(),
                ..Default::default()
            },
            t0,
        );
        assert_eq!(calls.ready(t0, false).len(), 3);
        assert!(calls.calls.is_empty());
        // A call missing an attempt goes out after the hold with what it has.
        calls.add(
            &pb::ReportBatch {
                requests: vec![request],
                ..Default::default()
            },
            t0,
        );
        assert!(calls.ready(t0, false).is_empty());
        assert_eq!(calls.ready(t0 + HOLD_AFTER_REQUEST, false).len(), 1);
        // Attempts alone wait, then go.
        calls.add(
            &pb::ReportBatch {
                attempts,
                ..Default::default()
            },
            t0,
        );
        assert!(calls.ready(t0, false).is_empty());
        assert!(calls.ready(t0 + ORPHAN_AFTER, false).is_empty());
        assert!(calls.calls.is_empty());
    }
}
