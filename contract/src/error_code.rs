//! The closed set of error codes the gateway answers with, whoever answers: the filter (the
//! data path), the control plane (its admin and sync APIs) and Envoy's own replies on the public
//! listener. Each code has its HTTP status, the OpenAI error `type` that goes with it
//! ([`openai_error_type`] of the status), a default message and a gRPC code.
//!
//! Two codes are sent with a status that is not theirs: `upstream_invalid_request` carries the
//! provider's refusal status, `gateway_error` whatever status Envoy answered; the `type` then
//! follows the status sent. `stream_interrupted` is an error event inside a stream already
//! answered 200.

use crate::openai_error_type;

/// Every code of the gateway's OpenAI error objects (`error.code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorCode {
    // The request.
    /// A body or parameter that is not what the route takes.
    InvalidRequest,
    /// The body is not a JSON object.
    InvalidJson,
    /// The body is larger than `gateway.maxBodyBytes` (or Envoy's limit).
    RequestTooLarge,
    /// The request names no model.
    MissingModel,
    /// No model or profile of the pool has that name.
    ModelNotFound,
    /// The key may not call that model or profile.
    ModelNotAllowed,
    /// No model of that name can serve this kind of request.
    ModelNotSupported,
    /// An unknown route or record.
    NotFound,
    MethodNotAllowed,
    // Credentials.
    /// No credential where one is required.
    MissingApiKey,
    /// A credential that does not match (a virtual key, the sync token, the admin token).
    InvalidApiKey,
    // A virtual key's quotas (429, with `Retry-After`).
    RequestsPerMinuteExceeded,
    TokensPerDayExceeded,
    CostPerDayExceeded,
    CostPerMonthExceeded,
    /// A hard budget policy (`budgets:`) is spent for its window, or this call's estimate is
    /// past a per-request budget (429; `Retry-After` until the window ends).
    BudgetExceeded,
    // The pool.
    /// No lane can serve the call now (or the gateway has no configuration yet).
    PoolUnavailable,
    /// Every key that could serve the call is rate limited.
    PoolRateLimited,
    /// Every key that could serve the call has spent its quota.
    PoolQuotaExhausted,
    /// Every key that could serve the call was refused by its provider.
    PoolAuthFailed,
    /// The call's deadline passed.
    PoolTimeout,
    /// Every attempt failed upstream.
    UpstreamError,
    /// The provider refused the request itself; sent with the provider's status.
    UpstreamInvalidRequest,
    /// A stream failed after its first token: the error event that ends it (the status, 200,
    /// went long before; the `type` is that of 502).
    StreamInterrupted,
    // The control plane.
    /// The admin API is off (no admin token configured).
    AdminDisabled,
    /// The admin token's scope does not cover the route (`read` cannot reset, ...).
    InsufficientScope,
    /// The change conflicts with the record (a revoked key cannot be rotated).
    Conflict,
    /// A mounted key cannot be revoked, rotated or updated: it changes by redeploying.
    KeyMounted,
    /// The control plane cannot answer now (shutting down).
    Unavailable,
    /// A fault of the gateway itself.
    Internal,
    // Envoy's own replies on the public listener.
    RequestTimeout,
    UpgradeRequired,
    HeaderTooLarge,
    /// Any other refusal of Envoy's; sent with Envoy's status.
    GatewayError,
}

