//! Per-key quotas at the front stage, after the key is authenticated and before routing.
//!
//! - A block the control plane pushed (`VirtualKey.quota_code` until `quota_until_ms`: tokens
//!   or cost spent for the UTC day or month) answers 429 with that code until it ends.
//! - `requests_per_minute` holds across every Envoy: each admits from blocks of the minute's
//!   budget it takes from the control plane ([`crate::vm::minute_lease`]), in one shared-data
//!   record per key that a new minute overwrites (nothing leaks). A request past it answers
//!   429 `requests_per_minute_exceeded` until the next minute.
//!
//! Every 429 carries `Retry-After` (whole seconds, at least 1) and is reported as
//! `rejected:<code>` like any other refusal.

use ai_router_proto::v1::VirtualKey;

use crate::answer::errors::GatewayError;
use crate::vm::minute_lease::{minute_of, MINUTE_MS};
use ai_router_contract::error_code::ErrorCode;

/// Whole seconds from `now_ms` until `until_ms`, at least 1.
fn seconds_until(now_ms: i64, until_ms: i64) -> u64 {
    let ms = until_ms.saturating_sub(now_ms).max(1);
    u64::try_from((ms + 999) / 1000).unwrap_or(1).max(1)
}

/// The 429 for a pushed block still in force at `now_ms`. An unknown code is ignored (a newer
/// control plane); a block past its end is over even before the next push.
pub fn blocked(key: &VirtualKey, now_ms: i64) -> Option<GatewayError> {
    let code = match ErrorCode::parse(&key.quota_code) {
        Some(
            code @ (ErrorCode::TokensPerDayExceeded
            | ErrorCode::CostPerDayExceeded
            | ErrorCode::CostPerMonthExceeded),
        ) => code,
        _ => return None,
    };
    if key.quota_until_ms <= now_ms {
        return None;
    }
    Some(GatewayError::of(code).with_retry_after(Some(seconds_until(now_ms, key.quota_until_ms))))
}

/// The 429 for a request past the key's `limit` requests in this UTC minute.
pub fn minute_refusal(limit: u64, now_ms: i64) -> GatewayError {
    let next_minute = (minute_of(now_ms) + 1).saturating_mul(MINUTE_MS);
    GatewayError::new(
        ErrorCode::RequestsPerMinuteExceeded,
        format!("This key may make {limit} requests per minute; try again in the next minute."),
    )
    .with_retry_after(Some(seconds_until(now_ms, next_minute)))
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-03-15T12:00:00Z
    const AT: i64 = 1_773_576_000_000;

    fn key(code: &str, until: i64) -> VirtualKey {
        VirtualKey {
            id: "key_a".into(),
            quota_code: code.into(),
            quota_until_ms: until,
            ..VirtualKey::default()
        }
    }

    #[test]
    fn a_pushed_block_answers_429_until_it_ends() {
        let e = blocked(
            &key(ErrorCode::TokensPerDayExceeded.as_str(), AT + 90_500),
            AT,
        );
        let e = e.expect("blocked");
        assert_eq!((e.status, e.code), (429, ErrorCode::TokensPerDayExceeded));
        assert_eq!(e.error_type(), "rate_limit_error");
        assert_eq!(e.retry_after_s, Some(91));
        let month = blocked(&key(ErrorCode::CostPerMonthExceeded.as_str(), AT + 10), AT);
        assert_eq!(
            month.map(|e| (e.code, e.retry_after_s)),
            Some((ErrorCode::CostPerMonthExceeded, Some(1)))
        );
        assert_eq!(
            blocked(&key(ErrorCode::CostPerDayExceeded.as_str(), AT), AT),
            None
        );
        assert_eq!(blocked(&key("", 0), AT), None);
        assert_eq!(blocked(&key("something_new", AT + 1_000), AT), None);
    }

    #[test]
    fn past_the_limit_until_the_next_minute() {
        assert_eq!(minute_of(AT + 59_999), minute_of(AT));
        assert_eq!(minute_of(AT + 60_000), minute_of(AT) + 1);
        let e = minute_refusal(3, AT + 15_200);
        assert_eq!(
            (e.status, e.code),
            (429, ErrorCode::RequestsPerMinuteExceeded)
        );
        // 44.8 s left in the minute.
        assert_eq!(e.retry_after_s, Some(45));
        let last = minute_refusal(3, AT + 59_999);
        assert_eq!(last.retry_after_s, Some(1));
        let first = minute_refusal(3, AT);
        assert_eq!(first.retry_after_s, Some(60));
    }
}
