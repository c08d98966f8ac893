//! The cache key of a resolved request, and its slot.

use serde_json::{json, Value};

use crate::plan::Operation;
use ai_router_contract::sha256_hex;

/// The body fields that make two requests the same request.
const KEYED_FIELDS: &[&str] = &[
    "messages",
    "input",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "response_format",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "dimensions",
    "encoding_format",
];

/// The cache key (hex SHA-256) of a chat-completions or embeddings request resolved to `models`.
pub fn key_of(op: Operation, models: &[&str], body: &Value) -> String {
    let mut keyed = serde_json::Map::new();
    for field in KEYED_FIELDS {
        if let Some(v) = body.get(*field) {
            keyed.insert((*field).to_owned(), v.clone());
        }
    }
    // serde_json's map is ordered by key: the same fields give the same text.
    let text = json!({ "op": op.as_str(), "models": models, "body": keyed }).to_string();
    sha256_hex(text.as_bytes())
}

/// The cache key of a caller's request (`body` as the caller sent it) resolved to `models`: a
/// chat caller's is [`key_of`]; a Messages or Responses caller's is in a space of its own
/// protocol, over its body less what does not change the answer, and for Messages the
/// `anthropic-version` and `anthropic-beta` it sent (a beta can change the answer's shape).
pub fn key_for(
    protocol: crate::plan::Protocol,
    op: Operation,
    models: &[&str],
    body: &Value,
    anthropic: (Option<&str>, Option<&str>),
) -> String {
    if protocol == crate::plan::Protocol::Chat {
        return key_of(op, models, body);
    }
    let text = json!({
        "protocol": protocol.as_str(),
        "models": models,
        "body": crate::cache::shapes::keyed_body(protocol, body),
        "anthropic": [anthropic.0, anthropic.1],
    })
    .to_string();
    sha256_hex(text.as_bytes())
}

/// The slot of `key` among `max_entries` (at least one).
pub fn slot_of(key: &str, max_entries: u32) -> u32 {
    let head = u64::from_str_radix(key.get(..16).unwrap_or("0"), 16).unwrap_or(0);
    u32::try_from(head % u64::from(max_entries.max(1))).unwrap_or(0)
}
