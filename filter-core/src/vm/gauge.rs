//! The filter's gauges of its per-call bookkeeping, so that a soak (and an operator) can see it
//! freed on every end: the calls in the call tables, the attempt contexts alive, the attempts
//! counted in flight on the lanes, the linear memory of the VMs, the reports not yet
//! acknowledged, the applied state version, the skipped callbacks. Each VM adds its own changes
//! to the process-wide metric of the same name (`wasmcustom.<name>` in Envoy's `/stats`), so a
//! gauge is the sum over the workers' VMs (and the singleton's). The glue defines the metrics
//! and moves them; the names and kinds are here.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gauge {
    /// Entries in the call tables ([`crate::vm::calls`]): a call from its front stage to its end.
    Calls,
    /// Attempt contexts alive ([`crate::worker::Worker`]'s attempts).
    Attempts,
    /// The attempts counted in flight on the lanes (the shared `inflight` records).
    LaneInFlight,
    /// The VMs' linear memory, in bytes (it grows and never shrinks: its bound is the soak's).
    VmMemory,
    /// Outcome reports not yet acknowledged by a control plane: held by a worker, on the
    /// singleton's queue, in its outbox or on the wire. A drain waits for 0 before Envoy stops
    /// (`ai-router drain`), so stopping loses no usage.
    ReportsPending,
    /// The state version the workers read, as the control plane numbered it (set by the
    /// singleton when it published a snapshot or a delta): what a test waits for after a push.
    StateVersion,
    /// Callbacks skipped because their stage was running ([`crate::vm::busy`]): a counter.
    CallbacksSkipped,
}

impl Gauge {
    pub const ALL: [Gauge; 7] = [
        Gauge::Calls,
        Gauge::Attempts,
        Gauge::LaneInFlight,
        Gauge::VmMemory,
        Gauge::ReportsPending,
        Gauge::StateVersion,
        Gauge::CallbacksSkipped,
    ];

    /// The metric's name (Envoy shows it as `wasmcustom.<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Gauge::Calls => "ai_router.calls_in_progress",
            Gauge::Attempts => "ai_router.attempts_in_progress",
            Gauge::LaneInFlight => "ai_router.lane_attempts_in_flight",
            Gauge::VmMemory => "ai_router.vm_memory_bytes",
            Gauge::ReportsPending => "ai_router.reports_pending",
            Gauge::StateVersion => ai_router_contract::STATE_VERSION_STAT,
            Gauge::CallbacksSkipped => "ai_router.callbacks_skipped",
        }
    }

    /// A counter (only ever added to) rather than a gauge.
    pub fn is_counter(self) -> bool {
        matches!(self, Gauge::CallbacksSkipped)
    }

    /// Its place in [`Gauge::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gauge_is_listed_at_its_index() {
        for (i, g) in Gauge::ALL.iter().enumerate() {
            assert_eq!(g.index(), i, "{}", g.name());
        }
    }
}
