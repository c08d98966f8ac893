//! A chat-completions SSE stream assembled to the chat completion it answers.

use serde_json::{json, Value};

/// The chat completion a chat-completions SSE stream assembles to, when the stream ended
/// cleanly: `data: [DONE]` last, no error event, every choice finished. Content and tool-call
/// arguments are the concatenation of their deltas; usage is the usage chunk's.
pub fn assemble_stream(sse: &[u8]) -> Option<Value> {
    let mut parser = crate::wire::sse::Parser::new();
    let mut events = parser.feed(sse);
    // A last event without its blank line still counts.
    events.extend(parser.feed(b"\n\n"));
    events.retain(|e| !e.data.trim().is_empty());
    let (done, chunks) = events.split_last()?;
    if done.data.trim() != "[DONE]" {
        return None;
    }
    let mut head: Option<Value> = None;
    let mut usage = None;
    let mut choices: std::collections::BTreeMap<u64, Value> = std::collections::BTreeMap::new();
    for event in chunks {
        let chunk: Value = serde_json::from_str(&event.data).ok()?;
        if chunk.get("error").is_some() || event.data.trim() == "[DONE]" {
            return None;
        }
        if head.is_none() {
            head = Some(chunk.clone());
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        for c in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            let choice = choices.entry(index).or_insert_with(|| {
                json!({ "index": index, "finish_reason": null,
                        "message": { "role": "assistant", "content": null } })
            });
            merge_delta(choice, c);
        }
    }
    let head = head?;
    let all_finished = !choices.is_empty()
        && choices
            .values()
            .all(|c| c.get("finish_reason").is_some_and(Value::is_string));
    if !all_finished {
        return None;
    }
    let mut completion = json!({
        "id": head.get("id").cloned().unwrap_or(Value::Null),
        "object": "chat.completion",
        "created": head.get("created").cloned().unwrap_or(json!(0)),
        "model": head.get("model").cloned().unwrap_or(Value::Null),
        "choices": choices.into_values().collect::<Vec<_>>(),
    });
    if let Some(u) = usage {
        completion["usage"] = u;
    }
    Some(completion)
}

/// `usage` in the chat completion's shape (a hit's replay drops it unless the client asked).
pub(super) fn openai_usage(u: &crate::vocab::Usage) -> Value {
    let mut usage = json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens.saturating_add(u.completion_tokens),
    });
    if u.cached_tokens > 0 {
        usage["prompt_tokens_details"] = json!({ "cached_tokens": u.cached_tokens });
    }
    usage
}

/// Folds one chunk's choice (its `delta` and `finish_reason`) into the assembled choice.
fn merge_delta(choice: &mut Value, chunk: &Value) {
    if let Some(finish) = chunk.get("finish_reason").filter(|f| f.is_string()) {
        choice["finish_reason"] = finish.clone();
    }
    let Some(delta) = chunk.get("delta") else {
        return;
    };
    let message = &mut choice["message"];
    if let Some(text) = delta.get("content").and_then(Value::as_str) {
        let joined = format!("{}{text}", message["content"].as_str().unwrap_or(""));
        message["content"] = json!(joined);
    }
    for call in delta
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let n = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        if !message["tool_calls"].is_array() {
            message["tool_calls"] = json!([]);
        }
        let Some(calls) = message["tool_calls"].as_array_mut() else {
            return;
        };
        let at = usize::try_from(n).unwrap_or(usize::MAX);
        while calls.len() <= at && calls.len() < 128 {
            calls.push(json!({ "id": null, "type": "function",
                               "function": { "name": "", "arguments": "" } }));
        }
        let Some(slot) = calls.get_mut(at) else {
            return;
        };
        for field in ["id", "type"] {
            if let Some(v) = call.get(field).filter(|v| v.is_string()) {
                slot[field] = v.clone();
            }
        }
        for field in ["name", "arguments"] {
            if let Some(part) = call
                .pointer(&format!("/function/{field}"))
                .and_then(Value::as_str)
            {
                let joined = format!("{}{part}", slot["function"][field].as_str().unwrap_or(""));
                slot["function"][field] = json!(joined);
            }
        }
    }
}
