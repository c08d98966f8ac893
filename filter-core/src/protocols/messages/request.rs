//! A Messages request body -> a chat-completions body.

use serde_json::{json, Map, Value};

use crate::protocols::anthropic::{error::AdapterError, response::str_field as str_of};

/// How a request with parts chat completions cannot express is treated: refused (the body
/// sent to an OpenAI-shaped provider) or left out (the front stage's view for routing, which
/// must not refuse what an anthropic provider would take).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fidelity {
    Strict,
    Lenient,
}

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
