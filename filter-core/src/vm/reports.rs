//! The singleton's outbox of outcome reports. Reports feed usage, quotas, budgets and breakers,
//! so one that could not be sent waits here until the control plane takes it: a batch leaves
//! only when the control plane acknowledged it. The outbox is bounded; past the bound the
//! oldest outcomes are dropped, and counted.
//!
//! With `telemetry.includeContent` an attempt also carries up to twice
//! [`CONTENT_MAX_BYTES`](ai_router_contract::defaults::CONTENT_MAX_BYTES) of content: a batch stops growing at
//! [`MAX_BATCH_CONTENT_BYTES`] of it (a `Report` stays far below gRPC's 4 MiB message limit),
//! and the outbox holds at most [`MAX_BUFFERED_CONTENT_BYTES`]; past that a new batch goes
//! without its content (the outcomes themselves are kept: they are the usage), and the
//! attempts that lost it are counted.

use std::collections::{BTreeMap, VecDeque};

use ai_router_proto::v1::ReportBatch;

/// Outcomes kept while the control plane is away (about 300 bytes each).
pub const MAX_BUFFERED_OUTCOMES: usize = 20_000;
/// Outcomes per `Report` call.
pub const MAX_BATCH: usize = 256;
/// Content bytes per `Report` call (the batch closes once it holds this much).
pub const MAX_BATCH_CONTENT_BYTES: usize = 1024 * 1024;
/// Content bytes kept while the control plane is away or slow.
pub const MAX_BUFFERED_CONTENT_BYTES: usize = 8 * 1024 * 1024;
/// `Report` calls in flight at once.
pub const MAX_IN_FLIGHT: usize = 4;

#[derive(Debug, Default)]
pub struct Outbox {
    waiting: VecDeque<ReportBatch>,
    in_flight: BTreeMap<u32, ReportBatch>,
    /// Outcomes in `waiting` and `in_flight`.
    held: usize,
    /// Outcomes dropped because the outbox was full, since the start.
    pub dropped: u64,
    /// Outcomes a control plane acknowledged, since the start.
    pub acknowledged: u64,
    /// Content bytes in `waiting` and `in_flight`.
    content_held: usize,
    /// Attempts whose content was left out because the outbox held too much, since the start.
    pub content_dropped: u64,
    retry_at_ms: i64,
    /// Refused or failed sends in a row (the wait before the next: `percent::control_plane_retry_ms`).
    failures: u32,
    /// The control plane is known to be failing reports (for logging once per outage).
    pub failing: bool,
}

fn size(batch: &ReportBatch) -> usize {
    batch.attempts.len() + batch.requests.len()
}

/// The content bytes a batch carries.
pub fn content_size(batch: &ReportBatch) -> usize {
    batch
        .attempts
        .iter()
        .map(|a| crate::answer::content::size_of(a.content.as_ref()))
        .sum()
}

impl Outbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// Outcomes waiting or in flight.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Adds a batch to send; drops the oldest waiting outcomes past the bound.
    pub fn push(&mut self, mut batch: ReportBatch) {
        if size(&batch) == 0 {
            return;
        }
        let content = content_size(&batch);
        if content > 0 && self.content_held + content > MAX_BUFFERED_CONTENT_BYTES {
            for a in &mut batch.attempts {
                if a.content.take().is_some() {
                    self.content_dropped += 1;
                }
            }
        }
        self.content_held += content_size(&batch);
        self.held += size(&batch);
        self.waiting.push_back(batch);
        while self.held > MAX_BUFFERED_OUTCOMES {
            let Some(oldest) = self.waiting.pop_front() else {
                break;
            };
            self.held -= size(&oldest);
            self.content_held -= content_size(&oldest);
            self.dropped += size(&oldest) as u64;
        }
    }

    /// Outcomes that left the outbox for good: acknowledged or dropped, since the start.
    pub fn settled(&self) -> u64 {
        self.acknowledged + self.dropped
    }

    /// Content bytes waiting or in flight.
    pub fn content_held(&self) -> usize {
        self.content_held
    }

    /// The next batch to send now, if one may go (not too many in flight, not backing off).
    /// The caller sends it and calls [`Outbox::sent`] with the call's token, or
    /// [`Outbox::not_sent`] when it could not even dispatch it.
    pub fn next(&mut self, now_ms: i64) -> Option<ReportBatch> {
        if self.in_flight.len() >= MAX_IN_FLIGHT || now_ms < self.retry_at_ms {
            return None;
        }
        self.waiting.pop_front()
    }

    /// The batch from [`Outbox::next`] is on its way as call `token`.
    pub fn sent(&mut self, token: u32, batch: ReportBatch) {
        self.in_flight.insert(token, batch);
    }

    /// The batch from [`Outbox::next`] could not be dispatched: it waits again, first.
    pub fn not_sent(&mut self, batch: ReportBatch, now_ms: i64) {
        self.waiting.push_front(batch);
        self.back_off(now_ms);
    }

    /// The answer to call `token`: acknowledged (`ok`), or failed and to be sent again.
    /// Returns whether the token was one of this outbox's calls.
    pub fn answered(&mut self, token: u32, ok: bool, now_ms: i64) -> bool {
        let Some(batch) = self.in_flight.remove(&token) else {
            return false;
        };
        if ok {
            self.acknowledged += size(&batch) as u64;
            self.held -= size(&batch);
            self.content_held -= content_size(&batch);
            self.failures = 0;
            self.retry_at_ms = 0;
            self.failing = false;
        } else {
            self.waiting.push_front(batch);
            self.back_off(now_ms);
        }
        true
    }

    fn back_off(&mut self, now_ms: i64) {
        self.failures = self.failures.saturating_add(1);
        self.retry_at_ms = now_ms + crate::vm::backoff::control_plane_retry_ms(self.failures);
    }
}

