//! What a provider's error body says, whatever its shape: the fields the rules read, and the
//! message's words as the tables match them.

use serde_json::Value;

use super::when::parse_reset_duration;

/// What a provider's error object says, across the shapes providers use: `{"error":{...}}`,
/// `{"error":"text"}`, `[{"error":{...}}]` (Gemini), `{"type":"error","error":{...}}`
/// (Anthropic), `{"code":"...","message":"..."}` (DashScope).
#[derive(Debug, Default, Clone)]
pub(super) struct ErrorFields {
    /// `error.code`.
    pub(super) code: Option<String>,
    /// `error.type`, else Google's `error.status`.
    pub(super) kind: Option<String>,
    pub(super) message: String,
    /// Google's QuotaFailure violations' `quotaId`s (`GenerateRequestsPerDay...`).
    pub(super) quota_ids: Vec<String>,
    /// Google's ErrorInfo `reason`s (`API_KEY_INVALID`).
    pub(super) reasons: Vec<String>,
    /// Google's RetryInfo `retryDelay`, in ms.
    pub(super) retry_delay_ms: Option<i64>,
    /// `X-RateLimit-Reset` among the headers the error carries (OpenRouter's
    /// `error.metadata.headers`).
    pub(super) reset: Option<String>,
}

pub(super) fn error_fields(body: &Value) -> ErrorFields {
    let body = match body {
        Value::Array(items) => items.first().unwrap_or(&Value::Null),
        other => other,
    };
    // Cloudflare's API envelope: `{"errors": [{"code", "message"}], "success": false}`.
    let body = match body.get("errors").and_then(Value::as_array) {
        Some(errors) if body.get("error").is_none() => errors.first().unwrap_or(&Value::Null),
        _ => body,
    };
    let obj = match body.get("error") {
        Some(e @ Value::Object(_)) => e,
        Some(Value::String(s)) => {
            return ErrorFields {
                message: s.clone(),
                ..ErrorFields::default()
            }
        }
        _ => body,
    };
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let mut fields = ErrorFields {
        code: text(obj.get("code")),
        kind: text(obj.get("type")).or_else(|| text(obj.get("status"))),
        // RFC 7807 problem details (NVIDIA's gateway) carry `detail` and `title`.
        message: text(obj.get("message"))
            .or_else(|| text(obj.get("detail")))
            .or_else(|| text(obj.get("title")))
            .unwrap_or_default(),
        ..ErrorFields::default()
    };
    for detail in obj
        .get("details")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = detail.get("@type").and_then(Value::as_str).unwrap_or("");
        if kind.ends_with("google.rpc.QuotaFailure") {
            let violations = detail.get("violations").and_then(Value::as_array);
            fields.quota_ids.extend(
                violations
                    .into_iter()
                    .flatten()
                    .filter_map(|v| text(v.get("quotaId"))),
            );
        } else if kind.ends_with("google.rpc.RetryInfo") {
            fields.retry_delay_ms = text(detail.get("retryDelay"))
                .and_then(|d| parse_reset_duration(&d))
                .or(fields.retry_delay_ms);
        }
        // ErrorInfo, and the bare `{"reason": ...}` some answers carry.
        if let Some(reason) = text(detail.get("reason")) {
            fields.reasons.push(reason);
        }
    }
    if let Some(Value::Object(headers)) = obj.get("metadata").and_then(|m| m.get("headers")) {
        fields.reset = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("x-ratelimit-reset"))
            .and_then(|(_, v)| text(Some(v)));
    }
    fields
}

pub(super) fn contains_any(haystack: &str, needles: &[&str]) -> bool {
    needles.iter().any(|n| haystack.contains(n))
}

/// The message without its URLs: a link to a billing page does not make a rate limit a quota.
pub(super) fn words_without_urls(message: &str) -> String {
    message
        .split_whitespace()
        .filter(|w| !w.contains("://"))
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_lowercase()
}
