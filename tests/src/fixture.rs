//! Fixtures: the standard gateway (two mocks, the control plane, Envoy) and custom pools.

use super::*;

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
    /// The control plane's admin API with the admin token (see [`Gateway::admin`]).
    admin: Admin,
    /// With [`Gateway::start_mutual_tls`]: the folder `ai-router certs` wrote (the CA,
    /// `control-plane/`, `envoy/`).
    pub sync_tls: Option<PathBuf>,
    envoy_env: Vec<(String, String)>,
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

/// [`standard_pool`] with `p1` of kind gemini (mock 1 speaking Google's own API) serving
/// `gem-m` (alias `chat`) and the embeddings model `gem-e` (alias `gembed`, 8 dimensions);
/// `p2` (openai-compatible, mock 2) serving `m2`, the fallback, and the embeddings model `te3`
/// (alias `oembed`, 8 dimensions).
pub fn gemini_pool(p1: &str, p2: &str) -> String {
    standard_pool(p1, p2)
        .replace(
            "kind: openai-compatible\n    baseUrl: ",
            "kind: KIND\n    baseUrl: ",
        )
        .replacen("kind: KIND", "kind: gemini", 1)
        .replace("kind: KIND", "kind: openai-compatible")
        .replace(
            "{ id: m1, aliases: [chat] }",
            "{ id: gem-m, aliases: [chat] }\n      \
             - { id: gem-e, aliases: [gembed], capabilities: [embeddings], dimensions: 8 }",
        )
        .replace(
            "{ id: m2, aliases: [backup] }",
            "{ id: m2, aliases: [backup] }\n      \
             - { id: te3, aliases: [oembed], capabilities: [embeddings], dimensions: 8 }",
        )
}

/// [`standard_pool`] with the SQLite key store (`keys.sqlite` in the control plane's directory).
pub fn sqlite_pool(p1_base: &str, p2_base: &str) -> String {
    standard_pool(p1_base, p2_base).replace(
        "keyStore: { type: memory }",
        "keyStore: { type: sqlite, path: keys.sqlite }",
    )
}

/// A fresh virtual key for the `e2e` label.
pub fn new_virtual_key() -> String {
    let key = format!("sk-starci-e2e-{}", random_hex(48));
    scan::register("a virtual key", &key);
    key
}

impl Gateway {
    /// Starts the standard pool (see the type's docs).
    pub async fn start(test: &str) -> Result<Self> {
        Self::start_with(test, standard_pool).await
    }

    /// Starts the fixture with the pool `pool(p1_base, p2_base)` returns.
    pub async fn start_with(test: &str, pool: impl Fn(&str, &str) -> String) -> Result<Self> {
        Self::launch(Fixture::new(test), pool).await
    }

    /// The standard pool with the sync channel over mutual TLS (see [`Fixture::mutual_tls`]).
    pub async fn start_mutual_tls(test: &str) -> Result<Self> {
        Self::launch(Fixture::new(test).mutual_tls(), standard_pool).await
    }

    async fn launch(fixture: Fixture, pool: impl Fn(&str, &str) -> String) -> Result<Self> {
        let admin_token = format!("admin-{}", random_hex(32));
        scan::register("AI_ROUTER_ADMIN_TOKEN", &admin_token);
        let stack = fixture
            .mocks(2)
            .start(|urls, _| {
                let mut setup = PoolSetup {
                    yaml: pool(&format!("{}/v1", urls[0]), &format!("{}/v1", urls[1])),
                    ..PoolSetup::default()
                };
                setup.secret_env("P1_KEY_A", "p1-a");
                setup.secret_env("P1_KEY_B", "p1-b");
                setup.secret_env("P2_KEY_C", "p2-c");
                setup
                    .env
                    .push(("AI_ROUTER_ADMIN_TOKEN".into(), admin_token.clone()));
                Ok(setup)
            })
            .await?;
        let var = |name: &str| stack.var(name).unwrap_or_default().to_string();
        let (key_a, key_b, key_c) = (var("P1_KEY_A"), var("P1_KEY_B"), var("P2_KEY_C"));
        let Stack {
            dir,
            mocks,
            sites,
            virtual_key,
            sync_token,
            sync_tls,
            envoy_env,
            ..
        } = stack;
        let [mock1, mock2]: [Mock; 2] = mocks
            .try_into()
            .map_err(|_| anyhow!("the fixture started other than two mocks"))?;
        let site = sites
            .into_iter()
            .next()
            .context("the fixture started no site")?;
        let admin = site.admin(&admin_token)?;
        Ok(Self {
            dir,
            mock1,
            mock2,
            cp: site.cp,
            envoy: site.envoy,
            client: site.client,
            virtual_key,
            key_a,
            key_b,
            key_c,
            sync_token,
            admin_token,
            admin,
            sync_tls,
            envoy_env,
        })
    }

