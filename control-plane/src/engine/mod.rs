//! The state authority: what the data plane decides from.
//!
//! The engine holds the resolved pool (providers and their current secrets), the virtual keys
//! and the health state (blacklisted keys, lane cooldowns, breakers, headroom, provider spend),
//! and publishes all of it as one versioned [`pb::StateUpdate`] on a `tokio::sync::watch`
//! channel; every change bumps the version. Four things change it:
//! - [`Engine::apply_report`]: attempt outcomes from the filters (docs/architecture.md, Sync);
//! - [`Engine::refresh_secrets`]: every reference is resolved again (about once a second), a
//!   changed secret replaces the pushed one and lifts a blacklist whose refused fingerprint
//!   differs;
//! - [`Engine::expire`]: cooldowns, timed blacklists, headroom past its reset and ended budget
//!   periods go; open breakers past their cooldown turn half-open;
//! - [`Engine::sync_store`]: what another control plane sharing the state store wrote.
//!
//! Durable state goes through [`StateStore`]; the in-memory store is the default. The persister
//! task ([`Engine::run_persist`]) merges the store into the engine and writes this process's
//! changes back, off the executor, on every change and about once a second. Updates are
//! read-modify-write with a three-way merge per entry (ours wins a conflict; provider spend is
//! added): breakers are a health signal, not a ledger.

pub mod budgets;
pub mod events;
pub mod reload;
pub mod stats;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ai_router_contract::failure::{ErrorClass, Hold};
use ai_router_contract::probe_holder;
use ai_router_proto::tables::Tables;
use ai_router_proto::v1 as pb;
use tokio::sync::watch;

use self::events::{Event, EventBus};
use crate::clock::Clock;
use crate::config::catalog::{family_of, terms_of};
use crate::config::secrets::{Env, Secret};
use crate::config::{Config, PolicyConfig, Provider};
use crate::keys::record::VirtualKeyRecord;
use crate::store::breaker::{Breaker, BreakerId, BreakerPhase, BreakerScope};
use crate::store::durable::{
    merge_durable, Blacklist, BlacklistReason, DurableChanges, DurableState, KeyId, LaneHeadroom,
    LaneId, LeaseGrant, StateStore, StoreError,
};
use crate::store::lock;
use crate::store::memory::MemoryStateStore;
use crate::store::spend::{self as budget, Spend};

/// How often secret references are resolved again.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// How often the state store is read for what other control planes wrote.
pub const STORE_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long a change that only moves headroom (every answer of a real provider moves it) may
/// wait to be published with the next ones. The data plane acts on a 429 at once with its own
/// hold, so headroom this late costs at most a few more 429s, never a wrong answer.
pub const HEADROOM_COALESCE: Duration = Duration::from_millis(200);
/// How long an operator's reset is pushed: past it, Envoy's own holds from before the reset
/// have given way to the control plane anyway (their grace is 5 s).
pub const RESET_MARK: Duration = Duration::from_secs(60);

/// How long a reported headroom holds when the provider named no reset.
pub const HEADROOM_DEFAULT_WINDOW_MS: i64 = 60_000;

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
    Breaker {
        scope: BreakerScope,
        provider: String,
        /// "" for the provider scope.
        key: String,
        from: BreakerPhase,
        to: BreakerPhase,
    },
}

impl EngineEvent {
    /// The operator's event for it, at `at_ms`.
    pub fn to_event(&self, at_ms: i64) -> Event {
        match self.clone() {
            Self::KeyDisabled {
                provider,
                key,
                reason,
                until_ms,
                code,
            } => Event::KeyDisabled {
                at_ms,
                provider,
                key,
                reason,
                until_ms,
                code,
            },
            Self::KeyRestored {
                provider,
                key,
                was,
                reason,
            } => Event::KeyRestored {
                at_ms,
                provider,
                key,
                was,
                reason,
            },
            Self::Breaker {
                scope,
                provider,
                key,
                from,
                to,
            } => Event::Breaker {
                at_ms,
                scope: scope.as_str(),
                provider,
                key,
                from: from.as_str(),
                to: to.as_str(),
            },
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
    /// What the store held after the last exchange with it: the base of the three-way merge.
    base: DurableState,
    virtual_keys: Vec<VirtualKeyRecord>,
    /// `virtual_keys` as published, rebuilt only when they change.
    published_keys: Arc<BTreeMap<String, pb::VirtualKey>>,
    /// SHA-256 (hex) of the admin token, pushed so the gateway can check it on `GET /health`.
    admin_token_sha256: String,
    /// A change waits for the next [`Engine::flush`] (headroom only).
    pending: bool,
    /// (provider, key or "") -> when an operator reset it; pushed so Envoy voids its own holds
    /// set before then, dropped after [`RESET_MARK`].
    resets: BTreeMap<KeyId, i64>,
    /// Budget policies' use in their current windows (`budgets`).
    budgets: budgets::BudgetLedger,
    /// When the attempt that reported each lane's headroom began (pushed as `as_of_ms`: the
    /// filter counts its sends since then against it). Not durable: after a restart the
    /// filter counts every recent send, which only errs on the safe side.
    headroom_as_of: BTreeMap<LaneId, i64>,
    /// The [`HeadroomSource`]'s figures as last published.
    estimated: Vec<pb::Headroom>,
}

/// Headroom the engine pushes besides what providers report: the quota ledger's estimates
/// (model empty: the whole billing scope). Asked on every [`Engine::flush`]; a change of a
/// figure publishes.
pub trait HeadroomSource: Send + Sync {
    fn headroom(&self, now_ms: i64) -> Vec<pb::Headroom>;
}

/// Whether two lists of headroom say the same (their times aside).
fn same_figures(a: &[pb::Headroom], b: &[pb::Headroom]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (
                &x.provider,
                &x.key,
                &x.model,
                x.remaining_requests,
                x.remaining_tokens,
            ) == (
                &y.provider,
                &y.key,
                &y.model,
                y.remaining_requests,
                y.remaining_tokens,
            )
        })
}

/// What [`Engine::reset`] cleared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ResetCounts {
    pub blacklists: u32,
    pub cooldowns: u32,
    pub breakers: u32,
    pub headroom: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetError {
    #[error("no provider {0:?} in the pool")]
    UnknownProvider(String),
    #[error("provider {provider:?} has no key {key:?}")]
    UnknownKey { provider: String, key: String },
    #[error("a key is reset with its provider: give \"provider\" too")]
    KeyWithoutProvider,
}

