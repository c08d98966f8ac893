use super::*;
use crate::attempt::testkit::*;

fn one_pass(hosts: &[&str]) -> OnePass {
    OnePass {
        hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        retries: 3,
    }
}

/// The call as the front leaves it: its plan, its request id, its first lane reserved.
fn reserved(plan: &Plan) -> (FakeHost, Option<String>) {
    let mut host = host_with(snapshot(), plan, 1);
    host.add(Side::Request, "x-request-id", b"rid-1");
    host.add(Side::Request, "authorization", b"Bearer vk-client");
    let state = host.state().unwrap();
    let authority = reserve(&mut host, plan, &state, &one_pass(&["p1.test:8000"]));
    (host, authority)
}

#[test]
fn the_front_reserves_a_ready_plain_lane_on_a_host_resolved_at_start() {
    let plan = plan(false);
    let (host, authority) = reserved(&plan);
    assert_eq!(authority.as_deref(), Some("p1.test:8000"));
    let first = host.calls.get("call-1").and_then(|c| c.first.clone());
    assert_eq!(
        first.map(|f| f.lane),
        Some(crate::vocab::LaneId::new("p1", "a", "m1"))
    );
    assert_eq!(host.lanes.sent_since("p1", "a", "m1", NOW - 1_000), (1, 10));
}

#[test]
fn the_front_leaves_to_the_attempt_listener_what_one_pass_cannot_take() {
    let plan4 = plan(false);
    let try_with = |snap: Snapshot, plan: &Plan, hosts: &[&str]| {
        let mut host = host_with(snap, plan, 1);
        let state = host.state().unwrap();
        let out = reserve(&mut host, plan, &state, &one_pass(hosts));
        let reserved = host.lanes.sent_since("p1", "a", "m1", NOW - 1_000);
        (out, reserved)
    };
    // A host Envoy did not resolve at start.
    assert_eq!(
        try_with(snapshot(), &plan4, &["p2.test:8000"]),
        (None, (0, 0))
    );
    // A provider over TLS.
    let mut tls = snapshot();
    tls.providers[0].scheme = "https".into();
    assert_eq!(try_with(tls, &plan4, &["p1.test:8000"]), (None, (0, 0)));
    // More retries than the aggregate has priorities for.
    let mut many = plan(false);
    many.max_attempts = 5;
    assert_eq!(
        try_with(snapshot(), &many, &["p1.test:8000"]),
        (None, (0, 0))
    );
    // A request id another call of the VM holds: nothing stays reserved.
    let mut host = host_with(snapshot(), &plan4, 1);
    host.calls
        .insert("call-0".into(), crate::vm::call::Call::default());
    assert!(host.calls.claim_request_id("rid-1", "call-0"));
    let state = host.state().unwrap();
    assert_eq!(
        reserve(&mut host, &plan4, &state, &one_pass(&["p1.test:8000"])),
        None
    );
    assert_eq!(host.lanes.sent_since("p1", "a", "m1", NOW - 1_000), (0, 0));
}

