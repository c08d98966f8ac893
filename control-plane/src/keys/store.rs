//! The key store: the virtual keys the gateway issues (`gateway.keyStore`) and their usage per
//! UTC day.
//!
//! A stored key keeps its SHA-256 (lowercase hex) and a hint (the last four characters of the
//! secret), never the secret: creating and rotating a key hand it out once.
//! Usage rows are per key id and UTC day (`YYYY-MM-DD`), for stored and mounted keys alike.
//!
//! Two backends:
//! - [`MemoryKeyStore`]: gone on restart (`{ type: memory }`);
//! - [`SqliteKeyStore`]: `{ type: sqlite, path }`. One schema, versioned with
//!   `PRAGMA user_version`; migrations run in one transaction, WAL is set outside it, a newer
//!   schema is refused. Several processes may share the file (the CLI writes while a server
//!   runs): every key change bumps a counter ([`KeyStore::generation`]) the server polls.
//!
//! Every call blocks; async callers run them with `spawn_blocking`. The operations on keys
//! (create, rotate, ...) are in `keys::operations`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::config::QuotaConfig;
use crate::keys::record::VirtualKeyRecord;
use crate::keys::token_record::{Scope, StoredToken};
use crate::store::lock;

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
    /// The store does not answer (a shared database away): try again later.
    #[error("key store unavailable: {0}")]
    Unavailable(String),
}

pub(super) fn storage(err: impl std::fmt::Display) -> KeyStoreError {
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
    /// The response cache for the key's calls, when the key says (else the policy's).
    pub cache: Option<bool>,
}

impl StoredKey {
    /// What the snapshot carries for it (the caller leaves revoked keys out). Takes the key:
    /// the snapshot is made from a fresh listing, and moving its strings instead of copying
    /// them halves what a push of 10,000 keys holds at once.
    pub fn into_record(self) -> VirtualKeyRecord {
        VirtualKeyRecord {
            enabled: self.enabled && !self.revoked,
            id: self.id,
            label: self.label,
            sha256: self.sha256,
            hint: self.hint,
            profiles: self.profiles,
            models: self.models,
            owner: self.owner,
            allow_fallback: self.allow_fallback,
            quota: Some(self.quota),
            mounted: false,
            quota_block: None,
            cache: self.cache,
        }
    }
}

/// One key's usage on one UTC day through one provider and model (a stored row), or added up
/// over those (a key's day: `provider` and `model` empty; a total over a range: `day` empty
/// too). A request counts on the lane that answered it last (empty when none did); tokens,
/// cost and savings on the lane of the attempt that used them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageDay {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub day: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    pub requests: u64,
    pub successes: u64,
    pub failures: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Of the prompt tokens, those the providers served from their cache.
    #[serde(default)]
    pub cached_tokens: u64,
    pub cost: f64,
    /// What cheaper lanes saved against the calls' configured first choice.
    #[serde(default)]
    pub saved: f64,
    pub latency_ms: u64,
    /// `success`, `error:<class>`, `rejected:<code>` -> count.
    pub outcomes: BTreeMap<String, u64>,
}

/// A stored usage row's identity: key id, day, provider, model.
pub type UsageRowId = (String, String, String, String);

impl UsageDay {
    /// This row's identity as `key`'s.
    pub fn row_id(&self, key: &str) -> UsageRowId {
        (
            key.to_owned(),
            self.day.clone(),
            self.provider.clone(),
            self.model.clone(),
        )
    }

    /// An empty row with this row's day, provider and model.
    pub fn empty_like(&self) -> UsageDay {
        UsageDay {
            day: self.day.clone(),
            provider: self.provider.clone(),
            model: self.model.clone(),
            ..UsageDay::default()
        }
    }

    pub fn add(&mut self, other: &UsageDay) {
        self.requests = self.requests.saturating_add(other.requests);
        self.successes = self.successes.saturating_add(other.successes);
        self.failures = self.failures.saturating_add(other.failures);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.cost += other.cost;
        self.saved += other.saved;
        self.latency_ms = self.latency_ms.saturating_add(other.latency_ms);
        for (outcome, count) in &other.outcomes {
            *self.outcomes.entry(outcome.clone()).or_insert(0) += count;
        }
    }
}

