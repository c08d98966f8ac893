//! The front stage: once per client request on the public listener. It routes by path,
//! authenticates the virtual key, checks and resolves the body into the call plan it hands to
//! the attempt stage, and on the way back turns the attempt stage's signals into the client's
//! answer. A state machine over [`Host`](crate::host::Host): the filter forwards Envoy's callbacks to it.

mod answer;
mod auth;
mod body;
pub mod body_check;
pub mod budget;
pub mod quota;
mod request;
mod response;
pub mod routes;
mod wait;

use std::rc::Rc;

use ai_router_proto::v1::VirtualKey;
use serde_json::Value;

use crate::plan::{Operation, Protocol};
use crate::resolve;
use crate::resolve::rules::Metadata;
use crate::state::State;

// What the stage's tests (`use super::*`) name.
#[cfg(test)]
use {
    crate::answer::errors::GatewayError,
    crate::host::{Flow, Host, Side},
    crate::plan::{Plan, PLAN_HEADER},
    crate::wire::headers,
    ai_router_contract::error_code::ErrorCode,
    ai_router_contract::failure::ErrorClass,
    ai_router_contract::headers::{
        ATTEMPT as H_ATTEMPT, ATTEMPTS as H_ATTEMPTS, BUDGET_WARNING as H_BUDGET_WARNING,
        CACHE as H_CACHE, COST as H_COST, COST_ESTIMATE as H_COST_ESTIMATE,
        FINAL_STATUS as H_FINAL_STATUS, LANE_COST as H_LANE_COST, LANE_MODEL as H_LANE_MODEL,
        LANE_PROVIDER as H_LANE_PROVIDER, LANE_TRAIL as H_LANE_TRAIL, MODEL as H_MODEL,
        RETRY as H_RETRY, RETRY_AFTER as H_RETRY_AFTER, ROUTE as H_ROUTE, TRAIL as H_TRAIL,
    },
    ai_router_contract::sha256_hex,
    ai_router_proto::v1::{RequestOutcome, RequestResult},
    serde_json::json,
};

