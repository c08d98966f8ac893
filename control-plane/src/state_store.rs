//! The durable state store: `stateStore: { type: sqlite, path }`.
//!
//! Blacklisted keys and lane cooldowns survive a restart. One schema, versioned with
//! `PRAGMA user_version`; migrations run in one transaction, WAL is set outside it, and a schema
//! newer than this binary knows is refused. Calls block: the engine runs them with
//! `spawn_blocking`.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection};

use crate::engine::{Blacklist, BlacklistReason, DurableState, StateStore, StoreError};

/// The schema this binary writes.
pub const SCHEMA_VERSION: i64 = 1;

const MIGRATIONS: &[&str] = &[
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
];

#[derive(Debug)]
pub struct SqliteStateStore {
    conn: Mutex<Connection>,
}

fn store_err(err: impl std::fmt::Display) -> StoreError {
    StoreError(err.to_string())
}

/// Fingerprints are u64; SQLite integers are i64: store the same 64 bits.
fn to_sql(fp: u64) -> i64 {
    i64::from_be_bytes(fp.to_be_bytes())
}

fn from_sql(fp: i64) -> u64 {
    u64::from_be_bytes(fp.to_be_bytes())
}

impl SqliteStateStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(store_err)?;
        }
        let mut conn = Connection::open(path).map_err(store_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(store_err)?;
        // WAL cannot be set inside a transaction.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(store_err)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(store_err)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError(format!(
                "the state store's schema version {version} is newer than this binary's \
                 ({SCHEMA_VERSION}); upgrade ai-router"
            )));
        }
        if version < SCHEMA_VERSION {
            let tx = conn.transaction().map_err(store_err)?;
            let from = usize::try_from(version).map_err(store_err)?;
            for migration in &MIGRATIONS[from..] {
                tx.execute_batch(migration).map_err(store_err)?;
            }
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(store_err)?;
            tx.commit().map_err(store_err)?;
        }
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StateStore for SqliteStateStore {
    fn load(&self) -> Result<DurableState, StoreError> {
        let conn = self.conn();
        let mut state = DurableState::default();
        let mut stmt = conn
            .prepare("SELECT provider, key, reason, until_ms, refused_fingerprint, code FROM key_blacklist")
            .map_err(store_err)?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, i64>(4)?,
                    row.get::<_, Option<String>>(5)?,
                ))
            })
            .map_err(store_err)?;
        for row in rows {
            let (provider, key, reason, until_ms, fp, code) = row.map_err(store_err)?;
            let Some(reason) = BlacklistReason::parse(&reason) else {
                continue;
            };
            state.blacklists.insert(
                (provider, key),
                Blacklist {
                    reason,
                    until_ms,
                    refused_fingerprint: from_sql(fp),
                    code,
                },
            );
        }
        let mut stmt = conn
            .prepare("SELECT provider, key, model, until_ms FROM lane_cooldown")
            .map_err(store_err)?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    (
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                    ),
                    row.get::<_, i64>(3)?,
                ))
            })
            .map_err(store_err)?;
        for row in rows {
            let (lane, until) = row.map_err(store_err)?;
            state.cooldowns.insert(lane, until);
        }
        Ok(state)
    }

    fn save(&self, state: &DurableState) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(store_err)?;
        tx.execute("DELETE FROM key_blacklist", [])
            .map_err(store_err)?;
        tx.execute("DELETE FROM lane_cooldown", [])
            .map_err(store_err)?;
        for ((provider, key), entry) in &state.blacklists {
            tx.execute(
                "INSERT INTO key_blacklist (provider, key, reason, until_ms, refused_fingerprint, code) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![provider, key, entry.reason.as_str(), entry.until_ms, to_sql(entry.refused_fingerprint), entry.code],
            )
            .map_err(store_err)?;
        }
        for ((provider, key, model), until) in &state.cooldowns {
            tx.execute(
                "INSERT INTO lane_cooldown (provider, key, model, until_ms) VALUES (?1, ?2, ?3, ?4)",
                params![provider, key, model, until],
            )
            .map_err(store_err)?;
        }
        tx.commit().map_err(store_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_newer_schemas() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("ai-router-state-{}", std::process::id()));
        let path = dir.join("nested").join("state.sqlite");
        let mut state = DurableState::default();
        state.blacklists.insert(
            ("p".into(), "k".into()),
            Blacklist {
                reason: BlacklistReason::Auth,
                until_ms: 0,
                refused_fingerprint: u64::MAX - 5,
                code: Some("invalid_api_key".into()),
            },
        );
        state
            .cooldowns
            .insert(("p".into(), "k".into(), "m".into()), 123);
        {
            let store = SqliteStateStore::open(&path)?;
            assert_eq!(store.load()?, DurableState::default());
            store.save(&state)?;
        }
        let store = SqliteStateStore::open(&path)?;
        assert_eq!(store.load()?, state);
        store
            .conn()
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)?;
        drop(store);
        let refused = SqliteStateStore::open(&path).map(|_| ()).map_err(|e| e.0);
        assert!(
            matches!(&refused, Err(m) if m.contains("newer")),
            "{refused:?}"
        );
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
