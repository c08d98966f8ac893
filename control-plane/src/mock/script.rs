//! The script: rules that match a request and the replies they give, in order.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize};

use super::errors;

/// Why a script was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read script {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("bad script: {0}")]
    Parse(String),
    #[error("bad script: rule {rule}: {message}")]
    Invalid { rule: usize, message: String },
}

/// A whole script: the first rule whose `match` fits a request answers it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// What `GET …/models` lists, per key (`mock::catalog`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<super::catalog::Catalog>,
    /// What `GET …/key` says of each key's credit (`mock::key_info`).
    #[serde(default, rename = "keyInfo", skip_serializing_if = "Option::is_none")]
    pub key_info: Option<super::key_info::KeyInfo>,
}

/// One rule: which requests it answers and the replies it gives, in order, the last repeating.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default, rename = "match")]
    pub matcher: Match,
    pub replies: Vec<Reply>,
    /// Use the replies round and round instead of repeating the last one (a fixed mix of
    /// faults and successes under load).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cycle: bool,
}

/// What a rule matches; an absent field matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// The exact key (bearer token of `authorization`, else `x-api-key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The exact `model` of the request body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A suffix of the request path (`/chat/completions`, `/v1/messages`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// What the request looked like, for matching.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    pub path: &'a str,
    pub key: Option<&'a str>,
    pub model: Option<&'a str>,
}

impl Match {
    pub fn matches(&self, facts: &RequestFacts<'_>) -> bool {
        let key_ok = self
            .key
            .as_deref()
            .is_none_or(|want| facts.key == Some(want));
        let model_ok = self
            .model
            .as_deref()
            .is_none_or(|want| facts.model == Some(want));
        let path_ok = self
            .path
            .as_deref()
            .is_none_or(|suffix| facts.path.ends_with(suffix));
        key_ok && model_ok && path_ok
    }
}

/// A scripted reply. Every field is optional; an empty reply is the default success.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Reply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(
        default,
        deserialize_with = "scalar_map",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub headers: BTreeMap<String, String>,
    /// Delay before the response headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// A unary body sent in pieces, this long apart (a slow trickle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trickle_ms: Option<u64>,
    /// `network`: close the connection without any response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ReplyError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The model's thinking, before the text: Gemini's `thought: true` parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Report no usage at all, as some OpenAI-compatible servers: no `usage` object in a
    /// chat completion, no usage chunk in its stream.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_usage: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Vec<f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<usize>,
    /// Returned verbatim with the status: a JSON value, or a string sent as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<serde_json::Value>,
    /// `<kind>.<case>` from the provider error table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplyError {
    /// Close the connection without any response.
    Network,
    /// Send the status and headers, then close the connection before any body byte.
    ResetAfterHeaders,
}

/// A tool call the reply makes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    /// A JSON string, or a JSON value that is serialised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Value>,
    /// How the arguments are split over stream deltas (their concatenation should be `arguments`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument_chunks: Option<Vec<String>>,
}

impl ToolCall {
    /// The arguments as the JSON text a provider sends.
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            None => match &self.argument_chunks {
                Some(chunks) => chunks.concat(),
                None => "{}".to_owned(),
            },
            Some(serde_json::Value::String(text)) => text.clone(),
            Some(value) => value.to_string(),
        }
    }

    /// The stream deltas of the arguments.
    pub fn argument_deltas(&self) -> Vec<String> {
        match &self.argument_chunks {
            Some(chunks) => chunks.clone(),
            None => vec![self.arguments_text()],
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    /// Of the prompt tokens, those served from the cache (OpenAI's
    /// `prompt_tokens_details.cached_tokens`, sent when not 0).
    #[serde(default)]
    pub cached_tokens: u64,
}

/// How a stream is delivered and whether it breaks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StreamSpec {
    /// The content pieces, one per chunk (default: the text split at word boundaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<Vec<String>>,
    /// Delay before each chunk after the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Fail after this many content chunks (0: right after the role chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_after: Option<usize>,
    /// How it fails (default `network` when `failAfter` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_with: Option<FailWith>,
    /// Pause `stallMs` after this many content chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_after: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_ms: Option<u64>,
    /// Force the usage chunk on (true) or off (false) whatever the request asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
    /// The message of the error event `failWith: error-event` sends (providers echo keys and
    /// request details in such messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailWith {
    /// Abort the connection mid-body: no terminating chunk.
    Network,
    /// Send a streamed error object, then end the body.
    ErrorEvent,
    /// End the body cleanly without the finish chunk and without `[DONE]`.
    Truncate,
    /// Send a `data:` event that is not JSON, then the rest of the stream as usual (`[DONE]`
    /// included).
    Malformed,
}

