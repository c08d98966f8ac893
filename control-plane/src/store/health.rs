//! Whether the shared stores answer: a gauge and counters for `/metrics`, and one log line per
//! outage and per recovery (not one per failed call).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// One shared store's health, process-wide (a control plane opens each store once).
#[derive(Debug)]
pub struct StoreHealth {
    /// `stateStore` or `gateway.keyStore`: names the store in log lines.
    pub name: &'static str,
    /// Whether the last call succeeded (true until a call fails).
    down: AtomicBool,
    /// Whether the control plane serves (both stores opened): before, a store that does not
    /// answer is the start's wait to report (`store::start_wait`), not an outage served from
    /// local state.
    serving: AtomicBool,
    /// Calls that failed.
    pub errors: AtomicU64,
    /// Outages that ended.
    pub recoveries: AtomicU64,
    /// Calls served from local state because the store did not answer.
    pub local_fallbacks: AtomicU64,
}

impl StoreHealth {
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            down: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            local_fallbacks: AtomicU64::new(0),
        }
    }

    pub fn is_up(&self) -> bool {
        !self.down.load(Ordering::Relaxed)
    }

    /// A call failed: logs when this starts an outage; returns whether it did.
    pub fn failed(&self, err: &str) -> bool {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let started = !self.down.swap(true, Ordering::Relaxed);
        if started && self.serving.load(Ordering::Relaxed) {
            tracing::error!(store = self.name, %err, "the shared store does not answer: serving from local state until it does");
        }
        started
    }

    /// The store opened and the control plane serves from now on: a later failure is an
    /// outage, logged as one (the start's failures were the start's wait to report).
    pub fn start_serving(&self) {
        self.down.store(false, Ordering::Relaxed);
        self.serving.store(true, Ordering::Relaxed);
    }

    /// A call succeeded: logs when this ends an outage; returns whether it did.
    pub fn succeeded(&self) -> bool {
        let ended = self.down.swap(false, Ordering::Relaxed);
        if ended {
            self.recoveries.fetch_add(1, Ordering::Relaxed);
            tracing::info!(store = self.name, "the shared store answers again");
        }
        ended
    }

    pub fn fell_back(&self) {
        self.local_fallbacks.fetch_add(1, Ordering::Relaxed);
    }
}

/// The Redis state store's health.
pub static STATE: StoreHealth = StoreHealth::new("stateStore");
/// The Postgres key store's health.
pub static KEYS: StoreHealth = StoreHealth::new("gateway.keyStore");

/// The shared stores' families for `/metrics` (`family` writes `# HELP` and `# TYPE`).
pub fn render(out: &mut String, family: fn(&mut String, &str, &str, &str)) {
    use std::fmt::Write as _;
    let stores = [("state", &STATE), ("keys", &KEYS)];
    type Family = (
        &'static str,
        &'static str,
        &'static str,
        fn(&StoreHealth) -> u64,
    );
    let families: [Family; 4] = [
        (
            "ai_router_shared_store_up",
            "gauge",
            "1 while the shared store (Redis state, Postgres keys) answers, 0 while this control plane serves from local state.",
            |h| u64::from(h.is_up()),
        ),
        (
            "ai_router_shared_store_errors_total",
            "counter",
            "Calls to the shared store that failed because it did not answer.",
            |h| h.errors.load(Ordering::Relaxed),
        ),
        (
            "ai_router_shared_store_recoveries_total",
            "counter",
            "Outages of the shared store that ended (its state reconciled).",
            |h| h.recoveries.load(Ordering::Relaxed),
        ),
        (
            "ai_router_shared_store_local_fallbacks_total",
            "counter",
            "Probe leases and blocks of per-minute budgets granted from local state during an outage of the shared store.",
            |h| h.local_fallbacks.load(Ordering::Relaxed),
        ),
    ];
    for (name, kind, help, value) in families {
        family(out, name, kind, help);
        for (store, health) in stores {
            let _ = writeln!(out, "{name}{{store=\"{store}\"}} {}", value(health));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outages_once() {
        let h = StoreHealth::new("test");
        assert!(h.is_up());
        assert!(h.failed("refused"));
        assert!(!h.failed("refused"));
        assert!(!h.is_up());
        assert_eq!(h.errors.load(Ordering::Relaxed), 2);
        assert!(h.succeeded());
        assert!(!h.succeeded());
        assert!(h.is_up());
        assert_eq!(h.recoveries.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_start_s_failures_end_when_the_control_plane_serves() {
        let h = StoreHealth::new("test");
        assert!(h.failed("not listening yet"), "counted as an outage");
        h.start_serving();
        assert!(h.is_up(), "the store opened: it answers");
        assert!(!h.succeeded(), "no recovery of an outage never logged");
        assert!(h.failed("gone"), "a failure while serving starts an outage");
    }

    #[test]
    fn renders_every_family_for_both_stores() {
        let mut out = String::new();
        render(&mut out, |out, name, kind, help| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        });
        assert!(out.contains("# TYPE ai_router_shared_store_up gauge\n"));
        assert!(out.contains("ai_router_shared_store_up{store=\"state\"} "));
        assert!(out.contains("ai_router_shared_store_errors_total{store=\"keys\"} "));
        assert_eq!(out.lines().filter(|l| !l.starts_with('#')).count(), 8);
    }
}
