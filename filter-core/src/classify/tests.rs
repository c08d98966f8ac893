use super::window::{MAX_QUOTA_HOLD_MS, MAX_RATE_LIMIT_COOLDOWN_MS};
use super::*;
use ai_router_contract::failure::{ErrorClass, Hold};

fn c(kind: &str, status: u16, body: &str) -> ErrorClass {
    classify(kind, status, &[], body.as_bytes(), 0).class
}

/// The kinds of the provider matrix, from the one enum.
fn kinds() -> Vec<&'static str> {
    (1..)
        .map_while(|n| ai_router_proto::v1::ProviderKind::try_from(n).ok())
        .map(|kind| kind.text())
        .collect()
}

/// A 400 that repeats `value` from the request, in the error shapes providers answer with.
fn echoing_400s(value: &str) -> Vec<String> {
    let q = |m: String| serde_json::to_string(&m).unwrap_or_default();
    vec![
        // OpenAI's unknown value.
        format!(
            r#"{{"error":{{"message":{},"type":"invalid_request_error","param":"messages[0].role","code":"invalid_value"}}}}"#,
            q(format!("Invalid value: '{value}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'."))
        ),
        // Anthropic's unknown field (the path is the client's).
        format!(
            r#"{{"type":"error","error":{{"type":"invalid_request_error","message":{}}}}}"#,
            q(format!("{value}: Extra inputs are not permitted"))
        ),
        // Google's INVALID_ARGUMENT.
        format!(
            r#"[{{"error":{{"code":400,"message":{},"status":"INVALID_ARGUMENT"}}}}]"#,
            q(format!("Invalid value at 'contents[0].role' (TYPE_STRING), \"{value}\""))
        ),
        // DashScope.
        format!(
            r#"{{"code":"InvalidParameter","message":{}}}"#,
            q(format!("Role must be in [user, assistant] but got '{value}'"))
        ),
        // vLLM and other OpenAI-compatible servers (pydantic).
        format!(
            r#"{{"object":"error","message":{},"type":"BadRequestError","param":null,"code":400}}"#,
            q(format!("[{{'type': 'literal_error', 'msg': \"Input should be 'user' or 'assistant'\", 'input': '{value}'}}]"))
        ),
        // A bare message.
        format!(r#"{{"error":{{"message":{}}}}}"#, q(format!("unknown role {value}"))),
        // Cloudflare's envelope.
        format!(
            r#"{{"errors":[{{"message":{},"code":5006}}],"success":false}}"#,
            q(format!("AiError: Bad input: role {value}"))
        ),
    ]
}

/// What a tenant could write into a request to take a shared key out, if the words of an
/// answer that repeats it were trusted.
const KEY_WORDS: [&str; 8] = [
    "incorrect api key",
    "Invalid API Key",
    "usage limit per month",
    "Your credit balance is too low",
    "API key not valid",
    "API key type not allowed",
    "exceeded your current quota",
    "tokens per day (TPD) daily",
];

#[test]
fn a_400_that_repeats_the_clients_words_never_holds_a_key_or_a_lane() {
    let kinds = kinds();
    assert_eq!(kinds.len(), 18);
    for kind in kinds {
        for words in KEY_WORDS {
            let client =
                format!(r#"{{"model":"m","messages":[{{"role":"{words}","content":"hi"}}]}}"#);
            for body in echoing_400s(words) {
                let failure =
                    classify(kind, 400, &[], body.as_bytes(), 0).unless_echoed(client.as_bytes());
                assert_eq!(failure.hold(), Hold::Nothing, "{kind} {body}: {failure:?}");
                assert!(
                    matches!(
                        failure.class,
                        ErrorClass::InvalidRequest | ErrorClass::ContextLength
                    ),
                    "{kind} {body}: {failure:?}"
                );
            }
        }
    }
}

#[test]
fn the_same_words_in_a_field_name_or_spaced_otherwise_are_still_the_clients() {
    let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low: Extra inputs are not permitted"}}"#;
    for client in [
        r#"{"Your credit balance is too low":1}"#,
        r#"{"x":"YOUR  CREDIT\tbalance is too low"}"#,
        "Your credit balance is too low (not JSON)",
    ] {
        let failure =
            classify("anthropic", 400, &[], body.as_bytes(), 0).unless_echoed(client.as_bytes());
        assert_eq!(failure.class, ErrorClass::InvalidRequest, "{client}");
    }
}

#[test]
fn a_providers_own_refusal_still_holds_the_key_when_the_client_did_not_write_it() {
    let client = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let credit = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
    let f = classify("anthropic", 400, &[], credit.as_bytes(), 0).unless_echoed(client);
    assert_eq!((f.class, f.hold()), (ErrorClass::Quota, Hold::Key));
    // Its own words in the client's request: the provider might be repeating them.
    let asked = br#"{"messages":[{"role":"user","content":"why does it say your credit balance is too low?"}]}"#;
    let f = classify("anthropic", 400, &[], credit.as_bytes(), 0).unless_echoed(asked);
    assert_eq!(f.class, ErrorClass::InvalidRequest);
    // A status that already says auth or quota keeps holding the key, whatever the words.
    let auth = r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":null}}"#;
    let f = classify("openai", 401, &[], auth.as_bytes(), 0)
        .unless_echoed(br#"{"x":"incorrect api key"}"#);
    assert_eq!((f.class, f.hold()), (ErrorClass::Auth, Hold::Key));
    // A structured code decides without the words.
    let quota =
        r#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}"#;
    let f = classify("openai", 429, &[], quota.as_bytes(), 0)
        .unless_echoed(br#"{"x":"exceeded your current quota"}"#);
    assert_eq!(f.class, ErrorClass::Quota);
    // A 429's words about a day, when the client wrote them: the lane cools down instead.
    let tpd = r#"{"error":{"message":"Rate limit reached on tokens per day (TPD)","type":"tokens","code":"rate_limit_exceeded"}}"#;
    let f = classify("groq", 429, &[], tpd.as_bytes(), 0)
        .unless_echoed(br#"{"x":"tokens per day (TPD)"}"#);
    assert_eq!(f.class, ErrorClass::RateLimit);
}

#[test]
fn retry_after_as_seconds_or_an_http_date_in_each_form() {
    let h = |v: &str| vec![("Retry-After".to_owned(), v.to_owned())];
    // 1994-11-06T08:49:37Z
    let at = 784_111_777_000;
    let before = at - 90_000;
    assert_eq!(retry_at(&h("90"), before), Some(at));
    for date in [
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
    ] {
        assert_eq!(retry_at(&h(date), before), Some(at), "{date}");
    }
    // A date already past is now; nonsense is no window.
    assert_eq!(
        retry_at(&h("Sun, 06 Nov 1994 08:49:37 GMT"), at + 5),
        Some(at + 5)
    );
    for junk in [
        "soon",
        "Sun, 06 Foo 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 25:00:00 GMT",
        "-3",
    ] {
        assert_eq!(retry_at(&h(junk), before), None, "{junk}");
    }
    // Through the classifier, bounded as a rate limit's window is.
    let body = br#"{"error":{"code":"rate_limit_exceeded","message":"slow down"}}"#;
    let f = classify(
        "openai",
        429,
        &h("Sun, 06 Nov 1994 08:49:37 GMT"),
        body,
        before,
    );
    assert_eq!((f.class, f.retry_at_ms), (ErrorClass::RateLimit, Some(at)));
    let f = classify(
        "openai",
        429,
        &h("Sun, 06 Nov 1994 08:49:37 GMT"),
        body,
        at - 86_400_000,
    );
    assert_eq!(
        f.retry_at_ms,
        Some(at - 86_400_000 + MAX_RATE_LIMIT_COOLDOWN_MS)
    );
}

#[test]
fn geminis_refused_key_types_by_reason_or_by_any_wording() {
    let google = |status: u16, code: &str, message: &str, reason: Option<&str>| {
        let details = reason.map_or_else(
            || "[]".to_owned(),
            |r| format!(r#"[{{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"{r}","domain":"googleapis.com"}}]"#),
        );
        format!(
            r#"[{{"error":{{"code":{status},"message":"{message}","status":"{code}","details":{details}}}}}]"#
        )
    };
    let refused = [
        google(400, "INVALID_ARGUMENT", "API key type not allowed. Standard (unrestricted) API keys can no longer call the Gemini API.", Some("API_KEY_TYPE_NOT_ALLOWED")),
        google(400, "INVALID_ARGUMENT", "Request refused.", Some("API_KEY_TYPE_NOT_ALLOWED")),
        google(403, "PERMISSION_DENIED", "Requests to this API are blocked.", Some("API_KEY_SERVICE_BLOCKED")),
        google(400, "INVALID_ARGUMENT", "API key type is not allowed for this API.", None),
        google(400, "INVALID_ARGUMENT", "This API key type is not supported by the Gemini API.", None),
        google(400, "INVALID_ARGUMENT", "API keys of this type are not accepted; create a restricted key.", None),
        google(403, "PERMISSION_DENIED", "Unrestricted API keys can no longer call the Gemini API.", None),
    ];
    for body in &refused {
        let f = classify("gemini", 400, &[], body.as_bytes(), 0);
        assert_eq!(f.class, ErrorClass::Auth, "{body}");
        assert_eq!(
            f.provider_code.as_deref(),
            Some(UNSUPPORTED_KEY_TYPE),
            "{body}"
        );
    }
    // Other refusals of a key are auth without that code; other 400s are the request's.
    let invalid = google(
        400,
        "INVALID_ARGUMENT",
        "API Key not found. Please pass a valid API key.",
        Some("API_KEY_INVALID"),
    );
    let f = classify("gemini", 400, &[], invalid.as_bytes(), 0);
    assert_eq!(
        (f.class, f.provider_code.as_deref()),
        (ErrorClass::Auth, Some("400"))
    );
    let bad = google(
        400,
        "INVALID_ARGUMENT",
        "Invalid JSON payload received.",
        None,
    );
    assert_eq!(
        classify("gemini", 400, &[], bad.as_bytes(), 0).class,
        ErrorClass::InvalidRequest
    );
}

#[test]
fn a_redirect_is_a_failing_lane() {
    for status in [301, 302, 307, 308] {
        let f = classify(
            "openai",
            status,
            &[("location".into(), "https://elsewhere/".into())],
            b"",
            0,
        );
        assert_eq!(
            (f.class, f.hold()),
            (ErrorClass::Transient, Hold::Nothing),
            "{status}"
        );
    }
}

#[test]
fn statuses() {
    assert_eq!(
        c(
            "openai",
            429,
            r#"{"error":{"code":"rate_limit_exceeded","message":"Rate limit reached"}}"#
        ),
        ErrorClass::RateLimit
    );
    assert_eq!(
        c("openai", 401, r#"{"error":{"code":"invalid_api_key"}}"#),
        ErrorClass::Auth
    );
    assert_eq!(c("openai", 403, ""), ErrorClass::Auth);
    assert_eq!(c("openai", 503, ""), ErrorClass::Transient);
    assert_eq!(
        c(
            "anthropic",
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
        ),
        ErrorClass::Transient
    );
    for s in [408, 409, 425, 498, 500, 502, 504] {
        assert_eq!(c("openai-compatible", s, ""), ErrorClass::Transient, "{s}");
    }
    assert_eq!(
        c(
            "openai",
            400,
            r#"{"error":{"message":"context length exceeded","code":"context_length_exceeded"}}"#
        ),
        ErrorClass::ContextLength
    );
    assert_eq!(c("openai", 404, ""), ErrorClass::InvalidRequest);
    assert_eq!(c("openai", 422, ""), ErrorClass::InvalidRequest);
}

#[test]
fn quota_shapes() {
    assert_eq!(
        c(
            "openai",
            429,
            r#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}"#
        ),
        ErrorClass::Quota
    );
    assert_eq!(
        c(
            "openrouter",
            402,
            r#"{"error":{"code":402,"message":"Insufficient credits"}}"#
        ),
        ErrorClass::Quota
    );
    assert_eq!(
        c(
            "deepseek",
            402,
            r#"{"error":{"message":"Insufficient Balance"}}"#
        ),
        ErrorClass::Quota
    );
    assert_eq!(
        c(
            "qwen",
            400,
            r#"{"code":"Arrearage","message":"Access denied, please make sure your account is in good standing."}"#
        ),
        ErrorClass::Quota
    );
    assert_eq!(
        c(
            "anthropic",
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#
        ),
        ErrorClass::Quota
    );
    assert_eq!(
        c(
            "gemini",
            429,
            r#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"Quota exceeded for metric generate_content_free_tier_requests, limit per day"}}]"#
        ),
        ErrorClass::Quota
    );
    assert_eq!(
        c(
            "gemini",
            429,
            r#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"Resource has been exhausted (e.g. check quota)."}}]"#
        ),
        ErrorClass::RateLimit
    );
}

#[test]
fn second_shapes() {
    let spend_cap = r#"{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits. You will regain access on 2026-12-01 at 00:00 UTC."}}"#;
    // Two days before the named moment (2026-12-01T00:00Z).
    let now = 1_796_083_200_000 - 2 * ai_router_contract::calendar::DAY_MS;
    let f = classify("anthropic", 400, &[], spend_cap.as_bytes(), now);
    assert_eq!(f.class, ErrorClass::Quota);
    assert_eq!(f.retry_at_ms, Some(1_796_083_200_000));
    // A month before it: held a week, then tried again.
    let f = classify(
        "anthropic",
        400,
        &[],
        spend_cap.as_bytes(),
        now - 28 * ai_router_contract::calendar::DAY_MS,
    );
    assert_eq!(
        f.retry_at_ms,
        Some(now - 28 * ai_router_contract::calendar::DAY_MS + MAX_QUOTA_HOLD_MS)
    );
    let gemini = r#"[{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"}]}}]"#;
    assert_eq!(c("gemini", 400, gemini), ErrorClass::Auth);
}

#[test]
fn auth_in_4xx_body() {
    assert_eq!(
        c(
            "qwen",
            400,
            r#"{"code":"InvalidApiKey","message":"Invalid API-key provided."}"#
        ),
        ErrorClass::Auth
    );
}

#[test]
fn retry_after_headers() {
    let h = vec![("Retry-After".to_string(), "2".to_string())];
    assert_eq!(retry_at(&h, 1000), Some(3000));
    let h = vec![
        ("retry-after-ms".to_string(), "250".to_string()),
        ("retry-after".to_string(), "9".to_string()),
    ];
    assert_eq!(retry_at(&h, 1000), Some(1250));
    assert_eq!(retry_at(&[], 1000), None);
}

#[test]
fn stream_error_events() {
    let e: Value =
        serde_json::from_str(r#"{"error":{"message":"overloaded","type":"server_error"}}"#)
            .unwrap();
    assert_eq!(
        classify_stream_error("openai", None, &e, 0).class,
        ErrorClass::Transient
    );
    let e: Value = serde_json::from_str(r#"{"error":{"message":"boom"}}"#).unwrap();
    assert_eq!(
        classify_stream_error("openai", None, &e, 0).class,
        ErrorClass::Stream
    );
    let e: Value = serde_json::from_str(r#"{"error":{"message":"slow down","code":429}}"#).unwrap();
    assert_eq!(
        classify_stream_error("openrouter", None, &e, 0).class,
        ErrorClass::RateLimit
    );
}

#[test]
fn provider_windows_are_capped() {
    let h = |name: &str, value: &str| vec![(name.to_string(), value.to_string())];
    let now = 1_000_000;
    // A rate limit asking for three days cools the lane an hour.
    let f = classify(
        "openai",
        429,
        &h("retry-after", "259200"),
        br#"{"error":{"code":"rate_limit_exceeded","message":"slow down"}}"#,
        now,
    );
    assert_eq!(f.class, ErrorClass::RateLimit);
    assert_eq!(f.retry_at_ms, Some(now + MAX_RATE_LIMIT_COOLDOWN_MS));
    // A retry-after on a transient failure too.
    let f = classify("openai", 503, &h("retry-after-ms", "90000000"), b"", now);
    assert_eq!(
        (f.class, f.retry_at_ms),
        (
            ErrorClass::Transient,
            Some(now + MAX_RATE_LIMIT_COOLDOWN_MS)
        )
    );
    // A spent quota asking for a month holds the key a week.
    let f = classify(
        "openai",
        429,
        &h("retry-after", "2592000"),
        br#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}"#,
        now,
    );
    assert_eq!(f.class, ErrorClass::Quota);
    assert_eq!(f.retry_at_ms, Some(now + MAX_QUOTA_HOLD_MS));
    // Within the caps, the provider's window stands; a moment already past is now.
    let f = classify("openai", 429, &h("retry-after", "30"), b"", now);
    assert_eq!(f.retry_at_ms, Some(now + 30_000));
    assert_eq!(
        reset_moment("999", 1_700_000_000_000),
        Some(1_700_000_999_000)
    );
    let past = classify(
        "openrouter",
        429,
        &h("X-RateLimit-Reset", "1600000000000"),
        b"",
        now * 2_000_000,
    );
    assert_eq!(past.retry_at_ms, Some(now * 2_000_000));
}

#[test]
fn reset_moments_in_response_headers_and_messages() {
    let free_daily = br#"{"error":{"message":"Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day","code":429}}"#;
    let now = 1_796_000_000_000;
    let f = classify(
        "openrouter",
        429,
        &[("X-RateLimit-Reset".into(), "1796083200000".into())],
        free_daily,
        now,
    );
    assert_eq!(
        (f.class, f.retry_at_ms),
        (ErrorClass::Quota, Some(1_796_083_200_000))
    );
    // Seconds since the epoch are read as such.
    assert_eq!(reset_moment("1796083200", now), Some(1_796_083_200_000));
    assert_eq!(
        try_again_in("Please try again in 31m2.4s. Need more tokens?"),
        Some(1_862_400)
    );
    assert_eq!(try_again_in("Please try again in 120ms."), Some(120));
    assert_eq!(try_again_in("try again later"), None);
}

#[test]
fn gemini_without_details_falls_back_to_the_message() {
    let daily = br#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"You exceeded your current quota. Quota exceeded for metric generate_content_free_tier_requests, limit per day"}}]"#;
    let now = 1_784_098_799_000; // 2026-07-14 23:59:59 PDT
    let f = classify("gemini", 429, &[], daily, now);
    assert_eq!(
        (f.class, f.retry_at_ms),
        (ErrorClass::Quota, Some(now + 1000))
    );
    let minute = br#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"You exceeded your current quota, please check your plan and billing details."}}]"#;
    assert_eq!(
        classify("gemini", 429, &[], minute, now).class,
        ErrorClass::RateLimit
    );
}

#[test]
fn retryability() {
    assert!(ErrorClass::RateLimit.retryable());
    assert!(!ErrorClass::InvalidRequest.retryable());
    assert!(ErrorClass::Auth.belongs_to_key());
    assert!(!ErrorClass::Transient.belongs_to_key());
    for c in [
        "rate_limit",
        "quota",
        "auth",
        "transient",
        "network",
        "timeout",
        "stream",
        "invalid_request",
        "cancelled",
        "deadline",
    ] {
        assert_eq!(ErrorClass::parse(c).unwrap().as_str(), c);
    }
}
