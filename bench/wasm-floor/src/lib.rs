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
//! Nothing here parses, picks or reports: against ai-router's figures, the difference is the
//! filter's own work.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { mode: Mode::Noop, writes: 1 }) });
}}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Noop,
    Front,
    Attempt,
}

struct Root {
    mode: Mode,
    /// Request headers each pass writes (`front 12`: twelve; one when not given).
    writes: usize,
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
            _ => Mode::Noop,
        };
        self.writes = words.next().and_then(|w| w.parse().ok()).unwrap_or(1);
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream {
            mode: self.mode,
            writes: self.writes,
            streamed: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Stream {
    mode: Mode,
    writes: usize,
    /// The answer is an event stream (read as it comes, not held).
    streamed: bool,
}

impl Context for Stream {}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::Noop || end_of_stream {
            return Action::Continue;
        }
        let _listed = self.get_http_request_headers_bytes();
        Action::Pause
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::Noop {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let _body = self.get_http_request_body(0, size);
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
        let listed = self.get_http_response_headers_bytes();
        self.streamed = listed.iter().any(|(name, value)| {
            name.eq_ignore_ascii_case("content-type") && value.starts_with(b"text/event-stream")
        });
        self.set_http_response_header("x-floor-pass", Some(pass(self.mode)));
        if self.mode == Mode::Attempt && !self.streamed && !end_of_stream {
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode != Mode::Attempt {
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

fn pass(mode: Mode) -> &'static str {
    match mode {
        Mode::Front => "front",
        _ => "attempt",
    }
}
