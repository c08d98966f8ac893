//! The send: the scope's headroom reserved, the provider request built and applied, the
//! lane recorded for the answer.

use std::rc::Rc;

use crate::answer::errors::GatewayError;
use crate::host::{Flow, Host, Side};
use crate::lanes::embeddings;
use crate::lanes::{self};
use crate::plan::{Operation, Plan};
use crate::protocols::anthropic::{self};
use crate::state::State;
use crate::vm::local::Send;
use crate::vocab::LaneId;
use ai_router_contract::error_code::ErrorCode;
use ai_router_contract::failure::ErrorClass;
use ai_router_contract::headers::ATTEMPT as H_ATTEMPT;

use super::request;
use super::{Attempt, Lane};

/// After this many reservations lost in a row, the attempt takes the lane's rate limit as
/// reached (the other workers keep sending; this one stops racing them).
pub(super) const MAX_RESERVATIONS_LOST: u32 = 8;

/// What a send to `chosen` reserves of its key's billing scope at `now`: the headroom it checks,
/// and the send recorded against it.
pub(super) fn reservation(
    chosen: &lanes::pick::Chosen,
    key: &ai_router_proto::v1::ProviderKey,
    tokens: u64,
    now: i64,
) -> (Vec<crate::vm::local::Allowance>, Send) {
    let scope = crate::state::scope_of(key).to_owned();
    let allowances = lanes::headroom::allowances(&chosen.health, &scope, &chosen.lane.model, now)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    let send = Send {
        scope,
        model: chosen.lane.model.clone(),
        at_ms: now,
        tokens,
    };
    (allowances, send)
}

impl Attempt {
    /// Sends the attempt to `chosen`: the body and headers for its provider.
    pub(super) fn send_to(
        &mut self,
        host: &mut impl Host,
        state: &State,
        chosen: lanes::pick::Chosen,
    ) -> Flow {
        let Some(plan) = self.plan.clone() else {
            return self.give_up(host, None, None);
        };
        let client_body = self.body.clone();
        // By identity, not by position: after a lease reply `state` may be a newer snapshot
        // than the one the lane was picked from. A lane that is gone is picked again.
        let Some((provider, key)) = lanes::lane_in(state, &chosen.lane) else {
            return self.prepare(host);
        };
        // The pick read the scope's headroom; the reservation takes its share of it atomically
        // (another worker may have taken the last of it meanwhile: then pick again).
        let (allowances, send) = reservation(&chosen, key, plan.tokens, host.now_ms());
        if !host.reserve_send(&provider.id, send.clone(), &allowances) {
            self.waits.reservations_lost += 1;
            if self.waits.reservations_lost > MAX_RESERVATIONS_LOST {
                return self.give_up(host, Some(ErrorClass::RateLimit), None);
            }
            return self.prepare(host);
        }
        self.waits.reservations_lost = 0;
        self.sent.reserved = Some((provider.id.clone(), send));
        self.write_request(
            host,
            state,
            &plan,
            chosen.lane,
            chosen.probe.is_some(),
            client_body,
        )
    }

