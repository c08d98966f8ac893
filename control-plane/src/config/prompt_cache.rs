//! `promptCache` in a policy: `true` (a 5-minute marker), `{ ttl: "1h" }`, or `false` to turn
//! an inherited one off. For anthropic providers the filter puts a `cache_control` marker on
//! the last system block and the last tool, unless the client marked something itself.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum PromptCacheTtl {
    #[serde(rename = "5m")]
    FiveMinutes,
    #[serde(rename = "1h")]
    OneHour,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PromptCacheTtlConfig {
    pub ttl: PromptCacheTtl,
}

/// `true | false | { ttl: "5m" | "1h" }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum PromptCacheConfig {
    On(bool),
    Ttl(PromptCacheTtlConfig),
}

impl PromptCacheConfig {
    /// The pushed text: "5m", "1h" or "off".
    pub fn to_proto(self) -> String {
        match self {
            Self::On(false) => "off",
            Self::On(true)
            | Self::Ttl(PromptCacheTtlConfig {
                ttl: PromptCacheTtl::FiveMinutes,
            }) => "5m",
            Self::Ttl(PromptCacheTtlConfig {
                ttl: PromptCacheTtl::OneHour,
            }) => "1h",
        }
        .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_is_read() {
        let read = |y: &str| serde_yaml_ng::from_str::<PromptCacheConfig>(y).map(|c| c.to_proto());
        assert_eq!(read("true").ok().as_deref(), Some("5m"));
        assert_eq!(read("false").ok().as_deref(), Some("off"));
        assert_eq!(read("{ ttl: 1h }").ok().as_deref(), Some("1h"));
        assert_eq!(read("{ ttl: 5m }").ok().as_deref(), Some("5m"));
        assert!(read("{ ttl: 2h }").is_err());
        assert!(read("{ ttl: 1h, other: 1 }").is_err());
    }
}
