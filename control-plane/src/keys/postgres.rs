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
//!   keep working.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde_json::Value;
use tokio_postgres::NoTls;

use crate::config::QuotaConfig;
use crate::keys::admin_tokens::{Scope, StoredToken};
use crate::keys::store::{
    merge_budget_use, token_with_scope, BudgetUse, KeyStore, KeyStoreError, QuotaUsage, StoredKey,
    UsageDay, REPORT_BATCH_RETENTION_MS,
};
use crate::store::bridge::Bridge;
use crate::store::health::{StoreHealth, KEYS};
use crate::store::lock;

/// Connections per control plane.
pub const POOL_SIZE: usize = 8;
const CALL_DEADLINE: Duration = Duration::from_secs(5);
/// Usage batch ids are kept this long (a lost commit is retried well within it).
const BATCH_ID_RETENTION_MS: i64 = 7 * 86_400_000;
/// Batches kept in memory while the database is away; beyond, the oldest are merged into one.
const MAX_UNSENT_BATCHES: usize = 1_000;

const MIGRATIONS: &[&str] = &[
    // 0 -> 1
    "CREATE TABLE virtual_keys (
        id TEXT PRIMARY KEY,
        label TEXT NOT NULL,
        sha256 TEXT NOT NULL UNIQUE,
        hint TEXT NOT NULL,
        owner TEXT,
        profiles JSONB NOT NULL,
        models JSONB NOT NULL,
        allow_fallback BOOLEAN NOT NULL,
        requests_per_minute BIGINT,
        tokens_per_day BIGINT,
        cost_per_day DOUBLE PRECISION,
        cost_per_month DOUBLE PRECISION,
        enabled BOOLEAN NOT NULL,
        revoked BOOLEAN NOT NULL,
        created_at_ms BIGINT NOT NULL
    );
    CREATE TABLE key_usage (
        key_id TEXT NOT NULL,
        day TEXT NOT NULL,
        requests BIGINT NOT NULL DEFAULT 0,
        successes BIGINT NOT NULL DEFAULT 0,
        failures BIGINT NOT NULL DEFAULT 0,
        prompt_tokens BIGINT NOT NULL DEFAULT 0,
        completion_tokens BIGINT NOT NULL DEFAULT 0,
        cost DOUBLE PRECISION NOT NULL DEFAULT 0,
        latency_ms BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, day)
    );
    CREATE TABLE key_usage_outcomes (
        key_id TEXT NOT NULL,
        day TEXT NOT NULL,
        outcome TEXT NOT NULL,
        count BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, day, outcome)
    );
    CREATE TABLE key_changes (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        generation BIGINT NOT NULL
    );
    INSERT INTO key_changes (id, generation) VALUES (1, 0);
    CREATE TABLE usage_batches (
        id TEXT PRIMARY KEY,
        at_ms BIGINT NOT NULL
    );
    CREATE INDEX usage_batches_at ON usage_batches (at_ms);",
    // 1 -> 2: cached prompt tokens, and what cheaper lanes saved (as in SQLite).
    "ALTER TABLE key_usage ADD COLUMN cached_tokens BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE key_usage ADD COLUMN saved DOUBLE PRECISION NOT NULL DEFAULT 0;",
    // 2 -> 3: a key's own response-cache choice (NULL: the policy's).
    "ALTER TABLE virtual_keys ADD COLUMN cache BOOLEAN;",
    // 3 -> 4: the filter's report batches whose usage is counted (as SQLite's 5 -> 6), so one
    // sent again to another or a restarted control plane is not added twice.
    "CREATE TABLE report_batches (
        id TEXT PRIMARY KEY,
        at_ms BIGINT NOT NULL
    );
    CREATE INDEX report_batches_at ON report_batches (at_ms);",
    // 4 -> 5: the quota recheck reads one month of every key's rows at once.
    "CREATE INDEX key_usage_day ON key_usage (day);",
    // 5 -> 6: the budget policies' use per subject and calendar window, counted with the usage
    // rows (every control plane on the database enforces the same budgets).
    "CREATE TABLE budget_usage (
        budget TEXT NOT NULL,
        subject TEXT NOT NULL,
        until_ms BIGINT NOT NULL,
        tokens BIGINT NOT NULL DEFAULT 0,
        cost DOUBLE PRECISION NOT NULL DEFAULT 0,
        PRIMARY KEY (budget, subject, until_ms)
    );",
    // 6 -> 7: scoped admin tokens, by hash (as SQLite's 9 -> 10).
    "CREATE TABLE admin_tokens (
        id TEXT PRIMARY KEY,
        label TEXT NOT NULL,
        scope TEXT NOT NULL,
        sha256 TEXT NOT NULL UNIQUE,
        created_at_ms BIGINT NOT NULL,
        expires_at_ms BIGINT,
        last_used_ms BIGINT,
        revoked BOOLEAN NOT NULL
    );",
    // 7 -> 8: usage rows per key, day, provider and model (as SQLite's 10 -> 11); the rows so
    // far keep an empty provider and model.
    "ALTER TABLE key_usage ADD COLUMN provider TEXT NOT NULL DEFAULT '';
    ALTER TABLE key_usage ADD COLUMN model TEXT NOT NULL DEFAULT '';
    ALTER TABLE key_usage DROP CONSTRAINT key_usage_pkey;
    ALTER TABLE key_usage ADD PRIMARY KEY (key_id, day, provider, model);",
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Serialises migrations between control planes (`pg_advisory_xact_lock`).
const MIGRATION_LOCK: i64 = 0x6169_726f_7574_6572; // "airouter"

const KEY_COLUMNS: &str = "id, label, sha256, hint, owner, profiles, models, allow_fallback, \
     requests_per_minute, tokens_per_day, cost_per_day, cost_per_month, enabled, revoked, \
     created_at_ms, cache";

