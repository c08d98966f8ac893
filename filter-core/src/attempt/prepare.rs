//! Before the send: the lane picked, a backoff or a returning lane waited for, a half-open
//! breaker's probe lease asked for, or the call's final error answered from here.

use ai_router_proto::names::sync;
use ai_router_proto::v1::{LeaseReply, LeaseRequest};
use prost::Message;

use crate::answer::errors::{final_error, unsent_as_unavailable, GatewayError};
use crate::host::{Flow, Host};
use crate::lanes::embeddings;
use crate::lanes::{self, pick::Pick};
use crate::plan::Plan;
use crate::state::State;
use crate::vocab::LaneId;
use ai_router_contract::failure::ErrorClass;
use ai_router_contract::headers::{
    ATTEMPT as H_ATTEMPT, FINAL_STATUS as H_FINAL_STATUS, RETRY_AFTER as H_RETRY_AFTER,
};

use super::{timer, Attempt, Pending};

/// Picks an attempt makes at most after losing the claim of a parked lane's probe to another
/// call (each loss means one more lane is passed over, so more are rare).
pub(super) const SNAP_CLAIM_PICKS: usize = 4;

impl Attempt {
    /// Answers from this stage (no lane): the final error, not retried.
    pub(super) fn give_up(
        &mut self,
        host: &mut impl Host,
        class: Option<ErrorClass>,
        retry_at_ms: Option<i64>,
    ) -> Flow {
        // The attempts the call sent to a provider; this one, giving up, sent none.
        let sent = host.call_attempts(self.cid()).unwrap_or(0);
        let err = final_error(
            unsent_as_unavailable(class, sent),
            retry_at_ms,
            host.now_ms(),
        );
        self.answer_final(host, sent, err)
    }

