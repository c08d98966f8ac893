//! The durable state: what survives a restart with a durable store, and what control planes
//! sharing one store see: blacklisted keys (with the refused fingerprint), lane cooldowns,
//! breakers, headroom and provider spend. [`StateStore`] is where it lives; the engine changes
//! it and exchanges it with the store by three-way merge ([`merge_durable`]).

use std::collections::BTreeMap;

use ai_router_proto::v1 as pb;

use crate::store::breaker::{Breaker, BreakerId};
use crate::store::spend::Spend;

/// Why a key is out of rotation (stored); `missing` is derived from the secret itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BlacklistReason {
    Auth,
    Quota,
}

impl BlacklistReason {
    /// "auth" or "quota": the wire enum's text.
    pub fn as_str(self) -> &'static str {
        pb::KeyOutReason::from(self).text()
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auth" => Some(Self::Auth),
            "quota" => Some(Self::Quota),
            _ => None,
        }
    }
}

impl From<BlacklistReason> for pb::KeyOutReason {
    fn from(reason: BlacklistReason) -> Self {
        match reason {
            BlacklistReason::Auth => Self::Auth,
            BlacklistReason::Quota => Self::Quota,
        }
    }
}

/// A blacklisted key. Keeps the fingerprint of the refused secret, never the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blacklist {
    pub reason: BlacklistReason,
    /// 0: until the secret changes.
    pub until_ms: i64,
    pub refused_fingerprint: u64,
    /// The provider's error code, when it sent one.
    pub code: Option<String>,
}

/// (provider id, key alias)
pub type KeyId = (String, String);
/// (provider id, key alias, model)
pub type LaneId = (String, String, String);

/// Names borrowed: a map keyed by a tuple of `N` owned strings ([`KeyId`], [`LaneId`], the
/// metrics' labels) is looked up with `&(provider, key, model) as &dyn Names<3>` without
/// making the owned key (a report looks up every attempt's lane and key).
pub trait Names<const N: usize> {
    fn names(&self) -> [&str; N];
}

macro_rules! names_of_tuples {
    ($n:literal: $($i:tt),+) => {
        impl Names<$n> for ($(names_of_tuples!(@string $i),)+) {
            fn names(&self) -> [&str; $n] {
                [$(self.$i.as_str()),+]
            }
        }

        impl Names<$n> for ($(names_of_tuples!(@str $i),)+) {
            fn names(&self) -> [&str; $n] {
                [$(self.$i),+]
            }
        }

        impl<'a> std::borrow::Borrow<dyn Names<$n> + 'a> for ($(names_of_tuples!(@string $i),)+) {
            fn borrow(&self) -> &(dyn Names<$n> + 'a) {
                self
            }
        }
    };
    (@string $i:tt) => { String };
    (@str $i:tt) => { &str };
}

/// The entry of `names` in `map`, made by `new` (the owned key and its first value) when it is
/// not there: a lookup that copies the names only the first time. `None` only when `new`'s key
/// has other names.
pub fn entry_by_names<'m, K, V, const N: usize>(
    map: &'m mut BTreeMap<K, V>,
    names: &dyn Names<N>,
    new: impl FnOnce() -> (K, V),
) -> Option<&'m mut V>
where
    K: Ord + for<'a> std::borrow::Borrow<dyn Names<N> + 'a>,
{
    if !map.contains_key(names) {
        let (key, value) = new();
        map.insert(key, value);
    }
    map.get_mut(names)
}

/// An attempt's lane by borrowed names (a [`Names`] lookup).
pub fn lane_names(attempt: &pb::AttemptOutcome) -> (&str, &str, &str) {
    (&attempt.provider, &attempt.key, &attempt.model)
}

/// An attempt's lane, owned (a new entry's key).
pub fn lane_of(attempt: &pb::AttemptOutcome) -> LaneId {
    (
        attempt.provider.clone(),
        attempt.key.clone(),
        attempt.model.clone(),
    )
}

names_of_tuples!(2: 0, 1);
names_of_tuples!(3: 0, 1, 2);
names_of_tuples!(4: 0, 1, 2, 3);

