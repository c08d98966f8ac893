//! The benchmark's smoke mode (`scripts/bench.sh --smoke`), so that the benchmark never rots:
//! the fake upstream, direct, plain Envoy and ai-router (control plane + Envoy + the filter)
//! each measured for a fraction of a second per phase, and the sync probes on ai-router. The
//! figures mean nothing here; that they exist, with no failed request and real completions
//! through the gateway, is what is checked. And `one-pass-floor`'s smoke run, whose failover
//! check must pass. Ephemeral ports on loopback only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ai_router_e2e::{ai_router_bin, envoy_bin, wasm_path, workspace_root, TestDir};
use serde_json::Value;

/// A bound far above what the smoke run takes (about 20 s), so a hang fails the test.
const BOUND: Duration = Duration::from_secs(180);
const PHASES: [&str; 5] = ["c1", "c16", "c64", "open", "stream-c1"];
const COMPLETION: &str = "Hello from the bench upstream.";

fn num(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer).and_then(Value::as_f64).unwrap_or(-1.0)
}

fn check_phase(system: &str, name: &str, p: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let requests = num(p, "/requests");
    if requests < 1.0 {
        problems.push(format!("{system} {name}: no request made"));
    }
    if num(p, "/ok") != requests {
        problems.push(format!(
            "{system} {name}: {} of {requests} requests ok; failures {}",
            num(p, "/ok"),
            p.get("failures").cloned().unwrap_or(Value::Null)
        ));
    }
    for field in ["/failed", "/invalid"] {
        if num(p, field) != 0.0 {
            problems.push(format!("{system} {name}: {field} = {}", num(p, field)));
        }
    }
    if num(p, "/throughputRps") <= 0.0 || num(p, "/latencyMs/p50") <= 0.0 {
        problems.push(format!("{system} {name}: no throughput or latency figure"));
    }
    if name.starts_with("stream") && num(p, "/firstByteMs/p50") <= 0.0 {
        problems.push(format!("{system} {name}: no time to first byte"));
    }
    problems
}

