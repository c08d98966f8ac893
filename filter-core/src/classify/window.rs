//! How long a failure holds: the window the provider names, or its calendar, capped by class.

use ai_router_contract::kinds::DailyReset;

use super::fields::{contains_any, ErrorFields};
use super::rules::{daily_rate_limit, quota_period, QuotaPeriod};
use super::tables::PER_DAY_TEXT;
use super::when::{header, regain_access_at, reset_moment, retry_at, try_again_in};
use ai_router_contract::failure::ErrorClass;

/// The longest a provider's window may cool a lane down (a rate limit, a retry-after on a
/// transient failure): a retry-after of days must not park a lane for good.
pub const MAX_RATE_LIMIT_COOLDOWN_MS: i64 = 3_600_000;
/// The longest a per-day rate limit (a model's TPD or RPD on a key) may cool its lane down.
pub const MAX_DAILY_LIMIT_COOLDOWN_MS: i64 = ai_router_contract::calendar::DAY_MS;
/// The longest a provider's window may blacklist a key for a spent quota (a monthly cap named
/// further out is checked again after a week).
pub const MAX_QUOTA_HOLD_MS: i64 = 7 * 86_400_000;

/// When the provider says the failure ends, capped by the class: a lane cools down at most
/// [`MAX_RATE_LIMIT_COOLDOWN_MS`], a key's spent quota holds it at most [`MAX_QUOTA_HOLD_MS`].
pub(super) fn window(
    daily_reset: Option<DailyReset>,
    class: ErrorClass,
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
        ErrorClass::Quota => {
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
        ErrorClass::RateLimit => {
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
