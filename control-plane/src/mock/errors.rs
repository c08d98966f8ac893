//! The provider error table: each provider's real error answers (status, headers and body as
//! the provider sends them), to script with `providerError: "<kind>.<case>"`.
//!
//! Every kind has the five common cases ([`ERROR_CASES`]); some have second shapes (a daily
//! free tier, a spend cap, a billing limit...) listed by [`provider_error_names`]. Messages
//! never hold a real key: where a provider echoes the key, a masked test value stands in.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::script::Reply;

/// The provider kinds of the pool.
pub const PROVIDER_KINDS: [&str; 8] = [
    "openai",
    "anthropic",
    "openrouter",
    "qwen",
    "deepseek",
    "gemini",
    "groq",
    "openai-compatible",
];

/// The cases every kind answers.
pub const ERROR_CASES: [&str; 5] = [
    "rate_limited",
    "quota_exhausted",
    "invalid_key",
    "overloaded",
    "bad_request",
];

/// The second shapes, per kind.
const EXTRA_CASES: [(&str, &[&str]); 8] = [
    (
        "openai",
        &[
            "billing_hard_limit",
            "tokens_rate_limited",
            "server_error",
            "region_unsupported",
            "model_not_found",
        ],
    ),
    (
        "anthropic",
        &[
            "spend_cap",
            "billing_error",
            "permission_denied",
            "api_error",
            "request_too_large",
        ],
    ),
    (
        "openrouter",
        &[
            "free_daily",
            "key_limit",
            "credits_for_max_tokens",
            "no_auth",
        ],
    ),
    (
        "qwen",
        &[
            "free_tier_exhausted",
            "allocation_quota",
            "content_filtered",
            "native_invalid_key",
            "native_throttling",
            "native_arrearage",
        ],
    ),
    (
        "deepseek",
        &["invalid_format", "invalid_parameters", "server_error"],
    ),
    ("gemini", &["free_daily", "leaked_key", "permission_denied"]),
    (
        "groq",
        &[
            "tokens_per_day",
            "flex_capacity",
            "organization_restricted",
            "request_too_large",
        ],
    ),
    (
        "openai-compatible",
        &["vllm_context_length", "ollama_model_not_found"],
    ),
];

/// Every `<kind>.<case>` the table holds.
pub fn provider_error_names() -> Vec<String> {
    let mut names = Vec::new();
    for kind in PROVIDER_KINDS {
        for case in ERROR_CASES {
            names.push(format!("{kind}.{case}"));
        }
        for (extra_kind, cases) in EXTRA_CASES {
            if extra_kind == kind {
                names.extend(cases.iter().map(|case| format!("{kind}.{case}")));
            }
        }
    }
    names
}

/// A `<kind>.<case>` name from the table.
pub fn provider_error_by_name(name: &str) -> Option<Reply> {
    let (kind, case) = name.split_once('.')?;
    provider_error(kind, case)
}

