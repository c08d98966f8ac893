//! Budget policies (`budgets:`) over hour, day and month windows, counted here from the
//! ledger's charges (`keys::charge`, the same ones the usage rows and the per-key quotas
//! count) and pushed to the filter as [`pb::BudgetState`]s, which it enforces: a hard budget
//! past its limit answers 429 `budget_exceeded` until the window ends, a soft one and one past
//! its `warnAt` put `x-ai-router-budget-warning` on the answers. Request windows are the
//! filter's alone (a cap on each call's estimate).
//!
//! Windows are UTC calendar windows (an hour, a day, a month), identified by when they end; a
//! charge in a newer window starts it over. Counting is after the call, so the call that
//! crosses a limit is answered and the next one is refused. Each rise of a budget's level in a
//! window (to `warn`, to `over`) is one [`Crossing`]: one event and one warning per window.

use std::collections::BTreeMap;

use ai_router_proto::v1 as pb;

use crate::config::budgets::{BudgetPolicy, BudgetScope, BudgetWindow};
use crate::engine::events::Event;
pub use crate::keys::budget_use::use_of;
use crate::keys::budget_use::{window_end, windows_of};
use crate::keys::charge::Charge;
use crate::keys::store::BudgetUse;

/// Where a budget stands in its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Level {
    #[default]
    Under,
    Warn,
    Over,
}

impl Level {
    /// "under", "warn" or "over" (`GET /admin/health`).
    pub fn text(self) -> &'static str {
        match self {
            Self::Under => "under",
            Self::Warn => "warn",
            Self::Over => "over",
        }
    }

    fn to_proto(self) -> pb::BudgetLevel {
        match self {
            Self::Under => pb::BudgetLevel::Unspecified,
            Self::Warn => pb::BudgetLevel::Warn,
            Self::Over => pb::BudgetLevel::Over,
        }
    }
}

/// One budget's use by one subject in one window.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WindowUse {
    /// When the window ends (ms since the epoch).
    pub until_ms: i64,
    pub tokens: u64,
    pub cost: f64,
    pub level: Level,
}

/// A budget whose level rose in its window.
#[derive(Debug, Clone, PartialEq)]
pub struct Crossing {
    pub budget: String,
    pub scope: BudgetScope,
    pub window: BudgetWindow,
    /// The key id, profile name or provider id; empty for the pool.
    pub subject: String,
    pub level: Level,
    pub hard: bool,
    pub used: WindowUse,
    pub max_tokens: Option<u64>,
    pub max_cost: Option<f64>,
}

/// The level of `used` against `policy`'s limits: over at or past a limit, warn at or past
/// `warnAt` of one.
pub fn level_of(policy: &BudgetPolicy, tokens: u64, cost: f64) -> Level {
    let tokens_share = policy.max_tokens.map(|max| tokens as f64 / max as f64);
    let cost_share = policy.max_cost.map(|max| cost / max);
    let share = tokens_share
        .into_iter()
        .chain(cost_share)
        .fold(0.0, f64::max);
    if share >= 1.0 {
        Level::Over
    } else if policy.warn_at.is_some_and(|w| share >= w) {
        Level::Warn
    } else {
        Level::Under
    }
}

/// The operator's event of a crossing.
pub fn event(c: &Crossing, at_ms: i64) -> Event {
    Event::Budget {
        at_ms,
        budget: c.budget.clone(),
        scope: pb::BudgetScope::from(c.scope).text(),
        window: pb::BudgetWindow::from(c.window).text(),
        subject: c.subject.clone(),
        level: c.level.to_proto().text(),
        enforcement: crate::config::budgets::Enforcement::of(c.hard).text(),
        tokens: c.used.tokens,
        cost: c.used.cost,
        max_tokens: c.max_tokens,
        max_cost: c.max_cost,
        until_ms: c.used.until_ms,
    }
}

/// Every budget's use by every subject in its current window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetLedger {
    /// (budget name, subject) -> use.
    windows: BTreeMap<(String, String), WindowUse>,
}

