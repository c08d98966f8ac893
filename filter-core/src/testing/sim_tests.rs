//! Whole calls through both stages over one shared store ([`CallSim`]): each test says what
//! the providers answer, then checks what the caller received and what the store holds.
//!
//! To add one: build a pool ([`pool`]), script one [`Reply`] per attempt that reaches a
//! provider, run [`CallSim::call`], and assert on the [`Received`] and on `sim.vm` (holds,
//! in-flight counts, the attempts' and the call's reports).

use ai_router_proto::v1::{
    AttemptResult, ErrorClass as ProtoClass, Provider, ProviderKind, RequestResult, Snapshot,
};
use serde_json::{json, Value};

use super::*;
use crate::testing::{open_key, provider_of_kind};
use crate::vm::view::View;
use crate::vocab::{LaneId, LocalHold};
use ai_router_contract::failure::ErrorClass;

const KEY: &str = "sk-starci-tenant-0123456789";

/// A provider of `kind` with these keys (secret `sk-<id>-<key>-secret`) and one model,
/// named `alias` too.
fn provider(id: &str, kind: ProviderKind, keys: &[&str], model_id: &str, alias: &str) -> Provider {
    let mut p = provider_of_kind(id, kind, keys, model_id);
    p.models[0].aliases = vec![alias.into()];
    p
}

/// `chat` is m1 at p1 (OpenAI-compatible, keys a and b); `claude` is m2 at p2 (Anthropic, key
/// c). The tenant's key [`KEY`] may use both.
fn pool() -> State {
    let mut snap = Snapshot::default();
    let p1 = provider(
        "p1",
        ProviderKind::OpenaiCompatible,
        &["a", "b"],
        "m1",
        "chat",
    );
    let p2 = provider("p2", ProviderKind::Anthropic, &["c"], "m2", "claude");
    snap.providers = vec![p1, p2];
    snap.virtual_keys.push(open_key("key_tenant", KEY));
    State::new(1, snap)
}

fn chat(model: &str, content: &str, stream: bool) -> Request {
    let body = json!({ "model": model, "stream": stream,
        "messages": [{ "role": "user", "content": content }] });
    Request::chat(KEY, &body)
}

/// The p1 key an attempt was sent with.
fn key_of(sent: &Sent) -> String {
    let auth = sent.header("authorization").unwrap_or_default();
    let key = auth.trim_start_matches("Bearer sk-p1-");
    key.trim_end_matches("-secret").to_string()
}

