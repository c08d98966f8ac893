//! The systems comparison: each system started its own way, then measured the same way (the
//! answer check, the warm-up, every phase, its memory).

use std::collections::BTreeMap;
use std::time::Instant;

use ai_router_e2e::{envoy_bin, TestDir};
use anyhow::{bail, Result};

use crate::airouter::{self, Instance, KeyBundle, Shape};
use crate::load::{chat_body, Target};
use crate::onepass::{failover_check, Failover, Scripted};
use crate::peers;
use crate::procs::ProcSet;
use crate::report::{ScaleResult, SystemResult};
use crate::run::{check, run_phase, warm_up, Plan, ALL_PHASES};
use crate::scale::{bundle, probes};
use crate::upstream::{
    internal_hop_envoy_yaml, one_pass_envoy_yaml, one_pass_retry_envoy_yaml, plain_envoy_yaml,
    wasm_floor_envoy_yaml, BenchEnvoy, Headers,
};
use crate::{log, Args, ENVOY_WORKERS, FEW_PROVIDER_KEYS, FEW_VIRTUAL_KEYS};

/// What every system of a run shares.
pub struct Bench<'a> {
    pub args: &'a Args,
    pub plan: &'a Plan,
    /// The fake upstream's rate-limit headers.
    pub headers: Headers,
    pub dir: &'a TestDir,
    pub upstream: &'a BenchEnvoy,
    /// The fake upstream's processes (their CPU is reported beside the system's).
    pub up_procs: &'a ProcSet,
}

