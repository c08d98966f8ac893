//! What the workers share: the pushed state as records the ctrl singleton writes to shared data
//! (the pool, decoded once per pool version per VM; one virtual key and one provider's lane
//! health, read when a request needs them), holds one worker puts on lanes for all (shared
//! data), the lanes parked for snap-back (shared data), this VM's calls in progress, in-flight
//! counts and round-robin positions (thread-local: the front and attempt stages of one call
//! run on the same worker), and the report queue.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use ai_router_contract::shared as names;
use ai_router_proto::v1::{AttemptOutcome, RequestOutcome, VirtualKey};
use prost::Message;
use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

use ai_router_filter_core::classify::Class;
use ai_router_filter_core::lanes::park::ParkedLanes;
use ai_router_filter_core::state::{LaneHealth, State};
use ai_router_filter_core::sync::record::SyncRecord;
use ai_router_filter_core::vm::calls::CallTable;
use ai_router_filter_core::vm::lane_records::LaneReader;
use ai_router_filter_core::vm::local::{Allowance, InFlight, ProviderHolds, Send, Sends};
use ai_router_filter_core::vm::reports::Held;
use ai_router_filter_core::vm::round_robin::RoundRobin;
use ai_router_filter_core::vm::view::View;
use ai_router_filter_core::vm::{read_bytes, read_record, read_versioned, records};
use ai_router_filter_core::vm::{SharedData, SharedError};
use ai_router_filter_core::vocab::{LaneId, LocalHold};

use super::gauges::{self, Gauge};

use ai_router_filter_core::sync::reports::{MINUTE_ASK, REPORT_ATTEMPT, REPORT_REQUEST};
pub use names::{REPORT_QUEUE, VM_ID};

pub use ai_router_filter_core::vm::call::Call;

/// The host's shared data, for the records in `ai_router_filter_core::vm`.
pub struct WasmShared;

impl SharedData for WasmShared {
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

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
    /// Each provider's lane-health records as last read, decoded (apart from `LOCAL`: a
    /// bucket is loaded in the middle of a pick).
    static LANES: RefCell<LaneReader> = RefCell::new(LaneReader::default());
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

/// The freshest pool, decoded only when its version changed.
pub fn current_state() -> Option<Rc<State>> {
    let Some(sync) = read_bytes(&WasmShared, names::SYNC).and_then(|b| SyncRecord::decode(&b))
    else {
        return LOCAL.with(|l| l.borrow().state.clone());
    };
    let (version, synced_at, sequence) = (sync.pool_version, sync.generated_at_ms, sync.applied);
    let cached = LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        l.synced_at_ms = synced_at;
        l.sequence = sequence;
        l.state.clone()
    });
    if let Some(s) = &cached {
        if s.version == version {
            return cached;
        }
    }
    let decoded = match WasmShared.get(names::POOL) {
        Ok((Some(bytes), _)) => State::decode(version, &bytes),
        _ => None,
    };
    match decoded {
        Some(state) => {
            let state = Rc::new(state);
            LOCAL.with(|l| l.borrow_mut().state = Some(state.clone()));
            Some(state)
        }
        None => cached,
    }
}

/// Moves whenever any pushed record changed (as of the last [`current_state`]).
pub fn state_sequence() -> u64 {
    LOCAL.with(|l| l.borrow().sequence)
}

/// The virtual key whose secret has this SHA-256 (hex), from its own record.
pub fn virtual_key(sha256_hex: &str) -> Option<VirtualKey> {
    let bytes = read_bytes(&WasmShared, &names::virtual_key(sha256_hex))?;
    <VirtualKey as Message>::decode(bytes.as_slice()).ok()
}