/// The provider's real answer for an error case: status, headers and body.
pub fn provider_error(kind: &str, case: &str) -> Option<Reply> {
    let now = unix_now_secs();
    let (status, headers, body): (u16, &[(&str, &str)], Value) = match (kind, case) {
        // OpenAI: {"error":{message,type,param,code}}; x-ratelimit-* on every answer.
        ("openai", "rate_limited") => (
            429,
            &[
                ("retry-after", "1"),
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "120ms"),
                ("x-ratelimit-limit-tokens", "200000"),
                ("x-ratelimit-remaining-tokens", "199500"),
                ("x-ratelimit-reset-tokens", "150ms"),
            ],
            openai_error(
                "Rate limit reached for gpt-4o-mini in organization org-mock on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms. Visit https://platform.openai.com/account/rate-limits to learn more.",
                json!("requests"),
                json!("rate_limit_exceeded"),
            ),
        ),
        ("openai", "tokens_rate_limited") => (
            429,
            &[
                ("retry-after", "6"),
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-remaining-requests", "499"),
                ("x-ratelimit-reset-requests", "120ms"),
                ("x-ratelimit-limit-tokens", "30000"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "5.2s"),
            ],
            openai_error(
                "Rate limit reached for gpt-4o in organization org-mock on tokens per min (TPM): Limit 30000, Used 29622, Requested 2603. Please try again in 4.45s. Visit https://platform.openai.com/account/rate-limits to learn more.",
                json!("tokens"),
                json!("rate_limit_exceeded"),
            ),
        ),
        ("openai", "quota_exhausted") => (
            429,
            &[],
            openai_error(
                "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
                json!("insufficient_quota"),
                json!("insufficient_quota"),
            ),
        ),
        ("openai", "billing_hard_limit") => (
            400,
            &[],
            openai_error(
                "Billing hard limit has been reached",
                json!("invalid_request_error"),
                json!("billing_hard_limit_reached"),
            ),
        ),
        ("openai", "invalid_key") => (
            401,
            &[],
            openai_error(
                "Incorrect API key provided: sk-test-************************mock. You can find your API key at https://platform.openai.com/account/api-keys.",
                json!("invalid_request_error"),
                json!("invalid_api_key"),
            ),
        ),
        ("openai", "overloaded") => (
            503,
            &[],
            openai_error(
                "The engine is currently overloaded, please try again later",
                json!("server_error"),
                Value::Null,
            ),
        ),
        ("openai", "server_error") => (
            500,
            &[],
            openai_error(
                "The server had an error while processing your request. Sorry about that!",
                json!("server_error"),
                Value::Null,
            ),
        ),
        ("openai", "bad_request") => (
            400,
            &[],
            json!({"error": {
                "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130532 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }}),
        ),
        ("openai", "region_unsupported") => (
            403,
            &[],
            openai_error(
                "Country, region, or territory not supported",
                json!("request_forbidden"),
                json!("unsupported_country_region_territory"),
            ),
        ),
        ("openai", "model_not_found") => (
            404,
            &[],
            openai_error(
                "The model `gpt-mock` does not exist or you do not have access to it.",
                json!("invalid_request_error"),
                json!("model_not_found"),
            ),
        ),

        // Anthropic: {"type":"error","error":{type,message},"request_id"}; retry-after and
        // anthropic-ratelimit-* on a 429. Spent credit and a spend cap are 400s.
        ("anthropic", "rate_limited") => (
            429,
            &[
                ("retry-after", "12"),
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-input-tokens-limit", "40000"),
                ("anthropic-ratelimit-input-tokens-remaining", "40000"),
                ("anthropic-ratelimit-output-tokens-limit", "8000"),
                ("anthropic-ratelimit-output-tokens-remaining", "8000"),
            ],
            anthropic_error(
                "rate_limit_error",
                "This request would exceed the rate limit for your organization (00000000-0000-0000-0000-000000000000) of 50 requests per minute. For details, refer to: https://docs.anthropic.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce your request rate or contact sales at https://www.anthropic.com/contact-sales to discuss your options for a rate limit increase.",
            ),
        ),
        ("anthropic", "quota_exhausted") => (
            400,
            &[],
            anthropic_error(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
            ),
        ),
        ("anthropic", "spend_cap") => (
            400,
            &[],
            anthropic_error(
                "invalid_request_error",
                &format!(
                    "You have reached your specified API usage limits. You will regain access on {} at 00:00 UTC.",
                    first_of_next_month(now)
                ),
            ),
        ),
        ("anthropic", "billing_error") => (
            402,
            &[],
            anthropic_error(
                "billing_error",
                "There's an issue with your billing or payment information. Please check your Plans & Billing settings.",
            ),
        ),
        ("anthropic", "invalid_key") => (
            401,
            &[],
            anthropic_error("authentication_error", "invalid x-api-key"),
        ),
        ("anthropic", "permission_denied") => (
            403,
            &[],
            anthropic_error(
                "permission_error",
                "Your API key does not have permission to use the specified resource.",
            ),
        ),
        ("anthropic", "overloaded") => (529, &[], anthropic_error("overloaded_error", "Overloaded")),
        ("anthropic", "api_error") => (500, &[], anthropic_error("api_error", "Internal server error")),
        ("anthropic", "bad_request") => (
            400,
            &[],
            anthropic_error(
                "invalid_request_error",
                "prompt is too long: 215017 tokens > 200000 maximum",
            ),
        ),
        ("anthropic", "request_too_large") => (
            413,
            &[],
            anthropic_error("request_too_large", "Request exceeds the maximum allowed number of bytes."),
        ),

        // OpenRouter: {"error":{message,code:<number>,metadata?},"user_id"?}.
        ("openrouter", "rate_limited") => (
            429,
            &[],
            json!({"error": {
                "message": "Provider returned error",
                "code": 429,
                "metadata": {
                    "raw": "meta-llama/llama-3.3-70b-instruct:free is temporarily rate-limited upstream. Please retry shortly, or add your own key to accumulate your rate limits: https://openrouter.ai/settings/integrations",
                    "provider_name": "Mock Upstream",
                },
            }, "user_id": "user_mock"}),
        ),
        ("openrouter", "free_daily") => (
            429,
            &[],
            json!({"error": {
                "message": "Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day",
                "code": 429,
                "metadata": {
                    "headers": {
                        "X-RateLimit-Limit": "50",
                        "X-RateLimit-Remaining": "0",
                        "X-RateLimit-Reset": next_utc_midnight_ms(now).to_string(),
                    },
                    "provider_name": null,
                },
            }, "user_id": "user_mock"}),
        ),
        ("openrouter", "quota_exhausted") => (
            402,
            &[],
            json!({"error": {
                "message": "Insufficient credits. Add more using https://openrouter.ai/settings/credits",
                "code": 402,
            }}),
        ),
        ("openrouter", "credits_for_max_tokens") => (
            402,
            &[],
            json!({"error": {
                "message": "This request requires more credits, or fewer max_tokens. You requested up to 4096 tokens, but can only afford 1234. To increase, visit https://openrouter.ai/settings/credits and upgrade to a paid account",
                "code": 402,
            }, "user_id": "user_mock"}),
        ),
        ("openrouter", "key_limit") => (
            403,
            &[],
            json!({"error": {
                "message": "Key limit exceeded (total limit). Manage it using https://openrouter.ai/settings/keys",
                "code": 403,
            }}),
        ),
        ("openrouter", "invalid_key") => (
            401,
            &[],
            json!({"error": {"message": "User not found.", "code": 401}}),
        ),
        ("openrouter", "no_auth") => (
            401,
            &[],
            json!({"error": {"message": "No auth credentials found", "code": 401}}),
        ),
        ("openrouter", "overloaded") => (
            502,
            &[],
            json!({"error": {
                "message": "Provider returned error",
                "code": 502,
                "metadata": {
                    "raw": "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}",
                    "provider_name": "Anthropic",
                },
            }, "user_id": "user_mock"}),
        ),
        ("openrouter", "bad_request") => (
            400,
            &[],
            json!({"error": {
                "message": "This endpoint's maximum context length is 200000 tokens. However, you requested about 251234 tokens (247138 of text input, 4096 in the output). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.",
                "code": 400,
                "metadata": {"provider_name": null},
            }}),
        ),

        // Qwen through DashScope's compatible mode: OpenAI-shaped, with DashScope codes and a
        // request_id. The native_* cases are the native API's {code,message,request_id}.
        ("qwen", "rate_limited") => (
            429,
            &[],
            qwen_error(
                "You exceeded your current requests list.",
                "limit_requests",
                "limit_requests",
            ),
        ),
        ("qwen", "allocation_quota") => (
            429,
            &[],
            qwen_error(
                "Allocated quota exceeded, please increase your quota limit.",
                "Throttling.AllocationQuota",
                "Throttling.AllocationQuota",
            ),
        ),
        ("qwen", "quota_exhausted") => (
            400,
            &[],
            qwen_error(
                "Access denied, please make sure your account is in good standing. For details, see: https://help.aliyun.com/zh/model-studio/error-code#overdue-payment",
                "Arrearage",
                "Arrearage",
            ),
        ),
        ("qwen", "free_tier_exhausted") => (
            403,
            &[],
            qwen_error(
                "The free tier of the model has been exhausted. If you wish to continue access the model on a paid basis, please disable the \"use free tier only\" mode in the management console.",
                "AllocationQuota.FreeTierOnly",
                "AllocationQuota.FreeTierOnly",
            ),
        ),
        ("qwen", "invalid_key") => (
            401,
            &[],
            qwen_error(
                "Incorrect API key provided. ",
                "invalid_request_error",
                "invalid_api_key",
            ),
        ),
        ("qwen", "overloaded") => (
            503,
            &[],
            qwen_error(
                "Too many requests in route. Please try again later.",
                "ServiceUnavailable",
                "ServiceUnavailable",
            ),
        ),
        ("qwen", "bad_request") => (
            400,
            &[],
            qwen_error(
                "Range of input length should be [1, 129024]",
                "invalid_request_error",
                "invalid_parameter_error",
            ),
        ),
        ("qwen", "content_filtered") => (
            400,
            &[],
            qwen_error(
                "Input data may contain inappropriate content.",
                "data_inspection_failed",
                "data_inspection_failed",
            ),
        ),
        ("qwen", "native_invalid_key") => (
            401,
            &[],
            json!({"code": "InvalidApiKey", "message": "Invalid API-key provided.", "request_id": MOCK_REQUEST_ID}),
        ),
        ("qwen", "native_throttling") => (
            429,
            &[],
            json!({"code": "Throttling.RateQuota", "message": "Requests rate limit exceeded, please try again later.", "request_id": MOCK_REQUEST_ID}),
        ),
        ("qwen", "native_arrearage") => (
            400,
            &[],
            json!({"code": "Arrearage", "message": "Access denied, please make sure your account is in good standing.", "request_id": MOCK_REQUEST_ID}),
        ),

        // DeepSeek: OpenAI-shaped, with its own odd type/code pairs.
        ("deepseek", "rate_limited") => (
            429,
            &[],
            openai_error(
                "Rate Limit Reached",
                json!("rate_limit_error"),
                json!("rate_limit_exceeded"),
            ),
        ),
        ("deepseek", "quota_exhausted") => (
            402,
            &[],
            openai_error(
                "Insufficient Balance",
                json!("unknown_error"),
                json!("invalid_request_error"),
            ),
        ),
        ("deepseek", "invalid_key") => (
            401,
            &[],
            openai_error(
                "Authentication Fails, Your api key: ****mock is invalid",
                json!("authentication_error"),
                json!("invalid_request_error"),
            ),
        ),
        ("deepseek", "overloaded") => (
            503,
            &[],
            openai_error(
                "Server overloaded, please try again later.",
                json!("server_error"),
                json!("server_overloaded"),
            ),
        ),
        ("deepseek", "server_error") => (
            500,
            &[],
            openai_error(
                "Internal Server Error",
                json!("server_error"),
                json!("internal_error"),
            ),
        ),
        ("deepseek", "bad_request") => (
            400,
            &[],
            openai_error(
                "This model's maximum context length is 65536 tokens. However, you requested 72315 tokens (68219 in the messages, 4096 in the completion). Please reduce the length of the messages or completion.",
                json!("invalid_request_error"),
                json!("invalid_request_error"),
            ),
        ),
        ("deepseek", "invalid_format") => (
            400,
            &[],
            openai_error(
                "Failed to deserialize the JSON body into the target type: messages[0]: missing field `role`",
                json!("invalid_request_error"),
                json!("invalid_request_error"),
            ),
        ),
        ("deepseek", "invalid_parameters") => (
            422,
            &[],
            openai_error(
                "Model Not Exist",
                json!("invalid_request_error"),
                json!("invalid_request_error"),
            ),
        ),

        // Gemini's OpenAI endpoint: a JSON list holding one Google RPC error.
        ("gemini", "rate_limited") => (
            429,
            &[],
            gemini_error(
                429,
                "RESOURCE_EXHAUSTED",
                "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
                json!([
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [{
                            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                            "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
                            "quotaValue": "15",
                        }],
                    },
                    {
                        "@type": "type.googleapis.com/google.rpc.Help",
                        "links": [{"description": "Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}],
                    },
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "21s"},
                ]),
            ),
        ),
        ("gemini", "quota_exhausted") | ("gemini", "free_daily") => (
            429,
            &[],
            gemini_error(
                429,
                "RESOURCE_EXHAUSTED",
                "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
                json!([
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [{
                            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                            "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                            "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
                            "quotaValue": "200",
                        }],
                    },
                    {
                        "@type": "type.googleapis.com/google.rpc.Help",
                        "links": [{"description": "Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}],
                    },
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "43s"},
                ]),
            ),
        ),
        ("gemini", "invalid_key") => (
            400,
            &[],
            gemini_error(
                400,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key.",
                json!([{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                    "metadata": {"service": "generativelanguage.googleapis.com"},
                }]),
            ),
        ),
        ("gemini", "leaked_key") => (
            403,
            &[],
            gemini_error(
                403,
                "PERMISSION_DENIED",
                "Your API key was reported as leaked. Please use another API key.",
                json!([]),
            ),
        ),
        ("gemini", "permission_denied") => (
            403,
            &[],
            gemini_error(
                403,
                "PERMISSION_DENIED",
                "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
                json!([]),
            ),
        ),
        ("gemini", "overloaded") => (
            503,
            &[],
            gemini_error(
                503,
                "UNAVAILABLE",
                "The model is overloaded. Please try again later.",
                json!([]),
            ),
        ),
        ("gemini", "bad_request") => (
            400,
            &[],
            gemini_error(
                400,
                "INVALID_ARGUMENT",
                "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
                json!([]),
            ),
        ),

        // Groq: OpenAI-shaped (no param), retry-after and x-ratelimit-* on a 429.
        ("groq", "rate_limited") => (
            429,
            &[
                ("retry-after", "7"),
                ("x-ratelimit-limit-requests", "14400"),
                ("x-ratelimit-limit-tokens", "6000"),
                ("x-ratelimit-remaining-requests", "14399"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-requests", "6s"),
                ("x-ratelimit-reset-tokens", "7.66s"),
            ],
            json!({"error": {
                "message": "Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_mock` service tier `on_demand` on tokens per minute (TPM): Limit 6000, Used 5800, Requested 900. Please try again in 7s. Need more tokens? Upgrade to Dev Tier today at https://console.groq.com/settings/billing",
                "type": "tokens",
                "code": "rate_limit_exceeded",
            }}),
        ),
        ("groq", "quota_exhausted") | ("groq", "tokens_per_day") => (
            429,
            &[
                ("retry-after", "1862"),
                ("x-ratelimit-limit-requests", "1000"),
                ("x-ratelimit-remaining-requests", "812"),
                ("x-ratelimit-reset-requests", "4h30m"),
            ],
            json!({"error": {
                "message": "Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_mock` service tier `on_demand` on tokens per day (TPD): Limit 100000, Used 99580, Requested 1210. Please try again in 31m2.4s. Need more tokens? Upgrade to Dev Tier today at https://console.groq.com/settings/billing",
                "type": "tokens",
                "code": "rate_limit_exceeded",
            }}),
        ),
        ("groq", "organization_restricted") => (
            400,
            &[],
            json!({"error": {
                "message": "Organization has been restricted. Please reach out to support if you believe this was in error.",
                "type": "invalid_request_error",
                "code": "organization_restricted",
            }}),
        ),
        ("groq", "invalid_key") => (
            401,
            &[],
            json!({"error": {"message": "Invalid API Key", "type": "invalid_request_error", "code": "invalid_api_key"}}),
        ),
        ("groq", "overloaded") => (
            503,
            &[],
            json!({"error": {"message": "Service Unavailable", "type": "internal_server_error", "code": "service_unavailable"}}),
        ),
        ("groq", "flex_capacity") => (
            498,
            &[],
            json!({"error": {"message": "Flex tier capacity exceeded. This model is currently at capacity; please try again later.", "type": "capacity_exceeded", "code": "capacity_exceeded"}}),
        ),
        ("groq", "bad_request") => (
            400,
            &[],
            json!({"error": {
                "message": "Please reduce the length of the messages or completion.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }}),
        ),
        ("groq", "request_too_large") => (
            413,
            &[],
            json!({"error": {
                "message": "Request too large for model `llama-3.3-70b-versatile` in organization `org_mock` service tier `on_demand` on tokens per minute (TPM): Limit 6000, Requested 9120, please reduce your message size and try again. Need more tokens? Upgrade to Dev Tier today at https://console.groq.com/settings/billing",
                "type": "tokens",
                "code": "rate_limit_exceeded",
            }}),
        ),

        // openai-compatible servers (LiteLLM, vLLM, Ollama...): LiteLLM-style OpenAI errors,
        // plus vLLM's and Ollama's own shapes.
        ("openai-compatible", "rate_limited") => (
            429,
            &[("retry-after", "5")],
            openai_error(
                "Rate limit exceeded. Please retry after 5 seconds.",
                json!("rate_limit_error"),
                json!("429"),
            ),
        ),
        ("openai-compatible", "quota_exhausted") => (
            429,
            &[],
            openai_error(
                "You exceeded your current quota, please check your plan and billing details.",
                json!("insufficient_quota"),
                json!("insufficient_quota"),
            ),
        ),
        ("openai-compatible", "invalid_key") => (
            401,
            &[],
            openai_error(
                "Authentication Error, Invalid proxy server token passed. Received API Key = sk-...mock, Key Hash (Token) =<redacted>. Unable to find token in cache or `LiteLLM_VerificationTokenTable`",
                json!("auth_error"),
                json!("401"),
            ),
        ),
        ("openai-compatible", "overloaded") => (
            503,
            &[],
            openai_error(
                "Service Unavailable: the server is overloaded, please try again later.",
                json!("server_error"),
                json!("503"),
            ),
        ),
        ("openai-compatible", "bad_request") => (
            400,
            &[],
            openai_error(
                "Invalid request: 'messages' is a required property",
                json!("invalid_request_error"),
                json!("400"),
            ),
        ),
        ("openai-compatible", "vllm_context_length") => (
            400,
            &[],
            json!({
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you requested 5120 tokens (1024 in the messages, 4096 in the completion). Please reduce the length of the messages or completion.",
                "type": "BadRequestError",
                "param": null,
                "code": 400,
            }),
        ),
        ("openai-compatible", "ollama_model_not_found") => (
            404,
            &[],
            json!({"error": {"message": "model \"llama3\" not found, try pulling it first", "type": "api_error", "param": null, "code": null}}),
        ),
        _ => return None,
    };
    let mut all_headers: BTreeMap<String, String> = headers
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    all_headers.insert("content-type".to_owned(), "application/json".to_owned());
    Some(Reply {
        status: Some(status),
        headers: all_headers,
        body: Some(body),
        ..Reply::default()
    })
}

const MOCK_REQUEST_ID: &str = "00000000-0000-4000-8000-000000000000";

fn openai_error(message: &str, kind: Value, code: Value) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

fn anthropic_error(kind: &str, message: &str) -> Value {
    json!({
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": "req_011mockmockmockmockmock",
    })
}

fn qwen_error(message: &str, kind: &str, code: &str) -> Value {
    json!({
        "error": {"message": message, "type": kind, "param": null, "code": code},
        "request_id": MOCK_REQUEST_ID,
    })
}

fn gemini_error(code: u16, status: &str, message: &str, details: Value) -> Value {
    let mut error = json!({"code": code, "message": message, "status": status});
    if details.as_array().is_some_and(|list| !list.is_empty()) {
        error["details"] = details;
    }
    json!([{ "error": error }])
}

fn unix_now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn next_utc_midnight_ms(now_secs: i64) -> i64 {
    (now_secs.div_euclid(86_400) + 1) * 86_400_000
}

/// `YYYY-MM-01` of the month after the one holding `now_secs` (UTC).
fn first_of_next_month(now_secs: i64) -> String {
    let (year, month, _) = civil_from_days(now_secs.div_euclid(86_400));
    let (year, month) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    format!("{year:04}-{month:02}-01")
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn every_kind_answers_every_common_case() {
        for kind in PROVIDER_KINDS {
            for case in ERROR_CASES {
                let reply = provider_error(kind, case)
                    .unwrap_or_else(|| panic!("{kind}.{case} is missing"));
                let status = reply.status.unwrap();
                assert!(status >= 400, "{kind}.{case}: {status}");
                assert!(reply.body.is_some(), "{kind}.{case} has no body");
            }
        }
    }

    #[test]
    fn every_listed_name_resolves_and_nothing_else_does() {
        let names = provider_error_names();
        assert_eq!(
            names.len(),
            8 * 5 + EXTRA_CASES.iter().map(|(_, c)| c.len()).sum::<usize>()
        );
        for name in &names {
            assert!(provider_error_by_name(name).is_some(), "{name}");
        }
        for name in [
            "anthropic.spend_cap",
            "openrouter.free_daily",
            "openai.billing_hard_limit",
        ] {
            assert!(names.iter().any(|n| n == name), "{name}");
        }
        assert!(provider_error_by_name("openai.nope").is_none());
        assert!(provider_error_by_name("nope.rate_limited").is_none());
        assert!(provider_error_by_name("openai").is_none());
    }

    #[test]
    fn shapes_are_the_providers_own() {
        let get = |name: &str| provider_error_by_name(name).unwrap();
        let openai = get("openai.rate_limited");
        assert_eq!(openai.status, Some(429));
        assert!(openai.headers.contains_key("retry-after"));
        assert!(openai
            .headers
            .contains_key("x-ratelimit-remaining-requests"));
        let body = openai.body.unwrap();
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(body["error"]["type"], "requests");
        assert!(body["error"]["param"].is_null());

        assert_eq!(
            get("openai.quota_exhausted").body.unwrap()["error"]["code"],
            "insufficient_quota"
        );
        assert_eq!(
            get("openai.invalid_key").body.unwrap()["error"]["code"],
            "invalid_api_key"
        );
        assert_eq!(get("anthropic.overloaded").status, Some(529));
        assert_eq!(
            get("anthropic.rate_limited").body.unwrap()["error"]["type"],
            "rate_limit_error"
        );
        assert_eq!(
            get("anthropic.invalid_key").body.unwrap()["error"]["type"],
            "authentication_error"
        );
        assert_eq!(get("openrouter.quota_exhausted").status, Some(402));
        assert_eq!(
            get("deepseek.quota_exhausted").body.unwrap()["error"]["message"],
            "Insufficient Balance"
        );
        assert_eq!(
            get("qwen.quota_exhausted").body.unwrap()["error"]["code"],
            "Arrearage"
        );
        assert_eq!(
            get("qwen.native_invalid_key").body.unwrap()["code"],
            "InvalidApiKey"
        );
        let gemini = get("gemini.rate_limited").body.unwrap();
        assert_eq!(gemini[0]["error"]["status"], "RESOURCE_EXHAUSTED");
        assert_eq!(
            get("groq.rate_limited").body.unwrap()["error"]["code"],
            "rate_limit_exceeded"
        );

        let spend_cap = get("anthropic.spend_cap").body.unwrap();
        let message = spend_cap["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("-01 at 00:00 UTC"), "{message}");
    }

    #[test]
    fn messages_never_hold_a_plausible_real_key() {
        for name in provider_error_names() {
            let text = provider_error_by_name(&name)
                .unwrap()
                .body
                .unwrap()
                .to_string();
            // A masked test value only: no long run of key characters after a key prefix.
            for prefix in ["sk-", "sk-ant-", "sk-or-", "gsk_", "AIza"] {
                if let Some(at) = text.find(prefix) {
                    let tail: String = text[at + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric())
                        .collect();
                    assert!(tail.len() < 16, "{name}: {text}");
                }
            }
        }
    }

    #[test]
    fn calendar_helpers() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(first_of_next_month(1_703_980_800), "2024-01-01"); // 2023-12-31
        assert_eq!(first_of_next_month(1_709_164_800), "2024-03-01"); // 2024-02-29
        assert_eq!(next_utc_midnight_ms(1_709_164_801), 1_709_251_200_000);
    }
}
