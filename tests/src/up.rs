//! `ai-router up`, the one-command run, as a user starts it.

use super::*;

/// A running `ai-router up` and what its ready line said.
#[derive(Debug)]
pub struct Up {
    pub child: tokio::process::Child,
    /// `http://host:port` (its `baseUrl` without `/v1`).
    pub base: String,
    /// Its `apiKey`, registered for the secret scan.
    pub key: String,
    /// The ready line, whole.
    pub ready: Value,
}

impl Up {
    /// Runs `ai-router up --config <config> --wasm <the filter>` with only `PATH`, `ENVOY_BIN`
    /// and `env` in its environment, its stderr going to `stderr`; returns once it printed its
    /// ready line.
    pub async fn start(config: &Path, env: &[(&str, &str)], stderr: Stdio) -> Result<Self> {
        let mut cmd = tokio::process::Command::new(ai_router_bin()?);
        cmd.arg("up")
            .arg("--config")
            .arg(config)
            .arg("--wasm")
            .arg(wasm_path()?)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("ENVOY_BIN", envoy_bin()?);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .context("starting ai-router up")?;
        let stdout = child.stdout.take().context("up's stdout")?;
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        let ready = tokio::time::timeout(ENVOY_READY_TIMEOUT, lines.next_line())
            .await
            .context("up printed no ready line in time")??
            .context("up ended before its ready line")?;
        let ready: Value = serde_json::from_str(&ready).context("up's ready line")?;
        let base = json_str(&ready, "baseUrl")?
            .trim_end_matches("/v1")
            .to_string();
        let key = json_str(&ready, "apiKey")?.to_string();
        scan::register("up's virtual key", &key);
        Ok(Self {
            child,
            base,
            key,
            ready,
        })
    }
}
