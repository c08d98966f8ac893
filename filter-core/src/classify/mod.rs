//! Classification of a provider's answer: what failed, whether another lane should be tried,
//! and what it means for the key (cooldown, blacklist) — per provider kind, from the status and
//! the error body.
//!
//! The provider's structured fields decide first (`error.code`, `error.type`, Google's
//! `error.status` and `details[]`: QuotaFailure `quotaId`, ErrorInfo `reason`, RetryInfo), then
//! the status, and the message text last (without its URLs). The window comes from
//! `retry-after-ms` / `retry-after`, RetryInfo, `X-RateLimit-Reset`, a moment or a wait the
//! message names, or the provider's calendar (Gemini's days end at midnight Pacific time), and
//! is capped ([`window::MAX_RATE_LIMIT_COOLDOWN_MS`], [`window::MAX_QUOTA_HOLD_MS`]). Every
//! real error answer in testdata/provider-errors/ states its expected verdict;
//! tests/provider_errors.rs checks them.
//!
//! One file per concern: `failure` (the verdict), `fields` (what an error body says, whatever
//! its shape), `tables` (the providers' codes and phrases), `rules` (fields, then status, then
//! text), `echo` (a verdict resting on the client's own words), `window` and `when` (how long
//! it holds), `headroom` (the rate-limit headers).

mod echo;
pub mod failure;
mod fields;
pub mod headroom;
mod rules;
mod tables;
pub mod when;
pub mod window;

use ai_router_contract::failure::ErrorClass;
use ai_router_contract::failure::UNSUPPORTED_KEY_TYPE;
use ai_router_contract::kinds::{DailyReset, ProviderKind};
use serde_json::Value;

use echo::table_phrases;
use fields::{error_fields, ErrorFields};
use rules::{is_key_type_refusal, verdict};
use window::window;

// What the tests (written when it all lived here) read from the files above.
use failure::{ByWords, Failure};
#[cfg(test)]
use {ai_router_contract::kinds::RateLimitWindow, when::*};

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
        ProviderKind::parse(kind).and_then(DailyReset::of_kind),
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

/// A failure of `class`: its window, and the code the provider gave.
fn failure_of(
    daily_reset: Option<DailyReset>,
    class: ErrorClass,
    status: u16,
    headers: &[(String, String)],
    fields: &ErrorFields,
    message: String,
    now_ms: i64,
) -> Failure {
    let retry_at_ms = window(daily_reset, class, headers, fields, now_ms);
    let key_type = class == ErrorClass::Auth && is_key_type_refusal(fields);
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

/// Classifies an error object received inside a stream (before or after the first token), by
/// the same rule as an answer ([`classify_in`]: a spent daily quota lasts until `daily_reset`'s
/// midnight, the provider's configured `dailyResetTimezone` or its kind's).
pub fn classify_stream_error(
    kind: &str,
    daily_reset: Option<DailyReset>,
    event: &Value,
    now_ms: i64,
) -> Failure {
    let bytes = event.to_string().into_bytes();
    let mut failure = classify_in(kind, daily_reset, 200, &[], &bytes, now_ms);
    if let Some(status) = event
        .get("error")
        .and_then(|e| e.get("code"))
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
    {
        if (400..=599).contains(&status) {
            let again = classify_in(kind, daily_reset, status, &[], &bytes, now_ms);
            failure.class = again.class;
        }
    }
    if failure.class == ErrorClass::InvalidRequest {
        // A stream that breaks off with an error is a broken stream unless it says otherwise.
        failure.class = ErrorClass::Stream;
    }
    failure
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod headroom_tests;

#[cfg(test)]
mod kind_tests;
