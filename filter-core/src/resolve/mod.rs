//! The front stage's decisions on a parsed request: which profile or pool model it names,
//! whether the virtual key may call it, the merged policy, and the ordered candidate tiers.

pub mod rules;

use ai_router_contract::defaults;
use ai_router_proto::v1::{Capability, Policy, PolicyList, ProviderKind, VirtualKey};
use serde_json::Value;

use crate::answer::errors::{ErrorCode, GatewayError};
use crate::plan::{Candidate, Operation};
use crate::state::State;
use crate::vocab::Needs;

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

/// A named candidate as `families::with_siblings` takes it: name, provider, (weight, index of
/// its `when`).
type FamilyEntry = (String, Option<String>, (f64, usize));

/// A candidate by the name the policy uses.
struct NamedCandidate {
    name: String,
    provider: Option<String>,
    weight: f64,
    when: Vec<String>,
}

impl NamedCandidate {
    fn named(name: String) -> Self {
        Self {
            name,
            provider: None,
            weight: 1.0,
            when: Vec::new(),
        }
    }
}

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

/// Whether a pool model is within the key's `models`: the key names its id or one of its
/// aliases, as written in the pool. Calling a shared alias never widens that: the alias
/// reaches only the models the key names.
fn model_in_scope(key: &VirtualKey, model: &ai_router_proto::v1::Model) -> bool {
    allows(&key.models, &model.id) || model.aliases.iter().any(|a| allows(&key.models, a))
}

/// Whether the key may call a pool model directly by this name: the key lists the name itself
/// (or `*`). A name it does not list is refused, never remapped, even when it is an alias of a
/// model the key does list (a key listing `gpt-4o-mini` may not call `fast`). A family
/// (`family:<name>`) is a selector over its members, not a model: the key may call it when it
/// may call a member, and reaches only those (`docs/selection.md`).
fn key_may_call_model(state: &State, key: &VirtualKey, name: &str) -> bool {
    if !name.starts_with(crate::vocab::family::PREFIX) {
        return allows(&key.models, name);
    }
    state.models_named(name).iter().any(|r| {
        state
            .provider_at(r.provider)
            .and_then(|p| p.models.get(r.model))
            .is_some_and(|m| model_in_scope(key, m))
    })
}

/// The candidates serving a model name, optionally on one provider, within the policy's
/// provider restriction and, for a direct model call, within the key's model scope.
fn candidates_for(
    state: &State,
    named: &NamedCandidate,
    policy: &Policy,
    scope: Option<&VirtualKey>,
    trail: &mut crate::answer::trail::Trail,
) -> Vec<Candidate> {
    let (name, provider) = (named.name.as_str(), named.provider.as_deref());
    state
        .models_named(name)
        .iter()
        .filter_map(|r| {
            let p = state.provider_at(r.provider)?;
            let m = p.models.get(r.model)?;
            if provider.is_some_and(|want| want != p.id) {
                return None;
            }
            if (!policy.providers.is_empty() && !policy.providers.contains(&p.id))
                || scope.is_some_and(|key| !model_in_scope(key, m))
            {
                trail.skip(&p.id, "", &m.id, "not_allowed");
                return None;
            }
            Some(Candidate {
                provider: p.id.clone(),
                model: m.id.clone(),
                weight: named.weight,
                when: named.when.clone(),
            })
        })
        .collect()
}

/// Estimated tokens of everything the caller sent (CJK text by its own density).
fn estimate_prompt_tokens(body: &Value, op: Operation) -> u64 {
    let field = match op {
        Operation::Chat => body.get("messages"),
        Operation::Embeddings => body.get("input"),
    };
    [field, body.get("tools")]
        .into_iter()
        .flatten()
        .map(|v| crate::protocols::context::estimate_tokens(&v.to_string()))
        .sum()
}

