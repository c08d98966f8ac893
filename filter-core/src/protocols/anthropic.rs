//! The Anthropic Messages API adapter: callers speak OpenAI chat-completions, a provider of kind
//! `anthropic` speaks Messages. Three pure translations, no host calls:
//!
//! - [`to_messages_request`]: an OpenAI request body to a Messages request body;
//! - [`from_messages_response`]: a Messages reply to an OpenAI `chat.completion`;
//! - [`StreamTranslator`]: Messages SSE events to OpenAI `chat.completion.chunk` SSE bytes, one
//!   event at a time, ending with a usage chunk and `data: [DONE]` so that the stream gate
//!   downstream sees exactly what an OpenAI provider would have sent.

use std::collections::HashMap;
use std::fmt;

use serde_json::{json, Map, Value};

use crate::classify::{classify_stream_error, Class, Failure};
use crate::wire::sse::Event;

/// The `anthropic-version` header value the adapter's shapes follow.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The user turn put first when a conversation does not start with one: the Messages API
/// requires the first turn to be the user's.
const OPENING_USER_TURN: &str = "Continue.";

/// A request the adapter cannot express in the Messages API (answered 400 by the gateway).
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterError {
    pub message: String,
    /// The request field at fault, as OpenAI's `error.param`.
    pub param: Option<&'static str>,
}

impl AdapterError {
    pub(crate) fn new(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            param: Some(param),
        }
    }
}

impl AdapterError {
    /// A body that is not a JSON object.
    pub(crate) fn not_an_object() -> Self {
        Self {
            message: "The request body must be a JSON object.".into(),
            param: None,
        }
    }
}

impl fmt::Display for AdapterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.param {
            Some(p) => write!(f, "{} (param: {p})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for AdapterError {}

// ---------------------------------------------------------------------------------------------
// Request
// ---------------------------------------------------------------------------------------------

/// OpenAI chat-completions request -> Messages API request for `model`.
pub fn to_messages_request(
    body: &Value,
    model: &str,
    default_max_tokens: u32,
) -> Result<Value, AdapterError> {
    let Some(req) = body.as_object() else {
        return Err(AdapterError {
            message: "The request body must be a JSON object.".into(),
            param: None,
        });
    };
    refuse_unsupported(req)?;

    let mut out = Map::new();
    out.insert("model".into(), Value::String(model.to_string()));
    out.insert(
        "max_tokens".into(),
        json!(max_tokens(req, default_max_tokens)?),
    );

    let (mut system, messages) = conversation(req.get("messages"))?;
    if let Some(instruction) = json_instruction(req.get("response_format"))? {
        system.push(instruction);
    }
    if !system.is_empty() {
        out.insert("system".into(), Value::String(system.join("\n\n")));
    }
    out.insert("messages".into(), Value::Array(messages));

    if let Some(stops) = stop_sequences(req.get("stop"))? {
        out.insert("stop_sequences".into(), stops);
    }
    if let Some(t) = number(req, "temperature")? {
        // OpenAI's range is 0..2, Anthropic's 0..1.
        out.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    if let Some(p) = number(req, "top_p")? {
        out.insert("top_p".into(), json!(p));
    }
    if req.get("stream").and_then(Value::as_bool) == Some(true) {
        out.insert("stream".into(), Value::Bool(true));
    }
    match req.get("user") {
        None | Some(Value::Null) => {}
        Some(Value::String(u)) if !u.is_empty() => {
            out.insert("metadata".into(), json!({ "user_id": u }));
        }
        Some(Value::String(_)) => {}
        Some(_) => return Err(AdapterError::new("user", "'user' must be a string.")),
    }
    tools(req, &mut out)?;
    Ok(Value::Object(out))
}

/// Fields with no Messages API equivalent that change what the caller gets back.
fn refuse_unsupported(req: &Map<String, Value>) -> Result<(), AdapterError> {
    match req.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => {
            return Err(AdapterError::new(
                "n",
                "This model's provider (Anthropic) returns one choice per request; 'n' must be 1.",
            ))
        }
    }
    if req.get("logprobs").and_then(Value::as_bool) == Some(true) {
        return Err(AdapterError::new(
            "logprobs",
            "This model's provider (Anthropic) does not return log probabilities.",
        ));
    }
    if req.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return Err(AdapterError::new(
            "top_logprobs",
            "This model's provider (Anthropic) does not return log probabilities.",
        ));
    }
    Ok(())
}

fn max_tokens(req: &Map<String, Value>, default_max_tokens: u32) -> Result<u64, AdapterError> {
    for field in ["max_completion_tokens", "max_tokens"] {
        match req.get(field) {
            None | Some(Value::Null) => {}
            Some(v) => {
                return match v.as_u64() {
                    Some(n) if n > 0 => Ok(n),
                    _ => Err(AdapterError::new(
                        field,
                        format!("'{field}' must be a positive integer."),
                    )),
                }
            }
        }
    }
    Ok(u64::from(default_max_tokens))
}

fn number(req: &Map<String, Value>, field: &'static str) -> Result<Option<f64>, AdapterError> {
    match req.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| AdapterError::new(field, format!("'{field}' must be a number."))),
    }
}

fn stop_sequences(stop: Option<&Value>) -> Result<Option<Value>, AdapterError> {
    let list: Vec<&str> = match stop {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().ok_or_else(|| {
                    AdapterError::new("stop", "'stop' must be a string or an array of strings.")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(AdapterError::new(
                "stop",
                "'stop' must be a string or an array of strings.",
            ))
        }
    };
    // Anthropic refuses whitespace-only stop sequences; they could never end a reply anyway.
    let kept: Vec<Value> = list
        .into_iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| Value::String(s.to_string()))
        .collect();
    Ok((!kept.is_empty()).then_some(Value::Array(kept)))
}

