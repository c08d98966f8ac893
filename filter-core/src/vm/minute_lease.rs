//! A virtual key's `requestsPerMinute` across every Envoy. Each Envoy takes blocks of the
//! minute's budget from its control plane, which counts what it grants per key and UTC minute
//! in the state store (Redis: one count for every control plane), and admits from its blocks,
//! asking for the next one before the last runs out. The data path never waits for an answer:
//!
//! - while no answer has come, an Envoy admits up to one block beyond what it was granted
//!   ("credit"): the first calls of a minute pass at once, and the blocks granted later count
//!   them;
//! - once the control plane grants fewer calls than asked, the minute's budget is spent: the
//!   Envoy admits only what it was granted, and asks no more until the next minute;
//! - when the control plane cannot be asked (no answer in time, an error), the Envoy counts on
//!   its own for the rest of the minute, up to the whole limit (the behaviour of one Envoy
//!   alone);
//! - no Envoy admits more than the limit in one minute.
//!
//! The bound: the control plane grants at most the limit per minute over all Envoys, and each
//! Envoy admits at most one block beyond its grants, so a minute admits at most
//! `limit + E × block` calls with E Envoys (and never more than `E × limit`). The budget is not
//! wasted: an Envoy that keeps being called uses every call it was granted.
//!
//! The record lives in Envoy's shared data (one per key, compare-and-swap by the workers); the
//! singleton sends the asks and writes the answers ([`MinuteLease::answered`]).

/// A minute in milliseconds.
pub const MINUTE_MS: i64 = 60_000;

/// The UTC minute of `now_ms` (minutes since the epoch).
pub fn minute_of(now_ms: i64) -> i64 {
    now_ms.div_euclid(MINUTE_MS)
}

/// How many calls an Envoy asks for at a time ([`ai_router_contract::minute::block`], which the
/// control plane grants whole while the minute lasts).
pub fn block_size(limit: u64) -> u32 {
    u32::try_from(ai_router_contract::minute::block(limit)).unwrap_or(u32::MAX)
}

/// An ask older than this without an answer (the singleton restarted) may be made again.
pub const ASK_TIMEOUT_MS: i64 = 5_000;

/// Where an Envoy's count for one minute stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Admitting from blocks, one block of credit ahead.
    #[default]
    Leasing,
    /// The control plane granted fewer than asked: only the grants are left.
    Spent,
    /// The control plane did not answer: counting alone, up to the limit.
    Local,
}

impl Mode {
    fn code(self) -> u8 {
        match self {
            Mode::Leasing => 0,
            Mode::Spent => 1,
            Mode::Local => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Mode::Leasing),
            1 => Some(Mode::Spent),
            2 => Some(Mode::Local),
            _ => None,
        }
    }
}

/// One key's minute at one Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MinuteLease {
    /// The UTC minute (minutes since the epoch).
    pub minute: i64,
    /// Calls admitted in it.
    pub used: u32,
    /// Calls the control plane granted in it.
    pub granted: u32,
    /// When the ask in flight was made (ms since the epoch); 0: none.
    pub asking_since_ms: i64,
    pub mode: Mode,
}

/// A block to ask the control plane for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub minute: i64,
    pub calls: u32,
}

/// The verdict on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub admitted: bool,
    /// Set when this call's record took the ask: the caller sends it.
    pub ask: Option<Ask>,
}

const ENCODED_LEN: usize = 25;

impl MinuteLease {
    fn fresh(minute: i64) -> Self {
        Self {
            minute,
            ..Self::default()
        }
    }

    /// 25 bytes, big endian: minute, used, granted, asking since, mode.
    pub fn encode(self) -> [u8; ENCODED_LEN] {
        let mut out = [0u8; ENCODED_LEN];
        out[..8].copy_from_slice(&self.minute.to_be_bytes());
        out[8..12].copy_from_slice(&self.used.to_be_bytes());
        out[12..16].copy_from_slice(&self.granted.to_be_bytes());
        out[16..24].copy_from_slice(&self.asking_since_ms.to_be_bytes());
        out[24] = self.mode.code();
        out
    }

