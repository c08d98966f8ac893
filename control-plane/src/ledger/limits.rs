//! What a provider allows per window: the seed table of free-tier limits per kind
//! (`data/free-tier-limits.json`), with a provider's own `limits:` over it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use crate::config::LimitsConfig;
use ai_router_contract::kinds::{DailyReset, RateLimitWindow};

use crate::config::facts::ProviderFacts;

/// The windows the ledger counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Window {
    /// Requests in the last 60 s.
    Rpm,
    /// Requests since the provider's day began.
    Rpd,
    /// Tokens in the last 60 s.
    Tpm,
    /// Tokens since the provider's day began.
    Tpd,
    /// Tokens since the UTC month began.
    TokensPerMonth,
}

impl Window {
    pub const ALL: [Window; 5] = [
        Window::Rpm,
        Window::Rpd,
        Window::Tpm,
        Window::Tpd,
        Window::TokensPerMonth,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Window::Rpm => "rpm",
            Window::Rpd => "rpd",
            Window::Tpm => "tpm",
            Window::Tpd => "tpd",
            Window::TokensPerMonth => "tokensPerMonth",
        }
    }

    pub fn counts_tokens(self) -> bool {
        matches!(self, Window::Tpm | Window::Tpd | Window::TokensPerMonth)
    }
}

/// One kind's row of the seed table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Seed {
    /// What one budget covers: `key`, `organization`, `project`, `account` or `user`.
    pub scope: String,
    pub rpm: Option<u64>,
    pub rpd: Option<u64>,
    pub tpm: Option<u64>,
    pub tpd: Option<u64>,
    pub tokens_per_month: Option<u64>,
    pub source: String,
}

#[derive(Debug, Deserialize)]
struct SeedFile {
    checked: String,
    kinds: BTreeMap<String, Seed>,
}

const SEED_TABLE: &str = include_str!("../../data/free-tier-limits.json");

fn seeds() -> &'static SeedFile {
    static SEEDS: OnceLock<SeedFile> = OnceLock::new();
    SEEDS.get_or_init(|| {
        // The table is compiled in and checked by a unit test; an unreadable one only loses
        // the seeds (every limit then counts as unknown).
        serde_json::from_str(SEED_TABLE).unwrap_or(SeedFile {
            checked: String::new(),
            kinds: BTreeMap::new(),
        })
    })
}

/// The seed row of a kind, if the table has one.
pub fn seed(kind: &str) -> Option<&'static Seed> {
    seeds().kinds.get(kind)
}

/// When the seed table was last checked (`YYYY-MM`).
pub fn seeds_checked() -> &'static str {
    &seeds().checked
}

/// Where a limit came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSource {
    /// The provider's `limits:` in the pool config.
    Config,
    /// The bundled seed table.
    Seed,
}

impl LimitSource {
    pub fn name(self) -> &'static str {
        match self {
            LimitSource::Config => "config",
            LimitSource::Seed => "seed",
        }
    }
}

/// A provider's limits per window, and how to read its headers and days (the provider's
/// resolved facts: `rateLimitHeaders`, `dailyResetTimezone` and the kind's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub values: BTreeMap<Window, (u64, LimitSource)>,
    /// The kind's billing scope (`key` when the table does not know the kind).
    pub scope: String,
    /// The windows `x-ratelimit-remaining-requests` and `-tokens` speak of.
    pub requests_window: RateLimitWindow,
    pub tokens_window: RateLimitWindow,
    /// Where the provider's day begins; UTC when its quotas have no calendar reset (the
    /// ledger still counts days).
    pub day_reset: DailyReset,
}

