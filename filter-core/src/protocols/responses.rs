//! Callers that speak the OpenAI Responses API (`POST /v1/responses`), stateless, served by a
//! provider that speaks chat completions (or, through the Messages adapter after this one,
//! Anthropic). Pure translations, no host calls:
//!
//! - [`to_chat_request`]: a Responses request body to a chat-completions body;
//! - [`from_chat_response`]: a `chat.completion` to a `response` object;
//! - [`StreamEncoder`]: chat-completion chunk events to the typed Responses events
//!   (`response.created`, `response.output_item.added`, `response.output_text.delta`,
//!   `response.function_call_arguments.delta`, …, `response.completed`), an OpenAI error
//!   event to `error` then `response.failed`;
//! - [`stateful`]: whether a request needs the provider to keep state (`previous_response_id`,
//!   `conversation`, `store: true`), which only a provider of kind `openai` serves, natively
//!   (and, for an id the gateway saw stored, only its key: `crate::lanes::response_pins`).

use serde_json::{json, Map, Value};

use crate::protocols::anthropic::{str_field as str_of, AdapterError};
use crate::wire::sse::FromChatStream;

/// The field that makes the request stateful, if one does: `previous_response_id`,
/// `conversation`, or `store: true` (an absent `store` is taken as false here: such a call may
/// be translated, and then nothing is kept).
pub fn stateful(body: &Value) -> Option<&'static str> {
    if body
        .get("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        Some("previous_response_id")
    } else if body.get("conversation").is_some_and(|v| !v.is_null()) {
        Some("conversation")
    } else if body.get("store").and_then(Value::as_bool) == Some(true) {
        Some("store")
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Request
// ---------------------------------------------------------------------------------------------

const ITEMS: [&str; 4] = [
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
];
const PARTS: [&str; 5] = [
    "input_text",
    "output_text",
    "text",
    "input_image",
    "refusal",
];

/// The request with what only OpenAI runs left out (built-in tools, other items and parts):
/// what the front stage routes by, which must not refuse what a native lane would take.
pub fn routing_view(body: &Value) -> Value {
    let mut view = body.clone();
    if let Some(Value::Array(tools)) = view.get_mut("tools") {
        *tools = flat_tools(tools);
        tools.retain(|t| str_of(t, "type") == "function");
    }
    if let Some(Value::Array(items)) = view.get_mut("input") {
        items.retain(|i| i.get("role").is_some() || ITEMS.contains(&str_of(i, "type")));
        for item in items.iter_mut() {
            if let Some(Value::Array(parts)) = item.get_mut("content") {
                parts.retain(|p| PARTS.contains(&str_of(p, "type")));
            }
        }
    }
    view
}

/// Responses request -> chat-completions request (the model name kept as the caller wrote it).
pub fn to_chat_request(body: &Value) -> Result<Value, AdapterError> {
    let Some(req) = body.as_object() else {
        return Err(AdapterError::not_an_object());
    };
    let mut out = Map::new();
    if let Some(model) = req.get("model") {
        out.insert("model".into(), model.clone());
    }
    let mut messages = Vec::new();
    if let Some(instructions) = req.get("instructions").and_then(Value::as_str) {
        messages.push(json!({ "role": "system", "content": instructions }));
    }
    match req.get("input") {
        Some(Value::String(text)) => messages.push(json!({ "role": "user", "content": text })),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                item_to_chat(item, i, &mut messages)?;
            }
        }
        _ => {
            return Err(AdapterError::new(
                "input",
                "input must be a string or an array of items.",
            ))
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(n) = req.get("max_output_tokens").filter(|v| !v.is_null()) {
        out.insert("max_tokens".into(), n.clone());
    }
    for key in [
        "temperature",
        "top_p",
        "stream",
        "parallel_tool_calls",
        "user",
    ] {
        if let Some(v) = req.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(format) = body.pointer("/text/format").filter(|f| !f.is_null()) {
        match str_of(format, "type") {
            "text" => {}
            "json_object" => {
                out.insert("response_format".into(), json!({ "type": "json_object" }));
            }
            "json_schema" => {
                let mut schema = Map::new();
                schema.insert("name".into(), json!(str_of(format, "name")));
                for key in ["schema", "strict", "description"] {
                    if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                        schema.insert(key.into(), v.clone());
                    }
                }
                out.insert(
                    "response_format".into(),
                    json!({ "type": "json_schema", "json_schema": schema }),
                );
            }
            _ => {
                return Err(AdapterError::new(
                    "text",
                    "text.format.type must be text, json_object or json_schema.",
                ))
            }
        }
    }
    tools_to_chat(req, &mut out)?;
    Ok(Value::Object(out))
}

/// One input item -> chat messages; consecutive function calls join one assistant message.
fn item_to_chat(item: &Value, index: usize, out: &mut Vec<Value>) -> Result<(), AdapterError> {
    let kind = match str_of(item, "type") {
        "" if item.get("role").is_some() => "message",
        k => k,
    };
    match kind {
        "message" => {
            let role = match str_of(item, "role") {
                r @ ("user" | "assistant" | "system") => r,
                "developer" => "system",
                _ => {
                    return Err(AdapterError::new(
                        "input",
                        format!("input[{index}].role must be user, assistant, system or developer."),
                    ))
                }
            };
            let content = match item.get("content") {
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(Value::Array(parts)) => {
                    let mut chat_parts = Vec::new();
                    for part in parts {
                        chat_parts.push(part_to_chat(part, index)?);
                    }
                    let all_text = chat_parts.iter().all(|p| str_of(p, "type") == "text");
                    if all_text && (role != "user" || chat_parts.len() == 1) {
                        // Assistant and system turns take text only.
                        Value::String(
                            chat_parts
                                .iter()
                                .map(|p| str_of(p, "text"))
                                .collect::<Vec<_>>()
                                .join(""),
                        )
                    } else {
                        Value::Array(chat_parts)
                    }
                }
                _ => {
                    return Err(AdapterError::new(
                        "input",
                        format!("input[{index}].content must be a string or content parts."),
                    ))
                }
            };
            out.push(json!({ "role": role, "content": content }));
        }
        "function_call" => {
            // A namespace's tool goes by its flattened name, as the lane was offered it.
            let name = match str_of(item, "namespace") {
                "" => str_of(item, "name").to_string(),
                ns => format!("{ns}{NAMESPACE_SEPARATOR}{}", str_of(item, "name")),
            };
            let call = json!({
                "id": str_of(item, "call_id"),
                "type": "function",
                "function": { "name": name, "arguments": str_of(item, "arguments") },
            });
            let joins_last = out.last().is_some_and(|m| {
                str_of(m, "role") == "assistant" && m.get("tool_calls").is_some()
            });
            match out.last_mut().and_then(|m| m.get_mut("tool_calls")) {
                Some(Value::Array(calls)) if joins_last => calls.push(call),
                _ => out.push(json!({ "role": "assistant", "content": null, "tool_calls": [call] })),
            }
        }
        "function_call_output" => {
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            out.push(json!({ "role": "tool", "tool_call_id": str_of(item, "call_id"), "content": output }));
        }
        // The model's reasoning from an earlier turn: a chat provider takes none back.
        "reasoning" => {}
        other => {
            return Err(AdapterError::new(
                "input",
                format!("input[{index}] is a '{other}' item, which the gateway serves only natively (kind openai)."),
            ))
        }
    }
    Ok(())
}

fn part_to_chat(part: &Value, index: usize) -> Result<Value, AdapterError> {
    match str_of(part, "type") {
        "input_text" | "output_text" | "text" => {
            Ok(json!({ "type": "text", "text": str_of(part, "text") }))
        }
        "input_image" => {
            let url = str_of(part, "image_url");
            if url.is_empty() {
                return Err(AdapterError::new(
                    "input",
                    format!("input[{index}] has an image without image_url (file ids are kept only by OpenAI)."),
                ));
            }
            let mut image = Map::new();
            image.insert("url".into(), json!(url));
            if let Some(detail) = part.get("detail").filter(|d| d.is_string()) {
                image.insert("detail".into(), detail.clone());
            }
            Ok(json!({ "type": "image_url", "image_url": image }))
        }
        "refusal" => Ok(json!({ "type": "text", "text": str_of(part, "refusal") })),
        other => Err(AdapterError::new(
            "input",
            format!("input[{index}] has a '{other}' part, which only OpenAI serves."),
        )),
    }
}

/// Between a namespace's name and its tool's in the function name a translated lane sees
/// (`multi_agent_v1__spawn_agent`); chat function names take `[A-Za-z0-9_-]` only.
pub const NAMESPACE_SEPARATOR: &str = "__";

/// The request's function tools, a namespace's tools flattened into function tools named
/// `<namespace>__<tool>`; hosted tools (web search, file search, …) as they are.
fn flat_tools(tools: &[Value]) -> Vec<Value> {
    let mut flat = Vec::new();
    for tool in tools {
        if str_of(tool, "type") != "namespace" {
            flat.push(tool.clone());
            continue;
        }
        let namespace = str_of(tool, "name");
        for inner in tool
            .get("tools")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let mut inner = inner.clone();
            if str_of(&inner, "type") == "function" {
                let name = format!("{namespace}{NAMESPACE_SEPARATOR}{}", str_of(&inner, "name"));
                inner["name"] = json!(name);
            }
            flat.push(inner);
        }
    }
    flat
}

