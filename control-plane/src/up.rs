//! `ai-router up`: the local one-command run.
//!
//! Starts the control plane in-process: its HTTP (admin API, /health, /metrics) on
//! 127.0.0.1:`controlPlane.httpPort` (8081 by default, 0 picks one), its gRPC on an ephemeral
//! port. Variables holding a gateway virtual key (`sk-starci-...`, other than `STARCI_AI_KEY`)
//! are hidden from the pool and named on stderr, as are the providers keys were found for; with
//! no provider key, starts the mock provider in-process and serves the pool's model names from
//! it. Renders the Envoy bootstrap into a temp dir and runs Envoy (`ENVOY_BIN`, else `envoy` on
//! PATH) with a generated sync token; waits until Envoy's public listener answers; prints
//! `{"baseUrl":"http://HOST:PORT/v1","apiKey":"sk-starci-...","adminUrl":"http://127.0.0.1:8081"}`;
//! reloads the pool on SIGHUP and when the config file changes, as `serve` does (Envoy keeps
//! running; on the mock, each new file moves onto the same mock); stops everything on
//! SIGINT/SIGTERM (or when Envoy exits).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::RngCore;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::api::admin::ADMIN_TOKEN_ENV;
use crate::api::sync::SYNC_TOKEN_ENV;
use crate::config::secrets::{Env, MapEnv, ProcessEnv, Secret, SecretSource};
use crate::config::{
    self, Config, FileConfig, KeyConfig, ModelConfig, PolicyConfig, ProviderConfig, ProviderKind,
};
use crate::keys::mounted::{self, STARCI_AI_KEY};
use crate::mock::{self, MockOptions};
use crate::render::{render_envoy, RenderOptions};
use crate::serve::{self, join_host_port, StartOptions};

/// Where Envoy finds the module when nothing says otherwise (the container layout).
pub const DEFAULT_WASM_PATH: &str = "/etc/envoy/wasm/ai_router_filter.wasm";
const WASM_FILE: &str = "ai_router_filter.wasm";
const WASM_BUILD_PATH: &str = "target/wasm32-wasip1/release/ai_router_filter.wasm";
const DEFAULT_CONFIG: &str = "examples/pool.yaml";
/// The variable the mock provider's throwaway key is read from.
const MOCK_KEY_ENV: &str = "AI_ROUTER_MOCK_KEY";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const SETUP_HINT: &str = "run ./scripts/setup.sh";

#[derive(Debug, Clone, Default)]
pub struct UpOptions {
    pub config: Option<PathBuf>,
    pub wasm: Option<PathBuf>,
}

/// Overrides for [`render_options`] (the `render-envoy` flags).
#[derive(Debug, Clone, Default)]
pub struct RenderOverrides {
    pub control_plane: Option<(String, u16)>,
    /// Further control planes the Envoy fails over to.
    pub more_control_planes: Vec<(String, u16)>,
    pub wasm: Option<String>,
    pub listen: Option<(String, u16)>,
    pub admin: Option<(String, u16)>,
    /// The SDS folder of the sync channel's mutual TLS, as Envoy sees it.
    pub sync_tls_dir: Option<String>,
}

/// The bootstrap options for `config`: listen from `gateway`, the control plane from
/// `controlPlane.host` / `grpcPort`, the admin on 127.0.0.1:9901, the largest `maxAttempts`.
pub fn render_options(config: &Config, overrides: RenderOverrides) -> RenderOptions {
    let (listen_host, listen_port) = overrides
        .listen
        .unwrap_or_else(|| (config.gateway.host.clone(), config.gateway.port));
    let (admin_host, admin_port) = overrides
        .admin
        .unwrap_or_else(|| ("127.0.0.1".to_owned(), 9901));
    let (control_plane_host, control_plane_port) = overrides.control_plane.unwrap_or_else(|| {
        (
            config.control_plane.host.clone(),
            config.control_plane.grpc_port,
        )
    });
    RenderOptions {
        listen_host,
        listen_port,
        admin_host,
        admin_port,
        control_plane_host,
        control_plane_port,
        more_control_planes: overrides.more_control_planes,
        wasm_path: overrides
            .wasm
            .unwrap_or_else(|| DEFAULT_WASM_PATH.to_owned()),
        sync_tls_dir: overrides.sync_tls_dir,
        max_body_bytes: config.gateway.max_body_bytes,
        max_attempts: config.max_attempts(),
        limits: config.gateway.limits,
        one_pass: config.gateway.one_pass.clone(),
    }
}

