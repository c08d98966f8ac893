//! The pick: which lane (provider, key, model) the next attempt of a call takes. Read top-down:
//! 1. [`pick`] walks the plan's candidates tier by tier ([`Candidate`]s whose `when` allows
//!    them after the call's last failure), and each candidate's keys in `Lanes::keys` order;
//! 2. `Call::judge` rules each lane out with an [`OutReason`] (noted in `skipped`) or keeps
//!    it as `Usable`, with its [`Rank`];
//! 3. `choose`: the session's pinned lane, else the strategy (`headroom`, `score`), else the
//!    best rank, the lanes within the latency tolerance, and `choose_tiers`.
//!
//! When no lane is usable, the pick names the lane that returns soonest ([`Pick::Unavailable`]).

use std::rc::Rc;

use ai_router_proto::v1::{BreakerScope, Model, Provider, Selection, SelectionStrategy};

use crate::lanes::headroom::{headroom_left, health_of};
use crate::lanes::out::{breaker_gate, out_reason, BreakerGate, Lane, OutReason, SLOT_POLL_MS};
use crate::lanes::park::passed_over;
use crate::lanes::rank::Rank;
use crate::lanes::select::{self, LaneFacts};
use crate::plan::Candidate;
use crate::state::{scope_of, LaneHealth, State};
use crate::vm::round_robin::{smooth_weighted, RoundRobin, KEY_WINDOW};
use crate::vm::view::View;
use crate::vocab::LaneId;
use ai_router_contract::failure::ErrorClass;

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
    pub last_failure: Option<ErrorClass>,
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
        class: Option<ErrorClass>,
        retry_at_ms: Option<i64>,
    },
}

/// A lane ruled out for this attempt, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub lane: LaneId,
    pub reason: OutReason,
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
    let call = Call::new(state, req, view, now_ms);
    let mut usable: Vec<Usable> = Vec::new();
    let mut soonest: Option<(ErrorClass, Option<i64>)> = None;
    for (tier, cand) in tiers
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.iter().map(move |c| (i, c)))
    {
        let Some(lanes) = call.lanes(tier, cand) else {
            continue;
        };
        let mut looked_at = 0;
        for ki in lanes.keys(&call, rr) {
            if lanes.windowed && looked_at >= KEY_WINDOW {
                break;
            }
            match call.judge(&lanes, ki) {
                Judged::Usable(u) => {
                    looked_at += 1;
                    usable.push(*u);
                }
                Judged::Out { lane, reason, wait } => {
                    if let Some((class, until)) = wait {
                        soonest = sooner(soonest, class, until);
                    }
                    skipped.push(Skipped { lane, reason });
                }
            }
        }
    }
    choose(&call, rr, usable, soonest)
}

/// What every lane of one pick is judged against.
struct Call<'a> {
    state: &'a State,
    req: Request<'a>,
    view: &'a dyn View,
    selection: Selection,
    /// The `headroom` and `score` strategies weigh every usable lane against the others; `tiers`
    /// looks at a large pool's keys through a window.
    tiers_only: bool,
    /// When the control plane last spoke: this VM's holds set before it give way.
    synced_at_ms: i64,
    now_ms: i64,
}

/// One candidate (provider and model) of the plan, read once for all its keys.
struct Lanes<'a> {
    tier: usize,
    cand: &'a Candidate,
    provider_index: usize,
    provider: &'a Provider,
    model: Option<&'a Model>,
    health: Rc<LaneHealth>,
    /// After a context-length failure, the candidate takes no longer prompt.
    too_small: bool,
    /// More keys than a pick looks at: a window of [`KEY_WINDOW`] usable keys.
    windowed: bool,
}

/// A lane the attempt may take, and what the choice among them reads.
struct Usable {
    chosen: Chosen,
    rank: Rank,
    in_flight: u32,
    /// The candidate's share of its tier (provider x model x candidate weight).
    candidate_weight: f64,
    /// The key's share within its candidate.
    key_weight: f64,
    latency: Option<f64>,
    /// What the `headroom` and `score` strategies read.
    facts: LaneFacts<Rank>,
}

/// A lane judged: usable, or out for a reason (with, when the call may wait for it, its class
/// and when it returns).
enum Judged {
    Usable(Box<Usable>),
    Out {
        lane: LaneId,
        reason: OutReason,
        wait: Option<(ErrorClass, Option<i64>)>,
    },
}

