use super::*;
use crate::attempt::testkit::{messages_body, plan, provider};
use ai_router_contract::clusters::{PROVIDERS_PLAIN, PROVIDERS_TLS};
use serde_json::json;

/// The request headers a caller sent: its own credentials and a header no provider gets among
/// the allowlisted ones.
fn caller_headers() -> Vec<(String, Vec<u8>)> {
    [
        ":method",
        ":path",
        ":authority",
        "content-type",
        "authorization",
        "x-api-key",
        "x-caller-secret",
        "content-length",
    ]
    .map(|name| (name.to_owned(), b"v".to_vec()))
    .to_vec()
}

fn built(plan: &Plan, provider: &Provider, body: &Value) -> ProviderRequest {
    let bytes = serde_json::to_vec(body).unwrap();
    build(
        plan,
        provider,
        &provider.keys[0],
        &provider.models[0].id,
        &bytes,
        &caller_headers(),
    )
    .unwrap()
}

fn body_of(request: &ProviderRequest) -> Value {
    serde_json::from_slice(request.bytes(b"")).unwrap()
}

fn set(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// What an OpenAI-style lane's stream request sets: the bearer key, the call's ids, the stream.
const BEARER_STREAM: &[(&str, &str)] = &[
    ("authorization", "Bearer sk-p1-a-secret"),
    ("x-request-id", "rid-1"),
    ("idempotency-key", "idem-1"),
    ("accept", "text/event-stream"),
];

/// What every request removes: the caller's headers outside the allowlist, and the length of
/// the body it replaces.
fn removed() -> Vec<String> {
    [
        "authorization",
        "content-length",
        "x-api-key",
        "x-caller-secret",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn a_chat_call_to_an_openai_compatible_lane_gets_the_lanes_model_its_bearer_key_and_usage_on_the_stream(
) {
    let mut provider = provider("p1", ProviderKind::OpenaiCompatible, &["a"], "m1");
    provider.scheme = "https".into();
    let caller = json!({ "model": "auto", "stream": true,
        "messages": [{ "role": "user", "content": "hi" }] });

    let request = built(&plan(true), &provider, &caller);

    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.authority, "p1.test:8000");
    assert_eq!(request.cluster, PROVIDERS_TLS);
    assert_eq!(
        body_of(&request),
        json!({ "model": "m1", "stream": true, "stream_options": { "include_usage": true },
            "messages": [{ "role": "user", "content": "hi" }] })
    );
    assert_eq!(request.remove, removed());
    assert_eq!(request.set, set(BEARER_STREAM));
    assert!(!request.native);
    assert_eq!(request.echo, None);
}

#[test]
fn a_chat_call_to_an_anthropic_lane_is_translated_to_messages_with_its_key_and_version() {
    let provider = provider("p1", ProviderKind::Anthropic, &["a"], "claude-x");
    let caller = json!({ "model": "auto", "messages": [
        { "role": "system", "content": "Be brief." },
        { "role": "user", "content": "hi" }] });

    let request = built(&plan(false), &provider, &caller);

    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.cluster, PROVIDERS_PLAIN);
    let body = body_of(&request);
    assert_eq!(body["model"], "claude-x");
    assert_eq!(
        body["max_tokens"],
        ai_router_contract::defaults::DEFAULT_MAX_TOKENS
    );
    assert_eq!(
        body["messages"],
        json!([{ "role": "user", "content": [{ "type": "text", "text": "hi" }] }])
    );
    assert_eq!(request.remove, removed());
    assert_eq!(
        request.set,
        set(&[
            ("x-api-key", "sk-p1-a-secret"),
            ("anthropic-version", ANTHROPIC_VERSION),
            ("x-request-id", "rid-1"),
            ("idempotency-key", "idem-1"),
        ])
    );
    assert!(!request.native);
}

#[test]
fn a_messages_call_to_an_anthropic_lane_goes_as_written_with_the_callers_version_and_betas() {
    let provider = provider("p1", ProviderKind::Anthropic, &["a"], "claude-x");
    let mut plan = plan(false);
    plan.protocol = Protocol::Messages;
    plan.anthropic_version = Some("2023-01-01".into());
    plan.anthropic_beta = Some("beta-x".into());

    let request = built(&plan, &provider, &messages_body(false));

    assert!(request.native);
    assert_eq!(request.path, "/v1/messages");
    let mut expected = messages_body(false);
    expected["model"] = json!("claude-x");
    assert_eq!(body_of(&request), expected);
    assert_eq!(
        request.set,
        set(&[
            ("x-api-key", "sk-p1-a-secret"),
            ("anthropic-version", "2023-01-01"),
            ("anthropic-beta", "beta-x"),
            ("x-request-id", "rid-1"),
            ("idempotency-key", "idem-1"),
        ])
    );

    plan.count_tokens = true;
    let request = built(&plan, &provider, &messages_body(false));
    assert_eq!(request.path, "/v1/messages/count_tokens");
}

#[test]
fn a_responses_call_to_an_openai_lane_goes_natively_and_is_kept_for_the_answer_to_echo() {
    let provider = provider("p1", ProviderKind::Openai, &["a"], "gpt-x");
    let mut plan = plan(true);
    plan.protocol = Protocol::Responses;
    let caller = json!({ "model": "auto", "input": "hi", "stream": true, "store": true });

    let request = built(&plan, &provider, &caller);

    assert!(request.native);
    assert_eq!(request.path, "/v1/responses");
    // Native: no chat `stream_options` added.
    assert_eq!(
        body_of(&request),
        json!({ "model": "gpt-x", "input": "hi", "stream": true, "store": true })
    );
    assert_eq!(request.echo, Some(caller));
    assert_eq!(request.set, set(BEARER_STREAM));
}

#[test]
fn a_gemini_call_to_a_gemini_lane_names_the_model_in_the_path_and_sends_the_key_as_x_goog_api_key()
{
    let mut provider = provider("p1", ProviderKind::Gemini, &["a"], "gemini-x");
    provider.base_path = "/v1beta/openai".into();
    let mut plan = plan(true);
    plan.protocol = Protocol::Gemini;
    let caller = json!({ "model": "auto",
        "contents": [{ "role": "user", "parts": [{ "text": "hi" }] }] });

    let request = built(&plan, &provider, &caller);

    assert!(request.native);
    assert_eq!(
        request.path,
        "/v1beta/models/gemini-x:streamGenerateContent?alt=sse"
    );
    assert_eq!(
        body_of(&request),
        json!({ "contents": [{ "role": "user", "parts": [{ "text": "hi" }] }] })
    );
    assert_eq!(request.remove, removed());
    assert_eq!(
        request.set,
        set(&[
            ("x-goog-api-key", "sk-p1-a-secret"),
            ("x-request-id", "rid-1"),
            ("idempotency-key", "idem-1"),
            ("accept", "text/event-stream"),
        ])
    );
}

#[test]
fn a_keyless_lane_gets_no_credentials_and_the_callers_are_removed() {
    let mut provider = provider("p1", ProviderKind::OpenaiCompatible, &["a"], "m1");
    provider.keys[0].secret.clear();

    let request = built(&plan(false), &provider, &json!({ "messages": [] }));

    assert_eq!(request.remove, removed());
    assert!(request
        .set
        .iter()
        .all(|(name, _)| name != "authorization" && name != "x-api-key"));
}

/// The plan as the front stage leaves it for `body`: with the top of the body it read.
fn read_plan(mut plan: Plan, body: &[u8]) -> Plan {
    let value: Value = serde_json::from_slice(body).unwrap();
    plan.body_top = Some(crate::plan::BodyTop::of(&value));
    plan
}

#[test]
fn a_chat_body_naming_the_lanes_model_goes_as_it_came_and_says_what_a_rewrite_would() {
    let lane = provider("p1", ProviderKind::OpenaiCompatible, &["a"], "m1");
    let (lane_provider, key) = (&lane, &lane.keys[0]);
    let names = caller_headers();
    let caller = br#"{ "temperature": 0.2, "model": "m1", "messages": [{"role": "user", "content": "hi"}] }"#;
    for stream in [false, true] {
        let plan = read_plan(plan(stream), caller);
        let request = build(&plan, lane_provider, key, "m1", caller, &names).unwrap();
        // A unary body goes as it came, untouched in Envoy's buffer; a stream's gets the usage.
        assert_eq!(request.body == Body::AsItCame, !stream);
        let sent = request.bytes(caller).to_vec();
        let rewritten = body_for(&plan, lane_provider, "m1", false, caller)
            .unwrap()
            .0;
        // The same request a rewrite sends, and the caller's bytes (its order, its spaces).
        assert_eq!(serde_json::from_slice::<Value>(&sent).unwrap(), rewritten);
        assert!(sent.starts_with(&caller[..caller.len() - 1]), "{stream}");
    }
    // Another model, a stream with options of its own, or an anthropic lane: rewritten.
    let other = build(
        &read_plan(plan(false), caller),
        lane_provider,
        key,
        "m2",
        caller,
        &names,
    )
    .unwrap();
    assert_eq!(body_of(&other)["model"], "m2");
    let with_options = br#"{"model":"m1","stream":true,"stream_options":{"include_usage":false}}"#;
    let streamed = read_plan(plan(true), with_options);
    let sent = build(&streamed, lane_provider, key, "m1", with_options, &names).unwrap();
    assert_eq!(body_of(&sent)["stream_options"]["include_usage"], true);
    let anthropic = provider("p1", ProviderKind::Anthropic, &["a"], "m1");
    let sent = build(
        &read_plan(plan(false), caller),
        &anthropic,
        &anthropic.keys[0],
        "m1",
        caller,
        &names,
    )
    .unwrap();
    assert!(body_of(&sent).get("max_tokens").is_some());
    // A plan without the body's top (none the front stage builds for a chat call) is
    // rewritten: the same request, not the caller's bytes.
    let sent = build(&plan(false), lane_provider, key, "m1", caller, &names).unwrap();
    assert_eq!(
        body_of(&sent),
        serde_json::from_slice::<Value>(caller).unwrap()
    );
    assert!(!sent.bytes(caller).starts_with(&caller[..caller.len() - 1]));
}

#[test]
fn an_anthropic_lanes_max_tokens_is_the_providers_pushed_default_max_tokens() {
    let mut provider = provider("p1", ProviderKind::Anthropic, &["a"], "claude-x");
    provider.default_max_tokens = 777;
    let caller = json!({ "model": "auto", "messages": [{ "role": "user", "content": "hi" }] });
    let request = built(&plan(false), &provider, &caller);
    assert_eq!(body_of(&request)["max_tokens"], 777);
}

#[test]
fn a_messages_body_naming_an_anthropic_lanes_model_goes_as_it_came() {
    let lane = provider("p1", ProviderKind::Anthropic, &["a"], "claude-x");
    let (lane_provider, key) = (&lane, &lane.keys[0]);
    let names = caller_headers();
    let caller = br#"{ "model": "claude-x", "max_tokens": 64, "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}], "messages": [{"role": "user", "content": "hi"}], "stream": true }"#;
    for (stream, count_tokens) in [(false, false), (true, false), (false, true)] {
        let mut plan = read_plan(plan(stream), caller);
        plan.protocol = Protocol::Messages;
        plan.count_tokens = count_tokens;
        let sent = build(&plan, lane_provider, key, "claude-x", caller, &names).unwrap();
        assert!(sent.native);
        // The caller's bytes, and what a rewrite would have sent.
        assert_eq!(sent.body, Body::AsItCame);
        let rewritten = body_for(&plan, lane_provider, "claude-x", true, caller)
            .unwrap()
            .0;
        assert_eq!(
            serde_json::from_slice::<Value>(sent.bytes(caller)).unwrap(),
            rewritten
        );
    }
    // Another model: the lane's written in.
    let mut plan = read_plan(plan(false), caller);
    plan.protocol = Protocol::Messages;
    let other = build(&plan, lane_provider, key, "claude-y", caller, &names).unwrap();
    assert_eq!(body_of(&other)["model"], "claude-y");
    // A Messages caller on a chat lane is translated, never passed through.
    let chat = provider("p2", ProviderKind::OpenaiCompatible, &["c"], "claude-x");
    let sent = build(&plan, &chat, &chat.keys[0], "claude-x", caller, &names).unwrap();
    assert!(!sent.native && body_of(&sent).get("system").is_none());
}
