//! `airouter.v1.Sync`, the service each Envoy's singleton holds open.
//!
//! `Watch` sends the current snapshot at once, then for every new version the delta from what
//! that watcher last received (a watcher that falls behind gets one delta over what it
//! missed). Each watcher is sent its share of every headroom figure (`api::shares`), split
//! among the Envoys of every control plane on the shared state store, so they never spend the
//! same last requests of a scope together. `Report` applies outcomes to the engine. `Lease` hands out the half-open probe lease through the engine, which keeps it in the
//! state store (shared by control planes on one SQLite file). `TakeMinuteCalls` grants blocks of
//! a virtual key's `requestsPerMinute` (`engine::minute_calls`).
//!
//! The channel carries every provider secret, and `Report` moves breakers, blacklists and usage,
//! so it is authenticated ([`SyncAccess`]): every call (Watch, Report, Lease) carries the sync
//! token in the `x-ai-router-sync-token` metadata entry (compared in constant time), else
//! `UNAUTHENTICATED`. The only way to serve without one is the explicit trusted mode, and
//! [`crate::serve`] binds that to loopback only.
//! HTTP/2 keepalive pings notice a dead Envoy whose stream would otherwise linger.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ai_router_proto::tables::{self, Tables};
use ai_router_proto::v1 as pb;
use ai_router_proto::v1::sync_server::{Sync as SyncApi, SyncServer};
use futures::Stream;
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::api::error::{ApiError, ErrorCode};
use crate::api::shares::{share_of, Members};
use crate::config::secrets::{constant_time_eq, Secret};
use crate::engine::Engine;
use crate::store::breaker::BreakerScope;

/// The metadata entry carrying the sync token.
pub const SYNC_TOKEN_METADATA: &str = ai_router_contract::SYNC_TOKEN_METADATA;
/// The env variable holding the sync token (wins over `controlPlane.syncToken`).
pub const SYNC_TOKEN_ENV: &str = ai_router_contract::SYNC_TOKEN_ENV;
/// The env twin of `serve --insecure-trusted-sync`.
pub const INSECURE_TRUSTED_SYNC_ENV: &str = "AI_ROUTER_INSECURE_TRUSTED_SYNC";

/// Who may call the Sync service.
#[derive(Debug, Clone)]
pub enum SyncAccess {
    /// Every call must carry this token.
    Token(Secret),
    /// No token (`--insecure-trusted-sync`): any process that reaches the port is trusted, so
    /// the port is bound to loopback only.
    TrustedLoopback,
}

const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

type UpdateStream = Pin<Box<dyn Stream<Item = Result<pb::StateUpdate, Status>> + Send + 'static>>;

#[derive(Clone)]
pub struct SyncService {
    engine: Arc<Engine>,
    access: SyncAccess,
    /// Flips to `true` at shutdown so open `Watch` streams end and the server can drain.
    shutdown: watch::Receiver<bool>,
    /// When set, a `Report` is acknowledged only once its usage rows are stored.
    usage: Option<Arc<crate::keys::usage::UsageRecorder>>,
    /// The open `Watch` streams, which share the headroom.
    members: Arc<Members>,
}

