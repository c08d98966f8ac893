//! A `GenerateContentRequest` -> a chat-completions body.

use serde_json::{json, Map, Value};

use crate::protocols::anthropic::{error::AdapterError, response::str_field as str_of};

/// Top-level fields with no chat-completions counterpart that do not change what is asked:
/// left out (the lane answers with its own defaults). Any field not named here or translated is
/// left out too.
pub const DROPPED_FIELDS: [&str; 4] = [
    // Google's safety filters; the lane applies its own.
    "safetySettings",
    "labels",
    // `model` in the body repeats the path.
    "model",
    "serviceTier",
];

/// Top-level fields that only run at Google: refused, naming the field.
pub const REFUSED_FIELDS: [&str; 1] = [
    // Contents cached at Google under a name.
    "cachedContent",
];

/// Tool kinds that run at Google (`tools[].googleSearch`, …): refused on a translated lane.
const HOSTED_TOOLS: [&str; 9] = [
    "googleSearch",
    "googleSearchRetrieval",
    "codeExecution",
    "urlContext",
    "retrieval",
    "computerUse",
    "fileSearch",
    "googleMaps",
    "enterpriseWebSearch",
];

fn refused(param: &'static str, message: impl Into<String>) -> AdapterError {
    AdapterError::new(param, message)
}

