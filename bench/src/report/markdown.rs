//! The report as markdown: the run's facts, the headline, then one table per section.

use std::fmt::Write as _;

use super::{cpu16, f, p50, p99, rps, rss, ttfb, x, Ratio, Report, ScalePair, HEADLINE};
use crate::airouter::SyncProbe;

/// The whole report as markdown.
pub fn markdown(r: &Report) -> String {
    let mut o = String::new();
    facts(&mut o, r);
    headline(&mut o, r);
    systems(&mut o, r);
    overhead(&mut o, r);
    ratios(&mut o, r);
    scale(&mut o, r);
    provisioning(&mut o, r);
    targets(&mut o, r);
    errors(&mut o, r);
    o
}

/// The title and what the run was: commit, machine, versions, plan.
fn facts(o: &mut String, r: &Report) {
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
            "- plan: warm-up {} s, {} s per phase, open loop at {} req/s (≤ {} in flight); Envoy workers {}, fake upstream workers {}; systems against the `{}` upstream; requests of {} bytes ({} KB of earlier turns); run took {:.0} s",
            p.warmup_s, p.phase_s, p.rate, p.max_in_flight, m.envoy_workers, m.upstream_workers, m.systems_headers, m.request_bytes, m.prompt_kb, m.duration_s
        );
    }
    o.push('\n');
}

/// One row per system: latencies, throughput, CPU and memory.
fn systems(o: &mut String, r: &Report) {
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
}

/// ai-router's overhead as its answers state it (`x-ai-router-overhead-ms`), beside the latency
/// it adds over the direct run in the same phase (docs/benchmarks.md says what each includes).
fn overhead(o: &mut String, r: &Report) {
    let Some(ai) = r
        .systems
        .iter()
        .find(|s| s.name == "ai-router" && s.error.is_none())
    else {
        return;
    };
    let direct = r
        .systems
        .iter()
        .find(|s| s.name == "direct" && s.error.is_none());
    let _ = writeln!(
        o,
        "## ai-router's own overhead beside its added latency
"
    );
    let _ = writeln!(o, "Overhead: `x-ai-router-overhead-ms` of each successful answer (the front stage's time less the providers' time; a stream's to its first byte). Added: the phase's p50 (a stream's TTFB p50) less the direct run's in the same phase. ms.\n");
    let _ = writeln!(
        o,
        "| phase | overhead p50 | overhead p99 | added p50 | added − overhead p50 |"
    );
    let _ = writeln!(o, "|---|---:|---:|---:|---:|");
    for phase in ["c1", "c16", "c64", "open", "stream-c1"] {
        let Some(load) = ai.phase(phase).map(|p| &p.load) else {
            continue;
        };
        let Some(over) = &load.overhead_ms else {
            continue;
        };
        // A stream's figure is its time to the first byte, as the overhead's is.
        let at = |s: &super::SystemResult| {
            if phase == "stream-c1" {
                ttfb(s)
            } else {
                p50(s, phase)
            }
        };
        let added = direct.and_then(|d| Some(at(ai)? - at(d)?));
        let _ = writeln!(
            o,
            "| {phase} | {} | {} | {} | {} |",
            f(Some(over.p50), 3),
            f(Some(over.p99), 3),
            f(added, 3),
            f(added.map(|a| a - over.p50), 3)
        );
    }
    o.push('\n');
}

/// Every pair's ratios.
fn ratios(o: &mut String, r: &Report) {
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
}

/// The ai-router scale table, then the probes' errors.
fn scale(o: &mut String, r: &Report) {
    if !r.scale.is_empty() {
        let _ = writeln!(o, "## ai-router at scale\n");
        let _ = writeln!(o, "VK = virtual keys in the key store; PK = provider keys (serving the benchmarked model on `fake-a`/`fake-b`, or on 8 other providers serving another model), plus one probe key on its own provider; headers: the fake upstream's rate-limit headers. c16 closed loop. Revoke/blacklist: ms until the change had reached every Envoy worker (the start of a run of polls in a row on fresh connections that all saw it); bytes: what Envoy received on the sync stream for that change. Sync B/s: sync stream bytes per second during the c16 load. Idle CPU: CPU s per s with no traffic. Rows marked *(paired)* were measured side by side: both instances started and warmed, then their c16 phases alternated in rounds (next table); their c16 figures are over all their rounds, the rest per instance afterwards; every other row is one c16 phase of its own instance.\n");
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
            let label = if s.paired_with.is_some() {
                format!("{} *(paired)*", s.label)
            } else {
                s.label.clone()
            };
            let rv = s.probes.revoke.as_ref();
            let bl = s.probes.blacklist.as_ref();
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
                label,
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
    for p in &r.scale_pairs {
        pair(o, p);
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{:.0}%", v * 100.0))
}

/// Two rows measured side by side: each round, then the run's ratios.
fn pair(o: &mut String, p: &ScalePair) {
    let _ = writeln!(o, "### Side by side: {} against {}\n", p.large, p.small);
    let _ = writeln!(o, "Both instances up and warmed, then {} rounds of c16, {:.1} s for each row per round, the order alternating (first: the row that ran first in the round). Ratio: large ÷ small throughput of the round.\n", p.rounds.len(), p.round_s);
    let _ = writeln!(
        o,
        "| round | first | small rps | large rps | ratio | small p99 | large p99 |"
    );
    let _ = writeln!(o, "|---:|---|---:|---:|---:|---:|---:|");
    for (i, q) in p.rounds.iter().enumerate() {
        let _ = writeln!(
            o,
            "| {} | {} | {:.0} | {:.0} | {} | {:.2} | {:.2} |",
            i + 1,
            q.first,
            q.small_rps,
            q.large_rps,
            pct(q.rps_ratio),
            q.small_p99_ms,
            q.large_p99_ms
        );
    }
    let _ = writeln!(
        o,
        "\nOver all rounds: throughput ratio {} (rounds: lowest {}, median {}); p99 ratio {}; CPU per 1,000 requests ratio {}.\n",
        pct(p.rps_ratio),
        pct(p.round_rps_ratio_min),
        pct(p.round_rps_ratio_median),
        x(p.p99_ratio),
        x(p.cpu_per_1k_ratio)
    );
}

fn provisioning(o: &mut String, r: &Report) {
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
}

fn targets(o: &mut String, r: &Report) {
    if !r.targets.is_empty() {
        let _ = writeln!(o, "## Targets (issue 8)\n");
        let _ = writeln!(o, "| target | this run | met |");
        let _ = writeln!(o, "|---|---|---|");
        for t in &r.targets {
            let _ = writeln!(o, "| {} | {} | {} |", t.target, t.figure, t.met);
        }
        o.push('\n');
    }
}

fn errors(o: &mut String, r: &Report) {
    if !r.errors.is_empty() {
        let _ = writeln!(o, "## Errors\n");
        for e in &r.errors {
            let _ = writeln!(o, "- {}", first_line(e));
        }
        o.push('\n');
    }
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