/// A provider's lane health from its records: the provider record per call, a bucket of keys
/// only when a lookup names one of its keys (`lane_records`), each decoded again only when it
/// changed.
fn lane_health(provider: &str) -> Option<Rc<LaneHealth>> {
    let bytes = read_bytes(&WasmShared, &names::lanes(provider))?;
    let record = LANES.with(|r| r.borrow_mut().provider(provider, &bytes))?;
    if record.count == 0 {
        return Some(Rc::new(LaneHealth::whole(record.parts)));
    }
    let provider = provider.to_owned();
    let generation = record.generation;
    let load = move |b: u32| {
        LANES.with(|r| {
            r.borrow_mut().bucket(&provider, b, generation, || {
                WasmShared.get(&names::lane_bucket(&provider, b)).ok()?.0
            })
        })
    };
    Some(Rc::new(LaneHealth::bucketed(
        record.parts,
        record.count,
        Rc::new(load),
    )))
}

/// A new call id, unique within this Envoy process.
pub fn new_call(now: i64) -> String {
    let (cid, moved) = LOCAL.with(|l| {
        l.borrow_mut().calls.open(now, || {
            // Distinguishes the VMs of the workers from each other.
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_i64(now);
            h.finish()
        })
    });
    gauges::add(Gauge::Calls, moved);
    cid
}

/// Runs `f` on the call's bookkeeping; `f` must not reach for the rest of the local state.
pub fn with_call<R>(cid: &str, f: impl FnOnce(&mut Call) -> R) -> Option<R> {
    LOCAL.with(|l| l.try_borrow_mut().ok()?.calls.get_mut(cid).map(f))
}

pub fn end_call(cid: &str) -> Option<Call> {
    let call = LOCAL.with(|l| l.borrow_mut().calls.end(cid));
    if call.is_some() {
        gauges::add(Gauge::Calls, -1);
    }
    gauges::track_memory();
    call
}

/// In-flight attempts per key, counted across every worker of this Envoy.
pub fn add_in_flight(provider: &str, key: &str, delta: i32) {
    if let Some(moved) = records::add_in_flight(&mut WasmShared, provider, key, delta) {
        gauges::add(Gauge::LaneInFlight, moved);
    }
}

/// Reserves one send on a provider's billing scope when its allowances leave room
/// ([`records::reserve_send`]).
pub fn reserve_send(provider: &str, send: Send, allowances: &[Allowance]) -> bool {
    LOCAL.with(|l| {
        l.borrow_mut()
            .held
            .reserving(allowances.iter().map(|a| a.remaining_requests), send.at_ms)
    });
    records::reserve_send(&mut WasmShared, provider, &send, allowances)
}

/// Gives a reservation back.
pub fn release_send(provider: &str, send: &Send) {
    records::release_send(&mut WasmShared, provider, send);
}

/// Admits one request of the virtual key by its minute record, and queues the ask for the
/// next block for the singleton when the record took one ([`records::admit_minute_request`]).
pub fn admit_minute_request(key_id: &str, limit: u64, now: i64) -> Option<bool> {
    let (admitted, ask) = records::admit_minute_request(&mut WasmShared, key_id, limit, now)?;
    if let Some(ask) = ask {
        enqueue(MINUTE_ASK, ask.encode_to_vec());
    }
    Some(admitted)
}

/// A session-affinity slot, shared by the workers of this Envoy process.
pub fn affinity_slot(slot: u64) -> Option<Vec<u8>> {
    read_bytes(&WasmShared, &names::affinity(slot))
}

/// Overwrites a session-affinity slot; the last writer wins (a pin is a hint, not a lease).
pub fn set_affinity_slot(slot: u64, record: &[u8]) {
    let _ = WasmShared.set(&names::affinity(slot), record, None);
}

/// A response-cache slot of this Envoy process and its CAS token.
pub fn cache_slot(slot: u32) -> (Option<Vec<u8>>, Option<u32>) {
    read_versioned(&WasmShared, &names::cache(slot))
}

/// A provider's parked lanes (snap-back) and the record's version.
pub fn parked_lanes(provider: &str) -> (Option<Vec<u8>>, Option<u32>) {
    read_versioned(&WasmShared, &names::parked(provider))
}

/// Writes a provider's parked lanes if the record is still the version `cas` read.
pub fn set_parked_lanes(provider: &str, record: &[u8], cas: Option<u32>) -> bool {
    WasmShared
        .set(&names::parked(provider), record, cas)
        .is_ok()
}

