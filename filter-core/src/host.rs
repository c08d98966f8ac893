//! What a stage needs from Envoy, as a trait: the stream's headers and bodies, a local answer,
//! the clock, the pushed state and this VM's shared bookkeeping. The filter implements it over
//! `proxy_wasm::hostcalls` (`filter/src/glue/host.rs`); the tests here implement it with a fake
//! ([`fake::FakeHost`]) and drive the stages through whole calls on the host.

use std::rc::Rc;

use ai_router_proto::v1::{AttemptOutcome, RequestOutcome, VirtualKey};

use crate::classify::Class;
use crate::sync::state::State;
use crate::vm::calls::Call;
use crate::vm::local::{Allowance, Send};
use crate::vm::round_robin::RoundRobin;
use crate::vm::view::View;
use crate::vocab::LaneId;

/// A host call that could not be made (a dispatch the host refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused;

/// What a callback tells Envoy to do with the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Pause,
}

/// One of the stream's two header maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Request,
    Response,
}

pub trait Host {
    /// The raw value of a header (values need not be UTF-8).
    fn header(&self, side: Side, name: &str) -> Option<Vec<u8>>;
    /// Every header of that side, values as raw bytes.
    fn headers(&self, side: Side) -> Vec<(String, Vec<u8>)>;
    /// Sets (or with `None` removes) a header.
    fn set_header(&mut self, side: Side, name: &str, value: Option<&str>);
    /// Sets a header to raw bytes.
    fn set_header_bytes(&mut self, side: Side, name: &str, value: &[u8]);
    /// `size` bytes from `start` of the body received so far.
    fn body(&self, side: Side, start: usize, size: usize) -> Vec<u8>;
    /// Replaces `size` bytes from `start` of the body with `bytes`.
    fn set_body(&mut self, side: Side, start: usize, size: usize, bytes: &[u8]);
    /// Answers the stream locally.
    fn send_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]);
    /// Resets the stream (its upstream request too): what is left when an answer that has
    /// started cannot be ended with anything written into it.
    fn reset_stream(&mut self);

    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
    /// The freshest pushed state, if any has arrived.
    fn state(&self) -> Option<Rc<State>>;
    /// The virtual key with this SHA-256 (hex), as last pushed.
    fn virtual_key(&self, sha256_hex: &str) -> Option<VirtualKey>;
    /// A number that moves whenever anything pushed changed (a breaker, a hold, a key), not
    /// only the pool [`State`] carries.
    fn state_sequence(&self) -> u64;
    /// Admits one request of a virtual key whose `requestsPerMinute` is `limit` by this
    /// process's record of the key's minute ([`crate::vm::minute_lease::MinuteLease::admit`],
    /// across the workers), and hands the ask for the next block, if the record took one, to
    /// the singleton. `None` when it could not be counted.
    fn admit_minute_request(&mut self, key_id: &str, limit: u64, now_ms: i64) -> Option<bool>;
    /// Opens this VM's bookkeeping for a new call; returns its id.
    fn new_call(&mut self, now_ms: i64) -> String;
    /// The attempts the call made so far.
    fn call_attempts(&self, call_id: &str) -> Option<u32>;
    /// Closes a call's bookkeeping and returns it.
    fn end_call(&mut self, call_id: &str) -> Option<Call>;
    /// Queues a request outcome for the control plane.
    fn report_request(&mut self, outcome: RequestOutcome);

    // The attempt stage's needs.

    /// An HTTP call (the timer listener); its answer comes back with the returned token.
    fn dispatch_http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, Refused>;
    /// A unary gRPC call (the probe lease); its answer comes back with the returned token.
    fn dispatch_grpc_call(
        &mut self,
        cluster: &str,
        service: &str,
        method: &str,
        metadata: &[(&str, &[u8])],
        message: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Refused>;
    /// The body of the gRPC answer being delivered.
    fn grpc_call_response_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Lets a request paused by an asynchronous step go on.
    fn resume_request(&mut self);
    /// A stream property (`["response", "code_details"]`).
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// The sync token, for calls to the control plane.
    fn sync_token(&self) -> Option<String>;
    /// Runs `f` on a call's bookkeeping.
    fn with_call<R>(&mut self, call_id: &str, f: impl FnOnce(&mut Call) -> R) -> Option<R>;
    /// Runs `f` with the picker's view of this process (holds, in-flight counts, latency)
    /// and this VM's round-robin positions.
    fn with_lanes<R>(&mut self, f: impl FnOnce(&dyn View, &mut RoundRobin) -> R) -> R;
    /// Adds to a key's in-flight count, across the process.
    fn add_in_flight(&mut self, provider: &str, key: &str, delta: i32);
    /// Reserves one send on a provider's billing scope when `allowance` leaves room for it,
    /// atomically across the process's workers ([`crate::vm::local::Sends::reserve`]).
    fn reserve_send(&mut self, provider: &str, send: Send, allowances: &[Allowance]) -> bool;
    /// Gives a reservation back (the attempt never reached the provider).
    fn release_send(&mut self, provider: &str, send: &Send);
    /// Cools a lane for the whole process at once (the control plane's push follows).
    fn hold_cooldown(&mut self, lane: &LaneId, until_ms: i64);
    /// Takes a key out for the whole process at once.
    fn hold_blacklist(
        &mut self,
        provider: &str,
        key: &str,
        class: Class,
        until_ms: i64,
        fingerprint: u64,
    );
    /// Folds a successful attempt's time to first byte into the lane's latency EWMA.
    fn record_latency(&mut self, lane: &LaneId, ms: f64);
    /// A number in [0, 1), for jitter.
    fn random_unit(&mut self) -> f64;
    /// Queues an attempt outcome for the control plane.
    fn report_attempt(&mut self, outcome: AttemptOutcome);
    /// A session-affinity slot of this process (`affinity`), if written.
    fn affinity_slot(&self, slot: u64) -> Option<Vec<u8>>;
    /// Overwrites a session-affinity slot, for every worker of the process.
    fn set_affinity_slot(&mut self, slot: u64, record: &[u8]);
    /// A response-cache slot of this process (`cache`): what it holds (`None`: nothing) and
    /// the compare-and-swap token of that version.
    fn cache_slot(&self, slot: u32) -> (Option<Vec<u8>>, Option<u32>);
    /// Writes a response-cache slot for every worker of the process, when it is still the
    /// version `cas` read (`None`: whatever it holds); `false` when another worker wrote it
    /// first or the host refused.
    fn set_cache_slot(&mut self, slot: u32, entry: &[u8], cas: Option<u32>) -> bool;
    /// A provider's parked lanes (snap-back, [`crate::lanes::park`]), shared by the workers of the
    /// process: the record (`None`: never written) and its compare-and-swap token.
    fn parked_lanes(&self, provider: &str) -> (Option<Vec<u8>>, Option<u32>);
    /// Writes a provider's parked lanes when the record is still the version `cas` read;
    /// `false` when another worker wrote it first or the host refused.
    fn set_parked_lanes(&mut self, provider: &str, record: &[u8], cas: Option<u32>) -> bool;

    /// The names of every header of that side.
    fn header_names(&self, side: Side) -> Vec<String> {
        self.headers(side).into_iter().map(|(k, _)| k).collect()
    }

    /// A header's value when it is UTF-8 text; a value that is not is opaque, as if absent.
    fn header_text(&self, side: Side, name: &str) -> Option<String> {
        self.header(side, name)
            .and_then(|v| String::from_utf8(v).ok())
    }
}

