//! The checks types cannot make: ranges, names, references between sections, a policy's
//! budget bound, a provider that would call the gateway itself. Each error names the field.

use std::collections::BTreeSet;

use ai_router_contract::defaults;

use crate::config::error::{invalid, ConfigError};
use crate::config::file::{ModelConfig, PolicyConfig, SelectionConfig, TermsConfig, TierConfig};
use crate::config::model::{Gateway, ListenerLimits, Provider, ResilienceConfig};

/// Provider headers that would carry a secret.
pub(super) const AUTH_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "api-key",
    "proxy-authorization",
];

pub(super) fn check_weight(path: &str, weight: Option<f64>) -> Result<f64, ConfigError> {
    let weight = weight.unwrap_or(defaults::WEIGHT);
    if !weight.is_finite() || weight <= 0.0 {
        return Err(invalid(format!("{path}: must be a positive number")));
    }
    Ok(weight)
}

pub(super) fn check_concurrency(
    path: &str,
    value: Option<u32>,
) -> Result<Option<u32>, ConfigError> {
    match value {
        Some(0) => Err(invalid(format!("{path}: must be at least 1"))),
        other => Ok(other),
    }
}

pub(super) fn check_cost(path: &str, value: Option<f64>) -> Result<(), ConfigError> {
    match value {
        Some(v) if !v.is_finite() || v < 0.0 => {
            Err(invalid(format!("{path}: must be a non-negative number")))
        }
        _ => Ok(()),
    }
}

pub(super) fn is_label(label: &str) -> bool {
    !label.is_empty()
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Refuses a provider whose base URL is the gateway's own public listener on this machine (a
/// loopback or unspecified address, `localhost`, or `gateway.host`, with `gateway.port`).
pub(super) fn refuse_own_listener(
    provider: &Provider,
    gateway: &Gateway,
) -> Result<(), ConfigError> {
    if gateway.port == 0 {
        // Picked at bind time: nothing to compare with.
        return Ok(());
    }
    let authority = provider.endpoint.authority.to_ascii_lowercase();
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, port.parse::<u16>().ok()),
        _ => (authority.as_str(), None),
    };
    let port = port.unwrap_or(if provider.endpoint.scheme == "https" {
        443
    } else {
        80
    });
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let local = host == "localhost"
        || host == gateway.host.to_ascii_lowercase()
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified());
    if !local || port != gateway.port {
        return Ok(());
    }
    Err(invalid(format!(
        "provider {}: its base URL {} (from {}) is the gateway's own listener (port {}): every \
         call would go back into the gateway. Point {} at the provider's API, not at the gateway",
        provider.id,
        provider.base_url,
        provider.base_url_from,
        gateway.port,
        provider.base_url_from
    )))
}

pub(super) fn non_empty_host(path: &str, host: Option<&str>) -> Result<String, ConfigError> {
    match host {
        None => Ok(defaults::HOST.to_owned()),
        Some(h) if !h.trim().is_empty() && !h.contains(char::is_whitespace) => Ok(h.to_owned()),
        Some(_) => Err(invalid(format!("{path}: must be a host name or an IP"))),
    }
}

/// A budget is checked against a request's worst case: every prompt token plus `max_tokens`
/// of output, or the whole context window when the request sets no `max_tokens`. A priced
/// model the policy may reach without a `contextWindow` has no worst case: refused at load,
/// rather than counting an unknown output as free.
fn check_cost_is_bounded(
    path: &str,
    policy: &PolicyConfig,
    providers: &[Provider],
) -> Result<(), ConfigError> {
    let named: Vec<&str> = policy
        .model
        .iter()
        .chain(policy.fallbacks.iter().flatten())
        .map(String::as_str)
        .chain(
            policy
                .candidates
                .iter()
                .flatten()
                .flat_map(|tier| tier.0.iter().map(|c| c.model.as_str())),
        )
        .collect();
    // A policy that names no model (the defaults) applies to any model called directly.
    let reaches = |m: &ModelConfig| named.is_empty() || named.iter().any(|n| m.answers_to(n));
    for provider in providers {
        for model in provider.models.iter().filter(|m| reaches(m)) {
            if model.cost.is_some() && model.context_window.is_none() {
                return Err(invalid(format!(
                    "{path}.budget.maxCost: model `{}` of provider `{}` has a cost but no contextWindow, so the cost of a request without max_tokens has no bound; give the model a contextWindow",
                    model.id, provider.id
                )));
            }
        }
    }
    Ok(())
}

