//! The admin gRPC service on the Sync service's port, over a socket: what `serve` runs.

use std::sync::Arc;
use std::time::Duration;

use ai_router_proto::v1 as pb;
use tokio::sync::watch;
use tonic::Request;

use crate::api::admin::tests::{api, authed, TOKEN};
use crate::api::admin::AdminApi;
use crate::api::sync::{serve_with_admin, SyncAccess, SyncService};
use crate::config::secrets::Secret;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Sync (token `sync-tok`) and the admin service of `api` on one loopback port, as `serve` runs
/// them.
struct Served {
    addr: std::net::SocketAddr,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<std::result::Result<(), tonic::transport::Error>>,
}

impl Served {
    async fn start(api: &Arc<AdminApi>) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let sync = SyncService::new(
            api.engine().clone(),
            SyncAccess::Token(Secret::new("sync-tok")),
            stopped.clone(),
        );
        let mut stopped = stopped.clone();
        let server = tokio::spawn(serve_with_admin(
            listener,
            sync,
            Some(api.clone()),
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        ));
        Ok(Self { addr, stop, server })
    }

    /// Stops the server and waits (5 s at most) for it to end cleanly.
    async fn stop(self) -> Result<()> {
        self.stop.send(true)?;
        tokio::time::timeout(Duration::from_secs(5), self.server).await???;
        Ok(())
    }
}

#[tokio::test]
async fn grpc_admin_over_a_socket() -> Result<()> {
    use ai_router_proto::v1::admin_client::AdminClient;
    let api = api(Some(TOKEN))?;
    let served = Served::start(&api).await?;
    let mut client = AdminClient::connect(format!("http://{}", served.addr)).await?;
    let denied = client.list_keys(pb::ListKeysRequest {}).await;
    assert_eq!(
        denied.err().map(|s| s.code()),
        Some(tonic::Code::Unauthenticated)
    );
    let created = client
        .create_key(authed(pb::CreateKeyRequest {
            label: "grpc_app".into(),
            models: vec!["*".into()],
            ..Default::default()
        }))
        .await?
        .into_inner();
    assert!(created.secret.starts_with("sk-starci-grpc_app-"));
    let unknown = client
        .create_key(authed(pb::CreateKeyRequest {
            label: "grpc_app".into(),
            profiles: vec!["nope".into()],
            ..Default::default()
        }))
        .await;
    assert!(
        matches!(&unknown, Err(s) if s.code() == tonic::Code::InvalidArgument && s.message().contains("`nope`")),
        "{unknown:?}"
    );
    let id = created.key.map(|k| k.id).unwrap_or_default();
    let listed = client
        .list_keys(authed(pb::ListKeysRequest {}))
        .await?
        .into_inner();
    assert_eq!(listed.keys.len(), 2);
    let updated = client
        .update_key(authed(pb::UpdateKeyRequest {
            id: id.clone(),
            enabled: Some(false),
            ..Default::default()
        }))
        .await?
        .into_inner();
    assert!(!updated.enabled);
    // A key's cache choice is set, then cleared back to the policy's.
    let opted_out = client
        .update_key(authed(pb::UpdateKeyRequest {
            id: id.clone(),
            cache: Some(false),
            ..Default::default()
        }))
        .await?
        .into_inner();
    assert_eq!(opted_out.cache, Some(false));
    let both = client
        .update_key(authed(pb::UpdateKeyRequest {
            id: id.clone(),
            cache: Some(true),
            clear_cache: true,
            ..Default::default()
        }))
        .await;
    assert_eq!(
        both.err().map(|s| s.code()),
        Some(tonic::Code::InvalidArgument)
    );
    let cleared = client
        .update_key(authed(pb::UpdateKeyRequest {
            id: id.clone(),
            clear_cache: true,
            ..Default::default()
        }))
        .await?
        .into_inner();
    assert_eq!(cleared.cache, None, "{cleared:?}");
    assert!(!cleared.enabled, "the other fields are kept");
    let mounted = client
        .revoke_key(authed(pb::KeyRef {
            id: crate::keys::mounted::mounted_id("app"),
        }))
        .await;
    assert_eq!(
        mounted.err().map(|s| s.code()),
        Some(tonic::Code::FailedPrecondition)
    );
    let usage = client
        .key_usage(authed(pb::KeyUsageRequest {
            id,
            ..Default::default()
        }))
        .await?
        .into_inner();
    assert!(usage.days.is_empty());
    let health = client
        .health(authed(pb::HealthRequest {}))
        .await?
        .into_inner();
    assert_eq!(health.status, "ok");
    served.stop().await?;
    Ok(())
}

/// Admin shares the Sync port: with no admin token it is off for every caller, the sync
/// token included (it lists keys, creates them and reads usage).
#[tokio::test]
async fn grpc_admin_without_an_admin_token_is_off_even_for_sync_callers() -> Result<()> {
    use ai_router_proto::v1::admin_client::AdminClient;
    let api = api(None)?;
    let served = Served::start(&api).await?;
    let mut client = AdminClient::connect(format!("http://{}", served.addr)).await?;
    let with_sync_token = |mut request: Request<pb::ListKeysRequest>| {
        if let Ok(value) = "sync-tok".parse() {
            request
                .metadata_mut()
                .insert(crate::api::sync::SYNC_TOKEN_METADATA, value);
        }
        if let Ok(value) = "Bearer sync-tok".parse() {
            request.metadata_mut().insert("authorization", value);
        }
        request
    };
    for request in [
        Request::new(pb::ListKeysRequest {}),
        with_sync_token(Request::new(pb::ListKeysRequest {})),
    ] {
        let denied = client.list_keys(request).await;
        assert_eq!(
            denied.err().map(|s| s.code()),
            Some(tonic::Code::PermissionDenied)
        );
    }
    let created = client
        .create_key(pb::CreateKeyRequest {
            label: "nope".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(
        created.err().map(|s| s.code()),
        Some(tonic::Code::PermissionDenied)
    );
    served.stop().await?;
    Ok(())
}
