//! A resolved reply rendered as the endpoint's answer: a scripted body, a scripted error, the
//! provider's refusal of an unreadable body, or a success (unary or streamed).

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::Value;

use super::answer::{Answer, Turn};
use super::endpoint::Endpoint;
use super::http::{full, json_response, Body};
use super::script::{self, Reply};
use super::{anthropic, gemini, openai, responses, sse};

/// Renders a (resolved) reply for the endpoint.
pub(super) fn respond(
    endpoint: Endpoint,
    reply: &Reply,
    turn: &Turn,
    request: &Value,
    stream: bool,
    had_body: bool,
) -> Response<Body> {
    let status = reply
        .status
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::OK);
    let gemini_body = match (endpoint, &reply.body) {
        (Endpoint::Gemini { .. }, Some(body)) => Some(gemini::native_body(body.clone())),
        _ => None,
    };
    let mut response = if let Some(body) = gemini_body.as_ref().or(reply.body.as_ref()) {
        let (bytes, content_type) = match body {
            Value::String(text) => (Bytes::from(text.clone()), "text/plain; charset=utf-8"),
            other => (Bytes::from(other.to_string()), "application/json"),
        };
        let mut response = Response::new(full(bytes));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    } else if !status.is_success() {
        let message = format!(
            "The ai-router mock answered {} as scripted.",
            status.as_u16()
        );
        let retry_s = reply
            .headers
            .get("retry-after")
            .and_then(|value| value.trim().parse().ok());
        json_response(
            status,
            &endpoint.error_body(status.as_u16(), &message, retry_s),
        )
    } else if request.is_null() && reply == &Reply::default() {
        // No script for it and nothing to read: answer like the provider would.
        let message = if had_body {
            "We could not parse the JSON body of your request."
        } else {
            "The request body is empty; it must be a JSON object."
        };
        json_response(
            StatusCode::BAD_REQUEST,
            &endpoint.error_body(400, message, None),
        )
    } else {
        let mut response = success(endpoint, reply, turn, request, stream);
        *response.status_mut() = status;
        response
    };
    for (name, value) in &reply.headers {
        // Checked when the script was loaded.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&script::header_bytes(value)),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn success(
    endpoint: Endpoint,
    reply: &Reply,
    turn: &Turn,
    request: &Value,
    stream: bool,
) -> Response<Body> {
    if endpoint == Endpoint::Embeddings {
        return json_response(StatusCode::OK, &openai::embeddings(turn, reply, request));
    }
    if let Endpoint::Gemini { method, sse } = endpoint {
        return gemini_success(method, sse, reply, turn, request);
    }
    if endpoint == Endpoint::CountTokens {
        // The mock's own estimate of the prompt (the same it reports as usage).
        return json_response(
            StatusCode::OK,
            &serde_json::json!({ "input_tokens": turn.prompt_tokens }),
        );
    }
    let answer = Answer::new(reply, turn.prompt_tokens);
    if !stream {
        let body = match endpoint {
            Endpoint::Messages | Endpoint::CountTokens => anthropic::message(turn, &answer),
            Endpoint::Responses => responses::unary(turn, &answer),
            Endpoint::Chat | Endpoint::Embeddings | Endpoint::Gemini { .. } => {
                openai::chat_completion(turn, &answer)
            }
        };
        return json_response(StatusCode::OK, &body);
    }
    let spec = reply.stream.clone().unwrap_or_default();
    let mut plan = match endpoint {
        Endpoint::Messages | Endpoint::CountTokens => anthropic::message_stream(turn, &answer),
        Endpoint::Responses => responses::stream(turn, &answer),
        Endpoint::Chat | Endpoint::Embeddings | Endpoint::Gemini { .. } => {
            let include_usage =
                answer.reports_usage && spec.include_usage.unwrap_or(turn.usage_requested);
            openai::chat_stream(turn, &answer, include_usage)
        }
    };
    if let Some(message) = &spec.error_message {
        plan.error_event = match endpoint {
            Endpoint::Messages | Endpoint::CountTokens => anthropic::stream_error_event(message),
            Endpoint::Responses => responses::stream_error_event(message),
            Endpoint::Chat | Endpoint::Embeddings | Endpoint::Gemini { .. } => {
                openai::stream_error_event(message)
            }
        };
    }
    let mut response = Response::new(sse::body(sse::schedule(plan, &spec)));
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}

/// A Gemini call's success: a generation (unary or streamed), a count or embeddings.
fn gemini_success(
    method: gemini::Method,
    sse: bool,
    reply: &Reply,
    turn: &Turn,
    request: &Value,
) -> Response<Body> {
    let answer = Answer::new(reply, turn.prompt_tokens);
    let thinking = reply.thinking.as_deref();
    match method {
        gemini::Method::Generate => {
            json_response(StatusCode::OK, &gemini::unary(turn, &answer, thinking))
        }
        gemini::Method::CountTokens => json_response(StatusCode::OK, &gemini::count_tokens(turn)),
        gemini::Method::Embed | gemini::Method::BatchEmbed => {
            json_response(StatusCode::OK, &gemini::embed(method, reply, request))
        }
        gemini::Method::Stream => {
            let spec = reply.stream.clone().unwrap_or_default();
            let mut plan = gemini::stream(turn, &answer, thinking, sse);
            if let Some(message) = &spec.error_message {
                plan.error_event = gemini::stream_error_event(message, sse);
            }
            let mut response = Response::new(sse::body(sse::schedule(plan, &spec)));
            let content_type = if sse {
                "text/event-stream"
            } else {
                "application/json; charset=UTF-8"
            };
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
        }
    }
}