    /// The control plane's admin API with the admin token, at its HTTP address now (a
    /// restarted control plane listens on another one).
    pub fn admin(&self) -> Admin {
        self.admin
            .at_base(&format!("http://{}", self.cp.http_addr()))
    }

    /// Another Envoy synced to the fixture's control plane, in its own directory
    /// (`<test dir>-<name>`), ready for the virtual key.
    pub async fn another_envoy(&self, name: &str) -> Result<Envoy> {
        let dir = self.dir.beside(name)?;
        Envoy::start(
            &dir,
            self.cp.config_path(),
            self.cp.grpc_addr(),
            &self.envoy_env,
            &self.virtual_key,
        )
        .await
        .with_context(|| format!("starting Envoy {name}"))
    }

    /// The OpenAI base URL of the gateway: `http://127.0.0.1:<port>/v1`.
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.envoy.base_url())
    }

    /// Scripts both mocks to answer every call 200 with this usage.
    pub async fn script_usage(&self, prompt: u64, completion: u64) -> Result<()> {
        let reply = json!({
            "text": "ok",
            "usage": { "prompt_tokens": prompt, "completion_tokens": completion },
        });
        for mock in [&self.mock1, &self.mock2] {
            mock.script(json!([script::always(vec![reply.clone()])]))
                .await?;
        }
        Ok(())
    }

    /// A unary chat completion with the virtual key.
    pub async fn chat(&self, model: &str) -> Result<Reply> {
        self.client.chat(model, Some(&self.virtual_key)).await
    }

    /// A streamed chat completion with the virtual key.
    pub async fn stream(&self, model: &str) -> Result<StreamReply> {
        self.client.stream(model, Some(&self.virtual_key)).await
    }

    /// `POST path` with `body` and the virtual key (another protocol's call: `/v1/messages`,
    /// `/v1/responses`...).
    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply> {
        let body = Some(body.to_string());
        let key = Some(self.virtual_key.as_str());
        self.client
            .request(reqwest::Method::POST, path, key, body)
            .await
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
            return;
        }
        scan::observe_operator("the control plane's logs", self.cp.logs().as_bytes());
        scan::observe_operator("Envoy's logs", self.envoy.logs().as_bytes());
        for mock in [&self.mock1, &self.mock2] {
            scan::observe("a mock's logs", mock.process().logs().as_bytes());
        }
        scan::assert_no_leaks(&format!("logs in {}", self.dir.path().display()));
    }
}

/// The `gateway` and `controlPlane` sections every custom pool starts with: loopback, port 0,
/// a memory key store. Append `providers`, `profiles`, `resilience`... after it.
pub fn pool_yaml_header() -> String {
    "gateway: { host: 127.0.0.1, port: 0, keyStore: { type: memory } }\n\
     controlPlane: { host: 127.0.0.1, httpPort: 0, grpcPort: 0 }\n"
        .to_string()
}

/// [`pool_yaml_header`] with the admin API on (`adminToken` from `AI_ROUTER_ADMIN_TOKEN`, which
/// [`Gateway`] sets), for pools given to [`Gateway::start_with`].
pub fn admin_pool_yaml_header() -> String {
    "gateway: { host: 127.0.0.1, port: 0, adminToken: { env: AI_ROUTER_ADMIN_TOKEN }, keyStore: { type: memory } }\n\
     controlPlane: { host: 127.0.0.1, httpPort: 0, grpcPort: 0 }\n"
        .to_string()
}

