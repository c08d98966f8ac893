//! The periodic pass: secrets resolved again, holds, blacklists, headroom and budget periods
//! expired, open breakers turned half-open.

use std::sync::Arc;

use tokio::sync::watch;

use super::state::*;
use crate::store::lock;

impl Engine {
    /// Resolves every key reference again; a changed secret is pushed and lifts a blacklist
    /// whose refused fingerprint differs.
    pub fn refresh_secrets(&self) -> Vec<EngineEvent> {
        let now = self.clock.now_ms();
        let mut resolved = Vec::new();
        let config = self.config();
        let mut resolver = crate::config::secrets::Resolver::new(self.env.as_ref());
        for provider in &config.providers {
            for key in &provider.keys {
                resolved.push((
                    (provider.id.clone(), key.alias.clone()),
                    resolver.resolve(&key.source),
                ));
            }
        }
        let mut state = lock(&self.state);
        let mut events = Vec::new();
        let mut changed = false;
        for (id, new) in resolved {
            let old = state.secrets.get(&id).cloned().flatten();
            if old == new {
                continue;
            }
            changed = true;
            match &new {
                None => events.push(EngineEvent::KeyDisabled {
                    provider: id.0.clone(),
                    key: id.1.clone(),
                    reason: "missing",
                    until_ms: 0,
                    code: None,
                }),
                Some(secret) => {
                    let fp = secret.fingerprint();
                    let lifted = match state.durable.blacklists.get(&id) {
                        Some(entry) if entry.refused_fingerprint != fp => {
                            Some(entry.reason.as_str())
                        }
                        Some(_) => None,
                        None if old.is_none() => Some("missing"),
                        None => None,
                    };
                    if let Some(was) = lifted {
                        state.durable.blacklists.remove(&id);
                        events.push(EngineEvent::KeyRestored {
                            provider: id.0.clone(),
                            key: id.1.clone(),
                            was,
                            reason: "secret_changed",
                        });
                    }
                }
            }
            state.secrets.insert(id, new);
        }
        self.emit(&events);
        if changed {
            self.publish(&mut state, now);
        }
        events
    }

    /// Drops cooldowns, timed blacklists and headroom that have ended, turns open breakers past
    /// their cooldown half-open and starts new budget periods; returns whether the pushed state
    /// changed.
    pub fn expire(&self) -> bool {
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let durable = &mut state.durable;
        let before = (
            durable.blacklists.len(),
            durable.cooldowns.len(),
            durable.headroom.len(),
        );
        durable
            .blacklists
            .retain(|_, b| b.until_ms == 0 || b.until_ms > now);
        durable.cooldowns.retain(|_, until| *until > now);
        durable.headroom.retain(|_, h| h.reset_at_ms > now);
        let mut changed = before
            != (
                durable.blacklists.len(),
                durable.cooldowns.len(),
                durable.headroom.len(),
            );
        let marks = state.durable.resets.len();
        state
            .durable
            .resets
            .retain(|_, at| now.saturating_sub(*at) < ms(RESET_MARK.as_millis() as u64));
        changed |= marks != state.durable.resets.len();
        let durable = &mut state.durable;
        let mut events = Vec::new();
        for (id, breaker) in &mut durable.breakers {
            if let Some((from, to)) = breaker.tick(now) {
                events.push(breaker_event(id, from, to));
                changed = true;
            }
        }
        for spend in durable.spend.values_mut() {
            changed |= spend.roll(now);
        }
        changed |= state.budgets.roll(now);
        self.emit(&events);
        if changed {
            self.publish(&mut state, now);
        }
        changed
    }

    /// Refreshes secrets and expires entries every [`REFRESH_INTERVAL`] until `shutdown` flips.
    pub async fn run_refresh(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(REFRESH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    // File reads are blocking; they are small and local, but keep them off
                    // the executor threads anyway.
                    let engine = self.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        engine.refresh_secrets();
                        engine.expire();
                    })
                    .await;
                }
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
    }
}
