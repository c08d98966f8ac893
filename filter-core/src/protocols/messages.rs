//! Callers that speak the Anthropic Messages API (`POST /v1/messages`) served by a provider
//! that speaks OpenAI chat completions: the adapter of `anthropic.rs` in reverse. Pure
//! translations, no host calls:
//!
//! - [`to_chat_request`]: a Messages request body to a chat-completions body;
//! - [`from_chat_response`]: a `chat.completion` to a Messages `message`;
//! - [`StreamEncoder`]: chat-completion chunk events to Messages SSE events (`message_start`,
//!   `content_block_*`, `message_delta`, `message_stop`), an OpenAI error event to `error`;
//! - [`error_body`]: the Anthropic error object for a gateway error.
//!
//! A call served by a provider of kind `anthropic` takes none of these: its body goes as it
//! came, with only `model` rewritten (unknown fields, roles, blocks and tool types included).
//!
//! What the translation does with each part of a Messages request (docs/protocols.md lists the
//! same, per field): what has a chat-completions counterpart is translated; what has none is
//! dropped ([`DROPPED_FIELDS`], and any top-level field this module does not know yet) or
//! refused ([`REFUSED_FIELDS`], blocks and tool types chat cannot carry), naming the field.
//! A refusal rules the lane out (trail reason `adapter`); a native lane may still serve.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::protocols::anthropic::{str_field as str_of, AdapterError};
use crate::wire::sse::FromChatStream;

/// How a request with parts chat completions cannot express is treated: refused (the body
/// sent to an OpenAI-shaped provider) or left out (the front stage's view for routing, which
/// must not refuse what an anthropic provider would take).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fidelity {
    Strict,
    Lenient,
}

// ---------------------------------------------------------------------------------------------
// Request
// ---------------------------------------------------------------------------------------------

/// Top-level fields with no chat-completions counterpart, left out for a translated lane: the
/// lane answers with its own defaults for them.
pub const DROPPED_FIELDS: [&str; 8] = [
    // Extended thinking: a chat provider reasons (or not) by its own defaults.
    "thinking",
    // Server-side context edits (clearing old thinking or tool results): the gateway sends the
    // whole conversation as it came.
    "context_management",
    // `effort`; `output_config.format` is translated (to `response_format`).
    "output_config",
    "top_k",
    "service_tier",
    "container",
    // Only `metadata.user_id` has a counterpart (`user`).
    "metadata",
    "inference_geo",
];

/// Top-level fields a translated lane cannot honour and the caller relies on: refused.
pub const REFUSED_FIELDS: [&str; 1] = [
    // MCP servers the model calls at Anthropic.
    "mcp_servers",
];

