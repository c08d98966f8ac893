//! `ai-router drain`: makes an Envoy safe to stop (a pre-stop hook): no new call, the calls in
//! flight finished, every outcome acknowledged by a control plane. Prints the result as JSON;
//! fails when the grace ended first.

use std::time::Duration;

use clap::Args;

use crate::drain::drain_envoy;
use crate::stdout;

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The Envoy's admin interface, `host:port` (the bootstraps we render put it on
    /// 127.0.0.1:9901).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9901")]
    envoy_admin: String,
    /// The longest wait, in seconds, for the calls in flight and their reports.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    grace_s: u64,
}

pub async fn run(args: DrainArgs) -> anyhow::Result<()> {
    let drained = drain_envoy(&args.envoy_admin, Duration::from_secs(args.grace_s)).await?;
    stdout::print_line(&serde_json::to_string(&drained)?)?;
    if !drained.drained {
        anyhow::bail!(
            "the grace of {}s ended with calls in flight or outcomes unreported: stopping Envoy now loses them",
            args.grace_s
        );
    }
    Ok(())
}
