//! The `ai-router` command line: one file per command; `main.rs` only calls [`main`].

pub mod admin;
pub mod keys;
pub mod mock;
pub mod render_envoy;
pub mod serve;
pub mod up;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::stdout;

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
    Serve(serve::ServeArgs),
    /// Manage the gateway's virtual keys: on the config's sqlite key store (--config) or
    /// through a running control plane (--url). Prints JSON.
    Keys(keys::KeysArgs),
    /// Run the scriptable fake provider.
    Mock(mock::MockArgs),
    /// Print (or write) the Envoy bootstrap for a pool.
    RenderEnvoy(render_envoy::RenderEnvoyArgs),
    /// Run control plane + Envoy (+ the mock when no provider key is set) locally.
    Up(up::UpArgs),
    /// Close breakers, lift blacklists and cooldowns, clear headroom: of every provider, of one
    /// (--provider) or of one key (--provider --key), in the control plane and every Envoy at
    /// once. Through a running control plane (--url). Prints JSON.
    Reset(admin::ResetArgs),
}

/// Parses the command line, sets up logging (stderr) and the runtime, and runs the command.
pub fn main() -> ExitCode {
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
        Command::Serve(args) => serve::run(args).await,
        Command::Mock(args) => mock::run(args).await,
        Command::RenderEnvoy(args) => render_envoy::run(args),
        Command::Up(args) => up::run(args).await,
        Command::Reset(args) => print_answer(admin::reset(args).await),
        Command::Keys(args) => print_answer(keys::run(args).await),
    }
}

/// Prints an admin answer as JSON, or the error object (then fails).
fn print_answer(
    answer: Result<serde_json::Value, crate::api::error::ApiError>,
) -> anyhow::Result<()> {
    match answer {
        Ok(value) => Ok(stdout::print_line(&serde_json::to_string_pretty(&value)?)?),
        Err(err) => {
            stdout::print_line(&err.openai_body().to_string())?;
            Err(anyhow::anyhow!("{}", err.message))
        }
    }
}
