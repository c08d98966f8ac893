//! OpenTelemetry traces through a real Envoy, received by a real OTLP/gRPC receiver the test
//! runs (the `TraceService` of OpenTelemetry's official protobuf definitions, crate
//! `opentelemetry-proto`, served by tonic): one span per call after the GenAI semantic
//! conventions with a child per attempt, under the client's `traceparent`, carrying its
//! `tracestate`; both headers reach every provider the call tries.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ai_router_e2e::{poll, script, Gateway};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;

/// An OTLP/gRPC trace receiver: keeps every span it is sent, with its resource's service name.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
                .map(|v| format!("{v:?}"))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                spans.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn start_receiver() -> (Receiver, std::net::SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let receiver = Receiver::default();
    let service = TraceServiceServer::new(receiver.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    (receiver, addr)
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn text(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(Any::StringValue(s)) => s.clone(),
        other => panic!("{key} is not text on {}: {other:?}", span.name),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(Any::IntValue(n)) => *n,
        other => panic!("{key} is not an integer on {}: {other:?}", span.name),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_a_span_with_a_child_per_attempt_under_the_clients_traceparent() {
    let (receiver, addr) = start_receiver().await;
    let gw = Gateway::start_with("traces_otlp", |p1, p2| {
        format!(
            "{}telemetry:\n  otlp: {{ endpoint: 'http://{addr}' }}\n",
            ai_router_e2e::standard_pool(p1, p2)
        )
    })
    .await
    .expect("fixture");
    // p1's keys fail (a provider error), p2 answers with usage: a failover across providers.
    gw.mock1
        .always(script::status(
            503,
            json!({}),
            Some(json!({ "error": { "message": "overloaded", "type": "server_error", "param": null, "code": null } })),
        ))
        .await
        .unwrap();
    gw.mock2
        .always(json!({ "text": "hi", "usage": { "prompt_tokens": 11, "completion_tokens": 7 } }))
        .await
        .unwrap();

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let tracestate = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
    let resp = ai_router_e2e::http_client()
        .unwrap()
        .post(format!("{}/v1/chat/completions", gw.envoy.base_url()))
        .bearer_auth(&gw.virtual_key)
        .header("traceparent", format!("00-{trace_id}-{parent}-01"))
        .header("tracestate", tracestate)
        .json(&ai_router_e2e::chat_body("chat", false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let request_id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap()
        .to_string();
    // And one call without a traceparent: a trace of its own.
    assert_eq!(gw.chat("chat").await.unwrap().status, 200);

    let spans = poll(
        "the call's spans at the receiver",
        Duration::from_secs(20),
        || async {
            let spans = receiver.spans.lock().unwrap().clone();
            let call = spans.iter().find(|(_, s)| {
                attr(s, "ai_router.request_id") == Some(&Any::StringValue(request_id.clone()))
            });
            let Some((_, call)) = call else {
                return Ok(None);
            };
            let children: Vec<Span> = spans
                .iter()
                .filter(|(_, s)| s.parent_span_id == call.span_id)
                .map(|(_, s)| s.clone())
                .collect();
            let want = usize::try_from(int(call, "ai_router.attempts")).unwrap_or(0);
            Ok((children.len() == want && want > 0)
                .then(|| (spans.clone(), call.clone(), children)))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.tails()));
    let (all, call, mut attempts) = spans;
    assert!(
        all.iter().all(|(service, _)| service.contains("ai-router")),
        "service.name"
    );

    // The call: a child of the client's span, in its trace.
    assert_eq!(hex(&call.trace_id), trace_id);
    assert_eq!(hex(&call.parent_span_id), parent);
    assert_eq!(call.trace_state, tracestate, "the client's tracestate");
    assert_eq!(call.name, "chat chat");
    assert_eq!(text(&call, "gen_ai.operation.name"), "chat");
    assert_eq!(text(&call, "gen_ai.request.model"), "chat");
    assert_eq!(text(&call, "gen_ai.response.model"), "m2");
    assert_eq!(text(&call, "gen_ai.provider.name"), "p2");
    assert_eq!(int(&call, "gen_ai.usage.input_tokens"), 11);
    assert_eq!(int(&call, "gen_ai.usage.output_tokens"), 7);
    assert_eq!(text(&call, "ai_router.outcome"), "success");
    assert!(call.end_time_unix_nano >= call.start_time_unix_nano);

    // Its attempts: p1's failed, then p2's answer, each with its lane and latency.
    attempts.sort_by_key(|s| int(s, "ai_router.attempt"));
    let last = attempts.last().unwrap();
    assert_eq!(text(last, "gen_ai.provider.name"), "p2");
    assert_eq!(text(last, "ai_router.key"), "c");
    assert_eq!(text(last, "gen_ai.request.model"), "m2");
    assert_eq!(int(last, "http.response.status_code"), 200);
    for failed in &attempts[..attempts.len() - 1] {
        assert_eq!(text(failed, "gen_ai.provider.name"), "p1");
        assert!(["a", "b"].contains(&text(failed, "ai_router.key").as_str()));
        assert_eq!(text(failed, "error.type"), "transient");
        assert_eq!(int(failed, "http.response.status_code"), 503);
    }
    assert!(attempts.len() >= 2, "a failover: {attempts:?}");
    for a in &attempts {
        assert_eq!(a.trace_id, call.trace_id);
        assert_eq!(a.trace_state, tracestate);
        assert!(int(a, "ai_router.latency_ms") >= 0);
    }

    // Both trace headers went on to every provider the call tried, as the client sent them.
    let mut tried = Vec::new();
    for mock in [&gw.mock1, &gw.mock2] {
        let traceparent = format!("00-{trace_id}-{parent}-01");
        tried.extend(mock.calls().await.unwrap().into_iter().filter(|c| {
            c.header_pairs()
                .iter()
                .any(|(k, v)| k == "traceparent" && *v == traceparent)
        }));
    }
    assert_eq!(
        tried.len(),
        attempts.len(),
        "every attempt carried the traceparent"
    );
    for c in &tried {
        let pairs = c.header_pairs();
        assert!(
            pairs
                .iter()
                .any(|(k, v)| k == "tracestate" && v == tracestate),
            "{pairs:?}"
        );
    }

    // The call without a traceparent has a trace of its own, with no parent.
    poll(
        "the second call's span",
        Duration::from_secs(20),
        || async {
            let spans = receiver.spans.lock().unwrap().clone();
            Ok(spans
                .iter()
                .any(|(_, s)| {
                    s.parent_span_id.is_empty()
                        && s.trace_id != call.trace_id
                        && s.trace_state.is_empty()
                })
                .then_some(()))
        },
    )
    .await
    .unwrap();

    // Aliases only: no secret and no prompt text in any span.
    let exported = format!("{:?}", receiver.spans.lock().unwrap());
    for (name, secret) in gw.secrets() {
        assert!(!exported.contains(secret), "{name} in the spans");
    }
    assert!(!exported.contains("Say hello"), "prompt text in the spans");
    gw.check_no_secrets_in_logs().unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
