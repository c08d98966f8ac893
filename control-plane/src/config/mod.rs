//! The config file: YAML, or JSON when the name ends in `.json`.
//!
//! Loading is three steps, each of which names the offending field on failure:
//! 1. a walk over the untyped document refuses literal secrets (`apiKey`, `token`, an
//!    `authorization` header, ...) before anything else looks at it;
//! 2. typed deserialization with `deny_unknown_fields` everywhere (the YAML deserializer tracks
//!    the path; JSON is parsed by it too, JSON being YAML);
//! 3. [`FileConfig::resolve`] checks what types cannot (references between sections, kinds,
//!    URLs), expands `keysFromEnv` against an injectable [`Env`], drops providers that have no
//!    key and cuts the policies down to the models that remain.
//!
//! Secrets stay references ([`SecretSource`]); the engine resolves them.

pub mod secrets;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::config::secrets::{split_key_list, Env, SecretSource};

/// 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;
/// A policy's `maxAttempts` when none sets it.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 4;
/// `gateway.requestHeadersTimeoutMs`: a client's request headers arrive within this.
pub const DEFAULT_REQUEST_HEADERS_TIMEOUT_MS: u64 = 10_000;
/// `gateway.requestTimeoutMs`: a client's whole request (headers and body) arrives within this.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 60_000;
/// `gateway.connectionIdleTimeoutMs`: a client connection with no request open is closed after
/// this.
pub const DEFAULT_CONNECTION_IDLE_TIMEOUT_MS: u64 = 300_000;
/// `gateway.maxConcurrentRequests`: calls in flight through one Envoy.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: u32 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The message names the field (`providers[1].keys[0].apiKey: ...`).
    #[error("{0}")]
    Invalid(String),
}

fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(message.into())
}

// ---------------------------------------------------------------------------------------------
// The file, as written.
// ---------------------------------------------------------------------------------------------

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

impl GatewayConfig {
    fn listener_limits(&self) -> Result<ListenerLimits, ConfigError> {
        let at_least = |field: &str, value: u64, min: u64| {
            if value < min {
                Err(invalid(format!("gateway.{field}: must be at least {min}")))
            } else {
                Ok(value)
            }
        };
        let defaults = ListenerLimits::default();
        let limits = ListenerLimits {
            request_headers_timeout_ms: at_least(
                "requestHeadersTimeoutMs",
                self.request_headers_timeout_ms
                    .unwrap_or(defaults.request_headers_timeout_ms),
                1,
            )?,
            request_timeout_ms: at_least(
                "requestTimeoutMs",
                self.request_timeout_ms
                    .unwrap_or(defaults.request_timeout_ms),
                1,
            )?,
            connection_idle_timeout_ms: at_least(
                "connectionIdleTimeoutMs",
                self.connection_idle_timeout_ms
                    .unwrap_or(defaults.connection_idle_timeout_ms),
                1,
            )?,
            max_concurrent_requests: self
                .max_concurrent_requests
                .unwrap_or(defaults.max_concurrent_requests),
        };
        if limits.max_concurrent_requests == 0 {
            return Err(invalid("gateway.maxConcurrentRequests: must be at least 1"));
        }
        if limits.request_timeout_ms < limits.request_headers_timeout_ms {
            return Err(invalid(format!(
                "gateway.requestTimeoutMs: {} is shorter than gateway.requestHeadersTimeoutMs ({}); the request timeout covers the headers too",
                limits.request_timeout_ms, limits.request_headers_timeout_ms
            )));
        }
        Ok(limits)
    }
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
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    #[serde(rename = "type")]
    pub kind: StoreType,
    pub path: Option<PathBuf>,
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

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Openrouter => "openrouter",
            Self::Qwen => "qwen",
            Self::Deepseek => "deepseek",
            Self::Openai => "openai",
            Self::Gemini => "gemini",
            Self::Groq => "groq",
            Self::OpenaiCompatible => "openai-compatible",
        }
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

impl Capability {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Streaming => "streaming",
            Self::Tools => "tools",
            Self::Json => "json",
            Self::Embeddings => "embeddings",
        }
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
/// [`ResilienceConfig::default`] (per breaker).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BreakerFileConfig {
    pub failure_threshold: Option<u32>,
    pub cooldown_ms: Option<u64>,
    pub max_cooldown_ms: Option<u64>,
}

impl BreakerFileConfig {
    fn over(self, default: BreakerConfig) -> BreakerConfig {
        BreakerConfig {
            failure_threshold: self.failure_threshold.unwrap_or(default.failure_threshold),
            cooldown_ms: self.cooldown_ms.unwrap_or(default.cooldown_ms),
            max_cooldown_ms: self.max_cooldown_ms.unwrap_or(default.max_cooldown_ms),
        }
    }
}

/// `resilience.backoff` as written: every field optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackoffFileConfig {
    pub base_ms: Option<u64>,
    pub factor: Option<f64>,
    pub max_ms: Option<u64>,
}

impl BackoffFileConfig {
    fn over(self, default: BackoffConfig) -> BackoffConfig {
        BackoffConfig {
            base_ms: self.base_ms.unwrap_or(default.base_ms),
            factor: self.factor.unwrap_or(default.factor),
            max_ms: self.max_ms.unwrap_or(default.max_ms),
        }
    }
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

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    pub failure_threshold: u32,
    pub cooldown_ms: u64,
    pub max_cooldown_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffConfig {
    pub base_ms: u64,
    pub factor: f64,
    pub max_ms: u64,
}

/// The resolved resilience settings: the spec's defaults with the file's fields laid over them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResilienceConfig {
    pub key_breaker: BreakerConfig,
    pub provider_breaker: BreakerConfig,
    pub backoff: BackoffConfig,
    /// `None`: until the secret changes.
    pub auth_disable_ms: Option<u64>,
    pub rate_limit_cooldown_ms: u64,
    pub quota_blacklist_ms: u64,
}

impl Default for ResilienceConfig {
    fn default() -> Self {
        Self {
            key_breaker: BreakerConfig {
                failure_threshold: 3,
                cooldown_ms: 15_000,
                max_cooldown_ms: 300_000,
            },
            provider_breaker: BreakerConfig {
                failure_threshold: 8,
                cooldown_ms: 30_000,
                max_cooldown_ms: 300_000,
            },
            backoff: BackoffConfig {
                base_ms: 100,
                factor: 2.0,
                max_ms: 5_000,
            },
            auth_disable_ms: None,
            rate_limit_cooldown_ms: 10_000,
            quota_blacklist_ms: 21_600_000,
        }
    }
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
            latency_tolerance: 1.5,
            latency_slack_ms: 50,
            ewma_alpha: 0.3,
            low_headroom: 1,
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

// ---------------------------------------------------------------------------------------------
// The resolved config the rest of the control plane works from.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Config {
    /// The directory relative paths are taken from.
    pub base_dir: PathBuf,
    pub gateway: Gateway,
    pub control_plane: ControlPlane,
    /// The providers that have at least one key.
    pub providers: Vec<Provider>,
    pub defaults: Option<PolicyConfig>,
    pub profiles: BTreeMap<String, PolicyConfig>,
    pub resilience: ResilienceConfig,
    pub selection: SelectionConfig,
    pub telemetry: TelemetryConfig,
    pub state_store: StoreSpec,
    pub store_namespace: String,
    pub mounted_keys: Vec<MountedKey>,
    /// Every profile and model name the file declares: what a virtual key may be bound to.
    pub names: PoolNames,
    /// What resolution dropped or cut, for the log.
    pub warnings: Vec<String>,
}

/// The profile names and the model ids and aliases the file declares, whatever the environment
/// holds now (a provider whose key is missing today still names its models).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolNames {
    pub profiles: BTreeSet<String>,
    pub models: BTreeSet<String>,
}