/// Splits `HOST:PORT` (`[v6]:PORT` too).
pub fn parse_host_port(value: &str) -> anyhow::Result<(String, u16)> {
    let (host, port) = value
        .rsplit_once(':')
        .with_context(|| format!("`{value}` is not HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .with_context(|| format!("`{value}`: the port is not a number from 0 to 65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        bail!("`{value}`: the host is missing");
    }
    Ok((host.to_owned(), port))
}

/// Replaces the providers with one `mock` provider at `base_url` serving every model id and
/// alias of the pool; profiles keep their models (provider restrictions are dropped: the only
/// provider left is the mock).
pub fn pool_on_mock(file: &mut FileConfig, base_url: &str) {
    let mut models: Vec<ModelConfig> = Vec::new();
    let mut ids = BTreeSet::new();
    for provider in &file.providers {
        for model in &provider.models {
            if ids.insert(model.id.clone()) {
                models.push(model.clone());
            } else if let Some(existing) = models.iter_mut().find(|m| m.id == model.id) {
                for alias in &model.aliases {
                    if !existing.aliases.contains(alias) {
                        existing.aliases.push(alias.clone());
                    }
                }
            }
        }
    }
    file.providers = vec![ProviderConfig {
        id: Some("mock".to_owned()),
        kind: Some(ProviderKind::OpenaiCompatible),
        base_url: Some(base_url.to_owned()),
        headers: Default::default(),
        weight: None,
        max_concurrency: None,
        default_max_tokens: None,
        budget: None,
        terms: None,
        discount: None,
        keys: vec![KeyConfig {
            alias: "mock-1".to_owned(),
            env: Some(MOCK_KEY_ENV.to_owned()),
            file: None,
            weight: None,
            max_concurrency: None,
            scope: None,
        }],
        keys_from_env: None,
        account_id: None,
        per_request_caps: None,
        daily_reset_timezone: None,
        rate_limit_headers: None,
        discover: None,
        discovery_ttl_ms: None,
        models,
        limits: None,
    }];
    let unpin = |policy: &mut PolicyConfig| {
        policy.providers = None;
        for tier in policy.candidates.iter_mut().flatten() {
            for candidate in &mut tier.0 {
                candidate.provider = Some("mock".to_owned());
            }
        }
    };
    if let Some(defaults) = file.defaults.as_mut() {
        unpin(defaults);
    }
    for profile in file.profiles.values_mut() {
        unpin(profile);
    }
}

/// The variables holding a gateway virtual key (`sk-starci-...`), other than `STARCI_AI_KEY`:
/// `up` never reads them as provider keys. Names only.
fn ignored_virtual_keys(env: &dyn Env) -> Vec<String> {
    env.names()
        .into_iter()
        .filter(|name| name != STARCI_AI_KEY)
        .filter(|name| env.var(name).is_some_and(|v| mounted::is_virtual_key(&v)))
        .collect()
}

/// The environment, with gateway virtual keys refused as provider keys only: `mountedKeys`
/// (`{ env: VAR }`) and `STARCI_AI_KEY` still read them.
struct VirtualKeysNotProviderKeys(Arc<dyn Env>);

impl Env for VirtualKeysNotProviderKeys {
    fn var(&self, name: &str) -> Option<String> {
        self.0.var(name)
    }

    fn names(&self) -> Vec<String> {
        self.0.names()
    }

    fn refuses_as_provider_key(&self, value: &str) -> bool {
        mounted::is_virtual_key(value) || self.0.refuses_as_provider_key(value)
    }
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

/// `--wasm`, `AI_ROUTER_WASM`, next to the executable, or the release build under the working
/// directory or the executable's ancestors.
pub fn find_wasm(explicit: Option<&Path>, env: &dyn Env) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        bail!("--wasm {}: no such file", path.display());
    }
    if let Some(path) = env.var("AI_ROUTER_WASM").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        bail!("AI_ROUTER_WASM={}: no such file", path.display());
    }
    let mut candidates = Vec::new();
    let exe = std::env::current_exe().ok();
    if let Some(dir) = exe.as_deref().and_then(Path::parent) {
        candidates.push(dir.join(WASM_FILE));
    }
    if let Ok(cwd) = std::env::current_dir() {
        candidates.push(cwd.join(WASM_BUILD_PATH));
    }
    if let Some(exe) = &exe {
        candidates.extend(exe.ancestors().skip(1).map(|dir| dir.join(WASM_BUILD_PATH)));
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "{WASM_FILE} not found (looked for --wasm, AI_ROUTER_WASM, next to the executable \
                 and {WASM_BUILD_PATH}); {SETUP_HINT} to build it"
            )
        })
}

