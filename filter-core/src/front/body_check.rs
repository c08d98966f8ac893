//! The shape of a chat request's body, checked before it is routed: a field of the wrong type
//! is the client's 400 `invalid_request` naming the field, not a provider's puzzled answer (or,
//! worse, one provider accepting what the next refuses mid-failover).
//!
//! Only the fields the gateway itself reads or that every provider types the same way are
//! checked; anything else passes through to the provider untouched.

use ai_router_contract::error_code::ErrorCode;
use serde_json::Value;

use crate::answer::errors::GatewayError;

/// The roles of the chat completions API.
const CHAT_ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// Checks a chat completion body (already known to be a JSON object).
pub fn check_chat(body: &Value) -> Result<(), GatewayError> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err(invalid(
            "messages must be an array of chat messages.",
            "messages",
        ));
    };
    for message in messages {
        let Some(message) = message.as_object() else {
            return Err(invalid("each message must be an object.", "messages"));
        };
        let Some(role) = message.get("role").and_then(Value::as_str) else {
            return Err(invalid("each message needs a string role.", "messages"));
        };
        if !CHAT_ROLES.contains(&role) {
            // Refused here, not passed on: a provider repeats an unknown value in its answer,
            // and no provider serves a role outside this list.
            return Err(invalid(
                "each message's role must be one of system, developer, user, assistant, tool or function.",
                "messages",
            ));
        }
        match message.get("content") {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                if !parts.iter().all(Value::is_object) {
                    return Err(invalid(
                        "each part of a message's content must be an object.",
                        "messages",
                    ));
                }
            }
            Some(_) => {
                return Err(invalid(
                    "a message's content must be a string or an array of parts.",
                    "messages",
                ))
            }
        }
    }
    if !body
        .get("stream")
        .is_none_or(|v| v.is_boolean() || v.is_null())
    {
        return Err(invalid("stream must be true or false.", "stream"));
    }
    if !body
        .get("stream_options")
        .is_none_or(|v| v.is_object() || v.is_null())
    {
        return Err(invalid(
            "stream_options must be an object.",
            "stream_options",
        ));
    }
    for (field, message) in [
        ("max_tokens", "max_tokens must be a positive integer."),
        (
            "max_completion_tokens",
            "max_completion_tokens must be a positive integer.",
        ),
    ] {
        let ok = match body.get(field) {
            None | Some(Value::Null) => true,
            Some(value) => value.as_u64().is_some_and(|n| n > 0),
        };
        if !ok {
            return Err(invalid(message, field));
        }
    }
    Ok(())
}

/// Parses a request body that must be a JSON object, in one pass, refusing a body whose top
/// level names a field twice, exactly or in another letter case (`model` twice, `model` and
/// `Model`, `stream` and `STREAM`, `mod\u0065l` and `model`). Parsers disagree on such a body:
/// serde_json keeps the last value, others the first, and Go's `encoding/json` matches names
/// regardless of case. The scope check and the router read one `model`; a provider given the
/// body could read the other. No API has two top-level fields that differ only in case, so the
/// rule refuses nothing a client means (README, "Errors").
pub fn parse_object(body: &[u8]) -> Result<Value, GatewayError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let top = serde::Deserializer::deserialize_any(&mut de, TopLevel).and_then(|top| {
        de.end()?;
        Ok(top)
    });
    match top {
        Ok(TopLevelValue::Object(map, None)) => Ok(Value::Object(map)),
        Ok(TopLevelValue::Object(_, Some(key))) => {
            let shown: String = key.chars().take(64).collect();
            Err(GatewayError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "The request body names the top-level field '{shown}' more than once \
                     (names that differ only in letter case count as the same field): send \
                     each field once."
                ),
            ))
        }
        Ok(TopLevelValue::Other) => Err(GatewayError::new(
            ErrorCode::InvalidJson,
            "The request body must be a JSON object.",
        )),
        Err(e) => Err(GatewayError::new(
            ErrorCode::InvalidJson,
            format!("The request body is not valid JSON: {e}"),
        )),
    }
}

/// What the top level of a body is: an object (with its first repeated key, if any) or not.
enum TopLevelValue {
    Object(serde_json::Map<String, Value>, Option<String>),
    Other,
}

/// Builds the top-level object as `Value` would, noting repeated keys instead of letting the
/// last one win; any other JSON value is read to its end and reported as `Other`.
struct TopLevel;

