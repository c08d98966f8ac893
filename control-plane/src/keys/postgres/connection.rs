//! The connection pool: opened over TLS as the URL says, every call under a deadline, a
//! refusal told from an outage.

use std::path::Path;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use crate::keys::store::KeyStoreError;
use crate::store::bridge::Bridge;
use crate::store::health::{StoreHealth, KEYS};

use super::rows::*;
use super::tls::*;

/// Connections per control plane.
pub const POOL_SIZE: usize = 8;
pub(super) const CALL_DEADLINE: Duration = Duration::from_secs(5);

pub struct PostgresKeyStore {
    pub(super) pool: Pool,
    pub(super) bridge: Bridge,
    /// Usage batches not yet committed, oldest first.
    pub(super) unsent: Mutex<Vec<UsageBatch>>,
    pub(super) health: &'static StoreHealth,
}

impl std::fmt::Debug for PostgresKeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresKeyStore").finish_non_exhaustive()
    }
}

impl PostgresKeyStore {
    /// Connects (over TLS as the URL's `sslmode` says, see [`split_tls`]; `ca_file` is the
    /// store's `caFile`), migrates, and keeps a pool of at most [`POOL_SIZE`] connections.
    /// Another control plane migrating the same database is waited for, up to
    /// `migration_wait` (not the calls' deadline: a migration is no outage).
    pub fn open(
        url: &str,
        ca_file: Option<&Path>,
        migration_wait: Duration,
    ) -> Result<Self, KeyStoreError> {
        Self::with_tls(url, ca_file, &KEYS, migration_wait)
    }

    #[cfg(test)]
    pub(super) fn with_health(
        url: &str,
        health: &'static StoreHealth,
    ) -> Result<Self, KeyStoreError> {
        Self::with_tls(url, None, health, Duration::from_secs(30))
    }

    pub(super) fn with_tls(
        url: &str,
        ca_file: Option<&Path>,
        health: &'static StoreHealth,
        migration_wait: Duration,
    ) -> Result<Self, KeyStoreError> {
        let (url, tls) = split_tls(url, ca_file).map_err(KeyStoreError::Storage)?;
        let mut config = tokio_postgres::Config::from_str(&url).map_err(|_| {
            KeyStoreError::Storage("gateway.keyStore.url: not a postgres URL".into())
        })?;
        let bridge = Bridge::new("ai-router-postgres").map_err(KeyStoreError::Storage)?;
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match tls {
            PgTls::Off { disable } => {
                if disable {
                    config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                }
                Manager::from_config(config, NoTls, manager_config)
            }
            PgTls::Verify { ca_file } => {
                // Never falls back to plaintext.
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                let client = crate::tls::client::roots(ca_file.as_deref())
                    .and_then(crate::tls::client::client_config)
                    .map_err(|e| KeyStoreError::Storage(format!("gateway.keyStore: {e}")))?;
                let connector = tokio_postgres_rustls::MakeRustlsConnect::new(client);
                Manager::from_config(config, connector, manager_config)
            }
        };
        // The pool's timers need the runtime it runs on: build it there.
        let pool = bridge
            .run(CALL_DEADLINE, async move {
                Pool::builder(manager)
                    .max_size(POOL_SIZE)
                    .runtime(deadpool_postgres::Runtime::Tokio1)
                    .wait_timeout(Some(Duration::from_secs(2)))
                    .create_timeout(Some(Duration::from_secs(2)))
                    .recycle_timeout(Some(Duration::from_secs(2)))
                    .build()
                    .map_err(|e| format!("postgres pool: {e}"))
            })
            .map_err(KeyStoreError::Storage)?;
        let store = Self {
            pool,
            bridge,
            unsent: Mutex::new(Vec::new()),
            health,
        };
        store.migrate(migration_wait)?;
        Ok(store)
    }

    /// Runs `f` with a pooled connection under the deadline.
    pub(super) fn call<T, F, Fut>(&self, f: F) -> Result<T, KeyStoreError>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, String>> + Send,
    {
        self.call_within(CALL_DEADLINE, f)
    }

    /// [`Self::call`] under `deadline` (the pool's own timeouts still bound taking a
    /// connection).
    pub(super) fn call_within<T, F, Fut>(
        &self,
        deadline: Duration,
        f: F,
    ) -> Result<T, KeyStoreError>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, String>> + Send,
    {
        let pool = self.pool.clone();
        let answer = self.bridge.run(deadline, async move {
            let client = pool.get().await.map_err(|e| pool_error(&e))?;
            f(client).await
        });
        match answer {
            Ok(v) => {
                self.health.succeeded();
                Ok(v)
            }
            Err(err) if err.starts_with("postgres: ") => {
                // The database answered: refused, not away.
                self.health.succeeded();
                Err(KeyStoreError::Storage(err))
            }
            Err(err) => {
                let err = if err.starts_with(UNREACHABLE) {
                    err
                } else {
                    format!("{UNREACHABLE}: {err}")
                };
                self.health.failed(&err);
                Err(KeyStoreError::Unavailable(err))
            }
        }
    }
}
