//! `budgets:`: spending policies over a scope (a key, a profile, a provider, the pool) and a
//! UTC calendar window (`request` is a cap on each call's estimate). As written
//! ([`BudgetPolicyConfig`]) and checked ([`BudgetPolicy`], via `resolve_budgets`).

use std::collections::BTreeSet;

use ai_router_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::config::error::{invalid, ConfigError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetScope {
    Key,
    Profile,
    Provider,
    Pool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetWindow {
    Request,
    Hour,
    Day,
    Month,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    Hard,
    Soft,
}

impl Enforcement {
    /// A policy's enforcement from [`BudgetPolicy::hard`].
    pub fn of(hard: bool) -> Self {
        if hard {
            Self::Hard
        } else {
            Self::Soft
        }
    }

    /// "hard" or "soft", as the configuration spells it.
    pub fn text(self) -> &'static str {
        match self {
            Self::Hard => "hard",
            Self::Soft => "soft",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetLimitsConfig {
    pub max_tokens: Option<u64>,
    pub max_cost: Option<f64>,
}

/// One entry of `budgets:` as written.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetPolicyConfig {
    pub name: String,
    pub scope: BudgetScope,
    pub window: BudgetWindow,
    pub limits: BudgetLimitsConfig,
    pub enforcement: Enforcement,
    pub warn_at: Option<f64>,
}

/// A checked budget policy: a unique name, at least one limit, `warnAt` in (0, 1).
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetPolicy {
    pub name: String,
    pub scope: BudgetScope,
    pub window: BudgetWindow,
    pub max_tokens: Option<u64>,
    pub max_cost: Option<f64>,
    pub hard: bool,
    pub warn_at: Option<f64>,
}

impl From<BudgetScope> for pb::BudgetScope {
    fn from(scope: BudgetScope) -> Self {
        match scope {
            BudgetScope::Key => Self::Key,
            BudgetScope::Profile => Self::Profile,
            BudgetScope::Provider => Self::Provider,
            BudgetScope::Pool => Self::Pool,
        }
    }
}

impl From<BudgetWindow> for pb::BudgetWindow {
    fn from(window: BudgetWindow) -> Self {
        match window {
            BudgetWindow::Request => Self::Request,
            BudgetWindow::Hour => Self::Hour,
            BudgetWindow::Day => Self::Day,
            BudgetWindow::Month => Self::Month,
        }
    }
}

impl BudgetPolicy {
    pub fn to_proto(&self) -> pb::Budget {
        pb::Budget {
            name: self.name.clone(),
            scope: pb::BudgetScope::from(self.scope).into(),
            window: pb::BudgetWindow::from(self.window).into(),
            max_tokens: self.max_tokens.unwrap_or(0),
            max_cost: self.max_cost.unwrap_or(0.0),
            hard: self.hard,
            warn_at: self.warn_at.unwrap_or(0.0),
        }
    }
}

/// Checks every entry: names unique and not empty, a limit at least, `warnAt` a fraction.
pub(super) fn resolve_budgets(
    raw: &[BudgetPolicyConfig],
) -> Result<Vec<BudgetPolicy>, ConfigError> {
    let mut names = BTreeSet::new();
    let mut out = Vec::with_capacity(raw.len());
    for (i, b) in raw.iter().enumerate() {
        let path = format!("budgets[{i}]");
        let name = b.name.trim();
        if name.is_empty() {
            return Err(invalid(format!("{path}.name: give the budget a name")));
        }
        // The name travels in a response header (`name=level`, comma-separated).
        if name
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/')))
        {
            return Err(invalid(format!(
                "{path}.name: `{name}` may hold only letters, digits and - _ . : /"
            )));
        }
        if !names.insert(name.to_owned()) {
            return Err(invalid(format!("{path}.name: `{name}` is given twice")));
        }
        if b.limits.max_cost.is_some_and(|c| !c.is_finite() || c < 0.0) {
            return Err(invalid(format!(
                "{path}.limits.maxCost: must be a non-negative number"
            )));
        }
        let max_cost = b.limits.max_cost.filter(|c| *c > 0.0);
        let max_tokens = b.limits.max_tokens.filter(|t| *t > 0);
        if max_cost.is_none() && max_tokens.is_none() {
            return Err(invalid(format!(
                "{path}.limits: set maxTokens or maxCost (above 0)"
            )));
        }
        if let Some(w) = b.warn_at {
            if !(w > 0.0 && w < 1.0) {
                return Err(invalid(format!(
                    "{path}.warnAt: a fraction of the limit between 0 and 1 (0.8 = 80%)"
                )));
            }
        }
        out.push(BudgetPolicy {
            name: name.to_owned(),
            scope: b.scope,
            window: b.window,
            max_tokens,
            max_cost,
            hard: b.enforcement == Enforcement::Hard,
            warn_at: b.warn_at,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(yaml: &str) -> Result<Vec<BudgetPolicy>, String> {
        let raw: Vec<BudgetPolicyConfig> =
            serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        resolve_budgets(&raw).map_err(|e| e.to_string())
    }

    #[test]
    fn budgets_are_checked() -> Result<(), String> {
        let ok = one(
            "- { name: team, scope: key, window: day, limits: { maxCost: 5 }, enforcement: hard, warnAt: 0.8 }\n\
             - { name: per-call, scope: pool, window: request, limits: { maxTokens: 4000 }, enforcement: soft }\n",
        )?;
        assert_eq!(ok.len(), 2);
        assert!(ok[0].hard && ok[0].max_cost == Some(5.0) && ok[0].warn_at == Some(0.8));
        assert_eq!(ok[1].to_proto().window(), pb::BudgetWindow::Request);
        let refused = [
            ("- { name: a, scope: key, window: day, limits: {}, enforcement: hard }", "limits"),
            ("- { name: a, scope: key, window: day, limits: { maxCost: 1 }, enforcement: hard, warnAt: 1.5 }", "warnAt"),
            ("- { name: 'a b', scope: key, window: day, limits: { maxCost: 1 }, enforcement: hard }", "name"),
            ("- { name: a, scope: key, window: week, limits: { maxCost: 1 }, enforcement: hard }", "week"),
            ("- { name: a, scope: key, window: day, limits: { maxCost: -1 }, enforcement: hard }", "maxCost"),
            ("- { name: a, scope: key, window: day, limits: { maxCost: 1 }, enforcement: hard }\n- { name: a, scope: pool, window: day, limits: { maxCost: 1 }, enforcement: soft }", "twice"),
        ];
        for (yaml, word) in refused {
            let err = one(yaml).err().unwrap_or_default();
            assert!(err.contains(word), "{yaml}: {err}");
        }
        Ok(())
    }
}
