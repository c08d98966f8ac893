//! What the attempt stage's tests share: a snapshot, a plan, a fake host with the call.

pub(super) use super::*;
pub(super) use crate::plan::{Candidate, Operation, Protocol};
pub(super) use crate::protocols::anthropic::ANTHROPIC_VERSION;
pub(super) use crate::state::State;
pub(super) use crate::testing::{Dispatched, FakeHost};
pub(super) use crate::vm::view::View;
pub(super) use ai_router_contract::headers::{LANE_MODEL as H_LANE_MODEL, RETRY as H_RETRY};
pub(super) use ai_router_proto::v1::{BreakerState, LaneCooldown, Provider, Snapshot};

pub(super) const NOW: i64 = 1_700_000_000_000;

pub(super) fn provider(id: &str, kind: ProviderKind, keys: &[&str], model: &str) -> Provider {
    crate::testing::provider_of_kind(id, kind, keys, model)
}

pub(super) fn snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    snap.providers
        .push(provider("p1", ProviderKind::OpenaiCompatible, &["a"], "m1"));
    snap.providers
        .push(provider("p2", ProviderKind::OpenaiCompatible, &["c"], "m2"));
    snap
}

pub(super) fn plan(stream: bool) -> Plan {
    Plan {
        cid: "call-1".into(),
        rid: "rid-1".into(),
        idempotency_key: "idem-1".into(),
        vk: "key_app".into(),
        op: Operation::Chat,
        stream,
        include_usage: false,
        tiers: vec![
            vec![Candidate {
                provider: "p1".into(),
                model: "m1".into(),
                weight: 1.0,
                when: Vec::new(),
            }],
            vec![Candidate {
                provider: "p2".into(),
                model: "m2".into(),
                weight: 1.0,
                when: Vec::new(),
            }],
        ],
        max_attempts: 4,
        timeout_ms: 10_000,
        deadline_ms: 30_000,
        started_ms: NOW,
        tokens: 10,
        protocol: Protocol::Chat,
        anthropic_version: None,
        anthropic_beta: None,
        count_tokens: false,
        json_array: false,
        session: None,
        profile: String::new(),
        prompt_cache: String::new(),
        prompt_tokens: 5,
        max_tokens: 5,
        reset_ms: 0,
        first_choice: None,
        trail: false,
        responses: None,
        body_top: None,
    }
}

