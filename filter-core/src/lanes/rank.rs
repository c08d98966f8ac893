//! How the picker orders the usable lanes of a call: the spec's tiers ("Selection" in
//! `spec/ai-router.md`, `docs/selection.md`), as one value compared field by field.

use crate::vocab::LaneId;

/// A usable lane's rank; lower is better, and only the lanes of the best rank are chosen from.
///
/// The derived order compares the fields in the order they are declared, which is the spec's
/// order of the tiers:
/// 1. a lane this call has not tried yet (`lane_tried`), then one that is not parked by
///    snap-back (`parked`: its `resetIntervalMs` probe is not due);
/// 2. the policy's model order, the plan's tier (`tier`: preferred, then each fallback);
/// 3. a key this call has not tried yet (`key_tried`), then a provider it has not tried yet
///    (`provider_tried`);
/// 4. enough headroom (`low_headroom`: at `lowHeadroom` remaining requests or below comes last).
///
/// Within the best rank the strategy decides (fewest in flight, latency, round-robin by weight
/// under `tiers`): [`crate::lanes::pick::pick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rank {
    pub lane_tried: bool,
    pub parked: bool,
    pub tier: usize,
    pub key_tried: bool,
    pub provider_tried: bool,
    pub low_headroom: bool,
}

impl Rank {
    /// The rank of `lane`, in the plan's tier `tier`, for a call that tried `tried`.
    pub fn of(
        lane: &LaneId,
        tier: usize,
        tried: &[LaneId],
        parked: bool,
        low_headroom: bool,
    ) -> Rank {
        Rank {
            lane_tried: tried.contains(lane),
            parked,
            tier,
            key_tried: tried
                .iter()
                .any(|t| t.provider == lane.provider && t.key == lane.key),
            provider_tried: tried.iter().any(|t| t.provider == lane.provider),
            low_headroom,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(provider: &str, key: &str, model: &str) -> LaneId {
        LaneId::new(provider, key, model)
    }

    #[test]
    fn the_tiers_apply_in_the_spec_order() {
        let tried = [lane("p1", "a", "m1")];
        let rank = |l: &LaneId, tier, parked, low| Rank::of(l, tier, &tried, parked, low);
        // 1. An untried lane beats a tried one, whatever its tier, key or headroom.
        let untried_fallback = rank(&lane("p1", "a", "m2"), 1, false, true);
        let tried_preferred = rank(&lane("p1", "a", "m1"), 0, false, false);
        assert!(untried_fallback < tried_preferred);
        // ... and an unparked lane beats a parked one.
        assert!(
            rank(&lane("p1", "a", "m2"), 1, false, true)
                < rank(&lane("p2", "b", "m1"), 0, true, false)
        );
        // 2. The plan's tier beats the key and provider tried and the headroom.
        assert!(
            rank(&lane("p1", "a", "m2"), 0, false, true)
                < rank(&lane("p2", "b", "m1"), 1, false, false)
        );
        // 3. An untried key beats a tried one; then an untried provider.
        let tried_key = rank(&lane("p1", "a", "m2"), 0, false, false);
        let tried_provider = rank(&lane("p1", "b", "m2"), 0, false, true);
        let fresh = rank(&lane("p2", "c", "m2"), 0, false, true);
        assert!(tried_key.key_tried && tried_key.provider_tried);
        assert!(!tried_provider.key_tried && tried_provider.provider_tried);
        assert!(fresh < tried_provider && tried_provider < tried_key);
        // 4. Headroom decides last.
        assert!(
            rank(&lane("p2", "c", "m2"), 0, false, false)
                < rank(&lane("p2", "c", "m2"), 0, false, true)
        );
    }
}