/// Writes a response-cache slot if it is still the version `cas` read.
pub fn set_cache_slot(slot: u32, entry: &[u8], cas: Option<u32>) -> bool {
    WasmShared.set(&names::cache(slot), entry, cas).is_ok()
}

/// A number in [0, 1) for jitter (xorshift, seeded per VM).
pub fn random_unit() -> f64 {
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        if l.rng == 0 {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_i64(now_ms());
            l.rng = h.finish() | 1;
        }
        let mut x = l.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        l.rng = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// Folds a successful attempt's time to first byte into the lane's EWMA.
pub fn record_latency(lane: &LaneId, ms: f64) {
    let alpha = current_state()
        .map(|s| s.selection().ewma_alpha)
        .unwrap_or(ai_router_contract::defaults::EWMA_ALPHA);
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let e = match l.latency.get_mut(lane) {
            Some(e) => e,
            None => l.latency.entry(lane.clone()).or_insert(ms),
        };
        *e = alpha * ms + (1.0 - alpha) * *e;
    })
}

/// The sync token Envoy passes to the VM, for calls to the control plane.
pub fn sync_token() -> Option<String> {
    std::env::var(ai_router_contract::SYNC_TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty())
}

/// Runs `f` with the round-robin positions; `f` may read the rest of the local state.
pub fn with_round_robin<R>(f: impl FnOnce(&mut RoundRobin) -> R) -> R {
    let mut rr = LOCAL.with(|l| std::mem::take(&mut l.borrow_mut().rr));
    let out = f(&mut rr);
    LOCAL.with(|l| l.borrow_mut().rr = rr);
    out
}

/// Cools a lane for every worker of this Envoy at once (the control plane's push follows).
pub fn hold_cooldown(lane: &LaneId, until_ms: i64) {
    let now = now_ms();
    let hold = LocalHold::Cooldown {
        until_ms,
        set_at_ms: now,
    };
    records::hold(
        &mut WasmShared,
        &lane.provider,
        &lane.key,
        &lane.model,
        hold,
        now,
    );
}

/// Takes a key out for every worker of this Envoy at once.
pub fn hold_blacklist(provider: &str, key: &str, class: Class, until_ms: i64, fingerprint: u64) {
    let now = now_ms();
    let hold = LocalHold::Blacklist {
        class,
        until_ms,
        fingerprint,
        set_at_ms: now,
    };
    records::hold(&mut WasmShared, provider, key, "", hold, now);
}

/// What this VM's workers wrote about one provider, read once per lane choice.
struct ProviderLocal {
    holds: ProviderHolds,
    in_flight: InFlight,
}

/// The picker's view backed by shared data and this VM's counters: each provider's records are
/// read once per lane choice, whatever its number of keys.
#[derive(Default)]
pub struct SharedView {
    providers: RefCell<HashMap<String, Rc<ProviderLocal>>>,
    /// Per provider, then per billing scope (looked up without allocating).
    sends: RefCell<HashMap<String, HashMap<String, Sends>>>,
    health: RefCell<HashMap<String, Option<Rc<LaneHealth>>>>,
    parked: RefCell<HashMap<String, ParkedLanes>>,
}

impl SharedView {
    fn local(&self, provider: &str) -> Rc<ProviderLocal> {
        if let Some(hit) = self.providers.borrow().get(provider) {
            return hit.clone();
        }
        let local = Rc::new(ProviderLocal {
            holds: read_record(&WasmShared, &names::holds(provider), ProviderHolds::decode),
            in_flight: read_record(&WasmShared, &names::in_flight(provider), InFlight::decode),
        });
        self.providers
            .borrow_mut()
            .insert(provider.to_string(), local.clone());
        local
    }
}

impl View for SharedView {
    fn holds(&self, lane: &LaneId) -> Vec<LocalHold> {
        self.local(&lane.provider)
            .holds
            .of_lane(&lane.key, &lane.model)
    }

    fn in_flight(&self, provider: &str, key: &str) -> u32 {
        self.local(provider).in_flight.of(key)
    }

    fn provider_in_flight(&self, provider: &str) -> u32 {
        self.local(provider).in_flight.total()
    }

