//! One provider resolved: its kind, base URL, keys, models, prices and discovery.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ai_router_contract::defaults;

use crate::config::error::{invalid, ConfigError};
use crate::config::file::{
    Capability, ModelConfig, ProviderConfig, ProviderKind, CLOUDFLARE_BASE_URL,
};
use crate::config::keys_from_env::keys_from_env_prefixes;
use crate::config::model::{Endpoint, KeyRef, Provider};
use crate::config::prices;
use crate::config::routes::check_discount;
use crate::config::secrets::{Env, SecretSource};
use crate::config::validate::{
    check_concurrency, check_cost, check_family, check_terms, check_weight, AUTH_HEADERS,
};

/// The alias of a keyless provider's one lane.
pub const KEYLESS_ALIAS: &str = "keyless";

/// Cloudflare's base URL from its account: `accountId`, else `<PREFIX>_ACCOUNT_ID`.
pub(super) fn cloudflare_base_url(
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

pub(super) fn resolve_provider(
    path: &str,
    raw: &ProviderConfig,
    env: &dyn Env,
    base_dir: &Path,
) -> Result<Provider, ConfigError> {
    let kind = raw.kind.unwrap_or(ProviderKind::OpenaiCompatible);
    let id = provider_id(path, raw, kind)?;
    let prefix = env_prefix(path, raw)?;
    let (base_url, base_url_from) = resolve_base_url(path, raw, kind, prefix, env)?;
    let endpoint =
        parse_base_url(base_url.trim()).map_err(|e| invalid(format!("{path}.baseUrl: {e}")))?;
    let headers = provider_headers(path, raw)?;
    let (weight, max_concurrency) = check_provider_numbers(path, raw)?;
    let keys = resolve_keys(path, raw, kind, &id, prefix, env, base_dir)?;
    let discover = discovery_settings(path, raw)?;
    check_models(path, raw, kind, discover.is_some())?;
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

/// The provider's `id`, its kind's name when unset: a name without `/` or spaces.
fn provider_id(
    path: &str,
    raw: &ProviderConfig,
    kind: ProviderKind,
) -> Result<String, ConfigError> {
    let id = raw.id.clone().unwrap_or_else(|| kind.as_str().to_owned());
    if id.is_empty() || id.contains('/') || id.contains(char::is_whitespace) {
        return Err(invalid(format!(
            "{path}.id: `{id}` must be a non-empty name without / or spaces"
        )));
    }
    Ok(id)
}

/// `keysFromEnv`: an env prefix (upper case, digits, `_`), or none.
fn env_prefix<'a>(path: &str, raw: &'a ProviderConfig) -> Result<Option<&'a str>, ConfigError> {
    let Some(prefix) = &raw.keys_from_env else {
        return Ok(None);
    };
    let ok = !prefix.is_empty()
        && prefix
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if !ok {
        return Err(invalid(format!(
            "{path}.keysFromEnv: `{prefix}` must be an env prefix such as OPENAI"
        )));
    }
    Ok(Some(prefix.as_str()))
}

