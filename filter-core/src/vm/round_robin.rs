//! The picker's memory in one VM: smooth weighted round-robin positions and the window a pick
//! of a provider with many keys looks through. Each worker keeps its own; it is never shared.

use std::collections::HashMap;

use crate::vocab::LaneId;

/// The picker's memory in this VM: smooth weighted round-robin positions.
#[derive(Debug, Default)]
pub struct RoundRobin {
    /// Per lane: the share of a key within its candidate.
    pub(crate) current: HashMap<LaneId, f64>,
    /// Per candidate (a lane with no key): the share of a candidate within its tier.
    pub(crate) candidates: HashMap<LaneId, f64>,
    /// Where the next pick of a provider and model with many keys starts looking
    /// ([`KEY_WINDOW`]).
    pub(crate) windows: HashMap<String, usize>,
}

/// With the default `tiers` strategy, a candidate with more than twice this many keys is looked
/// at through a window of this many usable keys per pick, each pick's window starting where the
/// last one of that provider and model ended: the work of a pick follows the window, not the
/// key count (a pool of 1,000 keys of one model would otherwise check every one of them per
/// attempt), and over successive picks every key takes its turn. Keys ruled out do not count
/// against the window, so a pick still finds a usable key when most are out, and a session's
/// pinned key is always looked at first. Four is what a small pool's candidate has, so a pick
/// among 1,000 keys costs what a pick among 4 costs; successive windows do not overlap, so the
/// load still spreads over every key (`docs/benchmarks.md`: 16 held a 1,000-key pool to 69% of
/// a small pool's throughput, 4 to 83-94%).
pub const KEY_WINDOW: usize = 4;

impl RoundRobin {
    /// The first key index the next pick of `provider`/`model` (`keys` keys) looks at; moves the
    /// window on.
    pub(crate) fn window_start(&mut self, provider: &str, model: &str, keys: usize) -> usize {
        let slot = self
            .windows
            .entry(format!("{provider}\u{0}{model}"))
            .or_insert(0);
        let start = *slot % keys.max(1);
        *slot = (start + KEY_WINDOW) % keys.max(1);
        start
    }

    /// Picks among `options` (lane, weight) and advances the positions.
    pub fn choose(&mut self, options: &[(&LaneId, f64)]) -> Option<usize> {
        smooth_weighted(&mut self.current, options)
    }
}

/// Smooth weighted round-robin over `options` (id, weight) with the positions in `current`:
/// over any run of picks each option's share follows its weight, and equal weights alternate.
pub(crate) fn smooth_weighted(
    current: &mut HashMap<LaneId, f64>,
    options: &[(&LaneId, f64)],
) -> Option<usize> {
    let total: f64 = options.iter().map(|(_, w)| *w).sum();
    let mut best: Option<(usize, f64)> = None;
    for (i, (lane, weight)) in options.iter().enumerate() {
        // A position is created once; later picks only look it up.
        let cw = match current.get_mut(*lane) {
            Some(cw) => cw,
            None => current.entry((*lane).clone()).or_insert(0.0),
        };
        *cw += *weight;
        if best.is_none_or(|(_, b)| *cw > b) {
            best = Some((i, *cw));
        }
    }
    let (i, _) = best?;
    if let Some(cw) = current.get_mut(options[i].0) {
        *cw -= total;
    }
    Some(i)
}
