//! Callers that speak Google's Generative Language API (the Gemini API: the Gemini CLI, the
//! `@google/genai` and `google-genai` SDKs), served by any lane through chat completions. Pure
//! translations, no host calls:
//!
//! - [`route`]: `/v1beta/models/{model}:{method}` (and `GET /v1beta/models[/{model}]`);
//! - [`to_chat_request`]: a `GenerateContentRequest` (model and streaming from the path) to a
//!   chat-completions body. The front stage translates once: the attempts get chat completions,
//!   so a Gemini call routes, fails over and is gated like a chat call;
//! - [`from_chat_response`]: a `chat.completion` to a `GenerateContentResponse`;
//! - [`StreamEncoder`]: chat-completion chunk events to `GenerateContentResponse` chunks, as
//!   SSE (`?alt=sse`) or as the JSON array Google streams without it;
//! - [`error_body`]: Google's error object (`{"error":{"code","message","status"}}`).
//!
//! What the translation does with each part of a request (docs/protocols.md lists the same):
//! what has a chat-completions counterpart is translated; what has none and does not change the
//! answer's meaning is dropped (and any field this module does not know yet); what only runs at
//! Google (its hosted tools, cached contents, non-text output) is refused, naming the field.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::protocols::anthropic::{str_field as str_of, AdapterError};
use crate::wire::sse::FromChatStream;

// ---------------------------------------------------------------------------------------------
// Routes
// ---------------------------------------------------------------------------------------------

/// A Gemini API call on the public listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `POST …/models/{model}:generateContent` or `:streamGenerateContent`.
    Generate { model: String, stream: bool },
    /// `POST …/models/{model}:countTokens`.
    CountTokens { model: String },
    /// `POST …/models/{model}:embedContent` or `:batchEmbedContents` (`batch`).
    Embed { model: String, batch: bool },
    /// `GET /v1beta/models` (`None`) or `GET /v1beta/models/{model}`.
    Models(Option<String>),
    /// A path of the Gemini API the gateway does not serve (answered 404/405 in its shape).
    Unserved,
}

/// Whether `path` (no query) belongs to the Gemini API: everything under `/v1beta/`, and the
/// model methods under `/v1/models/` (`POST /v1/models/{model}:generateContent`; the rest of
/// `/v1/models` is OpenAI's list).
pub fn is_gemini_path(path: &str) -> bool {
    path.starts_with("/v1beta/")
        || path == "/v1beta"
        || path
            .strip_prefix("/v1/models/")
            .is_some_and(|rest| rest.contains(':'))
}

/// Whether a request on `/v1/models` comes from a Google client (the genai SDKs list models
/// there): its key as `x-goog-api-key` or `?key=`, or its `x-goog-api-client` header.
pub fn google_client(goog_header: bool, query: &str) -> bool {
    goog_header || query.split('&').any(|p| p.starts_with("key="))
}

/// The call `method` and `path` (no query, no trailing slash) make, for a Gemini path (or
/// `/v1/models` asked by a Google client, [`google_client`]).
pub fn route(method: &str, path: &str) -> Route {
    let rest = path
        .strip_prefix("/v1beta/models")
        .or_else(|| path.strip_prefix("/v1/models"));
    let Some(rest) = rest else {
        return Route::Unserved;
    };
    let named = rest.strip_prefix('/').filter(|r| !r.is_empty());
    match (method, named) {
        ("GET", None) if rest.is_empty() => Route::Models(None),
        ("GET", Some(name)) if !name.contains(':') => Route::Models(Some(model_name(name))),
        ("POST", Some(name)) => match name.rsplit_once(':') {
            Some((model, "generateContent")) => Route::Generate {
                model: model_name(model),
                stream: false,
            },
            Some((model, "streamGenerateContent")) => Route::Generate {
                model: model_name(model),
                stream: true,
            },
            Some((model, "countTokens")) => Route::CountTokens {
                model: model_name(model),
            },
            Some((model, method @ ("embedContent" | "batchEmbedContents"))) => Route::Embed {
                model: model_name(model),
                batch: method == "batchEmbedContents",
            },
            _ => Route::Unserved,
        },
        _ => Route::Unserved,
    }
}

