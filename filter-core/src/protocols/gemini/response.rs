//! A `chat.completion` -> a `GenerateContentResponse`.

use serde_json::{json, Value};

use crate::protocols::anthropic::response::str_field as str_of;

/// OpenAI `finish_reason` -> Gemini `finishReason` (a function call ends with `STOP`, as at
/// Google).
pub fn finish_reason(finish: &str) -> &'static str {
    match finish {
        "length" => "MAX_TOKENS",
        "content_filter" => "SAFETY",
        "stop" | "tool_calls" | "function_call" => "STOP",
        _ => "OTHER",
    }
}

/// Chat usage as `usageMetadata`.
pub(super) fn usage_metadata(chat_usage: &Value) -> Value {
    let get = |p: &str| chat_usage.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let prompt = get("/prompt_tokens");
    let completion = get("/completion_tokens");
    let mut usage = json!({
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion,
        "totalTokenCount": chat_usage.get("total_tokens").and_then(Value::as_u64)
            .unwrap_or(prompt + completion),
    });
    let cached = get("/prompt_tokens_details/cached_tokens");
    if cached > 0 {
        usage["cachedContentTokenCount"] = json!(cached);
    }
    let thoughts = get("/completion_tokens_details/reasoning_tokens");
    if thoughts > 0 {
        usage["thoughtsTokenCount"] = json!(thoughts);
    }
    usage
}

/// A chat tool call as a `functionCall` part (`args` the object of its arguments).
pub(super) fn function_call_part(id: &str, name: &str, arguments: &str) -> Value {
    let args = match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    };
    json!({ "functionCall": { "id": id, "name": name, "args": args } })
}

pub(super) fn response(parts: Vec<Value>, finish: Option<&str>, model: &str, id: &str) -> Value {
    let mut candidate = json!({ "content": { "role": "model", "parts": parts }, "index": 0 });
    if let Some(finish) = finish {
        candidate["finishReason"] = json!(finish);
    }
    json!({ "candidates": [candidate], "modelVersion": model, "responseId": id })
}

/// A `chat.completion` -> a `GenerateContentResponse`.
pub fn from_chat_response(chat: &Value) -> Value {
    let choice = chat.pointer("/choices/0").unwrap_or(&Value::Null);
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut parts = Vec::new();
    if let Some(text) = message
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        parts.push(json!({ "text": text }));
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        parts.push(function_call_part(
            str_of(call, "id"),
            call.pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            call.pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or(""),
        ));
    }
    if parts.is_empty() {
        parts.push(json!({ "text": "" }));
    }
    let mut out = response(
        parts,
        Some(finish_reason(str_of(choice, "finish_reason"))),
        str_of(chat, "model"),
        str_of(chat, "id"),
    );
    if let Some(usage) = chat.get("usage").filter(|u| u.is_object()) {
        out["usageMetadata"] = usage_metadata(usage);
    }
    out
}

/// A whole `GenerateContentResponse` as the stream a caller of `:streamGenerateContent` reads:
/// one SSE event, or a JSON array of one.
pub fn replay(answer: &Value, json_array: bool) -> Vec<u8> {
    if json_array {
        format!("[{answer}]").into_bytes()
    } else {
        format!("data: {answer}\r\n\r\n").into_bytes()
    }
}