pub(super) fn check_policy(
    path: &str,
    policy: &PolicyConfig,
    providers: &[Provider],
    names: &BTreeSet<&str>,
    is_profile: bool,
) -> Result<(), ConfigError> {
    if let Some(model) = &policy.model {
        check_known(&format!("{path}.model"), model, names)?;
    }
    for (i, fallback) in policy.fallbacks.iter().flatten().enumerate() {
        check_known(&format!("{path}.fallbacks[{i}]"), fallback, names)?;
    }
    check_attempt_limits(path, policy)?;
    if let Some(budget) = policy.budget {
        check_cost(&format!("{path}.budget.maxCost"), budget.max_cost)?;
        if budget.max_cost.is_some() {
            check_cost_is_bounded(path, policy, providers)?;
        }
    }
    for (i, id) in policy.providers.iter().flatten().enumerate() {
        if !providers.iter().any(|p| &p.id == id) {
            return Err(invalid(format!(
                "{path}.providers[{i}]: unknown provider `{id}`"
            )));
        }
    }
    if let Some(tiers) = &policy.candidates {
        check_candidates(path, policy, tiers, providers, names)?;
    }
    if policy.pinned == Some(true) {
        check_pinned(path, policy, providers, is_profile)?;
    }
    Ok(())
}

/// A model name a policy gives: one some provider serves.
fn check_known(field: &str, name: &str, names: &BTreeSet<&str>) -> Result<(), ConfigError> {
    if names.contains(name) {
        Ok(())
    } else {
        Err(invalid(format!(
            "{field}: unknown model `{name}` (no provider serves it)"
        )))
    }
}

/// `maxAttempts`, `timeoutMs` and `deadlineMs`: at least 1 when given.
fn check_attempt_limits(path: &str, policy: &PolicyConfig) -> Result<(), ConfigError> {
    if policy.max_attempts == Some(0) {
        return Err(invalid(format!("{path}.maxAttempts: must be at least 1")));
    }
    if policy.timeout_ms == Some(0) {
        return Err(invalid(format!("{path}.timeoutMs: must be at least 1")));
    }
    if policy.deadline_ms == Some(0) {
        return Err(invalid(format!("{path}.deadlineMs: must be at least 1")));
    }
    Ok(())
}

/// `candidates`: in place of model and fallbacks, tiers none of which is empty, each
/// candidate a known model with a valid weight, served by its provider when it names one.
fn check_candidates(
    path: &str,
    policy: &PolicyConfig,
    tiers: &[TierConfig],
    providers: &[Provider],
    names: &BTreeSet<&str>,
) -> Result<(), ConfigError> {
    if policy.model.is_some() || policy.fallbacks.is_some() {
        return Err(invalid(format!(
            "{path}.candidates: takes the place of model and fallbacks; give one or the other"
        )));
    }
    if tiers.is_empty() {
        return Err(invalid(format!(
            "{path}.candidates: needs at least one tier"
        )));
    }
    for (t, tier) in tiers.iter().enumerate() {
        if tier.0.is_empty() {
            return Err(invalid(format!("{path}.candidates[{t}]: an empty tier")));
        }
        for (c, candidate) in tier.0.iter().enumerate() {
            let cpath = if tier.0.len() == 1 {
                format!("{path}.candidates[{t}]")
            } else {
                format!("{path}.candidates[{t}][{c}]")
            };
            check_known(&format!("{cpath}.model"), &candidate.model, names)?;
            check_weight(&format!("{cpath}.weight"), candidate.weight)?;
            if let Some(id) = &candidate.provider {
                let provider = providers
                    .iter()
                    .find(|p| &p.id == id)
                    .ok_or_else(|| invalid(format!("{cpath}.provider: unknown provider `{id}`")))?;
                if !provider.serves(&candidate.model) {
                    return Err(invalid(format!(
                        "{cpath}.model: provider `{id}` does not serve `{}`",
                        candidate.model
                    )));
                }
            }
        }
    }
    Ok(())
}

