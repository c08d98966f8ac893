//! The front stage: once per client request on the public listener.

use ai_router_proto::v1::{RequestOutcome, Usage as ProtoUsage};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use serde_json::{json, Value};

use super::host::{self, Body, Headers};
use super::shared::{self, now_ms};
use ai_router_filter_core::errors::GatewayError;
use ai_router_filter_core::headers;
use ai_router_filter_core::plan::{Operation, Plan, PLAN_HEADER};
use ai_router_filter_core::quota;
use ai_router_filter_core::resolve;
use ai_router_filter_core::util::sha256_hex;

/// Response headers the attempt stage uses to talk to this stage.
pub const H_RETRY: &str = "x-ai-router-retry";
pub const H_FINAL_STATUS: &str = "x-ai-router-final-status";
pub const H_ATTEMPT: &str = "x-ai-router-attempt";
pub const H_LANE_MODEL: &str = "x-ai-router-lane-model";
pub const H_RETRY_AFTER: &str = "x-ai-router-retry-after";

#[derive(Default)]
pub struct Front {
    op: Option<Operation>,
    cid: Option<String>,
    rid: String,
    vk_id: String,
    started_ms: i64,
    /// Set when this stage answered itself.
    answered: Option<(u16, &'static str)>,
    /// Replace whatever body comes back with this (a router-level failure).
    replace_body: Option<Vec<u8>>,
    status: u16,
    key: Option<ai_router_proto::v1::VirtualKey>,
    /// The state the request was authenticated against; its body is routed by the same one.
    state: Option<std::rc::Rc<ai_router_filter_core::state::State>>,
}

impl Front {
    fn reply(&mut self, err: GatewayError) -> Action {
        self.answered = Some((err.status, err.code));
        let retry_after = err.retry_after_s.map(|s| s.to_string());
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", "application/json"),
            ("x-request-id", &self.rid),
        ];
        if let Some(r) = retry_after.as_deref() {
            headers.push(("retry-after", r));
        }
        host::send_response(err.status, &headers, &err.body());
        Action::Pause
    }

    fn models(&mut self, path: &str) -> Action {
        let Some(state) = shared::current_state() else {
            return self.reply(GatewayError::not_ready());
        };
        let Some(key) = self.authenticate(&state) else {
            return Action::Pause;
        };
        let names = resolve::model_list(&state, &key);
        let item = |id: &str| json!({ "id": id, "object": "model", "created": 0, "owned_by": "ai-router" });
        let body = match path.strip_prefix("/v1/models/") {
            Some(id) if !id.is_empty() => {
                if !names.iter().any(|n| n == id) {
                    return self.reply(
                        GatewayError::new(
                            404,
                            "model_not_found",
                            format!("The model '{id}' does not exist or this key may not call it."),
                        )
                        .with_param("model"),
                    );
                }
                item(id)
            }
            _ => {
                json!({ "object": "list", "data": names.iter().map(|n| item(n)).collect::<Vec<_>>() })
            }
        };
        self.answered = Some((200, "models"));
        let bytes = body.to_string().into_bytes();
        host::send_response(
            200,
            &[
                ("content-type", "application/json"),
                ("x-request-id", &self.rid),
            ],
            &bytes,
        );
        Action::Pause
    }

    /// `GET /health` (no key): ok while some provider has a usable key, else degraded.
    fn health(&mut self) -> Action {
        let (status, code) = match shared::current_state() {
            None => (503, "starting"),
            Some(state) if ai_router_filter_core::state::any_usable_key(&state, now_ms()) => {
                (200, "ok")
            }
            Some(_) => (200, "degraded"),
        };
        self.answered = Some((status, "health"));
        let body = json!({ "status": code }).to_string().into_bytes();
        host::send_response(status, &[("content-type", "application/json")], &body);
        Action::Pause
    }

