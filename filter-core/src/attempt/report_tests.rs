use crate::attempt::testkit::*;

#[test]
fn a_caller_that_went_away_is_reported_cancelled() {
    let plan = plan(false);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    host.properties.insert(
        "response.code_details".into(),
        b"downstream_remote_disconnect".to_vec(),
    );
    stage.on_log(&mut host);
    assert_eq!(host.attempts.len(), 1);
    assert_eq!(host.attempts[0].error_class().text(), "cancelled");
    assert_eq!(host.lanes.in_flight("p1", "a"), 0, "the slot is freed");
}

#[test]
fn a_streams_usage_is_noted_on_the_call_even_when_the_client_did_not_ask() {
    let (plan, mut host, mut stage) = a_stream_past_its_first_token();
    assert!(!plan.include_usage);
    host.response_body = b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n\
data: [DONE]\n\n"
        .to_vec();
    let size = host.response_body.len();
    stage.on_response_body(&mut host, size, true);
    let out = String::from_utf8_lossy(&host.response_body).to_string();
    assert!(!out.contains("usage"), "the client did not ask: {out}");
    let call = host.calls.get(&plan.cid).cloned().unwrap_or_default();
    assert_eq!(
        call.answered_usage,
        Some(Usage {
            prompt_tokens: 9,
            completion_tokens: 4,
            cached_tokens: 2
        })
    );
}

#[test]
fn an_answer_without_usage_is_reported_at_the_estimate_and_says_so() {
    use ai_router_proto::v1::UsageSource;
    // Unary: the request's prompt estimate and the answer's text, 4 characters a token.
    let mut plan = plan(false);
    plan.prompt_tokens = 12;
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    let text = "word ".repeat(40);
    answer(
        &mut stage,
        &mut host,
        200,
        &[("content-type", "application/json")],
        &serde_json::json!({ "choices": [{ "message": { "role": "assistant", "content": text } }] })
            .to_string(),
    );
    let usage = host.attempts[0].usage.unwrap_or_default();
    assert_eq!(
        (usage.prompt_tokens, usage.completion_tokens, usage.source()),
        (12, 50, UsageSource::Estimated)
    );
    // The provider's figures when it reports them.
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    answer(
        &mut stage,
        &mut host,
        200,
        &[("content-type", "application/json")],
        r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
    );
    let usage = host.attempts[0].usage.unwrap_or_default();
    assert_eq!(
        (usage.prompt_tokens, usage.completion_tokens, usage.source()),
        (3, 2, UsageSource::Reported)
    );
    // A stream that ends without its usage chunk: the deltas' text.
    let (plan, mut host, mut stage) = a_stream_past_its_first_token();
    host.response_body =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"abcdefgh\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: [DONE]\n\n"
            .to_vec();
    let size = host.response_body.len();
    stage.on_response_body(&mut host, size, true);
    let usage = host.attempts[0].usage.unwrap_or_default();
    assert_eq!(usage.source(), UsageSource::Estimated);
    assert_eq!(usage.prompt_tokens, plan.prompt_tokens);
    // "Hi" (1 token) released the stream, "abcdefgh" (2) came after it.
    assert_eq!(usage.completion_tokens, 3, "{usage:?}");
    // A failure before any answer used nothing.
    let plan = self::plan(false);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    answer(&mut stage, &mut host, 503, &[], "{}");
    assert_eq!(host.attempts[0].usage, None);
}

#[test]
fn without_include_content_a_report_carries_no_content() {
    let plan = plan(false);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    let ok = r#"{"choices":[{"message":{"content":"the answer"}}]}"#;
    answer(
        &mut stage,
        &mut host,
        200,
        &[("content-type", "application/json")],
        ok,
    );
    assert_eq!(host.attempts[0].content, None);
}

