//! Every decision the ai-router filter makes, as plain Rust on plain data. This crate has no
//! proxy-wasm dependency: it builds for wasm32 (inside the filter) and for the host, where its
//! tests run in seconds. The filter crate (`filter/`) is the thin glue that calls into it.
//!
//! One folder per concept; no import cycle between folders or between files (test-only items
//! aside: `control-plane/tests/module_graph.rs`). From the leaves up:
//! - `vocab`, `plan`: the shared vocabulary (`LaneId`, `LocalHold`, `Usage`, …) and the call
//!   plan the front stage hands the attempt stage;
//! - `wire/`: byte and text formats (SSE, headers that cross the gateway, trace state,
//!   percent-escapes);
//! - `classify/`: a provider's answer → error class, hold and window;
//! - `answer/`: the gateway's errors, the routing trail, key redaction, recorded content;
//! - `state`: the pushed state as this VM holds it, decoded once per version;
//! - `vm/`: what the workers of one Envoy share (calls, holds and sends, minute leases,
//!   reports, lane records, the picker's round-robin and its view of them);
//! - `sync/`: the filter's half of the sync protocol (snapshot, delta, gap, reconnect,
//!   publish order, reports), driven by the glue;
//! - `host`: the trait a stage sees Envoy through; `testing/`: the fake host (feature
//!   `testing`);
//! - `protocols/`: the caller protocols (chat, Messages, Responses, Gemini) and the
//!   translations between them and the lane kinds;
//! - `lanes/`: the lane for each attempt by the spec's tiers, with cost, families, filters,
//!   conditional candidates, snap-back, affinity and embeddings' identity;
//! - `resolve/`: the profile or pool model a request names, the key's scope, the policy, the
//!   tiers, and `routes:` rules;
//! - `cache/`: the response cache (lookup, store, replay) per caller protocol;
//! - `attempt/`: the attempt stage and its stream gate;
//! - `front/`: the front stage, with the body check, quotas and budgets;
//! - `worker/`: the per-VM state the filter's roots own and hand to each context, and the
//!   `Host` the stages run on in Envoy, made of it and the glue's host calls.

pub mod answer;
pub mod attempt;
pub mod cache;
pub mod classify;
pub mod front;
#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod fuzz_ingress;
#[cfg(test)]
mod golden_tests;
pub mod host;
pub mod lanes;
pub mod plan;
pub mod protocols;
pub mod resolve;
pub mod state;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod vm;
pub mod vocab;
pub mod wire;
pub mod worker;
