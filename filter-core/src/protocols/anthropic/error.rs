//! A request a translation cannot express (answered 400 by the gateway, naming the field).

use std::fmt;

/// A request the adapter cannot express in the Messages API (answered 400 by the gateway).
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterError {
    pub message: String,
    /// The request field at fault, as OpenAI's `error.param`.
    pub param: Option<&'static str>,
}

impl AdapterError {
    pub(crate) fn new(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            param: Some(param),
        }
    }
}

impl AdapterError {
    /// A body that is not a JSON object.
    pub(crate) fn not_an_object() -> Self {
        Self {
            message: "The request body must be a JSON object.".into(),
            param: None,
        }
    }
}

impl fmt::Display for AdapterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.param {
            Some(p) => write!(f, "{} (param: {p})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for AdapterError {}
