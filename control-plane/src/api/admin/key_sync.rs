//! The key sync: the key store's keys and the quota blocks their usage puts on them, pushed
//! into the engine's snapshot after every write here, and when another process changed the
//! store (polled), after usage writes, at the UTC day change and every few seconds.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::engine::Engine;
use crate::keys::operations::KeyAdmin;
use crate::keys::store::{utc_day, KeyStoreError};

/// How often the key store is checked for changes made by another process.
pub const KEY_SYNC_INTERVAL: Duration = Duration::from_millis(500);
/// Key-sync ticks between two quota recomputations when nothing else asked for one.
const QUOTA_RECHECK_TICKS: u32 = 10;
/// The least time between two rechecks of the quota blocks after usage rows were written.
const QUOTA_RECHECK_MIN_GAP: Duration = Duration::from_millis(250);

/// Pushes the key store's keys (and the mounted ones) into the engine's snapshot, and the
/// budgets' use the store counted; returns whether the usage rows move anything pushed (a key
/// with a usage limit, whose block follows them, or a budget policy).
pub fn push_keys(engine: &Engine, keys: &KeyAdmin) -> Result<bool, KeyStoreError> {
    let limited = {
        // An admin write's push, the sync's and a reload's never cross: the generation noted
        // is always the one the engine's keys were listed at.
        let _pushing = keys.pushing();
        let generation = keys.store().generation()?;
        let records = keys.snapshot_keys()?;
        let limited = records.iter().any(crate::keys::quotas::has_usage_limit);
        engine.set_virtual_keys(records);
        keys.note_pushed(generation);
        limited
    };
    let moves = absorb_budget_use(engine, keys)? || limited;
    keys.note_usage_moves(moves);
    Ok(moves)
}

/// [`push_keys`] when the store's keys have not changed since the last push (its generation
/// has not moved): the engine's own records take the blocks the month's usage puts on them
/// now, from one grouped read of the usage rows, without listing and decoding every stored
/// key again. Same answer as [`push_keys`].
pub fn recheck_quotas(engine: &Engine, keys: &KeyAdmin) -> Result<bool, KeyStoreError> {
    let now = keys.now_ms();
    let limited = engine.has_usage_limited_keys();
    let usage = if limited {
        Some(crate::keys::quotas::month_usage(
            keys.store().as_ref(),
            now,
        )?)
    } else {
        None
    };
    engine.recheck_quota_blocks(usage.as_ref(), now);
    let moves = absorb_budget_use(engine, keys)? || limited;
    keys.note_usage_moves(moves);
    Ok(moves)
}

/// Gives the engine the budgets' use the key store counted; returns whether the pool has a
/// budget policy (usage rows then move what is pushed).
fn absorb_budget_use(engine: &Engine, keys: &KeyAdmin) -> Result<bool, KeyStoreError> {
    let budgets = !engine.config().budgets.is_empty();
    if budgets {
        engine.absorb_budget_use(&keys.store().budget_use(keys.now_ms())?);
    }
    Ok(budgets)
}