/// A model name from the path, percent-decoded (`openai%2Fgpt-4o` is `openai/gpt-4o`).
fn model_name(raw: &str) -> String {
    crate::wire::percent::percent_decode(raw).unwrap_or_else(|| raw.to_string())
}

/// The query without its `key` parameter (the virtual key, which goes no further than the
/// front stage), and that key.
pub fn take_query_key(query: &str) -> (String, Option<String>) {
    let mut key = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some(("key", value)) => {
                key = Some(model_name(value));
                false
            }
            _ => !pair.is_empty() && *pair != "key",
        })
        .collect();
    (kept.join("&"), key)
}

/// Whether the query asks for SSE (`alt=sse`); without it Google streams one JSON array.
pub fn wants_sse(query: &str) -> bool {
    query.split('&').any(|pair| pair == "alt=sse")
}

// ---------------------------------------------------------------------------------------------
// Request
// ---------------------------------------------------------------------------------------------

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
        out.push(crate::protocols::messages::assistant_message(
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
        .map(|v| crate::protocols::context::estimate_tokens(&v.to_string()))
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
            crate::protocols::gemini_embed::to_openai(model, body)
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

// ---------------------------------------------------------------------------------------------
// Unary response
// ---------------------------------------------------------------------------------------------

/// OpenAI `finish_reason` -> Gemini `finishReason` (a function call ends with `STOP`, as at
/// Google).
pub fn finish_reason(finish: &str) -> &'static str {
    match finish {
        "length" => "MAX_TOKENS",
        "content_filter" => "SAFETY",
        "stop" | "tool_calls" | "function_call" => "STOP",
        _ => "OTHER",
    }
}

/// Chat usage as `usageMetadata`.
fn usage_metadata(chat_usage: &Value) -> Value {
    let get = |p: &str| chat_usage.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let prompt = get("/prompt_tokens");
    let completion = get("/completion_tokens");
    let mut usage = json!({
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion,
        "totalTokenCount": chat_usage.get("total_tokens").and_then(Value::as_u64)
            .unwrap_or(prompt + completion),
    });
    let cached = get("/prompt_tokens_details/cached_tokens");
    if cached > 0 {
        usage["cachedContentTokenCount"] = json!(cached);
    }
    let thoughts = get("/completion_tokens_details/reasoning_tokens");
    if thoughts > 0 {
        usage["thoughtsTokenCount"] = json!(thoughts);
    }
    usage
}

/// A chat tool call as a `functionCall` part (`args` the object of its arguments).
fn function_call_part(id: &str, name: &str, arguments: &str) -> Value {
    let args = match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    };
    json!({ "functionCall": { "id": id, "name": name, "args": args } })
}

fn response(parts: Vec<Value>, finish: Option<&str>, model: &str, id: &str) -> Value {
    let mut candidate = json!({ "content": { "role": "model", "parts": parts }, "index": 0 });
    if let Some(finish) = finish {
        candidate["finishReason"] = json!(finish);
    }
    json!({ "candidates": [candidate], "modelVersion": model, "responseId": id })
}

/// A `chat.completion` -> a `GenerateContentResponse`.
pub fn from_chat_response(chat: &Value) -> Value {
    let choice = chat.pointer("/choices/0").unwrap_or(&Value::Null);
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut parts = Vec::new();
    if let Some(text) = message
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        parts.push(json!({ "text": text }));
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        parts.push(function_call_part(
            str_of(call, "id"),
            call.pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            call.pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or(""),
        ));
    }
    if parts.is_empty() {
        parts.push(json!({ "text": "" }));
    }
    let mut out = response(
        parts,
        Some(finish_reason(str_of(choice, "finish_reason"))),
        str_of(chat, "model"),
        str_of(chat, "id"),
    );
    if let Some(usage) = chat.get("usage").filter(|u| u.is_object()) {
        out["usageMetadata"] = usage_metadata(usage);
    }
    out
}

