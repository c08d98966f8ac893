//! `ai-router serve`: the control plane alone.

use std::path::PathBuf;

use clap::Args;

use crate::serve;

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
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    serve::serve(serve::ServeOptions {
        config: args.config,
        http_listen: args.http_listen,
        grpc_listen: args.grpc_listen,
        insecure_trusted_sync: args.insecure_trusted_sync,
    })
    .await
}