/// Messages request -> chat-completions request (the model name kept as the caller wrote it).
pub fn to_chat_request(body: &Value, fidelity: Fidelity) -> Result<Value, AdapterError> {
    let Some(req) = body.as_object() else {
        return Err(AdapterError::not_an_object());
    };
    if fidelity == Fidelity::Strict {
        if let Some(field) = REFUSED_FIELDS
            .iter()
            .copied()
            .find(|f| req.get(*f).is_some_and(|v| !v.is_null()))
        {
            return Err(AdapterError::new(
                field,
                format!("'{field}' runs only at Anthropic; this model's provider (OpenAI-compatible) cannot take it."),
            ));
        }
    }
    let mut out = Map::new();
    if let Some(model) = req.get("model") {
        out.insert("model".into(), model.clone());
    }
    match req.get("max_tokens") {
        Some(n) if n.as_u64().is_some_and(|n| n > 0) => {
            out.insert("max_tokens".into(), n.clone());
        }
        _ => {
            return Err(AdapterError::new(
                "max_tokens",
                "max_tokens is required: a positive integer.",
            ))
        }
    }
    let mut messages = Vec::new();
    let mut system: Vec<String> = system_text(req.get("system"))?.into_iter().collect();
    let Some(turns) = req.get("messages").and_then(Value::as_array) else {
        return Err(AdapterError::new(
            "messages",
            "messages must be an array of turns.",
        ));
    };
    for (i, turn) in turns.iter().enumerate() {
        if str_of(turn, "role") == "system" {
            // A system turn inside `messages` joins the system prompt, in its order.
            system.extend(system_text(turn.get("content")).map_err(|_| {
                AdapterError::new(
                    "messages",
                    format!("messages[{i}].content must be a string or text blocks."),
                )
            })?);
            continue;
        }
        turn_to_chat(turn, i, fidelity, &mut messages)?;
    }
    if !system.is_empty() {
        messages.insert(
            0,
            json!({ "role": "system", "content": system.join("\n\n") }),
        );
    }
    out.insert("messages".into(), Value::Array(messages));
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
    ] {
        if let Some(v) = req.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), v.clone());
        }
    }
    if let Some(stops) = req.get("stop_sequences").filter(|v| !v.is_null()) {
        if !stops
            .as_array()
            .is_some_and(|s| s.iter().all(Value::is_string))
        {
            return Err(AdapterError::new(
                "stop_sequences",
                "stop_sequences must be an array of strings.",
            ));
        }
        out.insert("stop".into(), stops.clone());
    }
    if let Some(user) = body.pointer("/metadata/user_id").and_then(Value::as_str) {
        out.insert("user".into(), Value::String(user.to_string()));
    }
    // Structured output: `output_config.format` (and the older `output_format`).
    let format = body
        .pointer("/output_config/format")
        .or_else(|| req.get("output_format"))
        .filter(|f| str_of(f, "type") == "json_schema");
    if let Some(format) = format {
        out.insert(
            "response_format".into(),
            json!({ "type": "json_schema", "json_schema": {
                "name": "output", "schema": format.get("schema").cloned().unwrap_or_else(|| json!({})) } }),
        );
    }
    // The fields of DROPPED_FIELDS, and any other this module does not know, are left out.
    tools_to_chat(req, fidelity, &mut out)?;
    Ok(Value::Object(out))
}

/// `system` as a string or text blocks.
fn system_text(system: Option<&Value>) -> Result<Option<String>, AdapterError> {
    match system {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(blocks)) => {
            let texts: Vec<&str> = blocks
                .iter()
                .filter(|b| str_of(b, "type") == "text")
                .map(|b| str_of(b, "text"))
                .collect();
            Ok(Some(texts.join("\n\n")))
        }
        Some(_) => Err(AdapterError::new(
            "system",
            "system must be a string or text blocks.",
        )),
    }
}

/// One Messages turn -> the chat messages it becomes (tool results are messages of their own).
fn turn_to_chat(
    turn: &Value,
    index: usize,
    fidelity: Fidelity,
    out: &mut Vec<Value>,
) -> Result<(), AdapterError> {
    let role = str_of(turn, "role");
    if role != "user" && role != "assistant" {
        return Err(AdapterError::new(
            "messages",
            format!("messages[{index}].role must be user, assistant or system."),
        ));
    }
    let blocks = match turn.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({ "role": role, "content": s }));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(AdapterError::new(
                "messages",
                format!("messages[{index}].content must be a string or content blocks."),
            ))
        }
    };
    let mut parts = Vec::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match str_of(block, "type") {
            "text" => parts.push(json!({ "type": "text", "text": str_of(block, "text") })),
            "image" => parts.push(image_part(block, index)?),
            // A plain-text document is text; a PDF or a file id has no chat form.
            "document" if str_of(block.get("source").unwrap_or(&Value::Null), "type") == "text" => {
                let data = block.pointer("/source/data").and_then(Value::as_str);
                parts.push(json!({ "type": "text", "text": data.unwrap_or("") }));
            }
            "tool_use" => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_calls.push(json!({
                    "id": str_of(block, "id"),
                    "type": "function",
                    "function": { "name": str_of(block, "name"), "arguments": input.to_string() },
                }));
            }
            "tool_result" => {
                // A tool's answer is a chat message of its own, after the turn's other parts
                // would break the order the model saw: flush what came before it.
                flush_user(&mut parts, out);
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": str_of(block, "tool_use_id"),
                    "content": tool_result_text(block),
                }));
            }
            // Thinking is the model's own; a chat provider takes none back.
            "thinking" | "redacted_thinking" => {}
            other if fidelity == Fidelity::Strict => {
                return Err(AdapterError::new(
                    "messages",
                    format!(
                        "messages[{index}] has a '{other}' block, which this model's provider \
                         (OpenAI-compatible) cannot take."
                    ),
                ))
            }
            _ => {}
        }
    }
    if role == "assistant" {
        out.push(assistant_message(&parts, tool_calls));
    } else {
        flush_user(&mut parts, out);
    }
    Ok(())
}

