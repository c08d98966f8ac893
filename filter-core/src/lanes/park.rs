//! Snap-back (`resetIntervalMs`): a lane that failed a call whose policy sets an interval is
//! parked. Calls with an interval then go to the next lane of their order (a pricier one
//! under `autoSort`) without trying it, except one call per interval: that call probes the
//! parked lane, and its answer unparks it, so the calls after it snap back. A probe that fails
//! parks the lane for another interval. Parking only reorders: a parked lane is still tried
//! when nothing else is left, and a lane held by a breaker, a cooldown or a blacklist stays
//! out as it would without it.
//!
//! The parked lanes of a provider are one record the workers of an Envoy share (shared data
//! in Envoy), changed with compare-and-swap: a call claims a due probe by moving the lane's
//! next probe an interval on, and only the call whose write wins probes, so the whole Envoy
//! probes a parked lane at most once per interval whatever its number of workers.

use crate::host::Host;
use crate::vm::local::{put_str, Reader};
use crate::vocab::LaneId;
use ai_router_contract::failure::ErrorClass;

/// Whether calls with an interval pass over a lane whose next probe is `probe_at_ms` (it is
/// parked and its probe is not due).
pub fn passed_over(probe_at_ms: Option<i64>, now_ms: i64) -> bool {
    probe_at_ms.is_some_and(|at| at > now_ms)
}

/// Attempts at a compare-and-swap write before giving up (another worker kept winning).
const CAS_TRIES: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
struct ParkedLane {
    key: String,
    model: String,
    /// The next call at or after this time probes the lane.
    probe_at_ms: i64,
}

/// The parked lanes of one provider, as the workers share them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParkedLanes {
    lanes: Vec<ParkedLane>,
}

impl ParkedLanes {
    /// When the parked lane `key`/`model` is next probed; `None`: it is not parked.
    pub fn probe_at(&self, key: &str, model: &str) -> Option<i64> {
        self.lanes
            .iter()
            .find(|l| l.key == key && l.model == model)
            .map(|l| l.probe_at_ms)
    }

    fn set(&mut self, key: &str, model: &str, probe_at_ms: i64) {
        match self
            .lanes
            .iter_mut()
            .find(|l| l.key == key && l.model == model)
        {
            Some(l) => l.probe_at_ms = probe_at_ms,
            None => self.lanes.push(ParkedLane {
                key: key.to_string(),
                model: model.to_string(),
                probe_at_ms,
            }),
        }
    }

    /// Unparks a lane; `false` when it was not parked.
    fn remove(&mut self, key: &str, model: &str) -> bool {
        let before = self.lanes.len();
        self.lanes.retain(|l| !(l.key == key && l.model == model));
        self.lanes.len() != before
    }

    /// Each lane as its key, its model (2-byte big-endian length, then the bytes) and its next
    /// probe (8 bytes big-endian). No lane: an empty record.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for l in &self.lanes {
            put_str(&mut out, &l.key);
            put_str(&mut out, &l.model);
            out.extend(l.probe_at_ms.to_be_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        let mut lanes = Vec::new();
        while !r.0.is_empty() {
            lanes.push(ParkedLane {
                key: r.str()?,
                model: r.str()?,
                probe_at_ms: r.i64()?,
            });
        }
        Some(Self { lanes })
    }
}

/// Whether a failure says the lane may be down (and a pricier one should carry the calls):
/// a failure that is the caller's or the call's own (an invalid request, a cancel, the deadline,
/// a mismatched answer) says nothing about the lane.
fn parks(class: ErrorClass) -> bool {
    matches!(
        class,
        ErrorClass::RateLimit
            | ErrorClass::Quota
            | ErrorClass::Auth
            | ErrorClass::Transient
            | ErrorClass::Network
            | ErrorClass::Timeout
            | ErrorClass::Stream
    )
}

/// What a change found, for [`update`].
enum Change {
    Write,
    Keep,
}

/// Read-modify-writes the provider's parked lanes with compare-and-swap. `change` sees the
/// freshest record on every try and says whether to write it. `false` when a write was wanted
/// and never won.
fn update(
    host: &mut impl Host,
    provider: &str,
    mut change: impl FnMut(&mut ParkedLanes) -> Change,
) -> bool {
    for _ in 0..CAS_TRIES {
        let (bytes, cas) = host.parked_lanes(provider);
        let mut lanes = bytes
            .as_deref()
            .and_then(ParkedLanes::decode)
            .unwrap_or_default();
        match change(&mut lanes) {
            Change::Keep => return true,
            Change::Write => {
                if host.set_parked_lanes(provider, &lanes.encode(), cas) {
                    return true;
                }
            }
        }
    }
    false
}

/// A call chose `lane` because its probe was due: the call claims the probe by moving the next
/// one an interval on. `false`: another call (of any worker) claimed it first, so this one
/// chooses again (the lane is passed over now). A lane unparked meanwhile needs no claim.
pub fn claim_probe(host: &mut impl Host, lane: &LaneId, now_ms: i64, interval_ms: u64) -> bool {
    let mut claimed = true;
    let written = update(host, &lane.provider, |lanes| {
        match lanes.probe_at(&lane.key, &lane.model) {
            Some(at) if at <= now_ms => {
                lanes.set(
                    &lane.key,
                    &lane.model,
                    now_ms.saturating_add(interval_ms as i64),
                );
                claimed = true;
                Change::Write
            }
            Some(_) => {
                // Due when the call chose it, claimed by another since.
                claimed = false;
                Change::Keep
            }
            None => {
                claimed = true;
                Change::Keep
            }
        }
    });
    written && claimed
}