impl Limits {
    /// The seed row of `kind`, then every window `overrides` sets; headers and days as
    /// `facts` says.
    pub fn resolve(kind: &str, overrides: Option<&LimitsConfig>, facts: &ProviderFacts) -> Self {
        let mut limits = Limits {
            values: BTreeMap::new(),
            scope: "key".to_owned(),
            requests_window: facts.requests_window,
            tokens_window: facts.tokens_window,
            day_reset: facts.daily_reset.unwrap_or(DailyReset::Utc),
        };
        if let Some(seed) = seed(kind) {
            limits.scope = seed.scope.clone();
            let seeded = [
                seed.rpm,
                seed.rpd,
                seed.tpm,
                seed.tpd,
                seed.tokens_per_month,
            ];
            for (window, value) in Window::ALL.into_iter().zip(seeded) {
                if let Some(v) = value {
                    limits.values.insert(window, (v, LimitSource::Seed));
                }
            }
        }
        if let Some(o) = overrides {
            let set = [o.rpm, o.rpd, o.tpm, o.tpd, o.tokens_per_month];
            for (window, value) in Window::ALL.into_iter().zip(set) {
                if let Some(v) = value {
                    limits.values.insert(window, (v, LimitSource::Config));
                }
            }
        }
        limits
    }

    pub fn limit(&self, window: Window) -> Option<(u64, LimitSource)> {
        self.values.get(&window).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_table_reads_and_every_row_names_its_source() {
        let file: SeedFile = match serde_json::from_str(SEED_TABLE) {
            Ok(f) => f,
            Err(e) => panic!("data/free-tier-limits.json: {e}"),
        };
        assert!(!file.checked.is_empty());
        assert!(file.kinds.len() >= 10);
        for (kind, row) in &file.kinds {
            assert!(!row.source.is_empty(), "{kind} has no source");
            assert!(
                ["key", "organization", "project", "account", "user"].contains(&row.scope.as_str()),
                "{kind}: scope {}",
                row.scope
            );
        }
    }

    /// The facts a provider of `kind` has with no override.
    fn facts(kind: &str) -> ProviderFacts {
        let kind = ai_router_contract::kinds::ProviderKind::parse(kind).unwrap();
        let (requests_window, tokens_window) = ai_router_contract::kinds::rate_limit_windows(kind);
        ProviderFacts {
            max_input_tokens: 0,
            max_output_tokens: 0,
            daily_reset: DailyReset::of_kind(kind),
            requests_window,
            tokens_window,
        }
    }

    #[test]
    fn the_config_wins_over_the_seed_and_unknown_kinds_start_empty() {
        let groq = Limits::resolve("groq", None, &facts("groq"));
        assert_eq!(groq.scope, "organization");
        assert_eq!(groq.requests_window, RateLimitWindow::Day);
        assert_eq!(groq.limit(Window::Rpm), Some((30, LimitSource::Seed)));
        let mine = LimitsConfig {
            rpm: Some(5),
            ..LimitsConfig::default()
        };
        let groq = Limits::resolve("groq", Some(&mine), &facts("groq"));
        assert_eq!(groq.limit(Window::Rpm), Some((5, LimitSource::Config)));
        assert_eq!(groq.limit(Window::Tpd), Some((200_000, LimitSource::Seed)));
        let other = Limits::resolve("openai-compatible", None, &facts("openai-compatible"));
        assert_eq!(other.scope, "key");
        assert!(other.values.is_empty());
        assert_eq!(other.day_reset, DailyReset::Utc);
        let gemini = Limits::resolve("gemini", None, &facts("gemini"));
        assert_eq!(gemini.day_reset, DailyReset::Pacific);
        let qwen = Limits::resolve("qwen", None, &facts("qwen"));
        assert_eq!(qwen.day_reset, DailyReset::Offset(480));
    }

    #[test]
    fn headers_and_days_follow_the_provider_s_facts() {
        // `rateLimitHeaders` and `dailyResetTimezone` on the provider are what the ledger reads.
        let mut mine = facts("openai-compatible");
        mine.requests_window = RateLimitWindow::Day;
        mine.daily_reset = Some(DailyReset::Offset(330));
        let limits = Limits::resolve("openai-compatible", None, &mine);
        assert_eq!(limits.requests_window, RateLimitWindow::Day);
        assert_eq!(limits.day_reset, DailyReset::Offset(330));
    }
}
