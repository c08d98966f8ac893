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
mod meta;
mod onepass;
mod peers;
mod procs;
mod report;
mod run;
mod scale;
mod systems;
mod upstream;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use ai_router_e2e::{ai_router_bin, envoy_bin, wasm_path, workspace_root, TestDir};
use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::airouter::{KeyBundle, Shape};
use crate::procs::ProcSet;
use crate::report::{Added, Report, ScaleResult, SystemResult};
use crate::run::Plan;
use crate::scale::{bundle, run_scale, run_scale_pair, scale_shapes};
use crate::systems::{run_system, Bench};
use crate::upstream::{fake_upstream_yaml, BenchEnvoy, Headers};

const ALL_SYSTEMS: [&str; 8] = [
    "direct",
    "envoy",
    "envoy-internal",
    "ai-router",
    systems::ONE_PASS,
    "litellm",
    "portkey",
    "agentgateway",
];
const SMOKE_SYSTEMS: [&str; 4] = ["direct", "envoy", "ai-router", systems::ONE_PASS];
/// Systems run only when named: the floor of a proxy-wasm filter in both passes
/// (bench/wasm-floor), with no host call (`wasm-noop`) and doing the least ai-router's stages
/// do with a call's bytes (`wasm-floor`), and that work on a first attempt in one pass
/// (`one-pass-floor`: failed over by an internal redirect; `one-pass-retry`: by the router's
/// retry to the next priority of an aggregate cluster).
const FLOOR_SYSTEMS: [&str; 4] = [
    "wasm-noop",
    "wasm-floor",
    "one-pass-floor",
    "one-pass-retry",
];
/// Envoy workers of every Envoy under test (the harness runs ai-router's with 2).
pub(crate) const ENVOY_WORKERS: u32 = 2;
/// Virtual keys of the systems comparison and of the small scale rows.
pub(crate) const FEW_VIRTUAL_KEYS: usize = 10;
/// Provider keys of the systems comparison (2 providers x 4).
pub(crate) const FEW_PROVIDER_KEYS: usize = 8;