/// A `GenerateContentRequest` -> a chat-completions request for `model` (`stream` from the
/// path: `:streamGenerateContent`).
pub fn to_chat_request(model: &str, stream: bool, body: &Value) -> Result<Value, AdapterError> {
    let Some(req) = body.as_object() else {
        return Err(AdapterError::not_an_object());
    };
    if let Some(field) = REFUSED_FIELDS
        .iter()
        .copied()
        .find(|f| req.get(*f).is_some_and(|v| !v.is_null()))
    {
        return Err(refused(
            field,
            format!(
                "'{field}' names contents cached at Google; the gateway's lanes cannot take it."
            ),
        ));
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    let mut messages = Vec::new();
    if let Some(system) = req.get("systemInstruction").filter(|v| !v.is_null()) {
        let text = match system {
            Value::String(s) => s.clone(),
            content => texts_of(content, "systemInstruction")?,
        };
        messages.push(json!({ "role": "system", "content": text }));
    }
    let Some(contents) = req.get("contents").and_then(Value::as_array) else {
        return Err(refused(
            "contents",
            "contents must be an array of turns ({\"role\":\"user\",\"parts\":[…]}).",
        ));
    };
    let mut calls = PendingCalls::default();
    for (i, turn) in contents.iter().enumerate() {
        turn_to_chat(turn, i, &mut calls, &mut messages)?;
    }
    out.insert("messages".into(), Value::Array(messages));
    if stream {
        out.insert("stream".into(), json!(true));
    }
    if let Some(config) = req.get("generationConfig").filter(|v| v.is_object()) {
        generation_config(config, &mut out)?;
    }
    tools_to_chat(req, &mut out)?;
    Ok(Value::Object(out))
}

/// The text parts of a `Content` joined (a system instruction).
fn texts_of(content: &Value, param: &'static str) -> Result<String, AdapterError> {
    let Some(parts) = content.get("parts").and_then(Value::as_array) else {
        return Err(refused(
            param,
            format!("{param} must be a Content with parts."),
        ));
    };
    Ok(parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The model's function calls not answered yet, by name, for `functionResponse` parts that
/// carry no `id` (Gemini matches a response to its call by name and order).
#[derive(Default)]
struct PendingCalls {
    open: Vec<(String, String)>,
    made: usize,
}

impl PendingCalls {
    fn call(&mut self, name: &str, id: Option<&str>) -> String {
        self.made += 1;
        let id = id
            .filter(|i| !i.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| format!("call_{}_{}", self.made, name));
        self.open.push((name.to_string(), id.clone()));
        id
    }

    fn answer(&mut self, name: &str, id: Option<&str>) -> String {
        if let Some(id) = id.filter(|i| !i.is_empty()) {
            self.open.retain(|(_, open)| open != id);
            return id.to_string();
        }
        match self.open.iter().position(|(n, _)| n == name) {
            Some(at) => self.open.remove(at).1,
            None => format!("call_{name}"),
        }
    }
}

/// One `Content` -> the chat messages it becomes (function responses are `tool` messages).
fn turn_to_chat(
    turn: &Value,
    index: usize,
    calls: &mut PendingCalls,
    out: &mut Vec<Value>,
) -> Result<(), AdapterError> {
    // `function` and `tool` are older names for the turn that carries function responses.
    let role = match str_of(turn, "role") {
        "model" => "assistant",
        "" | "user" | "function" | "tool" => "user",
        other => {
            return Err(refused(
                "contents",
                format!("contents[{index}].role must be user or model (got '{other}')."),
            ))
        }
    };
    let Some(parts) = turn.get("parts").and_then(Value::as_array) else {
        return Err(refused(
            "contents",
            format!("contents[{index}].parts must be an array."),
        ));
    };
    let mut content = Vec::new();
    let mut tool_calls = Vec::new();
    for part in parts {
        if let Some(text) = part.get("text").and_then(Value::as_str) {
            // The model's thoughts are its own; a chat provider takes none back.
            if part.get("thought").and_then(Value::as_bool) != Some(true) {
                content.push(json!({ "type": "text", "text": text }));
            }
        } else if let Some(call) = part.get("functionCall") {
            let name = str_of(call, "name");
            let id = calls.call(name, call.get("id").and_then(Value::as_str));
            let args = call.get("args").cloned().unwrap_or_else(|| json!({}));
            tool_calls.push(json!({ "id": id, "type": "function",
                "function": { "name": name, "arguments": args.to_string() } }));
        } else if let Some(response) = part.get("functionResponse") {
            flush(role, &mut content, out);
            let name = str_of(response, "name");
            let id = calls.answer(name, response.get("id").and_then(Value::as_str));
            let result = response.get("response").cloned().unwrap_or(Value::Null);
            let text = match result {
                Value::String(s) => s,
                other => other.to_string(),
            };
            out.push(json!({ "role": "tool", "tool_call_id": id, "content": text }));
        } else if let Some(blob) = part.get("inlineData") {
            content.push(media_part(blob, "data", index)?);
        } else if let Some(file) = part.get("fileData") {
            content.push(media_part(file, "fileUri", index)?);
        } else if let Some(kind) = ["executableCode", "codeExecutionResult"]
            .into_iter()
            .find(|k| part.get(*k).is_some())
        {
            return Err(refused(
                "contents",
                format!(
                    "contents[{index}] has a '{kind}' part: code execution runs only at Google."
                ),
            ));
        }
        // A part with none of these (only `thoughtSignature`, `videoMetadata`, or a kind
        // newer than this module) carries nothing a chat provider reads: left out.
    }
    if role == "assistant" {
        out.push(crate::protocols::messages::request::assistant_message(
            &content, tool_calls,
        ));
    } else {
        flush(role, &mut content, out);
    }
    Ok(())
}

/// The user parts gathered so far as one message.
fn flush(role: &str, parts: &mut Vec<Value>, out: &mut Vec<Value>) {
    if parts.is_empty() || role != "user" {
        return;
    }
    let parts = std::mem::take(parts);
    let content = if parts.iter().all(|p| str_of(p, "type") == "text") {
        Value::String(
            parts
                .iter()
                .map(|p| str_of(p, "text"))
                .collect::<Vec<_>>()
                .join("\n"),
        )
    } else {
        Value::Array(parts)
    };
    out.push(json!({ "role": "user", "content": content }));
}

/// An `inlineData` blob (`data`: base64) or `fileData` (`fileUri`) as an image part: the only
/// media a chat provider takes inline.
fn media_part(media: &Value, field: &str, index: usize) -> Result<Value, AdapterError> {
    let mime = str_of(media, "mimeType");
    if !mime.starts_with("image/") {
        return Err(refused(
            "contents",
            format!(
                "contents[{index}] has '{mime}' data; only images (image/*) are translated for \
                 this model's provider."
            ),
        ));
    }
    let url = match field {
        "data" => format!("data:{mime};base64,{}", str_of(media, "data")),
        _ => str_of(media, "fileUri").to_string(),
    };
    Ok(json!({ "type": "image_url", "image_url": { "url": url } }))
}

/// `generationConfig` -> the chat sampling fields.
fn generation_config(config: &Value, out: &mut Map<String, Value>) -> Result<(), AdapterError> {
    for (from, to) in [
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("maxOutputTokens", "max_tokens"),
        ("seed", "seed"),
        ("presencePenalty", "presence_penalty"),
        ("frequencyPenalty", "frequency_penalty"),
    ] {
        if let Some(v) = config.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), v.clone());
        }
    }
    if let Some(stops) = config.get("stopSequences").filter(|v| !v.is_null()) {
        out.insert("stop".into(), stops.clone());
    }
    if config
        .get("candidateCount")
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 1)
    {
        return Err(refused(
            "generationConfig",
            "generationConfig.candidateCount above 1 is not served: ask for one candidate.",
        ));
    }
    if let Some(modalities) = config.get("responseModalities").and_then(Value::as_array) {
        if let Some(other) = modalities
            .iter()
            .filter_map(Value::as_str)
            .find(|m| !m.eq_ignore_ascii_case("text"))
        {
            return Err(refused(
                "generationConfig",
                format!("generationConfig.responseModalities '{other}' is not served: text only."),
            ));
        }
    }
    let schema = config
        .get("responseJsonSchema")
        .or_else(|| config.get("responseSchema"))
        .filter(|s| s.is_object());
    let json_out = str_of(config, "responseMimeType") == "application/json";
    match schema {
        Some(schema) if json_out => {
            let schema = if config.get("responseJsonSchema").is_some() {
                schema.clone()
            } else {
                json_schema_of(schema)
            };
            out.insert(
                "response_format".into(),
                json!({ "type": "json_schema",
                        "json_schema": { "name": "output", "schema": schema } }),
            );
        }
        _ if json_out => {
            out.insert("response_format".into(), json!({ "type": "json_object" }));
        }
        _ => {}
    }
    // topK, thinkingConfig, responseLogprobs, mediaResolution, speechConfig and the rest: a
    // chat provider has no counterpart; left out.
    Ok(())
}

