//! `ai-router health|stats|catalog|ledger|reset|events`: operations on a running control plane's admin API (`--url`, the admin
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

/// `GET` one admin page (`/admin/health`, `/admin/stats`, `/admin/catalog`).
pub async fn show(args: RemoteArgs, path: &str) -> Result<Value, ApiError> {
    args.remote()?.call(reqwest::Method::GET, path, None).await
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

#[derive(Debug, Clone, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Only these types, comma-separated (attempt, request, breaker, key-disabled,
    /// key-restored); all when absent.
    #[arg(long, value_name = "LIST")]
    pub types: Option<String>,
}

/// Prints every event as one JSON line until interrupted (or the control plane stops).
pub async fn events(args: EventsArgs) -> Result<(), ApiError> {
    let path = match &args.types {
        Some(t) => format!("/admin/events?types={}", urlencode(t)),
        None => "/admin/events".to_owned(),
    };
    let mut response = args.remote.remote()?.stream(&path).await?;
    let mut pending = Vec::new();
    loop {
        let chunk = response.chunk().await.map_err(|e| {
            ApiError::new(
                crate::api::error::ErrorCode::Unavailable,
                format!("the event stream broke: {e}"),
            )
        })?;
        let Some(chunk) = chunk else {
            return Ok(());
        };
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(data) = line.trim_end().strip_prefix("data:") {
                crate::stdout::print_line(data.trim_start()).map_err(|e| {
                    ApiError::new(crate::api::error::ErrorCode::Internal, e.to_string())
                })?;
            }
        }
    }
}

/// Percent-encodes what a query value may not hold as is.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b',' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
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
