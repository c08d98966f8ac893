//! The ai-router scale table: which rows a `--scale` runs, the virtual keys each needs
//! (provisioned once per count), and one row measured: c16 throughput, memory, sync traffic,
//! idle CPU and the sync probes; or the two rows a ratio compares, measured side by side.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::airouter::{provision, Instance, KeyBundle, Shape};
use crate::load::{LoadResult, Target};
use crate::log;
use crate::procs::ProcSet;
use crate::report::{PairRound, Probes, ScalePair, ScaleResult};
use crate::run::{check, run_phase, warm_up, Phase, PhaseReport, Plan, Rounds};
use crate::upstream::{BenchEnvoy, Headers};
use crate::{FEW_PROVIDER_KEYS, FEW_VIRTUAL_KEYS};

/// The rows of `--scale`; the rows whose headers change on every answer carry `changing`
/// (the `changing` or the `countdown` variant).
pub fn scale_shapes(
    scale: &str,
    many_vk: usize,
    many_pk: usize,
    changing: Headers,
) -> Result<Vec<Shape>> {
    let shape = |vk, serving, other, headers| Shape {
        virtual_keys: vk,
        serving_keys: serving,
        other_keys: other,
        headers,
    };
    let few = FEW_PROVIDER_KEYS;
    Ok(match scale {
        "none" => vec![],
        "targets" => vec![
            shape(FEW_VIRTUAL_KEYS, few, 0, changing),
            shape(many_vk, many_pk, 0, changing),
            shape(many_vk, few, many_pk.saturating_sub(few), changing),
        ],
        // The two rows the many-keys target compares (lane health with every key serving).
        "keys" => vec![
            shape(FEW_VIRTUAL_KEYS, few, 0, changing),
            shape(many_vk, many_pk, 0, changing),
        ],
        "full" => {
            let mut v = Vec::new();
            for headers in [Headers::Static, changing] {
                for vk in [FEW_VIRTUAL_KEYS, many_vk] {
                    for (serving, other) in
                        [(few, 0), (many_pk, 0), (few, many_pk.saturating_sub(few))]
                    {
                        v.push(shape(vk, serving, other, headers));
                    }
                }
            }
            v.insert(1, shape(FEW_VIRTUAL_KEYS, few, 0, Headers::Constant));
            v
        }
        other => bail!("unknown --scale {other:?} (full, targets, keys, none)"),
    })
}

/// The virtual keys of `count`, provisioned on first use and kept for the rows after.
pub async fn bundle(
    bundles: &mut BTreeMap<usize, KeyBundle>,
    count: usize,
    upstream_port: u16,
) -> Result<KeyBundle> {
    if let Some(b) = bundles.get(&count) {
        return Ok(b.clone());
    }
    log(format!("provisioning {count} virtual keys"));
    let b = provision(count, upstream_port).await?;
    log(format!("{count} virtual keys in {:.1} s", b.provision_s));
    bundles.insert(count, b.clone());
    Ok(b)
}

/// The revoke and blacklist probes, polling this Envoy and a second one started for them on
/// the same control plane; a failed probe is recorded, not fatal.
pub async fn probes(instance: &mut Instance, upstream: &BenchEnvoy, streak: usize) -> Probes {
    let mut p = Probes::default();
    if let Err(e) = instance.start_second_envoy().await {
        p.errors.push(format!("second Envoy: {e:#}"));
    }
    match instance.probe_revoke(streak).await {
        Ok(r) => p.revoke = Some(r),
        Err(e) => p.errors.push(format!("revoke: {e:#}")),
    }
    match instance.probe_blacklist(upstream, streak).await {
        Ok(r) => p.blacklist = Some(r),
        Err(e) => p.errors.push(format!("blacklist: {e:#}")),
    }
    p
}

/// A row's ai-router started and its answer checked.
struct Started {
    shape: Shape,
    instance: Instance,
    start_s: f64,
    target: Target,
    procs: ProcSet,
}

/// Starts a row's control plane + Envoy and checks that it answers the fake upstream's
/// completion.
async fn start_row(shape: Shape, bundle: &KeyBundle, upstream: &BenchEnvoy) -> Result<Started> {
    let t0 = Instant::now();
    let name = format!(
        "bench-scale-{}vk-{}pk-{}o-{}",
        shape.virtual_keys,
        shape.serving_keys,
        shape.other_keys,
        shape.headers.prefix()
    );
    let instance = Instance::start(&name, shape, bundle, upstream, &[], false).await?;
    let start_s = t0.elapsed().as_secs_f64();
    let target = instance.target()?;
    let checked = check(&target).await?;
    if !checked.ok {
        bail!("ai-router did not answer the fake upstream's completion: {checked:?}");
    }
    let procs = instance.procs();
    Ok(Started {
        shape,
        instance,
        start_s,
        target,
        procs,
    })
}

fn log_c16(label: &str, c16: &PhaseReport) {
    log(format!(
        "  {label}c16: {} ok, {} failed, {:.0} rps, p99 {:.2} ms",
        c16.load.ok,
        c16.load.failed + c16.load.invalid,
        c16.load.throughput_rps,
        c16.load.latency_ms.p99
    ));
}

