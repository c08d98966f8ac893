//! Google's Gemini API (Generative Language, `v1beta`) shapes, answered natively:
//! `POST …/models/{model}:generateContent`, `:streamGenerateContent` (SSE with `?alt=sse`, else
//! one JSON array), `:countTokens`, `:embedContent` and `:batchEmbedContents`; errors as
//! `{"error":{"code","message","status","details"}}`.
//!
//! The model is the path's; the key is `x-goog-api-key`, else `?key=`, else a bearer token. A
//! call without a key is refused 403 `PERMISSION_DENIED`, as Google refuses it; a request
//! without `contents` is refused 400 `INVALID_ARGUMENT`. A scripted 429 without a body carries a
//! `RetryInfo` detail (`retryDelay` from the reply's `retry-after`, else 30s); the provider
//! error table's `gemini.*` answers (the list Google's OpenAI endpoint wraps them in) are sent
//! as the one error object the native API answers.

use serde_json::{json, Value};

use super::answer::{self, Answer, Turn};
use super::openai;
use super::script::Reply;
use super::sse::{Piece, StreamPlan};

/// A method of the Gemini API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Generate,
    Stream,
    CountTokens,
    Embed,
    BatchEmbed,
}

/// The model and method of a Gemini path (`…/models/{model}:{method}`).
pub fn of(path: &str) -> Option<(String, Method)> {
    let (_, rest) = path.rsplit_once("/models/")?;
    let (model, method) = rest.rsplit_once(':')?;
    let method = match method.trim_end_matches('/') {
        "generateContent" => Method::Generate,
        "streamGenerateContent" => Method::Stream,
        "countTokens" => Method::CountTokens,
        "embedContent" => Method::Embed,
        "batchEmbedContents" => Method::BatchEmbed,
        _ => return None,
    };
    Some((model.to_owned(), method))
}

/// The key of a Gemini call: `x-goog-api-key`, else `?key=`.
pub fn key(headers: &hyper::HeaderMap, query: &str) -> Option<String> {
    headers
        .get("x-goog-api-key")
        .and_then(|value| value.to_str().ok())
        .map(|value| value.trim().to_owned())
        .or_else(|| {
            query
                .split('&')
                .find_map(|pair| pair.strip_prefix("key="))
                .map(str::to_owned)
        })
        .filter(|key| !key.is_empty())
}

/// Whether a stream is asked as SSE (`alt=sse`); without it Google sends one JSON array.
pub fn wants_sse(query: &str) -> bool {
    query.split('&').any(|pair| pair == "alt=sse")
}

/// Google's error object for a scripted status without a body; a 429 carries `RetryInfo`
/// (`retry_s`, default 30).
pub fn error_body(status: u16, message: &str, retry_s: Option<u64>) -> Value {
    let mut error = json!({ "code": status, "message": message, "status": ai_router_contract::google_status(status) });
    if status == 429 {
        error["details"] = json!([{
            "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": format!("{}s", retry_s.unwrap_or(30)),
        }]);
    }
    json!({ "error": error })
}

/// A scripted body as the native API sends it: the provider error table's Gemini answers are
/// the list Google's OpenAI-compatible endpoint wraps its error in; natively it is the object.
pub fn native_body(body: Value) -> Value {
    match body {
        Value::Array(mut items)
            if items.len() == 1 && items.first().is_some_and(|e| e.get("error").is_some()) =>
        {
            items.remove(0)
        }
        other => other,
    }
}