/// A whole `GenerateContentResponse` as the stream a caller of `:streamGenerateContent` reads:
/// one SSE event, or a JSON array of one.
pub fn replay(answer: &Value, json_array: bool) -> Vec<u8> {
    if json_array {
        format!("[{answer}]").into_bytes()
    } else {
        format!("data: {answer}\r\n\r\n").into_bytes()
    }
}

// ---------------------------------------------------------------------------------------------
// Stream
// ---------------------------------------------------------------------------------------------

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

    fn close(&mut self, out: &mut Vec<u8>) {
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

// ---------------------------------------------------------------------------------------------
// Errors and models
// ---------------------------------------------------------------------------------------------

/// `{"error":{"code","message","status","details"}}`: Google's shape, the gateway's code as
/// the `reason` of an `ErrorInfo` detail.
pub fn error_body(status: u16, code: &str, message: &str) -> Value {
    json!({ "error": {
        "code": status,
        "message": message,
        "status": ai_router_contract::google_status(status),
        "details": [{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": code,
            "domain": "ai-router",
        }],
    }})
}

/// A gateway error body (OpenAI shape) re-dressed in Google's shape; its `trail` kept.
pub fn error_from_openai(status: u16, openai: &[u8]) -> Vec<u8> {
    let parts = crate::protocols::messages::OpenAiError::read(status, openai);
    let mut body = error_body(status, &parts.code, &parts.message);
    if let Some(trail) = parts.trail {
        body["error"]["trail"] = trail;
    }
    body.to_string().into_bytes()
}

/// One entry of `GET /v1beta/models`.
pub fn model_entry(id: &str) -> Value {
    json!({
        "name": format!("models/{id}"),
        "baseModelId": id,
        "version": "ai-router",
        "displayName": id,
        "description": "A model or profile of the gateway's pool.",
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens",
                                       "embedContent", "batchEmbedContents"],
    })
}

