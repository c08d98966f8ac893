//! `ai-router up`: control plane + Envoy (+ the mock when no provider key is set), locally.

use std::path::PathBuf;

use clap::Args;

use crate::up;

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Default: examples/pool.yaml when present.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[arg(long, value_name = "PATH")]
    wasm: Option<PathBuf>,
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    up::up(up::UpOptions {
        config: args.config,
        wasm: args.wasm,
    })
    .await
}
