//! The key operations (create, list, get, update, revoke, rotate, usage) the admin HTTP and gRPC
//! APIs and the CLI's `--config` mode share, over a [`KeyStore`] and the mounted keys, which
//! [`KeyAdmin`] lists but refuses to change. A stored key's secret is handed out once, by
//! [`KeyAdmin::create`] and [`KeyAdmin::rotate`].

use std::sync::{Arc, RwLock};

use ai_router_contract::{defaults, BINDING_WILDCARD};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::config::secrets::{sha256_hex, Secret};
use crate::config::{PoolNames, QuotaConfig};
use crate::keys::mounted;
use crate::keys::record::VirtualKeyRecord;
use crate::keys::store::{
    parse_day, utc_day, utc_timestamp, KeyStore, KeyStoreError, StoredKey, UsageDay,
};

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
    /// The response cache for the key's calls (unset: the policy decides).
    #[serde(default)]
    pub cache: Option<bool>,
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
    /// `true`/`false` sets the key's response-cache choice, `null` leaves it to the policy.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache: Option<Option<bool>>,
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
    /// The key's response-cache choice; absent: the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<bool>,
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
            cache: key.cache,
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
            cache: key.cache,
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

/// Whether `id` has the shape every key id has (`key_` and hex digits, stored and mounted
/// alike). Any other id is no key's: 404 without asking the store, so a hostile id (NUL, which
/// Postgres refuses in a text parameter, or 10 KB) never reaches a query.
fn well_formed_id(id: &str) -> bool {
    id.strip_prefix("key_").is_some_and(|hex| {
        (1..=64).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// The longest `owner` a key may carry (bytes): a name or an address, not a document.
pub const MAX_OWNER_BYTES: usize = 256;

/// Whether `c` may not stand in an owner: a control character (NUL, which Postgres cannot
/// store in text, newlines that forge log lines) or a bidirectional control (U+202A..U+202E,
/// U+2066..U+2069, U+200E, U+200F), which makes a listing show text in another order than it
/// holds.
fn refused_in_owner(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
}

fn check_owner(owner: Option<&str>) -> Result<(), KeyStoreError> {
    match owner {
        Some(o) if o.len() > MAX_OWNER_BYTES => Err(KeyStoreError::Invalid(format!(
            "owner must be at most {MAX_OWNER_BYTES} bytes"
        ))),
        Some(o) if o.chars().any(refused_in_owner) => Err(KeyStoreError::Invalid(
            "owner cannot hold control characters or bidirectional text controls".to_owned(),
        )),
        _ => Ok(()),
    }
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
        if profile != BINDING_WILDCARD && !pool.profiles.contains(profile) {
            let known: Vec<&str> = pool.profiles.iter().map(String::as_str).collect();
            return Err(KeyStoreError::Invalid(format!(
                "profiles[{i}]: the pool has no profile `{profile}` (it has: {}); use \"*\" for every profile",
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            )));
        }
    }
    for (i, model) in models.iter().enumerate() {
        if model != BINDING_WILDCARD && !pool.models.contains(model) {
            return Err(KeyStoreError::Invalid(format!(
                "models[{i}]: no provider in the pool serves a model with id or alias `{model}`; \
                 name a pool model id or alias, or use \"*\" for every model"
            )));
        }
    }
    Ok(())
}

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
    /// Replaced whole by a reload ([`KeyAdmin::replace_pool`]).
    mounted: RwLock<Arc<Vec<VirtualKeyRecord>>>,
    clock: Arc<dyn Clock>,
    /// The names a key may be bound to; `None` checks nothing (a store opened without its pool).
    pool: RwLock<Option<PoolNames>>,
    /// The store's generation the engine's keys were last listed at, plus one (0: never).
    pushed: std::sync::atomic::AtomicU64,
    /// Held across a push (generation read, listing, engine set, generation noted), so two
    /// pushes never cross and leave an older listing noted as the newer generation.
    push: std::sync::Mutex<()>,
    /// Whether usage rows move anything pushed (a key with a usage limit, a budget policy), as
    /// the last push or recheck found; true until one has run.
    usage_moves: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for KeyAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyAdmin")
            .field("mounted", &self.mounted().len())
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
            mounted: RwLock::new(Arc::new(mounted)),
            clock,
            pool: RwLock::new(None),
            pushed: std::sync::atomic::AtomicU64::new(0),
            push: std::sync::Mutex::new(()),
            usage_moves: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Held while the engine's keys are listed and set ([`crate::api::admin::push_keys`]).
    pub fn pushing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.push.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes whether usage rows move anything pushed (what a push or recheck found).
    pub fn note_usage_moves(&self, moves: bool) {
        self.usage_moves
            .store(moves, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether usage rows move anything pushed: the key sync rechecks after usage writes only
    /// then.
    pub fn usage_moves(&self) -> bool {
        self.usage_moves.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes that the engine's keys were listed from the store at `generation` (read before
    /// the listing, so the listing holds at least what that generation counts).
    pub fn note_pushed(&self, generation: u64) {
        self.pushed.store(
            generation.saturating_add(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The store's generation the engine's keys were last listed at.
    pub fn pushed_generation(&self) -> Option<u64> {
        self.pushed
            .load(std::sync::atomic::Ordering::Relaxed)
            .checked_sub(1)
    }

    /// Refuses bindings to profiles and models `pool` does not have.
    pub fn with_pool(self, pool: PoolNames) -> Self {
        *write(&self.pool) = Some(pool);
        self
    }

    /// A reloaded pool: its mounted keys (refused, and nothing changed, when one collides with
    /// a stored key) and the names keys may be bound to from now on.
    pub fn replace_pool(
        &self,
        mounted: Vec<VirtualKeyRecord>,
        pool: PoolNames,
    ) -> Result<(), mounted::MountedKeyError> {
        self.collisions(&mounted)?;
        *write(&self.mounted) = Arc::new(mounted);
        *write(&self.pool) = Some(pool);
        Ok(())
    }

    fn pool(&self) -> Option<PoolNames> {
        read(&self.pool).clone()
    }

    pub fn store(&self) -> &Arc<dyn KeyStore> {
        &self.store
    }

    pub fn mounted(&self) -> Arc<Vec<VirtualKeyRecord>> {
        read(&self.mounted).clone()
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn is_mounted(&self, id: &str) -> bool {
        self.mounted().iter().any(|k| k.id == id)
    }

    fn stored(&self, id: &str) -> Result<StoredKey, KeyStoreError> {
        if !well_formed_id(id) {
            return Err(KeyStoreError::NotFound(id.to_owned()));
        }
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
            if !self.mounted().iter().any(|k| k.sha256 == hash) {
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
        check_owner(spec.owner.as_deref())?;
        check_bindings(&spec.profiles, &spec.models)?;
        check_known(self.pool().as_ref(), &spec.profiles, &spec.models)?;
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
            allow_fallback: spec.allow_fallback.unwrap_or(defaults::ALLOW_FALLBACK),
            quota,
            enabled: spec.enabled.unwrap_or(defaults::KEY_ENABLED),
            revoked: false,
            created_at_ms: self.clock.now_ms(),
            cache: spec.cache,
        };
        self.store.insert(&key)?;
        Ok(KeyWithSecret {
            key: KeyInfo::stored(&key),
            secret: secret.expose().to_owned(),
        })
    }

    /// Mounted keys first, then stored ones (revoked included).
    pub fn list(&self) -> Result<Vec<KeyInfo>, KeyStoreError> {
        let mut keys: Vec<KeyInfo> = self.mounted().iter().map(KeyInfo::mounted).collect();
        keys.extend(self.store.list()?.iter().map(KeyInfo::stored));
        Ok(keys)
    }

    pub fn get(&self, id: &str) -> Result<KeyInfo, KeyStoreError> {
        if !well_formed_id(id) {
            return Err(KeyStoreError::NotFound(id.to_owned()));
        }
        if let Some(key) = self.mounted().iter().find(|k| k.id == id) {
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
        check_owner(patch.owner.as_deref())?;
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
        if let Some(cache) = patch.cache {
            key.cache = cache;
        }
        check_bindings(&key.profiles, &key.models)?;
        // Only what this patch names: a key bound before a profile left the pool keeps working
        // until its bindings are changed.
        check_known(
            self.pool().as_ref(),
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

    /// A report's days: `from` to `to` (`YYYY-MM-DD`), by default this UTC month up to today.
    fn report_range(
        &self,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<(String, String), KeyStoreError> {
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
        Ok((from, to))
    }

    /// Every key's usage (only `key`'s when given) from `from` to `to` (as
    /// [`KeyAdmin::usage`]'s range) per day, provider and model: `(from, to, rows)`.
    pub fn lane_usage(
        &self,
        from: Option<&str>,
        to: Option<&str>,
        key: Option<&str>,
    ) -> Result<(String, String, Vec<UsageDay>), KeyStoreError> {
        let (from, to) = self.report_range(from, to)?;
        let rows = self.store.lane_usage(&from, &to, key)?;
        Ok((from, to, rows))
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
        let (from, to) = self.report_range(from, to)?;
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
        let mounted = self.mounted();
        let mut keys = Vec::clone(&mounted);
        self.store.each(&mut |key| {
            if !key.revoked && !mounted.iter().any(|m| m.sha256 == key.sha256) {
                keys.push(key.into_record());
            }
        })?;
        // The list grew by doubling: the engine keeps it, so no spare capacity.
        keys.shrink_to_fit();
        crate::keys::quotas::with_blocks(self.store.as_ref(), &mut keys, self.clock.now_ms())?;
        Ok(keys)
    }

    /// A mounted key whose secret or id a stored key also holds: the gateway refuses to start.
    pub fn check_collisions(&self) -> Result<(), mounted::MountedKeyError> {
        self.collisions(&self.mounted())
    }

    fn collisions(&self, mounted: &[VirtualKeyRecord]) -> Result<(), mounted::MountedKeyError> {
        // No mounted key, nothing to collide with: the store is not listed for nothing (at
        // 10,000 stored keys the listing is most of what the start holds at its peak).
        if mounted.is_empty() {
            return Ok(());
        }
        let stored = self
            .store
            .list()
            .map_err(|e| mounted::MountedKeyError::Collision {
                label: "-".to_owned(),
                id: "-".to_owned(),
                reason: e.to_string(),
            })?;
        for mounted in mounted {
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

fn read<T: Clone>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{SystemClock, TestClock};
    use crate::keys::memory::MemoryKeyStore;
    use crate::keys::sqlite::SqliteKeyStore;
    use crate::keys::store::storage;
    use std::sync::atomic::AtomicI64;

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
            cache: None,
        }
    }

    #[test]
    fn an_owner_past_its_bound_is_refused_on_create_and_update() -> Result<(), KeyStoreError> {
        let clock = Arc::new(TestClock(AtomicI64::new(MARCH_15)));
        let admin = KeyAdmin::new(Arc::new(MemoryKeyStore::default()), vec![], clock);
        let long = "o".repeat(MAX_OWNER_BYTES + 1);
        let refused = admin.create(KeySpec {
            owner: Some(long.clone()),
            ..spec("app")
        });
        assert!(matches!(refused, Err(KeyStoreError::Invalid(m)) if m.contains("owner")));
        let id = admin
            .create(KeySpec {
                owner: Some("o".repeat(MAX_OWNER_BYTES)),
                ..spec("app")
            })?
            .key
            .id;
        let patch = KeyPatch {
            owner: Some(long),
            ..KeyPatch::default()
        };
        assert!(matches!(
            admin.update(&id, patch),
            Err(KeyStoreError::Invalid(_))
        ));
        Ok(())
    }

    #[test]
    fn an_id_of_another_shape_is_no_key_without_asking_the_store() -> Result<(), KeyStoreError> {
        let clock = Arc::new(TestClock(AtomicI64::new(MARCH_15)));
        let admin = KeyAdmin::new(Arc::new(MemoryKeyStore::default()), vec![], clock);
        let id = admin.create(spec("app"))?.key.id;
        assert!(well_formed_id(&id), "{id}");
        assert!(admin.get(&id).is_ok());
        let long = format!("key_{}", "a".repeat(10_000));
        for bad in [
            "",
            "key_",
            "key_zz",
            "nul\u{0}inside",
            "key_1' OR '1'='1",
            long.as_str(),
        ] {
            assert!(
                matches!(admin.get(bad), Err(KeyStoreError::NotFound(_))),
                "{bad:?}"
            );
            assert!(
                matches!(admin.revoke(bad), Err(KeyStoreError::NotFound(_))),
                "{bad:?}"
            );
            assert!(
                matches!(admin.rotate(bad), Err(KeyStoreError::NotFound(_))),
                "{bad:?}"
            );
            assert!(
                matches!(
                    admin.usage(bad, None, None),
                    Err(KeyStoreError::NotFound(_))
                ),
                "{bad:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn an_owner_with_control_or_bidi_characters_is_refused() -> Result<(), KeyStoreError> {
        let clock = Arc::new(TestClock(AtomicI64::new(MARCH_15)));
        let admin = KeyAdmin::new(Arc::new(MemoryKeyStore::default()), vec![], clock);
        for owner in [
            "a\u{0}b",
            "line\nforged",
            "\u{202e}txt.exe",
            "x\u{2067}y",
            "\u{7f}",
        ] {
            let refused = admin.create(KeySpec {
                owner: Some(owner.to_owned()),
                ..spec("app")
            });
            assert!(
                matches!(&refused, Err(KeyStoreError::Invalid(m)) if m.contains("owner")),
                "{owner:?}: {refused:?}"
            );
        }
        // SQL metacharacters and other scripts are an owner like any other.
        for owner in [
            "'; DROP TABLE virtual_keys; --",
            "Zoë Ångström",
            "عربي",
            "%00",
        ] {
            let created = admin.create(KeySpec {
                owner: Some(owner.to_owned()),
                ..spec("app")
            })?;
            assert_eq!(created.key.owner.as_deref(), Some(owner));
        }
        Ok(())
    }

    /// Every operation of [`KeyAdmin`] against `store`, step by step.
    fn exercise(store: Arc<dyn KeyStore>) -> Result<(), KeyStoreError> {
        let clock = Arc::new(TestClock(AtomicI64::new(MARCH_15)));
        let admin = KeyAdmin::new(store.clone(), vec![mounted_record()], clock.clone());
        let (created, stored) = create_stores_a_hashed_key(&store, &admin)?;
        let id = created.key.id.clone();
        list_shows_no_secret(&admin, &created.secret, &stored.sha256)?;
        update_changes_the_key(&store, &admin, &id)?;
        rotate_keeps_the_id(&store, &admin, &id, &created.secret)?;
        mounted_keys_are_read_only(&admin)?;
        revoke_is_for_good(&admin, &id)?;
        usage_adds_up_per_day(&store, &admin, &id)?;
        lane_usage_per_day_provider_and_model(&admin)?;
        invalid_specs_are_refused(&admin);
        Ok(())
    }

    /// Create: a secret of the label's shape, a `key_` id, the hash and quota stored, the
    /// generation bumped.
    fn create_stores_a_hashed_key(
        store: &Arc<dyn KeyStore>,
        admin: &KeyAdmin,
    ) -> Result<(KeyWithSecret, StoredKey), KeyStoreError> {
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
        let id = &created.key.id;
        assert!(id.starts_with("key_") && id.len() == 20, "{id}");
        assert_eq!(created.key.hint, created.secret[created.secret.len() - 4..]);
        assert!(store.generation()? > g0);
        let stored = store.get(id)?.ok_or(KeyStoreError::NotFound(id.clone()))?;
        assert_eq!(stored.sha256, sha256_hex(&created.secret));
        assert_eq!(stored.quota.requests_per_minute, Some(60));
        assert_eq!(stored.quota.cost_per_month, Some(20.5));
        assert_eq!(stored.owner.as_deref(), Some("team"));
        assert_eq!(stored.created_at_ms, MARCH_15);
        Ok((created, stored))
    }

    /// Listing: mounted first, never a secret or hash; the snapshot has both keys.
    fn list_shows_no_secret(
        admin: &KeyAdmin,
        secret: &str,
        sha256: &str,
    ) -> Result<(), KeyStoreError> {
        let list = admin.list()?;
        assert_eq!(list.len(), 2);
        assert!(list[0].mounted && !list[1].mounted);
        let text = serde_json::to_string(&list).map_err(storage)?;
        assert!(!text.contains(secret) && !text.contains(sha256));

        // Snapshot keys: enabled stored keys join the mounted one.
        assert_eq!(admin.snapshot_keys()?.len(), 2);
        Ok(())
    }

    /// Update: enabled, models and the response-cache choice; no profile and no model refused.
    fn update_changes_the_key(
        store: &Arc<dyn KeyStore>,
        admin: &KeyAdmin,
        id: &str,
    ) -> Result<(), KeyStoreError> {
        let updated = admin.update(
            id,
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
        // The key's response-cache choice: set, stored, pushed, then left to the policy again.
        let patch: KeyPatch = serde_json::from_str(r#"{"cache": false}"#).map_err(storage)?;
        assert_eq!(admin.update(id, patch)?.cache, Some(false));
        assert_eq!(store.get(id)?.and_then(|k| k.cache), Some(false));
        assert_eq!(admin.snapshot_keys()?[1].to_proto().cache, Some(false));
        let patch: KeyPatch = serde_json::from_str(r#"{"cache": null}"#).map_err(storage)?;
        assert_eq!(admin.update(id, patch)?.cache, None);
        assert_eq!(store.get(id)?.and_then(|k| k.cache), None);
        assert!(matches!(
            admin.update(
                id,
                KeyPatch {
                    profiles: Some(vec![]),
                    models: Some(vec![]),
                    ..KeyPatch::default()
                }
            ),
            Err(KeyStoreError::Invalid(_))
        ));
        Ok(())
    }

    /// Rotate: same id, new hash.
    fn rotate_keeps_the_id(
        store: &Arc<dyn KeyStore>,
        admin: &KeyAdmin,
        id: &str,
        secret: &str,
    ) -> Result<(), KeyStoreError> {
        let rotated = admin.rotate(id)?;
        assert_eq!(rotated.key.id, id);
        assert_ne!(rotated.secret, secret);
        let after = store
            .get(id)?
            .ok_or(KeyStoreError::NotFound(id.to_owned()))?;
        assert_eq!(after.sha256, sha256_hex(&rotated.secret));
        assert_eq!(after.models, ["m1"]);
        Ok(())
    }

    /// Mounted keys are read-only; an unknown id is not found.
    fn mounted_keys_are_read_only(admin: &KeyAdmin) -> Result<(), KeyStoreError> {
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
        Ok(())
    }

    /// Revoke: gone from the snapshot, for good.
    fn revoke_is_for_good(admin: &KeyAdmin, id: &str) -> Result<(), KeyStoreError> {
        assert!(admin.revoke(id)?.revoked);
        assert!(admin.revoke(id)?.revoked);
        assert_eq!(admin.snapshot_keys()?.len(), 1);
        assert_eq!(
            admin.rotate(id).map(|_| ()),
            Err(KeyStoreError::Revoked(id.to_owned()))
        );
        Ok(())
    }

    /// Usage rows (per provider and model) add up per day; the default range is this month.
    fn usage_adds_up_per_day(
        store: &Arc<dyn KeyStore>,
        admin: &KeyAdmin,
        id: &str,
    ) -> Result<(), KeyStoreError> {
        let row = |day: &str, outcome: &str| UsageDay {
            day: day.into(),
            provider: "p1".into(),
            model: if outcome == "success" { "m1" } else { "m2" }.into(),
            protocol: "chat".into(),
            requests: 1,
            successes: u64::from(outcome == "success"),
            failures: u64::from(outcome != "success"),
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 5,
            cost: 0.25,
            saved: 0.125,
            latency_ms: 100,
            outcomes: [(outcome.to_owned(), 1)].into_iter().collect(),
        };
        store.record_usage(&[
            (id.to_owned(), row("2026-03-14", "success")),
            (id.to_owned(), row("2026-03-15", "success")),
            (id.to_owned(), row("2026-02-28", "success")),
            ("key_other".into(), row("2026-03-15", "success")),
        ])?;
        store.record_usage(&[(id.to_owned(), row("2026-03-15", "error:upstream"))])?;
        let report = admin.usage(id, None, None)?;
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
        assert_eq!(report.total.cached_tokens, 12);
        assert!((report.total.cost - 0.75).abs() < 1e-9);
        assert!(
            (report.total.saved - 0.375).abs() < 1e-9,
            "saved is stored and summed"
        );
        let report = admin.usage(id, Some("2026-02-01"), Some("2026-02-28"))?;
        assert_eq!(report.days.len(), 1);
        assert!(matches!(
            admin.usage(id, Some("2026-02-30"), None),
            Err(KeyStoreError::Invalid(_))
        ));
        assert!(matches!(
            admin.usage(id, Some("2026-03-10"), Some("2026-03-01")),
            Err(KeyStoreError::Invalid(_))
        ));
        assert_eq!(
            admin
                .usage(&mounted::mounted_id("app"), None, None)?
                .days
                .len(),
            0
        );
        Ok(())
    }

    /// Every key's rows per day, provider and model.
    fn lane_usage_per_day_provider_and_model(admin: &KeyAdmin) -> Result<(), KeyStoreError> {
        let (from, to, lanes) = admin.lane_usage(None, None, None)?;
        assert_eq!((from.as_str(), to.as_str()), ("2026-03-01", "2026-03-15"));
        let lanes: Vec<(&str, &str, &str, u64, u64)> = lanes
            .iter()
            .map(|l| {
                let (day, p, m) = (l.day.as_str(), l.provider.as_str(), l.model.as_str());
                (day, p, m, l.requests, l.prompt_tokens)
            })
            .collect();
        assert_eq!(
            lanes,
            vec![
                ("2026-03-14", "p1", "m1", 1, 10),
                ("2026-03-15", "p1", "m1", 2, 20),
                ("2026-03-15", "p1", "m2", 1, 10),
            ]
        );
        // One key's rows only (the console's CSV export: per key, day, provider and model).
        let (_, _, lanes) = admin.lane_usage(None, None, Some("key_other"))?;
        let lanes: Vec<(&str, &str, &str, u64)> = lanes
            .iter()
            .map(|l| {
                (
                    l.day.as_str(),
                    l.provider.as_str(),
                    l.model.as_str(),
                    l.requests,
                )
            })
            .collect();
        assert_eq!(lanes, vec![("2026-03-15", "p1", "m1", 1)]);
        Ok(())
    }

    /// Invalid specs: a label not of the allowed shape, an empty one, no profiles.
    fn invalid_specs_are_refused(admin: &KeyAdmin) {
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
            cache: None,
        })?;
        let admin = KeyAdmin::new(store, vec![mounted], Arc::new(SystemClock));
        let err = admin.check_collisions().map_err(|e| e.to_string());
        assert!(
            matches!(&err, Err(m) if m.contains("same secret") && m.contains("app")),
            "{err:?}"
        );
        Ok(())
    }
}
