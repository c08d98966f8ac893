//! Per-key quotas through a real Envoy: `requestsPerMinute` is counted by the filter and the
//! request past it is refused before any provider sees it; `tokensPerDay` and `costPerDay` are
//! decided by the control plane from usage, so the call that crosses one succeeds and the
//! next ones get 429 once the block is pushed. Another key is unaffected, and the usage
//! endpoint counts the refusals as `rejected:<code>`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ai_router_e2e::{openai_error_problem, poll, standard_pool, Admin, Gateway, Reply};
use serde_json::{json, Value};

const PUSH: Duration = Duration::from_secs(15);

fn assert_error(reply: &Reply, status: u16, code: &str, what: &str) {
    if let Some(problem) = openai_error_problem(reply, status, code) {
        panic!("{what}: {problem}");
    }
    assert_eq!(
        reply.json["error"]["type"], "rate_limit_error",
        "{what}: {reply}"
    );
}

/// The Retry-After of a 429, checked to be whole seconds in `1..=max`.
fn retry_after(reply: &Reply, max: u64, what: &str) -> u64 {
    let value = reply
        .header("retry-after")
        .unwrap_or_else(|| panic!("{what}: no Retry-After\n{reply}"));
    let seconds: u64 = value
        .parse()
        .unwrap_or_else(|_| panic!("{what}: Retry-After {value:?} is not whole seconds"));
    assert!(
        (1..=max).contains(&seconds),
        "{what}: Retry-After {seconds} not in 1..={max}"
    );
    seconds
}

/// Waits until the usage of `id` counts `outcome` at least `least` times (workers send
/// their outcomes on their own, a few tens of ms apart).
async fn wait_outcome(admin: &Admin, id: &str, outcome: &str, least: u64) -> Value {
    poll(
        &format!("usage of {id} to count {outcome} {least} times"),
        PUSH,
        || {
            let path = format!("/admin/keys/{id}/usage");
            async move {
                let r = admin.get(&path).await?;
                anyhow::ensure!(r.status == 200, "usage: {r}");
                let n = r.json["total"]["outcomes"][outcome].as_u64().unwrap_or(0);
                Ok((n >= least).then_some(r.json))
            }
        },
    )
    .await
    .unwrap()
}

/// Provider calls received by both mocks.
async fn provider_calls(gw: &Gateway) -> usize {
    gw.mock1.calls().await.unwrap().len() + gw.mock2.calls().await.unwrap().len()
}

/// Chats with `key` until a call answers 429 (a block pushed after the crossing call's usage
/// was recorded); every call before it must be a 200.
async fn wait_blocked(gw: &Gateway, key: &str, what: &str) -> Reply {
    poll(what, PUSH, || {
        let c = gw.client.clone();
        let key = key.to_string();
        async move {
            let r = c.chat("chat", Some(&key)).await?;
            match r.status {
                429 => Ok(Some(r)),
                200 => Ok(None),
                _ => anyhow::bail!("expected 200 or 429: {r}"),
            }
        }
    })
    .await
    .unwrap()
}

/// Waits until a key just created is accepted (its push reached the filter).
async fn wait_accepted(gw: &Gateway, key: &str) {
    poll("the created key to be accepted", PUSH, || {
        let c = gw.client.clone();
        let key = key.to_string();
        async move { Ok((c.chat("chat", Some(&key)).await?.status == 200).then_some(())) }
    })
    .await
    .unwrap();
}

