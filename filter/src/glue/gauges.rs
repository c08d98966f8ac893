//! The filter's metrics in Envoy ([`Gauge`]'s names and kinds are filter-core's): defined once
//! per VM, each VM adding its own changes to the process-wide metric of the same name.

use std::cell::RefCell;

use ai_router_filter_core::vm::gauge::Gauge;
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

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
            Gauge::ALL.map(|g| {
                let kind = if g.is_counter() {
                    MetricType::Counter
                } else {
                    MetricType::Gauge
                };
                hostcalls::define_metric(kind, g.name()).ok()
            })
        });
        ids[gauge.index()]
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
