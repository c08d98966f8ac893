//! The sync state as tables keyed by identity, and the deltas between two of them.
//!
//! The control plane keeps what it publishes as [`Tables`] and sends each watcher the
//! [`Tables::diff`] from what that watcher last received; Envoy's singleton keeps the same
//! tables and [`Tables::apply`]s each delta, learning which records it must rewrite. One
//! definition of a delta's meaning for both sides: `apply(a, diff(a, b)) == b`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::v1::{
    BreakerRef, BreakerState, Delta, Headroom, HoldReset, KeyHealth, LaneCooldown, LaneRef,
    Provider, ProviderHealth, ProviderKeyRef, ProviderKeyUpdate, ProviderLanes, Settings, Snapshot,
    VirtualKey,
};

pub type KeyId = (String, String);
pub type LaneKey = (String, String, String);
/// (scope, provider, key); the key is empty for a provider breaker.
pub type BreakerKey = (i32, String, String);

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tables {
    pub version: u64,
    pub generated_at_ms: i64,
    pub settings: Settings,
    /// In the pool's order (lane choice and name resolution follow it).
    pub providers: Vec<Provider>,
    /// By SHA-256 (hex). Shared, so a publish that did not touch the keys does not copy them.
    pub virtual_keys: Arc<BTreeMap<String, VirtualKey>>,
    pub key_health: BTreeMap<KeyId, KeyHealth>,
    pub cooldowns: BTreeMap<LaneKey, LaneCooldown>,
    pub breakers: BTreeMap<BreakerKey, BreakerState>,
    pub headroom: BTreeMap<LaneKey, Headroom>,
    pub provider_health: BTreeMap<String, ProviderHealth>,
    /// (provider, key or "") -> the operator's recent reset.
    pub resets: BTreeMap<KeyId, HoldReset>,
}

/// What a delta changed, by the records Envoy keeps: the pool (settings, providers and their
/// keys), single virtual keys, and the lane health of single providers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    pub pool: bool,
    pub virtual_keys: BTreeSet<String>,
    pub providers: BTreeSet<String>,
}

impl Touched {
    /// Everything `tables` holds (after a snapshot).
    pub fn all(tables: &Tables) -> Self {
        let mut providers: BTreeSet<String> =
            tables.providers.iter().map(|p| p.id.clone()).collect();
        providers.extend(tables.key_health.keys().map(|k| k.0.clone()));
        providers.extend(tables.cooldowns.keys().map(|k| k.0.clone()));
        providers.extend(tables.breakers.keys().map(|k| k.1.clone()));
        providers.extend(tables.headroom.keys().map(|k| k.0.clone()));
        providers.extend(tables.provider_health.keys().cloned());
        providers.extend(tables.resets.keys().map(|k| k.0.clone()));
        Self {
            pool: true,
            virtual_keys: tables.virtual_keys.keys().cloned().collect(),
            providers,
        }
    }

    pub fn union(&mut self, other: Touched) {
        self.pool |= other.pool;
        self.virtual_keys.extend(other.virtual_keys);
        self.providers.extend(other.providers);
    }
}

/// A delta that does not follow the receiver's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub held: u64,
    pub base: u64,
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a delta from version {} does not apply to version {}",
            self.base, self.held
        )
    }
}

impl std::error::Error for Gap {}

fn lane_key(provider: &str, key: &str, model: &str) -> LaneKey {
    (provider.to_owned(), key.to_owned(), model.to_owned())
}

impl Tables {
    pub fn from_snapshot(version: u64, snapshot: Snapshot) -> Self {
        let mut t = Tables {
            version,
            generated_at_ms: snapshot.generated_at_ms,
            settings: Settings {
                defaults: snapshot.defaults,
                profiles: snapshot.profiles,
                limits: snapshot.limits,
                resilience: snapshot.resilience,
                selection: snapshot.selection,
                budgets: snapshot.budgets,
                routes: snapshot.routes,
                cache: snapshot.cache,
            },
            providers: snapshot.providers,
            virtual_keys: Arc::new(
                snapshot
                    .virtual_keys
                    .into_iter()
                    .map(|k| (k.sha256.clone(), k))
                    .collect(),
            ),
            ..Tables::default()
        };
        for h in snapshot.key_health {
            t.key_health.insert((h.provider.clone(), h.key.clone()), h);
        }
        for c in snapshot.cooldowns {
            let k = lane_key(&c.provider, &c.key, &c.model);
            // Two entries for one lane: the later end holds.
            if t.cooldowns.get(&k).is_none_or(|o| o.until_ms < c.until_ms) {
                t.cooldowns.insert(k, c);
            }
        }
        for b in snapshot.breakers {
            t.breakers
                .insert((b.scope, b.provider.clone(), b.key.clone()), b);
        }
        for h in snapshot.headroom {
            t.headroom
                .insert(lane_key(&h.provider, &h.key, &h.model), h);
        }
        for r in snapshot.resets {
            t.resets.insert((r.provider.clone(), r.key.clone()), r);
        }
        for p in snapshot.provider_health {
            if t.provider_health
                .get(&p.provider)
                .is_none_or(|o| o.until_ms < p.until_ms)
            {
                t.provider_health.insert(p.provider.clone(), p);
            }
        }
        t
    }

