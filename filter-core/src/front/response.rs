//! The way back: the attempt stage's signals turned into the client's answer (status, headers,
//! the final error's body and trail), and the call's report once it is over.

use ai_router_contract::headers::{
    ATTEMPT as H_ATTEMPT, ATTEMPTS as H_ATTEMPTS, BUDGET_WARNING as H_BUDGET_WARNING,
    CACHE as H_CACHE, COST as H_COST, COST_ESTIMATE as H_COST_ESTIMATE,
    FINAL_STATUS as H_FINAL_STATUS, LANE_COST as H_LANE_COST, LANE_MODEL as H_LANE_MODEL,
    LANE_PROVIDER as H_LANE_PROVIDER, LANE_TRAIL as H_LANE_TRAIL, MODEL as H_MODEL,
    RETRY as H_RETRY, RETRY_AFTER as H_RETRY_AFTER, ROUTE as H_ROUTE, TRAIL as H_TRAIL,
};
use ai_router_proto::v1::{
    ErrorClass as ProtoClass, RequestOutcome, RequestResult, Usage as ProtoUsage,
};

use super::Front;
use crate::answer::errors::GatewayError;
use crate::answer::overhead;
use crate::host::{Flow, Host, Side};
use crate::wire::headers;
use ai_router_contract::error_code::ErrorCode;
use ai_router_contract::failure::ErrorClass;
use ai_router_contract::headers::OVERHEAD_MS as H_OVERHEAD_MS;

impl Front {
    pub fn on_response_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        if self.admin {
            return Flow::Continue;
        }
        if self.answered.is_some() {
            // The stage's own answer: no provider was called.
            host.set_header(Side::Response, H_COST, Some("0"));
            return Flow::Continue;
        }
        // No attempt starts once the answer is here: the body they shared is let go (an attempt
        // still judging its answer holds its own reference).
        if let Some(cid) = self.cid.as_deref() {
            host.with_call(cid, |c| c.body = None);
        }
        // Listed first: the reads below are answered from the listing (one host call).
        host.list_headers(Side::Response);
        self.status = host
            .header_text(Side::Response, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let attempt = host.header_text(Side::Response, H_ATTEMPT);
        let model = host.header_text(Side::Response, H_LANE_MODEL);
        let lane = (
            host.header_text(Side::Response, H_LANE_PROVIDER)
                .unwrap_or_default(),
            model.clone().unwrap_or_default(),
        );
        let cost = host.header_text(Side::Response, H_LANE_COST);
        let retry_after = host.header_text(Side::Response, H_RETRY_AFTER);
        let final_status = host
            .header_text(Side::Response, H_FINAL_STATUS)
            .and_then(|s| s.parse::<u16>().ok());
        if host.header(Side::Response, H_RETRY).is_some() || final_status.is_some() {
            // Every attempt the router was allowed failed, or no lane was left: this answer
            // carries the gateway's final error.
            let status = final_status.unwrap_or(502);
            self.status = status;
            host.set_header(Side::Response, ":status", Some(&status.to_string()));
            if !end_of_stream {
                // The error object gets the call's trail once its body is in.
                self.add_trail = true;
                host.set_header(Side::Response, "content-length", None);
            }
        } else if attempt.is_some() && self.status >= 400 && !end_of_stream {
            // A provider's refusal the call stops at (a 400): a final error, with its trail.
            self.add_trail = true;
            host.set_header(Side::Response, "content-length", None);
        } else if attempt.is_none() && self.status >= 500 {
            self.routers_own_answer(host, end_of_stream);
        }
        let lane_trail = host
            .header_text(Side::Response, H_LANE_TRAIL)
            .filter(|_| self.wants_trail && self.status < 400);
        // Strip everything internal.
        // The attempt stage let a provider's rate-limit headers through only if the operator
        // opted in; its own internal ones end here.
        let internal = headers::internal_names(&host.listed(Side::Response));
        for name in internal {
            host.set_header(Side::Response, &name, None);
        }
        if !self.rid.is_empty() {
            host.set_header(Side::Response, "x-request-id", Some(&self.rid));
        }
        if let Some(m) = model.filter(|_| self.status < 400) {
            host.set_header(Side::Response, H_MODEL, Some(&m));
        }
        // Every answer says what it cost: a failed call cost nothing. A stream's headers go out
        // before its usage: they carry the estimate, named as one, and the usage chunk the
        // real cost (`usage.cost`).
        let cost = cost.filter(|_| self.status < 400);
        match cost {
            Some(estimate) if self.stream => {
                host.set_header(Side::Response, H_COST_ESTIMATE, Some(&estimate));
            }
            cost => {
                host.set_header(Side::Response, H_COST, Some(cost.as_deref().unwrap_or("0")));
            }
        }
        if let Some(route) = &self.route {
            host.set_header(Side::Response, H_ROUTE, Some(route));
        }
        if let Some(trail) = lane_trail {
            host.set_header(Side::Response, H_TRAIL, Some(&trail));
        }
        let attempts = attempt.or_else(|| {
            self.cid
                .as_deref()
                .and_then(|cid| host.call_attempts(cid).map(|n| n.to_string()))
        });
        if let Some(a) = attempts {
            host.set_header(Side::Response, H_ATTEMPTS, Some(&a));
        }
        if let Some(r) = retry_after.filter(|_| self.status >= 400) {
            host.set_header(Side::Response, "retry-after", Some(&r));
        }
        if self.status >= 400 && crate::protocols::redresses_errors(self.protocol) && !end_of_stream
        {
            self.redress = true;
            host.set_header(Side::Response, "content-length", None);
            host.set_header(Side::Response, "content-type", Some("application/json"));
        }
        if !self.budget_warnings.is_empty() {
            let value = self.budget_warnings.join(", ");
            host.set_header(Side::Response, H_BUDGET_WARNING, Some(&value));
        }
        let status = self.status;
        if let Some(v) = self
            .cache
            .on_answer_headers(status, self.stream, end_of_stream, lane)
        {
            host.set_header(Side::Response, H_CACHE, Some(v));
        }
        self.measure_overhead(host);
        Flow::Continue
    }