impl Config {
    /// The largest `maxAttempts` over the defaults and the profiles (4 when none sets one).
    pub fn max_attempts(&self) -> u32 {
        // A call on the defaults alone (a direct model call) gets their value or 4.
        let defaults = self
            .defaults
            .as_ref()
            .and_then(|d| d.max_attempts)
            .unwrap_or(DEFAULT_MAX_ATTEMPTS);
        self.profiles
            .values()
            .filter_map(|p| p.max_attempts)
            .fold(defaults, u32::max)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gateway {
    pub host: String,
    /// Set explicitly by `host`; `up` keeps its own default otherwise.
    pub host_explicit: bool,
    pub port: u16,
    pub admin_token: Option<SecretSource>,
    pub key_store: StoreSpec,
    pub max_body_bytes: u64,
    /// Providers' `x-ratelimit-*`, `anthropic-ratelimit-*` and `retry-after` reach clients.
    pub forward_rate_limit_headers: bool,
    /// Envoy's public listener: the bounds on what a client may hold open.
    pub limits: ListenerLimits,
}

/// The public listener's bounds against slow or stalled clients, and the concurrency Envoy's
/// circuit breakers are sized for. Defaults applied and checked once, at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// From the first byte of a request to the end of its headers.
    pub request_headers_timeout_ms: u64,
    /// From the first byte of a request to the end of its body (not the response).
    pub request_timeout_ms: u64,
    /// A client connection with no request in flight.
    pub connection_idle_timeout_ms: u64,
    /// Calls in flight through one Envoy: every cluster's breakers allow this many connections,
    /// requests and retries.
    pub max_concurrent_requests: u32,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self {
            request_headers_timeout_ms: DEFAULT_REQUEST_HEADERS_TIMEOUT_MS,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            connection_idle_timeout_ms: DEFAULT_CONNECTION_IDLE_TIMEOUT_MS,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ControlPlane {
    pub host: String,
    pub http_port: u16,
    pub grpc_port: u16,
    pub sync_token: Option<SecretSource>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    Memory,
    Sqlite(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http` or `https`.
    pub scheme: String,
    /// `host[:port]`.
    pub authority: String,
    /// The path the API hangs from, without a trailing slash (`/v1`, or empty).
    pub base_path: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub id: String,
    pub kind: ProviderKind,
    pub base_url: String,
    /// Where `base_url` came from, for messages: `providers[0].baseUrl`, `OPENAI_BASE_URL` or
    /// `the openai default`.
    pub base_url_from: String,
    pub endpoint: Endpoint,
    pub headers: Vec<(String, String)>,
    pub weight: f64,
    pub max_concurrency: Option<u32>,
    pub default_max_tokens: u32,
    pub budget: Option<BudgetConfig>,
    pub keys: Vec<KeyRef>,
    pub models: Vec<ModelConfig>,
}

impl Provider {
    pub fn serves(&self, name: &str) -> bool {
        self.models.iter().any(|m| m.answers_to(name))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeyRef {
    pub alias: String,
    pub source: SecretSource,
    pub weight: f64,
    pub max_concurrency: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MountedKey {
    pub label: String,
    pub source: SecretSource,
    pub profiles: Vec<String>,
    pub models: Vec<String>,
    pub owner: Option<String>,
    pub allow_fallback: bool,
    pub quota: Option<QuotaConfig>,
    pub enabled: bool,
}

// ---------------------------------------------------------------------------------------------
// Loading.
// ---------------------------------------------------------------------------------------------

/// Reads, parses and resolves the file at `path`.
pub fn load(path: &Path, env: &dyn Env) -> Result<Config, ConfigError> {
    resolve_at(&read(path)?, env, path)
}

/// Resolves `file`, read from `path`; errors name the file.
pub fn resolve_at(file: &FileConfig, env: &dyn Env, path: &Path) -> Result<Config, ConfigError> {
    file.resolve(env, &base_dir_of(path)).map_err(|e| match e {
        ConfigError::Invalid(message) => {
            ConfigError::Invalid(format!("config {}: {message}", path.display()))
        }
        other => other,
    })
}

/// Reads and parses the file at `path` without resolving it (`up` edits the pool first).
pub fn read(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text).map_err(|e| match e {
        ConfigError::Invalid(message) => {
            ConfigError::Invalid(format!("config {}: {message}", path.display()))
        }
        other => other,
    })
}

/// The directory relative paths in the file at `path` are taken from.
pub fn base_dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Parses a document (YAML; JSON is YAML too). Literal secrets are refused first, then unknown
/// fields and wrong types.
pub fn parse(text: &str) -> Result<FileConfig, ConfigError> {
    let untyped: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| invalid(tidy_serde_message(&e.to_string())))?;
    refuse_literal_secrets(&untyped)?;
    if untyped.is_null() {
        return Ok(FileConfig::default());
    }
    serde_yaml_ng::from_str(text).map_err(|e| invalid(tidy_serde_message(&e.to_string())))
}

/// Rewrites serde's `path: unknown field `x`, expected ...` into `path.x: unknown field; ...`
/// so that every message starts with the full path of the field.
fn tidy_serde_message(message: &str) -> String {
    let (path, rest) = match message.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') => (Some(path), rest),
        _ => (None, message),
    };
    if let Some(after) = rest.strip_prefix("unknown field `") {
        if let Some((field, tail)) = after.split_once('`') {
            let full = match path {
                Some(path) => format!("{path}.{field}"),
                None => field.to_owned(),
            };
            let tail = tail.trim_start_matches(',').trim();
            return if tail.is_empty() {
                format!("{full}: unknown field")
            } else {
                format!("{full}: unknown field; {tail}")
            };
        }
    }
    message.to_owned()
}

/// Field names that would hold a secret's value.
const SECRET_FIELDS: &[&str] = &[
    "apikey",
    "api_key",
    "api-key",
    "key",
    "secret",
    "secretkey",
    "value",
    "token",
    "accesstoken",
    "access_token",
    "password",
    "bearer",
];

/// Provider headers that would carry a secret.
const AUTH_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "api-key",
    "proxy-authorization",
];

const LITERAL_SECRET: &str = "literal secrets are not allowed; use { env: NAME } or { file: path }";

fn refuse_literal_secrets(root: &serde_yaml_ng::Value) -> Result<(), ConfigError> {
    use serde_yaml_ng::Value;
    fn walk(value: &Value, path: &str, under_headers: bool) -> Result<(), ConfigError> {
        match value {
            Value::Mapping(map) => {
                for (k, v) in map {
                    let Some(name) = k.as_str() else { continue };
                    let child = if path.is_empty() {
                        name.to_owned()
                    } else {
                        format!("{path}.{name}")
                    };
                    let lower = name.to_ascii_lowercase();
                    if under_headers {
                        if AUTH_HEADERS.contains(&lower.as_str()) {
                            return Err(invalid(format!(
                                "{child}: a provider header cannot carry a secret; the auth \
                                 header comes from the provider's keys ({LITERAL_SECRET})"
                            )));
                        }
                        continue;
                    }
                    if SECRET_FIELDS.contains(&lower.as_str()) {
                        return Err(invalid(format!("{child}: {LITERAL_SECRET}")));
                    }
                    let is_reference = matches!(name, "adminToken" | "syncToken");
                    if is_reference && (v.is_string() || v.is_number()) {
                        return Err(invalid(format!("{child}: {LITERAL_SECRET}")));
                    }
                    walk(v, &child, name == "headers")?;
                }
                Ok(())
            }
            Value::Sequence(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}[{i}]"), false)?;
                }
                Ok(())
            }
            Value::Tagged(tagged) => walk(&tagged.value, path, under_headers),
            _ => Ok(()),
        }
    }
    walk(root, "", false)
}

fn secret_ref(
    path: &str,
    env: Option<&String>,
    file: Option<&PathBuf>,
    base_dir: &Path,
) -> Result<SecretSource, ConfigError> {
    match (env, file) {
        (Some(name), None) if !name.trim().is_empty() => {
            Ok(SecretSource::Env(name.trim().to_owned()))
        }
        (None, Some(file)) if !file.as_os_str().is_empty() => {
            Ok(SecretSource::File(relative_to(base_dir, file)))
        }
        (Some(_), Some(_)) => Err(invalid(format!(
            "{path}: give either env or file, not both"
        ))),
        _ => Err(invalid(format!(
            "{path}: a secret reference needs {{ env: NAME }} or {{ file: path }}"
        ))),
    }
}

fn relative_to(base_dir: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base_dir.join(path)
    }
}

fn store_spec(
    path: &str,
    store: Option<&StoreConfig>,
    base_dir: &Path,
) -> Result<StoreSpec, ConfigError> {
    match store {
        None => Ok(StoreSpec::Memory),
        Some(StoreConfig {
            kind: StoreType::Memory,
            path: None,
        }) => Ok(StoreSpec::Memory),
        Some(StoreConfig {
            kind: StoreType::Memory,
            path: Some(_),
        }) => Err(invalid(format!("{path}.path: a memory store has no path"))),
        Some(StoreConfig {
            kind: StoreType::Sqlite,
            path: Some(file),
        }) if !file.as_os_str().is_empty() => Ok(StoreSpec::Sqlite(relative_to(base_dir, file))),
        Some(StoreConfig {
            kind: StoreType::Sqlite,
            ..
        }) => Err(invalid(format!("{path}.path: a sqlite store needs a path"))),
    }
}

