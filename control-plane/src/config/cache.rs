//! `cache:` of the pool: the exact-match response cache each Envoy process keeps
//! (`filter-core/src/cache/`). As written ([`CacheConfig`]) and checked ([`ResponseCache`],
//! via [`resolve_cache`]); `cache: true | false` in a policy or on a key turns it on or off per
//! call ([`refuse_cache_without_pool_cache`] refuses a `true` with no pool cache to honour it).

use ai_router_contract::defaults;
use ai_router_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::config::error::{invalid, ConfigError};

/// The smallest slot: an answer of a few hundred tokens must fit.
const MIN_SLOT_BYTES: u64 = 1024;
/// Envoy's shared data lives in the process's memory: a sane bound on what the cache may take.
const MAX_BYTES: u64 = 1 << 30;
const MAX_ENTRIES: u32 = 1 << 20;

/// `cache: { ttlMs, maxEntries?, maxBytes? }` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CacheConfig {
    pub ttl_ms: u64,
    pub max_entries: Option<u32>,
    pub max_bytes: Option<u64>,
    /// With a Redis state store: how long a local miss waits for the shared tier.
    pub shared_lookup_ms: Option<u64>,
}

/// The checked cache, defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseCache {
    pub ttl_ms: u64,
    pub max_entries: u32,
    pub max_bytes: u64,
    pub shared_lookup_ms: u64,
}

/// The shared tier's wait when `sharedLookupMs` is not set.
pub const SHARED_LOOKUP_MS: u64 = 25;
/// A longer wait would hold every miss for it.
const MAX_SHARED_LOOKUP_MS: u64 = 1_000;

impl ResponseCache {
    /// The settings the Envoys get; `shared`: the state store is Redis, so the shared tier is
    /// on (else `shared_lookup_ms` is 0 and a miss asks nobody).
    pub fn to_proto(self, shared: bool) -> pb::CacheSettings {
        pb::CacheSettings {
            ttl_ms: self.ttl_ms,
            max_entries: self.max_entries,
            max_bytes: self.max_bytes,
            shared_lookup_ms: if shared { self.shared_lookup_ms } else { 0 },
        }
    }

    /// The largest answer one slot takes.
    pub fn slot_bytes(self) -> u64 {
        self.max_bytes / u64::from(self.max_entries.max(1))
    }
}

pub fn resolve_cache(raw: Option<&CacheConfig>) -> Result<Option<ResponseCache>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    if raw.ttl_ms == 0 {
        return Err(invalid(
            "cache.ttlMs: must be more than 0 (milliseconds an answer is served from the cache)",
        ));
    }
    let max_entries = raw.max_entries.unwrap_or(defaults::CACHE_MAX_ENTRIES);
    if max_entries == 0 || max_entries > MAX_ENTRIES {
        return Err(invalid(format!(
            "cache.maxEntries: {max_entries} is not in 1..={MAX_ENTRIES}"
        )));
    }
    let max_bytes = raw.max_bytes.unwrap_or(defaults::CACHE_MAX_BYTES);
    if max_bytes > MAX_BYTES {
        return Err(invalid(format!(
            "cache.maxBytes: {max_bytes} is more than {MAX_BYTES} (1 GiB)"
        )));
    }
    let shared_lookup_ms = raw.shared_lookup_ms.unwrap_or(SHARED_LOOKUP_MS);
    if shared_lookup_ms == 0 || shared_lookup_ms > MAX_SHARED_LOOKUP_MS {
        return Err(invalid(format!(
            "cache.sharedLookupMs: {shared_lookup_ms} is not in 1..={MAX_SHARED_LOOKUP_MS}"
        )));
    }
    let cache = ResponseCache {
        ttl_ms: raw.ttl_ms,
        max_entries,
        max_bytes,
        shared_lookup_ms,
    };
    if cache.slot_bytes() < MIN_SLOT_BYTES {
        return Err(invalid(format!(
            "cache.maxBytes: {max_bytes} over {max_entries} entries leaves {} bytes per answer; \
             give each at least {MIN_SLOT_BYTES} (raise maxBytes or lower maxEntries)",
            cache.slot_bytes()
        )));
    }
    Ok(Some(cache))
}