/// `pinned: true`: only a profile, with candidates that are all one model identity and
/// dimensions.
fn check_pinned(
    path: &str,
    policy: &PolicyConfig,
    providers: &[Provider],
    is_profile: bool,
) -> Result<(), ConfigError> {
    if !is_profile {
        return Err(invalid(format!(
            "{path}.pinned: only a profile can be pinned"
        )));
    }
    let Some(tiers) = &policy.candidates else {
        return Err(invalid(format!(
            "{path}.pinned: a pinned profile needs candidates"
        )));
    };
    let shapes = candidate_shapes(tiers, providers);
    if shapes.len() > 1 {
        let found: Vec<String> = shapes
            .iter()
            .map(|(identity, dimensions)| match dimensions {
                Some(d) => format!("{identity} ({d} dimensions)"),
                None => format!("{identity} (no dimensions)"),
            })
            .collect();
        return Err(invalid(format!(
            "{path}.pinned: the candidates are not one model identity and dimensions: {}",
            found.join(", ")
        )));
    }
    Ok(())
}

/// The model identities and dimensions the candidates can reach, over the providers each
/// may use.
fn candidate_shapes(
    tiers: &[TierConfig],
    providers: &[Provider],
) -> BTreeSet<(String, Option<u32>)> {
    let mut shapes = BTreeSet::new();
    for candidate in tiers.iter().flat_map(|t| t.0.iter()) {
        for provider in providers {
            if candidate
                .provider
                .as_ref()
                .is_some_and(|id| id != &provider.id)
            {
                continue;
            }
            for model in provider
                .models
                .iter()
                .filter(|m| m.answers_to(&candidate.model))
            {
                shapes.insert((model.identity().to_owned(), model.dimensions));
            }
        }
    }
    shapes
}

/// `gateway.*TimeoutMs` and `maxConcurrentRequests`, defaults applied.
pub(super) fn check_listener_limits(limits: &ListenerLimits) -> Result<(), ConfigError> {
    for (field, value) in [
        ("requestHeadersTimeoutMs", limits.request_headers_timeout_ms),
        ("requestTimeoutMs", limits.request_timeout_ms),
        ("connectionIdleTimeoutMs", limits.connection_idle_timeout_ms),
    ] {
        if value < 1 {
            return Err(invalid(format!("gateway.{field}: must be at least 1")));
        }
    }
    if limits.max_concurrent_requests == 0 {
        return Err(invalid("gateway.maxConcurrentRequests: must be at least 1"));
    }
    if limits.request_timeout_ms < limits.request_headers_timeout_ms {
        return Err(invalid(format!(
            "gateway.requestTimeoutMs: {} is shorter than gateway.requestHeadersTimeoutMs ({}); the request timeout covers the headers too",
            limits.request_timeout_ms, limits.request_headers_timeout_ms
        )));
    }
    Ok(())
}

