//! The candidates a name reaches, and whether one can serve the request.

use ai_router_proto::v1::{Capability, Policy, VirtualKey};

use super::policy::allows;
use crate::plan::Candidate;
use crate::state::State;
use crate::vocab::Needs;

/// A named candidate as `families::with_siblings` takes it: name, provider, (weight, index of
/// its `when`).
pub(super) type FamilyEntry = (String, Option<String>, (f64, usize));

/// A candidate by the name the policy uses.
pub(super) struct NamedCandidate {
    pub(super) name: String,
    pub(super) provider: Option<String>,
    pub(super) weight: f64,
    pub(super) when: Vec<String>,
}

impl NamedCandidate {
    pub(super) fn named(name: String) -> Self {
        Self {
            name,
            provider: None,
            weight: 1.0,
            when: Vec::new(),
        }
    }
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
pub(super) fn key_may_call_model(state: &State, key: &VirtualKey, name: &str) -> bool {
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
pub(super) fn candidates_for(
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
pub(super) fn unfit(
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
