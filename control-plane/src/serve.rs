//! `ai-router serve`: the control plane process.
//!
//! HTTP (axum):
//! - `GET /health` -> `{"status":"ok"|"degraded","version":N}`; degraded while no provider has a
//!   usable key (a secret that is set and not blacklisted). Always 200: the process is alive.
//!   With the admin token it adds the pool (see [`crate::api::admin`]).
//! - `/admin/keys...`: the admin API (see [`crate::api::admin`]).
//! - anything else -> 404 with an OpenAI error object.
//!
//! gRPC (tonic): `airouter.v1.Sync` (see [`crate::api::sync`]) and `airouter.v1.Admin` (see
//! [`crate::api::admin`]). Sync hands out every provider secret, so `serve` refuses to start without
//! a sync token ([`sync_access`]) unless told the channel is trusted (`--insecure-trusted-sync`
//! or `AI_ROUTER_INSECURE_TRUSTED_SYNC`), and then serves gRPC on loopback only. Admin needs
//! its own token and is off without one, whatever the sync token.
//!
//! [`start`] binds and runs everything in the background and is what `up` and the tests use;
//! [`serve`] is the CLI command: load (nothing is bound before the config is valid), start,
//! print one JSON line with the bound addresses, wait for SIGINT/SIGTERM, drain.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::admin::AdminApi;
use crate::api::error::{ApiError, ErrorCode};
use crate::api::sync::{SyncAccess, SyncService, INSECURE_TRUSTED_SYNC_ENV, SYNC_TOKEN_ENV};
use crate::clock::SystemClock;
use crate::config::secrets::{Env, ProcessEnv, Secret};
use crate::config::{self, Config, StoreSpec};
use crate::engine::Engine;
use crate::keys::mounted;
use crate::keys::operations::KeyAdmin;
use crate::keys::record::VirtualKeyRecord;
use crate::keys::usage::UsageRecorder;
use crate::reload::Reloader;
use crate::store::durable::StateStore;
use crate::store::memory::MemoryStateStore;
use crate::store::start_wait::{wait_for, OpenFailure};
use crate::store::state::SqliteStateStore;
use crate::tls::{SyncTlsFiles, INSECURE_PLAINTEXT_SYNC_ENV};

/// How long in-flight work gets to finish at shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub config: PathBuf,
    /// `HOST:PORT`; default from `controlPlane.host` / `httpPort`.
    pub http_listen: Option<String>,
    /// `HOST:PORT`; default from `controlPlane.host` / `grpcPort`.
    pub grpc_listen: Option<String>,
    /// Serve Sync without a token (loopback only).
    pub insecure_trusted_sync: bool,
    /// `--tls-cert`, `--tls-key`, `--client-ca` (all three, or none: `controlPlane.syncTls`).
    pub sync_tls: Option<SyncTlsFiles>,
    /// `--insecure-plaintext-sync`: serve Sync without TLS on a non-loopback address.
    pub insecure_plaintext_sync: bool,
}

/// What [`start`] needs beyond the config.
#[derive(Debug, Clone)]
pub struct StartOptions {
    pub http_listen: String,
    pub grpc_listen: String,
    /// Overrides `AI_ROUTER_SYNC_TOKEN` and `controlPlane.syncToken` (for `up`).
    pub sync_token: Option<Secret>,
    /// With no token anywhere, serve Sync unauthenticated on a loopback `grpc_listen`
    /// instead of refusing to start.
    pub insecure_trusted_sync: bool,
    /// Serve gRPC over mutual TLS with these files (wins over `controlPlane.syncTls`).
    pub sync_tls: Option<SyncTlsFiles>,
    /// Without TLS, serve gRPC on a non-loopback address all the same.
    pub insecure_plaintext_sync: bool,
}

/// A running control plane. [`Running::shutdown`] stops it; dropping it stops the tasks too.
pub struct Running {
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub engine: Arc<Engine>,
    pub admin: Arc<AdminApi>,
    /// What a reload replaces besides the engine's pool (see [`crate::reload`]).
    keys: Arc<KeyAdmin>,
    usage: Arc<UsageRecorder>,
    env: Arc<dyn Env>,
    /// Flips first: the listeners stop taking work, Watch streams end.
    shutdown: watch::Sender<bool>,
    /// Flips once the servers drained: the usage writer and the state store finish.
    finish: watch::Sender<bool>,
    /// The HTTP and gRPC servers, and the reloader.
    servers: Vec<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("http_addr", &self.http_addr)
            .field("grpc_addr", &self.grpc_addr)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// What reloads the pool from `path` (see [`crate::reload`]).
    pub fn reloader(&self, path: PathBuf) -> Reloader {
        Reloader {
            path,
            edit: None,
            env: self.env.clone(),
            engine: self.engine.clone(),
            keys: self.keys.clone(),
            usage: self.usage.clone(),
            ledger: self.admin.ledger().clone(),
            under_up: false,
        }
    }