/// The headroom a pool health (`GET /admin/health`) says is pushed for `provider`'s key `key`,
/// each model's and the scope's (model empty): `{ provider, key, model, remainingRequests,
/// remainingTokens, resetAtMs }`.
pub fn pushed_headroom<'a>(health: &'a Value, provider: &str, key: &str) -> Vec<&'a Value> {
    health["headroom"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h["provider"] == provider && h["key"] == key)
        .collect()
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
        let secret = scan::provider_secret(name);
        self.env.push((var.to_string(), secret.clone()));
        self.names.push((secret.clone(), name.to_string()));
        secret
    }

    /// Names a secret held elsewhere (a file) without putting it in the environment.
    pub fn name_secret(&mut self, secret: &str, name: &str) {
        self.names.push((secret.to_string(), name.to_string()));
    }

    /// Turns the admin API on: a fresh token in `AI_ROUTER_ADMIN_TOKEN`, registered with the
    /// secret scan. The YAML must read it (start it from [`admin_pool_yaml_header`]);
    /// `Pool::admin("AI_ROUTER_ADMIN_TOKEN")` reaches the API.
    pub fn admin_token(&mut self) {
        let token = format!("admin-{}", random_hex(32));
        scan::register("AI_ROUTER_ADMIN_TOKEN", &token);
        self.env.push(("AI_ROUTER_ADMIN_TOKEN".into(), token));
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
    envoy_env: Vec<(String, String)>,
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
        Self::start_scripted(test, &vec![None; mocks], build).await
    }

    /// [`Pool::start`] with each mock started on its script (see [`Fixture::scripted`]).
    pub async fn start_scripted(
        test: &str,
        scripts: &[Option<Value>],
        build: impl FnOnce(&[String], &TestDir) -> Result<PoolSetup>,
    ) -> Result<Self> {
        let stack = Fixture::new(test).scripted(scripts).start(build).await?;
        let site = stack
            .sites
            .into_iter()
            .next()
            .context("the fixture started no site")?;
        Ok(Self {
            dir: stack.dir,
            mocks: stack.mocks,
            cp: site.cp,
            envoy: site.envoy,
            client: site.client,
            virtual_key: stack.virtual_key,
            sync_token: stack.sync_token,
            names: stack.names,
            cp_env: stack.env,
            envoy_env: stack.envoy_env,
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

    /// The control plane's admin API with the admin token held in the control plane's
    /// variable `token_var`.
    pub fn admin(&self, token_var: &str) -> Result<Admin> {
        let token = self
            .control_plane_var(token_var)
            .with_context(|| format!("no variable {token_var} for the control plane"))?;
        Admin::at(self.cp.http_addr(), token)
    }

    /// Waits until the state the control plane publishes satisfies `published` (read from its
    /// pool health, `GET /admin/health` through `admin`), then until Envoy reads that state or a
    /// later one: what a test does after a change the control plane publishes on its own time
    /// (headroom, coalesced; the quota ledger's figures at its next flush) instead of sleeping.
    /// Returns the version Envoy reads.
    pub async fn until_pushed(
        &self,
        admin: &Admin,
        what: &str,
        published: impl Fn(&Value) -> bool,
    ) -> Result<u64> {
        poll(
            &format!("the control plane to publish {what}"),
            Duration::from_secs(10),
            || async {
                let health = admin.get_json("/admin/health").await?;
                Ok(published(&health).then_some(()))
            },
        )
        .await?;
        self.envoy.wait_for_state_of(&self.cp).await
    }

    /// The names of the keys of the chat completions the mocks received, in order (not the
    /// listings, credit asks or other calls).
    pub async fn chat_keys(&self) -> Result<Vec<String>> {
        Ok(self
            .calls()
            .await?
            .into_iter()
            .filter(|c| c.call.path.ends_with("/chat/completions"))
            .map(|c| c.key)
            .collect())
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

    /// One of the control plane's variables (a provider secret the setup made), or empty.
    pub fn env_value(&self, name: &str) -> String {
        self.cp_env
            .iter()
            .find_map(|(k, v)| (k == name).then(|| v.clone()))
            .unwrap_or_default()
    }

    /// The control plane's variables (what it was started with, `STARCI_AI_KEY` included).
    pub fn control_plane_env(&self) -> &[(String, String)] {
        &self.cp_env
    }

    /// One of the control plane's variables (a provider secret, the admin token).
    pub fn control_plane_var(&self, name: &str) -> Option<&str> {
        self.cp_env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The secret the control plane holds in variable `var` (empty when it holds none).
    pub fn secret_in(&self, var: &str) -> String {
        self.cp_env
            .iter()
            .find(|(k, _)| k == var)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    /// Replaces Envoy with a fresh one (no memory of earlier calls) synced to the control plane.
    pub async fn restart_envoy(&mut self) -> Result<()> {
        self.envoy.process.kill();
        // Envoy::start reads the admin address from this file: not the old Envoy's.
        let _ = fs::remove_file(self.dir.join("envoy-admin.txt"));
        let envoy = Envoy::start(
            &self.dir,
            self.cp.config_path(),
            self.cp.grpc_addr(),
            &self.envoy_env,
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
        let site = Site::start_beside(
            &self.dir,
            &self.cp,
            name,
            &self.cp_env,
            &self.envoy_env,
            &self.virtual_key,
        )
        .await?;
        self.others.push((site.cp, site.envoy));
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
            return;
        }
        scan::observe_operator("the control plane's logs", self.cp.logs().as_bytes());
        scan::observe_operator("Envoy's logs", self.envoy.logs().as_bytes());
        for (cp, envoy) in &self.others {
            scan::observe_operator("another control plane's logs", cp.logs().as_bytes());
            scan::observe_operator("another Envoy's logs", envoy.logs().as_bytes());
        }
        for mock in &self.mocks {
            scan::observe("a mock's logs", mock.process().logs().as_bytes());
        }
        scan::assert_no_leaks(&format!("logs in {}", self.dir.path().display()));
    }
}
