//! The CLI with a stdout nobody reads any more (`ai-router keys list | head -c1`): the binary
//! is spawned with the read end of its stdout pipe already closed, so every write fails with
//! `BrokenPipe`. It must end without a panic: status 0 for a command that worked.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "ai-router-closed-stdout-{name}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `ai-router args` with a closed stdout; returns its exit code and stderr.
fn run_with_closed_stdout(args: &[&str], cwd: &Path) -> Result<(Option<i32>, String)> {
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_ai-router"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "warn")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()?;
    Ok((
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

const POOL: &str = "gateway: { keyStore: { type: sqlite, path: keys.sqlite } }\nproviders:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: AI_ROUTER_TEST_UNSET_KEY }], models: [{ id: m }] }\n";

#[test]
fn commands_end_quietly_when_stdout_is_closed() -> Result<()> {
    let dir = TempDir::new("ok")?;
    std::fs::write(dir.0.join("pool.yaml"), POOL)?;
    for args in [
        &["render-envoy", "--config", "pool.yaml"][..],
        &[
            "keys",
            "create",
            "--label",
            "app",
            "--models",
            "*",
            "--config",
            "pool.yaml",
        ][..],
        &["keys", "list", "--config", "pool.yaml"][..],
    ] {
        let (code, stderr) = run_with_closed_stdout(args, &dir.0)?;
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
    }
    Ok(())
}

#[test]
fn a_failing_command_with_a_closed_stdout_reports_without_a_panic() -> Result<()> {
    let dir = TempDir::new("err")?;
    std::fs::write(dir.0.join("pool.yaml"), POOL)?;
    let (code, stderr) = run_with_closed_stdout(
        &["keys", "get", "key_nope", "--config", "pool.yaml"],
        &dir.0,
    )?;
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no key key_nope"), "{stderr}");
    Ok(())
}
