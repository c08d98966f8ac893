//! A host for tests ([`FakeHost`], made with [`FakeHost::builder`]): header maps, bodies, a
//! clock, a state and the calls, all in memory, and a record of what the stage did (local
//! answers, reports). Built for this crate's tests and, with the feature `testing`, for other
//! crates'.
//!
//! Where it behaves as the wasm host does: the records the workers change together (holds,
//! in-flight counts) are real records in a [`crate::vm::MemoryShared`], changed by the same
//! [`crate::vm::records`] functions with the same compare-and-swap, and read back as the
//! filter's view reads them (a key's blacklist is one key-wide hold, counts never go below 0).
//! Where it still differs from it, on purpose (a test sets these directly):
//! - `state_sequence` is the state's version; in Envoy it counts every update applied;
//! - `virtual_key` is looked up in the state; in Envoy each key is its own record;
//! - `with_call` always finds the call table free; in Envoy a re-entered table answers `None`;
//! - `sync_token` is set (`sync-token`) unless the builder clears it;
//! - `reserve_send` keeps its scopes in a map (`lanes.sends`), never losing a race.
//!
//! [`sim::CallSim`] runs whole calls over one of these: the front stage, the attempts as the
//! rendered router retries them, and the front stage again, over one shared store.

use std::collections::HashMap;
use std::rc::Rc;

use ai_router_contract::shared as names;

use ai_router_proto::v1::{AttemptOutcome, RequestOutcome};

use crate::host::{Flush, Host, Refused, Side, Write};
use crate::state::State;
use crate::vm::call::Call;
use crate::vm::calls::CallTable;
use crate::vm::local::{Allowance, InFlight, ProviderHolds, Send, Sends};
use crate::vm::minute_lease::{Ask, MinuteLease};
use crate::vm::round_robin::RoundRobin;
use crate::vm::view::View;
use crate::vm::MemoryShared;
use crate::vm::{read_record, records};
use crate::vocab::{LaneId, LocalHold};
use ai_router_contract::failure::ErrorClass;

pub mod sim;

/// A call the stage dispatched.
#[derive(Debug, Clone, PartialEq)]
pub enum Dispatched {
    Http {
        cluster: String,
        headers: Vec<(String, String)>,
    },
    Grpc {
        cluster: String,
        method: String,
        metadata: Vec<(String, Vec<u8>)>,
        message: Vec<u8>,
    },
}

/// Records the workers of one process share, each with its version (the CAS token): two
/// fake hosts given clones of one store are two workers of one Envoy.
pub type SharedStore = Rc<std::cell::RefCell<HashMap<String, (Vec<u8>, u32)>>>;

/// The picker's view in a test: holds and in-flight counts as the workers' records.
#[derive(Debug, Default)]
pub struct FakeLanes {
    /// The holds and in-flight records, by their names in Envoy's shared data.
    pub records: MemoryShared,
    /// Per provider and billing scope, one record each as in Envoy's shared data.
    pub sends: HashMap<(String, String), Sends>,
    /// The parked lanes per provider (snap-back).
    pub parked: SharedStore,
    /// How many times the picker's view was asked about a lane, key or provider: each is a
    /// shared-data read in Envoy, so this is what a pick costs against the pool's size.
    pub reads: std::cell::Cell<u64>,
}

impl FakeLanes {
    fn read(&self) {
        self.reads.set(self.reads.get() + 1);
    }
}

