//! The floor of a proxy-wasm filter in ai-router's two-pass shape, for the benchmark
//! (`docs/benchmarks.md`, "The platform's floor"): what V8 and Envoy's wasm host cost before a
//! filter decides anything. Its plugin configuration names a mode:
//!
//! - `noop`: every callback answers at once, with no host call (the cost of the VM entries
//!   alone: a context per stream and pass, and each callback crossing into V8);
//! - `front` and `attempt`: the least ai-router's stages do with a call's bytes, and nothing
//!   more. Both passes hold the request's headers until its body is whole, list the headers,
//!   read the body and write one header; the attempt pass holds a unary answer whole and
//!   reads it (a streamed answer is read event by event and passed on), and lists the answer's
//!   headers and writes one; the front pass lists the answer's headers and writes one.
//!
//! - `onepass` and `upstream`: a first attempt in one pass (`docs/benchmarks.md`, "A first
//!   attempt in one pass"). `onepass`, on the public listener, does what `front` and `attempt`
//!   do together, and marks the call for the route that sends it straight to the upstream
//!   (`x-floor-lane: direct`), keeping what a continuation needs (the original authority and
//!   path) in a property that lives as long as the downstream request. `upstream`, an upstream
//!   HTTP filter on that route's cluster, turns a failed first attempt (429 or 5xx; a stream
//!   whose first event is an error, its headers held until then) into a `307` to
//!   `CONTINUATION_URL`, which the route's internal redirect policy follows: a new stream
//!   through the public listener, the body replayed. `onepass` knows that continuation by its
//!   path and by the property (a client cannot set one), puts the authority and path back,
//!   drops the failure the first attempt met (`x-bench-fail`, the fake upstream's script) and
//!   routes it to the internal listener (`x-floor-lane: retry`), where `attempt` runs as in
//!   `wasm-floor`. On the continuation's answer it says how many body bytes it read
//!   (`x-floor-replayed`).
//!
//! - `oneretry <writes> <authority>`, `upstream retry` and `retry`: the same first attempt with
//!   no redirect (system `one-pass-retry`). `oneretry` does `onepass`'s work on the first pass
//!   and sets `:authority` to the upstream's (or to `x-bench-first-host`, the check's scripted
//!   first host: one that refuses, resets or stalls), as ai-router's front would for the lane
//!   it picks for the dynamic forward proxy; `x-bench-per-try-ms` becomes the router's
//!   `x-envoy-upstream-rq-per-try-timeout-ms` (checked by hand, docs/benchmarks.md). The route's cluster is an aggregate of the direct
//!   cluster and the internal listener, and its retry policy moves a retry to the next priority
//!   (`previous_priorities`). `upstream retry` turns a failed first attempt into the retry
//!   signal (`x-floor-retry` on the answer) instead of a `307`; `x-bench-fail: local` makes it
//!   answer that signal itself, at once (`send_http_response`), to see whether the router
//!   retries an upstream filter's own reply. On the first attempt it also rewrites the request
//!   (a header, `x-floor-first-attempt`, `content-length` and the body, as ai-router's attempt
//!   stage would for its lane) and puts the client's headers back on the later attempts (the
//!   router replays the headers it left, not its body). `retry`, on the internal listener, is `attempt` that also drops the failure the
//!   first attempt met (`x-bench-fail`; kept while the route's `x-envoy-attempt-count` is at most
//!   `x-bench-fail-through`), says how many body bytes it read (`x-floor-replayed`) and whether
//!   the first attempt's rewrite reached it (`x-floor-first-seen`: it must not).
//!
//! Nothing here parses, picks or reports: against ai-router's figures, the difference is the
//! filter's own work.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { mode: Mode::Noop, writes: 1, authority: String::new(), retry_signal: false }) });
}}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Noop,
    Front,
    Attempt,
    OnePass,
    Upstream,
    /// `oneretry`: `onepass`'s first pass for `one-pass-retry` (no continuation).
    OneRetry,
    /// `retry`: `attempt` on a retry through the internal listener (`one-pass-retry`).
    Retry,
}

