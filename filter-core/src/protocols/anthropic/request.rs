//! OpenAI chat-completions request -> Messages API request.

use serde_json::{json, Map, Value};

use super::error::AdapterError;

/// The user turn put first when a conversation does not start with one: the Messages API
/// requires the first turn to be the user's.
pub(super) const OPENING_USER_TURN: &str = "Continue.";

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
