//! The attempts of a call take the plan its front stage wrote, shared through the call's
//! bookkeeping, instead of decoding the plan's header again.

use super::testkit::*;
use crate::front::Front;
use crate::plan::Written;
use ai_router_proto::v1::VirtualKey;

const CLIENT_KEY: &str = "sk-starci-plan-0123456789";

/// The front stage's request phase of a client call to `m1` on `host`.
fn front_request(host: &mut FakeHost) {
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
    let text = host
        .text(Side::Request, PLAN_HEADER)
        .expect("a plan header");
    let cid = Plan::cid_of(&text)
        .expect("the call id, read without decoding")
        .to_owned();
    let written = host
        .calls
        .get(&cid)
        .expect("the call in the table")
        .plan
        .clone()
        .expect("the plan kept in the call");
    assert_eq!(*written.text, *text);
    assert_eq!(Plan::decode(&text).as_ref(), Some(&*written.plan));

    for n in 1..=3 {
        let plan = attempt_plan(&mut host, n).expect("a plan");
        assert!(
            Rc::ptr_eq(&plan, &written.plan),
            "attempt {n} took the written plan"
        );
    }

    // A header that is not the text written for its call is decoded, as it reads.
    let mut other = (*written.plan).clone();
    other.max_attempts += 1;
    host.set_header(Side::Request, PLAN_HEADER, Some(&other.encode()));
    let plan = attempt_plan(&mut host, 1).expect("a plan");
    assert!(!Rc::ptr_eq(&plan, &written.plan));
    assert_eq!(*plan, other);
    // So is one whose call this VM does not keep (or keeps without its plan).
    host.calls.clear();
    host.set_header(Side::Request, PLAN_HEADER, Some(&text));
    assert_eq!(attempt_plan(&mut host, 1).as_deref(), Some(&*written.plan));
}

#[test]
fn the_call_id_is_read_from_the_plan_s_first_field_or_not_at_all() {
    let plan = plan(false);
    assert_eq!(Plan::cid_of(&plan.encode()), Some("call-1"));
    assert_eq!(Plan::cid_of(r#"{"rid":"x","cid":"call-1"}"#), None);
    assert_eq!(Plan::cid_of(r#"{"cid":"call\"-1"}"#), None);
    assert_eq!(Plan::cid_of(r#"{"cid":"call-1"#), None);
    // Whatever id it reads, only the very text written takes the kept plan.
    let written = Written::new(plan.clone());
    let kept = |_: &str| Some(written.clone());
    let read = Written::read(&written.text, kept).expect("the plan");
    assert!(Rc::ptr_eq(&read, &written.plan));
    let mut other = plan;
    other.rid = "rid-2".into();
    let read = Written::read(&other.encode(), kept).expect("decoded");
    assert_eq!(*read, other);
    assert_eq!(Written::read("{\"cid\":\"call-1\"", kept), None);
}