impl std::fmt::Debug for SyncService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncService")
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl SyncService {
    pub fn new(engine: Arc<Engine>, access: SyncAccess, shutdown: watch::Receiver<bool>) -> Self {
        Self {
            engine,
            access,
            shutdown,
            usage: None,
            members: Arc::new(Members::default()),
        }
    }

    /// The task that registers this control plane's streams in the state store and re-splits
    /// the headroom when the membership moves (`api::shares`); run it alongside the server.
    pub fn share_headroom(&self) -> impl Future<Output = ()> + Send + 'static {
        crate::api::shares::heartbeat(
            self.members.clone(),
            self.engine.clone(),
            self.shutdown.clone(),
        )
    }

    /// Acknowledges a `Report` only once `recorder` has stored its usage rows.
    pub fn with_usage(mut self, recorder: Arc<crate::keys::usage::UsageRecorder>) -> Self {
        self.usage = Some(recorder);
        self
    }

    /// Every handler calls this before it reads the request.
    fn authorize<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let expected = match &self.access {
            SyncAccess::Token(token) => token,
            SyncAccess::TrustedLoopback => return Ok(()),
        };
        let given = request
            .metadata()
            .get(SYNC_TOKEN_METADATA)
            .map(|v| v.as_bytes());
        match given {
            None => Err(ApiError::new(
                ErrorCode::MissingApiKey,
                format!("the {SYNC_TOKEN_METADATA} metadata entry is required"),
            )
            .into()),
            Some(given) if constant_time_eq(given, expected.expose().as_bytes()) => Ok(()),
            Some(_) => Err(ApiError::new(ErrorCode::InvalidApiKey, "wrong sync token").into()),
        }
    }
}

