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
    /// Envoy's admin interface: a loopback address only (it has no authentication, can stop
    /// Envoy and can turn on the debug log, which prints every secret in the headers).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9901")]
    admin: String,
    /// Speak mutual TLS to the control plane, reading the client certificate and the CA through
    /// the SDS files `ai-router certs` wrote into this folder (the path as Envoy sees it, e.g.
    /// where the folder is mounted); they are re-read when a file is moved into the folder.
    #[arg(long, value_name = "DIR", env = "AI_ROUTER_SYNC_TLS_DIR")]
    sync_tls_dir: Option<String>,
    /// Write the YAML here instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// `--admin`, refused unless it is a loopback address.
fn admin_address(value: &str) -> anyhow::Result<(String, u16)> {
    let (host, port) = up::parse_host_port(value)?;
    if !render::admin_host_is_loopback(&host) {
        anyhow::bail!(
            "--admin {value}: Envoy's admin interface binds loopback only (127.0.0.1, [::1] or \
             localhost): it has no authentication, and whoever reaches it can stop Envoy or turn \
             on the debug log, which prints every secret in the headers. Reach it from another \
             host through an SSH tunnel or `docker exec`"
        );
    }
    Ok((host, port))
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
        admin: Some(admin_address(&args.admin)?),
        sync_tls_dir: args.sync_tls_dir,
    };
    let yaml = render::render_envoy(&up::render_options(&config, overrides));
    match args.out {
        Some(path) => std::fs::write(&path, yaml)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display())),
        None => Ok(stdout::print(&yaml)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_must_be_loopback() {
        assert_eq!(
            admin_address("127.0.0.1:9901").unwrap(),
            ("127.0.0.1".to_owned(), 9901)
        );
        assert_eq!(admin_address("[::1]:0").unwrap(), ("::1".to_owned(), 0));
        for value in ["0.0.0.0:9901", "[::]:9901", "envoy:9901"] {
            let message = admin_address(value).unwrap_err().to_string();
            assert!(
                message.contains("loopback only") && message.contains(value),
                "{message}"
            );
        }
    }
}