/// `resilience`, defaults applied.
pub(super) fn check_resilience(r: &ResilienceConfig) -> Result<(), ConfigError> {
    for (name, b) in [
        ("keyBreaker", r.key_breaker),
        ("providerBreaker", r.provider_breaker),
    ] {
        if b.failure_threshold == 0 {
            return Err(invalid(format!(
                "resilience.{name}.failureThreshold: must be at least 1"
            )));
        }
        if b.max_cooldown_ms < b.cooldown_ms {
            return Err(invalid(format!(
                "resilience.{name}.maxCooldownMs: must be at least cooldownMs"
            )));
        }
    }
    if !r.backoff.factor.is_finite() || r.backoff.factor < 1.0 {
        return Err(invalid("resilience.backoff.factor: must be at least 1"));
    }
    // A window of 0 means nothing the filter could apply (the sync protocol reads 0 as "not
    // set"), and would leave health calling a key out while it gets no traffic: refused.
    // `authDisableMs` left out is "until the secret changes".
    for (name, ms) in [
        ("backoff.baseMs", Some(r.backoff.base_ms)),
        ("backoff.maxMs", Some(r.backoff.max_ms)),
        ("rateLimitCooldownMs", Some(r.rate_limit_cooldown_ms)),
        ("quotaBlacklistMs", Some(r.quota_blacklist_ms)),
        ("authDisableMs", r.auth_disable_ms),
    ] {
        if ms == Some(0) {
            let hint = if name == "authDisableMs" {
                " (leave it out: out until the secret changes)"
            } else {
                ""
            };
            return Err(invalid(format!(
                "resilience.{name}: must be at least 1 (milliseconds){hint}"
            )));
        }
    }
    if r.backoff.max_ms < r.backoff.base_ms {
        return Err(invalid("resilience.backoff.maxMs: must be at least baseMs"));
    }
    Ok(())
}

pub(super) fn check_selection(s: &SelectionConfig) -> Result<(), ConfigError> {
    if !s.latency_tolerance.is_finite() || s.latency_tolerance < 1.0 {
        return Err(invalid("selection.latencyTolerance: must be at least 1"));
    }
    if !(s.ewma_alpha > 0.0 && s.ewma_alpha <= 1.0) {
        return Err(invalid("selection.ewmaAlpha: must be in (0, 1]"));
    }
    let w = s.score;
    for (name, v) in [("alpha", w.alpha), ("beta", w.beta), ("gamma", w.gamma)] {
        if !v.is_finite() || v < 0.0 {
            return Err(invalid(format!(
                "selection.score.{name}: must be a number of at least 0"
            )));
        }
    }
    if w.alpha + w.beta + w.gamma <= 0.0 {
        return Err(invalid(
            "selection.score: alpha, beta and gamma must not all be 0 (every lane would weigh 0)",
        ));
    }
    if !s.unreported_weight.is_finite() || s.unreported_weight <= 0.0 {
        return Err(invalid("selection.unreportedWeight: must be above 0"));
    }
    if let Some(region) = &s.region {
        let r = region.trim();
        let iso = r.len() == 2 && r.chars().all(|c| c.is_ascii_alphabetic());
        if !iso {
            return Err(invalid(format!(
                "selection.region: '{region}' is not an ISO 3166 alpha-2 country code (e.g. DE, US)"
            )));
        }
    }
    if s.affinity.enabled && s.affinity.idle_ms == 0 {
        return Err(invalid(
            "selection.affinity.idleMs: must be at least 1 (set enabled: false to turn affinity off)",
        ));
    }
    Ok(())
}

/// A model's `family:` is a plain name (a request names it as `family:<name>`), its rank 1 or
/// more.
pub(super) fn check_family(mpath: &str, model: &ModelConfig) -> Result<(), ConfigError> {
    if let Some(f) = &model.family {
        let f = f.trim();
        if f.is_empty() || f.starts_with("family:") || f.chars().any(char::is_whitespace) {
            return Err(invalid(format!(
                "{mpath}.family: must be a family name without spaces or the 'family:' prefix"
            )));
        }
    }
    if model.family_rank == Some(0) {
        return Err(invalid(format!(
            "{mpath}.familyRank: must be at least 1 (1 is the best)"
        )));
    }
    Ok(())
}

/// A provider's `terms.blockedRegions` are countries or the table's groups.
pub(super) fn check_terms(path: &str, terms: Option<&TermsConfig>) -> Result<(), ConfigError> {
    let regions = terms
        .and_then(|t| t.blocked_regions.as_deref())
        .unwrap_or(&[]);
    match regions.iter().find(|r| !crate::config::catalog::is_region(r)) {
        Some(bad) => Err(invalid(format!(
            "{path}.terms.blockedRegions: '{bad}' is neither an ISO 3166 alpha-2 country code nor a group of the terms table (EU)"
        ))),
        None => Ok(()),
    }
}
