//! The answer as it passes: headers filtered, a stream held until its first token and
//! translated to the caller's protocol, the lane's headers on a success.

use ai_router_proto::v1::ProviderKind;
use serde_json::Value;

use crate::answer::redact::redact_bytes;
use crate::answer::redact::StreamRedactor;
use crate::attempt::stream::{Gate, Step};
use crate::classify::failure::Failure;
use crate::host::{Flow, Host, Side};
use crate::plan::{Candidate, Protocol};
use crate::protocols::anthropic::stream::StreamTranslator;
use crate::protocols::Egress;
use crate::vocab::LaneId;
use crate::wire::headers;
use crate::wire::sse::Parser;
use ai_router_contract::error_code::ErrorCode;
use ai_router_contract::failure::ErrorClass;
use ai_router_contract::headers::{
    ATTEMPT as H_ATTEMPT, LANE_COST as H_LANE_COST, LANE_MODEL as H_LANE_MODEL,
};

use super::{Attempt, Mode, Streaming, Translate};

impl Attempt {
    pub fn on_response_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        self.note_arrival(host);
        if self.bound.answered_locally {
            // The stage's own answer, on its way back.
            return Flow::Continue;
        }
        let Some(lane) = &self.lane else {
            return Flow::Continue;
        };
        // Listed first: `:status` is then read from the listing (one host call, not two).
        let listed = host.headers(Side::Response);
        let status: u16 = host
            .header_text(Side::Response, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(502);
        // The provider's headers: internal names it sends are dropped before anything reads
        // them, and only the allowlisted ones reach the client (its key redacted).
        let rate_limits = self.sent.forward_rate_limits;
        let mut headers: Vec<(String, String)> = Vec::new();
        for (name, value) in listed {
            if headers::is_internal(&name) {
                host.set_header(Side::Response, &name, None);
                continue;
            }
            if !headers::forwarded_to_client(&name, rate_limits) {
                host.set_header(Side::Response, &name, None);
            } else if let Some(clean) = redact_bytes(&value, &lane.secret) {
                host.set_header_bytes(Side::Response, &name, &clean);
            }
            if let Ok(text) = String::from_utf8(value) {
                headers.push((name, text));
            }
        }
        let windows = self.lane.as_ref().map_or(
            (
                ai_router_contract::kinds::RateLimitWindow::Minute,
                ai_router_contract::kinds::RateLimitWindow::Minute,
            ),
            |l| l.rate_limit_windows,
        );
        self.answer.headroom = Some(crate::classify::headroom::headroom_in(
            &headers,
            windows,
            host.now_ms(),
        ));
        let is_sse = headers.iter().any(|(k, v)| {
            k == "content-type" && v.to_ascii_lowercase().contains("text/event-stream")
        });
        let stream = self.plan.as_ref().is_some_and(|p| p.stream);
        if (200..300).contains(&status) && stream && is_sse {
            let include_usage = self.plan.as_ref().is_some_and(|p| p.include_usage);
            let protocol = self.plan.as_ref().map_or(Protocol::Chat, |p| p.protocol);
            let json_array = self.plan.as_ref().is_some_and(|p| p.json_array);
            let now_s = host.now_ms() / 1000;
            self.mode = if lane.native {
                Mode::Stream(Streaming {
                    gate: Box::new(
                        Gate::native(lane.kind.text(), protocol).with_daily_reset(lane.daily_reset),
                    ),
                    upstream: None,
                    egress: None,
                    redactor: Box::new(StreamRedactor::new(&lane.secret, protocol)),
                    seen: 0,
                })
            } else {
                let upstream = (lane.kind == ProviderKind::Anthropic).then(|| {
                    Box::new(Translate {
                        parser: Parser::new(),
                        translator: StreamTranslator::new(now_s, lane.daily_reset),
                    })
                });
                // The usage chunk states the answer's real cost (`usage.cost`): the headers
                // went out before it was known.
                let price = host.state().and_then(|s| {
                    crate::lanes::cost::price_of(&s, &lane.id.provider, &lane.id.model)
                });
                Mode::Stream(Streaming {
                    gate: Box::new(
                        Gate::new(lane.kind.text(), include_usage)
                            .with_price(price)
                            .with_daily_reset(lane.daily_reset),
                    ),
                    upstream,
                    egress: Egress::new(protocol, &self.request, now_s, json_array).map(Box::new),
                    redactor: Box::new(StreamRedactor::new(&lane.secret, Protocol::Chat)),
                    seen: 0,
                })
            };
            // The stream is rewritten as it passes (the usage event the gateway asked for is
            // dropped, an Anthropic stream translated, an error event added): a provider's
            // length would promise the client bytes it never gets.
            host.set_header(Side::Response, "content-length", None);
            if json_array {
                // Gemini's stream without `alt=sse` is one JSON array.
                host.set_header(Side::Response, "content-type", Some("application/json"));
            }
        } else {
            self.mode = Mode::Whole { status, headers };
        }
        if end_of_stream {
            // No body at all.
            self.answer.headers_only = true;
            self.judge_whole(host, &[], 0);
            return Flow::Continue;
        }
        Flow::Pause
    }