/// Header values may be written as numbers or booleans in YAML.
fn scalar_map<'de, D>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: Deserializer<'de>,
{
    let raw = BTreeMap::<String, serde_json::Value>::deserialize(deserializer)?;
    raw.into_iter()
        .map(|(name, value)| {
            let text = match value {
                serde_json::Value::String(text) => text,
                serde_json::Value::Number(number) => number.to_string(),
                serde_json::Value::Bool(flag) => flag.to_string(),
                other => {
                    return Err(serde::de::Error::custom(format!(
                        "header {name}: expected a string or number, got {other}"
                    )))
                }
            };
            Ok((name.to_ascii_lowercase(), text))
        })
        .collect()
}

impl Script {
    /// Parses a JSON script and checks it.
    pub fn from_json(text: &str) -> Result<Self, ScriptError> {
        let script: Script =
            serde_json::from_str(text).map_err(|e| ScriptError::Parse(e.to_string()))?;
        script.validate()?;
        Ok(script)
    }

    /// Parses a YAML script (JSON is YAML too) and checks it.
    pub fn from_yaml(text: &str) -> Result<Self, ScriptError> {
        let script: Script =
            serde_yaml_ng::from_str(text).map_err(|e| ScriptError::Parse(e.to_string()))?;
        script.validate()?;
        Ok(script)
    }

    /// Reads a script file: JSON for `.json`, YAML otherwise.
    pub fn from_file(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let is_json = path
            .extension()
            .and_then(|ext| ext.to_str())
            .is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
        if is_json {
            Self::from_json(&text)
        } else {
            Self::from_yaml(&text)
        }
    }

    pub fn validate(&self) -> Result<(), ScriptError> {
        for (index, rule) in self.rules.iter().enumerate() {
            rule.validate().map_err(|message| ScriptError::Invalid {
                rule: index,
                message,
            })?;
        }
        Ok(())
    }
}

impl Rule {
    /// Parses one JSON rule and checks it.
    pub fn from_json(text: &str) -> Result<Self, ScriptError> {
        let rule: Rule =
            serde_json::from_str(text).map_err(|e| ScriptError::Parse(e.to_string()))?;
        rule.validate()
            .map_err(|message| ScriptError::Invalid { rule: 0, message })?;
        Ok(rule)
    }

    fn validate(&self) -> Result<(), String> {
        if self.replies.is_empty() {
            return Err("replies must hold at least one reply".to_owned());
        }
        for (index, reply) in self.replies.iter().enumerate() {
            reply
                .validate()
                .map_err(|message| format!("reply {index}: {message}"))?;
        }
        Ok(())
    }
}

impl Reply {
    fn validate(&self) -> Result<(), String> {
        if let Some(status) = self.status {
            // A final response: 1xx statuses are interim and cannot end a request.
            if !(200..=999).contains(&status) {
                return Err(format!(
                    "status {status} is not a final HTTP status (200..=999)"
                ));
            }
        }
        for (name, value) in &self.headers {
            if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!("header name {name:?} is invalid"));
            }
            if hyper::header::HeaderValue::from_bytes(&header_bytes(value)).is_err() {
                return Err(format!("header {name}: value {value:?} is invalid"));
            }
        }
        if let Some(name) = &self.provider_error {
            if errors::provider_error_by_name(name).is_none() {
                return Err(format!(
                    "unknown providerError {name:?}; known: {}",
                    errors::provider_error_names().join(", ")
                ));
            }
        }
        if let Some(dimensions) = self.dimensions {
            if dimensions == 0 || dimensions > 65_536 {
                return Err(format!("dimensions {dimensions} must be 1..=65536"));
            }
        }
        Ok(())
    }

    /// The reply with its `providerError` expanded: the table's status, headers and body, under
    /// the reply's own `status`, `headers` and `body` when it sets them.
    pub fn resolved(&self) -> Reply {
        let Some(base) = self
            .provider_error
            .as_deref()
            .and_then(errors::provider_error_by_name)
        else {
            return self.clone();
        };
        let mut headers = base.headers;
        headers.extend(self.headers.clone());
        Reply {
            status: self.status.or(Some(base.status)),
            headers,
            body: self.body.clone().or(Some(base.body)),
            provider_error: None,
            ..self.clone()
        }
    }
}

