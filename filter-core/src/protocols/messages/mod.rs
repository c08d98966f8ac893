//! Callers that speak the Anthropic Messages API (`POST /v1/messages`) served by a provider
//! that speaks OpenAI chat completions: the adapter of `anthropic/` in reverse. Pure
//! translations, no host calls:
//!
//! - [`request::to_chat_request`]: a Messages request body to a chat-completions body;
//! - [`response::from_chat_response`]: a `chat.completion` to a Messages `message`;
//! - [`stream::StreamEncoder`]: chat-completion chunk events to Messages SSE events (`message_start`,
//!   `content_block_*`, `message_delta`, `message_stop`), an OpenAI error event to `error`;
//! - [`errors::error_body`]: the Anthropic error object for a gateway error.
//!
//! A call served by a provider of kind `anthropic` takes none of these: its body goes as it
//! came, with only `model` rewritten (unknown fields, roles, blocks and tool types included).
//!
//! What the translation does with each part of a Messages request (docs/protocols.md lists the
//! same, per field): what has a chat-completions counterpart is translated; what has none is
//! dropped ([`request::DROPPED_FIELDS`], and any top-level field this module does not know yet) or
//! refused ([`request::REFUSED_FIELDS`], blocks and tool types chat cannot carry), naming the field.
//! A refusal rules the lane out (trail reason `adapter`); a native lane may still serve.

pub mod errors;
pub mod request;
pub mod response;
pub mod stream;
#[cfg(test)]
mod tests;
