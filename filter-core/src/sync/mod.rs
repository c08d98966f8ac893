//! The filter's half of the sync protocol, as a machine the singleton's glue drives: it holds
//! the control plane's watch stream for this Envoy process, keeps the pushed tables (a
//! snapshot, then each delta applied), publishes the records an update touched into shared data
//! for the workers (the pool, single virtual keys, single providers' lane health; the sync
//! record last), re-opens the stream with backoff when it breaks (the workers keep serving
//! from the last state meanwhile) or at once, asking for a snapshot, when a delta does not
//! follow what it holds; and ([`reports`]) sends the workers' reports back in batches (with
//! the attempts in flight per key) and asks for the blocks of per-minute budgets they need.
//!
//! A record whose write fails stays owed: it is written again on the next publish (the next
//! update or the next tick), with what the tables hold then.

pub mod host;
pub mod record;
pub mod reports;
#[cfg(test)]
mod tests;

use ai_router_contract::shared as names;
use ai_router_proto::tables::{Tables, Touched};
use ai_router_proto::v1::{StateUpdate, WatchRequest};
use prost::Message;

use crate::vm::lane_records::{LaneWriter, Record};
use host::{Level, SyncHost};
use record::SyncRecord;

/// The watch stream and the tables it feeds.
pub struct SyncClient {
    /// The stream's token while it is open.
    stream: Option<u32>,
    next_connect_ms: i64,
    /// Connects that failed or broke since the last applied update (the backoff's n).
    failures: u32,
    /// The version last published in full (sent as `known_version` on a reconnect).
    version: u64,
    connected_once: bool,
    /// An outage was already logged.
    quiet: bool,
    /// What the control plane pushed, as this process holds it.
    tables: Option<Tables>,
    /// The records owed to shared data: touched by an update, not yet written.
    owed: Touched,
    /// The sync record as last written.
    sync: SyncRecord,
    /// The providers' lane-health records as last written.
    lanes: LaneWriter,
    pub reports: reports::Reports,
}

impl SyncClient {
    /// `node`: this Envoy's name; `now_ms`: when the singleton started.
    pub fn new(node: String, now_ms: i64) -> Self {
        Self {
            stream: None,
            next_connect_ms: 0,
            failures: 0,
            version: 0,
            connected_once: false,
            quiet: false,
            tables: None,
            owed: Touched::default(),
            sync: SyncRecord::default(),
            // Above what a previous singleton of this process wrote: µs since the epoch.
            lanes: LaneWriter::new(u64::try_from(now_ms).unwrap_or(0).saturating_mul(1_000)),
            reports: reports::Reports::new(node, now_ms),
        }
    }

    /// The version last published in full.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether records are owed to shared data.
    pub fn owes(&self) -> bool {
        !is_empty(&self.owed)
    }

    /// The tick: (re)connects when due, writes what is owed, and moves the reports.
    pub fn on_tick(&mut self, host: &mut impl SyncHost) {
        if self.stream.is_none() && host.now_ms() >= self.next_connect_ms {
            self.connect(host);
        }
        if self.owes() && self.publish(host, Touched::default()) {
            self.published(host);
        }
        if let Some(tables) = &self.tables {
            let providers = tables.providers.iter().map(|p| p.id.as_str());
            self.reports.set_load(reports::key_load(host, providers));
        }
        self.reports.flush(host);
    }

    fn connect(&mut self, host: &mut impl SyncHost) {
        let request = WatchRequest {
            node: self.reports.node().to_owned(),
            known_version: self.version,
        }
        .encode_to_vec();
        match host.open_watch(&request) {
            Ok(token) => self.stream = Some(token),
            Err(why) => {
                host.log(
                    Level::Error,
                    &format!("ai-router: cannot open the sync stream {why}"),
                );
                self.schedule_reconnect(host.now_ms());
            }
        }
    }

    fn schedule_reconnect(&mut self, now_ms: i64) {
        self.stream = None;
        self.failures = self.failures.saturating_add(1);
        self.next_connect_ms = now_ms + crate::vm::backoff::control_plane_retry_ms(self.failures);
    }

