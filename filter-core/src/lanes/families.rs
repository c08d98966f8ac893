//! Canonical model families: one model served by several providers under different ids
//! (gpt-oss-120b is `openai/gpt-oss-120b` on Groq, `@cf/openai/gpt-oss-120b` on Cloudflare...).
//! The control plane pushes each pool model's family (the bundled table, `family:` in the
//! config, else the model's own id) and the family's quality rank.
//!
//! - A request may name a family: `model: "family:gpt-oss-120b"` reaches every member the
//!   virtual key may call, on every provider (the state indexes `family:<name>` as a name).
//! - Fallback keeps the family: after each tier of the plan comes a tier of the same
//!   families' other members (other ids, other providers), before the next tier's model. A
//!   tier that spans several families lists their siblings best rank first.
//! - Fallback to other families, once the requested model's family has no route left: for a
//!   direct model call (`defaults.fallbacks`) the better-ranked family first (rank 1 best),
//!   the operator's order among families of one rank; a profile's tiers are the operator's
//!   explicit order and are kept as written. A profile candidate that names its provider
//!   (`{provider, model}`) is an exact lane and brings no siblings; `allowFallback: false`
//!   keeps the first tier only, siblings included.

use crate::state::State;
use crate::vocab::family::{name_of, PREFIX};

/// The families (name, rank) of the pool models serving `name`, best rank first; a
/// `family:` name is its own family already.
fn families_serving(state: &State, name: &str) -> Vec<(String, u32)> {
    if name.starts_with(PREFIX) {
        return Vec::new();
    }
    let mut out: Vec<(String, u32)> = Vec::new();
    for r in state.models_named(name) {
        let Some(m) = state
            .provider_at(r.provider)
            .and_then(|p| p.models.get(r.model))
        else {
            continue;
        };
        if !m.family.is_empty() && !out.iter().any(|(f, _)| f == &m.family) {
            out.push((m.family.clone(), m.family_rank));
        }
    }
    // Unranked (0) last.
    out.sort_by_key(|(_, rank)| if *rank == 0 { u32::MAX } else { *rank });
    out
}

/// The best (lowest) rank of the families serving a tier's names; unranked: last.
fn best_rank<W, P>(state: &State, tier: &[(String, P, W)]) -> u32 {
    tier.iter()
        .flat_map(|(name, _, _)| families_serving(state, name))
        .map(|(_, rank)| if rank == 0 { u32::MAX } else { rank })
        .min()
        .unwrap_or(u32::MAX)
}