#[derive(Default)]
pub struct Front {
    /// `gateway.onePass` as the bootstrap was rendered: the front names the public route's
    /// cluster, and a call whose first lane is ready goes in one pass.
    one_pass: Option<Rc<ai_router_contract::plugin::OnePass>>,
    /// Chat and Messages: the top of the caller's body, for the plan.
    body_top: Option<crate::plan::BodyTop>,
    /// The caller's body as read, for the call's bookkeeping ([`crate::vm::call::Call::body`]).
    caller_body: Option<std::rc::Rc<Vec<u8>>>,
    op: Option<Operation>,
    /// The caller's API: the shape of its body, answers and errors.
    protocol: Protocol,
    /// Messages: the `anthropic-version` and `anthropic-beta` the caller sent.
    anthropic_version: Option<String>,
    anthropic_beta: Option<String>,
    /// `POST /v1/messages/count_tokens`: Anthropic's count from an anthropic lane, else the
    /// gateway's own estimate.
    count_tokens: bool,
    /// Gemini: the call its path names (model, stream or count); its body is translated to chat
    /// completions here, once.
    gemini: Option<GeminiCall>,
    /// Gemini: the virtual key sent as `?key=` (taken out of the path at once).
    query_key: Option<String>,
    /// The final answer is an error to re-dress in the caller's shape (buffered whole).
    redress: bool,
    cid: Option<String>,
    rid: String,
    /// The client's own `Idempotency-Key`, when it sent one.
    idempotency_key: Option<String>,
    vk_id: String,
    started_ms: i64,
    /// The overhead's clock at the start (µs).
    started_us: i64,
    /// The client asked for this call's overhead (`x-ai-router-overhead: 1`).
    wants_overhead: bool,
    /// What the gateway added to the call, once its answer started (µs).
    overhead_us: Option<u64>,
    /// The body's `model` (for the call's trace).
    requested_model: String,
    /// The client's `traceparent`, when well formed.
    traceparent: String,
    /// The client's `tracestate`, when well formed and with a well-formed `traceparent`.
    tracestate: String,
    /// Set when this stage answered itself.
    answered: Option<(u16, &'static str)>,
    /// Replace whatever body comes back with this (a router-level failure).
    replace_body: Option<Vec<u8>>,
    status: u16,
    key: Option<VirtualKey>,
    /// The state the request was authenticated against; its body is routed by the same one.
    state: Option<Rc<State>>,
    /// The client's `x-ai-router-session`, read before internal headers are removed.
    session_header: Option<String>,
    /// The budgets' warnings for this call (`x-ai-router-budget-warning`).
    budget_warnings: Vec<String>,
    /// The client's metadata headers, for the `routes:` rules.
    metadata: Metadata,
    /// The `routes:` rule that chose the call's profile.
    route: Option<String>,
    /// The client asked for the routing trail on a success (`x-ai-router-trail: 1`).
    wants_trail: bool,
    /// The final error's body gets the call's routing trail (`error.trail`).
    add_trail: bool,
    /// The response cache's part in the call.
    cache: crate::cache::call::CallCache,
    /// The client asked for a stream.
    stream: bool,
    /// The gateway has no state yet (a fresh Envoy): the call waits for it.
    state_wait: Option<StateWait>,
    /// A local cache miss waiting for the shared tier's answer.
    shared_wait: Option<Box<SharedWait>>,
    /// `/admin/...`: the admin API, which Envoy routes to the control plane (its own token);
    /// no stage of a model call touches it.
    admin: bool,
    /// Responses: the stored state the call names and whether its answer is stored.
    responses: Option<crate::plan::Stored>,
}

impl Front {
    /// The stage on a public listener rendered with `gateway.onePass`.
    pub fn with_one_pass(one_pass: Option<Rc<ai_router_contract::plugin::OnePass>>) -> Self {
        Self {
            one_pass,
            ..Self::default()
        }
    }
}

/// A Gemini API call, from its path.
#[derive(Debug, Clone)]
struct GeminiCall {
    model: String,
    stream: bool,
    /// `:countTokens`: a gemini lane's count, else the gateway's estimate.
    count: bool,
    /// `:embedContent` (`Some(false)`) or `:batchEmbedContents` (`Some(true)`).
    embed: Option<bool>,
    /// `:streamGenerateContent` without `alt=sse`: one JSON array.
    json_array: bool,
}

/// What a call paused for the shared cache tier goes on with.
#[derive(Debug)]
struct SharedWait {
    /// The gRPC call's.
    token: u32,
    state: Rc<State>,
    key: VirtualKey,
    resolved: resolve::Resolved,
    parsed: Value,
    op: Operation,
}

/// How long a call waits for the first state of a gateway that has none yet (an Envoy that
/// just started and whose singleton is still fetching it): it is answered once the state is in,
/// and only past this with `pool_unavailable`.
pub const STATE_WAIT_MS: i64 = 3_000;
/// How often a waiting call looks again.
const STATE_POLL_MS: i64 = 25;

/// What a call waiting for the state does once it is in.
#[derive(Debug, Clone)]
enum AfterState {
    Models(String),
    Call { end_of_stream: bool },
}

#[derive(Debug)]
struct StateWait {
    /// The timer's call.
    token: u32,
    since_ms: i64,
    then: AfterState,
    /// The whole body, when it arrived during the wait.
    body: Option<Vec<u8>>,
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod cache_tests;

#[cfg(test)]
#[path = "budget_tests.rs"]
mod budget_step_tests;

#[cfg(test)]
#[path = "gemini_tests.rs"]
mod gemini_tests;

#[cfg(test)]
mod fixture;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod auth_tests;

#[cfg(test)]
mod wait_tests;

#[cfg(test)]
mod response_tests;
