//! The attempt stage's glue: Envoy's callbacks, forwarded to the stage in
//! `ai_router_filter_core::attempt` over the worker and the wasm host calls, and the root's tick
//! that checks the bounds of this worker's attempts in flight (their `timeoutMs`), acting on
//! each attempt due through `proxy_set_effective_context`, instead of a timer per attempt
//! (the worker's `on_tick` also queues its held outcomes for the singleton).

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host::{self, action, WasmCalls};
use super::{wasm_host, WasmHost, Worker};
use ai_router_filter_core::attempt;
use ai_router_filter_core::host::{Flow, Host};

pub struct Attempt {
    id: u32,
    stage: Rc<RefCell<attempt::Attempt>>,
    worker: Rc<Worker>,
}

impl Attempt {
    /// `upstream`: the one-pass aggregate's upstream filter (role `first`).
    pub fn new(id: u32, worker: Rc<Worker>, upstream: bool) -> Self {
        let stage = Rc::new(RefCell::new(match upstream {
            true => attempt::Attempt::upstream(),
            false => attempt::Attempt::default(),
        }));
        worker.attempt_opened(&mut WasmCalls, id, &stage);
        Self { id, stage, worker }
    }

    /// Runs `f` on the stage; a callback that finds it running is skipped, counted and (the
    /// first of the VM) logged ([`ai_router_filter_core::vm::busy`]).
    fn with<R>(
        &self,
        callback: &'static str,
        f: impl FnOnce(&mut attempt::Attempt, &mut WasmHost) -> R,
    ) -> Option<R> {
        let Ok(mut stage) = self.stage.try_borrow_mut() else {
            if let Some(line) = self.worker.skipped(&mut WasmCalls, callback) {
                super::log_error(&line);
            }
            return None;
        };
        Some(f(&mut stage, &mut wasm_host(&self.worker)))
    }

    /// A stream callback: what the stage says, or go on when it was skipped.
    fn flow(
        &self,
        callback: &'static str,
        f: impl FnOnce(&mut attempt::Attempt, &mut WasmHost) -> Flow,
    ) -> Action {
        action(self.with(callback, f).unwrap_or(Flow::Continue))
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        // An attempt Envoy ended without its log callback reaching the stage (the stage was
        // busy with the tick's bound when Envoy logged, or the stream went before its log):
        // its verdict, its in-flight slot and its reservation are settled now (`on_log` does
        // nothing for an attempt already reported).
        self.with("drop", |s, h| s.on_log(h));
        self.worker.attempt_closed(&mut WasmCalls, self.id);
    }
}

/// Every [`attempt::BOUND_TICK_MS`]: the attempts whose bound passed time out, each acting as
/// its own context (its local answer, its reset).
pub fn on_tick(worker: &Worker) {
    let now = wasm_host(worker).now_ms();
    for (id, stage) in worker.on_tick(&mut WasmCalls, now, |s| s.bound_due(now)) {
        if host::set_effective_context(id) {
            if let Ok(mut stage) = stage.try_borrow_mut() {
                // A host of its own for each context: its listing and its held header writes
                // are that stream's, made (the host dropped) before the next context is set.
                stage.on_bound(&mut wasm_host(worker));
            }
        }
    }
}

impl Context for Attempt {
    fn on_http_call_response(&mut self, token: u32, _: usize, _: usize, _: usize) {
        super::prof::time("attempt.call_response", || {
            self.with("on_http_call_response", |s, h| {
                s.on_http_call_response(h, token)
            });
        })
    }

    fn on_grpc_call_response(&mut self, token: u32, status: u32, size: usize) {
        super::prof::time("attempt.grpc_call_response", || {
            self.with("on_grpc_call_response", |s, h| {
                s.on_grpc_call_response(h, token, status, size)
            });
        })
    }
}

impl HttpContext for Attempt {
    fn on_http_request_headers(&mut self, _n: usize, end: bool) -> Action {
        super::prof::time("attempt.request_headers", || {
            self.flow("on_request_headers", |s, h| s.on_request_headers(h, end))
        })
    }

    fn on_http_request_body(&mut self, size: usize, end: bool) -> Action {
        super::prof::time("attempt.request_body", || {
            self.flow("on_request_body", |s, h| s.on_request_body(h, size, end))
        })
    }

    fn on_http_response_headers(&mut self, _n: usize, end: bool) -> Action {
        super::prof::time("attempt.response_headers", || {
            self.flow("on_response_headers", |s, h| s.on_response_headers(h, end))
        })
    }

    fn on_http_response_body(&mut self, size: usize, end: bool) -> Action {
        super::prof::time("attempt.response_body", || {
            self.flow("on_response_body", |s, h| s.on_response_body(h, size, end))
        })
    }

    fn on_log(&mut self) {
        super::prof::time("attempt.log", || {
            self.with("on_log", |s, h| s.on_log(h));
        })
    }
}
