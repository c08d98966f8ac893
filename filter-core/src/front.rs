//! The front stage: once per client request on the public listener. It routes by path,
//! authenticates the virtual key, checks and resolves the body into the call plan it hands to
//! the attempt stage, and on the way back turns the attempt stage's signals into the client's
//! answer. A state machine over [`Host`]: the filter forwards Envoy's callbacks to it.

use std::rc::Rc;

use ai_router_contract::headers::{
    ATTEMPT as H_ATTEMPT, ATTEMPTS as H_ATTEMPTS, FINAL_STATUS as H_FINAL_STATUS,
    LANE_MODEL as H_LANE_MODEL, MODEL as H_MODEL, RETRY as H_RETRY, RETRY_AFTER as H_RETRY_AFTER,
};
use ai_router_proto::v1::{RequestOutcome, Usage as ProtoUsage, VirtualKey};
use serde_json::{json, Value};

use crate::errors::GatewayError;
use crate::headers;
use crate::host::{Flow, Host, Side};
use crate::plan::{Operation, Plan, PLAN_HEADER};
use crate::quota;
use crate::resolve;
use crate::state::State;
use crate::util::sha256_hex;

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
    key: Option<VirtualKey>,
    /// The state the request was authenticated against; its body is routed by the same one.
    state: Option<Rc<State>>,
}

