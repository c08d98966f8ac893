//! The singleton that holds the control plane's sync stream for this Envoy process: Envoy's
//! callbacks forwarded to `ai_router_filter_core::sync::SyncClient` over [`CtrlHost`], whose
//! methods are host calls.

use std::time::Duration;

use ai_router_contract::shared::REPORT_QUEUE;
use ai_router_filter_core::sync::{
    host::{Level, SyncHost},
    SyncClient,
};
use ai_router_filter_core::vm::gauge::Gauge;
use ai_router_filter_core::vm::{SharedData, SharedError};
use ai_router_filter_core::worker::sync_token;
use ai_router_proto::names::sync;
use proxy_wasm::hostcalls;

use super::gauges;
use super::host::{now_ms, received, WasmCalls};
use super::{log_error, log_info};

const TOKEN_HEADER: &str = ai_router_contract::SYNC_TOKEN_METADATA;

pub struct Ctrl {
    client: SyncClient,
    host: CtrlHost,
}

/// The host calls the sync client makes.
struct CtrlHost {
    cluster: String,
    token: Option<String>,
    queue: Option<u32>,
}

impl Ctrl {
    pub fn new(cluster: String, node: String) -> Self {
        Self {
            client: SyncClient::new(node, now_ms()),
            host: CtrlHost {
                cluster,
                token: sync_token(),
                queue: None,
            },
        }
    }

    pub fn start(&mut self, tick_ms: u64) {
        match hostcalls::register_shared_queue(REPORT_QUEUE) {
            Ok(q) => self.host.queue = Some(q),
            Err(e) => log_error(&format!(
                "ai-router: cannot register the report queue: {e:?}"
            )),
        }
        let _ = hostcalls::set_tick_period(Duration::from_millis(tick_ms));
    }

    pub fn on_tick(&mut self) {
        self.client.on_tick(&mut self.host);
    }

    pub fn on_stream_message(&mut self, token: u32, size: usize) {
        let bytes = received(size);
        self.client
            .on_message(&mut self.host, token, bytes.as_deref());
    }

    pub fn on_stream_close(&mut self, token: u32, status: u32) {
        let (_, message) = hostcalls::get_grpc_status().unwrap_or((status, None));
        self.client
            .on_close(&mut self.host, token, status, message.as_deref());
    }

    pub fn on_queue_ready(&mut self, _queue: u32) {
        self.client.reports.flush(&mut self.host);
    }

    pub fn on_call_response(&mut self, token: u32, status: u32, size: usize) {
        let body = (status == 0).then(|| received(size)).flatten();
        self.client
            .reports
            .on_call_response(&mut self.host, token, status, body.as_deref());
    }
}

impl CtrlHost {
    fn metadata(&self) -> Vec<(&str, &[u8])> {
        match &self.token {
            Some(t) => vec![(TOKEN_HEADER, t.as_bytes())],
            None => Vec::new(),
        }
    }
}

impl SharedData for CtrlHost {
    fn get(&self, name: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedError> {
        WasmCalls.get(name)
    }
    fn set(&mut self, name: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedError> {
        WasmCalls.set(name, value, cas)
    }
}

impl SyncHost for CtrlHost {
    fn now_ms(&self) -> i64 {
        now_ms()
    }

    fn open_watch(&mut self, request: &[u8]) -> Result<u32, String> {
        let token =
            hostcalls::open_grpc_stream(&self.cluster, sync::SERVICE, sync::WATCH, self.metadata())
                .map_err(|e| format!("to cluster '{}': {e:?}", self.cluster))?;
        if let Err(e) = hostcalls::send_grpc_stream_message(token, Some(request), true) {
            log_error(&format!("ai-router: cannot send the watch request: {e:?}"));
        }
        Ok(token)
    }

    fn cancel_watch(&mut self, token: u32) {
        let _ = hostcalls::cancel_grpc_stream(token);
    }

    fn call(&mut self, method: &str, message: &[u8], timeout_ms: u64) -> Result<u32, String> {
        hostcalls::dispatch_grpc_call(
            &self.cluster,
            sync::SERVICE,
            method,
            self.metadata(),
            Some(message),
            Duration::from_millis(timeout_ms),
        )
        .map_err(|e| format!("{e:?}"))
    }

    fn dequeue(&mut self) -> Option<Vec<u8>> {
        hostcalls::dequeue_shared_queue(self.queue?).ok().flatten()
    }

    fn log(&mut self, level: Level, line: &str) {
        match level {
            Level::Info => log_info(line),
            Level::Error => log_error(line),
        }
    }

    fn reports_settled(&mut self, n: u64) {
        gauges::add(Gauge::ReportsPending, -i64::try_from(n).unwrap_or(i64::MAX));
    }

    fn state_applied(&mut self, version: u64) {
        gauges::set(Gauge::StateVersion, version);
    }
}
