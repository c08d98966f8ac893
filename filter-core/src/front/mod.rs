//! The front stage: once per client request on the public listener. It routes by path,
//! authenticates the virtual key, checks and resolves the body into the call plan it hands to
//! the attempt stage, and on the way back turns the attempt stage's signals into the client's
//! answer. A state machine over [`Host`]: the filter forwards Envoy's callbacks to it.

pub mod body_check;
pub mod budget;
pub mod quota;

use std::rc::Rc;

use ai_router_contract::headers::{
    ATTEMPT as H_ATTEMPT, ATTEMPTS as H_ATTEMPTS, BUDGET_WARNING as H_BUDGET_WARNING,
    CACHE as H_CACHE, COST as H_COST, COST_ESTIMATE as H_COST_ESTIMATE,
    FINAL_STATUS as H_FINAL_STATUS, LANE_COST as H_LANE_COST, LANE_MODEL as H_LANE_MODEL,
    LANE_PROVIDER as H_LANE_PROVIDER, LANE_TRAIL as H_LANE_TRAIL, MODEL as H_MODEL,
    RETRY as H_RETRY, RETRY_AFTER as H_RETRY_AFTER, ROUTE as H_ROUTE, TRAIL as H_TRAIL,
};
use ai_router_proto::v1::{
    BreakerPhase, ErrorClass as ProtoClass, RequestOutcome, RequestResult, Usage as ProtoUsage,
    VirtualKey,
};
use serde_json::{json, Value};

use crate::answer::errors::{ErrorCode, GatewayError};
use crate::classify::Class;
use crate::host::{Flow, Host, Side};
use crate::plan::{Operation, Plan, Protocol, PLAN_HEADER};
use crate::protocols::messages::Fidelity;
use crate::resolve;
use crate::resolve::rules::{self, Metadata};
use crate::sync::state::State;
use crate::wire::headers;
use ai_router_contract::sha256_hex;

#[derive(Default)]
pub struct Front {
    op: Option<Operation>,
    /// The caller's API: the shape of its body, answers and errors.
    protocol: Protocol,
    /// Messages: the `anthropic-version` and `anthropic-beta` the caller sent.
    anthropic_version: Option<String>,
    anthropic_beta: Option<String>,
    /// `POST /v1/messages/count_tokens`: Anthropic's count from an anthropic lane, else the
    /// gateway's own estimate.
    count_tokens: bool,
    /// Gemini: the call its path names (model, stream or count); its body is translated to chat
    /// completions here, once.
    gemini: Option<GeminiCall>,
    /// Gemini: the virtual key sent as `?key=` (taken out of the path at once).
    query_key: Option<String>,
    /// The final answer is an error to re-dress in the caller's shape (buffered whole).
    redress: bool,
    cid: Option<String>,
    rid: String,
    /// The client's own `Idempotency-Key`, when it sent one.
    idempotency_key: Option<String>,
    vk_id: String,
    started_ms: i64,
    /// The body's `model` (for the call's trace).
    requested_model: String,
    /// The client's `traceparent`, when well formed.
    traceparent: String,
    /// The client's `tracestate`, when well formed and with a well-formed `traceparent`.
    tracestate: String,
    /// Set when this stage answered itself.
    answered: Option<(u16, &'static str)>,
    /// Replace whatever body comes back with this (a router-level failure).
    replace_body: Option<Vec<u8>>,
    status: u16,
    key: Option<VirtualKey>,
    /// The state the request was authenticated against; its body is routed by the same one.
    state: Option<Rc<State>>,
    /// The client's `x-ai-router-session`, read before internal headers are removed.
    session_header: Option<String>,
    /// The budgets' warnings for this call (`x-ai-router-budget-warning`).
    budget_warnings: Vec<String>,
    /// The client's metadata headers, for the `routes:` rules.
    metadata: Metadata,
    /// The `routes:` rule that chose the call's profile.
    route: Option<String>,
    /// The client asked for the routing trail on a success (`x-ai-router-trail: 1`).
    wants_trail: bool,
    /// The final error's body gets the call's routing trail (`error.trail`).
    add_trail: bool,
    /// The response cache's part in the call.
    cache: crate::cache::CallCache,
    /// The client asked for a stream.
    stream: bool,
    /// The gateway has no state yet (a fresh Envoy): the call waits for it.
    state_wait: Option<StateWait>,
    /// A local cache miss waiting for the shared tier's answer.
    shared_wait: Option<Box<SharedWait>>,
    /// `/admin/...`: the admin API, which Envoy routes to the control plane (its own token);
    /// no stage of a model call touches it.
    admin: bool,
    /// Responses: the stored state the call names and whether its answer is stored.
    responses: Option<crate::plan::Stored>,
}

/// A Gemini API call, from its path.
#[derive(Debug, Clone)]
struct GeminiCall {
    model: String,
    stream: bool,
    /// `:countTokens`: a gemini lane's count, else the gateway's estimate.
    count: bool,
    /// `:embedContent` (`Some(false)`) or `:batchEmbedContents` (`Some(true)`).
    embed: Option<bool>,
    /// `:streamGenerateContent` without `alt=sse`: one JSON array.
    json_array: bool,
}

/// What a call paused for the shared cache tier goes on with.
#[derive(Debug)]
struct SharedWait {
    /// The gRPC call's.
    token: u32,
    state: Rc<State>,
    key: VirtualKey,
    resolved: resolve::Resolved,
    parsed: Value,
    op: Operation,
}

/// How long a call waits for the first state of a gateway that has none yet (an Envoy that
/// just started and whose singleton is still fetching it): it is answered once the state is in,
/// and only past this with `pool_unavailable`.
pub const STATE_WAIT_MS: i64 = 3_000;
/// How often a waiting call looks again.
const STATE_POLL_MS: i64 = 25;

/// What a call waiting for the state does once it is in.
#[derive(Debug, Clone)]
enum AfterState {
    Models(String),
    Call { end_of_stream: bool },
}

#[derive(Debug)]
struct StateWait {
    /// The timer's call.
    token: u32,
    since_ms: i64,
    then: AfterState,
    /// The whole body, when it arrived during the wait.
    body: Option<Vec<u8>>,
}

impl Front {
    fn reply(&mut self, host: &mut impl Host, err: GatewayError) -> Flow {
        self.answered = Some((err.status, err.code.as_str()));
        let retry_after = err.retry_after_s.map(|s| s.to_string());
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", "application/json"),
            ("x-request-id", &self.rid),
        ];
        if let Some(r) = retry_after.as_deref() {
            headers.push(("retry-after", r));
        }
        host.send_response(
            err.status,
            &headers,
            &crate::protocols::error_body(self.protocol, &err),
        );
        Flow::Pause
    }

    /// `POST /v1/messages/count_tokens` for a model with no anthropic lane: the gateway's own
    /// estimate, in Anthropic's shape.
    fn answer_count_tokens(&mut self, host: &mut impl Host, body: &Value) -> Flow {
        self.answered = Some((200, "count_tokens"));
        let answer = match self.protocol {
            Protocol::Gemini => crate::protocols::gemini::count_tokens(body),
            _ => crate::protocols::messages::count_tokens(body),
        }
        .to_string();
        host.send_response(
            200,
            &[
                ("content-type", "application/json"),
                ("x-request-id", &self.rid),
            ],
            answer.as_bytes(),
        );
        Flow::Pause
    }

