//! `ai-router reset`: operations on a running control plane's admin API (`--url`, the admin
//! token from `AI_ROUTER_ADMIN_TOKEN` or the variable `--admin-token-env` names). Prints JSON.

use clap::Args;
use serde_json::{json, Value};

use super::keys::{admin_token, Remote};
use crate::api::admin::ADMIN_TOKEN_ENV;
use crate::api::error::ApiError;
use crate::config::secrets::ProcessEnv;

#[derive(Debug, Clone, Args)]
pub struct RemoteArgs {
    /// The control plane's admin API (http://host:8081).
    #[arg(long, value_name = "URL")]
    pub url: String,
    /// The variable holding the admin token.
    #[arg(long, value_name = "NAME", default_value = ADMIN_TOKEN_ENV)]
    pub admin_token_env: String,
}

impl RemoteArgs {
    fn remote(&self) -> Result<Remote, ApiError> {
        Remote::new(&self.url, admin_token(&ProcessEnv, &self.admin_token_env)?)
    }
}

#[derive(Debug, Clone, Args)]
pub struct ResetArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Only this provider (and its keys); every provider when absent.
    #[arg(long, value_name = "ID")]
    pub provider: Option<String>,
    /// Only this key of --provider (by alias).
    #[arg(long, value_name = "ALIAS", requires = "provider")]
    pub key: Option<String>,
}

/// Closes breakers, lifts blacklists and cooldowns and clears headroom; prints what it cleared.
pub async fn reset(args: ResetArgs) -> Result<Value, ApiError> {
    let mut body = json!({});
    if let Some(p) = &args.provider {
        body["provider"] = json!(p);
    }
    if let Some(k) = &args.key {
        body["key"] = json!(k);
    }
    args.remote
        .remote()?
        .call(reqwest::Method::POST, "/admin/reset", Some(body))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        reset: ResetArgs,
    }

    #[test]
    fn a_key_needs_its_provider() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["reset"], args].concat());
        let all = parse(&["--url", "http://x:8081"]).map(|c| c.reset);
        assert!(all
            .as_ref()
            .is_ok_and(|r| r.provider.is_none() && r.key.is_none()));
        let one = parse(&["--url", "http://x", "--provider", "p", "--key", "k"]).map(|c| c.reset);
        assert!(
            one.is_ok_and(|r| r.provider.as_deref() == Some("p") && r.key.as_deref() == Some("k"))
        );
        assert!(parse(&["--url", "http://x", "--key", "k"]).is_err());
        assert!(parse(&["--provider", "p"]).is_err(), "--url is required");
    }
}
