//! Circuit breakers, per key and per provider: a plain state machine the engine drives.
//!
//! Closed -> open after `failureThreshold` consecutive counted failures (the lane's own,
//! `ErrorClass::counts_for_breakers` in the contract; a success resets the count), for
//! `cooldownMs` or until a retry-after, whichever is later. Past that it is half-open: one probe
//! goes through (the lease, see `Engine::lease`). A success closes it; a failure while
//! half-open reopens it with the cooldown doubled, up to `maxCooldownMs`.
//!
//! Every step returns each transition it made, in order, so every one is an event: a breaker
//! whose cooldown ended is half-open before anything else happens to it (`open` ->
//! `half_open` -> `closed` when the probe's success arrives before the engine's expiry tick),
//! and a success while still open (an attempt in flight when it opened) passes through
//! half-open too: there is no `open` -> `closed`.

use ai_router_proto::v1 as pb;

use crate::config::BreakerConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BreakerScope {
    Key,
    Provider,
}

impl BreakerScope {
    /// "key" or "provider": the wire enum's text.
    pub fn as_str(self) -> &'static str {
        pb::BreakerScope::from(self).text()
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "key" => Some(Self::Key),
            "provider" => Some(Self::Provider),
            _ => None,
        }
    }
}

impl From<BreakerScope> for pb::BreakerScope {
    fn from(scope: BreakerScope) -> Self {
        match scope {
            BreakerScope::Key => Self::Key,
            BreakerScope::Provider => Self::Provider,
        }
    }
}

impl TryFrom<pb::BreakerScope> for BreakerScope {
    type Error = pb::BreakerScope;

    /// Unspecified is no scope.
    fn try_from(scope: pb::BreakerScope) -> Result<Self, Self::Error> {
        match scope {
            pb::BreakerScope::Key => Ok(Self::Key),
            pb::BreakerScope::Provider => Ok(Self::Provider),
            pb::BreakerScope::Unspecified => Err(scope),
        }
    }
}

/// (scope, provider id, key alias; "" for the provider scope)
pub type BreakerId = (BreakerScope, String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BreakerPhase {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerPhase {
    /// "closed", "open" or "half_open": the wire enum's text.
    pub fn as_str(self) -> &'static str {
        pb::BreakerPhase::from(self).text()
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "closed" => Some(Self::Closed),
            "open" => Some(Self::Open),
            "half_open" => Some(Self::HalfOpen),
            _ => None,
        }
    }
}

impl From<BreakerPhase> for pb::BreakerPhase {
    fn from(phase: BreakerPhase) -> Self {
        match phase {
            BreakerPhase::Closed => Self::Closed,
            BreakerPhase::Open => Self::Open,
            BreakerPhase::HalfOpen => Self::HalfOpen,
        }
    }
}

/// A change of phase, for the breaker event.
pub type Transition = (BreakerPhase, BreakerPhase);

/// The transitions of one step, in order (at most two: the turn to half-open, then the
/// probe's verdict).
pub type Transitions = Vec<Transition>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    pub phase: BreakerPhase,
    /// Consecutive counted failures while closed.
    pub failures: u32,
    /// Open: when it turns half-open. Half-open: when it turned half-open. Closed: 0.
    pub open_until_ms: i64,
    /// The cooldown of the current opening (doubled by each failed probe); 0 while closed.
    pub cooldown_ms: u64,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            phase: BreakerPhase::Closed,
            failures: 0,
            open_until_ms: 0,
            cooldown_ms: 0,
        }
    }
}

fn after(now: i64, ms: u64) -> i64 {
    now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))
}

impl Breaker {
    /// Closed with no failure counted: nothing worth keeping.
    pub fn is_idle(&self) -> bool {
        self.phase == BreakerPhase::Closed && self.failures == 0
    }

    /// Open past its cooldown turns half-open.
    pub fn tick(&mut self, now: i64) -> Option<Transition> {
        if self.phase == BreakerPhase::Open && now >= self.open_until_ms {
            self.phase = BreakerPhase::HalfOpen;
            return Some((BreakerPhase::Open, BreakerPhase::HalfOpen));
        }
        None
    }

    /// A counted failure at `now`; `retry_at` is the provider's retry-after, when later than now.
    /// `started_ms` is when the failed attempt began (0: unknown): an attempt that began before
    /// the breaker turned half-open is not the probe and does not reopen it.
    pub fn on_failure(
        &mut self,
        config: &BreakerConfig,
        now: i64,
        retry_at: Option<i64>,
        started_ms: i64,
    ) -> Transitions {
        let mut steps: Transitions = self.tick(now).into_iter().collect();
        match self.phase {
            BreakerPhase::Closed => {
                self.failures = self.failures.saturating_add(1);
                if self.failures >= config.failure_threshold {
                    self.failures = 0;
                    self.cooldown_ms = config.cooldown_ms;
                    self.open_until_ms = after(now, self.cooldown_ms).max(retry_at.unwrap_or(0));
                    self.phase = BreakerPhase::Open;
                    steps.push((BreakerPhase::Closed, BreakerPhase::Open));
                }
            }
            BreakerPhase::Open => {
                // An attempt that was already in flight when it opened: only a later
                // retry-after moves the end.
                if let Some(at) = retry_at {
                    self.open_until_ms = self.open_until_ms.max(at);
                }
            }
            BreakerPhase::HalfOpen => {
                if started_ms > 0 && started_ms < self.open_until_ms {
                    return steps;
                }
                let base = if self.cooldown_ms == 0 {
                    config.cooldown_ms
                } else {
                    self.cooldown_ms
                };
                self.cooldown_ms = base.saturating_mul(2).min(config.max_cooldown_ms);
                self.open_until_ms = after(now, self.cooldown_ms).max(retry_at.unwrap_or(0));
                self.phase = BreakerPhase::Open;
                steps.push((BreakerPhase::HalfOpen, BreakerPhase::Open));
            }
        }
        steps
    }

