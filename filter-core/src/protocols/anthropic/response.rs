//! A Messages API reply -> an OpenAI `chat.completion`.

use serde_json::{json, Map, Value};

/// Messages `stop_reason` -> OpenAI `finish_reason`.
pub fn finish_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        // end_turn, stop_sequence, pause_turn and anything newer.
        _ => "stop",
    }
}

/// Input token counts as Anthropic splits them: prompt tokens are all three together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct TokenCounts {
    input: u64,
    cache_read: u64,
    cache_creation: u64,
    output: u64,
}

impl TokenCounts {
    /// Takes every count the usage object carries, leaving the others as they were.
    pub(super) fn update(&mut self, usage: Option<&Value>) {
        let Some(usage) = usage else { return };
        let get = |k: &str| usage.get(k).and_then(Value::as_u64);
        if let Some(n) = get("input_tokens") {
            self.input = n;
        }
        if let Some(n) = get("cache_read_input_tokens") {
            self.cache_read = n;
        }
        if let Some(n) = get("cache_creation_input_tokens") {
            self.cache_creation = n;
        }
        if let Some(n) = get("output_tokens") {
            self.output = n;
        }
    }

    pub(super) fn openai(&self) -> Value {
        let prompt = self.input + self.cache_read + self.cache_creation;
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": self.output,
            "total_tokens": prompt + self.output,
            "prompt_tokens_details": { "cached_tokens": self.cache_read },
        })
    }
}

/// A string field of `v`, or "" when it is absent or not a string.
pub(crate) fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Messages API response -> OpenAI `chat.completion`.
pub fn from_messages_response(resp: &Value, created_s: i64) -> Value {
    let mut text = String::new();
    let mut has_text = false;
    let mut tool_calls = Vec::new();
    for block in resp
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        match str_field(block, "type") {
            "text" => {
                has_text = true;
                text.push_str(str_field(block, "text"));
            }
            "tool_use" => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_calls.push(json!({
                    "id": str_field(block, "id"),
                    "type": "function",
                    "function": { "name": str_field(block, "name"), "arguments": input.to_string() },
                }));
            }
            // thinking, redacted_thinking and server tool blocks have no OpenAI equivalent.
            _ => {}
        }
    }
    let content = if has_text || tool_calls.is_empty() {
        Value::String(text)
    } else {
        Value::Null
    };
    let mut message = Map::new();
    message.insert("role".into(), Value::String("assistant".into()));
    message.insert("content".into(), content);
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    let finish = resp
        .get("stop_reason")
        .and_then(Value::as_str)
        .map_or("stop", finish_reason);
    let mut counts = TokenCounts::default();
    counts.update(resp.get("usage"));
    json!({
        "id": format!("chatcmpl-{}", str_field(resp, "id")),
        "object": "chat.completion",
        "created": created_s,
        "model": str_field(resp, "model"),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish,
        }],
        "usage": counts.openai(),
    })
}
