//! `ai-router-bench`: the benchmark of issue 8. Run it through `scripts/bench.sh`, which
//! builds and installs what it needs; see `docs/benchmarks.md`.
//!
//! One run starts a fake upstream (an Envoy `direct_response`), then, one after the other with
//! the same requests and this load generator: the upstream directly (the floor), a plain Envoy
//! hop, ai-router (control plane + Envoy + the wasm filter), LiteLLM's proxy, Portkey's
//! gateway and, from a binary the user built, agentgateway. Then the ai-router scale table. It writes `results.json` and `results.md` in
//! `--out` and prints the markdown. Every port is ephemeral and on loopback; no secret is
//! printed.

mod airouter;
mod load;
mod peers;
mod procs;
mod report;
mod run;
mod upstream;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use ai_router_e2e::{ai_router_bin, envoy_bin, wasm_path, workspace_root, TestDir};
use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::airouter::{provision, Instance, KeyBundle, Shape};
use crate::load::{chat_body, Target};
use crate::procs::ProcSet;
use crate::report::{Added, Machine, Meta, Probes, Report, ScaleResult, SystemResult};
use crate::run::{check, run_phase, warm_up, Phase, Plan, ALL_PHASES};
use crate::upstream::{
    fake_upstream_yaml, internal_hop_envoy_yaml, plain_envoy_yaml, BenchEnvoy, Headers,
};

const ALL_SYSTEMS: [&str; 7] = [
    "direct",
    "envoy",
    "envoy-internal",
    "ai-router",
    "litellm",
    "portkey",
    "agentgateway",
];
const SMOKE_SYSTEMS: [&str; 3] = ["direct", "envoy", "ai-router"];
/// Envoy workers of every Envoy under test (the harness runs ai-router's with 2).
const ENVOY_WORKERS: u32 = 2;
/// Virtual keys of the systems comparison and of the small scale rows.
const FEW_VIRTUAL_KEYS: usize = 10;
/// Provider keys of the systems comparison (2 providers x 4).
const FEW_PROVIDER_KEYS: usize = 8;

