//! What a run found, as JSON (`results.json`) and as markdown tables (`results.md`, and
//! stdout): the systems, the ratios between them, the ai-router scale table and the issue's
//! targets with whether the figures meet them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::airouter::{Provisioning, Shape, SyncProbe};
use crate::run::{Check, PhaseReport, Plan};

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
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub meta: Meta,
    pub systems: Vec<SystemResult>,
    pub scale: Vec<ScaleResult>,
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

fn scale_row(scale: &[ScaleResult], pred: impl Fn(&Shape) -> bool) -> Option<&ScaleResult> {
    scale
        .iter()
        .find(|s| s.error.is_none() && s.shape.as_ref().is_some_and(&pred))
}

fn met(ok: Option<bool>) -> String {
    match ok {
        Some(true) => "yes".into(),
        Some(false) => "no".into(),
        None => "not measured".into(),
    }
}

/// The targets against this run's figures.
pub fn targets(
    systems: &[SystemResult],
    scale: &[ScaleResult],
    many_vk: usize,
    many_pk: usize,
) -> Vec<Target> {
    use crate::upstream::Headers;
    let mut out = Vec::new();
    let base = scale_row(scale, |s| {
        s.virtual_keys <= 10
            && s.serving_keys == 8
            && s.other_keys == 0
            && s.headers == Headers::Changing
    });
    for (what, big) in [
        (
            "all serve",
            scale_row(scale, |s| {
                s.virtual_keys == many_vk
                    && s.serving_keys == many_pk
                    && s.headers == Headers::Changing
            }),
        ),
        (
            "8 serve",
            scale_row(scale, |s| {
                s.virtual_keys == many_vk
                    && s.serving_keys == 8
                    && s.other_keys + 8 == many_pk
                    && s.headers == Headers::Changing
            }),
        ),
    ] {
        let rps_of = |r: Option<&ScaleResult>| {
            r.and_then(|r| r.c16.as_ref())
                .map(|p| p.load.throughput_rps)
        };
        let p99_of = |r: Option<&ScaleResult>| {
            r.and_then(|r| r.c16.as_ref())
                .map(|p| p.load.latency_ms.p99)
        };
        let tr = div(rps_of(big), rps_of(base));
        let pr = div(p99_of(big), p99_of(base));
        out.push(Target {
            target: format!("{many_vk} VK + {many_pk} PK ({what}), changing headers: c16 throughput ≥ 90% of 10 VK / 8 PK"),
            figure: format!("{} of {} rps = {}", f(rps_of(big), 0), f(rps_of(base), 0), tr.map_or("–".into(), |v| format!("{:.0}%", v * 100.0))),
            met: met(tr.map(|v| v >= 0.9)),
        });
        out.push(Target {
            target: format!("{many_vk} VK + {many_pk} PK ({what}), changing headers: c16 p99 within 1.5× of 10 VK / 8 PK"),
            figure: format!("{} ms vs {} ms = {}", f(p99_of(big), 1), f(p99_of(base), 1), x(pr)),
            met: met(pr.map(|v| v <= 1.5)),
        });
        let total = big.map(|b| b.peak_rss_total_mb).filter(|v| *v > 0.0);
        out.push(Target {
            target: format!(
                "{many_vk} VK + {many_pk} PK ({what}): Envoy + control plane under 150 MB RSS"
            ),
            figure: format!("{} MB (peak, summed)", f(total, 0)),
            met: met(total.map(|v| v < 150.0)),
        });
        for (kind, probe) in [
            (
                "a revoked virtual key",
                big.and_then(|b| b.probes.revoke.as_ref()),
            ),
            (
                "a blacklisted provider key",
                big.and_then(|b| b.probes.blacklist.as_ref()),
            ),
        ] {
            let ms = probe.map(|p| p.every_worker_ms);
            out.push(Target {
                target: format!(
                    "{many_vk} VK + {many_pk} PK ({what}): {kind} reaches every Envoy worker within 1 s"
                ),
                figure: format!("{} ms", f(ms, 0)),
                met: met(ms.map(|v| v <= 1000.0)),
            });
        }
    }
    let find = |n: &str| systems.iter().find(|s| s.name == n && s.error.is_none());
    let ar = find("ai-router");
    let envoy = find("envoy");
    let added = |s: Option<&SystemResult>| {
        s.and_then(|s| s.added_latency_c1.as_ref())
            .map(|a| a.p50_ms)
    };
    let r = div(added(ar), added(envoy));
    out.push(Target {
        target: "added latency at c1 (p50) within 2× of the plain Envoy hop's".into(),
        figure: format!(
            "{} ms vs {} ms = {}",
            f(added(ar), 3),
            f(added(envoy), 3),
            x(r)
        ),
        met: met(r.map(|v| v <= 2.0)),
    });
    let agw = find("agentgateway");
    let added99 = |s: Option<&SystemResult>| {
        s.and_then(|s| s.added_latency_c1.as_ref())
            .map(|a| a.p99_ms)
    };
    for (what, of) in [
        (
            "p50",
            &added as &dyn Fn(Option<&SystemResult>) -> Option<f64>,
        ),
        ("p99", &added99),
    ] {
        let r = div(of(ar), of(agw));
        out.push(Target {
            target: format!("added latency at c1 ({what}) below agentgateway's"),
            figure: format!("{} ms vs {} ms = {}", f(of(ar), 3), f(of(agw), 3), x(r)),
            met: met(r.map(|v| v < 1.0)),
        });
    }
    for (peer, min, label) in [
        ("envoy", 0.5, "at least 50% of plain Envoy's"),
        ("portkey", 5.0, "at least 5× Portkey's"),
        ("litellm", 40.0, "at least 40× LiteLLM's"),
    ] {
        let r = div(
            ar.and_then(|s| rps(s, "c16")),
            find(peer).and_then(|s| rps(s, "c16")),
        );
        out.push(Target {
            target: format!("c16 throughput {label}"),
            figure: format!(
                "{} vs {} rps = {}",
                f(ar.and_then(|s| rps(s, "c16")), 0),
                f(find(peer).and_then(|s| rps(s, "c16")), 0),
                x(r)
            ),
            met: met(r.map(|v| v >= min)),
        });
    }
    out
}

