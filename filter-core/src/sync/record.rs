//! The sync record: what the singleton writes last after each update it publishes, and what a
//! worker reads first (24 bytes, big-endian): the pool record's version, when the control plane
//! generated the update, and how many updates the singleton applied since it started.

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncRecord {
    /// Moves when the pool record is rewritten (counted by this Envoy process).
    pub pool_version: u64,
    pub generated_at_ms: i64,
    /// Moves whenever any pushed record changed.
    pub applied: u64,
}

impl SyncRecord {
    pub fn encode(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&self.pool_version.to_be_bytes());
        out[8..16].copy_from_slice(&self.generated_at_ms.to_be_bytes());
        out[16..].copy_from_slice(&self.applied.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; 24] = bytes.try_into().ok()?;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            w
        };
        Some(Self {
            pool_version: u64::from_be_bytes(word(0)),
            generated_at_ms: i64::from_be_bytes(word(8)),
            applied: u64::from_be_bytes(word(16)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_another_length() {
        let r = SyncRecord {
            pool_version: 3,
            generated_at_ms: -5,
            applied: 9,
        };
        assert_eq!(SyncRecord::decode(&r.encode()), Some(r));
        assert_eq!(SyncRecord::decode(&[0; 23]), None);
    }
}
