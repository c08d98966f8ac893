use super::*;
use crate::attempt::testkit::*;

#[test]
fn two_workers_probe_a_parked_lane_once_per_interval_in_all_and_snap_back_together() {
    const INTERVAL: i64 = 1_000;
    let mut plan = plan(false);
    plan.reset_ms = INTERVAL as u64;
    let parked = crate::testing::SharedStore::default();
    let json = [("content-type", "application/json")];

    // Worker A's call fails on the first lane (p1): p1 is parked for both workers.
    let (mut a, mut failed) = worker_call(&parked, &plan, NOW);
    assert_eq!(sent_to(&a), "p1.test:8000");
    answer(
        &mut failed,
        &mut a,
        503,
        &json,
        r#"{"error":{"message":"overloaded"}}"#,
    );
    assert_eq!(a.text(Side::Response, H_RETRY).as_deref(), Some("1"));

    // Until the probe is due, both workers' calls go to p2.
    for i in 0..10 {
        let (host, _) = worker_call(&parked, &plan, NOW + 10 + i * 90);
        assert_eq!(sent_to(&host), "p2.test:8000", "call {i}");
    }

    // The probe is due: of many calls on both workers at once, exactly one probes p1.
    let due = NOW + INTERVAL;
    let mut calls: Vec<(FakeHost, Attempt)> =
        (0..10).map(|_| worker_call(&parked, &plan, due)).collect();
    let probes: Vec<usize> = (0..calls.len())
        .filter(|i| sent_to(&calls[*i].0) == "p1.test:8000")
        .collect();
    assert_eq!(probes.len(), 1, "one probe per interval in all");
    // Later in the same interval, still none.
    for t in [due + 1, due + INTERVAL - 1] {
        let (host, _) = worker_call(&parked, &plan, t);
        assert_eq!(sent_to(&host), "p2.test:8000", "at +{}", t - due);
    }

    // The probe answers: both workers' next calls snap back to p1.
    let (mut host, mut stage) = calls.swap_remove(probes[0]);
    host.now = due + 50;
    answer(&mut stage, &mut host, 200, &json, OK_BODY);
    for i in 0..4 {
        let (host, _) = worker_call(&parked, &plan, due + 60 + i);
        assert_eq!(sent_to(&host), "p1.test:8000", "call {i} after the probe");
    }
}

#[test]
fn a_failed_probe_parks_the_lane_for_another_interval() {
    const INTERVAL: i64 = 1_000;
    let mut plan = plan(false);
    plan.reset_ms = INTERVAL as u64;
    let parked = crate::testing::SharedStore::default();
    let json = [("content-type", "application/json")];
    let (mut host, mut stage) = worker_call(&parked, &plan, NOW);
    answer(&mut stage, &mut host, 503, &json, "{}");
    let (mut host, mut probe) = worker_call(&parked, &plan, NOW + INTERVAL);
    assert_eq!(sent_to(&host), "p1.test:8000");
    host.now = NOW + INTERVAL + 200;
    answer(&mut probe, &mut host, 503, &json, "{}");
    // Parked again from the probe's failure, a whole interval on.
    let (host, _) = worker_call(&parked, &plan, NOW + 2 * INTERVAL + 100);
    assert_eq!(sent_to(&host), "p2.test:8000");
    let (host, _) = worker_call(&parked, &plan, NOW + 2 * INTERVAL + 200);
    assert_eq!(sent_to(&host), "p1.test:8000");
}

#[test]
fn a_half_open_breaker_asks_for_the_probe_lease_and_a_refusal_moves_on() {
    let plan = plan(false);
    let mut snap = snapshot();
    snap.breakers.push(BreakerState {
        scope: ai_router_proto::v1::BreakerScope::Key.into(),
        provider: "p1".into(),
        key: "a".into(),
        state: ai_router_proto::v1::BreakerPhase::HalfOpen.into(),
        open_until_ms: NOW - 1_000,
    });
    let mut host = host_with(snap, &plan, 1);
    let mut stage = Attempt::default();
    assert_eq!(
        send(&mut stage, &mut host),
        Flow::Pause,
        "waits for the lease"
    );
    let Some(Dispatched::Grpc {
        method,
        metadata,
        message,
        ..
    }) = host.dispatched.last().cloned()
    else {
        panic!("a lease call: {:?}", host.dispatched);
    };
    assert_eq!(method, "Lease");
    assert!(metadata
        .iter()
        .any(|(k, _)| k == ai_router_contract::SYNC_TOKEN_METADATA));
    let asked = LeaseRequest::decode(message.as_slice()).unwrap_or_default();
    assert_eq!(asked.holder, ai_router_contract::probe_holder("rid-1", 1));
    // Refused: another call probes it. This attempt goes to p2 instead.
    host.grpc_body = Some(
        LeaseReply {
            granted: false,
            retry_at_ms: NOW + 60_000,
        }
        .encode_to_vec(),
    );
    let token = host.next_token;
    stage.on_grpc_call_response(&mut host, token, 0, 8);
    assert_eq!(host.resumed, 1);
    assert_eq!(
        host.text(Side::Request, ":authority").as_deref(),
        Some("p2.test:8000")
    );
    assert_eq!(
        host.text(Side::Request, "authorization").as_deref(),
        Some("Bearer sk-p2-c-secret")
    );
}

