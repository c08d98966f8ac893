//! The sync channel over mutual TLS: Envoy syncs over it and serves calls; a client without a
//! certificate from the control plane's CA is refused, and the sync token stays a second
//! factor; certificates rotated on disk are taken by both sides without a restart.

use std::path::Path;
use std::time::Duration;

use ai_router_e2e::*;
use ai_router_proto::v1 as pb;
use ai_router_proto::v1::sync_client::SyncClient;
use serde_json::json;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// A client's certificate and key (PEM), from an Envoy folder `ai-router certs` wrote.
struct ClientCert {
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn client_cert(folder: &Path) -> std::io::Result<ClientCert> {
    Ok(ClientCert {
        cert: std::fs::read(folder.join("cert.pem"))?,
        key: std::fs::read(folder.join("key.pem"))?,
    })
}

/// Opens `Sync.Watch` at `grpc` over TLS (trusting `ca`, presenting `client` if any, with the
/// sync token if any) and reads the first message: Ok when it is a snapshot.
async fn watch_over_tls(
    grpc: std::net::SocketAddr,
    ca: &[u8],
    client: Option<&ClientCert>,
    token: Option<&str>,
) -> Result<(), String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(client) = client {
        tls = tls.identity(Identity::from_pem(&client.cert, &client.key));
    }
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", grpc.port()))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut request = tonic::Request::new(pb::WatchRequest::default());
    if let Some(token) = token {
        let value = token.parse().map_err(|e| format!("{e:?}"))?;
        request
            .metadata_mut()
            .insert("x-ai-router-sync-token", value);
    }
    let mut stream = SyncClient::new(channel)
        .watch(request)
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    match stream.message().await {
        Ok(Some(update)) if update.snapshot.is_some() => Ok(()),
        Ok(other) => Err(format!("not a snapshot: {other:?}")),
        Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_syncs_over_mutual_tls_refuses_strangers_and_takes_rotated_certificates() {
    let g = Gateway::start_mutual_tls("sync_mtls").await.unwrap();
    let certs = g.sync_tls.clone().unwrap();
    let grpc = g.cp.grpc_addr();

    // Envoy got its state over mutual TLS (the fixture waited for it) and serves a call.
    let reply = g.chat("chat").await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(
        g.cp.logs().contains("\"mutual_tls\":true") || g.cp.logs().contains("mutual_tls=true"),
        "the control plane says it serves mutual TLS:\n{}",
        g.cp.tail()
    );

    let ca = std::fs::read(certs.join("ca.pem")).unwrap();
    let envoy_cert = client_cert(&certs.join("envoy")).unwrap();
    let token = g.sync_token.clone();
    watch_over_tls(grpc, &ca, Some(&envoy_cert), Some(&token))
        .await
        .expect("a client with the Envoy's certificate and the token is served");

    // No client certificate: the handshake fails, nothing reaches Sync.
    let refused = watch_over_tls(grpc, &ca, None, Some(&token)).await;
    assert!(refused.is_err(), "served without a client certificate");
    // A certificate from another CA.
    let other = g.dir.join("other-ca");
    let other_arg = other.display().to_string();
    let (ok, _, output) = run_cli(&["certs", "--out", &other_arg], &[]).await.unwrap();
    assert!(ok, "{output}");
    let stranger = client_cert(&other.join("envoy")).unwrap();
    let refused = watch_over_tls(grpc, &ca, Some(&stranger), Some(&token)).await;
    assert!(refused.is_err(), "served a certificate from another CA");
    // Plaintext.
    let plaintext = SyncClient::connect(format!("http://{grpc}")).await;
    if let Ok(mut client) = plaintext {
        let mut request = tonic::Request::new(pb::WatchRequest::default());
        request
            .metadata_mut()
            .insert("x-ai-router-sync-token", token.parse().unwrap());
        assert!(
            client.watch(request).await.is_err(),
            "served plaintext on the TLS port"
        );
    }
    // The right certificate without the token: the token stays a second factor.
    let refused = watch_over_tls(grpc, &ca, Some(&envoy_cert), None).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.starts_with("Unauthenticated")),
        "{refused:?}"
    );

    // Rotation: a new CA and new leaves, written over the same files while both run.
    let envoy_pid = g.envoy.process().pid();
    let cp_pid = g.cp.pid();
    let certs_arg = certs.display().to_string();
    let (ok, issued, output) = run_cli(&["certs", "--out", &certs_arg, "--new-ca"], &[])
        .await
        .unwrap();
    assert!(ok && issued["new_ca"] == true, "{output}");
    let new_ca = std::fs::read(certs.join("ca.pem")).unwrap();
    assert_ne!(new_ca, ca);
    let new_cert = client_cert(&certs.join("envoy")).unwrap();

    // The control plane takes the new files for new connections, and refuses the old CA's.
    poll(
        "the control plane to serve the rotated certificates",
        Duration::from_secs(15),
        || {
            let (new_ca, new_cert, token) = (&new_ca, &new_cert, &token);
            async move {
                Ok(watch_over_tls(grpc, new_ca, Some(new_cert), Some(token))
                    .await
                    .ok())
            }
        },
    )
    .await
    .unwrap();
    let old = watch_over_tls(grpc, &new_ca, Some(&envoy_cert), Some(&token)).await;
    assert!(old.is_err(), "the old CA's certificate is still served");

    // Envoy: its connection made under the old certificates ended; it reconnects with the
    // rotated ones it read through SDS (the only ones the control plane now takes), so a key
    // created after the rotation reaches it.
    let (_, secret) = g
        .admin()
        .create_key(&json!({ "label": "after_rotation", "models": ["*"] }))
        .await
        .unwrap();
    g.envoy
        .wait_ready(&secret)
        .await
        .expect("Envoy syncs again over the rotated certificates");
    let reply = g.client.chat("chat", Some(&secret)).await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(
        g.envoy.process().pid(),
        envoy_pid,
        "Envoy was not restarted"
    );
    assert_eq!(g.cp.pid(), cp_pid, "the control plane was not restarted");
    assert!(
        g.cp.logs().contains("sync TLS certificates reloaded"),
        "{}",
        g.cp.tail()
    );
    g.check_no_secrets_in_logs().unwrap();
}
