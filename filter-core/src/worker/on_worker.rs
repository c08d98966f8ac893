//! The stages' [`Host`] made of a [`Worker`] and the host calls of one stream
//! ([`HostCalls`]): the glue implements only the calls, one host call each; what the stages
//! keep and share in the VM is the worker's.

use std::cell::RefCell;
use std::rc::Rc;

use ai_router_contract::shared as names;
use ai_router_proto::v1::{AttemptOutcome, RequestOutcome, VirtualKey};

use super::view::WorkerView;
use super::{VmCalls, Worker};
use crate::host::{CallbackClock, Flush, HeaderMap, Host, Listed, Refused, Side, Write};
use crate::state::State;
use crate::vm::call::Call;
use crate::vm::local::{Allowance, Send};
use crate::vm::round_robin::RoundRobin;
use crate::vm::view::View;
use crate::vm::{read_bytes, read_versioned, records};
use crate::vocab::LaneId;
use ai_router_contract::failure::ErrorClass;

/// The host calls a stage makes on its stream, each one call into Envoy; a failed call is
/// logged by the implementation and answered as absent.
pub trait HostCalls: VmCalls {
    fn header(&self, side: Side, name: &str) -> Option<Vec<u8>>;
    fn headers(&self, side: Side) -> Vec<(String, Vec<u8>)>;
    fn set_header(&mut self, side: Side, name: &str, value: Option<&str>);
    fn set_header_bytes(&mut self, side: Side, name: &str, value: &[u8]);
    /// The side's whole map in one call (`proxy_set_header_map_pairs`: Envoy removes every
    /// header, pseudo-headers included, and adds these back).
    fn set_headers(&mut self, side: Side, map: &HeaderMap);
    fn body(&self, side: Side, start: usize, size: usize) -> Vec<u8>;
    fn set_body(&mut self, side: Side, start: usize, size: usize, bytes: &[u8]);
    fn send_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]);
    fn reset_stream(&mut self);
    fn dispatch_http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, Refused>;
    fn dispatch_grpc_call(
        &mut self,
        cluster: &str,
        service: &str,
        method: &str,
        metadata: &[(&str, &[u8])],
        message: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Refused>;
    fn grpc_call_response_body(&self, size: usize) -> Option<Vec<u8>>;
    fn resume_request(&mut self);
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// Runs `f`, timed under `name` where the build profiles (the filter's `profile` feature).
    fn time<R>(_name: &'static str, f: impl FnOnce() -> R) -> R {
        f()
    }
}

/// A stage's host for one callback: the stream's calls and the worker of its VM, and the
/// callback's one reading of the clock. The callback's header writes to a side it listed are
/// held in the listing and made when the host is dropped, which the glue does before it hands
/// the callback's action to Envoy (or before a resume or a reset, which hand the stream over).
pub struct OnWorker<'a, C: HostCalls, T = ()> {
    pub calls: C,
    pub worker: &'a Worker<T>,
    clock: CallbackClock,
    /// Each side's map as this callback listed it, kept up to date with the callback's own
    /// writes: the later reads of the callback are answered from it, and its writes held
    /// until [`OnWorker::write_held`] ([`Listed`]).
    listed: Listed,
    /// The state as this callback first read it: one read of the sync record per callback,
    /// and one state for all of the callback's decisions.
    state: RefCell<Option<Option<Rc<State>>>>,
}

impl<'a, C: HostCalls, T> OnWorker<'a, C, T> {
    /// The host of one callback (made again for each: its clock is read once).
    pub fn new(calls: C, worker: &'a Worker<T>) -> Self {
        Self {
            calls,
            worker,
            clock: CallbackClock::default(),
            listed: Listed::default(),
            state: RefCell::new(None),
        }
    }

    /// Makes held header writes: a side's whole map in one call, or one call a name
    /// ([`crate::host::WHOLE_MAP_FROM`]).
    fn write_held(&mut self, held: Vec<(Side, Flush)>) {
        for (side, flush) in held {
            match flush {
                Flush::Whole(map) => {
                    C::time("host.set_headers", || self.calls.set_headers(side, &map))
                }
                Flush::Each(writes) => C::time("host.set_header", || {
                    for (name, value) in writes {
                        match value {
                            Some(v) => self.calls.set_header_bytes(side, &name, &v),
                            None => self.calls.set_header(side, &name, None),
                        }
                    }
                }),
            }
        }
    }

    fn clock_ms(&self) -> i64 {
        self.clock
            .ms(|| C::time("host.now_us", || self.calls.now_us()))
    }
}

