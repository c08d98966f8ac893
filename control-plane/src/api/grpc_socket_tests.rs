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

/// gRPC parity with HTTP, over a socket: the pages (health, stats, catalog, ledger) are the
/// HTTP routes' documents, `CreateKey` takes `enabled`, `KeyUsage` says its range, `Events`
/// takes the enum (and refuses `lagged`, which is sent, never asked for).
#[tokio::test]
async fn grpc_admin_pages_keys_and_events_match_http() -> Result<()> {
    use ai_router_proto::v1::admin_client::AdminClient;
    let api = api(Some(TOKEN))?;
    let served = Served::start(&api).await?;
    let mut client = AdminClient::connect(format!("http://{}", served.addr)).await?;
    // Every page needs the token, and answers the HTTP route's document.
    let denied = client.stats(pb::PageRequest {}).await;
    assert_eq!(
        denied.err().map(|s| s.code()),
        Some(tonic::Code::Unauthenticated)
    );
    let json = |page: pb::AdminPage| -> Result<serde_json::Value> {
        Ok(serde_json::from_str(&page.json)?)
    };
    let health = json(
        client
            .pool_health(authed(pb::PageRequest {}))
            .await?
            .into_inner(),
    )?;
    assert_eq!(health["providers"][0]["keys"][0]["state"], "ok", "{health}");
    assert_eq!(health["providers"], api.pool_health()["providers"]);
    let stats = json(client.stats(authed(pb::PageRequest {})).await?.into_inner())?;
    assert_eq!(stats, serde_json::to_value(api.engine().stats())?);
    let catalog = json(
        client
            .catalog(authed(pb::PageRequest {}))
            .await?
            .into_inner(),
    )?;
    assert_eq!(catalog, api.catalog());
    let ledger = json(
        client
            .ledger(authed(pb::PageRequest {}))
            .await?
            .into_inner(),
    )?;
    assert_eq!(ledger["providers"][0]["provider"], "p", "{ledger}");

    // CreateKey with enabled: false; KeyUsage with its range.
    let created = client
        .create_key(authed(pb::CreateKeyRequest {
            label: "off_app".into(),
            models: vec!["*".into()],
            enabled: Some(false),
            ..Default::default()
        }))
        .await?
        .into_inner();
    let key = created.key.unwrap_or_default();
    assert!(!key.enabled, "{key:?}");
    let usage = client
        .key_usage(authed(pb::KeyUsageRequest {
            id: key.id.clone(),
            from: "2026-02-01".into(),
            to: "2026-02-28".into(),
        }))
        .await?
        .into_inner();
    assert_eq!(
        (usage.from.as_str(), usage.to.as_str()),
        ("2026-02-01", "2026-02-28")
    );
    let this_month = client
        .key_usage(authed(pb::KeyUsageRequest {
            id: key.id,
            ..Default::default()
        }))
        .await?
        .into_inner();
    assert!(this_month.from.ends_with("-01"), "{this_month:?}");

    // Events: lagged cannot be asked for.
    let refused = client
        .events(authed(pb::EventsRequest {
            event_types: vec![pb::AdminEventType::Lagged.into()],
            ..Default::default()
        }))
        .await;
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(tonic::Code::InvalidArgument)
    );
    served.stop().await?;
    Ok(())
}

/// The gRPC port serves the `/admin/` HTTP routes too (over HTTP/2): what Envoy forwards from
/// the gateway's listener. Same token rules; nothing but `/admin/`.
#[tokio::test]
async fn the_grpc_port_answers_the_admin_http_routes_over_http2() -> Result<()> {
    let api = api(Some(TOKEN))?;
    let served = Served::start(&api).await?;
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Empty<axum::body::Bytes>>();
    let get = |path: &str, token: Option<&str>| {
        let mut request = axum::http::Request::get(format!("http://{}{path}", served.addr));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request.body(http_body_util::Empty::new());
        let client = client.clone();
        async move {
            let response = client.request(request?).await?;
            let status = response.status().as_u16();
            let bytes = response.into_body().collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error>>((
                status,
                serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default(),
            ))
        }
    };
    let (status, _) = get("/admin/keys", None).await?;
    assert_eq!(status, 401);
    let (status, body) = get("/admin/keys", Some(TOKEN)).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["keys"][0]["mounted"], true, "{body}");
    // The control plane's /health and /metrics stay on its HTTP port.
    let (_, body) = get("/health", Some(TOKEN)).await?;
    assert!(body.get("providers").is_none(), "{body}");
    served.stop().await?;
    Ok(())
}