    /// The answer's first byte leaves: what the gateway added to a call a provider took part
    /// in ([`crate::answer::overhead`]), and the header with it when the client asked.
    fn measure_overhead(&mut self, host: &mut impl Host) {
        let Some(cid) = self.cid.as_deref() else {
            return;
        };
        let Some(upstream_us) = host
            .with_call(cid, |c| (!c.tried.is_empty()).then_some(c.upstream_us))
            .flatten()
        else {
            return;
        };
        let overhead = overhead::overhead_us(self.started_us, host.now_us(), upstream_us);
        self.overhead_us = Some(overhead);
        if self.wants_overhead {
            host.set_header(
                Side::Response,
                H_OVERHEAD_MS,
                Some(&overhead::header_value(overhead)),
            );
        }
    }

    /// The router answered itself: the deadline passed before an answer started (504), or it
    /// could not take the call (503: its circuit breakers are full, or no attempt stage was
    /// there to take it). The answer becomes the gateway's error.
    fn routers_own_answer(&mut self, host: &mut impl Host, end_of_stream: bool) {
        let err = match self.first_attempt_unanswered(host) {
            Some(err) => err,
            None => self.routers_status_error(),
        };
        if let Some(s) = err.retry_after_s {
            host.set_header(Side::Response, "retry-after", Some(&s.to_string()));
        }
        self.status = err.status;
        host.set_header(Side::Response, ":status", Some(&err.status.to_string()));
        host.set_header(Side::Response, "content-type", Some("application/json"));
        host.set_header(Side::Response, "content-length", None);
        if end_of_stream {
            // No body to replace; the status and headers still tell the story.
        } else {
            self.replace_body = Some(err.body());
            // A final error like any other: with the call's trail.
            self.add_trail = self.cid.is_some();
        }
    }

    /// The router's own status as the gateway's error.
    fn routers_status_error(&self) -> GatewayError {
        match self.status {
            504 => GatewayError::new(
                ErrorCode::PoolTimeout,
                "The call's deadline passed before a provider answered.",
            ),
            503 => GatewayError::new(
                ErrorCode::PoolUnavailable,
                "The gateway cannot take this call now; try again shortly.",
            )
            .with_retry_after(Some(1)),
            _ => GatewayError::new(
                ErrorCode::UpstreamError,
                "No provider could be reached for this call.",
            ),
        }
    }

    /// One pass, no retry left: the first attempt's provider broke off or said nothing within
    /// timeoutMs, and the router answered for it (its per-try timeout, or the reset). The
    /// gateway's answer is the one the attempt listener gives for that failure.
    fn first_attempt_unanswered(&self, host: &mut impl Host) -> Option<GatewayError> {
        let cid = self.cid.as_deref()?;
        if host.with_call(cid, |c| c.one_pass) != Some(true) {
            return None;
        }
        let details = host.property(&["response", "code_details"])?;
        let class = if details.starts_with(b"upstream_per_try_timeout") {
            ErrorClass::Timeout
        } else if details.starts_with(b"upstream_reset_before_response_started")
            && !details.windows(8).any(|w| w == b"overflow")
        {
            // (An overflow is the gateway's own bound: its 503 stays.)
            ErrorClass::Network
        } else {
            return None;
        };
        Some(crate::answer::errors::final_error(
            Some(class),
            None,
            host.now_ms(),
        ))
    }

