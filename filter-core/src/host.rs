//! What a stage needs from Envoy, as a trait: the stream's headers and bodies, a local answer,
//! the clock, the pushed state and this VM's shared bookkeeping. Inside Envoy it is
//! [`crate::worker::on_worker::OnWorker`]: the VM's worker and the glue's host calls; the
//! tests here implement it with a fake (`crate::testing::FakeHost`, feature `testing`) and
//! drive the stages through whole calls on the host.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use ai_router_proto::v1::{AttemptOutcome, RequestOutcome, VirtualKey};

use crate::state::State;
use crate::vm::call::Call;
use crate::vm::local::{Allowance, Send};
use crate::vm::round_robin::RoundRobin;
use crate::vm::view::View;
use crate::vocab::LaneId;
use ai_router_contract::failure::ErrorClass;

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

    /// Milliseconds since the Unix epoch. One reading of the clock per callback
    /// ([`CallbackClock`]): `now_ms` and `now_us` of one callback are the same instant.
    fn now_ms(&self) -> i64;
    /// Microseconds since the Unix epoch: the overhead's clock
    /// ([`crate::answer::overhead`]).
    fn now_us(&self) -> i64;
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
    /// One pass: claims the call's `x-request-id` in this VM's call table (false when another
    /// call holds it, or the table is in use).
    fn claim_request_id(&mut self, request_id: &str, call_id: &str) -> bool;
    /// One pass: the call that claimed `request_id`.
    fn call_by_request_id(&self, request_id: &str) -> Option<String>;
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
        class: ErrorClass,
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

    /// Lists the side's headers for the callback's later reads and writes, with nothing
    /// handed back (a host that keeps the listing need not copy it).
    fn list_headers(&self, side: Side) {
        let _ = self.headers(side);
    }

    /// The side's map as this callback listed it, shared, not copied (a write made while it
    /// is held copies the listing once: read what is needed, then drop it, then write).
    fn listed(&self, side: Side) -> Rc<HeaderMap> {
        Rc::new(self.headers(side))
    }

    /// A header's value when it is UTF-8 text; a value that is not is opaque, as if absent.
    fn header_text(&self, side: Side, name: &str) -> Option<String> {
        self.header(side, name)
            .and_then(|v| String::from_utf8(v).ok())
    }
}

/// The clock of one callback: its first reading is a host call, every later `now_ms` or
/// `now_us` of the callback is derived from that reading (a callback takes microseconds; what
/// the stages time spans callbacks).
#[derive(Debug, Default)]
pub struct CallbackClock(Cell<Option<i64>>);

impl CallbackClock {
    /// Microseconds since the Unix epoch; `read_us` is called once per callback.
    pub fn us(&self, read_us: impl FnOnce() -> i64) -> i64 {
        if let Some(us) = self.0.get() {
            return us;
        }
        let us = read_us();
        self.0.set(Some(us));
        us
    }

    /// Milliseconds since the Unix epoch, of the same reading (as the host's own `now_ms`
    /// would have rounded it: down).
    pub fn ms(&self, read_us: impl FnOnce() -> i64) -> i64 {
        self.us(read_us).div_euclid(1000)
    }
}

/// Each side's header map as one callback listed it, kept up to date with the callback's own
/// writes (nothing else changes a map during a callback): the callback's later reads are
/// answered from it, as Envoy answers them (a name's first value, names without case). The
/// writes to a listed side are held ([`Write::Held`]) and made when the callback ends or before
/// a call that hands the stream to Envoy ([`Listed::take`]).
#[derive(Debug, Default)]
pub struct Listed(RefCell<[Option<Listing>; 2]>);

#[derive(Debug)]
struct Listing {
    /// Shared with a [`Flush::Whole`] until the host call that makes it is done: a write
    /// after it copies the map only if that flush is still held somewhere.
    map: Rc<HeaderMap>,
    /// The names written since the map was listed or last written, once each, lower case.
    held: Vec<String>,
}

/// What a header write costs the host now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// The side is not listed: the host call is made now.
    Now,
    /// The side is listed and the write changes nothing in it ([`unchanged_by`]): no call.
    Unchanged,
    /// The side is listed: the write is in the listing, held for [`Listed::take`].
    Held,
}

/// From this many held names, a side's writes are made as its whole map in one host call
/// (`proxy_set_header_map_pairs`); fewer, one call each (`proxy_replace_header_map_value`,
/// `proxy_remove_header_map_value`).
pub const WHOLE_MAP_FROM: usize = 2;

/// The held writes of one side, as the host calls that make them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flush {
    /// One call per name: its one value, or `None` removed.
    Each(Vec<(String, Option<Vec<u8>>)>),
    /// The whole map in one call: Envoy removes every header and adds these back, in order.
    Whole(Rc<HeaderMap>),
}

