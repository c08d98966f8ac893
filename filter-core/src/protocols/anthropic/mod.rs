//! The Anthropic Messages API adapter: callers speak OpenAI chat-completions, a provider of kind
//! `anthropic` speaks Messages. Three pure translations, no host calls:
//!
//! - [`request::to_messages_request`]: an OpenAI request body to a Messages request body;
//! - [`response::from_messages_response`]: a Messages reply to an OpenAI `chat.completion`;
//! - [`stream::StreamTranslator`]: Messages SSE events to OpenAI `chat.completion.chunk` SSE
//!   bytes, one event at a time, ending with a usage chunk and `data: [DONE]` so that the stream
//!   gate downstream sees exactly what an OpenAI provider would have sent.

pub mod error;
pub mod request;
pub mod response;
pub mod stream;
#[cfg(test)]
mod tests;

/// The `anthropic-version` header value the adapter's shapes follow.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
