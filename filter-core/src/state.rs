//! The pushed state, decoded once per version and indexed for per-request lookups.

use ai_router_contract::defaults;
use ai_router_contract::failure::HoldWindows;
use std::collections::HashMap;
use std::rc::Rc;

use ai_router_proto::v1::{
    BreakerScope, BreakerState, Headroom, KeyHealth, Policy, Provider, ProviderKey, ProviderLanes,
    Resilience, Selection, Snapshot, VirtualKey,
};

/// Where a pool model is served: provider index and model index in the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelRef {
    pub provider: usize,
    pub model: usize,
}

/// The billing scope a key spends: its `scope`, else its alias (it is its own).
pub fn scope_of(key: &ProviderKey) -> &str {
    if key.scope.is_empty() {
        &key.alias
    } else {
        &key.scope
    }
}

/// What the pushed state says about some of one provider's lanes: its keys' blacklists,
/// cooldowns, breakers that are not closed, headroom, and the provider's own health. A
/// provider's lane health is one of these, or (a provider with many keys, in Envoy) one for the
/// provider as a whole and one per bucket of its keys ([`crate::vm::lane_records`]).
#[derive(Debug, Default, PartialEq)]
pub struct LaneParts {
    key_health: HashMap<String, KeyHealth>,
    /// key -> (model, cooled until); looked up by `&str`, no allocation per lane.
    cooldowns: HashMap<String, Vec<(String, i64)>>,
    /// key -> breaker.
    key_breakers: HashMap<String, BreakerState>,
    provider_breaker: Option<BreakerState>,
    /// billing scope (the key's alias when it has none) -> (model, headroom): the newest
    /// figure any key of the scope reported.
    headroom: HashMap<String, Vec<(String, Headroom)>>,
    /// Out until (a spent budget).
    out_until_ms: i64,
    /// key ("" for the whole provider) -> when an operator reset it.
    resets: HashMap<String, i64>,
}

impl LaneParts {
    pub fn new(record: ProviderLanes) -> Self {
        let mut h = LaneParts::default();
        for k in record.key_health {
            h.key_health.insert(k.key.clone(), k);
        }
        for c in record.cooldowns {
            let lanes = h.cooldowns.entry(c.key).or_default();
            match lanes.iter_mut().find(|(m, _)| *m == c.model) {
                Some((_, until)) => *until = (*until).max(c.until_ms),
                None => lanes.push((c.model, c.until_ms)),
            }
        }
        for b in record.breakers {
            if b.scope() == BreakerScope::Provider {
                h.provider_breaker = Some(b);
            } else {
                h.key_breakers.insert(b.key.clone(), b);
            }
        }
        for r in record.headroom {
            let owner = if r.scope.is_empty() { &r.key } else { &r.scope };
            let lanes = h.headroom.entry(owner.clone()).or_default();
            match lanes.iter_mut().find(|(m, _)| *m == r.model) {
                Some((_, old)) if old.as_of_ms > r.as_of_ms => {}
                Some((_, old)) => *old = r,
                None => lanes.push((r.model.clone(), r)),
            }
        }
        for p in record.provider_health {
            h.out_until_ms = h.out_until_ms.max(p.until_ms);
        }
        for r in record.resets {
            let at = h.resets.entry(r.key).or_insert(0);
            *at = (*at).max(r.at_ms);
        }
        h
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        <ProviderLanes as prost::Message>::decode(bytes)
            .ok()
            .map(Self::new)
    }
}

/// The bucket of a key alias or a billing scope (FNV-1a: the same on both sides, every build).
pub fn bucket_of(name: &str, count: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(count.max(1))) as u32
}

/// Loads one bucket of a provider's lane health (Envoy: from its shared-data record).
pub type LoadBucket = Rc<dyn Fn(u32) -> Rc<LaneParts>>;