/// What Google refuses before answering: a call without a key (403), a generate or count
/// without `contents`, an embed without `content`, a batch without `requests` (400).
pub fn refusal(method: Method, key: Option<&str>, request: &Value) -> Option<(u16, Value)> {
    if key.is_none() {
        return Some((
            403,
            error_body(
                403,
                "Method doesn't allow unregistered callers (callers without established \
                 identity). Please use API Key or other form of API consumer identity to call \
                 this API.",
                None,
            ),
        ));
    }
    let (field, what) = match method {
        Method::Generate | Method::Stream => ("contents", "GenerateContentRequest.contents"),
        // countTokens takes `contents` or a whole `generateContentRequest`.
        Method::CountTokens if request.get("generateContentRequest").is_some() => return None,
        Method::CountTokens => ("contents", "CountTokensRequest.contents"),
        Method::Embed => ("content", "EmbedContentRequest.content"),
        Method::BatchEmbed => ("requests", "BatchEmbedContentsRequest.requests"),
    };
    if request.get(field).is_some_and(|v| !v.is_null()) {
        return None;
    }
    Some((
        400,
        error_body(400, &format!("* {what}: {field} is not specified"), None),
    ))
}

fn thought_tokens(thinking: Option<&str>) -> u64 {
    answer::estimate_tokens(thinking.map_or(0, |t| t.chars().count()))
}

/// `usageMetadata`: the thoughts counted apart from the candidates, as Google counts them.
fn usage_metadata(answer: &Answer, thinking: Option<&str>) -> Value {
    let u = &answer.usage;
    let thoughts = thought_tokens(thinking);
    let mut usage = json!({
        "promptTokenCount": u.prompt_tokens,
        "candidatesTokenCount": u.completion_tokens,
        "totalTokenCount": u.prompt_tokens + u.completion_tokens + thoughts,
        "promptTokensDetails": [{ "modality": "TEXT", "tokenCount": u.prompt_tokens }],
    });
    if thoughts > 0 {
        usage["thoughtsTokenCount"] = json!(thoughts);
    }
    if u.cached_tokens > 0 {
        usage["cachedContentTokenCount"] = json!(u.cached_tokens);
    }
    usage
}

fn function_call(turn: &Turn, answer: &Answer, index: usize) -> Value {
    let call = &answer.tool_calls[index];
    let args = match serde_json::from_str::<Value>(&call.arguments_text()) {
        Ok(value @ Value::Object(_)) => value,
        _ => json!({}),
    };
    json!({ "functionCall": {
        "id": answer::tool_call_id(call, "call", turn.seq, index),
        "name": call.name,
        "args": args,
    }})
}

fn chunk(turn: &Turn, parts: Vec<Value>, finish: Option<&str>, usage: Option<Value>) -> Value {
    let mut candidate = json!({ "content": { "role": "model", "parts": parts }, "index": 0 });
    if let Some(finish) = finish {
        candidate["finishReason"] = json!(finish);
    }
    let mut out = json!({
        "candidates": [candidate],
        "modelVersion": turn.model,
        "responseId": format!("mock-gemini-{}", turn.seq),
    });
    if let Some(usage) = usage {
        out["usageMetadata"] = usage;
    }
    out
}

/// A unary `GenerateContentResponse`: the thought part, the text, the function calls.
pub fn unary(turn: &Turn, answer: &Answer, thinking: Option<&str>) -> Value {
    let mut parts = Vec::new();
    if let Some(thought) = thinking {
        parts.push(json!({ "text": thought, "thought": true }));
    }
    if let Some(text) = &answer.text {
        parts.push(json!({ "text": text }));
    }
    for index in 0..answer.tool_calls.len() {
        parts.push(function_call(turn, answer, index));
    }
    chunk(
        turn,
        parts,
        Some("STOP"),
        Some(usage_metadata(answer, thinking)),
    )
}

/// One chunk as a stream sends it: an SSE event, or a piece of the JSON array (opened by the
/// head's `[`, each chunk followed by `,`, the last chunk or the error closing it with `]`).
fn frame(value: &Value, sse: bool, last: bool) -> bytes::Bytes {
    bytes::Bytes::from(match (sse, last) {
        (true, _) => format!("data: {value}\r\n\r\n"),
        (false, false) => format!("{value}\r\n,"),
        (false, true) => format!("{value}\r\n]"),
    })
}

