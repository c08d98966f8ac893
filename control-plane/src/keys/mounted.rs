//! Virtual keys: the `sk-starci-<label>-<secret>` keys apps call the gateway with.
//!
//! Mounted keys are built here (stored keys live in the key store): `mountedKeys` in the
//! config, and `STARCI_AI_KEY` (or the file named by `STARCI_AI_KEY_FILE`) bound to every
//! profile and model, unless a `mountedKeys` entry already mounts that secret.
//! A mounted key's secret is read once at start; only its lowercase hex SHA-256 is kept, and its
//! id is `key_` + 16 hex of `sha256("mounted:<label>")`, stable across secrets and deploys.
//! Errors name the label and the id, never the secret.

use std::collections::BTreeSet;

use ai_router_contract::{defaults, BINDING_WILDCARD};
use rand::RngCore;

use crate::config::secrets::{sha256_hex, Env, Secret, SecretSource};
use crate::config::{Config, MountedKey};
use crate::keys::record::VirtualKeyRecord;

/// The env variable that mounts the app's key when the config mounts none.
pub const STARCI_AI_KEY: &str = "STARCI_AI_KEY";
const SECRET_PREFIX: &str = "sk-starci-";
const MIN_SECRET_TAIL: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountedKeyError {
    #[error("mounted key {label} ({id}) is invalid: {reason}")]
    Invalid {
        label: String,
        id: String,
        reason: String,
    },
    #[error("mounted key {label} is given twice")]
    DuplicateLabel { label: String },
    #[error("mounted key {label} ({id}) collides with the key store: {reason}")]
    Collision {
        label: String,
        id: String,
        reason: String,
    },
}

/// `key_` + the first 16 hex of `sha256("mounted:<label>")`.
pub fn mounted_id(label: &str) -> String {
    let digest = sha256_hex(&format!("mounted:{label}"));
    format!("key_{}", &digest[..16])
}

/// Checks `sk-starci-<label>-<at least 32 of [A-Za-z0-9_-]>`. The reason never quotes the
/// secret.
pub fn check_secret(label: &str, secret: &str) -> Result<(), String> {
    let prefix = format!("{SECRET_PREFIX}{label}-");
    let Some(tail) = secret.strip_prefix(&prefix) else {
        return Err(format!("the secret does not start with {prefix}"));
    };
    if tail.len() < MIN_SECRET_TAIL {
        return Err(format!(
            "the secret has fewer than {MIN_SECRET_TAIL} characters after {prefix}"
        ));
    }
    if !tail
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "the secret has characters other than letters, digits, _ and - after {prefix}"
        ));
    }
    Ok(())
}

/// Whether `value` looks like a gateway virtual key (`sk-starci-...`), whatever its label.
pub fn is_virtual_key(value: &str) -> bool {
    value.trim().starts_with(SECRET_PREFIX)
}

/// The label of a `sk-starci-<label>-...` secret.
pub fn label_of(secret: &str) -> Option<&str> {
    let rest = secret.strip_prefix(SECRET_PREFIX)?;
    let (label, _) = rest.split_once('-')?;
    let ok = !label.is_empty()
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    ok.then_some(label)
}

/// The last four characters of a secret: how every surface tells keys apart.
pub fn hint(secret: &str) -> String {
    let start = secret
        .char_indices()
        .rev()
        .nth(3)
        .map_or(0, |(index, _)| index);
    secret[start..].to_owned()
}

/// A fresh `sk-starci-<label>-<48 hex>`.
pub fn generate_secret(label: &str) -> Secret {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    Secret::new(format!("{SECRET_PREFIX}{label}-{}", hex::encode(bytes)))
}

