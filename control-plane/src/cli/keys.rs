//! `ai-router keys create|list|get|update|revoke|rotate|usage`.
//!
//! Runs on the config's durable key store directly (`--config FILE`, a `{ type: sqlite }` store:
//! a running control plane picks the change up within a second), or through a running control
//! plane's admin API (`--url http://host:8081`, the admin token from `AI_ROUTER_ADMIN_TOKEN` or
//! the variable `--admin-token-env` names). A `{ type: memory }` store lives inside the running
//! process, so it needs `--url`.
//!
//! Every command prints one JSON document on stdout: the key (`get`, `update`, `revoke`),
//! `{ key, secret }` (`create`, `rotate`: the only outputs with a secret; `create --count N`
//! with N > 1 prints `{ object: "list", keys: [{ key, secret }, ...] }`), `{ keys }` (`list`),
//! the usage report (`usage`), or an OpenAI error object (and a non-zero exit) when it fails.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::api::admin::ADMIN_TOKEN_ENV;
use crate::api::error::{ApiError, ErrorCode};
use crate::clock::SystemClock;
use crate::config::secrets::{Env, ProcessEnv};
use crate::config::{self, QuotaConfig, StoreSpec};
use crate::keys::mounted;
use crate::keys::operations::{KeyAdmin, KeyPatch, KeySpec, QuotaPatch};

#[derive(Debug, Clone, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub command: KeysCommand,
    /// Work on this config's key store directly (a sqlite store).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Work through a running control plane's admin API (http://host:8081).
    #[arg(long, global = true, value_name = "URL", conflicts_with = "config")]
    pub url: Option<String>,
    /// The variable holding the admin token for --url.
    #[arg(long, global = true, value_name = "NAME", default_value = ADMIN_TOKEN_ENV)]
    pub admin_token_env: String,
}

#[derive(Debug, Clone, Subcommand)]
pub enum KeysCommand {
    /// Issue a key; prints { key, secret } (the secret is shown this once).
    Create(CreateArgs),
    /// Every key, mounted ones included (never a secret).
    List,
    /// One key.
    Get { id: String },
    /// Change a key's bindings.
    Update {
        id: String,
        #[command(flatten)]
        bindings: Bindings,
    },
    /// Revoke a key for good.
    Revoke { id: String },
    /// A new secret for the same key; prints { key, secret }.
    Rotate { id: String },
    /// Day rows and totals (default: this month).
    Usage {
        id: String,
        /// YYYY-MM-DD (default: the first of this month).
        #[arg(long)]
        from: Option<String>,
        /// YYYY-MM-DD (default: today, UTC).
        #[arg(long)]
        to: Option<String>,
    },
}

#[derive(Debug, Clone, Args)]
pub struct CreateArgs {
    /// Lowercase letters, digits and _; part of the secret.
    #[arg(long)]
    pub label: String,
    /// Issue this many keys with the same label and bindings (the benchmark provisions 10,000
    /// this way: with --config each costs one insert).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub count: u32,
    #[command(flatten)]
    pub bindings: Bindings,
}

#[derive(Debug, Clone, Default, Args)]
pub struct Bindings {
    /// Who holds the key (free text; empty clears it on update).
    #[arg(long)]
    pub owner: Option<String>,
    /// Profiles it may call, comma separated, or *.
    #[arg(long, value_delimiter = ',')]
    pub profiles: Option<Vec<String>>,
    /// Pool models (ids or aliases) it may call directly, comma separated, or *.
    #[arg(long, value_delimiter = ',')]
    pub models: Option<Vec<String>>,
    /// Requests per UTC minute.
    #[arg(long, value_name = "N")]
    pub rpm: Option<u64>,
    /// Prompt plus completion tokens per UTC day.
    #[arg(long, value_name = "N")]
    pub tokens_per_day: Option<u64>,
    /// Estimated cost per UTC day.
    #[arg(long, value_name = "X")]
    pub cost_per_day: Option<f64>,
    /// Estimated cost per UTC month.
    #[arg(long, value_name = "X")]
    pub cost_per_month: Option<f64>,
    /// Pin every call to the profile's or the named model.
    #[arg(long, conflicts_with = "allow_fallback")]
    pub no_fallback: bool,
    /// Allow fallbacks again (update).
    #[arg(long)]
    pub allow_fallback: bool,
    #[arg(long, conflicts_with = "disabled")]
    pub enabled: bool,
    /// A disabled key answers 401 until enabled.
    #[arg(long)]
    pub disabled: bool,
    /// The response cache for the key's calls, over the policy's `cache`.
    #[arg(long, value_name = "true|false")]
    pub cache: Option<bool>,
}