/// A rule with the position of its next reply.
#[derive(Debug, Clone)]
pub struct RuleState {
    pub rule: Rule,
    pub used: usize,
}

/// The live rules of a running mock.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    rules: Vec<RuleState>,
    catalog: Option<super::catalog::Catalog>,
    key_info: Option<super::key_info::KeyInfo>,
}

impl Rules {
    pub fn new(script: Script) -> Self {
        let mut rules = Self::default();
        rules.replace(script);
        rules
    }

    pub fn replace(&mut self, script: Script) {
        self.catalog = script.catalog;
        self.key_info = script.key_info;
        self.rules = script
            .rules
            .into_iter()
            .map(|rule| RuleState { rule, used: 0 })
            .collect();
    }

    pub fn push(&mut self, rule: Rule) {
        self.rules.push(RuleState { rule, used: 0 });
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// The catalog `GET …/models` lists, if the script has one.
    pub fn catalog(&self) -> Option<&super::catalog::Catalog> {
        self.catalog.as_ref()
    }

    /// What `GET …/key` answers, if the script says.
    pub fn key_info(&self) -> Option<&super::key_info::KeyInfo> {
        self.key_info.as_ref()
    }

    /// The reply for a request: the first matching rule's next reply (its last one repeats).
    pub fn next_reply(&mut self, facts: &RequestFacts<'_>) -> Option<Reply> {
        self.next_reply_of(facts, |_| true)
    }

    /// The reply for a model listing: only rules that match on `path` answer it.
    pub fn next_listing_reply(&mut self, facts: &RequestFacts<'_>) -> Option<Reply> {
        self.next_reply_of(facts, |rule| rule.matcher.path.is_some())
    }

    fn next_reply_of(
        &mut self,
        facts: &RequestFacts<'_>,
        eligible: impl Fn(&Rule) -> bool,
    ) -> Option<Reply> {
        let state = self
            .rules
            .iter_mut()
            .find(|state| eligible(&state.rule) && state.rule.matcher.matches(facts))?;
        let last = state.rule.replies.len().checked_sub(1)?;
        let index = if state.rule.cycle {
            state.used % state.rule.replies.len()
        } else {
            state.used.min(last)
        };
        let reply = state.rule.replies.get(index)?.clone();
        state.used = state.used.saturating_add(1);
        Some(reply)
    }
}

/// A scripted header value as sent: characters U+0080..=U+00FF become their single Latin-1
/// byte (obs-text, as some servers still send), so a script can send raw non-UTF-8 bytes.
pub(crate) fn header_bytes(value: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    for c in value.chars() {
        match u8::try_from(u32::from(c)) {
            Ok(byte) => out.push(byte),
            Err(_) => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn facts<'a>(path: &'a str, key: Option<&'a str>, model: Option<&'a str>) -> RequestFacts<'a> {
        RequestFacts { path, key, model }
    }

    #[test]
    fn match_fields_are_anded_and_path_is_a_suffix() {
        let m = Match {
            key: Some("sk-test-1".into()),
            model: None,
            path: Some("/chat/completions".into()),
        };
        assert!(m.matches(&facts("/v1/chat/completions", Some("sk-test-1"), Some("m"))));
        assert!(!m.matches(&facts("/v1/chat/completions", Some("sk-test-2"), Some("m"))));
        assert!(!m.matches(&facts("/v1/chat/completions", None, Some("m"))));
        assert!(!m.matches(&facts("/v1/embeddings", Some("sk-test-1"), None)));
        assert!(Match::default().matches(&facts("/x", None, None)));
    }

    #[test]
    fn first_matching_rule_wins_and_last_reply_repeats() {
        let script = Script::from_json(
            r#"{"rules":[
                {"match":{"model":"a"},"replies":[{"status":429},{"text":"one"},{"text":"two"}]},
                {"match":{"model":"a"},"replies":[{"text":"never"}]},
                {"replies":[{"text":"any"}]}
            ]}"#,
        )
        .unwrap();
        let mut rules = Rules::new(script);
        let a = facts("/chat/completions", None, Some("a"));
        let b = facts("/chat/completions", None, Some("b"));
        assert_eq!(rules.next_reply(&a).unwrap().status, Some(429));
        assert_eq!(rules.next_reply(&b).unwrap().text.as_deref(), Some("any"));
        assert_eq!(rules.next_reply(&a).unwrap().text.as_deref(), Some("one"));
        assert_eq!(rules.next_reply(&a).unwrap().text.as_deref(), Some("two"));
        assert_eq!(rules.next_reply(&a).unwrap().text.as_deref(), Some("two"));
        assert_eq!(rules.next_reply(&b).unwrap().text.as_deref(), Some("any"));
    }

    #[test]
    fn a_cycling_rule_goes_round_its_replies() {
        let script = Script::from_json(
            r#"{"rules":[{"cycle":true,"replies":[{"status":500},{"text":"a"},{"text":"b"}]}]}"#,
        )
        .unwrap();
        let mut rules = Rules::new(script);
        let f = facts("/chat/completions", None, None);
        let seen: Vec<Option<u16>> = (0..7)
            .map(|_| rules.next_reply(&f).unwrap().status)
            .collect();
        assert_eq!(
            seen,
            [Some(500), None, None, Some(500), None, None, Some(500)]
        );
    }

    #[test]
    fn no_rule_means_no_reply() {
        let mut rules = Rules::default();
        assert!(rules.next_reply(&facts("/x", None, None)).is_none());
    }

    #[test]
    fn yaml_scripts_parse_with_scalar_headers() {
        let script = Script::from_yaml(
            r#"
rules:
  - match: { key: sk-test-1 }
    replies:
      - { status: 429, headers: { retry-after: 30, X-Flag: true } }
      - providerError: anthropic.overloaded
      - latencyMs: 20
        text: hello
        toolCalls: [{ id: call_1, name: f, arguments: { a: 1 } }]
        stream: { chunks: [a, b], failAfter: 1, failWith: error-event, includeUsage: true }
"#,
        )
        .unwrap();
        let replies = &script.rules[0].replies;
        assert_eq!(replies[0].headers["retry-after"], "30");
        assert_eq!(replies[0].headers["x-flag"], "true");
        assert_eq!(replies[2].tool_calls[0].arguments_text(), r#"{"a":1}"#);
        let stream = replies[2].stream.as_ref().unwrap();
        assert_eq!(stream.fail_with, Some(FailWith::ErrorEvent));
        assert_eq!(stream.fail_after, Some(1));
        assert_eq!(stream.include_usage, Some(true));
    }

    #[test]
    fn bad_scripts_are_refused_with_a_clear_message() {
        let cases = [
            (r#"{"rules":[{"replies":[]}]}"#, "at least one reply"),
            (
                r#"{"rules":[{"replies":[{"stauts":429}]}]}"#,
                "unknown field `stauts`",
            ),
            (
                r#"{"rules":[{"replies":[{"error":"dns"}]}]}"#,
                "unknown variant `dns`",
            ),
            (
                r#"{"rules":[{"replies":[{"providerError":"openai.nope"}]}]}"#,
                "unknown providerError",
            ),
            (
                r#"{"rules":[{"replies":[{"status":101}]}]}"#,
                "not a final HTTP status",
            ),
            (
                r#"{"rules":[{"replies":[{"stream":{"failWith":"boom"}}]}]}"#,
                "unknown variant `boom`",
            ),
            (
                r#"{"rules":[{"match":{"kye":"x"},"replies":[{}]}]}"#,
                "unknown field `kye`",
            ),
        ];
        for (text, needle) in cases {
            let message = Script::from_json(text).unwrap_err().to_string();
            assert!(message.contains(needle), "{text}: {message}");
        }
    }

    #[test]
    fn provider_error_resolves_under_the_replys_own_fields() {
        let reply = Reply {
            provider_error: Some("openai.rate_limited".into()),
            headers: BTreeMap::from([("retry-after".to_owned(), "1".to_owned())]),
            ..Reply::default()
        };
        let resolved = reply.resolved();
        assert_eq!(resolved.status, Some(429));
        assert_eq!(resolved.headers["retry-after"], "1");
        assert!(resolved.headers.contains_key("x-ratelimit-limit-requests"));
        assert_eq!(
            resolved.body.unwrap()["error"]["code"],
            serde_json::json!("rate_limit_exceeded")
        );
    }
}