/// The whole report as markdown.
pub fn markdown(r: &Report) -> String {
    let mut o = String::new();
    let m = &r.meta;
    let _ = writeln!(o, "# ai-router benchmark ({})\n", m.mode);
    let _ = writeln!(o, "> {}\n", m.note);
    let _ = writeln!(
        o,
        "- commit `{}`{}; command `{}`",
        m.git_commit,
        if m.git_dirty {
            " (with uncommitted changes)"
        } else {
            ""
        },
        m.command
    );
    let _ = writeln!(
        o,
        "- machine: {} CPUs ({}), {:.0} GB RAM, kernel {}; load average at start {}, at end {}",
        m.machine.nproc,
        m.machine.cpu_model,
        m.machine.mem_total_gb,
        m.machine.kernel,
        m.machine.loadavg_start,
        m.machine.loadavg_end
    );
    let versions: Vec<String> = m.versions.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(o, "- versions: {}", versions.join("; "));
    if let Some(p) = &m.plan {
        let _ = writeln!(
            o,
            "- plan: warm-up {} s, {} s per phase, open loop at {} req/s (≤ {} in flight); Envoy workers {}, fake upstream workers {}; systems against the `{}` upstream; run took {:.0} s",
            p.warmup_s, p.phase_s, p.rate, p.max_in_flight, m.envoy_workers, m.upstream_workers, m.systems_headers, m.duration_s
        );
    }
    o.push('\n');

    headline(&mut o, r);

    let _ = writeln!(o, "## Systems\n");
    let _ = writeln!(o, "Latencies in ms; added = minus the direct run's (the floor); rps = successful requests per second; CPU = CPU seconds of the system's processes per 1,000 requests at c16; RSS = the system's processes' peak resident memory, summed (MB).\n");
    let _ = writeln!(o, "| system | c1 p50 | c1 p99 | added p50 | added p99 | c16 rps | c16 p99 | c64 rps | c64 p99 | open rps | open p50 | open p99 | stream TTFB p50 | stream TTLB p50 | CPU s/1k | RSS MB | failed |");
    let _ = writeln!(
        o,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for s in &r.systems {
        if let Some(e) = &s.error {
            let _ = writeln!(
                o,
                "| {} | error: {} |||||||||||||||| |",
                s.name,
                first_line(e)
            );
            continue;
        }
        let added = s.added_latency_c1.as_ref();
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            f(p50(s, "c1"), 3),
            f(p99(s, "c1"), 3),
            f(added.map(|a| a.p50_ms), 3),
            f(added.map(|a| a.p99_ms), 3),
            f(rps(s, "c16"), 0),
            f(p99(s, "c16"), 2),
            f(rps(s, "c64"), 0),
            f(p99(s, "c64"), 2),
            f(rps(s, "open"), 0),
            f(p50(s, "open"), 3),
            f(p99(s, "open"), 2),
            f(ttfb(s), 3),
            f(p50(s, "stream-c1"), 3),
            f(cpu16(s), 3),
            f(rss(s), 0),
            s.failed_requests()
        );
    }
    o.push('\n');

    if !r.ratios.is_empty() {
        let _ = writeln!(o, "## Ratios\n");
        let _ = writeln!(o, "Each cell is the first system's figure divided by the second's: for added latency, p99, CPU and RSS lower is better; for rps higher is better.\n");
        let _ = writeln!(o, "| system ÷ against | added p50 c1 | added p99 c1 | c16 rps | c16 p99 | c64 rps | c64 p99 | open p99 | stream TTFB | CPU/1k c16 | RSS |");
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for q in &r.ratios {
            let _ = writeln!(
                o,
                "| {} ÷ {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                q.system,
                q.against,
                x(q.added_p50_c1),
                x(q.added_p99_c1),
                x(q.rps_c16),
                x(q.p99_c16),
                x(q.rps_c64),
                x(q.p99_c64),
                x(q.open_p99),
                x(q.stream_ttfb_p50),
                x(q.cpu_per_1k_c16),
                x(q.peak_rss)
            );
        }
        o.push('\n');
    }

    if !r.scale.is_empty() {
        let _ = writeln!(o, "## ai-router at scale\n");
        let _ = writeln!(o, "VK = virtual keys in the key store; PK = provider keys (serving the benchmarked model on `fake-a`/`fake-b`, or on 8 other providers serving another model), plus one probe key on its own provider; headers: the fake upstream's rate-limit headers. c16 closed loop. Revoke/blacklist: ms until the change had reached every Envoy worker (the start of a run of polls in a row on fresh connections that all saw it); bytes: what Envoy received on the sync stream for that change. Sync B/s: sync stream bytes per second during the c16 load. Idle CPU: CPU s per s with no traffic.\n");
        let _ = writeln!(o, "| scenario | c16 rps | p50 | p99 | failed | Envoy MB | CP MB | total MB | CPU s/1k | sync B/s under load | idle CPU CP | idle CPU Envoy | revoke ms (same / other Envoy) | revoke bytes | blacklist ms (same / other Envoy) | blacklist bytes | CP saw blacklist ms | POST /admin/keys ms | start s |");
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for s in &r.scale {
            if let Some(e) = &s.error {
                let _ = writeln!(
                    o,
                    "| {} | error: {} ||||||||||||||||| |",
                    s.label,
                    first_line(e)
                );
                continue;
            }
            let c = s.c16.as_ref();
            let rv = s.probes.revoke.as_ref();
            let bl = s.probes.blacklist.as_ref();
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
                s.label,
                f(c.map(|p| p.load.throughput_rps), 0),
                f(c.map(|p| p.load.latency_ms.p50), 2),
                f(c.map(|p| p.load.latency_ms.p99), 2),
                c.map_or(0, |p| p.load.failed + p.load.invalid),
                f(s.peak_rss_mb.get("envoy").copied(), 0),
                f(s.peak_rss_mb.get("control-plane").copied(), 0),
                f(Some(s.peak_rss_total_mb), 0),
                f(c.map(|p| p.cpu_s_per_1k.system), 3),
                f(s.sync_rx_bytes_per_s_under_load, 0),
                f(s.idle_cpu_s_per_s.get("control-plane").copied(), 3),
                f(s.idle_cpu_s_per_s.get("envoy").copied(), 3),
                reach(rv),
                rv.map_or("–".into(), |p| p.sync_rx_bytes.to_string()),
                reach(bl),
                bl.map_or("–".into(), |p| p.sync_rx_bytes.to_string()),
                f(bl.and_then(|p| p.control_plane_ms), 0),
                f(s.create_key_ms, 0),
                s.start_s
            );
        }
        for s in &r.scale {
            for e in &s.probes.errors {
                let _ = writeln!(o, "\n- {}: probe error: {}", s.label, first_line(e));
            }
        }
        o.push('\n');
    }

    if !r.provisioning.is_empty() {
        let _ = writeln!(o, "## Provisioning the virtual keys\n");
        for p in &r.provisioning {
            let _ = writeln!(
                o,
                "- {} keys in {:.1} s ({:.0} keys/s): {}",
                p.virtual_keys, p.seconds, p.keys_per_second, p.how
            );
        }
        o.push('\n');
    }

    if !r.targets.is_empty() {
        let _ = writeln!(o, "## Targets (issue 8)\n");
        let _ = writeln!(o, "| target | this run | met |");
        let _ = writeln!(o, "|---|---|---|");
        for t in &r.targets {
            let _ = writeln!(o, "| {} | {} | {} |", t.target, t.figure, t.met);
        }
        o.push('\n');
    }

    if !r.errors.is_empty() {
        let _ = writeln!(o, "## Errors\n");
        for e in &r.errors {
            let _ = writeln!(o, "- {}", first_line(e));
        }
        o.push('\n');
    }
    o
}