/// The instruction that stands in for OpenAI's JSON modes, appended to `system`.
fn json_instruction(format: Option<&Value>) -> Result<Option<String>, AdapterError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(
            "Respond with a single JSON object and nothing else: no prose and no code fences \
             before or after it."
                .to_string(),
        )),
        Some("json_schema") => {
            let spec = format.get("json_schema");
            match spec.and_then(|s| s.get("schema")).filter(|s| !s.is_null()) {
                Some(schema) => Ok(Some(format!(
                    "Respond with a single JSON object and nothing else: no prose and no code \
                     fences before or after it. The object must conform to this JSON Schema:\n{schema}"
                ))),
                None => Ok(Some(
                    "Respond with a single JSON object and nothing else: no prose and no code \
                     fences before or after it."
                        .to_string(),
                )),
            }
        }
        _ => Err(AdapterError::new(
            "response_format",
            "'response_format.type' must be text, json_object or json_schema.",
        )),
    }
}

/// One turn being built: merged with the next when the role repeats.
struct Turn {
    role: &'static str,
    blocks: Vec<Value>,
}

/// Splits the OpenAI messages into the system text and the Messages API turns: consecutive
/// same-role messages merged, `tool` messages folded into user turns, a user turn first.
fn conversation(messages: Option<&Value>) -> Result<(Vec<String>, Vec<Value>), AdapterError> {
    let Some(messages) = messages.and_then(Value::as_array) else {
        return Err(AdapterError::new(
            "messages",
            "'messages' must be an array.",
        ));
    };
    let mut system: Vec<String> = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        let content = message.get("content");
        let (role, blocks) = match role {
            "system" | "developer" => {
                let text = plain_text(content, i)?;
                if !text.is_empty() {
                    system.push(text);
                }
                continue;
            }
            "user" => ("user", user_blocks(content, i)?),
            "assistant" => ("assistant", assistant_blocks(message, i)?),
            "tool" => ("user", vec![tool_result(message, i)?]),
            other => {
                return Err(AdapterError::new(
                    "messages",
                    format!("messages[{i}]: role '{other}' is not supported."),
                ))
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some(last) if last.role == role => last.blocks.extend(blocks),
            _ => turns.push(Turn { role, blocks }),
        }
    }
    if turns.first().is_none_or(|t| t.role != "user") {
        turns.insert(
            0,
            Turn {
                role: "user",
                blocks: vec![text_block(OPENING_USER_TURN)],
            },
        );
    }
    // A final assistant turn is a prefill, which Anthropic refuses when it ends in whitespace.
    if let Some(last) = turns.last_mut().filter(|t| t.role == "assistant") {
        trim_trailing_text(&mut last.blocks);
    }
    let turns = turns
        .into_iter()
        .map(|mut t| {
            if t.role == "user" {
                // Tool results must come first in their user turn.
                t.blocks
                    .sort_by_key(|b| b.get("type").and_then(Value::as_str) != Some("tool_result"));
            }
            json!({ "role": t.role, "content": t.blocks })
        })
        .collect();
    Ok((system, turns))
}

fn trim_trailing_text(blocks: &mut Vec<Value>) {
    if let Some(Value::Object(last)) = blocks.last_mut() {
        if last.get("type").and_then(Value::as_str) == Some("text") {
            if let Some(Value::String(text)) = last.get_mut("text") {
                let trimmed = text.trim_end().len();
                text.truncate(trimmed);
                if text.is_empty() {
                    blocks.pop();
                }
            }
        }
    }
}

fn text_block(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

fn content_error(i: usize, what: &str) -> AdapterError {
    AdapterError::new("messages", format!("messages[{i}]: {what}"))
}

/// The text of a content that may only hold text (system, developer, tool).
fn plain_text(content: Option<&Value>, i: usize) -> Result<String, AdapterError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(part_text(part, i)?),
                    _ => return Err(content_error(i, "only text parts are supported here.")),
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(content_error(i, "'content' must be a string or an array.")),
    }
}

fn part_text(part: &Value, i: usize) -> Result<String, AdapterError> {
    part.get("text")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| content_error(i, "a text part needs a 'text' string."))
}

/// A text block, keeping a caller's prompt-caching mark; `None` for empty text (refused by
/// Anthropic).
fn text_part_block(part: &Value, i: usize) -> Result<Option<Value>, AdapterError> {
    let text = part_text(part, i)?;
    if text.is_empty() {
        return Ok(None);
    }
    let mut block = text_block(&text);
    if let (Some(cache), Value::Object(b)) = (part.get("cache_control"), &mut block) {
        b.insert("cache_control".into(), cache.clone());
    }
    Ok(Some(block))
}

fn user_blocks(content: Option<&Value>, i: usize) -> Result<Vec<Value>, AdapterError> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![text_block(s)]),
        Some(Value::Array(parts)) => {
            let mut blocks = Vec::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => blocks.extend(text_part_block(part, i)?),
                    Some("image_url") => blocks.push(image_block(part, i)?),
                    Some(other) => {
                        return Err(content_error(
                            i,
                            &format!("content parts of type '{other}' are not supported."),
                        ))
                    }
                    None => return Err(content_error(i, "a content part needs a 'type'.")),
                }
            }
            Ok(blocks)
        }
        Some(_) => Err(content_error(i, "'content' must be a string or an array.")),
    }
}

