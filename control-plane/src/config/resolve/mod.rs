//! The file resolved into the config the control plane works from
//! ([`FileConfig::resolve`]): defaults applied once, every check of `validate` made,
//! `keysFromEnv` expanded against an injectable [`Env`], providers without a key dropped,
//! policies cut to the models that remain.
//!
//! The files: this one (the pool, the gateway, the policies), `provider` (one provider: its
//! kind, base URL, keys, models, prices, discovery), `policy` (a policy cut to what remains)
//! and `stores` (the key store and the state store).

mod policy;
mod provider;
mod stores;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ai_router_contract::defaults;

use crate::config::error::{invalid, ConfigError};
use crate::config::file::{
    BackoffFileConfig, BreakerFileConfig, FileConfig, GatewayConfig, PolicyConfig, SelectionConfig,
};
use crate::config::model::{
    BackoffConfig, BreakerConfig, Config, ControlPlane, Gateway, ListenerLimits, MountedKey,
    PoolNames, Provider, ResilienceConfig,
};
use crate::config::secrets::Env;
use crate::config::validate::{
    check_listener_limits, check_policy, check_resilience, check_selection, is_label,
    non_empty_host, refuse_own_listener,
};

use policy::*;
use provider::*;
use stores::*;

pub use provider::parse_base_url;

impl FileConfig {
    /// Validates, expands `keysFromEnv` against `env`, drops providers without a key and cuts
    /// the policies down to what remains. `base_dir` anchors relative paths.
    pub fn resolve(&self, env: &dyn Env, base_dir: &Path) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        let gateway = self.resolve_gateway(base_dir)?;
        let control_plane = self.resolve_control_plane(base_dir)?;

        // Providers, all of them first: references are checked against the whole file, so a
        // typo is refused whatever the environment holds.
        let mut all = self.resolve_providers(env, base_dir)?;
        let mut gateway = gateway;
        if let Some(hosts) = gateway.one_pass.as_mut() {
            *hosts = plain_hosts(&all);
        }
        // Prices before the policies' checks: a budget needs priced models.
        apply_prices(&mut all, self.auto_price == Some(true));
        crate::config::routes::check_routes(&self.routes, &self.profiles)?;
        let all_names: BTreeSet<&str> = model_names(&all).collect();
        self.check_policies(&all, &all_names)?;

        let mounted_keys = self.resolve_mounted_keys(base_dir, &all_names)?;
        let names = PoolNames {
            profiles: self.profiles.keys().cloned().collect(),
            models: all_names.iter().map(|n| (*n).to_owned()).collect(),
        };

        let providers = providers_with_a_key(all, env, &mut warnings);
        // A provider on the gateway's own listener would have every call call itself (the
        // quick start's OPENAI_BASE_URL, exported for the app, read back as the pool's). A
        // provider without a key is never called, so only the kept ones are checked.
        for provider in &providers {
            refuse_own_listener(provider, &gateway)?;
        }
        let (defaults, profiles) = self.cut_policies(&providers, &mut warnings);

