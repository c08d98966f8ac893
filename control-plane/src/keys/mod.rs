//! Virtual keys: the record pushed to the gateway (`record`), the keys mounted from the
//! environment (`mounted`), the key store (memory or SQLite, hashes only: `store`), the
//! operations on keys (`operations`), per-key quotas (`quotas`) and usage accounting (`usage`);
//! [`open`] opens the configured store (memory, SQLite or Postgres: `postgres`).

pub mod admin_tokens;
pub mod budget_use;
pub mod charge;
pub mod memory;
pub mod mounted;
pub mod operations;
pub mod postgres;
pub mod quotas;
pub mod record;
pub mod sqlite;
pub mod store;
pub mod token_record;
pub mod usage;

use std::sync::Arc;

use store::{KeyStore, KeyStoreError};

use crate::store::start_wait::OpenFailure;

/// A key store that failed to open at start: Postgres not answering is waited for; anything
/// else (a refusal, a TLS handshake refused, a bad URL) is not.
pub fn open_failure(err: KeyStoreError) -> OpenFailure {
    match err {
        KeyStoreError::Unavailable(m) if postgres::waiting_helps(&m) => {
            OpenFailure::Away(KeyStoreError::Unavailable(m).to_string())
        }
        other => OpenFailure::Refused(other.into()),
    }
}

/// Opens the configured key store (blocking: SQLite opens and migrates the file, Postgres
/// connects and migrates, waiting up to `migration_wait` for another control plane's
/// migration). `env` resolves a Postgres URL.
pub fn open(
    spec: &crate::config::StoreSpec,
    env: &dyn crate::config::secrets::Env,
    migration_wait: std::time::Duration,
) -> Result<Arc<dyn KeyStore>, KeyStoreError> {
    use crate::config::StoreSpec;
    Ok(match spec {
        StoreSpec::Memory => Arc::new(memory::MemoryKeyStore::default()),
        StoreSpec::Sqlite(path) => Arc::new(
            sqlite::SqliteKeyStore::open(path)
                .map_err(|e| KeyStoreError::Storage(format!("keyStore {}: {e}", path.display())))?,
        ),
        StoreSpec::Postgres { url, ca_file } => {
            let url = url.resolve(env).ok_or_else(|| {
                KeyStoreError::Storage(format!(
                    "gateway.keyStore.url: {} resolves to nothing",
                    url.describe()
                ))
            })?;
            Arc::new(postgres::PostgresKeyStore::open(
                url.expose(),
                ca_file.as_deref(),
                migration_wait,
            )?)
        }
        StoreSpec::Redis { .. } => {
            return Err(KeyStoreError::Storage(
                "gateway.keyStore: redis holds state, not keys".into(),
            ))
        }
    })
}
