//! What the picker reads of this Envoy beside the pushed state: holds, calls in flight,
//! latencies, parked lanes and the lane health kept in shared records. The real view reads the
//! VM's shared data; a test's view is a plain struct.

use std::rc::Rc;

use crate::state::LaneHealth;
use crate::vocab::{LaneId, LocalHold};

/// The world the picker reads.
pub trait View {
    fn holds(&self, lane: &LaneId) -> Vec<LocalHold>;
    fn in_flight(&self, provider: &str, key: &str) -> u32;
    fn provider_in_flight(&self, provider: &str) -> u32;
    /// The lane's latency EWMA in ms, if it was ever measured.
    fn latency(&self, _lane: &LaneId) -> Option<f64> {
        None
    }
    /// The pushed lane health of a provider, when it is kept apart from the state (Envoy's
    /// per-provider records); `None`: the state's own.
    fn health(&self, _provider: &str) -> Option<Rc<LaneHealth>> {
        None
    }
    /// When the control plane generated the newest update this process received (it has
    /// heard of what this process reported before then); `None`: the state's own time.
    fn synced_at_ms(&self) -> Option<i64> {
        None
    }
    /// Requests and tokens this process sent on a billing scope's model since `since_ms` (its
    /// reservations, [`crate::vm::local::Sends`]).
    fn sent_since(
        &self,
        _provider: &str,
        _scope: &str,
        _model: &str,
        _since_ms: i64,
    ) -> (u64, u64) {
        (0, 0)
    }
    /// When a parked lane is next probed (snap-back, [`crate::lanes::park`]); `None`: not parked.
    fn parked(&self, _lane: &LaneId) -> Option<i64> {
        None
    }
}

/// A view with nothing of its own: no holds, nothing in flight, the state's health.
pub struct NoView;

impl View for NoView {
    fn holds(&self, _lane: &LaneId) -> Vec<LocalHold> {
        Vec::new()
    }
    fn in_flight(&self, _provider: &str, _key: &str) -> u32 {
        0
    }
    fn provider_in_flight(&self, _provider: &str) -> u32 {
        0
    }
}
