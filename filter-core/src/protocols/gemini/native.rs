//! A Gemini caller served by a `kind: gemini` lane over Google's own API (not its
//! OpenAI-compatible endpoint): the caller's `GenerateContentRequest` as it wrote it, the lane's
//! model in the path, the provider key as `x-goog-api-key`; the answer passed back as it comes,
//! its usage read from `usageMetadata`. Pure functions, no host calls.
//!
//! A stream is asked as SSE (`alt=sse`), which the stream gate reads; a caller of the JSON-array
//! stream (`:streamGenerateContent` without `alt=sse`) is served through the translation.

use serde_json::{Map, Value};

use crate::classify::{classify_stream_error, failure::Failure};
use crate::vocab::Usage;

/// Whether a Gemini call goes to a lane of `kind` natively: a gemini lane, unless the caller
/// reads the JSON-array stream.
pub fn serves(kind: ai_router_proto::v1::ProviderKind, json_array: bool) -> bool {
    kind == ai_router_proto::v1::ProviderKind::Gemini && !json_array
}

/// The base of Google's own API for a provider base path: Gemini's OpenAI-compatible endpoint
/// (`/v1beta/openai`) lives under it.
fn api_base(base_path: &str) -> &str {
    let base = base_path.trim_end_matches('/');
    base.strip_suffix("/openai").unwrap_or(base)
}

/// The Gemini method a native call asks: an embedding (`:embedContent`,
/// `:batchEmbedContents`), a count (`:countTokens`) or a generation (`?alt=sse` on a stream).
pub fn method(embeddings: bool, count: bool, stream: bool, body: &Value) -> &'static str {
    match (embeddings, count, stream) {
        (true, _, _) => crate::protocols::gemini::embed::method(body),
        (_, true, _) => "countTokens",
        (_, _, true) => "streamGenerateContent?alt=sse",
        _ => "generateContent",
    }
}

/// The provider path of a call of `method` for `model`.
pub fn path(base_path: &str, model: &str, method: &str) -> String {
    format!("{}/models/{model}:{method}", api_base(base_path))
}

/// The body a gemini lane is sent: the caller's, everything kept (fields the gateway does not
/// know included) but `model`, which the path names; the models a body names inside (each
/// request of a batch embedding, a count's `generateContentRequest`) name the lane's `model`,
/// as Google requires them to match the path.
pub fn request(caller: &Value, model: &str) -> Value {
    let mut body = caller.clone();
    let name = Value::String(format!("models/{model}"));
    if let Some(fields) = body.as_object_mut() {
        fields.remove("model");
        if let Some(Value::Array(requests)) = fields.get_mut("requests") {
            for one in requests.iter_mut().filter_map(Value::as_object_mut) {
                one.insert("model".into(), name.clone());
            }
        }
        if let Some(Value::Object(inner)) = fields.get_mut("generateContentRequest") {
            inner.insert("model".into(), name);
        }
    }
    body
}

/// What the front stage routes a Gemini call by when its body cannot be translated (it asks
/// what only Google runs: a hosted tool, cached contents, a non-text embedding): the body's
/// text as one message (or input), so the estimates see its size.
pub fn routing_view(model: &str, stream: bool, embeddings: bool, body: &Value) -> Value {
    let text = body.to_string();
    match embeddings {
        true => serde_json::json!({ "model": model, "input": [text] }),
        false => serde_json::json!({ "model": model, "stream": stream,
                                     "messages": [{ "role": "user", "content": text }] }),
    }
}

/// The tiers cut down to the lanes that take a Gemini call natively (a request no translation
/// can carry), each other candidate noted in the trail with reason `adapter`; `false` when
/// none is left.
pub fn keep_native(
    state: &crate::state::State,
    tiers: &mut Vec<Vec<crate::plan::Candidate>>,
    trail: &mut crate::answer::trail::Trail,
    json_array: bool,
) -> bool {
    for tier in tiers.iter_mut() {
        tier.retain(|c| {
            let native = state
                .provider(&c.provider)
                .is_some_and(|(_, p)| serves(p.kind(), json_array));
            if !native {
                trail.skip(&c.provider, "", &c.model, "adapter");
            }
            native
        });
    }
    tiers.retain(|t| !t.is_empty());
    !tiers.is_empty()
}

/// Usage from `usageMetadata`: thoughts count as output, as Google bills them.
pub fn usage(metadata: &Value) -> Option<Usage> {
    let fields = metadata.as_object()?;
    let get = |name: &str| fields.get(name).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        prompt_tokens: get("promptTokenCount"),
        completion_tokens: get("candidatesTokenCount") + get("thoughtsTokenCount"),
        cached_tokens: get("cachedContentTokenCount"),
    })
}

/// How one `GenerateContentResponse` chunk of a native stream counts.
#[derive(Debug, Default, PartialEq)]
pub struct Chunk {
    /// It carries the answer (text that is not a thought, a function call, or the end).
    pub token: bool,
    /// A candidate finished (`finishReason`).
    pub done: bool,
    pub error: Option<Failure>,
}

