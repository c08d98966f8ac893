//! What the filters are sent: the tables built from the pool and the state, published on
//! every change (headroom coalesced).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};

use ai_router_proto::tables::Tables;
use ai_router_proto::v1 as pb;
use tokio::sync::watch;

use super::{budgets, reload, stats};

use super::events::EventBus;
use super::state::*;
use crate::clock::Clock;
use crate::config::catalog::terms_of;
use crate::config::secrets::{Env, Secret};
use crate::config::{Config, PolicyConfig, Provider};
use crate::keys::record::VirtualKeyRecord;
use crate::store::breaker::BreakerPhase;
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

    /// The keys of `discover: true` providers due for a listing, marked under way (the
    /// listing task, `crate::discovery`, makes them and calls [`Engine::finish_listing`]).
    pub fn listings_due(&self) -> Vec<super::discovered::ListingJob> {
        let config = self.config();
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let st = &mut *state;
        let (jobs, changed) = super::discovered::due(&mut st.listings, &config, &st.secrets, now);
        if changed {
            self.publish(&mut state, now);
        }
        jobs
    }

    /// Where and with what to reach one key of the pool (its provider's endpoint and headers,
    /// its current secret): what the ledger's credit poll asks with. `None`: no such key, or
    /// no secret for it.
    pub fn key_access(&self, provider: &str, alias: &str) -> Option<super::discovered::ListingJob> {
        let config = self.config();
        let p = config.providers.iter().find(|p| p.id == provider)?;
        let state = lock(&self.state);
        let secret = state
            .secrets
            .get(&(provider.to_owned(), alias.to_owned()))?
            .clone()?;
        Some(super::discovered::ListingJob {
            provider: p.id.clone(),
            key: alias.to_owned(),
            kind: p.kind,
            endpoint: p.endpoint.clone(),
            headers: p.headers.clone(),
            fingerprint: secret.fingerprint(),
            secret,
        })
    }

    /// A listing's result (the model ids, or why it failed); publishes when the key's catalog
    /// changed. Returns whether it did.
    pub fn finish_listing(
        &self,
        job: &super::discovered::ListingJob,
        result: Result<Vec<String>, String>,
    ) -> bool {
        let config = self.config();
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let changed = super::discovered::finish(&mut state.listings, &config, job, result, now);
        if changed {
            self.publish(&mut state, now);
        }
        changed
    }

    /// Every discovering key's listing as it stands.
    pub fn listings(&self) -> super::discovered::Listings {
        lock(&self.state).listings.clone()
    }

    pub(super) fn publish(&self, state: &mut State, now: i64) {
        state.version += 1;
        state.pending = false;
        let tables = Arc::new(build_tables(&self.config(), state, now));
        self.updates.send_replace(tables);
    }

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

    /// Replaces the snapshot's virtual keys (mounted and stored); publishes a new version when
    /// they changed. Returns whether they did.
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

    /// Whether a pushed virtual key has a quota limit decided from usage (its block follows
    /// the usage rows).
    pub fn has_usage_limited_keys(&self) -> bool {
        lock(&self.state)
            .virtual_keys
            .iter()
            .any(crate::keys::quotas::has_usage_limit)
    }

    /// Recomputes the pushed virtual keys' quota blocks from `usage` (every key's use this
    /// month, `None` when no key has a usage limit) without listing the key store again: what
    /// the key sync does while the store's keys have not changed. Publishes when a block
    /// appeared or ended; returns whether one did.
    pub fn recheck_quota_blocks(
        &self,
        usage: Option<&std::collections::HashMap<String, crate::keys::store::QuotaUsage>>,
        now_ms: i64,
    ) -> bool {
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        if !crate::keys::quotas::set_blocks(&mut state.virtual_keys, usage, now_ms) {
            return false;
        }
        state.published_keys = Arc::new(published_keys(&state.virtual_keys));
        self.publish(&mut state, now);
        true
    }

    /// Takes the budgets' use the key store counted, by this control plane before a restart or
    /// by another sharing the store ([`budgets::BudgetLedger::absorb`]); publishes when a
    /// budget's level rose. Returns whether it did.
    pub fn absorb_budget_use(&self, rows: &[crate::keys::store::BudgetUse]) -> bool {
        let config = self.config();
        if config.budgets.is_empty() {
            return false;
        }
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let changed = state.budgets.absorb(&config.budgets, rows, now);
        if changed {
            self.publish(&mut state, now);
        }
        changed
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

/// A key's billing scope as pushed: its `scope:`, empty when it is its own.
pub(super) fn key_scope(config: &Config, provider: &str, key: &str) -> String {
    config
        .providers
        .iter()
        .find(|p| p.id == provider)
        .and_then(|p| p.keys.iter().find(|k| k.alias == key))
        .and_then(|k| k.scope.clone())
        .unwrap_or_default()
}

pub(super) fn build_tables(config: &Config, state: &State, now: i64) -> Tables {
    let providers = config
        .providers
        .iter()
        .map(|p| {
            let published = provider_to_proto(p, &state.secrets);
            super::discovered::publish_provider(published, p, &state.listings, config.auto_price)
        })
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
        cache: config.cache.map(|c| {
            c.to_proto(matches!(
                config.state_store,
                crate::config::StoreSpec::Redis { .. }
            ))
        }),
        defaults: Some(defaults_to_proto(config.defaults.as_ref())),
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
            include_content: config.include_content,
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
                spent: false,
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
            .durable
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

pub(super) fn published_keys(keys: &[VirtualKeyRecord]) -> BTreeMap<String, pb::VirtualKey> {
    keys.iter()
        .map(|k| {
            let k = k.to_proto();
            (k.sha256.clone(), k)
        })
        .collect()
}

pub(super) fn provider_to_proto(
    p: &Provider,
    secrets: &BTreeMap<KeyId, Option<Secret>>,
) -> pb::Provider {
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
                    // Filled in for discovering providers (`discovery::publish_provider`).
                    listed: false,
                    models: Vec::new(),
                }
            })
            .collect(),
        models: p
            .models
            .iter()
            .map(super::discovered::model_to_proto)
            .collect(),
        terms: Some(terms_to_proto(p)),
    }
}

/// The selection settings beyond the latency and headroom thresholds: strategy, score
/// weights, the pool's filters and affinity.
pub(super) fn selection_to_proto(s: &crate::config::SelectionConfig) -> pb::Selection {
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

pub(super) fn terms_to_proto(p: &Provider) -> pb::ProviderTerms {
    let t = terms_of(p.kind.as_str(), p.terms.as_ref());
    pb::ProviderTerms {
        production_forbidden: !t.production_allowed,
        trains_on_prompts: t.trains_on_prompts,
        blocked_regions: t.blocked_regions,
        keyless: t.keyless,
    }
}

/// The pool's `defaults:` as pushed: every per-call number and switch resolved
/// (`contract::defaults` where the file leaves one out), so that a profile merged over them
/// has them too and the filter applies no default of its own.
pub fn defaults_to_proto(p: Option<&PolicyConfig>) -> pb::Policy {
    use ai_router_contract::defaults;
    let mut out = p.map(policy_to_proto).unwrap_or_default();
    out.allow_fallback.get_or_insert(defaults::ALLOW_FALLBACK);
    out.max_attempts.get_or_insert(defaults::MAX_ATTEMPTS);
    out.timeout_ms.get_or_insert(defaults::TIMEOUT_MS);
    out.deadline_ms.get_or_insert(defaults::DEADLINE_MS);
    out
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
