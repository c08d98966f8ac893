//! Callers that speak the OpenAI Responses API (`POST /v1/responses`), stateless, served by a
//! provider that speaks chat completions (or, through the Messages adapter after this one,
//! Anthropic). Pure translations, no host calls:
//!
//! - [`request::to_chat_request`]: a Responses request body to a chat-completions body;
//! - [`response::from_chat_response`]: a `chat.completion` to a `response` object;
//! - [`stream::StreamEncoder`]: chat-completion chunk events to the typed Responses events
//!   (`response.created`, `response.output_item.added`, `response.output_text.delta`,
//!   `response.function_call_arguments.delta`, …, `response.completed`), an OpenAI error
//!   event to `error` then `response.failed`;
//! - [`stateful`]: whether a request needs the provider to keep state (`previous_response_id`,
//!   `conversation`, `store: true`), which only a provider of kind `openai` serves, natively
//!   (and, for an id the gateway saw stored, only its key: `crate::lanes::response_pins`).

pub mod request;
pub mod response;
pub mod stream;
#[cfg(test)]
mod tests;

use serde_json::Value;

/// The field that makes the request stateful, if one does: `previous_response_id`,
/// `conversation`, or `store: true` (an absent `store` is taken as false here: such a call may
/// be translated, and then nothing is kept).
pub fn stateful(body: &Value) -> Option<&'static str> {
    if body
        .get("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        Some("previous_response_id")
    } else if body.get("conversation").is_some_and(|v| !v.is_null()) {
        Some("conversation")
    } else if body.get("store").and_then(Value::as_bool) == Some(true) {
        Some("store")
    } else {
        None
    }
}
