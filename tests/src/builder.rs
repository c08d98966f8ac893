//! The one fixture builder: mock providers, then one control plane and its Envoy per site, all
//! on the pool a test's closure writes. [`Gateway`], [`Pool`] and a multi-site cluster (each
//! Envoy syncing from its own control plane first and failing over to the others) are all
//! built here.

use super::*;

/// What to start. `Fixture::new(test)` is one site with no mock; add mocks, sites, mutual TLS,
/// then [`Fixture::start`] with the pool's closure.
#[derive(Debug, Clone)]
pub struct Fixture {
    test: String,
    scripts: Vec<Option<Value>>,
    sites: usize,
    mutual_tls: bool,
}

/// One host: a control plane and the Envoy it feeds, with a client of that Envoy.
#[derive(Debug)]
pub struct Site {
    pub cp: ControlPlane,
    pub envoy: Envoy,
    pub client: Client,
    /// Its own directory when it is not the fixture's first site.
    pub dir: TestDir,
}

impl Site {
    /// The admin API of this site's control plane with `token`.
    pub fn admin(&self, token: &str) -> Result<Admin> {
        Admin::at(self.cp.http_addr(), token)
    }
}

/// What [`Fixture::start`] started.
#[derive(Debug)]
pub struct Stack {
    pub dir: TestDir,
    pub mocks: Vec<Mock>,
    pub sites: Vec<Site>,
    /// The mounted virtual key (`STARCI_AI_KEY`, label `e2e`).
    pub virtual_key: String,
    pub sync_token: String,
    /// The control planes' variables (the pool's, `STARCI_AI_KEY`, `AI_ROUTER_SYNC_TOKEN`...).
    pub env: Vec<(String, String)>,
    /// Envoy's variables (the sync token, the sync TLS folder).
    pub envoy_env: Vec<(String, String)>,
    /// `(secret, name)` of the provider secrets the pool named.
    pub names: Vec<(String, String)>,
    /// With mutual TLS: the folder `ai-router certs` wrote (the CA, `control-plane/`, `envoy/`).
    pub sync_tls: Option<PathBuf>,
}

impl Fixture {
    pub fn new(test: &str) -> Self {
        Self {
            test: test.to_string(),
            scripts: Vec::new(),
            sites: 1,
            mutual_tls: false,
        }
    }

    /// `n` mock providers with no script.
    pub fn mocks(mut self, n: usize) -> Self {
        self.scripts = vec![None; n];
        self
    }

    /// One mock per script, each started on its script (`--script`), so what it answers is set
    /// before the control plane first reaches it (a model catalog listed at start).
    pub fn scripted(mut self, scripts: &[Option<Value>]) -> Self {
        self.scripts = scripts.to_vec();
        self
    }

    /// `n` sites (control plane and Envoy) on the same pool; each in its own directory
    /// (`<test>-a`, `<test>-b`...) when there are several.
    pub fn sites(mut self, n: usize) -> Self {
        self.sites = n.max(1);
        self
    }

    /// The sync channel over mutual TLS: `ai-router certs` issues the certificates into the
    /// test directory, the control plane serves with them (`AI_ROUTER_TLS_CERT`, `_KEY`,
    /// `AI_ROUTER_CLIENT_CA`) and Envoy reads its own through SDS (`AI_ROUTER_SYNC_TLS_DIR`).
    pub fn mutual_tls(mut self) -> Self {
        self.mutual_tls = true;
        self
    }

