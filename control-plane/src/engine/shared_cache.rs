//! `Sync.SharedCacheGet` / `SharedCachePut`: the shared tier of the response cache, in the
//! state store when it is Redis (`<storeNamespace>:cache:<key>`), so an answer one Envoy stored
//! is a hit at every other. An entry is what the filter keeps in a slot; the control plane
//! only bounds it by the pool's `cache:` (a slot's bytes, the TTL).

use crate::engine::Engine;

impl Engine {
    /// The entry stored under `key`; `None` (a miss) when there is none, the pool has no
    /// cache, or the store shares none or does not answer.
    pub fn shared_cache_get(&self, key: &str) -> Option<Vec<u8>> {
        self.config().cache?;
        self.store.cache_get(key)
    }

    /// Stores `entry` under `key` for `ttl_ms` (at most the pool's `ttlMs`), when it fits a
    /// slot (`maxBytes / maxEntries`); whether it was written.
    pub fn shared_cache_put(&self, key: &str, entry: Vec<u8>, ttl_ms: u64) -> bool {
        let Some(cache) = self.config().cache else {
            return false;
        };
        if entry.len() as u64 > cache.slot_bytes() {
            return false;
        }
        self.store.cache_put(key, entry, ttl_ms.min(cache.ttl_ms))
    }
}
