//! The pool's configuration as pushed: providers and their keys, selection, terms, defaults,
//! profiles, routes and the virtual keys.

use std::collections::BTreeMap;

use ai_router_proto::v1 as pb;

use crate::config::catalog::terms_of;
use crate::config::secrets::Secret;
use crate::config::{PolicyConfig, Provider};
use crate::keys::record::VirtualKeyRecord;
use crate::store::durable::KeyId;

pub(crate) fn published_keys(keys: &[VirtualKeyRecord]) -> BTreeMap<String, pb::VirtualKey> {
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
            .map(crate::engine::discovered::model_to_proto)
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
