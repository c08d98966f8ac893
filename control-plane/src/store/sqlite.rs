//! The one SQLite schema of ai-router. The key store and the state store may share a file
//! (several processes may, too), so the file has one schema and one `PRAGMA user_version`:
//! migrations run in order in one immediate transaction, WAL is set outside it, and a file
//! written by a newer binary is refused.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

/// The schema version this binary writes; each migration moves the file one version up.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

pub(crate) const MIGRATIONS: &[&str] = &[
    // Key store ------------------------------------------------------------------------------
    // 0 -> 1
    "CREATE TABLE virtual_keys (
        id TEXT PRIMARY KEY,
        label TEXT NOT NULL,
        sha256 TEXT NOT NULL UNIQUE,
        hint TEXT NOT NULL,
        owner TEXT,
        profiles TEXT NOT NULL,
        models TEXT NOT NULL,
        allow_fallback INTEGER NOT NULL,
        requests_per_minute INTEGER,
        tokens_per_day INTEGER,
        cost_per_day REAL,
        cost_per_month REAL,
        enabled INTEGER NOT NULL,
        revoked INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL
    );
    CREATE TABLE key_usage (
        key_id TEXT NOT NULL,
        day TEXT NOT NULL,
        requests INTEGER NOT NULL DEFAULT 0,
        successes INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        completion_tokens INTEGER NOT NULL DEFAULT 0,
        cost REAL NOT NULL DEFAULT 0,
        latency_ms INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, day)
    );
    CREATE TABLE key_usage_outcomes (
        key_id TEXT NOT NULL,
        day TEXT NOT NULL,
        outcome TEXT NOT NULL,
        count INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, day, outcome)
    );
    CREATE TABLE key_changes (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        generation INTEGER NOT NULL
    );
    INSERT INTO key_changes (id, generation) VALUES (1, 0);",
    // State store ----------------------------------------------------------------------------
    // 0 -> 1
    "CREATE TABLE key_blacklist (
        provider TEXT NOT NULL,
        key TEXT NOT NULL,
        reason TEXT NOT NULL,
        until_ms INTEGER NOT NULL,
        refused_fingerprint INTEGER NOT NULL,
        code TEXT,
        PRIMARY KEY (provider, key)
    );
    CREATE TABLE lane_cooldown (
        provider TEXT NOT NULL,
        key TEXT NOT NULL,
        model TEXT NOT NULL,
        until_ms INTEGER NOT NULL,
        PRIMARY KEY (provider, key, model)
    );",
    // 1 -> 2
    "CREATE TABLE breaker (
        scope TEXT NOT NULL,
        provider TEXT NOT NULL,
        key TEXT NOT NULL,
        phase TEXT NOT NULL,
        failures INTEGER NOT NULL,
        open_until_ms INTEGER NOT NULL,
        cooldown_ms INTEGER NOT NULL,
        PRIMARY KEY (scope, provider, key)
    );
    CREATE TABLE headroom (
        provider TEXT NOT NULL,
        key TEXT NOT NULL,
        model TEXT NOT NULL,
        remaining_requests INTEGER NOT NULL,
        remaining_tokens INTEGER NOT NULL,
        reset_at_ms INTEGER NOT NULL,
        PRIMARY KEY (provider, key, model)
    );
    CREATE TABLE provider_spend (
        provider TEXT NOT NULL PRIMARY KEY,
        day INTEGER NOT NULL,
        day_cost REAL NOT NULL,
        month INTEGER NOT NULL,
        month_cost REAL NOT NULL
    );
    CREATE TABLE probe_lease (
        scope TEXT NOT NULL,
        provider TEXT NOT NULL,
        key TEXT NOT NULL,
        holder TEXT NOT NULL,
        until_ms INTEGER NOT NULL,
        PRIMARY KEY (scope, provider, key)
    );",
    // 2 -> 3: cached prompt tokens in the usage rows.
    "ALTER TABLE key_usage ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;",
    // 3 -> 4: what cheaper lanes saved against the calls' first choice (`autoSort`, fallbacks).
    "ALTER TABLE key_usage ADD COLUMN saved REAL NOT NULL DEFAULT 0;",
    // 4 -> 5: a key's own response-cache choice (NULL: the policy's).
    "ALTER TABLE virtual_keys ADD COLUMN cache INTEGER;",
    // 5 -> 6: the report batches whose usage is counted (a batch sent again after a lost
    // acknowledgement is not counted twice).
    "CREATE TABLE report_batches (id TEXT PRIMARY KEY, at_ms INTEGER NOT NULL);
    CREATE INDEX report_batches_at ON report_batches (at_ms);",
    // 6 -> 7: the budget policies' use per subject and calendar window, counted with the usage
    // rows (a control plane restarted, or another sharing the file, enforces the same budgets).
    "CREATE TABLE budget_usage (
        budget TEXT NOT NULL,
        subject TEXT NOT NULL,
        until_ms INTEGER NOT NULL,
        tokens INTEGER NOT NULL DEFAULT 0,
        cost REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (budget, subject, until_ms)
    );",
    // 7 -> 8: the quota recheck reads one month of every key's rows at once.
    "CREATE INDEX key_usage_day ON key_usage (day);",
    // 8 -> 9: an operator's recent resets, shared by the control planes on the file.
    "CREATE TABLE hold_reset (
        provider TEXT NOT NULL,
        key TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        PRIMARY KEY (provider, key)
    );",
    // 9 -> 10: scoped admin tokens, by hash (`keys::admin_tokens`).
    "CREATE TABLE admin_tokens (
        id TEXT PRIMARY KEY,
        label TEXT NOT NULL,
        scope TEXT NOT NULL,
        sha256 TEXT NOT NULL UNIQUE,
        created_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER,
        last_used_ms INTEGER,
        revoked INTEGER NOT NULL
    );",
    // 10 -> 11: usage rows per key, day, provider and model (the console's spend per provider
    // and model reads them); the rows so far keep an empty provider and model.
    "CREATE TABLE key_usage_lanes (
        key_id TEXT NOT NULL,
        day TEXT NOT NULL,
        provider TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL DEFAULT '',
        requests INTEGER NOT NULL DEFAULT 0,
        successes INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        completion_tokens INTEGER NOT NULL DEFAULT 0,
        cost REAL NOT NULL DEFAULT 0,
        latency_ms INTEGER NOT NULL DEFAULT 0,
        cached_tokens INTEGER NOT NULL DEFAULT 0,
        saved REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, day, provider, model)
    );
    INSERT INTO key_usage_lanes (key_id, day, requests, successes, failures, prompt_tokens,
        completion_tokens, cost, latency_ms, cached_tokens, saved)
        SELECT key_id, day, requests, successes, failures, prompt_tokens, completion_tokens,
        cost, latency_ms, cached_tokens, saved FROM key_usage;
    DROP TABLE key_usage;
    ALTER TABLE key_usage_lanes RENAME TO key_usage;
    CREATE INDEX key_usage_day ON key_usage (day);",
    // 11 -> 12: usage rows per client protocol too (the console's spend per protocol); the rows
    // so far keep an empty protocol.
    "CREATE TABLE key_usage_protocols (
        key_id TEXT NOT NULL,
        day TEXT NOT NULL,
        provider TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL DEFAULT '',
        protocol TEXT NOT NULL DEFAULT '',
        requests INTEGER NOT NULL DEFAULT 0,
        successes INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        completion_tokens INTEGER NOT NULL DEFAULT 0,
        cost REAL NOT NULL DEFAULT 0,
        latency_ms INTEGER NOT NULL DEFAULT 0,
        cached_tokens INTEGER NOT NULL DEFAULT 0,
        saved REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, day, provider, model, protocol)
    );
    INSERT INTO key_usage_protocols (key_id, day, provider, model, requests, successes,
        failures, prompt_tokens, completion_tokens, cost, latency_ms, cached_tokens, saved)
        SELECT key_id, day, provider, model, requests, successes, failures, prompt_tokens,
        completion_tokens, cost, latency_ms, cached_tokens, saved FROM key_usage;
    DROP TABLE key_usage;
    ALTER TABLE key_usage_protocols RENAME TO key_usage;
    CREATE INDEX key_usage_day ON key_usage (day);",
];

/// Opens (and creates or migrates) the database at `path`.
pub fn open(path: &Path) -> Result<Connection, String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| err(&e))?;
    }
    let mut conn = Connection::open(path).map_err(|e| err(&e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| err(&e))?;
    // Every statement of the hot paths (state exchange, usage rows) stays prepared.
    conn.set_prepared_statement_cache_capacity(64);
    // WAL cannot be set inside a transaction.
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| err(&e))?;
    // Two processes may migrate at once: the immediate transaction serialises them and the
    // version is read inside it.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| err(&e))?;
    let version: i64 = tx
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|e| err(&e))?;
    if version > SCHEMA_VERSION {
        return Err(format!(
            "{}: the schema version {version} is newer than this binary's ({SCHEMA_VERSION}); upgrade ai-router",
            path.display()
        ));
    }
    let from = usize::try_from(version).map_err(|e| err(&e))?;
    for migration in MIGRATIONS.iter().skip(from) {
        tx.execute_batch(migration).map_err(|e| err(&e))?;
    }
    if version < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|e| err(&e))?;
    }
    tx.commit().map_err(|e| err(&e))?;
    Ok(conn)
}
