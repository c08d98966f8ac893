//! Google's error object and model entries.

use serde_json::{json, Value};

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
    let parts = crate::protocols::messages::errors::OpenAiError::read(status, openai);
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