    pub fn on_response_body(
        &mut self,
        host: &mut impl Host,
        size: usize,
        end_of_stream: bool,
    ) -> Flow {
        self.note_arrival(host);
        match std::mem::take(&mut self.mode) {
            Mode::Pending | Mode::Through => {
                self.mode = Mode::Through;
                Flow::Continue
            }
            Mode::Drained => {
                host.set_body(Side::Response, 0, size, &[]);
                self.mode = Mode::Drained;
                Flow::Continue
            }
            Mode::Whole { status, headers } => {
                self.mode = Mode::Whole { status, headers };
                if !end_of_stream {
                    return Flow::Pause;
                }
                let body = host.body(Side::Response, 0, size);
                if let Some(content) = self.sent.content.as_mut() {
                    content.answer(&body);
                }
                self.judge_whole(host, &body, size);
                Flow::Continue
            }
            Mode::Stream(stream) => self.stream_body(host, size, end_of_stream, stream),
        }
    }

    /// A stream's body as it comes: held until the first token, then forwarded in the caller's
    /// protocol; judged when it fails or ends.
    fn stream_body(
        &mut self,
        host: &mut impl Host,
        size: usize,
        end_of_stream: bool,
        mut s: Streaming,
    ) -> Flow {
        let now = host.now_ms();
        // While held, Envoy buffers: `size` is everything so far and `seen` what was read.
        let buffered = !s.gate.released();
        let read = if buffered {
            host.body(Side::Response, s.seen, size.saturating_sub(s.seen))
        } else {
            host.body(Side::Response, 0, size)
        };
        if let Some(content) = self.sent.content.as_mut() {
            content.answer(&read);
        }
        self.sent.stored_id.stream(&read);
        let (translated, upstream_failure) = match s.upstream.as_mut() {
            None => (None, None),
            Some(t) => {
                let (bytes, failure) = t.feed(&read, now);
                (Some(bytes), failure)
            }
        };
        let new = translated.as_deref().unwrap_or(&read);
        // The bytes that take the place of this callback's body.
        let mut out: Option<Vec<u8>> = None;
        let chunks_before = s.gate.chunks();
        let step = s.gate.feed(new, now);
        if s.gate.released() && s.gate.chunks() > chunks_before {
            // A chunk after the first token (or the first token itself): the next one is due
            // within timeoutMs of it, unless the answer is complete ([DONE]).
            let timeout = self.plan.as_ref().map_or(0, |p| p.timeout_ms);
            self.bound.bound_ms = (!s.gate.completed()).then(|| now.saturating_add(timeout as i64));
        }
        match step {
            Step::Hold => {}
            Step::Release(bytes) => {
                self.answer.after_first_token = true;
                self.succeed_headers(host);
                out = Some(s.redactor.feed_passed(bytes));
            }
            Step::Forward(bytes) => out = Some(s.redactor.feed_passed(bytes)),
            Step::Fail(failure) => {
                self.fail(host, failure, size);
                return Flow::Continue;
            }
        }
        if let Some(failure) = s.gate.failed_after_first_token().cloned() {
            let failure = failure.unless_echoed(&self.body);
            // The client got the error event in `out`; the attempt failed.
            let mut bytes = out.unwrap_or_default();
            bytes.extend(s.redactor.finish());
            let bytes = s.for_caller(bytes);
            host.set_body(Side::Response, 0, size, &bytes);
            self.answer.usage = s.gate.usage;
            self.answer.answer_tokens = s.gate.answer_tokens;
            self.report(host, Some(&failure), 200);
            self.mode = Mode::Drained;
            return Flow::Continue;
        }
        if let Some(failure) = upstream_failure {
            self.upstream_failed(host, size, s, out, failure);
            return Flow::Continue;
        }
        if !end_of_stream {
            if let Some(bytes) = out {
                let bytes = s.for_caller(bytes);
                // Released before this callback, Envoy's buffer is this callback's bytes: a
                // chunk that goes on as it came (its events whole, nothing dropped, added or
                // held back) is left there.
                if buffered || bytes != read {
                    host.set_body(Side::Response, 0, size, &bytes);
                }
            }
            let held = !s.gate.released();
            s.seen = size;
            self.mode = Mode::Stream(s);
            return if held { Flow::Pause } else { Flow::Continue };
        }
        self.end_stream(host, size, s, out);
        Flow::Continue
    }

