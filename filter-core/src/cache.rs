//! The response cache's decisions (pool `cache: { ttlMs, maxEntries, maxBytes }`): not yet
//! wired into the front stage. Kept pure so the stage only moves bytes.
//!
//! - The key is the resolved request: the models the call resolves to and the body's
//!   messages, tools and sampling parameters; `stream` and `stream_options` do not split it
//!   (a stored answer replays as SSE to a streaming client, [`replay_sse`]).
//! - Storage is bounded per Envoy process: shared data cannot drop a key, so entries live in
//!   `maxEntries` fixed slots, a key's slot chosen by its hash ([`slot_of`]). The eviction
//!   rule: a new answer replaces whatever its slot holds (direct-mapped); an entry past its
//!   TTL is a miss. An answer larger than `maxBytes / maxEntries` is not stored, so the cache
//!   never holds more than `maxBytes` of answers.
//! - Only complete answers are stored ([`storable`]): a 200 with choices, none cut at
//!   `length`, none empty.

use serde_json::{json, Value};

use crate::plan::Operation;
use crate::util::sha256_hex;

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

/// The cache key (hex SHA-256) of a request resolved to `models`.
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

/// Whether the client asked not to be served from a cache (`Cache-Control: no-cache` or
/// `no-store`).
pub fn bypassed(cache_control: Option<&str>) -> bool {
    cache_control.is_some_and(|v| {
        v.split(',')
            .map(|d| d.trim().to_ascii_lowercase())
            .any(|d| d == "no-cache" || d == "no-store")
    })
}

/// The slot of `key` among `max_entries` (at least one).
pub fn slot_of(key: &str, max_entries: u32) -> u32 {
    let head = u64::from_str_radix(key.get(..16).unwrap_or("0"), 16).unwrap_or(0);
    u32::try_from(head % u64::from(max_entries.max(1))).unwrap_or(0)
}

/// Whether a unary chat answer may be stored: a 200 whose every choice is complete.
pub fn storable(status: u16, body: &Value) -> bool {
    if status != 200 || body.get("error").is_some() {
        return false;
    }
    if let Some(data) = body.get("data") {
        // Embeddings.
        return data.as_array().is_some_and(|d| !d.is_empty());
    }
    let Some(choices) = body.get("choices").and_then(Value::as_array) else {
        return false;
    };
    !choices.is_empty()
        && choices.iter().all(|c| {
            let finish = c.get("finish_reason").and_then(Value::as_str);
            let message = c.get("message");
            let text = message
                .and_then(|m| m.get("content"))
                .and_then(Value::as_str)
                .is_some_and(|t| !t.is_empty());
            let tools = message
                .and_then(|m| m.get("tool_calls"))
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty());
            matches!(finish, Some("stop" | "tool_calls" | "function_call")) && (text || tools)
        })
}

/// A stored answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub expires_at_ms: i64,
    /// The answer's body, as the client got it.
    pub body: Vec<u8>,
}

impl Entry {
    /// `key (64 hex) | expires (8, big endian) | body`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(72 + self.body.len());
        out.extend_from_slice(self.key.as_bytes());
        out.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let key = std::str::from_utf8(bytes.get(..64)?).ok()?.to_owned();
        let expires_at_ms = i64::from_be_bytes(bytes.get(64..72)?.try_into().ok()?);
        Some(Self {
            key,
            expires_at_ms,
            body: bytes.get(72..)?.to_vec(),
        })
    }
}

/// The stored answer for `key` in what its slot holds, unless another key's or expired.
pub fn lookup(slot: Option<&[u8]>, key: &str, now_ms: i64) -> Option<Entry> {
    Entry::decode(slot?).filter(|e| e.key == key && e.expires_at_ms > now_ms)
}

/// The largest answer a slot takes: `max_bytes / max_entries`.
pub fn slot_bytes(max_bytes: u64, max_entries: u32) -> u64 {
    max_bytes / u64::from(max_entries.max(1))
}

