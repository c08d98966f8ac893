use super::*;
use crate::attempt::testkit::*;

#[test]
fn a_unary_success_goes_to_the_first_lane_with_its_own_key() {
    let plan = plan(false);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(
        host.text(Side::Request, ":authority").as_deref(),
        Some("p1.test:8000")
    );
    assert_eq!(
        host.text(Side::Request, ":path").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(
        host.text(Side::Request, "authorization").as_deref(),
        Some("Bearer sk-p1-a-secret")
    );
    assert_eq!(
        host.text(Side::Request, CLUSTER_HEADER).as_deref(),
        Some(ai_router_contract::clusters::PROVIDERS_PLAIN)
    );
    for gone in [
        "cookie",
        "openai-organization",
        PLAN_HEADER,
        "x-envoy-attempt-count",
    ] {
        assert!(
            host.header(Side::Request, gone).is_none(),
            "{gone} reached the provider"
        );
    }
    let sent: Value = serde_json::from_slice(&host.request_body).unwrap_or(Value::Null);
    assert_eq!(
        sent["model"], "m1",
        "the pool model id replaces the caller's name"
    );
    assert_eq!(host.lanes.in_flight("p1", "a"), 1);

    answer(
        &mut stage,
        &mut host,
        200,
        &[("content-type", "application/json"), ("set-cookie", "x=1")],
        r#"{"choices":[{"message":{"content":"hello sk-p1-a-secret"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
    );
    assert_eq!(host.text(Side::Response, H_ATTEMPT).as_deref(), Some("1"));
    assert_eq!(
        host.text(Side::Response, H_LANE_MODEL).as_deref(),
        Some("m1")
    );
    assert!(host.header(Side::Response, "set-cookie").is_none());
    assert!(!String::from_utf8_lossy(&host.response_body).contains("sk-p1-a-secret"));
    assert_eq!(host.attempts.len(), 1);
    let report = &host.attempts[0];
    assert_eq!(
        (report.outcome().text(), report.key.as_str()),
        ("success", "a")
    );
    assert_eq!(report.usage.map(|u| u.completion_tokens), Some(2));
    assert_eq!(host.lanes.in_flight("p1", "a"), 0);
    assert_eq!(
        host.calls.get("call-1").and_then(|c| c.answered.clone()),
        Some(LaneId::new("p1", "a", "m1"))
    );
}

#[test]
fn a_2xx_that_is_not_what_it_claims_fails_over() {
    for (stream, content_type, body) in [
        (
            false,
            "text/html",
            "<html><body>502 Bad Gateway</body></html>",
        ),
        (false, "application/json", ""),
        (false, "application/json", "{\"choices\":[{\"message\""),
        (
            true,
            "text/html",
            "<html><body>502 Bad Gateway</body></html>",
        ),
    ] {
        let plan = plan(stream);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        if body.is_empty() {
            host.add(Side::Response, ":status", b"200");
            host.add(Side::Response, "content-type", content_type.as_bytes());
            assert_eq!(stage.on_response_headers(&mut host, true), Flow::Continue);
            let answer = host.answered.clone().expect("answered in its place");
            assert_eq!(answer.status, 503, "{body:?}");
            assert_eq!(answer.header(H_RETRY), Some("1"));
        } else {
            answer(
                &mut stage,
                &mut host,
                200,
                &[("content-type", content_type)],
                body,
            );
            assert_eq!(
                host.text(Side::Response, ":status").as_deref(),
                Some("503"),
                "{body}"
            );
            assert_eq!(
                host.text(Side::Response, H_RETRY).as_deref(),
                Some("1"),
                "{body}"
            );
        }
        assert_eq!(
            host.attempts[0].error_class().text(),
            "transient",
            "{body:?}"
        );
    }
}

#[test]
fn a_context_length_answer_moves_on_only_to_a_larger_lane_and_notes_the_trail() {
    let (plan, mut host) = too_long_on_p1(8_000, 32_000);
    assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("503"));
    assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
    assert_eq!(host.attempts[0].error_class().text(), "context_length");
    let call = host.calls.get("call-1").cloned().unwrap_or_default();
    assert_eq!(call.larger_than, Some(Some(8_000)));
    assert_eq!(call.trail.attempts.len(), 1);
    assert_eq!(
        call.trail.attempts[0].class,
        Some(ErrorClass::ContextLength)
    );

    // The next attempt goes to p2 (larger), noting p1 as no larger.
    let calls = std::mem::take(&mut host.calls);
    let mut second = host_with(sized(8_000, 32_000), &plan, 2);
    second.calls = calls;
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut second), Flow::Continue);
    assert_eq!(
        second.text(Side::Request, ":authority").as_deref(),
        Some("p2.test:8000")
    );
    let call = second.calls.get("call-1").cloned().unwrap_or_default();
    assert_eq!(call.trail.skipped.len(), 1);
    assert_eq!(call.trail.skipped[0].reason, "context_window");
}

