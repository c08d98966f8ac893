//! The schema: versioned migrations, run once under an advisory lock; a database migrated by
//! a newer binary is refused.

use std::time::Duration;

use crate::keys::store::KeyStoreError;

use super::connection::{PostgresKeyStore, CALL_DEADLINE};
use super::rows::*;

pub(super) const MIGRATIONS: &[&str] = &[
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
    // 8 -> 9: usage rows per client protocol too (as SQLite's 11 -> 12); the rows so far keep
    // an empty protocol.
    "ALTER TABLE key_usage ADD COLUMN protocol TEXT NOT NULL DEFAULT '';
    ALTER TABLE key_usage DROP CONSTRAINT key_usage_pkey;
    ALTER TABLE key_usage ADD PRIMARY KEY (key_id, day, provider, model, protocol);",
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Serialises migrations between control planes (`pg_advisory_xact_lock`).
const MIGRATION_LOCK: i64 = 0x6169_726f_7574_6572; // "airouter"

impl PostgresKeyStore {
    /// Migrates under the lock, waiting for it (another control plane migrating) up to `wait`:
    /// the calls' deadline does not cut that wait, the pool's still bounds the connection.
    pub(super) fn migrate(&self, wait: Duration) -> Result<(), KeyStoreError> {
        self.call_within(wait.max(CALL_DEADLINE), |mut client| async move {
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
}
