//! Per-key quotas: what the control plane decides from usage and pushes with each virtual key.
//!
//! - `quota.requestsPerMinute` is pushed as is (`VirtualKey.requests_per_minute`); the filter
//!   admits from blocks of each UTC minute's budget it takes with `Sync.TakeMinuteCalls`
//!   (`engine::minute_calls`, `store::minute_calls`).
//! - `quota.tokensPerDay`, `costPerDay` and `costPerMonth` are decided here from the key's usage
//!   rows (per UTC day; a month is the sum of its days). Tokens and cost are counted after a
//!   call, so a key is blocked from the request after the one that crossed a limit: once its
//!   usage is at or above it, until the start of the next UTC day (month). The block is pushed as
//!   `VirtualKey.quota_code` / `quota_until_ms`.
//!
//! [`with_blocks`] fills the blocks of the snapshot's keys; the key sync (`api::admin`)
//! recomputes them after every usage write and when the UTC day rolls over, and the engine
//! publishes a new snapshot when a block appears or ends.

use std::collections::HashMap;

use ai_router_contract::calendar::{first_of_next_month_ms, next_utc_midnight_ms};
use ai_router_contract::error_code::ErrorCode;

use crate::config::QuotaConfig;
use crate::keys::record::{QuotaBlock, VirtualKeyRecord};
use crate::keys::store::{utc_day, KeyStore, KeyStoreError, QuotaUsage};

/// Whether `quota` has a limit decided from usage (the others are the filter's).
pub fn has_usage_limits(quota: &QuotaConfig) -> bool {
    quota.tokens_per_day.is_some() || quota.cost_per_day.is_some() || quota.cost_per_month.is_some()
}

/// The block `quota` puts on a key that used `used` this UTC day and month; the month's block
/// wins when both are spent (it lasts longer).
pub fn block(quota: &QuotaConfig, used: &QuotaUsage, now_ms: i64) -> Option<QuotaBlock> {
    if quota
        .cost_per_month
        .is_some_and(|limit| used.month_cost >= limit)
    {
        return Some(QuotaBlock {
            code: ErrorCode::CostPerMonthExceeded,
            until_ms: first_of_next_month_ms(now_ms),
        });
    }
    let code = if quota
        .tokens_per_day
        .is_some_and(|limit| used.day_tokens >= limit)
    {
        ErrorCode::TokensPerDayExceeded
    } else if quota
        .cost_per_day
        .is_some_and(|limit| used.day_cost >= limit)
    {
        ErrorCode::CostPerDayExceeded
    } else {
        return None;
    };
    Some(QuotaBlock {
        code,
        until_ms: next_utc_midnight_ms(now_ms),
    })
}

/// Sets the block of every key whose quota has a usage limit (stored and mounted alike: usage
/// rows are per key id), from one read of the month's usage, whatever the number of keys.
pub fn with_blocks(
    store: &dyn KeyStore,
    keys: &mut [VirtualKeyRecord],
    now_ms: i64,
) -> Result<(), KeyStoreError> {
    let usage = if keys.iter().any(has_usage_limit) {
        Some(month_usage(store, now_ms)?)
    } else {
        None
    };
    set_blocks(keys, usage.as_ref(), now_ms);
    Ok(())
}

/// Whether the key's quota has a limit decided from usage.
pub fn has_usage_limit(key: &VirtualKeyRecord) -> bool {
    key.quota.as_ref().is_some_and(has_usage_limits)
}

/// Every key's use this UTC month and day, in one read of the store.
pub fn month_usage(
    store: &dyn KeyStore,
    now_ms: i64,
) -> Result<HashMap<String, QuotaUsage>, KeyStoreError> {
    let today = utc_day(now_ms);
    let first = format!("{}-01", &today[..7]);
    store.quota_usage(&first, &today)
}

