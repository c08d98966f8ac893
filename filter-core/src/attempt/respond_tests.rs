use super::*;
use crate::attempt::testkit::*;

#[test]
fn a_json_answer_to_a_stream_request_is_served_as_the_stream_with_its_usage() {
    let plan = plan(true);
    assert!(!plan.include_usage);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    answer(
        &mut stage,
        &mut host,
        200,
        &[("content-type", "application/json")],
        r#"{"id":"c1","model":"m1","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi sk-p1-a-secret"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
    );
    assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("200"));
    assert_eq!(
        host.text(Side::Response, "content-type").as_deref(),
        Some("text/event-stream")
    );
    let out = String::from_utf8_lossy(&host.response_body).to_string();
    let events = crate::wire::sse::Parser::new().feed(out.as_bytes());
    let text: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")?
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(text, "hi [redacted]", "{out}");
    assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
    assert!(!out.contains("usage"), "the client did not ask: {out}");
    let report = &host.attempts[0];
    assert_eq!(report.outcome().text(), "success");
    assert_eq!(report.usage.map(|u| u.completion_tokens), Some(2));
}

#[test]
fn a_stream_is_held_until_the_first_token() {
    let plan = plan(true);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    assert_eq!(
        host.text(Side::Request, "accept").as_deref(),
        Some("text/event-stream")
    );
    let sent: Value = serde_json::from_slice(&host.request_body).unwrap_or(Value::Null);
    assert_eq!(sent["stream_options"]["include_usage"], true);

    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"text/event-stream");
    host.add(Side::Response, "content-length", b"4096");
    assert_eq!(stage.on_response_headers(&mut host, false), Flow::Pause);
    assert_eq!(
        host.header(Side::Response, "content-length"),
        None,
        "a rewritten stream has no length"
    );
    let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    host.response_body = role.as_bytes().to_vec();
    assert_eq!(
        stage.on_response_body(&mut host, role.len(), false),
        Flow::Pause,
        "held"
    );
    assert!(host.header(Side::Response, H_ATTEMPT).is_none());
    let token = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    host.response_body.extend_from_slice(token.as_bytes());
    let size = host.response_body.len();
    assert_eq!(
        stage.on_response_body(&mut host, size, false),
        Flow::Continue,
        "released"
    );
    assert_eq!(
        String::from_utf8_lossy(&host.response_body),
        format!("{role}{token}")
    );
    assert_eq!(host.text(Side::Response, H_ATTEMPT).as_deref(), Some("1"));
    // After the first token, chunks go on as they come; the end is a success.
    let done = "data: [DONE]\n\n";
    host.response_body = done.as_bytes().to_vec();
    assert_eq!(
        stage.on_response_body(&mut host, done.len(), true),
        Flow::Continue
    );
    assert_eq!(host.attempts[0].outcome().text(), "success");
    assert!(host.attempts[0].after_first_token);
}

#[test]
fn an_error_event_before_the_first_token_fails_over_invisibly() {
    let plan = plan(true);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"text/event-stream");
    stage.on_response_headers(&mut host, false);
    let event = "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n";
    host.response_body = event.as_bytes().to_vec();
    assert_eq!(
        stage.on_response_body(&mut host, event.len(), false),
        Flow::Continue
    );
    assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("503"));
    assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
    assert!(!String::from_utf8_lossy(&host.response_body).contains("data:"));
    // Whatever the provider still sends is dropped.
    host.response_body = b"data: {\"choices\":[]}\n\n".to_vec();
    let size = host.response_body.len();
    stage.on_response_body(&mut host, size, true);
    assert!(host.response_body.is_empty());
    assert_eq!(host.attempts.len(), 1);
    assert_eq!(host.attempts[0].outcome().text(), "error");
}

#[test]
fn messages_reach_an_anthropic_lane_as_the_caller_wrote_them() {
    let body = messages_body(false);
    let (mut host, mut stage) = ingress_call(
        ProviderKind::Anthropic,
        Protocol::Messages,
        false,
        body.clone(),
    );
    assert_eq!(path_of(&host), "/v1/messages");
    let mut expected = body;
    expected["model"] = "m1".into();
    assert_eq!(sent(&host), expected, "only the model is rewritten");
    for (name, value) in [
        ("anthropic-version", "2024-10-22"),
        ("anthropic-beta", "prompt-caching-2024-07-31"),
        ("x-api-key", "sk-p1-a-secret"),
    ] {
        assert_eq!(host.text(Side::Request, name).as_deref(), Some(value));
    }
    let message = r#"{"id":"msg_1","type":"message","role":"assistant","model":"m1","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"cache_read_input_tokens":5,"cache_creation_input_tokens":1,"output_tokens":2}}"#;
    answer(
        &mut stage,
        &mut host,
        200,
        &[("content-type", "application/json")],
        message,
    );
    assert_eq!(
        answered(&host),
        serde_json::from_str::<Value>(message).unwrap_or(Value::Null),
        "the answer goes back as it came"
    );
    let usage = host.attempts[0].usage.unwrap_or_default();
    assert_eq!(
        (
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens
        ),
        (9, 5, 2)
    );
}

