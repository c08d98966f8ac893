//! The host adapter: every call the stages make into Envoy goes through here, straight to
//! `proxy_wasm::hostcalls`, never through the SDK's trait helpers (`self.get_http_*`), which
//! `unwrap()` internally and decode header values with `String::from_utf8(..).unwrap()`: a
//! client or provider header carrying one byte >= 0x80 would panic the VM. Header values are
//! read as bytes; a value that is not UTF-8 is opaque to the gateway (it is never parsed), and
//! every host error becomes a [`HostError`] the caller handles.

use std::rc::Rc;
use std::time::Duration;

use ai_router_filter_core::classify::Class;
use ai_router_filter_core::host::{Flow, Host, Refused, Side};
use ai_router_filter_core::state::State;
use ai_router_filter_core::vm::call::Call;
use ai_router_filter_core::vm::local::{Allowance, Send};
use ai_router_filter_core::vm::round_robin::RoundRobin;
use ai_router_filter_core::vm::view::View;
use ai_router_filter_core::vocab::LaneId;
use ai_router_proto::v1::{AttemptOutcome, RequestOutcome};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{Action, BufferType, MapType, Status};

use super::shared;

/// A host call that did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError {
    pub call: &'static str,
    pub status: Status,
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host call {} failed: {:?}", self.call, self.status)
    }
}

fn failed(call: &'static str) -> impl Fn(Status) -> HostError {
    move |status| HostError { call, status }
}

/// Logs a host error; the callers treat the value as absent and go on.
fn logged<T>(result: Result<T, HostError>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            super::log_error(&format!("ai-router: {e}"));
            None
        }
    }
}

/// One of the stream's header maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    Request,
    Response,
}

impl Headers {
    fn map(self) -> MapType {
        match self {
            Headers::Request => MapType::HttpRequestHeaders,
            Headers::Response => MapType::HttpResponseHeaders,
        }
    }

    /// The raw value of `name`, if present.
    pub fn get_bytes(self, name: &str) -> Option<Vec<u8>> {
        logged(hostcalls::get_map_value_bytes(self.map(), name).map_err(failed("get_header")))
            .flatten()
    }

    /// Every header, values as raw bytes.
    pub fn all(self) -> Vec<(String, Vec<u8>)> {
        logged(hostcalls::get_map_bytes(self.map()).map_err(failed("get_headers")))
            .unwrap_or_default()
    }

    /// Sets (or with `None` removes) `name`.
    pub fn set(self, name: &str, value: Option<&str>) {
        logged(hostcalls::set_map_value(self.map(), name, value).map_err(failed("set_header")));
    }

    /// Sets `name` to raw bytes.
    pub fn set_bytes(self, name: &str, value: &[u8]) {
        logged(
            hostcalls::set_map_value_bytes(self.map(), name, Some(value))
                .map_err(failed("set_header")),
        );
    }
}

/// One of the stream's bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    Request,
    Response,
}

impl Body {
    fn buffer(self) -> BufferType {
        match self {
            Body::Request => BufferType::HttpRequestBody,
            Body::Response => BufferType::HttpResponseBody,
        }
    }

    /// `size` bytes from `start` of what Envoy holds (empty when nothing is there).
    pub fn get(self, start: usize, size: usize) -> Vec<u8> {
        logged(hostcalls::get_buffer(self.buffer(), start, size).map_err(failed("get_body")))
            .flatten()
            .unwrap_or_default()
    }

    /// Replaces `size` bytes from `start` with `bytes`.
    pub fn set(self, start: usize, size: usize, bytes: &[u8]) {
        logged(
            hostcalls::set_buffer(self.buffer(), start, size, bytes).map_err(failed("set_body")),
        );
    }
}

/// The plugin configuration bytes, if any.
pub fn plugin_configuration() -> Option<Vec<u8>> {
    logged(
        hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .map_err(failed("get_plugin_configuration")),
    )
    .flatten()
}

/// The body of a finished gRPC call.
pub fn grpc_call_response_body(size: usize) -> Option<Vec<u8>> {
    logged(
        hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, size)
            .map_err(failed("get_grpc_body")),
    )
    .flatten()
}

/// A property of the stream (`["response", "code_details"]`...).
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    logged(hostcalls::get_property(path.to_vec()).map_err(failed("get_property"))).flatten()
}

/// Answers the stream locally.
pub fn send_response(status: u16, headers: &[(&str, &str)], body: &[u8]) {
    logged(
        hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body))
            .map_err(failed("send_http_response")),
    );
}

/// Resets the stream. Envoy's `proxy_close_stream` always answers `Ok` for an HTTP stream (it
/// defers the reset until the callback returns), so the SDK helper's panic on another status
/// cannot be reached; the helper is the only way to the call without `unsafe`.
pub fn reset_stream() {
    logged(hostcalls::reset_http_response().map_err(failed("reset_http_response")));
}