#[derive(Debug, Parser)]
#[command(
    name = "ai-router-bench",
    about = "The ai-router benchmark (docs/benchmarks.md)"
)]
pub(crate) struct Args {
    /// A few seconds per system, only direct, plain Envoy and ai-router, and the sync probes on
    /// the ai-router run instead of the scale table: proves the harness works.
    #[arg(long)]
    pub(crate) smoke: bool,
    /// Systems to run, comma-separated: direct, envoy, envoy-internal, ai-router, litellm,
    /// portkey, agentgateway; and ai-router@VARIANT[+VARIANT...], ai-router with its Envoy
    /// bootstrap changed (the ablation study: no-retry, no-attempt-count, no-request-id,
    /// no-timeouts, no-local-reply, static-upstream, no-overload, no-allocator-manager,
    /// no-http2-options, no-underscore-drop, no-buffer-limits, no-admin-route, all). A system
    /// may be named more than once (alternating runs).
    #[arg(long, value_delimiter = ',')]
    pub(crate) systems: Option<Vec<String>>,
    /// Where to write results.json, results.md (default `target/bench/<unix time>`).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// The scale table: full (every row), targets (the rows the targets need), keys (the small
    /// pool and 10,000 VK with 1,000 PK all serving, changing headers), none.
    #[arg(long)]
    pub(crate) scale: Option<String>,
    /// Only these phases of the systems comparison, comma-separated (c1, c16, c64, open,
    /// stream-c1; default all): the ablation study runs c1 and c16.
    #[arg(long, value_delimiter = ',')]
    pub(crate) phases: Option<Vec<String>>,
    /// Seconds per phase (default 10, smoke 0.5).
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Seconds of warm-up per system (default 2, smoke 0.3).
    #[arg(long)]
    pub(crate) warmup: Option<f64>,
    /// Requests per second of the open-loop phase (default 200, smoke 50).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Requests in flight at most in the open loop.
    #[arg(long, default_value_t = 512)]
    pub(crate) max_in_flight: usize,
    /// The fake upstream's rate-limit headers in the systems comparison: static, constant,
    /// changing, countdown.
    #[arg(long, default_value = "static")]
    pub(crate) headers: String,
    /// The rate-limit headers of the scale rows whose headers change: changing (values within
    /// a tenth of the limit, new on every answer) or countdown (each key's minute counted
    /// down by one request and the answer's tokens).
    #[arg(long, default_value = "changing")]
    pub(crate) scale_headers: String,
    /// Workers of the fake upstream's Envoy.
    #[arg(long, default_value_t = 1)]
    pub(crate) upstream_workers: u32,
    /// Request headers each pass of `wasm-floor` writes (one host call each): what a header
    /// write costs, against a run with the default 1.
    #[arg(long, default_value_t = 1)]
    pub(crate) floor_writes: usize,
    /// The `litellm` executable (in its own virtualenv).
    #[arg(long)]
    pub(crate) litellm: Option<PathBuf>,
    /// Portkey's `build/start-server.js`.
    #[arg(long)]
    pub(crate) portkey: Option<PathBuf>,
    /// `node` for Portkey (default: on PATH).
    #[arg(long)]
    pub(crate) node: Option<PathBuf>,
    /// An agentgateway binary built by the user (docs/benchmarks.md says how).
    #[arg(long)]
    pub(crate) agentgateway: Option<PathBuf>,
    /// Polls in a row (each on a new connection) that must see a change before it counts as
    /// having reached every Envoy worker.
    #[arg(long, default_value_t = 20)]
    pub(crate) streak: usize,
    /// The large virtual-key count of the scale table.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) many_virtual_keys: usize,
    /// The large provider-key count of the scale table.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) many_provider_keys: usize,
    /// Earlier turns of a conversation, about this many KB, before the last message of every
    /// request (code, as a coding agent sends it); 0: the last message alone.
    #[arg(long, default_value_t = 0)]
    pub(crate) prompt_kb: usize,
    /// Rounds of the two scale rows measured side by side (10 VK · 8 PK and the large pool,
    /// all serving, changing headers): their c16 phases alternate, each round the phase's
    /// duration divided by this.
    #[arg(long, default_value_t = 5)]
    pub(crate) scale_rounds: usize,
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

pub(crate) fn log(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// Runs everything; `Ok(false)` when a system or scenario could not be measured.
async fn bench(args: Args) -> Result<bool> {
    let started = Instant::now();
    let plan = plan_of(&args);
    let systems = systems_of(&args)?;
    if let Some(phases) = &args.phases {
        let known: Vec<String> = run::ALL_PHASES.iter().map(|p| p.name()).collect();
        if let Some(p) = phases.iter().find(|p| !known.contains(p)) {
            bail!("unknown phase {p:?} (one of {})", known.join(", "));
        }
    }
    let scale = args
        .scale
        .clone()
        .unwrap_or_else(|| if args.smoke { "none" } else { "full" }.to_string());
    let scale_headers = Headers::parse(&args.scale_headers)?;
    if !scale_headers.change() {
        bail!(
            "--scale-headers {:?}: the scale rows need headers that change (changing, countdown)",
            args.scale_headers
        );
    }
    let headers = Headers::parse(&args.headers)?;
    let counts_down = headers == Headers::Countdown || scale_headers == Headers::Countdown;
    if counts_down && args.upstream_workers > 1 {
        // Each worker of the fake upstream counts its own minute: a key's answers would
        // interleave several counts.
        bail!("the countdown headers need --upstream-workers 1");
    }
    let scale_shapes = scale_shapes(
        &scale,
        args.many_virtual_keys,
        args.many_provider_keys,
        scale_headers,
    )?;
    load::set_prompt_kb(args.prompt_kb);
    let out = out_dir(&args)?;
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
    let mut meta = meta::meta(&args, &envoy, &ai_router);
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
    let run = Bench {
        args: &args,
        plan: &plan,
        headers,
        dir: &dir,
        upstream: &upstream,
        up_procs: &up_procs,
    };
    run_systems(&systems, &run, &mut bundles, &mut report).await;
    add_latency_over_floor(&mut report.systems);
    run_scale_rows(scale_shapes, &run, &mut bundles, &mut report).await;

    report.provisioning = bundles.values().map(KeyBundle::provisioning).collect();
    report.ratios = report::ratios(&report.systems);
    report.targets = report::targets(
        &report.systems,
        &report.scale,
        &report.scale_pairs,
        args.many_virtual_keys,
        args.many_provider_keys,
    );
    meta.machine.loadavg_end = meta::loadavg();
    meta.duration_s = started.elapsed().as_secs_f64();
    report.meta = meta;
    write_report(&report, &out)?;
    Ok(report.errors.is_empty())
}

/// The load plan: the arguments', else the defaults (shorter for a smoke run).
fn plan_of(args: &Args) -> Plan {
    Plan {
        warmup_s: args.warmup.unwrap_or(if args.smoke { 0.3 } else { 2.0 }),
        phase_s: args.duration.unwrap_or(if args.smoke { 0.5 } else { 10.0 }),
        rate: args.rate.unwrap_or(if args.smoke { 50.0 } else { 200.0 }),
        max_in_flight: args.max_in_flight,
    }
}

/// The systems to run, checked against the known ones.
fn systems_of(args: &Args) -> Result<Vec<String>> {
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
        if let Some(spec) = s.strip_prefix(systems::AI_ROUTER_VARIANT) {
            airouter::variant::parse(spec)?;
            continue;
        }
        if !ALL_SYSTEMS.contains(&s.as_str()) && !FLOOR_SYSTEMS.contains(&s.as_str()) {
            bail!(
                "unknown system {s:?} (one of {}, {}, {}VARIANT)",
                ALL_SYSTEMS.join(", "),
                FLOOR_SYSTEMS.join(", "),
                systems::AI_ROUTER_VARIANT
            );
        }
    }
    Ok(systems)
}

/// `--out`, else `target/bench/<unix time>`; created.
fn out_dir(args: &Args) -> Result<PathBuf> {
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
    Ok(out)
}

/// Every system, one after the other; one that fails is recorded with its error.
async fn run_systems(
    systems: &[String],
    run: &Bench<'_>,
    bundles: &mut BTreeMap<usize, KeyBundle>,
    report: &mut Report,
) {
    for name in systems {
        log(format!("system {name}"));
        let result = match run_system(name, run, bundles).await {
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
}

/// Each system's added latency at c1: its own minus the direct run's (the floor).
fn add_latency_over_floor(systems: &mut [SystemResult]) {
    let floor = systems
        .iter()
        .find(|s| s.name == "direct" && s.error.is_none())
        .and_then(|s| s.phase("c1"))
        .map(|p| (p.load.latency_ms.p50, p.load.latency_ms.p99));
    for s in systems {
        if let (Some((f50, f99)), Some(c1)) = (floor, s.phases.get("c1")) {
            s.added_latency_c1 = Some(Added {
                p50_ms: c1.load.latency_ms.p50 - f50,
                p99_ms: c1.load.latency_ms.p99 - f99,
            });
        }
    }
}

/// The two rows of `shapes` the many-keys target compares, when both are there: the small
/// pool and the large one with every key serving, changing headers (their indices).
fn scale_pair(shapes: &[Shape], many_vk: usize, many_pk: usize) -> Option<(usize, usize)> {
    if (FEW_VIRTUAL_KEYS, FEW_PROVIDER_KEYS) == (many_vk, many_pk) {
        return None;
    }
    let at = |vk: usize, pk: usize| {
        shapes.iter().position(|s| {
            (s.virtual_keys, s.serving_keys, s.other_keys) == (vk, pk, 0) && s.headers.change()
        })
    };
    Some((
        at(FEW_VIRTUAL_KEYS, FEW_PROVIDER_KEYS)?,
        at(many_vk, many_pk)?,
    ))
}

/// Every row of the scale table, in order; the two rows of [`scale_pair`] measured side by side
/// when the first of them comes up. One that fails is recorded with its error.
async fn run_scale_rows(
    shapes: Vec<Shape>,
    run: &Bench<'_>,
    bundles: &mut BTreeMap<usize, KeyBundle>,
    report: &mut Report,
) {
    let pair = scale_pair(
        &shapes,
        run.args.many_virtual_keys,
        run.args.many_provider_keys,
    );
    let mut rows: Vec<Option<ScaleResult>> = vec![None; shapes.len()];
    for (i, shape) in shapes.iter().copied().enumerate() {
        if rows.get(i).is_some_and(Option::is_some) {
            continue; // measured with its pair
        }
        match pair {
            Some((s, l)) if i == s || i == l => {
                let (small, large) = (shapes[s], shapes[l]);
                log(format!(
                    "scale {} and {}, side by side",
                    small.label(),
                    large.label()
                ));
                let (a, b) = run_pair(small, large, run, bundles, report).await;
                rows[s] = Some(a);
                rows[l] = Some(b);
            }
            _ => rows[i] = Some(run_row(shape, run, bundles, report).await),
        }
    }
    report.scale.extend(rows.into_iter().flatten());
}

/// A row that failed, with its error recorded.
fn failed_row(shape: Shape, msg: String, report: &mut Report) -> ScaleResult {
    log(format!("FAILED {msg}"));
    report.errors.push(msg.clone());
    ScaleResult {
        label: shape.label(),
        shape: Some(shape),
        error: Some(msg),
        ..Default::default()
    }
}

/// One row measured alone.
async fn run_row(
    shape: Shape,
    run: &Bench<'_>,
    bundles: &mut BTreeMap<usize, KeyBundle>,
    report: &mut Report,
) -> ScaleResult {
    log(format!("scale {}", shape.label()));
    let bundle = match bundle(bundles, shape.virtual_keys, run.upstream.port).await {
        Ok(b) => b,
        Err(e) => {
            let msg = format!("provisioning {} virtual keys: {e:#}", shape.virtual_keys);
            return failed_row(shape, msg, report);
        }
    };
    match run_scale(
        shape,
        &bundle,
        run.plan,
        run.upstream,
        run.up_procs,
        run.args.streak,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => failed_row(shape, format!("{}: {e:#}", shape.label()), report),
    }
}

/// The small and the large row measured side by side; on a failure both rows carry it.
async fn run_pair(
    small: Shape,
    large: Shape,
    run: &Bench<'_>,
    bundles: &mut BTreeMap<usize, KeyBundle>,
    report: &mut Report,
) -> (ScaleResult, ScaleResult) {
    let both_failed = |msg: String, report: &mut Report| {
        (
            failed_row(small, msg.clone(), report),
            failed_row(large, msg, report),
        )
    };
    let mut kb = Vec::with_capacity(2);
    for shape in [small, large] {
        match bundle(bundles, shape.virtual_keys, run.upstream.port).await {
            Ok(b) => kb.push(b),
            Err(e) => {
                let msg = format!("provisioning {} virtual keys: {e:#}", shape.virtual_keys);
                return both_failed(msg, report);
            }
        }
    }
    let (Some(small_keys), Some(large_keys)) = (kb.first(), kb.get(1)) else {
        return both_failed("provisioning: no key bundle".into(), report);
    };
    match run_scale_pair(
        (small, small_keys),
        (large, large_keys),
        run.plan,
        run.upstream,
        run.up_procs,
        run.args.streak,
        run.args.scale_rounds,
    )
    .await
    {
        Ok((a, b, pair)) => {
            report.scale_pairs.push(pair);
            (a, b)
        }
        Err(e) => both_failed(
            format!(
                "{} and {} side by side: {e:#}",
                small.label(),
                large.label()
            ),
            report,
        ),
    }
}

/// `results.json` and `results.md` in `out`; the markdown printed too.
fn write_report(report: &Report, out: &Path) -> Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(out.join("results.json"), json)?;
    let md = report::markdown(report);
    std::fs::write(out.join("results.md"), &md)?;
    println!("{md}");
    log(format!(
        "wrote {} and {}",
        out.join("results.json").display(),
        out.join("results.md").display()
    ));
    Ok(())
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path).with_context(|| format!("{} not found", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_and_the_large_all_serving_rows_are_paired_where_both_are_run() {
        for (scale, paired) in [
            ("keys", true),
            ("targets", true),
            ("full", true),
            ("none", false),
        ] {
            let shapes = scale_shapes(scale, 10_000, 1_000, Headers::Changing).unwrap_or_default();
            let pair = scale_pair(&shapes, 10_000, 1_000);
            assert_eq!(pair.is_some(), paired, "--scale {scale}");
            if let Some((s, l)) = pair {
                assert_eq!(shapes[s].label(), "10 VK · 8 PK (all serve) · changing");
                assert_eq!(
                    shapes[l].label(),
                    "10000 VK · 1000 PK (all serve) · changing"
                );
            }
        }
        // Sizes that make both rows one: nothing to pair.
        let shapes = scale_shapes("keys", 10, 8, Headers::Changing).unwrap_or_default();
        assert_eq!(scale_pair(&shapes, 10, 8), None);
    }
}
