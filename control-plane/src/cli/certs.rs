//! `ai-router certs`: a CA and the sync channel's certificates, as files (see [`crate::tls`]).

use std::path::PathBuf;

use clap::Args;

use crate::stdout;
use crate::tls::issue::{self, IssueOptions};

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// The folder to write into (created). Run again over the same folder to rotate the leaves
    /// under the same CA.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// A name Envoy dials the control plane by (a DNS name or an IP), besides localhost,
    /// 127.0.0.1 and ::1; repeat for several.
    #[arg(long, value_name = "NAME")]
    san: Vec<String>,
    /// Envoys to issue client certificates for: 1 writes DIR/envoy/, more DIR/envoy-1/ ...
    #[arg(long, value_name = "N", default_value_t = 1)]
    envoys: u32,
    /// The folder as Envoy sees it (where it is mounted), named in the SDS files; default:
    /// each Envoy folder's own path.
    #[arg(long, value_name = "PATH")]
    envoy_dir: Option<String>,
    /// Issue a new CA even if DIR holds one (every peer then needs the new ca.pem).
    #[arg(long)]
    new_ca: bool,
}

pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    let issued = issue::issue(&IssueOptions {
        out: args.out,
        sans: args.san,
        envoys: args.envoys,
        envoy_dir: args.envoy_dir,
        new_ca: args.new_ca,
    })?;
    Ok(stdout::print_line(&serde_json::to_string(&issued)?)?)
}