    /// A success at `now` (the probe's or any other): closed with the count reset. An open
    /// breaker passes through half-open first (its cooldown ended, or the success of an attempt
    /// in flight when it opened stands for the probe).
    pub fn on_success(&mut self, now: i64) -> Transitions {
        let mut steps: Transitions = self.tick(now).into_iter().collect();
        if self.phase == BreakerPhase::Open {
            steps.push((BreakerPhase::Open, BreakerPhase::HalfOpen));
        }
        if self.phase != BreakerPhase::Closed {
            steps.push((BreakerPhase::HalfOpen, BreakerPhase::Closed));
        }
        *self = Self::default();
        steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: BreakerConfig = BreakerConfig {
        failure_threshold: 3,
        cooldown_ms: 1_000,
        max_cooldown_ms: 3_000,
    };

    #[test]
    fn opens_after_consecutive_failures_only() {
        let mut b = Breaker::default();
        assert_eq!(b.on_failure(&CONFIG, 0, None, 0), []);
        assert_eq!(b.on_failure(&CONFIG, 0, None, 0), []);
        // A success resets the count.
        assert_eq!(b.on_success(0), []);
        assert!(b.is_idle());
        assert_eq!(b.on_failure(&CONFIG, 10, None, 0), []);
        assert_eq!(b.on_failure(&CONFIG, 10, None, 0), []);
        assert_eq!(
            b.on_failure(&CONFIG, 10, None, 0),
            [(BreakerPhase::Closed, BreakerPhase::Open)]
        );
        assert_eq!(b.open_until_ms, 1_010);
        assert_eq!(b.cooldown_ms, 1_000);
    }

    #[test]
    fn a_later_retry_after_wins() {
        let mut b = Breaker::default();
        for _ in 0..3 {
            b.on_failure(&CONFIG, 0, Some(5_000), 0);
        }
        assert_eq!(b.phase, BreakerPhase::Open);
        assert_eq!(b.open_until_ms, 5_000);
        // In-flight failures while open only extend by a retry-after.
        assert_eq!(b.on_failure(&CONFIG, 100, None, 0), []);
        assert_eq!(b.open_until_ms, 5_000);
        b.on_failure(&CONFIG, 100, Some(6_000), 0);
        assert_eq!(b.open_until_ms, 6_000);
    }

    #[test]
    fn half_open_then_doubling_up_to_the_max() {
        let mut b = Breaker::default();
        for _ in 0..3 {
            b.on_failure(&CONFIG, 0, None, 0);
        }
        assert_eq!(b.tick(999), None);
        assert_eq!(
            b.tick(1_000),
            Some((BreakerPhase::Open, BreakerPhase::HalfOpen))
        );
        assert_eq!(b.open_until_ms, 1_000);
        // A failure that began before it turned half-open is not the probe.
        assert_eq!(b.on_failure(&CONFIG, 1_500, None, 900), []);
        assert_eq!(b.phase, BreakerPhase::HalfOpen);
        // The probe fails: reopened for twice the cooldown.
        assert_eq!(
            b.on_failure(&CONFIG, 1_500, None, 1_200),
            [(BreakerPhase::HalfOpen, BreakerPhase::Open)]
        );
        assert_eq!((b.cooldown_ms, b.open_until_ms), (2_000, 3_500));
        // Again: capped at the max.
        b.tick(3_500);
        b.on_failure(&CONFIG, 3_500, None, 0);
        assert_eq!((b.cooldown_ms, b.open_until_ms), (3_000, 6_500));
        b.tick(6_500);
        b.on_failure(&CONFIG, 6_500, None, 0);
        assert_eq!((b.cooldown_ms, b.open_until_ms), (3_000, 9_500));
        // A failure past the end turns it half-open first, so it reopens at once: both
        // transitions, in order.
        assert_eq!(
            b.on_failure(&CONFIG, 9_600, None, 0),
            [
                (BreakerPhase::Open, BreakerPhase::HalfOpen),
                (BreakerPhase::HalfOpen, BreakerPhase::Open)
            ]
        );
        // A success closes it and forgets the cooldown, through half-open.
        assert_eq!(
            b.on_success(9_700),
            [
                (BreakerPhase::Open, BreakerPhase::HalfOpen),
                (BreakerPhase::HalfOpen, BreakerPhase::Closed)
            ]
        );
        assert_eq!(b, Breaker::default());
    }

    /// The probe answers before anything ticked the breaker past its cooldown (the expiry
    /// runs once a second): the event stream still reads open, half_open, closed.
    #[test]
    fn a_fast_probe_is_seen_half_open_before_closed() {
        let mut b = Breaker::default();
        for _ in 0..3 {
            b.on_failure(&CONFIG, 0, None, 0);
        }
        assert_eq!(b.phase, BreakerPhase::Open);
        assert_eq!(
            b.on_success(1_001),
            [
                (BreakerPhase::Open, BreakerPhase::HalfOpen),
                (BreakerPhase::HalfOpen, BreakerPhase::Closed)
            ]
        );
        // Already half-open (ticked): only the close.
        for _ in 0..3 {
            b.on_failure(&CONFIG, 2_000, None, 0);
        }
        assert_eq!(
            b.tick(3_000),
            Some((BreakerPhase::Open, BreakerPhase::HalfOpen))
        );
        assert_eq!(
            b.on_success(3_001),
            [(BreakerPhase::HalfOpen, BreakerPhase::Closed)]
        );
        // A closed breaker's success is no transition.
        assert_eq!(b.on_success(3_002), []);
    }
}
