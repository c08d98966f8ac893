//! `GET /metrics` scraped by a real Prometheus server (Debian's `prometheus` package, see
//! `scripts/setup.sh`), started here on a free loopback port: PromQL over what it scraped
//! matches the calls made through a real Envoy (requests by outcome, attempts by lane, the
//! latency histograms, tokens, estimated cost, a quota refusal, a key out, the sync stream).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use ai_router_e2e::{http_client, poll, script, standard_pool, Gateway, Process};
use serde_json::{json, Value};

/// A Prometheus server scraping the control plane every 500 ms.
struct Prometheus {
    _process: Process,
    url: String,
}

impl Prometheus {
    async fn start(gw: &Gateway) -> Self {
        let bin = std::env::var_os("PROMETHEUS_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"));
        assert!(
            bin.exists(),
            "no Prometheus server at {} (scripts/setup.sh installs Debian's `prometheus` \
             package; or set PROMETHEUS_BIN)",
            bin.display()
        );
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("its address").port()
        };
        let config = gw.dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\nscrape_configs:\n  - job_name: ai-router\n    static_configs:\n      - targets: ['{}']\n",
                gw.cp.http_addr()
            ),
        )
        .expect("writing prometheus.yml");
        let args: Vec<String> = vec![
            format!("--config.file={}", config.display()),
            format!(
                "--storage.tsdb.path={}",
                gw.dir.join("prometheus-data").display()
            ),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=warn".into(),
        ];
        let process = Process::spawn(&gw.dir, "prometheus", &bin, &args, &[]).expect("prometheus");
        let prom = Self {
            _process: process,
            url: format!("http://127.0.0.1:{port}"),
        };
        // Up, and scraping the control plane.
        prom.until("up{job=\"ai-router\"}", 1.0).await;
        prom
    }

    /// The value of a PromQL query that yields one sample; `None` when it yields none.
    async fn query(&self, promql: &str) -> anyhow::Result<Option<f64>> {
        let body: Value = http_client()?
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", promql)])
            .send()
            .await?
            .json()
            .await?;
        anyhow::ensure!(body["status"] == "success", "{promql}: {body}");
        let result = body["data"]["result"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("{promql}: {body}"))?;
        anyhow::ensure!(result.len() <= 1, "{promql} yields several series: {body}");
        Ok(result
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok()))
    }

    /// Waits until `promql` yields `want` (within 1e-9), failing with the last value seen.
    async fn until(&self, promql: &str, want: f64) {
        let last = std::sync::Mutex::new(None);
        let got = poll(
            &format!("{promql} == {want}"),
            Duration::from_secs(30),
            || async {
                let v = self.query(promql).await?;
                *last.lock().unwrap() = v;
                Ok(v.filter(|v| (v - want).abs() < 1e-9))
            },
        )
        .await;
        if let Err(e) = got {
            panic!(
                "{promql}: last {:?}, want {want}: {e:#}",
                last.lock().unwrap()
            );
        }
    }
}

