//! What one worker VM holds for the pool, counted by dhat's heap counter (the global allocator
//! of this test binary): the pool as the singleton publishes it (providers, their keys and
//! models; virtual keys are records of their own, read per call, never held), decoded once per
//! version into [`State`]. The bound per provider key is what `docs/reliability.md` states for a
//! VM's memory beside its calls; this test fails when a key comes to be held more than once.

use ai_router_filter_core::state::State;
use ai_router_proto::v1::{Model, Provider, ProviderKey, ProviderKind, Snapshot};
use prost::Message;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// What a worker may hold per provider key of the decoded pool, in bytes.
const MAX_BYTES_PER_PROVIDER_KEY: f64 = 512.0;
/// The whole decoded pool of 3 providers × 334 keys, at most.
const MAX_BYTES_LARGE_POOL: usize = 512 << 10;

/// A provider as the control plane pushes it: `keys` keys (secret and fingerprint each), two
/// models with an alias each.
fn provider(id: &str, kind: ProviderKind, keys: usize) -> Provider {
    Provider {
        id: id.into(),
        kind: kind.into(),
        scheme: "https".into(),
        authority: format!("{id}.example.com"),
        base_path: "/v1".into(),
        auth_header: "authorization".into(),
        keys: (0..keys)
            .map(|k| {
                let secret = format!("sk-{id}-{k:04}-{}", "x".repeat(40));
                ProviderKey {
                    alias: format!("{id}-key-{k}"),
                    fingerprint: ai_router_contract::fingerprint(&secret),
                    secret,
                    ..Default::default()
                }
            })
            .collect(),
        models: ["model-small", "model-large"]
            .iter()
            .map(|m| Model {
                id: format!("{id}/{m}"),
                aliases: vec![(*m).to_string()],
                context_window: 128_000,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The pool's bytes as published in shared data: 3 providers of `keys` keys each.
fn published_pool(keys: usize) -> Vec<u8> {
    Snapshot {
        providers: vec![
            provider("openai-a", ProviderKind::OpenaiCompatible, keys),
            provider("openai-b", ProviderKind::OpenaiCompatible, keys),
            provider("anthropic", ProviderKind::Anthropic, keys),
        ],
        ..Default::default()
    }
    .encode_to_vec()
}

/// Heap bytes held by the pool decoded from `bytes` (the bytes themselves not counted).
fn held_by_decoded(bytes: &[u8]) -> usize {
    let before = dhat::HeapStats::get().curr_bytes;
    let state = State::decode(1, bytes);
    let after = dhat::HeapStats::get().curr_bytes;
    assert!(state.is_some(), "the published pool decodes");
    drop(state);
    after - before
}

#[test]
fn a_worker_holds_one_decoded_pool_bounded_per_provider_key() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let (small_keys, large_keys) = (10, 334);
    let small = held_by_decoded(&published_pool(small_keys));
    let large_bytes = published_pool(large_keys);
    let large = held_by_decoded(&large_bytes);
    let per_key = (large - small) as f64 / (3 * (large_keys - small_keys)) as f64;
    println!(
        "decoded pool: {small} bytes at 3 x {small_keys} keys, {large} bytes at 3 x {large_keys} \
         keys ({} bytes published): {per_key:.0} bytes per provider key",
        large_bytes.len()
    );
    assert!(
        per_key <= MAX_BYTES_PER_PROVIDER_KEY,
        "{per_key:.0} bytes per provider key, over {MAX_BYTES_PER_PROVIDER_KEY}"
    );
    assert!(
        large <= MAX_BYTES_LARGE_POOL,
        "{large} bytes for 1,002 provider keys, over {MAX_BYTES_LARGE_POOL}"
    );
    // Decoding the same version again holds nothing more once the first copy is dropped: the
    // decode keeps nothing of its own beside the state it returns.
    let base = dhat::HeapStats::get().curr_bytes;
    for _ in 0..3 {
        drop(State::decode(1, &large_bytes));
    }
    assert_eq!(dhat::HeapStats::get().curr_bytes, base);
}
