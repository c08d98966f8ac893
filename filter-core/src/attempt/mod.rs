//! The attempt stage: once per attempt, on the internal listener. Picks the lane, sends the
//! request to its provider, and judges the answer. A state machine over [`Host`]: waits (a
//! backoff, a lane that returns) and the probe lease are pending states resumed by the
//! callback that answers them.

pub mod stream;

use ai_router_proto::names::sync;
use ai_router_proto::v1::{
    AttemptOutcome, AttemptResult, ErrorClass as ProtoClass, LeaseReply, LeaseRequest,
    ProviderKind, Usage as ProtoUsage, UsageSource,
};
use prost::Message;
use serde_json::Value;

use crate::answer::errors::{
    final_error, unsent_as_unavailable, upstream_invalid_request, ErrorCode, GatewayError,
};
use crate::answer::redact::StreamRedactor;
use crate::answer::redact::{redact, redact_bytes};
use crate::attempt::stream::{Gate, Step};
use crate::classify::{classify_in, Class, Failure, Hold};
use crate::host::{Flow, Host, Side};
use crate::lanes::embeddings;
use crate::lanes::{self, Pick};
use crate::plan::{Candidate, Operation, Plan, Protocol, PLAN_HEADER};
use crate::protocols::anthropic::{self, StreamTranslator, ANTHROPIC_VERSION};
use crate::protocols::messages::Fidelity;
use crate::protocols::{self, Egress};
use crate::sync::state::State;
use crate::vm::local::Send;
use crate::vocab::{usage_of, LaneId, Usage};
use crate::wire::headers;
use crate::wire::sse::Parser;
use ai_router_contract::headers::{
    ATTEMPT as H_ATTEMPT, FINAL_STATUS as H_FINAL_STATUS, LANE_COST as H_LANE_COST,
    LANE_MODEL as H_LANE_MODEL, RETRY as H_RETRY, RETRY_AFTER as H_RETRY_AFTER,
};

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
    Stream {
        gate: Box<Gate>,
        upstream: Option<Box<Translate>>,
        /// Chat chunks to the caller's protocol (Messages, Responses), after the gate.
        egress: Option<Box<Egress>>,
        /// The lane's key redacted from the gate's events, across the deltas a client joins.
        redactor: Box<StreamRedactor>,
        seen: usize,
    },
    /// Passed through untouched (after the verdict, at the end of the answer).
    Through,
    /// The answer was replaced by the gateway's verdict: whatever the provider still sends is
    /// dropped, never passed on raw.
    Drained,
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

#[derive(Default)]
pub struct Attempt {
    plan: Option<Plan>,
    attempt: u32,
    lane: Option<Lane>,
    started_ms: i64,
    mode: Mode,
    reported: bool,
    after_first_token: bool,
    usage: Option<Usage>,
    /// Estimated tokens of the answer's generated text: counted when no usage comes.
    answer_tokens: u64,
    /// Embeddings: the vector length the lane's model declares.
    dimensions: Option<usize>,
    /// x-ratelimit-remaining-requests, -tokens and the reset time the provider reported.
    headroom: Option<(i64, i64, i64)>,
    /// The request body, kept while the attempt waits or asks for a lease.
    body: Vec<u8>,
    /// Responses: the caller's body, which the translated answer echoes.
    request: Value,
    /// Lanes this attempt may not use (probe leases held elsewhere).
    excluded: Vec<LaneId>,
    /// The state version `excluded` was decided on.
    excluded_in_version: u64,
    /// An asynchronous step in progress.
    pending: Pending,
    /// This attempt holds a half-open breaker's probe lease.
    probe: bool,
    first_byte_ms: Option<i64>,
    /// The provider's answer ended with its headers.
    headers_only: bool,
    /// `gateway.forwardRateLimitHeaders` of the state the attempt was sent with.
    forward_rate_limits: bool,
    /// With `telemetry.includeContent` (of the state the attempt was sent with): the request
    /// and the answer so far, for the report.
    content: Option<crate::answer::content::Content>,
    /// The attempt's own bound (the policy's `timeoutMs`, from the moment the request went to
    /// the provider, so no wait before it counts): the first token (a unary answer: the whole
    /// answer) is due by then; after the first token, the next chunk is. The host checks it
    /// every [`BOUND_TICK_MS`] ([`Attempt::bound_due`], then [`Attempt::on_bound`]).
    bound_ms: Option<i64>,
    /// The attempt answered in its own name (it timed out before its answer started): what
    /// comes back through the stage is that answer.
    answered_locally: bool,
    /// What the attempt reserved of its billing scope's headroom (provider, send): given back
    /// if it never reached the provider.
    reserved: Option<(String, Send)>,
    /// Reservations lost to another worker in a row (each sends the pick round again).
    reservations_lost: u32,
    /// Responses: the id of a stored answer, read as it passes (`response_pins`).
    stored_id: crate::lanes::response_pins::Watch,
}

/// After this many reservations lost in a row, the attempt takes the lane's rate limit as
/// reached (the other workers keep sending; this one stops racing them).
const MAX_RESERVATIONS_LOST: u32 = 8;

/// A failed attempt's answer on the hop back to the outer router.
struct Verdict {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Verdict {
    fn header_pairs(&self) -> Vec<(&str, &str)> {
        self.headers.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }
}

/// What the attempt waits for.
#[derive(Default)]
enum Pending {
    #[default]
    Nothing,
    /// A timer (backoff, a lane returning).
    Wait(u32),
    /// The probe lease for this lane.
    Lease(u32, Box<lanes::Chosen>, lanes::Probe),
}

/// Picks an attempt makes at most after losing the claim of a parked lane's probe to another
/// call (each loss means one more lane is passed over, so more are rare).
const SNAP_CLAIM_PICKS: usize = 4;

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

