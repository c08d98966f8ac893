//! The records the workers of one Envoy write for each other: per provider, the holds they
//! put on its keys and lanes before the control plane's push arrives and the attempts in
//! flight on its keys (one record per provider, not per key or lane, keeps a lane choice at a
//! few reads per candidate provider, however many keys it has); per billing scope, the sends
//! reserved against its headroom (a reservation is on every attempt, so it reads and writes
//! its own scope only, however many scopes the provider has).
//!
//! Both are small binary encodings, read-modify-written by the workers with compare-and-swap.

use crate::vocab::LocalHold;
use ai_router_contract::failure::ErrorClass;

/// A hold on one lane (`model` set: a cooldown) or one key (`model` empty: a blacklist).
#[derive(Debug, Clone, PartialEq)]
pub struct HeldLane {
    pub key: String,
    pub model: String,
    pub hold: LocalHold,
}

/// How long a hold stays in the record after it ended (then it is pruned on the next write).
const PRUNE_AFTER_MS: i64 = 60_000;

/// The holds on a provider's keys and lanes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderHolds {
    pub holds: Vec<HeldLane>,
}

impl ProviderHolds {
    /// The holds on a lane: its cooldown and its key's blacklist.
    pub fn of_lane(&self, key: &str, model: &str) -> Vec<LocalHold> {
        self.holds
            .iter()
            .filter(|h| h.key == key && (h.model.is_empty() || h.model == model))
            .map(|h| h.hold)
            .collect()
    }

    /// Puts `hold` on the lane (or key), replacing the previous one of the same kind, and drops
    /// holds that ended long ago.
    pub fn put(&mut self, key: &str, model: &str, hold: LocalHold, now_ms: i64) {
        self.holds.retain(|h| {
            let ended = match h.hold {
                LocalHold::Cooldown { until_ms, .. } => until_ms,
                LocalHold::Blacklist { until_ms: 0, .. } => i64::MAX,
                LocalHold::Blacklist { until_ms, .. } => until_ms,
            };
            ended.saturating_add(PRUNE_AFTER_MS) > now_ms && !(h.key == key && h.model == model)
        });
        self.holds.push(HeldLane {
            key: key.to_string(),
            model: model.to_string(),
            hold,
        });
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for h in &self.holds {
            put_str(&mut out, &h.key);
            put_str(&mut out, &h.model);
            match h.hold {
                LocalHold::Cooldown {
                    until_ms,
                    set_at_ms,
                } => {
                    out.push(0);
                    out.extend(until_ms.to_be_bytes());
                    out.extend(set_at_ms.to_be_bytes());
                }
                LocalHold::Blacklist {
                    class,
                    until_ms,
                    fingerprint,
                    set_at_ms,
                } => {
                    out.push(1);
                    out.extend(until_ms.to_be_bytes());
                    out.extend(set_at_ms.to_be_bytes());
                    out.extend(fingerprint.to_be_bytes());
                    put_str(&mut out, class.as_str());
                }
            }
        }
        out
    }

    /// `None` when the bytes are not a record of this shape.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        let mut holds = Vec::new();
        while !r.0.is_empty() {
            let key = r.str()?;
            let model = r.str()?;
            let hold = match r.byte()? {
                0 => LocalHold::Cooldown {
                    until_ms: r.i64()?,
                    set_at_ms: r.i64()?,
                },
                1 => {
                    let until_ms = r.i64()?;
                    let set_at_ms = r.i64()?;
                    let fingerprint = r.u64()?;
                    let class = ErrorClass::parse(&r.str()?)?;
                    LocalHold::Blacklist {
                        class,
                        until_ms,
                        fingerprint,
                        set_at_ms,
                    }
                }
                _ => return None,
            };
            holds.push(HeldLane { key, model, hold });
        }
        Some(Self { holds })
    }
}

/// Attempts in flight per key of one provider (keys with none are left out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlight {
    pub counts: Vec<(String, u32)>,
}

impl InFlight {
    pub fn of(&self, key: &str) -> u32 {
        self.counts
            .iter()
            .find(|(k, _)| k == key)
            .map_or(0, |(_, n)| *n)
    }

    pub fn total(&self) -> u32 {
        self.counts.iter().map(|(_, n)| *n).sum()
    }

