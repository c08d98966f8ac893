//! The paused states of a call: waiting for the gateway's first state (a fresh Envoy), and a
//! local cache miss waiting for the shared tier's answer.

use super::{AfterState, Front, SharedWait, StateWait, STATE_POLL_MS, STATE_WAIT_MS};
use crate::answer::errors::GatewayError;
use crate::host::{Flow, Host};

impl Front {
    /// The shared tier's answer to a missed call: a hit is answered as a local one, anything
    /// else (an error, the bound passed, nothing stored) goes to the providers.
    pub fn on_grpc_call_response(
        &mut self,
        host: &mut impl Host,
        token: u32,
        status: u32,
        size: usize,
    ) {
        if self.shared_wait.as_ref().is_none_or(|w| w.token != token) {
            return;
        }
        let Some(wait) = self.shared_wait.take() else {
            return;
        };
        let entry = (status == 0)
            .then(|| host.grpc_call_response_body(size))
            .flatten()
            .and_then(|b| {
                <ai_router_proto::v1::SharedCacheGetReply as prost::Message>::decode(b.as_slice())
                    .ok()
            })
            .map(|r| r.entry);
        let now = host.now_ms();
        let flow = if self.cache.shared_answer(host, entry.as_deref(), now) {
            match self
                .cache
                .hit_answer(wait.resolved.stream, wait.resolved.include_usage)
            {
                Some((content_type, body, model)) => {
                    self.answer_from_cache(host, content_type, &model, &body)
                }
                None => Flow::Pause,
            }
        } else {
            let SharedWait {
                state,
                key,
                resolved,
                parsed,
                op,
                ..
            } = *wait;
            self.plan_call(host, &state, &key, resolved, &parsed, op)
        };
        if flow == Flow::Continue {
            host.resume_request();
        }
    }

    /// Waits for the state (see [`STATE_WAIT_MS`]): a timer, then [`Front::on_http_call_response`]
    /// looks again.
    pub(super) fn wait_for_state(&mut self, host: &mut impl Host, then: AfterState) -> Flow {
        let now = host.now_ms();
        let (since_ms, body) = match self.state_wait.take() {
            Some(w) => (w.since_ms, w.body),
            None => (now, None),
        };
        if now.saturating_sub(since_ms) >= STATE_WAIT_MS {
            return self.reply(host, GatewayError::not_ready());
        }
        match crate::attempt::timer(host, now + STATE_POLL_MS) {
            Ok(token) => {
                self.state_wait = Some(StateWait {
                    token,
                    since_ms,
                    then,
                    body,
                });
                Flow::Pause
            }
            Err(_) => self.reply(host, GatewayError::not_ready()),
        }
    }

    /// The answer to an HTTP call this stage dispatched: the timer of a wait for the state.
    pub fn on_http_call_response(&mut self, host: &mut impl Host, token: u32) {
        let Some(then) = self
            .state_wait
            .as_ref()
            .filter(|w| w.token == token)
            .map(|w| w.then.clone())
        else {
            return;
        };
        if host.state().is_none() {
            // Armed again, or answered once the wait is over.
            let _ = self.wait_for_state(host, then);
            return;
        }
        let body = self.state_wait.take().and_then(|w| w.body);
        let flow = match then {
            AfterState::Models(path) => self.models(host, &path),
            AfterState::Call { end_of_stream } => {
                match (self.with_state(host, end_of_stream), body) {
                    (Flow::Pause, Some(body)) if self.answered.is_none() => {
                        self.take_body(host, body)
                    }
                    (flow, _) => flow,
                }
            }
        };
        if flow == Flow::Continue {
            host.resume_request();
        }
    }
}
