//! The proto enums <-> the contract's Rust types, and the text users see for each (events,
//! usage, `/metrics` labels, logs): the same strings the wire carried before it had enums.
//! Each conversion is defined here once.

use ai_router_contract::failure::ErrorClass as Class;
use ai_router_contract::kinds::ProviderKind as Kind;

use crate::v1::{
    AttemptOutcome, AttemptResult, BreakerPhase, BreakerScope, BudgetLevel, BudgetScope,
    BudgetWindow, CacheLookup, CacheStore, Capability, ErrorClass, FallbackTrigger, KeyOutReason,
    ProviderKind, ProviderOutReason, RequestOutcome, RequestResult,
};

impl From<Class> for ErrorClass {
    fn from(class: Class) -> Self {
        match class {
            Class::RateLimit => Self::RateLimit,
            Class::Quota => Self::Quota,
            Class::Auth => Self::Auth,
            Class::Transient => Self::Transient,
            Class::Network => Self::Network,
            Class::Timeout => Self::Timeout,
            Class::Stream => Self::Stream,
            Class::InvalidRequest => Self::InvalidRequest,
            Class::Cancelled => Self::Cancelled,
            Class::Deadline => Self::Deadline,
            Class::Mismatch => Self::Mismatch,
            Class::ContextLength => Self::ContextLength,
        }
    }
}

impl ErrorClass {
    /// The contract's class; `None` for unspecified.
    pub fn class(self) -> Option<Class> {
        Some(match self {
            Self::Unspecified => return None,
            Self::RateLimit => Class::RateLimit,
            Self::Quota => Class::Quota,
            Self::Auth => Class::Auth,
            Self::Transient => Class::Transient,
            Self::Network => Class::Network,
            Self::Timeout => Class::Timeout,
            Self::Stream => Class::Stream,
            Self::InvalidRequest => Class::InvalidRequest,
            Self::Cancelled => Class::Cancelled,
            Self::Deadline => Class::Deadline,
            Self::Mismatch => Class::Mismatch,
            Self::ContextLength => Class::ContextLength,
        })
    }

    /// The class's text ("rate_limit", ...); empty for unspecified.
    pub fn text(self) -> &'static str {
        self.class().map_or("", Class::as_str)
    }
}

impl AttemptResult {
    /// "success" or "error"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Success => "success",
            Self::Error => "error",
        }
    }
}

impl RequestResult {
    /// "success", "error" or "rejected"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Success => "success",
            Self::Error => "error",
            Self::Rejected => "rejected",
        }
    }
}

impl From<Kind> for ProviderKind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Anthropic => Self::Anthropic,
            Kind::Openrouter => Self::Openrouter,
            Kind::Qwen => Self::Qwen,
            Kind::Deepseek => Self::Deepseek,
            Kind::Openai => Self::Openai,
            Kind::Gemini => Self::Gemini,
            Kind::Groq => Self::Groq,
            Kind::OpenaiCompatible => Self::OpenaiCompatible,
            Kind::Mistral => Self::Mistral,
            Kind::Cerebras => Self::Cerebras,
            Kind::Kimi => Self::Kimi,
            Kind::Github => Self::Github,
            Kind::Nvidia => Self::Nvidia,
            Kind::Sambanova => Self::Sambanova,
            Kind::Cloudflare => Self::Cloudflare,
            Kind::Cohere => Self::Cohere,
            Kind::Siliconflow => Self::Siliconflow,
            Kind::Zai => Self::Zai,
        }
    }
}

impl ProviderKind {
    /// The contract's kind; `None` for unspecified.
    pub fn kind(self) -> Option<Kind> {
        Kind::ALL.into_iter().find(|&kind| Self::from(kind) == self)
    }

    /// The kind as the configuration spells it ("openai-compatible", ...); empty for
    /// unspecified.
    pub fn text(self) -> &'static str {
        self.kind().map_or("", Kind::as_str)
    }
}

impl From<ai_router_contract::kinds::RateLimitWindow> for crate::v1::RateLimitWindow {
    fn from(window: ai_router_contract::kinds::RateLimitWindow) -> Self {
        match window {
            ai_router_contract::kinds::RateLimitWindow::Minute => Self::Minute,
            ai_router_contract::kinds::RateLimitWindow::Day => Self::Day,
        }
    }
}

impl crate::v1::RateLimitWindow {
    /// The contract's window; a minute when unspecified (the OpenAI convention).
    pub fn window(self) -> ai_router_contract::kinds::RateLimitWindow {
        match self {
            Self::Day => ai_router_contract::kinds::RateLimitWindow::Day,
            Self::Unspecified | Self::Minute => ai_router_contract::kinds::RateLimitWindow::Minute,
        }
    }
}

impl Capability {
    /// "chat", "streaming", "tools", "json" or "embeddings"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Chat => "chat",
            Self::Streaming => "streaming",
            Self::Tools => "tools",
            Self::Json => "json",
            Self::Embeddings => "embeddings",
        }
    }
}

impl BreakerScope {
    /// "key" or "provider"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Key => "key",
            Self::Provider => "provider",
        }
    }
}

impl BreakerPhase {
    /// "closed", "open" or "half_open"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

impl KeyOutReason {
    /// "auth", "quota" or "missing"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Auth => "auth",
            Self::Quota => "quota",
            Self::Missing => "missing",
        }
    }
}

impl crate::v1::KeyHealth {
    /// When the key comes back (ms since the epoch); `None` ("no end"): when its secret
    /// changes or an operator resets it. What every surface shows for `until_ms` (0 on the wire).
    pub fn until(&self) -> Option<i64> {
        (self.until_ms > 0).then_some(self.until_ms)
    }
}

