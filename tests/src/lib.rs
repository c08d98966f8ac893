//! Harness for the end-to-end tests: real binaries on ephemeral ports, driven over HTTP.
//!
//! Every process (`ai-router mock`, `ai-router serve`, Envoy) is started on port 0; its bound
//! address is read from the one JSON line it prints on stdout (Envoy: from its admin address file
//! and admin API). Each process writes stdout and stderr to files in a per-test directory,
//! `target/e2e/<test>-<pid>-<n>/`, whose tails go into every error this harness returns and are
//! printed when a test panics while a fixture is alive. Everything is killed on drop. Nothing
//! waits by sleeping: readiness is polled with a deadline.
//!
//! Tools come from the environment (`scripts/test.sh` sets them all):
//! `AI_ROUTER_BIN` (else `<workspace>/target/debug/ai-router`), `ENVOY_BIN` (else
//! `<workspace>/.venv/bin/envoy`, else `envoy` on PATH), `AI_ROUTER_WASM` (else `<workspace>/target/wasm32-wasip1/release/ai_router_filter.wasm`)
//! and `AI_ROUTER_PYTHON` (else `<workspace>/.venv/bin/python`). A missing tool is an error
//! naming the setup command: a test never passes by skipping.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::fs::{self, File};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

/// How long a server may take to print its address.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long Envoy may take to load the filter and receive its first state.
pub const ENVOY_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The bound on any single HTTP exchange the tests make.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How often readiness is polled.
const POLL_EVERY: Duration = Duration::from_millis(25);
/// Lines of each log shown in an error.
const TAIL_LINES: usize = 60;

const SETUP_HINT: &str = "run ./scripts/setup.sh (or the whole check, ./scripts/test.sh, which \
                          builds everything and sets AI_ROUTER_BIN, ENVOY_BIN, AI_ROUTER_WASM and \
                          AI_ROUTER_PYTHON)";

// ---------------------------------------------------------------------------------------------
// Tools and directories

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn tool_from_env(var: &str, default: PathBuf, what: &str) -> Result<PathBuf> {
    let path = match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => default,
    };
    if path.is_file() {
        Ok(path)
    } else {
        bail!(
            "{what} not found at {} (set {var} or build it): {SETUP_HINT}",
            path.display()
        )
    }
}

/// The `ai-router` binary.
pub fn ai_router_bin() -> Result<PathBuf> {
    tool_from_env(
        "AI_ROUTER_BIN",
        workspace_root().join("target/debug/ai-router"),
        "the ai-router binary (cargo build --workspace --bins)",
    )
}

/// The compiled filter.
pub fn wasm_path() -> Result<PathBuf> {
    tool_from_env(
        "AI_ROUTER_WASM",
        workspace_root().join("target/wasm32-wasip1/release/ai_router_filter.wasm"),
        "the wasm filter (./scripts/build-wasm.sh)",
    )
}

/// The Python interpreter that has `openai` and `langchain-openai`.
pub fn python_bin() -> Result<PathBuf> {
    tool_from_env(
        "AI_ROUTER_PYTHON",
        workspace_root().join(".venv/bin/python"),
        "the Python with the openai and langchain-openai clients",
    )
}

/// Envoy 1.40: `ENVOY_BIN`, else the project's `<workspace>/.venv/bin/envoy` (what
/// `scripts/setup.sh` installs), else `envoy` on PATH.
pub fn envoy_bin() -> Result<PathBuf> {
    if let Some(v) = std::env::var_os("ENVOY_BIN").filter(|v| !v.is_empty()) {
        return tool_from_env("ENVOY_BIN", PathBuf::from(v), "Envoy");
    }
    let venv = workspace_root().join(".venv/bin/envoy");
    if venv.is_file() {
        return Ok(venv);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("envoy"))
        .find(|p| p.is_file());
    on_path.ok_or_else(|| {
        anyhow!(
            "Envoy not found (ENVOY_BIN unset, no .venv/bin/envoy, no envoy on PATH): {SETUP_HINT}"
        )
    })
}