/// An attempt's outcome on a lane, for a call with an interval: a failure that may mean the
/// lane is down parks it for one interval, a success unparks it (snap-back). A success on a
/// lane that is not parked (the common case) only reads the record.
pub fn observe(
    host: &mut impl Host,
    lane: &LaneId,
    failure: Option<ErrorClass>,
    now_ms: i64,
    interval_ms: u64,
) {
    match failure {
        None => {
            update(host, &lane.provider, |lanes| {
                if lanes.remove(&lane.key, &lane.model) {
                    Change::Write
                } else {
                    Change::Keep
                }
            });
        }
        Some(class) if parks(class) && interval_ms > 0 => {
            let probe_at = now_ms.saturating_add(interval_ms as i64);
            update(host, &lane.provider, |lanes| {
                lanes.set(&lane.key, &lane.model, probe_at);
                Change::Write
            });
        }
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::park::passed_over;
    use crate::testing::{FakeHost, SharedStore};

    fn worker(store: &SharedStore) -> FakeHost {
        let mut host = FakeHost::default();
        host.lanes.parked = store.clone();
        host
    }

    fn probe_at(host: &FakeHost, lane: &LaneId) -> Option<i64> {
        crate::vm::view::View::parked(&host.lanes, lane)
    }

    #[test]
    fn the_record_round_trips_and_a_torn_one_is_refused() {
        let mut lanes = ParkedLanes::default();
        lanes.set("a", "m", 7);
        lanes.set("b", "gpt-4o", -1);
        lanes.set("a", "m", 9);
        let bytes = lanes.encode();
        assert_eq!(ParkedLanes::decode(&bytes), Some(lanes.clone()));
        assert_eq!(lanes.probe_at("a", "m"), Some(9));
        assert_eq!(ParkedLanes::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(ParkedLanes::decode(&[]), Some(ParkedLanes::default()));
    }

    #[test]
    fn a_failure_parks_for_one_interval_and_a_success_unparks_for_every_worker() {
        let store = SharedStore::default();
        let (mut a, b) = (worker(&store), worker(&store));
        let lane = LaneId::new("cheap", "k", "m");
        observe(&mut a, &lane, Some(ErrorClass::Transient), 1_000, 500);
        assert_eq!(probe_at(&b, &lane), Some(1_500));
        assert!(passed_over(probe_at(&b, &lane), 1_499));
        assert!(!passed_over(probe_at(&b, &lane), 1_500));
        observe(&mut a, &lane, None, 1_600, 500);
        assert_eq!(probe_at(&b, &lane), None);
    }

    #[test]
    fn of_two_workers_claiming_a_due_probe_only_one_wins() {
        let store = SharedStore::default();
        let (mut a, mut b) = (worker(&store), worker(&store));
        let lane = LaneId::new("cheap", "k", "m");
        observe(&mut a, &lane, Some(ErrorClass::Network), 0, 1_000);
        assert!(claim_probe(&mut a, &lane, 1_000, 1_000));
        assert!(!claim_probe(&mut b, &lane, 1_000, 1_000));
        assert!(!claim_probe(&mut a, &lane, 1_999, 1_000));
        assert_eq!(probe_at(&b, &lane), Some(2_000));
        // A lane unparked meanwhile needs no claim.
        observe(&mut b, &lane, None, 1_500, 1_000);
        assert!(claim_probe(&mut a, &lane, 1_600, 1_000));
        assert_eq!(probe_at(&a, &lane), None);
    }

    #[test]
    fn a_claim_that_races_another_worker_reads_again() {
        let store = SharedStore::default();
        let mut a = worker(&store);
        let lane = LaneId::new("cheap", "k", "m");
        observe(&mut a, &lane, Some(ErrorClass::Timeout), 0, 1_000);
        // Another worker claims between this one's read and write: the claim's CAS loses, it
        // reads the claimed record and gives way.
        let (bytes, _) = a.parked_lanes("cheap");
        let mut claimed = ParkedLanes::decode(&bytes.unwrap_or_default()).unwrap_or_default();
        claimed.set("k", "m", 2_000);
        let stale = Some(0);
        assert!(!a.set_parked_lanes("cheap", &claimed.encode(), stale));
        assert!(a.set_parked_lanes("cheap", &claimed.encode(), Some(1)));
        assert!(!claim_probe(&mut a, &lane, 1_000, 1_000));
    }

    #[test]
    fn the_callers_own_failures_park_nothing() {
        let store = SharedStore::default();
        let mut host = worker(&store);
        let lane = LaneId::new("cheap", "a", "m");
        for class in [
            ErrorClass::InvalidRequest,
            ErrorClass::Cancelled,
            ErrorClass::Deadline,
            ErrorClass::Mismatch,
        ] {
            observe(&mut host, &lane, Some(class), 0, 500);
            assert_eq!(probe_at(&host, &lane), None, "{class:?}");
        }
        observe(&mut host, &lane, Some(ErrorClass::RateLimit), 0, 0);
        assert_eq!(probe_at(&host, &lane), None, "no interval, no parking");
    }

    #[test]
    fn a_success_on_a_lane_that_is_not_parked_writes_nothing() {
        let store = SharedStore::default();
        let mut host = worker(&store);
        observe(&mut host, &LaneId::new("cheap", "a", "m"), None, 0, 500);
        assert!(store.borrow().is_empty());
    }
}
