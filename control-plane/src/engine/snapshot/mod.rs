//! What the filters are sent: the tables built from the pool and the state ([`tables`], the
//! pool's settings as pushed in [`settings`]), published on every change (headroom coalesced).

mod settings;
mod tables;

use std::sync::Arc;

use tokio::sync::watch;

use super::state::*;
use crate::config::secrets::Secret;
use crate::keys::record::VirtualKeyRecord;
use crate::store::lock;

pub(super) use settings::published_keys;
pub use settings::{policy_to_proto, route_to_proto};
pub(super) use tables::build_tables;

impl Engine {
    /// Publishes what waits (headroom, and the [`HeadroomSource`]'s figures when they moved);
    /// returns whether anything did.
    pub fn flush(&self) -> bool {
        let now = self.clock.now_ms();
        let source = lock(&self.headroom_source).clone();
        let estimated = source.map(|s| s.headroom(now));
        let mut state = lock(&self.state);
        if let Some(estimated) = estimated {
            if !same_figures(&state.estimated, &estimated) {
                state.estimated = estimated;
                state.pending = true;
            }
        }
        if !state.pending {
            return false;
        }
        self.publish(&mut state, now);
        true
    }

    /// Runs [`Engine::flush`] every [`HEADROOM_COALESCE`] until `shutdown` flips.
    pub async fn run_flush(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        self.coalesce_headroom(true);
        let mut tick = tokio::time::interval(HEADROOM_COALESCE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.flush();
                }
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
        self.coalesce_headroom(false);
        self.flush();
    }

    pub(super) fn publish(&self, state: &mut State, now: i64) {
        state.version += 1;
        state.pending = false;
        let tables = Arc::new(build_tables(&self.config(), state, now));
        self.updates.send_replace(tables);
    }

    /// The admin token the gateway's `GET /health` accepts (only its SHA-256 is pushed).
    pub fn set_admin_token(&self, token: Option<&Secret>) {
        let hash = token
            .map(|t| crate::config::secrets::sha256_hex(t.expose()))
            .unwrap_or_default();
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        if state.admin_token_sha256 != hash {
            state.admin_token_sha256 = hash;
            self.publish(&mut state, now);
        }
    }

    /// Replaces the snapshot's virtual keys (mounted and stored); publishes a new version when
    /// they changed. Returns whether they did.
    pub fn set_virtual_keys(&self, keys: Vec<VirtualKeyRecord>) -> bool {
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        if state.virtual_keys == keys {
            return false;
        }
        state.published_keys = Arc::new(published_keys(&keys));
        state.virtual_keys = keys;
        self.publish(&mut state, now);
        true
    }

    /// Whether a pushed virtual key has a quota limit decided from usage (its block follows
    /// the usage rows).
    pub fn has_usage_limited_keys(&self) -> bool {
        lock(&self.state)
            .virtual_keys
            .iter()
            .any(crate::keys::quotas::has_usage_limit)
    }

    /// Recomputes the pushed virtual keys' quota blocks from `usage` (every key's use this
    /// month, `None` when no key has a usage limit) without listing the key store again: what
    /// the key sync does while the store's keys have not changed. Publishes when a block
    /// appeared or ended; returns whether one did.
    pub fn recheck_quota_blocks(
        &self,
        usage: Option<&std::collections::HashMap<String, crate::keys::store::QuotaUsage>>,
        now_ms: i64,
    ) -> bool {
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        if !crate::keys::quotas::set_blocks(&mut state.virtual_keys, usage, now_ms) {
            return false;
        }
        state.published_keys = Arc::new(published_keys(&state.virtual_keys));
        self.publish(&mut state, now);
        true
    }

    /// Takes the budgets' use the key store counted, by this control plane before a restart or
    /// by another sharing the store ([`crate::engine::budgets::BudgetLedger::absorb`]); publishes when a
    /// budget's level rose. Returns whether it did.
    pub fn absorb_budget_use(&self, rows: &[crate::keys::store::BudgetUse]) -> bool {
        let config = self.config();
        if config.budgets.is_empty() {
            return false;
        }
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let changed = state.budgets.absorb(&config.budgets, rows, now);
        if changed {
            self.publish(&mut state, now);
        }
        changed
    }
}