impl BudgetLedger {
    /// Counts `charge` in every budget that covers it; returns the levels that rose.
    pub fn charge(
        &mut self,
        policies: &[BudgetPolicy],
        charge: &Charge<'_>,
        now: i64,
    ) -> Vec<Crossing> {
        let mut crossings = Vec::new();
        for (policy, subject, until_ms) in windows_of(policies, charge, now) {
            let entry = self
                .windows
                .entry((policy.name.clone(), subject.to_owned()))
                .or_default();
            if entry.until_ms < until_ms {
                // A new window: what the last one used is over.
                *entry = WindowUse {
                    until_ms,
                    ..WindowUse::default()
                };
            } else if entry.until_ms > until_ms {
                // A late report of a window already over.
                continue;
            }
            entry.tokens = entry.tokens.saturating_add(charge.tokens());
            entry.cost += charge.cost;
            let level = level_of(policy, entry.tokens, entry.cost);
            if level > entry.level {
                entry.level = level;
                crossings.push(Crossing {
                    budget: policy.name.clone(),
                    scope: policy.scope,
                    window: policy.window,
                    subject: subject.to_owned(),
                    level,
                    hard: policy.hard,
                    used: *entry,
                    max_tokens: policy.max_tokens,
                    max_cost: policy.max_cost,
                });
            }
        }
        crossings
    }

    /// Takes the use the key store counted (`rows`, every control plane's charges that are
    /// stored) into the windows: a window takes the larger of its own count and the store's
    /// (its own may hold charges not yet written), and its level follows. A level raised so
    /// emits nothing: the control plane that counted the charge did (each one counts a batch
    /// before its usage rows can be written, see `Engine::apply_report`). Returns whether what
    /// is pushed changed.
    pub fn absorb(&mut self, policies: &[BudgetPolicy], rows: &[BudgetUse], now: i64) -> bool {
        let mut changed = false;
        for row in rows.iter().filter(|r| r.until_ms > now) {
            let Some(policy) = policies.iter().find(|p| p.name == row.budget) else {
                continue;
            };
            if window_end(policy.window, now) != Some(row.until_ms) {
                // A window of another length (the policy changed) or not yet begun.
                continue;
            }
            let entry = self
                .windows
                .entry((row.budget.clone(), row.subject.clone()))
                .or_default();
            if entry.until_ms > row.until_ms {
                continue;
            }
            if entry.until_ms < row.until_ms {
                *entry = WindowUse {
                    until_ms: row.until_ms,
                    ..WindowUse::default()
                };
            }
            entry.tokens = entry.tokens.max(row.tokens);
            entry.cost = entry.cost.max(row.cost);
            let level = level_of(policy, entry.tokens, entry.cost);
            if level > entry.level {
                changed |= true;
                entry.level = level;
            }
        }
        changed
    }

    /// Drops the windows that ended by `now`; returns whether one of them was pushed (past
    /// its warnAt or its limit).
    pub fn roll(&mut self, now: i64) -> bool {
        let mut pushed_gone = false;
        self.windows.retain(|_, w| {
            let keep = w.until_ms > now;
            pushed_gone |= !keep && w.level != Level::Under;
            keep
        });
        pushed_gone
    }

    /// What the filter enforces: every budget past its warnAt or its limit in a window that
    /// has not ended, with the policies themselves.
    pub fn to_proto(&self, policies: &[BudgetPolicy], now: i64) -> Option<pb::Budgets> {
        if policies.is_empty() {
            return None;
        }
        let states = self
            .windows
            .iter()
            .filter(|(_, w)| w.level != Level::Under && w.until_ms > now)
            .map(|((name, subject), w)| pb::BudgetState {
                name: name.clone(),
                subject: subject.clone(),
                level: w.level.to_proto().into(),
                until_ms: w.until_ms,
            })
            .collect();
        Some(pb::Budgets {
            policies: policies.iter().map(BudgetPolicy::to_proto).collect(),
            states,
        })
    }

    /// Every (budget, subject) use in a window that has not ended by `now`.
    pub fn windows(&self, now: i64) -> impl Iterator<Item = (&str, &str, &WindowUse)> {
        self.windows
            .iter()
            .filter(move |(_, w)| w.until_ms > now)
            .map(|((name, subject), w)| (name.as_str(), subject.as_str(), w))
    }