/// A policy's `cache: true` asks for a cache the pool must have: `policies` are each policy's
/// field path (`defaults`, `profiles.<name>`) and its `cache`.
pub fn refuse_cache_without_pool_cache(
    pool_has_cache: bool,
    policies: impl IntoIterator<Item = (String, Option<bool>)>,
) -> Result<(), ConfigError> {
    if pool_has_cache {
        return Ok(());
    }
    match policies.into_iter().find(|(_, cache)| *cache == Some(true)) {
        Some((at, _)) => Err(invalid(format!(
            "{at}.cache: true needs the pool's `cache: {{ ttlMs: ... }}` section"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(yaml: &str) -> Result<Option<ResponseCache>, String> {
        let raw: CacheConfig = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        resolve_cache(Some(&raw)).map_err(|e| e.to_string())
    }

    #[test]
    fn the_shared_tier_is_on_only_with_a_shared_store() {
        let cache = read("{ ttlMs: 1000, sharedLookupMs: 40 }").ok().flatten();
        let shared = cache.map(|c| c.to_proto(true).shared_lookup_ms);
        let local = cache.map(|c| c.to_proto(false).shared_lookup_ms);
        assert_eq!((shared, local), (Some(40), Some(0)));
    }

    #[test]
    fn defaults_apply_and_bad_values_are_refused() {
        assert_eq!(
            read("{ ttlMs: 60000 }"),
            Ok(Some(ResponseCache {
                ttl_ms: 60_000,
                max_entries: defaults::CACHE_MAX_ENTRIES,
                max_bytes: defaults::CACHE_MAX_BYTES,
                shared_lookup_ms: SHARED_LOOKUP_MS,
            }))
        );
        assert_eq!(
            read("{ ttlMs: 1000, maxEntries: 8, maxBytes: 65536 }")
                .map(|c| c.map(|c| c.slot_bytes())),
            Ok(Some(8192))
        );
        for (yaml, field) in [
            ("{ ttlMs: 0 }", "cache.ttlMs"),
            ("{ ttlMs: 1, maxEntries: 0 }", "cache.maxEntries"),
            ("{ ttlMs: 1, sharedLookupMs: 0 }", "cache.sharedLookupMs"),
            ("{ ttlMs: 1, sharedLookupMs: 5000 }", "cache.sharedLookupMs"),
            (
                "{ ttlMs: 1, maxEntries: 100, maxBytes: 1000 }",
                "cache.maxBytes",
            ),
            ("{ ttlMs: 1, maxBytes: 9999999999999 }", "cache.maxBytes"),
            ("{ ttlMs: 1, size: 3 }", "size"),
            ("{ maxEntries: 3 }", "ttlMs"),
        ] {
            let err = read(yaml).expect_err(yaml);
            assert!(err.contains(field), "{yaml}: {err}");
        }
        assert_eq!(resolve_cache(None).ok(), Some(None));
    }

    #[test]
    fn a_policy_asking_for_the_cache_needs_the_pool_cache() {
        let policies = || {
            vec![
                ("defaults".to_owned(), Some(false)),
                ("profiles.fast".to_owned(), Some(true)),
                ("profiles.slow".to_owned(), None),
            ]
        };
        let err = refuse_cache_without_pool_cache(false, policies())
            .expect_err("refused")
            .to_string();
        assert!(err.contains("profiles.fast.cache: true"), "{err}");
        assert!(refuse_cache_without_pool_cache(true, policies()).is_ok());
        let off = vec![("defaults".to_owned(), Some(false))];
        assert!(refuse_cache_without_pool_cache(false, off).is_ok());
    }
}