    /// The virtual key of the bearer token, or an answer already sent.
    fn authenticate(
        &mut self,
        state: &ai_router_filter_core::state::State,
    ) -> Option<ai_router_proto::v1::VirtualKey> {
        let header = match Headers::Request.get_bytes("authorization") {
            None => String::new(),
            Some(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(_) => {
                    self.reply(
                        GatewayError::new(
                            400,
                            "invalid_request",
                            "The Authorization header is not valid text; send `Bearer <virtual key>`.",
                        )
                        .with_param("authorization"),
                    );
                    return None;
                }
            },
        };
        let token = header
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim())
            .unwrap_or("");
        if token.is_empty() {
            self.reply(GatewayError::missing_api_key());
            return None;
        }
        match state.virtual_key(&sha256_hex(token.as_bytes())) {
            Some(k) if k.enabled => {
                self.vk_id = k.id.clone();
                Some(k.clone())
            }
            _ => {
                self.reply(GatewayError::invalid_api_key());
                None
            }
        }
    }

    fn on_body(&mut self, body: &[u8], op: Operation) -> Action {
        let Some(state) = self.state.clone() else {
            return self.reply(GatewayError::not_ready());
        };
        let Some(key) = self.key.take() else {
            return self.reply(GatewayError::invalid_api_key());
        };
        let parsed: Value = match serde_json::from_slice(body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return self.reply(GatewayError::new(
                    400,
                    "invalid_json",
                    "The request body must be a JSON object.",
                ))
            }
            Err(e) => {
                return self.reply(GatewayError::new(
                    400,
                    "invalid_json",
                    format!("The request body is not valid JSON: {e}"),
                ))
            }
        };
        match op {
            Operation::Chat => {
                if !parsed.get("messages").is_some_and(Value::is_array) {
                    return self.reply(
                        GatewayError::new(
                            400,
                            "invalid_request",
                            "messages must be an array of chat messages.",
                        )
                        .with_param("messages"),
                    );
                }
            }
            Operation::Embeddings => {
                if parsed.get("input").is_none() {
                    return self.reply(
                        GatewayError::new(400, "invalid_request", "input is required.")
                            .with_param("input"),
                    );
                }
            }
        }
        let resolved = match resolve::resolve(&state, &key, &parsed, op) {
            Ok(r) => r,
            Err(e) => return self.reply(e),
        };
        let cid = shared::new_call(self.started_ms);
        let plan = Plan {
            cid: cid.clone(),
            rid: self.rid.clone(),
            vk: key.id.clone(),
            op,
            stream: resolved.stream,
            include_usage: resolved.include_usage,
            tiers: resolved.tiers,
            max_attempts: resolved.max_attempts,
            timeout_ms: resolved.timeout_ms,
            deadline_ms: resolved.deadline_ms,
            started_ms: self.started_ms,
            tokens: resolved.needs.context_tokens,
        };
        self.cid = Some(cid);
        Headers::Request.set(PLAN_HEADER, Some(&plan.encode()));
        let retries = plan.max_attempts.saturating_sub(1).to_string();
        Headers::Request.set("x-envoy-max-retries", Some(&retries));
        // The whole call is bounded by the deadline; each attempt until its first token by the
        // attempt timeout (the attempt stage holds the headers until then).
        Headers::Request.set(
            "x-envoy-upstream-rq-timeout-ms",
            Some(&plan.deadline_ms.to_string()),
        );
        Headers::Request.set(
            "x-envoy-upstream-rq-per-try-timeout-ms",
            Some(&plan.timeout_ms.to_string()),
        );
        Action::Continue
    }
}

/// The key's quota answer, if any: a block the control plane pushed, else the request past
/// `requests_per_minute` in this UTC minute (counted here, across the workers).
fn quota_refusal(key: &ai_router_proto::v1::VirtualKey, now: i64) -> Option<GatewayError> {
    if let Some(err) = quota::blocked(key, now) {
        return Some(err);
    }
    if key.requests_per_minute == 0 {
        return None;
    }
    let count = shared::count_minute_request(&key.id, quota::minute_of(now))?;
    quota::over_minute_limit(key.requests_per_minute, count, now)
}

impl Context for Front {}

