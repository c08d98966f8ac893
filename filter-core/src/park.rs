//! Snap-back (`resetIntervalMs`): a lane that failed a call whose policy sets an interval is
//! parked. Calls with an interval then go to the next lane of their order (a pricier one
//! under `autoSort`) without trying it, except one call per interval: that call probes the
//! parked lane, and its answer unparks it, so the calls after it snap back. A probe that fails
//! parks the lane for another interval. Parking only reorders: a parked lane is still tried
//! when nothing else is left, and a lane held by a breaker, a cooldown or a blacklist stays
//! out as it would without it.
//!
//! The memory is per VM (one Envoy worker): under load every worker probes at most once per
//! interval.

use std::collections::HashMap;

use crate::classify::Class;
use crate::lanes::LaneId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parked {
    /// The next call at or after this time probes the lane.
    probe_at_ms: i64,
}

/// The parked lanes of this VM.
#[derive(Debug, Default)]
pub struct Parking {
    lanes: HashMap<LaneId, Parked>,
}

/// Whether a failure says the lane may be down (and a pricier one should carry the calls):
/// a failure that is the caller's or the call's own (an invalid request, a cancel, the deadline,
/// a mismatched answer) says nothing about the lane.
fn parks(class: Class) -> bool {
    matches!(
        class,
        Class::RateLimit
            | Class::Quota
            | Class::Auth
            | Class::Transient
            | Class::Network
            | Class::Timeout
            | Class::Stream
    )
}

impl Parking {
    /// Whether calls with an interval pass over this lane now (it is parked and its next probe
    /// is not due).
    pub fn passed_over(&self, lane: &LaneId, now_ms: i64) -> bool {
        self.lanes.get(lane).is_some_and(|p| p.probe_at_ms > now_ms)
    }

    /// Whether the lane is parked at all (its probe may be due).
    pub fn is_parked(&self, lane: &LaneId) -> bool {
        self.lanes.contains_key(lane)
    }

    /// A call goes to a parked lane whose probe is due: the next probe is one interval away, so
    /// the calls meanwhile keep passing over it.
    pub fn probing(&mut self, lane: &LaneId, now_ms: i64, interval_ms: u64) {
        if let Some(p) = self.lanes.get_mut(lane) {
            p.probe_at_ms = now_ms.saturating_add(interval_ms as i64);
        }
    }

    /// An attempt's outcome on a lane, for a call with an interval: a failure that may mean
    /// the lane is down parks it for one interval, a success unparks it (snap-back).
    pub fn observe(
        &mut self,
        lane: &LaneId,
        failure: Option<Class>,
        now_ms: i64,
        interval_ms: u64,
    ) {
        match failure {
            None => {
                self.lanes.remove(lane);
            }
            Some(class) if parks(class) && interval_ms > 0 => {
                self.lanes.insert(
                    lane.clone(),
                    Parked {
                        probe_at_ms: now_ms.saturating_add(interval_ms as i64),
                    },
                );
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_lane_is_passed_over_until_its_probe_is_due_and_a_success_unparks_it() {
        let lane = LaneId::new("cheap", "a", "m");
        let mut parking = Parking::default();
        assert!(!parking.passed_over(&lane, 0));
        parking.observe(&lane, Some(Class::Transient), 1_000, 500);
        assert!(parking.passed_over(&lane, 1_499));
        // Due: one call probes, the others keep passing over it for another interval.
        assert!(!parking.passed_over(&lane, 1_500));
        assert!(parking.is_parked(&lane));
        parking.probing(&lane, 1_500, 500);
        assert!(parking.passed_over(&lane, 1_600));
        // The probe failed: parked again from then.
        parking.observe(&lane, Some(Class::Network), 1_700, 500);
        assert!(parking.passed_over(&lane, 2_100));
        // The next probe answers: every call is back on the lane.
        parking.observe(&lane, None, 2_200, 500);
        assert!(!parking.passed_over(&lane, 2_201));
        assert!(!parking.is_parked(&lane));
    }

    #[test]
    fn the_callers_own_failures_park_nothing() {
        let lane = LaneId::new("cheap", "a", "m");
        let mut parking = Parking::default();
        for class in [
            Class::InvalidRequest,
            Class::Cancelled,
            Class::Deadline,
            Class::Mismatch,
        ] {
            parking.observe(&lane, Some(class), 0, 500);
            assert!(!parking.is_parked(&lane), "{class:?}");
        }
        parking.observe(&lane, Some(Class::RateLimit), 0, 0);
        assert!(!parking.is_parked(&lane), "no interval, no parking");
    }
}
