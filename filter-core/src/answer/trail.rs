//! The routing trail of a call: the lanes ruled out before sending, each with its reason, and
//! every attempt with its provider, key alias, model, class and status. It is written into
//! the call's bookkeeping by the front stage (what the request's needs cut) and by every
//! attempt (what the picker ruled out, how the attempt ended), and read back by the front
//! stage for the client: in `error.trail` of a final error, and in the `x-ai-router-trail`
//! response header when the client asked for it. Names only: aliases, never a secret.

use serde_json::{json, Map, Value};

use crate::vocab::LaneId;
use ai_router_contract::failure::ErrorClass;

/// At most this many ruled-out lanes and attempts are kept: the header stays small whatever
/// the pool's size.
pub const MAX_ENTRIES: usize = 32;

/// The client header that asks for the trail on a success, and the response header it comes in.
pub const TRAIL_HEADER: &str = "x-ai-router-trail";

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Skip {
    pub provider: String,
    /// Empty when the whole candidate (every key) was ruled out.
    pub key: String,
    pub model: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AttemptNote {
    pub attempt: u32,
    pub provider: String,
    pub key: String,
    pub model: String,
    /// `None`: the attempt succeeded.
    pub class: Option<ErrorClass>,
    pub status: u16,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trail {
    pub skipped: Vec<Skip>,
    pub attempts: Vec<AttemptNote>,
}

impl Trail {
    /// Notes a ruled-out lane; a lane noted before keeps its place and takes the new reason.
    pub fn skip(&mut self, provider: &str, key: &str, model: &str, reason: &str) {
        if let Some(s) = self
            .skipped
            .iter_mut()
            .find(|s| s.provider == provider && s.key == key && s.model == model)
        {
            reason.clone_into(&mut s.reason);
            return;
        }
        if self.skipped.len() < MAX_ENTRIES {
            self.skipped.push(Skip {
                provider: provider.to_owned(),
                key: key.to_owned(),
                model: model.to_owned(),
                reason: reason.to_owned(),
            });
        }
    }

    pub fn skip_lane(&mut self, lane: &LaneId, reason: impl AsRef<str>) {
        self.skip(&lane.provider, &lane.key, &lane.model, reason.as_ref());
    }

    pub fn attempt(&mut self, note: AttemptNote) {
        if self.attempts.len() < MAX_ENTRIES {
            self.attempts.push(note);
        }
    }

    pub fn to_json(&self) -> Value {
        let skipped: Vec<Value> = self
            .skipped
            .iter()
            .map(|s| {
                let mut o = Map::new();
                o.insert("provider".into(), json!(s.provider));
                if !s.key.is_empty() {
                    o.insert("key".into(), json!(s.key));
                }
                o.insert("model".into(), json!(s.model));
                o.insert("reason".into(), json!(s.reason));
                Value::Object(o)
            })
            .collect();
        let attempts: Vec<Value> = self
            .attempts
            .iter()
            .map(|a| {
                json!({
                    "attempt": a.attempt,
                    "provider": a.provider,
                    "key": a.key,
                    "model": a.model,
                    "class": a.class.map_or("success", ErrorClass::as_str),
                    "status": a.status,
                })
            })
            .collect();
        json!({ "skipped": skipped, "attempts": attempts })
    }

    /// The compact JSON of the response header.
    pub fn header_value(&self) -> String {
        self.to_json().to_string()
    }
}

/// A final error's body with the trail in `error.trail`; the body unchanged when it is not an
/// OpenAI error object.
pub fn with_trail(body: &[u8], trail: &Trail) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let error = value.get_mut("error")?.as_object_mut()?;
    error.insert("trail".into(), trail.to_json());
    serde_json::to_vec(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trail() -> Trail {
        let mut t = Trail::default();
        t.skip("groq", "", "llama", "no_capability:tools");
        t.skip("openai", "openai-1", "gpt", "cooldown");
        t.skip("openai", "openai-1", "gpt", "breaker_open");
        t.attempt(AttemptNote {
            attempt: 1,
            provider: "openai".into(),
            key: "openai-2".into(),
            model: "gpt".into(),
            class: Some(ErrorClass::RateLimit),
            status: 429,
        });
        t.attempt(AttemptNote {
            attempt: 2,
            provider: "mistral".into(),
            key: "mistral-1".into(),
            model: "large".into(),
            class: None,
            status: 200,
        });
        t
    }

    #[test]
    fn the_trail_names_lanes_and_attempts_once_each() {
        let v = trail().to_json();
        assert_eq!(
            v,
            json!({
                "skipped": [
                    {"provider": "groq", "model": "llama", "reason": "no_capability:tools"},
                    {"provider": "openai", "key": "openai-1", "model": "gpt", "reason": "breaker_open"},
                ],
                "attempts": [
                    {"attempt": 1, "provider": "openai", "key": "openai-2", "model": "gpt", "class": "rate_limit", "status": 429},
                    {"attempt": 2, "provider": "mistral", "key": "mistral-1", "model": "large", "class": "success", "status": 200},
                ],
            })
        );
        assert!(!trail().header_value().contains('\n'));
    }

    #[test]
    fn a_final_error_carries_it_in_error_trail() {
        let body =
            br#"{"error":{"message":"m","type":"t","param":null,"code":"pool_rate_limited"}}"#;
        let out = with_trail(body, &trail()).unwrap_or_default();
        let v: Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(v["error"]["code"], "pool_rate_limited");
        assert_eq!(v["error"]["trail"]["attempts"][0]["class"], "rate_limit");
        assert_eq!(with_trail(b"not json", &trail()), None);
    }

    #[test]
    fn the_trail_is_bounded() {
        let mut t = Trail::default();
        for i in 0..100 {
            t.skip("p", &format!("k{i}"), "m", "cooldown");
        }
        assert_eq!(t.skipped.len(), MAX_ENTRIES);
    }
}