/// Splits a base URL into scheme, authority and base path.
pub fn parse_base_url(url: &str) -> Result<Endpoint, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("`{url}` is not an absolute http(s) URL"))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(format!("`{url}`: the scheme must be http or https"));
    }
    if rest.contains(['?', '#']) {
        return Err(format!("`{url}`: a base URL has no query or fragment"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') || authority.contains(char::is_whitespace) {
        return Err(format!("`{url}`: the host is missing or invalid"));
    }
    Ok(Endpoint {
        scheme,
        authority: authority.to_owned(),
        base_path: path.trim_end_matches('/').to_owned(),
    })
}

fn check_weight(path: &str, weight: Option<f64>) -> Result<f64, ConfigError> {
    let weight = weight.unwrap_or(1.0);
    if !weight.is_finite() || weight <= 0.0 {
        return Err(invalid(format!("{path}: must be a positive number")));
    }
    Ok(weight)
}

fn check_concurrency(path: &str, value: Option<u32>) -> Result<Option<u32>, ConfigError> {
    match value {
        Some(0) => Err(invalid(format!("{path}: must be at least 1"))),
        other => Ok(other),
    }
}

fn check_cost(path: &str, value: Option<f64>) -> Result<(), ConfigError> {
    match value {
        Some(v) if !v.is_finite() || v < 0.0 => {
            Err(invalid(format!("{path}: must be a non-negative number")))
        }
        _ => Ok(()),
    }
}

/// `<PREFIX>_API_KEY`, `<PREFIX>_API_KEY_<n>` (gaps allowed), their `_FILE` twins, then the
/// items of `<PREFIX>_API_KEYS`, aliased `<alias_base>-<n>`. Only variables that are set
/// (non-empty) make a key.
pub fn keys_from_env(prefix: &str, alias_base: &str, env: &dyn Env) -> Vec<KeyRef> {
    let set = |name: &str| env.var(name).is_some_and(|v| !v.trim().is_empty());
    let single = format!("{prefix}_API_KEY");
    let mut numbered: BTreeMap<u64, (String, String)> = BTreeMap::new();
    if set(&single) || set(&format!("{single}_FILE")) {
        numbered.insert(1, (single.clone(), format!("{single}_FILE")));
    }
    let numbered_prefix = format!("{single}_");
    for name in env.names() {
        let Some(rest) = name.strip_prefix(&numbered_prefix) else {
            continue;
        };
        let digits = rest.strip_suffix("_FILE").unwrap_or(rest);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(n) = digits.parse::<u64>() else {
            continue;
        };
        if n == 0 || !set(&name) {
            continue;
        }
        let var = format!("{single}_{digits}");
        numbered
            .entry(n)
            .or_insert_with(|| (var.clone(), format!("{var}_FILE")));
    }
    let mut keys: Vec<KeyRef> = numbered
        .iter()
        .map(|(n, (var, file_var))| KeyRef {
            alias: format!("{alias_base}-{n}"),
            source: SecretSource::EnvOrFileEnv {
                var: var.clone(),
                file_var: file_var.clone(),
            },
            weight: 1.0,
            max_concurrency: None,
        })
        .collect();
    let list_var = format!("{prefix}_API_KEYS");
    if let Some(list) = env.var(&list_var) {
        let mut next = numbered.keys().next_back().copied().unwrap_or(0);
        for index in 0..split_key_list(&list).len() {
            next += 1;
            keys.push(KeyRef {
                alias: format!("{alias_base}-{next}"),
                source: SecretSource::EnvListItem {
                    var: list_var.clone(),
                    index,
                },
                weight: 1.0,
                max_concurrency: None,
            });
        }
    }
    keys
}

const PROFILE_WILDCARD: &str = "*";

fn is_label(label: &str) -> bool {
    !label.is_empty()
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl FileConfig {
    /// Validates, expands `keysFromEnv` against `env`, drops providers without a key and cuts
    /// the policies down to what remains. `base_dir` anchors relative paths.
    pub fn resolve(&self, env: &dyn Env, base_dir: &Path) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        let gateway = self.resolve_gateway(base_dir)?;
        let control_plane = self.resolve_control_plane(base_dir)?;

        // Providers, all of them first: references are checked against the whole file, so a
        // typo is refused whatever the environment holds.
        let mut all = Vec::with_capacity(self.providers.len());
        let mut ids = BTreeSet::new();
        for (i, raw) in self.providers.iter().enumerate() {
            let provider = resolve_provider(&format!("providers[{i}]"), raw, env, base_dir)?;
            if !ids.insert(provider.id.clone()) {
                return Err(invalid(format!(
                    "providers[{i}].id: `{}` is given twice",
                    provider.id
                )));
            }
            all.push(provider);
        }
        let all_names: BTreeSet<&str> = all
            .iter()
            .flat_map(|p| p.models.iter())
            .flat_map(|m| {
                std::iter::once(m.id.as_str()).chain(m.aliases.iter().map(String::as_str))
            })
            .collect();
        if let Some(defaults) = &self.defaults {
            check_policy("defaults", defaults, &all, &all_names, false)?;
        }
        for (name, profile) in &self.profiles {
            if name.is_empty() {
                return Err(invalid("profiles: a profile name cannot be empty"));
            }
            check_policy(&format!("profiles.{name}"), profile, &all, &all_names, true)?;
        }

        let mounted_keys = self.resolve_mounted_keys(base_dir, &all_names)?;
        let names = PoolNames {
            profiles: self.profiles.keys().cloned().collect(),
            models: all_names.iter().map(|n| (*n).to_owned()).collect(),
        };

        // Drop the providers no key of which resolves now.
        let mut providers = Vec::with_capacity(all.len());
        for provider in all {
            if provider
                .keys
                .iter()
                .any(|k| k.source.resolve(env).is_some())
            {
                providers.push(provider);
            } else {
                warnings.push(format!(
                    "provider {} has no key in the environment; it is left out",
                    provider.id
                ));
            }
        }
        // A provider on the gateway's own listener would have every call call itself (the
        // quick start's OPENAI_BASE_URL, exported for the app, read back as the pool's). A
        // provider without a key is never called, so only the kept ones are checked.
        for provider in &providers {
            refuse_own_listener(provider, &gateway)?;
        }
        let served: BTreeSet<String> = providers
            .iter()
            .flat_map(|p| p.models.iter())
            .flat_map(|m| std::iter::once(m.id.clone()).chain(m.aliases.iter().cloned()))
            .collect();
        let kept: BTreeSet<&str> = providers.iter().map(|p| p.id.as_str()).collect();

        let defaults = self
            .defaults
            .as_ref()
            .map(|d| cut_policy(d, &served, &kept).0);
        let mut profiles = BTreeMap::new();
        for (name, profile) in &self.profiles {
            match cut_policy(profile, &served, &kept) {
                (cut, false) => {
                    profiles.insert(name.clone(), cut);
                }
                (_, true) => warnings.push(format!(
                    "profile {name} has no model left in the pool; it is left out"
                )),
            }
        }

        // Accepted and ignored would be worse than refused: an operator who sets these expects
        // them to act.
        if self.telemetry.include_content {
            return Err(invalid(
                "telemetry.includeContent: true is not supported by this version: the gateway records no prompt or answer anywhere; remove the field or set it to false",
            ));
        }
        if self.store_namespace.is_some() {
            return Err(invalid(
                "storeNamespace: not supported by this version: it names the keys of a store shared between gateways, and the memory and sqlite stores are never shared that way; remove the field",
            ));
        }
        Ok(Config {
            base_dir: base_dir.to_path_buf(),
            gateway,
            control_plane,
            providers,
            defaults,
            profiles,
            resilience: self.resolve_resilience()?,
            selection: self.resolve_selection()?,
            telemetry: self.telemetry,
            state_store: store_spec("stateStore", self.state_store.as_ref(), base_dir)?,
            store_namespace: self
                .store_namespace
                .clone()
                .unwrap_or_else(|| "ai-router".to_owned()),
            mounted_keys,
            names,
            warnings,
        })
    }

    fn resolve_gateway(&self, base_dir: &Path) -> Result<Gateway, ConfigError> {
        let g = &self.gateway;
        let port =
            match (g.port, g.app_port) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        "gateway.appPort: cannot be combined with gateway.port",
                    ))
                }
                (_, None) if g.port_offset.is_some() => return Err(invalid(
                    "gateway.portOffset: only applies with gateway.appPort (the gateway listens \
                     on appPort + portOffset); set gateway.appPort, or remove portOffset and set \
                     gateway.port",
                )),
                (Some(port), None) => port,
                (None, Some(app)) => {
                    let offset = g.port_offset.unwrap_or(1);
                    if offset == 0 {
                        return Err(invalid("gateway.portOffset: must be at least 1"));
                    }
                    app.checked_add(offset).ok_or_else(|| {
                        invalid("gateway.portOffset: appPort + portOffset is past 65535")
                    })?
                }
                (None, None) => 8080,
            };
        let max_body_bytes = g.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes == 0 {
            return Err(invalid("gateway.maxBodyBytes: must be at least 1"));
        }
        let admin_token = g
            .admin_token
            .as_ref()
            .map(|r| {
                secret_ref(
                    "gateway.adminToken",
                    r.env.as_ref(),
                    r.file.as_ref(),
                    base_dir,
                )
            })
            .transpose()?;
        let limits = g.listener_limits()?;
        Ok(Gateway {
            host: non_empty_host("gateway.host", g.host.as_deref())?,
            host_explicit: g.host.is_some(),
            port,
            admin_token,
            key_store: store_spec("gateway.keyStore", g.key_store.as_ref(), base_dir)?,
            max_body_bytes,
            forward_rate_limit_headers: g.forward_rate_limit_headers.unwrap_or(false),
            limits,
        })
    }

    fn resolve_control_plane(&self, base_dir: &Path) -> Result<ControlPlane, ConfigError> {
        let c = &self.control_plane;
        let sync_token = c
            .sync_token
            .as_ref()
            .map(|r| {
                secret_ref(
                    "controlPlane.syncToken",
                    r.env.as_ref(),
                    r.file.as_ref(),
                    base_dir,
                )
            })
            .transpose()?;
        Ok(ControlPlane {
            host: non_empty_host("controlPlane.host", c.host.as_deref())?,
            http_port: c.http_port.unwrap_or(8081),
            grpc_port: c.grpc_port.unwrap_or(8082),
            sync_token,
        })
    }

    fn resolve_mounted_keys(
        &self,
        base_dir: &Path,
        model_names: &BTreeSet<&str>,
    ) -> Result<Vec<MountedKey>, ConfigError> {
        let mut labels = BTreeSet::new();
        let mut keys = Vec::new();
        for (i, raw) in self.mounted_keys.iter().enumerate() {
            let path = format!("mountedKeys[{i}]");
            if !is_label(&raw.label) {
                return Err(invalid(format!(
                    "{path}.label: `{}` must be lowercase letters, digits and _",
                    raw.label
                )));
            }
            if !labels.insert(raw.label.clone()) {
                return Err(invalid(format!(
                    "{path}.label: `{}` is given twice",
                    raw.label
                )));
            }
            if raw.profiles.is_empty() && raw.models.is_empty() {
                return Err(invalid(format!(
                    "{path}: bind at least one profile or model (profiles: [\"*\"] for all)"
                )));
            }
            for (j, profile) in raw.profiles.iter().enumerate() {
                if profile != PROFILE_WILDCARD && !self.profiles.contains_key(profile) {
                    return Err(invalid(format!(
                        "{path}.profiles[{j}]: unknown profile `{profile}`"
                    )));
                }
            }
            for (j, model) in raw.models.iter().enumerate() {
                if model != PROFILE_WILDCARD && !model_names.contains(model.as_str()) {
                    return Err(invalid(format!(
                        "{path}.models[{j}]: unknown model `{model}` (no provider serves it by id or alias; \"*\" for every model)"
                    )));
                }
            }
            let source = secret_ref(&path, raw.env.as_ref(), raw.file.as_ref(), base_dir)?;
            keys.push(MountedKey {
                label: raw.label.clone(),
                source,
                profiles: raw.profiles.clone(),
                models: raw.models.clone(),
                owner: raw.owner.clone(),
                allow_fallback: raw.allow_fallback.unwrap_or(true),
                quota: raw.quota,
                enabled: raw.enabled.unwrap_or(true),
            });
        }
        Ok(keys)
    }

    fn resolve_resilience(&self) -> Result<ResilienceConfig, ConfigError> {
        let raw = self.resilience;
        let defaults = ResilienceConfig::default();
        let r = ResilienceConfig {
            key_breaker: raw
                .key_breaker
                .unwrap_or_default()
                .over(defaults.key_breaker),
            provider_breaker: raw
                .provider_breaker
                .unwrap_or_default()
                .over(defaults.provider_breaker),
            backoff: raw.backoff.unwrap_or_default().over(defaults.backoff),
            auth_disable_ms: raw.auth_disable_ms.or(defaults.auth_disable_ms),
            rate_limit_cooldown_ms: raw
                .rate_limit_cooldown_ms
                .unwrap_or(defaults.rate_limit_cooldown_ms),
            quota_blacklist_ms: raw
                .quota_blacklist_ms
                .unwrap_or(defaults.quota_blacklist_ms),
        };
        for (name, b) in [
            ("keyBreaker", r.key_breaker),
            ("providerBreaker", r.provider_breaker),
        ] {
            if b.failure_threshold == 0 {
                return Err(invalid(format!(
                    "resilience.{name}.failureThreshold: must be at least 1"
                )));
            }
            if b.max_cooldown_ms < b.cooldown_ms {
                return Err(invalid(format!(
                    "resilience.{name}.maxCooldownMs: must be at least cooldownMs"
                )));
            }
        }
        if !r.backoff.factor.is_finite() || r.backoff.factor < 1.0 {
            return Err(invalid("resilience.backoff.factor: must be at least 1"));
        }
        Ok(r)
    }

    fn resolve_selection(&self) -> Result<SelectionConfig, ConfigError> {
        let s = self.selection;
        if !s.latency_tolerance.is_finite() || s.latency_tolerance < 1.0 {
            return Err(invalid("selection.latencyTolerance: must be at least 1"));
        }
        if !(s.ewma_alpha > 0.0 && s.ewma_alpha <= 1.0) {
            return Err(invalid("selection.ewmaAlpha: must be in (0, 1]"));
        }
        Ok(s)
    }
}