/// What a key used this UTC day and this UTC month: all its quota block needs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QuotaUsage {
    /// Prompt and completion tokens of the day.
    pub day_tokens: u64,
    pub day_cost: f64,
    pub month_cost: f64,
}

impl QuotaUsage {
    fn add(&mut self, row: &UsageDay, today: &str) {
        if row.day == today {
            self.day_tokens = self
                .day_tokens
                .saturating_add(row.prompt_tokens)
                .saturating_add(row.completion_tokens);
            self.day_cost += row.cost;
        }
        self.month_cost += row.cost;
    }
}

/// One budget policy's use by one subject in one calendar window (`budgets:`), counted in the
/// key store from the same charges as the usage rows (`keys::charge`), in the same transaction:
/// what a control plane enforces after a restart, and what control planes sharing the store
/// agree on. A row of a window that has ended is of no use and is dropped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetUse {
    /// The policy's name.
    pub budget: String,
    /// The key id, profile name or provider id; empty for the pool.
    pub subject: String,
    /// When the window ends (ms since the epoch): it names the window.
    pub until_ms: i64,
    pub tokens: u64,
    pub cost: f64,
}

impl BudgetUse {
    /// The row's identity: budget, subject and window.
    pub fn id(&self) -> (String, String, i64) {
        (self.budget.clone(), self.subject.clone(), self.until_ms)
    }
}

/// Adds `rows` to the rows by (budget, subject, window).
pub fn merge_budget_use(into: &mut BTreeMap<(String, String, i64), BudgetUse>, rows: &[BudgetUse]) {
    for row in rows {
        let entry = into.entry(row.id()).or_insert_with(|| BudgetUse {
            tokens: 0,
            cost: 0.0,
            ..row.clone()
        });
        entry.tokens = entry.tokens.saturating_add(row.tokens);
        entry.cost += row.cost;
    }
}

/// How long a counted report batch's id is kept: a batch is sent again within seconds of its
/// lost acknowledgement (or after the control plane's restart).
pub const REPORT_BATCH_RETENTION_MS: i64 = 86_400_000;

