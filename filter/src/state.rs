//! The pushed state, decoded once per version and indexed for per-request lookups.

use std::collections::HashMap;

use ai_router_proto::v1::{KeyHealth, Policy, Provider, Snapshot, VirtualKey};

/// Where a pool model is served: provider index and model index in the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelRef {
    pub provider: usize,
    pub model: usize,
}

#[derive(Debug, Default)]
pub struct State {
    pub version: u64,
    pub snapshot: Snapshot,
    vkeys: HashMap<String, usize>,
    providers: HashMap<String, usize>,
    /// Model ids and aliases -> every (provider, model) serving the name.
    names: HashMap<String, Vec<ModelRef>>,
    key_health: HashMap<(String, String), KeyHealth>,
    cooldowns: HashMap<(String, String, String), i64>,
}

impl State {
    pub fn new(version: u64, snapshot: Snapshot) -> Self {
        let mut state = State {
            version,
            ..State::default()
        };
        for (i, vk) in snapshot.virtual_keys.iter().enumerate() {
            state.vkeys.insert(vk.sha256.clone(), i);
        }
        for (pi, p) in snapshot.providers.iter().enumerate() {
            state.providers.insert(p.id.clone(), pi);
            for (mi, m) in p.models.iter().enumerate() {
                let r = ModelRef {
                    provider: pi,
                    model: mi,
                };
                for name in std::iter::once(&m.id).chain(m.aliases.iter()) {
                    let entry = state.names.entry(name.clone()).or_default();
                    if !entry.contains(&r) {
                        entry.push(r);
                    }
                }
            }
        }
        for h in &snapshot.key_health {
            state
                .key_health
                .insert((h.provider.clone(), h.key.clone()), h.clone());
        }
        for c in &snapshot.cooldowns {
            let k = (c.provider.clone(), c.key.clone(), c.model.clone());
            let until = state
                .cooldowns
                .get(&k)
                .copied()
                .unwrap_or(0)
                .max(c.until_ms);
            state.cooldowns.insert(k, until);
        }
        state.snapshot = snapshot;
        state
    }

    pub fn decode(version: u64, bytes: &[u8]) -> Option<Self> {
        let snapshot = <Snapshot as prost::Message>::decode(bytes).ok()?;
        Some(Self::new(version, snapshot))
    }

    pub fn virtual_key(&self, sha256_hex: &str) -> Option<&VirtualKey> {
        self.vkeys
            .get(sha256_hex)
            .and_then(|i| self.snapshot.virtual_keys.get(*i))
    }

    pub fn provider(&self, id: &str) -> Option<(usize, &Provider)> {
        let i = *self.providers.get(id)?;
        self.snapshot.providers.get(i).map(|p| (i, p))
    }

    pub fn provider_at(&self, index: usize) -> Option<&Provider> {
        self.snapshot.providers.get(index)
    }

    /// Every (provider, model) serving `name` as an id or an alias.
    pub fn models_named(&self, name: &str) -> &[ModelRef] {
        self.names.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn profile(&self, name: &str) -> Option<&Policy> {
        self.snapshot.profiles.get(name)
    }

    pub fn defaults(&self) -> Policy {
        self.snapshot.defaults.clone().unwrap_or_default()
    }

    pub fn key_health(&self, provider: &str, key: &str) -> Option<&KeyHealth> {
        self.key_health
            .get(&(provider.to_string(), key.to_string()))
    }

    pub fn cooldown_until(&self, provider: &str, key: &str, model: &str) -> i64 {
        self.cooldowns
            .get(&(provider.to_string(), key.to_string(), model.to_string()))
            .copied()
            .unwrap_or(0)
    }

    pub fn max_body_bytes(&self) -> u64 {
        match self.snapshot.limits.as_ref().map(|l| l.max_body_bytes) {
            Some(n) if n > 0 => n,
            _ => 4 * 1024 * 1024,
        }
    }

    /// Every name a caller may use: profiles, model ids and aliases.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.snapshot.profiles.keys().chain(self.names.keys())
    }
}
