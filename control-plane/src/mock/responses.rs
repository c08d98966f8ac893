//! The OpenAI Responses API shapes (`POST …/responses`): a unary `response` and its typed SSE
//! events, text and function calls. What a provider of kind openai answers a stateful call
//! the gateway passes through natively.

use serde_json::{json, Value};

use super::answer::{self, Answer, Turn, CREATED};
use super::sse::{self, Piece, StreamPlan};

fn response_id(turn: &Turn) -> String {
    format!("resp_mock_{}", turn.seq)
}

fn usage(answer: &Answer) -> Value {
    let u = &answer.usage;
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": { "cached_tokens": u.cached_tokens },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": u.prompt_tokens.saturating_add(u.completion_tokens),
    })
}

fn message_item(turn: &Turn, text: &str, status: &str) -> Value {
    json!({ "type": "message", "id": format!("msg_mock_{}", turn.seq), "status": status,
            "role": "assistant",
            "content": [{ "type": "output_text", "text": text, "annotations": [] }] })
}

fn call_item(turn: &Turn, answer: &Answer, index: usize, arguments: &str, status: &str) -> Value {
    let call = &answer.tool_calls[index];
    json!({ "type": "function_call", "id": format!("fc_mock_{}_{index}", turn.seq),
            "call_id": answer::tool_call_id(call, "call", turn.seq, index),
            "name": call.name, "arguments": arguments, "status": status })
}

fn output(turn: &Turn, answer: &Answer) -> Vec<Value> {
    let mut items = Vec::new();
    if let Some(text) = &answer.text {
        items.push(message_item(turn, text, "completed"));
    }
    for (index, call) in answer.tool_calls.iter().enumerate() {
        items.push(call_item(
            turn,
            answer,
            index,
            &call.arguments_text(),
            "completed",
        ));
    }
    items
}

fn response(turn: &Turn, status: &str, output: Vec<Value>, usage: Value) -> Value {
    json!({ "id": response_id(turn), "object": "response", "created_at": CREATED,
            "status": status, "error": null, "incomplete_details": null, "model": turn.model,
            "output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
            "store": true, "usage": usage })
}

/// A unary `response`.
pub fn unary(turn: &Turn, answer: &Answer) -> Value {
    response(turn, "completed", output(turn, answer), usage(answer))
}

/// The typed events of a streamed response: created, then per item its added / delta / done
/// events, then completed.
pub fn stream(turn: &Turn, answer: &Answer) -> StreamPlan {
    let mut seq = 0u64;
    let mut event = |mut value: Value| {
        value["sequence_number"] = json!(seq);
        seq += 1;
        let name = value["type"].as_str().unwrap_or("").to_string();
        sse::event(&name, &value)
    };
    let head = vec![event(json!({ "type": "response.created",
        "response": response(turn, "in_progress", Vec::new(), Value::Null) }))];
    let mut content = Vec::new();
    let mut index = 0usize;
    if let Some(text) = &answer.text {
        let id = format!("msg_mock_{}", turn.seq);
        content.push(Piece::framing(event(
            json!({ "type": "response.output_item.added",
            "output_index": index, "item": { "type": "message", "id": id, "status": "in_progress",
            "role": "assistant", "content": [] } }),
        )));
        for part in &answer.chunks {
            content.push(Piece::content(event(
                json!({ "type": "response.output_text.delta",
                "item_id": id, "output_index": index, "content_index": 0, "delta": part }),
            )));
        }
        content.push(Piece::framing(event(
            json!({ "type": "response.output_item.done",
            "output_index": index, "item": message_item(turn, text, "completed") }),
        )));
        index += 1;
    }
    for (n, call) in answer.tool_calls.iter().enumerate() {
        let item = call_item(turn, answer, n, "", "in_progress");
        let id = item["id"].clone();
        content.push(Piece::content(event(
            json!({ "type": "response.output_item.added",
            "output_index": index, "item": item }),
        )));
        for part in call.argument_deltas() {
            content.push(Piece::content(event(
                json!({ "type": "response.function_call_arguments.delta",
                "item_id": id, "output_index": index, "delta": part }),
            )));
        }
        content.push(Piece::framing(event(
            json!({ "type": "response.output_item.done",
            "output_index": index,
            "item": call_item(turn, answer, n, &call.arguments_text(), "completed") }),
        )));
        index += 1;
    }
    let tail = vec![event(json!({ "type": "response.completed",
        "response": unary(turn, answer) }))];
    StreamPlan {
        head,
        content,
        tail,
        error_event: stream_error_event("An error occurred while processing your request."),
    }
}

/// The `error` event a Responses stream ends with when the server fails mid-answer.
pub fn stream_error_event(message: &str) -> bytes::Bytes {
    sse::event(
        "error",
        &json!({ "type": "error", "code": "server_error", "message": message, "param": null }),
    )
}