/// What the pushed state says about one provider's lanes: its keys' blacklists, cooldowns,
/// breakers that are not closed, headroom, and the provider's own health. A worker reads it
/// from the provider's shared-data records when it picks among the provider's lanes; with many
/// keys it loads a bucket of keys only when a lookup names one of them, once per value.
#[derive(Default)]
pub struct LaneHealth {
    /// Everything (no buckets), or what concerns the provider as a whole.
    top: Rc<LaneParts>,
    /// The buckets of keys, each loaded on its first lookup; empty: `top` holds everything.
    buckets: Vec<std::cell::OnceCell<Rc<LaneParts>>>,
    load: Option<LoadBucket>,
}

impl std::fmt::Debug for LaneHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneHealth")
            .field("top", &self.top)
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

/// Equal when laid out alike and their parts are equal (every bucket loaded).
impl PartialEq for LaneHealth {
    fn eq(&self, other: &Self) -> bool {
        self.top == other.top && self.buckets.len() == other.buckets.len() && {
            (0..self.buckets.len()).all(|b| self.bucket(b) == other.bucket(b))
        }
    }
}

impl LaneHealth {
    pub fn new(record: ProviderLanes) -> Self {
        Self::whole(Rc::new(LaneParts::new(record)))
    }

    /// One record says everything.
    pub fn whole(parts: Rc<LaneParts>) -> Self {
        LaneHealth {
            top: parts,
            ..LaneHealth::default()
        }
    }

    /// What concerns the provider as a whole, and `count` buckets of keys `load` reads on
    /// first use ([`bucket_of`] says which bucket holds a name).
    pub fn bucketed(top: Rc<LaneParts>, count: u32, load: LoadBucket) -> Self {
        LaneHealth {
            top,
            buckets: (0..count).map(|_| std::cell::OnceCell::new()).collect(),
            load: Some(load),
        }
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        LaneParts::decode(bytes).map(|p| Self::whole(Rc::new(p)))
    }

    fn bucket(&self, b: usize) -> &LaneParts {
        match self.buckets.get(b) {
            Some(cell) => cell.get_or_init(|| match &self.load {
                Some(load) => load(b as u32),
                None => Rc::default(),
            }),
            None => &self.top,
        }
    }

    /// The part that holds what is said of a key or a billing scope.
    fn part(&self, name: &str) -> &LaneParts {
        if self.buckets.is_empty() {
            return &self.top;
        }
        let count = self.buckets.len() as u32;
        self.bucket(bucket_of(name, count) as usize)
    }

    /// Every part, each bucket loaded (the operator's view, not a request's).
    fn parts(&self) -> impl Iterator<Item = &LaneParts> {
        std::iter::once(&*self.top).chain((0..self.buckets.len()).map(|b| self.bucket(b)))
    }

    pub fn key_health(&self, key: &str) -> Option<&KeyHealth> {
        self.part(key).key_health.get(key)
    }

    pub fn cooldown_until(&self, key: &str, model: &str) -> i64 {
        self.part(key)
            .cooldowns
            .get(key)
            .and_then(|lanes| lanes.iter().find(|(m, _)| m == model))
            .map_or(0, |(_, until)| *until)
    }

    /// The key's breaker or the provider's (`key` empty), when it is not closed.
    pub fn breaker(&self, scope: BreakerScope, key: &str) -> Option<&BreakerState> {
        match scope {
            BreakerScope::Provider => self.top.provider_breaker.as_ref(),
            _ => self.part(key).key_breakers.get(key),
        }
    }

    /// The headroom of a billing scope (a key's [`scope_of`]) on a model.
    pub fn headroom(&self, scope: &str, model: &str) -> Option<&Headroom> {
        self.part(scope)
            .headroom
            .get(scope)
            .and_then(|lanes| lanes.iter().find(|(m, _)| m == model))
            .map(|(_, h)| h)
    }

    /// When the provider, out of rotation as a whole (a spent budget), returns.
    pub fn out_until_ms(&self) -> i64 {
        self.top.out_until_ms
    }

    /// When an operator last reset this key or its whole provider (0: not lately): holds
    /// Envoy's workers put on it before then are void.
    pub fn reset_at_ms(&self, key: &str) -> i64 {
        let of = |p: &LaneParts, k: &str| p.resets.get(k).copied().unwrap_or(0);
        of(self.part(key), key).max(of(&self.top, ""))
    }

