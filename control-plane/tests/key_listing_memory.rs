//! What the key sync holds at its peak while it reads a SQLite key store of 10,000 keys for the
//! engine, counted by dhat's heap counter (the global allocator of this test binary): the
//! records it hands the engine, and not every stored key besides them.

use std::sync::Arc;

use ai_router_control_plane::clock::Clock;
use ai_router_control_plane::keys::operations::{KeyAdmin, KeySpec};
use ai_router_control_plane::keys::sqlite::SqliteKeyStore;
use ai_router_control_plane::keys::store::KeyStore;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const VIRTUAL_KEYS: usize = 10_000;

struct FixedClock;

impl Clock for FixedClock {
    fn now_ms(&self) -> i64 {
        1_773_576_000_000
    }
}

#[test]
fn the_key_sync_reads_the_store_without_holding_every_stored_key() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ai-router-key-listing-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("keys.db");
    let store = Arc::new(SqliteKeyStore::open(&path)?);
    let keys = KeyAdmin::new(store.clone(), Vec::new(), Arc::new(FixedClock));
    for i in 0..VIRTUAL_KEYS {
        keys.create(KeySpec {
            label: format!("app{i}"),
            models: vec!["bench-model".into()],
            ..KeySpec::default()
        })?;
    }
    let _profiler = dhat::Profiler::builder().testing().build();

    let before = dhat::HeapStats::get();
    let records = keys.snapshot_keys()?;
    let after = dhat::HeapStats::get();
    assert_eq!(records.len(), VIRTUAL_KEYS);
    let held = after.curr_bytes - before.curr_bytes;
    // The listing's peak over what was held before it; dhat's maximum is the process's, and
    // nothing before the listing came near it (the store and the keys were made without it).
    let peak = after.max_bytes - before.curr_bytes;
    eprintln!("listing {VIRTUAL_KEYS} keys: {held} bytes held, {peak} at the peak");
    // 1.36 times what the records hold when this was written (they grow by doubling, then are
    // shrunk to fit); with the stored keys listed whole next to them, 2.24 times.
    assert!(
        peak <= held * 9 / 5,
        "listing {VIRTUAL_KEYS} keys peaked at {peak} bytes for {held} held"
    );
    drop(records);
    assert_eq!(store.list()?.len(), VIRTUAL_KEYS);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