#[test]
fn a_native_messages_stream_is_held_then_ends_with_an_anthropic_error_event() {
    let (mut host, mut stage) = ingress_call(
        ProviderKind::Anthropic,
        Protocol::Messages,
        true,
        messages_body(true),
    );
    assert!(
        sent(&host).get("stream_options").is_none(),
        "no OpenAI field for Anthropic"
    );
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"text/event-stream");
    stage.on_response_headers(&mut host, false);
    let head = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    );
    host.response_body = head.as_bytes().to_vec();
    assert_eq!(
        stage.on_response_body(&mut host, head.len(), false),
        Flow::Pause,
        "held"
    );
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
    host.response_body.extend_from_slice(delta.as_bytes());
    let size = host.response_body.len();
    assert_eq!(
        stage.on_response_body(&mut host, size, false),
        Flow::Continue
    );
    assert_eq!(
        String::from_utf8_lossy(&host.response_body),
        format!("{head}{delta}")
    );
    let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    host.response_body = error.as_bytes().to_vec();
    stage.on_response_body(&mut host, error.len(), false);
    let out = String::from_utf8_lossy(&host.response_body).to_string();
    assert!(out.starts_with("event: error\ndata: "), "{out}");
    assert!(
        out.contains("\"stream_interrupted\"") && out.contains("Overloaded"),
        "{out}"
    );
    assert_eq!(host.attempts[0].outcome().text(), "error");
    assert!(host.attempts[0].after_first_token);
}

#[test]
fn messages_reach_an_openai_lane_as_chat_and_come_back_as_messages() {
    let (mut host, mut stage) = ingress_call(
        ProviderKind::OpenaiCompatible,
        Protocol::Messages,
        false,
        messages_body(false),
    );
    assert_eq!(path_of(&host), "/v1/chat/completions");
    let body = sent(&host);
    assert_eq!(body["model"], "m1");
    assert_eq!(body["max_tokens"], 256);
    assert_eq!(
        body["messages"][0],
        serde_json::json!({ "role": "system", "content": "Be brief." })
    );
    assert!(body.get("thinking").is_none());
    assert!(host.header(Side::Request, "anthropic-version").is_none());
    answer(
        &mut stage,
        &mut host,
        200,
        &[("content-type", "application/json")],
        r#"{"id":"chatcmpl-7","model":"m1","choices":[{"message":{"role":"assistant","content":"Hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
    );
    let message = answered(&host);
    assert_eq!(message["type"], "message");
    assert_eq!(message["content"][0]["text"], "Hi");
    assert_eq!(message["stop_reason"], "max_tokens");
    assert_eq!(host.attempts[0].usage.map(|u| u.prompt_tokens), Some(3));
}

#[test]
fn a_chat_stream_becomes_messages_events_for_a_messages_caller() {
    let (mut host, mut stage) = ingress_call(
        ProviderKind::OpenaiCompatible,
        Protocol::Messages,
        true,
        messages_body(true),
    );
    assert_eq!(sent(&host)["stream_options"]["include_usage"], true);
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"text/event-stream");
    stage.on_response_headers(&mut host, false);
    let role = "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    host.response_body = role.as_bytes().to_vec();
    assert_eq!(
        stage.on_response_body(&mut host, role.len(), false),
        Flow::Pause
    );
    let token = "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    host.response_body.extend_from_slice(token.as_bytes());
    let size = host.response_body.len();
    stage.on_response_body(&mut host, size, false);
    let out = String::from_utf8_lossy(&host.response_body).to_string();
    assert!(out.starts_with("event: message_start\n"), "{out}");
    assert!(out.contains("\"text_delta\""), "{out}");
    // Cut after the first token: the Anthropic error event, never message_stop.
    host.response_body = b"data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"}}]}\n\n".to_vec();
    let size = host.response_body.len();
    stage.on_response_body(&mut host, size, true);
    let out = String::from_utf8_lossy(&host.response_body).to_string();
    assert!(
        out.contains("event: error\n") && !out.contains("message_stop"),
        "{out}"
    );
    assert_eq!(host.attempts[0].outcome().text(), "error");
}

