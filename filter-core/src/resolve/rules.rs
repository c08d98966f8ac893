//! `routes:` rules on request metadata. A call whose `model` names no profile is matched
//! against the enabled rules, highest `priority` first (equal priorities in their configured
//! order); the first whose `match` fields all equal the request's metadata chooses the call's
//! profile. A rule with an empty `match` matches every call: the catch-all. A rule whose
//! profile the virtual key may not call is passed over, so a rule never widens a key's scope.
//!
//! The metadata: the headers `x-ai-router-task-type`, `x-ai-router-user-tier`,
//! `x-ai-router-feature`, else the OpenAI body's `metadata` object (`task_type` or `taskType`,
//! `user_tier` or `userTier`, `feature`). A header wins over the body.

use ai_router_contract::headers::{FEATURE, TASK_TYPE, USER_TIER};
use ai_router_proto::v1::{RouteRule, VirtualKey};
use serde_json::Value;

use crate::host::{Host, Side};
use crate::state::State;

/// What the rules match a request by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    pub task_type: Option<String>,
    pub user_tier: Option<String>,
    pub feature: Option<String>,
}

fn non_empty(value: Option<String>) -> Option<String> {
    value
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

impl Metadata {
    /// The metadata headers of the client's request (read before the front stage removes
    /// every `x-ai-router-` header).
    pub fn from_headers(host: &impl Host) -> Metadata {
        let read = |name| non_empty(host.header_text(Side::Request, name));
        Metadata {
            task_type: read(TASK_TYPE),
            user_tier: read(USER_TIER),
            feature: read(FEATURE),
        }
    }

    /// Fills what the headers left unset from the body's `metadata` object.
    pub fn or_body(mut self, body: &Value) -> Metadata {
        let Some(meta) = body.get("metadata").and_then(Value::as_object) else {
            return self;
        };
        let field = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| meta.get(*n).and_then(Value::as_str))
                .map(str::to_string)
        };
        if self.task_type.is_none() {
            self.task_type = non_empty(field(&["task_type", "taskType"]));
        }
        if self.user_tier.is_none() {
            self.user_tier = non_empty(field(&["user_tier", "userTier"]));
        }
        if self.feature.is_none() {
            self.feature = non_empty(field(&["feature"]));
        }
        self
    }
}

/// Whether every field the rule sets equals the request's.
fn matches(rule: &RouteRule, meta: &Metadata) -> bool {
    let field = |want: &Option<String>, have: &Option<String>| {
        want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
    };
    field(&rule.task_type, &meta.task_type)
        && field(&rule.user_tier, &meta.user_tier)
        && field(&rule.feature, &meta.feature)
}