/// Sets each key's block from `usage` (`None`: no key has a usage limit, so none is blocked);
/// returns whether a block changed.
pub fn set_blocks(
    keys: &mut [VirtualKeyRecord],
    usage: Option<&HashMap<String, QuotaUsage>>,
    now_ms: i64,
) -> bool {
    let mut changed = false;
    for key in keys {
        let block = match (key.quota.filter(has_usage_limits), usage) {
            (Some(quota), Some(usage)) => block(
                &quota,
                usage.get(&key.id).unwrap_or(&QuotaUsage::default()),
                now_ms,
            ),
            _ => None,
        };
        if key.quota_block != block {
            key.quota_block = block;
            changed = true;
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::keys::memory::MemoryKeyStore;
    use crate::keys::sqlite::SqliteKeyStore;
    use crate::keys::store::UsageDay;

    // 2026-03-15T12:00:00Z
    const AT: i64 = 1_773_576_000_000;
    // 2026-03-16T00:00:00Z, 2026-04-01T00:00:00Z
    const NEXT_DAY: i64 = 1_773_619_200_000;
    const NEXT_MONTH: i64 = 1_775_001_600_000;

    fn used(tokens: u64, cost: f64) -> UsageDay {
        UsageDay {
            prompt_tokens: tokens / 2,
            completion_tokens: tokens - tokens / 2,
            cost,
            ..UsageDay::default()
        }
    }

    /// `tokens` and `day_cost` today, `month_cost` this month.
    fn usage(tokens: u64, day_cost: f64, month_cost: f64) -> QuotaUsage {
        QuotaUsage {
            day_tokens: tokens,
            day_cost,
            month_cost,
        }
    }

    fn quota(tokens: Option<u64>, day: Option<f64>, month: Option<f64>) -> QuotaConfig {
        QuotaConfig {
            requests_per_minute: None,
            tokens_per_day: tokens,
            cost_per_day: day,
            cost_per_month: month,
        }
    }

    #[test]
    fn a_limit_blocks_once_reached_until_the_next_window() {
        let q = quota(Some(100), Some(1.0), Some(5.0));
        assert_eq!(block(&q, &usage(99, 0.5, 4.0), AT), None);
        let tokens = block(&q, &usage(100, 0.5, 4.0), AT);
        assert_eq!(
            tokens,
            Some(QuotaBlock {
                code: ErrorCode::TokensPerDayExceeded,
                until_ms: NEXT_DAY
            })
        );
        let cost = block(&q, &usage(10, 1.0, 4.0), AT);
        assert_eq!(cost.map(|b| b.code), Some(ErrorCode::CostPerDayExceeded));
        // The month's block lasts longer, so it is the one pushed.
        let month = block(&q, &usage(500, 2.0, 5.5), AT);
        assert_eq!(
            month,
            Some(QuotaBlock {
                code: ErrorCode::CostPerMonthExceeded,
                until_ms: NEXT_MONTH
            })
        );
        assert_eq!(
            block(&QuotaConfig::default(), &usage(1 << 40, 1e9, 1e9), AT),
            None
        );
    }

    #[test]
    fn blocks_come_from_the_store_and_roll_over() -> Result<(), KeyStoreError> {
        let store = MemoryKeyStore::default();
        let row = |day: &str, tokens: u64, cost: f64| {
            (
                "key_a".to_owned(),
                UsageDay {
                    day: day.to_owned(),
                    ..used(tokens, cost)
                },
            )
        };
        store.record_usage(&[
            row("2026-02-28", 10_000, 100.0),
            row("2026-03-01", 0, 3.0),
            row("2026-03-15", 150, 0.5),
        ])?;
        let read = store.quota_usage("2026-03-01", "2026-03-15")?;
        let used = read.get("key_a").copied().unwrap_or_default();
        assert_eq!(used.day_tokens, 150);
        assert!((used.day_cost - 0.5).abs() < 1e-9);
        assert!((used.month_cost - 3.5).abs() < 1e-9);
        assert_eq!(read.len(), 1, "{read:?}");
        let record = |q: Option<QuotaConfig>| VirtualKeyRecord {
            id: "key_a".into(),
            label: "a".into(),
            sha256: String::new(),
            hint: String::new(),
            profiles: vec![],
            models: vec![],
            owner: None,
            allow_fallback: true,
            enabled: true,
            quota: q,
            mounted: false,
            quota_block: None,
            cache: None,
        };
        let mut keys = vec![
            record(Some(quota(Some(100), None, None))),
            record(Some(quota(None, None, Some(3.5)))),
            record(Some(quota(Some(1_000), Some(1.0), Some(10.0)))),
            record(None),
        ];
        with_blocks(&store, &mut keys, AT)?;
        let codes: Vec<_> = keys
            .iter()
            .map(|k| k.quota_block.as_ref().map(|b| b.code))
            .collect();
        assert_eq!(
            codes,
            [
                Some(ErrorCode::TokensPerDayExceeded),
                Some(ErrorCode::CostPerMonthExceeded),
                None,
                None
            ]
        );
        // The next day the daily block is over; the month's is not.
        with_blocks(&store, &mut keys, NEXT_DAY)?;
        let codes: Vec<_> = keys
            .iter()
            .map(|k| k.quota_block.as_ref().map(|b| b.code))
            .collect();
        assert_eq!(
            codes,
            [None, Some(ErrorCode::CostPerMonthExceeded), None, None]
        );
        Ok(())
    }

    #[test]
    fn the_sqlite_store_reads_every_keys_month_in_one_query_as_the_memory_store_does(
    ) -> Result<(), KeyStoreError> {
        let dir = std::env::temp_dir().join(format!(
            "ai-router-quota-usage-{}-{}",
            std::process::id(),
            AT
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let sqlite = SqliteKeyStore::open(&dir.join("keys.db"))?;
        let memory = MemoryKeyStore::default();
        let row = |key: &str, day: &str, tokens: u64, cost: f64| {
            (
                key.to_owned(),
                UsageDay {
                    day: day.to_owned(),
                    requests: 1,
                    ..used(tokens, cost)
                },
            )
        };
        let rows = [
            row("key_a", "2026-02-28", 10_000, 100.0),
            row("key_a", "2026-03-01", 7, 3.0),
            row("key_a", "2026-03-15", 150, 0.5),
            row("key_a", "2026-03-15", 50, 0.25),
            row("key_b", "2026-03-02", 9, 1.0),
            row("key_c", "2026-03-16", 1, 9.0),
        ];
        for store in [&sqlite as &dyn KeyStore, &memory] {
            store.record_usage(&rows)?;
            let read = store.quota_usage("2026-03-01", "2026-03-15")?;
            assert_eq!(read.len(), 2, "{read:?}");
            let a = read["key_a"];
            assert_eq!(a.day_tokens, 200);
            assert!((a.day_cost - 0.75).abs() < 1e-9, "{a:?}");
            assert!((a.month_cost - 3.75).abs() < 1e-9, "{a:?}");
            let b = read["key_b"];
            assert_eq!(b.day_tokens, 0);
            assert!((b.month_cost - 1.0).abs() < 1e-9, "{b:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
