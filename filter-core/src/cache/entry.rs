//! A stored answer, and which answers may be stored.

use serde_json::Value;

/// Whether a unary answer to a caller of `protocol` may be stored.
pub fn storable_for(protocol: crate::plan::Protocol, status: u16, body: &Value) -> bool {
    match protocol {
        crate::plan::Protocol::Chat => storable(status, body),
        _ => crate::cache::shapes::storable(protocol, status, body),
    }
}

/// Whether a unary chat answer may be stored: a 200 whose every choice is complete.
pub fn storable(status: u16, body: &Value) -> bool {
    if status != 200 || body.get("error").is_some() {
        return false;
    }
    if let Some(data) = body.get("data") {
        // Embeddings.
        return data.as_array().is_some_and(|d| !d.is_empty());
    }
    let Some(choices) = body.get("choices").and_then(Value::as_array) else {
        return false;
    };
    !choices.is_empty()
        && choices.iter().all(|c| {
            let finish = c.get("finish_reason").and_then(Value::as_str);
            let message = c.get("message");
            let text = message
                .and_then(|m| m.get("content"))
                .and_then(Value::as_str)
                .is_some_and(|t| !t.is_empty());
            let tools = message
                .and_then(|m| m.get("tool_calls"))
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty());
            matches!(finish, Some("stop" | "tool_calls" | "function_call")) && (text || tools)
        })
}

/// A stored answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Entry {
    pub key: String,
    pub expires_at_ms: i64,
    /// The provider and pool model that answered: what a hit saves is priced there.
    pub provider: String,
    pub model: String,
    /// The answer's body, as the client got it.
    pub body: Vec<u8>,
}

/// A short name, prefixed by its length (one byte; longer names are cut).
fn put_name(out: &mut Vec<u8>, name: &str) {
    let bytes = name.as_bytes();
    let len = bytes.len().min(255);
    out.push(u8::try_from(len).unwrap_or(u8::MAX));
    out.extend_from_slice(bytes.get(..len).unwrap_or_default());
}

fn take_name(bytes: &[u8], at: &mut usize) -> Option<String> {
    let len = usize::from(*bytes.get(*at)?);
    let name = std::str::from_utf8(bytes.get(*at + 1..*at + 1 + len)?).ok()?;
    *at += 1 + len;
    Some(name.to_owned())
}

impl Entry {
    /// `key (64 hex) | expires (8, big endian) | provider | model | body`, each name prefixed
    /// by its length (one byte).
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(74 + self.provider.len() + self.model.len() + self.body.len());
        out.extend_from_slice(self.key.as_bytes());
        out.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        put_name(&mut out, &self.provider);
        put_name(&mut out, &self.model);
        out.extend_from_slice(&self.body);
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let key = std::str::from_utf8(bytes.get(..64)?).ok()?.to_owned();
        let expires_at_ms = i64::from_be_bytes(bytes.get(64..72)?.try_into().ok()?);
        let mut at = 72;
        let provider = take_name(bytes, &mut at)?;
        let model = take_name(bytes, &mut at)?;
        Some(Self {
            key,
            expires_at_ms,
            provider,
            model,
            body: bytes.get(at..)?.to_vec(),
        })
    }
}

/// The stored answer for `key` in what its slot holds, unless another key's or expired.
pub fn lookup(slot: Option<&[u8]>, key: &str, now_ms: i64) -> Option<Entry> {
    Entry::decode(slot?).filter(|e| e.key == key && e.expires_at_ms > now_ms)
}

/// The largest answer a slot takes: `max_bytes / max_entries`.
pub fn slot_bytes(max_bytes: u64, max_entries: u32) -> u64 {
    max_bytes / u64::from(max_entries.max(1))
}