/// `image_url` -> an image block: a `data:` URL becomes base64 data, an http(s) URL a URL source.
fn image_block(part: &Value, i: usize) -> Result<Value, AdapterError> {
    let url = match part.get("image_url") {
        Some(Value::String(u)) => u.as_str(),
        Some(obj) => obj.get("url").and_then(Value::as_str).unwrap_or(""),
        None => "",
    };
    if let Some(rest) = url.strip_prefix("data:") {
        let Some((header, data)) = rest.split_once(',') else {
            return Err(content_error(i, "malformed data: URL in an image part."));
        };
        let Some(media_type) = header.strip_suffix(";base64") else {
            return Err(content_error(
                i,
                "an image data: URL must be base64-encoded.",
            ));
        };
        if media_type.is_empty() {
            return Err(content_error(i, "an image data: URL needs a media type."));
        }
        return Ok(json!({
            "type": "image",
            "source": { "type": "base64", "media_type": media_type, "data": data }
        }));
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("https://") || lower.starts_with("http://") {
        return Ok(json!({ "type": "image", "source": { "type": "url", "url": url } }));
    }
    Err(content_error(
        i,
        "an image part needs an http(s) or base64 data: URL.",
    ))
}

fn assistant_blocks(message: &Value, i: usize) -> Result<Vec<Value>, AdapterError> {
    let mut blocks = Vec::new();
    match message.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            if !s.is_empty() {
                blocks.push(text_block(s));
            }
        }
        Some(Value::Array(parts)) => {
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => blocks.extend(text_part_block(part, i)?),
                    Some("refusal") => {
                        if let Some(r) = part.get("refusal").and_then(Value::as_str) {
                            if !r.is_empty() {
                                blocks.push(text_block(r));
                            }
                        }
                    }
                    _ => {
                        return Err(content_error(
                            i,
                            "assistant content parts must be text or refusal.",
                        ))
                    }
                }
            }
        }
        Some(_) => return Err(content_error(i, "'content' must be a string or an array.")),
    }
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => return Ok(blocks),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(content_error(i, "'tool_calls' must be an array.")),
    };
    for call in calls {
        let id = call.get("id").and_then(Value::as_str).unwrap_or("");
        let function = call.get("function");
        let name = function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if id.is_empty() || name.is_empty() {
            return Err(content_error(
                i,
                "each tool call needs an 'id' and a 'function.name'.",
            ));
        }
        let arguments = function
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let input = if arguments.trim().is_empty() {
            json!({})
        } else {
            match serde_json::from_str::<Value>(arguments) {
                Ok(v @ Value::Object(_)) => v,
                Ok(_) => {
                    return Err(content_error(
                        i,
                        &format!("the arguments of tool call '{id}' must be a JSON object."),
                    ))
                }
                Err(e) => {
                    return Err(content_error(
                        i,
                        &format!("the arguments of tool call '{id}' are not valid JSON: {e}."),
                    ))
                }
            }
        };
        blocks.push(json!({ "type": "tool_use", "id": id, "name": name, "input": input }));
    }
    Ok(blocks)
}

fn tool_result(message: &Value, i: usize) -> Result<Value, AdapterError> {
    let Some(id) = message
        .get("tool_call_id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    else {
        return Err(content_error(i, "a tool message needs a 'tool_call_id'."));
    };
    let content = match message.get("content") {
        None | Some(Value::Null) => Value::String(String::new()),
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(parts)) => {
            let mut blocks = Vec::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => blocks.extend(text_part_block(part, i)?),
                    Some("image_url") => blocks.push(image_block(part, i)?),
                    _ => {
                        return Err(content_error(
                            i,
                            "tool content parts must be text or image_url.",
                        ))
                    }
                }
            }
            Value::Array(blocks)
        }
        Some(_) => return Err(content_error(i, "'content' must be a string or an array.")),
    };
    Ok(json!({ "type": "tool_result", "tool_use_id": id, "content": content }))
}

/// `tools`, `tool_choice` and `parallel_tool_calls`.
fn tools(req: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), AdapterError> {
    let list = match req.get("tools") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(AdapterError::new("tools", "'tools' must be an array.")),
    };
    if list.is_empty() {
        return Ok(());
    }
    let mut defs = Vec::with_capacity(list.len());
    for tool in list {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(AdapterError::new(
                "tools",
                "Only tools of type 'function' are supported.",
            ));
        }
        let function = tool.get("function");
        let Some(name) = function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            return Err(AdapterError::new(
                "tools",
                "Each tool needs a 'function.name'.",
            ));
        };
        let mut def = Map::new();
        def.insert("name".into(), Value::String(name.to_string()));
        if let Some(d) = function
            .and_then(|f| f.get("description"))
            .and_then(Value::as_str)
        {
            def.insert("description".into(), Value::String(d.to_string()));
        }
        let schema = function
            .and_then(|f| f.get("parameters"))
            .filter(|p| p.is_object())
            .cloned()
            .unwrap_or_else(|| json!({ "type": "object", "properties": {} }));
        def.insert("input_schema".into(), schema);
        defs.push(Value::Object(def));
    }
    out.insert("tools".into(), Value::Array(defs));

    let mut choice = match req.get("tool_choice") {
        None | Some(Value::Null) => json!({ "type": "auto" }),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => json!({ "type": "auto" }),
            // Tools stay defined: a history with tool_use blocks needs them.
            "none" => json!({ "type": "none" }),
            "required" => json!({ "type": "any" }),
            _ => {
                return Err(AdapterError::new(
                    "tool_choice",
                    "'tool_choice' must be auto, none, required or a function.",
                ))
            }
        },
        Some(obj) => match obj
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
        {
            Some(name) if obj.get("type").and_then(Value::as_str) == Some("function") => {
                json!({ "type": "tool", "name": name })
            }
            _ => {
                return Err(AdapterError::new(
                    "tool_choice",
                    "'tool_choice' must be auto, none, required or a function.",
                ))
            }
        },
    };
    let is_none = choice.get("type").and_then(Value::as_str) == Some("none");
    if req.get("parallel_tool_calls").and_then(Value::as_bool) == Some(false) && !is_none {
        if let Value::Object(c) = &mut choice {
            c.insert("disable_parallel_tool_use".into(), Value::Bool(true));
        }
    }
    out.insert("tool_choice".into(), choice);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Unary response
