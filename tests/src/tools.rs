//! Tools and directories.

use super::*;

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

pub(crate) fn tool_from_env(var: &str, default: PathBuf, what: &str) -> Result<PathBuf> {
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

/// `docker-compose ARGS` on the workspace's compose file with `env` set (and `AI_ROUTER_ENVOY_UID`,
/// `AI_ROUTER_ENVOY_GID` unset unless given): its standard output; an error unless it succeeds.
pub fn compose_config(args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let out = std::process::Command::new("docker-compose")
        .args(args)
        .current_dir(workspace_root())
        .env_remove("AI_ROUTER_ENVOY_UID")
        .env_remove("AI_ROUTER_ENVOY_GID")
        .envs(env.iter().copied())
        .output()
        .context("docker-compose (scripts/setup.sh installs it)")?;
    if !out.status.success() {
        bail!(
            "docker-compose {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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

    /// A fresh directory named after this one, `<this>-<name>-<pid>-<n>` (a second process's).
    pub fn beside(&self, name: &str) -> Result<Self> {
        let base = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self::new(&format!("{base}-{name}"))
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
