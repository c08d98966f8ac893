//! Usage accounting: every report batch the filters send becomes usage rows per virtual key,
//! UTC day, provider, model and client protocol in the key store (the console's spend per
//! provider, model and protocol reads the same rows as a key's usage).
//!
//! - A [`pb::RequestOutcome`] counts one request for its virtual key: a success or a failure
//!   (`error:<class>`, `rejected:<code>`), its latency and its outcome.
//! - Tokens and cost come from the [`pb::AttemptOutcome`]s that carry usage, as `keys::charge`
//!   charges them (the same charges the budget policies count), at the one price rule
//!   (`ai_router_contract::price`: prompt tokens at the input price, those served from the
//!   provider's cache at `cachedInput`, completion tokens at the output price, per million; a
//!   model without a cost counts 0). A request outcome's own usage is not counted again.
//!
//! A request and its attempts count on one protocol: each attempt carries its call's
//! (`AttemptOutcome.protocol`, from the same rule as `RequestOutcome.protocol` in the filter),
//! so its tokens land on its request's protocol even when the two come in different batches.
//!
//! Reports without a virtual key id (a request refused before it authenticated) count nowhere.
//! The engine hands each batch to [`UsageRecorder::observe`], which only queues the rows;
//! [`run_writer`] merges what is queued and writes it off the executor. A `Report`
//! is acknowledged only once its rows are stored ([`UsageRecorder::stored`]): a filter whose
//! batch was not acknowledged sends it again, so a control plane killed between the two loses
//! no call.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ai_router_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::clock::Clock;
use crate::config::Config;
use crate::keys::store::{merge_budget_use, utc_day, BudgetUse, KeyStore, UsageDay, UsageRowId};

type Rows = Vec<(String, UsageDay)>;
/// Usage rows by their identity (key id, day, provider, model, protocol).
pub type RowMap = BTreeMap<UsageRowId, UsageDay>;

/// What the writer receives, in order.
pub enum Queued {
    /// A report batch's rows, its budgets' use and its id (empty: none).
    Rows(Rows, Vec<BudgetUse>, String),
    /// Answered once everything queued before it is stored (`true`) or failed to be.
    Stored(oneshot::Sender<bool>),
}

use crate::keys::charge::cost_of;

/// What an answering attempt saved against its call's configured first choice: the same usage
/// at the first choice's prices less its cost here (0 when the first choice answered, either
/// is unpriced, or the first choice was cheaper).
pub fn saving_of(config: &Config, attempt: &pb::AttemptOutcome) -> f64 {
    let Some(usage) = attempt.usage.as_ref() else {
        return 0.0;
    };
    if attempt.first_choice_model.is_empty() {
        return 0.0;
    }
    let priced = |provider: &str, model: &str| {
        config
            .providers
            .iter()
            .find(|p| p.id == provider)
            .and_then(|p| p.cost_of(model, config.auto_price))
    };
    if priced(&attempt.provider, &attempt.model).is_none() {
        return 0.0;
    }
    let first = cost_of(
        config,
        &attempt.first_choice_provider,
        &attempt.first_choice_model,
        usage,
    );
    let here = cost_of(config, &attempt.provider, &attempt.model, usage);
    (first - here).max(0.0)
}

