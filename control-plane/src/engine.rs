//! The state authority: what the data plane decides from.
//!
//! The engine holds the resolved pool (providers and their current secrets), the virtual keys
//! and the health state (blacklisted keys, lane cooldowns), and publishes all of it as one
//! versioned [`pb::StateUpdate`] on a `tokio::sync::watch` channel; every change bumps the
//! version. Three things change it:
//! - [`Engine::apply_report`]: attempt outcomes from the filters (docs/architecture.md, Sync);
//! - [`Engine::refresh_secrets`]: every reference is resolved again (about once a second), a
//!   changed secret replaces the pushed one and lifts a blacklist whose refused fingerprint
//!   differs;
//! - [`Engine::expire`]: cooldowns and timed blacklists past their end.
//!
//! Durable state (blacklists, cooldowns; later breakers) goes through [`StateStore`]; the
//! in-memory store is the default, and a persister task writes each change off the executor.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ai_router_proto::v1 as pb;
use tokio::sync::watch;

use crate::config::{Config, PolicyConfig, Provider};
use crate::secrets::{Env, Secret};
use crate::vkeys::VirtualKeyRecord;

/// How often secret references are resolved again.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Milliseconds since the Unix epoch; injectable so the tests control time.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> i64;
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// Why a key is out of rotation (stored); `missing` is derived from the secret itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BlacklistReason {
    Auth,
    Quota,
}

impl BlacklistReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::Quota => "quota",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auth" => Some(Self::Auth),
            "quota" => Some(Self::Quota),
            _ => None,
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

/// What survives a restart with a durable store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DurableState {
    pub blacklists: BTreeMap<KeyId, Blacklist>,
    pub cooldowns: BTreeMap<LaneId, i64>,
}

#[derive(Debug, thiserror::Error)]
#[error("state store: {0}")]
pub struct StoreError(pub String);

/// Where durable state lives. Calls block: callers run them off the async executor.
pub trait StateStore: Send + Sync {
    fn load(&self) -> Result<DurableState, StoreError>;
    fn save(&self, state: &DurableState) -> Result<(), StoreError>;
}

/// Keeps the last saved state in memory: gone on restart.
#[derive(Debug, Default)]
pub struct MemoryStateStore {
    state: Mutex<DurableState>,
}

impl StateStore for MemoryStateStore {
    fn load(&self) -> Result<DurableState, StoreError> {
        Ok(lock(&self.state).clone())
    }

    fn save(&self, state: &DurableState) -> Result<(), StoreError> {
        *lock(&self.state) = state.clone();
        Ok(())
    }
}

/// Something worth telling an operator about. Names keys by provider and alias only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    KeyDisabled {
        provider: String,
        key: String,
        reason: &'static str,
        until_ms: i64,
        code: Option<String>,
    },
    KeyRestored {
        provider: String,
        key: String,
        was: &'static str,
        reason: &'static str,
    },
}

impl EngineEvent {
    fn log(&self) {
        match self {
            Self::KeyDisabled {
                provider,
                key,
                reason,
                until_ms,
                code,
            } => tracing::warn!(
                event = "key-disabled",
                provider = %provider,
                key = %key,
                reason = %reason,
                until_ms = *until_ms,
                code = code.as_deref().unwrap_or(""),
                "key disabled"
            ),
            Self::KeyRestored {
                provider,
                key,
                was,
                reason,
            } => tracing::info!(
                event = "key-restored",
                provider = %provider,
                key = %key,
                was = %was,
                reason = %reason,
                "key restored"
            ),
        }
    }
}

/// `{"status":"ok"|"degraded","version":N}`
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    pub status: &'static str,
    pub version: u64,
}

struct State {
    version: u64,
    /// Current secret of every key, `None` when its reference resolves to nothing.
    secrets: BTreeMap<KeyId, Option<Secret>>,
    durable: DurableState,
    virtual_keys: Vec<VirtualKeyRecord>,
}

