//! What one worker's VM keeps between callbacks, as one value the filter's roots own and hand
//! to each context ([`Worker`]): the pushed state decoded once per pool version, the lane-health
//! records as last decoded, the call table, round-robin positions, latency EWMAs, the jitter
//! draw, the outcomes held for the singleton and the attempts in flight. Everything it does is
//! here; what it needs from Envoy is [`VmCalls`] (shared data, the clock, the report queue,
//! the gauges), one host call each. [`on_worker::OnWorker`] is the stages' [`crate::host::Host`]
//! made of a worker and the host calls of the stream ([`on_worker::HostCalls`]).

pub mod on_worker;
pub mod view;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use ai_router_contract::shared as names;
use ai_router_proto::v1::{AttemptOutcome, AttemptResult, RequestOutcome, VirtualKey};
use prost::Message;

use crate::state::{LaneHealth, State};
use crate::sync::record::SyncRecord;
use crate::vm::busy::Skipped;
use crate::vm::call::Call;
use crate::vm::calls::CallTable;
use crate::vm::gauge::Gauge;
use crate::vm::lane_records::LaneReader;
use crate::vm::local::{Allowance, Send};
use crate::vm::reports::{Held, MINUTE_ASK, REPORT_ATTEMPT, REPORT_REQUEST};
use crate::vm::round_robin::RoundRobin;
use crate::vm::{read_bytes, records, SharedData, SharedError};
use crate::vocab::LaneId;

/// What a worker needs from Envoy beside the stream: each method is one host call.
pub trait VmCalls: SharedData + Clone + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
    /// Microseconds since the Unix epoch (the overhead's clock).
    fn now_us(&self) -> i64;
    /// The singleton's report queue, if it is registered.
    fn resolve_queue(&self) -> Option<u32>;
    /// Puts one message on a shared queue.
    fn enqueue(&mut self, queue: u32, message: &[u8]) -> Result<(), SharedError>;
    /// Adds `delta` to a gauge (a gauge the host refused is left alone: it is only a view).
    fn gauge(&mut self, gauge: Gauge, delta: i64);
    /// Brings the memory gauge up to this VM's linear memory.
    fn track_memory(&mut self);
}

/// The sync token Envoy passes to the VM's environment, for calls to the control plane.
pub fn sync_token() -> Option<String> {
    std::env::var(ai_router_contract::SYNC_TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty())
}

/// The virtual key whose secret has this SHA-256 (hex), from its own record.
pub fn virtual_key(shared: &impl SharedData, sha256_hex: &str) -> Option<VirtualKey> {
    let bytes = read_bytes(shared, &names::virtual_key(sha256_hex))?;
    <VirtualKey as Message>::decode(bytes.as_slice()).ok()
}

/// A seed that differs between the VMs of the workers.
fn seed(now_ms: i64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(now_ms);
    h.finish()
}

#[derive(Default)]
struct Local {
    state: Option<Rc<State>>,
    /// When the control plane generated the newest update the singleton published.
    synced_at_ms: i64,
    /// How many updates the singleton had applied at the last look.
    sequence: u64,
    calls: CallTable,
    rr: RoundRobin,
    queue: Option<u32>,
    /// Latency EWMA per lane, in ms.
    latency: HashMap<LaneId, f64>,
    rng: u64,
    /// Outcomes waiting to be queued as one bundle.
    held: Held,
}

/// The per-VM state of a worker (see the module's doc). Shared by reference: each part is
/// borrowed only for the length of one operation, and never across a call into a stage.
#[derive(Default)]
pub struct Worker<T = ()> {
    local: RefCell<Local>,
    /// Each provider's lane-health records as last read, decoded (apart from `local`: a
    /// bucket is loaded in the middle of a pick).
    lanes: Rc<RefCell<LaneReader>>,
    /// The attempts in flight, by context id (what the attempt root's tick looks at).
    attempts: RefCell<HashMap<u32, Weak<RefCell<T>>>>,
    skipped: RefCell<Skipped>,
}

impl<T> Worker<T> {
    /// The freshest pool, decoded only when its version changed.
    pub fn state(&self, shared: &impl SharedData) -> Option<Rc<State>> {
        let Some(sync) = read_bytes(shared, names::SYNC).and_then(|b| SyncRecord::decode(&b))
        else {
            return self.local.borrow().state.clone();
        };
        let cached = {
            let mut l = self.local.borrow_mut();
            l.synced_at_ms = sync.generated_at_ms;
            l.sequence = sync.applied;
            l.state.clone()
        };
        if cached
            .as_ref()
            .is_some_and(|s| s.version == sync.pool_version)
        {
            return cached;
        }
        let decoded = match shared.get(names::POOL) {
            Ok((Some(bytes), _)) => State::decode(sync.pool_version, &bytes),
            _ => None,
        };
        match decoded {
            Some(state) => {
                let state = Rc::new(state);
                self.local.borrow_mut().state = Some(state.clone());
                Some(state)
            }
            None => cached,
        }
    }

