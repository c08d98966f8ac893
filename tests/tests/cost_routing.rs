//! Cost-aware routing and rules through a real Envoy, with mock providers priced differently:
//! `autoSort` (cheapest lane first, then on to the next on failure; `x-ai-router-cost`; the
//! saving in stats and usage rows), snap-back to the cheapest lane (`resetIntervalMs`) under a
//! steady load, `autoPrice` from the bundled table (with `discount`, an unknown model left
//! unpriced, `ai-router prices`), `routes:` rules by header and by body metadata within the
//! key's scope, and conditional candidates (`when`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::script::down;
use ai_router_e2e::{poll, random_hex, script, Pool, PoolSetup, Reply};
use serde_json::{json, Value};

const ADMIN_TOKEN_ENV: &str = "COST_ADMIN_TOKEN";

/// The pool header with an admin token (for catalog, stats and usage).
fn header(setup: &mut PoolSetup) -> String {
    setup
        .env
        .push((ADMIN_TOKEN_ENV.into(), format!("adm-{}", random_hex(32))));
    format!(
        "gateway: {{ host: 127.0.0.1, port: 0, keyStore: {{ type: memory }}, adminToken: {{ env: {ADMIN_TOKEN_ENV} }} }}\n\
         controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n"
    )
}

/// Breakers that never open in these tests (so only the feature under test keeps a lane out)
/// and a short backoff.
const NO_BREAKERS: &str = "resilience:\n  backoff: { baseMs: 5, factor: 1, maxMs: 5 }\n  keyBreaker: { failureThreshold: 100000, cooldownMs: 1000, maxCooldownMs: 2000 }\n  providerBreaker: { failureThreshold: 100000, cooldownMs: 1000, maxCooldownMs: 2000 }\n";

/// The control plane's admin API with the pool's admin token.
fn admin_api(pool: &Pool) -> ai_router_e2e::Admin {
    pool.admin(ADMIN_TOKEN_ENV).unwrap()
}

/// A provider secret the control plane was given.
fn var(pool: &Pool, name: &str) -> String {
    pool.control_plane_var(name).unwrap().to_string()
}

/// Every call with the key in `var` gets `reply`.
async fn fail_key(pool: &Pool, var_name: &str, reply: Value) {
    let secret = var(pool, var_name);
    pool.mocks[0]
        .script(json!([script::for_key(&secret, vec![reply])]))
        .await
        .unwrap();
}

