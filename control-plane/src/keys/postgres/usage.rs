//! Usage batches: kept until committed, each written in one transaction with its id, so a
//! lost commit retried is not counted twice.

use std::collections::BTreeMap;

use crate::keys::store::{merge_budget_use, KeyStoreError, UsageDay, REPORT_BATCH_RETENTION_MS};
use crate::store::lock;

use super::connection::PostgresKeyStore;
use super::rows::*;

/// Usage batch ids are kept this long (a lost commit is retried well within it).
pub(super) const BATCH_ID_RETENTION_MS: i64 = 7 * 86_400_000;
/// Batches kept in memory while the database is away; beyond, the oldest are merged into one.
pub(super) const MAX_UNSENT_BATCHES: usize = 1_000;

impl PostgresKeyStore {
    /// Sends the unsent usage batches, oldest first; stops at the first failure (kept).
    pub(super) fn flush_usage(&self) -> Result<(), KeyStoreError> {
        loop {
            let Some(batch) = lock(&self.unsent).first().cloned() else {
                return Ok(());
            };
            let id = batch.id.clone();
            self.call(move |client| write_batch(client, batch))?;
            // Another flush (the poll's) may have written it meanwhile, once by its id: remove
            // it by id, not whatever is first now.
            lock(&self.unsent).retain(|kept| kept.id != id);
        }
    }
}

/// One usage batch in one transaction, once: its id goes in with its rows.
pub(super) async fn write_batch(
    mut client: deadpool_postgres::Object,
    batch: UsageBatch,
) -> Result<(), String> {
    let err = |e: tokio_postgres::Error| pg_error(&e);
    let UsageBatch {
        id: batch_id,
        rows,
        budgets,
        reports,
    } = batch;
    let now = now_ms();
    let tx = client.transaction().await.map_err(err)?;
    let fresh = tx
        .execute(
            "INSERT INTO usage_batches (id, at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&batch_id, &now],
        )
        .await
        .map_err(err)?;
    if fresh == 0 {
        // Committed before, its answer lost on the way.
        return Ok(());
    }
    for report in &reports {
        tx.execute(
            "INSERT INTO report_batches (id, at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[report, &now],
        )
        .await
        .map_err(err)?;
    }
    if !reports.is_empty() {
        tx.execute(
            "DELETE FROM report_batches WHERE at_ms < $1",
            &[&now.saturating_sub(REPORT_BATCH_RETENTION_MS)],
        )
        .await
        .map_err(err)?;
    }
    write_rows(&tx, &rows).await?;
    if !budgets.is_empty() {
        let budget = tx
            .prepare(
                "INSERT INTO budget_usage (budget, subject, until_ms, tokens, cost) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (budget, subject, until_ms) DO UPDATE SET \
                 tokens = budget_usage.tokens + excluded.tokens, \
                 cost = budget_usage.cost + excluded.cost",
            )
            .await
            .map_err(err)?;
        for row in &budgets {
            tx.execute(
                &budget,
                &[
                    &row.budget,
                    &row.subject,
                    &row.until_ms,
                    &i64_of(row.tokens),
                    &row.cost,
                ],
            )
            .await
            .map_err(err)?;
        }
        tx.execute("DELETE FROM budget_usage WHERE until_ms <= $1", &[&now])
            .await
            .map_err(err)?;
    }
    tx.execute(
        "DELETE FROM usage_batches WHERE at_ms < $1",
        &[&now.saturating_sub(BATCH_ID_RETENTION_MS)],
    )
    .await
    .map_err(err)?;
    tx.commit().await.map_err(err)
}

