//! Cloudflare's own error pages (520 to 527), as the mock serves them from the provider error
//! table (`openai-compatible.cloudflare_<status>`): each is transient, holds nothing and names
//! no window, whatever kind of provider sits behind Cloudflare. One test per page.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ai_router_contract::failure::ErrorClass;
use ai_router_contract::failure::Hold;
use ai_router_filter_core::classify::classify;

const TABLE: &str = include_str!("../../testdata/provider-errors/openai-compatible.yaml");

/// Kinds seen behind Cloudflare, and the generic one.
const KINDS: [&str; 6] = [
    "openai",
    "anthropic",
    "openrouter",
    "groq",
    "deepseek",
    "openai-compatible",
];

/// The page the table holds for `status`: its headers and body.
fn page(status: u16) -> (Vec<(String, String)>, String) {
    let table: serde_yaml_ng::Value = serde_yaml_ng::from_str(TABLE).unwrap();
    let name = format!("cloudflare_{status}");
    let case = table["cases"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some(name.as_str()))
        .unwrap_or_else(|| panic!("{name} is not in the table"));
    assert_eq!(case["status"].as_u64(), Some(u64::from(status)));
    let headers = case["headers"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_owned(),
                v.as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (headers, case["body"].as_str().unwrap().to_owned())
}

fn check(status: u16) {
    let (headers, body) = page(status);
    assert!(body.contains("cloudflare"), "a Cloudflare page");
    for kind in KINDS {
        let failure = classify(kind, status, &headers, body.as_bytes(), 1_780_000_000_000);
        assert_eq!(failure.class, ErrorClass::Transient, "{kind} {status}");
        assert_eq!(failure.hold(), Hold::Nothing, "{kind} {status}");
        assert_eq!(failure.retry_at_ms, None, "{kind} {status}");
        assert!(
            !failure.message.contains("<html"),
            "{kind} {status}: the page is not the message: {}",
            failure.message
        );
    }
}

#[test]
fn cloudflare_520_unknown_error() {
    check(520);
}

#[test]
fn cloudflare_521_web_server_down() {
    check(521);
}

#[test]
fn cloudflare_522_connection_timed_out() {
    check(522);
}

#[test]
fn cloudflare_523_origin_unreachable() {
    check(523);
}

#[test]
fn cloudflare_524_timeout() {
    check(524);
}

#[test]
fn cloudflare_525_ssl_handshake_failed() {
    check(525);
}

#[test]
fn cloudflare_526_invalid_ssl_certificate() {
    check(526);
}

#[test]
fn cloudflare_527_railgun_error() {
    check(527);
}