/// The kind byte of a queue message (a worker's to the singleton): an attempt's outcome.
pub const REPORT_ATTEMPT: u8 = 1;
/// A request's outcome.
pub const REPORT_REQUEST: u8 = 2;
/// An ask for a block of a key's minute budget (`MinuteCallsRequest`).
pub const MINUTE_ASK: u8 = 3;
/// The kind byte of a queue message that bundles several outcomes (see [`bundle_push`]).
pub const REPORT_BUNDLE: u8 = 4;
/// A worker holds its outcomes at most this long before it queues them for the singleton (on
/// the attempt root's tick or the next report): one queue message, so one wake-up of the main
/// thread and one report call, per worker and stretch instead of two per request. A failed
/// attempt is queued at once, with what waits before it: what it says about a key (a
/// blacklist, a cooldown) is the news the other Envoys wait for.
pub const REPORT_HOLD_MS: i64 = 50;
/// ...or until this many outcomes wait...
pub const REPORT_HOLD_COUNT: usize = 64;
/// ...or this many bytes (`telemetry.includeContent` makes attempts large).
pub const REPORT_HOLD_BYTES: usize = 256 * 1024;
/// A reservation against a figure of at most this many requests left makes the worker queue
/// its outcomes at once for [`SCARCE_HOLD_MS`]: near a scope's end the control plane's count
/// (and the figure it pushes back) must not lag behind the sends, or a figure pushed before a
/// held report arrives would let one send too many through.
pub const SCARCE_REQUESTS: i64 = 64;
pub const SCARCE_HOLD_MS: i64 = 2_000;

/// The outcomes one worker holds before it queues them as one [`REPORT_BUNDLE`] message, and
/// the rule for when they are due.
#[derive(Debug, Default)]
pub struct Held {
    bundle: Vec<u8>,
    count: usize,
    /// When the first outcome held now was added.
    since_ms: i64,
    /// Until when every outcome is queued at once (a reservation met a scarce figure).
    scarce_until_ms: i64,
}

impl Held {
    /// Holds one outcome; `true` when what is held is due now (queue it with [`Held::take`]):
    /// the outcome is `urgent` (a failed attempt), a scarce figure was met lately, or the
    /// bundle is full or old enough.
    pub fn push(&mut self, kind: u8, body: &[u8], urgent: bool, now_ms: i64) -> bool {
        if self.count == 0 {
            self.since_ms = now_ms;
            self.bundle.clear();
            self.bundle.push(REPORT_BUNDLE);
        }
        bundle_push(&mut self.bundle, kind, body);
        self.count += 1;
        urgent
            || now_ms < self.scarce_until_ms
            || self.count >= REPORT_HOLD_COUNT
            || self.bundle.len() >= REPORT_HOLD_BYTES
            || self.due(now_ms)
    }

    /// Whether outcomes are held and the first has waited [`REPORT_HOLD_MS`] (the tick's test).
    pub fn due(&self, now_ms: i64) -> bool {
        self.count > 0 && now_ms - self.since_ms >= REPORT_HOLD_MS
    }

    /// A reservation was made at `at_ms` against these figures of requests left: one at
    /// [`SCARCE_REQUESTS`] or fewer makes every outcome due at once for [`SCARCE_HOLD_MS`].
    pub fn reserving(&mut self, remaining_requests: impl IntoIterator<Item = i64>, at_ms: i64) {
        if remaining_requests
            .into_iter()
            .any(|r| (0..=SCARCE_REQUESTS).contains(&r))
        {
            self.scarce_until_ms = self.scarce_until_ms.max(at_ms + SCARCE_HOLD_MS);
        }
    }

    /// The bundle to queue (empty when nothing is held); holding starts afresh.
    pub fn take(&mut self) -> Vec<u8> {
        if self.count == 0 {
            return Vec::new();
        }
        self.count = 0;
        std::mem::take(&mut self.bundle)
    }
}