    /// Reloads the pool from `path` on SIGHUP and when the file changes, until shutdown.
    pub fn watch_config(&mut self, path: PathBuf) {
        self.watch_config_edited(path, None);
    }

    /// [`Running::watch_config`], every file read edited by `edit` first (`ai-router up`).
    pub fn watch_config_edited(&mut self, path: PathBuf, edit: Option<crate::reload::EditFile>) {
        let mut reloader = self.reloader(path);
        reloader.edit = edit;
        reloader.under_up = true;
        let stop = self.shutdown.subscribe();
        self.servers.push(tokio::spawn(reloader.run(stop)));
    }

    /// The drain (see `docs/operations.md`): stops accepting (HTTP, gRPC) and reloading, ends
    /// the Watch streams (each Envoy keeps serving from the state it holds) and the event
    /// streams, lets the requests in flight (a `Report`, a `Lease`, an admin call) finish; then
    /// writes the usage rows of every acknowledged report and exchanges state with the store a
    /// last time. All of it within `DRAIN_TIMEOUT`; returns whether it drained in time.
    pub async fn shutdown(mut self) -> bool {
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
        let _ = self.shutdown.send(true);
        self.engine.events().close();
        let servers = futures::future::join_all(std::mem::take(&mut self.servers));
        let served = tokio::time::timeout_at(deadline, servers).await.is_ok();
        let _ = self.finish.send(true);
        let tasks = futures::future::join_all(std::mem::take(&mut self.tasks));
        let finished = tokio::time::timeout_at(deadline, tasks).await.is_ok();
        if served && finished {
            tracing::info!("drained");
        } else {
            tracing::warn!(
                servers = served,
                stores = finished,
                "the control plane did not drain within {DRAIN_TIMEOUT:?}"
            );
        }
        served && finished
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        let _ = self.finish.send(true);
        self.engine.events().close();
        for task in self.servers.iter().chain(&self.tasks) {
            task.abort();
        }
    }
}

/// The sync token: `AI_ROUTER_SYNC_TOKEN`, else `controlPlane.syncToken`; a configured reference
/// that resolves to nothing is an error (the channel would otherwise be open to anyone).
pub fn sync_token(config: &Config, env: &dyn Env) -> anyhow::Result<Option<Secret>> {
    if let Some(token) = env.var(SYNC_TOKEN_ENV).filter(|t| !t.trim().is_empty()) {
        return Ok(Some(Secret::new(token.trim())));
    }
    match &config.control_plane.sync_token {
        None => Ok(None),
        Some(source) => source.resolve(env).map(Some).with_context(|| {
            format!(
                "controlPlane.syncToken: {} resolves to nothing",
                source.describe()
            )
        }),
    }
}

/// Why `serve` will not start with no sync token.
fn missing_sync_token() -> String {
    format!(
        "no sync token: the gRPC Sync channel hands every provider key to whoever calls it, so it \
         needs one. Set {SYNC_TOKEN_ENV} (the same random value for the control plane and Envoy, \
         e.g. `openssl rand -hex 32`) or reference one in the config with \
         `controlPlane.syncToken: {{ env: NAME }}` or `{{ file: PATH }}`. Only where every local \
         process may read the provider keys, pass --insecure-trusted-sync (or set \
         {INSECURE_TRUSTED_SYNC_ENV}=1) to serve Sync without a token on a loopback address"
    )
}

/// Who may call Sync: the token (`opts.sync_token`, else [`sync_token`]); with none, the
/// trusted mode when asked for and `grpc_listen` is loopback only; else an error naming the ways
/// to set a token. Runs before anything is bound.
pub async fn sync_access(
    config: &Config,
    env: &dyn Env,
    opts: &StartOptions,
) -> anyhow::Result<SyncAccess> {
    let token = match &opts.sync_token {
        Some(token) => Some(token.clone()),
        None => sync_token(config, env)?,
    };
    if let Some(token) = token {
        return Ok(SyncAccess::Token(token));
    }
    if !opts.insecure_trusted_sync {
        anyhow::bail!(missing_sync_token());
    }
    if !loopback_only(&opts.grpc_listen).await? {
        anyhow::bail!(
            "--insecure-trusted-sync serves the Sync channel without a token, so it binds \
             loopback only: the gRPC listen address {} is not a loopback address (use \
             127.0.0.1:PORT or [::1]:PORT, or set {SYNC_TOKEN_ENV} to serve it on a network)",
            opts.grpc_listen
        );
    }
    Ok(SyncAccess::TrustedLoopback)
}

/// Whether every address `listen` resolves to is a loopback address.
async fn loopback_only(listen: &str) -> anyhow::Result<bool> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(listen)
        .await
        .with_context(|| format!("resolving the gRPC listen address {listen}"))?
        .collect();
    Ok(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()))
}

