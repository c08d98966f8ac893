//! The in-memory state store: the default, gone on restart.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::store::breaker::BreakerId;
use crate::store::durable::{DurableChanges, DurableState, LeaseGrant, StateStore, StoreError};
use crate::store::lock;

/// Keeps the state in memory: gone on restart.
#[derive(Debug, Default)]
pub struct MemoryStateStore {
    state: Mutex<DurableState>,
    leases: Mutex<BTreeMap<BreakerId, (String, i64)>>,
}

impl StateStore for MemoryStateStore {
    fn load(&self) -> Result<DurableState, StoreError> {
        Ok(lock(&self.state).clone())
    }

    fn apply(&self, changes: &DurableChanges) -> Result<(), StoreError> {
        changes.apply(&mut lock(&self.state));
        Ok(())
    }

    fn lease(
        &self,
        id: &BreakerId,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<LeaseGrant, StoreError> {
        let mut leases = lock(&self.leases);
        leases.retain(|_, (_, until)| *until > now_ms);
        if let Some((_, until)) = leases.get(id) {
            return Ok(LeaseGrant::HeldUntil(*until));
        }
        leases.insert(
            id.clone(),
            (holder.to_owned(), now_ms.saturating_add(ttl_ms)),
        );
        Ok(LeaseGrant::Granted)
    }

    fn release(&self, id: &BreakerId, holder: Option<&str>) -> Result<(), StoreError> {
        let mut leases = lock(&self.leases);
        let matches = leases
            .get(id)
            .is_some_and(|(held_by, _)| holder.is_none_or(|h| held_by == h));
        if matches {
            leases.remove(id);
        }
        Ok(())
    }
}
