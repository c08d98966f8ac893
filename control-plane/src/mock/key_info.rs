//! The mock's `GET …/key`: OpenRouter's "current API key" answer, the credit a key has left,
//! per key.
//!
//! ```yaml
//! keyInfo:
//!   default: { limit: 10, usage: 2.5 }          # a key `keys` does not name
//!   keys: { sk-test-2: { limit: 5, usage: 5 } } # no credit left
//! ```
//!
//! The answer is `{"data": {"label", "limit", "usage", "limit_remaining", "limit_reset",
//! "is_free_tier", "rate_limit"}}`, `limit` and `limit_remaining` `null` for a key without a
//! credit limit. Without `keyInfo` the path is unknown (404). A rule whose `match.path` is a
//! suffix of the path (`/key`) answers it instead.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `keyInfo:` in a script.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyInfo {
    /// What a key `keys` does not name is told; none: such a key is told it has no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<KeyCredit>,
    /// Per key (the bearer token of `authorization`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<String, KeyCredit>,
}

/// One key's credit, in US dollars.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyCredit {
    /// The key's credit limit; none: unlimited.
    #[serde(default)]
    pub limit: Option<f64>,
    #[serde(default)]
    pub usage: f64,
    #[serde(default)]
    pub is_free_tier: bool,
}

/// A GET of the current key: any path ending in `/key`.
pub fn is_key_info(path: &str) -> bool {
    path.trim_end_matches('/').ends_with("/key")
}

impl KeyInfo {
    /// The answer for `key`.
    pub fn answer(&self, key: Option<&str>) -> Value {
        let credit = key
            .and_then(|k| self.keys.get(k))
            .or(self.default.as_ref())
            .cloned()
            .unwrap_or_default();
        let remaining = credit.limit.map(|l| l - credit.usage);
        json!({
            "data": {
                // OpenRouter shows a masked key; the mock shows none of it.
                "label": "ai-router mock key",
                "limit": credit.limit,
                "usage": credit.usage,
                "limit_remaining": remaining,
                "limit_reset": null,
                "is_free_tier": credit.is_free_tier,
                "is_provisioning_key": false,
                "rate_limit": { "requests": -1, "interval": "10s" },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_is_told_its_own_credit_and_an_unknown_one_the_default() {
        let info: KeyInfo = serde_json::from_value(json!({
            "default": { "limit": 10, "usage": 2.5 },
            "keys": { "sk-out": { "limit": 5, "usage": 5, "isFreeTier": true } },
        }))
        .unwrap_or_default();
        let out = info.answer(Some("sk-out"));
        assert_eq!(out["data"]["limit_remaining"], 0.0);
        assert_eq!(out["data"]["is_free_tier"], true);
        let other = info.answer(Some("sk-other"));
        assert_eq!(other["data"]["limit_remaining"], 7.5);
        let unlimited = KeyInfo::default().answer(None);
        assert_eq!(unlimited["data"]["limit"], Value::Null);
        assert_eq!(unlimited["data"]["limit_remaining"], Value::Null);
        assert!(is_key_info("/api/v1/key") && !is_key_info("/v1/keys"));
    }
}
