//! The front stage's glue: Envoy's callbacks, forwarded to the stage in
//! `ai_router_filter_core::front` over the wasm host.

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host::{action, WasmHost};
use ai_router_filter_core::front;

#[derive(Default)]
pub struct Front {
    stage: front::Front,
}

impl Context for Front {
    /// The timer of a call waiting for the gateway's first state.
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        _body: usize,
        _trailers: usize,
    ) {
        super::prof::time("front.call_response", || {
            self.stage.on_http_call_response(&mut WasmHost, token);
        })
    }

    /// The shared cache tier's answer to a missed call.
    fn on_grpc_call_response(&mut self, token: u32, status: u32, size: usize) {
        self.stage
            .on_grpc_call_response(&mut WasmHost, token, status, size);
    }
}

impl HttpContext for Front {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        super::prof::time("front.request_headers", || {
            action(self.stage.on_request_headers(&mut WasmHost, end_of_stream))
        })
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        super::prof::time("front.request_body", || {
            action(
                self.stage
                    .on_request_body(&mut WasmHost, size, end_of_stream),
            )
        })
    }

    fn on_http_response_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        super::prof::time("front.response_headers", || {
            action(self.stage.on_response_headers(&mut WasmHost, end_of_stream))
        })
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        super::prof::time("front.response_body", || {
            action(
                self.stage
                    .on_response_body(&mut WasmHost, size, end_of_stream),
            )
        })
    }

    fn on_log(&mut self) {
        super::prof::time("front.log", || {
            self.stage.on_log(&mut WasmHost);
        })
    }
}