    /// Starts the mocks, then the control planes on the pool `build` returns (given the mocks'
    /// URLs, `http://127.0.0.1:<port>` with no `/v1`, and the test directory), then the Envoys.
    pub async fn start(
        self,
        build: impl FnOnce(&[String], &TestDir) -> Result<PoolSetup>,
    ) -> Result<Stack> {
        let dir = TestDir::new(&self.test)?;
        let mut mocks = Vec::new();
        for (i, script) in self.scripts.iter().enumerate() {
            let name = if self.scripts.len() == 1 && self.sites > 1 {
                "mock".to_string()
            } else {
                format!("mock{}", i + 1)
            };
            mocks.push(match script {
                Some(script) => Mock::start_with_script(&dir, &name, script).await?,
                None => Mock::start(&dir, &name).await?,
            });
        }
        let urls: Vec<String> = mocks.iter().map(|m| m.url().to_string()).collect();
        let setup = build(&urls, &dir)?;
        let virtual_key = new_virtual_key();
        let sync_token = format!("sync-{}", random_hex(32));
        scan::register("AI_ROUTER_SYNC_TOKEN", &sync_token);
        let mut env = setup.env;
        env.push(("STARCI_AI_KEY".into(), virtual_key.clone()));
        env.push(("AI_ROUTER_SYNC_TOKEN".into(), sync_token.clone()));
        let mut envoy_env = vec![("AI_ROUTER_SYNC_TOKEN".to_string(), sync_token.clone())];
        let sync_tls = if self.mutual_tls {
            Some(issue_sync_certs(&dir, &mut env, &mut envoy_env).await?)
        } else {
            None
        };
        let mut planes = Vec::new();
        for i in 0..self.sites {
            let site_dir = if self.sites == 1 {
                dir.clone()
            } else {
                TestDir::new(&format!("{}-{}", self.test, site_name(i)))?
            };
            let cp = ControlPlane::start(&site_dir, &setup.yaml, &env)
                .await
                .with_context(|| format!("starting control plane {}", site_name(i)))?;
            planes.push((site_dir, cp));
        }
        // Each Envoy syncs from its own control plane first and fails over to the others.
        let grpc: Vec<SocketAddr> = planes.iter().map(|(_, cp)| cp.grpc_addr()).collect();
        let mut sites = Vec::new();
        for (i, (site_dir, cp)) in planes.into_iter().enumerate() {
            let order: Vec<SocketAddr> = std::iter::once(grpc[i])
                .chain(
                    grpc.iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, a)| *a),
                )
                .collect();
            let envoy = Envoy::start_failover(
                &site_dir,
                cp.config_path(),
                &order,
                &envoy_env,
                &virtual_key,
            )
            .await
            .with_context(|| cp.tail())
            .with_context(|| format!("starting the Envoy of site {}", site_name(i)))?;
            let client = Client::new(&envoy.base_url())?;
            sites.push(Site {
                cp,
                envoy,
                client,
                dir: site_dir,
            });
        }
        Ok(Stack {
            dir,
            mocks,
            sites,
            virtual_key,
            sync_token,
            env,
            envoy_env,
            names: setup.names,
            sync_tls,
        })
    }
}

/// `a`, `b`, `c`... for site `i`.
fn site_name(i: usize) -> String {
    char::from(b'a' + (i % 26) as u8).to_string()
}

/// Runs `ai-router certs` into `<dir>/sync-tls` and points the control plane's and Envoy's
/// variables at what it wrote; returns the folder.
async fn issue_sync_certs(
    dir: &TestDir,
    env: &mut Vec<(String, String)>,
    envoy_env: &mut Vec<(String, String)>,
) -> Result<PathBuf> {
    let out = dir.join("sync-tls");
    let out_arg = out.display().to_string();
    let (ok, _, output) = run_cli(&["certs", "--out", &out_arg], &[]).await?;
    ensure!(ok, "ai-router certs failed: {output}");
    let server = out.join("control-plane");
    for (var, file) in [
        ("AI_ROUTER_TLS_CERT", "cert.pem"),
        ("AI_ROUTER_TLS_KEY", "key.pem"),
        ("AI_ROUTER_CLIENT_CA", "ca.pem"),
    ] {
        env.push((var.to_string(), server.join(file).display().to_string()));
    }
    envoy_env.push((
        "AI_ROUTER_SYNC_TLS_DIR".to_string(),
        out.join("envoy").display().to_string(),
    ));
    Ok(out)
}

impl Stack {
    /// One of the control planes' variables.
    pub fn var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Site {
    /// Starts one more site beside the fixture in `base`: a control plane on `yaml_from`'s
    /// pool YAML with the variables `env`, in its own directory (`<base>-<name>`), and an
    /// Envoy with `envoy_env` synced to it only, ready for `ready_key`.
    pub async fn start_beside(
        base: &TestDir,
        yaml_from: &ControlPlane,
        name: &str,
        env: &[(String, String)],
        envoy_env: &[(String, String)],
        ready_key: &str,
    ) -> Result<Site> {
        let yaml = fs::read_to_string(yaml_from.config_path())
            .with_context(|| format!("reading {}", yaml_from.config_path().display()))?;
        let dir = base.beside(name)?;
        let cp = ControlPlane::start(&dir, &yaml, env)
            .await
            .with_context(|| format!("starting control plane {name}"))?;
        let envoy = Envoy::start(&dir, cp.config_path(), cp.grpc_addr(), envoy_env, ready_key)
            .await
            .with_context(|| cp.tail())
            .with_context(|| format!("starting the Envoy of control plane {name}"))?;
        let client = Client::new(&envoy.base_url())?;
        Ok(Site {
            cp,
            envoy,
            client,
            dir,
        })
    }
}
