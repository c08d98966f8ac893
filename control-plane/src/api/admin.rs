//! The admin API: the gateway's virtual keys, over HTTP (on the control plane's HTTP server)
//! and gRPC (`airouter.v1.Admin`, on its gRPC server, same operations).
//!
//! Every call carries the admin token: `Authorization: Bearer <token>` (the HTTP header, or the
//! gRPC metadata entry `authorization`), compared in constant time. The token is
//! `gateway.adminToken`, else `AI_ROUTER_ADMIN_TOKEN`. With none configured every call answers
//! 403 `admin_disabled`; without a token 401 `missing_api_key`; with a wrong one 401
//! `invalid_api_key`.
//!
//! | route | does |
//! |---|---|
//! | `POST /admin/keys` | create from a key spec (`label`, `owner`, `profiles`, `models`, `allowFallback`, `quota`, `enabled`, `cache`); 201 `{ key, secret }` |
//! | `GET /admin/keys` | `{ keys: [...] }`: mounted keys (`mounted: true`) then stored ones |
//! | `GET /admin/keys/{id}` | one key |
//! | `PATCH /admin/keys/{id}` | change bindings (`owner`, `profiles`, `models`, `allowFallback`, `quota`, `enabled`, `cache`); `quota` merges limit by limit, `null` removes a limit (`quota: null`, all); `cache: null` leaves the response cache to the policy |
//! | `POST /admin/keys/{id}/revoke` | revoke for good |
//! | `POST /admin/keys/{id}/rotate` | new secret, same id, bindings and usage; 200 `{ key, secret }` |
//! | `GET /admin/keys/{id}/usage?from=YYYY-MM-DD&to=YYYY-MM-DD` | `{ id, from, to, days, total }` (default: this month) |
//! | `GET /health` (no token needed) | with the admin token, adds the pool (what `GET /admin/health` answers) |
//! | `GET /admin/health` | providers, key aliases and states, breakers, cooldowns, headroom, budgets (spent, limits, window, enforcement), lane latencies: words, `null` for no end |
//! | `GET /admin/stats`, `/admin/catalog`, `/admin/ledger` | this process's counters; profiles and models; each provider's quota windows |
//! | `GET /admin/events?types=` | the operator's events, live (server-sent events) |
//! | `POST /admin/reset` | closes breakers, lifts blacklists and cooldowns |
//! | `GET /ui`, `/admin/console...` | the operator's console and its figures ([`crate::api::pulse`]) |
//!
//! A key is `{ id, label, owner, profiles, models, allowFallback, quota, enabled, revoked,
//! mounted, hint, createdAtMs, created }`: never its secret or hash. `profiles` and `models`
//! must name the pool's profiles and model ids or aliases (or `*`), else 400. The secret is in the
//! answer to create and rotate only. Errors are OpenAI error objects: 400 `invalid_request`,
//! 404 `not_found`, 409 `key_mounted` (revoke, rotate or PATCH of a mounted key: it changes by
//! redeploying), 409 `conflict` (a revoked key), 500 `internal_error`.
//!
//! A write is pushed to the data plane before the call answers; keys written by another
//! process sharing the SQLite store are picked up by [`run_key_sync`] within a second. The same
//! task pushes the keys' quota blocks ([`crate::keys::quotas`]) after each usage write, when the UTC
//! day rolls over, and every few seconds (usage another process wrote).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use ai_router_proto::v1 as pb;
use axum::body::Bytes;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{delete, get, post};
use axum::Extension;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};
use tonic::{Request, Response, Status};

use crate::api::error::{ApiError, ErrorCode};
use crate::clock::SystemClock;
use crate::config::secrets::{constant_time_eq, Env, Secret};
use crate::engine::events::{parse_types, Next};
use crate::engine::Engine;
use crate::keys::admin::{
    KeyAdmin, KeyInfo, KeyPatch, KeySpec, KeyWithSecret, QuotaPatch, UsageReport,
};
use crate::keys::admin_tokens::{self, Scope, TokenInfo, TokenSpec, TokenWithSecret};
use crate::keys::store::{utc_day, KeyStoreError, UsageDay};
use crate::ledger::Ledger;

/// The env variable holding the admin token when `gateway.adminToken` does not name one.
pub const ADMIN_TOKEN_ENV: &str = "AI_ROUTER_ADMIN_TOKEN";

/// How often the key store is checked for changes made by another process.
pub const KEY_SYNC_INTERVAL: Duration = Duration::from_millis(500);
/// Key-sync ticks between two quota recomputations when nothing else asked for one.
const QUOTA_RECHECK_TICKS: u32 = 10;
/// The least time between two rechecks of the quota blocks after usage rows were written.
const QUOTA_RECHECK_MIN_GAP: Duration = Duration::from_millis(250);

impl From<KeyStoreError> for ApiError {
    fn from(err: KeyStoreError) -> Self {
        let code = match &err {
            KeyStoreError::Invalid(_) => ErrorCode::InvalidRequest,
            KeyStoreError::NotFound(_) => ErrorCode::NotFound,
            KeyStoreError::Mounted(_) => ErrorCode::KeyMounted,
            KeyStoreError::Revoked(_) => ErrorCode::Conflict,
            KeyStoreError::Storage(detail) => {
                // The store's own text (a driver's message, a table, a constraint) is for the
                // operator's log, never for an answer.
                tracing::error!(error = %detail, "the key store failed");
                return ApiError::new(
                    ErrorCode::Internal,
                    "The key store failed; the control plane's log has the details.",
                );
            }
            KeyStoreError::Unavailable(_) => ErrorCode::Unavailable,
        };
        ApiError::new(code, err.to_string())
    }
}

/// The admin token: `gateway.adminToken` when it resolves, else `AI_ROUTER_ADMIN_TOKEN`.
pub fn admin_token(config: &crate::config::Config, env: &dyn Env) -> Option<Secret> {
    let configured = config.gateway.admin_token.as_ref();
    if let Some(token) = configured.and_then(|source| source.resolve(env)) {
        return Some(token);
    }
    let from_env = env
        .var(ADMIN_TOKEN_ENV)
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .map(Secret::new);
    if from_env.is_none() {
        if let Some(source) = configured {
            tracing::warn!(
                "gateway.adminToken: {} resolves to nothing: the admin API is off",
                source.describe()
            );
        }
    }
    from_env
}

/// Who calls the admin API: the bootstrap token (`bootstrap`, scope `admin`, no end) or a
/// stored scoped token. Never the token itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Caller {
    pub label: String,
    pub scope: Scope,
    pub expires_at_ms: Option<i64>,
}

impl Caller {
    /// The token from the environment (or `gateway.adminToken`).
    pub fn bootstrap() -> Self {
        Self {
            label: "bootstrap".into(),
            scope: Scope::Admin,
            expires_at_ms: None,
        }
    }

    /// `GET /admin/whoami`: `{ label, scope, expiresAtMs, expires }` (`null`: no end).
    pub fn whoami(&self) -> Value {
        json!({
            "label": self.label,
            "scope": self.scope,
            "expiresAtMs": self.expires_at_ms,
            "expires": self.expires_at_ms.map(crate::keys::store::utc_timestamp),
        })
    }
}

fn disabled() -> ApiError {
    ApiError::new(
        ErrorCode::AdminDisabled,
        "the admin API is off: no admin token is configured",
    )
}

/// The admin operations behind both transports.
pub struct AdminApi {
    keys: Arc<KeyAdmin>,
    token: Option<Secret>,
    engine: Arc<Engine>,
    ledger: Arc<Ledger>,
    console: Arc<crate::api::pulse::Pulse>,
}

impl std::fmt::Debug for AdminApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminApi")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// Pushes the key store's keys (and the mounted ones) into the engine's snapshot, and the
/// budgets' use the store counted; returns whether the usage rows move anything pushed (a key
/// with a usage limit, whose block follows them, or a budget policy).
pub fn push_keys(engine: &Engine, keys: &KeyAdmin) -> Result<bool, KeyStoreError> {
    let records = keys.snapshot_keys()?;
    let limited = records.iter().any(crate::keys::quotas::has_usage_limit);
    engine.set_virtual_keys(records);
    Ok(absorb_budget_use(engine, keys)? || limited)
}

