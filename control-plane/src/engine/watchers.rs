//! The open `Watch` streams of every control plane on a shared state store, which split the
//! headroom among them (`api::shares`).

use crate::engine::Engine;

impl Engine {
    /// Registers control plane `plane`'s streams `mine` for `ttl_ms` and answers every control
    /// plane's; `None` when the store shares no membership or does not answer now (logged).
    pub fn register_watchers(
        &self,
        plane: &str,
        mine: &[String],
        ttl_ms: i64,
    ) -> Option<Vec<String>> {
        let now = self.clock.now_ms();
        match self.store.watchers(plane, mine, now, ttl_ms) {
            Ok(all) => all,
            Err(err) => {
                tracing::debug!(%err, "headroom split among this control plane's Envoys only: the state store does not answer");
                None
            }
        }
    }
}