    /// Every breaker of the provider and its keys that is not closed.
    pub fn breakers(&self) -> impl Iterator<Item = &BreakerState> {
        self.top
            .provider_breaker
            .iter()
            .chain(self.parts().flat_map(|p| p.key_breakers.values()))
    }

    /// Every key of the provider that is out (blacklisted or missing).
    pub fn keys_out(&self) -> impl Iterator<Item = &KeyHealth> {
        self.parts().flat_map(|p| p.key_health.values())
    }
}

/// The one place the filter meets a setting the control plane did not send: the control plane
/// resolves every default (`contract::defaults`) and refuses a configured 0 for these fields,
/// so a missing message, or a 0 (proto3's "not sent"), is its bug; the filter then uses the
/// contract's default, here, once per snapshot. Every reader takes the settings as given.
fn settle_unsent(snapshot: &mut Snapshot) {
    let s = snapshot.selection.get_or_insert_with(|| Selection {
        latency_slack_ms: defaults::LATENCY_SLACK_MS,
        low_headroom: defaults::LOW_HEADROOM,
        score_alpha: defaults::SCORE_ALPHA,
        score_beta: defaults::SCORE_BETA,
        score_gamma: defaults::SCORE_GAMMA,
        affinity_idle_ms: defaults::AFFINITY_IDLE_MS,
        ..Selection::default()
    });
    if s.latency_tolerance <= 0.0 {
        s.latency_tolerance = defaults::LATENCY_TOLERANCE;
    }
    if s.ewma_alpha <= 0.0 || s.ewma_alpha > 1.0 {
        s.ewma_alpha = defaults::EWMA_ALPHA;
    }
    if s.unreported_weight <= 0.0 {
        s.unreported_weight = defaults::UNREPORTED_WEIGHT;
    }
    let r = snapshot.resilience.get_or_insert_with(Resilience::default);
    let b = r.backoff.get_or_insert_with(Default::default);
    if b.base_ms == 0 {
        b.base_ms = defaults::BACKOFF_BASE_MS;
    }
    if b.factor <= 0.0 {
        b.factor = defaults::BACKOFF_FACTOR;
    }
    if b.max_ms == 0 {
        b.max_ms = defaults::BACKOFF_MAX_MS;
    }
    let limits = snapshot.limits.get_or_insert_with(Default::default);
    if limits.max_body_bytes == 0 {
        limits.max_body_bytes = defaults::MAX_BODY_BYTES;
    }
    // The policy every profile is merged over: with these set, every merged policy has them.
    let policy = snapshot.defaults.get_or_insert_with(Default::default);
    policy
        .allow_fallback
        .get_or_insert(defaults::ALLOW_FALLBACK);
    let unsent = |n: &mut Option<u64>, default| {
        if n.is_none_or(|n| n == 0) {
            *n = Some(default);
        }
    };
    unsent(&mut policy.timeout_ms, defaults::TIMEOUT_MS);
    unsent(&mut policy.deadline_ms, defaults::DEADLINE_MS);
    if policy.max_attempts.is_none_or(|n| n == 0) {
        policy.max_attempts = Some(defaults::MAX_ATTEMPTS);
    }
    for p in &mut snapshot.providers {
        if p.default_max_tokens == 0 {
            p.default_max_tokens = defaults::DEFAULT_MAX_TOKENS;
        }
    }
}

/// The pushed state a worker decides from. In Envoy it is the pool record alone (settings and
/// providers); virtual keys and lane health are records of their own, read per request. Built
/// from a whole snapshot (tests, tools) it also answers for those.
#[derive(Debug, Default)]
pub struct State {
    pub version: u64,
    pub snapshot: Snapshot,
    vkeys: HashMap<String, usize>,
    providers: HashMap<String, usize>,
    /// Model ids and aliases -> every (provider, model) serving the name.
    names: HashMap<String, Vec<ModelRef>>,
    /// The lane health a whole snapshot carried, per provider.
    health: HashMap<String, Rc<LaneHealth>>,
}