    /// A message on stream `token` (its bytes, `None` when the host had none to give).
    pub fn on_message(&mut self, host: &mut impl SyncHost, token: u32, bytes: Option<&[u8]>) {
        if Some(token) != self.stream {
            return;
        }
        let Some(bytes) = bytes else { return };
        let update = match StateUpdate::decode(bytes) {
            Ok(u) => u,
            Err(e) => {
                host.log(
                    Level::Error,
                    &format!("ai-router: undecodable state update: {e}"),
                );
                return;
            }
        };
        let touched = match (update.snapshot, update.delta) {
            (Some(snapshot), _) => {
                let new = Tables::from_snapshot(update.version, snapshot);
                let touched = match &self.tables {
                    Some(old) => changed_records(old, &new),
                    None => Touched::all(&new),
                };
                self.tables = Some(new);
                touched
            }
            (None, Some(delta)) => {
                let applied = match self.tables.as_mut() {
                    Some(tables) => tables
                        .apply(update.version, &delta)
                        .map_err(|e| e.to_string()),
                    None => Err("a delta before any snapshot".to_string()),
                };
                match applied {
                    Ok(touched) => touched,
                    Err(e) => {
                        // Watch again at once: the first message is a snapshot.
                        host.log(
                            Level::Error,
                            &format!("ai-router: {e}; asking for the whole state again"),
                        );
                        host.cancel_watch(token);
                        self.stream = None;
                        self.version = 0;
                        self.next_connect_ms = host.now_ms();
                        return;
                    }
                }
            }
            (None, None) => return,
        };
        if !self.publish(host, touched) {
            return;
        }
        if !self.connected_once || self.version == 0 {
            host.log(
                Level::Info,
                &format!(
                    "ai-router: state version {} received from the control plane",
                    update.version
                ),
            );
        }
        if self.quiet {
            host.log(
                Level::Info,
                &format!(
                    "ai-router: sync stream to the control plane is back (state version {})",
                    update.version
                ),
            );
        }
        self.quiet = false;
        self.connected_once = true;
        self.failures = 0;
        self.published(host);
    }

    /// The tables' version is now what the workers read.
    fn published(&mut self, host: &mut impl SyncHost) {
        if let Some(tables) = &self.tables {
            if tables.version != self.version {
                host.state_applied(tables.version);
            }
            self.version = tables.version;
        }
    }

    /// Writes the records `touched` names and those still owed, then the sync record the
    /// workers look at first. `false` when the pool or the sync record could not be written
    /// (the update is not published); a record that could not be written stays owed.
    fn publish(&mut self, host: &mut impl SyncHost, touched: Touched) -> bool {
        self.owed.union(touched);
        let Some(tables) = &self.tables else {
            return false;
        };
        let mut owed = std::mem::take(&mut self.owed);
        if owed.pool {
            let pool = tables.pool_snapshot().encode_to_vec();
            if host.set(names::POOL, &pool, None).is_err() {
                host.log(Level::Error, "ai-router: cannot publish the pool");
                // Nothing else goes before the pool: the workers would pair them wrongly.
                self.owed = owed;
                return false;
            }
            self.sync.pool_version += 1;
        }
        let mut failed = Touched::default();
        for sha in std::mem::take(&mut owed.virtual_keys) {
            let bytes = tables
                .virtual_keys
                .get(&sha)
                .map(Message::encode_to_vec)
                .unwrap_or_default();
            if host.set(&names::virtual_key(&sha), &bytes, None).is_err() {
                host.log(Level::Error, "ai-router: cannot publish a virtual key");
                failed.virtual_keys.insert(sha);
            }
        }
        // A new pool may move a provider's keys between buckets (their count changed).
        let mut providers = std::mem::take(&mut owed.providers);
        if owed.pool {
            providers.extend(tables.providers.iter().map(|p| p.id.clone()));
        }
        for provider in providers {
            let keys = tables
                .providers
                .iter()
                .find(|p| p.id == provider)
                .map_or(0, |p| p.keys.len());
            let writes = self
                .lanes
                .update(&provider, tables.provider_lanes(&provider), keys);
            let mut ok = true;
            for (record, bytes) in writes {
                let name = match record {
                    Record::Provider => names::lanes(&provider),
                    Record::Bucket(b) => names::lane_bucket(&provider, b),
                };
                ok &= host.set(&name, &bytes, None).is_ok();
            }
            if !ok {
                host.log(
                    Level::Error,
                    "ai-router: cannot publish a provider's lane health",
                );
                // Written again whole: the writer no longer knows what the records hold.
                self.lanes.forget(&provider);
                failed.providers.insert(provider);
            }
        }
        self.owed = failed;
        self.sync.applied += 1;
        self.sync.generated_at_ms = tables.generated_at_ms;
        host.set(names::SYNC, &self.sync.encode(), None).is_ok()
    }

    /// Stream `token` closed with gRPC `status` (and the host's `message`, if any).
    pub fn on_close(
        &mut self,
        host: &mut impl SyncHost,
        token: u32,
        status: u32,
        message: Option<&str>,
    ) {
        if Some(token) != self.stream {
            return;
        }
        // One line per outage, not one per reconnect attempt.
        if !self.quiet {
            self.quiet = true;
            host.log(
                Level::Error,
                &format!(
                    "ai-router: sync stream closed (grpc status {status}{}); serving from state version {} until it is back",
                    message.map(|m| format!(": {m}")).unwrap_or_default(),
                    self.version
                ),
            );
        }
        self.schedule_reconnect(host.now_ms());
    }
}

fn is_empty(t: &Touched) -> bool {
    !t.pool && t.virtual_keys.is_empty() && t.providers.is_empty()
}

/// The records that differ between what this process held and a new snapshot (a reconnect):
/// what a delta between them would touch, else every record of either.
fn changed_records(old: &Tables, new: &Tables) -> Touched {
    if let Some(delta) = old.diff(new) {
        let mut scratch = old.clone();
        if let Ok(touched) = scratch.apply(new.version, &delta) {
            return touched;
        }
    }
    let mut touched = Touched::all(old);
    touched.union(Touched::all(new));
    touched
}
