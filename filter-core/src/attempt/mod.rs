//! The attempt stage: once per attempt, on the internal listener (with `gateway.onePass`, a
//! call's first attempt runs it as the public route's upstream filter instead: [`first`]).
//! Picks the lane, sends the request to its provider, and judges the answer. A state machine over [`Host`]: waits (a
//! backoff, a lane that returns) and the probe lease are pending states resumed by the
//! callback that answers them.

mod chunk;
pub mod first;
mod hold;
#[cfg(test)]
mod plan_tests;
mod prepare;
mod report;
mod request;
mod respond;
mod send;
pub mod stream;
#[cfg(test)]
mod testkit;
mod verdict;
mod whole;

use std::rc::Rc;

use ai_router_proto::v1::ProviderKind;
use serde_json::Value;

use crate::answer::redact::StreamRedactor;
use crate::attempt::stream::Gate;
use crate::classify::failure::Failure;
use crate::host::{Flow, Host, Side};
use crate::lanes::{self};
use crate::plan::{Plan, Written, PLAN_HEADER};
use crate::protocols::anthropic::stream::StreamTranslator;
use crate::protocols::Egress;
use crate::vm::local::Send;
use crate::vocab::{LaneId, Usage};
use crate::wire::sse::Parser;

/// How the answer is being handled.
#[derive(Default)]
enum Mode {
    /// Not yet known (request phase).
    #[default]
    Pending,
    /// A unary answer or an error: buffered whole, judged at the end.
    Whole {
        status: u16,
        headers: Vec<(String, String)>,
    },
    /// A stream: held until the first token. Anthropic events are translated to OpenAI chunks
    /// first.
    Stream(Streaming),
    /// Passed through untouched (after the verdict, at the end of the answer).
    Through,
    /// The answer was replaced by the gateway's verdict: whatever the provider still sends is
    /// dropped, never passed on raw.
    Drained,
}

/// A stream as it passes: held until the first token, then forwarded.
struct Streaming {
    gate: Box<Gate>,
    upstream: Option<Box<Translate>>,
    /// Chat chunks to the caller's protocol (Messages, Responses), after the gate.
    egress: Option<Box<Egress>>,
    /// The lane's key redacted from the gate's events, across the deltas a client joins.
    redactor: Box<StreamRedactor>,
    /// The bytes of the held answer already read (Envoy buffers it whole while it is held).
    seen: usize,
}

impl Streaming {
    /// Chat chunks as the caller's events: every byte for the client passes here.
    fn for_caller(&mut self, bytes: Vec<u8>) -> Vec<u8> {
        match self.egress.as_mut() {
            Some(e) => e.encode(&bytes),
            None => bytes,
        }
    }
}

/// The Anthropic stream, parsed and translated into OpenAI chunk bytes.
struct Translate {
    parser: Parser,
    translator: StreamTranslator,
}

impl Translate {
    /// The OpenAI bytes of the events received, and the failure that ended them, if one did
    /// (what came before it in the same read is kept: it may hold the first token).
    fn feed(&mut self, bytes: &[u8], now_ms: i64) -> (Vec<u8>, Option<Failure>) {
        let mut out = Vec::new();
        for event in self.parser.feed(bytes) {
            match self.translator.feed(&event, now_ms) {
                Ok(chunk) => out.extend(chunk),
                Err(failure) => return (out, Some(failure)),
            }
        }
        let overflow = self
            .parser
            .overflowed()
            .then(crate::attempt::stream::overlong_event);
        (out, overflow)
    }
}

struct Lane {
    id: LaneId,
    kind: ProviderKind,
    /// The lane speaks the caller's protocol: its answer goes back as it comes.
    native: bool,
    secret: String,
    fingerprint: u64,
    /// The provider's facts its answers are read with.
    daily_reset: Option<ai_router_contract::kinds::DailyReset>,
    rate_limit_windows: (
        ai_router_contract::kinds::RateLimitWindow,
        ai_router_contract::kinds::RateLimitWindow,
    ),
    /// The prompt tokens the lane takes ([`crate::protocols::context::lane_capacity`]).
    capacity: Option<u64>,
}

/// Where this attempt stage runs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// The attempt listener: every attempt in two passes, the retries in one.
    #[default]
    Listener,
    /// The one-pass aggregate's upstream filter, before it knows which attempt it sees.
    Upstream,
    /// The upstream filter on the call's first attempt: the lane the front stage reserved.
    First,
    /// The upstream filter on a retry (to the attempt listener): the client's headers put
    /// back, then out of the way.
    Aside,
}

