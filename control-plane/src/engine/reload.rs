//! A new pool for a running engine (`Engine::replace_config`): what a reload of the config
//! file does to the published state. The keys the new pool keeps keep their secrets, their
//! blacklists, cooldowns, breakers and headroom; the keys and providers it drops lose theirs;
//! new keys are resolved at once. Every Envoy gets the new pool as one delta, so a call in
//! flight finishes on the lane it holds and its next attempt picks from the new pool.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::Config;
use crate::store::breaker::BreakerScope;
use crate::store::durable::{DurableState, KeyId};

/// What a reload changed in the pool, for its log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolChange {
    pub providers_added: Vec<String>,
    pub providers_removed: Vec<String>,
    /// `provider/alias`.
    pub keys_added: Vec<String>,
    pub keys_removed: Vec<String>,
}

/// Every key of the pool, as (provider, alias).
pub(super) fn key_ids(config: &Config) -> impl Iterator<Item = KeyId> + '_ {
    config
        .providers
        .iter()
        .flat_map(|p| p.keys.iter().map(move |k| (p.id.clone(), k.alias.clone())))
}

/// The providers and keys `new` adds to and drops from `old`.
pub fn pool_change(old: &Config, new: &Config) -> PoolChange {
    let providers =
        |c: &Config| -> BTreeSet<String> { c.providers.iter().map(|p| p.id.clone()).collect() };
    let keys =
        |c: &Config| -> BTreeSet<String> { key_ids(c).map(|(p, k)| format!("{p}/{k}")).collect() };
    let (old_p, new_p, old_k, new_k) = (providers(old), providers(new), keys(old), keys(new));
    PoolChange {
        providers_added: new_p.difference(&old_p).cloned().collect(),
        providers_removed: old_p.difference(&new_p).cloned().collect(),
        keys_added: new_k.difference(&old_k).cloned().collect(),
        keys_removed: old_k.difference(&new_k).cloned().collect(),
    }
}

/// Drops the durable entries of keys (`secrets` holds every key of the pool) and providers
/// `config` no longer has.
pub(super) fn retain_pool<S>(
    durable: &mut DurableState,
    secrets: &BTreeMap<KeyId, S>,
    config: &Config,
) {
    let known_key = |p: &String, k: &String| secrets.contains_key(&(p.clone(), k.clone()));
    let known_provider = |p: &String| config.providers.iter().any(|x| &x.id == p);
    durable.blacklists.retain(|(p, k), _| known_key(p, k));
    durable.cooldowns.retain(|(p, k, _), _| known_key(p, k));
    durable.headroom.retain(|(p, k, _), _| known_key(p, k));
    durable.breakers.retain(|(scope, p, k), _| match scope {
        BreakerScope::Key => known_key(p, k),
        BreakerScope::Provider => known_provider(p),
    });
    durable.spend.retain(|p, _| known_provider(p));
}
