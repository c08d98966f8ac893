//! A failure's effect on this process's view at once: the lane cooled or the key held.

use crate::classify::failure::Failure;
use crate::host::Host;
use crate::state::State;
use ai_router_contract::failure::Hold;

use super::Attempt;

impl Attempt {
    /// Effects of a failure on this process's view at once (the control plane's push follows),
    /// by the one hold rule ([`Failure::hold`]). Returns when the held lane or key returns
    /// (`None`: nothing held, or until its secret changes), the window the answer states.
    pub(super) fn hold(&self, host: &mut impl Host, failure: &Failure, now: i64) -> Option<i64> {
        let lane = self.lane.as_ref()?;
        let windows = State::hold_windows(host.state().as_deref());
        match windows.held_until(
            failure.class,
            failure.retry_at_ms,
            failure.provider_code.as_deref(),
            now,
        ) {
            Some((Hold::Lane, until)) => {
                host.hold_cooldown(&lane.id, until);
                Some(until)
            }
            Some((Hold::Key, until)) => {
                host.hold_blacklist(
                    &lane.id.provider,
                    &lane.id.key,
                    failure.class,
                    until,
                    lane.fingerprint,
                );
                (until > 0).then_some(until)
            }
            Some((Hold::Nothing, _)) | None => None,
        }
    }
}
