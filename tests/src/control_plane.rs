//! The control plane.

use super::*;

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

/// With `AI_ROUTER_E2E_ONE_PASS=1` in the environment, every pool a test starts has
/// `gateway.onePass` on (a pool that names it keeps its own): a run of any suite in one pass.
/// The line is inserted into the pool's text, which is otherwise left as the test wrote it.
fn with_one_pass_if_asked(yaml: &str) -> String {
    if std::env::var("AI_ROUTER_E2E_ONE_PASS").as_deref() != Ok("1") {
        return yaml.to_owned();
    }
    with_one_pass(yaml)
}

fn with_one_pass(yaml: &str) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let Some(at) = lines.iter().position(|l| l.starts_with("gateway:")) else {
        return format!("{}\ngateway:\n  onePass: true\n", yaml.trim_end());
    };
    let mut out: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    let rest = lines[at]["gateway:".len()..].trim_start();
    if let Some(inner) = rest.strip_prefix('{') {
        // Flow style (`gateway: { host: …, keyStore: { … } }`): the mapping's first key.
        if lines[at].contains("onePass") {
            return yaml.to_owned();
        }
        let sep = if inner.trim_start().starts_with('}') {
            " "
        } else {
            ", "
        };
        out[at] = format!("gateway: {{ onePass: true{sep}{}", inner.trim_start());
        return out.join("\n") + "\n";
    }
    assert!(
        rest.is_empty() || rest.starts_with('#'),
        "AI_ROUTER_E2E_ONE_PASS=1: the pool's `gateway` is neither a block nor a flow mapping"
    );
    let children: Vec<&str> = lines[at + 1..]
        .iter()
        .take_while(|l| l.trim().is_empty() || l.starts_with([' ', '#']))
        .copied()
        .collect();
    if children
        .iter()
        .any(|l| l.trim_start().starts_with("onePass:"))
    {
        return yaml.to_owned();
    }
    let indent = children
        .iter()
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map_or("  ", |l| &l[..l.len() - l.trim_start().len()]);
    out.insert(at + 1, format!("{indent}onePass: true"));
    out.join("\n") + "\n"
}

impl ControlPlane {
    /// Writes `config_yaml` to the test directory and serves it with `env`.
    pub async fn start(dir: &TestDir, config_yaml: &str, env: &[(String, String)]) -> Result<Self> {
        let config_yaml = with_one_pass_if_asked(config_yaml);
        let config = dir.write("pool.yaml", &config_yaml)?;
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

    /// Reads `GET /admin/events{query}` (server-sent events) into a channel, as
    /// `(type, json)`, until the stream or the receiver ends.
    pub async fn events(
        &self,
        admin_token: &str,
        query: &str,
    ) -> Result<tokio::sync::mpsc::UnboundedReceiver<(String, Value)>> {
        let mut resp = reqwest::Client::builder()
            .no_proxy()
            .build()?
            .get(format!("http://{}/admin/events{query}", self.http))
            .bearer_auth(admin_token)
            .send()
            .await?;
        ensure!(
            resp.status().as_u16() == 200,
            "GET /admin/events{query}: {}",
            resp.status()
        );
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            // Bytes until a whole line: a chunk may end inside a character.
            let mut buf: Vec<u8> = Vec::new();
            let mut name = String::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                // What the admin event stream showed is part of the whole-run scan.
                scan::observe_operator("the admin event stream (/admin/events)", &chunk);
                buf.extend_from_slice(&chunk);
                while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                    let bytes: Vec<u8> = buf.drain(..=end).collect();
                    let line = String::from_utf8_lossy(&bytes);
                    let line = line.trim_end();
                    if let Some(n) = line.strip_prefix("event:") {
                        name = n.trim().to_string();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        let v = serde_json::from_str(d.trim()).unwrap_or(Value::Null);
                        if tx.send((name.clone(), v)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(rx)
    }

    /// The state version the control plane pushes now (`GET /health`).
    pub async fn state_version(&self) -> Result<u64> {
        let url = format!("http://{}/health", self.http);
        let health: Value = http_client()?.get(url).send().await?.json().await?;
        health["version"]
            .as_u64()
            .ok_or_else(|| anyhow!("no version in /health: {health}"))
    }

    /// Polls `/metrics` until it has a line containing every one of `parts` (what Envoy
    /// reported reaches the control plane within a tick or two); returns that line.
    pub async fn metric_line(&self, parts: &[&str]) -> Result<String> {
        let url = format!("http://{}/metrics", self.http);
        poll(
            &format!("a metric line with {parts:?}"),
            Duration::from_secs(10),
            || {
                let url = url.clone();
                async move {
                    let text = http_client()?.get(url).send().await?.text().await?;
                    Ok(text
                        .lines()
                        .find(|l| parts.iter().all(|p| l.contains(p)))
                        .map(str::to_string))
                }
            },
        )
        .await
    }

    /// The running generation's process id (the benchmark reads its CPU time and memory).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Process::pid)
    }

    /// Kills the control plane.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
            self.stopped.push(p);
        }
    }

    /// Sends SIGTERM and waits (up to `timeout`) for the process to exit on its own: the drain.
    pub async fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let Some(mut p) = self.process.take() else {
            anyhow::bail!("the control plane is not running");
        };
        let pid = p.pid().context("no pid")?.to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status()?;
        anyhow::ensure!(sent.success(), "kill -TERM {pid} failed");
        let status = p.wait_exit(timeout).await;
        self.stopped.push(p);
        status
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

#[cfg(test)]
mod tests {
    use super::with_one_pass;

    #[test]
    fn one_pass_is_inserted_into_the_pool_s_text_and_a_pool_s_own_choice_kept() {
        let cases = [
            // A block, its children's indent kept, its comments and the rest untouched.
            (
                "# a pool\nproviders: []\ngateway:\n    retries: 2 # kept\nkeys: []\n",
                "# a pool\nproviders: []\ngateway:\n    onePass: true\n    retries: 2 # kept\nkeys: []\n",
            ),
            ("providers: []\n", "providers: []\ngateway:\n  onePass: true\n"),
            (
                "gateway: # the listener\n  port: 0\n",
                "gateway: # the listener\n  onePass: true\n  port: 0\n",
            ),
            // Flow style, as most tests' pools are written.
            (
                "gateway: { host: 127.0.0.1, keyStore: { type: memory } }\nkeys: []\n",
                "gateway: { onePass: true, host: 127.0.0.1, keyStore: { type: memory } }\nkeys: []\n",
            ),
            ("gateway: {}\n", "gateway: { onePass: true }\n"),
            // A pool's own choice.
            ("gateway:\n  onePass: false\n", "gateway:\n  onePass: false\n"),
            (
                "gateway: { port: 0, onePass: false }\n",
                "gateway: { port: 0, onePass: false }\n",
            ),
        ];
        for (pool, with) in cases {
            assert_eq!(with_one_pass(pool), with, "{pool}");
        }
        // Every pool the fixture starts gets it, and still parses.
        for pool in [
            crate::fixture::pool_yaml_header(),
            crate::fixture::admin_pool_yaml_header(),
        ] {
            let with = with_one_pass(&pool);
            let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&with).unwrap();
            assert_eq!(
                value["gateway"]["onePass"],
                serde_yaml_ng::Value::Bool(true)
            );
        }
    }
}
