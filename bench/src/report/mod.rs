//! What a run found, as JSON (`results.json`) and as markdown tables (`results.md`, and
//! stdout): the systems, the ratios between them, the ai-router scale table and the issue's
//! targets with whether the figures meet them.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::airouter::{Provisioning, Shape, SyncProbe};

mod markdown;
mod targets;

use crate::run::{Check, PhaseReport, Plan};
pub use markdown::markdown;
pub use targets::targets;

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_gb: f64,
    pub kernel: String,
    /// `/proc/loadavg` when the run started and when it ended: other work on the machine.
    pub loadavg_start: String,
    pub loadavg_end: String,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    /// `smoke` (figures only prove the harness works) or `full`.
    pub mode: String,
    pub note: String,
    pub started_unix_s: u64,
    pub duration_s: f64,
    pub git_commit: String,
    pub git_dirty: bool,
    pub command: String,
    pub machine: Machine,
    pub versions: BTreeMap<String, String>,
    pub envoy_workers: u32,
    pub upstream_workers: u32,
    /// The fake upstream's rate-limit header variant for the systems comparison.
    pub systems_headers: String,
    /// `--prompt-kb`: the KB of earlier turns every request carries.
    pub prompt_kb: usize,
    /// The size of the unary request's body.
    pub request_bytes: usize,
    pub plan: Option<Plan>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Probes {
    pub revoke: Option<SyncProbe>,
    pub blacklist: Option<SyncProbe>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Added {
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemResult {
    pub name: String,
    pub description: String,
    pub error: Option<String>,
    pub check: Option<Check>,
    pub phases: BTreeMap<String, PhaseReport>,
    /// c1 latency minus the direct run's (the floor).
    pub added_latency_c1: Option<Added>,
    /// Each process's peak resident set (VmHWM) at the end, summed per process tree, MB.
    pub peak_rss_mb: BTreeMap<String, f64>,
    pub peak_rss_total_mb: f64,
    pub processes: BTreeMap<String, Vec<String>>,
    pub start_s: f64,
    /// ai-router: the requests its attempt listener took during the run (a call in one pass
    /// takes it only for a retry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_listener_requests: Option<u64>,
}

impl SystemResult {
    pub fn phase(&self, name: &str) -> Option<&PhaseReport> {
        self.phases.get(name)
    }

    pub fn failed_requests(&self) -> u64 {
        self.phases
            .values()
            .map(|p| p.load.failed + p.load.invalid)
            .sum()
    }
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleResult {
    pub label: String,
    pub shape: Option<Shape>,
    pub error: Option<String>,
    pub c16: Option<PhaseReport>,
    pub peak_rss_mb: BTreeMap<String, f64>,
    pub peak_rss_total_mb: f64,
    /// Bytes Envoy received on the sync stream per second during the c16 phase.
    pub sync_rx_bytes_per_s_under_load: Option<f64>,
    /// CPU seconds per second of the control plane and of Envoy with no traffic.
    pub idle_cpu_s_per_s: BTreeMap<String, f64>,
    pub probes: Probes,
    /// Control plane + Envoy start, until the filter has its state.
    pub start_s: f64,
    /// One `POST /admin/keys` with the scenario's virtual keys already in the store.
    pub create_key_ms: Option<f64>,
    /// The row whose c16 phase alternated with this one's in rounds (see [`ScalePair`]); none
    /// for a row measured alone.
    pub paired_with: Option<String>,
}

/// One round of a pair: each row's c16 figures in it.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PairRound {
    /// `small` or `large`: which row ran first in this round.
    pub first: String,
    pub small_rps: f64,
    pub large_rps: f64,
    /// Large ÷ small throughput.
    pub rps_ratio: Option<f64>,
    pub small_p99_ms: f64,
    pub large_p99_ms: f64,
}

/// Two scale rows measured side by side: their c16 phases alternated in rounds, each row's
/// figures aggregated over its rounds (in its `c16`).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScalePair {
    pub small: String,
    pub large: String,
    /// Seconds of each row's load per round.
    pub round_s: f64,
    pub rounds: Vec<PairRound>,
    /// Large ÷ small: throughput over all rounds (requests over the rounds' summed time).
    pub rps_ratio: Option<f64>,
    /// Large ÷ small: p99 over all the rounds' requests.
    pub p99_ratio: Option<f64>,
    /// The rounds' throughput ratios: the lowest and the median.
    pub round_rps_ratio_min: Option<f64>,
    pub round_rps_ratio_median: Option<f64>,
    /// Large ÷ small: CPU seconds of the instance's processes per 1,000 requests over all
    /// rounds (a figure other work on the machine moves less than throughput).
    pub cpu_per_1k_ratio: Option<f64>,
}

impl ScalePair {
    pub fn new(
        small: String,
        large: String,
        round_s: f64,
        rounds: Vec<PairRound>,
        small_c16: &PhaseReport,
        large_c16: &PhaseReport,
    ) -> Self {
        let mut ratios: Vec<f64> = rounds.iter().filter_map(|r| r.rps_ratio).collect();
        ratios.sort_by(f64::total_cmp);
        Self {
            small,
            large,
            round_s,
            rps_ratio: div(
                Some(large_c16.load.throughput_rps),
                Some(small_c16.load.throughput_rps),
            ),
            p99_ratio: div(
                Some(large_c16.load.latency_ms.p99),
                Some(small_c16.load.latency_ms.p99),
            ),
            cpu_per_1k_ratio: div(
                Some(large_c16.cpu_s_per_1k.system),
                Some(small_c16.cpu_s_per_1k.system),
            ),
            round_rps_ratio_min: ratios.first().copied(),
            round_rps_ratio_median: median(&ratios),
            rounds,
        }
    }
}

/// The median of sorted values (the mean of the middle two for an even count).
fn median(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => sorted.get(n / 2).copied(),
        _ => Some((sorted.get(n / 2 - 1)? + sorted.get(n / 2)?) / 2.0),
    }
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub meta: Meta,
    pub systems: Vec<SystemResult>,
    pub scale: Vec<ScaleResult>,
    /// The scale rows measured side by side (the small pool and the large one, all serving).
    pub scale_pairs: Vec<ScalePair>,
    pub provisioning: Vec<Provisioning>,
    pub ratios: Vec<Ratio>,
    pub targets: Vec<Target>,
    pub errors: Vec<String>,
}