/// `ENVOY_BIN`, else `envoy` on PATH.
pub fn find_envoy(env: &dyn Env) -> anyhow::Result<PathBuf> {
    if let Some(bin) = env.var("ENVOY_BIN").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(&bin);
        if path.is_file() {
            return Ok(path);
        }
        bail!("ENVOY_BIN={bin}: no such file; {SETUP_HINT} to install Envoy");
    }
    // PATH, then the venv scripts/setup.sh installs Envoy into.
    let venv = std::env::current_dir()
        .ok()
        .map(|cwd| cwd.join(".venv").join("bin"));
    env.var("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain(venv)
        .map(|dir| dir.join("envoy"))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "envoy not found (set ENVOY_BIN, put envoy on PATH or install it into ./.venv); \
                 {SETUP_HINT} to install it"
            )
        })
}

/// A temp dir removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "ai-router-up-{}-{}",
            std::process::id(),
            random_hex(4)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `ai-router up`.
pub async fn up(opts: UpOptions) -> anyhow::Result<()> {
    let config_path = config_path(opts.config)?;
    let mut file = config::read(&config_path)?;
    let process_env = env_without_virtual_keys(Arc::new(ProcessEnv));
    let mut overlay = MapEnv::default();
    let api_key = app_key(process_env.as_ref(), &mut overlay);
    let has_keys = report_provider_keys(&file, process_env.as_ref(), &config_path)?;
    // Fail on a missing tool before starting anything.
    let envoy_bin = find_envoy(process_env.as_ref())?;
    let wasm = find_wasm(opts.wasm.as_deref(), process_env.as_ref())?;
    let (mock_handle, edit) = if has_keys {
        (None, None)
    } else {
        let (handle, edit) = serve_pool_from_mock(&mut file, &mut overlay).await?;
        (Some(handle), Some(edit))
    };
    let env: Arc<dyn Env> = Arc::new(overlay.overlay(process_env.clone()));
    let config = config::resolve_at(&file, env.as_ref(), &config_path)?;

    let sync_token = Secret::new(random_hex(32));
    let dir = TempDir::new()?;
    let (sync_tls, envoy_tls_dir) = issue_sync_certs(&dir)?;
    let admin_enabled = crate::api::admin::admin_token(&config, env.as_ref()).is_some();
    let mut running = start_control_plane(&config, env, &sync_token, sync_tls).await?;
    running.watch_config_edited(config_path.clone(), edit);
    let admin_url = format!("http://{}", running.http_addr);
    if !admin_enabled {
        eprintln!(
            "ai-router up: the admin API at {admin_url} is off: export {ADMIN_TOKEN_ENV} before `ai-router up` to manage keys through it"
        );
    }

    let listen_host = if config.gateway.host_explicit {
        config.gateway.host.clone()
    } else {
        "127.0.0.1".to_owned()
    };
    let options = render_options(
        &config,
        RenderOverrides {
            control_plane: Some(("127.0.0.1".to_owned(), running.grpc_addr.port())),
            more_control_planes: Vec::new(),
            wasm: Some(wasm.display().to_string()),
            listen: Some((listen_host.clone(), config.gateway.port)),
            admin: Some(("127.0.0.1".to_owned(), 0)),
            sync_tls_dir: Some(envoy_tls_dir),
        },
    );
    let bootstrap = dir.0.join("bootstrap.yaml");
    std::fs::write(&bootstrap, render_envoy(&options))
        .with_context(|| format!("writing {}", bootstrap.display()))?;
    let admin_file = dir.0.join("admin-address");
    let mut envoy = spawn_envoy(&envoy_bin, &bootstrap, &admin_file, &sync_token)?;

    let public = wait_until_ready(&mut envoy, &admin_file, &listen_host, config.gateway.port).await;
    let public = match public {
        Ok(addr) => addr,
        Err(err) => {
            let _ = envoy.start_kill();
            running.shutdown().await;
            return Err(err);
        }
    };
    print_ready_line(&listen_host, public, &api_key, &admin_url);
    tracing::info!(gateway = %public, control_plane = %running.grpc_addr, "ai-router is up");

    let outcome = run_until_stopped(&mut envoy, &admin_file).await;
    tracing::info!("stopping");
    let _ = envoy.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(5), envoy.wait()).await;
    running.shutdown().await;
    drop(mock_handle);
    drop(dir);
    outcome
}

