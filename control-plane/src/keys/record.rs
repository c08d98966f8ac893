//! A virtual key as the control plane holds it and pushes it: the record the mounted keys and
//! the key store both turn into, with the quota block its usage puts on it.

use ai_router_contract::error_code::ErrorCode;
use ai_router_proto::v1 as pb;

use crate::config::QuotaConfig;

/// A virtual key as the control plane holds it: bindings and the hash, never the secret.
#[derive(Debug, Clone, PartialEq)]
pub struct VirtualKeyRecord {
    pub id: String,
    pub label: String,
    pub sha256: String,
    /// The last four characters of the secret.
    pub hint: String,
    pub profiles: Vec<String>,
    pub models: Vec<String>,
    pub owner: Option<String>,
    pub allow_fallback: bool,
    pub enabled: bool,
    pub quota: Option<QuotaConfig>,
    pub mounted: bool,
    /// A quota spent according to usage (`keys::quotas`).
    pub quota_block: Option<QuotaBlock>,
    /// The response cache for the key's calls, when the key says (else the policy's).
    pub cache: Option<bool>,
}

impl VirtualKeyRecord {
    pub fn to_proto(&self) -> pb::VirtualKey {
        pb::VirtualKey {
            id: self.id.clone(),
            label: self.label.clone(),
            sha256: self.sha256.clone(),
            profiles: self.profiles.clone(),
            models: self.models.clone(),
            allow_fallback: self.allow_fallback,
            enabled: self.enabled,
            requests_per_minute: self.quota.and_then(|q| q.requests_per_minute).unwrap_or(0),
            quota_code: self
                .quota_block
                .as_ref()
                .map(|b| b.code.as_str().to_owned())
                .unwrap_or_default(),
            quota_until_ms: self.quota_block.as_ref().map_or(0, |b| b.until_ms),
            cache: self.cache,
        }
    }
}

/// A spent quota: the 429 code the filter answers with, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaBlock {
    pub code: ErrorCode,
    pub until_ms: i64,
}
