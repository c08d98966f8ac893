//! A `chat.completion` -> a Messages `message`.

use serde_json::{json, Value};

use crate::protocols::anthropic::response::str_field as str_of;

/// OpenAI `finish_reason` -> Messages `stop_reason`.
pub fn stop_reason(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// Usage as Messages reports it: the prompt split into uncached and cache-read tokens.
pub(super) fn usage(chat_usage: Option<&Value>) -> Value {
    let get = |p: &str| {
        chat_usage
            .and_then(|u| u.pointer(p))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let prompt = get("/prompt_tokens");
    let cached = get("/prompt_tokens_details/cached_tokens").min(prompt);
    json!({
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": get("/completion_tokens"),
    })
}

pub(super) fn message_id(chat_id: &str) -> String {
    let bare = chat_id.strip_prefix("chatcmpl-").unwrap_or(chat_id);
    format!("msg_{bare}")
}

/// A `chat.completion` -> a Messages `message`.
pub fn from_chat_response(chat: &Value) -> Value {
    let choice = chat.pointer("/choices/0").unwrap_or(&Value::Null);
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut content = Vec::new();
    if let Some(text) = message
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        content.push(json!({ "type": "text", "text": text }));
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let arguments = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or("");
        content.push(json!({
            "type": "tool_use",
            "id": str_of(call, "id"),
            "name": call.pointer("/function/name").and_then(Value::as_str).unwrap_or(""),
            "input": tool_input(arguments),
        }));
    }
    json!({
        "id": message_id(str_of(chat, "id")),
        "type": "message",
        "role": "assistant",
        "model": str_of(chat, "model"),
        "content": content,
        "stop_reason": stop_reason(str_of(choice, "finish_reason")),
        "stop_sequence": null,
        "usage": usage(chat.get("usage")),
    })
}

/// Tool arguments as the JSON object Messages carries (arguments that are no object: empty).
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}
