//! A provider's per-kind facts (`ai_router_contract::kinds`) with the config's overrides:
//! `perRequestCaps`, `dailyResetTimezone` and `rateLimitHeaders`, checked once here.

use ai_router_contract::kinds::{self, DailyReset, RateLimitWindow};

use crate::config::error::{invalid, ConfigError};
use crate::config::file::{ProviderConfig, ProviderKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderFacts {
    /// Tokens one request may send; 0: no cap beyond the model's window.
    pub max_input_tokens: u64,
    /// Tokens one request may ask for; 0: no cap.
    pub max_output_tokens: u64,
    pub daily_reset: Option<DailyReset>,
    pub requests_window: RateLimitWindow,
    pub tokens_window: RateLimitWindow,
}

/// `rolling`: the provider's daily quotas have no calendar reset.
pub const ROLLING: &str = "rolling";

pub fn resolve_facts(
    path: &str,
    kind: ProviderKind,
    raw: &ProviderConfig,
) -> Result<ProviderFacts, ConfigError> {
    let (cap_in, cap_out) = kinds::per_request_caps(kind);
    let caps = raw.per_request_caps.clone().unwrap_or_default();
    let daily_reset = match raw.daily_reset_timezone.as_deref() {
        None => DailyReset::of_kind(kind),
        Some(ROLLING) => None,
        Some(zone) => Some(DailyReset::parse(zone).ok_or_else(|| {
            invalid(format!(
                "{path}.dailyResetTimezone: `{zone}` is not a zone this gateway knows ({}, an \
                 offset such as +08:00, or {ROLLING})",
                kinds::ZONE_NAMES.join(", ")
            ))
        })?),
    };
    let (requests, tokens) = kinds::rate_limit_windows(kind);
    let headers = raw.rate_limit_headers.clone().unwrap_or_default();
    let window = |field: &str, value: Option<&str>, default: RateLimitWindow| match value {
        None => Ok(default),
        Some(text) => RateLimitWindow::parse(text).ok_or_else(|| {
            invalid(format!(
                "{path}.rateLimitHeaders.{field}: `{text}` must be minute or day"
            ))
        }),
    };
    Ok(ProviderFacts {
        max_input_tokens: caps.input_tokens.unwrap_or(cap_in),
        max_output_tokens: caps.output_tokens.unwrap_or(cap_out),
        daily_reset,
        requests_window: window("requests", headers.requests.as_deref(), requests)?,
        tokens_window: window("tokens", headers.tokens.as_deref(), tokens)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(yaml: &str) -> ProviderConfig {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_kind_brings_its_facts() {
        let github = resolve_facts("p", ProviderKind::Github, &raw("kind: github")).ok();
        assert_eq!(
            github.map(|f| (f.max_input_tokens, f.max_output_tokens)),
            Some((8_000, 4_000))
        );
        let groq = resolve_facts("p", ProviderKind::Groq, &raw("kind: groq")).ok();
        assert_eq!(
            groq.map(|f| (f.requests_window, f.tokens_window)),
            Some((RateLimitWindow::Day, RateLimitWindow::Minute))
        );
        let gemini = resolve_facts("p", ProviderKind::Gemini, &raw("kind: gemini")).ok();
        assert_eq!(
            gemini.and_then(|f| f.daily_reset),
            Some(DailyReset::Pacific)
        );
        let qwen = resolve_facts("p", ProviderKind::Qwen, &raw("kind: qwen")).ok();
        assert_eq!(
            qwen.and_then(|f| f.daily_reset),
            Some(DailyReset::Offset(480))
        );
        let openai = resolve_facts("p", ProviderKind::Openai, &raw("kind: openai")).ok();
        assert_eq!(
            openai.map(|f| (f.max_input_tokens, f.daily_reset)),
            Some((0, None))
        );
    }

    #[test]
    fn the_config_overrides_them() {
        let facts = resolve_facts(
            "providers[0]",
            ProviderKind::Github,
            &raw(
                "kind: github\nperRequestCaps: { inputTokens: 16000, outputTokens: 0 }\n\
                  dailyResetTimezone: '+05:30'\nrateLimitHeaders: { requests: day }",
            ),
        );
        let facts = facts.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (facts.max_input_tokens, facts.max_output_tokens),
            (16_000, 0)
        );
        assert_eq!(facts.daily_reset, Some(DailyReset::Offset(330)));
        assert_eq!(facts.requests_window, RateLimitWindow::Day);
        let rolling = resolve_facts(
            "p",
            ProviderKind::Gemini,
            &raw("kind: gemini\ndailyResetTimezone: rolling"),
        );
        assert_eq!(rolling.ok().and_then(|f| f.daily_reset), None);
    }

    #[test]
    fn bad_overrides_name_their_field() {
        let zone = resolve_facts(
            "providers[2]",
            ProviderKind::Qwen,
            &raw("kind: qwen\ndailyResetTimezone: Mars/Olympus"),
        );
        let message = zone.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("providers[2].dailyResetTimezone"),
            "{message}"
        );
        let window = resolve_facts(
            "providers[2]",
            ProviderKind::Groq,
            &raw("kind: groq\nrateLimitHeaders: { tokens: hour }"),
        );
        let message = window.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("rateLimitHeaders.tokens"), "{message}");
    }
}