impl crate::v1::AdminEventType {
    /// Every type an event subscriber may ask for (not `lagged`, which is sent, never asked).
    pub const ASKABLE: [Self; 7] = [
        Self::Attempt,
        Self::Request,
        Self::Breaker,
        Self::KeyDisabled,
        Self::KeyRestored,
        Self::Budget,
        Self::Admin,
    ];

    /// The type's text, as events name themselves ("key-disabled", ...); empty for
    /// unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Attempt => "attempt",
            Self::Request => "request",
            Self::Breaker => "breaker",
            Self::KeyDisabled => "key-disabled",
            Self::KeyRestored => "key-restored",
            Self::Budget => "budget",
            Self::Admin => "admin",
            Self::Lagged => "lagged",
        }
    }

    /// The type of that text, if it names one.
    pub fn from_text(text: &str) -> Option<Self> {
        Self::ASKABLE
            .into_iter()
            .chain([Self::Lagged])
            .find(|t| t.text() == text)
    }
}

impl ProviderOutReason {
    /// "budget"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Budget => "budget",
        }
    }
}

impl BudgetScope {
    /// "key", "profile", "provider", "pool"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Key => "key",
            Self::Profile => "profile",
            Self::Provider => "provider",
            Self::Pool => "pool",
        }
    }
}

impl BudgetWindow {
    /// "request", "hour", "day", "month"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Request => "request",
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Month => "month",
        }
    }
}

impl BudgetLevel {
    /// "warn", "over"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Warn => "warn",
            Self::Over => "over",
        }
    }
}

impl CacheLookup {
    /// "hit", "miss", "bypass"; empty for unspecified (the cache was off for the call).
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Bypass => "bypass",
        }
    }
}

impl CacheStore {
    /// "stored", "unstorable", "too_large"; empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Stored => "stored",
            Self::Unstorable => "unstorable",
            Self::TooLarge => "too_large",
        }
    }
}

/// The class text of a failed request whose attempts' failure is not known.
pub const UNKNOWN_REQUEST_CLASS: &str = "upstream";

impl AttemptOutcome {
    /// The contract's class of a failed attempt.
    pub fn class(&self) -> Option<Class> {
        self.error_class().class()
    }
}

impl RequestOutcome {
    /// The result, and what qualifies it: the class of an error ("upstream" when unknown), the
    /// code of a rejection; `None` for a success.
    pub fn result_parts(&self) -> (&'static str, Option<&str>) {
        let result = self.outcome();
        let detail = match result {
            RequestResult::Error => Some(match self.error_class().class() {
                Some(class) => class.as_str(),
                None => UNKNOWN_REQUEST_CLASS,
            }),
            RequestResult::Rejected => Some(self.rejected_code.as_str()),
            RequestResult::Success | RequestResult::Unspecified => None,
        };
        (result.text(), detail)
    }

    /// The outcome in text: `"success"`, `"error:<class>"` or `"rejected:<code>"`.
    pub fn outcome_text(&self) -> String {
        match self.result_parts() {
            (result, Some(detail)) => format!("{result}:{detail}"),
            (result, None) => result.to_owned(),
        }
    }
}

impl FallbackTrigger {
    /// Every trigger a `when` list may name.
    pub const ALL: [FallbackTrigger; 6] = [
        Self::Timeout,
        Self::RateLimit,
        Self::ProviderError,
        Self::BudgetExceeded,
        Self::Quota,
        Self::Auth,
    ];

    /// The trigger as a `when` list spells it ("rate_limit", ...); empty for unspecified.
    pub fn text(self) -> &'static str {
        match self {
            Self::Unspecified => "",
            Self::Timeout => "timeout",
            Self::RateLimit => "rate_limit",
            Self::ProviderError => "provider_error",
            Self::BudgetExceeded => "budget_exceeded",
            Self::Quota => "quota",
            Self::Auth => "auth",
        }
    }

    /// The trigger of that text, if it names one.
    pub fn from_text(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.text() == text)
    }

    /// What an attempt that failed with `class` triggers: transient, network and stream
    /// failures are provider errors; a failure that is the caller's (an invalid request, a
    /// cancel, the call's deadline, a mismatched answer) triggers nothing.
    pub fn of_class(class: Class) -> Option<Self> {
        Some(match class {
            Class::Timeout => Self::Timeout,
            Class::RateLimit => Self::RateLimit,
            Class::Quota => Self::Quota,
            Class::Auth => Self::Auth,
            Class::Transient | Class::Network | Class::Stream => Self::ProviderError,
            // A prompt too long for the lane moves on by its own rule (a larger lane only).
            Class::ContextLength
            | Class::InvalidRequest
            | Class::Cancelled
            | Class::Deadline
            | Class::Mismatch => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_round_trips_with_its_text() {
        for n in 1..=11 {
            let pb = ErrorClass::try_from(n).unwrap_or(ErrorClass::Unspecified);
            let class = pb.class().unwrap_or(Class::Cancelled);
            assert_eq!(ErrorClass::from(class), pb);
            assert_eq!(Class::parse(pb.text()), Some(class));
        }
        assert_eq!(ErrorClass::Unspecified.text(), "");
    }

    #[test]
    fn request_outcomes_read_as_before() {
        let mut r = RequestOutcome {
            outcome: RequestResult::Success.into(),
            ..Default::default()
        };
        assert_eq!(r.outcome_text(), "success");
        r.outcome = RequestResult::Error.into();
        assert_eq!(r.outcome_text(), "error:upstream");
        r.error_class = ErrorClass::Timeout.into();
        assert_eq!(r.outcome_text(), "error:timeout");
        r.outcome = RequestResult::Rejected.into();
        r.rejected_code = "model_not_allowed".into();
        assert_eq!(r.outcome_text(), "rejected:model_not_allowed");
    }
}
