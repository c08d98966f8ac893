//! One budget's local counts (the `estimated` source) and the anchors providers give it
//! (`reported`, `mined`).
//!
//! An anchor does not overwrite the count: it says "this many were left when the local count
//! stood at N". Until it ages out, what is left now is `remaining - (count now - N)`; after,
//! the local count against the known limit is all there is. How long an anchor stands is the
//! pool's `ledger:` ([`AnchorLifetimes`]: 2 minutes for reported, 5 for mined by default).

use std::collections::VecDeque;

use ai_router_contract::calendar::{first_of_next_month_ms, month_index};
use ai_router_contract::kinds::DailyReset;

pub use crate::config::ledger::AnchorLifetimes;

use super::limits::Window;

const SECOND_MS: i64 = 1_000;
const MINUTE_MS: i64 = 60 * SECOND_MS;
/// The minute is counted in stretches as wide as the filter's send buckets, so that the
/// estimate pushed as of a bucket's start counts exactly the sends before it.
const SLOT_MS: i64 = ai_router_contract::ledger::SEND_BUCKET_MS;
const SLOTS: i64 = MINUTE_MS / SLOT_MS;
const DAY_MS: i64 = 24 * 60 * MINUTE_MS;
/// How long a value read from a provider's headers stands for the truth, by default.
pub const REPORTED_TTL_MS: i64 = crate::config::ledger::REPORTED_TTL_MS;
/// How long a value mined from a 429 stands by default (providers rarely say more in between).
pub const MINED_TTL_MS: i64 = crate::config::ledger::MINED_TTL_MS;

/// Where a figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Headers of the provider's answers (`x-ratelimit-remaining-*`).
    Reported,
    /// A 429 or quota refusal: nothing left until the time it named.
    Mined,
    /// Local counting against a known limit.
    Estimated,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Reported => "reported",
            Source::Mined => "mined",
            Source::Estimated => "estimated",
        }
    }
}

/// When the day holding `ms` began and ends, in `zone` (the contract's zone arithmetic,
/// [`DailyReset`]). The start is the midnight after the same moment a day earlier (a summer-time
/// day is an hour off at most).
pub fn day_bounds(reset: DailyReset, ms: i64) -> (i64, i64) {
    (
        reset.next_midnight_ms(ms - DAY_MS),
        reset.next_midnight_ms(ms),
    )
}

/// What a provider said is left in one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Anchor {
    pub remaining: u64,
    /// The local count of the window when it was said.
    pub at_count: u64,
    pub at_ms: i64,
    /// When the provider's window resets (the anchor means nothing after); 0 when unknown.
    pub reset_at_ms: i64,
    pub source: Source,
}

impl Anchor {
    fn live(&self, lifetimes: AnchorLifetimes, now_ms: i64) -> bool {
        let ttl = match self.source {
            Source::Mined => lifetimes.mined_ms,
            _ => lifetimes.reported_ms,
        };
        now_ms < self.at_ms + ttl && (self.reset_at_ms == 0 || now_ms < self.reset_at_ms)
    }
}

/// What is left in a window now, and how it is known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headroom {
    pub remaining: u64,
    pub source: Source,
    /// How old the figure it rests on is (0 for a local estimate).
    pub age_ms: i64,
    /// When it is next known to grow: the anchor's reset, or the window's end.
    pub resets_at_ms: i64,
}

/// One budget's counters: the last 60 s by `SLOT_MS`, the provider's day, the UTC month. An
/// attempt counts at the instant it was sent.
#[derive(Debug, Clone)]
pub struct Counter {
    zone: DailyReset,
    /// (slot, requests, tokens) of the slots that saw a send within a minute of the newest,
    /// oldest first; a slot is `at_ms / SLOT_MS`. Only the slots with sends are held: a key
    /// that sends nothing holds nothing (a pool of 1,000 keys held 14 KB a key as a full ring).
    slots: VecDeque<(i64, u64, u64)>,
    day_start_ms: i64,
    day: (u64, u64),
    month: i64,
    month_tokens: u64,
    anchors: Vec<(Window, Anchor)>,
    lifetimes: AnchorLifetimes,
}

