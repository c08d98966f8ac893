//! The worker driven over a fake VM: shared data as a [`MemoryShared`] (with its races and
//! failures), a clock, a report queue and the gauges, as the wasm host gives them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use ai_router_contract::shared as names;
use ai_router_proto::v1::{AttemptOutcome, AttemptResult, RequestOutcome, Snapshot};
use prost::Message;

use super::*;
use crate::host::{Host, Refused, Side};
use crate::vm::local::{Allowance, InFlight, Sends};
use crate::vm::reports::bundled;
use crate::vm::{read_record, MemoryShared};

/// One VM's host calls; clones are the same VM.
#[derive(Clone, Default)]
struct FakeVm {
    shared: Rc<RefCell<MemoryShared>>,
    now: Rc<RefCell<i64>>,
    /// `None`: the singleton has not registered the queue.
    queue: Rc<RefCell<Option<u32>>>,
    resolved: Rc<RefCell<u32>>,
    refuse_enqueue: Rc<RefCell<u32>>,
    queued: Rc<RefCell<Vec<Vec<u8>>>>,
    gauges: Rc<RefCell<HashMap<&'static str, i64>>>,
    /// How many times the clock was read (one host call each in Envoy).
    clock_reads: Rc<RefCell<u32>>,
    /// The request's and the response's headers, and the header calls made on them.
    request: Rc<RefCell<crate::host::HeaderMap>>,
    response: Rc<RefCell<crate::host::HeaderMap>>,
    /// Each call that hands the stream to Envoy, with the request's map at that moment.
    handed_over: Rc<RefCell<Vec<(&'static str, crate::host::HeaderMap)>>>,
    header_calls: Rc<RefCell<u32>>,
    /// Reads of shared data (one host call each in Envoy).
    shared_reads: Rc<RefCell<u32>>,
    /// Of those, the whole-map writes.
    set_headers_calls: Rc<RefCell<u32>>,
}

impl SharedData for FakeVm {
    fn get(&self, name: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedError> {
        *self.shared_reads.borrow_mut() += 1;
        self.shared.borrow().get(name)
    }
    fn set(&mut self, name: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedError> {
        self.shared.borrow_mut().set(name, value, cas)
    }
}

impl VmCalls for FakeVm {
    fn now_ms(&self) -> i64 {
        *self.clock_reads.borrow_mut() += 1;
        *self.now.borrow()
    }
    fn now_us(&self) -> i64 {
        *self.clock_reads.borrow_mut() += 1;
        *self.now.borrow() * 1_000
    }
    fn resolve_queue(&self) -> Option<u32> {
        *self.resolved.borrow_mut() += 1;
        *self.queue.borrow()
    }
    fn enqueue(&mut self, _queue: u32, message: &[u8]) -> Result<(), SharedError> {
        let mut refuse = self.refuse_enqueue.borrow_mut();
        if *refuse > 0 {
            *refuse -= 1;
            return Err(SharedError::Failed);
        }
        self.queued.borrow_mut().push(message.to_vec());
        Ok(())
    }
    fn gauge(&mut self, gauge: Gauge, delta: i64) {
        *self.gauges.borrow_mut().entry(gauge.name()).or_default() += delta;
    }
    fn track_memory(&mut self) {}
}

/// The stream's calls: the request's header map (both sides alike); the rest are unused.
impl on_worker::HostCalls for FakeVm {
    fn header(&self, side: Side, name: &str) -> Option<Vec<u8>> {
        *self.header_calls.borrow_mut() += 1;
        let map = self.map(side).borrow();
        map.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }
    fn headers(&self, side: Side) -> Vec<(String, Vec<u8>)> {
        *self.header_calls.borrow_mut() += 1;
        self.map(side).borrow().clone()
    }
    fn set_header(&mut self, side: Side, name: &str, value: Option<&str>) {
        *self.header_calls.borrow_mut() += 1;
        let mut map = self.map(side).borrow_mut();
        map.retain(|(k, _)| k != name);
        if let Some(v) = value {
            map.push((name.to_owned(), v.as_bytes().to_vec()));
        }
    }
    fn set_header_bytes(&mut self, side: Side, name: &str, value: &[u8]) {
        *self.header_calls.borrow_mut() += 1;
        let mut map = self.map(side).borrow_mut();
        map.retain(|(k, _)| k != name);
        map.push((name.to_owned(), value.to_vec()));
    }
    fn set_headers(&mut self, side: Side, map: &crate::host::HeaderMap) {
        *self.header_calls.borrow_mut() += 1;
        *self.set_headers_calls.borrow_mut() += 1;
        *self.map(side).borrow_mut() = map.clone();
    }
    fn body(&self, _: Side, _: usize, _: usize) -> Vec<u8> {
        Vec::new()
    }
    fn set_body(&mut self, _: Side, _: usize, _: usize, _: &[u8]) {}
    fn send_response(&mut self, _: u16, _: &[(&str, &str)], _: &[u8]) {
        self.hand_over("send_response");
    }
    fn reset_stream(&mut self) {
        self.hand_over("reset_stream");
    }
    fn dispatch_http_call(&mut self, _: &str, _: &[(&str, &str)], _: u64) -> Result<u32, Refused> {
        Err(Refused)
    }
    fn dispatch_grpc_call(
        &mut self,
        _: &str,
        _: &str,
        _: &str,
        _: &[(&str, &[u8])],
        _: &[u8],
        _: u64,
    ) -> Result<u32, Refused> {
        Err(Refused)
    }
    fn grpc_call_response_body(&self, _: usize) -> Option<Vec<u8>> {
        None
    }
    fn resume_request(&mut self) {
        self.hand_over("resume_request");
    }
    fn property(&self, _: &[&str]) -> Option<Vec<u8>> {
        None
    }
}

impl FakeVm {
    fn map(&self, side: Side) -> &RefCell<crate::host::HeaderMap> {
        match side {
            Side::Request => &self.request,
            Side::Response => &self.response,
        }
    }
    fn hand_over(&self, call: &'static str) {
        let request = self.request.borrow().clone();
        self.handed_over.borrow_mut().push((call, request));
    }
    fn with_queue() -> Self {
        let vm = Self::default();
        *vm.queue.borrow_mut() = Some(7);
        vm
    }
    fn gauge_of(&self, gauge: Gauge) -> i64 {
        self.gauges.borrow().get(gauge.name()).copied().unwrap_or(0)
    }
    /// Publishes a pool as the singleton does: the pool record, then the sync record.
    fn publish(&self, pool_version: u64, applied: u64, pool: &[u8]) {
        let mut s = self.shared.borrow_mut();
        let _ = s.set(names::POOL, pool, None);
        let sync = SyncRecord {
            pool_version,
            generated_at_ms: 100 + applied as i64,
            applied,
        };
        let _ = s.set(names::SYNC, &sync.encode(), None);
    }
}

fn pool() -> Vec<u8> {
    Snapshot::default().encode_to_vec()
}

#[test]
fn the_pool_is_decoded_once_per_version_and_a_bad_one_keeps_the_last() {
    let (vm, w) = (FakeVm::default(), Worker::<()>::default());
    assert!(w.state(&vm).is_none(), "nothing published yet");
    vm.publish(1, 1, &pool());
    let first = w.state(&vm).expect("decoded");
    assert_eq!(
        (first.version, w.state_sequence(), w.synced_at_ms()),
        (1, 1, 101)
    );
    // Another record changed, not the pool: the same decoded state, a new sequence.
    vm.publish(1, 2, b"not read again");
    assert!(Rc::ptr_eq(&first, &w.state(&vm).expect("cached")));
    assert_eq!(w.state_sequence(), 2);
    // A new pool version that does not decode: the last good state stays.
    vm.publish(2, 3, b"\xff\xff");
    assert!(Rc::ptr_eq(&first, &w.state(&vm).expect("kept")));
    vm.publish(3, 4, &pool());
    assert_eq!(w.state(&vm).map(|s| s.version), Some(3));
}

#[test]
fn a_callback_reads_the_state_once_and_decides_on_that_one() {
    let (vm, w) = (FakeVm::default(), Worker::<()>::default());
    vm.publish(1, 1, &pool());
    let host = on_worker::OnWorker::new(vm.clone(), &w);
    let first = host.state().expect("published");
    let reads = *vm.shared_reads.borrow();
    // A new pool published while the callback runs: the callback keeps the state it read.
    vm.publish(2, 2, &pool());
    assert!(Rc::ptr_eq(&first, &host.state().expect("the same")));
    assert_eq!(host.state_sequence(), 1);
    assert_eq!(*vm.shared_reads.borrow(), reads, "no read after the first");
    // The next callback reads it again, and sees the new pool.
    let host = on_worker::OnWorker::new(vm.clone(), &w);
    assert_eq!(host.state().map(|s| s.version), Some(2));
    assert_eq!(host.state_sequence(), 2);
}

#[test]
fn calls_move_the_gauge_and_a_re_entered_table_answers_none() {
    let (mut vm, w) = (FakeVm::default(), Worker::<()>::default());
    let cid = w.new_call(&mut vm, 5);
    assert_eq!(vm.gauge_of(Gauge::Calls), 1);
    assert_eq!(w.with_call(&cid, |c| c.created_ms), Some(5));
    let nested = w.with_call(&cid, |_| w.with_call(&cid, |c| c.attempts));
    assert_eq!(nested, Some(None), "the table is in use");
    assert!(w.end_call(&mut vm, &cid).is_some());
    assert!(w.end_call(&mut vm, &cid).is_none());
    assert_eq!(vm.gauge_of(Gauge::Calls), 0);
}

#[test]
fn a_cas_conflict_is_read_again_and_counted_once() {
    let mut vm = FakeVm::default();
    vm.shared.borrow_mut().race(&names::in_flight("p"), 3);
    Worker::<()>::add_in_flight(&mut vm, "p", "a", 1);
    Worker::<()>::add_in_flight(&mut vm, "p", "a", 1);
    let f = read_record(&vm, &names::in_flight("p"), InFlight::decode);
    assert_eq!(f.of("a"), 2);
    assert_eq!(vm.gauge_of(Gauge::LaneInFlight), 2);
    // A record that cannot be written moves neither the count nor the gauge.
    vm.shared.borrow_mut().fail(&names::in_flight("p"), 1);
    Worker::<()>::add_in_flight(&mut vm, "p", "a", 1);
    assert_eq!(vm.gauge_of(Gauge::LaneInFlight), 2);
}

#[test]
fn a_reservation_against_a_scarce_figure_queues_the_outcomes_at_once() {
    let (mut vm, w) = (FakeVm::with_queue(), Worker::<()>::default());
    let send = Send {
        scope: "s".into(),
        model: "m".into(),
        at_ms: 10,
        tokens: 0,
    };
    let allowance = Allowance {
        model: String::new(),
        remaining_requests: 3,
        remaining_tokens: -1,
        since_ms: 0,
    };
    vm.shared.borrow_mut().race(&names::sends("p", "s"), 1);
    assert!(w.reserve_send(&mut vm, "p", send.clone(), &[allowance]));
    let sends = read_record(&vm, &names::sends("p", "s"), Sends::decode);
    assert_eq!(sends.since("s", "", 0).0, 1, "the race was read again");
    w.report_request(&mut vm, RequestOutcome::default(), 0);
    assert_eq!(
        vm.queued.borrow().len(),
        1,
        "not held: the figure is scarce"
    );
}

#[test]
fn outcomes_are_held_until_due_and_a_failure_goes_at_once() {
    let (mut vm, w) = (FakeVm::with_queue(), Worker::<()>::default());
    let ok = AttemptOutcome {
        outcome: AttemptResult::Success as i32,
        ..AttemptOutcome::default()
    };
    w.report_attempt(&mut vm, ok.clone(), 0);
    w.report_request(&mut vm, RequestOutcome::default(), 0);
    assert!(vm.queued.borrow().is_empty(), "held");
    assert!(w.on_tick(&mut vm, 10, |_| true).is_empty());
    assert!(vm.queued.borrow().is_empty(), "not due yet");
    w.on_tick(&mut vm, crate::vm::reports::REPORT_HOLD_MS, |_| true);
    let queued = vm.queued.borrow_mut().pop().expect("one bundle");
    let kinds: Vec<u8> = bundled(&queued[1..]).iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, vec![REPORT_ATTEMPT, REPORT_REQUEST]);
    // A failed attempt is news for the other Envoys: queued with what waits before it.
    w.report_request(&mut vm, RequestOutcome::default(), 0);
    w.report_attempt(&mut vm, AttemptOutcome::default(), 0);
    assert_eq!(vm.queued.borrow().len(), 1);
    assert_eq!(vm.gauge_of(Gauge::ReportsPending), 4);
}

#[test]
fn a_refused_queue_is_resolved_again_and_none_drops_nothing_else() {
    let (mut vm, w) = (FakeVm::default(), Worker::<()>::default());
    // No queue registered: the message goes nowhere (the gauge counts it pending).
    w.report_attempt(&mut vm, AttemptOutcome::default(), 0);
    assert!(vm.queued.borrow().is_empty());
    *vm.queue.borrow_mut() = Some(7);
    *vm.refuse_enqueue.borrow_mut() = 1;
    w.report_attempt(&mut vm, AttemptOutcome::default(), 0);
    let before = *vm.resolved.borrow();
    w.report_attempt(&mut vm, AttemptOutcome::default(), 0);
    assert_eq!(
        *vm.resolved.borrow(),
        before + 1,
        "resolved again after a refusal"
    );
    assert_eq!(vm.queued.borrow().len(), 1);
    w.report_attempt(&mut vm, AttemptOutcome::default(), 0);
    assert_eq!(*vm.resolved.borrow(), before + 1, "kept once it worked");
}

#[test]
fn a_minute_ask_is_queued_for_the_singleton_and_a_failed_record_counts_nothing() {
    let (mut vm, w) = (FakeVm::with_queue(), Worker::<()>::default());
    let now = 1_700_000_000_000;
    assert_eq!(w.admit_minute_request(&mut vm, "k", 100, now), Some(true));
    let queued = vm.queued.borrow().clone();
    assert!(
        queued.iter().any(|m| m.first() == Some(&MINUTE_ASK)),
        "{queued:?}"
    );
    vm.shared.borrow_mut().fail(&names::minute_requests("k"), 1);
    assert_eq!(w.admit_minute_request(&mut vm, "k", 100, now), None);
}

#[test]
fn the_tick_lists_the_attempts_due_and_skips_a_running_one() {
    let (mut vm, w) = (FakeVm::default(), Worker::<u32>::default());
    let (a, b) = (Rc::new(RefCell::new(1)), Rc::new(RefCell::new(2)));
    w.attempt_opened(&mut vm, 1, &a);
    w.attempt_opened(&mut vm, 2, &b);
    w.attempt_opened(&mut vm, 2, &b);
    assert_eq!(vm.gauge_of(Gauge::Attempts), 2);
    let running = b.borrow_mut();
    let due: Vec<u32> = w
        .on_tick(&mut vm, 0, |_| true)
        .iter()
        .map(|d| d.0)
        .collect();
    assert_eq!(due, vec![1]);
    drop(running);
    w.attempt_closed(&mut vm, 1);
    w.attempt_closed(&mut vm, 1);
    assert_eq!(vm.gauge_of(Gauge::Attempts), 1);
    assert!(w.skipped(&mut vm, "on_log").is_some());
    assert!(w.skipped(&mut vm, "on_log").is_none());
    assert_eq!(vm.gauge_of(Gauge::CallbacksSkipped), 2);
}

#[test]
fn the_latency_ewma_starts_at_the_first_sample() {
    let (vm, w) = (FakeVm::default(), Worker::<()>::default());
    let lane = LaneId::new("p", "a", "m");
    // The pushed `ewmaAlpha`, not the contract's default, weighs the newest sample.
    let alpha = 0.5;
    assert_ne!(alpha, ai_router_contract::defaults::EWMA_ALPHA);
    let snapshot = Snapshot {
        selection: Some(ai_router_proto::v1::Selection {
            ewma_alpha: alpha,
            ..Default::default()
        }),
        ..Default::default()
    };
    vm.publish(1, 1, &snapshot.encode_to_vec());
    assert_eq!(w.latency(&lane), None);
    w.record_latency(&vm, &lane, 100.0);
    assert_eq!(w.latency(&lane), Some(100.0));
    w.record_latency(&vm, &lane, 200.0);
    assert_eq!(
        w.latency(&lane),
        Some(alpha * 200.0 + (1.0 - alpha) * 100.0)
    );
    let r = w.random_unit(1);
    assert!((0.0..1.0).contains(&r));
}

#[test]
fn a_callback_reads_the_clock_once_for_all_it_times() {
    let (vm, w) = (FakeVm::with_queue(), Worker::<()>::default());
    *vm.now.borrow_mut() = 1_700_000_000_123;
    let lane = LaneId::new("p", "a", "m");
    let mut host = on_worker::OnWorker::new(vm.clone(), &w);
    let (ms, us) = (host.now_ms(), host.now_us());
    host.random_unit();
    host.report_attempt(AttemptOutcome::default());
    host.report_request(RequestOutcome::default());
    host.hold_cooldown(&lane, ms + 1_000);
    host.hold_blacklist(
        "p",
        "a",
        ai_router_contract::failure::ErrorClass::Auth,
        ms + 1_000,
        0,
    );
    assert_eq!((ms, us), (1_700_000_000_123, 1_700_000_000_123_000));
    assert_eq!(*vm.clock_reads.borrow(), 1, "one reading for the callback");
    // The next callback reads it again, and sees it moved.
    *vm.now.borrow_mut() += 5;
    let host = on_worker::OnWorker::new(vm.clone(), &w);
    assert_eq!(host.now_ms(), ms + 5);
    assert_eq!(host.now_us(), us + 5_000);
    assert_eq!(*vm.clock_reads.borrow(), 2);
}

#[test]
fn a_callback_that_listed_a_map_reads_it_from_the_listing_with_its_own_writes() {
    let (vm, w) = (FakeVm::default(), Worker::<()>::default());
    *vm.request.borrow_mut() = vec![
        ("a".into(), b"1".to_vec()),
        ("b".into(), b"2".to_vec()),
        ("a".into(), b"3".to_vec()),
    ];
    let mut host = on_worker::OnWorker::new(vm.clone(), &w);
    // Before a listing, each read is a host call.
    assert_eq!(host.header(Side::Request, "b"), Some(b"2".to_vec()));
    assert_eq!(*vm.header_calls.borrow(), 1);
    assert_eq!(host.headers(Side::Request).len(), 3);
    assert_eq!(
        host.header(Side::Request, "a"),
        Some(b"1".to_vec()),
        "the first value"
    );
    assert_eq!(
        host.header(Side::Request, "A"),
        Some(b"1".to_vec()),
        "names without case"
    );
    assert_eq!(host.header(Side::Request, "c"), None);
    assert_eq!(
        *vm.header_calls.borrow(),
        2,
        "one listing, then no host call"
    );
    // The callback's writes go to the host and into the listing.
    host.set_header(Side::Request, "a", Some("4"));
    host.set_header(Side::Request, "b", None);
    host.set_header_bytes(Side::Request, "c", b"5");
    assert_eq!(host.header(Side::Request, "a"), Some(b"4".to_vec()));
    assert_eq!(host.header(Side::Request, "b"), None);
    assert_eq!(host.header(Side::Request, "c"), Some(b"5".to_vec()));
    let listed = host.listed(Side::Request);
    let names: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, vec!["a", "c"]);
    drop(listed);
    assert_eq!(*vm.header_calls.borrow(), 2, "the writes are held");
    // The callback ends: its three writes are one host call (the whole map).
    drop(host);
    assert_eq!(*vm.header_calls.borrow(), 3);
    // The next callback reads the host again.
    let host = on_worker::OnWorker::new(vm.clone(), &w);
    assert_eq!(host.header(Side::Request, "a"), Some(b"4".to_vec()));
    assert_eq!(*vm.header_calls.borrow(), 4);
}

#[test]
fn listing_a_map_is_one_host_call_once_per_callback() {
    let (vm, w) = (FakeVm::default(), Worker::<()>::default());
    *vm.response.borrow_mut() = vec![(":status".into(), b"200".to_vec())];
    let host = on_worker::OnWorker::new(vm.clone(), &w);
    host.list_headers(Side::Response);
    host.list_headers(Side::Response);
    assert_eq!(
        host.header(Side::Response, ":status"),
        Some(b"200".to_vec())
    );
    assert_eq!(host.headers(Side::Response).len(), 1);
    assert_eq!(*vm.header_calls.borrow(), 1, "one listing answers the rest");
    drop(host);
    let host = on_worker::OnWorker::new(vm.clone(), &w);
    host.list_headers(Side::Response);
    assert_eq!(*vm.header_calls.borrow(), 2, "a new callback lists again");
}

#[test]
fn a_write_that_changes_nothing_in_a_listed_map_makes_no_host_call() {
    let (vm, w) = (FakeVm::default(), Worker::<()>::default());
    let start = vec![
        (":path".to_owned(), b"/v1".to_vec()),
        ("a".to_owned(), b"1".to_vec()),
        ("b".to_owned(), b"2".to_vec()),
        ("b".to_owned(), b"3".to_vec()),
    ];
    *vm.request.borrow_mut() = start.clone();
    let mut host = on_worker::OnWorker::new(vm.clone(), &w);
    host.headers(Side::Request);
    assert_eq!(*vm.header_calls.borrow(), 1);
    // A removal of a name the map does not hold, a set to the name's only value (any case).
    host.set_header(Side::Request, "x-absent", None);
    host.set_header(Side::Request, "a", Some("1"));
    host.set_header_bytes(Side::Request, "A", b"1");
    host.set_header_bytes(Side::Request, ":path", b"/v1");
    assert_eq!(*vm.header_calls.borrow(), 1, "no host call");
    assert_eq!(*vm.request.borrow(), start, "the map is the same");
    drop(host);
    assert_eq!(*vm.header_calls.borrow(), 1, "nothing held");
    // A set of a name with two values changes it (one value left).
    let mut host = on_worker::OnWorker::new(vm.clone(), &w);
    host.headers(Side::Request);
    host.set_header(Side::Request, "b", Some("2"));
    drop(host);
    assert_eq!(*vm.header_calls.borrow(), 3, "a listing and the write");
    assert_eq!(
        vm.request.borrow().iter().filter(|(k, _)| k == "b").count(),
        1
    );
    // Unlisted, the callback cannot know: every write is a host call.
    let mut host = on_worker::OnWorker::new(vm.clone(), &w);
    host.set_header(Side::Request, "x-absent", None);
    assert_eq!(*vm.header_calls.borrow(), 4);
}

/// A map as Envoy's readers see it: each name's values in order, the names in any order.
fn by_name(map: &crate::host::HeaderMap) -> crate::host::HeaderMap {
    let mut map = map.clone();
    map.sort_by(|a, b| a.0.cmp(&b.0));
    map
}

fn client_map() -> crate::host::HeaderMap {
    [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gateway.local"),
        (":scheme", "http"),
        ("authorization", "Bearer sk"),
        ("content-type", "application/json"),
        ("x-dup", "1"),
        ("x-dup", "2"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.as_bytes().to_vec()))
    .collect()
}

#[test]
fn held_writes_leave_the_host_s_map_as_the_per_name_writes_do_in_one_call_a_callback() {
    use rand::{Rng, SeedableRng};
    const NAMES: [&str; 7] = [
        ":path",
        ":authority",
        "authorization",
        "x-dup",
        "x-ai-router-cluster",
        "x-a",
        "content-length",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(32);
    let w = Worker::<()>::default();
    let (mut whole, mut one) = (0, 0);
    for case in 0..500 {
        // The same callbacks on two streams: one lists its map first (its writes held), the
        // other does not (each write a host call, as before the listing).
        let (held, each) = (FakeVm::default(), FakeVm::default());
        *held.request.borrow_mut() = client_map();
        *each.request.borrow_mut() = client_map();
        for _ in 0..rng.random_range(1..4) {
            let calls_before = *held.header_calls.borrow();
            let mut h = on_worker::OnWorker::new(held.clone(), &w);
            let mut e = on_worker::OnWorker::new(each.clone(), &w);
            h.headers(Side::Request);
            let writes = rng.random_range(0..8);
            for _ in 0..writes {
                let name = NAMES[rng.random_range(0..NAMES.len())];
                let value = ["v", "1", "/v2", "x"][rng.random_range(0..4)];
                match rng.random_range(0..3) {
                    0 => {
                        h.set_header(Side::Request, name, None);
                        e.set_header(Side::Request, name, None);
                    }
                    1 => {
                        h.set_header(Side::Request, name, Some(value));
                        e.set_header(Side::Request, name, Some(value));
                    }
                    _ => {
                        h.set_header_bytes(Side::Request, name, value.as_bytes());
                        e.set_header_bytes(Side::Request, name, value.as_bytes());
                    }
                }
                // The callback reads its own writes either way.
                assert_eq!(
                    h.header(Side::Request, name),
                    e.header(Side::Request, name),
                    "case {case}"
                );
            }
            let whole_before = *held.set_headers_calls.borrow();
            drop((h, e));
            let calls = *held.header_calls.borrow() - calls_before;
            assert!(
                calls <= 2,
                "case {case}: a listing and one write, made {calls}"
            );
            match *held.set_headers_calls.borrow() - whole_before {
                0 if calls == 2 => one += 1,
                0 => {}
                _ => whole += 1,
            }
            assert_eq!(
                by_name(&held.request.borrow()),
                by_name(&each.request.borrow()),
                "case {case}"
            );
        }
    }
    assert!(whole > 100 && one > 100, "both ways taken: {whole}, {one}");
}

#[test]
fn a_local_answer_makes_the_request_s_held_writes_first_and_drops_the_response_s() {
    let (vm, w) = (FakeVm::default(), Worker::<()>::default());
    *vm.request.borrow_mut() = client_map();
    *vm.response.borrow_mut() = vec![(":status".into(), b"200".to_vec())];
    let mut host = on_worker::OnWorker::new(vm.clone(), &w);
    host.headers(Side::Request);
    host.headers(Side::Response);
    host.set_header(Side::Request, "x-a", Some("1"));
    host.set_header(Side::Request, "authorization", None);
    host.set_header(Side::Response, "x-b", Some("2"));
    host.set_header(Side::Response, "x-c", Some("3"));
    assert_eq!(
        *vm.header_calls.borrow(),
        2,
        "the listings; the writes held"
    );
    host.send_response(401, &[], b"{}");
    let handed = vm.handed_over.borrow().clone();
    assert_eq!(handed.len(), 1);
    let (call, request) = &handed[0];
    assert_eq!(*call, "send_response");
    let mut want = client_map();
    want.retain(|(k, _)| k != "authorization");
    want.push(("x-a".into(), b"1".to_vec()));
    assert_eq!(
        by_name(request),
        by_name(&want),
        "written before the answer"
    );
    drop(host);
    assert_eq!(
        *vm.header_calls.borrow(),
        3,
        "the request's map in one call"
    );
    assert_eq!(
        *vm.response.borrow(),
        vec![(":status".to_owned(), b"200".to_vec())],
        "the response's writes dropped: the answer replaces that map"
    );
}

#[test]
fn a_resume_or_a_reset_makes_the_held_writes_first() {
    for call in ["resume_request", "reset_stream"] {
        let (vm, w) = (FakeVm::default(), Worker::<()>::default());
        *vm.request.borrow_mut() = client_map();
        let mut host = on_worker::OnWorker::new(vm.clone(), &w);
        host.headers(Side::Request);
        host.set_header(Side::Request, "x-ai-router-cluster", Some("p"));
        host.set_header(Side::Request, ":authority", Some("api.example"));
        match call {
            "resume_request" => host.resume_request(),
            _ => host.reset_stream(),
        }
        let handed = vm.handed_over.borrow().clone();
        let mut want = client_map();
        want.retain(|(k, _)| k != ":authority");
        want.push((":authority".into(), b"api.example".to_vec()));
        want.push(("x-ai-router-cluster".into(), b"p".to_vec()));
        assert_eq!(handed.len(), 1, "{call}");
        assert_eq!(handed[0].0, call);
        assert_eq!(by_name(&handed[0].1), by_name(&want), "{call}");
        assert_eq!(*vm.set_headers_calls.borrow(), 1, "{call}");
        // After the hand-over the map is Envoy's again: a later write is a host call now.
        host.set_header(Side::Request, "x-a", Some("1"));
        assert_eq!(*vm.header_calls.borrow(), 3, "{call}");
        drop(host);
        assert_eq!(*vm.header_calls.borrow(), 3, "{call}: nothing left held");
    }
}

#[test]
fn a_whole_map_flush_is_the_listing_itself_and_a_later_write_leaves_it_as_it_was() {
    use crate::host::{Flush, Listed};
    let listed = Listed::default();
    let map = vec![("a".into(), b"1".to_vec()), ("b".into(), b"2".to_vec())];
    listed.keep(Side::Request, map);
    listed.set(Side::Request, "a", Some(b"3"));
    listed.set(Side::Request, "c", Some(b"4"));
    let Some(Flush::Whole(flush)) = listed.take(Side::Request) else {
        panic!("two names held: the whole map in one call");
    };
    // Not a copy: the flush and the listing share the map.
    assert_eq!(Rc::strong_count(&flush), 2);
    let written: Vec<(String, Vec<u8>)> = vec![
        ("b".into(), b"2".to_vec()),
        ("a".into(), b"3".to_vec()),
        ("c".into(), b"4".to_vec()),
    ];
    assert_eq!(*flush, written);
    // A write while the flush is still held changes the listing, not the flush.
    listed.set(Side::Request, "b", None);
    assert_eq!(*flush, written);
    let names = |side| {
        listed
            .map(side)
            .map(|m| m.iter().map(|(k, _)| k.clone()).collect::<Vec<String>>())
    };
    assert_eq!(names(Side::Request), Some(vec!["a".into(), "c".into()]));
    assert_eq!(names(Side::Response), None);
}