/// The usage rows of one batch, merged per (key id, day, provider, model, protocol).
pub fn usage_rows(config: &Config, batch: &pb::ReportBatch, now_ms: i64) -> Rows {
    let mut rows = RowMap::new();
    fn row<'a>(
        rows: &'a mut RowMap,
        id: &str,
        (provider, model, protocol): (&str, &str, &str),
        at_ms: i64,
        now_ms: i64,
    ) -> &'a mut UsageDay {
        let day = utc_day(if at_ms > 0 { at_ms } else { now_ms });
        let at = (
            id.to_owned(),
            day,
            provider.to_owned(),
            model.to_owned(),
            protocol.to_owned(),
        );
        rows.entry(at.clone()).or_insert_with(|| UsageDay {
            day: at.1,
            provider: at.2,
            model: at.3,
            protocol: at.4,
            ..UsageDay::default()
        })
    }
    for request in &batch.requests {
        if request.virtual_key_id.is_empty() {
            continue;
        }
        let lane = (
            request.provider.as_str(),
            request.model.as_str(),
            request.protocol.as_str(),
        );
        let entry = row(
            &mut rows,
            &request.virtual_key_id,
            lane,
            request.at_ms,
            now_ms,
        );
        entry.requests += 1;
        if request.outcome() == pb::RequestResult::Success {
            entry.successes += 1;
        } else {
            entry.failures += 1;
        }
        entry.latency_ms = entry.latency_ms.saturating_add(request.latency_ms);
        let outcome = match request.outcome_text() {
            text if text.is_empty() => "unknown".to_owned(),
            text => text,
        };
        *entry.outcomes.entry(outcome).or_insert(0) += 1;
        // A cache hit called no provider: the stored answer's cost at its model is saved.
        if request.cache_hit {
            if let Some(usage) = &request.usage {
                entry.saved += cost_of(config, &request.provider, &request.model, usage);
            }
        }
    }
    for charge in crate::keys::charge::charges(config, batch) {
        if charge.key.is_empty() {
            continue;
        }
        let lane = (charge.provider, charge.model, charge.protocol);
        let entry = row(&mut rows, charge.key, lane, charge.at_ms, now_ms);
        entry.prompt_tokens = entry.prompt_tokens.saturating_add(charge.prompt_tokens);
        entry.completion_tokens = entry
            .completion_tokens
            .saturating_add(charge.completion_tokens);
        entry.cached_tokens = entry.cached_tokens.saturating_add(charge.cached_tokens);
        entry.cost += charge.cost;
    }
    // What a cheaper lane saved against the call's first choice, on the attempts with usage.
    for attempt in &batch.attempts {
        if attempt.virtual_key_id.is_empty() || attempt.tokens() == 0 {
            continue;
        }
        let saved = saving_of(config, attempt);
        if saved != 0.0 {
            let lane = (
                attempt.provider.as_str(),
                attempt.model.as_str(),
                attempt.protocol.as_str(),
            );
            row(
                &mut rows,
                &attempt.virtual_key_id,
                lane,
                attempt.at_ms,
                now_ms,
            )
            .saved += saved;
        }
    }
    rows.into_iter().map(|((id, ..), row)| (id, row)).collect()
}

/// Queues the usage rows of every report batch for [`run_writer`].
pub struct UsageRecorder {
    /// Replaced by a reload ([`UsageRecorder::set_config`]): the models' prices.
    config: std::sync::RwLock<Arc<Config>>,
    clock: Arc<dyn Clock>,
    queue: mpsc::UnboundedSender<Queued>,
    /// The report batches seen lately, for [`UsageRecorder::first_sight`].
    seen: Mutex<SeenBatches>,
    /// Where counted batches are marked across restarts (the key store).
    store: Mutex<Option<Arc<dyn KeyStore>>>,
}

/// Report batch ids this process took, the oldest first (bounded).
#[derive(Default)]
struct SeenBatches {
    ids: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

/// How many report batch ids a process remembers itself (the key store remembers longer).
const SEEN_BATCHES: usize = 16_384;

impl UsageRecorder {
    /// The recorder and the receiving end [`run_writer`] drains.
    pub fn new(
        config: Arc<Config>,
        clock: Arc<dyn Clock>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Queued>) {
        let (queue, rx) = mpsc::unbounded_channel();
        (
            Arc::new(Self {
                config: std::sync::RwLock::new(config),
                clock,
                queue,
                seen: Mutex::default(),
                store: Mutex::default(),
            }),
            rx,
        )
    }

    /// Queues the usage rows of `batch` (the engine calls it with every report batch). Never
    /// blocks.
    pub fn observe(&self, batch: &pb::ReportBatch) {
        let config = self
            .config
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        let now = self.clock.now_ms();
        let rows = usage_rows(&config, batch, now);
        // The budgets count the same charges, in the same write (`keys::budget_use`).
        let budgets = crate::keys::budget_use::use_of(
            &config.budgets,
            crate::keys::charge::charges(&config, batch),
            now,
        );
        if !rows.is_empty() || !budgets.is_empty() || !batch.batch_id.is_empty() {
            // The writer is gone only at shutdown.
            let _ = self
                .queue
                .send(Queued::Rows(rows, budgets, batch.batch_id.clone()));
        }
    }