fn ok_chat(text: &str) -> Reply {
    Reply::json(
        200,
        &json!({ "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m1",
            "system_fingerprint": "fp_1",
            "choices": [{ "index": 0, "finish_reason": "stop",
                "message": { "role": "assistant", "content": text } }],
            "usage": { "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5 } }),
    )
}

fn role_event() -> String {
    json!({ "choices": [{ "index": 0, "delta": { "role": "assistant" } }] }).to_string()
}

fn content_event(text: &str) -> String {
    json!({ "choices": [{ "index": 0, "delta": { "content": text } }] }).to_string()
}

fn stop_event() -> String {
    json!({ "choices": [{ "index": 0, "delta": {}, "finish_reason": "stop" }] }).to_string()
}

/// The contents of a chat stream's chunks, in order (empty ones left out), and its role chunks.
fn contents(got: &Received) -> (Vec<String>, usize) {
    let chunks: Vec<Value> = got
        .events()
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect();
    let delta = |c: &Value, field: &str| c["choices"][0]["delta"][field].as_str().map(String::from);
    let texts = chunks
        .iter()
        .filter_map(|c| delta(c, "content"))
        .filter(|t| !t.is_empty())
        .collect();
    let roles = chunks.iter().filter(|c| delta(c, "role").is_some()).count();
    (texts, roles)
}

fn holds(sim: &CallSim, key: &str) -> Vec<LocalHold> {
    sim.vm.lanes.holds(&LaneId::new("p1", key, "m1"))
}

fn other(key: &str) -> &'static str {
    if key == "a" {
        "b"
    } else {
        "a"
    }
}

/// The attempts' outcomes as reported: (result, class) in order.
fn attempt_outcomes(sim: &CallSim) -> Vec<(AttemptResult, ProtoClass)> {
    sim.vm
        .attempts
        .iter()
        .map(|a| (a.outcome(), a.error_class()))
        .collect()
}

#[test]
fn a_429_on_the_first_key_fails_over_to_the_second_which_the_next_call_goes_to_first() {
    let mut sim = CallSim::new(pool());
    let limited = json!({ "error": { "message": "Rate limit reached for requests",
        "type": "requests", "code": "rate_limit_exceeded" } });
    sim.reply(Reply::json(429, &limited).header("retry-after", "20"))
        .reply(ok_chat("hi"));

    let got = sim.call(chat("chat", "hello", false));

    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json()["choices"][0]["message"]["content"], "hi");
    assert_eq!(got.header("x-ai-router-attempts"), Some("2"));
    assert_eq!(got.sent.len(), 2);
    let (first, second) = (key_of(&got.sent[0]), key_of(&got.sent[1]));
    assert_eq!(
        second,
        other(&first),
        "the second attempt used the other key"
    );
    // The store: the first key's lane cooled down for the provider's 20 s, the other free.
    let now = sim.vm.now;
    match holds(&sim, &first).as_slice() {
        [LocalHold::Cooldown { until_ms, .. }] => assert!(*until_ms >= now + 19_000),
        other => panic!("one cooldown on p1/{first}/m1, got {other:?}"),
    }
    assert!(holds(&sim, &second).is_empty());
    assert_eq!(
        attempt_outcomes(&sim),
        [
            (AttemptResult::Error, ProtoClass::RateLimit),
            (AttemptResult::Success, ProtoClass::Unspecified)
        ]
    );
    assert_eq!(sim.vm.reports.len(), 1);
    assert_eq!(sim.vm.reports[0].outcome(), RequestResult::Success);
    assert_eq!(sim.vm.reports[0].attempts, 2);
    assert!(sim.vm.calls.is_empty(), "the call ended");
    assert_eq!(sim.vm.lanes.provider_in_flight("p1"), 0);

    // The next call reads the same store: the cooled key is passed over.
    sim.reply(ok_chat("again"));
    let got = sim.call(chat("chat", "hello", false));
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.sent.len(), 1);
    assert_eq!(key_of(&got.sent[0]), second);
}