/// A streamed answer: the thought, each text chunk, each function call (whole, as Google
/// streams them), then the chunk with `finishReason` and `usageMetadata`; without `alt=sse`
/// the same chunks as one JSON array.
pub fn stream(turn: &Turn, answer: &Answer, thinking: Option<&str>, sse: bool) -> StreamPlan {
    let mut parts = Vec::new();
    if let Some(thought) = thinking {
        parts.push(json!({ "text": thought, "thought": true }));
    }
    parts.extend(answer.chunks.iter().map(|text| json!({ "text": text })));
    parts.extend((0..answer.tool_calls.len()).map(|index| function_call(turn, answer, index)));
    let content = parts
        .into_iter()
        .map(|part| Piece::content(frame(&chunk(turn, vec![part], None, None), sse, false)))
        .collect();
    let last = chunk(
        turn,
        vec![json!({ "text": "" })],
        Some("STOP"),
        Some(usage_metadata(answer, thinking)),
    );
    StreamPlan {
        head: if sse {
            Vec::new()
        } else {
            vec![bytes::Bytes::from_static(b"[")]
        },
        content,
        tail: vec![frame(&last, sse, true)],
        error_event: stream_error_event("An internal error has occurred.", sse),
    }
}

/// The streamed error object a failing stream ends with (`failWith: error-event`).
pub fn stream_error_event(message: &str, sse: bool) -> bytes::Bytes {
    frame(&error_body(500, message, None), sse, true)
}

/// `:countTokens`: the mock's prompt estimate.
pub fn count_tokens(turn: &Turn) -> Value {
    json!({
        "totalTokens": turn.prompt_tokens,
        "promptTokensDetails": [{ "modality": "TEXT", "tokenCount": turn.prompt_tokens }],
    })
}

fn text_of(content: Option<&Value>) -> String {
    content
        .and_then(|c| c.get("parts"))
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default()
}

fn embedding(reply: &Reply, request: &Value) -> Value {
    let dimensions = reply
        .dimensions
        .or_else(|| {
            request
                .get("outputDimensionality")
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| (1..=65_536).contains(n))
        })
        .unwrap_or(openai::DEFAULT_DIMENSIONS);
    let values = match &reply.embedding {
        Some(vector) => vector.clone(),
        None => openai::vector_for(&text_of(request.get("content")), dimensions),
    };
    json!({ "values": values })
}