/// Starts and measures system `name`; ai-router's smoke run also gives a scale row (its sync
/// probes).
pub async fn run_system(
    name: &str,
    bench: &Bench<'_>,
    bundles: &mut BTreeMap<usize, KeyBundle>,
) -> Result<(SystemResult, Option<ScaleResult>)> {
    let t0 = Instant::now();
    let result = match name {
        "direct" => {
            let target = direct_target(bench.upstream.port, bench.headers)?;
            let what = "the fake upstream itself (Envoy direct_response): the floor";
            measure_system(name, what, &target, &ProcSet::new(), bench, t0).await
        }
        "envoy" | "envoy-internal" | "wasm-noop" | "wasm-floor" | "one-pass-floor"
        | "one-pass-retry" => run_envoy(name, bench, t0).await,
        "ai-router" | ONE_PASS => return run_ai_router(name, bench, bundles, &[], t0).await,
        variant if variant.starts_with(AI_ROUTER_VARIANT) => {
            let variants = airouter::variant::parse(&variant[AI_ROUTER_VARIANT.len()..])?;
            return run_ai_router(name, bench, bundles, &variants, t0).await;
        }
        "litellm" => run_litellm(name, bench, t0).await,
        "portkey" => run_portkey(name, bench, t0).await,
        "agentgateway" => run_agentgateway(name, bench, t0).await,
        other => bail!("unknown system {other}"),
    };
    result.map(|r| (r, None))
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

/// Plain Envoy (one hop), or two passes through an internal listener (ai-router's shape
/// without its filter).
async fn run_envoy(name: &str, bench: &Bench<'_>, t0: Instant) -> Result<SystemResult> {
    let upstream = bench.upstream.port;
    // `one-pass-retry`'s scripted first hosts (its failover check), known to its Envoy at start.
    let scripted = match name {
        "one-pass-retry" => Some(Scripted::start().await?),
        _ => None,
    };
    let (bootstrap, what) = match name {
        "envoy" => (
            plain_envoy_yaml(upstream),
            "plain Envoy 1.40: one listener, one route, one static cluster (the cost of one hop)",
        ),
        "wasm-noop" => (
            wasm_floor_envoy_yaml(upstream, &wasm_floor_path()?, false, 0),
            "envoy-internal with a proxy-wasm filter on both passes that makes no host call: the cost of V8's callbacks alone",
        ),
        "wasm-floor" => (
            wasm_floor_envoy_yaml(upstream, &wasm_floor_path()?, true, bench.args.floor_writes),
            "envoy-internal with a proxy-wasm filter on both passes doing the least ai-router's stages do with a call's bytes (hold and read the body, list the headers, write one; the attempt pass holds and reads a unary answer)",
        ),
        "one-pass-floor" => (
            one_pass_envoy_yaml(upstream, &wasm_floor_path()?, bench.args.floor_writes),
            "wasm-floor's work on one pass: the public listener's filter does both stages' and its route sends the call straight to the upstream, an upstream filter on that cluster turning a failure into an internal redirect through the internal listener (bench/wasm-floor, modes onepass and upstream)",
        ),
        "one-pass-retry" => (
            one_pass_retry_envoy_yaml(
                upstream,
                &wasm_floor_path()?,
                bench.args.floor_writes,
                &scripted.as_ref().map(Scripted::ports).unwrap_or_default(),
            ),
            "wasm-floor's work on one pass, failed over by the router's own retry: the route's cluster is an aggregate of the direct cluster (a dynamic forward proxy, with the upstream filter) and the internal listener, its retry policy sending a retry to the next priority (previous_priorities), the upstream filter turning a failure into the retry header (bench/wasm-floor, modes oneretry, upstream retry and retry)",
        ),
        _ => (
            internal_hop_envoy_yaml(upstream),
            "Envoy 1.40, two passes and no filter: a listener routing to an internal listener whose router proxies to the upstream (ai-router's shape without its filter)",
        ),
    };
    let envoy =
        BenchEnvoy::start(bench.dir, &envoy_bin()?, name, &bootstrap, ENVOY_WORKERS).await?;
    let mut target = direct_target(envoy.port, bench.headers)?;
    target.url = format!(
        "http://127.0.0.1:{}/{}/v1/chat/completions",
        envoy.port,
        bench.headers.prefix()
    )
    .parse()?;
    let mut what = what.to_string();
    let design = match name {
        "one-pass-floor" => Some(Failover::Redirect),
        "one-pass-retry" => scripted.as_ref().map(Failover::Retry),
        _ => None,
    };
    if let Some(design) = design {
        let checked = failover_check(design, &envoy, bench.upstream, &target).await?;
        log(format!("  {name}: {checked}"));
        what = format!("{what}; {checked}");
    }
    let mut procs = ProcSet::new();
    procs.add("envoy", envoy.process.pid());
    measure_system(name, &what, &target, &procs, bench, t0).await
}

/// The floor filter's wasm (bench/wasm-floor): `AI_ROUTER_WASM_FLOOR`, else the release build
/// in the workspace's target (scripts/bench.sh builds it when a floor system is asked for).
fn wasm_floor_path() -> Result<std::path::PathBuf> {
    let path = std::env::var_os("AI_ROUTER_WASM_FLOOR").map_or_else(
        || {
            ai_router_e2e::workspace_root()
                .join("target/wasm32-wasip1/release/ai_router_wasm_floor.wasm")
        },
        std::path::PathBuf::from,
    );
    if !path.is_file() {
        bail!(
            "no floor filter at {} (cargo build --release --target wasm32-wasip1 -p ai-router-wasm-floor)",
            path.display()
        );
    }
    Ok(path)
}

/// The prefix of the systems `ai-router@VARIANT[+VARIANT...]`: ai-router with its rendered
/// Envoy bootstrap changed ([`airouter::variant`]).
pub const AI_ROUTER_VARIANT: &str = "ai-router@";
/// ai-router with `gateway.onePass`: a call's first attempt straight from the public listener.
pub const ONE_PASS: &str = "ai-router-one-pass";

/// ai-router with the systems comparison's pool (its Envoy bootstrap changed by `variants`);
/// a smoke run also probes its sync.
async fn run_ai_router(
    name: &str,
    bench: &Bench<'_>,
    bundles: &mut BTreeMap<usize, KeyBundle>,
    variants: &[&'static str],
    t0: Instant,
) -> Result<(SystemResult, Option<ScaleResult>)> {
    let shape = Shape {
        virtual_keys: FEW_VIRTUAL_KEYS,
        serving_keys: FEW_PROVIDER_KEYS,
        other_keys: 0,
        headers: bench.headers,
    };
    let bundle = bundle(bundles, shape.virtual_keys, bench.upstream.port).await?;
    let one_pass = name == ONE_PASS;
    let mut instance = Instance::start(
        "bench-ai-router",
        shape,
        &bundle,
        bench.upstream,
        variants,
        one_pass,
    )
    .await?;
    let procs = instance.procs();
    let target = instance.target()?;
    let mut what = "ai-router serve + Envoy rendered by ai-router render-envoy with the wasm filter; 2 providers x 4 keys, a virtual key with quotas, 10 virtual keys".to_string();
    if one_pass {
        what.push_str("; gateway.onePass: a call's first attempt leaves from the public listener (the attempt stage as the route's upstream filter), retries through the attempt listener");
    }
    if !variants.is_empty() {
        what = format!(
            "{what}; the bootstrap changed: {}",
            airouter::variant::describe(variants)
        );
    }
    let mut result = measure_system(name, &what, &target, &procs, bench, t0).await?;
    result.attempt_listener_requests = instance
        .envoy
        .stat("http.ai_router_attempt.downstream_rq_total")
        .await
        .ok();
    // The sync probes run once, on the two-pass build.
    if !bench.args.smoke || one_pass {
        return Ok((result, None));
    }
    let probes = probes(&mut instance, bench.upstream, bench.args.streak).await;
    result
        .description
        .push_str("; sync probes run on it (smoke)");
    let row = ScaleResult {
        label: shape.label(),
        shape: Some(shape),
        c16: result.phase("c16").cloned(),
        peak_rss_mb: result.peak_rss_mb.clone(),
        peak_rss_total_mb: result.peak_rss_total_mb,
        probes,
        start_s: result.start_s,
        create_key_ms: Some(instance.create_key_ms),
        ..Default::default()
    };
    Ok((result, Some(row)))
}

async fn run_litellm(name: &str, bench: &Bench<'_>, t0: Instant) -> Result<SystemResult> {
    let Some(litellm) = &bench.args.litellm else {
        bail!("no --litellm executable (scripts/bench.sh installs LiteLLM)");
    };
    let peer = peers::start_litellm(bench.dir, litellm, bench.upstream.port).await?;
    let what = "LiteLLM proxy (litellm --config, 1 worker), 8 deployments of the model, master key";
    measure_peer(name, what, &peer, bench, t0).await
}

async fn run_portkey(name: &str, bench: &Bench<'_>, t0: Instant) -> Result<SystemResult> {
    let Some(start_server) = &bench.args.portkey else {
        bail!("no --portkey start-server.js (scripts/bench.sh installs Portkey's gateway)");
    };
    let node = bench.args.node.clone().unwrap_or_else(peers::node_bin);
    let peer = peers::start_portkey(bench.dir, &node, start_server, bench.upstream.port).await?;
    let what = "Portkey gateway (node build/start-server.js), loadbalance config over 8 keys in x-portkey-config";
    measure_peer(name, what, &peer, bench, t0).await
}

async fn run_agentgateway(name: &str, bench: &Bench<'_>, t0: Instant) -> Result<SystemResult> {
    let Some(agentgateway) = &bench.args.agentgateway else {
        bail!("no --agentgateway binary (build it by hand: docs/benchmarks.md)");
    };
    let peer = peers::start_agentgateway(
        bench.dir,
        agentgateway,
        bench.upstream.port,
        bench.headers.prefix(),
        ENVOY_WORKERS,
    )
    .await?;
    let what = format!("agentgateway (agentgateway -f config.yaml, {ENVOY_WORKERS} worker threads, request logs off), API-key auth (strict, 10 keys), a weighted virtual model over 8 OpenAI deployments");
    measure_peer(name, &what, &peer, bench, t0).await
}

/// The answer check, the warm-up and every phase against one system, then its memory.
async fn measure_system(
    name: &str,
    description: &str,
    target: &Target,
    procs: &ProcSet,
    bench: &Bench<'_>,
    t0: Instant,
) -> Result<SystemResult> {
    let plan = bench.plan;
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
        if let Some(only) = &bench.args.phases {
            if !only.iter().any(|p| *p == phase.name()) {
                continue;
            }
        }
        let report = run_phase(target, procs, bench.up_procs, plan, phase).await?;
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
    bench: &Bench<'_>,
    t0: Instant,
) -> Result<SystemResult> {
    let mut procs = ProcSet::new();
    procs.add(name, peer.process.pid());
    let result = measure_system(name, description, &peer.target, &procs, bench, t0).await;
    procs.kill_descendants();
    result
}