#[test]
fn a_context_length_answer_with_no_larger_lane_stops_the_call_with_the_providers_400() {
    for (small, other) in [(8_000, 8_000), (8_000, 4_000), (0, 0)] {
        let (_, host) = too_long_on_p1(small, other);
        assert_eq!(
            host.text(Side::Response, ":status").as_deref(),
            Some("400"),
            "{small} then {other}"
        );
        assert_eq!(host.text(Side::Response, H_RETRY), None);
        let call = host.calls.get("call-1").cloned().unwrap_or_default();
        assert_eq!(call.larger_than, None);
    }
}

#[test]
fn a_429_cools_the_lane_and_signals_a_retry_then_the_next_attempt_fails_over() {
    let plan = plan(false);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    answer(
        &mut stage,
        &mut host,
        429,
        &[
            ("content-type", "application/json"),
            ("retry-after", "20"),
            ("x-ai-router-final-status", "299"),
        ],
        r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
    );
    assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("503"));
    assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
    // The provider's own stage header never survives: this one is the stage's verdict.
    assert_eq!(
        host.text(Side::Response, H_FINAL_STATUS).as_deref(),
        Some("503")
    );
    assert_eq!(host.attempts[0].error_class().text(), "rate_limit");
    assert!(
        host.lanes
            .holds(&LaneId::new("p1", "a", "m1"))
            .iter()
            .any(|h| matches!(
                h,
                crate::vocab::LocalHold::Cooldown { until_ms, .. } if *until_ms >= NOW + 19_000
            )),
        "the lane is cooled for every worker at once"
    );

    // The outer router's second attempt: p1's only lane is cooling, p2 serves.
    let lanes = std::mem::take(&mut host.lanes);
    let calls = std::mem::take(&mut host.calls);
    let mut second = host_with(snapshot(), &plan, 2);
    second.lanes = lanes;
    second.calls = calls;
    let mut stage = Attempt::default();
    // A rate limit is no transient failure: no backoff, straight to the next tier.
    assert_eq!(send(&mut stage, &mut second), Flow::Continue);
    assert!(
        second.dispatched.is_empty(),
        "no wait: {:?}",
        second.dispatched
    );
    assert_eq!(
        second.text(Side::Request, ":authority").as_deref(),
        Some("p2.test:8000")
    );
    assert_eq!(second.text(Side::Request, H_ATTEMPT), None);
}

#[test]
fn a_failure_states_the_window_its_hold_applies() {
    const SPENT: &str = r#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let json = [("content-type", "application/json")];
    // A quota with no window named: out for quotaBlacklistMs (6 h), and the answer says so.
    // A 429 with no retry-after: cooled for rateLimitCooldownMs (10 s).
    for (status, body, seconds) in [(429, SPENT, "21600"), (429, "{}", "10")] {
        let plan = plan(false);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        answer(&mut stage, &mut host, status, &json, body);
        assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
        assert_eq!(
            host.text(Side::Response, H_RETRY_AFTER).as_deref(),
            Some(seconds),
            "{body}"
        );
        // A later attempt that finds no lane left states the same window.
        let last = host.calls.get("call-1").and_then(|c| c.last_failure);
        let at = NOW + 5 + seconds.parse::<i64>().unwrap_or_default() * 1000;
        assert_eq!(last.and_then(|(_, r)| r), Some(at), "{body}");
    }
}

