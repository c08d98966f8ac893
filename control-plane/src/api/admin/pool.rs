//! The pool as an operator sees it: health (providers, keys, breakers, cooldowns, headroom,
//! budgets, lanes), counters, the quota ledger, the live events, and the reset; with their
//! HTTP handlers.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use ai_router_proto::v1 as pb;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::Extension;
use serde_json::{json, Value};

use super::auth::Caller;
use super::http::{body, ok, Answer};
use super::state::AdminApi;
use crate::api::error::{ApiError, ErrorCode};
use crate::engine::events::{parse_types, Next};

impl AdminApi {
    /// `/health` for an operator: the pool as the data plane sees it, keys by alias only.
    /// Every state, scope and reason is a word; a time with no end (a key out until its secret
    /// changes, a figure with no known reset) is `null`.
    pub fn pool_health(&self) -> Value {
        let health = self.engine.health();
        let update = self.engine.current_without_keys();
        let snapshot = update.snapshot.unwrap_or_default();
        let durable = self.engine.durable();
        let key_state = |provider: &str, alias: &str| {
            snapshot
                .key_health
                .iter()
                .find(|h| h.provider == provider && h.key == alias)
                .map_or_else(
                    || json!({ "state": "ok", "untilMs": null, "code": null }),
                    |h| {
                        let code = durable
                            .blacklists
                            .get(&(provider.to_owned(), alias.to_owned()))
                            .and_then(|b| b.code.clone());
                        json!({ "state": h.reason().text(), "untilMs": h.until(), "code": code })
                    },
                )
        };
        let providers: Vec<Value> = snapshot
            .providers
            .iter()
            .map(|p| {
                let keys: Vec<Value> = p
                    .keys
                    .iter()
                    .map(|k| {
                        let mut entry = key_state(&p.id, &k.alias);
                        entry["alias"] = json!(k.alias);
                        entry
                    })
                    .collect();
                let models: Vec<&str> = p.models.iter().map(|m| m.id.as_str()).collect();
                json!({ "id": p.id, "kind": p.kind().text(), "keys": keys, "models": models })
            })
            .collect();
        let breakers: Vec<Value> = snapshot
            .breakers
            .iter()
            .map(|b| {
                json!({
                    "scope": b.scope().text(),
                    "provider": b.provider,
                    "key": b.key,
                    "state": b.state().text(),
                    "openUntilMs": (b.open_until_ms > 0).then_some(b.open_until_ms),
                })
            })
            .collect();
        let cooldowns: Vec<Value> = snapshot
            .cooldowns
            .iter()
            .map(|c| {
                json!({ "provider": c.provider, "key": c.key, "model": c.model, "untilMs": c.until_ms })
            })
            .collect();
        let provider_health: Vec<Value> = snapshot
            .provider_health
            .iter()
            .map(|h| {
                json!({
                    "provider": h.provider,
                    "reason": h.reason().text(),
                    "untilMs": (h.until_ms > 0).then_some(h.until_ms),
                })
            })
            .collect();
        json!({
            "status": health.status,
            "version": health.version,
            "providers": providers,
            "breakers": breakers,
            "cooldowns": cooldowns,
            "providerHealth": provider_health,
            "headroom": snapshot.headroom.iter().map(|h| json!({
                "provider": h.provider, "key": h.key, "model": h.model,
                "remainingRequests": (h.remaining_requests >= 0).then_some(h.remaining_requests),
                "remainingTokens": (h.remaining_tokens >= 0).then_some(h.remaining_tokens),
                "resetAtMs": (h.reset_at_ms > 0).then_some(h.reset_at_ms),
            })).collect::<Vec<_>>(),
            "budgets": self.budgets_health(),
            "lanes": self.engine.stats().lanes.iter().map(|l| json!({
                "provider": l.provider, "key": l.key, "model": l.model,
                "latencyEwmaMs": l.latency_ewma_ms.round(),
            })).collect::<Vec<_>>(),
            "virtualKeys": self.engine.tables().virtual_keys.len(),
        })
    }