/// `--config`, else `DEFAULT_CONFIG` in the current folder.
fn config_path(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match given {
        Some(path) => Ok(path),
        None if Path::new(DEFAULT_CONFIG).is_file() => Ok(PathBuf::from(DEFAULT_CONFIG)),
        None => bail!("no --config given and {DEFAULT_CONFIG} is not here"),
    }
}

/// The process environment without the variables that hold a gateway virtual key, saying which.
fn env_without_virtual_keys(process_env: Arc<dyn Env>) -> Arc<dyn Env> {
    // A gateway virtual key is never a provider key: with the quick start's OPENAI_API_KEY
    // exported for the app, the pool would otherwise send the gateway's own key to itself.
    for name in ignored_virtual_keys(process_env.as_ref()) {
        eprintln!(
            "ai-router up: not reading {name} as a provider key: it holds a gateway virtual key (sk-starci-...); mountedKeys may still name it (to keep the app's key across runs, export it as {STARCI_AI_KEY})"
        );
    }
    Arc::new(VirtualKeysNotProviderKeys(process_env))
}

/// The app's key: STARCI_AI_KEY (or the file STARCI_AI_KEY_FILE names), else a fresh local
/// one set in `overlay`. Either way the control plane mounts it from the environment
/// ([`mounted::mounted_keys`]).
fn app_key(process_env: &dyn Env, overlay: &mut MapEnv) -> Secret {
    let app_key_source = SecretSource::EnvOrFileEnv {
        var: STARCI_AI_KEY.to_owned(),
        file_var: format!("{STARCI_AI_KEY}_FILE"),
    };
    match app_key_source.resolve(process_env) {
        Some(key) => key,
        None => {
            let key = mounted::generate_secret("local");
            overlay.set(STARCI_AI_KEY, key.expose());
            key
        }
    }
}

/// Whether the environment holds a provider key for the pool; lists the providers it does.
fn report_provider_keys(
    file: &FileConfig,
    process_env: &dyn Env,
    config_path: &Path,
) -> anyhow::Result<bool> {
    let found = config::resolve_at(file, process_env, config_path)?.providers;
    if !found.is_empty() {
        let listed: Vec<String> = found
            .iter()
            .map(|p| {
                let aliases: Vec<&str> = p.keys.iter().map(|k| k.alias.as_str()).collect();
                format!("{} ({})", p.id, aliases.join(", "))
            })
            .collect();
        eprintln!(
            "ai-router up: provider keys found for: {}",
            listed.join("; ")
        );
    }
    Ok(!found.is_empty())
}

/// Starts the mock and points the pool at it (with a fresh mock key in `overlay`); returns the
/// mock and what a reload does to each file it reads, as to this one.
async fn serve_pool_from_mock(
    file: &mut FileConfig,
    overlay: &mut MapEnv,
) -> anyhow::Result<(mock::MockHandle, crate::reload::EditFile)> {
    let handle = mock::start(MockOptions {
        host: "127.0.0.1".to_owned(),
        port: 0,
        script: None,
    })
    .await?;
    let base_url = format!("http://{}/v1", handle.addr());
    tracing::info!(url = %base_url, "no provider key in the environment: serving the pool from the mock");
    pool_on_mock(file, &base_url);
    let edit: crate::reload::EditFile =
        Arc::new(move |file: &mut FileConfig| pool_on_mock(file, &base_url));
    overlay.set(MOCK_KEY_ENV, format!("sk-mock-{}", random_hex(16)));
    Ok((handle, edit))
}