/// One system's figures divided by another's.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ratio {
    pub system: String,
    pub against: String,
    /// Added latency at c1, p50 and p99 (lower is better).
    pub added_p50_c1: Option<f64>,
    pub added_p99_c1: Option<f64>,
    /// Throughput (higher is better) and p99 (lower is better) at c16 and c64.
    pub rps_c16: Option<f64>,
    pub p99_c16: Option<f64>,
    pub rps_c64: Option<f64>,
    pub p99_c64: Option<f64>,
    pub open_p99: Option<f64>,
    pub stream_ttfb_p50: Option<f64>,
    pub cpu_per_1k_c16: Option<f64>,
    pub peak_rss: Option<f64>,
}

/// One of the targets.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    pub target: String,
    pub figure: String,
    /// `yes`, `no` or `not measured`.
    pub met: String,
}

fn div(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b.abs() > 1e-12 => Some(a / b),
        _ => None,
    }
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.digits$}"))
}

fn x(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.2}×"))
}

fn rps(s: &SystemResult, phase: &str) -> Option<f64> {
    s.phase(phase).map(|p| p.load.throughput_rps)
}

fn p99(s: &SystemResult, phase: &str) -> Option<f64> {
    s.phase(phase).map(|p| p.load.latency_ms.p99)
}

fn p50(s: &SystemResult, phase: &str) -> Option<f64> {
    s.phase(phase).map(|p| p.load.latency_ms.p50)
}

fn ttfb(s: &SystemResult) -> Option<f64> {
    s.phase("stream-c1")
        .and_then(|p| p.load.first_byte_ms.as_ref())
        .map(|l| l.p50)
}

/// The system's CPU per 1,000 requests at c16 (none for the direct run: no process of its own).
fn cpu16(s: &SystemResult) -> Option<f64> {
    if s.processes.is_empty() {
        return None;
    }
    s.phase("c16").map(|p| p.cpu_s_per_1k.system)
}

fn rss(s: &SystemResult) -> Option<f64> {
    (s.peak_rss_total_mb > 0.0).then_some(s.peak_rss_total_mb)
}

