//! Chat-completion chunk events -> `GenerateContentResponse` chunks (SSE or a JSON array).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::errors::error_body;
use super::response::{finish_reason, function_call_part, response, usage_metadata};
use crate::protocols::anthropic::response::str_field as str_of;
use crate::wire::sse::FromChatStream;

/// A tool call being streamed: Gemini sends a function call whole, so its arguments are
/// gathered until the chat stream ends.
#[derive(Debug, Default)]
struct ToolCall {
    id: String,
    name: String,
    arguments: String,
}

/// Chat-completion chunk events -> `GenerateContentResponse` chunks, incrementally: each text
/// delta a chunk; the function calls, the `finishReason` and `usageMetadata` in the last.
#[derive(Debug, Default)]
pub struct StreamEncoder {
    /// Without `alt=sse`: one JSON array (`[`, chunks joined by `,\r\n`, `]`).
    json_array: bool,
    started: bool,
    ended: bool,
    model: String,
    id: String,
    tools: BTreeMap<u64, ToolCall>,
    finish: Option<&'static str>,
    usage: Option<Value>,
}

impl StreamEncoder {
    pub fn new(json_array: bool) -> Self {
        Self {
            json_array,
            ..Self::default()
        }
    }

    fn push(&mut self, out: &mut Vec<u8>, chunk: &Value) {
        if self.json_array {
            out.extend_from_slice(if self.started { b",\r\n" } else { b"[" });
            out.extend_from_slice(chunk.to_string().as_bytes());
        } else {
            out.extend_from_slice(format!("data: {chunk}\r\n\r\n").as_bytes());
        }
        self.started = true;
    }

    pub(super) fn close(&mut self, out: &mut Vec<u8>) {
        self.ended = true;
        if self.json_array {
            out.extend_from_slice(if self.started { b"]" } else { b"[]" });
        }
    }
}

impl FromChatStream for StreamEncoder {
    fn ended(&self) -> bool {
        self.ended
    }

    fn chunk(&mut self, out: &mut Vec<u8>, chunk: &Value) {
        if self.model.is_empty() {
            self.model = str_of(chunk, "model").to_string();
            self.id = str_of(chunk, "id").to_string();
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        let choice = chunk.pointer("/choices/0").unwrap_or(&Value::Null);
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let n = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let gathered = self.tools.entry(n).or_default();
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                gathered.id = id.to_string();
            }
            if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                gathered.name.push_str(name);
            }
            if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                gathered.arguments.push_str(args);
            }
        }
        if let Some(finish) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(finish_reason(finish));
        }
        if let Some(text) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            let (model, id) = (self.model.clone(), self.id.clone());
            self.push(
                out,
                &response(vec![json!({ "text": text })], None, &model, &id),
            );
        }
    }

    /// The chat stream ended properly (`[DONE]`): the last chunk, then the array's end.
    fn finish(&mut self, out: &mut Vec<u8>) {
        let mut parts: Vec<Value> = std::mem::take(&mut self.tools)
            .into_values()
            .map(|t| function_call_part(&t.id, &t.name, &t.arguments))
            .collect();
        if parts.is_empty() {
            parts.push(json!({ "text": "" }));
        }
        let (model, id) = (self.model.clone(), self.id.clone());
        let mut last = response(parts, Some(self.finish.unwrap_or("STOP")), &model, &id);
        if let Some(usage) = &self.usage {
            last["usageMetadata"] = usage_metadata(usage);
        }
        self.push(out, &last);
        self.close(out);
    }

    fn fail(&mut self, out: &mut Vec<u8>, error: &Value) {
        let code = ai_router_contract::error_code::ErrorCode::StreamInterrupted;
        let body = error_body(code.status(), code.as_str(), str_of(error, "message"));
        self.push(out, &body);
        self.close(out);
    }
}
