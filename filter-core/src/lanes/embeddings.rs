//! Embeddings rules: a call keeps the model identity (the vector space) of its first lane, and
//! an answer whose vectors are not the declared length fails the attempt.

use serde_json::Value;

use crate::plan::Candidate;
use crate::state::State;

fn model<'a>(
    state: &'a State,
    provider: &str,
    model: &str,
) -> Option<&'a ai_router_proto::v1::Model> {
    state
        .provider(provider)
        .and_then(|(_, p)| p.models.iter().find(|m| m.id == model))
}

/// The identity of a pool model: its declared identity, else its id.
pub fn identity_of(state: &State, provider: &str, model_id: &str) -> Option<String> {
    let m = model(state, provider, model_id)?;
    Some(if m.identity.is_empty() {
        m.id.clone()
    } else {
        m.identity.clone()
    })
}

pub fn dimensions_of(state: &State, provider: &str, model_id: &str) -> Option<usize> {
    model(state, provider, model_id)
        .map(|m| m.dimensions as usize)
        .filter(|d| *d > 0)
}

/// The tiers cut down to the candidates of one identity.
pub fn same_identity(
    state: &State,
    tiers: &[Vec<Candidate>],
    identity: &str,
) -> Vec<Vec<Candidate>> {
    tiers
        .iter()
        .map(|t| {
            t.iter()
                .filter(|c| identity_of(state, &c.provider, &c.model).as_deref() == Some(identity))
                .cloned()
                .collect::<Vec<_>>()
        })
        .filter(|t| !t.is_empty())
        .collect()
}

/// The number of floats in one embedding: a JSON array, or base64 of little-endian f32s.
fn vector_len(embedding: &Value) -> Option<usize> {
    match embedding {
        Value::Array(items) => Some(items.len()),
        Value::String(b64) => base64_len(b64).map(|bytes| bytes / 4),
        _ => None,
    }
}

fn base64_len(s: &str) -> Option<usize> {
    let s = s.trim();
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let padding = s.bytes().rev().take_while(|b| *b == b'=').count();
    Some(s.len() / 4 * 3 - padding)
}

/// The vector length a request asks for: OpenAI's `dimensions`, Gemini's
/// `outputDimensionality` (a batch's first request's).
pub fn requested_dimensions(request: &Value) -> Option<u64> {
    request
        .get("dimensions")
        .or_else(|| request.get("outputDimensionality"))
        .or_else(|| request.pointer("/requests/0/outputDimensionality"))
        .and_then(Value::as_u64)
}

/// The vectors of an embeddings response: OpenAI's `data[].embedding`, Gemini's
/// `embedding.values` or `embeddings[].values`.
fn vectors(response: &Value) -> Option<Vec<Option<&Value>>> {
    if let Some(data) = response.get("data").and_then(Value::as_array) {
        return Some(data.iter().map(|d| d.get("embedding")).collect());
    }
    if let Some(items) = response.get("embeddings").and_then(Value::as_array) {
        return Some(items.iter().map(|e| e.get("values")).collect());
    }
    let one = response.pointer("/embedding/values")?;
    Some(vec![Some(one)])
}

/// Checks every vector of an embeddings response against the declared length.
pub fn check_dimensions(response: &Value, expected: usize) -> Result<(), String> {
    let data = vectors(response).ok_or("the embeddings response has no data")?;
    for (i, item) in data.into_iter().enumerate() {
        let len = item
            .and_then(vector_len)
            .ok_or(format!("data[{i}] has no embedding"))?;
        if len != expected {
            return Err(format!(
                "data[{i}] has {len} dimensions where the model declares {expected}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_proto::v1::{Model, Provider, Snapshot};
    use serde_json::json;

    #[test]
    fn dimensions_checked_for_floats_and_base64() {
        assert!(check_dimensions(&json!({"data":[{"embedding":[0.1,0.2,0.3]}]}), 3).is_ok());
        let err = check_dimensions(&json!({"data":[{"embedding":[0.1,0.2]}]}), 3).unwrap_err();
        assert!(err.contains("2 dimensions"));
        // 2 floats = 8 bytes = "AAAAAAAAAAA=" (12 chars, one pad).
        assert!(check_dimensions(&json!({"data":[{"embedding":"AAAAAAAAAAA="}]}), 2).is_ok());
        assert!(check_dimensions(&json!({"data":[{"embedding":"AAAAAAAAAAA="}]}), 3).is_err());
        assert!(check_dimensions(&json!({}), 3).is_err());
        // Gemini's shapes.
        assert!(check_dimensions(&json!({"embedding":{"values":[0.1,0.2]}}), 2).is_ok());
        let batch = json!({"embeddings":[{"values":[0.1,0.2]},{"values":[0.1]}]});
        assert!(check_dimensions(&batch, 2)
            .unwrap_err()
            .contains("data[1] has 1 dimensions"));
        assert_eq!(
            requested_dimensions(&json!({"requests":[{"outputDimensionality": 4}]})),
            Some(4)
        );
    }

    #[test]
    fn keeps_one_identity() {
        let mut s = Snapshot::default();
        s.providers.push(Provider {
            id: "a".into(),
            models: vec![
                Model {
                    id: "te3".into(),
                    ..Default::default()
                },
                Model {
                    id: "other".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        s.providers.push(Provider {
            id: "b".into(),
            models: vec![Model {
                id: "openai/te3".into(),
                identity: "te3".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let state = State::new(1, s);
        let c = |p: &str, m: &str| Candidate {
            provider: p.into(),
            model: m.into(),
            weight: 1.0,
            when: Vec::new(),
        };
        let tiers = vec![
            vec![c("a", "te3"), c("b", "openai/te3")],
            vec![c("a", "other")],
        ];
        let cut = same_identity(&state, &tiers, "te3");
        assert_eq!(cut, vec![vec![c("a", "te3"), c("b", "openai/te3")]]);
    }
}
