//! What the filter (wasm) and the control plane (native) must agree on, defined once: names
//! that cross a process boundary and the small rules both sides apply. No I/O, no proxy-wasm:
//! both targets build it.

use sha2::{Digest, Sha256};

/// The gRPC metadata entry that carries the sync token on every `airouter.v1.Sync` call.
pub const SYNC_TOKEN_METADATA: &str = "x-ai-router-sync-token";
/// The environment variable that holds the sync token (control plane and Envoy).
pub const SYNC_TOKEN_ENV: &str = "AI_ROUTER_SYNC_TOKEN";

/// Who holds a half-open breaker's probe lease: one attempt of one request. A probe's outcome
/// releases the lease only when it names the same holder, whole.
pub fn probe_holder(request_id: &str, attempt: u32) -> String {
    format!("{request_id}#{attempt}")
}

/// The 64-bit fingerprint of a secret: the first 8 bytes of its SHA-256, big endian. A
/// blacklist remembers the fingerprint of the secret that was refused, so a new secret lifts it.
pub fn fingerprint(secret: &str) -> u64 {
    let digest = Sha256::digest(secret.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_are_whole_strings() {
        assert_eq!(probe_holder("req-1", 2), "req-1#2");
        assert_ne!(probe_holder("1", 2), probe_holder("12", 2));
        assert!(!probe_holder("12", 1).starts_with(&probe_holder("1", 1)));
    }

    #[test]
    fn fingerprint_is_the_first_eight_bytes_big_endian() {
        let digest = Sha256::digest(b"abc");
        assert_eq!(fingerprint("abc").to_be_bytes(), digest[..8]);
        assert_ne!(fingerprint("sk-a"), fingerprint("sk-b"));
    }
}