#[test]
fn the_first_attempt_writes_the_front_s_lane_and_a_retry_gets_the_client_s_request_back() {
    let plan = plan(false);
    let (mut host, _) = reserved(&plan);
    let plan_text = host.text(Side::Request, PLAN_HEADER);
    let mut first = Attempt::upstream();
    assert_eq!(send(&mut first, &mut host), Flow::Continue);
    // The lane the front reserved, without picking again nor reserving twice.
    assert_eq!(host.lane_views, 1, "the front's pick only");
    assert_eq!(host.lanes.sent_since("p1", "a", "m1", NOW - 1_000), (1, 10));
    assert_eq!(
        host.text(Side::Request, "authorization").as_deref(),
        Some("Bearer sk-p1-a-secret")
    );
    assert_eq!(host.text(Side::Request, PLAN_HEADER), None);
    assert_eq!(
        host.text(Side::Request, CLUSTER_HEADER),
        None,
        "no route reads it"
    );
    assert_eq!(host.text(Side::Request, "cookie"), None);
    let call = host.calls.get("call-1").cloned().unwrap_or_default();
    assert!(call.first.is_none() && call.one_pass, "{call:?}");
    assert_eq!(call.tried, [crate::vocab::LaneId::new("p1", "a", "m1")]);

    // The router retries with the headers as the first attempt left them: the upstream filter
    // puts the client's back and stays out of the way.
    host.set_header(Side::Request, "x-envoy-attempt-count", Some("2"));
    let mut retry = Attempt::upstream();
    assert_eq!(retry.on_request_headers(&mut host, false), Flow::Continue);
    assert_eq!(host.text(Side::Request, PLAN_HEADER), plan_text);
    assert_eq!(
        host.text(Side::Request, "authorization").as_deref(),
        Some("Bearer vk-client")
    );
    assert_eq!(
        host.text(Side::Request, ":path").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(
        host.text(Side::Request, "cookie").as_deref(),
        Some("session=client")
    );
    assert_eq!(
        host.text(Side::Request, "x-envoy-attempt-count").as_deref(),
        Some("2")
    );
    let size = host.request_body.len();
    assert_eq!(retry.on_request_body(&mut host, size, true), Flow::Continue);
    host.add(Side::Response, ":status", b"429");
    assert_eq!(retry.on_response_headers(&mut host, false), Flow::Continue);
    assert_eq!(retry.on_response_body(&mut host, 10, true), Flow::Continue);
    assert_eq!(
        host.text(Side::Response, H_RETRY),
        None,
        "not its answer to judge"
    );
    let before = host.attempts.len();
    retry.on_log(&mut host);
    assert_eq!(
        host.attempts.len(),
        before,
        "the attempt listener reports its attempt"
    );
}

#[test]
fn a_first_attempt_with_no_lane_reserved_never_sends_the_client_s_request() {
    let plan = plan(false);
    let mut host = host_with(snapshot(), &plan, 1);
    host.add(Side::Request, "authorization", b"Bearer vk-client");
    let mut stage = Attempt::upstream();
    assert_eq!(send(&mut stage, &mut host), Flow::Pause);
    let answered = host.answered.as_ref().map(|a| a.status);
    assert_eq!(answered, Some(500), "answered in its place");
    assert_eq!(
        host.text(Side::Request, "authorization").as_deref(),
        Some("Bearer vk-client")
    );
}

#[test]
fn a_retry_of_a_one_pass_call_is_bounded_before_the_router_s_per_try_timeout() {
    let plan = plan(false);
    let mut host = host_with(snapshot(), &plan, 2);
    if let Some(c) = host.calls.get_mut("call-1") {
        c.one_pass = true;
    }
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(stage.bound.bound_ms, Some(NOW + 5 + plan.timeout_ms as i64));
    // A wait before the send counts: the router's per-try timer runs from the attempt's start.
    let mut host = host_with(snapshot(), &plan, 2);
    if let Some(c) = host.calls.get_mut("call-1") {
        c.one_pass = true;
        c.backoff_until_ms = NOW + 505;
    }
    let mut stage = Attempt::default();
    assert_eq!(
        send(&mut stage, &mut host),
        Flow::Pause,
        "waits for the backoff"
    );
    host.now = NOW + 505;
    let token = host.next_token;
    stage.on_http_call_response(&mut host, token);
    assert_eq!(stage.bound.bound_ms, Some(NOW + 5 + plan.timeout_ms as i64));
    // The first attempt itself has no bound of its own before its first token: the router's
    // per-try timeout is the one that can retry it.
    let (mut host, _) = reserved(&plan);
    let mut first = Attempt::upstream();
    assert_eq!(send(&mut first, &mut host), Flow::Continue);
    assert_eq!(first.bound.bound_ms, None);
    host.now = NOW + 5 + plan.timeout_ms as i64;
    first.on_log(&mut host);
    assert_eq!(host.attempts.len(), 1);
    assert_eq!(host.attempts[0].error_class().text(), "timeout");
}

#[test]
fn a_call_one_pass_does_not_take_leaves_its_trail_to_the_attempt_listener() {
    let plan = plan(false);
    // p1's only lane cools down: the pick passes over it to p2, whose host one pass cannot
    // reach. The lane passed over is noted once, by the attempt listener's pick, not here.
    let mut snap = snapshot();
    snap.cooldowns.push(LaneCooldown {
        provider: "p1".into(),
        key: "a".into(),
        model: "m1".into(),
        until_ms: NOW + 60_000,
    });
    let mut host = host_with(snap.clone(), &plan, 1);
    let state = host.state().unwrap();
    assert_eq!(
        reserve(&mut host, &plan, &state, &one_pass(&["p1.test:8000"])),
        None
    );
    let call = host.calls.get("call-1").unwrap();
    assert!(call.trail.skipped.is_empty(), "{:?}", call.trail.skipped);
    assert!(call.first.is_none());
    assert_eq!(host.lanes.sent_since("p2", "c", "m2", NOW - 1_000), (0, 0));

    // A call whose providers one pass reaches none of is not picked at all: no lane read, no
    // random draw.
    let mut host = host_with(snap.clone(), &plan, 1);
    let state = host.state().unwrap();
    host.reset_tallies();
    assert_eq!(
        reserve(&mut host, &plan, &state, &one_pass(&["elsewhere.test:80"])),
        None
    );
    assert_eq!(host.host_calls_total(), 0, "{:?}", host.host_calls());

    // Taken, the pass notes what its pick passed over.
    let mut host = host_with(snap, &plan, 1);
    let state = host.state().unwrap();
    assert_eq!(
        reserve(&mut host, &plan, &state, &one_pass(&["p2.test:8000"])).as_deref(),
        Some("p2.test:8000")
    );
    let call = host.calls.get("call-1").unwrap();
    assert_eq!(call.trail.skipped.len(), 1);
    assert_eq!(call.trail.skipped[0].provider, "p1");
}
