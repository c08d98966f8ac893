//! A policy cut down to the models served and the providers kept.

use std::collections::BTreeSet;

use crate::config::file::{PolicyConfig, TierConfig};

/// The policy cut down to the served models and kept providers, and whether it was left with
/// nothing (it named models or providers and none remain).
pub(super) fn cut_policy(
    policy: &PolicyConfig,
    served: &BTreeSet<String>,
    kept: &BTreeSet<&str>,
) -> (PolicyConfig, bool) {
    let mut cut = policy.clone();
    let named_models = policy.model.is_some()
        || policy.fallbacks.as_ref().is_some_and(|f| !f.is_empty())
        || policy.candidates.is_some();
    cut.fallbacks = policy
        .fallbacks
        .as_ref()
        .map(|f| f.iter().filter(|m| served.contains(*m)).cloned().collect());
    if let Some(model) = &policy.model {
        if !served.contains(model) {
            cut.model = None;
            if policy.allow_fallback != Some(false) {
                // The first fallback left becomes the preferred model.
                if let Some(fallbacks) = cut.fallbacks.as_mut() {
                    if !fallbacks.is_empty() {
                        cut.model = Some(fallbacks.remove(0));
                    }
                }
            }
        }
    }
    cut.providers = policy.providers.as_ref().map(|ids| {
        ids.iter()
            .filter(|id| kept.contains(id.as_str()))
            .cloned()
            .collect()
    });
    if let Some(tiers) = &policy.candidates {
        let left: Vec<TierConfig> = tiers
            .iter()
            .map(|tier| {
                TierConfig(
                    tier.0
                        .iter()
                        .filter(|c| served.contains(&c.model))
                        .filter(|c| {
                            c.provider
                                .as_ref()
                                .is_none_or(|id| kept.contains(id.as_str()))
                        })
                        .cloned()
                        .collect(),
                )
            })
            .filter(|tier| !tier.0.is_empty())
            .collect();
        // allowFallback: false keeps the first tier only; if it is gone, nothing is left.
        let first_gone = tiers
            .first()
            .is_some_and(|first| !first.0.iter().any(|c| left.iter().any(|t| t.0.contains(c))));
        if left.is_empty() || (policy.allow_fallback == Some(false) && first_gone) {
            cut.candidates = None;
        } else {
            cut.candidates = Some(left);
        }
    }
    let lost_providers = cut.providers.as_ref().is_some_and(|p| p.is_empty())
        && policy.providers.as_ref().is_some_and(|p| !p.is_empty());
    let has_models = cut.model.is_some()
        || cut.fallbacks.as_ref().is_some_and(|f| !f.is_empty())
        || cut.candidates.is_some();
    let emptied = lost_providers || (named_models && !has_models);
    (cut, emptied)
}

pub(super) const PROFILE_WILDCARD: &str = ai_router_contract::BINDING_WILDCARD;
