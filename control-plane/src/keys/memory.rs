//! The key store in memory (`{ type: memory }`): gone on restart.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::keys::store::*;
use crate::keys::token_record::StoredToken;
use crate::store::lock;

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
        for ((key, day, ..), row) in &inner.usage {
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
        let mut lanes: BTreeMap<(&str, &str, &str, &str), UsageDay> = BTreeMap::new();
        for ((id, day, provider, model, protocol), row) in &inner.usage {
            if day.as_str() >= from && day.as_str() <= to && key.is_none_or(|k| k == id) {
                let lane = lanes
                    .entry((day, provider, model, protocol))
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
        for ((id, day, ..), row) in &inner.usage {
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
