//! The front stage's glue: Envoy's callbacks, forwarded to the stage in
//! `ai_router_filter_core::front` over the worker and the wasm host calls.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host::action;
use super::{wasm_host, WasmHost, Worker};
use ai_router_filter_core::front;

pub struct Front {
    stage: front::Front,
    worker: Rc<Worker>,
}

impl Front {
    pub fn new(
        worker: Rc<Worker>,
        one_pass: Option<Rc<ai_router_contract::plugin::OnePass>>,
    ) -> Self {
        Self {
            stage: front::Front::with_one_pass(one_pass),
            worker,
        }
    }

    /// Runs `f` on the stage with its host for this callback.
    fn run<R>(&mut self, f: impl FnOnce(&mut front::Front, &mut WasmHost) -> R) -> R {
        f(&mut self.stage, &mut wasm_host(&self.worker))
    }
}

impl Context for Front {
    /// The timer of a call waiting for the gateway's first state.
    fn on_http_call_response(&mut self, token: u32, _: usize, _: usize, _: usize) {
        super::prof::time("front.call_response", || {
            self.run(|s, h| s.on_http_call_response(h, token));
        })
    }

    /// The shared cache tier's answer to a missed call.
    fn on_grpc_call_response(&mut self, token: u32, status: u32, size: usize) {
        self.run(|s, h| s.on_grpc_call_response(h, token, status, size));
    }
}

impl HttpContext for Front {
    fn on_http_request_headers(&mut self, _n: usize, end: bool) -> Action {
        super::prof::time("front.request_headers", || {
            action(self.run(|s, h| s.on_request_headers(h, end)))
        })
    }

    fn on_http_request_body(&mut self, size: usize, end: bool) -> Action {
        super::prof::time("front.request_body", || {
            action(self.run(|s, h| s.on_request_body(h, size, end)))
        })
    }

    fn on_http_response_headers(&mut self, _n: usize, end: bool) -> Action {
        super::prof::time("front.response_headers", || {
            action(self.run(|s, h| s.on_response_headers(h, end)))
        })
    }

    fn on_http_response_body(&mut self, size: usize, end: bool) -> Action {
        super::prof::time("front.response_body", || {
            action(self.run(|s, h| s.on_response_body(h, size, end)))
        })
    }

    fn on_log(&mut self) {
        super::prof::time("front.log", || self.run(|s, h| s.on_log(h)))
    }
}
