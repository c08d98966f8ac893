//! Per-kind facts about providers, as defaults the configuration may override (the control
//! plane resolves them once and pushes them with each provider): the zone a provider's daily
//! quotas reset in, what its `x-ratelimit-*` headers count per, and the caps it puts on one
//! request whatever the model's window.

use crate::calendar::{next_pacific_midnight_ms, next_utc_midnight_ms, DAY_MS};

/// A provider kind: the one list of them. The configuration's `kind`, the wire enum
/// (`ai_router_proto::v1::ProviderKind`), the mock's error table and the docs iterate
/// [`ProviderKind::ALL`] or match this enum; a new kind is added here and the compiler names
/// every place that must learn it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProviderKind {
    Anthropic,
    Openrouter,
    Qwen,
    Deepseek,
    Openai,
    Gemini,
    Groq,
    OpenaiCompatible,
    Mistral,
    Cerebras,
    Kimi,
    Github,
    Nvidia,
    Sambanova,
    Cloudflare,
    Cohere,
    Siliconflow,
    Zai,
}

impl ProviderKind {
    /// Every kind, in the wire enum's order.
    pub const ALL: [Self; 18] = [
        Self::Anthropic,
        Self::Openrouter,
        Self::Qwen,
        Self::Deepseek,
        Self::Openai,
        Self::Gemini,
        Self::Groq,
        Self::OpenaiCompatible,
        Self::Mistral,
        Self::Cerebras,
        Self::Kimi,
        Self::Github,
        Self::Nvidia,
        Self::Sambanova,
        Self::Cloudflare,
        Self::Cohere,
        Self::Siliconflow,
        Self::Zai,
    ];

    /// The kind as the configuration spells it ("openai-compatible", ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Openrouter => "openrouter",
            Self::Qwen => "qwen",
            Self::Deepseek => "deepseek",
            Self::Openai => "openai",
            Self::Gemini => "gemini",
            Self::Groq => "groq",
            Self::OpenaiCompatible => "openai-compatible",
            Self::Mistral => "mistral",
            Self::Cerebras => "cerebras",
            Self::Kimi => "kimi",
            Self::Github => "github",
            Self::Nvidia => "nvidia",
            Self::Sambanova => "sambanova",
            Self::Cloudflare => "cloudflare",
            Self::Cohere => "cohere",
            Self::Siliconflow => "siliconflow",
            Self::Zai => "zai",
        }
    }

    /// The kind [`as_str`](Self::as_str) spells `text`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == text)
    }

    /// Every kind's text, in [`ALL`](Self::ALL) order (what an unknown kind is told).
    pub fn names() -> &'static [&'static str] {
        static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
        NAMES.get_or_init(|| Self::ALL.iter().map(|kind| kind.as_str()).collect())
    }

    /// The kind's own endpoint; Cloudflare's hangs from the account
    /// ([`CLOUDFLARE_BASE_URL`]), openai-compatible has none.
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            Self::Openai => Some("https://api.openai.com/v1"),
            Self::Anthropic => Some("https://api.anthropic.com/v1"),
            Self::Openrouter => Some("https://openrouter.ai/api/v1"),
            Self::Qwen => Some("https://dashscope-intl.aliyuncs.com/compatible-mode/v1"),
            Self::Deepseek => Some("https://api.deepseek.com/v1"),
            Self::Gemini => Some("https://generativelanguage.googleapis.com/v1beta/openai"),
            Self::Groq => Some("https://api.groq.com/openai/v1"),
            Self::Mistral => Some("https://api.mistral.ai/v1"),
            Self::Cerebras => Some("https://api.cerebras.ai/v1"),
            Self::Kimi => Some("https://api.moonshot.ai/v1"),
            Self::Github => Some("https://models.github.ai/inference"),
            Self::Nvidia => Some("https://integrate.api.nvidia.com/v1"),
            Self::Sambanova => Some("https://api.sambanova.ai/v1"),
            Self::Cohere => Some("https://api.cohere.ai/compatibility/v1"),
            Self::Siliconflow => Some("https://api.siliconflow.com/v1"),
            Self::Zai => Some("https://api.z.ai/api/paas/v4"),
            Self::Cloudflare | Self::OpenaiCompatible => None,
        }
    }

    /// The header that carries the secret; `authorization` sends `Bearer <secret>`.
    pub fn auth_header(self) -> &'static str {
        match self {
            Self::Anthropic => "x-api-key",
            _ => "authorization",
        }
    }

    pub fn supports_embeddings(self) -> bool {
        !matches!(
            self,
            Self::Anthropic | Self::Deepseek | Self::Groq | Self::Cerebras | Self::Kimi | Self::Zai
        )
    }

    /// The environment prefix the kind's keys go by (`keysFromEnv`): `<PREFIX>_API_KEY`..., or
    /// for a prefix that names a whole variable (`GITHUB_TOKEN`) that variable and its twins.
    pub fn env_prefix(self) -> Option<&'static str> {
        Some(match self {
            Self::Anthropic => "ANTHROPIC",
            Self::Openrouter => "OPENROUTER",
            Self::Qwen => "DASHSCOPE",
            Self::Deepseek => "DEEPSEEK",
            Self::Openai => "OPENAI",
            Self::Gemini => "GEMINI",
            Self::Groq => "GROQ",
            Self::Mistral => "MISTRAL",
            Self::Cerebras => "CEREBRAS",
            Self::Kimi => "KIMI",
            Self::Github => "GITHUB_TOKEN",
            Self::Nvidia => "NVIDIA",
            Self::Sambanova => "SAMBANOVA",
            Self::Cloudflare => "CLOUDFLARE",
            Self::Cohere => "COHERE",
            Self::Siliconflow => "SILICONFLOW",
            Self::Zai => "ZAI",
            Self::OpenaiCompatible => return None,
        })
    }

    /// Other prefixes whose keys a provider of this kind also takes under `keysFromEnv`: Qwen's
    /// keys are as often exported as `QWEN_API_KEY` as under DashScope's name.
    pub fn env_prefix_aliases(self) -> &'static [&'static str] {
        match self {
            Self::Qwen => &["QWEN"],
            _ => &[],
        }
    }
}

