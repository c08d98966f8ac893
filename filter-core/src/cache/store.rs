//! This process's slots: a call looked up, a missed call's answer stored, and sent up to the
//! shared tier when there is one.

use ai_router_proto::names::sync;
use ai_router_proto::v1::{CacheSettings, CacheStore};
use serde_json::Value;

use super::entry::{lookup, slot_bytes, storable_for, Entry};
use super::key::slot_of;
use crate::host::Host;

/// Writes a store tries before it gives the slot up to the workers racing for it.
const STORE_TRIES: usize = 4;

/// Whether the client asked not to be served from a cache (`Cache-Control: no-cache` or
/// `no-store`).
pub fn bypassed(cache_control: Option<&str>) -> bool {
    cache_control.is_some_and(|v| {
        v.split(',')
            .map(|d| d.trim().to_ascii_lowercase())
            .any(|d| d == "no-cache" || d == "no-store")
    })
}

/// The pool's cache when this call uses it: the key's `cache` when set, else the merged
/// policy's, else on.
pub fn applies(
    pool: Option<&CacheSettings>,
    policy: Option<bool>,
    key: Option<bool>,
) -> Option<CacheSettings> {
    let pool = pool.filter(|c| c.ttl_ms > 0 && c.max_entries > 0)?;
    key.or(policy).unwrap_or(true).then_some(*pool)
}

/// Where a missed call's answer goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Miss {
    pub key: String,
    pub slot: u32,
    pub ttl_ms: u64,
    /// The largest entry the slot takes.
    pub slot_bytes: u64,
    /// The shared tier's wait (a Redis state store); 0: no shared tier.
    pub shared_ms: u64,
    /// The caller's protocol: the shape of the answer stored.
    pub protocol: crate::plan::Protocol,
}

/// What the cache did for a call.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Lookup {
    /// The cache is not on for this call.
    #[default]
    Off,
    /// The client asked not to be served from a cache.
    Bypass,
    Hit(Entry),
    Miss(Miss),
}

impl Lookup {
    /// The `x-ai-router-cache` value.
    pub fn header(&self) -> Option<&'static str> {
        match self {
            Lookup::Off => None,
            Lookup::Bypass => Some("bypass"),
            Lookup::Hit(_) => Some("hit"),
            Lookup::Miss(_) => Some("miss"),
        }
    }

    pub fn to_proto(&self) -> ai_router_proto::v1::CacheLookup {
        use ai_router_proto::v1::CacheLookup as L;
        match self {
            Lookup::Off => L::Unspecified,
            Lookup::Bypass => L::Bypass,
            Lookup::Hit(_) => L::Hit,
            Lookup::Miss(_) => L::Miss,
        }
    }
}

/// Looks the call whose key is `key` up in this process's slots.
pub fn look(
    host: &impl Host,
    cache: &CacheSettings,
    key: String,
    protocol: crate::plan::Protocol,
    cache_control: Option<&str>,
    now_ms: i64,
) -> Lookup {
    if bypassed(cache_control) {
        return Lookup::Bypass;
    }
    let slot = slot_of(&key, cache.max_entries);
    let (held, _) = host.cache_slot(slot);
    match lookup(held.as_deref(), &key, now_ms) {
        Some(entry) => Lookup::Hit(entry),
        None => Lookup::Miss(Miss {
            key,
            slot,
            ttl_ms: cache.ttl_ms,
            slot_bytes: slot_bytes(cache.max_bytes, cache.max_entries),
            shared_ms: cache.shared_lookup_ms,
            protocol,
        }),
    }
}

/// Stores a missed call's unary answer (`status`, `body`) from `provider`'s `model`, when it is
/// complete and fits its slot; says what became of it.
pub fn store(
    host: &mut impl Host,
    miss: &Miss,
    status: u16,
    body: &[u8],
    lane: (&str, &str),
    now_ms: i64,
) -> CacheStore {
    let complete = serde_json::from_slice::<Value>(body)
        .is_ok_and(|v| storable_for(miss.protocol, status, &v));
    if !complete {
        return CacheStore::Unstorable;
    }
    let entry = Entry {
        key: miss.key.clone(),
        expires_at_ms: now_ms.saturating_add(i64::try_from(miss.ttl_ms).unwrap_or(i64::MAX)),
        provider: lane.0.to_owned(),
        model: lane.1.to_owned(),
        body: body.to_vec(),
    };
    let bytes = entry.encode();
    if bytes.len() as u64 > miss.slot_bytes {
        return CacheStore::TooLarge;
    }
    for _ in 0..STORE_TRIES {
        let (held, cas) = host.cache_slot(miss.slot);
        if lookup(held.as_deref(), &miss.key, now_ms).is_some() {
            // Another worker stored the same request meanwhile: the slot has it.
            return CacheStore::Stored;
        }
        if host.set_cache_slot(miss.slot, &bytes, cas) {
            share(host, miss, bytes);
            return CacheStore::Stored;
        }
    }
    // The slot keeps changing under this worker: its last writer keeps it.
    CacheStore::Unstorable
}

/// How long the control plane may take to take a stored entry for the shared tier (the call
/// does not wait for it: its answer is ignored).
const SHARED_PUT_MS: u64 = 2_000;

pub(super) fn sync_metadata(token: Option<&String>) -> Vec<(&str, &[u8])> {
    match token {
        Some(t) => vec![(ai_router_contract::SYNC_TOKEN_METADATA, t.as_bytes())],
        None => Vec::new(),
    }
}

/// Sends an entry this process just stored up to the shared tier, when there is one; a
/// refusal leaves it local.
fn share(host: &mut impl Host, miss: &Miss, entry: Vec<u8>) {
    if miss.shared_ms == 0 {
        return;
    }
    let request = ai_router_proto::v1::SharedCachePutRequest {
        key: miss.key.clone(),
        entry,
        ttl_ms: miss.ttl_ms,
    };
    let token = host.sync_token();
    let _ = host.dispatch_grpc_call(
        ai_router_contract::clusters::CONTROL_PLANE,
        sync::SERVICE,
        sync::SHARED_CACHE_PUT,
        &sync_metadata(token.as_ref()),
        &prost::Message::encode_to_vec(&request),
        SHARED_PUT_MS,
    );
}
