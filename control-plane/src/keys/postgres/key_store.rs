//! The key store's operations on Postgres: keys, usage, quotas, budgets, the change counter
//! and the admin tokens.

use std::collections::HashMap;

use crate::keys::admin_tokens::{Scope, StoredToken};
use crate::keys::store::{
    token_with_scope, BudgetUse, KeyStore, KeyStoreError, QuotaUsage, StoredKey, UsageDay,
};
use crate::store::lock;

use super::connection::PostgresKeyStore;
use super::rows::*;
use super::usage::*;

impl PostgresKeyStore {
    fn write_key(&self, key: &StoredKey, insert: bool) -> Result<(), KeyStoreError> {
        let key = key.clone();
        let id = key.id.clone();
        let written = self.call(move |mut client| async move {
            let err = |e: tokio_postgres::Error| pg_error(&e);
            let profiles = serde_json::to_value(&key.profiles).map_err(|e| e.to_string())?;
            let models = serde_json::to_value(&key.models).map_err(|e| e.to_string())?;
            let rpm = key.quota.requests_per_minute.map(i64_of);
            let tpd = key.quota.tokens_per_day.map(i64_of);
            let tx = client.transaction().await.map_err(err)?;
            let values: [&(dyn tokio_postgres::types::ToSql + Sync); 16] = [
                &key.id,
                &key.label,
                &key.sha256,
                &key.hint,
                &key.owner,
                &profiles,
                &models,
                &key.allow_fallback,
                &rpm,
                &tpd,
                &key.quota.cost_per_day,
                &key.quota.cost_per_month,
                &key.enabled,
                &key.revoked,
                &key.created_at_ms,
                &key.cache,
            ];
            let sql = if insert {
                format!(
                    "INSERT INTO virtual_keys ({KEY_COLUMNS}) VALUES \
                     ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
                     ON CONFLICT DO NOTHING"
                )
            } else {
                "UPDATE virtual_keys SET label = $2, sha256 = $3, hint = $4, owner = $5, \
                 profiles = $6, models = $7, allow_fallback = $8, requests_per_minute = $9, \
                 tokens_per_day = $10, cost_per_day = $11, cost_per_month = $12, enabled = $13, \
                 revoked = $14, created_at_ms = $15, cache = $16 WHERE id = $1"
                    .to_owned()
            };
            let changed = tx.execute(sql.as_str(), &values).await.map_err(err)?;
            if changed == 0 {
                return Ok(if insert {
                    Write::Duplicate
                } else {
                    Write::Missing
                });
            }
            tx.execute(
                "UPDATE key_changes SET generation = generation + 1 WHERE id = 1",
                &[],
            )
            .await
            .map_err(err)?;
            tx.commit().await.map_err(err)?;
            Ok(if insert {
                Write::Inserted
            } else {
                Write::Replaced
            })
        })?;
        match written {
            Write::Inserted | Write::Replaced => Ok(()),
            Write::Missing => Err(KeyStoreError::NotFound(id)),
            Write::Duplicate => Err(KeyStoreError::Storage(format!("key {id} already exists"))),
        }
    }
}

impl KeyStore for PostgresKeyStore {
    fn insert(&self, key: &StoredKey) -> Result<(), KeyStoreError> {
        self.write_key(key, true)
    }

    fn replace(&self, key: &StoredKey) -> Result<(), KeyStoreError> {
        self.write_key(key, false)
    }

