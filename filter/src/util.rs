//! Small helpers shared by the stages.

use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256, the form virtual keys are pushed in.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The 64-bit fingerprint of a secret: the first 8 bytes of its SHA-256, big endian.
pub fn fingerprint(secret: &str) -> u64 {
    let digest = Sha256::digest(secret.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// Replaces every occurrence of `secret` in `text` with `[redacted]`.
pub fn redact(text: &str, secret: &str) -> String {
    if secret.len() < 4 {
        return text.to_string();
    }
    text.replace(secret, "[redacted]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_stable_and_distinct() {
        assert_eq!(fingerprint("sk-a"), fingerprint("sk-a"));
        assert_ne!(fingerprint("sk-a"), fingerprint("sk-b"));
        // Matches the control plane's definition: first 8 bytes of SHA-256.
        let d = Sha256::digest(b"abc");
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
}