/// The mutual TLS the gRPC port is served with: `opts.sync_tls`, else `controlPlane.syncTls`.
/// Without either, a non-loopback `grpc_listen` is refused unless `insecure_plaintext_sync`:
/// the Sync channel carries every provider key, readable by anyone on the path. Runs before
/// anything is bound.
pub async fn sync_tls(
    config: &Config,
    opts: &StartOptions,
) -> anyhow::Result<Option<SyncTlsFiles>> {
    if let Some(files) = opts
        .sync_tls
        .clone()
        .or_else(|| config.control_plane.sync_tls.clone())
    {
        return Ok(Some(files));
    }
    if opts.insecure_plaintext_sync {
        return Ok(None);
    }
    if !loopback_only(&opts.grpc_listen).await? {
        anyhow::bail!(
            "the gRPC listen address {} is not a loopback address, and the Sync channel it \
             serves carries every provider key: serve it over mutual TLS with --tls-cert, \
             --tls-key and --client-ca (or {}, {}, {}, or controlPlane.syncTls; `ai-router \
             certs --out DIR` issues them), or, only on a network where nobody can read or \
             change the traffic, pass --insecure-plaintext-sync (or set {INSECURE_PLAINTEXT_SYNC_ENV}=1)",
            opts.grpc_listen,
            crate::tls::TLS_CERT_ENV,
            crate::tls::TLS_KEY_ENV,
            crate::tls::CLIENT_CA_ENV,
        );
    }
    Ok(None)
}

/// Opens the configured state store (blocking: SQLite opens and migrates the file). `env`
/// resolves a Redis URL.
pub fn open_state_store(spec: &StoreSpec, env: &dyn Env) -> anyhow::Result<Arc<dyn StateStore>> {
    Ok(match spec {
        StoreSpec::Redis {
            url,
            namespace,
            ca_file,
        } => {
            let resolved = url.resolve(env).with_context(|| {
                format!("stateStore.url: {} resolves to nothing", url.describe())
            })?;
            Arc::new(crate::store::redis::RedisStateStore::open(
                resolved.expose(),
                namespace,
                ca_file.as_deref(),
            )?)
        }
        StoreSpec::Postgres { .. } => anyhow::bail!("stateStore: postgres holds keys, not state"),
        StoreSpec::Memory => Arc::new(MemoryStateStore::default()),
        StoreSpec::Sqlite(path) => Arc::new(
            SqliteStateStore::open(path)
                .with_context(|| format!("stateStore: opening {}", path.display()))?,
        ),
    })
}

/// The most an admin request body may hold: key specs and patches are small JSON.
pub const ADMIN_BODY_LIMIT: usize = 64 * 1024;

