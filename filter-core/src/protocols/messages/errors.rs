//! The Anthropic error object, for a gateway error and for an OpenAI-shaped provider error.

use serde_json::{json, Value};

/// The Anthropic error `type` for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// `{"type":"error","error":{"type","message","code"}}`: the Anthropic shape, with the
/// gateway's code (`contract::error_code`) alongside, which Anthropic clients ignore.
pub fn error_body(status: u16, code: &str, message: &str) -> Value {
    json!({
        "type": "error",
        "error": { "type": error_type(status), "message": message, "code": code },
    })
}

/// The `error` event that ends a Messages stream which broke after its first token.
pub fn stream_error(message: &str) -> Value {
    error_body(
        502,
        ai_router_contract::error_code::ErrorCode::StreamInterrupted.as_str(),
        message,
    )
}

/// A gateway error body (OpenAI shape) re-dressed in the Anthropic shape.
pub fn error_from_openai(status: u16, openai: &[u8]) -> Vec<u8> {
    let parts = OpenAiError::read(status, openai);
    error_body(status, &parts.code, &parts.message)
        .to_string()
        .into_bytes()
}

/// What another shape keeps of a gateway error body (OpenAI's shape).
pub(crate) struct OpenAiError {
    pub message: String,
    pub code: String,
    /// `error.trail`, when the body has one.
    pub trail: Option<Value>,
}

impl OpenAiError {
    pub fn read(status: u16, openai: &[u8]) -> Self {
        let parsed: Value = serde_json::from_slice(openai).unwrap_or(Value::Null);
        let text = |p: &str| {
            parsed
                .pointer(p)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        Self {
            message: text("/error/message")
                .unwrap_or_else(|| format!("The gateway answered with status {status}.")),
            code: text("/error/code").unwrap_or_else(|| "gateway_error".to_string()),
            trail: parsed.pointer("/error/trail").cloned(),
        }
    }
}
