//! Golden tests: requests recorded from the real agents (testdata/protocols/<agent>.json, each
//! its first request to the gateway) translated for each lane kind and compared with the
//! reviewed snapshots in testdata/protocols/golden/. A native lane takes the request as it
//! came. `UPDATE_GOLDEN=1 cargo test -p ai-router-filter-core golden` rewrites the snapshots;
//! review the diff.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use ai_router_proto::v1::ProviderKind;
use serde_json::{json, Value};

use crate::ingress::lane_request;
use crate::plan::Protocol;

fn protocols_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/protocols")
}

fn recorded(name: &str) -> Value {
    let path = protocols_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str::<Value>(&text).unwrap()["body"].clone()
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