const PROMPT: u64 = 11;
const COMPLETION: u64 = 7;
const CACHED: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_counts_matching_the_calls() {
    // m1 priced; the fixture's key mounted with 6 requests a minute.
    let gw = Gateway::start_with("metrics_prometheus", |p1, p2| {
        format!(
            "{}mountedKeys:\n  - {{ label: e2e, env: STARCI_AI_KEY, profiles: ['*'], models: ['*'], quota: {{ requestsPerMinute: 6 }} }}\n",
            standard_pool(p1, p2).replace(
                "{ id: m1, aliases: [chat] }",
                "{ id: m1, aliases: [chat], cost: { input: 2, output: 10 } }"
            )
        )
    })
    .await
    .expect("fixture");
    let prom = Prometheus::start(&gw).await;
    gw.mock1
        .script(json!([script::always(vec![json!({
            "text": "ok",
            "usage": { "prompt_tokens": PROMPT, "completion_tokens": COMPLETION, "cached_tokens": CACHED },
        })])]))
        .await
        .unwrap();
    // p2's only key is refused: out of rotation for auth.
    gw.mock2
        .script(json!([script::always(vec![script::status(
            401,
            json!({}),
            Some(json!({ "error": { "message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, "code": "invalid_api_key" } }))
        )])]))
        .await
        .unwrap();

    // Six calls in one minute (3 unary, 2 streams, 1 failing), then a seventh refused.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let left = 60_000 - (now_ms % 60_000);
    if left < 20_000 {
        tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap() + 50)).await;
    }
    for i in 0..3 {
        let r = gw.chat("chat").await.unwrap();
        assert_eq!(r.status, 200, "unary call {i}: {r}");
    }
    for i in 0..2 {
        let s = gw.stream("chat").await.unwrap();
        assert_eq!(s.status, 200, "stream {i}: {s}");
    }
    let r = gw.chat("backup").await.unwrap();
    assert!(r.status >= 400, "p2's key is refused: {r}");
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 429, "the seventh call in the minute: {r}");

    // Requests by outcome.
    prom.until(
        "sum(ai_router_requests_total{operation=\"chat\",outcome=\"success\",provider=\"p1\",model=\"m1\"})",
        5.0,
    )
    .await;
    prom.until("sum(ai_router_requests_total{outcome=~\"error:.*\"})", 1.0)
        .await;
    // The failed call carries its last attempt's provider and model.
    prom.until(
        "sum(ai_router_requests_total{outcome=~\"error:.*\",provider=\"p2\",model=\"m2\"})",
        1.0,
    )
    .await;
    prom.until(
        "sum(ai_router_requests_total{outcome=\"rejected:requests_per_minute_exceeded\"})",
        1.0,
    )
    .await;
    prom.until(
        "ai_router_quota_refusals_total{code=\"requests_per_minute_exceeded\"}",
        1.0,
    )
    .await;
    // Attempts by lane: five successes on p1's keys, p2's key failed for auth.
    prom.until(
        "sum(ai_router_attempts_total{provider=\"p1\",model=\"m1\",outcome=\"success\",class=\"\"})",
        5.0,
    )
    .await;
    prom.until(
        "sum(ai_router_attempts_total{provider=\"p2\",key=\"c\",model=\"m2\",outcome=\"error\",class=\"auth\"})",
        1.0,
    )
    .await;
    // Latency: the streams' time to first token, the other attempts' duration, every call's.
    prom.until(
        "sum(ai_router_time_to_first_token_seconds_count{provider=\"p1\"})",
        2.0,
    )
    .await;
    prom.until(
        "sum(ai_router_time_to_first_token_seconds_bucket{provider=\"p1\",le=\"+Inf\"})",
        2.0,
    )
    .await;
    prom.until(
        "sum(ai_router_attempt_duration_seconds_count{provider=\"p1\"})",
        3.0,
    )
    .await;
    prom.until("sum(ai_router_request_duration_seconds_count)", 7.0)
        .await;
    let sum = prom
        .query("sum(ai_router_request_duration_seconds_sum)")
        .await
        .unwrap()
        .unwrap();
    assert!(sum > 0.0 && sum < 60.0, "seconds, not milliseconds: {sum}");
    // Tokens and their cost: 5 answers of PROMPT + COMPLETION (CACHED of them from the
    // cache) at 2 and 10 per million.
    prom.until(
        "sum(ai_router_prompt_tokens_total{provider=\"p1\"})",
        (5 * PROMPT) as f64,
    )
    .await;
    prom.until(
        "sum(ai_router_completion_tokens_total{provider=\"p1\"})",
        (5 * COMPLETION) as f64,
    )
    .await;
    prom.until(
        "sum(ai_router_cached_tokens_total{provider=\"p1\"})",
        (5 * CACHED) as f64,
    )
    .await;
    prom.until(
        "sum(ai_router_estimated_cost_total{provider=\"p1\",model=\"m1\"})",
        5.0 * (PROMPT as f64 * 2.0 + COMPLETION as f64 * 10.0) / 1e6,
    )
    .await;
    // State: p2's key out for auth; one Envoy watching, holding the current state; its outbox
    // dropped nothing.
    prom.until(
        "ai_router_key_out{provider=\"p2\",key=\"c\",reason=\"auth\"}",
        1.0,
    )
    .await;
    prom.until("sum(ai_router_sync_connections)", 1.0).await;
    prom.until("max(ai_router_sync_state_age_seconds)", 0.0)
        .await;
    prom.until("sum(ai_router_report_dropped_total)", 0.0).await;
    prom.until("count(ai_router_report_dropped_total)", 1.0)
        .await;
    // No secret in any series.
    let text = ai_router_e2e::get_text(&format!("http://{}/metrics", gw.cp.http_addr()))
        .await
        .unwrap();
    for (name, secret) in gw.secrets() {
        assert!(!text.contains(secret), "{name} in /metrics:\n{text}");
    }
    gw.check_no_secrets_in_logs().unwrap();
}
