//! Discovered models (`discover: true` on a provider): which keys reach a model.
//!
//! The control plane lists each key's catalog and pushes what it found: on the key, `listed`
//! and the sorted model ids of its listing; on the provider, the models no configuration
//! names, flagged `discovered`. A listed key reaches exactly the models its catalog lists; a
//! key not listed yet (or whose every listing failed) reaches the configured models only, as
//! it would without discovery. Any other pair is no lane: the routing trail says `not_listed`.

//!
//! The rule itself is `ProviderKey::reaches` (in the proto crate, shared with the control
//! plane's catalog); [`crate::lanes::pick::pick`] applies it to every candidate key.

/// The routing trail's word for a key whose catalog does not list the model.
pub const NOT_LISTED: &str = crate::lanes::out::OutReason::NotListed.as_str();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::pick::{pick, Pick, Request, Skipped};
    use crate::plan::Candidate;
    use crate::state::State;
    use crate::vm::round_robin::RoundRobin;
    use crate::vm::view::NoView;
    use crate::vocab::LaneId;
    use ai_router_proto::v1::{Model, ProviderKey};
    use ai_router_proto::v1::{Provider, Snapshot};

    /// A key with a secret; `listed`: its catalog, in order.
    fn key(alias: &str, listed: Option<Vec<String>>) -> ProviderKey {
        ProviderKey {
            alias: alias.into(),
            secret: format!("sk-{alias}"),
            fingerprint: ai_router_contract::fingerprint(&format!("sk-{alias}")),
            listed: listed.is_some(),
            models: listed.unwrap_or_default(),
            ..Default::default()
        }
    }

    fn state() -> State {
        let mut s = Snapshot::default();
        s.providers.push(Provider {
            id: "p1".into(),
            keys: vec![
                key("a", Some(vec!["m-conf".into(), "m-found".into()])),
                key("b", Some(vec!["m-conf".into()])),
                key("c", None),
            ],
            models: vec![
                Model {
                    id: "m-conf".into(),
                    ..Default::default()
                },
                Model {
                    id: "m-found".into(),
                    discovered: true,
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        State::new(1, s)
    }

    fn tier(model: &str) -> Vec<Vec<Candidate>> {
        vec![vec![Candidate {
            provider: "p1".into(),
            model: model.into(),
            weight: 1.0,
            when: Vec::new(),
        }]]
    }

    /// Every key the picker would use for `model` in turn, and what it skipped.
    fn keys_for(model: &str) -> (Vec<String>, Vec<Skipped>) {
        let state = state();
        let mut rr = RoundRobin::default();
        let mut tried: Vec<LaneId> = Vec::new();
        let mut skipped = Vec::new();
        loop {
            let req = Request {
                tried: &tried,
                ..Request::default()
            };
            match pick(&state, &tier(model), req, &NoView, &mut rr, 0, &mut skipped) {
                Pick::Lane(chosen) if !tried.contains(&chosen.lane) => tried.push(chosen.lane),
                _ => break,
            }
        }
        (tried.into_iter().map(|l| l.key).collect(), skipped)
    }

    #[test]
    fn the_picker_routes_a_discovered_model_only_through_the_keys_that_list_it() {
        let (keys, skipped) = keys_for("m-found");
        assert_eq!(keys, vec!["a".to_string()]);
        let reasons: Vec<(&str, &str)> = skipped
            .iter()
            .map(|s| (s.lane.key.as_str(), s.reason.as_str()))
            .collect();
        assert!(reasons.contains(&("b", NOT_LISTED)), "{reasons:?}");
        assert!(reasons.contains(&("c", NOT_LISTED)), "{reasons:?}");
        // A configured model: the keys that list it, and the key not listed yet.
        let (mut keys, _) = keys_for("m-conf");
        keys.sort();
        assert_eq!(keys, vec!["a".to_string(), "b".into(), "c".into()]);
    }
}
