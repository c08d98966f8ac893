//! Messages SSE events -> OpenAI `chat.completion.chunk` SSE bytes, incrementally.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::response::{finish_reason, str_field, TokenCounts};
use ai_router_contract::kinds::DailyReset;

use crate::classify::{classify_stream_error, failure::Failure};
use crate::wire::sse::Event;
use ai_router_contract::failure::ErrorClass;

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
        let value = self.parse(event, data, now_ms)?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .or(event.name.as_deref())
            .unwrap_or("");
        let mut out = Vec::new();
        match kind {
            "message_start" => self.message_start(&value, &mut out),
            "content_block_start" => self.content_block_start(&value, &mut out),
            "content_block_delta" => self.content_block_delta(&value, &mut out),
            "message_delta" => self.message_delta(&value, &mut out),
            "message_stop" => self.message_stop(&mut out),
            "error" => return Err(self.failure(&value, now_ms)),
            // ping, content_block_stop and event types newer than this adapter.
            _ => {}
        }
        Ok(out)
    }

    /// An event's data as JSON; an `error` event whose data is not JSON is classified by its
    /// text, any other such data is a broken stream.
    fn parse(&self, event: &Event, data: &str, now_ms: i64) -> Result<Value, Failure> {
        match serde_json::from_str(data) {
            Ok(v) => Ok(v),
            Err(_) if event.name.as_deref() == Some("error") => {
                let wrapped = json!({ "type": "error", "error": { "message": data } });
                Err(self.failure(&wrapped, now_ms))
            }
            Err(_) => Err(Failure::local(
                ErrorClass::Stream,
                200,
                "the provider sent malformed stream data",
            )),
        }
    }

    /// An `error` event, classified as the provider's error answers are.
    fn failure(&self, error: &Value, now_ms: i64) -> Failure {
        classify_stream_error("anthropic", self.daily_reset, error, now_ms)
    }

    /// `message_start`: the message's id, model and first usage; the assistant's first chunk.
    fn message_start(&mut self, value: &Value, out: &mut Vec<u8>) {
        let message = value.get("message").unwrap_or(&Value::Null);
        self.id = format!("chatcmpl-{}", str_field(message, "id"));
        self.model = str_field(message, "model").to_string();
        self.counts.update(message.get("usage"));
        self.chunk(out, json!({ "role": "assistant", "content": "" }), None);
    }

    /// `content_block_start`: a text block's first text, or a tool call opened (its id and
    /// name, the arguments to come).
    fn content_block_start(&mut self, value: &Value, out: &mut Vec<u8>) {
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        let block = value.get("content_block").unwrap_or(&Value::Null);
        match str_field(block, "type") {
            "text" => {
                let text = str_field(block, "text");
                if !text.is_empty() {
                    self.chunk(out, json!({ "content": text }), None);
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
                self.chunk(out, json!({ "tool_calls": [call] }), None);
            }
            _ => {}
        }
    }

    /// `content_block_delta`: more text, or more of a tool call's arguments.
    fn content_block_delta(&self, value: &Value, out: &mut Vec<u8>) {
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        let delta = value.get("delta").unwrap_or(&Value::Null);
        match str_field(delta, "type") {
            "text_delta" => {
                let text = str_field(delta, "text");
                if !text.is_empty() {
                    self.chunk(out, json!({ "content": text }), None);
                }
            }
            "input_json_delta" => {
                let partial = str_field(delta, "partial_json");
                if let (Some(n), false) = (self.tool_blocks.get(&index), partial.is_empty()) {
                    let call = json!({ "index": n, "function": { "arguments": partial } });
                    self.chunk(out, json!({ "tool_calls": [call] }), None);
                }
            }
            // thinking_delta, signature_delta, citations_delta: nothing to say in OpenAI.
            _ => {}
        }
    }

    /// `message_delta`: the usage so far, and the finish reason once the message stops.
    fn message_delta(&mut self, value: &Value, out: &mut Vec<u8>) {
        self.counts.update(value.get("usage"));
        if let Some(reason) = value
            .get("delta")
            .and_then(|d| d.get("stop_reason"))
            .and_then(Value::as_str)
        {
            self.chunk(out, json!({}), Some(finish_reason(reason)));
        }
    }

    /// `message_stop`: the usage chunk and `[DONE]`; nothing is read after it.
    fn message_stop(&mut self, out: &mut Vec<u8>) {
        self.finished = true;
        let usage = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created_s,
            "model": self.model,
            "choices": [],
            "usage": self.counts.openai(),
        });
        push_data(out, &usage);
        out.extend_from_slice(b"data: [DONE]\n\n");
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
