//! One provider call: route it, read it, record it and take its scripted reply, refuse what
//! the provider would refuse, answer, and deliver the answer as scripted (reset, trickled).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::Value;

use super::answer::{self, Turn};
use super::control::control;
use super::endpoint::Endpoint;
use super::http::{full, header_map, json_response, request_key, Body, NetworkFailure};
use super::listing::listing;
use super::respond::respond;
use super::script::RequestFacts;
use super::script::{Reply, ReplyError};
use super::state::{Call, Shared};
use super::{catalog, gemini, key_info, openai, sse, validate};

pub(super) async fn handle(
    shared: &Shared,
    request: Request<Incoming>,
) -> Result<Response<Body>, NetworkFailure> {
    let path = request.uri().path().to_owned();
    if path == "/_mock" || path.starts_with("/_mock/") {
        return Ok(control(shared, request).await);
    }
    if request.method() == Method::GET
        && (catalog::is_listing(&path) || key_info::is_key_info(&path))
    {
        if let Some(response) = listing(shared, &request, &path).await? {
            return Ok(response);
        }
    }
    let query = request.uri().query().unwrap_or_default().to_owned();
    let endpoint = match Endpoint::of(&path, &query) {
        Some(endpoint) if request.method() == Method::POST => endpoint,
        _ => return Ok(unknown_url(request.method(), &path)),
    };
    let call = Inbound::read(request, path, &query, endpoint).await?;
    let (seq, reply) = take_reply(shared, &call);
    if let Some(ms) = reply.latency_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if reply.error == Some(ReplyError::Network) {
        return Err(NetworkFailure);
    }
    let request_body = call.parsed.unwrap_or(Value::Null);
    if let Some(response) = refusal(endpoint, &reply, call.key.as_deref(), &request_body) {
        return Ok(response);
    }
    let turn = Turn {
        seq,
        model: call.model.unwrap_or_default(),
        prompt_tokens: answer::estimate_tokens(answer::prompt_chars(&request_body)),
        usage_requested: request_body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true),
    };
    let response = respond(
        endpoint,
        &reply,
        &turn,
        &request_body,
        call.stream,
        !call.raw.is_empty(),
    );
    Ok(deliver(response, &reply, call.stream).await)
}

/// 404 for a path no endpoint answers (or a method it does not take), as OpenAI words it.
fn unknown_url(method: &Method, path: &str) -> Response<Body> {
    json_response(
        StatusCode::NOT_FOUND,
        &openai::error_body(404, &format!("Unknown request URL: {method} {path}.")),
    )
}

/// What the mock reads from a provider call: its body, key, model, whether it streams.
struct Inbound {
    path: String,
    raw: Bytes,
    parsed: Option<Value>,
    key: Option<String>,
    model: Option<String>,
    stream: bool,
    headers: BTreeMap<String, String>,
}

impl Inbound {
    /// Reads the whole body; a client that hangs up mid-body gets nothing back either.
    async fn read(
        request: Request<Incoming>,
        path: String,
        query: &str,
        endpoint: Endpoint,
    ) -> Result<Self, NetworkFailure> {
        let (parts, body) = request.into_parts();
        let raw = body.collect().await.map_err(|_| NetworkFailure)?.to_bytes();
        let parsed: Option<Value> = serde_json::from_slice(&raw).ok();
        let gemini_call = match endpoint {
            Endpoint::Gemini { method, .. } => gemini::of(&path).map(|(model, _)| (model, method)),
            _ => None,
        };
        let key = match gemini_call {
            Some(_) => gemini::key(&parts.headers, query).or_else(|| request_key(&parts.headers)),
            None => request_key(&parts.headers),
        };
        let model = match &gemini_call {
            Some((model, _)) => Some(model.clone()),
            None => parsed
                .as_ref()
                .and_then(|body| body.get("model"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        let stream = match gemini_call {
            Some((_, method)) => method == gemini::Method::Stream,
            None => {
                endpoint != Endpoint::Embeddings
                    && parsed
                        .as_ref()
                        .and_then(|body| body.get("stream"))
                        .and_then(Value::as_bool)
                        == Some(true)
            }
        };
        Ok(Self {
            headers: header_map(&parts.headers),
            path,
            raw,
            parsed,
            key,
            model,
            stream,
        })
    }
}

/// Records the call and takes the script's reply for it (resolved): `(seq, reply)`.
fn take_reply(shared: &Shared, call: &Inbound) -> (u64, Reply) {
    let mut state = shared.lock();
    let reply = state.rules.next_reply(&RequestFacts {
        path: &call.path,
        key: call.key.as_deref(),
        model: call.model.as_deref(),
    });
    let seq = state.record(Call {
        seq: 0,
        path: call.path.clone(),
        key: call.key.clone(),
        model: call.model.clone(),
        stream: call.stream,
        headers: call.headers.clone(),
        body: call
            .parsed
            .clone()
            .unwrap_or_else(|| Value::String(String::from_utf8_lossy(&call.raw).into_owned())),
    });
    (seq, reply.unwrap_or_default().resolved())
}

/// The provider's own refusal of a request it cannot take, before any scripted answer.
fn refusal(
    endpoint: Endpoint,
    reply: &Reply,
    key: Option<&str>,
    request_body: &Value,
) -> Option<Response<Body>> {
    let (status, body) = match endpoint {
        Endpoint::Chat => validate::chat_refusal(request_body).map(|body| (400, body)),
        Endpoint::Messages => validate::messages_refusal(request_body).map(|body| (400, body)),
        // Google refuses a call without a key, or without what its method needs.
        Endpoint::Gemini { method, .. } if reply.status.is_none() && reply.body.is_none() => {
            gemini::refusal(method, key, request_body)
        }
        Endpoint::Responses
        | Endpoint::Embeddings
        | Endpoint::CountTokens
        | Endpoint::Gemini { .. } => None,
    }?;
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    Some(json_response(status, &body))
}

/// The answer as the reply scripts its delivery: cut after the headers, trickled, or whole.
async fn deliver(response: Response<Body>, reply: &Reply, stream: bool) -> Response<Body> {
    if reply.error == Some(ReplyError::ResetAfterHeaders) {
        let (parts, _) = response.into_parts();
        let abort = sse::body(vec![sse::Step::Abort {
            delay: Duration::ZERO,
        }]);
        return Response::from_parts(parts, abort);
    }
    match reply.trickle_ms {
        Some(ms) if !stream => trickled(response, Duration::from_millis(ms)).await,
        _ => response,
    }
}

/// Pieces a unary answer's body takes when trickled.
const TRICKLE_PIECES: usize = 8;

/// The same answer with its body sent in [`TRICKLE_PIECES`] pieces, `gap` apart.
async fn trickled(response: Response<Body>, gap: Duration) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        return Response::from_parts(parts, full(Bytes::new()));
    };
    let bytes = collected.to_bytes();
    let size = bytes.len().div_ceil(TRICKLE_PIECES).max(1);
    let steps = (0..bytes.len())
        .step_by(size)
        .map(|start| sse::Step::Send {
            delay: if start == 0 { Duration::ZERO } else { gap },
            bytes: bytes.slice(start..(start + size).min(bytes.len())),
        })
        .collect();
    let mut parts = parts;
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    Response::from_parts(parts, sse::body(steps))
}
