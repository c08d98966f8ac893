//! Why an attempt failed and what the failure holds: one rule for the filter, which applies it
//! to its own view at once, and for the control plane, which applies it to the state it pushes
//! to every filter.
//!
//! | class | holds | counts for the breakers |
//! |---|---|---|
//! | `rate_limit` | the lane (key and model) cools down | no |
//! | `quota`, `auth` | the key is blacklisted | no |
//! | `transient`, `network`, `timeout`, `stream` | the lane, when the provider said when to come back | yes |
//! | `invalid_request`, `cancelled`, `deadline`, `mismatch`, `context_length` | nothing | no |
//!
//! `context_length` (the prompt is past the model's window or the provider's per-request cap)
//! is the one 400 that may go on: to a lane whose model takes more, never to one no larger
//! (the attempt stage decides, from the plan's lanes).

/// The provider code of a key whose type the provider refuses outright (Gemini's unrestricted
/// keys): an auth failure that holds the key until its secret changes, whatever
/// `authDisableMs` says, since no wait makes such a key work.
pub const UNSUPPORTED_KEY_TYPE: &str = "unsupported_key_type";

/// Why an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
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
    /// The prompt is too long for the lane's model (a 413, or a 400 that says so): only a
    /// lane with a larger window or per-request cap may take the call.
    ContextLength,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RateLimit => "rate_limit",
            Self::Quota => "quota",
            Self::Auth => "auth",
            Self::Transient => "transient",
            Self::Network => "network",
            Self::Timeout => "timeout",
            Self::Stream => "stream",
            Self::InvalidRequest => "invalid_request",
            Self::Cancelled => "cancelled",
            Self::Deadline => "deadline",
            Self::Mismatch => "mismatch",
            Self::ContextLength => "context_length",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "rate_limit" => Self::RateLimit,
            "quota" => Self::Quota,
            "auth" => Self::Auth,
            "transient" => Self::Transient,
            "network" => Self::Network,
            "timeout" => Self::Timeout,
            "stream" => Self::Stream,
            "invalid_request" => Self::InvalidRequest,
            "cancelled" => Self::Cancelled,
            "deadline" => Self::Deadline,
            "mismatch" => Self::Mismatch,
            "context_length" => Self::ContextLength,
            _ => return None,
        })
    }

    /// Whether another attempt may succeed where this one failed. A context-length failure
    /// is not, as such: only a larger lane may (the attempt stage looks for one).
    pub fn retryable(self) -> bool {
        !matches!(
            self,
            Self::InvalidRequest | Self::Cancelled | Self::Deadline | Self::ContextLength
        )
    }

    /// Failures that belong to one key: the next key is tried without backoff.
    pub fn belongs_to_key(self) -> bool {
        matches!(self, Self::RateLimit | Self::Quota | Self::Auth)
    }

    /// The failures of the lane itself, not of one key or one request: they count against the
    /// key's and the provider's breakers.
    pub fn counts_for_breakers(self) -> bool {
        matches!(
            self,
            Self::Transient | Self::Network | Self::Timeout | Self::Stream
        )
    }

    /// What a failure of this class holds; `retry_after`: the provider said when to come back.
    /// A rate limit cools the lane, a spent quota or a refused secret blacklists the key, a
    /// failure of the lane with a retry-after also cools the lane.
    pub fn hold(self, retry_after: bool) -> Hold {
        match self {
            Self::RateLimit => Hold::Lane,
            Self::Quota | Self::Auth => Hold::Key,
            _ if self.counts_for_breakers() && retry_after => Hold::Lane,
            _ => Hold::Nothing,
        }
    }
}

/// What a failure holds, as the attempt stage applies it: the lane (the key and model cool
/// down), the key (blacklisted), or nothing (a transient failure only feeds the breakers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    Lane,
    Key,
    Nothing,
}

