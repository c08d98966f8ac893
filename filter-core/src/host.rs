//! What a stage needs from Envoy, as a trait: the stream's headers and bodies, a local answer,
//! the clock, the pushed state and this VM's shared bookkeeping. The filter implements it over
//! `proxy_wasm::hostcalls` (`filter/src/glue/host.rs`); the tests here implement it with a fake
//! ([`fake::FakeHost`]) and drive the stages through whole calls on the host.

use std::rc::Rc;

use ai_router_proto::v1::RequestOutcome;

use crate::calls::Call;
use crate::state::State;

/// What a callback tells Envoy to do with the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Pause,
}

/// One of the stream's two header maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Request,
    Response,
}

pub trait Host {
    /// The raw value of a header (values need not be UTF-8).
    fn header(&self, side: Side, name: &str) -> Option<Vec<u8>>;
    /// The names of every header of that side.
    fn header_names(&self, side: Side) -> Vec<String>;
    /// Sets (or with `None` removes) a header.
    fn set_header(&mut self, side: Side, name: &str, value: Option<&str>);
    /// `size` bytes from `start` of the body received so far.
    fn body(&self, side: Side, start: usize, size: usize) -> Vec<u8>;
    /// Replaces `size` bytes from `start` of the body with `bytes`.
    fn set_body(&mut self, side: Side, start: usize, size: usize, bytes: &[u8]);
    /// Answers the stream locally.
    fn send_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]);

    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
    /// The freshest pushed state, if any has arrived.
    fn state(&self) -> Option<Rc<State>>;
    /// Counts one request of a virtual key in a UTC minute across the process; the count
    /// including this one, `None` when it could not be counted.
    fn count_minute_request(&mut self, key_id: &str, minute: i64) -> Option<u32>;
    /// Opens this VM's bookkeeping for a new call; returns its id.
    fn new_call(&mut self, now_ms: i64) -> String;
    /// The attempts the call made so far.
    fn call_attempts(&self, call_id: &str) -> Option<u32>;
    /// Closes a call's bookkeeping and returns it.
    fn end_call(&mut self, call_id: &str) -> Option<Call>;
    /// Queues a request outcome for the control plane.
    fn report_request(&mut self, outcome: RequestOutcome);

    /// A header's value when it is UTF-8 text; a value that is not is opaque, as if absent.
    fn header_text(&self, side: Side, name: &str) -> Option<String> {
        self.header(side, name)
            .and_then(|v| String::from_utf8(v).ok())
    }
}

#[cfg(test)]
pub mod fake {
    //! A host for tests: header maps, bodies, a clock, a state and the calls, all in memory, and
    //! a record of what the stage did (local answers, reports).

    use std::collections::HashMap;
    use std::rc::Rc;

    use ai_router_proto::v1::RequestOutcome;

    use super::{Host, Side};
    use crate::calls::Call;
    use crate::state::State;

    #[derive(Debug, Clone, PartialEq)]
    pub struct LocalAnswer {
        pub status: u16,
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
    }

    impl LocalAnswer {
        pub fn json(&self) -> serde_json::Value {
            serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
        }
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }
    }

    #[derive(Default)]
    pub struct FakeHost {
        pub request_headers: Vec<(String, Vec<u8>)>,
        pub response_headers: Vec<(String, Vec<u8>)>,
        pub request_body: Vec<u8>,
        pub response_body: Vec<u8>,
        pub answered: Option<LocalAnswer>,
        pub now: i64,
        pub state: Option<Rc<State>>,
        pub minute_counts: HashMap<(String, i64), u32>,
        pub calls: HashMap<String, Call>,
        pub next_call: u64,
        pub reports: Vec<RequestOutcome>,
    }

    impl FakeHost {
        pub fn with_state(state: State) -> Self {
            Self {
                now: 1_700_000_000_000,
                state: Some(Rc::new(state)),
                ..Self::default()
            }
        }

        fn map(&self, side: Side) -> &Vec<(String, Vec<u8>)> {
            match side {
                Side::Request => &self.request_headers,
                Side::Response => &self.response_headers,
            }
        }

        fn map_mut(&mut self, side: Side) -> &mut Vec<(String, Vec<u8>)> {
            match side {
                Side::Request => &mut self.request_headers,
                Side::Response => &mut self.response_headers,
            }
        }

        /// Adds a header as a client or an upstream would send it.
        pub fn add(&mut self, side: Side, name: &str, value: &[u8]) {
            self.map_mut(side).push((name.to_string(), value.to_vec()));
        }

        pub fn text(&self, side: Side, name: &str) -> Option<String> {
            self.header_text(side, name)
        }
    }

    impl Host for FakeHost {
        fn header(&self, side: Side, name: &str) -> Option<Vec<u8>> {
            self.map(side)
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
        fn header_names(&self, side: Side) -> Vec<String> {
            self.map(side).iter().map(|(k, _)| k.clone()).collect()
        }
        fn set_header(&mut self, side: Side, name: &str, value: Option<&str>) {
            let map = self.map_mut(side);
            map.retain(|(k, _)| k != name);
            if let Some(v) = value {
                map.push((name.to_string(), v.as_bytes().to_vec()));
            }
        }
        fn body(&self, side: Side, start: usize, size: usize) -> Vec<u8> {
            let body = match side {
                Side::Request => &self.request_body,
                Side::Response => &self.response_body,
            };
            body.iter().skip(start).take(size).copied().collect()
        }
        fn set_body(&mut self, side: Side, start: usize, size: usize, bytes: &[u8]) {
            let body = match side {
                Side::Request => &mut self.request_body,
                Side::Response => &mut self.response_body,
            };
            let end = (start + size).min(body.len());
            let start = start.min(end);
            body.splice(start..end, bytes.iter().copied());
        }
        fn send_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
            self.answered = Some(LocalAnswer {
                status,
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                body: body.to_vec(),
            });
        }
        fn now_ms(&self) -> i64 {
            self.now
        }
        fn state(&self) -> Option<Rc<State>> {
            self.state.clone()
        }
        fn count_minute_request(&mut self, key_id: &str, minute: i64) -> Option<u32> {
            let n = self
                .minute_counts
                .entry((key_id.to_string(), minute))
                .or_default();
            *n += 1;
            Some(*n)
        }
        fn new_call(&mut self, now_ms: i64) -> String {
            self.next_call += 1;
            let id = format!("call-{}", self.next_call);
            self.calls.insert(
                id.clone(),
                Call {
                    created_ms: now_ms,
                    ..Call::default()
                },
            );
            id
        }
        fn call_attempts(&self, call_id: &str) -> Option<u32> {
            self.calls.get(call_id).map(|c| c.attempts)
        }
        fn end_call(&mut self, call_id: &str) -> Option<Call> {
            self.calls.remove(call_id)
        }
        fn report_request(&mut self, outcome: RequestOutcome) {
            self.reports.push(outcome);
        }
    }
}
