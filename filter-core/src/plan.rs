//! The call plan the front stage writes for the attempt stage (header `x-ai-router-plan`).

use serde::{Deserialize, Serialize};

pub const PLAN_HEADER: &str = ai_router_contract::headers::PLAN;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Chat,
    Embeddings,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Chat => "chat",
            Operation::Embeddings => "embeddings",
        }
    }

    /// The API path under a provider's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Operation::Chat => "/chat/completions",
            Operation::Embeddings => "/embeddings",
        }
    }
}

/// One (provider, model) a call may use, with its share of its tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    #[serde(rename = "p")]
    pub provider: String,
    #[serde(rename = "m")]
    pub model: String,
    #[serde(rename = "w", default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Unique per call within this VM: the key of the call's attempt bookkeeping.
    pub cid: String,
    /// x-request-id.
    pub rid: String,
    /// The virtual key's id.
    pub vk: String,
    pub op: Operation,
    pub stream: bool,
    /// Whether the client asked for the usage chunk.
    pub include_usage: bool,
    /// Ordered tiers; candidates of one tier share load by weight.
    pub tiers: Vec<Vec<Candidate>>,
    pub max_attempts: u32,
    pub timeout_ms: u64,
    pub deadline_ms: u64,
    pub started_ms: i64,
    /// Estimated prompt tokens plus max_tokens, against reported token headroom.
    #[serde(default)]
    pub tokens: u64,
    /// The client asked for the routing trail on a success too (`x-ai-router-trail: 1`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trail: bool,
}

impl Plan {
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn decode(text: &str) -> Option<Plan> {
        serde_json::from_str(text).ok()
    }
}
