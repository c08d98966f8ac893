//! The front stage's decisions on a parsed request: which profile or pool model it names,
//! whether the virtual key may call it, the merged policy, and the ordered candidate tiers.
//!
//! `policy.rs` merges a profile over the defaults; `tiers.rs` turns the names it lists into
//! candidate tiers (`candidates.rs`: what a name reaches, whether a lane can serve); `needs.rs`
//! reads what the request needs; `rules.rs` routes a request by its content to a profile.

mod candidates;
mod needs;
pub mod policy;
pub mod rules;
#[cfg(test)]
mod tests;
mod tiers;

use ai_router_proto::v1::VirtualKey;
use serde_json::Value;

use crate::answer::errors::GatewayError;
use crate::answer::trail::Trail;
use crate::plan::{Candidate, Operation};
use crate::state::State;
use crate::vocab::Needs;
use ai_router_contract::error_code::ErrorCode;
use candidates::key_may_call_model;
use policy::allows;

/// What the front stage derived from a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub tiers: Vec<Vec<Candidate>>,
    /// The configured first choice (before `autoSort`), a saving's baseline.
    pub first_choice: Option<Candidate>,
    /// `resetIntervalMs`; 0: none.
    pub reset_interval_ms: u64,
    pub needs: Needs,
    pub max_attempts: u32,
    pub timeout_ms: u64,
    pub deadline_ms: u64,
    pub stream: bool,
    pub include_usage: bool,
    /// The profile the request named; `None` for a direct model call.
    pub profile: Option<String>,
    /// The merged policy's `promptCache` ("5m", "1h"; empty or "off": none).
    pub prompt_cache: String,
    /// The candidates the request's needs or the policy ruled out, for the routing trail.
    pub trail: crate::answer::trail::Trail,
    /// The merged policy's `cache` (unset: the pool's cache, when it has one, applies).
    pub cache: Option<bool>,
}

/// Decides what a request routes to.
pub fn resolve(
    state: &State,
    key: &VirtualKey,
    body: &Value,
    op: Operation,
) -> Result<Resolved, GatewayError> {
    resolve_as(state, key, body, op, None, crate::plan::Protocol::Chat)
}

/// Decides what a request routes to; `routed`: the profile a `routes:` rule chose for it, in
/// place of its `model`; `protocol`: the caller's (a Messages call goes to an anthropic lane
/// as it came, so what the adapter from chat cannot express rules none out).
pub fn resolve_as(
    state: &State,
    key: &VirtualKey,
    body: &Value,
    op: Operation,
    routed: Option<&str>,
    protocol: crate::plan::Protocol,
) -> Result<Resolved, GatewayError> {
    let requested = requested_name(body, routed)?;
    let defaults = state.defaults();
    let profile = state.profile(&requested);
    let (policy, tiers_by_name) = match profile {
        Some(profile) => tiers::of_profile(key, &requested, &defaults, profile)?,
        None => tiers::of_model(state, key, &requested, &defaults)?,
    };
    // A profile is the operator's choice of models; a direct call stays within the key's.
    let scope = profile.is_none().then_some(key);
    // The merged policy's numbers and switches are as given: the defaults' are settled
    // (`state::settle_unsent`), and a profile only overrides them.
    let allow_fallback = policy.allow_fallback.unwrap_or_default() && key.allow_fallback;
    let needs = Needs::of(body, op, policy.require());
    let mut admission = tiers::Admission::new(state, body, op, &policy, &needs, scope);
    if protocol == crate::plan::Protocol::Messages {
        admission.native_to_anthropic();
    }
    let mut tiers: Vec<Vec<Candidate>> = Vec::new();
    // A direct call's fallbacks follow the families' ranks; a profile's tiers, its order.
    for tier in tiers::with_siblings(state, tiers_by_name, profile.is_none()) {
        let out = admission.tier(tier, &tiers);
        if !out.is_empty() {
            tiers.push(out);
        }
        // Without fallback the preferred tier is the call: when the request's needs cut it,
        // nothing else may answer.
        if !allow_fallback {
            break;
        }
    }
    let (trail, why_not) = admission.finish();
    if tiers.is_empty() {
        return Err(no_candidate(&requested, why_not, trail));
    }
    let first_choice = tiers.first().and_then(|t| t.first()).cloned();
    if policy.auto_sort == Some(true) {
        tiers = crate::lanes::cost::cheapest_first(state, tiers, &needs);
    }
    Ok(Resolved {
        tiers,
        trail,
        first_choice,
        reset_interval_ms: policy.reset_interval_ms.unwrap_or(0),
        max_attempts: policy.max_attempts.unwrap_or_default(),
        timeout_ms: policy.timeout_ms.unwrap_or_default(),
        deadline_ms: policy.deadline_ms.unwrap_or_default(),
        stream: op == Operation::Chat
            && body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: body
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        needs,
        profile: profile.map(|_| requested.clone()),
        prompt_cache: policy.prompt_cache.clone().unwrap_or_default(),
        cache: policy.cache,
    })
}

/// The name the request calls: the routed profile, else its `model`.
fn requested_name(body: &Value, routed: Option<&str>) -> Result<String, GatewayError> {
    match (routed, body.get("model")) {
        (Some(profile), _) => Ok(profile.to_string()),
        (None, Some(Value::String(s))) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        (None, Some(Value::String(_)) | None | Some(Value::Null)) => {
            Err(GatewayError::of(ErrorCode::MissingModel).with_param("model"))
        }
        (None, Some(_)) => Err(GatewayError::new(
            ErrorCode::InvalidRequest,
            "model must be a string.",
        )
        .with_param("model")),
    }
}

/// The refusal when no tier is left; it names what ruled out each candidate (a filter, a
/// need, the policy).
fn no_candidate(requested: &str, why_not: Option<String>, trail: Trail) -> GatewayError {
    if let Some(reason) = why_not {
        // Nothing in the pool fits what the request needs: no candidate.
        return GatewayError::new(
            ErrorCode::ModelNotSupported,
            format!("No model '{requested}' can serve this request: {reason}."),
        )
        .with_param("model")
        .with_trail(trail);
    }
    GatewayError::new(
        ErrorCode::PoolUnavailable,
        format!("No provider in the pool can serve '{requested}' for this request."),
    )
    .with_trail(trail)
}

/// The `/v1/models` list for a key: the profiles and pool names it may call.
pub fn model_list(state: &State, key: &VirtualKey) -> Vec<String> {
    let mut names: Vec<String> = state
        .snapshot
        .profiles
        .keys()
        .filter(|p| allows(&key.profiles, p))
        .cloned()
        .collect();
    let mut models: Vec<String> = state
        .names()
        // Families are callable (`family:<name>`) but not listed: every model is one.
        .filter(|n| !n.starts_with(crate::vocab::family::PREFIX))
        .filter(|n| !state.snapshot.profiles.contains_key(*n) && key_may_call_model(state, key, n))
        .cloned()
        .collect();
    names.sort();
    models.sort();
    names.extend(models);
    names.dedup();
    names
}