#[test]
fn the_attempts_timeout_starts_when_it_reaches_a_provider_not_while_it_waits() {
    let mut plan = plan(false);
    plan.tiers.truncate(1);
    plan.timeout_ms = 1_000;
    let mut snap = snapshot();
    // The only lane is back in 3 s: longer than the attempt's timeout.
    snap.cooldowns.push(LaneCooldown {
        provider: "p1".into(),
        key: "a".into(),
        model: "m1".into(),
        until_ms: NOW + 3_000,
    });
    let mut host = host_with(snap, &plan, 2);
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Pause);
    // Three slices of waiting, then the lane is back.
    for at in [NOW + 1_005, NOW + 2_005, NOW + 3_001] {
        let (wait, delay) = last_timer(&host);
        assert!((990..=TIMER_SLICE_MS).contains(&delay), "the wait: {delay}");
        assert!(host.attempts.is_empty() && host.answered.is_none());
        host.now = at;
        stage.on_http_call_response(&mut host, wait);
    }
    assert_eq!(
        host.resumed, 1,
        "the wait is over: the attempt goes to the provider"
    );
    assert!(host.answered.is_none());
    assert!(host.attempts.is_empty());
    // The attempt's own bound starts now, for the whole of timeoutMs.
    assert!(!stage.bound_due(host.now + 999));
    assert!(stage.bound_due(host.now + 1_000));
}

#[test]
fn an_attempt_past_its_timeout_before_its_answer_is_retried_with_the_timeout_class() {
    for (what, stream) in [
        ("no answer at all", false),
        ("a stream held before its first token", true),
    ] {
        let plan = plan(stream);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Continue);
        assert!(host.dispatched.is_empty(), "{what}: no timer per attempt");
        let sent = host.now;
        if stream {
            held_stream(&mut host, &mut stage);
        }
        let timed_out = run_ticks(&mut stage, &mut host, sent + 60_000, |h| {
            h.answered.is_some()
        });
        assert_eq!(timed_out, sent + plan.timeout_ms as i64, "{what}");
        let answer = host
            .answered
            .clone()
            .expect("answered in the provider's place");
        assert_eq!(answer.status, 503, "{what}");
        assert_eq!(answer.header(H_RETRY), Some("1"), "{what}");
        assert_eq!(answer.header(H_FINAL_STATUS), Some("502"), "{what}");
        assert_eq!(answer.json()["error"]["code"], "upstream_error", "{what}");
        assert!(
            answer.json()["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("timeout")),
            "{what}: {:?}",
            answer.json()
        );
        assert_eq!(host.attempts.len(), 1, "{what}");
        assert_eq!(host.attempts[0].error_class().text(), "timeout", "{what}");
        assert!(!host.attempts[0].after_first_token, "{what}");
        assert_eq!(
            host.lanes.in_flight("p1", "a"),
            0,
            "{what}: the slot is freed"
        );
        let backoff = host.calls.get("call-1").map_or(0, |c| c.backoff_until_ms);
        assert!(backoff > host.now, "{what}: the next attempt backs off");
        // The stage's own answer passes back through it untouched.
        host.response_headers.clear();
        host.add(Side::Response, ":status", b"503");
        host.add(Side::Response, H_RETRY, b"1");
        assert_eq!(stage.on_response_headers(&mut host, false), Flow::Continue);
        assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
        host.response_body = answer.body.clone();
        let size = host.response_body.len();
        assert_eq!(
            stage.on_response_body(&mut host, size, true),
            Flow::Continue
        );
        assert_eq!(host.response_body, answer.body, "{what}");
        assert_eq!(host.attempts.len(), 1, "{what}: reported once");
    }
}