    /// A cache hit: the stored answer, no provider called.
    fn answer_from_cache(
        &mut self,
        host: &mut impl Host,
        content_type: &str,
        model: &str,
        body: &[u8],
    ) -> Flow {
        self.answered = Some((200, "cache"));
        let warnings = self.budget_warnings.join(", ");
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", content_type),
            ("x-request-id", &self.rid),
            (H_CACHE, "hit"),
            (H_MODEL, model),
            (H_COST, "0"),
            (H_ATTEMPTS, "0"),
        ];
        if !warnings.is_empty() {
            headers.push((H_BUDGET_WARNING, &warnings));
        }
        host.send_response(200, &headers, body);
        Flow::Pause
    }

    fn models(&mut self, host: &mut impl Host, path: &str) -> Flow {
        let Some(state) = host.state() else {
            return self.wait_for_state(host, AfterState::Models(path.to_owned()));
        };
        // Anthropic clients (they send `anthropic-version`, or their key as `x-api-key`) get
        // the list in the Messages API's shape.
        let anthropic_client = host.header(Side::Request, "anthropic-version").is_some()
            || (host.header(Side::Request, "authorization").is_none()
                && host.header(Side::Request, "x-api-key").is_some());
        if anthropic_client {
            self.protocol = Protocol::Messages;
        }
        let Some(key) = self.authenticate(host) else {
            return Flow::Pause;
        };
        let names = resolve::model_list(&state, &key);
        let protocol = self.protocol;
        let item = |id: &str| crate::protocols::model_entry(protocol, id);
        let named = path
            .strip_prefix("/v1/models/")
            .or_else(|| path.strip_prefix("/v1beta/models/"));
        let body = match named {
            Some(raw) if !raw.is_empty() => {
                // SDKs percent-encode ids such as `openai/gpt-4o-mini`.
                let decoded = crate::wire::percent::percent_decode(raw);
                let id = decoded.as_deref().unwrap_or(raw);
                if !names.iter().any(|n| n == id) {
                    return self.reply(
                        host,
                        GatewayError::new(
                            ErrorCode::ModelNotFound,
                            format!("The model '{id}' does not exist or this key may not call it."),
                        )
                        .with_param("model"),
                    );
                }
                item(id)
            }
            _ => crate::protocols::model_list(protocol, names.iter().map(|n| item(n)).collect()),
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
        let state = host.state();
        let now = host.now_ms();
        let usable = state
            .as_ref()
            .map(|state| host.with_lanes(|view, _| crate::lanes::any_usable_key(state, view, now)));
        let (status, code) = match usable {
            None => (503, "starting"),
            Some(true) => (200, "ok"),
            Some(false) => (200, "degraded"),
        };
        self.answered = Some((status, "health"));
        let mut body = json!({ "status": code });
        if let Some(state) = state.filter(|s| self.is_admin(host, s)) {
            // The operator's view: every breaker that is not closed and every key that is out,
            // named by alias only.
            let health: Vec<_> = host.with_lanes(|view, _| {
                state
                    .snapshot
                    .providers
                    .iter()
                    .map(|p| crate::lanes::health_of(&state, view, &p.id))
                    .collect()
            });
            let mut breakers: Vec<_> = health.iter().flat_map(|h| h.breakers()).collect();
            breakers.sort_by(|a, b| {
                (a.scope, &a.provider, &a.key).cmp(&(b.scope, &b.provider, &b.key))
            });
            let mut keys: Vec<_> = health.iter().flat_map(|h| h.keys_out()).collect();
            keys.sort_by(|a, b| (&a.provider, &a.key).cmp(&(&b.provider, &b.key)));
            body["breakers"] = breakers
                .iter()
                .map(|b| {
                    // Open: out until then; half-open: half-open since then.
                    let moment = if b.state() == BreakerPhase::Open {
                        "untilMs"
                    } else {
                        "sinceMs"
                    };
                    let mut entry = json!({"scope": b.scope().text(), "provider": b.provider,
                                           "key": b.key, "state": b.state().text()});
                    entry[moment] = json!(b.open_until_ms);
                    entry
                })
                .collect();
            body["keys"] = keys
                .iter()
                .map(|k| {
                    json!({"provider": k.provider, "key": k.key, "reason": k.reason().text(),
                           "untilMs": k.until()})
                })
                .collect();
        }
        let body = body.to_string().into_bytes();
        host.send_response(status, &[("content-type", "application/json")], &body);
        Flow::Pause
    }

    /// Whether the request carries the admin token (its SHA-256 is pushed with the state).
    fn is_admin(&self, host: &impl Host, state: &State) -> bool {
        let Some(expected) = state
            .snapshot
            .limits
            .as_ref()
            .map(|l| l.admin_token_sha256.as_str())
            .filter(|h| !h.is_empty())
        else {
            return false;
        };
        host.header_text(Side::Request, "authorization")
            .and_then(|h| bearer_token(&h).map(|t| sha256_hex(t.as_bytes())))
            .is_some_and(|given| given == expected)
    }

    /// The virtual key of the bearer token, or an answer already sent.
    fn authenticate(&mut self, host: &mut impl Host) -> Option<VirtualKey> {
        let header = match host.header(Side::Request, "authorization") {
            None => String::new(),
            Some(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(_) => {
                    self.reply(
                        host,
                        GatewayError::new(ErrorCode::InvalidRequest, "The Authorization header is not valid text; send `Bearer <virtual key>`.",
                        )
                        .with_param("authorization"),
                    );
                    return None;
                }
            },
        };
        // Anthropic clients, and some OpenAI-compatible ones, send the key as `x-api-key`:
        // taken on every route when there is no `Authorization`.
        // Gemini clients send it as `x-goog-api-key` or `?key=`.
        let api_key = match header.is_empty() {
            true => host
                .header_text(Side::Request, "x-api-key")
                .or_else(|| host.header_text(Side::Request, "x-goog-api-key"))
                .or_else(|| self.query_key.clone())
                .unwrap_or_default(),
            false => String::new(),
        };
        let token = bearer_token(&header).unwrap_or(api_key.trim());
        if token.is_empty() {
            self.reply(host, GatewayError::missing_api_key());
            return None;
        }
        match host.virtual_key(&sha256_hex(token.as_bytes())) {
            Some(k) if k.enabled => {
                self.vk_id = k.id.clone();
                Some(k)
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
        // One parse, refusing a repeated top-level field: one `model`, one `stream`, so what
        // the scope check and the router read is what the provider reads.
        let mut parsed = match crate::front::body_check::parse_object(body) {
            Ok(parsed) => parsed,
            Err(error) => return self.reply(host, error),
        };
        // Gemini's `:countTokens` body, answered once the model is resolved.
        let mut gemini_counted = None;
        // Gemini: what no translation carries; only a native lane can serve the call then.
        let mut gemini_refusal = None;
        if let Some(call) = self.gemini.clone() {
            // The Gemini request is routed by its chat-completions translation; the attempts
            // carry the caller's body (sent whole to a gemini lane, translated for the others).
            let routed = crate::protocols::gemini::routed_request(
                &call.model,
                call.stream,
                call.count,
                call.embed,
                &parsed,
            );
            match routed {
                Err(e) => {
                    let mut err = GatewayError::new(ErrorCode::InvalidRequest, e.message);
                    err.param = e.param;
                    return self.reply(host, err);
                }
                Ok(Ok(chat)) => {
                    if call.count {
                        gemini_counted = Some(parsed);
                    }
                    parsed = chat;
                }
                Ok(Err(e)) => {
                    if call.count {
                        gemini_counted = Some(parsed.clone());
                    }
                    parsed = crate::protocols::gemini_native::routing_view(
                        &call.model,
                        call.stream,
                        call.embed.is_some(),
                        &parsed,
                    );
                    gemini_refusal = Some(e);
                }
            }
        }
        if let Some(model) = parsed.get("model").and_then(Value::as_str) {
            self.requested_model = model.chars().take(256).collect();
        }
        if self.count_tokens && parsed.get("messages").and_then(Value::as_array).is_none() {
            return self.reply(
                host,
                GatewayError::new(
                    ErrorCode::InvalidRequest,
                    "messages must be an array of turns.",
                )
                .with_param("messages"),
            );
        }
        // What the pool routes by: the body as a chat-completions request (a count_tokens body
        // has no max_tokens; the view is given one, the body passed on is left as it came).
        let counted;
        let routed = if self.count_tokens {
            let mut with_max = parsed.clone();
            with_max["max_tokens"] = json!(1);
            counted = with_max;
            &counted
        } else {
            &parsed
        };
        let view = match crate::protocols::chat_request(self.protocol, routed, Fidelity::Lenient) {
            Ok(v) => v,
            Err(e) => {
                let mut err = GatewayError::new(ErrorCode::InvalidRequest, e.message);
                err.param = e.param;
                return self.reply(host, err);
            }
        };
        let request = std::mem::replace(&mut parsed, view);
        match op {
            Operation::Chat => {
                if let Err(error) = crate::front::body_check::check_chat(&parsed) {
                    return self.reply(host, error);
                }
            }
            Operation::Embeddings => {
                if parsed.get("input").is_none() {
                    return self.reply(
                        host,
                        GatewayError::new(ErrorCode::InvalidRequest, "input is required.")
                            .with_param("input"),
                    );
                }
            }
        }
        let rule = rules::route_for(&state, &key, &parsed, &self.metadata);
        self.route = rule.map(|r| r.name.clone());
        let routed = rule.map(|r| r.profile.as_str());
        let mut resolved = match resolve::resolve_as(&state, &key, &parsed, op, routed) {
            Ok(r) => r,
            Err(e) => return self.reply(host, e),
        };
        if let Some(param) = crate::protocols::stateful(self.protocol, &request) {
            // Only a provider that keeps responses can serve it: lanes of kind openai, natively.
            match crate::protocols::stateful_tiers(&state, &resolved.tiers) {
                Some(tiers) => resolved.tiers = tiers,
                None => {
                    return self.reply(
                        host,
                        GatewayError::new(
                            ErrorCode::InvalidRequest,
                            format!(
                                "'{param}' needs a provider that keeps responses (kind openai), \
                                 and no lane of this model is one. The gateway keeps no state: \
                                 send the whole conversation as input items, without \
                                 previous_response_id and with store false."
                            ),
                        )
                        .with_param(param),
                    )
                }
            }
        }
        if self.protocol == Protocol::Responses {
            // A stored response is read only by the key that stored it (`response_pins`).
            let tiers = &mut resolved.tiers;
            match crate::lanes::response_pins::route(
                host,
                &state,
                &key.id,
                &request,
                tiers,
                self.started_ms,
            ) {
                Ok(stored) => self.responses = stored,
                Err(e) => return self.reply(host, e),
            }
        }
        if let Some(e) = gemini_refusal {
            let json_array = self.gemini.as_ref().is_some_and(|g| g.json_array);
            let (tiers, trail) = (&mut resolved.tiers, &mut resolved.trail);
            if !crate::protocols::gemini_native::keep_native(&state, tiers, trail, json_array) {
                let mut err = GatewayError::new(ErrorCode::InvalidRequest, e.message);
                err.param = e.param;
                return self.reply(host, err.with_trail(resolved.trail));
            }
        }
        if self.count_tokens {
            // The provider's own count on a lane of the caller's protocol (native, so nothing
            // to translate): anthropic for Messages, gemini for Gemini; else the gateway's
            // estimate.
            let (kind, counted) = match gemini_counted.as_ref() {
                Some(counted) => (ai_router_proto::v1::ProviderKind::Gemini, counted),
                None => (ai_router_proto::v1::ProviderKind::Anthropic, &request),
            };
            match crate::protocols::tiers_of_kind(&state, &resolved.tiers, kind) {
                Some(tiers) => resolved.tiers = tiers,
                None => return self.answer_count_tokens(host, counted),
            }
        }
        // A lane that cannot take the request in its own protocol is no candidate; when none
        // is left, the refusal names the field (in the caller's shape).
        if let Some(e) = crate::protocols::cut_untranslatable(
            &state,
            self.protocol,
            &request,
            &mut resolved.tiers,
            &mut resolved.trail,
        ) {
            let mut err = GatewayError::new(ErrorCode::InvalidRequest, e.message);
            err.param = e.param;
            return self.reply(host, err.with_trail(resolved.trail));
        }
        let verdict = budget_verdict(&state, &key, &mut resolved, self.started_ms);
        for c in &verdict.ruled_out {
            resolved
                .trail
                .skip(&c.provider, "", &c.model, budget::TRIGGER);
        }
        self.budget_warnings = verdict.warnings;
        if let Some(err) = verdict.refusal {
            // Like the other refusals, it names what ruled out each candidate.
            return self.reply(host, err.with_trail(resolved.trail));
        }
        self.stream = resolved.stream;
        let cache_call = crate::cache::CacheCall {
            // A token count is no answer to keep.
            // Gemini answers are not stored (`shapes::storable`): no lookup either.
            key_cache: if self.count_tokens || self.protocol == Protocol::Gemini {
                Some(false)
            } else {
                key.cache
            },
            policy_cache: resolved.cache,
            protocol: self.protocol,
            op,
            anthropic: (
                self.anthropic_version.as_deref(),
                self.anthropic_beta.as_deref(),
            ),
        };
        self.cache = crate::cache::CallCache::begin(
            host,
            &state,
            &cache_call,
            &resolved.tiers,
            &request,
            self.started_ms,
        );
        if let Some((content_type, body, model)) = self
            .cache
            .hit_answer(resolved.stream, resolved.include_usage)
        {
            return self.answer_from_cache(host, content_type, &model, &body);
        }
        if let Some(token) = self.cache.ask_shared(host) {
            // Paused until the shared tier answers (or its bound passes: a miss).
            self.shared_wait = Some(Box::new(SharedWait {
                token,
                state,
                key,
                resolved,
                parsed,
                op,
            }));
            return Flow::Pause;
        }
        self.plan_call(host, &state, &key, resolved, &parsed, op)
    }

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

    /// Plans a resolved call the cache did not answer: the attempts' plan on the request.
    fn plan_call(
        &mut self,
        host: &mut impl Host,
        state: &State,
        key: &VirtualKey,
        resolved: resolve::Resolved,
        parsed: &Value,
        op: Operation,
    ) -> Flow {
        let cid = host.new_call(self.started_ms);
        let plan = Plan {
            cid: cid.clone(),
            rid: self.rid.clone(),
            idempotency_key: headers::upstream_idempotency_key(
                &key.id,
                self.idempotency_key
                    .as_deref()
                    .filter(|v| !v.trim().is_empty())
                    .unwrap_or(&self.rid),
            )
            .unwrap_or_default(),
            vk: key.id.clone(),
            op,
            stream: resolved.stream,
            // A translated stream needs the usage chunk for its own usage event.
            include_usage: resolved.include_usage || self.protocol != Protocol::Chat,
            tiers: resolved.tiers,
            max_attempts: resolved.max_attempts,
            timeout_ms: resolved.timeout_ms,
            deadline_ms: resolved.deadline_ms,
            started_ms: self.started_ms,
            tokens: resolved.needs.context_tokens,
            protocol: self.protocol,
            anthropic_version: self.anthropic_version.clone(),
            anthropic_beta: self.anthropic_beta.clone(),
            count_tokens: self.count_tokens,
            json_array: self.gemini.as_ref().is_some_and(|g| g.json_array),
            session: (state.selection().affinity_idle_ms > 0)
                .then(|| {
                    crate::lanes::affinity::session_of(
                        &key.id,
                        self.session_header.as_deref(),
                        parsed,
                    )
                })
                .flatten(),
            profile: resolved.profile.unwrap_or_default(),
            prompt_cache: resolved.prompt_cache,
            prompt_tokens: resolved.needs.prompt_tokens,
            max_tokens: resolved.needs.max_tokens,
            reset_ms: resolved.reset_interval_ms,
            first_choice: resolved.first_choice,
            trail: self.wants_trail,
            responses: self.responses.take(),
        };
        let ruled_out = resolved.trail;
        host.with_call(&cid, |c| c.trail = ruled_out);
        self.cid = Some(cid);
        host.set_header(Side::Request, PLAN_HEADER, Some(&plan.encode()));
        let retries = plan.max_attempts.saturating_sub(1).to_string();
        host.set_header(Side::Request, "x-envoy-max-retries", Some(&retries));
        // The whole call is bounded by the deadline, waits included. An attempt is bounded by
        // the attempt stage itself (timeoutMs from the moment it reaches a provider): a per-try
        // timeout here would also count the attempt's waits for a lane and burn attempts.
        host.set_header(
            Side::Request,
            "x-envoy-upstream-rq-timeout-ms",
            Some(&plan.deadline_ms.to_string()),
        );
        Flow::Continue
    }
}

/// How Envoy's router ended an answer that had started, from the stream's response code
/// details (as Envoy 1.40 sets them): the deadline (the route's timeout, `response_timeout`) or
/// a reset of the attempt hop (`upstream_reset_after_response_started{...}`).
fn cut_by_the_router(host: &impl Host) -> Option<Class> {
    let details = host.property(&["response", "code_details"])?;
    if details == b"response_timeout" {
        Some(Class::Deadline)
    } else if details.starts_with(b"upstream_reset_after_response_started") {
        Some(Class::Stream)
    } else {
        None
    }
}

/// The token of an `Authorization: Bearer <token>` value.
fn bearer_token(header: &str) -> Option<&str> {
    header
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
}

/// The budgets' verdict on a resolved call (a spent provider's candidates cut from its tiers).
fn budget_verdict(
    state: &State,
    key: &VirtualKey,
    resolved: &mut resolve::Resolved,
    now: i64,
) -> budget::Verdict {
    let Some(budgets) = state.snapshot.budgets.as_ref() else {
        return budget::Verdict::default();
    };
    let needs = &resolved.needs;
    // The cost estimate at the preferred candidate's price.
    let cost = resolved
        .tiers
        .first()
        .and_then(|t| t.first())
        .and_then(|c| {
            let (_, p) = state.provider(&c.provider)?;
            p.models.iter().find(|m| m.id == c.model)?.cost
        })
        .map(|c| crate::lanes::cost::cost_at(&c, needs.prompt_tokens, needs.max_tokens, 0));
    let call = budget::BudgetCall {
        key_id: &key.id,
        profile: resolved.profile.as_deref(),
        tokens: needs.context_tokens,
        cost,
    };
    budget::check(Some(budgets), &call, &mut resolved.tiers, now)
}

/// The key's quota answer, if any: a block the control plane pushed, else the request past
/// `requests_per_minute` in this UTC minute (admitted from the blocks of the minute's budget
/// this Envoy took, `minute_lease`). A call that could not be counted goes through.
fn quota_refusal(host: &mut impl Host, key: &VirtualKey, now: i64) -> Option<GatewayError> {
    if let Some(err) = quota::blocked(key, now) {
        return Some(err);
    }
    if key.requests_per_minute == 0 {
        return None;
    }
    match host.admit_minute_request(&key.id, key.requests_per_minute, now) {
        Some(false) => Some(quota::minute_refusal(key.requests_per_minute, now)),
        _ => None,
    }
}

impl Front {
    pub fn on_request_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        self.started_ms = host.now_ms();
        self.rid = host
            .header_text(Side::Request, "x-request-id")
            .unwrap_or_default();
        self.idempotency_key = host.header_text(Side::Request, "idempotency-key");
        self.session_header = host.header_text(Side::Request, ai_router_contract::headers::SESSION);
        // The metadata the rules read is the one thing of the prefix a client may send.
        self.metadata = Metadata::from_headers(host);
        self.wants_trail = host
            .header_text(Side::Request, H_TRAIL)
            .is_some_and(|v| matches!(v.trim(), "1" | "true"));
        self.traceparent = host
            .header_text(Side::Request, "traceparent")
            .filter(|t| valid_traceparent(t))
            .unwrap_or_default();
        self.tracestate = host
            .header_text(Side::Request, "tracestate")
            .filter(|t| !self.traceparent.is_empty() && crate::wire::trace_state::valid(t))
            .map(|t| t.trim().to_owned())
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
        let google_list = (path == "/v1/models" || path.starts_with("/v1/models/"))
            && crate::protocols::gemini::google_client(
                host.header(Side::Request, "x-goog-api-key").is_some()
                    || host.header(Side::Request, "x-goog-api-client").is_some(),
                full_path.split_once('?').map_or("", |(_, q)| q),
            );
        if google_list || crate::protocols::gemini::is_gemini_path(&path) {
            return self.gemini_route(host, &method, &path, &full_path, end_of_stream);
        }
        let op = match (method.as_str(), path.as_str()) {
            ("POST", "/v1/chat/completions") => Operation::Chat,
            ("POST", "/v1/embeddings") => Operation::Embeddings,
            ("POST", "/v1/messages") => {
                self.protocol = Protocol::Messages;
                Operation::Chat
            }
            ("POST", "/v1/messages/count_tokens") => {
                self.protocol = Protocol::Messages;
                self.count_tokens = true;
                Operation::Chat
            }
            ("POST", "/v1/responses") => {
                self.protocol = Protocol::Responses;
                Operation::Chat
            }
            ("GET", p) if p == "/v1/models" || p.starts_with("/v1/models/") => {
                return self.models(host, &path)
            }
            ("GET", "/health") => return self.health(host),
            (_, p) if is_admin_path(p) => {
                if !canonical_path(p) {
                    return self.reply(host, GatewayError::not_found(&path));
                }
                self.admin = true;
                return Flow::Continue;
            }
            (_, "/v1/messages" | "/v1/messages/count_tokens") => {
                self.protocol = Protocol::Messages;
                return self.reply(
                    host,
                    GatewayError::new(
                        ErrorCode::MethodNotAllowed,
                        format!("{method} is not allowed on {path}."),
                    ),
                );
            }
            (_, "/v1/chat/completions" | "/v1/embeddings" | "/v1/models" | "/v1/responses") => {
                return self.reply(
                    host,
                    GatewayError::new(
                        ErrorCode::MethodNotAllowed,
                        format!("{method} is not allowed on {path}."),
                    ),
                );
            }
            _ => {
                // Every answer under /v1/messages is in Anthropic's shape, a 404 too.
                if path.starts_with("/v1/messages/") {
                    self.protocol = Protocol::Messages;
                }
                return self.reply(host, GatewayError::not_found(&path));
            }
        };
        self.op = Some(op);
        if host.state().is_none() {
            return self.wait_for_state(host, AfterState::Call { end_of_stream });
        }
        self.with_state(host, end_of_stream)
    }

    /// A call of the Gemini API: every answer, errors included, in Google's shape. A key sent
    /// as `?key=` is taken out of the path before anything else reads it.
    fn gemini_route(
        &mut self,
        host: &mut impl Host,
        method: &str,
        path: &str,
        full_path: &str,
        end_of_stream: bool,
    ) -> Flow {
        use crate::protocols::gemini::{route, take_query_key, wants_sse, Route};
        self.protocol = Protocol::Gemini;
        let query = full_path.split_once('?').map_or("", |(_, q)| q);
        let (kept, key) = take_query_key(query);
        if key.is_some() {
            let clean = match kept.is_empty() {
                true => path.to_string(),
                false => format!("{path}?{kept}"),
            };
            host.set_header(Side::Request, ":path", Some(&clean));
            self.query_key = key;
        }
        let call = match route(method, path) {
            Route::Generate { model, stream } => GeminiCall {
                model,
                stream,
                count: false,
                embed: None,
                json_array: stream && !wants_sse(&kept),
            },
            Route::CountTokens { model } => GeminiCall {
                model,
                stream: false,
                count: true,
                embed: None,
                json_array: false,
            },
            Route::Embed { model, batch } => GeminiCall {
                model,
                stream: false,
                count: false,
                embed: Some(batch),
                json_array: false,
            },
            Route::Models(_) => return self.models(host, path),
            Route::Unserved => {
                let method_only = matches!(
                    route(if method == "GET" { "POST" } else { "GET" }, path),
                    Route::Generate { .. }
                        | Route::CountTokens { .. }
                        | Route::Embed { .. }
                        | Route::Models(_)
                );
                let err = match method_only {
                    true => GatewayError::new(
                        ErrorCode::MethodNotAllowed,
                        format!("{method} is not allowed on {path}."),
                    ),
                    false => GatewayError::new(
                        ErrorCode::NotFound,
                        format!(
                            "{path} is not served: the gateway serves generateContent, \
                             streamGenerateContent, countTokens, embedContent, \
                             batchEmbedContents and the model list of the Gemini API."
                        ),
                    ),
                };
                return self.reply(host, err);
            }
        };
        self.count_tokens = call.count;
        self.op = Some(match call.embed {
            Some(_) => Operation::Embeddings,
            None => Operation::Chat,
        });
        self.gemini = Some(call);
        if host.state().is_none() {
            return self.wait_for_state(host, AfterState::Call { end_of_stream });
        }
        self.with_state(host, end_of_stream)
    }

    /// The request phase past routing, once the gateway has its state.
    fn with_state(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        let Some(state) = host.state() else {
            return self.reply(host, GatewayError::not_ready());
        };
        self.key = self.authenticate(host);
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
                        ErrorCode::RequestTooLarge,
                        format!("The body is larger than {} bytes.", state.max_body_bytes()),
                    ),
                );
            }
        }
        if end_of_stream {
            return self.reply(
                host,
                GatewayError::new(ErrorCode::InvalidJson, "The request has no body."),
            );
        }
        if self.protocol == Protocol::Messages {
            let version = host.header_text(Side::Request, "anthropic-version");
            match crate::protocols::anthropic_version(version.as_deref()) {
                Ok(v) => self.anthropic_version = Some(v),
                Err(message) => {
                    return self.reply(
                        host,
                        GatewayError::new(ErrorCode::InvalidRequest, message)
                            .with_param("anthropic-version"),
                    )
                }
            }
            self.anthropic_beta = host.header_text(Side::Request, "anthropic-beta");
        }
        // The client's key never goes further than this stage.
        host.set_header(Side::Request, "authorization", None);
        host.set_header(Side::Request, "x-api-key", None);
        host.set_header(Side::Request, "x-goog-api-key", None);
        if self.gemini.is_some() {
            // Its body is replaced by the chat translation.
            host.set_header(Side::Request, "content-length", None);
        }
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
        if let Some(wait) = self.state_wait.as_mut() {
            // Kept for when the state is in.
            if end_of_stream {
                wait.body = Some(host.body(Side::Request, 0, size));
            }
            return Flow::Pause;
        }
        if self.op.is_none() {
            return Flow::Continue;
        }
        if !end_of_stream {
            return self.body_so_far(host, size);
        }
        let body = host.body(Side::Request, 0, size);
        self.take_body(host, &body)
    }

    /// A part of the body: refused when it is already past the limit, else buffered.
    fn body_so_far(&mut self, host: &mut impl Host, size: usize) -> Flow {
        match self.over_limit(size) {
            Some(err) => self.reply(host, err),
            None => Flow::Pause,
        }
    }

    fn over_limit(&self, size: usize) -> Option<GatewayError> {
        let limit = self
            .state
            .as_ref()
            .map(|s| s.max_body_bytes())
            .unwrap_or(4 * 1024 * 1024);
        (size as u64 > limit).then(|| {
            GatewayError::new(
                ErrorCode::RequestTooLarge,
                format!("The body is larger than {limit} bytes."),
            )
        })
    }

    /// The whole body.
    fn take_body(&mut self, host: &mut impl Host, body: &[u8]) -> Flow {
        let Some(op) = self.op else {
            return Flow::Continue;
        };
        if let Some(err) = self.over_limit(body.len()) {
            return self.reply(host, err);
        }
        self.on_body(host, body, op)
    }

    /// Waits for the state (see [`STATE_WAIT_MS`]): a timer, then [`Front::on_http_call_response`]
    /// looks again.
    fn wait_for_state(&mut self, host: &mut impl Host, then: AfterState) -> Flow {
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
                        self.take_body(host, &body)
                    }
                    (flow, _) => flow,
                }
            }
        };
        if flow == Flow::Continue {
            host.resume_request();
        }
    }

    pub fn on_response_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        if self.admin {
            return Flow::Continue;
        }
        if self.answered.is_some() {
            // The stage's own answer: no provider was called.
            host.set_header(Side::Response, H_COST, Some("0"));
            return Flow::Continue;
        }
        self.status = host
            .header_text(Side::Response, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let attempt = host.header_text(Side::Response, H_ATTEMPT);
        let model = host.header_text(Side::Response, H_LANE_MODEL);
        let lane = (
            host.header_text(Side::Response, H_LANE_PROVIDER)
                .unwrap_or_default(),
            model.clone().unwrap_or_default(),
        );
        let cost = host.header_text(Side::Response, H_LANE_COST);
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
            if !end_of_stream {
                // The error object gets the call's trail once its body is in.
                self.add_trail = true;
                host.set_header(Side::Response, "content-length", None);
            }
        } else if attempt.is_some() && self.status >= 400 && !end_of_stream {
            // A provider's refusal the call stops at (a 400): a final error, with its trail.
            self.add_trail = true;
            host.set_header(Side::Response, "content-length", None);
        } else if attempt.is_none() && self.status >= 500 {
            // The router answered itself: the deadline passed before an answer started (504),
            // or it could not take the call (503: its circuit breakers are full, or no attempt
            // stage was there to take it).
            let err = match self.status {
                504 => GatewayError::new(
                    ErrorCode::PoolTimeout,
                    "The call's deadline passed before a provider answered.",
                ),
                503 => GatewayError::new(
                    ErrorCode::PoolUnavailable,
                    "The gateway cannot take this call now; try again shortly.",
                )
                .with_retry_after(Some(1)),
                _ => GatewayError::new(
                    ErrorCode::UpstreamError,
                    "No provider could be reached for this call.",
                ),
            };
            if let Some(s) = err.retry_after_s {
                host.set_header(Side::Response, "retry-after", Some(&s.to_string()));
            }
            self.status = err.status;
            host.set_header(Side::Response, ":status", Some(&err.status.to_string()));
            host.set_header(Side::Response, "content-type", Some("application/json"));
            host.set_header(Side::Response, "content-length", None);
            if end_of_stream {
                // No body to replace; the status and headers still tell the story.
            } else {
                self.replace_body = Some(err.body());
                // A final error like any other: with the call's trail.
                self.add_trail = self.cid.is_some();
            }
        }
        let lane_trail = host
            .header_text(Side::Response, H_LANE_TRAIL)
            .filter(|_| self.wants_trail && self.status < 400);
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
        // Every answer says what it cost: a failed call cost nothing. A stream's headers go out
        // before its usage: they carry the estimate, named as one, and the usage chunk the
        // real cost (`usage.cost`).
        let cost = cost.filter(|_| self.status < 400);
        match cost {
            Some(estimate) if self.stream => {
                host.set_header(Side::Response, H_COST_ESTIMATE, Some(&estimate));
            }
            cost => {
                host.set_header(Side::Response, H_COST, Some(cost.as_deref().unwrap_or("0")));
            }
        }
        if let Some(route) = &self.route {
            host.set_header(Side::Response, H_ROUTE, Some(route));
        }
        if let Some(trail) = lane_trail {
            host.set_header(Side::Response, H_TRAIL, Some(&trail));
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
        if self.status >= 400 && crate::protocols::redresses_errors(self.protocol) && !end_of_stream
        {
            self.redress = true;
            host.set_header(Side::Response, "content-length", None);
            host.set_header(Side::Response, "content-type", Some("application/json"));
        }
        if !self.budget_warnings.is_empty() {
            let value = self.budget_warnings.join(", ");
            host.set_header(Side::Response, H_BUDGET_WARNING, Some(&value));
        }
        let status = self.status;
        if let Some(v) = self
            .cache
            .on_answer_headers(status, self.stream, end_of_stream, lane)
        {
            host.set_header(Side::Response, H_CACHE, Some(v));
        }
        Flow::Continue
    }

    pub fn on_response_body(
        &mut self,
        host: &mut impl Host,
        size: usize,
        end_of_stream: bool,
    ) -> Flow {
        if self.admin {
            return Flow::Continue;
        }
        if self.cache.collecting() {
            let chunk = host.body(Side::Response, 0, size);
            let now = host.now_ms();
            // The answering attempt's usage (reported before its last bytes reach here): a
            // stream whose client did not ask for the usage chunk is stored with it anyway.
            let usage = end_of_stream
                .then_some(self.cid.as_deref())
                .flatten()
                .and_then(|cid| host.with_call(cid, |c| c.answered_usage))
                .flatten();
            self.cache
                .on_answer_body(host, &chunk, end_of_stream, usage, now);
        }
        if self.replace_body.is_none() && !self.redress && !self.add_trail {
            return Flow::Continue;
        }
        if !end_of_stream {
            return Flow::Pause;
        }
        let mut body = match self.replace_body.clone() {
            Some(body) => body,
            None => host.body(Side::Response, 0, size),
        };
        if self.add_trail {
            // The final error's body gets the call's routing trail.
            let trail = self
                .cid
                .as_deref()
                .and_then(|cid| host.with_call(cid, |c| c.trail.clone()))
                .unwrap_or_default();
            if let Some(with_trail) = crate::answer::trail::with_trail(&body, &trail) {
                body = with_trail;
            }
        }
        if self.redress {
            if let Some(redressed) =
                crate::protocols::redress_error(self.protocol, self.status, &body)
            {
                body = redressed;
            }
        }
        host.set_body(Side::Response, 0, size, &body);
        Flow::Continue
    }

    pub fn on_log(&mut self, host: &mut impl Host) {
        let call = self.cid.as_deref().and_then(|cid| host.end_call(cid));
        let Some(op) = self.op else { return };
        let now = host.now_ms();
        let success = (RequestResult::Success, None, "");
        let ((outcome, class, code), status) = match self.answered {
            Some((status, code)) if status >= 400 => {
                ((RequestResult::Rejected, None, code), status)
            }
            Some((status, _)) => (success, status),
            None if (200..300).contains(&self.status) => {
                // A stream that broke off after its first token is no success: the attempt
                // stage said so, or (when its report comes later) Envoy's router cut it.
                let broken = call
                    .as_ref()
                    .and_then(|c| c.broken_after_first_token)
                    .or_else(|| cut_by_the_router(host));
                match broken {
                    Some(class) => ((RequestResult::Error, Some(class), ""), self.status),
                    None => (success, self.status),
                }
            }
            None => {
                // No class when no attempt's failure is known: "error:upstream" in text. A
                // client that went away before its answer cancelled the call.
                let went_away = host
                    .property(&["response", "code_details"])
                    .is_some_and(|d| crate::attempt::client_went_away(&d));
                let class = if went_away {
                    Some(Class::Cancelled)
                } else {
                    call.as_ref().and_then(|c| c.last_failure).map(|(c, _)| c)
                };
                ((RequestResult::Error, class, ""), self.status)
            }
        };
        // The lane that answered, else the last attempt's: a failed call names where it ended
        // (none when no attempt was sent).
        let answered = call
            .as_ref()
            .and_then(|c| c.answered.clone().or_else(|| c.tried.last().cloned()));
        let mut report = RequestOutcome {
            request_id: self.rid.clone(),
            virtual_key_id: self.vk_id.clone(),
            operation: op.as_str().into(),
            outcome: outcome.into(),
            error_class: class
                .map_or(ProtoClass::Unspecified, ProtoClass::from)
                .into(),
            rejected_code: code.into(),
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
            budget_warnings: std::mem::take(&mut self.budget_warnings),
            cache_hit: false,
            requested_model: self.requested_model.clone(),
            traceparent: self.traceparent.clone(),
            protocol: crate::plan::client_protocol(op, self.protocol).into(),
            tracestate: self.tracestate.clone(),
            ..RequestOutcome::default()
        };
        self.cache.report(&mut report);
        host.report_request(report);
    }
}

