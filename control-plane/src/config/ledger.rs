//! `ledger:` of the pool: how long a figure a provider gave stands in the quota ledger
//! (`ledger::count`) before the ledger goes back to its own count. As written
//! ([`LedgerConfig`]) and checked ([`AnchorLifetimes`], via [`resolve_ledger`]).

use serde::{Deserialize, Serialize};

use crate::config::error::{invalid, ConfigError};

/// `reportedTtlMs` when not set: a provider's headers are seen on every answer, so a short
/// lifetime costs nothing while it is called.
pub const REPORTED_TTL_MS: i64 = 2 * 60 * 1_000;
/// `minedTtlMs` when not set: a 429 is rarer, and providers rarely say more in between.
pub const MINED_TTL_MS: i64 = 5 * 60 * 1_000;
/// A figure standing longer than a day outlives every window it could be about.
const MAX_TTL_MS: i64 = 24 * 60 * 60 * 1_000;

/// `ledger: { reportedTtlMs?, minedTtlMs? }` as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LedgerConfig {
    /// How long a figure from a provider's headers (or its quota endpoint) stands.
    pub reported_ttl_ms: Option<i64>,
    /// How long a figure mined from a 429 or quota refusal stands.
    pub mined_ttl_ms: Option<i64>,
}

/// How long each kind of anchor stands, in milliseconds, defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnchorLifetimes {
    pub reported_ms: i64,
    pub mined_ms: i64,
}

impl Default for AnchorLifetimes {
    fn default() -> Self {
        Self {
            reported_ms: REPORTED_TTL_MS,
            mined_ms: MINED_TTL_MS,
        }
    }
}

/// Checks `ledger:`: each lifetime from a second to a day.
pub fn resolve_ledger(raw: Option<&LedgerConfig>) -> Result<AnchorLifetimes, ConfigError> {
    let raw = raw.copied().unwrap_or_default();
    let check = |field: &str, value: Option<i64>, default: i64| match value {
        None => Ok(default),
        Some(ms) if (1_000..=MAX_TTL_MS).contains(&ms) => Ok(ms),
        Some(ms) => Err(invalid(format!(
            "ledger.{field}: {ms} is not in 1000..={MAX_TTL_MS} (milliseconds, a second to a day)"
        ))),
    };
    Ok(AnchorLifetimes {
        reported_ms: check("reportedTtlMs", raw.reported_ttl_ms, REPORTED_TTL_MS)?,
        mined_ms: check("minedTtlMs", raw.mined_ttl_ms, MINED_TTL_MS)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_default_to_two_and_five_minutes_and_out_of_range_ones_are_refused() {
        assert_eq!(resolve_ledger(None).ok(), Some(AnchorLifetimes::default()));
        let set = LedgerConfig {
            reported_ttl_ms: Some(3_000),
            mined_ttl_ms: None,
        };
        assert_eq!(
            resolve_ledger(Some(&set)).ok(),
            Some(AnchorLifetimes {
                reported_ms: 3_000,
                mined_ms: MINED_TTL_MS
            })
        );
        for (reported, mined, field) in [
            (Some(999), None, "ledger.reportedTtlMs"),
            (None, Some(0), "ledger.minedTtlMs"),
            (None, Some(MAX_TTL_MS + 1), "ledger.minedTtlMs"),
        ] {
            let raw = LedgerConfig {
                reported_ttl_ms: reported,
                mined_ttl_ms: mined,
            };
            let err = resolve_ledger(Some(&raw)).err().map(|e| e.to_string());
            assert!(err.as_deref().is_some_and(|e| e.contains(field)), "{err:?}");
        }
    }
}
