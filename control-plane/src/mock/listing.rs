//! A model listing (`GET …/models`) or a key's credit (`GET …/key`), from the script.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::Value;

use super::http::{header_map, json_response, request_key, Body, NetworkFailure};
use super::script::RequestFacts;
use super::state::{Call, Shared};
use super::{anthropic, key_info, openai};

/// A model listing (`GET …/models`) from the script's catalog, or a key's credit (`GET …/key`)
/// from its `keyInfo`, recorded as a call; a rule matching the path answers it instead.
/// `None`: the script has neither for the path.
pub(super) async fn listing(
    shared: &Shared,
    request: &Request<Incoming>,
    path: &str,
) -> Result<Option<Response<Body>>, NetworkFailure> {
    let key = request_key(request.headers());
    let anthropic_version = request.headers().contains_key("anthropic-version");
    let query = request.uri().query().unwrap_or_default().to_owned();
    let (reply, body) = {
        let mut state = shared.lock();
        let body = if key_info::is_key_info(path) {
            let Some(info) = state.rules.key_info() else {
                return Ok(None);
            };
            info.answer(key.as_deref())
        } else {
            let Some(catalog) = state.rules.catalog() else {
                return Ok(None);
            };
            catalog.listing(key.as_deref(), anthropic_version, &query)
        };
        state.record(Call {
            seq: 0,
            path: path.to_owned(),
            key: key.clone(),
            model: None,
            stream: false,
            headers: header_map(request.headers()),
            body: Value::Null,
        });
        let reply = state.rules.next_listing_reply(&RequestFacts {
            path,
            key: key.as_deref(),
            model: None,
        });
        (reply.map(|r| r.resolved()), body)
    };
    let Some(reply) = reply else {
        return Ok(Some(json_response(StatusCode::OK, &body)));
    };
    if let Some(ms) = reply.latency_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if reply.error.is_some() {
        return Err(NetworkFailure);
    }
    let status = reply
        .status
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::OK);
    let answer = match (&reply.body, status.is_success()) {
        (Some(scripted), _) => scripted.clone(),
        (None, true) => body,
        (None, false) => {
            let message = format!(
                "The ai-router mock answered {} as scripted.",
                status.as_u16()
            );
            if anthropic_version {
                anthropic::error_body(status.as_u16(), &message)
            } else {
                openai::error_body(status.as_u16(), &message)
            }
        }
    };
    Ok(Some(json_response(status, &answer)))
}
