//! Probe leases: one attempt at a time through a half-open breaker, across control planes.

use ai_router_proto::v1 as pb;

use super::state::*;
use crate::store::breaker::{BreakerId, BreakerPhase, BreakerScope};
use crate::store::durable::{LeaseGrant, StoreError};
use crate::store::lock;

impl Engine {
    /// The half-open probe lease on breaker `id` for `holder`, for `ttl_ms` (clamped to
    /// 100 ms..10 min). Refused with `retry_at_ms` = the end of the cooldown while the breaker is
    /// still open, or = the end of the current lease while another attempt holds it. Atomic
    /// across every process sharing the state store. Blocking (the store).
    pub fn lease(
        &self,
        id: &BreakerId,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<pb::LeaseReply, StoreError> {
        let now = self.clock.now_ms();
        let id = match id.0 {
            BreakerScope::Provider => (id.0, id.1.clone(), String::new()),
            BreakerScope::Key => id.clone(),
        };
        let mut state = lock(&self.state);
        let (open_until, turned) = match state.durable.breakers.get_mut(&id) {
            Some(b) if b.phase == BreakerPhase::Open && b.open_until_ms > now => {
                (Some(b.open_until_ms), None)
            }
            // Past its cooldown: half-open now, before the probe this lease lets through can
            // answer (the expiry tick may not have run yet), so its event comes first.
            Some(b) => (None, b.tick(now)),
            None => (None, None),
        };
        if let Some((from, to)) = turned {
            // Emitted under the state lock, as every breaker event is: a report's transition
            // of the same breaker cannot overtake it.
            self.emit(&[breaker_event(&id, from, to)]);
            self.publish(&mut state, now);
        }
        drop(state);
        if let Some(until) = open_until {
            return Ok(pb::LeaseReply {
                granted: false,
                retry_at_ms: until,
            });
        }
        let ttl = ms(ttl_ms.clamp(100, 600_000));
        Ok(match self.store.lease(&id, holder, now, ttl)? {
            LeaseGrant::Granted => {
                tracing::debug!(scope = id.0.as_str(), provider = %id.1, key = %id.2, holder = %holder, "probe lease granted");
                pb::LeaseReply {
                    granted: true,
                    retry_at_ms: 0,
                }
            }
            LeaseGrant::HeldUntil(until) => pb::LeaseReply {
                granted: false,
                retry_at_ms: until,
            },
        })
    }
}