impl Bindings {
    fn list(values: &Option<Vec<String>>) -> Option<Vec<String>> {
        values.as_ref().map(|v| {
            v.iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
    }

    fn has_quota(&self) -> bool {
        self.rpm.is_some()
            || self.tokens_per_day.is_some()
            || self.cost_per_day.is_some()
            || self.cost_per_month.is_some()
    }

    /// The limits the quota flags name.
    fn quota(&self) -> QuotaConfig {
        QuotaConfig {
            requests_per_minute: self.rpm,
            tokens_per_day: self.tokens_per_day,
            cost_per_day: self.cost_per_day,
            cost_per_month: self.cost_per_month,
        }
    }

    fn allow_fallback(&self) -> Option<bool> {
        if self.no_fallback {
            Some(false)
        } else if self.allow_fallback {
            Some(true)
        } else {
            None
        }
    }

    fn enabled(&self) -> Option<bool> {
        if self.disabled {
            Some(false)
        } else if self.enabled {
            Some(true)
        } else {
            None
        }
    }

    pub fn spec(&self, label: &str) -> KeySpec {
        KeySpec {
            label: label.to_owned(),
            owner: self.owner.clone(),
            profiles: Self::list(&self.profiles).unwrap_or_default(),
            models: Self::list(&self.models).unwrap_or_default(),
            allow_fallback: self.allow_fallback(),
            quota: self.has_quota().then(|| self.quota()),
            enabled: self.enabled(),
            cache: self.cache,
        }
    }

    /// The change the flags ask for (quota flags change only the limits they name: the store
    /// merges them into the key's).
    pub fn patch(&self) -> KeyPatch {
        KeyPatch {
            owner: self.owner.clone(),
            profiles: Self::list(&self.profiles),
            models: Self::list(&self.models),
            allow_fallback: self.allow_fallback(),
            quota: self
                .has_quota()
                .then(|| Some(QuotaPatch::setting(&self.quota()))),
            enabled: self.enabled(),
            cache: self.cache.map(Some),
        }
    }
}

/// Runs the command; `Ok` holds what to print, `Err` the error object to print.
pub async fn run(args: KeysArgs) -> Result<Value, ApiError> {
    let env: Arc<dyn Env> = Arc::new(ProcessEnv);
    if let Some(url) = &args.url {
        let token = admin_token(env.as_ref(), &args.admin_token_env)?;
        return Remote::new(url, token)?.run(args.command).await;
    }
    let Some(path) = &args.config else {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "give --config FILE (a sqlite key store) or --url http://host:8081 (a running control plane)",
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
    // Mounted keys are listed and protected; a mount that does not resolve in this shell is
    // simply not known here.
    let mounted = mounted::mounted_keys(&config, env.as_ref()).unwrap_or_default();
    let spec = config.gateway.key_store.clone();
    let migration_wait = config.store_start_wait;
    let names = config.names.clone();
    let command = args.command;
    tokio::task::spawn_blocking(move || {
        let store = crate::keys::open(&spec, env.as_ref(), migration_wait)?;
        let keys = KeyAdmin::new(store, mounted, Arc::new(SystemClock)).with_pool(names);
        local(&keys, command)
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?
}

fn to_json(value: impl serde::Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(value).map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
}

fn local(keys: &KeyAdmin, command: KeysCommand) -> Result<Value, ApiError> {
    match command {
        KeysCommand::Create(args) if args.count > 1 => {
            let spec = args.bindings.spec(&args.label);
            let created = (0..args.count)
                .map(|_| keys.create(spec.clone()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(json!({ "object": "list", "keys": to_json(created)? }))
        }
        KeysCommand::Create(args) => to_json(keys.create(args.bindings.spec(&args.label))?),
        KeysCommand::List => Ok(json!({ "object": "list", "keys": keys.list()? })),
        KeysCommand::Get { id } => to_json(keys.get(&id)?),
        KeysCommand::Update { id, bindings } => to_json(keys.update(&id, bindings.patch())?),
        KeysCommand::Revoke { id } => to_json(keys.revoke(&id)?),
        KeysCommand::Rotate { id } => to_json(keys.rotate(&id)?),
        KeysCommand::Usage { id, from, to } => {
            to_json(keys.usage(&id, from.as_deref(), to.as_deref())?)
        }
    }
}

/// The admin token for `--url`, from the variable `name`.
pub(crate) fn admin_token(env: &dyn Env, name: &str) -> Result<String, ApiError> {
    env.var(name)
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::MissingApiKey,
                format!(
                    "--url needs the admin token in {name} (or name another variable with --admin-token-env)"
                ),
            )
        })
}

/// The admin API of a running control plane.
pub(crate) struct Remote {
    base: String,
    token: String,
    client: reqwest::Client,
}

impl Remote {
    pub(crate) fn new(url: &str, token: String) -> Result<Self, ApiError> {
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
        Ok(Self {
            base: url.trim_end_matches('/').to_owned(),
            token,
            client,
        })
    }

    /// A `GET` whose answer streams (server-sent events): no overall timeout, only one to
    /// connect.
    pub(crate) async fn stream(&self, path: &str) -> Result<reqwest::Response, ApiError> {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
        let response = client
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| {
                ApiError::new(
                    ErrorCode::Unavailable,
                    format!("cannot reach the control plane: {e}"),
                )
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let value: Value = response.json().await.unwrap_or(Value::Null);
        Err(remote_error(status.as_u16(), &value))
    }

    /// One call of the admin API (`path` from `/admin/...`).
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ApiError> {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| {
            ApiError::new(
                ErrorCode::Unavailable,
                format!("cannot reach the control plane: {e}"),
            )
        })?;
        let status = response.status();
        let value: Value = response.json().await.map_err(|e| {
            ApiError::new(
                ErrorCode::Internal,
                format!("the control plane answered {status} without JSON: {e}"),
            )
        })?;
        if status.is_success() {
            Ok(value)
        } else {
            Err(remote_error(status.as_u16(), &value))
        }
    }

    async fn run(&self, command: KeysCommand) -> Result<Value, ApiError> {
        use reqwest::Method;
        let keys = |path: &str| format!("/admin/keys{path}");
        match command {
            KeysCommand::Create(args) => {
                let spec = to_json(args.bindings.spec(&args.label))?;
                if args.count == 1 {
                    return self.call(Method::POST, &keys(""), Some(spec)).await;
                }
                let mut created = Vec::new();
                for _ in 0..args.count {
                    created.push(
                        self.call(Method::POST, &keys(""), Some(spec.clone()))
                            .await?,
                    );
                }
                Ok(json!({ "object": "list", "keys": created }))
            }
            KeysCommand::List => self.call(Method::GET, &keys(""), None).await,
            KeysCommand::Get { id } => self.call(Method::GET, &keys(&format!("/{id}")), None).await,
            KeysCommand::Update { id, bindings } => {
                let patch = to_json(bindings.patch())?;
                self.call(Method::PATCH, &keys(&format!("/{id}")), Some(patch))
                    .await
            }
            KeysCommand::Revoke { id } => {
                self.call(Method::POST, &keys(&format!("/{id}/revoke")), None)
                    .await
            }
            KeysCommand::Rotate { id } => {
                self.call(Method::POST, &keys(&format!("/{id}/rotate")), None)
                    .await
            }
            KeysCommand::Usage { id, from, to } => {
                let mut query = Vec::new();
                if let Some(from) = from {
                    query.push(format!("from={from}"));
                }
                if let Some(to) = to {
                    query.push(format!("to={to}"));
                }
                let query = if query.is_empty() {
                    String::new()
                } else {
                    format!("?{}", query.join("&"))
                };
                self.call(Method::GET, &keys(&format!("/{id}/usage{query}")), None)
                    .await
            }
        }
    }
}

/// The control plane's error object as an [`ApiError`] (its code when it is one of ours).
fn remote_error(status: u16, body: &Value) -> ApiError {
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or("the control plane refused the call")
        .to_owned();
    let code = match ErrorCode::parse(body["error"]["code"].as_str().unwrap_or("")) {
        Some(code) => code,
        None if status == 404 => ErrorCode::NotFound,
        None => ErrorCode::Internal,
    };
    ApiError::new(code, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::operations::KeyInfo;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(Debug, Subcommand)]
    enum Top {
        Keys(KeysArgs),
    }

    fn parse(args: &[&str]) -> Result<KeysArgs, clap::Error> {
        let mut argv = vec!["ai-router", "keys"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Top::Keys(k) => k,
        })
    }

    #[test]
    fn create_with_every_flag() -> Result<(), clap::Error> {
        let args = parse(&[
            "create",
            "--label",
            "lesson_app",
            "--owner",
            "team a",
            "--profiles",
            "lesson,work",
            "--models",
            "m1",
            "--rpm",
            "60",
            "--tokens-per-day",
            "1000",
            "--cost-per-day",
            "1.5",
            "--cost-per-month",
            "20",
            "--no-fallback",
            "--disabled",
            "--config",
            "pool.yaml",
        ])?;
        assert_eq!(args.config, Some(PathBuf::from("pool.yaml")));
        assert_eq!(args.admin_token_env, ADMIN_TOKEN_ENV);
        let KeysCommand::Create(create) = args.command else {
            panic!("not create");
        };
        assert_eq!(create.count, 1);
        let spec = create.bindings.spec(&create.label);
        assert_eq!(spec.label, "lesson_app");
        assert_eq!(spec.owner.as_deref(), Some("team a"));
        assert_eq!(spec.profiles, ["lesson", "work"]);
        assert_eq!(spec.models, ["m1"]);
        assert_eq!(spec.allow_fallback, Some(false));
        assert_eq!(spec.enabled, Some(false));
        let quota = spec.quota.unwrap_or_default();
        assert_eq!(quota.requests_per_minute, Some(60));
        assert_eq!(quota.tokens_per_day, Some(1000));
        assert_eq!(quota.cost_per_day, Some(1.5));
        assert_eq!(quota.cost_per_month, Some(20.0));
        Ok(())
    }

    #[test]
    fn the_other_commands() -> Result<(), clap::Error> {
        let args = parse(&[
            "rotate",
            "key_1a2b3c4d5e6f7a8b",
            "--url",
            "http://gateway:8081",
            "--admin-token-env",
            "MY_TOKEN",
        ])?;
        assert!(
            matches!(&args.command, KeysCommand::Rotate { id } if id == "key_1a2b3c4d5e6f7a8b")
        );
        assert_eq!(args.url.as_deref(), Some("http://gateway:8081"));
        assert_eq!(args.admin_token_env, "MY_TOKEN");
        let args = parse(&[
            "usage",
            "key_1",
            "--from",
            "2026-10-01",
            "--config",
            "p.yaml",
        ])?;
        assert!(
            matches!(&args.command, KeysCommand::Usage { id, from: Some(f), to: None } if id == "key_1" && f == "2026-10-01")
        );
        assert!(matches!(parse(&["list"])?.command, KeysCommand::List));
        assert!(matches!(
            parse(&["revoke", "k"])?.command,
            KeysCommand::Revoke { .. }
        ));
        assert!(matches!(
            parse(&["get", "k"])?.command,
            KeysCommand::Get { .. }
        ));
        // Exclusive flags.
        assert!(parse(&["list", "--config", "a", "--url", "http://x"]).is_err());
        assert!(parse(&["update", "k", "--enabled", "--disabled"]).is_err());
        assert!(parse(&["create", "--profiles", "x"]).is_err());
        assert!(parse(&["create", "--label", "a", "--count", "0"]).is_err());
        assert!(matches!(
            parse(&["create", "--label", "a", "--count", "3"])?.command,
            KeysCommand::Create(CreateArgs { count: 3, .. })
        ));
        Ok(())
    }

    #[test]
    fn update_patches_only_what_is_given() -> Result<(), Box<dyn std::error::Error>> {
        let args = parse(&[
            "update",
            "k",
            "--rpm",
            "5",
            "--enabled",
            "--profiles",
            "",
            "--cache",
            "false",
        ])?;
        let KeysCommand::Update { bindings, .. } = args.command else {
            panic!("not update");
        };
        let current = KeyInfo {
            id: "k".into(),
            label: "l".into(),
            owner: None,
            profiles: vec!["a".into()],
            models: vec!["m".into()],
            allow_fallback: true,
            quota: QuotaConfig {
                cost_per_month: Some(3.0),
                requests_per_minute: Some(1),
                ..QuotaConfig::default()
            },
            enabled: false,
            revoked: false,
            mounted: false,
            hint: "abcd".into(),
            created_at_ms: 0,
            created: None,
            cache: None,
        };
        let patch = bindings.patch();
        assert_eq!(patch.enabled, Some(true));
        assert_eq!(patch.profiles, Some(vec![]));
        assert_eq!(patch.models, None);
        assert_eq!(patch.allow_fallback, None);
        let quota = patch
            .quota
            .flatten()
            .unwrap_or_default()
            .apply(current.quota);
        assert_eq!(quota.requests_per_minute, Some(5));
        assert_eq!(quota.cost_per_month, Some(3.0));
        // On the wire: only the limit the flag names.
        let wire = serde_json::to_value(&patch)?;
        assert_eq!(wire["quota"], json!({ "requestsPerMinute": 5 }));
        assert_eq!(wire["cache"], json!(false));
        Ok(())
    }
}
