//! ai-router under test: its pool (providers and keys pointing at the fake upstream), its
//! virtual keys (provisioned once per count through the admin API, into an SQLite key store
//! each scenario copies), the running control plane + Envoy, and the sync probes (how long a
//! revoked virtual key or a blacklisted provider key takes to reach every Envoy worker, and
//! how many bytes the sync stream carried for it).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ai_router_e2e::{random_hex, ControlPlane, Envoy, TestDir};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::load::{chat_body, Target};
use crate::procs::ProcSet;
use crate::upstream::{envoy_stat, BenchEnvoy, Headers, PROBE_RUNTIME_KEY};

/// The model every system is benchmarked on.
pub const MODEL: &str = "bench-model";
/// The model of the probe provider (one key): the blacklist probe's lane.
const PROBE_MODEL: &str = "probe-model";
/// The model of the providers that hold the keys not serving [`MODEL`].
const OTHER_MODEL: &str = "other-model";
/// How many providers share the keys that do not serve [`MODEL`].
const OTHER_PROVIDERS: usize = 8;
/// The Envoy cluster of the sync stream (`ai-router render-envoy`).
const SYNC_CLUSTER_RX: &str = "cluster.ai_router_control_plane.upstream_cx_rx_bytes_total";
/// How long a probe waits for a change to reach every worker.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// The size of a pool and its key table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shape {
    /// Virtual keys in the key store (the one the load uses included).
    pub virtual_keys: usize,
    /// Provider keys serving [`MODEL`], spread over the two providers `fake-a` and `fake-b`.
    pub serving_keys: usize,
    /// Provider keys on [`OTHER_PROVIDERS`] providers that serve another model.
    pub other_keys: usize,
    pub headers: Headers,
}

impl Shape {
    pub fn label(&self) -> String {
        let pk = if self.other_keys == 0 {
            format!("{} PK (all serve)", self.serving_keys)
        } else {
            format!(
                "{} PK ({} serve, {} other)",
                self.serving_keys + self.other_keys,
                self.serving_keys,
                self.other_keys
            )
        };
        format!(
            "{} VK · {pk} · {}",
            self.virtual_keys,
            self.headers.prefix()
        )
    }
}

/// The secrets of one run: provider keys and tokens (generated, never printed).
#[derive(Debug, Clone)]
pub struct Secrets {
    pub sync_token: String,
    pub admin_token: String,
}

impl Secrets {
    pub fn new() -> Self {
        Self {
            sync_token: format!("sync-{}", random_hex(32)),
            admin_token: format!("admin-{}", random_hex(32)),
        }
    }
}

