//! A provider's lane health as Envoy's shared-data records: the singleton writes them, the
//! workers read them per lane choice.
//!
//! A provider with few keys has one record. A provider with many keys has a small record for
//! the provider as a whole (its breaker, its budget state, an operator's reset of all its keys,
//! and how many buckets its keys are spread over) and one record per bucket of keys, a key's or
//! a billing scope's bucket given by a hash of its name: a change to one key rewrites its bucket
//! and the small record, and a worker reads the small record per choice and a bucket only when
//! a lookup names one of its keys, decoding it again only when its version moved. The cost of a
//! choice follows the keys it looks at (the picker's key window), not the provider's key count.
//!
//! The provider record: `generation (u64 BE) | buckets (u32 BE) | ProviderLanes`; a bucket
//! record: `version (u64 BE) | ProviderLanes`, its version the generation that wrote it. The
//! generation moves whenever any record of the provider changed; the singleton writes the
//! buckets first and the provider record last.

use std::collections::HashMap;
use std::rc::Rc;

use ai_router_proto::v1::{BreakerScope, ProviderLanes};
use prost::Message;

use crate::state::{bucket_of, LaneParts};

/// A provider with at most this many keys keeps its lane health in one record.
pub const ONE_RECORD_KEYS: usize = 8;
/// Keys per bucket, on average.
pub const KEYS_PER_BUCKET: usize = 4;
/// However many keys, at most this many buckets per provider.
pub const MAX_BUCKETS: u32 = 1024;

const PROVIDER_HEAD: usize = 12;
const BUCKET_HEAD: usize = 8;

/// How many buckets a provider with `keys` keys spreads them over (0: one record).
pub fn bucket_count(keys: usize) -> u32 {
    if keys <= ONE_RECORD_KEYS {
        return 0;
    }
    u32::try_from(keys.div_ceil(KEYS_PER_BUCKET))
        .unwrap_or(MAX_BUCKETS)
        .min(MAX_BUCKETS)
}

/// Splits a provider's lane health into what concerns the provider as a whole and `count`
/// buckets of keys (`count` 0: everything stays in the first part).
pub fn split(lanes: ProviderLanes, count: u32) -> (ProviderLanes, Vec<ProviderLanes>) {
    if count == 0 {
        return (lanes, Vec::new());
    }
    let mut top = ProviderLanes {
        provider_health: lanes.provider_health,
        ..ProviderLanes::default()
    };
    let mut buckets = vec![ProviderLanes::default(); count as usize];
    let at = |name: &str| bucket_of(name, count) as usize;
    for h in lanes.key_health {
        buckets[at(&h.key)].key_health.push(h);
    }
    for c in lanes.cooldowns {
        buckets[at(&c.key)].cooldowns.push(c);
    }
    for b in lanes.breakers {
        if b.scope() == BreakerScope::Provider {
            top.breakers.push(b);
        } else {
            buckets[at(&b.key)].breakers.push(b);
        }
    }
    for h in lanes.headroom {
        // Looked up by billing scope: the scope's, else the key's (its own scope).
        let owner = if h.scope.is_empty() { &h.key } else { &h.scope };
        buckets[at(owner)].headroom.push(h);
    }
    for r in lanes.resets {
        if r.key.is_empty() {
            top.resets.push(r);
        } else {
            buckets[at(&r.key)].resets.push(r);
        }
    }
    (top, buckets)
}

/// One record of a provider's lane health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Provider,
    Bucket(u32),
}

fn word(bytes: &[u8], at: usize) -> Option<u64> {
    let w: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_be_bytes(w))
}

pub fn encode_provider(generation: u64, count: u32, lanes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PROVIDER_HEAD + lanes.len());
    out.extend_from_slice(&generation.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(lanes);
    out
}

/// The provider record's generation, bucket count and own lane health (still encoded).
pub fn decode_provider(bytes: &[u8]) -> Option<(u64, u32, &[u8])> {
    let generation = word(bytes, 0)?;
    let count: [u8; 4] = bytes.get(8..PROVIDER_HEAD)?.try_into().ok()?;
    let count = u32::from_be_bytes(count);
    // Not a record of this layout (one an older filter wrote, say).
    if count > MAX_BUCKETS {
        return None;
    }
    Some((generation, count, &bytes[PROVIDER_HEAD..]))
}

