//! The pool the engine serves: taken over at start with what the store held, replaced whole by
//! a reload (see [`reload`]: what a reload keeps and drops).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use super::{budgets, reload, stats};

use super::events::EventBus;
use super::snapshot::{build_tables, published_keys};
use super::state::*;
use crate::clock::Clock;
use crate::config::secrets::{Env, Secret};
use crate::config::Config;
use crate::keys::record::VirtualKeyRecord;
use crate::store::durable::{DurableState, KeyId, StateStore};
use crate::store::lock;
use crate::store::memory::MemoryStateStore;

impl Engine {
    /// [`Engine::with_store`] with an in-memory store.
    pub fn new(
        config: Arc<Config>,
        env: Arc<dyn Env>,
        clock: Arc<dyn Clock>,
        virtual_keys: Vec<VirtualKeyRecord>,
        durable: DurableState,
    ) -> Arc<Self> {
        Self::with_store(
            config,
            env,
            clock,
            virtual_keys,
            durable,
            Arc::new(MemoryStateStore::default()),
        )
    }

    /// Resolves every key, takes over `durable` (what `store` held at start: entries for keys
    /// the pool no longer has are dropped, blacklists whose secret changed meanwhile lifted)
    /// and publishes the first snapshot. The store's copy catches up at the first
    /// [`Engine::sync_store`].
    pub fn with_store(
        config: Arc<Config>,
        env: Arc<dyn Env>,
        clock: Arc<dyn Clock>,
        virtual_keys: Vec<VirtualKeyRecord>,
        durable: DurableState,
        store: Arc<dyn StateStore>,
    ) -> Arc<Self> {
        let mut secrets = BTreeMap::new();
        let mut resolver = crate::config::secrets::Resolver::new(env.as_ref());
        for provider in &config.providers {
            for key in &provider.keys {
                secrets.insert(
                    (provider.id.clone(), key.alias.clone()),
                    resolver.resolve(&key.source),
                );
            }
        }
        let base = durable.clone();
        let mut kept = DurableState::default();
        let mut restored_at_start = Vec::new();
        for (id, entry) in durable.blacklists {
            let Some(current) = secrets.get(&id) else {
                continue;
            };
            let changed = current.as_ref().is_some_and(|s| {
                entry.refused_fingerprint != 0 && s.fingerprint() != entry.refused_fingerprint
            });
            if changed {
                restored_at_start.push(EngineEvent::KeyRestored {
                    provider: id.0.clone(),
                    key: id.1.clone(),
                    was: entry.reason.as_str(),
                    reason: "secret_changed",
                });
            } else {
                kept.blacklists.insert(id, entry);
            }
        }
        kept.cooldowns = durable.cooldowns;
        kept.headroom = durable.headroom;
        kept.breakers = durable.breakers;
        kept.spend = durable.spend;
        kept.resets = durable.resets;
        reload::retain_pool(&mut kept, &secrets, &config);
        // Versions start at the wall clock so they keep increasing across restarts.
        let version = u64::try_from(clock.now_ms()).unwrap_or(0).max(1);
        let published_keys = Arc::new(published_keys(&virtual_keys));
        let state = State {
            version,
            secrets,
            durable: kept,
            base,
            virtual_keys,
            published_keys,
            admin_token_sha256: String::new(),
            pending: false,
            headroom_as_of: BTreeMap::new(),
            estimated: Vec::new(),
            budgets: budgets::BudgetLedger::default(),
            listings: super::discovered::Listings::new(),
        };
        let now_at_start = clock.now_ms();
        let first = Arc::new(build_tables(&config, &state, now_at_start));
        let (updates, _) = watch::channel(first);
        let engine = Arc::new(Self {
            config: RwLock::new(config),
            env,
            clock,
            store,
            state: Mutex::new(state),
            updates,
            coalesce_headroom: std::sync::atomic::AtomicBool::new(false),
            report_observers: Mutex::default(),
            headroom_source: Mutex::default(),
            events: EventBus::default(),
            stats: stats::Stats::new(now_at_start),
            minute_calls: Default::default(),
        });
        engine.emit(&restored_at_start);
        engine.expire();
        engine
    }

    /// Serves `config` from now on (see [`reload`]: what it keeps and drops) and publishes it; returns what changed.
    pub fn replace_config(&self, config: Arc<Config>) -> reload::PoolChange {
        let old = self.config();
        let kept: BTreeSet<KeyId> = reload::key_ids(&old).collect();
        // Only the new keys are resolved here (file reads happen outside the state lock);
        // a kept key whose reference changed is picked up by the next secret refresh.
        let mut resolver = crate::config::secrets::Resolver::new(self.env.as_ref());
        let resolved: Vec<(KeyId, Option<Secret>)> = config
            .providers
            .iter()
            .flat_map(|p| p.keys.iter().map(move |k| (p, k)))
            .filter(|(p, k)| !kept.contains(&(p.id.clone(), k.alias.clone())))
            .map(|(p, k)| ((p.id.clone(), k.alias.clone()), resolver.resolve(&k.source)))
            .collect();
        let change = reload::pool_change(&old, &config);
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let mut secrets: BTreeMap<KeyId, Option<Secret>> = reload::key_ids(&config)
            .filter_map(|id| state.secrets.get(&id).map(|s| (id, s.clone())))
            .collect();
        secrets.extend(resolved);
        state.secrets = secrets;
        let secrets = state.secrets.clone();
        reload::retain_pool(&mut state.durable, &secrets, &config);
        super::discovered::retain(&mut state.listings, &config);
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
        self.publish(&mut state, now);
        change
    }
}
