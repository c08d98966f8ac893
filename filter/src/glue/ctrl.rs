//! The singleton that holds the control plane's sync stream for this Envoy process: it keeps
//! the pushed tables (a snapshot, then each delta applied), writes the records a delta touched
//! into shared data for the workers (the pool, single virtual keys, single providers' lane
//! health), re-opens the stream with backoff when it breaks (the workers keep serving from the
//! last state meanwhile) or when a delta does not follow what it holds, sends the workers'
//! reports back in batches, and asks for the blocks of per-minute budgets the workers need
//! (`TakeMinuteCalls`, answers written into the keys' minute records).

use ai_router_contract::shared as names;
use ai_router_filter_core::vm::lane_records::{LaneWriter, Record};
use ai_router_filter_core::vm::minute_lease::Ask;
use ai_router_proto::names::sync;
use ai_router_proto::tables::{Tables, Touched};
use ai_router_proto::v1::{
    AttemptOutcome, MinuteCallsReply, MinuteCallsRequest, ReportBatch, RequestOutcome, StateUpdate,
    WatchRequest,
};
use prost::Message;
use proxy_wasm::hostcalls;

use super::gauges::{self, Gauge};
use super::shared::{
    duration_ms, minute_answered, now_ms, MINUTE_ASK, REPORT_ATTEMPT, REPORT_BUNDLE, REPORT_QUEUE,
    REPORT_REQUEST,
};
use super::{log_error, log_info};
use ai_router_filter_core::vm::reports::{bundled, Outbox, MAX_BATCH, MAX_BATCH_CONTENT_BYTES};

const TOKEN_HEADER: &str = ai_router_contract::SYNC_TOKEN_METADATA;
/// An ask for a block of a minute budget: short, since its calls pass on credit meanwhile.
const MINUTE_ASK_TIMEOUT_MS: u64 = 2_000;

pub struct Ctrl {
    cluster: String,
    node: String,
    /// Report batch ids: when this VM started, and how many batches it made.
    batch_epoch_ms: i64,
    batches_made: u64,
    token: Option<String>,
    stream: Option<u32>,
    next_connect_ms: i64,
    backoff_ms: i64,
    queue: Option<u32>,
    version: u64,
    connected_once: bool,
    /// An outage was already logged.
    quiet: bool,
    /// What the control plane pushed, as this process holds it.
    tables: Option<Tables>,
    /// The version of the pool record, counted by this process (a restarted control plane
    /// counts its versions from elsewhere).
    pool_version: u64,
    /// Updates applied since start.
    applied: u64,
    /// The providers' lane-health records as last written.
    lanes: LaneWriter,
    /// Reports not yet acknowledged by the control plane.
    outbox: Outbox,
    /// `outbox.dropped` when it was last logged.
    logged_dropped: u64,
    /// Outcomes taken off the pending-reports gauge: settled by the outbox, or unreadable.
    unpended: u64,
    /// Queue messages whose outcomes could not be decoded (never sent: settled at once).
    unreadable: u64,
    /// Asks for minute blocks the workers queued, not sent yet.
    minute_asks: Vec<MinuteCallsRequest>,
    /// Asks in flight, by call token.
    minute_calls: std::collections::HashMap<u32, MinuteCallsRequest>,
    /// The control plane is known not to answer asks (for logging once per outage).
    minute_failing: bool,
    /// `outbox.content_dropped` when it was last logged.
    logged_content_dropped: u64,
}

impl Ctrl {
    pub fn new(cluster: String, node: String) -> Self {
        let token = std::env::var(ai_router_contract::SYNC_TOKEN_ENV)
            .ok()
            .filter(|t| !t.is_empty());
        Self {
            cluster,
            node,
            batch_epoch_ms: now_ms(),
            batches_made: 0,
            token,
            stream: None,
            next_connect_ms: 0,
            backoff_ms: 250,
            queue: None,
            version: 0,
            connected_once: false,
            quiet: false,
            tables: None,
            pool_version: 0,
            applied: 0,
            // Above what a previous singleton of this process wrote: µs since the epoch.
            lanes: LaneWriter::new(u64::try_from(now_ms()).unwrap_or(0).saturating_mul(1_000)),
            outbox: Outbox::new(),
            logged_dropped: 0,
            unpended: 0,
            unreadable: 0,
            minute_asks: Vec::new(),
            minute_calls: std::collections::HashMap::new(),
            minute_failing: false,
            logged_content_dropped: 0,
        }
    }

