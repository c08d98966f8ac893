//! The plugin configuration of each root context, one type for both sides: the renderer
//! (`control-plane/src/render.rs`) writes it as the `configuration` of each wasm filter and the
//! filter (`filter-core/src/vm/plugin.rs`) reads it back in `on_configure`.

use serde::{Deserialize, Serialize};

/// The `role` of a root context.
pub mod roles {
    pub const FRONT: &str = "front";
    pub const ATTEMPT: &str = "attempt";
    /// The attempt stage as the one-pass aggregate's upstream filter: a call's first attempt,
    /// and the headers it rewrote put back on the later ones.
    pub const FIRST: &str = "first";
    /// The singleton that holds the control-plane stream.
    pub const CTRL: &str = "ctrl";
}

/// The ctrl singleton's tick when the configuration names none (and what the renderer writes).
pub const DEFAULT_TICK_MS: u64 = 500;
/// The tick periods taken, the filter refusing a configuration outside it (it applies the
/// period as given): a zero period would stop the ticks (and the reports) altogether, a long
/// one would hold the reports and the reconnects back.
pub const TICK_MS: std::ops::RangeInclusive<u64> = 50..=10_000;
/// How the ctrl singleton names its Envoy to the control plane when the configuration does not.
pub const DEFAULT_NODE: &str = "envoy";

/// The plugin configuration's JSON (`{"role": ...}`); the ctrl fields are absent elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    pub role: String,
    /// ctrl: the gRPC cluster of the control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_cluster: Option<String>,
    /// ctrl: how this Envoy names itself to the control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// ctrl: tick period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick_ms: Option<u64>,
    /// front, with `gateway.onePass`: what the public route can send in one pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_pass: Option<OnePass>,
}

/// The front's part of `gateway.onePass`, as the bootstrap was rendered.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnePass {
    /// The authorities (`host:port`) of the plain-HTTP providers Envoy resolved at start: a
    /// host outside the cache would get the router's own 503, never retried.
    pub hosts: Vec<String>,
    /// The retries the aggregate has a cluster for: a call allowed more goes in two passes.
    pub retries: u32,
}

impl PluginConfig {
    /// A root with no fields besides its role (`front`, `attempt`).
    pub fn role(role: &str) -> Self {
        Self {
            role: role.into(),
            grpc_cluster: None,
            node: None,
            tick_ms: None,
            one_pass: None,
        }
    }

    /// The ctrl singleton's configuration.
    pub fn ctrl(grpc_cluster: &str, node: &str, tick_ms: u64) -> Self {
        Self {
            grpc_cluster: Some(grpc_cluster.into()),
            node: Some(node.into()),
            tick_ms: Some(tick_ms),
            ..Self::role(roles::CTRL)
        }
    }

    /// The JSON Envoy hands the root context.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}