/// The rule that chooses this call's profile, if any: only for a call whose `model` names no
/// profile, among the enabled rules whose profile exists and the key may call.
pub fn route_for<'s>(
    state: &'s State,
    key: &VirtualKey,
    body: &Value,
    meta: &Metadata,
) -> Option<&'s RouteRule> {
    let rules = &state.snapshot.routes;
    if rules.is_empty() {
        return None;
    }
    let named = body.get("model").and_then(Value::as_str).map(str::trim);
    if named.is_some_and(|m| state.profile(m).is_some()) {
        return None;
    }
    let meta = meta.clone().or_body(body);
    let mut enabled: Vec<&RouteRule> = rules.iter().filter(|r| r.enabled).collect();
    // Stable: equal priorities keep the configured order.
    enabled.sort_by_key(|r| std::cmp::Reverse(r.priority));
    enabled.into_iter().find(|r| {
        matches(r, &meta)
            && state.profile(&r.profile).is_some()
            && super::policy::allows(&key.profiles, &r.profile)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeHost;
    use ai_router_proto::v1::{Policy, Snapshot};
    use serde_json::json;

    fn rule(
        name: &str,
        priority: i32,
        task: Option<&str>,
        tier: Option<&str>,
        profile: &str,
    ) -> RouteRule {
        RouteRule {
            name: name.into(),
            priority,
            enabled: true,
            task_type: task.map(Into::into),
            user_tier: tier.map(Into::into),
            feature: None,
            profile: profile.into(),
        }
    }

    fn state(routes: Vec<RouteRule>) -> State {
        let mut snap = Snapshot::default();
        for p in ["cheap", "premium", "coding"] {
            snap.profiles.insert(p.into(), Policy::default());
        }
        snap.routes = routes;
        State::new(1, snap)
    }

    fn key(profiles: &[&str]) -> VirtualKey {
        VirtualKey {
            profiles: profiles.iter().map(|p| p.to_string()).collect(),
            enabled: true,
            ..Default::default()
        }
    }

    fn meta(task: Option<&str>, tier: Option<&str>) -> Metadata {
        Metadata {
            task_type: task.map(Into::into),
            user_tier: tier.map(Into::into),
            feature: None,
        }
    }

    fn name(r: Option<&RouteRule>) -> Option<&str> {
        r.map(|r| r.name.as_str())
    }

    #[test]
    fn the_highest_priority_match_wins_and_the_empty_match_catches_the_rest() {
        let s = state(vec![
            rule("default", 0, None, None, "cheap"),
            rule("code", 10, Some("code"), None, "coding"),
            rule("vip-code", 20, Some("code"), Some("pro"), "premium"),
        ]);
        let k = key(&["*"]);
        let body = json!({"model": "m1"});
        assert_eq!(
            name(route_for(&s, &k, &body, &meta(Some("code"), Some("pro")))),
            Some("vip-code")
        );
        assert_eq!(
            name(route_for(&s, &k, &body, &meta(Some("code"), Some("free")))),
            Some("code")
        );
        assert_eq!(
            name(route_for(&s, &k, &body, &meta(None, None))),
            Some("default")
        );
        // A missing model is routed too.
        assert_eq!(
            name(route_for(&s, &k, &json!({}), &meta(None, None))),
            Some("default")
        );
    }

    #[test]
    fn a_named_profile_disabled_rules_and_equal_priorities() {
        let mut off = rule("off", 50, None, None, "premium");
        off.enabled = false;
        let s = state(vec![
            off,
            rule("first", 5, None, None, "cheap"),
            rule("second", 5, None, None, "coding"),
        ]);
        let k = key(&["*"]);
        assert_eq!(
            name(route_for(
                &s,
                &k,
                &json!({"model": "m1"}),
                &meta(None, None)
            )),
            Some("first")
        );
        // The request names a profile itself: no rule applies.
        assert_eq!(
            name(route_for(
                &s,
                &k,
                &json!({"model": "coding"}),
                &meta(None, None)
            )),
            None
        );
    }

    #[test]
    fn a_rule_never_widens_the_keys_scope() {
        let s = state(vec![
            rule("vip", 10, None, Some("pro"), "premium"),
            rule("default", 0, None, None, "cheap"),
        ]);
        let body = json!({"model": "m1"});
        let m = meta(None, Some("pro"));
        assert_eq!(name(route_for(&s, &key(&["*"]), &body, &m)), Some("vip"));
        assert_eq!(
            name(route_for(&s, &key(&["cheap"]), &body, &m)),
            Some("default")
        );
        assert_eq!(name(route_for(&s, &key(&[]), &body, &m)), None);
    }

    #[test]
    fn metadata_from_headers_wins_over_the_body() {
        let mut host = FakeHost::with_state(state(Vec::new()));
        host.add(Side::Request, TASK_TYPE, b"code");
        let body = json!({"metadata": {"task_type": "chat", "userTier": "pro", "feature": " "}});
        let m = Metadata::from_headers(&host).or_body(&body);
        assert_eq!(
            m,
            Metadata {
                task_type: Some("code".into()),
                user_tier: Some("pro".into()),
                feature: None
            }
        );
        // No metadata object: nothing from the body.
        assert_eq!(
            Metadata::default().or_body(&json!({"metadata": "x"})),
            Metadata::default()
        );
    }
}