/// Refuses a provider whose base URL is the gateway's own public listener on this machine (a
/// loopback or unspecified address, `localhost`, or `gateway.host`, with `gateway.port`).
fn refuse_own_listener(provider: &Provider, gateway: &Gateway) -> Result<(), ConfigError> {
    if gateway.port == 0 {
        // Picked at bind time: nothing to compare with.
        return Ok(());
    }
    let authority = provider.endpoint.authority.to_ascii_lowercase();
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, port.parse::<u16>().ok()),
        _ => (authority.as_str(), None),
    };
    let port = port.unwrap_or(if provider.endpoint.scheme == "https" {
        443
    } else {
        80
    });
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let local = host == "localhost"
        || host == gateway.host.to_ascii_lowercase()
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified());
    if !local || port != gateway.port {
        return Ok(());
    }
    Err(invalid(format!(
        "provider {}: its base URL {} (from {}) is the gateway's own listener (port {}): every \
         call would go back into the gateway. Point {} at the provider's API, not at the gateway",
        provider.id,
        provider.base_url,
        provider.base_url_from,
        gateway.port,
        provider.base_url_from
    )))
}

fn non_empty_host(path: &str, host: Option<&str>) -> Result<String, ConfigError> {
    match host {
        None => Ok("127.0.0.1".to_owned()),
        Some(h) if !h.trim().is_empty() && !h.contains(char::is_whitespace) => Ok(h.to_owned()),
        Some(_) => Err(invalid(format!("{path}: must be a host name or an IP"))),
    }
}

fn resolve_provider(
    path: &str,
    raw: &ProviderConfig,
    env: &dyn Env,
    base_dir: &Path,
) -> Result<Provider, ConfigError> {
    let kind = raw.kind.unwrap_or(ProviderKind::OpenaiCompatible);
    let id = raw.id.clone().unwrap_or_else(|| kind.as_str().to_owned());
    if id.is_empty() || id.contains('/') || id.contains(char::is_whitespace) {
        return Err(invalid(format!(
            "{path}.id: `{id}` must be a non-empty name without / or spaces"
        )));
    }
    let prefix = match &raw.keys_from_env {
        Some(prefix) => {
            let ok = !prefix.is_empty()
                && prefix
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            if !ok {
                return Err(invalid(format!(
                    "{path}.keysFromEnv: `{prefix}` must be an env prefix such as OPENAI"
                )));
            }
            Some(prefix.as_str())
        }
        None => None,
    };
    let env_base_url = prefix
        .map(|p| format!("{p}_BASE_URL"))
        .and_then(|var| Some(var.clone()).zip(env.var(&var)))
        .filter(|(_, v)| !v.trim().is_empty());
    let (base_url, base_url_from) = match (&raw.base_url, env_base_url, kind.default_base_url()) {
        (Some(url), _, _) => (url.clone(), format!("{path}.baseUrl")),
        (None, Some((var, url)), _) => (url, var),
        (None, None, Some(url)) => (url.to_owned(), format!("the {} default", kind.as_str())),
        (None, None, None) => {
            return Err(invalid(format!(
                "{path}.baseUrl: required for kind openai-compatible"
            )))
        }
    };
    let endpoint =
        parse_base_url(base_url.trim()).map_err(|e| invalid(format!("{path}.baseUrl: {e}")))?;

    let mut headers = Vec::new();
    for (name, value) in &raw.headers {
        let lower = name.to_ascii_lowercase();
        if AUTH_HEADERS.contains(&lower.as_str()) {
            return Err(invalid(format!(
                "{path}.headers.{name}: a provider header cannot carry a secret; the auth header \
                 comes from the provider's keys"
            )));
        }
        if lower.is_empty()
            || !lower
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(invalid(format!(
                "{path}.headers.{name}: not a valid header name"
            )));
        }
        headers.push((lower, value.clone()));
    }

    let weight = check_weight(&format!("{path}.weight"), raw.weight)?;
    let max_concurrency =
        check_concurrency(&format!("{path}.maxConcurrency"), raw.max_concurrency)?;
    if raw.default_max_tokens == Some(0) {
        return Err(invalid(format!(
            "{path}.defaultMaxTokens: must be at least 1"
        )));
    }
    if let Some(budget) = &raw.budget {
        check_cost(&format!("{path}.budget.costPerDay"), budget.cost_per_day)?;
        check_cost(
            &format!("{path}.budget.costPerMonth"),
            budget.cost_per_month,
        )?;
    }

    // Keys: the explicit ones, then those keysFromEnv finds.
    let mut keys = Vec::new();
    for (j, key) in raw.keys.iter().enumerate() {
        let kpath = format!("{path}.keys[{j}]");
        if key.alias.is_empty() {
            return Err(invalid(format!("{kpath}.alias: must not be empty")));
        }
        keys.push(KeyRef {
            alias: key.alias.clone(),
            source: secret_ref(&kpath, key.env.as_ref(), key.file.as_ref(), base_dir)?,
            weight: check_weight(&format!("{kpath}.weight"), key.weight)?,
            max_concurrency: check_concurrency(
                &format!("{kpath}.maxConcurrency"),
                key.max_concurrency,
            )?,
        });
    }
    if raw.keys.is_empty() && prefix.is_none() {
        return Err(invalid(format!("{path}: needs keys or keysFromEnv")));
    }
    if let Some(prefix) = prefix {
        let alias_base = if kind == ProviderKind::OpenaiCompatible {
            id.as_str()
        } else {
            kind.as_str()
        };
        for key in keys_from_env(prefix, alias_base, env) {
            if !keys.iter().any(|k: &KeyRef| k.alias == key.alias) {
                keys.push(key);
            }
        }
    }
    let mut aliases = BTreeSet::new();
    for (j, key) in keys.iter().enumerate() {
        if !aliases.insert(key.alias.as_str()) {
            return Err(invalid(format!(
                "{path}.keys[{j}].alias: `{}` is given twice",
                key.alias
            )));
        }
    }

    if raw.models.is_empty() {
        return Err(invalid(format!("{path}.models: needs at least one model")));
    }
    let mut model_ids = BTreeSet::new();
    for (j, model) in raw.models.iter().enumerate() {
        let mpath = format!("{path}.models[{j}]");
        if model.id.trim().is_empty() {
            return Err(invalid(format!("{mpath}.id: must not be empty")));
        }
        if !model_ids.insert(model.id.as_str()) {
            return Err(invalid(format!(
                "{mpath}.id: `{}` is given twice",
                model.id
            )));
        }
        if model.aliases.iter().any(|a| a.trim().is_empty()) {
            return Err(invalid(format!(
                "{mpath}.aliases: an alias must not be empty"
            )));
        }
        check_weight(&format!("{mpath}.weight"), model.weight)?;
        if let Some(cost) = model.cost {
            check_cost(&format!("{mpath}.cost.input"), Some(cost.input))?;
            check_cost(&format!("{mpath}.cost.output"), Some(cost.output))?;
        }
        if model.context_window == Some(0) {
            return Err(invalid(format!(
                "{mpath}.contextWindow: must be at least 1"
            )));
        }
        let capabilities = model.capabilities();
        if capabilities.is_empty() {
            return Err(invalid(format!("{mpath}.capabilities: must not be empty")));
        }
        if capabilities.contains(&Capability::Embeddings) && !kind.supports_embeddings() {
            return Err(invalid(format!(
                "{mpath}.capabilities: {} has no embeddings API",
                kind.as_str()
            )));
        }
        if model.dimensions == Some(0) {
            return Err(invalid(format!("{mpath}.dimensions: must be at least 1")));
        }
    }

    Ok(Provider {
        id,
        kind,
        base_url,
        base_url_from,
        endpoint,
        headers,
        weight,
        max_concurrency,
        default_max_tokens: raw.default_max_tokens.unwrap_or(4096),
        budget: raw.budget.clone(),
        keys,
        models: raw.models.clone(),
    })
}