/// Runs `scripts/bench.sh --smoke` with `args` into `dir`/results (bounded by [`BOUND`]),
/// asserts it succeeded, and returns its stdout, its stderr and the results directory.
fn run_smoke(dir: &TestDir, args: &[&str]) -> (String, String, std::path::PathBuf) {
    let out = dir.join("results");
    let envoy = envoy_bin().expect("Envoy");
    let bin = ai_router_bin().expect("ai-router");
    let wasm = wasm_path().expect("the wasm filter");
    let script = workspace_root().join("scripts/bench.sh");
    let stdout_path = dir.join("bench.stdout");
    let stderr_path = dir.join("bench.stderr");
    let started = Instant::now();
    let mut child = Command::new(&script)
        .arg("--smoke")
        .args(args)
        .arg("--out")
        .arg(&out)
        .env("ENVOY_BIN", &envoy)
        .env("AI_ROUTER_BIN", &bin)
        .env("AI_ROUTER_WASM", &wasm)
        .env("AI_ROUTER_BENCH_BIN", env!("CARGO_BIN_EXE_ai-router-bench"))
        .env_remove("STARCI_AI_KEY")
        .env_remove("AI_ROUTER_SYNC_TOKEN")
        .env_remove("AI_ROUTER_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
        .spawn()
        .expect("starting scripts/bench.sh");
    let status = loop {
        if let Some(st) = child.try_wait().expect("waiting for bench.sh") {
            break st;
        }
        if started.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "scripts/bench.sh --smoke ran past {BOUND:?}\n{}",
                read(&stderr_path)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = started.elapsed();
    let stdout = read(&stdout_path);
    let stderr = read(&stderr_path);
    assert!(
        status.success(),
        "scripts/bench.sh --smoke failed ({status})\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    );
    eprintln!("scripts/bench.sh --smoke {args:?} took {took:?}");
    (stdout, stderr, out)
}

#[test]
fn the_benchmark_smoke_run_measures_every_system_with_real_completions() {
    let dir = TestDir::new("bench_smoke").expect("test dir");
    let (stdout, stderr, out) = run_smoke(&dir, &[]);

    // No secret is printed: provider keys are sk-bench-..., virtual keys sk-starci-....
    for needle in ["sk-bench-", "sk-starci-"] {
        assert!(
            !stdout.contains(needle) && !stderr.contains(needle),
            "the benchmark printed a secret ({needle}...)"
        );
    }

    let report: Value =
        serde_json::from_str(&read(&out.join("results.json"))).expect("results.json is JSON");
    let md = read(&out.join("results.md"));
    assert!(
        md.contains("## Systems") && md.contains("| ai-router |"),
        "results.md: {md}"
    );
    assert_eq!(
        report.pointer("/meta/mode").and_then(Value::as_str),
        Some("smoke")
    );
    assert!(
        report
            .get("errors")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty),
        "errors: {}",
        report["errors"]
    );

    let systems = report["systems"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = systems
        .iter()
        .filter_map(|s| s.get("name").and_then(Value::as_str))
        .collect();
    assert_eq!(
        names,
        ["direct", "envoy", "ai-router", "ai-router-one-pass"]
    );
    let mut problems = Vec::new();
    for s in &systems {
        let name = s["name"].as_str().unwrap_or_default();
        if !s["error"].is_null() {
            problems.push(format!("{name}: {}", s["error"]));
            continue;
        }
        if s.pointer("/check/ok") != Some(&Value::Bool(true)) {
            problems.push(format!("{name}: answer check failed: {}", s["check"]));
        }
        for phase in PHASES {
            match s.pointer(&format!("/phases/{phase}")) {
                Some(p) => problems.extend(check_phase(name, phase, p)),
                None => problems.push(format!("{name}: no {phase} phase")),
            }
        }
        if name != "direct" {
            if num(s, "/peakRssTotalMb") <= 0.0 {
                problems.push(format!("{name}: no memory figure"));
            }
            if num(s, "/phases/c16/cpuS/system") <= 0.0 {
                problems.push(format!("{name}: no CPU figure"));
            }
        }
        if name != "direct" && s["addedLatencyC1"].is_null() {
            problems.push(format!("{name}: no added latency"));
        }
        // In two passes every call crosses the attempt listener; in one pass, none that
        // succeeds (the load has no failure).
        let through = s["attemptListenerRequests"].as_u64();
        match name {
            "ai-router" if through.is_none_or(|n| n == 0) => {
                problems.push(format!("{name}: the attempt listener took {through:?}"))
            }
            "ai-router-one-pass" if through != Some(0) => problems.push(format!(
                "{name}: the attempt listener took {through:?} calls, none went in one pass?"
            )),
            _ => {}
        }
        // ai-router states its own overhead on every answer the load generator asked it for.
        if name.starts_with("ai-router") {
            for phase in PHASES {
                let over = s.pointer(&format!("/phases/{phase}/overheadMs/p50"));
                if !over.and_then(Value::as_f64).is_some_and(|ms| ms > 0.0) {
                    problems.push(format!("ai-router {phase}: no overhead figure ({over:?})"));
                }
            }
        } else if s.to_string().contains("overheadMs") {
            problems.push(format!("{name}: an overhead figure, though it states none"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // ai-router's answers were the upstream's completions, through the gateway.
    for ar in systems.iter().filter(|s| {
        s["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("ai-router"))
    }) {
        assert_eq!(
            ar.pointer("/check/modelHeader").and_then(Value::as_str),
            Some("bench-model"),
            "x-ai-router-model: {}",
            ar["check"]
        );
        assert_eq!(
            ar.pointer("/check/unaryContent").and_then(Value::as_str),
            Some(COMPLETION)
        );
        assert_eq!(
            ar.pointer("/check/streamContent").and_then(Value::as_str),
            Some(COMPLETION)
        );
    }

    // The sync probes ran on ai-router: a revoked virtual key and a blacklisted provider key
    // reached every worker of both Envoys.
    let scale = report["scale"].as_array().cloned().unwrap_or_default();
    assert_eq!(scale.len(), 1, "scale rows: {}", report["scale"]);
    let probes = &scale[0]["probes"];
    assert!(
        probes["errors"].as_array().is_some_and(Vec::is_empty),
        "probe errors: {}",
        probes["errors"]
    );
    for kind in ["revoke", "blacklist"] {
        let p = &probes[kind];
        let reach = p["reach"].as_array().cloned().unwrap_or_default();
        assert_eq!(reach.len(), 2, "{kind}: {p}");
        let ms = num(p, "/everyWorkerMs");
        assert!((0.0..20_000.0).contains(&ms), "{kind}: {p}");
        assert!(
            num(p, "/syncRxBytesRaw") > 0.0,
            "{kind}: no sync bytes seen: {p}"
        );
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `one-pass-floor` (docs/benchmarks.md, "A first attempt in one pass"): the benchmark checks,
/// before measuring it, that a successful first attempt takes one pass and that a failed one
/// (a 429, and a stream whose first event is an error) is followed by Envoy's internal redirect
/// through the internal listener with its body replayed, the client getting the second
/// attempt's answer (bench/src/onepass.rs); any miss is the system's error. Here: that check
/// ran and passed, and the system was measured with no failed request.
#[test]
fn the_one_pass_floor_fails_a_first_attempt_over_through_an_internal_redirect() {
    one_pass_system("one-pass-floor", &["take one internal redirect"]);
}

/// `one-pass-retry` (docs/benchmarks.md, "A first attempt in one pass"): the same check with
/// the failover made by the router's own retry to the aggregate cluster's next priority, and
/// the failures without an answer too: a first host refusing the connection, one closing it
/// before answering and one not answering within the per-try timeout are each retried once
/// through the internal listener, a retry that fails too goes through it again (not back to
/// the first host) with the client's request, not the first attempt's rewrite, a stream slower than the per-try timeout after its first event is not cut,
/// and an upstream filter's own answer is not retried (bench/src/onepass.rs); any miss is the
/// system's error.
#[test]
fn the_one_pass_retry_fails_a_first_attempt_over_even_without_an_answer() {
    one_pass_system(
        "one-pass-retry",
        &[
            "a first host refusing the connection",
            "not answering within the per-try timeout",
            "not back to the direct cluster",
            "reaches the client whole",
            "none of the first attempt's rewrite",
        ],
    );
}

/// Runs the one-pass system `name` alone (smoke): its failover check passed (the description
/// says what it verified, `says` among it) and every phase was measured with no failed request.
fn one_pass_system(name: &str, says: &[&str]) {
    let dir = TestDir::new(&format!("bench_{}", name.replace('-', "_"))).expect("test dir");
    let (_, _, out) = run_smoke(&dir, &["--systems", name, "--scale", "none"]);
    let report: Value =
        serde_json::from_str(&read(&out.join("results.json"))).expect("results.json is JSON");
    assert!(
        report
            .get("errors")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty),
        "errors: {}",
        report["errors"]
    );
    let systems = report["systems"].as_array().cloned().unwrap_or_default();
    assert_eq!(systems.len(), 1, "systems: {}", report["systems"]);
    let s = &systems[0];
    assert_eq!(s["name"], name);
    assert!(s["error"].is_null(), "{}", s["error"]);
    let description = s["description"].as_str().unwrap_or_default();
    assert!(
        description.contains("failover checked"),
        "the failover check did not run: {description}"
    );
    for said in says {
        assert!(
            description.contains(said),
            "the failover check did not verify {said:?}: {description}"
        );
    }
    assert_eq!(
        s.pointer("/check/unaryContent").and_then(Value::as_str),
        Some(COMPLETION)
    );
    let mut problems = Vec::new();
    for phase in PHASES {
        match s.pointer(&format!("/phases/{phase}")) {
            Some(p) => problems.extend(check_phase(name, phase, p)),
            None => problems.push(format!("{name}: no {phase} phase")),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
