//! Per-key quotas at the front stage, after the key is authenticated and before routing.
//!
//! - A block the control plane pushed (`VirtualKey.quota_code` until `quota_until_ms`: tokens
//!   or cost spent for the UTC day or month) answers 429 with that code until it ends.
//! - `requests_per_minute` is counted here, per key and UTC minute, in Envoy's shared data: one
//!   entry per key holding (minute, count), which a new minute overwrites (nothing leaks). A
//!   request past the limit answers 429 `requests_per_minute_exceeded` until the next minute.
//!
//! Every 429 carries `Retry-After` (whole seconds, at least 1) and is reported as
//! `rejected:<code>` like any other refusal.

use ai_router_proto::v1::VirtualKey;

use crate::errors::{ErrorCode, GatewayError};

const MINUTE_MS: i64 = 60_000;

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

/// The UTC minute of `now_ms` (minutes since the epoch).
pub fn minute_of(now_ms: i64) -> i64 {
    now_ms.div_euclid(MINUTE_MS)
}

/// One key's request count in one UTC minute, as stored in shared data (12 bytes, big endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinuteCount {
    pub minute: i64,
    pub count: u32,
}

impl MinuteCount {
    pub fn encode(self) -> [u8; 12] {
        let mut out = [0u8; 12];
        out[..8].copy_from_slice(&self.minute.to_be_bytes());
        out[8..].copy_from_slice(&self.count.to_be_bytes());
        out
    }

    /// `None` for anything that is not an entry (absent, another length).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let minute = i64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
        let count = u32::from_be_bytes(bytes.get(8..12)?.try_into().ok()?);
        (bytes.len() == 12).then_some(Self { minute, count })
    }

    /// The entry after one more request in `minute`: a count from an older minute starts over.
    pub fn bump(stored: Option<Self>, minute: i64) -> Self {
        match stored {
            Some(s) if s.minute == minute => Self {
                minute,
                count: s.count.saturating_add(1),
            },
            // An entry from a later minute (another worker's clock ran ahead) keeps counting
            // there rather than restarting the window.
            Some(s) if s.minute > minute => Self {
                minute: s.minute,
                count: s.count.saturating_add(1),
            },
            _ => Self { minute, count: 1 },
        }
    }
}

/// The 429 for the request that made `count` in this minute, when it is past `limit`
/// (0 = no limit).
pub fn over_minute_limit(limit: u64, count: u32, now_ms: i64) -> Option<GatewayError> {
    if limit == 0 || u64::from(count) <= limit {
        return None;
    }
    let next_minute = (minute_of(now_ms) + 1).saturating_mul(MINUTE_MS);
    Some(
        GatewayError::new(
            ErrorCode::RequestsPerMinuteExceeded,
            format!("This key may make {limit} requests per minute; try again in the next minute."),
        )
        .with_retry_after(Some(seconds_until(now_ms, next_minute))),
    )
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
    fn the_minute_counter_starts_over_each_minute() {
        let m = minute_of(AT);
        let first = MinuteCount::bump(None, m);
        assert_eq!(
            first,
            MinuteCount {
                minute: m,
                count: 1
            }
        );
        let third = MinuteCount::bump(Some(MinuteCount::bump(Some(first), m)), m);
        assert_eq!(third.count, 3);
        // The next minute overwrites the old entry.
        assert_eq!(
            MinuteCount::bump(Some(third), m + 1),
            MinuteCount {
                minute: m + 1,
                count: 1
            }
        );
        // A worker whose clock lags does not reset a later minute.
        assert_eq!(
            MinuteCount::bump(Some(third), m - 1),
            MinuteCount {
                minute: m,
                count: 4
            }
        );
        assert_eq!(MinuteCount::decode(&third.encode()), Some(third));
        assert_eq!(MinuteCount::decode(&[0; 4]), None);
        assert_eq!(MinuteCount::decode(&[0; 13]), None);
        assert_eq!(MinuteCount::decode(&[]), None);
    }

    #[test]
    fn past_the_limit_until_the_next_minute() {
        assert_eq!(over_minute_limit(0, 1_000, AT), None);
        assert_eq!(over_minute_limit(3, 3, AT), None);
        let e = over_minute_limit(3, 4, AT + 15_200).expect("over");
        assert_eq!(
            (e.status, e.code),
            (429, ErrorCode::RequestsPerMinuteExceeded)
        );
        // 44.8 s left in the minute.
        assert_eq!(e.retry_after_s, Some(45));
        let last = over_minute_limit(3, 9, AT + 59_999).expect("over");
        assert_eq!(last.retry_after_s, Some(1));
        let first = over_minute_limit(3, 9, AT).expect("over");
        assert_eq!(first.retry_after_s, Some(60));
    }
}
