//! The key store: the virtual keys the gateway issues (`gateway.keyStore`) and their usage per
//! UTC day.
//!
//! A stored key keeps its SHA-256 (lowercase hex) and a hint (the last four characters of the
//! secret), never the secret: creating and rotating a key hand it out once.
//! Usage rows are per key id and UTC day (`YYYY-MM-DD`), for stored and mounted keys alike.
//!
//! Two backends besides Postgres:
//! - [`MemoryKeyStore`](super::memory::MemoryKeyStore): gone on restart (`{ type: memory }`);
//! - [`SqliteKeyStore`](super::sqlite::SqliteKeyStore): `{ type: sqlite, path }`. One schema, versioned with
//!   `PRAGMA user_version`; migrations run in one transaction, WAL is set outside it, a newer
//!   schema is refused. Several processes may share the file (the CLI writes while a server
//!   runs): every key change bumps a counter ([`KeyStore::generation`]) the server polls.
//!
//! Every call blocks; async callers run them with `spawn_blocking`. The operations on keys
//! (create, rotate, ...) are in `keys::operations`.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::config::QuotaConfig;
use crate::keys::record::VirtualKeyRecord;
use crate::keys::token_record::{Scope, StoredToken};

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

/// One key's usage on one UTC day through one provider and model by one client protocol (a
/// stored row), or added up over those (a key's day: `provider`, `model` and `protocol` empty;
/// a total over a range: `day` empty too). A request counts on the lane that answered it last
/// (empty when none did); tokens, cost and savings on the lane of the attempt that used them;
/// all of them on the protocol the client called by (`RequestOutcome.protocol`, which each of
/// its attempts carries too: `chat`, `responses`, `messages`, `gemini`, `embeddings`; empty
/// from a data plane too old to say, shown as [`protocol_name`] says).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageDay {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub day: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol: String,
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

/// A stored usage row's identity: key id, day, provider, model, protocol.
pub type UsageRowId = (String, String, String, String, String);

/// A client protocol as shown (the console's calls and spend per protocol): `unknown` for the
/// empty one of a data plane too old to say.
pub fn protocol_name(protocol: &str) -> &str {
    if protocol.is_empty() {
        "unknown"
    } else {
        protocol
    }
}

impl UsageDay {
    /// This row's identity as `key`'s.
    pub fn row_id(&self, key: &str) -> UsageRowId {
        (
            key.to_owned(),
            self.day.clone(),
            self.provider.clone(),
            self.model.clone(),
            self.protocol.clone(),
        )
    }

    /// An empty row with this row's day, provider, model and protocol.
    pub fn empty_like(&self) -> UsageDay {
        UsageDay {
            day: self.day.clone(),
            provider: self.provider.clone(),
            model: self.model.clone(),
            protocol: self.protocol.clone(),
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
    pub(super) fn add(&mut self, row: &UsageDay, today: &str) {
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
    /// Hands every key to `each`, oldest first, as [`KeyStore::list`] orders them, without
    /// holding them all: what the key sync reads (at 10,000 keys the listing's vector alone was
    /// 8 MB of the control plane's peak, next to the records made from it).
    fn each(&self, each: &mut dyn FnMut(StoredKey)) -> Result<(), KeyStoreError> {
        self.list()?.into_iter().for_each(each);
        Ok(())
    }
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
    /// The day rows of `id` from `from` to `to` (`YYYY-MM-DD`, inclusive), oldest first: its
    /// rows of each day added up over providers, models and protocols.
    fn usage(&self, id: &str, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError>;
    /// Every key's rows (only `key`'s when given) from `from` to `to` (`YYYY-MM-DD`,
    /// inclusive) added up per day, provider, model and protocol (no outcomes), oldest first:
    /// the spend per provider, model and protocol.
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