#[derive(Debug, Parser)]
#[command(
    name = "ai-router-bench",
    about = "The ai-router benchmark (docs/benchmarks.md)"
)]
struct Args {
    /// A few seconds per system, only direct, plain Envoy and ai-router, and the sync probes on
    /// the ai-router run instead of the scale table: proves the harness works.
    #[arg(long)]
    smoke: bool,
    /// Systems to run, comma-separated: direct, envoy, envoy-internal, ai-router, litellm,
    /// portkey, agentgateway.
    #[arg(long, value_delimiter = ',')]
    systems: Option<Vec<String>>,
    /// Where to write results.json, results.md (default target/bench/<unix time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The scale table: full (every row), targets (the rows the targets need), keys (the small
    /// pool and 10,000 VK with 1,000 PK all serving, changing headers), none.
    #[arg(long)]
    scale: Option<String>,
    /// Seconds per phase (default 10, smoke 0.5).
    #[arg(long)]
    duration: Option<f64>,
    /// Seconds of warm-up per system (default 2, smoke 0.3).
    #[arg(long)]
    warmup: Option<f64>,
    /// Requests per second of the open-loop phase (default 200, smoke 50).
    #[arg(long)]
    rate: Option<f64>,
    /// Requests in flight at most in the open loop.
    #[arg(long, default_value_t = 512)]
    max_in_flight: usize,
    /// The fake upstream's rate-limit headers in the systems comparison: static, constant,
    /// changing.
    #[arg(long, default_value = "static")]
    headers: String,
    /// Workers of the fake upstream's Envoy.
    #[arg(long, default_value_t = 1)]
    upstream_workers: u32,
    /// The `litellm` executable (in its own virtualenv).
    #[arg(long)]
    litellm: Option<PathBuf>,
    /// Portkey's `build/start-server.js`.
    #[arg(long)]
    portkey: Option<PathBuf>,
    /// `node` for Portkey (default: on PATH).
    #[arg(long)]
    node: Option<PathBuf>,
    /// An agentgateway binary built by the user (docs/benchmarks.md says how).
    #[arg(long)]
    agentgateway: Option<PathBuf>,
    /// Polls in a row (each on a new connection) that must see a change before it counts as
    /// having reached every Envoy worker.
    #[arg(long, default_value_t = 20)]
    streak: usize,
    /// The large virtual-key count of the scale table.
    #[arg(long, default_value_t = 10_000)]
    many_virtual_keys: usize,
    /// The large provider-key count of the scale table.
    #[arg(long, default_value_t = 1_000)]
    many_provider_keys: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ai-router-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ai-router-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn log(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// Runs everything; `Ok(false)` when a system or scenario could not be measured.
async fn bench(args: Args) -> Result<bool> {
    let started = Instant::now();
    let plan = Plan {
        warmup_s: args.warmup.unwrap_or(if args.smoke { 0.3 } else { 2.0 }),
        phase_s: args.duration.unwrap_or(if args.smoke { 0.5 } else { 10.0 }),
        rate: args.rate.unwrap_or(if args.smoke { 50.0 } else { 200.0 }),
        max_in_flight: args.max_in_flight,
    };
    let systems: Vec<String> = match &args.systems {
        Some(s) => s.iter().map(|s| s.trim().to_string()).collect(),
        None if args.smoke => SMOKE_SYSTEMS.iter().map(|s| s.to_string()).collect(),
        // agentgateway runs only from a binary the user built (`--agentgateway`).
        None => ALL_SYSTEMS
            .iter()
            .filter(|s| **s != "agentgateway" || args.agentgateway.is_some())
            .map(|s| s.to_string())
            .collect(),
    };
    for s in &systems {
        if !ALL_SYSTEMS.contains(&s.as_str()) {
            bail!("unknown system {s:?} (one of {})", ALL_SYSTEMS.join(", "));
        }
    }
    let scale = args
        .scale
        .clone()
        .unwrap_or_else(|| if args.smoke { "none" } else { "full" }.to_string());
    let scale_shapes = scale_shapes(&scale, args.many_virtual_keys, args.many_provider_keys)?;
    let headers = Headers::parse(&args.headers)?;
    let out = match &args.out {
        Some(o) => o.clone(),
        None => workspace_root().join("target/bench").join(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default()
                .to_string(),
        ),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    // The systems run in their own directories: every path given is made absolute.
    let args = Args {
        litellm: args.litellm.as_deref().map(absolute).transpose()?,
        portkey: args.portkey.as_deref().map(absolute).transpose()?,
        node: args.node.as_deref().map(absolute).transpose()?,
        agentgateway: args.agentgateway.as_deref().map(absolute).transpose()?,
        ..args
    };
    let envoy = envoy_bin()?;
    let ai_router = ai_router_bin()?;
    wasm_path()?;
    let mut meta = meta(&args, &envoy, &ai_router);
    meta.plan = Some(plan.clone());
    meta.systems_headers = headers.prefix().to_string();
    let mut report = Report::default();

    let dir = TestDir::new("bench")?;
    log(format!("logs in {}", dir.path().display()));
    let upstream = BenchEnvoy::start(
        &dir,
        &envoy,
        "fake-upstream",
        &fake_upstream_yaml(),
        args.upstream_workers,
    )
    .await
    .context("starting the fake upstream")?;
    let mut up_procs = ProcSet::new();
    up_procs.add("fake-upstream", upstream.process.pid());
    let mut bundles: BTreeMap<usize, KeyBundle> = BTreeMap::new();

    for name in &systems {
        log(format!("system {name}"));
        let result = run_system(
            name,
            &args,
            &plan,
            headers,
            &dir,
            &upstream,
            &up_procs,
            &mut bundles,
        )
        .await;
        let result = match result {
            Ok((r, row)) => {
                report.scale.extend(row);
                r
            }
            Err(e) => {
                let msg = format!("{name}: {e:#}");
                log(format!("FAILED {msg}"));
                report.errors.push(msg.clone());
                SystemResult {
                    name: name.clone(),
                    error: Some(msg),
                    ..Default::default()
                }
            }
        };
        report.systems.push(result);
    }
    // Added latency: the floor is the direct run.
    let floor = report
        .systems
        .iter()
        .find(|s| s.name == "direct" && s.error.is_none())
        .and_then(|s| s.phase("c1"))
        .map(|p| (p.load.latency_ms.p50, p.load.latency_ms.p99));
    for s in &mut report.systems {
        if let (Some((f50, f99)), Some(c1)) = (floor, s.phases.get("c1")) {
            s.added_latency_c1 = Some(Added {
                p50_ms: c1.load.latency_ms.p50 - f50,
                p99_ms: c1.load.latency_ms.p99 - f99,
            });
        }
    }

    for shape in scale_shapes {
        log(format!("scale {}", shape.label()));
        let bundle = match bundle(&mut bundles, shape.virtual_keys, upstream.port).await {
            Ok(b) => b,
            Err(e) => {
                let msg = format!("provisioning {} virtual keys: {e:#}", shape.virtual_keys);
                report.errors.push(msg.clone());
                report.scale.push(ScaleResult {
                    label: shape.label(),
                    shape: Some(shape),
                    error: Some(msg),
                    ..Default::default()
                });
                continue;
            }
        };
        let row = match run_scale(shape, &bundle, &plan, &upstream, &up_procs, args.streak).await {
            Ok(r) => r,
            Err(e) => {
                let msg = format!("{}: {e:#}", shape.label());
                log(format!("FAILED {msg}"));
                report.errors.push(msg.clone());
                ScaleResult {
                    label: shape.label(),
                    shape: Some(shape),
                    error: Some(msg),
                    ..Default::default()
                }
            }
        };
        report.scale.push(row);
    }

    report.provisioning = bundles.values().map(KeyBundle::provisioning).collect();
    report.ratios = report::ratios(&report.systems);
    report.targets = report::targets(
        &report.systems,
        &report.scale,
        args.many_virtual_keys,
        args.many_provider_keys,
    );
    meta.machine.loadavg_end = loadavg();
    meta.duration_s = started.elapsed().as_secs_f64();
    report.meta = meta;

    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(out.join("results.json"), json)?;
    let md = report::markdown(&report);
    std::fs::write(out.join("results.md"), &md)?;
    println!("{md}");
    log(format!(
        "wrote {} and {}",
        out.join("results.json").display(),
        out.join("results.md").display()
    ));
    Ok(report.errors.is_empty())
}

fn scale_shapes(scale: &str, many_vk: usize, many_pk: usize) -> Result<Vec<Shape>> {
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

async fn bundle(
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

fn direct_target(upstream_port: u16, headers: Headers) -> Result<Target> {
    let auth = vec![(
        "authorization".to_string(),
        "Bearer sk-bench-direct".to_string(),
    )];
    let mut stream_headers = auth.clone();
    stream_headers.push(("accept".to_string(), "text/event-stream".to_string()));
    Ok(Target {
        url: format!(
            "http://127.0.0.1:{upstream_port}/{}/v1/chat/completions",
            headers.prefix()
        )
        .parse()?,
        headers: auth,
        unary_body: chat_body(airouter::MODEL, false),
        stream_body: chat_body(airouter::MODEL, true),
        stream_headers,
    })
}

#[allow(clippy::too_many_arguments)]
async fn run_system(
    name: &str,
    args: &Args,
    plan: &Plan,
    headers: Headers,
    dir: &TestDir,
    upstream: &BenchEnvoy,
    up_procs: &ProcSet,
    bundles: &mut BTreeMap<usize, KeyBundle>,
) -> Result<(SystemResult, Option<ScaleResult>)> {
    let t0 = Instant::now();
    let result = match name {
        "direct" => {
            let target = direct_target(upstream.port, headers)?;
            measure_system(
                name,
                "the fake upstream itself (Envoy direct_response): the floor",
                &target,
                &ProcSet::new(),
                up_procs,
                plan,
                t0,
            )
            .await
        }
        "envoy" | "envoy-internal" => {
            let (bootstrap, what) = if name == "envoy" {
                (
                    plain_envoy_yaml(upstream.port),
                    "plain Envoy 1.40: one listener, one route, one static cluster (the cost of one hop)",
                )
            } else {
                (
                    internal_hop_envoy_yaml(upstream.port),
                    "Envoy 1.40, two passes and no filter: a listener routing to an internal listener whose router proxies to the upstream (ai-router's shape without its filter)",
                )
            };
            let envoy =
                BenchEnvoy::start(dir, &envoy_bin()?, name, &bootstrap, ENVOY_WORKERS).await?;
            let mut target = direct_target(envoy.port, headers)?;
            target.url = format!(
                "http://127.0.0.1:{}/{}/v1/chat/completions",
                envoy.port,
                headers.prefix()
            )
            .parse()?;
            let mut procs = ProcSet::new();
            procs.add("envoy", envoy.process.pid());
            measure_system(name, what, &target, &procs, up_procs, plan, t0).await
        }
        "ai-router" => {
            let shape = Shape {
                virtual_keys: FEW_VIRTUAL_KEYS,
                serving_keys: FEW_PROVIDER_KEYS,
                other_keys: 0,
                headers,
            };
            let bundle = bundle(bundles, shape.virtual_keys, upstream.port).await?;
            let mut instance = Instance::start("bench-ai-router", shape, &bundle, upstream).await?;
            let procs = instance.procs();
            let target = instance.target()?;
            let mut result = measure_system(
                name,
                "ai-router serve + Envoy rendered by ai-router render-envoy with the wasm filter; 2 providers x 4 keys, a virtual key with quotas, 10 virtual keys",
                &target,
                &procs,
                up_procs,
                plan,
                t0,
            )
            .await?;
            if args.smoke {
                let probes = probes(&mut instance, upstream, args.streak).await;
                result
                    .description
                    .push_str("; sync probes run on it (smoke)");
                let c16 = result.phase("c16").cloned();
                let row = ScaleResult {
                    label: shape.label(),
                    shape: Some(shape),
                    c16,
                    peak_rss_mb: result.peak_rss_mb.clone(),
                    peak_rss_total_mb: result.peak_rss_total_mb,
                    probes,
                    start_s: result.start_s,
                    create_key_ms: Some(instance.create_key_ms),
                    ..Default::default()
                };
                return Ok((result, Some(row)));
            }
            Ok(result)
        }
        "litellm" => {
            let Some(litellm) = &args.litellm else {
                bail!("no --litellm executable (scripts/bench.sh installs LiteLLM)");
            };
            let peer = peers::start_litellm(dir, litellm, upstream.port).await?;
            measure_peer(
                name,
                "LiteLLM proxy (litellm --config, 1 worker), 8 deployments of the model, master key",
                &peer,
                up_procs,
                plan,
                t0,
            )
            .await
        }
        "portkey" => {
            let Some(start_server) = &args.portkey else {
                bail!("no --portkey start-server.js (scripts/bench.sh installs Portkey's gateway)");
            };
            let node = args.node.clone().unwrap_or_else(peers::node_bin);
            let peer = peers::start_portkey(dir, &node, start_server, upstream.port).await?;
            measure_peer(
                name,
                "Portkey gateway (node build/start-server.js), loadbalance config over 8 keys in x-portkey-config",
                &peer,
                up_procs,
                plan,
                t0,
            )
            .await
        }
        "agentgateway" => {
            let Some(agentgateway) = &args.agentgateway else {
                bail!("no --agentgateway binary (build it by hand: docs/benchmarks.md)");
            };
            let peer = peers::start_agentgateway(
                dir,
                agentgateway,
                upstream.port,
                headers.prefix(),
                ENVOY_WORKERS,
            )
            .await?;
            measure_peer(
                name,
                &format!("agentgateway (agentgateway -f config.yaml, {ENVOY_WORKERS} worker threads, request logs off), API-key auth (strict, 10 keys), a weighted virtual model over 8 OpenAI deployments"),
                &peer,
                up_procs,
                plan,
                t0,
            )
            .await
        }
        other => bail!("unknown system {other}"),
    };
    result.map(|r| (r, None))
}

/// The answer check, the warm-up and every phase against one system, then its memory.
async fn measure_system(
    name: &str,
    description: &str,
    target: &Target,
    procs: &ProcSet,
    up_procs: &ProcSet,
    plan: &Plan,
    t0: Instant,
) -> Result<SystemResult> {
    let start_s = t0.elapsed().as_secs_f64();
    let checked = check(target).await?;
    if !checked.ok {
        bail!("{name} did not answer the fake upstream's completion: {checked:?}");
    }
    warm_up(target, plan).await?;
    let mut result = SystemResult {
        name: name.to_string(),
        description: description.to_string(),
        check: Some(checked),
        start_s,
        ..Default::default()
    };
    for phase in ALL_PHASES {
        let report = run_phase(target, procs, up_procs, plan, phase).await?;
        log(format!(
            "  {name} {}: {} ok, {} failed, {:.0} rps, p50 {:.3} ms, p99 {:.3} ms",
            phase.name(),
            report.load.ok,
            report.load.failed + report.load.invalid,
            report.load.throughput_rps,
            report.load.latency_ms.p50,
            report.load.latency_ms.p99
        ));
        result.phases.insert(phase.name(), report);
    }
    let reading = procs.read();
    result.peak_rss_total_mb = reading.peak_rss_total();
    result.peak_rss_mb = reading.peak_rss_mb;
    result.processes = reading.processes;
    Ok(result)
}

/// A peer's process tree measured like any system, then its children stopped (the peer's own
/// process is killed when it is dropped).
async fn measure_peer(
    name: &str,
    description: &str,
    peer: &peers::Peer,
    up_procs: &ProcSet,
    plan: &Plan,
    t0: Instant,
) -> Result<SystemResult> {
    let mut procs = ProcSet::new();
    procs.add(name, peer.process.pid());
    let result = measure_system(name, description, &peer.target, &procs, up_procs, plan, t0).await;
    procs.kill_descendants();
    result
}

/// The revoke and blacklist probes, polling this Envoy and a second one started for them on
/// the same control plane; a failed probe is recorded, not fatal.
async fn probes(instance: &mut Instance, upstream: &BenchEnvoy, streak: usize) -> Probes {
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
async fn run_scale(
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
    let mut instance = Instance::start(&name, shape, bundle, upstream).await?;
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

fn absolute(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path).with_context(|| format!("{} not found", path.display()))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The first line a command prints (stdout, else stderr), or "".
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

fn meta(args: &Args, envoy: &Path, ai_router: &Path) -> Meta {
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
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
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
        machine: Machine {
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
        },
        versions,
        envoy_workers: ENVOY_WORKERS,
        upstream_workers: args.upstream_workers,
        systems_headers: String::new(),
        plan: None,
    }
}
