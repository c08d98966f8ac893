//! What the control plane holds and allocates per virtual key, counted by dhat's heap counter
//! (the global allocator of this test binary): a bound per key held by the engine, and the
//! key sync's quota recheck allocating next to nothing while the key store is unchanged. These
//! catch a regression (a key held once more, a recheck listing the store again) without
//! reading a process's RSS, which depends on the allocator and the machine.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ai_router_control_plane::api::admin::{push_keys, recheck_quotas};
use ai_router_control_plane::clock::Clock;
use ai_router_control_plane::config::secrets::{sha256_hex, MapEnv};
use ai_router_control_plane::config::{parse, QuotaConfig};
use ai_router_control_plane::engine::Engine;
use ai_router_control_plane::keys::admin_tokens::StoredToken;
use ai_router_control_plane::keys::memory::MemoryKeyStore;
use ai_router_control_plane::keys::operations::{KeyAdmin, KeySpec};
use ai_router_control_plane::keys::store::{
    utc_day, BudgetUse, KeyStore, KeyStoreError, QuotaUsage, StoredKey, UsageDay,
};
use ai_router_control_plane::store::durable::DurableState;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const VIRTUAL_KEYS: usize = 10_000;
const PROVIDER_KEYS: usize = 1_000;
/// What the engine may hold per virtual key: its record (for the quota rechecks) and its
/// published form (shared by every version and every Watch stream that did not change it).
/// 766 bytes when this was written; one more copy of either would pass the bound.
const HELD_PER_VIRTUAL_KEY: i64 = 1_000;
/// What a quota recheck with an unchanged store may allocate in all, whatever the number of
/// keys: the usage read (100 keys have rows here) and nothing per key.
const RECHECK_BYTES: u64 = 64 * 1024;

/// What a view of the state for the admin API and the metrics may allocate: a copy of the pool
/// (1,000 provider keys here, twice), nothing per virtual key (with them it was 3.1 MB).
const VIEW_BYTES: u64 = 1024 * 1024;

// 2026-03-15T12:00:00Z
const NOW_MS: i64 = 1_773_576_000_000;

struct FixedClock;

impl Clock for FixedClock {
    fn now_ms(&self) -> i64 {
        NOW_MS
    }
}

/// A key store that counts its listings (the costly read a recheck must not repeat).
#[derive(Default)]
struct CountingStore {
    inner: MemoryKeyStore,
    lists: AtomicUsize,
}

impl KeyStore for CountingStore {
    fn insert(&self, key: &StoredKey) -> std::result::Result<(), KeyStoreError> {
        self.inner.insert(key)
    }
    fn replace(&self, key: &StoredKey) -> std::result::Result<(), KeyStoreError> {
        self.inner.replace(key)
    }
    fn get(&self, id: &str) -> std::result::Result<Option<StoredKey>, KeyStoreError> {
        self.inner.get(id)
    }
    fn list(&self) -> std::result::Result<Vec<StoredKey>, KeyStoreError> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        self.inner.list()
    }
    fn record_report_usage(
        &self,
        rows: &[(String, UsageDay)],
        budgets: &[BudgetUse],
        batches: &[String],
    ) -> std::result::Result<(), KeyStoreError> {
        self.inner.record_report_usage(rows, budgets, batches)
    }
    fn budget_use(&self, now_ms: i64) -> std::result::Result<Vec<BudgetUse>, KeyStoreError> {
        self.inner.budget_use(now_ms)
    }
    fn counted_batch(&self, id: &str) -> std::result::Result<bool, KeyStoreError> {
        self.inner.counted_batch(id)
    }
    fn usage(
        &self,
        id: &str,
        from: &str,
        to: &str,
    ) -> std::result::Result<Vec<UsageDay>, KeyStoreError> {
        self.inner.usage(id, from, to)
    }
    fn lane_usage(
        &self,
        from: &str,
        to: &str,
        key: Option<&str>,
    ) -> std::result::Result<Vec<UsageDay>, KeyStoreError> {
        self.inner.lane_usage(from, to, key)
    }

    fn quota_usage(
        &self,
        first: &str,
        today: &str,
    ) -> std::result::Result<HashMap<String, QuotaUsage>, KeyStoreError> {
        self.inner.quota_usage(first, today)
    }
    fn generation(&self) -> std::result::Result<u64, KeyStoreError> {
        self.inner.generation()
    }
    fn insert_admin_token(&self, token: &StoredToken) -> std::result::Result<(), KeyStoreError> {
        self.inner.insert_admin_token(token)
    }
    fn admin_tokens(&self) -> std::result::Result<Vec<StoredToken>, KeyStoreError> {
        self.inner.admin_tokens()
    }
    fn update_admin_token(&self, token: &StoredToken) -> std::result::Result<(), KeyStoreError> {
        self.inner.update_admin_token(token)
    }
}

fn pool(provider_keys: usize) -> Result<(Arc<ai_router_control_plane::config::Config>, MapEnv)> {
    let keys: Vec<String> = (0..provider_keys)
        .map(|i| format!("sk-memory-test-{i:04}-0123456789abcdef"))
        .collect();
    let env = MapEnv::new([("MEM_API_KEYS", keys.join(","))]);
    let config = parse(
        "providers:\n\
         \x20 - id: mem\n\
         \x20   kind: openai-compatible\n\
         \x20   baseUrl: http://127.0.0.1:9/v1\n\
         \x20   keysFromEnv: MEM\n\
         \x20   models:\n\
         \x20     - { id: bench-model, contextWindow: 128000, cost: { input: 0.15, output: 0.6 } }\n",
    )?
    .resolve(&env, Path::new("."))?;
    Ok((Arc::new(config), env))
}