#[tonic::async_trait]
impl SyncApi for SyncService {
    type WatchStream = UpdateStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.authorize(&request)?;
        let node = request.into_inner().node;
        tracing::info!(node = %node, "sync watcher connected");
        let updates = self.engine.subscribe();
        let shutdown = self.shutdown.clone();
        let id = NEXT_WATCHER.fetch_add(1, Ordering::Relaxed);
        self.members.join(id);
        let watcher = Watcher {
            updates,
            shutdown,
            node,
            sent: None,
            id,
            membership: self.members.subscribe(),
            members: self.members.clone(),
        };
        let stream = futures::stream::unfold(watcher, |mut watcher| async move {
            let update = watcher.next().await?;
            Some((Ok(update), watcher))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn report(
        &self,
        request: Request<pb::ReportBatch>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        self.authorize(&request)?;
        let batch = request.into_inner();
        let id = batch.batch_id.clone();
        if let Some(usage) = self.usage.as_ref().filter(|_| !id.is_empty()) {
            // Sent again after an acknowledgement was lost: already counted.
            if !usage.first_sight(&id).await {
                return Ok(Response::new(pb::ReportAck {
                    version: self.engine.version(),
                }));
            }
        }
        // Ending a probe lease writes to the store: off the executor.
        let engine = self.engine.clone();
        let (version, _) =
            match tokio::task::spawn_blocking(move || engine.apply_report(&batch)).await {
                Ok(applied) => applied,
                Err(err) => {
                    if let Some(usage) = &self.usage {
                        usage.forget(&id);
                    }
                    return Err(Status::internal(format!("report task failed: {err}")));
                }
            };
        if let Some(usage) = &self.usage {
            // Not acknowledged, the filter sends the batch again.
            if !usage.stored().await {
                usage.forget(&id);
                return Err(Status::unavailable(
                    "the usage of this batch could not be stored",
                ));
            }
        }
        Ok(Response::new(pb::ReportAck { version }))
    }

    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseReply>, Status> {
        self.authorize(&request)?;
        let req = request.into_inner();
        let Ok(scope) = BreakerScope::try_from(req.scope()) else {
            return Err(Status::invalid_argument(format!(
                "scope must be key or provider, not {:?}",
                req.scope
            )));
        };
        let engine = self.engine.clone();
        let id = (scope, req.provider, req.key);
        // The store may be SQLite: off the executor.
        let reply = tokio::task::spawn_blocking(move || engine.lease(&id, &req.holder, req.ttl_ms))
            .await
            .map_err(|err| Status::internal(format!("lease task failed: {err}")))?
            .map_err(|err| {
                tracing::error!(%err, "cannot take a probe lease");
                Status::unavailable("the state store is unavailable")
            })?;
        Ok(Response::new(reply))
    }

    async fn take_minute_calls(
        &self,
        request: Request<pb::MinuteCallsRequest>,
    ) -> Result<Response<pb::MinuteCallsReply>, Status> {
        self.authorize(&request)?;
        let req = request.into_inner();
        let engine = self.engine.clone();
        // Redis, or a mutex: off the executor either way.
        let granted = tokio::task::spawn_blocking(move || {
            engine.take_minute_calls(&req.virtual_key_id, req.minute, req.calls, req.limit)
        })
        .await
        .map_err(|err| Status::internal(format!("minute budget task failed: {err}")))?;
        Ok(Response::new(pb::MinuteCallsReply { granted }))
    }

    async fn shared_cache_get(
        &self,
        request: Request<pb::SharedCacheGetRequest>,
    ) -> Result<Response<pb::SharedCacheGetReply>, Status> {
        self.authorize(&request)?;
        let req = request.into_inner();
        let engine = self.engine.clone();
        // A miss whatever goes wrong: the filter then calls a provider.
        let entry = tokio::task::spawn_blocking(move || engine.shared_cache_get(&req.key))
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        Ok(Response::new(pb::SharedCacheGetReply { entry }))
    }

    async fn shared_cache_put(
        &self,
        request: Request<pb::SharedCachePutRequest>,
    ) -> Result<Response<pb::SharedCachePutReply>, Status> {
        self.authorize(&request)?;
        let req = request.into_inner();
        let engine = self.engine.clone();
        // The write goes on even when the Envoy stops waiting (its call ended with the answer).
        let stored = tokio::task::spawn_blocking(move || {
            engine.shared_cache_put(&req.key, req.entry, req.ttl_ms)
        })
        .await
        .unwrap_or(false);
        Ok(Response::new(pb::SharedCachePutReply { stored }))
    }
}

/// What the sync channel carried since start, for `/metrics`.
#[derive(Debug, Default)]
pub struct SyncTraffic {
    pub snapshots: AtomicU64,
    pub snapshot_bytes: AtomicU64,
    pub deltas: AtomicU64,
    pub delta_bytes: AtomicU64,
}

pub static TRAFFIC: SyncTraffic = SyncTraffic {
    snapshots: AtomicU64::new(0),
    snapshot_bytes: AtomicU64::new(0),
    deltas: AtomicU64::new(0),
    delta_bytes: AtomicU64::new(0),
};

/// An open `Watch` stream as `/metrics` shows it: the Envoy's node name, the last version it
/// was brought up to (sent, or found to change nothing it holds) and when.
#[derive(Debug, Clone)]
pub struct Watching {
    pub node: String,
    pub version: u64,
    pub at: std::time::Instant,
}

/// The open `Watch` streams, by connection.
pub static WATCHING: std::sync::Mutex<std::collections::BTreeMap<u64, Watching>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

static NEXT_WATCHER: AtomicU64 = AtomicU64::new(0);

/// The open `Watch` streams now.
pub fn watching() -> Vec<Watching> {
    let open = WATCHING.lock().unwrap_or_else(|p| p.into_inner());
    open.values().cloned().collect()
}

/// `tables` with stream `id`'s share of the headroom.
fn mine(members: &Members, id: u64, tables: Arc<Tables>) -> Arc<Tables> {
    let (index, count) = members.place(id);
    share_of(&tables, index, count)
}

/// One `Watch` stream: the current snapshot first, then per new version the delta from what
/// this watcher last received (versions that changed nothing it holds are skipped; a watcher
/// that falls behind gets one delta over every version it missed).
struct Watcher {
    updates: watch::Receiver<Arc<Tables>>,
    shutdown: watch::Receiver<bool>,
    node: String,
    sent: Option<Arc<Tables>>,
    /// Its entry in [`WATCHING`] and in `members`.
    id: u64,
    /// The streams sharing the headroom, and their changes.
    members: Arc<Members>,
    membership: watch::Receiver<u64>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let mut open = WATCHING.lock().unwrap_or_else(|p| p.into_inner());
        open.remove(&self.id);
        drop(open);
        self.members.leave(self.id);
    }
}

impl Watcher {
    /// Notes in [`WATCHING`] that this Envoy is up to `version` now.
    fn holds(&self, version: u64) {
        let mut open = WATCHING.lock().unwrap_or_else(|p| p.into_inner());
        open.insert(
            self.id,
            Watching {
                node: self.node.clone(),
                version,
                at: std::time::Instant::now(),
            },
        );
    }

