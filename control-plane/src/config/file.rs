//! The config file as written: every section and field with its YAML name
//! (`deny_unknown_fields` everywhere), most of them optional. Nothing here applies a default
//! or checks a value; `resolve` does, once.
//!
//! A few of these types are also what the resolved config holds, being complete as written:
//! a model (`ModelConfig`), a policy layer (`PolicyConfig`: a profile's unset field inherits
//! from `defaults`, in the filter), quotas and budgets (an unset limit is no limit) and
//! `selection` (every field has its default).

use std::collections::BTreeMap;
use std::path::PathBuf;

use ai_router_contract::defaults;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileConfig {
    #[serde(default)]
    pub gateway: GatewayConfig,
    #[serde(default)]
    pub control_plane: ControlPlaneConfig,
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    #[serde(default)]
    pub defaults: Option<PolicyConfig>,
    #[serde(default)]
    pub profiles: BTreeMap<String, PolicyConfig>,
    #[serde(default)]
    pub resilience: ResilienceFileConfig,
    #[serde(default)]
    pub selection: SelectionConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    #[serde(default)]
    pub state_store: Option<StoreConfig>,
    #[serde(default)]
    pub store_namespace: Option<String>,
    #[serde(default)]
    pub mounted_keys: Vec<MountedKeyConfig>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewayConfig {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub app_port: Option<u16>,
    pub port_offset: Option<u16>,
    pub admin_token: Option<SecretRefConfig>,
    pub key_store: Option<StoreConfig>,
    pub max_body_bytes: Option<u64>,
    pub forward_rate_limit_headers: Option<bool>,
    pub request_headers_timeout_ms: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    pub connection_idle_timeout_ms: Option<u64>,
    pub max_concurrent_requests: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ControlPlaneConfig {
    pub host: Option<String>,
    pub http_port: Option<u16>,
    pub grpc_port: Option<u16>,
    pub sync_token: Option<SecretRefConfig>,
}

/// `{ env: NAME }` or `{ file: path }`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRefConfig {
    pub env: Option<String>,
    pub file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreType {
    Memory,
    Sqlite,
    /// The shared state store (`stateStore` only).
    Redis,
    /// The shared key store (`gateway.keyStore` only).
    Postgres,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    #[serde(rename = "type")]
    pub kind: StoreType,
    pub path: Option<PathBuf>,
    /// Redis and Postgres: the connection URL, `{ env: NAME }` or `{ file: path }` (it may
    /// carry a password).
    pub url: Option<SecretRefConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    Anthropic,
    Openrouter,
    Qwen,
    Deepseek,
    Openai,
    Gemini,
    Groq,
    OpenaiCompatible,
}

impl From<ProviderKind> for ai_router_proto::v1::ProviderKind {
    fn from(kind: ProviderKind) -> Self {
        match kind {
            ProviderKind::Anthropic => Self::Anthropic,
            ProviderKind::Openrouter => Self::Openrouter,
            ProviderKind::Qwen => Self::Qwen,
            ProviderKind::Deepseek => Self::Deepseek,
            ProviderKind::Openai => Self::Openai,
            ProviderKind::Gemini => Self::Gemini,
            ProviderKind::Groq => Self::Groq,
            ProviderKind::OpenaiCompatible => Self::OpenaiCompatible,
        }
    }
}

impl ProviderKind {
    /// The kind as the configuration spells it: the wire enum's text.
    pub fn as_str(self) -> &'static str {
        ai_router_proto::v1::ProviderKind::from(self).text()
    }

    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            Self::Openai => Some("https://api.openai.com/v1"),
            Self::Anthropic => Some("https://api.anthropic.com/v1"),
            Self::Openrouter => Some("https://openrouter.ai/api/v1"),
            Self::Qwen => Some("https://dashscope-intl.aliyuncs.com/compatible-mode/v1"),
            Self::Deepseek => Some("https://api.deepseek.com/v1"),
            Self::Gemini => Some("https://generativelanguage.googleapis.com/v1beta/openai"),
            Self::Groq => Some("https://api.groq.com/openai/v1"),
            Self::OpenaiCompatible => None,
        }
    }

    /// The header that carries the secret; `authorization` sends `Bearer <secret>`.
    pub fn auth_header(self) -> &'static str {
        match self {
            Self::Anthropic => "x-api-key",
            _ => "authorization",
        }
    }

    pub fn supports_embeddings(self) -> bool {
        !matches!(self, Self::Anthropic | Self::Deepseek | Self::Groq)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderConfig {
    /// Defaults to the kind's name.
    pub id: Option<String>,
    pub kind: Option<ProviderKind>,
    pub base_url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub weight: Option<f64>,
    pub max_concurrency: Option<u32>,
    pub default_max_tokens: Option<u32>,
    pub budget: Option<BudgetConfig>,
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    pub keys_from_env: Option<String>,
    #[serde(default)]
    pub models: Vec<ModelConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetConfig {
    pub cost_per_day: Option<f64>,
    pub cost_per_month: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyConfig {
    pub alias: String,
    pub env: Option<String>,
    pub file: Option<PathBuf>,
    pub weight: Option<f64>,
    pub max_concurrency: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    Chat,
    Streaming,
    Tools,
    Json,
    Embeddings,
}

impl From<Capability> for ai_router_proto::v1::Capability {
    fn from(capability: Capability) -> Self {
        match capability {
            Capability::Chat => Self::Chat,
            Capability::Streaming => Self::Streaming,
            Capability::Tools => Self::Tools,
            Capability::Json => Self::Json,
            Capability::Embeddings => Self::Embeddings,
        }
    }
}

impl Capability {
    /// The capability as the configuration spells it: the wire enum's text.
    pub fn as_str(self) -> &'static str {
        ai_router_proto::v1::Capability::from(self).text()
    }
}

/// What a model can do when it declares nothing.
pub const DEFAULT_CAPABILITIES: [Capability; 4] = [
    Capability::Chat,
    Capability::Streaming,
    Capability::Tools,
    Capability::Json,
];

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelConfig {
    pub id: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    pub context_window: Option<u64>,
    pub cost: Option<CostConfig>,
    pub capabilities: Option<Vec<Capability>>,
    pub weight: Option<f64>,
    pub identity: Option<String>,
    pub dimensions: Option<u32>,
}

impl ModelConfig {
    pub fn capabilities(&self) -> Vec<Capability> {
        self.capabilities
            .clone()
            .unwrap_or_else(|| DEFAULT_CAPABILITIES.to_vec())
    }

    /// The model's identity: `identity`, else its id.
    pub fn identity(&self) -> &str {
        self.identity.as_deref().unwrap_or(&self.id)
    }

    pub fn answers_to(&self, name: &str) -> bool {
        self.id == name || self.aliases.iter().any(|a| a == name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CostConfig {
    pub input: f64,
    pub output: f64,
}

impl CostConfig {
    /// The cost of a call's tokens at these prices per million tokens.
    pub fn of(&self, prompt_tokens: u64, completion_tokens: u64) -> f64 {
        // Token counts fit f64 exactly far beyond any real usage.
        #[allow(clippy::cast_precision_loss)]
        let (prompt, completion) = (prompt_tokens as f64, completion_tokens as f64);
        (prompt * self.input + completion * self.output) / 1e6
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyConfig {
    pub model: Option<String>,
    pub fallbacks: Option<Vec<String>>,
    pub allow_fallback: Option<bool>,
    pub max_attempts: Option<u32>,
    pub timeout_ms: Option<u64>,
    pub deadline_ms: Option<u64>,
    pub budget: Option<PolicyBudgetConfig>,
    pub providers: Option<Vec<String>>,
    pub require: Option<Vec<Capability>>,
    pub candidates: Option<Vec<TierConfig>>,
    pub pinned: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyBudgetConfig {
    pub max_cost: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateConfig {
    pub model: String,
    pub provider: Option<String>,
    pub weight: Option<f64>,
}

/// A tier of candidates: one `{ model, provider?, weight? }` or a list sharing the load.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct TierConfig(pub Vec<CandidateConfig>);

impl<'de> Deserialize<'de> for TierConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TierVisitor;
        impl<'de> Visitor<'de> for TierVisitor {
            type Value = TierConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a candidate { model, provider?, weight? } or a list of them")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<TierConfig, A::Error> {
                let one = CandidateConfig::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(TierConfig(vec![one]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<TierConfig, A::Error> {
                let many = Vec::<CandidateConfig>::deserialize(
                    de::value::SeqAccessDeserializer::new(seq),
                )?;
                Ok(TierConfig(many))
            }
        }
        deserializer.deserialize_any(TierVisitor)
    }
}

/// `resilience.keyBreaker` / `providerBreaker` as written: every field optional, defaults from
/// `ResilienceConfig::default` (per breaker).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BreakerFileConfig {
    pub failure_threshold: Option<u32>,
    pub cooldown_ms: Option<u64>,
    pub max_cooldown_ms: Option<u64>,
}

/// `resilience.backoff` as written: every field optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackoffFileConfig {
    pub base_ms: Option<u64>,
    pub factor: Option<f64>,
    pub max_ms: Option<u64>,
}

/// `resilience` as written; [`FileConfig::resolve`] lays it over the defaults once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResilienceFileConfig {
    pub key_breaker: Option<BreakerFileConfig>,
    pub provider_breaker: Option<BreakerFileConfig>,
    pub backoff: Option<BackoffFileConfig>,
    /// Absent or `null`: until the secret changes.
    pub auth_disable_ms: Option<u64>,
    pub rate_limit_cooldown_ms: Option<u64>,
    pub quota_blacklist_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SelectionConfig {
    pub latency_tolerance: f64,
    pub latency_slack_ms: u64,
    pub ewma_alpha: f64,
    pub low_headroom: u64,
}

impl Default for SelectionConfig {
    fn default() -> Self {
        Self {
            latency_tolerance: defaults::LATENCY_TOLERANCE,
            latency_slack_ms: defaults::LATENCY_SLACK_MS,
            ewma_alpha: defaults::EWMA_ALPHA,
            low_headroom: defaults::LOW_HEADROOM,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TelemetryConfig {
    pub include_content: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MountedKeyConfig {
    pub label: String,
    pub env: Option<String>,
    pub file: Option<PathBuf>,
    #[serde(default)]
    pub profiles: Vec<String>,
    #[serde(default)]
    pub models: Vec<String>,
    pub owner: Option<String>,
    pub allow_fallback: Option<bool>,
    pub quota: Option<QuotaConfig>,
    pub enabled: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuotaConfig {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub cost_per_day: Option<f64>,
    pub cost_per_month: Option<f64>,
}
