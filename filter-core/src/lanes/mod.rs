//! Lane selection: which (provider, key, model) an attempt uses, by the spec's tiers, from the
//! pushed state plus this VM's own view (what the call tried, in-flight counts, local holds).
//!
//! The lane rule reads in three files: [`rank`] (the spec's order of the tiers, as one value),
//! [`out`] (why a lane is out, and until when) and [`pick::pick`] (the pipeline from the plan's
//! candidates to the chosen lane). The others add to it: `headroom` (the pushed figures less
//! this VM's sends), `select` (the `headroom` and `score` strategies), `when` (conditional
//! candidates), `park` (snap-back), `listing` (a key's catalog), `affinity` and
//! `response_pins` (pinned sessions and stored responses), `families`, `terms`, `cost` and
//! `embeddings` (what the resolver builds the plan from).

pub mod affinity;
pub mod cost;
pub mod embeddings;
pub mod families;
pub mod headroom;
pub mod listing;
pub mod out;
pub mod park;
pub mod pick;
pub mod rank;
pub mod response_pins;
pub mod select;
pub mod terms;
pub mod when;

use crate::vocab::LaneId;

// What the tests below read from the lanes' files (they were written when it all lived here).
#[cfg(test)]
use {
    crate::{
        plan::Candidate,
        state::State,
        vm::round_robin::{RoundRobin, KEY_WINDOW},
        vm::view::View,
        vocab::{LocalHold, LOCAL_HOLD_GRACE_MS},
    },
    ai_router_contract::failure::ErrorClass,
    ai_router_proto::v1::{BreakerPhase, BreakerScope, KeyOutReason},
};

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
mod tests;