/// Polls the key store's change counter and pushes its keys into the snapshot when another
/// process changed them, until `shutdown` flips. Also recomputes the quota blocks when
/// `usage_written` fires (the usage of the call that crossed a limit is then in the store),
/// when the UTC day changes (blocks end) and every few seconds: on the engine's records
/// ([`recheck_quotas`]) while the counter has not moved, so a recheck costs one usage read,
/// not a listing of every stored key.
pub async fn run_key_sync(
    engine: Arc<Engine>,
    keys: Arc<KeyAdmin>,
    usage_written: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(KEY_SYNC_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut day = String::new();
    let mut ticks = 0u32;
    let mut failing = false;
    let mut rechecked: Option<tokio::time::Instant> = None;
    loop {
        let written = tokio::select! {
            _ = tick.tick() => false,
            _ = usage_written.notified() => true,
            _ = shutdown.wait_for(|stopped| *stopped) => break,
        };
        if written {
            // Usage rows move no block when no key has a usage limit; and under load rows
            // are written many times a second: one recheck per gap is enough.
            if !keys.usage_moves() {
                continue;
            }
            let wait = rechecked.map_or(Duration::ZERO, |at| {
                QUOTA_RECHECK_MIN_GAP.saturating_sub(at.elapsed())
            });
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.wait_for(|stopped| *stopped) => break,
                }
            }
        }
        ticks += 1;
        let today = utc_day(keys.now_ms());
        let recheck = written || today != day || ticks >= QUOTA_RECHECK_TICKS;
        if recheck {
            ticks = 0;
        }
        let engine = engine.clone();
        let keys = keys.clone();
        if recheck {
            rechecked = Some(tokio::time::Instant::now());
        }
        let result = tokio::task::spawn_blocking(move || {
            let generation = keys.store().generation()?;
            // A write through this process's admin API pushed its keys already (each push and
            // recheck notes whether usage rows move anything pushed).
            if keys.pushed_generation() != Some(generation) {
                push_keys(&engine, &keys)?;
            } else if recheck {
                recheck_quotas(&engine, &keys)?;
            } else {
                // What other control planes on the store counted for the budgets, each tick
                // (one small read): a budget spent through one control plane is enforced
                // through every other within a tick or two, not at its next quota recheck.
                absorb_budget_use(&engine, &keys)?;
            }
            Ok::<_, KeyStoreError>(())
        })
        .await;
        match result {
            Ok(Ok(())) => {
                day = today;
                if failing {
                    tracing::info!("the key store is readable again");
                    failing = false;
                }
            }
            Ok(Err(err)) if !failing => {
                tracing::error!(%err, "cannot read the key store");
                failing = true;
            }
            Ok(Err(_)) => {}
            Err(err) => tracing::error!(%err, "the key sync task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::path::Path;
    use std::sync::atomic::AtomicI64;

    use super::*;
    use crate::clock::TestClock;
    use crate::config::secrets::MapEnv;
    use crate::keys::memory::MemoryKeyStore;
    use crate::keys::operations::KeySpec;
    use crate::keys::store::KeyStore;
    use crate::store::durable::DurableState;

    fn spec(label: &str) -> KeySpec {
        KeySpec {
            label: label.into(),
            models: vec!["m".into()],
            ..KeySpec::default()
        }
    }

    #[test]
    fn a_push_notes_the_generation_it_listed_so_the_sync_lists_only_anothers_change() {
        let env = MapEnv::new([("P_API_KEY", "sk-p")]);
        let config = crate::config::parse(
            "providers:\n  - { id: p, kind: openai, keysFromEnv: P, models: [{ id: m }] }\n",
        )
        .unwrap()
        .resolve(&env, Path::new("."))
        .unwrap();
        let clock = Arc::new(TestClock(AtomicI64::new(1_773_576_000_000)));
        let engine = Engine::new(
            Arc::new(config),
            Arc::new(env),
            clock.clone(),
            Vec::new(),
            DurableState::default(),
        );
        let store = Arc::new(MemoryKeyStore::default());
        let keys = KeyAdmin::new(store.clone(), Vec::new(), clock);
        assert_eq!(keys.pushed_generation(), None, "nothing pushed yet");

        // A write through the admin API pushes at once, at the generation it made.
        keys.create(spec("one")).unwrap();
        push_keys(&engine, &keys).unwrap();
        assert_eq!(keys.pushed_generation(), Some(store.generation().unwrap()));
        assert_eq!(engine.tables().virtual_keys.len(), 1);

        // Another process's write moves the generation past it: the sync's next tick lists.
        let other = KeyAdmin::new(
            store.clone(),
            Vec::new(),
            Arc::new(TestClock(AtomicI64::new(0))),
        );
        other.create(spec("two")).unwrap();
        assert_ne!(keys.pushed_generation(), Some(store.generation().unwrap()));
        push_keys(&engine, &keys).unwrap();
        assert_eq!(engine.tables().virtual_keys.len(), 2);
        assert_eq!(keys.pushed_generation(), Some(store.generation().unwrap()));
        // Whether usage rows move anything pushed follows every push, an admin write's
        // included: the sync rechecks after usage writes only then.
        assert!(!keys.usage_moves(), "no key has a usage limit");
        keys.create(KeySpec {
            quota: Some(crate::config::QuotaConfig {
                tokens_per_day: Some(1_000),
                ..Default::default()
            }),
            ..spec("limited")
        })
        .unwrap();
        push_keys(&engine, &keys).unwrap();
        assert!(keys.usage_moves(), "a key with a usage limit");
    }
}