/// [`push_keys`] when the store's keys have not changed since the last push (its generation
/// has not moved): the engine's own records take the blocks the month's usage puts on them
/// now, from one grouped read of the usage rows, without listing and decoding every stored
/// key again. Same answer as [`push_keys`].
pub fn recheck_quotas(engine: &Engine, keys: &KeyAdmin) -> Result<bool, KeyStoreError> {
    let now = keys.now_ms();
    let limited = engine.has_usage_limited_keys();
    let usage = if limited {
        Some(crate::keys::quotas::month_usage(
            keys.store().as_ref(),
            now,
        )?)
    } else {
        None
    };
    engine.recheck_quota_blocks(usage.as_ref(), now);
    Ok(absorb_budget_use(engine, keys)? || limited)
}

/// Gives the engine the budgets' use the key store counted; returns whether the pool has a
/// budget policy (usage rows then move what is pushed).
fn absorb_budget_use(engine: &Engine, keys: &KeyAdmin) -> Result<bool, KeyStoreError> {
    let budgets = !engine.config().budgets.is_empty();
    if budgets {
        engine.absorb_budget_use(&keys.store().budget_use(keys.now_ms())?);
    }
    Ok(budgets)
}

impl AdminApi {
    /// Also starts the quota ledger: it observes the engine's reports from now on, and its
    /// estimates are pushed with the engine's headroom.
    pub fn new(keys: Arc<KeyAdmin>, token: Option<Secret>, engine: Arc<Engine>) -> Self {
        let ledger = Arc::new(Ledger::new(&engine.config(), Arc::new(SystemClock)));
        engine.add_report_observer(ledger.clone());
        engine.set_headroom_source(ledger.clone());
        let console = crate::api::pulse::Pulse::attach(&engine, Arc::new(SystemClock));
        Self {
            keys,
            token,
            engine,
            ledger,
            console,
        }
    }

    /// What the console's figures come from ([`crate::api::pulse`]).
    pub fn console(&self) -> &crate::api::pulse::Pulse {
        &self.console
    }

