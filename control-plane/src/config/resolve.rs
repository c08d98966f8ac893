//! The file resolved into the config the control plane works from
//! ([`FileConfig::resolve`]): defaults applied once, every check of `validate` made,
//! `keysFromEnv` expanded against an injectable [`Env`], providers without a key dropped,
//! policies cut to the models that remain.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ai_router_contract::defaults;

use crate::config::error::{invalid, ConfigError};
use crate::config::file::{
    BackoffFileConfig, BreakerFileConfig, Capability, FileConfig, GatewayConfig, PolicyConfig,
    ProviderConfig, ProviderKind, SecretRefConfig, SelectionConfig, StoreConfig, StoreType,
    TierConfig, CLOUDFLARE_BASE_URL,
};
use crate::config::keys_from_env::keys_from_env_prefixes;
use crate::config::model::{
    BackoffConfig, BreakerConfig, Config, ControlPlane, Endpoint, Gateway, KeyRef, ListenerLimits,
    MountedKey, PoolNames, Provider, ResilienceConfig, StoreSpec,
};
use crate::config::prices;
use crate::config::routes::check_discount;
use crate::config::secrets::{Env, SecretSource};
use crate::config::validate::{
    check_concurrency, check_cost, check_family, check_listener_limits, check_policy,
    check_resilience, check_selection, check_terms, check_weight, is_label, non_empty_host,
    refuse_own_listener, AUTH_HEADERS,
};

/// The alias of a keyless provider's one lane.
pub const KEYLESS_ALIAS: &str = "keyless";

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
        // Prices before the policies' checks: a budget needs priced models.
        apply_prices(&mut all, self.auto_price == Some(true));
        crate::config::routes::check_routes(&self.routes, &self.profiles)?;
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
        )?;
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
            mounted_keys,
            budgets: crate::config::budgets::resolve_budgets(&self.budgets)?,
            names,
            otlp_endpoint: self.resolve_otlp()?,
            include_content: self.telemetry.include_content,
            warnings,
        })
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

