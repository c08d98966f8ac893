//! The control plane as a process: the data path keeps serving while it is down and the filter
//! reconnects when it is back; bad configs are refused at load; `render-envoy` reproduces the
//! checked-in `envoy/envoy.yaml`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{ai_router_bin, script, workspace_root, Gateway, Process, TestDir};
use ai_router_proto::v1 as pb;
use ai_router_proto::v1::sync_client::SyncClient;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_keep_succeeding_while_the_control_plane_is_down_and_the_filter_reconnects() {
    let mut gw = Gateway::start("control_plane_restart")
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::stream(&[
            "Hello", " there"
        ])])]))
        .await
        .unwrap();
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");

    gw.cp.stop();

    // From the last state: unary and streamed calls, on this connection and on new ones.
    for i in 0..5 {
        let r = gw.chat("chat").await.unwrap();
        assert_eq!(r.status, 200, "call {i} with the control plane down:\n{r}");
        assert_eq!(r.content(), Some("Hello there"), "{r}");
    }
    let s = gw.stream("chat").await.unwrap();
    assert_eq!(s.status, 200, "{s}");
    assert_eq!(s.contents(), ["Hello", " there"], "{s}");
    for i in 0..4 {
        let fresh = ai_router_e2e::Client::new(&gw.envoy.base_url()).unwrap();
        let r = fresh.chat("chat", Some(&gw.virtual_key)).await.unwrap();
        assert_eq!(
            r.status, 200,
            "new connection {i} with the control plane down:\n{r}"
        );
    }
    let r = gw
        .client
        .chat("chat", Some(&ai_router_e2e::new_virtual_key()))
        .await
        .unwrap();
    assert_eq!(
        r.status, 401,
        "auth still applies from the last state:\n{r}"
    );

    // Back on the same port with a new mounted virtual key: once the filter has reconnected
    // and received the new state, the new key is accepted and the old one refused.
    let new_key = ai_router_e2e::new_virtual_key();
    gw.cp
        .restart(&[("STARCI_AI_KEY".to_string(), new_key.clone())])
        .await
        .unwrap();
    ai_router_e2e::poll(
        "the filter to reconnect and accept the new virtual key",
        Duration::from_secs(45),
        || {
            let c = gw.client.clone();
            let k = new_key.clone();
            async move {
                let r = c.chat("chat", Some(&k)).await?;
                Ok((r.status == 200).then_some(()))
            }
        },
    )
    .await
    .unwrap();
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(
        r.status, 401,
        "the old virtual key is gone with the new state:\n{r}"
    );
    let r = gw.client.chat("chat", Some(&new_key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("Hello there"), "{r}");

    let logs = format!("{}\n{}", gw.cp.logs(), gw.envoy.logs());
    assert!(
        !logs.contains(&new_key),
        "the new virtual key appears in the logs"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

/// Runs `ai-router serve` on `config` and expects a refusal: a non-zero exit before it binds,
/// stderr naming `field`, and none of `secrets` in any output.
async fn assert_refused(test: &str, config: &str, field: &str, secrets: &[&str]) {
    let dir = TestDir::new(test).unwrap();
    let path = dir.write("pool.yaml", config).unwrap();
    let args = [
        "serve",
        "--config",
        &path.display().to_string(),
        "--http-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
    ]
    .map(String::from);
    let env = [
        ("P1_KEY_A".to_string(), "sk-p1-a-envvalue".to_string()),
        (
            "STARCI_AI_KEY".to_string(),
            ai_router_e2e::new_virtual_key(),
        ),
    ];
    let mut p = Process::spawn(&dir, "serve", &ai_router_bin().unwrap(), &args, &env).unwrap();
    let status = p
        .wait_exit(Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("serve must refuse this config and exit: {e:#}"));
    let logs = p.logs();
    assert!(
        !status.success(),
        "serve accepted a bad config ({status}):\n{}",
        p.tail()
    );
    assert!(
        !logs
            .lines()
            .any(|l| l.trim_start().starts_with("{\"http\"")),
        "serve bound its ports before refusing:\n{}",
        p.tail()
    );
    assert!(
        logs.contains(field),
        "the refusal must name {field:?}:\n{}",
        p.tail()
    );
    for s in secrets {
        assert!(
            !logs.contains(s),
            "the literal secret {s:?} was printed:\n{}",
            p.tail()
        );
    }
}

fn pool_with(provider_extra: &str, key_entry: &str) -> String {
    format!(
        r#"gateway:
  host: 127.0.0.1
  port: 0
providers:
  - id: p1
    kind: openai-compatible
    baseUrl: http://127.0.0.1:9/v1
{provider_extra}    keys:
      - {key_entry}
    models:
      - {{ id: m1, aliases: [chat] }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_literal_secret_naming_the_field() {
    let secret = "sk-literal-9f8e7d6c5b4a39281706f5e4d3c2b1a0";
    assert_refused(
        "refuse_literal_api_key",
        &pool_with("", &format!("{{ alias: a, apiKey: {secret} }}")),
        "apiKey",
        &[secret],
    )
    .await;
    let header_secret = "Bearer sk-literal-0a1b2c3d4e5f60718293a4b5c6d7e8f9";
    assert_refused(
        "refuse_literal_auth_header",
        &pool_with(
            &format!("    headers: {{ authorization: \"{header_secret}\" }}\n"),
            "{ alias: a, env: P1_KEY_A }",
        ),
        "authorization",
        &[header_secret, "sk-literal-0a1b2c3d4e5f60718293a4b5c6d7e8f9"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_an_unknown_field_naming_it() {
    assert_refused(
        "refuse_unknown_provider_field",
        &pool_with("    colour: blue\n", "{ alias: a, env: P1_KEY_A }"),
        "colour",
        &[],
    )
    .await;
    let top_level = format!(
        "gatewayy: {{ port: 0 }}\n{}",
        pool_with("", "{ alias: a, env: P1_KEY_A }")
    );
    assert_refused(
        "refuse_unknown_top_level_field",
        &top_level,
        "gatewayy",
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_envoy_of_the_example_pool_equals_the_checked_in_envoy_yaml() {
    let root = workspace_root();
    let checked_in = root.join("envoy/envoy.yaml");
    let regenerate =
        "regenerate it with: cargo run -q -p ai-router-control-plane --bin ai-router -- \
                      render-envoy --config examples/pool.yaml --listen 0.0.0.0:8080 \
                      --sync-tls-dir /etc/ai-router/sync-tls/envoy > envoy/envoy.yaml";
    let expected = std::fs::read_to_string(&checked_in)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; {regenerate}", checked_in.display()));
    let out = std::process::Command::new(ai_router_bin().unwrap())
        // Compose publishes the listener from its container: all interfaces there, while the
        // example pool itself binds loopback for `ai-router up` (docs/deploy.md).
        .args([
            "render-envoy",
            "--config",
            "examples/pool.yaml",
            "--listen",
            "0.0.0.0:8080",
            // Where compose mounts the certificates `ai-router certs` issued.
            "--sync-tls-dir",
            "/etc/ai-router/sync-tls/envoy",
        ])
        .current_dir(&root)
        .env_remove("AI_ROUTER_SYNC_TOKEN")
        .env_remove("AI_ROUTER_SYNC_TLS_DIR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "render-envoy failed ({}): {stderr}",
        out.status
    );
    let rendered = String::from_utf8_lossy(&out.stdout);
    if rendered != expected {
        let first_diff = rendered
            .lines()
            .zip(expected.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| format!("line {}:\n  rendered:   {a}\n  checked in: {b}", i + 1))
            .unwrap_or_else(|| {
                format!(
                    "one is a prefix of the other ({} vs {} lines)",
                    rendered.lines().count(),
                    expected.lines().count()
                )
            });
        panic!(
            "`ai-router render-envoy --config examples/pool.yaml --listen 0.0.0.0:8080 --sync-tls-dir /etc/ai-router/sync-tls/envoy` differs from envoy/envoy.yaml at {first_diff}\n{regenerate}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The sync channel hands out every provider key: it is never open by default.

fn sync_pool() -> String {
    format!(
        "{}providers:\n  - id: p1\n    kind: openai-compatible\n    baseUrl: http://127.0.0.1:9/v1\n    keys: [{{ alias: a, env: P1_KEY_A }}]\n    models: [{{ id: m1, aliases: [chat] }}]\n",
        ai_router_e2e::pool_yaml_header()
    )
}

fn serve_args(config: &std::path::Path, grpc_listen: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--config",
        &config.display().to_string(),
        "--http-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        grpc_listen,
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Runs `serve` and expects it to exit non-zero before binding, its output naming each of
/// `needles` and never the provider key.
async fn assert_serve_refuses(test: &str, grpc_listen: &str, extra: &[&str], needles: &[&str]) {
    assert_serve_refuses_with(test, grpc_listen, extra, &[], needles).await
}

/// [`assert_serve_refuses`] with more variables in serve's environment.
async fn assert_serve_refuses_with(
    test: &str,
    grpc_listen: &str,
    extra: &[&str],
    extra_env: &[(&str, &str)],
    needles: &[&str],
) {
    let dir = TestDir::new(test).unwrap();
    let config = dir.write("pool.yaml", &sync_pool()).unwrap();
    let provider_key = format!("sk-p1-a-{}", ai_router_e2e::random_hex(24));
    let mut env = vec![("P1_KEY_A".to_string(), provider_key.clone())];
    env.extend(
        extra_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let args = serve_args(&config, grpc_listen, extra);
    let mut p = Process::spawn(&dir, "serve", &ai_router_bin().unwrap(), &args, &env).unwrap();
    let status = p
        .wait_exit(Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("serve must refuse to start and exit: {e:#}"));
    let logs = p.logs();
    assert!(!status.success(), "serve started ({status}):\n{}", p.tail());
    assert!(
        !logs.contains("{\"http\""),
        "serve bound its ports before refusing:\n{logs}"
    );
    for needle in needles {
        assert!(
            logs.contains(needle),
            "the refusal must name {needle:?}:\n{logs}"
        );
    }
    assert!(
        !logs.contains(&provider_key),
        "the provider key was printed:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_a_sync_token_refuses_to_start_naming_the_ways_to_set_one() {
    assert_serve_refuses(
        "sync_no_token",
        "127.0.0.1:0",
        &[],
        &[
            "AI_ROUTER_SYNC_TOKEN",
            "controlPlane.syncToken",
            "--insecure-trusted-sync",
            "AI_ROUTER_INSECURE_TRUSTED_SYNC",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_plaintext_sync_on_a_non_loopback_address_without_the_flag() {
    let token = format!("sync-{}", ai_router_e2e::random_hex(32));
    ai_router_e2e::scan::register("AI_ROUTER_SYNC_TOKEN", &token);
    assert_serve_refuses_with(
        "sync_plaintext_public",
        "0.0.0.0:0",
        &[],
        &[("AI_ROUTER_SYNC_TOKEN", &token)],
        &[
            "0.0.0.0:0",
            "--tls-cert",
            "--client-ca",
            "ai-router certs",
            "--insecure-plaintext-sync",
            "AI_ROUTER_INSECURE_PLAINTEXT_SYNC",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_sync_serves_loopback_only() {
    assert_serve_refuses(
        "sync_trusted_public",
        "0.0.0.0:0",
        &["--insecure-trusted-sync"],
        &["loopback", "0.0.0.0:0"],
    )
    .await;

    // On loopback it starts (here through the env twin of the flag) and Watch needs no token.
    let dir = TestDir::new("sync_trusted_loopback").unwrap();
    let config = dir.write("pool.yaml", &sync_pool()).unwrap();
    let provider_key = format!("sk-p1-a-{}", ai_router_e2e::random_hex(24));
    let env = [
        ("P1_KEY_A".to_string(), provider_key.clone()),
        (
            "AI_ROUTER_INSECURE_TRUSTED_SYNC".to_string(),
            "1".to_string(),
        ),
    ];
    let args = serve_args(&config, "127.0.0.1:0", &[]);
    let mut p = Process::spawn(&dir, "serve", &ai_router_bin().unwrap(), &args, &env).unwrap();
    let line = p
        .first_json_line(ai_router_e2e::START_TIMEOUT)
        .await
        .unwrap();
    let grpc = line["grpc"].as_str().unwrap().to_string();
    assert!(grpc.starts_with("127.0.0.1:"), "{line}");
    let mut client = SyncClient::connect(format!("http://{grpc}")).await.unwrap();
    let mut stream = client
        .watch(pb::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(
        first.snapshot.unwrap().providers[0].keys[0].secret,
        provider_key
    );
    assert!(
        p.logs().contains("insecure-trusted-sync"),
        "the trusted mode is logged as a warning:\n{}",
        p.tail()
    );
}

fn sync_request<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("x-ai-router-sync-token", token.parse().unwrap());
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sync_call_needs_the_token_and_a_refused_report_writes_nothing() {
    let dir = TestDir::new("sync_token_required").unwrap();
    let sync_token = format!("sync-{}", ai_router_e2e::random_hex(32));
    let admin_token = format!("admin-{}", ai_router_e2e::random_hex(32));
    let provider_key = format!("sk-p1-a-{}", ai_router_e2e::random_hex(24));
    let env: Vec<(String, String)> = [
        ("P1_KEY_A", provider_key.as_str()),
        ("STARCI_AI_KEY", &ai_router_e2e::new_virtual_key()),
        ("AI_ROUTER_SYNC_TOKEN", &sync_token),
        ("AI_ROUTER_ADMIN_TOKEN", &admin_token),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .to_vec();
    let cp = ai_router_e2e::ControlPlane::start(&dir, &sync_pool(), &env)
        .await
        .unwrap();
    let admin = ai_router_e2e::Admin::at(cp.http_addr(), &admin_token).unwrap();
    let admin_get = |path: String| {
        let admin = admin.clone();
        async move { admin.get_json(&path).await }
    };
    let keys = admin_get("/admin/keys".into()).await.unwrap();
    let key_id = keys["keys"][0]["id"].as_str().unwrap().to_string();
    let key_state = |health: &serde_json::Value| health["providers"][0]["keys"][0]["state"].clone();
    let usage_days = |usage: &serde_json::Value| usage["days"].as_array().map_or(0, Vec::len);

    // An auth failure blacklists the key; a finished request writes a usage row.
    let report = pb::ReportBatch {
        node: "intruder".into(),
        dropped: 0,
        batch_id: String::new(),
        attempts: vec![pb::AttemptOutcome {
            request_id: "r1".into(),
            provider: "p1".into(),
            key: "a".into(),
            model: "m1".into(),
            outcome: pb::AttemptResult::Error.into(),
            error_class: pb::ErrorClass::Auth.into(),
            ..Default::default()
        }],
        requests: vec![pb::RequestOutcome {
            request_id: "r1".into(),
            virtual_key_id: key_id.clone(),
            operation: "chat".into(),
            outcome: pb::RequestResult::Success.into(),
            status: 200,
            attempts: 1,
            usage: Some(pb::Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let lease = pb::LeaseRequest {
        scope: pb::BreakerScope::Key.into(),
        provider: "p1".into(),
        key: "a".into(),
        holder: "r1:1".into(),
        ttl_ms: 60_000,
    };
    let mut client = SyncClient::connect(format!("http://{}", cp.grpc_addr()))
        .await
        .unwrap();
    let wrong_same_length = "x".repeat(sync_token.len());
    let prefix = &sync_token[..sync_token.len() - 1];
    for token in [
        None,
        Some("wrong"),
        Some(wrong_same_length.as_str()),
        Some(prefix),
    ] {
        let watch = client
            .watch(sync_request(pb::WatchRequest::default(), token))
            .await;
        assert_eq!(
            watch.err().map(|s| s.code()),
            Some(tonic::Code::Unauthenticated),
            "Watch with {token:?}"
        );
        let reported = client.report(sync_request(report.clone(), token)).await;
        assert_eq!(
            reported.err().map(|s| s.code()),
            Some(tonic::Code::Unauthenticated),
            "Report with {token:?}"
        );
        let leased = client.lease(sync_request(lease.clone(), token)).await;
        assert_eq!(
            leased.err().map(|s| s.code()),
            Some(tonic::Code::Unauthenticated),
            "Lease with {token:?}"
        );
    }
    let health = admin_get("/health".into()).await.unwrap();
    assert_eq!(
        key_state(&health),
        "ok",
        "a refused Report blacklisted the key: {health}"
    );
    let usage_path = format!("/admin/keys/{key_id}/usage");
    let usage = admin_get(usage_path.clone()).await.unwrap();
    assert_eq!(
        usage_days(&usage),
        0,
        "a refused Report wrote usage: {usage}"
    );

    // The same calls with the token are served, and the same Report then does both: the checks
    // above would have seen it.
    let mut stream = client
        .watch(sync_request(pb::WatchRequest::default(), Some(&sync_token)))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(
        first.snapshot.unwrap().providers[0].keys[0].secret,
        provider_key
    );
    let granted = client
        .lease(sync_request(lease, Some(&sync_token)))
        .await
        .unwrap()
        .into_inner();
    assert!(granted.granted);
    client
        .report(sync_request(report, Some(&sync_token)))
        .await
        .unwrap();
    let health = admin_get("/health".into()).await.unwrap();
    // Out for auth until its secret changes: a word, and no end (null).
    assert_eq!(key_state(&health), "auth", "{health}");
    assert_eq!(
        health["providers"][0]["keys"][0]["untilMs"],
        serde_json::Value::Null,
        "{health}"
    );
    ai_router_e2e::poll(
        "the usage row of the reported request",
        Duration::from_secs(20),
        || {
            let usage = admin_get(usage_path.clone());
            async move { Ok((usage_days(&usage.await?) > 0).then_some(())) }
        },
    )
    .await
    .unwrap();
    assert!(!cp.logs().contains(&provider_key), "{}", cp.tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_served_while_the_control_plane_is_down_is_in_the_usage_afterwards() {
    let mut gw = Gateway::start_with("reports_survive_an_outage", |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2).replace(
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
    let created: serde_json::Value = gw
        .admin()
        .post(
            "/admin/keys",
            &json!({"label": "outage_app", "models": ["*"]}),
        )
        .await
        .unwrap()
        .json;
    let id = created["key"]["id"].as_str().unwrap().to_string();
    let secret = created["secret"].as_str().unwrap().to_string();
    let mut served = 0u64;
    ai_router_e2e::poll(
        "the new key to reach Envoy",
        Duration::from_secs(10),
        || {
            let c = gw.client.clone();
            let secret = secret.clone();
            async move {
                let r = c.chat("chat", Some(&secret)).await?;
                Ok((r.status == 200).then_some(()))
            }
        },
    )
    .await
    .unwrap();
    served += 1;

    // Down: calls from four clients at once keep succeeding from the last state.
    let connect_fails = "cluster.ai_router_control_plane.upstream_cx_connect_fail";
    let failed_before = gw.envoy.stat(connect_fails).await.unwrap();
    gw.cp.stop();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = ai_router_e2e::Client::new(&gw.envoy.base_url()).unwrap();
        let secret = secret.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u64;
            for _ in 0..10 {
                let r = c.chat("chat", Some(&secret)).await.unwrap();
                assert_eq!(r.status, 200, "{r}");
                ok += 1;
            }
            ok
        }));
    }
    for t in tasks {
        served += t.await.unwrap();
    }
    // Until the singleton tried, failed and backed off (Envoy counts its failed connects).
    ai_router_e2e::poll(
        "Envoy to fail to reach the stopped control plane twice",
        Duration::from_secs(20),
        || async {
            let failed = gw.envoy.stat(connect_fails).await?;
            Ok((failed >= failed_before + 2).then_some(()))
        },
    )
    .await
    .unwrap();

    gw.cp.restart(&[]).await.unwrap();
    // The gRPC port is the same (Envoy's cluster points there); the HTTP port is new.
    let admin = ai_router_e2e::Admin::at(gw.cp.http_addr(), &gw.admin_token).unwrap();
    let url = format!("/admin/keys/{id}/usage");
    let counted = ai_router_e2e::poll(
        "the outage's calls to be accounted",
        Duration::from_secs(30),
        || {
            let (admin, url) = (admin.clone(), url.clone());
            async move {
                let usage: serde_json::Value = admin.get(&url).await?.json;
                let n = usage["total"]["requests"].as_u64().unwrap_or(0);
                Ok((n >= served).then_some(n))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.tails()));
    assert_eq!(counted, served, "each call counted once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blacklist_the_control_plane_no_longer_has_is_lifted_in_envoy_too() {
    let mut gw = Gateway::start("local_holds_follow_the_control_plane")
        .await
        .expect("fixture");
    let refused = json!({"status": 401, "body": {"error": {
        "message": "Incorrect API key provided.", "type": "invalid_request_error",
        "param": null, "code": "invalid_api_key"}}});
    gw.mock1
        .script(json!([
            script::for_key(&gw.key_a, vec![refused]),
            script::always(vec![script::text("ok")])
        ]))
        .await
        .unwrap();
    // Until key a has been tried and refused (auth: out until its secret changes).
    ai_router_e2e::poll("key a to be refused", Duration::from_secs(10), || {
        let gw = &gw;
        async move {
            let r = gw.chat("chat").await?;
            anyhow::ensure!(r.status == 200, "{r}");
            Ok(gw
                .keys_called()
                .await?
                .contains(&"a".to_string())
                .then_some(()))
        }
    })
    .await
    .unwrap();
    let refused_at = std::time::Instant::now();
    // The key is good again, but Envoy holds it out.
    gw.mock1
        .script(json!([script::always(vec![script::text("ok")])]))
        .await
        .unwrap();
    gw.clear_calls().await.unwrap();
    for _ in 0..4 {
        assert_eq!(gw.chat("chat").await.unwrap().status, 200);
    }
    assert!(!gw.keys_called().await.unwrap().contains(&"a".to_string()));

    // A restarted control plane (memory state store) has no blacklist. Once its state has had
    // time to hear of the refusal (the grace Envoy gives its own holds, 5 s), its view wins.
    let grace = Duration::from_millis(5_500);
    if let Some(rest) = grace.checked_sub(refused_at.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    gw.cp.restart(&[]).await.unwrap();
    ai_router_e2e::poll("key a to be used again", Duration::from_secs(20), || {
        let gw = &gw;
        async move {
            gw.clear_calls().await?;
            let r = gw.chat("chat").await?;
            anyhow::ensure!(r.status == 200, "{r}");
            Ok(gw
                .keys_called()
                .await?
                .contains(&"a".to_string())
                .then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.tails()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_budget_it_cannot_bound() {
    // m1 has a price but no contextWindow: a request without max_tokens has no worst case.
    let yaml = pool_with("", "{ alias: a, env: P1_KEY_A }").replace(
        "{ id: m1, aliases: [chat] }",
        "{ id: m1, aliases: [chat], cost: { input: 1, output: 2 } }",
    ) + "profiles:\n  cheap: { model: m1, budget: { maxCost: 0.01 } }\n";
    assert_refused(
        "refuse_unbounded_budget",
        &yaml,
        "profiles.cheap.budget.maxCost",
        &[],
    )
    .await;
}

/// The compose file will not start a control plane or an Envoy without a sync token: with
/// `AI_ROUTER_SYNC_TOKEN` unset, `docker-compose config` fails and names it (with it set, the
/// same command succeeds, so the failure is the token's).
#[test]
fn the_compose_file_requires_a_sync_token() {
    let compose = |token: Option<&str>| {
        let mut cmd = std::process::Command::new("docker-compose");
        cmd.args(["config", "--services"])
            .current_dir(workspace_root())
            .env_remove("AI_ROUTER_SYNC_TOKEN");
        if let Some(token) = token {
            cmd.env("AI_ROUTER_SYNC_TOKEN", token);
        }
        cmd.output()
            .expect("docker-compose (scripts/setup.sh installs it)")
    };
    let without = compose(None);
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert!(!without.status.success(), "compose accepted no sync token");
    assert!(stderr.contains("AI_ROUTER_SYNC_TOKEN"), "{stderr}");
    let with = compose(Some("compose-check"));
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
}

/// The Envoy client key goes to the user Envoy runs as, by one setting on both sides: the
/// `certs` service chowns it to `AI_ROUTER_ENVOY_UID:AI_ROUTER_ENVOY_GID` and every Envoy
/// service passes the same values as `ENVOY_UID`/`ENVOY_GID` (what the official image's
/// entrypoint switches to), 101 (its `envoy` user) by default. scripts/compose-test.sh runs it.
#[test]
fn the_compose_file_gives_the_envoy_key_to_the_user_envoy_runs_as() {
    let config = |ids: &[(&str, &str)]| {
        let mut env = vec![("AI_ROUTER_SYNC_TOKEN", "compose-check")];
        env.extend_from_slice(ids);
        let args = ["--profile", "mock", "--profile", "cluster", "config"];
        // Folded command lines wrap anywhere: one space for any run of whitespace.
        ai_router_e2e::compose_config(&args, &env)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let set = [
        ("AI_ROUTER_ENVOY_UID", "4242"),
        ("AI_ROUTER_ENVOY_GID", "4343"),
    ];
    for (ids, uid, gid) in [(&[][..], "101", "101"), (&set[..], "4242", "4343")] {
        let text = config(ids);
        assert!(
            text.contains(&format!("chown -R {uid}:{gid} /sync-tls/envoy")),
            "certs does not give the Envoy key to {uid}:{gid}: {text}"
        );
        for (var, want) in [("ENVOY_UID", uid), ("ENVOY_GID", gid)] {
            let values: Vec<&str> = text
                .split(&format!("{var}: "))
                .skip(1)
                .filter_map(|rest| rest.split_whitespace().next())
                .collect();
            assert_eq!(
                values,
                vec![format!("'{want}'"); 3],
                "{var} of envoy, envoy-a and envoy-b: {text}"
            );
        }
    }
}

/// The TCP ports process `pid` listens on, with whether each is bound to loopback only (from
/// its socket descriptors and `/proc/net/tcp{,6}`).
fn listening_ports(pid: u32) -> Vec<(u16, bool)> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // local_address, st (0A: LISTEN), inode.
            if cols.len() < 10 || cols[3] != "0A" || !inodes.iter().any(|i| i == cols[9]) {
                continue;
            }
            let (addr, port) = cols[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            let loopback = addr == "0100007F" || addr == "00000000000000000000000001000000";
            out.push((port, loopback));
        }
    }
    out
}

/// `ai-router up` with no sync token in its environment makes one: its control plane's ports
/// are all on loopback, and its gRPC port (mutual TLS with certificates `up` issued) refuses a
/// `Watch` without a certificate and the token (no local process can read the provider secrets
/// from it), while Envoy, given both, is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_makes_a_sync_token_and_its_control_plane_listens_on_loopback_only() {
    let dir = TestDir::new("up_sync_token").unwrap();
    let mock = ai_router_e2e::Mock::start(&dir, "mock1").await.unwrap();
    let config = dir
        .write(
            "pool.yaml",
            &format!(
                "gateway: {{ port: 0, keyStore: {{ type: memory }} }}\n\
                 controlPlane: {{ httpPort: 0 }}\n\
                 providers:\n  - id: p1\n    kind: openai-compatible\n    baseUrl: {}\n    keys: [{{ alias: a, env: UP_KEY }}]\n    models: [{{ id: m1 }}]\n",
                mock.url()
            ),
        )
        .unwrap();
    let provider_key = ai_router_e2e::scan::provider_secret("up-a");
    let up = ai_router_e2e::Up::start(
        &config,
        &[("UP_KEY", &provider_key)],
        std::process::Stdio::null(),
    )
    .await
    .unwrap();
    // scripts/run-gateway.sh shows the ready line: the same fields.
    let script = std::fs::read_to_string(workspace_root().join("scripts/run-gateway.sh")).unwrap();
    let shown: Value = script
        .lines()
        .find_map(|l| {
            l.trim_start_matches('#')
                .trim()
                .strip_prefix('{')
                .map(|r| format!("{{{r}"))
        })
        .and_then(|l| serde_json::from_str(&l).ok())
        .expect("a JSON line in run-gateway.sh's header");
    let fields = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
    assert_eq!(
        fields(&shown),
        fields(&up.ready),
        "run-gateway.sh shows {shown}"
    );
    // Envoy has the generated token: a call is served.
    let client = ai_router_e2e::Client::new(&up.base).unwrap();
    let r = client.chat("m1", Some(&up.key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");

    let ports = listening_ports(up.child.id().unwrap());
    assert!(ports.len() >= 2, "the admin API and gRPC: {ports:?}");
    assert!(
        ports.iter().all(|(_, loopback)| *loopback),
        "a control-plane port off loopback: {ports:?}"
    );
    // Its gRPC port speaks mutual TLS (certificates `up` issued in its temp folder): a
    // plaintext Watch without a certificate or token gets nothing from any port.
    let mut refused = 0;
    for (port, _) in &ports {
        let Ok(mut client) = SyncClient::connect(format!("http://127.0.0.1:{port}")).await else {
            refused += 1;
            continue;
        };
        match client.watch(pb::WatchRequest::default()).await {
            Err(_) => refused += 1,
            Ok(reply) => match reply.into_inner().message().await {
                Err(_) | Ok(None) => refused += 1,
                Ok(Some(update)) => panic!(
                    "port {port} served a Watch without the sync token: {} providers",
                    update.snapshot.map_or(0, |s| s.providers.len())
                ),
            },
        }
    }
    assert_eq!(refused, ports.len(), "every port refuses: {ports:?}");
}
