//! The closed set of error codes the control plane answers with, and their mapping to an HTTP
//! status, a gRPC code and the OpenAI error object, in one place.
//!
//! Each module keeps its own `thiserror` enum for what went wrong inside it; whatever crosses a
//! wire (HTTP, gRPC) is turned into an [`ApiError`] carrying one [`ErrorCode`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Every code the control plane's own surfaces answer with. The data-path codes (quota,
/// upstream, pool) are answered by the filter; the ones here are the control plane's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// A body that could not be parsed or is not what the route takes.
    InvalidRequest,
    /// No credential where one is required.
    MissingApiKey,
    /// A credential that does not match (the sync token, the admin token).
    InvalidApiKey,
    /// The admin API is off (no admin token configured).
    AdminDisabled,
    /// An unknown route or record.
    NotFound,
    /// The change conflicts with the record (e.g. a revoked key cannot be rotated).
    Conflict,
    /// A mounted key cannot be revoked, rotated or updated: it changes by redeploying.
    KeyMounted,
    /// The service cannot answer now (no usable provider, shutting down).
    Unavailable,
    /// A fault of the control plane itself.
    Internal,
}

impl ErrorCode {
    /// The `code` of the OpenAI error object.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::MissingApiKey => "missing_api_key",
            Self::InvalidApiKey => "invalid_api_key",
            Self::AdminDisabled => "admin_disabled",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::KeyMounted => "key_mounted",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal_error",
        }
    }

    /// The `type` of the OpenAI error object.
    pub fn error_type(self) -> &'static str {
        ai_router_contract::openai_error_type(self.http_status().as_u16())
    }

    pub fn http_status(self) -> StatusCode {
        match self {
            Self::InvalidRequest => StatusCode::BAD_REQUEST,
            Self::MissingApiKey | Self::InvalidApiKey => StatusCode::UNAUTHORIZED,
            Self::AdminDisabled => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::Conflict | Self::KeyMounted => StatusCode::CONFLICT,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn grpc_code(self) -> tonic::Code {
        match self {
            Self::InvalidRequest => tonic::Code::InvalidArgument,
            Self::MissingApiKey | Self::InvalidApiKey => tonic::Code::Unauthenticated,
            Self::AdminDisabled => tonic::Code::PermissionDenied,
            Self::NotFound => tonic::Code::NotFound,
            Self::Conflict | Self::KeyMounted => tonic::Code::FailedPrecondition,
            Self::Unavailable => tonic::Code::Unavailable,
            Self::Internal => tonic::Code::Internal,
        }
    }
}

/// An error as it leaves the control plane. The message must never carry a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `{ "error": { "message", "type", "param", "code" } }`
    pub fn openai_body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.code.error_type(),
                "param": null,
                "code": self.code.as_str(),
            }
        })
    }
}

impl From<ApiError> for tonic::Status {
    fn from(err: ApiError) -> Self {
        tonic::Status::new(err.code.grpc_code(), err.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.code.http_status(), axum::Json(self.openai_body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_code_maps_to_every_surface() {
        let err = ApiError::new(ErrorCode::InvalidApiKey, "bad sync token");
        assert_eq!(err.code.http_status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            tonic::Status::from(err.clone()).code(),
            tonic::Code::Unauthenticated
        );
        let body = err.openai_body();
        assert_eq!(body["error"]["code"], "invalid_api_key");
        assert_eq!(body["error"]["type"], "authentication_error");
        assert_eq!(body["error"]["message"], "bad sync token");
    }

    #[test]
    fn into_response_uses_the_status() {
        let response = ApiError::new(ErrorCode::NotFound, "no such route").into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
}
