//! Reading a config: the file (YAML, or JSON, JSON being YAML), literal secrets refused before
//! anything else looks at the document, then typed deserialization whose errors start with the
//! field's full path; `load` resolves what it read.

use std::path::{Path, PathBuf};

use crate::config::error::{invalid, ConfigError};
use crate::config::file::FileConfig;
use crate::config::model::Config;
use crate::config::secrets::Env;
use crate::config::validate::AUTH_HEADERS;

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
