//! CPU time and memory of a system's processes, from `/proc`: a system is a set of root
//! processes and their descendants (found by parent id at each reading).

use std::collections::BTreeMap;
use std::fs;
use std::process::Command;
use std::sync::OnceLock;

use serde::Serialize;

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`, 100 on Linux).
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// The fields of `/proc/<pid>/stat` after the command name.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = text.rsplit_once(')')?.1;
    Some(after.split_whitespace().map(str::to_string).collect())
}

/// `(ppid, cpu seconds of the process, cpu seconds of its reaped children)`.
fn stat(pid: u32) -> Option<(u32, f64, f64)> {
    let f = stat_fields(pid)?;
    // After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let ppid = f.get(1).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
    let ticks = clock_ticks();
    Some((
        ppid,
        (num(11) + num(12)) / ticks,
        (num(13) + num(14)) / ticks,
    ))
}

/// A `/proc/<pid>/status` field in kB (`VmRSS`, `VmHWM`).
fn status_kb(pid: u32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':').map(str::to_string))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The command name (`/proc/<pid>/comm`).
fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Every live process: pid -> ppid.
fn parents() -> BTreeMap<u32, u32> {
    let mut out = BTreeMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            if let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            {
                if let Some((ppid, _, _)) = stat(pid) {
                    out.insert(pid, ppid);
                }
            }
        }
    }
    out
}

/// Named root processes; each reading covers them and their descendants.
#[derive(Debug, Clone, Default)]
pub struct ProcSet {
    roots: Vec<(String, u32)>,
}

/// One reading of a set: CPU seconds so far and memory, per root (descendants included).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reading {
    pub cpu_s: BTreeMap<String, f64>,
    /// Each process's peak resident set (VmHWM), summed per root, MB.
    pub peak_rss_mb: BTreeMap<String, f64>,
    /// Resident set now (VmRSS), summed per root, MB.
    pub rss_mb: BTreeMap<String, f64>,
    pub processes: BTreeMap<String, Vec<String>>,
}

impl Reading {
    pub fn peak_rss_total(&self) -> f64 {
        self.peak_rss_mb.values().sum()
    }
}

impl ProcSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, name: &str, pid: Option<u32>) {
        if let Some(pid) = pid {
            self.roots.push((name.to_string(), pid));
        }
    }

    /// Every pid of each root's tree.
    pub fn trees(&self) -> Vec<(String, Vec<u32>)> {
        let parents = parents();
        self.roots
            .iter()
            .map(|(name, root)| {
                let mut tree = vec![*root];
                let mut i = 0;
                while i < tree.len() {
                    let p = tree[i];
                    tree.extend(parents.iter().filter(|(_, pp)| **pp == p).map(|(c, _)| *c));
                    i += 1;
                }
                tree.retain(|pid| parents.contains_key(pid));
                (name.clone(), tree)
            })
            .collect()
    }

    pub fn read(&self) -> Reading {
        let mut r = Reading::default();
        for (name, tree) in self.trees() {
            let cpu: f64 = tree
                .iter()
                .filter_map(|p| stat(*p))
                .map(|(_, own, reaped)| own + reaped)
                .sum();
            let peak: u64 = tree.iter().map(|p| status_kb(*p, "VmHWM")).sum();
            let rss: u64 = tree.iter().map(|p| status_kb(*p, "VmRSS")).sum();
            r.cpu_s.insert(name.clone(), cpu);
            r.peak_rss_mb.insert(name.clone(), peak as f64 / 1024.0);
            r.rss_mb.insert(name.clone(), rss as f64 / 1024.0);
            r.processes.insert(
                name,
                tree.iter().map(|p| format!("{p} {}", comm(*p))).collect(),
            );
        }
        r
    }

    /// SIGKILLs every descendant of the roots (the roots themselves are the harness's to kill).
    pub fn kill_descendants(&self) {
        for (_, tree) in self.trees() {
            for pid in tree.iter().skip(1).rev() {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

/// CPU seconds this process (the load generator) has used, without its reaped children (the
/// systems it ran).
pub fn own_cpu_s() -> f64 {
    stat(std::process::id())
        .map(|(_, own, _)| own)
        .unwrap_or(0.0)
}