/// Cloudflare's base URL from its account: `accountId`, else `<PREFIX>_ACCOUNT_ID`.
fn cloudflare_base_url(
    path: &str,
    raw: &ProviderConfig,
    prefix: Option<&str>,
    env: &dyn Env,
) -> Result<Option<String>, ConfigError> {
    let account = raw.account_id.clone().or_else(|| {
        prefix
            .and_then(|p| env.var(&format!("{p}_ACCOUNT_ID")))
            .filter(|v| !v.trim().is_empty())
    });
    let Some(account) = account.map(|a| a.trim().to_owned()) else {
        return Ok(None);
    };
    if account.is_empty() || !account.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(invalid(format!(
            "{path}.accountId: `{account}` is not a Cloudflare account id (letters and digits)"
        )));
    }
    Ok(Some(CLOUDFLARE_BASE_URL.replace("{accountId}", &account)))
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
    let kind_base_url = match kind {
        ProviderKind::Cloudflare => cloudflare_base_url(path, raw, prefix, env)?,
        _ => kind.default_base_url().map(str::to_owned),
    };
    let (base_url, base_url_from) = match (&raw.base_url, env_base_url, kind_base_url) {
        (Some(url), _, _) => (url.clone(), format!("{path}.baseUrl")),
        (None, Some((var, url)), _) => (url, var),
        (None, None, Some(url)) => (url, format!("the {} default", kind.as_str())),
        (None, None, None) if kind == ProviderKind::Cloudflare => {
            return Err(invalid(format!(
                "{path}.accountId: kind cloudflare needs its account (accountId, \
                 <PREFIX>_ACCOUNT_ID) or a baseUrl"
            )))
        }
        (None, None, None) => {
            return Err(invalid(format!(
                "{path}.baseUrl: required for kind openai-compatible"
            )))
        }
    };
    if raw.account_id.is_some() && kind != ProviderKind::Cloudflare {
        return Err(invalid(format!(
            "{path}.accountId: only kind cloudflare has an account in its URL"
        )));
    }
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
    check_discount(&format!("{path}.discount"), raw.discount)?;
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
            scope: match key.scope.as_deref().map(str::trim) {
                Some("") => return Err(invalid(format!("{kpath}.scope: must not be empty"))),
                other => other.map(str::to_owned),
            },
        });
    }
    check_terms(path, raw.terms.as_ref())?;
    if raw.keys.is_empty() && prefix.is_none() {
        if !crate::config::catalog::terms_of(kind.as_str(), raw.terms.as_ref()).keyless {
            return Err(invalid(format!(
                "{path}: needs keys or keysFromEnv (or terms: {{ keyless: true }} for a provider \
                 that takes calls without a key)"
            )));
        }
        // One lane without a secret: no auth header is sent.
        keys.push(KeyRef {
            alias: KEYLESS_ALIAS.to_owned(),
            source: SecretSource::Keyless,
            weight: 1.0,
            max_concurrency: None,
            scope: None,
        });
    }
    if let Some(prefix) = prefix {
        let alias_base = if kind == ProviderKind::OpenaiCompatible {
            id.as_str()
        } else {
            kind.as_str()
        };
        // The kind's own prefix brings the other names its keys go by (QWEN for DASHSCOPE).
        let mut prefixes = vec![prefix];
        if kind.env_prefix() == Some(prefix) || kind.env_prefix_aliases().contains(&prefix) {
            prefixes.extend(
                kind.env_prefix()
                    .into_iter()
                    .chain(kind.env_prefix_aliases().iter().copied()),
            );
        }
        for key in keys_from_env_prefixes(&prefixes, alias_base, env) {
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

    let discover = discovery_settings(path, raw)?;
    if raw.models.is_empty() && discover.is_none() {
        return Err(invalid(format!(
            "{path}.models: needs at least one model (or discover: true)"
        )));
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
        check_discount(&format!("{mpath}.discount"), model.discount)?;
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
        check_family(&mpath, model)?;
    }

    let facts = crate::config::facts::resolve_facts(path, kind, raw)?;
    Ok(Provider {
        id,
        kind,
        base_url,
        base_url_from,
        endpoint,
        headers,
        weight,
        max_concurrency,
        default_max_tokens: raw
            .default_max_tokens
            .unwrap_or(defaults::DEFAULT_MAX_TOKENS),
        budget: raw.budget.clone(),
        discount: raw.discount,
        keys,
        models: raw.models.clone(),
        limits: raw.limits,
        terms: raw.terms.clone(),
        price_sources: BTreeMap::new(),
        facts,
        discover,
    })
}

/// `discover` and `discoveryTtlMs`: the TTL only with discovery on, and at least a second.
fn discovery_settings(
    path: &str,
    raw: &ProviderConfig,
) -> Result<Option<crate::config::model::Discovery>, ConfigError> {
    match (raw.discover.unwrap_or(false), raw.discovery_ttl_ms) {
        (false, Some(_)) => Err(invalid(format!(
            "{path}.discoveryTtlMs: only with discover: true"
        ))),
        (false, None) => Ok(None),
        (true, Some(ttl)) if ttl < 1000 => Err(invalid(format!(
            "{path}.discoveryTtlMs: must be at least 1000"
        ))),
        (true, ttl) => Ok(Some(crate::config::model::Discovery {
            ttl_ms: ttl.unwrap_or(defaults::DISCOVERY_TTL_MS),
        })),
    }
}

/// Where each model's price of these providers comes from, filling the `cost` of those without
/// one from the table when `auto_price` is on.
fn apply_prices(providers: &mut [Provider], auto_price: bool) {
    for provider in providers {
        for model in &mut provider.models {
            let source = match model.cost {
                Some(_) => prices::PriceSource::Config,
                None if auto_price => {
                    let discount = model.discount.or(provider.discount);
                    match prices::table_cost(&model.id, discount) {
                        Some(cost) => {
                            model.cost = Some(cost);
                            prices::PriceSource::Table
                        }
                        None => prices::PriceSource::Unpriced,
                    }
                }
                None => prices::PriceSource::Unpriced,
            };
            provider.price_sources.insert(model.id.clone(), source);
        }
    }
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

/// The prefix of every Redis key when `storeNamespace` is not set.
pub const DEFAULT_STORE_NAMESPACE: &str = "ai-router";

/// `stateStore`, with `storeNamespace` (only a Redis store is shared that way).
fn state_store_spec(file: &FileConfig, base_dir: &Path) -> Result<StoreSpec, ConfigError> {
    let spec = store_spec("stateStore", file.state_store.as_ref(), base_dir)?;
    match (spec, file.store_namespace.as_deref()) {
        (StoreSpec::Postgres { .. }, _) => Err(invalid(
            "stateStore.type: postgres holds keys and usage (gateway.keyStore); the shared state store is redis",
        )),
        (StoreSpec::Redis { url, ca_file, .. }, namespace) => {
            let namespace = namespace.map(str::trim).unwrap_or(DEFAULT_STORE_NAMESPACE);
            if namespace.is_empty() || namespace.contains(char::is_whitespace) {
                return Err(invalid(
                    "storeNamespace: a non-empty name without spaces (the prefix of every Redis key)",
                ));
            }
            Ok(StoreSpec::Redis {
                url,
                namespace: namespace.to_owned(),
                ca_file,
            })
        }
        (_, Some(_)) => Err(invalid(
            "storeNamespace: it names the keys of a store shared between gateways, and only stateStore: { type: redis } is shared that way; remove the field or use a redis state store",
        )),
        (spec, None) => Ok(spec),
    }
}

fn store_spec(
    path: &str,
    store: Option<&StoreConfig>,
    base_dir: &Path,
) -> Result<StoreSpec, ConfigError> {
    let Some(store) = store else {
        return Ok(StoreSpec::Memory);
    };
    let remote = matches!(store.kind, StoreType::Redis | StoreType::Postgres);
    if remote && store.path.is_some() {
        return Err(invalid(format!(
            "{path}.path: a {} store has a url, not a path",
            kind_name(store.kind)
        )));
    }
    if !remote && store.url.is_some() {
        return Err(invalid(format!(
            "{path}.url: a {} store has no url",
            kind_name(store.kind)
        )));
    }
    if !remote && store.ca_file.is_some() {
        return Err(invalid(format!(
            "{path}.caFile: a {} store has no TLS",
            kind_name(store.kind)
        )));
    }
    let ca_file = match &store.ca_file {
        Some(file) if file.as_os_str().is_empty() => {
            return Err(invalid(format!("{path}.caFile: a path to a PEM file")));
        }
        file => file.as_deref().map(|f| relative_to(base_dir, f)),
    };
    let url = |r: &SecretRefConfig| {
        secret_ref(
            &format!("{path}.url"),
            r.env.as_ref(),
            r.file.as_ref(),
            base_dir,
        )
    };
    match (store.kind, &store.path, &store.url) {
        (StoreType::Memory, None, _) => Ok(StoreSpec::Memory),
        (StoreType::Memory, Some(_), _) => {
            Err(invalid(format!("{path}.path: a memory store has no path")))
        }
        (StoreType::Sqlite, Some(file), _) if !file.as_os_str().is_empty() => {
            Ok(StoreSpec::Sqlite(relative_to(base_dir, file)))
        }
        (StoreType::Sqlite, _, _) => {
            Err(invalid(format!("{path}.path: a sqlite store needs a path")))
        }
        (StoreType::Redis, _, Some(r)) => Ok(StoreSpec::Redis {
            url: url(r)?,
            namespace: String::new(),
            ca_file,
        }),
        (StoreType::Postgres, _, Some(r)) => Ok(StoreSpec::Postgres {
            url: url(r)?,
            ca_file,
        }),
        (kind, _, None) => Err(invalid(format!(
            "{path}.url: a {} store needs {{ url: {{ env: NAME }} }}",
            kind_name(kind)
        ))),
    }
}

fn kind_name(kind: StoreType) -> &'static str {
    match kind {
        StoreType::Memory => "memory",
        StoreType::Sqlite => "sqlite",
        StoreType::Redis => "redis",
        StoreType::Postgres => "postgres",
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

const PROFILE_WILDCARD: &str = ai_router_contract::BINDING_WILDCARD;

/// `gateway.keyStore`: memory, sqlite or postgres (Redis holds state, not keys).
fn key_store_spec(store: Option<&StoreConfig>, base_dir: &Path) -> Result<StoreSpec, ConfigError> {
    match store_spec("gateway.keyStore", store, base_dir)? {
        StoreSpec::Redis { .. } => Err(invalid(
            "gateway.keyStore.type: redis holds the shared state (stateStore); the shared key store is postgres",
        )),
        spec => Ok(spec),
    }
}
