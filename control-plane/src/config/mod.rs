//! The config file: YAML, or JSON when the name ends in `.json`.
//!
//! Loading is three steps, each of which names the offending field on failure:
//! 1. a walk over the untyped document refuses literal secrets (`apiKey`, `token`, an
//!    `authorization` header, ...) before anything else looks at it (`load`);
//! 2. typed deserialization with `deny_unknown_fields` everywhere (the YAML deserializer tracks
//!    the path; JSON is parsed by it too, JSON being YAML) into the file's types (`file`);
//! 3. [`FileConfig::resolve`] (`resolve`) applies the spec's defaults once
//!    (`ai_router_contract::defaults`), checks what types cannot (`validate`: references between
//!    sections, kinds, URLs, ranges), expands `keysFromEnv` against an injectable [`Env`](secrets::Env)
//!    (`keys_from_env`), drops providers that have no key and cuts the policies down to the
//!    models that remain, into the resolved model (`model`) the rest of the control plane reads.
//!
//! Secrets stay references ([`SecretSource`](secrets::SecretSource)); the engine resolves them.

pub mod budgets;
pub mod cache;
pub mod catalog;
mod error;
pub mod facts;
mod file;
mod keys_from_env;
pub mod ledger;
mod load;
mod model;
pub mod prices;
pub mod prompt_cache;
mod resolve;
mod routes;
pub mod secrets;
mod validate;

#[cfg(test)]
mod selection_tests;
#[cfg(test)]
mod tests;

pub use error::ConfigError;
pub use file::{
    BackoffFileConfig, BreakerFileConfig, BudgetConfig, CandidateConfig, Capability,
    ControlPlaneConfig, CostConfig, FileConfig, GatewayConfig, KeyConfig, LimitsConfig,
    ModelConfig, MountedKeyConfig, PolicyBudgetConfig, PolicyConfig, ProviderConfig, ProviderKind,
    QuotaConfig, ResilienceFileConfig, RouteConfig, RouteMatchConfig, RouteTargetConfig,
    SecretRefConfig, SelectionConfig, SelectionMode, SelectionStrategy, StoreConfig, StoreType,
    TelemetryConfig, TermsConfig, TierConfig, TriggerConfig, DEFAULT_CAPABILITIES,
};
pub use keys_from_env::{keys_from_env, keys_from_env_prefixes};
pub use load::{base_dir_of, load, parse, read, resolve_at};
pub use model::{
    BackoffConfig, BreakerConfig, Config, ControlPlane, Endpoint, Gateway, KeyRef, ListenerLimits,
    MountedKey, PoolNames, Provider, ResilienceConfig, StoreSpec,
};
pub use resolve::parse_base_url;
