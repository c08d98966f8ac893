//! The peers, configured for the same fake upstream and the same pool shape (two providers x
//! four keys, load-balanced): LiteLLM's proxy (`litellm --config`, PyPI `litellm[proxy]`),
//! Portkey's gateway (npm `@portkey-ai/gateway`, its `build/start-server.js` under node) and
//! agentgateway (a binary the user built, `agentgateway -f config.yaml`).
//!
//! LiteLLM authenticates with its master key (its own virtual keys need a Postgres database);
//! the open-source Portkey gateway has no key store: the provider keys and the load-balancing
//! config travel in the `x-portkey-config` header of each request, as its docs show.
//! agentgateway checks its own API keys (`llm.policies.apiKey`, strict, as many keys as
//! ai-router's virtual keys) and picks one of the eight keys by weight (a virtual model).

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

/// agentgateway's model names: the pool's two models, each over the `KEYS` deployments.
const AGW_STREAM_MODEL: &str = "bench-stream";
/// API keys agentgateway accepts (as many as ai-router's virtual keys in the comparison).
const AGW_CLIENT_KEYS: usize = 10;

/// agentgateway's local config (JSON is YAML): one gateway on `port`, API-key authentication
/// of the clients (strict, `AGW_CLIENT_KEYS` keys), and per model name a virtual model over
/// `KEYS` internal OpenAI deployments at the fake upstream, picked by weight (as LiteLLM's
/// shuffle and Portkey's loadbalance do). Request logs are off (ai-router's Envoy has no
/// access log) and it runs as many worker threads as the Envoys.
pub fn agentgateway_config(
    ports: [u16; 4],
    upstream_port: u16,
    prefix: &str,
    client_keys: &[String],
    workers: u32,
) -> serde_json::Value {
    let [port, admin, stats, readiness] = ports;
    let base = format!("http://127.0.0.1:{upstream_port}/{prefix}");
    let mut models = Vec::new();
    let mut virtual_models = Vec::new();
    for (name, path) in [(MODEL, "v1"), (AGW_STREAM_MODEL, "stream/v1")] {
        let mut targets = Vec::new();
        for i in 0..KEYS {
            let provider = if i < KEYS / 2 { "fake-a" } else { "fake-b" };
            let deployment = format!("{name}@{provider}-{i}");
            models.push(json!({
                "name": deployment,
                "visibility": "internal",
                "provider": "openAI",
                "params": {
                    "model": MODEL,
                    "apiKey": format!("sk-bench-agw-{i}-{}", random_hex(16)),
                    "baseUrl": format!("{base}/{path}"),
                },
            }));
            targets.push(json!({ "model": deployment, "weight": 1 }));
        }
        virtual_models
            .push(json!({ "name": name, "routing": { "weighted": { "targets": targets } } }));
    }
    let keys: Vec<_> = client_keys.iter().map(|k| json!({ "key": k })).collect();
    json!({
        "config": {
            "adminAddr": format!("127.0.0.1:{admin}"),
            "statsAddr": format!("127.0.0.1:{stats}"),
            "readinessAddr": format!("127.0.0.1:{readiness}"),
            "workerThreads": workers,
            "logging": { "filter": "false", "level": "warn" },
        },
        "gateways": { "default": { "port": port } },
        "llm": {
            "policies": {
                "apiKey": {
                    "keys": keys,
                    "mode": "strict",
                    "location": { "header": { "name": "authorization", "prefix": "Bearer " } },
                },
            },
            "models": models,
            "virtualModels": virtual_models,
        },
    })
}

/// agentgateway (`agentgateway -f config.yaml`, the config of [`agentgateway_config`]).
pub async fn start_agentgateway(
    dir: &TestDir,
    agentgateway: &Path,
    upstream_port: u16,
    prefix: &str,
    workers: u32,
) -> Result<Peer> {
    let ports = [free_port()?, free_port()?, free_port()?, free_port()?];
    let client_keys: Vec<String> = (0..AGW_CLIENT_KEYS)
        .map(|i| format!("sk-bench-agw-client-{i}-{}", random_hex(24)))
        .collect();
    let config = agentgateway_config(ports, upstream_port, prefix, &client_keys, workers);
    let path = dir.write("agentgateway.yaml", &config.to_string())?;
    let args = vec!["-f".to_string(), path.display().to_string()];
    let mut process = Process::spawn(dir, "agentgateway", agentgateway, &args, &[])?;
    wait_http(
        &mut process,
        &format!("http://127.0.0.1:{}/healthz/ready", ports[3]),
        "agentgateway's /healthz/ready",
    )
    .await?;
    let headers = vec![(
        "authorization".to_string(),
        format!("Bearer {}", client_keys[0]),
    )];
    let mut stream_headers = headers.clone();
    stream_headers.push(("accept".to_string(), "text/event-stream".to_string()));
    Ok(Peer {
        process,
        target: Target {
            url: format!("http://127.0.0.1:{}/v1/chat/completions", ports[0]).parse()?,
            headers,
            unary_body: chat_body(MODEL, false),
            stream_body: chat_body(AGW_STREAM_MODEL, true),
            stream_headers,
        },
    })
}

/// agentgateway's version from what `agentgateway --version` prints: a JSON object
/// (`{"version": "75b4e6ce6e0e", "git_revision": "…", "rust_version": …}`), shown as
/// `75b4e6ce6e0e (git 75b4e6ce…, rust 1.97.0-nightly)`; any other output as its first line.
pub fn agentgateway_version(output: &str) -> String {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(output) else {
        return first_line(output);
    };
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).filter(|x| !x.is_empty());
    let Some(version) = field("version") else {
        return first_line(output);
    };
    let detail: Vec<String> = [("git", "git_revision"), ("rust", "rust_version")]
        .iter()
        .filter_map(|(label, k)| field(k).map(|x| format!("{label} {x}")))
        .collect();
    if detail.is_empty() {
        version.to_string()
    } else {
        format!("{version} ({})", detail.join(", "))
    }
}

/// The first line of a program's output that is not blank.
pub fn first_line(output: &str) -> String {
    output
        .lines()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agentgateway_s_version_is_read_from_its_json_not_its_first_line() {
        let printed = "{\n  \"version\": \"75b4e6ce6e0e\",\n  \"git_revision\": \"75b4e6ce6e0e1ac7959d5548ebe8dbeaede4f180\",\n  \"rust_version\": \"1.97.0-nightly\",\n  \"build_profile\": \"release\"\n}\n";
        assert_eq!(
            agentgateway_version(printed),
            "75b4e6ce6e0e (git 75b4e6ce6e0e1ac7959d5548ebe8dbeaede4f180, rust 1.97.0-nightly)"
        );
        assert_eq!(agentgateway_version(r#"{"version":"v1.2.3"}"#), "v1.2.3");
        assert_eq!(
            agentgateway_version("\nagentgateway 1.0\nmore"),
            "agentgateway 1.0"
        );
        assert_eq!(agentgateway_version(r#"{"name":"x"}"#), r#"{"name":"x"}"#);
        assert_eq!(agentgateway_version(""), "");
    }
}
