//! Callers that speak Google's Generative Language API (the Gemini API: the Gemini CLI, the
//! `@google/genai` and `google-genai` SDKs), served by any lane through chat completions. Pure
//! translations, no host calls:
//!
//! - [`route::route`]: `/v1beta/models/{model}:{method}` (and `GET /v1beta/models[/{model}]`);
//! - [`request::to_chat_request`]: a `GenerateContentRequest` (model and streaming from the path) to a
//!   chat-completions body. The front stage translates once: the attempts get chat completions,
//!   so a Gemini call routes, fails over and is gated like a chat call;
//! - [`response::from_chat_response`]: a `chat.completion` to a `GenerateContentResponse`;
//! - [`stream::StreamEncoder`]: chat-completion chunk events to `GenerateContentResponse` chunks, as
//!   SSE (`?alt=sse`) or as the JSON array Google streams without it;
//! - [`errors::error_body`]: Google's error object (`{"error":{"code","message","status"}}`);
//! - [`native`]: a call served natively by a `kind: gemini` lane (Google's own API);
//! - [`embed`]: the embeddings methods, natively or through `/v1/embeddings`.
//!
//! What the translation does with each part of a request (docs/protocols.md lists the same):
//! what has a chat-completions counterpart is translated; what has none and does not change the
//! answer's meaning is dropped (and any field this module does not know yet); what only runs at
//! Google (its hosted tools, cached contents, non-text output) is refused, naming the field.

pub mod embed;
pub mod errors;
pub mod native;
pub mod request;
pub mod response;
pub mod route;
pub mod stream;
#[cfg(test)]
mod tests;