/// A budget is checked against a request's worst case: every prompt token plus `max_tokens`
/// of output, or the whole context window when the request sets no `max_tokens`. A priced
/// model the policy may reach without a `contextWindow` has no worst case: refused at load,
/// rather than counting an unknown output as free.
fn check_cost_is_bounded(
    path: &str,
    policy: &PolicyConfig,
    providers: &[Provider],
) -> Result<(), ConfigError> {
    let named: Vec<&str> = policy
        .model
        .iter()
        .chain(policy.fallbacks.iter().flatten())
        .map(String::as_str)
        .chain(
            policy
                .candidates
                .iter()
                .flatten()
                .flat_map(|tier| tier.0.iter().map(|c| c.model.as_str())),
        )
        .collect();
    // A policy that names no model (the defaults) applies to any model called directly.
    let reaches = |m: &ModelConfig| named.is_empty() || named.iter().any(|n| m.answers_to(n));
    for provider in providers {
        for model in provider.models.iter().filter(|m| reaches(m)) {
            if model.cost.is_some() && model.context_window.is_none() {
                return Err(invalid(format!(
                    "{path}.budget.maxCost: model `{}` of provider `{}` has a cost but no contextWindow, so the cost of a request without max_tokens has no bound; give the model a contextWindow",
                    model.id, provider.id
                )));
            }
        }
    }
    Ok(())
}

fn check_policy(
    path: &str,
    policy: &PolicyConfig,
    providers: &[Provider],
    names: &BTreeSet<&str>,
    is_profile: bool,
) -> Result<(), ConfigError> {
    let known = |field: String, name: &str| -> Result<(), ConfigError> {
        if names.contains(name) {
            Ok(())
        } else {
            Err(invalid(format!(
                "{field}: unknown model `{name}` (no provider serves it)"
            )))
        }
    };
    if let Some(model) = &policy.model {
        known(format!("{path}.model"), model)?;
    }
    for (i, fallback) in policy.fallbacks.iter().flatten().enumerate() {
        known(format!("{path}.fallbacks[{i}]"), fallback)?;
    }
    if policy.max_attempts == Some(0) {
        return Err(invalid(format!("{path}.maxAttempts: must be at least 1")));
    }
    if policy.timeout_ms == Some(0) {
        return Err(invalid(format!("{path}.timeoutMs: must be at least 1")));
    }
    if policy.deadline_ms == Some(0) {
        return Err(invalid(format!("{path}.deadlineMs: must be at least 1")));
    }
    if let Some(budget) = policy.budget {
        check_cost(&format!("{path}.budget.maxCost"), budget.max_cost)?;
        if budget.max_cost.is_some() {
            check_cost_is_bounded(path, policy, providers)?;
        }
    }
    for (i, id) in policy.providers.iter().flatten().enumerate() {
        if !providers.iter().any(|p| &p.id == id) {
            return Err(invalid(format!(
                "{path}.providers[{i}]: unknown provider `{id}`"
            )));
        }
    }
    if let Some(tiers) = &policy.candidates {
        if policy.model.is_some() || policy.fallbacks.is_some() {
            return Err(invalid(format!(
                "{path}.candidates: takes the place of model and fallbacks; give one or the other"
            )));
        }
        if tiers.is_empty() {
            return Err(invalid(format!(
                "{path}.candidates: needs at least one tier"
            )));
        }
        for (t, tier) in tiers.iter().enumerate() {
            if tier.0.is_empty() {
                return Err(invalid(format!("{path}.candidates[{t}]: an empty tier")));
            }
            for (c, candidate) in tier.0.iter().enumerate() {
                let cpath = if tier.0.len() == 1 {
                    format!("{path}.candidates[{t}]")
                } else {
                    format!("{path}.candidates[{t}][{c}]")
                };
                known(format!("{cpath}.model"), &candidate.model)?;
                check_weight(&format!("{cpath}.weight"), candidate.weight)?;
                if let Some(id) = &candidate.provider {
                    let provider = providers.iter().find(|p| &p.id == id).ok_or_else(|| {
                        invalid(format!("{cpath}.provider: unknown provider `{id}`"))
                    })?;
                    if !provider.serves(&candidate.model) {
                        return Err(invalid(format!(
                            "{cpath}.model: provider `{id}` does not serve `{}`",
                            candidate.model
                        )));
                    }
                }
            }
        }
    }
    if policy.pinned == Some(true) {
        if !is_profile {
            return Err(invalid(format!(
                "{path}.pinned: only a profile can be pinned"
            )));
        }
        let Some(tiers) = &policy.candidates else {
            return Err(invalid(format!(
                "{path}.pinned: a pinned profile needs candidates"
            )));
        };
        let mut shapes = BTreeSet::new();
        for candidate in tiers.iter().flat_map(|t| t.0.iter()) {
            for provider in providers {
                if candidate
                    .provider
                    .as_ref()
                    .is_some_and(|id| id != &provider.id)
                {
                    continue;
                }
                for model in provider
                    .models
                    .iter()
                    .filter(|m| m.answers_to(&candidate.model))
                {
                    shapes.insert((model.identity().to_owned(), model.dimensions));
                }
            }
        }
        if shapes.len() > 1 {
            let found: Vec<String> = shapes
                .iter()
                .map(|(identity, dimensions)| match dimensions {
                    Some(d) => format!("{identity} ({d} dimensions)"),
                    None => format!("{identity} (no dimensions)"),
                })
                .collect();
            return Err(invalid(format!(
                "{path}.pinned: the candidates are not one model identity and dimensions: {}",
                found.join(", ")
            )));
        }
    }
    Ok(())
}