#[cfg(test)]
pub mod fake {
    //! A host for tests: header maps, bodies, a clock, a state and the calls, all in memory, and
    //! a record of what the stage did (local answers, reports).

    use std::collections::HashMap;
    use std::rc::Rc;

    use ai_router_proto::v1::{AttemptOutcome, RequestOutcome};

    use super::{Host, Refused, Side};
    use crate::classify::Class;
    use crate::sync::state::State;
    use crate::vm::calls::Call;
    use crate::vm::local::{Allowance, Send, Sends};
    use crate::vm::minute_lease::{Ask, MinuteLease};
    use crate::vm::round_robin::RoundRobin;
    use crate::vm::view::View;
    use crate::vocab::{LaneId, LocalHold};

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

    /// The picker's view in a test: holds and in-flight counts set by the test or the stage.
    #[derive(Debug, Default)]
    pub struct FakeLanes {
        pub holds: HashMap<LaneId, Vec<LocalHold>>,
        pub in_flight: HashMap<(String, String), i64>,
        /// Per provider and billing scope, one record each as in Envoy's shared data.
        pub sends: HashMap<(String, String), Sends>,
        /// The parked lanes per provider (snap-back).
        pub parked: SharedStore,
    }

    impl View for FakeLanes {
        fn holds(&self, lane: &LaneId) -> Vec<LocalHold> {
            self.holds.get(lane).cloned().unwrap_or_default()
        }
        fn in_flight(&self, provider: &str, key: &str) -> u32 {
            self.in_flight
                .get(&(provider.to_string(), key.to_string()))
                .copied()
                .unwrap_or(0)
                .max(0) as u32
        }
        fn provider_in_flight(&self, provider: &str) -> u32 {
            self.in_flight
                .iter()
                .filter(|((p, _), _)| p == provider)
                .map(|(_, n)| (*n).max(0) as u32)
                .sum()
        }
        fn sent_since(&self, provider: &str, scope: &str, model: &str, since: i64) -> (u64, u64) {
            self.sends
                .get(&(provider.to_string(), scope.to_string()))
                .map_or((0, 0), |s| s.since(scope, model, since))
        }
        fn parked(&self, lane: &LaneId) -> Option<i64> {
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
        pub state: Option<Rc<State>>,
        /// Each key's minute record, and the asks for blocks the stage handed over.
        pub minute_leases: HashMap<String, MinuteLease>,
        pub minute_asks: Vec<(String, Ask)>,
        pub calls: HashMap<String, Call>,
        pub next_call: u64,
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
    }