impl Hold {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lane => "lane",
            Self::Key => "key",
            Self::Nothing => "none",
        }
    }
}

/// The windows a hold lasts when the provider names none (`resilience:` of the pool). Each is
/// above 0: the control plane refuses a 0 at load (a window of 0 would take nothing out while
/// health called the key out, or, pushed, read as "unset"), so a 0 pushed to the filter means
/// "not set" and reads as the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldWindows {
    /// `rateLimitCooldownMs`: a rate-limited lane cools down this long.
    pub rate_limit_cooldown_ms: u64,
    /// `quotaBlacklistMs`: a key with a spent quota is out this long.
    pub quota_blacklist_ms: u64,
    /// `authDisableMs`: a key whose secret was refused is out this long; `None`: until its
    /// secret changes.
    pub auth_disable_ms: Option<u64>,
}

impl Default for HoldWindows {
    fn default() -> Self {
        Self {
            rate_limit_cooldown_ms: crate::defaults::RATE_LIMIT_COOLDOWN_MS,
            quota_blacklist_ms: crate::defaults::QUOTA_BLACKLIST_MS,
            auth_disable_ms: None,
        }
    }
}

impl HoldWindows {
    /// The windows as the sync protocol carries them, where 0 is "not set": the default, and
    /// for `authDisableMs` "until the secret changes".
    pub fn from_pushed(
        rate_limit_cooldown_ms: u64,
        quota_blacklist_ms: u64,
        auth_disable_ms: u64,
    ) -> Self {
        let or = |v: u64, default: u64| if v > 0 { v } else { default };
        Self {
            rate_limit_cooldown_ms: or(
                rate_limit_cooldown_ms,
                crate::defaults::RATE_LIMIT_COOLDOWN_MS,
            ),
            quota_blacklist_ms: or(quota_blacklist_ms, crate::defaults::QUOTA_BLACKLIST_MS),
            auth_disable_ms: (auth_disable_ms > 0).then_some(auth_disable_ms),
        }
    }

