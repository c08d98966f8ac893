//! What a request needs of a lane: its capabilities and its size in tokens.

use ai_router_proto::v1::Capability;
use serde_json::Value;

use crate::plan::Operation;
use crate::vocab::Needs;

/// Estimated tokens of everything the caller sent (CJK text by its own density).
fn estimate_prompt_tokens(body: &Value, op: Operation) -> u64 {
    let field = match op {
        Operation::Chat => body.get("messages"),
        Operation::Embeddings => body.get("input"),
    };
    [field, body.get("tools")]
        .into_iter()
        .flatten()
        .map(crate::protocols::context::estimate_json_tokens)
        .sum()
}

impl Needs {
    pub fn of(
        body: &Value,
        op: Operation,
        policy_require: impl IntoIterator<Item = Capability>,
    ) -> Needs {
        let mut capabilities: Vec<Capability> = Vec::new();
        let mut need = |c: Capability| {
            if !capabilities.contains(&c) {
                capabilities.push(c);
            }
        };
        match op {
            Operation::Embeddings => need(Capability::Embeddings),
            Operation::Chat => {
                need(Capability::Chat);
                if body
                    .get("tools")
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty())
                    || body
                        .get("functions")
                        .and_then(Value::as_array)
                        .is_some_and(|t| !t.is_empty())
                {
                    need(Capability::Tools);
                }
                let format = body
                    .get("response_format")
                    .and_then(|f| f.get("type"))
                    .and_then(Value::as_str);
                if format.is_some_and(|t| t != "text") {
                    need(Capability::Json);
                }
                if body.get("stream").and_then(Value::as_bool).unwrap_or(false) {
                    need(Capability::Streaming);
                }
            }
        }
        for r in policy_require {
            need(r);
        }
        let prompt_tokens = estimate_prompt_tokens(body, op);
        let max_tokens = body
            .get("max_completion_tokens")
            .or_else(|| body.get("max_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Needs {
            capabilities,
            context_tokens: prompt_tokens + max_tokens,
            prompt_tokens,
            max_tokens,
        }
    }
}