        self.refuse_cache_without_pool_cache()?;
        let routes = crate::config::routes::kept_routes(&self.routes, &profiles, &mut warnings);
        Ok(Config {
            routes,
            auto_price: self.auto_price == Some(true),
            cache: crate::config::cache::resolve_cache(self.cache.as_ref())?,
            ledger: crate::config::ledger::resolve_ledger(self.ledger.as_ref())?,
            base_dir: base_dir.to_path_buf(),
            gateway,
            control_plane,
            providers,
            defaults,
            profiles,
            resilience: self.resolve_resilience()?,
            selection: self.resolve_selection()?,
            state_store: state_store_spec(self, base_dir)?,
            store_start_wait: store_start_wait(self),
            mounted_keys,
            budgets: crate::config::budgets::resolve_budgets(&self.budgets)?,
            names,
            otlp_endpoint: self.resolve_otlp()?,
            include_content: self.telemetry.include_content,
            warnings,
        })
    }

    /// Every provider of the file resolved, each id once.
    fn resolve_providers(
        &self,
        env: &dyn Env,
        base_dir: &Path,
    ) -> Result<Vec<Provider>, ConfigError> {
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
        Ok(all)
    }

    /// `defaults` and each profile (a name not empty) checked against all the providers.
    fn check_policies(
        &self,
        all: &[Provider],
        all_names: &BTreeSet<&str>,
    ) -> Result<(), ConfigError> {
        if let Some(defaults) = &self.defaults {
            check_policy("defaults", defaults, all, all_names, false)?;
        }
        for (name, profile) in &self.profiles {
            if name.is_empty() {
                return Err(invalid("profiles: a profile name cannot be empty"));
            }
            check_policy(&format!("profiles.{name}"), profile, all, all_names, true)?;
        }
        Ok(())
    }

    /// `defaults` and the profiles cut to the models and providers kept; a profile with no
    /// model left is left out, with a warning.
    fn cut_policies(
        &self,
        providers: &[Provider],
        warnings: &mut Vec<String>,
    ) -> (Option<PolicyConfig>, BTreeMap<String, PolicyConfig>) {
        let served: BTreeSet<String> = model_names(providers).map(str::to_owned).collect();
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
        (defaults, profiles)
    }

    /// A policy's `cache` needs the pool's `cache` section.
    fn refuse_cache_without_pool_cache(&self) -> Result<(), ConfigError> {
        crate::config::cache::refuse_cache_without_pool_cache(
            self.cache.is_some(),
            self.defaults
                .iter()
                .map(|d| ("defaults".to_owned(), d.cache))
                .chain(
                    self.profiles
                        .iter()
                        .map(|(name, p)| (format!("profiles.{name}"), p.cache)),
                ),
        )
    }

    fn resolve_otlp(&self) -> Result<Option<String>, ConfigError> {
        let Some(otlp) = &self.telemetry.otlp else {
            return Ok(None);
        };
        let endpoint = otlp.endpoint.trim();
        let host = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"));
        if host.is_none_or(|h| h.trim_end_matches('/').is_empty()) {
            return Err(invalid(format!(
                "telemetry.otlp.endpoint: {endpoint:?} is not an http:// or https:// URL of an OTLP/gRPC collector (e.g. http://127.0.0.1:4317)"
            )));
        }
        Ok(Some(endpoint.trim_end_matches('/').to_owned()))
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
                    let offset = g.port_offset.unwrap_or(defaults::PORT_OFFSET);
                    if offset == 0 {
                        return Err(invalid("gateway.portOffset: must be at least 1"));
                    }
                    app.checked_add(offset).ok_or_else(|| {
                        invalid("gateway.portOffset: appPort + portOffset is past 65535")
                    })?
                }
                (None, None) => defaults::GATEWAY_PORT,
            };
        let max_body_bytes = g.max_body_bytes.unwrap_or(defaults::MAX_BODY_BYTES);
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
            key_store: key_store_spec(g.key_store.as_ref(), base_dir)?,
            max_body_bytes,
            forward_rate_limit_headers: g
                .forward_rate_limit_headers
                .unwrap_or(defaults::FORWARD_RATE_LIMIT_HEADERS),
            // The hosts are filled in once the providers are resolved.
            one_pass: (g.one_pass == Some(true)).then(Vec::new),
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
            http_port: c.http_port.unwrap_or(defaults::CONTROL_PLANE_HTTP_PORT),
            grpc_port: c.grpc_port.unwrap_or(defaults::CONTROL_PLANE_GRPC_PORT),
            sync_token,
            sync_tls: c.sync_tls.as_ref().map(|t| crate::tls::SyncTlsFiles {
                cert: relative_to(base_dir, &t.cert),
                key: relative_to(base_dir, &t.key),
                client_ca: relative_to(base_dir, &t.client_ca),
            }),
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
                allow_fallback: raw.allow_fallback.unwrap_or(defaults::ALLOW_FALLBACK),
                quota: raw.quota,
                enabled: raw.enabled.unwrap_or(defaults::KEY_ENABLED),
                cache: raw.cache,
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
        check_resilience(&r)?;
        Ok(r)
    }

    fn resolve_selection(&self) -> Result<SelectionConfig, ConfigError> {
        check_selection(&self.selection)?;
        let mut selection = self.selection.clone();
        selection.region = selection.region.map(|r| r.trim().to_ascii_uppercase());
        Ok(selection)
    }
}

/// Every name the providers' models answer to: their ids and aliases.
fn model_names(providers: &[Provider]) -> impl Iterator<Item = &str> {
    providers
        .iter()
        .flat_map(|p| p.models.iter())
        .flat_map(|m| std::iter::once(m.id.as_str()).chain(m.aliases.iter().map(String::as_str)))
}

/// The providers a key of which resolves now; the others are left out, with a warning.
/// The plain-HTTP providers' hosts and ports, each once (`gateway.onePass` has Envoy resolve
/// them at start): a host without a port is on 80.
fn plain_hosts(providers: &[Provider]) -> Vec<(String, u16)> {
    let mut hosts: Vec<(String, u16)> = Vec::new();
    for p in providers.iter().filter(|p| p.endpoint.scheme == "http") {
        let host = ai_router_contract::host_port(&p.endpoint.authority);
        if !hosts.contains(&host) {
            hosts.push(host);
        }
    }
    hosts
}

fn providers_with_a_key(
    all: Vec<Provider>,
    env: &dyn Env,
    warnings: &mut Vec<String>,
) -> Vec<Provider> {
    let mut providers = Vec::with_capacity(all.len());
    for provider in all {
        if provider
            .keys
            .iter()
            .any(|k| k.source.resolve_provider_key(env).is_some())
        {
            providers.push(provider);
        } else {
            warnings.push(format!(
                "provider {} has no key in the environment; it is left out",
                provider.id
            ));
        }
    }
    providers
}

impl GatewayConfig {
    fn listener_limits(&self) -> Result<ListenerLimits, ConfigError> {
        let defaults = ListenerLimits::default();
        let limits = ListenerLimits {
            request_headers_timeout_ms: self
                .request_headers_timeout_ms
                .unwrap_or(defaults.request_headers_timeout_ms),
            request_timeout_ms: self
                .request_timeout_ms
                .unwrap_or(defaults.request_timeout_ms),
            connection_idle_timeout_ms: self
                .connection_idle_timeout_ms
                .unwrap_or(defaults.connection_idle_timeout_ms),
            max_concurrent_requests: self
                .max_concurrent_requests
                .unwrap_or(defaults.max_concurrent_requests),
        };
        check_listener_limits(&limits)?;
        Ok(limits)
    }
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

impl BackoffFileConfig {
    fn over(self, default: BackoffConfig) -> BackoffConfig {
        BackoffConfig {
            base_ms: self.base_ms.unwrap_or(default.base_ms),
            factor: self.factor.unwrap_or(default.factor),
            max_ms: self.max_ms.unwrap_or(default.max_ms),
        }
    }
}
