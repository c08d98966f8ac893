//! Classification of a provider's answer: what failed, whether another lane should be tried,
//! and what it means for the key (cooldown, blacklist) — per provider kind, from the status and
//! the error body.

use serde_json::Value;

/// Why an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    RateLimit,
    Quota,
    Auth,
    Transient,
    Network,
    Timeout,
    Stream,
    InvalidRequest,
    Cancelled,
    Deadline,
    /// A well-formed answer that is not what the call needs (embeddings of another length):
    /// the call tries another lane, but the lane is not failing, so no breaker counts it.
    Mismatch,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::RateLimit => "rate_limit",
            Class::Quota => "quota",
            Class::Auth => "auth",
            Class::Transient => "transient",
            Class::Network => "network",
            Class::Timeout => "timeout",
            Class::Stream => "stream",
            Class::InvalidRequest => "invalid_request",
            Class::Cancelled => "cancelled",
            Class::Deadline => "deadline",
            Class::Mismatch => "mismatch",
        }
    }

    pub fn parse(s: &str) -> Option<Class> {
        Some(match s {
            "rate_limit" => Class::RateLimit,
            "quota" => Class::Quota,
            "auth" => Class::Auth,
            "transient" => Class::Transient,
            "network" => Class::Network,
            "timeout" => Class::Timeout,
            "stream" => Class::Stream,
            "invalid_request" => Class::InvalidRequest,
            "cancelled" => Class::Cancelled,
            "deadline" => Class::Deadline,
            "mismatch" => Class::Mismatch,
            _ => return None,
        })
    }

    /// Whether another attempt may succeed where this one failed.
    pub fn retryable(self) -> bool {
        !matches!(
            self,
            Class::InvalidRequest | Class::Cancelled | Class::Deadline
        )
    }

    /// Failures that belong to one key: the next key is tried without backoff.
    pub fn belongs_to_key(self) -> bool {
        matches!(self, Class::RateLimit | Class::Quota | Class::Auth)
    }
}

/// A classified failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub class: Class,
    /// When the provider said to come back (ms since the epoch).
    pub retry_at_ms: Option<i64>,
    /// The provider's own error code or type, when it sent one.
    pub provider_code: Option<String>,
    /// The provider's message (for upstream_invalid_request).
    pub message: String,
    pub status: u16,
}

/// `retry-after-ms`, else `retry-after` (seconds or an HTTP date is not parsed: seconds only),
/// else the OpenAI-style reset headers are left to headroom logic.
pub fn retry_at(headers: &[(String, String)], now_ms: i64) -> Option<i64> {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms >= 0.0 {
            return Some(now_ms + ms.ceil() as i64);
        }
    }
    if let Some(s) = get("retry-after").and_then(|v| v.parse::<f64>().ok()) {
        if s >= 0.0 {
            return Some(now_ms + (s * 1000.0).ceil() as i64);
        }
    }
    None
}

/// The error object's code, type and message, across the shapes providers use:
/// `{"error":{...}}`, `{"error":"text"}`, `[{"error":{...}}]` (Gemini), `{"type":"error",
/// "error":{...}}` (Anthropic), `{"code":"...","message":"..."}` (DashScope).
fn error_fields(body: &Value) -> (Option<String>, Option<String>, String) {
    let body = match body {
        Value::Array(items) => items.first().unwrap_or(&Value::Null),
        other => other,
    };
    let obj = match body.get("error") {
        Some(e @ Value::Object(_)) => e,
        Some(Value::String(s)) => return (None, None, s.clone()),
        _ => body,
    };
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let code = text(obj.get("code"));
    let kind = text(obj.get("type")).or_else(|| text(obj.get("status")));
    let message = text(obj.get("message")).unwrap_or_default();
    (code, kind, message)
}

fn contains_any(haystack: &str, needles: &[&str]) -> bool {
    needles.iter().any(|n| haystack.contains(n))
}

const QUOTA_CODES: &[&str] = &[
    "insufficient_quota",
    "billing_error",
    "billing_hard_limit_reached",
    "arrearage",
    "insufficient_balance",
    "insufficient_credits",
    "payment_required",
    "quota_exceeded",
    "credit_balance_too_low",
];
const QUOTA_TEXT: &[&str] = &[
    "exceeded your current quota",
    "insufficient balance",
    "insufficient credits",
    "credit balance is too low",
    "billing",
    "spend limit",
    "spending limit",
    "arrearage",
    "payment required",
    "out of credits",
    "free-models-per-day",
    "quota exceeded for",
    "daily limit",
    "api usage limits",
    "usage limit",
];
/// Refusals of the key itself that some providers send with a 400.
const AUTH_TEXT: &[&str] = &[
    "api key not valid",
    "api_key_invalid",
    "invalid api key",
    "incorrect api key",
    "invalid x-api-key",
];
const AUTH_CODES: &[&str] = &[
    "invalid_api_key",
    "authentication_error",
    "permission_error",
    "invalidapikey",
    "unauthenticated",
    "permission_denied",
    "invalid_authentication",
    "api_key_invalid",
    "accessdenied",
];
const RATE_CODES: &[&str] = &[
    "rate_limit_exceeded",
    "rate_limit_error",
    "throttling",
    "rate_limited",
];
const OVERLOAD_CODES: &[&str] = &[
    "overloaded_error",
    "server_error",
    "unavailable",
    "internal",
];