impl Counter {
    pub fn new(zone: DailyReset, lifetimes: AnchorLifetimes) -> Self {
        Self {
            lifetimes,
            zone,
            slots: VecDeque::new(),
            day_start_ms: i64::MIN,
            day: (0, 0),
            month: i64::MIN,
            month_tokens: 0,
            anchors: Vec::new(),
        }
    }

    /// Takes a reloaded pool's lifetimes (the anchors held so far age by them).
    pub fn set_lifetimes(&mut self, lifetimes: AnchorLifetimes) {
        self.lifetimes = lifetimes;
    }

    fn roll(&mut self, now_ms: i64) {
        let (start, _) = day_bounds(self.zone, now_ms);
        if start > self.day_start_ms {
            self.day_start_ms = start;
            self.day = (0, 0);
        }
        let month = month_index(now_ms);
        if month > self.month {
            self.month = month;
            self.month_tokens = 0;
        }
    }

    /// Counts what an attempt sent at `at_ms`.
    pub fn add(&mut self, at_ms: i64, requests: u64, tokens: u64) {
        self.roll(at_ms);
        self.count_in_minute(at_ms.div_euclid(SLOT_MS), requests, tokens);
        if at_ms >= self.day_start_ms {
            self.day.0 += requests;
            self.day.1 += tokens;
        }
        if month_index(at_ms) == self.month {
            self.month_tokens += tokens;
        }
    }

    /// Counts a send in its slot of the minute. An attempt reported a minute or more after the
    /// newest send counted counts for the day and month only; slots a minute older than the
    /// newest are let go.
    fn count_in_minute(&mut self, slot: i64, requests: u64, tokens: u64) {
        let newest = self.slots.back().map_or(i64::MIN, |&(s, ..)| s);
        if slot > newest {
            self.slots.push_back((slot, requests, tokens));
            while self
                .slots
                .front()
                .is_some_and(|&(s, ..)| s <= slot.saturating_sub(SLOTS))
            {
                self.slots.pop_front();
            }
            return;
        }
        if slot <= newest.saturating_sub(SLOTS) {
            return;
        }
        match self.slots.binary_search_by_key(&slot, |&(s, ..)| s) {
            Ok(i) => {
                if let Some(entry) = self.slots.get_mut(i) {
                    entry.1 += requests;
                    entry.2 += tokens;
                }
            }
            Err(i) => self.slots.insert(i, (slot, requests, tokens)),
        }
    }

    /// The local count of a window at `now_ms`.
    pub fn count(&mut self, window: Window, now_ms: i64) -> u64 {
        self.count_before(window, i64::MAX, now_ms)
    }

    /// The local count of a window at `now_ms` of the attempts sent before `before_ms` (a
    /// `SLOT_MS` boundary within the last minute; later ones are the filter's to count).
    pub fn count_before(&mut self, window: Window, before_ms: i64, now_ms: i64) -> u64 {
        self.roll(now_ms);
        let now_slot = now_ms.div_euclid(SLOT_MS);
        let before_slot = before_ms.div_euclid(SLOT_MS);
        let oldest = now_slot - SLOTS;
        match window {
            Window::Rpm | Window::Tpm => self
                .slots
                .iter()
                .filter(|(s, ..)| *s > oldest && *s <= now_slot && *s < before_slot)
                .map(|&(_, requests, tokens)| {
                    if window == Window::Rpm {
                        requests
                    } else {
                        tokens
                    }
                })
                .sum(),
            Window::Rpd | Window::Tpd | Window::TokensPerMonth => {
                // The day's and the month's totals, less what was sent from `before_ms` on:
                // the few slots of the estimate's lag, walked one by one.
                let (mut today, mut this_month) = ((0, 0), 0);
                let first = before_slot.max(oldest + 1);
                let lag = self
                    .slots
                    .iter()
                    .rev()
                    .take_while(|&&(s, ..)| s >= first)
                    .filter(|&&(s, ..)| s <= now_slot);
                for &(s, requests, tokens) in lag {
                    let at_ms = s * SLOT_MS;
                    if at_ms >= self.day_start_ms {
                        today.0 += requests;
                        today.1 += tokens;
                    }
                    if month_index(at_ms) == self.month {
                        this_month += tokens;
                    }
                }
                match window {
                    Window::Rpd => self.day.0.saturating_sub(today.0),
                    Window::Tpd => self.day.1.saturating_sub(today.1),
                    _ => self.month_tokens.saturating_sub(this_month),
                }
            }
        }
    }

