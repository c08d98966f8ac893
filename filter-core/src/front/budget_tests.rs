//! A spent hard budget through the front stage: the call's `when: [budget_exceeded]` step
//! takes it instead of the 429, and the routing trail names what the budget ruled out.

use super::*;
use crate::testing::{model, open_key, provider, FakeHost};
use ai_router_proto::v1::{
    Budget, BudgetLevel, BudgetScope, BudgetState, BudgetWindow, Budgets, Candidate as PbCandidate,
    FallbackTrigger, Policy, Snapshot, Tier,
};

const KEY: &str = "sk-starci-app-0123456789abcdef";

fn snapshot(scope: BudgetScope, subject: &str, with_step: bool) -> Snapshot {
    let mut snap = Snapshot::default();
    for (id, name) in [("dear", "big"), ("cheap", "mini")] {
        snap.providers
            .push(provider(id, &format!("sk-{id}"), vec![model(name, &[])]));
    }
    snap.virtual_keys.push(open_key("key_app", KEY));
    let tier = |model: &str, provider: &str, when: Vec<i32>| Tier {
        candidates: vec![PbCandidate {
            model: model.into(),
            provider: provider.into(),
            weight: 1.0,
            when,
        }],
    };
    let mut candidates = vec![tier("big", "dear", vec![])];
    if with_step {
        candidates.push(tier(
            "mini",
            "cheap",
            vec![FallbackTrigger::BudgetExceeded.into()],
        ));
    }
    snap.profiles.insert(
        "smart".into(),
        Policy {
            candidates,
            ..Default::default()
        },
    );
    snap.budgets = Some(Budgets {
        policies: vec![Budget {
            name: "spent".into(),
            scope: scope.into(),
            window: BudgetWindow::Day.into(),
            max_cost: 1.0,
            hard: true,
            ..Default::default()
        }],
        states: vec![BudgetState {
            name: "spent".into(),
            subject: subject.into(),
            level: BudgetLevel::Over.into(),
            until_ms: 1_700_000_000_000 + 60_000,
        }],
    });
    snap
}

fn call(snap: Snapshot) -> FakeHost {
    let mut host = FakeHost::with_state(State::new(1, snap));
    for (k, v) in [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("authorization", &format!("Bearer {KEY}")),
    ] {
        host.add(Side::Request, k, v.as_bytes());
    }
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    let body = r#"{"model":"smart","messages":[{"role":"user","content":"hi"}]}"#;
    host.request_body = body.as_bytes().to_vec();
    front.on_request_body(&mut host, body.len(), true);
    host
}

#[test]
fn a_spent_budget_takes_the_budget_step_and_the_trail_says_why() {
    for (scope, subject) in [
        (BudgetScope::Provider, "dear"),
        (BudgetScope::Profile, "smart"),
        (BudgetScope::Key, "key_app"),
    ] {
        let host = call(snapshot(scope, subject, true));
        assert!(host.answered.is_none(), "{scope:?}: no 429");
        let plan = host.planned().expect("a plan");
        assert_eq!(plan.tiers.len(), 1, "{scope:?}");
        let step = &plan.tiers[0][0];
        assert_eq!(
            (step.provider.as_str(), step.model.as_str()),
            ("cheap", "mini")
        );
        assert!(
            step.when.is_empty(),
            "{scope:?}: the step is unconditional now"
        );
        let trail = host
            .calls
            .values()
            .next()
            .map(|c| c.trail.clone())
            .unwrap_or_default();
        assert!(
            trail
                .skipped
                .iter()
                .any(|s| s.provider == "dear" && s.reason == "budget_exceeded"),
            "{scope:?}: {trail:?}"
        );
    }
}

#[test]
fn without_a_budget_step_the_429_stays() {
    let host = call(snapshot(BudgetScope::Provider, "dear", false));
    let a = host.answered.expect("refused");
    assert_eq!(a.status, 429);
    assert_eq!(a.json()["error"]["code"], "budget_exceeded");
    assert!(a.header("retry-after").is_some());
    // The refusal names the candidate the budget ruled out, as the other refusals do.
    assert_eq!(
        a.json()["error"]["trail"]["skipped"],
        serde_json::json!([{ "provider": "dear", "model": "big", "reason": "budget_exceeded" }]),
        "{}",
        a.json()
    );
    // No budget spent: the step stays conditional, never the first attempt.
    let mut calm = snapshot(BudgetScope::Provider, "dear", true);
    calm.budgets = None;
    let host = call(calm);
    let plan = host.planned().expect("a plan");
    assert_eq!(plan.tiers[0][0].provider, "dear");
    assert_eq!(plan.tiers[1][0].when, ["budget_exceeded"]);
}