/// Classifies a provider's non-success answer (or a 2xx answer carrying an error object).
pub fn classify(
    kind: &str,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    now_ms: i64,
) -> Failure {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (code, kind_field, message) = error_fields(&parsed);
    let lower = |s: &Option<String>| s.as_deref().unwrap_or("").to_ascii_lowercase();
    let code_l = lower(&code);
    let type_l = lower(&kind_field);
    let msg_l = message.to_ascii_lowercase();
    let tokens = [code_l.as_str(), type_l.as_str()];
    let has_code = |set: &[&str]| tokens.iter().any(|t| !t.is_empty() && set.contains(t));

    let quota = has_code(QUOTA_CODES) || contains_any(&msg_l, QUOTA_TEXT);
    let raw_l = String::from_utf8_lossy(body).to_ascii_lowercase();
    let auth = has_code(AUTH_CODES)
        || contains_any(&msg_l, AUTH_TEXT)
        || raw_l.contains("api_key_invalid");
    let rate = has_code(RATE_CODES);
    // Gemini says RESOURCE_EXHAUSTED for both rate limits and spent quotas; the message tells.
    let gemini_exhausted = type_l == "resource_exhausted";

    let class = match status {
        402 => Class::Quota,
        401 | 403 => {
            if quota && kind != "openai" {
                Class::Quota
            } else {
                Class::Auth
            }
        }
        429 => {
            if quota || (gemini_exhausted && msg_l.contains("quota") && msg_l.contains("per day")) {
                Class::Quota
            } else {
                Class::RateLimit
            }
        }
        408 | 409 | 425 | 498 | 529 => Class::Transient,
        500..=599 => Class::Transient,
        400..=499 => {
            if quota {
                Class::Quota
            } else if auth {
                Class::Auth
            } else if rate {
                Class::RateLimit
            } else {
                Class::InvalidRequest
            }
        }
        _ => {
            // A 2xx (or odd) answer that carries an error object.
            if quota {
                Class::Quota
            } else if auth {
                Class::Auth
            } else if rate {
                Class::RateLimit
            } else if has_code(OVERLOAD_CODES) {
                Class::Transient
            } else {
                Class::Stream
            }
        }
    };
    let window_end = if class == Class::Quota {
        regain_access_at(&message)
    } else {
        None
    };
    Failure {
        class,
        retry_at_ms: retry_at(headers, now_ms).or(window_end),
        provider_code: code.or(kind_field),
        message,
        status,
    }
}

/// The end of a spent quota's window when the message names it, as Anthropic's spend cap does:
/// "... You will regain access on 2026-12-01 at 00:00 UTC."
fn regain_access_at(message: &str) -> Option<i64> {
    let rest = &message[message.find("regain access on ")? + "regain access on ".len()..];
    let date = rest.get(..10)?;
    let time = rest.get(10..)?.strip_prefix(" at ")?.get(..5)?;
    let num = |s: &str| s.parse::<i64>().ok();
    let (y, m, d) = (
        num(date.get(..4)?)?,
        num(date.get(5..7)?)?,
        num(date.get(8..10)?)?,
    );
    let (hh, mm) = (num(time.get(..2)?)?, num(time.get(3..5)?)?);
    Some((days_from_civil(y, m, d) * 86_400 + hh * 3_600 + mm * 60) * 1000)
}