/// Sleeps into the next UTC minute when fewer than `needed` remain in this one, so a burst of
/// calls lands in one counting window.
async fn within_one_minute(needed: Duration) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let left = 60_000 - (now % 60_000);
    if left < needed.as_millis() {
        tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap_or(0) + 50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_minute_of_a_mounted_key() {
    // The fixture's key (label e2e, from STARCI_AI_KEY) mounted with a quota.
    let gw = Gateway::start_with("quota_rpm", |p1, p2| {
        format!(
            "{}mountedKeys:\n  - {{ label: e2e, env: STARCI_AI_KEY, profiles: ['*'], models: ['*'], quota: {{ requestsPerMinute: 3 }} }}\n",
            standard_pool(p1, p2)
        )
    })
    .await
    .expect("fixture");
    gw.script_usage(5, 5).await.unwrap();
    let admin = gw.admin();
    let (other_id, other) = admin
        .create_key(
            &json!({ "label": "other", "models": ["*"], "quota": { "requestsPerMinute": 100 } }),
        )
        .await
        .unwrap();
    wait_accepted(&gw, &other).await;
    let keys = admin
        .call(reqwest::Method::GET, "/admin/keys", None)
        .await
        .unwrap();
    let mounted_id = keys.json["keys"]
        .as_array()
        .and_then(|ks| ks.iter().find(|k| k["mounted"] == true))
        .and_then(|k| k["id"].as_str())
        .unwrap_or_else(|| panic!("no mounted key in {keys}"))
        .to_string();

    within_one_minute(Duration::from_secs(20)).await;
    gw.mock1.clear_calls().await.unwrap();
    gw.mock2.clear_calls().await.unwrap();
    for i in 1..=3 {
        let r = gw.chat("chat").await.unwrap();
        assert_eq!(r.status, 200, "call {i} of 3 in the minute: {r}");
    }
    let refused = gw.chat("chat").await.unwrap();
    assert_error(
        &refused,
        429,
        "requests_per_minute_exceeded",
        "the 4th call in the minute",
    );
    retry_after(&refused, 60, "the 4th call in the minute");
    let again = gw.chat("chat").await.unwrap();
    assert_error(
        &again,
        429,
        "requests_per_minute_exceeded",
        "the 5th call in the minute",
    );
    assert_eq!(
        provider_calls(&gw).await,
        3,
        "a refused call must reach no provider"
    );

    // Another key has its own count.
    for _ in 0..4 {
        let r = gw.client.chat("chat", Some(&other)).await.unwrap();
        assert_eq!(r.status, 200, "the other key: {r}");
    }

    let usage = wait_outcome(
        &admin,
        &mounted_id,
        "rejected:requests_per_minute_exceeded",
        2,
    )
    .await;
    assert!(
        usage["total"]["outcomes"]["rejected:requests_per_minute_exceeded"]
            .as_u64()
            .unwrap_or(0)
            >= 2,
        "{usage}"
    );
    let other_usage = admin
        .call(
            reqwest::Method::GET,
            &format!("/admin/keys/{other_id}/usage"),
            None,
        )
        .await
        .unwrap();
    assert!(
        other_usage.json["total"]["outcomes"]
            .get("rejected:requests_per_minute_exceeded")
            .is_none(),
        "{other_usage}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_cost_per_day_block_the_call_after_the_crossing_one() {
    // m1 costs 10 per million tokens in and out: 60 tokens cost 0.0006.
    let gw = Gateway::start_with("quota_tokens_cost", |p1, p2| {
        standard_pool(p1, p2).replace(
            "{ id: m1, aliases: [chat] }",
            "{ id: m1, aliases: [chat], cost: { input: 10, output: 10 } }",
        )
    })
    .await
    .expect("fixture");
    gw.script_usage(30, 30).await.unwrap();
    let admin = gw.admin();
    let (tokens_id, tokens_key) = admin
        .create_key(
            &json!({ "label": "tokens", "models": ["*"], "quota": { "tokensPerDay": 100 } }),
        )
        .await
        .unwrap();
    let (cost_id, cost_key) = admin
        .create_key(&json!({ "label": "cost", "models": ["*"], "quota": { "costPerDay": 0.001 } }))
        .await
        .unwrap();
    let (_, free_key) = admin
        .create_key(&json!({ "label": "free", "models": ["*"] }))
        .await
        .unwrap();

    // The first call (60 tokens, 0.0006) stays under both limits; the second crosses them and
    // still succeeds: usage is counted after a call.
    for (key, what) in [(&tokens_key, "tokensPerDay"), (&cost_key, "costPerDay")] {
        poll(&format!("the {what} key to be accepted"), PUSH, || {
            let c = gw.client.clone();
            let key = key.clone();
            async move { Ok((c.chat("chat", Some(&key)).await?.status == 200).then_some(())) }
        })
        .await
        .unwrap();
        let crossing = gw.client.chat("chat", Some(key)).await.unwrap();
        assert_eq!(crossing.status, 200, "the call crossing {what}: {crossing}");
    }

    let refused = wait_blocked(&gw, &tokens_key, "tokensPerDay to block the key").await;
    assert_error(
        &refused,
        429,
        "tokens_per_day_exceeded",
        "past tokensPerDay",
    );
    retry_after(&refused, 86_400, "past tokensPerDay");
    let refused = wait_blocked(&gw, &cost_key, "costPerDay to block the key").await;
    assert_error(&refused, 429, "cost_per_day_exceeded", "past costPerDay");
    retry_after(&refused, 86_400, "past costPerDay");

    // A blocked key reaches no provider; a key without a quota is unaffected.
    gw.mock1.clear_calls().await.unwrap();
    gw.mock2.clear_calls().await.unwrap();
    let r = gw.client.chat("chat", Some(&tokens_key)).await.unwrap();
    assert_error(&r, 429, "tokens_per_day_exceeded", "a blocked key again");
    assert_eq!(
        provider_calls(&gw).await,
        0,
        "a blocked call reached a provider"
    );
    for _ in 0..3 {
        let r = gw.client.chat("chat", Some(&free_key)).await.unwrap();
        assert_eq!(r.status, 200, "a key without a quota: {r}");
    }

    wait_outcome(&admin, &tokens_id, "rejected:tokens_per_day_exceeded", 1).await;
    wait_outcome(&admin, &cost_id, "rejected:cost_per_day_exceeded", 1).await;

    // Raising the limit lifts the block with the next push.
    let r = admin
        .call(
            reqwest::Method::PATCH,
            &format!("/admin/keys/{tokens_id}"),
            Some(&json!({ "quota": { "tokensPerDay": 1_000_000 } })),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "PATCH: {r}");
    poll("the raised limit to lift the block", PUSH, || {
        let c = gw.client.clone();
        let key = tokens_key.clone();
        async move { Ok((c.chat("chat", Some(&key)).await?.status == 200).then_some(())) }
    })
    .await
    .unwrap();
}

/// A large `requestsPerMinute` admits every call of a burst far below it: each Envoy asks its
/// control plane for a block of the limit (`ai_router_contract::minute::block`) and must be
/// granted it whole. When the control plane capped its grants at 10,000 calls, a block of
/// 100,000 (this limit's) came back short, the filter took the short grant for a spent
/// minute, and calls were refused (429) a few thousand into the minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_far_below_a_large_requests_per_minute_limit_all_passes() {
    const CALLS: usize = 12_000;
    const CONCURRENCY: usize = 16;
    let gw = Gateway::start("quota_rpm_large").await.expect("fixture");
    let (_, key) = gw
        .admin()
        .create_key(
            &json!({ "label": "busy", "models": ["*"], "quota": { "requestsPerMinute": 10_000_000 } }),
        )
        .await
        .unwrap();
    wait_accepted(&gw, &key).await;
    // The burst lands in one minute: the count starts again in the next.
    within_one_minute(Duration::from_secs(20)).await;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers = (0..CONCURRENCY).map(|_| {
        let (c, key, next) = (gw.client.clone(), key.clone(), next.clone());
        tokio::spawn(async move {
            let mut refused = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < CALLS {
                let r = c.chat("chat", Some(&key)).await?;
                if r.status != 200 {
                    refused.push(r.to_string());
                }
            }
            anyhow::Ok(refused)
        })
    });
    let mut refused = Vec::new();
    for w in futures::future::join_all(workers).await {
        refused.extend(w.unwrap().unwrap());
    }
    assert!(
        refused.is_empty(),
        "{} of {CALLS} calls refused under a limit of 10,000,000 a minute; the first: {}",
        refused.len(),
        refused[0]
    );
}