    /// The quota ledger (`GET /admin/ledger`).
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// `GET /admin/ledger` (and gRPC `Ledger`): each provider's windows against the state now.
    pub fn ledger_view(&self) -> Value {
        let snapshot = self
            .engine
            .current_without_keys()
            .snapshot
            .unwrap_or_default();
        self.ledger.view(&snapshot, &self.engine.listings())
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Who an `Authorization` value is: the bootstrap token (compared in constant time), or a
    /// stored scoped token (`ara-...`, hashed and compared with every stored hash in constant
    /// time; its last use written at most once a minute). Unknown, revoked and expired tokens
    /// are all 401 `invalid_api_key`; with no bootstrap token and no stored one matching, 403
    /// `admin_disabled`.
    pub async fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Caller, ApiError> {
        let Some(value) = authorization else {
            if self.token.is_none() {
                return Err(disabled());
            }
            return Err(ApiError::new(
                ErrorCode::MissingApiKey,
                "the admin API needs Authorization: Bearer <admin token>",
            ));
        };
        let token = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
            .unwrap_or(b"")
            .trim_ascii();
        if let Some(expected) = &self.token {
            if constant_time_eq(token, expected.expose().as_bytes()) {
                return Ok(Caller::bootstrap());
            }
        }
        let wrong = || match self.token {
            Some(_) => ApiError::new(ErrorCode::InvalidApiKey, "wrong admin token"),
            None => disabled(),
        };
        // Only what looks like a scoped token costs a store read.
        let Some(presented) = std::str::from_utf8(token)
            .ok()
            .filter(|t| t.starts_with(admin_tokens::PREFIX))
            .map(str::to_owned)
        else {
            return Err(wrong());
        };
        let keys = self.keys.clone();
        let found = tokio::task::spawn_blocking(move || {
            let now = keys.now_ms();
            let stored = keys.store().admin_tokens()?;
            let Ok(mut token) = admin_tokens::find(&stored, &presented, now) else {
                return Ok(None);
            };
            if token.use_is_news(now) {
                token.last_used_ms = Some(now);
                if let Err(err) = keys.store().update_admin_token(&token) {
                    tracing::warn!(%err, label = %token.label, "cannot write an admin token's last use");
                }
            }
            Ok::<_, KeyStoreError>(Some(token))
        })
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("admin task failed: {e}")))??;
        let token = found.ok_or_else(wrong)?;
        Ok(Caller {
            label: token.label,
            scope: token.scope,
            expires_at_ms: token.expires_at_ms,
        })
    }

    /// [`AdminApi::authenticate`], then whether the caller's scope covers `need` (else 403
    /// `insufficient_scope`, naming the scope needed).
    pub async fn authorize(
        &self,
        authorization: Option<&[u8]>,
        need: Scope,
    ) -> Result<Caller, ApiError> {
        let caller = self.authenticate(authorization).await?;
        if caller.scope.covers(need) {
            Ok(caller)
        } else {
            Err(ApiError::new(
                ErrorCode::InsufficientScope,
                crate::api::scopes::lacking(need, caller.scope),
            ))
        }
    }

    /// An operator's action: one event (`admin`) and one log line, naming the token's label.
    pub fn audit(&self, caller: &Caller, action: &'static str, target: Option<&str>) {
        self.engine
            .events()
            .emit(crate::engine::events::Event::Admin {
                at_ms: self.keys.now_ms(),
                action,
                by: caller.label.clone(),
                scope: caller.scope.text(),
                target: target.map(str::to_owned),
            });
    }

    /// `GET /admin/tokens`.
    pub async fn list_tokens(&self) -> Result<Vec<TokenInfo>, ApiError> {
        self.run(false, |k| {
            admin_tokens::list(k.store().as_ref(), k.now_ms())
        })
        .await
    }

    /// `POST /admin/tokens`.
    pub async fn create_token(
        &self,
        caller: &Caller,
        spec: TokenSpec,
    ) -> Result<TokenWithSecret, ApiError> {
        let created = self
            .run(false, move |k| {
                admin_tokens::create(k.store().as_ref(), spec, k.now_ms())
            })
            .await?;
        self.audit(caller, "token-created", Some(&created.token.id));
        Ok(created)
    }

    /// `DELETE /admin/tokens/{label or id}`.
    pub async fn revoke_token(
        &self,
        caller: &Caller,
        token: String,
    ) -> Result<TokenInfo, ApiError> {
        let revoked = self
            .run(false, move |k| {
                admin_tokens::revoke(k.store().as_ref(), &token, k.now_ms())
            })
            .await?;
        self.audit(caller, "token-revoked", Some(&revoked.id));
        Ok(revoked)
    }

    /// Runs a key operation off the executor; a write is pushed to the snapshot before this
    /// returns.
    async fn run<T: Send + 'static>(
        &self,
        write: bool,
        op: impl FnOnce(&KeyAdmin) -> Result<T, KeyStoreError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let keys = self.keys.clone();
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || {
            let out = op(&keys)?;
            if write {
                push_keys(&engine, &keys)?;
            }
            Ok(out)
        })
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("admin task failed: {e}")))?
    }

    pub async fn create(&self, caller: &Caller, spec: KeySpec) -> Result<KeyWithSecret, ApiError> {
        let created = self.run(true, move |k| k.create(spec)).await?;
        self.audit(caller, "key-created", Some(&created.key.id));
        Ok(created)
    }

    pub async fn list(&self) -> Result<Vec<KeyInfo>, ApiError> {
        self.run(false, |k| k.list()).await
    }

    pub async fn get(&self, id: String) -> Result<KeyInfo, ApiError> {
        self.run(false, move |k| k.get(&id)).await
    }

    pub async fn update(
        &self,
        caller: &Caller,
        id: String,
        patch: KeyPatch,
    ) -> Result<KeyInfo, ApiError> {
        let key = self.run(true, move |k| k.update(&id, patch)).await?;
        self.audit(caller, "key-updated", Some(&key.id));
        Ok(key)
    }

    pub async fn revoke(&self, caller: &Caller, id: String) -> Result<KeyInfo, ApiError> {
        let key = self.run(true, move |k| k.revoke(&id)).await?;
        self.audit(caller, "key-revoked", Some(&key.id));
        Ok(key)
    }

    pub async fn rotate(&self, caller: &Caller, id: String) -> Result<KeyWithSecret, ApiError> {
        let rotated = self.run(true, move |k| k.rotate(&id)).await?;
        self.audit(caller, "key-rotated", Some(&rotated.key.id));
        Ok(rotated)
    }

    pub async fn usage(
        &self,
        id: String,
        from: Option<String>,
        to: Option<String>,
    ) -> Result<UsageReport, ApiError> {
        self.run(false, move |k| k.usage(&id, from.as_deref(), to.as_deref()))
            .await
    }

    /// Every key's usage per day, provider and model, from the key store (the console's
    /// `GET /admin/console/usage`): `(from, to, rows)`.
    pub async fn lane_usage(
        &self,
        from: Option<String>,
        to: Option<String>,
    ) -> Result<(String, String, Vec<UsageDay>), ApiError> {
        self.run(false, move |k| k.lane_usage(from.as_deref(), to.as_deref()))
            .await
    }

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

    /// The pool as callers see it: profiles (their model, fallbacks and candidates after the
    /// defaults) and models (ids, aliases, which providers serve them, capabilities, cost,
    /// whether configured or discovered and which key aliases reach them), and each
    /// discovering key's listing. No secret.
    pub fn catalog(&self) -> Value {
        let tables = self.engine.tables();
        let config = self.engine.config();
        let settings = &tables.settings;
        let defaults = settings.defaults.clone().unwrap_or_default();
        let policy = |p: &pb::Policy| {
            let list = |name: pb::PolicyList, own: &[String], inherited: &[String]| {
                if p.set_lists().any(|s| s == name) {
                    own.to_vec()
                } else {
                    inherited.to_vec()
                }
            };
            json!({
                "model": p.model.clone().or_else(|| defaults.model.clone()),
                "fallbacks": list(pb::PolicyList::Fallbacks, &p.fallbacks, &defaults.fallbacks),
                "providers": list(pb::PolicyList::Providers, &p.providers, &defaults.providers),
                "require": list(
                    pb::PolicyList::Require,
                    &capabilities(p.require()),
                    &capabilities(defaults.require()),
                ),
                "candidates": p.candidates.iter().map(|t| t.candidates.iter().map(|c| json!({
                    "model": c.model,
                    "provider": (!c.provider.is_empty()).then_some(&c.provider),
                    "weight": c.weight,
                    "when": c.when().map(|w| w.text()).collect::<Vec<_>>(),
                })).collect::<Vec<_>>()).collect::<Vec<_>>(),
                "autoSort": p.auto_sort.or(defaults.auto_sort).unwrap_or(false),
                "resetIntervalMs": p.reset_interval_ms.or(defaults.reset_interval_ms),
                // The response cache for the policy's calls (with the pool's `cache`).
                "cache": config.cache.is_some() && p.cache.or(defaults.cache).unwrap_or(true),
                "allowFallback": p.allow_fallback.or(defaults.allow_fallback).unwrap_or(true),
                "maxAttempts": p.max_attempts.or(defaults.max_attempts),
                "timeoutMs": p.timeout_ms.or(defaults.timeout_ms),
                "deadlineMs": p.deadline_ms.or(defaults.deadline_ms),
            })
        };
        let profiles: Vec<Value> = settings
            .profiles
            .iter()
            .map(|(name, p)| {
                let mut v = policy(p);
                v["name"] = json!(name);
                v
            })
            .collect();
        let mut models: std::collections::BTreeMap<&str, (Vec<&str>, Vec<Value>)> =
            std::collections::BTreeMap::new();
        for p in &tables.providers {
            for m in &p.models {
                let entry = models.entry(m.id.as_str()).or_default();
                for a in &m.aliases {
                    if !entry.0.contains(&a.as_str()) {
                        entry.0.push(a);
                    }
                }
                // Where the price came from: the pool's own `cost`, the price table
                // (`autoPrice`), or nowhere ("unpriced").
                let priced = if m.discovered {
                    // Only the price table prices a discovered model (`autoPrice`).
                    let source = match m.cost {
                        Some(_) => crate::config::prices::PriceSource::Table,
                        None => crate::config::prices::PriceSource::Unpriced,
                    };
                    source.as_str()
                } else {
                    config
                        .providers
                        .iter()
                        .find(|cp| cp.id == p.id)
                        .and_then(|cp| cp.price_sources.get(&m.id))
                        .map_or("unpriced", |s| s.as_str())
                };
                entry.1.push(json!({
                    "provider": p.id,
                    // In the configuration, or found in a key's catalog (`discover: true`).
                    "source": if m.discovered { "discovered" } else { "configured" },
                    // The key aliases that reach it (a discovering provider's listed keys
                    // reach only what their catalog lists).
                    "keys": p.keys.iter().filter(|k| k.reaches(m)).map(|k| &k.alias).collect::<Vec<_>>(),
                    "priced": priced,
                    "kind": p.kind().text(),
                    "contextWindow": (m.context_window > 0).then_some(m.context_window),
                    "capabilities": capabilities(m.capabilities()),
                    "cost": m.cost.map(|c| json!({ "input": c.input, "output": c.output })),
                    "dimensions": (m.dimensions > 0).then_some(m.dimensions),
                    "weight": m.weight,
                }));
            }
        }
        let models: Vec<Value> = models
            .into_iter()
            .map(|(id, (aliases, served))| {
                let configured = served.iter().any(|s| s["source"] == "configured");
                json!({
                    "id": id,
                    "aliases": aliases,
                    "source": if configured { "configured" } else { "discovered" },
                    "servedBy": served,
                })
            })
            .collect();
        let discovery: Vec<Value> = self
            .engine
            .listings()
            .into_iter()
            .map(|((provider, key), l)| {
                json!({
                    "provider": provider,
                    "key": key,
                    "listed": l.models.is_some(),
                    "models": l.models.as_ref().map_or(0, Vec::len),
                    "listedAtMs": (l.listed_at_ms > 0).then_some(l.listed_at_ms),
                    "nextListingAtMs": l.due_ms,
                    "error": l.error,
                })
            })
            .collect();
        // The rules in the order they are tried: highest priority first.
        let mut routes: Vec<&pb::RouteRule> = settings.routes.iter().collect();
        routes.sort_by_key(|r| std::cmp::Reverse(r.priority));
        let routes: Vec<Value> = routes
            .iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "priority": r.priority,
                    "enabled": r.enabled,
                    "match": {
                        "taskType": r.task_type,
                        "userTier": r.user_tier,
                        "feature": r.feature,
                    },
                    "target": { "profile": r.profile },
                })
            })
            .collect();
        json!({
            "defaults": policy(&defaults),
            "profiles": profiles,
            "models": models,
            "routes": routes,
            "autoPrice": config.auto_price,
            "discovery": discovery,
            "cache": config.cache.map(|c| json!({
                "ttlMs": c.ttl_ms, "maxEntries": c.max_entries, "maxBytes": c.max_bytes,
            })),
        })
    }
}

