//! `ai-router admin-tokens create|list|revoke`: the scoped admin tokens
//! ([`crate::keys::admin_tokens`]).
//!
//! Like `ai-router keys`: on the config's durable key store directly (`--config FILE`, SQLite or
//! Postgres; a running control plane sees the change at the next call), or through a running
//! control plane's admin API (`--url`, with an `admin` token from `AI_ROUTER_ADMIN_TOKEN` or the
//! variable `--admin-token-env` names). Prints one JSON document: `{ token, secret }` (`create`:
//! the only output with the token), `{ tokens }` (`list`), the token (`revoke`), or an error
//! object (and a non-zero exit).

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::api::admin::ADMIN_TOKEN_ENV;
use crate::api::error::{ApiError, ErrorCode};
use crate::cli::keys::{admin_token, Remote};
use crate::clock::{Clock, SystemClock};
use crate::config::secrets::{Env, ProcessEnv};
use crate::config::{self, StoreSpec};
use crate::keys::admin_tokens::{self, Scope, TokenSpec};

#[derive(Debug, Clone, Args)]
pub struct AdminTokensArgs {
    #[command(subcommand)]
    pub command: AdminTokensCommand,
    /// Work on this config's key store directly (sqlite or postgres).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Work through a running control plane's admin API (http://host:8081).
    #[arg(long, global = true, value_name = "URL", conflicts_with = "config")]
    pub url: Option<String>,
    /// The variable holding an `admin` token for --url.
    #[arg(long, global = true, value_name = "NAME", default_value = ADMIN_TOKEN_ENV)]
    pub admin_token_env: String,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AdminTokensCommand {
    /// Issue a token; prints { token, secret } (the token is shown this once).
    Create {
        /// read, operate, keys or admin (each includes the ones before).
        #[arg(long, value_parser = parse_scope)]
        scope: Scope,
        /// Lowercase letters, digits, _ or -; unique among the tokens not revoked.
        #[arg(long)]
        label: String,
        /// A duration (90m, 12h, 30d, 2w) or an RFC 3339 time; absent: no end.
        #[arg(long, value_name = "DURATION|RFC3339")]
        expires: Option<String>,
    },
    /// Every token: label, scope, created, expires, last used, revoked (never the token).
    List,
    /// Revoke a token for good, by label or id.
    Revoke {
        #[arg(value_name = "LABEL|ID")]
        token: String,
    },
}

fn parse_scope(text: &str) -> Result<Scope, String> {
    Scope::parse(text).ok_or_else(|| "one of read, operate, keys, admin".to_owned())
}

/// Runs the command; `Ok` holds what to print, `Err` the error object to print.
pub async fn run(args: AdminTokensArgs) -> Result<Value, ApiError> {
    let env: Arc<dyn Env> = Arc::new(ProcessEnv);
    if let Some(url) = &args.url {
        let token = admin_token(env.as_ref(), &args.admin_token_env)?;
        return remote(&Remote::new(url, token)?, args.command).await;
    }
    let Some(path) = &args.config else {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "give --config FILE (a sqlite or postgres key store) or --url http://host:8081 (a running control plane)",
        ));
    };
    let config = config::load(path, env.as_ref())
        .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.to_string()))?;
    if config.gateway.key_store == StoreSpec::Memory {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "the config's key store is { type: memory }: it lives in the running control plane; \
             use --url http://host:8081",
        ));
    }
    let spec = config.gateway.key_store.clone();
    let migration_wait = config.store_start_wait;
    let command = args.command;
    tokio::task::spawn_blocking(move || {
        let store = crate::keys::open(&spec, env.as_ref(), migration_wait)?;
        let now = SystemClock.now_ms();
        let answer = match command {
            AdminTokensCommand::Create {
                scope,
                label,
                expires,
            } => {
                let created = admin_tokens::create(
                    store.as_ref(),
                    TokenSpec {
                        label,
                        scope,
                        expires,
                    },
                    now,
                )?;
                tracing::info!(label = %created.token.label, scope = %scope, "admin token created");
                to_json(created)?
            }
            AdminTokensCommand::List => {
                json!({ "object": "list", "tokens": admin_tokens::list(store.as_ref(), now)? })
            }
            AdminTokensCommand::Revoke { token } => {
                let revoked = admin_tokens::revoke(store.as_ref(), &token, now)?;
                tracing::info!(label = %revoked.label, "admin token revoked");
                to_json(revoked)?
            }
        };
        Ok(answer)
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?
}

fn to_json(value: impl serde::Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(value).map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
}

async fn remote(api: &Remote, command: AdminTokensCommand) -> Result<Value, ApiError> {
    use reqwest::Method;
    match command {
        AdminTokensCommand::Create {
            scope,
            label,
            expires,
        } => {
            let body = json!({ "label": label, "scope": scope, "expires": expires });
            api.call(Method::POST, "/admin/tokens", Some(body)).await
        }
        AdminTokensCommand::List => api.call(Method::GET, "/admin/tokens", None).await,
        AdminTokensCommand::Revoke { token } => {
            api.call(Method::DELETE, &format!("/admin/tokens/{token}"), None)
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(Debug, Subcommand)]
    enum Top {
        AdminTokens(AdminTokensArgs),
    }

    fn parse(args: &[&str]) -> Result<AdminTokensArgs, clap::Error> {
        let mut argv = vec!["ai-router", "admin-tokens"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Top::AdminTokens(a) => a,
        })
    }

    #[test]
    fn create_list_revoke() -> Result<(), clap::Error> {
        let args = parse(&[
            "create",
            "--scope",
            "operate",
            "--label",
            "oncall",
            "--expires",
            "30d",
            "--config",
            "pool.yaml",
        ])?;
        assert_eq!(args.config, Some(PathBuf::from("pool.yaml")));
        assert!(matches!(
            args.command,
            AdminTokensCommand::Create { scope: Scope::Operate, ref label, expires: Some(ref e) }
                if label == "oncall" && e == "30d"
        ));
        assert!(parse(&["create", "--scope", "root", "--label", "x"]).is_err());
        assert!(
            parse(&["create", "--label", "x"]).is_err(),
            "a scope is needed"
        );
        let args = parse(&["list", "--url", "http://cp:8081"])?;
        assert!(matches!(args.command, AdminTokensCommand::List));
        let args = parse(&["revoke", "oncall"])?;
        assert!(
            matches!(args.command, AdminTokensCommand::Revoke { ref token } if token == "oncall")
        );
        Ok(())
    }
}