    /// Until when a failure of `class` holds its lane or key, decided at `now_ms`: the
    /// provider's window (`retry_at_ms`) where it named one (an auth failure names none), else
    /// these windows; `0`: until the key's secret changes (an auth failure with no
    /// `authDisableMs`, or a key type the provider refuses outright). `None`: the failure holds
    /// nothing ([`ErrorClass::hold`]). The one rule: the filter applies it to its own view at
    /// once, the control plane to the state it pushes.
    pub fn held_until(
        &self,
        class: ErrorClass,
        retry_at_ms: Option<i64>,
        provider_code: Option<&str>,
        now_ms: i64,
    ) -> Option<(Hold, i64)> {
        let after = |ms: u64| now_ms.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX));
        let hold = class.hold(retry_at_ms.is_some());
        let until = match (hold, class) {
            (Hold::Nothing, _) => return None,
            (Hold::Key, ErrorClass::Auth) => match self.auth_disable_ms {
                Some(ms) if provider_code != Some(UNSUPPORTED_KEY_TYPE) => after(ms),
                _ => 0,
            },
            (Hold::Key, _) => retry_at_ms.unwrap_or_else(|| after(self.quota_blacklist_ms)),
            (Hold::Lane, _) => retry_at_ms.unwrap_or_else(|| after(self.rate_limit_cooldown_ms)),
        };
        Some((hold, until))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ErrorClass; 12] = [
        ErrorClass::RateLimit,
        ErrorClass::Quota,
        ErrorClass::Auth,
        ErrorClass::Transient,
        ErrorClass::Network,
        ErrorClass::Timeout,
        ErrorClass::Stream,
        ErrorClass::InvalidRequest,
        ErrorClass::Cancelled,
        ErrorClass::Deadline,
        ErrorClass::Mismatch,
        ErrorClass::ContextLength,
    ];

    #[test]
    fn names_round_trip() {
        for class in ALL {
            assert_eq!(ErrorClass::parse(class.as_str()), Some(class));
        }
        assert_eq!(ErrorClass::parse(""), None);
        assert_eq!(ErrorClass::parse("overloaded"), None);
    }

    #[test]
    fn the_hold_table() {
        use ErrorClass::*;
        let table = [
            (RateLimit, Hold::Lane, Hold::Lane, false),
            (Quota, Hold::Key, Hold::Key, false),
            (Auth, Hold::Key, Hold::Key, false),
            (Transient, Hold::Nothing, Hold::Lane, true),
            (Network, Hold::Nothing, Hold::Lane, true),
            (Timeout, Hold::Nothing, Hold::Lane, true),
            (Stream, Hold::Nothing, Hold::Lane, true),
            (InvalidRequest, Hold::Nothing, Hold::Nothing, false),
            (Cancelled, Hold::Nothing, Hold::Nothing, false),
            (Deadline, Hold::Nothing, Hold::Nothing, false),
            (Mismatch, Hold::Nothing, Hold::Nothing, false),
            (ContextLength, Hold::Nothing, Hold::Nothing, false),
        ];
        assert_eq!(table.len(), ALL.len());
        for (class, without_window, with_window, counts) in table {
            assert_eq!(class.hold(false), without_window, "{class:?}");
            assert_eq!(
                class.hold(true),
                with_window,
                "{class:?} with a retry-after"
            );
            assert_eq!(class.counts_for_breakers(), counts, "{class:?}");
        }
    }

    #[test]
    fn held_until_uses_the_providers_window_else_the_configured_one() {
        use ErrorClass::*;
        let w = HoldWindows {
            rate_limit_cooldown_ms: 7,
            quota_blacklist_ms: 11,
            auth_disable_ms: Some(13),
        };
        let now = 1_000;
        assert_eq!(
            w.held_until(RateLimit, None, None, now),
            Some((Hold::Lane, 1_007))
        );
        assert_eq!(
            w.held_until(RateLimit, Some(5_000), None, now),
            Some((Hold::Lane, 5_000))
        );
        assert_eq!(
            w.held_until(Quota, None, None, now),
            Some((Hold::Key, 1_011))
        );
        assert_eq!(
            w.held_until(Quota, Some(9_000), None, now),
            Some((Hold::Key, 9_000))
        );
        assert_eq!(
            w.held_until(Auth, None, None, now),
            Some((Hold::Key, 1_013))
        );
        assert_eq!(
            w.held_until(Auth, None, Some(UNSUPPORTED_KEY_TYPE), now),
            Some((Hold::Key, 0))
        );
        assert_eq!(w.held_until(Transient, None, None, now), None);
        assert_eq!(
            w.held_until(Transient, Some(2_000), None, now),
            Some((Hold::Lane, 2_000))
        );
        assert_eq!(w.held_until(InvalidRequest, Some(2_000), None, now), None);
        // No authDisableMs: until the secret changes.
        let until_changed = HoldWindows {
            auth_disable_ms: None,
            ..w
        };
        assert_eq!(
            until_changed.held_until(Auth, None, None, now),
            Some((Hold::Key, 0))
        );
        // Pushed zeros are "not set".
        assert_eq!(HoldWindows::from_pushed(0, 0, 0), HoldWindows::default());
        assert_eq!(HoldWindows::from_pushed(7, 11, 13), w);
    }

    /// The classes the control plane's breakers count, by the names reports carry.
    #[test]
    fn counted_classes() {
        let counts =
            |name: &str| ErrorClass::parse(name).is_some_and(ErrorClass::counts_for_breakers);
        for class in ["transient", "network", "timeout", "stream"] {
            assert!(counts(class), "{class}");
        }
        for class in [
            "rate_limit",
            "quota",
            "auth",
            "invalid_request",
            "cancelled",
            "",
        ] {
            assert!(!counts(class), "{class}");
        }
    }
}
