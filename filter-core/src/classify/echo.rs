//! The echo check: a verdict that rests on words the client could have put in the provider's
//! answer falls back to what the status and the structured fields say alone.

use serde_json::Value;

use super::failure::Failure;
use super::fields::words_without_urls;
use super::tables::{
    AUTH_TEXT, CONTEXT_TEXT, KEY_TYPE_TEXT, OVERLOAD_TEXT, PER_DAY_TEXT, QUOTA_TEXT,
};

impl Failure {
    /// This verdict, unless it rests on words the client could have put in the answer: when a
    /// phrase that decided it occurs in `client_request` (the caller's body, any string in it),
    /// the provider may be repeating the client (OpenAI answers an unknown value with
    /// `Invalid value: '<value>'`), and the verdict of the status and structured fields alone
    /// stands. A tenant must not be able to take the pool's shared keys out with a crafted
    /// request.
    pub fn unless_echoed(self, client_request: &[u8]) -> Failure {
        let Some(by_words) = &self.by_words else {
            return self;
        };
        let client = client_words(client_request);
        if by_words.phrases.iter().any(|p| client.contains(p)) {
            return by_words.otherwise.clone();
        }
        self
    }
}

/// Every string of a JSON request (keys and values), in the form the tables match a message
/// in ([`words_without_urls`]); a body that is not JSON is taken as text.
fn client_words(request: &[u8]) -> String {
    fn collect(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(s) => out.push(words_without_urls(s)),
            Value::Array(items) => items.iter().for_each(|v| collect(v, out)),
            Value::Object(map) => {
                for (key, v) in map {
                    out.push(words_without_urls(key));
                    collect(v, out);
                }
            }
            _ => {}
        }
    }
    match serde_json::from_slice::<Value>(request) {
        Ok(value) => {
            let mut strings = Vec::new();
            collect(&value, &mut strings);
            // Joined, so a phrase split over two adjacent strings still counts as the client's.
            strings.join(" ")
        }
        Err(_) => words_without_urls(&String::from_utf8_lossy(request)),
    }
}

/// The phrases of the classifier's tables that occur in a message.
pub(super) fn table_phrases(message: &str) -> Vec<&'static str> {
    let words = words_without_urls(message);
    let raw = message.to_ascii_lowercase();
    [
        QUOTA_TEXT,
        AUTH_TEXT,
        PER_DAY_TEXT,
        OVERLOAD_TEXT,
        CONTEXT_TEXT,
        KEY_TYPE_TEXT,
    ]
    .into_iter()
    .flatten()
    .copied()
    .filter(|p| words.contains(p) || raw.contains(p))
    .collect()
}
