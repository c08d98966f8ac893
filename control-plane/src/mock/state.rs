//! What the mock holds: the script's rules, the recorded calls and their numbering.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Serialize;
use serde_json::Value;

use super::script::Rules;

/// One request the mock received.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Call {
    pub seq: u64,
    pub path: String,
    pub key: Option<String>,
    pub model: Option<String>,
    pub stream: bool,
    pub headers: BTreeMap<String, String>,
    pub body: Value,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) rules: Rules,
    pub(super) calls: Vec<Call>,
    pub(super) seq: u64,
}

impl State {
    /// Records a call under the next number (its `seq` is set here); returns the number.
    pub(super) fn record(&mut self, mut call: Call) -> u64 {
        self.seq += 1;
        call.seq = self.seq;
        self.calls.push(call);
        self.seq
    }

    pub(super) fn reset(&mut self) {
        self.rules = Rules::default();
        self.calls.clear();
        self.seq = 0;
    }
}
