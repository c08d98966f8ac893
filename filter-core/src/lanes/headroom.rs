//! A lane's health and headroom as the picker reads them: the pushed figures less this VM's own
//! sends since they were reported.

use std::rc::Rc;

use ai_router_contract::headroom::left;

use crate::state::{LaneHealth, State};
use crate::vm::local::Allowance;
use crate::vm::view::View;

/// What a scope's headroom leaves now: requests and tokens (-1: not reported) and when its
/// window resets ([`headroom_left`]).
pub type Left = (i64, i64, i64);

/// A scope's pushed headroom on a model and scope-wide (the quota ledger's estimate, model
/// empty), while their windows last: what a reservation is checked against, each with when it
/// resets.
pub fn allowances(
    health: &LaneHealth,
    scope: &str,
    model: &str,
    now_ms: i64,
) -> Vec<(Allowance, i64)> {
    [model, ""]
        .into_iter()
        .filter_map(|m| {
            let h = health.headroom(scope, m)?;
            (h.reset_at_ms > now_ms).then(|| {
                (
                    Allowance {
                        model: m.to_owned(),
                        remaining_requests: h.remaining_requests,
                        remaining_tokens: h.remaining_tokens,
                        since_ms: h.as_of_ms,
                    },
                    h.reset_at_ms,
                )
            })
        })
        .collect()
}

/// What a scope's headroom leaves now (requests, tokens; -1: not reported) and when its window
/// resets: the pushed figures less this process's sends on it since each was reported, the
/// least of the model's and the scope-wide one.
pub fn headroom_left(
    health: &LaneHealth,
    view: &dyn View,
    provider: &str,
    scope: &str,
    model: &str,
    now_ms: i64,
) -> Option<Left> {
    let least = |a: i64, b: i64| match (a, b) {
        (-1, x) | (x, -1) => x,
        (a, b) => a.min(b),
    };
    allowances(health, scope, model, now_ms)
        .into_iter()
        .map(|(a, reset_at_ms)| {
            let (requests, tokens) = view.sent_since(provider, scope, &a.model, a.since_ms);
            (
                left(a.remaining_requests, requests),
                left(a.remaining_tokens, tokens),
                reset_at_ms,
            )
        })
        .reduce(|(r1, t1, z1), (r2, t2, z2)| {
            // The window that binds is the one that runs out.
            let reset = match (r1 == 0 || t1 == 0, r2 == 0 || t2 == 0) {
                (true, false) => z1,
                (false, true) => z2,
                _ => z1.max(z2),
            };
            (least(r1, r2), least(t1, t2), reset)
        })
}

/// The lane health of `provider`: the view's record, else what the state carries, else none.
pub fn health_of(state: &State, view: &dyn View, provider: &str) -> Rc<LaneHealth> {
    view.health(provider)
        .or_else(|| state.health(provider))
        .unwrap_or_default()
}

/// Whether any provider has a key with a secret that is not blacklisted right now.
pub fn any_usable_key(state: &State, view: &dyn View, now_ms: i64) -> bool {
    state.snapshot.providers.iter().any(|p| {
        let health = health_of(state, view, &p.id);
        p.keys.iter().any(|k| {
            !k.secret.is_empty()
                && health.key_health(&k.alias).is_none_or(|h| {
                    let same_secret =
                        h.refused_fingerprint == 0 || h.refused_fingerprint == k.fingerprint;
                    !(same_secret && (h.until_ms == 0 || h.until_ms > now_ms))
                })
        })
    })
}
