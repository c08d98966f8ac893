//! The shared vocabulary of the decision core: the types every stage and record speaks of (a
//! lane, a local hold, a reply's usage, what a request needs, how a family is named). A leaf:
//! it names no other module of this crate, so every module may use it without a cycle
//! (`control-plane/tests/module_graph.rs` checks the crate's module graph).

use ai_router_contract::failure::ErrorClass;
use ai_router_proto::v1::Capability;
use serde_json::Value;

/// A lane this call has used.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LaneId {
    pub provider: String,
    pub key: String,
    pub model: String,
}

impl LaneId {
    pub fn new(provider: &str, key: &str, model: &str) -> Self {
        Self {
            provider: provider.into(),
            key: key.into(),
            model: model.into(),
        }
    }
}

/// A hold this VM (or another worker of this Envoy) put on a key or lane before the control
/// plane's push arrives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalHold {
    /// A 429 cooldown on the lane until this time.
    Cooldown { until_ms: i64, set_at_ms: i64 },
    /// The key is out (auth, quota, missing) until this time (0: until its secret changes),
    /// as long as its secret still has this fingerprint.
    Blacklist {
        class: ErrorClass,
        until_ms: i64,
        fingerprint: u64,
        set_at_ms: i64,
    },
}

/// How long a hold this process put on a lane speaks for the control plane: a snapshot
/// generated this long after the hold was set has heard of the failure (reports of failures go
/// out at once), so from then on the control plane's view wins, even when it no longer has the
/// hold (a restarted control plane that forgot it, a blacklist reset by an operator).
pub const LOCAL_HOLD_GRACE_MS: i64 = 5_000;

impl LocalHold {
    pub fn set_at_ms(&self) -> i64 {
        match self {
            LocalHold::Cooldown { set_at_ms, .. } | LocalHold::Blacklist { set_at_ms, .. } => {
                *set_at_ms
            }
        }
    }
}

/// Token usage read from a reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Of the prompt tokens, those served from the provider's cache.
    pub cached_tokens: u64,
}

pub fn usage_of(v: &Value) -> Option<Usage> {
    let u = v.get("usage")?;
    if u.is_null() {
        return None;
    }
    Some(Usage {
        prompt_tokens: u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        completion_tokens: u
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        cached_tokens: u
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
    })
}

/// What a request needs from a model, derived from the request itself and the policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Needs {
    pub capabilities: Vec<Capability>,
    /// Estimated prompt tokens ([`crate::protocols::context::estimate_tokens`]) plus max_tokens.
    pub context_tokens: u64,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
}

/// How a request names a model family (`family:<name>`), for the state that indexes the names
/// and the resolution that reads them ([`crate::lanes::families`] has the family rules).
pub mod family {
    /// How a request names a family.
    pub const PREFIX: &str = "family:";

    /// The name a family answers to.
    pub fn name_of(family: &str) -> String {
        format!("{PREFIX}{family}")
    }
}