pub fn encode_bucket(version: u64, lanes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(BUCKET_HEAD + lanes.len());
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(lanes);
    out
}

/// A bucket record's version and lane health (still encoded).
pub fn decode_bucket(bytes: &[u8]) -> Option<(u64, &[u8])> {
    Some((word(bytes, 0)?, &bytes[BUCKET_HEAD..]))
}

/// What the singleton last wrote for one provider.
#[derive(Debug, Default)]
struct Written {
    generation: u64,
    /// The provider record's lane health, and each bucket's (encoded, without their heads).
    provider: Vec<u8>,
    buckets: Vec<Vec<u8>>,
}

/// The singleton's side: which records of a provider a new lane health changes.
#[derive(Debug)]
pub struct LaneWriter {
    next_generation: u64,
    written: HashMap<String, Written>,
}

impl LaneWriter {
    /// `start`: above any generation a previous singleton of this process wrote (a restart
    /// finds their records still in shared data; the workers must not take a new record for
    /// one they decoded), e.g. the time in µs.
    pub fn new(start: u64) -> Self {
        LaneWriter {
            next_generation: start,
            written: HashMap::new(),
        }
    }

    /// The records to write for `provider` (`keys` keys) to say `lanes`, buckets first and the
    /// provider record last; none when nothing changed. A bucket no longer used is written
    /// empty.
    pub fn update(
        &mut self,
        provider: &str,
        lanes: ProviderLanes,
        keys: usize,
    ) -> Vec<(Record, Vec<u8>)> {
        let count = bucket_count(keys);
        let (top, buckets) = split(lanes, count);
        let top = top.encode_to_vec();
        let buckets: Vec<Vec<u8>> = buckets.iter().map(Message::encode_to_vec).collect();
        let old = self.written.remove(provider);
        let unchanged = old
            .as_ref()
            .is_some_and(|o| o.provider == top && o.buckets == buckets);
        if unchanged {
            if let Some(old) = old {
                self.written.insert(provider.to_owned(), old);
            }
            return Vec::new();
        }
        self.next_generation += 1;
        let generation = self.next_generation;
        let old_buckets = old.map(|o| o.buckets).unwrap_or_default();
        let mut writes = Vec::new();
        for (b, bytes) in buckets.iter().enumerate() {
            if old_buckets.get(b) != Some(bytes) {
                writes.push((Record::Bucket(b as u32), encode_bucket(generation, bytes)));
            }
        }
        for b in buckets.len()..old_buckets.len() {
            writes.push((Record::Bucket(b as u32), Vec::new()));
        }
        writes.push((Record::Provider, encode_provider(generation, count, &top)));
        self.written.insert(
            provider.to_owned(),
            Written {
                generation,
                provider: top,
                buckets,
            },
        );
        writes
    }

    /// Forgets what the provider's records hold (a write of them failed): the next
    /// [`LaneWriter::update`] writes them all.
    pub fn forget(&mut self, provider: &str) {
        self.written.remove(provider);
    }

    /// The generation of the provider's records as last written.
    pub fn generation(&self, provider: &str) -> Option<u64> {
        self.written.get(provider).map(|w| w.generation)
    }
}

/// A provider's lane health as a worker last read it.
#[derive(Debug, Default)]
struct Seen {
    generation: u64,
    count: u32,
    /// The provider record's lane health, encoded (compared, not decoded, per choice).
    provider: Vec<u8>,
    parts: Rc<LaneParts>,
    buckets: HashMap<u32, SeenBucket>,
}

#[derive(Debug)]
struct SeenBucket {
    version: u64,
    /// The generation at which the record was last read: at that generation it is current.
    checked: u64,
    parts: Rc<LaneParts>,
}

/// The worker's side: each provider's records as last read, decoded, so a record is decoded
/// again only when it changed. It holds at most one decoded copy of each provider's lane
/// health (its buckets as they were looked at) and the encoded provider records.
#[derive(Debug, Default)]
pub struct LaneReader {
    providers: HashMap<String, Seen>,
}

