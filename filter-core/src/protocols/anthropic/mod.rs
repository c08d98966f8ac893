//! The Anthropic Messages API adapter: callers speak OpenAI chat-completions, a provider of kind
//! `anthropic` speaks Messages. Three pure translations, no host calls:
//!
//! - [`to_messages_request`] (`request.rs`): an OpenAI request body to a Messages request body;
//! - [`from_messages_response`] (`response.rs`): a Messages reply to an OpenAI `chat.completion`;
//! - [`StreamTranslator`] (`stream.rs`): Messages SSE events to OpenAI `chat.completion.chunk` SSE
//!   bytes, one event at a time, ending with a usage chunk and `data: [DONE]` so that the stream
//!   gate downstream sees exactly what an OpenAI provider would have sent.

mod error;
mod request;
mod response;
mod stream;
#[cfg(test)]
mod tests;

pub use error::AdapterError;
pub use request::to_messages_request;
pub(crate) use response::str_field;
pub use response::{finish_reason, from_messages_response};
pub use stream::StreamTranslator;

/// The `anthropic-version` header value the adapter's shapes follow.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
