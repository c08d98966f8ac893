//! Harness for the end-to-end tests: real binaries on ephemeral ports, driven over HTTP.
//!
//! Every process (`ai-router mock`, `ai-router serve`, Envoy) is started on port 0; its bound
//! address is read from the one JSON line it prints on stdout (Envoy: from its admin address file
//! and admin API). Each process writes stdout and stderr to files in a per-test directory,
//! `target/e2e/<test>-<pid>-<n>/`, whose tails go into every error this harness returns and are
//! printed when a test panics while a fixture is alive. Everything is killed on drop. Nothing
//! waits by sleeping: readiness is polled with a deadline.
//!
//! Tools come from the environment (`scripts/test.sh` sets them all):
//! `AI_ROUTER_BIN` (else `<workspace>/target/debug/ai-router`), `ENVOY_BIN` (else
//! `<workspace>/.venv/bin/envoy`, else `envoy` on PATH), `AI_ROUTER_WASM` (else `<workspace>/target/wasm32-wasip1/release/ai_router_filter.wasm`)
//! and `AI_ROUTER_PYTHON` (else `<workspace>/.venv/bin/python`). A missing tool is an error
//! naming the setup command: a test never passes by skipping.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::fs::{self, File};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use futures::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

/// How long a server may take to print its address.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long Envoy may take to load the filter and receive its first state.
pub const ENVOY_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The bound on any single HTTP exchange the tests make.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How often readiness is polled.
const POLL_EVERY: Duration = Duration::from_millis(25);
/// Lines of each log shown in an error.
const TAIL_LINES: usize = 60;

const SETUP_HINT: &str = "run ./scripts/setup.sh (or the whole check, ./scripts/test.sh, which \
                          builds everything and sets AI_ROUTER_BIN, ENVOY_BIN, AI_ROUTER_WASM and \
                          AI_ROUTER_PYTHON)";

// The harness by role: tools and directories, processes, the mock provider, the control plane,
// Envoy, the client side (requests, replies, SSE), the admin API's client, the one fixture
// builder and the fixtures built with it.
mod admin;
mod builder;
mod client;
mod control_plane;
mod envoy;
mod faults;
mod fixture;
mod mock;
mod process;
pub mod scan;
pub mod servers;
mod tools;
mod up;

pub use admin::*;
pub use builder::*;
pub use client::*;
pub use control_plane::*;
pub use envoy::*;
pub use faults::*;
pub use fixture::*;
pub use mock::*;
pub use process::*;
pub use tools::*;
pub use up::*;

/// Mock script building blocks (`PUT /_mock/script`).
pub mod script {
    use serde_json::{json, Value};

    /// A rule: `match` (any of `key`, `model`, `path`) and replies used in order, the last
    /// repeating.
    pub fn rule(matcher: Value, replies: Vec<Value>) -> Value {
        json!({ "match": matcher, "replies": replies })
    }

    /// A rule for every request.
    pub fn always(replies: Vec<Value>) -> Value {
        rule(json!({}), replies)
    }

    /// A rule for one provider key (its secret).
    pub fn for_key(key: &str, replies: Vec<Value>) -> Value {
        rule(json!({ "key": key }), replies)
    }

    /// A successful reply: `text` for a unary call, `chunks` (whose concatenation is `text`)
    /// for a stream.
    pub fn text(text: &str) -> Value {
        json!({ "text": text })
    }

    /// A streamed reply of `chunks`.
    pub fn stream(chunks: &[&str]) -> Value {
        json!({ "text": chunks.concat(), "stream": { "chunks": chunks } })
    }

    /// A streamed reply that fails after `fail_after` content chunks with `fail_with`
    /// (`network`, `error-event` or `truncate`).
    pub fn stream_failing(chunks: &[&str], fail_after: usize, fail_with: &str) -> Value {
        json!({
            "stream": { "chunks": chunks, "failAfter": fail_after, "failWith": fail_with }
        })
    }

    /// A provider that is down: 503 with an OpenAI error body.
    pub fn down() -> Value {
        status(
            503,
            json!({}),
            Some(
                json!({"error": {"message": "down", "type": "server_error", "param": null, "code": null}}),
            ),
        )
    }

    /// One of the mock's real provider error answers, `<kind>.<case>`.
    pub fn provider_error(name: &str) -> Value {
        json!({ "providerError": name })
    }