    /// Prices usage by `config`'s models from the next batch on.
    pub fn set_config(&self, config: Arc<Config>) {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
    }

    /// Marks counted batches in `store` too, so a batch sent again after a restart is known.
    pub fn set_store(&self, store: Arc<dyn KeyStore>) {
        *self.store.lock().unwrap_or_else(|p| p.into_inner()) = Some(store);
    }

    /// Whether report batch `id` is new: not taken by this process already, nor counted in the
    /// key store before a restart. A new one is remembered from now on.
    pub async fn first_sight(&self, id: &str) -> bool {
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if !seen.ids.insert(id.to_owned()) {
                return false;
            }
            seen.order.push_back(id.to_owned());
            while seen.order.len() > SEEN_BATCHES {
                if let Some(old) = seen.order.pop_front() {
                    seen.ids.remove(&old);
                }
            }
        }
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(store) = store else { return true };
        let id = id.to_owned();
        // A store that cannot answer: counted once more rather than lost.
        !matches!(
            tokio::task::spawn_blocking(move || store.counted_batch(&id)).await,
            Ok(Ok(true))
        )
    }

    /// Forgets batch `id` (its usage could not be stored: it will come again).
    pub fn forget(&self, id: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.ids.remove(id) {
            seen.order.retain(|kept| kept != id);
        }
    }

