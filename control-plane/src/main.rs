//! `ai-router`: the control plane, the mock provider, the Envoy renderer and the local runner.
//! Thin: parses the command line and calls the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use ai_router_control_plane::config::secrets::{Env, ProcessEnv};
use ai_router_control_plane::{config, keys_cli, mock, render, serve, stdout, up};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "ai-router",
    version,
    about = "An OpenAI-compatible gateway over many providers: Envoy + a wasm filter + this control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the control plane: HTTP /health and the gRPC Sync service Envoy watches.
    Serve {
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
    },
    /// Manage the gateway's virtual keys: on the config's sqlite key store (--config) or
    /// through a running control plane (--url). Prints JSON.
    Keys(keys_cli::KeysArgs),
    /// Run the scriptable fake provider.
    Mock {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// A script to load at start (JSON for .json, YAML otherwise).
        #[arg(long, value_name = "FILE")]
        script: Option<PathBuf>,
    },
    /// Print (or write) the Envoy bootstrap for a pool.
    RenderEnvoy {
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
    },
    /// Run control plane + Envoy (+ the mock when no provider key is set) locally.
    Up {
        /// Default: examples/pool.yaml when present.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        #[arg(long, value_name = "PATH")]
        wasm: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("ai-router: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ai-router: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve {
            config,
            http_listen,
            grpc_listen,
            insecure_trusted_sync,
        } => {
            serve::serve(serve::ServeOptions {
                config,
                http_listen,
                grpc_listen,
                insecure_trusted_sync,
            })
            .await
        }
        Command::Mock { host, port, script } => {
            mock::run(mock::MockOptions { host, port, script }).await
        }
        Command::RenderEnvoy {
            config,
            control_plane,
            wasm,
            listen,
            admin,
            out,
        } => {
            let env: Arc<dyn Env> = Arc::new(ProcessEnv);
            let config = config::load(&config, env.as_ref())?;
            let overrides = up::RenderOverrides {
                control_plane: control_plane
                    .as_deref()
                    .map(up::parse_host_port)
                    .transpose()?,
                wasm: Some(wasm),
                listen: listen.as_deref().map(up::parse_host_port).transpose()?,
                admin: Some(up::parse_host_port(&admin)?),
            };
            let yaml = render::render_envoy(&up::render_options(&config, overrides));
            match out {
                Some(path) => std::fs::write(&path, yaml)
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display())),
                None => Ok(stdout::print(&yaml)?),
            }
        }
        Command::Up { config, wasm } => up::up(up::UpOptions { config, wasm }).await,
        Command::Keys(args) => match keys_cli::run(args).await {
            Ok(value) => Ok(stdout::print_line(&serde_json::to_string_pretty(&value)?)?),
            Err(err) => {
                stdout::print_line(&err.openai_body().to_string())?;
                Err(anyhow::anyhow!("{}", err.message))
            }
        },
    }
}
