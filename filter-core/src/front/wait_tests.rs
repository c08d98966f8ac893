//! A call to a gateway that has no state yet waits for it, at most its bound.

use super::fixture::*;
use super::*;
use crate::testing::FakeHost;

/// The token of the last timer the stage dispatched.
fn last_timer(host: &FakeHost) -> u32 {
    host.next_token
}

#[test]
fn a_call_to_a_gateway_without_state_waits_for_it_and_is_served() {
    let auth = bearer(KEY);
    let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
    let state = host.state.take();
    let mut front = Front::default();
    assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
    assert!(
        host.answered.is_none(),
        "no 503 from a gateway still starting"
    );
    assert_eq!(host.dispatched.len(), 1, "a timer");
    // The body arrives while it waits; it is kept.
    let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(send_body(&mut front, &mut host, body), Flow::Pause);
    // No state at the first look: armed again.
    host.now += 25;
    let token = last_timer(&host);
    front.on_http_call_response(&mut host, token);
    assert_eq!(host.dispatched.len(), 2);
    assert!(host.answered.is_none());
    // The state is in: the call goes on with its plan, resumed.
    host.state = state;
    host.now += 25;
    let token = last_timer(&host);
    front.on_http_call_response(&mut host, token);
    assert!(host.answered.is_none(), "{:?}", host.answered);
    assert_eq!(host.resumed, 1);
    let plan = host.planned().expect("a plan");
    assert_eq!(plan.tiers[0][0].model, "m1");
    assert!(host.header(Side::Request, "authorization").is_none());
}

#[test]
fn a_call_waits_for_the_state_at_most_its_bound() {
    let auth = bearer(KEY);
    let mut host = client("GET", "/v1/models", &[("authorization", &auth)]);
    host.state = None;
    let mut front = Front::default();
    assert_eq!(front.on_request_headers(&mut host, true), Flow::Pause);
    assert!(host.answered.is_none());
    host.now += STATE_WAIT_MS;
    let token = last_timer(&host);
    front.on_http_call_response(&mut host, token);
    assert_eq!(answered_code(&host), (503, "pool_unavailable".to_string()));
    // A timer that is not this call's changes nothing.
    let mut other = Front::default();
    other.on_http_call_response(&mut host, 999);
}
