//! The singleton's other half: the workers' outcome reports, taken off the report queue into
//! the [`Outbox`] and sent to the control plane in batches, and the workers' asks for blocks of
//! a key's per-minute budget (`TakeMinuteCalls`), whose answers go into the keys' minute
//! records.

use std::collections::HashMap;

use ai_router_contract::shared as names;
use ai_router_contract::IN_FLIGHT_REFRESH_MS;
use ai_router_proto::names::sync;
use ai_router_proto::v1::{
    AttemptOutcome, KeyLoad, MinuteCallsReply, MinuteCallsRequest, ReportBatch, RequestOutcome,
};
use prost::Message;

use super::host::{Level, SyncHost};
use crate::vm::local::InFlight;
use crate::vm::minute_lease::Ask;
use crate::vm::reports::{
    bundled, Outbox, MAX_BATCH, MAX_BATCH_CONTENT_BYTES, MINUTE_ASK, REPORT_ATTEMPT, REPORT_BUNDLE,
    REPORT_REQUEST,
};

/// An ask for a block of a minute budget: short, since its calls pass on credit meanwhile.
pub const MINUTE_ASK_TIMEOUT_MS: u64 = 2_000;
/// A report batch's call.
pub const REPORT_TIMEOUT_MS: u64 = 5_000;
/// The gRPC status an ask that could not be sent is answered with (unavailable).
const UNAVAILABLE: u32 = 14;

/// The attempts in flight per provider key, as the workers count them in shared data (the
/// provider's `inflight` record), in `providers`' order; keys with none are left out.
pub fn key_load<'a>(
    shared: &impl crate::vm::SharedData,
    providers: impl Iterator<Item = &'a str>,
) -> Vec<KeyLoad> {
    let mut out = Vec::new();
    for provider in providers {
        let Ok((Some(bytes), _)) = shared.get(&names::in_flight(provider)) else {
            continue;
        };
        let Some(counts) = InFlight::decode(&bytes) else {
            continue;
        };
        let mut counts = counts.counts;
        counts.sort();
        for (key, attempts) in counts.into_iter().filter(|(_, n)| *n > 0) {
            out.push(KeyLoad {
                provider: provider.to_owned(),
                key,
                attempts,
            });
        }
    }
    out
}

pub struct Reports {
    node: String,
    /// Report batch ids: when this VM started, and how many batches it made.
    batch_epoch_ms: i64,
    batches_made: u64,
    /// Reports not yet acknowledged by the control plane.
    outbox: Outbox,
    /// `outbox.dropped` when it was last logged.
    logged_dropped: u64,
    /// `outbox.content_dropped` when it was last logged.
    logged_content_dropped: u64,
    /// Outcomes taken off the pending-reports gauge: settled by the outbox, or unreadable.
    unpended: u64,
    /// Queue messages whose outcomes could not be decoded (never sent: settled at once).
    unreadable: u64,
    /// Asks for minute blocks the workers queued, not sent yet.
    minute_asks: Vec<MinuteCallsRequest>,
    /// Asks in flight, by call token.
    minute_calls: HashMap<u32, MinuteCallsRequest>,
    /// The control plane is known not to answer asks (for logging once per outage).
    minute_failing: bool,
    /// The attempts in flight per key as last read ([`Reports::set_load`]).
    load: Vec<KeyLoad>,
    /// The counts as last sent, and when.
    load_sent: Option<(Vec<KeyLoad>, i64)>,
}

impl Reports {
    pub fn new(node: String, now_ms: i64) -> Self {
        Self {
            node,
            batch_epoch_ms: now_ms,
            batches_made: 0,
            outbox: Outbox::new(),
            logged_dropped: 0,
            logged_content_dropped: 0,
            unpended: 0,
            unreadable: 0,
            minute_asks: Vec::new(),
            minute_calls: HashMap::new(),
            minute_failing: false,
            load: Vec::new(),
            load_sent: None,
        }
    }