/// An assistant turn as a chat message: its text parts joined, its tool calls (`content` null
/// when there are calls and no text, as chat completions has it).
pub(crate) fn assistant_message(parts: &[Value], tool_calls: Vec<Value>) -> Value {
    let text: String = parts.iter().map(|p| str_of(p, "text")).collect();
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert(
        "content".into(),
        if text.is_empty() && !tool_calls.is_empty() {
            Value::Null
        } else {
            Value::String(text)
        },
    );
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    Value::Object(message)
}

fn flush_user(parts: &mut Vec<Value>, out: &mut Vec<Value>) {
    if parts.is_empty() {
        return;
    }
    let parts = std::mem::take(parts);
    let all_text = parts.iter().all(|p| str_of(p, "type") == "text");
    let content = if all_text && parts.len() == 1 {
        Value::String(str_of(&parts[0], "text").to_string())
    } else {
        Value::Array(parts)
    };
    out.push(json!({ "role": "user", "content": content }));
}

fn image_part(block: &Value, index: usize) -> Result<Value, AdapterError> {
    let source = block.get("source").unwrap_or(&Value::Null);
    let url = match str_of(source, "type") {
        "base64" => format!(
            "data:{};base64,{}",
            str_of(source, "media_type"),
            str_of(source, "data")
        ),
        "url" => str_of(source, "url").to_string(),
        _ => {
            return Err(AdapterError::new(
                "messages",
                format!("messages[{index}] has an image whose source is neither base64 nor url."),
            ))
        }
    };
    Ok(json!({ "type": "image_url", "image_url": { "url": url } }))
}

/// A tool result's content as text (a string, or its text blocks joined).
fn tool_result_text(block: &Value) -> String {
    let text = match block.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| str_of(p, "type") == "text")
            .map(|p| str_of(p, "text"))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        format!("Error: {text}")
    } else {
        text
    }
}

