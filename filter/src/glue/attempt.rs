//! The attempt stage's glue: Envoy's callbacks, forwarded to the stage in
//! `ai_router_filter_core::attempt` over the wasm host, and the tick that checks the bounds of
//! this worker's attempts in flight (their `timeoutMs`): a root context's tick, acting on each
//! attempt due through `proxy_set_effective_context`, instead of a timer per attempt. The same
//! tick queues the worker's held outcomes for the singleton (filter-core's
//! `reports::REPORT_HOLD_MS`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::gauges::{self, Gauge};
use super::host::{self, action, WasmHost};
use ai_router_filter_core::attempt;
use ai_router_filter_core::host::Host;
use ai_router_filter_core::vm::busy::Skipped;

type Stage = Rc<RefCell<attempt::Attempt>>;

thread_local! {
    /// This VM's attempts in flight, by context id. A VM runs on one worker thread.
    static IN_FLIGHT: RefCell<HashMap<u32, Weak<RefCell<attempt::Attempt>>>> =
        RefCell::new(HashMap::new());
    static SKIPPED: RefCell<Skipped> = RefCell::new(Skipped::default());
}

fn skipped(callback: &str) {
    gauges::add(Gauge::CallbacksSkipped, 1);
    if let Some(line) = SKIPPED.with(|s| s.borrow_mut().skip(callback)) {
        super::log_error(&line);
    }
}

pub struct Attempt {
    id: u32,
    stage: Stage,
}

impl Attempt {
    pub fn new(id: u32) -> Self {
        let stage: Stage = Rc::default();
        let fresh = IN_FLIGHT.with(|m| m.borrow_mut().insert(id, Rc::downgrade(&stage)).is_none());
        if fresh {
            gauges::add(Gauge::Attempts, 1);
        }
        Self { id, stage }
    }

    /// Runs `f` on the stage; a callback that finds it running is skipped, counted and (the
    /// first of the VM) logged ([`ai_router_filter_core::vm::busy`]).
    fn with<R>(
        &self,
        callback: &'static str,
        f: impl FnOnce(&mut attempt::Attempt) -> R,
    ) -> Option<R> {
        match self.stage.try_borrow_mut() {
            Ok(mut s) => Some(f(&mut s)),
            Err(_) => {
                skipped(callback);
                None
            }
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        // An attempt Envoy ended without its log callback reaching the stage (the stage was
        // busy with the tick's bound when Envoy logged, or the stream went before its log):
        // its verdict, its in-flight slot and its reservation are settled now (`on_log` does
        // nothing for an attempt already reported).
        self.with("drop", |s| s.on_log(&mut WasmHost));
        if IN_FLIGHT.with(|m| m.borrow_mut().remove(&self.id).is_some()) {
            gauges::add(Gauge::Attempts, -1);
        }
    }
}

/// Every [`attempt::BOUND_TICK_MS`]: the attempts whose bound passed time out, each acting as
/// its own context (its local answer, its reset).
pub fn on_tick() {
    gauges::track_memory();
    let now = WasmHost.now_ms();
    // This worker's outcomes waiting for the singleton go on the same tick.
    if super::shared::held_reports_due(now) {
        super::shared::flush_held_reports();
    }
    let due: Vec<(u32, Stage)> = IN_FLIGHT.with(|m| {
        m.borrow()
            .iter()
            .filter_map(|(id, weak)| weak.upgrade().map(|s| (*id, s)))
            .filter(|(_, s)| s.try_borrow().is_ok_and(|s| s.bound_due(now)))
            .collect()
    });
    for (id, stage) in due {
        if host::set_effective_context(id) {
            if let Ok(mut stage) = stage.try_borrow_mut() {
                stage.on_bound(&mut WasmHost);
            }
        }
    }
}

impl Context for Attempt {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        _body: usize,
        _trailers: usize,
    ) {
        super::prof::time("attempt.call_response", || {
            self.with("on_http_call_response", |s| {
                s.on_http_call_response(&mut WasmHost, token)
            });
        })
    }

    fn on_grpc_call_response(&mut self, token: u32, status: u32, size: usize) {
        super::prof::time("attempt.grpc_call_response", || {
            self.with("on_grpc_call_response", |s| {
                s.on_grpc_call_response(&mut WasmHost, token, status, size)
            });
        })
    }
}

impl HttpContext for Attempt {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        super::prof::time("attempt.request_headers", || {
            let flow = self.with("on_request_headers", |s| {
                s.on_request_headers(&mut WasmHost, end_of_stream)
            });
            action(flow.unwrap_or(ai_router_filter_core::host::Flow::Continue))
        })
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        super::prof::time("attempt.request_body", || {
            let flow = self.with("on_request_body", |s| {
                s.on_request_body(&mut WasmHost, size, end_of_stream)
            });
            action(flow.unwrap_or(ai_router_filter_core::host::Flow::Continue))
        })
    }

    fn on_http_response_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        super::prof::time("attempt.response_headers", || {
            let flow = self.with("on_response_headers", |s| {
                s.on_response_headers(&mut WasmHost, end_of_stream)
            });
            action(flow.unwrap_or(ai_router_filter_core::host::Flow::Continue))
        })
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        super::prof::time("attempt.response_body", || {
            let flow = self.with("on_response_body", |s| {
                s.on_response_body(&mut WasmHost, size, end_of_stream)
            });
            action(flow.unwrap_or(ai_router_filter_core::host::Flow::Continue))
        })
    }

    fn on_log(&mut self) {
        super::prof::time("attempt.log", || {
            self.with("on_log", |s| s.on_log(&mut WasmHost));
        })
    }
}