/// A provider record as read: its generation, bucket count and own part.
#[derive(Debug, Clone)]
pub struct ProviderRecord {
    pub generation: u64,
    pub count: u32,
    pub parts: Rc<LaneParts>,
}

impl LaneReader {
    /// Takes the provider record's bytes; `None` when they do not decode.
    pub fn provider(&mut self, provider: &str, bytes: &[u8]) -> Option<ProviderRecord> {
        let (generation, count, lanes) = decode_provider(bytes)?;
        if let Some(seen) = self.providers.get_mut(provider) {
            if seen.provider.as_slice() != lanes {
                seen.parts = Rc::new(LaneParts::decode(lanes)?);
                seen.provider = lanes.to_vec();
            }
            if seen.count != count {
                seen.buckets.clear();
                seen.count = count;
            }
            seen.generation = generation;
            return Some(ProviderRecord {
                generation,
                count,
                parts: seen.parts.clone(),
            });
        }
        let parts = Rc::new(LaneParts::decode(lanes)?);
        self.providers.insert(
            provider.to_owned(),
            Seen {
                generation,
                count,
                provider: lanes.to_vec(),
                parts: parts.clone(),
                buckets: HashMap::new(),
            },
        );
        Some(ProviderRecord {
            generation,
            count,
            parts,
        })
    }

