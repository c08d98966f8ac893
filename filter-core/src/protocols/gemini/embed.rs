//! Gemini's embeddings methods, `:embedContent` (one `EmbedContentRequest`) and
//! `:batchEmbedContents` (`{"requests":[EmbedContentRequest…]}`). Pure functions, no host calls:
//!
//! - to a `kind: gemini` lane the caller's body goes natively (`native.rs`), each request's
//!   `model` naming the lane's model;
//! - to an OpenAI-compatible lane, [`to_openai`] makes the `/v1/embeddings` request (one input
//!   per content, its text parts joined) and [`from_openai`] answers in Google's shape
//!   (`{"embedding":{"values"}}`, `{"embeddings":[{"values"}…]}`).
//!
//! What the translation does with each field (docs/protocols.md lists the same): `content`'s
//! text parts become the input; `outputDimensionality` becomes `dimensions` (one value for the
//! whole batch); `taskType` and `title` have no counterpart and are dropped; a part that is not
//! text (an image, a file) is refused, naming `content`.

use serde_json::{json, Value};

use crate::protocols::anthropic::error::AdapterError;

/// The Gemini method a body of the batch form (`requests`) or the single form calls.
pub fn method(body: &Value) -> &'static str {
    match is_batch(body) {
        true => "batchEmbedContents",
        false => "embedContent",
    }
}

/// Whether a body is the batch form (`{"requests":[…]}`).
pub fn is_batch(body: &Value) -> bool {
    body.get("requests").is_some()
}

/// The caller's embed requests: the batch's, or the single one.
fn requests(body: &Value) -> Vec<&Value> {
    match body.get("requests") {
        Some(Value::Array(items)) => items.iter().collect(),
        Some(_) => Vec::new(),
        None => vec![body],
    }
}

/// The text of one request's `content` (its text parts joined), or the refusal naming it.
fn text_of(request: &Value, index: usize) -> Result<String, AdapterError> {
    let Some(parts) = request.pointer("/content/parts").and_then(Value::as_array) else {
        return Err(AdapterError::new(
            "content",
            format!("requests[{index}].content must be a Content with parts."),
        ));
    };
    let mut text = Vec::new();
    for part in parts {
        match part.get("text").and_then(Value::as_str) {
            Some(t) => text.push(t),
            None => {
                return Err(AdapterError::new(
                    "content",
                    format!(
                        "requests[{index}].content has a part that is not text; only text is \
                         embedded by this model's provider."
                    ),
                ))
            }
        }
    }
    Ok(text.join(""))
}

/// A Gemini embed body (`batch`: the `:batchEmbedContents` form) -> `/v1/embeddings` for
/// `model`.
pub fn to_openai(model: &str, body: &Value) -> Result<Value, AdapterError> {
    if !body.is_object() {
        return Err(AdapterError::not_an_object());
    }
    let requests = requests(body);
    if requests.is_empty() {
        return Err(AdapterError::new(
            "requests",
            "requests must be a non-empty array of EmbedContentRequest.",
        ));
    }
    let input = requests
        .iter()
        .enumerate()
        .map(|(i, r)| text_of(r, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut dimensions = requests
        .iter()
        .map(|r| r.get("outputDimensionality").and_then(Value::as_u64));
    let first = dimensions.next().flatten();
    if dimensions.any(|d| d != first) {
        return Err(AdapterError::new(
            "outputDimensionality",
            "outputDimensionality must be the same for every request of a batch on this \
             model's provider.",
        ));
    }
    let mut out = json!({ "model": model, "input": input, "encoding_format": "float" });
    if let Some(d) = first {
        out["dimensions"] = json!(d);
    }
    Ok(out)
}

/// A `/v1/embeddings` answer -> Google's: one `ContentEmbedding` per input, in input order
/// (`index`), as `embedding` for `:embedContent` or `embeddings` for the batch (`caller`: the
/// caller's Gemini body).
pub fn from_openai(answer: &Value, caller: &Value) -> Value {
    let mut data: Vec<&Value> = answer
        .get("data")
        .and_then(Value::as_array)
        .map(|d| d.iter().collect())
        .unwrap_or_default();
    data.sort_by_key(|d| d.get("index").and_then(Value::as_u64).unwrap_or(0));
    let values: Vec<Value> = data
        .iter()
        .map(|d| json!({ "values": d.get("embedding").cloned().unwrap_or(json!([])) }))
        .collect();
    match is_batch(caller) {
        true => json!({ "embeddings": values }),
        false => json!({ "embedding": values.into_iter().next().unwrap_or(json!({"values": []})) }),
    }
}

/// Whether a chat-protocol answer is an embeddings list (`/v1/embeddings`).
pub fn is_embeddings_answer(answer: &Value) -> bool {
    answer.get("object").and_then(Value::as_str) == Some("list") && answer.get("data").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_request_becomes_one_input_and_comes_back_as_embedding() {
        let caller = json!({"model": "models/e", "content": {"parts": [{"text": "a"}, {"text": "b"}]},
                            "taskType": "RETRIEVAL_QUERY", "title": "t", "outputDimensionality": 4});
        assert_eq!(method(&caller), "embedContent");
        let sent = to_openai("te3", &caller).unwrap_or_default();
        assert_eq!(
            sent,
            json!({"model": "te3", "input": ["ab"], "encoding_format": "float", "dimensions": 4})
        );
        let answer = json!({"object": "list", "data": [{"index": 0, "embedding": [0.5, 0.25]}],
                            "usage": {"prompt_tokens": 2, "total_tokens": 2}});
        assert!(is_embeddings_answer(&answer));
        assert_eq!(
            from_openai(&answer, &caller),
            json!({"embedding": {"values": [0.5, 0.25]}})
        );
    }

    #[test]
    fn a_batch_keeps_its_order_and_one_dimension() {
        let caller = json!({"requests": [
            {"model": "models/e", "content": {"parts": [{"text": "x"}]}},
            {"model": "models/e", "content": {"parts": [{"text": "y"}]}}]});
        assert_eq!(method(&caller), "batchEmbedContents");
        let sent = to_openai("te3", &caller).unwrap_or_default();
        assert_eq!(sent["input"], json!(["x", "y"]));
        assert!(sent.get("dimensions").is_none());
        let answer = json!({"object": "list", "data": [{"index": 1, "embedding": [2.0]},
                                                        {"index": 0, "embedding": [1.0]}]});
        assert_eq!(
            from_openai(&answer, &caller),
            json!({"embeddings": [{"values": [1.0]}, {"values": [2.0]}]})
        );
        let mixed = json!({"requests": [
            {"content": {"parts": [{"text": "x"}]}, "outputDimensionality": 4},
            {"content": {"parts": [{"text": "y"}]}}]});
        let err = to_openai("te3", &mixed).err().map(|e| e.param);
        assert_eq!(err, Some(Some("outputDimensionality")));
    }

    #[test]
    fn what_is_not_text_is_refused_naming_content() {
        let caller = json!({"content": {"parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}});
        let err = to_openai("te3", &caller).err();
        assert_eq!(err.map(|e| e.param), Some(Some("content")));
        assert!(to_openai("te3", &json!({"requests": []})).is_err());
    }
}
