//! Virtual keys and scoped admin tokens: the operations (create, list, get, update, revoke,
//! rotate, usage; tokens: list, create, revoke) and their HTTP handlers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Extension;
use serde_json::json;

use super::auth::Caller;
use super::http::{body, ok, Answer};
use super::state::AdminApi;
use crate::api::error::ApiError;
use crate::keys::admin_tokens::{self, TokenInfo, TokenSpec, TokenWithSecret};
use crate::keys::operations::{KeyInfo, KeyPatch, KeySpec, KeyWithSecret, UsageReport};
use crate::keys::store::UsageDay;

impl AdminApi {
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

    /// Every key's usage (only `key`'s when given) per day, provider and model, from the key
    /// store (the console's `GET /admin/console/usage`): `(from, to, rows)`.
    pub async fn lane_usage(
        &self,
        from: Option<String>,
        to: Option<String>,
        key: Option<String>,
    ) -> Result<(String, String, Vec<UsageDay>), ApiError> {
        self.run(false, move |k| {
            k.lane_usage(from.as_deref(), to.as_deref(), key.as_deref())
        })
        .await
    }
}

pub(super) async fn create_key(
    State(api): State<Arc<AdminApi>>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Answer {
    let spec: KeySpec = body(&bytes)?;
    let created = api.create(&caller, spec).await?;
    tracing::info!(id = %created.key.id, label = %created.key.label, "virtual key created");
    ok(StatusCode::CREATED, created)
}

pub(super) async fn list_keys(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    let keys = api.list().await?;
    ok(StatusCode::OK, json!({ "object": "list", "keys": keys }))
}

pub(super) async fn get_key(
    State(api): State<Arc<AdminApi>>,
    Path(id): Path<String>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.get(id).await?)
}

pub(super) async fn update_key(
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

pub(super) async fn revoke_key(
    State(api): State<Arc<AdminApi>>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
) -> Answer {
    let key = api.revoke(&caller, id).await?;
    tracing::info!(id = %key.id, "virtual key revoked");
    ok(StatusCode::OK, key)
}

pub(super) async fn rotate_key(
    State(api): State<Arc<AdminApi>>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
) -> Answer {
    let rotated = api.rotate(&caller, id).await?;
    tracing::info!(id = %rotated.key.id, "virtual key rotated");
    ok(StatusCode::OK, rotated)
}

pub(super) async fn key_usage(
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
pub(super) async fn whoami(Extension(caller): Extension<Caller>) -> Answer {
    ok(StatusCode::OK, caller.whoami())
}

/// `GET /admin/tokens`: `{ tokens: [...] }`, never a token.
pub(super) async fn list_tokens(
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
pub(super) async fn create_token(
    State(api): State<Arc<AdminApi>>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> Answer {
    let spec: TokenSpec = body(&bytes)?;
    ok(StatusCode::CREATED, api.create_token(&caller, spec).await?)
}

/// `DELETE /admin/tokens/{label or id}`.
pub(super) async fn revoke_token(
    State(api): State<Arc<AdminApi>>,
    Path(token): Path<String>,
    Extension(caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.revoke_token(&caller, token).await?)
}