    pub fn to_snapshot(&self) -> Snapshot {
        Snapshot {
            providers: self.providers.clone(),
            virtual_keys: self.virtual_keys.values().cloned().collect(),
            defaults: self.settings.defaults.clone(),
            profiles: self.settings.profiles.clone(),
            key_health: self.key_health.values().cloned().collect(),
            cooldowns: self.cooldowns.values().cloned().collect(),
            limits: self.settings.limits.clone(),
            generated_at_ms: self.generated_at_ms,
            breakers: self.breakers.values().cloned().collect(),
            resilience: self.settings.resilience,
            selection: self.settings.selection.clone(),
            headroom: self.headroom.values().cloned().collect(),
            provider_health: self.provider_health.values().cloned().collect(),
            resets: self.resets.values().cloned().collect(),
            budgets: self.settings.budgets.clone(),
            routes: self.settings.routes.clone(),
            cache: self.settings.cache,
        }
    }

    /// The pool's record: every setting and provider, no virtual key and no lane health.
    pub fn pool_snapshot(&self) -> Snapshot {
        Snapshot {
            providers: self.providers.clone(),
            defaults: self.settings.defaults.clone(),
            profiles: self.settings.profiles.clone(),
            limits: self.settings.limits.clone(),
            generated_at_ms: self.generated_at_ms,
            resilience: self.settings.resilience,
            selection: self.settings.selection.clone(),
            budgets: self.settings.budgets.clone(),
            routes: self.settings.routes.clone(),
            cache: self.settings.cache,
            ..Snapshot::default()
        }
    }

    /// The lane health of one provider (its keys' blacklists, cooldowns, breakers, headroom,
    /// and its own health), the record a worker reads when it picks among its lanes.
    pub fn provider_lanes(&self, provider: &str) -> ProviderLanes {
        ProviderLanes {
            key_health: of_provider(&self.key_health, provider, |k| &k.0),
            cooldowns: of_provider(&self.cooldowns, provider, |k| &k.0),
            breakers: of_provider(&self.breakers, provider, |k| &k.1),
            headroom: of_provider(&self.headroom, provider, |k| &k.0),
            provider_health: self
                .provider_health
                .get(provider)
                .cloned()
                .into_iter()
                .collect(),
            resets: of_provider(&self.resets, provider, |k| &k.0),
        }
    }

