//! The quota ledger through a real Envoy: `GET /admin/ledger` and `ai-router ledger` show what
//! each billing scope has left, estimated from the calls, anchored by the provider's headers
//! and mined from its 429s, with keys of one scope sharing one budget; a provider's figure
//! ages back to the estimate after the pool's `ledger:` lifetimes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{
    poll, pushed_headroom, random_hex, scan, script, Client, Gateway, Pool, PoolSetup,
};
use serde_json::{json, Value};

/// p1's keys `a` and `b` spend one organization's budget of 10 requests a minute; p2's key
/// `c` has its own, of 100 a day.
fn pool(p1: &str, p2: &str) -> String {
    ai_router_e2e::standard_pool(p1, p2)
        .replace(
            "      - { alias: a, env: P1_KEY_A }\n      - { alias: b, env: P1_KEY_B }\n",
            "      - { alias: a, env: P1_KEY_A, scope: org-1 }\n      - { alias: b, env: P1_KEY_B, scope: org-1 }\n    limits: { rpm: 10, tpd: 100000 }\n",
        )
        .replace(
            "      - { alias: c, env: P2_KEY_C }\n",
            "      - { alias: c, env: P2_KEY_C }\n    limits: { rpd: 100 }\n",
        )
}

async fn ledger(gw: &Gateway) -> Value {
    let resp = gw.admin().get("/admin/ledger").await.unwrap();
    assert_eq!(resp.status, 200);
    resp.json
}

/// Scripts p2 to answer `reply` and makes one call to it.
async fn call_p2(gw: &Gateway, reply: Value) -> ai_router_e2e::Reply {
    gw.mock2
        .script(json!([script::always(vec![reply])]))
        .await
        .unwrap();
    gw.client
        .chat("backup", Some(&gw.virtual_key))
        .await
        .unwrap()
}

/// The ledger once `ready` holds of it (within 5 s).
async fn ledger_when(gw: &Gateway, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    poll(what, Duration::from_secs(5), || {
        let view = ledger(gw);
        let ready = &ready;
        async move {
            let view = view.await;
            Ok(ready(&view).then_some(view))
        }
    })
    .await
    .unwrap()
}

