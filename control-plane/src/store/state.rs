//! The durable state store: `stateStore: { type: sqlite, path }`.
//!
//! Blacklisted keys (with the refused fingerprint), lane cooldowns, breakers, headroom and
//! provider spend survive a restart, and control planes on one host sharing the file see each
//! other's (the engine polls and merges, see [`crate::engine::Engine::sync_store`]). The
//! half-open probe lease is one upsert, atomic across processes. One schema, versioned with
//! `PRAGMA user_version`; migrations run in one transaction, WAL is set outside it, and a schema
//! newer than this binary knows is refused. Calls block: the engine runs them with
//! `spawn_blocking`.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection};

use crate::store::breaker::{Breaker, BreakerId, BreakerPhase, BreakerScope};
use crate::store::durable::{
    Blacklist, BlacklistReason, DurableChanges, DurableState, LaneHeadroom, LeaseGrant, StateStore,
    StoreError,
};
use crate::store::spend::Spend;

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
        let conn = crate::store::sqlite::open(path).map_err(StoreError)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type Row<T> = Result<T, rusqlite::Error>;

fn read_all<T>(
    conn: &Connection,
    sql: &str,
    map: impl FnMut(&rusqlite::Row<'_>) -> Row<T>,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(store_err)?;
    let rows = stmt.query_map([], map).map_err(store_err)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(store_err)
}

fn u64_to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl StateStore for SqliteStateStore {
    fn load(&self) -> Result<DurableState, StoreError> {
        let conn = self.conn();
        let mut state = DurableState::default();
        let rows = read_all(
            &conn,
            "SELECT provider, key, reason, until_ms, refused_fingerprint, code FROM key_blacklist",
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, i64>(4)?,
                    row.get::<_, Option<String>>(5)?,
                ))
            },
        )?;
        for (provider, key, reason, until_ms, fp, code) in rows {
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
        state.cooldowns = read_all(
            &conn,
            "SELECT provider, key, model, until_ms FROM lane_cooldown",
            |row| Ok(((row.get(0)?, row.get(1)?, row.get(2)?), row.get(3)?)),
        )?
        .into_iter()
        .collect();
        let rows = read_all(
            &conn,
            "SELECT scope, provider, key, phase, failures, open_until_ms, cooldown_ms FROM breaker",
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, i64>(4)?,
                    row.get::<_, i64>(5)?,
                    row.get::<_, i64>(6)?,
                ))
            },
        )?;
        for (scope, provider, key, phase, failures, open_until_ms, cooldown_ms) in rows {
            let (Some(scope), Some(phase)) =
                (BreakerScope::parse(&scope), BreakerPhase::parse(&phase))
            else {
                continue;
            };
            state.breakers.insert(
                (scope, provider, key),
                Breaker {
                    phase,
                    failures: u32::try_from(failures).unwrap_or(0),
                    open_until_ms,
                    cooldown_ms: u64::try_from(cooldown_ms).unwrap_or(0),
                },
            );
        }
        state.headroom = read_all(
            &conn,
            "SELECT provider, key, model, remaining_requests, remaining_tokens, reset_at_ms FROM headroom",
            |row| {
                Ok((
                    (row.get(0)?, row.get(1)?, row.get(2)?),
                    LaneHeadroom {
                        remaining_requests: row.get(3)?,
                        remaining_tokens: row.get(4)?,
                        reset_at_ms: row.get(5)?,
                    },
                ))
            },
        )?
        .into_iter()
        .collect();
        state.spend = read_all(
            &conn,
            "SELECT provider, day, day_cost, month, month_cost FROM provider_spend",
            |row| {
                Ok((
                    row.get(0)?,
                    Spend {
                        day: row.get(1)?,
                        day_cost: row.get(2)?,
                        month: row.get(3)?,
                        month_cost: row.get(4)?,
                    },
                ))
            },
        )?
        .into_iter()
        .collect();
        state.resets = read_all(
            &conn,
            "SELECT provider, key, at_ms FROM hold_reset",
            |row| Ok(((row.get(0)?, row.get(1)?), row.get(2)?)),
        )?
        .into_iter()
        .collect();
        Ok(state)
    }

    fn apply(&self, changes: &DurableChanges) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(store_err)?;
        for (provider, key) in &changes.blacklists.delete {
            tx.prepare_cached("DELETE FROM key_blacklist WHERE provider = ?1 AND key = ?2")
                .and_then(|mut stmt| stmt.execute(params![provider, key]))
                .map_err(store_err)?;
        }
        for ((provider, key), entry) in &changes.blacklists.upsert {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO key_blacklist (provider, key, reason, until_ms, refused_fingerprint, code) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut stmt| stmt.execute(params![provider, key, entry.reason.as_str(), entry.until_ms, to_sql(entry.refused_fingerprint), entry.code]))
            .map_err(store_err)?;
        }
        for (provider, key, model) in &changes.cooldowns.delete {
            tx.prepare_cached(
                "DELETE FROM lane_cooldown WHERE provider = ?1 AND key = ?2 AND model = ?3",
            )
            .and_then(|mut stmt| stmt.execute(params![provider, key, model]))
            .map_err(store_err)?;
        }
        for ((provider, key, model), until) in &changes.cooldowns.upsert {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO lane_cooldown (provider, key, model, until_ms) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut stmt| stmt.execute(params![provider, key, model, until]))
            .map_err(store_err)?;
        }
        for (scope, provider, key) in &changes.breakers.delete {
            tx.prepare_cached(
                "DELETE FROM breaker WHERE scope = ?1 AND provider = ?2 AND key = ?3",
            )
            .and_then(|mut stmt| stmt.execute(params![scope.as_str(), provider, key]))
            .map_err(store_err)?;
        }
        for ((scope, provider, key), b) in &changes.breakers.upsert {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO breaker (scope, provider, key, phase, failures, open_until_ms, cooldown_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .and_then(|mut stmt| stmt.execute(params![scope.as_str(), provider, key, b.phase.as_str(), b.failures, b.open_until_ms, u64_to_sql(b.cooldown_ms)]))
            .map_err(store_err)?;
        }
        for (provider, key, model) in &changes.headroom.delete {
            tx.prepare_cached(
                "DELETE FROM headroom WHERE provider = ?1 AND key = ?2 AND model = ?3",
            )
            .and_then(|mut stmt| stmt.execute(params![provider, key, model]))
            .map_err(store_err)?;
        }
        for ((provider, key, model), h) in &changes.headroom.upsert {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO headroom (provider, key, model, remaining_requests, remaining_tokens, reset_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut stmt| stmt.execute(params![provider, key, model, h.remaining_requests, h.remaining_tokens, h.reset_at_ms]))
            .map_err(store_err)?;
        }
        for provider in &changes.spend.delete {
            tx.prepare_cached("DELETE FROM provider_spend WHERE provider = ?1")
                .and_then(|mut stmt| stmt.execute(params![provider]))
                .map_err(store_err)?;
        }
        for (provider, s) in &changes.spend.upsert {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO provider_spend (provider, day, day_cost, month, month_cost) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut stmt| stmt.execute(params![provider, s.day, s.day_cost, s.month, s.month_cost]))
            .map_err(store_err)?;
        }
        for (provider, key) in &changes.resets.delete {
            tx.prepare_cached("DELETE FROM hold_reset WHERE provider = ?1 AND key = ?2")
                .and_then(|mut stmt| stmt.execute(params![provider, key]))
                .map_err(store_err)?;
        }
        for ((provider, key), at) in &changes.resets.upsert {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO hold_reset (provider, key, at_ms) VALUES (?1, ?2, ?3)",
            )
            .and_then(|mut stmt| stmt.execute(params![provider, key, at]))
            .map_err(store_err)?;
        }
        tx.commit().map_err(store_err)
    }

    fn lease(
        &self,
        id: &BreakerId,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<LeaseGrant, StoreError> {
        let conn = self.conn();
        let (scope, provider, key) = (id.0.as_str(), &id.1, &id.2);
        // One statement: SQLite's write lock makes it atomic across processes.
        let granted = conn
            .execute(
                "INSERT INTO probe_lease (scope, provider, key, holder, until_ms) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (scope, provider, key) DO UPDATE
                 SET holder = excluded.holder, until_ms = excluded.until_ms
                 WHERE probe_lease.until_ms <= ?6",
                params![scope, provider, key, holder, now_ms.saturating_add(ttl_ms), now_ms],
            )
            .map_err(store_err)?;
        if granted > 0 {
            return Ok(LeaseGrant::Granted);
        }
        let until: i64 = conn
            .query_row(
                "SELECT until_ms FROM probe_lease WHERE scope = ?1 AND provider = ?2 AND key = ?3",
                params![scope, provider, key],
                |row| row.get(0),
            )
            .map_err(store_err)?;
        Ok(LeaseGrant::HeldUntil(until))
    }

    fn release(&self, id: &BreakerId, holder: Option<&str>) -> Result<(), StoreError> {
        let conn = self.conn();
        let (scope, provider, key) = (id.0.as_str(), &id.1, &id.2);
        match holder {
            None => conn.execute(
                "DELETE FROM probe_lease WHERE scope = ?1 AND provider = ?2 AND key = ?3",
                params![scope, provider, key],
            ),
            Some(holder) => conn.execute(
                "DELETE FROM probe_lease WHERE scope = ?1 AND provider = ?2 AND key = ?3
                 AND holder = ?4",
                params![scope, provider, key, holder],
            ),
        }
        .map_err(store_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_newer_schemas() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("ai-router-state-{}", std::process::id()));
        let path = dir.join("nested").join("state.sqlite");
        let state = crate::store::durable::sample_state();
        {
            let store = SqliteStateStore::open(&path)?;
            assert_eq!(store.load()?, DurableState::default());
            store.save(&state)?;
        }
        let store = SqliteStateStore::open(&path)?;
        assert_eq!(store.load()?, state);
        store.conn().pragma_update(
            None,
            "user_version",
            crate::store::sqlite::SCHEMA_VERSION + 1,
        )?;
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