static DIR_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A per-test directory for configs and process logs: `target/e2e/<test>-<pid>-<n>/`. It is
/// kept after the test so a failure can be read at leisure.
#[derive(Debug, Clone)]
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    pub fn new(test: &str) -> Result<Self> {
        let n = DIR_COUNTER.fetch_add(1, Ordering::SeqCst);
        let name: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = workspace_root()
            .join("target/e2e")
            .join(format!("{name}-{}-{n}", std::process::id()));
        if path.exists() {
            fs::remove_dir_all(&path).with_context(|| format!("clearing {}", path.display()))?;
        }
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn write(&self, name: &str, contents: &str) -> Result<PathBuf> {
        let path = self.join(name);
        fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

/// Hex characters that differ between runs and tests (no `rand` needed: std's hasher keys are
/// random per process, mixed with a counter and the time).
pub fn random_hex(len: usize) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut out = String::with_capacity(len + 16);
    while out.len() < len {
        let mut h = RandomState::new().build_hasher();
        h.write_u32(COUNTER.fetch_add(1, Ordering::SeqCst));
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(len);
    out
}

/// Polls `probe` every few milliseconds until it yields a value or `timeout` passes; the last
/// error (or "not yet") goes into the error.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no answer yet");
    loop {
        match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// The last `n` lines of a file (or a note that it cannot be read).
pub fn tail_file(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(n);
            lines[start..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A child process whose stdout and stderr go to files; killed on drop.
pub struct Process {
    name: String,
    child: Option<Child>,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl fmt::Debug for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Process")
            .field("name", &self.name)
            .field("pid", &self.child.as_ref().map(Child::id))
            .finish()
    }
}

/// Variables that must not leak from the developer's shell into a process under test.
const SCRUBBED_ENV: &[&str] = &[
    "STARCI_AI_KEY",
    "STARCI_AI_KEY_FILE",
    "AI_ROUTER_SYNC_TOKEN",
    "AI_ROUTER_ADMIN_TOKEN",
    "P1_KEY_A",
    "P1_KEY_B",
    "P2_KEY_C",
    "http_proxy",
    "https_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
];

impl Process {
    /// Starts `program args` with `env`, logging to `<dir>/<name>.stdout|.stderr`.
    pub fn spawn(
        dir: &TestDir,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<Self> {
        let stdout = dir.join(&format!("{name}.stdout"));
        let stderr = dir.join(&format!("{name}.stderr"));
        let out =
            File::create(&stdout).with_context(|| format!("creating {}", stdout.display()))?;
        let err =
            File::create(&stderr).with_context(|| format!("creating {}", stderr.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().with_context(|| {
            format!("starting {name}: {} {}", program.display(), args.join(" "))
        })?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            stdout,
            stderr,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The whole stdout and stderr.
    pub fn logs(&self) -> String {
        let read = |p: &Path| {
            fs::read(p)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        format!("{}\n{}", read(&self.stdout), read(&self.stderr))
    }

    /// The last lines of both logs, labelled, for error messages.
    pub fn tail(&self) -> String {
        format!(
            "----- {name} stdout ({out}) -----\n{o}\n----- {name} stderr ({err}) -----\n{e}\n",
            name = self.name,
            out = self.stdout.display(),
            err = self.stderr.display(),
            o = tail_file(&self.stdout, TAIL_LINES),
            e = tail_file(&self.stderr, TAIL_LINES),
        )
    }

    /// `Some(status)` once the process has exited.
    pub fn try_status(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(c) => Ok(c.try_wait()?),
            None => bail!("{} was already stopped", self.name),
        }
    }

    /// Waits for the first line of stdout and parses it as JSON.
    pub async fn first_json_line(&mut self, timeout: Duration) -> Result<Value> {
        let name = self.name.clone();
        let stdout = self.stdout.clone();
        let result = poll(&format!("{name} to print its address"), timeout, || {
            let status = self.try_status();
            let stdout = stdout.clone();
            let name = name.clone();
            async move {
                let text = fs::read_to_string(&stdout).unwrap_or_default();
                if let Some(line) = text
                    .split_inclusive('\n')
                    .next()
                    .filter(|l| l.ends_with('\n'))
                {
                    let value: Value = serde_json::from_str(line.trim()).with_context(|| {
                        format!("{name}'s first stdout line is not JSON: {line:?}")
                    })?;
                    return Ok(Some(Ok(value)));
                }
                if let Some(st) = status? {
                    return Ok(Some(Err(anyhow!(
                        "{name} exited ({st}) before printing its address"
                    ))));
                }
                Ok(None)
            }
        })
        .await;
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) | Err(e) => Err(e.context(self.tail())),
        }
    }

    /// Waits for the process to exit on its own.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let name = self.name.clone();
        poll(&format!("{name} to exit"), timeout, || {
            let st = self.try_status();
            async move { st }
        })
        .await
        .with_context(|| self.tail())
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An HTTP client that never goes through a proxy and bounds every exchange. It keeps its
/// connection alive as the OpenAI SDKs do, so sequential calls of one client reach the same
/// Envoy worker (and its VM's local view of the lanes).
pub fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("building the HTTP client")
}

fn json_str<'a>(v: &'a Value, key: &str) -> Result<&'a str> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("no string field {key:?} in {v}"))
}

fn parse_addr(s: &str) -> Result<SocketAddr> {
    let s = s
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    s.parse()
        .with_context(|| format!("not a socket address: {s:?}"))
}

// ---------------------------------------------------------------------------------------------
// The mock provider

/// One request the mock received (`GET /_mock/calls`).
#[derive(Debug, Clone)]
pub struct MockCall {
    pub seq: u64,
    pub path: String,
    /// The key the request authenticated with (the provider's secret).
    pub key: Option<String>,
    pub model: Option<String>,
    pub stream: bool,
    /// The request headers, as the mock reported them.
    pub headers: Value,
    pub body: Value,
    /// The whole record.
    pub raw: Value,
}

impl MockCall {
    fn from_value(v: &Value) -> Self {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Self {
            seq: v.get("seq").and_then(Value::as_u64).unwrap_or_default(),
            path: s("path").unwrap_or_default(),
            key: s("key"),
            model: s("model"),
            stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
            headers: v.get("headers").cloned().unwrap_or(Value::Null),
            body: v.get("body").cloned().unwrap_or(Value::Null),
            raw: v.clone(),
        }
    }

    /// Every `(name, value)` header pair, names lowercased. Accepts a map (values strings or
    /// lists) or a list of pairs.
    pub fn header_pairs(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        match &self.headers {
            Value::Object(map) => {
                for (k, v) in map {
                    match v {
                        Value::Array(items) => {
                            for item in items {
                                out.push((k.to_lowercase(), value_text(item)));
                            }
                        }
                        other => out.push((k.to_lowercase(), value_text(other))),
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    match item {
                        Value::Array(pair) if pair.len() == 2 => {
                            out.push((value_text(&pair[0]).to_lowercase(), value_text(&pair[1])));
                        }
                        Value::Object(o) => {
                            let name = o.get("name").map(value_text).unwrap_or_default();
                            let value = o.get("value").map(value_text).unwrap_or_default();
                            out.push((name.to_lowercase(), value));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<String> {
        let name = name.to_lowercase();
        self.header_pairs()
            .into_iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `ai-router mock` on an ephemeral port.
#[derive(Debug)]
pub struct Mock {
    process: Process,
    base: String,
    client: reqwest::Client,
}

impl Mock {
    /// Runs `ai-router mock --host 127.0.0.1 --port 0` and reads `{"listening": ...}`.
    pub async fn start(dir: &TestDir, name: &str) -> Result<Self> {
        let bin = ai_router_bin()?;
        let args = ["mock", "--host", "127.0.0.1", "--port", "0"].map(String::from);
        let mut process = Process::spawn(dir, name, &bin, &args, &[])?;
        let line = process.first_json_line(START_TIMEOUT).await?;
        let listening = json_str(&line, "listening")
            .with_context(|| process.tail())?
            .trim_end_matches('/')
            .to_string();
        let mock = Self {
            process,
            base: listening,
            client: http_client()?,
        };
        let calls_url = format!("{}/_mock/calls", mock.base);
        let client = mock.client.clone();
        poll(
            &format!("{name} to answer /_mock/calls"),
            START_TIMEOUT,
            || {
                let req = client.get(&calls_url).send();
                async move { Ok(req.await?.status().is_success().then_some(())) }
            },
        )
        .await
        .with_context(|| mock.process.tail())?;
        Ok(mock)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The base URL a provider config points at: `http://127.0.0.1:<port>/v1`.
    pub fn api_base(&self) -> String {
        format!("{}/v1", self.base)
    }

    pub fn process(&self) -> &Process {
        &self.process
    }

    async fn control(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut req = self.client.request(method.clone(), &url);
        if let Some(b) = &body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {url}"))
            .with_context(|| self.process.tail())?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(anyhow!(
                "{method} {url} answered {status}: {text}\nbody sent: {body:?}"
            ))
            .with_context(|| self.process.tail());
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `PUT /_mock/script` with `{"rules": rules}`.
    pub async fn script(&self, rules: Value) -> Result<()> {
        self.control(
            reqwest::Method::PUT,
            "/_mock/script",
            Some(json!({ "rules": rules })),
        )
        .await
        .map(|_| ())
    }

    /// Every call received since the last clear, in order.
    pub async fn calls(&self) -> Result<Vec<MockCall>> {
        let v = self
            .control(reqwest::Method::GET, "/_mock/calls", None)
            .await?;
        let list = v
            .get("calls")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("GET /_mock/calls: no \"calls\" list in {v}"))?;
        let mut calls: Vec<MockCall> = list.iter().map(MockCall::from_value).collect();
        calls.sort_by_key(|c| c.seq);
        Ok(calls)
    }

    /// `DELETE /_mock/calls`.
    pub async fn clear_calls(&self) -> Result<()> {
        self.control(reqwest::Method::DELETE, "/_mock/calls", None)
            .await
            .map(|_| ())
    }

    /// `POST /_mock/reset`: no script, no calls.
    pub async fn reset(&self) -> Result<()> {
        self.control(reqwest::Method::POST, "/_mock/reset", None)
            .await
            .map(|_| ())
    }
}

// ---------------------------------------------------------------------------------------------
// The control plane

/// `ai-router serve` on ephemeral ports; can be stopped and restarted on the same gRPC port.
#[derive(Debug)]
pub struct ControlPlane {
    dir: TestDir,
    config: PathBuf,
    env: Vec<(String, String)>,
    process: Option<Process>,
    /// Every generation's logs, the running one last.
    stopped: Vec<Process>,
    generation: u32,
    http: SocketAddr,
    grpc: SocketAddr,
}

impl ControlPlane {
    /// Writes `config_yaml` to the test directory and serves it with `env`.
    pub async fn start(dir: &TestDir, config_yaml: &str, env: &[(String, String)]) -> Result<Self> {
        let config = dir.write("pool.yaml", config_yaml)?;
        let mut cp = Self {
            dir: dir.clone(),
            config,
            env: env.to_vec(),
            process: None,
            stopped: Vec::new(),
            generation: 0,
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            grpc: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        cp.spawn("127.0.0.1:0").await?;
        Ok(cp)
    }

    async fn spawn(&mut self, grpc_listen: &str) -> Result<()> {
        self.generation += 1;
        let name = if self.generation == 1 {
            "control-plane".to_string()
        } else {
            format!("control-plane-{}", self.generation)
        };
        let args = vec![
            "serve".to_string(),
            "--config".to_string(),
            self.config.display().to_string(),
            "--http-listen".to_string(),
            "127.0.0.1:0".to_string(),
            "--grpc-listen".to_string(),
            grpc_listen.to_string(),
        ];
        let mut process = Process::spawn(&self.dir, &name, &ai_router_bin()?, &args, &self.env)?;
        let line = process.first_json_line(START_TIMEOUT).await?;
        let http = parse_addr(json_str(&line, "http")?).with_context(|| process.tail())?;
        let grpc = parse_addr(json_str(&line, "grpc")?).with_context(|| process.tail())?;
        let client = http_client()?;
        let health = format!("http://{http}/health");
        poll("the control plane's /health", START_TIMEOUT, || {
            let req = client.get(&health).send();
            async move { Ok(req.await?.status().is_success().then_some(())) }
        })
        .await
        .with_context(|| process.tail())?;
        self.http = http;
        self.grpc = grpc;
        self.process = Some(process);
        Ok(())
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// Kills the control plane.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
            self.stopped.push(p);
        }
    }

    /// Starts it again on the same gRPC port (Envoy's cluster points there), with `env`
    /// replacing the variables of the same name. The port was just freed; a bind race is retried.
    pub async fn restart(&mut self, env: &[(String, String)]) -> Result<()> {
        self.stop();
        for (k, v) in env {
            self.env.retain(|(ek, _)| ek != k);
            self.env.push((k.clone(), v.clone()));
        }
        let grpc = self.grpc.to_string();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn(&grpc).await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    // Keep the failed generation's logs for the report, then try again.
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.context(format!("restarting the control plane on {grpc}"))),
            }
        }
    }

    /// Every generation's stdout and stderr.
    pub fn logs(&self) -> String {
        self.stopped
            .iter()
            .chain(self.process.iter())
            .map(Process::logs)
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn tail(&self) -> String {
        self.stopped
            .iter()
            .chain(self.process.iter())
            .map(Process::tail)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

// ---------------------------------------------------------------------------------------------
// Envoy

/// Envoy 1.40 with the bootstrap `ai-router render-envoy` renders, on ephemeral ports.
#[derive(Debug)]
pub struct Envoy {
    process: Process,
    render: Process,
    admin: String,
    listen: SocketAddr,
    bootstrap: PathBuf,
}

impl Envoy {
    /// Renders the bootstrap for `config` pointing at the control plane's gRPC address, runs
    /// Envoy, reads its listener's port from the admin API and waits until the filter has its
    /// state (`GET /v1/models` with `ready_key` answers 200).
    pub async fn start(
        dir: &TestDir,
        config: &Path,
        control_plane_grpc: SocketAddr,
        env: &[(String, String)],
        ready_key: &str,
    ) -> Result<Self> {
        let bin = ai_router_bin()?;
        let envoy = envoy_bin()?;
        let wasm = wasm_path()?;
        let bootstrap = dir.join("envoy.yaml");
        let args = vec![
            "render-envoy".to_string(),
            "--config".to_string(),
            config.display().to_string(),
            "--control-plane".to_string(),
            format!("127.0.0.1:{}", control_plane_grpc.port()),
            "--wasm".to_string(),
            wasm.display().to_string(),
            "--listen".to_string(),
            "127.0.0.1:0".to_string(),
            "--admin".to_string(),
            "127.0.0.1:0".to_string(),
            "--out".to_string(),
            bootstrap.display().to_string(),
        ];
        let mut render = Process::spawn(dir, "render-envoy", &bin, &args, env)?;
        let st = render.wait_exit(START_TIMEOUT).await?;
        if !st.success() || !bootstrap.is_file() {
            bail!(
                "ai-router {} failed ({st}) or wrote no {}\n{}",
                args.join(" "),
                bootstrap.display(),
                render.tail()
            );
        }

        let admin_path = dir.join("envoy-admin.txt");
        let envoy_args = vec![
            "-c".to_string(),
            bootstrap.display().to_string(),
            "--concurrency".to_string(),
            "2".to_string(),
            "--admin-address-path".to_string(),
            admin_path.display().to_string(),
            "--log-level".to_string(),
            std::env::var("AI_ROUTER_E2E_ENVOY_LOG").unwrap_or_else(|_| "warn".to_string()),
            // Several Envoys run at once: no shared memory between them.
            "--disable-hot-restart".to_string(),
        ];
        let mut process = Process::spawn(dir, "envoy", &envoy, &envoy_args, env)?;

        let admin = {
            let admin_path = admin_path.clone();
            let result = poll("Envoy's admin address file", ENVOY_READY_TIMEOUT, || {
                let status = process.try_status();
                let admin_path = admin_path.clone();
                async move {
                    if let Some(st) = status? {
                        bail!("Envoy exited ({st})");
                    }
                    let text = fs::read_to_string(&admin_path).unwrap_or_default();
                    let text = text.trim();
                    Ok((!text.is_empty()).then(|| text.to_string()))
                }
            })
            .await;
            result.with_context(|| process.tail())?
        };

        let client = http_client()?;
        let listeners_url = format!("http://{admin}/listeners?format=json");
        let listen = {
            let result = poll("Envoy's public listener", ENVOY_READY_TIMEOUT, || {
                let status = process.try_status();
                let req = client.get(&listeners_url).send();
                async move {
                    if let Some(st) = status? {
                        bail!("Envoy exited ({st})");
                    }
                    let v: Value = req.await?.json().await?;
                    Ok(public_listener(&v))
                }
            })
            .await;
            result.with_context(|| process.tail())?
        };

        let envoy = Self {
            process,
            render,
            admin,
            listen,
            bootstrap,
        };
        envoy.wait_ready(ready_key).await?;
        Ok(envoy)
    }

    /// Waits until `GET /v1/models` with `key` answers 200: the filter has received its state.
    pub async fn wait_ready(&self, key: &str) -> Result<()> {
        let client = http_client()?;
        let url = format!("{}/v1/models", self.base_url());
        let result = poll(
            "Envoy to answer GET /v1/models with 200",
            ENVOY_READY_TIMEOUT,
            || {
                let req = client.get(&url).bearer_auth(key).send();
                async move {
                    let resp = req.await?;
                    let status = resp.status();
                    if status == reqwest::StatusCode::OK {
                        return Ok(Some(()));
                    }
                    let text = resp.text().await.unwrap_or_default();
                    bail!("GET /v1/models answered {status}: {text}")
                }
            },
        )
        .await;
        result.with_context(|| self.process.tail())
    }

    /// `http://127.0.0.1:<listener port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.listen)
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// `host:port` of the admin interface.
    pub fn admin_addr(&self) -> &str {
        &self.admin
    }

    pub fn bootstrap_path(&self) -> &Path {
        &self.bootstrap
    }

    pub fn process(&self) -> &Process {
        &self.process
    }

    pub fn logs(&self) -> String {
        format!("{}\n{}", self.render.logs(), self.process.logs())
    }

    pub fn tail(&self) -> String {
        self.process.tail()
    }
}

/// The bound address of the one listener on a socket (the internal listener has none); a
/// listener named `public` wins if there are several.
fn public_listener(v: &Value) -> Option<SocketAddr> {
    let statuses = v.get("listener_statuses")?.as_array()?;
    let mut found: Vec<(String, SocketAddr)> = Vec::new();
    for l in statuses {
        let name = l.get("name").and_then(Value::as_str).unwrap_or_default();
        let sock = l.get("local_address").and_then(|a| a.get("socket_address"));
        let Some(sock) = sock else { continue };
        let host = sock
            .get("address")
            .and_then(Value::as_str)
            .unwrap_or("127.0.0.1");
        let port = sock.get("port_value").and_then(Value::as_u64).unwrap_or(0);
        if port == 0 {
            continue;
        }
        let host = if host == "0.0.0.0" { "127.0.0.1" } else { host };
        if let Ok(addr) = format!("{host}:{port}").parse() {
            found.push((name.to_string(), addr));
        }
    }
    found
        .iter()
        .find(|(n, _)| n == "public")
        .or_else(|| found.first())
        .map(|(_, a)| *a)
}

// ---------------------------------------------------------------------------------------------
// Client side

/// A unary answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    /// The body parsed as JSON, `Null` if it is not JSON.
    pub json: Value,
    pub text: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// The `error.code` of an OpenAI error object.
    pub fn error_code(&self) -> Option<&str> {
        self.json.pointer("/error/code").and_then(Value::as_str)
    }

    /// `choices[0].message.content`.
    pub fn content(&self) -> Option<&str> {
        self.json
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "HTTP {}", self.status)?;
        for (k, v) in &self.headers {
            writeln!(f, "{k}: {}", v.to_str().unwrap_or("<binary>"))?;
        }
        write!(f, "\n{}", self.text)
    }
}

/// A streamed answer: the `data:` payloads of its server-sent events, in order.
#[derive(Debug, Clone)]
pub struct StreamReply {
    pub status: u16,
    pub headers: HeaderMap,
    /// Each event's data (multi-line data joined with `\n`), `[DONE]` included.
    pub events: Vec<String>,
    /// The raw body as received.
    pub body: String,
    /// Set when the connection failed before the body ended.
    pub transport_error: Option<String>,
}

impl StreamReply {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// The events that parse as JSON (everything but `[DONE]`).
    pub fn json_events(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter_map(|e| serde_json::from_str(e).ok())
            .collect()
    }

    /// The chunks whose first choice's delta carries a role.
    pub fn role_chunks(&self) -> usize {
        self.json_events()
            .iter()
            .filter(|e| {
                e.pointer("/choices/0/delta/role")
                    .is_some_and(|r| !r.is_null())
            })
            .count()
    }

    /// Every `delta.content`, in order.
    pub fn contents(&self) -> Vec<String> {
        self.json_events()
            .iter()
            .filter_map(|e| {
                e.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
            })
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The concatenated content.
    pub fn text(&self) -> String {
        self.contents().concat()
    }
}

impl fmt::Display for StreamReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "HTTP {}", self.status)?;
        for (k, v) in &self.headers {
            writeln!(f, "{k}: {}", v.to_str().unwrap_or("<binary>"))?;
        }
        write!(f, "\n{}", self.body)?;
        if let Some(e) = &self.transport_error {
            write!(f, "\n<transport error: {e}>")?;
        }
        Ok(())
    }
}

/// Parses a server-sent-event body into its events' data. Events end at a blank line; lines
/// may end in `\n`, `\r\n` or `\r`; `data:` lines of one event are joined with `\n`; comments
/// and other fields are ignored. A final event without its blank line still counts.
pub fn parse_sse(body: &str) -> Vec<String> {
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    let normalized = body.replace("\r\n", "\n").replace('\r', "\n");
    for line in normalized.split('\n') {
        if line.is_empty() {
            if let Some(d) = data.take() {
                events.push(d);
            }
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            match data.as_mut() {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            }
        }
    }
    if let Some(d) = data {
        events.push(d);
    }
    events
}

/// A chat request body with one user message.
pub fn chat_body(model: &str, stream: bool) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{ "role": "user", "content": "Say hello." }],
    });
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// An HTTP client of the gateway.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// `base` is `http://host:port` (no `/v1`).
    pub fn new(base: &str) -> Result<Self> {
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            http: http_client()?,
        })
    }

    /// Any request; `body` is sent as is (so invalid JSON can be sent).
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<String>,
    ) -> Result<Reply> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method.clone(), &url);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp
            .text()
            .await
            .with_context(|| format!("reading the body of {method} {url}"))?;
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Reply {
            status,
            headers,
            json,
            text,
        })
    }

    /// `POST /v1/chat/completions` with `body`.
    pub async fn chat_with(&self, body: &Value, key: Option<&str>) -> Result<Reply> {
        self.request(
            reqwest::Method::POST,
            "/v1/chat/completions",
            key,
            Some(body.to_string()),
        )
        .await
    }

    /// A unary chat completion of `model`.
    pub async fn chat(&self, model: &str, key: Option<&str>) -> Result<Reply> {
        self.chat_with(&chat_body(model, false), key).await
    }

    /// A streamed chat completion of `model`.
    pub async fn stream(&self, model: &str, key: Option<&str>) -> Result<StreamReply> {
        self.stream_with(&chat_body(model, true), key).await
    }

    /// `POST /v1/chat/completions` with `body` (which should say `stream: true`), reading the
    /// body to its end or to the connection's failure.
    pub async fn stream_with(&self, body: &Value, key: Option<&str>) -> Result<StreamReply> {
        let url = format!("{}/v1/chat/completions", self.base);
        let mut req = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body.to_string());
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.with_context(|| format!("POST {url}"))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let mut bytes = Vec::new();
        let mut transport_error = None;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(b) => bytes.extend_from_slice(&b),
                Err(e) => {
                    transport_error = Some(format!("{e:#}"));
                    break;
                }
            }
        }
        let body = String::from_utf8_lossy(&bytes).into_owned();
        Ok(StreamReply {
            status,
            headers,
            events: parse_sse(&body),
            body,
            transport_error,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The standard gateway fixture

/// Two mock providers, the control plane and Envoy, for the standard pool:
///
/// - provider `p1` (openai-compatible, mock 1) with keys `a` (`P1_KEY_A`) and `b` (`P1_KEY_B`),
///   serving model `m1` (alias `chat`);
/// - provider `p2` (openai-compatible, mock 2) with key `c` (`P2_KEY_C`), serving model `m2`
///   (alias `backup`);
/// - `defaults.fallbacks: [m2]`, so a call for `chat`/`m1` tries p1's keys first and falls back
///   to p2; a short backoff keeps failover quick.
///
/// The virtual key is mounted from `STARCI_AI_KEY` (label `e2e`). When a test panics while the
/// fixture is alive, the tails of every process's logs are printed.
#[derive(Debug)]
pub struct Gateway {
    pub dir: TestDir,
    pub mock1: Mock,
    pub mock2: Mock,
    pub cp: ControlPlane,
    pub envoy: Envoy,
    pub client: Client,
    /// The mounted virtual key (`STARCI_AI_KEY`).
    pub virtual_key: String,
    /// The provider secrets: `a`, `b`, `c`.
    pub key_a: String,
    pub key_b: String,
    pub key_c: String,
    pub sync_token: String,
    pub admin_token: String,
}

/// The standard pool's YAML for two mock providers at `p1_base` and `p2_base`.
pub fn standard_pool(p1_base: &str, p2_base: &str) -> String {
    format!(
        r#"gateway:
  host: 127.0.0.1
  port: 0
  adminToken: {{ env: AI_ROUTER_ADMIN_TOKEN }}
  keyStore: {{ type: memory }}
controlPlane:
  host: 127.0.0.1
  httpPort: 0
  grpcPort: 0
providers:
  - id: p1
    kind: openai-compatible
    baseUrl: {p1_base}
    keys:
      - {{ alias: a, env: P1_KEY_A }}
      - {{ alias: b, env: P1_KEY_B }}
    models:
      - {{ id: m1, aliases: [chat] }}
  - id: p2
    kind: openai-compatible
    baseUrl: {p2_base}
    keys:
      - {{ alias: c, env: P2_KEY_C }}
    models:
      - {{ id: m2, aliases: [backup] }}
defaults:
  fallbacks: [m2]
  deadlineMs: 30000
resilience:
  backoff: {{ baseMs: 10, factor: 2, maxMs: 50 }}
"#
    )
}

/// A fresh virtual key for the `e2e` label.
pub fn new_virtual_key() -> String {
    format!("sk-starci-e2e-{}", random_hex(48))
}

impl Gateway {
    /// Starts the standard pool (see the type's docs).
    pub async fn start(test: &str) -> Result<Self> {
        Self::start_with(test, standard_pool).await
    }

    /// Starts the fixture with the pool `pool(p1_base, p2_base)` returns.
    pub async fn start_with(test: &str, pool: impl Fn(&str, &str) -> String) -> Result<Self> {
        let dir = TestDir::new(test)?;
        let mock1 = Mock::start(&dir, "mock1").await?;
        let mock2 = Mock::start(&dir, "mock2").await?;
        let virtual_key = new_virtual_key();
        let key_a = format!("sk-p1-a-{}", random_hex(24));
        let key_b = format!("sk-p1-b-{}", random_hex(24));
        let key_c = format!("sk-p2-c-{}", random_hex(24));
        let sync_token = format!("sync-{}", random_hex(32));
        let admin_token = format!("admin-{}", random_hex(32));
        let env: Vec<(String, String)> = [
            ("P1_KEY_A", key_a.as_str()),
            ("P1_KEY_B", key_b.as_str()),
            ("P2_KEY_C", key_c.as_str()),
            ("STARCI_AI_KEY", virtual_key.as_str()),
            ("AI_ROUTER_SYNC_TOKEN", sync_token.as_str()),
            ("AI_ROUTER_ADMIN_TOKEN", admin_token.as_str()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let yaml = pool(&mock1.api_base(), &mock2.api_base());
        let cp = ControlPlane::start(&dir, &yaml, &env)
            .await
            .context("starting the control plane")?;
        let envoy_env = vec![("AI_ROUTER_SYNC_TOKEN".to_string(), sync_token.clone())];
        let envoy = Envoy::start(
            &dir,
            cp.config_path(),
            cp.grpc_addr(),
            &envoy_env,
            &virtual_key,
        )
        .await
        .with_context(|| cp.tail())
        .context("starting Envoy")?;
        let client = Client::new(&envoy.base_url())?;
        Ok(Self {
            dir,
            mock1,
            mock2,
            cp,
            envoy,
            client,
            virtual_key,
            key_a,
            key_b,
            key_c,
            sync_token,
            admin_token,
        })
    }

    /// The OpenAI base URL of the gateway: `http://127.0.0.1:<port>/v1`.
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.envoy.base_url())
    }

    /// A unary chat completion with the virtual key.
    pub async fn chat(&self, model: &str) -> Result<Reply> {
        self.client.chat(model, Some(&self.virtual_key)).await
    }

    /// A streamed chat completion with the virtual key.
    pub async fn stream(&self, model: &str) -> Result<StreamReply> {
        self.client.stream(model, Some(&self.virtual_key)).await
    }

    /// Which provider key a secret is: `a`, `b`, `c`, or the secret itself when unknown.
    pub fn alias_of(&self, secret: Option<&str>) -> String {
        match secret {
            Some(s) if s == self.key_a => "a".into(),
            Some(s) if s == self.key_b => "b".into(),
            Some(s) if s == self.key_c => "c".into(),
            Some(s) => format!("<unknown key {s}>"),
            None => "<no key>".into(),
        }
    }

    /// Every call both mocks received, as `(alias, call)`, mock 1's first.
    pub async fn provider_calls(&self) -> Result<Vec<(String, MockCall)>> {
        let mut out = Vec::new();
        for mock in [&self.mock1, &self.mock2] {
            for call in mock.calls().await? {
                out.push((self.alias_of(call.key.as_deref()), call));
            }
        }
        Ok(out)
    }

    /// The aliases of the keys that received calls, mock 1's calls first, each mock in order.
    pub async fn keys_called(&self) -> Result<Vec<String>> {
        Ok(self
            .provider_calls()
            .await?
            .into_iter()
            .map(|(a, _)| a)
            .collect())
    }

    /// Clears both mocks' call logs.
    pub async fn clear_calls(&self) -> Result<()> {
        self.mock1.clear_calls().await?;
        self.mock2.clear_calls().await
    }

    /// Every secret of the fixture: provider keys, the virtual key, the sync and admin tokens.
    pub fn secrets(&self) -> Vec<(&'static str, &str)> {
        vec![
            ("P1_KEY_A", &self.key_a),
            ("P1_KEY_B", &self.key_b),
            ("P2_KEY_C", &self.key_c),
            ("STARCI_AI_KEY", &self.virtual_key),
            ("AI_ROUTER_SYNC_TOKEN", &self.sync_token),
            ("AI_ROUTER_ADMIN_TOKEN", &self.admin_token),
        ]
    }

    /// Fails when a secret appears in the control plane's or Envoy's logs (every generation).
    pub fn check_no_secrets_in_logs(&self) -> Result<()> {
        let logs = [
            ("control plane", self.cp.logs()),
            ("envoy", self.envoy.logs()),
        ];
        let mut leaks = Vec::new();
        for (who, text) in &logs {
            for (name, secret) in self.secrets() {
                if text.contains(secret) {
                    leaks.push(format!("{name} appears in the {who} logs"));
                }
            }
        }
        if leaks.is_empty() {
            Ok(())
        } else {
            bail!(
                "secrets leaked into logs under {}: {}",
                self.dir.path().display(),
                leaks.join("; ")
            )
        }
    }

    /// The tails of every process's logs.
    pub fn tails(&self) -> String {
        format!(
            "logs in {}\n{}\n{}\n{}\n{}",
            self.dir.path().display(),
            self.cp.tail(),
            self.envoy.tail(),
            self.mock1.process().tail(),
            self.mock2.process().tail()
        )
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "\n===== process logs of the failed test =====\n{}",
                self.tails()
            );
        }
    }
}

