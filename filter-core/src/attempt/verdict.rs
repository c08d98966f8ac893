//! Judging the answer: a whole answer checked, a failure turned into the signal for the
//! outer router or the client's refusal, the attempt's own bound.

use ai_router_proto::v1::ProviderKind;
use serde_json::Value;

use crate::answer::errors::{final_error, upstream_invalid_request};
use crate::answer::redact::{redact, redact_bytes};
use crate::classify::{classify_in, failure::Failure};
use crate::host::{Host, Side};
use crate::lanes::embeddings;
use crate::plan::{Operation, Protocol};
use crate::protocols::anthropic::{self};
use crate::protocols::{self};
use crate::vocab::usage_of;
use ai_router_contract::failure::ErrorClass;
use ai_router_contract::headers::{
    ATTEMPT as H_ATTEMPT, FINAL_STATUS as H_FINAL_STATUS, RETRY as H_RETRY,
    RETRY_AFTER as H_RETRY_AFTER,
};

use super::{whole, Attempt, Mode, Streaming};

/// A failed attempt's answer on the hop back to the outer router.
pub(super) struct Verdict {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Verdict {
    fn header_pairs(&self) -> Vec<(&str, &str)> {
        self.headers.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }
}

impl Attempt {
    /// Whether the attempt's bound has passed while it still waits for its answer (or, after
    /// the first token, for its next chunk): the host then calls [`Attempt::on_bound`].
    pub fn bound_due(&self, now_ms: i64) -> bool {
        self.bound.bound_ms.is_some_and(|until| now_ms >= until)
            && !self.reported
            && !self.bound.answered_locally
    }

    /// The attempt's bound passed: it timed out.
    pub fn on_bound(&mut self, host: &mut impl Host) {
        if !self.bound_due(host.now_ms()) {
            return;
        }
        // The provider held the attempt until now.
        self.answer.arrived_us = None;
        let timeout = self.plan.as_ref().map_or(0, |p| p.timeout_ms);
        let what = if self.answer.after_first_token {
            "the next chunk"
        } else if self.plan.as_ref().is_some_and(|p| p.stream) {
            "the first token"
        } else {
            "the answer"
        };
        let failure = Failure::local(
            ErrorClass::Timeout,
            0,
            format!("the provider sent {what} later than timeoutMs ({timeout} ms)"),
        );
        if self.answer.after_first_token {
            // The stream is the client's: no callback is left in which to add an error event
            // (the provider is silent), so it is cut; the client sees it break off.
            if let Mode::Stream(Streaming { gate, .. }) = &self.mode {
                self.answer.usage = gate.usage;
                self.answer.answer_tokens = gate.answer_tokens;
            }
            self.report(host, Some(&failure), 200);
            self.mode = Mode::Drained;
            host.reset_stream();
        } else {
            self.fail_locally(host, failure);
        }
    }

    /// The answer that carries a failed attempt's verdict: for a retryable failure the signal
    /// for the outer router (and the final error, should retries run out), else the
    /// provider's refusal for the client. Holds and reports the failure.
    pub(super) fn verdict(
        &mut self,
        host: &mut impl Host,
        failure: &Failure,
        param: Option<String>,
    ) -> Verdict {
        let now = host.now_ms();
        // The answer states the window the hold applies (a quota with no window named is out
        // for `quotaBlacklistMs`, not the default Retry-After).
        let held_until = self.hold(host, failure, now);
        self.report(host, Some(failure), failure.status);
        let window = failure.retry_at_ms.or(held_until);
        if failure.retry_at_ms.is_none() && window.is_some() {
            // A later attempt that finds no lane answers with this failure's window too.
            host.with_call(self.cid(), |c| {
                if let Some((_, retry_at @ None)) = &mut c.last_failure {
                    *retry_at = window;
                }
            });
        }
        let mut headers: Vec<(&'static str, String)> = vec![
            (H_ATTEMPT, self.attempt.to_string()),
            ("content-type", "application/json".into()),
        ];
        let larger = failure.class == ErrorClass::ContextLength && self.larger_lane_remains(host);
        let (status, body) = if failure.class.retryable() || larger {
            let err = final_error(Some(failure.class), window, now);
            headers.push((H_RETRY, "1".into()));
            headers.push((H_FINAL_STATUS, err.status.to_string()));
            if let Some(s) = err.retry_after_s {
                headers.push((H_RETRY_AFTER, s.to_string()));
            }
            (503u16, err.body())
        } else {
            let secret = self.lane.as_ref().map(|l| l.secret.as_str()).unwrap_or("");
            let err = upstream_invalid_request(failure.status, &redact(&failure.message, secret));
            let param = param.map(|p| redact(&p, secret));
            (failure.status, err.body_naming(param.as_deref()))
        };
        Verdict {
            status,
            headers,
            body,
        }
    }