/// The headline: ai-router's figures divided by each other system's of the same run.
fn headline(o: &mut String, r: &Report) {
    let rows: Vec<&Ratio> = HEADLINE
        .iter()
        .filter_map(|peer| {
            r.ratios
                .iter()
                .find(|q| q.system == "ai-router" && q.against == *peer)
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(o, "## Headline: ai-router ÷ each system of this run\n");
    let _ = writeln!(o, "ai-router's figure divided by the other system's, both measured in this run: below 1× is better for added latency, TTFB, CPU and RSS; above 1× is better for rps.\n");
    let _ = writeln!(o, "| ai-router ÷ | added p50 c1 | added p99 c1 | c16 rps | c64 rps | stream TTFB p50 | CPU/1k c16 | RSS |");
    let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for q in rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            q.against,
            x(q.added_p50_c1),
            x(q.added_p99_c1),
            x(q.rps_c16),
            x(q.rps_c64),
            x(q.stream_ttfb_p50),
            x(q.cpu_per_1k_c16),
            x(q.peak_rss)
        );
    }
    o.push('\n');
}

/// `same / other` ms of a probe.
fn reach(p: Option<&SyncProbe>) -> String {
    p.map_or_else(
        || "–".to_string(),
        |p| {
            p.reach
                .iter()
                .map(|r| format!("{:.0}", r.every_worker_ms))
                .collect::<Vec<_>>()
                .join(" / ")
        },
    )
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or_default();
    line.replace('|', "\\|").chars().take(300).collect()
}
