//! How the picker shares calls among the usable lanes of the best rank under the `headroom`
//! and `score` strategies (`selection.strategy`; `tiers` is the picker's own round-robin).
//!
//! - `headroom`: weighted random, a lane's weight its remaining requests as its provider last
//!   reported them (`x-ratelimit-remaining-requests`, pushed as the lane's headroom), or
//!   `unreportedWeight` when nothing is reported or the reported window has reset. Consumption
//!   then spreads in proportion to what is left, and no provider is drained first.
//! - `score`: W = H·S·(α·Rrpm/Lrpm + β·Rtpm/Ltpm + γ·Rrpd/Lrpd)·1/(1+C), the highest first (ties
//!   at random), lanes with W = 0 excluded; a failed attempt's lane falls to a worse rank, so
//!   the next attempt takes the next best. What the filter knows of each factor:
//!   - H, health: 1 for a lane the picker found usable; every out reason (blacklist, cooldown,
//!     spent headroom, open breaker, budget) already removed the lane, i.e. H = 0.
//!   - S, success: 1, or 0.5 while a breaker of the lane's key or provider is half-open (the
//!     last attempts failed; one probe is allowed).
//!   - R/L per window: the reported remaining over the largest remaining any candidate lane
//!     reports for that window (the pushed headroom carries no limits: the best-stocked lane
//!     sets the scale); a lane that reports nothing for a window counts as full (1). The
//!     pushed headroom has request and token windows only, so Rrpd/Lrpd is 1 until daily
//!     figures are reported.
//!   - C: the calls in flight on the lane's key in this VM.

use ai_router_proto::v1::{Selection, SelectionStrategy};

/// What the strategies read of one usable lane.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaneFacts<R> {
    /// The picker's rank (lower is better): only the best rank is chosen from.
    pub rank: R,
    /// Reported remaining requests in a window that has not reset; `None`: not known.
    pub remaining_requests: Option<i64>,
    pub remaining_tokens: Option<i64>,
    pub in_flight: u32,
    /// A breaker of the lane's key or provider is half-open.
    pub half_open: bool,
}

/// The strategy a snapshot asks for; unspecified is `tiers`.
pub fn strategy(selection: &Selection) -> SelectionStrategy {
    match selection.strategy() {
        SelectionStrategy::Unspecified => SelectionStrategy::Tiers,
        s => s,
    }
}

/// The `headroom` weight of a lane.
pub fn headroom_weight<R>(selection: &Selection, lane: &LaneFacts<R>) -> f64 {
    match lane.remaining_requests {
        Some(r) => r.max(0) as f64,
        // As pushed: the state settled an unsent weight (state::settle_unsent).
        None => selection.unreported_weight,
    }
}

/// The largest remaining any lane reports for a window (the scale of that window's ratio).
#[derive(Debug, Clone, Copy, Default)]
pub struct Scale {
    pub requests: i64,
    pub tokens: i64,
}

impl Scale {
    pub fn of<R>(lanes: &[LaneFacts<R>]) -> Scale {
        let max =
            |f: fn(&LaneFacts<R>) -> Option<i64>| lanes.iter().filter_map(f).max().unwrap_or(0);
        Scale {
            requests: max(|l| l.remaining_requests),
            tokens: max(|l| l.remaining_tokens),
        }
    }
}

fn ratio(remaining: Option<i64>, scale: i64) -> f64 {
    match remaining {
        None => 1.0,
        Some(_) if scale <= 0 => 0.0,
        Some(r) => (r.max(0) as f64 / scale as f64).min(1.0),
    }
}

/// The score weights with their defaults when the snapshot carries none.
fn coefficients(selection: &Selection) -> (f64, f64, f64) {
    let (a, b, g) = (
        selection.score_alpha,
        selection.score_beta,
        selection.score_gamma,
    );
    if a + b + g > 0.0 {
        (a, b, g)
    } else {
        use ai_router_contract::defaults::{SCORE_ALPHA, SCORE_BETA, SCORE_GAMMA};
        (SCORE_ALPHA, SCORE_BETA, SCORE_GAMMA)
    }
}