/// Where virtual keys and their usage live. Calls block.
pub trait KeyStore: Send + Sync {
    /// Adds a new key (its id and hash are unique).
    fn insert(&self, key: &StoredKey) -> Result<(), KeyStoreError>;
    /// Replaces the key with the same id; [`KeyStoreError::NotFound`] when there is none.
    fn replace(&self, key: &StoredKey) -> Result<(), KeyStoreError>;
    fn get(&self, id: &str) -> Result<Option<StoredKey>, KeyStoreError>;
    /// Every key, revoked ones included, oldest first.
    fn list(&self) -> Result<Vec<StoredKey>, KeyStoreError>;
    /// Adds `(key id, day row)` deltas to the day rows. `Ok` also when the store keeps them to
    /// write later (Postgres away): the caller must not give them again.
    fn record_usage(&self, rows: &[(String, UsageDay)]) -> Result<(), KeyStoreError> {
        self.record_report_usage(rows, &[], &[])
    }
    /// [`KeyStore::record_usage`] with the budgets' use of the same charges (`budgets`), and
    /// the report batches `batches` marked counted, all in one transaction where the store can
    /// ([`KeyStore::counted_batch`]).
    fn record_report_usage(
        &self,
        rows: &[(String, UsageDay)],
        budgets: &[BudgetUse],
        batches: &[String],
    ) -> Result<(), KeyStoreError>;
    /// Every budget's use in the windows that have not ended by `now_ms`.
    fn budget_use(&self, now_ms: i64) -> Result<Vec<BudgetUse>, KeyStoreError>;
    /// Whether the usage of report batch `id` is already counted (a store that does not mark
    /// batches never knows).
    fn counted_batch(&self, id: &str) -> Result<bool, KeyStoreError> {
        let _ = id;
        Ok(false)
    }
    /// The day rows of `id` from `from` to `to` (`YYYY-MM-DD`, inclusive), oldest first.
    fn usage(&self, id: &str, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError>;
    /// Every key's rows (only `key`'s when given) from `from` to `to` (`YYYY-MM-DD`,
    /// inclusive) added up per day, provider and model (no outcomes), oldest first: the spend
    /// per provider and model.
    fn lane_usage(
        &self,
        from: &str,
        to: &str,
        key: Option<&str>,
    ) -> Result<Vec<UsageDay>, KeyStoreError>;
    /// Every key's [`QuotaUsage`] over the days from `first` (the month's first) to `today`,
    /// in one read whatever the number of keys; a key with no row is absent.
    fn quota_usage(
        &self,
        first: &str,
        today: &str,
    ) -> Result<HashMap<String, QuotaUsage>, KeyStoreError>;
    /// A counter every key change bumps, whichever process made it.
    fn generation(&self) -> Result<u64, KeyStoreError>;
    /// Adds an admin token (its id and hash are unique; see [`crate::keys::admin_tokens`]).
    fn insert_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError>;
    /// Every admin token, revoked and expired ones included.
    fn admin_tokens(&self) -> Result<Vec<StoredToken>, KeyStoreError>;
    /// Writes an admin token's revocation and last use (by id).
    fn update_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError>;
}

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct MemoryInner {
    keys: Vec<StoredKey>,
    usage: BTreeMap<UsageRowId, UsageDay>,
    budgets: BTreeMap<(String, String, i64), BudgetUse>,
    generation: u64,
    admin_tokens: Vec<StoredToken>,
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

    fn record_report_usage(
        &self,
        rows: &[(String, UsageDay)],
        budgets: &[BudgetUse],
        _batches: &[String],
    ) -> Result<(), KeyStoreError> {
        // Memory does not outlive the process, nor does the usage router's own list of ids.
        let mut inner = lock(&self.inner);
        merge_budget_use(&mut inner.budgets, budgets);
        for (id, row) in rows {
            let entry = inner
                .usage
                .entry(row.row_id(id))
                .or_insert_with(|| row.empty_like());
            entry.add(row);
        }
        Ok(())
    }

    fn budget_use(&self, now_ms: i64) -> Result<Vec<BudgetUse>, KeyStoreError> {
        let mut inner = lock(&self.inner);
        inner.budgets.retain(|_, row| row.until_ms > now_ms);
        Ok(inner.budgets.values().cloned().collect())
    }

    fn usage(&self, id: &str, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError> {
        let inner = lock(&self.inner);
        let mut days: BTreeMap<&str, UsageDay> = BTreeMap::new();
        for ((key, day, _, _), row) in &inner.usage {
            if key == id && day.as_str() >= from && day.as_str() <= to {
                days.entry(day)
                    .or_insert_with(|| UsageDay {
                        day: day.clone(),
                        ..UsageDay::default()
                    })
                    .add(row);
            }
        }
        Ok(days.into_values().collect())
    }

    fn lane_usage(
        &self,
        from: &str,
        to: &str,
        key: Option<&str>,
    ) -> Result<Vec<UsageDay>, KeyStoreError> {
        let inner = lock(&self.inner);
        let mut lanes: BTreeMap<(&str, &str, &str), UsageDay> = BTreeMap::new();
        for ((id, day, provider, model), row) in &inner.usage {
            if day.as_str() >= from && day.as_str() <= to && key.is_none_or(|k| k == id) {
                let lane = lanes
                    .entry((day, provider, model))
                    .or_insert_with(|| row.empty_like());
                lane.add(row);
                lane.outcomes.clear();
            }
        }
        Ok(lanes.into_values().collect())
    }

    fn quota_usage(
        &self,
        first: &str,
        today: &str,
    ) -> Result<HashMap<String, QuotaUsage>, KeyStoreError> {
        let inner = lock(&self.inner);
        let mut out: HashMap<String, QuotaUsage> = HashMap::new();
        for ((id, day, _, _), row) in &inner.usage {
            if day.as_str() >= first && day.as_str() <= today {
                out.entry(id.clone()).or_default().add(row, today);
            }
        }
        Ok(out)
    }

    fn generation(&self) -> Result<u64, KeyStoreError> {
        Ok(lock(&self.inner).generation)
    }

    fn insert_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError> {
        let mut inner = lock(&self.inner);
        if inner
            .admin_tokens
            .iter()
            .any(|t| t.id == token.id || t.sha256 == token.sha256)
        {
            return Err(KeyStoreError::Storage(format!(
                "admin token {} already exists",
                token.id
            )));
        }
        inner.admin_tokens.push(token.clone());
        Ok(())
    }

    fn admin_tokens(&self) -> Result<Vec<StoredToken>, KeyStoreError> {
        Ok(lock(&self.inner).admin_tokens.clone())
    }

    fn update_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError> {
        let mut inner = lock(&self.inner);
        let slot = inner
            .admin_tokens
            .iter_mut()
            .find(|t| t.id == token.id)
            .ok_or_else(|| KeyStoreError::NotFound(format!("admin token {}", token.id)))?;
        slot.revoked = token.revoked;
        slot.last_used_ms = token.last_used_ms;
        Ok(())
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

/// The usage columns added up, in [`usage_from_row`]'s order after day, provider and model.
const USAGE_SUMS: &str = "SUM(requests), SUM(successes), SUM(failures), \
     SUM(prompt_tokens), SUM(completion_tokens), SUM(cost), SUM(latency_ms), \
     SUM(cached_tokens), SUM(saved)";

/// A usage row of `SELECT day, provider, model, {USAGE_SUMS}` (no outcomes).
fn usage_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<UsageDay> {
    Ok(UsageDay {
        day: row.get(0)?,
        provider: row.get(1)?,
        model: row.get(2)?,
        requests: sql_u64(row.get(3)?),
        successes: sql_u64(row.get(4)?),
        failures: sql_u64(row.get(5)?),
        prompt_tokens: sql_u64(row.get(6)?),
        completion_tokens: sql_u64(row.get(7)?),
        cost: row.get(8)?,
        latency_ms: sql_u64(row.get(9)?),
        cached_tokens: sql_u64(row.get(10)?),
        saved: row.get(11)?,
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
                 provider, model) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
                 ON CONFLICT (key_id, day, provider, model) DO UPDATE SET \
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
                "SELECT day, '', '', {USAGE_SUMS} FROM key_usage \
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
                "SELECT day, provider, model, {USAGE_SUMS} FROM key_usage \
                 WHERE day >= ?1 AND day <= ?2 AND (?3 IS NULL OR key_id = ?3) \
                 GROUP BY day, provider, model ORDER BY day, provider, model"
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

/// A stored token with the scope its row names (a row no binary wrote is an error).
pub(super) fn token_with_scope(
    token: StoredToken,
    scope: &str,
) -> Result<StoredToken, KeyStoreError> {
    let scope = Scope::parse(scope).ok_or_else(|| {
        KeyStoreError::Storage(format!("admin token {}: unknown scope {scope:?}", token.id))
    })?;
    Ok(StoredToken { scope, ..token })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_rows_written_before_provider_and_model_survive_the_migration() {
        let dir = std::env::temp_dir().join(format!("ai-router-migrate-{}", std::process::id()));
        let path = dir.join("keys.sqlite");
        let _ = std::fs::remove_file(&path);
        std::fs::create_dir_all(&dir).unwrap();
        // A file as the binary before usage rows had a lane wrote it.
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            for migration in &crate::store::sqlite::MIGRATIONS[..10] {
                conn.execute_batch(migration).unwrap();
            }
            conn.pragma_update(None, "user_version", 10).unwrap();
            conn.execute(
                "INSERT INTO key_usage (key_id, day, requests, prompt_tokens, cost) \
                 VALUES ('key_a', '2026-03-15', 3, 30, 0.5)",
                [],
            )
            .unwrap();
        }
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
