//! A whole (unary) answer's verdict facts read without building a `serde_json::Value`: whether
//! it is a JSON object, whether it carries an `error` that is not `null`, its estimated answer
//! tokens and its usage. A chat answer that goes to the client as it came needs nothing else,
//! and building a `Value` of it (a string and a map per field, all dropped right after) was
//! most of the verdict's cost.
//!
//! Every field is walked through the same `deserialize_any` a `Value` is built with, so an
//! answer is read here only if it is JSON a `Value` would have taken; the facts are those
//! [`estimate_answer_tokens`](crate::protocols::context::estimate_answer_tokens) and
//! [`usage_of`](crate::vocab::usage_of) find in that `Value`. An answer this pass does not
//! read exactly as a `Value` would (a key repeated in one object, where the `Value` keeps the
//! last; a key with an escape; an object of more than [`MAX_KEYS`] keys; JSON a `Value` refuses)
//! is not read here: the caller parses it whole as before.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::protocols::context::answer_text_tokens;
use crate::vocab::Usage;

/// The keys an object may have for this pass to check them for repeats on the stack.
const MAX_KEYS: usize = 32;

/// What the verdict reads of a whole answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Facts {
    /// The answer is a JSON object.
    pub object: bool,
    /// Its top-level `error` is present and not `null`.
    pub error: bool,
    /// `estimate_answer_tokens` of the answer.
    pub answer_tokens: u64,
    /// `usage_of` the answer.
    pub usage: Option<Usage>,
}

/// The facts of `body`, if this pass reads it as a `Value` would.
pub(super) fn read(body: &[u8]) -> Option<Facts> {
    let mut answer_tokens = 0;
    let mut de = serde_json::Deserializer::from_slice(body);
    let top = Walk {
        at: At::Top,
        name: "",
        tokens: &mut answer_tokens,
    };
    let found = top.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(Facts {
        object: found.object,
        error: found.error,
        answer_tokens,
        usage: found.usage,
    })
}

/// Where a value sits in the answer: what is taken from it besides its text's tokens.
#[derive(Clone, Copy, PartialEq)]
enum At {
    /// The answer itself: is it an object, its `error`, its `usage`.
    Top,
    /// The top-level `usage`: its counts.
    Usage,
    /// `usage.prompt_tokens_details`: its `cached_tokens`.
    Details,
    /// Anywhere else: its tokens only.
    Field,
}

/// What a value gave besides its tokens.
#[derive(Default)]
struct Found {
    null: bool,
    /// A whole number that fits a `u64` (`Value::as_u64`).
    count: Option<u64>,
    object: bool,
    error: bool,
    usage: Option<Usage>,
    cached: u64,
}

/// One value walked: a string counts as the text of the field `name` it is the value of
/// (an array's items are no field), an object's fields are walked under their names.
struct Walk<'t> {
    at: At,
    name: &'t str,
    tokens: &'t mut u64,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = Found;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Found, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = Found;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_unit<E>(self) -> Result<Found, E> {
        Ok(Found {
            null: true,
            ..Found::default()
        })
    }
    fn visit_bool<E>(self, _: bool) -> Result<Found, E> {
        Ok(Found::default())
    }
    fn visit_u64<E>(self, n: u64) -> Result<Found, E> {
        Ok(Found {
            count: Some(n),
            ..Found::default()
        })
    }
    fn visit_i64<E>(self, n: i64) -> Result<Found, E> {
        Ok(Found {
            count: u64::try_from(n).ok(),
            ..Found::default()
        })
    }
    fn visit_f64<E>(self, _: f64) -> Result<Found, E> {
        Ok(Found::default())
    }
    fn visit_str<E>(self, text: &str) -> Result<Found, E> {
        *self.tokens += answer_text_tokens(self.name, text);
        Ok(Found::default())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        let tokens = self.tokens;
        while seq.next_element_seed(field("", tokens))?.is_some() {}
        Ok(Found::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let (at, tokens) = (self.at, self.tokens);
        let mut found = Found {
            object: at == At::Top,
            ..Found::default()
        };
        let mut usage = Usage::default();
        let (mut seen, mut count) = ([""; MAX_KEYS], 0);
        while let Some(key) = map.next_key::<&'de str>()? {
            // A repeated key (a `Value` keeps the last), or more than the stack holds.
            if count == MAX_KEYS || seen[..count].contains(&key) {
                return Err(serde::de::Error::custom("read whole"));
            }
            (seen[count], count) = (key, count + 1);
            let nested = match (at, key) {
                (At::Top, "usage") => At::Usage,
                (At::Usage, "prompt_tokens_details") => At::Details,
                _ => At::Field,
            };
            let value = map.next_value_seed(Walk {
                at: nested,
                name: key,
                tokens: &mut *tokens,
            })?;
            match (at, key) {
                (At::Top, "error") => found.error = !value.null,
                // `usage_of`: none when `null`, its counts when an object, zeros otherwise.
                (At::Top, "usage") => {
                    found.usage = (!value.null).then(|| value.usage.unwrap_or_default());
                }
                (At::Usage, "prompt_tokens") => usage.prompt_tokens = value.count.unwrap_or(0),
                (At::Usage, "completion_tokens") => {
                    usage.completion_tokens = value.count.unwrap_or(0);
                }
                (At::Usage, "prompt_tokens_details") => usage.cached_tokens = value.cached,
                (At::Details, "cached_tokens") => found.cached = value.count.unwrap_or(0),
                _ => {}
            }
        }
        if at == At::Usage {
            found.usage = Some(usage);
        }
        Ok(found)
    }
}

fn field<'t>(name: &'t str, tokens: &'t mut u64) -> Walk<'t> {
    Walk {
        at: At::Field,
        name,
        tokens,
    }
}

#[cfg(test)]
#[path = "whole_tests.rs"]
mod tests;