#[test]
fn a_responses_call_reaches_an_anthropic_lane_through_both_adapters() {
    let body = serde_json::json!({ "model": "chat", "instructions": "Be brief.",
        "input": "Hi", "max_output_tokens": 64 });
    let (mut host, mut stage) =
        ingress_call(ProviderKind::Anthropic, Protocol::Responses, false, body);
    assert_eq!(path_of(&host), "/v1/messages");
    let sent = sent(&host);
    assert_eq!(sent["system"], "Be brief.");
    assert_eq!(sent["max_tokens"], 64);
    assert_eq!(
        host.text(Side::Request, "anthropic-version").as_deref(),
        Some(ANTHROPIC_VERSION),
        "the adapter's own version, not a Messages caller's"
    );
    answer(
        &mut stage,
        &mut host,
        200,
        &[("content-type", "application/json")],
        r#"{"id":"msg_1","type":"message","model":"m1","content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":2}}"#,
    );
    let response = answered(&host);
    assert_eq!(response["object"], "response");
    assert_eq!(response["instructions"], "Be brief.");
    assert_eq!(response["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(response["usage"]["output_tokens"], 2);
}

#[test]
fn a_stateful_responses_call_reaches_an_openai_lane_natively() {
    let body = serde_json::json!({ "model": "chat", "input": "Hi", "store": true,
        "stream": true, "previous_response_id": "resp_1", "tools": [{ "type": "web_search" }] });
    let (mut host, mut stage) = ingress_call(
        ProviderKind::Openai,
        Protocol::Responses,
        true,
        body.clone(),
    );
    assert_eq!(path_of(&host), "/v1/responses");
    let mut expected = body;
    expected["model"] = "m1".into();
    assert_eq!(sent(&host), expected, "only the model is rewritten");
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"text/event-stream");
    stage.on_response_headers(&mut host, false);
    let created =
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{}}\n\n";
    host.response_body = created.as_bytes().to_vec();
    assert_eq!(
        stage.on_response_body(&mut host, created.len(), false),
        Flow::Pause
    );
    let rest = concat!(
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
    );
    host.response_body.extend_from_slice(rest.as_bytes());
    let size = host.response_body.len();
    stage.on_response_body(&mut host, size, true);
    assert_eq!(
        String::from_utf8_lossy(&host.response_body),
        format!("{created}{rest}"),
        "passed through as it came"
    );
    assert_eq!(host.attempts[0].outcome().text(), "success");
    assert_eq!(host.attempts[0].usage.map(|u| u.prompt_tokens), Some(3));
}

#[test]
fn a_daily_quota_error_in_a_stream_lasts_until_the_configured_zones_midnight() {
    // p1 (openai-compatible: no calendar of its own) is configured with China's day.
    let mut snap = snapshot();
    snap.providers[0].daily_reset_zone = "Asia/Shanghai".into();
    let plan = plan(true);
    let mut host = host_with(snap, &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"text/event-stream");
    stage.on_response_headers(&mut host, false);
    let event = "data: {\"error\":{\"message\":\"Tokens per day limit exceeded.\",\"type\":\"insufficient_quota\",\"code\":\"insufficient_quota\"}}\n\n";
    host.response_body = event.as_bytes().to_vec();
    assert_eq!(
        stage.on_response_body(&mut host, event.len(), false),
        Flow::Continue
    );
    assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
    let midnight = ai_router_contract::kinds::DailyReset::Offset(480).next_midnight_ms(NOW + 5);
    let holds = host.lanes.holds(&LaneId::new("p1", "a", "m1"));
    assert!(
        holds.iter().any(|h| matches!(
            h,
            crate::vocab::LocalHold::Blacklist { until_ms, .. } if *until_ms == midnight
        )),
        "the key is out until midnight in Shanghai: {holds:?}"
    );
}

#[test]
fn a_released_chunk_that_goes_on_as_it_came_is_left_in_envoy_s_buffer() {
    let plan = plan(true);
    let mut host = host_with(snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    send(&mut stage, &mut host);
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, "content-type", b"text/event-stream");
    assert_eq!(stage.on_response_headers(&mut host, false), Flow::Pause);
    // Held, then released with the first token: written (the held events go out with it).
    assert_eq!(chunk(&mut stage, &mut host, "Hi"), Flow::Continue);
    // Whole events after the first token: no write.
    host.reset_tallies();
    assert_eq!(chunk(&mut stage, &mut host, " there"), Flow::Continue);
    assert_eq!(host.host_calls().get("set_body"), None);
    assert!(String::from_utf8_lossy(&host.response_body).contains(" there"));
    // A chunk that ends inside an event: what goes on is its whole events only, written.
    let whole = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"}}]}\n\n";
    host.response_body = format!("{whole}data: {{\"choi").into_bytes();
    host.reset_tallies();
    let size = host.response_body.len();
    assert_eq!(
        stage.on_response_body(&mut host, size, false),
        Flow::Continue
    );
    assert_eq!(host.host_calls().get("set_body"), Some(&1));
    assert_eq!(String::from_utf8_lossy(&host.response_body), whole);
}