fn tools_to_chat(
    req: &Map<String, Value>,
    fidelity: Fidelity,
    out: &mut Map<String, Value>,
) -> Result<(), AdapterError> {
    if let Some(tools) = req.get("tools").and_then(Value::as_array) {
        let mut chat_tools = Vec::new();
        for tool in tools {
            let kind = str_of(tool, "type");
            if !kind.is_empty() && kind != "custom" {
                // Server tools (web search, code execution…) run at Anthropic only.
                if fidelity == Fidelity::Strict {
                    return Err(AdapterError::new(
                        "tools",
                        format!(
                            "The tool type '{kind}' runs only at Anthropic; this model's \
                             provider takes function tools only."
                        ),
                    ));
                }
                continue;
            }
            let mut function = Map::new();
            function.insert("name".into(), json!(str_of(tool, "name")));
            if let Some(d) = tool.get("description").filter(|d| d.is_string()) {
                function.insert("description".into(), d.clone());
            }
            if let Some(strict) = tool.get("strict").filter(|s| s.is_boolean()) {
                function.insert("strict".into(), strict.clone());
            }
            // `cache_control` and `defer_loading` have no chat form: left out.
            function.insert(
                "parameters".into(),
                tool.get("input_schema")
                    .cloned()
                    .unwrap_or_else(|| json!({ "type": "object" })),
            );
            chat_tools.push(json!({ "type": "function", "function": function }));
        }
        if !chat_tools.is_empty() {
            out.insert("tools".into(), Value::Array(chat_tools));
        }
    }
    if let Some(choice) = req.get("tool_choice").filter(|c| c.is_object()) {
        let chat_choice = match str_of(choice, "type") {
            "any" => json!("required"),
            "none" => json!("none"),
            "tool" => json!({ "type": "function", "function": { "name": str_of(choice, "name") } }),
            _ => json!("auto"),
        };
        out.insert("tool_choice".into(), chat_choice);
        if choice
            .get("disable_parallel_tool_use")
            .and_then(Value::as_bool)
            == Some(true)
        {
            out.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
    }
    Ok(())
}

/// The gateway's own answer to `POST /v1/messages/count_tokens` for a model with no
/// anthropic lane: `{"input_tokens": N}`, N estimated over the system prompt, the turns and
/// the tools (the estimate routing uses, [`crate::protocols::context::estimate_tokens`]).
pub fn count_tokens(body: &Value) -> Value {
    let n: u64 = ["system", "messages", "tools"]
        .iter()
        .filter_map(|f| body.get(*f).filter(|v| !v.is_null()))
        .map(|v| match v {
            Value::String(s) => crate::protocols::context::estimate_tokens(s),
            other => crate::protocols::context::estimate_tokens(&other.to_string()),
        })
        .sum();
    json!({ "input_tokens": n })
}

// ---------------------------------------------------------------------------------------------
// Unary response
// ---------------------------------------------------------------------------------------------

/// OpenAI `finish_reason` -> Messages `stop_reason`.
pub fn stop_reason(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// Usage as Messages reports it: the prompt split into uncached and cache-read tokens.
fn usage(chat_usage: Option<&Value>) -> Value {
    let get = |p: &str| {
        chat_usage
            .and_then(|u| u.pointer(p))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let prompt = get("/prompt_tokens");
    let cached = get("/prompt_tokens_details/cached_tokens").min(prompt);
    json!({
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": get("/completion_tokens"),
    })
}

fn message_id(chat_id: &str) -> String {
    let bare = chat_id.strip_prefix("chatcmpl-").unwrap_or(chat_id);
    format!("msg_{bare}")
}

/// A `chat.completion` -> a Messages `message`.
pub fn from_chat_response(chat: &Value) -> Value {
    let choice = chat.pointer("/choices/0").unwrap_or(&Value::Null);
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut content = Vec::new();
    if let Some(text) = message
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        content.push(json!({ "type": "text", "text": text }));
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let arguments = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or("");
        content.push(json!({
            "type": "tool_use",
            "id": str_of(call, "id"),
            "name": call.pointer("/function/name").and_then(Value::as_str).unwrap_or(""),
            "input": tool_input(arguments),
        }));
    }
    json!({
        "id": message_id(str_of(chat, "id")),
        "type": "message",
        "role": "assistant",
        "model": str_of(chat, "model"),
        "content": content,
        "stop_reason": stop_reason(str_of(choice, "finish_reason")),
        "stop_sequence": null,
        "usage": usage(chat.get("usage")),
    })
}

/// Tool arguments as the JSON object Messages carries (arguments that are no object: empty).
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

// ---------------------------------------------------------------------------------------------
// Stream
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// The Anthropic error `type` for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// `{"type":"error","error":{"type","message","code"}}`: the Anthropic shape, with the
/// gateway's code (`contract::error_code`) alongside, which Anthropic clients ignore.
pub fn error_body(status: u16, code: &str, message: &str) -> Value {
    json!({
        "type": "error",
        "error": { "type": error_type(status), "message": message, "code": code },
    })
}

/// The `error` event that ends a Messages stream which broke after its first token.
pub fn stream_error(message: &str) -> Value {
    error_body(
        502,
        ai_router_contract::error_code::ErrorCode::StreamInterrupted.as_str(),
        message,
    )
}

/// A gateway error body (OpenAI shape) re-dressed in the Anthropic shape.
pub fn error_from_openai(status: u16, openai: &[u8]) -> Vec<u8> {
    let parts = OpenAiError::read(status, openai);
    error_body(status, &parts.code, &parts.message)
        .to_string()
        .into_bytes()
}

/// What another shape keeps of a gateway error body (OpenAI's shape).
pub(crate) struct OpenAiError {
    pub message: String,
    pub code: String,
    /// `error.trail`, when the body has one.
    pub trail: Option<Value>,
}

impl OpenAiError {
    pub fn read(status: u16, openai: &[u8]) -> Self {
        let parsed: Value = serde_json::from_slice(openai).unwrap_or(Value::Null);
        let text = |p: &str| {
            parsed
                .pointer(p)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        Self {
            message: text("/error/message")
                .unwrap_or_else(|| format!("The gateway answered with status {status}.")),
            code: text("/error/code").unwrap_or_else(|| "gateway_error".to_string()),
            trail: parsed.pointer("/error/trail").cloned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sse::Parser;

    fn strict(body: Value) -> Value {
        to_chat_request(&body, Fidelity::Strict).unwrap()
    }

    #[test]
    fn a_minimal_request_becomes_a_chat_request() {
        let out = strict(
            json!({ "model": "claude", "max_tokens": 64, "system": "Be brief.",
            "messages": [{ "role": "user", "content": "Hi" }], "stop_sequences": ["END"],
            "temperature": 0.2, "stream": true, "metadata": { "user_id": "u1" } }),
        );
        assert_eq!(
            out,
            json!({ "model": "claude", "max_tokens": 64, "messages": [
                { "role": "system", "content": "Be brief." },
                { "role": "user", "content": "Hi" },
            ], "stop": ["END"], "temperature": 0.2, "stream": true, "user": "u1" })
        );
    }

    #[test]
    fn max_tokens_and_messages_are_required() {
        let e = to_chat_request(&json!({ "messages": [] }), Fidelity::Lenient).unwrap_err();
        assert_eq!(e.param, Some("max_tokens"));
        let e = to_chat_request(&json!({ "max_tokens": 5 }), Fidelity::Lenient).unwrap_err();
        assert_eq!(e.param, Some("messages"));
        let e = to_chat_request(
            &json!({ "max_tokens": 5, "messages": [{ "role": "tool", "content": "x" }] }),
            Fidelity::Lenient,
        )
        .unwrap_err();
        assert!(e.message.contains("user, assistant or system"));
    }

    #[test]
    fn system_blocks_images_tool_uses_and_results() {
        let out = strict(json!({ "max_tokens": 9,
        "system": [{ "type": "text", "text": "A" }, { "type": "text", "text": "B" }],
        "messages": [
            { "role": "user", "content": [
                { "type": "text", "text": "What is this?" },
                { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBO" } },
                { "type": "image", "source": { "type": "url", "url": "https://x.test/c.jpg" } },
            ]},
            { "role": "assistant", "content": [
                { "type": "thinking", "thinking": "hmm", "signature": "s" },
                { "type": "text", "text": "Let me look." },
                { "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": { "city": "Paris" } },
            ]},
            { "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "toolu_1", "content": [{ "type": "text", "text": "sunny" }] },
                { "type": "text", "text": "And tomorrow?" },
            ]},
        ]}));
        let messages = out["messages"].as_array().unwrap();
        assert_eq!(
            messages[0],
            json!({ "role": "system", "content": "A\n\nB" })
        );
        assert_eq!(
            messages[1]["content"],
            json!([
                { "type": "text", "text": "What is this?" },
                { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBO" } },
                { "type": "image_url", "image_url": { "url": "https://x.test/c.jpg" } },
            ])
        );
        assert_eq!(
            messages[2],
            json!({ "role": "assistant", "content": "Let me look.", "tool_calls": [{
                "id": "toolu_1", "type": "function",
                "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } }] })
        );
        assert_eq!(
            messages[3],
            json!({ "role": "tool", "tool_call_id": "toolu_1", "content": "sunny" })
        );
        assert_eq!(
            messages[4],
            json!({ "role": "user", "content": "And tomorrow?" })
        );
    }

    #[test]
    fn tools_and_tool_choice() {
        let out = strict(json!({ "max_tokens": 9, "messages": [],
            "tools": [{ "name": "f", "description": "d", "input_schema": { "type": "object", "properties": {} } }],
            "tool_choice": { "type": "any", "disable_parallel_tool_use": true } }));
        assert_eq!(
            out["tools"],
            json!([{ "type": "function", "function": { "name": "f", "description": "d",
                "parameters": { "type": "object", "properties": {} } } }])
        );
        assert_eq!(out["tool_choice"], "required");
        assert_eq!(out["parallel_tool_calls"], false);
        let out = strict(json!({ "max_tokens": 9, "messages": [],
            "tool_choice": { "type": "tool", "name": "f" } }));
        assert_eq!(out["tool_choice"]["function"]["name"], "f");
    }

    #[test]
    fn what_only_anthropic_runs_is_refused_strictly_and_left_out_leniently() {
        let body = json!({ "max_tokens": 9, "messages": [{ "role": "user", "content": [
                { "type": "document", "source": { "type": "base64", "media_type": "application/pdf", "data": "JVBERi0=" } } ] }],
            "tools": [{ "type": "web_search_20250305", "name": "web_search" }] });
        let e = to_chat_request(&body, Fidelity::Strict).unwrap_err();
        assert!(e.message.contains("'document'"), "{e}");
        let out = to_chat_request(&body, Fidelity::Lenient).unwrap();
        assert!(out.get("tools").is_none());
        assert_eq!(out["messages"], json!([]));
    }

    #[test]
    fn system_turns_fold_into_the_system_prompt_and_unmodelled_fields_follow_the_documented_rule() {
        let out = strict(json!({ "model": "c", "max_tokens": 9, "system": "A",
            "messages": [
                { "role": "user", "content": "hi" },
                { "role": "system", "content": [{ "type": "text", "text": "B" }] },
                { "role": "user", "content": [{ "type": "document",
                    "source": { "type": "text", "media_type": "text/plain", "data": "doc" } }] },
            ],
            "thinking": { "type": "adaptive" }, "context_management": { "edits": [] },
            "output_config": { "effort": "high", "format": { "type": "json_schema", "schema": { "type": "object" } } },
            "top_k": 5, "some_field_of_next_year": 1, "temperature": null,
            "tools": [{ "name": "Later", "defer_loading": true, "strict": true,
                        "cache_control": { "type": "ephemeral" }, "input_schema": { "type": "object" } }] }));
        assert_eq!(
            out,
            json!({ "model": "c", "max_tokens": 9, "messages": [
                { "role": "system", "content": "A\n\nB" },
                { "role": "user", "content": "hi" },
                { "role": "user", "content": "doc" },
            ],
            "response_format": { "type": "json_schema", "json_schema": { "name": "output", "schema": { "type": "object" } } },
            "tools": [{ "type": "function", "function": { "name": "Later", "strict": true, "parameters": { "type": "object" } } }] })
        );
        for field in DROPPED_FIELDS {
            let mut body = json!({ "max_tokens": 9, "messages": [] });
            body[field] = json!({ "x": 1 });
            assert!(to_chat_request(&body, Fidelity::Strict).is_ok(), "{field}");
        }
        for field in REFUSED_FIELDS {
            let mut body = json!({ "max_tokens": 9, "messages": [] });
            body[field] = json!([{}]);
            let e = to_chat_request(&body, Fidelity::Strict).unwrap_err();
            assert_eq!(e.param, Some(field));
            assert!(to_chat_request(&body, Fidelity::Lenient).is_ok(), "{field}");
        }
    }

    #[test]
    fn count_tokens_estimates_system_turns_and_tools() {
        let bare = count_tokens(&json!({ "messages": [{ "role": "user", "content": "hello" }] }));
        let more = count_tokens(&json!({ "system": "Be brief and exact.",
            "messages": [{ "role": "user", "content": "hello" }],
            "tools": [{ "name": "Bash", "input_schema": { "type": "object" } }] }));
        assert!(bare["input_tokens"].as_u64().unwrap() > 0);
        assert!(more["input_tokens"].as_u64() > bare["input_tokens"].as_u64());
    }

    #[test]
    fn a_chat_completion_becomes_a_message_with_cache_tokens() {
        let chat = json!({ "id": "chatcmpl-abc", "model": "gpt", "choices": [{ "index": 0,
            "message": { "role": "assistant", "content": "Hi", "tool_calls": [{ "id": "call_1",
                "type": "function", "function": { "name": "f", "arguments": "{\"a\":1}" } }] },
            "finish_reason": "tool_calls" }],
            "usage": { "prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": { "cached_tokens": 4 } } });
        assert_eq!(
            from_chat_response(&chat),
            json!({ "id": "msg_abc", "type": "message", "role": "assistant", "model": "gpt",
                "content": [{ "type": "text", "text": "Hi" },
                            { "type": "tool_use", "id": "call_1", "name": "f", "input": { "a": 1 } }],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": { "input_tokens": 6, "cache_creation_input_tokens": 0,
                           "cache_read_input_tokens": 4, "output_tokens": 3 } })
        );
        assert_eq!(stop_reason("length"), "max_tokens");
        assert_eq!(stop_reason("stop"), "end_turn");
    }

    const CHAT_STREAM: &str = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":5}}\n\n",
        "data: [DONE]\n\n",
    );

    /// The (event name, data) pairs of Messages SSE bytes.
    fn events(bytes: &[u8]) -> Vec<(String, Value)> {
        Parser::new()
            .feed(bytes)
            .into_iter()
            .map(|e| {
                (
                    e.name.unwrap_or_default(),
                    serde_json::from_str(&e.data).unwrap(),
                )
            })
            .collect()
    }

    fn encode(chat: &[u8]) -> Vec<u8> {
        crate::wire::sse::translated_at_every_cut(chat, || {
            let mut encoder = StreamEncoder::new();
            move |event: &crate::wire::sse::Event| encoder.feed(event)
        })
    }

    #[test]
    fn a_chat_stream_becomes_messages_events_at_any_chunk_boundary() {
        let whole = encode(CHAT_STREAM.as_bytes());
        let got = events(&whole);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
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
        assert_eq!(got[0].1["message"]["id"], "msg_1");
        assert_eq!(got[3].1["delta"]["text"], "Hel");
        assert_eq!(got[6].1["content_block"]["name"], "f");
        assert_eq!(got[6].1["index"], 1);
        assert_eq!(got[7].1["delta"]["type"], "input_json_delta");
        assert_eq!(got[10].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(got[10].1["usage"]["output_tokens"], 5);
        assert_eq!(got[10].1["usage"]["input_tokens"], 7);
    }

    #[test]
    fn an_error_event_becomes_the_anthropic_error_event_and_ends_the_stream() {
        let chat = format!(
            "{}data: {{\"error\":{{\"message\":\"cut\",\"type\":\"api_error\",\"code\":\"stream_interrupted\"}}}}\n\ndata: [DONE]\n\n",
            &CHAT_STREAM[..CHAT_STREAM.find("data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo").unwrap()]
        );
        let got = events(&encode(chat.as_bytes()));
        let last = got.last().unwrap();
        assert_eq!(last.0, "error");
        assert_eq!(last.1["type"], "error");
        assert_eq!(last.1["error"]["message"], "cut");
        assert_eq!(last.1["error"]["code"], "stream_interrupted");
        assert!(!got.iter().any(|(n, _)| n == "message_stop"));
    }

    #[test]
    fn errors_in_the_anthropic_shape() {
        let openai = br#"{"error":{"message":"no such key","type":"authentication_error","code":"invalid_api_key"}}"#;
        let v: Value = serde_json::from_slice(&error_from_openai(401, openai)).unwrap();
        assert_eq!(
            v,
            json!({ "type": "error", "error": { "type": "authentication_error",
                "message": "no such key", "code": "invalid_api_key" } })
        );
        for (status, kind) in [
            (400, "invalid_request_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (504, "timeout_error"),
        ] {
            assert_eq!(error_type(status), kind);
        }
        let v: Value = serde_json::from_slice(&error_from_openai(502, b"not json")).unwrap();
        assert_eq!(v["error"]["code"], "gateway_error");
    }
}