#[test]
fn a_held_stream_failing_before_its_first_token_is_retried_and_the_caller_sees_one_clean_stream() {
    let mut sim = CallSim::new(pool());
    // The provider sends its headers and a role chunk (no token yet), then its connection breaks.
    sim.reply(Reply::sse(&[&role_event()]).reset_after(1));
    let good = [
        role_event(),
        content_event("Hello"),
        content_event(" there"),
        stop_event(),
        "[DONE]".into(),
    ];
    sim.reply(Reply::sse(
        &good.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    let started = sim.vm.now;

    let got = sim.call(chat("chat", "hello", true));

    assert_eq!(got.status, 200, "{}", got.text());
    assert!(!got.cut, "{}", got.text());
    assert!(got
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream")));
    let (texts, roles) = contents(&got);
    assert_eq!(texts, ["Hello", " there"], "{}", got.text());
    assert_eq!(
        roles,
        1,
        "one role chunk, not the failed attempt's too:\n{}",
        got.text()
    );
    assert_eq!(got.events().last().map(String::as_str), Some("[DONE]"));
    assert!(!got.text().contains("error"), "{}", got.text());
    assert_eq!(got.sent.len(), 2);
    // The store: a broken connection holds nothing, counts for the breakers, and the next
    // attempt waited out the call's backoff.
    assert_eq!(
        attempt_outcomes(&sim),
        [
            (AttemptResult::Error, ProtoClass::Network),
            (AttemptResult::Success, ProtoClass::Unspecified)
        ]
    );
    assert!(holds(&sim, "a").is_empty() && holds(&sim, "b").is_empty());
    assert!(sim.vm.now > started, "the backoff's timer ran");
    assert_eq!(sim.vm.reports[0].outcome(), RequestResult::Success);
    assert_eq!(sim.vm.lanes.provider_in_flight("p1"), 0);
}

#[test]
fn a_stream_failing_after_its_first_token_is_cut_and_not_retried() {
    let mut sim = CallSim::new(pool());
    sim.reply(
        Reply::sse(&[&role_event(), &content_event("Hi"), &content_event(" more")]).reset_after(2),
    );

    let got = sim.call(chat("chat", "hello", true));

    assert_eq!(got.status, 200);
    assert!(got.cut, "the caller's stream broke off");
    let (texts, _) = contents(&got);
    assert_eq!(texts, ["Hi"], "{}", got.text());
    assert_eq!(got.sent.len(), 1, "no retry after the first token");
    assert_eq!(sim.replies_left(), 0);
    assert_eq!(
        attempt_outcomes(&sim),
        [(AttemptResult::Error, ProtoClass::Stream)]
    );
    assert_eq!(sim.vm.reports[0].outcome(), RequestResult::Error);
    assert_eq!(sim.vm.reports[0].error_class(), ProtoClass::Stream);
}

/// OpenAI's answer to a refused secret.
fn refused_key(status: u16, message: &str) -> Reply {
    Reply::json(
        status,
        &json!({ "error": { "message": message, "type": "invalid_request_error",
            "code": "invalid_api_key" } }),
    )
}

#[test]
fn a_401_blacklists_the_key_and_the_call_moves_to_the_next() {
    let mut sim = CallSim::new(pool());
    sim.reply(refused_key(
        401,
        "Incorrect API key provided: sk-p1-a-secret.",
    ))
    .reply(ok_chat("hi"));

    let got = sim.call(chat("chat", "hello", false));

    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.sent.len(), 2);
    let first = key_of(&got.sent[0]);
    assert_eq!(key_of(&got.sent[1]), other(&first));
    // A blacklist holds every model of the key.
    for model in ["m1", "a-model-added-later"] {
        let held = sim.vm.lanes.holds(&LaneId::new("p1", &first, model));
        assert!(
            matches!(
                held.as_slice(),
                [LocalHold::Blacklist {
                    class: ErrorClass::Auth,
                    ..
                }]
            ),
            "{model}: {held:?}"
        );
    }
    assert!(holds(&sim, other(&first)).is_empty());
    assert!(!got.text().contains("secret"), "{}", got.text());
}

#[test]
fn a_tenants_words_echoed_back_in_a_400_do_not_take_the_shared_key_out() {
    // Anthropic's refusal of a key without credit, in a 400: by its words, a spent key.
    let no_credit = || {
        Reply::json(
            400,
            &json!({ "type": "error", "error": { "type": "invalid_request_error",
                "message": "Your credit balance is too low to access the Anthropic API." } }),
        )
    };
    let p2_holds = |sim: &CallSim| sim.vm.lanes.holds(&LaneId::new("p2", "c", "m2"));
    let mut sim = CallSim::new(pool());
    sim.reply(no_credit());

    // The tenant wrote those words: the provider may be repeating them.
    let got = sim.call(chat(
        "claude",
        "why does it say your credit balance is too low?",
        false,
    ));

    // The caller gets the provider's refusal; the call stops there, and p2's only key stays in.
    assert_eq!(got.status, 400, "{}", got.text());
    assert_eq!(got.sent.len(), 1);
    assert_eq!(
        attempt_outcomes(&sim),
        [(AttemptResult::Error, ProtoClass::InvalidRequest)]
    );
    assert!(p2_holds(&sim).is_empty(), "{:?}", p2_holds(&sim));

    // The same answer to a request without those words is the provider's own: the key is out
    // (the rule above is what kept it in), and with it the only lane of `claude`.
    sim.reply(no_credit());
    let got = sim.call(chat("claude", "hello", false));
    assert!(
        matches!(
            p2_holds(&sim).as_slice(),
            [LocalHold::Blacklist {
                class: ErrorClass::Quota,
                ..
            }]
        ),
        "{:?}",
        p2_holds(&sim)
    );
    assert_eq!(got.status, 503, "{}", got.text());
    assert_eq!(got.json()["error"]["code"], "pool_quota_exhausted");
}

#[test]
fn a_chat_call_to_a_lane_of_its_own_protocol_goes_through_untouched() {
    let mut sim = CallSim::new(pool());
    sim.reply(ok_chat("hi"));
    let body = json!({ "model": "chat", "messages": [{ "role": "user", "content": "hello" }],
        "x_vendor_field": { "kept": true } });

    let got = sim.call(Request::chat(KEY, &body));

    assert_eq!(got.status, 200, "{}", got.text());
    let sent = &got.sent[0];
    assert_eq!(sent.header(":authority"), Some("p1.test:8000"));
    assert_eq!(sent.header(":path"), Some("/v1/chat/completions"));
    assert_eq!(sent.json()["x_vendor_field"], json!({ "kept": true }));
    assert_eq!(sent.json()["model"], "m1");
    assert!(sent
        .header("authorization")
        .is_some_and(|a| a.starts_with("Bearer sk-p1-")));
    assert!(
        !sent.headers.iter().any(|(_, v)| v.contains(KEY)),
        "the tenant's key never reaches a provider"
    );
    // The provider's answer as it came, fields the gateway does not model included.
    assert_eq!(got.json()["system_fingerprint"], "fp_1");
    assert_eq!(got.header("x-ai-router-model"), Some("m1"));
    let report = &sim.vm.attempts[0];
    assert_eq!(report.usage.as_ref().map(|u| u.prompt_tokens), Some(3));
}

#[test]
fn a_chat_call_to_an_anthropic_lane_is_translated_both_ways() {
    let mut sim = CallSim::new(pool());
    sim.reply(Reply::json(
        200,
        &json!({ "id": "msg_1", "type": "message", "role": "assistant", "model": "m2",
            "content": [{ "type": "text", "text": "Hello" }], "stop_reason": "end_turn",
            "usage": { "input_tokens": 3, "output_tokens": 2 } }),
    ));

    let got = sim.call(chat("claude", "hello", false));

    assert_eq!(got.status, 200, "{}", got.text());
    let sent = &got.sent[0];
    assert_eq!(sent.header(":path"), Some("/v1/messages"));
    assert_eq!(sent.header("x-api-key"), Some("sk-p2-c-secret"));
    assert!(sent.header("anthropic-version").is_some());
    assert!(sent.header("authorization").is_none());
    let body = sent.json();
    assert_eq!(body["model"], "m2");
    assert!(body["max_tokens"].as_u64().is_some_and(|n| n > 0), "{body}");
    assert_eq!(body["messages"][0]["content"][0]["text"], "hello", "{body}");
    // The caller gets an OpenAI chat completion.
    let answer = got.json();
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "Hello");
    assert_eq!(answer["usage"]["prompt_tokens"], 3);
    assert_eq!(sim.vm.reports[0].provider, "p2");
    assert_eq!(sim.vm.reports[0].outcome(), RequestResult::Success);
}

#[test]
fn when_every_attempt_is_rate_limited_the_caller_gets_the_final_error_and_every_key_cools() {
    let mut sim = CallSim::new(pool());
    let limited =
        json!({ "error": { "message": "Rate limit reached", "code": "rate_limit_exceeded" } });
    for _ in 0..2 {
        sim.reply(Reply::json(429, &limited).header("retry-after", "3600"));
    }

    let got = sim.call(chat("chat", "hello", false));

    // Both keys cooled for an hour, past the call's deadline: no lane is left to wait for, and
    // the third attempt answers the final error without a provider.
    assert_eq!(got.status, 503, "{}", got.text());
    assert_eq!((got.sent.len(), got.attempts), (2, 3));
    assert_eq!(
        got.json()["error"]["code"],
        "pool_rate_limited",
        "{}",
        got.text()
    );
    assert!(got.header("retry-after").is_some());
    assert!(!holds(&sim, "a").is_empty() && !holds(&sim, "b").is_empty());
    assert_eq!(sim.vm.reports[0].outcome(), RequestResult::Error);
}

/// Anthropic's events for a stream that says `parts`.
fn anthropic_stream(parts: &[&str]) -> Reply {
    let mut events = vec![
        json!({ "type": "message_start", "message": { "id": "msg_1", "type": "message",
            "role": "assistant", "model": "m2", "content": [],
            "usage": { "input_tokens": 3, "output_tokens": 0 } } }),
        json!({ "type": "content_block_start", "index": 0,
            "content_block": { "type": "text", "text": "" } }),
    ];
    for p in parts {
        events.push(json!({ "type": "content_block_delta", "index": 0,
            "delta": { "type": "text_delta", "text": p } }));
    }
    events.push(json!({ "type": "content_block_stop", "index": 0 }));
    events.push(
        json!({ "type": "message_delta", "delta": { "stop_reason": "end_turn" },
        "usage": { "output_tokens": 2 } }),
    );
    events.push(json!({ "type": "message_stop" }));
    let mut reply = Reply::status(200).header("content-type", "text/event-stream");
    for e in events {
        let kind = e["type"].as_str().unwrap_or_default().to_string();
        reply = reply.chunk(format!("event: {kind}\ndata: {e}\n\n").as_bytes());
    }
    reply
}

#[test]
fn a_chat_stream_from_an_anthropic_lane_reaches_the_caller_as_openai_chunks() {
    let mut sim = CallSim::new(pool());
    sim.reply(anthropic_stream(&["Hel", "lo"]));

    let got = sim.call(chat("claude", "hello", true));

    assert_eq!(got.status, 200, "{}", got.text());
    assert!(!got.cut);
    assert_eq!(got.sent[0].header(":path"), Some("/v1/messages"));
    assert_eq!(got.sent[0].json()["stream"], true);
    let (texts, roles) = contents(&got);
    assert_eq!(texts, ["Hel", "lo"], "{}", got.text());
    assert_eq!(roles, 1, "{}", got.text());
    assert_eq!(got.events().last().map(String::as_str), Some("[DONE]"));
    assert!(!got.text().contains("content_block"), "{}", got.text());
    let usage = sim.vm.attempts[0].usage.unwrap_or_default();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 2));
}