pub struct Engine {
    config: Arc<Config>,
    env: Arc<dyn Env>,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    updates: watch::Sender<Arc<pb::StateUpdate>>,
    /// See [`ReportObserver`].
    report_observers: Mutex<Vec<Arc<dyn ReportObserver>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("version", &self.version())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the state half-written in a way that matters
    // more than stopping the control plane would.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Engine {
    /// Resolves every key, takes over `durable` (dropping entries for keys the pool no longer
    /// has and lifting blacklists whose secret changed meanwhile) and publishes the first
    /// snapshot.
    pub fn new(
        config: Arc<Config>,
        env: Arc<dyn Env>,
        clock: Arc<dyn Clock>,
        virtual_keys: Vec<VirtualKeyRecord>,
        durable: DurableState,
    ) -> Arc<Self> {
        let mut secrets = BTreeMap::new();
        for provider in &config.providers {
            for key in &provider.keys {
                secrets.insert(
                    (provider.id.clone(), key.alias.clone()),
                    key.source.resolve(env.as_ref()),
                );
            }
        }
        let mut kept = DurableState::default();
        for (id, entry) in durable.blacklists {
            let Some(current) = secrets.get(&id) else {
                continue;
            };
            let changed = current.as_ref().is_some_and(|s| {
                entry.refused_fingerprint != 0 && s.fingerprint() != entry.refused_fingerprint
            });
            if changed {
                EngineEvent::KeyRestored {
                    provider: id.0.clone(),
                    key: id.1.clone(),
                    was: entry.reason.as_str(),
                    reason: "secret_changed",
                }
                .log();
            } else {
                kept.blacklists.insert(id, entry);
            }
        }
        kept.cooldowns = durable
            .cooldowns
            .into_iter()
            .filter(|((p, k, _), _)| secrets.contains_key(&(p.clone(), k.clone())))
            .collect();
        // Versions start at the wall clock so they keep increasing across restarts.
        let version = u64::try_from(clock.now_ms()).unwrap_or(0).max(1);
        let state = State {
            version,
            secrets,
            durable: kept,
            virtual_keys,
        };
        let first = Arc::new(build_update(&config, &state, clock.now_ms()));
        let (updates, _) = watch::channel(first);
        let engine = Arc::new(Self {
            config,
            env,
            clock,
            state: Mutex::new(state),
            updates,
            report_observers: Mutex::default(),
        });
        engine.expire();
        engine
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The current snapshot and every later one.
    pub fn subscribe(&self) -> watch::Receiver<Arc<pb::StateUpdate>> {
        self.updates.subscribe()
    }

    pub fn current(&self) -> Arc<pb::StateUpdate> {
        self.updates.borrow().clone()
    }

    pub fn version(&self) -> u64 {
        lock(&self.state).version
    }

    pub fn durable(&self) -> DurableState {
        lock(&self.state).durable.clone()
    }

    /// `ok` while some provider has a key with a secret that is not blacklisted.
    pub fn health(&self) -> Health {
        let state = lock(&self.state);
        let usable = state
            .secrets
            .iter()
            .any(|(id, secret)| secret.is_some() && !state.durable.blacklists.contains_key(id));
        Health {
            status: if usable { "ok" } else { "degraded" },
            version: state.version,
        }
    }

    /// Applies a batch of outcomes; returns the version after it.
    pub fn apply_report(&self, batch: &pb::ReportBatch) -> (u64, Vec<EngineEvent>) {
        self.observe_report(batch);
        let now = self.clock.now_ms();
        let resilience = &self.config.resilience;
        let mut state = lock(&self.state);
        let mut events = Vec::new();
        let mut changed = false;
        for attempt in &batch.attempts {
            if attempt.outcome != "error" {
                continue;
            }
            let id: KeyId = (attempt.provider.clone(), attempt.key.clone());
            let Some(current) = state.secrets.get(&id) else {
                tracing::debug!(provider = %id.0, key = %id.1, "report for an unknown key");
                continue;
            };
            let current_fp = current.as_ref().map_or(0, Secret::fingerprint);
            let retry_at = (attempt.retry_at_ms > now).then_some(attempt.retry_at_ms);
            match attempt.error_class.as_str() {
                "rate_limit" => {
                    let until = retry_at
                        .unwrap_or(now.saturating_add(ms(resilience.rate_limit_cooldown_ms)));
                    let lane = (id.0, id.1, attempt.model.clone());
                    let entry = state.durable.cooldowns.entry(lane).or_insert(0);
                    if until > *entry {
                        *entry = until;
                        changed = true;
                    }
                }
                class @ ("auth" | "quota") => {
                    let refused = if attempt.fingerprint != 0 {
                        attempt.fingerprint
                    } else {
                        current_fp
                    };
                    if current_fp != 0 && refused != current_fp {
                        // The secret was replaced after this attempt used it: the refusal is
                        // about the old one.
                        continue;
                    }
                    let (reason, until) = if class == "auth" {
                        let until = resilience
                            .auth_disable_ms
                            .map_or(0, |d| now.saturating_add(ms(d)));
                        (BlacklistReason::Auth, until)
                    } else {
                        let until = retry_at
                            .unwrap_or(now.saturating_add(ms(resilience.quota_blacklist_ms)));
                        (BlacklistReason::Quota, until)
                    };
                    let code =
                        (!attempt.provider_code.is_empty()).then(|| attempt.provider_code.clone());
                    let entry = Blacklist {
                        reason,
                        until_ms: until,
                        refused_fingerprint: refused,
                        code: code.clone(),
                    };
                    let same = state.durable.blacklists.get(&id).is_some_and(|old| {
                        old.reason == reason
                            && old.refused_fingerprint == refused
                            && (old.until_ms == 0 || (until != 0 && old.until_ms >= until))
                    });
                    if !same {
                        events.push(EngineEvent::KeyDisabled {
                            provider: id.0.clone(),
                            key: id.1.clone(),
                            reason: reason.as_str(),
                            until_ms: until,
                            code,
                        });
                        state.durable.blacklists.insert(id, entry);
                        changed = true;
                    }
                }
                // Transient failures feed the breakers (a later issue); invalid requests and
                // cancellations change nothing.
                _ => {}
            }
        }
        for event in &events {
            event.log();
        }
        if changed {
            self.publish(&mut state, now);
        }
        (state.version, events)
    }

    /// Resolves every key reference again; a changed secret is pushed and lifts a blacklist
    /// whose refused fingerprint differs.
    pub fn refresh_secrets(&self) -> Vec<EngineEvent> {
        let now = self.clock.now_ms();
        let mut resolved = Vec::new();
        for provider in &self.config.providers {
            for key in &provider.keys {
                resolved.push((
                    (provider.id.clone(), key.alias.clone()),
                    key.source.resolve(self.env.as_ref()),
                ));
            }
        }
        let mut state = lock(&self.state);
        let mut events = Vec::new();
        let mut changed = false;
        for (id, new) in resolved {
            let old = state.secrets.get(&id).cloned().flatten();
            if old == new {
                continue;
            }
            changed = true;
            match &new {
                None => events.push(EngineEvent::KeyDisabled {
                    provider: id.0.clone(),
                    key: id.1.clone(),
                    reason: "missing",
                    until_ms: 0,
                    code: None,
                }),
                Some(secret) => {
                    let fp = secret.fingerprint();
                    let lifted = match state.durable.blacklists.get(&id) {
                        Some(entry) if entry.refused_fingerprint != fp => {
                            Some(entry.reason.as_str())
                        }
                        Some(_) => None,
                        None if old.is_none() => Some("missing"),
                        None => None,
                    };
                    if let Some(was) = lifted {
                        state.durable.blacklists.remove(&id);
                        events.push(EngineEvent::KeyRestored {
                            provider: id.0.clone(),
                            key: id.1.clone(),
                            was,
                            reason: "secret_changed",
                        });
                    }
                }
            }
            state.secrets.insert(id, new);
        }
        for event in &events {
            event.log();
        }
        if changed {
            self.publish(&mut state, now);
        }
        events
    }

    /// Drops cooldowns and timed blacklists that have ended; returns whether anything did.
    pub fn expire(&self) -> bool {
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let before = (
            state.durable.blacklists.len(),
            state.durable.cooldowns.len(),
        );
        state
            .durable
            .blacklists
            .retain(|_, b| b.until_ms == 0 || b.until_ms > now);
        state.durable.cooldowns.retain(|_, until| *until > now);
        let changed = before
            != (
                state.durable.blacklists.len(),
                state.durable.cooldowns.len(),
            );
        if changed {
            self.publish(&mut state, now);
        }
        changed
    }

    /// Refreshes secrets and expires entries every [`REFRESH_INTERVAL`] until `shutdown` flips.
    pub async fn run_refresh(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(REFRESH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    // File reads are blocking; they are small and local, but keep them off
                    // the executor threads anyway.
                    let engine = self.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        engine.refresh_secrets();
                        engine.expire();
                    })
                    .await;
                }
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
    }

    /// Writes the durable state to `store` whenever it changes, until `shutdown` flips.
    pub async fn run_persist(
        self: Arc<Self>,
        store: Arc<dyn StateStore>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut updates = self.subscribe();
        let mut saved = self.durable();
        loop {
            tokio::select! {
                changed = updates.changed() => if changed.is_err() { break },
                _ = shutdown.changed() => break,
            }
            let now = self.durable();
            if now == saved {
                continue;
            }
            let store = store.clone();
            let to_save = now.clone();
            match tokio::task::spawn_blocking(move || store.save(&to_save)).await {
                Ok(Ok(())) => saved = now,
                Ok(Err(err)) => tracing::error!(%err, "cannot save the state"),
                Err(err) => tracing::error!(%err, "state save task failed"),
            }
        }
    }

    fn publish(&self, state: &mut State, now: i64) {
        state.version += 1;
        let update = Arc::new(build_update(&self.config, state, now));
        self.updates.send_replace(update);
    }
}