impl Front {
    fn reply(&mut self, host: &mut impl Host, err: GatewayError) -> Flow {
        self.answered = Some((err.status, err.code));
        let retry_after = err.retry_after_s.map(|s| s.to_string());
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", "application/json"),
            ("x-request-id", &self.rid),
        ];
        if let Some(r) = retry_after.as_deref() {
            headers.push(("retry-after", r));
        }
        host.send_response(err.status, &headers, &err.body());
        Flow::Pause
    }

    fn models(&mut self, host: &mut impl Host, path: &str) -> Flow {
        let Some(state) = host.state() else {
            return self.reply(host, GatewayError::not_ready());
        };
        let Some(key) = self.authenticate(host, &state) else {
            return Flow::Pause;
        };
        let names = resolve::model_list(&state, &key);
        let item = |id: &str| json!({ "id": id, "object": "model", "created": 0, "owned_by": "ai-router" });
        let body = match path.strip_prefix("/v1/models/") {
            Some(id) if !id.is_empty() => {
                if !names.iter().any(|n| n == id) {
                    return self.reply(
                        host,
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
        host.send_response(
            200,
            &[
                ("content-type", "application/json"),
                ("x-request-id", &self.rid),
            ],
            &bytes,
        );
        Flow::Pause
    }

    /// `GET /health` (no key): ok while some provider has a usable key, else degraded.
    fn health(&mut self, host: &mut impl Host) -> Flow {
        let (status, code) = match host.state() {
            None => (503, "starting"),
            Some(state) if crate::state::any_usable_key(&state, host.now_ms()) => (200, "ok"),
            Some(_) => (200, "degraded"),
        };
        self.answered = Some((status, "health"));
        let body = json!({ "status": code }).to_string().into_bytes();
        host.send_response(status, &[("content-type", "application/json")], &body);
        Flow::Pause
    }

    /// The virtual key of the bearer token, or an answer already sent.
    fn authenticate(&mut self, host: &mut impl Host, state: &State) -> Option<VirtualKey> {
        let header = match host.header(Side::Request, "authorization") {
            None => String::new(),
            Some(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(_) => {
                    self.reply(
                        host,
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
            self.reply(host, GatewayError::missing_api_key());
            return None;
        }
        match state.virtual_key(&sha256_hex(token.as_bytes())) {
            Some(k) if k.enabled => {
                self.vk_id = k.id.clone();
                Some(k.clone())
            }
            _ => {
                self.reply(host, GatewayError::invalid_api_key());
                None
            }
        }
    }

    fn on_body(&mut self, host: &mut impl Host, body: &[u8], op: Operation) -> Flow {
        let Some(state) = self.state.clone() else {
            return self.reply(host, GatewayError::not_ready());
        };
        let Some(key) = self.key.take() else {
            return self.reply(host, GatewayError::invalid_api_key());
        };
        let parsed: Value = match serde_json::from_slice(body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return self.reply(
                    host,
                    GatewayError::new(
                        400,
                        "invalid_json",
                        "The request body must be a JSON object.",
                    ),
                )
            }
            Err(e) => {
                return self.reply(
                    host,
                    GatewayError::new(
                        400,
                        "invalid_json",
                        format!("The request body is not valid JSON: {e}"),
                    ),
                )
            }
        };
        match op {
            Operation::Chat => {
                if !parsed.get("messages").is_some_and(Value::is_array) {
                    return self.reply(
                        host,
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
                        host,
                        GatewayError::new(400, "invalid_request", "input is required.")
                            .with_param("input"),
                    );
                }
            }
        }
        let resolved = match resolve::resolve(&state, &key, &parsed, op) {
            Ok(r) => r,
            Err(e) => return self.reply(host, e),
        };
        let cid = host.new_call(self.started_ms);
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
        host.set_header(Side::Request, PLAN_HEADER, Some(&plan.encode()));
        let retries = plan.max_attempts.saturating_sub(1).to_string();
        host.set_header(Side::Request, "x-envoy-max-retries", Some(&retries));
        // The whole call is bounded by the deadline; each attempt until its first token by the
        // attempt timeout (the attempt stage holds the headers until then).
        host.set_header(
            Side::Request,
            "x-envoy-upstream-rq-timeout-ms",
            Some(&plan.deadline_ms.to_string()),
        );
        host.set_header(
            Side::Request,
            "x-envoy-upstream-rq-per-try-timeout-ms",
            Some(&plan.timeout_ms.to_string()),
        );
        Flow::Continue
    }
}

/// The key's quota answer, if any: a block the control plane pushed, else the request past
/// `requests_per_minute` in this UTC minute (counted here, across the workers).
fn quota_refusal(host: &mut impl Host, key: &VirtualKey, now: i64) -> Option<GatewayError> {
    if let Some(err) = quota::blocked(key, now) {
        return Some(err);
    }
    if key.requests_per_minute == 0 {
        return None;
    }
    let count = host.count_minute_request(&key.id, quota::minute_of(now))?;
    quota::over_minute_limit(key.requests_per_minute, count, now)
}

impl Front {
    pub fn on_request_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        self.started_ms = host.now_ms();
        self.rid = host
            .header_text(Side::Request, "x-request-id")
            .unwrap_or_default();
        // Nothing the client sends may steer the router or impersonate the stages.
        for name in host.header_names(Side::Request) {
            if headers::is_internal(&name) {
                host.set_header(Side::Request, &name, None);
            }
        }
        let method = host
            .header_text(Side::Request, ":method")
            .unwrap_or_default();
        let full_path = host.header_text(Side::Request, ":path").unwrap_or_default();
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
                return self.models(host, &path)
            }
            ("GET", "/health") => return self.health(host),
            (_, "/v1/chat/completions" | "/v1/embeddings" | "/v1/models") => {
                return self.reply(
                    host,
                    GatewayError::new(
                        405,
                        "method_not_allowed",
                        format!("{method} is not allowed on {path}."),
                    ),
                );
            }
            _ => return self.reply(host, GatewayError::not_found(&path)),
        };
        self.op = Some(op);
        let Some(state) = host.state() else {
            return self.reply(host, GatewayError::not_ready());
        };
        self.key = self.authenticate(host, &state);
        self.state = Some(state.clone());
        let Some(key) = self.key.as_ref() else {
            return Flow::Pause;
        };
        if let Some(err) = quota_refusal(host, key, self.started_ms) {
            return self.reply(host, err);
        }
        if let Some(len) = host
            .header_text(Side::Request, "content-length")
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > state.max_body_bytes() {
                return self.reply(
                    host,
                    GatewayError::new(
                        413,
                        "request_too_large",
                        format!("The body is larger than {} bytes.", state.max_body_bytes()),
                    ),
                );
            }
        }
        if end_of_stream {
            return self.reply(
                host,
                GatewayError::new(400, "invalid_json", "The request has no body."),
            );
        }
        // The client's key never goes further than this stage.
        host.set_header(Side::Request, "authorization", None);
        Flow::Pause
    }

    pub fn on_request_body(
        &mut self,
        host: &mut impl Host,
        size: usize,
        end_of_stream: bool,
    ) -> Flow {
        if self.answered.is_some() {
            return Flow::Pause;
        }
        let Some(op) = self.op else {
            return Flow::Continue;
        };
        let limit = self
            .state
            .as_ref()
            .map(|s| s.max_body_bytes())
            .unwrap_or(4 * 1024 * 1024);
        if size as u64 > limit {
            return self.reply(
                host,
                GatewayError::new(
                    413,
                    "request_too_large",
                    format!("The body is larger than {limit} bytes."),
                ),
            );
        }
        if !end_of_stream {
            return Flow::Pause;
        }
        let body = host.body(Side::Request, 0, size);
        self.on_body(host, &body, op)
    }

    pub fn on_response_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        if self.answered.is_some() {
            return Flow::Continue;
        }
        self.status = host
            .header_text(Side::Response, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let attempt = host.header_text(Side::Response, H_ATTEMPT);
        let model = host.header_text(Side::Response, H_LANE_MODEL);
        let retry_after = host.header_text(Side::Response, H_RETRY_AFTER);
        let final_status = host
            .header_text(Side::Response, H_FINAL_STATUS)
            .and_then(|s| s.parse::<u16>().ok());
        if host.header(Side::Response, H_RETRY).is_some() || final_status.is_some() {
            // Every attempt the router was allowed failed, or no lane was left: this answer
            // carries the gateway's final error.
            let status = final_status.unwrap_or(502);
            self.status = status;
            host.set_header(Side::Response, ":status", Some(&status.to_string()));
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
            host.set_header(Side::Response, ":status", Some(&err.status.to_string()));
            host.set_header(Side::Response, "content-type", Some("application/json"));
            host.set_header(Side::Response, "content-length", None);
            if end_of_stream {
                // No body to replace; the status and headers still tell the story.
            } else {
                self.replace_body = Some(err.body());
            }
        }
        // Strip everything internal.
        // The attempt stage let a provider's rate-limit headers through only if the operator
        // opted in; its own internal ones end here.
        for name in host.header_names(Side::Response) {
            if headers::is_internal(&name) {
                host.set_header(Side::Response, &name, None);
            }
        }
        if !self.rid.is_empty() {
            host.set_header(Side::Response, "x-request-id", Some(&self.rid));
        }
        if let Some(m) = model.filter(|_| self.status < 400) {
            host.set_header(Side::Response, H_MODEL, Some(&m));
        }
        let attempts = attempt.or_else(|| {
            self.cid
                .as_deref()
                .and_then(|cid| host.call_attempts(cid).map(|n| n.to_string()))
        });
        if let Some(a) = attempts {
            host.set_header(Side::Response, H_ATTEMPTS, Some(&a));
        }
        if let Some(r) = retry_after.filter(|_| self.status >= 400) {
            host.set_header(Side::Response, "retry-after", Some(&r));
        }
        Flow::Continue
    }

    pub fn on_response_body(
        &mut self,
        host: &mut impl Host,
        size: usize,
        end_of_stream: bool,
    ) -> Flow {
        let Some(body) = self.replace_body.as_ref() else {
            return Flow::Continue;
        };
        if !end_of_stream {
            return Flow::Pause;
        }
        let body = body.clone();
        host.set_body(Side::Response, 0, size, &body);
        Flow::Continue
    }

    pub fn on_log(&mut self, host: &mut impl Host) {
        let call = self.cid.as_deref().and_then(|cid| host.end_call(cid));
        let Some(op) = self.op else { return };
        let now = host.now_ms();
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
        host.report_request(RequestOutcome {
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
