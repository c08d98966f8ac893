//! What loading a config can fail with. Every message names the offending field
//! (`providers[1].keys[0].apiKey: ...`); loading from a file prefixes the file.

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The message names the field (`providers[1].keys[0].apiKey: ...`).
    #[error("{0}")]
    Invalid(String),
}

pub(super) fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(message.into())
}
