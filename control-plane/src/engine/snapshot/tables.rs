//! The tables one version pushes: the pool's settings with the state (key health, cooldowns,
//! breakers, headroom, provider budgets, resets, budgets) at that instant.

use ai_router_proto::tables::Tables;
use ai_router_proto::v1 as pb;

use super::settings::{
    defaults_to_proto, policy_to_proto, provider_to_proto, route_to_proto, selection_to_proto,
};
use crate::config::Config;
use crate::engine::state::State;
use crate::store::breaker::BreakerPhase;
use crate::store::durable::DurableState;

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

/// The tables of `state`'s version at `now`: the snapshot, and the virtual keys as published.
pub(crate) fn build_tables(config: &Config, state: &State, now: i64) -> Tables {
    let snapshot = pb::Snapshot {
        providers: providers(config, state),
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
        key_health: key_health(state),
        cooldowns: cooldowns(&state.durable),
        limits: Some(pb::Limits {
            max_body_bytes: config.gateway.max_body_bytes,
            forward_rate_limit_headers: config.gateway.forward_rate_limit_headers,
            admin_token_sha256: state.admin_token_sha256.clone(),
            include_content: config.include_content,
        }),
        generated_at_ms: now,
        breakers: breakers(&state.durable),
        resilience: Some(resilience(config)),
        selection: Some(pb::Selection {
            latency_tolerance: config.selection.latency_tolerance,
            latency_slack_ms: config.selection.latency_slack_ms,
            ewma_alpha: config.selection.ewma_alpha,
            low_headroom: config.selection.low_headroom,
            ..selection_to_proto(&config.selection)
        }),
        headroom: headroom(config, state, now),
        provider_health: provider_health(config, &state.durable, now),
        resets: resets(&state.durable),
        budgets: state.budgets.to_proto(&config.budgets, now),
    };
    Tables {
        virtual_keys: state.published_keys.clone(),
        ..Tables::from_snapshot(state.version, snapshot)
    }
}

/// The pool's providers with their keys' current secrets and, for discovering providers,
/// what their listings found.
fn providers(config: &Config, state: &State) -> Vec<pb::Provider> {
    config
        .providers
        .iter()
        .map(|p| {
            let published = provider_to_proto(p, &state.secrets);
            crate::engine::discovered::publish_provider(
                published,
                p,
                &state.listings,
                config.auto_price,
            )
        })
        .collect()
}

/// The keys that are out: with no secret, or blacklisted.
fn key_health(state: &State) -> Vec<pb::KeyHealth> {
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
    key_health
}

fn cooldowns(durable: &DurableState) -> Vec<pb::LaneCooldown> {
    durable
        .cooldowns
        .iter()
        .map(|((provider, key, model), until)| pb::LaneCooldown {
            provider: provider.clone(),
            key: key.clone(),
            model: model.clone(),
            until_ms: *until,
        })
        .collect()
}

/// The breakers that are not closed.
fn breakers(durable: &DurableState) -> Vec<pb::BreakerState> {
    durable
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
        .collect()
}

fn resilience(config: &Config) -> pb::Resilience {
    pb::Resilience {
        backoff: Some(pb::BackoffSettings {
            base_ms: config.resilience.backoff.base_ms,
            factor: config.resilience.backoff.factor,
            max_ms: config.resilience.backoff.max_ms,
        }),
        rate_limit_cooldown_ms: config.resilience.rate_limit_cooldown_ms,
        quota_blacklist_ms: config.resilience.quota_blacklist_ms,
        auth_disable_ms: config.resilience.auth_disable_ms.unwrap_or(0),
    }
}

/// The providers' reported headroom still within its window, then the [`HeadroomSource`]'s
/// estimates.
///
/// [`HeadroomSource`]: crate::engine::HeadroomSource
fn headroom(config: &Config, state: &State, now: i64) -> Vec<pb::Headroom> {
    state
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
            as_of_ms: state.headroom_as_of.get(lane).map_or(0, |k| k.as_of_ms),
            spent: false,
        })
        .chain(state.estimated.iter().cloned())
        .collect()
}

/// The providers out of their spend budget, until when.
fn provider_health(config: &Config, durable: &DurableState, now: i64) -> Vec<pb::ProviderHealth> {
    config
        .providers
        .iter()
        .filter_map(|p| {
            let budget = p.budget.as_ref()?;
            let until = durable.spend.get(&p.id)?.out_until(budget, now)?;
            Some(pb::ProviderHealth {
                provider: p.id.clone(),
                reason: pb::ProviderOutReason::Budget.into(),
                until_ms: until,
            })
        })
        .collect()
}

fn resets(durable: &DurableState) -> Vec<pb::HoldReset> {
    durable
        .resets
        .iter()
        .map(|((provider, key), at)| pb::HoldReset {
            provider: provider.clone(),
            key: key.clone(),
            at_ms: *at,
        })
        .collect()
}
