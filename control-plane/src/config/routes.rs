//! `routes:` as written, checked: each rule has a unique name and names a profile of the file;
//! a rule whose profile resolution left out (no model left) is dropped with a warning. The
//! discount fields `autoPrice` reads are checked here too.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::error::{invalid, ConfigError};
use crate::config::file::{PolicyConfig, RouteConfig};

/// Refuses a rule without a name, a name given twice, an empty match value, or a profile the
/// file does not declare.
pub(super) fn check_routes(
    routes: &[RouteConfig],
    profiles: &BTreeMap<String, PolicyConfig>,
) -> Result<(), ConfigError> {
    let mut names = BTreeSet::new();
    for (i, route) in routes.iter().enumerate() {
        let path = format!("routes[{i}]");
        if route.name.trim().is_empty() {
            return Err(invalid(format!("{path}.name: must not be empty")));
        }
        if !names.insert(route.name.as_str()) {
            return Err(invalid(format!(
                "{path}.name: `{}` is given twice",
                route.name
            )));
        }
        let m = &route.matches;
        for (field, value) in [
            ("taskType", &m.task_type),
            ("userTier", &m.user_tier),
            ("feature", &m.feature),
        ] {
            if value.as_ref().is_some_and(|v| v.trim().is_empty()) {
                return Err(invalid(format!(
                    "{path}.match.{field}: must not be empty (leave it out to match any)"
                )));
            }
        }
        if !profiles.contains_key(&route.target.profile) {
            return Err(invalid(format!(
                "{path}.target.profile: `{}` is not a profile of this file",
                route.target.profile
            )));
        }
    }
    Ok(())
}

/// The rules whose profile is still in the pool, and a warning for each one dropped.
pub(super) fn kept_routes(
    routes: &[RouteConfig],
    profiles: &BTreeMap<String, PolicyConfig>,
    warnings: &mut Vec<String>,
) -> Vec<RouteConfig> {
    routes
        .iter()
        .filter(|r| {
            let kept = profiles.contains_key(&r.target.profile);
            if !kept {
                warnings.push(format!(
                    "route {} targets profile {}, which is left out; the rule is dropped",
                    r.name, r.target.profile
                ));
            }
            kept
        })
        .cloned()
        .collect()
}

/// A `discount` is a fraction of the list price: 0 up to, not including, 1.
pub(super) fn check_discount(path: &str, value: Option<f64>) -> Result<(), ConfigError> {
    match value {
        Some(v) if !v.is_finite() || !(0.0..1.0).contains(&v) => Err(invalid(format!(
            "{path}: must be a fraction from 0 up to 1 (0.2 = 20% off the table's price)"
        ))),
        _ => Ok(()),
    }
}
