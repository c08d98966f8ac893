//! Virtual keys: the store (memory or SQLite, hashes only), the keys mounted from the
//! environment, per-key quotas and usage accounting.

pub mod mounted;
pub mod quotas;
pub mod store;
pub mod usage;