/// The plan's tiers by name with, after each, a tier of its families' other members. With
/// `rank_fallbacks`, the tiers after the first (each with its siblings) go better-ranked family
/// first, keeping their order within a rank.
pub fn with_siblings<W: Copy, P>(
    state: &State,
    mut tiers: Vec<Vec<(String, P, W)>>,
    rank_fallbacks: bool,
) -> Vec<Vec<(String, Option<String>, W)>>
where
    P: Into<Option<String>>,
{
    if rank_fallbacks && tiers.len() > 2 {
        let mut fallbacks = tiers.split_off(1);
        // A stable sort: the operator's order among equals.
        fallbacks.sort_by_cached_key(|tier| best_rank(state, tier));
        tiers.extend(fallbacks);
    }
    let mut out = Vec::new();
    for tier in tiers {
        let mut siblings: Vec<(String, Option<String>, W)> = Vec::new();
        let mut named: Vec<(String, Option<String>, W)> = Vec::new();
        for (name, provider, weight) in tier {
            let provider: Option<String> = provider.into();
            // A candidate naming its provider is the operator's exact lane: no siblings.
            let families = match provider {
                Some(_) => Vec::new(),
                None => families_serving(state, &name),
            };
            for (family, _) in families {
                let family = name_of(&family);
                if !siblings.iter().any(|(n, _, _)| n == &family) {
                    siblings.push((family, None, weight));
                }
            }
            named.push((name, provider, weight));
        }
        out.push(named);
        if !siblings.is_empty() {
            out.push(siblings);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::plan::{Candidate, Operation};
    use crate::resolve::resolve;
    use crate::state::State;
    use ai_router_proto::v1::{
        Model, Policy, Provider, ProviderTerms, Selection, Snapshot, VirtualKey,
    };
    use serde_json::json;

    fn model(id: &str, family: &str, rank: u32) -> Model {
        Model {
            id: id.into(),
            family: family.into(),
            family_rank: rank,
            ..Model::default()
        }
    }

    /// gpt-oss-120b on groq and on cloudflare under another id, a better-ranked kimi-k2 on
    /// openrouter (the defaults' fallback), and a model of its own.
    fn state(selection: Selection) -> State {
        state_falling_back(selection, &["moonshotai/kimi-k2"])
    }

    fn state_falling_back(selection: Selection, fallbacks: &[&str]) -> State {
        let mut snap = Snapshot::default();
        snap.providers.push(Provider {
            id: "groq".into(),
            models: vec![model("openai/gpt-oss-120b", "gpt-oss-120b", 2)],
            ..Provider::default()
        });
        snap.providers.push(Provider {
            id: "openrouter".into(),
            models: vec![model("moonshotai/kimi-k2", "kimi-k2", 1)],
            ..Provider::default()
        });
        snap.providers.push(Provider {
            id: "cloudflare".into(),
            models: vec![
                model("@cf/openai/gpt-oss-120b", "gpt-oss-120b", 2),
                model("house-model", "house-model", 3),
            ],
            terms: Some(ProviderTerms {
                blocked_regions: vec!["DE".into()],
                ..ProviderTerms::default()
            }),
            ..Provider::default()
        });
        snap.defaults = Some(Policy {
            fallbacks: fallbacks.iter().map(|f| f.to_string()).collect(),
            ..Policy::default()
        });
        snap.profiles.insert(
            "exact".into(),
            Policy {
                candidates: vec![ai_router_proto::v1::Tier {
                    candidates: vec![ai_router_proto::v1::Candidate {
                        when: Vec::new(),
                        model: "openai/gpt-oss-120b".into(),
                        provider: "groq".into(),
                        weight: 1.0,
                    }],
                }],
                ..Policy::default()
            },
        );
        snap.selection = Some(selection);
        State::new(1, snap)
    }

    fn key(models: &[&str]) -> VirtualKey {
        VirtualKey {
            id: "vk".into(),
            models: models.iter().map(|m| m.to_string()).collect(),
            allow_fallback: true,
            enabled: true,
            ..VirtualKey::default()
        }
    }

    fn lanes(tiers: &[Vec<Candidate>]) -> Vec<Vec<String>> {
        tiers
            .iter()
            .map(|t| {
                t.iter()
                    .map(|c| format!("{}/{}", c.provider, c.model))
                    .collect()
            })
            .collect()
    }

    fn call(state: &State, key: &VirtualKey, model: &str) -> Result<Vec<Vec<String>>, String> {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        resolve(state, key, &body, Operation::Chat)
            .map(|r| lanes(&r.tiers))
            .map_err(|e| e.message)
    }

    #[test]
    fn the_same_family_on_another_provider_comes_before_a_better_ranked_family() {
        let s = state(Selection::default());
        assert_eq!(
            call(&s, &key(&["*"]), "openai/gpt-oss-120b"),
            Ok(vec![
                vec!["groq/openai/gpt-oss-120b".to_string()],
                vec!["cloudflare/@cf/openai/gpt-oss-120b".to_string()],
                vec!["openrouter/moonshotai/kimi-k2".to_string()],
            ])
        );
        // A profile candidate naming its provider is an exact lane: no siblings.
        let exact = key(&["*"]);
        let exact = VirtualKey {
            profiles: vec!["*".into()],
            ..exact
        };
        assert_eq!(
            call(&s, &exact, "exact"),
            Ok(vec![vec!["groq/openai/gpt-oss-120b".to_string()]])
        );
    }

    #[test]
    fn fallback_to_other_families_goes_better_ranked_first() {
        // house-model (rank 3) listed before kimi-k2 (rank 1) among the defaults' fallbacks.
        let s = state_falling_back(Selection::default(), &["house-model", "moonshotai/kimi-k2"]);
        assert_eq!(
            call(&s, &key(&["*"]), "openai/gpt-oss-120b"),
            Ok(vec![
                vec!["groq/openai/gpt-oss-120b".to_string()],
                vec!["cloudflare/@cf/openai/gpt-oss-120b".to_string()],
                vec!["openrouter/moonshotai/kimi-k2".to_string()],
                vec!["cloudflare/house-model".to_string()],
            ])
        );
        // The requested model comes first even when it ranks worst.
        assert_eq!(
            call(&s, &key(&["*"]), "house-model").map(|t| t[0].clone()),
            Ok(vec!["cloudflare/house-model".to_string()])
        );
    }

    #[test]
    fn a_request_may_name_a_family_and_stays_within_the_keys_models() {
        let s = state(Selection::default());
        assert_eq!(
            call(&s, &key(&["*"]), "family:gpt-oss-120b"),
            Ok(vec![
                vec![
                    "groq/openai/gpt-oss-120b".to_string(),
                    "cloudflare/@cf/openai/gpt-oss-120b".to_string()
                ],
                vec!["openrouter/moonshotai/kimi-k2".to_string()],
            ])
        );
        // A key scoped to groq's id reaches only that member, by id or by family.
        let narrow = key(&["openai/gpt-oss-120b"]);
        assert_eq!(
            call(&s, &narrow, "family:gpt-oss-120b"),
            Ok(vec![vec!["groq/openai/gpt-oss-120b".to_string()]])
        );
        assert!(call(&s, &narrow, "family:kimi-k2").is_err());
        // An unknown model is a family of its own.
        assert_eq!(
            call(&s, &key(&["*"]), "family:house-model").map(|t| t[0].clone()),
            Ok(vec!["cloudflare/house-model".to_string()])
        );
        assert!(call(&s, &key(&["*"]), "family:nothing").is_err());
    }

    #[test]
    fn a_filter_drops_its_providers_and_names_the_reason_when_nothing_is_left() {
        let germany = state(Selection {
            region: "DE".into(),
            ..Selection::default()
        });
        assert_eq!(
            call(&germany, &key(&["*"]), "openai/gpt-oss-120b"),
            Ok(vec![
                vec!["groq/openai/gpt-oss-120b".to_string()],
                vec!["openrouter/moonshotai/kimi-k2".to_string()],
            ])
        );
        // Only cloudflare serves house-model, and the key may call nothing else.
        let err = call(&germany, &key(&["house-model"]), "house-model")
            .err()
            .unwrap_or_default();
        assert!(err.contains("region_blocked"), "{err}");
        assert!(!err.contains("sk-"), "{err}");
        // The refusal's trail names the provider the filter removed, with its reason.
        let body = json!({"model": "house-model", "messages": [{"role": "user", "content": "hi"}]});
        let trail = resolve(&germany, &key(&["house-model"]), &body, Operation::Chat)
            .err()
            .and_then(|e| e.trail)
            .map(|t| t.skipped)
            .unwrap_or_default();
        assert_eq!(
            trail,
            [crate::answer::trail::Skip {
                provider: "cloudflare".into(),
                key: String::new(),
                model: "house-model".into(),
                reason: "region_blocked".into(),
            }]
        );
    }
}
