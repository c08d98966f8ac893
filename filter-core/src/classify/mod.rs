//! Classification of a provider's answer: what failed, whether another lane should be tried,
//! and what it means for the key (cooldown, blacklist) — per provider kind, from the status and
//! the error body.
//!
//! The provider's structured fields decide first (`error.code`, `error.type`, Google's
//! `error.status` and `details[]`: QuotaFailure `quotaId`, ErrorInfo `reason`, RetryInfo), then
//! the status, and the message text last (without its URLs). The window comes from
//! `retry-after-ms` / `retry-after`, RetryInfo, `X-RateLimit-Reset`, a moment or a wait the
//! message names, or the provider's calendar (Gemini's days end at midnight Pacific time), and
//! is capped ([`MAX_RATE_LIMIT_COOLDOWN_MS`], [`MAX_QUOTA_HOLD_MS`]). Every real error answer in
//! testdata/provider-errors/ states its expected verdict; tests/provider_errors.rs checks them.

use ai_router_contract::calendar::days_from_civil;
pub use ai_router_contract::failure::{ErrorClass as Class, Hold};
use ai_router_contract::kinds::{DailyReset, RateLimitWindow};
use serde_json::Value;

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
    /// The message's words held a key or a lane that the status and the provider's structured
    /// fields alone would not have: those words, and the verdict without them. Providers repeat
    /// a client's values in their messages, so [`Failure::unless_echoed`] falls back to that
    /// verdict when the words are the client's own.
    pub by_words: Option<Box<ByWords>>,
}

/// What the message's words changed in a verdict ([`Failure::by_words`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ByWords {
    /// The phrases of the classifier's tables found in the message (lowercase, one space
    /// between words).
    pub phrases: Vec<&'static str>,
    /// The verdict on the status and the structured fields alone.
    pub otherwise: Failure,
}

/// The longest a provider's window may cool a lane down (a rate limit, a retry-after on a
/// transient failure): a retry-after of days must not park a lane for good.
pub const MAX_RATE_LIMIT_COOLDOWN_MS: i64 = 3_600_000;
/// The longest a per-day rate limit (a model's TPD or RPD on a key) may cool its lane down.
pub const MAX_DAILY_LIMIT_COOLDOWN_MS: i64 = ai_router_contract::calendar::DAY_MS;
/// The longest a provider's window may blacklist a key for a spent quota (a monthly cap named
/// further out is checked again after a week).
pub const MAX_QUOTA_HOLD_MS: i64 = 7 * 86_400_000;

impl Failure {
    /// A failure the gateway decides itself (a timeout, a broken stream), with no provider code.
    pub fn local(class: Class, status: u16, message: impl Into<String>) -> Self {
        Self {
            class,
            retry_at_ms: None,
            provider_code: None,
            message: message.into(),
            status,
            by_words: None,
        }
    }

    /// What this failure holds, by the one rule ([`Class::hold`]).
    pub fn hold(&self) -> Hold {
        self.class.hold(self.retry_at_ms.is_some())
    }

    /// This verdict, unless it rests on words the client could have put in the answer: when a
    /// phrase that decided it occurs in `client_request` (the caller's body, any string in it),
    /// the provider may be repeating the client (OpenAI answers an unknown value with
    /// `Invalid value: '<value>'`), and the verdict of the status and structured fields alone
    /// stands. A tenant must not be able to take the pool's shared keys out with a crafted
    /// request.
    pub fn unless_echoed(self, client_request: &[u8]) -> Failure {
        let Some(by_words) = &self.by_words else {
            return self;
        };
        let client = client_words(client_request);
        if by_words.phrases.iter().any(|p| client.contains(p)) {
            return by_words.otherwise.clone();
        }
        self
    }
}

/// Every string of a JSON request (keys and values), in the form the tables match a message
/// in ([`words_without_urls`]); a body that is not JSON is taken as text.
fn client_words(request: &[u8]) -> String {
    fn collect(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(s) => out.push(words_without_urls(s)),
            Value::Array(items) => items.iter().for_each(|v| collect(v, out)),
            Value::Object(map) => {
                for (key, v) in map {
                    out.push(words_without_urls(key));
                    collect(v, out);
                }
            }
            _ => {}
        }
    }
    match serde_json::from_slice::<Value>(request) {
        Ok(value) => {
            let mut strings = Vec::new();
            collect(&value, &mut strings);
            // Joined, so a phrase split over two adjacent strings still counts as the client's.
            strings.join(" ")
        }
        Err(_) => words_without_urls(&String::from_utf8_lossy(request)),
    }
}

/// `retry-after-ms`, else `retry-after` (seconds, or an HTTP date: RFC 9110's IMF-fixdate and
/// its two obsolete forms), else the OpenAI-style reset headers are left to headroom logic. A
/// date in the past is now.
pub fn retry_at(headers: &[(String, String)], now_ms: i64) -> Option<i64> {
    let get = |name: &str| header(headers, name);
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms >= 0.0 {
            // `as` saturates a huge or infinite value; the sum must too.
            return Some(now_ms.saturating_add(ms.ceil() as i64));
        }
    }
    let value = get("retry-after")?;
    if let Ok(s) = value.parse::<f64>() {
        return (s >= 0.0).then(|| now_ms.saturating_add((s * 1000.0).ceil() as i64));
    }
    http_date_ms(&value).map(|at| at.max(now_ms))
}