/// Mock script building blocks (`PUT /_mock/script`).
pub mod script {
    use serde_json::{json, Value};

    /// A rule: `match` (any of `key`, `model`, `path`) and replies used in order, the last
    /// repeating.
    pub fn rule(matcher: Value, replies: Vec<Value>) -> Value {
        json!({ "match": matcher, "replies": replies })
    }

    /// A rule for every request.
    pub fn always(replies: Vec<Value>) -> Value {
        rule(json!({}), replies)
    }

    /// A rule for one provider key (its secret).
    pub fn for_key(key: &str, replies: Vec<Value>) -> Value {
        rule(json!({ "key": key }), replies)
    }

    /// A successful reply: `text` for a unary call, `chunks` (whose concatenation is `text`)
    /// for a stream.
    pub fn text(text: &str) -> Value {
        json!({ "text": text })
    }

    /// A streamed reply of `chunks`.
    pub fn stream(chunks: &[&str]) -> Value {
        json!({ "text": chunks.concat(), "stream": { "chunks": chunks } })
    }

    /// A streamed reply that fails after `fail_after` content chunks with `fail_with`
    /// (`network`, `error-event` or `truncate`).
    pub fn stream_failing(chunks: &[&str], fail_after: usize, fail_with: &str) -> Value {
        json!({
            "stream": { "chunks": chunks, "failAfter": fail_after, "failWith": fail_with }
        })
    }