impl Needs {
    pub fn of(
        body: &Value,
        op: Operation,
        policy_require: impl IntoIterator<Item = Capability>,
    ) -> Needs {
        let mut capabilities: Vec<Capability> = Vec::new();
        let mut need = |c: Capability| {
            if !capabilities.contains(&c) {
                capabilities.push(c);
            }
        };
        match op {
            Operation::Embeddings => need(Capability::Embeddings),
            Operation::Chat => {
                need(Capability::Chat);
                if body
                    .get("tools")
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty())
                    || body
                        .get("functions")
                        .and_then(Value::as_array)
                        .is_some_and(|t| !t.is_empty())
                {
                    need(Capability::Tools);
                }
                let format = body
                    .get("response_format")
                    .and_then(|f| f.get("type"))
                    .and_then(Value::as_str);
                if format.is_some_and(|t| t != "text") {
                    need(Capability::Json);
                }
                if body.get("stream").and_then(Value::as_bool).unwrap_or(false) {
                    need(Capability::Streaming);
                }
            }
        }
        for r in policy_require {
            need(r);
        }
        let prompt_tokens = estimate_prompt_tokens(body, op);
        let max_tokens = body
            .get("max_completion_tokens")
            .or_else(|| body.get("max_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Needs {
            capabilities,
            context_tokens: prompt_tokens + max_tokens,
            prompt_tokens,
            max_tokens,
        }
    }
}

/// A model's capabilities: as declared, else chat, streaming, tools and json.
fn capabilities_of(m: &ai_router_proto::v1::Model) -> Vec<Capability> {
    if m.capabilities.is_empty() {
        return vec![
            Capability::Chat,
            Capability::Streaming,
            Capability::Tools,
            Capability::Json,
        ];
    }
    let mut caps: Vec<Capability> = m.capabilities().collect();
    // A model that declares chat features chats.
    if caps.iter().any(|c| *c != Capability::Embeddings) && !caps.contains(&Capability::Chat) {
        caps.push(Capability::Chat);
    }
    caps
}

/// Why a candidate cannot serve this request, if it cannot: the trail's word for it and the
/// message.
fn unfit(
    state: &State,
    c: &Candidate,
    needs: &Needs,
    max_cost: Option<f64>,
) -> Option<(String, String)> {
    let (_, p) = state.provider(&c.provider)?;
    let Some(m) = p.models.iter().find(|m| m.id == c.model) else {
        return Some((
            "not_served".into(),
            format!("{} is not served by {}", c.model, c.provider),
        ));
    };
    let caps = capabilities_of(m);
    if let Some(missing) = needs.capabilities.iter().find(|n| !caps.contains(n)) {
        return Some((
            format!("no_capability:{}", missing.text()),
            format!("{} does not support {}", m.id, missing.text()),
        ));
    }
    if m.context_window > 0 && needs.context_tokens > m.context_window {
        return Some((
            "context_window".into(),
            format!(
                "{} has a context window of {} tokens; this request needs about {}",
                m.id, m.context_window, needs.context_tokens
            ),
        ));
    }
    // The provider's per-request caps (GitHub Models: 8K in, 4K out), whatever the window.
    let caps = [
        (p.max_input_tokens, needs.prompt_tokens, "takes", "sends"),
        (p.max_output_tokens, needs.max_tokens, "answers", "asks for"),
    ];
    if let Some((cap, asked, verb, what)) = caps.iter().find(|(cap, n, ..)| *cap > 0 && n > cap) {
        return Some((
            "request_cap".into(),
            format!(
                "{} {verb} at most {cap} tokens in one request; this one {what} about {asked}",
                p.id
            ),
        ));
    }
    if let (Some(limit), Some(cost)) = (max_cost, m.cost.as_ref()) {
        // The worst case: every prompt token plus max_tokens (or the whole window) of output.
        let output = if needs.max_tokens > 0 {
            needs.max_tokens
        } else {
            m.context_window.saturating_sub(needs.prompt_tokens)
        };
        let worst = crate::lanes::cost::cost_at(cost, needs.prompt_tokens, output, 0);
        if worst > limit {
            return Some((
                "budget".into(),
                format!(
                    "{} may cost {worst:.4} for this request, above the budget of {limit}",
                    m.id
                ),
            ));
        }
    }
    None
}

/// Decides what a request routes to.
pub fn resolve(
    state: &State,
    key: &VirtualKey,
    body: &Value,
    op: Operation,
) -> Result<Resolved, GatewayError> {
    resolve_as(state, key, body, op, None)
}

