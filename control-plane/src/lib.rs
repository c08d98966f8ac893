//! The ai-router control plane: configuration, key and state stores, the sync service the Envoy
//! filter watches, the admin API, the mock provider and the Envoy bootstrap renderer.
//!
//! Layers, each built only on the ones before it (no import cycle between folders or files:
//! `tests/module_graph.rs`):
//! - `config/`: the pool file's types, its validation into the resolved model (defaults
//!   applied once) and the secret references (`secrets`); `clock`: time behind a trait;
//! - `tls`: the sync channel's mutual TLS: the certificates `ai-router certs` issues, the
//!   server configuration reloaded when its files change;
//! - `store/`: the durable state (blacklists, cooldowns, breakers, headroom, provider spend),
//!   the rules of its records, and where it lives (memory, SQLite; the one SQLite schema);
//! - `keys/`: virtual keys: the record pushed to the gateway, the mounted keys, the key store
//!   (memory, SQLite), the operations on keys, quotas, usage;
//! - `engine/`: the state the filters decide from: reports, leases, secret refresh, expiry,
//!   and the snapshot pushed to every Envoy;
//! - `api/`: what listens: the Sync service Envoy watches, the admin API (HTTP and gRPC),
//!   Prometheus metrics and the one error table behind them;
//! - `discovery`: the background task that lists each key's models (`discover: true`);
//! - `reload`: a new pool from the config file (SIGHUP, file change) without a restart;
//! - `traces`: OpenTelemetry spans of the calls from the reports, exported over OTLP;
//! - `render`: the Envoy bootstrap; `mock`: the scriptable fake provider;
//! - `serve`, `up`: the servers assembled; `cli/`: one file per command;
//! - `fuzz` (tests only): property runs over the pool config, from the file to the bootstrap.

pub mod api;
pub mod cli;
pub mod clock;
pub mod config;
pub mod conformance;
pub mod discovery;
pub mod drain;
pub mod engine;
#[cfg(test)]
mod fuzz;
pub mod keys;
pub mod ledger;
pub mod mock;
pub mod reload;
pub mod render;
pub mod serve;
pub mod stdout;
pub mod store;
pub mod tls;
pub mod traces;
pub mod up;
