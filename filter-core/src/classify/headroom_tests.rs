use super::headroom::headroom;
use super::window::MAX_RATE_LIMIT_COOLDOWN_MS;
use super::*;

#[test]
fn reads_openai_headers() {
    let h = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
    };
    let headers = h(&[
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-remaining-tokens", "1500"),
        ("x-ratelimit-reset-requests", "6m0s"),
        ("x-ratelimit-reset-tokens", "20ms"),
    ]);
    assert_eq!(headroom(&headers, 1000), (0, 1500, 1020));
    assert_eq!(headroom(&[], 1000), (-1, -1, 0));
    let far = h(&[
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "72h"),
    ]);
    assert_eq!(
        headroom(&far, 1000),
        (0, -1, 1000 + MAX_RATE_LIMIT_COOLDOWN_MS)
    );
    assert_eq!(parse_reset_duration("1h2m3.5s"), Some(3_723_500));
    assert_eq!(parse_reset_duration("2"), Some(2000));
    assert_eq!(parse_reset_duration("bogus"), None);
    let anthropic = h(&[
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", "2026-12-01T00:00:12Z"),
    ]);
    assert_eq!(
        headroom(&anthropic, 1_796_083_200_000),
        (0, -1, 1_796_083_212_000)
    );
    assert_eq!(
        parse_rfc3339("2026-12-01T00:00:12.5Z"),
        Some(1_796_083_212_500)
    );
    assert_eq!(parse_rfc3339("2026-12-01T00:00:12+02:00"), None);
}