/// A gRPC status code, by its canonical number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum GrpcCode {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl ErrorCode {
    pub const ALL: [Self; 34] = [
        Self::InvalidRequest,
        Self::InvalidJson,
        Self::RequestTooLarge,
        Self::MissingModel,
        Self::ModelNotFound,
        Self::ModelNotAllowed,
        Self::ModelNotSupported,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::MissingApiKey,
        Self::InvalidApiKey,
        Self::RequestsPerMinuteExceeded,
        Self::TokensPerDayExceeded,
        Self::CostPerDayExceeded,
        Self::CostPerMonthExceeded,
        Self::BudgetExceeded,
        Self::PoolUnavailable,
        Self::PoolRateLimited,
        Self::PoolQuotaExhausted,
        Self::PoolAuthFailed,
        Self::PoolTimeout,
        Self::UpstreamError,
        Self::UpstreamInvalidRequest,
        Self::StreamInterrupted,
        Self::AdminDisabled,
        Self::InsufficientScope,
        Self::Conflict,
        Self::KeyMounted,
        Self::Unavailable,
        Self::Internal,
        Self::RequestTimeout,
        Self::UpgradeRequired,
        Self::HeaderTooLarge,
        Self::GatewayError,
    ];

    /// `error.code`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::InvalidJson => "invalid_json",
            Self::RequestTooLarge => "request_too_large",
            Self::MissingModel => "missing_model",
            Self::ModelNotFound => "model_not_found",
            Self::ModelNotAllowed => "model_not_allowed",
            Self::ModelNotSupported => "model_not_supported",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::MissingApiKey => "missing_api_key",
            Self::InvalidApiKey => "invalid_api_key",
            Self::RequestsPerMinuteExceeded => "requests_per_minute_exceeded",
            Self::TokensPerDayExceeded => "tokens_per_day_exceeded",
            Self::CostPerDayExceeded => "cost_per_day_exceeded",
            Self::CostPerMonthExceeded => "cost_per_month_exceeded",
            Self::BudgetExceeded => "budget_exceeded",
            Self::PoolUnavailable => "pool_unavailable",
            Self::PoolRateLimited => "pool_rate_limited",
            Self::PoolQuotaExhausted => "pool_quota_exhausted",
            Self::PoolAuthFailed => "pool_auth_failed",
            Self::PoolTimeout => "pool_timeout",
            Self::UpstreamError => "upstream_error",
            Self::UpstreamInvalidRequest => "upstream_invalid_request",
            Self::StreamInterrupted => "stream_interrupted",
            Self::AdminDisabled => "admin_disabled",
            Self::InsufficientScope => "insufficient_scope",
            Self::Conflict => "conflict",
            Self::KeyMounted => "key_mounted",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal_error",
            Self::RequestTimeout => "request_timeout",
            Self::UpgradeRequired => "upgrade_required",
            Self::HeaderTooLarge => "header_too_large",
            Self::GatewayError => "gateway_error",
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// The HTTP status it is sent with (for `upstream_invalid_request` and `gateway_error`,
    /// when the provider's or Envoy's status is not known).
    pub fn status(self) -> u16 {
        match self {
            Self::InvalidRequest
            | Self::InvalidJson
            | Self::MissingModel
            | Self::ModelNotSupported
            | Self::UpstreamInvalidRequest => 400,
            Self::MissingApiKey | Self::InvalidApiKey => 401,
            Self::ModelNotAllowed | Self::AdminDisabled | Self::InsufficientScope => 403,
            Self::NotFound | Self::ModelNotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::RequestTimeout => 408,
            Self::Conflict | Self::KeyMounted => 409,
            Self::RequestTooLarge => 413,
            Self::UpgradeRequired => 426,
            Self::RequestsPerMinuteExceeded
            | Self::TokensPerDayExceeded
            | Self::CostPerDayExceeded
            | Self::CostPerMonthExceeded
            | Self::BudgetExceeded => 429,
            Self::HeaderTooLarge => 431,
            Self::Internal | Self::GatewayError => 500,
            Self::UpstreamError | Self::StreamInterrupted => 502,
            Self::PoolUnavailable
            | Self::PoolRateLimited
            | Self::PoolQuotaExhausted
            | Self::PoolAuthFailed
            | Self::Unavailable => 503,
            Self::PoolTimeout => 504,
        }
    }

    /// The OpenAI error `type` at its own status.
    pub fn openai_type(self) -> &'static str {
        openai_error_type(self.status())
    }

    /// The message when the one answering has nothing more precise to say.
    pub fn message(self) -> &'static str {
        match self {
            Self::InvalidRequest => "The request is not valid.",
            Self::InvalidJson => "The request body is not valid JSON.",
            Self::RequestTooLarge => "The request is too large.",
            Self::MissingModel => "The request has no model.",
            Self::ModelNotFound => "The model does not exist in this gateway's pool.",
            Self::ModelNotAllowed => "This key may not call this model.",
            Self::ModelNotSupported => "No model of that name can serve this request.",
            Self::NotFound => "Not found.",
            Self::MethodNotAllowed => "The method is not allowed on this route.",
            Self::MissingApiKey => {
                "No API key provided. Send your virtual key as 'Authorization: Bearer sk-starci-...' or as 'x-api-key: sk-starci-...'."
            }
            Self::InvalidApiKey => "The API key is unknown, revoked or disabled.",
            Self::RequestsPerMinuteExceeded => {
                "This key's requests per minute are spent; try again in the next minute."
            }
            Self::TokensPerDayExceeded => {
                "This key's quota of tokens per UTC day is spent; it resets when the window ends."
            }
            Self::CostPerDayExceeded => {
                "This key's quota of cost per UTC day is spent; it resets when the window ends."
            }
            Self::CostPerMonthExceeded => {
                "This key's quota of cost per UTC month is spent; it resets when the window ends."
            }
            Self::BudgetExceeded => {
                "A budget of this gateway is spent for its window; it resets when the window ends."
            }
            Self::PoolUnavailable => "No lane of the pool can serve this call right now.",
            Self::PoolRateLimited => "Every key that can serve this call is rate limited.",
            Self::PoolQuotaExhausted => {
                "Every key that can serve this call has spent its quota or credit."
            }
            Self::PoolAuthFailed => "Every key that can serve this call was refused by its provider.",
            Self::PoolTimeout => "The call's deadline passed.",
            Self::UpstreamError => "Every attempt failed upstream.",
            Self::UpstreamInvalidRequest => "The provider refused the request.",
            Self::StreamInterrupted => {
                "The provider's stream broke off after the answer had started; it cannot be resumed."
            }
            Self::AdminDisabled => "The admin API is off: no admin token is configured.",
            Self::InsufficientScope => "This admin token's scope does not cover this call.",
            Self::Conflict => "The change conflicts with the record.",
            Self::KeyMounted => "A mounted key changes by redeploying.",
            Self::Unavailable => "The control plane cannot answer now.",
            Self::Internal => "The gateway failed.",
            Self::RequestTimeout => "The request was not received in time.",
            Self::UpgradeRequired => "Use HTTP/1.1 or HTTP/2.",
            Self::HeaderTooLarge => "The request headers are too large.",
            Self::GatewayError => "The gateway refused the request.",
        }
    }

    /// The gRPC code of the same refusal.
    pub fn grpc(self) -> GrpcCode {
        match self {
            Self::InvalidRequest
            | Self::InvalidJson
            | Self::RequestTooLarge
            | Self::MissingModel
            | Self::ModelNotSupported
            | Self::UpstreamInvalidRequest
            | Self::HeaderTooLarge => GrpcCode::InvalidArgument,
            Self::MissingApiKey | Self::InvalidApiKey => GrpcCode::Unauthenticated,
            Self::ModelNotAllowed | Self::AdminDisabled | Self::InsufficientScope => {
                GrpcCode::PermissionDenied
            }
            Self::NotFound | Self::ModelNotFound => GrpcCode::NotFound,
            Self::MethodNotAllowed => GrpcCode::Unimplemented,
            Self::RequestTimeout | Self::PoolTimeout => GrpcCode::DeadlineExceeded,
            Self::Conflict | Self::KeyMounted | Self::UpgradeRequired => {
                GrpcCode::FailedPrecondition
            }
            Self::RequestsPerMinuteExceeded
            | Self::TokensPerDayExceeded
            | Self::CostPerDayExceeded
            | Self::CostPerMonthExceeded
            | Self::BudgetExceeded => GrpcCode::ResourceExhausted,
            Self::Internal | Self::GatewayError => GrpcCode::Internal,
            Self::PoolUnavailable
            | Self::PoolRateLimited
            | Self::PoolQuotaExhausted
            | Self::PoolAuthFailed
            | Self::UpstreamError
            | Self::StreamInterrupted
            | Self::Unavailable => GrpcCode::Unavailable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code:?} twice");
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert!(code.message().ends_with('.'), "{code:?}");
        }
        assert_eq!(ErrorCode::parse("nope"), None);
    }

    #[test]
    fn the_type_follows_the_status() {
        let table = [
            (
                ErrorCode::InvalidApiKey,
                401,
                "authentication_error",
                GrpcCode::Unauthenticated,
            ),
            (
                ErrorCode::AdminDisabled,
                403,
                "permission_error",
                GrpcCode::PermissionDenied,
            ),
            (
                ErrorCode::TokensPerDayExceeded,
                429,
                "rate_limit_error",
                GrpcCode::ResourceExhausted,
            ),
            (
                ErrorCode::ModelNotFound,
                404,
                "invalid_request_error",
                GrpcCode::NotFound,
            ),
            (
                ErrorCode::PoolRateLimited,
                503,
                "api_error",
                GrpcCode::Unavailable,
            ),
            (ErrorCode::Internal, 500, "api_error", GrpcCode::Internal),
        ];
        for (code, status, kind, grpc) in table {
            assert_eq!(
                (code.status(), code.openai_type(), code.grpc()),
                (status, kind, grpc),
                "{code:?}"
            );
        }
    }
}