    /// An HTTP status with headers and, if given, a JSON body.
    pub fn status(status: u16, headers: Value, body: Option<Value>) -> Value {
        let mut r = json!({ "status": status, "headers": headers });
        if let Some(b) = body {
            r["body"] = b;
        }
        r
    }
}

/// Checks the OpenAI error shape `{"error": {"message", "type", "param", "code"}}` with `code`
/// and returns a description of what is wrong, if anything.
pub fn openai_error_problem(reply: &Reply, status: u16, code: &str) -> Option<String> {
    let mut problems = Vec::new();
    if reply.status != status {
        problems.push(format!("status {} (expected {status})", reply.status));
    }
    match reply.json.get("error") {
        Some(Value::Object(e)) => {
            let message = e.get("message").and_then(Value::as_str).unwrap_or_default();
            if message.is_empty() {
                problems.push("error.message is not a non-empty string".into());
            }
            if !e.get("type").is_some_and(Value::is_string) {
                problems.push("error.type is not a string".into());
            }
            if !e.contains_key("param") {
                problems.push("error.param is missing (null is fine)".into());
            }
            if e.get("code").and_then(Value::as_str) != Some(code) {
                problems.push(format!(
                    "error.code is {:?} (expected {code:?})",
                    e.get("code")
                ));
            }
        }
        _ => problems.push("no error object".into()),
    }
    let ct = reply.header("content-type").unwrap_or_default();
    if !ct.starts_with("application/json") {
        problems.push(format!("content-type {ct:?} (expected application/json)"));
    }
    (!problems.is_empty()).then(|| format!("{}\n--- reply ---\n{reply}", problems.join("; ")))
}

