//! The response cache for Messages (`/v1/messages`) and Responses (`/v1/responses`) callers.
//! Each protocol has its own key space: an entry holds the answer in the shape its caller got
//! it (a Messages `message`, a Responses `response`), so a hit replays it to a caller of the
//! same protocol exactly, with nothing lost to a conversion (thinking blocks, Anthropic's
//! cache usage, reasoning items). A chat caller never gets a Messages entry, nor the reverse.
//!
//! - [`keyed_body`]: the caller's body without what does not change the answer (`model`, which
//!   is keyed by its resolution, `stream`, `metadata`, ...). Every other field splits the key,
//!   so a field this gateway does not know yet cannot make two different requests one.
//! - [`storable`]: only complete answers (a Messages `end_turn`/`tool_use`/`stop_sequence`
//!   with content, a Responses `completed` with output).
//! - [`assemble_stream`]: the answer a cleanly ended stream adds up to (Messages: its events
//!   folded up to `message_stop`; Responses: the `response` of `response.completed`).
//! - [`replay_sse`]: a stored answer as the events a streaming caller of its protocol expects.

use serde_json::{json, Map, Value};

use crate::plan::Protocol;
use crate::protocols::anthropic::response::str_field as str_of;

/// Fields of a Messages body that do not change the answer.
const MESSAGES_UNKEYED: &[&str] = &["model", "stream", "metadata", "service_tier"];

/// Fields of a Responses body that do not change the answer (`store` is false on every call
/// the cache takes; `user` and `safety_identifier` name the end user).
const RESPONSES_UNKEYED: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "store",
    "background",
];

/// The part of a caller's body that keys it (Messages or Responses).
pub fn keyed_body(protocol: Protocol, body: &Value) -> Value {
    let unkeyed = match protocol {
        Protocol::Messages => MESSAGES_UNKEYED,
        Protocol::Responses => RESPONSES_UNKEYED,
        Protocol::Chat | Protocol::Gemini => &[],
    };
    let keyed: Map<String, Value> = body
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !unkeyed.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Value::Object(keyed)
}

/// Whether a unary answer of `protocol` may be stored: a 200 that ended on its own with
/// something in it.
pub fn storable(protocol: Protocol, status: u16, body: &Value) -> bool {
    if status != 200 || body.get("error").is_some_and(|e| !e.is_null()) {
        return false;
    }
    match protocol {
        Protocol::Messages => {
            let finished = matches!(
                body.get("stop_reason").and_then(Value::as_str),
                Some("end_turn" | "tool_use" | "stop_sequence")
            );
            let said = body
                .get("content")
                .and_then(Value::as_array)
                .is_some_and(|blocks| {
                    blocks.iter().any(|b| match str_of(b, "type") {
                        "text" => !str_of(b, "text").is_empty(),
                        "tool_use" => true,
                        _ => false,
                    })
                });
            str_of(body, "type") == "message" && finished && said
        }
        Protocol::Responses => {
            let said = body
                .get("output")
                .and_then(Value::as_array)
                .is_some_and(|items| {
                    items.iter().any(|item| match str_of(item, "type") {
                        "message" => item
                            .get("content")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .any(|p| !str_of(p, "text").is_empty()),
                        "function_call" => true,
                        _ => false,
                    })
                });
            str_of(body, "object") == "response" && str_of(body, "status") == "completed" && said
        }
        // Gemini answers are not stored: the body keyed would be the chat translation.
        Protocol::Chat | Protocol::Gemini => false,
    }
}

/// The events of an SSE body with data, each as (type, data); `None` when one is not JSON.
fn events(sse: &[u8]) -> Option<Vec<(String, Value)>> {
    let mut parser = crate::wire::sse::Parser::new();
    let mut events = parser.feed(sse);
    events.extend(parser.feed(b"\n\n"));
    events
        .into_iter()
        .filter(|e| !e.data.trim().is_empty())
        .map(|e| {
            let data: Value = serde_json::from_str(&e.data).ok()?;
            let kind = e
                .name
                .clone()
                .unwrap_or_else(|| str_of(&data, "type").to_owned());
            Some((kind, data))
        })
        .collect()
}

/// The answer a stream of `protocol` assembles to, when it ended cleanly.
pub fn assemble_stream(protocol: Protocol, sse: &[u8]) -> Option<Value> {
    let events = events(sse)?;
    match protocol {
        Protocol::Messages => assemble_messages(&events),
        Protocol::Responses => {
            // The last event is the completion, which carries the whole response.
            let (kind, data) = events.last()?;
            let failed = events
                .iter()
                .any(|(k, _)| matches!(k.as_str(), "error" | "response.failed"));
            (kind == "response.completed" && !failed)
                .then(|| data.get("response").cloned())
                .flatten()
        }
        Protocol::Chat | Protocol::Gemini => None,
    }
}

