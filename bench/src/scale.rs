//! The ai-router scale table: which rows a `--scale` runs, the virtual keys each needs
//! (provisioned once per count), and one row measured: c16 throughput, memory, sync traffic,
//! idle CPU and the sync probes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::airouter::{provision, Instance, KeyBundle, Shape};
use crate::log;
use crate::procs::ProcSet;
use crate::report::{Probes, ScaleResult};
use crate::run::{check, run_phase, warm_up, Phase, Plan};
use crate::upstream::{BenchEnvoy, Headers};
use crate::{FEW_PROVIDER_KEYS, FEW_VIRTUAL_KEYS};

pub fn scale_shapes(scale: &str, many_vk: usize, many_pk: usize) -> Result<Vec<Shape>> {
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
            shape(FEW_VIRTUAL_KEYS, few, 0, Headers::Changing),
            shape(many_vk, many_pk, 0, Headers::Changing),
            shape(many_vk, few, many_pk.saturating_sub(few), Headers::Changing),
        ],
        // The two rows the many-keys target compares (lane health with every key serving).
        "keys" => vec![
            shape(FEW_VIRTUAL_KEYS, few, 0, Headers::Changing),
            shape(many_vk, many_pk, 0, Headers::Changing),
        ],
        "full" => {
            let mut v = Vec::new();
            for headers in [Headers::Static, Headers::Changing] {
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

/// One row of the scale table: c16 throughput, memory, sync traffic, idle CPU, the probes.
pub async fn run_scale(
    shape: Shape,
    bundle: &KeyBundle,
    plan: &Plan,
    upstream: &BenchEnvoy,
    up_procs: &ProcSet,
    streak: usize,
) -> Result<ScaleResult> {
    let t0 = Instant::now();
    let name = format!(
        "bench-scale-{}vk-{}pk-{}o-{}",
        shape.virtual_keys,
        shape.serving_keys,
        shape.other_keys,
        shape.headers.prefix()
    );
    let mut instance = Instance::start(&name, shape, bundle, upstream, &[]).await?;
    let start_s = t0.elapsed().as_secs_f64();
    let target = instance.target()?;
    let checked = check(&target).await?;
    if !checked.ok {
        bail!("ai-router did not answer the fake upstream's completion: {checked:?}");
    }
    let procs = instance.procs();
    warm_up(&target, plan).await?;
    let rx0 = instance.sync_rx_bytes().await?;
    let c16 = run_phase(&target, &procs, up_procs, plan, Phase::Closed(16)).await?;
    let rx1 = instance.sync_rx_bytes().await?;
    log(format!(
        "  c16: {} ok, {} failed, {:.0} rps, p99 {:.2} ms",
        c16.load.ok,
        c16.load.failed + c16.load.invalid,
        c16.load.throughput_rps,
        c16.load.latency_ms.p99
    ));
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
    Ok(ScaleResult {
        label: shape.label(),
        shape: Some(shape),
        error: None,
        sync_rx_bytes_per_s_under_load: Some(
            rx1.saturating_sub(rx0) as f64 / c16.load.elapsed_s.max(1e-9),
        ),
        c16: Some(c16),
        peak_rss_total_mb: reading.peak_rss_total(),
        peak_rss_mb: reading.peak_rss_mb,
        idle_cpu_s_per_s: idle_cpu,
        probes,
        start_s,
        create_key_ms: Some(instance.create_key_ms),
    })
}