    pub fn on_response_body(
        &mut self,
        host: &mut impl Host,
        size: usize,
        end_of_stream: bool,
    ) -> Flow {
        if self.admin {
            return Flow::Continue;
        }
        if self.cache.collecting() {
            let chunk = host.body(Side::Response, 0, size);
            let now = host.now_ms();
            // The answering attempt's usage (reported before its last bytes reach here): a
            // stream whose client did not ask for the usage chunk is stored with it anyway.
            let usage = end_of_stream
                .then_some(self.cid.as_deref())
                .flatten()
                .and_then(|cid| host.with_call(cid, |c| c.answered_usage))
                .flatten();
            self.cache
                .on_answer_body(host, &chunk, end_of_stream, usage, now);
        }
        if self.replace_body.is_none() && !self.redress && !self.add_trail {
            return Flow::Continue;
        }
        if !end_of_stream {
            return Flow::Pause;
        }
        let mut body = match self.replace_body.clone() {
            Some(body) => body,
            None => host.body(Side::Response, 0, size),
        };
        if self.add_trail {
            // The final error's body gets the call's routing trail.
            let trail = self
                .cid
                .as_deref()
                .and_then(|cid| host.with_call(cid, |c| c.trail.clone()))
                .unwrap_or_default();
            if let Some(with_trail) = crate::answer::trail::with_trail(&body, &trail) {
                body = with_trail;
            }
        }
        if self.redress {
            if let Some(redressed) =
                crate::protocols::redress_error(self.protocol, self.status, &body)
            {
                body = redressed;
            }
        }
        host.set_body(Side::Response, 0, size, &body);
        Flow::Continue
    }

    pub fn on_log(&mut self, host: &mut impl Host) {
        let call = self.cid.as_deref().and_then(|cid| host.end_call(cid));
        // A lane the front reserved for a first attempt that never left (one pass).
        if let Some((provider, send)) = call
            .as_ref()
            .and_then(|c| c.first.as_ref())
            .map(|f| &f.reserved)
        {
            host.release_send(provider, send);
        }
        let Some(op) = self.op else { return };
        let now = host.now_ms();
        let success = (RequestResult::Success, None, "");
        let ((outcome, class, code), status) = match self.answered {
            Some((status, code)) if status >= 400 => {
                ((RequestResult::Rejected, None, code), status)
            }
            Some((status, _)) => (success, status),
            None if (200..300).contains(&self.status) => {
                // A stream that broke off after its first token is no success: the attempt
                // stage said so, or (when its report comes later) Envoy's router cut it.
                let broken = call
                    .as_ref()
                    .and_then(|c| c.broken_after_first_token)
                    .or_else(|| cut_by_the_router(host));
                match broken {
                    Some(class) => ((RequestResult::Error, Some(class), ""), self.status),
                    None => (success, self.status),
                }
            }
            None => {
                // No class when no attempt's failure is known: "error:upstream" in text. A
                // client that went away before its answer cancelled the call.
                let went_away = host
                    .property(&["response", "code_details"])
                    .is_some_and(|d| crate::attempt::client_went_away(&d));
                let class = if went_away {
                    Some(ErrorClass::Cancelled)
                } else {
                    call.as_ref().and_then(|c| c.last_failure).map(|(c, _)| c)
                };
                ((RequestResult::Error, class, ""), self.status)
            }
        };
        // The lane that answered, else the last attempt's: a failed call names where it ended
        // (none when no attempt was sent).
        let answered = call
            .as_ref()
            .and_then(|c| c.answered.clone().or_else(|| c.tried.last().cloned()));
        let mut report = RequestOutcome {
            request_id: self.rid.clone(),
            virtual_key_id: self.vk_id.clone(),
            operation: op.as_str().into(),
            outcome: outcome.into(),
            error_class: class
                .map_or(ProtoClass::Unspecified, ProtoClass::from)
                .into(),
            rejected_code: code.into(),
            status: u32::from(status),
            attempts: call.as_ref().map(|c| c.attempts).unwrap_or(0),
            latency_ms: now.saturating_sub(self.started_ms).max(0) as u64,
            provider: answered
                .as_ref()
                .map(|l| l.provider.clone())
                .unwrap_or_default(),
            model: answered
                .as_ref()
                .map(|l| l.model.clone())
                .unwrap_or_default(),
            usage: None::<ProtoUsage>,
            at_ms: now,
            budget_warnings: std::mem::take(&mut self.budget_warnings),
            cache_hit: false,
            requested_model: self.requested_model.clone(),
            traceparent: self.traceparent.clone(),
            protocol: crate::plan::client_protocol(op, self.protocol).into(),
            tracestate: self.tracestate.clone(),
            overhead_us: self.overhead_us,
            ..RequestOutcome::default()
        };
        self.cache.report(&mut report);
        host.report_request(report);
    }
}

/// How Envoy's router ended an answer that had started, from the stream's response code
/// details (as Envoy 1.40 sets them): the deadline (the route's timeout, `response_timeout`) or
/// a reset of the attempt hop (`upstream_reset_after_response_started{...}`).
fn cut_by_the_router(host: &impl Host) -> Option<ErrorClass> {
    let details = host.property(&["response", "code_details"])?;
    if details == b"response_timeout" {
        Some(ErrorClass::Deadline)
    } else if details.starts_with(b"upstream_reset_after_response_started") {
        Some(ErrorClass::Stream)
    } else {
        None
    }
}
