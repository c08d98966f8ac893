//! The gateway's error answers: a code of the one closed set (`ai_router_contract::error_code`,
//! which gives its status, OpenAI `type` and default message) and the OpenAI error object
//! clients parse.

use ai_router_contract::error_code::ErrorCode;
use serde_json::json;

use ai_router_contract::failure::ErrorClass;

/// An error the gateway answers with instead of a provider's reply.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayError {
    /// The code's status; the provider's for `upstream_invalid_request`.
    pub status: u16,
    pub code: ErrorCode,
    pub message: String,
    pub param: Option<&'static str>,
    /// Seconds for `Retry-After`, when the gateway knows when to come back.
    pub retry_after_s: Option<u64>,
    /// The routing trail of a refusal the front stage decides (what ruled out each candidate),
    /// sent in `error.trail` like a final error's.
    pub trail: Option<crate::answer::trail::Trail>,
}

impl GatewayError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: code.status(),
            code,
            message: message.into(),
            param: None,
            retry_after_s: None,
            trail: None,
        }
    }

    /// `code` with its default message.
    pub fn of(code: ErrorCode) -> Self {
        Self::new(code, code.message())
    }

    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn with_retry_after(mut self, seconds: Option<u64>) -> Self {
        self.retry_after_s = seconds;
        self
    }

    /// The refusal names what ruled out each candidate; an empty trail adds nothing.
    pub fn with_trail(mut self, trail: crate::answer::trail::Trail) -> Self {
        self.trail = (trail != crate::answer::trail::Trail::default()).then_some(trail);
        self
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(ErrorCode::NotFound, format!("Unknown route: {path}"))
    }

    pub fn missing_api_key() -> Self {
        Self::of(ErrorCode::MissingApiKey)
    }

    pub fn invalid_api_key() -> Self {
        Self::of(ErrorCode::InvalidApiKey)
    }

    pub fn not_ready() -> Self {
        Self::new(
            ErrorCode::PoolUnavailable,
            "The gateway has not received its configuration from the control plane yet.",
        )
        .with_retry_after(Some(1))
    }

    /// The OpenAI `type` that goes with the status sent.
    pub fn error_type(&self) -> &'static str {
        ai_router_contract::openai_error_type(self.status)
    }

    /// `{"error":{"message","type","param","code"}}`
    pub fn body(&self) -> Vec<u8> {
        self.body_naming(self.param)
    }

    /// [`GatewayError::body`] naming `param` as the field at fault (a provider's own, passed on
    /// with its refusal).
    pub fn body_naming(&self, param: Option<&str>) -> Vec<u8> {
        json!({
            "error": {
                "message": self.message,
                "type": self.error_type(),
                "param": param,
                "code": self.code.as_str(),
            }
        })
        .to_string()
        .into_bytes()
    }
}

/// The `param` of a provider's OpenAI-shaped error body (`{"error":{"param":"messages"}}`):
/// the field it refused, which the client's answer keeps.
pub fn provider_param(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let param = value.get("error")?.get("param")?.as_str()?;
    (!param.is_empty()).then(|| param.to_owned())
}

/// An error object for a provider's refusal that is passed to the client (not retried): the
/// provider's status and message under the gateway's code.
pub fn upstream_invalid_request(status: u16, message: &str) -> GatewayError {
    let message = if message.is_empty() {
        format!("The provider refused the request with status {status}.")
    } else {
        message.to_string()
    };
    GatewayError {
        status,
        ..GatewayError::new(ErrorCode::UpstreamInvalidRequest, message)
    }
}

/// The gateway's final answer when calls have run out of lanes or attempts, by the class of
/// the last failure.
pub fn final_error(class: Option<ErrorClass>, retry_at_ms: Option<i64>, now: i64) -> GatewayError {
    let wait = retry_at_ms.map(|t| ((t - now).max(0) as u64).div_ceil(1000).max(1));
    match class {
        Some(ErrorClass::RateLimit) => {
            GatewayError::of(ErrorCode::PoolRateLimited).with_retry_after(wait)
        }
        Some(ErrorClass::Quota) => GatewayError::of(ErrorCode::PoolQuotaExhausted)
            .with_retry_after(Some(wait.unwrap_or(300))),
        Some(ErrorClass::Auth) => {
            GatewayError::of(ErrorCode::PoolAuthFailed).with_retry_after(Some(wait.unwrap_or(300)))
        }
        Some(ErrorClass::Deadline) => GatewayError::of(ErrorCode::PoolTimeout),
        Some(ErrorClass::ContextLength) => GatewayError {
            status: 400,
            ..GatewayError::new(
                ErrorCode::UpstreamInvalidRequest,
                "The prompt is too long for every lane this call could still use.",
            )
        },
        Some(
            class @ (ErrorClass::Transient
            | ErrorClass::Network
            | ErrorClass::Timeout
            | ErrorClass::Stream
            | ErrorClass::Mismatch),
        ) => {
            let last = match class {
                ErrorClass::Network => "the provider could not be reached",
                ErrorClass::Timeout => "the provider did not answer within the policy's timeoutMs",
                ErrorClass::Stream => "the provider's stream broke off before its first token",
                ErrorClass::Mismatch => "the answer did not match the request",
                _ => "the provider failed",
            };
            GatewayError::new(
                ErrorCode::UpstreamError,
                format!(
                    "Every attempt failed upstream; the last one: {} ({last}).",
                    class.as_str()
                ),
            )
        }
        _ => GatewayError::of(ErrorCode::PoolUnavailable).with_retry_after(wait),
    }
}

/// With no attempt sent, none failed upstream: lanes out for their breakers (class transient)
/// make the error table's "no lane can serve it", `pool_unavailable`, not `upstream_error`.
pub fn unsent_as_unavailable(class: Option<ErrorClass>, sent: u32) -> Option<ErrorClass> {
    class.filter(|c| sent > 0 || final_error(Some(*c), None, 0).code != ErrorCode::UpstreamError)
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
    fn a_providers_param_is_read_from_its_error_body_and_passed_on() {
        let body = br#"{"error":{"message":"bad","type":"invalid_request_error","param":"messages[0].role","code":null}}"#;
        let param = provider_param(body);
        assert_eq!(param.as_deref(), Some("messages[0].role"));
        let answer = upstream_invalid_request(400, "bad").body_naming(param.as_deref());
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v["error"]["param"], "messages[0].role");
        assert_eq!(v["error"]["code"], "upstream_invalid_request");
        for none in [
            &br#"{"error":{"message":"bad","param":null}}"#[..],
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#,
            b"data: {}",
        ] {
            assert_eq!(provider_param(none), None);
        }
    }

    #[test]
    fn param_is_carried() {
        let e = GatewayError::new(ErrorCode::MissingModel, "no model").with_param("model");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}