fn tools_to_chat(
    req: &Map<String, Value>,
    out: &mut Map<String, Value>,
) -> Result<(), AdapterError> {
    if let Some(tools) = req.get("tools").and_then(Value::as_array) {
        let mut chat_tools = Vec::new();
        for tool in &flat_tools(tools) {
            if str_of(tool, "type") != "function" {
                return Err(AdapterError::new(
                    "tools",
                    format!(
                        "The tool type '{}' runs only at OpenAI; the gateway routes function tools.",
                        str_of(tool, "type")
                    ),
                ));
            }
            let mut function = Map::new();
            for key in ["name", "description", "parameters", "strict"] {
                if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                    function.insert(key.into(), v.clone());
                }
            }
            chat_tools.push(json!({ "type": "function", "function": function }));
        }
        if !chat_tools.is_empty() {
            out.insert("tools".into(), Value::Array(chat_tools));
        }
    }
    match req.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            out.insert("tool_choice".into(), json!(s));
        }
        Some(choice) if str_of(choice, "type") == "function" => {
            out.insert(
                "tool_choice".into(),
                json!({ "type": "function", "function": { "name": str_of(choice, "name") } }),
            );
        }
        Some(_) => {
            return Err(AdapterError::new(
                "tool_choice",
                "tool_choice must be auto, none, required or a function.",
            ))
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Response
// ---------------------------------------------------------------------------------------------

fn response_id(chat_id: &str) -> String {
    let bare = chat_id.strip_prefix("chatcmpl-").unwrap_or(chat_id);
    format!("resp_{bare}")
}

/// Usage as Responses reports it.
fn usage(chat_usage: Option<&Value>) -> Value {
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

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({ "type": "message", "id": id, "status": status, "role": "assistant",
            "content": [{ "type": "output_text", "text": text, "annotations": [] }] })
}

/// A `function_call` item; a call of a namespace's tool (flattened on the way in, see
/// [`NAMESPACE_SEPARATOR`]) gets its own name back and its `namespace`.
fn call_item(
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
fn namespaced<'a>(request: &Value, flat: &'a str) -> Option<(&'a str, &'a str)> {
    let (namespace, tool) = flat.split_once(NAMESPACE_SEPARATOR)?;
    let declared = request
        .get("tools")
        .and_then(Value::as_array)?
        .iter()
        .any(|t| str_of(t, "type") == "namespace" && str_of(t, "name") == namespace);
    declared.then_some((namespace, tool))
}

/// The `response` object around `output`, echoing what the request asked for.
fn response(
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

fn status_of(finish_reason: &str) -> &'static str {
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

// ---------------------------------------------------------------------------------------------
// Stream
// ---------------------------------------------------------------------------------------------

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sse::Parser;

    fn chat(body: Value) -> Value {
        to_chat_request(&body).unwrap()
    }

    #[test]
    fn a_string_input_with_instructions() {
        assert_eq!(
            chat(
                json!({ "model": "m", "input": "Hi", "instructions": "Be brief.",
                "max_output_tokens": 50, "stream": true, "temperature": 0.5 })
            ),
            json!({ "model": "m", "messages": [
                { "role": "system", "content": "Be brief." },
                { "role": "user", "content": "Hi" },
            ], "max_tokens": 50, "stream": true, "temperature": 0.5 })
        );
        assert_eq!(
            to_chat_request(&json!({ "model": "m" })).unwrap_err().param,
            Some("input")
        );
    }

    #[test]
    fn items_with_images_function_calls_and_outputs() {
        let out = chat(json!({ "model": "m", "input": [
            { "role": "developer", "content": "Use tools." },
            { "type": "message", "role": "user", "content": [
                { "type": "input_text", "text": "Weather here?" },
                { "type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "low" } ] },
            { "type": "reasoning", "id": "rs_1", "summary": [] },
            { "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" },
            { "type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}" },
            { "type": "function_call_output", "call_id": "call_1", "output": "sunny" },
            { "type": "function_call_output", "call_id": "call_2", "output": { "t": 1 } },
            { "role": "assistant", "content": [{ "type": "output_text", "text": "Sunny." }] },
        ]}));
        let m = out["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({ "role": "system", "content": "Use tools." }));
        assert_eq!(
            m[1]["content"][1],
            json!({ "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBO", "detail": "low" } })
        );
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[2]["tool_calls"][1]["id"], "call_2");
        assert_eq!(
            m[3],
            json!({ "role": "tool", "tool_call_id": "call_1", "content": "sunny" })
        );
        assert_eq!(m[4]["content"], "{\"t\":1}");
        assert_eq!(m[5], json!({ "role": "assistant", "content": "Sunny." }));
    }

    #[test]
    fn function_tools_json_formats_and_refusals() {
        let out = chat(json!({ "model": "m", "input": "x",
            "tools": [{ "type": "function", "name": "f", "description": "d",
                        "parameters": { "type": "object" }, "strict": true }],
            "tool_choice": { "type": "function", "name": "f" },
            "text": { "format": { "type": "json_schema", "name": "answer",
                                  "schema": { "type": "object" }, "strict": true } } }));
        assert_eq!(
            out["tools"][0],
            json!({ "type": "function", "function": { "name": "f", "description": "d",
                "parameters": { "type": "object" }, "strict": true } })
        );
        assert_eq!(out["tool_choice"]["function"]["name"], "f");
        assert_eq!(
            out["response_format"],
            json!({ "type": "json_schema", "json_schema": { "name": "answer",
                "schema": { "type": "object" }, "strict": true } })
        );
        let out = chat(json!({ "input": "x", "text": { "format": { "type": "json_object" } } }));
        assert_eq!(out["response_format"]["type"], "json_object");
        let e = to_chat_request(&json!({ "input": "x", "tools": [{ "type": "web_search" }] }))
            .unwrap_err();
        assert_eq!(e.param, Some("tools"));
        let e = to_chat_request(&json!({ "input": [{ "type": "item_reference", "id": "x" }] }))
            .unwrap_err();
        assert!(e.message.contains("natively"));
    }

    #[test]
    fn namespace_tools_are_flattened_for_chat_and_their_calls_named_back() {
        let request = json!({ "model": "m", "input": [
                { "type": "function_call", "call_id": "c0", "namespace": "agents",
                  "name": "spawn", "arguments": "{}" },
                { "type": "function_call_output", "call_id": "c0", "output": "ok" }],
            "tools": [{ "type": "function", "name": "exec_command", "parameters": {} },
                      { "type": "namespace", "name": "agents", "description": "Sub-agents.",
                        "tools": [{ "type": "function", "name": "spawn", "parameters": {} },
                                  { "type": "function", "name": "close", "parameters": {} }] }] });
        let out = chat(request.clone());
        let names: Vec<&str> = out["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["exec_command", "agents__spawn", "agents__close"]);
        assert_eq!(
            out["messages"][0]["tool_calls"][0]["function"]["name"],
            "agents__spawn"
        );
        let answer = json!({ "id": "chatcmpl-1", "model": "m", "choices": [{ "index": 0,
            "message": { "role": "assistant", "content": null, "tool_calls": [
                { "id": "c1", "type": "function", "function": { "name": "agents__close", "arguments": "{}" } },
                { "id": "c2", "type": "function", "function": { "name": "exec_command", "arguments": "{}" } },
                { "id": "c3", "type": "function", "function": { "name": "other__x", "arguments": "{}" } }] },
            "finish_reason": "tool_calls" }] });
        let r = from_chat_response(&answer, &request, 0);
        assert_eq!(
            (
                r["output"][0]["name"].clone(),
                r["output"][0]["namespace"].clone()
            ),
            (json!("close"), json!("agents"))
        );
        assert_eq!(r["output"][1]["name"], "exec_command");
        assert!(r["output"][1].get("namespace").is_none());
        // Not a declared namespace: the name as it came.
        assert_eq!(r["output"][2]["name"], "other__x");
        // A hosted tool is refused, its type named.
        let e = to_chat_request(&json!({ "input": "x", "tools": [
            { "type": "namespace", "name": "n", "tools": [] }, { "type": "web_search" }] }))
        .unwrap_err();
        assert!(e.message.contains("'web_search'"), "{e}");
    }

    #[test]
    fn the_routing_view_leaves_out_what_only_openai_runs() {
        let body = json!({ "model": "m", "tools": [{ "type": "web_search" },
                { "type": "function", "name": "f", "parameters": {} }],
            "input": [{ "type": "item_reference", "id": "x" },
                { "role": "user", "content": [{ "type": "input_file", "file_id": "f" },
                                              { "type": "input_text", "text": "hi" }] }] });
        let out = to_chat_request(&routing_view(&body)).unwrap();
        assert_eq!(out["tools"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            out["messages"],
            json!([{ "role": "user", "content": "hi" }])
        );
        assert!(to_chat_request(&body).is_err(), "strictly, refused");
    }

    #[test]
    fn stateful_requests_are_named() {
        assert_eq!(
            stateful(&json!({ "previous_response_id": "resp_1" })),
            Some("previous_response_id")
        );
        assert_eq!(stateful(&json!({ "store": true })), Some("store"));
        assert_eq!(
            stateful(&json!({ "conversation": { "id": "conv_1" } })),
            Some("conversation")
        );
        assert_eq!(
            stateful(&json!({ "store": false, "previous_response_id": null })),
            None
        );
        assert_eq!(stateful(&json!({})), None);
    }

    #[test]
    fn a_chat_completion_becomes_a_response() {
        let chat = json!({ "id": "chatcmpl-9", "model": "gpt", "choices": [{ "index": 0,
            "message": { "role": "assistant", "content": "Hi", "tool_calls": [{ "id": "call_1",
                "type": "function", "function": { "name": "f", "arguments": "{}" } }] },
            "finish_reason": "tool_calls" }],
            "usage": { "prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": { "cached_tokens": 4 } } });
        let r = from_chat_response(&chat, &json!({ "instructions": "Be brief." }), 7);
        assert_eq!(r["id"], "resp_9");
        assert_eq!(r["object"], "response");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["created_at"], 7);
        assert_eq!(r["instructions"], "Be brief.");
        assert_eq!(
            r["output"][0],
            message_item("msg_resp_9", "Hi", "completed")
        );
        assert_eq!(r["output"][1]["type"], "function_call");
        assert_eq!(r["output"][1]["call_id"], "call_1");
        assert_eq!(r["usage"]["input_tokens"], 10);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
        assert_eq!(r["usage"]["total_tokens"], 13);
        let cut =
            json!({ "choices": [{ "message": { "content": "x" }, "finish_reason": "length" }] });
        let r = from_chat_response(&cut, &json!({}), 0);
        assert_eq!(
            (
                r["status"].clone(),
                r["incomplete_details"]["reason"].clone()
            ),
            (json!("incomplete"), json!("max_output_tokens"))
        );
    }

    const CHAT_STREAM: &str = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":5}}\n\n",
        "data: [DONE]\n\n",
    );

    fn encode(chat: &[u8]) -> Vec<u8> {
        crate::wire::sse::translated_at_every_cut(chat, || {
            let mut encoder = StreamEncoder::new(json!({ "model": "m" }), 1);
            move |event: &crate::wire::sse::Event| encoder.feed(event)
        })
    }

    fn events(bytes: &[u8]) -> Vec<Value> {
        Parser::new()
            .feed(bytes)
            .into_iter()
            .map(|e| {
                let v: Value = serde_json::from_str(&e.data).unwrap();
                assert_eq!(e.name.as_deref(), v["type"].as_str(), "event name = type");
                v
            })
            .collect()
    }

    #[test]
    fn a_chat_stream_becomes_typed_events_at_any_chunk_boundary() {
        let whole = encode(CHAT_STREAM.as_bytes());
        let got = events(&whole);
        let types: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e["sequence_number"], i);
        }
        assert_eq!(got[6]["text"], "Hello");
        assert_eq!(got[9]["output_index"], 1);
        assert_eq!(got[12]["arguments"], "{\"a\":1}");
        let done = &got[14]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"].as_array().unwrap().len(), 2);
        assert_eq!(done["usage"]["output_tokens"], 5);
    }

    #[test]
    fn an_error_event_fails_the_response() {
        let head = &CHAT_STREAM[..CHAT_STREAM.find("data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo").unwrap()];
        let chat = format!("{head}data: {{\"error\":{{\"message\":\"cut\",\"code\":\"stream_interrupted\"}}}}\n\ndata: [DONE]\n\n");
        let got = events(&encode(chat.as_bytes()));
        let n = got.len();
        assert_eq!(got[n - 2]["type"], "error");
        assert_eq!(got[n - 2]["code"], "stream_interrupted");
        assert_eq!(got[n - 1]["type"], "response.failed");
        assert_eq!(got[n - 1]["response"]["status"], "failed");
        assert_eq!(got[n - 1]["response"]["error"]["message"], "cut");
        assert!(!got.iter().any(|e| e["type"] == "response.completed"));
    }
}