/// Where the `upstream` mode sends a failed first attempt (the internal redirect's target).
const CONTINUATION_URL: &str = "http://onepass.internal/__onepass/retry";
/// The path prefix of a continuation.
const CONTINUATION_PATH: &[u8] = b"/__onepass/";
/// The property (filter state) that carries a first attempt's authority and path to its
/// continuation; declared with the downstream request's life span, which an internal redirect
/// keeps.
const PLAN_PROPERTY: &str = "onepass_plan";
/// The answer header that makes the route retry (`one-pass-retry`).
const RETRY_HEADER: &str = "x-floor-retry";
/// The check's scripted first host (`oneretry`), in place of the upstream's.
const FIRST_HOST_HEADER: &str = "x-bench-first-host";
/// The check's per-try timeout for one call (`oneretry`), in milliseconds.
const PER_TRY_HEADER: &str = "x-bench-per-try-ms";
/// `upstream retry`: the header the first attempt's rewrite adds (a stand-in for what
/// ai-router's attempt stage writes for its lane: the provider's key, host and path).
const FIRST_WRITE_HEADER: &str = "x-floor-first-attempt";
/// `upstream retry`: the body the first attempt's rewrite sends in place of the client's (a
/// stand-in for the provider's body); shorter than any body the benchmark sends, so a retry
/// that got it would say so in `x-floor-replayed`.
const FIRST_BODY: &[u8] = b"{\"first\":1}";