    /// The attempts in flight per key now ([`key_load`]): the next batch carries them.
    pub fn set_load(&mut self, load: Vec<KeyLoad>) {
        self.load = load;
    }

    /// Puts the counts in flight in `batch`, stamped now.
    fn stamp(&mut self, batch: &mut ReportBatch, now_ms: i64) {
        batch.in_flight.clone_from(&self.load);
        batch.in_flight_at_ms = now_ms;
        self.load_sent = Some((self.load.clone(), now_ms));
    }

    /// Sends the counts in flight alone (a batch without outcomes or id, not kept for a retry:
    /// the next one says more) when no batch carried them since they changed, or for
    /// [`IN_FLIGHT_REFRESH_MS`] while any is in flight.
    fn send_load(&mut self, host: &mut impl SyncHost) {
        let now = host.now_ms();
        let due = match &self.load_sent {
            None => !self.load.is_empty(),
            Some((sent, at)) => {
                *sent != self.load || (!sent.is_empty() && now - at >= IN_FLIGHT_REFRESH_MS)
            }
        };
        if !due {
            return;
        }
        let mut batch = ReportBatch {
            node: self.node.clone(),
            ..ReportBatch::default()
        };
        self.stamp(&mut batch, now);
        if host
            .call(sync::REPORT, &batch.encode_to_vec(), REPORT_TIMEOUT_MS)
            .is_err()
        {
            // Sent again on the next tick.
            self.load_sent = None;
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// The answer to one of the singleton's unary calls (`body`: its message, when `status`
    /// is 0): an ask for a minute block, else a report batch.
    pub fn on_call_response(
        &mut self,
        host: &mut impl SyncHost,
        token: u32,
        status: u32,
        body: Option<&[u8]>,
    ) {
        if let Some(ask) = self.minute_calls.remove(&token) {
            // A grant of 0 is an empty message: no buffer at all.
            let granted = (status == 0)
                .then(|| MinuteCallsReply::decode(body.unwrap_or_default()).ok())
                .flatten()
                .map(|reply| u32::try_from(reply.granted).unwrap_or(u32::MAX));
            self.minute_answer(host, &ask, granted, status);
            return;
        }
        self.on_report_response(host, token, status);
    }

    /// Writes an answer (`None`: none came) into the key's minute record.
    fn minute_answer(
        &mut self,
        host: &mut impl SyncHost,
        ask: &MinuteCallsRequest,
        granted: Option<u32>,
        status: u32,
    ) {
        match granted {
            Some(_) if self.minute_failing => {
                self.minute_failing = false;
                host.log(
                    Level::Info,
                    "ai-router: the control plane grants minute budgets again",
                );
            }
            None if !self.minute_failing => {
                self.minute_failing = true;
                host.log(Level::Error, &format!(
                    "ai-router: the control plane does not grant minute budgets (grpc status {status}): this Envoy counts requestsPerMinute alone until it does"
                ));
            }
            _ => {}
        }
        let lease_ask = Ask {
            minute: ask.minute,
            calls: u32::try_from(ask.calls).unwrap_or(u32::MAX),
        };
        crate::vm::records::minute_answered(host, &ask.virtual_key_id, lease_ask, granted);
    }

    /// Sends the asks the workers queued.
    fn send_minute_asks(&mut self, host: &mut impl SyncHost) {
        for ask in std::mem::take(&mut self.minute_asks) {
            match host.call(
                sync::TAKE_MINUTE_CALLS,
                &ask.encode_to_vec(),
                MINUTE_ASK_TIMEOUT_MS,
            ) {
                Ok(token) => {
                    self.minute_calls.insert(token, ask);
                }
                // Logged once per outage by `minute_answer`.
                Err(_) => self.minute_answer(host, &ask, None, UNAVAILABLE),
            }
        }
    }

    fn on_report_response(&mut self, host: &mut impl SyncHost, token: u32, status: u32) {
        let ok = status == 0;
        if !self.outbox.answered(token, ok, host.now_ms()) {
            return;
        }
        if !ok && !self.outbox.failing {
            // One line per outage; the batch waits and is sent again.
            self.outbox.failing = true;
            host.log(Level::Error, &format!(
                "ai-router: reports are not getting through (grpc status {status}); keeping {} outcomes until they do",
                self.outbox.held()
            ));
        }
        self.send_reports(host);
        self.unpend(host);
    }

    /// Takes the outcomes settled since the last call off the pending-reports gauge.
    fn unpend(&mut self, host: &mut impl SyncHost) {
        let settled = self.outbox.settled() + self.unreadable;
        let delta = settled.saturating_sub(self.unpended);
        if delta > 0 {
            self.unpended = settled;
            host.reports_settled(delta);
        }
    }

    /// Moves the workers' reports from the queue into the outbox, then sends what may go.
    pub fn flush(&mut self, host: &mut impl SyncHost) {
        self.collect(host);
        self.send_minute_asks(host);
        self.send_reports(host);
        self.send_load(host);
        if self.outbox.dropped > self.logged_dropped {
            host.log(
                Level::Error,
                &format!(
                    "ai-router: the report outbox is full: {} outcomes dropped so far",
                    self.outbox.dropped
                ),
            );
            self.logged_dropped = self.outbox.dropped;
        }
        if self.outbox.content_dropped > self.logged_content_dropped {
            host.log(Level::Error, &format!(
                "ai-router: the report outbox holds its most content (telemetry.includeContent): {} attempts reported without it so far",
                self.outbox.content_dropped
            ));
            self.logged_content_dropped = self.outbox.content_dropped;
        }
        self.unpend(host);
    }

    fn send_reports(&mut self, host: &mut impl SyncHost) {
        while let Some(mut batch) = self.outbox.next(host.now_ms()) {
            batch.dropped = self.outbox.dropped;
            self.stamp(&mut batch, host.now_ms());
            match host.call(sync::REPORT, &batch.encode_to_vec(), REPORT_TIMEOUT_MS) {
                Ok(token) => self.outbox.sent(token, batch),
                Err(why) => {
                    if !self.outbox.failing {
                        self.outbox.failing = true;
                        host.log(
                            Level::Error,
                            &format!("ai-router: cannot send reports: {why}"),
                        );
                    }
                    self.outbox.not_sent(batch, host.now_ms());
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

    fn collect(&mut self, host: &mut impl SyncHost) {
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
                let Some(msg) = host.dequeue() else { break };
                let Some((&kind, body)) = msg.split_first() else {
                    continue;
                };
                let outcomes = if kind == REPORT_BUNDLE {
                    bundled(body)
                } else {
                    vec![(kind, body)]
                };
                for (kind, body) in outcomes {
                    content += self.take(&mut batch, kind, body);
                }
            }
            if batch.attempts.is_empty() && batch.requests.is_empty() {
                return;
            }
            self.outbox.push(batch);
        }
    }

    /// Adds one queued message to the batch (or to the asks); the content bytes it carried.
    fn take(&mut self, batch: &mut ReportBatch, kind: u8, body: &[u8]) -> usize {
        match kind {
            REPORT_ATTEMPT => match AttemptOutcome::decode(body) {
                Ok(a) => {
                    let content = crate::answer::content::size_of(a.content.as_ref());
                    batch.attempts.push(a);
                    return content;
                }
                Err(_) => self.unreadable += 1,
            },
            REPORT_REQUEST => match RequestOutcome::decode(body) {
                Ok(r) => batch.requests.push(r),
                Err(_) => self.unreadable += 1,
            },
            MINUTE_ASK => {
                if let Ok(ask) = MinuteCallsRequest::decode(body) {
                    self.minute_asks.push(ask);
                }
            }
            _ => {}
        }
        0
    }
}
