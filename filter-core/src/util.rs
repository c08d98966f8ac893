//! Small helpers shared by the stages.

/// Lowercase hex SHA-256, the form virtual keys are pushed in.
pub use ai_router_contract::sha256_hex;

pub use ai_router_contract::fingerprint;

pub use crate::redact::{redact, redact_bytes};

/// The wait after the n-th failure in a row, every retry of the filter's: a call's next
/// attempt, the sync stream's reconnect, a report batch's next send. min(maxMs, baseMs *
/// factor^(n-1)) scaled by `unit_random` into [0.5, 1) of it (1.0: no jitter).
pub fn backoff_ms(b: &ai_router_proto::v1::BackoffSettings, n: u32, unit_random: f64) -> u64 {
    let exp = b.factor.powi(n.saturating_sub(1).min(64) as i32);
    let raw = (b.base_ms as f64 * exp).min(b.max_ms as f64);
    (raw * (0.5 + 0.5 * unit_random.clamp(0.0, 1.0))) as u64
}

/// The backoff of the singleton's retries towards the control plane (the sync stream's
/// reconnect, a report batch): 250 ms doubling up to 5 s, without jitter.
pub const CONTROL_PLANE_RETRY: ai_router_proto::v1::BackoffSettings =
    ai_router_proto::v1::BackoffSettings {
        base_ms: 250,
        factor: 2.0,
        max_ms: 5_000,
    };

/// The wait before the n-th retry in a row towards the control plane.
pub fn control_plane_retry_ms(n: u32) -> i64 {
    backoff_ms(&CONTROL_PLANE_RETRY, n.max(1), 1.0) as i64
}

/// A path segment with its `%XX` escapes decoded; `None` when an escape is malformed or the
/// result is not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_string());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_stable_and_distinct() {
        assert_eq!(fingerprint("sk-a"), fingerprint("sk-a"));
        assert_ne!(fingerprint("sk-a"), fingerprint("sk-b"));
        // Matches the control plane's definition: first 8 bytes of SHA-256.
        let d = <sha2::Sha256 as sha2::Digest>::digest(b"abc");
        assert_eq!(fingerprint("abc").to_be_bytes(), d[..8]);
    }

    #[test]
    fn sha256_hex_is_64_hex_digits() {
        assert_eq!(sha256_hex(b"").len(), 64);
    }

    #[test]
    fn percent_decodes_path_segments() {
        assert_eq!(
            percent_decode("openai%2Fgpt-4o-mini").as_deref(),
            Some("openai/gpt-4o-mini")
        );
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("caf%C3%A9").as_deref(), Some("café"));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("bad%zz"), None);
        assert_eq!(percent_decode("%FF"), None);
    }
}