/// Polls the key store's change counter and pushes its keys into the snapshot when another
/// process changed them, until `shutdown` flips. Also recomputes the quota blocks when
/// `usage_written` fires (the usage of the call that crossed a limit is then in the store),
/// when the UTC day changes (blocks end) and every few seconds: on the engine's records
/// ([`recheck_quotas`]) while the counter has not moved, so a recheck costs one usage read,
/// not a listing of every stored key.
pub async fn run_key_sync(
    engine: Arc<Engine>,
    keys: Arc<KeyAdmin>,
    usage_written: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(KEY_SYNC_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<u64> = None;
    let mut day = String::new();
    let mut ticks = 0u32;
    let mut failing = false;
    // Whether a key has a usage limit (unknown until the first push: assume one).
    let mut limited = true;
    let mut rechecked: Option<tokio::time::Instant> = None;
    loop {
        let written = tokio::select! {
            _ = tick.tick() => false,
            _ = usage_written.notified() => true,
            _ = shutdown.wait_for(|stopped| *stopped) => break,
        };
        if written {
            // Usage rows move no block when no key has a usage limit; and under load rows
            // are written many times a second: one recheck per gap is enough.
            if !limited {
                continue;
            }
            let wait = rechecked.map_or(Duration::ZERO, |at| {
                QUOTA_RECHECK_MIN_GAP.saturating_sub(at.elapsed())
            });
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.wait_for(|stopped| *stopped) => break,
                }
            }
        }
        ticks += 1;
        let today = utc_day(keys.now_ms());
        let recheck = written || today != day || ticks >= QUOTA_RECHECK_TICKS;
        if recheck {
            ticks = 0;
        }
        let engine = engine.clone();
        let keys = keys.clone();
        let last = seen;
        if recheck {
            rechecked = Some(tokio::time::Instant::now());
        }
        let result = tokio::task::spawn_blocking(move || {
            let generation = keys.store().generation()?;
            let pushed = if last != Some(generation) {
                Some(push_keys(&engine, &keys)?)
            } else if recheck {
                Some(recheck_quotas(&engine, &keys)?)
            } else {
                // What other control planes on the store counted for the budgets, each tick
                // (one small read): a budget spent through one control plane is enforced
                // through every other within a tick or two, not at its next quota recheck.
                absorb_budget_use(&engine, &keys)?;
                None
            };
            Ok::<_, KeyStoreError>((generation, pushed))
        })
        .await;
        match result {
            Ok(Ok((generation, pushed))) => {
                seen = Some(generation);
                if let Some(any) = pushed {
                    limited = any;
                }
                day = today;
                if failing {
                    tracing::info!("the key store is readable again");
                    failing = false;
                }
            }
            Ok(Err(err)) if !failing => {
                tracing::error!(%err, "cannot read the key store");
                failing = true;
            }
            Ok(Err(_)) => {}
            Err(err) => tracing::error!(%err, "the key sync task failed"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

/// The admin routes and `/health`, on the shared state.
pub fn routes() -> Router<Arc<AdminApi>> {
    admin_routes().route("/health", get(health))
}

/// The `/admin/...` routes alone: what the gateway's listener forwards (through Envoy, to the
/// gRPC port: [`crate::api::sync::serve_with_admin`]).
pub fn admin_routes() -> Router<Arc<AdminApi>> {
    Router::new()
        .route("/admin/keys", get(list_keys).post(create_key))
        .route("/admin/keys/{id}", get(get_key).patch(update_key))
        .route("/admin/keys/{id}/revoke", post(revoke_key))
        .route("/admin/keys/{id}/rotate", post(rotate_key))
        .route("/admin/keys/{id}/usage", get(key_usage))
        .route("/admin/reset", post(reset))
        .route("/admin/events", get(events))
        .route("/admin/health", get(admin_health))
        .route("/admin/stats", get(stats))
        .route("/admin/catalog", get(catalog))
        .route("/admin/ledger", get(ledger))
        .route("/admin/whoami", get(whoami))
        .route("/admin/tokens", get(list_tokens).post(create_token))
        .route("/admin/tokens/{id}", delete(revoke_token))
}

type Answer = Result<(StatusCode, Json<Value>), ApiError>;

/// Who may call what, before routing and before a body is read: every `/admin/` request but
/// the console's assets is authenticated and its scope checked against the route's row in
/// [`crate::api::scopes`] (a path with no row needs `admin`); the caller goes to the handler
/// as an extension (a handler reached without it answers 500, never unguarded). The body limit
/// and the header timeout are the server's and apply first.
pub async fn guard(
    State(api): State<Arc<AdminApi>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> HttpResponse {
    let path = request.uri().path();
    if path.starts_with("/admin/") && !crate::api::scopes::is_asset(path) {
        let need = crate::api::scopes::for_http(request.method(), path).unwrap_or(Scope::Admin);
        let authorization = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match api.authorize(authorization, need).await {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
            }
            Err(refused) => return refused.into_response(),
        }
    }
    next.run(request).await
}

/// The admin routes behind [`guard`] on `api`.
pub fn guarded(router: Router<Arc<AdminApi>>, api: Arc<AdminApi>) -> Router {
    router
        .layer(axum::middleware::from_fn_with_state(api.clone(), guard))
        .with_state(api)
}

fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("invalid body: {e}")))
}

fn ok(status: StatusCode, value: impl serde::Serialize) -> Answer {
    let value = serde_json::to_value(value)
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
    Ok((status, Json(value)))
}

/// `GET /health`: the plain answer, or the pool's with the admin token.
async fn health(State(api): State<Arc<AdminApi>>, headers: HeaderMap) -> Json<Value> {
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let admin = authorization.is_some()
        && api
            .authorize(authorization, crate::api::scopes::for_grpc("Health"))
            .await
            .is_ok();
    if admin {
        Json(api.pool_health())
    } else {
        let health = api.engine.health();
        Json(json!({ "status": health.status, "version": health.version }))
    }
}

/// What `POST /admin/reset` takes: nothing (every provider), a provider, or a provider's key.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetSpec {
    provider: Option<String>,
    key: Option<String>,
}

impl AdminApi {
    /// Closes breakers, lifts blacklists and cooldowns, clears headroom (see [`Engine::reset`]).
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
struct EventsQuery {
    types: Option<String>,
}

async fn events(
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
async fn admin_health(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.pool_health())
}

/// `GET /admin/stats`: this process's counters since start.
async fn stats(State(api): State<Arc<AdminApi>>, Extension(_caller): Extension<Caller>) -> Answer {
    ok(StatusCode::OK, api.engine.stats())
}

/// `GET /admin/catalog`: the pool's profiles and models, with no key.
async fn catalog(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.catalog())
}

/// `GET /admin/ledger`: what each provider budget has left, per window, with sources.
async fn ledger(State(api): State<Arc<AdminApi>>, Extension(_caller): Extension<Caller>) -> Answer {
    ok(StatusCode::OK, api.ledger_view())
}