/// Whether `path` (no query, no trailing slash) is the admin API's: `/admin/...`, which the
/// public listener routes to the control plane (`render.rs`), not to a model.
pub fn is_admin_path(path: &str) -> bool {
    path.starts_with("/admin/")
}

/// Whether `path` (no query) is spelled the one way a router reads it: no empty, `.` or `..`
/// segment, no percent-escape, no backslash. Envoy forwards `/admin/...` to the control plane
/// as it came, and the control plane's gRPC port (which serves the admin routes to Envoy)
/// answers a path it does not route on its own (`/admin/../metrics`: 200 with a gRPC status):
/// an admin path spelled any other way is the stage's 404, so only the routes the path names
/// are reached.
pub fn canonical_path(path: &str) -> bool {
    !path.contains(['%', '\\'])
        && path
            .split('/')
            .skip(1)
            .all(|segment| !matches!(segment, "" | "." | ".."))
}

/// A W3C trace context `traceparent`: `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`,
/// ids not all zero (version 00; a later version may append fields after the flags).
pub fn valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.trim().split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    match parts.as_slice() {
        [version, trace, parent, flags, ..] => {
            hex(version, 2)
                && *version != "ff"
                && (*version != "00" || parts.len() == 4)
                && hex(trace, 32)
                && nonzero(trace)
                && hex(parent, 16)
                && nonzero(parent)
                && hex(flags, 2)
        }
        _ => false,
    }
}