// ---------------------------------------------------------------------------------------------
// Custom pools (routing and resilience tests)

/// The `gateway` and `controlPlane` sections every custom pool starts with: loopback, port 0,
/// a memory key store. Append `providers`, `profiles`, `resilience`... after it.
pub fn pool_yaml_header() -> String {
    "gateway: { host: 127.0.0.1, port: 0, keyStore: { type: memory } }\n\
     controlPlane: { host: 127.0.0.1, httpPort: 0, grpcPort: 0 }\n"
        .to_string()
}

/// What a custom pool's builder returns.
#[derive(Debug, Clone, Default)]
pub struct PoolSetup {
    /// The whole pool YAML (start from [`pool_yaml_header`]).
    pub yaml: String,
    /// Variables for the control plane (provider key variables, `_FILE` paths...).
    /// `STARCI_AI_KEY` and `AI_ROUTER_SYNC_TOKEN` are added by the fixture.
    pub env: Vec<(String, String)>,
    /// `(secret, name)`: how the tests name the provider secrets the mocks see.
    pub names: Vec<(String, String)>,
}

impl PoolSetup {
    /// Adds a provider secret in variable `var`, named `name` in the mock's calls.
    pub fn secret_env(&mut self, var: &str, name: &str) -> String {
        let secret = format!("sk-{name}-{}", random_hex(24));
        self.env.push((var.to_string(), secret.clone()));
        self.names.push((secret.clone(), name.to_string()));
        secret
    }