    pub fn start(&mut self, tick_ms: u64) {
        match hostcalls::register_shared_queue(REPORT_QUEUE) {
            Ok(q) => self.queue = Some(q),
            Err(e) => log_error(&format!(
                "ai-router: cannot register the report queue: {e:?}"
            )),
        }
        let _ = hostcalls::set_tick_period(duration_ms(tick_ms));
    }

    fn metadata(&self) -> Vec<(&str, &[u8])> {
        match &self.token {
            Some(t) => vec![(TOKEN_HEADER, t.as_bytes())],
            None => Vec::new(),
        }
    }

    fn connect(&mut self) {
        let request = WatchRequest {
            node: self.node.clone(),
            known_version: self.version,
        }
        .encode_to_vec();
        match hostcalls::open_grpc_stream(
            &self.cluster,
            sync::SERVICE,
            sync::WATCH,
            self.metadata(),
        ) {
            Ok(token) => {
                self.stream = Some(token);
                if let Err(e) = hostcalls::send_grpc_stream_message(token, Some(&request), true) {
                    log_error(&format!("ai-router: cannot send the watch request: {e:?}"));
                }
            }
            Err(e) => {
                log_error(&format!(
                    "ai-router: cannot open the sync stream to cluster '{}': {e:?}",
                    self.cluster
                ));
                self.schedule_reconnect();
            }
        }
    }

    fn schedule_reconnect(&mut self) {
        self.stream = None;
        self.next_connect_ms = now_ms() + self.backoff_ms;
        self.backoff_ms = (self.backoff_ms * 2).min(5_000);
    }

    pub fn on_tick(&mut self) {
        if self.stream.is_none() && now_ms() >= self.next_connect_ms {
            self.connect();
        }
        self.flush_reports();
    }

