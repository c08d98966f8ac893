//! The attempt's outcome: noted on the call and reported to the control plane.

use ai_router_proto::v1::{
    AttemptOutcome, AttemptResult, ErrorClass as ProtoClass, Usage as ProtoUsage, UsageSource,
};

use crate::classify::failure::Failure;
use crate::host::Host;
use crate::state::State;
use ai_router_contract::failure::ErrorClass;

use super::{client_went_away, Attempt};

impl Attempt {
    pub(super) fn report(&mut self, host: &mut impl Host, failure: Option<&Failure>, status: u16) {
        if self.reported {
            return;
        }
        self.reported = true;
        self.close_upstream(host);
        let Some(lane) = &self.lane else { return };
        let now = host.now_ms();
        host.add_in_flight(&lane.id.provider, &lane.id.key, -1);
        // A send that never reached the provider did not spend its counters: give it back.
        let unsent =
            failure.is_some_and(|f| matches!(f.class, ErrorClass::Network | ErrorClass::Timeout));
        if let Some((provider, send)) = self.sent.reserved.take() {
            if unsent && !self.answer.after_first_token {
                host.release_send(&provider, &send);
            }
        }
        let plan = self.plan.as_ref();
        let backoff = State::resilience_or_defaults(host.state().as_deref())
            .backoff
            .unwrap_or_default();
        // Drawn before borrowing the call: the call table and the generator share a cell.
        let jitter = host.random_unit();
        let after_first_token = self.answer.after_first_token;
        let note = crate::answer::trail::AttemptNote {
            attempt: self.attempt,
            provider: lane.id.provider.clone(),
            key: lane.id.key.clone(),
            model: lane.id.model.clone(),
            class: failure.map(|f| f.class),
            status,
        };
        host.with_call(self.cid(), |c| c.trail.attempt(note));
        let usage = self.answer.usage;
        host.with_call(self.cid(), |c| match failure {
            Some(f) if after_first_token => {
                // The lane answered the client, and its answer broke off.
                c.last_failure = Some((f.class, f.retry_at_ms));
                c.answered = Some(lane.id.clone());
                c.broken_after_first_token = Some(f.class);
            }
            Some(f) => {
                c.last_failure = Some((f.class, f.retry_at_ms));
                if matches!(
                    f.class,
                    ErrorClass::Transient
                        | ErrorClass::Network
                        | ErrorClass::Timeout
                        | ErrorClass::Stream
                ) {
                    c.transient_failures += 1;
                    let wait =
                        crate::vm::backoff::backoff_ms(&backoff, c.transient_failures, jitter);
                    c.backoff_until_ms = now + wait as i64;
                }
            }
            None => {
                c.answered = Some(lane.id.clone());
                c.answered_usage = usage;
            }
        });
        if failure.is_none() {
            if let Some(first) = self.answer.first_byte_ms {
                host.record_latency(&lane.id, (first - self.sent.started_ms).max(0) as f64);
            }
            if let Some(session) = plan.and_then(|p| p.session.as_deref()) {
                let idle_ms = host.state().map_or(0, |s| s.selection().affinity_idle_ms);
                crate::lanes::affinity::remember(host, session, idle_ms, &lane.id, now);
            }
            if let Some(stored) = plan
                .and_then(|p| p.responses.as_ref())
                .filter(|_| self.sent.stored_id.active())
            {
                let vk = plan.map_or("", |p| p.vk.as_str());
                let id = self.sent.stored_id.id();
                crate::lanes::response_pins::remember(host, vk, stored, id, &lane.id, now);
            }
        }
        let reset_ms = plan.map_or(0, |p| p.reset_ms);
        if reset_ms > 0 && !(failure.is_some() && after_first_token) {
            // Snap-back: a failure parks the lane, an answer unparks it. A stream that broke
            // off after its first token did answer; it neither parks nor unparks.
            let class = failure.map(|f| f.class);
            crate::lanes::park::observe(host, &lane.id, class, now, reset_ms);
        }
        let outcome = self.outcome(failure, status, now);
        host.report_attempt(outcome);
    }

    /// The attempt's time at its provider, added to the call's once: from its send to the
    /// arrival of the last provider bytes it needed (those of this callback), else to now (an
    /// attempt that got no answer).
    pub(super) fn close_upstream(&mut self, host: &mut impl Host) {
        let Some(sent_us) = self.sent.sent_us.take() else {
            return;
        };
        let end_us = match self.answer.arrived_us {
            Some(at) => at,
            None => host.now_us(),
        };
        let share = crate::answer::overhead::upstream_share(sent_us, end_us);
        host.with_call(self.cid(), |c| {
            c.upstream_us = c.upstream_us.saturating_add(share)
        });
    }

    /// While the provider holds the attempt, notes when the bytes of this response callback
    /// arrived: its time there ends with the callback that let the answer go or judged it.
    pub(super) fn note_arrival(&mut self, host: &impl Host) {
        if self.sent.sent_us.is_some() {
            self.answer.arrived_us = Some(host.now_us());
        }
    }