    /// Names a secret held elsewhere (a file) without putting it in the environment.
    pub fn name_secret(&mut self, secret: &str, name: &str) {
        self.names.push((secret.to_string(), name.to_string()));
    }
}

/// One call a mock received, with the mock's index and the name of its key.
#[derive(Debug, Clone)]
pub struct NamedCall {
    pub mock: usize,
    pub key: String,
    pub call: MockCall,
}

/// `n` mock providers, the control plane serving a custom pool, and Envoy. The builder gets the
/// mocks' URLs (`http://127.0.0.1:<port>`, no `/v1`, so a provider can hang its own path from
/// it) and the test directory (for secret files, an SQLite path). The tails of every log are
/// printed when a test panics while it is alive.
#[derive(Debug)]
pub struct Pool {
    pub dir: TestDir,
    pub mocks: Vec<Mock>,
    pub cp: ControlPlane,
    pub envoy: Envoy,
    pub client: Client,
    pub virtual_key: String,
    pub sync_token: String,
    names: Vec<(String, String)>,
    cp_env: Vec<(String, String)>,
    /// Extra control planes and Envoys (a second process sharing a state store).
    pub others: Vec<(ControlPlane, Envoy)>,
}

impl Pool {
    /// Starts `mocks` mocks, then the control plane on the pool `build` returns, then Envoy.
    pub async fn start(
        test: &str,
        mocks: usize,
        build: impl FnOnce(&[String], &TestDir) -> Result<PoolSetup>,
    ) -> Result<Self> {
        let dir = TestDir::new(test)?;
        let mut started = Vec::new();
        for i in 0..mocks {
            started.push(Mock::start(&dir, &format!("mock{}", i + 1)).await?);
        }
        let urls: Vec<String> = started.iter().map(|m| m.url().to_string()).collect();
        let setup = build(&urls, &dir)?;
        let virtual_key = new_virtual_key();
        let sync_token = format!("sync-{}", random_hex(32));
        let mut cp_env = setup.env.clone();
        cp_env.push(("STARCI_AI_KEY".into(), virtual_key.clone()));
        cp_env.push(("AI_ROUTER_SYNC_TOKEN".into(), sync_token.clone()));
        let cp = ControlPlane::start(&dir, &setup.yaml, &cp_env)
            .await
            .context("starting the control plane")?;
        let envoy_env = vec![("AI_ROUTER_SYNC_TOKEN".to_string(), sync_token.clone())];
        let envoy = Envoy::start(
            &dir,
            cp.config_path(),
            cp.grpc_addr(),
            &envoy_env,
            &virtual_key,
        )
        .await
        .with_context(|| cp.tail())
        .context("starting Envoy")?;
        let client = Client::new(&envoy.base_url())?;
        Ok(Self {
            dir,
            mocks: started,
            cp,
            envoy,
            client,
            virtual_key,
            sync_token,
            names: setup.names,
            cp_env,
            others: Vec::new(),
        })
    }

