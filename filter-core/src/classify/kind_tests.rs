use super::headroom::{headroom, headroom_in};
use super::*;
use ai_router_contract::failure::Hold;
use ai_router_contract::kinds::DailyReset;

#[test]
fn a_refused_key_type_is_auth_with_its_own_code() {
    let body = br#"[{"error":{"code":400,"message":"API key type not allowed. Standard keys can no longer call the Gemini API.","status":"INVALID_ARGUMENT"}}]"#;
    let f = classify("gemini", 400, &[], body, 0);
    assert_eq!(f.class, ErrorClass::Auth);
    assert_eq!(f.provider_code.as_deref(), Some(UNSUPPORTED_KEY_TYPE));
    assert_eq!(f.hold(), Hold::Key);
    // Any other 400 of Gemini's stays the caller's.
    let other = br#"[{"error":{"code":400,"message":"Invalid JSON payload received.","status":"INVALID_ARGUMENT"}}]"#;
    let f = classify("gemini", 400, &[], other, 0);
    assert_eq!(f.class, ErrorClass::InvalidRequest);
    assert_eq!(f.provider_code.as_deref(), Some("400"));
}

#[test]
fn context_length_is_its_own_class_and_other_400s_are_not() {
    let too_long = br#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error"}}"#;
    assert_eq!(
        classify("openai", 400, &[], too_long, 0).class,
        ErrorClass::ContextLength
    );
    assert_eq!(
        classify("github", 413, &[], b"", 0).class,
        ErrorClass::ContextLength
    );
    let bad = br#"{"error":{"message":"temperature must be between 0 and 2","type":"invalid_request_error"}}"#;
    assert_eq!(
        classify("openai", 400, &[], bad, 0).class,
        ErrorClass::InvalidRequest
    );
    assert!(!ErrorClass::ContextLength.retryable());
}

#[test]
fn a_daily_quota_lasts_until_the_zone_the_provider_is_configured_with() {
    let body = br#"{"message":"Tokens per day limit exceeded - too many tokens processed.","type":"too_many_requests_error","param":"quota","code":"token_quota_exceeded"}"#;
    // 2026-12-01T14:00:00Z.
    let now = 1_796_133_600_000;
    let utc = classify("cerebras", 429, &[], body, now);
    assert_eq!(utc.class, ErrorClass::Quota);
    assert_eq!(utc.retry_at_ms, Some(1_796_169_600_000));
    let china = classify_in(
        "cerebras",
        Some(DailyReset::Offset(480)),
        429,
        &[],
        body,
        now,
    );
    assert_eq!(china.retry_at_ms, Some(1_796_140_800_000));
    // No calendar: the provider named no window, so the defaults decide.
    let rolling = classify_in("cerebras", None, 429, &[], body, now);
    assert_eq!(rolling.retry_at_ms, None);
}

#[test]
fn groq_headroom_holds_a_spent_day_of_requests_past_the_token_minute() {
    let headers: Vec<(String, String)> = [
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-remaining-tokens", "5000"),
        ("x-ratelimit-reset-requests", "4h30m"),
        ("x-ratelimit-reset-tokens", "6s"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .into();
    let day = (RateLimitWindow::Day, RateLimitWindow::Minute);
    let (requests, tokens, reset) = headroom_in(&headers, day, 0);
    assert_eq!((requests, tokens), (0, 5000));
    assert_eq!(reset, 16_200_000);
    // Read as per-minute windows (OpenAI's), the sooner reset stands: the lane is tried
    // again after the token minute.
    let (_, _, minute) = headroom(&headers, 0);
    assert_eq!(minute, 6_000);
}