impl View for FakeLanes {
    fn holds(&self, lane: &LaneId) -> Vec<LocalHold> {
        self.read();
        let name = names::holds(&lane.provider);
        read_record(&self.records, &name, ProviderHolds::decode).of_lane(&lane.key, &lane.model)
    }
    fn in_flight(&self, provider: &str, key: &str) -> u32 {
        self.read();
        let name = names::in_flight(provider);
        read_record(&self.records, &name, InFlight::decode).of(key)
    }
    fn provider_in_flight(&self, provider: &str) -> u32 {
        self.read();
        let name = names::in_flight(provider);
        read_record(&self.records, &name, InFlight::decode).total()
    }
    fn sent_since(&self, provider: &str, scope: &str, model: &str, since: i64) -> (u64, u64) {
        self.read();
        self.sends
            .get(&(provider.to_string(), scope.to_string()))
            .map_or((0, 0), |s| s.since(scope, model, since))
    }
    fn parked(&self, lane: &LaneId) -> Option<i64> {
        self.read();
        let store = self.parked.borrow();
        let (bytes, _) = store.get(&lane.provider)?;
        crate::lanes::park::ParkedLanes::decode(bytes)?.probe_at(&lane.key, &lane.model)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LocalAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl LocalAnswer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
pub struct FakeHost {
    pub request_headers: Vec<(String, Vec<u8>)>,
    pub response_headers: Vec<(String, Vec<u8>)>,
    pub request_body: Vec<u8>,
    pub response_body: Vec<u8>,
    pub answered: Option<LocalAnswer>,
    /// How many times the stage reset the stream.
    pub resets: u32,
    /// How many times the stage opened the picker's view (each one costs shared-data reads
    /// in Envoy).
    pub lane_views: u32,
    pub now: i64,
    /// Microseconds past `now` on the overhead's clock (`now_us` is `now * 1000 + micros`).
    pub micros: i64,
    pub state: Option<Rc<State>>,
    /// Each key's minute record, and the asks for blocks the stage handed over.
    pub minute_leases: HashMap<String, MinuteLease>,
    pub minute_asks: Vec<(String, Ask)>,
    /// The calls in progress, in the worker's own table (ids `call-1`, `call-2`, …).
    pub calls: CallTable,
    pub reports: Vec<RequestOutcome>,
    pub attempts: Vec<AttemptOutcome>,
    pub dispatched: Vec<Dispatched>,
    pub next_token: u32,
    pub refuse_dispatch: bool,
    pub grpc_body: Option<Vec<u8>>,
    pub resumed: u32,
    pub properties: HashMap<String, Vec<u8>>,
    pub lanes: FakeLanes,
    pub rr: RoundRobin,
    pub latencies: Vec<(LaneId, f64)>,
    pub affinity: HashMap<u64, Vec<u8>>,
    /// Response-cache slots: what each holds and its version (the CAS token).
    pub cache: HashMap<u32, (Vec<u8>, u32)>,
    /// Writes `set_cache_slot` loses to another worker before it wins (a race).
    pub cache_races: u32,
    /// Draws `random_unit` returns in turn (then 0.5).
    pub draws: std::collections::VecDeque<f64>,
    /// `None`: the sync token is unset (the builder's `no_sync_token`).
    pub no_sync_token: bool,
    /// How many times the stage called each host method (what each costs a crossing into
    /// Envoy in the filter): [`FakeHost::host_calls`].
    pub tallies: std::cell::RefCell<std::collections::BTreeMap<&'static str, u64>>,
    /// The clock as this callback read it (`now * 1000 + micros`), as Envoy's host reads it
    /// once per callback ([`crate::host::CallbackClock`]): a read counts as a host call when
    /// the callback had not read it yet ([`FakeHost::next_callback`]) or the test moved it.
    pub clock_read: std::cell::Cell<Option<i64>>,
    /// Whether this callback read the state: Envoy's host reads the sync record once per
    /// callback (`worker::on_worker::OnWorker`), so only the first read counts.
    pub state_read: std::cell::Cell<bool>,
    /// The sides this callback listed, with the writes held since (`host::Listed`, as
    /// `OnWorker` keeps them): a later read of a listed side counts no host call, and its
    /// writes count as the calls that make them when the callback ends (values are read and
    /// written live here).
    pub listed: crate::host::Listed,
}

/// Builds a [`FakeHost`]: `FakeHost::builder().state(s).header(Side::Request, "a", b"b").build()`.
#[derive(Default)]
pub struct FakeHostBuilder {
    host: FakeHost,
}

impl FakeHostBuilder {
    /// The pushed state (the clock starts at 1,700,000,000,000 ms either way).
    pub fn state(mut self, state: State) -> Self {
        self.host.state = Some(Rc::new(state));
        self
    }
    pub fn now(mut self, now_ms: i64) -> Self {
        self.host.now = now_ms;
        self
    }
    /// A header as a client (request) or an upstream (response) sent it.
    pub fn header(mut self, side: Side, name: &str, value: &[u8]) -> Self {
        self.host.add(side, name, value);
        self
    }
    pub fn request_body(mut self, body: &[u8]) -> Self {
        self.host.request_body = body.to_vec();
        self
    }
    pub fn response_body(mut self, body: &[u8]) -> Self {
        self.host.response_body = body.to_vec();
        self
    }
    /// Draws `random_unit` returns in turn.
    pub fn draws(mut self, draws: &[f64]) -> Self {
        self.host.draws = draws.iter().copied().collect();
        self
    }
    /// Dispatches are refused.
    pub fn refuse_dispatch(mut self) -> Self {
        self.host.refuse_dispatch = true;
        self
    }
    pub fn no_sync_token(mut self) -> Self {
        self.host.no_sync_token = true;
        self
    }
    pub fn build(self) -> FakeHost {
        self.host
    }
}

impl FakeHost {
    pub fn builder() -> FakeHostBuilder {
        FakeHostBuilder {
            host: FakeHost {
                now: 1_700_000_000_000,
                ..FakeHost::default()
            },
        }
    }

    pub fn with_state(state: State) -> Self {
        Self {
            now: 1_700_000_000_000,
            state: Some(Rc::new(state)),
            ..Self::default()
        }
    }

    fn map(&self, side: Side) -> &Vec<(String, Vec<u8>)> {
        match side {
            Side::Request => &self.request_headers,
            Side::Response => &self.response_headers,
        }
    }

    fn map_mut(&mut self, side: Side) -> &mut Vec<(String, Vec<u8>)> {
        match side {
            Side::Request => &mut self.request_headers,
            Side::Response => &mut self.response_headers,
        }
    }

    /// Adds a header as a client or an upstream would send it.
    pub fn add(&mut self, side: Side, name: &str, value: &[u8]) {
        self.map_mut(side).push((name.to_string(), value.to_vec()));
    }

    pub fn text(&self, side: Side, name: &str) -> Option<String> {
        self.header_text(side, name)
    }

    /// The plan the front stage left for the attempt stage: the one kept in the call its
    /// request's plan header names.
    pub fn planned(&self) -> Option<crate::plan::Plan> {
        let ticket = self.header_text(Side::Request, crate::plan::PLAN_HEADER)?;
        crate::plan::Written::read(&ticket, |cid| self.calls.get(cid)?.plan.clone())
            .map(|plan| (*plan).clone())
    }

    /// Hands `plan` to the attempt stage as the front stage does: kept in its call (opened
    /// when the table has none), its ticket in the request's plan header.
    pub fn hand_plan(&mut self, plan: &crate::plan::Plan) {
        let written = crate::plan::Written::new(plan.clone(), 0x5eed);
        let ticket = written.ticket.clone();
        match self.calls.get_mut(&plan.cid) {
            Some(call) => call.plan = Some(written),
            None => self.calls.insert(
                plan.cid.clone(),
                crate::vm::call::Call {
                    plan: Some(written),
                    ..Default::default()
                },
            ),
        }
        self.request_headers
            .retain(|(n, _)| n != crate::plan::PLAN_HEADER);
        self.add(Side::Request, crate::plan::PLAN_HEADER, ticket.as_bytes());
    }

    fn tally(&self, method: &'static str) {
        *self.tallies.borrow_mut().entry(method).or_default() += 1;
    }

    /// A header write costs a host call now when the callback did not list the side; a
    /// write to a listed side is held (or, when it changes nothing, never made) as `OnWorker`
    /// holds it, and counted when the callback ends ([`FakeHost::write_held`]).
    fn tally_write(&self, method: &'static str, side: Side, name: &str, value: Option<&[u8]>) {
        if self.listed.set(side, name, value) == Write::Now {
            self.tally(method);
        }
    }

    /// Counts held writes as the host calls `OnWorker` makes of them.
    fn write_held(&self, held: Vec<(Side, Flush)>) {
        for (_, flush) in held {
            match flush {
                Flush::Whole(_) => self.tally("set_headers"),
                Flush::Each(writes) => {
                    for (_, value) in writes {
                        self.tally(match value {
                            Some(_) => "set_header_bytes",
                            None => "set_header",
                        });
                    }
                }
            }
        }
    }

    /// The host calls made since the last [`FakeHost::reset_tallies`], per method.
    /// Reading them ends the callback (its held writes count).
    pub fn host_calls(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.write_held(self.listed.end());
        self.tallies.borrow().clone()
    }

    /// All host calls made since the last reset.
    pub fn host_calls_total(&self) -> u64 {
        self.write_held(self.listed.end());
        self.tallies.borrow().values().sum()
    }

    /// A new callback begins: its first reading of the clock is a host call again.
    pub fn next_callback(&mut self) {
        self.clock_read.set(None);
        self.state_read.set(false);
        self.write_held(self.listed.end());
        self.listed.forget();
    }

    /// The state read, tallied once per callback (see `state_read`).
    fn read_state(&self) {
        if !self.state_read.replace(true) {
            self.tally("state");
        }
    }

    fn listed_side(&self, side: Side) -> bool {
        self.listed.is_listed(side)
    }

    /// The clock in µs, tallied once per callback (see `clock_read`).
    fn clock_us(&self) -> i64 {
        let us = self.now * 1000 + self.micros;
        if self.clock_read.get() != Some(us) {
            self.tally("clock");
            self.clock_read.set(Some(us));
        }
        us
    }

    /// Starts the host-call and view-read counts again.
    pub fn reset_tallies(&mut self) {
        self.tallies.borrow_mut().clear();
        self.lanes.reads.set(0);
    }
}

impl Host for FakeHost {
    fn header(&self, side: Side, name: &str) -> Option<Vec<u8>> {
        if !self.listed_side(side) {
            self.tally("header");
        }
        self.map(side)
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
    fn headers(&self, side: Side) -> Vec<(String, Vec<u8>)> {
        self.list_headers(side);
        self.map(side).clone()
    }
    fn list_headers(&self, side: Side) {
        if !self.listed_side(side) {
            self.tally("headers");
            self.listed.keep(side, self.map(side).clone());
        }
    }
    fn listed(&self, side: Side) -> std::rc::Rc<crate::host::HeaderMap> {
        // The callback's listing, shared as `OnWorker` shares it (its writes keep it current).
        // A test that wrote the map directly since gets the map as it is now.
        self.list_headers(side);
        match self.listed.map(side) {
            Some(listing) if *listing == *self.map(side) => listing,
            _ => std::rc::Rc::new(self.map(side).clone()),
        }
    }
    fn set_header_bytes(&mut self, side: Side, name: &str, value: &[u8]) {
        self.tally_write("set_header_bytes", side, name, Some(value));
        let map = self.map_mut(side);
        map.retain(|(k, _)| k != name);
        map.push((name.to_string(), value.to_vec()));
    }
    fn set_header(&mut self, side: Side, name: &str, value: Option<&str>) {
        self.tally_write("set_header", side, name, value.map(str::as_bytes));
        let map = self.map_mut(side);
        map.retain(|(k, _)| k != name);
        if let Some(v) = value {
            map.push((name.to_string(), v.as_bytes().to_vec()));
        }
    }
    fn body(&self, side: Side, start: usize, size: usize) -> Vec<u8> {
        self.tally("body");
        let body = match side {
            Side::Request => &self.request_body,
            Side::Response => &self.response_body,
        };
        body.iter().skip(start).take(size).copied().collect()
    }
    fn set_body(&mut self, side: Side, start: usize, size: usize, bytes: &[u8]) {
        self.tally("set_body");
        let body = match side {
            Side::Request => &mut self.request_body,
            Side::Response => &mut self.response_body,
        };
        let end = (start + size).min(body.len());
        let start = start.min(end);
        body.splice(start..end, bytes.iter().copied());
    }
    fn send_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        self.write_held(self.listed.answer_locally());
        self.tally("send_response");
        self.answered = Some(LocalAnswer {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.to_vec(),
        });
    }
    fn reset_stream(&mut self) {
        self.write_held(self.listed.hand_over());
        self.tally("reset_stream");
        self.resets += 1;
    }
    fn now_ms(&self) -> i64 {
        self.clock_us();
        self.now
    }
    fn now_us(&self) -> i64 {
        self.clock_us()
    }
    fn state(&self) -> Option<Rc<State>> {
        self.read_state();
        self.state.clone()
    }
    fn virtual_key(&self, sha256_hex: &str) -> Option<ai_router_proto::v1::VirtualKey> {
        self.tally("virtual_key");
        self.state.as_ref()?.virtual_key(sha256_hex).cloned()
    }
    fn state_sequence(&self) -> u64 {
        self.read_state();
        self.state.as_ref().map_or(0, |s| s.version)
    }
    fn admit_minute_request(&mut self, key_id: &str, limit: u64, now_ms: i64) -> Option<bool> {
        self.tally("admit_minute_request");
        let stored = self.minute_leases.get(key_id).copied();
        let minute = crate::vm::minute_lease::minute_of(now_ms);
        let (lease, verdict) = MinuteLease::admit(stored, minute, limit, now_ms);
        self.minute_leases.insert(key_id.to_string(), lease);
        if let Some(ask) = verdict.ask {
            self.minute_asks.push((key_id.to_string(), ask));
        }
        Some(verdict.admitted)
    }
    fn new_call(&mut self, now_ms: i64) -> String {
        self.tally("new_call");
        self.calls.open_as(now_ms, || "call".into()).0
    }
    fn call_attempts(&self, call_id: &str) -> Option<u32> {
        self.tally("call_attempts");
        self.calls.get(call_id).map(|c| c.attempts)
    }
    fn end_call(&mut self, call_id: &str) -> Option<Call> {
        self.tally("end_call");
        self.calls.end(call_id)
    }
    fn report_request(&mut self, outcome: RequestOutcome) {
        self.tally("report_request");
        self.reports.push(outcome);
    }
    fn dispatch_http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        _timeout_ms: u64,
    ) -> Result<u32, Refused> {
        self.tally("dispatch_http_call");
        if self.refuse_dispatch {
            return Err(Refused);
        }
        self.dispatched.push(Dispatched::Http {
            cluster: cluster.into(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
        self.next_token += 1;
        Ok(self.next_token)
    }
    fn dispatch_grpc_call(
        &mut self,
        cluster: &str,
        _service: &str,
        method: &str,
        metadata: &[(&str, &[u8])],
        message: &[u8],
        _timeout_ms: u64,
    ) -> Result<u32, Refused> {
        self.tally("dispatch_grpc_call");
        if self.refuse_dispatch {
            return Err(Refused);
        }
        self.dispatched.push(Dispatched::Grpc {
            cluster: cluster.into(),
            method: method.into(),
            metadata: metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
            message: message.to_vec(),
        });
        self.next_token += 1;
        Ok(self.next_token)
    }
    fn grpc_call_response_body(&self, _size: usize) -> Option<Vec<u8>> {
        self.tally("grpc_call_response_body");
        self.grpc_body.clone()
    }
    fn resume_request(&mut self) {
        self.write_held(self.listed.hand_over());
        self.tally("resume_request");
        self.resumed += 1;
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.tally("property");
        self.properties.get(&path.join(".")).cloned()
    }
    fn sync_token(&self) -> Option<String> {
        self.tally("sync_token");
        (!self.no_sync_token).then(|| "sync-token".into())
    }
    fn with_call<R>(&mut self, call_id: &str, f: impl FnOnce(&mut Call) -> R) -> Option<R> {
        self.tally("with_call");
        self.calls.get_mut(call_id).map(f)
    }
    fn claim_request_id(&mut self, request_id: &str, call_id: &str) -> bool {
        self.tally("claim_request_id");
        self.calls.claim_request_id(request_id, call_id)
    }
    fn call_by_request_id(&self, request_id: &str) -> Option<String> {
        self.tally("call_by_request_id");
        self.calls.by_request_id(request_id).map(str::to_owned)
    }
    fn with_lanes<R>(&mut self, f: impl FnOnce(&dyn View, &mut RoundRobin) -> R) -> R {
        self.tally("with_lanes");
        self.lane_views += 1;
        f(&self.lanes, &mut self.rr)
    }
    fn add_in_flight(&mut self, provider: &str, key: &str, delta: i32) {
        self.tally("add_in_flight");
        records::add_in_flight(&mut self.lanes.records, provider, key, delta);
    }
    fn reserve_send(&mut self, provider: &str, send: Send, allowances: &[Allowance]) -> bool {
        self.tally("reserve_send");
        self.lanes
            .sends
            .entry((provider.to_string(), send.scope.clone()))
            .or_default()
            .reserve(send, allowances)
    }
    fn release_send(&mut self, provider: &str, send: &Send) {
        self.tally("release_send");
        let record = (provider.to_string(), send.scope.clone());
        if let Some(s) = self.lanes.sends.get_mut(&record) {
            s.release(send);
        }
    }
    fn hold_cooldown(&mut self, lane: &LaneId, until_ms: i64) {
        self.tally("hold_cooldown");
        records::hold_cooldown(&mut self.lanes.records, lane, until_ms, self.now);
    }
    fn hold_blacklist(
        &mut self,
        provider: &str,
        key: &str,
        class: ErrorClass,
        until_ms: i64,
        fingerprint: u64,
    ) {
        self.tally("hold_blacklist");
        let hold = (class, until_ms, fingerprint);
        records::hold_blacklist(&mut self.lanes.records, provider, key, hold, self.now);
    }
    fn record_latency(&mut self, lane: &LaneId, ms: f64) {
        self.tally("record_latency");
        self.latencies.push((lane.clone(), ms));
    }
    fn random_unit(&mut self) -> f64 {
        self.tally("random_unit");
        self.draws.pop_front().unwrap_or(0.5)
    }
    fn affinity_slot(&self, slot: u64) -> Option<Vec<u8>> {
        self.tally("affinity_slot");
        self.affinity.get(&slot).cloned()
    }
    fn set_affinity_slot(&mut self, slot: u64, record: &[u8]) {
        self.tally("set_affinity_slot");
        self.affinity.insert(slot, record.to_vec());
    }
    fn cache_slot(&self, slot: u32) -> (Option<Vec<u8>>, Option<u32>) {
        self.tally("cache_slot");
        match self.cache.get(&slot) {
            Some((bytes, version)) => (Some(bytes.clone()), Some(*version)),
            None => (None, None),
        }
    }
    fn set_cache_slot(&mut self, slot: u32, entry: &[u8], cas: Option<u32>) -> bool {
        self.tally("set_cache_slot");
        let version = self.cache.get(&slot).map(|(_, v)| *v);
        if self.cache_races > 0 {
            // Another worker writes the slot between this one's read and write.
            self.cache_races -= 1;
            let next = version.unwrap_or(0) + 1;
            self.cache.insert(slot, (b"another".to_vec(), next));
            return false;
        }
        if cas.is_some() && cas != version {
            return false;
        }
        let next = version.unwrap_or(0) + 1;
        self.cache.insert(slot, (entry.to_vec(), next));
        true
    }
    fn report_attempt(&mut self, outcome: AttemptOutcome) {
        self.tally("report_attempt");
        self.attempts.push(outcome);
    }
    fn parked_lanes(&self, provider: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.tally("parked_lanes");
        match self.lanes.parked.borrow().get(provider) {
            Some((bytes, version)) => (Some(bytes.clone()), Some(*version)),
            None => (None, None),
        }
    }
    fn set_parked_lanes(&mut self, provider: &str, record: &[u8], cas: Option<u32>) -> bool {
        self.tally("set_parked_lanes");
        let mut store = self.lanes.parked.borrow_mut();
        let version = store.get(provider).map(|(_, v)| *v);
        if cas.is_some() && cas != version {
            return false;
        }
        let next = version.unwrap_or(0) + 1;
        store.insert(provider.to_string(), (record.to_vec(), next));
        true
    }
}

/// A provider of the tests' pools: one key `a` with `secret`, these models.
pub fn provider(
    id: &str,
    secret: &str,
    models: Vec<ai_router_proto::v1::Model>,
) -> ai_router_proto::v1::Provider {
    ai_router_proto::v1::Provider {
        id: id.into(),
        keys: vec![ai_router_proto::v1::ProviderKey {
            alias: "a".into(),
            secret: secret.into(),
            ..Default::default()
        }],
        models,
        ..Default::default()
    }
}

/// A provider of `kind` at `http://<id>.test:8000/v1`, with these keys (each one's secret
/// `sk-<id>-<key>-secret`, fingerprinted) and one model.
pub fn provider_of_kind(
    id: &str,
    kind: ai_router_proto::v1::ProviderKind,
    keys: &[&str],
    model_id: &str,
) -> ai_router_proto::v1::Provider {
    use ai_router_proto::v1::ProviderKind;
    ai_router_proto::v1::Provider {
        id: id.into(),
        kind: kind.into(),
        scheme: "http".into(),
        authority: format!("{id}.test:8000"),
        base_path: "/v1".into(),
        auth_header: match kind {
            ProviderKind::Anthropic => "x-api-key".into(),
            _ => "authorization".into(),
        },
        keys: keys
            .iter()
            .map(|k| {
                let secret = format!("sk-{id}-{k}-secret");
                ai_router_proto::v1::ProviderKey {
                    alias: (*k).into(),
                    fingerprint: ai_router_contract::fingerprint(&secret),
                    secret,
                    ..Default::default()
                }
            })
            .collect(),
        models: vec![model(model_id, &[])],
        // As the control plane pushes it: resolved.
        default_max_tokens: ai_router_contract::defaults::DEFAULT_MAX_TOKENS,
        ..Default::default()
    }
}

/// A model of the tests' pools, with its aliases.
pub fn model(id: &str, aliases: &[&str]) -> ai_router_proto::v1::Model {
    ai_router_proto::v1::Model {
        id: id.into(),
        aliases: aliases.iter().map(|a| (*a).to_owned()).collect(),
        ..Default::default()
    }
}

/// An enabled virtual key bound to every profile and model, whose secret is `secret`.
pub fn open_key(id: &str, secret: &str) -> ai_router_proto::v1::VirtualKey {
    ai_router_proto::v1::VirtualKey {
        id: id.into(),
        sha256: ai_router_contract::sha256_hex(secret.as_bytes()),
        profiles: vec!["*".into()],
        models: vec!["*".into()],
        allow_fallback: true,
        enabled: true,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_sets_what_a_stage_reads() {
        let host = FakeHost::builder()
            .now(5)
            .header(Side::Request, "x-a", b"1")
            .request_body(b"{}")
            .no_sync_token()
            .build();
        assert_eq!(host.now_ms(), 5);
        assert_eq!(host.text(Side::Request, "x-a").as_deref(), Some("1"));
        assert_eq!(host.body(Side::Request, 0, 10), b"{}");
        assert_eq!(host.sync_token(), None);
    }

    #[test]
    fn the_fake_counts_a_listed_map_s_writes_as_on_worker_makes_them() {
        let mut host = FakeHost::builder()
            .header(Side::Request, "x-a", b"1")
            .build();
        host.set_header(Side::Request, "x-b", None);
        assert_eq!(host.host_calls_total(), 1, "unlisted: a host call");
        host.headers(Side::Request);
        let before = host.request_headers.clone();
        host.set_header(Side::Request, "x-b", None);
        host.set_header(Side::Request, "x-a", Some("1"));
        assert_eq!(host.host_calls_total(), 2, "the listing only");
        assert_eq!(host.request_headers, before);
        host.set_header(Side::Request, "x-a", Some("2"));
        host.set_header(Side::Request, "x-c", Some("3"));
        assert_eq!(host.text(Side::Request, "x-c").as_deref(), Some("3"));
        // The callback ends: its two writes are the whole map in one call, as `OnWorker`.
        host.next_callback();
        assert_eq!(host.host_calls().get("set_headers"), Some(&1));
        assert_eq!(host.host_calls_total(), 3);
    }

    #[test]
    fn calls_live_in_the_worker_s_table_and_are_swept_by_its_rule() {
        use crate::vm::calls::{ABANDONED_MS, SWEEP_ABOVE};
        let mut host = FakeHost::builder().build();
        let first = host.new_call(0);
        assert_eq!(first, "call-1");
        for i in 1..=SWEEP_ABOVE {
            host.new_call(ABANDONED_MS + i as i64);
        }
        assert!(
            host.call_attempts(&first).is_none(),
            "abandoned, swept as in Envoy"
        );
        assert_eq!(host.calls.len(), SWEEP_ABOVE);
    }

    #[test]
    fn holds_and_counts_behave_as_envoy_s_records() {
        let mut host = FakeHost::builder().build();
        // A blacklist holds every model of the key, also one the state does not list.
        host.hold_blacklist("p", "a", ErrorClass::Auth, host.now + 1_000, 7);
        let lane = LaneId::new("p", "a", "any-model");
        assert_eq!(host.lanes.holds(&lane).len(), 1);
        // A count never goes below 0: a stray release does not lend a slot to the next add.
        host.add_in_flight("p", "a", -1);
        host.add_in_flight("p", "a", 1);
        assert_eq!(host.lanes.in_flight("p", "a"), 1);
        assert_eq!(host.lanes.provider_in_flight("p"), 1);
    }
}
