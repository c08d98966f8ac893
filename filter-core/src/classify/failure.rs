//! A classified failure: its class, when the provider said to come back, its code and message.

use ai_router_contract::failure::ErrorClass;
use ai_router_contract::failure::Hold;

/// A classified failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub class: ErrorClass,
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

impl Failure {
    /// A failure the gateway decides itself (a timeout, a broken stream), with no provider code.
    pub fn local(class: ErrorClass, status: u16, message: impl Into<String>) -> Self {
        Self {
            class,
            retry_at_ms: None,
            provider_code: None,
            message: message.into(),
            status,
            by_words: None,
        }
    }

    /// What this failure holds, by the one rule ([`ErrorClass::hold`]).
    pub fn hold(&self) -> Hold {
        self.class.hold(self.retry_at_ms.is_some())
    }
}
