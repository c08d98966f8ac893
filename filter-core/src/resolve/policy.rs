//! A profile's policy over the defaults, and a key's lists of names.

use ai_router_proto::v1::{Policy, PolicyList};

/// Later fields win, field by field.
pub fn merge(base: &Policy, over: &Policy) -> Policy {
    let mut out = base.clone();
    if over.model.is_some() {
        out.model = over.model.clone();
    }
    // A list the later policy sets replaces the earlier one, an empty list included.
    let sets = |list: PolicyList, list_is_empty: bool| {
        !list_is_empty || over.set_lists().any(|n| n == list)
    };
    if sets(PolicyList::Fallbacks, over.fallbacks.is_empty()) {
        out.fallbacks = over.fallbacks.clone();
    }
    if over.allow_fallback.is_some() {
        out.allow_fallback = over.allow_fallback;
    }
    if over.max_attempts.is_some() {
        out.max_attempts = over.max_attempts;
    }
    if over.timeout_ms.is_some() {
        out.timeout_ms = over.timeout_ms;
    }
    if over.deadline_ms.is_some() {
        out.deadline_ms = over.deadline_ms;
    }
    if over.prompt_cache.is_some() {
        out.prompt_cache = over.prompt_cache.clone();
    }
    if over.max_cost.is_some() {
        out.max_cost = over.max_cost;
    }
    if sets(PolicyList::Providers, over.providers.is_empty()) {
        out.providers = over.providers.clone();
    }
    if sets(PolicyList::Require, over.require.is_empty()) {
        out.require = over.require.clone();
    }
    if sets(PolicyList::Candidates, over.candidates.is_empty()) {
        out.candidates = over.candidates.clone();
    }
    out.pinned = out.pinned || over.pinned;
    if over.auto_sort.is_some() {
        out.auto_sort = over.auto_sort;
    }
    if over.reset_interval_ms.is_some() {
        out.reset_interval_ms = over.reset_interval_ms;
    }
    if over.cache.is_some() {
        out.cache = over.cache;
    }
    out
}

pub(crate) fn allows(list: &[String], name: &str) -> bool {
    list.iter()
        .any(|n| n == ai_router_contract::BINDING_WILDCARD || n == name)
}