/// Usage rows and their budgets' use, written in one transaction, once.
#[derive(Clone, Debug)]
struct UsageBatch {
    /// This store's own id for the write (a lost commit retried is recognised by it).
    id: String,
    rows: Vec<(String, UsageDay)>,
    /// The budgets' use of the same charges.
    budgets: Vec<BudgetUse>,
    /// The filter's report batches these rows came from, marked counted with them.
    reports: Vec<String>,
}

pub struct PostgresKeyStore {
    pool: Pool,
    bridge: Bridge,
    /// Usage batches not yet committed, oldest first.
    unsent: Mutex<Vec<UsageBatch>>,
    health: &'static StoreHealth,
}

impl std::fmt::Debug for PostgresKeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresKeyStore").finish_non_exhaustive()
    }
}

/// How an outage's messages start (a refused statement's do not).
const UNREACHABLE: &str = "postgres does not answer";

/// How a connection is secured: the URL's `sslmode` and `sslrootcert`, or the store's `caFile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgTls {
    /// `disable`, `allow`, `prefer` or no `sslmode`: plaintext.
    Off { disable: bool },
    /// `require`, `verify-ca`, `verify-full`: the server's chain and name are verified against
    /// the CA file, or the system's CAs when it is `None`.
    Verify { ca_file: Option<PathBuf> },
}