fn scope<'v>(view: &'v Value, provider: &str, scope: &str) -> &'v Value {
    view["providers"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["provider"] == provider))
        .and_then(|p| p["scopes"].as_array())
        .and_then(|ss| ss.iter().find(|s| s["scope"] == scope))
        .unwrap_or_else(|| panic!("no scope {provider}/{scope} in {view}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_counts_per_billing_scope_and_names_every_figure_s_source() {
    let gw = Gateway::start_with("ledger_sources", pool)
        .await
        .expect("fixture");

    // Four calls on p1: both keys serve them (the mock names the key each came with), one
    // budget counts them all.
    for _ in 0..4 {
        let r = gw.client.chat("chat", Some(&gw.virtual_key)).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
    }
    let keys = gw.keys_called().await.unwrap();
    let served = |k: &str| keys.iter().filter(|c| *c == k).count();
    assert!(
        keys.len() == 4 && served("a") >= 1 && served("b") >= 1 && served("a") + served("b") == 4,
        "both keys of org-1 served the four calls: {keys:?}"
    );
    let view = poll(
        "the four calls in the ledger",
        Duration::from_secs(5),
        || {
            let gw = &gw;
            async move {
                let view = ledger(gw).await;
                Ok((scope(&view, "p1", "org-1")["windows"]["rpm"]["used"] == 4).then_some(view))
            }
        },
    )
    .await
    .unwrap();
    let org = scope(&view, "p1", "org-1");
    let aliases: Vec<&Value> = org["keys"]
        .as_array()
        .map(|ks| ks.iter().map(|k| &k["alias"]).collect())
        .unwrap_or_default();
    assert_eq!(aliases, [&json!("a"), &json!("b")], "{org}");
    // One budget: the two keys have none of their own.
    let p1_scopes: Vec<&Value> = view["providers"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["provider"] == "p1"))
        .and_then(|p| p["scopes"].as_array())
        .map(|ss| ss.iter().map(|s| &s["scope"]).collect())
        .unwrap_or_default();
    assert_eq!(p1_scopes, [&json!("org-1")], "{view}");
    assert_eq!(org["state"], "healthy", "{org}");
    let rpm = &org["windows"]["rpm"];
    assert_eq!(
        (rpm["remaining"].as_u64(), rpm["source"].as_str()),
        (Some(6), Some("estimated")),
        "{rpm}"
    );
    assert_eq!(rpm["limitSource"], "config", "{rpm}");
    assert!(
        org["windows"]["tpd"]["used"].as_u64().unwrap_or(0) > 0,
        "{org}"
    );
    assert_eq!(view["providers"][0]["billingScope"], "key", "{view}");

    // p2 says what it has left in its headers: the figure is then reported, counting down.
    let r = call_p2(
        &gw,
        json!({
            "text": "from c",
            "headers": { "x-ratelimit-remaining-requests": "7", "x-ratelimit-remaining-tokens": "900" }
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{r}");
    let view = ledger_when(&gw, "p2's reported headroom", |v| {
        scope(v, "p2", "c")["windows"]["rpm"]["source"] == "reported"
    })
    .await;
    let c = scope(&view, "p2", "c");
    assert_eq!(c["windows"]["rpm"]["remaining"], 7, "{c}");
    assert_eq!(c["windows"]["tpm"]["remaining"], 900, "{c}");
    assert!(c["windows"]["rpm"]["ageMs"].as_i64().is_some(), "{c}");
    // Its daily limit is only estimated: 100 less the one call.
    assert_eq!(c["windows"]["rpd"]["remaining"], 99, "{c}");
    assert_eq!(c["windows"]["rpd"]["source"], "estimated", "{c}");

    // A 429 with retry-after is mined: nothing left until then, and the scope is exhausted.
    let r = call_p2(
        &gw,
        script::status(
            429,
            json!({ "retry-after": "30" }),
            Some(json!({ "error": { "message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded" } })),
        ),
    )
    .await;
    assert!(r.status >= 400, "{r}");
    let view = ledger_when(&gw, "p2's mined refusal", |v| {
        scope(v, "p2", "c")["windows"]["rpm"]["source"] == "mined"
    })
    .await;
    let c = scope(&view, "p2", "c");
    assert_eq!(c["windows"]["rpm"]["remaining"], 0, "{c}");
    assert_eq!(c["state"], "exhausted", "{c}");
    assert!(
        c["untilMs"].as_i64().unwrap_or(0) > view["atMs"].as_i64().unwrap_or(i64::MAX),
        "{c}"
    );
    // The family view: m2's one route is out with its only scope, m1's still serves.
    let family = |name: &str| {
        view["families"]
            .as_array()
            .and_then(|fs| fs.iter().find(|f| f["family"] == name))
            .map(|f| (f["routes"].as_u64(), f["live"].as_u64()))
    };
    assert_eq!(
        family("m1"),
        Some((Some(1), Some(1))),
        "{}",
        view["families"]
    );
    assert_eq!(
        family("m2"),
        Some((Some(1), Some(0))),
        "{}",
        view["families"]
    );

    // The CLI prints the same page.
    let url = format!("http://{}", gw.cp.http_addr());
    let (ok, printed, stderr) = ai_router_e2e::run_cli(
        &["ledger", "--url", &url],
        &[("AI_ROUTER_ADMIN_TOKEN", &gw.admin_token)],
    )
    .await
    .unwrap();
    assert!(ok, "{stderr}");
    assert_eq!(
        scope(&printed, "p1", "org-1")["windows"]["rpm"]["used"],
        4,
        "{printed}"
    );

    // No secret anywhere in it.
    let text = printed.to_string();
    for (name, secret) in [
        ("a", &gw.key_a),
        ("b", &gw.key_b),
        ("c", &gw.key_c),
        ("vk", &gw.virtual_key),
    ] {
        assert!(
            !text.contains(secret.as_str()),
            "secret {name} in the ledger"
        );
    }
    gw.check_no_secrets_in_logs().unwrap();
}

/// p1 alone serves `chat` (no fallback), its two keys in one scope; its answers count the
/// scope's requests down from 10.
fn scarce_pool(p1: &str, p2: &str) -> String {
    pool(p1, p2).replace(
        "defaults:\n  fallbacks: [m2]\n",
        "defaults:\n  allowFallback: false\n",
    )
}

/// Scripts p1 for the reservation tests: the first answer says 10 are left; each later one, a
/// second later (so that all 50 are in flight before any answer comes back), says one less, as
/// a provider would; at 0 it refuses. Makes the first call and waits until Envoy holds its
/// figure.
async fn ten_left(gw: &Gateway) {
    let replies = script::counting_down(10);
    gw.mock1
        .script(json!([script::always(replies)]))
        .await
        .unwrap();
    let r = gw.client.chat("chat", Some(&gw.virtual_key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    // Envoy has the figure once the control plane shows it (pushed in the same update).
    ledger_when(gw, "the reported headroom", |v| {
        scope(v, "p1", "org-1")["windows"]["rpm"]["source"] == "reported"
    })
    .await;
    gw.envoy.wait_for_state_of(&gw.cp).await.unwrap();
    gw.mock1.clear_calls().await.unwrap();
}

/// 50 calls at once, `clients` taking turns.
async fn fifty_at_once(gw: &Gateway, clients: &[&Client]) -> Vec<ai_router_e2e::Reply> {
    let calls = (0..50).map(|i| {
        let c = clients[i % clients.len()].clone();
        let key = gw.virtual_key.clone();
        async move { c.chat("chat", Some(&key)).await.unwrap() }
    });
    futures::future::join_all(calls).await
}

/// What [`ten_left`] promises of 50 calls: at most 10 reached p1, each of them answered, most
/// of the 10 used, and every other call told at once that the pool is rate limited.
async fn at_most_ten_sent(gw: &Gateway, replies: &[ai_router_e2e::Reply]) {
    let sent = gw.mock1.calls().await.unwrap().len();
    let ok = replies.iter().filter(|r| r.status == 200).count();
    assert!(
        sent <= 10,
        "{sent} calls reached a scope with 10 requests left"
    );
    assert_eq!(ok, sent, "every call sent succeeded");
    assert!(ok >= 8, "the scope's requests were used: {ok}");
    for r in replies.iter().filter(|r| r.status != 200) {
        assert!(
            ai_router_e2e::openai_error_problem(r, 503, "pool_rate_limited").is_none(),
            "a call past the headroom is told the pool is rate limited: {r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_calls_never_send_more_than_the_scope_has_left() {
    let gw = Gateway::start_with("ledger_reservations", scarce_pool)
        .await
        .expect("fixture");
    ten_left(&gw).await;
    let replies = fifty_at_once(&gw, &[&gw.client]).await;
    at_most_ten_sent(&gw, &replies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_together_never_send_more_than_the_scope_has_left() {
    let gw = Gateway::start_with("ledger_reservations_two", scarce_pool)
        .await
        .expect("fixture");
    // A second Envoy on the same control plane.
    let envoy2 = gw.another_envoy("envoy2").await.expect("the second Envoy");
    let client2 = Client::new(&envoy2.base_url()).unwrap();
    ten_left(&gw).await;
    // 25 calls through each Envoy, all at once. Both hold the same figure (10 left), each its
    // share (5): together they send 10 at most (api::shares: no overshoot while the figure
    // does not change, and no answer comes back before every call is decided).
    let replies = fifty_at_once(&gw, &[&gw.client, &client2]).await;
    at_most_ten_sent(&gw, &replies).await;
    // Both Envoys sent their part.
    let through = |i: usize| {
        replies
            .iter()
            .enumerate()
            .filter(|(n, r)| n % 2 == i && r.status == 200)
            .count()
    };
    assert!(
        through(0) >= 4 && through(1) >= 4,
        "{} + {}",
        through(0),
        through(1)
    );
}

/// [`scarce_pool`] where p1's scope allows 3 requests a minute (its `limits:`; it never says so
/// in its headers), once Envoy holds the ledger's figure.
async fn three_a_minute(test: &str) -> Gateway {
    three_a_minute_with(test, "").await
}

/// [`three_a_minute`] with `defaults` lines added to the pool.
async fn three_a_minute_with(test: &str, defaults: &str) -> Gateway {
    let gw = Gateway::start_with(test, |p1, p2| {
        scarce_pool(p1, p2)
            .replace("limits: { rpm: 10, tpd: 100000 }", "limits: { rpm: 3 }")
            .replace("defaults:\n", &format!("defaults:\n{defaults}"))
    })
    .await
    .expect("fixture");
    // Envoy holds the ledger's figure once the control plane pushed it.
    ledger_when(&gw, "the ledger's first figure", |v| {
        scope(v, "p1", "org-1")["windows"]["rpm"]["remaining"] == 3
    })
    .await;
    gw.envoy.wait_for_state_of(&gw.cp).await.unwrap();
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_the_ledger_knows_is_kept_before_the_provider_refuses() {
    let gw = three_a_minute("ledger_estimates").await;
    for _ in 0..3 {
        let r = gw.client.chat("chat", Some(&gw.virtual_key)).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
    }
    gw.mock1.clear_calls().await.unwrap();
    let r = gw.client.chat("chat", Some(&gw.virtual_key)).await.unwrap();
    assert!(
        ai_router_e2e::openai_error_problem(&r, 503, "pool_rate_limited").is_none(),
        "the fourth call in the minute is not sent: {r}"
    );
    assert!(
        gw.mock1.calls().await.unwrap().is_empty(),
        "no call reached p1"
    );
    // The control plane counts the three once their reports arrive (each worker sends its
    // own within tens of ms).
    let view = ledger_when(&gw, "the three calls counted", |v| {
        scope(v, "p1", "org-1")["windows"]["rpm"]["remaining"] == 0
    })
    .await;
    let org = scope(&view, "p1", "org-1");
    assert_eq!(org["state"], "exhausted", "{org}");
}

const OR_ADMIN_TOKEN_ENV: &str = "LEDGER_OR_ADMIN_TOKEN";

async fn pool_ledger(pool: &Pool) -> Value {
    pool.admin(OR_ADMIN_TOKEN_ENV)
        .unwrap()
        .get_json("/admin/ledger")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openrouter_s_key_endpoint_reports_the_credit_and_a_spent_key_is_not_chosen() {
    let a = scan::provider_secret("or-a");
    let b = scan::provider_secret("or-b");
    let admin = format!("adm-{}", random_hex(32));
    scan::register(OR_ADMIN_TOKEN_ENV, &admin);
    // Key a has $6 of its $10 left; key b spent its $5.
    let script = json!({
        "keyInfo": {
            "keys": {
                a.clone(): { "limit": 10, "usage": 4 },
                b.clone(): { "limit": 5, "usage": 5, "isFreeTier": true },
            }
        }
    });
    let pool = Pool::start_scripted("ledger_openrouter_credit", &[Some(script)], |m, _| {
        let mut setup = PoolSetup::default();
        for (var, secret, name) in [("OR_A", &a, "a"), ("OR_B", &b, "b")] {
            setup.env.push((var.into(), secret.clone()));
            setup.name_secret(secret, name);
        }
        setup.env.push((OR_ADMIN_TOKEN_ENV.into(), admin.clone()));
        setup.yaml = format!(
            "gateway: {{ host: 127.0.0.1, port: 0, keyStore: {{ type: memory }}, adminToken: {{ env: {OR_ADMIN_TOKEN_ENV} }} }}\n\
             controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n\
             providers:\n\
             \x20 - id: or\n    kind: openrouter\n    baseUrl: {}/api/v1\n\
             \x20   keys: [{{ alias: a, env: OR_A }}, {{ alias: b, env: OR_B }}]\n    models: [{{ id: m-or, aliases: [chat] }}]\n",
            m[0]
        );
        Ok(setup)
    })
    .await
    .expect("fixture");

    // Both keys are asked at start, each with its own bearer token, on `{baseUrl}/key`.
    let view = poll("both keys' credit", Duration::from_secs(10), || async {
        let view = pool_ledger(&pool).await;
        let both = ["a", "b"]
            .iter()
            .all(|k| scope(&view, "or", k)["credit"]["source"] == "reported");
        Ok(both.then_some(view))
    })
    .await
    .unwrap();
    let polls: Vec<String> = pool
        .calls()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.call.path == "/api/v1/key")
        .map(|c| c.key)
        .collect();
    assert!(
        polls.contains(&"a".to_owned()) && polls.contains(&"b".to_owned()),
        "{polls:?}"
    );
    let sa = scope(&view, "or", "a");
    assert_eq!(sa["state"], "healthy", "{sa}");
    assert_eq!(sa["credit"]["remaining"], 6.0, "{sa}");
    assert!(sa["credit"]["ageMs"].as_i64().is_some(), "{sa}");
    let sb = scope(&view, "or", "b");
    assert_eq!(
        (sb["state"].as_str(), sb["reason"].as_str()),
        (Some("exhausted"), Some("no_credit")),
        "{sb}"
    );
    assert_eq!(sb["credit"]["remaining"], 0.0, "{sb}");
    assert_eq!(sb["credit"]["freeTier"], true, "{sb}");

    // Envoy holds the figure once pushed (the next flush): every call goes through key a.
    let admin = pool.admin(OR_ADMIN_TOKEN_ENV).unwrap();
    pool.until_pushed(&admin, "key b's spent credit", |health| {
        pushed_headroom(health, "or", "b")
            .iter()
            .any(|h| h["remainingRequests"] == 0)
    })
    .await
    .unwrap();
    pool.clear_calls().await.unwrap();
    for i in 0..10 {
        let r = pool.chat("chat").await.unwrap();
        assert_eq!(r.status, 200, "call {i}: {r}");
    }
    let chat_keys = pool.chat_keys().await.unwrap();
    assert_eq!(chat_keys.len(), 10, "{chat_keys:?}");
    assert!(chat_keys.iter().all(|k| k == "a"), "{chat_keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_credit_is_known_spent_fails_the_call_fast_as_a_spent_quota() {
    let pool = one_openrouter_key("ledger_openrouter_spent", 10, "").await;
    poll("the spent credit", Duration::from_secs(10), || async {
        let view = pool_ledger(&pool).await;
        Ok((scope(&view, "or", "only")["reason"] == "no_credit").then_some(()))
    })
    .await
    .unwrap();
    // Once the figure is pushed, the call is refused at once as a spent quota (not as a rate
    // limit), and no call reaches the provider.
    poll(
        "the spent figure in Envoy",
        Duration::from_secs(10),
        || async {
            let r = pool.chat("chat").await?;
            anyhow::ensure!(r.status != 200, "the spent key served: {r}");
            Ok(
                ai_router_e2e::openai_error_problem(&r, 503, "pool_quota_exhausted")
                    .is_none()
                    .then_some(r),
            )
        },
    )
    .await
    .unwrap();
    let chats = pool.chat_keys().await.unwrap();
    assert!(chats.is_empty(), "a call reached the spent key: {chats:?}");
}

/// With [`three_a_minute`]'s 3 requests spent: the next call is refused as rate limited
/// before p1, and the ledger counts the 3.
async fn minute_spent(gw: &Gateway) {
    let reached = gw.mock1.calls().await.unwrap().len();
    let r = gw.client.chat("chat", Some(&gw.virtual_key)).await.unwrap();
    assert!(
        ai_router_e2e::openai_error_problem(&r, 503, "pool_rate_limited").is_none(),
        "the scope is spent: {r}"
    );
    assert_eq!(
        gw.mock1.calls().await.unwrap().len(),
        reached,
        "no call reached p1 past the minute's 3"
    );
    let view = ledger(gw).await;
    let org = scope(&view, "p1", "org-1");
    assert_eq!(org["windows"]["rpm"]["used"], 3, "{org}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_failure_gives_its_reservation_back_and_a_refusal_does_not() {
    let gw = three_a_minute("ledger_rollback").await;
    // Two attempts never reach the provider (the connection closes), then it refuses one as
    // invalid (that spent its counter), then it answers.
    let bad_request = script::status(
        400,
        json!({}),
        Some(
            json!({ "error": { "message": "Invalid request", "type": "invalid_request_error", "code": null } }),
        ),
    );
    gw.mock1
        .script(json!([script::always(vec![
            json!({ "error": "network" }),
            json!({ "error": "network" }),
            bad_request,
            script::text("ok"),
        ])]))
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = gw.client.chat("chat", Some(&gw.virtual_key)).await.unwrap();
        statuses.push(r.status);
        // The next call starts once the ledger counted this one (its report is batched), so
        // the control plane's count is checked call by call; what Envoy decides rests on its
        // own sends record, whenever the ledger's figure arrives.
        let counted = statuses.iter().filter(|s| **s == 200 || **s == 400).count();
        ledger_when(&gw, "the call counted", |v| {
            scope(v, "p1", "org-1")["windows"]["rpm"]["used"] == counted
        })
        .await;
    }
    // The network failures gave their reservations back, the 400 kept its own: of the 3
    // requests of the minute, the 400 and two answers. Without the rollback none would be left
    // for an answer; with a rollback of the 400 a third would pass.
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(ok, 2, "{statuses:?}");
    assert!(statuses.contains(&400), "{statuses:?}");
    minute_spent(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_attempt_gives_its_reservation_back() {
    // Each attempt has 1 s (`defaults.timeoutMs`); the first two answers come after 5 s.
    let gw = three_a_minute_with("ledger_rollback_timeout", "  timeoutMs: 1000\n").await;
    let late = json!({ "text": "too late", "latencyMs": 5_000 });
    gw.mock1
        .script(json!([script::always(vec![
            late.clone(),
            late,
            script::text("ok")
        ])]))
        .await
        .unwrap();
    // The first call times out twice, then its third attempt answers.
    let r = gw.client.chat("chat", Some(&gw.virtual_key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(
        gw.mock1.calls().await.unwrap().len(),
        3,
        "two attempts timed out, the third answered"
    );
    let mut statuses = vec![r.status];
    ledger_when(&gw, "the first call counted", |v| {
        scope(v, "p1", "org-1")["windows"]["rpm"]["used"] == 1
    })
    .await;
    for n in 2..=3 {
        let r = gw.client.chat("chat", Some(&gw.virtual_key)).await.unwrap();
        statuses.push(r.status);
        // As in the network case: the next call starts once the ledger counted this one.
        ledger_when(&gw, "the call counted", |v| {
            scope(v, "p1", "org-1")["windows"]["rpm"]["used"] == n
        })
        .await;
    }
    // The timed-out attempts gave their reservations back: of the 3 requests of the minute,
    // three answers. Without the rollback the first call alone would have spent all three.
    assert_eq!(statuses, [200, 200, 200]);
    assert_eq!(
        gw.mock1.calls().await.unwrap().len(),
        5,
        "two timed out, three answered"
    );
    minute_spent(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_named_only_in_a_429_body_is_mined_until_then() {
    // p2 is Gemini: its 429 says how long to wait in the body alone (RetryInfo retryDelay 21s,
    // no retry-after header).
    let gw = Gateway::start_with("ledger_mined_body", |p1, p2| {
        pool(p1, p2).replace(
            &format!("kind: openai-compatible\n    baseUrl: {p2}\n"),
            &format!("kind: gemini\n    baseUrl: {p2}\n"),
        )
    })
    .await
    .expect("fixture");
    let r = call_p2(&gw, script::provider_error("gemini.rate_limited")).await;
    assert!(r.status >= 400, "{r}");
    let view = ledger_when(&gw, "p2's mined refusal", |v| {
        scope(v, "p2", "c")["windows"]["rpm"]["source"] == "mined"
    })
    .await;
    let c = scope(&view, "p2", "c");
    let at = view["atMs"].as_i64().unwrap_or(0);
    let until = c["windows"]["rpm"]["resetsAtMs"].as_i64().unwrap_or(0);
    assert_eq!(c["windows"]["rpm"]["remaining"], 0, "{c}");
    assert_eq!(c["state"], "exhausted", "{c}");
    // The body's 21 s, not the minute a refusal without a wait stands for.
    assert!(
        (at + 10_000..=at + 25_000).contains(&until),
        "mined until {} ms from now: {c}",
        until - at
    );
}

/// p2 knows its limits (20 a minute, 100 a day), and the pool holds a reported figure 3 s and
/// a mined one 4 s.
fn short_lived_pool(p1: &str, p2: &str) -> String {
    let pool = pool(p1, p2).replace("limits: { rpd: 100 }", "limits: { rpm: 20, rpd: 100 }");
    format!("ledger: {{ reportedTtlMs: 3000, minedTtlMs: 4000 }}\n{pool}")
}

/// Waits until p2's rpm window shows `source`; returns it and the view's instant.
async fn p2_rpm_when(gw: &Gateway, source: &str, within: Duration) -> (Value, i64) {
    let view = poll(&format!("p2's rpm figure {source}"), within, || {
        let view = ledger(gw);
        async move {
            let view = view.await;
            let ready = scope(&view, "p2", "c")["windows"]["rpm"]["source"] == source;
            Ok(ready.then_some(view))
        }
    })
    .await
    .unwrap();
    let at = view["atMs"].as_i64().unwrap_or(0);
    (scope(&view, "p2", "c")["windows"]["rpm"].clone(), at)
}

/// Waits until p2's rpm figure is of `source` with `remaining` left and younger than
/// `lifetime_ms`, then until it is `estimated` again, no sooner than `lifetime_ms` after it
/// was anchored (and well before its 30 s reset); returns the estimate.
async fn stands_then_ages(gw: &Gateway, source: &str, remaining: u64, lifetime_ms: i64) -> Value {
    let (rpm, at) = p2_rpm_when(gw, source, Duration::from_secs(5)).await;
    assert_eq!(rpm["remaining"].as_u64(), Some(remaining), "{rpm}");
    let age = rpm["ageMs"].as_i64().unwrap_or(-1);
    assert!(
        (0..lifetime_ms).contains(&age),
        "a {source} figure {age} ms old: {rpm}"
    );
    let anchored_at = at - age;
    let (rpm, at) = p2_rpm_when(gw, "estimated", Duration::from_secs(15)).await;
    let stood = at - anchored_at;
    assert!(
        (lifetime_ms..30_000).contains(&stood),
        "the {source} figure stood {stood} ms, its lifetime is {lifetime_ms}"
    );
    rpm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_and_mined_figures_age_back_to_the_estimate_after_their_lifetimes() {
    let gw = Gateway::start_with("ledger_ageing", short_lived_pool)
        .await
        .expect("fixture");
    // Anchored from the headers: reported, with its age, within its lifetime.
    let r = call_p2(
        &gw,
        json!({ "text": "from c", "headers": { "x-ratelimit-remaining-requests": "7" } }),
    )
    .await;
    assert_eq!(r.status, 200, "{r}");
    let rpm = stands_then_ages(&gw, "reported", 7, 3_000).await;
    // 20 a minute less the one call, by local count.
    assert_eq!(
        (rpm["remaining"].as_u64(), rpm["ageMs"].as_i64()),
        (Some(19), Some(0)),
        "{rpm}"
    );

    // Mined from a 429 (retry-after 30 s): nothing left, and it stands its 4 s, not the 30.
    let r = call_p2(
        &gw,
        script::status(
            429,
            json!({ "retry-after": "30" }),
            Some(json!({ "error": { "message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded" } })),
        ),
    )
    .await;
    assert!(r.status >= 400, "{r}");
    let rpm = stands_then_ages(&gw, "mined", 0, 4_000).await;
    // The refused call counted too (it reached the provider).
    assert_eq!(rpm["remaining"].as_u64(), Some(18), "{rpm}");
}

/// An OpenRouter pool of one key, `only`, whose credit endpoint says `usage` of its $10 is
/// spent; `extra` is appended to the pool's YAML.
async fn one_openrouter_key(test: &str, usage: u32, extra: &str) -> Pool {
    let only = scan::provider_secret("or-only");
    let admin = format!("adm-{}", random_hex(32));
    scan::register(OR_ADMIN_TOKEN_ENV, &admin);
    let script =
        json!({ "keyInfo": { "keys": { only.clone(): { "limit": 10, "usage": usage } } } });
    Pool::start_scripted(test, &[Some(script)], |m, _| {
        let mut setup = PoolSetup::default();
        setup.env.push(("OR_ONLY".into(), only.clone()));
        setup.name_secret(&only, "only");
        setup.env.push((OR_ADMIN_TOKEN_ENV.into(), admin.clone()));
        setup.yaml = format!(
            "gateway: {{ host: 127.0.0.1, port: 0, keyStore: {{ type: memory }}, adminToken: {{ env: {OR_ADMIN_TOKEN_ENV} }} }}\n\
             controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n\
             providers:\n\
             \x20 - id: or\n    kind: openrouter\n    baseUrl: {}/api/v1\n\
             \x20   keys: [{{ alias: only, env: OR_ONLY }}]\n    models: [{{ id: m-or, aliases: [chat] }}]\n{extra}",
            m[0]
        );
        Ok(setup)
    })
    .await
    .expect("fixture")
}

/// An OpenRouter pool whose only key answers 402 and whose credit endpoint says `usage` of
/// its $10 is spent: every call answers at once with the quota error.
async fn only_key_refused(test: &str, usage: u32) {
    let pool = one_openrouter_key(test, usage, "defaults: { deadlineMs: 20000 }\n").await;
    pool.mocks[0]
        .script(json!([script::always(vec![script::provider_error(
            "openrouter.quota_exhausted"
        )])]))
        .await
        .unwrap();
    // The refusal itself, then calls with no lane left: each answers at once, with the quota
    // error and when to come back, and never reaches the provider again.
    let mut took = Vec::new();
    for i in 0..4 {
        let started = std::time::Instant::now();
        let r = pool.chat("chat").await.unwrap();
        took.push(started.elapsed());
        if let Some(problem) = ai_router_e2e::openai_error_problem(&r, 503, "pool_quota_exhausted")
        {
            panic!("call {i}: {problem}");
        }
        let retry_after = r.header("retry-after").and_then(|v| v.parse::<u64>().ok());
        assert!(
            retry_after.is_some_and(|s| s >= 1),
            "call {i}: no Retry-After: {r}"
        );
        if i == 1 {
            // The ledger asks the key's credit again soon after a 402: a call while that is
            // pending fails as fast.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
        }
    }
    assert!(
        took.iter().all(|t| *t < Duration::from_secs(3)),
        "a call waited instead of failing fast: {took:?}"
    );
    let chats = pool.chat_keys().await.unwrap();
    assert!(
        chats.len() <= 1,
        "one attempt at most reached the provider: {chats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_402_on_the_only_key_the_next_calls_fail_fast_with_the_quota_error() {
    // The credit endpoint says there is credit: the 402 alone puts the key out.
    only_key_refused("ledger_after_402", 4).await;
}
