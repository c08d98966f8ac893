//! Messages SSE events -> OpenAI `chat.completion.chunk` SSE bytes, incrementally.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::response::{finish_reason, str_field, TokenCounts};
use ai_router_contract::kinds::DailyReset;

use crate::classify::{classify_stream_error, failure::Failure, Class};
use crate::wire::sse::Event;

/// Translates the Anthropic SSE stream into OpenAI chunk SSE bytes, incrementally.
#[derive(Debug, Clone)]
pub struct StreamTranslator {
    created_s: i64,
    id: String,
    model: String,
    counts: TokenCounts,
    /// Anthropic content block index -> OpenAI tool call index.
    tool_blocks: HashMap<u64, usize>,
    finished: bool,
    /// When the provider's days end: a quota error in the stream lasts until then.
    daily_reset: Option<DailyReset>,
}

impl StreamTranslator {
    pub fn new(created_s: i64, daily_reset: Option<DailyReset>) -> Self {
        Self {
            created_s,
            daily_reset,
            id: String::from("chatcmpl-"),
            model: String::new(),
            counts: TokenCounts::default(),
            tool_blocks: HashMap::new(),
            finished: false,
        }
    }

    /// Whether `message_stop` was seen.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Feeds one parsed Anthropic event; returns the OpenAI SSE bytes it produces (possibly
    /// empty), or the classified failure for an `error` event (or data that is not JSON).
    pub fn feed(&mut self, event: &Event, now_ms: i64) -> Result<Vec<u8>, Failure> {
        let data = event.data.trim();
        if data.is_empty() || self.finished {
            // Keep-alive comments; anything after message_stop.
            return Ok(Vec::new());
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(_) if event.name.as_deref() == Some("error") => {
                let wrapped = json!({ "type": "error", "error": { "message": data } });
                return Err(classify_stream_error(
                    "anthropic",
                    self.daily_reset,
                    &wrapped,
                    now_ms,
                ));
            }
            Err(_) => {
                return Err(Failure::local(
                    Class::Stream,
                    200,
                    "the provider sent malformed stream data",
                ))
            }
        };
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .or(event.name.as_deref())
            .unwrap_or("");
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                let message = value.get("message").unwrap_or(&Value::Null);
                self.id = format!("chatcmpl-{}", str_field(message, "id"));
                self.model = str_field(message, "model").to_string();
                self.counts.update(message.get("usage"));
                self.chunk(
                    &mut out,
                    json!({ "role": "assistant", "content": "" }),
                    None,
                );
            }
            "content_block_start" => {
                let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
                let block = value.get("content_block").unwrap_or(&Value::Null);
                match str_field(block, "type") {
                    "text" => {
                        let text = str_field(block, "text");
                        if !text.is_empty() {
                            self.chunk(&mut out, json!({ "content": text }), None);
                        }
                    }
                    "tool_use" => {
                        let n = self.tool_blocks.len();
                        self.tool_blocks.insert(index, n);
                        let call = json!({
                            "index": n,
                            "id": str_field(block, "id"),
                            "type": "function",
                            "function": { "name": str_field(block, "name"), "arguments": "" },
                        });
                        self.chunk(&mut out, json!({ "tool_calls": [call] }), None);
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
                let delta = value.get("delta").unwrap_or(&Value::Null);
                match str_field(delta, "type") {
                    "text_delta" => {
                        let text = str_field(delta, "text");
                        if !text.is_empty() {
                            self.chunk(&mut out, json!({ "content": text }), None);
                        }
                    }
                    "input_json_delta" => {
                        let partial = str_field(delta, "partial_json");
                        if let (Some(n), false) = (self.tool_blocks.get(&index), partial.is_empty())
                        {
                            let call = json!({ "index": n, "function": { "arguments": partial } });
                            self.chunk(&mut out, json!({ "tool_calls": [call] }), None);
                        }
                    }
                    // thinking_delta, signature_delta, citations_delta: nothing to say in OpenAI.
                    _ => {}
                }
            }
            "message_delta" => {
                self.counts.update(value.get("usage"));
                if let Some(reason) = value
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.chunk(&mut out, json!({}), Some(finish_reason(reason)));
                }
            }
            "message_stop" => {
                self.finished = true;
                let usage = json!({
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created_s,
                    "model": self.model,
                    "choices": [],
                    "usage": self.counts.openai(),
                });
                push_data(&mut out, &usage);
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            "error" => {
                return Err(classify_stream_error(
                    "anthropic",
                    self.daily_reset,
                    &value,
                    now_ms,
                ))
            }
            // ping, content_block_stop and event types newer than this adapter.
            _ => {}
        }
        Ok(out)
    }

    fn chunk(&self, out: &mut Vec<u8>, delta: Value, finish: Option<&str>) {
        let chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created_s,
            "model": self.model,
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }],
        });
        push_data(out, &chunk);
    }
}

fn push_data(out: &mut Vec<u8>, value: &Value) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(value.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}