/// `YYYY-MM-DDTHH:MM:SS[.fff]Z` (UTC only) as ms since the epoch.
fn parse_rfc3339(v: &str) -> Option<i64> {
    let v = v.trim();
    let num = |s: Option<&str>| s.and_then(|s| s.parse::<i64>().ok());
    let (y, mo, d) = (num(v.get(..4))?, num(v.get(5..7))?, num(v.get(8..10))?);
    if !matches!(v.get(10..11), Some("T" | "t" | " ")) {
        return None;
    }
    let (h, mi, sec) = (
        num(v.get(11..13))?,
        num(v.get(14..16))?,
        num(v.get(17..19))?,
    );
    let rest = v.get(19..)?;
    let (frac, zone) = match rest.strip_prefix('.') {
        Some(r) => {
            let digits = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            let ms = r
                .get(..digits.min(3))
                .filter(|d| !d.is_empty())
                .and_then(|d| d.parse::<i64>().ok())
                .unwrap_or(0);
            let scale = [100, 10, 1][digits.clamp(1, 3) - 1];
            (ms * scale, &r[digits..])
        }
        None => (0, rest),
    };
    if !(zone == "Z" || zone == "z" || zone == "+00:00") {
        return None;
    }
    Some((days_from_civil(y, mo, d) * 86_400 + h * 3_600 + mi * 60 + sec) * 1000 + frac)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Classifies an error object received inside a stream (before or after the first token).
pub fn classify_stream_error(kind: &str, event: &Value, now_ms: i64) -> Failure {
    let bytes = event.to_string().into_bytes();
    let mut failure = classify(kind, 200, &[], &bytes, now_ms);
    if let Some(status) = event
        .get("error")
        .and_then(|e| e.get("code"))
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
    {
        if (400..=599).contains(&status) {
            let again = classify(kind, status, &[], &bytes, now_ms);
            failure.class = again.class;
        }
    }
    if failure.class == Class::InvalidRequest {
        // A stream that breaks off with an error is a broken stream unless it says otherwise.
        failure.class = Class::Stream;
    }
    failure
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(kind: &str, status: u16, body: &str) -> Class {
        classify(kind, status, &[], body.as_bytes(), 0).class
    }

    #[test]
    fn statuses() {
        assert_eq!(
            c(
                "openai",
                429,
                r#"{"error":{"code":"rate_limit_exceeded","message":"Rate limit reached"}}"#
            ),
            Class::RateLimit
        );
        assert_eq!(
            c("openai", 401, r#"{"error":{"code":"invalid_api_key"}}"#),
            Class::Auth
        );
        assert_eq!(c("openai", 403, ""), Class::Auth);
        assert_eq!(c("openai", 503, ""), Class::Transient);
        assert_eq!(
            c(
                "anthropic",
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            ),
            Class::Transient
        );
        for s in [408, 409, 425, 498, 500, 502, 504] {
            assert_eq!(c("openai-compatible", s, ""), Class::Transient, "{s}");
        }
        assert_eq!(
            c(
                "openai",
                400,
                r#"{"error":{"message":"context length exceeded","code":"context_length_exceeded"}}"#
            ),
            Class::InvalidRequest
        );
        assert_eq!(c("openai", 404, ""), Class::InvalidRequest);
        assert_eq!(c("openai", 422, ""), Class::InvalidRequest);
    }

    #[test]
    fn quota_shapes() {
        assert_eq!(
            c(
                "openai",
                429,
                r#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}"#
            ),
            Class::Quota
        );
        assert_eq!(
            c(
                "openrouter",
                402,
                r#"{"error":{"code":402,"message":"Insufficient credits"}}"#
            ),
            Class::Quota
        );
        assert_eq!(
            c(
                "deepseek",
                402,
                r#"{"error":{"message":"Insufficient Balance"}}"#
            ),
            Class::Quota
        );
        assert_eq!(
            c(
                "qwen",
                400,
                r#"{"code":"Arrearage","message":"Access denied, please make sure your account is in good standing."}"#
            ),
            Class::Quota
        );
        assert_eq!(
            c(
                "anthropic",
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#
            ),
            Class::Quota
        );
        assert_eq!(
            c(
                "gemini",
                429,
                r#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"Quota exceeded for metric generate_content_free_tier_requests, limit per day"}}]"#
            ),
            Class::Quota
        );
        assert_eq!(
            c(
                "gemini",
                429,
                r#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"Resource has been exhausted (e.g. check quota)."}}]"#
            ),
            Class::RateLimit
        );
    }

    #[test]
    fn second_shapes() {
        let spend_cap = r#"{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits. You will regain access on 2026-12-01 at 00:00 UTC."}}"#;
        let f = classify("anthropic", 400, &[], spend_cap.as_bytes(), 0);
        assert_eq!(f.class, Class::Quota);
        assert_eq!(f.retry_at_ms, Some(1_796_083_200_000));
        let gemini = r#"[{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"}]}}]"#;
        assert_eq!(c("gemini", 400, gemini), Class::Auth);
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn auth_in_4xx_body() {
        assert_eq!(
            c(
                "qwen",
                400,
                r#"{"code":"InvalidApiKey","message":"Invalid API-key provided."}"#
            ),
            Class::Auth
        );
    }

    #[test]
    fn retry_after_headers() {
        let h = vec![("Retry-After".to_string(), "2".to_string())];
        assert_eq!(retry_at(&h, 1000), Some(3000));
        let h = vec![
            ("retry-after-ms".to_string(), "250".to_string()),
            ("retry-after".to_string(), "9".to_string()),
        ];
        assert_eq!(retry_at(&h, 1000), Some(1250));
        assert_eq!(retry_at(&[], 1000), None);
    }

    #[test]
    fn stream_error_events() {
        let e: Value =
            serde_json::from_str(r#"{"error":{"message":"overloaded","type":"server_error"}}"#)
                .unwrap();
        assert_eq!(
            classify_stream_error("openai", &e, 0).class,
            Class::Transient
        );
        let e: Value = serde_json::from_str(r#"{"error":{"message":"boom"}}"#).unwrap();
        assert_eq!(classify_stream_error("openai", &e, 0).class, Class::Stream);
        let e: Value =
            serde_json::from_str(r#"{"error":{"message":"slow down","code":429}}"#).unwrap();
        assert_eq!(
            classify_stream_error("openrouter", &e, 0).class,
            Class::RateLimit
        );
    }

    #[test]
    fn retryability() {
        assert!(Class::RateLimit.retryable());
        assert!(!Class::InvalidRequest.retryable());
        assert!(Class::Auth.belongs_to_key());
        assert!(!Class::Transient.belongs_to_key());
        for c in [
            "rate_limit",
            "quota",
            "auth",
            "transient",
            "network",
            "timeout",
            "stream",
            "invalid_request",
            "cancelled",
            "deadline",
        ] {
            assert_eq!(Class::parse(c).unwrap().as_str(), c);
        }
    }
}

/// Parses an OpenAI-style reset duration: "1s", "6m0s", "20ms", "1h2m3.5s", or plain seconds.
fn parse_reset_duration(v: &str) -> Option<i64> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return Some((secs * 1000.0).ceil() as i64);
    }
    let mut total = 0f64;
    let mut number = String::new();
    let mut chars = v.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let n: f64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'h' => 3_600_000.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                1.0
            }
            'm' => 60_000.0,
            's' => 1000.0,
            _ => return None,
        };
        total += n * unit;
        any = true;
    }
    (any && number.is_empty()).then_some(total.ceil() as i64)
}

/// The rate-limit headroom a provider reported: remaining requests, remaining tokens (-1 when
/// absent) and the earliest reset (ms since the epoch, 0 when absent).
pub fn headroom(headers: &[(String, String)], now_ms: i64) -> (i64, i64, i64) {
    let get = |names: &[&str]| {
        headers
            .iter()
            .find(|(k, _)| names.iter().any(|n| k.eq_ignore_ascii_case(n)))
            .map(|(_, v)| v.trim().to_string())
    };
    let number = |names: &[&str]| get(names).and_then(|v| v.parse::<i64>().ok()).unwrap_or(-1);
    let requests = number(&[
        "x-ratelimit-remaining-requests",
        "anthropic-ratelimit-requests-remaining",
    ]);
    let tokens = number(&[
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-tokens-remaining",
    ]);
    let durations = [
        get(&["x-ratelimit-reset-requests"]).and_then(|v| parse_reset_duration(&v)),
        get(&["x-ratelimit-reset-tokens"]).and_then(|v| parse_reset_duration(&v)),
    ];
    // Anthropic names the moment: anthropic-ratelimit-*-reset: 2026-11-29T18:00:30Z.
    let moments = [
        get(&["anthropic-ratelimit-requests-reset"]).and_then(|v| parse_rfc3339(&v)),
        get(&["anthropic-ratelimit-tokens-reset"]).and_then(|v| parse_rfc3339(&v)),
    ];
    let reset = durations
        .iter()
        .flatten()
        .map(|d| now_ms + d)
        .chain(moments.iter().flatten().copied())
        .min()
        .unwrap_or(0);
    (requests, tokens, reset)
}

#[cfg(test)]
mod headroom_tests {
    use super::*;

    #[test]
    fn reads_openai_headers() {
        let h = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let headers = h(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-remaining-tokens", "1500"),
            ("x-ratelimit-reset-requests", "6m0s"),
            ("x-ratelimit-reset-tokens", "20ms"),
        ]);
        assert_eq!(headroom(&headers, 1000), (0, 1500, 1020));
        assert_eq!(headroom(&[], 1000), (-1, -1, 0));
        assert_eq!(parse_reset_duration("1h2m3.5s"), Some(3_723_500));
        assert_eq!(parse_reset_duration("2"), Some(2000));
        assert_eq!(parse_reset_duration("bogus"), None);
        let anthropic = h(&[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-12-01T00:00:12Z"),
        ]);
        assert_eq!(headroom(&anthropic, 0), (0, -1, 1_796_083_212_000));
        assert_eq!(
            parse_rfc3339("2026-12-01T00:00:12.5Z"),
            Some(1_796_083_212_500)
        );
        assert_eq!(parse_rfc3339("2026-12-01T00:00:12+02:00"), None);
    }
}