    /// Answers from this stage (no lane): the final error, not retried.
    fn give_up(
        &mut self,
        host: &mut impl Host,
        class: Option<Class>,
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
    fn answer_final(&mut self, host: &mut impl Host, sent: u32, err: GatewayError) -> Flow {
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
    fn prepare(&mut self, host: &mut impl Host) -> Flow {
        let Some(plan) = self.plan.clone() else {
            return self.give_up(host, None, None);
        };
        let Some(state) = host.state() else {
            return self.give_up(host, None, None);
        };
        let now = host.now_ms();
        let deadline = plan.started_ms.saturating_add(plan.deadline_ms as i64);
        if now >= deadline {
            return self.give_up(host, Some(Class::Deadline), None);
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
        // An embeddings call never leaves the vector space of its first lane.
        let tiers = match &identity {
            Some(identity) => embeddings::same_identity(&state, &plan.tiers, identity),
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
        let request = lanes::Request {
            tried: &tried,
            excluded: &self.excluded,
            tokens: plan.tokens,
            random: host.random_unit(),
            pinned: pinned.as_ref(),
            only_key: plan.responses.as_ref().and_then(|r| r.pin.as_ref()),
            last_failure,
            reset_interval_ms: plan.reset_ms,
            larger_than,
        };
        let mut skipped = Vec::new();
        let mut pick = host.with_lanes(|view, rr| {
            lanes::pick(&state, &tiers, request, view, rr, now, &mut skipped)
        });
        // Snap-back: a parked lane whose probe is due goes to the one call (of every worker)
        // that claims the probe; a call that loses the claim chooses again, passing over it.
        for _ in 0..SNAP_CLAIM_PICKS {
            let lost = matches!(&pick, Pick::Lane(c) if c.snap_probe
                && !crate::lanes::park::claim_probe(host, &c.lane, now, plan.reset_ms));
            if !lost {
                break;
            }
            skipped.clear();
            pick = host.with_lanes(|view, rr| {
                lanes::pick(&state, &tiers, request, view, rr, now, &mut skipped)
            });
        }
        if !skipped.is_empty() {
            host.with_call(&plan.cid, |c| {
                for s in &skipped {
                    c.trail.skip_lane(&s.lane, s.reason);
                }
            });
        }
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
    fn wait_until(&mut self, host: &mut impl Host, at: i64) -> Flow {
        match timer(host, at) {
            Ok(token) => {
                self.pending = Pending::Wait(token);
                Flow::Pause
            }
            Err(_) => self.give_up(host, None, Some(at)),
        }
    }

    /// Whether the attempt's bound has passed while it still waits for its answer (or, after
    /// the first token, for its next chunk): the host then calls [`Attempt::on_bound`].
    pub fn bound_due(&self, now_ms: i64) -> bool {
        self.bound_ms.is_some_and(|until| now_ms >= until)
            && !self.reported
            && !self.answered_locally
    }

    /// The attempt's bound passed: it timed out.
    pub fn on_bound(&mut self, host: &mut impl Host) {
        if !self.bound_due(host.now_ms()) {
            return;
        }
        let timeout = self.plan.as_ref().map_or(0, |p| p.timeout_ms);
        let what = if self.after_first_token {
            "the next chunk"
        } else if self.plan.as_ref().is_some_and(|p| p.stream) {
            "the first token"
        } else {
            "the answer"
        };
        let failure = Failure::local(
            Class::Timeout,
            0,
            format!("the provider sent {what} later than timeoutMs ({timeout} ms)"),
        );
        if self.after_first_token {
            // The stream is the client's: no callback is left in which to add an error event
            // (the provider is silent), so it is cut; the client sees it break off.
            if let Mode::Stream { gate, .. } = &self.mode {
                self.usage = gate.usage;
                self.answer_tokens = gate.answer_tokens;
            }
            self.report(host, Some(&failure), 200);
            self.mode = Mode::Drained;
            host.reset_stream();
        } else {
            self.fail_locally(host, failure);
        }
    }

    /// Asks the control plane for the half-open breaker's probe lease.
    fn ask_lease(
        &mut self,
        host: &mut impl Host,
        chosen: lanes::Chosen,
        probe: lanes::Probe,
    ) -> Flow {
        let request = LeaseRequest {
            scope: probe.scope.into(),
            provider: probe.provider.clone(),
            key: probe.key.clone(),
            holder: ai_router_contract::probe_holder(
                self.plan.as_ref().map(|p| p.rid.as_str()).unwrap_or(""),
                self.attempt,
            ),
            ttl_ms: self
                .plan
                .as_ref()
                .map(|p| p.timeout_ms)
                .unwrap_or(ai_router_contract::defaults::TIMEOUT_MS)
                .max(1_000),
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
                self.pending = Pending::Lease(t, Box::new(chosen), probe);
                Flow::Pause
            }
            Err(_) => {
                // No control plane to ask: leave the half-open lane alone for this attempt.
                self.exclude_probe(host, &probe);
                self.prepare(host)
            }
        }
    }

    fn exclude_probe(&mut self, host: &mut impl Host, probe: &lanes::Probe) {
        let Some(state) = host.state() else {
            return;
        };
        self.excluded_in_version = host.state_sequence();
        let Some((_, provider)) = state.provider(&probe.provider) else {
            return;
        };
        for key in &provider.keys {
            if probe.key.is_empty() || probe.key == key.alias {
                for m in &provider.models {
                    self.excluded
                        .push(LaneId::new(&provider.id, &key.alias, &m.id));
                }
            }
        }
    }

    /// Resumes the request after an asynchronous step decided.
    fn resume_with(&mut self, host: &mut impl Host, action: Flow) {
        if action == Flow::Continue {
            host.resume_request();
        }
    }

    /// Sends the attempt to `chosen`: the body and headers for its provider.
    fn send_to(&mut self, host: &mut impl Host, state: &State, chosen: lanes::Chosen) -> Flow {
        let Some(plan) = self.plan.clone() else {
            return self.give_up(host, None, None);
        };
        let client_body = std::mem::take(&mut self.body);
        let body = client_body.as_slice();
        // By identity, not by position: after a lease reply `state` may be a newer snapshot
        // than the one the lane was picked from. A lane that is gone is picked again.
        let Some((provider, key)) = lanes::lane_in(state, &chosen.lane) else {
            self.body = body.to_vec();
            return self.prepare(host);
        };
        // The pick read the scope's headroom; the reservation takes its share of it atomically
        // (another worker may have taken the last of it meanwhile: then pick again).
        let scope = crate::sync::state::scope_of(key).to_owned();
        let now = host.now_ms();
        let allowances: Vec<_> = lanes::allowances(&chosen.health, &scope, &chosen.lane.model, now)
            .into_iter()
            .map(|(a, _)| a)
            .collect();
        let send = Send {
            scope,
            model: chosen.lane.model.clone(),
            at_ms: now,
            tokens: plan.tokens,
        };
        if !host.reserve_send(&provider.id, send.clone(), &allowances) {
            self.body = body.to_vec();
            self.reservations_lost += 1;
            if self.reservations_lost > MAX_RESERVATIONS_LOST {
                return self.give_up(host, Some(Class::RateLimit), None);
            }
            return self.prepare(host);
        }
        self.reservations_lost = 0;
        self.reserved = Some((provider.id.clone(), send));

        // The body for this provider: its model id, usage asked for on streams.
        let mut value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let gemini = plan.protocol == Protocol::Gemini;
        let native = match gemini {
            true => crate::protocols::gemini_native::serves(provider.kind(), plan.json_array),
            false => protocols::native(plan.protocol, provider.kind()),
        };
        let embed = gemini && plan.op == Operation::Embeddings;
        if embed {
            // The answer's shape (one embedding or a batch) follows the caller's body.
            self.request = value.clone();
        }
        if gemini && !native {
            // The caller's Gemini body, translated for this lane as the front stage routed it.
            let translated = match embed {
                true => crate::protocols::gemini_embed::to_openai(&chosen.lane.model, &value),
                false => crate::protocols::gemini::to_chat_request(
                    &chosen.lane.model,
                    plan.stream,
                    &value,
                ),
            };
            value = match translated {
                Ok(v) => v,
                Err(e) => return self.refuse(host, e),
            };
        }
        self.stored_id = crate::lanes::response_pins::Watch::new(plan.responses.as_ref(), native);
        if plan.protocol == Protocol::Responses {
            self.request = value.clone();
        }
        if !native && !protocols::carries_chat(plan.protocol) {
            value = match protocols::chat_request(plan.protocol, &value, Fidelity::Strict) {
                Ok(v) => v,
                Err(e) => return self.refuse(host, e),
            };
        }
        if let Some(obj) = value.as_object_mut() {
            obj.insert("model".into(), Value::String(chosen.lane.model.clone()));
            if plan.stream && !native {
                let opts = obj
                    .entry("stream_options")
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Some(o) = opts.as_object_mut() {
                    o.insert("include_usage".into(), Value::Bool(true));
                }
            }
        }
        let anthropic = provider.kind() == ProviderKind::Anthropic;
        if anthropic && plan.op == Operation::Chat && !native {
            let max_tokens = if provider.default_max_tokens > 0 {
                provider.default_max_tokens
            } else {
                ai_router_contract::defaults::DEFAULT_MAX_TOKENS
            };
            value = match anthropic::to_messages_request(&value, &chosen.lane.model, max_tokens) {
                Ok(mut v) => {
                    crate::protocols::prompt_cache::mark_translated(
                        &value,
                        &mut v,
                        &plan.prompt_cache,
                    );
                    v
                }
                Err(e) => return self.refuse(host, e),
            };
        }
        if gemini && native {
            value = crate::protocols::gemini_native::request(&value, &chosen.lane.model);
        }
        let new_body = serde_json::to_vec(&value).unwrap_or_else(|_| body.to_vec());
        host.set_body(Side::Request, 0, body.len(), &new_body);
        host.set_header(Side::Request, "content-length", None);

        let api_path = if native && plan.count_tokens {
            "/messages/count_tokens"
        } else if native {
            protocols::native_path(plan.protocol)
        } else if anthropic && plan.op == Operation::Chat {
            "/messages"
        } else {
            plan.op.path()
        };
        let path = match gemini && native {
            true => crate::protocols::gemini_native::path(
                &provider.base_path,
                &chosen.lane.model,
                crate::protocols::gemini_native::method(
                    embed,
                    plan.count_tokens,
                    plan.stream,
                    &value,
                ),
            ),
            false => format!("{}{}", provider.base_path, api_path),
        };
        let cluster = if provider.scheme == "https" {
            ai_router_contract::clusters::PROVIDERS_TLS
        } else {
            ai_router_contract::clusters::PROVIDERS_PLAIN
        };
        host.set_header(Side::Request, ":authority", Some(&provider.authority));
        host.set_header(Side::Request, ":path", Some(&path));
        host.set_header(Side::Request, CLUSTER_HEADER, Some(cluster));
        // Only the allowlisted client headers go on; the provider's own are added below.
        for name in host.header_names(Side::Request) {
            if !headers::forwarded_to_provider(&name) && name != CLUSTER_HEADER {
                host.set_header(Side::Request, &name, None);
            }
        }
        for h in &provider.headers {
            let lower = h.name.to_ascii_lowercase();
            if lower != "authorization" && lower != "x-api-key" && lower != provider.auth_header {
                host.set_header(Side::Request, &lower, Some(&h.value));
            }
        }
        if key.secret.is_empty() {
            // A keyless provider: the client's credentials were removed above, none is added.
        } else if provider.auth_header == "authorization" || provider.auth_header.is_empty() {
            host.set_header(
                Side::Request,
                "authorization",
                Some(&format!("Bearer {}", key.secret)),
            );
        } else {
            host.set_header(Side::Request, &provider.auth_header, Some(&key.secret));
        }
        if gemini && native && !key.secret.is_empty() {
            // Google's own API takes the key as `x-goog-api-key`.
            host.set_header(Side::Request, "authorization", None);
            host.set_header(Side::Request, &provider.auth_header, None);
            host.set_header(Side::Request, "x-goog-api-key", Some(&key.secret));
        }
        if anthropic && native {
            // The caller's own version and betas: its body is sent as it wrote it.
            let version = plan
                .anthropic_version
                .as_deref()
                .unwrap_or(ANTHROPIC_VERSION);
            host.set_header(Side::Request, "anthropic-version", Some(version));
            if let Some(beta) = plan.anthropic_beta.as_deref() {
                host.set_header(Side::Request, "anthropic-beta", Some(beta));
            }
        } else if anthropic {
            host.set_header(Side::Request, "anthropic-version", Some(ANTHROPIC_VERSION));
        }
        if !plan.rid.is_empty() {
            host.set_header(Side::Request, "x-request-id", Some(&plan.rid));
        }
        if !plan.idempotency_key.is_empty() {
            host.set_header(
                Side::Request,
                "idempotency-key",
                Some(&plan.idempotency_key),
            );
        }
        if plan.stream {
            host.set_header(Side::Request, "accept", Some("text/event-stream"));
        }

        let capacity = provider
            .models
            .iter()
            .find(|m| m.id == chosen.lane.model)
            .and_then(|m| crate::protocols::context::lane_capacity(provider, m));
        let model_identity =
            embeddings::identity_of(state, &chosen.lane.provider, &chosen.lane.model);
        let dimensions =
            embeddings::dimensions_of(state, &chosen.lane.provider, &chosen.lane.model);
        host.with_call(&plan.cid, |c| {
            c.tried.push(chosen.lane.clone());
            c.attempts = c.attempts.max(self.attempt);
            if plan.op == Operation::Embeddings && c.identity.is_none() {
                c.identity = model_identity;
            }
        });
        // The caller's `dimensions` is what the answer is checked against; else the model's.
        let requested = embeddings::requested_dimensions(&value)
            .filter(|_| plan.op == Operation::Embeddings)
            .map(|d| d as usize);
        self.dimensions = requested.or(dimensions);
        self.forward_rate_limits = state.forward_rate_limit_headers();
        self.content = state
            .include_content()
            .then(|| crate::answer::content::Content::of_request(body, key.secret.len()));
        self.probe = chosen.probe.is_some();
        // The reservation's instant: the report's `at_ms - latency_ms` is then the send the
        // sends record holds, which the quota ledger counts its estimate by.
        self.started_ms = now;
        host.add_in_flight(&chosen.lane.provider, &chosen.lane.key, 1);
        self.lane = Some(Lane {
            id: chosen.lane,
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
        self.bound_ms = Some(self.started_ms.saturating_add(plan.timeout_ms as i64));
        // Kept until the answer is judged: a verdict resting on words the client sent is not
        // trusted ([`Failure::unless_echoed`]).
        self.body = client_body;
        Flow::Continue
    }

    /// The request cannot be expressed for this lane's provider: the caller's to fix (400).
    /// Nothing was sent, so the reservation goes back to the scope.
    fn refuse(&mut self, host: &mut impl Host, e: anthropic::AdapterError) -> Flow {
        if let Some((provider, send)) = self.reserved.take() {
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

    /// Effects of a failure on this process's view at once (the control plane's push follows),
    /// by the one hold rule ([`Failure::hold`]). Returns when the held lane or key returns
    /// (`None`: nothing held, or until its secret changes), the window the answer states.
    fn hold(&self, host: &mut impl Host, failure: &Failure, now: i64) -> Option<i64> {
        let lane = self.lane.as_ref()?;
        let windows = State::hold_windows(host.state().as_deref());
        match windows.held_until(
            failure.class,
            failure.retry_at_ms,
            failure.provider_code.as_deref(),
            now,
        ) {
            Some((Hold::Lane, until)) => {
                host.hold_cooldown(&lane.id, until);
                Some(until)
            }
            Some((Hold::Key, until)) => {
                host.hold_blacklist(
                    &lane.id.provider,
                    &lane.id.key,
                    failure.class,
                    until,
                    lane.fingerprint,
                );
                (until > 0).then_some(until)
            }
            Some((Hold::Nothing, _)) | None => None,
        }
    }

    fn report(&mut self, host: &mut impl Host, failure: Option<&Failure>, status: u16) {
        if self.reported {
            return;
        }
        self.reported = true;
        let Some(lane) = &self.lane else { return };
        let now = host.now_ms();
        host.add_in_flight(&lane.id.provider, &lane.id.key, -1);
        // A send that never reached the provider did not spend its counters: give it back.
        let unsent = failure.is_some_and(|f| matches!(f.class, Class::Network | Class::Timeout));
        if let Some((provider, send)) = self.reserved.take() {
            if unsent && !self.after_first_token {
                host.release_send(&provider, &send);
            }
        }
        let plan = self.plan.as_ref();
        let backoff = State::resilience_or_defaults(host.state().as_deref())
            .backoff
            .unwrap_or_default();
        // Drawn before borrowing the call: the call table and the generator share a cell.
        let jitter = host.random_unit();
        let after_first_token = self.after_first_token;
        let note = crate::answer::trail::AttemptNote {
            attempt: self.attempt,
            provider: lane.id.provider.clone(),
            key: lane.id.key.clone(),
            model: lane.id.model.clone(),
            class: failure.map(|f| f.class),
            status,
        };
        host.with_call(self.cid(), |c| c.trail.attempt(note));
        let usage = self.usage;
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
                    Class::Transient | Class::Network | Class::Timeout | Class::Stream
                ) {
                    c.transient_failures += 1;
                    let wait = crate::lanes::backoff_ms(&backoff, c.transient_failures, jitter);
                    c.backoff_until_ms = now + wait as i64;
                }
            }
            None => {
                c.answered = Some(lane.id.clone());
                c.answered_usage = usage;
            }
        });
        if failure.is_none() {
            if let Some(first) = self.first_byte_ms {
                host.record_latency(&lane.id, (first - self.started_ms).max(0) as f64);
            }
            if let Some(session) = plan.and_then(|p| p.session.as_deref()) {
                let idle_ms = host.state().map_or(0, |s| s.selection().affinity_idle_ms);
                crate::lanes::affinity::remember(host, session, idle_ms, &lane.id, now);
            }
            if let Some(stored) = plan
                .and_then(|p| p.responses.as_ref())
                .filter(|_| self.stored_id.active())
            {
                let vk = plan.map_or("", |p| p.vk.as_str());
                let id = self.stored_id.id();
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
        // A saving is counted against the first choice when another lane answered.
        let first_choice = plan.and_then(|p| p.first_choice.as_ref()).filter(|fc| {
            failure.is_none() && (fc.provider != lane.id.provider || fc.model != lane.id.model)
        });
        host.report_attempt(AttemptOutcome {
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
            latency_ms: now.saturating_sub(self.started_ms).max(0) as u64,
            retry_at_ms: failure.and_then(|f| f.retry_at_ms).unwrap_or(0),
            fingerprint: lane.fingerprint,
            provider_code: failure
                .and_then(|f| f.provider_code.clone())
                .unwrap_or_default(),
            usage: self.usage_to_report(failure.is_none()),
            virtual_key_id: plan.map(|p| p.vk.clone()).unwrap_or_default(),
            at_ms: now,
            after_first_token: self.after_first_token,
            remaining_requests: self.headroom.map_or(-1, |h| h.0),
            remaining_tokens: self.headroom.map_or(-1, |h| h.1),
            ratelimit_reset_at_ms: self.headroom.map_or(0, |h| h.2),
            probe: self.probe,
            stream: plan.is_some_and(|p| p.stream),
            operation: plan.map(|p| p.op.as_str().to_string()).unwrap_or_default(),
            profile: plan.map(|p| p.profile.clone()).unwrap_or_default(),
            first_choice_provider: first_choice.map(|c| c.provider.clone()).unwrap_or_default(),
            first_choice_model: first_choice.map(|c| c.model.clone()).unwrap_or_default(),
            protocol: plan
                .map(|p| crate::plan::client_protocol(p.op, p.protocol).to_owned())
                .unwrap_or_default(),
            content: self.content.as_ref().map(|c| c.to_proto(&lane.secret)),
        });
    }

    /// The usage an attempt is counted for: the provider's; else, for an answer (a success, or
    /// a stream that broke off after its first token), an estimate: the request's prompt
    /// estimate and the answer's generated text, marked as such. A budget or token quota is
    /// then never passed by a provider that reports nothing.
    fn usage_to_report(&self, answered: bool) -> Option<ProtoUsage> {
        if let Some(u) = self.usage {
            return Some(ProtoUsage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
                cached_tokens: u.cached_tokens,
                source: UsageSource::Reported.into(),
            });
        }
        (answered || self.after_first_token).then(|| ProtoUsage {
            prompt_tokens: self.plan.as_ref().map_or(0, |p| p.prompt_tokens),
            completion_tokens: self.answer_tokens,
            cached_tokens: 0,
            source: UsageSource::Estimated.into(),
        })
    }

    /// The answer that carries a failed attempt's verdict: for a retryable failure the signal
    /// for the outer router (and the final error, should retries run out), else the
    /// provider's refusal for the client. Holds and reports the failure.
    fn verdict(
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
        let larger = failure.class == Class::ContextLength && self.larger_lane_remains(host);
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
    fn larger_lane_remains(&self, host: &mut impl Host) -> bool {
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
    fn fail(&mut self, host: &mut impl Host, failure: Failure, body_size: usize) {
        let failure = failure.unless_echoed(&self.body);
        // The field the provider refused, for a refusal the client gets.
        let param = (!self.headers_only && !failure.class.retryable())
            .then(|| {
                crate::answer::errors::provider_param(&host.body(Side::Response, 0, body_size))
            })
            .flatten();
        let verdict = self.verdict(host, &failure, param);
        self.mode = Mode::Drained;
        if self.headers_only {
            // The provider's answer has no body to replace (the host refuses to write one):
            // answer in its place.
            host.send_response(verdict.status, &verdict.header_pairs(), &verdict.body);
            return;
        }
        host.set_header(Side::Response, ":status", Some(&verdict.status.to_string()));
        for (name, value) in &verdict.headers {
            host.set_header(Side::Response, name, Some(value));
        }
        host.set_header(Side::Response, "content-length", None);
        host.set_body(Side::Response, 0, body_size, &verdict.body);
    }

    /// Fails the attempt outside any callback of its answer (its bound passed, on the host's
    /// tick): the verdict is answered locally, in place of whatever the provider has sent or
    /// still sends (nothing of it has reached the client: its headers are held until the first
    /// token).
    fn fail_locally(&mut self, host: &mut impl Host, failure: Failure) {
        let verdict = self.verdict(host, &failure, None);
        self.answered_locally = true;
        self.mode = Mode::Through;
        host.send_response(verdict.status, &verdict.header_pairs(), &verdict.body);
    }

    /// A whole answer (in the caller's protocol) to a call that asked for a stream: the client
    /// gets the stream it asked for, the answer's events in its protocol (chat: the usage
    /// chunk only when asked for), and the attempt succeeded with the answer's usage.
    fn answer_as_stream(
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
            Protocol::Gemini => crate::protocols::gemini::replay(&answer, json_array),
            _ => crate::cache::shapes::replay_sse(protocol, &answer),
        });
        host.set_body(Side::Response, 0, size, &bytes);
        host.set_header(Side::Response, "content-length", None);
        let content_type = match json_array {
            true => "application/json",
            false => "text/event-stream",
        };
        host.set_header(Side::Response, "content-type", Some(content_type));
        self.after_first_token = true;
        self.succeed_headers(host);
        self.report(host, None, status);
        self.mode = Mode::Through;
    }

    /// `bytes` with the lane's secret redacted: every byte a client receives from a provider
    /// passes through here (providers echo keys in error messages).
    fn scrub(&self, bytes: Vec<u8>) -> Vec<u8> {
        match &self.lane {
            Some(lane) => redact_bytes(&bytes, &lane.secret).unwrap_or(bytes),
            None => bytes,
        }
    }

    fn succeed_headers(&mut self, host: &mut impl Host) {
        if self.first_byte_ms.is_none() {
            self.first_byte_ms = Some(host.now_ms());
        }
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
    fn answer_cost(&self, host: &impl Host, lane: &LaneId) -> f64 {
        let (Some(state), Some(plan)) = (host.state(), self.plan.as_ref()) else {
            return 0.0;
        };
        let Some(price) = crate::lanes::cost::price_of(&state, &lane.provider, &lane.model) else {
            return 0.0;
        };
        match self.usage {
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

impl Attempt {
    /// The answer to an HTTP call this stage dispatched (the timer).
    pub fn on_http_call_response(&mut self, host: &mut impl Host, token: u32) {
        if matches!(self.pending, Pending::Wait(t) if t == token) {
            self.pending = Pending::Nothing;
            // A lane left to another call's probe comes back once the state moved on (the
            // probe's outcome closed or reopened its breaker): ask again, never wait it out.
            if host.state_sequence() != self.excluded_in_version {
                self.excluded.clear();
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
        let Pending::Lease(t, chosen, probe) = std::mem::take(&mut self.pending) else {
            return;
        };
        if t != token {
            self.pending = Pending::Lease(t, chosen, probe);
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
                chosen.health = host
                    .with_lanes(|view, _| lanes::health_of(&state, view, &chosen.lane.provider));
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

impl Attempt {
    pub fn on_request_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        self.started_ms = host.now_ms();
        self.attempt = host
            .header_text(Side::Request, "x-envoy-attempt-count")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        self.plan = host
            .header_text(Side::Request, PLAN_HEADER)
            .and_then(|p| Plan::decode(&p));
        if self.plan.is_none() {
            return self.give_up(host, None, None);
        }
        if end_of_stream {
            return self.prepare(host);
        }
        Flow::Pause
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
        if self.lane.is_some() {
            return Flow::Continue;
        }
        self.body = host.body(Side::Request, 0, size);
        self.prepare(host)
    }

    pub fn on_response_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        if self.answered_locally {
            // The stage's own answer, on its way back.
            return Flow::Continue;
        }
        let Some(lane) = &self.lane else {
            return Flow::Continue;
        };
        let status: u16 = host
            .header_text(Side::Response, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(502);
        // The provider's headers: internal names it sends are dropped before anything reads
        // them, and only the allowlisted ones reach the client (its key redacted).
        let rate_limits = self.forward_rate_limits;
        let mut headers: Vec<(String, String)> = Vec::new();
        for (name, value) in host.headers(Side::Response) {
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
        self.headroom = Some(crate::classify::headroom_in(
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
                Mode::Stream {
                    gate: Box::new(Gate::native(lane.kind.text(), protocol)),
                    upstream: None,
                    egress: None,
                    redactor: Box::new(StreamRedactor::new(&lane.secret, protocol)),
                    seen: 0,
                }
            } else {
                let upstream = (lane.kind == ProviderKind::Anthropic).then(|| {
                    Box::new(Translate {
                        parser: Parser::new(),
                        translator: StreamTranslator::new(now_s),
                    })
                });
                // The usage chunk states the answer's real cost (`usage.cost`): the headers
                // went out before it was known.
                let price = host.state().and_then(|s| {
                    crate::lanes::cost::price_of(&s, &lane.id.provider, &lane.id.model)
                });
                Mode::Stream {
                    gate: Box::new(Gate::new(lane.kind.text(), include_usage).with_price(price)),
                    upstream,
                    egress: Egress::new(protocol, &self.request, now_s, json_array).map(Box::new),
                    redactor: Box::new(StreamRedactor::new(&lane.secret, Protocol::Chat)),
                    seen: 0,
                }
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
            self.headers_only = true;
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
                if let Some(content) = self.content.as_mut() {
                    content.answer(&body);
                }
                self.judge_whole(host, &body, size);
                Flow::Continue
            }
            Mode::Stream {
                mut gate,
                mut upstream,
                mut egress,
                mut redactor,
                seen,
            } => {
                // Every byte for the client passes here: chat chunks become the caller's events.
                let mut to_caller = |bytes: Vec<u8>| match egress.as_mut() {
                    Some(e) => e.encode(&bytes),
                    None => bytes,
                };
                let now = host.now_ms();
                // While held, Envoy buffers: `size` is everything so far and `seen` what was read.
                let buffered = !gate.released();
                let new = if buffered {
                    host.body(Side::Response, seen, size.saturating_sub(seen))
                } else {
                    host.body(Side::Response, 0, size)
                };
                if let Some(content) = self.content.as_mut() {
                    content.answer(&new);
                }
                self.stored_id.stream(&new);
                let (new, upstream_failure) = match upstream.as_mut() {
                    None => (new, None),
                    Some(t) => t.feed(&new, now),
                };
                // The bytes that take the place of this callback's body.
                let mut out: Option<Vec<u8>> = None;
                let chunks_before = gate.chunks();
                let step = gate.feed(&new, now);
                if gate.released() && gate.chunks() > chunks_before {
                    // A chunk after the first token (or the first token itself): the next one
                    // is due within timeoutMs of it, unless the answer is complete ([DONE]).
                    let timeout = self.plan.as_ref().map_or(0, |p| p.timeout_ms);
                    self.bound_ms = (!gate.completed()).then(|| now.saturating_add(timeout as i64));
                }
                match step {
                    Step::Hold => {}
                    Step::Release(bytes) => {
                        self.after_first_token = true;
                        self.succeed_headers(host);
                        out = Some(redactor.feed(&bytes));
                    }
                    Step::Forward(bytes) => out = Some(redactor.feed(&bytes)),
                    Step::Fail(failure) => {
                        self.fail(host, failure, size);
                        return Flow::Continue;
                    }
                }
                if let Some(failure) = gate.failed_after_first_token().cloned() {
                    let failure = failure.unless_echoed(&self.body);
                    // The client got the error event in `out`; the attempt failed.
                    let mut bytes = out.unwrap_or_default();
                    bytes.extend(redactor.finish());
                    let bytes = to_caller(bytes);
                    host.set_body(Side::Response, 0, size, &bytes);
                    self.usage = gate.usage;
                    self.answer_tokens = gate.answer_tokens;
                    self.report(host, Some(&failure), 200);
                    self.mode = Mode::Drained;
                    return Flow::Continue;
                }
                if let Some(failure) = upstream_failure {
                    if !gate.released() {
                        self.fail(host, failure, size);
                        return Flow::Continue;
                    }
                    let failure = failure.unless_echoed(&self.body);
                    // After the first token: what arrived, then the error ends the stream.
                    let end = crate::attempt::stream::error_event(
                        &format!(
                            "The provider's stream failed after the answer had started: {}",
                            failure.message
                        ),
                        ErrorCode::StreamInterrupted,
                    );
                    let mut bytes = out.unwrap_or_default();
                    bytes.extend(redactor.feed(&end));
                    bytes.extend(redactor.finish());
                    let bytes = to_caller(bytes);
                    host.set_body(Side::Response, 0, size, &bytes);
                    self.report(host, Some(&failure), 200);
                    self.mode = Mode::Drained;
                    return Flow::Continue;
                }
                if !end_of_stream {
                    if let Some(bytes) = out {
                        host.set_body(Side::Response, 0, size, &to_caller(bytes));
                    }
                    let held = !gate.released();
                    self.mode = Mode::Stream {
                        gate,
                        upstream,
                        egress,
                        redactor,
                        seen: size,
                    };
                    return if held { Flow::Pause } else { Flow::Continue };
                }
                match gate.finish() {
                    Ok(tail) => {
                        if !self.after_first_token {
                            self.after_first_token = gate.released();
                            self.succeed_headers(host);
                        }
                        let mut bytes = out.unwrap_or_default();
                        bytes.extend(redactor.feed(&tail));
                        bytes.extend(redactor.finish());
                        host.set_body(Side::Response, 0, size, &to_caller(bytes));
                        self.usage = gate.usage;
                        self.answer_tokens = gate.answer_tokens;
                        let failure = (!gate.completed()).then(|| {
                            Failure::local(
                                Class::Stream,
                                200,
                                "the stream broke off after the first token",
                            )
                        });
                        self.report(host, failure.as_ref(), 200);
                    }
                    Err(failure) => self.fail(host, failure, size),
                }
                self.mode = Mode::Through;
                Flow::Continue
            }
        }
    }

    pub fn on_log(&mut self, host: &mut impl Host) {
        if self.reported || self.lane.is_none() {
            return;
        }
        // The attempt ended without a verdict: the provider's connection broke, the call's
        // deadline passed, or the caller went away (the outer router resets this stream then).
        // The attempt's own timeout is never among them: its bound gives the verdict itself.
        let now = host.now_ms();
        let deadline = self.plan.as_ref().map_or(i64::MAX, |p| {
            p.started_ms.saturating_add(p.deadline_ms as i64)
        });
        let details = host
            .property(&["response", "code_details"])
            .unwrap_or_default();
        let class = if now + 50 >= deadline {
            Class::Deadline
        } else if client_went_away(&details) {
            Class::Cancelled
        } else if self.after_first_token {
            Class::Stream
        } else {
            Class::Network
        };
        if class == Class::Cancelled && self.after_first_token {
            // The caller stopped reading early: the lane served it.
            self.report(host, None, 200);
            return;
        }
        let failure = Failure::local(class, 0, String::new());
        self.report(host, Some(&failure), 0);
    }
}

impl Attempt {
    /// The verdict on a whole (unary or error) answer.
    fn judge_whole(&mut self, host: &mut impl Host, body: &[u8], size: usize) {
        let Mode::Whole { status, headers } = std::mem::take(&mut self.mode) else {
            return;
        };
        let Some(lane) = &self.lane else { return };
        let now = host.now_ms();
        let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let has_error_object = parsed.get("error").is_some_and(|e| !e.is_null());
        self.answer_tokens = crate::protocols::context::estimate_answer_tokens(&parsed);
        if (200..300).contains(&status) && !has_error_object {
            // A success must be what it claims: a JSON object (HTML from a proxy, an empty or
            // cut body are not). A JSON answer to a stream request (a server that ignores
            // `stream`) is served as the stream the client asked for.
            let stream_wanted = self.plan.as_ref().is_some_and(|p| p.stream);
            if !parsed.is_object() {
                let message = if stream_wanted {
                    "the provider answered a stream request without a stream"
                } else {
                    "the provider answered 2xx with a body that is not a JSON object"
                };
                let failure = Failure::local(Class::Transient, status, message);
                self.fail(host, failure, size);
                return;
            }
            // Vectors of another length than declared fail over, in any protocol's shape.
            if let Some(expected) = self.dimensions.filter(|_| {
                self.plan
                    .as_ref()
                    .is_some_and(|p| p.op == Operation::Embeddings)
            }) {
                if let Err(message) = embeddings::check_dimensions(&parsed, expected) {
                    let failure = Failure::local(Class::Mismatch, status, message);
                    self.fail(host, failure, size);
                    return;
                }
            }
            let protocol = self.plan.as_ref().map_or(Protocol::Chat, |p| p.protocol);
            if lane.native {
                // The caller's own protocol: the answer goes as it came, its key redacted.
                self.usage = protocols::answer_usage(protocol, &parsed);
                self.stored_id.answer(&parsed);
                if stream_wanted {
                    self.answer_as_stream(host, size, protocol, parsed, status);
                    return;
                }
                if let Some(clean) = redact_bytes(body, &lane.secret) {
                    host.set_body(Side::Response, 0, size, &clean);
                    host.set_header(Side::Response, "content-length", None);
                }
                self.succeed_headers(host);
                self.report(host, None, status);
                self.mode = Mode::Through;
                return;
            }
            let chat_op = self.plan.as_ref().is_some_and(|p| p.op == Operation::Chat);
            let from_anthropic = lane.kind == ProviderKind::Anthropic && chat_op;
            if from_anthropic || protocol != Protocol::Chat {
                let chat = if from_anthropic {
                    anthropic::from_messages_response(&parsed, now / 1000)
                } else {
                    parsed
                };
                self.usage = usage_of(&chat);
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
            self.usage = usage_of(&parsed);
            if stream_wanted {
                self.answer_as_stream(host, size, protocol, parsed, status);
                return;
            }
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
            return;
        }
        let mut failure = classify_in(
            lane.kind.text(),
            lane.daily_reset,
            status,
            &headers,
            body,
            now,
        );
        // Envoy's own answers (connection refused, reset before headers) carry no provider body.
        let text = String::from_utf8_lossy(body);
        if status == 503
            && (text.starts_with("upstream connect error")
                || text.starts_with("no healthy upstream"))
        {
            failure.class = Class::Network;
        }
        self.fail(host, failure, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::{Dispatched, FakeHost};
    use crate::vm::view::View;
    use ai_router_proto::v1::{BreakerState, LaneCooldown, Model, Provider, ProviderKey, Snapshot};

    const NOW: i64 = 1_700_000_000_000;

    fn provider(id: &str, kind: ProviderKind, keys: &[&str], model: &str) -> Provider {
        Provider {
            id: id.into(),
            kind: kind.into(),
            scheme: "http".into(),
            authority: format!("{id}.test:8000"),
            base_path: "/v1".into(),
            auth_header: if kind == ProviderKind::Anthropic {
                "x-api-key".into()
            } else {
                "authorization".into()
            },
            keys: keys
                .iter()
                .map(|k| ProviderKey {
                    alias: (*k).into(),
                    secret: format!("sk-{id}-{k}-secret"),
                    fingerprint: ai_router_contract::fingerprint(&format!("sk-{id}-{k}-secret")),
                    ..Default::default()
                })
                .collect(),
            models: vec![Model {
                id: model.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn snapshot() -> Snapshot {
        let mut snap = Snapshot::default();
        snap.providers
            .push(provider("p1", ProviderKind::OpenaiCompatible, &["a"], "m1"));
        snap.providers
            .push(provider("p2", ProviderKind::OpenaiCompatible, &["c"], "m2"));
        snap
    }

    fn plan(stream: bool) -> Plan {
        Plan {
            cid: "call-1".into(),
            rid: "rid-1".into(),
            idempotency_key: "idem-1".into(),
            vk: "key_app".into(),
            op: Operation::Chat,
            stream,
            include_usage: false,
            tiers: vec![
                vec![Candidate {
                    provider: "p1".into(),
                    model: "m1".into(),
                    weight: 1.0,
                    when: Vec::new(),
                }],
                vec![Candidate {
                    provider: "p2".into(),
                    model: "m2".into(),
                    weight: 1.0,
                    when: Vec::new(),
                }],
            ],
            max_attempts: 4,
            timeout_ms: 10_000,
            deadline_ms: 30_000,
            started_ms: NOW,
            tokens: 10,
            protocol: Protocol::Chat,
            anthropic_version: None,
            anthropic_beta: None,
            count_tokens: false,
            json_array: false,
            session: None,
            profile: String::new(),
            prompt_cache: String::new(),
            prompt_tokens: 5,
            max_tokens: 5,
            reset_ms: 0,
            first_choice: None,
            trail: false,
            responses: None,
        }
    }

    /// A host holding attempt `n` of the call, as the outer router sends it.
    fn host_with(snap: Snapshot, plan: &Plan, n: u32) -> FakeHost {
        let mut host = FakeHost::with_state(State::new(1, snap));
        host.now = NOW + 5;
        host.calls
            .insert(plan.cid.clone(), crate::vm::calls::Call::default());
        host.add(Side::Request, ":method", b"POST");
        host.add(Side::Request, ":path", b"/v1/chat/completions");
        host.add(Side::Request, ":authority", b"gateway");
        host.add(Side::Request, "content-type", b"application/json");
        host.add(Side::Request, "cookie", b"session=client");
        host.add(Side::Request, "openai-organization", b"org-client");
        host.add(
            Side::Request,
            "x-envoy-attempt-count",
            n.to_string().as_bytes(),
        );
        host.add(Side::Request, PLAN_HEADER, plan.encode().as_bytes());
        let stream = if plan.stream { ",\"stream\":true" } else { "" };
        host.request_body =
            format!(r#"{{"model":"chat","messages":[{{"role":"user","content":"hi"}}]{stream}}}"#)
                .into_bytes();
        host
    }

    /// The delays of the timers the stage asked for, in order.
    fn timer_delays(host: &FakeHost) -> Vec<i64> {
        host.dispatched
            .iter()
            .filter_map(|d| match d {
                Dispatched::Http { cluster, headers } if cluster == TIMER_CLUSTER => headers
                    .iter()
                    .find(|(k, _)| k == "x-envoy-fault-delay-request")
                    .and_then(|(_, v)| v.parse().ok()),
                _ => None,
            })
            .collect()
    }

    /// Runs the request phase; returns the flow of the body callback.
    fn send(stage: &mut Attempt, host: &mut FakeHost) -> Flow {
        assert_eq!(stage.on_request_headers(host, false), Flow::Pause);
        let size = host.request_body.len();
        stage.on_request_body(host, size, true)
    }

    /// The provider answers: headers, then the whole body in one callback.
    fn answer(
        stage: &mut Attempt,
        host: &mut FakeHost,
        status: u16,
        headers: &[(&str, &str)],
        body: &str,
    ) {
        host.add(Side::Response, ":status", status.to_string().as_bytes());
        for (k, v) in headers {
            host.add(Side::Response, k, v.as_bytes());
        }
        assert_eq!(stage.on_response_headers(host, false), Flow::Pause);
        host.response_body = body.as_bytes().to_vec();
        let size = host.response_body.len();
        assert_eq!(stage.on_response_body(host, size, true), Flow::Continue);
    }

    /// p1's keys `a` and `b` spend one scope `org`, which has 2 requests left (reported by
    /// `a` for a call that began a second ago).
    fn scoped_snapshot() -> Snapshot {
        let mut snap = snapshot();
        snap.providers[0] = provider("p1", ProviderKind::OpenaiCompatible, &["a", "b"], "m1");
        for k in &mut snap.providers[0].keys {
            k.scope = "org".into();
        }
        snap.headroom.push(ai_router_proto::v1::Headroom {
            provider: "p1".into(),
            key: "a".into(),
            model: "m1".into(),
            remaining_requests: 2,
            remaining_tokens: -1,
            reset_at_ms: NOW + 60_000,
            scope: "org".into(),
            as_of_ms: NOW - 1_000,
            spent: false,
        });
        snap
    }

    #[test]
    fn a_keyless_provider_gets_no_credentials_and_an_empty_secret_elsewhere_is_missing() {
        let plan = plan(false);
        let keyless = |terms: bool| {
            let mut snap = snapshot();
            snap.providers[0].keys[0].secret.clear();
            if terms {
                snap.providers[0].terms = Some(ai_router_proto::v1::ProviderTerms {
                    keyless: true,
                    ..Default::default()
                });
            }
            snap
        };
        let mut host = host_with(keyless(true), &plan, 1);
        host.add(Side::Request, "authorization", b"Bearer vk-client");
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Continue);
        assert_eq!(
            host.text(Side::Request, ":authority").as_deref(),
            Some("p1.test:8000")
        );
        assert_eq!(host.text(Side::Request, "authorization"), None);
        assert_eq!(host.text(Side::Request, "x-api-key"), None);
        // Without the keyless terms an empty secret is a key that is missing: the next lane.
        let mut host = host_with(keyless(false), &plan, 1);
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Continue);
        assert_eq!(
            host.text(Side::Request, ":authority").as_deref(),
            Some("p2.test:8000")
        );
    }

    #[test]
    fn an_attempt_reads_the_lanes_once_and_reserves_from_what_the_pick_read() {
        let plan = plan(false);
        let mut host = host_with(scoped_snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Continue);
        assert_eq!(host.lane_views, 1);
        // The reservation was checked against the headroom the pick saw.
        assert_eq!(
            host.lanes.sent_since("p1", "org", "m1", NOW - 1_000),
            (1, 10)
        );
    }

    #[test]
    fn sends_reserve_the_scope_s_headroom_across_its_keys_and_a_network_failure_gives_it_back() {
        let plan = plan(false);
        let mut sends = crate::host::fake::FakeLanes::default().sends;
        let mut sent_to = Vec::new();
        for _ in 0..3 {
            let mut host = host_with(scoped_snapshot(), &plan, 1);
            host.lanes.sends = sends;
            let mut stage = Attempt::default();
            assert_eq!(send(&mut stage, &mut host), Flow::Continue);
            sent_to.push(host.text(Side::Request, ":authority").unwrap_or_default());
            sends = std::mem::take(&mut host.lanes.sends);
        }
        // Two calls spend the scope's two requests, whichever key; the third goes elsewhere.
        assert_eq!(
            sent_to,
            ["p1.test:8000", "p1.test:8000", "p2.test:8000"],
            "{sends:?}"
        );
        assert_eq!(
            sends
                .get(&("p1".to_owned(), "org".to_owned()))
                .map(|s| s.since("org", "m1", NOW - 1_000)),
            Some((2, 20))
        );
        // Each scope has its own record: the third call's reservation is in p2's.
        assert!(
            sends.keys().all(|(p, _)| p == "p1" || p == "p2") && sends.len() == 2,
            "{sends:?}"
        );

        // An attempt that never reached the provider gives its reservation back.
        let mut host = host_with(snapshot(), &plan, 1);
        host.lanes.sends = sends;
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Continue);
        assert_eq!(host.lanes.sent_since("p1", "a", "m1", NOW), (1, 10));
        host.add(Side::Response, ":status", b"503");
        let _ = stage.on_response_headers(&mut host, false);
        host.response_body = b"upstream connect error or disconnect/reset before headers".to_vec();
        let size = host.response_body.len();
        let _ = stage.on_response_body(&mut host, size, true);
        assert_eq!(
            host.attempts.first().map(|a| a.error_class().text()),
            Some("network")
        );
        assert_eq!(host.lanes.sent_since("p1", "a", "m1", NOW), (0, 0));
    }

    #[test]
    fn a_request_the_provider_cannot_be_sent_is_refused_and_gives_its_reservation_back() {
        let plan = plan(false);
        let mut snap = scoped_snapshot();
        snap.providers[0] = provider("p1", ProviderKind::Anthropic, &["a", "b"], "m1");
        for k in &mut snap.providers[0].keys {
            k.scope = "org".into();
        }
        let mut host = host_with(snap, &plan, 1);
        // Anthropic answers one choice per request: `n: 2` cannot be sent there.
        host.request_body =
            br#"{"model":"chat","n":2,"messages":[{"role":"user","content":"hi"}]}"#.to_vec();
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Pause);
        assert_eq!(host.answered.as_ref().map(|a| a.status), Some(400));
        assert_eq!(
            host.lanes.sent_since("p1", "org", "m1", NOW - 1_000),
            (0, 0),
            "nothing was sent, so nothing stays reserved"
        );
    }

    #[test]
    fn a_unary_success_goes_to_the_first_lane_with_its_own_key() {
        let plan = plan(false);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Continue);
        assert_eq!(
            host.text(Side::Request, ":authority").as_deref(),
            Some("p1.test:8000")
        );
        assert_eq!(
            host.text(Side::Request, ":path").as_deref(),
            Some("/v1/chat/completions")
        );
        assert_eq!(
            host.text(Side::Request, "authorization").as_deref(),
            Some("Bearer sk-p1-a-secret")
        );
        assert_eq!(
            host.text(Side::Request, CLUSTER_HEADER).as_deref(),
            Some(ai_router_contract::clusters::PROVIDERS_PLAIN)
        );
        for gone in [
            "cookie",
            "openai-organization",
            PLAN_HEADER,
            "x-envoy-attempt-count",
        ] {
            assert!(
                host.header(Side::Request, gone).is_none(),
                "{gone} reached the provider"
            );
        }
        let sent: Value = serde_json::from_slice(&host.request_body).unwrap_or(Value::Null);
        assert_eq!(
            sent["model"], "m1",
            "the pool model id replaces the caller's name"
        );
        assert_eq!(host.lanes.in_flight("p1", "a"), 1);

        answer(
            &mut stage,
            &mut host,
            200,
            &[("content-type", "application/json"), ("set-cookie", "x=1")],
            r#"{"choices":[{"message":{"content":"hello sk-p1-a-secret"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        );
        assert_eq!(host.text(Side::Response, H_ATTEMPT).as_deref(), Some("1"));
        assert_eq!(
            host.text(Side::Response, H_LANE_MODEL).as_deref(),
            Some("m1")
        );
        assert!(host.header(Side::Response, "set-cookie").is_none());
        assert!(!String::from_utf8_lossy(&host.response_body).contains("sk-p1-a-secret"));
        assert_eq!(host.attempts.len(), 1);
        let report = &host.attempts[0];
        assert_eq!(
            (report.outcome().text(), report.key.as_str()),
            ("success", "a")
        );
        assert_eq!(report.usage.map(|u| u.completion_tokens), Some(2));
        assert_eq!(host.lanes.in_flight("p1", "a"), 0);
        assert_eq!(
            host.calls.get("call-1").and_then(|c| c.answered.clone()),
            Some(LaneId::new("p1", "a", "m1"))
        );
    }

    #[test]
    fn a_2xx_that_is_not_what_it_claims_fails_over() {
        for (stream, content_type, body) in [
            (
                false,
                "text/html",
                "<html><body>502 Bad Gateway</body></html>",
            ),
            (false, "application/json", ""),
            (false, "application/json", "{\"choices\":[{\"message\""),
            (
                true,
                "text/html",
                "<html><body>502 Bad Gateway</body></html>",
            ),
        ] {
            let plan = plan(stream);
            let mut host = host_with(snapshot(), &plan, 1);
            let mut stage = Attempt::default();
            send(&mut stage, &mut host);
            if body.is_empty() {
                host.add(Side::Response, ":status", b"200");
                host.add(Side::Response, "content-type", content_type.as_bytes());
                assert_eq!(stage.on_response_headers(&mut host, true), Flow::Continue);
                let answer = host.answered.clone().expect("answered in its place");
                assert_eq!(answer.status, 503, "{body:?}");
                assert_eq!(answer.header(H_RETRY), Some("1"));
            } else {
                answer(
                    &mut stage,
                    &mut host,
                    200,
                    &[("content-type", content_type)],
                    body,
                );
                assert_eq!(
                    host.text(Side::Response, ":status").as_deref(),
                    Some("503"),
                    "{body}"
                );
                assert_eq!(
                    host.text(Side::Response, H_RETRY).as_deref(),
                    Some("1"),
                    "{body}"
                );
            }
            assert_eq!(
                host.attempts[0].error_class().text(),
                "transient",
                "{body:?}"
            );
        }
    }

    #[test]
    fn a_json_answer_to_a_stream_request_is_served_as_the_stream_with_its_usage() {
        let plan = plan(true);
        assert!(!plan.include_usage);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        answer(
            &mut stage,
            &mut host,
            200,
            &[("content-type", "application/json")],
            r#"{"id":"c1","model":"m1","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi sk-p1-a-secret"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        );
        assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("200"));
        assert_eq!(
            host.text(Side::Response, "content-type").as_deref(),
            Some("text/event-stream")
        );
        let out = String::from_utf8_lossy(&host.response_body).to_string();
        let events = crate::wire::sse::Parser::new().feed(out.as_bytes());
        let text: String = events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
            .filter_map(|v| {
                v.pointer("/choices/0/delta/content")?
                    .as_str()
                    .map(String::from)
            })
            .collect();
        assert_eq!(text, "hi [redacted]", "{out}");
        assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
        assert!(!out.contains("usage"), "the client did not ask: {out}");
        let report = &host.attempts[0];
        assert_eq!(report.outcome().text(), "success");
        assert_eq!(report.usage.map(|u| u.completion_tokens), Some(2));
    }

    /// p1/m1 and p2/m2 with these context windows.
    fn sized(small: u64, other: u64) -> Snapshot {
        let mut snap = snapshot();
        snap.providers[0].models[0].context_window = small;
        snap.providers[1].models[0].context_window = other;
        snap
    }

    /// The first attempt of a call, on p1, answered that the prompt is too long.
    fn too_long_on_p1(small: u64, other: u64) -> (Plan, FakeHost) {
        let plan = plan(false);
        let mut host = host_with(sized(small, other), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        let json = [("content-type", "application/json")];
        answer(&mut stage, &mut host, 400, &json, TOO_LONG);
        (plan, host)
    }

    const TOO_LONG: &str = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;

    #[test]
    fn a_context_length_answer_moves_on_only_to_a_larger_lane_and_notes_the_trail() {
        let (plan, mut host) = too_long_on_p1(8_000, 32_000);
        assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("503"));
        assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
        assert_eq!(host.attempts[0].error_class().text(), "context_length");
        let call = host.calls.get("call-1").cloned().unwrap_or_default();
        assert_eq!(call.larger_than, Some(Some(8_000)));
        assert_eq!(call.trail.attempts.len(), 1);
        assert_eq!(call.trail.attempts[0].class, Some(Class::ContextLength));

        // The next attempt goes to p2 (larger), noting p1 as no larger.
        let calls = std::mem::take(&mut host.calls);
        let mut second = host_with(sized(8_000, 32_000), &plan, 2);
        second.calls = calls;
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut second), Flow::Continue);
        assert_eq!(
            second.text(Side::Request, ":authority").as_deref(),
            Some("p2.test:8000")
        );
        let call = second.calls.get("call-1").cloned().unwrap_or_default();
        assert_eq!(call.trail.skipped.len(), 1);
        assert_eq!(call.trail.skipped[0].reason, "context_window");
    }

    #[test]
    fn a_context_length_answer_with_no_larger_lane_stops_the_call_with_the_providers_400() {
        for (small, other) in [(8_000, 8_000), (8_000, 4_000), (0, 0)] {
            let (_, host) = too_long_on_p1(small, other);
            assert_eq!(
                host.text(Side::Response, ":status").as_deref(),
                Some("400"),
                "{small} then {other}"
            );
            assert_eq!(host.text(Side::Response, H_RETRY), None);
            let call = host.calls.get("call-1").cloned().unwrap_or_default();
            assert_eq!(call.larger_than, None);
        }
    }

    #[test]
    fn a_429_cools_the_lane_and_signals_a_retry_then_the_next_attempt_fails_over() {
        let plan = plan(false);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        answer(
            &mut stage,
            &mut host,
            429,
            &[
                ("content-type", "application/json"),
                ("retry-after", "20"),
                ("x-ai-router-final-status", "299"),
            ],
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        );
        assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("503"));
        assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
        // The provider's own stage header never survives: this one is the stage's verdict.
        assert_eq!(
            host.text(Side::Response, H_FINAL_STATUS).as_deref(),
            Some("503")
        );
        assert_eq!(host.attempts[0].error_class().text(), "rate_limit");
        assert!(
            host.lanes
                .holds(&LaneId::new("p1", "a", "m1"))
                .iter()
                .any(|h| matches!(
                    h,
                    crate::vocab::LocalHold::Cooldown { until_ms, .. } if *until_ms >= NOW + 19_000
                )),
            "the lane is cooled for every worker at once"
        );

        // The outer router's second attempt: p1's only lane is cooling, p2 serves.
        let lanes = std::mem::take(&mut host.lanes);
        let calls = std::mem::take(&mut host.calls);
        let mut second = host_with(snapshot(), &plan, 2);
        second.lanes = lanes;
        second.calls = calls;
        let mut stage = Attempt::default();
        // A rate limit is no transient failure: no backoff, straight to the next tier.
        assert_eq!(send(&mut stage, &mut second), Flow::Continue);
        assert!(
            second.dispatched.is_empty(),
            "no wait: {:?}",
            second.dispatched
        );
        assert_eq!(
            second.text(Side::Request, ":authority").as_deref(),
            Some("p2.test:8000")
        );
        assert_eq!(second.text(Side::Request, H_ATTEMPT), None);
    }

    /// One call's first attempt on a worker of an Envoy whose workers share `parked`.
    fn worker_call(
        parked: &crate::host::fake::SharedStore,
        plan: &Plan,
        now: i64,
    ) -> (FakeHost, Attempt) {
        let mut host = host_with(snapshot(), plan, 1);
        host.lanes.parked = parked.clone();
        host.now = now;
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Continue);
        (host, stage)
    }

    fn sent_to(host: &FakeHost) -> String {
        host.text(Side::Request, ":authority").unwrap_or_default()
    }

    const OK_BODY: &str = r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;

    #[test]
    fn two_workers_probe_a_parked_lane_once_per_interval_in_all_and_snap_back_together() {
        const INTERVAL: i64 = 1_000;
        let mut plan = plan(false);
        plan.reset_ms = INTERVAL as u64;
        let parked = crate::host::fake::SharedStore::default();
        let json = [("content-type", "application/json")];

        // Worker A's call fails on the first lane (p1): p1 is parked for both workers.
        let (mut a, mut failed) = worker_call(&parked, &plan, NOW);
        assert_eq!(sent_to(&a), "p1.test:8000");
        answer(
            &mut failed,
            &mut a,
            503,
            &json,
            r#"{"error":{"message":"overloaded"}}"#,
        );
        assert_eq!(a.text(Side::Response, H_RETRY).as_deref(), Some("1"));

        // Until the probe is due, both workers' calls go to p2.
        for i in 0..10 {
            let (host, _) = worker_call(&parked, &plan, NOW + 10 + i * 90);
            assert_eq!(sent_to(&host), "p2.test:8000", "call {i}");
        }

        // The probe is due: of many calls on both workers at once, exactly one probes p1.
        let due = NOW + INTERVAL;
        let mut calls: Vec<(FakeHost, Attempt)> =
            (0..10).map(|_| worker_call(&parked, &plan, due)).collect();
        let probes: Vec<usize> = (0..calls.len())
            .filter(|i| sent_to(&calls[*i].0) == "p1.test:8000")
            .collect();
        assert_eq!(probes.len(), 1, "one probe per interval in all");
        // Later in the same interval, still none.
        for t in [due + 1, due + INTERVAL - 1] {
            let (host, _) = worker_call(&parked, &plan, t);
            assert_eq!(sent_to(&host), "p2.test:8000", "at +{}", t - due);
        }

        // The probe answers: both workers' next calls snap back to p1.
        let (mut host, mut stage) = calls.swap_remove(probes[0]);
        host.now = due + 50;
        answer(&mut stage, &mut host, 200, &json, OK_BODY);
        for i in 0..4 {
            let (host, _) = worker_call(&parked, &plan, due + 60 + i);
            assert_eq!(sent_to(&host), "p1.test:8000", "call {i} after the probe");
        }
    }

    #[test]
    fn a_failed_probe_parks_the_lane_for_another_interval() {
        const INTERVAL: i64 = 1_000;
        let mut plan = plan(false);
        plan.reset_ms = INTERVAL as u64;
        let parked = crate::host::fake::SharedStore::default();
        let json = [("content-type", "application/json")];
        let (mut host, mut stage) = worker_call(&parked, &plan, NOW);
        answer(&mut stage, &mut host, 503, &json, "{}");
        let (mut host, mut probe) = worker_call(&parked, &plan, NOW + INTERVAL);
        assert_eq!(sent_to(&host), "p1.test:8000");
        host.now = NOW + INTERVAL + 200;
        answer(&mut probe, &mut host, 503, &json, "{}");
        // Parked again from the probe's failure, a whole interval on.
        let (host, _) = worker_call(&parked, &plan, NOW + 2 * INTERVAL + 100);
        assert_eq!(sent_to(&host), "p2.test:8000");
        let (host, _) = worker_call(&parked, &plan, NOW + 2 * INTERVAL + 200);
        assert_eq!(sent_to(&host), "p1.test:8000");
    }

    #[test]
    fn a_stream_is_held_until_the_first_token() {
        let plan = plan(true);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        assert_eq!(
            host.text(Side::Request, "accept").as_deref(),
            Some("text/event-stream")
        );
        let sent: Value = serde_json::from_slice(&host.request_body).unwrap_or(Value::Null);
        assert_eq!(sent["stream_options"]["include_usage"], true);

        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, "content-type", b"text/event-stream");
        host.add(Side::Response, "content-length", b"4096");
        assert_eq!(stage.on_response_headers(&mut host, false), Flow::Pause);
        assert_eq!(
            host.header(Side::Response, "content-length"),
            None,
            "a rewritten stream has no length"
        );
        let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
        host.response_body = role.as_bytes().to_vec();
        assert_eq!(
            stage.on_response_body(&mut host, role.len(), false),
            Flow::Pause,
            "held"
        );
        assert!(host.header(Side::Response, H_ATTEMPT).is_none());
        let token = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        host.response_body.extend_from_slice(token.as_bytes());
        let size = host.response_body.len();
        assert_eq!(
            stage.on_response_body(&mut host, size, false),
            Flow::Continue,
            "released"
        );
        assert_eq!(
            String::from_utf8_lossy(&host.response_body),
            format!("{role}{token}")
        );
        assert_eq!(host.text(Side::Response, H_ATTEMPT).as_deref(), Some("1"));
        // After the first token, chunks go on as they come; the end is a success.
        let done = "data: [DONE]\n\n";
        host.response_body = done.as_bytes().to_vec();
        assert_eq!(
            stage.on_response_body(&mut host, done.len(), true),
            Flow::Continue
        );
        assert_eq!(host.attempts[0].outcome().text(), "success");
        assert!(host.attempts[0].after_first_token);
    }

    #[test]
    fn an_error_event_before_the_first_token_fails_over_invisibly() {
        let plan = plan(true);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, "content-type", b"text/event-stream");
        stage.on_response_headers(&mut host, false);
        let event = "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n";
        host.response_body = event.as_bytes().to_vec();
        assert_eq!(
            stage.on_response_body(&mut host, event.len(), false),
            Flow::Continue
        );
        assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("503"));
        assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
        assert!(!String::from_utf8_lossy(&host.response_body).contains("data:"));
        // Whatever the provider still sends is dropped.
        host.response_body = b"data: {\"choices\":[]}\n\n".to_vec();
        let size = host.response_body.len();
        stage.on_response_body(&mut host, size, true);
        assert!(host.response_body.is_empty());
        assert_eq!(host.attempts.len(), 1);
        assert_eq!(host.attempts[0].outcome().text(), "error");
    }

    #[test]
    fn a_half_open_breaker_asks_for_the_probe_lease_and_a_refusal_moves_on() {
        let plan = plan(false);
        let mut snap = snapshot();
        snap.breakers.push(BreakerState {
            scope: ai_router_proto::v1::BreakerScope::Key.into(),
            provider: "p1".into(),
            key: "a".into(),
            state: ai_router_proto::v1::BreakerPhase::HalfOpen.into(),
            open_until_ms: NOW - 1_000,
        });
        let mut host = host_with(snap, &plan, 1);
        let mut stage = Attempt::default();
        assert_eq!(
            send(&mut stage, &mut host),
            Flow::Pause,
            "waits for the lease"
        );
        let Some(Dispatched::Grpc {
            method,
            metadata,
            message,
            ..
        }) = host.dispatched.last().cloned()
        else {
            panic!("a lease call: {:?}", host.dispatched);
        };
        assert_eq!(method, "Lease");
        assert!(metadata
            .iter()
            .any(|(k, _)| k == ai_router_contract::SYNC_TOKEN_METADATA));
        let asked = LeaseRequest::decode(message.as_slice()).unwrap_or_default();
        assert_eq!(asked.holder, ai_router_contract::probe_holder("rid-1", 1));
        // Refused: another call probes it. This attempt goes to p2 instead.
        host.grpc_body = Some(
            LeaseReply {
                granted: false,
                retry_at_ms: NOW + 60_000,
            }
            .encode_to_vec(),
        );
        let token = host.next_token;
        stage.on_grpc_call_response(&mut host, token, 0, 8);
        assert_eq!(host.resumed, 1);
        assert_eq!(
            host.text(Side::Request, ":authority").as_deref(),
            Some("p2.test:8000")
        );
        assert_eq!(
            host.text(Side::Request, "authorization").as_deref(),
            Some("Bearer sk-p2-c-secret")
        );
    }

    #[test]
    fn a_single_lane_left_to_another_calls_probe_is_used_once_the_probe_closed_the_breaker() {
        let mut plan = plan(false);
        plan.tiers.truncate(1);
        let mut snap = snapshot();
        snap.breakers.push(BreakerState {
            scope: ai_router_proto::v1::BreakerScope::Key.into(),
            provider: "p1".into(),
            key: "a".into(),
            state: ai_router_proto::v1::BreakerPhase::HalfOpen.into(),
            open_until_ms: NOW - 1_000,
        });
        let mut host = host_with(snap, &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        host.grpc_body = Some(
            LeaseReply {
                granted: false,
                retry_at_ms: NOW + 60_000,
            }
            .encode_to_vec(),
        );
        let token = host.next_token;
        stage.on_grpc_call_response(&mut host, token, 0, 8);
        // Refused: the only lane is another call's probe; this one waits a moment.
        let Some(Dispatched::Http { .. }) = host.dispatched.last() else {
            panic!("a short wait: {:?}", host.dispatched);
        };
        assert_eq!(host.resumed, 0);
        // The probe succeeded: the next state has the breaker closed.
        host.state = Some(std::rc::Rc::new(State::new(2, snapshot())));
        host.now = NOW + 300;
        let token = host.next_token;
        stage.on_http_call_response(&mut host, token);
        assert_eq!(host.resumed, 1, "the call goes on at once");
        assert_eq!(
            host.text(Side::Request, ":authority").as_deref(),
            Some("p1.test:8000")
        );
    }

    #[test]
    fn a_lane_back_before_the_deadline_is_waited_for() {
        let mut plan = plan(false);
        plan.tiers.truncate(1);
        let mut snap = snapshot();
        snap.cooldowns.push(LaneCooldown {
            provider: "p1".into(),
            key: "a".into(),
            model: "m1".into(),
            until_ms: NOW + 2_000,
        });
        let mut host = host_with(snap, &plan, 1);
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Pause);
        let Some(Dispatched::Http { cluster, .. }) = host.dispatched.last().cloned() else {
            panic!("a timer call: {:?}", host.dispatched);
        };
        assert_eq!(cluster, TIMER_CLUSTER);
        // The wait goes in slices: the first ends before the lane is back, and waits again.
        let (token, delay) = last_timer(&host);
        assert_eq!(delay, TIMER_SLICE_MS);
        host.now = NOW + 1_005;
        stage.on_http_call_response(&mut host, token);
        assert_eq!(host.resumed, 0, "still waiting");
        let (token, delay) = last_timer(&host);
        assert!((990..=1_000).contains(&delay), "{delay}");
        // The timer fires once the cooldown is over.
        host.now = NOW + 2_001;
        stage.on_http_call_response(&mut host, token);
        assert_eq!(host.resumed, 1);
        assert_eq!(
            host.text(Side::Request, ":authority").as_deref(),
            Some("p1.test:8000")
        );
    }

    #[test]
    fn no_lane_left_is_the_final_error_never_retried() {
        let mut plan = plan(false);
        plan.tiers.truncate(1);
        let mut snap = snapshot();
        // Out far past the deadline.
        snap.cooldowns.push(LaneCooldown {
            provider: "p1".into(),
            key: "a".into(),
            model: "m1".into(),
            until_ms: NOW + 3_600_000,
        });
        let mut host = host_with(snap, &plan, 1);
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Pause);
        let answer = host.answered.clone().expect("a local answer");
        assert_eq!(
            answer.status, 500,
            "500 is never retried by the outer router"
        );
        assert_eq!(answer.header(H_FINAL_STATUS), Some("503"));
        assert_eq!(answer.json()["error"]["code"], "pool_rate_limited");
        assert!(answer.header(H_RETRY_AFTER).is_some());
        assert_eq!(answer.header(H_ATTEMPT), Some("0"), "nothing was sent");
    }

    #[test]
    fn open_breakers_with_nothing_sent_are_pool_unavailable_after_zero_attempts() {
        let mut plan = plan(false);
        plan.tiers.truncate(1);
        let mut snap = snapshot();
        snap.breakers.push(BreakerState {
            scope: ai_router_proto::v1::BreakerScope::Provider.into(),
            provider: "p1".into(),
            key: String::new(),
            state: ai_router_proto::v1::BreakerPhase::Open.into(),
            open_until_ms: NOW + 3_600_000,
        });
        // The second attempt of a call whose first was sent and failed: that one did fail
        // upstream.
        for (sent, code, attempts) in [(0, "pool_unavailable", "0"), (1, "upstream_error", "1")] {
            let mut host = host_with(snap.clone(), &plan, sent + 1);
            if sent > 0 {
                host.calls.insert(
                    plan.cid.clone(),
                    crate::vm::calls::Call {
                        attempts: sent,
                        last_failure: Some((Class::Transient, None)),
                        ..Default::default()
                    },
                );
            }
            let mut stage = Attempt::default();
            assert_eq!(send(&mut stage, &mut host), Flow::Pause);
            let answer = host.answered.clone().expect("a local answer");
            assert_eq!(answer.json()["error"]["code"], code, "{sent} sent");
            assert_eq!(answer.header(H_ATTEMPT), Some(attempts));
            if sent == 0 {
                assert_eq!(answer.header(H_FINAL_STATUS), Some("503"));
                // Until the breaker lets a probe through.
                assert_eq!(answer.header(H_RETRY_AFTER), Some("3600"));
            }
        }
    }

    #[test]
    fn a_failure_states_the_window_its_hold_applies() {
        const SPENT: &str = r#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        let json = [("content-type", "application/json")];
        // A quota with no window named: out for quotaBlacklistMs (6 h), and the answer says so.
        // A 429 with no retry-after: cooled for rateLimitCooldownMs (10 s).
        for (status, body, seconds) in [(429, SPENT, "21600"), (429, "{}", "10")] {
            let plan = plan(false);
            let mut host = host_with(snapshot(), &plan, 1);
            let mut stage = Attempt::default();
            send(&mut stage, &mut host);
            answer(&mut stage, &mut host, status, &json, body);
            assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
            assert_eq!(
                host.text(Side::Response, H_RETRY_AFTER).as_deref(),
                Some(seconds),
                "{body}"
            );
            // A later attempt that finds no lane left states the same window.
            let last = host.calls.get("call-1").and_then(|c| c.last_failure);
            let at = NOW + 5 + seconds.parse::<i64>().unwrap_or_default() * 1000;
            assert_eq!(last.and_then(|(_, r)| r), Some(at), "{body}");
        }
    }

    #[test]
    fn a_caller_that_went_away_is_reported_cancelled() {
        let plan = plan(false);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        host.properties.insert(
            "response.code_details".into(),
            b"downstream_remote_disconnect".to_vec(),
        );
        stage.on_log(&mut host);
        assert_eq!(host.attempts.len(), 1);
        assert_eq!(host.attempts[0].error_class().text(), "cancelled");
        assert_eq!(host.lanes.in_flight("p1", "a"), 0, "the slot is freed");
    }

    /// The token of the last timer the stage asked for, and its delay.
    fn last_timer(host: &FakeHost) -> (u32, i64) {
        let delay = timer_delays(host).last().copied().unwrap_or(-1);
        (host.next_token, delay)
    }

    /// A stream attempt at p1 whose headers and role chunk arrived and are held.
    fn held_stream(host: &mut FakeHost, stage: &mut Attempt) {
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, "content-type", b"text/event-stream");
        assert_eq!(stage.on_response_headers(host, false), Flow::Pause);
        let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
        host.response_body = role.as_bytes().to_vec();
        assert_eq!(stage.on_response_body(host, role.len(), false), Flow::Pause);
    }

    /// `text` as one content chunk after the first token.
    fn chunk(stage: &mut Attempt, host: &mut FakeHost, text: &str) -> Flow {
        let event = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
        );
        if stage.after_first_token {
            host.response_body = event.into_bytes();
        } else {
            host.response_body.extend_from_slice(event.as_bytes());
        }
        let size = host.response_body.len();
        stage.on_response_body(host, size, false)
    }

    #[test]
    fn the_attempts_timeout_starts_when_it_reaches_a_provider_not_while_it_waits() {
        let mut plan = plan(false);
        plan.tiers.truncate(1);
        plan.timeout_ms = 1_000;
        let mut snap = snapshot();
        // The only lane is back in 3 s: longer than the attempt's timeout.
        snap.cooldowns.push(LaneCooldown {
            provider: "p1".into(),
            key: "a".into(),
            model: "m1".into(),
            until_ms: NOW + 3_000,
        });
        let mut host = host_with(snap, &plan, 2);
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Pause);
        // Three slices of waiting, then the lane is back.
        for at in [NOW + 1_005, NOW + 2_005, NOW + 3_001] {
            let (wait, delay) = last_timer(&host);
            assert!((990..=TIMER_SLICE_MS).contains(&delay), "the wait: {delay}");
            assert!(host.attempts.is_empty() && host.answered.is_none());
            host.now = at;
            stage.on_http_call_response(&mut host, wait);
        }
        assert_eq!(
            host.resumed, 1,
            "the wait is over: the attempt goes to the provider"
        );
        assert!(host.answered.is_none());
        assert!(host.attempts.is_empty());
        // The attempt's own bound starts now, for the whole of timeoutMs.
        assert!(!stage.bound_due(host.now + 999));
        assert!(stage.bound_due(host.now + 1_000));
    }

    #[test]
    fn an_attempt_past_its_timeout_before_its_answer_is_retried_with_the_timeout_class() {
        for (what, stream) in [
            ("no answer at all", false),
            ("a stream held before its first token", true),
        ] {
            let plan = plan(stream);
            let mut host = host_with(snapshot(), &plan, 1);
            let mut stage = Attempt::default();
            assert_eq!(send(&mut stage, &mut host), Flow::Continue);
            assert!(host.dispatched.is_empty(), "{what}: no timer per attempt");
            let sent = host.now;
            if stream {
                held_stream(&mut host, &mut stage);
            }
            let timed_out = run_ticks(&mut stage, &mut host, sent + 60_000, |h| {
                h.answered.is_some()
            });
            assert_eq!(timed_out, sent + plan.timeout_ms as i64, "{what}");
            let answer = host
                .answered
                .clone()
                .expect("answered in the provider's place");
            assert_eq!(answer.status, 503, "{what}");
            assert_eq!(answer.header(H_RETRY), Some("1"), "{what}");
            assert_eq!(answer.header(H_FINAL_STATUS), Some("502"), "{what}");
            assert_eq!(answer.json()["error"]["code"], "upstream_error", "{what}");
            assert!(
                answer.json()["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("timeout")),
                "{what}: {:?}",
                answer.json()
            );
            assert_eq!(host.attempts.len(), 1, "{what}");
            assert_eq!(host.attempts[0].error_class().text(), "timeout", "{what}");
            assert!(!host.attempts[0].after_first_token, "{what}");
            assert_eq!(
                host.lanes.in_flight("p1", "a"),
                0,
                "{what}: the slot is freed"
            );
            let backoff = host.calls.get("call-1").map_or(0, |c| c.backoff_until_ms);
            assert!(backoff > host.now, "{what}: the next attempt backs off");
            // The stage's own answer passes back through it untouched.
            host.response_headers.clear();
            host.add(Side::Response, ":status", b"503");
            host.add(Side::Response, H_RETRY, b"1");
            assert_eq!(stage.on_response_headers(&mut host, false), Flow::Continue);
            assert_eq!(host.text(Side::Response, H_RETRY).as_deref(), Some("1"));
            host.response_body = answer.body.clone();
            let size = host.response_body.len();
            assert_eq!(
                stage.on_response_body(&mut host, size, true),
                Flow::Continue
            );
            assert_eq!(host.response_body, answer.body, "{what}");
            assert_eq!(host.attempts.len(), 1, "{what}: reported once");
        }
    }

    /// Lets the clock run a tick at a time, checking the attempt's bound as the host does, until
    /// `done` or `until`; returns the time it stopped at.
    fn run_ticks(
        stage: &mut Attempt,
        host: &mut FakeHost,
        until: i64,
        done: impl Fn(&FakeHost) -> bool,
    ) -> i64 {
        while !done(host) && host.now < until {
            host.now += BOUND_TICK_MS as i64;
            if stage.bound_due(host.now) {
                stage.on_bound(host);
            }
        }
        host.now
    }

    #[test]
    fn chunks_after_the_first_token_move_the_bound_on() {
        let mut plan = plan(true);
        plan.timeout_ms = 3_000;
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        let sent = host.now;
        held_stream(&mut host, &mut stage);
        // The first token at 2 s, the next chunk at 4 s: the bound is now 7 s.
        run_ticks(&mut stage, &mut host, sent + 2_000, |_| false);
        assert_eq!(
            chunk(&mut stage, &mut host, "Hi"),
            Flow::Continue,
            "released"
        );
        run_ticks(&mut stage, &mut host, sent + 4_000, |_| false);
        assert_eq!(chunk(&mut stage, &mut host, " there"), Flow::Continue);
        assert!(host.attempts.is_empty() && host.resets == 0);
        let cut = run_ticks(&mut stage, &mut host, sent + 60_000, |h| h.resets > 0);
        assert_eq!(cut, sent + 7_000, "timeoutMs after the last chunk");
        assert_eq!(host.attempts.len(), 1);
        assert_eq!(host.attempts[0].error_class().text(), "timeout");
        assert!(!stage.bound_due(host.now), "decided once");
    }

    /// A stream attempt at p1 that sent its first token ("Hi").
    fn a_stream_past_its_first_token() -> (Plan, FakeHost, Attempt) {
        let plan = plan(true);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        held_stream(&mut host, &mut stage);
        assert_eq!(chunk(&mut stage, &mut host, "Hi"), Flow::Continue);
        (plan, host, stage)
    }

    #[test]
    fn a_gap_past_the_timeout_after_the_first_token_cuts_the_stream() {
        let (plan, mut host, mut stage) = a_stream_past_its_first_token();
        let last_chunk = host.now;
        let cut = run_ticks(&mut stage, &mut host, last_chunk + 60_000, |h| h.resets > 0);
        // Nothing can be added to a stream whose provider is silent: it is reset.
        assert_eq!(cut, last_chunk + plan.timeout_ms as i64);
        assert_eq!(host.resets, 1);
        assert!(host.answered.is_none());
        assert_eq!(host.attempts.len(), 1);
        let report = &host.attempts[0];
        assert_eq!(
            (report.outcome().text(), report.error_class().text()),
            ("error", "timeout")
        );
        assert!(report.after_first_token);
        assert_eq!(
            host.calls
                .get("call-1")
                .and_then(|c| c.broken_after_first_token),
            Some(Class::Timeout),
            "the front stage reports the call as failed"
        );
        // Whatever the provider still sends is dropped, and the end reports nothing more.
        assert_eq!(chunk(&mut stage, &mut host, "late"), Flow::Continue);
        assert!(host.response_body.is_empty());
        stage.on_log(&mut host);
        assert_eq!(host.attempts.len(), 1);
    }

    #[test]
    fn a_stream_whose_answer_is_complete_has_no_gap_to_time_out() {
        let (plan, mut host, mut stage) = a_stream_past_its_first_token();
        host.response_body = b"data: [DONE]\n\n".to_vec();
        let size = host.response_body.len();
        assert_eq!(
            stage.on_response_body(&mut host, size, false),
            Flow::Continue
        );
        // The provider keeps its stream open past timeoutMs: the answer is whole, no cut.
        let later = host.now + 3 * plan.timeout_ms as i64;
        run_ticks(&mut stage, &mut host, later, |_| false);
        assert_eq!(host.resets, 0);
        assert!(host.attempts.is_empty());
    }

    #[test]
    fn a_streams_usage_is_noted_on_the_call_even_when_the_client_did_not_ask() {
        let (plan, mut host, mut stage) = a_stream_past_its_first_token();
        assert!(!plan.include_usage);
        host.response_body = b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n\
data: [DONE]\n\n"
            .to_vec();
        let size = host.response_body.len();
        stage.on_response_body(&mut host, size, true);
        let out = String::from_utf8_lossy(&host.response_body).to_string();
        assert!(!out.contains("usage"), "the client did not ask: {out}");
        let call = host.calls.get(&plan.cid).cloned().unwrap_or_default();
        assert_eq!(
            call.answered_usage,
            Some(Usage {
                prompt_tokens: 9,
                completion_tokens: 4,
                cached_tokens: 2
            })
        );
    }

    #[test]
    fn an_answer_without_usage_is_reported_at_the_estimate_and_says_so() {
        use ai_router_proto::v1::UsageSource;
        // Unary: the request's prompt estimate and the answer's text, 4 characters a token.
        let mut plan = plan(false);
        plan.prompt_tokens = 12;
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        let text = "word ".repeat(40);
        answer(
            &mut stage,
            &mut host,
            200,
            &[("content-type", "application/json")],
            &serde_json::json!({ "choices": [{ "message": { "role": "assistant", "content": text } }] })
                .to_string(),
        );
        let usage = host.attempts[0].usage.unwrap_or_default();
        assert_eq!(
            (usage.prompt_tokens, usage.completion_tokens, usage.source()),
            (12, 50, UsageSource::Estimated)
        );
        // The provider's figures when it reports them.
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        answer(
            &mut stage,
            &mut host,
            200,
            &[("content-type", "application/json")],
            r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        );
        let usage = host.attempts[0].usage.unwrap_or_default();
        assert_eq!(
            (usage.prompt_tokens, usage.completion_tokens, usage.source()),
            (3, 2, UsageSource::Reported)
        );
        // A stream that ends without its usage chunk: the deltas' text.
        let (plan, mut host, mut stage) = a_stream_past_its_first_token();
        host.response_body =
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"abcdefgh\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: [DONE]\n\n"
                .to_vec();
        let size = host.response_body.len();
        stage.on_response_body(&mut host, size, true);
        let usage = host.attempts[0].usage.unwrap_or_default();
        assert_eq!(usage.source(), UsageSource::Estimated);
        assert_eq!(usage.prompt_tokens, plan.prompt_tokens);
        // "Hi" (1 token) released the stream, "abcdefgh" (2) came after it.
        assert_eq!(usage.completion_tokens, 3, "{usage:?}");
        // A failure before any answer used nothing.
        let plan = self::plan(false);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        answer(&mut stage, &mut host, 503, &[], "{}");
        assert_eq!(host.attempts[0].usage, None);
    }

    #[test]
    fn a_bound_past_after_the_verdict_changes_nothing() {
        let plan = plan(false);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        answer(
            &mut stage,
            &mut host,
            200,
            &[("content-type", "application/json")],
            r#"{"choices":[{"message":{"content":"hello"}}]}"#,
        );
        host.now += plan.timeout_ms as i64;
        assert!(!stage.bound_due(host.now));
        stage.on_bound(&mut host);
        assert_eq!(host.attempts.len(), 1);
        assert_eq!(host.attempts[0].outcome().text(), "success");
        assert!(host.answered.is_none() && host.resets == 0);
    }

    /// A call of `protocol` with `body`, whose first lane is p1 of `kind`.
    fn ingress_call(
        kind: ProviderKind,
        protocol: Protocol,
        stream: bool,
        body: Value,
    ) -> (FakeHost, Attempt) {
        let mut snap = snapshot();
        snap.providers[0] = provider("p1", kind, &["a"], "m1");
        let mut plan = plan(stream);
        plan.protocol = protocol;
        plan.include_usage = true;
        plan.anthropic_version = Some("2024-10-22".into());
        plan.anthropic_beta = Some("prompt-caching-2024-07-31".into());
        let mut host = host_with(snap, &plan, 1);
        host.request_body = body.to_string().into_bytes();
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Continue);
        (host, stage)
    }

    fn path_of(host: &FakeHost) -> String {
        host.text(Side::Request, ":path").unwrap_or_default()
    }

    fn sent(host: &FakeHost) -> Value {
        serde_json::from_slice(&host.request_body).unwrap_or(Value::Null)
    }

    fn answered(host: &FakeHost) -> Value {
        serde_json::from_slice(&host.response_body).unwrap_or(Value::Null)
    }

    fn messages_body(stream: bool) -> Value {
        serde_json::json!({ "model": "claude", "max_tokens": 256, "stream": stream,
            "system": [{ "type": "text", "text": "Be brief.", "cache_control": { "type": "ephemeral" } }],
            "thinking": { "type": "enabled", "budget_tokens": 128 },
            "messages": [{ "role": "user", "content": "Hi" }] })
    }

    #[test]
    fn messages_reach_an_anthropic_lane_as_the_caller_wrote_them() {
        let body = messages_body(false);
        let (mut host, mut stage) = ingress_call(
            ProviderKind::Anthropic,
            Protocol::Messages,
            false,
            body.clone(),
        );
        assert_eq!(path_of(&host), "/v1/messages");
        let mut expected = body;
        expected["model"] = "m1".into();
        assert_eq!(sent(&host), expected, "only the model is rewritten");
        for (name, value) in [
            ("anthropic-version", "2024-10-22"),
            ("anthropic-beta", "prompt-caching-2024-07-31"),
            ("x-api-key", "sk-p1-a-secret"),
        ] {
            assert_eq!(host.text(Side::Request, name).as_deref(), Some(value));
        }
        let message = r#"{"id":"msg_1","type":"message","role":"assistant","model":"m1","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"cache_read_input_tokens":5,"cache_creation_input_tokens":1,"output_tokens":2}}"#;
        answer(
            &mut stage,
            &mut host,
            200,
            &[("content-type", "application/json")],
            message,
        );
        assert_eq!(
            answered(&host),
            serde_json::from_str::<Value>(message).unwrap_or(Value::Null),
            "the answer goes back as it came"
        );
        let usage = host.attempts[0].usage.unwrap_or_default();
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens
            ),
            (9, 5, 2)
        );
    }

    #[test]
    fn a_native_messages_stream_is_held_then_ends_with_an_anthropic_error_event() {
        let (mut host, mut stage) = ingress_call(
            ProviderKind::Anthropic,
            Protocol::Messages,
            true,
            messages_body(true),
        );
        assert!(
            sent(&host).get("stream_options").is_none(),
            "no OpenAI field for Anthropic"
        );
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, "content-type", b"text/event-stream");
        stage.on_response_headers(&mut host, false);
        let head = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        );
        host.response_body = head.as_bytes().to_vec();
        assert_eq!(
            stage.on_response_body(&mut host, head.len(), false),
            Flow::Pause,
            "held"
        );
        let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
        host.response_body.extend_from_slice(delta.as_bytes());
        let size = host.response_body.len();
        assert_eq!(
            stage.on_response_body(&mut host, size, false),
            Flow::Continue
        );
        assert_eq!(
            String::from_utf8_lossy(&host.response_body),
            format!("{head}{delta}")
        );
        let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        host.response_body = error.as_bytes().to_vec();
        stage.on_response_body(&mut host, error.len(), false);
        let out = String::from_utf8_lossy(&host.response_body).to_string();
        assert!(out.starts_with("event: error\ndata: "), "{out}");
        assert!(
            out.contains("\"stream_interrupted\"") && out.contains("Overloaded"),
            "{out}"
        );
        assert_eq!(host.attempts[0].outcome().text(), "error");
        assert!(host.attempts[0].after_first_token);
    }

    #[test]
    fn messages_reach_an_openai_lane_as_chat_and_come_back_as_messages() {
        let (mut host, mut stage) = ingress_call(
            ProviderKind::OpenaiCompatible,
            Protocol::Messages,
            false,
            messages_body(false),
        );
        assert_eq!(path_of(&host), "/v1/chat/completions");
        let body = sent(&host);
        assert_eq!(body["model"], "m1");
        assert_eq!(body["max_tokens"], 256);
        assert_eq!(
            body["messages"][0],
            serde_json::json!({ "role": "system", "content": "Be brief." })
        );
        assert!(body.get("thinking").is_none());
        assert!(host.header(Side::Request, "anthropic-version").is_none());
        answer(
            &mut stage,
            &mut host,
            200,
            &[("content-type", "application/json")],
            r#"{"id":"chatcmpl-7","model":"m1","choices":[{"message":{"role":"assistant","content":"Hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        );
        let message = answered(&host);
        assert_eq!(message["type"], "message");
        assert_eq!(message["content"][0]["text"], "Hi");
        assert_eq!(message["stop_reason"], "max_tokens");
        assert_eq!(host.attempts[0].usage.map(|u| u.prompt_tokens), Some(3));
    }

    #[test]
    fn a_chat_stream_becomes_messages_events_for_a_messages_caller() {
        let (mut host, mut stage) = ingress_call(
            ProviderKind::OpenaiCompatible,
            Protocol::Messages,
            true,
            messages_body(true),
        );
        assert_eq!(sent(&host)["stream_options"]["include_usage"], true);
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, "content-type", b"text/event-stream");
        stage.on_response_headers(&mut host, false);
        let role = "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
        host.response_body = role.as_bytes().to_vec();
        assert_eq!(
            stage.on_response_body(&mut host, role.len(), false),
            Flow::Pause
        );
        let token = "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        host.response_body.extend_from_slice(token.as_bytes());
        let size = host.response_body.len();
        stage.on_response_body(&mut host, size, false);
        let out = String::from_utf8_lossy(&host.response_body).to_string();
        assert!(out.starts_with("event: message_start\n"), "{out}");
        assert!(out.contains("\"text_delta\""), "{out}");
        // Cut after the first token: the Anthropic error event, never message_stop.
        host.response_body = b"data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"}}]}\n\n".to_vec();
        let size = host.response_body.len();
        stage.on_response_body(&mut host, size, true);
        let out = String::from_utf8_lossy(&host.response_body).to_string();
        assert!(
            out.contains("event: error\n") && !out.contains("message_stop"),
            "{out}"
        );
        assert_eq!(host.attempts[0].outcome().text(), "error");
    }

    #[test]
    fn a_responses_call_reaches_an_anthropic_lane_through_both_adapters() {
        let body = serde_json::json!({ "model": "chat", "instructions": "Be brief.",
            "input": "Hi", "max_output_tokens": 64 });
        let (mut host, mut stage) =
            ingress_call(ProviderKind::Anthropic, Protocol::Responses, false, body);
        assert_eq!(path_of(&host), "/v1/messages");
        let sent = sent(&host);
        assert_eq!(sent["system"], "Be brief.");
        assert_eq!(sent["max_tokens"], 64);
        assert_eq!(
            host.text(Side::Request, "anthropic-version").as_deref(),
            Some(ANTHROPIC_VERSION),
            "the adapter's own version, not a Messages caller's"
        );
        answer(
            &mut stage,
            &mut host,
            200,
            &[("content-type", "application/json")],
            r#"{"id":"msg_1","type":"message","model":"m1","content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":2}}"#,
        );
        let response = answered(&host);
        assert_eq!(response["object"], "response");
        assert_eq!(response["instructions"], "Be brief.");
        assert_eq!(response["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(response["usage"]["output_tokens"], 2);
    }

    #[test]
    fn a_messages_block_an_openai_lane_cannot_take_is_the_callers_400() {
        let body = serde_json::json!({ "model": "claude", "max_tokens": 8, "messages": [{ "role": "user",
            "content": [{ "type": "document", "source": { "type": "base64", "media_type": "application/pdf", "data": "JVBERi0=" } }] }] });
        let mut snap = snapshot();
        snap.providers.truncate(1);
        let mut plan = plan(false);
        plan.protocol = Protocol::Messages;
        plan.tiers.truncate(1);
        let mut host = host_with(snap, &plan, 1);
        host.request_body = body.to_string().into_bytes();
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Pause);
        let a = host.answered.clone().expect("answered");
        assert_eq!(a.status, 400);
        assert!(a.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("'document'"));
    }

    #[test]
    fn a_stateful_responses_call_reaches_an_openai_lane_natively() {
        let body = serde_json::json!({ "model": "chat", "input": "Hi", "store": true,
            "stream": true, "previous_response_id": "resp_1", "tools": [{ "type": "web_search" }] });
        let (mut host, mut stage) = ingress_call(
            ProviderKind::Openai,
            Protocol::Responses,
            true,
            body.clone(),
        );
        assert_eq!(path_of(&host), "/v1/responses");
        let mut expected = body;
        expected["model"] = "m1".into();
        assert_eq!(sent(&host), expected, "only the model is rewritten");
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, "content-type", b"text/event-stream");
        stage.on_response_headers(&mut host, false);
        let created =
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{}}\n\n";
        host.response_body = created.as_bytes().to_vec();
        assert_eq!(
            stage.on_response_body(&mut host, created.len(), false),
            Flow::Pause
        );
        let rest = concat!(
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
        );
        host.response_body.extend_from_slice(rest.as_bytes());
        let size = host.response_body.len();
        stage.on_response_body(&mut host, size, true);
        assert_eq!(
            String::from_utf8_lossy(&host.response_body),
            format!("{created}{rest}"),
            "passed through as it came"
        );
        assert_eq!(host.attempts[0].outcome().text(), "success");
        assert_eq!(host.attempts[0].usage.map(|u| u.prompt_tokens), Some(3));
    }

    fn with_content(mut snap: Snapshot) -> Snapshot {
        snap.limits = Some(ai_router_proto::v1::Limits {
            include_content: true,
            ..Default::default()
        });
        snap
    }

    #[test]
    fn without_include_content_a_report_carries_no_content() {
        let plan = plan(false);
        let mut host = host_with(snapshot(), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        let ok = r#"{"choices":[{"message":{"content":"the answer"}}]}"#;
        answer(
            &mut stage,
            &mut host,
            200,
            &[("content-type", "application/json")],
            ok,
        );
        assert_eq!(host.attempts[0].content, None);
    }

    #[test]
    fn with_include_content_a_report_carries_the_request_and_the_answer_key_redacted() {
        let plan = plan(false);
        let mut host = host_with(with_content(snapshot()), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        let refused = r#"{"error":{"message":"Incorrect API key provided: sk-p1-a-secret","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        answer(
            &mut stage,
            &mut host,
            401,
            &[("content-type", "application/json")],
            refused,
        );
        let content = host.attempts[0].content.clone().unwrap();
        assert_eq!(
            content.request, r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#,
            "the caller's body, as it sent it"
        );
        assert!(content
            .response
            .contains("Incorrect API key provided: [redacted]"));
        assert!(!content.response.contains("sk-p1-a-secret"));
        assert!(!content.request_truncated && !content.response_truncated);
    }

    #[test]
    fn with_include_content_a_streams_report_carries_its_events() {
        let plan = plan(true);
        let mut host = host_with(with_content(snapshot()), &plan, 1);
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, "content-type", b"text/event-stream");
        assert_eq!(stage.on_response_headers(&mut host, false), Flow::Pause);
        let token = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        host.response_body = token.as_bytes().to_vec();
        assert_eq!(
            stage.on_response_body(&mut host, token.len(), false),
            Flow::Continue
        );
        let done = "data: [DONE]\n\n";
        host.response_body = done.as_bytes().to_vec();
        stage.on_response_body(&mut host, done.len(), true);
        let content = host.attempts[0].content.clone().unwrap();
        assert_eq!(content.response, format!("{token}{done}"));
        assert!(content.request.contains("\"stream\":true"));
    }
}
