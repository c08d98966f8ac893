//! The one backoff formula of the filter's retries: a call's next attempt, the sync stream's
//! reconnect, a report batch's next send.

/// The wait after the n-th failure in a row, every retry of the filter's: a call's next
/// attempt, the sync stream's reconnect, a report batch's next send. min(maxMs, baseMs *
/// factor^(n-1)) scaled by `unit_random` into [0.5, 1) of it (1.0: no jitter).
pub fn backoff_ms(b: &ai_router_proto::v1::BackoffSettings, n: u32, unit_random: f64) -> u64 {
    let exp = b.factor.powi(n.saturating_sub(1).min(64) as i32);
    let raw = (b.base_ms as f64 * exp).min(b.max_ms as f64);
    (raw * (0.5 + 0.5 * unit_random.clamp(0.0, 1.0))) as u64
}

/// The backoff of the singleton's retries towards the control plane (the sync stream's
/// reconnect, a report batch): 250 ms doubling up to 5 s, without jitter.
pub const CONTROL_PLANE_RETRY: ai_router_proto::v1::BackoffSettings =
    ai_router_proto::v1::BackoffSettings {
        base_ms: 250,
        factor: 2.0,
        max_ms: 5_000,
    };

/// The wait before the n-th retry in a row towards the control plane.
pub fn control_plane_retry_ms(n: u32) -> i64 {
    backoff_ms(&CONTROL_PLANE_RETRY, n.max(1), 1.0) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = ai_router_proto::v1::BackoffSettings {
            base_ms: 100,
            factor: 2.0,
            max_ms: 5000,
        };
        assert_eq!(backoff_ms(&b, 1, 0.0), 50);
        assert_eq!(backoff_ms(&b, 1, 0.999_999), 99);
        assert_eq!(backoff_ms(&b, 3, 0.0), 200);
        assert_eq!(backoff_ms(&b, 30, 0.0), 2500);
        assert!(backoff_ms(&b, 30, 0.99) < 5000);
    }
}
