//! The response cache (pool `cache: { ttlMs, maxEntries, maxBytes }`): the front stage looks a
//! resolved request up before it plans any attempt, answers a hit itself, and stores a missed
//! call's answer as it passes back. Decisions here; the stage only moves bytes.
//!
//! - The key is the resolved request: the candidates the call resolves to and the body's
//!   messages, tools and sampling parameters; `stream` and `stream_options` do not split it
//!   (a stored answer replays as SSE to a streaming client, [`crate::cache::shapes::replay_sse`]).
//! - Storage is bounded per Envoy process: shared data cannot drop a key, so entries live in
//!   `maxEntries` fixed slots, a key's slot chosen by its hash ([`key::slot_of`]). The eviction
//!   rule: a new answer replaces whatever its slot holds (direct-mapped); an entry past its
//!   TTL is a miss. An answer larger than `maxBytes / maxEntries` is not stored, so the cache
//!   never holds more than `maxBytes` of answers.
//! - Only complete answers are stored ([`entry::storable`]): a 200 with choices, none cut at
//!   `length`, none empty. A streamed answer is stored as the chat completion its events
//!   assemble to ([`assemble::assemble_stream`]) only when the stream ended cleanly: `[DONE]` after
//!   every choice's finish and no error event; a stream that broke off stores nothing.
//! - Whether a call uses the cache ([`store::applies`]): the key's `cache` when set, else the merged
//!   policy's, else on (with the pool's `cache:`). `Cache-Control: no-cache` or `no-store` from
//!   the client skips the lookup and the store ([`store::bypassed`]).
//! - Every caller protocol is cached, each in its own key space ([`key::key_for`]): a chat caller's
//!   entries hold chat completions, a Messages caller's Messages `message`s, a Responses
//!   caller's `response`s (their shapes in [`crate::cache::shapes`]). A stateful Responses call
//!   (`previous_response_id`, `store: true`) is never cached: its answer is the provider's state.
//!
//! Files: `key.rs` (the key and its slot), `entry.rs` (what is stored and what may be),
//! `store.rs` (this process's slots: look, store, share), `call.rs` (one call's part at the
//! front stage), `assemble.rs` (a chat stream assembled to its completion), `shapes.rs` (the
//! other protocols' answers).

pub mod assemble;
pub mod call;
pub mod entry;
pub mod key;
pub mod shapes;
pub mod store;
#[cfg(test)]
mod tests;
