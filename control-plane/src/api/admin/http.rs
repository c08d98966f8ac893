//! What the HTTP handlers share: the answer type, the JSON body reader and the answer builder.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::Json;
use serde_json::Value;

use crate::api::error::{ApiError, ErrorCode};

pub(super) type Answer = Result<(StatusCode, Json<Value>), ApiError>;

pub(super) fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("invalid body: {e}")))
}

pub(super) fn ok(status: StatusCode, value: impl serde::Serialize) -> Answer {
    let value = serde_json::to_value(value)
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
    Ok((status, Json(value)))
}
