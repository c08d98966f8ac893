//! `ai-router serve`: the control plane alone.

use std::path::PathBuf;

use clap::Args;

use crate::serve;
use crate::tls::{
    SyncTlsFiles, CLIENT_CA_ENV, INSECURE_PLAINTEXT_SYNC_ENV, TLS_CERT_ENV, TLS_KEY_ENV,
};

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// HOST:PORT (default: controlPlane.host and httpPort); port 0 picks one.
    #[arg(long, value_name = "HOST:PORT")]
    http_listen: Option<String>,
    /// HOST:PORT (default: controlPlane.host and grpcPort); port 0 picks one.
    #[arg(long, value_name = "HOST:PORT")]
    grpc_listen: Option<String>,
    /// Serve the Sync channel without a token, on a loopback gRPC address only. Without
    /// this, serve refuses to start unless AI_ROUTER_SYNC_TOKEN or controlPlane.syncToken
    /// gives a token: Sync hands out every provider key.
    #[arg(long, env = "AI_ROUTER_INSECURE_TRUSTED_SYNC", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    insecure_trusted_sync: bool,
    /// Serve gRPC (Sync, and the admin service on the same port) over mutual TLS: this
    /// server certificate (PEM; `ai-router certs` issues one) ...
    #[arg(long, value_name = "FILE", env = TLS_CERT_ENV, requires_all = ["tls_key", "client_ca"])]
    tls_cert: Option<PathBuf>,
    /// ... its private key (PEM) ...
    #[arg(long, value_name = "FILE", env = TLS_KEY_ENV, requires_all = ["tls_cert", "client_ca"])]
    tls_key: Option<PathBuf>,
    /// ... and the CA a client's certificate must chain to (a client without one is refused).
    /// The three files are re-read when they change. Default: controlPlane.syncTls.
    #[arg(long, value_name = "FILE", env = CLIENT_CA_ENV, requires_all = ["tls_cert", "tls_key"])]
    client_ca: Option<PathBuf>,
    /// Serve Sync in plaintext on a non-loopback gRPC address. Without TLS, serve refuses a
    /// non-loopback address unless told this: whoever reads the traffic has every provider key.
    #[arg(long, env = INSECURE_PLAINTEXT_SYNC_ENV, action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    insecure_plaintext_sync: bool,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    serve::serve(serve::ServeOptions {
        config: args.config,
        http_listen: args.http_listen,
        grpc_listen: args.grpc_listen,
        insecure_trusted_sync: args.insecure_trusted_sync,
        sync_tls: match (args.tls_cert, args.tls_key, args.client_ca) {
            (Some(cert), Some(key), Some(client_ca)) => Some(SyncTlsFiles {
                cert,
                key,
                client_ca,
            }),
            _ => None,
        },
        insecure_plaintext_sync: args.insecure_plaintext_sync,
    })
    .await
}