fn key_list(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("sk-bench-{prefix}-{i}-{}", random_hex(20)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The pool YAML and the control plane's variables for `shape`.
fn pool(
    shape: &Shape,
    upstream_port: u16,
    key_db: &std::path::Path,
    secrets: &Secrets,
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
fn key_spec(label: &str) -> Value {
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

async fn create_key(
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
    files: Vec<PathBuf>,
    load_key: String,
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
    let (yaml, env) = pool(&shape, upstream_port, &db, &secrets);
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

/// A running ai-router: control plane + Envoy (rendered by `ai-router render-envoy`).
#[derive(Debug)]
pub struct Instance {
    name: String,
    pub cp: ControlPlane,
    pub envoy: Envoy,
    /// A second Envoy on the same control plane, for the probes.
    second: Option<Envoy>,
    secrets: Secrets,
    load_key: String,
    /// A virtual key created for the revoke probe: (id, secret).
    victim: (String, String),
    /// How long its `POST /admin/keys` took (every other key already in the store).
    pub create_key_ms: f64,
}

impl Instance {
    pub async fn start(
        name: &str,
        shape: Shape,
        bundle: &KeyBundle,
        upstream: &BenchEnvoy,
    ) -> Result<Self> {
        let dir = TestDir::new(name)?;
        for f in &bundle.files {
            let to = dir.join(
                &f.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
            std::fs::copy(f, &to).with_context(|| format!("copying {}", f.display()))?;
        }
        let secrets = Secrets::new();
        let (yaml, env) = pool(&shape, upstream.port, &dir.join("keys.db"), &secrets);
        let cp = ControlPlane::start(&dir, &yaml, &env)
            .await
            .context("starting the control plane")?;
        let client = ai_router_e2e::http_client()?;
        let t0 = Instant::now();
        let victim = create_key(
            &client,
            &cp.http_addr().to_string(),
            &secrets.admin_token,
            "bench_victim",
        )
        .await
        .with_context(|| cp.tail())?;
        let create_key_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let envoy_env = vec![
            (
                "AI_ROUTER_SYNC_TOKEN".to_string(),
                secrets.sync_token.clone(),
            ),
            ("RUST_LOG".to_string(), "warn".to_string()),
        ];
        let envoy = Envoy::start(
            &dir,
            cp.config_path(),
            cp.grpc_addr(),
            &envoy_env,
            &bundle.load_key,
        )
        .await
        .with_context(|| cp.tail())
        .context("starting Envoy")?;
        Ok(Self {
            name: name.to_string(),
            cp,
            envoy,
            second: None,
            secrets,
            load_key: bundle.load_key.clone(),
            victim,
            create_key_ms,
        })
    }

    pub fn target(&self) -> Result<Target> {
        let url = format!("{}/v1/chat/completions", self.envoy.base_url());
        let headers = vec![(
            "authorization".to_string(),
            format!("Bearer {}", self.load_key),
        )];
        let mut stream_headers = headers.clone();
        stream_headers.push(("accept".to_string(), "text/event-stream".to_string()));
        Ok(Target {
            url: url.parse()?,
            headers,
            unary_body: chat_body(MODEL, false),
            stream_body: chat_body(MODEL, true),
            stream_headers,
        })
    }

    pub fn procs(&self) -> ProcSet {
        let mut p = ProcSet::new();
        p.add("envoy", self.envoy.process().pid());
        p.add("control-plane", self.cp.pid());
        p
    }

    /// Bytes Envoy has received on the sync stream so far.
    pub async fn sync_rx_bytes(&self) -> Result<u64> {
        envoy_stat(self.envoy.admin_addr(), SYNC_CLUSTER_RX).await
    }

    /// The control plane's `ai_router_sync*` metrics, if it has any (a hook for a control
    /// plane that counts what it sends).
    async fn sync_metrics(&self) -> BTreeMap<String, f64> {
        let Ok(client) = ai_router_e2e::http_client() else {
            return BTreeMap::new();
        };
        let url = format!("http://{}/metrics", self.cp.http_addr());
        let text = match client.get(&url).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        text.lines()
            .filter(|l| l.starts_with("ai_router_sync"))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_string(), value.parse::<f64>().ok()?))
            })
            .collect()
    }

    /// Starts a second Envoy on the same control plane (its own directory): the probes poll
    /// both, so a change is timed to every worker of the Envoy that saw it happen and of one
    /// that only hears of it through the control plane.
    pub async fn start_second_envoy(&mut self) -> Result<()> {
        if self.second.is_some() {
            return Ok(());
        }
        let dir = TestDir::new(&format!("{}-second-envoy", self.name))?;
        let envoy_env = vec![
            (
                "AI_ROUTER_SYNC_TOKEN".to_string(),
                self.secrets.sync_token.clone(),
            ),
            ("RUST_LOG".to_string(), "warn".to_string()),
        ];
        let envoy = Envoy::start(
            &dir,
            self.cp.config_path(),
            self.cp.grpc_addr(),
            &envoy_env,
            &self.load_key,
        )
        .await
        .context("starting the second Envoy")?;
        self.second = Some(envoy);
        Ok(())
    }

    /// The Envoys the probes poll: this one, then the second if it runs.
    fn gateways(&self) -> Vec<(&'static str, String)> {
        let mut g = vec![("same", self.envoy.base_url())];
        if let Some(second) = &self.second {
            g.push(("other", second.base_url()));
        }
        g
    }

    /// Revokes the victim virtual key through the admin API and polls every Envoy on fresh
    /// connections until `streak` answers in a row refuse it with 401.
    pub async fn probe_revoke(&self, streak: usize) -> Result<SyncProbe> {
        let fresh = fresh_client()?;
        let secret = self.victim.1.clone();
        let check = |base: String| {
            let req = fresh
                .get(format!("{base}/v1/models"))
                .bearer_auth(&secret)
                .send();
            async move {
                Ok(match req.await?.status().as_u16() {
                    401 => Some(true),
                    200 => Some(false),
                    _ => None,
                })
            }
        };
        for (name, base) in self.gateways() {
            if check(base).await? != Some(false) {
                bail!("the revoke probe's key is not live at the {name} Envoy before the revoke");
            }
        }
        let admin = ai_router_e2e::http_client()?;
        let url = format!(
            "http://{}/admin/keys/{}/revoke",
            self.cp.http_addr(),
            self.victim.0
        );
        let token = self.secrets.admin_token.clone();
        let change = || async move {
            let resp = admin.post(&url).bearer_auth(&token).send().await?;
            if !resp.status().is_success() {
                bail!("{url} answered {}", resp.status());
            }
            Ok(())
        };
        self.measure(streak, "revoke", change, check).await
    }

    /// Has the probe provider's only key refused with 401 once at this Envoy (the fake
    /// upstream's `/probe/` route, switched on and off again through its runtime), then polls
    /// every Envoy on fresh connections until `streak` calls in a row are refused by the
    /// gateway itself (503: no usable key) instead of reaching the key, which works again.
    pub async fn probe_blacklist(&self, upstream: &BenchEnvoy, streak: usize) -> Result<SyncProbe> {
        let fresh = fresh_client()?;
        let body = chat_body(PROBE_MODEL, false);
        let key = self.load_key.clone();
        let call = |base: String| {
            let req = fresh
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(body.clone())
                .send();
            async move {
                let resp = req.await?;
                let status = resp.status().as_u16();
                let v: Value = resp.json().await.unwrap_or(Value::Null);
                let code = v
                    .pointer("/error/code")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                Ok::<(u16, String), anyhow::Error>((status, code))
            }
        };
        // The gateway's own refusal once the key is out: 503 pool_auth_failed.
        let check = |base: String| {
            let answer = call(base);
            async move {
                Ok(match answer.await? {
                    (503, code) if code == "pool_auth_failed" => Some(true),
                    (200, _) => Some(false),
                    _ => None,
                })
            }
        };
        upstream.set_runtime(PROBE_RUNTIME_KEY, "0").await?;
        for (name, base) in self.gateways() {
            let (first, code) = call(base).await?;
            if first != 200 {
                bail!("the probe model does not answer at the {name} Envoy before the blacklist: {first} {code}");
            }
        }
        let here = self.envoy.base_url();
        let change = || async move {
            upstream.set_runtime(PROBE_RUNTIME_KEY, "100").await?;
            let refused = call(here).await;
            upstream.set_runtime(PROBE_RUNTIME_KEY, "0").await?;
            let (refused, _) = refused?;
            if refused == 200 {
                bail!("the probe key was not refused (the fake upstream answered 200)");
            }
            Ok(())
        };
        let cp_http = self.cp.http_addr().to_string();
        let token = self.secrets.admin_token.clone();
        // When the control plane's /health first lists the key out (the probe's change starts
        // after the sync stream is quiet, which may take seconds).
        let cp_seen = tokio::spawn(async move {
            let client = ai_router_e2e::http_client().ok()?;
            let until = Instant::now() + PROBE_TIMEOUT * 2;
            while Instant::now() < until {
                let health: Value = client
                    .get(format!("http://{cp_http}/health"))
                    .bearer_auth(&token)
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                if probe_key_out(&health) == Some(true) {
                    return Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            None
        });
        let mut probe = self.measure(streak, "blacklist", change, check).await?;
        probe.control_plane_ms = cp_seen
            .await
            .ok()
            .flatten()
            .map(|at| at.saturating_duration_since(probe.started).as_secs_f64() * 1000.0);
        Ok(probe)
    }

    /// Waits for the sync stream to go quiet (at most a few seconds) and returns its rate then
    /// (bytes per second).
    async fn quiet_sync(&self) -> Result<f64> {
        let window = Duration::from_millis(250);
        let mut best = f64::MAX;
        for _ in 0..20 {
            let a = self.sync_rx_bytes().await?;
            tokio::time::sleep(window).await;
            let b = self.sync_rx_bytes().await?;
            let rate = b.saturating_sub(a) as f64 / window.as_secs_f64();
            best = best.min(rate);
            if b == a {
                break;
            }
        }
        Ok(best)
    }

    /// Runs `change`, then polls every Envoy with `check` (Some(true): the worker that answered
    /// has the change, Some(false): not yet, None: another answer) until `streak` polls in a
    /// row at each say it has; counts the sync stream's bytes around it, less its quiet rate.
    async fn measure<C, CF, K, KF>(
        &self,
        streak: usize,
        what: &str,
        change: C,
        check: K,
    ) -> Result<SyncProbe>
    where
        C: FnOnce() -> CF,
        CF: std::future::Future<Output = Result<()>>,
        K: Fn(String) -> KF,
        KF: std::future::Future<Output = Result<Option<bool>>>,
    {
        let idle_rate = self.quiet_sync().await?;
        let rx0 = self.sync_rx_bytes().await?;
        let metrics0 = self.sync_metrics().await;
        let t0 = Instant::now();
        change()
            .await
            .with_context(|| format!("the {what} probe's change"))?;
        let change_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let mut reach: Vec<Reach> = self
            .gateways()
            .into_iter()
            .map(|(envoy, _)| Reach {
                envoy: envoy.to_string(),
                ..Default::default()
            })
            .collect();
        let bases: Vec<String> = self.gateways().into_iter().map(|(_, b)| b).collect();
        let mut runs = vec![0usize; bases.len()];
        let mut others = 0u64;
        while runs.iter().any(|r| *r < streak) {
            if t0.elapsed() > PROBE_TIMEOUT {
                bail!("the {what} did not reach every worker within {PROBE_TIMEOUT:?}: {reach:?}");
            }
            for (i, base) in bases.iter().enumerate() {
                if runs[i] >= streak {
                    continue;
                }
                let at = t0.elapsed().as_secs_f64() * 1000.0;
                reach[i].polls += 1;
                match check(base.clone()).await? {
                    Some(true) => {
                        if runs[i] == 0 {
                            reach[i].every_worker_ms = at;
                        }
                        reach[i].first_seen_ms.get_or_insert(at);
                        runs[i] += 1;
                    }
                    Some(false) => runs[i] = 0,
                    None => {
                        others += 1;
                        if others > 50 {
                            bail!("the {what} probe got unexpected answers ({others}): {reach:?}");
                        }
                    }
                }
            }
        }
        // Let the rest of the push land before counting its bytes.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let elapsed = t0.elapsed().as_secs_f64();
        let rx1 = self.sync_rx_bytes().await?;
        let metrics1 = self.sync_metrics().await;
        let raw = rx1.saturating_sub(rx0);
        let bytes = (raw as f64 - idle_rate * elapsed).max(0.0);
        let control_plane_metrics = metrics1
            .iter()
            .map(|(k, v)| (k.clone(), v - metrics0.get(k).copied().unwrap_or(0.0)))
            .collect();
        Ok(SyncProbe {
            started: t0,
            change_call_ms: change_ms,
            every_worker_ms: reach.iter().map(|r| r.every_worker_ms).fold(0.0, f64::max),
            reach,
            streak,
            sync_rx_bytes: bytes.round() as u64,
            sync_rx_bytes_raw: raw,
            idle_rx_bytes_per_s: idle_rate,
            control_plane_ms: None,
            control_plane_metrics,
        })
    }
}

/// `/health` (admin view): is the probe provider's key out? None when the shape is unknown.
fn probe_key_out(health: &Value) -> Option<bool> {
    let providers = health.get("providers")?.as_array()?;
    let probe = providers
        .iter()
        .find(|p| p.get("id").and_then(Value::as_str) == Some("probe"))?;
    let keys = probe.get("keys")?.as_array()?;
    Some(keys.iter().any(|k| {
        k.get("state")
            .and_then(Value::as_str)
            .is_some_and(|s| s != "ok")
    }))
}

/// A client that opens a new connection for every request (so the kernel spreads the probes
/// over Envoy's workers).
fn fresh_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| anyhow!("building the probe client: {e}"))
}

/// How a change reached one Envoy's workers (ms from the change).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reach {
    /// `same`: the Envoy where the change was made (the blacklist's refused call) or the
    /// first one; `other`: a second Envoy on the same control plane.
    pub envoy: String,
    /// The first poll that saw the change.
    pub first_seen_ms: Option<f64>,
    /// The start of the final run of `streak` polls in a row that saw it, each on a new
    /// connection: the change had reached every worker by then.
    pub every_worker_ms: f64,
    pub polls: u64,
}

/// How a change reached the workers.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncProbe {
    /// When the change was made.
    #[serde(skip)]
    pub started: Instant,
    /// The admin call (revoke) or the refused call (blacklist) that made the change.
    pub change_call_ms: f64,
    /// The latest of `reach`: the change had reached every worker of every Envoy polled.
    pub every_worker_ms: f64,
    pub reach: Vec<Reach>,
    pub streak: usize,
    /// Bytes Envoy received on the sync stream for the change (the idle rate taken off).
    pub sync_rx_bytes: u64,
    pub sync_rx_bytes_raw: u64,
    pub idle_rx_bytes_per_s: f64,
    /// Blacklist: when the control plane's `/health` first listed the key out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane_ms: Option<f64>,
    /// Changes of the control plane's `ai_router_sync*` metrics, if it has any.
    pub control_plane_metrics: BTreeMap<String, f64>,
}
