//! The key store in SQLite (`{ type: sqlite, path }`): one schema, versioned with
//! `PRAGMA user_version`; migrations run in one transaction, WAL is set outside it, a newer
//! schema is refused. Several processes may share the file.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension};

use crate::config::QuotaConfig;
use crate::keys::store::*;
use crate::keys::token_record::{Scope, StoredToken};
use crate::store::lock;

/// `{ type: sqlite, path }`: durable, shareable between processes.
#[derive(Debug)]
pub struct SqliteKeyStore {
    conn: Mutex<Connection>,
}

fn u64_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn sql_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

const KEY_COLUMNS: &str = "id, label, sha256, hint, owner, profiles, models, allow_fallback, \
     requests_per_minute, tokens_per_day, cost_per_day, cost_per_month, enabled, revoked, \
     created_at_ms, cache";

fn key_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<StoredKey> {
    let list = |index: usize| -> rusqlite::Result<Vec<String>> {
        let text: String = row.get(index)?;
        serde_json::from_str(&text).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, e.into())
        })
    };
    Ok(StoredKey {
        id: row.get(0)?,
        label: row.get(1)?,
        sha256: row.get(2)?,
        hint: row.get(3)?,
        owner: row.get(4)?,
        profiles: list(5)?,
        models: list(6)?,
        allow_fallback: row.get(7)?,
        quota: QuotaConfig {
            requests_per_minute: row.get::<_, Option<i64>>(8)?.map(sql_u64),
            tokens_per_day: row.get::<_, Option<i64>>(9)?.map(sql_u64),
            cost_per_day: row.get(10)?,
            cost_per_month: row.get(11)?,
        },
        enabled: row.get(12)?,
        revoked: row.get(13)?,
        created_at_ms: row.get(14)?,
        cache: row.get(15)?,
    })
}

impl SqliteKeyStore {
    /// Opens (creating it and its directory when needed) and migrates the store at `path`.
    pub fn open(path: &Path) -> Result<Self, KeyStoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(storage)?;
        }
        let conn = crate::store::sqlite::open(path).map_err(KeyStoreError::Storage)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    pub(super) fn conn(&self) -> MutexGuard<'_, Connection> {
        lock(&self.conn)
    }

    fn write_key(&self, key: &StoredKey, insert: bool) -> Result<(), KeyStoreError> {
        let profiles = serde_json::to_string(&key.profiles).map_err(storage)?;
        let models = serde_json::to_string(&key.models).map_err(storage)?;
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(storage)?;
        let values = params![
            key.id,
            key.label,
            key.sha256,
            key.hint,
            key.owner,
            profiles,
            models,
            key.allow_fallback,
            key.quota.requests_per_minute.map(u64_sql),
            key.quota.tokens_per_day.map(u64_sql),
            key.quota.cost_per_day,
            key.quota.cost_per_month,
            key.enabled,
            key.revoked,
            key.created_at_ms,
            key.cache,
        ];
        let changed = if insert {
            tx.execute(
                &format!(
                    "INSERT INTO virtual_keys ({KEY_COLUMNS}) VALUES \
                     (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
                ),
                values,
            )
            .map_err(storage)?
        } else {
            tx.execute(
                "UPDATE virtual_keys SET label = ?2, sha256 = ?3, hint = ?4, owner = ?5, \
                 profiles = ?6, models = ?7, allow_fallback = ?8, requests_per_minute = ?9, \
                 tokens_per_day = ?10, cost_per_day = ?11, cost_per_month = ?12, enabled = ?13, \
                 revoked = ?14, created_at_ms = ?15, cache = ?16 WHERE id = ?1",
                values,
            )
            .map_err(storage)?
        };
        if changed == 0 {
            return Err(KeyStoreError::NotFound(key.id.clone()));
        }
        tx.execute(
            "UPDATE key_changes SET generation = generation + 1 WHERE id = 1",
            [],
        )
        .map_err(storage)?;
        tx.commit().map_err(storage)
    }
}

/// The usage columns added up, in [`usage_from_row`]'s order after day, provider, model and
/// protocol.
const USAGE_SUMS: &str = "SUM(requests), SUM(successes), SUM(failures), \
     SUM(prompt_tokens), SUM(completion_tokens), SUM(cost), SUM(latency_ms), \
     SUM(cached_tokens), SUM(saved)";

