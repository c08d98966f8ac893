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
    /// The control plane's gRPC address (default: controlPlane.host and grpcPort); several,
    /// comma-separated, for control planes sharing Redis and Postgres: the Envoy syncs from the
    /// first that answers and fails over to another when its stream breaks.
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT...]")]
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
    let mut control_planes = args
        .control_plane
        .as_deref()
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(up::parse_host_port)
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .transpose()?
        .unwrap_or_default()
        .into_iter();
    let overrides = up::RenderOverrides {
        control_plane: control_planes.next(),
        more_control_planes: control_planes.collect(),
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
