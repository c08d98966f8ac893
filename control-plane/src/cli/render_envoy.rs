//! `ai-router render-envoy`: the Envoy bootstrap for a pool.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use crate::config::secrets::{Env, ProcessEnv};
use crate::{config, render, stdout, up};

#[derive(Debug, Args)]
pub struct RenderEnvoyArgs {
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The control plane's gRPC address (default: controlPlane.host and grpcPort).
    #[arg(long, value_name = "HOST:PORT")]
    control_plane: Option<String>,
    /// Path of ai_router_filter.wasm as Envoy sees it.
    #[arg(long, value_name = "PATH", default_value = up::DEFAULT_WASM_PATH)]
    wasm: String,
    /// The public listener (default: gateway.host and gateway.port).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// Envoy's admin interface.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9901")]
    admin: String,
    /// Write the YAML here instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub fn run(args: RenderEnvoyArgs) -> anyhow::Result<()> {
    let env: Arc<dyn Env> = Arc::new(ProcessEnv);
    let config = config::load(&args.config, env.as_ref())?;
    let overrides = up::RenderOverrides {
        control_plane: args
            .control_plane
            .as_deref()
            .map(up::parse_host_port)
            .transpose()?,
        wasm: Some(args.wasm),
        listen: args
            .listen
            .as_deref()
            .map(up::parse_host_port)
            .transpose()?,
        admin: Some(up::parse_host_port(&args.admin)?),
    };
    let yaml = render::render_envoy(&up::render_options(&config, overrides));
    match args.out {
        Some(path) => std::fs::write(&path, yaml)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display())),
        None => Ok(stdout::print(&yaml)?),
    }
}