impl<'de> serde::de::Visitor<'de> for TopLevel {
    type Value = TopLevelValue;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        let mut seen = std::collections::HashSet::new();
        let mut repeated = None;
        // Read to the end: serde_json fails a map left before its closing brace.
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value::<Value>()?;
            if !seen.insert(key.to_ascii_lowercase()) && repeated.is_none() {
                repeated = Some(key.clone());
            }
            object.insert(key, value);
        }
        Ok(TopLevelValue::Object(object, repeated))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(TopLevelValue::Other)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(TopLevelValue::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(TopLevelValue::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(TopLevelValue::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(TopLevelValue::Other)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(TopLevelValue::Other)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(TopLevelValue::Other)
    }
}

fn invalid(message: &'static str, param: &'static str) -> GatewayError {
    GatewayError::new(ErrorCode::InvalidRequest, message).with_param(param)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use serde_json::json;

    use super::*;

    fn param_of(body: Value) -> Option<&'static str> {
        check_chat(&body).err().map(|error| {
            assert_eq!(error.code, ErrorCode::InvalidRequest, "{body}");
            error.param.unwrap_or("?")
        })
    }

    #[test]
    fn well_formed_bodies_pass_whatever_else_they_carry() {
        for body in [
            json!({"messages": []}),
            json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
                   "stream_options": {"include_usage": true}, "max_tokens": 10, "extra": [1]}),
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                                {"role": "assistant", "content": null, "tool_calls": []},
                                {"role": "tool", "tool_call_id": "c", "content": "x"}],
                   "stream": null, "max_tokens": null, "max_completion_tokens": 5}),
        ] {
            assert_eq!(param_of(body.clone()), None, "{body}");
        }
    }

    #[test]
    fn each_mistyped_field_is_named() {
        let hi = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (json!({"messages": "hi"}), "messages"),
            (json!({}), "messages"),
            (json!({"messages": ["hi"]}), "messages"),
            (json!({"messages": [{"content": "hi"}]}), "messages"),
            (
                json!({"messages": [{"role": 1, "content": "hi"}]}),
                "messages",
            ),
            (
                json!({"messages": [{"role": "incorrect api key", "content": "hi"}]}),
                "messages",
            ),
            (
                json!({"messages": [{"role": "user", "content": 5}]}),
                "messages",
            ),
            (
                json!({"messages": [{"role": "user", "content": {"a": 1}}]}),
                "messages",
            ),
            (
                json!({"messages": [{"role": "user", "content": ["hi"]}]}),
                "messages",
            ),
            (json!({"messages": hi, "stream": "yes"}), "stream"),
            (json!({"messages": hi, "stream": 1}), "stream"),
            (
                json!({"messages": hi, "stream_options": true}),
                "stream_options",
            ),
            (json!({"messages": hi, "max_tokens": -1}), "max_tokens"),
            (json!({"messages": hi, "max_tokens": 0}), "max_tokens"),
            (json!({"messages": hi, "max_tokens": 1.5}), "max_tokens"),
            (json!({"messages": hi, "max_tokens": "10"}), "max_tokens"),
            (
                json!({"messages": hi, "max_completion_tokens": -3}),
                "max_completion_tokens",
            ),
        ];
        for (body, param) in cases {
            assert_eq!(param_of(body.clone()), Some(param), "{body}");
        }
    }

    #[test]
    fn a_top_level_field_named_twice_in_any_case_is_refused() {
        for (body, named) in [
            (r#"{"model":"a","model":"b"}"#, "model"),
            (r#"{"model":"a","Model":"b"}"#, "Model"),
            (r#"{"MODEL":"b","model":"a"}"#, "model"),
            (r#"{"stream":false,"messages":[],"stream":true}"#, "stream"),
            (r#"{"model":"a","mod\u0065l":"b"}"#, "model"),
            (r#"{"input":"x","INPUT":["y"]}"#, "INPUT"),
            (r#"{"model":"a","model":"b","messages":[]}"#, "model"),
            (
                r#"{"Model":"b","model":"a","stream":true,"STREAM":false}"#,
                "model",
            ),
        ] {
            let error = parse_object(body.as_bytes()).unwrap_err();
            assert_eq!(error.code, ErrorCode::InvalidRequest, "{body}");
            assert!(
                error.message.contains(&format!("'{named}'")),
                "{body}: {}",
                error.message
            );
        }
        let long = format!(r#"{{"{k}":1,"{k}":2}}"#, k = "k".repeat(10_000));
        let error = parse_object(long.as_bytes()).unwrap_err();
        assert!(error.message.len() < 300, "the key is shortened");
    }

    #[test]
    fn nested_repeats_and_distinct_fields_pass() {
        for body in [
            r#"{"model":"a","messages":[{"role":"user","content":"x"}],"stream":true}"#,
            r#"{"model":"a","metadata":{"k":1,"K":2,"k":3}}"#,
            r#"{"model":"a","max_tokens":1,"max_completion_tokens":2}"#,
            r#"{}"#,
        ] {
            let parsed = parse_object(body.as_bytes()).unwrap();
            // The same value the plain parser builds (a nested repeat keeps its last value).
            assert_eq!(
                parsed,
                serde_json::from_str::<Value>(body).unwrap(),
                "{body}"
            );
        }
    }

    #[test]
    fn a_body_that_is_not_a_json_object_is_named_as_such() {
        for (body, says) in [
            ("[1,2]", "must be a JSON object"),
            ("\"model\"", "must be a JSON object"),
            ("12", "must be a JSON object"),
            ("null", "must be a JSON object"),
            ("{\"model\":", "not valid JSON"),
            ("{\"model\":\"a\"} x", "not valid JSON"),
            ("[1,", "not valid JSON"),
            ("", "not valid JSON"),
        ] {
            let error = parse_object(body.as_bytes()).unwrap_err();
            assert_eq!(error.code, ErrorCode::InvalidJson, "{body}");
            assert!(error.message.contains(says), "{body}: {}", error.message);
        }
    }
}
