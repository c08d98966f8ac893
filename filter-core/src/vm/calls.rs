//! This VM's calls in progress: opened by the front stage, read and changed by each attempt
//! (the front and attempt stages of one call run on the same worker), closed by the front
//! stage's end. A call whose front context never said goodbye is swept [`ABANDONED_MS`] after
//! its deadline once the table holds more than [`SWEEP_ABOVE`] calls.

use std::collections::HashMap;

use crate::vm::call::Call;

/// A call older than this past its deadline (a call without a plan: past its start) is dropped
/// by the sweep.
pub const ABANDONED_MS: i64 = 600_000;
/// The table is swept when it holds more calls than this.
pub const SWEEP_ABOVE: usize = 1024;

#[derive(Debug, Default)]
pub struct CallTable {
    calls: HashMap<String, Call>,
    /// What this table's call ids start with: distinguishes this VM's from other workers'
    /// (never empty once set).
    prefix: String,
    next: u64,
    /// One pass: the calls by their `x-request-id`, each claimed by one call at a time (a
    /// later attempt finds its call by it: the first attempt took the plan header away).
    by_request_id: HashMap<String, String>,
}

impl CallTable {
    /// Opens a call: its id, unique within the Envoy process, and how much the table's size
    /// moved (1, less the calls the sweep dropped). `salt` is asked once per VM.
    pub fn open(&mut self, now_ms: i64, salt: impl FnOnce() -> u64) -> (String, i64) {
        self.open_as(now_ms, || format!("{:x}", salt() | 1))
    }

    /// [`CallTable::open`] with the ids' `prefix` given (asked once per table): `call-1`,
    /// `call-2`, … for the tests' fake host.
    pub fn open_as(&mut self, now_ms: i64, prefix: impl FnOnce() -> String) -> (String, i64) {
        if self.prefix.is_empty() {
            self.prefix = prefix();
        }
        self.next += 1;
        let id = format!("{}-{}", self.prefix, self.next);
        self.calls.insert(
            id.clone(),
            Call {
                created_ms: now_ms,
                ..Call::default()
            },
        );
        let before = self.calls.len();
        if before > SWEEP_ABOVE {
            self.calls.retain(|_, c| {
                // A call's attempts run until its deadline, however long the policy made it.
                let deadline = c.plan.as_ref().map_or(0, |w| w.plan.deadline_ms);
                let kept = ABANDONED_MS.saturating_add(i64::try_from(deadline).unwrap_or(i64::MAX));
                now_ms - c.created_ms < kept
            });
        }
        let swept = before - self.calls.len();
        if swept > 0 {
            let calls = &self.calls;
            self.by_request_id.retain(|_, cid| calls.contains_key(cid));
        }
        (id, 1 - i64::try_from(swept).unwrap_or(i64::MAX))
    }

    pub fn get(&self, id: &str) -> Option<&Call> {
        self.calls.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Call> {
        self.calls.get_mut(id)
    }

    /// Puts a call's bookkeeping under `id`, as a test sets a call up.
    pub fn insert(&mut self, id: String, call: Call) {
        self.calls.insert(id, call);
    }

    pub fn values(&self) -> impl Iterator<Item = &Call> {
        self.calls.values()
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Call> {
        self.calls.values_mut()
    }

    /// Drops every call, as a restarted VM has none.
    pub fn clear(&mut self) {
        self.calls.clear();
    }

    /// Closes a call and returns its bookkeeping.
    pub fn end(&mut self, id: &str) -> Option<Call> {
        let call = self.calls.remove(id)?;
        if let Some(rid) = call.request_id.as_deref() {
            self.by_request_id.remove(rid);
        }
        Some(call)
    }

    /// Claims `request_id` for the open call `id`: false when the id is empty or another call
    /// of this table holds it (a client may send the same `x-request-id` twice).
    pub fn claim_request_id(&mut self, request_id: &str, id: &str) -> bool {
        if request_id.is_empty() || !self.calls.contains_key(id) {
            return false;
        }
        match self.by_request_id.get(request_id) {
            Some(holder) => holder == id,
            None => {
                self.by_request_id
                    .insert(request_id.to_owned(), id.to_owned());
                if let Some(call) = self.calls.get_mut(id) {
                    call.request_id = Some(request_id.to_owned());
                }
                true
            }
        }
    }

    /// The call that claimed `request_id`.
    pub fn by_request_id(&self, request_id: &str) -> Option<&str> {
        self.by_request_id.get(request_id).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_is_held_by_one_call_until_it_ends() {
        let mut t = CallTable::default();
        let (a, _) = t.open_as(0, || "t".into());
        let (b, _) = t.open_as(0, || "t".into());
        assert!(t.claim_request_id("rid", &a));
        assert!(t.claim_request_id("rid", &a), "its own claim holds");
        assert!(!t.claim_request_id("rid", &b), "another call's is refused");
        assert!(!t.claim_request_id("", &b) && !t.claim_request_id("x", "gone"));
        assert_eq!(t.by_request_id("rid"), Some(a.as_str()));
        assert!(t.end(&a).is_some());
        assert_eq!(t.by_request_id("rid"), None, "given back at the end");
        assert!(t.claim_request_id("rid", &b));
        assert!(t
            .end(&b)
            .is_some_and(|c| c.request_id.as_deref() == Some("rid")));
    }

    #[test]
    fn ids_are_salted_and_abandoned_calls_are_swept_past_the_bound() {
        let mut t = CallTable::default();
        let (first, moved) = t.open(0, || 0xa0);
        assert_eq!((first.as_str(), moved), ("a1-1", 1));
        for i in 1..SWEEP_ABOVE {
            t.open(i as i64, || unreachable!("salted once"));
        }
        assert_eq!(t.len(), SWEEP_ABOVE);
        // Past the bound, every call older than ten minutes goes.
        let (_, moved) = t.open(ABANDONED_MS + 10, || 0);
        assert_eq!(moved, 1 - 11);
        assert_eq!(t.len(), SWEEP_ABOVE + 1 - 11);
        assert!(t.end(&first).is_none(), "the first call was swept");
    }
}
