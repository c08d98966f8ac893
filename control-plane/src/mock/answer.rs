//! What a successful reply says, independent of the provider shape it is rendered in.

use serde_json::Value;

use super::script::{Reply, ToolCall, Usage};

/// The text of the default reply.
pub const DEFAULT_TEXT: &str = "Hello from the ai-router mock.";

/// The fixed `created` timestamp of every completion, so answers are deterministic.
pub const CREATED: u64 = 1_700_000_000;

/// The request being answered.
#[derive(Debug, Clone)]
pub struct Turn {
    /// The call's sequence number (1-based), used in ids.
    pub seq: u64,
    /// The request's `model`, echoed.
    pub model: String,
    /// Estimated from the request (four characters a token).
    pub prompt_tokens: u64,
    /// The request's `stream_options.include_usage`.
    pub usage_requested: bool,
}

/// The content of a successful chat answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The message text; `None` for an answer that only calls tools.
    pub text: Option<String>,
    /// The text as stream chunks.
    pub chunks: Vec<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    /// Whether an OpenAI-shape answer carries its usage (`noUsage` turns it off).
    pub reports_usage: bool,
}

impl Answer {
    pub fn new(reply: &Reply, prompt_tokens: u64) -> Self {
        let scripted_chunks = reply
            .stream
            .as_ref()
            .and_then(|stream| stream.chunks.clone());
        let text = match (&reply.text, &scripted_chunks) {
            (Some(text), _) => Some(text.clone()),
            (None, Some(chunks)) => Some(chunks.concat()),
            (None, None) if reply.tool_calls.is_empty() => Some(DEFAULT_TEXT.to_owned()),
            (None, None) => None,
        };
        let chunks = match scripted_chunks {
            Some(chunks) => chunks,
            None => text.as_deref().map(split_words).unwrap_or_default(),
        };
        let completion_chars = text.as_deref().map_or(0, |text| text.chars().count())
            + reply
                .tool_calls
                .iter()
                .map(|call| call.name.len() + call.arguments_text().chars().count())
                .sum::<usize>();
        let usage = reply.usage.unwrap_or(Usage {
            prompt_tokens,
            completion_tokens: estimate_tokens(completion_chars),
            cached_tokens: 0,
        });
        Self {
            text,
            chunks,
            tool_calls: reply.tool_calls.clone(),
            usage,
            reports_usage: !reply.no_usage,
        }
    }
}

/// Four characters a token, rounded up.
pub fn estimate_tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX)
}

/// The characters of the prompt: every string under `messages`, `system`, `input` or `prompt`,
/// and Gemini's `contents`, `systemInstruction`, `content` and `requests`.
pub fn prompt_chars(request: &Value) -> usize {
    [
        "messages",
        "system",
        "input",
        "prompt",
        "contents",
        "systemInstruction",
        "content",
        "requests",
    ]
    .iter()
    .filter_map(|field| request.get(field))
    .map(string_chars)
    .sum()
}

fn string_chars(value: &Value) -> usize {
    match value {
        Value::String(text) => text.chars().count(),
        Value::Array(items) => items.iter().map(string_chars).sum(),
        Value::Object(fields) => fields
            .iter()
            // Roles, part types and ids are not prompt text.
            .filter(|(name, _)| !matches!(name.as_str(), "role" | "type" | "id" | "name" | "model"))
            .map(|(_, value)| string_chars(value))
            .sum(),
        _ => 0,
    }
}

/// Splits text into stream chunks at word boundaries, the whitespace kept with the word before.
pub fn split_words(text: &str) -> Vec<String> {
    text.split_inclusive(char::is_whitespace)
        .map(str::to_owned)
        .collect()
}

/// The tool call's id, or a deterministic one.
pub fn tool_call_id(call: &ToolCall, prefix: &str, seq: u64, index: usize) -> String {
    call.id
        .clone()
        .unwrap_or_else(|| format!("{prefix}_mock_{seq}_{index}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::mock::script::StreamSpec;
    use serde_json::json;

    #[test]
    fn the_default_answer() {
        let answer = Answer::new(&Reply::default(), 3);
        assert_eq!(answer.text.as_deref(), Some(DEFAULT_TEXT));
        assert_eq!(answer.chunks.concat(), DEFAULT_TEXT);
        assert_eq!(answer.chunks.len(), 5);
        assert_eq!(answer.usage.prompt_tokens, 3);
        assert_eq!(answer.usage.completion_tokens, 8); // 30 chars
    }

    #[test]
    fn scripted_chunks_are_the_text_and_usage_overrides() {
        let reply = Reply {
            stream: Some(StreamSpec {
                chunks: Some(vec!["a".into(), "b".into()]),
                ..StreamSpec::default()
            }),
            usage: Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 9,
                cached_tokens: 0,
            }),
            ..Reply::default()
        };
        let answer = Answer::new(&reply, 1);
        assert_eq!(answer.text.as_deref(), Some("ab"));
        assert_eq!(answer.chunks, vec!["a", "b"]);
        assert_eq!(answer.usage.completion_tokens, 9);
    }

    #[test]
    fn tool_calls_alone_have_no_text() {
        let reply = Reply {
            tool_calls: vec![ToolCall {
                name: "f".into(),
                ..ToolCall::default()
            }],
            ..Reply::default()
        };
        let answer = Answer::new(&reply, 1);
        assert_eq!(answer.text, None);
        assert!(answer.chunks.is_empty());
    }

    #[test]
    fn prompt_estimate_reads_text_only() {
        let request = json!({
            "model": "m",
            "system": "abcd",
            "messages": [
                {"role": "user", "content": "abcdefgh"},
                {"role": "user", "content": [{"type": "text", "text": "abcd"}]},
            ],
        });
        assert_eq!(prompt_chars(&request), 16);
        assert_eq!(estimate_tokens(16), 4);
        assert_eq!(estimate_tokens(17), 5);
        assert_eq!(prompt_chars(&json!({"input": ["ab", "cd"]})), 4);
    }

    #[test]
    fn split_keeps_whitespace() {
        assert_eq!(split_words("a b  c"), vec!["a ", "b ", " ", "c"]);
        assert!(split_words("").is_empty());
    }
}