    fn get(&self, id: &str) -> Result<Option<StoredKey>, KeyStoreError> {
        let id = id.to_owned();
        self.call(move |client| async move {
            let row = client
                .query_opt(
                    &format!("SELECT {KEY_COLUMNS} FROM virtual_keys WHERE id = $1"),
                    &[&id],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            row.as_ref().map(key_from_row).transpose()
        })
    }

    fn list(&self) -> Result<Vec<StoredKey>, KeyStoreError> {
        self.call(|client| async move {
            let rows = client
                .query(
                    &format!("SELECT {KEY_COLUMNS} FROM virtual_keys ORDER BY created_at_ms, id"),
                    &[],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            rows.iter().map(key_from_row).collect()
        })
    }

    fn record_report_usage(
        &self,
        rows: &[(String, UsageDay)],
        budgets: &[BudgetUse],
        batches: &[String],
    ) -> Result<(), KeyStoreError> {
        if !rows.is_empty() || !budgets.is_empty() || !batches.is_empty() {
            let mut unsent = lock(&self.unsent);
            unsent.push(UsageBatch {
                id: new_batch_id(),
                rows: rows.to_vec(),
                budgets: budgets.to_vec(),
                reports: batches.to_vec(),
            });
            bound_unsent(&mut unsent);
        }
        // From here on the rows are taken whatever happens: kept until a write succeeds (this
        // one, the next batch's, the next poll's). Answering an error would have the filter
        // send its report again, and the rows counted twice. While Postgres is known away, the
        // poll alone tries, so a report is acknowledged at once.
        if !self.health.is_up() {
            return Ok(());
        }
        if let Err(err) = self.flush_usage() {
            tracing::warn!(%err, "usage kept until the key store takes it");
        }
        Ok(())
    }

    fn counted_batch(&self, id: &str) -> Result<bool, KeyStoreError> {
        // Taken and waiting for the database counts as counted: it goes in with its rows.
        if lock(&self.unsent)
            .iter()
            .any(|batch| batch.reports.iter().any(|report| report == id))
        {
            return Ok(true);
        }
        let id = id.to_owned();
        self.call(move |client| async move {
            let row = client
                .query_opt("SELECT 1 FROM report_batches WHERE id = $1", &[&id])
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(row.is_some())
        })
    }

    fn usage(&self, id: &str, from: &str, to: &str) -> Result<Vec<UsageDay>, KeyStoreError> {
        let (id, from, to) = (id.to_owned(), from.to_owned(), to.to_owned());
        self.call(move |client| async move {
            let err = |e: tokio_postgres::Error| pg_error(&e);
            let rows = client
                .query(
                    &format!(
                        "SELECT day, ''::TEXT, ''::TEXT, ''::TEXT, {USAGE_SUMS} FROM key_usage \
                         WHERE key_id = $1 AND day >= $2 AND day <= $3 GROUP BY day ORDER BY day"
                    ),
                    &[&id, &from, &to],
                )
                .await
                .map_err(err)?;
            let mut days: Vec<UsageDay> = rows.iter().map(usage_from_row).collect();
            let outcomes = client
                .query(
                    "SELECT day, outcome, count FROM key_usage_outcomes \
                     WHERE key_id = $1 AND day >= $2 AND day <= $3",
                    &[&id, &from, &to],
                )
                .await
                .map_err(err)?;
            for r in &outcomes {
                let day: String = r.get(0);
                if let Some(row) = days.iter_mut().find(|d| d.day == day) {
                    row.outcomes.insert(r.get(1), u64_of(r.get(2)));
                }
            }
            Ok(days)
        })
    }

    fn lane_usage(
        &self,
        from: &str,
        to: &str,
        key: Option<&str>,
    ) -> Result<Vec<UsageDay>, KeyStoreError> {
        let (from, to, key) = (from.to_owned(), to.to_owned(), key.map(str::to_owned));
        self.call(move |client| async move {
            let rows = client
                .query(
                    &format!(
                        "SELECT day, provider, model, protocol, {USAGE_SUMS} FROM key_usage \
                         WHERE day >= $1 AND day <= $2 AND ($3::TEXT IS NULL OR key_id = $3) \
                         GROUP BY day, provider, model, protocol \
                         ORDER BY day, provider, model, protocol"
                    ),
                    &[&from, &to, &key],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(rows.iter().map(usage_from_row).collect())
        })
    }

    fn quota_usage(
        &self,
        first: &str,
        today: &str,
    ) -> Result<HashMap<String, QuotaUsage>, KeyStoreError> {
        let (first, today) = (first.to_owned(), today.to_owned());
        self.call(move |client| async move {
            let rows = client
                .query(
                    "SELECT key_id, \
                     COALESCE(SUM(CASE WHEN day = $2 THEN prompt_tokens + completion_tokens \
                     ELSE 0 END), 0)::BIGINT, \
                     COALESCE(SUM(CASE WHEN day = $2 THEN cost ELSE 0 END), 0)::DOUBLE PRECISION, \
                     COALESCE(SUM(cost), 0)::DOUBLE PRECISION \
                     FROM key_usage WHERE day >= $1 AND day <= $2 GROUP BY key_id",
                    &[&first, &today],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(rows
                .iter()
                .map(|r| {
                    (
                        r.get::<_, String>(0),
                        QuotaUsage {
                            day_tokens: u64_of(r.get(1)),
                            day_cost: r.get(2),
                            month_cost: r.get(3),
                        },
                    )
                })
                .collect())
        })
    }

    fn budget_use(&self, now_ms: i64) -> Result<Vec<BudgetUse>, KeyStoreError> {
        self.call(move |client| async move {
            let rows = client
                .query(
                    "SELECT budget, subject, until_ms, tokens, cost FROM budget_usage \
                     WHERE until_ms > $1 ORDER BY budget, subject, until_ms",
                    &[&now_ms],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(rows
                .iter()
                .map(|r| BudgetUse {
                    budget: r.get(0),
                    subject: r.get(1),
                    until_ms: r.get(2),
                    tokens: u64_of(r.get(3)),
                    cost: r.get(4),
                })
                .collect())
        })
    }

    fn generation(&self) -> Result<u64, KeyStoreError> {
        // Polled every second: also the moment to send usage an outage held back.
        if !lock(&self.unsent).is_empty() {
            if let Err(err) = self.flush_usage() {
                tracing::debug!(%err, "usage still waits for the key store");
            }
        }
        self.call(|client| async move {
            let row = client
                .query_one("SELECT generation FROM key_changes WHERE id = 1", &[])
                .await
                .map_err(|e| pg_error(&e))?;
            Ok(u64_of(row.get(0)))
        })
    }

    fn insert_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError> {
        let token = token.clone();
        self.call(move |client| async move {
            client
                .execute(
                    "INSERT INTO admin_tokens (id, label, scope, sha256, created_at_ms, \
                     expires_at_ms, last_used_ms, revoked) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    &[
                        &token.id,
                        &token.label,
                        &token.scope.text(),
                        &token.sha256,
                        &token.created_at_ms,
                        &token.expires_at_ms,
                        &token.last_used_ms,
                        &token.revoked,
                    ],
                )
                .await
                .map(|_| ())
                .map_err(|e| pg_error(&e))
        })
    }

    fn admin_tokens(&self) -> Result<Vec<StoredToken>, KeyStoreError> {
        let rows = self.call(|client| async move {
            let rows = client
                .query(
                    "SELECT id, label, scope, sha256, created_at_ms, expires_at_ms, \
                     last_used_ms, revoked FROM admin_tokens",
                    &[],
                )
                .await
                .map_err(|e| pg_error(&e))?;
            rows.iter()
                .map(|row| {
                    let get_err = |e: tokio_postgres::Error| e.to_string();
                    Ok((
                        StoredToken {
                            id: row.try_get(0).map_err(get_err)?,
                            label: row.try_get(1).map_err(get_err)?,
                            scope: Scope::Read,
                            sha256: row.try_get(3).map_err(get_err)?,
                            created_at_ms: row.try_get(4).map_err(get_err)?,
                            expires_at_ms: row.try_get(5).map_err(get_err)?,
                            last_used_ms: row.try_get(6).map_err(get_err)?,
                            revoked: row.try_get(7).map_err(get_err)?,
                        },
                        row.try_get::<_, String>(2).map_err(get_err)?,
                    ))
                })
                .collect::<Result<Vec<_>, String>>()
        })?;
        rows.into_iter()
            .map(|(token, scope)| token_with_scope(token, &scope))
            .collect()
    }

    fn update_admin_token(&self, token: &StoredToken) -> Result<(), KeyStoreError> {
        let token = token.clone();
        let id = token.id.clone();
        let changed = self.call(move |client| async move {
            client
                .execute(
                    "UPDATE admin_tokens SET revoked = $2, last_used_ms = $3 WHERE id = $1",
                    &[&token.id, &token.revoked, &token.last_used_ms],
                )
                .await
                .map_err(|e| pg_error(&e))
        })?;
        if changed == 0 {
            return Err(KeyStoreError::NotFound(format!("admin token {id}")));
        }
        Ok(())
    }
}
