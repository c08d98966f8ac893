//! The durable state's exchange with the state store: this process's changes out, what the
//! other processes wrote in.

use std::sync::Arc;

use tokio::sync::watch;

use super::state::*;
use crate::store::durable::{merge_durable, DurableChanges, DurableState, StateStore, StoreError};
use crate::store::lock;

impl Engine {
    /// Merges what other processes wrote to `store` since the last exchange and writes this
    /// process's changes; returns whether the merge changed the pushed state. Blocking.
    pub fn sync_store(&self, store: &dyn StateStore) -> Result<bool, StoreError> {
        let remote = store.load()?;
        let now = self.clock.now_ms();
        let (changes, written, pulled) = {
            let mut state = lock(&self.state);
            let base = std::mem::take(&mut state.base);
            let pulled = merge_durable(&mut state.durable, &base, &remote);
            state.base = base;
            if pulled {
                self.publish(&mut state, now);
            }
            (
                DurableChanges::between(&remote, &state.durable),
                state.durable.clone(),
                pulled,
            )
        };
        if !changes.is_empty() {
            store.apply(&changes)?;
        }
        // Only once written: a failed write leaves the base, so the next round tries again.
        lock(&self.state).base = written;
        Ok(pulled)
    }

    /// Whether blacklists, cooldowns, breakers or resets changed since the last exchange wrote them.
    pub(super) fn holds_unwritten(&self) -> bool {
        let state = lock(&self.state);
        state.durable.blacklists != state.base.blacklists
            || state.durable.breakers != state.base.breakers
            || state.durable.cooldowns != state.base.cooldowns
            || state.durable.resets != state.base.resets
    }

    /// After an outage of the store: the next exchange takes the union of what this process
    /// and the store hold (ours wins where both have an entry) instead of reading what the
    /// store lacks as deleted, since a store that restarted empty deleted nothing.
    pub fn forget_store_base(&self) {
        lock(&self.state).base = DurableState::default();
    }

    /// Exchanges state with `store` ([`Engine::sync_store`]) whenever it changes and every
    /// [`STORE_POLL_INTERVAL`] (what another control plane wrote), until `shutdown` flips; a
    /// last exchange then.
    pub async fn run_persist(
        self: Arc<Self>,
        store: Arc<dyn StateStore>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut updates = self.subscribe();
        let mut tick = tokio::time::interval(STORE_POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            let mut stop = tokio::select! {
                changed = updates.changed() => changed.is_err(),
                _ = tick.tick() => false,
                _ = shutdown.changed() => true,
            };
            if let Some(wait) = last.map(|at| STORE_MIN_GAP.saturating_sub(at.elapsed())) {
                // A key taken out, a breaker moved: written at once (a process killed now must
                // not forget it); only headroom and spend wait for the gap.
                if !stop && !wait.is_zero() && !self.holds_unwritten() {
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.changed() => stop = true,
                    }
                }
            }
            last = Some(tokio::time::Instant::now());
            let engine = self.clone();
            let store = store.clone();
            let reconcile = failing;
            match tokio::task::spawn_blocking(move || {
                if reconcile {
                    engine.forget_store_base();
                }
                engine.sync_store(store.as_ref())
            })
            .await
            {
                Ok(Ok(_)) => {
                    if failing {
                        tracing::info!("the state store is reachable again");
                    }
                    failing = false;
                }
                // One line per outage, not one per second.
                Ok(Err(err)) if !failing => {
                    tracing::error!(%err, "cannot exchange state with the store");
                    failing = true;
                }
                Ok(Err(_)) => {}
                Err(err) => tracing::error!(%err, "state store task failed"),
            }
            if stop || *shutdown.borrow() {
                break;
            }
        }
    }
}