    /// The name of a provider secret (or a note that it is unknown).
    pub fn name_of(&self, secret: Option<&str>) -> String {
        match secret {
            Some(s) => self
                .names
                .iter()
                .find(|(k, _)| k == s)
                .map(|(_, n)| n.clone())
                .unwrap_or_else(|| format!("<unknown key {s}>")),
            None => "<no key>".into(),
        }
    }

    /// Every call every mock received, mock by mock, each in order.
    pub async fn calls(&self) -> Result<Vec<NamedCall>> {
        let mut out = Vec::new();
        for (i, mock) in self.mocks.iter().enumerate() {
            for call in mock.calls().await? {
                out.push(NamedCall {
                    mock: i,
                    key: self.name_of(call.key.as_deref()),
                    call,
                });
            }
        }
        Ok(out)
    }

    /// The names of the keys that received calls, in order (mock by mock).
    pub async fn keys_called(&self) -> Result<Vec<String>> {
        Ok(self.calls().await?.into_iter().map(|c| c.key).collect())
    }

    /// Clears every mock's call log.
    pub async fn clear_calls(&self) -> Result<()> {
        for m in &self.mocks {
            m.clear_calls().await?;
        }
        Ok(())
    }

    /// A unary chat completion of `model` with the virtual key.
    pub async fn chat(&self, model: &str) -> Result<Reply> {
        self.client.chat(model, Some(&self.virtual_key)).await
    }