    /// After a context-length failure: whether the plan holds a lane larger than this one (the
    /// call then moves on, and only to such lanes); noted in the call for the next attempt.
    pub(super) fn larger_lane_remains(&self, host: &mut impl Host) -> bool {
        let (Some(plan), Some(lane), Some(state)) = (&self.plan, &self.lane, host.state()) else {
            return false;
        };
        let failed = lane.capacity;
        let larger = plan.tiers.iter().flatten().any(|c| {
            state.provider(&c.provider).is_some_and(|(_, p)| {
                p.models.iter().any(|m| {
                    m.id == c.model
                        && crate::protocols::context::larger_than(
                            crate::protocols::context::lane_capacity(p, m),
                            failed,
                        )
                })
            })
        });
        if larger {
            host.with_call(&plan.cid, |c| {
                // A second failure narrows it further: never back to a smaller lane.
                let floor = match c.larger_than {
                    Some(Some(before)) => Some(failed.map_or(before, |f| f.max(before))),
                    _ => failed,
                };
                c.larger_than = Some(floor);
            });
        }
        larger
    }

    /// Turns the held response into the signal for the outer router, or the client's answer.
    pub(super) fn fail(&mut self, host: &mut impl Host, failure: Failure, body_size: usize) {
        let failure = failure.unless_echoed(&self.body);
        // The field the provider refused, for a refusal the client gets.
        let param = (!self.answer.headers_only && !failure.class.retryable())
            .then(|| {
                crate::answer::errors::provider_param(&host.body(Side::Response, 0, body_size))
            })
            .flatten();
        let verdict = self.verdict(host, &failure, param);
        self.mode = Mode::Drained;
        let retry = verdict.headers.iter().any(|(name, _)| *name == H_RETRY);
        if self.answer.headers_only && !(retry && self.position == super::Position::First) {
            // The provider's answer has no body to replace (the host refuses to write one):
            // answer in its place. (First in one pass, a retry is the router's to make, which
            // it makes on an upstream's answer only: the headers say it, with no body.)
            host.send_response(verdict.status, &verdict.header_pairs(), &verdict.body);
            return;
        }
        host.set_header(Side::Response, ":status", Some(&verdict.status.to_string()));
        for (name, value) in &verdict.headers {
            host.set_header(Side::Response, name, Some(value));
        }
        host.set_header(Side::Response, "content-length", None);
        if !self.answer.headers_only {
            host.set_body(Side::Response, 0, body_size, &verdict.body);
        }
    }

    /// Fails the attempt outside any callback of its answer (its bound passed, on the host's
    /// tick): the verdict is answered locally, in place of whatever the provider has sent or
    /// still sends (nothing of it has reached the client: its headers are held until the first
    /// token).
    pub(super) fn fail_locally(&mut self, host: &mut impl Host, failure: Failure) {
        let verdict = self.verdict(host, &failure, None);
        self.bound.answered_locally = true;
        self.mode = Mode::Through;
        host.send_response(verdict.status, &verdict.header_pairs(), &verdict.body);
    }

