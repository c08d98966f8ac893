//! ai-router under test: its pool (providers and keys pointing at the fake upstream), its
//! virtual keys (provisioned once per count through the admin API, into an SQLite key store
//! each scenario copies), the running control plane + Envoy, and the sync probes (how long a
//! revoked virtual key or a blacklisted provider key takes to reach every Envoy worker, and
//! how many bytes the sync stream carried for it).

use std::time::Duration;

use ai_router_e2e::random_hex;
use serde::Serialize;

use crate::upstream::Headers;

mod instance;
mod probes;
mod provision;
pub mod variant;

pub use instance::Instance;
pub use probes::SyncProbe;
pub use provision::{provision, KeyBundle, Provisioning};

/// The model every system is benchmarked on.
pub const MODEL: &str = "bench-model";
/// The model of the probe provider (one key): the blacklist probe's lane.
const PROBE_MODEL: &str = "probe-model";
/// The model of the providers that hold the keys not serving [`MODEL`].
const OTHER_MODEL: &str = "other-model";
/// How many providers share the keys that do not serve [`MODEL`].
const OTHER_PROVIDERS: usize = 8;
/// The Envoy cluster of the sync stream (`ai-router render-envoy`).
const SYNC_CLUSTER_RX: &str = "cluster.ai_router_control_plane.upstream_cx_rx_bytes_total";
/// How long a probe waits for a change to reach every worker.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// The size of a pool and its key table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shape {
    /// Virtual keys in the key store (the one the load uses included).
    pub virtual_keys: usize,
    /// Provider keys serving [`MODEL`], spread over the two providers `fake-a` and `fake-b`.
    pub serving_keys: usize,
    /// Provider keys on [`OTHER_PROVIDERS`] providers that serve another model.
    pub other_keys: usize,
    pub headers: Headers,
}

impl Shape {
    pub fn label(&self) -> String {
        let pk = if self.other_keys == 0 {
            format!("{} PK (all serve)", self.serving_keys)
        } else {
            format!(
                "{} PK ({} serve, {} other)",
                self.serving_keys + self.other_keys,
                self.serving_keys,
                self.other_keys
            )
        };
        format!(
            "{} VK · {pk} · {}",
            self.virtual_keys,
            self.headers.prefix()
        )
    }
}

/// The secrets of one run: provider keys and tokens (generated, never printed).
#[derive(Debug, Clone)]
pub struct Secrets {
    pub sync_token: String,
    pub admin_token: String,
}

impl Secrets {
    pub fn new() -> Self {
        Self {
            sync_token: format!("sync-{}", random_hex(32)),
            admin_token: format!("admin-{}", random_hex(32)),
        }
    }
}