    pub fn on_stream_message(&mut self, token: u32, size: usize) {
        if Some(token) != self.stream {
            return;
        }
        let bytes = match hostcalls::get_buffer(
            proxy_wasm::types::BufferType::GrpcReceiveBuffer,
            0,
            size,
        ) {
            Ok(Some(b)) => b,
            _ => return,
        };
        let update = match StateUpdate::decode(bytes.as_slice()) {
            Ok(u) => u,
            Err(e) => {
                log_error(&format!("ai-router: undecodable state update: {e}"));
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
                        // Watch again: the first message is a snapshot.
                        log_error(&format!("ai-router: {e}; asking for the whole state again"));
                        let _ = hostcalls::cancel_grpc_stream(token);
                        self.stream = None;
                        self.version = 0;
                        self.next_connect_ms = now_ms();
                        return;
                    }
                }
            }
            (None, None) => return,
        };
        if !self.publish(&touched) {
            return;
        }
        if !self.connected_once || self.version == 0 {
            log_info(&format!(
                "ai-router: state version {} received from the control plane",
                update.version
            ));
        }
        if self.quiet {
            log_info(&format!(
                "ai-router: sync stream to the control plane is back (state version {})",
                update.version
            ));
        }
        self.quiet = false;
        self.connected_once = true;
        self.version = update.version;
        self.backoff_ms = 250;
    }

    /// Writes the records `touched` names, then the sync record the workers look at first.
    fn publish(&mut self, touched: &Touched) -> bool {
        let Some(tables) = &self.tables else {
            return false;
        };
        if touched.pool {
            let pool = tables.pool_snapshot().encode_to_vec();
            if hostcalls::set_shared_data(names::POOL, Some(&pool), None).is_err() {
                log_error("ai-router: cannot publish the pool");
                return false;
            }
            self.pool_version += 1;
        }
        for sha in &touched.virtual_keys {
            let bytes = tables
                .virtual_keys
                .get(sha)
                .map(Message::encode_to_vec)
                .unwrap_or_default();
            if hostcalls::set_shared_data(&names::virtual_key(sha), Some(&bytes), None).is_err() {
                log_error("ai-router: cannot publish a virtual key");
            }
        }
        // A new pool may move a provider's keys between buckets (their count changed).
        let mut providers: Vec<&String> = touched.providers.iter().collect();
        if touched.pool {
            providers.extend(tables.providers.iter().map(|p| &p.id));
            providers.sort();
            providers.dedup();
        }
        for provider in providers {
            let keys = tables
                .providers
                .iter()
                .find(|p| p.id == *provider)
                .map_or(0, |p| p.keys.len());
            for (record, bytes) in
                self.lanes
                    .update(provider, tables.provider_lanes(provider), keys)
            {
                let name = match record {
                    Record::Provider => names::lanes(provider),
                    Record::Bucket(b) => names::lane_bucket(provider, b),
                };
                if hostcalls::set_shared_data(&name, Some(&bytes), None).is_err() {
                    log_error("ai-router: cannot publish a provider's lane health");
                }
            }
        }
        self.applied += 1;
        let mut sync = [0u8; 24];
        sync[..8].copy_from_slice(&self.pool_version.to_be_bytes());
        sync[8..16].copy_from_slice(&tables.generated_at_ms.to_be_bytes());
        sync[16..].copy_from_slice(&self.applied.to_be_bytes());
        hostcalls::set_shared_data(names::SYNC, Some(&sync), None).is_ok()
    }

    pub fn on_stream_close(&mut self, token: u32, status: u32) {
        if Some(token) != self.stream {
            return;
        }
        let (_, message) = hostcalls::get_grpc_status().unwrap_or((status, None));
        // One line per outage, not one per reconnect attempt.
        if self.quiet {
            self.schedule_reconnect();
            return;
        }
        self.quiet = true;
        log_error(&format!(
            "ai-router: sync stream closed (grpc status {status}{}); serving from state version {} until it is back",
            message.map(|m| format!(": {m}")).unwrap_or_default(),
            self.version
        ));
        self.schedule_reconnect();
    }

    pub fn on_queue_ready(&mut self, _queue: u32) {
        self.flush_reports();
    }

    /// The answer to one of this singleton's unary calls: an ask for a minute block, else a
    /// report batch.
    pub fn on_call_response(&mut self, token: u32, status: u32, size: usize) {
        if let Some(ask) = self.minute_calls.remove(&token) {
            // A grant of 0 is an empty message: no buffer at all.
            let granted = (status == 0)
                .then(|| {
                    hostcalls::get_buffer(proxy_wasm::types::BufferType::GrpcReceiveBuffer, 0, size)
                        .ok()
                        .flatten()
                        .unwrap_or_default()
                })
                .and_then(|bytes| MinuteCallsReply::decode(bytes.as_slice()).ok())
                .map(|reply| u32::try_from(reply.granted).unwrap_or(u32::MAX));
            self.minute_answer(&ask, granted, status);
            return;
        }
        self.on_report_response(token, status);
    }

    /// Writes an answer (`None`: none came) into the key's minute record.
    fn minute_answer(&mut self, ask: &MinuteCallsRequest, granted: Option<u32>, status: u32) {
        match granted {
            Some(_) if self.minute_failing => {
                self.minute_failing = false;
                log_info("ai-router: the control plane grants minute budgets again");
            }
            None if !self.minute_failing => {
                self.minute_failing = true;
                log_error(&format!(
                    "ai-router: the control plane does not grant minute budgets (grpc status {status}): this Envoy counts requestsPerMinute alone until it does"
                ));
            }
            _ => {}
        }
        let lease_ask = Ask {
            minute: ask.minute,
            calls: u32::try_from(ask.calls).unwrap_or(u32::MAX),
        };
        minute_answered(&ask.virtual_key_id, lease_ask, granted);
    }

    /// Sends the asks the workers queued.
    fn send_minute_asks(&mut self) {
        for ask in std::mem::take(&mut self.minute_asks) {
            let bytes = ask.encode_to_vec();
            match hostcalls::dispatch_grpc_call(
                &self.cluster,
                sync::SERVICE,
                sync::TAKE_MINUTE_CALLS,
                self.metadata(),
                Some(&bytes),
                duration_ms(MINUTE_ASK_TIMEOUT_MS),
            ) {
                Ok(token) => {
                    self.minute_calls.insert(token, ask);
                }
                // Logged once per outage by `minute_answer` (14: unavailable).
                Err(_) => self.minute_answer(&ask, None, 14),
            }
        }
    }

    pub fn on_report_response(&mut self, token: u32, status: u32) {
        let ok = status == 0;
        if !self.outbox.answered(token, ok, now_ms()) {
            return;
        }
        if !ok && !self.outbox.failing {
            // One line per outage; the batch waits and is sent again.
            self.outbox.failing = true;
            log_error(&format!(
                "ai-router: reports are not getting through (grpc status {status}); keeping {} outcomes until they do",
                self.outbox.held()
            ));
        }
        self.send_reports();
        self.unpend();
    }

    /// Takes the outcomes settled since the last call off the pending-reports gauge.
    fn unpend(&mut self) {
        let settled = self.outbox.settled() + self.unreadable;
        let delta = settled.saturating_sub(self.unpended);
        if delta > 0 {
            self.unpended = settled;
            gauges::add(
                Gauge::ReportsPending,
                -i64::try_from(delta).unwrap_or(i64::MAX),
            );
        }
    }

    /// Moves the workers' reports from the shared queue into the outbox, then sends what may go.
    fn flush_reports(&mut self) {
        self.collect_reports();
        self.send_minute_asks();
        self.send_reports();
        if self.outbox.dropped > self.logged_dropped {
            log_error(&format!(
                "ai-router: the report outbox is full: {} outcomes dropped so far",
                self.outbox.dropped
            ));
            self.logged_dropped = self.outbox.dropped;
        }
        if self.outbox.content_dropped > self.logged_content_dropped {
            log_error(&format!(
                "ai-router: the report outbox holds its most content (telemetry.includeContent): {} attempts reported without it so far",
                self.outbox.content_dropped
            ));
            self.logged_content_dropped = self.outbox.content_dropped;
        }
        self.unpend();
    }

    fn send_reports(&mut self) {
        while let Some(mut batch) = self.outbox.next(now_ms()) {
            batch.dropped = self.outbox.dropped;
            let bytes = batch.encode_to_vec();
            match hostcalls::dispatch_grpc_call(
                &self.cluster,
                sync::SERVICE,
                sync::REPORT,
                self.metadata(),
                Some(&bytes),
                duration_ms(5_000),
            ) {
                Ok(token) => self.outbox.sent(token, batch),
                Err(e) => {
                    if !self.outbox.failing {
                        self.outbox.failing = true;
                        log_error(&format!("ai-router: cannot send reports: {e:?}"));
                    }
                    self.outbox.not_sent(batch, now_ms());
                    return;
                }
            }
        }
    }

    /// An id no other batch of this Envoy, before or after a restart, has.
    fn next_batch_id(&mut self) -> String {
        self.batches_made += 1;
        format!(
            "{}-{}-{}",
            self.node, self.batch_epoch_ms, self.batches_made
        )
    }

    fn collect_reports(&mut self) {
        let Some(queue) = self.queue else { return };
        loop {
            let mut batch = ReportBatch {
                node: self.node.clone(),
                // The same on every send of this batch: the control plane counts it once.
                batch_id: self.next_batch_id(),
                ..ReportBatch::default()
            };
            // With telemetry.includeContent, attempts are large: bytes close a batch too.
            let mut content = 0;
            while batch.attempts.len() + batch.requests.len() < MAX_BATCH
                && content < MAX_BATCH_CONTENT_BYTES
            {
                let Ok(Some(msg)) = hostcalls::dequeue_shared_queue(queue) else {
                    break;
                };
                let Some((&kind, body)) = msg.split_first() else {
                    continue;
                };
                let outcomes = if kind == REPORT_BUNDLE {
                    bundled(body)
                } else {
                    vec![(kind, body)]
                };
                for (kind, body) in outcomes {
                    match kind {
                        REPORT_ATTEMPT => {
                            if let Ok(a) = AttemptOutcome::decode(body) {
                                content += ai_router_filter_core::answer::content::size_of(
                                    a.content.as_ref(),
                                );
                                batch.attempts.push(a);
                            } else {
                                self.unreadable += 1;
                            }
                        }
                        REPORT_REQUEST => {
                            if let Ok(r) = RequestOutcome::decode(body) {
                                batch.requests.push(r);
                            } else {
                                self.unreadable += 1;
                            }
                        }
                        MINUTE_ASK => {
                            if let Ok(ask) = MinuteCallsRequest::decode(body) {
                                self.minute_asks.push(ask);
                            }
                        }
                        _ => {}
                    }
                }
            }
            if batch.attempts.is_empty() && batch.requests.is_empty() {
                return;
            }
            self.outbox.push(batch);
        }
    }
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
