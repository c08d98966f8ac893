//! The key store: the virtual keys the gateway issues (`gateway.keyStore`) and their usage per
//! UTC day.
//!
//! A stored key keeps its SHA-256 (lowercase hex) and a hint (the last four characters of the
//! secret), never the secret: [`KeyAdmin::create`] and [`KeyAdmin::rotate`] hand it out once.
//! Usage rows are per key id and UTC day (`YYYY-MM-DD`), for stored and mounted keys alike.
//!
//! Two backends:
//! - [`MemoryKeyStore`]: gone on restart (`{ type: memory }`);
//! - [`SqliteKeyStore`]: `{ type: sqlite, path }`. One schema, versioned with
//!   `PRAGMA user_version`; migrations run in one transaction, WAL is set outside it, a newer
//!   schema is refused. Several processes may share the file (the CLI writes while a server
//!   runs): every key change bumps a counter ([`KeyStore::generation`]) the server polls.
//!
//! Every call blocks; async callers run them with `spawn_blocking`.
//!
//! [`KeyAdmin`] is the one implementation of the operations (create, list, get, update, revoke,
//! rotate, usage) the admin HTTP and gRPC APIs and the CLI's `--config` mode share; it knows the
//! mounted keys, which it lists but refuses to change.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::RngCore;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::config::secrets::{sha256_hex, Secret};
use crate::config::{PoolNames, QuotaConfig};
use crate::engine::Clock;
use crate::keys::mounted::{self, VirtualKeyRecord};

/// The schema this binary writes.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyStoreError {
    #[error("{0}")]
    Invalid(String),
    #[error("no key {0}")]
    NotFound(String),
    #[error("key {0} is mounted: change its secret or bindings in the deployment instead")]
    Mounted(String),
    #[error("key {0} is revoked")]
    Revoked(String),
    #[error("key store: {0}")]
    Storage(String),
}

fn storage(err: impl std::fmt::Display) -> KeyStoreError {
    KeyStoreError::Storage(err.to_string())
}

/// A key as the store holds it. `sha256` is the hash of the whole secret.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredKey {
    pub id: String,
    pub label: String,
    pub sha256: String,
    /// The last four characters of the secret.
    pub hint: String,
    pub owner: Option<String>,
    pub profiles: Vec<String>,
    pub models: Vec<String>,
    pub allow_fallback: bool,
    pub quota: QuotaConfig,
    pub enabled: bool,
    pub revoked: bool,
    pub created_at_ms: i64,
}

impl StoredKey {
    /// What the snapshot carries for it (the caller leaves revoked keys out).
    pub fn to_record(&self) -> VirtualKeyRecord {
        VirtualKeyRecord {
            id: self.id.clone(),
            label: self.label.clone(),
            sha256: self.sha256.clone(),
            hint: self.hint.clone(),
            profiles: self.profiles.clone(),
            models: self.models.clone(),
            owner: self.owner.clone(),
            allow_fallback: self.allow_fallback,
            enabled: self.enabled && !self.revoked,
            quota: Some(self.quota),
            mounted: false,
            quota_block: None,
        }
    }
}

/// One key's usage on one UTC day (or, as a total, over a range: `day` is then empty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageDay {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub day: String,
    pub requests: u64,
    pub successes: u64,
    pub failures: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost: f64,
    pub latency_ms: u64,
    /// `success`, `error:<class>`, `rejected:<code>` -> count.
    pub outcomes: BTreeMap<String, u64>,
}

impl UsageDay {
    pub fn add(&mut self, other: &UsageDay) {
        self.requests += other.requests;
        self.successes += other.successes;
        self.failures += other.failures;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.cost += other.cost;
        self.latency_ms += other.latency_ms;
        for (outcome, count) in &other.outcomes {
            *self.outcomes.entry(outcome.clone()).or_insert(0) += count;
        }
    }
}

