//! The candidate tiers of a call: the names its profile (or the model and the defaults'
//! fallbacks) lists, each followed by its family's siblings, each name's lanes admitted when
//! they can serve the request.

use ai_router_proto::v1::{Policy, ProviderKind, Selection, VirtualKey};
use serde_json::Value;

use super::candidates::{candidates_for, key_may_call_model, unfit, FamilyEntry, NamedCandidate};
use super::policy::{allows, merge};
use crate::answer::errors::GatewayError;
use crate::answer::trail::Trail;
use crate::plan::{Candidate, Operation};
use crate::state::State;
use crate::vocab::Needs;
use ai_router_contract::error_code::ErrorCode;

/// A profile's policy (over the defaults) and the tiers of names it lists: its candidates, or
/// its model and fallbacks.
pub(super) fn of_profile(
    key: &VirtualKey,
    requested: &str,
    defaults: &Policy,
    profile: &Policy,
) -> Result<(Policy, Vec<Vec<NamedCandidate>>), GatewayError> {
    if !allows(&key.profiles, requested) {
        return Err(GatewayError::new(
            ErrorCode::ModelNotAllowed,
            format!("This key may not call the profile '{requested}'."),
        )
        .with_param("model"));
    }
    let policy = merge(defaults, profile);
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
    Ok((policy, tiers))
}

/// A direct model call's policy (the defaults, with this model) and tiers: the model, then
/// the defaults' fallbacks the key may call.
pub(super) fn of_model(
    state: &State,
    key: &VirtualKey,
    requested: &str,
    defaults: &Policy,
) -> Result<(Policy, Vec<Vec<NamedCandidate>>), GatewayError> {
    if state.models_named(requested).is_empty() {
        return Err(GatewayError::new(
            ErrorCode::ModelNotFound,
            format!("The model '{requested}' does not exist in this gateway's pool."),
        )
        .with_param("model"));
    }
    if !key_may_call_model(state, key, requested) {
        return Err(GatewayError::new(
            ErrorCode::ModelNotAllowed,
            format!("This key may not call the model '{requested}'."),
        )
        .with_param("model"));
    }
    // A direct model call falls back only through the defaults' fallbacks the key may call.
    let mut tiers = vec![vec![NamedCandidate::named(requested.to_string())]];
    for f in &defaults.fallbacks {
        if f != requested && key_may_call_model(state, key, f) {
            tiers.push(vec![NamedCandidate::named(f.clone())]);
        }
    }
    let mut policy = defaults.clone();
    policy.model = Some(requested.to_string());
    Ok((policy, tiers))
}

/// Each tier followed by its same-family siblings; a sibling keeps the weight and the `when`
/// of the candidate that brought it. `rank_fallbacks`: a direct call's fallbacks follow the
/// families' ranks.
pub(super) fn with_siblings(
    state: &State,
    tiers_by_name: Vec<Vec<NamedCandidate>>,
    rank_fallbacks: bool,
) -> impl Iterator<Item = Vec<NamedCandidate>> {
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
    crate::lanes::families::with_siblings(state, indexed, rank_fallbacks)
        .into_iter()
        .map(move |tier| {
            tier.into_iter()
                .map(|(name, provider, (weight, i))| NamedCandidate {
                    name,
                    provider,
                    weight,
                    when: whens.get(i).cloned().unwrap_or_default(),
                })
                .collect::<Vec<_>>()
        })
}

/// Admits a call's lanes tier by tier: what rules one out goes to the trail, and the first
/// reason to the refusal when nothing is left.
pub(super) struct Admission<'a> {
    state: &'a State,
    body: &'a Value,
    op: Operation,
    policy: &'a Policy,
    needs: &'a Needs,
    /// The key whose model scope a direct call stays within; `None` for a profile.
    scope: Option<&'a VirtualKey>,
    selection: Selection,
    trail: Trail,
    why_not: Option<String>,
    /// What the Anthropic adapter cannot express (`n: 2`...), worked out once, when a
    /// candidate is of kind anthropic: such a lane is no candidate for this request.
    anthropic_refusal: Option<Option<String>>,
}

impl<'a> Admission<'a> {
    pub(super) fn new(
        state: &'a State,
        body: &'a Value,
        op: Operation,
        policy: &'a Policy,
        needs: &'a Needs,
        scope: Option<&'a VirtualKey>,
    ) -> Self {
        Self {
            state,
            body,
            op,
            policy,
            needs,
            scope,
            selection: state.selection(),
            trail: Trail::default(),
            why_not: None,
            anthropic_refusal: None,
        }
    }

    /// The caller speaks Messages: an anthropic lane takes its body as it came, never through
    /// the adapter from chat, whose refusals then rule no lane out.
    pub(super) fn native_to_anthropic(&mut self) {
        self.anthropic_refusal = Some(None);
    }

    /// The lanes of one tier of names that can serve, without those an earlier tier (`before`)
    /// or this one already has.
    pub(super) fn tier(
        &mut self,
        tier: Vec<NamedCandidate>,
        before: &[Vec<Candidate>],
    ) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = Vec::new();
        for named in tier {
            for c in candidates_for(self.state, &named, self.policy, self.scope, &mut self.trail) {
                if !self.admits(&c) {
                    continue;
                }
                if !before
                    .iter()
                    .flatten()
                    .chain(out.iter())
                    .any(|o| o.provider == c.provider && o.model == c.model)
                {
                    out.push(c);
                }
            }
        }
        out
    }

    /// Whether the lane can serve: not skipped by its provider's terms, fit for the request's
    /// needs and the policy's budget, and (an anthropic lane of a chat call) able to take it.
    fn admits(&mut self, c: &Candidate) -> bool {
        let state = self.state;
        let skip = state
            .provider(&c.provider)
            .and_then(|(_, p)| crate::lanes::terms::skipped(&self.selection, p));
        if let Some(skip) = skip {
            self.trail.skip(&c.provider, "", &c.model, skip.reason());
            self.why_not.get_or_insert(format!(
                "{} on {} is skipped ({}): {}",
                c.model,
                c.provider,
                skip.reason(),
                skip.explain(&self.selection)
            ));
            return false;
        }
        if let Some((code, reason)) = unfit(state, c, self.needs, self.policy.max_cost) {
            self.trail.skip(&c.provider, "", &c.model, &code);
            self.why_not.get_or_insert(reason);
            return false;
        }
        // The provider's `defaultMaxTokens` as given (the translation refuses a body whatever
        // the number, so the first Anthropic lane's judgement stands for all).
        let anthropic = state
            .provider(&c.provider)
            .filter(|(_, p)| self.op == Operation::Chat && p.kind() == ProviderKind::Anthropic)
            .map(|(_, p)| p.default_max_tokens);
        if let Some(max_tokens) = anthropic {
            let body = self.body;
            let refusal = self.anthropic_refusal.get_or_insert_with(|| {
                crate::protocols::anthropic::request::to_messages_request(
                    body, &c.model, max_tokens,
                )
                .err()
                .map(|e| e.message)
            });
            if let Some(reason) = refusal {
                self.trail.skip(&c.provider, "", &c.model, "adapter");
                self.why_not.get_or_insert(format!(
                    "{} on {} (an Anthropic provider) cannot take it: {reason}",
                    c.model, c.provider
                ));
                return false;
            }
        }
        true
    }

    /// The trail of what was ruled out, and the first reason.
    pub(super) fn finish(self) -> (Trail, Option<String>) {
        (self.trail, self.why_not)
    }
}