    /// The translated provider stream failed: before the first token the attempt fails over
    /// (the client saw nothing); after it, what arrived goes on and an error event ends it.
    fn upstream_failed(
        &mut self,
        host: &mut impl Host,
        size: usize,
        mut s: Streaming,
        out: Option<Vec<u8>>,
        failure: Failure,
    ) {
        if !s.gate.released() {
            self.fail(host, failure, size);
            return;
        }
        let failure = failure.unless_echoed(&self.body);
        let end = crate::attempt::stream::error_event(
            &format!(
                "The provider's stream failed after the answer had started: {}",
                failure.message
            ),
            ErrorCode::StreamInterrupted,
        );
        let mut bytes = out.unwrap_or_default();
        bytes.extend(s.redactor.feed(&end));
        bytes.extend(s.redactor.finish());
        let bytes = s.for_caller(bytes);
        host.set_body(Side::Response, 0, size, &bytes);
        self.report(host, Some(&failure), 200);
        self.mode = Mode::Drained;
    }

    /// The provider's stream ended: its tail goes on, and the attempt is judged (a stream
    /// without its end broke off).
    fn end_stream(
        &mut self,
        host: &mut impl Host,
        size: usize,
        mut s: Streaming,
        out: Option<Vec<u8>>,
    ) {
        match s.gate.finish() {
            Ok(tail) => {
                if !self.answer.after_first_token {
                    self.answer.after_first_token = s.gate.released();
                    self.succeed_headers(host);
                }
                let mut bytes = out.unwrap_or_default();
                bytes.extend(s.redactor.feed(&tail));
                bytes.extend(s.redactor.finish());
                let bytes = s.for_caller(bytes);
                host.set_body(Side::Response, 0, size, &bytes);
                self.answer.usage = s.gate.usage;
                self.answer.answer_tokens = s.gate.answer_tokens;
                let failure = (!s.gate.completed()).then(|| {
                    Failure::local(
                        ErrorClass::Stream,
                        200,
                        "the stream broke off after the first token",
                    )
                });
                self.report(host, failure.as_ref(), 200);
            }
            Err(failure) => self.fail(host, failure, size),
        }
        self.mode = Mode::Through;
    }

