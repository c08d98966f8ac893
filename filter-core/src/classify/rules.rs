//! The generic rules: the provider's structured fields decide first, then the status, then the
//! message text.

use super::fields::{contains_any, words_without_urls, ErrorFields};
use super::tables::*;
use ai_router_contract::failure::ErrorClass;

/// The period of a Google quota that ran out, from its QuotaFailure `quotaId`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QuotaPeriod {
    Minute,
    Day,
}

pub(super) fn quota_period(quota_ids: &[String]) -> Option<QuotaPeriod> {
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
pub(super) fn class_from_fields(
    status: u16,
    fields: &ErrorFields,
    tokens: &[String; 2],
) -> Option<ErrorClass> {
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
        return Some(ErrorClass::ContextLength);
    }
    if matches!(status, 400 | 403) && is_key_type_refusal(fields) {
        return Some(ErrorClass::Auth);
    }
    match quota_period(&fields.quota_ids) {
        Some(QuotaPeriod::Day) => return Some(ErrorClass::Quota),
        Some(QuotaPeriod::Minute) => return Some(ErrorClass::RateLimit),
        None => {}
    }
    if fields
        .reasons
        .iter()
        .any(|r| r.eq_ignore_ascii_case("api_key_invalid"))
    {
        return Some(ErrorClass::Auth);
    }
    if has_code(QUOTA_CODES) {
        return Some(ErrorClass::Quota);
    }
    if has_code(RATE_CODES) {
        // Per minute or per day (OpenAI's and Groq's TPD/RPD), a rate limit is the model's on
        // that key: the lane cools down until the window ends ([`daily_rate_limit`]); the key's
        // other models go on serving.
        return Some(ErrorClass::RateLimit);
    }
    if has_code(AUTH_CODES) {
        return Some(ErrorClass::Auth);
    }
    None
}

/// The verdict of the status and, last, the message text.
pub(super) fn class_from_status_and_text(
    kind: &str,
    status: u16,
    fields: &ErrorFields,
    tokens: &[String; 2],
) -> ErrorClass {
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
        402 if text.contains("max_tokens") => ErrorClass::InvalidRequest,
        402 => ErrorClass::Quota,
        401 | 403 => {
            if quota && kind != "openai" {
                ErrorClass::Quota
            } else {
                ErrorClass::Auth
            }
        }
        429 if contains_any(&text, OVERLOAD_TEXT) && !quota => ErrorClass::Transient,
        429 if contains_any(&text, PER_DAY_TEXT) => ErrorClass::Quota,
        429 => {
            // Gemini says RESOURCE_EXHAUSTED for rate limits and spent days alike; without a
            // QuotaFailure only the message tells.
            if tokens[1] == "resource_exhausted" {
                if contains_any(&text, PER_DAY_TEXT) {
                    ErrorClass::Quota
                } else {
                    ErrorClass::RateLimit
                }
            } else if quota {
                ErrorClass::Quota
            } else {
                ErrorClass::RateLimit
            }
        }
        408 | 409 | 425 | 498 | 529 => ErrorClass::Transient,
        // A redirect the gateway does not follow (a provider moved, a baseUrl missing its
        // path): the lane is failing, not the key or the request.
        300..=399 => ErrorClass::Transient,
        500..=599 => ErrorClass::Transient,
        // A value of the request repeated back (OpenAI's `Invalid value: '<value>'`), or OpenAI
        // refusing the request: about the request, whatever words it repeats. OpenAI refuses
        // keys with 401 and spent quotas with 429, never with a 400.
        400..=499
            if has_code(ECHO_CODES)
                || (kind == "openai" && tokens[1] == "invalid_request_error") =>
        {
            if contains_any(&text, CONTEXT_TEXT) {
                ErrorClass::ContextLength
            } else {
                ErrorClass::InvalidRequest
            }
        }
        400 | 422 if contains_any(&text, CONTEXT_TEXT) => ErrorClass::ContextLength,
        400..=499 => {
            if quota {
                ErrorClass::Quota
            } else if auth {
                ErrorClass::Auth
            } else {
                ErrorClass::InvalidRequest
            }
        }
        _ => {
            // A 2xx (or odd) answer that carries an error object.
            if quota {
                ErrorClass::Quota
            } else if auth {
                ErrorClass::Auth
            } else if has_code(OVERLOAD_CODES) {
                ErrorClass::Transient
            } else {
                ErrorClass::Stream
            }
        }
    }
}

/// A rate limit over a day's budget: its message names a per-day window.
pub(super) fn daily_rate_limit(fields: &ErrorFields) -> bool {
    contains_any(&fields.message.to_ascii_lowercase(), PER_DAY_TEXT)
}

/// Gemini's refusal of the key's type (400 INVALID_ARGUMENT or 403 PERMISSION_DENIED): the
/// ErrorInfo reason first, else the wordings Google has used.
pub(super) fn is_key_type_refusal(fields: &ErrorFields) -> bool {
    fields
        .reasons
        .iter()
        .any(|r| KEY_TYPE_REASONS.contains(&r.to_ascii_lowercase().as_str()))
        || contains_any(&words_without_urls(&fields.message), KEY_TYPE_TEXT)
}

/// The verdict of the provider's structured fields, else of the status and the message text.
pub(super) fn verdict(
    kind: &str,
    status: u16,
    fields: &ErrorFields,
    tokens: &[String; 2],
) -> ErrorClass {
    class_from_fields(status, fields, tokens)
        .unwrap_or_else(|| class_from_status_and_text(kind, status, fields, tokens))
}
