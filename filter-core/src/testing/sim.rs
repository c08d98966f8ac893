//! A call through the gateway in memory, as the rendered Envoy runs it
//! (`control-plane/src/render.rs`):
//!
//! ```text
//! caller → front stage (public listener) → router ─┬→ attempt stage (internal listener) → provider
//!                                                  └─ retried while the attempt's answer says so
//! caller ← front stage ← the last attempt's answer ┘
//! ```
//!
//! Every stage runs over one [`FakeHost`], [`CallSim::vm`]: the data the workers of one Envoy
//! share (the call table, holds and blacklists, in-flight counts, sends, parked lanes, reports,
//! the clock and the state). What one attempt writes there the next attempt, and the next call,
//! reads. Each stream (the caller's, each attempt's) has its own headers, bodies and local
//! answer, swapped in while its stage runs.
//!
//! The router, as rendered: it retries when the attempt's answer carries
//! [`ai_router_contract::headers::RETRY`], has status 502 or 503, or the attempt's stream was
//! reset before its answer started (`retry_on: retriable-headers, retriable-status-codes,
//! reset, connect-failure`), at most `x-envoy-max-retries` times (set by the front stage; else
//! the renderer's `num_retries`: the largest `maxAttempts` less one), each attempt numbered by
//! `x-envoy-attempt-count`. A provider that breaks off while the attempt stage holds its
//! answer (before the first token) is answered on the attempt listener by Envoy itself (a 503,
//! retried); after the first token, the caller's stream is cut.
//!
//! In a test (`sim_tests.rs` has whole ones):
//! ```text
//! let mut sim = CallSim::new(state);
//! sim.reply(Reply::json(429, &json!({"error": {"message": "slow down"}})))
//!     .reply(Reply::json(200, &ok_body));
//! let got = sim.call(Request::chat(KEY, &json!({"model": "chat", "messages": [...]})));
//! assert_eq!(got.status, 200);
//! assert_eq!(got.sent.len(), 2);             // what each attempt sent to a provider
//! assert!(!sim.vm.lanes.holds(&lane).is_empty()); // the shared store after the call
//! ```
//!
//! Not simulated: the attempt's own timeout (the host's tick), the probe lease and the shared
//! cache tier (gRPC calls: a stage that dispatches one panics the test), the caller going away.

use std::collections::VecDeque;

use serde_json::Value;

use super::{Dispatched, FakeHost, LocalAnswer};
use crate::attempt::Attempt;
use crate::front::Front;
use crate::host::Flow;
use crate::state::State;

/// What Envoy answers in place of an attempt whose provider broke off before its answer
/// started (or while the attempt stage held it): the router's own 503.
const RESET_BODY: &[u8] =
    b"upstream connect error or disconnect/reset before headers. reset reason: connection termination";
/// `response.code_details` of a stream whose upstream broke off after its answer started.
const CUT_DETAILS: &[u8] = b"upstream_reset_after_response_started{connection_termination}";
/// The router's retry back-off (`retry_back_off.base_interval`): the clock moves this much
/// between two attempts.
const RETRY_BACK_OFF_MS: i64 = 10;

/// One Envoy running calls: the shared store and the providers' scripted replies.
pub struct CallSim {
    /// The data the workers share, the clock and the state; read it after a call.
    pub vm: FakeHost,
    /// What the providers answer, one reply per attempt that reaches one, in order.
    replies: VecDeque<Reply>,
    /// The router's retries when the front stage names none.
    retries: u32,
    calls: u32,
}

/// A provider's scripted reply to one attempt.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The body as it arrives, one chunk per callback.
    pub chunks: Vec<Vec<u8>>,
    /// The provider's connection breaks after this many chunks (0: right after its headers).
    pub reset_after: Option<usize>,
}

impl Reply {
    /// A status with no headers and no body yet.
    pub fn status(status: u16) -> Self {
        Self {
            status,
            ..Self::default()
        }
    }

