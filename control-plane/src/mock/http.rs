//! The pieces every answer is built from: the body type, JSON answers, the scripted network
//! failure, the request's key and recorded headers.

use std::collections::BTreeMap;
use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::Value;

pub(super) type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// A scripted `error: network`: failing the service makes hyper close the connection without
/// writing a response.
#[derive(Debug, thiserror::Error)]
#[error("scripted network failure: connection closed without a response")]
pub(super) struct NetworkFailure;

pub(super) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

pub(super) fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The bearer token of `authorization`, else `x-api-key`.
pub(super) fn request_key(headers: &hyper::HeaderMap) -> Option<String> {
    let bearer = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        })
        .filter(|token| !token.is_empty());
    bearer.or_else(|| {
        headers
            .get("x-api-key")
            .and_then(|value| value.to_str().ok())
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    })
}

/// The request's headers as recorded in `/_mock/calls`: lowercased name → value (lossy UTF-8).
pub(super) fn header_map(headers: &hyper::HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect()
}