    /// A whole answer (in the caller's protocol) to a call that asked for a stream: the client
    /// gets the stream it asked for, the answer's events in its protocol (chat: the usage
    /// chunk only when asked for), and the attempt succeeded with the answer's usage.
    pub(super) fn answer_as_stream(
        &mut self,
        host: &mut impl Host,
        size: usize,
        protocol: Protocol,
        mut answer: Value,
        status: u16,
    ) {
        let include_usage = self.plan.as_ref().is_some_and(|p| p.include_usage);
        if protocol == Protocol::Chat && !include_usage {
            if let Some(map) = answer.as_object_mut() {
                map.remove("usage");
            }
        }
        let json_array = self.plan.as_ref().is_some_and(|p| p.json_array);
        let bytes = self.scrub(match protocol {
            Protocol::Gemini => crate::protocols::gemini::response::replay(&answer, json_array),
            _ => crate::cache::shapes::replay_sse(protocol, &answer),
        });
        host.set_body(Side::Response, 0, size, &bytes);
        host.set_header(Side::Response, "content-length", None);
        let content_type = match json_array {
            true => "application/json",
            false => "text/event-stream",
        };
        host.set_header(Side::Response, "content-type", Some(content_type));
        self.answer.after_first_token = true;
        self.succeed_headers(host);
        self.report(host, None, status);
        self.mode = Mode::Through;
    }

    /// `bytes` with the lane's secret redacted: every byte a client receives from a provider
    /// passes through here (providers echo keys in error messages).
    pub(super) fn scrub(&self, bytes: Vec<u8>) -> Vec<u8> {
        match &self.lane {
            Some(lane) => redact_bytes(&bytes, &lane.secret).unwrap_or(bytes),
            None => bytes,
        }
    }

    pub(super) fn succeed_headers(&mut self, host: &mut impl Host) {
        if self.answer.first_byte_ms.is_none() {
            self.answer.first_byte_ms = Some(host.now_ms());
        }
        // The answer goes to the client from here: the provider's part in its first byte ends
        // with the bytes that let it go.
        self.close_upstream(host);
        host.set_header(Side::Response, H_ATTEMPT, Some(&self.attempt.to_string()));
        if let Some(lane) = &self.lane {
            host.set_header(Side::Response, H_LANE_MODEL, Some(&lane.id.model));
            host.set_header(
                Side::Response,
                ai_router_contract::headers::LANE_PROVIDER,
                Some(&lane.id.provider),
            );
            let cost = self.answer_cost(host, &lane.id);
            host.set_header(
                Side::Response,
                H_LANE_COST,
                Some(&crate::lanes::cost::header_value(cost)),
            );
        }
        if let (Some(plan), Some(lane)) = (&self.plan, &self.lane) {
            if plan.trail {
                // The trail so far, and this attempt, which answers.
                let mut trail = host
                    .with_call(&plan.cid, |c| c.trail.clone())
                    .unwrap_or_default();
                trail.attempt(crate::answer::trail::AttemptNote {
                    attempt: self.attempt,
                    provider: lane.id.provider.clone(),
                    key: lane.id.key.clone(),
                    model: lane.id.model.clone(),
                    class: None,
                    status: host
                        .header_text(Side::Response, ":status")
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(200),
                });
                host.set_header(
                    Side::Response,
                    ai_router_contract::headers::LANE_TRAIL,
                    Some(&trail.header_value()),
                );
            }
        }
    }

    /// The answer's cost on its lane: its usage when the provider reported it (a whole
    /// answer), else the request's estimate (a stream, whose usage comes at its end); 0 for
    /// an unpriced model.
    pub(super) fn answer_cost(&self, host: &impl Host, lane: &LaneId) -> f64 {
        let (Some(state), Some(plan)) = (host.state(), self.plan.as_ref()) else {
            return 0.0;
        };
        let Some(price) = crate::lanes::cost::price_of(&state, &lane.provider, &lane.model) else {
            return 0.0;
        };
        match self.answer.usage {
            Some(u) => crate::lanes::cost::of_usage(&price, &u),
            None => {
                let needs = crate::vocab::Needs {
                    prompt_tokens: plan.prompt_tokens,
                    max_tokens: plan.max_tokens,
                    ..Default::default()
                };
                let candidate = Candidate {
                    provider: lane.provider.clone(),
                    model: lane.model.clone(),
                    weight: 1.0,
                    when: Vec::new(),
                };
                crate::lanes::cost::estimate(&state, &candidate, &needs).unwrap_or(0.0)
            }
        }
    }
}

#[cfg(test)]
#[path = "respond_tests.rs"]
mod tests;