pub struct Engine {
    /// Replaced whole by [`Engine::replace_config`] (a reload); read by cloning the `Arc`.
    config: RwLock<Arc<Config>>,
    env: Arc<dyn Env>,
    clock: Arc<dyn Clock>,
    /// Durable state and the probe leases.
    store: Arc<dyn StateStore>,
    state: Mutex<State>,
    updates: watch::Sender<Arc<Tables>>,
    /// Headroom-only changes wait for [`Engine::flush`] instead of a publish each.
    coalesce_headroom: std::sync::atomic::AtomicBool,
    /// See [`ReportObserver`].
    report_observers: Mutex<Vec<Arc<dyn ReportObserver>>>,
    /// See [`HeadroomSource`].
    headroom_source: Mutex<Option<Arc<dyn HeadroomSource>>>,
    events: EventBus,
    stats: stats::Stats,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("version", &self.version())
            .finish_non_exhaustive()
    }
}

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
        for provider in &config.providers {
            for key in &provider.keys {
                secrets.insert(
                    (provider.id.clone(), key.alias.clone()),
                    key.source.resolve(env.as_ref()),
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
            resets: BTreeMap::new(),
            headroom_as_of: BTreeMap::new(),
            estimated: Vec::new(),
            budgets: budgets::BudgetLedger::default(),
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
        });
        engine.emit(&restored_at_start);
        engine.expire();
        engine
    }

    /// The pool as it is now (a reload replaces it).
    pub fn config(&self) -> Arc<Config> {
        match self.config.read() {
            Ok(config) => config.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The operator's events, live.
    pub fn events(&self) -> &EventBus {
        &self.events
    }

    /// This process's counters since start.
    pub fn stats(&self) -> stats::StatsView {
        self.stats.view()
    }

    fn emit(&self, events: &[EngineEvent]) {
        let now = self.clock.now_ms();
        for event in events {
            self.events.emit(event.to_event(now));
        }
    }

    /// The published tables now and at every later version.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Tables>> {
        self.updates.subscribe()
    }

    /// The published tables.
    pub fn tables(&self) -> Arc<Tables> {
        self.updates.borrow().clone()
    }

    /// The published state as one snapshot (admin answers, metrics, tests).
    pub fn current(&self) -> pb::StateUpdate {
        let tables = self.tables();
        pb::StateUpdate {
            version: tables.version,
            snapshot: Some(tables.to_snapshot()),
            delta: None,
        }
    }

    /// Lets headroom-only changes wait for [`Engine::flush`] (which `serve` runs every
    /// [`HEADROOM_COALESCE`]) instead of publishing a version each.
    pub fn coalesce_headroom(&self, on: bool) {
        self.coalesce_headroom
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Closes breakers, lifts blacklists and cooldowns and clears headroom: of every provider
    /// (`provider` `None`), of one provider and its keys, or of one key (and its lanes). Envoy
    /// voids its own holds on them at once. A key whose secret is missing stays out.
    pub fn reset(
        &self,
        provider: Option<&str>,
        key: Option<&str>,
    ) -> Result<ResetCounts, ResetError> {
        let config = self.config();
        let providers: Vec<&str> = match (provider, key) {
            (None, Some(_)) => return Err(ResetError::KeyWithoutProvider),
            (None, None) => config.providers.iter().map(|p| p.id.as_str()).collect(),
            (Some(p), _) => {
                let Some(found) = config.providers.iter().find(|x| x.id == p) else {
                    return Err(ResetError::UnknownProvider(p.to_owned()));
                };
                if let Some(k) = key {
                    if !found.keys.iter().any(|x| x.alias == k) {
                        return Err(ResetError::UnknownKey {
                            provider: p.to_owned(),
                            key: k.to_owned(),
                        });
                    }
                }
                vec![p]
            }
        };
        let hit = |p: &str, k: &str| providers.contains(&p) && key.is_none_or(|want| want == k);
        let now = self.clock.now_ms();
        let mut counts = ResetCounts::default();
        let mut events = Vec::new();
        let mut state = lock(&self.state);
        let durable = &mut state.durable;
        durable.blacklists.retain(|(p, k), b| {
            if !hit(p, k) {
                return true;
            }
            counts.blacklists += 1;
            events.push(EngineEvent::KeyRestored {
                provider: p.clone(),
                key: k.clone(),
                was: b.reason.as_str(),
                reason: "reset",
            });
            false
        });
        durable.cooldowns.retain(|(p, k, _), _| {
            let out = hit(p, k);
            counts.cooldowns += u32::from(out);
            !out
        });
        durable.headroom.retain(|(p, k, _), _| {
            let out = hit(p, k);
            counts.headroom += u32::from(out);
            !out
        });
        durable.breakers.retain(|id, b| {
            let (scope, p, k) = id;
            let out = match scope {
                BreakerScope::Key => hit(p, k),
                BreakerScope::Provider => key.is_none() && providers.contains(&p.as_str()),
            };
            if out && b.phase != BreakerPhase::Closed {
                counts.breakers += 1;
                events.push(breaker_event(id, b.phase, BreakerPhase::Closed));
            }
            !out
        });
        for p in &providers {
            state
                .resets
                .insert(((*p).to_owned(), key.unwrap_or("").to_owned()), now);
        }
        self.emit(&events);
        tracing::info!(
            provider = provider.unwrap_or("*"),
            key = key.unwrap_or("*"),
            blacklists = counts.blacklists,
            cooldowns = counts.cooldowns,
            breakers = counts.breakers,
            headroom = counts.headroom,
            "reset"
        );
        self.publish(&mut state, now);
        Ok(counts)
    }

    /// Publishes what waits (headroom, and the [`HeadroomSource`]'s figures when they moved);
    /// returns whether anything did.
    pub fn flush(&self) -> bool {
        let now = self.clock.now_ms();
        let source = lock(&self.headroom_source).clone();
        let estimated = source.map(|s| s.headroom(now));
        let mut state = lock(&self.state);
        if let Some(estimated) = estimated {
            if !same_figures(&state.estimated, &estimated) {
                state.estimated = estimated;
                state.pending = true;
            }
        }
        if !state.pending {
            return false;
        }
        self.publish(&mut state, now);
        true
    }

    /// Runs [`Engine::flush`] every [`HEADROOM_COALESCE`] until `shutdown` flips.
    pub async fn run_flush(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        self.coalesce_headroom(true);
        let mut tick = tokio::time::interval(HEADROOM_COALESCE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.flush();
                }
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
        self.coalesce_headroom(false);
        self.flush();
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
        let config = self.config();
        self.stats.observe(
            batch,
            |a| attempt_cost(&config, a).unwrap_or(0.0),
            |a| crate::keys::usage::saving_of(&config, a),
        );
        self.stats.observe_cache(batch, |r| {
            r.usage.as_ref().map_or(0.0, |u| {
                crate::keys::usage::cost_of(&config, &r.provider, &r.model, u)
            })
        });
        if self.events.wants_calls() {
            for event in call_events(&config, batch) {
                self.events.emit(event);
            }
        }
        let now = self.clock.now_ms();
        let resilience = &config.resilience;
        let mut state = lock(&self.state);
        let mut events = Vec::new();
        let mut changed = false;
        let mut headroom_moved = false;
        // Probe leases to end once the state lock is released (the store may block).
        let mut releases: Vec<(BreakerId, Option<String>)> = Vec::new();
        if !config.budgets.is_empty() {
            let mut crossings = Vec::new();
            for charge in crate::keys::ledger::charges(&config, batch) {
                crossings.extend(state.budgets.charge(&config.budgets, &charge, now));
            }
            changed |= !crossings.is_empty();
            for crossing in &crossings {
                self.events.emit(budgets::event(crossing, now));
            }
        }
        for attempt in &batch.attempts {
            let lane_key: KeyId = (attempt.provider.clone(), attempt.key.clone());
            if state.secrets.contains_key(&lane_key) {
                if note_headroom(&mut state.durable, attempt, now) {
                    headroom_moved = true;
                    let began = attempt
                        .at_ms
                        .saturating_sub(i64::try_from(attempt.latency_ms).unwrap_or(0));
                    let lane = (
                        attempt.provider.clone(),
                        attempt.key.clone(),
                        attempt.model.clone(),
                    );
                    let st = &mut *state;
                    if st.headroom_as_of.len() > st.durable.headroom.len() + 64 {
                        let kept = &st.durable.headroom;
                        st.headroom_as_of.retain(|l, _| kept.contains_key(l));
                    }
                    st.headroom_as_of.insert(lane, began);
                }
                changed |= note_spend(&config, &mut state.durable, attempt, now);
                if attempt.probe {
                    // Only the attempt that holds the lease ends it.
                    let holder = Some(probe_holder(&attempt.request_id, attempt.attempt));
                    for id in breaker_ids(&attempt.provider, &attempt.key) {
                        releases.push((id, holder.clone()));
                    }
                }
                if attempt.outcome() == pb::AttemptResult::Success {
                    changed |= update_breakers(
                        &mut state.durable,
                        &attempt.provider,
                        &attempt.key,
                        |_, b| b.on_success(),
                        &mut events,
                        &mut releases,
                    );
                }
            }
            if attempt.outcome() != pb::AttemptResult::Error {
                continue;
            }
            let id: KeyId = lane_key;
            let Some(current) = state.secrets.get(&id) else {
                tracing::debug!(provider = %id.0, key = %id.1, "report for an unknown key");
                continue;
            };
            let current_fp = current.as_ref().map_or(0, Secret::fingerprint);
            let retry_at = (attempt.retry_at_ms > now).then_some(attempt.retry_at_ms);
            // The one failure -> hold rule (the filter applies it too). An unknown class changes
            // nothing, nor do invalid requests and cancellations.
            let Some(class) = attempt.class() else {
                continue;
            };
            match class.hold(retry_at.is_some()) {
                Hold::Lane => {
                    // A rate limit until its window or the default; a failure of the lane with
                    // a retry-after until then.
                    let until = retry_at
                        .unwrap_or(now.saturating_add(ms(resilience.rate_limit_cooldown_ms)));
                    let lane = (id.0.clone(), id.1.clone(), attempt.model.clone());
                    let entry = state.durable.cooldowns.entry(lane).or_insert(0);
                    if until > *entry {
                        *entry = until;
                        changed = true;
                    }
                }
                Hold::Key => {
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
                    let (reason, until) = if class == ErrorClass::Auth {
                        let for_good = attempt.provider_code
                            == ai_router_contract::failure::UNSUPPORTED_KEY_TYPE;
                        let until = resilience
                            .auth_disable_ms
                            .filter(|_| !for_good)
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
                    // A key's failure, not the lane's: no breaker counts it.
                    continue;
                }
                Hold::Nothing => {}
            }
            if class.counts_for_breakers() {
                let started = if attempt.at_ms > 0 {
                    attempt.at_ms.saturating_sub(ms(attempt.latency_ms))
                } else {
                    0
                };
                changed |= update_breakers(
                    &mut state.durable,
                    &id.0,
                    &id.1,
                    |scope, b| {
                        let config = match scope {
                            BreakerScope::Key => &resilience.key_breaker,
                            BreakerScope::Provider => &resilience.provider_breaker,
                        };
                        b.on_failure(config, now, retry_at, started)
                    },
                    &mut events,
                    &mut releases,
                );
            }
        }
        self.emit(&events);
        let coalesce = self
            .coalesce_headroom
            .load(std::sync::atomic::Ordering::Relaxed);
        if changed || (headroom_moved && !coalesce) {
            self.publish(&mut state, now);
        } else if headroom_moved {
            state.pending = true;
        }
        let version = state.version;
        drop(state);
        self.release_leases(releases);
        (version, events)
    }

    fn release_leases(&self, releases: Vec<(BreakerId, Option<String>)>) {
        for (id, holder) in releases {
            if let Err(err) = self.store.release(&id, holder.as_deref()) {
                tracing::error!(%err, scope = id.0.as_str(), provider = %id.1, "cannot release a probe lease");
            }
        }
    }

    /// The half-open probe lease on breaker `id` for `holder`, for `ttl_ms` (clamped to
    /// 100 ms..10 min). Refused with `retry_at_ms` = the end of the cooldown while the breaker is
    /// still open, or = the end of the current lease while another attempt holds it. Atomic
    /// across every process sharing the state store. Blocking (the store).
    pub fn lease(
        &self,
        id: &BreakerId,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<pb::LeaseReply, StoreError> {
        let now = self.clock.now_ms();
        let id = match id.0 {
            BreakerScope::Provider => (id.0, id.1.clone(), String::new()),
            BreakerScope::Key => id.clone(),
        };
        let open_until = lock(&self.state)
            .durable
            .breakers
            .get(&id)
            .filter(|b| b.phase == BreakerPhase::Open && b.open_until_ms > now)
            .map(|b| b.open_until_ms);
        if let Some(until) = open_until {
            return Ok(pb::LeaseReply {
                granted: false,
                retry_at_ms: until,
            });
        }
        let ttl = ms(ttl_ms.clamp(100, 600_000));
        Ok(match self.store.lease(&id, holder, now, ttl)? {
            LeaseGrant::Granted => {
                tracing::debug!(scope = id.0.as_str(), provider = %id.1, key = %id.2, holder = %holder, "probe lease granted");
                pb::LeaseReply {
                    granted: true,
                    retry_at_ms: 0,
                }
            }
            LeaseGrant::HeldUntil(until) => pb::LeaseReply {
                granted: false,
                retry_at_ms: until,
            },
        })
    }

    /// Merges what other processes wrote to `store` since the last exchange and writes this
    /// process's changes; returns whether the merge changed the pushed state. Blocking.
    pub fn sync_store(&self, store: &dyn StateStore) -> Result<bool, StoreError> {
        let remote = store.load()?;
        let now = self.clock.now_ms();
        let (changes, written, pulled) = {
            let mut state = lock(&self.state);
            let base = std::mem::take(&mut state.base);
            let pulled = merge_durable(&mut state.durable, &base, &remote);
            state.base = base;
            if pulled {
                self.publish(&mut state, now);
            }
            (
                DurableChanges::between(&remote, &state.durable),
                state.durable.clone(),
                pulled,
            )
        };
        if !changes.is_empty() {
            store.apply(&changes)?;
        }
        // Only once written: a failed write leaves the base, so the next round tries again.
        lock(&self.state).base = written;
        Ok(pulled)
    }

    /// After an outage of the store: the next exchange takes the union of what this process
    /// and the store hold (ours wins where both have an entry) instead of reading what the
    /// store lacks as deleted, since a store that restarted empty deleted nothing.
    pub fn forget_store_base(&self) {
        lock(&self.state).base = DurableState::default();
    }

    /// Resolves every key reference again; a changed secret is pushed and lifts a blacklist
    /// whose refused fingerprint differs.
    pub fn refresh_secrets(&self) -> Vec<EngineEvent> {
        let now = self.clock.now_ms();
        let mut resolved = Vec::new();
        let config = self.config();
        for provider in &config.providers {
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
        self.emit(&events);
        if changed {
            self.publish(&mut state, now);
        }
        events
    }

    /// Drops cooldowns, timed blacklists and headroom that have ended, turns open breakers past
    /// their cooldown half-open and starts new budget periods; returns whether the pushed state
    /// changed.
    pub fn expire(&self) -> bool {
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let durable = &mut state.durable;
        let before = (
            durable.blacklists.len(),
            durable.cooldowns.len(),
            durable.headroom.len(),
        );
        durable
            .blacklists
            .retain(|_, b| b.until_ms == 0 || b.until_ms > now);
        durable.cooldowns.retain(|_, until| *until > now);
        durable.headroom.retain(|_, h| h.reset_at_ms > now);
        let mut changed = before
            != (
                durable.blacklists.len(),
                durable.cooldowns.len(),
                durable.headroom.len(),
            );
        let marks = state.resets.len();
        state
            .resets
            .retain(|_, at| now.saturating_sub(*at) < ms(RESET_MARK.as_millis() as u64));
        changed |= marks != state.resets.len();
        let durable = &mut state.durable;
        let mut events = Vec::new();
        for (id, breaker) in &mut durable.breakers {
            if let Some((from, to)) = breaker.tick(now) {
                events.push(breaker_event(id, from, to));
                changed = true;
            }
        }
        for spend in durable.spend.values_mut() {
            changed |= spend.roll(now);
        }
        changed |= state.budgets.roll(now);
        self.emit(&events);
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

    /// Exchanges state with `store` ([`Engine::sync_store`]) whenever it changes and every
    /// [`STORE_POLL_INTERVAL`] (what another control plane wrote), until `shutdown` flips; a
    /// last exchange then.
    pub async fn run_persist(
        self: Arc<Self>,
        store: Arc<dyn StateStore>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut updates = self.subscribe();
        let mut tick = tokio::time::interval(STORE_POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            let stop = tokio::select! {
                changed = updates.changed() => changed.is_err(),
                _ = tick.tick() => false,
                _ = shutdown.changed() => true,
            };
            let engine = self.clone();
            let store = store.clone();
            let reconcile = failing;
            match tokio::task::spawn_blocking(move || {
                if reconcile {
                    engine.forget_store_base();
                }
                engine.sync_store(store.as_ref())
            })
            .await
            {
                Ok(Ok(_)) => {
                    if failing {
                        tracing::info!("the state store is reachable again");
                    }
                    failing = false;
                }
                // One line per outage, not one per second.
                Ok(Err(err)) if !failing => {
                    tracing::error!(%err, "cannot exchange state with the store");
                    failing = true;
                }
                Ok(Err(_)) => {}
                Err(err) => tracing::error!(%err, "state store task failed"),
            }
            if stop || *shutdown.borrow() {
                break;
            }
        }
    }

    /// Serves `config` from now on (see [`reload`]: what it keeps and drops) and publishes it; returns what changed.
    pub fn replace_config(&self, config: Arc<Config>) -> reload::PoolChange {
        let old = self.config();
        let kept: BTreeSet<KeyId> = reload::key_ids(&old).collect();
        // Only the new keys are resolved here (file reads happen outside the state lock);
        // a kept key whose reference changed is picked up by the next secret refresh.
        let resolved: Vec<(KeyId, Option<Secret>)> = config
            .providers
            .iter()
            .flat_map(|p| p.keys.iter().map(move |k| (p, k)))
            .filter(|(p, k)| !kept.contains(&(p.id.clone(), k.alias.clone())))
            .map(|(p, k)| {
                (
                    (p.id.clone(), k.alias.clone()),
                    k.source.resolve(self.env.as_ref()),
                )
            })
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
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
        self.publish(&mut state, now);
        change
    }

    fn publish(&self, state: &mut State, now: i64) {
        state.version += 1;
        state.pending = false;
        let tables = Arc::new(build_tables(&self.config(), state, now));
        self.updates.send_replace(tables);
    }
}

// ---------------------------------------------------------------------------------------------
// Virtual keys from the key store, and report observers (usage accounting): see `keys::admin`
// and `keys::usage`.
// ---------------------------------------------------------------------------------------------

/// Sees every report batch [`Engine::apply_report`] receives (usage accounting). Must not
/// block: it runs on the report path.
pub trait ReportObserver: Send + Sync {
    fn observe(&self, batch: &pb::ReportBatch);
}

/// A function observes too: how usage accounting (`keys::usage`) is attached, the keys knowing
/// nothing of the engine.
impl<F: Fn(&pb::ReportBatch) + Send + Sync> ReportObserver for F {
    fn observe(&self, batch: &pb::ReportBatch) {
        self(batch);
    }
}

impl Engine {
    /// Replaces the snapshot's virtual keys (mounted and stored); publishes a new version when
    /// they changed. Returns whether they did.
    /// The admin token the gateway's `GET /health` accepts (only its SHA-256 is pushed).
    pub fn set_admin_token(&self, token: Option<&Secret>) {
        let hash = token
            .map(|t| crate::config::secrets::sha256_hex(t.expose()))
            .unwrap_or_default();
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        if state.admin_token_sha256 != hash {
            state.admin_token_sha256 = hash;
            self.publish(&mut state, now);
        }
    }

    pub fn set_virtual_keys(&self, keys: Vec<VirtualKeyRecord>) -> bool {
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        if state.virtual_keys == keys {
            return false;
        }
        state.published_keys = Arc::new(published_keys(&keys));
        state.virtual_keys = keys;
        self.publish(&mut state, now);
        true
    }

    /// The estimated cost of an attempt's usage, when it has usage and its model a price.
    pub fn attempt_cost(&self, a: &pb::AttemptOutcome) -> Option<f64> {
        attempt_cost(&self.config(), a)
    }

    /// Adds an observer of every later report batch.
    pub fn add_report_observer(&self, observer: Arc<dyn ReportObserver>) {
        lock(&self.report_observers).push(observer);
    }

    /// Pushes `source`'s headroom too, from the next [`Engine::flush`] on.
    pub fn set_headroom_source(&self, source: Arc<dyn HeadroomSource>) {
        *lock(&self.headroom_source) = Some(source);
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

/// The key's breaker and its provider's.
fn breaker_ids(provider: &str, key: &str) -> [BreakerId; 2] {
    [
        (BreakerScope::Key, provider.to_owned(), key.to_owned()),
        (BreakerScope::Provider, provider.to_owned(), String::new()),
    ]
}

fn breaker_event(id: &BreakerId, from: BreakerPhase, to: BreakerPhase) -> EngineEvent {
    EngineEvent::Breaker {
        scope: id.0,
        provider: id.1.clone(),
        key: id.2.clone(),
        from,
        to,
    }
}

/// Runs `step` on the key's and the provider's breakers; records events and the leases that
/// end (a breaker that leaves half-open or closes). Returns whether the pushed state changed
/// (a failure counted while closed is stored, not pushed).
fn update_breakers(
    durable: &mut DurableState,
    provider: &str,
    key: &str,
    step: impl Fn(BreakerScope, &mut Breaker) -> Option<crate::store::breaker::Transition>,
    events: &mut Vec<EngineEvent>,
    releases: &mut Vec<(BreakerId, Option<String>)>,
) -> bool {
    let mut visible = false;
    for id in breaker_ids(provider, key) {
        let before = durable.breakers.get(&id).copied().unwrap_or_default();
        let mut breaker = before;
        if let Some((from, to)) = step(id.0, &mut breaker) {
            events.push(breaker_event(&id, from, to));
            if from == BreakerPhase::HalfOpen || to == BreakerPhase::Closed {
                releases.push((id.clone(), None));
            }
        }
        if breaker == before {
            continue;
        }
        visible |= breaker.phase != before.phase
            || (breaker.phase != BreakerPhase::Closed
                && breaker.open_until_ms != before.open_until_ms);
        if breaker.is_idle() {
            durable.breakers.remove(&id);
        } else {
            durable.breakers.insert(id, breaker);
        }
    }
    visible
}

/// Keeps the lane's last reported headroom; returns whether it changed. Absent values are -1
/// (remaining) and 0 (reset); with no reset the entry holds [`HEADROOM_DEFAULT_WINDOW_MS`].
/// Any outcome counts (a 429 reports headroom too).
fn note_headroom(durable: &mut DurableState, attempt: &pb::AttemptOutcome, now: i64) -> bool {
    if attempt.remaining_requests < 0 && attempt.remaining_tokens < 0 {
        return false;
    }
    // 0/0 with no reset is what a message that never set the fields decodes to.
    if attempt.remaining_requests == 0
        && attempt.remaining_tokens == 0
        && attempt.ratelimit_reset_at_ms <= 0
    {
        return false;
    }
    let reset_at_ms = if attempt.ratelimit_reset_at_ms > 0 {
        attempt.ratelimit_reset_at_ms
    } else {
        now.saturating_add(HEADROOM_DEFAULT_WINDOW_MS)
    };
    if reset_at_ms <= now {
        return false;
    }
    let entry = LaneHeadroom {
        remaining_requests: attempt.remaining_requests.max(-1),
        remaining_tokens: attempt.remaining_tokens.max(-1),
        reset_at_ms,
    };
    let lane = (
        attempt.provider.clone(),
        attempt.key.clone(),
        attempt.model.clone(),
    );
    if let Some(old) = durable.headroom.get(&lane) {
        let same_values = old.remaining_requests == entry.remaining_requests
            && old.remaining_tokens == entry.remaining_tokens;
        // Without a reset from the provider, the same values again are no news: keep the
        // window they were first seen with (a provider sending constant headers would
        // otherwise publish a version per answer).
        if same_values && (attempt.ratelimit_reset_at_ms <= 0 || old.reset_at_ms == reset_at_ms) {
            return false;
        }
    }
    durable.headroom.insert(lane, entry);
    true
}

/// A key's billing scope as pushed: its `scope:`, empty when it is its own.
fn key_scope(config: &Config, provider: &str, key: &str) -> String {
    config
        .providers
        .iter()
        .find(|p| p.id == provider)
        .and_then(|p| p.keys.iter().find(|k| k.alias == key))
        .and_then(|k| k.scope.clone())
        .unwrap_or_default()
}

/// The estimated cost of an attempt's usage, when it has usage and its model a price.
fn attempt_cost(config: &Config, a: &pb::AttemptOutcome) -> Option<f64> {
    let usage = a.usage?;
    let model = config
        .providers
        .iter()
        .find(|p| p.id == a.provider)
        .and_then(|p| p.models.iter().find(|m| m.answers_to(&a.model)));
    let c = budget::attempt_cost(model, usage.prompt_tokens, usage.completion_tokens);
    (c > 0.0 && c.is_finite()).then_some(c)
}

/// The attempt and request events of a report batch.
fn call_events(config: &Config, batch: &pb::ReportBatch) -> Vec<Event> {
    let mut out = Vec::with_capacity(batch.attempts.len() + batch.requests.len());
    for a in &batch.attempts {
        let cost = attempt_cost(config, a);
        out.push(Event::Attempt {
            at_ms: a.at_ms,
            request_id: a.request_id.clone(),
            operation: a.operation.clone(),
            attempt: a.attempt,
            provider: a.provider.clone(),
            key: a.key.clone(),
            model: a.model.clone(),
            latency_ms: a.latency_ms,
            outcome: a.outcome().text().to_owned(),
            error_class: a.class().map(|c| c.as_str().to_owned()),
            status: a.status,
            usage: a.usage.map(|u| events::Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            }),
            cost,
        });
    }
    for r in &batch.requests {
        let (outcome, class) = r.result_parts();
        let (outcome, class) = (outcome.to_owned(), class.map(str::to_owned));
        let answered = outcome == "success";
        out.push(Event::Request {
            at_ms: r.at_ms,
            request_id: r.request_id.clone(),
            operation: r.operation.clone(),
            outcome,
            attempts: r.attempts,
            latency_ms: r.latency_ms,
            status: r.status,
            provider: (answered && !r.provider.is_empty()).then(|| r.provider.clone()),
            model: (answered && !r.model.is_empty()).then(|| r.model.clone()),
            error_class: class,
        });
    }
    out
}

/// Adds the attempt's cost to its provider's spend; returns whether that put the provider out
/// of (or back in) its budget.
fn note_spend(
    config: &Config,
    durable: &mut DurableState,
    attempt: &pb::AttemptOutcome,
    now: i64,
) -> bool {
    let Some(cost) = attempt_cost(config, attempt) else {
        return false;
    };
    let Some(provider) = config.providers.iter().find(|p| p.id == attempt.provider) else {
        return false;
    };
    let spend = durable.spend.entry(provider.id.clone()).or_default();
    let out = |s: &Spend| provider.budget.as_ref().and_then(|b| s.out_until(b, now));
    let before = out(spend);
    spend.add(now, cost);
    out(spend) != before
}

fn build_tables(config: &Config, state: &State, now: i64) -> Tables {
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
                reason: pb::KeyOutReason::Missing.into(),
                until_ms: 0,
                refused_fingerprint: 0,
            });
        } else if let Some(entry) = state.durable.blacklists.get(&id) {
            key_health.push(pb::KeyHealth {
                provider: provider.clone(),
                key: key.clone(),
                reason: pb::KeyOutReason::from(entry.reason).into(),
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
        virtual_keys: Vec::new(),
        routes: config.routes.iter().map(route_to_proto).collect(),
        cache: config.cache.map(|c| c.to_proto()),
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
            forward_rate_limit_headers: config.gateway.forward_rate_limit_headers,
            admin_token_sha256: state.admin_token_sha256.clone(),
        }),
        generated_at_ms: now,
        breakers: state
            .durable
            .breakers
            .iter()
            .filter(|(_, b)| b.phase != BreakerPhase::Closed)
            .map(|((scope, provider, key), b)| pb::BreakerState {
                scope: pb::BreakerScope::from(*scope).into(),
                provider: provider.clone(),
                key: key.clone(),
                state: pb::BreakerPhase::from(b.phase).into(),
                open_until_ms: b.open_until_ms,
            })
            .collect(),
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
            ..selection_to_proto(&config.selection)
        }),
        headroom: state
            .durable
            .headroom
            .iter()
            .filter(|(_, h)| h.reset_at_ms > now)
            .map(|(lane, h)| pb::Headroom {
                provider: lane.0.clone(),
                key: lane.1.clone(),
                model: lane.2.clone(),
                remaining_requests: h.remaining_requests,
                remaining_tokens: h.remaining_tokens,
                reset_at_ms: h.reset_at_ms,
                scope: key_scope(config, &lane.0, &lane.1),
                as_of_ms: state.headroom_as_of.get(lane).copied().unwrap_or(0),
            })
            .chain(state.estimated.iter().cloned())
            .collect(),
        provider_health: config
            .providers
            .iter()
            .filter_map(|p| {
                let budget = p.budget.as_ref()?;
                let until = state.durable.spend.get(&p.id)?.out_until(budget, now)?;
                Some(pb::ProviderHealth {
                    provider: p.id.clone(),
                    reason: pb::ProviderOutReason::Budget.into(),
                    until_ms: until,
                })
            })
            .collect(),
        resets: state
            .resets
            .iter()
            .map(|((provider, key), at)| pb::HoldReset {
                provider: provider.clone(),
                key: key.clone(),
                at_ms: *at,
            })
            .collect(),
        budgets: state.budgets.to_proto(&config.budgets, now),
    };
    Tables {
        virtual_keys: state.published_keys.clone(),
        ..Tables::from_snapshot(state.version, snapshot)
    }
}

fn published_keys(keys: &[VirtualKeyRecord]) -> BTreeMap<String, pb::VirtualKey> {
    keys.iter()
        .map(|k| {
            let k = k.to_proto();
            (k.sha256.clone(), k)
        })
        .collect()
}

fn provider_to_proto(p: &Provider, secrets: &BTreeMap<KeyId, Option<Secret>>) -> pb::Provider {
    pb::Provider {
        id: p.id.clone(),
        kind: pb::ProviderKind::from(p.kind).into(),
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
        max_input_tokens: p.facts.max_input_tokens,
        max_output_tokens: p.facts.max_output_tokens,
        daily_reset_zone: p.facts.daily_reset.map(|z| z.text()).unwrap_or_default(),
        requests_window: pb::RateLimitWindow::from(p.facts.requests_window).into(),
        tokens_window: pb::RateLimitWindow::from(p.facts.tokens_window).into(),
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
                    scope: k.scope.clone().unwrap_or_default(),
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
                    .map(|c| pb::Capability::from(*c).into())
                    .collect(),
                weight: m.weight.unwrap_or(1.0),
                identity: m.identity().to_owned(),
                dimensions: m.dimensions.unwrap_or(0),
                family: family_of(m).name,
                family_rank: family_of(m).rank,
            })
            .collect(),
        terms: Some(terms_to_proto(p)),
    }
}