/// Where virtual keys and their usage live. Calls block.
pub trait KeyStore: Send + Sync {
    /// Adds a new key (its id and hash are unique).
    fn insert(&self, key: &StoredKey) -> Result<(), KeyStoreError>;
    /// Replaces the key with the same id; [`KeyStoreError::NotFound`] when there is none.
    fn replace(&self, key: &StoredKey) -> Result<(), KeyStoreError>;
    fn get(&self, id: &str) -> Result<Option<StoredKey>, KeyStoreError>;
    /// Every key, revoked ones included, oldest first.
    fn list(&self) -> Result<Vec<StoredKey>, KeyStoreError>;
    /// Adds `(key id, day row)` deltas to the day rows.
    fn record_usage(&self, rows: &[(String, UsageDay)]) -> Result<(), KeyStoreError>;
    /// The day rows of `id` from `from` to `to` (`YYYY-MM-DD`, inclusive), oldest first.
    fn usage(&self, id: &str, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError>;
    /// A counter every key change bumps, whichever process made it.
    fn generation(&self) -> Result<u64, KeyStoreError>;
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct MemoryInner {
    keys: Vec<StoredKey>,
    usage: BTreeMap<(String, String), UsageDay>,
    generation: u64,
}

/// `{ type: memory }`: gone on restart.
#[derive(Debug, Default)]
pub struct MemoryKeyStore {
    inner: Mutex<MemoryInner>,
}

impl KeyStore for MemoryKeyStore {
    fn insert(&self, key: &StoredKey) -> Result<(), KeyStoreError> {
        let mut inner = lock(&self.inner);
        if inner
            .keys
            .iter()
            .any(|k| k.id == key.id || k.sha256 == key.sha256)
        {
            return Err(KeyStoreError::Storage(format!(
                "key {} already exists",
                key.id
            )));
        }
        inner.keys.push(key.clone());
        inner.generation += 1;
        Ok(())
    }

    fn replace(&self, key: &StoredKey) -> Result<(), KeyStoreError> {
        let mut inner = lock(&self.inner);
        let slot = inner
            .keys
            .iter_mut()
            .find(|k| k.id == key.id)
            .ok_or_else(|| KeyStoreError::NotFound(key.id.clone()))?;
        *slot = key.clone();
        inner.generation += 1;
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<StoredKey>, KeyStoreError> {
        Ok(lock(&self.inner).keys.iter().find(|k| k.id == id).cloned())
    }

    fn list(&self) -> Result<Vec<StoredKey>, KeyStoreError> {
        Ok(lock(&self.inner).keys.clone())
    }

    fn record_usage(&self, rows: &[(String, UsageDay)]) -> Result<(), KeyStoreError> {
        let mut inner = lock(&self.inner);
        for (id, row) in rows {
            let entry = inner
                .usage
                .entry((id.clone(), row.day.clone()))
                .or_insert_with(|| UsageDay {
                    day: row.day.clone(),
                    ..UsageDay::default()
                });
            entry.add(row);
        }
        Ok(())
    }

    fn usage(&self, id: &str, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError> {
        let inner = lock(&self.inner);
        Ok(inner
            .usage
            .range((id.to_owned(), from.to_owned())..=(id.to_owned(), to.to_owned()))
            .map(|(_, row)| row.clone())
            .collect())
    }

    fn generation(&self) -> Result<u64, KeyStoreError> {
        Ok(lock(&self.inner).generation)
    }
}

// ---------------------------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------------------------

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
     created_at_ms";

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

    fn conn(&self) -> MutexGuard<'_, Connection> {
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
        ];
        let changed = if insert {
            tx.execute(
                &format!(
                    "INSERT INTO virtual_keys ({KEY_COLUMNS}) VALUES \
                     (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
                ),
                values,
            )
            .map_err(storage)?
        } else {
            tx.execute(
                "UPDATE virtual_keys SET label = ?2, sha256 = ?3, hint = ?4, owner = ?5, \
                 profiles = ?6, models = ?7, allow_fallback = ?8, requests_per_minute = ?9, \
                 tokens_per_day = ?10, cost_per_day = ?11, cost_per_month = ?12, enabled = ?13, \
                 revoked = ?14, created_at_ms = ?15 WHERE id = ?1",
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

    fn record_usage(&self, rows: &[(String, UsageDay)]) -> Result<(), KeyStoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(storage)?;
        for (id, row) in rows {
            tx.execute(
                "INSERT INTO key_usage (key_id, day, requests, successes, failures, \
                 prompt_tokens, completion_tokens, cost, latency_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT (key_id, day) DO UPDATE SET \
                 requests = requests + excluded.requests, \
                 successes = successes + excluded.successes, \
                 failures = failures + excluded.failures, \
                 prompt_tokens = prompt_tokens + excluded.prompt_tokens, \
                 completion_tokens = completion_tokens + excluded.completion_tokens, \
                 cost = cost + excluded.cost, \
                 latency_ms = latency_ms + excluded.latency_ms",
                params![
                    id,
                    row.day,
                    u64_sql(row.requests),
                    u64_sql(row.successes),
                    u64_sql(row.failures),
                    u64_sql(row.prompt_tokens),
                    u64_sql(row.completion_tokens),
                    row.cost,
                    u64_sql(row.latency_ms),
                ],
            )
            .map_err(storage)?;
            for (outcome, count) in &row.outcomes {
                tx.execute(
                    "INSERT INTO key_usage_outcomes (key_id, day, outcome, count) \
                     VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (key_id, day, outcome) DO UPDATE SET \
                     count = count + excluded.count",
                    params![id, row.day, outcome, u64_sql(*count)],
                )
                .map_err(storage)?;
            }
        }
        tx.commit().map_err(storage)
    }

    fn usage(&self, id: &str, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT day, requests, successes, failures, prompt_tokens, completion_tokens, \
                 cost, latency_ms FROM key_usage WHERE key_id = ?1 AND day >= ?2 AND day <= ?3 \
                 ORDER BY day",
            )
            .map_err(storage)?;
        let rows = stmt
            .query_map(params![id, from, to], |row| {
                Ok(UsageDay {
                    day: row.get(0)?,
                    requests: sql_u64(row.get(1)?),
                    successes: sql_u64(row.get(2)?),
                    failures: sql_u64(row.get(3)?),
                    prompt_tokens: sql_u64(row.get(4)?),
                    completion_tokens: sql_u64(row.get(5)?),
                    cost: row.get(6)?,
                    latency_ms: sql_u64(row.get(7)?),
                    outcomes: BTreeMap::new(),
                })
            })
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
}

/// Opens the configured key store (blocking: SQLite opens and migrates the file).
pub fn open(spec: &crate::config::StoreSpec) -> Result<Arc<dyn KeyStore>, KeyStoreError> {
    Ok(match spec {
        crate::config::StoreSpec::Memory => Arc::new(MemoryKeyStore::default()),
        crate::config::StoreSpec::Sqlite(path) => Arc::new(
            SqliteKeyStore::open(path)
                .map_err(|e| KeyStoreError::Storage(format!("keyStore {}: {e}", path.display())))?,
        ),
    })
}

// ---------------------------------------------------------------------------------------------
// Dates (UTC days as `YYYY-MM-DD`)
// ---------------------------------------------------------------------------------------------

pub use ai_router_contract::calendar::utc_day;
use ai_router_contract::calendar::{civil_from_days, days_from_civil};

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_timestamp(ms: i64) -> String {
    let secs = ms.div_euclid(1000).rem_euclid(86_400);
    format!(
        "{}T{:02}:{:02}:{:02}Z",
        utc_day(ms),
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Checks `YYYY-MM-DD` names a real date.
pub fn parse_day(text: &str) -> Option<String> {
    let mut parts = text.split('-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let (y, m, d): (i64, u32, u32) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    if !(1..=12).contains(&m) || d == 0 {
        return None;
    }
    // Round-trip to reject 2026-02-30.
    (civil_from_days(days_from_civil(y, m, d)) == (y, m, d)).then(|| text.to_owned())
}

// ---------------------------------------------------------------------------------------------
// The operations
// ---------------------------------------------------------------------------------------------

/// `POST /admin/keys`, `keys create`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeySpec {
    pub label: String,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub profiles: Vec<String>,
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub allow_fallback: Option<bool>,
    #[serde(default)]
    pub quota: Option<QuotaConfig>,
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// A patch field that can be cleared: absent keeps the value, `null` clears it, a value sets it.
fn nullable<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// A change to a key's quota, merged field by field: an absent limit is kept, `null` removes
/// it, a number sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuotaPatch {
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub requests_per_minute: Option<Option<u64>>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub tokens_per_day: Option<Option<u64>>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub cost_per_day: Option<Option<f64>>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub cost_per_month: Option<Option<f64>>,
}

impl QuotaPatch {
    /// Sets every limit `quota` has (the limits it leaves out are kept).
    pub fn setting(quota: &QuotaConfig) -> Self {
        Self {
            requests_per_minute: quota.requests_per_minute.map(Some),
            tokens_per_day: quota.tokens_per_day.map(Some),
            cost_per_day: quota.cost_per_day.map(Some),
            cost_per_month: quota.cost_per_month.map(Some),
        }
    }

    /// `base` with this patch laid over it.
    pub fn apply(&self, base: QuotaConfig) -> QuotaConfig {
        QuotaConfig {
            requests_per_minute: self.requests_per_minute.unwrap_or(base.requests_per_minute),
            tokens_per_day: self.tokens_per_day.unwrap_or(base.tokens_per_day),
            cost_per_day: self.cost_per_day.unwrap_or(base.cost_per_day),
            cost_per_month: self.cost_per_month.unwrap_or(base.cost_per_month),
        }
    }
}

/// `PATCH /admin/keys/{id}`, `keys update`: each field given replaces the key's, except
/// `quota`, which is merged limit by limit ([`QuotaPatch`]); `quota: null` removes every limit.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyPatch {
    /// An empty string clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiles: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_fallback: Option<bool>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub quota: Option<Option<QuotaPatch>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A key as the admin surfaces show it: never a secret or a hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyInfo {
    pub id: String,
    pub label: String,
    pub owner: Option<String>,
    pub profiles: Vec<String>,
    pub models: Vec<String>,
    pub allow_fallback: bool,
    pub quota: QuotaConfig,
    pub enabled: bool,
    pub revoked: bool,
    pub mounted: bool,
    /// The last four characters of the secret.
    pub hint: String,
    /// 0 for a mounted key.
    pub created_at_ms: i64,
    pub created: Option<String>,
}

impl KeyInfo {
    fn stored(key: &StoredKey) -> Self {
        Self {
            id: key.id.clone(),
            label: key.label.clone(),
            owner: key.owner.clone(),
            profiles: key.profiles.clone(),
            models: key.models.clone(),
            allow_fallback: key.allow_fallback,
            quota: key.quota,
            enabled: key.enabled,
            revoked: key.revoked,
            mounted: false,
            hint: key.hint.clone(),
            created_at_ms: key.created_at_ms,
            created: Some(utc_timestamp(key.created_at_ms)),
        }
    }

    fn mounted(key: &VirtualKeyRecord) -> Self {
        Self {
            id: key.id.clone(),
            label: key.label.clone(),
            owner: key.owner.clone(),
            profiles: key.profiles.clone(),
            models: key.models.clone(),
            allow_fallback: key.allow_fallback,
            quota: key.quota.unwrap_or_default(),
            enabled: key.enabled,
            revoked: false,
            mounted: true,
            hint: key.hint.clone(),
            created_at_ms: 0,
            created: None,
        }
    }
}

/// A key and its secret, shown once (create, rotate).
#[derive(Debug, Clone, Serialize)]
pub struct KeyWithSecret {
    pub key: KeyInfo,
    pub secret: String,
}

/// `GET /admin/keys/{id}/usage`: day rows and their total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    pub id: String,
    pub from: String,
    pub to: String,
    pub days: Vec<UsageDay>,
    pub total: UsageDay,
}

fn valid_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 64
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn check_bindings(profiles: &[String], models: &[String]) -> Result<(), KeyStoreError> {
    if profiles.is_empty() && models.is_empty() {
        return Err(KeyStoreError::Invalid(
            "a key needs at least one profile or model".to_owned(),
        ));
    }
    if profiles.iter().chain(models).any(|n| n.trim().is_empty()) {
        return Err(KeyStoreError::Invalid(
            "profile and model names cannot be empty".to_owned(),
        ));
    }
    Ok(())
}

/// Refuses a profile or model name the pool does not have (`*` is always allowed).
fn check_known(
    pool: Option<&PoolNames>,
    profiles: &[String],
    models: &[String],
) -> Result<(), KeyStoreError> {
    let Some(pool) = pool else { return Ok(()) };
    for (i, profile) in profiles.iter().enumerate() {
        if profile != WILDCARD && !pool.profiles.contains(profile) {
            let known: Vec<&str> = pool.profiles.iter().map(String::as_str).collect();
            return Err(KeyStoreError::Invalid(format!(
                "profiles[{i}]: the pool has no profile `{profile}` (it has: {}); use \"*\" for every profile",
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            )));
        }
    }
    for (i, model) in models.iter().enumerate() {
        if model != WILDCARD && !pool.models.contains(model) {
            return Err(KeyStoreError::Invalid(format!(
                "models[{i}]: no provider in the pool serves a model with id or alias `{model}`; \
                 name a pool model id or alias, or use \"*\" for every model"
            )));
        }
    }
    Ok(())
}

const WILDCARD: &str = "*";

fn check_quota(quota: &QuotaConfig) -> Result<(), KeyStoreError> {
    for (name, value) in [
        ("costPerDay", quota.cost_per_day),
        ("costPerMonth", quota.cost_per_month),
    ] {
        if value.is_some_and(|v| !v.is_finite() || v < 0.0) {
            return Err(KeyStoreError::Invalid(format!(
                "quota.{name} must be a number of at least 0"
            )));
        }
    }
    Ok(())
}

fn hint_of(secret: &Secret) -> String {
    mounted::hint(secret.expose())
}

fn new_key_id() -> String {
    let mut bytes = [0u8; 8];
    rand::rng().fill_bytes(&mut bytes);
    format!("key_{}", hex::encode(bytes))
}

/// The key operations over a store and the mounted keys.
pub struct KeyAdmin {
    store: Arc<dyn KeyStore>,
    mounted: Vec<VirtualKeyRecord>,
    clock: Arc<dyn Clock>,
    /// The names a key may be bound to; `None` checks nothing (a store opened without its pool).
    pool: Option<PoolNames>,
}

impl std::fmt::Debug for KeyAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyAdmin")
            .field("mounted", &self.mounted.len())
            .finish_non_exhaustive()
    }
}