/// The policy cut down to the served models and kept providers, and whether it was left with
/// nothing (it named models or providers and none remain).
fn cut_policy(
    policy: &PolicyConfig,
    served: &BTreeSet<String>,
    kept: &BTreeSet<&str>,
) -> (PolicyConfig, bool) {
    let mut cut = policy.clone();
    let named_models = policy.model.is_some()
        || policy.fallbacks.as_ref().is_some_and(|f| !f.is_empty())
        || policy.candidates.is_some();
    cut.fallbacks = policy
        .fallbacks
        .as_ref()
        .map(|f| f.iter().filter(|m| served.contains(*m)).cloned().collect());
    if let Some(model) = &policy.model {
        if !served.contains(model) {
            cut.model = None;
            if policy.allow_fallback != Some(false) {
                // The first fallback left becomes the preferred model.
                if let Some(fallbacks) = cut.fallbacks.as_mut() {
                    if !fallbacks.is_empty() {
                        cut.model = Some(fallbacks.remove(0));
                    }
                }
            }
        }
    }
    cut.providers = policy.providers.as_ref().map(|ids| {
        ids.iter()
            .filter(|id| kept.contains(id.as_str()))
            .cloned()
            .collect()
    });
    if let Some(tiers) = &policy.candidates {
        let left: Vec<TierConfig> = tiers
            .iter()
            .map(|tier| {
                TierConfig(
                    tier.0
                        .iter()
                        .filter(|c| served.contains(&c.model))
                        .filter(|c| {
                            c.provider
                                .as_ref()
                                .is_none_or(|id| kept.contains(id.as_str()))
                        })
                        .cloned()
                        .collect(),
                )
            })
            .filter(|tier| !tier.0.is_empty())
            .collect();
        // allowFallback: false keeps the first tier only; if it is gone, nothing is left.
        let first_gone = tiers
            .first()
            .is_some_and(|first| !first.0.iter().any(|c| left.iter().any(|t| t.0.contains(c))));
        if left.is_empty() || (policy.allow_fallback == Some(false) && first_gone) {
            cut.candidates = None;
        } else {
            cut.candidates = Some(left);
        }
    }
    let lost_providers = cut.providers.as_ref().is_some_and(|p| p.is_empty())
        && policy.providers.as_ref().is_some_and(|p| !p.is_empty());
    let has_models = cut.model.is_some()
        || cut.fallbacks.as_ref().is_some_and(|f| !f.is_empty())
        || cut.candidates.is_some();
    let emptied = lost_providers || (named_models && !has_models);
    (cut, emptied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::secrets::MapEnv;

    fn resolve(text: &str, env: &MapEnv) -> Result<Config, String> {
        parse(text)
            .and_then(|f| f.resolve(env, Path::new("/etc/ai-router")))
            .map_err(|e| e.to_string())
    }

    fn err(text: &str, env: &MapEnv) -> String {
        match resolve(text, env) {
            Ok(_) => String::from("<no error>"),
            Err(e) => e,
        }
    }

    const POOL: &str = include_str!("../../../examples/pool.yaml");

    #[test]
    fn example_pool_with_openai_and_deepseek_keys() -> Result<(), String> {
        let env = MapEnv::new([
            ("OPENAI_API_KEY", "sk-o1"),
            ("OPENAI_API_KEY_3", "sk-o3"),
            ("DEEPSEEK_API_KEYS", "d1, d2"),
        ]);
        let config = resolve(POOL, &env)?;
        let ids: Vec<&str> = config.providers.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["openai", "deepseek"]);
        let openai = &config.providers[0];
        let aliases: Vec<&str> = openai.keys.iter().map(|k| k.alias.as_str()).collect();
        assert_eq!(aliases, ["openai-1", "openai-3"]);
        assert_eq!(openai.endpoint.scheme, "https");
        assert_eq!(openai.endpoint.authority, "api.openai.com");
        assert_eq!(openai.endpoint.base_path, "/v1");
        let deepseek = &config.providers[1];
        let aliases: Vec<&str> = deepseek.keys.iter().map(|k| k.alias.as_str()).collect();
        assert_eq!(aliases, ["deepseek-1", "deepseek-2"]);
        assert_eq!(config.gateway.host, "0.0.0.0");
        assert_eq!(config.gateway.port, 8080);
        assert_eq!(config.control_plane.host, "control-plane");
        assert_eq!(config.control_plane.grpc_port, 8082);
        assert_eq!(config.max_attempts(), 4);
        let raised = POOL.replace("maxAttempts: 3", "maxAttempts: 6");
        assert_eq!(resolve(&raised, &env)?.max_attempts(), 6);
        assert!(config.warnings.iter().any(|w| w.contains("openrouter")));
        Ok(())
    }

    #[test]
    fn profiles_are_cut_to_the_remaining_models() -> Result<(), String> {
        // Only deepseek: `fast` is gone, so lesson falls to its fallback `smart`.
        let env = MapEnv::new([("DEEPSEEK_API_KEY", "d1")]);
        let config = resolve(POOL, &env)?;
        let lesson = &config.profiles["lesson"];
        assert_eq!(lesson.model.as_deref(), Some("smart"));
        assert_eq!(lesson.fallbacks.as_deref(), Some(&[][..]));
        assert_eq!(config.profiles["grading"].model.as_deref(), Some("smart"));
        // Only openrouter: `smart` is gone; grading pins it, so grading is dropped.
        let env = MapEnv::new([("OPENROUTER_API_KEY", "o1")]);
        let config = resolve(POOL, &env)?;
        assert!(!config.profiles.contains_key("grading"));
        assert_eq!(config.profiles["lesson"].model.as_deref(), Some("fast"));
        assert!(config
            .warnings
            .iter()
            .any(|w| w.contains("profile grading")));
        assert_eq!(
            config.defaults.as_ref().and_then(|d| d.fallbacks.clone()),
            Some(vec![])
        );
        Ok(())
    }

    #[test]
    fn no_keys_leaves_no_providers() -> Result<(), String> {
        let config = resolve(POOL, &MapEnv::default())?;
        assert!(config.providers.is_empty());
        assert!(config.profiles.is_empty());
        Ok(())
    }

    #[test]
    fn keys_from_env_numbering_files_and_lists() {
        let env = MapEnv::new([
            ("P_API_KEY", "a"),
            ("P_API_KEY_2_FILE", "/run/secrets/p2"),
            ("P_API_KEY_10", "c"),
            ("P_API_KEY_X", "ignored"),
            ("P_API_KEY_0", "ignored"),
            ("P_API_KEY_4", ""),
            ("P_API_KEYS", "l1,l2 l3"),
            ("PX_API_KEY", "other prefix"),
        ]);
        let keys = keys_from_env("P", "groq", &env);
        let aliases: Vec<&str> = keys.iter().map(|k| k.alias.as_str()).collect();
        assert_eq!(
            aliases,
            ["groq-1", "groq-2", "groq-10", "groq-11", "groq-12", "groq-13"]
        );
        assert_eq!(
            keys[1].source,
            SecretSource::EnvOrFileEnv {
                var: "P_API_KEY_2".into(),
                file_var: "P_API_KEY_2_FILE".into()
            }
        );
        assert_eq!(
            keys[5].source,
            SecretSource::EnvListItem {
                var: "P_API_KEYS".into(),
                index: 2
            }
        );
        assert_eq!(
            keys[3].source.resolve(&env).map(|s| s.expose().to_owned()),
            Some("l1".into())
        );
    }

    #[test]
    fn openai_compatible_needs_a_base_url_and_uses_its_id_for_aliases() -> Result<(), String> {
        let text = "providers:\n  - { id: local, keysFromEnv: LOCAL, models: [{ id: llama }] }\n";
        assert_eq!(
            err(text, &MapEnv::new([("LOCAL_API_KEY", "k")])),
            "providers[0].baseUrl: required for kind openai-compatible"
        );
        let env = MapEnv::new([
            ("LOCAL_API_KEY", "k"),
            ("LOCAL_BASE_URL", "http://127.0.0.1:11434/v1/"),
        ]);
        let config = resolve(text, &env)?;
        let p = &config.providers[0];
        assert_eq!(p.kind, ProviderKind::OpenaiCompatible);
        assert_eq!(p.keys[0].alias, "local-1");
        assert_eq!(p.endpoint.scheme, "http");
        assert_eq!(p.endpoint.authority, "127.0.0.1:11434");
        assert_eq!(p.endpoint.base_path, "/v1");
        assert_eq!(p.kind.auth_header(), "authorization");
        Ok(())
    }

    #[test]
    fn literal_secrets_are_refused_naming_the_field() {
        let env = MapEnv::default();
        let text = "providers:\n  - id: a\n    keys: [{ alias: x, env: A }]\n    models: [{ id: m }]\n  - id: b\n    keys: [{ alias: y, apiKey: sk-live-123 }]\n    models: [{ id: m }]\n";
        let message = err(text, &env);
        assert_eq!(
            message,
            "providers[1].keys[0].apiKey: literal secrets are not allowed; use { env: NAME } or { file: path }"
        );
        assert!(!message.contains("sk-live-123"));
        let text = "providers:\n  - id: a\n    headers: { Authorization: Bearer sk-1 }\n    keys: [{ alias: x, env: A }]\n    models: [{ id: m }]\n";
        let message = err(text, &env);
        assert!(
            message.starts_with(
                "providers[0].headers.Authorization: a provider header cannot carry a secret"
            ),
            "{message}"
        );
        assert!(!message.contains("sk-1"));
        for header in ["x-api-key", "api-key", "proxy-authorization"] {
            let text = format!("providers:\n  - id: a\n    headers: {{ {header}: s }}\n    keys: [{{ alias: x, env: A }}]\n    models: [{{ id: m }}]\n");
            assert!(err(&text, &env).starts_with(&format!("providers[0].headers.{header}:")));
        }
        let text = "gateway: { adminToken: hunter2 }\n";
        assert_eq!(
            err(text, &env),
            "gateway.adminToken: literal secrets are not allowed; use { env: NAME } or { file: path }"
        );
        let text = "controlPlane: { syncToken: { value: abc } }\n";
        assert!(err(text, &env).starts_with("controlPlane.syncToken.value: literal secrets"));
        let text = "mountedKeys: [{ label: app, secret: sk-starci-app-xxx, profiles: ['*'] }]\n";
        assert!(err(text, &env).starts_with("mountedKeys[0].secret: literal secrets"));
        for field in ["key", "token", "password", "value", "secret"] {
            let text = format!("providers:\n  - id: a\n    keys: [{{ alias: x, {field}: s }}]\n    models: [{{ id: m }}]\n");
            assert!(err(&text, &env)
                .starts_with(&format!("providers[0].keys[0].{field}: literal secrets")));
        }
    }

    #[test]
    fn unknown_fields_are_refused_naming_the_path() {
        let env = MapEnv::default();
        let text = "providers:\n  - id: a\n    keys: [{ alias: x, env: A }]\n    models: [{ id: m, colour: red }]\n";
        let message = err(text, &env);
        assert!(
            message.starts_with("providers[0].models[0].colour: unknown field"),
            "{message}"
        );
        let message = err("gateway: { prot: 1 }\n", &env);
        assert!(
            message.starts_with("gateway.prot: unknown field"),
            "{message}"
        );
        let message = err("colour: red\n", &env);
        assert!(message.starts_with("colour: unknown field"), "{message}");
        let message = err(
            "profiles:\n  work: { candidates: [[{ model: m, colour: x }]] }\n",
            &env,
        );
        assert!(message.contains("colour: unknown field"), "{message}");
        let message = err("resilience: { keyBreaker: { failureThreshold: 1, cooldownMs: 1, maxCooldownMs: 1, extra: 1 } }\n", &env);
        assert!(
            message.starts_with("resilience.keyBreaker.extra: unknown field"),
            "{message}"
        );
    }

    #[test]
    fn a_budget_needs_a_bound_on_the_output() {
        let env = MapEnv::new([("A_API_KEY", "k")]);
        let pool = |window: &str| {
            format!("providers:\n  - id: a\n    keysFromEnv: A\n    baseUrl: http://h/v1\n    models: [{{ id: m, cost: {{ input: 1, output: 1 }}{window} }}]\nprofiles:\n  cheap: {{ model: m, budget: {{ maxCost: 0.01 }} }}\n")
        };
        let message = err(&pool(""), &env);
        assert!(
            message.starts_with("profiles.cheap.budget.maxCost: model `m` of provider `a` has a cost but no contextWindow"),
            "{message}"
        );
        assert!(resolve(&pool(", contextWindow: 8000"), &env).is_ok());
    }

    #[test]
    fn settings_this_version_cannot_honour_are_refused() {
        let env = MapEnv::default();
        let message = err(
            "telemetry: { includeContent: true }
",
            &env,
        );
        assert!(
            message.starts_with("telemetry.includeContent: true is not supported"),
            "{message}"
        );
        let message = err(
            "storeNamespace: team-a
",
            &env,
        );
        assert!(
            message.starts_with("storeNamespace: not supported"),
            "{message}"
        );
    }

    #[test]
    fn kinds_refuse_embeddings_they_do_not_serve() {
        let env = MapEnv::new([("A_API_KEY", "k")]);
        for kind in ["anthropic", "deepseek", "groq"] {
            let text = format!("providers:\n  - {{ kind: {kind}, keysFromEnv: A, models: [{{ id: e, capabilities: [embeddings] }}] }}\n");
            assert_eq!(
                err(&text, &env),
                format!("providers[0].models[0].capabilities: {kind} has no embeddings API")
            );
        }
        let text = "providers:\n  - { kind: openai, keysFromEnv: A, models: [{ id: e, capabilities: [embeddings], dimensions: 1536 }] }\n";
        assert!(resolve(text, &env).is_ok());
    }

    #[test]
    fn kind_defaults() -> Result<(), String> {
        let env = MapEnv::new([("A_API_KEY", "k")]);
        let cases = [
            ("anthropic", "api.anthropic.com", "/v1", "x-api-key"),
            ("openrouter", "openrouter.ai", "/api/v1", "authorization"),
            (
                "qwen",
                "dashscope-intl.aliyuncs.com",
                "/compatible-mode/v1",
                "authorization",
            ),
            (
                "gemini",
                "generativelanguage.googleapis.com",
                "/v1beta/openai",
                "authorization",
            ),
            ("groq", "api.groq.com", "/openai/v1", "authorization"),
            ("deepseek", "api.deepseek.com", "/v1", "authorization"),
        ];
        for (kind, authority, base_path, auth) in cases {
            let text = format!(
                "providers:\n  - {{ kind: {kind}, keysFromEnv: A, models: [{{ id: m }}] }}\n"
            );
            let config = resolve(&text, &env)?;
            let p = &config.providers[0];
            assert_eq!(p.id, kind);
            assert_eq!(p.endpoint.authority, authority);
            assert_eq!(p.endpoint.base_path, base_path);
            assert_eq!(p.kind.auth_header(), auth);
            assert_eq!(p.keys[0].alias, format!("{kind}-1"));
        }
        let message = err(
            "providers:\n  - { kind: mistral, keysFromEnv: A, models: [{ id: m }] }\n",
            &env,
        );
        assert!(
            message.starts_with("providers[0].kind: unknown variant `mistral`"),
            "{message}"
        );
        Ok(())
    }

    #[test]
    fn references_between_sections_are_checked() {
        let env = MapEnv::new([("A", "k")]);
        let base = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: k, env: A }], models: [{ id: m, aliases: [fast] }] }\n";
        let cases = [
            ("profiles:\n  x: { model: nope }\n", "profiles.x.model: unknown model `nope` (no provider serves it)"),
            ("profiles:\n  x: { fallbacks: [fast, nope] }\n", "profiles.x.fallbacks[1]: unknown model `nope` (no provider serves it)"),
            ("defaults: { providers: [q] }\n", "defaults.providers[0]: unknown provider `q`"),
            ("profiles:\n  x: { candidates: [{ model: m, provider: q }] }\n", "profiles.x.candidates[0].provider: unknown provider `q`"),
            ("profiles:\n  x: { candidates: [[{ model: m }, { model: zz }]] }\n", "profiles.x.candidates[0][1].model: unknown model `zz` (no provider serves it)"),
            ("profiles:\n  x: { model: m, candidates: [{ model: m }] }\n", "profiles.x.candidates: takes the place of model and fallbacks; give one or the other"),
            ("profiles:\n  x: { maxAttempts: 0 }\n", "profiles.x.maxAttempts: must be at least 1"),
            ("mountedKeys: [{ label: app, env: K, profiles: [nope] }]\n", "mountedKeys[0].profiles[0]: unknown profile `nope`"),
            ("mountedKeys: [{ label: app, env: K, models: [fast, nope] }]\n", "mountedKeys[0].models[1]: unknown model `nope` (no provider serves it by id or alias; \"*\" for every model)"),
            ("mountedKeys: [{ label: App, env: K, profiles: ['*'] }]\n", "mountedKeys[0].label: `App` must be lowercase letters, digits and _"),
            ("mountedKeys: [{ label: app, profiles: ['*'] }]\n", "mountedKeys[0]: a secret reference needs { env: NAME } or { file: path }"),
            ("gateway: { port: 1, appPort: 3001 }\n", "gateway.appPort: cannot be combined with gateway.port"),
        ];
        for (extra, expected) in cases {
            assert_eq!(err(&format!("{base}{extra}"), &env), expected, "{extra}");
        }
        let dup = "providers:\n  - { id: p, baseUrl: 'http://h', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n  - { id: p, baseUrl: 'http://h', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
        assert_eq!(err(dup, &env), "providers[1].id: `p` is given twice");
        let bad_url = "providers:\n  - { id: p, baseUrl: 'ftp://h', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
        assert!(err(bad_url, &env).starts_with("providers[0].baseUrl: "));
    }

    #[test]
    fn listener_limits_default_once_and_are_checked() -> Result<(), String> {
        let env = MapEnv::new([("A", "k")]);
        let base = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
        let config = resolve(base, &env)?;
        assert_eq!(config.gateway.limits, ListenerLimits::default());
        assert_eq!(config.gateway.limits.request_headers_timeout_ms, 10_000);
        let set = format!("{base}gateway: {{ requestHeadersTimeoutMs: 1000, requestTimeoutMs: 2000, connectionIdleTimeoutMs: 3000, maxConcurrentRequests: 64 }}\n");
        assert_eq!(
            resolve(&set, &env)?.gateway.limits,
            ListenerLimits {
                request_headers_timeout_ms: 1000,
                request_timeout_ms: 2000,
                connection_idle_timeout_ms: 3000,
                max_concurrent_requests: 64,
            }
        );
        let cases = [
            ("gateway: { requestHeadersTimeoutMs: 0 }\n", "gateway.requestHeadersTimeoutMs: must be at least 1"),
            ("gateway: { requestTimeoutMs: 0 }\n", "gateway.requestTimeoutMs: must be at least 1"),
            ("gateway: { connectionIdleTimeoutMs: 0 }\n", "gateway.connectionIdleTimeoutMs: must be at least 1"),
            ("gateway: { maxConcurrentRequests: 0 }\n", "gateway.maxConcurrentRequests: must be at least 1"),
            ("gateway: { requestHeadersTimeoutMs: 5000, requestTimeoutMs: 4000 }\n", "gateway.requestTimeoutMs: 4000 is shorter than gateway.requestHeadersTimeoutMs (5000); the request timeout covers the headers too"),
        ];
        for (extra, expected) in cases {
            assert_eq!(err(&format!("{base}{extra}"), &env), expected, "{extra}");
        }
        Ok(())
    }

    #[test]
    fn partial_resilience_objects_take_the_defaults_per_field() -> Result<(), String> {
        let env = MapEnv::new([("A", "k")]);
        let base = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
        let defaults = ResilienceConfig::default();
        assert_eq!(resolve(base, &env)?.resilience, defaults);
        let partial = format!(
            "{base}resilience:\n  keyBreaker: {{ failureThreshold: 5 }}\n  providerBreaker: {{ cooldownMs: 1000 }}\n  backoff: {{ maxMs: 800 }}\n  rateLimitCooldownMs: 7\n"
        );
        let r = resolve(&partial, &env)?.resilience;
        assert_eq!(
            r.key_breaker,
            BreakerConfig {
                failure_threshold: 5,
                cooldown_ms: 15_000,
                max_cooldown_ms: 300_000,
            }
        );
        assert_eq!(
            r.provider_breaker,
            BreakerConfig {
                failure_threshold: 8,
                cooldown_ms: 1000,
                max_cooldown_ms: 300_000,
            }
        );
        assert_eq!(
            r.backoff,
            BackoffConfig {
                base_ms: 100,
                factor: 2.0,
                max_ms: 800,
            }
        );
        assert_eq!(r.rate_limit_cooldown_ms, 7);
        assert_eq!(r.quota_blacklist_ms, defaults.quota_blacklist_ms);
        assert_eq!(r.auth_disable_ms, None);
        // Checks still run on the merged values.
        let bad = format!("{base}resilience: {{ keyBreaker: {{ maxCooldownMs: 10 }} }}\n");
        assert_eq!(
            err(&bad, &env),
            "resilience.keyBreaker.maxCooldownMs: must be at least cooldownMs"
        );
        Ok(())
    }

    #[test]
    fn a_provider_on_the_gateways_own_listener_is_refused() -> Result<(), String> {
        let openai = "providers:\n  - { id: openai, kind: openai, keysFromEnv: OPENAI, models: [{ id: m }] }\n";
        for url in [
            "http://127.0.0.1:8080/v1",
            "http://localhost:8080/v1",
            "http://0.0.0.0:8080",
            "http://[::1]:8080/v1",
        ] {
            let env = MapEnv::new([("OPENAI_API_KEY", "sk-real"), ("OPENAI_BASE_URL", url)]);
            let message = err(openai, &env);
            assert!(
                message.starts_with("provider openai: its base URL")
                    && message.contains("(from OPENAI_BASE_URL)")
                    && message.contains("gateway's own listener (port 8080)"),
                "{url}: {message}"
            );
            assert!(!message.contains("sk-real"), "{message}");
        }
        // From the file, on a derived port.
        let file = "gateway: { appPort: 3001 }\nproviders:\n  - { id: loop, baseUrl: 'http://127.0.0.1:3002/v1', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
        let env = MapEnv::new([("A", "k")]);
        let message = err(file, &env);
        assert!(
            message.starts_with("provider loop: ")
                && message.contains("(from providers[0].baseUrl)"),
            "{message}"
        );
        // Another port, another host, or a provider without a key (never called) is fine.
        for (url, key) in [
            ("http://127.0.0.1:8081/v1", "sk-real"),
            ("http://10.1.2.3:8080/v1", "sk-real"),
            ("http://127.0.0.1:8080/v1", ""),
        ] {
            let env = MapEnv::new([("OPENAI_API_KEY", key), ("OPENAI_BASE_URL", url)]);
            resolve(openai, &env)?;
        }
        Ok(())
    }

    #[test]
    fn a_port_offset_needs_an_app_port() -> Result<(), String> {
        let env = MapEnv::new([("A", "k")]);
        let base = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
        for gateway in [
            "gateway: { portOffset: 5 }\n",
            "gateway: { port: 9000, portOffset: 5 }\n",
        ] {
            let message = err(&format!("{base}{gateway}"), &env);
            assert!(
                message.starts_with("gateway.portOffset: only applies with gateway.appPort"),
                "{gateway}: {message}"
            );
        }
        let derived = resolve(
            &format!("{base}gateway: {{ appPort: 3001, portOffset: 5 }}\n"),
            &env,
        )?;
        assert_eq!(derived.gateway.port, 3006);
        Ok(())
    }

    #[test]
    fn pinned_profiles_need_one_identity() {
        let env = MapEnv::new([("A", "k")]);
        let base = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: te3, capabilities: [embeddings], dimensions: 1536 }, { id: te3l, capabilities: [embeddings], dimensions: 3072 }] }\n  - { id: r, kind: openrouter, keys: [{ alias: k, env: A }], models: [{ id: openai/te3, identity: te3, capabilities: [embeddings], dimensions: 1536 }] }\n";
        let ok = format!("{base}profiles:\n  embed: {{ pinned: true, candidates: [[{{ provider: o, model: te3 }}, {{ provider: r, model: openai/te3 }}]] }}\n");
        assert!(resolve(&ok, &env).is_ok(), "{}", err(&ok, &env));
        let bad = format!("{base}profiles:\n  embed: {{ pinned: true, candidates: [{{ model: te3 }}, {{ model: te3l }}] }}\n");
        assert_eq!(
            err(&bad, &env),
            "profiles.embed.pinned: the candidates are not one model identity and dimensions: \
             te3 (1536 dimensions), te3l (3072 dimensions)"
        );
        // One identity, two vector lengths.
        let dims = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: te3, capabilities: [embeddings], dimensions: 1536 }] }\n  - { id: r, kind: openrouter, keys: [{ alias: k, env: A }], models: [{ id: openai/te3, identity: te3, capabilities: [embeddings], dimensions: 512 }] }\nprofiles:\n  vec: { pinned: true, candidates: [[{ provider: o, model: te3 }, { provider: r, model: openai/te3 }]] }\n";
        assert_eq!(
            err(dims, &env),
            "profiles.vec.pinned: the candidates are not one model identity and dimensions: \
             te3 (512 dimensions), te3 (1536 dimensions)"
        );
        // Two chat models: the identity defaults to the id.
        let chat = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: a }, { id: b }] }\nprofiles:\n  chat: { pinned: true, candidates: [{ model: a }, { model: b }] }\n";
        assert!(err(chat, &env).starts_with("profiles.chat.pinned: the candidates are not one"));
        // Pinned needs candidates, and only a profile can be pinned.
        let no_candidates = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: a }] }\nprofiles:\n  p: { pinned: true, model: a }\n";
        assert_eq!(
            err(no_candidates, &env),
            "profiles.p.pinned: a pinned profile needs candidates"
        );
        // Refused even when a candidate's provider has no key now (checked against the file).
        let env_o_only = MapEnv::new([("A", "k")]);
        let absent = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: te3, capabilities: [embeddings], dimensions: 1536 }] }\n  - { id: r, kind: openrouter, keys: [{ alias: k, env: NOPE }], models: [{ id: openai/te3, capabilities: [embeddings], dimensions: 1536 }] }\nprofiles:\n  embed: { pinned: true, candidates: [[{ provider: o, model: te3 }, { provider: r, model: openai/te3 }]] }\n";
        assert!(err(absent, &env_o_only).starts_with("profiles.embed.pinned: "));
    }

    #[test]
    fn json_by_extension_and_relative_paths() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("ai-router-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("k"), "sk-file\n")?;
        let path = dir.join("pool.json");
        std::fs::write(
            &path,
            r#"{"gateway":{"appPort":3001},"stateStore":{"type":"sqlite","path":"state.sqlite"},"providers":[{"id":"p","baseUrl":"http://h:1/v1","keys":[{"alias":"k","file":"k"}],"models":[{"id":"m"}]}]}"#,
        )?;
        let config = load(&path, &MapEnv::default())?;
        assert_eq!(config.gateway.port, 3002);
        assert_eq!(
            config.state_store,
            StoreSpec::Sqlite(dir.join("state.sqlite"))
        );
        assert_eq!(
            config.providers[0].keys[0].source,
            SecretSource::File(dir.join("k"))
        );
        std::fs::write(&path, r#"{"providers":[{"id":"p","colour":1}]}"#)?;
        let message = load(&path, &MapEnv::default())
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            matches!(&message, Err(m) if m.contains("providers[0].colour: unknown field")),
            "{message:?}"
        );
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn tiers_take_one_candidate_or_a_list() -> Result<(), String> {
        let f = parse("profiles:\n  w: { candidates: [[{ model: a, weight: 3 }, { model: b }], { model: c, provider: p }] }\n")
            .map_err(|e| e.to_string())?;
        let tiers = f.profiles["w"].candidates.clone().unwrap_or_default();
        assert_eq!(tiers.len(), 2);
        assert_eq!(tiers[0].0.len(), 2);
        assert_eq!(tiers[0].0[0].weight, Some(3.0));
        assert_eq!(tiers[1].0[0].provider.as_deref(), Some("p"));
        Ok(())
    }
}
