//! Chat-completion chunk events -> Messages SSE events.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::errors::stream_error;
use super::response::{message_id, stop_reason, usage};
use crate::protocols::anthropic::response::str_field as str_of;
use crate::wire::sse::FromChatStream;

/// The content block open in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text(u64),
    Tool(u64),
}

/// Chat-completion chunk events -> Messages SSE events, incrementally.
#[derive(Debug, Default)]
pub struct StreamEncoder {
    started: bool,
    ended: bool,
    open: Option<Block>,
    next_index: u64,
    /// OpenAI tool call index -> Messages block index.
    tools: BTreeMap<u64, u64>,
    stop_reason: Option<&'static str>,
    usage: Option<Value>,
}

fn push_event(out: &mut Vec<u8>, name: &str, data: &Value) {
    out.extend_from_slice(format!("event: {name}\ndata: {data}\n\n").as_bytes());
}

impl StreamEncoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn open_text(&mut self, out: &mut Vec<u8>) -> u64 {
        if let Some(Block::Text(i)) = self.open {
            return i;
        }
        self.close(out);
        let i = self.next_index;
        self.next_index += 1;
        self.open = Some(Block::Text(i));
        push_event(
            out,
            "content_block_start",
            &json!({ "type": "content_block_start", "index": i,
                     "content_block": { "type": "text", "text": "" } }),
        );
        i
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some(Block::Text(i) | Block::Tool(i)) = self.open.take() {
            push_event(
                out,
                "content_block_stop",
                &json!({ "type": "content_block_stop", "index": i }),
            );
        }
    }
}

impl FromChatStream for StreamEncoder {
    fn ended(&self) -> bool {
        self.ended
    }

    fn chunk(&mut self, out: &mut Vec<u8>, chunk: &Value) {
        if !self.started {
            self.started = true;
            push_event(
                out,
                "message_start",
                &json!({ "type": "message_start", "message": {
                    "id": message_id(str_of(chunk, "id")),
                    "type": "message",
                    "role": "assistant",
                    "model": str_of(chunk, "model"),
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": usage(chunk.get("usage")),
                }}),
            );
            push_event(out, "ping", &json!({ "type": "ping" }));
        }
        if chunk.get("usage").is_some_and(|u| !u.is_null()) {
            self.usage = chunk.get("usage").cloned();
        }
        let choice = chunk.pointer("/choices/0").unwrap_or(&Value::Null);
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        if let Some(text) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            let index = self.open_text(out);
            push_event(
                out,
                "content_block_delta",
                &json!({ "type": "content_block_delta", "index": index,
                         "delta": { "type": "text_delta", "text": text } }),
            );
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let n = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let index = match self.tools.get(&n) {
                Some(i) => *i,
                None => {
                    self.close(out);
                    let i = self.next_index;
                    self.next_index += 1;
                    self.tools.insert(n, i);
                    self.open = Some(Block::Tool(i));
                    push_event(
                        out,
                        "content_block_start",
                        &json!({ "type": "content_block_start", "index": i, "content_block": {
                            "type": "tool_use",
                            "id": str_of(call, "id"),
                            "name": call.pointer("/function/name").and_then(Value::as_str).unwrap_or(""),
                            "input": {},
                        }}),
                    );
                    i
                }
            };
            if let Some(partial) = call
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
            {
                push_event(
                    out,
                    "content_block_delta",
                    &json!({ "type": "content_block_delta", "index": index,
                             "delta": { "type": "input_json_delta", "partial_json": partial } }),
                );
            }
        }
        if let Some(finish) = choice.get("finish_reason").and_then(Value::as_str) {
            self.stop_reason = Some(stop_reason(finish));
        }
    }

    /// The chat stream ended properly (`[DONE]`).
    fn finish(&mut self, out: &mut Vec<u8>) {
        self.ended = true;
        self.close(out);
        push_event(
            out,
            "message_delta",
            &json!({ "type": "message_delta",
                     "delta": { "stop_reason": self.stop_reason.unwrap_or("end_turn"), "stop_sequence": null },
                     "usage": usage(self.usage.as_ref()) }),
        );
        push_event(out, "message_stop", &json!({ "type": "message_stop" }));
    }

    fn fail(&mut self, out: &mut Vec<u8>, error: &Value) {
        self.ended = true;
        push_event(out, "error", &stream_error(str_of(error, "message")));
    }
}