/// An HTTP date as ms since the epoch: `Sun, 06 Nov 1994 08:49:37 GMT` (IMF-fixdate),
/// `Sunday, 06-Nov-94 08:49:37 GMT` (RFC 850, two-digit years read as 19xx/20xx by RFC 9110's
/// 50-year rule) or `Sun Nov  6 08:49:37 1994` (asctime).
fn http_date_ms(value: &str) -> Option<i64> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let month_of = |m: &str| {
        MONTHS
            .iter()
            .position(|name| m.eq_ignore_ascii_case(name))
            .map(|i| i as i64 + 1)
    };
    let words: Vec<&str> = value.split_whitespace().collect();
    let (day, month, year, time) = match words.as_slice() {
        // IMF-fixdate: day-name, DD Mon YYYY HH:MM:SS GMT
        [_, d, m, y, t, "GMT"] => (d.parse().ok()?, month_of(m)?, y.parse::<i64>().ok()?, *t),
        // RFC 850: day-name, DD-Mon-YY HH:MM:SS GMT
        [_, dmy, t, "GMT"] => {
            let mut parts = dmy.split('-');
            let (d, m, y) = (parts.next()?, parts.next()?, parts.next()?);
            let y: i64 = y.parse().ok()?;
            let year = if y >= 100 {
                y
            } else if y >= 70 {
                1900 + y
            } else {
                2000 + y
            };
            (d.parse().ok()?, month_of(m)?, year, *t)
        }
        // asctime: day-name Mon D HH:MM:SS YYYY
        [_, m, d, t, y] => (d.parse().ok()?, month_of(m)?, y.parse::<i64>().ok()?, *t),
        _ => return None,
    };
    let mut hms = time.split(':').map(|n| n.parse::<i64>().ok());
    let (h, mi, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if !(0..24).contains(&h) || !(0..60).contains(&mi) || !(0..61).contains(&sec) {
        return None;
    }
    Some((days_of(year, month, day)? * 86_400 + h * 3_600 + mi * 60 + sec) * 1000)
}

/// What a provider's error object says, across the shapes providers use: `{"error":{...}}`,
/// `{"error":"text"}`, `[{"error":{...}}]` (Gemini), `{"type":"error","error":{...}}`
/// (Anthropic), `{"code":"...","message":"..."}` (DashScope).
#[derive(Debug, Default, Clone)]
struct ErrorFields {
    /// `error.code`.
    code: Option<String>,
    /// `error.type`, else Google's `error.status`.
    kind: Option<String>,
    message: String,
    /// Google's QuotaFailure violations' `quotaId`s (`GenerateRequestsPerDay...`).
    quota_ids: Vec<String>,
    /// Google's ErrorInfo `reason`s (`API_KEY_INVALID`).
    reasons: Vec<String>,
    /// Google's RetryInfo `retryDelay`, in ms.
    retry_delay_ms: Option<i64>,
    /// `X-RateLimit-Reset` among the headers the error carries (OpenRouter's
    /// `error.metadata.headers`).
    reset: Option<String>,
}

fn error_fields(body: &Value) -> ErrorFields {
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

fn contains_any(haystack: &str, needles: &[&str]) -> bool {
    needles.iter().any(|n| haystack.contains(n))
}

/// The message without its URLs: a link to a billing page does not make a rate limit a quota.
fn words_without_urls(message: &str) -> String {
    message
        .split_whitespace()
        .filter(|w| !w.contains("://"))
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_lowercase()
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
    // DashScope's "use free tier only" mode with the free tier spent: lifted in the console.
    "allocationquota.freetieronly",
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
    // OpenRouter's per-key credit limit, which its owner raises or which resets.
    "key limit exceeded",
    "free tier of the model has been exhausted",
    // SiliconFlow's spent balance; Cloudflare's spent neurons; Cohere's trial month.
    "balance is insufficient",
    "daily free allocation",
    "/ month",
    "per month",
];
/// Codes a provider gives an answer that repeats a value of the request (OpenAI's `Invalid
/// value: '<value>'`): about the request, whatever the repeated words say.
const ECHO_CODES: &[&str] = &["invalid_value", "invalid_enum_value", "invalid_type"];
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
    // Groq: the organization behind the key is restricted; every call with it fails.
    "organization_restricted",
];
const RATE_CODES: &[&str] = &[
    "rate_limit_exceeded",
    "rate_limit_error",
    "throttling",
    "rate_limited",
    "limit_requests",
    "throttling.ratequota",
    "throttling.allocationquota",
];
/// A limit over a per-day budget (Groq's and OpenAI's TPD/RPD, Cerebras's and SambaNova's
/// "per day", GitHub's `UserByModelByDay`). Under a rate-limit code it holds the lane until the
/// window ends, at most [`MAX_DAILY_LIMIT_COOLDOWN_MS`]; without one, it is a spent quota.
const PER_DAY_TEXT: &[&str] = &["(tpd)", "(rpd)", "per day", "byday", "per 86400s", "daily"];
/// A 429 about the provider's load, not the key's rate (Moonshot's engine_overloaded_error,
/// Z.ai's 1305): nothing cools down but the breakers count it.
const OVERLOAD_TEXT: &[&str] = &["overloaded"];
/// What providers say when the prompt is past the model's window or their per-request cap.
const CONTEXT_CODES: &[&str] = &["context_length_exceeded", "tokens_limit_reached"];
const CONTEXT_TEXT: &[&str] = &[
    "context length",
    "context_length",
    "context window",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "too large for model",
    "exceeded model token limit",
    "reduce the length of the messages",
    "max_seq_len",
    "exceeds max length",
    "request body too large",
    "input is too long",
];
/// Google refuses some key types outright (unrestricted "standard" keys): the key will never
/// work, whatever is retried.
const KEY_TYPE_TEXT: &[&str] = &[
    "key type is not allowed",
    "key type not allowed",
    "key type is not supported",
    "key type not supported",
    "keys of this type are not",
    "unrestricted api keys can no longer",
    "unrestricted) api keys can no longer",
    "standard api keys can no longer",
];
/// Google's ErrorInfo reasons for a key the API refuses whatever is retried: its type, or the
/// key being blocked from this API.
const KEY_TYPE_REASONS: &[&str] = &[
    "api_key_type_not_allowed",
    "api_key_type_not_supported",
    "api_key_service_blocked",
];
pub use ai_router_contract::failure::UNSUPPORTED_KEY_TYPE;
const OVERLOAD_CODES: &[&str] = &[
    "overloaded_error",
    "server_error",
    "unavailable",
    "internal",
];