// ---------------------------------------------------------------------------------------------
// Virtual keys from the key store, and report observers (usage accounting): see
// `crate::keystore` and `crate::usage`.
// ---------------------------------------------------------------------------------------------

/// Sees every report batch [`Engine::apply_report`] receives (usage accounting). Must not
/// block: it runs on the report path.
pub trait ReportObserver: Send + Sync {
    fn observe(&self, batch: &pb::ReportBatch);
}

impl Engine {
    /// Replaces the snapshot's virtual keys (mounted and stored); publishes a new version when
    /// they changed. Returns whether they did.
    pub fn set_virtual_keys(&self, keys: Vec<VirtualKeyRecord>) -> bool {
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        if state.virtual_keys == keys {
            return false;
        }
        state.virtual_keys = keys;
        self.publish(&mut state, now);
        true
    }

    /// Adds an observer of every later report batch.
    pub fn add_report_observer(&self, observer: Arc<dyn ReportObserver>) {
        lock(&self.report_observers).push(observer);
    }

    fn observe_report(&self, batch: &pb::ReportBatch) {
        let observers = lock(&self.report_observers).clone();
        for observer in observers {
            observer.observe(batch);
        }
    }
}

fn ms(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn build_update(config: &Config, state: &State, now: i64) -> pb::StateUpdate {
    let providers = config
        .providers
        .iter()
        .map(|p| provider_to_proto(p, &state.secrets))
        .collect();
    let mut key_health = Vec::new();
    for ((provider, key), secret) in &state.secrets {
        let id = (provider.clone(), key.clone());
        if secret.is_none() {
            key_health.push(pb::KeyHealth {
                provider: provider.clone(),
                key: key.clone(),
                reason: "missing".to_owned(),
                until_ms: 0,
                refused_fingerprint: 0,
            });
        } else if let Some(entry) = state.durable.blacklists.get(&id) {
            key_health.push(pb::KeyHealth {
                provider: provider.clone(),
                key: key.clone(),
                reason: entry.reason.as_str().to_owned(),
                until_ms: entry.until_ms,
                refused_fingerprint: entry.refused_fingerprint,
            });
        }
    }
    let cooldowns = state
        .durable
        .cooldowns
        .iter()
        .map(|((provider, key, model), until)| pb::LaneCooldown {
            provider: provider.clone(),
            key: key.clone(),
            model: model.clone(),
            until_ms: *until,
        })
        .collect();
    let snapshot = pb::Snapshot {
        providers,
        virtual_keys: state
            .virtual_keys
            .iter()
            .map(VirtualKeyRecord::to_proto)
            .collect(),
        defaults: config.defaults.as_ref().map(policy_to_proto),
        profiles: config
            .profiles
            .iter()
            .map(|(name, p)| (name.clone(), policy_to_proto(p)))
            .collect(),
        key_health,
        cooldowns,
        limits: Some(pb::Limits {
            max_body_bytes: config.gateway.max_body_bytes,
        }),
        generated_at_ms: now,
        breakers: Vec::new(),
        resilience: Some(pb::Resilience {
            backoff: Some(pb::BackoffSettings {
                base_ms: config.resilience.backoff.base_ms,
                factor: config.resilience.backoff.factor,
                max_ms: config.resilience.backoff.max_ms,
            }),
            rate_limit_cooldown_ms: config.resilience.rate_limit_cooldown_ms,
            quota_blacklist_ms: config.resilience.quota_blacklist_ms,
            auth_disable_ms: config.resilience.auth_disable_ms.unwrap_or(0),
        }),
        selection: Some(pb::Selection {
            latency_tolerance: config.selection.latency_tolerance,
            latency_slack_ms: config.selection.latency_slack_ms,
            ewma_alpha: config.selection.ewma_alpha,
            low_headroom: config.selection.low_headroom,
        }),
        headroom: Vec::new(),
        provider_health: Vec::new(),
    };
    pb::StateUpdate {
        version: state.version,
        snapshot: Some(snapshot),
    }
}

fn provider_to_proto(p: &Provider, secrets: &BTreeMap<KeyId, Option<Secret>>) -> pb::Provider {
    pb::Provider {
        id: p.id.clone(),
        kind: p.kind.as_str().to_owned(),
        scheme: p.endpoint.scheme.clone(),
        authority: p.endpoint.authority.clone(),
        base_path: p.endpoint.base_path.clone(),
        auth_header: p.kind.auth_header().to_owned(),
        headers: p
            .headers
            .iter()
            .map(|(name, value)| pb::Header {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        weight: p.weight,
        max_concurrency: p.max_concurrency.unwrap_or(0),
        default_max_tokens: p.default_max_tokens,
        keys: p
            .keys
            .iter()
            .map(|k| {
                let secret = secrets
                    .get(&(p.id.clone(), k.alias.clone()))
                    .cloned()
                    .flatten();
                pb::ProviderKey {
                    alias: k.alias.clone(),
                    fingerprint: secret.as_ref().map_or(0, Secret::fingerprint),
                    secret: secret.map(|s| s.expose().to_owned()).unwrap_or_default(),
                    weight: k.weight,
                    max_concurrency: k.max_concurrency.unwrap_or(0),
                }
            })
            .collect(),
        models: p
            .models
            .iter()
            .map(|m| pb::Model {
                id: m.id.clone(),
                aliases: m.aliases.clone(),
                context_window: m.context_window.unwrap_or(0),
                cost: m.cost.map(|c| pb::Cost {
                    input: c.input,
                    output: c.output,
                }),
                capabilities: m
                    .capabilities()
                    .iter()
                    .map(|c| c.as_str().to_owned())
                    .collect(),
                weight: m.weight.unwrap_or(1.0),
                identity: m.identity().to_owned(),
                dimensions: m.dimensions.unwrap_or(0),
            })
            .collect(),
    }
}

pub fn policy_to_proto(p: &PolicyConfig) -> pb::Policy {
    pb::Policy {
        model: p.model.clone(),
        fallbacks: p.fallbacks.clone().unwrap_or_default(),
        allow_fallback: p.allow_fallback,
        max_attempts: p.max_attempts,
        timeout_ms: p.timeout_ms,
        deadline_ms: p.deadline_ms,
        max_cost: p.budget.and_then(|b| b.max_cost),
        providers: p.providers.clone().unwrap_or_default(),
        require: p
            .require
            .iter()
            .flatten()
            .map(|c| c.as_str().to_owned())
            .collect(),
        candidates: p
            .candidates
            .iter()
            .flatten()
            .map(|tier| pb::Tier {
                candidates: tier
                    .0
                    .iter()
                    .map(|c| pb::Candidate {
                        model: c.model.clone(),
                        provider: c.provider.clone().unwrap_or_default(),
                        weight: c.weight.unwrap_or(1.0),
                    })
                    .collect(),
            })
            .collect(),
        pinned: p.pinned.unwrap_or(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::secrets::{fingerprint, MapEnv};
    use std::path::Path;
    use std::sync::atomic::{AtomicI64, Ordering};

    struct TestClock(AtomicI64);
    impl Clock for TestClock {
        fn now_ms(&self) -> i64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// An env whose variables the test can change while the engine reads it.
    #[derive(Default)]
    struct SharedEnv(Mutex<MapEnv>);
    impl Env for SharedEnv {
        fn var(&self, name: &str) -> Option<String> {
            lock(&self.0).var(name)
        }
        fn names(&self) -> Vec<String> {
            lock(&self.0).names()
        }
    }

    const POOL: &str = "
resilience: { rateLimitCooldownMs: 5000, quotaBlacklistMs: 60000 }
providers:
  - id: openai
    kind: openai
    keysFromEnv: OPENAI
    headers: { openai-organization: org-1 }
    models: [{ id: gpt-4o-mini, aliases: [fast], cost: { input: 0.15, output: 0.6 } }]
  - id: local
    baseUrl: http://127.0.0.1:9000/v1/
    keys: [{ alias: a, env: LOCAL_A }, { alias: b, env: LOCAL_B, weight: 2, maxConcurrency: 3 }]
    models: [{ id: llama }]
defaults: { deadlineMs: 60000 }
profiles:
  work: { candidates: [[{ model: fast, weight: 3 }, { model: llama }]], maxAttempts: 3 }
";

    struct Fixture {
        engine: Arc<Engine>,
        env: Arc<SharedEnv>,
        clock: Arc<TestClock>,
    }

    fn fixture(text: &str) -> Result<Fixture, String> {
        let env = Arc::new(SharedEnv::default());
        {
            let mut vars = lock(&env.0);
            vars.set("OPENAI_API_KEY", "sk-one");
            vars.set("OPENAI_API_KEY_2", "sk-two");
            vars.set("LOCAL_A", "sk-a");
        }
        let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
        let config = parse(text)
            .and_then(|f| f.resolve(env.as_ref(), Path::new(".")))
            .map_err(|e| e.to_string())?;
        let engine = Engine::new(
            Arc::new(config),
            env.clone(),
            clock.clone(),
            Vec::new(),
            DurableState::default(),
        );
        Ok(Fixture { engine, env, clock })
    }

    fn snapshot(engine: &Engine) -> pb::Snapshot {
        engine.current().snapshot.clone().unwrap_or_default()
    }

    fn attempt(provider: &str, key: &str, class: &str) -> pb::AttemptOutcome {
        pb::AttemptOutcome {
            provider: provider.into(),
            key: key.into(),
            model: "gpt-4o-mini".into(),
            outcome: "error".into(),
            error_class: class.into(),
            ..Default::default()
        }
    }

    fn batch(attempts: Vec<pb::AttemptOutcome>) -> pb::ReportBatch {
        pb::ReportBatch {
            attempts,
            ..Default::default()
        }
    }

    #[test]
    fn snapshot_carries_the_pool() -> Result<(), String> {
        let f = fixture(POOL)?;
        let s = snapshot(&f.engine);
        assert_eq!(s.providers.len(), 2);
        let openai = &s.providers[0];
        assert_eq!(
            (
                openai.scheme.as_str(),
                openai.authority.as_str(),
                openai.base_path.as_str()
            ),
            ("https", "api.openai.com", "/v1")
        );
        assert_eq!(openai.auth_header, "authorization");
        assert_eq!(openai.headers[0].name, "openai-organization");
        assert_eq!(openai.keys[0].alias, "openai-1");
        assert_eq!(openai.keys[0].secret, "sk-one");
        assert_eq!(openai.keys[0].fingerprint, fingerprint("sk-one"));
        assert_eq!(
            openai.models[0].capabilities,
            ["chat", "streaming", "tools", "json"]
        );
        assert_eq!(openai.models[0].identity, "gpt-4o-mini");
        let local = &s.providers[1];
        assert_eq!(
            (
                local.scheme.as_str(),
                local.authority.as_str(),
                local.base_path.as_str()
            ),
            ("http", "127.0.0.1:9000", "/v1")
        );
        assert_eq!(local.keys[1].secret, "");
        assert_eq!(local.keys[1].weight, 2.0);
        assert_eq!(local.keys[1].max_concurrency, 3);
        // The unset key is pushed as missing.
        assert_eq!(s.key_health.len(), 1);
        assert_eq!(s.key_health[0].key, "b");
        assert_eq!(s.key_health[0].reason, "missing");
        assert_eq!(s.limits.map(|l| l.max_body_bytes), Some(4 * 1024 * 1024));
        let work = &s.profiles["work"];
        assert_eq!(work.candidates[0].candidates.len(), 2);
        assert_eq!(work.candidates[0].candidates[0].weight, 3.0);
        assert_eq!(work.max_attempts, Some(3));
        assert_eq!(s.defaults.as_ref().and_then(|d| d.deadline_ms), Some(60000));
        assert_eq!(f.engine.health().status, "ok");
        Ok(())
    }

    #[test]
    fn rate_limit_cools_the_lane() -> Result<(), String> {
        let f = fixture(POOL)?;
        let mut rx = f.engine.subscribe();
        let v0 = f.engine.version();
        let (v1, _) =
            f.engine
                .apply_report(&batch(vec![attempt("openai", "openai-1", "rate_limit")]));
        assert!(v1 > v0);
        assert!(rx.has_changed().unwrap_or(false));
        let s = snapshot(&f.engine);
        assert_eq!(s.cooldowns.len(), 1);
        assert_eq!(s.cooldowns[0].model, "gpt-4o-mini");
        assert_eq!(s.cooldowns[0].until_ms, 1_005_000);
        // A retry-after wins over the default.
        let mut with_retry = attempt("openai", "openai-2", "rate_limit");
        with_retry.retry_at_ms = 1_030_000;
        f.engine.apply_report(&batch(vec![with_retry]));
        let s = snapshot(&f.engine);
        assert_eq!(s.cooldowns[1].until_ms, 1_030_000);
        // Expiry.
        f.clock.0.store(1_005_001, Ordering::SeqCst);
        assert!(f.engine.expire());
        assert_eq!(snapshot(&f.engine).cooldowns.len(), 1);
        rx.mark_unchanged();
        Ok(())
    }

    #[test]
    fn auth_blacklists_until_the_secret_changes() -> Result<(), String> {
        let f = fixture(POOL)?;
        let mut failed = attempt("openai", "openai-1", "auth");
        failed.fingerprint = fingerprint("sk-one");
        failed.provider_code = "invalid_api_key".into();
        let (_, events) = f.engine.apply_report(&batch(vec![failed.clone()]));
        assert!(matches!(
            &events[..],
            [EngineEvent::KeyDisabled {
                reason: "auth",
                until_ms: 0,
                ..
            }]
        ));
        let health = snapshot(&f.engine).key_health;
        let entry = health
            .iter()
            .find(|h| h.key == "openai-1")
            .cloned()
            .unwrap_or_default();
        assert_eq!(entry.reason, "auth");
        assert_eq!(entry.until_ms, 0);
        assert_eq!(entry.refused_fingerprint, fingerprint("sk-one"));
        // The same report again changes nothing.
        let v = f.engine.version();
        f.engine.apply_report(&batch(vec![failed]));
        assert_eq!(f.engine.version(), v);
        // Never expires on its own.
        f.clock.0.store(i64::MAX / 2, Ordering::SeqCst);
        assert!(!f.engine.expire());
        // Rotating the secret lifts it.
        lock(&f.env.0).set("OPENAI_API_KEY", "sk-one-rotated");
        let events = f.engine.refresh_secrets();
        assert_eq!(
            events,
            vec![EngineEvent::KeyRestored {
                provider: "openai".into(),
                key: "openai-1".into(),
                was: "auth",
                reason: "secret_changed"
            }]
        );
        let s = snapshot(&f.engine);
        assert!(!s.key_health.iter().any(|h| h.key == "openai-1"));
        assert_eq!(s.providers[0].keys[0].secret, "sk-one-rotated");
        Ok(())
    }

    #[test]
    fn a_refusal_of_an_old_secret_is_ignored() -> Result<(), String> {
        let f = fixture(POOL)?;
        let mut stale = attempt("openai", "openai-1", "auth");
        stale.fingerprint = fingerprint("sk-before-rotation");
        let v = f.engine.version();
        f.engine.apply_report(&batch(vec![stale]));
        assert_eq!(f.engine.version(), v);
        Ok(())
    }

    #[test]
    fn auth_disable_ms_bounds_the_blacklist() -> Result<(), String> {
        let f = fixture(&POOL.replace(
            "rateLimitCooldownMs: 5000",
            "rateLimitCooldownMs: 5000, authDisableMs: 1000",
        ))?;
        f.engine
            .apply_report(&batch(vec![attempt("openai", "openai-2", "auth")]));
        let entry = snapshot(&f.engine)
            .key_health
            .into_iter()
            .find(|h| h.key == "openai-2")
            .unwrap_or_default();
        assert_eq!(entry.until_ms, 1_001_000);
        assert_eq!(entry.refused_fingerprint, fingerprint("sk-two"));
        f.clock.0.store(1_001_000, Ordering::SeqCst);
        assert!(f.engine.expire());
        assert!(snapshot(&f.engine)
            .key_health
            .iter()
            .all(|h| h.key != "openai-2"));
        Ok(())
    }

    #[test]
    fn quota_blacklists_until_the_window_or_the_default() -> Result<(), String> {
        let f = fixture(POOL)?;
        let mut windowed = attempt("openai", "openai-1", "quota");
        windowed.retry_at_ms = 2_000_000;
        f.engine.apply_report(&batch(vec![
            windowed,
            attempt("openai", "openai-2", "quota"),
        ]));
        let health = snapshot(&f.engine).key_health;
        let until = |key: &str| {
            health
                .iter()
                .find(|h| h.key == key)
                .map(|h| (h.reason.clone(), h.until_ms))
        };
        assert_eq!(until("openai-1"), Some(("quota".into(), 2_000_000)));
        assert_eq!(until("openai-2"), Some(("quota".into(), 1_060_000)));
        // Every key blacklisted but local/a: still ok; then local/a too: degraded.
        assert_eq!(f.engine.health().status, "ok");
        f.engine
            .apply_report(&batch(vec![attempt("local", "a", "auth")]));
        assert_eq!(f.engine.health().status, "degraded");
        Ok(())
    }

    #[test]
    fn other_outcomes_change_nothing() -> Result<(), String> {
        let f = fixture(POOL)?;
        let v = f.engine.version();
        let mut ok = attempt("openai", "openai-1", "");
        ok.outcome = "success".into();
        f.engine.apply_report(&batch(vec![
            ok,
            attempt("openai", "openai-1", "transient"),
            attempt("openai", "openai-1", "invalid_request"),
            attempt("nope", "openai-1", "auth"),
        ]));
        assert_eq!(f.engine.version(), v);
        Ok(())
    }

    #[test]
    fn missing_secrets_come_and_go() -> Result<(), String> {
        let f = fixture(POOL)?;
        lock(&f.env.0).set("LOCAL_B", "sk-b");
        let events = f.engine.refresh_secrets();
        assert!(matches!(
            &events[..],
            [EngineEvent::KeyRestored { was: "missing", .. }]
        ));
        assert!(snapshot(&f.engine).key_health.is_empty());
        lock(&f.env.0).remove("LOCAL_A");
        let events = f.engine.refresh_secrets();
        assert!(matches!(
            &events[..],
            [EngineEvent::KeyDisabled {
                reason: "missing",
                ..
            }]
        ));
        let s = snapshot(&f.engine);
        assert_eq!(s.key_health.len(), 1);
        assert_eq!(s.providers[1].keys[0].secret, "");
        assert_eq!(s.providers[1].keys[0].fingerprint, 0);
        // Nothing changed: no new version.
        let v = f.engine.version();
        assert!(f.engine.refresh_secrets().is_empty());
        assert_eq!(f.engine.version(), v);
        Ok(())
    }

    #[test]
    fn durable_state_is_taken_over() -> Result<(), String> {
        let f = fixture(POOL)?;
        f.engine.apply_report(&batch(vec![
            attempt("openai", "openai-1", "auth"),
            attempt("openai", "openai-2", "rate_limit"),
        ]));
        let store = MemoryStateStore::default();
        store.save(&f.engine.durable()).map_err(|e| e.to_string())?;
        let durable = store.load().map_err(|e| e.to_string())?;
        // Same secrets: the blacklist holds.
        let again = Engine::new(
            Arc::new(f.engine.config().clone()),
            f.env.clone(),
            f.clock.clone(),
            Vec::new(),
            durable.clone(),
        );
        assert_eq!(again.durable(), durable);
        // A new secret meanwhile: lifted at start.
        lock(&f.env.0).set("OPENAI_API_KEY", "sk-new");
        let lifted = Engine::new(
            Arc::new(f.engine.config().clone()),
            f.env.clone(),
            f.clock.clone(),
            Vec::new(),
            durable,
        );
        assert!(lifted.durable().blacklists.is_empty());
        assert_eq!(lifted.durable().cooldowns.len(), 1);
        Ok(())
    }

    #[test]
    fn versions_only_increase() -> Result<(), String> {
        let f = fixture(POOL)?;
        let mut last = f.engine.version();
        for class in ["rate_limit", "auth", "quota"] {
            f.engine
                .apply_report(&batch(vec![attempt("local", "a", class)]));
            let v = f.engine.version();
            assert!(v > last, "{class}");
            assert_eq!(f.engine.current().version, v);
            last = v;
        }
        Ok(())
    }
}
