//! The send: the scope's headroom reserved, the provider request built and applied, the
//! lane recorded for the answer.

use ai_router_proto::v1::ProviderKind;
use serde_json::Value;

use crate::answer::errors::{ErrorCode, GatewayError};
use crate::classify::Class;
use crate::host::{Flow, Host, Side};
use crate::lanes::embeddings;
use crate::lanes::{self};
use crate::plan::{Operation, Protocol};
use crate::protocols::anthropic::{self, ANTHROPIC_VERSION};
use crate::protocols::messages::Fidelity;
use crate::protocols::{self};
use crate::sync::state::State;
use crate::vm::local::Send;
use crate::wire::headers;
use ai_router_contract::headers::ATTEMPT as H_ATTEMPT;

use super::{Attempt, Lane, CLUSTER_HEADER};

/// After this many reservations lost in a row, the attempt takes the lane's rate limit as
/// reached (the other workers keep sending; this one stops racing them).
pub(super) const MAX_RESERVATIONS_LOST: u32 = 8;

impl Attempt {
    /// Sends the attempt to `chosen`: the body and headers for its provider.
    pub(super) fn send_to(
        &mut self,
        host: &mut impl Host,
        state: &State,
        chosen: lanes::Chosen,
    ) -> Flow {
        let Some(plan) = self.plan.clone() else {
            return self.give_up(host, None, None);
        };
        let client_body = std::mem::take(&mut self.body);
        let body = client_body.as_slice();
        // By identity, not by position: after a lease reply `state` may be a newer snapshot
        // than the one the lane was picked from. A lane that is gone is picked again.
        let Some((provider, key)) = lanes::lane_in(state, &chosen.lane) else {
            self.body = body.to_vec();
            return self.prepare(host);
        };
        // The pick read the scope's headroom; the reservation takes its share of it atomically
        // (another worker may have taken the last of it meanwhile: then pick again).
        let scope = crate::sync::state::scope_of(key).to_owned();
        let now = host.now_ms();
        let allowances: Vec<_> = lanes::allowances(&chosen.health, &scope, &chosen.lane.model, now)
            .into_iter()
            .map(|(a, _)| a)
            .collect();
        let send = Send {
            scope,
            model: chosen.lane.model.clone(),
            at_ms: now,
            tokens: plan.tokens,
        };
        if !host.reserve_send(&provider.id, send.clone(), &allowances) {
            self.body = body.to_vec();
            self.reservations_lost += 1;
            if self.reservations_lost > MAX_RESERVATIONS_LOST {
                return self.give_up(host, Some(Class::RateLimit), None);
            }
            return self.prepare(host);
        }
        self.reservations_lost = 0;
        self.reserved = Some((provider.id.clone(), send));

        // The body for this provider: its model id, usage asked for on streams.
        let mut value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let gemini = plan.protocol == Protocol::Gemini;
        let native = match gemini {
            true => crate::protocols::gemini_native::serves(provider.kind(), plan.json_array),
            false => protocols::native(plan.protocol, provider.kind()),
        };
        if gemini && !native {
            // The caller's Gemini body, translated for this lane as the front stage routed it.
            value = match crate::protocols::gemini::to_chat_request(
                &chosen.lane.model,
                plan.stream,
                &value,
            ) {
                Ok(v) => v,
                Err(e) => return self.refuse(host, e),
            };
        }
        self.stored_id = crate::lanes::response_pins::Watch::new(plan.responses.as_ref(), native);
        if plan.protocol == Protocol::Responses {
            self.request = value.clone();
        }
        if !native && !protocols::carries_chat(plan.protocol) {
            value = match protocols::chat_request(plan.protocol, &value, Fidelity::Strict) {
                Ok(v) => v,
                Err(e) => return self.refuse(host, e),
            };
        }
        if let Some(obj) = value.as_object_mut() {
            obj.insert("model".into(), Value::String(chosen.lane.model.clone()));
            if plan.stream && !native {
                let opts = obj
                    .entry("stream_options")
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Some(o) = opts.as_object_mut() {
                    o.insert("include_usage".into(), Value::Bool(true));
                }
            }
        }
        let anthropic = provider.kind() == ProviderKind::Anthropic;
        if anthropic && plan.op == Operation::Chat && !native {
            let max_tokens = if provider.default_max_tokens > 0 {
                provider.default_max_tokens
            } else {
                ai_router_contract::defaults::DEFAULT_MAX_TOKENS
            };
            value = match anthropic::to_messages_request(&value, &chosen.lane.model, max_tokens) {
                Ok(mut v) => {
                    crate::protocols::prompt_cache::mark_translated(
                        &value,
                        &mut v,
                        &plan.prompt_cache,
                    );
                    v
                }
                Err(e) => return self.refuse(host, e),
            };
        }
        if gemini && native {
            value = crate::protocols::gemini_native::request(&value);
        }
        let new_body = serde_json::to_vec(&value).unwrap_or_else(|_| body.to_vec());
        host.set_body(Side::Request, 0, body.len(), &new_body);
        host.set_header(Side::Request, "content-length", None);

        let api_path = if native && plan.count_tokens {
            "/messages/count_tokens"
        } else if native {
            protocols::native_path(plan.protocol)
        } else if anthropic && plan.op == Operation::Chat {
            "/messages"
        } else {
            plan.op.path()
        };
        let path = match gemini && native {
            true => crate::protocols::gemini_native::path(
                &provider.base_path,
                &chosen.lane.model,
                plan.stream,
            ),
            false => format!("{}{}", provider.base_path, api_path),
        };
        let cluster = if provider.scheme == "https" {
            ai_router_contract::clusters::PROVIDERS_TLS
        } else {
            ai_router_contract::clusters::PROVIDERS_PLAIN
        };
        host.set_header(Side::Request, ":authority", Some(&provider.authority));
        host.set_header(Side::Request, ":path", Some(&path));
        host.set_header(Side::Request, CLUSTER_HEADER, Some(cluster));
        // Only the allowlisted client headers go on; the provider's own are added below.
        for name in host.header_names(Side::Request) {
            if !headers::forwarded_to_provider(&name) && name != CLUSTER_HEADER {
                host.set_header(Side::Request, &name, None);
            }
        }
        for h in &provider.headers {
            let lower = h.name.to_ascii_lowercase();
            if lower != "authorization" && lower != "x-api-key" && lower != provider.auth_header {
                host.set_header(Side::Request, &lower, Some(&h.value));
            }
        }
        if key.secret.is_empty() {
            // A keyless provider: the client's credentials were removed above, none is added.
        } else if provider.auth_header == "authorization" || provider.auth_header.is_empty() {
            host.set_header(
                Side::Request,
                "authorization",
                Some(&format!("Bearer {}", key.secret)),
            );
        } else {
            host.set_header(Side::Request, &provider.auth_header, Some(&key.secret));
        }
        if gemini && native && !key.secret.is_empty() {
            // Google's own API takes the key as `x-goog-api-key`.
            host.set_header(Side::Request, "authorization", None);
            host.set_header(Side::Request, &provider.auth_header, None);
            host.set_header(Side::Request, "x-goog-api-key", Some(&key.secret));
        }
        if anthropic && native {
            // The caller's own version and betas: its body is sent as it wrote it.
            let version = plan
                .anthropic_version
                .as_deref()
                .unwrap_or(ANTHROPIC_VERSION);
            host.set_header(Side::Request, "anthropic-version", Some(version));
            if let Some(beta) = plan.anthropic_beta.as_deref() {
                host.set_header(Side::Request, "anthropic-beta", Some(beta));
            }
        } else if anthropic {
            host.set_header(Side::Request, "anthropic-version", Some(ANTHROPIC_VERSION));
        }
        if !plan.rid.is_empty() {
            host.set_header(Side::Request, "x-request-id", Some(&plan.rid));
        }
        if !plan.idempotency_key.is_empty() {
            host.set_header(
                Side::Request,
                "idempotency-key",
                Some(&plan.idempotency_key),
            );
        }
        if plan.stream {
            host.set_header(Side::Request, "accept", Some("text/event-stream"));
        }

        let capacity = provider
            .models
            .iter()
            .find(|m| m.id == chosen.lane.model)
            .and_then(|m| crate::protocols::context::lane_capacity(provider, m));
        let model_identity =
            embeddings::identity_of(state, &chosen.lane.provider, &chosen.lane.model);
        let dimensions =
            embeddings::dimensions_of(state, &chosen.lane.provider, &chosen.lane.model);
        host.with_call(&plan.cid, |c| {
            c.tried.push(chosen.lane.clone());
            c.attempts = c.attempts.max(self.attempt);
            if plan.op == Operation::Embeddings && c.identity.is_none() {
                c.identity = model_identity;
            }
        });
        // The caller's `dimensions` is what the answer is checked against; else the model's.
        let requested = value
            .get("dimensions")
            .and_then(Value::as_u64)
            .filter(|_| plan.op == Operation::Embeddings)
            .map(|d| d as usize);
        self.dimensions = requested.or(dimensions);
        self.forward_rate_limits = state.forward_rate_limit_headers();
        self.content = state
            .include_content()
            .then(|| crate::answer::content::Content::of_request(body, key.secret.len()));
        self.probe = chosen.probe.is_some();
        // The reservation's instant: the report's `at_ms - latency_ms` is then the send the
        // sends record holds, which the quota ledger counts its estimate by.
        self.started_ms = now;
        host.add_in_flight(&chosen.lane.provider, &chosen.lane.key, 1);
        self.lane = Some(Lane {
            id: chosen.lane,
            kind: provider.kind(),
            native,
            secret: key.secret.clone(),
            fingerprint: key.fingerprint,
            daily_reset: ai_router_contract::kinds::DailyReset::parse(&provider.daily_reset_zone),
            rate_limit_windows: (
                provider.requests_window().window(),
                provider.tokens_window().window(),
            ),
            capacity,
        });
        // From here, not before: a wait for a lane, a backoff or a probe lease is the call's
        // (bounded by its deadline), not this attempt's.
        self.bound_ms = Some(self.started_ms.saturating_add(plan.timeout_ms as i64));
        // Kept until the answer is judged: a verdict resting on words the client sent is not
        // trusted ([`Failure::unless_echoed`]).
        self.body = client_body;
        Flow::Continue
    }

    /// The request cannot be expressed for this lane's provider: the caller's to fix (400).
    /// Nothing was sent, so the reservation goes back to the scope.
    pub(super) fn refuse(&mut self, host: &mut impl Host, e: anthropic::AdapterError) -> Flow {
        if let Some((provider, send)) = self.reserved.take() {
            host.release_send(&provider, &send);
        }
        let mut err = GatewayError::new(ErrorCode::InvalidRequest, e.message);
        err.param = e.param;
        let attempts = host.call_attempts(self.cid()).unwrap_or(0).to_string();
        host.send_response(
            400,
            &[("content-type", "application/json"), (H_ATTEMPT, &attempts)],
            &err.body(),
        );
        Flow::Pause
    }
}

#[cfg(test)]
#[path = "send_tests.rs"]
mod tests;
