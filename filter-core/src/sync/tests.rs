//! The sync client driven by scripted updates over an in-memory host: a snapshot then deltas,
//! a gap, a reconnect with backoff, a publish that fails part way.

use ai_router_contract::shared as names;
use ai_router_proto::tables::Tables;
use ai_router_proto::v1::{Delta, KeyHealth, Snapshot, StateUpdate, VirtualKey};
use prost::Message;

use super::record::SyncRecord;
use super::{
    host::{Level, SyncHost},
    SyncClient,
};
use crate::vm::{MemoryShared, SharedData, SharedError};

#[derive(Default)]
struct Script {
    shared: MemoryShared,
    now: i64,
    /// Watch requests sent, in order (`known_version` of each).
    watches: Vec<u64>,
    refuse_watch: bool,
    cancelled: Vec<u32>,
    next_token: u32,
    logs: Vec<(Level, String)>,
    applied: Vec<u64>,
    /// Unary calls made: method and message.
    calls: Vec<(String, Vec<u8>)>,
}

impl SharedData for Script {
    fn get(&self, name: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedError> {
        self.shared.get(name)
    }
    fn set(&mut self, name: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedError> {
        self.shared.set(name, value, cas)
    }
}

impl SyncHost for Script {
    fn now_ms(&self) -> i64 {
        self.now
    }
    fn open_watch(&mut self, request: &[u8]) -> Result<u32, String> {
        if self.refuse_watch {
            return Err("to cluster 'cp': BadArgument".into());
        }
        let request =
            ai_router_proto::v1::WatchRequest::decode(request).map_err(|e| e.to_string())?;
        self.watches.push(request.known_version);
        self.next_token += 1;
        Ok(self.next_token)
    }
    fn cancel_watch(&mut self, token: u32) {
        self.cancelled.push(token);
    }
    fn call(&mut self, method: &str, message: &[u8], _timeout_ms: u64) -> Result<u32, String> {
        self.calls.push((method.to_owned(), message.to_vec()));
        self.next_token += 1;
        Ok(self.next_token)
    }
    fn dequeue(&mut self) -> Option<Vec<u8>> {
        None
    }
    fn log(&mut self, level: Level, line: &str) {
        self.logs.push((level, line.to_owned()));
    }
    fn reports_settled(&mut self, _n: u64) {}
    fn state_applied(&mut self, version: u64) {
        self.applied.push(version);
    }
}

impl Script {
    fn vk(&self, sha: &str) -> Option<VirtualKey> {
        let bytes = self.shared.bytes(&names::virtual_key(sha))?;
        VirtualKey::decode(bytes).ok()
    }
    fn sync(&self) -> Option<SyncRecord> {
        SyncRecord::decode(self.shared.bytes(names::SYNC)?)
    }
}

fn key(sha: &str, enabled: bool) -> VirtualKey {
    VirtualKey {
        id: format!("id-{sha}"),
        sha256: sha.into(),
        enabled,
        ..Default::default()
    }
}

fn snapshot(keys: Vec<VirtualKey>) -> Snapshot {
    Snapshot {
        providers: vec![crate::testing::provider("p", "sk", vec![])],
        virtual_keys: keys,
        generated_at_ms: 7,
        ..Default::default()
    }
}

fn message(version: u64, snapshot: Option<Snapshot>, delta: Option<Delta>) -> Vec<u8> {
    StateUpdate {
        version,
        snapshot,
        delta,
    }
    .encode_to_vec()
}

/// The delta from `old` (at `base`) to `new` (at `version`).
fn delta(base: u64, old: Snapshot, version: u64, new: Snapshot) -> Delta {
    let old = Tables::from_snapshot(base, old);
    let new = Tables::from_snapshot(version, new);
    old.diff(&new).unwrap_or_default()
}

/// A client connected on a tick (stream token 1).
fn connected() -> (SyncClient, Script) {
    let mut host = Script {
        now: 1_000,
        ..Script::default()
    };
    let mut client = SyncClient::new("node-1".into(), host.now);
    client.on_tick(&mut host);
    assert_eq!(host.watches, vec![0], "the first watch knows no version");
    (client, host)
}

#[test]
fn a_snapshot_then_deltas_are_published_records_before_the_sync_record() {
    let (mut client, mut host) = connected();
    let v1 = snapshot(vec![key("aa", true)]);
    client.on_message(&mut host, 1, Some(&message(1, Some(v1.clone()), None)));
    assert_eq!(client.version(), 1);
    assert!(host.vk("aa").is_some_and(|k| k.enabled));
    assert!(host.shared.bytes(names::POOL).is_some());
    assert!(host.shared.bytes(&names::lanes("p")).is_some());
    let first = host.sync().expect("the sync record is written");
    assert_eq!(
        (first.pool_version, first.applied, first.generated_at_ms),
        (1, 1, 7)
    );

    // A delta that only disables the key: its record moves, the pool does not.
    let v2 = snapshot(vec![key("aa", false)]);
    let d = delta(1, v1.clone(), 2, v2.clone());
    client.on_message(&mut host, 1, Some(&message(2, None, Some(d))));
    assert_eq!(client.version(), 2);
    assert!(host.vk("aa").is_some_and(|k| !k.enabled));
    let second = host.sync().expect("sync record");
    assert_eq!((second.pool_version, second.applied), (1, 2));
    assert_eq!(host.applied, vec![1, 2], "the applied-state gauge follows");

    // A message on another stream is not this client's.
    client.on_message(&mut host, 9, Some(&message(3, Some(v1), None)));
    assert_eq!(client.version(), 2);
}

#[test]
fn a_gap_cancels_the_stream_and_watches_again_at_once_for_a_snapshot() {
    let (mut client, mut host) = connected();
    let v1 = snapshot(vec![key("aa", true)]);
    client.on_message(&mut host, 1, Some(&message(1, Some(v1.clone()), None)));
    // A delta whose base this client does not hold.
    let d = delta(5, v1.clone(), 6, snapshot(vec![key("aa", false)]));
    client.on_message(&mut host, 1, Some(&message(6, None, Some(d))));
    assert_eq!(host.cancelled, vec![1]);
    assert!(host.vk("aa").is_some_and(|k| k.enabled), "nothing applied");
    assert!(host
        .logs
        .iter()
        .any(|(l, m)| *l == Level::Error && m.contains("asking for the whole state again")));
    // The next tick, at the same time, watches again knowing no version.
    client.on_tick(&mut host);
    assert_eq!(host.watches, vec![0, 0]);
    client.on_message(&mut host, 2, Some(&message(7, Some(v1), None)));
    assert_eq!(client.version(), 7);
}

#[test]
fn a_broken_stream_reconnects_with_backoff_and_one_log_line_per_outage() {
    let (mut client, mut host) = connected();
    client.on_message(
        &mut host,
        1,
        Some(&message(3, Some(snapshot(vec![])), None)),
    );
    client.on_close(&mut host, 1, 14, Some("unavailable"));
    // Refused connects back off: 250, 500, 1000 ms.
    host.refuse_watch = true;
    let mut waits = Vec::new();
    for _ in 0..3 {
        let before = host.logs.len();
        // Tick every 10 ms until the client tries again.
        let start = host.now;
        while host.logs.len() == before {
            host.now += 10;
            client.on_tick(&mut host);
        }
        waits.push(host.now - start);
    }
    assert_eq!(waits, vec![250, 500, 1_000]);
    host.refuse_watch = false;
    host.now += 2_000;
    client.on_tick(&mut host);
    assert_eq!(host.watches, vec![0, 3], "the reconnect says what it holds");
    let closed = host
        .logs
        .iter()
        .filter(|(_, m)| m.contains("sync stream closed"))
        .count();
    assert_eq!(closed, 1);
    // Back: the backoff starts again from its base.
    client.on_message(
        &mut host,
        2,
        Some(&message(4, Some(snapshot(vec![])), None)),
    );
    assert!(host.logs.iter().any(|(_, m)| m.contains("is back")));
    client.on_close(&mut host, 2, 14, None);
    let start = host.now;
    host.refuse_watch = true;
    let before = host.logs.len();
    while host.logs.len() == before {
        host.now += 10;
        client.on_tick(&mut host);
    }
    assert_eq!(host.now - start, 250);
}

#[test]
fn a_publish_that_fails_part_way_writes_what_it_owes_on_the_next_try() {
    let (mut client, mut host) = connected();
    let v1 = snapshot(vec![key("aa", true), key("bb", true)]);
    client.on_message(&mut host, 1, Some(&message(1, Some(v1.clone()), None)));
    // The next update touches both keys; one record cannot be written this time.
    let v2 = snapshot(vec![key("aa", false), key("bb", false)]);
    host.shared.fail(&names::virtual_key("aa"), 1);
    let d = delta(1, v1, 2, v2.clone());
    client.on_message(&mut host, 1, Some(&message(2, None, Some(d))));
    assert!(host.vk("bb").is_some_and(|k| !k.enabled));
    assert!(host.vk("aa").is_some_and(|k| k.enabled), "the failed write");
    assert!(client.owes());
    // The next tick writes it with what the tables hold now.
    client.on_tick(&mut host);
    assert!(host.vk("aa").is_some_and(|k| !k.enabled));
    assert!(!client.owes());

    // A pool that cannot be written: the update is not published (nothing after the pool),
    // then is, whole, on the next tick.
    let mut v3 = v2.clone();
    v3.providers[0].keys[0].weight = 5.0;
    v3.key_health.push(KeyHealth {
        provider: "p".into(),
        key: "a".into(),
        ..Default::default()
    });
    host.shared.fail(names::POOL, 1);
    let applied = host.sync().map(|s| s.applied);
    let d = delta(2, v2, 3, v3);
    client.on_message(&mut host, 1, Some(&message(3, None, Some(d))));
    assert_eq!(client.version(), 2);
    assert_eq!(host.sync().map(|s| s.applied), applied, "no sync record");
    let lanes = host.shared.records.get(&names::lanes("p")).map(|r| r.1);
    client.on_tick(&mut host);
    assert_eq!(client.version(), 3);
    assert!(host.sync().is_some_and(|s| s.pool_version == 2));
    assert_ne!(
        host.shared.records.get(&names::lanes("p")).map(|r| r.1),
        lanes,
        "the provider's lane health is written after the pool"
    );
    assert_eq!(host.applied, vec![1, 2, 3]);
}

/// The attempts in flight per key, as the report batches carry them: sent alone when they
/// change, again every few seconds while any is in flight, and not while nothing changes.
#[test]
fn the_attempts_in_flight_go_to_the_control_plane_when_they_change() {
    use ai_router_proto::v1::{KeyLoad, ReportBatch};

    use ai_router_contract::IN_FLIGHT_REFRESH_MS;

    let (mut client, mut host) = connected();
    client.on_message(
        &mut host,
        1,
        Some(&message(1, Some(snapshot(vec![])), None)),
    );
    let sent = |host: &mut Script| -> Vec<ReportBatch> {
        std::mem::take(&mut host.calls)
            .into_iter()
            .filter(|(method, _)| method == ai_router_proto::names::sync::REPORT)
            .map(|(_, bytes)| ReportBatch::decode(bytes.as_slice()).expect("a batch"))
            .collect()
    };
    client.on_tick(&mut host);
    assert!(
        sent(&mut host).is_empty(),
        "nothing in flight, nothing to say"
    );

    // Two attempts start on key k of p: one batch says so, stamped now.
    for _ in 0..2 {
        crate::vm::records::add_in_flight(&mut host, "p", "k", 1);
    }
    host.now += 10;
    client.on_tick(&mut host);
    let batches = sent(&mut host);
    let load = |b: &ReportBatch| {
        b.in_flight
            .iter()
            .map(|l: &KeyLoad| (l.provider.clone(), l.key.clone(), l.attempts))
            .collect::<Vec<_>>()
    };
    assert_eq!(batches.len(), 1);
    assert_eq!(load(&batches[0]), vec![("p".into(), "k".into(), 2)]);
    assert_eq!(batches[0].in_flight_at_ms, host.now);
    assert!(batches[0].attempts.is_empty() && batches[0].batch_id.is_empty());

    // Unchanged: nothing until the refresh is due.
    host.now += IN_FLIGHT_REFRESH_MS - 1;
    client.on_tick(&mut host);
    assert!(sent(&mut host).is_empty());
    host.now += 1;
    client.on_tick(&mut host);
    assert_eq!(sent(&mut host).len(), 1, "refreshed while in flight");

    // Both end: one batch says none, then silence.
    for _ in 0..2 {
        crate::vm::records::add_in_flight(&mut host, "p", "k", -1);
    }
    client.on_tick(&mut host);
    let batches = sent(&mut host);
    assert_eq!(batches.len(), 1);
    assert!(batches[0].in_flight.is_empty() && batches[0].in_flight_at_ms > 0);
    host.now += 10 * IN_FLIGHT_REFRESH_MS;
    client.on_tick(&mut host);
    assert!(sent(&mut host).is_empty());
}
