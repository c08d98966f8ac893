//! The state authority: what the data plane decides from.
//!
//! The engine holds the resolved pool (providers and their current secrets), the virtual keys
//! and the health state (blacklisted keys, lane cooldowns, breakers, headroom, provider spend),
//! and publishes all of it as one versioned [`ai_router_proto::v1::StateUpdate`] on a `tokio::sync::watch`
//! channel; every change bumps the version. Four things change it:
//! - [`Engine::apply_report`]: attempt outcomes from the filters (docs/architecture.md, Sync);
//! - [`Engine::refresh_secrets`]: every reference is resolved again (about once a second), a
//!   changed secret replaces the pushed one and lifts a blacklist whose refused fingerprint
//!   differs;
//! - [`Engine::expire`]: cooldowns, timed blacklists, headroom past its reset and ended budget
//!   periods go; open breakers past their cooldown turn half-open;
//! - [`Engine::sync_store`]: what another control plane sharing the state store wrote.
//!
//! Durable state goes through [`crate::store::durable::StateStore`]; the in-memory store is the default. The persister
//! task ([`Engine::run_persist`]) merges the store into the engine and writes this process's
//! changes back, off the executor, on every change and about once a second. Updates are
//! read-modify-write with a three-way merge per entry (ours wins a conflict; provider spend is
//! added): breakers are a health signal, not a ledger.

pub mod budgets;
pub mod discovered;
pub mod events;
mod leases;
mod listing;
mod minute_calls;
mod persist;
mod pool;
mod refresh;
pub mod reload;
mod report;
mod reset;
mod shared_cache;
mod snapshot;
mod state;
pub mod stats;
mod watchers;

pub use snapshot::{policy_to_proto, route_to_proto};
pub use state::*;

#[cfg(test)]
mod tests;
