//! `POST /admin/reset`: breakers closed, blacklists and cooldowns lifted, headroom cleared, in
//! the engine, the state store and every Envoy's local holds.

use super::state::*;
use crate::store::breaker::{BreakerPhase, BreakerScope};
use crate::store::lock;

impl Engine {
    /// Closes breakers, lifts blacklists and cooldowns and clears headroom: of every provider
    /// (`provider` `None`), of one provider and its keys, or of one key (and its lanes). Envoy
    /// voids its own holds on them at once. A key whose secret is missing stays out.
    pub fn reset(
        &self,
        provider: Option<&str>,
        key: Option<&str>,
    ) -> Result<ResetCounts, ResetError> {
        let config = self.config();
        let providers: Vec<&str> = match (provider, key) {
            (None, Some(_)) => return Err(ResetError::KeyWithoutProvider),
            (None, None) => config.providers.iter().map(|p| p.id.as_str()).collect(),
            (Some(p), _) => {
                let Some(found) = config.providers.iter().find(|x| x.id == p) else {
                    return Err(ResetError::UnknownProvider(p.to_owned()));
                };
                if let Some(k) = key {
                    if !found.keys.iter().any(|x| x.alias == k) {
                        return Err(ResetError::UnknownKey {
                            provider: p.to_owned(),
                            key: k.to_owned(),
                        });
                    }
                }
                vec![p]
            }
        };
        let hit = |p: &str, k: &str| providers.contains(&p) && key.is_none_or(|want| want == k);
        let now = self.clock.now_ms();
        let mut counts = ResetCounts::default();
        let mut events = Vec::new();
        let mut state = lock(&self.state);
        let durable = &mut state.durable;
        durable.blacklists.retain(|(p, k), b| {
            if !hit(p, k) {
                return true;
            }
            counts.blacklists += 1;
            events.push(EngineEvent::KeyRestored {
                provider: p.clone(),
                key: k.clone(),
                was: b.reason.as_str(),
                reason: "reset",
            });
            false
        });
        durable.cooldowns.retain(|(p, k, _), _| {
            let out = hit(p, k);
            counts.cooldowns += u32::from(out);
            !out
        });
        durable.headroom.retain(|(p, k, _), _| {
            let out = hit(p, k);
            counts.headroom += u32::from(out);
            !out
        });
        durable.breakers.retain(|id, b| {
            let (scope, p, k) = id;
            let out = match scope {
                BreakerScope::Key => hit(p, k),
                BreakerScope::Provider => key.is_none() && providers.contains(&p.as_str()),
            };
            if out && b.phase != BreakerPhase::Closed {
                counts.breakers += 1;
                events.push(breaker_event(id, b.phase, BreakerPhase::Closed));
            }
            !out
        });
        // (provider, key or "") -> when an operator reset it: shared through the store, so
        // every control plane pushes it and every Envoy voids the holds its workers set before
        // then; dropped after [`RESET_MARK`].
        for p in &providers {
            state
                .durable
                .resets
                .insert(((*p).to_owned(), key.unwrap_or("").to_owned()), now);
        }
        self.emit(&events);
        tracing::info!(
            provider = provider.unwrap_or("*"),
            key = key.unwrap_or("*"),
            blacklists = counts.blacklists,
            cooldowns = counts.cooldowns,
            breakers = counts.breakers,
            headroom = counts.headroom,
            "reset"
        );
        self.publish(&mut state, now);
        Ok(counts)
    }
}
