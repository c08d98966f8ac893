//! `airouter.v1.Admin`: the admin operations over gRPC, same tokens and scopes as HTTP.

use std::sync::Arc;

use ai_router_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::auth::Caller;
use super::routes::for_grpc;
use super::state::AdminApi;
use crate::api::error::{ApiError, ErrorCode};
use crate::engine::events::{parse_types, Next};
use crate::keys::admin_tokens::{Scope, TokenInfo, TokenSpec};
use crate::keys::operations::{KeyInfo, KeyPatch, KeySpec, KeyWithSecret, QuotaPatch};
use crate::keys::store::UsageDay;

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
    /// [`super::routes::ROUTES`].
    async fn authorize<T>(&self, request: &Request<T>, method: &str) -> Result<Caller, Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes());
        self.api
            .authorize(authorization, for_grpc(method))
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
