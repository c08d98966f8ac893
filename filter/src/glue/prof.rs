//! Where a worker's time goes, for the benchmark's profile build (`--features profile`): each
//! callback and each host method is timed with Envoy's clock and summed per name on this VM;
//! every 5 s of wall time the VM logs one line (at warn, so a default log level shows it) with
//! the count, the mean and the total per name. Without the feature, [`time`] is the call itself.

#[cfg(feature = "profile")]
mod on {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct Table {
        started_ns: u64,
        depth: u32,
        names: BTreeMap<&'static str, (u64, u64)>,
    }

    thread_local! {
        static TABLE: RefCell<Table> = RefCell::new(Table::default());
    }

    fn now_ns() -> u64 {
        proxy_wasm::hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }

    pub fn time<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
        let start = now_ns();
        TABLE.with(|t| t.borrow_mut().depth += 1);
        let out = f();
        let end = now_ns();
        let line = TABLE.with(|t| {
            let mut t = t.borrow_mut();
            t.depth -= 1;
            let e = t.names.entry(name).or_default();
            e.0 += 1;
            e.1 += end.saturating_sub(start);
            if t.started_ns == 0 {
                t.started_ns = end;
            }
            if t.depth > 0 || end.saturating_sub(t.started_ns) < 5_000_000_000 {
                return None;
            }
            let mut line = format!(
                "ai-router profile over {} ms:",
                end.saturating_sub(t.started_ns) / 1_000_000
            );
            for (name, (count, ns)) in &t.names {
                line.push_str(&format!(
                    " {name}={count}x{:.1}us={}ms",
                    *ns as f64 / (*count).max(1) as f64 / 1000.0,
                    ns / 1_000_000
                ));
            }
            t.names.clear();
            t.started_ns = end;
            Some(line)
        });
        if let Some(line) = line {
            let _ = proxy_wasm::hostcalls::log(proxy_wasm::types::LogLevel::Warn, &line);
        }
        out
    }
}

#[cfg(feature = "profile")]
pub use on::time;

/// Runs `f` (timed under `name` in the profile build).
#[cfg(not(feature = "profile"))]
#[inline(always)]
pub fn time<R>(_name: &'static str, f: impl FnOnce() -> R) -> R {
    f()
}