#[derive(Default)]
pub struct Attempt {
    position: Position,
    plan: Option<Rc<Plan>>,
    attempt: u32,
    lane: Option<Lane>,
    mode: Mode,
    reported: bool,
    /// The request body, kept while the attempt waits or asks for a lease, and until the
    /// answer is judged (shared with the call's bookkeeping when the front read it).
    body: Rc<Vec<u8>>,
    /// Responses: the caller's body, which the translated answer echoes.
    request: Value,
    /// Before the send: the waits, the probe leases and the lanes passed over.
    waits: Waits,
    /// What the send decided, read while the answer is judged and reported.
    sent: Sent,
    /// What the answer has told so far.
    answer: Answered,
    /// The attempt's own timeout.
    bound: Bound,
}

#[derive(Default)]
struct Waits {
    /// An asynchronous step in progress.
    pending: Pending,
    /// Lanes this attempt may not use (probe leases held elsewhere).
    excluded: Vec<LaneId>,
    /// The state version `excluded` was decided on.
    excluded_in_version: u64,
    /// Reservations lost to another worker in a row (each sends the pick round again).
    reservations_lost: u32,
}

#[derive(Default)]
struct Sent {
    /// When the request went to the provider (the reservation's instant).
    started_ms: i64,
    /// When the attempt let the request go to the provider (µs), until its time there is
    /// added to the call's ([`Attempt::close_upstream`]).
    sent_us: Option<i64>,
    /// What the attempt reserved of its billing scope's headroom (provider, send): given back
    /// if it never reached the provider.
    reserved: Option<(String, Send)>,
    /// This attempt holds a half-open breaker's probe lease.
    probe: bool,
    /// `gateway.forwardRateLimitHeaders` of the state the attempt was sent with.
    forward_rate_limits: bool,
    /// Embeddings: the vector length the lane's model declares.
    dimensions: Option<usize>,
    /// Responses: the id of a stored answer, read as it passes (`response_pins`).
    stored_id: crate::lanes::response_pins::Watch,
    /// With `telemetry.includeContent` (of the state the attempt was sent with): the request
    /// and the answer so far, for the report.
    content: Option<crate::answer::content::Content>,
}

#[derive(Default)]
struct Answered {
    /// The client has the answer's first token: the answer is the client's from here.
    after_first_token: bool,
    first_byte_ms: Option<i64>,
    /// While the provider holds the attempt: when the bytes of the latest response callback
    /// arrived (µs).
    arrived_us: Option<i64>,
    /// The provider's answer ended with its headers.
    headers_only: bool,
    usage: Option<Usage>,
    /// Estimated tokens of the answer's generated text: counted when no usage comes.
    answer_tokens: u64,
    /// x-ratelimit-remaining-requests, -tokens and the reset time the provider reported.
    headroom: Option<(i64, i64, i64)>,
}

#[derive(Default)]
struct Bound {
    /// The attempt's own bound (the policy's `timeoutMs`, from the moment the request went to
    /// the provider, so no wait before it counts): the first token (a unary answer: the whole
    /// answer) is due by then; after the first token, the next chunk is. The host checks it
    /// every [`BOUND_TICK_MS`] ([`Attempt::bound_due`], then [`Attempt::on_bound`]).
    bound_ms: Option<i64>,
    /// The attempt answered in its own name (it timed out before its answer started): what
    /// comes back through the stage is that answer.
    answered_locally: bool,
    /// A retry of a one-pass call: the policy's `timeoutMs` from the attempt's start, waits
    /// included (the router's per-try timeout cuts it two ticks later).
    per_try_until: Option<i64>,
}

/// What the attempt waits for.
#[derive(Default)]
enum Pending {
    #[default]
    Nothing,
    /// A timer (backoff, a lane returning).
    Wait(u32),
    /// The probe lease for this lane.
    Lease(u32, Box<lanes::pick::Chosen>, lanes::pick::Probe),
}

const TIMER_CLUSTER: &str = ai_router_contract::clusters::TIMER;
/// The header the attempt route picks the provider cluster by (removed by the route).
const CLUSTER_HEADER: &str = ai_router_contract::headers::CLUSTER;

/// The longest a wait's timer runs: a wait further off is armed again when it fires. Envoy
/// does not cancel a context's HTTP calls when its stream ends, so a timer outlives an attempt
/// that ended while it waited by up to this long (holding a request on the timer cluster).
pub const TIMER_SLICE_MS: i64 = 1_000;

/// How often the host checks the bounds of the attempts in flight (the attempt role's root
/// context ticks): an attempt's timeout is noticed at most this late. A tick costs nothing
/// per attempt but a comparison; a timer per attempt would hold a request on the timer
/// cluster for as long as its attempt.
pub const BOUND_TICK_MS: u64 = 100;

