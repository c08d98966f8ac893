//! Per-kind facts about providers, as defaults the configuration may override (the control
//! plane resolves them once and pushes them with each provider): the zone a provider's daily
//! quotas reset in, what its `x-ratelimit-*` headers count per, and the caps it puts on one
//! request whatever the model's window.

use crate::calendar::{next_pacific_midnight_ms, next_utc_midnight_ms, DAY_MS};

/// Where a provider's day ends: UTC, Pacific time (DST-aware, as Google's quotas) or a fixed
/// offset from UTC (China Standard Time, +08:00, has no summer time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DailyReset {
    Utc,
    Pacific,
    /// Minutes east of UTC.
    Offset(i32),
}

/// The zone names [`DailyReset::parse`] knows, besides `±HH:MM`.
pub const ZONE_NAMES: &[&str] = &["UTC", "America/Los_Angeles", "Asia/Shanghai", "Asia/Tokyo"];

impl DailyReset {
    /// `UTC`, `America/Los_Angeles`, `Asia/Shanghai` (+08:00), `Asia/Tokyo` (+09:00), or an
    /// offset `+HH:MM` / `-HH:MM`. Zones with summer time other than Pacific are not known:
    /// name the offset instead.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        Some(match text {
            "UTC" | "Etc/UTC" | "Z" => Self::Utc,
            "America/Los_Angeles" | "US/Pacific" | "Pacific" => Self::Pacific,
            "Asia/Shanghai" | "Asia/Hong_Kong" | "Asia/Singapore" | "PRC" => Self::Offset(480),
            "Asia/Tokyo" => Self::Offset(540),
            _ => {
                let sign = match text.as_bytes().first()? {
                    b'+' => 1,
                    b'-' => -1,
                    _ => return None,
                };
                let (h, m) = text.get(1..)?.split_once(':')?;
                let (h, m) = (h.parse::<i32>().ok()?, m.parse::<i32>().ok()?);
                if (0..=14).contains(&h) && (0..60).contains(&m) {
                    Self::Offset(sign * (h * 60 + m))
                } else {
                    return None;
                }
            }
        })
    }

    /// The text pushed to the filter and shown to operators.
    pub fn text(self) -> String {
        match self {
            Self::Utc => "UTC".into(),
            Self::Pacific => "America/Los_Angeles".into(),
            Self::Offset(minutes) => {
                let sign = if minutes < 0 { '-' } else { '+' };
                let m = minutes.unsigned_abs();
                format!("{sign}{:02}:{:02}", m / 60, m % 60)
            }
        }
    }

    /// The first moment of the provider's next day after `now_ms`.
    pub fn next_midnight_ms(self, now_ms: i64) -> i64 {
        match self {
            Self::Utc => next_utc_midnight_ms(now_ms),
            Self::Pacific => next_pacific_midnight_ms(now_ms),
            Self::Offset(minutes) => {
                let offset = i64::from(minutes) * 60_000;
                ((now_ms + offset).div_euclid(DAY_MS) + 1) * DAY_MS - offset
            }
        }
    }

    /// The zone a kind's daily quotas reset in, where the kind has one: Gemini at midnight
    /// Pacific, DashScope (Qwen) at midnight China time, Cerebras and Cloudflare at 00:00 UTC.
    /// Other kinds count rolling windows, or say when in their answers.
    pub fn of_kind(kind: &str) -> Option<Self> {
        match kind {
            "gemini" => Some(Self::Pacific),
            "qwen" => Some(Self::Offset(480)),
            "cerebras" | "cloudflare" => Some(Self::Utc),
            _ => None,
        }
    }
}

/// The window a provider's `x-ratelimit-*-requests` or `-tokens` headers count over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitWindow {
    Minute,
    Day,
}

impl RateLimitWindow {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "minute" => Some(Self::Minute),
            "day" => Some(Self::Day),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Minute => "minute",
            Self::Day => "day",
        }
    }
}

/// What a kind's rate-limit headers count: `(requests, tokens)`. Groq's are inverted from
/// OpenAI's: `x-ratelimit-limit-requests` is requests per day, `-tokens` tokens per minute.
pub fn rate_limit_windows(kind: &str) -> (RateLimitWindow, RateLimitWindow) {
    match kind {
        "groq" => (RateLimitWindow::Day, RateLimitWindow::Minute),
        _ => (RateLimitWindow::Minute, RateLimitWindow::Minute),
    }
}

/// The caps a kind puts on one request, `(input tokens, output tokens)`, 0 for none: GitHub
/// Models takes 8K tokens in and 4K out whatever the model's advertised window.
pub fn per_request_caps(kind: &str) -> (u64, u64) {
    match kind {
        "github" => (8_000, 4_000),
        _ => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_parse_and_print() {
        assert_eq!(DailyReset::parse("UTC"), Some(DailyReset::Utc));
        assert_eq!(
            DailyReset::parse("America/Los_Angeles"),
            Some(DailyReset::Pacific)
        );
        assert_eq!(
            DailyReset::parse("Asia/Shanghai"),
            Some(DailyReset::Offset(480))
        );
        assert_eq!(DailyReset::parse("-05:30"), Some(DailyReset::Offset(-330)));
        assert_eq!(DailyReset::parse("+15:00"), None);
        assert_eq!(DailyReset::parse("Europe/Berlin"), None);
        assert_eq!(DailyReset::parse("08:00"), None);
        for zone in ["UTC", "America/Los_Angeles", "+08:00", "-05:30"] {
            let parsed = DailyReset::parse(zone).map(DailyReset::text);
            assert_eq!(parsed.as_deref(), Some(zone));
        }
    }

    #[test]
    fn the_next_midnight_of_each_zone() {
        // 2026-12-01T14:00:00Z: 22:00 in Shanghai, 06:00 PST in Los Angeles.
        let now = 1_796_133_600_000;
        let china = DailyReset::Offset(480).next_midnight_ms(now);
        // 2026-12-01T16:00:00Z is midnight of 2026-12-02 in China.
        assert_eq!(china, 1_796_140_800_000);
        assert_eq!(DailyReset::Utc.next_midnight_ms(now), 1_796_169_600_000);
        // 2026-12-02T08:00:00Z is midnight PST.
        assert_eq!(DailyReset::Pacific.next_midnight_ms(now), 1_796_198_400_000);
        // Exactly at a zone's midnight: the next one, a day on.
        assert_eq!(
            DailyReset::Offset(480).next_midnight_ms(china),
            china + DAY_MS
        );
    }

    #[test]
    fn kind_facts() {
        assert_eq!(DailyReset::of_kind("gemini"), Some(DailyReset::Pacific));
        assert_eq!(DailyReset::of_kind("qwen"), Some(DailyReset::Offset(480)));
        assert_eq!(DailyReset::of_kind("openai"), None);
        assert_eq!(
            rate_limit_windows("groq"),
            (RateLimitWindow::Day, RateLimitWindow::Minute)
        );
        assert_eq!(per_request_caps("github"), (8_000, 4_000));
        assert_eq!(per_request_caps("openai"), (0, 0));
    }
}
