//! The mock's model catalog: what `GET …/models` lists, per key, in OpenAI's shape
//! (`{"object":"list","data":[{"id","object":"model",…}]}`) or Anthropic's
//! (`{"data":[{"type":"model","id",…}],"has_more","first_id","last_id"}`, paged by `limit` and
//! `after_id`).
//!
//! ```yaml
//! catalog:
//!   models: [m-shared]              # what a key lists unless `keys` names it
//!   keys: { sk-test-1: [m-shared, m-only-one] }
//!   shape: anthropic                # optional: else Anthropic's when the request carries
//!                                   # anthropic-version, OpenAI's otherwise
//! ```
//!
//! Without a catalog the path is unknown (404), as before. A rule whose `match.path` is a
//! suffix of the listing path (`/models`) answers it instead (a failure, a latency); rules
//! without a path never do, so the replies scripted for calls are not used up by listings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `catalog:` in a script.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// What every key lists unless `keys` names it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// A key's own list (by the bearer token of `authorization`, else `x-api-key`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<String, Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Shape>,
}

/// Whose listing shape the catalog answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    Openai,
    Anthropic,
}

/// A GET of a model listing: any path ending in `/models`.
pub fn is_listing(path: &str) -> bool {
    path.trim_end_matches('/').ends_with("/models")
}

impl Catalog {
    /// The ids `key` lists.
    pub fn models_of(&self, key: Option<&str>) -> &[String] {
        key.and_then(|k| self.keys.get(k)).unwrap_or(&self.models)
    }

    /// The listing body for `key`; `anthropic_version`: the request carried that header;
    /// `query`: the request's query string (Anthropic's paging).
    pub fn listing(&self, key: Option<&str>, anthropic_version: bool, query: &str) -> Value {
        let ids = self.models_of(key);
        match self.shape {
            Some(Shape::Anthropic) => anthropic_page(ids, query),
            None if anthropic_version => anthropic_page(ids, query),
            _ => json!({
                "object": "list",
                "data": ids.iter().map(|id| json!({
                    "id": id,
                    "object": "model",
                    "created": 1_700_000_000,
                    "owned_by": "ai-router-mock",
                })).collect::<Vec<_>>(),
            }),
        }
    }
}

/// One page of Anthropic's `GET /v1/models`: `limit` (default 20, at most 1000) ids after
/// `after_id`.
fn anthropic_page(ids: &[String], query: &str) -> Value {
    let param = |name: &str| {
        query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            (k == name).then(|| v.to_owned())
        })
    };
    let limit = param("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(20)
        .clamp(1, 1000);
    let start = param("after_id")
        .and_then(|after| ids.iter().position(|id| *id == after).map(|i| i + 1))
        .unwrap_or(0);
    let page: Vec<&String> = ids.iter().skip(start).take(limit).collect();
    json!({
        "data": page.iter().map(|id| json!({
            "type": "model",
            "id": id,
            "display_name": id,
            "created_at": "2025-01-01T00:00:00Z",
        })).collect::<Vec<_>>(),
        "has_more": start + page.len() < ids.len(),
        "first_id": page.first(),
        "last_id": page.last(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog {
            models: vec!["shared".into()],
            keys: BTreeMap::from([(
                "sk-1".to_owned(),
                vec!["a".to_owned(), "b".to_owned(), "c".to_owned()],
            )]),
            shape: None,
        }
    }

    #[test]
    fn each_key_lists_its_own_models_in_the_openai_shape() {
        let c = catalog();
        let one = c.listing(Some("sk-1"), false, "");
        let ids: Vec<&str> = one["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["id"].as_str())
            .collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(one["object"], "list");
        let other = c.listing(Some("sk-2"), false, "");
        assert_eq!(other["data"][0]["id"], "shared");
        assert_eq!(c.listing(None, false, "")["data"][0]["id"], "shared");
        assert!(is_listing("/v1/models") && is_listing("/anthropic/v1/models/"));
        assert!(!is_listing("/v1/models/gpt-4o") && !is_listing("/v1/chat/completions"));
    }

    #[test]
    fn the_anthropic_shape_pages_by_after_id() {
        let c = Catalog {
            shape: Some(Shape::Anthropic),
            ..catalog()
        };
        let first = c.listing(Some("sk-1"), false, "limit=2");
        assert_eq!(first["data"][0]["type"], "model");
        assert_eq!(
            (first["has_more"].as_bool(), first["last_id"].as_str()),
            (Some(true), Some("b"))
        );
        let rest = c.listing(Some("sk-1"), false, "limit=2&after_id=b");
        assert_eq!(rest["data"][0]["id"], "c");
        assert_eq!(rest["has_more"], false);
        // Without a shape, the request's anthropic-version decides.
        assert_eq!(
            catalog().listing(None, true, "")["data"][0]["type"],
            "model"
        );
    }
}