/// Makes `context_id` the context the following host calls act on, for the rest of this
/// callback (a root context's tick acting for one of its HTTP contexts). `false` when the
/// context is gone.
pub fn set_effective_context(context_id: u32) -> bool {
    logged(hostcalls::set_effective_context(context_id).map_err(failed("set_effective_context")))
        .is_some()
}

/// Lets a paused request go on.
pub fn resume_request() {
    logged(hostcalls::resume_http_request().map_err(failed("resume_http_request")));
}

/// An HTTP call to `cluster`; its answer arrives in `on_http_call_response` with the token.
pub fn dispatch_http_call(
    cluster: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<u32, HostError> {
    hostcalls::dispatch_http_call(cluster, headers.to_vec(), None, vec![], timeout)
        .map_err(failed("dispatch_http_call"))
}

/// A unary gRPC call; its answer arrives in `on_grpc_call_response` with the token.
pub fn dispatch_grpc_call(
    cluster: &str,
    service: &str,
    method: &str,
    metadata: &[(&str, &[u8])],
    message: &[u8],
    timeout: Duration,
) -> Result<u32, HostError> {
    hostcalls::dispatch_grpc_call(
        cluster,
        service,
        method,
        metadata.to_vec(),
        Some(message),
        timeout,
    )
    .map_err(failed("dispatch_grpc_call"))
}

/// [`ai_router_filter_core::host::Host`] over the calls above and this VM's shared state: what
/// the stages in `ai-router-filter-core` run on inside Envoy.
pub struct WasmHost;

fn headers_of(side: Side) -> Headers {
    match side {
        Side::Request => Headers::Request,
        Side::Response => Headers::Response,
    }
}

fn body_of(side: Side) -> Body {
    match side {
        Side::Request => Body::Request,
        Side::Response => Body::Response,
    }
}

impl Host for WasmHost {
    fn header(&self, side: Side, name: &str) -> Option<Vec<u8>> {
        super::prof::time("host.header", || headers_of(side).get_bytes(name))
    }
    fn headers(&self, side: Side) -> Vec<(String, Vec<u8>)> {
        super::prof::time("host.headers", || headers_of(side).all())
    }
    fn set_header(&mut self, side: Side, name: &str, value: Option<&str>) {
        super::prof::time("host.set_header", || {
            headers_of(side).set(name, value);
        })
    }
    fn set_header_bytes(&mut self, side: Side, name: &str, value: &[u8]) {
        super::prof::time("host.set_header_bytes", || {
            headers_of(side).set_bytes(name, value);
        })
    }
    fn body(&self, side: Side, start: usize, size: usize) -> Vec<u8> {
        super::prof::time("host.body", || body_of(side).get(start, size))
    }
    fn set_body(&mut self, side: Side, start: usize, size: usize, bytes: &[u8]) {
        super::prof::time("host.set_body", || {
            body_of(side).set(start, size, bytes);
        })
    }
    fn send_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        super::prof::time("host.send_response", || {
            send_response(status, headers, body);
        })
    }
    fn reset_stream(&mut self) {
        super::prof::time("host.reset_stream", || {
            reset_stream();
        })
    }
    fn now_ms(&self) -> i64 {
        super::prof::time("host.now_ms", shared::now_ms)
    }
    fn now_us(&self) -> i64 {
        super::prof::time("host.now_us", shared::now_us)
    }
    fn state(&self) -> Option<Rc<State>> {
        super::prof::time("host.state", shared::current_state)
    }
    fn virtual_key(&self, sha256_hex: &str) -> Option<ai_router_proto::v1::VirtualKey> {
        super::prof::time("host.virtual_key", || shared::virtual_key(sha256_hex))
    }
    fn state_sequence(&self) -> u64 {
        super::prof::time("host.state_sequence", || {
            shared::current_state();
            shared::state_sequence()
        })
    }
    fn admit_minute_request(&mut self, key_id: &str, limit: u64, now_ms: i64) -> Option<bool> {
        super::prof::time("host.admit_minute_request", || {
            shared::admit_minute_request(key_id, limit, now_ms)
        })
    }
    fn new_call(&mut self, now_ms: i64) -> String {
        super::prof::time("host.new_call", || shared::new_call(now_ms))
    }
    fn call_attempts(&self, call_id: &str) -> Option<u32> {
        super::prof::time("host.call_attempts", || {
            shared::with_call(call_id, |c| c.attempts)
        })
    }
    fn end_call(&mut self, call_id: &str) -> Option<Call> {
        super::prof::time("host.end_call", || shared::end_call(call_id))
    }
    fn report_request(&mut self, outcome: RequestOutcome) {
        super::prof::time("host.report_request", || {
            shared::report_request(outcome);
        })
    }
    fn dispatch_http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, Refused> {
        super::prof::time("host.dispatch_http_call", || {
            logged(dispatch_http_call(
                cluster,
                headers,
                shared::duration_ms(timeout_ms),
            ))
            .ok_or(Refused)
        })
    }
    fn dispatch_grpc_call(
        &mut self,
        cluster: &str,
        service: &str,
        method: &str,
        metadata: &[(&str, &[u8])],
        message: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Refused> {
        super::prof::time("host.dispatch_grpc_call", || {
            logged(dispatch_grpc_call(
                cluster,
                service,
                method,
                metadata,
                message,
                shared::duration_ms(timeout_ms),
            ))
            .ok_or(Refused)
        })
    }
    fn grpc_call_response_body(&self, size: usize) -> Option<Vec<u8>> {
        super::prof::time("host.grpc_call_response_body", || {
            grpc_call_response_body(size)
        })
    }
    fn resume_request(&mut self) {
        super::prof::time("host.resume_request", || {
            resume_request();
        })
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        super::prof::time("host.property", || property(path))
    }
    fn sync_token(&self) -> Option<String> {
        super::prof::time("host.sync_token", shared::sync_token)
    }
    fn with_call<R>(&mut self, call_id: &str, f: impl FnOnce(&mut Call) -> R) -> Option<R> {
        super::prof::time("host.with_call", || shared::with_call(call_id, f))
    }
    fn with_lanes<R>(&mut self, f: impl FnOnce(&dyn View, &mut RoundRobin) -> R) -> R {
        super::prof::time("host.with_lanes", || {
            shared::with_round_robin(|rr| f(&shared::SharedView::default(), rr))
        })
    }
    fn add_in_flight(&mut self, provider: &str, key: &str, delta: i32) {
        super::prof::time("host.add_in_flight", || {
            shared::add_in_flight(provider, key, delta);
        })
    }
    fn reserve_send(&mut self, provider: &str, send: Send, allowances: &[Allowance]) -> bool {
        super::prof::time("host.reserve_send", || {
            shared::reserve_send(provider, send, allowances)
        })
    }
    fn release_send(&mut self, provider: &str, send: &Send) {
        super::prof::time("host.release_send", || {
            shared::release_send(provider, send);
        })
    }
    fn hold_cooldown(&mut self, lane: &LaneId, until_ms: i64) {
        super::prof::time("host.hold_cooldown", || {
            shared::hold_cooldown(lane, until_ms);
        })
    }
    fn hold_blacklist(
        &mut self,
        provider: &str,
        key: &str,
        class: Class,
        until_ms: i64,
        fingerprint: u64,
    ) {
        super::prof::time("host.hold_blacklist", || {
            shared::hold_blacklist(provider, key, class, until_ms, fingerprint);
        })
    }
    fn record_latency(&mut self, lane: &LaneId, ms: f64) {
        super::prof::time("host.record_latency", || {
            shared::record_latency(lane, ms);
        })
    }
    fn random_unit(&mut self) -> f64 {
        super::prof::time("host.random_unit", shared::random_unit)
    }
    fn affinity_slot(&self, slot: u64) -> Option<Vec<u8>> {
        super::prof::time("host.affinity_slot", || shared::affinity_slot(slot))
    }
    fn set_affinity_slot(&mut self, slot: u64, record: &[u8]) {
        super::prof::time("host.set_affinity_slot", || {
            shared::set_affinity_slot(slot, record);
        })
    }
    fn cache_slot(&self, slot: u32) -> (Option<Vec<u8>>, Option<u32>) {
        super::prof::time("host.cache_slot", || shared::cache_slot(slot))
    }
    fn set_cache_slot(&mut self, slot: u32, entry: &[u8], cas: Option<u32>) -> bool {
        super::prof::time("host.set_cache_slot", || {
            shared::set_cache_slot(slot, entry, cas)
        })
    }
    fn parked_lanes(&self, provider: &str) -> (Option<Vec<u8>>, Option<u32>) {
        super::prof::time("host.parked_lanes", || shared::parked_lanes(provider))
    }
    fn set_parked_lanes(&mut self, provider: &str, record: &[u8], cas: Option<u32>) -> bool {
        super::prof::time("host.set_parked_lanes", || {
            shared::set_parked_lanes(provider, record, cas)
        })
    }
    fn report_attempt(&mut self, outcome: AttemptOutcome) {
        super::prof::time("host.report_attempt", || {
            shared::report_attempt(outcome);
        })
    }
}

/// The SDK's action for a stage's flow.
pub fn action(flow: Flow) -> Action {
    match flow {
        Flow::Continue => Action::Continue,
        Flow::Pause => Action::Pause,
    }
}
