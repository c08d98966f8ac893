//! Golden tests: requests recorded from the real agents (testdata/protocols/<agent>.json, each
//! its first request to the gateway) translated for each lane kind and compared with the
//! reviewed snapshots in testdata/protocols/golden/. A native lane takes the request as it
//! came. `UPDATE_GOLDEN=1 cargo test -p ai-router-filter-core golden` rewrites the snapshots;
//! review the diff.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use ai_router_proto::v1::ProviderKind;
use serde_json::{json, Value};

use crate::plan::Protocol;
use crate::protocols::lane_request;

fn protocols_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/protocols")
}

fn recorded(name: &str) -> Value {
    recorded_file(name)["body"].clone()
}

fn recorded_file(name: &str) -> Value {
    let path = protocols_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str::<Value>(&text).unwrap()
}

/// What the lane is sent, or the refusal (param and message) when it takes no such request.
fn translated(protocol: Protocol, kind: ProviderKind, request: &Value) -> Value {
    match lane_request(protocol, kind, request) {
        Ok(body) => body,
        Err(e) => json!({ "refused": { "param": e.param, "message": e.message } }),
    }
}

fn matches_golden(name: &str, got: &Value) {
    let path = protocols_dir().join("golden").join(format!("{name}.json"));
    let text = format!("{}\n", serde_json::to_string_pretty(got).unwrap());
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path:?}: {e} (UPDATE_GOLDEN=1 writes it)"));
    let want: Value = serde_json::from_str(&want).unwrap();
    assert!(
        &want == got,
        "{name}: the translation differs from {path:?} (UPDATE_GOLDEN=1 rewrites it; review the diff)"
    );
}

#[test]
fn claude_code_per_lane_kind() {
    let request = recorded("claude-code-messages");
    // Its own protocol: the request as it came, every field, role, block and tool kept.
    assert_eq!(
        translated(Protocol::Messages, ProviderKind::Anthropic, &request),
        request
    );
    for kind in [ProviderKind::OpenaiCompatible, ProviderKind::Openai] {
        let got = translated(Protocol::Messages, kind, &request);
        assert!(got.get("refused").is_none(), "{kind:?}: {got}");
        matches_golden("claude-code-messages.openai-compatible", &got);
    }
}

#[test]
fn codex_per_lane_kind() {
    let request = recorded("codex-responses");
    assert_eq!(
        translated(Protocol::Responses, ProviderKind::Openai, &request),
        request
    );
    // Its `web_search` tool runs only at OpenAI: refused, the type named.
    for (kind, name) in [
        (ProviderKind::OpenaiCompatible, "openai-compatible"),
        (ProviderKind::Anthropic, "anthropic"),
    ] {
        let got = translated(Protocol::Responses, kind, &request);
        assert_eq!(got["refused"]["param"], "tools", "{got}");
        assert!(got["refused"]["message"]
            .as_str()
            .unwrap()
            .contains("'web_search'"));
        // With web search off (`web_search = "disabled"` in its config): translated, the
        // namespace's tools flattened.
        let mut without = request.clone();
        without["tools"]
            .as_array_mut()
            .unwrap()
            .retain(|t| t["type"] != "web_search");
        let got = translated(Protocol::Responses, kind, &without);
        assert!(got.get("refused").is_none(), "{kind:?}: {got}");
        matches_golden(&format!("codex-responses.{name}"), &got);
    }
}

/// A Gemini request as each lane kind is sent it: the front stage's chat request (`chat`,
/// streamed, as its path says), then the Messages request for an anthropic lane.
fn gemini_translated(kind: ProviderKind, request: &Value) -> Value {
    let chat = crate::protocols::gemini::request::to_chat_request("chat", true, request)
        .and_then(|chat| lane_request(Protocol::Gemini, kind, &chat));
    match chat {
        Ok(body) => body,
        Err(e) => json!({ "refused": { "param": e.param, "message": e.message } }),
    }
}

#[test]
fn gemini_cli_per_lane_kind() {
    // Its first request (text, its function declarations) and the one after its read_file
    // call (the functionCall and its functionResponse).
    for name in ["gemini-cli-generate", "gemini-cli-tool-result"] {
        let request = recorded(name);
        for (kind, lane) in [
            (ProviderKind::OpenaiCompatible, "openai-compatible"),
            (ProviderKind::Anthropic, "anthropic"),
        ] {
            let got = gemini_translated(kind, &request);
            assert!(got.get("refused").is_none(), "{name} {kind:?}: {got}");
            matches_golden(&format!("{name}.{lane}"), &got);
        }
    }
}

/// A lane's chat stream as the Gemini caller gets it: the chunks of the SSE stream (`alt=sse`),
/// which must be those of the JSON-array stream (without it).
fn gemini_stream(sse: &str) -> Value {
    let encode = |json_array: bool| {
        let mut parser = crate::wire::sse::Parser::new();
        let mut encoder = crate::protocols::gemini::stream::StreamEncoder::new(json_array);
        let mut out = Vec::new();
        for event in parser.feed(sse.as_bytes()) {
            out.extend(crate::wire::sse::FromChatStream::feed(&mut encoder, &event));
        }
        out
    };
    let chunks: Vec<Value> = String::from_utf8(encode(false))
        .unwrap()
        .split("\r\n\r\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let array: Value = serde_json::from_slice(&encode(true)).unwrap();
    assert_eq!(array, Value::Array(chunks.clone()), "SSE and JSON array");
    Value::Array(chunks)
}

#[test]
fn gemini_answers_from_chat_answers() {
    let answers = recorded_file("chat-answers");
    for (case, golden) in [
        ("text", "gemini.answer-text"),
        ("tool_call", "gemini.answer-tool-call"),
    ] {
        let got = crate::protocols::gemini::response::from_chat_response(&answers[case]);
        matches_golden(golden, &got);
    }
    for (case, golden) in [
        ("text_stream", "gemini.stream-text"),
        ("tool_call_stream", "gemini.stream-tool-call"),
    ] {
        let got = gemini_stream(answers[case].as_str().unwrap());
        matches_golden(golden, &got);
    }
}
