//! The admin operations' state, behind both transports: the key operations, the bootstrap
//! token, the engine, the quota ledger and the console's figures; authentication, scope checks
//! and the audit of an operator's action.

use std::sync::Arc;

use serde_json::Value;

use super::auth::{disabled, Caller};
use super::key_sync::push_keys;
use crate::api::error::{ApiError, ErrorCode};
use crate::clock::SystemClock;
use crate::config::secrets::{constant_time_eq, Secret};
use crate::engine::Engine;
use crate::keys::admin_tokens::{self, Scope};
use crate::keys::operations::KeyAdmin;
use crate::keys::store::KeyStoreError;
use crate::ledger::Ledger;

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

/// The admin operations behind both transports.
pub struct AdminApi {
    pub(super) keys: Arc<KeyAdmin>,
    pub(super) token: Option<Secret>,
    pub(super) engine: Arc<Engine>,
    pub(super) ledger: Arc<Ledger>,
    pub(super) console: Arc<crate::api::pulse::Pulse>,
}

impl std::fmt::Debug for AdminApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminApi")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
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
                super::auth::lacking(need, caller.scope),
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

    /// Runs a key operation off the executor; a write is pushed to the snapshot before this
    /// returns.
    pub(super) async fn run<T: Send + 'static>(
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
}