    async fn next(&mut self) -> Option<pb::StateUpdate> {
        loop {
            if *self.shutdown.borrow() {
                return None;
            }
            if let Some(sent) = &self.sent {
                tokio::select! {
                    changed = self.updates.changed() => changed.ok()?,
                    // Another Envoy came or went: this one's share of the headroom changed.
                    changed = self.membership.changed() => changed.ok()?,
                    _ = self.shutdown.changed() => {
                        tracing::debug!(node = %self.node, "closing a sync watcher for shutdown");
                        return None;
                    }
                }
                self.membership.mark_unchanged();
                let now = mine(
                    &self.members,
                    self.id,
                    self.updates.borrow_and_update().clone(),
                );
                match sent.diff(&now) {
                    Some(delta) if tables::is_empty(&delta) => {
                        self.holds(now.version);
                        continue;
                    }
                    Some(delta) => {
                        let update = pb::StateUpdate {
                            version: now.version,
                            snapshot: None,
                            delta: Some(delta),
                        };
                        TRAFFIC.deltas.fetch_add(1, Ordering::Relaxed);
                        TRAFFIC
                            .delta_bytes
                            .fetch_add(update.encoded_len() as u64, Ordering::Relaxed);
                        self.holds(now.version);
                        self.sent = Some(now);
                        return Some(update);
                    }
                    None => return Some(self.snapshot(now)),
                }
            }
            // The first message is the whole current state, whatever version the caller
            // holds: it may have been written by another control plane.
            let now = mine(
                &self.members,
                self.id,
                self.updates.borrow_and_update().clone(),
            );
            self.membership.mark_unchanged();
            return Some(self.snapshot(now));
        }
    }

    fn snapshot(&mut self, tables: Arc<Tables>) -> pb::StateUpdate {
        let update = pb::StateUpdate {
            version: tables.version,
            snapshot: Some(tables.to_snapshot()),
            delta: None,
        };
        TRAFFIC.snapshots.fetch_add(1, Ordering::Relaxed);
        TRAFFIC
            .snapshot_bytes
            .fetch_add(update.encoded_len() as u64, Ordering::Relaxed);
        self.holds(tables.version);
        self.sent = Some(tables);
        update
    }
}

/// Serves Sync on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    service: SyncService,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with_admin(listener, service, None, shutdown).await
}

/// [`serve`], plus the admin API when given: `airouter.v1.Admin`, and its HTTP routes
/// (`/admin/...`, over HTTP/2) for the gateway's public listener, which routes `/admin/` to
/// this port through Envoy's control-plane cluster (`render.rs`). Same token rules on both.
pub async fn serve_with_admin(
    listener: TcpListener,
    service: SyncService,
    admin: Option<Arc<crate::api::admin::AdminApi>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with_admin_tls(listener, service, admin, shutdown, None).await
}

