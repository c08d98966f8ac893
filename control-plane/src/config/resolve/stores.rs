//! The key store and the state store resolved (`gateway.keyStore`, `stateStore`).

use std::path::Path;

use super::provider::{relative_to, secret_ref};
use crate::config::error::{invalid, ConfigError};
use crate::config::file::{FileConfig, SecretRefConfig, StoreConfig, StoreType};
use crate::config::model::StoreSpec;

/// The prefix of every Redis key when `storeNamespace` is not set.
pub const DEFAULT_STORE_NAMESPACE: &str = "ai-router";

/// `storeStartWaitMs` when the file does not set it: two minutes.
pub const DEFAULT_STORE_START_WAIT_MS: u64 = 120_000;

/// `storeStartWaitMs` (0: try the stores once).
pub(super) fn store_start_wait(file: &FileConfig) -> std::time::Duration {
    std::time::Duration::from_millis(
        file.store_start_wait_ms
            .unwrap_or(DEFAULT_STORE_START_WAIT_MS),
    )
}

/// `stateStore`, with `storeNamespace` (only a Redis store is shared that way).
pub(super) fn state_store_spec(
    file: &FileConfig,
    base_dir: &Path,
) -> Result<StoreSpec, ConfigError> {
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

pub(super) fn store_spec(
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

pub(super) fn kind_name(kind: StoreType) -> &'static str {
    match kind {
        StoreType::Memory => "memory",
        StoreType::Sqlite => "sqlite",
        StoreType::Redis => "redis",
        StoreType::Postgres => "postgres",
    }
}

/// `gateway.keyStore`: memory, sqlite or postgres (Redis holds state, not keys).
pub(super) fn key_store_spec(
    store: Option<&StoreConfig>,
    base_dir: &Path,
) -> Result<StoreSpec, ConfigError> {
    match store_spec("gateway.keyStore", store, base_dir)? {
        StoreSpec::Redis { .. } => Err(invalid(
            "gateway.keyStore.type: redis holds the shared state (stateStore); the shared key store is postgres",
        )),
        spec => Ok(spec),
    }
}
