//! Budget policies (`budgets:`) through a real Envoy. Hour, day and month windows are counted
//! by the control plane after each call and pushed: a hard budget refuses the call after the
//! crossing one with 429 `budget_exceeded` and `Retry-After`, a soft one lets calls through
//! with `x-ai-router-budget-warning`, and `warnAt` warns once per window (an event, a metric,
//! the header); `maxCost` counts the usage at the models' `cost`. A request window caps each
//! call's estimate in the filter. A provider's spent hard budget takes its candidates out of
//! the call.
//!
//! The mocks report usage only for the calls meant to spend; the polls in between answer with
//! no usage, so waiting for a push spends nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{openai_error_problem, poll, standard_pool, Gateway, Reply};
use serde_json::{json, Value};

const PUSH: Duration = Duration::from_secs(15);
const WARNING: &str = "x-ai-router-budget-warning";

fn with_budgets(budgets: &'static str) -> impl Fn(&str, &str) -> String {
    move |p1, p2| format!("{}budgets:\n{budgets}", standard_pool(p1, p2))
}

/// Chats with `key` (the fixture's when `None`) until `done` holds for an answer; every
/// answer must be a 200 or a 429.
async fn chat_until(
    gw: &Gateway,
    key: Option<&str>,
    what: &str,
    done: impl Fn(&Reply) -> bool,
) -> Reply {
    let key = key.unwrap_or(&gw.virtual_key).to_string();
    poll(what, PUSH, || {
        let c = gw.client.clone();
        let key = key.clone();
        let done = &done;
        async move {
            let r = c.chat("chat", Some(&key)).await?;
            anyhow::ensure!(matches!(r.status, 200 | 429), "expected 200 or 429: {r}");
            Ok(done(&r).then_some(r))
        }
    })
    .await
    .unwrap()
}

/// One call that spends 120 tokens (answered: counting is after the call), then calls that
/// spend nothing until the spent budget is pushed and a call is refused; returns the refusal.
async fn cross_the_limit(gw: &Gateway) -> Reply {
    gw.script_usage(60, 60).await.unwrap();
    let crossing = gw.chat("chat").await.unwrap();
    assert_eq!(crossing.status, 200, "the crossing call: {crossing}");
    gw.script_usage(0, 0).await.unwrap();
    chat_until(gw, None, "the spent budget to be pushed", |r| {
        r.status == 429
    })
    .await
}

fn warning(r: &Reply) -> Option<String> {
    r.header(WARNING)
}

/// Creates a virtual key through the admin API; returns its secret.
async fn create_key(gw: &Gateway, label: &str) -> String {
    let resp = gw
        .admin()
        .post("/admin/keys", &json!({ "label": label, "models": ["*"] }))
        .await
        .unwrap();
    assert_eq!(resp.status, 201);
    let body: Value = resp.json;
    body["secret"].as_str().expect("secret").to_string()
}

async fn next_event(rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Value)>) -> Value {
    tokio::time::timeout(PUSH, rx.recv())
        .await
        .expect("a budget event in time")
        .expect("the event stream ended")
        .1
}