    /// Every budget policy with what each subject spent in its current window: `{ name,
    /// scope, window, enforcement, warnAt, limits: { maxTokens, maxCost }, spent: [{ subject,
    /// tokens, cost, level, untilMs }] }` (`subject` null for the pool; a `request` budget caps
    /// each call and spends nothing).
    fn budgets_health(&self) -> Vec<Value> {
        let windows = self.engine.budget_windows();
        self.engine
            .config()
            .budgets
            .iter()
            .map(|b| {
                let spent: Vec<Value> = windows
                    .iter()
                    .filter(|(name, _, _)| *name == b.name)
                    .map(|(_, subject, used)| {
                        json!({
                            "subject": (!subject.is_empty()).then_some(subject),
                            "tokens": used.tokens,
                            "cost": used.cost,
                            "level": used.level.text(),
                            "untilMs": used.until_ms,
                        })
                    })
                    .collect();
                json!({
                    "name": b.name,
                    "scope": pb::BudgetScope::from(b.scope).text(),
                    "window": pb::BudgetWindow::from(b.window).text(),
                    "enforcement": crate::config::budgets::Enforcement::of(b.hard).text(),
                    "warnAt": b.warn_at,
                    "limits": { "maxTokens": b.max_tokens, "maxCost": b.max_cost },
                    "spent": spent,
                })
            })
            .collect()
    }
}

/// What `POST /admin/reset` takes: nothing (every provider), a provider, or a provider's key.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResetSpec {
    provider: Option<String>,
    key: Option<String>,
}

impl AdminApi {
    /// Closes breakers, lifts blacklists and cooldowns, clears headroom (see [`crate::engine::Engine::reset`]).
    pub fn reset(
        &self,
        caller: &Caller,
        provider: Option<&str>,
        key: Option<&str>,
    ) -> Result<crate::engine::ResetCounts, ApiError> {
        use crate::engine::ResetError;
        let target = provider.map(|p| key.map_or_else(|| p.to_owned(), |k| format!("{p}/{k}")));
        let counts = self.engine.reset(provider, key).map_err(|e| {
            let code = match e {
                ResetError::KeyWithoutProvider => ErrorCode::InvalidRequest,
                ResetError::UnknownProvider(_) | ResetError::UnknownKey { .. } => {
                    ErrorCode::NotFound
                }
            };
            ApiError::new(code, e.to_string())
        })?;
        self.audit(caller, "reset", target.as_deref());
        Ok(counts)
    }
}

/// `GET /admin/events`: the operator's events, live, as server-sent events (`?types=` to
/// filter). Each SSE event is named by the event's type and carries its JSON; a subscriber that
/// fell behind gets a `lagged` event with how many it lost.
#[derive(Debug, serde::Deserialize)]
pub(super) struct EventsQuery {
    types: Option<String>,
}

pub(super) async fn events(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
    Query(query): Query<EventsQuery>,
) -> HttpResponse {
    let types = match parse_types(query.types.as_deref()) {
        Ok(t) => t,
        Err(message) => return ApiError::new(ErrorCode::InvalidRequest, message).into_response(),
    };
    let subscription = api.engine().events().watch(types);
    let stream = futures::stream::unfold(subscription, |mut sub| async move {
        let item = match sub.next().await? {
            Next::Event(e) => Sse::default().event(e.type_name()).data(e.to_json()),
            Next::Lagged(n) => Sse::default()
                .event("lagged")
                .data(format!(r#"{{"type":"lagged","missed":{n}}}"#)),
        };
        Some((Ok::<_, Infallible>(item), sub))
    });
    axum::response::Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// `GET /admin/health`: every breaker, key out, cooldown, headroom, budget and lane latency.
pub(super) async fn admin_health(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.pool_health())
}

/// `GET /admin/stats`: this process's counters since start.
pub(super) async fn stats(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.engine.stats())
}

/// `GET /admin/ledger`: what each provider budget has left, per window, with sources.
pub(super) async fn ledger(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.ledger_view())
}

/// `POST /admin/reset` with `{}`, `{"provider": P}` or `{"provider": P, "key": K}`.
pub(super) async fn reset(
    State(api): State<Arc<AdminApi>>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Answer {
    let spec: ResetSpec = if bytes.iter().all(u8::is_ascii_whitespace) {
        ResetSpec::default()
    } else {
        body(&bytes)?
    };
    let counts = api.reset(&caller, spec.provider.as_deref(), spec.key.as_deref())?;
    ok(StatusCode::OK, json!({ "reset": counts }))
}
