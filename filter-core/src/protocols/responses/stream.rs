//! Chat-completion chunk events -> the typed Responses events.

use serde_json::{json, Value};

use super::response::{call_item, message_item, response, response_id, status_of, usage};
use crate::protocols::anthropic::response::str_field as str_of;
use crate::wire::sse::FromChatStream;

/// An output item being streamed.
#[derive(Debug, Clone)]
enum Item {
    Text {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        tool_index: u64,
    },
}

/// Chat-completion chunk events -> typed Responses events, incrementally.
#[derive(Debug)]
pub struct StreamEncoder {
    /// The caller's request, echoed in the `response` objects.
    request: Value,
    created_s: i64,
    id: String,
    model: String,
    sequence: u64,
    started: bool,
    ended: bool,
    /// Items done, in output order.
    done: Vec<Value>,
    open: Option<Item>,
    finish: Option<String>,
    usage: Option<Value>,
}

impl StreamEncoder {
    pub fn new(request: Value, created_s: i64) -> Self {
        Self {
            request,
            created_s,
            id: String::new(),
            model: String::new(),
            sequence: 0,
            started: false,
            ended: false,
            done: Vec::new(),
            open: None,
            finish: None,
            usage: None,
        }
    }

    fn push(&mut self, out: &mut Vec<u8>, mut data: Value) {
        let name = str_of(&data, "type").to_string();
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.extend_from_slice(format!("event: {name}\ndata: {data}\n\n").as_bytes());
    }

    fn snapshot(&self, status: &str, output: Vec<Value>) -> Value {
        response(
            &self.id,
            &self.model,
            self.created_s,
            status,
            output,
            match status {
                "in_progress" => Value::Null,
                _ => usage(self.usage.as_ref()),
            },
            &self.request,
        )
    }

    fn output_index(&self) -> usize {
        self.done.len()
    }

    fn text_delta(&mut self, out: &mut Vec<u8>, text: &str) {
        if !matches!(self.open, Some(Item::Text { .. })) {
            self.close(out);
            let id = format!("msg_{}_{}", self.id, self.output_index());
            let index = self.output_index();
            self.push(out, json!({ "type": "response.output_item.added", "output_index": index,
                "item": { "type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": [] } }));
            self.push(
                out,
                json!({ "type": "response.content_part.added", "item_id": id,
                "output_index": index, "content_index": 0,
                "part": { "type": "output_text", "text": "", "annotations": [] } }),
            );
            self.open = Some(Item::Text {
                id,
                text: String::new(),
            });
        }
        let index = self.output_index();
        let Some(Item::Text { id, text: so_far }) = &mut self.open else {
            return;
        };
        so_far.push_str(text);
        let id = id.clone();
        self.push(
            out,
            json!({ "type": "response.output_text.delta", "item_id": id,
            "output_index": index, "content_index": 0, "delta": text, "logprobs": [] }),
        );
    }

    fn call_delta(&mut self, out: &mut Vec<u8>, call: &Value) {
        let tool_index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        let same = matches!(&self.open, Some(Item::Call { tool_index: t, .. }) if *t == tool_index);
        if !same {
            self.close(out);
            let index = self.output_index();
            let id = format!("fc_{}_{index}", self.id);
            let call_id = str_of(call, "id").to_string();
            let name = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            self.push(
                out,
                json!({ "type": "response.output_item.added", "output_index": index,
                "item": call_item(&self.request, &id, &call_id, &name, "", "in_progress") }),
            );
            self.open = Some(Item::Call {
                id,
                call_id,
                name,
                arguments: String::new(),
                tool_index,
            });
        }
        let Some(part) = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
        else {
            return;
        };
        let index = self.output_index();
        let Some(Item::Call { id, arguments, .. }) = &mut self.open else {
            return;
        };
        arguments.push_str(part);
        let id = id.clone();
        self.push(
            out,
            json!({ "type": "response.function_call_arguments.delta", "item_id": id,
            "output_index": index, "delta": part }),
        );
    }

    /// Closes the open item: its `.done` events.
    fn close(&mut self, out: &mut Vec<u8>) {
        let index = self.output_index();
        let item = match self.open.take() {
            None => return,
            Some(Item::Text { id, text }) => {
                self.push(
                    out,
                    json!({ "type": "response.output_text.done", "item_id": id,
                    "output_index": index, "content_index": 0, "text": text, "logprobs": [] }),
                );
                self.push(
                    out,
                    json!({ "type": "response.content_part.done", "item_id": id,
                    "output_index": index, "content_index": 0,
                    "part": { "type": "output_text", "text": text, "annotations": [] } }),
                );
                message_item(&id, &text, "completed")
            }
            Some(Item::Call {
                id,
                call_id,
                name,
                arguments,
                ..
            }) => {
                self.push(
                    out,
                    json!({ "type": "response.function_call_arguments.done",
                    "item_id": id, "output_index": index, "arguments": arguments }),
                );
                call_item(&self.request, &id, &call_id, &name, &arguments, "completed")
            }
        };
        self.push(
            out,
            json!({ "type": "response.output_item.done", "output_index": index, "item": item }),
        );
        self.done.push(item);
    }

    /// The stream broke after its first token: `error`, then `response.failed`; nothing after.
    fn on_error(&mut self, out: &mut Vec<u8>, code: &str, message: &str) {
        self.ended = true;
        let code = if code.is_empty() {
            "stream_interrupted"
        } else {
            code
        };
        self.push(
            out,
            json!({ "type": "error", "code": code, "message": message, "param": null }),
        );
        let mut failed = self.snapshot("failed", self.done.clone());
        failed["error"] = json!({ "code": code, "message": message });
        self.push(
            out,
            json!({ "type": "response.failed", "response": failed }),
        );
    }
}

impl FromChatStream for StreamEncoder {
    fn ended(&self) -> bool {
        self.ended
    }

    fn chunk(&mut self, out: &mut Vec<u8>, chunk: &Value) {
        if !self.started {
            self.started = true;
            self.id = response_id(str_of(chunk, "id"));
            self.model = str_of(chunk, "model").to_string();
            let created = self.snapshot("in_progress", Vec::new());
            self.push(
                out,
                json!({ "type": "response.created", "response": created }),
            );
            let progress = self.snapshot("in_progress", Vec::new());
            self.push(
                out,
                json!({ "type": "response.in_progress", "response": progress }),
            );
        }
        if chunk.get("usage").is_some_and(|u| !u.is_null()) {
            self.usage = chunk.get("usage").cloned();
        }
        let choice = chunk.pointer("/choices/0").cloned().unwrap_or(Value::Null);
        let delta = choice.get("delta").cloned().unwrap_or(Value::Null);
        if let Some(text) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            self.text_delta(out, text);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            self.call_delta(out, call);
        }
        if let Some(finish) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(finish.to_string());
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        self.ended = true;
        self.close(out);
        let status = status_of(self.finish.as_deref().unwrap_or("stop"));
        let name = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        let done = self.snapshot(status, self.done.clone());
        self.push(out, json!({ "type": name, "response": done }));
    }

    fn fail(&mut self, out: &mut Vec<u8>, error: &Value) {
        self.on_error(out, str_of(error, "code"), str_of(error, "message"));
    }
}
