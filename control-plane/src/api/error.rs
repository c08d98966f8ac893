//! How the control plane answers an error: an [`ApiError`] carries one [`ErrorCode`] of the
//! gateway's closed set (`ai_router_contract::error_code`, shared with the filter and Envoy's
//! replies: status, OpenAI `type`, gRPC code) and a message.
//!
//! Each module keeps its own `thiserror` enum for what went wrong inside it; whatever crosses a
//! wire (HTTP, gRPC) is turned into an [`ApiError`].

pub use ai_router_contract::error_code::ErrorCode;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

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

    pub fn http_status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub fn grpc_code(&self) -> tonic::Code {
        tonic::Code::from(self.code.grpc() as i32)
    }

    /// `{ "error": { "message", "type", "param", "code" } }`
    pub fn openai_body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.code.openai_type(),
                "param": null,
                "code": self.code.as_str(),
            }
        })
    }
}

impl From<ApiError> for tonic::Status {
    fn from(err: ApiError) -> Self {
        tonic::Status::new(err.grpc_code(), err.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.http_status(), axum::Json(self.openai_body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_store_failure_answers_without_the_stores_own_text() {
        let driver = "postgres: relation \"virtual_keys\" does not exist";
        let err = ApiError::from(crate::keys::store::KeyStoreError::Storage(driver.into()));
        assert_eq!(
            err.http_status(),
            axum::http::StatusCode::INTERNAL_SERVER_ERROR
        );
        let body = err.openai_body().to_string();
        assert!(
            !body.contains("postgres") && !body.contains("relation"),
            "{body}"
        );
        assert!(body.contains("The key store failed"), "{body}");
    }

    #[test]
    fn one_code_maps_to_every_surface() {
        let err = ApiError::new(ErrorCode::InvalidApiKey, "bad sync token");
        assert_eq!(err.http_status(), StatusCode::UNAUTHORIZED);
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