/// The HTTP surface: `/health` and the admin API (see [`crate::api::admin`]). An `/admin/`
/// request is refused on its headers alone when its token is wrong or its scope too narrow
/// ([`crate::api::admin::guard`]), before its body is read, and a body past
/// [`ADMIN_BODY_LIMIT`] is refused (413).
pub fn http_router(admin: Arc<AdminApi>) -> Router {
    crate::api::admin::guarded(
        crate::api::admin::routes()
            .merge(crate::api::console::routes())
            .fallback(not_found)
            .layer(axum::extract::DefaultBodyLimit::max(ADMIN_BODY_LIMIT)),
        admin,
    )
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

/// Opens the key store (waiting for a Postgres that does not answer yet, up to
/// `storeStartWaitMs`: see [`crate::store::start_wait`]), refuses mounted keys that collide
/// with stored ones, and returns the key operations with the snapshot's first virtual keys
/// (mounted, then stored).
pub async fn open_keys(
    config: &Config,
    mounted: Vec<VirtualKeyRecord>,
    env: Arc<dyn Env>,
) -> anyhow::Result<(Arc<KeyAdmin>, Vec<VirtualKeyRecord>)> {
    let spec = config.gateway.key_store.clone();
    let names = config.names.clone();
    let bound = config.store_start_wait;
    tokio::task::spawn_blocking(move || {
        let store = wait_for("gateway.keyStore", bound, |left| {
            crate::keys::open(&spec, env.as_ref(), left).map_err(crate::keys::open_failure)
        })
        .context("gateway.keyStore")?;
        let keys = Arc::new(KeyAdmin::new(store, mounted, Arc::new(SystemClock)).with_pool(names));
        keys.check_collisions()?;
        let records = keys.snapshot_keys().context("gateway.keyStore")?;
        Ok((keys, records))
    })
    .await?
}

/// Builds the engine from `config`, binds both listeners and runs everything in the background.
pub async fn start(
    config: Config,
    env: Arc<dyn Env>,
    opts: StartOptions,
) -> anyhow::Result<Running> {
    // Before anything is opened or bound.
    let (access, tls_files) = checked_sync_channel(&config, env.as_ref(), &opts).await?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let (keys, virtual_keys) = open_virtual_keys(&config, &env).await?;
    let admin_token = crate::api::admin::admin_token(&config, env.as_ref());
    let (store, durable) = open_durable_state(&config, &env).await?;
    crate::store::health::KEYS.start_serving();
    crate::store::health::STATE.start_serving();

    // Loaded before binding: files that do not load stop the start.
    let (tls_shutdown, tls_stop) = watch::channel(false);
    let tls = match &tls_files {
        Some(files) => {
            let (current, watcher) = crate::tls::server::watch(files.clone(), tls_stop)
                .context("the sync channel's TLS files")?;
            Some((current, watcher))
        }
        None => None,
    };
    let (http, grpc) = bind_listeners(&opts).await?;
    let http_addr = http.local_addr()?;
    let grpc_addr = grpc.local_addr()?;

    let config = Arc::new(config);
    let engine = Engine::with_store(
        config.clone(),
        env.clone(),
        Arc::new(SystemClock),
        virtual_keys,
        durable,
        store.clone(),
    );
    // Two stages (see `Running::shutdown`): `stop` ends what takes work (the listeners, Watch
    // streams), `after` what finishes it (usage rows, the state store) once that has drained.
    let (shutdown, stop) = watch::channel(false);
    let (finish, after) = watch::channel(false);
    absorb_budget_use(&config, &engine, &keys).await?;
    engine.set_admin_token(admin_token.as_ref());
    let mut tasks = spawn_engine_tasks(&engine, store, &after);
    let recorder = spawn_report_consumers(config, &engine, &keys, &after, &mut tasks)?;
    let usage_for_reload = recorder.clone();
    let admin = Arc::new(AdminApi::new(
        keys.clone(),
        admin_token.clone(),
        engine.clone(),
    ));
    // OpenRouter keys' credit, in the background: nothing waits for it.
    tasks.push(tokio::spawn(crate::ledger::key_poll::run(
        engine.clone(),
        admin.ledger().clone(),
        after.clone(),
    )));
    let mut servers = vec![spawn_http_server(http, &admin, &engine, &stop)];
    let sync_token = matches!(access, SyncAccess::Token(_));
    let service = SyncService::new(engine.clone(), access, stop.clone()).with_usage(recorder);
    tasks.push(tokio::spawn(service.share_headroom()));
    let mutual_tls = tls.is_some();
    let current_tls = match tls {
        Some((current, watcher)) => {
            servers.push(watcher);
            Some(current)
        }
        None => None,
    };
    servers.push(spawn_grpc_server(
        grpc,
        service,
        admin.clone(),
        &stop,
        current_tls,
        tls_shutdown,
    ));
    tracing::info!(
        http = %http_addr,
        grpc = %grpc_addr,
        version = engine.version(),
        providers = engine.config().providers.len(),
        sync_token,
        mutual_tls,
        admin_api = admin_token.is_some(),
        "control plane listening"
    );
    Ok(Running {
        http_addr,
        grpc_addr,
        engine,
        admin,
        keys,
        usage: usage_for_reload,
        env,
        shutdown,
        finish,
        servers,
        tasks,
    })
}

/// Who may use the sync channel and its TLS files, warning when the channel is open to every
/// local process or plaintext.
async fn checked_sync_channel(
    config: &Config,
    env: &dyn Env,
    opts: &StartOptions,
) -> anyhow::Result<(SyncAccess, Option<SyncTlsFiles>)> {
    let access = sync_access(config, env, opts).await?;
    if matches!(access, SyncAccess::TrustedLoopback) {
        tracing::warn!(
            grpc = %opts.grpc_listen,
            "--insecure-trusted-sync: the Sync channel has no token; every local process can read the provider keys"
        );
    }
    let tls_files = sync_tls(config, opts).await?;
    if tls_files.is_none() && opts.insecure_plaintext_sync {
        tracing::warn!(
            grpc = %opts.grpc_listen,
            "--insecure-plaintext-sync: the Sync channel is plaintext; whoever reads the traffic has every provider key"
        );
    }
    Ok((access, tls_files))
}

/// The key store with the mounted keys, and the snapshot's first virtual keys (warning when
/// there is none: every call would be refused).
async fn open_virtual_keys(
    config: &Config,
    env: &Arc<dyn Env>,
) -> anyhow::Result<(Arc<KeyAdmin>, Vec<VirtualKeyRecord>)> {
    let mounted = mounted::mounted_keys(config, env.as_ref())?;
    let (keys, virtual_keys) = open_keys(config, mounted, env.clone()).await?;
    if virtual_keys.is_empty() {
        tracing::warn!(
            "no virtual key is mounted (set STARCI_AI_KEY or mountedKeys) or stored: every call will be refused"
        );
    }
    Ok((keys, virtual_keys))
}

/// The state store (`stateStore`) and what it holds, waiting for a Redis that does not answer
/// yet, up to `storeStartWaitMs` (see [`crate::store::start_wait`]).
async fn open_durable_state(
    config: &Config,
    env: &Arc<dyn Env>,
) -> anyhow::Result<(Arc<dyn StateStore>, crate::store::durable::DurableState)> {
    let spec = config.state_store.clone();
    let store_env = env.clone();
    let bound = config.store_start_wait;
    tokio::task::spawn_blocking(move || {
        wait_for("stateStore", bound, |_| {
            let store =
                open_state_store(&spec, store_env.as_ref()).map_err(OpenFailure::Refused)?;
            let durable = store.load_at_start()?;
            Ok((store, durable))
        })
    })
    .await?
}

/// The HTTP and gRPC listeners.
async fn bind_listeners(opts: &StartOptions) -> anyhow::Result<(TcpListener, TcpListener)> {
    let http = TcpListener::bind(&opts.http_listen)
        .await
        .with_context(|| format!("binding the HTTP listener to {}", opts.http_listen))?;
    let grpc = TcpListener::bind(&opts.grpc_listen)
        .await
        .with_context(|| format!("binding the gRPC listener to {}", opts.grpc_listen))?;
    Ok((http, grpc))
}

/// The budgets' use counted before this start (or by other control planes on the store):
/// a spent budget is enforced from the first snapshot on.
async fn absorb_budget_use(
    config: &Config,
    engine: &Arc<Engine>,
    keys: &Arc<KeyAdmin>,
) -> anyhow::Result<()> {
    if !config.budgets.is_empty() {
        let store = keys.store().clone();
        let now = keys.now_ms();
        match tokio::task::spawn_blocking(move || store.budget_use(now)).await? {
            Ok(rows) => {
                engine.absorb_budget_use(&rows);
            }
            Err(err) => tracing::error!(%err, "cannot read the budgets' use from the key store"),
        }
    }
    Ok(())
}

/// The engine's own loops: refresh, flush, persist, and model discovery.
fn spawn_engine_tasks(
    engine: &Arc<Engine>,
    store: Arc<dyn StateStore>,
    after: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    vec![
        tokio::spawn(engine.clone().run_refresh(after.clone())),
        tokio::spawn(engine.clone().run_flush(after.clone())),
        tokio::spawn(engine.clone().run_persist(store, after.clone())),
        // Model discovery, in the background: nothing waits for it.
        tokio::spawn(crate::discovery::run(engine.clone(), after.clone())),
    ]
}

/// What consumes the data plane's reports: usage accounting (and keys written by other
/// processes), the OTLP traces when configured. Returns the usage recorder.
fn spawn_report_consumers(
    config: Arc<Config>,
    engine: &Arc<Engine>,
    keys: &Arc<KeyAdmin>,
    after: &watch::Receiver<bool>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<Arc<UsageRecorder>> {
    let otlp_endpoint = config.otlp_endpoint.clone();
    let (recorder, usage_rows) = UsageRecorder::new(config, Arc::new(SystemClock));
    recorder.set_store(keys.store().clone());
    let usage = recorder.clone();
    engine.add_report_observer(Arc::new(move |batch: &ai_router_proto::v1::ReportBatch| {
        usage.observe(batch);
    }));
    let usage_written = Arc::new(tokio::sync::Notify::new());
    tasks.push(tokio::spawn(crate::keys::usage::run_writer(
        usage_rows,
        keys.store().clone(),
        usage_written.clone(),
        after.clone(),
    )));
    tasks.push(tokio::spawn(crate::api::admin::run_key_sync(
        engine.clone(),
        keys.clone(),
        usage_written,
        after.clone(),
    )));
    if let Some(endpoint) = &otlp_endpoint {
        let (traces, exporter) = crate::traces::start(endpoint, after.clone())?;
        engine.add_report_observer(traces);
        tasks.push(exporter);
    }
    Ok(recorder)
}

/// Resolves once `rx` says stop.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stopped| *stopped).await;
}

/// The HTTP server: `/health`, the admin API and `/metrics` (whose counters observe the
/// reports).
fn spawn_http_server(
    http: TcpListener,
    admin: &Arc<AdminApi>,
    engine: &Arc<Engine>,
    stop: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let metrics = Arc::new(crate::api::metrics::Metrics::new(engine));
    engine.add_report_observer(metrics.clone());
    let router =
        http_router(admin.clone()).merge(crate::api::metrics::routes(engine.clone(), metrics));
    let http_stop = stopped(stop.clone());
    tokio::spawn(crate::api::http_server::serve(http, router, http_stop))
}

/// The gRPC server (Sync and Admin, over mutual TLS when `tls` is set); stops the TLS files'
/// watcher when it ends.
fn spawn_grpc_server(
    grpc: TcpListener,
    service: SyncService,
    admin: Arc<AdminApi>,
    stop: &watch::Receiver<bool>,
    tls: Option<crate::tls::server::Current>,
    tls_shutdown: watch::Sender<bool>,
) -> JoinHandle<()> {
    let grpc_stop = stopped(stop.clone());
    tokio::spawn(async move {
        let served =
            crate::api::sync::serve_with_admin_tls(grpc, service, Some(admin), grpc_stop, tls)
                .await;
        let _ = tls_shutdown.send(true);
        if let Err(err) = served {
            tracing::error!(%err, "the gRPC server failed");
        }
    })
}

/// `ai-router serve`.
pub async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    let env: Arc<dyn Env> = Arc::new(ProcessEnv);
    let config = config::load(&opts.config, env.as_ref())?;
    let cp = &config.control_plane;
    let start_opts = StartOptions {
        http_listen: opts
            .http_listen
            .unwrap_or_else(|| join_host_port(&cp.host, cp.http_port)),
        grpc_listen: opts
            .grpc_listen
            .unwrap_or_else(|| join_host_port(&cp.host, cp.grpc_port)),
        sync_token: None,
        insecure_trusted_sync: opts.insecure_trusted_sync,
        sync_tls: opts.sync_tls,
        insecure_plaintext_sync: opts.insecure_plaintext_sync,
    };
    let mut running = start(config, env, start_opts).await?;
    running.watch_config(opts.config.clone());
    let line =
        json!({ "http": running.http_addr.to_string(), "grpc": running.grpc_addr.to_string() });
    if let Err(err) = crate::stdout::print_line(&line.to_string()) {
        tracing::warn!(%err, "cannot print the listening line on stdout");
    }
    shutdown_signal().await?;
    tracing::info!("draining: no new connection, Watch streams end (Envoy keeps its last state), work in flight finishes");
    // Drained or not, the process has done what it can: exit 0 either way.
    running.shutdown().await;
    Ok(())
}