/// A row after its c16 load: idle CPU, memory, then the probes (the instance is stopped when
/// this returns).
async fn finish_row(
    row: Started,
    c16: PhaseReport,
    sync_rx_bytes_per_s: f64,
    upstream: &BenchEnvoy,
    streak: usize,
) -> ScaleResult {
    let Started {
        shape,
        mut instance,
        start_s,
        procs,
        ..
    } = row;
    // Idle: let the load's last reports settle, then two quiet seconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = Duration::from_secs(2);
    let i0 = procs.read();
    tokio::time::sleep(idle).await;
    let i1 = procs.read();
    let idle_cpu = i1
        .cpu_s
        .iter()
        .map(|(k, v)| {
            let before = i0.cpu_s.get(k).copied().unwrap_or(0.0);
            (k.clone(), (v - before) / idle.as_secs_f64())
        })
        .collect();
    // Memory before the probes start a second Envoy.
    let reading = procs.read();
    let probes = probes(&mut instance, upstream, streak).await;
    ScaleResult {
        label: shape.label(),
        shape: Some(shape),
        error: None,
        sync_rx_bytes_per_s_under_load: Some(sync_rx_bytes_per_s),
        c16: Some(c16),
        peak_rss_total_mb: reading.peak_rss_total(),
        peak_rss_mb: reading.peak_rss_mb,
        idle_cpu_s_per_s: idle_cpu,
        probes,
        start_s,
        create_key_ms: Some(instance.create_key_ms),
        paired_with: None,
    }
}

/// One row of the scale table: c16 throughput, memory, sync traffic, idle CPU, the probes.
pub async fn run_scale(
    shape: Shape,
    bundle: &KeyBundle,
    plan: &Plan,
    upstream: &BenchEnvoy,
    up_procs: &ProcSet,
    streak: usize,
) -> Result<ScaleResult> {
    let row = start_row(shape, bundle, upstream).await?;
    warm_up(&row.target, plan).await?;
    let rx0 = row.instance.sync_rx_bytes().await?;
    let c16 = run_phase(&row.target, &row.procs, up_procs, plan, Phase::Closed(16)).await?;
    let rx1 = row.instance.sync_rx_bytes().await?;
    log_c16("", &c16);
    let sync = rx1.saturating_sub(rx0) as f64 / c16.load.elapsed_s.max(1e-9);
    Ok(finish_row(row, c16, sync, upstream, streak).await)
}

/// The two rows a ratio compares, measured side by side: both instances started and warmed,
/// then their c16 phases alternated in `rounds` rounds (the small row first in even rounds, the
/// large first in odd ones), each round `plan.phase_s / rounds` long, so that what the machine
/// does meanwhile falls on both alike. Each row's c16 is its rounds' aggregate; idle CPU,
/// memory and the probes follow, one row after the other, as for a row measured alone.
pub async fn run_scale_pair(
    small: (Shape, &KeyBundle),
    large: (Shape, &KeyBundle),
    plan: &Plan,
    upstream: &BenchEnvoy,
    up_procs: &ProcSet,
    streak: usize,
    rounds: usize,
) -> Result<(ScaleResult, ScaleResult, ScalePair)> {
    let rounds = rounds.max(1);
    let rows = [
        start_row(small.0, small.1, upstream).await?,
        start_row(large.0, large.1, upstream).await?,
    ];
    for row in &rows {
        warm_up(&row.target, plan).await?;
    }
    let round = Duration::from_secs_f64(plan.phase_s / rounds as f64);
    let mut measured = [Rounds::default(), Rounds::default()];
    let mut rx = [0u64; 2];
    let mut pair_rounds = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut figures: [Option<LoadResult>; 2] = [None, None];
        for at in order {
            let row = &rows[at];
            let rx0 = row.instance.sync_rx_bytes().await?;
            let r = measured[at]
                .run(&row.target, &row.procs, up_procs, 16, round)
                .await?;
            let rx1 = row.instance.sync_rx_bytes().await?;
            rx[at] += rx1.saturating_sub(rx0);
            figures[at] = Some(r);
        }
        let [Some(s), Some(l)] = figures else {
            bail!("round {i}: a row was not measured");
        };
        log(format!(
            "  round {}: {} first; {:.0} / {:.0} rps = {:.0}%; p99 {:.2} / {:.2} ms",
            i + 1,
            if order[0] == 0 { "small" } else { "large" },
            s.throughput_rps,
            l.throughput_rps,
            l.throughput_rps / s.throughput_rps.max(1e-9) * 100.0,
            s.latency_ms.p99,
            l.latency_ms.p99
        ));
        pair_rounds.push(PairRound {
            first: if order[0] == 0 { "small" } else { "large" }.to_string(),
            small_rps: s.throughput_rps,
            large_rps: l.throughput_rps,
            rps_ratio: (s.throughput_rps > 0.0).then(|| l.throughput_rps / s.throughput_rps),
            small_p99_ms: s.latency_ms.p99,
            large_p99_ms: l.latency_ms.p99,
        });
    }
    let [small_rounds, large_rounds] = measured;
    let sync = [
        rx[0] as f64 / small_rounds.elapsed_s().max(1e-9),
        rx[1] as f64 / large_rounds.elapsed_s().max(1e-9),
    ];
    let c16 = [small_rounds.report(16), large_rounds.report(16)];
    let pair = ScalePair::new(
        small.0.label(),
        large.0.label(),
        round.as_secs_f64(),
        pair_rounds,
        &c16[0],
        &c16[1],
    );
    let [c16_small, c16_large] = c16;
    log_c16("small, over the rounds: ", &c16_small);
    log_c16("large, over the rounds: ", &c16_large);
    let [small_row, large_row] = rows;
    let mut a = finish_row(small_row, c16_small, sync[0], upstream, streak).await;
    let mut b = finish_row(large_row, c16_large, sync[1], upstream, streak).await;
    a.paired_with = Some(b.label.clone());
    b.paired_with = Some(a.label.clone());
    Ok((a, b, pair))
}