/// `system ÷ against` for every figure both have.
pub fn ratio(system: &SystemResult, against: &SystemResult) -> Ratio {
    let added = |s: &SystemResult, p99: bool| {
        s.added_latency_c1
            .as_ref()
            .map(|a| if p99 { a.p99_ms } else { a.p50_ms })
    };
    Ratio {
        system: system.name.clone(),
        against: against.name.clone(),
        added_p50_c1: div(added(system, false), added(against, false)),
        added_p99_c1: div(added(system, true), added(against, true)),
        rps_c16: div(rps(system, "c16"), rps(against, "c16")),
        p99_c16: div(p99(system, "c16"), p99(against, "c16")),
        rps_c64: div(rps(system, "c64"), rps(against, "c64")),
        p99_c64: div(p99(system, "c64"), p99(against, "c64")),
        open_p99: div(p99(system, "open"), p99(against, "open")),
        stream_ttfb_p50: div(ttfb(system), ttfb(against)),
        cpu_per_1k_c16: div(cpu16(system), cpu16(against)),
        peak_rss: div(rss(system), rss(against)),
    }
}

/// The systems ai-router is compared with in the headline, in its order: the floor of its
/// design, plain Envoy, then the peers.
const HEADLINE: [&str; 5] = [
    "envoy-internal",
    "envoy",
    "agentgateway",
    "portkey",
    "litellm",
];

/// Every pair the comparison needs: ai-router against plain Envoy and each peer, each peer
/// against plain Envoy.
pub fn ratios(systems: &[SystemResult]) -> Vec<Ratio> {
    let ok: Vec<&SystemResult> = systems.iter().filter(|s| s.error.is_none()).collect();
    let find = |n: &str| ok.iter().copied().find(|s| s.name == n);
    let mut out = Vec::new();
    let pairs = [
        ("ai-router", "envoy"),
        ("ai-router", "envoy-internal"),
        ("ai-router-one-pass", "envoy"),
        ("ai-router-one-pass", "envoy-internal"),
        ("ai-router-one-pass", "ai-router"),
        ("ai-router-one-pass", "portkey"),
        ("ai-router-one-pass", "litellm"),
        ("ai-router-one-pass", "agentgateway"),
        ("envoy-internal", "envoy"),
        ("ai-router", "litellm"),
        ("ai-router", "portkey"),
        ("ai-router", "agentgateway"),
        ("litellm", "envoy"),
        ("portkey", "envoy"),
        ("agentgateway", "envoy"),
        ("envoy", "direct"),
    ];
    for (a, b) in pairs {
        if let (Some(a), Some(b)) = (find(a), find(b)) {
            out.push(ratio(a, b));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{LoadResult, Percentiles};
    use crate::run::Cpu;

    fn c16(rps: f64, p99: f64, cpu: f64) -> PhaseReport {
        PhaseReport {
            concurrency: Some(16),
            rate: None,
            stream: false,
            load: LoadResult {
                throughput_rps: rps,
                latency_ms: Percentiles {
                    p99,
                    ..Default::default()
                },
                ..Default::default()
            },
            cpu_s: Cpu::default(),
            cpu_s_per_1k: Cpu {
                system: cpu,
                ..Default::default()
            },
            cpu_s_by_process: BTreeMap::new(),
        }
    }

    fn round(small: f64, large: f64) -> PairRound {
        PairRound {
            small_rps: small,
            large_rps: large,
            rps_ratio: Some(large / small),
            ..Default::default()
        }
    }

    #[test]
    fn a_pair_gives_the_aggregate_ratios_and_the_rounds_lowest_and_median() {
        let rounds = vec![
            round(100.0, 90.0),
            round(100.0, 110.0),
            round(100.0, 80.0),
            round(100.0, 100.0),
            round(100.0, 95.0),
        ];
        let p = ScalePair::new(
            "s".into(),
            "l".into(),
            2.0,
            rounds,
            &c16(2000.0, 10.0, 0.4),
            &c16(1900.0, 12.0, 0.5),
        );
        assert_eq!(p.rps_ratio, Some(0.95));
        assert!(p.p99_ratio.is_some_and(|r| (r - 1.2).abs() < 1e-9));
        assert_eq!(p.round_rps_ratio_min, Some(0.8));
        assert_eq!(p.cpu_per_1k_ratio, Some(1.25));
        assert_eq!(p.round_rps_ratio_median, Some(0.95));
        assert_eq!(median(&[1.0, 2.0, 3.0, 5.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