/// A Gemini `Schema` (OpenAPI 3.0 subset, types upper-case: `OBJECT`, `STRING`) as JSON
/// Schema: types lower-cased, everything else kept.
pub fn json_schema_of(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("type", Value::String(t)) => Value::String(t.to_ascii_lowercase()),
                        ("properties", Value::Object(props)) => Value::Object(
                            props
                                .iter()
                                .map(|(name, s)| (name.clone(), json_schema_of(s)))
                                .collect(),
                        ),
                        ("items", s) | ("additionalProperties", s) => json_schema_of(s),
                        ("anyOf" | "oneOf" | "allOf", Value::Array(list)) => {
                            Value::Array(list.iter().map(json_schema_of).collect())
                        }
                        _ => v.clone(),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn tools_to_chat(
    req: &Map<String, Value>,
    out: &mut Map<String, Value>,
) -> Result<(), AdapterError> {
    let mut chat_tools = Vec::new();
    for tool in req
        .get("tools")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        if let Some(kind) = HOSTED_TOOLS.into_iter().find(|k| tool.get(*k).is_some()) {
            return Err(refused(
                "tools",
                format!("The tool '{kind}' runs only at Google; this model's provider takes function declarations only."),
            ));
        }
        for decl in tool
            .get("functionDeclarations")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let mut function = Map::new();
            function.insert("name".into(), json!(str_of(decl, "name")));
            if let Some(d) = decl.get("description").filter(|d| d.is_string()) {
                function.insert("description".into(), d.clone());
            }
            let parameters = match (decl.get("parametersJsonSchema"), decl.get("parameters")) {
                (Some(p), _) if p.is_object() => p.clone(),
                (_, Some(p)) if p.is_object() => json_schema_of(p),
                _ => json!({ "type": "object", "properties": {} }),
            };
            function.insert("parameters".into(), parameters);
            chat_tools.push(json!({ "type": "function", "function": function }));
        }
    }
    if !chat_tools.is_empty() {
        out.insert("tools".into(), Value::Array(chat_tools));
    }
    if let Some(config) = req
        .get("toolConfig")
        .and_then(|c| c.get("functionCallingConfig"))
    {
        let allowed: Vec<&str> = config
            .get("allowedFunctionNames")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let choice = match str_of(config, "mode") {
            "ANY" if allowed.len() == 1 => {
                json!({ "type": "function", "function": { "name": allowed[0] } })
            }
            "ANY" => json!("required"),
            "NONE" => json!("none"),
            // AUTO, VALIDATED and anything newer: the model chooses.
            _ => json!("auto"),
        };
        if out.contains_key("tools") {
            out.insert("tool_choice".into(), choice);
        }
    }
    Ok(())
}

/// The gateway's own answer to `:countTokens`: `{"totalTokens": N}`, N estimated over the
/// contents, the system instruction and the tools (the estimate routing uses); no provider is
/// called. `generateContentRequest` (the SDKs' other form) is counted the same way.
pub fn count_tokens(body: &Value) -> Value {
    let request = body.get("generateContentRequest").unwrap_or(body);
    let n: u64 = ["contents", "systemInstruction", "tools"]
        .iter()
        .filter_map(|f| request.get(*f).filter(|v| !v.is_null()))
        .map(crate::protocols::context::estimate_json_tokens)
        .sum();
    json!({ "totalTokens": n })
}

/// What the front stage routes a Gemini call by: the chat-completions translation of its body
/// (of the request a `:countTokens` counts), or for an embedding (`embed`: `Some(batch)`) its
/// `/v1/embeddings` translation. The outer error refuses the call whatever the lane (an
/// embedding body of the other form than its method); the inner one is what no translation
/// carries (only a native lane can take the call).
pub fn routed_request(
    model: &str,
    stream: bool,
    count: bool,
    embed: Option<bool>,
    body: &Value,
) -> Result<Result<Value, AdapterError>, AdapterError> {
    Ok(match (embed, count) {
        (Some(batch), _) => {
            let (field, form) = match batch {
                true => ("requests", "{\"requests\":[EmbedContentRequest…]}"),
                false => (
                    "content",
                    "an EmbedContentRequest ({\"content\":{\"parts\":[…]}})",
                ),
            };
            if body.get(field).is_none_or(Value::is_null) {
                return Err(refused(
                    field,
                    format!("{field} is required: this method takes {form}."),
                ));
            }
            crate::protocols::gemini::embed::to_openai(model, body)
        }
        (None, true) => to_chat_request(model, false, &counted_request(body)),
        (None, false) => to_chat_request(model, stream, body),
    })
}

/// A `:countTokens` body as the `generateContent` request it counts.
pub fn counted_request(body: &Value) -> Value {
    let mut request = body
        .get("generateContentRequest")
        .cloned()
        .unwrap_or_else(|| body.clone());
    if request.get("contents").is_none() {
        request["contents"] = json!([]);
    }
    request
}