    /// `None` for anything that is not a record (absent, another length, an unknown mode).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENCODED_LEN {
            return None;
        }
        Some(Self {
            minute: i64::from_be_bytes(bytes.get(..8)?.try_into().ok()?),
            used: u32::from_be_bytes(bytes.get(8..12)?.try_into().ok()?),
            granted: u32::from_be_bytes(bytes.get(12..16)?.try_into().ok()?),
            asking_since_ms: i64::from_be_bytes(bytes.get(16..24)?.try_into().ok()?),
            mode: Mode::from_code(*bytes.get(24)?)?,
        })
    }

    /// The record to count `minute` in: the stored one of that minute, or of a later one (a
    /// worker whose clock lags keeps counting there), else a new one.
    fn current(stored: Option<Self>, minute: i64) -> Self {
        match stored {
            Some(s) if s.minute >= minute => s,
            _ => Self::fresh(minute),
        }
    }

    /// One call of a key whose limit is `limit` (> 0) at `now_ms` in `minute`: the record to
    /// store and the verdict.
    pub fn admit(stored: Option<Self>, minute: i64, limit: u64, now_ms: i64) -> (Self, Admission) {
        let mut lease = Self::current(stored, minute);
        let limit = u32::try_from(limit).unwrap_or(u32::MAX);
        let block = block_size(u64::from(limit));
        let allowance = match lease.mode {
            Mode::Leasing => lease.granted.saturating_add(block),
            Mode::Spent => lease.granted,
            Mode::Local => limit,
        }
        .min(limit);
        let admitted = lease.used < allowance;
        if admitted {
            lease.used += 1;
        }
        let asking = lease.asking_since_ms != 0
            && now_ms.saturating_sub(lease.asking_since_ms) < ASK_TIMEOUT_MS;
        // Ask while half a block is still left, so the next block is there before it is needed.
        let running_low = lease.used.saturating_add(block.div_ceil(2)) > lease.granted;
        let ask = (lease.mode == Mode::Leasing && !asking && running_low && lease.granted < limit)
            .then(|| {
                lease.asking_since_ms = now_ms.max(1);
                Ask {
                    minute: lease.minute,
                    calls: block,
                }
            });
        (lease, Admission { admitted, ask })
    }

    /// The record after the answer to `ask`: `Some(granted)` from the control plane, `None`
    /// when it could not answer. `None` when there is nothing to change (the record moved on
    /// to another minute, or is gone).
    pub fn answered(stored: Option<Self>, ask: Ask, granted: Option<u32>) -> Option<Self> {
        let mut lease = stored.filter(|l| l.minute == ask.minute)?;
        lease.asking_since_ms = 0;
        match granted {
            Some(granted) => {
                lease.granted = lease.granted.saturating_add(granted.min(ask.calls));
                if granted < ask.calls && lease.mode == Mode::Leasing {
                    lease.mode = Mode::Spent;
                }
            }
            None => {
                if lease.mode == Mode::Leasing {
                    lease.mode = Mode::Local;
                }
            }
        }
        Some(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: i64 = 29_559_600;
    const NOW: i64 = M * 60_000 + 1_000;

    /// Calls `n` times; returns the record and how many were admitted, answering no ask.
    fn calls(mut lease: Option<MinuteLease>, n: u32, limit: u64) -> (MinuteLease, u32, Vec<Ask>) {
        let mut admitted = 0;
        let mut asks = Vec::new();
        for _ in 0..n {
            let (next, verdict) = MinuteLease::admit(lease, M, limit, NOW);
            admitted += u32::from(verdict.admitted);
            asks.extend(verdict.ask);
            lease = Some(next);
        }
        (lease.unwrap_or_default(), admitted, asks)
    }

    #[test]
    fn the_block_is_a_tenth_of_the_limit_and_at_least_five() {
        assert_eq!(block_size(1), 1);
        assert_eq!(block_size(3), 3);
        assert_eq!(block_size(5), 5);
        assert_eq!(block_size(50), 5);
        assert_eq!(block_size(60), 6);
        assert_eq!(block_size(1_000), 100);
        assert_eq!(block_size(100_000), 1_000);
        // A large limit: a hundredth of it.
        assert_eq!(block_size(1_000_000), 10_000);
        assert_eq!(block_size(100_000_000), 1_000_000);
        assert_eq!(block_size(u64::from(u32::MAX)), 42_949_672);
    }

    #[test]
    fn a_burst_under_a_large_limit_passes_while_the_answer_is_slow() {
        // Requests at a few thousand a second while the control plane takes a second to answer
        // the first ask: a limit of 100,000,000 a minute refuses none of them.
        let (lease, admitted, asks) = calls(None, 5_000, 100_000_000);
        assert_eq!((admitted, lease.used), (5_000, 5_000));
        assert_eq!(asks.len(), 1, "one ask in flight");
        // A limit near the rate keeps its small block: the bound stays tight.
        let (_, admitted, _) = calls(None, 5_000, 60_000);
        assert_eq!(admitted, 1_000);
    }

    #[test]
    fn the_first_call_asks_and_one_block_passes_on_credit() {
        let (lease, admitted, asks) = calls(None, 8, 50);
        // One block of credit while the first ask is not answered; the ask is made once.
        assert_eq!(admitted, 5);
        assert_eq!(
            asks,
            [Ask {
                minute: M,
                calls: 5
            }]
        );
        assert_eq!(lease.used, 5);
        assert_eq!(lease.asking_since_ms, NOW);
        // The grant counts the calls on credit: one more block of credit beyond it.
        let lease = MinuteLease::answered(Some(lease), asks[0], Some(5));
        let (lease, admitted, asks) = calls(lease, 8, 50);
        assert_eq!((admitted, lease.used, lease.granted), (5, 10, 5));
        assert_eq!(asks.len(), 1, "the next block is asked for at once");
    }

    #[test]
    fn the_next_block_is_asked_for_while_half_a_block_is_left() {
        let (lease, _, asks) = calls(None, 1, 100);
        let lease = MinuteLease::answered(Some(lease), asks[0], Some(10));
        // used 1 of 10 granted: no ask until 5 are left.
        let (lease, admitted, asks) = calls(lease, 4, 100);
        assert_eq!((admitted, asks.len()), (4, 0));
        let (_, _, asks) = calls(Some(lease), 1, 100);
        assert_eq!(
            asks,
            [Ask {
                minute: M,
                calls: 10
            }]
        );
    }

    #[test]
    fn a_partial_grant_spends_the_minute() {
        let (lease, _, asks) = calls(None, 3, 50);
        // Only 2 calls of the minute were left cluster-wide.
        let lease = MinuteLease::answered(Some(lease), asks[0], Some(2));
        assert_eq!(lease.map(|l| l.mode), Some(Mode::Spent));
        let (lease, admitted, asks) = calls(lease, 10, 50);
        // 3 were admitted on credit already: nothing more, no more asks.
        assert_eq!((admitted, asks.len(), lease.used), (0, 0, 3));
        // With grants left, a spent minute admits exactly them.
        let spent = MinuteLease {
            minute: M,
            used: 1,
            granted: 4,
            asking_since_ms: 0,
            mode: Mode::Spent,
        };
        let (_, admitted, asks) = calls(Some(spent), 10, 50);
        assert_eq!((admitted, asks.len()), (3, 0));
    }

    #[test]
    fn no_answer_counts_alone_up_to_the_limit() {
        let (lease, _, asks) = calls(None, 5, 20);
        let lease = MinuteLease::answered(Some(lease), asks[0], None);
        assert_eq!(lease.map(|l| l.mode), Some(Mode::Local));
        let (lease, admitted, asks) = calls(lease, 30, 20);
        assert_eq!((admitted, lease.used, asks.len()), (15, 20, 0));
    }

    #[test]
    fn one_envoy_never_admits_more_than_the_limit() {
        let mut lease = None;
        let mut admitted = 0;
        for _ in 0..40 {
            let (next, verdict) = MinuteLease::admit(lease, M, 12, NOW);
            admitted += u32::from(verdict.admitted);
            // Every ask answered in full.
            lease = match verdict.ask {
                Some(ask) => MinuteLease::answered(Some(next), ask, Some(ask.calls)),
                None => Some(next),
            };
        }
        assert_eq!(admitted, 12);
    }

    #[test]
    fn a_lost_ask_is_made_again_after_the_timeout() {
        let (lease, _, asks) = calls(None, 1, 50);
        assert_eq!(asks.len(), 1);
        let (_, later) = MinuteLease::admit(Some(lease), M, 50, NOW + ASK_TIMEOUT_MS - 1);
        assert_eq!(later.ask, None);
        let (_, later) = MinuteLease::admit(Some(lease), M, 50, NOW + ASK_TIMEOUT_MS);
        assert_eq!(
            later.ask,
            Some(Ask {
                minute: M,
                calls: 5
            })
        );
    }

    #[test]
    fn a_new_minute_starts_over_and_old_answers_change_nothing() {
        let (lease, _, asks) = calls(None, 5, 50);
        let (next, verdict) = MinuteLease::admit(Some(lease), M + 1, 50, NOW + 60_000);
        assert!(verdict.admitted);
        assert_eq!((next.minute, next.used, next.granted), (M + 1, 1, 0));
        assert_eq!(MinuteLease::answered(Some(next), asks[0], Some(5)), None);
        assert_eq!(MinuteLease::answered(None, asks[0], Some(5)), None);
        // A worker whose clock lags keeps counting in the later minute.
        let (lagging, _) = MinuteLease::admit(Some(next), M, 50, NOW);
        assert_eq!((lagging.minute, lagging.used), (M + 1, 2));
    }

    #[test]
    fn two_envoys_on_one_budget_stay_within_the_bound() {
        // A control plane granting from one count, the way the store does.
        let limit = 50u64;
        let mut counted = 0u64;
        let mut grant = |ask: Ask| {
            let granted = (limit.saturating_sub(counted)).min(u64::from(ask.calls));
            counted += granted;
            u32::try_from(granted).unwrap_or(0)
        };
        let mut envoys = [None, None];
        let mut pending: Vec<(usize, Ask)> = Vec::new();
        let mut admitted = 0;
        for call in 0..200 {
            let e = call % 2;
            let (next, verdict) = MinuteLease::admit(envoys[e], M, limit, NOW);
            admitted += u32::from(verdict.admitted);
            envoys[e] = Some(next);
            pending.extend(verdict.ask.map(|a| (e, a)));
            // Answers arrive a few calls late.
            if call % 3 == 2 {
                for (e, ask) in pending.drain(..) {
                    let granted = grant(ask);
                    envoys[e] = MinuteLease::answered(envoys[e], ask, Some(granted));
                }
            }
        }
        let bound = limit as u32 + 2 * block_size(limit);
        assert!((limit as u32..=bound).contains(&admitted), "{admitted}");
        assert_eq!(counted, limit, "every call of the minute was granted");
    }

    #[test]
    fn records_round_trip_and_anything_else_is_refused() {
        let lease = MinuteLease {
            minute: M,
            used: 7,
            granted: 5,
            asking_since_ms: NOW,
            mode: Mode::Spent,
        };
        assert_eq!(MinuteLease::decode(&lease.encode()), Some(lease));
        let mut bad = lease.encode();
        bad[24] = 9;
        assert_eq!(MinuteLease::decode(&bad), None);
        assert_eq!(MinuteLease::decode(&[0; 12]), None);
        assert_eq!(MinuteLease::decode(&[]), None);
    }
}