    pub fn add(&mut self, key: &str, delta: i32) {
        match self.counts.iter().position(|(k, _)| k == key) {
            Some(i) => {
                let n = self.counts[i].1.saturating_add_signed(delta);
                if n == 0 {
                    self.counts.swap_remove(i);
                } else {
                    self.counts[i].1 = n;
                }
            }
            None if delta > 0 => self.counts.push((key.to_string(), delta.unsigned_abs())),
            None => {}
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, n) in &self.counts {
            put_str(&mut out, k);
            out.extend(n.to_be_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        let mut counts = Vec::new();
        while !r.0.is_empty() {
            let k = r.str()?;
            let n = u32::from_be_bytes(r.take::<4>()?);
            counts.push((k, n));
        }
        Some(Self { counts })
    }
}

/// How long sends are kept at most: longer than any headroom the control plane pushes is
/// older than (the coalescing period, the report's trip, the push's) while its window lasts.
pub const SENDS_KEPT_MS: i64 = 120_000;
/// Sends are counted in buckets of this width. A count "since" an instant includes the whole
/// bucket that instant falls in: it may count up to one bucket's sends too many (the
/// reservation errs on refusing), never too few. The quota ledger's estimates are as of a
/// bucket's start, and count only what was sent before it (`ai_router_contract::ledger`).
pub const SEND_BUCKET_MS: i64 = ai_router_contract::ledger::SEND_BUCKET_MS;
/// A scope with no figure to check keeps only its sends of this last stretch: a figure pushed
/// later is as old as the attempt that reported it, seconds at most.
pub const UNCHECKED_KEPT_MS: i64 = 10_000;
/// At most this many buckets per record (the oldest go first).
pub const SEND_BUCKETS_MAX: usize = 1_024;

/// One attempt sent to a provider: what it reserved of its billing scope's headroom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Send {
    pub scope: String,
    pub model: String,
    pub at_ms: i64,
    pub tokens: u64,
}

/// The sends of one scope and model in one [`SEND_BUCKET_MS`] stretch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendBucket {
    pub start_ms: i64,
    pub requests: u32,
    pub tokens: u64,
}

/// The buckets of one scope and model, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendSeries {
    pub scope: String,
    pub model: String,
    pub buckets: Vec<SendBucket>,
}

/// The attempts this Envoy's workers sent on a billing scope lately, per model, counted per
/// short stretch of time: the reservations made against the headroom the control plane
/// pushed. What is left now is the pushed figure less the sends since the attempt that
/// reported it began. Envoy keeps one record per provider and scope
/// (`ai_router_contract::shared::sends`); the type holds any number of scopes. Its size follows
/// the models and how stale their figures are, not the request rate; each scope and model is
/// named once in it, whatever its number of buckets (the record is decoded and encoded on every
/// reservation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sends {
    pub series: Vec<SendSeries>,
}

fn bucket_of(at_ms: i64) -> i64 {
    at_ms.div_euclid(SEND_BUCKET_MS) * SEND_BUCKET_MS
}

/// What a reservation checks: the pushed remaining requests and tokens (-1: not reported) of a
/// model (empty: every model of the scope) and since when sends count against them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowance {
    pub model: String,
    pub remaining_requests: i64,
    pub remaining_tokens: i64,
    pub since_ms: i64,
}

impl Sends {
    /// Requests and tokens sent on `scope`/`model` (empty: any model) at or after `since_ms`
    /// (the whole bucket `since_ms` falls in counts).
    pub fn since(&self, scope: &str, model: &str, since_ms: i64) -> (u64, u64) {
        let from = bucket_of(since_ms);
        self.series
            .iter()
            .filter(|s| s.scope == scope && (model.is_empty() || s.model == model))
            .flat_map(|s| s.buckets.iter().rev().take_while(|b| b.start_ms >= from))
            .fold((0, 0), |(n, t), b| {
                (n + u64::from(b.requests), t + b.tokens)
            })
    }

    /// How many buckets the record holds.
    pub fn bucket_count(&self) -> usize {
        self.series.iter().map(|s| s.buckets.len()).sum()
    }