/// `host:port`, bracketing an IPv6 literal.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM")?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result.context("waiting for SIGINT")?,
            _ = terminate.recv() => {}
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::config::secrets::MapEnv;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use std::path::Path;
    use tower::ServiceExt;

    const POOL: &str = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: K }, { alias: b, env: K2 }], models: [{ id: m }] }\n";

    fn config(env: &MapEnv) -> Result<Config, String> {
        parse(POOL)
            .and_then(|f| f.resolve(env, Path::new(".")))
            .map_err(|e| e.to_string())
    }

    async fn get_json(
        router: Router,
        uri: &str,
    ) -> Result<(StatusCode, serde_json::Value), Box<dyn std::error::Error>> {
        let response = router
            .oneshot(Request::builder().uri(uri).body(Body::empty())?)
            .await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&bytes)?))
    }

    #[tokio::test]
    async fn health_in_process() -> Result<(), Box<dyn std::error::Error>> {
        let env = Arc::new(MapEnv::new([("K", "sk-a")]));
        let running = start(
            config(&env)?,
            env,
            StartOptions {
                http_listen: "127.0.0.1:0".into(),
                grpc_listen: "127.0.0.1:0".into(),
                sync_token: Some(Secret::new("sync-test-token")),
                insecure_trusted_sync: false,
                sync_tls: None,
                insecure_plaintext_sync: false,
            },
        )
        .await?;
        let (status, body) = get_json(http_router(running.admin.clone()), "/health").await?;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["status"], "ok");
        assert_eq!(body["version"], running.engine.version());
        let (status, body) = get_json(http_router(running.admin.clone()), "/nope").await?;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["code"], "not_found");

        // And over the socket.
        let mut stream = tokio::net::TcpStream::connect(running.http_addr).await?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains("\"status\":\"ok\""), "{text}");
        let (http, grpc) = (running.http_addr, running.grpc_addr);
        assert!(running.shutdown().await, "drained within the bound");
        for addr in [http, grpc] {
            assert!(
                tokio::net::TcpStream::connect(addr).await.is_err(),
                "{addr} still takes connections after the drain"
            );
        }
        Ok(())
    }

    #[tokio::test]
    async fn degraded_without_usable_keys() -> Result<(), Box<dyn std::error::Error>> {
        // K resolves at load (so the provider stays) and is then unset.
        let env = Arc::new(MapEnv::new([("K", "sk-a")]));
        let config = config(&env)?;
        let running = start(
            config,
            Arc::new(MapEnv::default()),
            StartOptions {
                http_listen: "127.0.0.1:0".into(),
                grpc_listen: "127.0.0.1:0".into(),
                sync_token: Some(Secret::new("sync-test-token")),
                insecure_trusted_sync: false,
                sync_tls: None,
                insecure_plaintext_sync: false,
            },
        )
        .await?;
        let (_, body) = get_json(http_router(running.admin.clone()), "/health").await?;
        assert_eq!(body["status"], "degraded");
        running.shutdown().await;
        Ok(())
    }

    #[test]
    fn sync_token_sources() -> Result<(), Box<dyn std::error::Error>> {
        let text = format!("{POOL}controlPlane: {{ syncToken: {{ env: TOK }} }}\n");
        let env = MapEnv::new([("K", "sk-a")]);
        let config = parse(&text)?.resolve(&env, Path::new("."))?;
        assert!(sync_token(&config, &env).is_err());
        let env = MapEnv::new([("TOK", "t1")]);
        assert_eq!(
            sync_token(&config, &env)?.map(|t| t.expose().to_owned()),
            Some("t1".into())
        );
        let env = MapEnv::new([("TOK", "t1"), (SYNC_TOKEN_ENV, "t2")]);
        assert_eq!(
            sync_token(&config, &env)?.map(|t| t.expose().to_owned()),
            Some("t2".into())
        );
        Ok(())
    }

    fn start_options(grpc_listen: &str, trusted: bool) -> StartOptions {
        StartOptions {
            http_listen: "127.0.0.1:0".into(),
            grpc_listen: grpc_listen.into(),
            sync_token: None,
            insecure_trusted_sync: trusted,
            sync_tls: None,
            insecure_plaintext_sync: false,
        }
    }

    #[tokio::test]
    async fn no_sync_token_is_refused_naming_every_way_out(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let env = MapEnv::new([("K", "sk-a")]);
        let config = config(&env)?;
        let refused = sync_access(&config, &env, &start_options("127.0.0.1:0", false)).await;
        let message = refused.err().map(|e| format!("{e:#}")).unwrap_or_default();
        for part in [
            SYNC_TOKEN_ENV,
            "controlPlane.syncToken",
            "--insecure-trusted-sync",
            INSECURE_TRUSTED_SYNC_ENV,
        ] {
            assert!(message.contains(part), "{part} missing from: {message}");
        }
        // And `start` refuses before binding anything.
        let started = start(
            config.clone(),
            Arc::new(env.clone()),
            start_options("127.0.0.1:0", false),
        )
        .await;
        assert!(started.is_err());
        Ok(())
    }

    #[tokio::test]
    async fn trusted_sync_binds_loopback_only() -> Result<(), Box<dyn std::error::Error>> {
        let env = MapEnv::new([("K", "sk-a")]);
        let config = config(&env)?;
        for listen in ["0.0.0.0:0", "[::]:0", "192.0.2.1:8082"] {
            let refused = sync_access(&config, &env, &start_options(listen, true)).await;
            let message = refused.err().map(|e| format!("{e:#}")).unwrap_or_default();
            assert!(
                message.contains("loopback") && message.contains(listen),
                "{listen}: {message}"
            );
        }
        for listen in ["127.0.0.1:0", "[::1]:0", "localhost:0"] {
            let access = sync_access(&config, &env, &start_options(listen, true)).await?;
            assert!(matches!(access, SyncAccess::TrustedLoopback), "{listen}");
        }
        // A token wins over the trusted mode: any address, and the token is checked.
        let env = MapEnv::new([("K", "sk-a"), (SYNC_TOKEN_ENV, "t1")]);
        let access = sync_access(&config, &env, &start_options("0.0.0.0:0", true)).await?;
        assert!(matches!(access, SyncAccess::Token(t) if t.expose() == "t1"));
        Ok(())
    }

    #[tokio::test]
    async fn plaintext_sync_off_loopback_needs_tls_or_the_flag(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let env = MapEnv::new([("K", "sk-a")]);
        let config = config(&env)?;
        let refused = sync_tls(&config, &start_options("0.0.0.0:0", false)).await;
        let message = refused.err().map(|e| format!("{e:#}")).unwrap_or_default();
        for part in [
            "0.0.0.0:0",
            "--tls-cert",
            "--insecure-plaintext-sync",
            "ai-router certs",
        ] {
            assert!(message.contains(part), "{part} missing from: {message}");
        }
        assert!(sync_tls(&config, &start_options("127.0.0.1:0", false))
            .await?
            .is_none());
        let mut opts = start_options("0.0.0.0:0", false);
        opts.insecure_plaintext_sync = true;
        assert!(sync_tls(&config, &opts).await?.is_none());
        let files = SyncTlsFiles {
            cert: "c.pem".into(),
            key: "k.pem".into(),
            client_ca: "ca.pem".into(),
        };
        opts.insecure_plaintext_sync = false;
        opts.sync_tls = Some(files.clone());
        assert_eq!(sync_tls(&config, &opts).await?, Some(files));
        Ok(())
    }

    #[test]
    fn host_port() {
        assert_eq!(join_host_port("127.0.0.1", 1), "127.0.0.1:1");
        assert_eq!(join_host_port("::1", 1), "[::1]:1");
    }

    #[tokio::test]
    async fn a_wrong_token_is_refused_before_the_body_is_read_and_a_large_body_is_413(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let api = crate::api::admin::tests::api(Some(crate::api::admin::tests::TOKEN))?;
        // A body that never ends: the answer cannot wait for it.
        let endless = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        let request = Request::builder()
            .method("POST")
            .uri("/admin/keys")
            .header("authorization", "Bearer nope")
            .body(Body::from_stream(endless))?;
        let response = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            http_router(api.clone()).oneshot(request),
        )
        .await??;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let big = serde_json::json!({ "label": "app", "owner": "o".repeat(ADMIN_BODY_LIMIT) });
        let request = Request::builder()
            .method("POST")
            .uri("/admin/keys")
            .header(
                "authorization",
                format!("Bearer {}", crate::api::admin::tests::TOKEN),
            )
            .body(Body::from(big.to_string()))?;
        let response = http_router(api).oneshot(request).await?;
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        Ok(())
    }
}

