use super::policy::merge;
use super::*;
use ai_router_contract::defaults;
use ai_router_proto::v1::{Capability, Policy, PolicyList, ProviderKind};
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
    let body = json!({"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":10});
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
    let r = resolve_as(
        &state(),
        &all_key(),
        &body,
        Operation::Chat,
        Some("strict"),
        crate::plan::Protocol::Chat,
    )
    .unwrap();
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
        Some("strict"),
        crate::plan::Protocol::Chat,
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
    let body =
        |profile: &str| json!({"model": profile, "messages": [{"role": "user", "content": long}]});
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
    // A Messages caller's body goes to an anthropic lane as it came: no adapter to refuse it.
    let messages = resolve_as(
        &s,
        &all_key(),
        &two("smart"),
        Operation::Chat,
        None,
        crate::plan::Protocol::Messages,
    )
    .map(|r| r.tiers.into_iter().flatten().count())
    .unwrap_or(0);
    assert_eq!(messages, 2);
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

/// The defaults the control plane pushed are the call's, for a profile that sets none: the
/// filter applies no default of its own over them.
#[test]
fn a_call_takes_the_pushed_defaults_numbers_and_switches() {
    let mut snap = Snapshot::default();
    snap.providers.push(Provider {
        id: "p1".into(),
        models: vec![model("m1", &["chat"]), model("big", &["smart"])],
        ..Default::default()
    });
    snap.defaults = Some(Policy {
        fallbacks: vec!["smart".into()],
        allow_fallback: Some(false),
        max_attempts: Some(7),
        timeout_ms: Some(1_234),
        deadline_ms: Some(5_678),
        ..Default::default()
    });
    snap.profiles.insert(
        "plain".into(),
        Policy {
            model: Some("chat".into()),
            fallbacks: vec!["smart".into()],
            ..Default::default()
        },
    );
    let state = State::new(1, snap);
    for model in ["chat", "plain"] {
        let r = resolve(
            &state,
            &all_key(),
            &json!({ "model": model }),
            Operation::Chat,
        )
        .unwrap();
        assert_eq!(
            (r.max_attempts, r.timeout_ms, r.deadline_ms),
            (7, 1_234, 5_678),
            "{model}"
        );
        // allowFallback false: the fallback tier is not reached.
        assert_eq!(r.tiers.len(), 1, "{model}");
    }
}

/// A snapshot that sent no defaults settles them once, from the contract.
#[test]
fn unsent_policy_defaults_are_the_contracts() {
    let state = State::new(1, Snapshot::default());
    let d = state.defaults();
    assert_eq!(
        (
            d.allow_fallback,
            d.max_attempts,
            d.timeout_ms,
            d.deadline_ms
        ),
        (
            Some(defaults::ALLOW_FALLBACK),
            Some(defaults::MAX_ATTEMPTS),
            Some(defaults::TIMEOUT_MS),
            Some(defaults::DEADLINE_MS),
        )
    );
}
