//! Processes.

use super::*;

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

/// Runs `ai-router <args>` with only `PATH` and `env` in its environment; (whether it
/// succeeded, its stdout as JSON (null when it is not), both outputs for a failure message).
pub async fn run_cli(args: &[&str], env: &[(&str, &str)]) -> Result<(bool, Value, String)> {
    let mut cmd = tokio::process::Command::new(ai_router_bin()?);
    cmd.args(args).env_clear();
    if let Ok(path) = std::env::var("PATH") {
        cmd.env("PATH", path);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .context("the CLI did not finish within 30 s")?
        .context("running the CLI")?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    scan::observe(
        &format!("the output of ai-router {}", args.first().unwrap_or(&"")),
        &out.stdout,
    );
    scan::observe("a CLI's stderr", &out.stderr);
    Ok((
        out.status.success(),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        format!("stdout: {stdout}\nstderr: {stderr}"),
    ))
}

/// The body of a plain `GET` (a metrics or stats page).
pub async fn get_text(url: &str) -> Result<String> {
    Ok(http_client()?
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?
        .text()
        .await?)
}

pub(crate) fn json_str<'a>(v: &'a Value, key: &str) -> Result<&'a str> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("no string field {key:?} in {v}"))
}

pub(crate) fn parse_addr(s: &str) -> Result<SocketAddr> {
    let s = s
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    s.parse()
        .with_context(|| format!("not a socket address: {s:?}"))
}

/// A process's resident set size in bytes (`VmRSS` in `/proc/<pid>/status`), `None` once it
/// is gone.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}