// Ordered as the owned tuple is (field by field, as strings), which `Borrow` requires.
impl<const N: usize> PartialEq for dyn Names<N> + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl<const N: usize> Eq for dyn Names<N> + '_ {}

impl<const N: usize> PartialOrd for dyn Names<N> + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<const N: usize> Ord for dyn Names<N> + '_ {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.names().cmp(&other.names())
    }
}

/// The last rate-limit headroom a lane's provider reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneHeadroom {
    /// -1: not reported.
    pub remaining_requests: i64,
    /// -1: not reported.
    pub remaining_tokens: i64,
    /// When the window resets (ms since the epoch); the entry goes then.
    pub reset_at_ms: i64,
}

/// What survives a restart with a durable store, and what control planes sharing one store see.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DurableState {
    pub blacklists: BTreeMap<KeyId, Blacklist>,
    pub cooldowns: BTreeMap<LaneId, i64>,
    /// Every breaker that is not closed, or closed with failures counted.
    pub breakers: BTreeMap<BreakerId, Breaker>,
    pub headroom: BTreeMap<LaneId, LaneHeadroom>,
    /// Provider id -> spend this UTC day and month.
    pub spend: BTreeMap<String, Spend>,
    /// An operator's recent resets of a provider (key empty) or a key: when each was (ms since
    /// the epoch). Shared, so every control plane pushes it to its Envoys, whose workers drop
    /// the holds they put on before it, whichever control plane received the reset.
    pub resets: BTreeMap<KeyId, i64>,
}

/// The entries to write and to delete to turn one map into another.
#[derive(Debug, Clone, PartialEq)]
pub struct MapChanges<K, V> {
    pub upsert: Vec<(K, V)>,
    pub delete: Vec<K>,
}

impl<K, V> Default for MapChanges<K, V> {
    fn default() -> Self {
        Self {
            upsert: Vec::new(),
            delete: Vec::new(),
        }
    }
}

impl<K: Ord + Clone, V: PartialEq + Clone> MapChanges<K, V> {
    pub fn between(from: &BTreeMap<K, V>, to: &BTreeMap<K, V>) -> Self {
        let upsert = to
            .iter()
            .filter(|(k, v)| from.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let delete = from
            .keys()
            .filter(|k| !to.contains_key(*k))
            .cloned()
            .collect();
        Self { upsert, delete }
    }

    pub fn is_empty(&self) -> bool {
        self.upsert.is_empty() && self.delete.is_empty()
    }

    pub fn apply(&self, map: &mut BTreeMap<K, V>) {
        for k in &self.delete {
            map.remove(k);
        }
        for (k, v) in &self.upsert {
            map.insert(k.clone(), v.clone());
        }
    }
}

/// What a store must write to go from one [`DurableState`] to another.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DurableChanges {
    pub blacklists: MapChanges<KeyId, Blacklist>,
    pub cooldowns: MapChanges<LaneId, i64>,
    pub breakers: MapChanges<BreakerId, Breaker>,
    pub headroom: MapChanges<LaneId, LaneHeadroom>,
    pub spend: MapChanges<String, Spend>,
    pub resets: MapChanges<KeyId, i64>,
}