/// The sync channel's certificates, for this run only: Envoy and the control plane speak
/// mutual TLS even on loopback, as they would across hosts. Returns the control plane's files
/// and the Envoy's folder.
fn issue_sync_certs(dir: &TempDir) -> anyhow::Result<(crate::tls::SyncTlsFiles, String)> {
    let certs = crate::tls::issue::issue(&crate::tls::issue::IssueOptions {
        out: dir.0.join("sync-tls"),
        sans: Vec::new(),
        envoys: 1,
        envoy_dir: None,
        new_ca: false,
    })
    .context("issuing the sync channel's certificates")?;
    let sync_tls = crate::tls::SyncTlsFiles {
        cert: certs.control_plane.join(crate::tls::CERT_FILE),
        key: certs.control_plane.join(crate::tls::KEY_FILE),
        client_ca: certs.control_plane.join(crate::tls::CA_FILE),
    };
    let envoy_tls_dir = certs
        .envoys
        .first()
        .map(|d| d.display().to_string())
        .context("no Envoy certificate was issued")?;
    Ok((sync_tls, envoy_tls_dir))
}

/// The control plane of this run: the admin API on a port the README and `keys --url` can name
/// (controlPlane.httpPort, 8081 by default; 0 picks one), gRPC internal to this run.
async fn start_control_plane(
    config: &Config,
    env: Arc<dyn Env>,
    sync_token: &Secret,
    sync_tls: crate::tls::SyncTlsFiles,
) -> anyhow::Result<serve::Running> {
    let admin_port = config.control_plane.http_port;
    serve::start(
        config.clone(),
        env,
        StartOptions {
            http_listen: join_host_port("127.0.0.1", admin_port),
            grpc_listen: "127.0.0.1:0".to_owned(),
            sync_token: Some(sync_token.clone()),
            insecure_trusted_sync: false,
            sync_tls: Some(sync_tls),
            insecure_plaintext_sync: false,
        },
    )
    .await
    .map_err(|err| {
        let taken = err.chain().any(|cause| {
            cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::AddrInUse)
        });
        if taken {
            err.context(format!(
                "the admin API's port {admin_port} (controlPlane.httpPort) is taken, perhaps by \
                 another `ai-router up`: stop it, or set controlPlane.httpPort to a free port \
                 (0 picks one; up prints it as adminUrl)"
            ))
        } else {
            err
        }
    })
}

/// Starts Envoy on `bootstrap`, the sync token in its environment.
fn spawn_envoy(
    envoy_bin: &Path,
    bootstrap: &Path,
    admin_file: &Path,
    sync_token: &Secret,
) -> anyhow::Result<tokio::process::Child> {
    tokio::process::Command::new(envoy_bin)
        .arg("-c")
        .arg(bootstrap)
        .arg("--admin-address-path")
        .arg(admin_file)
        .arg("--use-dynamic-base-id")
        .args(["--log-level", "warn"])
        .env(SYNC_TOKEN_ENV, sync_token.expose())
        .stdin(Stdio::null())
        // Our stdout carries one JSON line; Envoy's output goes to stderr.
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", envoy_bin.display()))
}

/// The one JSON line on stdout: the base URL, the app's key and the admin URL.
fn print_ready_line(listen_host: &str, public: SocketAddr, api_key: &Secret, admin_url: &str) {
    let url_host = match listen_host {
        "0.0.0.0" | "::" => "127.0.0.1".to_owned(),
        host => host.to_owned(),
    };
    let line = json!({
        "baseUrl": format!("http://{}/v1", join_host_port(&url_host, public.port())),
        "apiKey": api_key.expose(),
        "adminUrl": admin_url,
    });
    if let Err(err) = crate::stdout::print_line(&line.to_string()) {
        tracing::warn!(%err, "cannot print the ready line on stdout");
    }
}

/// Runs until a signal or Envoy's exit; on a signal, drains Envoy first (stop taking calls, let
/// the ones in flight, streams included, finish).
async fn run_until_stopped(
    envoy: &mut tokio::process::Child,
    admin_file: &Path,
) -> anyhow::Result<()> {
    let outcome = tokio::select! {
        signal = serve::shutdown_signal() => signal,
        status = envoy.wait() => Err(anyhow::anyhow!("envoy exited: {}", status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()))),
    };
    if outcome.is_ok() {
        match std::fs::read_to_string(admin_file) {
            Ok(admin) => {
                if let Err(err) = crate::drain::drain_envoy(admin.trim(), DRAIN_GRACE).await {
                    tracing::warn!("stopping without a drain: {err:#}");
                }
            }
            Err(err) => tracing::warn!(%err, "no Envoy admin address: stopping without a drain"),
        }
    }
    outcome
}

/// How long a stopping `up` lets the calls in flight finish and their outcomes be reported.
pub const DRAIN_GRACE: Duration = Duration::from_secs(30);

