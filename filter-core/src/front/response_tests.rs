//! The way back through the stage: what each answer costs, the final status and error, the
//! trail, and how the call is reported.

use super::fixture::*;
use super::*;
use crate::testing::FakeHost;

#[test]
fn a_streams_headers_carry_the_estimate_as_one_never_as_the_cost() {
    let auth = bearer(KEY);
    let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    let body = r#"{"model":"chat","stream":true,"messages":[]}"#;
    send_body(&mut front, &mut host, body);
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, H_ATTEMPT, b"1");
    host.add(Side::Response, H_LANE_COST, b"0.5");
    front.on_response_headers(&mut host, false);
    assert!(host.header(Side::Response, H_COST).is_none());
    assert_eq!(
        host.text(Side::Response, H_COST_ESTIMATE).as_deref(),
        Some("0.5")
    );
}

#[test]
fn a_failed_call_costs_nothing() {
    let auth = bearer(KEY);
    let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    let body = r#"{"model":"chat","messages":[]}"#;
    send_body(&mut front, &mut host, body);
    host.add(Side::Response, ":status", b"502");
    host.add(Side::Response, H_FINAL_STATUS, b"502");
    host.add(Side::Response, H_LANE_COST, b"1");
    front.on_response_headers(&mut host, false);
    assert_eq!(host.text(Side::Response, H_COST).as_deref(), Some("0"));
    assert!(host.header(Side::Response, H_ROUTE).is_none());
}

/// A chat call for `m1` with the app's key, sent on to the router.
fn a_call_sent_on() -> (Front, FakeHost) {
    let auth = bearer(KEY);
    let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
    (front, host)
}

#[test]
fn the_last_attempts_signal_becomes_the_final_status() {
    let (mut front, mut host) = a_call_sent_on();
    host.add(Side::Response, ":status", b"503");
    host.add(Side::Response, H_RETRY, b"1");
    host.add(Side::Response, H_FINAL_STATUS, b"503");
    host.add(Side::Response, H_RETRY_AFTER, b"7");
    host.add(Side::Response, H_ATTEMPT, b"3");
    front.on_response_headers(&mut host, false);
    assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("503"));
    assert_eq!(
        host.text(Side::Response, "retry-after").as_deref(),
        Some("7")
    );
    assert!(host.header(Side::Response, H_MODEL).is_none());
    assert!(host.header(Side::Response, H_RETRY).is_none());
    front.on_log(&mut host);
    assert!(host.reports[0].outcome_text().starts_with("error:"));
}

#[test]
fn a_final_error_carries_the_calls_trail_and_a_success_only_when_asked() {
    let (mut front, mut host) = a_call_sent_on();
    let cid = front.cid.clone().unwrap_or_default();
    host.with_call(&cid, |c| {
        c.trail.skip("p9", "", "m9", "no_capability:tools");
        c.trail.attempt(crate::answer::trail::AttemptNote {
            attempt: 1,
            provider: "p1".into(),
            key: "a".into(),
            model: "m1".into(),
            class: Some(ErrorClass::RateLimit),
            status: 429,
        });
    });
    host.add(Side::Response, ":status", b"503");
    host.add(Side::Response, H_RETRY, b"1");
    host.add(Side::Response, H_FINAL_STATUS, b"503");
    host.add(Side::Response, H_ATTEMPT, b"1");
    let err = GatewayError::of(ErrorCode::PoolRateLimited).body();
    host.response_body = err.clone();
    front.on_response_headers(&mut host, false);
    assert_eq!(
        front.on_response_body(&mut host, err.len(), false),
        Flow::Pause
    );
    assert_eq!(
        front.on_response_body(&mut host, err.len(), true),
        Flow::Continue
    );
    let v: Value = serde_json::from_slice(&host.response_body).unwrap_or_default();
    assert_eq!(v["error"]["code"], "pool_rate_limited");
    assert_eq!(
        v["error"]["trail"]["skipped"][0]["reason"],
        "no_capability:tools"
    );
    assert_eq!(v["error"]["trail"]["attempts"][0]["class"], "rate_limit");

    // A success: the attempt stage's trail reaches the client only if it asked.
    for (asked, shown) in [(false, false), (true, true)] {
        let auth = bearer(KEY);
        let mut headers: Vec<(&str, &[u8])> = vec![("authorization", &auth)];
        if asked {
            headers.push((H_TRAIL, b"1"));
        }
        let mut host = client("POST", "/v1/chat/completions", &headers);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
        send_body(&mut front, &mut host, body);
        assert_eq!(host.planned().is_some_and(|p| p.trail), asked);
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, H_ATTEMPT, b"1");
        host.add(
            Side::Response,
            H_LANE_TRAIL,
            br#"{"skipped":[],"attempts":[]}"#,
        );
        front.on_response_headers(&mut host, false);
        assert_eq!(host.header(Side::Response, H_TRAIL).is_some(), shown);
        assert!(host.header(Side::Response, H_LANE_TRAIL).is_none());
    }
}