impl DurableChanges {
    pub fn between(from: &DurableState, to: &DurableState) -> Self {
        Self {
            blacklists: MapChanges::between(&from.blacklists, &to.blacklists),
            cooldowns: MapChanges::between(&from.cooldowns, &to.cooldowns),
            breakers: MapChanges::between(&from.breakers, &to.breakers),
            headroom: MapChanges::between(&from.headroom, &to.headroom),
            spend: MapChanges::between(&from.spend, &to.spend),
            resets: MapChanges::between(&from.resets, &to.resets),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.blacklists.is_empty()
            && self.cooldowns.is_empty()
            && self.breakers.is_empty()
            && self.headroom.is_empty()
            && self.spend.is_empty()
            && self.resets.is_empty()
    }

    pub fn apply(&self, state: &mut DurableState) {
        self.blacklists.apply(&mut state.blacklists);
        self.cooldowns.apply(&mut state.cooldowns);
        self.breakers.apply(&mut state.breakers);
        self.headroom.apply(&mut state.headroom);
        self.spend.apply(&mut state.spend);
        self.resets.apply(&mut state.resets);
    }
}

/// Three-way merge of one map: an entry another process changed (`remote` differs from `base`,
/// the last state both agreed on) is taken unless we changed it too (ours wins). Returns
/// whether `local` changed.
fn merge_map<K: Ord + Clone, V: PartialEq + Clone>(
    local: &mut BTreeMap<K, V>,
    base: &BTreeMap<K, V>,
    remote: &BTreeMap<K, V>,
) -> bool {
    let mut changed = false;
    let keys: std::collections::BTreeSet<&K> = base.keys().chain(remote.keys()).collect();
    for k in keys {
        let (b, r) = (base.get(k), remote.get(k));
        if b == r || local.get(k) != b || local.get(k) == r {
            continue;
        }
        match r {
            Some(v) => local.insert(k.clone(), v.clone()),
            None => local.remove(k),
        };
        changed = true;
    }
    changed
}

/// `merge_map` for every part; spend is added rather than replaced.
pub fn merge_durable(local: &mut DurableState, base: &DurableState, remote: &DurableState) -> bool {
    let mut changed = merge_map(&mut local.blacklists, &base.blacklists, &remote.blacklists);
    changed |= merge_map(&mut local.cooldowns, &base.cooldowns, &remote.cooldowns);
    changed |= merge_map(&mut local.breakers, &base.breakers, &remote.breakers);
    changed |= merge_map(&mut local.headroom, &base.headroom, &remote.headroom);
    changed |= merge_map(&mut local.resets, &base.resets, &remote.resets);
    for (provider, theirs) in &remote.spend {
        let old = base.spend.get(provider).copied().unwrap_or_default();
        if old == *theirs {
            continue;
        }
        let ours = local.spend.entry(provider.clone()).or_default();
        let before = *ours;
        ours.merge(&old, theirs);
        changed |= *ours != before;
    }
    changed
}

#[derive(Debug, thiserror::Error)]
#[error("state store: {0}")]
pub struct StoreError(pub String);

/// The answer to a probe lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseGrant {
    Granted,
    /// Someone else holds it until then (ms since the epoch).
    HeldUntil(i64),
}

/// Where durable state lives. Calls block: callers run them off the async executor.
pub trait StateStore: Send + Sync {
    fn load(&self) -> Result<DurableState, StoreError>;
    /// [`StateStore::load`] when `serve` starts: a store that does not answer is told from one
    /// that refused, so the start waits for the first (see `store::start_wait`).
    fn load_at_start(&self) -> Result<DurableState, crate::store::start_wait::OpenFailure> {
        self.load()
            .map_err(|e| crate::store::start_wait::OpenFailure::Refused(e.into()))
    }
    /// Writes the given entries and deletes the given keys, in one transaction.
    fn apply(&self, changes: &DurableChanges) -> Result<(), StoreError>;
    /// Makes the store hold exactly `state`.
    fn save(&self, state: &DurableState) -> Result<(), StoreError> {
        let current = self.load()?;
        self.apply(&DurableChanges::between(&current, state))
    }
    /// The half-open probe lease on `id`: granted to `holder` until `now_ms + ttl_ms` when
    /// nobody holds it (or the holder's lease ended), atomically across every process sharing
    /// the store.
    fn lease(
        &self,
        id: &BreakerId,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<LeaseGrant, StoreError>;
    /// Ends the lease on `id`: whoever holds it (`None`, the breaker moved on), or only when
    /// `holder` is the whole holder string (a probe's own outcome).
    fn release(&self, id: &BreakerId, holder: Option<&str>) -> Result<(), StoreError>;
    /// Grants up to `calls` of the virtual key `key_id`'s UTC `minute` under `limit` from a
    /// count every process sharing the store sees (`store::minute_calls`); `None` when this
    /// store shares no such count (or cannot now): the caller counts in its own memory.
    fn take_minute_calls(
        &self,
        _key_id: &str,
        _minute: i64,
        _calls: u64,
        _limit: u64,
    ) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }
    /// The shared tier of the response cache: the entry stored under `key` (the hex SHA-256 of
    /// a resolved request), `None` when there is none, the store shares no cache, or it does
    /// not answer now (a miss either way).
    fn cache_get(&self, _key: &str) -> Option<Vec<u8>> {
        None
    }
    /// Stores `entry` under `key` for `ttl_ms`; whether it was written.
    fn cache_put(&self, _key: &str, _entry: Vec<u8>, _ttl_ms: u64) -> bool {
        false
    }
    /// Registers the open `Watch` streams of control plane `plane` (`mine`, each already
    /// prefixed with `plane`), standing until `now_ms + ttl_ms` unless registered again, and
    /// answers every control plane's registered streams (`api::shares`). `None` when this store
    /// shares no membership (each control plane splits among its own).
    fn watchers(
        &self,
        _plane: &str,
        _mine: &[String],
        _now_ms: i64,
        _ttl_ms: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        Ok(None)
    }
}

