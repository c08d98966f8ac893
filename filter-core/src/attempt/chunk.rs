//! A chat stream's common chunk read without building a `serde_json::Value`: no `error`, no
//! usage, and choices whose delta carries only a role, content or a refusal. What the stream
//! gate takes from it (the model, the answer's estimated tokens, a finish, the first token) is
//! read in one pass over borrowed text; anything else (an error, a usage chunk, tool calls,
//! logprobs, a field of an unexpected type, a repeated field) is not read here, and the gate
//! reads that event whole as before. Every other field is skipped through the same
//! `deserialize_any` a `Value` is built with, so a chunk is read here only if it is JSON a
//! `Value` would have taken.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::protocols::context::answer_text_tokens;

/// What the gate takes from a plain chunk.
#[derive(Debug, PartialEq)]
pub(super) struct Plain<'a> {
    pub model: Option<Cow<'a, str>>,
    /// [`crate::protocols::context::estimate_answer_tokens`] of the chunk's `choices`.
    pub answer_tokens: u64,
    /// A choice carries a finish reason.
    pub finished: bool,
    /// The chunk carries a token (`has_token`).
    pub token: bool,
}

/// The chunk `data` read, if it is a plain one.
pub(super) fn read_plain(data: &str) -> Option<Plain<'_>> {
    let chunk: Chunk = serde_json::from_str(data).ok()?;
    if chunk.read_whole {
        return None;
    }
    let mut plain = Plain {
        model: chunk.model.map(|m| m.0),
        answer_tokens: 0,
        finished: false,
        token: false,
    };
    for choice in chunk.choices.iter().flatten() {
        if let Some(reason) = &choice.finish_reason {
            plain.answer_tokens += answer_text_tokens("finish_reason", &reason.0);
            plain.finished = true;
            plain.token = true;
        }
        let Some(delta) = &choice.delta else {
            continue;
        };
        for (name, text) in [
            ("role", &delta.role),
            ("content", &delta.content),
            ("refusal", &delta.refusal),
        ] {
            if let Some(Text(text)) = text {
                plain.answer_tokens += answer_text_tokens(name, text);
                plain.token |= name != "role" && !text.is_empty();
            }
        }
    }
    Some(plain)
}

struct Chunk<'a> {
    model: Option<Text<'a>>,
    choices: Option<Vec<Choice<'a>>>,
    /// An `error` or a usage that is not `null`: the event is read whole.
    read_whole: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Choice<'a> {
    #[serde(rename = "index")]
    _index: Option<u64>,
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Text<'a>>,
    /// Only `null`: log probabilities carry text of their own.
    #[serde(rename = "logprobs")]
    _logprobs: Option<()>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Delta<'a> {
    #[serde(borrow)]
    role: Option<Text<'a>>,
    #[serde(borrow)]
    content: Option<Text<'a>>,
    #[serde(borrow)]
    refusal: Option<Text<'a>>,
}

/// A string, borrowed from the event when it has no escape.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
        }
        deserializer.deserialize_str(V(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for Chunk<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Chunk<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a chat chunk")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut chunk = Chunk {
                    model: None,
                    choices: None,
                    read_whole: false,
                };
                // A repeated field counts once, as the last one, as in a `Value`.
                while let Some(Text(key)) = map.next_key::<Text>()? {
                    match key.as_ref() {
                        "model" => chunk.model = map.next_value()?,
                        "choices" => chunk.choices = map.next_value()?,
                        "usage" => {
                            let usage = map.next_value::<Option<Skip>>()?;
                            chunk.read_whole |= usage.is_some();
                        }
                        "error" => {
                            map.next_value::<Skip>()?;
                            chunk.read_whole = true;
                        }
                        _ => {
                            map.next_value::<Skip>()?;
                        }
                    }
                }
                Ok(chunk)
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// Any JSON value, checked as a `Value` would be (the same `deserialize_any`) and not kept.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SkipVisitor)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_none<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Skip, D::Error> {
        Skip::deserialize(deserializer)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

#[cfg(test)]
#[path = "chunk_tests.rs"]
mod tests;
