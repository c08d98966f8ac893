//! Wall-clock time as the control plane reads it: milliseconds since the Unix epoch behind a
//! trait, so the tests set the time by hand.

/// Milliseconds since the Unix epoch; injectable so the tests control time.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> i64;
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// A clock the tests set by hand.
#[cfg(test)]
pub(crate) struct TestClock(pub std::sync::atomic::AtomicI64);

#[cfg(test)]
impl Clock for TestClock {
    fn now_ms(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}
