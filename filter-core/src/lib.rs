//! Every decision the ai-router filter makes, as plain Rust on plain data. This crate has no
//! proxy-wasm dependency: it builds for wasm32 (inside the filter) and for the host, where its
//! tests run in seconds. The filter crate (`filter/`) is the thin glue that calls into it.
//!
//! - `resolve`: the profile or pool model a request names, the key's scope, the merged policy
//!   and the candidate tiers;
//! - `lanes`: the lane (provider, key, model) for each attempt, by the spec's tiers;
//! - `classify`: a provider's answer → error class, hold and window;
//! - `stream`, `sse`: the stream gate (held until the first token) and the SSE parser;
//! - `anthropic`, `embeddings`: the Messages adapter and the embeddings identity rules;
//! - `headers`: what crosses the gateway; `quota`, `reports`, `errors`, `plan`, `state`.

pub mod anthropic;
pub mod attempt;
pub mod calls;
pub mod classify;
pub mod context;
pub mod embeddings;
pub mod errors;
pub mod front;
pub mod headers;
pub mod host;
pub mod lanes;
pub mod local;
pub mod plan;
pub mod quota;
pub mod reports;
pub mod resolve;
pub mod sse;
pub mod state;
pub mod stream;
pub mod trail;
pub mod util;