fn limited_spec(i: usize) -> KeySpec {
    KeySpec {
        label: format!("app{i}"),
        models: vec!["bench-model".into()],
        quota: Some(QuotaConfig {
            requests_per_minute: Some(1_000),
            tokens_per_day: Some(1_000),
            cost_per_day: Some(10.0),
            cost_per_month: Some(100.0),
        }),
        ..KeySpec::default()
    }
}

fn used_today(tokens: u64) -> UsageDay {
    UsageDay {
        day: utc_day(NOW_MS),
        requests: 1,
        successes: 1,
        prompt_tokens: tokens,
        ..UsageDay::default()
    }
}

fn pushed_quota_code(engine: &Engine, sha256: &str) -> Option<String> {
    engine
        .tables()
        .virtual_keys
        .get(sha256)
        .map(|k| k.quota_code.clone())
}

#[test]
fn virtual_keys_are_held_once_and_a_quota_recheck_does_not_list_the_store() -> Result<()> {
    let store = Arc::new(CountingStore::default());
    let keys = KeyAdmin::new(store.clone(), Vec::new(), Arc::new(FixedClock));
    // (id, SHA-256 of the secret) of each key made.
    let mut made = Vec::with_capacity(VIRTUAL_KEYS);
    for i in 0..VIRTUAL_KEYS {
        let key = keys.create(limited_spec(i))?;
        made.push((key.key.id, sha256_hex(&key.secret)));
    }
    // 100 keys used something today; the first is over its 1,000 tokens.
    let rows: Vec<(String, UsageDay)> = made
        .iter()
        .take(100)
        .enumerate()
        .map(|(i, (id, _))| (id.clone(), used_today(if i == 0 { 5_000 } else { 10 })))
        .collect();
    store.record_usage(&rows)?;
    let (config, env) = pool(PROVIDER_KEYS)?;

    let _profiler = dhat::Profiler::builder().testing().build();

    // The engine with no virtual key, then with all of them: the difference is what they cost.
    let empty = Engine::new(
        config.clone(),
        Arc::new(env.clone()),
        Arc::new(FixedClock),
        Vec::new(),
        DurableState::default(),
    );
    let before = dhat::HeapStats::get().curr_bytes as i64;
    drop(empty);
    let without_keys = before - dhat::HeapStats::get().curr_bytes as i64;

    let before = dhat::HeapStats::get().curr_bytes as i64;
    let records = keys.snapshot_keys()?;
    let engine = Engine::new(
        config,
        Arc::new(env),
        Arc::new(FixedClock),
        records,
        DurableState::default(),
    );
    let held = dhat::HeapStats::get().curr_bytes as i64 - before - without_keys;
    let per_key = held / VIRTUAL_KEYS as i64;
    eprintln!("the engine holds {per_key} bytes per virtual key");
    assert!(
        per_key <= HELD_PER_VIRTUAL_KEY,
        "the engine holds {per_key} bytes per virtual key (at most {HELD_PER_VIRTUAL_KEY})"
    );
    assert_eq!(
        pushed_quota_code(&engine, &made[0].1).as_deref(),
        Some("tokens_per_day_exceeded")
    );

    // The operator's views (`/metrics`, `/health`, the ledger) read the state without the keys:
    // what they copy is the pool's size, not the key table's.
    let allocated = dhat::HeapStats::get().total_bytes;
    let view = engine.current_without_keys();
    let view_bytes = dhat::HeapStats::get().total_bytes - allocated;
    eprintln!("a view of the state allocated {view_bytes} bytes");
    assert!(view.snapshot.is_some_and(|s| s.virtual_keys.is_empty()));
    assert!(
        view_bytes <= VIEW_BYTES,
        "a view of the state allocated {view_bytes} bytes (at most {VIEW_BYTES})"
    );

    // The key sync's recheck with the store unchanged: no listing, next to no allocation.
    let lists = store.lists.load(Ordering::Relaxed);
    let allocated = dhat::HeapStats::get().total_bytes;
    let version = engine.version();
    assert!(
        recheck_quotas(&engine, &keys)?,
        "every key has a usage limit"
    );
    let recheck_bytes = dhat::HeapStats::get().total_bytes - allocated;
    eprintln!("a recheck of {VIRTUAL_KEYS} unchanged keys allocated {recheck_bytes} bytes");
    assert_eq!(
        store.lists.load(Ordering::Relaxed),
        lists,
        "a recheck listed the store"
    );
    assert!(
        recheck_bytes <= RECHECK_BYTES,
        "a recheck of {VIRTUAL_KEYS} unchanged keys allocated {recheck_bytes} bytes \
         (at most {RECHECK_BYTES})"
    );
    assert_eq!(
        engine.version(),
        version,
        "nothing changed: nothing published"
    );

    // A block that appears (the usage crossed a limit) is published by it.
    store.record_usage(&[(made[1].0.clone(), used_today(2_000))])?;
    recheck_quotas(&engine, &keys)?;
    assert!(engine.version() > version);
    assert_eq!(
        pushed_quota_code(&engine, &made[1].1).as_deref(),
        Some("tokens_per_day_exceeded")
    );
    // The same blocks a full push (a listing) would put.
    let from_recheck = engine.tables().virtual_keys.clone();
    push_keys(&engine, &keys)?;
    assert_eq!(engine.tables().virtual_keys, from_recheck);
    Ok(())
}
