//! What the workers of one Envoy share: records in the host's shared data, each changed with
//! one compare-and-swap loop ([`cas_update`]) over the [`SharedData`] trait (the wasm host in
//! the filter's glue, a map in the tests), and this VM's call table ([`calls`]).
//!
//! - [`records`]: in-flight counts, billing-scope sends, a key's minute record, the holds one
//!   worker puts on lanes for all;
//! - [`calls`]: this VM's calls in progress and their sweep;
//! - [`busy`]: callbacks the host delivered while their stage was already running;
//! - [`gauge`]: the metrics the filter keeps of that bookkeeping.
//!
//! The per-VM state the filter's roots own, and the stages' host made of it, are
//! [`crate::worker`] (above this folder: it reads the pushed state and the sync record too).

pub mod backoff;
pub mod busy;
pub mod call;
pub mod calls;
pub mod gauge;
pub mod lane_records;
pub mod local;
pub mod minute_lease;
pub mod plugin;
pub mod records;
pub mod reports;
pub mod round_robin;
pub mod view;

/// A shared-data call that did not succeed: what the host's status means to a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedError {
    /// Another worker wrote the record after it was read (the CAS token is stale).
    CasMismatch,
    /// The host refused the call (any other status).
    Failed,
}

/// The host's shared data: records by name, each with a version (the CAS token) the host moves
/// on every write.
pub trait SharedData {
    /// The record `name` (`None`: never written) and its CAS token.
    fn get(&self, name: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedError>;
    /// Writes `name` when it is still the version `cas` (`None`: whatever it holds).
    fn set(&mut self, name: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedError>;
}

/// What one pass of a [`cas_update`] does with the record it read.
pub enum Change<R> {
    /// Write these bytes (if the record did not move meanwhile), then answer `R`.
    Write(Vec<u8>, R),
    /// Leave the record as it is and answer `R`.
    Keep(R),
}

/// Passes of a [`cas_update`] before it gives up to the other writers.
pub const CAS_TRIES: usize = 16;

/// Read-modify-writes the record `name` with compare-and-swap: `change` sees the record as read
/// (`None`: never written) and says what to write; when another worker wrote it meanwhile, it
/// is read and changed again, up to [`CAS_TRIES`] times. The answer of the pass that was
/// written (or kept); the error when a call failed or the record kept moving.
pub fn cas_update<R>(
    shared: &mut impl SharedData,
    name: &str,
    mut change: impl FnMut(Option<&[u8]>) -> Change<R>,
) -> Result<R, SharedError> {
    for _ in 0..CAS_TRIES {
        let (bytes, cas) = shared.get(name)?;
        match change(bytes.as_deref()) {
            Change::Keep(out) => return Ok(out),
            Change::Write(value, out) => match shared.set(name, &value, cas) {
                Ok(()) => return Ok(out),
                Err(SharedError::CasMismatch) => continue,
                Err(e) => return Err(e),
            },
        }
    }
    Err(SharedError::CasMismatch)
}

/// The record `name` decoded, or the default when it is absent, unreadable or undecodable.
pub fn read_record<T: Default>(
    shared: &impl SharedData,
    name: &str,
    decode: impl Fn(&[u8]) -> Option<T>,
) -> T {
    match shared.get(name) {
        Ok((Some(bytes), _)) => decode(&bytes).unwrap_or_default(),
        _ => T::default(),
    }
}

/// A record that holds something (`None` also for an empty record: a slot cleared).
pub fn read_bytes(shared: &impl SharedData, name: &str) -> Option<Vec<u8>> {
    match shared.get(name) {
        Ok((Some(bytes), _)) if !bytes.is_empty() => Some(bytes),
        _ => None,
    }
}

/// A record and its CAS token (`None` for an empty record), `(None, None)` when unreadable.
pub fn read_versioned(shared: &impl SharedData, name: &str) -> (Option<Vec<u8>>, Option<u32>) {
    match shared.get(name) {
        Ok((bytes, cas)) => (bytes.filter(|b| !b.is_empty()), cas),
        Err(_) => (None, None),
    }
}

/// Shared data in memory, with the host's CAS rule: every write moves the record's version,
/// a write with a stale token is refused. Writes to a name can be made to fail
/// ([`MemoryShared::fail`]) or to race with another worker ([`MemoryShared::race`]).
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default, Clone)]
pub struct MemoryShared {
    pub records: std::collections::HashMap<String, (Vec<u8>, u32)>,
    /// Names whose next writes fail, with how many.
    pub failing: std::collections::HashMap<String, u32>,
    /// Names whose next writes lose a race (another worker writes first), with how many.
    pub racing: std::collections::HashMap<String, u32>,
}

#[cfg(any(test, feature = "testing"))]
impl MemoryShared {
    /// The next `times` writes of `name` fail.
    pub fn fail(&mut self, name: &str, times: u32) {
        self.failing.insert(name.to_owned(), times);
    }

    /// The next `times` writes of `name` find it written by another worker.
    pub fn race(&mut self, name: &str, times: u32) {
        self.racing.insert(name.to_owned(), times);
    }

    /// The bytes of `name`, if written.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.records.get(name).map(|(b, _)| b.as_slice())
    }

    fn take(map: &mut std::collections::HashMap<String, u32>, name: &str) -> bool {
        match map.get_mut(name) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

#[cfg(any(test, feature = "testing"))]
impl SharedData for MemoryShared {
    fn get(&self, name: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedError> {
        Ok(match self.records.get(name) {
            Some((bytes, version)) => (Some(bytes.clone()), Some(*version)),
            None => (None, None),
        })
    }

    fn set(&mut self, name: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedError> {
        if Self::take(&mut self.failing, name) {
            return Err(SharedError::Failed);
        }
        let version = self.records.get(name).map(|(_, v)| *v);
        if Self::take(&mut self.racing, name) {
            let (bytes, _) = self.records.get(name).cloned().unwrap_or_default();
            self.records
                .insert(name.to_owned(), (bytes, version.unwrap_or(0) + 1));
            return Err(SharedError::CasMismatch);
        }
        if cas.is_some() && cas != version {
            return Err(SharedError::CasMismatch);
        }
        self.records
            .insert(name.to_owned(), (value.to_vec(), version.unwrap_or(0) + 1));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_race_is_read_and_changed_again() {
        let mut shared = MemoryShared::default();
        shared.race("n", 3);
        let mut passes = 0;
        let out = cas_update(&mut shared, "n", |_| {
            passes += 1;
            Change::Write(b"x".to_vec(), passes)
        });
        assert_eq!(out, Ok(4));
        assert_eq!(shared.bytes("n"), Some(&b"x"[..]));
    }

    #[test]
    fn a_record_that_keeps_moving_is_given_up() {
        let mut shared = MemoryShared::default();
        shared.race("n", 100);
        let out = cas_update(&mut shared, "n", |_| Change::Write(b"x".to_vec(), ()));
        assert_eq!(out, Err(SharedError::CasMismatch));
    }

    #[test]
    fn a_failed_write_is_an_error_and_a_kept_record_is_not_written() {
        let mut shared = MemoryShared::default();
        shared.fail("n", 1);
        let out = cas_update(&mut shared, "n", |_| Change::Write(b"x".to_vec(), ()));
        assert_eq!(out, Err(SharedError::Failed));
        assert_eq!(cas_update(&mut shared, "n", |_| Change::Keep(7)), Ok(7));
        assert_eq!(shared.bytes("n"), None);
    }
}