    /// What the ledger's own estimate leaves of `limit` in `window`, counting the attempts sent
    /// before `before_ms`, with when the window ends; `None` while a figure a provider gave (a
    /// live anchor) stands for the window instead.
    pub fn estimate(
        &mut self,
        window: Window,
        limit: u64,
        before_ms: i64,
        now_ms: i64,
    ) -> Option<(u64, i64)> {
        let lifetimes = self.lifetimes;
        if self
            .anchors
            .iter()
            .any(|(w, a)| *w == window && a.live(lifetimes, now_ms))
        {
            return None;
        }
        let count = self.count_before(window, before_ms, now_ms);
        Some((limit.saturating_sub(count), self.window_end(window, now_ms)))
    }

    /// Records what a provider said is left in `window` (replacing what it said before).
    pub fn anchor(
        &mut self,
        window: Window,
        remaining: u64,
        reset_at_ms: i64,
        source: Source,
        now_ms: i64,
    ) {
        let at_count = self.count(window, now_ms);
        let lifetimes = self.lifetimes;
        self.anchors
            .retain(|(w, a)| *w != window && a.live(lifetimes, now_ms));
        self.anchors.push((
            window,
            Anchor {
                remaining,
                at_count,
                at_ms: now_ms,
                reset_at_ms,
                source,
            },
        ));
    }

    /// When a window ends if nothing else is known: a minute from now, or the day's or month's
    /// end.
    fn window_end(&self, window: Window, now_ms: i64) -> i64 {
        match window {
            Window::Rpm | Window::Tpm => now_ms + MINUTE_MS,
            Window::Rpd | Window::Tpd => day_bounds(self.zone, now_ms).1,
            Window::TokensPerMonth => first_of_next_month_ms(now_ms),
        }
    }