/// The period of a Google quota that ran out, from its QuotaFailure `quotaId`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuotaPeriod {
    Minute,
    Day,
}

fn quota_period(quota_ids: &[String]) -> Option<QuotaPeriod> {
    // A spent day outlasts a spent minute.
    if quota_ids.iter().any(|id| id.contains("PerDay")) {
        Some(QuotaPeriod::Day)
    } else if quota_ids.iter().any(|id| id.contains("PerMinute")) {
        Some(QuotaPeriod::Minute)
    } else {
        None
    }
}

/// The verdict of the provider's structured fields (code, type, status, details), when they
/// give one. 5xx answers are transient whatever they carry.
fn class_from_fields(status: u16, fields: &ErrorFields, tokens: &[String; 2]) -> Option<Class> {
    let has_code = |set: &[&str]| {
        tokens
            .iter()
            .any(|t| !t.is_empty() && set.contains(&t.as_str()))
    };
    if (500..=599).contains(&status) {
        return None;
    }
    if status == 413 || (status == 400 && has_code(CONTEXT_CODES)) {
        // The request is too big for this lane (Groq also says 413 over a per-minute token
        // limit): no other key of the same model would take it, a larger model might.
        return Some(Class::ContextLength);
    }
    if matches!(status, 400 | 403) && is_key_type_refusal(fields) {
        return Some(Class::Auth);
    }
    match quota_period(&fields.quota_ids) {
        Some(QuotaPeriod::Day) => return Some(Class::Quota),
        Some(QuotaPeriod::Minute) => return Some(Class::RateLimit),
        None => {}
    }
    if fields
        .reasons
        .iter()
        .any(|r| r.eq_ignore_ascii_case("api_key_invalid"))
    {
        return Some(Class::Auth);
    }
    if has_code(QUOTA_CODES) {
        return Some(Class::Quota);
    }
    if has_code(RATE_CODES) {
        // Per minute or per day (OpenAI's and Groq's TPD/RPD), a rate limit is the model's on
        // that key: the lane cools down until the window ends ([`daily_rate_limit`]); the key's
        // other models go on serving.
        return Some(Class::RateLimit);
    }
    if has_code(AUTH_CODES) {
        return Some(Class::Auth);
    }
    None
}

/// The verdict of the status and, last, the message text.
fn class_from_status_and_text(
    kind: &str,
    status: u16,
    fields: &ErrorFields,
    tokens: &[String; 2],
) -> Class {
    let has_code = |set: &[&str]| {
        tokens
            .iter()
            .any(|t| !t.is_empty() && set.contains(&t.as_str()))
    };
    let text = words_without_urls(&fields.message);
    let quota = contains_any(&text, QUOTA_TEXT);
    let auth = contains_any(&text, AUTH_TEXT);
    match status {
        // OpenRouter: a request for more tokens than the credit covers is about the request.
        402 if text.contains("max_tokens") => Class::InvalidRequest,
        402 => Class::Quota,
        401 | 403 => {
            if quota && kind != "openai" {
                Class::Quota
            } else {
                Class::Auth
            }
        }
        429 if contains_any(&text, OVERLOAD_TEXT) && !quota => Class::Transient,
        429 if contains_any(&text, PER_DAY_TEXT) => Class::Quota,
        429 => {
            // Gemini says RESOURCE_EXHAUSTED for rate limits and spent days alike; without a
            // QuotaFailure only the message tells.
            if tokens[1] == "resource_exhausted" {
                if contains_any(&text, PER_DAY_TEXT) {
                    Class::Quota
                } else {
                    Class::RateLimit
                }
            } else if quota {
                Class::Quota
            } else {
                Class::RateLimit
            }
        }
        408 | 409 | 425 | 498 | 529 => Class::Transient,
        // A redirect the gateway does not follow (a provider moved, a baseUrl missing its
        // path): the lane is failing, not the key or the request.
        300..=399 => Class::Transient,
        500..=599 => Class::Transient,
        // A value of the request repeated back (OpenAI's `Invalid value: '<value>'`), or OpenAI
        // refusing the request: about the request, whatever words it repeats. OpenAI refuses
        // keys with 401 and spent quotas with 429, never with a 400.
        400..=499
            if has_code(ECHO_CODES)
                || (kind == "openai" && tokens[1] == "invalid_request_error") =>
        {
            if contains_any(&text, CONTEXT_TEXT) {
                Class::ContextLength
            } else {
                Class::InvalidRequest
            }
        }
        400 | 422 if contains_any(&text, CONTEXT_TEXT) => Class::ContextLength,
        400..=499 => {
            if quota {
                Class::Quota
            } else if auth {
                Class::Auth
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
            } else if has_code(OVERLOAD_CODES) {
                Class::Transient
            } else {
                Class::Stream
            }
        }
    }
}

/// A rate limit over a day's budget: its message names a per-day window.
fn daily_rate_limit(fields: &ErrorFields) -> bool {
    contains_any(&fields.message.to_ascii_lowercase(), PER_DAY_TEXT)
}

