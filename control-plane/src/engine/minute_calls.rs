//! `Sync.TakeMinuteCalls`: blocks of a virtual key's `requestsPerMinute` for the Envoys, from
//! the state store's shared count when it has one (Redis), else from this control plane's own
//! (`store::minute_calls`).

use std::sync::atomic::Ordering;

use crate::engine::Engine;
use crate::store::minute_calls::GRANTED;

impl Engine {
    /// Grants up to `calls` of `key_id`'s UTC `minute` under `limit`. Never fails: a store
    /// that cannot count now leaves it to this control plane's memory.
    pub fn take_minute_calls(&self, key_id: &str, minute: i64, calls: u64, limit: u64) -> u64 {
        let shared = match self.store.take_minute_calls(key_id, minute, calls, limit) {
            Ok(shared) => shared,
            Err(err) => {
                tracing::warn!(%err, "minute budget from local counts: the state store refused the count");
                None
            }
        };
        let (granted, counter) = match shared {
            Some(granted) => (granted, &GRANTED.shared),
            None => (
                self.minute_calls.take(key_id, minute, calls, limit),
                &GRANTED.local,
            ),
        };
        counter.fetch_add(granted, Ordering::Relaxed);
        granted
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::AtomicI64;
    use std::sync::Arc;

    use crate::clock::TestClock;
    use crate::config::parse;
    use crate::config::secrets::MapEnv;
    use crate::engine::Engine;
    use crate::store::durable::DurableState;

    const POOL: &str = "
providers:
  - id: local
    baseUrl: http://127.0.0.1:9000/v1/
    keys: [{ alias: a, env: LOCAL_A }]
    models: [{ id: llama }]
";

    #[test]
    fn every_envoy_of_one_control_plane_draws_from_one_budget() -> Result<(), String> {
        let env = Arc::new(MapEnv::default());
        let config = parse(POOL)
            .and_then(|f| f.resolve(env.as_ref(), Path::new(".")))
            .map_err(|e| e.to_string())?;
        let engine = Engine::new(
            Arc::new(config),
            env,
            Arc::new(TestClock(AtomicI64::new(1_000_000))),
            Vec::new(),
            DurableState::default(),
        );
        // Asks from any number of Envoys, in blocks of 5 of a limit of 50.
        let granted: u64 = (0..30)
            .map(|_| engine.take_minute_calls("key_a", 5, 5, 50))
            .sum();
        assert_eq!(granted, 50);
        assert_eq!(engine.take_minute_calls("key_a", 6, 5, 50), 5);
        Ok(())
    }
}