/// The mounted keys of `config`, then `STARCI_AI_KEY` (bound to everything) when it is set and
/// no `mountedKeys` entry already mounts the same secret. A `STARCI_AI_KEY` whose label a
/// `mountedKeys` entry holds with another secret is refused: both would share one key id.
pub fn mounted_keys(
    config: &Config,
    env: &dyn Env,
) -> Result<Vec<VirtualKeyRecord>, MountedKeyError> {
    let mut labels = BTreeSet::new();
    let mut keys = Vec::with_capacity(config.mounted_keys.len() + 1);
    for mounted in &config.mounted_keys {
        if !labels.insert(mounted.label.clone()) {
            return Err(MountedKeyError::DuplicateLabel {
                label: mounted.label.clone(),
            });
        }
        keys.push(mount(mounted, env)?);
    }
    let Some(app) = starci_ai_key(env)? else {
        return Ok(keys);
    };
    if keys.iter().any(|k| k.sha256 == app.sha256) {
        // Mounted by an entry (its bindings and quota apply, not the wildcard).
        return Ok(keys);
    }
    if labels.contains(&app.label) {
        return Err(MountedKeyError::Invalid {
            id: app.id,
            reason: format!(
                "{STARCI_AI_KEY} holds a key labelled {label}, and mountedKeys mounts another \
                 secret under that label; give one of them another label, or mount \
                 {STARCI_AI_KEY} through mountedKeys with env: {STARCI_AI_KEY}",
                label = app.label
            ),
            label: app.label,
        });
    }
    if !keys.is_empty() {
        tracing::info!(
            label = %app.label,
            "{STARCI_AI_KEY} is mounted next to mountedKeys, bound to every profile and model"
        );
    }
    keys.push(app);
    Ok(keys)
}

fn mount(mounted: &MountedKey, env: &dyn Env) -> Result<VirtualKeyRecord, MountedKeyError> {
    let id = mounted_id(&mounted.label);
    let invalid = |reason: String| MountedKeyError::Invalid {
        label: mounted.label.clone(),
        id: id.clone(),
        reason,
    };
    let secret = mounted
        .source
        .resolve(env)
        .ok_or_else(|| invalid(format!("{} resolves to nothing", mounted.source.describe())))?;
    check_secret(&mounted.label, secret.expose()).map_err(invalid)?;
    Ok(VirtualKeyRecord {
        id: id.clone(),
        label: mounted.label.clone(),
        sha256: sha256_hex(secret.expose()),
        hint: hint(secret.expose()),
        profiles: mounted.profiles.clone(),
        models: mounted.models.clone(),
        owner: mounted.owner.clone(),
        allow_fallback: mounted.allow_fallback,
        enabled: mounted.enabled,
        quota: mounted.quota,
        mounted: true,
        quota_block: None,
        cache: mounted.cache,
    })
}

