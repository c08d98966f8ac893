//! A Responses request body -> a chat-completions body.

use serde_json::{json, Map, Value};

use crate::protocols::anthropic::{error::AdapterError, response::str_field as str_of};

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
