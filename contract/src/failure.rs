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
