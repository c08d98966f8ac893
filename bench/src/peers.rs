//! The peers, configured for the same fake upstream and the same pool shape (two providers x
//! four keys, load-balanced): LiteLLM's proxy (`litellm --config`, PyPI `litellm[proxy]`) and
//! Portkey's gateway (npm `@portkey-ai/gateway`, its `build/start-server.js` under node).
//!
//! LiteLLM authenticates with its master key (its own virtual keys need a Postgres database);
//! the open-source Portkey gateway has no key store: the provider keys and the load-balancing
//! config travel in the `x-portkey-config` header of each request, as its docs show.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ai_router_e2e::{poll, random_hex, Process, TestDir};
use anyhow::{Context, Result};
use serde_json::json;

use crate::airouter::MODEL;
use crate::load::{chat_body, Target};

/// How long a peer may take to answer its health check (LiteLLM imports a lot).
const PEER_START_TIMEOUT: Duration = Duration::from_secs(180);
/// The stream model's name at LiteLLM (its deployments point at the fake upstream's stream
/// route: LiteLLM does not forward the client's `accept`).
const LITELLM_STREAM_MODEL: &str = "bench-stream";
/// Deployments (provider keys) per model, as the ai-router pool has.
const KEYS: usize = 8;

/// A port nobody listens on now (for servers that cannot report the port they bound).
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// A running peer.
#[derive(Debug)]
pub struct Peer {
    pub process: Process,
    pub target: Target,
}

async fn wait_http(process: &mut Process, url: &str, what: &str) -> Result<()> {
    let client = ai_router_e2e::http_client()?;
    let result = poll(what, PEER_START_TIMEOUT, || {
        let status = process.try_status();
        let req = client.get(url).send();
        async move {
            // An exit ends the wait at once.
            if let Some(st) = status? {
                return Ok(Some(Err(anyhow::anyhow!("exited ({st})"))));
            }
            Ok(match req.await {
                Ok(r) if r.status().is_success() => Some(Ok(())),
                _ => None,
            })
        }
    })
    .await;
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) | Err(e) => Err(e.context(format!("{what}\n{}", process.tail()))),
    }
}

/// LiteLLM's proxy with `KEYS` deployments of [`MODEL`] (and of the stream model).
pub async fn start_litellm(dir: &TestDir, litellm: &Path, upstream_port: u16) -> Result<Peer> {
    let base = format!("http://127.0.0.1:{upstream_port}/static");
    let mut models = Vec::new();
    for (name, path) in [(MODEL, "v1"), (LITELLM_STREAM_MODEL, "stream/v1")] {
        for i in 0..KEYS {
            models.push(json!({
                "model_name": name,
                "litellm_params": {
                    "model": format!("openai/{MODEL}"),
                    "api_base": format!("{base}/{path}"),
                    "api_key": format!("sk-bench-litellm-{i}-{}", random_hex(16)),
                }
            }));
        }
    }
    let master_key = format!("sk-bench-master-{}", random_hex(24));
    // JSON is YAML: the config is written as JSON.
    let config = json!({
        "model_list": models,
        "general_settings": { "master_key": master_key },
        "litellm_settings": { "telemetry": false, "drop_params": true, "set_verbose": false },
    });
    let path = dir.write("litellm.yaml", &config.to_string())?;
    let port = free_port()?;
    let args = vec![
        "--config".to_string(),
        path.display().to_string(),
        "--host".to_string(),
        "127.0.0.1".to_string(),
        "--port".to_string(),
        port.to_string(),
        "--num_workers".to_string(),
        "1".to_string(),
    ];
    let env = vec![
        (
            "LITELLM_LOCAL_MODEL_COST_MAP".to_string(),
            "True".to_string(),
        ),
        ("LITELLM_LOG".to_string(), "ERROR".to_string()),
        ("LITELLM_TELEMETRY".to_string(), "False".to_string()),
        ("NO_DOCS".to_string(), "True".to_string()),
    ];
    let mut process = Process::spawn(dir, "litellm", litellm, &args, &env)?;
    wait_http(
        &mut process,
        &format!("http://127.0.0.1:{port}/health/liveliness"),
        "LiteLLM's /health/liveliness",
    )
    .await?;
    let headers = vec![("authorization".to_string(), format!("Bearer {master_key}"))];
    Ok(Peer {
        process,
        target: Target {
            url: format!("http://127.0.0.1:{port}/v1/chat/completions").parse()?,
            headers: headers.clone(),
            unary_body: chat_body(MODEL, false),
            stream_body: chat_body(LITELLM_STREAM_MODEL, true),
            stream_headers: headers,
        },
    })
}

/// The `x-portkey-config` of a load-balanced pool of `KEYS` keys at `host`.
fn portkey_config(host: &str) -> String {
    let targets: Vec<_> = (0..KEYS)
        .map(|i| {
            json!({
                "provider": "openai",
                "api_key": format!("sk-bench-portkey-{i}-{}", random_hex(16)),
                "custom_host": host,
            })
        })
        .collect();
    json!({ "strategy": { "mode": "loadbalance" }, "targets": targets }).to_string()
}

/// Portkey's gateway (`node start-server.js --port=P --headless`).
pub async fn start_portkey(
    dir: &TestDir,
    node: &Path,
    start_server: &Path,
    upstream_port: u16,
) -> Result<Peer> {
    let port = free_port()?;
    let args = vec![
        start_server.display().to_string(),
        format!("--port={port}"),
        "--headless".to_string(),
    ];
    let env = vec![("NODE_ENV".to_string(), "production".to_string())];
    let mut process = Process::spawn(dir, "portkey", node, &args, &env)?;
    wait_http(
        &mut process,
        &format!("http://127.0.0.1:{port}/"),
        "Portkey's gateway (GET /)",
    )
    .await?;
    let base = format!("http://127.0.0.1:{upstream_port}/static");
    let headers = vec![(
        "x-portkey-config".to_string(),
        portkey_config(&format!("{base}/v1")),
    )];
    let stream_headers = vec![(
        "x-portkey-config".to_string(),
        portkey_config(&format!("{base}/stream/v1")),
    )];
    Ok(Peer {
        process,
        target: Target {
            url: format!("http://127.0.0.1:{port}/v1/chat/completions").parse()?,
            headers,
            unary_body: chat_body(MODEL, false),
            stream_body: chat_body(MODEL, true),
            stream_headers,
        },
    })
}

/// `node` on PATH (or /usr/bin/node).
pub fn node_bin() -> PathBuf {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("node"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/node"))
}
