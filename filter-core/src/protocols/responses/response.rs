//! A `chat.completion` -> a Responses `response` object.

use serde_json::{json, Value};

use super::request::NAMESPACE_SEPARATOR;
use crate::protocols::anthropic::response::str_field as str_of;

pub(super) fn response_id(chat_id: &str) -> String {
    let bare = chat_id.strip_prefix("chatcmpl-").unwrap_or(chat_id);
    format!("resp_{bare}")
}

/// Usage as Responses reports it.
pub(super) fn usage(chat_usage: Option<&Value>) -> Value {
    let get = |p: &str| {
        chat_usage
            .and_then(|u| u.pointer(p))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (input, output) = (get("/prompt_tokens"), get("/completion_tokens"));
    json!({
        "input_tokens": input,
        "input_tokens_details": { "cached_tokens": get("/prompt_tokens_details/cached_tokens") },
        "output_tokens": output,
        "output_tokens_details": { "reasoning_tokens": get("/completion_tokens_details/reasoning_tokens") },
        "total_tokens": input + output,
    })
}

pub(super) fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({ "type": "message", "id": id, "status": status, "role": "assistant",
            "content": [{ "type": "output_text", "text": text, "annotations": [] }] })
}

/// A `function_call` item; a call of a namespace's tool (flattened on the way in, see
/// [`NAMESPACE_SEPARATOR`]) gets its own name back and its `namespace`.
pub(super) fn call_item(
    request: &Value,
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    let mut item = json!({ "type": "function_call", "id": id, "call_id": call_id, "name": name,
                           "arguments": arguments, "status": status });
    if let Some((namespace, tool)) = namespaced(request, name) {
        item["name"] = json!(tool);
        item["namespace"] = json!(namespace);
    }
    item
}

/// `(namespace, tool)` when `flat` is the flattened name of a tool of a namespace the request
/// declared.
pub(super) fn namespaced<'a>(request: &Value, flat: &'a str) -> Option<(&'a str, &'a str)> {
    let (namespace, tool) = flat.split_once(NAMESPACE_SEPARATOR)?;
    let declared = request
        .get("tools")
        .and_then(Value::as_array)?
        .iter()
        .any(|t| str_of(t, "type") == "namespace" && str_of(t, "name") == namespace);
    declared.then_some((namespace, tool))
}

/// The `response` object around `output`, echoing what the request asked for.
pub(super) fn response(
    id: &str,
    model: &str,
    created_s: i64,
    status: &str,
    output: Vec<Value>,
    usage: Value,
    request: &Value,
) -> Value {
    let echo = |key: &str, default: Value| request.get(key).cloned().unwrap_or(default);
    let incomplete = (status == "incomplete").then(|| json!({ "reason": "max_output_tokens" }));
    json!({
        "id": id,
        "object": "response",
        "created_at": created_s,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": echo("instructions", Value::Null),
        "max_output_tokens": echo("max_output_tokens", Value::Null),
        "model": model,
        "output": output,
        "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
        "previous_response_id": null,
        "store": false,
        "temperature": echo("temperature", Value::Null),
        "top_p": echo("top_p", Value::Null),
        "text": echo("text", json!({ "format": { "type": "text" } })),
        "tool_choice": echo("tool_choice", json!("auto")),
        "tools": echo("tools", json!([])),
        "metadata": echo("metadata", json!({})),
        "usage": usage,
    })
}

pub(super) fn status_of(finish_reason: &str) -> &'static str {
    if finish_reason == "length" {
        "incomplete"
    } else {
        "completed"
    }
}

/// A `chat.completion` -> a `response`; `request` is the caller's Responses body.
pub fn from_chat_response(chat: &Value, request: &Value, created_s: i64) -> Value {
    let id = response_id(str_of(chat, "id"));
    let choice = chat.pointer("/choices/0").unwrap_or(&Value::Null);
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut output = Vec::new();
    if let Some(text) = message
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        output.push(message_item(&format!("msg_{id}"), text, "completed"));
    }
    for (i, call) in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        output.push(call_item(
            request,
            &format!("fc_{id}_{i}"),
            str_of(call, "id"),
            call.pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            call.pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or(""),
            "completed",
        ));
    }
    response(
        &id,
        str_of(chat, "model"),
        created_s,
        status_of(str_of(choice, "finish_reason")),
        output,
        usage(chat.get("usage")),
        request,
    )
}