/// Decides what a request routes to; `routed`: the profile a `routes:` rule chose for it, in
/// place of its `model`.
pub fn resolve_as(
    state: &State,
    key: &VirtualKey,
    body: &Value,
    op: Operation,
    routed: Option<&str>,
) -> Result<Resolved, GatewayError> {
    let requested = match (routed, body.get("model")) {
        (Some(profile), _) => profile.to_string(),
        (None, Some(Value::String(s))) if !s.trim().is_empty() => s.trim().to_string(),
        (None, Some(Value::String(_)) | None | Some(Value::Null)) => {
            return Err(GatewayError::of(ErrorCode::MissingModel).with_param("model"));
        }
        (None, Some(_)) => {
            return Err(
                GatewayError::new(ErrorCode::InvalidRequest, "model must be a string.")
                    .with_param("model"),
            );
        }
    };
    let defaults = state.defaults();
    let profile = state.profile(&requested);

    let (policy, tiers_by_name): (Policy, Vec<Vec<NamedCandidate>>) = if let Some(profile) = profile
    {
        if !allows(&key.profiles, &requested) {
            return Err(GatewayError::new(
                ErrorCode::ModelNotAllowed,
                format!("This key may not call the profile '{requested}'."),
            )
            .with_param("model"));
        }
        let policy = merge(&defaults, profile);
        let tiers = if !profile.candidates.is_empty() {
            profile
                .candidates
                .iter()
                .map(|t| {
                    t.candidates
                        .iter()
                        .map(|c| NamedCandidate {
                            name: c.model.clone(),
                            provider: (!c.provider.is_empty()).then(|| c.provider.clone()),
                            weight: if c.weight > 0.0 { c.weight } else { 1.0 },
                            when: c.when().map(|t| t.text().to_string()).collect(),
                        })
                        .collect()
                })
                .collect()
        } else {
            let preferred = policy.model.clone().unwrap_or_default();
            std::iter::once(preferred)
                .chain(policy.fallbacks.iter().cloned())
                .filter(|n| !n.is_empty())
                .map(|n| vec![NamedCandidate::named(n)])
                .collect()
        };
        (policy, tiers)
    } else {
        if state.models_named(&requested).is_empty() {
            return Err(GatewayError::new(
                ErrorCode::ModelNotFound,
                format!("The model '{requested}' does not exist in this gateway's pool."),
            )
            .with_param("model"));
        }
        if !key_may_call_model(state, key, &requested) {
            return Err(GatewayError::new(
                ErrorCode::ModelNotAllowed,
                format!("This key may not call the model '{requested}'."),
            )
            .with_param("model"));
        }
        // A direct model call falls back only through the defaults' fallbacks the key may call.
        let mut tiers = vec![vec![NamedCandidate::named(requested.clone())]];
        for f in &defaults.fallbacks {
            if f != &requested && key_may_call_model(state, key, f) {
                tiers.push(vec![NamedCandidate::named(f.clone())]);
            }
        }
        let mut policy = defaults.clone();
        policy.model = Some(requested.clone());
        (policy, tiers)
    };

    // A profile is the operator's choice of models; a direct call stays within the key's.
    let scope = profile.is_none().then_some(key);
    let allow_fallback =
        policy.allow_fallback.unwrap_or(defaults::ALLOW_FALLBACK) && key.allow_fallback;
    let needs = Needs::of(body, op, policy.require());
    let mut tiers: Vec<Vec<Candidate>> = Vec::new();
    let mut why_not: Option<String> = None;
    // What the Anthropic adapter cannot express (`n: 2`...), worked out once, when a candidate
    // is of kind anthropic: such a lane is no candidate for this request.
    let mut anthropic_refusal: Option<Option<String>> = None;
    let selection = state.selection();
    let mut trail = crate::answer::trail::Trail::default();
    // Each tier's same-family siblings follow it; a sibling keeps the weight and the `when` of
    // the candidate that brought it.
    let whens: Vec<Vec<String>> = tiers_by_name
        .iter()
        .flatten()
        .map(|n| n.when.clone())
        .collect();
    let mut index = 0usize;
    let indexed: Vec<Vec<FamilyEntry>> = tiers_by_name
        .into_iter()
        .map(|tier| {
            tier.into_iter()
                .map(|n| {
                    index += 1;
                    (n.name, n.provider, (n.weight, index - 1))
                })
                .collect()
        })
        .collect();
    // A direct call's fallbacks follow the families' ranks; a profile's tiers, its order.
    let named_tiers = crate::lanes::families::with_siblings(state, indexed, profile.is_none())
        .into_iter()
        .map(|tier| {
            tier.into_iter()
                .map(|(name, provider, (weight, i))| NamedCandidate {
                    name,
                    provider,
                    weight,
                    when: whens.get(i).cloned().unwrap_or_default(),
                })
                .collect::<Vec<_>>()
        });
    for tier in named_tiers {
        let mut out: Vec<Candidate> = Vec::new();
        for named in tier {
            for c in candidates_for(state, &named, &policy, scope, &mut trail) {
                let skip = state
                    .provider(&c.provider)
                    .and_then(|(_, p)| crate::lanes::terms::skipped(&selection, p));
                if let Some(skip) = skip {
                    trail.skip(&c.provider, "", &c.model, skip.reason());
                    why_not.get_or_insert(format!(
                        "{} on {} is skipped ({}): {}",
                        c.model,
                        c.provider,
                        skip.reason(),
                        skip.explain(&selection)
                    ));
                    continue;
                }
                if let Some((code, reason)) = unfit(state, &c, &needs, policy.max_cost) {
                    trail.skip(&c.provider, "", &c.model, &code);
                    why_not.get_or_insert(reason);
                    continue;
                }
                let anthropic = op == Operation::Chat
                    && state
                        .provider(&c.provider)
                        .is_some_and(|(_, p)| p.kind() == ProviderKind::Anthropic);
                if anthropic {
                    let refusal = anthropic_refusal.get_or_insert_with(|| {
                        crate::protocols::anthropic::to_messages_request(
                            body,
                            &c.model,
                            defaults::DEFAULT_MAX_TOKENS,
                        )
                        .err()
                        .map(|e| e.message)
                    });
                    if let Some(reason) = refusal {
                        trail.skip(&c.provider, "", &c.model, "adapter");
                        why_not.get_or_insert(format!(
                            "{} on {} (an Anthropic provider) cannot take it: {reason}",
                            c.model, c.provider
                        ));
                        continue;
                    }
                }
                if !tiers
                    .iter()
                    .flatten()
                    .chain(out.iter())
                    .any(|o| o.provider == c.provider && o.model == c.model)
                {
                    out.push(c);
                }
            }
        }
        if !out.is_empty() {
            tiers.push(out);
        }
        // Without fallback the preferred tier is the call: when the request's needs cut it,
        // nothing else may answer.
        if !allow_fallback {
            break;
        }
    }
    if tiers.is_empty() {
        // The refusal names what ruled out each candidate (a filter, a need, the policy).
        if let Some(reason) = why_not {
            // Nothing in the pool fits what the request needs: no candidate.
            return Err(GatewayError::new(
                ErrorCode::ModelNotSupported,
                format!("No model '{requested}' can serve this request: {reason}."),
            )
            .with_param("model")
            .with_trail(trail));
        }
        return Err(GatewayError::new(
            ErrorCode::PoolUnavailable,
            format!("No provider in the pool can serve '{requested}' for this request."),
        )
        .with_trail(trail));
    }
    let first_choice = tiers.first().and_then(|t| t.first()).cloned();
    if policy.auto_sort == Some(true) {
        tiers = crate::lanes::cost::cheapest_first(state, tiers, &needs);
    }
    let stream =
        op == Operation::Chat && body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Resolved {
        tiers,
        trail,
        first_choice,
        reset_interval_ms: policy.reset_interval_ms.unwrap_or(0),
        needs,
        max_attempts: policy
            .max_attempts
            .filter(|n| *n > 0)
            .unwrap_or(defaults::MAX_ATTEMPTS),
        timeout_ms: policy
            .timeout_ms
            .filter(|n| *n > 0)
            .unwrap_or(defaults::TIMEOUT_MS),
        deadline_ms: policy
            .deadline_ms
            .filter(|n| *n > 0)
            .unwrap_or(defaults::DEADLINE_MS),
        stream,
        include_usage,
        profile: profile.map(|_| requested.clone()),
        prompt_cache: policy.prompt_cache.clone().unwrap_or_default(),
        cache: policy.cache,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_proto::v1::{Model, Provider, Snapshot};
    use serde_json::json;

    fn model(id: &str, aliases: &[&str]) -> Model {
        Model {
            id: id.into(),
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }
    }

    fn state() -> State {
        let mut snap = Snapshot::default();
        snap.providers.push(Provider {
            id: "p1".into(),
            models: vec![model("m1", &["chat"]), model("big", &["smart"])],
            ..Default::default()
        });
        snap.providers.push(Provider {
            id: "p2".into(),
            models: vec![model("m1", &["chat"])],
            ..Default::default()
        });
        snap.defaults = Some(Policy {
            fallbacks: vec!["smart".into()],
            ..Default::default()
        });
        snap.profiles.insert(
            "strict".into(),
            Policy {
                model: Some("smart".into()),
                allow_fallback: Some(false),
                max_attempts: Some(2),
                ..Default::default()
            },
        );
        State::new(1, snap)
    }

    fn all_key() -> VirtualKey {
        VirtualKey {
            id: "k".into(),
            profiles: vec!["*".into()],
            models: vec!["*".into()],
            allow_fallback: true,
            enabled: true,
            ..Default::default()
        }
    }

    #[test]
    fn direct_model_with_default_fallbacks() {
        let r = resolve(
            &state(),
            &all_key(),
            &json!({"model":"chat","messages":[]}),
            Operation::Chat,
        )
        .unwrap();
        assert_eq!(r.tiers.len(), 2);
        assert_eq!(
            r.tiers[0]
                .iter()
                .map(|c| c.provider.as_str())
                .collect::<Vec<_>>(),
            vec!["p1", "p2"]
        );
        assert_eq!(r.tiers[1][0].model, "big");
        assert_eq!(r.max_attempts, defaults::MAX_ATTEMPTS);
    }

    #[test]
    fn profile_policy_and_pinning() {
        let r = resolve(
            &state(),
            &all_key(),
            &json!({"model":"strict","stream":true}),
            Operation::Chat,
        )
        .unwrap();
        assert_eq!(r.tiers.len(), 1);
        assert_eq!(r.tiers[0][0].model, "big");
        assert_eq!(r.max_attempts, 2);
        assert!(r.stream);
    }

    /// `state()` with prices: m1 costs more on p1 than on p2, big is dearer than both.
    fn priced(auto_sort: bool) -> State {
        let mut s = state().snapshot.clone();
        let price = |input: f64, output: f64| {
            Some(ai_router_proto::v1::Cost {
                input,
                output,
                cached_input: None,
            })
        };
        s.providers[0].models[0].cost = price(5.0, 5.0);
        s.providers[0].models[1].cost = price(50.0, 50.0);
        s.providers[1].models[0].cost = price(1.0, 1.0);
        s.defaults = Some(Policy {
            fallbacks: vec!["smart".into()],
            auto_sort: Some(auto_sort),
            ..Default::default()
        });
        s.profiles.insert(
            "priced".into(),
            Policy {
                candidates: vec![ai_router_proto::v1::Tier {
                    candidates: vec![
                        ai_router_proto::v1::Candidate {
                            model: "big".into(),
                            ..Default::default()
                        },
                        ai_router_proto::v1::Candidate {
                            model: "m1".into(),
                            provider: "p2".into(),
                            when: vec![ai_router_proto::v1::FallbackTrigger::Timeout.into()],
                            ..Default::default()
                        },
                    ],
                }],
                ..Default::default()
            },
        );
        State::new(2, s)
    }

    fn lanes(r: &Resolved) -> Vec<Vec<String>> {
        r.tiers
            .iter()
            .map(|t| {
                t.iter()
                    .map(|c| format!("{}/{}", c.provider, c.model))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn auto_sort_orders_a_direct_call_cheapest_provider_first() {
        let body =
            json!({"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":10});
        let sorted = resolve(&priced(true), &all_key(), &body, Operation::Chat).unwrap();
        assert_eq!(lanes(&sorted), [["p2/m1"], ["p1/m1"], ["p1/big"]]);
        // The saving's baseline is the configured first choice.
        let first = sorted.first_choice.unwrap();
        assert_eq!(
            (first.provider.as_str(), first.model.as_str()),
            ("p1", "m1")
        );
        // Without autoSort the configured order stays.
        let kept = resolve(&priced(false), &all_key(), &body, Operation::Chat).unwrap();
        assert_eq!(lanes(&kept), vec![vec!["p1/m1", "p2/m1"], vec!["p1/big"]]);
    }

    #[test]
    fn a_profile_is_sorted_and_keeps_its_conditions() {
        let body = json!({"model":"priced","messages":[]});
        let r = resolve(&priced(true), &all_key(), &body, Operation::Chat).unwrap();
        assert_eq!(lanes(&r), [["p2/m1"], ["p1/big"]]);
        assert_eq!(r.tiers[0][0].when, ["timeout"]);
        assert!(r.tiers[1][0].when.is_empty());
    }

    #[test]
    fn a_routed_call_resolves_as_the_rules_profile() {
        let body = json!({"model":"chat","messages":[]});
        let r = resolve_as(&state(), &all_key(), &body, Operation::Chat, Some("strict")).unwrap();
        assert_eq!(
            r.tiers,
            vec![vec![Candidate {
                provider: "p1".into(),
                model: "big".into(),
                weight: 1.0,
                when: Vec::new(),
            }]]
        );
        assert_eq!(r.max_attempts, 2);
        // No model at all is fine once a rule chose the profile.
        assert!(resolve_as(
            &state(),
            &all_key(),
            &json!({}),
            Operation::Chat,
            Some("strict")
        )
        .is_ok());
    }

    #[test]
    fn errors() {
        let s = state();
        let k = all_key();
        assert_eq!(
            resolve(&s, &k, &json!({}), Operation::Chat)
                .unwrap_err()
                .code
                .as_str(),
            "missing_model"
        );
        assert_eq!(
            resolve(&s, &k, &json!({"model": 3}), Operation::Chat)
                .unwrap_err()
                .code
                .as_str(),
            "invalid_request"
        );
        assert_eq!(
            resolve(&s, &k, &json!({"model":"nope"}), Operation::Chat)
                .unwrap_err()
                .code
                .as_str(),
            "model_not_found"
        );
        let narrow = VirtualKey {
            models: vec!["big".into()],
            profiles: vec![],
            ..k.clone()
        };
        assert_eq!(
            resolve(&s, &narrow, &json!({"model":"chat"}), Operation::Chat)
                .unwrap_err()
                .status,
            403
        );
        assert_eq!(
            resolve(&s, &narrow, &json!({"model":"strict"}), Operation::Chat)
                .unwrap_err()
                .code
                .as_str(),
            "model_not_allowed"
        );
        // An alias of an allowed model id is another name: refused, never remapped.
        assert_eq!(
            resolve(&s, &narrow, &json!({"model":"smart"}), Operation::Chat)
                .unwrap_err()
                .code
                .as_str(),
            "model_not_allowed"
        );
        assert!(resolve(&s, &narrow, &json!({"model":"big"}), Operation::Chat).is_ok());
    }

    #[test]
    fn a_key_calls_only_the_names_it_lists() {
        let mut snap = Snapshot::default();
        for (provider, id) in [
            ("openai", "gpt-4o-mini"),
            ("local", "llama3"),
            ("openrouter", "openai/gpt-4o-mini"),
        ] {
            snap.providers.push(Provider {
                id: provider.into(),
                models: vec![model(id, &["fast"])],
                ..Default::default()
            });
        }
        snap.defaults = Some(Policy {
            fallbacks: vec!["fast".into()],
            ..Default::default()
        });
        let s = State::new(1, snap);
        let narrow = VirtualKey {
            models: vec!["gpt-4o-mini".into()],
            profiles: vec![],
            ..all_key()
        };
        let lanes = |name: &str| -> Vec<(String, String)> {
            resolve(&s, &narrow, &json!({"model": name}), Operation::Chat)
                .map(|r| {
                    r.tiers
                        .into_iter()
                        .flatten()
                        .map(|c| (c.provider, c.model))
                        .collect()
                })
                .unwrap_or_default()
        };
        // Nor is `fast` a fallback of the name it does call (the defaults fall back to `fast`).
        let only = vec![("openai".to_string(), "gpt-4o-mini".to_string())];
        assert_eq!(lanes("gpt-4o-mini"), only);
        // `fast` is an alias of the model the key lists, and of others: a name the key does not
        // list is refused, never remapped to the one it does.
        for name in ["fast", "llama3"] {
            assert_eq!(
                resolve(&s, &narrow, &json!({"model": name}), Operation::Chat)
                    .map(|_| ())
                    .unwrap_err()
                    .code
                    .as_str(),
                "model_not_allowed",
                "{name}"
            );
        }
        // A key that names the alias gets every model carrying it.
        let by_alias = VirtualKey {
            models: vec!["fast".into()],
            ..narrow.clone()
        };
        let all = resolve(&s, &by_alias, &json!({"model":"fast"}), Operation::Chat)
            .map(|r| r.tiers.into_iter().flatten().count())
            .unwrap_or(0);
        assert_eq!(all, 3);
    }

    #[test]
    fn without_fallback_a_cut_preferred_model_is_no_candidate() {
        let mut snap = Snapshot::default();
        snap.providers.push(Provider {
            id: "p1".into(),
            models: vec![Model {
                id: "small".into(),
                context_window: 100,
                ..Default::default()
            }],
            ..Default::default()
        });
        snap.providers.push(Provider {
            id: "p2".into(),
            models: vec![model("big", &[])],
            ..Default::default()
        });
        snap.profiles.insert(
            "strict".into(),
            Policy {
                model: Some("small".into()),
                fallbacks: vec!["big".into()],
                allow_fallback: Some(false),
                ..Default::default()
            },
        );
        snap.profiles.insert(
            "loose".into(),
            Policy {
                model: Some("small".into()),
                fallbacks: vec!["big".into()],
                ..Default::default()
            },
        );
        let s = State::new(1, snap);
        let long = "x".repeat(2_000);
        let body = |profile: &str| json!({"model": profile, "messages": [{"role": "user", "content": long}]});
        let err = resolve(&s, &all_key(), &body("strict"), Operation::Chat)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            (err.status, err.code.as_str()),
            (400, "model_not_supported")
        );
        let loose = resolve(&s, &all_key(), &body("loose"), Operation::Chat)
            .map(|r| {
                r.tiers
                    .into_iter()
                    .flatten()
                    .map(|c| c.model)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        assert_eq!(loose, vec!["big".to_string()]);
    }

    #[test]
    fn an_anthropic_lane_that_cannot_take_the_request_is_no_candidate() {
        let mut snap = Snapshot::default();
        snap.providers.push(Provider {
            id: "claude".into(),
            kind: ProviderKind::Anthropic.into(),
            models: vec![model("claude-m", &["smart"])],
            ..Default::default()
        });
        snap.providers.push(Provider {
            id: "oai".into(),
            kind: ProviderKind::Openai.into(),
            models: vec![model("gpt-m", &["smart"])],
            ..Default::default()
        });
        let s = State::new(1, snap);
        let two = |name: &str| json!({"model": name, "n": 2, "messages": [{"role": "user", "content": "hi"}]});
        let lanes = resolve(&s, &all_key(), &two("smart"), Operation::Chat)
            .map(|r| {
                r.tiers
                    .into_iter()
                    .flatten()
                    .map(|c| c.provider)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        assert_eq!(lanes, vec!["oai".to_string()]);
        let err = resolve(&s, &all_key(), &two("claude-m"), Operation::Chat)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            (err.status, err.code.as_str()),
            (400, "model_not_supported")
        );
        assert!(err.message.contains("Anthropic"), "{}", err.message);
        // A request the adapter can express keeps both.
        let one = json!({"model": "smart", "messages": [{"role": "user", "content": "hi"}]});
        let both = resolve(&s, &all_key(), &one, Operation::Chat)
            .map(|r| r.tiers.into_iter().flatten().count())
            .unwrap_or(0);
        assert_eq!(both, 2);
    }

    #[test]
    fn key_without_fallback_keeps_first_tier() {
        let k = VirtualKey {
            allow_fallback: false,
            ..all_key()
        };
        let r = resolve(&state(), &k, &json!({"model":"chat"}), Operation::Chat).unwrap();
        assert_eq!(r.tiers.len(), 1);
    }

    #[test]
    fn models_list_respects_scope() {
        let s = state();
        let narrow = VirtualKey {
            models: vec!["m1".into()],
            profiles: vec![],
            ..all_key()
        };
        // Only the names it lists: `chat`, m1's alias, is another name.
        assert_eq!(model_list(&s, &narrow), vec!["m1".to_string()]);
        assert!(model_list(&s, &all_key()).contains(&"strict".to_string()));
    }

    #[test]
    fn needs_cut_candidates() {
        let mut snap = Snapshot::default();
        let small = Model {
            id: "small".into(),
            context_window: 100,
            ..Default::default()
        };
        let notools = Model {
            id: "plain".into(),
            capabilities: vec![Capability::Chat.into(), Capability::Streaming.into()],
            ..Default::default()
        };
        let pricey = Model {
            id: "pricey".into(),
            cost: Some(ai_router_proto::v1::Cost {
                input: 1000.0,
                output: 1000.0,
                cached_input: None,
            }),
            ..Default::default()
        };
        let emb = Model {
            id: "emb".into(),
            capabilities: vec![Capability::Embeddings.into()],
            ..Default::default()
        };
        snap.providers.push(Provider {
            id: "p".into(),
            models: vec![small, notools, pricey, emb],
            ..Default::default()
        });
        let s = State::new(1, snap);
        let k = all_key();
        let long = "x".repeat(1000);
        let e = resolve(
            &s,
            &k,
            &json!({"model":"small","messages":[{"role":"user","content": long}]}),
            Operation::Chat,
        )
        .unwrap_err();
        assert_eq!((e.status, e.code.as_str()), (400, "model_not_supported"));
        assert!(e.message.contains("context window"), "{}", e.message);
        let e = resolve(
            &s,
            &k,
            &json!({"model":"plain","messages":[],"tools":[{"type":"function"}]}),
            Operation::Chat,
        )
        .unwrap_err();
        assert!(e.message.contains("tools"), "{}", e.message);
        assert!(resolve(
            &s,
            &k,
            &json!({"model":"plain","messages":[],"stream":true}),
            Operation::Chat
        )
        .is_ok());
        let e = resolve(
            &s,
            &k,
            &json!({"model":"plain","messages":[],"response_format":{"type":"json_object"}}),
            Operation::Chat,
        )
        .unwrap_err();
        assert!(e.message.contains("json"), "{}", e.message);
        assert!(resolve(
            &s,
            &k,
            &json!({"model":"emb","messages":[]}),
            Operation::Chat
        )
        .is_err());
        assert!(resolve(
            &s,
            &k,
            &json!({"model":"emb","input":"hi"}),
            Operation::Embeddings
        )
        .is_ok());
        assert!(resolve(
            &s,
            &k,
            &json!({"model":"plain","input":"hi"}),
            Operation::Embeddings
        )
        .is_err());
        // Budget: the worst case of a pricey model is over maxCost.
        let mut snap = s.snapshot.clone();
        snap.defaults = Some(Policy {
            max_cost: Some(0.5),
            ..Default::default()
        });
        let s2 = State::new(2, snap);
        let e = resolve(
            &s2,
            &k,
            &json!({"model":"pricey","messages":[],"max_tokens":1000}),
            Operation::Chat,
        )
        .unwrap_err();
        assert!(e.message.contains("budget"), "{}", e.message);
        let n = Needs::of(
            &json!({"messages":[{"content":"abcd"}],"max_tokens":7}),
            Operation::Chat,
            [Capability::Tools],
        );
        // A policy's requirement is needed even when the body does not ask for it.
        assert!(n.capabilities.contains(&Capability::Tools));
        assert_eq!(n.max_tokens, 7);
    }

    #[test]
    fn merge_is_field_by_field() {
        let a = Policy {
            max_attempts: Some(3),
            fallbacks: vec!["x".into()],
            ..Default::default()
        };
        let b = Policy {
            timeout_ms: Some(5),
            ..Default::default()
        };
        let m = merge(&a, &b);
        assert_eq!(m.max_attempts, Some(3));
        assert_eq!(m.timeout_ms, Some(5));
        assert_eq!(m.fallbacks, vec!["x".to_string()]);
        // An empty list the later policy sets is empty, not "inherit".
        let cleared = Policy {
            set_lists: vec![PolicyList::Fallbacks.into(), PolicyList::Providers.into()],
            ..Default::default()
        };
        let a = Policy {
            providers: vec!["p1".into()],
            ..a
        };
        let m = merge(&a, &cleared);
        assert!(m.fallbacks.is_empty() && m.providers.is_empty(), "{m:?}");
        assert_eq!(m.max_attempts, Some(3));
    }
}