    /// The use of `budget` by `subject` in its current window, if any.
    pub fn get(&self, budget: &str, subject: &str) -> Option<&WindowUse> {
        self.windows.get(&(budget.to_owned(), subject.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-03-15T12:30:00Z
    const AT: i64 = 1_773_577_800_000;
    const NEXT_HOUR: i64 = 1_773_579_600_000;
    // 2026-03-16T00:00:00Z, 2026-04-01T00:00:00Z
    const NEXT_DAY: i64 = 1_773_619_200_000;
    const NEXT_MONTH: i64 = 1_775_001_600_000;

    fn policy(name: &str, scope: BudgetScope, window: BudgetWindow) -> BudgetPolicy {
        BudgetPolicy {
            name: name.into(),
            scope,
            window,
            max_tokens: Some(1_000),
            max_cost: Some(1.0),
            hard: true,
            warn_at: Some(0.5),
        }
    }

    fn charge(key: &'static str, tokens: u64, cost: f64, at_ms: i64) -> Charge<'static> {
        Charge {
            key,
            profile: "fast",
            provider: "openai",
            model: "gpt-4o",
            protocol: "chat",
            prompt_tokens: tokens,
            completion_tokens: 0,
            cached_tokens: 0,
            cost,
            at_ms,
        }
    }

    #[test]
    fn windows_end_on_the_utc_calendar() {
        assert_eq!(window_end(BudgetWindow::Hour, AT), Some(NEXT_HOUR));
        assert_eq!(window_end(BudgetWindow::Day, AT), Some(NEXT_DAY));
        assert_eq!(window_end(BudgetWindow::Month, AT), Some(NEXT_MONTH));
        assert_eq!(window_end(BudgetWindow::Request, AT), None);
        // The last millisecond of an hour is still in it.
        assert_eq!(
            window_end(BudgetWindow::Hour, NEXT_HOUR - 1),
            Some(NEXT_HOUR)
        );
    }

    #[test]
    fn a_level_is_the_larger_share_of_either_limit() {
        let p = policy("b", BudgetScope::Pool, BudgetWindow::Day);
        assert_eq!(level_of(&p, 499, 0.1), Level::Under);
        assert_eq!(level_of(&p, 500, 0.1), Level::Warn);
        assert_eq!(level_of(&p, 10, 0.6), Level::Warn);
        assert_eq!(level_of(&p, 10, 1.0), Level::Over);
        assert_eq!(level_of(&p, 1_000, 0.0), Level::Over);
        let no_warn = BudgetPolicy {
            warn_at: None,
            max_cost: None,
            ..p
        };
        assert_eq!(level_of(&no_warn, 999, 50.0), Level::Under);
    }

    #[test]
    fn one_crossing_per_level_and_window() {
        let policies = [policy("team", BudgetScope::Key, BudgetWindow::Hour)];
        let mut ledger = BudgetLedger::default();
        assert!(ledger
            .charge(&policies, &charge("key_a", 400, 0.0, AT), AT)
            .is_empty());
        let warn = ledger.charge(&policies, &charge("key_a", 200, 0.0, AT), AT);
        assert_eq!(warn.len(), 1);
        assert_eq!(
            (warn[0].level, warn[0].subject.as_str()),
            (Level::Warn, "key_a")
        );
        assert_eq!(warn[0].used.tokens, 600);
        // Still warn: no second warning in the window.
        assert!(ledger
            .charge(&policies, &charge("key_a", 100, 0.0, AT), AT)
            .is_empty());
        let over = ledger.charge(&policies, &charge("key_a", 300, 0.0, AT), AT);
        assert_eq!(
            over.iter().map(|c| c.level).collect::<Vec<_>>(),
            [Level::Over]
        );
        // Another key is another subject.
        assert!(ledger
            .charge(&policies, &charge("key_b", 10, 0.0, AT), AT)
            .is_empty());
        let pushed = ledger.to_proto(&policies, AT).unwrap_or_default();
        assert_eq!(pushed.policies.len(), 1);
        assert_eq!(pushed.states.len(), 1);
        assert_eq!(
            (pushed.states[0].level(), pushed.states[0].until_ms),
            (pb::BudgetLevel::Over, NEXT_HOUR)
        );
        // A late report of an ended window counts nowhere; the next window starts over.
        let next = ledger.charge(&policies, &charge("key_a", 600, 0.0, NEXT_HOUR), NEXT_HOUR);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].level, Level::Warn);
        assert!(ledger
            .charge(&policies, &charge("key_a", 900, 0.0, AT), NEXT_HOUR)
            .is_empty());
        assert_eq!(ledger.get("team", "key_a").map(|w| w.tokens), Some(600));
    }

    #[test]
    fn scopes_pick_their_subject_and_windows_roll() {
        let policies = [
            policy("per-profile", BudgetScope::Profile, BudgetWindow::Day),
            policy("per-provider", BudgetScope::Provider, BudgetWindow::Month),
            policy("pool", BudgetScope::Pool, BudgetWindow::Day),
            policy("cap", BudgetScope::Pool, BudgetWindow::Request),
        ];
        let mut ledger = BudgetLedger::default();
        let crossed = ledger.charge(&policies, &charge("key_a", 2_000, 0.0, AT), AT);
        let subjects: Vec<_> = crossed
            .iter()
            .map(|c| (c.budget.as_str(), c.subject.as_str(), c.level))
            .collect();
        assert_eq!(
            subjects,
            [
                ("per-profile", "fast", Level::Over),
                ("per-provider", "openai", Level::Over),
                ("pool", "", Level::Over),
            ]
        );
        // A direct model call has no profile: the profile's budget does not count it.
        let direct = Charge {
            profile: "",
            ..charge("key_a", 1, 0.0, AT)
        };
        ledger.charge(&policies, &direct, AT);
        assert_eq!(
            ledger.get("per-profile", "fast").map(|w| w.tokens),
            Some(2_000)
        );
        assert!(!ledger.roll(AT));
        // The day ends: two pushed states go, the month's stays.
        assert!(ledger.roll(NEXT_DAY));
        let left = ledger.to_proto(&policies, NEXT_DAY).unwrap_or_default();
        assert_eq!(
            left.states
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>(),
            ["per-provider"]
        );
        assert_eq!(BudgetLedger::default().to_proto(&[], AT), None);
    }

    #[test]
    fn the_stored_use_counts_the_same_windows_and_restores_the_levels() {
        let policies = [
            policy("team", BudgetScope::Key, BudgetWindow::Hour),
            policy("pool", BudgetScope::Pool, BudgetWindow::Month),
            policy("cap", BudgetScope::Pool, BudgetWindow::Request),
        ];
        let rows = use_of(
            &policies,
            [
                charge("key_a", 700, 0.1, AT),
                charge("key_a", 400, 0.2, AT),
                charge("key_b", 10, 0.0, AT),
            ],
            AT,
        );
        let summary: Vec<_> = rows
            .iter()
            .map(|r| (r.budget.as_str(), r.subject.as_str(), r.until_ms, r.tokens))
            .collect();
        assert_eq!(
            summary,
            [
                ("pool", "", NEXT_MONTH, 1_110),
                ("team", "key_a", NEXT_HOUR, 1_100),
                ("team", "key_b", NEXT_HOUR, 10),
            ]
        );
        // A control plane that starts (or shares the store) takes the stored use: the key's
        // hour and the pool's month are over again, with nothing charged here.
        let mut restarted = BudgetLedger::default();
        assert!(restarted.absorb(&policies, &rows, AT));
        let pushed = restarted.to_proto(&policies, AT).unwrap_or_default();
        let states: Vec<_> = pushed
            .states
            .iter()
            .map(|s| (s.name.as_str(), s.subject.as_str(), s.level(), s.until_ms))
            .collect();
        assert_eq!(
            states,
            [
                ("pool", "", pb::BudgetLevel::Over, NEXT_MONTH),
                ("team", "key_a", pb::BudgetLevel::Over, NEXT_HOUR),
            ]
        );
        // Taking it again changes nothing; the larger count wins (charges not yet stored).
        assert!(!restarted.absorb(&policies, &rows, AT));
        restarted.charge(&policies, &charge("key_b", 600, 0.0, AT), AT);
        assert!(!restarted.absorb(&policies, &rows, AT));
        assert_eq!(restarted.get("team", "key_b").map(|w| w.tokens), Some(610));
        // A row of an ended window, or of a budget no longer configured, is not taken.
        let mut later = BudgetLedger::default();
        assert!(!later.absorb(&policies, &rows[1..], NEXT_HOUR));
        assert!(!later.absorb(&policies[1..], &rows[1..], AT));
        assert_eq!(later.get("team", "key_a"), None);
    }
}