    /// A JSON answer in one chunk.
    pub fn json(status: u16, body: &Value) -> Self {
        Self::status(status)
            .header("content-type", "application/json")
            .chunk(body.to_string().as_bytes())
    }

    /// A 200 event stream, one `data:` event per chunk (`[DONE]` is not added).
    pub fn sse(events: &[&str]) -> Self {
        let mut reply = Self::status(200).header("content-type", "text/event-stream");
        for e in events {
            reply = reply.chunk(format!("data: {e}\n\n").as_bytes());
        }
        reply
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// One more chunk of the body.
    pub fn chunk(mut self, bytes: &[u8]) -> Self {
        self.chunks.push(bytes.to_vec());
        self
    }

    /// The connection breaks after `chunks` chunks of the body.
    pub fn reset_after(mut self, chunks: usize) -> Self {
        self.reset_after = Some(chunks);
        self
    }
}

/// The caller's request.
#[derive(Debug, Clone)]
pub struct Request {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// `POST path` with a JSON body, authenticated with the virtual key `key` (a bearer).
    pub fn post(path: &str, key: &str, body: &Value) -> Self {
        Self {
            headers: vec![
                (":method".into(), "POST".into()),
                (":path".into(), path.into()),
                (":authority".into(), "gateway".into()),
                ("content-type".into(), "application/json".into()),
                ("authorization".into(), format!("Bearer {key}")),
            ],
            body: body.to_string().into_bytes(),
        }
    }