    impl FakeHost {
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
    }

    impl Host for FakeHost {
        fn header(&self, side: Side, name: &str) -> Option<Vec<u8>> {
            self.map(side)
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
        fn headers(&self, side: Side) -> Vec<(String, Vec<u8>)> {
            self.map(side).clone()
        }
        fn set_header_bytes(&mut self, side: Side, name: &str, value: &[u8]) {
            let map = self.map_mut(side);
            map.retain(|(k, _)| k != name);
            map.push((name.to_string(), value.to_vec()));
        }
        fn set_header(&mut self, side: Side, name: &str, value: Option<&str>) {
            let map = self.map_mut(side);
            map.retain(|(k, _)| k != name);
            if let Some(v) = value {
                map.push((name.to_string(), v.as_bytes().to_vec()));
            }
        }
        fn body(&self, side: Side, start: usize, size: usize) -> Vec<u8> {
            let body = match side {
                Side::Request => &self.request_body,
                Side::Response => &self.response_body,
            };
            body.iter().skip(start).take(size).copied().collect()
        }
        fn set_body(&mut self, side: Side, start: usize, size: usize, bytes: &[u8]) {
            let body = match side {
                Side::Request => &mut self.request_body,
                Side::Response => &mut self.response_body,
            };
            let end = (start + size).min(body.len());
            let start = start.min(end);
            body.splice(start..end, bytes.iter().copied());
        }
        fn send_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
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
            self.resets += 1;
        }
        fn now_ms(&self) -> i64 {
            self.now
        }
        fn state(&self) -> Option<Rc<State>> {
            self.state.clone()
        }
        fn virtual_key(&self, sha256_hex: &str) -> Option<ai_router_proto::v1::VirtualKey> {
            self.state.as_ref()?.virtual_key(sha256_hex).cloned()
        }
        fn state_sequence(&self) -> u64 {
            self.state.as_ref().map_or(0, |s| s.version)
        }
        fn admit_minute_request(&mut self, key_id: &str, limit: u64, now_ms: i64) -> Option<bool> {
            let stored = self.minute_leases.get(key_id).copied();
            let minute = crate::front::quota::minute_of(now_ms);
            let (lease, verdict) = MinuteLease::admit(stored, minute, limit, now_ms);
            self.minute_leases.insert(key_id.to_string(), lease);
            if let Some(ask) = verdict.ask {
                self.minute_asks.push((key_id.to_string(), ask));
            }
            Some(verdict.admitted)
        }
        fn new_call(&mut self, now_ms: i64) -> String {
            self.next_call += 1;
            let id = format!("call-{}", self.next_call);
            self.calls.insert(
                id.clone(),
                Call {
                    created_ms: now_ms,
                    ..Call::default()
                },
            );
            id
        }
        fn call_attempts(&self, call_id: &str) -> Option<u32> {
            self.calls.get(call_id).map(|c| c.attempts)
        }
        fn end_call(&mut self, call_id: &str) -> Option<Call> {
            self.calls.remove(call_id)
        }
        fn report_request(&mut self, outcome: RequestOutcome) {
            self.reports.push(outcome);
        }
        fn dispatch_http_call(
            &mut self,
            cluster: &str,
            headers: &[(&str, &str)],
            _timeout_ms: u64,
        ) -> Result<u32, Refused> {
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
            self.grpc_body.clone()
        }
        fn resume_request(&mut self) {
            self.resumed += 1;
        }
        fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
            self.properties.get(&path.join(".")).cloned()
        }
        fn sync_token(&self) -> Option<String> {
            Some("sync-token".into())
        }
        fn with_call<R>(&mut self, call_id: &str, f: impl FnOnce(&mut Call) -> R) -> Option<R> {
            self.calls.get_mut(call_id).map(f)
        }
        fn with_lanes<R>(&mut self, f: impl FnOnce(&dyn View, &mut RoundRobin) -> R) -> R {
            self.lane_views += 1;
            f(&self.lanes, &mut self.rr)
        }
        fn add_in_flight(&mut self, provider: &str, key: &str, delta: i32) {
            *self
                .lanes
                .in_flight
                .entry((provider.to_string(), key.to_string()))
                .or_default() += i64::from(delta);
        }
        fn reserve_send(&mut self, provider: &str, send: Send, allowances: &[Allowance]) -> bool {
            self.lanes
                .sends
                .entry((provider.to_string(), send.scope.clone()))
                .or_default()
                .reserve(send, allowances)
        }
        fn release_send(&mut self, provider: &str, send: &Send) {
            let record = (provider.to_string(), send.scope.clone());
            if let Some(s) = self.lanes.sends.get_mut(&record) {
                s.release(send);
            }
        }
        fn hold_cooldown(&mut self, lane: &LaneId, until_ms: i64) {
            self.lanes
                .holds
                .entry(lane.clone())
                .or_default()
                .push(LocalHold::Cooldown {
                    until_ms,
                    set_at_ms: self.now,
                });
        }
        fn hold_blacklist(
            &mut self,
            provider: &str,
            key: &str,
            class: Class,
            until_ms: i64,
            fingerprint: u64,
        ) {
            // A key's blacklist holds every model of it; the tests look it up by lane.
            for model in self.models_of(provider) {
                self.lanes
                    .holds
                    .entry(LaneId::new(provider, key, &model))
                    .or_default()
                    .push(LocalHold::Blacklist {
                        class,
                        until_ms,
                        fingerprint,
                        set_at_ms: self.now,
                    });
            }
        }
        fn record_latency(&mut self, lane: &LaneId, ms: f64) {
            self.latencies.push((lane.clone(), ms));
        }
        fn random_unit(&mut self) -> f64 {
            self.draws.pop_front().unwrap_or(0.5)
        }
        fn affinity_slot(&self, slot: u64) -> Option<Vec<u8>> {
            self.affinity.get(&slot).cloned()
        }
        fn set_affinity_slot(&mut self, slot: u64, record: &[u8]) {
            self.affinity.insert(slot, record.to_vec());
        }
        fn cache_slot(&self, slot: u32) -> (Option<Vec<u8>>, Option<u32>) {
            match self.cache.get(&slot) {
                Some((bytes, version)) => (Some(bytes.clone()), Some(*version)),
                None => (None, None),
            }
        }
        fn set_cache_slot(&mut self, slot: u32, entry: &[u8], cas: Option<u32>) -> bool {
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
            self.attempts.push(outcome);
        }
        fn parked_lanes(&self, provider: &str) -> (Option<Vec<u8>>, Option<u32>) {
            match self.lanes.parked.borrow().get(provider) {
                Some((bytes, version)) => (Some(bytes.clone()), Some(*version)),
                None => (None, None),
            }
        }
        fn set_parked_lanes(&mut self, provider: &str, record: &[u8], cas: Option<u32>) -> bool {
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

    impl FakeHost {
        fn models_of(&self, provider: &str) -> Vec<String> {
            self.state
                .as_ref()
                .and_then(|s| {
                    s.provider(provider)
                        .map(|(_, p)| p.models.iter().map(|m| m.id.clone()).collect())
                })
                .unwrap_or_default()
        }
    }
}