/// Appends one outcome to a bundle of several (one queue message from a worker to the
/// singleton): its kind byte, its length as 4 big-endian bytes, its bytes.
pub fn bundle_push(bundle: &mut Vec<u8>, kind: u8, body: &[u8]) {
    let Ok(len) = u32::try_from(body.len()) else {
        return;
    };
    bundle.push(kind);
    bundle.extend(len.to_be_bytes());
    bundle.extend_from_slice(body);
}

/// The `(kind, body)` outcomes of a bundle [`bundle_push`] made; a truncated tail is dropped.
pub fn bundled(mut bytes: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    while let Some((&kind, rest)) = bytes.split_first() {
        let Some((len, rest)) = rest.split_first_chunk::<4>() else {
            break;
        };
        let len = u32::from_be_bytes(*len) as usize;
        if rest.len() < len {
            break;
        }
        let (body, tail) = rest.split_at(len);
        out.push((kind, body));
        bytes = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_proto::v1::AttemptOutcome;

    fn batch(n: usize, tag: &str) -> ReportBatch {
        ReportBatch {
            attempts: (0..n)
                .map(|i| AttemptOutcome {
                    request_id: format!("{tag}-{i}"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn held_outcomes_are_due_after_the_hold_or_at_once_when_urgent() {
        let mut h = Held::default();
        assert!(h.take().is_empty(), "nothing held, nothing to queue");
        assert!(!h.push(1, b"a", false, 1_000));
        assert!(!h.push(2, b"bb", false, 1_000 + REPORT_HOLD_MS - 1));
        assert!(!h.due(1_000 + REPORT_HOLD_MS - 1));
        assert!(
            h.due(1_000 + REPORT_HOLD_MS),
            "the first has waited the hold"
        );
        let bundle = h.take();
        assert_eq!(bundle[0], REPORT_BUNDLE);
        assert_eq!(bundled(&bundle[1..]), vec![(1, &b"a"[..]), (2, &b"bb"[..])]);
        assert!(!h.due(10_000), "taken: nothing held");
        // A failed attempt goes at once, with what waited before it.
        assert!(!h.push(1, b"ok", false, 2_000));
        assert!(h.push(1, b"failed", true, 2_001));
        assert_eq!(bundled(&h.take()[1..]).len(), 2);
        // The hold runs from the first outcome held after a take, not from the old one.
        assert!(!h.push(1, b"c", false, 5_000));
        assert!(!h.due(5_000 + REPORT_HOLD_MS - 1));
    }

    #[test]
    fn a_full_bundle_is_due_before_its_hold() {
        let mut h = Held::default();
        for i in 1..REPORT_HOLD_COUNT {
            assert!(!h.push(1, b"x", false, 0), "outcome {i} held");
        }
        assert!(h.push(1, b"x", false, 0), "the 64th fills the bundle");
        assert_eq!(bundled(&h.take()[1..]).len(), REPORT_HOLD_COUNT);
        let big = vec![0u8; REPORT_HOLD_BYTES];
        assert!(h.push(1, &big, false, 0), "a bundle of 256 KiB is due");
    }

    #[test]
    fn a_scarce_figure_makes_outcomes_due_at_once_for_a_while() {
        let mut h = Held::default();
        h.reserving([-1, 10_000], 0);
        assert!(!h.push(1, b"a", false, 0), "no limit and plenty left: held");
        h.take();
        h.reserving([-1, SCARCE_REQUESTS], 1_000);
        assert!(h.push(1, b"a", false, 1_000));
        assert!(h.push(1, b"b", false, 1_000 + SCARCE_HOLD_MS - 1));
        h.take();
        assert!(
            !h.push(1, b"c", false, 1_000 + SCARCE_HOLD_MS),
            "the scarce stretch is over"
        );
        // An older reservation does not shorten a later one's stretch.
        h.reserving([0], 5_000);
        h.reserving([1], 4_000);
        h.take();
        assert!(h.push(1, b"d", false, 5_000 + SCARCE_HOLD_MS - 1));
    }

    #[test]
    fn a_batch_leaves_only_once_acknowledged() {
        let mut o = Outbox::new();
        o.push(batch(3, "a"));
        let b = o.next(0).unwrap();
        o.sent(7, b);
        assert_eq!(o.held(), 3);
        // The control plane is away: the batch comes back, after a wait.
        assert!(o.answered(7, false, 1_000));
        assert_eq!(o.held(), 3);
        assert!(o.next(1_100).is_none(), "backing off");
        let again = o.next(1_250).unwrap();
        assert_eq!(again.attempts[0].request_id, "a-0");
        assert_eq!(o.settled(), 0, "a refused batch is not settled");
        o.sent(8, again);
        assert!(o.answered(8, true, 1_300));
        assert_eq!(o.held(), 0);
        assert_eq!(o.settled(), 3, "acknowledged outcomes are settled");
        assert!(!o.answered(8, true, 1_300), "unknown token");
        assert_eq!(o.settled(), 3);
    }

    #[test]
    fn outcomes_dropped_past_the_bound_are_settled_too() {
        // The pending-reports gauge a drain waits on must reach 0 even when the outbox had
        // to drop outcomes: dropped ones will never be acknowledged.
        let mut o = Outbox::new();
        o.push(batch(MAX_BUFFERED_OUTCOMES, "full"));
        o.push(batch(2, "more"));
        assert_eq!(o.dropped, MAX_BUFFERED_OUTCOMES as u64);
        assert_eq!(o.settled(), o.dropped);
        let b = o.next(0).unwrap();
        o.sent(1, b);
        o.answered(1, true, 0);
        assert_eq!(o.settled(), MAX_BUFFERED_OUTCOMES as u64 + 2);
        assert_eq!(o.held(), 0);
    }

    #[test]
    fn failed_dispatches_keep_their_order_and_back_off_doubling() {
        let mut o = Outbox::new();
        o.push(batch(1, "first"));
        o.push(batch(1, "second"));
        let b = o.next(0).unwrap();
        o.not_sent(b, 0);
        assert!(o.next(249).is_none());
        let b = o.next(250).unwrap();
        assert_eq!(b.attempts[0].request_id, "first-0");
        o.not_sent(b, 250);
        assert!(o.next(749).is_none(), "the wait doubled");
        assert_eq!(o.next(750).unwrap().attempts[0].request_id, "first-0");
    }

    #[test]
    fn in_flight_calls_are_bounded() {
        let mut o = Outbox::new();
        for i in 0..10 {
            o.push(batch(1, &i.to_string()));
        }
        for token in 0..MAX_IN_FLIGHT as u32 {
            let b = o.next(0).unwrap();
            o.sent(token, b);
        }
        assert!(o.next(0).is_none());
        o.answered(0, true, 0);
        assert!(o.next(0).is_some());
    }

    fn with_content(n: usize, bytes: usize) -> ReportBatch {
        let mut b = batch(n, "c");
        for a in &mut b.attempts {
            a.content = Some(ai_router_proto::v1::AttemptContent {
                request: "r".repeat(bytes),
                ..Default::default()
            });
        }
        b
    }

    #[test]
    fn content_past_its_bound_is_left_out_and_the_outcomes_kept() {
        let mut o = Outbox::new();
        let per = 32 * 1024;
        let fits = MAX_BUFFERED_CONTENT_BYTES / per;
        for _ in 0..fits {
            o.push(with_content(1, per));
        }
        assert_eq!(o.content_held(), fits * per);
        assert_eq!(o.content_dropped, 0);
        // One more: kept, without its content.
        o.push(with_content(2, per));
        assert_eq!(o.held(), fits + 2);
        assert_eq!(o.content_held(), fits * per);
        assert_eq!(o.content_dropped, 2);
        // Acknowledged batches give their room back.
        let b = o.next(0).unwrap();
        o.sent(1, b);
        assert!(o.answered(1, true, 0));
        assert_eq!(o.content_held(), (fits - 1) * per);
        o.push(with_content(1, per));
        assert_eq!(o.content_dropped, 2, "room again");
    }

    #[test]
    fn past_the_bound_the_oldest_are_dropped_and_counted() {
        let mut o = Outbox::new();
        let per = MAX_BATCH;
        let batches = MAX_BUFFERED_OUTCOMES / per + 3;
        for i in 0..batches {
            o.push(batch(per, &i.to_string()));
        }
        assert!(o.held() <= MAX_BUFFERED_OUTCOMES);
        assert_eq!(o.dropped as usize + o.held(), batches * per);
        // The newest are the ones kept.
        let first = o.next(0).unwrap();
        assert_ne!(first.attempts[0].request_id, "0-0");
    }

    #[test]
    fn a_bundle_gives_back_its_outcomes_in_order_and_drops_a_cut_tail() {
        let mut bundle = Vec::new();
        bundle_push(&mut bundle, 1, b"first");
        bundle_push(&mut bundle, 2, b"");
        bundle_push(&mut bundle, 1, &[0xff; 300]);
        let out = bundled(&bundle);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0], (1, &b"first"[..]));
        assert_eq!(out[1], (2, &b""[..]));
        assert_eq!(out[2].1.len(), 300);
        // A message cut anywhere keeps the whole outcomes before the cut.
        for cut in 0..bundle.len() {
            let kept = bundled(&bundle[..cut]);
            assert!(kept.len() <= 3 && kept.iter().zip(&out).all(|(a, b)| a == b));
        }
    }
}