/// The selection settings beyond the latency and headroom thresholds: strategy, score
/// weights, the pool's filters and affinity.
fn selection_to_proto(s: &crate::config::SelectionConfig) -> pb::Selection {
    use crate::config::{SelectionMode, SelectionStrategy};
    let strategy = match s.strategy {
        SelectionStrategy::Tiers => pb::SelectionStrategy::Tiers,
        SelectionStrategy::Headroom => pb::SelectionStrategy::Headroom,
        SelectionStrategy::Score => pb::SelectionStrategy::Score,
    };
    pb::Selection {
        strategy: strategy.into(),
        score_alpha: s.score.alpha,
        score_beta: s.score.beta,
        score_gamma: s.score.gamma,
        unreported_weight: s.unreported_weight,
        production: s.mode == SelectionMode::Production,
        region: s.region.clone().unwrap_or_default(),
        forbid_prompt_logging: !s.allow_prompt_logging,
        keyless_fallback: s.keyless_fallback,
        affinity_idle_ms: if s.affinity.enabled {
            s.affinity.idle_ms
        } else {
            0
        },
        ..pb::Selection::default()
    }
}

fn terms_to_proto(p: &Provider) -> pb::ProviderTerms {
    let t = terms_of(p.kind.as_str(), p.terms.as_ref());
    pb::ProviderTerms {
        production_forbidden: !t.production_allowed,
        trains_on_prompts: t.trains_on_prompts,
        blocked_regions: t.blocked_regions,
        keyless: t.keyless,
    }
}