/// [`serve_with_admin`], over mutual TLS when `tls` is given (see [`crate::tls::server`]):
/// only a client with a certificate from the configured CA gets to a service at all.
pub async fn serve_with_admin_tls(
    listener: TcpListener,
    service: SyncService,
    admin: Option<Arc<crate::api::admin::AdminApi>>,
    shutdown: impl Future<Output = ()> + Send,
    tls: Option<crate::tls::server::Current>,
) -> Result<(), tonic::transport::Error> {
    let mut routes = tonic::service::Routes::new(SyncServer::new(service));
    if let Some(api) = admin {
        routes = routes.add_service(crate::api::admin::AdminGrpc::new(api.clone()).into_server());
        let http = crate::api::admin::guarded(
            crate::api::admin::admin_routes().merge(crate::api::console::routes()),
            api,
        );
        let grpc = std::mem::take(routes.axum_router_mut());
        *routes.axum_router_mut() = grpc.merge(http);
    }
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_routes(routes);
    match tls {
        Some(current) => {
            server
                .serve_with_incoming_shutdown(
                    crate::tls::server::incoming(listener, current),
                    shutdown,
                )
                .await
        }
        None => {
            let incoming = TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(Duration::from_secs(30)));
            server
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::config::parse;
    use crate::config::secrets::MapEnv;
    use crate::store::durable::DurableState;
    use ai_router_proto::v1::sync_client::SyncClient;
    use futures::StreamExt;
    use std::path::Path;

    fn engine() -> Result<Arc<Engine>, String> {
        let env = Arc::new(MapEnv::new([("K", "sk-upstream")]));
        let config = parse(
            "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: K }], models: [{ id: m }] }\n",
        )
        .and_then(|f| f.resolve(env.as_ref(), Path::new(".")))
        .map_err(|e| e.to_string())?;
        Ok(Engine::new(
            Arc::new(config),
            env,
            Arc::new(SystemClock),
            Vec::new(),
            DurableState::default(),
        ))
    }

    fn maybe_with_token<T>(message: T, token: Option<&str>) -> Request<T> {
        match token {
            Some(token) => with_token(message, token),
            None => Request::new(message),
        }
    }

    fn with_token<T>(message: T, token: &str) -> Request<T> {
        let mut request = Request::new(message);
        if let Ok(value) = token.parse() {
            request.metadata_mut().insert(SYNC_TOKEN_METADATA, value);
        }
        request
    }

    #[tokio::test]
    async fn watch_report_and_lease_need_the_token() -> Result<(), Box<dyn std::error::Error>> {
        let (_tx, rx) = watch::channel(false);
        let engine = engine()?;
        let service = SyncService::new(engine.clone(), SyncAccess::Token(Secret::new("tok")), rx);
        let version = engine.version();
        let failure = pb::ReportBatch {
            attempts: vec![pb::AttemptOutcome {
                provider: "p".into(),
                key: "a".into(),
                model: "m".into(),
                outcome: pb::AttemptResult::Error.into(),
                error_class: pb::ErrorClass::Auth.into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let lease = pb::LeaseRequest {
            scope: pb::BreakerScope::Key.into(),
            provider: "p".into(),
            key: "a".into(),
            holder: "r1:1".into(),
            ttl_ms: 60_000,
        };
        for token in [None, Some("nope"), Some("to"), Some("tok2")] {
            let code = |status: Option<Status>| status.map(|s| s.code());
            let watch = service
                .watch(maybe_with_token(pb::WatchRequest::default(), token))
                .await;
            assert_eq!(code(watch.err()), Some(tonic::Code::Unauthenticated));
            let report = service
                .report(maybe_with_token(failure.clone(), token))
                .await;
            assert_eq!(code(report.err()), Some(tonic::Code::Unauthenticated));
            let leased = service.lease(maybe_with_token(lease.clone(), token)).await;
            assert_eq!(code(leased.err()), Some(tonic::Code::Unauthenticated));
        }
        // Nothing the refused calls carried was applied.
        assert_eq!(engine.version(), version);
        let ok = service
            .report(with_token(pb::ReportBatch::default(), "tok"))
            .await?;
        assert!(ok.into_inner().version > 0);
        let ok = service.lease(with_token(lease, "tok")).await?;
        assert!(ok.into_inner().granted);
        Ok(())
    }

    #[tokio::test]
    async fn watch_over_a_socket_sends_now_then_each_version(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let engine = engine()?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let service = SyncService::new(
            engine.clone(),
            SyncAccess::Token(Secret::new("tok")),
            stop_rx.clone(),
        );
        let mut stop = stop_rx.clone();
        let server = tokio::spawn(serve(listener, service, async move {
            let _ = stop.wait_for(|s| *s).await;
        }));
        let mut client = SyncClient::connect(format!("http://{addr}")).await?;
        let mut stream = client
            .watch(with_token(
                pb::WatchRequest {
                    node: "test".into(),
                    known_version: 0,
                },
                "tok",
            ))
            .await?
            .into_inner();
        let first = stream.next().await.ok_or("no first update")??;
        assert_eq!(first.version, engine.version());
        let snapshot = first.snapshot.unwrap_or_default();
        assert_eq!(snapshot.providers[0].keys[0].secret, "sk-upstream");

        let attempt = pb::AttemptOutcome {
            provider: "p".into(),
            key: "a".into(),
            model: "m".into(),
            outcome: pb::AttemptResult::Error.into(),
            error_class: pb::ErrorClass::RateLimit.into(),
            ..Default::default()
        };
        let ack = client
            .report(with_token(
                pb::ReportBatch {
                    attempts: vec![attempt],
                    ..Default::default()
                },
                "tok",
            ))
            .await?
            .into_inner();
        assert_eq!(ack.version, first.version + 1);
        let second = stream.next().await.ok_or("no second update")??;
        assert_eq!(second.version, ack.version);
        // A delta from the first version carrying the new cooldown and nothing else: no
        // secret, no virtual key.
        assert!(second.snapshot.is_none());
        let delta = second.delta.unwrap_or_default();
        assert_eq!(delta.base_version, first.version);
        assert_eq!(delta.cooldowns.len(), 1);
        assert!(delta.providers.is_empty() && delta.provider_keys.is_empty());
        assert!(delta.virtual_keys.is_empty() && delta.settings.is_none());
        let mut held = ai_router_proto::tables::Tables::from_snapshot(first.version, snapshot);
        held.apply(second.version, &delta)?;
        assert_eq!(held, *engine.tables());

        // Shutdown ends the stream and the server.
        stop_tx.send(true)?;
        assert!(stream.next().await.is_none_or(|item| item.is_err()));
        tokio::time::timeout(Duration::from_secs(5), server).await???;
        Ok(())
    }

    #[tokio::test]
    async fn lease_is_granted_once_and_checks_the_scope() -> Result<(), Box<dyn std::error::Error>>
    {
        let (_tx, rx) = watch::channel(false);
        let service = SyncService::new(engine()?, SyncAccess::TrustedLoopback, rx);
        let ask = |scope: &str, holder: &str| pb::LeaseRequest {
            // Anything else is no scope ("lane": unspecified).
            scope: match scope {
                "key" => pb::BreakerScope::Key,
                "provider" => pb::BreakerScope::Provider,
                _ => pb::BreakerScope::Unspecified,
            }
            .into(),
            provider: "p".into(),
            key: "a".into(),
            holder: holder.into(),
            ttl_ms: 60_000,
        };
        let bad = service.lease(Request::new(ask("lane", "r1:1"))).await;
        assert_eq!(
            bad.err().map(|s| s.code()),
            Some(tonic::Code::InvalidArgument)
        );
        let first = service
            .lease(Request::new(ask(
                "key",
                &ai_router_contract::probe_holder("r1", 1),
            )))
            .await?
            .into_inner();
        assert!(first.granted);
        let second = service
            .lease(Request::new(ask("key", "r2:1")))
            .await?
            .into_inner();
        assert!(!second.granted);
        assert!(second.retry_at_ms > 0);
        // The provider scope is another lease (its key is ignored).
        let provider = service
            .lease(Request::new(ask("provider", "r2:1")))
            .await?
            .into_inner();
        assert!(provider.granted);
        // The holder's probe outcome ends it.
        let outcome = pb::AttemptOutcome {
            request_id: "r1".into(),
            attempt: 1,
            provider: "p".into(),
            key: "a".into(),
            model: "m".into(),
            outcome: pb::AttemptResult::Success.into(),
            probe: true,
            ..Default::default()
        };
        service
            .report(Request::new(pb::ReportBatch {
                attempts: vec![outcome],
                ..Default::default()
            }))
            .await?;
        let third = service
            .lease(Request::new(ask("key", "r3:1")))
            .await?
            .into_inner();
        assert!(third.granted);
        Ok(())
    }
}
