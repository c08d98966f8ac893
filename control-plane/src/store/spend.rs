//! Provider budgets: `providers[].budget { costPerDay, costPerMonth }`.
//!
//! Spend is counted per UTC day and UTC month from attempt usage and the model's cost (per one
//! million tokens, in whatever unit the budget uses). Past a budget the provider is out until
//! the next UTC day or month.

use crate::config::BudgetConfig;

use ai_router_contract::calendar::{self, DAY_MS};

/// A provider's spend in the current UTC day and month.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Spend {
    /// Days since the epoch of `day_cost`.
    pub day: i64,
    pub day_cost: f64,
    /// `year * 12 + month - 1` of `month_cost`.
    pub month: i64,
    pub month_cost: f64,
}

/// The UTC day index of `ms`.
pub fn day_of(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// `year * 12 + month - 1` of `ms`, in UTC.
pub fn month_of(ms: i64) -> i64 {
    calendar::month_index(ms)
}

/// When the UTC day after the one holding `ms` starts.
pub fn next_day_ms(ms: i64) -> i64 {
    calendar::next_utc_midnight_ms(ms)
}

/// When the UTC month after the one holding `ms` starts.
pub fn next_month_ms(ms: i64) -> i64 {
    calendar::first_of_next_month_ms(ms)
}

impl Spend {
    /// Moves to the period holding `now`, zeroing a past day or month; returns whether it did.
    pub fn roll(&mut self, now: i64) -> bool {
        let (day, month) = (day_of(now), month_of(now));
        let mut changed = false;
        if self.day != day {
            self.day = day;
            self.day_cost = 0.0;
            changed = true;
        }
        if self.month != month {
            self.month = month;
            self.month_cost = 0.0;
            changed = true;
        }
        changed
    }

    pub fn add(&mut self, now: i64, cost: f64) {
        self.roll(now);
        self.day_cost += cost;
        self.month_cost += cost;
    }

    /// Until when the provider is out (ms since the epoch), when a budget is spent at `now`.
    pub fn out_until(&self, budget: &BudgetConfig, now: i64) -> Option<i64> {
        let day = budget
            .cost_per_day
            .filter(|limit| self.day == day_of(now) && self.day_cost >= *limit)
            .map(|_| next_day_ms(now));
        let month = budget
            .cost_per_month
            .filter(|limit| self.month == month_of(now) && self.month_cost >= *limit)
            .map(|_| next_month_ms(now));
        day.max(month)
    }

    /// Three-way merge of spend another process added (`remote - base`) with ours (`self`).
    pub fn merge(&mut self, base: &Self, remote: &Self) {
        if remote.day == self.day {
            let ours = if base.day == self.day {
                self.day_cost - base.day_cost
            } else {
                self.day_cost
            };
            self.day_cost = remote.day_cost + ours.max(0.0);
        } else if remote.day > self.day {
            self.day = remote.day;
            self.day_cost = remote.day_cost;
        }
        if remote.month == self.month {
            let ours = if base.month == self.month {
                self.month_cost - base.month_cost
            } else {
                self.month_cost
            };
            self.month_cost = remote.month_cost + ours.max(0.0);
        } else if remote.month > self.month {
            self.month = remote.month;
            self.month_cost = remote.month_cost;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_contract::calendar::{civil_from_days, days_from_civil};

    // 2024-01-31T12:00:00Z
    const JAN_31_NOON: i64 = 1_706_702_400_000;

    #[test]
    fn calendar() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(next_day_ms(JAN_31_NOON), 1_706_745_600_000); // 2024-02-01
        assert_eq!(next_month_ms(JAN_31_NOON), 1_706_745_600_000);
        // 2024-12-15 -> 2025-01-01
        let dec = days_from_civil(2024, 12, 15) * DAY_MS;
        assert_eq!(next_month_ms(dec), days_from_civil(2025, 1, 1) * DAY_MS);
        assert_eq!(month_of(dec) + 1, month_of(next_month_ms(dec)));
    }

    #[test]
    fn cost_and_rollover() {
        let budget = BudgetConfig {
            cost_per_day: Some(3.0),
            cost_per_month: Some(5.0),
        };
        let mut spend = Spend::default();
        spend.add(JAN_31_NOON, 2.0);
        assert_eq!(spend.out_until(&budget, JAN_31_NOON), None);
        spend.add(JAN_31_NOON, 1.0);
        let feb_1 = next_day_ms(JAN_31_NOON);
        assert_eq!(spend.out_until(&budget, JAN_31_NOON), Some(feb_1));
        // The next day: the day budget is fresh, the month one too (a new month).
        assert!(spend.roll(feb_1));
        assert_eq!(spend.out_until(&budget, feb_1), None);
        spend.add(feb_1, 2.5);
        spend.add(feb_1 + DAY_MS, 2.5);
        // 5.0 this month: out until March, whatever the day.
        let march_1 = days_from_civil(2024, 3, 1) * DAY_MS;
        assert_eq!(spend.out_until(&budget, feb_1 + DAY_MS), Some(march_1));
    }

    #[test]
    fn merge_adds_what_each_process_spent() {
        let base = Spend {
            day: 10,
            day_cost: 1.0,
            month: 5,
            month_cost: 4.0,
        };
        let mut ours = base;
        ours.day_cost += 0.5;
        ours.month_cost += 0.5;
        let mut remote = base;
        remote.day_cost += 2.0;
        remote.month_cost += 2.0;
        ours.merge(&base, &remote);
        assert!((ours.day_cost - 3.5).abs() < 1e-9);
        assert!((ours.month_cost - 6.5).abs() < 1e-9);
    }
}
