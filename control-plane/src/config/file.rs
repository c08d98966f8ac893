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
    /// How long `serve` waits at start for a shared store that does not answer.
    #[serde(default)]
    pub store_start_wait_ms: Option<u64>,
    #[serde(default)]
    pub mounted_keys: Vec<MountedKeyConfig>,
    #[serde(default)]
    pub budgets: Vec<crate::config::budgets::BudgetPolicyConfig>,
    /// Fill the `cost` of every model that has none from the bundled price table.
    #[serde(default)]
    pub auto_price: Option<bool>,
    /// Rules on request metadata that choose a call's profile.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// The exact-match response cache of each Envoy process.
    #[serde(default)]
    pub cache: Option<crate::config::cache::CacheConfig>,
    /// How long the quota ledger holds a figure a provider gave.
    #[serde(default)]
    pub ledger: Option<crate::config::ledger::LedgerConfig>,
}

/// A `routes:` rule as written.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteConfig {
    pub name: String,
    pub priority: Option<i32>,
    pub enabled: Option<bool>,
    #[serde(default, rename = "match")]
    pub matches: RouteMatchConfig,
    pub target: RouteTargetConfig,
}

/// What a rule matches: every field it sets must equal the request's metadata.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteMatchConfig {
    pub task_type: Option<String>,
    pub user_tier: Option<String>,
    pub feature: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTargetConfig {
    pub profile: String,
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
    /// A first attempt to a plain-HTTP provider goes straight from the public listener.
    pub one_pass: Option<bool>,
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
    /// Mutual TLS on the sync channel (`serve --tls-cert --tls-key --client-ca` win).
    pub sync_tls: Option<SyncTlsConfig>,
}

/// `controlPlane.syncTls`: paths, relative to the config file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SyncTlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
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
    /// Redis (`rediss://`) and Postgres (`sslmode=verify-full`): the CA file the server's
    /// certificate must chain to, instead of the system's CAs.
    #[serde(rename = "caFile")]
    pub ca_file: Option<PathBuf>,
}

/// The kinds and what each brings (base URL, auth header, embeddings, `keysFromEnv` prefix)
/// are the contract's: one enum the wire, the mock and the docs iterate.
pub use ai_router_contract::kinds::{ProviderKind, CLOUDFLARE_BASE_URL};

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
    /// Off the price table's prices for this provider's models (0.2: 20% off), with `autoPrice`.
    pub discount: Option<f64>,
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    pub keys_from_env: Option<String>,
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// What the provider allows per window, over the seed table's row for its kind (the quota
    /// ledger, `ledger::limits`).
    pub limits: Option<LimitsConfig>,
    /// Overrides of what the kind table says of the provider's terms.
    pub terms: Option<TermsConfig>,
    /// Cloudflare: the account whose Workers AI endpoint is the base URL.
    pub account_id: Option<String>,
    /// Overrides the kind's per-request caps (`config::facts`).
    pub per_request_caps: Option<PerRequestCapsConfig>,
    /// Overrides the zone the kind's daily quotas reset in; `rolling` for none.
    pub daily_reset_timezone: Option<String>,
    /// Overrides what the kind's rate-limit headers count over.
    pub rate_limit_headers: Option<RateLimitHeadersConfig>,
    /// List each key's models from the provider's catalog (`GET {baseUrl}/models`).
    pub discover: Option<bool>,
    /// How long a listed catalog is trusted (default 24 h); only with `discover: true`.
    pub discovery_ttl_ms: Option<u64>,
}

/// `providers[].perRequestCaps`: tokens one request may send and ask for; 0 lifts a cap.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PerRequestCapsConfig {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

/// `providers[].rateLimitHeaders`: `minute` or `day` for `x-ratelimit-*-requests` and `-tokens`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimitHeadersConfig {
    pub requests: Option<String>,
    pub tokens: Option<String>,
}

/// A provider's terms, each field overriding the kind table's (`control-plane/data/terms.yaml`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TermsConfig {
    pub production_allowed: Option<bool>,
    pub trains_on_prompts: Option<bool>,
    pub blocked_regions: Option<Vec<String>>,
    pub keyless: Option<bool>,
}

/// A provider's limits per window; each one set wins over the bundled seed table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitsConfig {
    pub rpm: Option<u64>,
    pub rpd: Option<u64>,
    pub tpm: Option<u64>,
    pub tpd: Option<u64>,
    pub tokens_per_month: Option<u64>,
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
    /// The billing scope the key spends (an organization, project or account id): keys that
    /// name the same scope share one budget in the quota ledger. Absent: its own.
    pub scope: Option<String>,
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
    /// The canonical family (the bundled table's name or a new one); absent: the table's
    /// family of this id, else a family of its own.
    pub family: Option<String>,
    /// The family's quality rank (1 best), over the table's.
    pub family_rank: Option<u32>,
    /// Off the price table's price of this model (wins over the provider's), with `autoPrice`.
    pub discount: Option<f64>,
}

