//! The `ai-router` command line: one file per command; `main.rs` only calls [`main`].

pub mod admin;
pub mod admin_tokens;
pub mod certs;
pub mod conformance;
pub mod drain;
pub mod keys;
pub mod mock;
pub mod prices;
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
    /// How stderr's log lines look: `text` for people, `json` (one object per line) for
    /// collectors; `auto` is text on a terminal, JSON otherwise. The level comes from
    /// RUST_LOG (default info).
    #[arg(
        long,
        global = true,
        value_enum,
        env = "AI_ROUTER_LOG_FORMAT",
        default_value = "auto"
    )]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Auto,
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the control plane: HTTP /health and the gRPC Sync service Envoy watches.
    Serve(serve::ServeArgs),
    /// Manage the gateway's virtual keys: on the config's sqlite key store (--config) or
    /// through a running control plane (--url). Prints JSON.
    Keys(keys::KeysArgs),
    /// Manage the scoped admin tokens (read, operate, keys, admin): on the config's key store
    /// (--config) or through a running control plane (--url). Prints JSON.
    AdminTokens(admin_tokens::AdminTokensArgs),
    /// Run the scriptable fake provider.
    Mock(mock::MockArgs),
    /// Issue a CA and the sync channel's certificates (the control plane's, one per Envoy)
    /// as files, keys 0600; again over the same folder, new leaves under the same CA.
    Certs(certs::CertsArgs),
    /// Print (or write) the Envoy bootstrap for a pool.
    RenderEnvoy(render_envoy::RenderEnvoyArgs),
    /// Run control plane + Envoy (+ the mock when no provider key is set) locally.
    Up(up::UpArgs),
    /// Make an Envoy safe to stop (a pre-stop hook): stop its public listener, wait for the
    /// calls in flight and for every outcome to reach a control plane. Prints JSON.
    Drain(drain::DrainArgs),
    /// Close breakers, lift blacklists and cooldowns, clear headroom: of every provider, of one
    /// (--provider) or of one key (--provider --key), in the control plane and every Envoy at
    /// once. Through a running control plane (--url). Prints JSON.
    Reset(admin::ResetArgs),
    /// Print the operator's events of a running control plane (--url), one JSON line each,
    /// until interrupted.
    Events(admin::EventsArgs),
    /// Print a running control plane's health (--url): breakers, keys out, cooldowns,
    /// headroom, budgets, lane latency.
    Health(admin::RemoteArgs),
    /// Print a running control plane's counters since start (--url).
    Stats(admin::RemoteArgs),
    /// Print the pool's profiles and models as callers see them (--url).
    Catalog(admin::RemoteArgs),
    /// Print what each provider budget (billing scope) has left per window, with where each
    /// figure comes from (--url).
    Ledger(admin::RemoteArgs),
    /// Print the bundled price table `autoPrice` fills costs from, or one model's row, as JSON.
    Prices(prices::PricesArgs),
    /// Drive a running gateway (--url) through every provider fault, with a fault mock
    /// (--mock) as the faulted lanes' provider, and judge what the client saw.
    Conformance(conformance::ConformanceArgs),
}

/// Parses the command line, sets up logging (stderr) and the runtime, and runs the command.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    let json = match cli.log_format {
        LogFormat::Auto => !terminal,
        LogFormat::Text => false,
        LogFormat::Json => true,
    };
    if json {
        tracing_subscriber::fmt()
            .json()
            .with_writer(std::io::stderr)
            .with_env_filter(filter())
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(terminal)
            .with_env_filter(filter())
            .init();
    }
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
        Command::Certs(args) => certs::run(args),
        Command::Up(args) => up::run(args).await,
        Command::Drain(args) => drain::run(args).await,
        Command::Reset(args) => print_answer(admin::reset(args).await),
        Command::Health(args) => print_answer(admin::show(args, "/admin/health").await),
        Command::Stats(args) => print_answer(admin::show(args, "/admin/stats").await),
        Command::Catalog(args) => print_answer(admin::show(args, "/admin/catalog").await),
        Command::Ledger(args) => print_answer(admin::show(args, "/admin/ledger").await),
        Command::Events(args) => match admin::events(args).await {
            Ok(()) => Ok(()),
            Err(err) => print_answer(Err(err)),
        },
        Command::Keys(args) => print_answer(keys::run(args).await),
        Command::AdminTokens(args) => print_answer(admin_tokens::run(args).await),
        Command::Prices(args) => prices::run(args),
        Command::Conformance(args) => conformance::run(args).await,
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
