//! One pass (`gateway.onePass`): a call's first attempt leaves from the public listener. The
//! front stage picks and reserves its lane ([`reserve`]) and sends the call to the aggregate
//! cluster whose first priority is the provider; this stage, as the aggregate's upstream filter,
//! writes that lane's request and judges its answer as it does on the attempt listener. The
//! router keeps an upstream filter's header writes for its retries, so a retry (to the attempt
//! listener, the aggregate's next priority) gets the client's headers back first (the
//! upstream filter puts them back): the first lane's key never reaches another lane, and the
//! attempt listener finds the plan.

use ai_router_contract::plugin::OnePass;

use super::prepare::{note_skipped, pick_now, Picking};
use super::Attempt;
use crate::host::{Flow, Host, Side};
use crate::lanes::{self, pick::Pick};
use crate::plan::Plan;
use crate::state::State;
use crate::vm::call::FirstLane;

/// Whether a candidate's provider could take a first attempt in one pass: over plain HTTP, its
/// host resolved at Envoy's start.
fn eligible(state: &State, provider: &str, one_pass: &OnePass) -> bool {
    state.provider(provider).is_some_and(|(_, p)| {
        // An authority already in the hosts' form is found without making that form.
        let listed = |a: &str| one_pass.hosts.iter().any(|h| h == a);
        p.scheme == "http" && (listed(&p.authority) || listed(&with_port(&p.authority)))
    })
}

/// Picks and reserves the first attempt's lane for one pass: its provider's authority (the
/// host the aggregate's first priority connects to), or `None` when the call goes through the
/// attempt listener (no lane ready now, a breaker's probe to ask for, a provider over TLS or
/// not resolved at Envoy's start, more retries than the aggregate has priorities, or a request
/// id another call of this VM holds).
pub fn reserve(
    host: &mut impl Host,
    plan: &Plan,
    state: &State,
    one_pass: &OnePass,
) -> Option<String> {
    if plan.max_attempts.saturating_sub(1) > one_pass.retries || plan.rid.is_empty() {
        return None;
    }
    // A call none of whose providers one pass can reach is not picked here: the attempt
    // listener picks it, once.
    let reachable = plan
        .tiers
        .iter()
        .flatten()
        .any(|c| eligible(state, &c.provider, one_pass));
    if !reachable {
        return None;
    }
    let now = host.now_ms();
    let picking = Picking {
        tried: &[],
        identity: None,
        larger_than: None,
        excluded: &[],
        now,
        claim_snap: false,
    };
    // The lanes this pick passes over are noted only if the call takes it: otherwise the
    // attempt listener picks again, and notes its own.
    let (Pick::Lane(chosen), skipped) = pick_now(host, plan, state, picking) else {
        return None;
    };
    if chosen.probe.is_some() || chosen.snap_probe {
        return None;
    }
    if !eligible(state, &chosen.lane.provider, one_pass) {
        return None;
    }
    let (provider, key) = lanes::lane_in(state, &chosen.lane)?;
    let (allowances, send) = super::send::reservation(&chosen, key, plan.tokens, now);
    if !host.reserve_send(&provider.id, send.clone(), &allowances) {
        return None;
    }
    if !host.claim_request_id(&plan.rid, &plan.cid) {
        host.release_send(&provider.id, &send);
        return None;
    }
    let first = FirstLane {
        lane: chosen.lane,
        reserved: (provider.id.clone(), send),
    };
    host.with_call(&plan.cid, |c| c.first = Some(first));
    note_skipped(host, plan, &skipped);
    Some(provider.authority.clone())
}

/// `host:port` as the dynamic forward proxy keys its cache: a plain host is on port 80.
fn with_port(authority: &str) -> String {
    let (host, port) = ai_router_contract::host_port(authority);
    ai_router_contract::authority_of(&host, port)
}

impl Attempt {
    /// A retry of a one-pass call, seen by the aggregate's upstream filter: the client's headers
    /// the first attempt rewrote, put back (its call found by the request id it claimed).
    pub(super) fn put_back(&self, host: &mut impl Host) {
        let Some(rid) = host.header_text(Side::Request, "x-request-id") else {
            return;
        };
        let Some(cid) = host.call_by_request_id(&rid) else {
            return;
        };
        let Some(headers) = host.with_call(&cid, |c| c.put_back.clone()) else {
            return;
        };
        for (name, value) in &headers {
            match value {
                Some(v) => host.set_header_bytes(Side::Request, name, v),
                None => host.set_header(Side::Request, name, None),
            }
        }
    }

    /// The first attempt in one pass: the lane the front stage reserved, its request written.
    pub(super) fn send_first(&mut self, host: &mut impl Host) -> Flow {
        let Some(plan) = self.plan.clone() else {
            return self.give_up(host, None, None);
        };
        let Some(first) = host.with_call(&plan.cid, |c| c.first.take()).flatten() else {
            // No lane reserved for this call: the client's request never goes on as it came.
            return self.give_up(host, None, None);
        };
        self.sent.reserved = Some(first.reserved);
        let Some(state) = host.state() else {
            if let Some((provider, send)) = self.sent.reserved.take() {
                host.release_send(&provider, &send);
            }
            return self.give_up(host, None, None);
        };
        let body = self.body.clone();
        self.write_request(host, &state, &plan, first.lane, false, body)
    }
}

#[cfg(test)]
mod tests {
    use super::with_port;

    #[test]
    fn an_authority_is_keyed_with_its_port() {
        assert_eq!(with_port("127.0.0.1:8000"), "127.0.0.1:8000");
        assert_eq!(with_port("Ollama"), "ollama:80");
        assert_eq!(with_port("[::1]:9000"), "[::1]:9000");
        assert_eq!(with_port("[::1]"), "[::1]:80");
    }
}

#[cfg(test)]
#[path = "first_tests.rs"]
mod flow_tests;
