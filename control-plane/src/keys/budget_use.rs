//! What budget policies count of each charge, by subject and calendar window: the rows the key
//! store writes with the usage rows of the same charges (`budget_usage`), and what the engine's
//! budget ledger (`engine::budgets`) adds up. Here, not in the engine, because the usage writer
//! (`keys::usage`) needs it and the engine already reads the key store.

use std::collections::BTreeMap;

use ai_router_contract::calendar::{first_of_next_month_ms, next_utc_midnight_ms, HOUR_MS};

use crate::config::budgets::{BudgetPolicy, BudgetScope, BudgetWindow};
use crate::keys::charge::Charge;
use crate::keys::store::{merge_budget_use, BudgetUse};

/// When the window of `window` holding `ms` ends; `None` for a request window.
pub fn window_end(window: BudgetWindow, ms: i64) -> Option<i64> {
    match window {
        BudgetWindow::Request => None,
        BudgetWindow::Hour => Some((ms.div_euclid(HOUR_MS) + 1).saturating_mul(HOUR_MS)),
        BudgetWindow::Day => Some(next_utc_midnight_ms(ms)),
        BudgetWindow::Month => Some(first_of_next_month_ms(ms)),
    }
}

/// The subject `policy` counts `charge` under; `None` when it does not count it.
fn subject_of<'a>(policy: &BudgetPolicy, charge: &Charge<'a>) -> Option<&'a str> {
    let subject = match policy.scope {
        BudgetScope::Key => charge.key,
        BudgetScope::Profile => charge.profile,
        BudgetScope::Provider => charge.provider,
        BudgetScope::Pool => return Some(""),
    };
    (!subject.is_empty()).then_some(subject)
}

/// The budgets `charge` counts in: each policy with a calendar window that covers it, with its
/// subject and when the window holding the charge ends.
pub fn windows_of<'p, 'c>(
    policies: &'p [BudgetPolicy],
    charge: &'c Charge<'c>,
    now: i64,
) -> impl Iterator<Item = (&'p BudgetPolicy, &'c str, i64)> + use<'p, 'c> {
    let at = if charge.at_ms > 0 { charge.at_ms } else { now };
    policies.iter().filter_map(move |policy| {
        let until_ms = window_end(policy.window, at)?;
        let subject = subject_of(policy, charge)?;
        Some((policy, subject, until_ms))
    })
}

/// What `charges` add to the budgets' use, per (budget, subject, window): the rows the key
/// store counts with the usage rows of the same charges.
pub fn use_of<'c>(
    policies: &[BudgetPolicy],
    charges: impl IntoIterator<Item = Charge<'c>>,
    now: i64,
) -> Vec<BudgetUse> {
    let mut rows = BTreeMap::new();
    for charge in charges {
        let deltas: Vec<BudgetUse> = windows_of(policies, &charge, now)
            .map(|(policy, subject, until_ms)| BudgetUse {
                budget: policy.name.clone(),
                subject: subject.to_owned(),
                until_ms,
                tokens: charge.tokens(),
                cost: charge.cost,
            })
            .collect();
        merge_budget_use(&mut rows, &deltas);
    }
    rows.into_values().collect()
}