/// Gemini's refusal of the key's type (400 INVALID_ARGUMENT or 403 PERMISSION_DENIED): the
/// ErrorInfo reason first, else the wordings Google has used.
fn is_key_type_refusal(fields: &ErrorFields) -> bool {
    fields
        .reasons
        .iter()
        .any(|r| KEY_TYPE_REASONS.contains(&r.to_ascii_lowercase().as_str()))
        || contains_any(&words_without_urls(&fields.message), KEY_TYPE_TEXT)
}

/// Classifies a provider's non-success answer (or a 2xx answer carrying an error object): the
/// provider's structured fields first, then the status, then the message text. A spent daily
/// quota lasts until the kind's own midnight ([`DailyReset::of_kind`]).
pub fn classify(
    kind: &str,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    now_ms: i64,
) -> Failure {
    classify_in(
        kind,
        DailyReset::of_kind(kind),
        status,
        headers,
        body,
        now_ms,
    )
}

/// [`classify`] for a provider whose days end in `daily_reset` (the kind's, or the
/// configuration's `dailyResetTimezone`; `None`: no calendar, the provider's window decides).
pub fn classify_in(
    kind: &str,
    daily_reset: Option<DailyReset>,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    now_ms: i64,
) -> Failure {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let fields = error_fields(&parsed);
    let lower = |s: &Option<String>| s.as_deref().unwrap_or("").to_ascii_lowercase();
    let tokens = [lower(&fields.code), lower(&fields.kind)];
    let class = verdict(kind, status, &fields, &tokens);
    let phrases = table_phrases(&fields.message);
    let by_words = if phrases.is_empty() {
        None
    } else {
        // The same answer with its message unread: what the status and the structured fields
        // say alone.
        let plain = ErrorFields {
            message: String::new(),
            ..fields.clone()
        };
        let otherwise = verdict(kind, status, &plain, &tokens);
        (otherwise != class).then(|| {
            Box::new(ByWords {
                phrases,
                otherwise: failure_of(
                    daily_reset,
                    otherwise,
                    status,
                    headers,
                    &plain,
                    fields.message.clone(),
                    now_ms,
                ),
            })
        })
    };
    Failure {
        by_words,
        ..failure_of(
            daily_reset,
            class,
            status,
            headers,
            &fields,
            fields.message.clone(),
            now_ms,
        )
    }
}

/// The verdict of the provider's structured fields, else of the status and the message text.
fn verdict(kind: &str, status: u16, fields: &ErrorFields, tokens: &[String; 2]) -> Class {
    class_from_fields(status, fields, tokens)
        .unwrap_or_else(|| class_from_status_and_text(kind, status, fields, tokens))
}

/// A failure of `class`: its window, and the code the provider gave.
fn failure_of(
    daily_reset: Option<DailyReset>,
    class: Class,
    status: u16,
    headers: &[(String, String)],
    fields: &ErrorFields,
    message: String,
    now_ms: i64,
) -> Failure {
    let retry_at_ms = window(daily_reset, class, headers, fields, now_ms);
    let key_type = class == Class::Auth && is_key_type_refusal(fields);
    Failure {
        class,
        retry_at_ms,
        provider_code: if key_type {
            Some(UNSUPPORTED_KEY_TYPE.to_owned())
        } else {
            fields.code.clone().or_else(|| fields.kind.clone())
        },
        message,
        status,
        by_words: None,
    }
}

/// The phrases of the classifier's tables that occur in a message.
fn table_phrases(message: &str) -> Vec<&'static str> {
    let words = words_without_urls(message);
    let raw = message.to_ascii_lowercase();
    [
        QUOTA_TEXT,
        AUTH_TEXT,
        PER_DAY_TEXT,
        OVERLOAD_TEXT,
        CONTEXT_TEXT,
        KEY_TYPE_TEXT,
    ]
    .into_iter()
    .flatten()
    .copied()
    .filter(|p| words.contains(p) || raw.contains(p))
    .collect()
}

/// When the provider says the failure ends, capped by the class: a lane cools down at most
/// [`MAX_RATE_LIMIT_COOLDOWN_MS`], a key's spent quota holds it at most [`MAX_QUOTA_HOLD_MS`].
fn window(
    daily_reset: Option<DailyReset>,
    class: Class,
    headers: &[(String, String)],
    fields: &ErrorFields,
    now_ms: i64,
) -> Option<i64> {
    let from_headers = retry_at(headers, now_ms);
    let reset = || {
        fields
            .reset
            .clone()
            .or_else(|| header(headers, "x-ratelimit-reset"))
            .and_then(|v| reset_moment(&v, now_ms))
    };
    let try_again = || try_again_in(&fields.message).map(|ms| now_ms + ms);
    let (at, cap) = match class {
        Class::Quota => {
            let text = fields.message.to_ascii_lowercase();
            let daily = quota_period(&fields.quota_ids) == Some(QuotaPeriod::Day)
                || (fields.quota_ids.is_empty() && contains_any(&text, PER_DAY_TEXT));
            // A daily quota lasts until the provider's midnight (Gemini's is Pacific time),
            // whatever retryDelay says.
            let at = if let Some(zone) = daily_reset.filter(|_| daily) {
                Some(zone.next_midnight_ms(now_ms))
            } else {
                from_headers
                    .or_else(reset)
                    .or_else(|| regain_access_at(&fields.message))
                    .or_else(try_again)
            };
            (at, MAX_QUOTA_HOLD_MS)
        }
        Class::RateLimit => {
            let named = from_headers
                .or(fields.retry_delay_ms.map(|ms| now_ms + ms))
                .or_else(reset)
                .or_else(try_again);
            if daily_rate_limit(fields) {
                // A day's budget with no window named lasts until the provider's midnight.
                let midnight = daily_reset
                    .unwrap_or(DailyReset::Utc)
                    .next_midnight_ms(now_ms);
                (named.or(Some(midnight)), MAX_DAILY_LIMIT_COOLDOWN_MS)
            } else {
                (named, MAX_RATE_LIMIT_COOLDOWN_MS)
            }
        }
        _ => (from_headers, MAX_RATE_LIMIT_COOLDOWN_MS),
    };
    at.map(|at| at.clamp(now_ms, now_ms.saturating_add(cap)))
}

fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
}

/// An `X-RateLimit-Reset` value: ms since the epoch (OpenRouter), seconds since the epoch, or
/// seconds from now.
fn reset_moment(value: &str, now_ms: i64) -> Option<i64> {
    let n = value.trim().parse::<f64>().ok().filter(|n| *n >= 0.0)?;
    Some(if n >= 1e11 {
        n as i64
    } else if n >= 1e9 {
        (n * 1000.0) as i64
    } else {
        now_ms + (n * 1000.0).ceil() as i64
    })
}

/// The wait a message names: "Please try again in 1.23s" (Groq, OpenAI), "in 31m2.4s", "in 120ms".
fn try_again_in(message: &str) -> Option<i64> {
    const NEEDLE: &str = "try again in ";
    let lower = message.to_ascii_lowercase();
    let rest = &lower[lower.find(NEEDLE)? + NEEDLE.len()..];
    let token = rest.split_whitespace().next()?;
    parse_reset_duration(token.trim_end_matches(['.', ',', ';']))
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
    Some((days_of(y, m, d)? * 86_400 + hh * 3_600 + mm * 60) * 1000)
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
    Some((days_of(y, mo, d)? * 86_400 + h * 3_600 + mi * 60 + sec) * 1000 + frac)
}

/// Days since 1970-01-01 of a date parsed from text; `None` for a month or day out of range.
fn days_of(y: i64, m: i64, d: i64) -> Option<i64> {
    let (m, d) = (u32::try_from(m).ok()?, u32::try_from(d).ok()?);
    ((1..=12).contains(&m) && (1..=31).contains(&d)).then(|| days_from_civil(y, m, d))
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

    /// The kinds of the provider matrix, from the one enum.
    fn kinds() -> Vec<&'static str> {
        (1..)
            .map_while(|n| ai_router_proto::v1::ProviderKind::try_from(n).ok())
            .map(|kind| kind.text())
            .collect()
    }

    /// A 400 that repeats `value` from the request, in the error shapes providers answer with.
    fn echoing_400s(value: &str) -> Vec<String> {
        let q = |m: String| serde_json::to_string(&m).unwrap_or_default();
        vec![
            // OpenAI's unknown value.
            format!(
                r#"{{"error":{{"message":{},"type":"invalid_request_error","param":"messages[0].role","code":"invalid_value"}}}}"#,
                q(format!("Invalid value: '{value}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'."))
            ),
            // Anthropic's unknown field (the path is the client's).
            format!(
                r#"{{"type":"error","error":{{"type":"invalid_request_error","message":{}}}}}"#,
                q(format!("{value}: Extra inputs are not permitted"))
            ),
            // Google's INVALID_ARGUMENT.
            format!(
                r#"[{{"error":{{"code":400,"message":{},"status":"INVALID_ARGUMENT"}}}}]"#,
                q(format!("Invalid value at 'contents[0].role' (TYPE_STRING), \"{value}\""))
            ),
            // DashScope.
            format!(
                r#"{{"code":"InvalidParameter","message":{}}}"#,
                q(format!("Role must be in [user, assistant] but got '{value}'"))
            ),
            // vLLM and other OpenAI-compatible servers (pydantic).
            format!(
                r#"{{"object":"error","message":{},"type":"BadRequestError","param":null,"code":400}}"#,
                q(format!("[{{'type': 'literal_error', 'msg': \"Input should be 'user' or 'assistant'\", 'input': '{value}'}}]"))
            ),
            // A bare message.
            format!(r#"{{"error":{{"message":{}}}}}"#, q(format!("unknown role {value}"))),
            // Cloudflare's envelope.
            format!(
                r#"{{"errors":[{{"message":{},"code":5006}}],"success":false}}"#,
                q(format!("AiError: Bad input: role {value}"))
            ),
        ]
    }

    /// What a tenant could write into a request to take a shared key out, if the words of an
    /// answer that repeats it were trusted.
    const KEY_WORDS: [&str; 8] = [
        "incorrect api key",
        "Invalid API Key",
        "usage limit per month",
        "Your credit balance is too low",
        "API key not valid",
        "API key type not allowed",
        "exceeded your current quota",
        "tokens per day (TPD) daily",
    ];

    #[test]
    fn a_400_that_repeats_the_clients_words_never_holds_a_key_or_a_lane() {
        let kinds = kinds();
        assert_eq!(kinds.len(), 18);
        for kind in kinds {
            for words in KEY_WORDS {
                let client =
                    format!(r#"{{"model":"m","messages":[{{"role":"{words}","content":"hi"}}]}}"#);
                for body in echoing_400s(words) {
                    let failure = classify(kind, 400, &[], body.as_bytes(), 0)
                        .unless_echoed(client.as_bytes());
                    assert_eq!(failure.hold(), Hold::Nothing, "{kind} {body}: {failure:?}");
                    assert!(
                        matches!(failure.class, Class::InvalidRequest | Class::ContextLength),
                        "{kind} {body}: {failure:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_same_words_in_a_field_name_or_spaced_otherwise_are_still_the_clients() {
        let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low: Extra inputs are not permitted"}}"#;
        for client in [
            r#"{"Your credit balance is too low":1}"#,
            r#"{"x":"YOUR  CREDIT\tbalance is too low"}"#,
            "Your credit balance is too low (not JSON)",
        ] {
            let failure = classify("anthropic", 400, &[], body.as_bytes(), 0)
                .unless_echoed(client.as_bytes());
            assert_eq!(failure.class, Class::InvalidRequest, "{client}");
        }
    }

    #[test]
    fn a_providers_own_refusal_still_holds_the_key_when_the_client_did_not_write_it() {
        let client = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let credit = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
        let f = classify("anthropic", 400, &[], credit.as_bytes(), 0).unless_echoed(client);
        assert_eq!((f.class, f.hold()), (Class::Quota, Hold::Key));
        // Its own words in the client's request: the provider might be repeating them.
        let asked = br#"{"messages":[{"role":"user","content":"why does it say your credit balance is too low?"}]}"#;
        let f = classify("anthropic", 400, &[], credit.as_bytes(), 0).unless_echoed(asked);
        assert_eq!(f.class, Class::InvalidRequest);
        // A status that already says auth or quota keeps holding the key, whatever the words.
        let auth = r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":null}}"#;
        let f = classify("openai", 401, &[], auth.as_bytes(), 0)
            .unless_echoed(br#"{"x":"incorrect api key"}"#);
        assert_eq!((f.class, f.hold()), (Class::Auth, Hold::Key));
        // A structured code decides without the words.
        let quota = r#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}"#;
        let f = classify("openai", 429, &[], quota.as_bytes(), 0)
            .unless_echoed(br#"{"x":"exceeded your current quota"}"#);
        assert_eq!(f.class, Class::Quota);
        // A 429's words about a day, when the client wrote them: the lane cools down instead.
        let tpd = r#"{"error":{"message":"Rate limit reached on tokens per day (TPD)","type":"tokens","code":"rate_limit_exceeded"}}"#;
        let f = classify("groq", 429, &[], tpd.as_bytes(), 0)
            .unless_echoed(br#"{"x":"tokens per day (TPD)"}"#);
        assert_eq!(f.class, Class::RateLimit);
    }

    #[test]
    fn retry_after_as_seconds_or_an_http_date_in_each_form() {
        let h = |v: &str| vec![("Retry-After".to_owned(), v.to_owned())];
        // 1994-11-06T08:49:37Z
        let at = 784_111_777_000;
        let before = at - 90_000;
        assert_eq!(retry_at(&h("90"), before), Some(at));
        for date in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(retry_at(&h(date), before), Some(at), "{date}");
        }
        // A date already past is now; nonsense is no window.
        assert_eq!(
            retry_at(&h("Sun, 06 Nov 1994 08:49:37 GMT"), at + 5),
            Some(at + 5)
        );
        for junk in [
            "soon",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:00:00 GMT",
            "-3",
        ] {
            assert_eq!(retry_at(&h(junk), before), None, "{junk}");
        }
        // Through the classifier, bounded as a rate limit's window is.
        let body = br#"{"error":{"code":"rate_limit_exceeded","message":"slow down"}}"#;
        let f = classify(
            "openai",
            429,
            &h("Sun, 06 Nov 1994 08:49:37 GMT"),
            body,
            before,
        );
        assert_eq!((f.class, f.retry_at_ms), (Class::RateLimit, Some(at)));
        let f = classify(
            "openai",
            429,
            &h("Sun, 06 Nov 1994 08:49:37 GMT"),
            body,
            at - 86_400_000,
        );
        assert_eq!(
            f.retry_at_ms,
            Some(at - 86_400_000 + MAX_RATE_LIMIT_COOLDOWN_MS)
        );
    }

    #[test]
    fn geminis_refused_key_types_by_reason_or_by_any_wording() {
        let google = |status: u16, code: &str, message: &str, reason: Option<&str>| {
            let details = reason.map_or_else(
                || "[]".to_owned(),
                |r| format!(r#"[{{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"{r}","domain":"googleapis.com"}}]"#),
            );
            format!(
                r#"[{{"error":{{"code":{status},"message":"{message}","status":"{code}","details":{details}}}}}]"#
            )
        };
        let refused = [
            google(400, "INVALID_ARGUMENT", "API key type not allowed. Standard (unrestricted) API keys can no longer call the Gemini API.", Some("API_KEY_TYPE_NOT_ALLOWED")),
            google(400, "INVALID_ARGUMENT", "Request refused.", Some("API_KEY_TYPE_NOT_ALLOWED")),
            google(403, "PERMISSION_DENIED", "Requests to this API are blocked.", Some("API_KEY_SERVICE_BLOCKED")),
            google(400, "INVALID_ARGUMENT", "API key type is not allowed for this API.", None),
            google(400, "INVALID_ARGUMENT", "This API key type is not supported by the Gemini API.", None),
            google(400, "INVALID_ARGUMENT", "API keys of this type are not accepted; create a restricted key.", None),
            google(403, "PERMISSION_DENIED", "Unrestricted API keys can no longer call the Gemini API.", None),
        ];
        for body in &refused {
            let f = classify("gemini", 400, &[], body.as_bytes(), 0);
            assert_eq!(f.class, Class::Auth, "{body}");
            assert_eq!(
                f.provider_code.as_deref(),
                Some(UNSUPPORTED_KEY_TYPE),
                "{body}"
            );
        }
        // Other refusals of a key are auth without that code; other 400s are the request's.
        let invalid = google(
            400,
            "INVALID_ARGUMENT",
            "API Key not found. Please pass a valid API key.",
            Some("API_KEY_INVALID"),
        );
        let f = classify("gemini", 400, &[], invalid.as_bytes(), 0);
        assert_eq!(
            (f.class, f.provider_code.as_deref()),
            (Class::Auth, Some("400"))
        );
        let bad = google(
            400,
            "INVALID_ARGUMENT",
            "Invalid JSON payload received.",
            None,
        );
        assert_eq!(
            classify("gemini", 400, &[], bad.as_bytes(), 0).class,
            Class::InvalidRequest
        );
    }

    #[test]
    fn a_redirect_is_a_failing_lane() {
        for status in [301, 302, 307, 308] {
            let f = classify(
                "openai",
                status,
                &[("location".into(), "https://elsewhere/".into())],
                b"",
                0,
            );
            assert_eq!(
                (f.class, f.hold()),
                (Class::Transient, Hold::Nothing),
                "{status}"
            );
        }
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
            Class::ContextLength
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
        // Two days before the named moment (2026-12-01T00:00Z).
        let now = 1_796_083_200_000 - 2 * ai_router_contract::calendar::DAY_MS;
        let f = classify("anthropic", 400, &[], spend_cap.as_bytes(), now);
        assert_eq!(f.class, Class::Quota);
        assert_eq!(f.retry_at_ms, Some(1_796_083_200_000));
        // A month before it: held a week, then tried again.
        let f = classify(
            "anthropic",
            400,
            &[],
            spend_cap.as_bytes(),
            now - 28 * ai_router_contract::calendar::DAY_MS,
        );
        assert_eq!(
            f.retry_at_ms,
            Some(now - 28 * ai_router_contract::calendar::DAY_MS + MAX_QUOTA_HOLD_MS)
        );
        let gemini = r#"[{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"}]}}]"#;
        assert_eq!(c("gemini", 400, gemini), Class::Auth);
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
    fn provider_windows_are_capped() {
        let h = |name: &str, value: &str| vec![(name.to_string(), value.to_string())];
        let now = 1_000_000;
        // A rate limit asking for three days cools the lane an hour.
        let f = classify(
            "openai",
            429,
            &h("retry-after", "259200"),
            br#"{"error":{"code":"rate_limit_exceeded","message":"slow down"}}"#,
            now,
        );
        assert_eq!(f.class, Class::RateLimit);
        assert_eq!(f.retry_at_ms, Some(now + MAX_RATE_LIMIT_COOLDOWN_MS));
        // A retry-after on a transient failure too.
        let f = classify("openai", 503, &h("retry-after-ms", "90000000"), b"", now);
        assert_eq!(
            (f.class, f.retry_at_ms),
            (Class::Transient, Some(now + MAX_RATE_LIMIT_COOLDOWN_MS))
        );
        // A spent quota asking for a month holds the key a week.
        let f = classify(
            "openai",
            429,
            &h("retry-after", "2592000"),
            br#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}"#,
            now,
        );
        assert_eq!(f.class, Class::Quota);
        assert_eq!(f.retry_at_ms, Some(now + MAX_QUOTA_HOLD_MS));
        // Within the caps, the provider's window stands; a moment already past is now.
        let f = classify("openai", 429, &h("retry-after", "30"), b"", now);
        assert_eq!(f.retry_at_ms, Some(now + 30_000));
        assert_eq!(
            reset_moment("999", 1_700_000_000_000),
            Some(1_700_000_999_000)
        );
        let past = classify(
            "openrouter",
            429,
            &h("X-RateLimit-Reset", "1600000000000"),
            b"",
            now * 2_000_000,
        );
        assert_eq!(past.retry_at_ms, Some(now * 2_000_000));
    }

    #[test]
    fn reset_moments_in_response_headers_and_messages() {
        let free_daily = br#"{"error":{"message":"Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day","code":429}}"#;
        let now = 1_796_000_000_000;
        let f = classify(
            "openrouter",
            429,
            &[("X-RateLimit-Reset".into(), "1796083200000".into())],
            free_daily,
            now,
        );
        assert_eq!(
            (f.class, f.retry_at_ms),
            (Class::Quota, Some(1_796_083_200_000))
        );
        // Seconds since the epoch are read as such.
        assert_eq!(reset_moment("1796083200", now), Some(1_796_083_200_000));
        assert_eq!(
            try_again_in("Please try again in 31m2.4s. Need more tokens?"),
            Some(1_862_400)
        );
        assert_eq!(try_again_in("Please try again in 120ms."), Some(120));
        assert_eq!(try_again_in("try again later"), None);
    }

    #[test]
    fn gemini_without_details_falls_back_to_the_message() {
        let daily = br#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"You exceeded your current quota. Quota exceeded for metric generate_content_free_tier_requests, limit per day"}}]"#;
        let now = 1_784_098_799_000; // 2026-07-14 23:59:59 PDT
        let f = classify("gemini", 429, &[], daily, now);
        assert_eq!((f.class, f.retry_at_ms), (Class::Quota, Some(now + 1000)));
        let minute = br#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"You exceeded your current quota, please check your plan and billing details."}}]"#;
        assert_eq!(
            classify("gemini", 429, &[], minute, now).class,
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
    headroom_in(
        headers,
        (RateLimitWindow::Minute, RateLimitWindow::Minute),
        now_ms,
    )
}

/// [`headroom`] for a provider whose `-requests` and `-tokens` headers count over `windows`
/// (Groq: requests per day, tokens per minute). A spent day holds the lane until its own reset
/// (capped at a day): the token minute's reset does not lift it.
pub fn headroom_in(
    headers: &[(String, String)],
    windows: (RateLimitWindow, RateLimitWindow),
    now_ms: i64,
) -> (i64, i64, i64) {
    let get = |names: &[&str]| names.iter().find_map(|n| header(headers, n));
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
    let cap = |window: RateLimitWindow| match window {
        RateLimitWindow::Minute => MAX_RATE_LIMIT_COOLDOWN_MS,
        RateLimitWindow::Day => ai_router_contract::calendar::DAY_MS,
    };
    let resets: [Option<i64>; 2] = [0, 1].map(|i| {
        durations[i]
            .map(|d| now_ms.saturating_add(d))
            .or(moments[i])
            .map(|at| {
                at.min(now_ms.saturating_add(cap(if i == 0 { windows.0 } else { windows.1 })))
            })
    });
    let day = RateLimitWindow::Day;
    let reset = if requests == 0 && windows.0 == day && resets[0].is_some() {
        resets[0]
    } else if tokens == 0 && windows.1 == day && resets[1].is_some() {
        resets[1]
    } else {
        // A lane out of headroom waits for its reset, but no longer than a rate limit's cap.
        resets
            .iter()
            .flatten()
            .min()
            .map(|at| (*at).min(now_ms.saturating_add(MAX_RATE_LIMIT_COOLDOWN_MS)))
    };
    (requests, tokens, reset.unwrap_or(0))
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
        let far = h(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "72h"),
        ]);
        assert_eq!(
            headroom(&far, 1000),
            (0, -1, 1000 + MAX_RATE_LIMIT_COOLDOWN_MS)
        );
        assert_eq!(parse_reset_duration("1h2m3.5s"), Some(3_723_500));
        assert_eq!(parse_reset_duration("2"), Some(2000));
        assert_eq!(parse_reset_duration("bogus"), None);
        let anthropic = h(&[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-12-01T00:00:12Z"),
        ]);
        assert_eq!(
            headroom(&anthropic, 1_796_083_200_000),
            (0, -1, 1_796_083_212_000)
        );
        assert_eq!(
            parse_rfc3339("2026-12-01T00:00:12.5Z"),
            Some(1_796_083_212_500)
        );
        assert_eq!(parse_rfc3339("2026-12-01T00:00:12+02:00"), None);
    }
}

#[cfg(test)]
mod kind_tests {
    use super::*;
    use ai_router_contract::kinds::DailyReset;

    #[test]
    fn a_refused_key_type_is_auth_with_its_own_code() {
        let body = br#"[{"error":{"code":400,"message":"API key type not allowed. Standard keys can no longer call the Gemini API.","status":"INVALID_ARGUMENT"}}]"#;
        let f = classify("gemini", 400, &[], body, 0);
        assert_eq!(f.class, Class::Auth);
        assert_eq!(f.provider_code.as_deref(), Some(UNSUPPORTED_KEY_TYPE));
        assert_eq!(f.hold(), Hold::Key);
        // Any other 400 of Gemini's stays the caller's.
        let other = br#"[{"error":{"code":400,"message":"Invalid JSON payload received.","status":"INVALID_ARGUMENT"}}]"#;
        let f = classify("gemini", 400, &[], other, 0);
        assert_eq!(f.class, Class::InvalidRequest);
        assert_eq!(f.provider_code.as_deref(), Some("400"));
    }

    #[test]
    fn context_length_is_its_own_class_and_other_400s_are_not() {
        let too_long = br#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error"}}"#;
        assert_eq!(
            classify("openai", 400, &[], too_long, 0).class,
            Class::ContextLength
        );
        assert_eq!(
            classify("github", 413, &[], b"", 0).class,
            Class::ContextLength
        );
        let bad = br#"{"error":{"message":"temperature must be between 0 and 2","type":"invalid_request_error"}}"#;
        assert_eq!(
            classify("openai", 400, &[], bad, 0).class,
            Class::InvalidRequest
        );
        assert!(!Class::ContextLength.retryable());
    }

    #[test]
    fn a_daily_quota_lasts_until_the_zone_the_provider_is_configured_with() {
        let body = br#"{"message":"Tokens per day limit exceeded - too many tokens processed.","type":"too_many_requests_error","param":"quota","code":"token_quota_exceeded"}"#;
        // 2026-12-01T14:00:00Z.
        let now = 1_796_133_600_000;
        let utc = classify("cerebras", 429, &[], body, now);
        assert_eq!(utc.class, Class::Quota);
        assert_eq!(utc.retry_at_ms, Some(1_796_169_600_000));
        let china = classify_in(
            "cerebras",
            Some(DailyReset::Offset(480)),
            429,
            &[],
            body,
            now,
        );
        assert_eq!(china.retry_at_ms, Some(1_796_140_800_000));
        // No calendar: the provider named no window, so the defaults decide.
        let rolling = classify_in("cerebras", None, 429, &[], body, now);
        assert_eq!(rolling.retry_at_ms, None);
    }

    #[test]
    fn groq_headroom_holds_a_spent_day_of_requests_past_the_token_minute() {
        let headers: Vec<(String, String)> = [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-remaining-tokens", "5000"),
            ("x-ratelimit-reset-requests", "4h30m"),
            ("x-ratelimit-reset-tokens", "6s"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        let day = (RateLimitWindow::Day, RateLimitWindow::Minute);
        let (requests, tokens, reset) = headroom_in(&headers, day, 0);
        assert_eq!((requests, tokens), (0, 5000));
        assert_eq!(reset, 16_200_000);
        // Read as per-minute windows (OpenAI's), the sooner reset stands: the lane is tried
        // again after the token minute.
        let (_, _, minute) = headroom(&headers, 0);
        assert_eq!(minute, 6_000);
    }
}