/// The `GET /v1beta/models` list.
pub fn model_list(entries: Vec<Value>) -> Value {
    json!({ "models": entries })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sse::Parser;

    #[test]
    fn routes_of_the_gemini_api() {
        assert_eq!(
            route(
                "POST",
                "/v1beta/models/gemini-2.5-pro:streamGenerateContent"
            ),
            Route::Generate {
                model: "gemini-2.5-pro".into(),
                stream: true
            }
        );
        assert_eq!(
            route("POST", "/v1/models/openai%2Fgpt-4o:generateContent"),
            Route::Generate {
                model: "openai/gpt-4o".into(),
                stream: false
            }
        );
        assert_eq!(
            route("POST", "/v1beta/models/a/b:countTokens"),
            Route::CountTokens {
                model: "a/b".into()
            }
        );
        assert_eq!(route("GET", "/v1beta/models"), Route::Models(None));
        assert_eq!(
            route("GET", "/v1beta/models/m1"),
            Route::Models(Some("m1".into()))
        );
        assert_eq!(
            route("POST", "/v1beta/models/m1:embedContent"),
            Route::Embed {
                model: "m1".into(),
                batch: false
            }
        );
        assert_eq!(
            route("POST", "/v1beta/models/m1:batchEmbedContents"),
            Route::Embed {
                model: "m1".into(),
                batch: true
            }
        );
        assert_eq!(route("POST", "/v1beta/models/m1:predict"), Route::Unserved);
        assert_eq!(route("GET", "/v1beta/files"), Route::Unserved);
        assert!(is_gemini_path("/v1beta/models"));
        assert!(is_gemini_path("/v1/models/m1:generateContent"));
        assert!(!is_gemini_path("/v1/models/m1"));
        assert!(!is_gemini_path("/v1/models"));
    }

    #[test]
    fn the_query_key_is_taken_out() {
        assert_eq!(
            take_query_key("alt=sse&key=sk-1%2B2"),
            ("alt=sse".to_string(), Some("sk-1+2".to_string()))
        );
        assert_eq!(
            take_query_key("key=abc"),
            (String::new(), Some("abc".into()))
        );
        assert_eq!(take_query_key("alt=sse"), ("alt=sse".into(), None));
        assert!(wants_sse("key=x&alt=sse"));
        assert!(!wants_sse("alt=json"));
    }

    #[test]
    fn a_request_becomes_a_chat_request() {
        let body = json!({
            "systemInstruction": { "parts": [{ "text": "Be brief." }] },
            "contents": [
                { "role": "user", "parts": [{ "text": "What is 2+2?" },
                    { "inlineData": { "mimeType": "image/png", "data": "iVBO" } }] },
                { "role": "model", "parts": [{ "text": "hmm", "thought": true },
                    { "functionCall": { "name": "add", "args": { "a": 2, "b": 2 } },
                      "thoughtSignature": "sig" }] },
                { "role": "user", "parts": [{ "functionResponse": { "name": "add",
                    "response": { "result": 4 } } }] },
            ],
            "generationConfig": { "temperature": 0.1, "topP": 0.9, "topK": 40,
                "maxOutputTokens": 100, "stopSequences": ["END"], "candidateCount": 1,
                "thinkingConfig": { "thinkingBudget": 0 } },
            "safetySettings": [{ "category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE" }],
            "tools": [{ "functionDeclarations": [
                { "name": "add", "description": "Adds.", "parameters": { "type": "OBJECT",
                  "properties": { "a": { "type": "INTEGER" }, "b": { "type": "INTEGER" } },
                  "required": ["a", "b"] } },
                { "name": "ls", "parametersJsonSchema": { "type": "object", "properties": {} } },
            ]}],
            "toolConfig": { "functionCallingConfig": { "mode": "ANY", "allowedFunctionNames": ["add"] } },
            "someFieldFromTheFuture": { "x": 1 },
        });
        let out = to_chat_request("m1", true, &body).unwrap();
        assert_eq!(
            out,
            json!({
                "model": "m1",
                "stream": true,
                "messages": [
                    { "role": "system", "content": "Be brief." },
                    { "role": "user", "content": [
                        { "type": "text", "text": "What is 2+2?" },
                        { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBO" } },
                    ]},
                    { "role": "assistant", "content": null, "tool_calls": [{ "id": "call_1_add",
                        "type": "function", "function": { "name": "add", "arguments": "{\"a\":2,\"b\":2}" } }] },
                    { "role": "tool", "tool_call_id": "call_1_add", "content": "{\"result\":4}" },
                ],
                "temperature": 0.1, "top_p": 0.9, "max_tokens": 100, "stop": ["END"],
                "tools": [
                    { "type": "function", "function": { "name": "add", "description": "Adds.",
                      "parameters": { "type": "object", "properties": { "a": { "type": "integer" },
                        "b": { "type": "integer" } }, "required": ["a", "b"] } } },
                    { "type": "function", "function": { "name": "ls",
                      "parameters": { "type": "object", "properties": {} } } },
                ],
                "tool_choice": { "type": "function", "function": { "name": "add" } },
            })
        );
    }

    #[test]
    fn call_ids_are_kept_when_sent() {
        let body = json!({ "contents": [
            { "role": "user", "parts": [{ "text": "hi" }] },
            { "role": "model", "parts": [{ "functionCall": { "id": "c9", "name": "f", "args": {} } }] },
            { "role": "user", "parts": [{ "functionResponse": { "id": "c9", "name": "f", "response": { "output": "ok" } } },
                                        { "text": "and then?" }] },
        ]});
        let out = to_chat_request("m", false, &body).unwrap();
        let messages = out["messages"].as_array().unwrap();
        assert_eq!(messages[1]["tool_calls"][0]["id"], "c9");
        assert_eq!(
            messages[2],
            json!({ "role": "tool", "tool_call_id": "c9", "content": "{\"output\":\"ok\"}" })
        );
        assert_eq!(
            messages[3],
            json!({ "role": "user", "content": "and then?" })
        );
        assert!(out.get("stream").is_none());
    }

    #[test]
    fn what_runs_only_at_google_is_refused_naming_it() {
        let refuse = |body: Value| to_chat_request("m", false, &body).unwrap_err();
        let turn = json!([{ "role": "user", "parts": [{ "text": "hi" }] }]);
        let e = refuse(json!({ "contents": turn, "tools": [{ "googleSearch": {} }] }));
        assert_eq!(e.param, Some("tools"));
        assert!(e.message.contains("googleSearch"), "{}", e.message);
        let e = refuse(json!({ "contents": turn, "cachedContent": "cachedContents/x" }));
        assert_eq!(e.param, Some("cachedContent"));
        let e = refuse(json!({ "contents": turn, "generationConfig": { "candidateCount": 2 } }));
        assert_eq!(e.param, Some("generationConfig"));
        let e = refuse(
            json!({ "contents": turn, "generationConfig": { "responseModalities": ["TEXT", "IMAGE"] } }),
        );
        assert!(e.message.contains("IMAGE"));
        let e = refuse(json!({ "contents": [{ "role": "user", "parts": [
            { "inlineData": { "mimeType": "application/pdf", "data": "JVBE" } }] }] }));
        assert_eq!(e.param, Some("contents"));
        assert!(e.message.contains("application/pdf"));
        let e = refuse(json!({ "contents": [{ "role": "system", "parts": [] }] }));
        assert!(e.message.contains("user or model"));
        assert_eq!(refuse(json!({})).param, Some("contents"));
    }

    #[test]
    fn json_output_becomes_a_response_format() {
        let out = to_chat_request("m", false, &json!({ "contents": [],
            "generationConfig": { "responseMimeType": "application/json",
                "responseSchema": { "type": "OBJECT", "properties": { "n": { "type": "NUMBER" } } } } }))
        .unwrap();
        assert_eq!(
            out["response_format"],
            json!({ "type": "json_schema", "json_schema": { "name": "output",
                "schema": { "type": "object", "properties": { "n": { "type": "number" } } } } })
        );
        let out = to_chat_request(
            "m",
            false,
            &json!({ "contents": [],
            "generationConfig": { "responseMimeType": "application/json" } }),
        )
        .unwrap();
        assert_eq!(out["response_format"], json!({ "type": "json_object" }));
    }

    #[test]
    fn an_answer_becomes_a_generate_content_response() {
        let chat = json!({ "id": "chatcmpl-1", "model": "gpt-x", "choices": [{ "index": 0,
            "message": { "role": "assistant", "content": "Let me add.", "tool_calls": [
                { "id": "call_a", "type": "function", "function": { "name": "add", "arguments": "{\"a\":1}" } }] },
            "finish_reason": "tool_calls" }],
            "usage": { "prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
                       "prompt_tokens_details": { "cached_tokens": 3 } } });
        assert_eq!(
            from_chat_response(&chat),
            json!({ "candidates": [{ "content": { "role": "model", "parts": [
                    { "text": "Let me add." },
                    { "functionCall": { "id": "call_a", "name": "add", "args": { "a": 1 } } } ] },
                "finishReason": "STOP", "index": 0 }],
                "usageMetadata": { "promptTokenCount": 10, "candidatesTokenCount": 4,
                    "totalTokenCount": 14, "cachedContentTokenCount": 3 },
                "modelVersion": "gpt-x", "responseId": "chatcmpl-1" })
        );
        let cut =
            json!({ "choices": [{ "message": { "content": "" }, "finish_reason": "length" }] });
        assert_eq!(
            from_chat_response(&cut)["candidates"][0]["finishReason"],
            "MAX_TOKENS"
        );
        assert_eq!(finish_reason("content_filter"), "SAFETY");
    }

    fn chat_stream() -> Vec<u8> {
        let chunks = [
            json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "role": "assistant", "content": "" } }] }),
            json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "content": "Hel" } }] }),
            json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "content": "lo" } }] }),
            json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "tool_calls": [
                { "index": 0, "id": "call_1", "type": "function", "function": { "name": "ls", "arguments": "{\"di" } }] } }] }),
            json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "tool_calls": [
                { "index": 0, "function": { "arguments": "r\":\".\"}" } }] }, "finish_reason": "tool_calls" }] }),
            json!({ "id": "c1", "model": "gpt-x", "choices": [], "usage": { "prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7 } }),
        ];
        let mut sse: Vec<u8> = chunks
            .iter()
            .flat_map(|c| format!("data: {c}\n\n").into_bytes())
            .collect();
        sse.extend_from_slice(b"data: [DONE]\n\n");
        sse
    }

    fn encode(json_array: bool, sse: &[u8], cut: usize) -> Vec<u8> {
        let mut parser = Parser::new();
        let mut encoder = StreamEncoder::new(json_array);
        let mut out = Vec::new();
        for piece in [&sse[..cut], &sse[cut..]] {
            for event in parser.feed(piece) {
                out.extend(encoder.feed(&event));
            }
        }
        out
    }

    #[test]
    fn a_stream_becomes_generate_content_chunks_at_any_chunk_boundary() {
        let sse = chat_stream();
        let whole = encode(false, &sse, 0);
        for cut in 1..sse.len() {
            assert_eq!(encode(false, &sse, cut), whole, "cut at {cut}");
        }
        let mut parser = Parser::new();
        let events: Vec<Value> = parser
            .feed(&whole)
            .iter()
            .map(|e| serde_json::from_str(&e.data).unwrap())
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[0]["candidates"][0]["content"]["parts"][0]["text"],
            "Hel"
        );
        assert_eq!(
            events[1]["candidates"][0]["content"]["parts"][0]["text"],
            "lo"
        );
        assert_eq!(
            events[2]["candidates"][0],
            json!({ "content": { "role": "model", "parts": [{ "functionCall": {
                "id": "call_1", "name": "ls", "args": { "dir": "." } } }] },
                "finishReason": "STOP", "index": 0 })
        );
        assert_eq!(events[2]["usageMetadata"]["totalTokenCount"], 7);
        assert_eq!(events[2]["modelVersion"], "gpt-x");
        // Without alt=sse: one JSON array of the same chunks.
        let array: Value = serde_json::from_slice(&encode(true, &sse, 17)).unwrap();
        assert_eq!(array.as_array().unwrap().len(), 3);
        assert_eq!(array[2], events[2]);
    }

    #[test]
    fn a_cut_stream_ends_with_an_error_in_googles_shape() {
        let mut encoder = StreamEncoder::new(true);
        let mut out = Vec::new();
        encoder.chunk(
            &mut out,
            &json!({ "choices": [{ "delta": { "content": "Hi" } }] }),
        );
        encoder.fail(&mut out, &json!({ "message": "the provider went away" }));
        let array: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(array[1]["error"]["status"], "UNAVAILABLE");
        assert!(encoder.ended());
        let mut empty = StreamEncoder::new(true);
        let mut out = Vec::new();
        empty.close(&mut out);
        assert_eq!(out, b"[]");
    }

    #[test]
    fn errors_take_googles_shape() {
        let v = error_body(401, "invalid_api_key", "bad key");
        assert_eq!(v["error"]["code"], 401);
        assert_eq!(v["error"]["status"], "UNAUTHENTICATED");
        assert_eq!(v["error"]["details"][0]["reason"], "invalid_api_key");
        let openai = br#"{"error":{"message":"All lanes failed.","type":"server_error","code":"upstream_error","trail":{"skipped":[]}}}"#;
        let v: Value = serde_json::from_slice(&error_from_openai(502, openai)).unwrap();
        assert_eq!(v["error"]["message"], "All lanes failed.");
        assert_eq!(v["error"]["status"], "UNAVAILABLE");
        assert_eq!(v["error"]["details"][0]["reason"], "upstream_error");
        assert!(v["error"]["trail"].is_object());
    }

    #[test]
    fn count_tokens_is_estimated() {
        let n = count_tokens(
            &json!({ "contents": [{ "role": "user", "parts": [{ "text": "Hello there" }] }] }),
        );
        assert!(n["totalTokens"].as_u64().unwrap() > 0);
        let wrapped = json!({ "generateContentRequest": { "model": "models/m", "contents": [] } });
        assert_eq!(counted_request(&wrapped)["contents"], json!([]));
    }
}