/// A state with an entry in every table (the stores' round-trip tests).
#[cfg(test)]
pub(crate) fn sample_state() -> DurableState {
    let mut state = DurableState::default();
    state.blacklists.insert(
        ("p".into(), "k".into()),
        Blacklist {
            reason: BlacklistReason::Auth,
            until_ms: 0,
            refused_fingerprint: u64::MAX - 5,
            code: Some("invalid_api_key".into()),
        },
    );
    state
        .cooldowns
        .insert(("p".into(), "k:1".into(), "m/x".into()), 123);
    state.breakers.insert(
        (
            crate::store::breaker::BreakerScope::Provider,
            "p".into(),
            String::new(),
        ),
        Breaker {
            phase: crate::store::breaker::BreakerPhase::Open,
            failures: 3,
            open_until_ms: 99,
            cooldown_ms: 5_000,
        },
    );
    state.headroom.insert(
        ("p".into(), "k".into(), "m".into()),
        LaneHeadroom {
            remaining_requests: 4,
            remaining_tokens: -1,
            reset_at_ms: 1_000,
        },
    );
    state.spend.insert(
        "p".into(),
        Spend {
            day: 20_000,
            day_cost: 1.25,
            month: 24_000,
            month_cost: 9.5,
        },
    );
    state.resets.insert(("p".into(), String::new()), 4_000);
    state
}

#[cfg(test)]
mod names_tests {
    use std::collections::BTreeMap;

    use super::{KeyId, LaneId, Names};

    fn lane(p: &str, k: &str, m: &str) -> LaneId {
        (p.into(), k.into(), m.into())
    }

    /// A borrowed lookup finds what the owned key finds, across names whose concatenations
    /// collide and a prefix ordered before its extension.
    #[test]
    fn a_lane_or_key_looked_up_by_its_borrowed_names_is_the_owned_key_s_entry() {
        let lanes = [
            lane("a", "bc", "m"),
            lane("ab", "c", "m"),
            lane("a", "b", "cm"),
            lane("a", "b", "c"),
            lane("a", "b", ""),
            lane("", "ab", "c"),
        ];
        let map: BTreeMap<LaneId, usize> = lanes.iter().cloned().zip(0..).collect();
        for (i, l) in lanes.iter().enumerate() {
            let names = (l.0.as_str(), l.1.as_str(), l.2.as_str());
            assert_eq!(map.get(&names as &dyn Names<3>), Some(&i), "{l:?}");
        }
        for absent in [("a", "bcm", ""), ("abc", "", "m"), ("a", "b", "cm ")] {
            assert_eq!(map.get(&absent as &dyn Names<3>), None, "{absent:?}");
        }

        let keys: BTreeMap<KeyId, usize> = [("a", "bc"), ("ab", "c"), ("a", "")]
            .iter()
            .map(|(p, k)| (p.to_string(), k.to_string()))
            .zip(0..)
            .collect();
        assert_eq!(keys.get(&("ab", "c") as &dyn Names<2>), Some(&1));
        assert_eq!(keys.get(&("a", "") as &dyn Names<2>), Some(&2));
        assert_eq!(keys.get(&("abc", "") as &dyn Names<2>), None);
    }
}