    /// Moves whenever any pushed record changed (as of the last [`Worker::state`]).
    pub fn state_sequence(&self) -> u64 {
        self.local.borrow().sequence
    }

    /// When the control plane generated the newest update (as of the last [`Worker::state`]).
    pub fn synced_at_ms(&self) -> i64 {
        self.local.borrow().synced_at_ms
    }

    /// A provider's lane health from its records: the provider record per call, a bucket of
    /// keys only when a lookup names one of its keys (`lane_records`), each decoded again only
    /// when it changed.
    pub fn lane_health<S: SharedData + Clone + 'static>(
        &self,
        shared: &S,
        provider: &str,
    ) -> Option<Rc<LaneHealth>> {
        let bytes = read_bytes(shared, &names::lanes(provider))?;
        let record = self.lanes.borrow_mut().provider(provider, &bytes)?;
        if record.count == 0 {
            return Some(Rc::new(LaneHealth::whole(record.parts)));
        }
        let (provider, generation) = (provider.to_owned(), record.generation);
        let (lanes, shared) = (self.lanes.clone(), shared.clone());
        let load = move |b: u32| {
            lanes.borrow_mut().bucket(&provider, b, generation, || {
                shared.get(&names::lane_bucket(&provider, b)).ok()?.0
            })
        };
        Some(Rc::new(LaneHealth::bucketed(
            record.parts,
            record.count,
            Rc::new(load),
        )))
    }

    /// A lane's latency EWMA in ms, if it was ever measured.
    pub fn latency(&self, lane: &LaneId) -> Option<f64> {
        self.local.borrow().latency.get(lane).copied()
    }

    /// Folds a successful attempt's time to first byte into the lane's EWMA (the state's
    /// `ewma_alpha`, as given); with no state yet there was nothing to route, and nothing to
    /// fold.
    pub fn record_latency(&self, shared: &impl SharedData, lane: &LaneId, ms: f64) {
        let Some(alpha) = self.state(shared).map(|s| s.selection().ewma_alpha) else {
            return;
        };
        let mut l = self.local.borrow_mut();
        // Looked up first: the lane is cloned only the first time.
        let e = match l.latency.get_mut(lane) {
            Some(e) => e,
            None => l.latency.entry(lane.clone()).or_insert(ms),
        };
        *e = ai_router_contract::latency::ewma_step(*e, ms, alpha);
    }

    /// A new call id, unique within this Envoy process.
    pub fn new_call(&self, calls: &mut impl VmCalls, now_ms: i64) -> String {
        let (cid, moved) = self.local.borrow_mut().calls.open(now_ms, || seed(now_ms));
        calls.gauge(Gauge::Calls, moved);
        cid
    }

    /// Runs `f` on the call's bookkeeping; `None` when the call is unknown or the table is in
    /// use (`f` must not reach for the rest of the worker).
    pub fn with_call<R>(&self, cid: &str, f: impl FnOnce(&mut Call) -> R) -> Option<R> {
        self.local.try_borrow_mut().ok()?.calls.get_mut(cid).map(f)
    }

    /// One pass: claims `request_id` for the call (see [`crate::vm::calls::CallTable`]).
    pub fn claim_request_id(&self, request_id: &str, cid: &str) -> bool {
        self.local
            .try_borrow_mut()
            .is_ok_and(|mut l| l.calls.claim_request_id(request_id, cid))
    }

    /// One pass: the call that claimed `request_id`.
    pub fn call_by_request_id(&self, request_id: &str) -> Option<String> {
        let local = self.local.try_borrow().ok()?;
        local.calls.by_request_id(request_id).map(str::to_owned)
    }

    /// Closes a call and returns its bookkeeping.
    pub fn end_call(&self, calls: &mut impl VmCalls, cid: &str) -> Option<Call> {
        let call = self.local.borrow_mut().calls.end(cid);
        if call.is_some() {
            calls.gauge(Gauge::Calls, -1);
        }
        calls.track_memory();
        call
    }

    /// Runs `f` with the round-robin positions; `f` may read the rest of the worker.
    pub fn with_round_robin<R>(&self, f: impl FnOnce(&mut RoundRobin) -> R) -> R {
        let mut rr = std::mem::take(&mut self.local.borrow_mut().rr);
        let out = f(&mut rr);
        self.local.borrow_mut().rr = rr;
        out
    }

    /// A number in [0, 1) for jitter (xorshift, seeded per VM).
    pub fn random_unit(&self, now_ms: i64) -> f64 {
        let mut l = self.local.borrow_mut();
        if l.rng == 0 {
            l.rng = seed(now_ms) | 1;
        }
        let mut x = l.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        l.rng = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    /// In-flight attempts per key, counted across every worker of this Envoy.
    pub fn add_in_flight(calls: &mut impl VmCalls, provider: &str, key: &str, delta: i32) {
        if let Some(moved) = records::add_in_flight(calls, provider, key, delta) {
            calls.gauge(Gauge::LaneInFlight, moved);
        }
    }

    /// Reserves one send on a provider's billing scope when its allowances leave room
    /// ([`records::reserve_send`]); a scarce figure makes the held outcomes due at once.
    pub fn reserve_send(
        &self,
        calls: &mut impl VmCalls,
        provider: &str,
        send: Send,
        allowances: &[Allowance],
    ) -> bool {
        self.local
            .borrow_mut()
            .held
            .reserving(allowances.iter().map(|a| a.remaining_requests), send.at_ms);
        records::reserve_send(calls, provider, &send, allowances)
    }

    /// Admits one request of the virtual key by its minute record, and queues the ask for the
    /// next block for the singleton when the record took one ([`records::admit_minute_request`]).
    pub fn admit_minute_request(
        &self,
        calls: &mut impl VmCalls,
        key_id: &str,
        limit: u64,
        now_ms: i64,
    ) -> Option<bool> {
        let (admitted, ask) = records::admit_minute_request(calls, key_id, limit, now_ms)?;
        if let Some(ask) = ask {
            let mut msg = vec![MINUTE_ASK];
            msg.extend(ask.encode_to_vec());
            self.queue_message(calls, &msg);
        }
        Some(admitted)
    }

    /// Puts one message (its kind byte first) on the singleton's report queue; a refused
    /// message makes the queue be resolved again next time (the singleton may have restarted).
    fn queue_message(&self, calls: &mut impl VmCalls, msg: &[u8]) {
        let known = self.local.borrow().queue;
        let Some(q) = known.or_else(|| calls.resolve_queue()) else {
            return;
        };
        let ok = calls.enqueue(q, msg).is_ok();
        self.local.borrow_mut().queue = ok.then_some(q);
    }

    /// Holds an attempt's outcome (`now_ms`: the callback's clock).
    pub fn report_attempt(&self, calls: &mut impl VmCalls, outcome: AttemptOutcome, now_ms: i64) {
        let urgent = outcome.outcome != AttemptResult::Success as i32;
        let body = outcome.encode_to_vec();
        self.hold_report(calls, REPORT_ATTEMPT, &body, urgent, now_ms);
    }

    /// Holds a request's outcome (`now_ms`: the callback's clock).
    pub fn report_request(&self, calls: &mut impl VmCalls, outcome: RequestOutcome, now_ms: i64) {
        let body = outcome.encode_to_vec();
        self.hold_report(calls, REPORT_REQUEST, &body, false, now_ms);
    }

    /// Adds one outcome to this worker's bundle; queues the bundle when it is due (the rule is
    /// [`Held::push`]'s).
    fn hold_report(&self, calls: &mut impl VmCalls, kind: u8, body: &[u8], urgent: bool, now: i64) {
        // Settled by the singleton when a control plane acknowledges it (or it is dropped).
        calls.gauge(Gauge::ReportsPending, 1);
        let due = self.local.borrow_mut().held.push(kind, body, urgent, now);
        if due {
            self.flush_held_reports(calls);
        }
    }

    /// Queues what this worker holds for the singleton.
    pub fn flush_held_reports(&self, calls: &mut impl VmCalls) {
        let held = self.local.borrow_mut().held.take();
        if !held.is_empty() {
            self.queue_message(calls, &held);
        }
    }

    /// The attempt root's tick: queues the held outcomes when due, and answers the attempts
    /// whose `due` says so (skipping one whose stage is running), as of `now_ms`.
    pub fn on_tick(
        &self,
        calls: &mut impl VmCalls,
        now_ms: i64,
        due: impl Fn(&T) -> bool,
    ) -> Vec<(u32, Rc<RefCell<T>>)> {
        calls.track_memory();
        if self.local.borrow().held.due(now_ms) {
            self.flush_held_reports(calls);
        }
        self.attempts
            .borrow()
            .iter()
            .filter_map(|(id, weak)| weak.upgrade().map(|s| (*id, s)))
            .filter(|(_, s)| s.try_borrow().is_ok_and(|s| due(&s)))
            .collect()
    }

    /// An attempt context opened (`id`) with its stage.
    pub fn attempt_opened(&self, calls: &mut impl VmCalls, id: u32, stage: &Rc<RefCell<T>>) {
        let fresh = self
            .attempts
            .borrow_mut()
            .insert(id, Rc::downgrade(stage))
            .is_none();
        if fresh {
            calls.gauge(Gauge::Attempts, 1);
        }
    }

    /// An attempt context went.
    pub fn attempt_closed(&self, calls: &mut impl VmCalls, id: u32) {
        if self.attempts.borrow_mut().remove(&id).is_some() {
            calls.gauge(Gauge::Attempts, -1);
        }
    }

    /// A callback found its stage running and was skipped: counted, and the line to log when
    /// it is this VM's first ([`crate::vm::busy`]).
    pub fn skipped(&self, calls: &mut impl VmCalls, callback: &str) -> Option<String> {
        calls.gauge(Gauge::CallbacksSkipped, 1);
        self.skipped.borrow_mut().skip(callback)
    }
}

#[cfg(test)]
mod tests;
