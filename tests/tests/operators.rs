//! What an operator does to a running gateway, through a real Envoy: `POST /admin/reset` (and
//! `ai-router reset`) brings a blacklisted key back at once, Envoy's own holds included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt as _;

use ai_router_e2e::{poll, script, Gateway};
use serde_json::{json, Value};

/// `ai-router <args> --url <admin API>` with the fixture's admin token.
async fn run_cli(gw: &Gateway, args: &[&str]) -> (bool, Value, String) {
    let url = format!("http://{}", gw.cp.http_addr());
    let args = [args, &["--url", &url]].concat();
    ai_router_e2e::run_cli(&args, &[("AI_ROUTER_ADMIN_TOKEN", &gw.admin_token)])
        .await
        .unwrap()
}

async fn post_reset(gw: &Gateway, body: Value) -> (u16, Value) {
    let r = gw.admin().post("/admin/reset", &body).await.unwrap();
    (r.status, r.json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_brings_a_refused_key_back_at_once() {
    let gw = Gateway::start("operator_reset").await.expect("fixture");
    // p2's only key is refused: it is blacklisted until its secret changes, by the control
    // plane and by Envoy's own hold.
    gw.mock2
        .script(json!([script::always(vec![script::status(
            401,
            json!({}),
            Some(json!({
                "error": { "message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, "code": "invalid_api_key" }
            }))
        )])]))
        .await
        .unwrap();
    let r = gw
        .client
        .chat("backup", Some(&gw.virtual_key))
        .await
        .unwrap();
    assert!(r.status >= 400, "the refused key fails the call: {r}");
    gw.mock2
        .script(json!([script::always(vec![script::text("from c")])]))
        .await
        .unwrap();
    gw.mock2.clear_calls().await.unwrap();
    let r = gw
        .client
        .chat("backup", Some(&gw.virtual_key))
        .await
        .unwrap();
    assert!(r.status >= 400, "the key stays out: {r}");
    assert!(
        gw.mock2.calls().await.unwrap().is_empty(),
        "no call reaches a blacklisted key"
    );

    // Refused: a key without its provider, an unknown provider or key.
    let (status, body) = post_reset(&gw, json!({ "key": "c" })).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let (status, body) = post_reset(&gw, json!({ "provider": "nope" })).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, body) = post_reset(&gw, json!({ "provider": "p2", "key": "zz" })).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );

    // `ai-router events` prints the reset's event as one JSON line.
    let mut events = tokio::process::Command::new(ai_router_e2e::ai_router_bin().unwrap())
        .args(["events", "--types", "key-restored", "--url"])
        .arg(format!("http://{}", gw.cp.http_addr()))
        .env_clear()
        .env("AI_ROUTER_ADMIN_TOKEN", &gw.admin_token)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(events.stdout.take().unwrap()).lines();
    // Subscribed once the control plane counts it (the stream is open).
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The reset lifts it everywhere at once: well within the 5 s in which Envoy's own hold
    // would otherwise still speak for the control plane.
    let started = Instant::now();
    let (status, body) = post_reset(&gw, json!({ "provider": "p2", "key": "c" })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reset"]["blacklists"], 1, "{body}");
    let r = poll("the reset key to serve", Duration::from_secs(1), || {
        let c = gw.client.clone();
        let key = gw.virtual_key.clone();
        async move {
            let r = c.chat("backup", Some(&key)).await?;
            Ok((r.status == 200).then_some(r))
        }
    })
    .await
    .unwrap();
    assert_eq!(r.content(), Some("from c"), "{r}");
    assert!(started.elapsed() < Duration::from_secs(1));
    let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
        .await
        .expect("an event line")
        .unwrap()
        .expect("a line");
    let event: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (
            event["type"].as_str(),
            event["provider"].as_str(),
            event["key"].as_str(),
            event["reason"].as_str()
        ),
        (Some("key-restored"), Some("p2"), Some("c"), Some("reset")),
        "{line}"
    );
    events.kill().await.unwrap();

    // The CLI: a reset of everything (nothing left to clear), and a refusal as an error object.
    let (ok, out, text) = run_cli(&gw, &["reset"]).await;
    assert!(ok, "{text}");
    assert_eq!(
        out["reset"],
        json!({ "blacklists": 0, "cooldowns": 0, "breakers": 0, "headroom": 0 }),
        "{text}"
    );
    let (ok, out, text) = run_cli(&gw, &["reset", "--provider", "nope"]).await;
    assert!(!ok, "{text}");
    assert_eq!(out["error"]["code"], "not_found", "{text}");
    gw.check_no_secrets_in_logs().unwrap();
}

/// The next event of a type in `types`, skipping others; panics after 10 s.
async fn next_of(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Value)>,
    types: &[&str],
    seen: &mut Vec<(String, Value)>,
) -> (String, Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {types:?} event within 10 s; seen: {seen:?}"))
            .expect("the event stream ended");
        seen.push(got.clone());
        if types.contains(&got.0.as_str()) {
            return got;
        }
    }
}