// ---------------------------------------------------------------------------------------------

/// Messages `stop_reason` -> OpenAI `finish_reason`.
pub fn finish_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        // end_turn, stop_sequence, pause_turn and anything newer.
        _ => "stop",
    }
}

/// Input token counts as Anthropic splits them: prompt tokens are all three together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct TokenCounts {
    input: u64,
    cache_read: u64,
    cache_creation: u64,
    output: u64,
}

impl TokenCounts {
    /// Takes every count the usage object carries, leaving the others as they were.
    fn update(&mut self, usage: Option<&Value>) {
        let Some(usage) = usage else { return };
        let get = |k: &str| usage.get(k).and_then(Value::as_u64);
        if let Some(n) = get("input_tokens") {
            self.input = n;
        }
        if let Some(n) = get("cache_read_input_tokens") {
            self.cache_read = n;
        }
        if let Some(n) = get("cache_creation_input_tokens") {
            self.cache_creation = n;
        }
        if let Some(n) = get("output_tokens") {
            self.output = n;
        }
    }

    fn openai(&self) -> Value {
        let prompt = self.input + self.cache_read + self.cache_creation;
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": self.output,
            "total_tokens": prompt + self.output,
            "prompt_tokens_details": { "cached_tokens": self.cache_read },
        })
    }
}

pub(crate) fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Messages API response -> OpenAI `chat.completion`.
pub fn from_messages_response(resp: &Value, created_s: i64) -> Value {
    let mut text = String::new();
    let mut has_text = false;
    let mut tool_calls = Vec::new();
    for block in resp
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        match str_field(block, "type") {
            "text" => {
                has_text = true;
                text.push_str(str_field(block, "text"));
            }
            "tool_use" => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_calls.push(json!({
                    "id": str_field(block, "id"),
                    "type": "function",
                    "function": { "name": str_field(block, "name"), "arguments": input.to_string() },
                }));
            }
            // thinking, redacted_thinking and server tool blocks have no OpenAI equivalent.
            _ => {}
        }
    }
    let content = if has_text || tool_calls.is_empty() {
        Value::String(text)
    } else {
        Value::Null
    };
    let mut message = Map::new();
    message.insert("role".into(), Value::String("assistant".into()));
    message.insert("content".into(), content);
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    let finish = resp
        .get("stop_reason")
        .and_then(Value::as_str)
        .map_or("stop", finish_reason);
    let mut counts = TokenCounts::default();
    counts.update(resp.get("usage"));
    json!({
        "id": format!("chatcmpl-{}", str_field(resp, "id")),
        "object": "chat.completion",
        "created": created_s,
        "model": str_field(resp, "model"),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish,
        }],
        "usage": counts.openai(),
    })
}

// ---------------------------------------------------------------------------------------------
// Stream
// ---------------------------------------------------------------------------------------------

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
}

