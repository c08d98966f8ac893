//! The engine's state and its read side: the types every part of the engine shares, and
//! what the rest of the control plane reads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ai_router_proto::tables::Tables;
use ai_router_proto::v1 as pb;
use tokio::sync::watch;

use super::{budgets, stats};

use super::events::{Event, EventBus};
use crate::clock::Clock;
use crate::config::secrets::{Env, Secret};
use crate::config::Config;
use crate::keys::record::VirtualKeyRecord;
use crate::store::breaker::{BreakerId, BreakerPhase, BreakerScope};
use crate::store::durable::{DurableState, KeyId, LaneId, StateStore};
use crate::store::lock;

/// How often secret references are resolved again.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// How often the state store is read for what other control planes wrote.
pub const STORE_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The least time between two exchanges with the state store: under load the engine changes
/// with nearly every report, and one exchange (read, compare, write) per report would cost
/// more than the reports themselves. Blacklists, cooldowns and breakers do not wait for it.
pub const STORE_MIN_GAP: Duration = Duration::from_millis(200);
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

pub(super) struct State {
    pub(super) version: u64,
    /// Current secret of every key, `None` when its reference resolves to nothing.
    pub(super) secrets: BTreeMap<KeyId, Option<Secret>>,
    pub(super) durable: DurableState,
    /// What the store held after the last exchange with it: the base of the three-way merge.
    pub(super) base: DurableState,
    pub(super) virtual_keys: Vec<VirtualKeyRecord>,
    /// `virtual_keys` as published, rebuilt only when they change.
    pub(super) published_keys: Arc<BTreeMap<String, pb::VirtualKey>>,
    /// SHA-256 (hex) of the admin token, pushed so the gateway can check it on `GET /health`.
    pub(super) admin_token_sha256: String,
    /// A change waits for the next [`Engine::flush`] (headroom only).
    pub(super) pending: bool,
    /// Budget policies' use in their current windows (`budgets`).
    pub(super) budgets: budgets::BudgetLedger,
    /// When the attempt that reported each lane's kept headroom began (pushed as `as_of_ms`:
    /// the filter counts its sends since then against it), and what was reported on the lane
    /// since. Not durable: after a restart the filter counts every recent send, which only
    /// errs on the safe side.
    pub(super) headroom_as_of: BTreeMap<LaneId, KeptSince>,
    /// The [`HeadroomSource`]'s figures as last published.
    pub(super) estimated: Vec<pb::Headroom>,
    /// Each discovering key's listed catalog (`discovery`).
    pub(super) listings: super::discovered::Listings,
}

/// A lane's kept headroom figure: when the attempt that reported it began, and the attempts
/// (and their tokens) reported on the lane since, which the figure less is what every Envoy
/// estimates is left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct KeptSince {
    pub(super) as_of_ms: i64,
    /// When this control plane kept the figure (its own clock, which the figure's age is
    /// taken on: `as_of_ms` is the data plane's).
    pub(super) kept_at_ms: i64,
    pub(super) attempts: u64,
    pub(super) tokens: u64,
}

/// Headroom the engine pushes besides what providers report: the quota ledger's estimates
/// (model empty: the whole billing scope). Asked on every [`Engine::flush`]; a change of a
/// figure publishes.
pub trait HeadroomSource: Send + Sync {
    fn headroom(&self, now_ms: i64) -> Vec<pb::Headroom>;
}

/// Whether two lists of headroom say the same (their times aside).
pub(super) fn same_figures(a: &[pb::Headroom], b: &[pb::Headroom]) -> bool {
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
    pub(super) config: RwLock<Arc<Config>>,
    pub(super) env: Arc<dyn Env>,
    pub(super) clock: Arc<dyn Clock>,
    /// Durable state and the probe leases.
    pub(super) store: Arc<dyn StateStore>,
    pub(super) state: Mutex<State>,
    pub(super) updates: watch::Sender<Arc<Tables>>,
    /// Headroom-only changes wait for [`Engine::flush`] instead of a publish each.
    pub(super) coalesce_headroom: std::sync::atomic::AtomicBool,
    /// See [`ReportObserver`].
    pub(super) report_observers: Mutex<Vec<Arc<dyn ReportObserver>>>,
    /// See [`HeadroomSource`].
    pub(super) headroom_source: Mutex<Option<Arc<dyn HeadroomSource>>>,
    pub(super) events: EventBus,
    pub(super) stats: stats::Stats,
    /// This control plane's own minute counts (`store::minute_calls`).
    pub(super) minute_calls: crate::store::minute_calls::LocalMinuteCalls,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("version", &self.version())
            .finish_non_exhaustive()
    }
}

impl Engine {
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

    pub(super) fn emit(&self, events: &[EngineEvent]) {
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

    /// [`Engine::current`] without the virtual keys, which at scale are most of it (10,000
    /// keys: about 4 MB copied per call): what `/metrics`, `/health` and the ledger view read,
    /// none of which looks at a key.
    pub fn current_without_keys(&self) -> pb::StateUpdate {
        let mut tables = (*self.tables()).clone();
        tables.virtual_keys = Arc::default();
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

    pub fn version(&self) -> u64 {
        lock(&self.state).version
    }

    pub fn durable(&self) -> DurableState {
        lock(&self.state).durable.clone()
    }

    /// Every budget's use by every subject in its current window: (budget, subject, use).
    pub fn budget_windows(&self) -> Vec<(String, String, super::budgets::WindowUse)> {
        let now = self.clock.now_ms();
        lock(&self.state)
            .budgets
            .windows(now)
            .map(|(name, subject, used)| (name.to_owned(), subject.to_owned(), *used))
            .collect()
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

    /// Adds an observer of every later report batch.
    pub fn add_report_observer(&self, observer: Arc<dyn ReportObserver>) {
        lock(&self.report_observers).push(observer);
    }

    /// Pushes `source`'s headroom too, from the next [`Engine::flush`] on.
    pub fn set_headroom_source(&self, source: Arc<dyn HeadroomSource>) {
        *lock(&self.headroom_source) = Some(source);
    }

    pub(super) fn observe_report(&self, batch: &pb::ReportBatch) {
        let observers = lock(&self.report_observers).clone();
        for observer in observers {
            observer.observe(batch);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Virtual keys from the key store, and report observers (usage accounting): see `keys::operations`
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

pub(super) fn ms(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The key's breaker and its provider's.
pub(super) fn breaker_ids(provider: &str, key: &str) -> [BreakerId; 2] {
    [
        (BreakerScope::Key, provider.to_owned(), key.to_owned()),
        (BreakerScope::Provider, provider.to_owned(), String::new()),
    ]
}

pub(super) fn breaker_event(id: &BreakerId, from: BreakerPhase, to: BreakerPhase) -> EngineEvent {
    EngineEvent::Breaker {
        scope: id.0,
        provider: id.1.clone(),
        key: id.2.clone(),
        from,
        to,
    }
}
