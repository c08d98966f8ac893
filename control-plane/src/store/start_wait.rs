//! A shared store (the Postgres key store, the Redis state store) that does not answer when
//! `serve` starts is waited for, not given up on: a database that is still starting (a fresh
//! Postgres container runs its init scripts on a socket only, while its healthcheck already
//! passes), or a second control plane beside one that migrates, is not an outage to exit on.
//!
//! [`wait_for`] tries the store's open again after a bounded exponential backoff
//! ([`Backoff`]: [`FIRST_DELAY`], doubling, at most [`MAX_DELAY`]), logging each wait once at
//! warn with the store's name and the error (never its URL: the stores' errors carry none),
//! for at most `storeStartWaitMs` (default 120 s) in all; only then does the start
//! fail, with the last error. A store that answered and refused (a bad URL, a TLS certificate
//! that does not verify, a schema newer than the binary) fails the start at once. The HTTP
//! and gRPC listeners are bound only after the stores opened, so while it waits the control
//! plane's `/health` does not answer (what the compose healthcheck reads as not ready).

use std::time::{Duration, Instant};

/// The first wait after a failed open.
pub const FIRST_DELAY: Duration = Duration::from_millis(250);
/// No wait is longer: a store that comes back is seen within this.
pub const MAX_DELAY: Duration = Duration::from_secs(5);

/// The waits between tries: [`FIRST_DELAY`], then each twice the last, at most [`MAX_DELAY`].
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: FIRST_DELAY }
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = delay.saturating_mul(2).min(MAX_DELAY);
        Some(delay)
    }
}

/// Why an open failed.
#[derive(Debug)]
pub enum OpenFailure {
    /// The store did not answer (no connection, none in time, a connection dropped): wait.
    Away(String),
    /// The store answered and refused, or the config is wrong: waiting would not help.
    Refused(anyhow::Error),
}

/// Runs `open` (given the time left of `bound`) until it succeeds, waiting ([`Backoff`]) after
/// each [`OpenFailure::Away`], for at most `bound` in all. `store` names the store in the log
/// and the error (`gateway.keyStore`, `stateStore`).
pub fn wait_for<T>(
    store: &str,
    bound: Duration,
    mut open: impl FnMut(Duration) -> Result<T, OpenFailure>,
) -> anyhow::Result<T> {
    let until = Instant::now() + bound;
    let mut backoff = Backoff::default();
    let mut waits = 0u32;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let err = match open(left) {
            Ok(opened) => {
                if waits > 0 {
                    tracing::info!(store, waits, "the shared store answers: starting");
                }
                return Ok(opened);
            }
            Err(OpenFailure::Refused(err)) => return Err(err),
            Err(OpenFailure::Away(err)) => err,
        };
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            anyhow::bail!(
                "no answer within {} s of the start (storeStartWaitMs); the last error: {err}",
                bound.as_secs_f64()
            );
        }
        let delay = backoff.next().unwrap_or(MAX_DELAY).min(left);
        waits += 1;
        tracing::warn!(
            store,
            %err,
            wait_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
            "the shared store does not answer yet: waiting for it before starting"
        );
        std::thread::sleep(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_grows_from_the_first_delay_and_is_capped() {
        let delays: Vec<Duration> = Backoff::default().take(8).collect();
        assert_eq!(delays[0], FIRST_DELAY);
        for pair in delays.windows(2) {
            assert!(
                pair[1] == (pair[0] * 2).min(MAX_DELAY),
                "each wait doubles the last, up to the cap: {delays:?}"
            );
        }
        assert_eq!(delays[1], Duration::from_millis(500));
        assert_eq!(delays[4], Duration::from_secs(4));
        assert!(delays[5..].iter().all(|d| *d == MAX_DELAY), "{delays:?}");
        // Never past the cap, however long it runs.
        assert!(Backoff::default().take(1000).all(|d| d <= MAX_DELAY));
    }

    #[test]
    fn an_away_store_is_tried_again_until_it_answers() {
        let mut tries = 0;
        let opened = wait_for("test store", Duration::from_secs(30), |_| {
            tries += 1;
            if tries < 3 {
                Err(OpenFailure::Away("no connection".into()))
            } else {
                Ok(tries)
            }
        });
        assert!(matches!(opened, Ok(3)), "{opened:?}");
    }

    #[test]
    fn a_refusal_ends_the_start_at_once() {
        let mut tries = 0;
        let opened: anyhow::Result<()> = wait_for("test store", Duration::from_secs(30), |_| {
            tries += 1;
            Err(OpenFailure::Refused(anyhow::anyhow!("certificate refused")))
        });
        assert_eq!(tries, 1);
        assert!(
            matches!(&opened, Err(e) if e.to_string() == "certificate refused"),
            "{opened:?}"
        );
    }

    #[test]
    fn past_the_bound_the_start_fails_with_the_last_error() {
        let bound = Duration::from_millis(300);
        let started = Instant::now();
        let mut lefts = Vec::new();
        let opened: anyhow::Result<()> = wait_for("gateway.keyStore", bound, |left| {
            lefts.push(left);
            Err(OpenFailure::Away(format!("no connection {}", lefts.len())))
        });
        let took = started.elapsed();
        assert!(took >= bound, "gave up before the bound: {took:?}");
        // 250 ms, then what is left of the bound (none when the machine is slow), then the
        // last try at the bound.
        assert!((2..=3).contains(&lefts.len()), "{lefts:?}");
        assert!(lefts.windows(2).all(|p| p[1] < p[0]), "{lefts:?}");
        let message = opened.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            message,
            format!(
                "no answer within 0.3 s of the start (storeStartWaitMs); the last error: no connection {}",
                lefts.len()
            )
        );
    }

    #[test]
    fn a_zero_bound_tries_once() {
        let mut tries = 0;
        let opened: anyhow::Result<()> = wait_for("stateStore", Duration::ZERO, |_| {
            tries += 1;
            Err(OpenFailure::Away("not reachable".into()))
        });
        assert_eq!(tries, 1);
        assert!(opened.is_err());
    }
}