/// A header map as the host lists it: names and raw values, in order.
pub type HeaderMap = Vec<(String, Vec<u8>)>;

/// Whether writing `value` to `name` (`None`: removing it) leaves `map` as it is: a removal
/// of a name the map does not hold, or a set to the value the name already has as its only
/// one (names without case, as Envoy's maps).
pub fn unchanged_by(map: &[(String, Vec<u8>)], name: &str, value: Option<&[u8]>) -> bool {
    let mut values = map
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice());
    match value {
        None => values.next().is_none(),
        Some(value) => values.next() == Some(value) && values.next().is_none(),
    }
}

fn slot(side: Side) -> usize {
    match side {
        Side::Request => 0,
        Side::Response => 1,
    }
}

impl Listed {
    /// The side's map, if this callback listed it.
    pub fn headers(&self, side: Side) -> Option<Vec<(String, Vec<u8>)>> {
        self.0.borrow()[slot(side)]
            .as_ref()
            .map(|l| l.map.as_ref().clone())
    }

    /// The side's map, shared, if this callback listed it.
    pub fn map(&self, side: Side) -> Option<Rc<HeaderMap>> {
        self.0.borrow()[slot(side)].as_ref().map(|l| l.map.clone())
    }

    /// Whether this callback listed the side.
    pub fn is_listed(&self, side: Side) -> bool {
        self.0.borrow()[slot(side)].is_some()
    }

    /// A header's value from the listed map (`None`: the side was not listed).
    pub fn header(&self, side: Side, name: &str) -> Option<Option<Vec<u8>>> {
        let listed = self.0.borrow();
        let listing = listed[slot(side)].as_ref()?;
        Some(
            listing
                .map
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone()),
        )
    }

    pub fn keep(&self, side: Side, map: Vec<(String, Vec<u8>)>) {
        let (map, held) = (Rc::new(map), Vec::new());
        self.0.borrow_mut()[slot(side)] = Some(Listing { map, held });
    }

    /// A write of the callback: the name's values replaced by `value` (`None`: removed).
    pub fn set(&self, side: Side, name: &str, value: Option<&[u8]>) -> Write {
        let mut listed = self.0.borrow_mut();
        let Some(listing) = listed[slot(side)].as_mut() else {
            return Write::Now;
        };
        if unchanged_by(&listing.map, name, value) {
            return Write::Unchanged;
        }
        let name = name.to_ascii_lowercase();
        let map = Rc::make_mut(&mut listing.map);
        map.retain(|(k, _)| !k.eq_ignore_ascii_case(&name));
        if let Some(v) = value {
            map.push((name.clone(), v.to_vec()));
        }
        if !listing.held.contains(&name) {
            listing.held.push(name);
        }
        Write::Held
    }

    /// The side's held writes, as the host calls to make now (`None`: nothing held); the
    /// listing stays, with nothing held.
    pub fn take(&self, side: Side) -> Option<Flush> {
        let mut listed = self.0.borrow_mut();
        let listing = listed[slot(side)].as_mut()?;
        let held = std::mem::take(&mut listing.held);
        if held.is_empty() {
            return None;
        }
        if held.len() >= WHOLE_MAP_FROM {
            return Some(Flush::Whole(Rc::clone(&listing.map)));
        }
        let each = held
            .into_iter()
            .map(|name| {
                let value = listing.map.iter().find(|(k, _)| *k == name);
                let value = value.map(|(_, v)| v.clone());
                (name, value)
            })
            .collect();
        Some(Flush::Each(each))
    }

    /// The callback ends: both sides' held writes, to make now.
    pub fn end(&self) -> Vec<(Side, Flush)> {
        [Side::Request, Side::Response]
            .into_iter()
            .filter_map(|side| Some((side, self.take(side)?)))
            .collect()
    }

    /// Before a call that hands the stream to Envoy (a resume, which may run the next filters
    /// inside the call; a reset): both sides' held writes, to make first. What Envoy does next
    /// is read from the host again.
    pub fn hand_over(&self) -> Vec<(Side, Flush)> {
        let held = self.end();
        self.forget();
        held
    }

    /// Before a local answer: the request's held writes, to make first (its map outlives the
    /// answer: the logs read it); the response's are dropped (the answer replaces that map).
    pub fn answer_locally(&self) -> Vec<(Side, Flush)> {
        let held = self.take(Side::Request).map(|f| (Side::Request, f));
        self.forget();
        held.into_iter().collect()
    }

    /// A new callback lists the maps again.
    pub fn forget(&self) {
        *self.0.borrow_mut() = [None, None];
    }
}