/// The next two events of `types` (in `types`' alphabetical order), whichever came first.
async fn two_of(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Value)>,
    types: [&str; 2],
    seen: &mut Vec<(String, Value)>,
) -> [(String, Value); 2] {
    let mut got = [
        next_of(rx, &types, seen).await,
        next_of(rx, &types, seen).await,
    ];
    got.sort_by(|a, b| a.0.cmp(&b.0));
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_subscriber_sees_every_change_in_order() {
    let admin_token = format!("admin-{}", ai_router_e2e::random_hex(32));
    let token = admin_token.clone();
    let pool = ai_router_e2e::Pool::start("operator_events", 1, move |m, dir| {
        let old = format!("sk-file-old-{}", ai_router_e2e::random_hex(24));
        let path = dir.write("key_a.txt", &format!("{old}\n"))?;
        let yaml = format!(
            "gateway: {{ host: 127.0.0.1, port: 0, keyStore: {{ type: memory }}, adminToken: {{ env: AI_ROUTER_ADMIN_TOKEN }} }}\n\
             controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n\
             providers:\n  - id: p1\n    kind: openai-compatible\n    baseUrl: {}\n    keys: [{{ alias: a, file: {} }}]\n    models: [{{ id: m1 }}]\n\
             defaults: {{ maxAttempts: 1, deadlineMs: 5000 }}\n\
             resilience:\n  rateLimitCooldownMs: 300\n  keyBreaker: {{ failureThreshold: 1, cooldownMs: 500, maxCooldownMs: 1000 }}\n  providerBreaker: {{ failureThreshold: 100, cooldownMs: 500, maxCooldownMs: 1000 }}\n  backoff: {{ baseMs: 10, factor: 1, maxMs: 10 }}\n",
            m[0],
            path.display()
        );
        let mut setup = ai_router_e2e::PoolSetup {
            yaml,
            ..Default::default()
        };
        setup.env.push(("AI_ROUTER_ADMIN_TOKEN".into(), token));
        setup.name_secret(&old, "a-old");
        Ok(setup)
    })
    .await
    .expect("fixture");
    let admin = ai_router_e2e::Admin::at(pool.cp.http_addr(), &admin_token).unwrap();
    // A wrong filter is refused; then every type.
    let bad = admin.get("/admin/events?types=nope").await.unwrap();
    assert_eq!(bad.status, 400);
    let mut rx = pool.cp.events(&admin_token, "").await.unwrap();
    let mut seen = Vec::new();
    let script = |steps: Vec<Value>| {
        let mock = &pool.mocks[0];
        async move { mock.script(json!([script::always(steps)])).await.unwrap() }
    };

    // A 429: the attempt and the call, with the class.
    script(vec![json!({ "providerError": "openai.rate_limited" })]).await;
    let r = pool.chat("m1").await.unwrap();
    assert!(r.status >= 400, "{r}");
    // A call's attempt and request events may come in either order (two reports).
    let both = two_of(&mut rx, ["attempt", "request"], &mut seen).await;
    let (attempt, request) = (both[0].1.clone(), both[1].1.clone());
    assert_eq!(
        (both[0].0.as_str(), both[1].0.as_str()),
        ("attempt", "request")
    );
    assert_eq!(
        (
            attempt["provider"].as_str(),
            attempt["key"].as_str(),
            attempt["model"].as_str()
        ),
        (Some("p1"), Some("a"), Some("m1")),
        "{attempt}"
    );
    assert_eq!(attempt["errorClass"], "rate_limit", "{attempt}");
    assert!(attempt["requestId"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(request["outcome"], "error", "{request}");
    assert_eq!(request["errorClass"], "rate_limit", "{request}");
    assert_eq!(request["requestId"], attempt["requestId"]);
    // A failed call names its last attempt's lane.
    assert_eq!(
        (request["provider"].as_str(), request["model"].as_str()),
        (Some("p1"), Some("m1")),
        "{request}"
    );

    // A 503 after the cooldown (its retry-after: 1): the key's breaker opens, turns
    // half-open, and the probe's success closes it.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    script(vec![json!({ "providerError": "openai.server_error" })]).await;
    let r = pool.chat("m1").await.unwrap();
    assert!(r.status >= 500, "{r}");
    let ops = ["breaker", "key-disabled", "key-restored"];
    let (_, e) = next_of(&mut rx, &ops, &mut seen).await;
    assert_eq!(
        (
            e["type"].as_str(),
            e["scope"].as_str(),
            e["from"].as_str(),
            e["to"].as_str()
        ),
        (Some("breaker"), Some("key"), Some("closed"), Some("open")),
        "{e}"
    );
    let (_, e) = next_of(&mut rx, &ops, &mut seen).await;
    assert_eq!(
        (e["from"].as_str(), e["to"].as_str()),
        (Some("open"), Some("half_open")),
        "{e}"
    );
    script(vec![script::text("ok")]).await;
    let r = pool.chat("m1").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    // The probe's success closes the breaker; the call's request event may come first.
    let got = two_of(&mut rx, ["breaker", "request"], &mut seen).await;
    let (e, request) = (&got[0].1, &got[1].1);
    assert_eq!(
        (e["from"].as_str(), e["to"].as_str()),
        (Some("half_open"), Some("closed")),
        "{e}"
    );
    assert_eq!(request["outcome"], "success", "{request}");
    assert_eq!(request["provider"], "p1", "{request}");

    // A 401: the key is out until its secret changes; a new file secret brings it back.
    script(vec![json!({ "providerError": "openai.invalid_key" })]).await;
    let r = pool.chat("m1").await.unwrap();
    assert!(r.status >= 400, "{r}");
    let (_, e) = next_of(&mut rx, &ops, &mut seen).await;
    assert_eq!(
        (e["type"].as_str(), e["reason"].as_str()),
        (Some("key-disabled"), Some("auth")),
        "{e}"
    );
    let new = format!("sk-file-new-{}", ai_router_e2e::random_hex(24));
    pool.dir.write("key_a.txt", &format!("{new}\n")).unwrap();
    let (_, e) = next_of(&mut rx, &ops, &mut seen).await;
    assert_eq!(
        (e["type"].as_str(), e["was"].as_str(), e["reason"].as_str()),
        (Some("key-restored"), Some("auth"), Some("secret_changed")),
        "{e}"
    );

    // Refused again, then reset by the operator. Until Envoy has the new secret (its push
    // follows the event), a call finds the key still out and reaches no provider: call again
    // until one is refused by the provider.
    let mut refused = None;
    for _ in 0..20 {
        let r = pool.chat("m1").await.unwrap();
        assert!(r.status >= 400, "{r}");
        let wait = tokio::time::Instant::now() + Duration::from_millis(500);
        while let Ok(Some(got)) = tokio::time::timeout_at(wait, rx.recv()).await {
            seen.push(got.clone());
            if ops.contains(&got.0.as_str()) {
                refused = Some(got.1);
                break;
            }
        }
        if refused.is_some() {
            break;
        }
    }
    let e = refused.unwrap_or_else(|| panic!("no key-disabled event; seen: {seen:?}"));
    assert_eq!(e["type"], "key-disabled", "{e}");
    let resp = admin
        .post("/admin/reset", &json!({ "provider": "p1", "key": "a" }))
        .await
        .unwrap();
    assert_eq!(resp.status, 200);
    let (_, e) = next_of(&mut rx, &ops, &mut seen).await;
    assert_eq!(
        (e["type"].as_str(), e["reason"].as_str()),
        (Some("key-restored"), Some("reset")),
        "{e}"
    );
    // No secret, no prompt in any event.
    let all = serde_json::to_string(&seen).unwrap();
    assert!(!all.contains("sk-file-"), "a secret in the events");
    assert!(
        !all.contains(&pool.virtual_key),
        "the virtual key in the events"
    );
    assert!(!all.contains("\"content\""), "content in the events");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_catalog_and_health_match_the_pool_and_the_calls() {
    let gw = Gateway::start("operator_stats").await.expect("fixture");
    for m in [&gw.mock1, &gw.mock2] {
        m.script(json!([script::always(vec![script::text("ok")])]))
            .await
            .unwrap();
    }
    for model in ["chat", "chat", "chat", "backup"] {
        let r = gw.client.chat(model, Some(&gw.virtual_key)).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
    }
    // The reports arrive within a second or so.
    let stats = poll(
        "the stats to count 4 calls",
        Duration::from_secs(10),
        || async {
            let s = gw.admin().get_json("/admin/stats").await.unwrap();
            Ok((s["requests"]["chat"]["success"] == 4).then_some(s))
        },
    )
    .await
    .unwrap();
    let lanes = stats["lanes"].as_array().unwrap();
    let attempts = |provider: &str| -> u64 {
        lanes
            .iter()
            .filter(|l| l["provider"] == provider)
            .map(|l| l["attempts"].as_u64().unwrap())
            .sum()
    };
    assert_eq!((attempts("p1"), attempts("p2")), (3, 1), "{stats}");
    assert!(
        lanes.iter().all(|l| l["successes"] == l["attempts"]),
        "{stats}"
    );
    assert!(
        lanes.iter().all(|l| l["promptTokens"].as_u64() > Some(0)),
        "{stats}"
    );

    let catalog = gw.admin().get_json("/admin/catalog").await.unwrap();
    let models = catalog["models"].as_array().unwrap();
    let ids: Vec<&str> = models.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["m1", "m2"], "{catalog}");
    assert_eq!(models[0]["aliases"], json!(["chat"]), "{catalog}");
    assert_eq!(models[0]["servedBy"][0]["provider"], "p1", "{catalog}");
    assert_eq!(catalog["defaults"]["fallbacks"], json!(["m2"]), "{catalog}");

    let health = gw.admin().get_json("/admin/health").await.unwrap();
    assert_eq!(health["status"], "ok", "{health}");
    // Words, not enum numbers; null for "no end"; the budgets section is there.
    for provider in health["providers"].as_array().unwrap() {
        assert!(provider["kind"].is_string(), "{health}");
        for key in provider["keys"].as_array().unwrap() {
            assert_eq!(
                (&key["state"], &key["untilMs"]),
                (&json!("ok"), &Value::Null),
                "{health}"
            );
        }
    }
    assert_eq!(health["budgets"], json!([]), "{health}");
    assert_eq!(
        health["lanes"].as_array().map(Vec::len),
        Some(lanes.len()),
        "{health}"
    );

    // The CLI prints the same catalog.
    let (ok, out, text) = run_cli(&gw, &["catalog"]).await;
    assert!(ok, "{text}");
    assert_eq!(out, catalog);
    // Not on a terminal, the control plane logs JSON lines.
    let logs = gw.cp.logs();
    let lines: Vec<&str> = logs.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for line in lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        // The ready line on stdout ({"grpc":...,"http":...}), else log records.
        assert!(
            v["grpc"].is_string() || (v["level"].is_string() && v["fields"]["message"].is_string()),
            "{line}"
        );
    }
    // No secret anywhere.
    for text in [stats.to_string(), catalog.to_string(), health.to_string()] {
        for secret in [&gw.key_a, &gw.key_b, &gw.key_c, &gw.virtual_key] {
            assert!(
                !text.contains(secret.as_str()),
                "a secret in an admin answer"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_up_lets_a_stream_in_flight_finish_and_takes_no_new_call() {
    let dir = ai_router_e2e::TestDir::new("operator_drain").unwrap();
    let mock = ai_router_e2e::Mock::start(&dir, "mock1").await.unwrap();
    // A stream of ten chunks, 200 ms apart.
    let chunks: Vec<String> = (0..10).map(|i| format!("w{i} ")).collect();
    mock.script(json!([script::always(vec![json!({
        "text": chunks.concat(),
        "stream": { "chunks": chunks, "delayMs": 200 }
    })])]))
    .await
    .unwrap();
    let config = dir
        .write(
            "pool.yaml",
            &format!(
                "gateway: {{ host: 127.0.0.1, port: 0, keyStore: {{ type: memory }} }}\n\
                 controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n\
                 providers:\n  - id: p1\n    kind: openai-compatible\n    baseUrl: {}\n    keys: [{{ alias: a, env: DRAIN_KEY }}]\n    models: [{{ id: m1 }}]\n",
                mock.url()
            ),
        )
        .unwrap();
    let drain_key = format!("sk-drain-{}", ai_router_e2e::random_hex(16));
    let ai_router_e2e::Up {
        child: mut up,
        base,
        key,
        ..
    } = ai_router_e2e::Up::start(
        &config,
        &[("DRAIN_KEY", &drain_key)],
        std::process::Stdio::null(),
    )
    .await
    .unwrap();
    let client = ai_router_e2e::Client::new(&base).unwrap();
    let stream = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move { client.stream("m1", Some(&key)).await })
    };
    // Once the stream is under way (the provider has it), SIGTERM.
    ai_router_e2e::poll(
        "the stream to reach the provider",
        Duration::from_secs(10),
        || async { Ok(mock.calls().await?.iter().any(|c| c.stream).then_some(())) },
    )
    .await
    .unwrap();
    let pid = up.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    // A new call is not taken (the listener is closed)...
    tokio::time::sleep(Duration::from_millis(500)).await;
    let late = client.chat("m1", Some(&key)).await;
    assert!(late.is_err(), "a call after SIGTERM was taken: {late:?}");
    // ...while the stream in flight ends whole.
    let r = stream.await.unwrap().unwrap();
    assert_eq!(r.status, 200);
    assert!(r.transport_error.is_none(), "{:?}", r.transport_error);
    assert_eq!(
        r.events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.body
    );
    assert!(r.body.contains("w9"), "every chunk arrived: {}", r.body);
    let status = tokio::time::timeout(Duration::from_secs(20), up.wait())
        .await
        .expect("up exits after the drain")
        .unwrap();
    assert!(status.success(), "up exited with {status}");
}

/// The admin API on the gateway's own listener: Envoy routes `/admin/` to the control plane,
/// with the same token rules, and the CLI's `--url` works against the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_answers_on_the_gateway_s_listener() {
    let gw = Gateway::start("operator_admin_on_gateway")
        .await
        .expect("fixture");
    let gateway = gw.envoy.base_url();
    let on_gateway = ai_router_e2e::Admin::new(&gateway, None).unwrap();
    let get = |path: &str, token: Option<&str>| {
        let admin = on_gateway.with_token(token);
        let path = path.to_string();
        async move {
            let r = admin.get(&path).await.unwrap();
            (r.status, r.json)
        }
    };
    // Without the token, or with a wrong one: the control plane's own refusals.
    let (status, body) = get("/admin/health", None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "missing_api_key", "{body}");
    let (status, body) = get("/admin/health", Some(&gw.virtual_key)).await;
    assert_eq!(status, 401, "a virtual key is no admin token: {body}");
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    // With it: the same page the control plane's own port answers.
    let (status, health) = get("/admin/health", Some(&gw.admin_token)).await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(
        health["providers"],
        gw.admin().get_json("/admin/health").await.unwrap()["providers"]
    );
    assert_eq!(health["providers"][0]["keys"][0]["state"], "ok", "{health}");
    // The CLI against the gateway's URL.
    let (ok, out, text) = ai_router_e2e::run_cli(
        &["keys", "list", "--url", &gateway],
        &[("AI_ROUTER_ADMIN_TOKEN", &gw.admin_token)],
    )
    .await
    .unwrap();
    assert!(ok, "{text}");
    assert_eq!(out["keys"][0]["mounted"], true, "{out}");
    let (ok, _, text) = ai_router_e2e::run_cli(
        &["keys", "list", "--url", &gateway],
        &[("AI_ROUTER_ADMIN_TOKEN", "wrong")],
    )
    .await
    .unwrap();
    assert!(
        !ok,
        "a wrong token is refused through the gateway too: {text}"
    );
    // Model routes are unchanged next to it.
    let r = gw.client.chat("chat", Some(&gw.virtual_key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
}
