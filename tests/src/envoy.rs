//! Envoy.

use super::*;

/// A change to the rendered bootstrap before Envoy starts (the benchmark's ablation variants):
/// the YAML in, the YAML (or JSON) Envoy is to run out.
pub type BootstrapEdit = dyn Fn(String) -> Result<String> + Send + Sync;

/// Envoy 1.40 with the bootstrap `ai-router render-envoy` renders, on ephemeral ports.
#[derive(Debug)]
pub struct Envoy {
    pub(crate) process: Process,
    render: Process,
    admin: String,
    listen: SocketAddr,
    bootstrap: PathBuf,
    /// When its public listener was seen bound.
    listening_at: Instant,
    /// Earlier generations (before [`Envoy::restart_on_same_port`]), for their logs.
    previous: Vec<(Process, Process)>,
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
        Self::start_failover(dir, config, &[control_plane_grpc], env, ready_key).await
    }

    /// [`Envoy::start`] with the rendered bootstrap passed through `edit` before Envoy reads
    /// it (the benchmark's `ai-router@VARIANT` systems; never the tests).
    pub async fn start_edited(
        dir: &TestDir,
        config: &Path,
        control_plane_grpc: SocketAddr,
        env: &[(String, String)],
        ready_key: &str,
        edit: &BootstrapEdit,
    ) -> Result<Self> {
        Self::launch(
            dir,
            config,
            &[control_plane_grpc],
            env,
            ready_key,
            ("127.0.0.1:0", "envoy"),
            Some(edit),
        )
        .await
    }

    /// [`Envoy::start`] with several control planes (the first is the one it starts on; it
    /// fails over to the others).
    pub async fn start_failover(
        dir: &TestDir,
        config: &Path,
        control_planes: &[SocketAddr],
        env: &[(String, String)],
        ready_key: &str,
    ) -> Result<Self> {
        Self::launch(
            dir,
            config,
            control_planes,
            env,
            ready_key,
            ("127.0.0.1:0", "envoy"),
            None,
        )
        .await
    }

    /// Kills this Envoy (SIGKILL) and starts a new one from the same config on the same
    /// listener port, as an operator's restart would; returns once it serves. The old one's
    /// logs stay in [`Envoy::logs`].
    pub async fn restart_on_same_port(
        &mut self,
        dir: &TestDir,
        config: &Path,
        control_planes: &[SocketAddr],
        env: &[(String, String)],
        ready_key: &str,
    ) -> Result<Restarted> {
        let listen = self.listen.to_string();
        let generation = self.previous.len() + 2;
        self.process.kill();
        let reaped_at = Instant::now();
        let name = format!("envoy-{generation}");
        let deadline = Instant::now() + START_TIMEOUT;
        let (mut tries, mut last_error) = (0, String::new());
        let new = loop {
            match Self::launch(
                dir,
                config,
                control_planes,
                env,
                ready_key,
                (&listen, &name),
                None,
            )
            .await
            {
                Ok(new) => break new,
                // The port was just freed: a bind race is tried again.
                Err(e) if Instant::now() < deadline => {
                    tries += 1;
                    last_error = format!("{e:#}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e.context(format!("restarting Envoy on {listen}"))),
            }
        };
        let old = std::mem::replace(self, new);
        self.previous = old.previous;
        self.previous.push((old.render, old.process));
        Ok(Restarted {
            reaped_at,
            failed_starts: tries,
            last_error,
        })
    }

    /// When the public listener of the running generation was seen bound.
    pub fn listening_at(&self) -> Instant {
        self.listening_at
    }

    async fn launch(
        dir: &TestDir,
        config: &Path,
        control_planes: &[SocketAddr],
        env: &[(String, String)],
        ready_key: &str,
        (listen, name): (&str, &str),
        edit: Option<&BootstrapEdit>,
    ) -> Result<Self> {
        let control_plane_list: Vec<String> = control_planes
            .iter()
            .map(|a| format!("127.0.0.1:{}", a.port()))
            .collect();
        let bin = ai_router_bin()?;
        let envoy = envoy_bin()?;
        let wasm = wasm_path()?;
        let bootstrap = dir.join(&format!("{name}.yaml"));
        let args = vec![
            "render-envoy".to_string(),
            "--config".to_string(),
            config.display().to_string(),
            "--control-plane".to_string(),
            control_plane_list.join(","),
            "--wasm".to_string(),
            wasm.display().to_string(),
            "--listen".to_string(),
            listen.to_string(),
            "--admin".to_string(),
            "127.0.0.1:0".to_string(),
            "--out".to_string(),
            bootstrap.display().to_string(),
        ];
        let mut render = Process::spawn(dir, &format!("render-{name}"), &bin, &args, env)?;
        let st = render.wait_exit(START_TIMEOUT).await?;
        if !st.success() || !bootstrap.is_file() {
            bail!(
                "ai-router {} failed ({st}) or wrote no {}\n{}",
                args.join(" "),
                bootstrap.display(),
                render.tail()
            );
        }
        if let Some(edit) = edit {
            let rendered = fs::read_to_string(&bootstrap)
                .with_context(|| format!("reading {}", bootstrap.display()))?;
            let edited = edit(rendered).context("editing the rendered bootstrap")?;
            fs::write(&bootstrap, edited)
                .with_context(|| format!("writing {}", bootstrap.display()))?;
        }

        let admin_path = dir.join(&format!("{name}-admin.txt"));
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
        let mut process = Process::spawn(dir, name, &envoy, &envoy_args, env)?;

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
            listening_at: Instant::now(),
            previous: Vec::new(),
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

    /// The value of the counter or gauge `name` (`cluster.providers_plain.upstream_rq_active`),
    /// from the admin API.
    pub async fn stat(&self, name: &str) -> Result<u64> {
        let escaped = name.replace('.', "\\.");
        let url = format!("http://{}/stats?filter=^{escaped}$", self.admin);
        let text = http_client()?.get(&url).send().await?.text().await?;
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .ok_or_else(|| anyhow!("no {name} in {text:?}"))?;
        value
            .trim()
            .parse()
            .with_context(|| format!("{name}: {value:?}"))
    }

    /// The state version this Envoy's workers read: the filter's gauge
    /// (`wasmcustom.ai_router.state_version`), set when a snapshot or delta is published.
    pub async fn state_version(&self) -> Result<u64> {
        self.stat(&format!(
            "wasmcustom.{}",
            ai_router_contract::STATE_VERSION_STAT
        ))
        .await
    }

    /// Waits until this Envoy's workers read the state `cp` pushes now (or a later one): what
    /// a test does after a change, instead of sleeping. Returns the version.
    pub async fn wait_for_state_of(&self, cp: &ControlPlane) -> Result<u64> {
        let want = cp.state_version().await?;
        poll(
            &format!("Envoy to apply state version {want}"),
            Duration::from_secs(10),
            || async move { Ok((self.state_version().await? >= want).then_some(want)) },
        )
        .await
        .with_context(|| self.process.tail())
    }

    /// Every counter Envoy has whose name ends in `_overflow` and is not 0 (a circuit breaker
    /// turned a call away).
    pub async fn overflows(&self) -> Result<Vec<String>> {
        let url = format!("http://{}/stats?filter=_overflow$", self.admin);
        let text = http_client()?.get(&url).send().await?.text().await?;
        Ok(text
            .lines()
            .filter(|l| !l.ends_with(": 0"))
            .map(str::to_string)
            .collect())
    }

    pub fn process(&self) -> &Process {
        &self.process
    }

    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (render, process) in &self.previous {
            out.push_str(&format!("{}\n{}\n", render.logs(), process.logs()));
        }
        out.push_str(&format!("{}\n{}", self.render.logs(), self.process.logs()));
        out
    }

    pub fn tail(&self) -> String {
        self.process.tail()
    }
}

/// When the steps of [`Envoy::restart_on_same_port`] happened (the new listener's moment is
/// [`Envoy::listening_at`]).
#[derive(Debug, Clone)]
pub struct Restarted {
    /// The old process was killed and reaped.
    pub reaped_at: Instant,
    /// Starts that failed before one bound the port (a bind race), and the last one's error.
    pub failed_starts: u32,
    pub last_error: String,
}

/// The bound address of the one listener on a socket (the internal listener has none); a
/// listener named `public` wins if there are several.
pub fn public_listener(v: &Value) -> Option<SocketAddr> {
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