    /// An OpenAI chat completion.
    pub fn chat(key: &str, body: &Value) -> Self {
        Self::post("/v1/chat/completions", key, body)
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.retain(|(k, _)| k != name);
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// What the caller received, and what the providers were sent on the way.
#[derive(Debug, Clone, Default)]
pub struct Received {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The answer broke off (the caller saw its connection cut).
    pub cut: bool,
    /// What each attempt sent to a provider, in order.
    pub sent: Vec<Sent>,
    /// The attempts the router ran (one that found no lane sent nothing).
    pub attempts: u32,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The `data:` payloads of an event stream, in order (`[DONE]` included).
    pub fn events(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.trim().to_string())
            .collect()
    }
}

/// A request as the attempt stage sent it to a provider.
#[derive(Debug, Clone)]
pub struct Sent {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Sent {
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

fn find<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// One stream's own part of the host: swapped into [`CallSim::vm`] while its stage runs.
#[derive(Default)]
struct Stream {
    request_headers: Vec<(String, Vec<u8>)>,
    response_headers: Vec<(String, Vec<u8>)>,
    request_body: Vec<u8>,
    response_body: Vec<u8>,
    answered: Option<LocalAnswer>,
    resets: u32,
    resumed: u32,
    properties: std::collections::HashMap<String, Vec<u8>>,
}

impl Stream {
    fn swap(&mut self, vm: &mut FakeHost) {
        std::mem::swap(&mut self.request_headers, &mut vm.request_headers);
        std::mem::swap(&mut self.response_headers, &mut vm.response_headers);
        std::mem::swap(&mut self.request_body, &mut vm.request_body);
        std::mem::swap(&mut self.response_body, &mut vm.response_body);
        std::mem::swap(&mut self.answered, &mut vm.answered);
        std::mem::swap(&mut self.resets, &mut vm.resets);
        std::mem::swap(&mut self.resumed, &mut vm.resumed);
        std::mem::swap(&mut self.properties, &mut vm.properties);
    }
}

/// An answer on the hop from the attempt listener back to the router: headers (`:status`
/// among them) and the body chunks the attempt stage let through.
struct Hop {
    headers: Vec<(String, Vec<u8>)>,
    chunks: Vec<Vec<u8>>,
    cut: bool,
}

impl Hop {
    fn status(&self) -> u16 {
        self.header(":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
    fn local(answer: LocalAnswer) -> Self {
        let mut headers = vec![(
            ":status".to_string(),
            answer.status.to_string().into_bytes(),
        )];
        headers.extend(answer.headers.into_iter().map(|(k, v)| (k, v.into_bytes())));
        Self {
            headers,
            chunks: match answer.body.is_empty() {
                true => Vec::new(),
                false => vec![answer.body],
            },
            cut: false,
        }
    }
    /// Envoy's own 503 for an attempt whose provider broke off before its answer started.
    fn reset() -> Self {
        Self::local(LocalAnswer {
            status: 503,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: RESET_BODY.to_vec(),
        })
    }
    /// Whether the router tries again on this answer (the rendered `retry_policy`).
    fn retried(&self) -> bool {
        matches!(self.status(), 502 | 503)
            || self.header(ai_router_contract::headers::RETRY).is_some()
    }
}

impl CallSim {
    /// An Envoy with this state, nothing shared yet, and the clock at 1,700,000,000,000 ms.
    pub fn new(state: State) -> Self {
        // The renderer's `num_retries`: the largest `maxAttempts` of any policy, less one.
        let snapshot = &state.snapshot;
        let max_attempts = snapshot
            .profiles
            .values()
            .filter_map(|p| p.max_attempts)
            .fold(
                snapshot
                    .defaults
                    .as_ref()
                    .and_then(|d| d.max_attempts)
                    .unwrap_or_default(),
                u32::max,
            );
        Self {
            vm: FakeHost::builder().state(state).build(),
            replies: VecDeque::new(),
            retries: max_attempts.max(1) - 1,
            calls: 0,
        }
    }

    /// The next attempt to reach a provider gets this reply.
    pub fn reply(&mut self, reply: Reply) -> &mut Self {
        self.replies.push_back(reply);
        self
    }

    /// The replies no attempt has taken yet.
    pub fn replies_left(&self) -> usize {
        self.replies.len()
    }

    /// Runs one caller request to its end: front stage, attempts as the router retries them,
    /// front stage again, and both stages' logs.
    pub fn call(&mut self, request: Request) -> Received {
        self.calls += 1;
        let mut caller = Stream {
            request_headers: request
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
                .collect(),
            request_body: request.body.clone(),
            ..Stream::default()
        };
        if find(&request.headers, "x-request-id").is_none() {
            // Envoy's `generate_request_id`.
            let rid = format!("rid-{}", self.calls).into_bytes();
            caller.request_headers.push(("x-request-id".into(), rid));
        }
        let len = request.body.len().to_string().into_bytes();
        caller.request_headers.push(("content-length".into(), len));
        let mut front = Front::default();
        caller.swap(&mut self.vm);
        let since = self.vm.dispatched.len();
        let flow = front.on_request_headers(&mut self.vm, request.body.is_empty());
        let flow = match (flow, self.vm.answered.is_some()) {
            (_, true) => Flow::Pause,
            (flow, false) if request.body.is_empty() => flow,
            _ => front.on_request_body(&mut self.vm, request.body.len(), true),
        };
        self.wait(since, flow, |vm, token| {
            front.on_http_call_response(vm, token)
        });
        let mut received = Received::default();
        let hop = match self.vm.answered.take() {
            // The front stage's own answer goes back through its response callbacks.
            Some(answer) => Hop::local(answer),
            None => {
                let mut forwarded = Stream {
                    request_headers: self.vm.request_headers.clone(),
                    request_body: self.vm.request_body.clone(),
                    ..Stream::default()
                };
                caller.swap(&mut self.vm);
                let hop = self.route(&mut forwarded, &mut received);
                caller.swap(&mut self.vm);
                hop
            }
        };
        self.answer(&mut front, hop, &mut received);
        front.on_log(&mut self.vm);
        caller.swap(&mut self.vm);
        received
    }

    /// The router: attempts until one's answer is not retried or the retries run out.
    fn route(&mut self, forwarded: &mut Stream, received: &mut Received) -> Hop {
        let header = |name: &str| {
            forwarded
                .request_headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u32>().ok())
        };
        let retries = header("x-envoy-max-retries").unwrap_or(self.retries);
        // Headers the router consumes.
        forwarded
            .request_headers
            .retain(|(k, _)| k != "x-envoy-max-retries" && k != "x-envoy-upstream-rq-timeout-ms");
        let mut n = 0;
        loop {
            n += 1;
            let hop = self.attempt(n, forwarded, received);
            received.attempts = n;
            if n > retries || !hop.retried() {
                return hop;
            }
            self.vm.now += RETRY_BACK_OFF_MS;
        }
    }

    /// Attempt `n` on the internal listener, to its provider and back.
    fn attempt(&mut self, n: u32, forwarded: &Stream, received: &mut Received) -> Hop {
        let mut stream = Stream {
            request_headers: forwarded.request_headers.clone(),
            request_body: forwarded.request_body.clone(),
            ..Stream::default()
        };
        let count = n.to_string().into_bytes();
        stream
            .request_headers
            .push(("x-envoy-attempt-count".into(), count));
        let mut stage = Attempt::default();
        stream.swap(&mut self.vm);
        let since = self.vm.dispatched.len();
        let size = self.vm.request_body.len();
        let mut flow = stage.on_request_headers(&mut self.vm, size == 0);
        if flow == Flow::Pause && self.vm.answered.is_none() && size > 0 {
            flow = stage.on_request_body(&mut self.vm, size, true);
        }
        self.wait(since, flow, |vm, token| {
            stage.on_http_call_response(vm, token)
        });
        let hop = match self.vm.answered.take() {
            // The stage answered before any provider (the call's final error): through its
            // own response callbacks, as Envoy sends a local reply.
            Some(answer) => {
                let hop = Hop::local(answer);
                self.vm.response_headers = hop.headers.clone();
                let body = hop.chunks.concat();
                stage.on_response_headers(&mut self.vm, body.is_empty());
                let mut chunks = Vec::new();
                if !body.is_empty() {
                    chunks.extend(feed(&mut self.vm, &body, true, |vm, size, eos| {
                        stage.on_response_body(vm, size, eos)
                    }));
                }
                Hop {
                    headers: std::mem::take(&mut self.vm.response_headers),
                    chunks,
                    cut: false,
                }
            }
            None => self.provider(&mut stage, received),
        };
        stage.on_log(&mut self.vm);
        stream.swap(&mut self.vm);
        hop
    }

    /// The provider's reply to the request the attempt stage built, through the stage.
    #[allow(clippy::panic)] // a test with fewer replies than attempts is a test bug
    fn provider(&mut self, stage: &mut Attempt, received: &mut Received) -> Hop {
        received.sent.push(Sent {
            headers: self
                .vm
                .request_headers
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect(),
            body: self.vm.request_body.clone(),
        });
        let Some(reply) = self.replies.pop_front() else {
            panic!(
                "attempt {} reached a provider and no reply is scripted for it",
                received.sent.len()
            );
        };
        self.vm
            .response_headers
            .push((":status".into(), reply.status.to_string().into_bytes()));
        for (k, v) in &reply.headers {
            self.vm
                .response_headers
                .push((k.clone(), v.clone().into_bytes()));
        }
        let breaks_at = reply.reset_after.unwrap_or(usize::MAX);
        let headers_only = reply.chunks.is_empty() && reply.reset_after.is_none();
        let flow = stage.on_response_headers(&mut self.vm, headers_only);
        // The stage's headers go on when a callback of its answer continues.
        let mut released = flow == Flow::Continue;
        let mut chunks = Vec::new();
        let last = reply.chunks.len().min(breaks_at);
        for (i, chunk) in reply.chunks.iter().take(breaks_at).enumerate() {
            if self.vm.answered.is_some() {
                break;
            }
            let eos = i + 1 == last && reply.reset_after.is_none();
            let out = feed(&mut self.vm, chunk, eos, |vm, size, eos| {
                stage.on_response_body(vm, size, eos)
            });
            if let Some(out) = out {
                released = true;
                chunks.push(out);
            }
        }
        if let Some(answer) = self.vm.answered.take() {
            // Answered in place of the provider's (a verdict with no body to write into).
            return Hop::local(answer);
        }
        let reset = reply.reset_after.is_some() || self.vm.resets > 0;
        if reset {
            self.vm
                .properties
                .insert("response.code_details".into(), CUT_DETAILS.to_vec());
            if !released {
                // Nothing of this answer left the attempt listener: Envoy answers there.
                return Hop::reset();
            }
        }
        Hop {
            headers: std::mem::take(&mut self.vm.response_headers),
            chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(),
            cut: reset,
        }
    }

    /// The answer through the front stage's response callbacks, into what the caller receives.
    fn answer(&mut self, front: &mut Front, hop: Hop, received: &mut Received) {
        self.vm.response_headers = hop.headers;
        let ends_with_headers = hop.chunks.is_empty() && !hop.cut;
        front.on_response_headers(&mut self.vm, ends_with_headers);
        let last = hop.chunks.len();
        for (i, chunk) in hop.chunks.iter().enumerate() {
            let eos = i + 1 == last && !hop.cut;
            let out = feed(&mut self.vm, chunk, eos, |vm, size, eos| {
                front.on_response_body(vm, size, eos)
            });
            received.body.extend(out.unwrap_or_default());
        }
        if hop.cut {
            self.vm
                .properties
                .insert("response.code_details".into(), CUT_DETAILS.to_vec());
        }
        received.cut = hop.cut;
        for (k, v) in std::mem::take(&mut self.vm.response_headers) {
            let v = String::from_utf8_lossy(&v).into_owned();
            match k.as_str() {
                ":status" => received.status = v.parse().unwrap_or(0),
                _ => received.headers.push((k, v)),
            }
        }
    }

    /// A paused stage's timers fire (the clock jumps to each) until it goes on or answers.
    #[allow(clippy::panic)] // a stage waiting on what the simulator cannot answer is a test bug
    /// `since`: the calls dispatched before the stage's callbacks ran.
    fn wait(&mut self, since: usize, mut flow: Flow, mut on_timer: impl FnMut(&mut FakeHost, u32)) {
        let mut seen = since;
        while flow == Flow::Pause && self.vm.answered.is_none() {
            let Some(call) = self
                .vm
                .dispatched
                .get(seen..)
                .and_then(|d| d.last())
                .cloned()
            else {
                // Waiting for the body or the state: nothing the simulator drives.
                return;
            };
            seen = self.vm.dispatched.len();
            let Dispatched::Http { cluster, headers } = call else {
                panic!("the stage dispatched a gRPC call ({call:?}); the simulator answers timers only");
            };
            if cluster != ai_router_contract::clusters::TIMER {
                panic!("the stage called {cluster}; the simulator answers timers only");
            }
            let delay: i64 = find(&headers, "x-envoy-fault-delay-request")
                .and_then(|d| d.parse().ok())
                .unwrap_or(0);
            self.vm.now += delay;
            let resumed = self.vm.resumed;
            let token = self.vm.next_token;
            on_timer(&mut self.vm, token);
            if self.vm.resumed > resumed {
                flow = Flow::Continue;
            }
        }
    }
}

/// One body callback as Envoy makes it: the chunk joins what the filter kept buffered, and
/// what it lets through (all of it, once it continues or the body ends) is returned.
fn feed(
    vm: &mut FakeHost,
    chunk: &[u8],
    end_of_stream: bool,
    callback: impl FnOnce(&mut FakeHost, usize, bool) -> Flow,
) -> Option<Vec<u8>> {
    vm.response_body.extend_from_slice(chunk);
    let size = vm.response_body.len();
    let flow = callback(vm, size, end_of_stream);
    (flow == Flow::Continue || end_of_stream).then(|| std::mem::take(&mut vm.response_body))
}

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
