//! The front stage's own answers: its errors in the caller's shape, a token count, a cache
//! hit, the model list and `GET /health`.

use ai_router_contract::headers::{
    ATTEMPTS as H_ATTEMPTS, BUDGET_WARNING as H_BUDGET_WARNING, CACHE as H_CACHE, COST as H_COST,
    MODEL as H_MODEL,
};
use ai_router_proto::v1::BreakerPhase;
use serde_json::{json, Value};

use super::{AfterState, Front};
use crate::answer::errors::GatewayError;
use crate::host::{Flow, Host, Side};
use crate::plan::Protocol;
use crate::resolve;
use ai_router_contract::error_code::ErrorCode;

impl Front {
    pub(super) fn reply(&mut self, host: &mut impl Host, err: GatewayError) -> Flow {
        self.answered = Some((err.status, err.code.as_str()));
        self.caller_body = None;
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
    pub(super) fn answer_count_tokens(&mut self, host: &mut impl Host, body: &Value) -> Flow {
        self.answered = Some((200, "count_tokens"));
        let answer = match self.protocol {
            Protocol::Gemini => crate::protocols::gemini::request::count_tokens(body),
            _ => crate::protocols::messages::request::count_tokens(body),
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
    pub(super) fn answer_from_cache(
        &mut self,
        host: &mut impl Host,
        content_type: &str,
        model: &str,
        body: &[u8],
    ) -> Flow {
        self.caller_body = None;
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

    pub(super) fn models(&mut self, host: &mut impl Host, path: &str) -> Flow {
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
    pub(super) fn health(&mut self, host: &mut impl Host) -> Flow {
        let state = host.state();
        let now = host.now_ms();
        let usable = state.as_ref().map(|state| {
            host.with_lanes(|view, _| crate::lanes::headroom::any_usable_key(state, view, now))
        });
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
                    .map(|p| crate::lanes::headroom::health_of(&state, view, &p.id))
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
}