#[test]
fn a_client_that_went_away_before_its_answer_cancelled_the_call() {
    for (details, outcome) in [
        ("downstream_remote_disconnect", "error:cancelled"),
        ("", "error:upstream"),
    ] {
        let (mut front, mut host) = a_call_sent_on();
        host.properties
            .insert("response.code_details".into(), details.as_bytes().to_vec());
        front.on_log(&mut host);
        assert_eq!(host.reports[0].outcome_text(), outcome, "{details:?}");
    }
}

#[test]
fn a_stream_that_broke_off_after_its_first_token_is_no_success() {
    for (broken, details, outcome) in [
        (None, "via_upstream", "success"),
        // The client stopped reading: the lane served it.
        (None, "downstream_remote_disconnect", "success"),
        (Some(ErrorClass::Timeout), "", "error:timeout"),
        // The attempt stage's report comes after this stage's end.
        (None, "response_timeout", "error:deadline"),
        (
            None,
            "upstream_reset_after_response_started{protocol_error}",
            "error:stream",
        ),
    ] {
        let (mut front, mut host) = a_call_sent_on();
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, H_ATTEMPT, b"1");
        front.on_response_headers(&mut host, false);
        // The attempt stage's report of how the answer ended.
        for call in host.calls.values_mut() {
            call.broken_after_first_token = broken;
        }
        host.properties
            .insert("response.code_details".into(), details.as_bytes().to_vec());
        front.on_log(&mut host);
        assert_eq!(host.reports[0].outcome_text(), outcome);
        assert_eq!(host.reports[0].status, 200);
    }
}

#[test]
fn the_routers_own_answers_get_the_gateways_error_bodies() {
    for (router_status, status, code, retry_after) in [
        (504, 504, "pool_timeout", None),
        // Its circuit breakers are full: the gateway cannot take the call now.
        (503, 503, "pool_unavailable", Some("1")),
        (502, 502, "upstream_error", None),
    ] {
        let (mut front, mut host) = a_call_sent_on();
        host.add(
            Side::Response,
            ":status",
            router_status.to_string().as_bytes(),
        );
        host.add(Side::Response, "x-envoy-overloaded", b"true");
        front.on_response_headers(&mut host, false);
        host.response_body = b"upstream connect error".to_vec();
        assert_eq!(front.on_response_body(&mut host, 22, true), Flow::Continue);
        let body: Value = serde_json::from_slice(&host.response_body).unwrap_or(Value::Null);
        assert_eq!(body["error"]["code"], code, "{router_status}");
        assert_eq!(
            host.text(Side::Response, ":status"),
            Some(status.to_string())
        );
        assert_eq!(
            host.text(Side::Response, "retry-after").as_deref(),
            retry_after
        );
        assert!(host.header(Side::Response, "x-envoy-overloaded").is_none());
    }
}

#[test]
fn a_router_timeout_gets_the_gateways_error_body() {
    let (mut front, mut host) = a_call_sent_on();
    // Envoy's router gave up: no attempt header, its own text body.
    host.add(Side::Response, ":status", b"504");
    host.add(Side::Response, "content-type", b"text/plain");
    front.on_response_headers(&mut host, false);
    host.response_body = b"upstream request timeout".to_vec();
    assert_eq!(front.on_response_body(&mut host, 5, false), Flow::Pause);
    assert_eq!(front.on_response_body(&mut host, 24, true), Flow::Continue);
    let body: Value = serde_json::from_slice(&host.response_body).unwrap_or(Value::Null);
    assert_eq!(body["error"]["code"], "pool_timeout");
    assert_eq!(
        host.text(Side::Response, "content-type").as_deref(),
        Some("application/json")
    );
}

#[test]
fn the_overhead_is_the_calls_time_less_its_providers_and_a_header_only_when_asked() {
    use ai_router_contract::headers::{OVERHEAD as H_OVERHEAD, OVERHEAD_MS as H_OVERHEAD_MS};
    for asked in [false, true] {
        let auth = bearer(KEY);
        let mut extra: Vec<(&str, &[u8])> = vec![("authorization", &auth)];
        if asked {
            extra.push((H_OVERHEAD, b"1"));
        }
        let mut host = client("POST", "/v1/chat/completions", &extra);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        assert!(
            host.header(Side::Request, H_OVERHEAD).is_none(),
            "never sent on"
        );
        let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
        // Its one attempt was at the provider for 250 ms; the answer's first byte is here
        // 250.4 ms after the request.
        let cid = front.cid.clone().unwrap_or_default();
        host.with_call(&cid, |c| {
            c.tried.push(crate::vocab::LaneId::new("p1", "a", "m1"));
            c.upstream_us = 250_000;
        });
        host.now += 250;
        host.micros = 400;
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, H_ATTEMPT, b"1");
        // A provider's (or a stage's) header of that name never reaches the client.
        host.add(Side::Response, H_OVERHEAD_MS, b"999");
        front.on_response_headers(&mut host, false);
        let expected = asked.then(|| "0.400".to_string());
        assert_eq!(
            host.text(Side::Response, H_OVERHEAD_MS),
            expected,
            "asked: {asked}"
        );
        front.on_log(&mut host);
        assert_eq!(host.reports[0].overhead_us, Some(400));
    }
}