/// A Messages stream folded into its `message`: `message_stop` last, no `error` event.
fn assemble_messages(events: &[(String, Value)]) -> Option<Value> {
    let mut message: Option<Value> = None;
    let mut blocks: Vec<Value> = Vec::new();
    // The tool inputs' JSON so far, by block.
    let mut inputs: Vec<String> = Vec::new();
    let mut stopped = false;
    for (kind, data) in events {
        if stopped {
            return None;
        }
        match kind.as_str() {
            "message_start" => message = Some(data.get("message")?.clone()),
            "content_block_start" => {
                let index = usize::try_from(data.get("index")?.as_u64()?).ok()?;
                if index != blocks.len() {
                    return None;
                }
                let mut block = data.get("content_block")?.clone();
                if str_of(&block, "type") == "tool_use" {
                    block["input"] = json!({});
                }
                blocks.push(block);
                inputs.push(String::new());
            }
            "content_block_delta" => {
                let index = usize::try_from(data.get("index")?.as_u64()?).ok()?;
                let block = blocks.get_mut(index)?;
                let delta = data.get("delta")?;
                let append = |block: &mut Value, field: &str, part: &str| {
                    let joined = format!("{}{part}", str_of(block, field));
                    block[field] = json!(joined);
                };
                match str_of(delta, "type") {
                    "text_delta" => append(block, "text", str_of(delta, "text")),
                    "thinking_delta" => append(block, "thinking", str_of(delta, "thinking")),
                    "signature_delta" => append(block, "signature", str_of(delta, "signature")),
                    "input_json_delta" => inputs
                        .get_mut(index)?
                        .push_str(str_of(delta, "partial_json")),
                    "citations_delta" => {
                        if !block["citations"].is_array() {
                            block["citations"] = json!([]);
                        }
                        if let (Some(list), Some(c)) =
                            (block["citations"].as_array_mut(), delta.get("citation"))
                        {
                            list.push(c.clone());
                        }
                    }
                    _ => return None,
                }
            }
            "content_block_stop" => {
                let index = usize::try_from(data.get("index")?.as_u64()?).ok()?;
                let json_so_far = inputs.get(index)?;
                if !json_so_far.is_empty() {
                    blocks.get_mut(index)?["input"] = serde_json::from_str(json_so_far).ok()?;
                }
            }
            "message_delta" => {
                let m = message.as_mut()?;
                if let Some(delta) = data.get("delta").and_then(Value::as_object) {
                    for (k, v) in delta {
                        m[k.as_str()] = v.clone();
                    }
                }
                if let Some(usage) = data.get("usage").and_then(Value::as_object) {
                    if !m["usage"].is_object() {
                        m["usage"] = json!({});
                    }
                    for (k, v) in usage.iter().filter(|(_, v)| !v.is_null()) {
                        m["usage"][k.as_str()] = v.clone();
                    }
                }
            }
            "message_stop" => stopped = true,
            "ping" => {}
            _ => return None,
        }
    }
    let mut message = message.filter(|_| stopped)?;
    message["content"] = Value::Array(blocks);
    Some(message)
}

/// `name` and its data as one SSE event.
fn push_event(out: &mut Vec<u8>, data: &Value) {
    out.extend_from_slice(format!("event: {}\ndata: {data}\n\n", str_of(data, "type")).as_bytes());
}

/// A stored answer of `protocol` as the SSE its streaming caller expects.
pub fn replay_sse(protocol: Protocol, answer: &Value) -> Vec<u8> {
    match protocol {
        Protocol::Messages => replay_messages(answer),
        Protocol::Responses => replay_responses(answer),
        Protocol::Chat => replay_chat(answer),
        Protocol::Gemini => crate::protocols::gemini::response::replay(answer, false),
    }
}