pub fn policy_to_proto(p: &PolicyConfig) -> pb::Policy {
    let set_lists = [
        (pb::PolicyList::Fallbacks, p.fallbacks.is_some()),
        (pb::PolicyList::Providers, p.providers.is_some()),
        (pb::PolicyList::Require, p.require.is_some()),
        (pb::PolicyList::Candidates, p.candidates.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(list, _)| list.into())
    .collect();
    pb::Policy {
        set_lists,
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
            .map(|c| pb::Capability::from(*c).into())
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
                        when: c
                            .when
                            .iter()
                            .flatten()
                            .map(|t| pb::FallbackTrigger::from(*t).into())
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
        pinned: p.pinned.unwrap_or(false),
        prompt_cache: p.prompt_cache.map(|c| c.to_proto()),
        auto_sort: p.auto_sort,
        reset_interval_ms: p.reset_interval_ms,
        cache: p.cache,
    }
}

pub fn route_to_proto(r: &crate::config::RouteConfig) -> pb::RouteRule {
    pb::RouteRule {
        name: r.name.clone(),
        priority: r.priority.unwrap_or(0),
        enabled: r.enabled.unwrap_or(true),
        task_type: r.matches.task_type.clone(),
        user_tier: r.matches.user_tier.clone(),
        feature: r.matches.feature.clone(),
        profile: r.target.profile.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::config::secrets::{fingerprint, MapEnv};
    use std::path::Path;
    use std::sync::atomic::{AtomicI64, Ordering};

    use crate::clock::TestClock;

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
            outcome: pb::AttemptResult::Error.into(),
            error_class: ai_router_contract::failure::ErrorClass::parse(class)
                .map_or(pb::ErrorClass::Unspecified, pb::ErrorClass::from)
                .into(),
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
            openai.models[0]
                .capabilities()
                .map(pb::Capability::text)
                .collect::<Vec<_>>(),
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
        assert_eq!(s.key_health[0].reason().text(), "missing");
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
        assert_eq!(entry.reason().text(), "auth");
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
    fn an_unsupported_key_type_is_out_until_its_secret_changes_whatever_auth_disable_ms_says(
    ) -> Result<(), String> {
        let f = fixture(&POOL.replace(
            "rateLimitCooldownMs: 5000",
            "rateLimitCooldownMs: 5000, authDisableMs: 1000",
        ))?;
        let mut refused = attempt("openai", "openai-2", "auth");
        refused.provider_code = ai_router_contract::failure::UNSUPPORTED_KEY_TYPE.into();
        let (_, events) = f.engine.apply_report(&batch(vec![refused]));
        let entry = snapshot(&f.engine)
            .key_health
            .into_iter()
            .find(|h| h.key == "openai-2")
            .unwrap_or_default();
        assert_eq!(entry.until_ms, 0);
        assert_eq!(entry.refused_fingerprint, fingerprint("sk-two"));
        assert!(
            events.iter().any(|e| matches!(e, EngineEvent::KeyDisabled { code: Some(c), until_ms: 0, .. } if c == "unsupported_key_type")),
            "{events:?}"
        );
        f.clock.0.store(10_000_000, Ordering::SeqCst);
        f.engine.expire();
        assert!(snapshot(&f.engine)
            .key_health
            .iter()
            .any(|h| h.key == "openai-2"));
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
                .map(|h| (h.reason().text().to_owned(), h.until_ms))
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
        ok.outcome = pb::AttemptResult::Success.into();
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
            f.engine.config(),
            f.env.clone(),
            f.clock.clone(),
            Vec::new(),
            durable.clone(),
        );
        assert_eq!(again.durable(), durable);
        // A new secret meanwhile: lifted at start.
        lock(&f.env.0).set("OPENAI_API_KEY", "sk-new");
        let lifted = Engine::new(
            f.engine.config(),
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

    // ---- breakers, leases, headroom, budgets, the shared store ------------------------------

    const BREAKERS: &str = "
resilience:
  keyBreaker: { failureThreshold: 2, cooldownMs: 1000, maxCooldownMs: 3000 }
  providerBreaker: { failureThreshold: 3, cooldownMs: 2000, maxCooldownMs: 4000 }
providers:
  - id: openai
    kind: openai
    keysFromEnv: OPENAI
    budget: { costPerDay: 1, costPerMonth: 2 }
    models: [{ id: gpt-4o-mini, aliases: [fast], cost: { input: 0.15, output: 0.6 } }]
  - id: local
    baseUrl: http://127.0.0.1:9000/v1/
    keys: [{ alias: a, env: LOCAL_A }]
    models: [{ id: llama }]
";

    fn test_env() -> Arc<SharedEnv> {
        let env = Arc::new(SharedEnv::default());
        {
            let mut vars = lock(&env.0);
            vars.set("OPENAI_API_KEY", "sk-one");
            vars.set("OPENAI_API_KEY_2", "sk-two");
            vars.set("LOCAL_A", "sk-a");
        }
        env
    }

    fn engine_on(
        text: &str,
        env: Arc<SharedEnv>,
        clock: Arc<TestClock>,
        store: Arc<dyn StateStore>,
    ) -> Result<Arc<Engine>, String> {
        let config = parse(text)
            .and_then(|f| f.resolve(env.as_ref(), Path::new(".")))
            .map_err(|e| e.to_string())?;
        let durable = store.load().map_err(|e| e.to_string())?;
        Ok(Engine::with_store(
            Arc::new(config),
            env,
            clock,
            Vec::new(),
            durable,
            store,
        ))
    }

    fn breaker_of(engine: &Engine, scope: &str, key: &str) -> Option<(String, i64)> {
        snapshot(engine)
            .breakers
            .into_iter()
            .find(|b| b.scope().text() == scope && b.key == key)
            .map(|b| (b.state().text().to_owned(), b.open_until_ms))
    }

    fn success(provider: &str, key: &str) -> pb::AttemptOutcome {
        let mut ok = attempt(provider, key, "");
        ok.outcome = pb::AttemptResult::Success.into();
        ok
    }

    fn temp_db(name: &str) -> Result<std::path::PathBuf, String> {
        let dir =
            std::env::temp_dir().join(format!("ai-router-engine-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        Ok(dir.join("state.sqlite"))
    }

    fn sqlite(path: &Path) -> Result<Arc<dyn StateStore>, String> {
        crate::store::state::SqliteStateStore::open(path)
            .map(|s| Arc::new(s) as Arc<dyn StateStore>)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn key_breaker_opens_half_opens_doubles_and_closes() -> Result<(), String> {
        let f = fixture(BREAKERS)?;
        let e = &f.engine;
        // Classes that never count.
        for class in [
            "rate_limit",
            "quota",
            "auth",
            "invalid_request",
            "cancelled",
        ] {
            e.apply_report(&batch(vec![attempt("local", "a", class)]));
        }
        assert!(snapshot(e).breakers.is_empty());
        // One failure, a success, one failure: never two in a row.
        let (_, events) = e.apply_report(&batch(vec![
            attempt("openai", "openai-1", "transient"),
            success("openai", "openai-1"),
            attempt("openai", "openai-1", "network"),
        ]));
        assert!(events.is_empty());
        assert!(snapshot(e).breakers.is_empty());
        let (_, events) = e.apply_report(&batch(vec![attempt("openai", "openai-1", "timeout")]));
        assert_eq!(
            events,
            vec![EngineEvent::Breaker {
                scope: BreakerScope::Key,
                provider: "openai".into(),
                key: "openai-1".into(),
                from: BreakerPhase::Closed,
                to: BreakerPhase::Open,
            }]
        );
        assert_eq!(
            breaker_of(e, "key", "openai-1"),
            Some(("open".into(), 1_001_000))
        );
        // Closed breakers are not pushed; the provider's has counted 2 of 3 only.
        assert_eq!(snapshot(e).breakers.len(), 1);
        // Past the cooldown: half-open from then.
        f.clock.0.store(1_001_000, Ordering::SeqCst);
        assert!(e.expire());
        assert_eq!(
            breaker_of(e, "key", "openai-1"),
            Some(("half_open".into(), 1_001_000))
        );
        // The probe fails: open for twice the cooldown, then capped at the max.
        let mut probe = attempt("openai", "openai-1", "stream");
        probe.probe = true;
        f.clock.0.store(1_001_500, Ordering::SeqCst);
        let (_, events) = e.apply_report(&batch(vec![probe.clone()]));
        assert!(events.contains(&EngineEvent::Breaker {
            scope: BreakerScope::Key,
            provider: "openai".into(),
            key: "openai-1".into(),
            from: BreakerPhase::HalfOpen,
            to: BreakerPhase::Open,
        }));
        assert_eq!(
            breaker_of(e, "key", "openai-1"),
            Some(("open".into(), 1_003_500))
        );
        f.clock.0.store(1_003_500, Ordering::SeqCst);
        e.expire();
        e.apply_report(&batch(vec![probe.clone()]));
        assert_eq!(
            breaker_of(e, "key", "openai-1"),
            Some(("open".into(), 1_006_500))
        );
        // A retry-after later than the cooldown wins.
        f.clock.0.store(1_006_500, Ordering::SeqCst);
        e.expire();
        probe.retry_at_ms = 1_100_000;
        e.apply_report(&batch(vec![probe]));
        assert_eq!(
            breaker_of(e, "key", "openai-1"),
            Some(("open".into(), 1_100_000))
        );
        // Any success closes it.
        let (_, events) = e.apply_report(&batch(vec![success("openai", "openai-1")]));
        assert!(events.iter().any(|ev| matches!(
            ev,
            EngineEvent::Breaker {
                scope: BreakerScope::Key,
                to: BreakerPhase::Closed,
                ..
            }
        )));
        assert!(snapshot(e).breakers.is_empty());
        Ok(())
    }

    #[test]
    fn provider_breaker_is_fed_by_all_its_keys() -> Result<(), String> {
        let f = fixture(BREAKERS)?;
        let e = &f.engine;
        e.apply_report(&batch(vec![
            attempt("openai", "openai-1", "transient"),
            attempt("openai", "openai-2", "transient"),
        ]));
        assert!(snapshot(e).breakers.is_empty());
        // A success on either key resets the provider's count.
        e.apply_report(&batch(vec![success("openai", "openai-2")]));
        e.apply_report(&batch(vec![
            attempt("openai", "openai-1", "transient"),
            attempt("openai", "openai-2", "transient"),
        ]));
        assert_eq!(breaker_of(e, "provider", ""), None);
        let mut failed = attempt("openai", "openai-2", "transient");
        failed.retry_at_ms = 1_500_000;
        let (_, events) = e.apply_report(&batch(vec![failed]));
        assert!(events.iter().any(|ev| matches!(
            ev,
            EngineEvent::Breaker {
                scope: BreakerScope::Provider,
                key,
                from: BreakerPhase::Closed,
                to: BreakerPhase::Open,
                ..
            } if key.is_empty()
        )));
        assert_eq!(
            breaker_of(e, "provider", ""),
            Some(("open".into(), 1_500_000))
        );
        // The retry-after cooled the lane too.
        assert!(snapshot(e)
            .cooldowns
            .iter()
            .any(|c| c.key == "openai-2" && c.until_ms == 1_500_000));
        Ok(())
    }

    fn probe_lease_contention(engines: &[Arc<Engine>], clock: &TestClock) -> Result<(), String> {
        let e = &engines[0];
        let id: BreakerId = (BreakerScope::Key, "openai".into(), "openai-1".into());
        for _ in 0..2 {
            e.apply_report(&batch(vec![attempt("openai", "openai-1", "transient")]));
        }
        // Still open: refused until the cooldown ends.
        let reply = e
            .lease(&id, "early", 5_000)
            .map_err(|err| err.to_string())?;
        assert_eq!((reply.granted, reply.retry_at_ms), (false, 1_001_000));
        clock.0.store(1_001_000, Ordering::SeqCst);
        for engine in engines {
            engine.expire();
        }
        let barrier = std::sync::Barrier::new(20);
        let replies: Vec<(usize, pb::LeaseReply)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..20)
                .map(|i| {
                    let engine = engines[i % engines.len()].clone();
                    let (barrier, id) = (&barrier, id.clone());
                    scope.spawn(move || {
                        barrier.wait();
                        engine
                            .lease(&id, &probe_holder(&format!("req-{i}"), 1), 5_000)
                            .map(|r| (i, r))
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().ok())
                .filter_map(Result::ok)
                .collect()
        });
        assert_eq!(replies.len(), 20);
        let granted: Vec<usize> = replies
            .iter()
            .filter(|(_, r)| r.granted)
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(granted.len(), 1, "{replies:?}");
        assert!(replies
            .iter()
            .filter(|(_, r)| !r.granted)
            .all(|(_, r)| r.retry_at_ms == 1_006_000));
        // Another request's probe outcome does not end it (a rate limit leaves the breaker
        // half-open); the holder's does.
        let mut other = attempt("openai", "openai-1", "rate_limit");
        other.probe = true;
        other.request_id = "someone-else".into();
        other.attempt = 1;
        e.apply_report(&batch(vec![other]));
        let held = e
            .lease(&id, &probe_holder("next", 1), 5_000)
            .map_err(|err| err.to_string())?;
        assert!(!held.granted);
        let mut mine = attempt("openai", "openai-1", "rate_limit");
        mine.probe = true;
        mine.request_id = format!("req-{}", granted[0]);
        mine.attempt = 1;
        e.apply_report(&batch(vec![mine]));
        let next = e
            .lease(&id, &probe_holder("next", 1), 5_000)
            .map_err(|err| err.to_string())?;
        assert!(next.granted);
        // Now "next" holds it; its probe succeeds: closed, and the lease is gone.
        let mut probe = success("openai", "openai-1");
        probe.probe = true;
        probe.request_id = "next".into();
        probe.attempt = 1;
        e.apply_report(&batch(vec![probe]));
        assert!(breaker_of(e, "key", "openai-1").is_none());
        let again = e
            .lease(&id, "later:1", 5_000)
            .map_err(|err| err.to_string())?;
        assert!(again.granted);
        // A lease that is never released ends with its TTL.
        let blocked = e
            .lease(&id, "blocked:1", 5_000)
            .map_err(|err| err.to_string())?;
        assert!(!blocked.granted);
        clock.0.store(1_006_000, Ordering::SeqCst);
        let after_ttl = e
            .lease(&id, "late:1", 5_000)
            .map_err(|err| err.to_string())?;
        assert!(after_ttl.granted);
        Ok(())
    }

    /// A probe's outcome frees its own lease only: request `1` never frees `12#1`'s.
    fn lease_release_matches_the_whole_holder(store: &dyn StateStore) -> Result<(), String> {
        let id: BreakerId = (BreakerScope::Key, "p".to_string(), "k".to_string());
        let held = |store: &dyn StateStore| -> Result<bool, String> {
            let grant = store
                .lease(&id, "someone-else#1", 1_000, 60_000)
                .map_err(|e| e.to_string())?;
            Ok(!matches!(grant, LeaseGrant::Granted))
        };
        let grant = store
            .lease(&id, &probe_holder("12", 1), 1_000, 60_000)
            .map_err(|e| e.to_string())?;
        assert!(matches!(grant, LeaseGrant::Granted));
        for other in [probe_holder("1", 1), probe_holder("", 1), "12".to_string()] {
            store
                .release(&id, Some(&other))
                .map_err(|e| e.to_string())?;
            assert!(held(store)?, "{other:?} freed the lease of 12#1");
        }
        store
            .release(&id, Some(&probe_holder("12", 1)))
            .map_err(|e| e.to_string())?;
        assert!(!held(store)?, "the holder's own outcome frees it");
        // A breaker that moves on frees whoever holds it.
        store.release(&id, None).map_err(|e| e.to_string())?;
        assert!(!held(store)?);
        Ok(())
    }

    #[test]
    fn lease_release_matches_the_whole_holder_in_memory() -> Result<(), String> {
        lease_release_matches_the_whole_holder(&MemoryStateStore::default())
    }

    #[test]
    fn lease_release_matches_the_whole_holder_in_sqlite() -> Result<(), String> {
        let path = temp_db("lease_holder")?;
        let store = sqlite(&path)?;
        let result = lease_release_matches_the_whole_holder(store.as_ref());
        let _ = std::fs::remove_dir_all(path.parent().unwrap_or(Path::new("/nonexistent")));
        result
    }

    #[test]
    fn one_probe_lease_among_twenty_in_memory() -> Result<(), String> {
        let f = fixture(BREAKERS)?;
        probe_lease_contention(std::slice::from_ref(&f.engine), &f.clock)
    }

    #[test]
    fn one_probe_lease_among_twenty_across_two_sqlite_engines() -> Result<(), String> {
        let path = temp_db("lease")?;
        let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
        let a = engine_on(BREAKERS, test_env(), clock.clone(), sqlite(&path)?)?;
        let b = engine_on(BREAKERS, test_env(), clock.clone(), sqlite(&path)?)?;
        // `b` learns of the breaker through the store.
        let share = |from: &Engine, to: &Engine| -> Result<(), String> {
            from.sync_store(from.store.as_ref())
                .map_err(|e| e.to_string())?;
            to.sync_store(to.store.as_ref())
                .map_err(|e| e.to_string())?;
            Ok(())
        };
        let result = probe_lease_contention(&[a.clone(), b.clone()], &clock);
        share(&a, &b)?;
        let _ = std::fs::remove_dir_all(path.parent().unwrap_or(Path::new("/nonexistent")));
        result
    }

    #[test]
    fn a_reset_clears_one_key_or_everything_and_is_pushed() -> Result<(), String> {
        let f = fixture(BREAKERS)?;
        let e = &f.engine;
        e.apply_report(&batch(vec![
            attempt("openai", "openai-1", "quota"),
            attempt("openai", "openai-1", "rate_limit"),
        ]));
        let s = snapshot(e);
        assert_eq!((s.key_health.len(), s.cooldowns.len()), (1, 1));
        assert_eq!(
            e.reset(None, Some("openai-1")),
            Err(ResetError::KeyWithoutProvider)
        );
        assert!(matches!(
            e.reset(Some("nope"), None),
            Err(ResetError::UnknownProvider(_))
        ));
        assert!(matches!(
            e.reset(Some("openai"), Some("nope")),
            Err(ResetError::UnknownKey { .. })
        ));
        let v = e.version();
        let counts = e.reset(Some("openai"), Some("openai-1"));
        assert_eq!(
            counts,
            Ok(ResetCounts {
                blacklists: 1,
                cooldowns: 1,
                breakers: 0,
                headroom: 0
            })
        );
        assert_eq!(e.version(), v + 1, "published at once");
        let s = snapshot(e);
        assert!(s.key_health.is_empty() && s.cooldowns.is_empty());
        assert_eq!(s.resets.len(), 1);
        assert_eq!(
            (s.resets[0].provider.as_str(), s.resets[0].key.as_str()),
            ("openai", "openai-1")
        );
        // Everything: one mark per provider, the whole provider.
        assert_eq!(e.reset(None, None), Ok(ResetCounts::default()));
        let marks = snapshot(e).resets;
        assert!(marks
            .iter()
            .any(|r| r.provider == "openai" && r.key.is_empty()));
        // Marks are pushed for a minute, then dropped.
        f.clock
            .0
            .fetch_add(RESET_MARK.as_millis() as i64, Ordering::SeqCst);
        assert!(e.expire());
        assert!(snapshot(e).resets.is_empty());
        Ok(())
    }

    #[test]
    fn the_same_headroom_again_without_a_reset_is_no_news() -> Result<(), String> {
        let f = fixture(BREAKERS)?;
        let e = &f.engine;
        let mut ok = success("openai", "openai-1");
        ok.remaining_requests = 5;
        ok.remaining_tokens = 1_000;
        e.apply_report(&batch(vec![ok.clone()]));
        let v = e.version();
        f.clock.0.fetch_add(1_000, Ordering::SeqCst);
        e.apply_report(&batch(vec![ok.clone(), ok.clone()]));
        assert_eq!(e.version(), v, "constant headers publish nothing");
        ok.remaining_requests = 4;
        e.apply_report(&batch(vec![ok]));
        assert_eq!(e.version(), v + 1, "a new value is news");
        Ok(())
    }

    #[test]
    fn headroom_alone_waits_for_the_next_flush_and_holds_do_not() -> Result<(), String> {
        let f = fixture(BREAKERS)?;
        let e = &f.engine;
        e.coalesce_headroom(true);
        let v = e.version();
        let mut ok = success("openai", "openai-1");
        ok.remaining_requests = 5;
        ok.remaining_tokens = 1_000;
        ok.ratelimit_reset_at_ms = 1_030_000;
        e.apply_report(&batch(vec![ok.clone()]));
        ok.remaining_requests = 4;
        e.apply_report(&batch(vec![ok]));
        assert_eq!(e.version(), v, "headroom alone is not published at once");
        assert!(snapshot(e).headroom.is_empty());
        assert!(e.flush());
        assert_eq!(e.version(), v + 1, "two reports, one version");
        assert_eq!(snapshot(e).headroom[0].remaining_requests, 4);
        assert!(!e.flush(), "nothing waits");
        // A cooldown is published at once, with any headroom waiting.
        let mut limited = attempt("openai", "openai-1", "rate_limit");
        limited.remaining_requests = 0;
        limited.ratelimit_reset_at_ms = 1_020_000;
        e.apply_report(&batch(vec![limited]));
        assert_eq!(e.version(), v + 2);
        let s = snapshot(e);
        assert_eq!(s.cooldowns.len(), 1);
        assert_eq!(s.headroom[0].remaining_requests, 0);
        Ok(())
    }

    #[test]
    fn headroom_is_the_last_report_until_its_reset() -> Result<(), String> {
        let f = fixture(BREAKERS)?;
        let e = &f.engine;
        let mut ok = success("openai", "openai-1");
        ok.remaining_requests = 5;
        ok.remaining_tokens = 1_000;
        ok.ratelimit_reset_at_ms = 1_030_000;
        e.apply_report(&batch(vec![ok.clone()]));
        let h = snapshot(e).headroom;
        assert_eq!(h.len(), 1);
        assert_eq!(
            (
                h[0].model.as_str(),
                h[0].remaining_requests,
                h[0].remaining_tokens,
                h[0].reset_at_ms
            ),
            ("gpt-4o-mini", 5, 1_000, 1_030_000)
        );
        // The last value wins, a 429 included; -1 stays "not reported".
        let mut limited = attempt("openai", "openai-1", "rate_limit");
        limited.remaining_requests = 0;
        limited.remaining_tokens = -1;
        limited.ratelimit_reset_at_ms = 1_020_000;
        e.apply_report(&batch(vec![limited]));
        let h = snapshot(e).headroom;
        assert_eq!(
            (
                h[0].remaining_requests,
                h[0].remaining_tokens,
                h[0].reset_at_ms
            ),
            (0, -1, 1_020_000)
        );
        // Nothing reported (or an unset message): unchanged.
        let v = e.version();
        let mut silent = success("openai", "openai-1");
        silent.remaining_requests = -1;
        silent.remaining_tokens = -1;
        e.apply_report(&batch(vec![silent, success("openai", "openai-1")]));
        assert_eq!(e.version(), v);
        // No reset named: the default window.
        let mut no_reset = success("local", "a");
        no_reset.model = "llama".into();
        no_reset.remaining_requests = 7;
        no_reset.remaining_tokens = -1;
        e.apply_report(&batch(vec![no_reset]));
        assert!(snapshot(e)
            .headroom
            .iter()
            .any(|h| h.key == "a" && h.reset_at_ms == 1_000_000 + HEADROOM_DEFAULT_WINDOW_MS));
        // The reset passes: dropped.
        f.clock.0.store(1_020_000, Ordering::SeqCst);
        assert!(e.expire());
        let h = snapshot(e).headroom;
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].key, "a");
        f.clock
            .0
            .store(1_000_000 + HEADROOM_DEFAULT_WINDOW_MS, Ordering::SeqCst);
        e.expire();
        assert!(snapshot(e).headroom.is_empty());
        Ok(())
    }

    fn with_usage(prompt: u64, completion: u64) -> pb::AttemptOutcome {
        let mut ok = success("openai", "openai-1");
        ok.usage = Some(pb::Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            ..Default::default()
        });
        ok
    }

    #[test]
    fn budgets_roll_over_by_utc_day_and_month() -> Result<(), String> {
        let f = fixture(BREAKERS)?;
        let e = &f.engine;
        const DAY: i64 = 86_400_000;
        // 4M prompt tokens at 0.15 = 0.6; 1M completion at 0.6 = 0.6.
        e.apply_report(&batch(vec![with_usage(4_000_000, 0)]));
        assert!(snapshot(e).provider_health.is_empty());
        let (_, _) = e.apply_report(&batch(vec![with_usage(0, 1_000_000)]));
        let health = snapshot(e).provider_health;
        assert_eq!(health.len(), 1);
        assert_eq!(
            (
                health[0].provider.as_str(),
                health[0].reason().text(),
                health[0].until_ms
            ),
            ("openai", "budget", DAY)
        );
        assert!((e.durable().spend["openai"].day_cost - 1.2).abs() < 1e-9);
        // A model without a cost (and another provider) counts nothing.
        let mut free = with_usage(1_000_000, 1_000_000);
        free.provider = "local".into();
        free.key = "a".into();
        free.model = "llama".into();
        e.apply_report(&batch(vec![free]));
        assert!(!e.durable().spend.contains_key("local"));
        // The next UTC day: back in.
        f.clock.0.store(DAY, Ordering::SeqCst);
        assert!(e.expire());
        assert!(snapshot(e).provider_health.is_empty());
        // 0.6 more today brings the month to 1.8; 0.3 more crosses 2: out until February.
        e.apply_report(&batch(vec![with_usage(4_000_000, 0)]));
        assert!(snapshot(e).provider_health.is_empty());
        f.clock.0.store(2 * DAY, Ordering::SeqCst);
        e.apply_report(&batch(vec![with_usage(2_000_000, 0)]));
        let health = snapshot(e).provider_health;
        assert_eq!(health.len(), 1);
        assert_eq!(health[0].until_ms, 31 * DAY);
        // Still out on another day of January.
        f.clock.0.store(20 * DAY, Ordering::SeqCst);
        e.expire();
        assert_eq!(snapshot(e).provider_health.len(), 1);
        f.clock.0.store(31 * DAY, Ordering::SeqCst);
        assert!(e.expire());
        assert!(snapshot(e).provider_health.is_empty());
        Ok(())
    }

    #[test]
    fn state_survives_a_restart_with_sqlite() -> Result<(), String> {
        let path = temp_db("restart")?;
        let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
        let env = test_env();
        let first = engine_on(BREAKERS, env.clone(), clock.clone(), sqlite(&path)?)?;
        let mut refused = attempt("openai", "openai-2", "auth");
        refused.fingerprint = fingerprint("sk-two");
        let mut headroom = success("local", "a");
        headroom.model = "llama".into();
        headroom.remaining_requests = 3;
        headroom.remaining_tokens = 300;
        headroom.ratelimit_reset_at_ms = 1_050_000;
        first.apply_report(&batch(vec![
            refused,
            attempt("openai", "openai-1", "rate_limit"),
            headroom,
            attempt("local", "a", "transient"),
            attempt("local", "a", "transient"),
            with_usage(0, 2_000_000),
        ]));
        first
            .sync_store(first.store.as_ref())
            .map_err(|e| e.to_string())?;
        let before = snapshot(&first);
        let saved = first.durable();
        drop(first);

        let second = engine_on(BREAKERS, env, clock.clone(), sqlite(&path)?)?;
        assert_eq!(second.durable(), saved);
        let after = snapshot(&second);
        assert_eq!(after.key_health, before.key_health);
        assert_eq!(after.cooldowns, before.cooldowns);
        assert_eq!(after.breakers, before.breakers);
        assert_eq!(after.breakers.len(), 1);
        assert_eq!(after.headroom, before.headroom);
        assert_eq!(after.provider_health, before.provider_health);
        assert_eq!(after.provider_health.len(), 1);
        assert_eq!(
            after
                .key_health
                .iter()
                .find(|h| h.key == "openai-2")
                .map(|h| h.refused_fingerprint),
            Some(fingerprint("sk-two"))
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap_or(Path::new("/nonexistent")));
        Ok(())
    }

    #[test]
    fn two_engines_on_one_sqlite_file_share_blacklists_and_spend() -> Result<(), String> {
        let path = temp_db("shared")?;
        let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
        let (env_a, env_b) = (test_env(), test_env());
        let a = engine_on(BREAKERS, env_a.clone(), clock.clone(), sqlite(&path)?)?;
        let b = engine_on(BREAKERS, env_b.clone(), clock.clone(), sqlite(&path)?)?;
        let sync = |e: &Engine| {
            e.sync_store(e.store.as_ref())
                .map_err(|err| err.to_string())
        };
        sync(&a)?;
        sync(&b)?;
        let mut refused = attempt("openai", "openai-1", "quota");
        refused.retry_at_ms = 2_000_000;
        a.apply_report(&batch(vec![refused, with_usage(0, 500_000)]));
        b.apply_report(&batch(vec![with_usage(0, 500_000)]));
        sync(&a)?;
        let v = b.version();
        assert!(sync(&b)?);
        assert!(b.version() > v);
        let seen = snapshot(&b)
            .key_health
            .into_iter()
            .find(|h| h.key == "openai-1")
            .map(|h| (h.reason().text().to_owned(), h.until_ms));
        assert_eq!(seen, Some(("quota".into(), 2_000_000)));
        // Spend is added, not overwritten: 0.3 each, 0.6 in all, seen by both.
        sync(&a)?;
        for e in [&a, &b] {
            assert!((e.durable().spend["openai"].day_cost - 0.6).abs() < 1e-9);
        }
        // A blacklist lifted by a rotation in one process is lifted in the other.
        lock(&env_a.0).set("OPENAI_API_KEY", "sk-one-new");
        let events = a.refresh_secrets();
        assert!(matches!(
            &events[..],
            [EngineEvent::KeyRestored { was: "quota", .. }]
        ));
        sync(&a)?;
        assert!(sync(&b)?);
        let key: KeyId = ("openai".into(), "openai-1".into());
        assert!(!b.durable().blacklists.contains_key(&key));
        // Expiry in one process reaches the other.
        let mut refused = attempt("openai", "openai-2", "quota");
        refused.retry_at_ms = 1_500_000;
        b.apply_report(&batch(vec![refused]));
        sync(&b)?;
        sync(&a)?;
        assert!(snapshot(&a).key_health.iter().any(|h| h.key == "openai-2"));
        clock.0.store(1_500_000, Ordering::SeqCst);
        a.expire();
        sync(&a)?;
        sync(&b)?;
        assert!(snapshot(&b).key_health.iter().all(|h| h.key != "openai-2"));
        let _ = std::fs::remove_dir_all(path.parent().unwrap_or(Path::new("/nonexistent")));
        Ok(())
    }

    #[test]
    fn a_rotated_file_secret_lifts_an_auth_blacklist() -> Result<(), String> {
        let dir =
            std::env::temp_dir().join(format!("ai-router-engine-{}-file", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let secret = dir.join("key");
        std::fs::write(&secret, "sk-file-1\n").map_err(|e| e.to_string())?;
        let text = format!(
            "providers:\n  - {{ id: p, baseUrl: 'http://h/v1', keys: [{{ alias: f, file: {} }}], models: [{{ id: m }}] }}\n",
            secret.display()
        );
        let f = fixture(&text)?;
        let mut refused = attempt("p", "f", "auth");
        refused.fingerprint = fingerprint("sk-file-1");
        f.engine.apply_report(&batch(vec![refused]));
        assert_eq!(snapshot(&f.engine).key_health.len(), 1);
        // Unchanged file: nothing happens.
        assert!(f.engine.refresh_secrets().is_empty());
        std::fs::write(&secret, "sk-file-2\n").map_err(|e| e.to_string())?;
        let events = f.engine.refresh_secrets();
        assert_eq!(
            events,
            vec![EngineEvent::KeyRestored {
                provider: "p".into(),
                key: "f".into(),
                was: "auth",
                reason: "secret_changed"
            }]
        );
        let s = snapshot(&f.engine);
        assert!(s.key_health.is_empty());
        assert_eq!(s.providers[0].keys[0].secret, "sk-file-2");
        std::fs::remove_dir_all(&dir).map_err(|e| e.to_string())?;
        Ok(())
    }

    #[test]
    fn every_snapshot_carries_resilience_and_selection() -> Result<(), String> {
        let f = fixture(BREAKERS)?;
        for _ in 0..2 {
            f.engine
                .apply_report(&batch(vec![attempt("local", "a", "transient")]));
        }
        let s = snapshot(&f.engine);
        assert!(!s.breakers.is_empty());
        let r = s.resilience.unwrap_or_default();
        assert_eq!(r.rate_limit_cooldown_ms, 10_000);
        assert_eq!(r.quota_blacklist_ms, 21_600_000);
        assert_eq!(r.auth_disable_ms, 0);
        assert_eq!(r.backoff.map(|b| b.max_ms), Some(5_000));
        assert_eq!(s.selection.map(|x| x.low_headroom), Some(1));
        Ok(())
    }

    // A reload (`replace_config`).
    fn reload_config(
        text: &str,
        env: &crate::config::secrets::MapEnv,
    ) -> Result<Arc<Config>, String> {
        parse(text)
            .and_then(|f| f.resolve(env, Path::new(".")))
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }

    const RELOAD_OLD: &str = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: A }, { alias: b, env: B }], models: [{ id: m }] }\n";
    const RELOAD_NEW: &str = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: A }], models: [{ id: m }] }\n  - { id: q, baseUrl: 'http://q/v1', keys: [{ alias: x, env: X }], models: [{ id: m }] }\n";

    #[test]
    fn a_new_pool_keeps_what_it_keeps_and_drops_the_rest() -> Result<(), String> {
        let env =
            crate::config::secrets::MapEnv::new([("A", "sk-a"), ("B", "sk-b"), ("X", "sk-x")]);
        let lane = |k: &str| ("p".to_owned(), k.to_owned(), "m".to_owned());
        let mut durable = DurableState::default();
        durable.cooldowns.insert(lane("a"), i64::MAX);
        durable.cooldowns.insert(lane("b"), i64::MAX);
        let engine = Engine::new(
            reload_config(RELOAD_OLD, &env)?,
            Arc::new(env.clone()),
            Arc::new(crate::clock::SystemClock),
            Vec::new(),
            durable,
        );
        let before = engine.version();
        let change = engine.replace_config(reload_config(RELOAD_NEW, &env)?);
        assert_eq!(
            change,
            reload::PoolChange {
                providers_added: vec!["q".into()],
                providers_removed: vec![],
                keys_added: vec!["q/x".into()],
                keys_removed: vec!["p/b".into()],
            }
        );
        assert!(engine.version() > before, "published");
        let cooldowns: Vec<_> = engine.durable().cooldowns.into_keys().collect();
        assert_eq!(
            cooldowns,
            vec![lane("a")],
            "the dropped key's cooldown went"
        );
        let snapshot = engine.current().snapshot.unwrap_or_default();
        let keys: Vec<(String, String, bool)> = snapshot
            .providers
            .iter()
            .flat_map(|p| {
                p.keys
                    .iter()
                    .map(|k| (p.id.clone(), k.alias.clone(), !k.secret.is_empty()))
            })
            .collect();
        assert_eq!(
            keys,
            vec![
                ("p".into(), "a".into(), true),
                ("q".into(), "x".into(), true)
            ],
            "the new key is resolved at once"
        );
        assert_eq!(engine.config().providers.len(), 2);
        Ok(())
    }

    // ---- a shared Redis store -----------------------------------------------------------------

    #[test]
    fn two_engines_on_one_redis_share_blacklists_and_one_probe() -> Result<(), String> {
        let redis = crate::store::servers::RedisServer::start().map_err(|e| e.to_string())?;
        let open = || -> Result<Arc<dyn StateStore>, String> {
            Ok(Arc::new(
                crate::store::redis::RedisStateStore::open(&redis.url(), "engines")
                    .map_err(|e| e.to_string())?,
            ))
        };
        let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
        let a = engine_on(BREAKERS, test_env(), clock.clone(), open()?)?;
        let b = engine_on(BREAKERS, test_env(), clock.clone(), open()?)?;
        a.apply_report(&batch(vec![attempt("openai", "openai-2", "auth")]));
        a.sync_store(a.store.as_ref()).map_err(|e| e.to_string())?;
        assert!(b.sync_store(b.store.as_ref()).map_err(|e| e.to_string())?);
        let out: Vec<String> = snapshot(&b)
            .key_health
            .iter()
            .map(|h| h.key.clone())
            .collect();
        assert_eq!(out, ["openai-2"], "b pushes the blacklist a saw");
        probe_lease_contention(&[a, b], &clock)
    }

    #[test]
    fn after_an_outage_the_store_gets_back_what_it_lost() -> Result<(), String> {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::default());
        let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
        let e = engine_on(BREAKERS, test_env(), clock.clone(), store.clone())?;
        e.apply_report(&batch(vec![attempt("openai", "openai-2", "auth")]));
        e.sync_store(store.as_ref()).map_err(|e| e.to_string())?;
        // The store restarts empty, and someone else writes a cooldown meanwhile.
        let mut other = DurableState::default();
        other
            .cooldowns
            .insert(("local".into(), "a".into(), "llama".into()), 2_000_000);
        store.save(&other).map_err(|e| e.to_string())?;
        e.forget_store_base();
        e.sync_store(store.as_ref()).map_err(|e| e.to_string())?;
        let held = store.load().map_err(|e| e.to_string())?;
        assert_eq!(held.blacklists.len(), 1, "ours is written back");
        assert_eq!(held.cooldowns.len(), 1, "theirs is kept");
        let s = snapshot(&e);
        assert_eq!((s.key_health.len(), s.cooldowns.len()), (1, 1));
        // Without forgetting the base, the empty store would have read as "deleted".
        store
            .save(&DurableState::default())
            .map_err(|e| e.to_string())?;
        e.sync_store(store.as_ref()).map_err(|e| e.to_string())?;
        assert!(snapshot(&e).key_health.is_empty());
        Ok(())
    }
}
