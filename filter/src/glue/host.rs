//! The host calls, straight to `proxy_wasm::hostcalls`, never through the SDK's trait helpers
//! (`self.get_http_*`), which `unwrap()` internally and decode header values with
//! `String::from_utf8(..).unwrap()`: a client or provider header carrying one byte >= 0x80
//! would panic the VM. Header values are read as bytes; a value that is not UTF-8 is opaque to
//! the gateway (it is never parsed), and every host error is logged with its call and status,
//! and the value taken as absent. [`WasmCalls`] is what `ai_router_filter_core::worker` needs of Envoy:
//! each method one host call.

use std::time::{Duration, UNIX_EPOCH};

use ai_router_contract::shared::{REPORT_QUEUE, VM_ID};
use ai_router_filter_core::host::{Flow, HeaderMap, Refused, Side};
use ai_router_filter_core::vm::gauge::Gauge;
use ai_router_filter_core::vm::{SharedData, SharedError};
use ai_router_filter_core::worker::on_worker::HostCalls;
use ai_router_filter_core::worker::VmCalls;
use proxy_wasm::hostcalls;
use proxy_wasm::types::{Action, BufferType, MapType, Status};

use super::gauges;

/// Logs a failed host call; the callers treat the value as absent and go on.
fn logged<T>(call: &'static str, result: Result<T, Status>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(status) => {
            super::log_error(&format!("ai-router: host call {call} failed: {status:?}"));
            None
        }
    }
}

fn map(side: Side) -> MapType {
    match side {
        Side::Request => MapType::HttpRequestHeaders,
        Side::Response => MapType::HttpResponseHeaders,
    }
}

fn buffer(side: Side) -> BufferType {
    match side {
        Side::Request => BufferType::HttpRequestBody,
        Side::Response => BufferType::HttpResponseBody,
    }
}

/// The plugin configuration bytes, if any.
pub fn plugin_configuration() -> Option<Vec<u8>> {
    let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX);
    logged("get_plugin_configuration", bytes).flatten()
}

/// The gRPC message being delivered (`None` when there is none).
pub fn received(size: usize) -> Option<Vec<u8>> {
    let bytes = hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, size);
    logged("get_grpc_body", bytes).flatten()
}

/// Makes `context_id` the context the following host calls act on, for the rest of this
/// callback (a root context's tick acting for one of its HTTP contexts). `false` when the
/// context is gone.
pub fn set_effective_context(context_id: u32) -> bool {
    let set = hostcalls::set_effective_context(context_id);
    logged("set_effective_context", set).is_some()
}

/// The host's wall clock since the Unix epoch (zero when it cannot say).
fn since_epoch() -> Duration {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .unwrap_or_default()
}

pub fn now_ms() -> i64 {
    since_epoch().as_millis() as i64
}

pub fn now_us() -> i64 {
    since_epoch().as_micros() as i64
}

/// The SDK's action for a stage's flow.
pub fn action(flow: Flow) -> Action {
    match flow {
        Flow::Continue => Action::Continue,
        Flow::Pause => Action::Pause,
    }
}

/// Envoy's host calls, for the worker and the stages.
#[derive(Debug, Clone, Copy, Default)]
pub struct WasmCalls;

impl SharedData for WasmCalls {
    fn get(&self, name: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedError> {
        hostcalls::get_shared_data(name).map_err(shared_error)
    }
    fn set(&mut self, name: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedError> {
        hostcalls::set_shared_data(name, Some(value), cas).map_err(shared_error)
    }
}

fn shared_error(status: Status) -> SharedError {
    match status {
        Status::CasMismatch => SharedError::CasMismatch,
        _ => SharedError::Failed,
    }
}

impl VmCalls for WasmCalls {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
    fn now_us(&self) -> i64 {
        now_us()
    }
    fn resolve_queue(&self) -> Option<u32> {
        hostcalls::resolve_shared_queue(VM_ID, REPORT_QUEUE)
            .ok()
            .flatten()
    }
    fn enqueue(&mut self, queue: u32, message: &[u8]) -> Result<(), SharedError> {
        hostcalls::enqueue_shared_queue(queue, Some(message)).map_err(shared_error)
    }
    fn gauge(&mut self, gauge: Gauge, delta: i64) {
        gauges::add(gauge, delta);
    }
    fn track_memory(&mut self) {
        gauges::track_memory();
    }
}

impl HostCalls for WasmCalls {
    fn header(&self, side: Side, name: &str) -> Option<Vec<u8>> {
        logged(
            "get_header",
            hostcalls::get_map_value_bytes(map(side), name),
        )
        .flatten()
    }
    fn headers(&self, side: Side) -> Vec<(String, Vec<u8>)> {
        logged("get_headers", hostcalls::get_map_bytes(map(side))).unwrap_or_default()
    }
    fn set_header(&mut self, side: Side, name: &str, value: Option<&str>) {
        logged(
            "set_header",
            hostcalls::set_map_value(map(side), name, value),
        );
    }
    fn set_header_bytes(&mut self, side: Side, name: &str, value: &[u8]) {
        let set = hostcalls::set_map_value_bytes(map(side), name, Some(value));
        logged("set_header", set);
    }
    fn set_headers(&mut self, side: Side, map: &HeaderMap) {
        let pairs = map
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        logged(
            "set_headers",
            hostcalls::set_map_bytes(self::map(side), pairs),
        );
    }
    fn body(&self, side: Side, start: usize, size: usize) -> Vec<u8> {
        let bytes = hostcalls::get_buffer(buffer(side), start, size);
        logged("get_body", bytes).flatten().unwrap_or_default()
    }
    fn set_body(&mut self, side: Side, start: usize, size: usize, bytes: &[u8]) {
        logged(
            "set_body",
            hostcalls::set_buffer(buffer(side), start, size, bytes),
        );
    }
    fn send_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        let sent = hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body));
        logged("send_http_response", sent);
    }
    /// Envoy's `proxy_close_stream` always answers `Ok` for an HTTP stream (it defers the reset
    /// until the callback returns); another status is logged like any failed call.
    fn reset_stream(&mut self) {
        logged("reset_http_response", hostcalls::reset_http_response());
    }
    fn dispatch_http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, Refused> {
        let timeout = Duration::from_millis(timeout_ms);
        let token = hostcalls::dispatch_http_call(cluster, headers.to_vec(), None, vec![], timeout);
        logged("dispatch_http_call", token).ok_or(Refused)
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
        let timeout = Duration::from_millis(timeout_ms);
        let token = hostcalls::dispatch_grpc_call(
            cluster,
            service,
            method,
            metadata.to_vec(),
            Some(message),
            timeout,
        );
        logged("dispatch_grpc_call", token).ok_or(Refused)
    }
    fn grpc_call_response_body(&self, size: usize) -> Option<Vec<u8>> {
        received(size)
    }
    fn resume_request(&mut self) {
        logged("resume_http_request", hostcalls::resume_http_request());
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        logged("get_property", hostcalls::get_property(path.to_vec())).flatten()
    }
    fn time<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
        super::prof::time(name, f)
    }
}