/// A stored unary chat answer as the SSE a streaming client expects: a role chunk, one content
/// (or tool call) chunk per choice, a finish chunk per choice, the usage chunk, `[DONE]`.
pub fn replay_sse(answer: &Value) -> Vec<u8> {
    let id = answer
        .get("id")
        .cloned()
        .unwrap_or(json!("chatcmpl-cached"));
    let model = answer.get("model").cloned().unwrap_or(Value::Null);
    let created = answer.get("created").cloned().unwrap_or(json!(0));
    let chunk = |choices: Value| {
        json!({ "id": id, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": choices })
    };
    let mut events = Vec::new();
    for (i, c) in answer
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let message = c.get("message").cloned().unwrap_or(Value::Null);
        events.push(chunk(
            json!([{ "index": i, "delta": { "role": "assistant" } }]),
        ));
        let mut delta = serde_json::Map::new();
        if let Some(text) = message.get("content").filter(|t| t.is_string()) {
            delta.insert("content".into(), text.clone());
        }
        if let Some(Value::Array(calls)) = message.get("tool_calls") {
            let indexed: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(n, call)| {
                    let mut call = call.clone();
                    call["index"] = json!(n);
                    call
                })
                .collect();
            delta.insert("tool_calls".into(), Value::Array(indexed));
        }
        events.push(chunk(json!([{ "index": i, "delta": delta }])));
        events.push(chunk(
            json!([{ "index": i, "delta": {}, "finish_reason": c.get("finish_reason") }]),
        ));
    }
    if let Some(usage) = answer.get("usage") {
        let mut last = chunk(json!([]));
        last["usage"] = usage.clone();
        events.push(last);
    }
    let mut out = Vec::new();
    for e in events {
        out.extend_from_slice(format!("data: {e}\n\n").as_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(finish: &str, content: &str) -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "m1",
            "choices": [{ "index": 0, "finish_reason": finish,
                          "message": { "role": "assistant", "content": content } }],
            "usage": { "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5 },
        })
    }

    #[test]
    fn the_key_is_the_resolved_request_without_stream() {
        let body = json!({ "model": "chat", "messages": [{ "role": "user", "content": "hi" }],
                           "temperature": 0 });
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({ "include_usage": true });
        streamed["user"] = json!("someone");
        let k = key_of(Operation::Chat, &["m1"], &body);
        assert_eq!(k.len(), 64);
        assert_eq!(k, key_of(Operation::Chat, &["m1"], &streamed));
        // Another resolution, another sampling parameter, another message: another key.
        assert_ne!(k, key_of(Operation::Chat, &["m2"], &body));
        let mut hotter = body.clone();
        hotter["temperature"] = json!(1);
        assert_ne!(k, key_of(Operation::Chat, &["m1"], &hotter));
        let mut tools = body.clone();
        tools["tools"] = json!([{ "type": "function", "function": { "name": "f" } }]);
        assert_ne!(k, key_of(Operation::Chat, &["m1"], &tools));
        assert_ne!(k, key_of(Operation::Embeddings, &["m1"], &body));
    }

    #[test]
    fn no_cache_and_no_store_bypass() {
        assert!(bypassed(Some("no-cache")));
        assert!(bypassed(Some("max-age=0, No-Store")));
        assert!(!bypassed(Some("max-age=60")));
        assert!(!bypassed(None));
    }

    #[test]
    fn only_complete_answers_are_stored() {
        assert!(storable(200, &answer("stop", "hello")));
        assert!(!storable(200, &answer("length", "hel")), "truncated");
        assert!(!storable(200, &answer("stop", "")), "empty");
        assert!(!storable(500, &answer("stop", "hello")), "failed");
        assert!(!storable(200, &json!({ "error": { "code": "x" } })));
        assert!(!storable(200, &json!({ "choices": [] })));
        let tools = json!({ "choices": [{ "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{ "id": "c1", "type": "function",
                             "function": { "name": "f", "arguments": "{}" } }] } }] });
        assert!(storable(200, &tools));
        assert!(storable(200, &json!({ "data": [{ "embedding": [0.1] }] })));
        assert!(!storable(200, &json!({ "data": [] })));
    }

    #[test]
    fn entries_live_in_bounded_slots_and_expire() {
        let key = key_of(Operation::Chat, &["m1"], &json!({ "messages": [] }));
        let entry = Entry {
            key: key.clone(),
            expires_at_ms: 2_000,
            body: b"{}".to_vec(),
        };
        let bytes = entry.encode();
        assert_eq!(Entry::decode(&bytes), Some(entry.clone()));
        assert_eq!(lookup(Some(&bytes), &key, 1_999), Some(entry));
        assert_eq!(lookup(Some(&bytes), &key, 2_000), None, "expired");
        let other = key_of(Operation::Chat, &["m2"], &json!({ "messages": [] }));
        assert_eq!(
            lookup(Some(&bytes), &other, 0),
            None,
            "another key in the slot"
        );
        assert_eq!(lookup(None, &key, 0), None);
        assert_eq!(lookup(Some(b"short"), &key, 0), None);
        for n in [1, 7, 1_000] {
            assert!(slot_of(&key, n) < n);
        }
        assert_eq!(slot_of(&key, 0), 0);
        assert_eq!(slot_bytes(64 << 20, 1_024), 64 << 10);
    }

    #[test]
    fn a_stored_answer_replays_as_sse() {
        let sse = String::from_utf8(replay_sse(&answer("stop", "hello"))).unwrap_or_default();
        let events: Vec<Value> = sse
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect();
        assert!(sse.ends_with("data: [DONE]\n\n"));
        assert_eq!(events.len(), 4);
        assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(events[1]["choices"][0]["delta"]["content"], "hello");
        assert_eq!(events[2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(events[3]["usage"]["total_tokens"], 5);
        assert!(events
            .iter()
            .all(|e| e["object"] == "chat.completion.chunk" && e["id"] == "chatcmpl-1"));
    }
}
