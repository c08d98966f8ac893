//! Envoy gauges of the filter's per-call bookkeeping, so that a soak (and an operator) can see it
//! freed on every end: the calls in this process's call tables, the attempt contexts alive, the
//! attempts counted in flight on the lanes, and the linear memory of the VMs. Each VM adds its own
//! changes to the process-wide gauge of the same name (`wasmcustom.<name>` in `/stats`), so a
//! gauge is the sum over the workers' VMs (and the singleton's, for the memory).

use std::cell::RefCell;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

#[derive(Clone, Copy)]
pub enum Gauge {
    /// Entries in the call tables (`Local::calls`): a call from its front stage to its end.
    Calls,
    /// Attempt contexts alive (the attempt stage's `IN_FLIGHT` table).
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
    /// Callbacks skipped because their stage was running (`filter_core::vm::busy`): a counter.
    CallbacksSkipped,
}

impl Gauge {
    const ALL: [Gauge; 7] = [
        Gauge::Calls,
        Gauge::Attempts,
        Gauge::LaneInFlight,
        Gauge::VmMemory,
        Gauge::ReportsPending,
        Gauge::StateVersion,
        Gauge::CallbacksSkipped,
    ];

    fn name(self) -> &'static str {
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

    fn kind(self) -> MetricType {
        match self {
            Gauge::CallbacksSkipped => MetricType::Counter,
            _ => MetricType::Gauge,
        }
    }
}

#[derive(Default)]
struct Defined {
    /// The metric ids, by [`Gauge::ALL`] order; `None` until defined (or when Envoy refused).
    ids: Option<[Option<u32>; Gauge::ALL.len()]>,
    /// This VM's memory as last added to [`Gauge::VmMemory`].
    memory_added: u64,
}

thread_local! {
    static DEFINED: RefCell<Defined> = RefCell::new(Defined::default());
}

/// Adds `delta` to `gauge` (a gauge Envoy refused is left alone: it is only a view).
pub fn add(gauge: Gauge, delta: i64) {
    if delta == 0 {
        return;
    }
    let Some(id) = id_of(gauge) else { return };
    let _ = hostcalls::increment_metric(id, delta);
}

/// Sets `gauge` to `value` (only one VM sets a gauge this way: the singleton).
pub fn set(gauge: Gauge, value: u64) {
    let Some(id) = id_of(gauge) else { return };
    let _ = hostcalls::record_metric(id, value);
}

/// Brings [`Gauge::VmMemory`] up to this VM's linear memory.
pub fn track_memory() {
    let now = linear_memory_bytes();
    let before = DEFINED.with(|d| {
        d.try_borrow_mut()
            .map(|mut d| std::mem::replace(&mut d.memory_added, now))
            .unwrap_or(now)
    });
    add(
        Gauge::VmMemory,
        i64::try_from(now).unwrap_or(i64::MAX) - i64::try_from(before).unwrap_or(i64::MAX),
    );
}

fn id_of(gauge: Gauge) -> Option<u32> {
    DEFINED.with(|d| {
        let mut d = d.try_borrow_mut().ok()?;
        let ids = d.ids.get_or_insert_with(|| {
            Gauge::ALL.map(|g| hostcalls::define_metric(g.kind(), g.name()).ok())
        });
        ids[gauge as usize]
    })
}

#[cfg(target_arch = "wasm32")]
fn linear_memory_bytes() -> u64 {
    (core::arch::wasm32::memory_size(0) as u64).saturating_mul(65_536)
}

/// Off wasm (the host build of the glue) there is no linear memory to report.
#[cfg(not(target_arch = "wasm32"))]
fn linear_memory_bytes() -> u64 {
    0
}