#[test]
fn a_messages_call_to_an_anthropic_lane_goes_through_in_its_own_protocol() {
    let mut sim = CallSim::new(pool());
    let answer = json!({ "id": "msg_1", "type": "message", "role": "assistant", "model": "m2",
        "content": [{ "type": "text", "text": "Hello" }], "stop_reason": "end_turn",
        "stop_sequence": null, "usage": { "input_tokens": 3, "output_tokens": 2 } });
    sim.reply(Reply::json(200, &answer));
    let body = json!({ "model": "claude", "max_tokens": 64,
        "system": [{ "type": "text", "text": "Be brief.", "cache_control": { "type": "ephemeral" } }],
        "messages": [{ "role": "user", "content": "hello" }] });
    let request =
        Request::post("/v1/messages", KEY, &body).header("anthropic-version", "2023-06-01");

    let got = sim.call(request);

    assert_eq!(got.status, 200, "{}", got.text());
    let sent = got.sent[0].json();
    assert_eq!(
        sent["system"], body["system"],
        "every block as the caller wrote it"
    );
    assert_eq!(sent["model"], "m2");
    assert_eq!(got.json()["content"], answer["content"]);
    assert_eq!(got.json()["type"], "message");
    assert_eq!(sim.vm.reports[0].outcome(), RequestResult::Success);
}
