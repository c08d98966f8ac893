//! The provider API a path belongs to.

use serde_json::Value;

use super::{anthropic, gemini, openai};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Chat,
    Messages,
    /// Anthropic's `POST /v1/messages/count_tokens`.
    CountTokens,
    Responses,
    Embeddings,
    /// Google's Gemini API (`…/models/{model}:{method}`); `sse`: the query's `alt=sse`.
    Gemini {
        method: gemini::Method,
        sse: bool,
    },
}

impl Endpoint {
    pub(super) fn of(path: &str, query: &str) -> Option<Self> {
        let path = path.trim_end_matches('/');
        if let Some((_, method)) = gemini::of(path) {
            return Some(Self::Gemini {
                method,
                sse: gemini::wants_sse(query),
            });
        }
        if path.ends_with("/chat/completions") {
            Some(Self::Chat)
        } else if path.ends_with("/messages/count_tokens") {
            Some(Self::CountTokens)
        } else if path.ends_with("/messages") {
            Some(Self::Messages)
        } else if path.ends_with("/embeddings") {
            Some(Self::Embeddings)
        } else if path.ends_with("/responses") {
            Some(Self::Responses)
        } else {
            None
        }
    }

    /// The endpoint's error object; `retry_s`: a 429's delay (Gemini states it in the body).
    pub(super) fn error_body(self, status: u16, message: &str, retry_s: Option<u64>) -> Value {
        match self {
            Self::Gemini { .. } => gemini::error_body(status, message, retry_s),
            Self::Messages | Self::CountTokens => anthropic::error_body(status, message),
            Self::Chat | Self::Responses | Self::Embeddings => openai::error_body(status, message),
        }
    }
}
