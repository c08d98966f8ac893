//! What a run records about itself: commit, command, machine and every system's version.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use ai_router_e2e::workspace_root;

use crate::peers;
use crate::report::{Machine, Meta};
use crate::{Args, ENVOY_WORKERS};

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// What a program prints (its stdout, or its stderr when stdout is empty), trimmed.
fn command_output(program: &Path, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if out.is_empty() {
                String::from_utf8_lossy(&o.stderr).trim().to_string()
            } else {
                out
            }
        })
        .unwrap_or_default()
}

/// The first line a program prints.
fn command_line(program: &Path, args: &[&str]) -> String {
    peers::first_line(&command_output(program, args))
}

pub fn meta(args: &Args, envoy: &Path, ai_router: &Path) -> Meta {
    let root = workspace_root();
    let git = |a: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(a)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let versions = versions(args, envoy, ai_router);
    let mode = if args.smoke { "smoke" } else { "full" };
    Meta {
        mode: mode.to_string(),
        note: if args.smoke {
            "smoke run: a fraction of a second per phase; the figures only prove that the harness works".to_string()
        } else {
            "full run; on a shared or busy machine the figures are noisy: compare runs made on the same quiet machine".to_string()
        },
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
        duration_s: 0.0,
        git_commit: git(&["rev-parse", "HEAD"]),
        git_dirty: !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine(),
        versions,
        envoy_workers: ENVOY_WORKERS,
        upstream_workers: args.upstream_workers,
        systems_headers: String::new(),
        prompt_kb: args.prompt_kb,
        request_bytes: crate::load::chat_body("model", false).len(),
        plan: None,
    }
}

/// Every system's version as it says it.
fn versions(args: &Args, envoy: &Path, ai_router: &Path) -> BTreeMap<String, String> {
    let mut versions = BTreeMap::new();
    let envoy_version = command_line(envoy, &["--version"]);
    versions.insert(
        "envoy".to_string(),
        envoy_version
            .split_once("version: ")
            .and_then(|(_, v)| v.split('/').nth(1))
            .map_or(envoy_version.clone(), str::to_string),
    );
    let profile = if ai_router.components().any(|c| c.as_os_str() == "release") {
        "release"
    } else {
        "debug"
    };
    versions.insert(
        "ai-router".to_string(),
        format!(
            "{} ({profile} build of the commit)",
            env!("CARGO_PKG_VERSION")
        ),
    );
    versions.insert(
        "load generator".to_string(),
        format!(
            "ai-router-bench {} (hyper 1, HTTP/1.1 keep-alive, one thread)",
            env!("CARGO_PKG_VERSION")
        ),
    );
    if let Some(litellm) = &args.litellm {
        let python = litellm.with_file_name("python");
        versions.insert(
            "litellm".to_string(),
            command_line(
                &python,
                &[
                    "-c",
                    "import importlib.metadata as m; print(m.version('litellm'))",
                ],
            ),
        );
    }
    if let Some(start_server) = &args.portkey {
        let package = start_server
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("package.json"));
        let version = package
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| {
                v.get("version")
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        versions.insert("portkey gateway".to_string(), version);
        let node = args.node.clone().unwrap_or_else(peers::node_bin);
        versions.insert("node".to_string(), command_line(&node, &["--version"]));
    }
    if let Some(agentgateway) = &args.agentgateway {
        versions.insert(
            "agentgateway".to_string(),
            peers::agentgateway_version(&command_output(agentgateway, &["--version"])),
        );
    }
    versions
}

/// The machine the run is on.
fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Machine {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default(),
        mem_total_gb: mem_kb / 1024.0 / 1024.0,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        loadavg_start: loadavg(),
        loadavg_end: String::new(),
    }
}