/// Waits until Envoy has written its admin address, reports the public listener and that
/// listener answers HTTP. Returns the public listener's address.
async fn wait_until_ready(
    envoy: &mut tokio::process::Child,
    admin_file: &Path,
    listen_host: &str,
    listen_port: u16,
) -> anyhow::Result<SocketAddr> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = envoy.try_wait()? {
            bail!("envoy exited before it was ready ({status}); see its log above");
        }
        if Instant::now() > deadline {
            bail!("envoy was not ready after {}s", READY_TIMEOUT.as_secs());
        }
        if let Some(addr) = public_listener(admin_file, listen_host, listen_port).await {
            if answers_http(addr).await {
                return Ok(addr);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The public listener's bound address from Envoy's admin `/listeners`, or `None` while it is
/// not there yet.
async fn public_listener(
    admin_file: &Path,
    listen_host: &str,
    listen_port: u16,
) -> Option<SocketAddr> {
    let admin = std::fs::read_to_string(admin_file).ok()?;
    let body = http_get(admin.trim(), "/listeners?format=json").await?;
    let value: serde_json::Value = serde_json::from_str(&body).ok()?;
    let statuses = value.get("listener_statuses")?.as_array()?;
    let mut ports = statuses.iter().filter_map(|status| {
        let socket = status.get("local_address")?.get("socket_address")?;
        let port = u16::try_from(socket.get("port_value")?.as_u64()?).ok()?;
        Some(port)
    });
    let port = if listen_port == 0 {
        ports.find(|p| *p != 0)?
    } else {
        ports.find(|p| *p == listen_port)?
    };
    let host = match listen_host {
        "0.0.0.0" | "::" => "127.0.0.1",
        host => host,
    };
    tokio::net::lookup_host(join_host_port(host, port))
        .await
        .ok()?
        .next()
}

async fn answers_http(addr: SocketAddr) -> bool {
    http_get(&addr.to_string(), "/v1/models").await.is_some()
}

/// A minimal HTTP/1.1 GET (Envoy refuses HTTP/1.0); `None` on any failure or a non-HTTP
/// answer, else the body.
async fn http_get(authority: &str, path: &str) -> Option<String> {
    let connect = tokio::net::TcpStream::connect(authority);
    let mut stream = tokio::time::timeout(Duration::from_secs(2), connect)
        .await
        .ok()?
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    if !text.starts_with("HTTP/1.1 ") {
        return None;
    }
    let (head, body) = text.split_once("\r\n\r\n")?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    Some(if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    })
}

/// Decodes a chunked body (enough for Envoy's admin answers).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size =
            usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    const POOL: &str = include_str!("../../examples/pool.yaml");

    #[test]
    fn the_example_pool_moves_onto_the_mock() -> Result<(), Box<dyn std::error::Error>> {
        let mut file = parse(POOL)?;
        pool_on_mock(&mut file, "http://127.0.0.1:1234/v1");
        let env = MapEnv::new([(MOCK_KEY_ENV, "sk-mock")]);
        let config = file.resolve(&env, Path::new("."))?;
        assert_eq!(config.providers.len(), 1);
        let mock = &config.providers[0];
        assert_eq!(mock.id, "mock");
        assert_eq!(mock.endpoint.authority, "127.0.0.1:1234");
        assert_eq!(mock.keys[0].alias, "mock-1");
        for name in [
            "gpt-4o-mini",
            "gpt-4o",
            "openai/gpt-4o-mini",
            "deepseek-chat",
            "fast",
            "smart",
        ] {
            assert!(mock.serves(name), "{name}");
        }
        assert_eq!(config.profiles.len(), 2);
        assert_eq!(config.profiles["lesson"].model.as_deref(), Some("fast"));
        Ok(())
    }

    #[test]
    fn render_options_follow_the_config() -> Result<(), Box<dyn std::error::Error>> {
        let env = MapEnv::new([("OPENAI_API_KEY", "k")]);
        let config = parse(POOL)?.resolve(&env, Path::new("."))?;
        let o = render_options(&config, RenderOverrides::default());
        assert_eq!((o.listen_host.as_str(), o.listen_port), ("127.0.0.1", 8080));
        assert_eq!(
            (o.control_plane_host.as_str(), o.control_plane_port),
            ("control-plane", 8082)
        );
        assert_eq!((o.admin_host.as_str(), o.admin_port), ("127.0.0.1", 9901));
        assert_eq!(o.wasm_path, DEFAULT_WASM_PATH);
        assert_eq!(o.max_body_bytes, 4 * 1024 * 1024);
        assert_eq!(o.max_attempts, 4);
        let o = render_options(
            &config,
            RenderOverrides {
                control_plane: Some(("127.0.0.1".into(), 1)),
                listen: Some(("127.0.0.1".into(), 0)),
                ..Default::default()
            },
        );
        assert_eq!(
            (o.control_plane_host.as_str(), o.control_plane_port),
            ("127.0.0.1", 1)
        );
        assert_eq!(o.listen_port, 0);
        Ok(())
    }

    #[test]
    fn the_quick_start_exports_do_not_turn_the_pool_onto_itself(
    ) -> Result<(), Box<dyn std::error::Error>> {
        // What the README's "First requests" has the user export, then `up` again.
        let app_key = mounted::generate_secret("local");
        let exported = Arc::new(MapEnv::new([
            ("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"),
            ("OPENAI_API_KEY", app_key.expose()),
            (STARCI_AI_KEY, app_key.expose()),
        ]));
        let file = parse(POOL)?;
        // Read as a provider key, the gateway's own key would route the pool to itself.
        let raw = file.resolve(exported.as_ref(), Path::new("."));
        assert!(
            matches!(&raw, Err(e) if e.to_string().contains("(from OPENAI_BASE_URL)")),
            "{raw:?}"
        );
        assert_eq!(ignored_virtual_keys(exported.as_ref()), ["OPENAI_API_KEY"]);
        let env = VirtualKeysNotProviderKeys(exported);
        // Still readable (mountedKeys may name it), never as a provider key.
        assert_eq!(env.var("OPENAI_API_KEY").as_deref(), Some(app_key.expose()));
        assert_eq!(env.var(STARCI_AI_KEY).as_deref(), Some(app_key.expose()));
        // No provider key left: up serves the pool from the mock.
        assert!(file.resolve(&env, Path::new("."))?.providers.is_empty());
        Ok(())
    }

    #[test]
    fn mounted_keys_read_virtual_keys_that_up_refuses_as_provider_keys(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let team = mounted::generate_secret("team");
        let listed = mounted::generate_secret("listed");
        let exported = Arc::new(MapEnv::new([
            ("TEAM_KEY", team.expose()),
            ("OPENAI_API_KEY", team.expose()),
            ("OPENAI_API_KEYS", listed.expose()),
        ]));
        let env = VirtualKeysNotProviderKeys(exported);
        let pool = format!(
            "{POOL}\nmountedKeys:\n  - {{ label: team, env: TEAM_KEY, profiles: [\"*\"] }}\n"
        );
        let config = parse(&pool)?.resolve(&env, Path::new("."))?;
        // Neither the single variable nor the list makes a provider key.
        assert!(config.providers.is_empty());
        let keys = mounted::mounted_keys(&config, &env)?;
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].label, "team");
        Ok(())
    }

    #[test]
    fn chunked_bodies() {
        assert_eq!(dechunk("4\r\nabcd\r\n3\r\nefg\r\n0\r\n\r\n"), "abcdefg");
    }

    #[test]
    fn host_port_parsing() -> Result<(), Box<dyn std::error::Error>> {
        assert_eq!(parse_host_port("127.0.0.1:80")?, ("127.0.0.1".into(), 80));
        assert_eq!(parse_host_port("[::1]:0")?, ("::1".into(), 0));
        assert!(parse_host_port("nope").is_err());
        assert!(parse_host_port(":80").is_err());
        Ok(())
    }

    #[test]
    fn missing_tools_name_the_setup_script() {
        let env = MapEnv::new([("PATH", "/nonexistent"), ("ENVOY_BIN", "")]);
        let message = find_envoy(&env).map(|_| ()).map_err(|e| e.to_string());
        assert!(
            matches!(&message, Err(m) if m.contains("scripts/setup.sh")),
            "{message:?}"
        );
        let env = MapEnv::new([("AI_ROUTER_WASM", "/nonexistent.wasm")]);
        let message = find_wasm(None, &env).map(|_| ()).map_err(|e| e.to_string());
        assert!(
            matches!(&message, Err(m) if m.contains("AI_ROUTER_WASM")),
            "{message:?}"
        );
    }
}