    /// The attempt's outcome as the control plane records it.
    fn outcome(&self, failure: Option<&Failure>, status: u16, now: i64) -> AttemptOutcome {
        let plan = self.plan.as_ref();
        let Some(lane) = &self.lane else {
            return AttemptOutcome::default();
        };
        // A saving is counted against the first choice when another lane answered.
        let first_choice = plan.and_then(|p| p.first_choice.as_ref()).filter(|fc| {
            failure.is_none() && (fc.provider != lane.id.provider || fc.model != lane.id.model)
        });
        AttemptOutcome {
            request_id: plan.map(|p| p.rid.clone()).unwrap_or_default(),
            attempt: self.attempt,
            provider: lane.id.provider.clone(),
            key: lane.id.key.clone(),
            model: lane.id.model.clone(),
            outcome: if failure.is_some() {
                AttemptResult::Error.into()
            } else {
                AttemptResult::Success.into()
            },
            error_class: failure
                .map_or(ProtoClass::Unspecified, |f| f.class.into())
                .into(),
            status: u32::from(status),
            latency_ms: now.saturating_sub(self.sent.started_ms).max(0) as u64,
            retry_at_ms: failure.and_then(|f| f.retry_at_ms).unwrap_or(0),
            fingerprint: lane.fingerprint,
            provider_code: failure
                .and_then(|f| f.provider_code.clone())
                .unwrap_or_default(),
            usage: self.usage_to_report(failure.is_none()),
            virtual_key_id: plan.map(|p| p.vk.clone()).unwrap_or_default(),
            at_ms: now,
            after_first_token: self.answer.after_first_token,
            remaining_requests: self.answer.headroom.map_or(-1, |h| h.0),
            remaining_tokens: self.answer.headroom.map_or(-1, |h| h.1),
            ratelimit_reset_at_ms: self.answer.headroom.map_or(0, |h| h.2),
            probe: self.sent.probe,
            stream: plan.is_some_and(|p| p.stream),
            operation: plan.map(|p| p.op.as_str().to_string()).unwrap_or_default(),
            profile: plan.map(|p| p.profile.clone()).unwrap_or_default(),
            first_choice_provider: first_choice.map(|c| c.provider.clone()).unwrap_or_default(),
            first_choice_model: first_choice.map(|c| c.model.clone()).unwrap_or_default(),
            protocol: plan
                .map(|p| crate::plan::client_protocol(p.op, p.protocol).to_owned())
                .unwrap_or_default(),
            content: self.sent.content.as_ref().map(|c| c.to_proto(&lane.secret)),
        }
    }

    /// The usage an attempt is counted for: the provider's; else, for an answer (a success, or
    /// a stream that broke off after its first token), an estimate: the request's prompt
    /// estimate and the answer's generated text, marked as such. A budget or token quota is
    /// then never passed by a provider that reports nothing.
    pub(super) fn usage_to_report(&self, answered: bool) -> Option<ProtoUsage> {
        if let Some(u) = self.answer.usage {
            return Some(ProtoUsage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
                cached_tokens: u.cached_tokens,
                source: UsageSource::Reported.into(),
            });
        }
        (answered || self.answer.after_first_token).then(|| ProtoUsage {
            prompt_tokens: self.plan.as_ref().map_or(0, |p| p.prompt_tokens),
            completion_tokens: self.answer.answer_tokens,
            cached_tokens: 0,
            source: UsageSource::Estimated.into(),
        })
    }

    /// Whether the policy's `timeoutMs` since the send has passed (the router's per-try
    /// timeout cuts a first attempt in one pass two ticks after it).
    fn per_try_passed(&self, now: i64) -> bool {
        self.plan
            .as_ref()
            .is_some_and(|p| now >= super::own_bound(self.sent.started_ms, p.timeout_ms))
    }

    pub fn on_log(&mut self, host: &mut impl Host) {
        if self.reported || self.lane.is_none() {
            return;
        }
        // The attempt ended without a verdict: the provider's connection broke, the call's
        // deadline passed, or the caller went away (the outer router resets this stream then).
        // The attempt's own timeout is never among them: its bound gives the verdict itself.
        // The provider held it until now.
        self.answer.arrived_us = None;
        let now = host.now_ms();
        let deadline = self.plan.as_ref().map_or(i64::MAX, |p| {
            p.started_ms.saturating_add(p.deadline_ms as i64)
        });
        let details = host
            .property(&["response", "code_details"])
            .unwrap_or_default();
        let class = if now + 50 >= deadline {
            ErrorClass::Deadline
        } else if client_went_away(&details) {
            ErrorClass::Cancelled
        } else if self.answer.after_first_token {
            ErrorClass::Stream
        } else if self.position == super::Position::First && self.per_try_passed(now) {
            // First in one pass: the router's per-try timeout (timeoutMs) cut it.
            ErrorClass::Timeout
        } else {
            ErrorClass::Network
        };
        if class == ErrorClass::Cancelled && self.answer.after_first_token {
            // The caller stopped reading early: the lane served it.
            self.report(host, None, 200);
            return;
        }
        let failure = Failure::local(class, 0, String::new());
        self.report(host, Some(&failure), 0);
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