    /// An HTTP status with headers and, if given, a JSON body.
    pub fn status(status: u16, headers: Value, body: Option<Value>) -> Value {
        let mut r = json!({ "status": status, "headers": headers });
        if let Some(b) = body {
            r["body"] = b;
        }
        r
    }

    /// Replies of a scope with `left` requests left, as a provider counts it down: the first
    /// says `left` at once; each later one, a second later (so that calls racing for the scope
    /// are all decided before any answer comes back), says one less; at 0 they refuse (429).
    pub fn counting_down(left: u32) -> Vec<Value> {
        let mut replies: Vec<Value> = (0..=left)
            .rev()
            .map(|n| {
                json!({
                    "text": "ok",
                    "latencyMs": if n == left { 0 } else { 1_000 },
                    "headers": {
                        "x-ratelimit-remaining-requests": n.to_string(),
                        "x-ratelimit-reset-requests": "60s"
                    }
                })
            })
            .collect();
        replies.push(status(
            429,
            json!({ "retry-after": "60" }),
            Some(json!({ "error": { "message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded" } })),
        ));
        replies
    }
}

/// Checks the OpenAI error shape `{"error": {"message", "type", "param", "code"}}` with `code`
/// and returns a description of what is wrong, if anything.
pub fn openai_error_problem(reply: &Reply, status: u16, code: &str) -> Option<String> {
    let mut problems = Vec::new();
    if reply.status != status {
        problems.push(format!("status {} (expected {status})", reply.status));
    }
    match reply.json.get("error") {
        Some(Value::Object(e)) => {
            let message = e.get("message").and_then(Value::as_str).unwrap_or_default();
            if message.is_empty() {
                problems.push("error.message is not a non-empty string".into());
            }
            if !e.get("type").is_some_and(Value::is_string) {
                problems.push("error.type is not a string".into());
            }
            if !e.contains_key("param") {
                problems.push("error.param is missing (null is fine)".into());
            }
            if e.get("code").and_then(Value::as_str) != Some(code) {
                problems.push(format!(
                    "error.code is {:?} (expected {code:?})",
                    e.get("code")
                ));
            }
        }
        _ => problems.push("no error object".into()),
    }
    let ct = reply.header("content-type").unwrap_or_default();
    if !ct.starts_with("application/json") {
        problems.push(format!("content-type {ct:?} (expected application/json)"));
    }
    (!problems.is_empty()).then(|| format!("{}\n--- reply ---\n{reply}", problems.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parsing_handles_line_endings_multiline_data_and_comments() {
        let body =
            ": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: l1\ndata: l2\n\ndata: [DONE]";
        assert_eq!(parse_sse(body), vec!["{\"a\":1}", "l1\nl2", "[DONE]"]);
        assert_eq!(parse_sse("data:x\n\n\n\ndata: y\n\n"), vec!["x", "y"]);
    }

    #[test]
    fn a_missing_tool_is_an_error_naming_the_setup_script() {
        let err = tool_from_env(
            "AI_ROUTER_E2E_UNSET_VARIABLE",
            PathBuf::from("/nonexistent/envoy"),
            "Envoy",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("./scripts/setup.sh"), "{err}");
        assert!(err.contains("./scripts/test.sh"), "{err}");
        assert!(err.contains("/nonexistent/envoy"), "{err}");
    }

    #[test]
    fn public_listener_skips_internal_listeners() {
        let v = json!({"listener_statuses": [
            {"name": "attempt", "local_address": {"envoy_internal_address": {"server_listener_name": "attempt"}}},
            {"name": "public", "local_address": {"socket_address": {"address": "127.0.0.1", "port_value": 4242}}}
        ]});
        assert_eq!(
            public_listener(&v),
            Some(SocketAddr::from(([127, 0, 0, 1], 4242)))
        );
    }

    #[test]
    fn mock_call_headers_accept_maps_and_pairs() {
        let c = MockCall::from_value(
            &json!({"seq": 1, "headers": {"Authorization": "Bearer k", "x": ["1", "2"]}}),
        );
        assert_eq!(c.header("authorization").as_deref(), Some("Bearer k"));
        assert_eq!(c.header_pairs().len(), 3);
        let c = MockCall::from_value(&json!({"headers": [["Authorization", "Bearer k"]]}));
        assert_eq!(c.header("authorization").as_deref(), Some("Bearer k"));
    }
}
