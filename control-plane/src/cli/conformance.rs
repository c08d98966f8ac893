//! `ai-router conformance`: drive a running gateway through every provider fault and judge
//! what its client sees (see [`crate::conformance`]). Prints one line per case (`--json`: one
//! JSON object per case, then a summary object); fails when any case is wrong.

use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::json;

use crate::conformance::{self, Kind, Mode, Models, Options, Settings};
use crate::stdout;

#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// The gateway's public base URL (http://127.0.0.1:8080).
    #[arg(long, value_name = "URL")]
    url: String,
    /// The virtual key; prefer --key-env, which keeps it out of the process list.
    #[arg(long, value_name = "KEY", conflicts_with = "key_env")]
    key: Option<String>,
    /// The variable holding the virtual key.
    #[arg(long, value_name = "NAME", default_value = "STARCI_AI_KEY")]
    key_env: String,
    /// The fault mock's base URL (`ai-router mock`, the provider of the faulted lanes).
    #[arg(long, value_name = "URL")]
    mock: String,
    /// How long a stall lasts (ms); must be past the pool's timeoutMs.
    #[arg(long, value_name = "MS", default_value_t = 2500)]
    stall_ms: u64,
    /// Only the faults whose name contains one of these (comma-separated).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    only: Vec<String>,
    /// The provider kinds of the faulted lanes.
    #[arg(
        long,
        value_name = "KINDS",
        value_delimiter = ',',
        default_value = "openai,anthropic"
    )]
    kinds: Vec<KindArg>,
    /// With a healthy lane behind the faulted one (failover), without (alone), or both.
    #[arg(
        long,
        value_name = "MODES",
        value_delimiter = ',',
        default_value = "failover,alone"
    )]
    modes: Vec<ModeArg>,
    /// The pool's model with an OpenAI lane on the fault mock.
    #[arg(long, default_value = "conformance-openai")]
    openai_model: String,
    /// The pool's model with an Anthropic lane on the fault mock.
    #[arg(long, default_value = "conformance-anthropic")]
    anthropic_model: String,
    /// The pool's model whose lane's provider does not listen.
    #[arg(long, default_value = "conformance-refused")]
    refused_model: String,
    /// Appended to each model for its profile without fallback and with one attempt.
    #[arg(long, default_value = "-alone")]
    alone_suffix: String,
    /// How long to wait for a faulted lane an earlier case put on hold (ms).
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    hold_wait_ms: u64,
    /// One JSON object per case, then a summary.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum KindArg {
    Openai,
    Anthropic,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Failover,
    Alone,
}

pub async fn run(args: ConformanceArgs) -> anyhow::Result<()> {
    let key = match args.key {
        Some(key) => key,
        None => std::env::var(&args.key_env).with_context(|| {
            format!(
                "no virtual key: set {} (or pass --key-env NAME)",
                args.key_env
            )
        })?,
    };
    let opts = Options {
        url: args.url,
        key,
        mock: args.mock,
        models: Models {
            openai: args.openai_model,
            anthropic: args.anthropic_model,
            refused: args.refused_model,
            alone_suffix: args.alone_suffix,
        },
        settings: Settings {
            stall_ms: args.stall_ms,
        },
        only: args.only,
        kinds: args
            .kinds
            .iter()
            .map(|kind| match kind {
                KindArg::Openai => Kind::Openai,
                KindArg::Anthropic => Kind::Anthropic,
            })
            .collect(),
        modes: args
            .modes
            .iter()
            .map(|mode| match mode {
                ModeArg::Failover => Mode::Failover,
                ModeArg::Alone => Mode::Alone,
            })
            .collect(),
        hold_wait: Duration::from_millis(args.hold_wait_ms),
    };
    let json_lines = args.json;
    let mut print_error = None;
    let outcomes = conformance::run(&opts, |outcome| {
        let line = if json_lines {
            serde_json::to_string(outcome).unwrap_or_default()
        } else {
            outcome.line()
        };
        if let Err(error) = stdout::print_line(&line) {
            print_error.get_or_insert(error);
        }
    })
    .await?;
    if let Some(error) = print_error {
        return Err(error.into());
    }
    let failed = outcomes.iter().filter(|outcome| !outcome.ok).count();
    let passed = outcomes.len() - failed;
    let summary = if json_lines {
        json!({"summary": {"passed": passed, "failed": failed}}).to_string()
    } else {
        format!("{passed} case(s) right, {failed} wrong")
    };
    stdout::print_line(&summary)?;
    if outcomes.is_empty() {
        bail!("no case selected");
    }
    if failed > 0 {
        bail!("{failed} of {} case(s) handled wrongly", outcomes.len());
    }
    Ok(())
}
