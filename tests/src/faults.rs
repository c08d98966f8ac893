//! The fault rig: the pool of `examples/conformance.yaml` on test mocks (a fault mock, a healthy
//! mock, a port nothing listens on), and the conformance runner run as a user runs it.

use super::*;

/// The example conformance pool with its fixed addresses moved onto the test's: `fault` and
/// `healthy` mock URLs (`http://127.0.0.1:<port>`), a refused port, ephemeral listeners and a
/// memory key store. Its provider secrets are added to `setup`.
pub fn conformance_pool(fault: &str, healthy: &str, refused_port: u16) -> Result<PoolSetup> {
    let path = workspace_root().join("examples/conformance.yaml");
    let example =
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut yaml = String::new();
    for line in example.lines() {
        let line = match line.trim() {
            "port: 8080" => "  port: 0\n  keyStore: { type: memory }".to_string(),
            "httpPort: 8081" => "  httpPort: 0".to_string(),
            "grpcPort: 8082" => "  grpcPort: 0".to_string(),
            _ => line
                .replace("http://127.0.0.1:9101", fault)
                .replace("http://127.0.0.1:9102", healthy)
                .replace(
                    "http://127.0.0.1:9/",
                    &format!("http://127.0.0.1:{refused_port}/"),
                ),
        };
        yaml.push_str(&line);
        yaml.push('\n');
    }
    let mut setup = PoolSetup {
        yaml,
        ..PoolSetup::default()
    };
    setup.secret_env("CONFORMANCE_KEY", "fault");
    setup.secret_env("HEALTHY_KEY", "healthy");
    Ok(setup)
}

/// A loopback port nothing listens on (bound, then released).
pub fn refused_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// The conformance pool: mock 1 is the fault mock, mock 2 the healthy lane.
pub async fn start_conformance_pool(test: &str) -> Result<Pool> {
    let refused = refused_port()?;
    Pool::start(test, 2, |urls, _| {
        conformance_pool(&urls[0], &urls[1], refused)
    })
    .await
}

/// What `ai-router conformance --json` printed: one object per case, then the summary.
#[derive(Debug, Clone)]
pub struct ConformanceRun {
    pub success: bool,
    pub cases: Vec<Value>,
    pub summary: Value,
    pub stdout: String,
    pub stderr: String,
}

impl ConformanceRun {
    /// The lines of the cases handled wrongly.
    pub fn failures(&self) -> Vec<&Value> {
        self.cases
            .iter()
            .filter(|case| case.get("ok") != Some(&Value::Bool(true)))
            .collect()
    }
}

/// Runs `ai-router conformance --json` against the pool's Envoy with the fault mock (mock 1),
/// the virtual key in `STARCI_AI_KEY`, plus `extra` arguments; its outputs are saved in the
/// test directory.
pub async fn run_conformance(
    pool: &Pool,
    extra: &[&str],
    limit: Duration,
) -> Result<ConformanceRun> {
    let mut cmd = tokio::process::Command::new(ai_router_bin()?);
    cmd.arg("conformance")
        .arg("--url")
        .arg(pool.envoy.base_url())
        .arg("--mock")
        .arg(pool.mocks[0].url())
        .arg("--json")
        .args(extra)
        .env_clear()
        .env("STARCI_AI_KEY", &pool.virtual_key)
        .env("NO_PROXY", "*")
        .kill_on_drop(true);
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .with_context(|| format!("the conformance run did not finish within {limit:?}"))?
        .context("running ai-router conformance")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    scan::observe("the conformance runner's output", out.stdout.as_slice());
    scan::observe("the conformance runner's stderr", out.stderr.as_slice());
    fs::write(pool.dir.join("conformance.stdout"), &stdout)?;
    fs::write(pool.dir.join("conformance.stderr"), &stderr)?;
    let mut cases = Vec::new();
    let mut summary = Value::Null;
    for line in stdout.lines() {
        let value: Value = serde_json::from_str(line)
            .with_context(|| format!("a line of the conformance output is not JSON: {line}"))?;
        match value.get("summary") {
            Some(found) => summary = found.clone(),
            None => cases.push(value),
        }
    }
    Ok(ConformanceRun {
        success: out.status.success(),
        cases,
        summary,
        stdout,
        stderr,
    })
}
