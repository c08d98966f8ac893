//! The engine's side of discovery (`discover: true`): which keys are due for a listing, where
//! to reach a key, and what a listing found (the rules are [`super::discovered`]).

use super::state::*;
use crate::store::lock;

impl Engine {
    /// The keys of `discover: true` providers due for a listing, marked under way (the
    /// listing task, `crate::discovery`, makes them and calls [`Engine::finish_listing`]).
    pub fn listings_due(&self) -> Vec<super::discovered::ListingJob> {
        let config = self.config();
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let st = &mut *state;
        let (jobs, changed) = super::discovered::due(&mut st.listings, &config, &st.secrets, now);
        if changed {
            self.publish(&mut state, now);
        }
        jobs
    }

    /// Where and with what to reach one key of the pool (its provider's endpoint and headers,
    /// its current secret): what the ledger's credit poll asks with. `None`: no such key, or
    /// no secret for it.
    pub fn key_access(&self, provider: &str, alias: &str) -> Option<super::discovered::ListingJob> {
        let config = self.config();
        let p = config.providers.iter().find(|p| p.id == provider)?;
        let state = lock(&self.state);
        let secret = state
            .secrets
            .get(&(provider.to_owned(), alias.to_owned()))?
            .clone()?;
        Some(super::discovered::ListingJob {
            provider: p.id.clone(),
            key: alias.to_owned(),
            kind: p.kind,
            endpoint: p.endpoint.clone(),
            headers: p.headers.clone(),
            fingerprint: secret.fingerprint(),
            secret,
        })
    }

    /// A listing's result (the model ids, or why it failed); publishes when the key's catalog
    /// changed. Returns whether it did.
    pub fn finish_listing(
        &self,
        job: &super::discovered::ListingJob,
        result: Result<Vec<String>, String>,
    ) -> bool {
        let config = self.config();
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let changed = super::discovered::finish(&mut state.listings, &config, job, result, now);
        if changed {
            self.publish(&mut state, now);
        }
        changed
    }

    /// Every discovering key's listing as it stands.
    pub fn listings(&self) -> super::discovered::Listings {
        lock(&self.state).listings.clone()
    }
}