    /// Bucket `b` of `provider` as of the provider record's `generation`: the decoded copy
    /// when it was read at that generation, else the record `read` returns, decoded only when
    /// its version moved. A missing or undecodable record says nothing.
    pub fn bucket(
        &mut self,
        provider: &str,
        b: u32,
        generation: u64,
        read: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Rc<LaneParts> {
        let Some(seen) = self.providers.get_mut(provider) else {
            return Rc::default();
        };
        if let Some(hit) = seen.buckets.get_mut(&b) {
            if hit.checked >= generation {
                return hit.parts.clone();
            }
        }
        let bytes = read().unwrap_or_default();
        let Some((version, lanes)) = decode_bucket(&bytes) else {
            seen.buckets.remove(&b);
            return Rc::default();
        };
        if let Some(hit) = seen.buckets.get_mut(&b) {
            if hit.version == version {
                hit.checked = generation.max(version);
                return hit.parts.clone();
            }
        }
        let parts = Rc::new(LaneParts::decode(lanes).unwrap_or_default());
        seen.buckets.insert(
            b,
            SeenBucket {
                version,
                checked: generation.max(version),
                parts: parts.clone(),
            },
        );
        parts
    }

    /// How many buckets of `provider` this reader holds decoded.
    pub fn buckets_held(&self, provider: &str) -> usize {
        self.providers.get(provider).map_or(0, |s| s.buckets.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::LaneHealth;
    use ai_router_proto::v1::{
        BreakerPhase, BreakerState, Headroom, HoldReset, KeyHealth, KeyOutReason, LaneCooldown,
        ProviderHealth,
    };
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    fn alias(i: usize) -> String {
        format!("k{i}")
    }

    /// Health for every key of a 1,000-key provider, and some for the provider.
    fn lanes(keys: usize, remaining: i64) -> ProviderLanes {
        let mut l = ProviderLanes::default();
        for i in 0..keys {
            l.headroom.push(Headroom {
                provider: "p".into(),
                key: alias(i),
                model: "m".into(),
                remaining_requests: remaining + i as i64,
                remaining_tokens: -1,
                as_of_ms: 5,
                reset_at_ms: 60_000,
                ..Headroom::default()
            });
        }
        l.key_health.push(KeyHealth {
            provider: "p".into(),
            key: alias(3),
            reason: KeyOutReason::Auth.into(),
            until_ms: 0,
            refused_fingerprint: 9,
        });
        l.cooldowns.push(LaneCooldown {
            provider: "p".into(),
            key: alias(7),
            model: "m".into(),
            until_ms: 42,
        });
        l.breakers.push(BreakerState {
            scope: BreakerScope::Key.into(),
            provider: "p".into(),
            key: alias(11),
            state: BreakerPhase::Open.into(),
            open_until_ms: 99,
        });
        l.breakers.push(BreakerState {
            scope: BreakerScope::Provider.into(),
            provider: "p".into(),
            state: BreakerPhase::HalfOpen.into(),
            ..BreakerState::default()
        });
        l.provider_health.push(ProviderHealth {
            provider: "p".into(),
            until_ms: 77,
            ..ProviderHealth::default()
        });
        l.resets.push(HoldReset {
            provider: "p".into(),
            key: String::new(),
            at_ms: 3,
        });
        l.resets.push(HoldReset {
            provider: "p".into(),
            key: alias(20),
            at_ms: 8,
        });
        l
    }

    /// What a worker sees through `reader` of the records in `store`.
    fn read(
        reader: &Rc<RefCell<LaneReader>>,
        store: &Rc<RefCell<BTreeMap<String, Vec<u8>>>>,
        reads: &Rc<RefCell<usize>>,
    ) -> LaneHealth {
        let bytes = store.borrow().get("top").cloned().unwrap_or_default();
        let Some(record) = reader.borrow_mut().provider("p", &bytes) else {
            return LaneHealth::default();
        };
        if record.count == 0 {
            return LaneHealth::whole(record.parts);
        }
        let (reader, store, reads) = (reader.clone(), store.clone(), reads.clone());
        let generation = record.generation;
        LaneHealth::bucketed(
            record.parts,
            record.count,
            Rc::new(move |b| {
                reader.borrow_mut().bucket("p", b, generation, || {
                    *reads.borrow_mut() += 1;
                    store.borrow().get(&format!("b{b}")).cloned()
                })
            }),
        )
    }

    fn store_writes(store: &RefCell<BTreeMap<String, Vec<u8>>>, writes: Vec<(Record, Vec<u8>)>) {
        for (record, bytes) in writes {
            let name = match record {
                Record::Provider => "top".to_string(),
                Record::Bucket(b) => format!("b{b}"),
            };
            store.borrow_mut().insert(name, bytes);
        }
    }

    #[test]
    fn buckets_follow_the_key_count() {
        assert_eq!(bucket_count(0), 0);
        assert_eq!(bucket_count(ONE_RECORD_KEYS), 0);
        assert_eq!(bucket_count(ONE_RECORD_KEYS + 1), 3);
        assert_eq!(bucket_count(1_000), 250);
        assert_eq!(bucket_count(1_000_000), MAX_BUCKETS);
        // Stable across builds: both sides of the shared data must agree.
        assert_eq!(bucket_of("k1", 250), bucket_of("k1", 250));
        assert_eq!(bucket_of("", 1), 0);
        let used: std::collections::BTreeSet<u32> =
            (0..1_000).map(|i| bucket_of(&alias(i), 250)).collect();
        assert!(used.len() > 200, "{}", used.len());
    }

    #[test]
    fn records_round_trip() {
        let p = encode_provider(7, 250, b"abc");
        assert_eq!(decode_provider(&p), Some((7, 250, &b"abc"[..])));
        let b = encode_bucket(9, b"xy");
        assert_eq!(decode_bucket(&b), Some((9, &b"xy"[..])));
        assert_eq!(decode_provider(&p[..11]), None);
        assert_eq!(
            decode_provider(&encode_provider(7, MAX_BUCKETS + 1, b"")),
            None
        );
        assert_eq!(decode_bucket(&b[..7]), None);
        assert_eq!(decode_bucket(&[]), None);
    }

    #[test]
    fn the_buckets_say_what_the_whole_record_says() {
        for keys in [4, 1_000] {
            let whole = LaneHealth::new(lanes(keys, 100));
            let mut writer = LaneWriter::new(1_000);
            let store = Rc::new(RefCell::new(BTreeMap::new()));
            store_writes(&store, writer.update("p", lanes(keys, 100), keys));
            let reader = Rc::new(RefCell::new(LaneReader::default()));
            let reads = Rc::new(RefCell::new(0));
            let split = read(&reader, &store, &reads);
            for i in 0..keys {
                let k = alias(i);
                assert_eq!(split.headroom(&k, "m"), whole.headroom(&k, "m"));
                assert_eq!(split.key_health(&k), whole.key_health(&k));
                assert_eq!(split.cooldown_until(&k, "m"), whole.cooldown_until(&k, "m"));
                assert_eq!(
                    split.breaker(BreakerScope::Key, &k),
                    whole.breaker(BreakerScope::Key, &k)
                );
                assert_eq!(split.reset_at_ms(&k), whole.reset_at_ms(&k));
            }
            assert_eq!(split.out_until_ms(), 77);
            assert!(split.breaker(BreakerScope::Provider, "").is_some());
            assert_eq!(split.breakers().count(), 2);
            assert_eq!(split.keys_out().count(), 1);
            assert_eq!(split.cooldown_until(&alias(7), "m"), 42);
            assert_eq!(split.reset_at_ms(&alias(20)), 8);
            assert_eq!(split.reset_at_ms(&alias(21)), 3);
        }
    }

    #[test]
    fn a_change_to_one_key_rewrites_only_its_bucket_and_the_provider_record() {
        let mut writer = LaneWriter::new(1_000);
        let first = writer.update("p", lanes(1_000, 100), 1_000);
        // Every bucket, then the provider record, last.
        assert_eq!(first.len(), 251);
        assert_eq!(first.last().map(|w| w.0), Some(Record::Provider));
        assert!(writer.update("p", lanes(1_000, 100), 1_000).is_empty());
        let mut changed = lanes(1_000, 100);
        changed.headroom[500].remaining_requests = 1;
        let writes = writer.update("p", changed, 1_000);
        assert_eq!(
            writes.iter().map(|w| w.0).collect::<Vec<_>>(),
            vec![
                Record::Bucket(bucket_of(&alias(500), 250)),
                Record::Provider
            ]
        );
        assert_eq!(writer.generation("p"), Some(1_002));
        // Fewer keys: fewer buckets, the others emptied.
        let fewer = writer.update("p", lanes(8, 100), 8);
        assert_eq!(fewer.len(), 251);
        assert!(fewer[..250].iter().all(|(_, bytes)| bytes.is_empty()));
    }

    #[test]
    fn a_worker_reads_the_buckets_it_looks_at_and_decodes_only_what_changed() {
        let mut writer = LaneWriter::new(1_000);
        let store = Rc::new(RefCell::new(BTreeMap::new()));
        store_writes(&store, writer.update("p", lanes(1_000, 100), 1_000));
        let reader = Rc::new(RefCell::new(LaneReader::default()));
        let reads = Rc::new(RefCell::new(0));
        let window: Vec<String> = (0..16).map(alias).collect();
        let look = |h: &LaneHealth| {
            for k in &window {
                h.headroom(k, "m");
                h.key_health(k);
            }
        };
        look(&read(&reader, &store, &reads));
        let first = *reads.borrow();
        assert!(first <= 16, "{first}");
        assert_eq!(reader.borrow().buckets_held("p"), first);
        // Nothing changed: no bucket read again.
        look(&read(&reader, &store, &reads));
        assert_eq!(*reads.borrow(), first);
        // Another key's change: the generation moved, so the looked-at buckets are read again
        // (their version, not decoded), and say what they said.
        let mut changed = lanes(1_000, 100);
        changed.headroom[900].remaining_requests = 1;
        store_writes(&store, writer.update("p", changed.clone(), 1_000));
        let h = read(&reader, &store, &reads);
        look(&h);
        assert_eq!(*reads.borrow(), 2 * first);
        assert_eq!(
            h.headroom(&alias(0), "m").map(|r| r.remaining_requests),
            Some(100)
        );
        assert_eq!(
            h.headroom(&alias(900), "m").map(|r| r.remaining_requests),
            Some(1)
        );
        // A change to a looked-at key is seen.
        changed.headroom[5].remaining_requests = 0;
        store_writes(&store, writer.update("p", changed, 1_000));
        let h = read(&reader, &store, &reads);
        assert_eq!(
            h.headroom(&alias(5), "m").map(|r| r.remaining_requests),
            Some(0)
        );
        // Held: at most the provider's buckets.
        assert!(reader.borrow().buckets_held("p") <= 250);
    }
}
