//! `providers[].keysFromEnv: PREFIX`: the keys a provider finds in the environment.

use std::collections::BTreeMap;

use ai_router_contract::defaults;

use crate::config::model::KeyRef;
use crate::config::secrets::{split_key_list, Env, SecretSource};

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
            weight: defaults::WEIGHT,
            max_concurrency: None,
            scope: None,
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
                weight: defaults::WEIGHT,
                max_concurrency: None,
                scope: None,
            });
        }
    }
    keys
}