/// The whole seconds of a 429's `Retry-After`, checked to be in `1..=max`.
fn retry_after(reply: &Reply, max: u64) -> u64 {
    let seconds: u64 = reply
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no whole-second Retry-After: {reply}"));
    assert!((1..=max).contains(&seconds), "Retry-After {seconds}");
    seconds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_key_budget_warns_at_warn_at_then_refuses_until_the_window_ends() {
    let gw = Gateway::start_with(
        "budget_hard_key",
        with_budgets(
            "  - { name: key-day, scope: key, window: day, limits: { maxTokens: 200 }, enforcement: hard, warnAt: 0.5 }\n",
        ),
    )
    .await
    .expect("fixture");
    let mut events = gw
        .cp
        .events(&gw.admin_token, "?types=budget")
        .await
        .unwrap();
    let other = create_key(&gw, "other").await;

    // 120 of 200 tokens: past warnAt (0.5), under the limit.
    gw.script_usage(60, 60).await.unwrap();
    let first = chat_until(&gw, None, "the first call", |r| r.status == 200).await;
    assert_eq!(warning(&first), None, "nothing spent before it: {first}");
    gw.script_usage(0, 0).await.unwrap();
    let warned = chat_until(&gw, None, "the warnAt warning to be pushed", |r| {
        warning(r).is_some()
    })
    .await;
    assert_eq!(
        warned.status, 200,
        "a warning lets the call through: {warned}"
    );
    assert_eq!(warning(&warned).as_deref(), Some("key-day=warn"));
    let event = next_event(&mut events).await;
    assert_eq!(
        (
            event["type"].as_str(),
            event["budget"].as_str(),
            event["level"].as_str(),
            event["scope"].as_str(),
            event["window"].as_str(),
            event["enforcement"].as_str(),
            event["tokens"].as_u64(),
            event["maxTokens"].as_u64(),
        ),
        (
            Some("budget"),
            Some("key-day"),
            Some("warn"),
            Some("key"),
            Some("day"),
            Some("hard"),
            Some(120),
            Some(200)
        ),
        "{event}"
    );
    // Another key has its own window.
    let r = chat_until(&gw, Some(&other), "the other key to be pushed", |r| {
        r.status == 200
    })
    .await;
    assert_eq!(warning(&r), None, "another key: {r}");

    // The call that crosses the limit is answered: counting is after the call.
    let refused = cross_the_limit(&gw).await;
    if let Some(problem) = openai_error_problem(&refused, 429, "budget_exceeded") {
        panic!("past the hard limit: {problem}");
    }
    assert_eq!(refused.json["error"]["type"], "rate_limit_error");
    retry_after(&refused, 86_400);
    let over = next_event(&mut events).await;
    assert_eq!(
        (over["level"].as_str(), over["tokens"].as_u64()),
        (Some("over"), Some(240)),
        "{over}"
    );
    // No warning twice in one window: the next event is not another warn.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), events.recv())
            .await
            .is_err(),
        "a second budget event in the window"
    );

    // A refused call reaches no provider; the other key still calls.
    gw.clear_calls().await.unwrap();
    let again = gw.chat("chat").await.unwrap();
    assert_eq!(again.status, 429, "{again}");
    assert!(gw.provider_calls().await.unwrap().is_empty());
    let r = gw.client.chat("chat", Some(&other)).await.unwrap();
    assert_eq!(r.status, 200, "another key: {r}");

    let line = gw
        .cp
        .metric_line(&[
            "ai_router_budget_warnings_total",
            "budget=\"key-day\"",
            "level=\"warn\"",
        ])
        .await
        .unwrap();
    assert!(!line.ends_with(" 0"), "{line}");
    gw.cp
        .metric_line(&["ai_router_budget_state{", "budget=\"key-day\"", "} 2"])
        .await
        .unwrap();
    gw.cp
        .metric_line(&[
            "ai_router_requests_total",
            "outcome=\"rejected:budget_exceeded\"",
        ])
        .await
        .unwrap();
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_pool_budget_warns_and_a_spent_provider_budget_moves_calls_away() {
    let gw = Gateway::start_with(
        "budget_soft_pool",
        with_budgets(
            "  - { name: pool-hour, scope: pool, window: hour, limits: { maxTokens: 100 }, enforcement: soft }\n  \
             - { name: p1-month, scope: provider, window: month, limits: { maxTokens: 100 }, enforcement: hard }\n\
             profiles:\n  only-p1: { model: m1, fallbacks: [] }\n",
        ),
    )
    .await
    .expect("fixture");
    let mut events = gw
        .cp
        .events(&gw.admin_token, "?types=budget")
        .await
        .unwrap();
    // `chat` is m1 on p1, falling back to m2 on p2: one call spends 120 tokens on p1.
    gw.script_usage(60, 60).await.unwrap();
    let first = chat_until(&gw, None, "the first call", |r| r.status == 200).await;
    assert_eq!(first.header("x-ai-router-model").as_deref(), Some("m1"));
    gw.script_usage(0, 0).await.unwrap();
    let warned = chat_until(&gw, None, "the soft budget's warning", |r| {
        warning(r).is_some()
    })
    .await;
    // Past a soft limit the call goes through, warned; p1 is out, so m2 on p2 answers.
    assert_eq!(warned.status, 200, "{warned}");
    assert_eq!(warning(&warned).as_deref(), Some("pool-hour=over"));
    // The one call crossed both: an event for each window, in the policies' order.
    let (soft, hard) = (next_event(&mut events).await, next_event(&mut events).await);
    assert_eq!(
        (
            soft["budget"].as_str(),
            soft["level"].as_str(),
            soft["enforcement"].as_str(),
            soft["tokens"].as_u64()
        ),
        (Some("pool-hour"), Some("over"), Some("soft"), Some(120)),
        "{soft}"
    );
    assert_eq!(
        (
            hard["budget"].as_str(),
            hard["subject"].as_str(),
            hard["level"].as_str(),
            hard["enforcement"].as_str()
        ),
        (Some("p1-month"), Some("p1"), Some("over"), Some("hard")),
        "{hard}"
    );
    let moved = chat_until(&gw, None, "p1's spent budget to move calls to p2", |r| {
        r.header("x-ai-router-model").as_deref() == Some("m2")
    })
    .await;
    assert_eq!(moved.status, 200, "{moved}");
    gw.clear_calls().await.unwrap();
    for _ in 0..3 {
        let r = gw.chat("chat").await.unwrap();
        assert_eq!(
            (r.status, r.header("x-ai-router-model")),
            (200, Some("m2".to_string())),
            "{r}"
        );
        assert_eq!(warning(&r).as_deref(), Some("pool-hour=over"));
    }
    assert!(
        gw.mock1.calls().await.unwrap().is_empty(),
        "p1's budget is spent: no call may reach it"
    );
    // A profile only p1 serves has no candidate left: refused by the budget until the month
    // ends.
    let pinned = gw
        .client
        .chat("only-p1", Some(&gw.virtual_key))
        .await
        .unwrap();
    if let Some(problem) = openai_error_problem(&pinned, 429, "budget_exceeded") {
        panic!("every candidate's provider spent: {problem}");
    }
    retry_after(&pinned, 31 * 86_400);
    // Its trail names the candidate the budget ruled out.
    let skipped: Vec<(Option<&str>, Option<&str>)> = pinned.json["error"]["trail"]["skipped"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| (s["provider"].as_str(), s["reason"].as_str()))
        .collect();
    assert_eq!(skipped, [(Some("p1"), Some("budget_exceeded"))], "{pinned}");
    assert!(gw.mock1.calls().await.unwrap().is_empty());
    let line = gw
        .cp
        .metric_line(&[
            "ai_router_budget_warnings_total",
            "budget=\"pool-hour\"",
            "level=\"over\"",
        ])
        .await
        .unwrap();
    assert!(!line.ends_with(" 0"), "{line}");
    // No second event in the window for either budget.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), events.recv())
            .await
            .is_err(),
        "a second budget event in the window"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_hour_budget_warns_at_warn_at_then_past_its_limit_and_never_refuses() {
    let gw = Gateway::start_with(
        "budget_soft_hour",
        with_budgets(
            "  - { name: key-hour, scope: key, window: hour, limits: { maxTokens: 200 }, enforcement: soft, warnAt: 0.5 }\n",
        ),
    )
    .await
    .expect("fixture");
    let mut events = gw
        .cp
        .events(&gw.admin_token, "?types=budget")
        .await
        .unwrap();
    // 120 of 200 tokens: past warnAt.
    gw.script_usage(60, 60).await.unwrap();
    chat_until(&gw, None, "the first call", |r| r.status == 200).await;
    gw.script_usage(0, 0).await.unwrap();
    let warned = chat_until(&gw, None, "the warnAt warning to be pushed", |r| {
        warning(r).is_some()
    })
    .await;
    assert_eq!(
        (warned.status, warning(&warned).as_deref()),
        (200, Some("key-hour=warn")),
        "{warned}"
    );
    let warn = next_event(&mut events).await;
    assert_eq!(
        (
            warn["budget"].as_str(),
            warn["level"].as_str(),
            warn["window"].as_str(),
            warn["enforcement"].as_str(),
            warn["tokens"].as_u64()
        ),
        (
            Some("key-hour"),
            Some("warn"),
            Some("hour"),
            Some("soft"),
            Some(120)
        ),
        "{warn}"
    );
    // 240 of 200: past the soft limit, the calls still go through, warned `over`.
    gw.script_usage(60, 60).await.unwrap();
    let crossing = gw.chat("chat").await.unwrap();
    assert_eq!(crossing.status, 200, "{crossing}");
    gw.script_usage(0, 0).await.unwrap();
    let over = chat_until(&gw, None, "the soft limit to be pushed", |r| {
        warning(r).as_deref() == Some("key-hour=over")
    })
    .await;
    assert_eq!(over.status, 200, "past a soft limit: {over}");
    let event = next_event(&mut events).await;
    assert_eq!(
        (event["level"].as_str(), event["tokens"].as_u64()),
        (Some("over"), Some(240)),
        "{event}"
    );
    // A soft budget never refuses: every call reaches a provider.
    gw.clear_calls().await.unwrap();
    for _ in 0..3 {
        let r = gw.chat("chat").await.unwrap();
        assert_eq!(
            (r.status, warning(&r).as_deref()),
            (200, Some("key-hour=over")),
            "{r}"
        );
    }
    assert_eq!(gw.provider_calls().await.unwrap().len(), 3);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), events.recv())
            .await
            .is_err(),
        "a third budget event in the window"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_budget_caps_each_call_by_its_estimate() {
    let gw = Gateway::start_with(
        "budget_request",
        with_budgets(
            "  - { name: per-call, scope: pool, window: request, limits: { maxTokens: 1000 }, enforcement: hard }\n  \
             - { name: per-call-soft, scope: key, window: request, limits: { maxTokens: 2000 }, enforcement: soft, warnAt: 0.25 }\n",
        ),
    )
    .await
    .expect("fixture");
    gw.script_usage(5, 5).await.unwrap();
    let body = |max_tokens: u64| {
        json!({
            "model": "chat",
            "max_tokens": max_tokens,
            "messages": [{ "role": "user", "content": "Say hello." }],
        })
    };
    let small = chat_until(&gw, None, "the gateway to answer", |r| r.status == 200).await;
    assert_eq!(warning(&small), None, "{small}");
    gw.clear_calls().await.unwrap();
    // About 600 tokens of 2000: past the soft cap's warnAt.
    let warned = gw
        .client
        .chat_with(&body(600), Some(&gw.virtual_key))
        .await
        .unwrap();
    assert_eq!(warned.status, 200, "{warned}");
    assert_eq!(warning(&warned).as_deref(), Some("per-call-soft=warn"));
    // Past the hard cap: refused before any provider, with nothing to wait for.
    let refused = gw
        .client
        .chat_with(&body(1_200), Some(&gw.virtual_key))
        .await
        .unwrap();
    if let Some(problem) = openai_error_problem(&refused, 429, "budget_exceeded") {
        panic!("past the per-call cap: {problem}");
    }
    assert_eq!(refused.header("retry-after"), None, "{refused}");
    assert_eq!(gw.provider_calls().await.unwrap().len(), 1);
    gw.cp
        .metric_line(&[
            "ai_router_budget_warnings_total",
            "budget=\"per-call-soft\"",
            "level=\"warn\"",
        ])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_hard_budget_takes_a_when_budget_exceeded_step_instead_of_the_429() {
    let gw = Gateway::start_with(
        "budget_step",
        with_budgets(
            "  - { name: key-day, scope: key, window: day, limits: { maxTokens: 100 }, enforcement: hard }\n\
             profiles:\n  smart: { candidates: [{ model: m1 }, { model: m2, when: [budget_exceeded] }] }\n",
        ),
    )
    .await
    .expect("fixture");
    // Before the budget is spent the step is never taken: m1 answers.
    gw.script_usage(0, 0).await.unwrap();
    chat_until(&gw, None, "the first call", |r| r.status == 200).await;
    let calm = gw.chat("smart").await.unwrap();
    assert_eq!(
        calm.header("x-ai-router-model").as_deref(),
        Some("m1"),
        "{calm}"
    );
    // One call spends 120 of the key's 100 tokens.
    // The direct call has no budget step: 429 once the spent budget is pushed.
    let refused = cross_the_limit(&gw).await;
    if let Some(problem) = openai_error_problem(&refused, 429, "budget_exceeded") {
        panic!("no step: {problem}");
    }
    retry_after(&refused, 86_400);
    // The profile's step takes the call instead, on m2, and p1 is not called.
    gw.clear_calls().await.unwrap();
    for _ in 0..2 {
        let r = gw
            .client
            .chat_with_headers(
                &ai_router_e2e::chat_body("smart", false),
                Some(&gw.virtual_key),
                &[("x-ai-router-trail", "1")],
            )
            .await
            .unwrap();
        assert_eq!(
            (r.status, r.header("x-ai-router-model").as_deref()),
            (200, Some("m2")),
            "{r}"
        );
        let trail = r.header("x-ai-router-trail").unwrap_or_default();
        assert!(
            trail.contains("budget_exceeded"),
            "the trail names the budget: {trail}"
        );
    }
    assert!(
        gw.mock1.calls().await.unwrap().is_empty(),
        "m1 is out for the key"
    );
    assert_eq!(gw.mock2.calls().await.unwrap().len(), 2);
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_hard_budget_stays_spent_across_a_control_plane_restart() {
    let mut gw = Gateway::start_with("budget_restart", |p1, p2| {
        format!(
            "{}budgets:\n  - {{ name: key-day, scope: key, window: day, limits: {{ maxTokens: 100 }}, enforcement: hard }}\n",
            ai_router_e2e::sqlite_pool(p1, p2)
        )
    })
    .await
    .expect("fixture");
    let refused = cross_the_limit(&gw).await;
    if let Some(problem) = openai_error_problem(&refused, 429, "budget_exceeded") {
        panic!("past the hard limit: {problem}");
    }

    // SIGKILL: the budget's count is in the key store with the usage rows, not in memory.
    gw.cp.restart(&[]).await.unwrap();
    // A key made on the restarted control plane reaches Envoy only through its own snapshot:
    // once it answers, Envoy enforces what the new process pushed.
    let (_, fresh) = gw
        .admin()
        .create_key(&json!({ "label": "after_restart", "models": ["*"] }))
        .await
        .unwrap();
    poll("the restarted control plane's keys", PUSH, || {
        let (c, fresh) = (gw.client.clone(), fresh.clone());
        async move {
            let r = c.chat("chat", Some(&fresh)).await?;
            anyhow::ensure!(
                matches!(r.status, 200 | 401),
                "a key of its own window: {r}"
            );
            Ok((r.status == 200).then_some(()))
        }
    })
    .await
    .unwrap();
    gw.clear_calls().await.unwrap();
    for _ in 0..3 {
        let still = gw.chat("chat").await.unwrap();
        if let Some(problem) = openai_error_problem(&still, 429, "budget_exceeded") {
            panic!("after the restart: {problem}\n{}", gw.cp.tail());
        }
        retry_after(&still, 86_400);
    }
    assert!(
        gw.provider_calls().await.unwrap().is_empty(),
        "a refused call reached a provider"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_cost_budget_warns_then_refuses_by_the_priced_usage() {
    // m1 at 1,000 per million tokens either way: a call of 60 + 60 tokens costs 0.12.
    let gw = Gateway::start_with("budget_hard_cost", |p1, p2| {
        with_budgets(
            "  - { name: key-cost, scope: key, window: day, limits: { maxCost: 0.2 }, enforcement: hard, warnAt: 0.5 }\n",
        )(p1, p2)
        .replace(
            "- { id: m1, aliases: [chat] }",
            "- { id: m1, aliases: [chat], cost: { input: 1000, output: 1000 } }",
        )
    })
    .await
    .expect("fixture");
    let mut events = gw
        .cp
        .events(&gw.admin_token, "?types=budget")
        .await
        .unwrap();

    // 0.12 of 0.2: past warnAt (0.1), under the limit; the tokens alone would never count.
    gw.script_usage(60, 60).await.unwrap();
    let first = chat_until(&gw, None, "the first call", |r| r.status == 200).await;
    assert_eq!(warning(&first), None, "nothing spent before it: {first}");
    gw.script_usage(0, 0).await.unwrap();
    let warned = chat_until(&gw, None, "the cost warning to be pushed", |r| {
        warning(r).is_some()
    })
    .await;
    assert_eq!(warned.status, 200, "{warned}");
    assert_eq!(warning(&warned).as_deref(), Some("key-cost=warn"));
    let event = next_event(&mut events).await;
    assert_eq!(
        (event["budget"].as_str(), event["level"].as_str()),
        (Some("key-cost"), Some("warn")),
        "{event}"
    );

    // The second priced call crosses 0.2 (0.24): answered, then the key is refused.
    let refused = cross_the_limit(&gw).await;
    if let Some(problem) = openai_error_problem(&refused, 429, "budget_exceeded") {
        panic!("past the hard cost limit: {problem}");
    }
    retry_after(&refused, 86_400);
    let over = next_event(&mut events).await;
    assert_eq!(
        (over["budget"].as_str(), over["level"].as_str()),
        (Some("key-cost"), Some("over")),
        "{over}"
    );
    gw.clear_calls().await.unwrap();
    let again = gw.chat("chat").await.unwrap();
    assert_eq!(again.status, 429, "{again}");
    assert!(gw.provider_calls().await.unwrap().is_empty());
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_reports_no_usage_is_counted_at_the_estimate_against_a_hard_budget() {
    // 40 tokens a day per key; the providers answer about 150 tokens of text and report no
    // usage at all (no `usage` object, no usage chunk in a stream), as some OpenAI-compatible
    // servers do. Each such answer counts at the gateway's estimate, marked `estimated`; the
    // polls in between report a usage of 0, so only the estimate can spend the budget.
    let gw = Gateway::start_with(
        "budget_no_usage",
        with_budgets(
            "  - { name: key-day, scope: key, window: day, limits: { maxTokens: 40 }, enforcement: hard }\n",
        ),
    )
    .await
    .expect("fixture");
    let mut events = gw
        .cp
        .events(&gw.admin_token, "?types=attempt")
        .await
        .unwrap();
    let other = create_key(&gw, "other").await;
    let no_usage = || async {
        let reply = json!({ "text": "word ".repeat(120).trim_end(), "noUsage": true });
        for mock in [&gw.mock1, &gw.mock2] {
            mock.script(json!([ai_router_e2e::script::always(vec![reply.clone()])]))
                .await
                .unwrap();
        }
    };

    // Unary: the answer carries no usage; once its estimate is pushed the key is refused.
    no_usage().await;
    let first = chat_until(&gw, None, "the first call", |r| r.status == 200).await;
    assert!(
        first.json.get("usage").is_none_or(Value::is_null),
        "{first}"
    );
    gw.script_usage(0, 0).await.unwrap();
    let refused = chat_until(&gw, None, "the estimate to spend the budget", |r| {
        r.status == 429
    })
    .await;
    if let Some(problem) = openai_error_problem(&refused, 429, "budget_exceeded") {
        panic!("past the hard limit by estimate: {problem}");
    }
    let counted = tokio::time::timeout(PUSH, async {
        loop {
            let (_, event) = events.recv().await.expect("the event stream ended");
            if event["usageSource"] == "estimated" {
                return event;
            }
        }
    })
    .await
    .expect("an attempt event with estimated usage");
    let completion = counted["usage"]["completionTokens"].as_u64().unwrap_or(0);
    assert!(
        (120..=200).contains(&completion),
        "about 150 tokens of text: {counted}"
    );

    // A stream without its usage chunk counts the same way, for the other key.
    no_usage().await;
    let s = poll("the other key's stream", PUSH, || {
        let c = gw.client.clone();
        let key = other.clone();
        async move {
            let s = c.stream("chat", Some(&key)).await?;
            Ok((s.status == 200).then_some(s))
        }
    })
    .await
    .unwrap();
    assert!(
        !s.body.contains("\"usage\":{"),
        "no usage chunk: {}",
        s.body
    );
    gw.script_usage(0, 0).await.unwrap();
    let refused = chat_until(
        &gw,
        Some(&other),
        "the stream's estimate to be counted",
        |r| r.status == 429,
    )
    .await;
    if let Some(problem) = openai_error_problem(&refused, 429, "budget_exceeded") {
        panic!("past the hard limit by a stream's estimate: {problem}");
    }
    gw.check_no_secrets_in_logs().unwrap();
}
