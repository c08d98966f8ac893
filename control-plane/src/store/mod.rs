//! The durable state and where it lives.
//!
//! - `durable`: what survives a restart (blacklists, cooldowns, breakers, headroom, provider
//!   spend), the changes between two states, their three-way merge, and `StateStore`;
//! - `breaker`, `spend`: the two records with rules of their own (the breaker's phases, the
//!   budget's UTC periods), driven by the engine;
//! - `memory`, `state`: the stores (in memory, SQLite); `sqlite`: the one SQLite schema the
//!   state store and the key store share;
//! - `minute_calls`: the per-minute counts behind `requestsPerMinute` across Envoys;
//! - `redis`: the store several control planes share; `bridge` runs its async client (and the
//!   Postgres key store's) behind the blocking trait; `health` counts their outages.
//! - `start_wait`: how `serve` waits for a shared store that does not answer yet.
//!
//! Nothing here knows the engine, the keys or the APIs: they build on it.

pub mod breaker;
pub mod bridge;
pub mod durable;
pub mod health;
pub mod memory;
pub mod minute_calls;
pub mod redis;
pub mod spend;
pub mod sqlite;
pub mod start_wait;
pub mod state;

/// Real Redis and Postgres servers for the tests (the e2e harness's own launcher).
#[cfg(test)]
#[path = "../../../tests/src/servers.rs"]
#[allow(dead_code)]
pub(crate) mod servers;

use std::sync::{Mutex, MutexGuard};

/// Takes a mutex even when a holder panicked: every in-memory holder of state (the memory
/// stores, the engine) writes whole values under its lock, so a panic cannot leave one
/// half-written in a way that matters more than stopping the control plane would.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