impl<'a> Call<'a> {
    fn new(state: &'a State, req: Request<'a>, view: &'a dyn View, now_ms: i64) -> Call<'a> {
        let selection = state.selection();
        Call {
            state,
            req,
            view,
            tiers_only: select::strategy(&selection) == SelectionStrategy::Tiers,
            selection,
            synced_at_ms: view
                .synced_at_ms()
                .unwrap_or(state.snapshot.generated_at_ms),
            now_ms,
        }
    }

    /// The candidate's lanes, or none: its `when` does not allow it after the call's last
    /// failure, or its provider is gone.
    fn lanes(&self, tier: usize, cand: &'a Candidate) -> Option<Lanes<'a>> {
        if !crate::lanes::when::allows(&cand.when, self.req.last_failure) {
            return None;
        }
        let (provider_index, provider) = self.state.provider(&cand.provider)?;
        let model = provider.models.iter().find(|m| m.id == cand.model);
        // After a context-length failure, only a lane known to take more.
        let too_small = self.req.larger_than.is_some_and(|failed| {
            !model.is_some_and(|m| {
                crate::protocols::context::larger_than(
                    crate::protocols::context::lane_capacity(provider, m),
                    failed,
                )
            })
        });
        Some(Lanes {
            tier,
            cand,
            provider_index,
            provider,
            model,
            health: health_of(self.state, self.view, &provider.id),
            too_small,
            windowed: self.tiers_only && provider.keys.len() > 2 * KEY_WINDOW,
        })
    }

    /// The lane of key `ki` of the candidate: out, and why, or usable.
    fn judge(&self, lanes: &Lanes<'_>, ki: usize) -> Judged {
        let (provider, now_ms) = (lanes.provider, self.now_ms);
        let key = &provider.keys[ki];
        let lane = LaneId::new(&provider.id, &key.alias, &lanes.cand.model);
        let out = |lane, reason, wait| Judged::Out { lane, reason, wait };
        // A key whose catalog lacks the model (`discover: true`) is no lane for it.
        if lanes.model.is_some_and(|m| !key.reaches(m)) {
            return out(lane, OutReason::NotListed, None);
        }
        if lanes.too_small {
            return out(lane, OutReason::ContextWindow, None);
        }
        if self.req.excluded.contains(&lane) {
            let wait = (ErrorClass::Transient, Some(now_ms + SLOT_POLL_MS * 4));
            return out(lane, OutReason::ProbeElsewhere, Some(wait));
        }
        let health = &lanes.health;
        let left = headroom_left(
            health,
            self.view,
            &provider.id,
            scope_of(key),
            &lane.model,
            now_ms,
        );
        let judged = Lane {
            provider,
            key,
            id: &lane,
            health,
            left,
        };
        if let Some(o) = out_reason(
            &judged,
            self.view,
            self.synced_at_ms,
            self.req.tokens,
            now_ms,
        ) {
            return out(lane, o.reason, Some((o.class, o.until)));
        }
        Judged::Usable(Box::new(self.usable(lanes, ki, lane, left)))
    }

    /// A usable lane with its rank and what the strategies read.
    fn usable(
        &self,
        lanes: &Lanes<'_>,
        ki: usize,
        lane: LaneId,
        left: Option<crate::lanes::headroom::Left>,
    ) -> Usable {
        let (provider, health, now_ms) = (lanes.provider, &lanes.health, self.now_ms);
        let key = &provider.keys[ki];
        let probe = half_open(health, provider, &key.alias, now_ms);
        let low_headroom = left.is_some_and(|(requests, _, _)| {
            requests >= 0 && (requests as u64) <= self.selection.low_headroom
        });
        let parked_until = if self.req.reset_interval_ms > 0 {
            self.view.parked(&lane)
        } else {
            None
        };
        let parked = passed_over(parked_until, now_ms);
        let rank = Rank::of(&lane, lanes.tier, self.req.tried, parked, low_headroom);
        let reported = health
            .headroom(scope_of(key), &lane.model)
            .filter(|h| h.reset_at_ms > now_ms);
        let in_flight = self.view.in_flight(&provider.id, &key.alias);
        let model_weight = lanes.model.map(|m| positive(m.weight)).unwrap_or(1.0);
        Usable {
            facts: LaneFacts {
                rank,
                remaining_requests: reported.map(|h| h.remaining_requests).filter(|r| *r >= 0),
                remaining_tokens: reported.map(|h| h.remaining_tokens).filter(|t| *t >= 0),
                in_flight,
                half_open: probe.is_some(),
            },
            rank,
            in_flight,
            latency: self.view.latency(&lane),
            candidate_weight: positive(provider.weight)
                * model_weight
                * positive(lanes.cand.weight),
            key_weight: positive(key.weight),
            chosen: Chosen {
                lane,
                provider_index: lanes.provider_index,
                key_index: ki,
                tier: lanes.tier,
                probe,
                health: health.clone(),
                snap_probe: parked_until.is_some() && !parked,
            },
        }
    }
}

impl Lanes<'_> {
    /// The order the candidate's keys are looked at: the key the call must use alone, else the
    /// session's pinned key first, then every key from where the last window of this provider
    /// and model ended (from the first key when the pool is small).
    fn keys(&self, call: &Call<'_>, rr: &mut RoundRobin) -> impl Iterator<Item = usize> {
        let (provider, model) = (self.provider, &self.cand.model);
        let n = provider.keys.len();
        let start = if self.windowed {
            rr.window_start(&provider.id, model, n)
        } else {
            0
        };
        let position = |alias: &str| provider.keys.iter().position(|k| k.alias == alias);
        let only_key = call.req.only_key.map(|only| {
            (only.provider == provider.id)
                .then(|| position(&only.key))
                .flatten()
        });
        let pinned_key = match only_key {
            Some(only) => only,
            None => call
                .req
                .pinned
                .filter(|p| p.provider == provider.id && &p.model == model)
                .and_then(|p| position(&p.key)),
        };
        // With a key the call must use, that key alone is looked at.
        let others = if only_key.is_some() { 0 } else { n };
        pinned_key.into_iter().chain(
            (0..others)
                .map(move |i| (start + i) % n)
                .filter(move |ki| Some(*ki) != pinned_key),
        )
    }
}

/// The half-open breaker (the provider's, else the key's) whose probe the attempt must hold.
fn half_open(health: &LaneHealth, provider: &Provider, key: &str, now_ms: i64) -> Option<Probe> {
    [(BreakerScope::Provider, ""), (BreakerScope::Key, key)]
        .into_iter()
        .find_map(|(scope, k)| {
            matches!(
                breaker_gate(health, scope, k, now_ms),
                BreakerGate::HalfOpen
            )
            .then(|| Probe {
                scope,
                provider: provider.id.clone(),
                key: k.to_string(),
            })
        })
}

/// The choice among the usable lanes: the session's pinned lane while untried, else the
/// strategy's among every usable lane, else (`tiers`) the best rank, the lanes within the
/// latency tolerance of the best measured one, and `choose_tiers`.
fn choose(
    call: &Call<'_>,
    rr: &mut RoundRobin,
    mut usable: Vec<Usable>,
    soonest: Option<(ErrorClass, Option<i64>)>,
) -> Pick {
    let pinned = call.req.pinned.and_then(|pin| {
        usable
            .iter()
            .position(|u| &u.chosen.lane == pin && !u.rank.lane_tried)
    });
    if let Some(i) = pinned {
        return Pick::Lane(usable.swap_remove(i).chosen);
    }
    if !call.tiers_only && !usable.is_empty() {
        let facts: Vec<_> = usable.iter().map(|u| u.facts).collect();
        if let Some(i) = select::choose(&call.selection, &facts, call.req.random) {
            return Pick::Lane(usable.swap_remove(i).chosen);
        }
        // Every usable lane weighs 0: they are out as if spent.
        usable.clear();
    }
    let Some(best_rank) = usable.iter().map(|u| u.rank).min() else {
        return Pick::Unavailable {
            class: soonest.map(|(class, _)| class),
            retry_at_ms: soonest.and_then(|(_, at)| at),
        };
    };
    usable.retain(|u| u.rank == best_rank);
    // Lanes within the latency tolerance of the best measured one tie; unmeasured ones stay in.
    if let Some(best) = usable.iter().filter_map(|u| u.latency).reduce(f64::min) {
        let selection = &call.selection;
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

/// Keeps the reason whose lane returns first (the call may wait for it).
fn sooner(
    soonest: Option<(ErrorClass, Option<i64>)>,
    class: ErrorClass,
    until: Option<i64>,
) -> Option<(ErrorClass, Option<i64>)> {
    Some(match soonest {
        None => (class, until),
        Some((c, u)) => match (u, until) {
            (Some(a), Some(b)) if b < a => (class, until),
            (None, Some(_)) => (class, until),
            _ => (c, u),
        },
    })
}

/// A weight as configured, 1 when unset (0) or negative.
fn positive(w: f64) -> f64 {
    if w > 0.0 {
        w
    } else {
        1.0
    }
}
