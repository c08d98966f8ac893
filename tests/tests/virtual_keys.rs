//! Virtual keys issued by the gateway, through a real Envoy: keys created by the admin API or by
//! the CLI on a shared SQLite store reach the filter within a second or two; rotate, disable and
//! revoke take effect the same way; usage counts the calls made through Envoy; the admin API
//! needs the admin token and never shows a secret or a hash (but the one-time secret).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{
    openai_error_problem, poll, script, standard_pool, Admin, ControlPlane, Gateway, Reply, TestDir,
};
use serde_json::{json, Value};

const PUSH: Duration = Duration::from_secs(10);

fn assert_error(reply: &Reply, status: u16, code: &str, what: &str) {
    if let Some(problem) = openai_error_problem(reply, status, code) {
        panic!("{what}: {problem}");
    }
}

/// Waits until a chat with `key` answers `status`.
async fn wait_status(gw: &Gateway, key: &str, status: u16, what: &str) -> Reply {
    wait_status_counting(gw, key, status, what).await.0
}

/// Waits until a chat with `key` answers `status`; also says how many of the calls made on
/// the way were answered 200 (each one counts in the key's usage).
async fn wait_status_counting(gw: &Gateway, key: &str, status: u16, what: &str) -> (Reply, u64) {
    let served = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reply = poll(what, PUSH, || {
        let c = gw.client.clone();
        let key = key.to_string();
        let served = served.clone();
        async move {
            let r = c.chat("chat", Some(&key)).await?;
            if r.status == 200 {
                served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Ok((r.status == status).then_some(r))
        }
    })
    .await
    .unwrap();
    (reply, served.load(std::sync::atomic::Ordering::SeqCst))
}

/// True when `text` holds 64 hex digits in a row (a SHA-256).
fn has_sha256(text: &str) -> bool {
    let mut run = 0;
    for c in text.chars() {
        if c.is_ascii_hexdigit() {
            run += 1;
            if run >= 64 {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// `ai-router keys ...` with `env`; the exit status and the JSON it printed.
async fn run_cli(args: &[&str], env: &[(&str, &str)]) -> (bool, Value, String) {
    ai_router_e2e::run_cli(&[&["keys"], args].concat(), env)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_disable_and_usage_of_an_admin_created_key() {
    let gw = Gateway::start("vk_rotate_disable_usage")
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::text("ok")])]))
        .await
        .unwrap();
    let admin = gw.admin();
    let (id, first) = admin
        .create_key(&json!({ "label": "usage_app", "models": ["*"], "owner": "team-u" }))
        .await
        .unwrap();
    assert!(first.starts_with("sk-starci-usage_app-"), "{first}");

    // Every 200 counts as a request of this key; a 401 never authenticated, so it does not.
    let mut served = 0u64;
    served += wait_status_counting(&gw, &first, 200, "the created key to be accepted")
        .await
        .1;
    for _ in 0..3 {
        let r = gw.client.chat("chat", Some(&first)).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        served += 1;
    }

    // Rotate: same id, a new secret; the old one is refused.
    let r = admin
        .call(
            reqwest::Method::POST,
            &format!("/admin/keys/{id}/rotate"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "rotate: {r}");
    assert_eq!(r.json["key"]["id"], id.as_str(), "{r}");
    let second = r.json["secret"].as_str().expect("secret").to_string();
    assert_ne!(second, first);
    // Calls that still got through before the rotation reached Envoy count too.
    let (refused, through) =
        wait_status_counting(&gw, &first, 401, "the old secret to be refused").await;
    served += through;
    assert_error(&refused, 401, "invalid_api_key", "the rotated-away secret");
    served += wait_status_counting(&gw, &second, 200, "the new secret to be accepted")
        .await
        .1;

    // Disable: 401 until enabled again.
    let r = admin
        .call(
            reqwest::Method::PATCH,
            &format!("/admin/keys/{id}"),
            Some(&json!({ "enabled": false })),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "PATCH: {r}");
    assert_eq!(r.json["enabled"], false, "{r}");
    let (refused, through) =
        wait_status_counting(&gw, &second, 401, "the disabled key to be refused").await;
    served += through;
    assert_error(&refused, 401, "invalid_api_key", "a disabled key");
    let r = admin
        .call(
            reqwest::Method::PATCH,
            &format!("/admin/keys/{id}"),
            Some(&json!({ "enabled": true })),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "PATCH: {r}");
    served += wait_status_counting(&gw, &second, 200, "the enabled key to be accepted again")
        .await
        .1;

    // Usage: the calls made through Envoy, on today's row (UTC) and in the total.
    let usage = poll("usage to count every call", PUSH, || {
        let admin = &admin;
        let id = id.clone();
        async move {
            let r = admin
                .call(
                    reqwest::Method::GET,
                    &format!("/admin/keys/{id}/usage"),
                    None,
                )
                .await
                .unwrap();
            anyhow::ensure!(r.status == 200, "usage: {r}");
            let requests = r.json["total"]["requests"].as_u64().unwrap_or(0);
            Ok((requests >= served).then_some(r))
        }
    })
    .await
    .unwrap();
    let total = &usage.json["total"];
    assert_eq!(total["requests"].as_u64(), Some(served), "{usage}");
    assert_eq!(total["successes"].as_u64(), Some(served), "{usage}");
    assert_eq!(total["failures"].as_u64(), Some(0), "{usage}");
    assert_eq!(
        total["outcomes"]["success"].as_u64(),
        Some(served),
        "{usage}"
    );
    // The mock reports usage on every answer: tokens are counted from the attempts.
    assert!(total["promptTokens"].as_u64().unwrap_or(0) > 0, "{usage}");
    assert!(
        total["completionTokens"].as_u64().unwrap_or(0) > 0,
        "{usage}"
    );
    assert_eq!(
        usage.json["days"].as_array().map(Vec::len),
        Some(1),
        "{usage}"
    );
    assert!(
        usage.json["days"][0]["day"]
            .as_str()
            .is_some_and(|d| d.len() == 10),
        "{usage}"
    );
    // A range before today has no rows.
    let r = admin
        .call(
            reqwest::Method::GET,
            &format!("/admin/keys/{id}/usage?from=2000-01-01&to=2000-01-31"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json["total"]["requests"], 0, "{r}");
    let r = admin
        .call(
            reqwest::Method::GET,
            &format!("/admin/keys/{id}/usage?from=2000-02-30"),
            None,
        )
        .await
        .unwrap();
    assert_error(&r, 400, "invalid_request", "a date that does not exist");

    // Listing: the mounted key and this one, never a secret or a hash.
    let r = admin
        .call(reqwest::Method::GET, "/admin/keys", None)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let keys = r.json["keys"].as_array().cloned().unwrap_or_default();
    let mounted = keys
        .iter()
        .find(|k| k["mounted"] == true)
        .unwrap_or_else(|| panic!("the mounted key is listed: {r}"));
    let ours = keys
        .iter()
        .find(|k| k["id"] == id.as_str())
        .unwrap_or_else(|| panic!("the created key is listed: {r}"));
    assert_eq!(ours["owner"], "team-u", "{r}");
    assert_eq!(ours["hint"], &second[second.len() - 4..], "{r}");
    // A mounted key changes by redeploying.
    let mounted_id = mounted["id"].as_str().unwrap().to_string();
    for (method, path, body) in [
        (
            reqwest::Method::POST,
            format!("/admin/keys/{mounted_id}/revoke"),
            None,
        ),
        (
            reqwest::Method::POST,
            format!("/admin/keys/{mounted_id}/rotate"),
            None,
        ),
        (
            reqwest::Method::PATCH,
            format!("/admin/keys/{mounted_id}"),
            Some(json!({ "enabled": false })),
        ),
    ] {
        let r = admin.call(method, &path, body.as_ref()).await.unwrap();
        assert_error(&r, 409, "key_mounted", &path);
    }
    let r = admin
        .call(
            reqwest::Method::GET,
            "/admin/keys/key_0000000000000000",
            None,
        )
        .await
        .unwrap();
    assert_error(&r, 404, "not_found", "an unknown key");
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "the mounted key still works: {r}");

    // Every body but those of create and rotate (which show the secret once).
    let bodies = admin.bodies();
    for body in bodies.into_iter().filter(|b| !b.contains("\"secret\"")) {
        for secret in [&first, &second, &gw.virtual_key, &gw.admin_token] {
            assert!(!body.contains(secret.as_str()), "a secret in {body}");
        }
        assert!(!has_sha256(&body), "a hash in {body}");
    }
    let logs = format!("{}\n{}", gw.cp.logs(), gw.envoy.logs());
    for secret in [&first, &second] {
        assert!(
            !logs.contains(secret.as_str()),
            "a created key's secret in the logs"
        );
    }
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_created_by_the_cli_on_a_shared_sqlite_store_reach_envoy() {
    let gw = Gateway::start_with("vk_cli_sqlite", |p1, p2| {
        standard_pool(p1, p2).replace(
            "keyStore: { type: memory }",
            "keyStore: { type: sqlite, path: keys.sqlite }",
        )
    })
    .await
    .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::text("ok")])]))
        .await
        .unwrap();
    let config = gw.cp.config_path().display().to_string();
    let env = [
        ("P1_KEY_A", gw.key_a.as_str()),
        ("P1_KEY_B", gw.key_b.as_str()),
        ("P2_KEY_C", gw.key_c.as_str()),
        ("STARCI_AI_KEY", gw.virtual_key.as_str()),
    ];

    // Written by another process while the control plane runs.
    let (ok, created, out) = run_cli(
        &[
            "create", "--label", "cli_app", "--models", "*", "--owner", "ops", "--rpm", "600",
            "--config", &config,
        ],
        &env,
    )
    .await;
    assert!(ok, "keys create: {out}");
    let id = created["key"]["id"].as_str().expect("key.id").to_string();
    let secret = created["secret"].as_str().expect("secret").to_string();
    assert!(secret.starts_with("sk-starci-cli_app-"), "{out}");
    assert_eq!(created["key"]["quota"]["requestsPerMinute"], 600, "{out}");
    wait_status(&gw, &secret, 200, "the CLI-created key to be accepted").await;

    // list / get print no secret or hash; the mounted key is listed too.
    let (ok, list, out) = run_cli(&["list", "--config", &config], &env).await;
    assert!(ok, "keys list: {out}");
    let keys = list["keys"].as_array().cloned().unwrap_or_default();
    assert!(keys.iter().any(|k| k["id"] == id.as_str()), "{out}");
    assert!(keys.iter().any(|k| k["mounted"] == true), "{out}");
    assert!(!out.contains(&secret) && !has_sha256(&out), "{out}");
    let (ok, got, out) = run_cli(&["get", &id, "--config", &config], &env).await;
    assert!(ok && got["owner"] == "ops", "keys get: {out}");

    // The same store through the running control plane.
    let admin_env = [("AI_ROUTER_ADMIN_TOKEN", gw.admin_token.as_str())];
    let url = format!("http://{}", gw.cp.http_addr());
    let (ok, listed, out) = run_cli(&["list", "--url", &url], &admin_env).await;
    assert!(ok, "keys list --url: {out}");
    assert!(
        listed["keys"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k["id"] == id.as_str())),
        "{out}"
    );
    let (ok, err, out) = run_cli(&["list", "--url", &url], &[]).await;
    assert!(!ok && err["error"]["code"] == "missing_api_key", "{out}");

    // Rotate and disable through the CLI: the server picks both up.
    let (ok, rotated, out) = run_cli(&["rotate", &id, "--config", &config], &env).await;
    assert!(ok, "keys rotate: {out}");
    let new_secret = rotated["secret"].as_str().expect("secret").to_string();
    wait_status(&gw, &secret, 401, "the rotated-away secret to be refused").await;
    wait_status(&gw, &new_secret, 200, "the new secret to be accepted").await;
    let (ok, _, out) = run_cli(&["update", &id, "--disabled", "--config", &config], &env).await;
    assert!(ok, "keys update --disabled: {out}");
    wait_status(&gw, &new_secret, 401, "the disabled key to be refused").await;
    let (ok, _, out) = run_cli(&["update", &id, "--enabled", "--config", &config], &env).await;
    assert!(ok, "keys update --enabled: {out}");
    wait_status(&gw, &new_secret, 200, "the enabled key to be accepted").await;

    // Usage written by the server is read by the CLI from the same file.
    let usage = poll("usage in the shared store", PUSH, || {
        let config = config.clone();
        let id = id.clone();
        async move {
            let (ok, usage, out) = run_cli(&["usage", &id, "--config", &config], &env).await;
            anyhow::ensure!(ok, "keys usage: {out}");
            Ok((usage["total"]["requests"].as_u64().unwrap_or(0) >= 3).then_some(usage))
        }
    })
    .await
    .unwrap();
    assert!(
        usage["days"].as_array().is_some_and(|d| !d.is_empty()),
        "{usage}"
    );

    // Revoke through the CLI: 401 within a couple of seconds.
    let (ok, revoked, out) = run_cli(&["revoke", &id, "--config", &config], &env).await;
    assert!(ok && revoked["revoked"] == true, "keys revoke: {out}");
    let r = wait_status(&gw, &new_secret, 401, "the revoked key to be refused").await;
    assert_error(&r, 401, "invalid_api_key", "a revoked key");
    // Mounted keys are refused by the CLI too.
    let mounted_id = keys
        .iter()
        .find(|k| k["mounted"] == true)
        .and_then(|k| k["id"].as_str())
        .unwrap()
        .to_string();
    let (ok, err, out) = run_cli(&["revoke", &mounted_id, "--config", &config], &env).await;
    assert!(!ok && err["error"]["code"] == "key_mounted", "{out}");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_the_admin_token() {
    let gw = Gateway::start("vk_admin_token").await.expect("fixture");
    let admin = gw.admin();
    let r = admin
        .with_token(None)
        .call(reqwest::Method::GET, "/admin/keys", None)
        .await
        .unwrap();
    assert_error(&r, 401, "missing_api_key", "no admin token");
    let r = admin
        .with_token(Some("admin-wrong"))
        .call(
            reqwest::Method::POST,
            "/admin/keys",
            Some(&json!({ "label": "x", "models": ["*"] })),
        )
        .await
        .unwrap();
    assert_error(&r, 401, "invalid_api_key", "a wrong admin token");
    // A virtual key is not an admin token.
    let vk = gw.virtual_key.clone();
    let r = admin
        .with_token(Some(&vk))
        .call(reqwest::Method::GET, "/admin/keys", None)
        .await
        .unwrap();
    assert_error(
        &r,
        401,
        "invalid_api_key",
        "a virtual key as the admin token",
    );
    let r = admin
        .call(
            reqwest::Method::POST,
            "/admin/keys",
            Some(&json!({ "label": "Bad Label", "models": ["*"] })),
        )
        .await
        .unwrap();
    assert_error(&r, 400, "invalid_request", "an invalid label");

    // /health: plain without the token, the pool (aliases only) with it.
    let r = admin
        .with_token(None)
        .call(reqwest::Method::GET, "/health", None)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert!(r.json.get("providers").is_none(), "{r}");
    let r = admin
        .call(reqwest::Method::GET, "/health", None)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let aliases: Vec<&str> = r.json["providers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["keys"].as_array().into_iter().flatten())
        .filter_map(|k| k["alias"].as_str())
        .collect();
    assert_eq!(aliases, ["a", "b", "c"], "{r}");
    assert!(r.json["breakers"].is_array(), "{r}");
    for (name, secret) in gw.secrets() {
        assert!(!r.text.contains(secret), "{name} in /health: {r}");
    }

    // No admin token configured: the admin API is off.
    let dir = TestDir::new("vk_admin_disabled").unwrap();
    let yaml = standard_pool(&gw.mock1.api_base(), &gw.mock2.api_base())
        .replace("  adminToken: { env: AI_ROUTER_ADMIN_TOKEN }\n", "");
    let env = vec![
        ("P1_KEY_A".to_string(), gw.key_a.clone()),
        ("AI_ROUTER_SYNC_TOKEN".to_string(), gw.sync_token.clone()),
    ];
    let cp = ControlPlane::start(&dir, &yaml, &env).await.unwrap();
    let r = Admin::at(cp.http_addr(), &gw.admin_token)
        .unwrap()
        .get("/admin/keys")
        .await
        .unwrap();
    let (status, body) = (r.status, r.json);
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "admin_disabled", "{body}");
}