/// `STARCI_AI_KEY` (or the file `STARCI_AI_KEY_FILE` names), bound to every profile and model.
fn starci_ai_key(env: &dyn Env) -> Result<Option<VirtualKeyRecord>, MountedKeyError> {
    let source = SecretSource::EnvOrFileEnv {
        var: STARCI_AI_KEY.to_owned(),
        file_var: format!("{STARCI_AI_KEY}_FILE"),
    };
    let Some(secret) = source.resolve(env) else {
        return Ok(None);
    };
    let Some(label) = label_of(secret.expose()).map(str::to_owned) else {
        return Err(MountedKeyError::Invalid {
            label: STARCI_AI_KEY.to_owned(),
            id: "-".to_owned(),
            reason: format!("the secret is not {SECRET_PREFIX}<label>-<secret>"),
        });
    };
    let mounted = MountedKey {
        label,
        source,
        profiles: vec![BINDING_WILDCARD.to_owned()],
        models: vec![BINDING_WILDCARD.to_owned()],
        owner: None,
        allow_fallback: defaults::ALLOW_FALLBACK,
        quota: None,
        enabled: defaults::KEY_ENABLED,
        cache: None,
    };
    mount(&mounted, env).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::config::secrets::MapEnv;
    use std::path::Path;

    const GOOD: &str = "sk-starci-app-0123456789abcdef0123456789abcdef0123456789abcdef";

    fn load(text: &str) -> Result<Config, String> {
        parse(text)
            .and_then(|f| f.resolve(&MapEnv::default(), Path::new(".")))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn id_is_stable_per_label() {
        let id = mounted_id("app");
        assert_eq!(id.len(), 4 + 16);
        assert_eq!(id, format!("key_{}", &sha256_hex("mounted:app")[..16]));
    }

    #[test]
    fn starci_ai_key_is_mounted_for_everything() -> Result<(), String> {
        let config = load("{}")?;
        let env = MapEnv::new([(STARCI_AI_KEY, GOOD)]);
        let keys = mounted_keys(&config, &env).map_err(|e| e.to_string())?;
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].label, "app");
        assert_eq!(keys[0].id, mounted_id("app"));
        assert_eq!(keys[0].sha256, sha256_hex(GOOD));
        assert_eq!(keys[0].profiles, ["*"]);
        assert_eq!(keys[0].models, ["*"]);
        assert!(keys[0].mounted && keys[0].enabled && keys[0].allow_fallback);
        assert!(mounted_keys(&config, &MapEnv::default())
            .map_err(|e| e.to_string())?
            .is_empty());
        Ok(())
    }

    #[test]
    fn invalid_secrets_are_refused_without_quoting_them() -> Result<(), String> {
        let config = load("mountedKeys: [{ label: app, env: K, profiles: ['*'] }]\n")?;
        for bad in [
            "sk-starci-other-0123456789abcdef0123456789abcdef0123",
            "sk-starci-app-short",
            "sk-starci-app-0123456789abcdef0123456789abcdef!!!!",
        ] {
            let env = MapEnv::new([("K", bad)]);
            let message = match mounted_keys(&config, &env) {
                Ok(_) => return Err(format!("{bad} was accepted")),
                Err(e) => e.to_string(),
            };
            assert!(message.contains("mounted key app (key_"), "{message}");
            assert!(!message.contains(bad), "{message}");
        }
        let message = mounted_keys(&config, &MapEnv::default())
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            matches!(&message, Err(m) if m.contains("env K resolves to nothing")),
            "{message:?}"
        );
        let env = MapEnv::new([("K", GOOD)]);
        let keys = mounted_keys(&config, &env).map_err(|e| e.to_string())?;
        assert_eq!(keys[0].sha256, sha256_hex(GOOD));
        let message = mounted_keys(&load("{}")?, &MapEnv::new([(STARCI_AI_KEY, "sk-live-x")]))
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            matches!(&message, Err(m) if !m.contains("sk-live-x")),
            "{message:?}"
        );
        Ok(())
    }

    #[test]
    fn starci_ai_key_is_mounted_next_to_mounted_keys() -> Result<(), String> {
        const OTHER: &str = "sk-starci-ops-0123456789abcdef0123456789abcdef0123456789abcdef";
        let config = load("mountedKeys: [{ label: ops, env: K, profiles: ['*'], quota: { requestsPerMinute: 3 } }]\n")?;
        let env = MapEnv::new([("K", OTHER), (STARCI_AI_KEY, GOOD)]);
        let keys = mounted_keys(&config, &env).map_err(|e| e.to_string())?;
        let labels: Vec<&str> = keys.iter().map(|k| k.label.as_str()).collect();
        assert_eq!(labels, ["ops", "app"]);
        assert_eq!(keys[1].sha256, sha256_hex(GOOD));
        assert_eq!(keys[1].models, ["*"]);
        // The same secret through an entry is mounted once, with the entry's bindings.
        let env = MapEnv::new([("K", OTHER), (STARCI_AI_KEY, OTHER)]);
        let keys = mounted_keys(&config, &env).map_err(|e| e.to_string())?;
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].quota.and_then(|q| q.requests_per_minute), Some(3));
        // Another secret under an entry's label would share its id.
        let clash = "sk-starci-ops-ffffffffffffffffffffffffffffffffffffffffffffffff";
        let env = MapEnv::new([("K", OTHER), (STARCI_AI_KEY, clash)]);
        let message = mounted_keys(&config, &env)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            matches!(&message, Err(m) if m.contains("labelled ops") && !m.contains(clash)),
            "{message:?}"
        );
        Ok(())
    }

    #[test]
    fn generated_secrets_are_valid() {
        let secret = generate_secret("local");
        assert!(check_secret("local", secret.expose()).is_ok());
        assert_eq!(label_of(secret.expose()), Some("local"));
        assert_eq!(secret.expose().len(), "sk-starci-local-".len() + 48);
    }
}
