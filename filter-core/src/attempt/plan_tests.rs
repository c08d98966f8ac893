//! The attempts of a call take the plan its front stage wrote, shared through the call's
//! bookkeeping, instead of decoding the plan's header again.

use super::testkit::*;
use crate::front::Front;
use crate::plan::Written;
use ai_router_proto::v1::VirtualKey;

const CLIENT_KEY: &str = "sk-starci-plan-0123456789";

/// The front stage's request phase of a client call to `m1` on `host`.
fn front_request(host: &mut FakeHost) -> Front {
    for (k, v) in [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-type", "application/json"),
        ("authorization", &format!("Bearer {CLIENT_KEY}")),
    ] {
        host.add(Side::Request, k, v.as_bytes());
    }
    host.request_body = br#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#.to_vec();
    let mut front = Front::default();
    front.on_request_headers(host, false);
    let size = host.request_body.len();
    assert_eq!(front.on_request_body(host, size, true), Flow::Continue);
    front
}

fn attempt_plan(host: &mut FakeHost, n: u32) -> Option<Rc<Plan>> {
    host.set_header(Side::Request, "x-envoy-attempt-count", Some(&n.to_string()));
    let mut stage = Attempt::default();
    stage.on_request_headers(host, false);
    stage.plan
}

#[test]
fn every_attempt_of_a_call_shares_the_plan_its_front_stage_wrote() {
    let mut snap = snapshot();
    snap.virtual_keys.push(VirtualKey {
        id: "key_plan".into(),
        sha256: ai_router_contract::sha256_hex(CLIENT_KEY.as_bytes()),
        profiles: vec!["*".into()],
        models: vec!["*".into()],
        enabled: true,
        ..Default::default()
    });
    let mut host = FakeHost::with_state(State::new(1, snap));
    front_request(&mut host);
    let ticket = host
        .text(Side::Request, PLAN_HEADER)
        .expect("a plan header");
    let cid = Written::cid_of(&ticket).expect("the call id").to_owned();
    let written = host
        .calls
        .get(&cid)
        .expect("the call in the table")
        .plan
        .clone()
        .expect("the plan kept in the call");
    assert_eq!(*written.ticket, *ticket);
    // The header names the plan; it does not carry it.
    assert!(ticket.len() < 40 && !ticket.contains('{'), "{ticket}");

    for n in 1..=3 {
        let plan = attempt_plan(&mut host, n).expect("a plan");
        assert!(
            Rc::ptr_eq(&plan, &written.plan),
            "attempt {n} took the written plan"
        );
    }

    // A ticket that is not the one written for its call names no plan: the attempt gives up.
    let forged = format!("{cid}.{:016x}", 7);
    host.set_header(Side::Request, PLAN_HEADER, Some(&forged));
    assert_eq!(attempt_plan(&mut host, 1), None);
    // Nor does one whose call this VM does not keep.
    host.calls.clear();
    host.set_header(Side::Request, PLAN_HEADER, Some(&ticket));
    assert_eq!(attempt_plan(&mut host, 1), None);
}

#[test]
fn a_ticket_names_its_call_and_takes_only_the_plan_written_with_it() {
    let plan = plan(false);
    let written = Written::new(plan.clone(), 0xabc);
    assert_eq!(&*written.ticket, "call-1.0000000000000abc");
    assert_eq!(Written::cid_of(&written.ticket), Some("call-1"));
    assert_eq!(Written::cid_of("a.b.0000000000000001"), Some("a.b"));
    for not_a_ticket in [
        "",
        "call-1",
        ".0000000000000abc",
        "call-1.abc",
        r#"{"cid":"call-1"}"#,
    ] {
        assert_eq!(Written::cid_of(not_a_ticket), None, "{not_a_ticket}");
    }
    let kept = |_: &str| Some(written.clone());
    let read = Written::read(&written.ticket, kept).expect("the plan");
    assert!(Rc::ptr_eq(&read, &written.plan));
    assert_eq!(Written::read("call-1.0000000000000abd", kept), None);
    assert_eq!(Written::read(&written.ticket, |_| None), None);
}

#[test]
fn the_sweep_keeps_a_call_until_its_deadline_has_long_passed() {
    use crate::vm::calls::{CallTable, ABANDONED_MS, SWEEP_ABOVE};
    let mut table = CallTable::default();
    let mut planned = |deadline_ms: u64, draw: u64| {
        let (cid, _) = table.open(0, || 0xa0);
        let mut p = plan(false);
        p.cid = cid.clone();
        p.deadline_ms = deadline_ms;
        table.get_mut(&cid).unwrap().plan = Some(Written::new(p, draw));
        cid
    };
    // A policy's hour-long deadline, and the usual 30 s one.
    let (long, short) = (planned(3_600_000, 1), planned(30_000, 2));
    for i in 0..SWEEP_ABOVE {
        table.open(i as i64, || 0xa0);
    }
    table.open(ABANDONED_MS + 60_000, || 0xa0);
    assert!(table.get(&long).is_some(), "its attempts may still run");
    assert!(table.get(&short).is_none(), "swept");
}

#[test]
fn the_body_the_front_read_is_the_attempts_until_the_answer_reaches_the_front() {
    let mut snap = snapshot();
    snap.virtual_keys.push(VirtualKey {
        id: "key_plan".into(),
        sha256: ai_router_contract::sha256_hex(CLIENT_KEY.as_bytes()),
        profiles: vec!["*".into()],
        models: vec!["*".into()],
        enabled: true,
        ..Default::default()
    });
    let mut host = FakeHost::with_state(State::new(1, snap));
    let mut front = front_request(&mut host);
    let ticket = host
        .text(Side::Request, PLAN_HEADER)
        .expect("a plan header");
    let cid = Written::cid_of(&ticket).expect("a call").to_owned();
    let kept = host.calls.get(&cid).and_then(|c| c.body.clone());
    assert_eq!(kept.as_deref(), Some(&host.request_body));
    // Each attempt takes it without copying Envoy's buffer.
    host.set_header(Side::Request, "x-envoy-attempt-count", Some("1"));
    host.reset_tallies();
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(host.host_calls().get("body"), None);
    // The answer reaches the front: no attempt follows, the call lets the body go.
    host.add(Side::Response, ":status", b"200");
    front.on_response_headers(&mut host, false);
    assert!(host.calls.get(&cid).is_some_and(|c| c.body.is_none()));
}