impl ModelConfig {
    /// A model configured by its id alone: every other setting at its default.
    pub fn with_id(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            aliases: Vec::new(),
            context_window: None,
            cost: None,
            capabilities: None,
            weight: None,
            identity: None,
            dimensions: None,
            family: None,
            family_rank: None,
            discount: None,
        }
    }

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
#[serde(rename_all = "camelCase")]
pub struct CostConfig {
    pub input: f64,
    pub output: f64,
    /// The price of prompt tokens the provider served from its cache (default: `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
}

impl CostConfig {
    /// These prices as the one price rule reads them (the filter prices the same usage by it).
    pub fn price(&self) -> ai_router_contract::price::Price {
        ai_router_contract::price::Price {
            input: self.input,
            output: self.output,
            cached_input: self.cached_input,
        }
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
    pub prompt_cache: Option<crate::config::prompt_cache::PromptCacheConfig>,
    /// Candidates cheapest first by this request's estimated cost.
    pub auto_sort: Option<bool>,
    /// After a failover, how often the cheaper lane that failed is tried again.
    pub reset_interval_ms: Option<u64>,
    /// The response cache for this policy's calls (with the pool's `cache:`).
    pub cache: Option<bool>,
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
    /// Tried only after an attempt that failed with one of these.
    pub when: Option<Vec<TriggerConfig>>,
}

/// A `when` trigger, as `when` lists spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerConfig {
    Timeout,
    RateLimit,
    ProviderError,
    BudgetExceeded,
    Quota,
    Auth,
}

impl From<TriggerConfig> for ai_router_proto::v1::FallbackTrigger {
    fn from(trigger: TriggerConfig) -> Self {
        match trigger {
            TriggerConfig::Timeout => Self::Timeout,
            TriggerConfig::RateLimit => Self::RateLimit,
            TriggerConfig::ProviderError => Self::ProviderError,
            TriggerConfig::BudgetExceeded => Self::BudgetExceeded,
            TriggerConfig::Quota => Self::Quota,
            TriggerConfig::Auth => Self::Auth,
        }
    }
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

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SelectionConfig {
    pub latency_tolerance: f64,
    pub latency_slack_ms: u64,
    pub ewma_alpha: f64,
    pub low_headroom: u64,
    /// How the usable lanes of the best rank share calls.
    pub strategy: SelectionStrategy,
    /// The weights of `score`'s rpm, tpm and rpd terms.
    pub score: ScoreConfig,
    /// `headroom`: what a lane without reported remaining requests weighs.
    pub unreported_weight: f64,
    /// `production` drops providers whose terms forbid production use.
    pub mode: SelectionMode,
    /// An ISO 3166 country code: providers unavailable there are dropped.
    pub region: Option<String>,
    /// `false` drops providers whose free tier may train on prompts.
    pub allow_prompt_logging: bool,
    /// Keyless providers take part only when this is true.
    pub keyless_fallback: bool,
    pub affinity: AffinityConfig,
}

impl Default for SelectionConfig {
    fn default() -> Self {
        Self {
            latency_tolerance: defaults::LATENCY_TOLERANCE,
            latency_slack_ms: defaults::LATENCY_SLACK_MS,
            ewma_alpha: defaults::EWMA_ALPHA,
            low_headroom: defaults::LOW_HEADROOM,
            strategy: SelectionStrategy::default(),
            score: ScoreConfig::default(),
            unreported_weight: defaults::UNREPORTED_WEIGHT,
            mode: SelectionMode::default(),
            region: None,
            allow_prompt_logging: true,
            keyless_fallback: false,
            affinity: AffinityConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SelectionStrategy {
    /// The tiers in order, smooth weighted round-robin within a tier.
    #[default]
    Tiers,
    /// Weighted random by remaining requests.
    Headroom,
    /// The highest weight W = H·S·(α·rpm + β·tpm + γ·rpd)/(1+C) first.
    Score,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SelectionMode {
    #[default]
    Development,
    Production,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScoreConfig {
    pub alpha: f64,
    pub beta: f64,
    pub gamma: f64,
}

impl Default for ScoreConfig {
    fn default() -> Self {
        Self {
            alpha: defaults::SCORE_ALPHA,
            beta: defaults::SCORE_BETA,
            gamma: defaults::SCORE_GAMMA,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct AffinityConfig {
    pub enabled: bool,
    pub idle_ms: u64,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            idle_ms: defaults::AFFINITY_IDLE_MS,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TelemetryConfig {
    pub include_content: bool,
    /// OpenTelemetry traces over OTLP/gRPC; off when absent.
    pub otlp: Option<OtlpConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OtlpConfig {
    /// The collector's OTLP/gRPC address: `http://host:4317`.
    pub endpoint: String,
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
    /// The response cache for this key's calls; set, it wins over the policy's `cache`.
    pub cache: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuotaConfig {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub cost_per_day: Option<f64>,
    pub cost_per_month: Option<f64>,
}