/// A stored unary chat answer as the SSE a streaming client expects: a role chunk, one content
/// (or tool call) chunk per choice, a finish chunk per choice, the usage chunk, `[DONE]`.
fn replay_chat(answer: &Value) -> Vec<u8> {
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

/// `message_start`, each block's start, delta and stop, `message_delta`, `message_stop`.
fn replay_messages(message: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let mut head = message.clone();
    head["content"] = json!([]);
    head["stop_reason"] = Value::Null;
    head["stop_sequence"] = Value::Null;
    let usage = message.get("usage").cloned().unwrap_or_else(|| json!({}));
    let mut start_usage = usage.clone();
    if start_usage.is_object() {
        // The output is counted by `message_delta`, as a live stream does.
        start_usage["output_tokens"] = json!(0);
    }
    head["usage"] = start_usage;
    push_event(
        &mut out,
        &json!({ "type": "message_start", "message": head }),
    );
    for (index, block) in message
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let (start, delta) = match str_of(block, "type") {
            "text" => {
                let mut start = block.clone();
                start["text"] = json!("");
                if start.get("citations").is_some() {
                    start["citations"] = json!([]);
                }
                let mut deltas =
                    vec![json!({ "type": "text_delta", "text": str_of(block, "text") })];
                for c in block
                    .get("citations")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    deltas.push(json!({ "type": "citations_delta", "citation": c }));
                }
                (start, deltas)
            }
            "tool_use" => {
                let mut start = block.clone();
                start["input"] = json!({});
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                (
                    start,
                    vec![json!({ "type": "input_json_delta", "partial_json": input.to_string() })],
                )
            }
            "thinking" => {
                let mut start = block.clone();
                start["thinking"] = json!("");
                start["signature"] = json!("");
                (
                    start,
                    vec![
                        json!({ "type": "thinking_delta", "thinking": str_of(block, "thinking") }),
                        json!({ "type": "signature_delta", "signature": str_of(block, "signature") }),
                    ],
                )
            }
            // A block without deltas (redacted thinking, a server tool's): whole at its start.
            _ => (block.clone(), Vec::new()),
        };
        push_event(
            &mut out,
            &json!({ "type": "content_block_start", "index": index, "content_block": start }),
        );
        for d in delta {
            push_event(
                &mut out,
                &json!({ "type": "content_block_delta", "index": index, "delta": d }),
            );
        }
        push_event(
            &mut out,
            &json!({ "type": "content_block_stop", "index": index }),
        );
    }
    push_event(
        &mut out,
        &json!({ "type": "message_delta",
                 "delta": { "stop_reason": message.get("stop_reason"),
                            "stop_sequence": message.get("stop_sequence") },
                 "usage": usage }),
    );
    push_event(&mut out, &json!({ "type": "message_stop" }));
    out
}

/// Typed Responses events, numbered: `response.created`, `response.in_progress`, each output
/// item added, its parts' or arguments' deltas and dones, the item done, `response.completed`.
fn replay_responses(response: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let mut sequence = 0u64;
    let mut push = |out: &mut Vec<u8>, mut data: Value| {
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        push_event(out, &data);
    };
    let mut started = response.clone();
    started["status"] = json!("in_progress");
    started["output"] = json!([]);
    started["usage"] = Value::Null;
    push(
        &mut out,
        json!({ "type": "response.created", "response": started }),
    );
    push(
        &mut out,
        json!({ "type": "response.in_progress", "response": started }),
    );
    for (index, item) in response
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let id = item.get("id").cloned().unwrap_or(Value::Null);
        let mut added = item.clone();
        added["status"] = json!("in_progress");
        match str_of(item, "type") {
            "message" => {
                added["content"] = json!([]);
                push(
                    &mut out,
                    json!({ "type": "response.output_item.added", "output_index": index, "item": added }),
                );
                for (part_index, part) in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let field = if str_of(part, "type") == "refusal" {
                        "refusal"
                    } else {
                        "text"
                    };
                    let text = str_of(part, field);
                    let mut empty = part.clone();
                    empty[field] = json!("");
                    let at = |kind: &str| {
                        json!({ "type": kind, "item_id": id, "output_index": index,
                                "content_index": part_index })
                    };
                    let mut part_added = at("response.content_part.added");
                    part_added["part"] = empty;
                    push(&mut out, part_added);
                    if field == "refusal" {
                        let mut delta = at("response.refusal.delta");
                        delta["delta"] = json!(text);
                        push(&mut out, delta);
                        let mut done = at("response.refusal.done");
                        done["refusal"] = json!(text);
                        push(&mut out, done);
                    } else {
                        let mut delta = at("response.output_text.delta");
                        delta["delta"] = json!(text);
                        delta["logprobs"] = json!([]);
                        push(&mut out, delta);
                        let mut done = at("response.output_text.done");
                        done["text"] = json!(text);
                        done["logprobs"] = json!([]);
                        push(&mut out, done);
                    }
                    let mut part_done = at("response.content_part.done");
                    part_done["part"] = part.clone();
                    push(&mut out, part_done);
                }
            }
            "function_call" => {
                added["arguments"] = json!("");
                push(
                    &mut out,
                    json!({ "type": "response.output_item.added", "output_index": index, "item": added }),
                );
                let arguments = str_of(item, "arguments");
                push(
                    &mut out,
                    json!({ "type": "response.function_call_arguments.delta", "item_id": id,
                            "output_index": index, "delta": arguments }),
                );
                push(
                    &mut out,
                    json!({ "type": "response.function_call_arguments.done", "item_id": id,
                            "output_index": index, "arguments": arguments }),
                );
            }
            // Other items (reasoning, a built-in tool's call): whole when added.
            _ => push(
                &mut out,
                json!({ "type": "response.output_item.added", "output_index": index, "item": item }),
            ),
        }
        push(
            &mut out,
            json!({ "type": "response.output_item.done", "output_index": index, "item": item }),
        );
    }
    push(
        &mut out,
        json!({ "type": "response.completed", "response": response }),
    );
    out
}

#[cfg(test)]
#[path = "shapes_tests.rs"]
mod tests;
