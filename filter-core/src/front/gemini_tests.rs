//! The Gemini API through the front stage on the fake host: the key by `x-goog-api-key` or
//! `?key=` (taken out of the path), the body translated to chat completions once, the model
//! list and every error in Google's shape.

use super::*;
use crate::testing::{model, open_key, provider, FakeHost};
use ai_router_proto::v1::Snapshot;

const KEY: &str = "sk-starci-app-0123456789abcdef";

fn client(method: &str, path: &str, extra: &[(&str, &str)]) -> FakeHost {
    let mut snap = Snapshot::default();
    snap.providers.push(provider(
        "p1",
        "sk-provider-a",
        vec![model("m1", &["chat"])],
    ));
    snap.virtual_keys.push(open_key("key_app", KEY));
    let mut host = FakeHost::with_state(State::new(1, snap));
    host.add(Side::Request, ":method", method.as_bytes());
    host.add(Side::Request, ":path", path.as_bytes());
    host.add(Side::Request, "x-request-id", b"rid-1");
    for (k, v) in extra {
        host.add(Side::Request, k, v.as_bytes());
    }
    host
}

fn send(front: &mut Front, host: &mut FakeHost, body: &str) -> Flow {
    host.request_body = body.as_bytes().to_vec();
    front.on_request_body(host, body.len(), true)
}

const BODY: &str = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":5},"aFieldFromTheFuture":1}"#;

#[test]
fn a_query_key_authenticates_and_leaves_the_path() {
    let path = format!("/v1beta/models/chat:streamGenerateContent?key={KEY}&alt=sse");
    let mut host = client("POST", &path, &[]);
    let mut front = Front::default();
    assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
    assert!(host.answered.is_none());
    assert_eq!(
        host.text(Side::Request, ":path").as_deref(),
        Some("/v1beta/models/chat:streamGenerateContent?alt=sse")
    );
    assert_eq!(send(&mut front, &mut host, BODY), Flow::Continue);
    let plan = host.planned().expect("a plan");
    assert_eq!(plan.protocol, Protocol::Gemini);
    assert!(plan.stream && !plan.json_array);
    // The attempts get the caller's body whole (a gemini lane takes it natively, the others
    // its translation).
    let sent: Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(sent, serde_json::from_str::<Value>(BODY).unwrap());
}

#[test]
fn a_header_key_and_the_json_array_stream() {
    let mut host = client(
        "POST",
        "/v1beta/models/chat:streamGenerateContent",
        &[("x-goog-api-key", KEY)],
    );
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    assert!(host.header(Side::Request, "x-goog-api-key").is_none());
    assert_eq!(send(&mut front, &mut host, BODY), Flow::Continue);
    let plan = host.planned().unwrap();
    assert!(plan.stream && plan.json_array);
}

#[test]
fn errors_are_in_googles_shape() {
    // Method, path, headers, body, the status and Google's word for it.
    type Case<'a> = (
        &'a str,
        &'a str,
        Vec<(&'a str, &'a str)>,
        Option<&'a str>,
        u16,
        &'a str,
    );
    let cases: [Case; 6] = [
        (
            "POST",
            "/v1beta/models/chat:generateContent",
            vec![],
            None,
            401,
            "UNAUTHENTICATED",
        ),
        (
            "POST",
            "/v1beta/models/chat:generateContent?key=sk-nope",
            vec![],
            None,
            401,
            "UNAUTHENTICATED",
        ),
        (
            "POST",
            "/v1beta/models/nope:generateContent",
            vec![("x-goog-api-key", KEY)],
            Some(BODY),
            404,
            "NOT_FOUND",
        ),
        (
            "POST",
            "/v1beta/models/chat:generateContent",
            vec![("x-goog-api-key", KEY)],
            Some(
                r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"googleSearch":{}}]}"#,
            ),
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/v1beta/models/chat:predict",
            vec![("x-goog-api-key", KEY)],
            None,
            404,
            "NOT_FOUND",
        ),
        (
            "GET",
            "/v1beta/models/chat:generateContent",
            vec![("x-goog-api-key", KEY)],
            None,
            405,
            "UNIMPLEMENTED",
        ),
    ];
    for (method, path, headers, body, status, word) in cases {
        let mut host = client(method, path, &headers);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        if let Some(body) = body {
            send(&mut front, &mut host, body);
        }
        let a = host
            .answered
            .clone()
            .unwrap_or_else(|| panic!("{path}: answered"));
        let v = a.json();
        assert_eq!(
            (a.status, v["error"]["status"].as_str()),
            (status, Some(word)),
            "{path}: {v}"
        );
        assert_eq!(v["error"]["code"], status);
    }
    // A final error from the attempts, re-dressed.
    let mut host = client(
        "POST",
        "/v1beta/models/chat:generateContent",
        &[("x-goog-api-key", KEY)],
    );
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    send(&mut front, &mut host, BODY);
    host.add(Side::Response, ":status", b"503");
    host.add(Side::Response, H_FINAL_STATUS, b"503");
    host.add(Side::Response, H_ATTEMPT, b"2");
    front.on_response_headers(&mut host, false);
    host.response_body = GatewayError::of(ErrorCode::PoolUnavailable).body();
    let size = host.response_body.len();
    front.on_response_body(&mut host, size, true);
    let v: Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(v["error"]["status"], "UNAVAILABLE", "{v}");
    assert_eq!(v["error"]["details"][0]["reason"], "pool_unavailable");
}

#[test]
fn count_tokens_and_the_model_list() {
    let mut host = client(
        "POST",
        "/v1beta/models/chat:countTokens",
        &[("x-goog-api-key", KEY)],
    );
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    send(&mut front, &mut host, BODY);
    let a = host.answered.clone().expect("answered by the gateway");
    assert_eq!(a.status, 200);
    assert!(a.json()["totalTokens"].as_u64().is_some_and(|n| n > 0));

    let mut host = client("GET", "/v1beta/models", &[("x-goog-api-key", KEY)]);
    Front::default().on_request_headers(&mut host, true);
    let list = host.answered.clone().expect("a list").json();
    let names: Vec<&str> = list["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(
        names.contains(&"models/chat") && names.contains(&"models/m1"),
        "{list}"
    );
    let mut host = client("GET", "/v1beta/models/m1", &[("x-goog-api-key", KEY)]);
    Front::default().on_request_headers(&mut host, true);
    assert_eq!(host.answered.clone().unwrap().json()["name"], "models/m1");
    // The genai SDKs list on /v1/models: a Google client gets Google's shape there.
    let mut host = client("GET", "/v1/models", &[("x-goog-api-key", KEY)]);
    Front::default().on_request_headers(&mut host, true);
    assert!(host.answered.clone().unwrap().json()["models"].is_array());
    let path = format!("/v1/models/m1?key={KEY}");
    let mut host = client("GET", &path, &[]);
    Front::default().on_request_headers(&mut host, true);
    assert_eq!(host.answered.clone().unwrap().json()["name"], "models/m1");
    // An OpenAI client there gets OpenAI's.
    let auth = format!("Bearer {KEY}");
    let mut host = client("GET", "/v1/models", &[("authorization", &auth)]);
    Front::default().on_request_headers(&mut host, true);
    assert_eq!(host.answered.clone().unwrap().json()["object"], "list");
}