impl StreamTranslator {
    pub fn new(created_s: i64) -> Self {
        Self {
            created_s,
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
                return Err(classify_stream_error("anthropic", &wrapped, now_ms));
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
            "error" => return Err(classify_stream_error("anthropic", &value, now_ms)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sse::Parser;

    fn req(body: Value) -> Value {
        to_messages_request(&body, "claude-sonnet-5-5", 4096).unwrap()
    }

    fn err(body: Value) -> AdapterError {
        to_messages_request(&body, "claude-sonnet-5-5", 4096).unwrap_err()
    }

    #[test]
    fn minimal_request_gets_model_default_max_tokens_and_blocks() {
        let out =
            req(json!({ "model": "smart", "messages": [{ "role": "user", "content": "Hi" }] }));
        assert_eq!(
            out,
            json!({
                "model": "claude-sonnet-5-5",
                "max_tokens": 4096,
                "messages": [{ "role": "user", "content": [{ "type": "text", "text": "Hi" }] }],
            })
        );
    }

    #[test]
    fn system_and_developer_messages_join_into_system() {
        let out = req(json!({ "messages": [
            { "role": "system", "content": "Be brief." },
            { "role": "developer", "content": [{ "type": "text", "text": "Answer in French." }] },
            { "role": "user", "content": "Hi" },
            { "role": "system", "content": "Never apologise." },
        ]}));
        assert_eq!(
            out["system"],
            "Be brief.\n\nAnswer in French.\n\nNever apologise."
        );
        assert_eq!(out["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn history_is_merged_into_alternating_turns_starting_with_user() {
        let out = req(json!({ "messages": [
            { "role": "assistant", "content": "Hello! How can I help?" },
            { "role": "user", "content": "One" },
            { "role": "user", "content": [{ "type": "text", "text": "Two" }] },
            { "role": "assistant", "content": "A" },
            { "role": "assistant", "content": [{ "type": "text", "text": "B" }] },
            { "role": "user", "content": "Three" },
        ]}));
        let turns = out["messages"].as_array().unwrap();
        let roles: Vec<&str> = turns.iter().map(|t| t["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
        assert_eq!(turns[0]["content"][0]["text"], OPENING_USER_TURN);
        assert_eq!(
            turns[2]["content"],
            json!([{ "type": "text", "text": "One" }, { "type": "text", "text": "Two" }])
        );
        assert_eq!(turns[3]["content"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn system_only_request_still_has_a_user_turn() {
        let out = req(json!({ "messages": [{ "role": "system", "content": "Say hi." }] }));
        assert_eq!(out["system"], "Say hi.");
        assert_eq!(out["messages"][0]["role"], "user");
    }

    #[test]
    fn final_assistant_prefill_loses_trailing_whitespace() {
        let out = req(json!({ "messages": [
            { "role": "user", "content": "Give JSON" },
            { "role": "assistant", "content": "{\n  " },
        ]}));
        assert_eq!(out["messages"][1]["content"][0]["text"], "{");
    }

    #[test]
    fn images_data_and_http_urls() {
        let out = req(json!({ "messages": [{ "role": "user", "content": [
            { "type": "text", "text": "What is in these?" },
            { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } },
            { "type": "image_url", "image_url": { "url": "https://example.com/cat.jpg", "detail": "high" } },
        ]}]}));
        assert_eq!(
            out["messages"][0]["content"],
            json!([
                { "type": "text", "text": "What is in these?" },
                { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=" } },
                { "type": "image", "source": { "type": "url", "url": "https://example.com/cat.jpg" } },
            ])
        );
        let e = err(json!({ "messages": [{ "role": "user", "content": [
            { "type": "image_url", "image_url": { "url": "ftp://example.com/cat.jpg" } },
        ]}]}));
        assert_eq!(e.param, Some("messages"));
        let e = err(json!({ "messages": [{ "role": "user", "content": [
            { "type": "image_url", "image_url": { "url": "data:image/png,rawbytes" } },
        ]}]}));
        assert!(e.message.contains("base64"), "{e}");
        let e = err(json!({ "messages": [{ "role": "user", "content": [
            { "type": "input_audio", "input_audio": { "data": "", "format": "wav" } },
        ]}]}));
        assert!(e.message.contains("input_audio"), "{e}");
    }

    #[test]
    fn tools_and_tool_choice() {
        let tools = json!([
            { "type": "function", "function": {
                "name": "get_weather", "description": "Weather for a city",
                "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] }
            }},
            { "type": "function", "function": { "name": "now" } },
        ]);
        let base = |choice: Value, parallel: Value| {
            req(json!({
                "messages": [{ "role": "user", "content": "Weather in Paris?" }],
                "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel,
            }))
        };
        let out = base(Value::Null, Value::Null);
        assert_eq!(
            out["tools"],
            json!([
                { "name": "get_weather", "description": "Weather for a city",
                  "input_schema": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } },
                { "name": "now", "input_schema": { "type": "object", "properties": {} } },
            ])
        );
        assert_eq!(out["tool_choice"], json!({ "type": "auto" }));
        assert_eq!(
            base(json!("auto"), Value::Null)["tool_choice"],
            json!({ "type": "auto" })
        );
        assert_eq!(
            base(json!("none"), Value::Null)["tool_choice"],
            json!({ "type": "none" })
        );
        assert_eq!(
            base(json!("required"), Value::Null)["tool_choice"],
            json!({ "type": "any" })
        );
        assert_eq!(
            base(
                json!({ "type": "function", "function": { "name": "now" } }),
                json!(false)
            )["tool_choice"],
            json!({ "type": "tool", "name": "now", "disable_parallel_tool_use": true })
        );
        assert_eq!(
            base(Value::Null, json!(false))["tool_choice"],
            json!({ "type": "auto", "disable_parallel_tool_use": true })
        );
        assert_eq!(
            base(json!("none"), json!(false))["tool_choice"],
            json!({ "type": "none" })
        );
        assert_eq!(
            base(Value::Null, json!(true))["tool_choice"],
            json!({ "type": "auto" })
        );
        let e = to_messages_request(
            &json!({ "messages": [], "tools": tools, "tool_choice": "sometimes" }),
            "m",
            1,
        )
        .unwrap_err();
        assert_eq!(e.param, Some("tool_choice"));
        let e = err(json!({ "messages": [], "tools": [{ "type": "retrieval" }] }));
        assert_eq!(e.param, Some("tools"));
        // No tools, no tool_choice.
        let out =
            req(json!({ "messages": [{ "role": "user", "content": "x" }], "tool_choice": "auto" }));
        assert!(out.get("tools").is_none() && out.get("tool_choice").is_none());
    }

    #[test]
    fn tool_calls_and_results_round_trip_the_history() {
        let out = req(json!({ "messages": [
            { "role": "user", "content": "Weather in Paris and Rome?" },
            { "role": "assistant", "content": null, "tool_calls": [
                { "id": "toolu_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } },
                { "id": "toolu_2", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Rome\"}" } },
            ]},
            { "role": "tool", "tool_call_id": "toolu_1", "content": "18C" },
            { "role": "tool", "tool_call_id": "toolu_2", "content": [{ "type": "text", "text": "24C" }] },
            { "role": "user", "content": "Which is warmer?" },
        ]}));
        assert_eq!(
            out["messages"],
            json!([
                { "role": "user", "content": [{ "type": "text", "text": "Weather in Paris and Rome?" }] },
                { "role": "assistant", "content": [
                    { "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": { "city": "Paris" } },
                    { "type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": { "city": "Rome" } },
                ]},
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "toolu_1", "content": "18C" },
                    { "type": "tool_result", "tool_use_id": "toolu_2", "content": [{ "type": "text", "text": "24C" }] },
                    { "type": "text", "text": "Which is warmer?" },
                ]},
            ])
        );
    }

    #[test]
    fn tool_results_come_first_in_a_merged_user_turn() {
        let out = req(json!({ "messages": [
            { "role": "user", "content": "Go" },
            { "role": "assistant", "content": "Calling.", "tool_calls": [
                { "id": "t1", "type": "function", "function": { "name": "now", "arguments": "" } },
            ]},
            { "role": "user", "content": "(also, be quick)" },
            { "role": "tool", "tool_call_id": "t1", "content": "noon" },
        ]}));
        let turns = out["messages"].as_array().unwrap();
        assert_eq!(turns.len(), 3);
        assert_eq!(
            turns[1]["content"][0],
            json!({ "type": "text", "text": "Calling." })
        );
        assert_eq!(turns[1]["content"][1]["input"], json!({}));
        assert_eq!(turns[2]["content"][0]["type"], "tool_result");
        assert_eq!(turns[2]["content"][1]["type"], "text");
    }

    #[test]
    fn invalid_tool_arguments_are_refused() {
        let bad = |arguments: &str| {
            err(json!({ "messages": [
                { "role": "user", "content": "Go" },
                { "role": "assistant", "tool_calls": [
                    { "id": "t1", "type": "function", "function": { "name": "now", "arguments": arguments } },
                ]},
            ]}))
        };
        let e = bad("{\"city\":");
        assert_eq!(e.param, Some("messages"));
        assert!(e.message.contains("not valid JSON"), "{e}");
        assert!(bad("[1,2]").message.contains("JSON object"));
        let e = err(json!({ "messages": [{ "role": "tool", "content": "x" }] }));
        assert!(e.message.contains("tool_call_id"), "{e}");
    }

    #[test]
    fn response_format_becomes_a_system_instruction() {
        let out = req(json!({
            "messages": [{ "role": "system", "content": "You extract data." }, { "role": "user", "content": "x" }],
            "response_format": { "type": "json_object" },
        }));
        let system = out["system"].as_str().unwrap();
        assert!(system.starts_with("You extract data.\n\n"));
        assert!(system.contains("single JSON object"));

        let schema = json!({ "type": "object", "properties": { "name": { "type": "string" } }, "required": ["name"] });
        let out = req(json!({
            "messages": [{ "role": "user", "content": "x" }],
            "response_format": { "type": "json_schema", "json_schema": { "name": "person", "schema": schema, "strict": true } },
        }));
        let system = out["system"].as_str().unwrap();
        assert!(system.contains("single JSON object"));
        assert!(system.contains(&schema.to_string()));

        let out = req(
            json!({ "messages": [{ "role": "user", "content": "x" }], "response_format": { "type": "text" } }),
        );
        assert!(out.get("system").is_none());
        let e = err(json!({ "messages": [], "response_format": { "type": "yaml" } }));
        assert_eq!(e.param, Some("response_format"));
    }

    #[test]
    fn sampling_limits_stream_and_user() {
        let out = req(json!({
            "messages": [{ "role": "user", "content": "x" }],
            "stop": "END", "temperature": 1.7, "top_p": 0.9, "max_tokens": 100,
            "stream": true, "stream_options": { "include_usage": true }, "user": "user-42",
            "seed": 7, "presence_penalty": 0.1,
        }));
        assert_eq!(out["stop_sequences"], json!(["END"]));
        assert_eq!(out["temperature"], json!(1.0));
        assert_eq!(out["top_p"], json!(0.9));
        assert_eq!(out["max_tokens"], json!(100));
        assert_eq!(out["stream"], json!(true));
        assert_eq!(out["metadata"], json!({ "user_id": "user-42" }));
        assert!(out.get("seed").is_none() && out.get("stream_options").is_none());

        let out = req(json!({
            "messages": [{ "role": "user", "content": "x" }],
            "stop": ["a", " ", "b"], "temperature": 0.3, "max_tokens": 100,
            "max_completion_tokens": 50, "stream": false,
        }));
        assert_eq!(out["stop_sequences"], json!(["a", "b"]));
        assert_eq!(out["temperature"], json!(0.3));
        assert_eq!(out["max_tokens"], json!(50));
        assert!(out.get("stream").is_none());
        assert_eq!(
            err(json!({ "messages": [], "max_tokens": 0 })).param,
            Some("max_tokens")
        );
        assert_eq!(
            err(json!({ "messages": [], "temperature": "hot" })).param,
            Some("temperature")
        );
        assert_eq!(
            err(json!({ "messages": [], "stop": 3 })).param,
            Some("stop")
        );
    }

    #[test]
    fn unsupported_fields_are_refused_with_their_param() {
        let e = err(json!({ "messages": [{ "role": "user", "content": "x" }], "n": 2 }));
        assert_eq!(e.param, Some("n"));
        assert!(e.message.contains("one choice"), "{e}");
        assert!(to_messages_request(&json!({ "messages": [], "n": 1 }), "m", 1).is_ok());
        assert_eq!(
            err(json!({ "messages": [], "logprobs": true })).param,
            Some("logprobs")
        );
        assert!(to_messages_request(&json!({ "messages": [], "logprobs": false }), "m", 1).is_ok());
        assert_eq!(
            err(json!({ "messages": [], "top_logprobs": 3 })).param,
            Some("top_logprobs")
        );
        assert_eq!(err(json!({ "messages": "hi" })).param, Some("messages"));
        assert_eq!(
            err(json!({ "messages": [{ "role": "function", "content": "x" }] })).param,
            Some("messages")
        );
        assert_eq!(err(json!([1])).param, None);
    }

    #[test]
    fn text_response() {
        let resp = json!({
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-5-5",
            "content": [
                { "type": "text", "text": "Hello! " },
                { "type": "text", "text": "How can I help?" },
            ],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": { "input_tokens": 12, "cache_creation_input_tokens": 3, "cache_read_input_tokens": 5, "output_tokens": 9 }
        });
        assert_eq!(
            from_messages_response(&resp, 1_700_000_000),
            json!({
                "id": "chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": "claude-sonnet-5-5",
                "choices": [{
                    "index": 0,
                    "message": { "role": "assistant", "content": "Hello! How can I help?" },
                    "logprobs": null,
                    "finish_reason": "stop",
                }],
                "usage": { "prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29,
                           "prompt_tokens_details": { "cached_tokens": 5 } },
            })
        );
    }

    #[test]
    fn tool_use_response() {
        let resp = json!({
            "id": "msg_02",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-5-5",
            "content": [
                { "type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather",
                  "input": { "city": "Paris", "unit": "celsius" } },
            ],
            "stop_reason": "tool_use",
            "usage": { "input_tokens": 300, "output_tokens": 40 }
        });
        let out = from_messages_response(&resp, 1);
        let message = &out["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");
        let call = &message["tool_calls"][0];
        assert_eq!(call["id"], "toolu_01A09q90qw90lq917835lq9");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({ "city": "Paris", "unit": "celsius" }));
        assert_eq!(out["usage"]["total_tokens"], 340);

        // Text plus a tool call keeps the text.
        let mut with_text = resp.clone();
        with_text["content"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({ "type": "text", "text": "Let me check." }));
        let out = from_messages_response(&with_text, 1);
        assert_eq!(out["choices"][0]["message"]["content"], "Let me check.");
        assert_eq!(
            out["choices"][0]["message"]["tool_calls"]
                .as_array()
                .unwrap()
                .len(),
            1
        );

        // The history built from the answer translates back to the same tool_use block.
        let history = json!({ "messages": [{ "role": "user", "content": "Weather?" }, out["choices"][0]["message"]] });
        let back = req(history);
        assert_eq!(back["messages"][1]["content"][1], resp["content"][0]);
    }

    #[test]
    fn stop_reasons() {
        for (anthropic, openai) in [
            ("end_turn", "stop"),
            ("stop_sequence", "stop"),
            ("max_tokens", "length"),
            ("tool_use", "tool_calls"),
            ("refusal", "content_filter"),
        ] {
            let out = from_messages_response(
                &json!({ "id": "m", "content": [], "stop_reason": anthropic }),
                0,
            );
            assert_eq!(out["choices"][0]["finish_reason"], openai, "{anthropic}");
            assert_eq!(out["choices"][0]["message"]["content"], "");
        }
    }

    fn event(name: &str, data: Value) -> String {
        format!("event: {name}\ndata: {data}\n\n")
    }

    /// A realistic Messages stream: text, then a tool call whose input arrives in pieces.
    fn anthropic_stream() -> String {
        let mut s = String::new();
        s += &event(
            "message_start",
            json!({ "type": "message_start", "message": {
            "id": "msg_01ABC", "type": "message", "role": "assistant", "model": "claude-sonnet-5-5",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": { "input_tokens": 472, "cache_read_input_tokens": 100, "output_tokens": 2 } } }),
        );
        s += &event(
            "content_block_start",
            json!({ "type": "content_block_start", "index": 0,
            "content_block": { "type": "text", "text": "" } }),
        );
        s += &event("ping", json!({ "type": "ping" }));
        for piece in ["Okay", ", let's check the weather ", "in Zürich — ☀️?"] {
            s += &event(
                "content_block_delta",
                json!({ "type": "content_block_delta", "index": 0,
                "delta": { "type": "text_delta", "text": piece } }),
            );
        }
        s += &event(
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": 0 }),
        );
        s += &event(
            "content_block_start",
            json!({ "type": "content_block_start", "index": 1,
            "content_block": { "type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather", "input": {} } }),
        );
        for piece in [
            "",
            "{\"location\":",
            " \"Zürich, CH\"",
            ", \"unit\": \"cel",
            "sius\"}",
        ] {
            s += &event(
                "content_block_delta",
                json!({ "type": "content_block_delta", "index": 1,
                "delta": { "type": "input_json_delta", "partial_json": piece } }),
            );
        }
        s += &event(
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": 1 }),
        );
        s += &event(
            "message_delta",
            json!({ "type": "message_delta",
            "delta": { "stop_reason": "tool_use", "stop_sequence": null }, "usage": { "output_tokens": 89 } }),
        );
        s += &event("message_stop", json!({ "type": "message_stop" }));
        s
    }

    fn translate(input: &[u8], split: usize) -> (Vec<u8>, StreamTranslator) {
        let mut parser = Parser::new();
        let mut t = StreamTranslator::new(1_700_000_000);
        let mut out = Vec::new();
        for part in [&input[..split], &input[split..]] {
            for e in parser.feed(part) {
                out.extend(t.feed(&e, 0).unwrap());
            }
        }
        assert!(parser.pending().is_empty());
        (out, t)
    }

    #[test]
    fn stream_translation_is_the_same_at_every_split() {
        let input = anthropic_stream();
        let (whole, t) = translate(input.as_bytes(), input.len());
        assert!(t.finished());
        for split in 0..=input.len() {
            let (out, t) = translate(input.as_bytes(), split);
            assert_eq!(out, whole, "split {split}");
            assert!(t.finished());
        }
    }

    #[test]
    fn stream_output_is_valid_openai_chunks() {
        let input = anthropic_stream();
        let (out, _) = translate(input.as_bytes(), 0);
        let events = Parser::new().feed(&out);
        assert_eq!(events.last().unwrap().data, "[DONE]");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(&e.data).unwrap())
            .collect();
        let mut content = String::new();
        let mut arguments = String::new();
        let mut tool_ids = Vec::new();
        let mut finish = Vec::new();
        for c in &chunks {
            assert_eq!(c["id"], "chatcmpl-msg_01ABC");
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["created"], 1_700_000_000);
            assert_eq!(c["model"], "claude-sonnet-5-5");
            for choice in c["choices"].as_array().unwrap() {
                assert_eq!(choice["index"], 0);
                let delta = &choice["delta"];
                content.push_str(delta["content"].as_str().unwrap_or(""));
                for call in delta["tool_calls"].as_array().into_iter().flatten() {
                    assert_eq!(call["index"], 0);
                    if let Some(id) = call["id"].as_str() {
                        tool_ids.push(id.to_string());
                        assert_eq!(call["type"], "function");
                        assert_eq!(call["function"]["name"], "get_weather");
                    }
                    arguments.push_str(call["function"]["arguments"].as_str().unwrap());
                }
                if let Some(f) = choice["finish_reason"].as_str() {
                    finish.push(f.to_string());
                }
            }
        }
        assert_eq!(
            chunks[0]["choices"][0]["delta"],
            json!({ "role": "assistant", "content": "" })
        );
        assert_eq!(content, "Okay, let's check the weather in Zürich — ☀️?");
        assert_eq!(tool_ids, ["toolu_01T1x1fJ34qAmk2tNTrN7Up6"]);
        assert_eq!(
            arguments,
            "{\"location\": \"Zürich, CH\", \"unit\": \"celsius\"}"
        );
        let args: Value = serde_json::from_str(&arguments).unwrap();
        assert_eq!(args["unit"], "celsius");
        assert_eq!(finish, ["tool_calls"]);
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["prompt_tokens"], 572);
        assert_eq!(usage["usage"]["completion_tokens"], 89);
        assert_eq!(usage["usage"]["total_tokens"], 661);
    }

    #[test]
    fn translated_stream_passes_the_gate() {
        use crate::attempt::stream::{Gate, Step};
        let input = anthropic_stream();
        let (out, _) = translate(input.as_bytes(), 0);
        let mut gate = Gate::new("anthropic", false);
        let forwarded = match gate.feed(&out, 0) {
            Step::Release(b) => b,
            other => panic!("{other:?}"),
        };
        assert!(gate.completed());
        assert_eq!(gate.usage.unwrap().completion_tokens, 89);
        assert_eq!(gate.model.as_deref(), Some("claude-sonnet-5-5"));
        let text = String::from_utf8(forwarded).unwrap();
        assert!(!text.contains("\"usage\""));
        assert!(text.ends_with("data: [DONE]\n\n"));
    }

    #[test]
    fn several_tool_calls_get_their_own_indexes() {
        let mut t = StreamTranslator::new(0);
        let mut parser = Parser::new();
        let mut s = String::new();
        for (block, id) in [(0, "toolu_a"), (1, "toolu_b")] {
            s += &event(
                "content_block_start",
                json!({ "type": "content_block_start", "index": block,
                "content_block": { "type": "tool_use", "id": id, "name": "now", "input": {} } }),
            );
        }
        s += &event(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 1,
            "delta": { "type": "input_json_delta", "partial_json": "{}" } }),
        );
        let mut calls = Vec::new();
        for e in parser.feed(s.as_bytes()) {
            let out = t.feed(&e, 0).unwrap();
            for c in Parser::new().feed(&out) {
                let v: Value = serde_json::from_str(&c.data).unwrap();
                calls.push(v["choices"][0]["delta"]["tool_calls"][0].clone());
            }
        }
        assert_eq!(calls[0]["index"], 0);
        assert_eq!(calls[1]["index"], 1);
        assert_eq!(
            calls[2],
            json!({ "index": 1, "function": { "arguments": "{}" } })
        );
        assert!(!t.finished());
    }

    #[test]
    fn quiet_events_produce_nothing() {
        let mut t = StreamTranslator::new(0);
        for raw in [
            event("ping", json!({ "type": "ping" })),
            event(
                "content_block_stop",
                json!({ "type": "content_block_stop", "index": 0 }),
            ),
            event("something_new", json!({ "type": "something_new" })),
            ": keep-alive\n\n".to_string(),
        ] {
            for e in Parser::new().feed(raw.as_bytes()) {
                assert!(t.feed(&e, 0).unwrap().is_empty(), "{raw}");
            }
        }
    }

    #[test]
    fn error_event_mid_stream_is_a_classified_failure() {
        let mut s = anthropic_stream();
        let cut = s.find("event: content_block_stop").unwrap();
        s.truncate(cut);
        s += "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let mut t = StreamTranslator::new(0);
        let mut produced = 0;
        let mut failure = None;
        for e in Parser::new().feed(s.as_bytes()) {
            match t.feed(&e, 1_000) {
                Ok(b) => produced += b.len(),
                Err(f) => failure = Some(f),
            }
        }
        assert!(produced > 0);
        let failure = failure.unwrap();
        assert_eq!(failure.class, Class::Transient);
        assert_eq!(failure.provider_code.as_deref(), Some("overloaded_error"));
        assert_eq!(failure.message, "Overloaded");
        assert!(!t.finished());

        let rate = Parser::new().feed(
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"slow\"}}\n\n",
        );
        assert_eq!(
            StreamTranslator::new(0)
                .feed(&rate[0], 0)
                .unwrap_err()
                .class,
            Class::RateLimit
        );
        let garbage = Parser::new().feed(b"event: content_block_delta\ndata: {oops\n\n");
        assert_eq!(
            StreamTranslator::new(0)
                .feed(&garbage[0], 0)
                .unwrap_err()
                .class,
            Class::Stream
        );
    }

    #[test]
    fn adapter_error_displays_its_param() {
        let e = AdapterError::new("n", "one choice only");
        assert_eq!(e.to_string(), "one choice only (param: n)");
    }
}
