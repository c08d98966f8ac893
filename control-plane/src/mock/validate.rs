//! What the mock refuses before any script rule answers, the way the real APIs do: a value
//! outside the field's set, answered in the provider's shape with the value repeated, as
//! OpenAI and Anthropic repeat it. The gateway must never read a key's fate from such words.

use serde_json::{json, Value};

/// OpenAI's `reasoning_effort` values.
const REASONING_EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high"];
/// Anthropic's `tool_choice.type` tags.
const TOOL_CHOICE_TAGS: &[&str] = &["auto", "any", "tool", "none"];

/// The 400 a chat completions request gets for an unknown `reasoning_effort`
/// (OpenAI: `invalid_value`, the value repeated).
pub fn chat_refusal(request: &Value) -> Option<Value> {
    let effort = request.get("reasoning_effort")?.as_str()?;
    if REASONING_EFFORTS.contains(&effort) {
        return None;
    }
    Some(json!({"error": {
        "message": format!(
            "Invalid value: '{effort}'. Supported values are: 'low', 'medium', and 'high'."
        ),
        "type": "invalid_request_error",
        "param": "reasoning_effort",
        "code": "invalid_value",
    }}))
}

/// The 400 a Messages request gets for an unknown `tool_choice.type` (Anthropic: the tag
/// repeated after the field's path).
pub fn messages_refusal(request: &Value) -> Option<Value> {
    let tag = request.get("tool_choice")?.get("type")?.as_str()?;
    if TOOL_CHOICE_TAGS.contains(&tag) {
        return None;
    }
    Some(json!({"type": "error", "error": {
        "type": "invalid_request_error",
        "message": format!(
            "tool_choice: Input tag '{tag}' found using 'type' does not match any of the expected tags: 'auto', 'any', 'tool', 'none'"
        ),
    }}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_pass_and_unknown_ones_are_repeated_back() {
        assert_eq!(chat_refusal(&json!({"reasoning_effort": "low"})), None);
        assert_eq!(chat_refusal(&json!({})), None);
        let refusal = chat_refusal(&json!({"reasoning_effort": "incorrect api key"}));
        assert!(refusal
            .as_ref()
            .and_then(|r| r.pointer("/error/message"))
            .and_then(Value::as_str)
            .is_some_and(|m| m.contains("'incorrect api key'")));
        assert_eq!(
            messages_refusal(&json!({"tool_choice": {"type": "auto"}})),
            None
        );
        let refusal = messages_refusal(&json!({"tool_choice": {"type": "usage limit"}}));
        assert!(refusal
            .as_ref()
            .and_then(|r| r.pointer("/error/message"))
            .and_then(Value::as_str)
            .is_some_and(|m| m.contains("'usage limit'")));
    }
}