impl KeyAdmin {
    pub fn new(
        store: Arc<dyn KeyStore>,
        mounted: Vec<VirtualKeyRecord>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            store,
            mounted,
            clock,
            pool: None,
        }
    }

    /// Refuses bindings to profiles and models `pool` does not have.
    pub fn with_pool(mut self, pool: PoolNames) -> Self {
        self.pool = Some(pool);
        self
    }

    pub fn store(&self) -> &Arc<dyn KeyStore> {
        &self.store
    }

    pub fn mounted(&self) -> &[VirtualKeyRecord] {
        &self.mounted
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn is_mounted(&self, id: &str) -> bool {
        self.mounted.iter().any(|k| k.id == id)
    }

    fn stored(&self, id: &str) -> Result<StoredKey, KeyStoreError> {
        if self.is_mounted(id) {
            return Err(KeyStoreError::Mounted(id.to_owned()));
        }
        self.store
            .get(id)?
            .ok_or_else(|| KeyStoreError::NotFound(id.to_owned()))
    }

    /// A fresh secret whose hash and id collide with no mounted key.
    fn fresh(&self, label: &str) -> (Secret, String) {
        loop {
            let secret = mounted::generate_secret(label);
            let hash = sha256_hex(secret.expose());
            if !self.mounted.iter().any(|k| k.sha256 == hash) {
                return (secret, hash);
            }
        }
    }

    pub fn create(&self, spec: KeySpec) -> Result<KeyWithSecret, KeyStoreError> {
        if !valid_label(&spec.label) {
            return Err(KeyStoreError::Invalid(
                "label must be 1 to 64 of lowercase letters, digits and _".to_owned(),
            ));
        }
        check_bindings(&spec.profiles, &spec.models)?;
        check_known(self.pool.as_ref(), &spec.profiles, &spec.models)?;
        let quota = spec.quota.unwrap_or_default();
        check_quota(&quota)?;
        let (secret, sha256) = self.fresh(&spec.label);
        let mut id = new_key_id();
        while self.is_mounted(&id) {
            id = new_key_id();
        }
        let key = StoredKey {
            id,
            label: spec.label,
            sha256,
            hint: hint_of(&secret),
            owner: spec.owner.filter(|o| !o.is_empty()),
            profiles: spec.profiles,
            models: spec.models,
            allow_fallback: spec.allow_fallback.unwrap_or(true),
            quota,
            enabled: spec.enabled.unwrap_or(true),
            revoked: false,
            created_at_ms: self.clock.now_ms(),
        };
        self.store.insert(&key)?;
        Ok(KeyWithSecret {
            key: KeyInfo::stored(&key),
            secret: secret.expose().to_owned(),
        })
    }

    /// Mounted keys first, then stored ones (revoked included).
    pub fn list(&self) -> Result<Vec<KeyInfo>, KeyStoreError> {
        let mut keys: Vec<KeyInfo> = self.mounted.iter().map(KeyInfo::mounted).collect();
        keys.extend(self.store.list()?.iter().map(KeyInfo::stored));
        Ok(keys)
    }

    pub fn get(&self, id: &str) -> Result<KeyInfo, KeyStoreError> {
        if let Some(key) = self.mounted.iter().find(|k| k.id == id) {
            return Ok(KeyInfo::mounted(key));
        }
        self.store
            .get(id)?
            .map(|k| KeyInfo::stored(&k))
            .ok_or_else(|| KeyStoreError::NotFound(id.to_owned()))
    }

    pub fn update(&self, id: &str, patch: KeyPatch) -> Result<KeyInfo, KeyStoreError> {
        let mut key = self.stored(id)?;
        if key.revoked {
            return Err(KeyStoreError::Revoked(id.to_owned()));
        }
        if let Some(owner) = patch.owner {
            key.owner = (!owner.is_empty()).then_some(owner);
        }
        let patch_profiles = patch.profiles.clone();
        let patch_models = patch.models.clone();
        if let Some(profiles) = patch.profiles {
            key.profiles = profiles;
        }
        if let Some(models) = patch.models {
            key.models = models;
        }
        if let Some(allow) = patch.allow_fallback {
            key.allow_fallback = allow;
        }
        match patch.quota {
            None => {}
            Some(None) => key.quota = QuotaConfig::default(),
            Some(Some(change)) => {
                let quota = change.apply(key.quota);
                check_quota(&quota)?;
                key.quota = quota;
            }
        }
        if let Some(enabled) = patch.enabled {
            key.enabled = enabled;
        }
        check_bindings(&key.profiles, &key.models)?;
        // Only what this patch names: a key bound before a profile left the pool keeps working
        // until its bindings are changed.
        check_known(
            self.pool.as_ref(),
            patch_profiles.as_deref().unwrap_or_default(),
            patch_models.as_deref().unwrap_or_default(),
        )?;
        self.store.replace(&key)?;
        Ok(KeyInfo::stored(&key))
    }

    /// Revokes for good; revoking a revoked key changes nothing.
    pub fn revoke(&self, id: &str) -> Result<KeyInfo, KeyStoreError> {
        let mut key = self.stored(id)?;
        if !key.revoked {
            key.revoked = true;
            self.store.replace(&key)?;
        }
        Ok(KeyInfo::stored(&key))
    }

    /// A new secret for the same id, bindings and usage; the old secret stops working.
    pub fn rotate(&self, id: &str) -> Result<KeyWithSecret, KeyStoreError> {
        let mut key = self.stored(id)?;
        if key.revoked {
            return Err(KeyStoreError::Revoked(id.to_owned()));
        }
        let (secret, sha256) = self.fresh(&key.label);
        key.sha256 = sha256;
        key.hint = hint_of(&secret);
        self.store.replace(&key)?;
        Ok(KeyWithSecret {
            key: KeyInfo::stored(&key),
            secret: secret.expose().to_owned(),
        })
    }

    /// Day rows from `from` to `to` (inclusive; default: the first of this month to today).
    pub fn usage(
        &self,
        id: &str,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<UsageReport, KeyStoreError> {
        // Exists (mounted or stored)?
        self.get(id)?;
        let today = utc_day(self.clock.now_ms());
        let day = |given: Option<&str>, name: &str, default: String| match given {
            None | Some("") => Ok(default),
            Some(text) => parse_day(text).ok_or_else(|| {
                KeyStoreError::Invalid(format!("{name} must be a date as YYYY-MM-DD"))
            }),
        };
        let from = day(from, "from", format!("{}-01", &today[..7]))?;
        let to = day(to, "to", today)?;
        if from > to {
            return Err(KeyStoreError::Invalid("from is after to".to_owned()));
        }
        let days = self.store.usage(id, &from, &to)?;
        let mut total = UsageDay::default();
        for row in &days {
            total.add(row);
        }
        Ok(UsageReport {
            id: id.to_owned(),
            from,
            to,
            days,
            total,
        })
    }

    /// The snapshot's virtual keys: the mounted ones, then every stored key that is not
    /// revoked (a disabled one with `enabled: false`). A stored key that shares a hash with a
    /// mounted one is left out. Each carries the quota block its usage puts on it now.
    pub fn snapshot_keys(&self) -> Result<Vec<VirtualKeyRecord>, KeyStoreError> {
        let mut keys = self.mounted.clone();
        for key in self.store.list()? {
            if key.revoked || self.mounted.iter().any(|m| m.sha256 == key.sha256) {
                continue;
            }
            keys.push(key.to_record());
        }
        crate::keys::quotas::with_blocks(self.store.as_ref(), &mut keys, self.clock.now_ms())?;
        Ok(keys)
    }

    /// A mounted key whose secret or id a stored key also holds: the gateway refuses to start.
    pub fn check_collisions(&self) -> Result<(), mounted::MountedKeyError> {
        let stored = self
            .store
            .list()
            .map_err(|e| mounted::MountedKeyError::Collision {
                label: "-".to_owned(),
                id: "-".to_owned(),
                reason: e.to_string(),
            })?;
        for mounted in &self.mounted {
            if let Some(other) = stored
                .iter()
                .find(|k| k.id == mounted.id || k.sha256 == mounted.sha256)
            {
                let what = if other.id == mounted.id {
                    "id"
                } else {
                    "secret"
                };
                return Err(mounted::MountedKeyError::Collision {
                    label: mounted.label.clone(),
                    id: mounted.id.clone(),
                    reason: format!("the stored key {} holds the same {what}", other.id),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::SystemClock;
    use std::sync::atomic::AtomicI64;

    use crate::engine::TestClock;

    // 2026-03-15T12:00:00Z
    const MARCH_15: i64 = 1_773_576_000_000;

    fn temp_path(name: &str) -> std::path::PathBuf {
        std::env::temp_dir()
            .join(format!(
                "ai-router-keys-{}-{name}-{}",
                std::process::id(),
                rand::rng().next_u32()
            ))
            .join("keys.sqlite")
    }

    fn spec(label: &str) -> KeySpec {
        KeySpec {
            label: label.into(),
            profiles: vec!["work".into()],
            ..KeySpec::default()
        }
    }

    fn mounted_record() -> VirtualKeyRecord {
        VirtualKeyRecord {
            id: mounted::mounted_id("app"),
            label: "app".into(),
            sha256: sha256_hex("sk-starci-app-x"),
            hint: "pp-x".into(),
            profiles: vec!["*".into()],
            models: vec![],
            owner: None,
            allow_fallback: true,
            enabled: true,
            quota: None,
            mounted: true,
            quota_block: None,
        }
    }

    fn exercise(store: Arc<dyn KeyStore>) -> Result<(), KeyStoreError> {
        let clock = Arc::new(TestClock(AtomicI64::new(MARCH_15)));
        let admin = KeyAdmin::new(store.clone(), vec![mounted_record()], clock.clone());
        let g0 = store.generation()?;
        let created = admin.create(KeySpec {
            owner: Some("team".into()),
            quota: Some(QuotaConfig {
                requests_per_minute: Some(60),
                cost_per_month: Some(20.5),
                ..QuotaConfig::default()
            }),
            ..spec("lesson_app")
        })?;
        assert!(created.secret.starts_with("sk-starci-lesson_app-"));
        assert_eq!(created.secret.len(), "sk-starci-lesson_app-".len() + 48);
        assert!(mounted::check_secret("lesson_app", &created.secret).is_ok());
        let id = created.key.id.clone();
        assert!(id.starts_with("key_") && id.len() == 20, "{id}");
        assert_eq!(created.key.hint, created.secret[created.secret.len() - 4..]);
        assert!(store.generation()? > g0);
        let stored = store.get(&id)?.ok_or(KeyStoreError::NotFound(id.clone()))?;
        assert_eq!(stored.sha256, sha256_hex(&created.secret));
        assert_eq!(stored.quota.requests_per_minute, Some(60));
        assert_eq!(stored.quota.cost_per_month, Some(20.5));
        assert_eq!(stored.owner.as_deref(), Some("team"));
        assert_eq!(stored.created_at_ms, MARCH_15);

        // Listing: mounted first, never a secret or hash.
        let list = admin.list()?;
        assert_eq!(list.len(), 2);
        assert!(list[0].mounted && !list[1].mounted);
        let text = serde_json::to_string(&list).map_err(storage)?;
        assert!(!text.contains(&created.secret) && !text.contains(&stored.sha256));

        // Snapshot keys: enabled stored keys join the mounted one.
        assert_eq!(admin.snapshot_keys()?.len(), 2);

        // Update.
        let updated = admin.update(
            &id,
            KeyPatch {
                enabled: Some(false),
                models: Some(vec!["m1".into()]),
                ..KeyPatch::default()
            },
        )?;
        assert!(!updated.enabled);
        assert_eq!(updated.models, ["m1"]);
        assert_eq!(updated.profiles, ["work"]);
        let records = admin.snapshot_keys()?;
        assert!(!records[1].enabled);
        assert!(matches!(
            admin.update(
                &id,
                KeyPatch {
                    profiles: Some(vec![]),
                    models: Some(vec![]),
                    ..KeyPatch::default()
                }
            ),
            Err(KeyStoreError::Invalid(_))
        ));

        // Rotate: same id, new hash.
        let rotated = admin.rotate(&id)?;
        assert_eq!(rotated.key.id, id);
        assert_ne!(rotated.secret, created.secret);
        let after = store.get(&id)?.ok_or(KeyStoreError::NotFound(id.clone()))?;
        assert_eq!(after.sha256, sha256_hex(&rotated.secret));
        assert_eq!(after.models, ["m1"]);

        // Mounted keys are read-only.
        let mounted = mounted::mounted_id("app");
        assert!(admin.get(&mounted)?.mounted);
        assert_eq!(
            admin.revoke(&mounted),
            Err(KeyStoreError::Mounted(mounted.clone()))
        );
        assert_eq!(
            admin.rotate(&mounted).map(|_| ()),
            Err(KeyStoreError::Mounted(mounted.clone()))
        );
        assert_eq!(
            admin.update(&mounted, KeyPatch::default()),
            Err(KeyStoreError::Mounted(mounted.clone()))
        );
        assert_eq!(
            admin.get("key_nope"),
            Err(KeyStoreError::NotFound("key_nope".into()))
        );

        // Revoke: gone from the snapshot, for good.
        assert!(admin.revoke(&id)?.revoked);
        assert!(admin.revoke(&id)?.revoked);
        assert_eq!(admin.snapshot_keys()?.len(), 1);
        assert_eq!(
            admin.rotate(&id).map(|_| ()),
            Err(KeyStoreError::Revoked(id.clone()))
        );

        // Usage rows add up per day; the default range is this month.
        let row = |day: &str, outcome: &str| UsageDay {
            day: day.into(),
            requests: 1,
            successes: u64::from(outcome == "success"),
            failures: u64::from(outcome != "success"),
            prompt_tokens: 10,
            completion_tokens: 5,
            cost: 0.25,
            latency_ms: 100,
            outcomes: [(outcome.to_owned(), 1)].into_iter().collect(),
        };
        store.record_usage(&[
            (id.clone(), row("2026-03-14", "success")),
            (id.clone(), row("2026-03-15", "success")),
            (id.clone(), row("2026-02-28", "success")),
            ("key_other".into(), row("2026-03-15", "success")),
        ])?;
        store.record_usage(&[(id.clone(), row("2026-03-15", "error:upstream"))])?;
        let report = admin.usage(&id, None, None)?;
        assert_eq!(
            (report.from.as_str(), report.to.as_str()),
            ("2026-03-01", "2026-03-15")
        );
        assert_eq!(report.days.len(), 2);
        assert_eq!(report.days[1].requests, 2);
        assert_eq!(report.days[1].outcomes["success"], 1);
        assert_eq!(report.days[1].outcomes["error:upstream"], 1);
        assert_eq!(report.total.requests, 3);
        assert_eq!(report.total.prompt_tokens, 30);
        assert!((report.total.cost - 0.75).abs() < 1e-9);
        let report = admin.usage(&id, Some("2026-02-01"), Some("2026-02-28"))?;
        assert_eq!(report.days.len(), 1);
        assert!(matches!(
            admin.usage(&id, Some("2026-02-30"), None),
            Err(KeyStoreError::Invalid(_))
        ));
        assert!(matches!(
            admin.usage(&id, Some("2026-03-10"), Some("2026-03-01")),
            Err(KeyStoreError::Invalid(_))
        ));
        assert_eq!(admin.usage(&mounted, None, None)?.days.len(), 0);

        // Invalid specs.
        for bad in [
            spec("Upper"),
            spec(""),
            KeySpec {
                profiles: vec![],
                ..spec("ok")
            },
        ] {
            assert!(matches!(admin.create(bad), Err(KeyStoreError::Invalid(_))));
        }
        Ok(())
    }

    #[test]
    fn memory_store() -> Result<(), KeyStoreError> {
        exercise(Arc::new(MemoryKeyStore::default()))
    }

    #[test]
    fn sqlite_store_round_trips_and_is_shared() -> Result<(), Box<dyn std::error::Error>> {
        let path = temp_path("shared");
        exercise(Arc::new(SqliteKeyStore::open(&path)?))?;
        // A second connection (another process) sees the keys and bumps the same counter.
        let one = SqliteKeyStore::open(&path)?;
        let two = SqliteKeyStore::open(&path)?;
        let before = one.generation()?;
        let admin = KeyAdmin::new(Arc::new(two), Vec::new(), Arc::new(SystemClock));
        let created = admin.create(spec("other"))?;
        assert!(one.generation()? > before);
        assert!(one.get(&created.key.id)?.is_some());
        assert_eq!(one.list()?.len(), 2);
        // A newer schema is refused.
        one.conn().pragma_update(
            None,
            "user_version",
            crate::store::sqlite::SCHEMA_VERSION + 1,
        )?;
        drop(one);
        let refused = SqliteKeyStore::open(&path).map(|_| ());
        assert!(
            matches!(&refused, Err(KeyStoreError::Storage(m)) if m.contains("newer")),
            "{refused:?}"
        );
        if let Some(dir) = path.parent() {
            std::fs::remove_dir_all(dir)?;
        }
        Ok(())
    }

    #[test]
    fn collisions_with_mounted_keys_are_found() -> Result<(), KeyStoreError> {
        let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::default());
        let mounted = mounted_record();
        store.insert(&StoredKey {
            id: "key_0000000000000001".into(),
            label: "app".into(),
            sha256: mounted.sha256.clone(),
            hint: "x".into(),
            owner: None,
            profiles: vec!["*".into()],
            models: vec![],
            allow_fallback: true,
            quota: QuotaConfig::default(),
            enabled: true,
            revoked: false,
            created_at_ms: 0,
        })?;
        let admin = KeyAdmin::new(store, vec![mounted], Arc::new(SystemClock));
        let err = admin.check_collisions().map_err(|e| e.to_string());
        assert!(
            matches!(&err, Err(m) if m.contains("same secret") && m.contains("app")),
            "{err:?}"
        );
        Ok(())
    }

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
}