    /// What turns `self` into `newer`; `None` when a delta cannot say it (the providers were
    /// reordered, added or removed: send a snapshot).
    pub fn diff(&self, newer: &Tables) -> Option<Delta> {
        if self.providers.len() != newer.providers.len()
            || self
                .providers
                .iter()
                .zip(&newer.providers)
                .any(|(a, b)| a.id != b.id)
        {
            return None;
        }
        let mut d = Delta {
            base_version: self.version,
            generated_at_ms: newer.generated_at_ms,
            ..Delta::default()
        };
        if self.settings != newer.settings {
            d.settings = Some(newer.settings.clone());
        }
        for (old, new) in self.providers.iter().zip(&newer.providers) {
            if old == new {
                continue;
            }
            let same_keys = old.keys.len() == new.keys.len()
                && old
                    .keys
                    .iter()
                    .zip(&new.keys)
                    .all(|(a, b)| a.alias == b.alias);
            let same_rest = Provider {
                keys: Vec::new(),
                ..old.clone()
            } == Provider {
                keys: Vec::new(),
                ..new.clone()
            };
            if same_keys && same_rest {
                for (a, b) in old.keys.iter().zip(&new.keys) {
                    if a != b {
                        d.provider_keys.push(ProviderKeyUpdate {
                            provider: new.id.clone(),
                            key: Some(b.clone()),
                        });
                    }
                }
            } else {
                d.providers.push(new.clone());
            }
        }
        if !Arc::ptr_eq(&self.virtual_keys, &newer.virtual_keys) {
            let (up, gone) = changes(&self.virtual_keys, &newer.virtual_keys);
            d.virtual_keys = up;
            d.removed_virtual_keys = gone;
        }
        let (up, gone) = changes(&self.key_health, &newer.key_health);
        d.key_health = up;
        d.removed_key_health = gone
            .into_iter()
            .map(|(provider, key)| ProviderKeyRef { provider, key })
            .collect();
        let lane_ref = |(provider, key, model): LaneKey| LaneRef {
            provider,
            key,
            model,
        };
        let (up, gone) = changes(&self.cooldowns, &newer.cooldowns);
        d.cooldowns = up;
        d.removed_cooldowns = gone.into_iter().map(lane_ref).collect();
        let (up, gone) = changes(&self.breakers, &newer.breakers);
        d.breakers = up;
        d.removed_breakers = gone
            .into_iter()
            .map(|(scope, provider, key)| BreakerRef {
                scope,
                provider,
                key,
            })
            .collect();
        let (up, gone) = changes(&self.headroom, &newer.headroom);
        d.headroom = up;
        d.removed_headroom = gone.into_iter().map(lane_ref).collect();
        let (up, gone) = changes(&self.provider_health, &newer.provider_health);
        d.provider_health = up;
        d.removed_provider_health = gone;
        let (up, gone) = changes(&self.resets, &newer.resets);
        d.resets = up;
        d.removed_resets = gone
            .into_iter()
            .map(|(provider, key)| ProviderKeyRef { provider, key })
            .collect();
        Some(d)
    }

    /// Applies `delta` (which must follow this version) and becomes `version`; says which
    /// records changed.
    pub fn apply(&mut self, version: u64, delta: &Delta) -> Result<Touched, Gap> {
        if delta.base_version != self.version {
            return Err(Gap {
                held: self.version,
                base: delta.base_version,
            });
        }
        let mut touched = Touched::default();
        self.version = version;
        self.generated_at_ms = delta.generated_at_ms;
        if let Some(settings) = &delta.settings {
            self.settings = settings.clone();
            touched.pool = true;
        }
        for p in &delta.providers {
            touched.pool = true;
            match self.providers.iter_mut().find(|o| o.id == p.id) {
                Some(old) => *old = p.clone(),
                None => self.providers.push(p.clone()),
            }
        }
        for u in &delta.provider_keys {
            let Some(key) = &u.key else { continue };
            let Some(provider) = self.providers.iter_mut().find(|p| p.id == u.provider) else {
                continue;
            };
            touched.pool = true;
            match provider.keys.iter_mut().find(|k| k.alias == key.alias) {
                Some(old) => *old = key.clone(),
                None => provider.keys.push(key.clone()),
            }
        }
        if !delta.virtual_keys.is_empty() || !delta.removed_virtual_keys.is_empty() {
            let keys = Arc::make_mut(&mut self.virtual_keys);
            for k in &delta.virtual_keys {
                touched.virtual_keys.insert(k.sha256.clone());
                keys.insert(k.sha256.clone(), k.clone());
            }
            for sha in &delta.removed_virtual_keys {
                touched.virtual_keys.insert(sha.clone());
                keys.remove(sha);
            }
        }
        let mut note = |p: &str| {
            if !touched.providers.contains(p) {
                touched.providers.insert(p.to_owned());
            }
        };
        for h in &delta.key_health {
            note(&h.provider);
            self.key_health
                .insert((h.provider.clone(), h.key.clone()), h.clone());
        }
        for r in &delta.removed_key_health {
            note(&r.provider);
            self.key_health.remove(&(r.provider.clone(), r.key.clone()));
        }
        for c in &delta.cooldowns {
            note(&c.provider);
            self.cooldowns
                .insert(lane_key(&c.provider, &c.key, &c.model), c.clone());
        }
        for r in &delta.removed_cooldowns {
            note(&r.provider);
            self.cooldowns
                .remove(&lane_key(&r.provider, &r.key, &r.model));
        }
        for b in &delta.breakers {
            note(&b.provider);
            self.breakers
                .insert((b.scope, b.provider.clone(), b.key.clone()), b.clone());
        }
        for r in &delta.removed_breakers {
            note(&r.provider);
            self.breakers
                .remove(&(r.scope, r.provider.clone(), r.key.clone()));
        }
        for h in &delta.headroom {
            note(&h.provider);
            self.headroom
                .insert(lane_key(&h.provider, &h.key, &h.model), h.clone());
        }
        for r in &delta.removed_headroom {
            note(&r.provider);
            self.headroom
                .remove(&lane_key(&r.provider, &r.key, &r.model));
        }
        for p in &delta.provider_health {
            note(&p.provider);
            self.provider_health.insert(p.provider.clone(), p.clone());
        }
        for p in &delta.removed_provider_health {
            note(p);
            self.provider_health.remove(p);
        }
        for r in &delta.resets {
            note(&r.provider);
            self.resets
                .insert((r.provider.clone(), r.key.clone()), r.clone());
        }
        for r in &delta.removed_resets {
            note(&r.provider);
            self.resets.remove(&(r.provider.clone(), r.key.clone()));
        }
        Ok(touched)
    }
}