#[test]
fn a_single_lane_left_to_another_calls_probe_is_used_once_the_probe_closed_the_breaker() {
    let mut plan = plan(false);
    plan.tiers.truncate(1);
    let mut snap = snapshot();
    snap.breakers.push(BreakerState {
        scope: ai_router_proto::v1::BreakerScope::Key.into(),
        provider: "p1".into(),
        key: "a".into(),
        state: ai_router_proto::v1::BreakerPhase::HalfOpen.into(),
        open_until_ms: NOW - 1_000,
    });
    let mut host = host_with(snap, &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    host.grpc_body = Some(
        LeaseReply {
            granted: false,
            retry_at_ms: NOW + 60_000,
        }
        .encode_to_vec(),
    );
    let token = host.next_token;
    stage.on_grpc_call_response(&mut host, token, 0, 8);
    // Refused: the only lane is another call's probe; this one waits a moment.
    let Some(Dispatched::Http { .. }) = host.dispatched.last() else {
        panic!("a short wait: {:?}", host.dispatched);
    };
    assert_eq!(host.resumed, 0);
    // The probe succeeded: the next state has the breaker closed.
    host.state = Some(std::rc::Rc::new(State::new(2, snapshot())));
    host.now = NOW + 300;
    let token = host.next_token;
    stage.on_http_call_response(&mut host, token);
    assert_eq!(host.resumed, 1, "the call goes on at once");
    assert_eq!(
        host.text(Side::Request, ":authority").as_deref(),
        Some("p1.test:8000")
    );
}

#[test]
fn a_lane_back_before_the_deadline_is_waited_for() {
    let mut plan = plan(false);
    plan.tiers.truncate(1);
    let mut snap = snapshot();
    snap.cooldowns.push(LaneCooldown {
        provider: "p1".into(),
        key: "a".into(),
        model: "m1".into(),
        until_ms: NOW + 2_000,
    });
    let mut host = host_with(snap, &plan, 1);
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Pause);
    let Some(Dispatched::Http { cluster, .. }) = host.dispatched.last().cloned() else {
        panic!("a timer call: {:?}", host.dispatched);
    };
    assert_eq!(cluster, TIMER_CLUSTER);
    // The wait goes in slices: the first ends before the lane is back, and waits again.
    let (token, delay) = last_timer(&host);
    assert_eq!(delay, TIMER_SLICE_MS);
    host.now = NOW + 1_005;
    stage.on_http_call_response(&mut host, token);
    assert_eq!(host.resumed, 0, "still waiting");
    let (token, delay) = last_timer(&host);
    assert!((990..=1_000).contains(&delay), "{delay}");
    // The timer fires once the cooldown is over.
    host.now = NOW + 2_001;
    stage.on_http_call_response(&mut host, token);
    assert_eq!(host.resumed, 1);
    assert_eq!(
        host.text(Side::Request, ":authority").as_deref(),
        Some("p1.test:8000")
    );
}

#[test]
fn no_lane_left_is_the_final_error_never_retried() {
    let mut plan = plan(false);
    plan.tiers.truncate(1);
    let mut snap = snapshot();
    // Out far past the deadline.
    snap.cooldowns.push(LaneCooldown {
        provider: "p1".into(),
        key: "a".into(),
        model: "m1".into(),
        until_ms: NOW + 3_600_000,
    });
    let mut host = host_with(snap, &plan, 1);
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Pause);
    let answer = host.answered.clone().expect("a local answer");
    assert_eq!(
        answer.status, 500,
        "500 is never retried by the outer router"
    );
    assert_eq!(answer.header(H_FINAL_STATUS), Some("503"));
    assert_eq!(answer.json()["error"]["code"], "pool_rate_limited");
    assert!(answer.header(H_RETRY_AFTER).is_some());
    assert_eq!(answer.header(H_ATTEMPT), Some("0"), "nothing was sent");
}

#[test]
fn open_breakers_with_nothing_sent_are_pool_unavailable_after_zero_attempts() {
    let mut plan = plan(false);
    plan.tiers.truncate(1);
    let mut snap = snapshot();
    snap.breakers.push(BreakerState {
        scope: ai_router_proto::v1::BreakerScope::Provider.into(),
        provider: "p1".into(),
        key: String::new(),
        state: ai_router_proto::v1::BreakerPhase::Open.into(),
        open_until_ms: NOW + 3_600_000,
    });
    // The second attempt of a call whose first was sent and failed: that one did fail
    // upstream.
    for (sent, code, attempts) in [(0, "pool_unavailable", "0"), (1, "upstream_error", "1")] {
        let mut host = host_with(snap.clone(), &plan, sent + 1);
        if sent > 0 {
            let call = host.calls.get_mut(&plan.cid).unwrap();
            call.attempts = sent;
            call.last_failure = Some((ErrorClass::Transient, None));
        }
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Pause);
        let answer = host.answered.clone().expect("a local answer");
        assert_eq!(answer.json()["error"]["code"], code, "{sent} sent");
        assert_eq!(answer.header(H_ATTEMPT), Some(attempts));
        if sent == 0 {
            assert_eq!(answer.header(H_FINAL_STATUS), Some("503"));
            // Until the breaker lets a probe through.
            assert_eq!(answer.header(H_RETRY_AFTER), Some("3600"));
        }
    }
}