impl State {
    pub fn new(version: u64, mut snapshot: Snapshot) -> Self {
        settle_unsent(&mut snapshot);
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
                // A family answers to `family:<name>` (families.rs).
                let family =
                    (!m.family.is_empty()).then(|| crate::vocab::family::name_of(&m.family));
                for name in std::iter::once(&m.id)
                    .chain(m.aliases.iter())
                    .chain(family.as_ref())
                {
                    let entry = state.names.entry(name.clone()).or_default();
                    if !entry.contains(&r) {
                        entry.push(r);
                    }
                }
            }
        }
        let mut records: HashMap<String, ProviderLanes> = HashMap::new();
        fn record<'r>(
            records: &'r mut HashMap<String, ProviderLanes>,
            p: &str,
        ) -> &'r mut ProviderLanes {
            records.entry(p.to_string()).or_default()
        }
        for h in &snapshot.key_health {
            record(&mut records, &h.provider).key_health.push(h.clone());
        }
        for c in &snapshot.cooldowns {
            record(&mut records, &c.provider).cooldowns.push(c.clone());
        }
        for b in &snapshot.breakers {
            record(&mut records, &b.provider).breakers.push(b.clone());
        }
        for h in &snapshot.headroom {
            record(&mut records, &h.provider).headroom.push(h.clone());
        }
        for p in &snapshot.provider_health {
            record(&mut records, &p.provider)
                .provider_health
                .push(p.clone());
        }
        for r in &snapshot.resets {
            record(&mut records, &r.provider).resets.push(r.clone());
        }
        state.health = records
            .into_iter()
            .map(|(p, r)| (p, Rc::new(LaneHealth::new(r))))
            .collect();
        state.snapshot = snapshot;
        state
    }

    /// The lane health of `provider` this state carries (a whole snapshot's; none in Envoy,
    /// where it is a record of its own).
    pub fn health(&self, provider: &str) -> Option<Rc<LaneHealth>> {
        self.health.get(provider).cloned()
    }

    pub fn resilience(&self) -> Resilience {
        self.snapshot.resilience.unwrap_or_default()
    }

    /// The pushed resilience settings as the control plane resolved them (`settle_unsent`);
    /// with no state yet, the contract's defaults.
    pub fn resilience_or_defaults(state: Option<&State>) -> Resilience {
        let mut r = state.map_or_else(
            || {
                let mut none = Snapshot::default();
                settle_unsent(&mut none);
                none.resilience.unwrap_or_default()
            },
            State::resilience,
        );
        let windows = Self::hold_windows(state);
        r.rate_limit_cooldown_ms = windows.rate_limit_cooldown_ms;
        r.quota_blacklist_ms = windows.quota_blacklist_ms;
        r
    }

    /// How long the failures' holds last, as the control plane computes them
    /// ([`HoldWindows::held_until`]).
    pub fn hold_windows(state: Option<&State>) -> HoldWindows {
        let r = state.map(State::resilience).unwrap_or_default();
        HoldWindows::from_pushed(
            r.rate_limit_cooldown_ms,
            r.quota_blacklist_ms,
            r.auth_disable_ms,
        )
    }

    /// The pushed selection settings, as given (`settle_unsent`).
    pub fn selection(&self) -> Selection {
        self.snapshot.selection.clone().unwrap_or_default()
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

    /// `gateway.maxBodyBytes`, as given (`settle_unsent`).
    pub fn max_body_bytes(&self) -> u64 {
        self.snapshot
            .limits
            .as_ref()
            .map_or(0, |l| l.max_body_bytes)
    }

    /// Whether providers' rate-limit headers reach clients (`gateway.forwardRateLimitHeaders`).
    pub fn forward_rate_limit_headers(&self) -> bool {
        self.snapshot
            .limits
            .as_ref()
            .is_some_and(|l| l.forward_rate_limit_headers)
    }

    /// Whether attempt reports carry the request and the answer (`telemetry.includeContent`).
    pub fn include_content(&self) -> bool {
        self.snapshot
            .limits
            .as_ref()
            .is_some_and(|l| l.include_content)
    }

    /// Every name a caller may use: profiles, model ids and aliases.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.snapshot.profiles.keys().chain(self.names.keys())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::headroom::any_usable_key;
    use ai_router_proto::v1::{KeyHealth, ProviderKey};

    /// A snapshot without selection settings selects by the contract's defaults, not numbers of
    /// the filter's own.
    #[test]
    fn missing_selection_settings_are_the_contracts_defaults() {
        let expected = (
            defaults::LATENCY_TOLERANCE,
            defaults::LATENCY_SLACK_MS,
            defaults::EWMA_ALPHA,
            defaults::LOW_HEADROOM,
            defaults::UNREPORTED_WEIGHT,
            defaults::AFFINITY_IDLE_MS,
        );
        let fields = |s: Selection| {
            (
                s.latency_tolerance,
                s.latency_slack_ms,
                s.ewma_alpha,
                s.low_headroom,
                s.unreported_weight,
                s.affinity_idle_ms,
            )
        };
        let none = State::new(1, Snapshot::default()).selection();
        assert_eq!(fields(none), expected);
        let unset = State::new(
            1,
            Snapshot {
                selection: Some(Selection {
                    latency_slack_ms: defaults::LATENCY_SLACK_MS,
                    low_headroom: defaults::LOW_HEADROOM,
                    unreported_weight: defaults::UNREPORTED_WEIGHT,
                    affinity_idle_ms: defaults::AFFINITY_IDLE_MS,
                    ..Selection::default()
                }),
                ..Snapshot::default()
            },
        );
        assert_eq!(fields(unset.selection()), expected);
    }

    /// Unsent settings are settled once, at decode: the readers see the contract's values in
    /// the snapshot itself, and a sent value as given.
    #[test]
    fn unsent_settings_are_settled_once_and_sent_ones_kept() {
        let none = State::new(1, Snapshot::default());
        let r = none.resilience();
        let b = r.backoff.unwrap_or_default();
        assert_eq!(
            (b.base_ms, b.factor, b.max_ms),
            (
                defaults::BACKOFF_BASE_MS,
                defaults::BACKOFF_FACTOR,
                defaults::BACKOFF_MAX_MS
            )
        );
        assert_eq!(none.max_body_bytes(), defaults::MAX_BODY_BYTES);
        assert_eq!(
            none.snapshot
                .selection
                .as_ref()
                .map(|s| s.unreported_weight),
            Some(defaults::UNREPORTED_WEIGHT)
        );
        assert_eq!(
            State::resilience_or_defaults(None).backoff,
            State::resilience_or_defaults(Some(&none)).backoff
        );
        let sent = State::new(
            2,
            Snapshot {
                limits: Some(ai_router_proto::v1::Limits {
                    max_body_bytes: 10,
                    ..Default::default()
                }),
                selection: Some(Selection {
                    latency_tolerance: 3.0,
                    unreported_weight: 0.5,
                    ..Selection::default()
                }),
                ..Snapshot::default()
            },
        );
        assert_eq!(sent.max_body_bytes(), 10);
        assert_eq!(sent.selection().latency_tolerance, 3.0);
        assert_eq!(sent.selection().unreported_weight, 0.5);
    }

    #[test]
    fn usable_keys() {
        let key = |alias: &str, secret: &str| ProviderKey {
            alias: alias.into(),
            secret: secret.into(),
            fingerprint: 7,
            ..Default::default()
        };
        let mut snap = Snapshot::default();
        snap.providers.push(Provider {
            id: "p".into(),
            keys: vec![key("a", ""), key("b", "sk")],
            ..Default::default()
        });
        assert!(any_usable_key(
            &State::new(1, snap.clone()),
            &crate::vm::view::NoView,
            0
        ));
        snap.key_health.push(KeyHealth {
            provider: "p".into(),
            key: "b".into(),
            reason: ai_router_proto::v1::KeyOutReason::Auth.into(),
            until_ms: 0,
            refused_fingerprint: 7,
        });
        assert!(!any_usable_key(
            &State::new(2, snap.clone()),
            &crate::vm::view::NoView,
            0
        ));
        // A new secret (another fingerprint) lifts it.
        snap.key_health[0].refused_fingerprint = 8;
        assert!(any_usable_key(
            &State::new(3, snap),
            &crate::vm::view::NoView,
            0
        ));
    }
}