/// Judges one stream chunk; its `usageMetadata` (the latest is the whole) goes to `usage`.
pub fn judge(
    kind: &str,
    daily_reset: Option<ai_router_contract::kinds::DailyReset>,
    chunk: &Value,
    usage: &mut Map<String, Value>,
    now_ms: i64,
) -> Chunk {
    if chunk.get("error").is_some_and(|e| !e.is_null()) {
        return Chunk {
            error: Some(classify_stream_error(kind, daily_reset, chunk, now_ms)),
            ..Chunk::default()
        };
    }
    if let Some(Value::Object(metadata)) = chunk.get("usageMetadata") {
        usage.clone_from(metadata);
    }
    let candidate = chunk.pointer("/candidates/0").unwrap_or(&Value::Null);
    let done = candidate
        .get("finishReason")
        .and_then(Value::as_str)
        .is_some_and(|r| !r.is_empty());
    let answered = candidate
        .pointer("/content/parts")
        .and_then(Value::as_array)
        .is_some_and(|parts| {
            parts.iter().any(|part| {
                let thought = part.get("thought").and_then(Value::as_bool) == Some(true);
                let text = part
                    .get("text")
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.is_empty());
                (text && !thought) || part.get("functionCall").is_some()
            })
        });
    Chunk {
        token: answered || done,
        done,
        error: None,
    }
}

/// The event that ends a native stream broken after its first token: Google's error object.
pub fn error_event(message: &str) -> Vec<u8> {
    let code = ai_router_contract::error_code::ErrorCode::StreamInterrupted;
    let body = crate::protocols::gemini::errors::error_body(code.status(), code.as_str(), message);
    format!("data: {body}\r\n\r\n").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_path_is_googles_own_api_under_the_openai_endpoints_base() {
        let body = json!({});
        assert_eq!(
            path(
                "/v1beta/openai",
                "gemini-2.5-flash",
                method(false, false, false, &body)
            ),
            "/v1beta/models/gemini-2.5-flash:generateContent"
        );
        assert_eq!(
            path("/v1beta/openai/", "m", method(false, false, true, &body)),
            "/v1beta/models/m:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            path("/gemini/v1beta", "m", method(false, true, false, &body)),
            "/gemini/v1beta/models/m:countTokens"
        );
        let batch = json!({"requests": []});
        assert_eq!(method(true, false, false, &batch), "batchEmbedContents");
        assert_eq!(method(true, false, false, &body), "embedContent");
    }

    #[test]
    fn the_callers_body_goes_whole_but_its_model() {
        let caller = json!({"model": "alias", "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                            "safetySettings": [{"category": "x"}], "someNewField": {"a": 1},
                            "cachedContent": "cachedContents/abc"});
        let sent = request(&caller, "lane-m");
        assert_eq!(sent.get("model"), None);
        assert_eq!(sent["someNewField"], json!({"a": 1}));
        assert_eq!(sent["safetySettings"], caller["safetySettings"]);
        assert_eq!(sent["cachedContent"], caller["cachedContent"]);
    }

    #[test]
    fn the_models_a_body_names_inside_name_the_lanes() {
        let batch = json!({"requests": [{"model": "models/alias", "content": {"parts": []},
                                         "taskType": "RETRIEVAL_QUERY"}]});
        let sent = request(&batch, "lane-m");
        assert_eq!(sent["requests"][0]["model"], "models/lane-m");
        assert_eq!(sent["requests"][0]["taskType"], "RETRIEVAL_QUERY");
        let count = json!({"generateContentRequest": {"model": "models/alias", "contents": []}});
        let sent = request(&count, "lane-m");
        assert_eq!(sent["generateContentRequest"]["model"], "models/lane-m");
    }

    #[test]
    fn usage_counts_thoughts_as_output_and_the_cache() {
        let u = usage(&json!({"promptTokenCount": 10, "candidatesTokenCount": 4,
                              "thoughtsTokenCount": 6, "cachedContentTokenCount": 3,
                              "totalTokenCount": 20}))
        .unwrap_or_default();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cached_tokens),
            (10, 10, 3)
        );
        assert!(usage(&Value::Null).is_none());
    }

    #[test]
    fn a_thought_is_not_the_first_token_text_and_calls_are() {
        let mut u = Map::new();
        let thought =
            json!({"candidates": [{"content": {"parts": [{"text": "hm", "thought": true}]}}]});
        assert!(!judge("gemini", None, &thought, &mut u, 0).token);
        let text = json!({"candidates": [{"content": {"parts": [{"text": "Hi"}]}}]});
        assert!(judge("gemini", None, &text, &mut u, 0).token);
        let call =
            json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": "f"}}]}}]});
        assert!(judge("gemini", None, &call, &mut u, 0).token);
        let last = json!({"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP"}],
                          "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 3}});
        let judged = judge("gemini", None, &last, &mut u, 0);
        assert!(judged.token && judged.done);
        assert_eq!(u.get("promptTokenCount"), Some(&json!(2)));
        let error = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "slow",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "5s"}]}});
        let failed = judge("gemini", None, &error, &mut u, 0).error;
        assert_eq!(
            failed.map(|f| f.class),
            Some(ai_router_contract::failure::ErrorClass::RateLimit)
        );
    }
}