/// A metric's value in the control plane's `/metrics` text (0 when absent).
async fn metric(gw: &Gateway, line_prefix: &str) -> f64 {
    let text = ai_router_e2e::get_text(&format!("http://{}/metrics", gw.cp.http_addr()))
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoke_among_thousands_of_keys_reaches_envoy_as_a_small_delta() {
    use futures::StreamExt as _;
    const KEYS: usize = 2_000;
    let gw = Gateway::start("vk_sync_delta").await.expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::text("ok")])]))
        .await
        .unwrap();
    let admin = gw.admin();
    let created: Vec<(String, String)> = futures::stream::iter(0..KEYS)
        .map(|i| {
            let admin = &admin;
            async move {
                // Not registered with the secret scan: 2,000 secrets would make it crawl.
                let r = admin
                    .post(
                        "/admin/keys",
                        &json!({ "label": format!("bulk{i}"), "models": ["*"] }),
                    )
                    .await
                    .unwrap();
                assert_eq!(r.status, 201, "POST /admin/keys: {r}");
                let id = r.json["key"]["id"].as_str().expect("key.id").to_string();
                let secret = r.json["secret"].as_str().expect("secret").to_string();
                (id, secret)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let (_, last) = created.last().cloned().unwrap();
    wait_status(&gw, &last, 200, "the last created key to be accepted").await;
    let snapshots = metric(&gw, "ai_router_sync_messages_total{kind=\"snapshot\"}").await;
    assert_eq!(snapshots, 1.0, "one snapshot at connect, then deltas only");

    // Revoke one key: Envoy refuses it within a second, and what crossed the sync channel
    // for it is a delta of a few hundred bytes, not the state of thousands of keys.
    let (id, secret) = created[KEYS / 2].clone();
    let (_, other) = created[KEYS / 3].clone();
    let before = metric(&gw, "ai_router_sync_bytes_total{kind=\"delta\"}").await;
    let sent_deltas = metric(&gw, "ai_router_sync_messages_total{kind=\"delta\"}").await;
    let started = std::time::Instant::now();
    let r = admin
        .call(
            reqwest::Method::POST,
            &format!("/admin/keys/{id}/revoke"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "revoke: {r}");
    let r = poll("the revoked key to be refused", PUSH, || {
        let c = gw.client.clone();
        let secret = secret.clone();
        async move {
            let r = c.chat("chat", Some(&secret)).await?;
            Ok((r.status == 401).then_some(r))
        }
    })
    .await
    .unwrap();
    let took = started.elapsed();
    assert_error(&r, 401, "invalid_api_key", "a revoked key");
    assert!(took < Duration::from_secs(1), "the revoke took {took:?}");
    let deltas = metric(&gw, "ai_router_sync_messages_total{kind=\"delta\"}").await - sent_deltas;
    let bytes = metric(&gw, "ai_router_sync_bytes_total{kind=\"delta\"}").await - before;
    assert!(deltas >= 1.0, "the revoke went out as a delta");
    assert!(
        bytes / deltas < 1_000.0,
        "{bytes} bytes in {deltas} deltas for one revoked key"
    );
    assert_eq!(
        metric(&gw, "ai_router_sync_messages_total{kind=\"snapshot\"}").await,
        1.0
    );
    let r = gw.client.chat("chat", Some(&other)).await.unwrap();
    assert_eq!(r.status, 200, "another key still works: {r}");
}

/// A pool on `mock` whose virtual keys are mounted in every documented form: `{ env: VAR }`,
/// `{ file: PATH }` (relative to the config), `env: OPENAI_API_KEY` (the quick start's export),
/// and `STARCI_AI_KEY_FILE` beside them. With `read_openai`, a second provider takes its keys
/// from `OPENAI` (`keysFromEnv`), as the example pool does.
fn mounted_pool(mock: &str, read_openai: bool) -> String {
    let openai = if read_openai {
        format!(
            "  - id: oa\n    kind: openai-compatible\n    baseUrl: {mock}\n    keysFromEnv: OPENAI\n    models: [{{ id: m1 }}]\n"
        )
    } else {
        String::new()
    };
    format!(
        "gateway: {{ host: 127.0.0.1, port: 0, keyStore: {{ type: memory }} }}\n\
         controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n\
         providers:\n  - id: p1\n    kind: openai-compatible\n    baseUrl: {mock}\n    keys: [{{ alias: a, env: PROVIDER_KEY }}]\n    models: [{{ id: m1 }}]\n{openai}\
         mountedKeys:\n  - {{ label: byenv, env: TEAM_KEY, profiles: ['*'], models: ['*'] }}\n\
         \x20 - {{ label: byfile, file: team.key, models: ['*'] }}\n\
         \x20 - {{ label: quick, env: OPENAI_API_KEY, models: [m1] }}\n"
    )
}

fn mounted_secret(label: &str) -> String {
    let key = format!("sk-starci-{label}-{}", ai_router_e2e::random_hex(48));
    ai_router_e2e::scan::register("a mounted virtual key", &key);
    key
}

/// Every documented form of `mountedKeys` serves calls under `ai-router up` and under
/// `ai-router serve`. `up` refuses gateway keys as provider keys (the quick start exports the
/// app's key as `OPENAI_API_KEY`), and only there: `mountedKeys` still reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounted_keys_in_every_documented_form_serve_under_up_and_under_serve() {
    let dir = TestDir::new("mounted_forms").unwrap();
    let mock = ai_router_e2e::Mock::start(&dir, "mock1").await.unwrap();
    let provider_key = ai_router_e2e::scan::provider_secret("mounted-p1");
    let by_env = mounted_secret("byenv");
    let by_file = mounted_secret("byfile");
    let quick = mounted_secret("quick");
    let app = mounted_secret("app");
    dir.write("team.key", &format!("{by_file}\n")).unwrap();
    let app_file = dir.write("app.key", &format!("{app}\n")).unwrap();
    let app_file = app_file.to_string_lossy().into_owned();
    let env = [
        ("PROVIDER_KEY", provider_key.as_str()),
        ("TEAM_KEY", by_env.as_str()),
        ("OPENAI_API_KEY", quick.as_str()),
        ("STARCI_AI_KEY_FILE", app_file.as_str()),
    ];
    let keys = [&by_env, &by_file, &quick, &app];

    // `up`, with a provider that reads OPENAI_* as the example pool's does.
    let config = dir
        .write("up.yaml", &mounted_pool(mock.url(), true))
        .unwrap();
    let stderr = dir.join("up.stderr");
    let up = ai_router_e2e::Up::start(
        &config,
        &env,
        std::process::Stdio::from(std::fs::File::create(&stderr).unwrap()),
    )
    .await
    .unwrap();
    assert_eq!(up.key, app, "up serves STARCI_AI_KEY_FILE's key");
    let client = ai_router_e2e::Client::new(&up.base).unwrap();
    for key in keys {
        let r = client.chat("m1", Some(key)).await.unwrap();
        assert_eq!(r.status, 200, "under up: {r}");
    }
    let said = std::fs::read_to_string(&stderr).unwrap();
    assert!(
        said.contains("not reading OPENAI_API_KEY as a provider key"),
        "up says which variable it skipped: {said}"
    );
    // No gateway key ever went to a provider.
    let calls = mock.calls().await.unwrap();
    assert_eq!(calls.len(), keys.len());
    assert!(
        calls
            .iter()
            .all(|c| c.key.as_deref() == Some(provider_key.as_str())),
        "{calls:?}"
    );
    drop(up);
    mock.clear_calls().await.unwrap();

    // `serve` + Envoy, on the same forms.
    let sync_token = format!("sync-{}", ai_router_e2e::random_hex(32));
    ai_router_e2e::scan::register("AI_ROUTER_SYNC_TOKEN", &sync_token);
    let mut serve_env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    serve_env.push(("AI_ROUTER_SYNC_TOKEN".into(), sync_token.clone()));
    let cp = ControlPlane::start(&dir, &mounted_pool(mock.url(), false), &serve_env)
        .await
        .unwrap();
    let envoy = ai_router_e2e::Envoy::start(
        &dir,
        cp.config_path(),
        cp.grpc_addr(),
        &[("AI_ROUTER_SYNC_TOKEN".into(), sync_token)],
        &app,
    )
    .await
    .unwrap();
    let client = ai_router_e2e::Client::new(&envoy.base_url()).unwrap();
    for key in keys {
        let r = client.chat("m1", Some(key)).await.unwrap();
        assert_eq!(r.status, 200, "under serve: {r}");
    }
}