    fn sent_since(&self, provider: &str, scope: &str, model: &str, since_ms: i64) -> (u64, u64) {
        // Read only when a lane has headroom to check, once per scope and pick.
        if let Some(hit) = self.sends.borrow().get(provider).and_then(|p| p.get(scope)) {
            return hit.since(scope, model, since_ms);
        }
        let sends = read_record(&WasmShared, &names::sends(provider, scope), Sends::decode);
        let out = sends.since(scope, model, since_ms);
        self.sends
            .borrow_mut()
            .entry(provider.to_string())
            .or_default()
            .insert(scope.to_string(), sends);
        out
    }

    fn latency(&self, lane: &LaneId) -> Option<f64> {
        LOCAL.with(|l| l.borrow().latency.get(lane).copied())
    }

    fn health(&self, provider: &str) -> Option<Rc<LaneHealth>> {
        if let Some(hit) = self.health.borrow().get(provider) {
            return hit.clone();
        }
        let health = lane_health(provider);
        self.health
            .borrow_mut()
            .insert(provider.to_string(), health.clone());
        health
    }

    fn synced_at_ms(&self) -> Option<i64> {
        Some(LOCAL.with(|l| l.borrow().synced_at_ms))
    }

    fn parked(&self, lane: &LaneId) -> Option<i64> {
        // Read only for calls with an interval, once per provider and pick.
        if let Some(hit) = self.parked.borrow().get(&lane.provider) {
            return hit.probe_at(&lane.key, &lane.model);
        }
        let parked = parked_lanes(&lane.provider)
            .0
            .and_then(|b| ParkedLanes::decode(&b))
            .unwrap_or_default();
        let out = parked.probe_at(&lane.key, &lane.model);
        self.parked
            .borrow_mut()
            .insert(lane.provider.clone(), parked);
        out
    }
}

fn report_queue() -> Option<u32> {
    if let Some(q) = LOCAL.with(|l| l.borrow().queue) {
        return Some(q);
    }
    let q = hostcalls::resolve_shared_queue(VM_ID, REPORT_QUEUE)
        .ok()
        .flatten()?;
    LOCAL.with(|l| l.borrow_mut().queue = Some(q));
    Some(q)
}

fn enqueue(kind: u8, body: Vec<u8>) {
    let mut msg = Vec::with_capacity(body.len() + 1);
    msg.push(kind);
    msg.extend(body);
    queue_message(&msg);
}

/// Puts one message (its kind byte first) on the singleton's report queue.
fn queue_message(msg: &[u8]) {
    let Some(q) = report_queue() else { return };
    if hostcalls::enqueue_shared_queue(q, Some(msg)).is_err() {
        // The singleton may have restarted: resolve again next time.
        LOCAL.with(|l| l.borrow_mut().queue = None);
    }
}

pub fn report_attempt(outcome: AttemptOutcome) {
    let urgent = outcome.outcome != ai_router_proto::v1::AttemptResult::Success as i32;
    hold_report(REPORT_ATTEMPT, &outcome.encode_to_vec(), urgent);
}

pub fn report_request(outcome: RequestOutcome) {
    hold_report(REPORT_REQUEST, &outcome.encode_to_vec(), false);
}

/// Adds one outcome to this worker's bundle; queues the bundle when it is due (the rule is
/// [`Held::push`]'s).
fn hold_report(kind: u8, body: &[u8], urgent: bool) {
    // Settled by the singleton when a control plane acknowledges it (or it is dropped).
    super::gauges::add(super::gauges::Gauge::ReportsPending, 1);
    let now = now_ms();
    let due = LOCAL.with(|l| l.borrow_mut().held.push(kind, body, urgent, now));
    if due {
        flush_held_reports();
    }
}

/// Queues what this worker holds for the singleton (the attempt root's tick calls it too).
pub fn flush_held_reports() {
    let held = LOCAL.with(|l| l.borrow_mut().held.take());
    if !held.is_empty() {
        queue_message(&held);
    }
}

/// Whether this worker's held outcomes are due at `now`.
pub fn held_reports_due(now: i64) -> bool {
    LOCAL.with(|l| l.borrow().held.due(now))
}

pub fn duration_ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}
