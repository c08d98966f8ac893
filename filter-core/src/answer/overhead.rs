//! What the gateway adds to a call (`x-ai-router-overhead-ms`, `ai_router_overhead_seconds`):
//! the front stage's time from the client's request to the answer's first byte, less the time
//! the providers held the call's attempts. An attempt is held from its send (the attempt stage
//! let the request go) to the arrival of the last provider bytes it needed: a stream's first
//! token (the gate's release), a whole answer's last byte (a unary answer is judged whole), or
//! the bytes its failure was judged on; an attempt that ended with no verdict (a timeout, a
//! reset, a client gone) until then. What is left is the gateway's own time: both stages'
//! work, the hop between them, the waits between attempts (backoff, a lane that returns).
//! Times are microseconds of the host's wall clock.

/// One attempt's time at its provider: from its send to `end_us` (never negative).
pub fn upstream_share(sent_us: i64, end_us: i64) -> i64 {
    end_us.saturating_sub(sent_us).max(0)
}

/// The call's overhead: its time from `started_us` to `first_byte_us` less `upstream_us`
/// (the attempts' shares summed), never below 0 (a wall clock may step back).
pub fn overhead_us(started_us: i64, first_byte_us: i64, upstream_us: i64) -> u64 {
    let total = first_byte_us.saturating_sub(started_us);
    u64::try_from(total.saturating_sub(upstream_us)).unwrap_or(0)
}

/// The header's value: milliseconds with three decimals (`0.231`).
pub fn header_value(overhead_us: u64) -> String {
    format!("{}.{:03}", overhead_us / 1000, overhead_us % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overhead_is_the_calls_time_less_its_attempts_at_the_providers() {
        // A call of 250.3 ms whose one attempt was at its provider for 250 ms.
        let started = 1_000_000;
        let share = upstream_share(started + 120, started + 250_120);
        assert_eq!(share, 250_000);
        assert_eq!(overhead_us(started, started + 250_300, share), 300);
        // Two attempts: a failure of 40 ms, a backoff of 25 ms, an answer of 100 ms; the
        // backoff is the gateway's.
        let shares = upstream_share(100, 40_100) + upstream_share(65_300, 165_300);
        assert_eq!(overhead_us(0, 165_700, shares), 25_700);
    }

    #[test]
    fn a_clock_that_steps_back_never_makes_a_negative_share_or_overhead() {
        assert_eq!(upstream_share(500, 400), 0);
        assert_eq!(overhead_us(1_000, 900, 0), 0);
        assert_eq!(overhead_us(0, 1_000, 5_000), 0);
        assert_eq!(overhead_us(i64::MIN, i64::MAX, 0), i64::MAX as u64);
    }

    #[test]
    fn the_header_is_milliseconds_with_three_decimals() {
        assert_eq!(header_value(0), "0.000");
        assert_eq!(header_value(231), "0.231");
        assert_eq!(header_value(12_045), "12.045");
    }
}