#[cfg(test)]
mod admin_path_tests {
    use super::*;
    use crate::host::fake::{open_key, FakeHost};
    use ai_router_proto::v1::Snapshot;

    /// `/admin/...` is the control plane's (Envoy routes it there): the front stage neither
    /// answers it nor authenticates it as a model call, keeps the admin token on it, leaves
    /// the answer alone and reports no call.
    #[test]
    fn the_admin_api_passes_through_untouched() {
        let mut snap = Snapshot::default();
        snap.virtual_keys
            .push(open_key("key_app", "sk-starci-app-0123456789abcdef"));
        for (method, path) in [
            ("GET", "/admin/keys"),
            ("POST", "/admin/keys/key_1/rotate"),
            ("GET", "/admin/keys/key_1/usage?from=2026-01-01"),
            ("GET", "/admin/events?types=breaker"),
        ] {
            let mut host = FakeHost::with_state(State::new(1, snap.clone()));
            for (k, v) in [
                (":method", method),
                (":path", path),
                ("authorization", "Bearer admin-token"),
            ] {
                host.add(Side::Request, k, v.as_bytes());
            }
            let mut front = Front::default();
            assert_eq!(
                front.on_request_headers(&mut host, false),
                Flow::Continue,
                "{path}"
            );
            assert!(host.answered.is_none(), "{path}");
            assert_eq!(
                host.header_text(Side::Request, "authorization").as_deref(),
                Some("Bearer admin-token"),
                "{path}"
            );
            assert_eq!(front.on_request_body(&mut host, 0, true), Flow::Continue);
            host.add(Side::Response, ":status", b"401");
            assert_eq!(front.on_response_headers(&mut host, false), Flow::Continue);
            assert_eq!(host.header_text(Side::Response, H_COST), None, "{path}");
            assert_eq!(front.on_response_body(&mut host, 0, true), Flow::Continue);
            front.on_log(&mut host);
            assert!(host.reports.is_empty(), "{path}");
        }
        // Neither a model route nor the admin API: 404 from the stage.
        let mut host = FakeHost::with_state(State::new(1, snap.clone()));
        host.add(Side::Request, ":method", b"GET");
        host.add(Side::Request, ":path", b"/administrator");
        Front::default().on_request_headers(&mut host, false);
        assert_eq!(host.answered.as_ref().map(|a| a.status), Some(404));
        // An admin path spelled another way never reaches the control plane.
        for path in [
            "/admin/../metrics",
            "/admin/./keys",
            "/admin//keys",
            "/admin/keys/../../health",
            "/admin/%2e%2e/metrics",
            "/admin/..%2fmetrics",
            "/admin/%6beys",
            "/admin/..\\metrics",
        ] {
            let mut host = FakeHost::with_state(State::new(1, snap.clone()));
            host.add(Side::Request, ":method", b"GET");
            host.add(Side::Request, ":path", path.as_bytes());
            host.add(Side::Request, "authorization", b"Bearer admin-token");
            let mut front = Front::default();
            front.on_request_headers(&mut host, false);
            assert_eq!(
                host.answered.as_ref().map(|a| a.status),
                Some(404),
                "{path}"
            );
        }
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod cache_tests;

#[cfg(test)]
#[path = "budget_tests.rs"]
mod budget_step_tests;

#[cfg(test)]
#[path = "gemini_tests.rs"]
mod gemini_tests;

#[cfg(test)]
mod traceparent_tests {
    use super::valid_traceparent;

    #[test]
    fn traceparent_shapes() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(ok));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
        assert!(valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use crate::vm::minute_lease::{Ask, MinuteLease};
    use ai_router_proto::v1::{Model, Policy, Provider, ProviderKey, Snapshot};
    use std::collections::HashMap;

    const KEY: &str = "sk-starci-app-0123456789abcdef";

    fn state() -> State {
        let mut snap = Snapshot::default();
        snap.providers.push(Provider {
            id: "p1".into(),
            keys: vec![ProviderKey {
                alias: "a".into(),
                secret: "sk-provider-a".into(),
                ..Default::default()
            }],
            models: vec![Model {
                id: "m1".into(),
                aliases: vec!["chat".into()],
                ..Default::default()
            }],
            ..Default::default()
        });
        snap.virtual_keys.push(VirtualKey {
            id: "key_app".into(),
            sha256: sha256_hex(KEY.as_bytes()),
            profiles: vec!["*".into()],
            models: vec!["*".into()],
            allow_fallback: true,
            enabled: true,
            ..Default::default()
        });
        snap.virtual_keys.push(VirtualKey {
            id: "key_slow".into(),
            sha256: sha256_hex(b"sk-starci-slow-1"),
            models: vec!["*".into()],
            enabled: true,
            requests_per_minute: 1,
            ..Default::default()
        });
        snap.defaults = Some(Policy {
            max_attempts: Some(3),
            ..Default::default()
        });
        State::new(1, snap)
    }

    /// A host holding a client request with these headers.
    fn client(method: &str, path: &str, extra: &[(&str, &[u8])]) -> FakeHost {
        let mut host = FakeHost::with_state(state());
        host.add(Side::Request, ":method", method.as_bytes());
        host.add(Side::Request, ":path", path.as_bytes());
        host.add(Side::Request, "x-request-id", b"rid-1");
        for (k, v) in extra {
            host.add(Side::Request, k, v);
        }
        host
    }

    fn bearer(key: &str) -> Vec<u8> {
        format!("Bearer {key}").into_bytes()
    }

    /// Runs the request phase with `body`; returns the flow of the body callback.
    fn send_body(front: &mut Front, host: &mut FakeHost, body: &str) -> Flow {
        host.request_body = body.as_bytes().to_vec();
        front.on_request_body(host, body.len(), true)
    }

    fn answered_code(host: &FakeHost) -> (u16, String) {
        let a = host.answered.as_ref().expect("a local answer");
        let code = a.json()["error"]["code"].as_str().unwrap_or("").to_string();
        (a.status, code)
    }

    #[test]
    fn a_rule_chooses_the_profile_and_the_answer_says_which_and_what_it_cost() {
        let mut s = state().snapshot.clone();
        s.profiles.insert(
            "coding".into(),
            Policy {
                model: Some("m1".into()),
                ..Default::default()
            },
        );
        s.routes.push(ai_router_proto::v1::RouteRule {
            name: "code-tasks".into(),
            enabled: true,
            task_type: Some("code".into()),
            profile: "coding".into(),
            ..Default::default()
        });
        let auth = bearer(KEY);
        let mut host = client(
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", &auth),
                (ai_router_contract::headers::TASK_TYPE, b"code"),
            ],
        );
        host.state = Some(Rc::new(State::new(2, s)));
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        // The metadata header is read, then removed like every internal one.
        assert!(host
            .header(Side::Request, ai_router_contract::headers::TASK_TYPE)
            .is_none());
        let body = r#"{"model":"not-a-profile","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
        let plan = host
            .text(Side::Request, PLAN_HEADER)
            .and_then(|p| Plan::decode(&p))
            .expect("a plan");
        assert_eq!(plan.tiers[0][0].model, "m1");

        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, H_ATTEMPT, b"1");
        host.add(Side::Response, H_LANE_MODEL, b"m1");
        host.add(Side::Response, H_LANE_COST, b"0.0042");
        front.on_response_headers(&mut host, false);
        assert_eq!(host.text(Side::Response, H_COST).as_deref(), Some("0.0042"));
        assert_eq!(
            host.text(Side::Response, H_ROUTE).as_deref(),
            Some("code-tasks")
        );
        assert!(host.header(Side::Response, H_LANE_COST).is_none());
    }

