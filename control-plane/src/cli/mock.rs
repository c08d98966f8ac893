//! `ai-router mock`: the scriptable fake provider.

use std::path::PathBuf;

use clap::Args;

use crate::mock;

#[derive(Debug, Args)]
pub struct MockArgs {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// A script to load at start (JSON for .json, YAML otherwise).
    #[arg(long, value_name = "FILE")]
    script: Option<PathBuf>,
}

pub async fn run(args: MockArgs) -> anyhow::Result<()> {
    mock::run(mock::MockOptions {
        host: args.host,
        port: args.port,
        script: args.script,
    })
    .await
}