    /// What is left in `window`: from a live anchor, else from `limit`; `None` when neither is
    /// known.
    pub fn headroom(
        &mut self,
        window: Window,
        limit: Option<u64>,
        now_ms: i64,
    ) -> Option<Headroom> {
        let count = self.count(window, now_ms);
        let lifetimes = self.lifetimes;
        let anchor = self
            .anchors
            .iter()
            .find(|(w, a)| *w == window && a.live(lifetimes, now_ms))
            .map(|(_, a)| *a);
        if let Some(a) = anchor {
            return Some(Headroom {
                remaining: a.remaining.saturating_sub(count.saturating_sub(a.at_count)),
                source: a.source,
                age_ms: now_ms - a.at_ms,
                resets_at_ms: if a.reset_at_ms > 0 {
                    a.reset_at_ms
                } else {
                    self.window_end(window, now_ms)
                },
            });
        }
        limit.map(|l| Headroom {
            remaining: l.saturating_sub(count),
            source: Source::Estimated,
            age_ms: 0,
            resets_at_ms: self.window_end(window, now_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-03-15T12:00:00Z
    const AT: i64 = 1_773_576_000_000;

    #[test]
    fn the_minute_slides_and_the_day_resets_at_its_zone_s_midnight() {
        let mut c = Counter::new(DailyReset::Utc, AnchorLifetimes::default());
        c.add(AT, 1, 100);
        c.add(AT + 30_000, 1, 50);
        assert_eq!(c.count(Window::Rpm, AT + 30_000), 2);
        assert_eq!(c.count(Window::Tpm, AT + 30_000), 150);
        // The first one left the minute; the day keeps both.
        assert_eq!(c.count(Window::Rpm, AT + 61_000), 1);
        assert_eq!(c.count(Window::Rpd, AT + 61_000), 2);
        assert_eq!(c.count(Window::Tpd, AT + 61_000), 150);
        // 12 hours later it is another UTC day.
        assert_eq!(c.count(Window::Rpd, AT + 12 * 3_600_000), 0);
        assert_eq!(c.count(Window::TokensPerMonth, AT + 12 * 3_600_000), 150);
    }

    #[test]
    fn a_count_before_an_instant_leaves_the_later_sends_out_of_every_window() {
        let mut c = Counter::new(DailyReset::Utc, AnchorLifetimes::default());
        c.add(AT + 1_000, 1, 10);
        c.add(AT + 1_950, 1, 20);
        c.add(AT + 2_000, 1, 40);
        let now = AT + 2_500;
        let before = |c: &mut Counter, w, at| c.count_before(w, at, now);
        // A bucket boundary splits the sends exactly: 1,950 ms is before 2,000, 2,000 is not.
        assert_eq!(before(&mut c, Window::Rpm, AT + 2_000), 2);
        assert_eq!(before(&mut c, Window::Tpm, AT + 2_000), 30);
        assert_eq!(before(&mut c, Window::Rpd, AT + 2_000), 2);
        assert_eq!(before(&mut c, Window::Tpd, AT + 2_000), 30);
        assert_eq!(before(&mut c, Window::TokensPerMonth, AT + 2_000), 30);
        assert_eq!(before(&mut c, Window::Rpm, AT + 1_900), 1);
        assert_eq!(c.count(Window::Rpm, now), 3);
        // A send reported after its minute passed counts for the day only, and leaves the
        // newer slot it maps to alone.
        c.add(AT + 2_000 - 60_000, 1, 5);
        assert_eq!(c.count(Window::Rpm, now), 3);
        assert_eq!(c.count(Window::Rpd, now), 4);
    }

    #[test]
    fn the_minute_holds_only_its_slots_with_sends_and_takes_late_reports_in_order() {
        let mut c = Counter::new(DailyReset::Utc, AnchorLifetimes::default());
        assert!(c.slots.is_empty(), "a key that sent nothing holds no slot");
        // Three minutes of a send every 100 ms: never more than a minute of slots held.
        for i in 0..1_800 {
            c.add(AT + i * 100, 1, 1);
            assert!(c.slots.len() <= SLOTS as usize);
        }
        let now = AT + 1_799 * 100;
        assert_eq!(c.count(Window::Rpm, now), 600);
        // Sends reported out of order within the minute count in their own slots.
        let mut c = Counter::new(DailyReset::Utc, AnchorLifetimes::default());
        c.add(AT + 5_000, 1, 10);
        c.add(AT + 1_000, 1, 20);
        c.add(AT + 3_000, 1, 40);
        c.add(AT + 1_050, 1, 80);
        assert_eq!(c.slots.len(), 3);
        let slots: Vec<i64> = c.slots.iter().map(|&(s, ..)| s).collect();
        assert!(slots.windows(2).all(|w| w[0] < w[1]), "{slots:?}");
        assert_eq!(c.count(Window::Tpm, AT + 5_000), 150);
        assert_eq!(c.count_before(Window::Tpm, AT + 3_000, AT + 5_000), 100);
        assert_eq!(c.count_before(Window::Tpd, AT + 3_000, AT + 5_000), 100);
        // A quiet key lets its old slots go with its next send.
        c.add(AT + 5_000 + 120_000, 1, 1);
        assert_eq!(c.slots.len(), 1);
        assert_eq!(c.count(Window::Rpd, AT + 125_000), 5);
    }

    #[test]
    fn china_and_pacific_days_begin_at_their_own_midnight() {
        // 2026-03-15T12:00Z is 20:00 in China: its day began at 16:00Z the day before.
        assert_eq!(
            day_bounds(DailyReset::Offset(480), AT).0,
            AT - 20 * 3_600_000
        );
        assert_eq!(
            day_bounds(DailyReset::Offset(480), AT).1,
            AT + 4 * 3_600_000
        );
        // ... and 05:00 PDT: the Pacific day began at 07:00Z.
        assert_eq!(day_bounds(DailyReset::Pacific, AT).0, AT - 5 * 3_600_000);
        assert_eq!(day_bounds(DailyReset::Pacific, AT).1, AT + 19 * 3_600_000);
    }

    #[test]
    fn an_anchor_counts_down_with_local_use_then_ages_back_to_the_estimate() {
        let mut c = Counter::new(DailyReset::Utc, AnchorLifetimes::default());
        c.add(AT, 1, 0);
        c.anchor(Window::Rpd, 10, 0, Source::Reported, AT);
        for i in 1..=3 {
            c.add(AT + i * 1_000, 1, 0);
        }
        let h = c.headroom(Window::Rpd, Some(1_000), AT + 5_000);
        assert_eq!(
            h.map(|h| (h.remaining, h.source, h.age_ms)),
            Some((7, Source::Reported, 5_000))
        );
        // Two minutes on, the anchor is gone: 1,000 - 4 by local count.
        let h = c.headroom(Window::Rpd, Some(1_000), AT + REPORTED_TTL_MS + 1);
        assert_eq!(
            h.map(|h| (h.remaining, h.source)),
            Some((996, Source::Estimated))
        );
        // No limit, no anchor: unknown.
        assert_eq!(
            c.headroom(Window::Tpd, None, AT + REPORTED_TTL_MS + 1),
            None
        );
    }

    #[test]
    fn a_mined_zero_stands_until_its_reset_or_five_minutes() {
        let mut c = Counter::new(DailyReset::Utc, AnchorLifetimes::default());
        c.anchor(Window::Rpm, 0, AT + 20_000, Source::Mined, AT);
        let h = c.headroom(Window::Rpm, Some(30), AT + 10_000);
        assert_eq!(
            h.map(|h| (h.remaining, h.source, h.resets_at_ms)),
            Some((0, Source::Mined, AT + 20_000))
        );
        assert_eq!(
            c.headroom(Window::Rpm, Some(30), AT + 20_000)
                .map(|h| h.source),
            Some(Source::Estimated)
        );
        c.anchor(Window::Rpd, 0, 0, Source::Mined, AT);
        assert_eq!(
            c.headroom(Window::Rpd, None, AT + MINED_TTL_MS - 1)
                .map(|h| h.source),
            Some(Source::Mined)
        );
        assert_eq!(c.headroom(Window::Rpd, None, AT + MINED_TTL_MS), None);
    }

    #[test]
    fn the_pool_s_lifetimes_decide_when_an_anchor_ages_out() {
        let short = AnchorLifetimes {
            reported_ms: 3_000,
            mined_ms: 4_000,
        };
        let mut c = Counter::new(DailyReset::Utc, short);
        c.anchor(Window::Rpd, 10, 0, Source::Reported, AT);
        c.anchor(Window::Rpm, 0, 0, Source::Mined, AT);
        let source = |c: &mut Counter, w, at| c.headroom(w, Some(30), at).map(|h| h.source);
        assert_eq!(
            source(&mut c, Window::Rpd, AT + 2_999),
            Some(Source::Reported)
        );
        assert_eq!(
            source(&mut c, Window::Rpd, AT + 3_000),
            Some(Source::Estimated)
        );
        assert_eq!(source(&mut c, Window::Rpm, AT + 3_999), Some(Source::Mined));
        // A reload with longer lifetimes: the mined zero stands on.
        c.set_lifetimes(AnchorLifetimes::default());
        assert_eq!(source(&mut c, Window::Rpm, AT + 4_000), Some(Source::Mined));
    }
}
