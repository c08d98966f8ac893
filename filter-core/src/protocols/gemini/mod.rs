//! Callers that speak Google's Generative Language API (the Gemini API: the Gemini CLI, the
//! `@google/genai` and `google-genai` SDKs), served by any lane through chat completions. Pure
//! translations, no host calls:
//!
//! - [`route`] (`route.rs`): `/v1beta/models/{model}:{method}` (and `GET /v1beta/models[/{model}]`);
//! - [`to_chat_request`] (`request.rs`): a `GenerateContentRequest` (model and streaming from the path) to a
//!   chat-completions body. The front stage translates once: the attempts get chat completions,
//!   so a Gemini call routes, fails over and is gated like a chat call;
//! - [`from_chat_response`] (`response.rs`): a `chat.completion` to a `GenerateContentResponse`;
//! - [`StreamEncoder`] (`stream.rs`): chat-completion chunk events to `GenerateContentResponse` chunks, as
//!   SSE (`?alt=sse`) or as the JSON array Google streams without it;
//! - [`error_body`] (`errors.rs`): Google's error object (`{"error":{"code","message","status"}}`).
//!
//! What the translation does with each part of a request (docs/protocols.md lists the same):
//! what has a chat-completions counterpart is translated; what has none and does not change the
//! answer's meaning is dropped (and any field this module does not know yet); what only runs at
//! Google (its hosted tools, cached contents, non-text output) is refused, naming the field.

mod errors;
mod request;
mod response;
mod route;
mod stream;
#[cfg(test)]
mod tests;

pub use errors::{error_body, error_from_openai, model_entry, model_list};
pub use request::{
    count_tokens, counted_request, json_schema_of, routed_request, to_chat_request, DROPPED_FIELDS,
    REFUSED_FIELDS,
};
pub use response::{finish_reason, from_chat_response, replay};
pub use route::{google_client, is_gemini_path, route, take_query_key, wants_sse, Route};
pub use stream::StreamEncoder;