/// The callback ends: its held header writes are made (the glue drops its host before it
/// returns the callback's action to Envoy).
impl<C: HostCalls, T> Drop for OnWorker<'_, C, T> {
    fn drop(&mut self) {
        self.write_held(self.listed.end());
    }
}

impl<C: HostCalls, T> Host for OnWorker<'_, C, T> {
    fn header(&self, side: Side, name: &str) -> Option<Vec<u8>> {
        if let Some(value) = self.listed.header(side, name) {
            return value;
        }
        C::time("host.header", || self.calls.header(side, name))
    }
    fn headers(&self, side: Side) -> Vec<(String, Vec<u8>)> {
        self.list_headers(side);
        self.listed.headers(side).unwrap_or_default()
    }
    fn list_headers(&self, side: Side) {
        if !self.listed.is_listed(side) {
            let all = C::time("host.headers", || self.calls.headers(side));
            self.listed.keep(side, all);
        }
    }
    fn listed(&self, side: Side) -> Rc<HeaderMap> {
        self.list_headers(side);
        self.listed.map(side).unwrap_or_default()
    }
    fn set_header(&mut self, side: Side, name: &str, value: Option<&str>) {
        if self.listed.set(side, name, value.map(str::as_bytes)) != Write::Now {
            return;
        }
        C::time("host.set_header", || {
            self.calls.set_header(side, name, value)
        })
    }
    fn set_header_bytes(&mut self, side: Side, name: &str, value: &[u8]) {
        if self.listed.set(side, name, Some(value)) != Write::Now {
            return;
        }
        C::time("host.set_header_bytes", || {
            self.calls.set_header_bytes(side, name, value)
        })
    }
    fn body(&self, side: Side, start: usize, size: usize) -> Vec<u8> {
        C::time("host.body", || self.calls.body(side, start, size))
    }
    fn set_body(&mut self, side: Side, start: usize, size: usize, bytes: &[u8]) {
        C::time("host.set_body", || {
            self.calls.set_body(side, start, size, bytes)
        })
    }
    fn send_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        self.write_held(self.listed.answer_locally());
        C::time("host.send_response", || {
            self.calls.send_response(status, headers, body)
        })
    }
    fn reset_stream(&mut self) {
        self.write_held(self.listed.hand_over());
        C::time("host.reset_stream", || self.calls.reset_stream())
    }
    fn now_ms(&self) -> i64 {
        self.clock_ms()
    }
    fn now_us(&self) -> i64 {
        self.clock
            .us(|| C::time("host.now_us", || self.calls.now_us()))
    }
    fn state(&self) -> Option<Rc<State>> {
        if let Some(read) = self.state.borrow().as_ref() {
            return read.clone();
        }
        let read = C::time("host.state", || self.worker.state(&self.calls));
        *self.state.borrow_mut() = Some(read.clone());
        read
    }
    fn virtual_key(&self, sha256_hex: &str) -> Option<VirtualKey> {
        C::time("host.virtual_key", || {
            super::virtual_key(&self.calls, sha256_hex)
        })
    }
    fn state_sequence(&self) -> u64 {
        self.state();
        self.worker.state_sequence()
    }
    fn admit_minute_request(&mut self, key_id: &str, limit: u64, now_ms: i64) -> Option<bool> {
        C::time("host.admit_minute_request", || {
            self.worker
                .admit_minute_request(&mut self.calls, key_id, limit, now_ms)
        })
    }
    fn new_call(&mut self, now_ms: i64) -> String {
        C::time("host.new_call", || {
            self.worker.new_call(&mut self.calls, now_ms)
        })
    }
    fn call_attempts(&self, call_id: &str) -> Option<u32> {
        C::time("host.call_attempts", || {
            self.worker.with_call(call_id, |c| c.attempts)
        })
    }
    fn end_call(&mut self, call_id: &str) -> Option<Call> {
        C::time("host.end_call", || {
            self.worker.end_call(&mut self.calls, call_id)
        })
    }
    fn report_request(&mut self, outcome: RequestOutcome) {
        let now = self.clock_ms();
        C::time("host.report_request", || {
            self.worker.report_request(&mut self.calls, outcome, now)
        })
    }
    fn dispatch_http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, Refused> {
        C::time("host.dispatch_http_call", || {
            self.calls.dispatch_http_call(cluster, headers, timeout_ms)
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
        C::time("host.dispatch_grpc_call", || {
            self.calls
                .dispatch_grpc_call(cluster, service, method, metadata, message, timeout_ms)
        })
    }
    fn grpc_call_response_body(&self, size: usize) -> Option<Vec<u8>> {
        C::time("host.grpc_call_response_body", || {
            self.calls.grpc_call_response_body(size)
        })
    }
    fn resume_request(&mut self) {
        self.write_held(self.listed.hand_over());
        C::time("host.resume_request", || self.calls.resume_request())
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        C::time("host.property", || self.calls.property(path))
    }
    fn sync_token(&self) -> Option<String> {
        C::time("host.sync_token", super::sync_token)
    }
    fn with_call<R>(&mut self, call_id: &str, f: impl FnOnce(&mut Call) -> R) -> Option<R> {
        C::time("host.with_call", || self.worker.with_call(call_id, f))
    }
    fn claim_request_id(&mut self, request_id: &str, call_id: &str) -> bool {
        self.worker.claim_request_id(request_id, call_id)
    }
    fn call_by_request_id(&self, request_id: &str) -> Option<String> {
        self.worker.call_by_request_id(request_id)
    }
    fn with_lanes<R>(&mut self, f: impl FnOnce(&dyn View, &mut RoundRobin) -> R) -> R {
        C::time("host.with_lanes", || {
            let view = WorkerView::new(self.calls.clone(), self.worker);
            self.worker.with_round_robin(|rr| f(&view, rr))
        })
    }
    fn add_in_flight(&mut self, provider: &str, key: &str, delta: i32) {
        C::time("host.add_in_flight", || {
            Worker::<T>::add_in_flight(&mut self.calls, provider, key, delta)
        })
    }
    fn reserve_send(&mut self, provider: &str, send: Send, allowances: &[Allowance]) -> bool {
        C::time("host.reserve_send", || {
            self.worker
                .reserve_send(&mut self.calls, provider, send, allowances)
        })
    }
    fn release_send(&mut self, provider: &str, send: &Send) {
        C::time("host.release_send", || {
            records::release_send(&mut self.calls, provider, send)
        })
    }
    fn hold_cooldown(&mut self, lane: &LaneId, until_ms: i64) {
        let now = self.clock_ms();
        C::time("host.hold_cooldown", || {
            records::hold_cooldown(&mut self.calls, lane, until_ms, now);
        })
    }
    fn hold_blacklist(
        &mut self,
        provider: &str,
        key: &str,
        class: ErrorClass,
        until_ms: i64,
        fingerprint: u64,
    ) {
        let now = self.clock_ms();
        C::time("host.hold_blacklist", || {
            let hold = (class, until_ms, fingerprint);
            records::hold_blacklist(&mut self.calls, provider, key, hold, now);
        })
    }
    fn record_latency(&mut self, lane: &LaneId, ms: f64) {
        C::time("host.record_latency", || {
            self.worker.record_latency(&self.calls, lane, ms)
        })
    }
    fn random_unit(&mut self) -> f64 {
        C::time("host.random_unit", || {
            self.worker.random_unit(self.clock_ms())
        })
    }
    fn affinity_slot(&self, slot: u64) -> Option<Vec<u8>> {
        C::time("host.affinity_slot", || {
            read_bytes(&self.calls, &names::affinity(slot))
        })
    }
    fn set_affinity_slot(&mut self, slot: u64, record: &[u8]) {
        // The last writer wins (a pin is a hint, not a lease).
        C::time("host.set_affinity_slot", || {
            let _ = self.calls.set(&names::affinity(slot), record, None);
        })
    }
    fn cache_slot(&self, slot: u32) -> (Option<Vec<u8>>, Option<u32>) {
        C::time("host.cache_slot", || {
            read_versioned(&self.calls, &names::cache(slot))
        })
    }
    fn set_cache_slot(&mut self, slot: u32, entry: &[u8], cas: Option<u32>) -> bool {
        C::time("host.set_cache_slot", || {
            self.calls.set(&names::cache(slot), entry, cas).is_ok()
        })
    }
    fn parked_lanes(&self, provider: &str) -> (Option<Vec<u8>>, Option<u32>) {
        C::time("host.parked_lanes", || {
            read_versioned(&self.calls, &names::parked(provider))
        })
    }
    fn set_parked_lanes(&mut self, provider: &str, record: &[u8], cas: Option<u32>) -> bool {
        C::time("host.set_parked_lanes", || {
            self.calls
                .set(&names::parked(provider), record, cas)
                .is_ok()
        })
    }
    fn report_attempt(&mut self, outcome: AttemptOutcome) {
        let now = self.clock_ms();
        C::time("host.report_attempt", || {
            self.worker.report_attempt(&mut self.calls, outcome, now)
        })
    }
}