/// A usage row of `SELECT day, provider, model, protocol, {USAGE_SUMS}` (no outcomes).
fn usage_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<UsageDay> {
    Ok(UsageDay {
        day: row.get(0)?,
        provider: row.get(1)?,
        model: row.get(2)?,
        protocol: row.get(3)?,
        requests: sql_u64(row.get(4)?),
        successes: sql_u64(row.get(5)?),
        failures: sql_u64(row.get(6)?),
        prompt_tokens: sql_u64(row.get(7)?),
        completion_tokens: sql_u64(row.get(8)?),
        cost: row.get(9)?,
        latency_ms: sql_u64(row.get(10)?),
        cached_tokens: sql_u64(row.get(11)?),
        saved: row.get(12)?,
        outcomes: BTreeMap::new(),
    })
}

impl KeyStore for SqliteKeyStore {
    fn insert(&self, key: &StoredKey) -> Result<(), KeyStoreError> {
        self.write_key(key, true)
    }

    fn replace(&self, key: &StoredKey) -> Result<(), KeyStoreError> {
        self.write_key(key, false)
    }

    fn get(&self, id: &str) -> Result<Option<StoredKey>, KeyStoreError> {
        self.conn()
            .query_row(
                &format!("SELECT {KEY_COLUMNS} FROM virtual_keys WHERE id = ?1"),
                [id],
                key_from_row,
            )
            .optional()
            .map_err(storage)
    }