    /// Waits until every row queued so far is in the store; `false` when the write failed or
    /// the writer is gone.
    pub async fn stored(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.queue.send(Queued::Stored(tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

/// Adds `rows` to the rows by (key id, day, provider, model, protocol).
pub(crate) fn merge(into: &mut RowMap, rows: Rows) {
    for (id, row) in rows {
        into.entry(row.row_id(&id))
            .or_insert_with(|| row.empty_like())
            .add(&row);
    }
}

/// Writes queued usage rows to `store` until `shutdown` flips, then writes what is left.
/// `written` fires after each successful write (the quota blocks depend on it).
pub async fn run_writer(
    mut rx: mpsc::UnboundedReceiver<Queued>,
    store: Arc<dyn KeyStore>,
    written: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let first = tokio::select! {
            queued = rx.recv() => queued,
            _ = shutdown.wait_for(|stopped| *stopped) => None,
        };
        let Some(first) = first else { break };
        let mut pending = Pending::default();
        let mut waiting = Vec::new();
        take(first, &mut pending, &mut waiting);
        while let Ok(more) = rx.try_recv() {
            take(more, &mut pending, &mut waiting);
        }
        let stored = pending.is_empty() || write(&store, pending).await;
        if stored {
            written.notify_one();
        }
        for waiter in waiting {
            let _ = waiter.send(stored);
        }
    }
    let mut pending = Pending::default();
    let mut waiting = Vec::new();
    while let Ok(more) = rx.try_recv() {
        take(more, &mut pending, &mut waiting);
    }
    let stored = pending.is_empty() || write(&store, pending).await;
    for waiter in waiting {
        let _ = waiter.send(stored);
    }
}

/// What the writer merged from the queue for one write.
#[derive(Default)]
struct Pending {
    rows: RowMap,
    budgets: BTreeMap<(String, String, i64), BudgetUse>,
    batches: Vec<String>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.budgets.is_empty() && self.batches.is_empty()
    }
}

fn take(queued: Queued, pending: &mut Pending, waiting: &mut Vec<oneshot::Sender<bool>>) {
    match queued {
        Queued::Rows(rows, budgets, batch) => {
            merge(&mut pending.rows, rows);
            merge_budget_use(&mut pending.budgets, &budgets);
            if !batch.is_empty() {
                pending.batches.push(batch);
            }
        }
        Queued::Stored(waiter) => waiting.push(waiter),
    }
}

/// Whether the rows were stored.
async fn write(store: &Arc<dyn KeyStore>, pending: Pending) -> bool {
    let rows: Rows = pending
        .rows
        .into_iter()
        .map(|((id, ..), row)| (id, row))
        .collect();
    let budgets: Vec<BudgetUse> = pending.budgets.into_values().collect();
    let batches = pending.batches;
    let store = store.clone();
    match tokio::task::spawn_blocking(move || store.record_report_usage(&rows, &budgets, &batches))
        .await
    {
        Ok(Ok(())) => true,
        Ok(Err(err)) => {
            tracing::error!(%err, "cannot record usage");
            false
        }
        Err(err) => {
            tracing::error!(%err, "the usage writer failed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::config::secrets::MapEnv;
    use crate::keys::memory::MemoryKeyStore;
    use std::path::Path;

    fn config() -> Result<Config, String> {
        parse(
            "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: K }], models: [{ id: m, aliases: [fast], cost: { input: 2.0, output: 10.0 } }, { id: free }] }\n",
        )
        .and_then(|f| f.resolve(&MapEnv::new([("K", "sk")]), Path::new(".")))
        .map_err(|e| e.to_string())
    }

    // 2026-03-15T12:00:00Z
    const AT: i64 = 1_773_576_000_000;

    fn batch() -> pb::ReportBatch {
        let usage = |p, c| {
            Some(pb::Usage {
                prompt_tokens: p,
                completion_tokens: c,
                ..Default::default()
            })
        };
        pb::ReportBatch {
            node: "n".into(),
            requests: vec![
                pb::RequestOutcome {
                    virtual_key_id: "key_a".into(),
                    outcome: pb::RequestResult::Success.into(),
                    latency_ms: 120,
                    at_ms: AT,
                    provider: "p".into(),
                    model: "m".into(),
                    ..Default::default()
                },
                pb::RequestOutcome {
                    virtual_key_id: "key_a".into(),
                    outcome: pb::RequestResult::Rejected.into(),
                    rejected_code: "model_not_allowed".into(),
                    latency_ms: 1,
                    at_ms: AT,
                    ..Default::default()
                },
                pb::RequestOutcome {
                    virtual_key_id: "key_a".into(),
                    outcome: pb::RequestResult::Error.into(),
                    latency_ms: 3,
                    at_ms: AT - 86_400_000,
                    ..Default::default()
                },
                // Refused before authenticating: no key.
                pb::RequestOutcome {
                    outcome: pb::RequestResult::Rejected.into(),
                    rejected_code: "invalid_api_key".into(),
                    ..Default::default()
                },
            ],
            attempts: vec![
                pb::AttemptOutcome {
                    virtual_key_id: "key_a".into(),
                    provider: "p".into(),
                    model: "m".into(),
                    outcome: pb::AttemptResult::Success.into(),
                    usage: usage(1_000, 500),
                    at_ms: AT,
                    ..Default::default()
                },
                pb::AttemptOutcome {
                    virtual_key_id: "key_a".into(),
                    provider: "p".into(),
                    model: "free".into(),
                    outcome: pb::AttemptResult::Success.into(),
                    usage: usage(10, 5),
                    at_ms: AT,
                    ..Default::default()
                },
                // A failed attempt without usage counts nothing.
                pb::AttemptOutcome {
                    virtual_key_id: "key_a".into(),
                    provider: "p".into(),
                    model: "m".into(),
                    outcome: pb::AttemptResult::Error.into(),
                    at_ms: AT,
                    ..Default::default()
                },
            ],
            dropped: 0,
            batch_id: String::new(),
            ..Default::default()
        }
    }

    #[test]
    fn rows_per_key_day_provider_and_model() -> Result<(), String> {
        let rows = usage_rows(&config()?, &batch(), AT);
        let lanes: Vec<(&str, &str, &str, &str)> = rows
            .iter()
            .map(|(id, r)| {
                (
                    id.as_str(),
                    r.day.as_str(),
                    r.provider.as_str(),
                    r.model.as_str(),
                )
            })
            .collect();
        // A call counts on the lane that answered it (none for a refused or failed one); tokens
        // and cost on the lane of the attempt that used them.
        assert_eq!(
            lanes,
            vec![
                ("key_a", "2026-03-14", "", ""),
                ("key_a", "2026-03-15", "", ""),
                ("key_a", "2026-03-15", "p", "free"),
                ("key_a", "2026-03-15", "p", "m"),
            ]
        );
        let yesterday = &rows[0].1;
        assert_eq!((yesterday.requests, yesterday.failures), (1, 1));
        let (refused, free, answered) = (&rows[1].1, &rows[2].1, &rows[3].1);
        assert_eq!((refused.requests, refused.failures), (1, 1));
        assert_eq!(refused.outcomes["rejected:model_not_allowed"], 1);
        assert_eq!((answered.requests, answered.successes), (1, 1));
        assert_eq!(answered.latency_ms, 120);
        assert_eq!(answered.outcomes["success"], 1);
        assert_eq!(
            (answered.prompt_tokens, answered.completion_tokens),
            (1_000, 500)
        );
        assert_eq!((free.requests, free.prompt_tokens, free.cost), (0, 10, 0.0));
        // 1000 x 2 / 1M + 500 x 10 / 1M
        assert!((answered.cost - 0.007).abs() < 1e-12, "{}", answered.cost);
        // A key's day adds its lanes up.
        let mut today = UsageDay::default();
        for (_, row) in rows.iter().filter(|(_, r)| r.day == "2026-03-15") {
            today.add(row);
        }
        assert_eq!((today.requests, today.successes, today.failures), (2, 1, 1));
        assert_eq!((today.prompt_tokens, today.completion_tokens), (1_010, 505));
        Ok(())
    }

    #[tokio::test]
    async fn the_writer_stores_what_the_recorder_queues() -> Result<(), Box<dyn std::error::Error>>
    {
        let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::default());
        let (recorder, rx) =
            UsageRecorder::new(Arc::new(config()?), Arc::new(crate::clock::SystemClock));
        let (stop_tx, stop_rx) = watch::channel(false);
        let written = Arc::new(Notify::new());
        let writer = tokio::spawn(run_writer(rx, store.clone(), written.clone(), stop_rx));
        recorder.observe(&batch());
        recorder.observe(&batch());
        // Acknowledged only once stored.
        assert!(recorder.stored().await);
        let days = store.usage("key_a", "2026-03-01", "2026-03-31")?;
        assert_eq!(days[1].requests, 4);
        stop_tx.send(true)?;
        writer.await?;
        let days = store.usage("key_a", "2026-03-01", "2026-03-31")?;
        assert_eq!(days.len(), 2);
        assert_eq!(days[1].requests, 4);
        assert_eq!(days[1].prompt_tokens, 2_020);
        Ok(())
    }

    #[tokio::test]
    async fn a_batch_sent_again_is_counted_once_even_after_a_restart(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let path = std::env::temp_dir()
            .join(format!("ai-router-batches-{}", std::process::id()))
            .join("keys.sqlite");
        let _ = std::fs::remove_file(&path);
        let store: Arc<dyn KeyStore> = Arc::new(crate::keys::sqlite::SqliteKeyStore::open(&path)?);
        let run = |store: Arc<dyn KeyStore>| -> Result<_, Box<dyn std::error::Error>> {
            let (recorder, rx) =
                UsageRecorder::new(Arc::new(config()?), Arc::new(crate::clock::SystemClock));
            recorder.set_store(store.clone());
            let (stop_tx, stop_rx) = watch::channel(false);
            let writer = tokio::spawn(run_writer(rx, store, Arc::new(Notify::new()), stop_rx));
            Ok((recorder, stop_tx, writer))
        };
        let mut sent = batch();
        sent.batch_id = "envoy-1-b1".into();
        let (recorder, stop_tx, writer) = run(store.clone())?;
        assert!(recorder.first_sight("envoy-1-b1").await);
        recorder.observe(&sent);
        assert!(recorder.stored().await);
        // The same batch again in this process: known.
        assert!(!recorder.first_sight("envoy-1-b1").await);
        stop_tx.send(true)?;
        writer.await?;
        // A new process on the same file knows it from the store; another batch is new.
        let (recorder, stop_tx, writer) = run(store.clone())?;
        assert!(!recorder.first_sight("envoy-1-b1").await);
        assert!(recorder.first_sight("envoy-1-b2").await);
        // One whose usage could not be stored is forgotten: it counts when it comes again.
        recorder.forget("envoy-1-b2");
        assert!(recorder.first_sight("envoy-1-b2").await);
        stop_tx.send(true)?;
        writer.await?;
        let days = store.usage("key_a", "2026-03-01", "2026-03-31")?;
        assert_eq!(days[1].requests, 2, "{days:?}");
        Ok(())
    }

    #[test]
    fn a_cache_hit_saves_the_stored_answers_cost_and_spends_nothing() {
        let config = config().unwrap();
        let hit = pb::RequestOutcome {
            virtual_key_id: "key_a".into(),
            outcome: pb::RequestResult::Success.into(),
            cache_hit: true,
            provider: "p".into(),
            model: "fast".into(),
            usage: Some(pb::Usage {
                prompt_tokens: 1_000,
                completion_tokens: 100,
                ..Default::default()
            }),
            at_ms: AT,
            ..Default::default()
        };
        let batch = pb::ReportBatch {
            requests: vec![hit.clone()],
            ..Default::default()
        };
        let rows = usage_rows(&config, &batch, AT);
        let row = &rows[0].1;
        // 1000 x 2.0 + 100 x 10.0 per million.
        assert!((row.saved - 0.003).abs() < 1e-12, "{}", row.saved);
        assert_eq!((row.cost, row.prompt_tokens, row.successes), (0.0, 0, 1));
        // The same outcome that is no hit saves nothing.
        let miss = pb::ReportBatch {
            requests: vec![pb::RequestOutcome {
                cache_hit: false,
                ..hit
            }],
            ..Default::default()
        };
        assert_eq!(usage_rows(&config, &miss, AT)[0].1.saved, 0.0);
    }

    #[test]
    fn a_request_and_its_attempts_count_on_the_protocol_the_client_called_by() -> Result<(), String>
    {
        let config = config()?;
        let request = |protocol: &str| pb::RequestOutcome {
            virtual_key_id: "key_a".into(),
            outcome: pb::RequestResult::Success.into(),
            provider: "p".into(),
            model: "m".into(),
            protocol: protocol.into(),
            at_ms: AT,
            ..Default::default()
        };
        let attempt = |protocol: &str, prompt_tokens| pb::AttemptOutcome {
            virtual_key_id: "key_a".into(),
            provider: "p".into(),
            model: "m".into(),
            protocol: protocol.into(),
            outcome: pb::AttemptResult::Success.into(),
            usage: Some(pb::Usage {
                prompt_tokens,
                ..Default::default()
            }),
            at_ms: AT,
            ..Default::default()
        };
        // An Anthropic messages call whose attempts came in an earlier batch than its outcome,
        // a chat completion, and a call from a data plane too old to name its protocol.
        let attempts = pb::ReportBatch {
            attempts: vec![attempt("messages", 100_000), attempt("messages", 50_000)],
            ..Default::default()
        };
        let requests = pb::ReportBatch {
            requests: vec![request("messages"), request("chat"), request("")],
            attempts: vec![attempt("chat", 10_000), attempt("", 1_000)],
            ..Default::default()
        };
        let mut merged = RowMap::new();
        merge(&mut merged, usage_rows(&config, &attempts, AT));
        merge(&mut merged, usage_rows(&config, &requests, AT));
        let per_protocol: Vec<(&str, u64, u64)> = merged
            .values()
            .map(|r| (r.protocol.as_str(), r.requests, r.prompt_tokens))
            .collect();
        assert_eq!(
            per_protocol,
            vec![
                ("", 1, 1_000),
                ("chat", 1, 10_000),
                ("messages", 1, 150_000)
            ]
        );
        assert!(merged.values().all(|r| r.provider == "p" && r.model == "m"));
        // At 2.0 per million prompt tokens.
        for (row, cost) in merged.values().zip([0.002, 0.02, 0.3]) {
            assert!((row.cost - cost).abs() < 1e-12, "{row:?}");
        }
        Ok(())
    }
}