    /// Reserves one request of `tokens` when every allowance leaves room for it (always,
    /// without one); returns whether it did.
    pub fn reserve(&mut self, send: Send, allowances: &[Allowance]) -> bool {
        // What no figure reads any more goes: past the oldest figure this scope checks (or
        // the last few seconds when none), and anything past the longest window.
        let scope_from = allowances
            .iter()
            .map(|a| a.since_ms)
            .min()
            .unwrap_or(send.at_ms - UNCHECKED_KEPT_MS);
        let scope_from = bucket_of(scope_from.max(send.at_ms - SENDS_KEPT_MS));
        let kept_from = bucket_of(send.at_ms - SENDS_KEPT_MS);
        for series in &mut self.series {
            let from = if series.scope == send.scope {
                scope_from
            } else {
                kept_from
            };
            let old = series.buckets.partition_point(|b| b.start_ms < from);
            series.buckets.drain(..old);
        }
        self.series.retain(|s| !s.buckets.is_empty());
        for a in allowances {
            let (requests, tokens) = self.since(&send.scope, &a.model, a.since_ms);
            let no_request = a.remaining_requests >= 0 && requests >= a.remaining_requests as u64;
            let no_tokens = a.remaining_tokens >= 0
                && tokens.saturating_add(send.tokens) > a.remaining_tokens as u64;
            if no_request || no_tokens {
                return false;
            }
        }
        let start_ms = bucket_of(send.at_ms);
        if self.bucket_count() >= SEND_BUCKETS_MAX {
            self.drop_oldest();
        }
        let series = match self
            .series
            .iter()
            .position(|s| s.scope == send.scope && s.model == send.model)
        {
            Some(i) => &mut self.series[i],
            None => {
                self.series.push(SendSeries {
                    scope: send.scope,
                    model: send.model,
                    buckets: Vec::new(),
                });
                let last = self.series.len() - 1;
                &mut self.series[last]
            }
        };
        // Workers' clocks agree to the millisecond: a send lands in the last bucket or near it.
        let at = series.buckets.partition_point(|b| b.start_ms < start_ms);
        match series.buckets.get_mut(at) {
            Some(b) if b.start_ms == start_ms => {
                b.requests = b.requests.saturating_add(1);
                b.tokens = b.tokens.saturating_add(send.tokens);
            }
            _ => series.buckets.insert(
                at,
                SendBucket {
                    start_ms,
                    requests: 1,
                    tokens: send.tokens,
                },
            ),
        }
        true
    }