    /// Answers the call's final error from this stage (`sent`: the attempts that reached a
    /// provider).
    pub(super) fn answer_final(
        &mut self,
        host: &mut impl Host,
        sent: u32,
        err: GatewayError,
    ) -> Flow {
        let attempts = sent.to_string();
        let final_status = err.status.to_string();
        let retry_after = err.retry_after_s.map(|s| s.to_string());
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", "application/json"),
            (H_ATTEMPT, &attempts),
            (H_FINAL_STATUS, &final_status),
        ];
        if let Some(r) = retry_after.as_deref() {
            headers.push((H_RETRY_AFTER, r));
        }
        // 500 is never retried by the outer router (502 and 503 are); the front stage answers
        // the client with the final status.
        host.send_response(500, &headers, &err.body());
        Flow::Pause
    }

    /// Decides what this attempt does now: give up, wait (backoff, a lane that returns before
    /// the deadline, a probe lease), or go to a lane.
    pub(super) fn prepare(&mut self, host: &mut impl Host) -> Flow {
        let Some(plan) = self.plan.clone() else {
            return self.give_up(host, None, None);
        };
        let Some(state) = host.state() else {
            return self.give_up(host, None, None);
        };
        let now = host.now_ms();
        let deadline = plan.started_ms.saturating_add(plan.deadline_ms as i64);
        if now >= deadline {
            return self.give_up(host, Some(ErrorClass::Deadline), None);
        }
        let (tried, identity, backoff_until, larger_than) = host
            .with_call(&plan.cid, |c| {
                (
                    c.tried.clone(),
                    c.identity.clone(),
                    c.backoff_until_ms,
                    c.larger_than,
                )
            })
            .unwrap_or_default();
        if backoff_until > now {
            // After a transient failure the next attempt waits, bounded by the deadline.
            return self.wait_until(host, backoff_until.min(deadline));
        }
        let (pick, skipped) = pick_now(
            host,
            &plan,
            &state,
            Picking {
                tried: &tried,
                identity: identity.as_ref(),
                larger_than,
                excluded: &self.waits.excluded,
                now,
                claim_snap: true,
            },
        );
        note_skipped(host, &plan, &skipped);
        let chosen = match pick {
            Pick::Lane(c) => c,
            Pick::Unavailable { class, retry_at_ms } => {
                if let Some(pin) = plan.responses.as_ref().and_then(|r| r.pin.as_ref()) {
                    // Only the key that stored the response can serve the call.
                    let last = host.with_call(&plan.cid, |c| c.last_failure).flatten();
                    let out = crate::lanes::response_pins::when_out(
                        pin,
                        &tried,
                        &skipped,
                        (class, retry_at_ms),
                        last,
                        now,
                    );
                    if let Some(err) = out {
                        let sent = host.call_attempts(&plan.cid).unwrap_or(0);
                        return self.answer_final(host, sent, err);
                    }
                }
                if let Some(at) = retry_at_ms.filter(|at| *at < deadline) {
                    // A lane returns before the deadline: wait for it rather than fail.
                    return self.wait_until(host, at);
                }
                let last = host.with_call(&plan.cid, |c| c.last_failure).flatten();
                let (class, retry_at) = match (class, last) {
                    (Some(c), _) => (Some(c), retry_at_ms),
                    (None, Some((c, r))) => (Some(c), r),
                    (None, None) => (None, retry_at_ms),
                };
                return self.give_up(host, class, retry_at);
            }
        };
        if let Some(probe) = chosen.probe.clone() {
            return self.ask_lease(host, chosen, probe);
        }
        self.send_to(host, &state, chosen)
    }

    /// Pauses the attempt until `at`, through the timer listener.
    pub(super) fn wait_until(&mut self, host: &mut impl Host, at: i64) -> Flow {
        match timer(host, at) {
            Ok(token) => {
                self.waits.pending = Pending::Wait(token);
                Flow::Pause
            }
            Err(_) => self.give_up(host, None, Some(at)),
        }
    }

    /// Asks the control plane for the half-open breaker's probe lease.
    pub(super) fn ask_lease(
        &mut self,
        host: &mut impl Host,
        chosen: lanes::pick::Chosen,
        probe: lanes::pick::Probe,
    ) -> Flow {
        let request = LeaseRequest {
            scope: probe.scope.into(),
            provider: probe.provider.clone(),
            key: probe.key.clone(),
            holder: ai_router_contract::probe_holder(
                self.plan.as_ref().map(|p| p.rid.as_str()).unwrap_or(""),
                self.attempt,
            ),
            ttl_ms: self.plan.as_ref().map_or(0, |p| p.timeout_ms).max(1_000),
        };
        let token = host.sync_token();
        let metadata: Vec<(&str, &[u8])> = match &token {
            Some(t) => vec![(ai_router_contract::SYNC_TOKEN_METADATA, t.as_bytes())],
            None => Vec::new(),
        };
        match host.dispatch_grpc_call(
            ai_router_contract::clusters::CONTROL_PLANE,
            sync::SERVICE,
            sync::LEASE,
            &metadata,
            &request.encode_to_vec(),
            2_000,
        ) {
            Ok(t) => {
                self.waits.pending = Pending::Lease(t, Box::new(chosen), probe);
                Flow::Pause
            }
            Err(_) => {
                // No control plane to ask: leave the half-open lane alone for this attempt.
                self.exclude_probe(host, &probe);
                self.prepare(host)
            }
        }
    }

    pub(super) fn exclude_probe(&mut self, host: &mut impl Host, probe: &lanes::pick::Probe) {
        let Some(state) = host.state() else {
            return;
        };
        self.waits.excluded_in_version = host.state_sequence();
        let Some((_, provider)) = state.provider(&probe.provider) else {
            return;
        };
        for key in &provider.keys {
            if probe.key.is_empty() || probe.key == key.alias {
                for m in &provider.models {
                    self.waits
                        .excluded
                        .push(LaneId::new(&provider.id, &key.alias, &m.id));
                }
            }
        }
    }

    /// Resumes the request after an asynchronous step decided.
    pub(super) fn resume_with(&mut self, host: &mut impl Host, action: Flow) {
        if action == Flow::Continue {
            host.resume_request();
        }
    }

    /// The answer to an HTTP call this stage dispatched (the timer).
    pub fn on_http_call_response(&mut self, host: &mut impl Host, token: u32) {
        if matches!(self.waits.pending, Pending::Wait(t) if t == token) {
            self.waits.pending = Pending::Nothing;
            // A lane left to another call's probe comes back once the state moved on (the
            // probe's outcome closed or reopened its breaker): ask again, never wait it out.
            if host.state_sequence() != self.waits.excluded_in_version {
                self.waits.excluded.clear();
            }
            let action = self.prepare(host);
            self.resume_with(host, action);
        }
    }

    /// The answer to a gRPC call this stage dispatched (the probe lease).
    pub fn on_grpc_call_response(
        &mut self,
        host: &mut impl Host,
        token: u32,
        status: u32,
        size: usize,
    ) {
        let Pending::Lease(t, chosen, probe) = std::mem::take(&mut self.waits.pending) else {
            return;
        };
        if t != token {
            self.waits.pending = Pending::Lease(t, chosen, probe);
            return;
        }
        let reply = (status == 0)
            .then(|| host.grpc_call_response_body(size))
            .flatten()
            .and_then(|b| LeaseReply::decode(b.as_slice()).ok());
        let action = match (reply, host.state()) {
            (Some(r), Some(state)) if r.granted => {
                // The state may have moved on while the lease was asked for: read it again.
                let mut chosen = *chosen;
                chosen.health = host.with_lanes(|view, _| {
                    lanes::headroom::health_of(&state, view, &chosen.lane.provider)
                });
                self.send_to(host, &state, chosen)
            }
            _ => {
                // Another call probes this breaker (or the control plane is away): other lanes,
                // or wait for the probe's verdict.
                self.exclude_probe(host, &probe);
                self.prepare(host)
            }
        };
        self.resume_with(host, action);
    }
}