fn rate_limited() -> Value {
    script::status(
        429,
        json!({"retry-after": "30"}),
        Some(
            json!({"error": {"message": "slow down", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
        ),
    )
}

/// The keys one call tried, and its answer.
async fn call(pool: &Pool, body: &Value) -> (Reply, Vec<String>) {
    pool.clear_calls().await.unwrap();
    let r = pool.chat_with(body).await.unwrap();
    let keys = pool.keys_called().await.unwrap();
    (r, keys)
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 50})
}

/// The cost of an answer at a price per million tokens, from the usage it reports.
fn cost_of(r: &Reply, input: f64, output: f64) -> f64 {
    let u = &r.json["usage"];
    let (p, c) = (
        u["prompt_tokens"].as_f64().unwrap(),
        u["completion_tokens"].as_f64().unwrap(),
    );
    (p * input + c * output) / 1e6
}

fn cost_header(r: &Reply) -> f64 {
    r.header("x-ai-router-cost")
        .unwrap_or_else(|| panic!("no x-ai-router-cost:\n{r}"))
        .parse()
        .unwrap()
}

/// `dear` (10/30 per million) is listed first, `cheap` (1/2) second; both serve `m` as `chat`.
fn priced_pool(mock: &str, extra: &str) -> PoolSetup {
    let mut setup = PoolSetup::default();
    setup.secret_env("CR_DEAR", "dear");
    setup.secret_env("CR_CHEAP", "cheap");
    setup.yaml = format!(
        "{}providers:\n  - id: dear\n    baseUrl: {mock}/dear/v1\n    keys: [{{ alias: d, env: CR_DEAR }}]\n    models: [{{ id: m, aliases: [chat], cost: {{ input: 10, output: 30 }} }}]\n  - id: cheap\n    baseUrl: {mock}/cheap/v1\n    keys: [{{ alias: c, env: CR_CHEAP }}]\n    models: [{{ id: m, aliases: [chat], cost: {{ input: 1, output: 2 }} }}]\n{NO_BREAKERS}{extra}",
        header(&mut setup)
    );
    setup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_sort_tries_the_cheapest_lane_first_moves_on_and_records_the_saving() {
    let pool = Pool::start("cost_autosort", 1, |m, _| {
        Ok(priced_pool(
            &m[0],
            "defaults: { autoSort: true, maxAttempts: 3 }\nprofiles:\n  ordered: { candidates: [{ provider: dear, model: m }, { provider: cheap, model: m }], autoSort: false }\n",
        ))
    })
    .await
    .expect("fixture");

    // A direct call of an alias two providers serve: the cheaper provider first.
    for _ in 0..3 {
        let (r, keys) = call(&pool, &chat("chat")).await;
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(keys, ["cheap"], "{r}");
        let cost = cost_header(&r);
        let want = cost_of(&r, 1.0, 2.0);
        assert!(
            (cost - want).abs() < 1e-9,
            "header {cost}, usage x price {want}\n{r}"
        );
    }
    // A stream's headers go out before its usage: they carry the estimate (the prompt estimate
    // and the request's output bound at the cheap lane's prices) as one, never as the cost,
    // and the usage chunk states the real cost.
    pool.clear_calls().await.unwrap();
    let mut body = chat("chat");
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    let s = pool
        .client
        .stream_with(&body, Some(&pool.virtual_key))
        .await
        .unwrap();
    assert_eq!(s.status, 200, "{}", s.body);
    assert_eq!(pool.keys_called().await.unwrap(), ["cheap"]);
    assert_eq!(
        s.header("x-ai-router-cost"),
        None,
        "a figure the headers cannot know"
    );
    let estimate: f64 = s
        .header("x-ai-router-cost-estimate")
        .unwrap()
        .parse()
        .unwrap();
    let usage = s
        .json_events()
        .into_iter()
        .find_map(|e| e.get("usage").filter(|u| u.is_object()).cloned())
        .unwrap_or_else(|| panic!("no usage chunk: {}", s.body));
    let tokens = |k: &str| usage[k].as_f64().unwrap();
    let real = (tokens("prompt_tokens") + tokens("completion_tokens") * 2.0) / 1e6;
    let stated = usage["cost"]
        .as_f64()
        .unwrap_or_else(|| panic!("no usage.cost: {usage}"));
    assert!(
        (stated - real).abs() < 1e-12,
        "usage.cost {stated}, usage x price {real}"
    );
    assert!(
        estimate >= stated && estimate < 1.0,
        "the estimate {estimate} bounds the cost {stated}"
    );

    // Without autoSort the configured order stays.
    let (r, keys) = call(&pool, &chat("ordered")).await;
    assert_eq!(
        (r.status, keys.as_slice()),
        (200, &["dear".to_string()][..]),
        "{r}"
    );
    assert!(
        (cost_header(&r) - cost_of(&r, 10.0, 30.0)).abs() < 1e-9,
        "{r}"
    );

    // The cheap lane fails: the call moves on to the next one.
    fail_key(&pool, "CR_CHEAP", down()).await;
    let (r, keys) = call(&pool, &chat("chat")).await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(keys, ["cheap", "dear"], "{r}");
    assert_eq!(
        r.header("x-ai-router-attempts").as_deref(),
        Some("2"),
        "{r}"
    );
    assert!(
        (cost_header(&r) - cost_of(&r, 10.0, 30.0)).abs() < 1e-9,
        "{r}"
    );

    // What the three cheap answers saved against the first choice (dear) reaches the stats
    // and the key's usage rows.
    let stats = poll(
        "the saving in /admin/stats",
        Duration::from_secs(10),
        || async {
            let stats = admin_api(&pool).get_json("/admin/stats").await.unwrap();
            let saved = stats["lanes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["provider"] == "cheap")
                .and_then(|l| l["saved"].as_f64())
                .unwrap_or(0.0);
            Ok((saved > 0.0).then_some(stats))
        },
    )
    .await
    .unwrap();
    let lanes = stats["lanes"].as_array().unwrap();
    let dear = lanes.iter().find(|l| l["provider"] == "dear").unwrap();
    assert_eq!(
        dear["saved"].as_f64(),
        Some(0.0),
        "the first choice saves nothing: {stats}"
    );
    let keys = admin_api(&pool).get_json("/admin/keys").await.unwrap();
    let id = keys["keys"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{keys}"))
        .to_string();
    let usage = poll(
        "the saving in the usage rows",
        Duration::from_secs(10),
        || async {
            let usage = admin_api(&pool)
                .get_json(&format!("/admin/keys/{id}/usage"))
                .await
                .unwrap();
            Ok((usage["total"]["saved"].as_f64().unwrap_or(0.0) > 0.0).then_some(usage))
        },
    )
    .await
    .unwrap();
    let saved = usage["total"]["saved"].as_f64().unwrap();
    let cost = usage["total"]["cost"].as_f64().unwrap();
    assert!(
        saved > cost / 10.0,
        "three calls at a tenth of the price: {usage}"
    );
    // No provider secret in any process's log.
    let logs = pool.tails();
    for (name, secret) in pool.control_plane_env() {
        if name.starts_with("CR_") {
            assert!(!logs.contains(secret.as_str()), "{name} in the logs");
        }
    }
}

/// The priced pool with a profile `lcr` (cheapest first, snap-back every `interval_ms`), its
/// cheap lane down.
async fn snap_back_pool(name: &str, interval_ms: u64) -> Pool {
    let pool = Pool::start(name, 1, |m, _| {
        Ok(priced_pool(
            &m[0],
            &format!("profiles:\n  lcr: {{ candidates: [{{ provider: dear, model: m }}, {{ provider: cheap, model: m }}], autoSort: true, resetIntervalMs: {interval_ms}, maxAttempts: 3 }}\n"),
        ))
    })
    .await
    .expect("fixture");
    fail_key(&pool, "CR_CHEAP", down()).await;
    pool
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_cheapest_lane_is_probed_once_per_interval_and_snaps_back() {
    const INTERVAL_MS: u64 = 1000;
    let pool = snap_back_pool("cost_snapback", INTERVAL_MS).await;

    // A steady load while the cheap lane is down: calls are served by dear, and the cheap lane
    // is tried once when it fails, then once per interval for the whole Envoy (its two workers
    // share the parking), not on every call.
    let started = Instant::now();
    let (mut calls, mut cheap_tries) = (0u32, 0u32);
    while started.elapsed() < Duration::from_millis(2 * INTERVAL_MS + 500) {
        let (r, keys) = call(&pool, &chat("lcr")).await;
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(keys.last().map(String::as_str), Some("dear"), "{r}");
        cheap_tries += keys.iter().filter(|k| *k == "cheap").count() as u32;
        calls += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(calls >= 20, "only {calls} calls in the load phase");
    assert!(
        cheap_tries <= 4,
        "{cheap_tries} of {calls} calls tried the parked cheap lane: more than once per interval"
    );
    assert!(cheap_tries >= 1, "the cheap lane was never probed");

    // The cheap lane recovers: within one interval (plus the load's own pace) every call is back
    // on it.
    pool.mocks[0].script(json!([])).await.unwrap();
    let recovered = Instant::now();
    let mut in_a_row = 0;
    while in_a_row < 6 {
        let (r, keys) = call(&pool, &chat("lcr")).await;
        assert_eq!(r.status, 200, "{r}");
        if keys == ["cheap"] {
            in_a_row += 1;
        } else {
            in_a_row = 0;
        }
        assert!(
            recovered.elapsed() < Duration::from_millis(INTERVAL_MS * 3 / 2 + 500),
            "not back on the cheap lane {:?} after it recovered (calls: {keys:?})",
            recovered.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one call of a concurrent load saw: when it started (since the load began), whether
/// the cheap lane answered it.
struct Served {
    started: Duration,
    cheap: bool,
}

/// `clients` concurrent callers, each opening a new connection per call (so the calls spread
/// over Envoy's workers), until `run` has passed.
async fn concurrent_load(pool: &Pool, clients: usize, run: Duration) -> Vec<Served> {
    let base = pool.envoy.base_url();
    let began = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (base, key) = (base.clone(), pool.virtual_key.clone());
        tasks.spawn(async move {
            let mut seen = Vec::new();
            while began.elapsed() < run {
                let started = began.elapsed();
                let client = ai_router_e2e::Client::new(&base).unwrap();
                let r = client.chat_with(&chat("lcr"), Some(&key)).await.unwrap();
                assert_eq!(r.status, 200, "{r}");
                // The cheap lane costs a tenth of the dear one for the same usage.
                let cheap = cost_header(&r) < cost_of(&r, 5.0, 15.0);
                seen.push(Served { started, cheap });
            }
            seen
        });
    }
    let mut all = Vec::new();
    while let Some(done) = tasks.join_next().await {
        all.extend(done.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_concurrent_load_on_two_workers_the_parked_lane_is_probed_once_per_interval_in_all() {
    const INTERVAL_MS: u64 = 500;
    const LOAD_MS: u64 = 4_000;
    let pool = snap_back_pool("cost_snapback_shared", INTERVAL_MS).await;

    // Park the cheap lane (on every worker that has a call on it), then count at the mock what
    // reaches it while a concurrent load runs on Envoy's two workers.
    let _ = concurrent_load(&pool, 4, Duration::from_millis(INTERVAL_MS / 2)).await;
    pool.clear_calls().await.unwrap();
    let load = concurrent_load(&pool, 6, Duration::from_millis(LOAD_MS)).await;
    let keys = pool.keys_called().await.unwrap();
    let probes = keys.iter().filter(|k| *k == "cheap").count() as u64;
    let calls = load.len() as u64;
    eprintln!("{probes} probes of the parked lane in {LOAD_MS} ms ({INTERVAL_MS} ms interval) over {calls} calls");
    assert!(calls >= 40, "only {calls} calls in the load phase");
    assert!(load.iter().all(|s| !s.cheap), "the cheap lane is down");
    // One probe per interval for the whole Envoy (each worker probing on its own makes about
    // twice as many: 16 here), plus one claimed just before the count began and still on its
    // way to the mock.
    let most = LOAD_MS / INTERVAL_MS + 2;
    assert!(
        probes <= most,
        "{probes} probes of the parked cheap lane in {LOAD_MS} ms of {calls} calls: more than one per {INTERVAL_MS} ms interval"
    );
    assert!(
        probes >= 2,
        "the parked lane was probed only {probes} times"
    );

    // The cheap lane recovers: the next probe (at most an interval away) answers, and the calls
    // that start after it, on both workers, snap back.
    pool.mocks[0].script(json!([])).await.unwrap();
    let load = concurrent_load(&pool, 6, Duration::from_millis(3 * INTERVAL_MS + 1_000)).await;
    let settled = Duration::from_millis(INTERVAL_MS + 500);
    let late: Vec<_> = load.iter().filter(|s| s.started >= settled).collect();
    assert!(
        late.len() >= 10,
        "only {} calls after {settled:?}",
        late.len()
    );
    let dear = late.iter().filter(|s| !s.cheap).count();
    let first_cheap = load.iter().filter(|s| s.cheap).map(|s| s.started).min();
    eprintln!("after the recovery: first call on the cheap lane started at {first_cheap:?}");
    assert_eq!(
        dear,
        0,
        "{dear} of {} calls started {settled:?} after the recovery still went to the dear lane",
        late.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_price_fills_known_models_with_discounts_and_leaves_unknown_ones_unpriced() {
    let pool = Pool::start("cost_autoprice", 1, |m, _| {
        let mock = &m[0];
        let mut setup = PoolSetup::default();
        setup.secret_env("CR_P1", "p1");
        setup.secret_env("CR_P2", "p2");
        setup.yaml = format!(
            "{}autoPrice: true\nproviders:\n  - id: p1\n    baseUrl: {mock}/p1/v1\n    keys: [{{ alias: a, env: CR_P1 }}]\n    models: [{{ id: gpt-4o-mini }}, {{ id: house-llama }}, {{ id: gpt-4o, cost: {{ input: 1, output: 1 }} }}, {{ id: gpt-4.1, discount: 0.5 }}]\n  - id: p2\n    baseUrl: {mock}/p2/v1\n    discount: 0.2\n    keys: [{{ alias: b, env: CR_P2 }}]\n    models: [{{ id: openai/gpt-4o-mini }}]\n",
            header(&mut setup)
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let catalog = admin_api(&pool).get_json("/admin/catalog").await.unwrap();
    assert_eq!(catalog["autoPrice"], true, "{catalog}");
    let served = |model: &str, provider: &str| -> Value {
        catalog["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == model)
            .and_then(|m| m["servedBy"].as_array())
            .and_then(|s| s.iter().find(|e| e["provider"] == provider).cloned())
            .unwrap_or_else(|| panic!("{model} on {provider} not in {catalog}"))
    };
    let row = |model: &str, provider: &str| {
        let e = served(model, provider);
        (e["priced"].as_str().unwrap().to_string(), e["cost"].clone())
    };
    let close = |v: &Value, input: f64, output: f64| {
        (v["input"].as_f64().unwrap() - input).abs() < 1e-9
            && (v["output"].as_f64().unwrap() - output).abs() < 1e-9
    };
    let (src, cost) = row("gpt-4o-mini", "p1");
    assert!(src == "table" && close(&cost, 0.15, 0.6), "{src} {cost}");
    // A provider's discount, on an aggregator-style id (its bare part is looked up).
    let (src, cost) = row("openai/gpt-4o-mini", "p2");
    assert!(src == "table" && close(&cost, 0.12, 0.48), "{src} {cost}");
    // A model's own discount; an explicit cost wins; an unknown model stays unpriced.
    let (src, cost) = row("gpt-4.1", "p1");
    assert!(src == "table" && close(&cost, 1.0, 4.0), "{src} {cost}");
    let (src, cost) = row("gpt-4o", "p1");
    assert!(src == "config" && close(&cost, 1.0, 1.0), "{src} {cost}");
    let (src, cost) = row("house-llama", "p1");
    assert_eq!((src.as_str(), &cost), ("unpriced", &Value::Null));

    // The filled price is what the call costs.
    let r = pool.chat_with(&chat("gpt-4o-mini")).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert!(
        (cost_header(&r) - cost_of(&r, 0.15, 0.6)).abs() < 1e-9,
        "{r}"
    );
    let r = pool.chat_with(&chat("house-llama")).await.unwrap();
    assert_eq!(r.header("x-ai-router-cost").as_deref(), Some("0"), "{r}");

    // The table itself, and one row.
    let (ok, out, text) = ai_router_e2e::run_cli(&["prices", "gpt-4o-mini"], &[])
        .await
        .unwrap();
    assert!(ok, "{text}");
    assert_eq!(
        (out["model"].as_str(), out["maker"].as_str()),
        (Some("gpt-4o-mini"), Some("openai")),
        "{out}"
    );
    assert!(
        out["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("https://")),
        "{out}"
    );
    let (ok, out, text) = ai_router_e2e::run_cli(&["prices"], &[]).await.unwrap();
    assert!(
        ok && out["models"]["claude-sonnet-4-5"]["maker"] == "anthropic",
        "{text}"
    );
    let (ok, out, _) = ai_router_e2e::run_cli(&["prices", "house-llama"], &[])
        .await
        .unwrap();
    assert!(!ok, "an unknown model is an error");
    assert_eq!(out["error"]["code"], "model_not_found", "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_choose_the_profile_by_header_and_metadata_by_priority_within_the_keys_scope() {
    let narrow = format!("sk-starci-narrow-{}", random_hex(40));
    let narrow_key = narrow.clone();
    let pool = Pool::start("cost_rules", 1, move |m, _| {
        let mock = &m[0];
        let mut setup = PoolSetup::default();
        setup.secret_env("CR_P1", "p1");
        setup.env.push(("CR_NARROW".into(), narrow_key));
        setup.yaml = format!(
            "{}providers:\n  - id: p1\n    baseUrl: {mock}/p1/v1\n    keys: [{{ alias: a, env: CR_P1 }}]\n    models: [{{ id: m-cheap }}, {{ id: m-code }}, {{ id: m-vip }}]\n\
             profiles:\n  cheap: {{ model: m-cheap }}\n  coding: {{ model: m-code }}\n  vip: {{ model: m-vip }}\n\
             routes:\n\
             \x20 - {{ name: everything-else, priority: 0, match: {{}}, target: {{ profile: cheap }} }}\n\
             \x20 - {{ name: code, priority: 10, match: {{ taskType: code }}, target: {{ profile: coding }} }}\n\
             \x20 - {{ name: vip-code, priority: 20, match: {{ taskType: code, userTier: pro }}, target: {{ profile: vip }} }}\n\
             \x20 - {{ name: switched-off, priority: 99, enabled: false, match: {{}}, target: {{ profile: vip }} }}\n\
             mountedKeys:\n  - {{ label: e2e, env: STARCI_AI_KEY, profiles: ['*'], models: ['*'] }}\n  - {{ label: narrow, env: CR_NARROW, profiles: [cheap, coding], models: [] }}\n",
            header(&mut setup)
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let send = |body: Value, headers: Vec<(&'static str, &'static str)>, key: String| {
        let url = format!("{}/v1/chat/completions", pool.envoy.base_url());
        async move {
            let mut req = ai_router_e2e::http_client()
                .unwrap()
                .post(url)
                .bearer_auth(key)
                .json(&body);
            for (k, v) in headers {
                req = req.header(k, v);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let model = resp
                .headers()
                .get("x-ai-router-model")
                .map(|v| v.to_str().unwrap().to_string());
            let route = resp
                .headers()
                .get("x-ai-router-route")
                .map(|v| v.to_str().unwrap().to_string());
            let text = resp.text().await.unwrap();
            (status, model, route, text)
        }
    };
    let me = pool.virtual_key.clone();
    let routed =
        |model: &str, route: &str| (200u16, Some(model.to_string()), Some(route.to_string()));
    let strip = |(s, m, r, _): (u16, Option<String>, Option<String>, String)| (s, m, r);

    // By header.
    let got = send(
        chat("auto"),
        vec![("x-ai-router-task-type", "code")],
        me.clone(),
    )
    .await;
    assert_eq!(strip(got), routed("m-code", "code"));
    // By the body's metadata; of two matching rules the higher priority wins.
    let mut body = chat("auto");
    body["metadata"] = json!({"task_type": "code", "user_tier": "pro"});
    assert_eq!(
        strip(send(body.clone(), vec![], me.clone()).await),
        routed("m-vip", "vip-code")
    );
    // A header wins over the body's metadata.
    let got = send(
        body.clone(),
        vec![("x-ai-router-task-type", "chat")],
        me.clone(),
    )
    .await;
    assert_eq!(strip(got), routed("m-cheap", "everything-else"));
    // Nothing matches but the catch-all (the disabled rule never does); no model at all too.
    assert_eq!(
        strip(send(chat("auto"), vec![], me.clone()).await),
        routed("m-cheap", "everything-else")
    );
    let no_model = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        strip(send(no_model, vec![], me.clone()).await),
        routed("m-cheap", "everything-else")
    );
    // A request that names a profile is not routed.
    let got = send(
        chat("vip"),
        vec![("x-ai-router-task-type", "code")],
        me.clone(),
    )
    .await;
    assert_eq!(strip(got), (200, Some("m-vip".into()), None));
    // A key bound to cheap and coding: the vip rule is passed over, never granted.
    assert_eq!(
        strip(send(body.clone(), vec![], narrow.clone()).await),
        routed("m-code", "code")
    );
    let (status, _, route, text) = send(chat("vip"), vec![], narrow.clone()).await;
    assert_eq!((status, route), (403, None), "{text}");

    // The catalog lists the rules in the order they are tried.
    let catalog = admin_api(&pool).get_json("/admin/catalog").await.unwrap();
    let names: Vec<&str> = catalog["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["switched-off", "vip-code", "code", "everything-else"],
        "{catalog}"
    );
    assert_eq!(catalog["routes"][0]["enabled"], false);
    assert_eq!(
        catalog["routes"][1]["match"],
        json!({"taskType": "code", "userTier": "pro", "feature": null})
    );
    assert_eq!(catalog["routes"][1]["target"]["profile"], "vip");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_when_step_is_skipped_for_another_failure_and_taken_for_its_own() {
    let pool = Pool::start("cost_when", 1, |m, _| {
        let mock = &m[0];
        let mut setup = PoolSetup::default();
        setup.secret_env("CR_P1", "p1");
        setup.secret_env("CR_P2", "p2");
        setup.yaml = format!(
            "{}providers:\n  - id: p1\n    baseUrl: {mock}/p1/v1\n    keys: [{{ alias: a, env: CR_P1 }}]\n    models: [{{ id: m1 }}]\n  - id: p2\n    baseUrl: {mock}/p2/v1\n    keys: [{{ alias: b, env: CR_P2 }}]\n    models: [{{ id: m2 }}]\n\
             profiles:\n  guarded: {{ candidates: [{{ provider: p1, model: m1 }}, {{ provider: p2, model: m2, when: [rate_limit, timeout] }}], maxAttempts: 2 }}\n{NO_BREAKERS}",
            header(&mut setup)
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    // Healthy: the conditional step is never the first attempt.
    let (r, keys) = call(&pool, &chat("guarded")).await;
    assert_eq!(
        (r.status, keys.as_slice()),
        (200, &["p1".to_string()][..]),
        "{r}"
    );

    // A provider error is not one of its triggers: it is skipped, p1 is tried again.
    fail_key(&pool, "CR_P1", down()).await;
    let (r, keys) = call(&pool, &chat("guarded")).await;
    assert_eq!(keys, ["p1", "p1"], "{r}");
    assert_eq!(r.status, 502, "{r}");

    // A rate limit is: the step is taken.
    fail_key(&pool, "CR_P1", rate_limited()).await;
    let (r, keys) = call(&pool, &chat("guarded")).await;
    assert_eq!(keys, ["p1", "p2"], "{r}");
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m2"), "{r}");

    let catalog = admin_api(&pool).get_json("/admin/catalog").await.unwrap();
    let guarded = catalog["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "guarded")
        .unwrap()
        .clone();
    assert_eq!(
        guarded["candidates"][1][0]["when"],
        json!(["rate_limit", "timeout"]),
        "{guarded}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_cached_anthropic_answer_costs_the_same_in_the_header_stats_metrics_and_usage_rows(
) {
    // Sonnet's prices: 3 per million in, 0.3 for a prompt token read from the cache, 15 out.
    // 10,000 prompt tokens of which 9,000 cached, 100 out: 1,000 x 3 + 9,000 x 0.3 + 100 x 15 =
    // 7,200 per million. Pricing the cached tokens as input would say 31,500 (4.4 times more).
    let pool = Pool::start("cached_price", 1, |m, _| {
        let mut setup = PoolSetup::default();
        setup.secret_env("CR_CLAUDE", "claude");
        setup.yaml = format!(
            "{}providers:\n  - id: claude\n    kind: anthropic\n    baseUrl: {}/claude/v1\n    keys: [{{ alias: k, env: CR_CLAUDE }}]\n    models: [{{ id: sonnet, cost: {{ input: 3, output: 15, cachedInput: 0.3 }} }}]\n",
            header(&mut setup),
            m[0]
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    pool.mocks[0]
        .script(json!([script::always(vec![json!({
            "text": "ok",
            "usage": { "prompt_tokens": 10_000, "completion_tokens": 100, "cached_tokens": 9_000 },
        })])]))
        .await
        .unwrap();
    let want = 0.0072;
    let close = |got: f64| (got - want).abs() < 1e-9;
    let (r, _) = call(&pool, &chat("sonnet")).await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(
        r.json["usage"]["prompt_tokens_details"]["cached_tokens"], 9_000,
        "{r}"
    );
    assert!(close(cost_header(&r)), "x-ai-router-cost: {r}");

    let stats = poll(
        "the call in /admin/stats",
        Duration::from_secs(10),
        || async {
            let stats = admin_api(&pool).get_json("/admin/stats").await.unwrap();
            let cost = stats["lanes"].as_array().and_then(|lanes| {
                lanes
                    .iter()
                    .find(|l| l["provider"] == "claude")
                    .and_then(|l| l["cost"].as_f64())
            });
            Ok(cost.filter(|c| *c > 0.0))
        },
    )
    .await
    .unwrap();
    assert!(close(stats), "stats: {stats}");

    let keys = admin_api(&pool).get_json("/admin/keys").await.unwrap();
    let id = keys["keys"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{keys}"))
        .to_string();
    let rows = poll(
        "the call in the usage rows",
        Duration::from_secs(10),
        || async {
            let usage = admin_api(&pool)
                .get_json(&format!("/admin/keys/{id}/usage"))
                .await
                .unwrap();
            Ok(usage["total"]["cost"].as_f64().filter(|c| *c > 0.0))
        },
    )
    .await
    .unwrap();
    assert!(close(rows), "usage rows: {rows}");

    let metrics = admin_api(&pool).get("/metrics").await.unwrap().text;
    let exported: f64 = metrics
        .lines()
        .find(|l| l.starts_with("ai_router_estimated_cost_total{") && l.contains("claude"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no cost for claude in /metrics:\n{metrics}"));
    assert!(close(exported), "metrics: {exported}");
}
