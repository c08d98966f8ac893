//! Lane selection: which (provider, key, model) an attempt uses, by the spec's tiers, from the
//! pushed state plus this VM's own view (what the call tried, in-flight counts, local holds).

pub mod affinity;
pub mod cost;
pub mod embeddings;
pub mod families;
pub mod listing;
pub mod park;
pub mod response_pins;
pub mod select;
pub mod terms;
pub mod when;

use std::rc::Rc;

use ai_router_proto::v1::{BreakerPhase, BreakerScope, KeyOutReason, SelectionStrategy};

use crate::classify::Class;
use crate::plan::Candidate;
use crate::state::{scope_of, LaneHealth, State};
use crate::vm::local::Allowance;
use crate::vm::round_robin::{smooth_weighted, RoundRobin, KEY_WINDOW};
use crate::vm::view::View;
use crate::vocab::{LaneId, LocalHold, LOCAL_HOLD_GRACE_MS};

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
fn headroom_left(
    health: &LaneHealth,
    view: &dyn View,
    provider: &str,
    scope: &str,
    model: &str,
    now_ms: i64,
) -> Option<Left> {
    let left = |figure: i64, used: u64| {
        if figure < 0 {
            -1
        } else {
            figure
                .saturating_sub(i64::try_from(used).unwrap_or(i64::MAX))
                .max(0)
        }
    };
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

/// Whether calls with an interval pass over a lane whose next probe is `probe_at_ms` (it is
/// parked and its probe is not due).
pub fn passed_over(probe_at_ms: Option<i64>, now_ms: i64) -> bool {
    probe_at_ms.is_some_and(|at| at > now_ms)
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
        let health = crate::lanes::health_of(state, view, &p.id);
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

/// A half-open breaker the attempt must hold the probe lease of before it may use the lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub scope: BreakerScope,
    pub provider: String,
    pub key: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    pub lane: LaneId,
    pub provider_index: usize,
    pub key_index: usize,
    pub tier: usize,
    /// Set when the lane's key or provider breaker is half-open.
    pub probe: Option<Probe>,
    /// The provider's lane health the pick read (its headroom bounds the send's reservation).
    pub health: Rc<LaneHealth>,
    /// The lane is parked (snap-back) and its probe was due: the call must claim the probe
    /// ([`crate::lanes::park::claim_probe`]) before it goes.
    pub snap_probe: bool,
}

/// What the picker needs to know about the call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    pub tried: &'a [LaneId],
    /// Lanes this attempt may not use (a probe lease another call holds).
    pub excluded: &'a [LaneId],
    /// Estimated tokens of the request, against reported token headroom.
    pub tokens: u64,
    /// A draw in [0, 1) for the `headroom` and `score` strategies (the host's random source).
    pub random: f64,
    /// The lane a session is pinned to: taken first while it is usable and untried.
    pub pinned: Option<&'a LaneId>,
    /// The one key the call may use (the key that stored the Responses state it names).
    pub only_key: Option<&'a crate::plan::KeyPin>,
    /// How the call's last attempt failed, for conditional candidates (`when`).
    pub last_failure: Option<Class>,
    /// The call's `resetIntervalMs` (0: none): parked lanes come after the others.
    pub reset_interval_ms: u64,
    /// Set after a context-length failure: the failed lane's capacity
    /// ([`crate::protocols::context::lane_capacity`]); only a larger lane may take the call.
    pub larger_than: Option<Option<u64>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Pick {
    Lane(Chosen),
    /// No lane is usable now: the reason of the soonest-returning one and when it returns.
    Unavailable {
        class: Option<Class>,
        retry_at_ms: Option<i64>,
    },
}

/// The `tiers` choice among the usable lanes of the best rank: the candidate (provider and
/// model) by smooth weighted round-robin on its weight, then, within it, the key with the fewest
/// calls in flight, ties by round-robin on key weight. Calls in flight only choose among the
/// keys of one candidate: weighed across candidates they would turn a candidate's share into
/// its key count (a candidate with two keys has more keys at the fewest in flight) or, counted
/// per candidate against its weight, into a function of the concurrency (two calls in flight
/// between weights 3 and 1 settle at one each, a 1:1 split) and of each provider's latency.
/// The shares follow the weights at any concurrency and whatever the key counts.
fn choose_tiers(rr: &mut RoundRobin, mut usable: Vec<Usable>) -> Option<Chosen> {
    let same_candidate = |a: &LaneId, b: &LaneId| a.provider == b.provider && a.model == b.model;
    let mut candidates: Vec<(LaneId, f64)> = Vec::new();
    for u in &usable {
        let lane = &u.chosen.lane;
        if !candidates.iter().any(|(c, _)| same_candidate(c, lane)) {
            candidates.push((
                LaneId::new(&lane.provider, "", &lane.model),
                u.candidate_weight,
            ));
        }
    }
    let options: Vec<(&LaneId, f64)> = candidates.iter().map(|(c, w)| (c, *w)).collect();
    let (candidate, _) = candidates.get(smooth_weighted(&mut rr.candidates, &options)?)?;
    usable.retain(|u| same_candidate(&u.chosen.lane, candidate));
    let fewest = usable.iter().map(|u| u.in_flight).min()?;
    usable.retain(|u| u.in_flight == fewest);
    let keys: Vec<(&LaneId, f64)> = usable
        .iter()
        .map(|u| (&u.chosen.lane, u.key_weight))
        .collect();
    let i = rr.choose(&keys)?;
    usable.into_iter().nth(i).map(|u| u.chosen)
}

struct Usable {
    chosen: Chosen,
    /// The spec's tiers: untried lane, not parked (snap-back), model order, untried key,
    /// untried provider, headroom.
    rank: (bool, bool, usize, bool, bool, bool),
    in_flight: u32,
    /// The candidate's share of its tier (provider x model x candidate weight).
    candidate_weight: f64,
    /// The key's share within its candidate.
    key_weight: f64,
    latency: Option<f64>,
    /// What the `headroom` and `score` strategies read.
    facts: crate::lanes::select::LaneFacts<(bool, bool, usize, bool, bool, bool)>,
}

/// A breaker's effect on a lane right now.
enum BreakerGate {
    Closed,
    Open(i64),
    HalfOpen,
}

fn breaker_gate(health: &LaneHealth, scope: BreakerScope, key: &str, now_ms: i64) -> BreakerGate {
    match health.breaker(scope, key) {
        Some(b) if b.state() == BreakerPhase::Open && b.open_until_ms > now_ms => {
            BreakerGate::Open(b.open_until_ms)
        }
        // Open past its cooldown is half-open, whether or not the push said so yet.
        Some(b) if matches!(b.state(), BreakerPhase::Open | BreakerPhase::HalfOpen) => {
            BreakerGate::HalfOpen
        }
        _ => BreakerGate::Closed,
    }
}

/// How often a call waiting for a concurrency slot looks again.
const SLOT_POLL_MS: i64 = 50;

/// Why a lane is out: its class, until when, and the routing trail's word for it.
type Out = (Class, Option<i64>, &'static str);

/// Keeps the reason whose lane returns last (the lane is out until every reason passes).
fn later(worst: Option<Out>, class: Class, until: Option<i64>, why: &'static str) -> Option<Out> {
    Some(match worst {
        None => (class, until, why),
        Some((c, u, w)) => match (u, until) {
            (None, _) => (c, u, w),
            (_, None) => (class, until, why),
            (Some(a), Some(b)) if b > a => (class, until, why),
            _ => (c, u, w),
        },
    })
}

/// What a scope's headroom leaves now: requests and tokens (-1: not reported) and when its
/// window resets ([`headroom_left`]).
type Left = (i64, i64, i64);

/// Why a lane is out right now, and until when (None: until something changes). `left` is its
/// scope's headroom, read once per lane by the caller.
#[allow(clippy::too_many_arguments)]
fn out_reason(
    state: &State,
    health: &LaneHealth,
    synced_at_ms: i64,
    view: &dyn View,
    pi: usize,
    ki: usize,
    lane: &LaneId,
    left: Option<Left>,
    tokens: u64,
    now_ms: i64,
) -> Option<Out> {
    let provider = state.provider_at(pi)?;
    let key = provider.keys.get(ki)?;
    let keyless = provider.terms.as_ref().is_some_and(|t| t.keyless);
    if key.secret.is_empty() && !keyless {
        return Some((Class::Auth, None, "missing_secret"));
    }
    let mut worst: Option<Out> = None;
    if let Some(h) = health.key_health(&key.alias) {
        let same_secret = h.refused_fingerprint == 0 || h.refused_fingerprint == key.fingerprint;
        let active = h.until_ms == 0 || h.until_ms > now_ms;
        if same_secret && active {
            let (class, why) = if h.reason() == KeyOutReason::Quota {
                (Class::Quota, "blacklisted:quota")
            } else {
                (Class::Auth, "blacklisted:auth")
            };
            worst = later(worst, class, (h.until_ms > 0).then_some(h.until_ms), why);
        }
    }
    let pushed = health.cooldown_until(&lane.key, &lane.model);
    if pushed > now_ms {
        worst = later(worst, Class::RateLimit, Some(pushed), "cooldown");
    }
    let reset_at = health.reset_at_ms(&key.alias);
    for hold in view.holds(lane) {
        if hold.set_at_ms() + LOCAL_HOLD_GRACE_MS <= synced_at_ms
            || (reset_at > 0 && hold.set_at_ms() <= reset_at)
        {
            // The control plane has spoken since, or an operator reset the key: its state is
            // the truth.
            continue;
        }
        match hold {
            LocalHold::Cooldown { until_ms, .. } if until_ms > now_ms => {
                worst = later(worst, Class::RateLimit, Some(until_ms), "cooldown");
            }
            LocalHold::Blacklist {
                class,
                until_ms,
                fingerprint,
                ..
            } if (fingerprint == 0 || fingerprint == key.fingerprint)
                && (until_ms == 0 || until_ms > now_ms) =>
            {
                let why = if class == Class::Quota {
                    "blacklisted:quota"
                } else {
                    "blacklisted:auth"
                };
                worst = later(worst, class, (until_ms > 0).then_some(until_ms), why);
            }
            _ => {}
        }
    }
    let provider_out = health.out_until_ms();
    if provider_out > now_ms {
        worst = later(worst, Class::Quota, Some(provider_out), "provider_out");
    }
    for (scope, key_alias) in [
        (BreakerScope::Provider, ""),
        (BreakerScope::Key, key.alias.as_str()),
    ] {
        if let BreakerGate::Open(until) = breaker_gate(health, scope, key_alias, now_ms) {
            worst = later(worst, Class::Transient, Some(until), "breaker_open");
        }
    }
    if let Some((requests, tokens_left, reset_at_ms)) = left {
        let too_few_tokens = tokens_left >= 0 && (tokens_left as u64) < tokens;
        // A figure the control plane marks spent (a credit, not a rate window) is a quota
        // with no known end: a top-up, not time, brings it back, so a call does not wait for it.
        // Looked up only for a lane with no request left, not on every pick.
        let spent = || {
            [lane.model.as_str(), ""].into_iter().any(|m| {
                health
                    .headroom(scope_of(key), m)
                    .is_some_and(|h| h.spent && h.remaining_requests == 0 && h.reset_at_ms > now_ms)
            })
        };
        if requests == 0 && spent() {
            worst = later(worst, Class::Quota, None, "no_credit");
        } else if requests == 0 || too_few_tokens {
            worst = later(worst, Class::RateLimit, Some(reset_at_ms), "headroom");
        }
    }
    let key_full =
        key.max_concurrency > 0 && view.in_flight(&provider.id, &key.alias) >= key.max_concurrency;
    let provider_full = provider.max_concurrency > 0
        && view.provider_in_flight(&provider.id) >= provider.max_concurrency;
    if key_full || provider_full {
        worst = later(
            worst,
            Class::RateLimit,
            Some(now_ms + SLOT_POLL_MS),
            "max_concurrency",
        );
    }
    worst
}

/// A lane ruled out for this attempt, and the trail's word for why.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub lane: LaneId,
    pub reason: &'static str,
}

/// Chooses the lane for the next attempt of a call, noting in `skipped` every lane it ruled
/// out and why.
pub fn pick(
    state: &State,
    tiers: &[Vec<Candidate>],
    req: Request<'_>,
    view: &dyn View,
    rr: &mut RoundRobin,
    now_ms: i64,
    skipped: &mut Vec<Skipped>,
) -> Pick {
    let selection = state.selection();
    let synced_at_ms = view
        .synced_at_ms()
        .unwrap_or(state.snapshot.generated_at_ms);
    let mut usable: Vec<Usable> = Vec::new();
    let mut soonest: Option<(Class, Option<i64>)> = None;
    // The `headroom` and `score` strategies weigh every usable lane against the others.
    let tiers_only = crate::lanes::select::strategy(&selection) == SelectionStrategy::Tiers;
    for (tier_index, tier) in tiers.iter().enumerate() {
        for cand in tier {
            if !crate::lanes::when::allows(&cand.when, req.last_failure) {
                continue;
            }
            let Some((pi, provider)) = state.provider(&cand.provider) else {
                continue;
            };
            let health = health_of(state, view, &provider.id);
            let model = provider.models.iter().find(|m| m.id == cand.model);
            let model_weight = model.map(|m| positive(m.weight)).unwrap_or(1.0);
            // After a context-length failure, only a lane known to take more.
            let too_small = req.larger_than.is_some_and(|failed| {
                !model.is_some_and(|m| {
                    crate::protocols::context::larger_than(
                        crate::protocols::context::lane_capacity(provider, m),
                        failed,
                    )
                })
            });
            let n = provider.keys.len();
            let windowed = tiers_only && n > 2 * KEY_WINDOW;
            let start = if windowed {
                rr.window_start(&provider.id, &cand.model, n)
            } else {
                0
            };
            let only_key = req.only_key.map(|only| {
                (only.provider == provider.id)
                    .then(|| provider.keys.iter().position(|k| k.alias == only.key))
                    .flatten()
            });
            let pinned_key = match only_key {
                Some(only) => only,
                None => req
                    .pinned
                    .filter(|p| p.provider == provider.id && p.model == cand.model)
                    .and_then(|p| provider.keys.iter().position(|k| k.alias == p.key)),
            };
            // With a key the call must use, that key alone is looked at.
            let others = if only_key.is_some() { 0 } else { n };
            let order = pinned_key.into_iter().chain(
                (0..others)
                    .map(|i| (start + i) % n)
                    .filter(move |ki| Some(*ki) != pinned_key),
            );
            let mut looked_at = 0;
            for ki in order {
                if windowed && looked_at >= KEY_WINDOW {
                    break;
                }
                let key = &provider.keys[ki];
                let lane = LaneId::new(&provider.id, &key.alias, &cand.model);
                // A key whose catalog lacks the model (`discover: true`) is no lane for it.
                if model.is_some_and(|m| !key.reaches(m)) {
                    skipped.push(Skipped {
                        lane,
                        reason: crate::lanes::listing::NOT_LISTED,
                    });
                    continue;
                }
                if too_small {
                    skipped.push(Skipped {
                        lane,
                        reason: "context_window",
                    });
                    continue;
                }
                if req.excluded.contains(&lane) {
                    soonest = sooner(soonest, Class::Transient, Some(now_ms + SLOT_POLL_MS * 4));
                    skipped.push(Skipped {
                        lane,
                        reason: "probe_elsewhere",
                    });
                    continue;
                }
                let left = headroom_left(
                    &health,
                    view,
                    &provider.id,
                    scope_of(key),
                    &lane.model,
                    now_ms,
                );
                if let Some((class, until, reason)) = out_reason(
                    state,
                    &health,
                    synced_at_ms,
                    view,
                    pi,
                    ki,
                    &lane,
                    left,
                    req.tokens,
                    now_ms,
                ) {
                    soonest = sooner(soonest, class, until);
                    skipped.push(Skipped { lane, reason });
                    continue;
                }
                let probe = [
                    (BreakerScope::Provider, ""),
                    (BreakerScope::Key, key.alias.as_str()),
                ]
                .into_iter()
                .find_map(|(scope, k)| {
                    matches!(
                        breaker_gate(&health, scope, k, now_ms),
                        BreakerGate::HalfOpen
                    )
                    .then(|| Probe {
                        scope,
                        provider: provider.id.clone(),
                        key: k.to_string(),
                    })
                });
                let low_headroom = left.is_some_and(|(requests, _, _)| {
                    requests >= 0 && (requests as u64) <= selection.low_headroom
                });
                let lane_tried = req.tried.contains(&lane);
                let key_tried = req
                    .tried
                    .iter()
                    .any(|t| t.provider == lane.provider && t.key == lane.key);
                let provider_tried = req.tried.iter().any(|t| t.provider == lane.provider);
                let candidate_weight =
                    positive(provider.weight) * model_weight * positive(cand.weight);
                let parked_until = if req.reset_interval_ms > 0 {
                    view.parked(&lane)
                } else {
                    None
                };
                let parked = passed_over(parked_until, now_ms);
                let reported = health
                    .headroom(scope_of(key), &lane.model)
                    .filter(|h| h.reset_at_ms > now_ms);
                let rank = (
                    lane_tried,
                    parked,
                    tier_index,
                    key_tried,
                    provider_tried,
                    low_headroom,
                );
                looked_at += 1;
                let in_flight = view.in_flight(&provider.id, &key.alias);
                let facts = crate::lanes::select::LaneFacts {
                    rank,
                    remaining_requests: reported.map(|h| h.remaining_requests).filter(|r| *r >= 0),
                    remaining_tokens: reported.map(|h| h.remaining_tokens).filter(|t| *t >= 0),
                    in_flight,
                    half_open: probe.is_some(),
                };
                usable.push(Usable {
                    facts,
                    rank,
                    in_flight,
                    latency: view.latency(&lane),
                    candidate_weight,
                    key_weight: positive(key.weight),
                    chosen: Chosen {
                        lane,
                        provider_index: pi,
                        key_index: ki,
                        tier: tier_index,
                        probe,
                        health: health.clone(),
                        snap_probe: parked_until.is_some() && !parked,
                    },
                });
            }
        }
    }
    if let Some(i) = req.pinned.and_then(|pin| {
        usable
            .iter()
            .position(|u| &u.chosen.lane == pin && !u.rank.0)
    }) {
        return Pick::Lane(usable.swap_remove(i).chosen);
    }
    if crate::lanes::select::strategy(&selection) != SelectionStrategy::Tiers && !usable.is_empty()
    {
        let facts: Vec<_> = usable.iter().map(|u| u.facts).collect();
        if let Some(i) = crate::lanes::select::choose(&selection, &facts, req.random) {
            return Pick::Lane(usable.swap_remove(i).chosen);
        }
        // Every usable lane weighs 0: they are out as if spent.
        usable.clear();
    }
    let Some(best_rank) = usable.iter().map(|u| u.rank).min() else {
        return match soonest {
            Some((class, retry_at_ms)) => Pick::Unavailable {
                class: Some(class),
                retry_at_ms,
            },
            None => Pick::Unavailable {
                class: None,
                retry_at_ms: None,
            },
        };
    };
    usable.retain(|u| u.rank == best_rank);
    // Lanes within the latency tolerance of the best measured one tie; unmeasured ones stay in.
    if let Some(best) = usable.iter().filter_map(|u| u.latency).reduce(f64::min) {
        let limit = best * selection.latency_tolerance + selection.latency_slack_ms as f64;
        usable.retain(|u| u.latency.is_none_or(|l| l <= limit));
    }
    match choose_tiers(rr, usable) {
        Some(chosen) => Pick::Lane(chosen),
        None => Pick::Unavailable {
            class: None,
            retry_at_ms: None,
        },
    }
}

/// The wait after the n-th transient failure of a call (the one formula: [`crate::wire::percent`]).
pub use crate::vm::backoff::backoff_ms;

/// Keeps the reason whose lane returns first (the call may wait for it).
fn sooner(
    soonest: Option<(Class, Option<i64>)>,
    class: Class,
    until: Option<i64>,
) -> Option<(Class, Option<i64>)> {
    Some(match soonest {
        None => (class, until),
        Some((c, u)) => match (u, until) {
            (Some(a), Some(b)) if b < a => (class, until),
            (None, Some(_)) => (class, until),
            _ => (c, u),
        },
    })
}

fn positive(w: f64) -> f64 {
    if w > 0.0 {
        w
    } else {
        1.0
    }
}

/// The provider and key of a lane in `state`, when it still serves the lane's model.
pub fn lane_in<'s>(
    state: &'s crate::state::State,
    lane: &LaneId,
) -> Option<(
    &'s ai_router_proto::v1::Provider,
    &'s ai_router_proto::v1::ProviderKey,
)> {
    let (_, provider) = state.provider(&lane.provider)?;
    let key = provider.keys.iter().find(|k| k.alias == lane.key)?;
    provider
        .models
        .iter()
        .any(|m| m.id == lane.model)
        .then_some((provider, key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_proto::v1::{KeyHealth, Model, Provider, ProviderKey, Snapshot};
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    struct FakeView {
        holds: RefCell<HashMap<LaneId, Vec<LocalHold>>>,
        in_flight: HashMap<(String, String), u32>,
        parked: HashMap<LaneId, i64>,
    }

    impl View for FakeView {
        fn holds(&self, lane: &LaneId) -> Vec<LocalHold> {
            self.holds.borrow().get(lane).cloned().unwrap_or_default()
        }
        fn in_flight(&self, p: &str, k: &str) -> u32 {
            self.in_flight
                .get(&(p.to_string(), k.to_string()))
                .copied()
                .unwrap_or(0)
        }
        fn provider_in_flight(&self, p: &str) -> u32 {
            self.in_flight
                .iter()
                .filter(|((pp, _), _)| pp == p)
                .map(|(_, n)| *n)
                .sum()
        }
        fn parked(&self, lane: &LaneId) -> Option<i64> {
            self.parked.get(lane).copied()
        }
    }

    fn key(alias: &str) -> ProviderKey {
        ProviderKey {
            alias: alias.into(),
            secret: format!("sk-{alias}"),
            fingerprint: ai_router_contract::fingerprint(&format!("sk-{alias}")),
            ..Default::default()
        }
    }

    fn state_with(health: Vec<KeyHealth>) -> State {
        let mut s = Snapshot::default();
        let m = Model {
            id: "m1".into(),
            ..Default::default()
        };
        s.providers.push(Provider {
            id: "p1".into(),
            keys: vec![key("a"), key("b")],
            models: vec![m.clone()],
            ..Default::default()
        });
        s.providers.push(Provider {
            id: "p2".into(),
            keys: vec![key("c")],
            models: vec![m],
            ..Default::default()
        });
        s.key_health = health;
        State::new(1, s)
    }

    #[test]
    fn a_lane_is_found_by_identity_in_a_newer_snapshot() {
        let old = state_with(vec![]);
        let lane = LaneId::new("p2", "c", "m1");
        assert_eq!(
            lane_in(&old, &lane).map(|(p, k)| (p.id.as_str(), k.alias.as_str())),
            Some(("p2", "c"))
        );
        // The next snapshot lists p2 first and gives p1 a new first key: positions chosen on
        // the old one would name another lane.
        let mut snap = old.snapshot.clone();
        snap.providers.reverse();
        snap.providers[1].keys.insert(0, key("z"));
        let newer = State::new(2, snap);
        assert_eq!(
            lane_in(&newer, &lane).map(|(p, k)| (p.id.as_str(), k.secret.as_str())),
            Some(("p2", "sk-c"))
        );
        let a = LaneId::new("p1", "a", "m1");
        assert_eq!(
            lane_in(&newer, &a).map(|(_, k)| k.secret.as_str()),
            Some("sk-a")
        );
        // A key or model that is gone is no lane.
        assert!(lane_in(&newer, &LaneId::new("p1", "gone", "m1")).is_none());
        assert!(lane_in(&newer, &LaneId::new("p1", "a", "m9")).is_none());
        assert!(lane_in(&newer, &LaneId::new("p9", "a", "m1")).is_none());
    }

    fn tiers() -> Vec<Vec<Candidate>> {
        vec![
            vec![Candidate {
                provider: "p1".into(),
                model: "m1".into(),
                weight: 1.0,
                when: Vec::new(),
            }],
            vec![Candidate {
                provider: "p2".into(),
                model: "m1".into(),
                weight: 1.0,
                when: Vec::new(),
            }],
        ]
    }

    fn chosen(p: Pick) -> LaneId {
        match p {
            Pick::Lane(c) => c.lane,
            other => panic!("no lane: {other:?}"),
        }
    }

    /// The lane a first attempt with nothing tried gets at time 0.
    fn pick_plain(
        s: &State,
        tiers: &[Vec<Candidate>],
        v: &FakeView,
        rr: &mut RoundRobin,
    ) -> LaneId {
        chosen(pick(
            s,
            tiers,
            Request::default(),
            v,
            rr,
            0,
            &mut Vec::new(),
        ))
    }

    #[test]
    fn equal_keys_alternate_and_untried_key_first() {
        let s = state_with(vec![]);
        let v = FakeView::default();
        let mut rr = RoundRobin::default();
        let first = chosen(pick(
            &s,
            &tiers(),
            Request {
                tried: &[],
                ..Request::default()
            },
            &v,
            &mut rr,
            0,
            &mut Vec::new(),
        ));
        let second = chosen(pick(
            &s,
            &tiers(),
            Request {
                tried: &[],
                ..Request::default()
            },
            &v,
            &mut rr,
            0,
            &mut Vec::new(),
        ));
        assert_ne!(first.key, second.key);
        assert_eq!(first.provider, "p1");
        // After trying a, the call goes to b, then to provider 2, then back to a tried lane.
        let tried = vec![LaneId::new("p1", "a", "m1")];
        assert_eq!(
            chosen(pick(
                &s,
                &tiers(),
                Request {
                    tried: &tried,
                    ..Request::default()
                },
                &v,
                &mut rr,
                0,
                &mut Vec::new(),
            ))
            .key,
            "b"
        );
        let tried = vec![LaneId::new("p1", "a", "m1"), LaneId::new("p1", "b", "m1")];
        assert_eq!(
            chosen(pick(
                &s,
                &tiers(),
                Request {
                    tried: &tried,
                    ..Request::default()
                },
                &v,
                &mut rr,
                0,
                &mut Vec::new(),
            ))
            .provider,
            "p2"
        );
    }

    #[test]
    fn cooldowns_and_blacklists() {
        let s = state_with(vec![KeyHealth {
            provider: "p1".into(),
            key: "a".into(),
            reason: KeyOutReason::Auth.into(),
            until_ms: 0,
            refused_fingerprint: ai_router_contract::fingerprint("sk-a"),
        }]);
        let v = FakeView::default();
        v.holds.borrow_mut().insert(
            LaneId::new("p1", "b", "m1"),
            vec![LocalHold::Cooldown {
                until_ms: 5000,
                set_at_ms: 0,
            }],
        );
        let mut rr = RoundRobin::default();
        assert_eq!(
            chosen(pick(
                &s,
                &tiers(),
                Request {
                    tried: &[],
                    ..Request::default()
                },
                &v,
                &mut rr,
                1000,
                &mut Vec::new(),
            ))
            .provider,
            "p2"
        );
        // The cooldown passes.
        assert_eq!(
            chosen(pick(
                &s,
                &tiers(),
                Request {
                    tried: &[],
                    ..Request::default()
                },
                &v,
                &mut rr,
                6000,
                &mut Vec::new(),
            ))
            .key,
            "b"
        );
        // A new secret lifts the blacklist: the refused fingerprint no longer matches.
        let s2 = state_with(vec![KeyHealth {
            provider: "p1".into(),
            key: "a".into(),
            reason: KeyOutReason::Auth.into(),
            until_ms: 0,
            refused_fingerprint: 42,
        }]);
        let picks: Vec<String> = (0..4)
            .map(|_| {
                chosen(pick(
                    &s2,
                    &tiers(),
                    Request {
                        tried: &[],
                        ..Request::default()
                    },
                    &FakeView::default(),
                    &mut rr,
                    0,
                    &mut Vec::new(),
                ))
                .key
            })
            .collect();
        assert!(picks.contains(&"a".to_string()));
    }

    #[test]
    fn nothing_usable_reports_soonest_return() {
        let s = state_with(vec![]);
        let v = FakeView::default();
        for (p, k, until) in [("p1", "a", 3000), ("p1", "b", 2000), ("p2", "c", 4000)] {
            v.holds.borrow_mut().insert(
                LaneId::new(p, k, "m1"),
                vec![LocalHold::Cooldown {
                    until_ms: until,
                    set_at_ms: 0,
                }],
            );
        }
        let mut rr = RoundRobin::default();
        assert_eq!(
            pick(
                &s,
                &tiers(),
                Request {
                    tried: &[],
                    ..Request::default()
                },
                &v,
                &mut rr,
                1000,
                &mut Vec::new(),
            ),
            Pick::Unavailable {
                class: Some(Class::RateLimit),
                retry_at_ms: Some(2000)
            }
        );
    }

    #[test]
    fn weighted_round_robin_shares_by_weight() {
        let mut rr = RoundRobin::default();
        let (x, y) = (LaneId::new("p", "x", "m"), LaneId::new("p", "y", "m"));
        let opts = [(&x, 3.0), (&y, 1.0)];
        let picks: Vec<usize> = (0..8).map(|_| rr.choose(&opts).unwrap()).collect();
        assert_eq!(picks.iter().filter(|i| **i == 0).count(), 6);
    }

    #[test]
    fn candidates_share_a_tier_by_their_weight_whatever_their_key_count() {
        // p1 has keys a and b, p2 has key c; both candidates weigh 1: p1 and p2 half each.
        let s = state_with(vec![]);
        let tier = vec![vec![
            Candidate {
                provider: "p1".into(),
                model: "m1".into(),
                weight: 1.0,
                when: Vec::new(),
            },
            Candidate {
                provider: "p2".into(),
                model: "m1".into(),
                weight: 1.0,
                when: Vec::new(),
            },
        ]];
        let v = FakeView::default();
        let mut rr = RoundRobin::default();
        let mut counts: HashMap<String, usize> = HashMap::new();
        for _ in 0..400 {
            let key = pick_plain(&s, &tier, &v, &mut rr).key;
            *counts.entry(key).or_default() += 1;
        }
        let n = |k: &str| counts.get(k).copied().unwrap_or(0);
        assert_eq!(n("c"), 200, "{counts:?}");
        assert_eq!(n("a") + n("b"), 200, "{counts:?}");
        assert_eq!(n("a"), 100, "{counts:?}");
    }

    #[test]
    fn candidate_shares_follow_the_weights_at_any_concurrency() {
        // The tier: w1 (one key) weighs 3, w2 (two keys) weighs 1. Clients keep
        // `concurrency` calls in flight (counted per key, as the VM does), a random one of them
        // ending before each new pick; 4,000 picks at each concurrency.
        let mut snap = Snapshot::default();
        let model = Model {
            id: "m".into(),
            ..Default::default()
        };
        for (id, keys) in [("w1", vec![key("a")]), ("w2", vec![key("b"), key("c")])] {
            snap.providers.push(Provider {
                id: id.into(),
                keys,
                models: vec![model.clone()],
                ..Default::default()
            });
        }
        let s = State::new(1, snap);
        let candidate = |provider: &str, weight: f64| Candidate {
            provider: provider.into(),
            model: "m".into(),
            weight,
            when: Vec::new(),
        };
        let tier = vec![vec![candidate("w1", 3.0), candidate("w2", 1.0)]];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for concurrency in [1, 2, 3, 8, 32] {
            let mut v = FakeView::default();
            let mut rr = RoundRobin::default();
            let mut running: Vec<LaneId> = Vec::new();
            let mut counts: HashMap<String, usize> = HashMap::new();
            let picks = 4_000;
            for _ in 0..picks {
                if running.len() == concurrency {
                    let done = running.swap_remove(random(concurrency));
                    if let Some(n) = v.in_flight.get_mut(&(done.provider, done.key)) {
                        *n -= 1;
                    }
                }
                let lane = pick_plain(&s, &tier, &v, &mut rr);
                *v.in_flight
                    .entry((lane.provider.clone(), lane.key.clone()))
                    .or_default() += 1;
                *counts.entry(lane.key.clone()).or_default() += 1;
                running.push(lane);
            }
            let share = |k: &str| counts.get(k).copied().unwrap_or(0) as f64 / picks as f64;
            for (k, want) in [("a", 0.75), ("b", 0.125), ("c", 0.125)] {
                assert!(
                    (share(k) - want).abs() <= 0.05,
                    "concurrency {concurrency}: key {k} {:.3}, expected {want}: {counts:?}",
                    share(k)
                );
            }
        }
    }

    #[test]
    fn a_candidate_with_many_keys_is_looked_at_through_a_moving_window() {
        let mut snap = state_with(vec![]).snapshot.clone();
        snap.providers[0].keys = (0..1_000).map(|i| key(&format!("k{i}"))).collect();
        // Half the keys are blacklisted: the window counts only usable ones.
        snap.key_health = (0..1_000)
            .filter(|i| i % 2 == 1)
            .map(|i| KeyHealth {
                provider: "p1".into(),
                key: format!("k{i}"),
                reason: KeyOutReason::Quota.into(),
                until_ms: 10_000,
                refused_fingerprint: ai_router_contract::fingerprint(&format!("sk-k{i}")),
            })
            .collect();
        let s = State::new(1, snap);
        let tier = vec![vec![Candidate {
            provider: "p1".into(),
            model: "m1".into(),
            weight: 1.0,
            when: Vec::new(),
        }]];
        let v = FakeView::default();
        let mut rr = RoundRobin::default();
        let mut chosen_keys = std::collections::BTreeSet::new();
        let mut most_skipped = 0;
        for _ in 0..1_000 / KEY_WINDOW * 2 + 2 {
            let mut skipped = Vec::new();
            let lane = chosen(pick(
                &s,
                &tier,
                Request::default(),
                &v,
                &mut rr,
                0,
                &mut skipped,
            ));
            assert!(!skipped.iter().any(|k| k.lane == lane));
            most_skipped = most_skipped.max(skipped.len());
            chosen_keys.insert(lane.key);
        }
        // Each pick looked at about 2 x KEY_WINDOW keys (half usable, half out), not 1,000...
        assert!(most_skipped <= KEY_WINDOW + 1, "{most_skipped}");
        // ...and over the picks the window went round every usable key.
        assert!(
            chosen_keys.len() >= 500 / KEY_WINDOW,
            "{}",
            chosen_keys.len()
        );
        let usable_seen = chosen_keys
            .iter()
            .all(|k| k[1..].parse::<usize>().is_ok_and(|i| i % 2 == 0));
        assert!(usable_seen, "{chosen_keys:?}");

        // With every key usable, the windows of successive picks do not overlap and the load
        // spreads evenly: 1,000 picks take each of the 1,000 keys once.
        let mut all = state_with(vec![]).snapshot.clone();
        all.providers[0].keys = (0..1_000).map(|i| key(&format!("k{i}"))).collect();
        let all = State::new(1, all);
        let mut rr = RoundRobin::default();
        let mut taken = std::collections::HashMap::<String, u32>::new();
        for _ in 0..1_000 {
            let lane = chosen(pick(
                &all,
                &tier,
                Request::default(),
                &v,
                &mut rr,
                0,
                &mut Vec::new(),
            ));
            *taken.entry(lane.key).or_default() += 1;
        }
        assert_eq!(taken.len(), 1_000);
        assert!(taken.values().all(|n| *n == 1), "{taken:?}");

        // A pinned key is looked at first, wherever the window is.
        let pin = LaneId::new("p1", "k998", "m1");
        for _ in 0..5 {
            let req = Request {
                pinned: Some(&pin),
                ..Request::default()
            };
            assert_eq!(
                chosen(pick(&s, &tier, req, &v, &mut rr, 0, &mut Vec::new())),
                pin
            );
        }
    }

    #[test]
    fn a_local_hold_gives_way_to_the_control_plane_once_it_has_spoken() {
        let v = FakeView::default();
        let lane = LaneId::new("p1", "a", "m1");
        v.holds.borrow_mut().insert(
            lane.clone(),
            vec![LocalHold::Blacklist {
                class: Class::Auth,
                until_ms: 0,
                fingerprint: 0,
                set_at_ms: 10_000,
            }],
        );
        let only_a = vec![vec![Candidate {
            provider: "p1".into(),
            model: "m1".into(),
            weight: 1.0,
            when: Vec::new(),
        }]];
        let keys = |generated_at_ms: i64| {
            let s = state_with_snapshot(|s| {
                s.generated_at_ms = generated_at_ms;
                s.providers[0].keys.truncate(1);
            });
            picks_a_lane(&s, &only_a, &v, 12_000)
        };
        // A snapshot from before the hold (or within the grace) cannot know of it: the key is out.
        assert!(!keys(9_000));
        assert!(!keys(10_000 + LOCAL_HOLD_GRACE_MS - 1));
        // One generated after the grace without the blacklist: the control plane's view wins.
        assert!(keys(10_000 + LOCAL_HOLD_GRACE_MS));
    }

    #[test]
    fn an_operator_reset_voids_the_holds_set_before_it_at_once() {
        let v = FakeView::default();
        let lane = LaneId::new("p1", "a", "m1");
        v.holds.borrow_mut().insert(
            lane.clone(),
            vec![
                LocalHold::Blacklist {
                    class: Class::Quota,
                    until_ms: 0,
                    fingerprint: 0,
                    set_at_ms: 10_000,
                },
                LocalHold::Cooldown {
                    until_ms: 60_000,
                    set_at_ms: 10_500,
                },
            ],
        );
        let only_a = vec![vec![Candidate {
            provider: "p1".into(),
            model: "m1".into(),
            weight: 1.0,
            when: Vec::new(),
        }]];
        let usable = |reset: Option<(&str, i64)>| {
            let s = state_with_snapshot(|s| {
                // Within the grace: without a reset the holds stand.
                s.generated_at_ms = 11_000;
                s.providers[0].keys.truncate(1);
                s.resets = reset
                    .map(|(key, at_ms)| ai_router_proto::v1::HoldReset {
                        provider: "p1".into(),
                        key: key.into(),
                        at_ms,
                    })
                    .into_iter()
                    .collect();
            });
            picks_a_lane(&s, &only_a, &v, 12_000)
        };
        assert!(!usable(None));
        // A reset of the key, or of its provider, after both holds: usable at once.
        assert!(usable(Some(("a", 11_000))));
        assert!(usable(Some(("", 11_000))));
        // A reset between them voids the blacklist only; the later cooldown stands.
        assert!(!usable(Some(("a", 10_200))));
        // A reset of another key changes nothing.
        assert!(!usable(Some(("b", 11_000))));
    }

    #[test]
    fn fewest_in_flight_wins() {
        let s = state_with(vec![]);
        let mut v = FakeView::default();
        v.in_flight.insert(("p1".into(), "a".into()), 2);
        let mut rr = RoundRobin::default();
        for _ in 0..3 {
            assert_eq!(
                chosen(pick(
                    &s,
                    &tiers(),
                    Request {
                        tried: &[],
                        ..Request::default()
                    },
                    &v,
                    &mut rr,
                    0,
                    &mut Vec::new(),
                ))
                .key,
                "b"
            );
        }
    }

    fn state_with_snapshot(f: impl FnOnce(&mut Snapshot)) -> State {
        let mut s = state_with(vec![]).snapshot;
        f(&mut s);
        State::new(2, s)
    }

    fn picks_a_lane(s: &State, tiers: &[Vec<Candidate>], v: &FakeView, now: i64) -> bool {
        let mut rr = RoundRobin::default();
        let pick = pick(
            s,
            tiers,
            Request::default(),
            v,
            &mut rr,
            now,
            &mut Vec::new(),
        );
        matches!(pick, Pick::Lane(_))
    }

    fn pick_now(s: &State, v: &FakeView, rr: &mut RoundRobin, now: i64) -> Pick {
        pick(s, &tiers(), Request::default(), v, rr, now, &mut Vec::new())
    }

    #[test]
    fn open_breakers_exclude_and_half_open_asks_for_a_probe() {
        use ai_router_proto::v1::BreakerState;
        let s = state_with_snapshot(|snap| {
            snap.breakers.push(BreakerState {
                scope: BreakerScope::Provider.into(),
                provider: "p1".into(),
                key: String::new(),
                state: BreakerPhase::Open.into(),
                open_until_ms: 5000,
            });
        });
        let v = FakeView::default();
        let mut rr = RoundRobin::default();
        // Provider 1 is open: every call goes to p2 (a later tier) until the cooldown passes.
        assert_eq!(chosen(pick_now(&s, &v, &mut rr, 1000)).provider, "p2");
        match pick_now(&s, &v, &mut rr, 6000) {
            Pick::Lane(c) => {
                assert_eq!(c.lane.provider, "p1");
                assert_eq!(
                    c.probe,
                    Some(Probe {
                        scope: BreakerScope::Provider,
                        provider: "p1".into(),
                        key: String::new()
                    })
                );
            }
            other => panic!("{other:?}"),
        }
        // A lane whose probe another call holds is skipped.
        let excluded = vec![LaneId::new("p1", "a", "m1"), LaneId::new("p1", "b", "m1")];
        let req = Request {
            excluded: &excluded,
            ..Request::default()
        };
        assert_eq!(
            chosen(pick(&s, &tiers(), req, &v, &mut rr, 6000, &mut Vec::new())).provider,
            "p2"
        );
    }

    #[test]
    fn a_figure_marked_spent_is_a_quota_and_a_plain_zero_a_rate_limit() {
        use ai_router_proto::v1::Headroom;
        let only_p1 = vec![vec![Candidate {
            provider: "p1".into(),
            model: "m1".into(),
            weight: 1.0,
            when: Vec::new(),
        }]];
        let at = |spent: bool| {
            state_with_snapshot(|snap| {
                for key in ["a", "b"] {
                    snap.headroom.push(Headroom {
                        provider: "p1".into(),
                        key: key.into(),
                        remaining_requests: 0,
                        remaining_tokens: -1,
                        reset_at_ms: 9_000,
                        spent,
                        ..Default::default()
                    });
                }
            })
        };
        let v = FakeView::default();
        // A rate window returns at its reset (a call may wait for it); a spent credit has no
        // known return.
        for (spent, class, retry_at_ms) in [
            (true, Class::Quota, None),
            (false, Class::RateLimit, Some(9_000)),
        ] {
            let mut rr = RoundRobin::default();
            assert_eq!(
                pick(
                    &at(spent),
                    &only_p1,
                    Request::default(),
                    &v,
                    &mut rr,
                    1_000,
                    &mut Vec::new()
                ),
                Pick::Unavailable {
                    class: Some(class),
                    retry_at_ms
                },
                "spent: {spent}"
            );
        }
        // Past its window the mark is gone with the figure.
        let mut rr = RoundRobin::default();
        assert!(matches!(
            pick(
                &at(true),
                &only_p1,
                Request::default(),
                &v,
                &mut rr,
                9_500,
                &mut Vec::new()
            ),
            Pick::Lane(_)
        ));
    }

    #[test]
    fn headroom_and_budgets() {
        use ai_router_proto::v1::{Headroom, ProviderHealth};
        let s = state_with_snapshot(|snap| {
            snap.headroom.push(Headroom {
                provider: "p1".into(),
                key: "a".into(),
                model: "m1".into(),
                remaining_requests: 0,
                remaining_tokens: -1,
                reset_at_ms: 3000,
                ..Default::default()
            });
            snap.headroom.push(Headroom {
                provider: "p1".into(),
                key: "b".into(),
                model: "m1".into(),
                remaining_requests: 1,
                remaining_tokens: -1,
                reset_at_ms: 3000,
                ..Default::default()
            });
        });
        let v = FakeView::default();
        let mut rr = RoundRobin::default();
        // a is out (no requests left); b is at low headroom: used only because p2 is a later tier.
        for _ in 0..3 {
            assert_eq!(chosen(pick_now(&s, &v, &mut rr, 1000)).key, "b");
        }
        // After the reset both are back.
        let keys: Vec<String> = (0..4)
            .map(|_| chosen(pick_now(&s, &v, &mut rr, 4000)).key)
            .collect();
        assert!(keys.contains(&"a".to_string()));
        // Token headroom below the estimate keeps the lane out.
        let s = state_with_snapshot(|snap| {
            snap.headroom.push(Headroom {
                provider: "p1".into(),
                key: "a".into(),
                model: "m1".into(),
                remaining_requests: 50,
                remaining_tokens: 10,
                reset_at_ms: 3000,
                ..Default::default()
            });
        });
        for _ in 0..3 {
            assert_eq!(
                chosen(pick(
                    &s,
                    &tiers(),
                    Request {
                        tokens: 100,
                        ..Request::default()
                    },
                    &v,
                    &mut rr,
                    1000,
                    &mut Vec::new(),
                ))
                .key,
                "b"
            );
        }
        // A provider past its budget is out until the reported time.
        let s = state_with_snapshot(|snap| {
            snap.provider_health.push(ProviderHealth {
                provider: "p1".into(),
                reason: ai_router_proto::v1::ProviderOutReason::Budget.into(),
                until_ms: 9000,
            });
        });
        assert_eq!(chosen(pick_now(&s, &v, &mut rr, 1000)).provider, "p2");
    }

    #[test]
    fn latency_outside_tolerance_loses() {
        struct Slow;
        impl View for Slow {
            fn holds(&self, _: &LaneId) -> Vec<LocalHold> {
                Vec::new()
            }
            fn in_flight(&self, _: &str, _: &str) -> u32 {
                0
            }
            fn provider_in_flight(&self, _: &str) -> u32 {
                0
            }
            fn latency(&self, lane: &LaneId) -> Option<f64> {
                Some(if lane.key == "a" { 1000.0 } else { 100.0 })
            }
        }
        let s = state_with(vec![]);
        let mut rr = RoundRobin::default();
        for _ in 0..4 {
            assert_eq!(
                chosen(pick(
                    &s,
                    &tiers(),
                    Request::default(),
                    &Slow,
                    &mut rr,
                    0,
                    &mut Vec::new()
                ))
                .key,
                "b"
            );
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = ai_router_proto::v1::BackoffSettings {
            base_ms: 100,
            factor: 2.0,
            max_ms: 5000,
        };
        assert_eq!(backoff_ms(&b, 1, 0.0), 50);
        assert_eq!(backoff_ms(&b, 1, 0.999_999), 99);
        assert_eq!(backoff_ms(&b, 3, 0.0), 200);
        assert_eq!(backoff_ms(&b, 30, 0.0), 2500);
        assert!(backoff_ms(&b, 30, 0.99) < 5000);
    }

    #[test]
    fn a_conditional_tier_is_taken_only_after_its_trigger() {
        let s = state_with(vec![]);
        let v = FakeView::default();
        let mut rr = RoundRobin::default();
        let mut t = tiers();
        t[1][0].when = vec!["rate_limit".into()];
        let p1 = [LaneId::new("p1", "a", "m1"), LaneId::new("p1", "b", "m1")];
        let next = |rr: &mut RoundRobin, last: Option<Class>| {
            pick(
                &s,
                &t,
                Request {
                    tried: &p1,
                    last_failure: last,
                    ..Request::default()
                },
                &v,
                rr,
                0,
                &mut Vec::new(),
            )
        };
        // After a rate limit the conditional tier (p2) comes before trying p1 again.
        assert_eq!(chosen(next(&mut rr, Some(Class::RateLimit))).provider, "p2");
        // After a 5xx it is skipped: only p1's lanes (tried already) are left.
        assert_eq!(chosen(next(&mut rr, Some(Class::Transient))).provider, "p1");
        // Never the first attempt.
        let first = pick(&s, &t, Request::default(), &v, &mut rr, 0, &mut Vec::new());
        assert_eq!(chosen(first).provider, "p1");
    }

    #[test]
    fn a_parked_lane_comes_after_the_others_until_its_probe_is_due() {
        let s = state_with(vec![]);
        let mut v = FakeView::default();
        let mut rr = RoundRobin::default();
        let interval = 1_000;
        for k in ["a", "b"] {
            v.parked.insert(LaneId::new("p1", k, "m1"), interval as i64);
        }
        let with_interval = Request {
            reset_interval_ms: interval,
            ..Request::default()
        };
        let at = |rr: &mut RoundRobin, req: Request<'_>, now: i64| match pick(
            &s,
            &tiers(),
            req,
            &v,
            rr,
            now,
            &mut Vec::new(),
        ) {
            Pick::Lane(c) => c,
            other => panic!("no lane: {other:?}"),
        };
        // Parked: the next tier carries the calls, and no probe is to claim.
        let parked = at(&mut rr, with_interval, 10);
        assert_eq!(parked.lane.provider, "p2");
        assert!(!parked.snap_probe);
        // A call without an interval ignores parking.
        let plain = at(&mut rr, Request::default(), 10);
        assert_eq!(plain.lane.provider, "p1");
        assert!(!plain.snap_probe);
        // Due: the parked lane is chosen again, as a probe the call must claim.
        let due = at(&mut rr, with_interval, 1_000);
        assert_eq!(due.lane.provider, "p1");
        assert!(due.snap_probe);
    }

    #[test]
    fn a_parked_lane_is_still_tried_when_nothing_else_is_left() {
        let s = state_with(vec![]);
        let mut v = FakeView::default();
        for k in ["a", "b"] {
            v.parked.insert(LaneId::new("p1", k, "m1"), 1_000);
        }
        let only_p1 = vec![tiers().remove(0)];
        let got = pick(
            &s,
            &only_p1,
            Request {
                reset_interval_ms: 1_000,
                ..Request::default()
            },
            &v,
            &mut RoundRobin::default(),
            10,
            &mut Vec::new(),
        );
        match got {
            Pick::Lane(c) => {
                assert_eq!(c.lane.provider, "p1");
                assert!(!c.snap_probe, "a last resort is no probe to claim");
            }
            other => panic!("no lane: {other:?}"),
        }
    }
}
