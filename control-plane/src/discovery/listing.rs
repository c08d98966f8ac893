//! One key's model listing, per provider kind: the request (`GET {baseUrl}/models` with the
//! key's auth) and the answer's model ids. Pure, so each kind's shape is tested without a
//! network.
//!
//! - OpenAI and every OpenAI-compatible kind: `{"data":[{"id":…}]}` (a bare list of
//!   objects is accepted too); Gemini's OpenAI endpoint names its models `models/<id>`, and the
//!   id is what follows.
//! - Anthropic: `GET /v1/models?limit=1000` with `x-api-key` and `anthropic-version`,
//!   `{"data":[{"type":"model","id":…}],"has_more","last_id"}`, paged by `after_id`.

use serde_json::Value;

use crate::config::ProviderKind;
use crate::engine::discovered::ListingJob;

/// The `anthropic-version` a listing sends.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Pages read of a paged catalog at most.
pub const MAX_PAGES: usize = 20;
/// Models taken from one listing at most.
pub const MAX_MODELS: usize = 5_000;
/// The longest model id taken.
const MAX_ID_LEN: usize = 256;

/// The URL of one page: the first (`after` empty) or the one after `after`.
pub fn url(job: &ListingJob, after: Option<&str>) -> String {
    let base = format!(
        "{}://{}{}/models",
        job.endpoint.scheme, job.endpoint.authority, job.endpoint.base_path
    );
    match (job.kind, after) {
        (ProviderKind::Anthropic, None) => format!("{base}?limit=1000"),
        (ProviderKind::Anthropic, Some(after)) => {
            format!("{base}?limit=1000&after_id={}", query_value(after))
        }
        _ => base,
    }
}

/// Percent-encodes what a query value may not hold as is.
fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The headers of a listing request: the provider's own, then the key's auth (and
/// Anthropic's version). The auth value holds the secret: it goes nowhere but the request.
pub fn headers(job: &ListingJob) -> Vec<(String, String)> {
    let mut out = job.headers.clone();
    let auth = job.kind.auth_header();
    if auth == "authorization" {
        out.push((auth.to_owned(), format!("Bearer {}", job.secret.expose())));
    } else {
        out.push((auth.to_owned(), job.secret.expose().to_owned()));
    }
    if job.kind == ProviderKind::Anthropic {
        out.push(("anthropic-version".to_owned(), ANTHROPIC_VERSION.to_owned()));
    }
    out
}

/// One page's model ids, and the id to read the next page after (Anthropic's `has_more`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub ids: Vec<String>,
    pub next_after: Option<String>,
}

/// Reads a listing answer's body.
pub fn parse(kind: ProviderKind, body: &[u8]) -> Result<Page, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the catalog is not JSON: {e}"))?;
    let items = match &value {
        Value::Array(items) => items,
        other => other
            .get("data")
            .or_else(|| other.get("models"))
            .and_then(Value::as_array)
            .ok_or("the catalog has no `data` list")?,
    };
    let ids: Vec<String> = items
        .iter()
        .filter_map(|item| item.get("id").or_else(|| item.get("name"))?.as_str())
        .map(|id| match kind {
            ProviderKind::Gemini => id.strip_prefix("models/").unwrap_or(id),
            _ => id,
        })
        .filter(|id| !id.is_empty() && id.len() <= MAX_ID_LEN && !id.chars().any(char::is_control))
        .map(str::to_owned)
        .collect();
    let more = value.get("has_more").and_then(Value::as_bool) == Some(true);
    let next_after = match (kind, more) {
        (ProviderKind::Anthropic, true) => value
            .get("last_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    };
    Ok(Page { ids, next_after })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::secrets::Secret;
    use crate::config::Endpoint;

    fn job(kind: ProviderKind, base_path: &str) -> ListingJob {
        ListingJob {
            provider: "p".into(),
            key: "a".into(),
            kind,
            endpoint: Endpoint {
                scheme: "https".into(),
                authority: "api.example.com".into(),
                base_path: base_path.into(),
            },
            headers: vec![("x-org".into(), "org-1".into())],
            secret: Secret::new("sk-listing"),
            fingerprint: 1,
        }
    }

    #[test]
    fn openai_compatible_kinds_list_with_a_bearer_token() {
        let j = job(ProviderKind::Groq, "/openai/v1");
        assert_eq!(url(&j, None), "https://api.example.com/openai/v1/models");
        let h = headers(&j);
        assert!(h.contains(&("authorization".into(), "Bearer sk-listing".into())));
        assert!(h.contains(&("x-org".into(), "org-1".into())));
        let page = parse(
            ProviderKind::Groq,
            br#"{"object":"list","data":[{"id":"llama-3.3-70b","object":"model"},{"id":"whisper"},{"nope":1}]}"#,
        );
        assert_eq!(
            page,
            Ok(Page {
                ids: vec!["llama-3.3-70b".into(), "whisper".into()],
                next_after: None
            })
        );
        // A bare list of objects.
        assert_eq!(
            parse(ProviderKind::OpenaiCompatible, br#"[{"id":"m1"}]"#).map(|p| p.ids),
            Ok(vec!["m1".to_owned()])
        );
    }

    #[test]
    fn gemini_ids_lose_their_models_prefix() {
        let page = parse(
            ProviderKind::Gemini,
            br#"{"object":"list","data":[{"id":"models/gemini-2.5-flash","object":"model","owned_by":"google"}]}"#,
        );
        assert_eq!(page.map(|p| p.ids), Ok(vec!["gemini-2.5-flash".to_owned()]));
    }

    #[test]
    fn anthropic_lists_with_its_key_header_and_pages() {
        let j = job(ProviderKind::Anthropic, "/v1");
        assert_eq!(
            url(&j, None),
            "https://api.example.com/v1/models?limit=1000"
        );
        assert_eq!(
            url(&j, Some("claude a/b")),
            "https://api.example.com/v1/models?limit=1000&after_id=claude%20a%2Fb"
        );
        let h = headers(&j);
        assert!(h.contains(&("x-api-key".into(), "sk-listing".into())));
        assert!(h.contains(&("anthropic-version".into(), ANTHROPIC_VERSION.into())));
        assert!(!h.iter().any(|(n, _)| n == "authorization"));
        let body = br#"{"data":[{"type":"model","id":"claude-sonnet-4-5","display_name":"Claude Sonnet 4.5","created_at":"2025-09-29T00:00:00Z"}],"has_more":true,"first_id":"claude-sonnet-4-5","last_id":"claude-sonnet-4-5"}"#;
        assert_eq!(
            parse(ProviderKind::Anthropic, body),
            Ok(Page {
                ids: vec!["claude-sonnet-4-5".into()],
                next_after: Some("claude-sonnet-4-5".into())
            })
        );
    }

    #[test]
    fn what_is_no_catalog_is_an_error() {
        assert!(parse(ProviderKind::Openai, b"<html>").is_err());
        assert!(parse(ProviderKind::Openai, br#"{"error":{"message":"no"}}"#).is_err());
    }
}
