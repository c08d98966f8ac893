//! The codes and phrases providers answer with, by what they mean (a spent quota, a refused key,
//! a rate limit, a per-day window, an overload, a prompt too long, a refused key type), across
//! the provider families: each entry names the providers it comes from where it is theirs alone.

pub(super) const QUOTA_CODES: &[&str] = &[
    "insufficient_quota",
    "billing_error",
    "billing_hard_limit_reached",
    "arrearage",
    "insufficient_balance",
    "insufficient_credits",
    "payment_required",
    "quota_exceeded",
    "credit_balance_too_low",
    // DashScope's "use free tier only" mode with the free tier spent: lifted in the console.
    "allocationquota.freetieronly",
];
pub(super) const QUOTA_TEXT: &[&str] = &[
    "exceeded your current quota",
    "insufficient balance",
    "insufficient credits",
    "credit balance is too low",
    "billing",
    "spend limit",
    "spending limit",
    "arrearage",
    "payment required",
    "out of credits",
    "free-models-per-day",
    "quota exceeded for",
    "daily limit",
    "api usage limits",
    "usage limit",
    // OpenRouter's per-key credit limit, which its owner raises or which resets.
    "key limit exceeded",
    "free tier of the model has been exhausted",
    // SiliconFlow's spent balance; Cloudflare's spent neurons; Cohere's trial month.
    "balance is insufficient",
    "daily free allocation",
    "/ month",
    "per month",
];
/// Codes a provider gives an answer that repeats a value of the request (OpenAI's `Invalid
/// value: '<value>'`): about the request, whatever the repeated words say.
pub(super) const ECHO_CODES: &[&str] = &["invalid_value", "invalid_enum_value", "invalid_type"];
/// Refusals of the key itself that some providers send with a 400.
pub(super) const AUTH_TEXT: &[&str] = &[
    "api key not valid",
    "api_key_invalid",
    "invalid api key",
    "incorrect api key",
    "invalid x-api-key",
];
pub(super) const AUTH_CODES: &[&str] = &[
    "invalid_api_key",
    "authentication_error",
    "permission_error",
    "invalidapikey",
    "unauthenticated",
    "permission_denied",
    "invalid_authentication",
    "api_key_invalid",
    "accessdenied",
    // Groq: the organization behind the key is restricted; every call with it fails.
    "organization_restricted",
];
pub(super) const RATE_CODES: &[&str] = &[
    "rate_limit_exceeded",
    "rate_limit_error",
    "throttling",
    "rate_limited",
    "limit_requests",
    "throttling.ratequota",
    "throttling.allocationquota",
];
/// A limit over a per-day budget (Groq's and OpenAI's TPD/RPD, Cerebras's and SambaNova's
/// "per day", GitHub's `UserByModelByDay`). Under a rate-limit code it holds the lane until the
/// window ends, at most [`super::window::MAX_DAILY_LIMIT_COOLDOWN_MS`]; without one, it is a
/// spent quota.
pub(super) const PER_DAY_TEXT: &[&str] =
    &["(tpd)", "(rpd)", "per day", "byday", "per 86400s", "daily"];
/// A 429 about the provider's load, not the key's rate (Moonshot's engine_overloaded_error,
/// Z.ai's 1305): nothing cools down but the breakers count it.
pub(super) const OVERLOAD_TEXT: &[&str] = &["overloaded"];
/// What providers say when the prompt is past the model's window or their per-request cap.
pub(super) const CONTEXT_CODES: &[&str] = &["context_length_exceeded", "tokens_limit_reached"];
pub(super) const CONTEXT_TEXT: &[&str] = &[
    "context length",
    "context_length",
    "context window",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "too large for model",
    "exceeded model token limit",
    "reduce the length of the messages",
    "max_seq_len",
    "exceeds max length",
    "request body too large",
    "input is too long",
];
/// Google refuses some key types outright (unrestricted "standard" keys): the key will never
/// work, whatever is retried.
pub(super) const KEY_TYPE_TEXT: &[&str] = &[
    "key type is not allowed",
    "key type not allowed",
    "key type is not supported",
    "key type not supported",
    "keys of this type are not",
    "unrestricted api keys can no longer",
    "unrestricted) api keys can no longer",
    "standard api keys can no longer",
];
/// Google's ErrorInfo reasons for a key the API refuses whatever is retried: its type, or the
/// key being blocked from this API.
pub(super) const KEY_TYPE_REASONS: &[&str] = &[
    "api_key_type_not_allowed",
    "api_key_type_not_supported",
    "api_key_service_blocked",
];
pub(super) const OVERLOAD_CODES: &[&str] = &[
    "overloaded_error",
    "server_error",
    "unavailable",
    "internal",
];