/// The console's routes as the admin port serves them: the token check in front (the assets
/// pass without one), never a token from a cookie.
#[cfg(test)]
mod console_route_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use axum::http::{header, HeaderMap, StatusCode};
    use serde_json::Value;

    use crate::api::console::CONTENT_SECURITY_POLICY;

    async fn get(
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, HeaderMap, Vec<u8>), Box<dyn std::error::Error>> {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let api = crate::api::admin::tests::api(Some(crate::api::admin::tests::TOKEN))?;
        let mut request = axum::http::Request::builder().uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = super::http_router(api)
            .oneshot(request.body(axum::body::Body::empty())?)
            .await?;
        let (parts, body) = response.into_parts();
        Ok((
            parts.status,
            parts.headers,
            body.collect().await?.to_bytes().to_vec(),
        ))
    }

    #[tokio::test]
    async fn the_page_is_served_without_a_token_under_a_strict_policy(
    ) -> Result<(), Box<dyn std::error::Error>> {
        // Every path the guard lets through without a token is served (one list for both).
        for &path in crate::api::console::ASSETS {
            let (status, headers, body) = get(path, &[]).await?;
            if path.ends_with('/') {
                assert_eq!(status, StatusCode::PERMANENT_REDIRECT, "{path}");
                continue;
            }
            let kind = match path.rsplit('/').next() {
                Some("app.js") => "text/javascript",
                Some("app.css") => "text/css",
                _ => "text/html",
            };
            assert_eq!(status, StatusCode::OK, "{path}");
            let header = |name: header::HeaderName| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned()
            };
            assert!(header(header::CONTENT_TYPE).starts_with(kind), "{path}");
            assert_eq!(
                header(header::CONTENT_SECURITY_POLICY),
                CONTENT_SECURITY_POLICY
            );
            assert_eq!(header(header::X_CONTENT_TYPE_OPTIONS), "nosniff");
            assert!(!body.is_empty());
        }
        assert!(CONTENT_SECURITY_POLICY.contains("frame-ancestors 'none'"));
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"));
        Ok(())
    }

    #[tokio::test]
    async fn the_console_figures_need_the_token_in_the_header_never_a_cookie(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let token = crate::api::admin::tests::TOKEN;
        let bearer = format!("Bearer {token}");
        for path in [
            "/admin/console",
            "/admin/console/ledger",
            "/admin/console/usage",
        ] {
            let (status, _, _) = get(path, &[]).await?;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
            // What a browser would send on its own: a cookie. Never taken as the token.
            for cookie in [
                format!("token={token}"),
                format!("authorization=Bearer {token}"),
                format!("Authorization={bearer}"),
            ] {
                let (status, _, _) = get(path, &[("cookie", &cookie)]).await?;
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} with {cookie}");
            }
            let (status, _, body) = get(path, &[("authorization", &bearer)]).await?;
            assert_eq!(status, StatusCode::OK, "{path}");
            serde_json::from_slice::<Value>(&body)?;
        }
        // Nor do the admin API's own routes take a cookie.
        let (status, _, _) = get("/admin/keys", &[("cookie", &format!("token={token}"))]).await?;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (_, _, body) = get("/admin/console", &[("authorization", &bearer)]).await?;
        let overview: Value = serde_json::from_slice(&body)?;
        assert_eq!(overview["calls"]["requests"], 0, "{overview}");
        assert_eq!(overview["spend"]["today"], 0.0, "{overview}");
        assert!(overview["problems"].as_array().is_some(), "{overview}");
        Ok(())
    }
}