impl HttpContext for Front {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        self.started_ms = now_ms();
        self.rid = self
            .get_http_request_header("x-request-id")
            .unwrap_or_default();
        // Nothing the client sends may steer the router or impersonate the stages.
        for name in Headers::Request.names() {
            if headers::is_internal(&name) {
                Headers::Request.remove(&name);
            }
        }
        let method = Headers::Request.get(":method").unwrap_or_default();
        let full_path = Headers::Request.get(":path").unwrap_or_default();
        let path = full_path
            .split('?')
            .next()
            .unwrap_or("")
            .trim_end_matches('/')
            .to_string();
        let op = match (method.as_str(), path.as_str()) {
            ("POST", "/v1/chat/completions") => Operation::Chat,
            ("POST", "/v1/embeddings") => Operation::Embeddings,
            ("GET", p) if p == "/v1/models" || p.starts_with("/v1/models/") => {
                return self.models(&path)
            }
            ("GET", "/health") => return self.health(),
            (_, "/v1/chat/completions" | "/v1/embeddings" | "/v1/models") => {
                return self.reply(GatewayError::new(
                    405,
                    "method_not_allowed",
                    format!("{method} is not allowed on {path}."),
                ));
            }
            _ => return self.reply(GatewayError::not_found(&path)),
        };
        self.op = Some(op);
        let Some(state) = shared::current_state() else {
            return self.reply(GatewayError::not_ready());
        };
        self.key = self.authenticate(&state);
        self.state = Some(state.clone());
        let Some(key) = self.key.as_ref() else {
            return Action::Pause;
        };
        if let Some(err) = quota_refusal(key, self.started_ms) {
            return self.reply(err);
        }
        if let Some(len) = self
            .get_http_request_header("content-length")
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > state.max_body_bytes() {
                return self.reply(GatewayError::new(
                    413,
                    "request_too_large",
                    format!("The body is larger than {} bytes.", state.max_body_bytes()),
                ));
            }
        }
        if end_of_stream {
            return self.reply(GatewayError::new(
                400,
                "invalid_json",
                "The request has no body.",
            ));
        }
        // The client's key never goes further than this stage.
        Headers::Request.set("authorization", None);
        Action::Pause
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.answered.is_some() {
            return Action::Pause;
        }
        let Some(op) = self.op else {
            return Action::Continue;
        };
        let limit = self
            .state
            .as_ref()
            .map(|s| s.max_body_bytes())
            .unwrap_or(4 * 1024 * 1024);
        if size as u64 > limit {
            return self.reply(GatewayError::new(
                413,
                "request_too_large",
                format!("The body is larger than {limit} bytes."),
            ));
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = Body::Request.get(0, size);
        self.on_body(&body, op)
    }

    fn on_http_response_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        if self.answered.is_some() {
            return Action::Continue;
        }
        self.status = self
            .get_http_response_header(":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let attempt = Headers::Response.get(H_ATTEMPT);
        let model = Headers::Response.get(H_LANE_MODEL);
        let retry_after = Headers::Response.get(H_RETRY_AFTER);
        let final_status = self
            .get_http_response_header(H_FINAL_STATUS)
            .and_then(|s| s.parse::<u16>().ok());
        if Headers::Response.has(H_RETRY) || final_status.is_some() {
            // Every attempt the router was allowed failed, or no lane was left: this answer
            // carries the gateway's final error.
            let status = final_status.unwrap_or(502);
            self.status = status;
            Headers::Response.set(":status", Some(&status.to_string()));
        } else if attempt.is_none() && self.status >= 500 {
            // The router itself gave up (deadline, no attempt stage reachable).
            let err = if self.status == 504 {
                GatewayError::new(
                    504,
                    "pool_timeout",
                    "The call's deadline passed before a provider answered.",
                )
            } else {
                GatewayError::new(
                    502,
                    "upstream_error",
                    "No provider could be reached for this call.",
                )
            };
            self.status = err.status;
            Headers::Response.set(":status", Some(&err.status.to_string()));
            Headers::Response.set("content-type", Some("application/json"));
            Headers::Response.set("content-length", None);
            if end_of_stream {
                // No body to replace; the status and headers still tell the story.
            } else {
                self.replace_body = Some(err.body());
            }
        }
        // Strip everything internal.
        // The attempt stage let a provider's rate-limit headers through only if the operator
        // opted in; its own internal ones end here.
        for name in Headers::Response.names() {
            if headers::is_internal(&name) {
                Headers::Response.remove(&name);
            }
        }
        if !self.rid.is_empty() {
            Headers::Response.set("x-request-id", Some(&self.rid));
        }
        if let Some(m) = model.filter(|_| self.status < 400) {
            Headers::Response.set("x-ai-router-model", Some(&m));
        }
        let attempts = attempt.or_else(|| {
            self.cid
                .as_deref()
                .and_then(|cid| shared::with_call(cid, |c| c.attempts.to_string()))
        });
        if let Some(a) = attempts {
            Headers::Response.set("x-ai-router-attempts", Some(&a));
        }
        if let Some(r) = retry_after.filter(|_| self.status >= 400) {
            Headers::Response.set("retry-after", Some(&r));
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let Some(body) = self.replace_body.as_ref() else {
            return Action::Continue;
        };
        if !end_of_stream {
            return Action::Pause;
        }
        let body = body.clone();
        Body::Response.set(0, size, &body);
        Action::Continue
    }

    fn on_log(&mut self) {
        let call = self.cid.as_deref().and_then(shared::end_call);
        let Some(op) = self.op else { return };
        let now = now_ms();
        let (outcome, status) = match self.answered {
            Some((status, code)) if status >= 400 => (format!("rejected:{code}"), status),
            Some((status, _)) => ("success".to_string(), status),
            None if (200..300).contains(&self.status) => ("success".to_string(), self.status),
            None => {
                let class = call
                    .as_ref()
                    .and_then(|c| c.last_failure)
                    .map(|(c, _)| c.as_str())
                    .unwrap_or("upstream");
                (format!("error:{class}"), self.status)
            }
        };
        let answered = call.as_ref().and_then(|c| c.answered.clone());
        shared::report_request(RequestOutcome {
            request_id: self.rid.clone(),
            virtual_key_id: self.vk_id.clone(),
            operation: op.as_str().into(),
            outcome,
            status: u32::from(status),
            attempts: call.as_ref().map(|c| c.attempts).unwrap_or(0),
            latency_ms: now.saturating_sub(self.started_ms).max(0) as u64,
            provider: answered
                .as_ref()
                .map(|l| l.provider.clone())
                .unwrap_or_default(),
            model: answered
                .as_ref()
                .map(|l| l.model.clone())
                .unwrap_or_default(),
            usage: None::<ProtoUsage>,
            at_ms: now,
        });
    }
}
