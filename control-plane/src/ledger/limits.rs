//! What a provider allows per window: the seed table of free-tier limits per kind
//! (`data/free-tier-limits.json`), with a provider's own `limits:` over it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use crate::config::LimitsConfig;
pub use crate::config::{DayZone, RequestsHeader};

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
    #[serde(default)]
    pub requests_header: RequestsHeader,
    #[serde(default)]
    pub day_resets_in: DayZone,
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

/// A provider's limits per window, and how to read its headers and days.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    pub values: BTreeMap<Window, (u64, LimitSource)>,
    /// The kind's billing scope (`key` when the table does not know the kind).
    pub scope: String,
    pub requests_header: RequestsHeader,
    pub day_zone: DayZone,
}

impl Limits {
    /// The seed row of `kind`, then every window `overrides` sets.
    pub fn resolve(kind: &str, overrides: Option<&LimitsConfig>) -> Self {
        let mut limits = Limits {
            scope: "key".to_owned(),
            ..Limits::default()
        };
        if let Some(seed) = seed(kind) {
            limits.scope = seed.scope.clone();
            limits.requests_header = seed.requests_header;
            limits.day_zone = seed.day_resets_in;
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
            if let Some(h) = o.requests_header {
                limits.requests_header = h;
            }
            if let Some(z) = o.day_resets_in {
                limits.day_zone = z;
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

    #[test]
    fn the_config_wins_over_the_seed_and_unknown_kinds_start_empty() {
        let groq = Limits::resolve("groq", None);
        assert_eq!(groq.scope, "organization");
        assert_eq!(groq.requests_header, RequestsHeader::Day);
        assert_eq!(groq.limit(Window::Rpm), Some((30, LimitSource::Seed)));
        let mine = LimitsConfig {
            rpm: Some(5),
            ..LimitsConfig::default()
        };
        let groq = Limits::resolve("groq", Some(&mine));
        assert_eq!(groq.limit(Window::Rpm), Some((5, LimitSource::Config)));
        assert_eq!(groq.limit(Window::Tpd), Some((200_000, LimitSource::Seed)));
        let other = Limits::resolve("openai-compatible", None);
        assert_eq!(other.scope, "key");
        assert!(other.values.is_empty());
        assert_eq!(Limits::resolve("gemini", None).day_zone, DayZone::Pacific);
        assert_eq!(Limits::resolve("qwen", None).day_zone, DayZone::China);
    }
}
