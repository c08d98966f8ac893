//! The request's body: buffered within the limit, parsed once, checked, resolved into the
//! call's tiers (rules, policy, budgets, the protocols' limits), answered from the cache when
//! it can be, else planned for the attempt stage.

use ai_router_proto::v1::VirtualKey;
use serde_json::{json, Value};

use super::{budget, Front, SharedWait};
use crate::answer::errors::GatewayError;
use crate::host::{Flow, Host, Side};
use crate::plan::{Operation, Plan, Protocol, PLAN_HEADER};
use crate::protocols::anthropic::error::AdapterError;
use crate::protocols::messages::request::Fidelity;
use crate::resolve;
use crate::resolve::rules;
use crate::state::State;
use crate::wire::headers;
use ai_router_contract::error_code::ErrorCode;

/// A body as the stage read it.
struct ReadBody {
    /// The body as a chat-completions request: what the rules and the pool route by; `None`
    /// when the request is one already (not copied: a coding agent's body is large).
    view: Option<Value>,
    /// The caller's request (a Gemini call's chat translation): what the lanes are sent.
    request: Value,
    /// Gemini's `:countTokens` body, answered once the model is resolved.
    gemini_counted: Option<Value>,
    /// Gemini: what no translation carries; only a native lane can serve the call then.
    gemini_refusal: Option<AdapterError>,
}

impl ReadBody {
    /// The body as a chat-completions request.
    fn view(&self) -> &Value {
        self.view.as_ref().unwrap_or(&self.request)
    }
}

/// Whether a request routes as it came: a chat-completions body (a Gemini call's is its chat
/// translation already) is its own chat view, unless `:countTokens` gives the view a
/// `max_tokens`.
fn routed_as_it_came(protocol: Protocol, count_tokens: bool) -> bool {
    !count_tokens && matches!(protocol, Protocol::Chat | Protocol::Gemini)
}

