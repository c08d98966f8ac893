//! The Anthropic Messages API shapes: a unary message, its SSE events and error objects.

use serde_json::{json, Value};

use super::answer::{self, Answer, Turn};
use super::sse::{self, Piece, StreamPlan};

fn message_id(turn: &Turn) -> String {
    format!("msg_mock_{}", turn.seq)
}

fn stop_reason(answer: &Answer) -> &'static str {
    if answer.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => json!({}),
    }
}

/// A unary `message`.
pub fn message(turn: &Turn, answer: &Answer) -> Value {
    let mut content = Vec::new();
    if let Some(text) = &answer.text {
        content.push(json!({"type": "text", "text": text}));
    }
    for (index, call) in answer.tool_calls.iter().enumerate() {
        content.push(json!({
            "type": "tool_use",
            "id": answer::tool_call_id(call, "toolu", turn.seq, index),
            "name": call.name,
            "input": tool_input(&call.arguments_text()),
        }));
    }
    json!({
        "id": message_id(turn),
        "type": "message",
        "role": "assistant",
        "model": turn.model,
        "content": content,
        "stop_reason": stop_reason(answer),
        "stop_sequence": null,
        "usage": {
            "input_tokens": answer.usage.prompt_tokens.saturating_sub(answer.usage.cached_tokens),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": answer.usage.cached_tokens,
            "output_tokens": answer.usage.completion_tokens,
        },
    })
}

/// The events of a streamed message: message_start, per block content_block_start (a ping
/// after the first), its deltas and content_block_stop, then message_delta and message_stop.
pub fn message_stream(turn: &Turn, answer: &Answer) -> StreamPlan {
    let head = vec![sse::event(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": message_id(turn),
            "type": "message",
            "role": "assistant",
            "model": turn.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {
                "input_tokens": answer.usage.prompt_tokens.saturating_sub(answer.usage.cached_tokens),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": answer.usage.cached_tokens,
                "output_tokens": 1,
            },
        }}),
    )];

    let mut content = Vec::new();
    let mut block = 0usize;
    let mut open_block = |content: &mut Vec<Piece>, start: Value| {
        content.push(Piece::framing(sse::event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": block, "content_block": start}),
        )));
        if block == 0 {
            content.push(Piece::framing(sse::event("ping", &json!({"type": "ping"}))));
        }
        block += 1;
        block - 1
    };
    let close_block = |content: &mut Vec<Piece>, index: usize| {
        content.push(Piece::framing(sse::event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        )));
    };

    if answer.text.is_some() {
        let index = open_block(&mut content, json!({"type": "text", "text": ""}));
        for text in &answer.chunks {
            content.push(Piece::content(sse::event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": text}}),
            )));
        }
        close_block(&mut content, index);
    }
    for (call_index, call) in answer.tool_calls.iter().enumerate() {
        let index = open_block(
            &mut content,
            json!({"type": "tool_use",
                   "id": answer::tool_call_id(call, "toolu", turn.seq, call_index),
                   "name": call.name, "input": {}}),
        );
        for part in call.argument_deltas() {
            content.push(Piece::content(sse::event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": part}}),
            )));
        }
        close_block(&mut content, index);
    }

    let tail = vec![
        sse::event(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(answer), "stop_sequence": null},
                    "usage": {"output_tokens": answer.usage.completion_tokens}}),
        ),
        sse::event("message_stop", &json!({"type": "message_stop"})),
    ];
    StreamPlan {
        head,
        content,
        tail,
        error_event: stream_error_event("Overloaded"),
    }
}

/// The `error` event an Anthropic stream ends with when the server fails mid-answer.
pub fn stream_error_event(message: &str) -> bytes::Bytes {
    sse::event(
        "error",
        &json!({"type": "error", "error": {"type": "overloaded_error", "message": message}}),
    )
}

/// An Anthropic error object for a scripted status without a body.
pub fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::mock::script::{Reply, StreamSpec, ToolCall};
    use crate::mock::sse::{schedule, Step};

    fn turn() -> Turn {
        Turn {
            seq: 2,
            model: "claude-mock".into(),
            prompt_tokens: 4,
            usage_requested: false,
        }
    }

    fn events(plan: StreamPlan, spec: &StreamSpec) -> Vec<(String, Value)> {
        schedule(plan, spec)
            .into_iter()
            .filter_map(|step| match step {
                Step::Send { bytes, .. } => {
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    let (event, data) = text.split_once('\n')?;
                    let value =
                        serde_json::from_str(data.trim_start_matches("data: ").trim_end()).ok()?;
                    Some((event.trim_start_matches("event: ").to_owned(), value))
                }
                Step::Abort { .. } => None,
            })
            .collect()
    }

    #[test]
    fn unary_message() {
        let body = message(&turn(), &Answer::new(&Reply::default(), 4));
        assert_eq!(body["id"], "msg_mock_2");
        assert_eq!(body["type"], "message");
        assert_eq!(body["content"][0]["text"], answer::DEFAULT_TEXT);
        assert_eq!(body["stop_reason"], "end_turn");
        assert_eq!(body["usage"]["input_tokens"], 4);
    }

    #[test]
    fn unary_tool_use() {
        let reply = Reply {
            tool_calls: vec![ToolCall {
                id: Some("toolu_1".into()),
                name: "f".into(),
                arguments: Some(json!("{\"a\":1}")),
                argument_chunks: None,
            }],
            ..Reply::default()
        };
        let body = message(&turn(), &Answer::new(&reply, 1));
        assert_eq!(body["content"][0]["type"], "tool_use");
        assert_eq!(body["content"][0]["input"], json!({"a": 1}));
        assert_eq!(body["stop_reason"], "tool_use");
    }

    #[test]
    fn stream_event_order() {
        let reply = Reply {
            text: Some("hi there".into()),
            tool_calls: vec![ToolCall {
                name: "f".into(),
                argument_chunks: Some(vec!["{\"a\"".into(), ":1}".into()]),
                ..ToolCall::default()
            }],
            ..Reply::default()
        };
        let names: Vec<String> = events(
            message_stream(&turn(), &Answer::new(&reply, 1)),
            &StreamSpec::default(),
        )
        .into_iter()
        .map(|(name, value)| {
            assert_eq!(value["type"], json!(name));
            name
        })
        .collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
    }

    #[test]
    fn stream_error_event() {
        let spec = StreamSpec {
            fail_after: Some(1),
            fail_with: Some(crate::mock::script::FailWith::ErrorEvent),
            ..StreamSpec::default()
        };
        let all = events(
            message_stream(&turn(), &Answer::new(&Reply::default(), 1)),
            &spec,
        );
        let (name, value) = all.last().unwrap();
        assert_eq!(name, "error");
        assert_eq!(value["error"]["type"], "overloaded_error");
        assert_eq!(all.len(), 5); // start, block start, ping, one delta, error
    }
}