/// A host holding attempt `n` of the call, as the outer router sends it.
pub(super) fn host_with(snap: Snapshot, plan: &Plan, n: u32) -> FakeHost {
    let mut host = FakeHost::with_state(State::new(1, snap));
    host.now = NOW + 5;
    host.calls
        .insert(plan.cid.clone(), crate::vm::call::Call::default());
    host.add(Side::Request, ":method", b"POST");
    host.add(Side::Request, ":path", b"/v1/chat/completions");
    host.add(Side::Request, ":authority", b"gateway");
    host.add(Side::Request, "content-type", b"application/json");
    host.add(Side::Request, "cookie", b"session=client");
    host.add(Side::Request, "openai-organization", b"org-client");
    host.add(
        Side::Request,
        "x-envoy-attempt-count",
        n.to_string().as_bytes(),
    );
    host.hand_plan(plan);
    let stream = if plan.stream { ",\"stream\":true" } else { "" };
    host.request_body =
        format!(r#"{{"model":"chat","messages":[{{"role":"user","content":"hi"}}]{stream}}}"#)
            .into_bytes();
    host
}

/// The delays of the timers the stage asked for, in order.
pub(super) fn timer_delays(host: &FakeHost) -> Vec<i64> {
    host.dispatched
        .iter()
        .filter_map(|d| match d {
            Dispatched::Http { cluster, headers } if cluster == TIMER_CLUSTER => headers
                .iter()
                .find(|(k, _)| k == "x-envoy-fault-delay-request")
                .and_then(|(_, v)| v.parse().ok()),
            _ => None,
        })
        .collect()
}

/// Runs the request phase; returns the flow of the body callback.
pub(super) fn send(stage: &mut Attempt, host: &mut FakeHost) -> Flow {
    assert_eq!(stage.on_request_headers(host, false), Flow::Pause);
    let size = host.request_body.len();
    stage.on_request_body(host, size, true)
}

/// The provider answers: headers, then the whole body in one callback.
pub(super) fn answer(
    stage: &mut Attempt,
    host: &mut FakeHost,
    status: u16,
    headers: &[(&str, &str)],
    body: &str,
) {
    host.add(Side::Response, ":status", status.to_string().as_bytes());
    for (k, v) in headers {
        host.add(Side::Response, k, v.as_bytes());
    }
    assert_eq!(stage.on_response_headers(host, false), Flow::Pause);
    host.response_body = body.as_bytes().to_vec();
    let size = host.response_body.len();
    assert_eq!(stage.on_response_body(host, size, true), Flow::Continue);
}

/// p1's keys `a` and `b` spend one scope `org`, which has 2 requests left (reported by
/// `a` for a call that began a second ago).
pub(super) fn scoped_snapshot() -> Snapshot {
    let mut snap = snapshot();
    snap.providers[0] = provider("p1", ProviderKind::OpenaiCompatible, &["a", "b"], "m1");
    for k in &mut snap.providers[0].keys {
        k.scope = "org".into();
    }
    snap.headroom.push(ai_router_proto::v1::Headroom {
        provider: "p1".into(),
        key: "a".into(),
        model: "m1".into(),
        remaining_requests: 2,
        remaining_tokens: -1,
        reset_at_ms: NOW + 60_000,
        scope: "org".into(),
        as_of_ms: NOW - 1_000,
        spent: false,
    });
    snap
}

/// p1/m1 and p2/m2 with these context windows.
pub(super) fn sized(small: u64, other: u64) -> Snapshot {
    let mut snap = snapshot();
    snap.providers[0].models[0].context_window = small;
    snap.providers[1].models[0].context_window = other;
    snap
}

/// The first attempt of a call, on p1, answered that the prompt is too long.
pub(super) fn too_long_on_p1(small: u64, other: u64) -> (Plan, FakeHost) {
    let plan = plan(false);
    let mut host = host_with(sized(small, other), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    let json = [("content-type", "application/json")];
    answer(&mut stage, &mut host, 400, &json, TOO_LONG);
    (plan, host)
}

pub(super) const TOO_LONG: &str = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;

/// One call's first attempt on a worker of an Envoy whose workers share `parked`.
pub(super) fn worker_call(
    parked: &crate::testing::SharedStore,
    plan: &Plan,
    now: i64,
) -> (FakeHost, Attempt) {
    let mut host = host_with(snapshot(), plan, 1);
    host.lanes.parked = parked.clone();
    host.now = now;
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    (host, stage)
}

pub(super) fn sent_to(host: &FakeHost) -> String {
    host.text(Side::Request, ":authority").unwrap_or_default()
}

pub(super) const OK_BODY: &str = r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;

/// The token of the last timer the stage asked for, and its delay.
pub(super) fn last_timer(host: &FakeHost) -> (u32, i64) {
    let delay = timer_delays(host).last().copied().unwrap_or(-1);
    (host.next_token, delay)
}

/// A stream attempt at p1 whose headers and role chunk arrived and are held.
pub(super) fn held_stream(host: &mut FakeHost, stage: &mut Attempt) {
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"text/event-stream");
    assert_eq!(stage.on_response_headers(host, false), Flow::Pause);
    let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    host.response_body = role.as_bytes().to_vec();
    assert_eq!(stage.on_response_body(host, role.len(), false), Flow::Pause);
}

/// `text` as one content chunk after the first token.
pub(super) fn chunk(stage: &mut Attempt, host: &mut FakeHost, text: &str) -> Flow {
    let event =
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n");
    if stage.answer.after_first_token {
        host.response_body = event.into_bytes();
    } else {
        host.response_body.extend_from_slice(event.as_bytes());
    }
    let size = host.response_body.len();
    stage.on_response_body(host, size, false)
}

/// Lets the clock run a tick at a time, checking the attempt's bound as the host does, until
/// `done` or `until`; returns the time it stopped at.
pub(super) fn run_ticks(
    stage: &mut Attempt,
    host: &mut FakeHost,
    until: i64,
    done: impl Fn(&FakeHost) -> bool,
) -> i64 {
    while !done(host) && host.now < until {
        host.now += BOUND_TICK_MS as i64;
        if stage.bound_due(host.now) {
            stage.on_bound(host);
        }
    }
    host.now
}

/// A stream attempt at p1 that sent its first token ("Hi").
pub(super) fn a_stream_past_its_first_token() -> (Plan, FakeHost, Attempt) {
    let plan = plan(true);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    held_stream(&mut host, &mut stage);
    assert_eq!(chunk(&mut stage, &mut host, "Hi"), Flow::Continue);
    (plan, host, stage)
}

/// A call of `protocol` with `body`, whose first lane is p1 of `kind`.
pub(super) fn ingress_call(
    kind: ProviderKind,
    protocol: Protocol,
    stream: bool,
    body: Value,
) -> (FakeHost, Attempt) {
    let mut snap = snapshot();
    snap.providers[0] = provider("p1", kind, &["a"], "m1");
    let mut plan = plan(stream);
    plan.protocol = protocol;
    plan.include_usage = true;
    plan.anthropic_version = Some("2024-10-22".into());
    plan.anthropic_beta = Some("prompt-caching-2024-07-31".into());
    let mut host = host_with(snap, &plan, 1);
    host.request_body = body.to_string().into_bytes();
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    (host, stage)
}

pub(super) fn path_of(host: &FakeHost) -> String {
    host.text(Side::Request, ":path").unwrap_or_default()
}

pub(super) fn sent(host: &FakeHost) -> Value {
    serde_json::from_slice(&host.request_body).unwrap_or(Value::Null)
}

pub(super) fn answered(host: &FakeHost) -> Value {
    serde_json::from_slice(&host.response_body).unwrap_or(Value::Null)
}

pub(super) fn messages_body(stream: bool) -> Value {
    serde_json::json!({ "model": "claude", "max_tokens": 256, "stream": stream,
        "system": [{ "type": "text", "text": "Be brief.", "cache_control": { "type": "ephemeral" } }],
        "thinking": { "type": "enabled", "budget_tokens": 128 },
        "messages": [{ "role": "user", "content": "Hi" }] })
}

pub(super) fn with_content(mut snap: Snapshot) -> Snapshot {
    snap.limits = Some(ai_router_proto::v1::Limits {
        include_content: true,
        ..Default::default()
    });
    snap
}
