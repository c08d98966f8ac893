//! The attempt stage's glue: Envoy's callbacks, forwarded to the stage in
//! `ai_router_filter_core::attempt` over the wasm host.

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host::{action, WasmHost};
use ai_router_filter_core::attempt;

#[derive(Default)]
pub struct Attempt {
    stage: attempt::Attempt,
}

impl Context for Attempt {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        _body: usize,
        _trailers: usize,
    ) {
        self.stage.on_http_call_response(&mut WasmHost, token);
    }

    fn on_grpc_call_response(&mut self, token: u32, status: u32, size: usize) {
        self.stage
            .on_grpc_call_response(&mut WasmHost, token, status, size);
    }
}

impl HttpContext for Attempt {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        action(self.stage.on_request_headers(&mut WasmHost, end_of_stream))
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        action(
            self.stage
                .on_request_body(&mut WasmHost, size, end_of_stream),
        )
    }

    fn on_http_response_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        action(self.stage.on_response_headers(&mut WasmHost, end_of_stream))
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        action(
            self.stage
                .on_response_body(&mut WasmHost, size, end_of_stream),
        )
    }

    fn on_log(&mut self) {
        self.stage.on_log(&mut WasmHost);
    }
}
