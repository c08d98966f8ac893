//! Proven under faults: the failover conformance runner, `ai-router conformance`, driven
//! against our own gateway (Envoy, the filter, the control plane) on the example conformance
//! pool; every fault of the catalogue, unary and streamed, OpenAI and Anthropic lanes, with and
//! without a healthy lane behind.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{run_conformance, start_conformance_pool};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_runner_finds_every_fault_handled_right() {
    let pool = start_conformance_pool("conformance_runner").await.unwrap();
    let run = run_conformance(&pool, &[], Duration::from_secs(600))
        .await
        .unwrap();
    let failures: Vec<String> = run.failures().iter().map(|case| case.to_string()).collect();
    assert!(
        failures.is_empty() && run.success,
        "{} case(s) handled wrongly:\n{}\n--- stderr ---\n{}",
        failures.len(),
        failures.join("\n"),
        run.stderr
    );
    // Both kinds, both shapes, both modes ran, and the summary counts them all.
    assert!(run.cases.len() > 100, "{}", run.stdout);
    assert_eq!(run.summary["failed"], 0, "{}", run.stdout);
    assert_eq!(run.summary["passed"].as_u64(), Some(run.cases.len() as u64));
    for (field, value) in [
        ("kind", "openai"),
        ("kind", "anthropic"),
        ("mode", "failover"),
        ("mode", "alone"),
    ] {
        assert!(
            run.cases.iter().any(|case| case[field] == value),
            "no {field} {value}"
        );
    }
}
