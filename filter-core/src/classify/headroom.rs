//! The rate-limit headroom a provider reports in its headers.

use ai_router_contract::kinds::RateLimitWindow;

use super::when::{header, parse_reset_duration, parse_rfc3339};
use super::window::MAX_RATE_LIMIT_COOLDOWN_MS;

/// The rate-limit headroom a provider reported: remaining requests, remaining tokens (-1 when
/// absent) and the earliest reset (ms since the epoch, 0 when absent).
pub fn headroom(headers: &[(String, String)], now_ms: i64) -> (i64, i64, i64) {
    headroom_in(
        headers,
        (RateLimitWindow::Minute, RateLimitWindow::Minute),
        now_ms,
    )
}

/// [`headroom`] for a provider whose `-requests` and `-tokens` headers count over `windows`
/// (Groq: requests per day, tokens per minute). A spent day holds the lane until its own reset
/// (capped at a day): the token minute's reset does not lift it.
pub fn headroom_in(
    headers: &[(String, String)],
    windows: (RateLimitWindow, RateLimitWindow),
    now_ms: i64,
) -> (i64, i64, i64) {
    let get = |names: &[&str]| names.iter().find_map(|n| header(headers, n));
    let number = |names: &[&str]| get(names).and_then(|v| v.parse::<i64>().ok()).unwrap_or(-1);
    let requests = number(&[
        "x-ratelimit-remaining-requests",
        "anthropic-ratelimit-requests-remaining",
    ]);
    let tokens = number(&[
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-tokens-remaining",
    ]);
    let durations = [
        get(&["x-ratelimit-reset-requests"]).and_then(|v| parse_reset_duration(&v)),
        get(&["x-ratelimit-reset-tokens"]).and_then(|v| parse_reset_duration(&v)),
    ];
    // Anthropic names the moment: anthropic-ratelimit-*-reset: 2026-11-29T18:00:30Z.
    let moments = [
        get(&["anthropic-ratelimit-requests-reset"]).and_then(|v| parse_rfc3339(&v)),
        get(&["anthropic-ratelimit-tokens-reset"]).and_then(|v| parse_rfc3339(&v)),
    ];
    let cap = |window: RateLimitWindow| match window {
        RateLimitWindow::Minute => MAX_RATE_LIMIT_COOLDOWN_MS,
        RateLimitWindow::Day => ai_router_contract::calendar::DAY_MS,
    };
    let resets: [Option<i64>; 2] = [0, 1].map(|i| {
        durations[i]
            .map(|d| now_ms.saturating_add(d))
            .or(moments[i])
            .map(|at| {
                at.min(now_ms.saturating_add(cap(if i == 0 { windows.0 } else { windows.1 })))
            })
    });
    let day = RateLimitWindow::Day;
    let reset = if requests == 0 && windows.0 == day && resets[0].is_some() {
        resets[0]
    } else if tokens == 0 && windows.1 == day && resets[1].is_some() {
        resets[1]
    } else {
        // A lane out of headroom waits for its reset, but no longer than a rate limit's cap.
        resets
            .iter()
            .flatten()
            .min()
            .map(|at| (*at).min(now_ms.saturating_add(MAX_RATE_LIMIT_COOLDOWN_MS)))
    };
    (requests, tokens, reset.unwrap_or(0))
}