#[test]
fn chunks_after_the_first_token_move_the_bound_on() {
    let mut plan = plan(true);
    plan.timeout_ms = 3_000;
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    let sent = host.now;
    held_stream(&mut host, &mut stage);
    // The first token at 2 s, the next chunk at 4 s: the bound is now 7 s.
    run_ticks(&mut stage, &mut host, sent + 2_000, |_| false);
    assert_eq!(
        chunk(&mut stage, &mut host, "Hi"),
        Flow::Continue,
        "released"
    );
    run_ticks(&mut stage, &mut host, sent + 4_000, |_| false);
    assert_eq!(chunk(&mut stage, &mut host, " there"), Flow::Continue);
    assert!(host.attempts.is_empty() && host.resets == 0);
    let cut = run_ticks(&mut stage, &mut host, sent + 60_000, |h| h.resets > 0);
    assert_eq!(cut, sent + 7_000, "timeoutMs after the last chunk");
    assert_eq!(host.attempts.len(), 1);
    assert_eq!(host.attempts[0].error_class().text(), "timeout");
    assert!(!stage.bound_due(host.now), "decided once");
}

#[test]
fn a_gap_past_the_timeout_after_the_first_token_cuts_the_stream() {
    let (plan, mut host, mut stage) = a_stream_past_its_first_token();
    let last_chunk = host.now;
    let cut = run_ticks(&mut stage, &mut host, last_chunk + 60_000, |h| h.resets > 0);
    // Nothing can be added to a stream whose provider is silent: it is reset.
    assert_eq!(cut, last_chunk + plan.timeout_ms as i64);
    assert_eq!(host.resets, 1);
    assert!(host.answered.is_none());
    assert_eq!(host.attempts.len(), 1);
    let report = &host.attempts[0];
    assert_eq!(
        (report.outcome().text(), report.error_class().text()),
        ("error", "timeout")
    );
    assert!(report.after_first_token);
    assert_eq!(
        host.calls
            .get("call-1")
            .and_then(|c| c.broken_after_first_token),
        Some(ErrorClass::Timeout),
        "the front stage reports the call as failed"
    );
    // Whatever the provider still sends is dropped, and the end reports nothing more.
    assert_eq!(chunk(&mut stage, &mut host, "late"), Flow::Continue);
    assert!(host.response_body.is_empty());
    stage.on_log(&mut host);
    assert_eq!(host.attempts.len(), 1);
}

#[test]
fn a_stream_whose_answer_is_complete_has_no_gap_to_time_out() {
    let (plan, mut host, mut stage) = a_stream_past_its_first_token();
    host.response_body = b"data: [DONE]\n\n".to_vec();
    let size = host.response_body.len();
    assert_eq!(
        stage.on_response_body(&mut host, size, false),
        Flow::Continue
    );
    // The provider keeps its stream open past timeoutMs: the answer is whole, no cut.
    let later = host.now + 3 * plan.timeout_ms as i64;
    run_ticks(&mut stage, &mut host, later, |_| false);
    assert_eq!(host.resets, 0);
    assert!(host.attempts.is_empty());
}

#[test]
fn a_bound_past_after_the_verdict_changes_nothing() {
    let plan = plan(false);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    answer(
        &mut stage,
        &mut host,
        200,
        &[("content-type", "application/json")],
        r#"{"choices":[{"message":{"content":"hello"}}]}"#,
    );
    host.now += plan.timeout_ms as i64;
    assert!(!stage.bound_due(host.now));
    stage.on_bound(&mut host);
    assert_eq!(host.attempts.len(), 1);
    assert_eq!(host.attempts[0].outcome().text(), "success");
    assert!(host.answered.is_none() && host.resets == 0);
}