    fn list(&self) -> Result<Vec<StoredKey>, KeyStoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {KEY_COLUMNS} FROM virtual_keys ORDER BY created_at_ms, id"
            ))
            .map_err(storage)?;
        let rows = stmt.query_map([], key_from_row).map_err(storage)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(storage)
    }

    fn each(&self, each: &mut dyn FnMut(StoredKey)) -> Result<(), KeyStoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {KEY_COLUMNS} FROM virtual_keys ORDER BY created_at_ms, id"
            ))
            .map_err(storage)?;
        for key in stmt.query_map([], key_from_row).map_err(storage)? {
            each(key.map_err(storage)?);
        }
        Ok(())
    }

    fn record_report_usage(
        &self,
        rows: &[(String, UsageDay)],
        budgets: &[BudgetUse],
        batches: &[String],
    ) -> Result<(), KeyStoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(storage)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        if !budgets.is_empty() {
            for row in budgets {
                tx.prepare_cached(
                    "INSERT INTO budget_usage (budget, subject, until_ms, tokens, cost) \
                     VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (budget, subject, until_ms) DO UPDATE SET \
                     tokens = tokens + excluded.tokens, cost = cost + excluded.cost",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        row.budget,
                        row.subject,
                        row.until_ms,
                        u64_sql(row.tokens),
                        row.cost
                    ])
                })
                .map_err(storage)?;
            }
            tx.prepare_cached("DELETE FROM budget_usage WHERE until_ms <= ?1")
                .and_then(|mut stmt| stmt.execute(params![now]))
                .map_err(storage)?;
        }
        if !batches.is_empty() {
            for id in batches {
                tx.prepare_cached(
                    "INSERT OR IGNORE INTO report_batches (id, at_ms) VALUES (?1, ?2)",
                )
                .and_then(|mut stmt| stmt.execute(params![id, now]))
                .map_err(storage)?;
            }
            tx.prepare_cached("DELETE FROM report_batches WHERE at_ms < ?1")
                .and_then(|mut stmt| stmt.execute(params![now - REPORT_BATCH_RETENTION_MS]))
                .map_err(storage)?;
        }
        for (id, row) in rows {
            tx.prepare_cached(
                "INSERT INTO key_usage (key_id, day, requests, successes, failures, \
                 prompt_tokens, completion_tokens, cost, latency_ms, cached_tokens, saved, \
                 provider, model, protocol) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
                 ON CONFLICT (key_id, day, provider, model, protocol) DO UPDATE SET \
                 requests = requests + excluded.requests, \
                 successes = successes + excluded.successes, \
                 failures = failures + excluded.failures, \
                 prompt_tokens = prompt_tokens + excluded.prompt_tokens, \
                 completion_tokens = completion_tokens + excluded.completion_tokens, \
                 cost = cost + excluded.cost, \
                 latency_ms = latency_ms + excluded.latency_ms, \
                 cached_tokens = cached_tokens + excluded.cached_tokens, \
                 saved = saved + excluded.saved",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    id,
                    row.day,
                    u64_sql(row.requests),
                    u64_sql(row.successes),
                    u64_sql(row.failures),
                    u64_sql(row.prompt_tokens),
                    u64_sql(row.completion_tokens),
                    row.cost,
                    u64_sql(row.latency_ms),
                    u64_sql(row.cached_tokens),
                    row.saved,
                    row.provider,
                    row.model,
                    row.protocol,
                ])
            })
            .map_err(storage)?;
            for (outcome, count) in &row.outcomes {
                tx.prepare_cached(
                    "INSERT INTO key_usage_outcomes (key_id, day, outcome, count) \
                     VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (key_id, day, outcome) DO UPDATE SET \
                     count = count + excluded.count",
                )
                .and_then(|mut stmt| stmt.execute(params![id, row.day, outcome, u64_sql(*count)]))
                .map_err(storage)?;
            }
        }
        tx.commit().map_err(storage)
    }

    fn counted_batch(&self, id: &str) -> Result<bool, KeyStoreError> {
        self.conn()
            .prepare_cached("SELECT 1 FROM report_batches WHERE id = ?1")
            .and_then(|mut stmt| stmt.exists(params![id]))
            .map_err(storage)
    }

    fn budget_use(&self, now_ms: i64) -> Result<Vec<BudgetUse>, KeyStoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT budget, subject, until_ms, tokens, cost FROM budget_usage \
                 WHERE until_ms > ?1 ORDER BY budget, subject, until_ms",
            )
            .map_err(storage)?;
        let rows = stmt
            .query_map(params![now_ms], |row| {
                Ok(BudgetUse {
                    budget: row.get(0)?,
                    subject: row.get(1)?,
                    until_ms: row.get(2)?,
                    tokens: sql_u64(row.get(3)?),
                    cost: row.get(4)?,
                })
            })
            .map_err(storage)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(storage)
    }

    fn usage(&self, id: &str, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT day, '', '', '', {USAGE_SUMS} FROM key_usage \
                     WHERE key_id = ?1 AND day >= ?2 AND day <= ?3 \
                     GROUP BY day ORDER BY day"
            ))
            .map_err(storage)?;
        let rows = stmt
            .query_map(params![id, from, to], usage_from_row)
            .map_err(storage)?;
        let mut days = rows.collect::<Result<Vec<_>, _>>().map_err(storage)?;
        let mut stmt = conn
            .prepare(
                "SELECT day, outcome, count FROM key_usage_outcomes \
                 WHERE key_id = ?1 AND day >= ?2 AND day <= ?3",
            )
            .map_err(storage)?;
        let outcomes = stmt
            .query_map(params![id, from, to], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    sql_u64(row.get(2)?),
                ))
            })
            .map_err(storage)?;
        for outcome in outcomes {
            let (day, outcome, count) = outcome.map_err(storage)?;
            if let Some(row) = days.iter_mut().find(|d| d.day == day) {
                row.outcomes.insert(outcome, count);
            }
        }
        Ok(days)
    }

    fn lane_usage(
        &self,
        from: &str,
        to: &str,
        key: Option<&str>,
    ) -> Result<Vec<UsageDay>, KeyStoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT day, provider, model, protocol, {USAGE_SUMS} FROM key_usage \
                 WHERE day >= ?1 AND day <= ?2 AND (?3 IS NULL OR key_id = ?3) \
                 GROUP BY day, provider, model, protocol \
                 ORDER BY day, provider, model, protocol"
            ))
            .map_err(storage)?;
        let rows = stmt
            .query_map(params![from, to, key], usage_from_row)
            .map_err(storage)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(storage)
    }

    fn quota_usage(
        &self,
        first: &str,
        today: &str,
    ) -> Result<HashMap<String, QuotaUsage>, KeyStoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT key_id, \
                 SUM(CASE WHEN day = ?2 THEN prompt_tokens + completion_tokens ELSE 0 END), \
                 SUM(CASE WHEN day = ?2 THEN cost ELSE 0 END), SUM(cost) \
                 FROM key_usage WHERE day >= ?1 AND day <= ?2 GROUP BY key_id",
            )
            .map_err(storage)?;
        let rows = stmt
            .query_map(params![first, today], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    QuotaUsage {
                        day_tokens: sql_u64(row.get(1)?),
                        day_cost: row.get(2)?,
                        month_cost: row.get(3)?,
                    },
                ))
            })
            .map_err(storage)?;
        rows.collect::<Result<HashMap<_, _>, _>>().map_err(storage)
    }

    fn generation(&self) -> Result<u64, KeyStoreError> {
        self.conn()
            .query_row(
                "SELECT generation FROM key_changes WHERE id = 1",
                [],
                |row| row.get::<_, i64>(0),
            )
            .map(sql_u64)
            .map_err(storage)
    }

    fn insert_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError> {
        self.conn()
            .execute(
                "INSERT INTO admin_tokens (id, label, scope, sha256, created_at_ms, \
                 expires_at_ms, last_used_ms, revoked) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    token.id,
                    token.label,
                    token.scope.text(),
                    token.sha256,
                    token.created_at_ms,
                    token.expires_at_ms,
                    token.last_used_ms,
                    token.revoked,
                ],
            )
            .map(|_| ())
            .map_err(storage)
    }

    fn admin_tokens(&self) -> Result<Vec<StoredToken>, KeyStoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, label, scope, sha256, created_at_ms, expires_at_ms, last_used_ms, \
                 revoked FROM admin_tokens",
            )
            .map_err(storage)?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    StoredToken {
                        id: row.get(0)?,
                        label: row.get(1)?,
                        scope: Scope::Read,
                        sha256: row.get(3)?,
                        created_at_ms: row.get(4)?,
                        expires_at_ms: row.get(5)?,
                        last_used_ms: row.get(6)?,
                        revoked: row.get(7)?,
                    },
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(storage)?;
        rows.map(|row| {
            let (token, scope) = row.map_err(storage)?;
            token_with_scope(token, &scope)
        })
        .collect()
    }

    fn update_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError> {
        let changed = self
            .conn()
            .execute(
                "UPDATE admin_tokens SET revoked = ?2, last_used_ms = ?3 WHERE id = ?1",
                params![token.id, token.revoked, token.last_used_ms],
            )
            .map_err(storage)?;
        if changed == 0 {
            return Err(KeyStoreError::NotFound(format!("admin token {}", token.id)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::keys::memory::MemoryKeyStore;

    /// A new file in a new directory `tag` as the binary that ran the first `version`
    /// migrations left it, with `rows` (SQL) written: `(dir, path)`.
    fn file_at_version(tag: &str, version: usize, rows: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("ai-router-{tag}-{}", std::process::id()));
        let path = dir.join("keys.sqlite");
        let _ = std::fs::remove_file(&path);
        std::fs::create_dir_all(&dir).unwrap();
        let conn = rusqlite::Connection::open(&path).unwrap();
        for migration in &crate::store::sqlite::MIGRATIONS[..version] {
            conn.execute_batch(migration).unwrap();
        }
        conn.pragma_update(None, "user_version", version as i64)
            .unwrap();
        conn.execute_batch(rows).unwrap();
        (dir, path)
    }

    #[test]
    fn usage_rows_written_before_provider_and_model_survive_the_migration() {
        // A file as the binary before usage rows had a lane wrote it.
        let (dir, path) = file_at_version(
            "migrate",
            10,
            "INSERT INTO key_usage (key_id, day, requests, prompt_tokens, cost) \
             VALUES ('key_a', '2026-03-15', 3, 30, 0.5)",
        );
        let store = SqliteKeyStore::open(&path).unwrap();
        let days = store.usage("key_a", "2026-03-01", "2026-03-31").unwrap();
        assert_eq!((days.len(), days[0].requests, days[0].cost), (1, 3, 0.5));
        // Old rows have no lane; new ones add to the same day.
        let mut row = days[0].clone();
        (row.provider, row.model) = ("p1".into(), "m1".into());
        store.record_usage(&[("key_a".into(), row)]).unwrap();
        let days = store.usage("key_a", "2026-03-01", "2026-03-31").unwrap();
        assert_eq!((days.len(), days[0].requests), (1, 6));
        let lanes = store.lane_usage("2026-03-15", "2026-03-15", None).unwrap();
        let lanes: Vec<(&str, &str, u64)> = lanes
            .iter()
            .map(|l| (l.provider.as_str(), l.model.as_str(), l.requests))
            .collect();
        assert_eq!(lanes, vec![("", "", 3), ("p1", "m1", 3)]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn usage_rows_written_before_the_protocol_survive_the_migration_with_an_empty_one() {
        // A file as the binary before usage rows had a protocol wrote it (every migration but
        // the last): two lanes of a day.
        let (dir, path) = file_at_version(
            "migrate-protocol",
            crate::store::sqlite::MIGRATIONS.len() - 1,
            "INSERT INTO key_usage (key_id, day, provider, model, requests, prompt_tokens, \
             cost, saved) VALUES ('key_a', '2026-03-15', 'p1', 'm1', 3, 30, 0.5, 0.125), \
             ('key_a', '2026-03-15', 'p2', 'm2', 1, 10, 0.25, 0.0); \
             INSERT INTO key_usage_outcomes (key_id, day, outcome, count) \
             VALUES ('key_a', '2026-03-15', 'success', 4);",
        );
        let store = SqliteKeyStore::open(&path).unwrap();
        let lanes = |store: &SqliteKeyStore| -> Vec<(String, String, u64, f64)> {
            store
                .lane_usage("2026-03-15", "2026-03-15", Some("key_a"))
                .unwrap()
                .into_iter()
                .map(|l| (l.provider, l.protocol, l.requests, l.cost))
                .collect()
        };
        assert_eq!(
            lanes(&store),
            vec![
                ("p1".into(), String::new(), 3, 0.5),
                ("p2".into(), String::new(), 1, 0.25),
            ]
        );
        // New rows of the same lane by a protocol are rows of their own; the key's day adds
        // every protocol up, its outcomes kept.
        let messages = UsageDay {
            day: "2026-03-15".into(),
            provider: "p1".into(),
            model: "m1".into(),
            protocol: "messages".into(),
            requests: 2,
            cost: 0.25,
            ..UsageDay::default()
        };
        store.record_usage(&[("key_a".into(), messages)]).unwrap();
        assert_eq!(
            lanes(&store),
            vec![
                ("p1".into(), String::new(), 3, 0.5),
                ("p1".into(), "messages".into(), 2, 0.25),
                ("p2".into(), String::new(), 1, 0.25),
            ]
        );
        let days = store.usage("key_a", "2026-03-01", "2026-03-31").unwrap();
        assert_eq!(days.len(), 1);
        let day = &days[0];
        assert_eq!((day.requests, day.prompt_tokens, day.cost), (6, 40, 1.0));
        assert_eq!((day.saved, day.outcomes["success"]), (0.125, 4));
        assert!(
            day.provider.is_empty() && day.protocol.is_empty(),
            "{day:?}"
        );
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    // 2026-03-15T12:00:00Z
    const MARCH_15: i64 = 1_773_576_000_000;

    #[test]
    fn dates() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(MARCH_15), "2026-03-15");
        assert_eq!(utc_timestamp(MARCH_15 + 61_000), "2026-03-15T12:01:01Z");
        assert_eq!(utc_day(-1), "1969-12-31");
        assert_eq!(parse_day("2024-02-29").as_deref(), Some("2024-02-29"));
        for bad in [
            "2023-02-29",
            "2026-13-01",
            "2026-1-01",
            "x",
            "2026-01-01-01",
        ] {
            assert_eq!(parse_day(bad), None, "{bad}");
        }
    }

    #[test]
    fn key_store_and_state_store_share_one_file() {
        let dir = std::env::temp_dir().join(format!("ai-router-sqlite-{}", std::process::id()));
        let path = dir.join("shared.sqlite");
        let keys = SqliteKeyStore::open(&path).unwrap();
        let state = crate::store::state::SqliteStateStore::open(&path).unwrap();
        let again = SqliteKeyStore::open(&path).unwrap();
        drop((keys, state, again));
        let conn = crate::store::sqlite::open(&path).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, crate::store::sqlite::SCHEMA_VERSION);
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(tables >= 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn budget_use_outlives_the_process_and_adds_up_across_writers() {
        let dir = std::env::temp_dir().join(format!("ai-router-budget-use-{}", std::process::id()));
        let path = dir.join("keys.sqlite");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let row = |subject: &str, until_ms: i64, tokens: u64| BudgetUse {
            budget: "team".into(),
            subject: subject.into(),
            until_ms,
            tokens,
            cost: 0.25,
        };
        let hour = now + 3_600_000;
        {
            let a = SqliteKeyStore::open(&path).unwrap();
            let b = SqliteKeyStore::open(&path).unwrap();
            a.record_report_usage(
                &[],
                &[row("key_a", hour, 100), row("key_a", now - 1, 9)],
                &[],
            )
            .unwrap();
            b.record_report_usage(
                &[],
                &[row("key_a", hour, 50), row("key_b", hour, 1)],
                &["batch-1".into()],
            )
            .unwrap();
            assert!(a.counted_batch("batch-1").unwrap());
        }
        // Another process, later: the same use, the ended window gone.
        let again = SqliteKeyStore::open(&path).unwrap();
        let used = again.budget_use(now).unwrap();
        assert_eq!(
            used.iter()
                .map(|r| (r.subject.as_str(), r.tokens))
                .collect::<Vec<_>>(),
            [("key_a", 150), ("key_b", 1)]
        );
        assert!((used[0].cost - 0.5).abs() < 1e-9);
        assert!(again.budget_use(hour).unwrap().is_empty());
        let memory = MemoryKeyStore::default();
        memory
            .record_report_usage(&[], &[row("key_a", hour, 3), row("key_a", hour, 4)], &[])
            .unwrap();
        assert_eq!(memory.budget_use(now).unwrap()[0].tokens, 7);
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
