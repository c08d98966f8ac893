//! The count behind a virtual key's `requestsPerMinute` across Envoys: how many calls of each
//! key's UTC minute were granted to Envoys in blocks (`Sync.TakeMinuteCalls`; the filter's
//! side is `filter-core/src/vm/minute_lease.rs`).
//!
//! - With the Redis state store the count is one Redis key per key and minute,
//!   `<ns>:rpm:<key id>:<minute>`, taken by a script (read, grant what is left, add it, expire
//!   after two minutes): every control plane on the Redis grants from one budget.
//! - Otherwise (memory, SQLite, or Redis not answering) this control plane counts in its own
//!   memory: every Envoy it feeds draws from one budget; with Redis away, each control plane
//!   grants up to the limit on its own for the minutes of the outage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::store::lock;

/// How long a minute's count is kept: the minute itself, and the next for late asks.
pub const KEEP_MS: i64 = 120_000;

/// What a minute with `counted` calls granted already grants of an ask for `calls` more under
/// `limit`: what is left, at most what was asked.
pub fn grant(counted: u64, calls: u64, limit: u64) -> u64 {
    let most = ai_router_contract::minute::most_granted(limit);
    limit.saturating_sub(counted).min(calls.min(most))
}

/// The counts of one control plane: per (key id, minute), pruned as minutes pass.
#[derive(Debug, Default)]
pub struct LocalMinuteCalls {
    counts: Mutex<HashMap<(String, i64), u64>>,
}

impl LocalMinuteCalls {
    /// Grants up to `calls` of `key_id`'s `minute` under `limit`, and counts them.
    pub fn take(&self, key_id: &str, minute: i64, calls: u64, limit: u64) -> u64 {
        let mut counts = lock(&self.counts);
        // Older minutes cannot matter any more (asks come for the current one).
        counts.retain(|(_, m), _| *m >= minute - 1);
        let counted = counts.entry((key_id.to_owned(), minute)).or_insert(0);
        let granted = grant(*counted, calls, limit);
        *counted += granted;
        granted
    }
}

/// Calls granted to Envoys since start, for `/metrics`: from the shared count (Redis) and from
/// this control plane's own.
#[derive(Debug)]
pub struct Granted {
    pub shared: AtomicU64,
    pub local: AtomicU64,
}

pub static GRANTED: Granted = Granted {
    shared: AtomicU64::new(0),
    local: AtomicU64::new(0),
};

/// The `ai_router_minute_calls_granted_total` family (`family` writes `# HELP` and `# TYPE`).
pub fn render(out: &mut String, family: fn(&mut String, &str, &str, &str)) {
    use std::fmt::Write as _;
    let name = "ai_router_minute_calls_granted_total";
    family(
        out,
        name,
        "counter",
        "Calls of virtual keys' requestsPerMinute granted to Envoys in blocks, from the shared store's count (shared) or this control plane's own (local: no shared store, or it does not answer).",
    );
    for (store, value) in [("shared", &GRANTED.shared), ("local", &GRANTED.local)] {
        let _ = writeln!(
            out,
            "{name}{{store=\"{store}\"}} {}",
            value.load(Ordering::Relaxed)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_what_is_left_and_never_more_than_asked() {
        assert_eq!(grant(0, 5, 50), 5);
        assert_eq!(grant(47, 5, 50), 3);
        assert_eq!(grant(50, 5, 50), 0);
        assert_eq!(grant(60, 5, 50), 0);
        assert_eq!(grant(0, 1_000_000, 100_000), 10_000);
    }

    #[test]
    fn every_block_an_envoy_asks_for_is_granted_whole_while_the_minute_lasts() {
        // The filter takes a grant smaller than its ask for a spent minute: under any limit,
        // the block it asks for must come whole when the minute has that much left.
        for limit in [
            1,
            5,
            50,
            999,
            1_000,
            60_000,
            100_000,
            1_000_000,
            100_000_000,
            u64::from(u32::MAX),
        ] {
            let block = ai_router_contract::minute::block(limit);
            assert_eq!(grant(0, block, limit), block, "limit {limit}");
            assert_eq!(
                grant(limit - block, block, limit),
                block,
                "limit {limit}, the last block"
            );
        }
    }

    #[test]
    fn one_budget_per_key_and_minute_for_every_envoy() {
        let counts = LocalMinuteCalls::default();
        let mut granted = 0;
        // Two Envoys asking in turn for blocks of 5 of a limit of 12.
        for _ in 0..6 {
            granted += counts.take("key_a", 100, 5, 12);
        }
        assert_eq!(granted, 12);
        assert_eq!(counts.take("key_a", 100, 5, 12), 0);
        // Another key, another minute: budgets of their own.
        assert_eq!(counts.take("key_b", 100, 5, 12), 5);
        assert_eq!(counts.take("key_a", 101, 5, 12), 5);
        // The minute before the last is forgotten.
        assert_eq!(counts.take("key_a", 102, 5, 12), 5);
        assert_eq!(lock(&counts.counts).len(), 2);
    }
}