/// `:embedContent` (`{"embedding":{"values"}}`) or `:batchEmbedContents`
/// (`{"embeddings":[{"values"}…]}`), one deterministic vector per content.
pub fn embed(method: Method, reply: &Reply, request: &Value) -> Value {
    if method == Method::BatchEmbed {
        let embeddings: Vec<Value> = request
            .get("requests")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|one| embedding(reply, one))
            .collect();
        return json!({ "embeddings": embeddings });
    }
    json!({ "embedding": embedding(reply, request) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::mock::script::{StreamSpec, ToolCall};
    use crate::mock::sse::{schedule, Step};

    fn turn() -> Turn {
        Turn {
            seq: 3,
            model: "gemini-mock".into(),
            prompt_tokens: 5,
            usage_requested: false,
        }
    }

    fn bytes(plan: StreamPlan, spec: &StreamSpec) -> String {
        schedule(plan, spec)
            .into_iter()
            .map(|step| match step {
                Step::Send { bytes, .. } => String::from_utf8_lossy(&bytes).into_owned(),
                Step::Abort { .. } => "!".into(),
            })
            .collect()
    }

    #[test]
    fn paths_name_the_model_and_method() {
        assert_eq!(
            of("/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
            Some(("gemini-2.5-pro".into(), Method::Stream))
        );
        assert_eq!(
            of("/v1beta/models/e:batchEmbedContents"),
            Some(("e".into(), Method::BatchEmbed))
        );
        assert_eq!(of("/v1beta/models/m:unknown"), None);
        assert_eq!(of("/v1/chat/completions"), None);
    }

    #[test]
    fn a_unary_answer_has_thought_text_calls_and_usage() {
        let reply = Reply {
            text: Some("hi".into()),
            thinking: Some("let me see".into()),
            tool_calls: vec![ToolCall {
                name: "f".into(),
                arguments: Some(json!({"a": 1})),
                ..ToolCall::default()
            }],
            ..Reply::default()
        };
        let body = unary(&turn(), &Answer::new(&reply, 5), reply.thinking.as_deref());
        let parts = &body["candidates"][0]["content"]["parts"];
        assert_eq!(parts[0], json!({"text": "let me see", "thought": true}));
        assert_eq!(parts[1], json!({"text": "hi"}));
        assert_eq!(parts[2]["functionCall"]["args"], json!({"a": 1}));
        assert_eq!(body["candidates"][0]["finishReason"], "STOP");
        assert_eq!(body["usageMetadata"]["promptTokenCount"], 5);
        assert_eq!(body["usageMetadata"]["thoughtsTokenCount"], 3);
    }

    #[test]
    fn a_json_array_stream_parses_whole_and_sse_events_each() {
        let answer = Answer::new(&Reply::default(), 5);
        let array = bytes(
            stream(&turn(), &answer, None, false),
            &StreamSpec::default(),
        );
        let chunks: Vec<Value> = serde_json::from_str(&array).unwrap();
        assert_eq!(chunks.len(), answer.chunks.len() + 1);
        assert_eq!(
            chunks.last().unwrap()["usageMetadata"]["promptTokenCount"],
            5
        );
        let sse_text = bytes(stream(&turn(), &answer, None, true), &StreamSpec::default());
        let events: Vec<Value> = sse_text
            .split("\r\n\r\n")
            .filter(|e| !e.is_empty())
            .map(|e| serde_json::from_str(e.trim_start_matches("data: ")).unwrap())
            .collect();
        assert_eq!(events, chunks);
    }

    #[test]
    fn a_failed_json_array_stream_still_parses_with_the_error_last() {
        let spec = StreamSpec {
            fail_after: Some(1),
            fail_with: Some(crate::mock::script::FailWith::ErrorEvent),
            ..StreamSpec::default()
        };
        let text = bytes(
            stream(&turn(), &Answer::new(&Reply::default(), 5), None, false),
            &spec,
        );
        let chunks: Vec<Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(chunks.last().unwrap()["error"]["status"], "INTERNAL");
    }

    #[test]
    fn errors_are_googles_with_retry_info_on_429() {
        let body = error_body(429, "slow down", Some(7));
        assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED");
        assert_eq!(body["error"]["details"][0]["retryDelay"], "7s");
        assert_eq!(
            error_body(403, "no", None)["error"]["status"],
            "PERMISSION_DENIED"
        );
        let listed = json!([{"error": {"code": 429}}]);
        assert_eq!(native_body(listed), json!({"error": {"code": 429}}));
        assert_eq!(refusal(Method::Generate, None, &json!({})).unwrap().0, 403);
        let (status, body) = refusal(Method::Generate, Some("k"), &json!({})).unwrap();
        assert_eq!(
            (status, body["error"]["status"].clone()),
            (400, json!("INVALID_ARGUMENT"))
        );
    }

    #[test]
    fn embeddings_per_content() {
        let request = json!({"requests": [
            {"model": "models/e", "content": {"parts": [{"text": "a"}]}},
            {"model": "models/e", "content": {"parts": [{"text": "b"}]}, "outputDimensionality": 4},
        ]});
        let body = embed(Method::BatchEmbed, &Reply::default(), &request);
        assert_eq!(body["embeddings"].as_array().unwrap().len(), 2);
        assert_eq!(body["embeddings"][1]["values"].as_array().unwrap().len(), 4);
        let one = embed(
            Method::Embed,
            &Reply::default(),
            &json!({"content": {"parts": [{"text": "a"}]}}),
        );
        assert_eq!(one["embedding"]["values"], body["embeddings"][0]["values"]);
    }
}