/// Whether a delta carries no change at all (the version moved, nothing else).
pub fn is_empty(d: &Delta) -> bool {
    d.settings.is_none()
        && d.providers.is_empty()
        && d.provider_keys.is_empty()
        && d.virtual_keys.is_empty()
        && d.removed_virtual_keys.is_empty()
        && d.key_health.is_empty()
        && d.removed_key_health.is_empty()
        && d.cooldowns.is_empty()
        && d.removed_cooldowns.is_empty()
        && d.breakers.is_empty()
        && d.removed_breakers.is_empty()
        && d.headroom.is_empty()
        && d.removed_headroom.is_empty()
        && d.provider_health.is_empty()
        && d.removed_provider_health.is_empty()
        && d.resets.is_empty()
        && d.removed_resets.is_empty()
}

/// The entries of `map` whose key names `provider`.
fn of_provider<K, V: Clone>(
    map: &BTreeMap<K, V>,
    provider: &str,
    provider_of: impl Fn(&K) -> &String,
) -> Vec<V> {
    map.iter()
        .filter(|(k, _)| provider_of(k) == provider)
        .map(|(_, v)| v.clone())
        .collect()
}

/// Entries of `to` that are new or differ from `from`, and keys of `from` that `to` lacks.
fn changes<K: Ord + Clone, V: PartialEq + Clone>(
    from: &BTreeMap<K, V>,
    to: &BTreeMap<K, V>,
) -> (Vec<V>, Vec<K>) {
    let up = to
        .iter()
        .filter(|(k, v)| from.get(*k) != Some(*v))
        .map(|(_, v)| v.clone())
        .collect();
    let gone = from
        .keys()
        .filter(|k| !to.contains_key(*k))
        .cloned()
        .collect();
    (up, gone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{Limits, Model, ProviderKey};
    use prost::Message;

    fn provider(id: &str, keys: &[&str]) -> Provider {
        Provider {
            id: id.into(),
            kind: crate::v1::ProviderKind::Openai.into(),
            keys: keys
                .iter()
                .map(|a| ProviderKey {
                    alias: (*a).into(),
                    secret: format!("sk-{a}"),
                    fingerprint: 1,
                    ..ProviderKey::default()
                })
                .collect(),
            models: vec![Model {
                id: "m".into(),
                ..Model::default()
            }],
            ..Provider::default()
        }
    }

    fn vk(sha: &str, enabled: bool) -> VirtualKey {
        VirtualKey {
            id: format!("key_{sha}"),
            sha256: sha.into(),
            enabled,
            ..VirtualKey::default()
        }
    }

    fn base() -> Tables {
        let snapshot = Snapshot {
            providers: vec![provider("a", &["k1", "k2"]), provider("b", &["k3"])],
            virtual_keys: (0..100).map(|i| vk(&format!("{i:064}"), true)).collect(),
            limits: Some(Limits {
                max_body_bytes: 10,
                ..Limits::default()
            }),
            key_health: vec![KeyHealth {
                provider: "a".into(),
                key: "k1".into(),
                reason: crate::v1::KeyOutReason::Auth.into(),
                ..KeyHealth::default()
            }],
            headroom: vec![Headroom {
                provider: "b".into(),
                key: "k3".into(),
                model: "m".into(),
                remaining_requests: 5,
                remaining_tokens: 100,
                reset_at_ms: 9,
                ..Headroom::default()
            }],
            generated_at_ms: 1,
            ..Snapshot::default()
        };
        Tables::from_snapshot(7, snapshot)
    }

    fn applied(from: &Tables, to: &Tables) -> (Tables, Touched, Delta) {
        let delta = from.diff(to).unwrap_or_default();
        let mut out = from.clone();
        let touched = out.apply(to.version, &delta).unwrap_or_default();
        (out, touched, delta)
    }

    #[test]
    fn a_delta_turns_one_version_into_the_next() {
        let old = base();
        let mut new = old.clone();
        new.version = 8;
        new.generated_at_ms = 2;
        Arc::make_mut(&mut new.virtual_keys)
            .insert(format!("{:064}", 3), vk(&format!("{:064}", 3), false));
        Arc::make_mut(&mut new.virtual_keys).remove(&format!("{:064}", 4));
        new.key_health.clear();
        new.headroom
            .values_mut()
            .for_each(|h| h.remaining_requests = 4);
        new.providers[1].keys[0].secret = "sk-new".into();
        new.cooldowns.insert(
            lane_key("a", "k2", "m"),
            LaneCooldown {
                provider: "a".into(),
                key: "k2".into(),
                model: "m".into(),
                until_ms: 50,
            },
        );
        let (out, touched, delta) = applied(&old, &new);
        assert_eq!(out, new);
        assert!(touched.pool, "a secret changed");
        assert_eq!(touched.virtual_keys.len(), 2);
        assert_eq!(
            touched
                .providers
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        // Small: the revoked key, the removed one, one headroom, one cooldown, one secret.
        assert_eq!(delta.virtual_keys.len(), 1);
        assert_eq!(delta.removed_virtual_keys.len(), 1);
        assert_eq!(delta.provider_keys.len(), 1);
        assert!(delta.providers.is_empty());
        assert!(delta.encoded_len() < 600, "{} bytes", delta.encoded_len());
        assert!(old.to_snapshot().encoded_len() > 10 * delta.encoded_len());
    }

    #[test]
    fn a_headroom_change_touches_one_provider_only() {
        let old = base();
        let mut new = old.clone();
        new.version = 8;
        new.headroom
            .values_mut()
            .for_each(|h| h.remaining_tokens = 1);
        let (out, touched, delta) = applied(&old, &new);
        assert_eq!(out, new);
        assert!(!touched.pool);
        assert!(touched.virtual_keys.is_empty());
        assert_eq!(touched.providers.len(), 1);
        assert_eq!(delta.headroom.len(), 1);
        assert!(!is_empty(&delta));
    }

    #[test]
    fn nothing_changed_is_an_empty_delta() {
        let old = base();
        let mut new = old.clone();
        new.version = 9;
        let (out, touched, delta) = applied(&old, &new);
        assert!(is_empty(&delta));
        assert_eq!(touched, Touched::default());
        assert_eq!(out.version, 9);
    }

    #[test]
    fn a_reordered_pool_needs_a_snapshot() {
        let old = base();
        let mut new = old.clone();
        new.providers.reverse();
        assert!(old.diff(&new).is_none());
        new.providers.pop();
        assert!(old.diff(&new).is_none());
    }

    #[test]
    fn a_changed_provider_is_sent_whole() {
        let old = base();
        let mut new = old.clone();
        new.version = 8;
        new.providers[0].weight = 3.0;
        new.providers[1].keys.push(ProviderKey {
            alias: "k4".into(),
            ..ProviderKey::default()
        });
        let (out, touched, delta) = applied(&old, &new);
        assert_eq!(out, new);
        assert!(touched.pool);
        assert_eq!(delta.providers.len(), 2);
        assert!(delta.provider_keys.is_empty());
    }

    #[test]
    fn a_delta_from_another_version_is_refused() {
        let old = base();
        let mut new = old.clone();
        new.version = 8;
        let Some(mut delta) = old.diff(&new) else {
            panic!("no delta");
        };
        delta.base_version = 6;
        let mut held = old.clone();
        assert_eq!(held.apply(8, &delta), Err(Gap { held: 7, base: 6 }));
        assert_eq!(held, old, "nothing applied");
    }

    #[test]
    fn a_snapshot_round_trips() {
        let t = base();
        let again = Tables::from_snapshot(t.version, t.to_snapshot());
        assert_eq!(again, t);
        let all = Touched::all(&t);
        assert_eq!(all.virtual_keys.len(), 100);
        assert_eq!(all.providers.len(), 2);
        let lanes = t.provider_lanes("a");
        assert_eq!(lanes.key_health.len(), 1);
        assert!(lanes.headroom.is_empty());
        assert_eq!(t.provider_lanes("b").headroom.len(), 1);
        assert!(t.pool_snapshot().virtual_keys.is_empty());
    }
}