#[test]
fn with_include_content_a_report_carries_the_request_and_the_answer_key_redacted() {
    let plan = plan(false);
    let mut host = host_with(with_content(snapshot()), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    let refused = r#"{"error":{"message":"Incorrect API key provided: sk-p1-a-secret","type":"invalid_request_error","code":"invalid_api_key"}}"#;
    answer(
        &mut stage,
        &mut host,
        401,
        &[("content-type", "application/json")],
        refused,
    );
    let content = host.attempts[0].content.clone().unwrap();
    assert_eq!(
        content.request, r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#,
        "the caller's body, as it sent it"
    );
    assert!(content
        .response
        .contains("Incorrect API key provided: [redacted]"));
    assert!(!content.response.contains("sk-p1-a-secret"));
    assert!(!content.request_truncated && !content.response_truncated);
}

#[test]
fn with_include_content_a_streams_report_carries_its_events() {
    let plan = plan(true);
    let mut host = host_with(with_content(snapshot()), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"text/event-stream");
    assert_eq!(stage.on_response_headers(&mut host, false), Flow::Pause);
    let token = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    host.response_body = token.as_bytes().to_vec();
    assert_eq!(
        stage.on_response_body(&mut host, token.len(), false),
        Flow::Continue
    );
    let done = "data: [DONE]\n\n";
    host.response_body = done.as_bytes().to_vec();
    stage.on_response_body(&mut host, done.len(), true);
    let content = host.attempts[0].content.clone().unwrap();
    assert_eq!(content.response, format!("{token}{done}"));
    assert!(content.request.contains("\"stream\":true"));
}

/// The time the provider held the call's attempts so far (µs).
fn upstream_us(host: &FakeHost, plan: &Plan) -> i64 {
    host.calls.get(&plan.cid).map_or(-1, |c| c.upstream_us)
}

#[test]
fn a_unary_attempt_is_at_its_provider_from_its_send_to_its_answers_last_bytes() {
    let plan = plan(false);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    host.micros = 100;
    send(&mut stage, &mut host);
    // The headers 10 ms later, the body's last bytes 240.05 ms after those.
    host.now += 10;
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"application/json");
    assert_eq!(stage.on_response_headers(&mut host, false), Flow::Pause);
    assert_eq!(upstream_us(&host, &plan), 0, "still at the provider");
    host.now += 240;
    host.micros = 150;
    host.response_body =
        br#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#.to_vec();
    let size = host.response_body.len();
    assert_eq!(
        stage.on_response_body(&mut host, size, true),
        Flow::Continue
    );
    assert_eq!(upstream_us(&host, &plan), 250_050);
    // Nothing after the verdict counts again.
    host.now += 1_000;
    stage.on_log(&mut host);
    assert_eq!(upstream_us(&host, &plan), 250_050);
}

#[test]
fn a_stream_is_at_its_provider_until_its_first_token_and_no_longer() {
    let plan = plan(true);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    host.now += 30;
    held_stream(&mut host, &mut stage);
    host.now += 70;
    assert_eq!(chunk(&mut stage, &mut host, "Hi"), Flow::Continue);
    assert_eq!(upstream_us(&host, &plan), 100_000);
    host.now += 500;
    assert_eq!(chunk(&mut stage, &mut host, " there"), Flow::Continue);
    assert_eq!(
        upstream_us(&host, &plan),
        100_000,
        "after the first byte: not counted"
    );
}

#[test]
fn a_calls_attempts_add_up_and_a_timeout_counts_until_it_is_noticed() {
    // The first attempt fails with a 429 after 40 ms, the second times out.
    let mut plan = plan(false);
    plan.timeout_ms = 1_000;
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    host.now += 40;
    answer(
        &mut stage,
        &mut host,
        429,
        &[("content-type", "application/json")],
        r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#,
    );
    assert_eq!(upstream_us(&host, &plan), 40_000);
    // The next attempt, on another stream of the same worker: the call's bookkeeping is the
    // one this host holds.
    let mut second = Attempt::default();
    let now = host.now + 25;
    let calls = std::mem::take(&mut host.calls);
    let mut host = host_with(snapshot(), &plan, 2);
    host.calls = calls;
    host.now = now;
    let sent = host.now;
    assert_eq!(send(&mut second, &mut host), Flow::Continue);
    let stopped = run_ticks(&mut second, &mut host, sent + 5_000, |h| {
        h.answered.is_some()
    });
    assert!(host.answered.is_some(), "the second attempt timed out");
    assert_eq!(
        upstream_us(&host, &plan),
        40_000 + (stopped - sent) * 1000,
        "its time at the provider ends when the timeout is noticed"
    );
}