    /// The verdict on a whole (unary or error) answer.
    pub(super) fn judge_whole(&mut self, host: &mut impl Host, body: &[u8], size: usize) {
        let Mode::Whole { status, headers } = std::mem::take(&mut self.mode) else {
            return;
        };
        let Some(lane) = &self.lane else { return };
        let now = host.now_ms();
        let success = (200..300).contains(&status);
        let stream_wanted = self.plan.as_ref().is_some_and(|p| p.stream);
        let protocol = self.plan.as_ref().map_or(Protocol::Chat, |p| p.protocol);
        let op = self.plan.as_ref().map(|p| p.op);
        let from_anthropic = lane.kind == ProviderKind::Anthropic && op == Some(Operation::Chat);
        let checks_dimensions = self.sent.dimensions.is_some() && op == Some(Operation::Embeddings);
        // A failure, or a success that goes to the client as it came (a chat answer from a chat
        // lane, whole): the verdict needs a few facts of the answer, read without a `Value`
        // when it can be (`whole::read`).
        let as_it_came =
            !lane.native && !stream_wanted && protocol == Protocol::Chat && !from_anthropic;
        if !success || (as_it_came && !checks_dimensions) {
            if let Some(facts) = whole::read(body) {
                self.answer.answer_tokens = facts.answer_tokens;
                if success && !facts.error {
                    if !facts.object {
                        self.not_an_object(host, status, false, size);
                        return;
                    }
                    self.answer.usage = facts.usage;
                    self.pass_as_it_came(host, body, size, status);
                    return;
                }
                self.judge_failure(host, status, &headers, body, size, now);
                return;
            }
        }
        let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let has_error_object = parsed.get("error").is_some_and(|e| !e.is_null());
        self.answer.answer_tokens = crate::protocols::context::estimate_answer_tokens(&parsed);
        if success && !has_error_object {
            // A success must be what it claims: a JSON object (HTML from a proxy, an empty or
            // cut body are not). A JSON answer to a stream request (a server that ignores
            // `stream`) is served as the stream the client asked for.
            if !parsed.is_object() {
                self.not_an_object(host, status, stream_wanted, size);
                return;
            }
            // Vectors of another length than declared fail over, in any protocol's shape.
            if let Some(expected) = self.sent.dimensions.filter(|_| checks_dimensions) {
                if let Err(message) = embeddings::check_dimensions(&parsed, expected) {
                    let failure = Failure::local(ErrorClass::Mismatch, status, message);
                    self.fail(host, failure, size);
                    return;
                }
            }
            if lane.native {
                // The caller's own protocol: the answer goes as it came, its key redacted.
                self.answer.usage = protocols::answer_usage(protocol, &parsed);
                self.sent.stored_id.answer(&parsed);
                if stream_wanted {
                    self.answer_as_stream(host, size, protocol, parsed, status);
                    return;
                }
                self.pass_as_it_came(host, body, size, status);
                return;
            }
            if from_anthropic || protocol != Protocol::Chat {
                let chat = if from_anthropic {
                    anthropic::response::from_messages_response(&parsed, now / 1000)
                } else {
                    parsed
                };
                self.answer.usage = usage_of(&chat);
                let translated = protocols::unary(protocol, &chat, &self.request, now / 1000);
                if stream_wanted {
                    self.answer_as_stream(host, size, protocol, translated, status);
                    return;
                }
                let bytes = self.scrub(translated.to_string().into_bytes());
                host.set_body(Side::Response, 0, size, &bytes);
                host.set_header(Side::Response, "content-length", None);
                host.set_header(Side::Response, "content-type", Some("application/json"));
                self.succeed_headers(host);
                self.report(host, None, status);
                self.mode = Mode::Through;
                return;
            }
            self.answer.usage = usage_of(&parsed);
            if stream_wanted {
                self.answer_as_stream(host, size, protocol, parsed, status);
                return;
            }
            self.pass_as_it_came(host, body, size, status);
            return;
        }
        self.judge_failure(host, status, &headers, body, size, now);
    }

    /// A 2xx whose body is no JSON object: the attempt fails over.
    fn not_an_object(
        &mut self,
        host: &mut impl Host,
        status: u16,
        stream_wanted: bool,
        size: usize,
    ) {
        let message = if stream_wanted {
            "the provider answered a stream request without a stream"
        } else {
            "the provider answered 2xx with a body that is not a JSON object"
        };
        let failure = Failure::local(ErrorClass::Transient, status, message);
        self.fail(host, failure, size);
    }

    /// A success that goes to the client as it came, the lane's key redacted from it.
    fn pass_as_it_came(&mut self, host: &mut impl Host, body: &[u8], size: usize, status: u16) {
        if let Some(clean) = self
            .lane
            .as_ref()
            .and_then(|l| redact_bytes(body, &l.secret))
        {
            host.set_body(Side::Response, 0, size, &clean);
            host.set_header(Side::Response, "content-length", None);
        }
        self.succeed_headers(host);
        self.report(host, None, status);
        self.mode = Mode::Through;
    }

    /// A failed answer (a status that is no success, or an `error` in a 2xx) classified.
    fn judge_failure(
        &mut self,
        host: &mut impl Host,
        status: u16,
        headers: &[(String, String)],
        body: &[u8],
        size: usize,
        now: i64,
    ) {
        let Some(lane) = &self.lane else { return };
        let mut failure = classify_in(
            lane.kind.text(),
            lane.daily_reset,
            status,
            headers,
            body,
            now,
        );
        // Envoy's own answers (connection refused, reset before headers) carry no provider body.
        let text = String::from_utf8_lossy(body);
        if status == 503
            && (text.starts_with("upstream connect error")
                || text.starts_with("no healthy upstream"))
        {
            failure.class = ErrorClass::Network;
        }
        self.fail(host, failure, size);
    }
}

#[cfg(test)]
#[path = "verdict_tests.rs"]
mod tests;