/// The router's per-try timeout on a one-pass call (`x-envoy-upstream-rq-per-try-timeout-ms`):
/// two of the attempt stage's ticks past `timeoutMs`. Each attempt's own bound is at
/// [`own_bound`], so an attempt through the attempt listener gives its own verdict (and reports
/// the lane's timeout) before the router cuts it; a first attempt, which has no bound of its
/// own before its first token, is cut by the router up to that much late.
pub fn router_per_try_ms(timeout_ms: u64) -> u64 {
    timeout_ms.saturating_add(2 * BOUND_TICK_MS)
}

/// When an attempt of a one-pass call started at `started_ms` has had its `timeoutMs`, waits
/// included (the router's per-try timer runs from the attempt's start).
pub fn own_bound(started_ms: i64, timeout_ms: u64) -> i64 {
    started_ms.saturating_add(i64::try_from(timeout_ms).unwrap_or(i64::MAX))
}

/// Asks the timer listener for an answer at `at`, or in [`TIMER_SLICE_MS`] if that is sooner
/// (its fault filter delays it by `x-envoy-fault-delay-request` ms); the answer comes back
/// with the returned token, and the wait is decided again.
pub(crate) fn timer(host: &mut impl Host, at: i64) -> Result<u32, crate::host::Refused> {
    let ms = (at - host.now_ms()).clamp(1, TIMER_SLICE_MS);
    let delay = ms.to_string();
    let headers = vec![
        (":method", "GET"),
        (":path", "/wait"),
        (":authority", "ai-router-timer"),
        ("x-envoy-fault-delay-request", delay.as_str()),
    ];
    host.dispatch_http_call(TIMER_CLUSTER, &headers, ms as u64 + 5_000)
}

/// Whether Envoy's reason for the end of the stream (`response.code_details`) is that the
/// client went away before its answer ended: a cancelled call, never an upstream error.
pub fn client_went_away(details: &[u8]) -> bool {
    details.starts_with(b"downstream_remote_disconnect")
}

impl Attempt {
    fn cid(&self) -> &str {
        self.plan.as_ref().map(|p| p.cid.as_str()).unwrap_or("")
    }

    /// The stage as the one-pass aggregate's upstream filter (role `first`).
    pub fn upstream() -> Self {
        Self {
            position: Position::Upstream,
            ..Self::default()
        }
    }

    pub fn on_request_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        self.sent.started_ms = host.now_ms();
        self.attempt = host
            .header_text(Side::Request, "x-envoy-attempt-count")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        if self.position == Position::Upstream {
            if self.attempt > 1 {
                self.position = Position::Aside;
                self.put_back(host);
                return Flow::Continue;
            }
            self.position = Position::First;
        }
        self.plan = host
            .header_text(Side::Request, PLAN_HEADER)
            .and_then(|text| {
                Written::read(&text, |cid| {
                    host.with_call(cid, |c| c.plan.clone()).flatten()
                })
            });
        if self.plan.is_none() {
            return self.give_up(host, None, None);
        }
        if self.position == Position::Listener {
            // One pass: the router's per-try timeout cuts this attempt, waits included; the
            // stage's own bound comes first, so the lane's timeout is reported
            // ([`router_per_try_ms`], [`own_bound`]).
            let cid = self.cid().to_owned();
            if host.with_call(&cid, |c| c.one_pass) == Some(true) {
                let timeout = self.plan.as_ref().map_or(0, |p| p.timeout_ms);
                self.bound.per_try_until = Some(own_bound(self.sent.started_ms, timeout));
            }
        }
        if end_of_stream {
            return self.begin(host);
        }
        Flow::Pause
    }

    /// The request is whole: pick a lane (or, first in one pass, take the front's).
    fn begin(&mut self, host: &mut impl Host) -> Flow {
        match self.position {
            Position::First => self.send_first(host),
            _ => self.prepare(host),
        }
    }

    pub fn on_request_body(
        &mut self,
        host: &mut impl Host,
        size: usize,
        end_of_stream: bool,
    ) -> Flow {
        if !end_of_stream {
            return Flow::Pause;
        }
        if self.lane.is_some() || self.position == Position::Aside {
            return Flow::Continue;
        }
        // The front stage's copy when it is this very body (the buffer holds what the front
        // read); else the buffer's.
        let cid = self.cid().to_owned();
        self.body = host
            .with_call(&cid, |c| c.body.clone())
            .flatten()
            .filter(|b| b.len() == size)
            .unwrap_or_else(|| Rc::new(host.body(Side::Request, 0, size)));
        self.begin(host)
    }
}