#[test]
fn a_call_no_provider_took_part_in_has_no_overhead() {
    use ai_router_contract::headers::{OVERHEAD as H_OVERHEAD, OVERHEAD_MS as H_OVERHEAD_MS};
    // Refused by the gateway itself.
    let mut host = client(
        "POST",
        "/v1/chat/completions",
        &[("authorization", b"Bearer sk-wrong"), (H_OVERHEAD, b"1")],
    );
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    host.add(Side::Response, ":status", b"401");
    front.on_response_headers(&mut host, false);
    front.on_log(&mut host);
    assert!(host.header(Side::Response, H_OVERHEAD_MS).is_none());
    assert_eq!(host.reports[0].overhead_us, None);
    // No lane was left for the call: the attempt stage answered without a provider.
    let (mut front, mut host) = a_call_sent_on();
    host.add(Side::Response, ":status", b"503");
    host.add(Side::Response, H_FINAL_STATUS, b"503");
    front.on_response_headers(&mut host, false);
    front.on_log(&mut host);
    assert_eq!(host.reports[0].overhead_us, None);
}

/// [`a_call_sent_on`] on a public route rendered with one pass for `hosts`.
fn a_one_pass_call(hosts: &[&str]) -> (Front, FakeHost) {
    let auth = bearer(KEY);
    let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
    // The fixture's provider, on a plain-HTTP host.
    let mut snap = state().snapshot;
    snap.providers[0].scheme = "http".into();
    snap.providers[0].authority = "p1.test:8000".into();
    host.state = Some(std::rc::Rc::new(crate::state::State::new(1, snap)));
    let mut front = Front::with_one_pass(Some(std::rc::Rc::new(
        ai_router_contract::plugin::OnePass {
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            retries: 3,
        },
    )));
    front.on_request_headers(&mut host, false);
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
    (front, host)
}

#[test]
fn one_pass_sends_a_ready_call_to_the_aggregate_and_any_other_to_the_attempt_listener() {
    use ai_router_contract::{clusters, headers::PASS};
    let (_, host) = a_one_pass_call(&["p1.test:8000"]);
    let first = host.calls.get("call-1").and_then(|c| c.first.clone());
    let provider = first.map(|f| f.lane.provider).unwrap_or_default();
    assert!(!provider.is_empty(), "the front reserved the first lane");
    assert_eq!(
        host.text(Side::Request, PASS).as_deref(),
        Some(clusters::ONE_PASS)
    );
    assert_eq!(
        host.text(Side::Request, ":authority"),
        Some(format!("{provider}.test:8000"))
    );
    let per_try = host.text(Side::Request, "x-envoy-upstream-rq-per-try-timeout-ms");
    let timeout = host.planned().map(|p| p.timeout_ms);
    assert_eq!(
        per_try,
        timeout.map(|t| (t + 2 * crate::attempt::BOUND_TICK_MS).to_string())
    );
    // A host Envoy did not resolve at start: the attempt listener, no per-try timeout.
    let (_, host) = a_one_pass_call(&[]);
    assert_eq!(
        host.text(Side::Request, PASS).as_deref(),
        Some(clusters::ATTEMPTS)
    );
    assert_eq!(
        host.text(Side::Request, "x-envoy-upstream-rq-per-try-timeout-ms"),
        None
    );
    assert!(host.calls.get("call-1").is_some_and(|c| c.first.is_none()));
}

#[test]
fn a_first_attempt_in_one_pass_left_unanswered_is_the_attempt_listener_s_error() {
    for (router_status, details, status, code) in [
        (
            503,
            "upstream_reset_before_response_started{connection_failure}",
            502,
            "upstream_error",
        ),
        (504, "upstream_per_try_timeout", 502, "upstream_error"),
        // The gateway's own bound stays its own answer.
        (
            503,
            "upstream_reset_before_response_started{overflow}",
            503,
            "pool_unavailable",
        ),
        (504, "upstream_response_timeout", 504, "pool_timeout"),
    ] {
        let (mut front, mut host) = a_call_sent_on();
        if let Some(c) = host.calls.get_mut("call-1") {
            c.one_pass = true;
        }
        host.properties
            .insert("response.code_details".into(), details.as_bytes().to_vec());
        host.add(
            Side::Response,
            ":status",
            router_status.to_string().as_bytes(),
        );
        front.on_response_headers(&mut host, false);
        host.response_body = b"upstream connect error".to_vec();
        assert_eq!(front.on_response_body(&mut host, 22, true), Flow::Continue);
        let body: Value = serde_json::from_slice(&host.response_body).unwrap_or(Value::Null);
        assert_eq!(body["error"]["code"], code, "{details}");
        assert_eq!(
            host.text(Side::Response, ":status"),
            Some(status.to_string())
        );
    }
}