    /// Drops the oldest bucket of the record.
    fn drop_oldest(&mut self) {
        let oldest = self
            .series
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.buckets.first().map(|b| (b.start_ms, i)))
            .min();
        if let Some((_, i)) = oldest {
            self.series[i].buckets.remove(0);
            if self.series[i].buckets.is_empty() {
                self.series.swap_remove(i);
            }
        }
    }

    /// Gives a reservation back (the attempt never reached the provider).
    pub fn release(&mut self, send: &Send) {
        let start_ms = bucket_of(send.at_ms);
        let Some(i) = self
            .series
            .iter()
            .position(|s| s.scope == send.scope && s.model == send.model)
        else {
            return;
        };
        let series = &mut self.series[i];
        if let Some(j) = series.buckets.iter().position(|b| b.start_ms == start_ms) {
            let b = &mut series.buckets[j];
            b.requests = b.requests.saturating_sub(1);
            b.tokens = b.tokens.saturating_sub(send.tokens);
            if b.requests == 0 {
                series.buckets.remove(j);
            }
        }
        if series.buckets.is_empty() {
            self.series.swap_remove(i);
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(self.series.len() * 40 + self.bucket_count() * (8 + 4 + 8));
        for s in &self.series {
            put_str(&mut out, &s.scope);
            put_str(&mut out, &s.model);
            let n = s.buckets.len().min(usize::from(u16::MAX));
            out.extend((n as u16).to_be_bytes());
            for b in &s.buckets[..n] {
                out.extend(b.start_ms.to_be_bytes());
                out.extend(b.requests.to_be_bytes());
                out.extend(b.tokens.to_be_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        let mut series = Vec::new();
        while !r.0.is_empty() {
            let scope = r.str()?;
            let model = r.str()?;
            let n = u16::from_be_bytes(r.take::<2>()?);
            let mut buckets = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                buckets.push(SendBucket {
                    start_ms: r.i64()?,
                    requests: u32::from_be_bytes(r.take::<4>()?),
                    tokens: r.u64()?,
                });
            }
            series.push(SendSeries {
                scope,
                model,
                buckets,
            });
        }
        Some(Self { series })
    }
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
    out.extend(len.to_be_bytes());
    out.extend(&s.as_bytes()[..usize::from(len)]);
}

pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl Reader<'_> {
    pub(crate) fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    pub(crate) fn byte(&mut self) -> Option<u8> {
        Some(self.take::<1>()?[0])
    }
    pub(crate) fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take::<8>()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take::<8>()?))
    }
    pub(crate) fn str(&mut self) -> Option<String> {
        let len = usize::from(u16::from_be_bytes(self.take::<2>()?));
        if self.0.len() < len {
            return None;
        }
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8(s.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(scope: &str, at_ms: i64, tokens: u64) -> Send {
        Send {
            scope: scope.to_owned(),
            model: "m".to_owned(),
            at_ms,
            tokens,
        }
    }

    #[test]
    fn reservations_stop_at_the_allowance_and_a_release_gives_one_back() {
        let mut s = Sends::default();
        let allowance = &[Allowance {
            model: "m".to_owned(),
            remaining_requests: 3,
            remaining_tokens: -1,
            since_ms: 1_000,
        }];
        // A send before the figure was reported does not count against it.
        assert!(s.reserve(send("org", 900, 10), allowance));
        for at in [1_000, 1_001, 1_002] {
            assert!(s.reserve(send("org", at, 10), allowance));
        }
        assert!(
            !s.reserve(send("org", 1_003, 10), allowance),
            "three were left"
        );
        // Another scope has its own.
        assert!(s.reserve(send("other", 1_003, 10), allowance));
        s.release(&send("org", 1_001, 10));
        assert!(s.reserve(send("org", 1_004, 10), allowance));
        assert_eq!(s.since("org", "m", 1_000), (3, 30));
        // Tokens bound too.
        let tokens = &[Allowance {
            model: "m".to_owned(),
            remaining_requests: -1,
            remaining_tokens: 35,
            since_ms: 1_000,
        }];
        assert!(!s.reserve(send("org", 1_005, 10), tokens));
        assert!(s.reserve(send("org", 1_005, 5), tokens));
        // A scope-wide figure counts every model's sends.
        let mut other_model = send("org", 1_005, 0);
        other_model.model = "n".to_owned();
        let scope_wide = [Allowance {
            model: String::new(),
            // Four sent since 1,000 on model m.
            remaining_requests: 4,
            remaining_tokens: -1,
            since_ms: 1_000,
        }];
        assert!(!s.reserve(other_model.clone(), &scope_wide));
        assert!(s.reserve(other_model, &[]));
        // Without an allowance it always goes, and the record round-trips.
        assert!(s.reserve(send("org", 1_006, 1), &[]));
        assert_eq!(Sends::decode(&s.encode()), Some(s.clone()));
        // Two minutes on, the old sends are gone.
        assert!(s.reserve(send("org", 1_006 + SENDS_KEPT_MS + SEND_BUCKET_MS, 1), &[]));
        assert_eq!(s.bucket_count(), 1);
    }

    #[test]
    fn a_count_since_an_instant_takes_its_whole_bucket_and_the_record_stays_small() {
        let mut s = Sends::default();
        for at in [1_010, 1_060, 1_120] {
            assert!(s.reserve(send("org", at, 1), &[]));
        }
        // 1,050 falls in the bucket of 1,000: both of its sends count (never too few).
        assert_eq!(s.since("org", "m", 1_050), (3, 3));
        assert_eq!(s.since("org", "m", 1_100), (1, 1));

        // A thousand sends a second for a minute, the figure pushed again every 200 ms: the
        // record holds the buckets since the newest figure, not the sends.
        let mut s = Sends::default();
        let mut biggest = 0;
        for i in 0..60_000i64 {
            let at = 10_000 + i;
            let allowance = [Allowance {
                model: "m".to_owned(),
                remaining_requests: 1_000_000,
                remaining_tokens: -1,
                since_ms: at - at % 200 - 300,
            }];
            assert!(s.reserve(send("org", at, 1), &allowance));
            biggest = biggest.max(s.encode().len());
        }
        assert!(s.bucket_count() <= 6, "{}", s.bucket_count());
        assert!(biggest < 200, "{biggest} bytes");
    }

    #[test]
    fn a_late_send_lands_in_its_own_bucket_and_every_scope_is_named_once() {
        let mut s = Sends::default();
        assert!(s.reserve(send("org", 1_250, 1), &[]));
        // Another worker's send of a moment earlier, written after.
        assert!(s.reserve(send("org", 1_150, 1), &[]));
        assert!(s.reserve(send("org", 1_260, 1), &[]));
        let starts: Vec<i64> = s.series[0].buckets.iter().map(|b| b.start_ms).collect();
        assert_eq!(starts, [1_100, 1_200]);
        assert_eq!(s.since("org", "m", 1_200), (2, 2));
        assert_eq!(s.since("org", "m", 0), (3, 3));
        s.release(&send("org", 1_150, 1));
        assert_eq!(s.since("org", "m", 0), (2, 2));

        // Eight scopes with no figure, 150 sends a second each for a minute: the record keeps
        // ten seconds of buckets, and names each scope once.
        let mut s = Sends::default();
        let mut biggest = 0;
        for i in 0..9_000i64 {
            let scope = format!("key-{}", i % 8);
            assert!(s.reserve(send(&scope, 10_000 + i * 60 / 9, 1), &[]));
            if i % 97 == 0 {
                biggest = biggest.max(s.encode().len());
            }
        }
        assert_eq!(s.series.len(), 8);
        assert!(s.bucket_count() <= 8 * 101, "{}", s.bucket_count());
        assert!(biggest < 8 * (101 * 20 + 20), "{biggest} bytes");
        assert_eq!(Sends::decode(&s.encode()), Some(s.clone()));
    }

    #[test]
    fn holds_round_trip_replace_and_prune() {
        let mut h = ProviderHolds::default();
        h.put(
            "a",
            "m",
            LocalHold::Cooldown {
                until_ms: 100,
                set_at_ms: 1,
            },
            0,
        );
        h.put(
            "a",
            "",
            LocalHold::Blacklist {
                class: ErrorClass::Quota,
                until_ms: 0,
                fingerprint: 9,
                set_at_ms: 2,
            },
            0,
        );
        h.put(
            "b",
            "m",
            LocalHold::Cooldown {
                until_ms: 50,
                set_at_ms: 3,
            },
            0,
        );
        let back = ProviderHolds::decode(&h.encode());
        assert_eq!(back.as_ref(), Some(&h));
        assert_eq!(
            h.of_lane("a", "m").len(),
            2,
            "its cooldown and its key's blacklist"
        );
        assert_eq!(h.of_lane("a", "other").len(), 1, "the blacklist only");
        assert!(h.of_lane("c", "m").is_empty());
        // A new cooldown replaces the old one on the same lane.
        h.put(
            "a",
            "m",
            LocalHold::Cooldown {
                until_ms: 200,
                set_at_ms: 4,
            },
            10,
        );
        assert_eq!(h.holds.len(), 3);
        // Long after they ended, cooldowns are pruned; a blacklist until the secret changes is
        // not.
        h.put(
            "c",
            "m",
            LocalHold::Cooldown {
                until_ms: 1_000_000,
                set_at_ms: 5,
            },
            500_000,
        );
        assert_eq!(
            h.holds.iter().map(|x| x.key.as_str()).collect::<Vec<_>>(),
            ["a", "c"]
        );
        assert_eq!(ProviderHolds::decode(&[0, 5, b'x']), None);
        assert_eq!(ProviderHolds::decode(&[]), Some(ProviderHolds::default()));
    }

    #[test]
    fn in_flight_counts_per_key() {
        let mut f = InFlight::default();
        f.add("a", 1);
        f.add("a", 1);
        f.add("b", 1);
        f.add("c", -1);
        assert_eq!((f.of("a"), f.of("b"), f.of("c"), f.total()), (2, 1, 0, 3));
        let back = InFlight::decode(&f.encode());
        assert_eq!(back.as_ref(), Some(&f));
        f.add("a", -2);
        f.add("b", -5);
        assert!(f.counts.is_empty(), "keys at zero are left out");
        assert_eq!(InFlight::decode(&[0, 1, b'a', 0]), None);
    }
}