    /// `POST /v1/chat/completions` with `body` and the virtual key.
    pub async fn chat_with(&self, body: &Value) -> Result<Reply> {
        self.client.chat_with(body, Some(&self.virtual_key)).await
    }

    /// The control plane's variables (what it was started with, `STARCI_AI_KEY` included).
    pub fn control_plane_env(&self) -> &[(String, String)] {
        &self.cp_env
    }

    /// Replaces Envoy with a fresh one (no memory of earlier calls) synced to the control plane.
    pub async fn restart_envoy(&mut self) -> Result<()> {
        let envoy_env = vec![("AI_ROUTER_SYNC_TOKEN".to_string(), self.sync_token.clone())];
        self.envoy.process.kill();
        // Envoy::start reads the admin address from this file: not the old Envoy's.
        let _ = fs::remove_file(self.dir.join("envoy-admin.txt"));
        let envoy = Envoy::start(
            &self.dir,
            self.cp.config_path(),
            self.cp.grpc_addr(),
            &envoy_env,
            &self.virtual_key,
        )
        .await
        .with_context(|| self.cp.tail())
        .context("starting a new Envoy")?;
        self.client = Client::new(&envoy.base_url())?;
        self.envoy = envoy;
        Ok(())
    }

    /// Starts a second control plane on the same pool YAML and variables (in its own
    /// directory, `<test>-<name>`), and an Envoy synced to it; returns its index in `others`.
    pub async fn start_other(&mut self, name: &str) -> Result<usize> {
        let yaml = fs::read_to_string(self.cp.config_path())
            .with_context(|| format!("reading {}", self.cp.config_path().display()))?;
        let base = self
            .dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = TestDir::new(&format!("{base}-{name}"))?;
        let cp = ControlPlane::start(&dir, &yaml, &self.cp_env)
            .await
            .with_context(|| format!("starting control plane {name}"))?;
        let envoy_env = vec![("AI_ROUTER_SYNC_TOKEN".to_string(), self.sync_token.clone())];
        let envoy = Envoy::start(
            &dir,
            cp.config_path(),
            cp.grpc_addr(),
            &envoy_env,
            &self.virtual_key,
        )
        .await
        .with_context(|| cp.tail())
        .with_context(|| format!("starting the Envoy of control plane {name}"))?;
        self.others.push((cp, envoy));
        Ok(self.others.len() - 1)
    }

    /// The tails of every process's logs.
    pub fn tails(&self) -> String {
        let mut out = format!(
            "logs in {}\n{}\n{}",
            self.dir.path().display(),
            self.cp.tail(),
            self.envoy.tail()
        );
        for (cp, envoy) in &self.others {
            out.push_str(&cp.tail());
            out.push_str(&envoy.tail());
        }
        for m in &self.mocks {
            out.push_str(&m.process().tail());
        }
        out
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "\n===== process logs of the failed test =====\n{}",
                self.tails()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parsing_handles_line_endings_multiline_data_and_comments() {
        let body =
            ": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: l1\ndata: l2\n\ndata: [DONE]";
        assert_eq!(parse_sse(body), vec!["{\"a\":1}", "l1\nl2", "[DONE]"]);
        assert_eq!(parse_sse("data:x\n\n\n\ndata: y\n\n"), vec!["x", "y"]);
    }

    #[test]
    fn a_missing_tool_is_an_error_naming_the_setup_script() {
        let err = tool_from_env(
            "AI_ROUTER_E2E_UNSET_VARIABLE",
            PathBuf::from("/nonexistent/envoy"),
            "Envoy",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("./scripts/setup.sh"), "{err}");
        assert!(err.contains("./scripts/test.sh"), "{err}");
        assert!(err.contains("/nonexistent/envoy"), "{err}");
    }

    #[test]
    fn public_listener_skips_internal_listeners() {
        let v = json!({"listener_statuses": [
            {"name": "attempt", "local_address": {"envoy_internal_address": {"server_listener_name": "attempt"}}},
            {"name": "public", "local_address": {"socket_address": {"address": "127.0.0.1", "port_value": 4242}}}
        ]});
        assert_eq!(
            public_listener(&v),
            Some(SocketAddr::from(([127, 0, 0, 1], 4242)))
        );
    }

    #[test]
    fn mock_call_headers_accept_maps_and_pairs() {
        let c = MockCall::from_value(
            &json!({"seq": 1, "headers": {"Authorization": "Bearer k", "x": ["1", "2"]}}),
        );
        assert_eq!(c.header("authorization").as_deref(), Some("Bearer k"));
        assert_eq!(c.header_pairs().len(), 3);
        let c = MockCall::from_value(&json!({"headers": [["Authorization", "Bearer k"]]}));
        assert_eq!(c.header("authorization").as_deref(), Some("Bearer k"));
    }
}
