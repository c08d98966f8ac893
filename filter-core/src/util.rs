//! Small helpers shared by the stages.

/// Lowercase hex SHA-256, the form virtual keys are pushed in.
pub use ai_router_contract::sha256_hex;

pub use ai_router_contract::fingerprint;

/// Replaces every occurrence of `secret` in `text` with `[redacted]`.
pub fn redact(text: &str, secret: &str) -> String {
    if secret.len() < 4 {
        return text.to_string();
    }
    text.replace(secret, "[redacted]")
}

/// `bytes` with every occurrence of `secret` replaced by `[redacted]`, or `None` when it holds
/// none (the common case, which copies nothing). Works on raw bytes: a provider's answer need
/// not be UTF-8 for its echo of a key to be caught.
pub fn redact_bytes(bytes: &[u8], secret: &str) -> Option<Vec<u8>> {
    let needle = secret.as_bytes();
    if needle.len() < 4 || bytes.len() < needle.len() {
        return None;
    }
    let first = find(bytes, needle)?;
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    let mut at = Some(first);
    while let Some(i) = at {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(b"[redacted]");
        rest = &rest[i + needle.len()..];
        at = find(rest, needle);
    }
    out.extend_from_slice(rest);
    Some(out)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
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
    fn redacts_secret() {
        assert_eq!(
            redact("bad key sk-123456", "sk-123456"),
            "bad key [redacted]"
        );
        assert_eq!(sha256_hex(b"").len(), 64);
    }

    #[test]
    fn redacts_bytes() {
        let secret = "sk-secret-1234";
        assert_eq!(redact_bytes(b"nothing here", secret), None);
        assert_eq!(
            redact_bytes(b"a sk-secret-1234 b sk-secret-1234", secret).as_deref(),
            Some(&b"a [redacted] b [redacted]"[..])
        );
        assert_eq!(
            redact_bytes(b"\xe9sk-secret-1234\xff", secret).as_deref(),
            Some(&b"\xe9[redacted]\xff"[..])
        );
        assert_eq!(redact_bytes(b"sk-s", "sk-"), None);
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
