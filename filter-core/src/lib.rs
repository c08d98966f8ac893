//! Every decision the ai-router filter makes, as plain Rust on plain data. This crate has no
//! proxy-wasm dependency: it builds for wasm32 (inside the filter) and for the host, where its
//! tests run in seconds. The filter crate (`filter/`) is the thin glue that calls into it.
//!
//! - `vocab`: the shared vocabulary (`LaneId`, `LocalHold`, `Usage`, `Needs`, family names), a
//!   leaf every module may use; no import cycle between the files (test-only items aside:
//!   `control-plane/tests/module_graph.rs`);
//! - `resolve`: the profile or pool model a request names, the key's scope, the merged policy
//!   and the candidate tiers;
//! - `lanes`: the lane (provider, key, model) for each attempt, by the spec's tiers;
//!   `listing`: which keys reach a discovered model (`discover: true`);
//! - `classify`: a provider's answer → error class, hold and window;
//! - `stream`, `sse`: the stream gate (held until the first token) and the SSE parser;
//! - `anthropic`, `embeddings`: the Messages adapter and the embeddings identity rules;
//! - `ingress`, `messages_ingress`, `responses`: callers that speak the Messages or Responses
//!   API: which lanes serve them natively, and the translations to and from chat completions;
//! - `quota`, `budget`: the per-key quotas and the budget policies the front stage enforces;
//!   `minute_lease`: `requestsPerMinute` across Envoys, from blocks the control plane grants;
//! - `cache`, `prompt_cache`: the response cache (lookup, store, replay) and Anthropic's
//!   `cache_control` marker;
//! - `headers`: what crosses the gateway; `reports`, `errors`, `plan`, `state`.
//! - `cost`, `park`: cheapest-first ordering (`autoSort`), an answer's cost and saving, and
//!   snap-back to a parked cheaper lane (`resetIntervalMs`);
//! - `rules`, `when`: `routes:` rules on request metadata, conditional candidates;
//! - `content`: what an attempt carried, for its report (`telemetry.includeContent`);
//! - `body_check`: the shape of a chat body (mistyped fields are the client's 400);
//! - `headers`: what crosses the gateway; `quota`, `reports`, `errors`, `plan`, `state`.
//! - `sync`: the filter's half of the sync protocol (the singleton's watch stream, publish,
//!   reconnect, reports) as a machine; `vm`: what the workers of one Envoy share (records
//!   changed with one `cas_update` over `SharedData`, the call table).

pub mod affinity;
pub mod anthropic;
pub mod attempt;
pub mod body_check;
pub mod budget;
pub mod cache;
pub mod cache_shapes;
pub mod calls;
pub mod classify;
pub mod content;
pub mod context;
pub mod cost;
pub mod embeddings;
pub mod errors;
pub mod families;
pub mod front;
#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod fuzz_ingress;
pub mod gemini_ingress;
#[cfg(test)]
mod golden_tests;
pub mod headers;
pub mod host;
pub mod ingress;
pub mod lane_records;
pub mod lanes;
pub mod listing;
pub mod local;
pub mod messages_ingress;
pub mod minute_lease;
pub mod park;
pub mod plan;
pub mod plugin;
pub mod prompt_cache;
pub mod quota;
pub mod redact;
pub mod reports;
pub mod resolve;
pub mod responses;
pub mod rules;
pub mod select;
pub mod sse;
pub mod state;
pub mod stream;
pub mod sync;
pub mod terms;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trace_state;
pub mod trail;
pub mod util;
pub mod vm;
pub mod vocab;
pub mod when;