/// Takes `sslmode` and `sslrootcert` out of `url` (a `postgres://` URL or `key=value` words)
/// and says how to connect; `ca_file` is the store's `caFile`. Errors name the parameter, never
/// the URL.
pub fn split_tls(url: &str, ca_file: Option<&Path>) -> Result<(String, PgTls), String> {
    let mut mode = None;
    let mut root = None;
    let mut take = |key: &str, value: String| -> bool {
        match key {
            "sslmode" => mode = Some(value),
            "sslrootcert" => root = Some(value),
            _ => return false,
        }
        true
    };
    let trimmed = url.trim();
    let is_url = ["postgres://", "postgresql://"].iter().any(|p| {
        trimmed
            .get(..p.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(p))
    });
    let rest = if is_url {
        match trimmed.split_once('?') {
            None => trimmed.to_owned(),
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| {
                        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                        !take(key, percent_decode(value))
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        // `host=h sslmode=verify-full ...`: the words without the two, spacing kept.
        let mut kept = String::with_capacity(trimmed.len());
        for word in trimmed.split_inclusive(char::is_whitespace) {
            let (key, value) = word.trim_end().split_once('=').unwrap_or(("", ""));
            if !take(key, value.trim_matches('\'').to_owned()) {
                kept.push_str(word);
            }
        }
        kept.trim_end().to_owned()
    };
    let ca =
        match (root, ca_file) {
            (Some(_), Some(_)) => return Err(
                "gateway.keyStore: the URL's sslrootcert and caFile both name a CA file; keep one"
                    .into(),
            ),
            (Some(r), None) if r == "system" => None,
            (Some(r), None) if r.is_empty() => {
                return Err("gateway.keyStore.url: sslrootcert is empty".into())
            }
            (Some(r), None) => Some(PathBuf::from(r)),
            (None, file) => file.map(Path::to_path_buf),
        };
    let tls = match mode.as_deref() {
        None | Some("disable" | "allow" | "prefer") => {
            if ca.is_some() {
                return Err("gateway.keyStore: a CA file (caFile or sslrootcert) is only used with TLS: add sslmode=verify-full to the URL".into());
            }
            PgTls::Off {
                disable: mode.as_deref() == Some("disable"),
            }
        }
        Some("require" | "verify-ca" | "verify-full") => PgTls::Verify { ca_file: ca },
        Some(_) => {
            return Err("gateway.keyStore.url: sslmode is one of disable, allow, prefer, require, verify-ca or verify-full".into())
        }
    };
    Ok((rest, tls))
}

/// `%XX` escapes decoded (a query value); anything else as it is.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A database error as the admin API may show it: no URL, no password.
fn pg_error(err: &tokio_postgres::Error) -> String {
    if let Some(why) = crate::tls::client::handshake_failure(err) {
        return format!("{UNREACHABLE}: the TLS handshake failed: {why}");
    }
    match err.as_db_error() {
        Some(db) => format!("postgres: {}", db.message()),
        // "server does not support TLS": tokio-postgres' own words.
        None if err
            .to_string()
            .starts_with("error performing TLS handshake") =>
        {
            format!(
                "{UNREACHABLE}: the TLS handshake failed: {}",
                std::error::Error::source(err).map_or_else(String::new, ToString::to_string)
            )
        }
        None if err.is_closed() => format!("{UNREACHABLE}: the connection closed"),
        None => format!("{UNREACHABLE}: no connection"),
    }
}

fn pool_error(err: &deadpool_postgres::PoolError) -> String {
    match err {
        deadpool_postgres::PoolError::Backend(e) => pg_error(e),
        deadpool_postgres::PoolError::Timeout(_) => {
            format!("{UNREACHABLE}: no connection within the deadline")
        }
        _ => format!("{UNREACHABLE}: no connection"),
    }
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn key_from_row(row: &tokio_postgres::Row) -> Result<StoredKey, String> {
    let list = |i: usize| -> Result<Vec<String>, String> {
        let v: Value = row.try_get(i).map_err(|e| e.to_string())?;
        serde_json::from_value(v).map_err(|e| e.to_string())
    };
    let get_err = |e: tokio_postgres::Error| e.to_string();
    Ok(StoredKey {
        id: row.try_get(0).map_err(get_err)?,
        label: row.try_get(1).map_err(get_err)?,
        sha256: row.try_get(2).map_err(get_err)?,
        hint: row.try_get(3).map_err(get_err)?,
        owner: row.try_get(4).map_err(get_err)?,
        profiles: list(5)?,
        models: list(6)?,
        allow_fallback: row.try_get(7).map_err(get_err)?,
        quota: QuotaConfig {
            requests_per_minute: row
                .try_get::<_, Option<i64>>(8)
                .map_err(get_err)?
                .map(u64_of),
            tokens_per_day: row
                .try_get::<_, Option<i64>>(9)
                .map_err(get_err)?
                .map(u64_of),
            cost_per_day: row.try_get(10).map_err(get_err)?,
            cost_per_month: row.try_get(11).map_err(get_err)?,
        },
        enabled: row.try_get(12).map_err(get_err)?,
        revoked: row.try_get(13).map_err(get_err)?,
        created_at_ms: row.try_get(14).map_err(get_err)?,
        cache: row.try_get(15).map_err(get_err)?,
    })
}

enum Write {
    Inserted,
    Replaced,
    Missing,
    Duplicate,
}

fn new_batch_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl PostgresKeyStore {
    /// Connects (over TLS as the URL's `sslmode` says, see [`split_tls`]; `ca_file` is the
    /// store's `caFile`), migrates, and keeps a pool of at most [`POOL_SIZE`] connections.
    pub fn open(url: &str, ca_file: Option<&Path>) -> Result<Self, KeyStoreError> {
        Self::with_tls(url, ca_file, &KEYS)
    }

    #[cfg(test)]
    fn with_health(url: &str, health: &'static StoreHealth) -> Result<Self, KeyStoreError> {
        Self::with_tls(url, None, health)
    }

    fn with_tls(
        url: &str,
        ca_file: Option<&Path>,
        health: &'static StoreHealth,
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
        store.migrate()?;
        Ok(store)
    }

    /// Runs `f` with a pooled connection under the deadline.
    fn call<T, F, Fut>(&self, f: F) -> Result<T, KeyStoreError>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, String>> + Send,
    {
        let pool = self.pool.clone();
        let answer = self.bridge.run(CALL_DEADLINE, async move {
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

    fn migrate(&self) -> Result<(), KeyStoreError> {
        self.call(|mut client| async move {
            let err = |e: tokio_postgres::Error| pg_error(&e);
            let tx = client.transaction().await.map_err(err)?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(err)?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS ai_router_schema (
                    id INTEGER PRIMARY KEY CHECK (id = 1),
                    version INTEGER NOT NULL
                );
                INSERT INTO ai_router_schema (id, version) VALUES (1, 0) ON CONFLICT DO NOTHING;",
            )
            .await
            .map_err(err)?;
            let version: i32 = tx
                .query_one("SELECT version FROM ai_router_schema WHERE id = 1", &[])
                .await
                .map_err(err)?
                .get(0);
            if version > SCHEMA_VERSION {
                return Err(format!(
                    "postgres: the schema version {version} is newer than this binary's ({SCHEMA_VERSION}); upgrade ai-router"
                ));
            }
            let from = usize::try_from(version).unwrap_or(0);
            for migration in MIGRATIONS.iter().skip(from) {
                tx.batch_execute(migration).await.map_err(err)?;
            }
            tx.execute(
                "UPDATE ai_router_schema SET version = $1 WHERE id = 1",
                &[&SCHEMA_VERSION],
            )
            .await
            .map_err(err)?;
            tx.commit().await.map_err(err)
        })
    }

    fn write_key(&self, key: &StoredKey, insert: bool) -> Result<(), KeyStoreError> {
        let key = key.clone();
        let id = key.id.clone();
        let written = self.call(move |mut client| async move {
            let err = |e: tokio_postgres::Error| pg_error(&e);
            let profiles = serde_json::to_value(&key.profiles).map_err(|e| e.to_string())?;
            let models = serde_json::to_value(&key.models).map_err(|e| e.to_string())?;
            let rpm = key.quota.requests_per_minute.map(i64_of);
            let tpd = key.quota.tokens_per_day.map(i64_of);
            let tx = client.transaction().await.map_err(err)?;
            let values: [&(dyn tokio_postgres::types::ToSql + Sync); 16] = [
                &key.id,
                &key.label,
                &key.sha256,
                &key.hint,
                &key.owner,
                &profiles,
                &models,
                &key.allow_fallback,
                &rpm,
                &tpd,
                &key.quota.cost_per_day,
                &key.quota.cost_per_month,
                &key.enabled,
                &key.revoked,
                &key.created_at_ms,
                &key.cache,
            ];
            let sql = if insert {
                format!(
                    "INSERT INTO virtual_keys ({KEY_COLUMNS}) VALUES \
                     ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
                     ON CONFLICT DO NOTHING"
                )
            } else {
                "UPDATE virtual_keys SET label = $2, sha256 = $3, hint = $4, owner = $5, \
                 profiles = $6, models = $7, allow_fallback = $8, requests_per_minute = $9, \
                 tokens_per_day = $10, cost_per_day = $11, cost_per_month = $12, enabled = $13, \
                 revoked = $14, created_at_ms = $15, cache = $16 WHERE id = $1"
                    .to_owned()
            };
            let changed = tx.execute(sql.as_str(), &values).await.map_err(err)?;
            if changed == 0 {
                return Ok(if insert {
                    Write::Duplicate
                } else {
                    Write::Missing
                });
            }
            tx.execute(
                "UPDATE key_changes SET generation = generation + 1 WHERE id = 1",
                &[],
            )
            .await
            .map_err(err)?;
            tx.commit().await.map_err(err)?;
            Ok(if insert {
                Write::Inserted
            } else {
                Write::Replaced
            })
        })?;
        match written {
            Write::Inserted | Write::Replaced => Ok(()),
            Write::Missing => Err(KeyStoreError::NotFound(id)),
            Write::Duplicate => Err(KeyStoreError::Storage(format!("key {id} already exists"))),
        }
    }

    /// Sends the unsent usage batches, oldest first; stops at the first failure (kept).
    fn flush_usage(&self) -> Result<(), KeyStoreError> {
        loop {
            let Some(batch) = lock(&self.unsent).first().cloned() else {
                return Ok(());
            };
            let id = batch.id.clone();
            self.call(move |client| write_batch(client, batch))?;
            // Another flush (the poll's) may have written it meanwhile, once by its id: remove
            // it by id, not whatever is first now.
            lock(&self.unsent).retain(|kept| kept.id != id);
        }
    }
}

/// One usage batch in one transaction, once: its id goes in with its rows.
async fn write_batch(
    mut client: deadpool_postgres::Object,
    batch: UsageBatch,
) -> Result<(), String> {
    let err = |e: tokio_postgres::Error| pg_error(&e);
    let UsageBatch {
        id: batch_id,
        rows,
        budgets,
        reports,
    } = batch;
    let now = now_ms();
    let tx = client.transaction().await.map_err(err)?;
    let fresh = tx
        .execute(
            "INSERT INTO usage_batches (id, at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&batch_id, &now],
        )
        .await
        .map_err(err)?;
    if fresh == 0 {
        // Committed before, its answer lost on the way.
        return Ok(());
    }
    for report in &reports {
        tx.execute(
            "INSERT INTO report_batches (id, at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[report, &now],
        )
        .await
        .map_err(err)?;
    }
    if !reports.is_empty() {
        tx.execute(
            "DELETE FROM report_batches WHERE at_ms < $1",
            &[&now.saturating_sub(REPORT_BATCH_RETENTION_MS)],
        )
        .await
        .map_err(err)?;
    }
    let usage = tx
        .prepare(
            "INSERT INTO key_usage (key_id, day, requests, successes, failures, \
             prompt_tokens, completion_tokens, cost, latency_ms, cached_tokens, saved, \
             provider, model) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
             ON CONFLICT (key_id, day, provider, model) DO UPDATE SET \
             requests = key_usage.requests + excluded.requests, \
             successes = key_usage.successes + excluded.successes, \
             failures = key_usage.failures + excluded.failures, \
             prompt_tokens = key_usage.prompt_tokens + excluded.prompt_tokens, \
             completion_tokens = key_usage.completion_tokens + excluded.completion_tokens, \
             cost = key_usage.cost + excluded.cost, \
             latency_ms = key_usage.latency_ms + excluded.latency_ms, \
             cached_tokens = key_usage.cached_tokens + excluded.cached_tokens, \
             saved = key_usage.saved + excluded.saved",
        )
        .await
        .map_err(err)?;
    let outcomes = tx
        .prepare(
            "INSERT INTO key_usage_outcomes (key_id, day, outcome, count) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (key_id, day, outcome) DO UPDATE SET \
             count = key_usage_outcomes.count + excluded.count",
        )
        .await
        .map_err(err)?;
    for (id, row) in &rows {
        tx.execute(
            &usage,
            &[
                id,
                &row.day,
                &i64_of(row.requests),
                &i64_of(row.successes),
                &i64_of(row.failures),
                &i64_of(row.prompt_tokens),
                &i64_of(row.completion_tokens),
                &row.cost,
                &i64_of(row.latency_ms),
                &i64_of(row.cached_tokens),
                &row.saved,
                &row.provider,
                &row.model,
            ],
        )
        .await
        .map_err(err)?;
        for (outcome, count) in &row.outcomes {
            tx.execute(&outcomes, &[id, &row.day, outcome, &i64_of(*count)])
                .await
                .map_err(err)?;
        }
    }
    if !budgets.is_empty() {
        let budget = tx
            .prepare(
                "INSERT INTO budget_usage (budget, subject, until_ms, tokens, cost) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (budget, subject, until_ms) DO UPDATE SET \
                 tokens = budget_usage.tokens + excluded.tokens, \
                 cost = budget_usage.cost + excluded.cost",
            )
            .await
            .map_err(err)?;
        for row in &budgets {
            tx.execute(
                &budget,
                &[
                    &row.budget,
                    &row.subject,
                    &row.until_ms,
                    &i64_of(row.tokens),
                    &row.cost,
                ],
            )
            .await
            .map_err(err)?;
        }
        tx.execute("DELETE FROM budget_usage WHERE until_ms <= $1", &[&now])
            .await
            .map_err(err)?;
    }
    tx.execute(
        "DELETE FROM usage_batches WHERE at_ms < $1",
        &[&now.saturating_sub(BATCH_ID_RETENTION_MS)],
    )
    .await
    .map_err(err)?;
    tx.commit().await.map_err(err)
}

/// Folds the oldest batches into one when too many wait (memory stays bounded; the merged
/// batch gets a new id, which is safe: none of them was committed, or they would be gone).
fn bound_unsent(unsent: &mut Vec<UsageBatch>) {
    if unsent.len() <= MAX_UNSENT_BATCHES {
        return;
    }
    // The first one may be in flight (its commit unknown): keep it apart.
    let merged: Vec<UsageBatch> = unsent.drain(1..unsent.len() / 2).collect();
    let mut rows: crate::keys::usage::RowMap = BTreeMap::new();
    let mut reports = Vec::new();
    let mut budgets = BTreeMap::new();
    for batch in merged {
        crate::keys::usage::merge(&mut rows, batch.rows);
        merge_budget_use(&mut budgets, &batch.budgets);
        reports.extend(batch.reports);
    }
    let rows = rows.into_iter().map(|((id, ..), row)| (id, row)).collect();
    unsent.insert(
        1,
        UsageBatch {
            id: new_batch_id(),
            rows,
            budgets: budgets.into_values().collect(),
            reports,
        },
    );
}

/// The usage columns added up, in [`usage_from_row`]'s order after day, provider and model.
const USAGE_SUMS: &str = "SUM(requests)::BIGINT, SUM(successes)::BIGINT, \
     SUM(failures)::BIGINT, SUM(prompt_tokens)::BIGINT, SUM(completion_tokens)::BIGINT, \
     SUM(cost)::DOUBLE PRECISION, SUM(latency_ms)::BIGINT, SUM(cached_tokens)::BIGINT, \
     SUM(saved)::DOUBLE PRECISION";

/// A usage row of `SELECT day, provider, model, {USAGE_SUMS}` (no outcomes).
fn usage_from_row(r: &tokio_postgres::Row) -> UsageDay {
    UsageDay {
        day: r.get(0),
        provider: r.get(1),
        model: r.get(2),
        requests: u64_of(r.get(3)),
        successes: u64_of(r.get(4)),
        failures: u64_of(r.get(5)),
        prompt_tokens: u64_of(r.get(6)),
        completion_tokens: u64_of(r.get(7)),
        cost: r.get(8),
        latency_ms: u64_of(r.get(9)),
        cached_tokens: u64_of(r.get(10)),
        saved: r.get(11),
        outcomes: BTreeMap::new(),
    }
}

impl KeyStore for PostgresKeyStore {
    fn insert(&self, key: &StoredKey) -> Result<(), KeyStoreError> {
        self.write_key(key, true)
    }

    fn replace(&self, key: &StoredKey) -> Result<(), KeyStoreError> {
        self.write_key(key, false)
    }

    fn get(&self, id: &str) -> Result<Option<StoredKey>, KeyStoreError> {
        let id = id.to_owned();
        self.call(move |client| async move {
            let row = client
                .query_opt(
                    &format!("SELECT {KEY_COLUMNS} FROM virtual_keys WHERE id = $1"),
                    &[&id],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            row.as_ref().map(key_from_row).transpose()
        })
    }

    fn list(&self) -> Result<Vec<StoredKey>, KeyStoreError> {
        self.call(|client| async move {
            let rows = client
                .query(
                    &format!("SELECT {KEY_COLUMNS} FROM virtual_keys ORDER BY created_at_ms, id"),
                    &[],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            rows.iter().map(key_from_row).collect()
        })
    }

    fn record_report_usage(
        &self,
        rows: &[(String, UsageDay)],
        budgets: &[BudgetUse],
        batches: &[String],
    ) -> Result<(), KeyStoreError> {
        if !rows.is_empty() || !budgets.is_empty() || !batches.is_empty() {
            let mut unsent = lock(&self.unsent);
            unsent.push(UsageBatch {
                id: new_batch_id(),
                rows: rows.to_vec(),
                budgets: budgets.to_vec(),
                reports: batches.to_vec(),
            });
            bound_unsent(&mut unsent);
        }
        // From here on the rows are taken whatever happens: kept until a write succeeds (this
        // one, the next batch's, the next poll's). Answering an error would have the filter
        // send its report again, and the rows counted twice. While Postgres is known away, the
        // poll alone tries, so a report is acknowledged at once.
        if !self.health.is_up() {
            return Ok(());
        }
        if let Err(err) = self.flush_usage() {
            tracing::warn!(%err, "usage kept until the key store takes it");
        }
        Ok(())
    }

    fn counted_batch(&self, id: &str) -> Result<bool, KeyStoreError> {
        // Taken and waiting for the database counts as counted: it goes in with its rows.
        if lock(&self.unsent)
            .iter()
            .any(|batch| batch.reports.iter().any(|report| report == id))
        {
            return Ok(true);
        }
        let id = id.to_owned();
        self.call(move |client| async move {
            let row = client
                .query_opt("SELECT 1 FROM report_batches WHERE id = $1", &[&id])
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(row.is_some())
        })
    }

    fn usage(&self, id: &str, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError> {
        let (id, from, to) = (id.to_owned(), from.to_owned(), to.to_owned());
        self.call(move |client| async move {
            let err = |e: tokio_postgres::Error| pg_error(&e);
            let rows = client
                .query(
                    &format!(
                        "SELECT day, ''::TEXT, ''::TEXT, {USAGE_SUMS} FROM key_usage \
                         WHERE key_id = $1 AND day >= $2 AND day <= $3 GROUP BY day ORDER BY day"
                    ),
                    &[&id, &from, &to],
                )
                .await
                .map_err(err)?;
            let mut days: Vec<UsageDay> = rows.iter().map(usage_from_row).collect();
            let outcomes = client
                .query(
                    "SELECT day, outcome, count FROM key_usage_outcomes \
                     WHERE key_id = $1 AND day >= $2 AND day <= $3",
                    &[&id, &from, &to],
                )
                .await
                .map_err(err)?;
            for r in &outcomes {
                let day: String = r.get(0);
                if let Some(row) = days.iter_mut().find(|d| d.day == day) {
                    row.outcomes.insert(r.get(1), u64_of(r.get(2)));
                }
            }
            Ok(days)
        })
    }

    fn lane_usage(&self, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError> {
        let (from, to) = (from.to_owned(), to.to_owned());
        self.call(move |client| async move {
            let rows = client
                .query(
                    &format!(
                        "SELECT day, provider, model, {USAGE_SUMS} FROM key_usage \
                         WHERE day >= $1 AND day <= $2 \
                         GROUP BY day, provider, model ORDER BY day, provider, model"
                    ),
                    &[&from, &to],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(rows.iter().map(usage_from_row).collect())
        })
    }

    fn quota_usage(
        &self,
        first: &str,
        today: &str,
    ) -> Result<HashMap<String, QuotaUsage>, KeyStoreError> {
        let (first, today) = (first.to_owned(), today.to_owned());
        self.call(move |client| async move {
            let rows = client
                .query(
                    "SELECT key_id, \
                     COALESCE(SUM(CASE WHEN day = $2 THEN prompt_tokens + completion_tokens \
                     ELSE 0 END), 0)::BIGINT, \
                     COALESCE(SUM(CASE WHEN day = $2 THEN cost ELSE 0 END), 0)::DOUBLE PRECISION, \
                     COALESCE(SUM(cost), 0)::DOUBLE PRECISION \
                     FROM key_usage WHERE day >= $1 AND day <= $2 GROUP BY key_id",
                    &[&first, &today],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(rows
                .iter()
                .map(|r| {
                    (
                        r.get::<_, String>(0),
                        QuotaUsage {
                            day_tokens: u64_of(r.get(1)),
                            day_cost: r.get(2),
                            month_cost: r.get(3),
                        },
                    )
                })
                .collect())
        })
    }

    fn budget_use(&self, now_ms: i64) -> Result<Vec<BudgetUse>, KeyStoreError> {
        self.call(move |client| async move {
            let rows = client
                .query(
                    "SELECT budget, subject, until_ms, tokens, cost FROM budget_usage \
                     WHERE until_ms > $1 ORDER BY budget, subject, until_ms",
                    &[&now_ms],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(rows
                .iter()
                .map(|r| BudgetUse {
                    budget: r.get(0),
                    subject: r.get(1),
                    until_ms: r.get(2),
                    tokens: u64_of(r.get(3)),
                    cost: r.get(4),
                })
                .collect())
        })
    }

    fn generation(&self) -> Result<u64, KeyStoreError> {
        // Polled every second: also the moment to send usage an outage held back.
        if !lock(&self.unsent).is_empty() {
            if let Err(err) = self.flush_usage() {
                tracing::debug!(%err, "usage still waits for the key store");
            }
        }
        self.call(|client| async move {
            let row = client
                .query_one("SELECT generation FROM key_changes WHERE id = 1", &[])
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(u64_of(row.get(0)))
        })
    }

    fn insert_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError> {
        let token = token.clone();
        self.call(move |client| async move {
            client
                .execute(
                    "INSERT INTO admin_tokens (id, label, scope, sha256, created_at_ms, \
                     expires_at_ms, last_used_ms, revoked) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    &[
                        &token.id,
                        &token.label,
                        &token.scope.text(),
                        &token.sha256,
                        &token.created_at_ms,
                        &token.expires_at_ms,
                        &token.last_used_ms,
                        &token.revoked,
                    ],
                )
                .await
                .map(|_| ())
                .map_err(|e| pg_error(&e))
        })
    }

    fn admin_tokens(&self) -> Result<Vec<StoredToken>, KeyStoreError> {
        let rows = self.call(|client| async move {
            let rows = client
                .query(
                    "SELECT id, label, scope, sha256, created_at_ms, expires_at_ms, \
                     last_used_ms, revoked FROM admin_tokens",
                    &[],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            rows.iter()
                .map(|row| {
                    let get_err = |e: tokio_postgres::Error| e.to_string();
                    Ok((
                        StoredToken {
                            id: row.try_get(0).map_err(get_err)?,
                            label: row.try_get(1).map_err(get_err)?,
                            scope: Scope::Read,
                            sha256: row.try_get(3).map_err(get_err)?,
                            created_at_ms: row.try_get(4).map_err(get_err)?,
                            expires_at_ms: row.try_get(5).map_err(get_err)?,
                            last_used_ms: row.try_get(6).map_err(get_err)?,
                            revoked: row.try_get(7).map_err(get_err)?,
                        },
                        row.try_get::<_, String>(2).map_err(get_err)?,
                    ))
                })
                .collect::<Result<Vec<_>, String>>()
        })?;
        rows.into_iter()
            .map(|(token, scope)| token_with_scope(token, &scope))
            .collect()
    }

    fn update_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError> {
        let token = token.clone();
        let id = token.id.clone();
        let changed = self.call(move |client| async move {
            client
                .execute(
                    "UPDATE admin_tokens SET revoked = $2, last_used_ms = $3 WHERE id = $1",
                    &[&token.id, &token.revoked, &token.last_used_ms],
                )
                .await
                .map_err(|e| pg_error(&e))
        })?;
        if changed == 0 {
            return Err(KeyStoreError::NotFound(format!("admin token {id}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::servers;

    static HEALTH: StoreHealth = StoreHealth::new("pg-test");

    fn key(id: &str, sha: &str) -> StoredKey {
        StoredKey {
            id: id.into(),
            label: "team".into(),
            sha256: sha.into(),
            hint: "abcd".into(),
            owner: Some("o".into()),
            profiles: vec!["default".into()],
            models: vec!["m1".into(), "m2".into()],
            allow_fallback: true,
            quota: QuotaConfig {
                requests_per_minute: Some(50),
                tokens_per_day: None,
                cost_per_day: Some(1.5),
                cost_per_month: None,
            },
            enabled: true,
            revoked: false,
            created_at_ms: 1_700_000_000_000,
            cache: None,
        }
    }

    fn day(day: &str, requests: u64, outcome: &str) -> UsageDay {
        UsageDay {
            day: day.into(),
            requests,
            successes: requests,
            cost: 0.25 * requests as f64,
            outcomes: [(outcome.to_owned(), requests)].into(),
            ..UsageDay::default()
        }
    }

    #[test]
    fn waiting_usage_stays_bounded_and_adds_up() {
        let mut unsent: Vec<UsageBatch> = (0..MAX_UNSENT_BATCHES + 1)
            .map(|n| UsageBatch {
                id: new_batch_id(),
                rows: vec![("vk".to_owned(), day("2026-12-01", 1, "success"))],
                budgets: vec![BudgetUse {
                    budget: "b".to_owned(),
                    until_ms: 1,
                    tokens: 2,
                    ..BudgetUse::default()
                }],
                reports: vec![format!("report-{n}")],
            })
            .collect();
        let first = unsent[0].id.clone();
        bound_unsent(&mut unsent);
        assert!(unsent.len() < MAX_UNSENT_BATCHES);
        assert_eq!(unsent[0].id, first, "the one maybe in flight keeps its id");
        let total: u64 = unsent
            .iter()
            .flat_map(|batch| batch.rows.iter().map(|(_, r)| r.requests))
            .sum();
        assert_eq!(total, MAX_UNSENT_BATCHES as u64 + 1);
        let reports: usize = unsent.iter().map(|batch| batch.reports.len()).sum();
        assert_eq!(reports, MAX_UNSENT_BATCHES + 1, "no report id is lost");
        let tokens: u64 = unsent
            .iter()
            .flat_map(|batch| batch.budgets.iter().map(|b| b.tokens))
            .sum();
        assert_eq!(tokens, 2 * (MAX_UNSENT_BATCHES as u64 + 1));
    }

    #[test]
    fn admin_tokens_through_a_real_postgres() -> anyhow::Result<()> {
        let pg = servers::PostgresServer::start()?;
        let store = PostgresKeyStore::with_health(&pg.url(), &HEALTH)?;
        crate::keys::admin_tokens::tests::exercise(&store)?;
        // Another control plane on the database sees them.
        let other = PostgresKeyStore::with_health(&pg.url(), &HEALTH)?;
        assert_eq!(other.admin_tokens()?.len(), 3);
        Ok(())
    }

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_the_url() {
        let verify = |ca: Option<&str>| PgTls::Verify {
            ca_file: ca.map(PathBuf::from),
        };
        let url = "postgres://u:p%3F@db:5432/keys";
        for (given, ca_file, rest, tls) in [
            (url.to_owned(), None, url, PgTls::Off { disable: false }),
            (
                format!("{url}?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"),
                None,
                url,
                verify(Some("/etc/ca.pem")),
            ),
            (
                format!("{url}?connect_timeout=5&sslmode=require&application_name=x"),
                Some("/ca.pem"),
                "postgres://u:p%3F@db:5432/keys?connect_timeout=5&application_name=x",
                verify(Some("/ca.pem")),
            ),
            (
                format!("{url}?sslmode=verify-ca&sslrootcert=system"),
                None,
                url,
                verify(None),
            ),
            (
                format!("{url}?sslmode=disable"),
                None,
                url,
                PgTls::Off { disable: true },
            ),
            (
                "host=db  user=u sslmode=verify-full sslrootcert=/ca.pem dbname=keys".to_owned(),
                None,
                "host=db  user=u dbname=keys",
                verify(Some("/ca.pem")),
            ),
        ] {
            let split = split_tls(&given, ca_file.map(Path::new));
            assert_eq!(split, Ok((rest.to_owned(), tls)), "{given}");
        }
        for (given, ca_file, says) in [
            (format!("{url}?sslmode=verify"), None, "sslmode is one of"),
            (
                format!("{url}?sslmode=prefer"),
                Some("/ca.pem"),
                "add sslmode=verify-full",
            ),
            (url.to_owned(), Some("/ca.pem"), "add sslmode=verify-full"),
            (
                format!("{url}?sslmode=verify-full&sslrootcert=/a.pem"),
                Some("/b.pem"),
                "keep one",
            ),
        ] {
            let message = split_tls(&given, ca_file.map(Path::new))
                .err()
                .unwrap_or_default();
            assert!(message.contains(says), "{given}: {message}");
            assert!(!message.contains("u:p"), "no URL in {message}");
        }
    }

    #[test]
    fn verify_full_checks_the_ca_and_the_name_of_a_real_postgres() -> anyhow::Result<()> {
        static TLS_HEALTH: StoreHealth = StoreHealth::new("tls test");
        let cas = crate::tls::testing::two_cas("pg-tls")?;
        let pg = servers::PostgresServer::start_tls(&servers::ServerTls::in_dir(
            &cas.right.control_plane,
        ))?;
        let verify_full = format!("{}?sslmode=verify-full", pg.url());
        let right = cas.right.ca.as_path();
        let store = PostgresKeyStore::with_tls(&verify_full, Some(right), &TLS_HEALTH)?;
        store.insert(&key("vk_tls", "h_tls"))?;
        let in_url = format!("{verify_full}&sslrootcert={}", right.display());
        let again = PostgresKeyStore::with_tls(&in_url, None, &TLS_HEALTH)?;
        assert_eq!(again.get("vk_tls")?, Some(key("vk_tls", "h_tls")));
        // The server really speaks TLS to it: Postgres says so for this session.
        let ssl = again.call(|client| async move {
            client
                .query_one(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await
                .map(|row| row.get::<_, bool>(0))
                .map_err(|e| pg_error(&e))
        })?;
        assert!(ssl, "the session is not encrypted");

        let refused = |url: &str, ca: &Path| {
            PostgresKeyStore::with_tls(url, Some(ca), &TLS_HEALTH)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let unknown_ca = refused(&verify_full, &cas.wrong.ca);
        assert!(
            unknown_ca.contains("the TLS handshake failed")
                && unknown_ca.contains("invalid peer certificate"),
            "{unknown_ca}"
        );
        // Reached at 127.0.0.1 under a name its certificate does not carry.
        let wrong_name = format!(
            "postgres://postgres@db.invalid:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-full",
            pg.port
        );
        let wrong_name = refused(&wrong_name, right);
        assert!(
            wrong_name.contains("the TLS handshake failed")
                && wrong_name.contains("not valid for name \"db.invalid\""),
            "{wrong_name}"
        );
        Ok(())
    }

    #[test]
    fn keys_usage_and_migrations_through_a_real_postgres() -> anyhow::Result<()> {
        let pg = servers::PostgresServer::start()?;
        let a = PostgresKeyStore::with_health(&pg.url(), &HEALTH)?;
        // A second control plane on the same database migrates nothing and sees everything.
        let b = PostgresKeyStore::with_health(&pg.url(), &HEALTH)?;
        let g0 = b.generation()?;
        a.insert(&key("vk_1", "h1"))?;
        assert!(a.insert(&key("vk_1", "h2")).is_err(), "ids are unique");
        assert!(a.insert(&key("vk_2", "h1")).is_err(), "hashes are unique");
        assert_eq!(b.get("vk_1")?, Some(key("vk_1", "h1")));
        assert!(b.generation()? > g0);
        let mut changed = key("vk_1", "h3");
        changed.enabled = false;
        changed.quota.requests_per_minute = None;
        b.replace(&changed)?;
        assert_eq!(a.list()?, vec![changed]);
        assert_eq!(
            a.replace(&key("vk_9", "h9")),
            Err(KeyStoreError::NotFound("vk_9".into()))
        );

        // Usage from both adds up.
        a.record_usage(&[("vk_1".into(), day("2026-12-01", 2, "success"))])?;
        b.record_usage(&[("vk_1".into(), day("2026-12-01", 3, "success"))])?;
        b.record_usage(&[("vk_1".into(), day("2026-12-02", 1, "error:auth"))])?;
        let rows = a.usage("vk_1", "2026-12-01", "2026-12-31")?;
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].requests, 5);
        assert!((rows[0].cost - 1.25).abs() < 1e-9);
        assert_eq!(rows[0].outcomes.get("success"), Some(&5));
        assert_eq!(rows[1].outcomes.get("error:auth"), Some(&1));
        // The quota recheck's one read: the day's and the month's figures of every key.
        b.record_usage(&[(
            "vk_2".into(),
            UsageDay {
                prompt_tokens: 7,
                completion_tokens: 3,
                ..day("2026-11-30", 1, "success")
            },
        )])?;
        let quota = a.quota_usage("2026-12-01", "2026-12-02")?;
        assert_eq!(quota.len(), 1, "November is another month: {quota:?}");
        assert!((quota["vk_1"].day_cost - 0.25).abs() < 1e-9);
        assert!((quota["vk_1"].month_cost - 1.5).abs() < 1e-9);
        assert_eq!(
            a.quota_usage("2026-11-01", "2026-11-30")?["vk_2"].day_tokens,
            10
        );

        // Budgets' use from both adds up too; an ended window is not read.
        let budget = |until_ms, tokens| BudgetUse {
            budget: "team".to_owned(),
            subject: "vk_1".to_owned(),
            until_ms,
            tokens,
            cost: 0.5,
        };
        let (soon, ended) = (now_ms() + 3_600_000, now_ms() - 1);
        a.record_report_usage(&[], &[budget(soon, 100), budget(ended, 7)], &[])?;
        b.record_report_usage(&[], &[budget(soon, 50)], &[])?;
        let used = a.budget_use(now_ms())?;
        assert_eq!(used.len(), 1, "{used:?}");
        assert_eq!((used[0].until_ms, used[0].tokens), (soon, 150));
        assert!((used[0].cost - 1.0).abs() < 1e-9);

        // A batch whose commit went through but whose answer was lost is not counted twice.
        let batch = UsageBatch {
            id: new_batch_id(),
            rows: vec![("vk_1".to_owned(), day("2026-12-03", 4, "success"))],
            budgets: vec![budget(soon, 10)],
            reports: Vec::new(),
        };
        a.call({
            let batch = batch.clone();
            move |client| write_batch(client, batch)
        })?;
        lock(&a.unsent).push(batch);
        a.flush_usage()?;
        assert_eq!(a.usage("vk_1", "2026-12-03", "2026-12-03")?[0].requests, 4);
        assert_eq!(b.budget_use(now_ms())?[0].tokens, 160);

        // The version lives in the database; a newer one is refused.
        a.call(|client| async move {
            client
                .execute("UPDATE ai_router_schema SET version = version + 1", &[])
                .await
                .map_err(|e| pg_error(&e))
        })?;
        let refused = PostgresKeyStore::with_health(&pg.url(), &HEALTH).map(|_| ());
        assert!(
            matches!(&refused, Err(KeyStoreError::Storage(m)) if m.contains("newer")),
            "{refused:?}"
        );
        Ok(())
    }

    #[test]
    fn a_report_batch_counted_through_one_control_plane_is_known_to_all() -> anyhow::Result<()> {
        static REPORTS: StoreHealth = StoreHealth::new("pg-report-test");
        let pg = servers::PostgresServer::start()?;
        let a = PostgresKeyStore::with_health(&pg.url(), &REPORTS)?;
        assert!(!a.counted_batch("vm1-7")?);
        a.record_report_usage(
            &[("vk".into(), day("2026-12-01", 2, "success"))],
            &[],
            &["vm1-7".to_owned(), "vm2-3".to_owned()],
        )?;
        assert!(a.counted_batch("vm1-7")?);
        // Another control plane, or this one restarted: the ids are in the database.
        drop(a);
        let b = PostgresKeyStore::with_health(&pg.url(), &REPORTS)?;
        assert!(b.counted_batch("vm1-7")?);
        assert!(b.counted_batch("vm2-3")?);
        assert!(!b.counted_batch("vm1-8")?);
        assert_eq!(b.usage("vk", "2026-12-01", "2026-12-01")?[0].requests, 2);

        // While the database is away a taken batch is known from memory, then goes in with its
        // rows.
        let mut pg = pg;
        pg.stop();
        b.record_report_usage(
            &[("vk".into(), day("2026-12-01", 1, "success"))],
            &[],
            &["vm1-8".to_owned()],
        )?;
        assert!(b.counted_batch("vm1-8")?);
        pg.restart()?;
        b.generation()?;
        assert!(lock(&b.unsent).is_empty());
        let c = PostgresKeyStore::with_health(&pg.url(), &REPORTS)?;
        assert!(c.counted_batch("vm1-8")?);
        assert_eq!(c.usage("vk", "2026-12-01", "2026-12-01")?[0].requests, 3);
        Ok(())
    }

    #[test]
    fn an_outage_keeps_usage_and_sends_it_once_back() -> anyhow::Result<()> {
        static OUTAGE: StoreHealth = StoreHealth::new("pg-outage-test");
        let pg = servers::PostgresServer::start()?;
        let url = pg.url();
        let store = PostgresKeyStore::with_health(&url, &OUTAGE)?;
        store.record_usage(&[("vk".into(), day("2026-12-01", 1, "success"))])?;
        // Stop the server, keep its directory: start it again on the same port.
        let mut pg = pg;
        pg.stop();
        let _ = url;
        // Taken (a report is not sent again, so nothing counts twice), and kept.
        store.record_usage(&[("vk".into(), day("2026-12-01", 2, "success"))])?;
        assert!(!OUTAGE.is_up());
        let listed = store.list();
        assert!(
            matches!(&listed, Err(KeyStoreError::Unavailable(m)) if !m.contains("127.0.0.1")),
            "{listed:?}"
        );
        assert_eq!(lock(&store.unsent).len(), 1);
        // Back: the kept batch goes in with the next poll, once.
        pg.restart()?;
        store.generation()?;
        assert!(lock(&store.unsent).is_empty());
        assert!(OUTAGE.is_up());
        assert_eq!(
            store.usage("vk", "2026-12-01", "2026-12-01")?[0].requests,
            3
        );
        Ok(())
    }
}