/// What the pick for a call's next attempt reads besides its plan and the state.
pub(crate) struct Picking<'a> {
    pub tried: &'a [LaneId],
    pub identity: Option<&'a String>,
    pub larger_than: Option<Option<u64>>,
    pub excluded: &'a [LaneId],
    pub now: i64,
    /// A parked lane's due probe is claimed (else the pick is returned unclaimed).
    pub claim_snap: bool,
}

/// The lane the call's next attempt takes now (a parked lane's probe claimed first), with the
/// lanes passed over (for the call's trail: [`note_skipped`], once the pick is taken).
pub(crate) fn pick_now(
    host: &mut impl Host,
    plan: &Plan,
    state: &State,
    at: Picking<'_>,
) -> (Pick, Vec<lanes::pick::Skipped>) {
    let now = at.now;
    // An embeddings call never leaves the vector space of its first lane.
    let tiers = match at.identity {
        Some(identity) => embeddings::same_identity(state, &plan.tiers, identity),
        None => plan.tiers.clone(),
    };
    let idle_ms = state.selection().affinity_idle_ms;
    let pinned = plan
        .session
        .as_deref()
        .and_then(|s| crate::lanes::affinity::pinned(host, s, idle_ms, now));
    let last_failure = host
        .with_call(&plan.cid, |c| c.last_failure.map(|(class, _)| class))
        .flatten();
    let request = lanes::pick::Request {
        tried: at.tried,
        excluded: at.excluded,
        tokens: plan.tokens,
        random: host.random_unit(),
        pinned: pinned.as_ref(),
        only_key: plan.responses.as_ref().and_then(|r| r.pin.as_ref()),
        last_failure,
        reset_interval_ms: plan.reset_ms,
        larger_than: at.larger_than,
    };
    let mut skipped = Vec::new();
    let mut pick = host.with_lanes(|view, rr| {
        lanes::pick::pick(state, &tiers, request, view, rr, now, &mut skipped)
    });
    // Snap-back: a parked lane whose probe is due goes to the one call (of every worker)
    // that claims the probe; a call that loses the claim chooses again, passing over it.
    for _ in 0..SNAP_CLAIM_PICKS * usize::from(at.claim_snap) {
        let lost = matches!(&pick, Pick::Lane(c) if c.snap_probe
            && !crate::lanes::park::claim_probe(host, &c.lane, now, plan.reset_ms));
        if !lost {
            break;
        }
        skipped.clear();
        pick = host.with_lanes(|view, rr| {
            lanes::pick::pick(state, &tiers, request, view, rr, now, &mut skipped)
        });
    }
    (pick, skipped)
}

/// The lanes a pick the call takes passed over, in its trail.
pub(crate) fn note_skipped(host: &mut impl Host, plan: &Plan, skipped: &[lanes::pick::Skipped]) {
    if !skipped.is_empty() {
        host.with_call(&plan.cid, |c| {
            for s in skipped {
                c.trail.skip_lane(&s.lane, s.reason);
            }
        });
    }
}

#[cfg(test)]
#[path = "prepare_tests.rs"]
mod tests;
