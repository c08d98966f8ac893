//! The benchmark's pool and its virtual keys, provisioned once per count into an SQLite key
//! store every scenario copies.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ai_router_e2e::{random_hex, TestDir};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use super::{Secrets, Shape, MODEL, OTHER_MODEL, OTHER_PROVIDERS, PROBE_MODEL};
use crate::upstream::Headers;

pub(super) fn key_list(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("sk-bench-{prefix}-{i}-{}", random_hex(20)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The pool YAML and the control plane's variables for `shape` (`one_pass`: `gateway.onePass`).
pub(super) fn pool(
    shape: &Shape,
    upstream_port: u16,
    key_db: &std::path::Path,
    secrets: &Secrets,
    one_pass: bool,
) -> (String, Vec<(String, String)>) {
    let base = format!("http://127.0.0.1:{upstream_port}");
    let variant = shape.headers.prefix();
    let mut yaml = format!(
        "# ai-router under benchmark (bench/src/airouter.rs): {label}\n\
         gateway:\n\
         \x20 host: 127.0.0.1\n\
         \x20 port: 0\n\
         \x20 adminToken: {{ env: AI_ROUTER_ADMIN_TOKEN }}\n\
         \x20 keyStore: {{ type: sqlite, path: {db} }}\n\
         \x20 onePass: {one_pass}\n\
         controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n\
         providers:\n",
        label = shape.label(),
        db = key_db.display(),
    );
    let mut env = vec![
        (
            "AI_ROUTER_SYNC_TOKEN".to_string(),
            secrets.sync_token.clone(),
        ),
        (
            "AI_ROUTER_ADMIN_TOKEN".to_string(),
            secrets.admin_token.clone(),
        ),
        ("RUST_LOG".to_string(), "warn".to_string()),
        // As the control plane's image runs it (control-plane/Dockerfile).
        ("MALLOC_ARENA_MAX".to_string(), "2".to_string()),
    ];
    let mut provider = |id: &str, var: &str, url: &str, model: &str, keys: usize| {
        if keys == 0 {
            return;
        }
        let _ = write!(
            yaml,
            "  - id: {id}\n\
             \x20   kind: openai-compatible\n\
             \x20   baseUrl: {url}\n\
             \x20   keysFromEnv: {var}\n\
             \x20   models:\n\
             \x20     - {{ id: {model}, contextWindow: 128000, cost: {{ input: 0.15, output: 0.6 }} }}\n"
        );
        env.push((format!("{var}_API_KEYS"), key_list(id, keys)));
    };
    let serving_url = format!("{base}/{variant}/v1");
    let half = shape.serving_keys.div_ceil(2);
    provider("fake-a", "BENCH_FAKE_A", &serving_url, MODEL, half);
    provider(
        "fake-b",
        "BENCH_FAKE_B",
        &serving_url,
        MODEL,
        shape.serving_keys - half,
    );
    for i in 0..OTHER_PROVIDERS {
        let n = shape.other_keys / OTHER_PROVIDERS
            + usize::from(i < shape.other_keys % OTHER_PROVIDERS);
        provider(
            &format!("other-{i}"),
            &format!("BENCH_OTHER_{i}"),
            &serving_url,
            OTHER_MODEL,
            n,
        );
    }
    provider(
        "probe",
        "BENCH_PROBE",
        &format!("{base}/probe/v1"),
        PROBE_MODEL,
        1,
    );
    yaml.push_str("defaults: { deadlineMs: 30000 }\n");
    (yaml, env)
}

/// A virtual key's spec: bound to the benchmarked model (and the probe's), quotas on.
pub(super) fn key_spec(label: &str) -> Value {
    json!({
        "label": label,
        "models": [MODEL, PROBE_MODEL],
        "quota": {
            "requestsPerMinute": 100_000_000u64,
            "tokensPerDay": 100_000_000_000u64,
            "costPerDay": 1_000_000.0,
            "costPerMonth": 10_000_000.0
        }
    })
}

pub(super) async fn create_key(
    client: &reqwest::Client,
    http: &str,
    token: &str,
    label: &str,
) -> Result<(String, String)> {
    let resp = client
        .post(format!("http://{http}/admin/keys"))
        .bearer_auth(token)
        .json(&key_spec(label))
        .send()
        .await?;
    let status = resp.status();
    let v: Value = resp.json().await.unwrap_or(Value::Null);
    if status != reqwest::StatusCode::CREATED {
        bail!(
            "POST /admin/keys answered {status}: {}",
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("")
        );
    }
    let id = v.pointer("/key/id").and_then(Value::as_str);
    let secret = v.get("secret").and_then(Value::as_str);
    match (id, secret) {
        (Some(id), Some(secret)) => Ok((id.to_string(), secret.to_string())),
        _ => bail!("POST /admin/keys: no key id or secret in the answer"),
    }
}

/// A key store holding `count` virtual keys, made once and copied by every scenario.
#[derive(Debug, Clone)]
pub struct KeyBundle {
    pub count: usize,
    pub(super) files: Vec<PathBuf>,
    pub(super) load_key: String,
    pub provision_s: f64,
}

/// How long provisioning took.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Provisioning {
    pub virtual_keys: usize,
    pub seconds: f64,
    pub keys_per_second: f64,
    pub how: String,
}

impl KeyBundle {
    pub fn provisioning(&self) -> Provisioning {
        Provisioning {
            virtual_keys: self.count,
            seconds: self.provision_s,
            keys_per_second: self.count as f64 / self.provision_s.max(1e-9),
            how: "ai-router keys create --count N --config (straight into the SQLite key store)"
                .to_string(),
        }
    }
}

/// `ai-router keys create --config <pool> ...` with the benchmark's bindings and quotas: `count`
/// keys labelled `label`, straight into the pool's SQLite key store. The answer (it holds the
/// secrets) stays in memory.
fn cli_create(
    dir: &TestDir,
    config: &Path,
    env: &[(String, String)],
    label: &str,
    count: usize,
) -> Result<Value> {
    let out = std::process::Command::new(ai_router_e2e::ai_router_bin()?)
        .current_dir(dir.path())
        .args(["keys", "create", "--label", label, "--models"])
        .arg(format!("{MODEL},{PROBE_MODEL}"))
        .args(["--rpm", "100000000", "--tokens-per-day", "100000000000"])
        .args(["--cost-per-day", "1000000", "--cost-per-month", "10000000"])
        .arg("--count")
        .arg(count.to_string())
        .arg("--config")
        .arg(config)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .output()
        .context("running ai-router keys create")?;
    if !out.status.success() {
        bail!(
            "ai-router keys create --count {count} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("ai-router keys create printed no JSON")
}

/// Creates `count` virtual keys (the load's key and `count - 1` others) in the SQLite key store
/// of the benchmark's pool with `ai-router keys create --count` (the admin API costs a push of
/// every key per key created: minutes at 10,000), and keeps the store's files.
pub async fn provision(count: usize, upstream_port: u16) -> Result<KeyBundle> {
    let dir = TestDir::new(&format!("bench-keys-{count}"))?;
    let db = dir.join("keys.db");
    let secrets = Secrets::new();
    let shape = Shape {
        virtual_keys: count,
        serving_keys: 2,
        other_keys: 0,
        headers: Headers::Static,
    };
    let (yaml, env) = pool(&shape, upstream_port, &db, &secrets, false);
    let config = dir.write("pool.yaml", &yaml)?;
    let t0 = Instant::now();
    let load = {
        let (dir, config, env) = (dir.clone(), config.clone(), env.clone());
        tokio::task::spawn_blocking(move || cli_create(&dir, &config, &env, "bench_load", 1))
            .await??
    };
    let load_key = load
        .get("secret")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("keys create: no secret in its answer"))?
        .to_string();
    if count > 1 {
        let others = {
            let (dir, config, env) = (dir.clone(), config.clone(), env.clone());
            tokio::task::spawn_blocking(move || cli_create(&dir, &config, &env, "bench", count - 1))
                .await??
        };
        let made = others
            .get("keys")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if made != count - 1 {
            bail!("keys create --count {} made {made} keys", count - 1);
        }
    }
    let provision_s = t0.elapsed().as_secs_f64();
    let files = ["keys.db", "keys.db-wal", "keys.db-shm"]
        .iter()
        .map(|f| dir.join(f))
        .filter(|p| p.is_file())
        .collect();
    Ok(KeyBundle {
        count,
        files,
        load_key,
        provision_s,
    })
}
