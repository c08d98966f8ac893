//! What the singleton needs from Envoy, as a trait the glue implements with host calls.

use crate::vm::SharedData;

/// How loud a line of the singleton's log is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Error,
}

/// What the singleton needs from Envoy. Every method is one host call (or two), and a failure
/// comes back as the host's word for it.
pub trait SyncHost: SharedData {
    fn now_ms(&self) -> i64;
    /// Opens the watch stream to the control plane and sends `request` on it: the stream's
    /// token, or why it could not be opened.
    fn open_watch(&mut self, request: &[u8]) -> Result<u32, String>;
    fn cancel_watch(&mut self, token: u32);
    /// A unary call of the sync service: the call's token, or why it could not be made.
    fn call(&mut self, method: &str, message: &[u8], timeout_ms: u64) -> Result<u32, String>;
    /// The next message of the workers' report queue.
    fn dequeue(&mut self) -> Option<Vec<u8>>;
    fn log(&mut self, level: Level, line: &str);
    /// Takes `n` outcomes off the pending-reports gauge.
    fn reports_settled(&mut self, n: u64);
    /// The state version the workers now read (the applied-state gauge).
    fn state_applied(&mut self, version: u64);
}
