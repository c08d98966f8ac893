//! The shared key store: `gateway.keyStore: { type: postgres, url: { env: NAME } }`.
//!
//! Several control planes share one database: the keys, their usage per UTC day and the
//! outcomes, and the change counter every key write bumps in its own transaction (each control
//! plane polls it every second and pushes the keys again when it moved, so a key created,
//! rotated, disabled or revoked through any of them reaches every Envoy within about a second).
//!
//! - Schema: the SQLite store's, with BIGINT times and counts, DOUBLE PRECISION cost and JSONB
//!   lists. Migrations are versioned in the database (`ai_router_schema`), run in one
//!   transaction under an advisory lock (two control planes starting together migrate once),
//!   and a database migrated by a newer binary is refused.
//! - Usage: each batch carries a random id, recorded in `usage_batches` in the same
//!   transaction as its rows. A batch that fails is kept and sent again (with the next batch or
//!   the next change-counter poll) and counts as taken (the report it came from is acknowledged,
//!   so the filter does not send it again); one whose commit was lost in flight is recognised
//!   by its id and not added twice. The filter's report batch ids go into `report_batches` in
//!   that transaction too: a report sent again after its acknowledgement was lost (a control
//!   plane killed, the singleton failed over) is known to every control plane and not counted
//!   again. So usage written by every control plane adds up, exactly.
//! - TLS: the URL's `sslmode` (`disable`, `allow`, `prefer`: plaintext, as before;
//!   `require`, `verify-ca`, `verify-full`: TLS that verifies the server's chain and name, so
//!   stricter than libpq's `require` and `verify-ca`) and `sslrootcert` (or the store's
//!   `caFile`; else the system's CAs) are taken out of the URL ([`split_tls`]), since
//!   tokio-postgres parses neither `verify-*` nor `sslrootcert`, and the pool connects through
//!   rustls (`tokio-postgres-rustls`).
//! - Connections: a bounded pool (`deadpool-postgres`, [`POOL_SIZE`]), every call under a
//!   deadline. Envoys serve from pushed state, so an outage stops administration only: the admin
//!   API answers `unavailable` with the reason, usage waits in memory, and keys already pushed
//!
//! The files: `connection` (the pool, the deadline, outage or refusal), `tls` (the URL's TLS
//! parameters), `schema` (the versioned migrations), `rows` (row decoding, errors, the usage
//! batch), `usage` (the usage batches' one-transaction writes) and `key_store` (the
//! [`crate::keys::store::KeyStore`] operations).

mod connection;
mod key_store;
mod rows;
mod schema;
#[cfg(test)]
mod tests;
mod tls;
mod usage;

pub use connection::{PostgresKeyStore, POOL_SIZE};
pub use rows::waiting_helps;
pub use schema::SCHEMA_VERSION;
pub use tls::{split_tls, PgTls};