/// W of one lane (see the module's documentation).
pub fn score_weight<R>(selection: &Selection, lane: &LaneFacts<R>, scale: Scale) -> f64 {
    let (alpha, beta, gamma) = coefficients(selection);
    let health = 1.0;
    let success = if lane.half_open { 0.5 } else { 1.0 };
    let rpm = ratio(lane.remaining_requests, scale.requests);
    let tpm = ratio(lane.remaining_tokens, scale.tokens);
    let rpd = 1.0;
    health * success * (alpha * rpm + beta * tpm + gamma * rpd) / (1.0 + lane.in_flight as f64)
}

/// The index of the lane a `headroom` or `score` pick takes, `random` in [0, 1) the draw;
/// `None` when no lane has a weight above 0.
pub fn choose<R: Ord + Copy>(
    selection: &Selection,
    lanes: &[LaneFacts<R>],
    random: f64,
) -> Option<usize> {
    let scale = Scale::of(lanes);
    let weights: Vec<f64> = lanes
        .iter()
        .map(|l| match strategy(selection) {
            SelectionStrategy::Score => score_weight(selection, l, scale),
            _ => headroom_weight(selection, l),
        })
        .collect();
    let best_rank = lanes
        .iter()
        .zip(&weights)
        .filter(|(_, w)| **w > 0.0)
        .map(|(l, _)| l.rank)
        .min()?;
    let contenders: Vec<(usize, f64)> = lanes
        .iter()
        .zip(&weights)
        .enumerate()
        .filter(|(_, (l, w))| l.rank == best_rank && **w > 0.0)
        .map(|(i, (_, w))| (i, *w))
        .collect();
    let random = random.clamp(0.0, 1.0 - f64::EPSILON);
    if strategy(selection) == SelectionStrategy::Score {
        let top = contenders.iter().map(|(_, w)| *w).fold(0.0, f64::max);
        let tied: Vec<usize> = contenders
            .iter()
            .filter(|(_, w)| (top - *w).abs() <= top * 1e-9)
            .map(|(i, _)| *i)
            .collect();
        return tied.get((random * tied.len() as f64) as usize).copied();
    }
    let total: f64 = contenders.iter().map(|(_, w)| *w).sum();
    let mut point = random * total;
    for (i, w) in &contenders {
        if point < *w {
            return Some(*i);
        }
        point -= w;
    }
    contenders.last().map(|(i, _)| *i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reproducible draw: xorshift64, mapped to [0, 1).
    pub struct Seeded(u64);

    impl Seeded {
        pub fn new(seed: u64) -> Self {
            Self(seed | 1)
        }
        pub fn next(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn lane(rank: u8, requests: Option<i64>, tokens: Option<i64>) -> LaneFacts<u8> {
        LaneFacts {
            rank,
            remaining_requests: requests,
            remaining_tokens: tokens,
            in_flight: 0,
            half_open: false,
        }
    }

    fn selection(strategy: SelectionStrategy) -> Selection {
        Selection {
            strategy: strategy.into(),
            unreported_weight: 10.0,
            score_alpha: 0.3,
            score_beta: 0.4,
            score_gamma: 0.3,
            ..Selection::default()
        }
    }

    #[test]
    fn headroom_spreads_a_thousand_picks_in_proportion_to_what_is_left() {
        let s = selection(SelectionStrategy::Headroom);
        // 60, 30 and 10 requests left: 600, 300 and 100 of 1,000 picks, each within 5 points
        // of the total (the binomial's 3 sigma at n = 1,000 is under 4.7 points).
        let lanes = [
            lane(0, Some(60), None),
            lane(0, Some(30), None),
            lane(0, Some(10), None),
        ];
        let mut rng = Seeded::new(7);
        let mut counts = [0u32; 3];
        for _ in 0..1000 {
            if let Some(i) = choose(&s, &lanes, rng.next()) {
                counts[i] += 1;
            }
        }
        assert_eq!(counts.iter().sum::<u32>(), 1000);
        for (count, want) in counts.iter().zip([600.0, 300.0, 100.0]) {
            assert!((*count as f64 - want).abs() <= 50.0, "{counts:?}");
        }
        // The same seed gives the same spread.
        let mut again = Seeded::new(7);
        let mut counts2 = [0u32; 3];
        for _ in 0..1000 {
            if let Some(i) = choose(&s, &lanes, again.next()) {
                counts2[i] += 1;
            }
        }
        assert_eq!(counts, counts2);
    }

    #[test]
    fn unreported_lanes_weigh_the_stated_default_and_worse_ranks_wait() {
        let s = selection(SelectionStrategy::Headroom);
        let lanes = [
            lane(0, Some(30), None),
            lane(0, None, None),
            lane(1, Some(1000), None),
        ];
        assert_eq!(headroom_weight(&s, &lanes[1]), 10.0);
        // Draws across [0, 1): the first 30/40 go to lane 0, the rest to lane 1, none to the
        // better-stocked lane of a worse rank.
        assert_eq!(choose(&s, &lanes, 0.0), Some(0));
        assert_eq!(choose(&s, &lanes, 0.74), Some(0));
        assert_eq!(choose(&s, &lanes, 0.76), Some(1));
        assert_eq!(choose(&s, &lanes, 0.999), Some(1));
        // With the best rank spent, the next rank serves.
        let spent = [lane(0, Some(0), None), lane(1, Some(5), None)];
        assert_eq!(choose(&s, &spent, 0.5), Some(1));
    }

    #[test]
    fn score_follows_its_formula() {
        let s = selection(SelectionStrategy::Score);
        let lanes = [
            lane(0, Some(100), Some(10_000)),
            lane(0, Some(50), Some(10_000)),
            lane(0, Some(100), Some(2_000)),
            LaneFacts {
                in_flight: 1,
                ..lane(0, Some(100), Some(10_000))
            },
            LaneFacts {
                half_open: true,
                ..lane(0, None, None)
            },
        ];
        let scale = Scale::of(&lanes);
        let w: Vec<f64> = lanes.iter().map(|l| score_weight(&s, l, scale)).collect();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // W = H·S·(0.3·R/L + 0.4·T/L + 0.3·1)/(1+C)
        assert!(close(w[0], 0.3 + 0.4 + 0.3));
        assert!(close(w[1], 0.3 * 0.5 + 0.4 + 0.3));
        assert!(close(w[2], 0.3 + 0.4 * 0.2 + 0.3));
        assert!(close(w[3], 1.0 / 2.0));
        assert!(close(w[4], 0.5 * 1.0));
        // The best first; its failure (a worse rank) cascades to the next best.
        assert_eq!(choose(&s, &lanes, 0.3), Some(0));
        let mut after = lanes;
        after[0].rank = 1;
        // 0.85 (half the requests) beats 0.68 (a fifth of the tokens) and 0.5 (one in flight).
        assert_eq!(choose(&s, &after, 0.3), Some(1));
        after[1].rank = 1;
        assert_eq!(choose(&s, &after, 0.3), Some(2));
        // Other coefficients move the order: all on tokens, lane 1 ties lane 0.
        let tokens_only = Selection {
            score_alpha: 0.0,
            score_beta: 1.0,
            score_gamma: 0.0,
            ..s
        };
        assert!(close(score_weight(&tokens_only, &lanes[1], scale), 1.0));
        assert!(close(score_weight(&tokens_only, &lanes[2], scale), 0.2));
    }

    #[test]
    fn score_excludes_lanes_weighing_zero() {
        let s = Selection {
            score_alpha: 1.0,
            score_beta: 0.0,
            score_gamma: 0.0,
            ..selection(SelectionStrategy::Score)
        };
        let lanes = [lane(0, Some(0), None), lane(1, Some(3), None)];
        assert_eq!(score_weight(&s, &lanes[0], Scale::of(&lanes)), 0.0);
        // W = 0 in the best rank: the lane of the next rank, not the empty one.
        assert_eq!(choose(&s, &lanes, 0.0), Some(1));
        assert_eq!(choose(&s, &[lane(0, Some(0), None)], 0.0), None);
    }
}
