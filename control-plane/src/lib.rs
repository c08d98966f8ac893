//! The ai-router control plane: configuration, key and state stores, the sync service the Envoy
//! filter watches, the mock provider and the Envoy bootstrap renderer.

pub mod admin;
pub mod breakers;
pub mod budget;
pub mod config;
pub mod engine;
pub mod error;
pub mod keys_cli;
pub mod keystore;
pub mod metrics;
pub mod mock;
pub mod quotas;
pub mod render;
pub mod secrets;
pub mod serve;
pub mod sqlite;
pub mod state_store;
pub mod stdout;
pub mod sync;
pub mod up;
pub mod usage;
pub mod vkeys;