impl Front {
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
        self.take_body(host, body)
    }

    /// A part of the body: refused when it is already past the limit, else buffered.
    pub(super) fn body_so_far(&mut self, host: &mut impl Host, size: usize) -> Flow {
        match self.over_limit(size) {
            Some(err) => self.reply(host, err),
            None => Flow::Pause,
        }
    }

    pub(super) fn over_limit(&self, size: usize) -> Option<GatewayError> {
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

    /// The whole body, kept in the call for its attempts ([`Call::body`]).
    ///
    /// [`Call::body`]: crate::vm::call::Call::body
    pub(super) fn take_body(&mut self, host: &mut impl Host, body: Vec<u8>) -> Flow {
        let body = std::rc::Rc::new(body);
        self.caller_body = Some(body.clone());
        let Some(op) = self.op else {
            return Flow::Continue;
        };
        if let Some(err) = self.over_limit(body.len()) {
            return self.reply(host, err);
        }
        self.on_body(host, &body, op)
    }

    /// The whole body, within the limit: read, resolved into the call's tiers, then answered
    /// from the cache or planned.
    pub(super) fn on_body(&mut self, host: &mut impl Host, body: &[u8], op: Operation) -> Flow {
        let Some(state) = self.state.clone() else {
            return self.reply(host, GatewayError::not_ready());
        };
        let Some(key) = self.key.take() else {
            return self.reply(host, GatewayError::invalid_api_key());
        };
        let read = match self.read_body(body, op) {
            Ok(read) => read,
            Err(error) => return self.reply(host, error),
        };
        let mut resolved = match self.resolve_body(host, &state, &key, &read, op) {
            Ok(resolved) => resolved,
            Err(error) => return self.reply(host, error),
        };
        if let Some(e) = &read.gemini_refusal {
            let json_array = self.gemini.as_ref().is_some_and(|g| g.json_array);
            let (tiers, trail) = (&mut resolved.tiers, &mut resolved.trail);
            if !crate::protocols::gemini::native::keep_native(&state, tiers, trail, json_array) {
                let mut err = GatewayError::new(ErrorCode::InvalidRequest, e.message.clone());
                err.param = e.param;
                return self.reply(host, err.with_trail(resolved.trail));
            }
        }
        if self.count_tokens {
            // The provider's own count on a lane of the caller's protocol (native, so nothing
            // to translate): anthropic for Messages, gemini for Gemini; else the gateway's
            // estimate.
            let (kind, counted) = match read.gemini_counted.as_ref() {
                Some(counted) => (ai_router_proto::v1::ProviderKind::Gemini, counted),
                None => (ai_router_proto::v1::ProviderKind::Anthropic, &read.request),
            };
            match crate::protocols::tiers_of_kind(&state, &resolved.tiers, kind) {
                Some(tiers) => resolved.tiers = tiers,
                None => return self.answer_count_tokens(host, counted),
            }
        }
        if let Err(error) = self.narrow(&state, &key, &read.request, &mut resolved) {
            return self.reply(host, error);
        }
        self.stream = resolved.stream;
        self.cache_or_plan(host, state, key, resolved, read, op)
    }

    /// One parse, the Gemini translation, the checks of the body and its chat-completions view.
    fn read_body(&mut self, body: &[u8], op: Operation) -> Result<ReadBody, GatewayError> {
        // One parse, refusing a repeated top-level field: one `model`, one `stream`, so what
        // the scope check and the router read is what the provider reads.
        let mut parsed = crate::front::body_check::parse_object(body)?;
        // Gemini's `:countTokens` body, answered once the model is resolved.
        let mut gemini_counted = None;
        // Gemini: what no translation carries; only a native lane can serve the call then.
        let mut gemini_refusal = None;
        if let Some(call) = self.gemini.clone() {
            // The Gemini request is routed by its chat-completions translation; the attempts
            // carry the caller's body (sent whole to a gemini lane, translated for the others).
            let routed = crate::protocols::gemini::request::routed_request(
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
                    return Err(err);
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
                    parsed = crate::protocols::gemini::native::routing_view(
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
            return Err(GatewayError::new(
                ErrorCode::InvalidRequest,
                "messages must be an array of turns.",
            )
            .with_param("messages"));
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
        let view = if routed_as_it_came(self.protocol, self.count_tokens) {
            None
        } else {
            match crate::protocols::chat_request(self.protocol, routed, Fidelity::Lenient) {
                Ok(v) => Some(v),
                Err(e) => {
                    let mut err = GatewayError::new(ErrorCode::InvalidRequest, e.message);
                    err.param = e.param;
                    return Err(err);
                }
            }
        };
        let chat = view.as_ref().unwrap_or(&parsed);
        match op {
            Operation::Chat => crate::front::body_check::check_chat(chat)?,
            Operation::Embeddings => {
                if chat.get("input").is_none() {
                    return Err(
                        GatewayError::new(ErrorCode::InvalidRequest, "input is required.")
                            .with_param("input"),
                    );
                }
            }
        }
        Ok(ReadBody {
            view,
            request: parsed,
            gemini_counted,
            gemini_refusal,
        })
    }

    /// The call's tiers: the `routes:` rule, the policy, and what a stateful Responses call
    /// can be served by.
    fn resolve_body(
        &mut self,
        host: &mut impl Host,
        state: &State,
        key: &VirtualKey,
        read: &ReadBody,
        op: Operation,
    ) -> Result<resolve::Resolved, GatewayError> {
        let rule = rules::route_for(state, key, read.view(), &self.metadata);
        self.route = rule.map(|r| r.name.clone());
        let routed = rule.map(|r| r.profile.as_str());
        let mut resolved = resolve::resolve_as(state, key, read.view(), op, routed, self.protocol)?;
        if let Some(param) = crate::protocols::stateful(self.protocol, &read.request) {
            // Only a provider that keeps responses can serve it: lanes of kind openai, natively.
            match crate::protocols::stateful_tiers(state, &resolved.tiers) {
                Some(tiers) => resolved.tiers = tiers,
                None => {
                    return Err(GatewayError::new(
                        ErrorCode::InvalidRequest,
                        format!(
                            "'{param}' needs a provider that keeps responses (kind openai), \
                             and no lane of this model is one. The gateway keeps no state: \
                             send the whole conversation as input items, without \
                             previous_response_id and with store false."
                        ),
                    )
                    .with_param(param))
                }
            }
        }
        if self.protocol == Protocol::Responses {
            // A stored response is read only by the key that stored it (`response_pins`).
            let tiers = &mut resolved.tiers;
            self.responses = crate::lanes::response_pins::route(
                host,
                state,
                &key.id,
                &read.request,
                tiers,
                self.started_ms,
            )?;
        }
        Ok(resolved)
    }

    /// The candidates the protocols and the budgets leave; a refusal names what ruled out each.
    fn narrow(
        &mut self,
        state: &State,
        key: &VirtualKey,
        request: &Value,
        resolved: &mut resolve::Resolved,
    ) -> Result<(), GatewayError> {
        // A lane that cannot take the request in its own protocol is no candidate; when none
        // is left, the refusal names the field (in the caller's shape).
        if let Some(e) = crate::protocols::cut_untranslatable(
            state,
            self.protocol,
            request,
            &mut resolved.tiers,
            &mut resolved.trail,
        ) {
            let mut err = GatewayError::new(ErrorCode::InvalidRequest, e.message);
            err.param = e.param;
            return Err(err.with_trail(std::mem::take(&mut resolved.trail)));
        }
        let verdict = budget_verdict(state, key, resolved, self.started_ms);
        for c in &verdict.ruled_out {
            resolved
                .trail
                .skip(&c.provider, "", &c.model, budget::TRIGGER);
        }
        self.budget_warnings = verdict.warnings;
        if let Some(err) = verdict.refusal {
            // Like the other refusals, it names what ruled out each candidate.
            return Err(err.with_trail(std::mem::take(&mut resolved.trail)));
        }
        Ok(())
    }

    /// A resolved call: answered from the cache, paused for its shared tier, or planned.
    fn cache_or_plan(
        &mut self,
        host: &mut impl Host,
        state: std::rc::Rc<State>,
        key: VirtualKey,
        resolved: resolve::Resolved,
        read: ReadBody,
        op: Operation,
    ) -> Flow {
        let cache_call = crate::cache::call::CacheCall {
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
        self.cache = crate::cache::call::CallCache::begin(
            host,
            &state,
            &cache_call,
            &resolved.tiers,
            &read.request,
            self.started_ms,
        );
        if let Some((content_type, body, model)) = self
            .cache
            .hit_answer(resolved.stream, resolved.include_usage)
        {
            return self.answer_from_cache(host, content_type, &model, &body);
        }
        // The caller's body as it came (a Gemini call's `request` is its translation).
        self.body_top = matches!(self.protocol, Protocol::Chat | Protocol::Messages)
            .then(|| crate::plan::BodyTop::of(&read.request));
        let parsed = read.view.unwrap_or(read.request);
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

    /// Plans a resolved call the cache did not answer: the attempts' plan on the request.
    pub(super) fn plan_call(
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
            body_top: self.body_top.take(),
        };
        let ruled_out = resolved.trail;
        // The ticket's number: 53 bits of the VM's draw (the front replaces any header of
        // this name the client sent, and the attempt listener is reached only from here).
        let draw = (host.random_unit() * (1u64 << 53) as f64) as u64;
        let written = crate::plan::Written::new(plan, draw);
        let (plan, text) = (written.plan.clone(), written.ticket.clone());
        let body = self.caller_body.take();
        host.with_call(&cid, |c| {
            c.trail = ruled_out;
            c.plan = Some(written);
            c.body = body;
        });
        self.cid = Some(cid);
        host.set_header(Side::Request, PLAN_HEADER, Some(&text));
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
        if let Some(one_pass) = self.one_pass.clone() {
            self.route(host, state, &plan, &one_pass);
        }
        Flow::Continue
    }

    /// With `gateway.onePass`: the public route's cluster. A call whose first lane the front
    /// could reserve goes to the one-pass aggregate, to that lane's host; its attempts are then
    /// bounded by the router's per-try timeout too (only the router can retry an attempt that
    /// has no answer). Any other goes to the attempt listener.
    fn route(
        &mut self,
        host: &mut impl Host,
        state: &State,
        plan: &Plan,
        one_pass: &ai_router_contract::plugin::OnePass,
    ) {
        use ai_router_contract::{clusters, headers::PASS};
        match crate::attempt::first::reserve(host, plan, state, one_pass) {
            Some(authority) => {
                host.set_header(Side::Request, PASS, Some(clusters::ONE_PASS));
                host.set_header(Side::Request, ":authority", Some(&authority));
                let per_try = crate::attempt::router_per_try_ms(plan.timeout_ms);
                host.set_header(
                    Side::Request,
                    "x-envoy-upstream-rq-per-try-timeout-ms",
                    Some(&per_try.to_string()),
                );
            }
            None => host.set_header(Side::Request, PASS, Some(clusters::ATTEMPTS)),
        }
    }
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