/// Adds usage rows (per key id, day, provider, model and protocol) and their outcomes (per key
/// id and day) in `tx`.
async fn write_rows(
    tx: &tokio_postgres::Transaction<'_>,
    rows: &[(String, UsageDay)],
) -> Result<(), String> {
    let err = |e: tokio_postgres::Error| pg_error(&e);
    let usage = tx
        .prepare(
            "INSERT INTO key_usage (key_id, day, requests, successes, failures, \
             prompt_tokens, completion_tokens, cost, latency_ms, cached_tokens, saved, \
             provider, model, protocol) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT (key_id, day, provider, model, protocol) DO UPDATE SET \
             requests = key_usage.requests + excluded.requests, \
             successes = key_usage.successes + excluded.successes, \
             failures = key_usage.failures + excluded.failures, \
             prompt_tokens = key_usage.prompt_tokens + excluded.prompt_tokens, \
             completion_tokens = key_usage.completion_tokens + excluded.completion_tokens, \
             cost = key_usage.cost + excluded.cost, \
             latency_ms = key_usage.latency_ms + excluded.latency_ms, \
             cached_tokens = key_usage.cached_tokens + excluded.cached_tokens, \
             saved = key_usage.saved + excluded.saved",
        )
        .await
        .map_err(err)?;
    let outcomes = tx
        .prepare(
            "INSERT INTO key_usage_outcomes (key_id, day, outcome, count) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (key_id, day, outcome) DO UPDATE SET \
             count = key_usage_outcomes.count + excluded.count",
        )
        .await
        .map_err(err)?;
    for (id, row) in rows {
        tx.execute(
            &usage,
            &[
                id,
                &row.day,
                &i64_of(row.requests),
                &i64_of(row.successes),
                &i64_of(row.failures),
                &i64_of(row.prompt_tokens),
                &i64_of(row.completion_tokens),
                &row.cost,
                &i64_of(row.latency_ms),
                &i64_of(row.cached_tokens),
                &row.saved,
                &row.provider,
                &row.model,
                &row.protocol,
            ],
        )
        .await
        .map_err(err)?;
        for (outcome, count) in &row.outcomes {
            tx.execute(&outcomes, &[id, &row.day, outcome, &i64_of(*count)])
                .await
                .map_err(err)?;
        }
    }
    Ok(())
}

/// Folds the oldest batches into one when too many wait (memory stays bounded; the merged
/// batch gets a new id, which is safe: none of them was committed, or they would be gone).
pub(super) fn bound_unsent(unsent: &mut Vec<UsageBatch>) {
    if unsent.len() <= MAX_UNSENT_BATCHES {
        return;
    }
    // The first one may be in flight (its commit unknown): keep it apart.
    let merged: Vec<UsageBatch> = unsent.drain(1..unsent.len() / 2).collect();
    let mut rows: crate::keys::usage::RowMap = BTreeMap::new();
    let mut reports = Vec::new();
    let mut budgets = BTreeMap::new();
    for batch in merged {
        crate::keys::usage::merge(&mut rows, batch.rows);
        merge_budget_use(&mut budgets, &batch.budgets);
        reports.extend(batch.reports);
    }
    let rows = rows.into_iter().map(|((id, ..), row)| (id, row)).collect();
    unsent.insert(
        1,
        UsageBatch {
            id: new_batch_id(),
            rows,
            budgets: budgets.into_values().collect(),
            reports,
        },
    );
}

/// The usage columns added up, in [`usage_from_row`]'s order after day, provider, model and
/// protocol.
pub(super) const USAGE_SUMS: &str = "SUM(requests)::BIGINT, SUM(successes)::BIGINT, \
     SUM(failures)::BIGINT, SUM(prompt_tokens)::BIGINT, SUM(completion_tokens)::BIGINT, \
     SUM(cost)::DOUBLE PRECISION, SUM(latency_ms)::BIGINT, SUM(cached_tokens)::BIGINT, \
     SUM(saved)::DOUBLE PRECISION";

/// A usage row of `SELECT day, provider, model, protocol, {USAGE_SUMS}` (no outcomes).
pub(super) fn usage_from_row(r: &tokio_postgres::Row) -> UsageDay {
    UsageDay {
        day: r.get(0),
        provider: r.get(1),
        model: r.get(2),
        protocol: r.get(3),
        requests: u64_of(r.get(4)),
        successes: u64_of(r.get(5)),
        failures: u64_of(r.get(6)),
        prompt_tokens: u64_of(r.get(7)),
        completion_tokens: u64_of(r.get(8)),
        cost: r.get(9),
        latency_ms: u64_of(r.get(10)),
        cached_tokens: u64_of(r.get(11)),
        saved: r.get(12),
        outcomes: BTreeMap::new(),
    }
}