struct Root {
    mode: Mode,
    /// Request headers each pass writes (`front 12`: twelve; one when not given).
    writes: usize,
    /// `oneretry`: the upstream's authority (the first attempt's host).
    authority: String,
    /// `upstream retry`: a failure becomes the retry signal, not a `307`.
    retry_signal: bool,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let config = String::from_utf8_lossy(&config);
        let mut words = config.split_whitespace();
        self.mode = match words.next() {
            Some("front") => Mode::Front,
            Some("attempt") => Mode::Attempt,
            Some("onepass") => Mode::OnePass,
            Some("upstream") => Mode::Upstream,
            Some("oneretry") => Mode::OneRetry,
            Some("retry") => Mode::Retry,
            _ => Mode::Noop,
        };
        let second = words.next();
        self.retry_signal = second == Some("retry");
        self.writes = second.and_then(|w| w.parse().ok()).unwrap_or(1);
        self.authority = words.next().unwrap_or_default().to_string();
        if self.mode == Mode::OnePass {
            // DeclarePropertyArguments { name: PLAN_PROPERTY, type: Bytes, span: DownstreamRequest }
            // (Envoy's source/extensions/common/wasm/declare_property.proto), by hand.
            let mut args = vec![0x0a, PLAN_PROPERTY.len() as u8];
            args.extend_from_slice(PLAN_PROPERTY.as_bytes());
            args.extend_from_slice(&[0x28, 0x01]);
            if self
                .call_foreign_function("declare_property", Some(&args))
                .is_err()
            {
                proxy_wasm::hostcalls::log(LogLevel::Error, "declare_property failed").ok();
                return false;
            }
        }
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream {
            mode: self.mode,
            writes: self.writes,
            authority: self.authority.clone(),
            retry_signal: self.retry_signal,
            streamed: false,
            continuation: false,
            plan: Vec::new(),
            replayed: None,
            held: false,
            per_try: None,
            first_attempt: false,
            first_seen: None,
            request_id: String::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Stream {
    mode: Mode,
    writes: usize,
    /// `oneretry`: the upstream's authority.
    authority: String,
    /// `upstream retry`: a failure becomes the retry signal.
    retry_signal: bool,
    /// The answer is an event stream (read as it comes, not held).
    streamed: bool,
    /// `onepass`: this stream is a continuation (its path says so; the property proves it).
    continuation: bool,
    /// `onepass`: the request's authority and path, a newline between; `oneretry`: the
    /// scripted first host, if any.
    plan: Vec<u8>,
    /// `onepass`: the body bytes a continuation read.
    replayed: Option<usize>,
    /// `upstream`: an event stream's headers held until its first event.
    held: bool,
    /// `oneretry`: the call's per-try timeout (ms), if the check asked for one.
    per_try: Option<Vec<u8>>,
    /// `upstream retry`: this is the route's first attempt, the one the filter rewrites.
    first_attempt: bool,
    /// `retry`: whether the first attempt's rewrite reached this retry (it must not).
    first_seen: Option<bool>,
    /// `upstream retry`: the call's `x-request-id`, what its kept headers are found by.
    request_id: String,
}

/// The most calls whose headers are kept at once (a prototype's bound: all are dropped past it).
const KEPT_MOST: usize = 4096;

thread_local! {
    /// `upstream retry`: the client's `content-length` of each call a retry may need, by
    /// request id (a VM is one worker's, and a call's attempts run on its worker).
    static KEPT: std::cell::RefCell<std::collections::HashMap<String, Option<String>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

impl Context for Stream {}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::Upstream
            && self.retry_signal
            && self.get_http_request_header("x-bench-fail").as_deref() == Some("local")
        {
            self.send_http_response(503, vec![(RETRY_HEADER, "1")], Some(b"failed locally"));
            return Action::Pause;
        }
        if self.mode == Mode::Upstream && self.retry_signal {
            // The first attempt's request is rewritten here, as ai-router's attempt stage would
            // rewrite it for its lane. The router's retries replay the headers as this filter
            // left them (the map is the router's; the body is not: a retry gets the client's),
            // so the headers it rewrote are kept by request id and put back on later attempts.
            self.request_id = self
                .get_http_request_header("x-request-id")
                .unwrap_or_default();
            self.first_attempt = self
                .get_http_request_header("x-envoy-attempt-count")
                .as_deref()
                == Some("1");
            if self.first_attempt {
                KEPT.with(|kept| {
                    let mut kept = kept.borrow_mut();
                    if kept.len() >= KEPT_MOST {
                        kept.clear();
                    }
                    kept.insert(
                        self.request_id.clone(),
                        self.get_http_request_header("content-length"),
                    );
                });
                self.set_http_request_header(FIRST_WRITE_HEADER, Some("1"));
                if !end_of_stream {
                    // The body this attempt sends is the rewrite's.
                    let length = FIRST_BODY.len().to_string();
                    self.set_http_request_header("content-length", Some(&length));
                }
            } else if let Some(length) =
                KEPT.with(|kept| kept.borrow().get(&self.request_id).cloned())
            {
                self.set_http_request_header(FIRST_WRITE_HEADER, None);
                self.set_http_request_header("content-length", length.as_deref());
            }
        }
        if matches!(self.mode, Mode::Noop | Mode::Upstream) || end_of_stream {
            return Action::Continue;
        }
        let listed = self.get_http_request_headers_bytes();
        if self.mode == Mode::OneRetry {
            // The check's scripted first host, from the headers already listed.
            if let Some((_, host)) = listed.iter().find(|(n, _)| n == FIRST_HOST_HEADER) {
                self.plan = host.clone();
            }
            // A per-try timeout for this call (`x-bench-per-try-ms`), as ai-router's front would
            // set one from the call's `timeoutMs`: the router's header, which Envoy strips from
            // a client's request but honours from a filter's.
            if let Some((_, ms)) = listed.iter().find(|(n, _)| n == PER_TRY_HEADER) {
                self.per_try = Some(ms.clone());
            }
        }
        if self.mode == Mode::OnePass {
            let value = |name: &str| {
                listed
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.as_slice())
                    .unwrap_or_default()
            };
            let path = value(":path");
            self.continuation = path.starts_with(CONTINUATION_PATH);
            if !self.continuation {
                self.plan = [value(":authority"), b"\n", path].concat();
            }
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::Upstream && self.first_attempt {
            if !end_of_stream {
                return Action::Pause;
            }
            self.set_http_request_body(0, size, FIRST_BODY);
            return Action::Continue;
        }
        if matches!(self.mode, Mode::Noop | Mode::Upstream) {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, size);
        if self.mode == Mode::OneRetry {
            if let Some(ms) = self.per_try.take() {
                self.set_http_request_header_bytes(
                    "x-envoy-upstream-rq-per-try-timeout-ms",
                    Some(&ms),
                );
            }
            if self.plan.is_empty() {
                self.set_http_request_header(":authority", Some(&self.authority));
            } else {
                self.set_http_request_header_bytes(":authority", Some(&self.plan));
                self.set_http_request_header(FIRST_HOST_HEADER, None);
            }
        }
        if self.mode == Mode::Retry {
            // The check's script may have the first `n` attempts fail (`x-bench-fail-through`):
            // this one keeps the failure while the route's attempt count is at most `n`.
            let through = self.get_http_request_header("x-bench-fail-through");
            let attempt = self.get_http_request_header("x-envoy-attempt-count");
            let number = |v: Option<String>| v.and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
            if number(attempt) > number(through) {
                self.set_http_request_header("x-bench-fail", None);
            }
            self.first_seen = Some(self.get_http_request_header(FIRST_WRITE_HEADER).is_some());
            self.replayed = Some(body.as_ref().map_or(0, |b| b.len()));
        }
        if self.mode == Mode::OnePass {
            if self.continuation {
                let Some(plan) = self.get_property(vec![PLAN_PROPERTY]) else {
                    // A client's own request to the continuation path: no first attempt made it.
                    self.send_http_response(404, vec![], Some(b"no such continuation"));
                    return Action::Pause;
                };
                let mut parts = plan.splitn(2, |b| *b == b'\n');
                let authority = parts.next().unwrap_or_default();
                let path = parts.next().unwrap_or_default();
                self.set_http_request_header_bytes(":authority", Some(authority));
                self.set_http_request_header_bytes(":path", Some(path));
                self.set_http_request_header("x-envoy-original-url", None);
                self.set_http_request_header("x-bench-fail", None);
                self.set_http_request_header("x-floor-lane", Some("retry"));
                self.replayed = Some(body.map_or(0, |b| b.len()));
            } else {
                self.set_property(vec![PLAN_PROPERTY], Some(&self.plan));
                self.set_http_request_header("x-floor-lane", Some("direct"));
            }
        }
        self.set_http_request_header("x-floor-pass", Some(pass(self.mode)));
        for i in 1..self.writes {
            self.set_http_request_header(&format!("x-floor-{i}"), Some(pass(self.mode)));
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::Noop {
            return Action::Continue;
        }
        if self.mode == Mode::Upstream {
            return self.first_attempt_headers(end_of_stream);
        }
        let listed = self.get_http_response_headers_bytes();
        self.streamed = listed.iter().any(|(name, value)| {
            name.eq_ignore_ascii_case("content-type") && value.starts_with(b"text/event-stream")
        });
        self.set_http_response_header("x-floor-pass", Some(pass(self.mode)));
        if let Some(bytes) = self.replayed {
            self.set_http_response_header("x-floor-replayed", Some(&bytes.to_string()));
        }
        if let Some(seen) = self.first_seen {
            self.set_http_response_header(
                "x-floor-first-seen",
                Some(if seen { "yes" } else { "no" }),
            );
        }
        if matches!(
            self.mode,
            Mode::Attempt | Mode::OnePass | Mode::OneRetry | Mode::Retry
        ) && !self.streamed
            && !end_of_stream
        {
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::Upstream && self.held {
            self.held = false;
            let first = self.get_http_response_body(0, size).unwrap_or_default();
            if error_event_first(&first) {
                self.redirect();
            } else {
                self.answered();
            }
            return Action::Continue;
        }
        if !matches!(
            self.mode,
            Mode::Attempt | Mode::OnePass | Mode::OneRetry | Mode::Retry
        ) {
            return Action::Continue;
        }
        if self.streamed {
            let _event = self.get_http_response_body(0, size);
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let _answer = self.get_http_response_body(0, size);
        Action::Continue
    }
}

impl Stream {
    /// `upstream`: a failed answer becomes the redirect to the continuation; an event stream's
    /// headers wait for its first event; anything else passes at once.
    fn first_attempt_headers(&mut self, end_of_stream: bool) -> Action {
        if self.first_attempt {
            // The answer to the rewritten request says so (a success reaches the client).
            self.set_http_response_header(FIRST_WRITE_HEADER, Some("rewritten"));
        }
        let status = self.get_http_response_header(":status").unwrap_or_default();
        if status == "429" || status.starts_with('5') {
            self.redirect();
            return Action::Continue;
        }
        if end_of_stream {
            self.answered();
            return Action::Continue;
        }
        let content_type = self.get_http_response_header("content-type");
        if content_type.is_some_and(|ct| ct.starts_with("text/event-stream")) {
            self.held = true;
            return Action::Pause;
        }
        self.answered();
        Action::Continue
    }

    /// `upstream retry`: the answer reaches the client (no retry), so no retry needs the
    /// client's request any more.
    fn answered(&self) {
        if self.retry_signal {
            KEPT.with(|kept| kept.borrow_mut().remove(&self.request_id));
        }
    }

    fn redirect(&self) {
        if self.retry_signal {
            self.set_http_response_header(RETRY_HEADER, Some("1"));
            return;
        }
        self.set_http_response_header(":status", Some("307"));
        self.set_http_response_header("location", Some(CONTINUATION_URL));
    }
}

/// The stream's first `data:` event is an error (before any token).
fn error_event_first(chunk: &[u8]) -> bool {
    let first = chunk
        .split(|b| *b == b'\n')
        .find_map(|line| line.strip_prefix(b"data:"))
        .unwrap_or_default();
    first.windows(8).any(|w| w == b"\"error\":")
}

fn pass(mode: Mode) -> &'static str {
    match mode {
        Mode::Front => "front",
        Mode::OnePass | Mode::OneRetry => "onepass",
        _ => "attempt",
    }
}