/// Cloudflare Workers AI's OpenAI endpoint, under the account (`accountId`).
pub const CLOUDFLARE_BASE_URL: &str =
    "https://api.cloudflare.com/client/v4/accounts/{accountId}/ai/v1";

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ProviderKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ProviderKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A visitor, so that an unknown kind is an error of the field (its path kept).
        struct Kind;
        impl serde::de::Visitor<'_> for Kind {
            type Value = ProviderKind;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a provider kind")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ProviderKind, E> {
                ProviderKind::parse(text)
                    .ok_or_else(|| E::unknown_variant(text, ProviderKind::names()))
            }
        }
        deserializer.deserialize_str(Kind)
    }
}

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
    pub fn of_kind(kind: ProviderKind) -> Option<Self> {
        match kind {
            ProviderKind::Gemini => Some(Self::Pacific),
            ProviderKind::Qwen => Some(Self::Offset(480)),
            ProviderKind::Cerebras | ProviderKind::Cloudflare => Some(Self::Utc),
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
pub fn rate_limit_windows(kind: ProviderKind) -> (RateLimitWindow, RateLimitWindow) {
    match kind {
        ProviderKind::Groq => (RateLimitWindow::Day, RateLimitWindow::Minute),
        _ => (RateLimitWindow::Minute, RateLimitWindow::Minute),
    }
}

/// The caps a kind puts on one request, `(input tokens, output tokens)`, 0 for none: GitHub
/// Models takes 8K tokens in and 4K out whatever the model's advertised window.
pub fn per_request_caps(kind: ProviderKind) -> (u64, u64) {
    match kind {
        ProviderKind::Github => (8_000, 4_000),
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
        use ProviderKind::*;
        assert_eq!(DailyReset::of_kind(Gemini), Some(DailyReset::Pacific));
        assert_eq!(DailyReset::of_kind(Qwen), Some(DailyReset::Offset(480)));
        assert_eq!(DailyReset::of_kind(Openai), None);
        assert_eq!(
            rate_limit_windows(Groq),
            (RateLimitWindow::Day, RateLimitWindow::Minute)
        );
        assert_eq!(per_request_caps(Github), (8_000, 4_000));
        assert_eq!(per_request_caps(Openai), (0, 0));
    }

    #[test]
    fn every_kind_parses_from_its_text_and_back() {
        for kind in ProviderKind::ALL {
            assert_eq!(ProviderKind::parse(kind.as_str()), Some(kind));
            let json = serde_json::to_string(&kind).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(serde_json::from_str::<ProviderKind>(&json).ok(), Some(kind));
        }
        assert_eq!(ProviderKind::names().len(), ProviderKind::ALL.len());
        assert_eq!(ProviderKind::parse("OpenAI"), None);
        let unknown = serde_json::from_str::<ProviderKind>("\"azure\"").err();
        let message = unknown.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("unknown variant `azure`"), "{message}");
        assert!(message.contains("`openai-compatible`"), "{message}");
    }
}