/// The base URL and where it came from: `baseUrl`, else `<PREFIX>_BASE_URL`, else the kind's
/// default (Cloudflare's from its account). `accountId` only for kind cloudflare.
fn resolve_base_url(
    path: &str,
    raw: &ProviderConfig,
    kind: ProviderKind,
    prefix: Option<&str>,
    env: &dyn Env,
) -> Result<(String, String), ConfigError> {
    let env_base_url = prefix
        .map(|p| format!("{p}_BASE_URL"))
        .and_then(|var| Some(var.clone()).zip(env.var(&var)))
        .filter(|(_, v)| !v.trim().is_empty());
    let kind_base_url = match kind {
        ProviderKind::Cloudflare => cloudflare_base_url(path, raw, prefix, env)?,
        _ => kind.default_base_url().map(str::to_owned),
    };
    let found = match (&raw.base_url, env_base_url, kind_base_url) {
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
    Ok(found)
}

/// `headers`, names lower-cased: valid header names, none that would carry a secret.
fn provider_headers(
    path: &str,
    raw: &ProviderConfig,
) -> Result<Vec<(String, String)>, ConfigError> {
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
    Ok(headers)
}

/// The provider's numbers: `weight` (defaulted) and `maxConcurrency`, returned; `discount`,
/// `defaultMaxTokens` and `budget` checked.
fn check_provider_numbers(
    path: &str,
    raw: &ProviderConfig,
) -> Result<(f64, Option<u32>), ConfigError> {
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
    Ok((weight, max_concurrency))
}

/// The provider's keys: the explicit ones, the keyless lane of a provider that takes calls
/// without a key, then those `keysFromEnv` finds; each alias once.
fn resolve_keys(
    path: &str,
    raw: &ProviderConfig,
    kind: ProviderKind,
    id: &str,
    prefix: Option<&str>,
    env: &dyn Env,
    base_dir: &Path,
) -> Result<Vec<KeyRef>, ConfigError> {
    let mut keys = explicit_keys(path, raw, base_dir)?;
    check_terms(path, raw.terms.as_ref())?;
    if raw.keys.is_empty() && prefix.is_none() {
        keys.push(keyless_lane(path, raw, kind)?);
    }
    if let Some(prefix) = prefix {
        for key in env_keys(kind, id, prefix, env) {
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
    Ok(keys)
}

/// `keys`: each with an alias, a secret reference, its weight, concurrency and scope.
fn explicit_keys(
    path: &str,
    raw: &ProviderConfig,
    base_dir: &Path,
) -> Result<Vec<KeyRef>, ConfigError> {
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
    Ok(keys)
}

/// The one lane without a secret (no auth header is sent) of a provider given no keys: only
/// when its terms say it takes calls without a key.
fn keyless_lane(
    path: &str,
    raw: &ProviderConfig,
    kind: ProviderKind,
) -> Result<KeyRef, ConfigError> {
    if !crate::config::catalog::terms_of(kind.as_str(), raw.terms.as_ref()).keyless {
        return Err(invalid(format!(
            "{path}: needs keys or keysFromEnv (or terms: {{ keyless: true }} for a provider \
             that takes calls without a key)"
        )));
    }
    Ok(KeyRef {
        alias: KEYLESS_ALIAS.to_owned(),
        source: SecretSource::Keyless,
        weight: 1.0,
        max_concurrency: None,
        scope: None,
    })
}

/// The keys `keysFromEnv` finds under `prefix`, named after the provider's id (kind
/// openai-compatible) or its kind. The kind's own prefix brings the other names its keys go
/// by (QWEN for DASHSCOPE).
fn env_keys(kind: ProviderKind, id: &str, prefix: &str, env: &dyn Env) -> Vec<KeyRef> {
    let alias_base = if kind == ProviderKind::OpenaiCompatible {
        id
    } else {
        kind.as_str()
    };
    let mut prefixes = vec![prefix];
    if kind.env_prefix() == Some(prefix) || kind.env_prefix_aliases().contains(&prefix) {
        prefixes.extend(
            kind.env_prefix()
                .into_iter()
                .chain(kind.env_prefix_aliases().iter().copied()),
        );
    }
    keys_from_env_prefixes(&prefixes, alias_base, env)
}

/// `models`: at least one unless discovered, each id once, each model valid.
fn check_models(
    path: &str,
    raw: &ProviderConfig,
    kind: ProviderKind,
    discovers: bool,
) -> Result<(), ConfigError> {
    if raw.models.is_empty() && !discovers {
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
        check_model(&mpath, model, kind)?;
    }
    Ok(())
}

/// One model's fields: aliases, weight, discount, cost, context window, capabilities the
/// kind has, dimensions and family.
fn check_model(mpath: &str, model: &ModelConfig, kind: ProviderKind) -> Result<(), ConfigError> {
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
    check_family(mpath, model)
}

/// `discover` and `discoveryTtlMs`: the TTL only with discovery on, and at least a second.
pub(super) fn discovery_settings(
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
pub(super) fn apply_prices(providers: &mut [Provider], auto_price: bool) {
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

pub(super) fn secret_ref(
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

pub(super) fn relative_to(base_dir: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base_dir.join(path)
    }
}
