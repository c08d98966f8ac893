//! A call's bookkeeping in the VM, shared by its front stage and every attempt: what it tried,
//! how its last attempt failed, the lane that answered (and whether its answer broke off), the embeddings identity it keeps, and
//! the backoff before its next attempt.

use crate::vocab::LaneId;
use ai_router_contract::failure::ErrorClass;

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Call {
    pub tried: Vec<LaneId>,
    pub attempts: u32,
    pub last_failure: Option<(ErrorClass, Option<i64>)>,
    pub answered: Option<LaneId>,
    /// The answering attempt's usage as the provider reported it (a stream's even when the
    /// client did not ask for its usage chunk): what the response cache stores with it.
    pub answered_usage: Option<crate::vocab::Usage>,
    pub created_ms: i64,
    /// Embeddings: the model identity of the first lane, which every later attempt keeps.
    pub identity: Option<String>,
    /// Transient failures so far, for the backoff.
    pub transient_failures: u32,
    /// The next attempt waits until then.
    pub backoff_until_ms: i64,
    /// The answer had started (the client got its first token) when it failed, so: the class.
    pub broken_after_first_token: Option<ErrorClass>,
    /// After a context-length failure: the failed lane's capacity; only larger lanes remain.
    pub larger_than: Option<Option<u64>>,
    /// What was ruled out and tried, for the client.
    pub trail: crate::answer::trail::Trail,
    /// The time (µs) the providers held the call's attempts so far
    /// ([`crate::answer::overhead`]).
    pub upstream_us: i64,
    /// The plan the front stage wrote, which its attempts take without decoding it.
    pub plan: Option<crate::plan::Written>,
    /// The caller's body as the front stage read it: what each attempt's buffer holds, so an
    /// attempt takes it from here instead of copying it out of Envoy again.
    pub body: Option<std::rc::Rc<Vec<u8>>>,
    /// One pass: the lane the front stage picked and reserved for the first attempt, until the
    /// attempt (the route's upstream filter) takes it.
    pub first: Option<FirstLane>,
    /// One pass: the client's request headers the first attempt rewrote, as they were (`None`:
    /// absent), for a later attempt to put back.
    pub put_back: Vec<(String, Option<Vec<u8>>)>,
    /// One pass: the first attempt left from the public listener; every attempt of the call is
    /// then also bounded by the router's per-try timeout.
    pub one_pass: bool,
    /// One pass: the `x-request-id` this call claimed in its table (given back at its end).
    pub request_id: Option<String>,
}

/// The first attempt's lane, picked and reserved by the front stage (one pass).
#[derive(Debug, Clone, PartialEq)]
pub struct FirstLane {
    pub lane: LaneId,
    /// The scope's headroom the front stage reserved for it: `(provider, send)`.
    pub reserved: (String, crate::vm::local::Send),
}
