//! The gateway's error answers: one closed set of codes, each with its HTTP status and the
//! OpenAI error object clients parse.

use serde_json::json;

/// An error the gateway answers with instead of a provider's reply.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
    /// Seconds for `Retry-After`, when the gateway knows when to come back.
    pub retry_after_s: Option<u64>,
}

impl GatewayError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            param: None,
            retry_after_s: None,
        }
    }

    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn with_retry_after(mut self, seconds: Option<u64>) -> Self {
        self.retry_after_s = seconds;
        self
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(404, "not_found", format!("Unknown route: {path}"))
    }

    pub fn missing_api_key() -> Self {
        Self::new(
            401,
            "missing_api_key",
            "No API key provided. Send your virtual key as 'Authorization: Bearer sk-starci-...'.",
        )
    }

    pub fn invalid_api_key() -> Self {
        Self::new(
            401,
            "invalid_api_key",
            "The API key is unknown, revoked or disabled.",
        )
    }

    pub fn not_ready() -> Self {
        Self::new(
            503,
            "pool_unavailable",
            "The gateway has not received its configuration from the control plane yet.",
        )
        .with_retry_after(Some(1))
    }

    /// The OpenAI `type` that goes with a status.
    pub fn error_type(&self) -> &'static str {
        ai_router_contract::openai_error_type(self.status)
    }

    /// `{"error":{"message","type","param","code"}}`
    pub fn body(&self) -> Vec<u8> {
        json!({
            "error": {
                "message": self.message,
                "type": self.error_type(),
                "param": self.param,
                "code": self.code,
            }
        })
        .to_string()
        .into_bytes()
    }
}

/// An error object for a provider's refusal that is passed to the client (not retried): the
/// provider's status and message under the gateway's code.
pub fn upstream_invalid_request(status: u16, message: &str) -> GatewayError {
    let message = if message.is_empty() {
        format!("The provider refused the request with status {status}.")
    } else {
        message.to_string()
    };
    GatewayError::new(status, "upstream_invalid_request", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_openai_shaped() {
        let e = GatewayError::invalid_api_key();
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(v["error"]["type"], "authentication_error");
        assert!(v["error"]["param"].is_null());
        assert!(v["error"]["message"].as_str().unwrap().contains("revoked"));
    }

    #[test]
    fn param_is_carried() {
        let e = GatewayError::new(400, "missing_model", "no model").with_param("model");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}
