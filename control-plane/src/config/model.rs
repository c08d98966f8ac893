//! The resolved config the rest of the control plane works from: the spec's defaults
//! (`ai_router_contract::defaults`) applied once, every reference checked, `keysFromEnv`
//! expanded, the providers without a key dropped and the policies cut to the models that
//! remain. An `Option` left here means something: no limit (budgets, quotas, concurrency),
//! until the secret changes (`auth_disable_ms`), a policy field a profile inherits from
//! `defaults` (the filter merges the layers).
//!
//! Models and policy layers keep the file's types (`ModelConfig`, `PolicyConfig`): what the
//! snapshot pushes of them is built in `engine` (`provider_to_proto`, `policy_to_proto`), which
//! still reads a model's and a candidate's `weight` and a profile's `pinned` with their default.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use ai_router_contract::defaults;

use crate::config::file::{
    BudgetConfig, CostConfig, LimitsConfig, ModelConfig, PolicyConfig, ProviderKind, QuotaConfig,
    RouteConfig, SelectionConfig,
};
use crate::config::secrets::SecretSource;

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
    pub state_store: StoreSpec,
    /// `storeStartWaitMs`: how long `serve` waits at start for a shared store (Postgres keys,
    /// Redis state) that does not answer, and for another control plane's migration.
    pub store_start_wait: std::time::Duration,
    pub mounted_keys: Vec<MountedKey>,
    /// `budgets:`, checked (`config::budgets`).
    pub budgets: Vec<crate::config::budgets::BudgetPolicy>,
    /// Every profile and model name the file declares: what a virtual key may be bound to.
    pub names: PoolNames,
    /// `telemetry.otlp.endpoint`: where traces go; `None`: no traces.
    pub otlp_endpoint: Option<String>,
    /// `telemetry.includeContent`: attempt events carry the request and the answer.
    pub include_content: bool,
    /// What resolution dropped or cut, for the log.
    pub warnings: Vec<String>,
    /// The `routes:` rules whose profile is left in the pool.
    pub routes: Vec<RouteConfig>,
    pub auto_price: bool,
    /// `cache:`, checked; `None`: no response cache.
    pub cache: Option<crate::config::cache::ResponseCache>,
    /// `ledger:`, checked: how long providers' figures stand in the quota ledger.
    pub ledger: crate::config::ledger::AnchorLifetimes,
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
            .unwrap_or(defaults::MAX_ATTEMPTS);
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
    /// `gateway.onePass`: a call's first attempt, when it goes to a plain-HTTP provider whose
    /// host Envoy resolved at start, leaves from the public listener (the attempt stage runs as
    /// the route's upstream filter); its retries go through the attempt listener as before.
    /// The plain-HTTP providers' `(host, port)`, every provider of the file (a key may come
    /// later); `None`: off.
    pub one_pass: Option<Vec<(String, u16)>>,
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
            request_headers_timeout_ms: defaults::REQUEST_HEADERS_TIMEOUT_MS,
            request_timeout_ms: defaults::REQUEST_TIMEOUT_MS,
            connection_idle_timeout_ms: defaults::CONNECTION_IDLE_TIMEOUT_MS,
            max_concurrent_requests: defaults::MAX_CONCURRENT_REQUESTS,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ControlPlane {
    pub host: String,
    pub http_port: u16,
    pub grpc_port: u16,
    pub sync_token: Option<SecretSource>,
    /// `controlPlane.syncTls`, anchored at the config file's folder.
    pub sync_tls: Option<crate::tls::SyncTlsFiles>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    Memory,
    Sqlite(PathBuf),
    /// `stateStore: { type: redis, url, caFile }`: every key under `namespace`
    /// (`storeNamespace`); `ca_file` with a `rediss://` URL.
    Redis {
        url: SecretSource,
        namespace: String,
        ca_file: Option<PathBuf>,
    },
    /// `gateway.keyStore: { type: postgres, url, caFile }`; `ca_file` for the URL's `sslmode`.
    Postgres {
        url: SecretSource,
        ca_file: Option<PathBuf>,
    },
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
    /// `discount` off the price table's prices, with `autoPrice`.
    pub discount: Option<f64>,
    pub keys: Vec<KeyRef>,
    pub models: Vec<ModelConfig>,
    pub limits: Option<LimitsConfig>,
    /// Overrides of the kind table's terms (`config::catalog::terms_of`).
    pub terms: Option<crate::config::file::TermsConfig>,
    /// Where each model's `cost` came from, by model id.
    pub price_sources: BTreeMap<String, crate::config::prices::PriceSource>,
    /// The kind's facts with the config's overrides.
    pub facts: crate::config::facts::ProviderFacts,
    /// `discover: true`: each key's catalog is listed (`discovery`); `None`: off.
    pub discover: Option<Discovery>,
}

/// A provider's model discovery settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Discovery {
    /// `discoveryTtlMs`: a listed catalog is listed again after this long.
    pub ttl_ms: u64,
}

impl Provider {
    pub fn serves(&self, name: &str) -> bool {
        self.models.iter().any(|m| m.answers_to(name))
    }

    /// The price of `model` (an id or alias) on this provider: the configured model's `cost`
    /// (`autoPrice` already filled it), else, for a model only a catalog names (`discover:
    /// true`) with `auto_price`, the price table's less the provider's `discount`.
    pub fn cost_of(&self, model: &str, auto_price: bool) -> Option<CostConfig> {
        match self.models.iter().find(|m| m.answers_to(model)) {
            Some(configured) => configured.cost,
            None if auto_price && self.discover.is_some() => {
                crate::config::prices::table_cost(model, self.discount)
            }
            None => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeyRef {
    pub alias: String,
    pub source: SecretSource,
    pub weight: f64,
    pub max_concurrency: Option<u32>,
    /// The billing scope (`scope:`); `None`: the key is its own.
    pub scope: Option<String>,
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
    /// `cache`: the response cache for this key's calls (unset: the policy decides).
    pub cache: Option<bool>,
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

impl ResilienceConfig {
    /// The windows of the failures' holds, as the filter reads them from the snapshot.
    pub fn hold_windows(&self) -> ai_router_contract::failure::HoldWindows {
        ai_router_contract::failure::HoldWindows {
            rate_limit_cooldown_ms: self.rate_limit_cooldown_ms,
            quota_blacklist_ms: self.quota_blacklist_ms,
            auth_disable_ms: self.auth_disable_ms,
        }
    }
}

impl Default for ResilienceConfig {
    fn default() -> Self {
        Self {
            key_breaker: BreakerConfig {
                failure_threshold: defaults::KEY_BREAKER_FAILURE_THRESHOLD,
                cooldown_ms: defaults::KEY_BREAKER_COOLDOWN_MS,
                max_cooldown_ms: defaults::KEY_BREAKER_MAX_COOLDOWN_MS,
            },
            provider_breaker: BreakerConfig {
                failure_threshold: defaults::PROVIDER_BREAKER_FAILURE_THRESHOLD,
                cooldown_ms: defaults::PROVIDER_BREAKER_COOLDOWN_MS,
                max_cooldown_ms: defaults::PROVIDER_BREAKER_MAX_COOLDOWN_MS,
            },
            backoff: BackoffConfig {
                base_ms: defaults::BACKOFF_BASE_MS,
                factor: defaults::BACKOFF_FACTOR,
                max_ms: defaults::BACKOFF_MAX_MS,
            },
            auth_disable_ms: None,
            rate_limit_cooldown_ms: defaults::RATE_LIMIT_COOLDOWN_MS,
            quota_blacklist_ms: defaults::QUOTA_BLACKLIST_MS,
        }
    }
}