    #[test]
    fn a_streams_headers_carry_the_estimate_as_one_never_as_the_cost() {
        let auth = bearer(KEY);
        let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        let body = r#"{"model":"chat","stream":true,"messages":[]}"#;
        send_body(&mut front, &mut host, body);
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, H_ATTEMPT, b"1");
        host.add(Side::Response, H_LANE_COST, b"0.5");
        front.on_response_headers(&mut host, false);
        assert!(host.header(Side::Response, H_COST).is_none());
        assert_eq!(
            host.text(Side::Response, H_COST_ESTIMATE).as_deref(),
            Some("0.5")
        );
    }

    #[test]
    fn a_failed_call_costs_nothing() {
        let auth = bearer(KEY);
        let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        let body = r#"{"model":"chat","messages":[]}"#;
        send_body(&mut front, &mut host, body);
        host.add(Side::Response, ":status", b"502");
        host.add(Side::Response, H_FINAL_STATUS, b"502");
        host.add(Side::Response, H_LANE_COST, b"1");
        front.on_response_headers(&mut host, false);
        assert_eq!(host.text(Side::Response, H_COST).as_deref(), Some("0"));
        assert!(host.header(Side::Response, H_ROUTE).is_none());
    }

    #[test]
    fn the_plan_carries_a_per_tenant_digest_of_the_clients_idempotency_key() {
        let plan_for = |extra: &[(&str, &[u8])]| {
            let auth = bearer(KEY);
            let mut headers: Vec<(&str, &[u8])> = vec![("authorization", &auth)];
            headers.extend_from_slice(extra);
            let mut host = client("POST", "/v1/chat/completions", &headers);
            let mut front = Front::default();
            front.on_request_headers(&mut host, false);
            let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
            send_body(&mut front, &mut host, body);
            host.text(Side::Request, PLAN_HEADER)
                .and_then(|p| Plan::decode(&p))
                .expect("a plan")
        };
        // The client's own key, not the request id, and never as the client wrote it.
        let plan = plan_for(&[("idempotency-key", b"order-42")]);
        assert_eq!(
            Some(plan.idempotency_key),
            headers::upstream_idempotency_key("key_app", "order-42")
        );
        // Without one, the request id stands in, again digested.
        let plan = plan_for(&[]);
        assert_eq!(
            Some(plan.idempotency_key),
            headers::upstream_idempotency_key("key_app", "rid-1")
        );
    }

    #[test]
    fn a_unary_call_writes_the_plan_then_dresses_the_answer() {
        let auth = bearer(KEY);
        let mut host = client(
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", &auth),
                ("x-ai-router-plan", b"{\"spoofed\":true}"),
                ("x-envoy-max-retries", b"99"),
                ("traceparent", TRACEPARENT.as_bytes()),
                ("tracestate", TRACESTATE.as_bytes()),
            ],
        );
        let mut front = Front::default();
        assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
        assert!(host.answered.is_none());
        // The client's key and its attempts to steer the router are gone.
        assert!(host.header(Side::Request, "authorization").is_none());
        assert!(host.header(Side::Request, "x-ai-router-plan").is_none());
        let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
        let plan = host
            .text(Side::Request, PLAN_HEADER)
            .and_then(|p| Plan::decode(&p))
            .expect("a plan");
        assert_eq!(plan.vk, "key_app");
        assert_eq!(plan.rid, "rid-1");
        assert_eq!(plan.tiers[0][0].provider, "p1");
        assert_eq!(plan.tiers[0][0].model, "m1");
        assert_eq!(
            host.text(Side::Request, "x-envoy-max-retries").as_deref(),
            Some("2")
        );
        // The router bounds the call by its deadline; an attempt is the attempt stage's to
        // bound (a per-try timeout would count its waits for a lane too).
        assert_eq!(
            host.text(Side::Request, "x-envoy-upstream-rq-timeout-ms")
                .and_then(|v| v.parse::<u64>().ok()),
            Some(plan.deadline_ms)
        );
        assert!(host
            .header(Side::Request, "x-envoy-upstream-rq-per-try-timeout-ms")
            .is_none());

        // The attempt stage answered on its first attempt, from m1.
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, H_ATTEMPT, b"1");
        host.add(Side::Response, H_LANE_MODEL, b"m1");
        host.add(Side::Response, "x-envoy-upstream-service-time", b"3");
        assert_eq!(front.on_response_headers(&mut host, false), Flow::Continue);
        assert_eq!(host.text(Side::Response, H_MODEL).as_deref(), Some("m1"));
        assert_eq!(host.text(Side::Response, H_ATTEMPTS).as_deref(), Some("1"));
        assert_eq!(
            host.text(Side::Response, "x-request-id").as_deref(),
            Some("rid-1")
        );
        for internal in [H_ATTEMPT, H_LANE_MODEL, "x-envoy-upstream-service-time"] {
            assert!(
                host.header(Side::Response, internal).is_none(),
                "{internal}"
            );
        }
        front.on_log(&mut host);
        assert_eq!(host.reports.len(), 1);
        assert_eq!(host.reports[0].outcome_text(), "success");
        assert_eq!(host.reports[0].virtual_key_id, "key_app");
        // What the call's trace needs: the model asked for and the client's trace context.
        assert_eq!(host.reports[0].requested_model, "chat");
        assert_eq!(host.reports[0].traceparent, TRACEPARENT);
        assert_eq!(host.reports[0].tracestate, TRACESTATE);
        assert!(host.calls.is_empty(), "the call's bookkeeping is freed");
    }

    const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

    /// The token of the last timer the stage dispatched.
    fn last_timer(host: &FakeHost) -> u32 {
        host.next_token
    }

    #[test]
    fn a_call_to_a_gateway_without_state_waits_for_it_and_is_served() {
        let auth = bearer(KEY);
        let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
        let state = host.state.take();
        let mut front = Front::default();
        assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
        assert!(
            host.answered.is_none(),
            "no 503 from a gateway still starting"
        );
        assert_eq!(host.dispatched.len(), 1, "a timer");
        // The body arrives while it waits; it is kept.
        let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(send_body(&mut front, &mut host, body), Flow::Pause);
        // No state at the first look: armed again.
        host.now += 25;
        let token = last_timer(&host);
        front.on_http_call_response(&mut host, token);
        assert_eq!(host.dispatched.len(), 2);
        assert!(host.answered.is_none());
        // The state is in: the call goes on with its plan, resumed.
        host.state = state;
        host.now += 25;
        let token = last_timer(&host);
        front.on_http_call_response(&mut host, token);
        assert!(host.answered.is_none(), "{:?}", host.answered);
        assert_eq!(host.resumed, 1);
        let plan = host
            .text(Side::Request, PLAN_HEADER)
            .and_then(|p| Plan::decode(&p))
            .expect("a plan");
        assert_eq!(plan.tiers[0][0].model, "m1");
        assert!(host.header(Side::Request, "authorization").is_none());
    }

    #[test]
    fn a_call_waits_for_the_state_at_most_its_bound() {
        let auth = bearer(KEY);
        let mut host = client("GET", "/v1/models", &[("authorization", &auth)]);
        host.state = None;
        let mut front = Front::default();
        assert_eq!(front.on_request_headers(&mut host, true), Flow::Pause);
        assert!(host.answered.is_none());
        host.now += STATE_WAIT_MS;
        let token = last_timer(&host);
        front.on_http_call_response(&mut host, token);
        assert_eq!(answered_code(&host), (503, "pool_unavailable".to_string()));
        // A timer that is not this call's changes nothing.
        let mut other = Front::default();
        other.on_http_call_response(&mut host, 999);
    }

    #[test]
    fn a_tracestate_is_reported_only_with_a_valid_traceparent_and_well_formed() {
        let auth = bearer(KEY);
        for (traceparent, tracestate, reported) in [
            (TRACEPARENT, TRACESTATE, TRACESTATE),
            ("garbage", TRACESTATE, ""),
            (TRACEPARENT, "Not A List", ""),
        ] {
            let mut host = client(
                "POST",
                "/v1/chat/completions",
                &[
                    ("authorization", &auth),
                    ("traceparent", traceparent.as_bytes()),
                    ("tracestate", tracestate.as_bytes()),
                ],
            );
            let mut front = Front::default();
            assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
            let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
            assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
            host.add(Side::Response, ":status", b"200");
            host.add(Side::Response, H_ATTEMPT, b"1");
            host.add(Side::Response, H_LANE_MODEL, b"m1");
            front.on_response_headers(&mut host, false);
            front.on_log(&mut host);
            assert_eq!(
                host.reports[0].tracestate, reported,
                "{traceparent} {tracestate}"
            );
        }
    }

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// A chat call for `m1` with the app's key, sent on to the router.
    fn a_call_sent_on() -> (Front, FakeHost) {
        let auth = bearer(KEY);
        let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
        (front, host)
    }

    #[test]
    fn the_last_attempts_signal_becomes_the_final_status() {
        let (mut front, mut host) = a_call_sent_on();
        host.add(Side::Response, ":status", b"503");
        host.add(Side::Response, H_RETRY, b"1");
        host.add(Side::Response, H_FINAL_STATUS, b"503");
        host.add(Side::Response, H_RETRY_AFTER, b"7");
        host.add(Side::Response, H_ATTEMPT, b"3");
        front.on_response_headers(&mut host, false);
        assert_eq!(host.text(Side::Response, ":status").as_deref(), Some("503"));
        assert_eq!(
            host.text(Side::Response, "retry-after").as_deref(),
            Some("7")
        );
        assert!(host.header(Side::Response, H_MODEL).is_none());
        assert!(host.header(Side::Response, H_RETRY).is_none());
        front.on_log(&mut host);
        assert!(host.reports[0].outcome_text().starts_with("error:"));
    }

    #[test]
    fn a_final_error_carries_the_calls_trail_and_a_success_only_when_asked() {
        let (mut front, mut host) = a_call_sent_on();
        let cid = front.cid.clone().unwrap_or_default();
        host.with_call(&cid, |c| {
            c.trail.skip("p9", "", "m9", "no_capability:tools");
            c.trail.attempt(crate::answer::trail::AttemptNote {
                attempt: 1,
                provider: "p1".into(),
                key: "a".into(),
                model: "m1".into(),
                class: Some(Class::RateLimit),
                status: 429,
            });
        });
        host.add(Side::Response, ":status", b"503");
        host.add(Side::Response, H_RETRY, b"1");
        host.add(Side::Response, H_FINAL_STATUS, b"503");
        host.add(Side::Response, H_ATTEMPT, b"1");
        let err = GatewayError::of(ErrorCode::PoolRateLimited).body();
        host.response_body = err.clone();
        front.on_response_headers(&mut host, false);
        assert_eq!(
            front.on_response_body(&mut host, err.len(), false),
            Flow::Pause
        );
        assert_eq!(
            front.on_response_body(&mut host, err.len(), true),
            Flow::Continue
        );
        let v: Value = serde_json::from_slice(&host.response_body).unwrap_or_default();
        assert_eq!(v["error"]["code"], "pool_rate_limited");
        assert_eq!(
            v["error"]["trail"]["skipped"][0]["reason"],
            "no_capability:tools"
        );
        assert_eq!(v["error"]["trail"]["attempts"][0]["class"], "rate_limit");

        // A success: the attempt stage's trail reaches the client only if it asked.
        for (asked, shown) in [(false, false), (true, true)] {
            let auth = bearer(KEY);
            let mut headers: Vec<(&str, &[u8])> = vec![("authorization", &auth)];
            if asked {
                headers.push((H_TRAIL, b"1"));
            }
            let mut host = client("POST", "/v1/chat/completions", &headers);
            let mut front = Front::default();
            front.on_request_headers(&mut host, false);
            let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
            send_body(&mut front, &mut host, body);
            let plan = host.text(Side::Request, PLAN_HEADER).unwrap_or_default();
            assert_eq!(Plan::decode(&plan).is_some_and(|p| p.trail), asked);
            host.add(Side::Response, ":status", b"200");
            host.add(Side::Response, H_ATTEMPT, b"1");
            host.add(
                Side::Response,
                H_LANE_TRAIL,
                br#"{"skipped":[],"attempts":[]}"#,
            );
            front.on_response_headers(&mut host, false);
            assert_eq!(host.header(Side::Response, H_TRAIL).is_some(), shown);
            assert!(host.header(Side::Response, H_LANE_TRAIL).is_none());
        }
    }

    #[test]
    fn a_client_that_went_away_before_its_answer_cancelled_the_call() {
        for (details, outcome) in [
            ("downstream_remote_disconnect", "error:cancelled"),
            ("", "error:upstream"),
        ] {
            let (mut front, mut host) = a_call_sent_on();
            host.properties
                .insert("response.code_details".into(), details.as_bytes().to_vec());
            front.on_log(&mut host);
            assert_eq!(host.reports[0].outcome_text(), outcome, "{details:?}");
        }
    }

    #[test]
    fn a_stream_that_broke_off_after_its_first_token_is_no_success() {
        for (broken, details, outcome) in [
            (None, "via_upstream", "success"),
            // The client stopped reading: the lane served it.
            (None, "downstream_remote_disconnect", "success"),
            (Some(Class::Timeout), "", "error:timeout"),
            // The attempt stage's report comes after this stage's end.
            (None, "response_timeout", "error:deadline"),
            (
                None,
                "upstream_reset_after_response_started{protocol_error}",
                "error:stream",
            ),
        ] {
            let (mut front, mut host) = a_call_sent_on();
            host.add(Side::Response, ":status", b"200");
            host.add(Side::Response, H_ATTEMPT, b"1");
            front.on_response_headers(&mut host, false);
            // The attempt stage's report of how the answer ended.
            for call in host.calls.values_mut() {
                call.broken_after_first_token = broken;
            }
            host.properties
                .insert("response.code_details".into(), details.as_bytes().to_vec());
            front.on_log(&mut host);
            assert_eq!(host.reports[0].outcome_text(), outcome);
            assert_eq!(host.reports[0].status, 200);
        }
    }

    #[test]
    fn the_routers_own_answers_get_the_gateways_error_bodies() {
        for (router_status, status, code, retry_after) in [
            (504, 504, "pool_timeout", None),
            // Its circuit breakers are full: the gateway cannot take the call now.
            (503, 503, "pool_unavailable", Some("1")),
            (502, 502, "upstream_error", None),
        ] {
            let (mut front, mut host) = a_call_sent_on();
            host.add(
                Side::Response,
                ":status",
                router_status.to_string().as_bytes(),
            );
            host.add(Side::Response, "x-envoy-overloaded", b"true");
            front.on_response_headers(&mut host, false);
            host.response_body = b"upstream connect error".to_vec();
            assert_eq!(front.on_response_body(&mut host, 22, true), Flow::Continue);
            let body: Value = serde_json::from_slice(&host.response_body).unwrap_or(Value::Null);
            assert_eq!(body["error"]["code"], code, "{router_status}");
            assert_eq!(
                host.text(Side::Response, ":status"),
                Some(status.to_string())
            );
            assert_eq!(
                host.text(Side::Response, "retry-after").as_deref(),
                retry_after
            );
            assert!(host.header(Side::Response, "x-envoy-overloaded").is_none());
        }
    }

    #[test]
    fn a_router_timeout_gets_the_gateways_error_body() {
        let (mut front, mut host) = a_call_sent_on();
        // Envoy's router gave up: no attempt header, its own text body.
        host.add(Side::Response, ":status", b"504");
        host.add(Side::Response, "content-type", b"text/plain");
        front.on_response_headers(&mut host, false);
        host.response_body = b"upstream request timeout".to_vec();
        assert_eq!(front.on_response_body(&mut host, 5, false), Flow::Pause);
        assert_eq!(front.on_response_body(&mut host, 24, true), Flow::Continue);
        let body: Value = serde_json::from_slice(&host.response_body).unwrap_or(Value::Null);
        assert_eq!(body["error"]["code"], "pool_timeout");
        assert_eq!(
            host.text(Side::Response, "content-type").as_deref(),
            Some("application/json")
        );
    }

    #[test]
    fn keys_are_checked_before_anything_else() {
        type Headers = Vec<(&'static str, Vec<u8>)>;
        let cases: Vec<(Headers, u16, &str)> = vec![
            (vec![], 401, "missing_api_key"),
            (
                vec![("authorization", bearer("sk-starci-nope-1"))],
                401,
                "invalid_api_key",
            ),
            (
                vec![("authorization", b"Basic abc".to_vec())],
                401,
                "missing_api_key",
            ),
            (
                vec![("authorization", b"Bearer sk-\xe9\xe9".to_vec())],
                400,
                "invalid_request",
            ),
        ];
        for (headers, status, code) in cases {
            let extra: Vec<(&str, &[u8])> =
                headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
            let mut host = client("POST", "/v1/chat/completions", &extra);
            let mut front = Front::default();
            assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
            assert_eq!(
                answered_code(&host),
                (status, code.to_string()),
                "{headers:?}"
            );
            front.on_log(&mut host);
            assert!(host.reports[0].outcome_text().starts_with("rejected:"));
        }
    }

    #[test]
    fn routes_methods_health_and_models() {
        let mut host = client("GET", "/v1/nothing", &[]);
        Front::default().on_request_headers(&mut host, true);
        assert_eq!(answered_code(&host).0, 404);

        let mut host = client("GET", "/v1/chat/completions", &[]);
        Front::default().on_request_headers(&mut host, true);
        assert_eq!(answered_code(&host).0, 405);

        // A header value that is not UTF-8 is opaque, never a failure.
        let mut host = client("GET", "/health", &[("x-foo", b"caf\xe9")]);
        Front::default().on_request_headers(&mut host, true);
        let a = host.answered.clone().expect("answered");
        assert_eq!((a.status, a.json()["status"].clone()), (200, "ok".into()));

        let auth = bearer(KEY);
        let mut host = client("GET", "/v1/models/chat", &[("authorization", &auth)]);
        Front::default().on_request_headers(&mut host, true);
        let a = host.answered.clone().expect("answered");
        assert_eq!((a.status, a.json()["id"].clone()), (200, "chat".into()));

        let mut host = client("GET", "/health", &[]);
        host.state = None;
        Front::default().on_request_headers(&mut host, true);
        assert_eq!(host.answered.map(|a| a.status), Some(503));
    }

    #[test]
    fn body_checks() {
        let auth = bearer(KEY);
        // Too large by its content-length: refused before the body arrives.
        let mut host = client(
            "POST",
            "/v1/chat/completions",
            &[("authorization", &auth), ("content-length", b"99999999")],
        );
        Front::default().on_request_headers(&mut host, false);
        assert_eq!(answered_code(&host), (413, "request_too_large".into()));

        for (body, code) in [
            ("{not json", "invalid_json"),
            ("[1,2]", "invalid_json"),
            (r#"{"messages":[]}"#, "missing_model"),
            (r#"{"model":"m1","messages":"hi"}"#, "invalid_request"),
            (r#"{"model":"nope","messages":[]}"#, "model_not_found"),
        ] {
            let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
            let mut front = Front::default();
            front.on_request_headers(&mut host, false);
            assert_eq!(
                send_body(&mut front, &mut host, body),
                Flow::Pause,
                "{body}"
            );
            assert_eq!(answered_code(&host).1, code, "{body}");
            assert!(host.header(Side::Request, PLAN_HEADER).is_none());
        }

        // No body at all.
        let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
        Front::default().on_request_headers(&mut host, true);
        assert_eq!(answered_code(&host), (400, "invalid_json".into()));
    }

    #[test]
    fn requests_per_minute_answer_429_with_retry_after() {
        let auth = bearer("sk-starci-slow-1");
        let mut first = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
        assert_eq!(
            Front::default().on_request_headers(&mut first, false),
            Flow::Pause
        );
        assert!(first.answered.is_none());
        // The first call of the minute passed at once and asked for the minute's block.
        assert_eq!(first.minute_asks.len(), 1);
        assert_eq!(first.minute_asks[0].0, "key_slow");
        // The same process, the same minute.
        let leases = first.minute_leases.clone();
        let mut second = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
        second.minute_leases = leases;
        Front::default().on_request_headers(&mut second, false);
        let a = second.answered.clone().expect("refused");
        assert_eq!(a.status, 429);
        assert_eq!(a.json()["error"]["code"], "requests_per_minute_exceeded");
        assert!(a.header("retry-after").is_some());
    }

    /// A host whose state has `key_busy` (requestsPerMinute 20: blocks of 5), with `leases` as
    /// the process's minute records.
    fn busy_call(leases: &HashMap<String, MinuteLease>) -> FakeHost {
        let mut s = state().snapshot.clone();
        s.virtual_keys.push(VirtualKey {
            id: "key_busy".into(),
            sha256: sha256_hex(b"sk-starci-busy-1"),
            models: vec!["*".into()],
            enabled: true,
            requests_per_minute: 20,
            ..Default::default()
        });
        let auth = bearer("sk-starci-busy-1");
        let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
        host.state = Some(Rc::new(State::new(2, s)));
        host.minute_leases = leases.clone();
        host
    }

    /// Makes `n` calls of `key_busy`; returns how many were admitted and the asks they made.
    fn busy_calls(leases: &mut HashMap<String, MinuteLease>, n: u32) -> (u32, Vec<Ask>) {
        let mut admitted = 0;
        let mut asks = Vec::new();
        for _ in 0..n {
            let mut host = busy_call(leases);
            Front::default().on_request_headers(&mut host, false);
            match &host.answered {
                None => admitted += 1,
                Some(a) => {
                    assert_eq!(a.status, 429);
                    assert_eq!(a.json()["error"]["code"], "requests_per_minute_exceeded");
                }
            }
            asks.extend(host.minute_asks.iter().map(|(_, ask)| *ask));
            *leases = host.minute_leases;
        }
        (admitted, asks)
    }

    fn answer(leases: &mut HashMap<String, MinuteLease>, ask: Ask, granted: Option<u32>) {
        let stored = leases.get("key_busy").copied();
        if let Some(lease) = MinuteLease::answered(stored, ask, granted) {
            leases.insert("key_busy".into(), lease);
        }
    }

    #[test]
    fn requests_per_minute_are_admitted_from_the_blocks_the_control_plane_grants() {
        let mut leases = HashMap::new();
        // No answer yet: one block passes on credit, the rest waits for a grant.
        let (admitted, asks) = busy_calls(&mut leases, 8);
        assert_eq!((admitted, asks.len()), (5, 1));
        answer(&mut leases, asks[0], Some(5));
        let (admitted, asks) = busy_calls(&mut leases, 8);
        assert_eq!((admitted, asks.len()), (5, 1));
        // Other Envoys took most of the minute: 2 calls were left.
        answer(&mut leases, asks[0], Some(2));
        let (admitted, asks) = busy_calls(&mut leases, 5);
        assert_eq!(
            (admitted, asks.len()),
            (0, 0),
            "the credit already covered them"
        );
        assert_eq!(leases["key_busy"].used, 10);
    }

    #[test]
    fn requests_per_minute_count_alone_when_the_control_plane_does_not_answer() {
        let mut leases = HashMap::new();
        let (_, asks) = busy_calls(&mut leases, 1);
        answer(&mut leases, asks[0], None);
        let (admitted, asks) = busy_calls(&mut leases, 30);
        // The limit, 20, as one Envoy alone counts it: 19 more.
        assert_eq!((admitted, asks.len()), (19, 0));
    }

    #[test]
    fn chat_takes_the_key_as_x_api_key_too_and_a_missing_key_names_both_headers() {
        let key = KEY.as_bytes().to_vec();
        let mut host = client("POST", "/v1/chat/completions", &[("x-api-key", &key)]);
        let mut front = Front::default();
        assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
        assert!(host.answered.is_none(), "{:?}", host.answered);
        assert!(host.header(Side::Request, "x-api-key").is_none());
        for path in ["/v1/chat/completions", "/v1/messages"] {
            let mut host = client("POST", path, &[]);
            Front::default().on_request_headers(&mut host, false);
            let answer = host.answered.as_ref().expect("a local answer");
            assert_eq!(answer.status, 401);
            let text = String::from_utf8_lossy(&answer.body).to_string();
            assert!(
                text.contains("x-api-key") && text.contains("Authorization: Bearer"),
                "{path}: {text}"
            );
        }
    }

    #[test]
    fn messages_take_x_api_key_and_answer_errors_in_the_anthropic_shape() {
        let key = KEY.as_bytes().to_vec();
        // Authenticated by x-api-key; the key goes no further; the plan names the protocol.
        let mut host = client(
            "POST",
            "/v1/messages",
            &[("x-api-key", &key), ("anthropic-beta", b"tools-2024")],
        );
        let mut front = Front::default();
        assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
        assert!(host.answered.is_none());
        assert!(host.header(Side::Request, "x-api-key").is_none());
        let body = r#"{"model":"m1","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
        let plan = host
            .text(Side::Request, PLAN_HEADER)
            .and_then(|p| Plan::decode(&p))
            .expect("a plan");
        assert_eq!(plan.protocol, Protocol::Messages);
        assert!(plan.stream && plan.include_usage);
        assert_eq!(plan.anthropic_version.as_deref(), Some("2023-06-01"));
        assert_eq!(plan.anthropic_beta.as_deref(), Some("tools-2024"));

        // The final error of the call, re-dressed.
        host.add(Side::Response, ":status", b"503");
        host.add(Side::Response, H_FINAL_STATUS, b"503");
        host.add(Side::Response, H_ATTEMPT, b"3");
        front.on_response_headers(&mut host, false);
        host.response_body = GatewayError::of(ErrorCode::PoolUnavailable).body();
        let size = host.response_body.len();
        assert_eq!(
            front.on_response_body(&mut host, size, true),
            Flow::Continue
        );
        let v: Value = serde_json::from_slice(&host.response_body).unwrap_or(Value::Null);
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "overloaded_error");
        assert_eq!(v["error"]["code"], "pool_unavailable");

        // The stage's own refusals: a wrong key, a bad version, a body without max_tokens.
        for (headers, body, status, kind) in [
            (
                vec![("x-api-key", b"sk-nope".to_vec())],
                None,
                401,
                "authentication_error",
            ),
            (
                vec![
                    ("x-api-key", key.clone()),
                    ("anthropic-version", b"latest".to_vec()),
                ],
                None,
                400,
                "invalid_request_error",
            ),
            (
                vec![("authorization", bearer(KEY))],
                Some(r#"{"model":"m1","messages":[]}"#),
                400,
                "invalid_request_error",
            ),
        ] {
            let extra: Vec<(&str, &[u8])> =
                headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
            let mut host = client("POST", "/v1/messages", &extra);
            let mut front = Front::default();
            front.on_request_headers(&mut host, false);
            if let Some(body) = body {
                send_body(&mut front, &mut host, body);
            }
            let a = host.answered.clone().expect("answered");
            assert_eq!(
                (a.status, a.json()["error"]["type"].clone()),
                (status, kind.into())
            );
            assert_eq!(a.json()["type"], "error");
        }
    }

    /// Claude Code's first request, cut down: `?beta=true`, a system turn inside `messages`,
    /// the fields it sends that chat completions has no counterpart for.
    const CLAUDE_CODE_BODY: &str = r#"{"model":"m1","max_tokens":32000,"stream":true,
        "system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],
        "messages":[{"role":"user","content":[{"type":"text","text":"Say hi"}]},
                    {"role":"system","content":[{"type":"text","text":"Environment: linux"}]}],
        "tools":[{"name":"Bash","input_schema":{"type":"object"}},{"name":"Later","defer_loading":true,"input_schema":{"type":"object"}}],
        "thinking":{"type":"adaptive"},"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},
        "output_config":{"effort":"high"},"metadata":{"user_id":"u"},"temperature":null}"#;

    fn messages_call(state: State, path: &str, body: &str) -> (FakeHost, Flow) {
        let key = KEY.as_bytes().to_vec();
        let mut host = FakeHost::with_state(state);
        host.add(Side::Request, ":method", b"POST");
        host.add(Side::Request, ":path", path.as_bytes());
        host.add(Side::Request, "x-api-key", &key);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        let flow = send_body(&mut front, &mut host, body);
        (host, flow)
    }

    /// The plan the front stage wrote, and its lanes' providers in order.
    fn planned_lanes(host: &FakeHost) -> (Plan, Vec<String>) {
        let plan = host
            .text(Side::Request, PLAN_HEADER)
            .and_then(|p| Plan::decode(&p))
            .expect("a plan");
        let lanes = plan
            .tiers
            .iter()
            .flatten()
            .map(|c| c.provider.clone())
            .collect();
        (plan, lanes)
    }

    fn with_kinds(kinds: &[ai_router_proto::v1::ProviderKind]) -> State {
        let mut snap = state().snapshot;
        let first = snap.providers[0].clone();
        snap.providers.clear();
        for (i, kind) in kinds.iter().enumerate() {
            let mut p = first.clone();
            p.id = format!("p{}", i + 1);
            p.kind = (*kind).into();
            snap.providers.push(p);
        }
        State::new(1, snap)
    }

    #[test]
    fn claude_codes_request_goes_to_either_lane_kind() {
        use ai_router_proto::v1::ProviderKind::{Anthropic, OpenaiCompatible};
        for kind in [Anthropic, OpenaiCompatible] {
            let (host, flow) = messages_call(
                with_kinds(&[kind]),
                "/v1/messages?beta=true",
                CLAUDE_CODE_BODY,
            );
            assert_eq!(flow, Flow::Continue, "{kind:?}: {:?}", host.answered);
        }
    }

    #[test]
    fn a_request_a_translated_lane_cannot_take_goes_to_the_native_one_or_is_refused_naming_the_field(
    ) {
        use ai_router_proto::v1::ProviderKind::{Anthropic, OpenaiCompatible};
        let body = CLAUDE_CODE_BODY.replace(
            r#""temperature":null"#,
            r#""mcp_servers":[{"type":"url","url":"https://mcp.test","name":"x"}]"#,
        );
        let (host, flow) = messages_call(
            with_kinds(&[OpenaiCompatible, Anthropic]),
            "/v1/messages",
            &body,
        );
        assert_eq!(flow, Flow::Continue, "{:?}", host.answered);
        let (_, lanes) = planned_lanes(&host);
        assert_eq!(lanes, ["p2"]);

        let (host, flow) = messages_call(with_kinds(&[OpenaiCompatible]), "/v1/messages", &body);
        assert_eq!(flow, Flow::Pause);
        let a = host.answered.clone().expect("answered");
        let v = a.json();
        assert_eq!((a.status, v["type"].clone()), (400, json!("error")), "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("mcp_servers"),
            "{v}"
        );
        assert_eq!(
            v["error"]["trail"]["skipped"][0]["reason"], "adapter",
            "{v}"
        );
    }

    #[test]
    fn count_tokens_goes_to_an_anthropic_lane_when_the_model_has_one() {
        use ai_router_proto::v1::ProviderKind::{Anthropic, OpenaiCompatible};
        let body = r#"{"model":"m1","messages":[{"role":"user","content":"Hello"}]}"#;
        let (host, flow) = messages_call(
            with_kinds(&[OpenaiCompatible, Anthropic]),
            "/v1/messages/count_tokens",
            body,
        );
        assert_eq!(flow, Flow::Continue, "{:?}", host.answered);
        let (plan, lanes) = planned_lanes(&host);
        assert!(plan.count_tokens);
        assert_eq!(lanes, ["p2"]);
    }

    #[test]
    fn count_tokens_is_answered_by_the_gateway_and_unknown_messages_paths_in_anthropic_shape() {
        let (host, flow) = messages_call(
            state(),
            "/v1/messages/count_tokens?beta=true",
            r#"{"model":"m1","system":"Be brief.","messages":[{"role":"user","content":"Hello there, how are you?"}]}"#,
        );
        assert_eq!(flow, Flow::Pause);
        let a = host.answered.clone().expect("answered");
        assert_eq!(a.status, 200);
        let n = a.json()["input_tokens"].as_u64().unwrap_or(0);
        assert!(n > 5, "{:?}", a.json());

        let mut host = client("POST", "/v1/messages/batches", &[]);
        Front::default().on_request_headers(&mut host, false);
        let a = host.answered.clone().expect("answered");
        assert_eq!(
            (a.status, a.json()["error"]["type"].clone()),
            (404, json!("not_found_error"))
        );
        let mut host = client("GET", "/v1/messages/count_tokens", &[]);
        Front::default().on_request_headers(&mut host, true);
        let a = host.answered.clone().expect("answered");
        assert_eq!((a.status, a.json()["type"].clone()), (405, json!("error")));
    }

    #[test]
    fn anthropic_clients_list_models_in_their_shape() {
        let key = KEY.as_bytes().to_vec();
        let mut host = client("GET", "/v1/models", &[("x-api-key", &key)]);
        Front::default().on_request_headers(&mut host, true);
        let a = host.answered.clone().expect("answered");
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["data"][0]["type"], "model");
        assert!(a.json()["first_id"].is_string());
        let mut host = client("GET", "/v1/models", &[("anthropic-version", b"2023-06-01")]);
        Front::default().on_request_headers(&mut host, true);
        let a = host.answered.clone().expect("answered");
        assert_eq!((a.status, a.json()["type"].clone()), (401, json!("error")));
    }

    #[test]
    fn responses_are_routed_like_chat_and_state_is_refused_without_an_openai_lane() {
        let auth = bearer(KEY);
        let mut host = client("POST", "/v1/responses", &[("authorization", &auth)]);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        let body = r#"{"model":"chat","input":"hi","instructions":"brief"}"#;
        assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
        let plan = host
            .text(Side::Request, PLAN_HEADER)
            .and_then(|p| Plan::decode(&p))
            .expect("a plan");
        assert_eq!(plan.protocol, Protocol::Responses);
        assert_eq!(plan.tiers[0][0].model, "m1");

        for body in [
            r#"{"model":"chat","input":"hi","previous_response_id":"resp_1"}"#,
            r#"{"model":"chat","input":"hi","store":true}"#,
            r#"{"model":"chat"}"#,
        ] {
            let mut host = client("POST", "/v1/responses", &[("authorization", &auth)]);
            let mut front = Front::default();
            front.on_request_headers(&mut host, false);
            assert_eq!(
                send_body(&mut front, &mut host, body),
                Flow::Pause,
                "{body}"
            );
            assert_eq!(
                answered_code(&host),
                (400, "invalid_request".into()),
                "{body}"
            );
        }
        let mut host = client("GET", "/v1/responses", &[]);
        Front::default().on_request_headers(&mut host, true);
        assert_eq!(answered_code(&host).0, 405);
    }

    #[test]
    fn a_stateful_response_goes_to_the_openai_lanes_only() {
        let mut snap = state().snapshot.clone();
        snap.providers[0].kind = ai_router_proto::v1::ProviderKind::Openai.into();
        let state = State::new(2, snap);
        let cut = crate::protocols::stateful_tiers(
            &state,
            &[vec![
                crate::plan::Candidate {
                    when: Vec::new(),
                    provider: "p1".into(),
                    model: "m1".into(),
                    weight: 1.0,
                },
                crate::plan::Candidate {
                    when: Vec::new(),
                    provider: "gone".into(),
                    model: "m1".into(),
                    weight: 1.0,
                },
            ]],
        );
        assert_eq!(cut.map(|t| t[0].len()), Some(1));
    }

    /// The app's key with budgets pushed: a spent hard one, a soft one past warnAt.
    fn a_budgeted_call(states: Vec<ai_router_proto::v1::BudgetState>) -> (Front, FakeHost, Flow) {
        use ai_router_proto::v1::{Budget, BudgetScope, BudgetWindow, Budgets};
        let mut snap = state().snapshot;
        let policy = |name: &str, scope: BudgetScope, hard| Budget {
            name: name.into(),
            scope: scope.into(),
            window: BudgetWindow::Day.into(),
            max_tokens: 100,
            hard,
            warn_at: 0.5,
            ..Default::default()
        };
        snap.budgets = Some(Budgets {
            policies: vec![
                policy("key-day", BudgetScope::Key, true),
                policy("pool-day", BudgetScope::Pool, false),
            ],
            states,
        });
        let auth = bearer(KEY);
        let mut host = FakeHost::with_state(State::new(1, snap));
        for (k, v) in [
            (":method", b"POST".as_slice()),
            (":path", b"/v1/chat/completions"),
            ("authorization", &auth),
        ] {
            host.add(Side::Request, k, v);
        }
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
        let flow = send_body(&mut front, &mut host, body);
        (front, host, flow)
    }

    #[test]
    fn budgets_refuse_or_warn_from_the_pushed_states() {
        use ai_router_proto::v1::{BudgetLevel, BudgetState};
        let until = 1_700_000_000_000 + 30_000;
        let st = |name: &str, subject: &str, level: BudgetLevel| BudgetState {
            name: name.into(),
            subject: subject.into(),
            level: level.into(),
            until_ms: until,
        };
        // The key's hard budget is spent: 429 before any plan, with Retry-After.
        let (mut front, mut host, flow) =
            a_budgeted_call(vec![st("key-day", "key_app", BudgetLevel::Over)]);
        assert_eq!(flow, Flow::Pause);
        assert_eq!(answered_code(&host), (429, "budget_exceeded".to_string()));
        let answer = host.answered.as_ref().expect("answered");
        assert_eq!(answer.header("retry-after"), Some("30"));
        assert!(host.header(Side::Request, PLAN_HEADER).is_none());
        front.on_log(&mut host);
        assert_eq!(host.reports[0].outcome_text(), "rejected:budget_exceeded");

        // Another key's spent budget is not this call's; the pool's warning is.
        let (mut front, mut host, flow) = a_budgeted_call(vec![
            st("key-day", "key_other", BudgetLevel::Over),
            st("pool-day", "", BudgetLevel::Warn),
        ]);
        assert_eq!(flow, Flow::Continue);
        let plan = host
            .text(Side::Request, PLAN_HEADER)
            .and_then(|p| Plan::decode(&p))
            .expect("a plan");
        assert_eq!(plan.profile, "", "a direct model call has no profile");
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, H_ATTEMPT, b"1");
        front.on_response_headers(&mut host, false);
        assert_eq!(
            host.text(Side::Response, H_BUDGET_WARNING).as_deref(),
            Some("pool-day=warn")
        );
        front.on_log(&mut host);
        assert_eq!(host.reports[0].budget_warnings, ["pool-day=warn"]);
    }
}