    /// Writes the request for `lane` (its scope's headroom reserved) over the caller's
    /// (`client_body`), and takes the lane for the answer.
    pub(super) fn write_request(
        &mut self,
        host: &mut impl Host,
        state: &State,
        plan: &Plan,
        lane: LaneId,
        probe: bool,
        client_body: Rc<Vec<u8>>,
    ) -> Flow {
        let body = client_body.as_slice();
        let Some((provider, key)) = lanes::lane_in(state, &lane) else {
            // Only the first attempt in one pass gets here with a lane the state no longer
            // has (the front reserved it a moment ago): nothing was sent, nothing to retry on.
            if let Some((provider, send)) = self.sent.reserved.take() {
                host.release_send(&provider, &send);
            }
            return self.give_up(host, None, None);
        };
        let now = host.now_ms();
        // The request for this provider, as a value, then written over the caller's.
        let listed = host.listed(Side::Request);
        let model = lane.model.as_str();
        let built = request::build(plan, provider, key, model, body, &listed);
        drop(listed);
        let request = match built {
            Ok(r) => r,
            Err(e) => return self.refuse(host, e),
        };
        let native = request.native;
        self.sent.stored_id =
            crate::lanes::response_pins::Watch::new(plan.responses.as_ref(), native);
        if let Some(echo) = &request.echo {
            self.request = echo.clone();
        }
        if self.position == super::Position::First {
            // What a retry puts back: the router keeps this attempt's header writes.
            let put_back = request.touched(host);
            host.with_call(&plan.cid, |c| {
                c.put_back = put_back;
                c.one_pass = true;
            });
        }
        request.apply(host, body.len(), self.position != super::Position::First);

        let capacity = provider
            .models
            .iter()
            .find(|m| m.id == lane.model)
            .and_then(|m| crate::protocols::context::lane_capacity(provider, m));
        let model_identity = embeddings::identity_of(state, &lane.provider, &lane.model);
        let dimensions = embeddings::dimensions_of(state, &lane.provider, &lane.model);
        host.with_call(&plan.cid, |c| {
            c.tried.push(lane.clone());
            c.attempts = c.attempts.max(self.attempt);
            if plan.op == Operation::Embeddings && c.identity.is_none() {
                c.identity = model_identity;
            }
        });
        // The caller's `dimensions` is what the answer is checked against; else the model's.
        self.sent.dimensions = request.dimensions.or(dimensions);
        self.sent.forward_rate_limits = state.forward_rate_limit_headers();
        self.sent.content = state
            .include_content()
            .then(|| crate::answer::content::Content::of_request(body, key.secret.len()));
        self.sent.probe = probe;
        // The reservation's instant: the report's `at_ms - latency_ms` is then the send the
        // sends record holds, which the quota ledger counts its estimate by.
        self.sent.started_ms = now;
        host.add_in_flight(&lane.provider, &lane.key, 1);
        self.lane = Some(Lane {
            id: lane,
            kind: provider.kind(),
            native,
            secret: key.secret.clone(),
            fingerprint: key.fingerprint,
            daily_reset: ai_router_contract::kinds::DailyReset::parse(&provider.daily_reset_zone),
            rate_limit_windows: (
                provider.requests_window().window(),
                provider.tokens_window().window(),
            ),
            capacity,
        });
        // From here, not before: a wait for a lane, a backoff or a probe lease is the call's
        // (bounded by its deadline), not this attempt's.
        // First in one pass: the router's per-try timeout (the front set it to timeoutMs) is the
        // bound until the first token, since only the router can retry an attempt that has no
        // answer; a retry of a one-pass call is bounded before the router's timeout would cut it.
        let own = self.sent.started_ms.saturating_add(plan.timeout_ms as i64);
        self.bound.bound_ms = match self.position {
            super::Position::First => None,
            _ => Some(self.bound.per_try_until.map_or(own, |until| until.min(own))),
        };
        // Kept until the answer is judged (`self.body`): a verdict resting on words the client
        // sent is not trusted ([`Failure::unless_echoed`]).
        // Last: the provider holds the attempt from here.
        self.sent.sent_us = Some(host.now_us());
        Flow::Continue
    }

    /// The request cannot be expressed for this lane's provider: the caller's to fix (400).
    /// Nothing was sent, so the reservation goes back to the scope.
    pub(super) fn refuse(
        &mut self,
        host: &mut impl Host,
        e: anthropic::error::AdapterError,
    ) -> Flow {
        if let Some((provider, send)) = self.sent.reserved.take() {
            host.release_send(&provider, &send);
        }
        let mut err = GatewayError::new(ErrorCode::InvalidRequest, e.message);
        err.param = e.param;
        let attempts = host.call_attempts(self.cid()).unwrap_or(0).to_string();
        host.send_response(
            400,
            &[("content-type", "application/json"), (H_ATTEMPT, &attempts)],
            &err.body(),
        );
        Flow::Pause
    }
}

#[cfg(test)]
#[path = "send_tests.rs"]
mod tests;