/// `POST /admin/reset` with `{}`, `{"provider": P}` or `{"provider": P, "key": K}`.
async fn reset(
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

async fn create_key(
    State(api): State<Arc<AdminApi>>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Answer {
    let spec: KeySpec = body(&bytes)?;
    let created = api.create(&caller, spec).await?;
    tracing::info!(id = %created.key.id, label = %created.key.label, "virtual key created");
    ok(StatusCode::CREATED, created)
}

async fn list_keys(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    let keys = api.list().await?;
    ok(StatusCode::OK, json!({ "object": "list", "keys": keys }))
}

async fn get_key(
    State(api): State<Arc<AdminApi>>,
    Path(id): Path<String>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.get(id).await?)
}

async fn update_key(
    State(api): State<Arc<AdminApi>>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Answer {
    let patch: KeyPatch = body(&bytes)?;
    let key = api.update(&caller, id, patch).await?;
    tracing::info!(id = %key.id, enabled = key.enabled, "virtual key updated");
    ok(StatusCode::OK, key)
}

async fn revoke_key(
    State(api): State<Arc<AdminApi>>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
) -> Answer {
    let key = api.revoke(&caller, id).await?;
    tracing::info!(id = %key.id, "virtual key revoked");
    ok(StatusCode::OK, key)
}

async fn rotate_key(
    State(api): State<Arc<AdminApi>>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
) -> Answer {
    let rotated = api.rotate(&caller, id).await?;
    tracing::info!(id = %rotated.key.id, "virtual key rotated");
    ok(StatusCode::OK, rotated)
}

async fn key_usage(
    State(api): State<Arc<AdminApi>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    let mut from = None;
    let mut to = None;
    for pair in query.as_deref().unwrap_or("").split('&') {
        match pair.split_once('=') {
            Some(("from", value)) => from = Some(value.to_owned()),
            Some(("to", value)) => to = Some(value.to_owned()),
            _ => {}
        }
    }
    ok(StatusCode::OK, api.usage(id, from, to).await?)
}

/// `GET /admin/whoami`: the calling token's label, scope and expiry (`null`: no end).
async fn whoami(Extension(caller): Extension<Caller>) -> Answer {
    ok(StatusCode::OK, caller.whoami())
}

/// `GET /admin/tokens`: `{ tokens: [...] }`, never a token.
async fn list_tokens(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    let tokens = api.list_tokens().await?;
    ok(
        StatusCode::OK,
        json!({ "object": "list", "tokens": tokens }),
    )
}

/// `POST /admin/tokens` with `{ label, scope, expires }`: 201 `{ token, secret }`.
async fn create_token(
    State(api): State<Arc<AdminApi>>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Answer {
    let spec: TokenSpec = body(&bytes)?;
    ok(StatusCode::CREATED, api.create_token(&caller, spec).await?)
}

/// `DELETE /admin/tokens/{label or id}`.
async fn revoke_token(
    State(api): State<Arc<AdminApi>>,
    Path(token): Path<String>,
    Extension(caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.revoke_token(&caller, token).await?)
}

// ---------------------------------------------------------------------------------------------
// gRPC
// ---------------------------------------------------------------------------------------------

/// `airouter.v1.Admin` over the same [`AdminApi`].
#[derive(Debug, Clone)]
pub struct AdminGrpc {
    api: Arc<AdminApi>,
}

impl AdminGrpc {
    pub fn new(api: Arc<AdminApi>) -> Self {
        Self { api }
    }

    pub fn into_server(self) -> pb::admin_server::AdminServer<Self> {
        pb::admin_server::AdminServer::new(self)
    }

    /// The caller of gRPC `method`, if its scope covers the method's row in
    /// [`crate::api::scopes`].
    async fn authorize<T>(&self, request: &Request<T>, method: &str) -> Result<Caller, Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes());
        self.api
            .authorize(authorization, crate::api::scopes::for_grpc(method))
            .await
            .map_err(Status::from)
    }
}

fn scope_to_proto(scope: Scope) -> pb::AdminScope {
    match scope {
        Scope::Read => pb::AdminScope::Read,
        Scope::Operate => pb::AdminScope::Operate,
        Scope::Keys => pb::AdminScope::Keys,
        Scope::Admin => pb::AdminScope::Admin,
    }
}

fn token_to_proto(t: TokenInfo) -> pb::AdminTokenInfo {
    pb::AdminTokenInfo {
        id: t.id,
        label: t.label,
        scope: scope_to_proto(t.scope).into(),
        created_at_ms: t.created_at_ms,
        expires_at_ms: t.expires_at_ms,
        last_used_at_ms: t.last_used_at_ms,
        revoked: t.revoked,
        expired: t.expired,
    }
}

fn quota_to_proto(q: &crate::config::QuotaConfig) -> pb::Quota {
    pb::Quota {
        requests_per_minute: q.requests_per_minute,
        tokens_per_day: q.tokens_per_day,
        cost_per_day: q.cost_per_day,
        cost_per_month: q.cost_per_month,
    }
}

fn quota_from_proto(q: &pb::Quota) -> crate::config::QuotaConfig {
    crate::config::QuotaConfig {
        requests_per_minute: q.requests_per_minute,
        tokens_per_day: q.tokens_per_day,
        cost_per_day: q.cost_per_day,
        cost_per_month: q.cost_per_month,
    }
}

fn key_to_proto(k: KeyInfo) -> pb::KeyInfo {
    pb::KeyInfo {
        id: k.id,
        label: k.label,
        owner: k.owner.unwrap_or_default(),
        profiles: k.profiles,
        models: k.models,
        allow_fallback: k.allow_fallback,
        quota: Some(quota_to_proto(&k.quota)),
        enabled: k.enabled,
        revoked: k.revoked,
        mounted: k.mounted,
        hint: k.hint,
        created_at_ms: k.created_at_ms,
        cache: k.cache,
    }
}

fn day_to_proto(d: UsageDay) -> pb::UsageDay {
    pb::UsageDay {
        day: d.day,
        requests: d.requests,
        successes: d.successes,
        failures: d.failures,
        prompt_tokens: d.prompt_tokens,
        completion_tokens: d.completion_tokens,
        cost: d.cost,
        latency_ms: d.latency_ms,
        outcomes: d.outcomes.into_iter().collect(),
        saved: d.saved,
    }
}

fn with_secret(k: KeyWithSecret) -> pb::KeyWithSecret {
    pb::KeyWithSecret {
        key: Some(key_to_proto(k.key)),
        secret: k.secret,
    }
}

/// Capabilities as the catalog shows them ("chat", ...).
fn capabilities(list: impl Iterator<Item = pb::Capability>) -> Vec<String> {
    list.map(|c| c.text().to_owned()).collect()
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminGrpc {
    async fn health(
        &self,
        request: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthReply>, Status> {
        let _caller = self.authorize(&request, "Health").await?;
        let health = self.api.engine.health();
        Ok(Response::new(pb::HealthReply {
            status: health.status.to_owned(),
            state_version: health.version,
        }))
    }

    async fn create_key(
        &self,
        request: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::KeyWithSecret>, Status> {
        let caller = self.authorize(&request, "CreateKey").await?;
        let r = request.into_inner();
        let spec = KeySpec {
            label: r.label,
            owner: non_empty(r.owner),
            profiles: r.profiles,
            models: r.models,
            allow_fallback: r.allow_fallback,
            quota: r.quota.as_ref().map(quota_from_proto),
            enabled: r.enabled,
            cache: r.cache,
        };
        let created = self.api.create(&caller, spec).await?;
        tracing::info!(id = %created.key.id, "virtual key created");
        Ok(Response::new(with_secret(created)))
    }

    async fn list_keys(
        &self,
        request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysReply>, Status> {
        let _caller = self.authorize(&request, "ListKeys").await?;
        let keys = self.api.list().await?;
        Ok(Response::new(pb::ListKeysReply {
            keys: keys.into_iter().map(key_to_proto).collect(),
        }))
    }

    async fn get_key(&self, request: Request<pb::KeyRef>) -> Result<Response<pb::KeyInfo>, Status> {
        let _caller = self.authorize(&request, "GetKey").await?;
        let key = self.api.get(request.into_inner().id).await?;
        Ok(Response::new(key_to_proto(key)))
    }

    async fn update_key(
        &self,
        request: Request<pb::UpdateKeyRequest>,
    ) -> Result<Response<pb::KeyInfo>, Status> {
        let caller = self.authorize(&request, "UpdateKey").await?;
        let r = request.into_inner();
        let cache = match (r.clear_cache, r.cache) {
            (true, Some(_)) => {
                return Err(Status::invalid_argument(
                    "set cache or clear_cache, not both",
                ))
            }
            (true, None) => Some(None),
            (false, set) => set.map(Some),
        };
        let patch = KeyPatch {
            owner: r.owner,
            profiles: r.set_profiles.then_some(r.profiles),
            models: r.set_models.then_some(r.models),
            allow_fallback: r.allow_fallback,
            // Merged limit by limit; proto3 optionals cannot say "clear", so gRPC sets and keeps
            // limits and HTTP `null` (or the CLI) removes one.
            quota: r
                .quota
                .as_ref()
                .map(|q| Some(QuotaPatch::setting(&quota_from_proto(q)))),
            enabled: r.enabled,
            cache,
        };
        let key = self.api.update(&caller, r.id, patch).await?;
        tracing::info!(id = %key.id, enabled = key.enabled, "virtual key updated");
        Ok(Response::new(key_to_proto(key)))
    }

    type EventsStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::AdminEvent, Status>> + Send + 'static>,
    >;

    async fn events(
        &self,
        request: Request<pb::EventsRequest>,
    ) -> Result<Response<Self::EventsStream>, Status> {
        let _caller = self.authorize(&request, "Events").await?;
        let r = request.into_inner();
        let mut names = r.types;
        for t in r.event_types {
            match pb::AdminEventType::try_from(t)
                .ok()
                .filter(|t| pb::AdminEventType::ASKABLE.contains(t))
            {
                Some(t) => names.push(t.text().to_owned()),
                None => {
                    return Err(Status::from(ApiError::new(
                        ErrorCode::InvalidRequest,
                        format!("event_types: {t} is no event type a subscriber may ask for"),
                    )))
                }
            }
        }
        let types = parse_types(Some(&names.join(",")))
            .map_err(|m| Status::from(ApiError::new(ErrorCode::InvalidRequest, m)))?;
        let subscription = self.api.engine().events().watch(types);
        let stream = futures::stream::unfold(subscription, |mut sub| async move {
            let item = match sub.next().await? {
                Next::Event(e) => pb::AdminEvent {
                    r#type: e.type_name().to_owned(),
                    json: e.to_json(),
                    missed: 0,
                    event_type: pb::AdminEventType::from_text(e.type_name())
                        .unwrap_or_default()
                        .into(),
                },
                Next::Lagged(n) => pb::AdminEvent {
                    r#type: pb::AdminEventType::Lagged.text().to_owned(),
                    json: String::new(),
                    missed: n,
                    event_type: pb::AdminEventType::Lagged.into(),
                },
            };
            Some((Ok(item), sub))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetReply>, Status> {
        let caller = self.authorize(&request, "Reset").await?;
        let r = request.into_inner();
        let given = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let (provider, key) = (given(&r.provider), given(&r.key));
        let counts = self
            .api
            .reset(&caller, provider.as_deref(), key.as_deref())?;
        Ok(Response::new(pb::ResetReply {
            blacklists: counts.blacklists,
            cooldowns: counts.cooldowns,
            breakers: counts.breakers,
            headroom: counts.headroom,
        }))
    }

    async fn revoke_key(
        &self,
        request: Request<pb::KeyRef>,
    ) -> Result<Response<pb::KeyInfo>, Status> {
        let caller = self.authorize(&request, "RevokeKey").await?;
        let key = self.api.revoke(&caller, request.into_inner().id).await?;
        tracing::info!(id = %key.id, "virtual key revoked");
        Ok(Response::new(key_to_proto(key)))
    }

    async fn rotate_key(
        &self,
        request: Request<pb::KeyRef>,
    ) -> Result<Response<pb::KeyWithSecret>, Status> {
        let caller = self.authorize(&request, "RotateKey").await?;
        let rotated = self.api.rotate(&caller, request.into_inner().id).await?;
        tracing::info!(id = %rotated.key.id, "virtual key rotated");
        Ok(Response::new(with_secret(rotated)))
    }

    async fn key_usage(
        &self,
        request: Request<pb::KeyUsageRequest>,
    ) -> Result<Response<pb::KeyUsageReply>, Status> {
        let _caller = self.authorize(&request, "KeyUsage").await?;
        let r = request.into_inner();
        let report = self
            .api
            .usage(r.id, non_empty(r.from), non_empty(r.to))
            .await?;
        Ok(Response::new(pb::KeyUsageReply {
            id: report.id,
            days: report.days.into_iter().map(day_to_proto).collect(),
            total: Some(day_to_proto(report.total)),
            from: report.from,
            to: report.to,
        }))
    }

    async fn pool_health(
        &self,
        request: Request<pb::PageRequest>,
    ) -> Result<Response<pb::AdminPage>, Status> {
        let _caller = self.authorize(&request, "PoolHealth").await?;
        page(&self.api.pool_health())
    }

    async fn stats(
        &self,
        request: Request<pb::PageRequest>,
    ) -> Result<Response<pb::AdminPage>, Status> {
        let _caller = self.authorize(&request, "Stats").await?;
        page(&self.api.engine.stats())
    }

    async fn catalog(
        &self,
        request: Request<pb::PageRequest>,
    ) -> Result<Response<pb::AdminPage>, Status> {
        let _caller = self.authorize(&request, "Catalog").await?;
        page(&self.api.catalog())
    }

    async fn ledger(
        &self,
        request: Request<pb::PageRequest>,
    ) -> Result<Response<pb::AdminPage>, Status> {
        let _caller = self.authorize(&request, "Ledger").await?;
        page(&self.api.ledger_view())
    }

    async fn whoami(
        &self,
        request: Request<pb::WhoamiRequest>,
    ) -> Result<Response<pb::WhoamiReply>, Status> {
        let caller = self.authorize(&request, "Whoami").await?;
        Ok(Response::new(pb::WhoamiReply {
            label: caller.label,
            scope: scope_to_proto(caller.scope).into(),
            expires_at_ms: caller.expires_at_ms,
        }))
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensReply>, Status> {
        let _caller = self.authorize(&request, "ListTokens").await?;
        let tokens = self.api.list_tokens().await?;
        Ok(Response::new(pb::ListTokensReply {
            tokens: tokens.into_iter().map(token_to_proto).collect(),
        }))
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::TokenWithSecret>, Status> {
        let caller = self.authorize(&request, "CreateToken").await?;
        let r = request.into_inner();
        let scope = match pb::AdminScope::try_from(r.scope) {
            Ok(pb::AdminScope::Read) => Scope::Read,
            Ok(pb::AdminScope::Operate) => Scope::Operate,
            Ok(pb::AdminScope::Keys) => Scope::Keys,
            Ok(pb::AdminScope::Admin) => Scope::Admin,
            _ => {
                return Err(Status::from(ApiError::new(
                    ErrorCode::InvalidRequest,
                    "scope: one of read, operate, keys, admin",
                )))
            }
        };
        let spec = TokenSpec {
            label: r.label,
            scope,
            expires: non_empty(r.expires),
        };
        let created = self.api.create_token(&caller, spec).await?;
        Ok(Response::new(pb::TokenWithSecret {
            token: Some(token_to_proto(created.token)),
            secret: created.secret,
        }))
    }

    async fn revoke_token(
        &self,
        request: Request<pb::TokenRef>,
    ) -> Result<Response<pb::AdminTokenInfo>, Status> {
        let caller = self.authorize(&request, "RevokeToken").await?;
        let revoked = self
            .api
            .revoke_token(&caller, request.into_inner().token)
            .await?;
        Ok(Response::new(token_to_proto(revoked)))
    }
}

/// An admin page as the HTTP route answers it.
fn page(value: &impl serde::Serialize) -> Result<Response<pb::AdminPage>, Status> {
    let json = serde_json::to_string(value)
        .map_err(|e| Status::from(ApiError::new(ErrorCode::Internal, e.to_string())))?;
    Ok(Response::new(pb::AdminPage { json }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::config::parse;
    use crate::config::secrets::MapEnv;
    use crate::keys::record::VirtualKeyRecord;
    use crate::keys::store::MemoryKeyStore;
    use crate::store::durable::DurableState;
    use axum::body::Body;
    use axum::http::Request as HttpRequest;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    pub(crate) const TOKEN: &str = "admin-test-token";

    /// An admin API over a one-provider pool, a memory key store and a mounted key `app`.
    pub(crate) fn api(token: Option<&str>) -> Result<Arc<AdminApi>, String> {
        api_on(
            "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: K }], models: [{ id: m, aliases: [fast] }] }\nprofiles:\n  work: { model: m }\n",
            token,
        )
    }

    /// [`api`] over the pool `yaml` (its keys read `K` and `K2`).
    pub(crate) fn api_on(yaml: &str, token: Option<&str>) -> Result<Arc<AdminApi>, String> {
        let env = Arc::new(MapEnv::new([("K", "sk-upstream"), ("K2", "sk-upstream-2")]));
        let config = parse(yaml)
            .and_then(|f| f.resolve(env.as_ref(), std::path::Path::new(".")))
            .map_err(|e| e.to_string())?;
        let names = config.names.clone();
        let mounted = VirtualKeyRecord {
            id: crate::keys::mounted::mounted_id("app"),
            label: "app".into(),
            sha256: crate::config::secrets::sha256_hex("sk-starci-app-mounted"),
            hint: "nted".into(),
            profiles: vec!["*".into()],
            models: vec!["*".into()],
            owner: None,
            allow_fallback: true,
            enabled: true,
            quota: None,
            mounted: true,
            quota_block: None,
            cache: None,
        };
        let engine = Engine::new(
            Arc::new(config),
            env,
            Arc::new(SystemClock),
            vec![mounted.clone()],
            DurableState::default(),
        );
        let keys = Arc::new(
            KeyAdmin::new(
                Arc::new(MemoryKeyStore::default()),
                vec![mounted],
                Arc::new(SystemClock),
            )
            .with_pool(names),
        );
        Ok(Arc::new(AdminApi::new(
            keys,
            token.map(Secret::new),
            engine,
        )))
    }

    async fn send(
        api: &Arc<AdminApi>,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), Box<dyn std::error::Error>> {
        let mut request = HttpRequest::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        let response = super::guarded(super::routes(), api.clone())
            .oneshot(request.body(body)?)
            .await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&bytes)?))
    }

    #[tokio::test]
    async fn the_admin_token_guards_every_route() -> Result<(), Box<dyn std::error::Error>> {
        let api = api(Some(TOKEN))?;
        let (status, body) = send(&api, "GET", "/admin/keys", None, None).await?;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["error"]["code"], "missing_api_key");
        let (status, body) = send(&api, "GET", "/admin/keys", Some("nope"), None).await?;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["error"]["code"], "invalid_api_key");
        let (status, _) = send(&api, "GET", "/admin/keys", Some(TOKEN), None).await?;
        assert_eq!(status, StatusCode::OK);

        let off = self::api(None)?;
        let (status, body) = send(&off, "GET", "/admin/keys", Some(TOKEN), None).await?;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(body["error"]["code"], "admin_disabled");

        // /health: the pool with the token only, aliases and never a secret.
        let (_, plain) = send(&api, "GET", "/health", None, None).await?;
        assert!(plain.get("providers").is_none(), "{plain}");
        let (_, full) = send(&api, "GET", "/health", Some(TOKEN), None).await?;
        assert_eq!(full["providers"][0]["keys"][0]["alias"], "a", "{full}");
        assert!(!full.to_string().contains("sk-upstream"), "{full}");
        Ok(())
    }

    #[tokio::test]
    async fn create_read_change_and_refuse() -> Result<(), Box<dyn std::error::Error>> {
        let api = api(Some(TOKEN))?;
        let t = Some(TOKEN);
        let (status, created) = send(
            &api,
            "POST",
            "/admin/keys",
            t,
            Some(json!({ "label": "app_two", "profiles": ["work"], "quota": { "requestsPerMinute": 5 } })),
        )
        .await?;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let id = created["key"]["id"].as_str().unwrap_or_default().to_owned();
        let secret = created["secret"].as_str().unwrap_or_default().to_owned();
        assert!(secret.starts_with("sk-starci-app_two-"));
        assert_eq!(created["key"]["quota"]["requestsPerMinute"], 5);
        // Pushed before the answer.
        let hash = crate::config::secrets::sha256_hex(&secret);
        let snapshot = api.engine.current().snapshot.clone().unwrap_or_default();
        assert!(snapshot.virtual_keys.iter().any(|k| k.sha256 == hash));

        let (status, listed) = send(&api, "GET", "/admin/keys", t, None).await?;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(listed["keys"][0]["mounted"], true);
        assert_eq!(listed["keys"][1]["id"], id.as_str());
        assert!(!listed.to_string().contains(&secret) && !listed.to_string().contains(&hash));

        let (status, patched) = send(
            &api,
            "PATCH",
            &format!("/admin/keys/{id}"),
            t,
            Some(json!({ "enabled": false })),
        )
        .await?;
        assert_eq!(status, StatusCode::OK, "{patched}");
        let snapshot = api.engine.current().snapshot.clone().unwrap_or_default();
        assert!(snapshot
            .virtual_keys
            .iter()
            .any(|k| k.sha256 == hash && !k.enabled));
        let (status, body) = send(
            &api,
            "PATCH",
            &format!("/admin/keys/{id}"),
            t,
            Some(json!({ "bogus": 1 })),
        )
        .await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

        let mounted = crate::keys::mounted::mounted_id("app");
        for (method, uri) in [
            ("POST", format!("/admin/keys/{mounted}/revoke")),
            ("POST", format!("/admin/keys/{mounted}/rotate")),
            ("PATCH", format!("/admin/keys/{mounted}")),
        ] {
            let (status, body) = send(&api, method, &uri, t, Some(json!({}))).await?;
            assert_eq!(status, StatusCode::CONFLICT, "{uri}");
            assert_eq!(body["error"]["code"], "key_mounted", "{uri}");
        }
        let (status, body) = send(&api, "GET", "/admin/keys/key_nope", t, None).await?;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["code"], "not_found");

        let (status, rotated) =
            send(&api, "POST", &format!("/admin/keys/{id}/rotate"), t, None).await?;
        assert_eq!(status, StatusCode::OK);
        assert_ne!(rotated["secret"], secret.as_str());
        let (status, revoked) =
            send(&api, "POST", &format!("/admin/keys/{id}/revoke"), t, None).await?;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(revoked["revoked"], true);
        let snapshot = api.engine.current().snapshot.clone().unwrap_or_default();
        assert_eq!(snapshot.virtual_keys.len(), 1);
        let (status, body) =
            send(&api, "POST", &format!("/admin/keys/{id}/rotate"), t, None).await?;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        Ok(())
    }

    #[tokio::test]
    async fn a_quota_patch_merges_limit_by_limit() -> Result<(), Box<dyn std::error::Error>> {
        let api = api(Some(TOKEN))?;
        let t = Some(TOKEN);
        let (status, created) = send(
            &api,
            "POST",
            "/admin/keys",
            t,
            Some(json!({ "label": "app", "models": ["*"], "quota": { "requestsPerMinute": 5, "tokensPerDay": 1000 } })),
        )
        .await?;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let uri = format!(
            "/admin/keys/{}",
            created["key"]["id"].as_str().unwrap_or_default()
        );
        let (status, key) = send(
            &api,
            "PATCH",
            &uri,
            t,
            Some(json!({ "quota": { "costPerDay": 2.5 } })),
        )
        .await?;
        assert_eq!(status, StatusCode::OK, "{key}");
        assert_eq!(
            key["quota"],
            json!({ "requestsPerMinute": 5, "tokensPerDay": 1000, "costPerDay": 2.5, "costPerMonth": null })
        );
        // The engine's copy (what Envoy enforces) keeps the per-minute limit too.
        let snapshot = api.engine.current().snapshot.clone().unwrap_or_default();
        assert!(snapshot
            .virtual_keys
            .iter()
            .any(|k| k.label == "app" && k.requests_per_minute == 5));
        // null clears one limit.
        let (status, key) = send(
            &api,
            "PATCH",
            &uri,
            t,
            Some(json!({ "quota": { "requestsPerMinute": null } })),
        )
        .await?;
        assert_eq!(status, StatusCode::OK, "{key}");
        assert_eq!(key["quota"]["requestsPerMinute"], Value::Null);
        assert_eq!(key["quota"]["tokensPerDay"], 1000);
        assert_eq!(key["quota"]["costPerDay"], 2.5);
        // A bad value in a merge is still refused, naming the field.
        let (status, body) = send(
            &api,
            "PATCH",
            &uri,
            t,
            Some(json!({ "quota": { "costPerMonth": -1 } })),
        )
        .await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("quota.costPerMonth")),
            "{body}"
        );
        // quota: null clears them all.
        let (status, key) = send(&api, "PATCH", &uri, t, Some(json!({ "quota": null }))).await?;
        assert_eq!(status, StatusCode::OK, "{key}");
        assert_eq!(
            key["quota"],
            json!({ "requestsPerMinute": null, "tokensPerDay": null, "costPerDay": null, "costPerMonth": null })
        );
        Ok(())
    }

    #[tokio::test]
    async fn bindings_must_name_the_pool() -> Result<(), Box<dyn std::error::Error>> {
        let api = api(Some(TOKEN))?;
        let t = Some(TOKEN);
        for (spec, named) in [
            (json!({ "label": "a", "profiles": ["nope"] }), "`nope`"),
            (
                json!({ "label": "a", "profiles": ["work", "*", "lessons"] }),
                "profiles[2]",
            ),
            (json!({ "label": "a", "models": ["gpt-9"] }), "`gpt-9`"),
        ] {
            let (status, body) = send(&api, "POST", "/admin/keys", t, Some(spec.clone())).await?;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{spec}: {body}");
            assert_eq!(body["error"]["code"], "invalid_request");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(named)),
                "{spec}: {body}"
            );
        }
        let (status, created) = send(
            &api,
            "POST",
            "/admin/keys",
            t,
            Some(json!({ "label": "a", "profiles": ["work", "*"], "models": ["m", "fast", "*"] })),
        )
        .await?;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let uri = format!(
            "/admin/keys/{}",
            created["key"]["id"].as_str().unwrap_or_default()
        );
        for patch in [
            json!({ "profiles": ["nope"] }),
            json!({ "models": ["gpt-9"] }),
        ] {
            let (status, body) = send(&api, "PATCH", &uri, t, Some(patch.clone())).await?;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{patch}: {body}");
        }
        let (_, key) = send(&api, "GET", &uri, t, None).await?;
        assert_eq!(key["profiles"], json!(["work", "*"]));
        Ok(())
    }

    #[tokio::test]
    async fn usage_ranges() -> Result<(), Box<dyn std::error::Error>> {
        let api = api(Some(TOKEN))?;
        let t = Some(TOKEN);
        let mounted = crate::keys::mounted::mounted_id("app");
        let row = |day: &str| UsageDay {
            day: day.into(),
            requests: 2,
            successes: 2,
            ..UsageDay::default()
        };
        api.keys.store().record_usage(&[
            (mounted.clone(), row("2026-01-31")),
            (mounted.clone(), row("2026-02-01")),
            (mounted.clone(), row("2026-02-02")),
        ])?;
        let uri = format!("/admin/keys/{mounted}/usage?from=2026-02-01&to=2026-02-28");
        let (status, body) = send(&api, "GET", &uri, t, None).await?;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["days"].as_array().map(Vec::len), Some(2));
        assert_eq!(body["total"]["requests"], 4);
        assert_eq!(body["from"], "2026-02-01");
        // Default: this month (nothing recorded in it here).
        let (status, body) = send(
            &api,
            "GET",
            &format!("/admin/keys/{mounted}/usage"),
            t,
            None,
        )
        .await?;
        assert_eq!(status, StatusCode::OK);
        assert!(body["from"].as_str().is_some_and(|d| d.ends_with("-01")));
        for bad in [
            "from=2026-02-30",
            "from=2026-03-01&to=2026-02-01",
            "to=yesterday",
        ] {
            let uri = format!("/admin/keys/{mounted}/usage?{bad}");
            let (status, body) = send(&api, "GET", &uri, t, None).await?;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        }
        let (status, _) = send(&api, "GET", "/admin/keys/key_nope/usage", t, None).await?;
        assert_eq!(status, StatusCode::NOT_FOUND);
        Ok(())
    }

    /// Every field that names a state, scope, reason, level, window or enforcement in `value`
    /// is a word, never a protobuf enum number.
    fn assert_words(value: &Value, path: &str) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let named = [
                        "state",
                        "scope",
                        "reason",
                        "level",
                        "window",
                        "enforcement",
                        "kind",
                    ];
                    if named.contains(&k.as_str()) {
                        assert!(v.is_string() || v.is_null(), "{path}.{k} = {v}");
                    }
                    assert_words(v, &format!("{path}.{k}"));
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    assert_words(v, &format!("{path}[{i}]"));
                }
            }
            _ => {}
        }
    }

    #[tokio::test]
    async fn health_speaks_words_says_null_for_no_end_and_shows_budgets(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let api = api_on(
            "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: K }, { alias: b, env: K2 }], models: [{ id: m, cost: { input: 1, output: 1 } }] }\n\
             resilience: { keyBreaker: { failureThreshold: 1, cooldownMs: 60000, maxCooldownMs: 60000 } }\n\
             budgets:\n  - { name: daily, scope: pool, window: day, limits: { maxTokens: 100 }, enforcement: hard, warnAt: 0.5 }\n",
            Some(TOKEN),
        )?;
        let lane = |key: &str, ok: bool, class: pb::ErrorClass| pb::AttemptOutcome {
            provider: "p".into(),
            key: key.into(),
            model: "m".into(),
            outcome: if ok {
                pb::AttemptResult::Success
            } else {
                pb::AttemptResult::Error
            }
            .into(),
            error_class: class.into(),
            usage: ok.then_some(pb::Usage {
                prompt_tokens: 40,
                completion_tokens: 20,
                ..Default::default()
            }),
            ..Default::default()
        };
        api.engine.apply_report(&pb::ReportBatch {
            attempts: vec![
                lane("a", true, pb::ErrorClass::Unspecified),
                lane("a", false, pb::ErrorClass::Transient),
                lane("b", false, pb::ErrorClass::Auth),
            ],
            ..Default::default()
        });
        let (status, health) = send(&api, "GET", "/admin/health", Some(TOKEN), None).await?;
        assert_eq!(status, StatusCode::OK, "{health}");
        assert_words(&health, "health");
        let breaker = &health["breakers"][0];
        assert_eq!(
            (&breaker["scope"], &breaker["state"], &breaker["key"]),
            (&json!("key"), &json!("open"), &json!("a")),
            "{health}"
        );
        assert!(breaker["openUntilMs"].as_i64() > Some(0), "{health}");
        let keys = &health["providers"][0]["keys"];
        assert_eq!(keys[0]["state"], "ok", "{health}");
        // Out until its secret changes: no end, null (as the gateway's /health says).
        assert_eq!(
            (&keys[1]["alias"], &keys[1]["state"], &keys[1]["untilMs"]),
            (&json!("b"), &json!("auth"), &Value::Null),
            "{health}"
        );
        let budget = &health["budgets"][0];
        assert_eq!(
            (
                &budget["name"],
                &budget["scope"],
                &budget["window"],
                &budget["enforcement"]
            ),
            (
                &json!("daily"),
                &json!("pool"),
                &json!("day"),
                &json!("hard")
            ),
            "{health}"
        );
        assert_eq!(budget["limits"]["maxTokens"], 100, "{health}");
        assert_eq!(budget["limits"]["maxCost"], Value::Null, "{health}");
        let spent = &budget["spent"][0];
        assert_eq!(
            (&spent["subject"], &spent["tokens"], &spent["level"]),
            (&Value::Null, &json!(60), &json!("warn")),
            "{health}"
        );
        assert!(spent["untilMs"].as_i64() > Some(0), "{health}");
        // The same pool with the token on /health, and the ledger: words and null too.
        let (_, full) = send(&api, "GET", "/health", Some(TOKEN), None).await?;
        assert_eq!(full["providers"], health["providers"]);
        let (status, ledger) = send(&api, "GET", "/admin/ledger", Some(TOKEN), None).await?;
        assert_eq!(status, StatusCode::OK, "{ledger}");
        assert_words(&ledger, "ledger");
        let b = &ledger["providers"][0]["scopes"][1]["keys"][0];
        assert_eq!(
            (&b["state"], &b["untilMs"]),
            (&json!("auth"), &Value::Null),
            "{ledger}"
        );
        for page in ["/admin/stats", "/admin/catalog", "/admin/keys"] {
            let (status, body) = send(&api, "GET", page, Some(TOKEN), None).await?;
            assert_eq!(status, StatusCode::OK, "{page}: {body}");
            assert_words(&body, page);
        }
        Ok(())
    }

    /// `message` with the admin token.
    pub(crate) fn authed<T>(message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Ok(value) = format!("Bearer {TOKEN}").parse() {
            request.metadata_mut().insert("authorization", value);
        }
        request
    }
}
