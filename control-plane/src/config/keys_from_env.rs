//! `providers[].keysFromEnv: PREFIX`: the keys a provider finds in the environment.

use std::collections::BTreeMap;

use ai_router_contract::defaults;

use crate::config::model::KeyRef;
use crate::config::secrets::{split_key_list, Env, SecretSource};

/// `<PREFIX>_API_KEY`, `<PREFIX>_API_KEY_<n>` (gaps allowed), their `_FILE` twins, then the
/// items of `<PREFIX>_API_KEYS`, aliased `<alias_base>-<n>`. Only variables that are set
/// (non-empty) make a key. A prefix that is a whole variable name (ends in `_TOKEN` or `_KEY`,
/// as GitHub's `GITHUB_TOKEN`) stands for `<PREFIX>`, `<PREFIX>_<n>`, ... and `<PREFIX>S`.
pub fn keys_from_env(prefix: &str, alias_base: &str, env: &dyn Env) -> Vec<KeyRef> {
    let set = |name: &str| {
        env.var(name)
            .is_some_and(|v| !v.trim().is_empty() && !env.refuses_as_provider_key(&v))
    };
    let single = if prefix.ends_with("_TOKEN") || prefix.ends_with("_KEY") {
        prefix.to_owned()
    } else {
        format!("{prefix}_API_KEY")
    };
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
    let list_var = format!("{single}S");
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

/// [`keys_from_env`] over the provider's prefix, then over the other prefixes its kind also
/// takes (`QWEN` for a qwen provider on `DASHSCOPE`): their keys are numbered on after the
/// first prefix's, and a variable already read is not read twice.
pub fn keys_from_env_prefixes(prefixes: &[&str], alias_base: &str, env: &dyn Env) -> Vec<KeyRef> {
    let mut keys: Vec<KeyRef> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for prefix in prefixes {
        if seen.contains(prefix) {
            continue;
        }
        seen.push(prefix);
        let found = keys_from_env(prefix, alias_base, env);
        if keys.is_empty() {
            keys = found;
            continue;
        }
        let mut next = keys
            .iter()
            .filter_map(|k| k.alias.rsplit_once('-')?.1.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        for mut key in found {
            next += 1;
            key.alias = format!("{alias_base}-{next}");
            keys.push(key);
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::secrets::MapEnv;

    fn aliases_and_vars(keys: &[KeyRef]) -> Vec<(String, String)> {
        keys.iter()
            .map(|k| {
                let var = match &k.source {
                    SecretSource::EnvOrFileEnv { var, .. } => var.clone(),
                    SecretSource::EnvListItem { var, index } => format!("{var}[{index}]"),
                    other => format!("{other:?}"),
                };
                (k.alias.clone(), var)
            })
            .collect()
    }

    #[test]
    fn a_prefix_that_names_a_variable_reads_that_variable_and_its_twins() {
        let env = MapEnv::new([
            ("GITHUB_TOKEN", "ghp-1"),
            ("GITHUB_TOKEN_3", "ghp-3"),
            ("GITHUB_TOKENS", "ghp-a,ghp-b"),
            ("GITHUB_TOKEN_API_KEY", "never-read"),
        ]);
        assert_eq!(
            aliases_and_vars(&keys_from_env("GITHUB_TOKEN", "github", &env)),
            [
                ("github-1".to_owned(), "GITHUB_TOKEN".to_owned()),
                ("github-3".to_owned(), "GITHUB_TOKEN_3".to_owned()),
                ("github-4".to_owned(), "GITHUB_TOKENS[0]".to_owned()),
                ("github-5".to_owned(), "GITHUB_TOKENS[1]".to_owned()),
            ]
        );
    }

    #[test]
    fn qwen_also_takes_qwen_api_key_numbered_after_dashscopes() {
        let env = MapEnv::new([
            ("DASHSCOPE_API_KEY", "sk-d1"),
            ("DASHSCOPE_API_KEY_2", "sk-d2"),
            ("QWEN_API_KEY", "sk-q1"),
        ]);
        assert_eq!(
            aliases_and_vars(&keys_from_env_prefixes(
                &["DASHSCOPE", "QWEN"],
                "qwen",
                &env
            )),
            [
                ("qwen-1".to_owned(), "DASHSCOPE_API_KEY".to_owned()),
                ("qwen-2".to_owned(), "DASHSCOPE_API_KEY_2".to_owned()),
                ("qwen-3".to_owned(), "QWEN_API_KEY".to_owned()),
            ]
        );
        // Only QWEN_API_KEY set: it is the first key.
        let env = MapEnv::new([("QWEN_API_KEY", "sk-q1")]);
        assert_eq!(
            aliases_and_vars(&keys_from_env_prefixes(
                &["DASHSCOPE", "QWEN"],
                "qwen",
                &env
            )),
            [("qwen-1".to_owned(), "QWEN_API_KEY".to_owned())]
        );
    }
}
