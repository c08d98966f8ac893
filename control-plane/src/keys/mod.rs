//! Virtual keys: the record pushed to the gateway (`record`), the keys mounted from the
//! environment (`mounted`), the key store (memory or SQLite, hashes only: `store`), the
//! operations on keys (`admin`), per-key quotas (`quotas`) and usage accounting (`usage`).

pub mod admin;
pub mod mounted;
pub mod postgres;
pub mod quotas;
pub mod record;
pub mod store;
pub mod usage;
