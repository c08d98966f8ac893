//! The ai-router control plane: configuration, key and state stores, the sync service the Envoy
//! filter watches, the admin API, the mock provider and the Envoy bootstrap renderer.
//!
//! - `config/`: the pool file's types, its validation into the resolved model (defaults
//!   applied once) and the secret references (`secrets`);
//! - `engine/`: the state the filters decide from: breakers, budgets, blacklists, cooldowns,
//!   headroom, leases, and the snapshot pushed to every Envoy;
//! - `keys/`: virtual keys: the store (memory, SQLite), the mounted keys, quotas, usage;
//! - `store/`: the durable state store (memory, SQLite) and the SQLite schema both stores share;
//! - `api/`: what listens: the Sync service Envoy watches, the admin API (HTTP and gRPC),
//!   Prometheus metrics and the one error table behind them;
//! - `cli/`: one file per command; `serve` and `up` assemble the servers; `render`: the Envoy
//!   bootstrap; `mock`: the scriptable fake provider.

pub mod api;
pub mod cli;
pub mod config;
pub mod engine;
pub mod keys;
pub mod mock;
pub mod render;
pub mod serve;
pub mod stdout;
pub mod store;
pub mod up;
