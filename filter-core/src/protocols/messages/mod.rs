//! Callers that speak the Anthropic Messages API (`POST /v1/messages`) served by a provider
//! that speaks OpenAI chat completions: the adapter of `anthropic/` in reverse. Pure
//! translations, no host calls:
//!
//! - [`to_chat_request`] (`request.rs`): a Messages request body to a chat-completions body;
//! - [`from_chat_response`] (`response.rs`): a `chat.completion` to a Messages `message`;
//! - [`StreamEncoder`] (`stream.rs`): chat-completion chunk events to Messages SSE events (`message_start`,
//!   `content_block_*`, `message_delta`, `message_stop`), an OpenAI error event to `error`;
//! - [`error_body`] (`errors.rs`): the Anthropic error object for a gateway error.
//!
//! A call served by a provider of kind `anthropic` takes none of these: its body goes as it
//! came, with only `model` rewritten (unknown fields, roles, blocks and tool types included).
//!
//! What the translation does with each part of a Messages request (docs/protocols.md lists the
//! same, per field): what has a chat-completions counterpart is translated; what has none is
//! dropped ([`DROPPED_FIELDS`], and any top-level field this module does not know yet) or
//! refused ([`REFUSED_FIELDS`], blocks and tool types chat cannot carry), naming the field.
//! A refusal rules the lane out (trail reason `adapter`); a native lane may still serve.

mod errors;
mod request;
mod response;
mod stream;
#[cfg(test)]
mod tests;

pub(crate) use errors::OpenAiError;
pub use errors::{error_body, error_from_openai, error_type, stream_error};
pub(crate) use request::assistant_message;
pub use request::{count_tokens, to_chat_request, Fidelity, DROPPED_FIELDS, REFUSED_FIELDS};
pub use response::{from_chat_response, stop_reason};
pub use stream::StreamEncoder;
