//! Who calls the admin API: the admin token from the configuration or the environment, and
//! the [`Caller`] a presented token authenticates as.

use serde_json::{json, Value};

use crate::api::error::{ApiError, ErrorCode};
use crate::config::secrets::{Env, Secret};
use crate::keys::admin_tokens::Scope;

/// The env variable holding the admin token when `gateway.adminToken` does not name one.
pub const ADMIN_TOKEN_ENV: &str = "AI_ROUTER_ADMIN_TOKEN";

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

pub(super) fn disabled() -> ApiError {
    ApiError::new(
        ErrorCode::AdminDisabled,
        "the admin API is off: no admin token is configured",
    )
}

/// What a token lacking `need` is told.
pub fn lacking(need: Scope, have: Scope) -> String {
    format!(
        "this call needs an admin token of scope {need} (or wider); this token's scope is {have}"
    )
}
